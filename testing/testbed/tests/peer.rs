//! The benchmarks' peer: rust-vmm's `vfio_user` server over one of our PCI functions looks like the same
//! device to udriver as our own server does (identity, config space, registers, MSI-X, the mapped RcvArray).

use std::sync::Arc;
use std::time::Duration;

use device_model::hfi1::{regs, Hfi1, Hfi1Config, HFI1_BAR};
use device_model::pci::{Function, PciIds};
use testbed::peer::PeerServed;
use udriver::access::DeviceAccess;
use udriver::backend::vfio_user::VfioUserBackend;

fn hfi1_function() -> Arc<Function> {
    Function::try_new(Arc::new(Hfi1::new(Hfi1Config::default()).unwrap()), PciIds::hfi1_default()).unwrap()
}

#[test]
fn the_peer_serves_a_function_as_our_server_does() {
    for map_bars in [false, true] {
        let ours = testbed::Served::function(hfi1_function()).unwrap();
        let peer = PeerServed::new(hfi1_function()).unwrap();
        let a: Arc<dyn DeviceAccess> = Arc::new(VfioUserBackend::connect(ours.path(), map_bars).unwrap());
        let b: Arc<dyn DeviceAccess> = Arc::new(VfioUserBackend::connect(peer.path(), map_bars).unwrap());
        let (ia, ib) = (a.identity(), b.identity());
        assert_eq!(
            (ia.vendor_id, ia.device_id, &ia.bars, ia.msix_vectors, &ia.mapped_bars),
            (ib.vendor_id, ib.device_id, &ib.bars, ib.msix_vectors, &ib.mapped_bars),
            "map_bars={map_bars}"
        );
        for dev in [&a, &b] {
            dev.pci_enable_device().unwrap();
            assert_eq!(
                dev.read64(HFI1_BAR, regs::RCV_ARRAY_CNT).unwrap(),
                Hfi1Config::default().rcv_array_count as u64
            );
            dev.write64(HFI1_BAR, regs::RCV_VL15, 3).unwrap();
            assert_eq!(dev.read64(HFI1_BAR, regs::RCV_VL15).unwrap(), 3);
            dev.enable_msix(1).unwrap();
            // No interrupt is pending: the wait times out rather than failing.
            assert!(!dev.wait_irq(0, Duration::from_millis(10)).unwrap());
        }
        drop((a, b));
    }
}

#[test]
fn a_peer_whose_client_never_came_is_stopped_on_drop() {
    let start = std::time::Instant::now();
    drop(PeerServed::new(hfi1_function()).unwrap());
    assert!(start.elapsed() < Duration::from_secs(5));
}
