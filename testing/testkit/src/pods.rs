//! The spec facts (`interlock_contract::pod::PodFacts`) of the pods the meshes' injectors
//! make, for tests that decide such pods the way the agent does (it has their spec).

use interlock_contract::pod::{ContainerFacts, PodFacts};

/// A sidecar pod as Istio's injector writes it in CNI mode: `istio-validation` init
/// container, the app, and `istio-proxy` running `proxy sidecar` as UID/GID 1337.
pub fn istio_sidecar() -> PodFacts {
    PodFacts {
        labels: Default::default(),
        containers: vec![
            ContainerFacts::named("istio-validation", true),
            ContainerFacts::named("app", false),
            ContainerFacts {
                name: "istio-proxy".into(),
                run_as_user: Some(1337),
                run_as_group: Some(1337),
                args: vec!["proxy".into(), "sidecar".into()],
                ..ContainerFacts::default()
            },
        ],
    }
}

/// A pod as Linkerd's injector writes it with CNI enabled: `linkerd-network-validator`
/// init container, the app, and `linkerd-proxy`.
pub fn linkerd_proxy() -> PodFacts {
    PodFacts {
        labels: Default::default(),
        containers: vec![
            ContainerFacts::named("linkerd-network-validator", true),
            ContainerFacts::named("app", false),
            ContainerFacts::named("linkerd-proxy", false),
        ],
    }
}

/// A pod running both meshes' proxy containers: what a stand-in for the agent answers for
/// any pod, in tests that run the plugin without the agent (each profile looks for its own
/// proxy container and ignores the other).
pub fn mesh_proxies() -> PodFacts {
    let mut facts = istio_sidecar();
    facts
        .containers
        .push(ContainerFacts::named("linkerd-proxy", false));
    facts
}

/// The facts of a pod with `annotations` as its mesh's injector makes it: an Istio
/// sidecar pod for `sidecar.istio.io/status`, a Linkerd pod for
/// `linkerd.io/proxy-version`, an app alone otherwise.
pub fn injected(annotations: &std::collections::BTreeMap<String, String>) -> PodFacts {
    if annotations.contains_key("sidecar.istio.io/status") {
        istio_sidecar()
    } else if annotations.contains_key("linkerd.io/proxy-version") {
        linkerd_proxy()
    } else {
        PodFacts {
            labels: Default::default(),
            containers: vec![ContainerFacts::named("app", false)],
        }
    }
}
