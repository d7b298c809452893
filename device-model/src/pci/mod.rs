//! The PCI function that carries an engine: config space with masks, the MSI-X table and PBA, BAR dispatch,
//! reset, and the adaptation to `vfio_user_proto::device::Device`. Layout and policies: docs/pci.md.

#![forbid(unsafe_code)]

pub mod config;
mod dma;
mod error;
mod function;
mod ids;
pub mod msix;
mod probed;
pub mod regs;

pub use config::{CapLayout, ConfigError, ConfigLayout, ConfigSpace};
pub use dma::BusMasterDma;
pub use error::PciError;
pub use function::Function;
pub use ids::{
    PciIds, EMU_DEVICE_ID_HFI1, EMU_DEVICE_ID_IRDMA, HFI1_B0_PCI_REVISION, PCI_CLASS_NETWORK_ETHERNET,
    PCI_CLASS_NETWORK_FABRIC, PCI_DEVICE_ID_INTEL_HFI1_DISCRETE, PCI_VENDOR_ID_INTEL, PCI_VENDOR_ID_REDHAT,
};
pub use msix::{Msix, MSIX_BAR};
