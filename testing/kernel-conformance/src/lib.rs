//! A conformance harness for the emulated irdma control path: the Linux kernel's own `ctrl.c` (Debian
//! linux-source-6.12 at the guest kernel's version), compiled unmodified against this crate's shim
//! headers, drives the device model in-process and over vfio-user, and serves as the oracle udriver is
//! diffed against. See README.md.
//!
//! Built without the kernel source (build.rs warns), the library is empty and the tests compile to nothing.

#![cfg(kernel_source)]

pub mod backend;
pub mod diff;
pub mod env;
mod ffi;
pub mod kernel;
pub mod session;

pub use env::{BarrierObserver, Delays, EnvError, ShimEnv};
pub use kernel::{KernelError, KernelHwAttrs, KernelIrdma};

/// The kernel source package and version the C code was built from (ci/kernel-source.sh records it).
pub const KERNEL_SOURCE_VERSION: &str = env!("KERNEL_SOURCE_VERSION");
/// The extracted tree the build used.
pub const KERNEL_SOURCE_TREE: &str = env!("KERNEL_SOURCE_TREE");
