//! The chaos model: what can happen to a node, and a seeded plan of when.
//!
//! The plan is a pure function of its seed, so a failing soak is replayed by passing the
//! seed it printed. Kinds are dealt from a shuffled deck (every kind once per round, in a
//! random order), so even a short run meets each of them.

use std::fmt;
use std::ops::Range;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// One thing the chaos loop does to the node; undone (where it needs undoing) after the
/// step's hold time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChaosKind {
    /// SIGKILL the agent; start a new one after the hold.
    AgentKill,
    /// The primary rewrites its own file as aws-node and Calico do (a fresh render with a
    /// changed field, every foreign entry dropped), again and again during the hold as a
    /// primary in a restart loop; then once more with its original content.
    PrimaryRewrite,
    /// The primary's file is renamed away (to a name the runtime ignores, or to another
    /// valid name); renamed back after the hold.
    PrimaryRename,
    /// The primary's file is deleted; written back (pristine) after the hold.
    PrimaryDelete,
    /// A second writer adds a valid config that sorts ahead; removed after the hold.
    ConfigAhead,
    /// The installed `interlock-cni` binary is deleted; the agent must put it back.
    PluginDelete,
    /// containerd is stopped and started again on the same state (sandboxes survive).
    ContainerdRestart,
    /// A rolling update to the other build and back, as a DaemonSet does it: SIGTERM,
    /// the hold with no agent at all, the other build's agent from an image holding its
    /// own plugin (which it installs); once it is ready (or after its patience) and the
    /// hold, the same back to this build.
    Upgrade,
    /// [`ChaosKind::Upgrade`] with containerd restarted while no agent runs.
    UpgradeContainerdRestart,
    /// A sentinel (`crate::sentinel`): with the agent SIGKILLed, a meshed pod started
    /// through a config without interlock sorting ahead of all; the config removed, a new
    /// agent started, and the fake API must show the pod's Event (and, under `report`,
    /// its label); then the sentinel is removed.
    Sentinel,
    /// Guard mode: the mesh's installer gets SIGTERM, so it removes its entry, the
    /// plugin's kubeconfig and binary as every installer does when its pod stops; a new
    /// installer starts after the hold (a DaemonSet rollout of the mesh's CNI pod).
    InstallerRestart,
    /// Guard mode: the mesh's installer gets SIGKILL (no cleanup: its entry and binary
    /// stay); a new installer starts after the hold.
    InstallerKill,
    /// Guard mode: the mesh's plugin binary is deleted; after the hold the installer is
    /// restarted (SIGTERM, then a new one), which copies it back.
    TBinaryDelete,
}

impl ChaosKind {
    /// Every kind, in report order.
    pub const ALL: [ChaosKind; 13] = [
        ChaosKind::AgentKill,
        ChaosKind::PrimaryRewrite,
        ChaosKind::PrimaryRename,
        ChaosKind::PrimaryDelete,
        ChaosKind::ConfigAhead,
        ChaosKind::PluginDelete,
        ChaosKind::ContainerdRestart,
        ChaosKind::Upgrade,
        ChaosKind::UpgradeContainerdRestart,
        ChaosKind::Sentinel,
        ChaosKind::InstallerRestart,
        ChaosKind::InstallerKill,
        ChaosKind::TBinaryDelete,
    ];

    /// The kinds of interlock's own modes (`owned`, `chain`): the default there.
    pub const OWN: [ChaosKind; 10] = [
        ChaosKind::AgentKill,
        ChaosKind::PrimaryRewrite,
        ChaosKind::PrimaryRename,
        ChaosKind::PrimaryDelete,
        ChaosKind::ConfigAhead,
        ChaosKind::PluginDelete,
        ChaosKind::ContainerdRestart,
        ChaosKind::Upgrade,
        ChaosKind::UpgradeContainerdRestart,
        ChaosKind::Sentinel,
    ];

    /// The kinds of guard mode: the default there. A config sorting ahead of the guard
    /// file is left out (the runtime loads it, and no mode can keep a chain it never
    /// reads: the sentinels are that case, on purpose).
    pub const GUARD: [ChaosKind; 12] = [
        ChaosKind::AgentKill,
        ChaosKind::PrimaryRewrite,
        ChaosKind::PrimaryRename,
        ChaosKind::PrimaryDelete,
        ChaosKind::PluginDelete,
        ChaosKind::ContainerdRestart,
        ChaosKind::Upgrade,
        ChaosKind::UpgradeContainerdRestart,
        ChaosKind::Sentinel,
        ChaosKind::InstallerRestart,
        ChaosKind::InstallerKill,
        ChaosKind::TBinaryDelete,
    ];

    /// True for the kinds that act on a guarded mesh's installer or plugin (guard mode
    /// only).
    pub fn guard_only(self) -> bool {
        matches!(
            self,
            ChaosKind::InstallerRestart | ChaosKind::InstallerKill | ChaosKind::TBinaryDelete
        )
    }

    /// The name used in the report and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ChaosKind::AgentKill => "agent_kill",
            ChaosKind::PrimaryRewrite => "primary_rewrite",
            ChaosKind::PrimaryRename => "primary_rename",
            ChaosKind::PrimaryDelete => "primary_delete",
            ChaosKind::ConfigAhead => "config_ahead",
            ChaosKind::PluginDelete => "plugin_delete",
            ChaosKind::ContainerdRestart => "containerd_restart",
            ChaosKind::Upgrade => "upgrade",
            ChaosKind::UpgradeContainerdRestart => "upgrade_containerd_restart",
            ChaosKind::Sentinel => "sentinel",
            ChaosKind::InstallerRestart => "installer_restart",
            ChaosKind::InstallerKill => "installer_kill",
            ChaosKind::TBinaryDelete => "t_binary_delete",
        }
    }

    /// True when the step acts on the agent (kills, stops or replaces it, or waits for
    /// it to put the plugin back): left out of the control run without interlock.
    pub fn needs_the_agent(self) -> bool {
        matches!(
            self,
            ChaosKind::AgentKill
                | ChaosKind::PluginDelete
                | ChaosKind::Upgrade
                | ChaosKind::UpgradeContainerdRestart
                | ChaosKind::Sentinel
        )
    }

    /// True when the step changes which config the runtime loads, so that for a moment
    /// the effective chain may lack interlock until the agent converges again. Only a
    /// meshed sandbox created during such a step (or while no agent could converge) may
    /// be seen unprotected at all, and then only until the audit repairs it.
    ///
    /// Guard mode's installer and plugin steps never explain an exposure: while the
    /// mesh's plugin cannot run, guard mode's promise is that meshed pods are held back
    /// (refused), not that they start uncaptured and are restarted later.
    pub fn touches_the_chain(self) -> bool {
        matches!(
            self,
            ChaosKind::PrimaryRewrite
                | ChaosKind::PrimaryRename
                | ChaosKind::PrimaryDelete
                | ChaosKind::ConfigAhead
                | ChaosKind::Sentinel
        )
    }
}

impl fmt::Display for ChaosKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ChaosKind {
    type Err = String;

    fn from_str(s: &str) -> Result<ChaosKind, String> {
        ChaosKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = ChaosKind::ALL.iter().map(|k| k.name()).collect();
                format!(
                    "unknown chaos kind {s:?} (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// Variants a step picks at random, so that the same kind covers the shapes real writers
/// produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// No variant for this kind.
    Plain,
    /// Renamed to `<name>.disabled`: the runtime ignores it, the primary is gone.
    RenameAway,
    /// Renamed to a later valid name: the primary moved.
    RenameLater,
    /// Ahead under a name that sorts before the agent's usual owned file.
    AheadOfOwned,
    /// Ahead of the primary only (after the agent's usual owned file).
    AheadOfPrimary,
}

/// One step of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChaosStep {
    /// What happens.
    pub kind: ChaosKind,
    /// Its shape.
    pub variant: Variant,
    /// How long the loop waits before this step (after the previous one was undone).
    pub gap: Duration,
    /// How long the change stays before it is undone.
    pub hold: Duration,
}

/// Bounds of the plan's random times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChaosTiming {
    /// Wait before each step, in milliseconds.
    pub gap_ms: Range<u64>,
    /// Time a change is held, in milliseconds.
    pub hold_ms: Range<u64>,
}

impl Default for ChaosTiming {
    fn default() -> ChaosTiming {
        ChaosTiming {
            gap_ms: 300..1500,
            hold_ms: 100..1500,
        }
    }
}

/// An endless, seeded sequence of chaos steps.
#[derive(Debug)]
pub struct ChaosPlan {
    rng: StdRng,
    kinds: Vec<ChaosKind>,
    deck: Vec<ChaosKind>,
    timing: ChaosTiming,
}

impl ChaosPlan {
    /// A plan over `kinds` (each dealt once per round; none given: no steps at all).
    pub fn new(seed: u64, kinds: &[ChaosKind], timing: ChaosTiming) -> ChaosPlan {
        ChaosPlan {
            rng: StdRng::seed_from_u64(seed),
            kinds: kinds.to_vec(),
            deck: Vec::new(),
            timing,
        }
    }

    fn variant(&mut self, kind: ChaosKind) -> Variant {
        let coin: bool = self.rng.gen();
        match (kind, coin) {
            (ChaosKind::PrimaryRename, true) => Variant::RenameAway,
            (ChaosKind::PrimaryRename, false) => Variant::RenameLater,
            (ChaosKind::ConfigAhead, true) => Variant::AheadOfOwned,
            (ChaosKind::ConfigAhead, false) => Variant::AheadOfPrimary,
            _ => Variant::Plain,
        }
    }
}

impl Iterator for ChaosPlan {
    type Item = ChaosStep;

    fn next(&mut self) -> Option<ChaosStep> {
        if self.kinds.is_empty() {
            return None;
        }
        if self.deck.is_empty() {
            self.deck = self.kinds.clone();
            self.deck.shuffle(&mut self.rng);
        }
        let kind = self.deck.pop().expect("refilled above");
        let variant = self.variant(kind);
        let gap = self.rng.gen_range(self.timing.gap_ms.clone());
        let hold = self.rng.gen_range(self.timing.hold_ms.clone());
        Some(ChaosStep {
            kind,
            variant,
            gap: Duration::from_millis(gap),
            hold: Duration::from_millis(hold),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn steps(seed: u64, n: usize) -> Vec<ChaosStep> {
        ChaosPlan::new(seed, &ChaosKind::ALL, ChaosTiming::default())
            .take(n)
            .collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_plan_and_another_seed_another() {
        assert_eq!(steps(7, 50), steps(7, 50));
        assert_ne!(steps(7, 50), steps(8, 50));
    }

    #[test]
    fn every_round_deals_every_kind_once() {
        for seed in 0..20 {
            let plan = steps(seed, ChaosKind::ALL.len() * 3);
            for round in plan.chunks(ChaosKind::ALL.len()) {
                let kinds: BTreeSet<ChaosKind> = round.iter().map(|s| s.kind).collect();
                assert_eq!(kinds.len(), ChaosKind::ALL.len(), "seed {seed}: {round:?}");
            }
        }
    }

    #[test]
    fn times_stay_within_their_bounds_and_variants_fit_their_kind() {
        let timing = ChaosTiming::default();
        for s in steps(3, 500) {
            assert!(timing.gap_ms.contains(&(s.gap.as_millis() as u64)), "{s:?}");
            assert!(
                timing.hold_ms.contains(&(s.hold.as_millis() as u64)),
                "{s:?}"
            );
            let fits = match s.kind {
                ChaosKind::PrimaryRename => {
                    matches!(s.variant, Variant::RenameAway | Variant::RenameLater)
                }
                ChaosKind::ConfigAhead => {
                    matches!(s.variant, Variant::AheadOfOwned | Variant::AheadOfPrimary)
                }
                _ => s.variant == Variant::Plain,
            };
            assert!(fits, "{s:?}");
        }
        let variants: BTreeSet<String> = steps(3, 500)
            .iter()
            .map(|s| format!("{:?}", s.variant))
            .collect();
        assert_eq!(variants.len(), 5, "every variant is dealt: {variants:?}");
    }

    #[test]
    fn a_subset_of_kinds_deals_only_those_and_none_deals_nothing() {
        let only = [ChaosKind::AgentKill, ChaosKind::PluginDelete];
        let plan: Vec<ChaosStep> = ChaosPlan::new(1, &only, ChaosTiming::default())
            .take(20)
            .collect();
        assert!(plan.iter().all(|s| only.contains(&s.kind)));
        assert_eq!(ChaosPlan::new(1, &[], ChaosTiming::default()).next(), None);
    }

    #[test]
    fn kinds_parse_from_their_names_and_only_those() {
        for k in ChaosKind::ALL {
            assert_eq!(k.name().parse::<ChaosKind>(), Ok(k));
        }
        let e = "agent-kill".parse::<ChaosKind>().unwrap_err();
        assert!(e.contains("agent_kill"), "{e}");
    }

    #[test]
    fn only_config_changes_touch_the_chain() {
        let touching: Vec<ChaosKind> = ChaosKind::ALL
            .into_iter()
            .filter(|k| k.touches_the_chain())
            .collect();
        assert_eq!(
            touching,
            [
                ChaosKind::PrimaryRewrite,
                ChaosKind::PrimaryRename,
                ChaosKind::PrimaryDelete,
                ChaosKind::ConfigAhead,
                ChaosKind::Sentinel,
            ]
        );
    }

    #[test]
    fn each_mode_has_its_kinds_and_only_guard_mode_the_installers() {
        assert!(ChaosKind::OWN.iter().all(|k| !k.guard_only()));
        let guard_only: Vec<ChaosKind> = ChaosKind::GUARD
            .into_iter()
            .filter(|k| k.guard_only())
            .collect();
        assert_eq!(
            guard_only,
            [
                ChaosKind::InstallerRestart,
                ChaosKind::InstallerKill,
                ChaosKind::TBinaryDelete
            ]
        );
        assert!(!ChaosKind::GUARD.contains(&ChaosKind::ConfigAhead));
        for k in ChaosKind::ALL {
            assert!(
                ChaosKind::OWN.contains(&k) || ChaosKind::GUARD.contains(&k),
                "{k}"
            );
        }
    }
}
