//! Concurrent ADDs, as a runtime starting many pods at once runs them: N threads, each
//! one meshed plugin ADD (nftables) into a fresh pod netns of its own, released together
//! by a barrier. Per level: ADDs per second (N / the round's wall time from the first
//! spawn to the last exit, median over rounds), and the per-ADD latency p50/p99 over all
//! rounds. Nothing but the CPU should serialise ADDs into different netns: throughput
//! that stops growing before the cores run out, or a p99 far above N × the sequential
//! ADD / cores, would say otherwise.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use interlock_redirect::BackendKind;
use serde_json::{json, Value};

use crate::stats::Summary;
use crate::{istio_annotations, Bench, BenchError};

/// The levels `make bench-json` measures.
pub const LEVELS: [usize; 4] = [1, 8, 32, 64];

/// Rounds at level `n` (about 200 ADDs per level, at least 3 rounds).
pub fn rounds_for(n: usize) -> usize {
    (200 / n.max(1)).clamp(3, 40)
}

/// Measures every level in `levels`; one JSON object per level.
pub fn run(
    bench: &Bench,
    levels: &[usize],
    progress: &mut dyn FnMut(&str),
) -> Result<Value, BenchError> {
    let mut out = vec![];
    for &n in levels {
        let n = n.max(1);
        let rounds = rounds_for(n);
        let mut walls = vec![];
        let mut latencies = vec![];
        for _ in 0..rounds {
            // Let the previous round's netns teardown finish (asynchronous in the kernel).
            std::thread::sleep(Duration::from_millis(100));
            let pods = bench.pods(n)?;
            let barrier = Barrier::new(n);
            let results: Vec<Result<(Instant, Instant), String>> = std::thread::scope(|s| {
                let handles: Vec<_> = pods
                    .iter()
                    .map(|pod| {
                        let barrier = &barrier;
                        s.spawn(move || {
                            barrier.wait();
                            let t0 = Instant::now();
                            bench
                                .plugin_add(pod, Some(BackendKind::Nftables), &istio_annotations())
                                .map(|_| (t0, Instant::now()))
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
                    .collect()
            });
            let mut spans = vec![];
            for (r, pod) in results.into_iter().zip(&pods) {
                spans.push(r.map_err(|msg| BenchError::Sample {
                    scenario: format!("concurrent_add_n{n}"),
                    netns: pod.name().to_string(),
                    msg,
                })?);
            }
            bench.release_attachments()?;
            let first = spans.iter().map(|s| s.0).min().expect("n ≥ 1");
            let last = spans.iter().map(|s| s.1).max().expect("n ≥ 1");
            walls.push(last - first);
            latencies.extend(spans.iter().map(|(a, b)| *b - *a));
        }
        let mut per_sec: Vec<f64> = walls.iter().map(|w| n as f64 / w.as_secs_f64()).collect();
        per_sec.sort_by(f64::total_cmp);
        let median_per_sec = per_sec[per_sec.len() / 2];
        let lat = Summary::of(&latencies).expect("samples");
        progress(&format!(
            "concurrent N={n}: {median_per_sec:.0} ADDs/s, p99 {:.2} ms",
            lat.p99_us / 1000.0
        ));
        out.push(json!({
            "n": n,
            "rounds": rounds,
            "adds": latencies.len(),
            "adds_per_sec_median": median_per_sec.round(),
            "adds_per_sec_min": per_sec[0].round(),
            "adds_per_sec_max": per_sec[per_sec.len() - 1].round(),
            "latency_p50_ms": (lat.median_us / 10.0).round() / 100.0,
            "latency_p99_ms": (lat.p99_us / 10.0).round() / 100.0,
            "latency_max_ms": (lat.max_us / 10.0).round() / 100.0,
        }));
    }
    Ok(Value::Array(out))
}
