//! The driver over a real vfio-user socket: the device model's server on its own thread, udriver's
//! vfio-user backend on the other side, with the RcvArray mapped (sparse mmap) or every access trapped.

mod hfi1_common;

use std::sync::Arc;
use std::time::Duration;

use device_model::engine::Engine;
use device_model::hfi1::{Hfi1, Hfi1Config};
use device_model::irdma::{Irdma, IrdmaConfig};
use device_model::pci::PciIds;
use udriver::access::DeviceAccess;
use udriver::backend::vfio_user::VfioUserBackend;
use udriver::demo::hfi1::{hfi1_demo, hfi1_stress, Hfi1DemoOptions};
use udriver::demo::irdma::{irdma_demo, IrdmaDemoOptions};
use udriver::irdma::process::IrdmaCqpWaitMode;

/// The engine served with its default IDs, and a client of it.
struct Served(testbed::Served);

impl Served {
    fn new(_tag: &str, engine: Arc<dyn Engine>) -> Served {
        let ids = PciIds::default_for(engine.name()).unwrap();
        Served(testbed::Served::new(engine, ids).unwrap())
    }

    fn connect(&self, map_bars: bool) -> Arc<dyn DeviceAccess> {
        Arc::new(VfioUserBackend::connect(self.0.path(), map_bars).unwrap())
    }
}

fn hfi1() -> Arc<dyn Engine> {
    Arc::new(Hfi1::new(Hfi1Config::default()).unwrap())
}

#[test]
fn hfi1_demo_places_and_verifies_data_over_vfio_user_mapped_and_trapped() {
    let served = Served::new("hfi1-demo", hfi1());
    for map_bars in [true, false] {
        let dev = served.connect(map_bars);
        assert_eq!(dev.identity().mapped_bars.contains(&0), map_bars);
        let rep = hfi1_demo(dev, &Hfi1DemoOptions::default());
        assert!(rep.ok, "map_bars={map_bars}\n{}", rep.render());
        let verified: u64 = rep
            .steps
            .iter()
            .filter(|s| s.name.starts_with("send through loopback"))
            .map(|s| s.detail["bytes_verified"].as_u64().unwrap())
            .sum();
        assert_eq!(verified, 2 * 3 * 256 * 1024, "three 256 KiB segments each over two buffers");
        // The SYNC path over the socket: a 32-segment READ crosses the flow PSN space, the flow comes back
        // with the next generation, and old-generation packets are refused.
        let sync = rep.steps.iter().find(|s| s.name.starts_with("a request crossing the flow PSN space")).unwrap();
        assert!(sync.ok, "{}", rep.render());
        hfi1_common::check_sync_step(&sync.detail, 4096);
    }
}

#[test]
fn hfi1_stress_over_vfio_user_leaks_nothing() {
    let served = Served::new("hfi1-stress", hfi1());
    let rep = hfi1_stress(served.connect(true), Duration::from_secs(2), 3);
    assert!(rep.ok, "{}", rep.render());
}

#[test]
fn irdma_demo_over_vfio_user_polling_and_by_interrupt() {
    let served = Served::new("irdma-demo", Arc::new(Irdma::new(IrdmaConfig::default())));
    for wait_mode in [IrdmaCqpWaitMode::Poll, IrdmaCqpWaitMode::Event { vector: 0 }] {
        let mut opts = IrdmaDemoOptions::default();
        opts.config.wait_mode = wait_mode;
        let rep = irdma_demo(served.connect(true), &opts);
        assert!(rep.ok, "{wait_mode:?}\n{}", rep.render());
    }
}

#[test]
fn a_second_client_finds_a_reset_device_after_the_first_went_away_mid_work() {
    let served = Served::new("irdma-reconnect", Arc::new(Irdma::new(IrdmaConfig::default())));
    {
        // Bring the CQP up, then vanish without tearing it down (dropping IrdmaDev posts no destroy; its
        // buffers unmap themselves and the connection closes).
        let dev = served.connect(true);
        let pool = Arc::new(udriver::dma::DmaPool::new(dev.clone(), false));
        dev.pci_enable_device().unwrap();
        let irdma = udriver::irdma::dev::IrdmaDev::new(pool, Default::default()).unwrap();
        drop(irdma);
    }
    let rep = irdma_demo(served.connect(true), &IrdmaDemoOptions::default());
    assert!(rep.ok, "{}", rep.render());
}
