//! Emulated hfi1 (Omni-Path HFI: the project's function and the real chip, two of them on a cable) and irdma
//! (control QP) PCI functions served over vfio-user.

pub mod cli;
pub mod clock;
pub mod control;
pub mod counter_json;
pub mod device_options;
pub mod engine;
pub mod fault;
pub mod hfi1;
pub mod irdma;
pub mod output_file;
pub mod pci;
pub mod probe;
pub mod replay;
pub mod shutdown;
pub mod socket_owner;
pub mod trace;
pub mod worker;
