//! A userspace driver for the emulated hfi1 TID receive side and irdma control QP.
//!
//! The core functions keep the Linux kernel's names, parameters and return conventions.

pub mod access;
pub mod backend;
pub mod bench;
pub mod cli;
pub mod demo;
pub mod dma;
pub mod error;
pub mod hfi1;
pub mod irdma;
pub mod pci_ids;
