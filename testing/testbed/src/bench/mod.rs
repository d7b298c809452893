//! `udriver bench`: the fast paths of issue 7 measured in one run, each against its floor on this machine
//! (a raw socket round trip, trapped register writes, memcpy), with the ratio checked against its target.
//! Nothing here asserts a time: the report states what was measured and whether each target was met.
//! See docs/bench.md.

#![forbid(unsafe_code)]

mod fabric;
mod fabric_rig;
mod hfi1;
mod irdma;
mod placement;
mod scale;
mod socket;
mod tid;
mod tid_rig;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use udriver::bench::{utc_string, BenchReport, Better, Case, Machine, Metric, Samples, Target};

/// Every case `run` knows, in report order: (a)-(e) of issue 7, the hfi1 worker spin measurement, the scale
/// curves of issue 17, the two-HFI fabric of issue 28 and its TID RDMA placement of issue 29.
pub const CASES: [&str; 9] = ["a", "b", "c", "d", "e", "spin", "scale", "fabric", "tid"];

/// What to run and for how long.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Wall time spent measuring each variant of a case (a case has 2-6 variants).
    pub budget: Duration,
    /// Case ids to run (see [`CASES`]); empty runs all.
    pub cases: Vec<String>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self { budget: Duration::from_millis(1500), cases: Vec::new() }
    }
}

impl BenchOptions {
    fn wants(&self, id: &str) -> bool {
        self.cases.is_empty() || self.cases.iter().any(|c| c == id)
    }
}

/// Runs the selected cases. Each case sets up its own device model in this process (served over a UNIX
/// socket by a vfio-user server thread, exactly as the `device-model` binary serves it) and tears it down.
pub fn run(opts: &BenchOptions) -> BenchReport {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let budget = opts.budget.max(Duration::from_millis(1));
    let mut cases = Vec::new();
    if opts.wants("a") {
        cases.push(socket::round_trip(budget));
    }
    if opts.wants("b") {
        cases.push(hfi1::rcvarray_programming(budget));
    }
    if opts.wants("c") {
        cases.push(hfi1::exp_rcv_setup_clear(budget));
    }
    if opts.wants("d") {
        cases.push(irdma::qhash_throughput(budget));
    }
    if opts.wants("e") {
        cases.push(placement::placement(budget));
    }
    if opts.wants("spin") {
        cases.push(placement::worker_spin(budget));
    }
    if opts.wants("scale") {
        cases.push(scale::scale(budget));
    }
    if opts.wants("fabric") {
        cases.push(fabric::fabric(budget));
    }
    if opts.wants("tid") {
        cases.push(tid::tid(budget));
    }
    BenchReport {
        tool: "testbed",
        date: utc_string(now),
        machine: Machine::this(),
        build: if cfg!(debug_assertions) { "debug" } else { "release" },
        budget_ms: budget.as_millis() as u64,
        cases,
    }
}

#[cfg(test)]
mod tests;
