//! Timing: per-operation samples within a wall-time budget, summarised by median, mean and p99.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use serde::Serialize;

/// Most samples kept per measurement (enough for a stable p99; bounds memory).
const MAX_SAMPLES: usize = 1 << 20;

/// The `q` quantile (0..=1) of `sorted` by nearest rank; `None` when it is empty.
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    let rank = ((q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize).max(1);
    sorted.get(rank.min(sorted.len()).checked_sub(1)?).copied()
}

/// Durations of one operation, in nanoseconds.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Samples {
    pub ns: Vec<u64>,
}

impl Samples {
    pub fn len(&self) -> usize {
        self.ns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ns.is_empty()
    }

    pub fn extend(&mut self, other: Samples) {
        self.ns.extend(other.ns);
    }

    /// The `q` quantile (0..=1), nearest rank; 0 when empty.
    pub fn quantile(&self, q: f64) -> f64 {
        let mut v = self.ns.clone();
        v.sort_unstable();
        nearest_rank(&v, q).unwrap_or(0) as f64
    }

    pub fn median(&self) -> f64 {
        self.quantile(0.5)
    }

    pub fn mean(&self) -> f64 {
        if self.ns.is_empty() {
            return 0.0;
        }
        self.ns.iter().map(|n| *n as f64).sum::<f64>() / self.ns.len() as f64
    }

    /// Operations per second at the mean.
    pub fn per_second(&self) -> f64 {
        let m = self.mean();
        if m > 0.0 {
            1e9 / m
        } else {
            0.0
        }
    }
}

/// Times `op` repeatedly for `budget` (at least `min` times, at most `max`), after `warmup` untimed
/// calls. The first error stops the measurement and is returned.
pub fn sample<E>(
    budget: Duration,
    warmup: usize,
    min: usize,
    max: usize,
    mut op: impl FnMut() -> Result<(), E>,
) -> Result<Samples, E> {
    for _ in 0..warmup {
        op()?;
    }
    let max = max.clamp(1, MAX_SAMPLES);
    let mut ns = Vec::with_capacity(max.min(1 << 16));
    let start = Instant::now();
    while ns.len() < max && (ns.len() < min || start.elapsed() < budget) {
        let t = Instant::now();
        op()?;
        ns.push(t.elapsed().as_nanos() as u64);
    }
    Ok(Samples { ns })
}

/// Like [`sample`], but `prepare` runs untimed before each timed `op` and hands it its input.
pub fn sample_prepared<T, E>(
    budget: Duration,
    warmup: usize,
    min: usize,
    max: usize,
    mut prepare: impl FnMut() -> Result<T, E>,
    mut op: impl FnMut(T) -> Result<(), E>,
) -> Result<Samples, E> {
    for _ in 0..warmup {
        op(prepare()?)?;
    }
    let max = max.clamp(1, MAX_SAMPLES);
    let mut ns = Vec::with_capacity(max.min(1 << 16));
    let start = Instant::now();
    while ns.len() < max && (ns.len() < min || start.elapsed() < budget) {
        let input = prepare()?;
        let t = Instant::now();
        op(input)?;
        ns.push(t.elapsed().as_nanos() as u64);
    }
    Ok(Samples { ns })
}
