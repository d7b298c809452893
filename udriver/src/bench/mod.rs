//! What the benchmarks share between the host (`testbed bench`, with the device model in the same process) and
//! the guest (`udriver bench`, over VFIO): timing statistics, the report format, and the measurements
//! that need nothing but a `DeviceAccess` (quad-hash throughput, loopback placement, trapped round trips).
//! Nothing here asserts a time: a report states what was measured and whether each target was met.
//! See docs/bench.md.

#![forbid(unsafe_code)]

pub mod guest;
pub mod loopback;
pub mod qhash;
pub mod report;
pub mod stats;

pub use report::{cpu_model, utc_string, BenchReport, Better, Case, Curve, Machine, Metric, Target};
pub use stats::{sample, sample_prepared, Samples};

#[cfg(test)]
mod tests;
