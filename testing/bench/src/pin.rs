//! The sequential samples run on one CPU. On the 2-core VM the benchmarks run on, a
//! wake-up across CPUs (the runtime-like parent waiting for the plugin it started, a
//! plugin waiting for its stdin) sometimes waits for the next scheduler tick: a static
//! no-op measured 0.34 ms median but 2.7–4.0 ms at p90 when parent and child were free
//! to run on either CPU, and 0.39 ms at p90 on one CPU; under a busy-loop on each CPU
//! the medians themselves became 3.5–4 ms. That measured the hypervisor, not the plugin.
//! Concurrent ADDs (which need every CPU) run unpinned.

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// The calling thread pinned to one CPU; the previous affinity comes back on drop.
/// Threads and processes started meanwhile inherit the pin.
#[derive(Debug)]
pub struct Pinned {
    before: CpuSet,
    /// The CPU the samples run on.
    pub cpu: usize,
}

impl Pinned {
    /// Pins the calling thread to the CPU it runs on now (`None` when the affinity cannot
    /// be read or changed: the samples then run unpinned, and the report says so).
    pub fn here() -> Option<Pinned> {
        let me = Pid::from_raw(0);
        let before = sched_getaffinity(me).ok()?;
        let cpu = nix::sched::sched_getcpu().ok()?;
        let mut one = CpuSet::new();
        one.set(cpu).ok()?;
        sched_setaffinity(me, &one).ok()?;
        Some(Pinned { before, cpu })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = sched_setaffinity(Pid::from_raw(0), &self.before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_the_thread_to_one_cpu_and_restores_it() {
        // On a thread of its own, so the test harness's threads are not affected.
        std::thread::spawn(|| {
            let me = Pid::from_raw(0);
            let before = sched_getaffinity(me).unwrap();
            let count = |s: &CpuSet| {
                (0..CpuSet::count())
                    .filter(|&c| s.is_set(c).unwrap_or(false))
                    .count()
            };
            {
                let p = Pinned::here().expect("pinning is allowed for one's own thread");
                let now = sched_getaffinity(me).unwrap();
                assert_eq!(count(&now), 1);
                assert!(now.is_set(p.cpu).unwrap());
                // A thread started now inherits the pin.
                let inherited = std::thread::spawn(move || sched_getaffinity(me).unwrap())
                    .join()
                    .unwrap();
                assert_eq!(count(&inherited), 1);
            }
            assert_eq!(count(&sched_getaffinity(me).unwrap()), count(&before));
        })
        .join()
        .unwrap();
    }
}
