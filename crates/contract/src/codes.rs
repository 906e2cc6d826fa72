//! Error codes: the CNI spec's (0–99) and interlock's own (100 and up), and the steps of
//! a pod's protection they belong to. Every failure about a pod reads `pod <namespace>/
//! <name>: step <step> failed: <cause>` and carries [`code_for_step`] of its step.

/// 1: incompatible CNI version.
pub const INCOMPATIBLE_VERSION: u32 = 1;
/// 2: unsupported field in network configuration.
pub const UNSUPPORTED_FIELD: u32 = 2;
/// 3: container unknown or does not exist.
pub const UNKNOWN_CONTAINER: u32 = 3;
/// 4: invalid necessary environment variables (`CNI_COMMAND`, `CNI_CONTAINERID`, …).
pub const INVALID_ENVIRONMENT: u32 = 4;
/// 5: I/O failure.
pub const IO_FAILURE: u32 = 5;
/// 6: failed to decode content (malformed JSON).
pub const DECODING_FAILURE: u32 = 6;
/// 7: invalid network config.
pub const INVALID_NETWORK_CONFIG: u32 = 7;
/// 11: try again later (transient; the runtime should retry).
pub const TRY_AGAIN_LATER: u32 = 11;
/// 50: the plugin is not available (STATUS: do not create new containers).
pub const NOT_AVAILABLE: u32 = 50;
/// 51: not available, and existing containers may have limited connectivity.
pub const LIMITED_CONNECTIVITY: u32 = 51;

/// interlock's own: an internal error (a bug; please report it).
pub const INTERNAL: u32 = 100;
/// interlock's own: the pod's mesh annotations cannot be turned into rules.
pub const INVALID_POD_ANNOTATIONS: u32 = 101;
/// interlock's own: applying the redirect rules failed (or the backend is unusable).
pub const APPLY: u32 = 102;
/// interlock's own: the rules in the netns are not exactly the expected ones.
pub const VERIFY: u32 = 103;
/// interlock's own: the probe did not prove the redirection.
pub const PROBE: u32 = 104;
/// interlock's own: the pod's network namespace cannot be entered, or is not a pod's.
pub const NETNS: u32 = 105;
/// interlock's own: DEL could not remove the redirect rules.
pub const REMOVE: u32 = 106;

/// A step of deciding on and protecting a pod; a failure names the one it failed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Finding the pod's annotations (runtime, agent socket).
    Lookup,
    /// Turning the annotations into a spec.
    Spec,
    /// Opening and entering the pod's network namespace.
    Netns,
    /// Opening the backend inside it.
    Open,
    /// Applying the rules.
    Apply,
    /// Reading them back.
    Verify,
    /// Proving them with traffic.
    Probe,
    /// Removing them.
    Remove,
    /// interlock's own state under `stateDir`.
    State,
}

impl Step {
    /// The name in messages and state (`lookup`, `spec`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Lookup => "lookup",
            Step::Spec => "spec",
            Step::Netns => "netns",
            Step::Open => "open",
            Step::Apply => "apply",
            Step::Verify => "verify",
            Step::Probe => "probe",
            Step::Remove => "remove",
            Step::State => "state",
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The CNI error code of a failure in `step`.
pub fn code_for_step(step: Step) -> u32 {
    match step {
        Step::Lookup => TRY_AGAIN_LATER,
        Step::Spec => INVALID_POD_ANNOTATIONS,
        Step::Netns => NETNS,
        Step::Open | Step::Apply => APPLY,
        Step::Verify => VERIFY,
        Step::Probe => PROBE,
        Step::Remove => REMOVE,
        Step::State => IO_FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_has_its_code() {
        let table = [
            (Step::Lookup, 11),
            (Step::Spec, 101),
            (Step::Netns, 105),
            (Step::Open, 102),
            (Step::Apply, 102),
            (Step::Verify, 103),
            (Step::Probe, 104),
            (Step::Remove, 106),
            (Step::State, 5),
        ];
        for (step, code) in table {
            assert_eq!(code_for_step(step), code, "{step}");
        }
        assert_eq!(Step::Probe.to_string(), "probe");
    }
}
