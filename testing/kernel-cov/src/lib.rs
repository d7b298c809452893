//! Host side of the coverage the fuzz build of hfi1.ko records (ci/build-hfi1-module.sh,
//! kernel-cov/hfi1_cov.c, docs/kernel-coverage.md): [`region::Region`] reads and resets the ivshmem-plain
//! region the module writes, [`elf`] finds the module's call sites, [`symbolize`] names them, and [`report`]
//! puts the three together.
//!
//! The crate links neither the device model nor udriver: it is the fuzzer's view of the guest kernel.

pub mod elf;
pub mod layout;
pub mod region;
pub mod report;
pub mod symbolize;
