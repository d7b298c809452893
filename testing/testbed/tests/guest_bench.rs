//! The in-guest benchmark (`udriver bench`) run on the host over vfio-user instead of VFIO: our hfi1 and
//! irdma functions, the rust-vmm peer and our server with its busy-poll on, with a tiny budget. Each case must run and
//! check its data; no time is asserted.

use std::sync::Arc;
use std::time::Duration;

use device_model::engine::Engine;
use device_model::irdma::{Irdma, IrdmaConfig};
use device_model::pci::PciIds;
use testbed::peer::{hfi1_function, PeerServed, PEER_DEVICE_ID, POLLED_DEVICE_ID};
use udriver::access::DeviceAccess;
use udriver::backend::vfio_user::VfioUserBackend;
use udriver::bench::guest::{run, GuestDevices};
use vfio_user_proto::ServerConfig;

fn connect(path: &std::path::Path) -> Arc<dyn DeviceAccess> {
    Arc::new(VfioUserBackend::connect(path, true).unwrap())
}

#[test]
fn every_guest_case_runs_against_ours_the_peer_and_the_polled_server() {
    let ours = testbed::Served::function(hfi1_function(0x1100).unwrap()).unwrap();
    let irdma =
        testbed::Served::new(Arc::new(Irdma::new(IrdmaConfig::default())) as Arc<dyn Engine>, PciIds::irdma_default())
            .unwrap();
    let peer = PeerServed::new(hfi1_function(PEER_DEVICE_ID).unwrap()).unwrap();
    let polled_config = ServerConfig { busy_poll: Duration::from_micros(50), ..Default::default() };
    let polled = testbed::Served::with_config(hfi1_function(POLLED_DEVICE_ID).unwrap(), polled_config).unwrap();
    let devs = GuestDevices {
        hfi1: connect(ours.path()),
        irdma: Some(connect(irdma.path())),
        peer: Some(connect(peer.path())),
        polled: Some(connect(polled.path())),
        edu: None,
    };
    let report = run(&devs, Duration::from_millis(10), "2026-01-01T00:00:00Z".into());
    let ids: Vec<&str> = report.cases.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["guest-a", "guest-b", "guest-d", "guest-e"]);
    for c in &report.cases {
        assert_eq!(c.error, None, "case {}", c.id);
        assert!(c.metrics.iter().all(|m| m.value.is_finite() && m.value >= 0.0), "case {}: {:?}", c.id, c.metrics);
    }
    assert_eq!(report.cases[0].targets.len(), 1, "ours / peer");
    drop(devs);
}
