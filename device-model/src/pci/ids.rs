//! The PCI identities the functions present.

#![forbid(unsafe_code)]

/// PCI identity of a function. Every field is configurable; the defaults are IDs no in-tree Linux driver
/// claims, so a guest never auto-binds hfi1, irdma or ice to the emulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PciIds {
    pub vendor_id: u16,
    pub device_id: u16,
    pub subsystem_vendor_id: u16,
    pub subsystem_id: u16,
    /// 24 bits: base class, sub-class, programming interface.
    pub class_code: u32,
    pub revision: u8,
}

/// Red Hat's vendor ID, whose device IDs QEMU hands out for virtual devices (docs/specs/pci-ids.rst).
pub const PCI_VENDOR_ID_REDHAT: u16 = 0x1b36;
/// Not allocated in QEMU's 1b36 list and not in any Linux driver's ID table.
pub const EMU_DEVICE_ID_HFI1: u16 = 0x1100;
pub const EMU_DEVICE_ID_IRDMA: u16 = 0x1101;
/// Intel, and the discrete Omni-Path HFI (the hfi1 driver's PCI_DEVICE_ID_INTEL0).
pub const PCI_VENDOR_ID_INTEL: u16 = 0x8086;
pub const PCI_DEVICE_ID_INTEL_HFI1_DISCRETE: u16 = 0x24f0;
/// PCI revision of a B0 part: the low byte of its CCE_REVISION (the driver reads only the latter).
pub const HFI1_B0_PCI_REVISION: u8 = 0x10;
/// Network controller / fabric controller, what a real Omni-Path HFI reports.
pub const PCI_CLASS_NETWORK_FABRIC: u32 = 0x02_08_00;
/// Network controller / Ethernet, what a real E810 reports.
pub const PCI_CLASS_NETWORK_ETHERNET: u32 = 0x02_00_00;
/// Subsystem ID for the first emulation revision.
const EMU_SUBSYSTEM_ID: u16 = 0x0001;

impl PciIds {
    pub const fn hfi1_default() -> Self {
        PciIds {
            vendor_id: PCI_VENDOR_ID_REDHAT,
            device_id: EMU_DEVICE_ID_HFI1,
            subsystem_vendor_id: PCI_VENDOR_ID_REDHAT,
            subsystem_id: EMU_SUBSYSTEM_ID,
            class_code: PCI_CLASS_NETWORK_FABRIC,
            revision: 0,
        }
    }
    /// The chip personality: the real HFI's identity, so the stock hfi1 driver binds.
    pub const fn hfi1_wfr_default() -> Self {
        PciIds {
            vendor_id: PCI_VENDOR_ID_INTEL,
            device_id: PCI_DEVICE_ID_INTEL_HFI1_DISCRETE,
            subsystem_vendor_id: PCI_VENDOR_ID_INTEL,
            subsystem_id: EMU_SUBSYSTEM_ID,
            class_code: PCI_CLASS_NETWORK_FABRIC,
            revision: HFI1_B0_PCI_REVISION,
        }
    }
    pub const fn irdma_default() -> Self {
        PciIds {
            vendor_id: PCI_VENDOR_ID_REDHAT,
            device_id: EMU_DEVICE_ID_IRDMA,
            subsystem_vendor_id: PCI_VENDOR_ID_REDHAT,
            subsystem_id: EMU_SUBSYSTEM_ID,
            class_code: PCI_CLASS_NETWORK_ETHERNET,
            revision: 0,
        }
    }
    /// The defaults for an engine by its `Engine::name()`; `None` for an unknown name.
    pub fn default_for(engine: &str) -> Option<Self> {
        match engine {
            "hfi1" => Some(Self::hfi1_default()),
            "hfi1-wfr" => Some(Self::hfi1_wfr_default()),
            "irdma" => Some(Self::irdma_default()),
            _ => None,
        }
    }
    /// The same IDs with another vendor:device pair (the subsystem IDs follow the vendor).
    pub fn with_vendor_device(self, vendor_id: u16, device_id: u16) -> Self {
        PciIds { vendor_id, device_id, subsystem_vendor_id: vendor_id, ..self }
    }
}
