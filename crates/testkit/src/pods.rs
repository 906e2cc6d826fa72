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
