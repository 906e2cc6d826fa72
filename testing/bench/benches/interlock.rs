//! criterion benches: the in-process engine (nftables apply+verify, and protect with the
//! probe), the plugin binary's ADD for a meshed and an unmeshed pod, and the two iptables
//! baselines (one `iptables-restore` per family, one `iptables` call per rule).
//!
//! Every iteration gets a fresh pod netns, created before the timed part (`iter_custom`
//! with a pool per batch). Needs root: skips with a message otherwise. The plugin is
//! `interlock-cni` next to the bench executable's target directory (built with cargo if
//! missing; override with `INTERLOCK_BENCH_PLUGIN`). The JSON summary with ratios and
//! budget verdicts is the `interlock-bench` binary of this crate.

use std::path::PathBuf;
use std::time::Duration;

use criterion::{Criterion, SamplingMode};
use interlock_bench::{istio_annotations, plain_annotations, Bench, Pod};
use interlock_redirect::backend::iptables::Flavour;
use interlock_redirect::BackendKind;

fn plugin() -> PathBuf {
    if let Some(p) = std::env::var_os("INTERLOCK_BENCH_PLUGIN") {
        return PathBuf::from(p);
    }
    interlock_bench::plugin_or_build().unwrap_or_else(|e| panic!("{e}"))
}

/// Times `f` on `iters` fresh pods (pool created first, not timed).
fn on_fresh_pods(
    bench: &Bench,
    iters: u64,
    f: impl Fn(&Pod) -> Result<Duration, String>,
) -> Duration {
    let pods = bench
        .pods(iters as usize)
        .unwrap_or_else(|e| panic!("creating {iters} pod netns: {e}"));
    pods.iter()
        .map(|p| f(p).unwrap_or_else(|e| panic!("in {}: {e}", p.name())))
        .sum()
}

fn main() {
    if !interlock_testkit::is_root() {
        eprintln!(
            "SKIP interlock-bench criterion benches: need root (network namespaces, netfilter)"
        );
        return;
    }
    let bench = Bench::new(&plugin()).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();

    {
        let mut g = c.benchmark_group("engine");
        g.sampling_mode(SamplingMode::Flat);
        g.bench_function("apply_verify_nftables", |b| {
            b.iter_custom(|iters| {
                on_fresh_pods(&bench, iters, |p| {
                    bench.engine_apply_verify(p, BackendKind::Nftables)
                })
            })
        });
        g.bench_function("protect_nftables", |b| {
            b.iter_custom(|iters| {
                on_fresh_pods(&bench, iters, |p| {
                    bench
                        .engine_protect(p, BackendKind::Nftables)
                        .map(|s| s.total)
                })
            })
        });
        g.finish();
    }
    {
        let mut g = c.benchmark_group("plugin_add");
        g.sampling_mode(SamplingMode::Flat);
        let meshed = istio_annotations();
        let plain = plain_annotations();
        g.bench_function("meshed_nftables", |b| {
            b.iter_custom(|iters| {
                on_fresh_pods(&bench, iters, |p| {
                    bench.plugin_add(p, Some(BackendKind::Nftables), &meshed)
                })
            })
        });
        g.bench_function("unmeshed", |b| {
            b.iter_custom(|iters| {
                on_fresh_pods(&bench, iters, |p| bench.plugin_add(p, None, &plain))
            })
        });
        g.finish();
    }
    {
        let mut g = c.benchmark_group("baseline");
        g.sampling_mode(SamplingMode::Flat);
        g.bench_function("iptables_restore_per_family_nft", |b| {
            b.iter_custom(|iters| {
                on_fresh_pods(&bench, iters, |p| bench.restore_per_family(p, Flavour::Nft))
            })
        });
        g.bench_function("iptables_per_rule_nft", |b| {
            b.iter_custom(|iters| {
                on_fresh_pods(&bench, iters, |p| bench.iptables_per_rule(p, Flavour::Nft))
            })
        });
        g.finish();
    }
    c.final_summary();
}
