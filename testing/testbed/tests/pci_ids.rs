//! udriver's own device ID table against the device model's default IDs: the driver claims exactly the
//! functions the emulator presents by default, and identifies each as the right engine.

use device_model::pci::PciIds;
use udriver::pci_ids::{pci_match_id, DeviceKind, UDRIVER_PCI_TBL};

#[test]
fn udriver_claims_each_default_function_as_its_engine() {
    let cases = [(PciIds::hfi1_default(), DeviceKind::Hfi1), (PciIds::irdma_default(), DeviceKind::Irdma)];
    for (ids, kind) in cases {
        let m = pci_match_id(&UDRIVER_PCI_TBL, ids.vendor_id, ids.device_id).map(|m| m.driver_data);
        assert_eq!(m, Some(kind), "{:04x}:{:04x}", ids.vendor_id, ids.device_id);
    }
    assert_eq!(UDRIVER_PCI_TBL.len(), cases.len(), "every entry of the table is a default function");
}

#[test]
fn udriver_leaves_the_chip_personality_to_the_kernel_driver() {
    // The hfi1-wfr personality presents the real HFI's IDs so the stock hfi1 driver binds, not udriver.
    let ids = PciIds::hfi1_wfr_default();
    assert_eq!(pci_match_id(&UDRIVER_PCI_TBL, ids.vendor_id, ids.device_id), None);
}

#[test]
fn in_process_functions_are_identified_by_the_table() {
    use std::sync::Arc;
    use udriver::access::DeviceAccess;
    for (kind, want) in [(testbed::Kind::Hfi1, DeviceKind::Hfi1), (testbed::Kind::Irdma, DeviceKind::Irdma)] {
        let dev: Arc<dyn DeviceAccess> = Arc::new(testbed::InProcess::new(testbed::function(kind).unwrap()));
        assert_eq!(udriver::cli::kind_of(dev.as_ref()), Some(want));
    }
}
