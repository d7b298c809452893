//! The devices udriver drives, as a kernel driver names them: a `struct pci_device_id` table (`hfi1_pci_tbl`
//! in hfi1's init.c) matched with `pci_match_id`. The IDs are the project's own functions (QEMU's 1b36
//! vendor, docs/pci.md); a test in `testbed` checks them against the device model's defaults.

#![forbid(unsafe_code)]

/// Red Hat's vendor ID, under which QEMU hands out device IDs for virtual devices.
pub const PCI_VENDOR_ID_REDHAT: u16 = 0x1b36;
pub const PCI_DEVICE_ID_EMU_HFI1: u16 = 0x1100;
pub const PCI_DEVICE_ID_EMU_IRDMA: u16 = 0x1101;

/// Which engine a matched function is (the table's `driver_data`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Hfi1,
    Irdma,
}

/// `struct pci_device_id`, the fields udriver matches on (any subsystem, any class).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciDeviceId {
    pub vendor: u16,
    pub device: u16,
    pub driver_data: DeviceKind,
}

/// `PCI_DEVICE(vendor, device)` with its driver data.
const fn pci_device(vendor: u16, device: u16, driver_data: DeviceKind) -> PciDeviceId {
    PciDeviceId { vendor, device, driver_data }
}

pub const UDRIVER_PCI_TBL: [PciDeviceId; 2] = [
    pci_device(PCI_VENDOR_ID_REDHAT, PCI_DEVICE_ID_EMU_HFI1, DeviceKind::Hfi1),
    pci_device(PCI_VENDOR_ID_REDHAT, PCI_DEVICE_ID_EMU_IRDMA, DeviceKind::Irdma),
];

/// `pci_match_id(ids, dev)`: the first entry naming `vendor:device`.
pub fn pci_match_id(ids: &[PciDeviceId], vendor: u16, device: u16) -> Option<&PciDeviceId> {
    ids.iter().find(|id| id.vendor == vendor && id.device == device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_matches_its_own_ids_and_nothing_else() {
        // (vendor, device, match) — 8086:24f0 is the real HFI (the chip personality the kernel's hfi1 drives).
        let cases = [
            (0x1b36, 0x1100, Some(DeviceKind::Hfi1)),
            (0x1b36, 0x1101, Some(DeviceKind::Irdma)),
            (0x1b36, 0x1102, None),
            (0x8086, 0x24f0, None),
            (0xffff, 0xffff, None),
        ];
        for (vendor, device, want) in cases {
            let got = pci_match_id(&UDRIVER_PCI_TBL, vendor, device).map(|id| id.driver_data);
            assert_eq!(got, want, "{vendor:04x}:{device:04x}");
        }
    }
}
