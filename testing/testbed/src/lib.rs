//! The device model and udriver in one process, for tests, benchmarks and fuzzing: the in-process backend
//! (`inproc`), a device-model function served on a private vfio-user socket (`served`) or by rust-vmm's
//! server (`peer`), the benchmarks (`bench`), and the integration tests that need both sides (`tests/`).
//! udriver itself links none of this.

#![forbid(unsafe_code)]

pub mod bench;
pub mod inproc;
pub mod peer;
mod rig;
pub mod served;

pub use inproc::InProcess;
pub use rig::{function, Kind, RigError};
pub use served::Served;
