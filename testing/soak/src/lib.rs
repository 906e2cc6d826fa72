//! A bounded chaos soak of interlock against a private containerd, judged by a checker
//! that shares no code with interlock.
//!
//! Workers keep creating and removing meshed and plain sandboxes over CRI; a chaos loop
//! ([`chaos`]) kills and restarts the agent, rolls it to another build and back as a
//! DaemonSet update does (the previous release with `--other-release`, containerd
//! restarted mid-rollout in one kind), rewrites, renames and deletes the primary's
//! config, adds configs that sort ahead, deletes the installed plugin, restarts
//! containerd and plants sentinels ([`sentinel`]: meshed pods started unprotected on
//! purpose, whose Event and label the fake Kubernetes API must show); the checker probes every running sandbox from inside with a real
//! connection ([`probe`]) and keeps the exposure windows ([`ledger`]). The run ends with
//! one JSON report ([`report`]) and fails when an invariant broke.
//!
//! In guard mode (`--guard-mesh <mesh>`, [`run::SoakOptions::guard`]) the mesh's own
//! plugin redirects: its stand-in and its installer stand-in (`interlock-mesh-standins`,
//! a process the chaos loop restarts with SIGTERM and kills with SIGKILL) run on the
//! node, the agent runs with `--config-mode guard`, every pod is in the fake API with the
//! mesh's own annotations (the mesh's plugin reads it), and capture is judged by a
//! connection only, at the mesh's outbound port at the end: interlock writes no rules
//! there to read. The repair budget adds the audit's 30 s wait for a proxy that never
//! listens (the soak's pause sandboxes have none).
//!
//! The crate depends on the test kit and the CRI client only: the agent and the plugin
//! are the built binaries, containerd is the witness of what ran, and the fake API (the
//! kit's, the agent pointed at it with `--kube=auto`) of what the agent told the cluster.
//!
//! # Invariants (each broken one is a `violations` entry and makes the run fail)
//! - A meshed sandbox is seen exposed only when a step that changes the runtime's chain
//!   overlapped its creation (`unexplained_exposure`), and only until the repair budget
//!   (2 s + the audit interval) after the agent was ready again (`exposed_beyond_budget`).
//! - A meshed sandbox once seen captured is never seen exposed again (`protection_lost`).
//! - After the chaos stopped and the budget passed, every running meshed sandbox is
//!   proven redirected, by this crate's probe and by the kit's capture check
//!   (`left_unprotected`, `unverified_at_end`).
//! - Every sentinel, started unprotected, gets from a new agent within
//!   [`sentinel::PATIENCE`] ([`sentinel::GUARD_PATIENCE`] in guard mode) what its repair
//!   policy promises in the API: under `repair` a `Repaired` Event, under `report` an
//!   `Unprotected` Event and the `interlock.dev/unprotected` label, under `restart`
//!   (guard mode's) a `Restarted` Event (`sentinel_not_reported`).
//! - The audit acts (restarts, evicts, deletes, repairs, reports) on no unmeshed pod, as
//!   the fake API's Events say (`unmeshed_acted_on`).
//! - After the teardown nothing is left: netns, attachment state and netns records,
//!   host-local addresses, nft tables, processes, sandboxes (`leak`).
//! - The run proves something: plain sandboxes reach the probe server directly
//!   (`checker_blind`), meshed ones are seen captured (`vacuous`), the planned sandboxes
//!   started (`workload_gave_up`), and every chaos step was applied and undone
//!   (`chaos_step_failed`).

pub mod chaos;
pub mod chaos_loop;
pub mod checker;
pub mod ledger;
pub mod probe;
pub mod report;
pub mod run;
pub mod sentinel;
pub mod workload;
