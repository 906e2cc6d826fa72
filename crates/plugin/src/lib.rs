//! The `interlock-cni` chained CNI plugin, as a library.
//!
//! `main.rs` only reads the environment and stdin and calls [`run`], which hands them to
//! the protocol skeleton (`interlock_cni_types::skel`) with this plugin's verbs
//! ([`verbs`], one file each). The rest, by what it holds: the mesh decision
//! ([`decide`], pure), where annotations come from besides the runtime ([`lookup`],
//! [`agent_client`]), the log ([`log`]) and `--self-check` of the process start-up
//! ([`self_check`]). Its effects on the pod's netns and what is recorded about them are
//! `interlock_attach`'s, shared with the agent's in-place repair (`protect`; `outcome` and
//! `state` per attachment; per netns: `interlock_redirect::netns_record`). The
//! plugin's config, error codes and state-dir layout are `interlock_contract`'s.
//!
//! # Verbs
//!
//! - **ADD** (chained: requires `prevResult`, returns it converted to the config's
//!   version). Decides whether the pod is meshed ([`decide::decide_with_lookup`]: the
//!   annotations from `runtimeConfig`, or — only when the runtime passed none — from the
//!   agent socket, see [`lookup`]). For a meshed pod it
//!   applies the profile's spec for **both** address families (whatever `prevResult`
//!   lists: every veth has an IPv6 link-local address, and a primary may not list every
//!   address) in `CNI_NETNS` with the configured backend (`auto` detects the host's,
//!   reusing a detection up to a minute old from `<stateDir>/backend-detected.json`, see
//!   `interlock_attach::detected_backend`), verifies the rules read back are exactly the expected ones, and
//!   proves every family the pod can route with the probe, trying the pod's gateways
//!   first (`interlock_attach::protect::protect`, `interlock_redirect::probe`). The netns is the unit of
//!   protection (`interlock_redirect::netns_record`): under the netns's lock, an attachment whose netns
//!   already holds live rules for the same spec (a Multus pod's second interface, a
//!   concurrent ADD) shares them after reading them back; another spec there is refused.
//!   Only then is the attachment's state written (profile, backend, installed spec as
//!   canonical JSON and its hash, netns and its identity, pod, timings), its reference
//!   recorded in the netns's record, and the result returned. A repeated ADD of an
//!   attachment that an earlier ADD protected with another backend then removes that
//!   backend's rules, so the netns holds only what the state records. Any failure for a
//!   meshed pod fails the ADD naming the pod, the step and the cause; the netns is left
//!   without interlock rules unless another attachment relies on them (the details say
//!   which). With `failurePolicy: open` the ADD succeeds instead, the failure is logged at
//!   error level and the state records the attachment as `unprotected`.
//! - **CHECK** re-reads the recorded spec's rules in the netns and fails with every
//!   difference when they are not exactly the expected ones (it never re-applies or
//!   probes: the proxy owns its port by then). Succeeds for pods that needed nothing;
//!   fails for a meshed pod recorded as `unprotected`.
//! - **DEL** drops the attachment's reference on its netns and removes the rules with the
//!   recorded backend (every backend's rules when there is no state) when no other live
//!   attachment relies on them; then the state. An empty `CNI_NETNS` or a netns that is
//!   gone is success.
//! - **GC** does what DEL does for every attachment not in `cni.dev/valid-attachments`
//!   (only listed attachments count as live). **STATUS** answers 50 only when an ADD could
//!   not protect a meshed pod now ([`verbs::check_status`]; not because the agent is down).
//!   **VERSION**: 0.3.0 to 1.1.0.
//! - **The guard role** (the entry's `guard`, guard mode: a mesh's own plugin follows in
//!   the chain and writes the rules). ADD writes nothing and keeps no state: it passes
//!   `prevResult` through for every pod the mesh would not redirect
//!   (`interlock_contract::guard::GuardedMesh::recognise`), refuses meshed pods with 11
//!   while the agent holds the chain (`hold`: the mesh's plugin cannot run), and passes a
//!   meshed pod otherwise, with the `added` note so the agent's audit proves its capture
//!   ([`decide::guard_verdict`]). DEL, CHECK and GC pass (DEL and GC still release state
//!   an earlier redirecting entry left); STATUS always succeeds, in hold too.
//!
//! Nothing but the protocol ever goes to stdout; one line per verb is logged at info
//! level (pod, decision, backend, timings) and every failure at error level.
//!
//! # Error codes
//!
//! | code | meaning |
//! |---|---|
//! | 1 | incompatible CNI version (the message lists the supported ones) |
//! | 3 | CHECK for an attachment interlock-cni never added |
//! | 4 | missing or invalid `CNI_*` environment |
//! | 5 | I/O failure on interlock's own state under `stateDir` (step `state`) |
//! | 6 | stdin is not a JSON object |
//! | 7 | invalid network config: a bad field of the interlock-cni entry (named), a missing or invalid `prevResult`, malformed `runtimeConfig` annotations |
//! | 11 | try again later (step `lookup`): the pod's mesh status cannot be decided — the runtime passed no annotations and the agent socket did not answer (or is not trusted); the message says why. In the guard role: a meshed (or undecidable) pod held while the mesh's plugin cannot run; the message names the pod, the plugin and the reason |
//! | 50 | STATUS: an ADD could not protect a meshed pod now: the backend cannot work, the state dir is unusable, or the lookup the entry needs cannot work (every reason listed) |
//! | 100 | internal error (a bug) |
//! | 101 | step `spec`: the pod's mesh annotations cannot be turned into rules (names the annotation and its value) |
//! | 102 | step `apply` (or `open`): applying the redirect rules failed, or the backend cannot be used |
//! | 103 | step `verify`: the rules read back are not exactly the expected ones (ADD, CHECK: every difference is listed), or cannot be read; CHECK of a meshed pod left unprotected |
//! | 104 | step `probe`: the probe did not prove the outbound redirection |
//! | 105 | step `netns`: the pod's network namespace cannot be entered, or `CNI_NETNS` is not a pod's: the plugin's own or PID 1's (the host's), or not a network namespace (refused before anything is touched; DEL of a path that is not a network namespace succeeds) |
//! | 106 | step `remove`: DEL could not remove the redirect rules (the state is kept for the retry) |
//!
//! Every failure message about a pod starts with `pod <namespace>/<name>: step <step>
//! failed:` followed by the cause.

pub mod agent_client;
pub mod decide;
pub mod log;
pub mod lookup;
pub mod self_check;
pub mod verbs;

use interlock_cni_types::error::CniError;
pub use interlock_cni_types::skel::{CniEnv, Outcome};
use interlock_cni_types::CniVersion;
use interlock_contract::codes;

pub use verbs::InterlockCni;

/// Runs one invocation of `interlock-cni`. Never panics through to the caller: a bug
/// becomes error 100.
pub fn run(env: &CniEnv, stdin: &[u8]) -> Outcome {
    interlock_cni_types::skel::run(&InterlockCni, env, stdin)
}

/// The error printed when the plugin hits a bug (also used by `main`'s panic hook).
pub fn internal_error() -> CniError {
    CniError::new(
        CniVersion::LATEST.as_str(),
        codes::INTERNAL,
        "interlock-cni internal error (a bug): see the plugin log or stderr",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn env(command: &str) -> CniEnv {
        CniEnv {
            command: Some(command.into()),
            container_id: Some("c".into()),
            netns: Some("/var/run/netns/x".into()),
            ifname: Some("eth0".into()),
            args: Some("K8S_POD_NAMESPACE=a;K8S_POD_NAME=b".into()),
            path: Some("/usr/lib/cni".into()),
        }
    }

    fn check_outcome(o: &Outcome) -> Result<(), TestCaseError> {
        prop_assert!(o.exit_code == 0 || o.exit_code == 1);
        if o.exit_code == 1 {
            let e: CniError = serde_json::from_slice(&o.stdout)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_ne!(e.code, codes::INTERNAL, "internal error (a panic): {:?}", e);
            prop_assert!(!e.msg.is_empty());
        } else if !o.stdout.is_empty() {
            serde_json::from_slice::<Value>(&o.stdout)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        Ok(())
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "\\PC{0,8}".prop_map(Value::String),
            prop::sample::select(vec![
                "0.3.1",
                "1.0.0",
                "1.1.0",
                "interlock-cni",
                "/tmp",
                "open",
                "closed"
            ])
            .prop_map(|s| Value::String(s.into())),
        ];
        leaf.prop_recursive(3, 20, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::vec(
                    (
                        prop::sample::select(vec![
                            "cniVersion",
                            "type",
                            "name",
                            "stateDir",
                            "prevResult",
                            "runtimeConfig",
                            "failurePolicy",
                            "io.kubernetes.cri.pod-annotations",
                            "ips",
                            "interfaces",
                            "address",
                            "profiles",
                            "cni.dev/valid-attachments",
                            "containerID",
                            "ifname",
                            "x",
                        ]),
                        inner
                    ),
                    0..6
                )
                .prop_map(|kv| Value::Object(
                    kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
                )),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever arrives on stdin, every verb answers in the protocol and never panics.
        #[test]
        fn never_panics_on_any_input(
            bytes in prop::collection::vec(any::<u8>(), 0..64),
            doc in arb_json(),
            command in prop::sample::select(vec!["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "NOPE"]),
        ) {
            let t = tempfile::tempdir().unwrap();
            check_outcome(&run(&env(command), &bytes))?;
            // Keep writes inside the temp dir when the document names a stateDir.
            let mut doc = doc;
            if let Value::Object(m) = &mut doc {
                m.insert("stateDir".into(), Value::String(t.path().display().to_string()));
            }
            check_outcome(&run(&env(command), doc.to_string().as_bytes()))?;
        }

        /// A valid config with random fields replaced by random values reaches every
        /// verb's deeper checks; still only protocol answers, never a panic.
        #[test]
        fn never_panics_on_almost_valid_configs(
            overrides in prop::collection::vec((prop::sample::select(vec![
                "cniVersion", "type", "prevResult", "runtimeConfig", "failurePolicy", "logLevel",
                "excludeNamespaces", "profiles", "capabilities", "cni.dev/valid-attachments", "backend",
            ]), arb_json()), 0..3),
            command in prop::sample::select(vec!["ADD", "DEL", "CHECK", "GC", "STATUS"]),
            annotations in prop::collection::btree_map(
                prop::sample::select(vec![
                    "sidecar.istio.io/status", "sidecar.istio.io/inject", "linkerd.io/proxy-version",
                    "interlock.dev/redirect", "traffic.sidecar.istio.io/excludeOutboundPorts",
                    "config.linkerd.io/skip-subnets", "interlock.dev/inbound-ports",
                ]),
                "\\PC{0,10}|enabled|false|[0-9,*-]{0,12}",
                0..4,
            ),
        ) {
            let t = tempfile::tempdir().unwrap();
            let mut doc = serde_json::json!({
                "cniVersion": "1.1.0", "name": "n", "type": "interlock-cni", "stateDir": t.path(),
                "logLevel": "error",
                "runtimeConfig": {"io.kubernetes.cri.pod-annotations": annotations},
                "prevResult": {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0"}], "ips": [{"interface": 0, "address": "10.99.0.2/24"}]},
                "cni.dev/valid-attachments": [],
            });
            for (k, v) in overrides {
                doc[k] = v;
            }
            doc["stateDir"] = Value::String(t.path().display().to_string());
            check_outcome(&run(&env(command), doc.to_string().as_bytes()))?;
        }
    }
}
