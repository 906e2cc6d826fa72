//! Order statistics of a set of timings, in microseconds.

use std::time::Duration;

use serde_json::{json, Value};

/// Median, tail percentiles and extremes of one scenario's samples (microseconds).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Median (mean of the two middle samples when `n` is even).
    pub median_us: f64,
    /// 90th percentile (nearest rank).
    pub p90_us: f64,
    /// 99th percentile (nearest rank).
    pub p99_us: f64,
    /// Arithmetic mean.
    pub mean_us: f64,
    /// Fastest sample.
    pub min_us: f64,
    /// Slowest sample.
    pub max_us: f64,
}

fn us(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The value at `p` (0 < p ≤ 1) of sorted `v` by the nearest-rank method.
fn nearest_rank(v: &[f64], p: f64) -> f64 {
    let rank = (p * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// The median of `v` (the mean of the two middle values when their number is even);
/// `None` when `v` is empty.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

impl Summary {
    /// Summarises `samples`; `None` when there are none.
    pub fn of(samples: &[Duration]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut v: Vec<f64> = samples.iter().copied().map(us).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Summary {
            n,
            median_us: median,
            p90_us: nearest_rank(&v, 0.90),
            p99_us: nearest_rank(&v, 0.99),
            mean_us: v.iter().sum::<f64>() / n as f64,
            min_us: v[0],
            max_us: v[n - 1],
        })
    }

    /// The summary as a JSON object (values rounded to 0.1 µs).
    pub fn to_json(&self) -> Value {
        json!({
            "samples": self.n,
            "median_us": round1(self.median_us),
            "p90_us": round1(self.p90_us),
            "p99_us": round1(self.p99_us),
            "mean_us": round1(self.mean_us),
            "min_us": round1(self.min_us),
            "max_us": round1(self.max_us),
        })
    }

    /// The summary in milliseconds, as the repair benchmark prints it (`p50_ms` is the
    /// median).
    pub fn to_json_ms(&self) -> Value {
        let ms = |us: f64| (us / 1000.0 * 1000.0).round() / 1000.0;
        json!({
            "n": self.n,
            "p50_ms": ms(self.median_us),
            "p90_ms": ms(self.p90_us),
            "p99_ms": ms(self.p99_us),
            "max_ms": ms(self.max_us),
            "mean_ms": ms(self.mean_us),
            "min_ms": ms(self.min_us),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&x| Duration::from_micros(x)).collect()
    }

    #[test]
    fn odd_and_even_medians_and_ranks() {
        let s = Summary::of(&ms(&[5, 1, 3])).unwrap();
        assert_eq!((s.median_us, s.min_us, s.max_us), (3.0, 1.0, 5.0));
        let s = Summary::of(&ms(&[4, 1, 3, 2])).unwrap();
        assert_eq!(s.median_us, 2.5);
        assert_eq!(s.mean_us, 2.5);
        let v: Vec<u64> = (1..=100).collect();
        let s = Summary::of(&ms(&v)).unwrap();
        assert_eq!((s.p90_us, s.p99_us), (90.0, 99.0));
        let s = Summary::of(&ms(&[7])).unwrap();
        assert_eq!((s.median_us, s.p90_us, s.p99_us), (7.0, 7.0, 7.0));
        assert!(Summary::of(&[]).is_none());
        let s = Summary::of(&ms(&[1500, 2500, 10_250]))
            .unwrap()
            .to_json_ms();
        assert_eq!(s["n"], 3);
        assert_eq!(s["p50_ms"], 2.5);
        assert_eq!(s["max_ms"], 10.25);
        assert_eq!(s["min_ms"], 1.5);
    }
}
