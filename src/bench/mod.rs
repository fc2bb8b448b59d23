//! Benchmarks run by `mira bench …`: they start a real server in-process and print figures.
//! Not tests: their numbers go into issue notes, not assertions.

pub mod codegraph;
pub mod exposure;
pub mod invocations;
pub mod mcp;
pub mod news;
pub mod terminal;

use std::time::Duration;

/// p50/p99/max of a set of latencies, in milliseconds (nearest-rank percentiles).
#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    /// Median, ms.
    pub p50: f64,
    /// 99th percentile, ms.
    pub p99: f64,
    /// Largest, ms.
    pub max: f64,
}

/// Nearest-rank percentiles of `samples` (0 for an empty set).
pub fn percentiles(samples: &[Duration]) -> Percentiles {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| -> f64 {
        if ms.is_empty() {
            return 0.0;
        }
        let rank = ((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len());
        ms[rank - 1]
    };
    Percentiles { p50: at(0.50), p99: at(0.99), max: at(1.0) }
}
