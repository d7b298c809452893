//! (d) Quad-hash add + delete throughput through the CQP at 1, 16 and 256 WQEs per doorbell, over direct
//! vfio-user (the measurement itself is udriver's, `udriver::bench::qhash`, shared with the guest mode).

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use device_model::engine::Engine;
use device_model::irdma::{Irdma, IrdmaConfig};
use device_model::pci::PciIds;

use crate::served::Served;
use udriver::access::DeviceAccess;
use udriver::backend::vfio_user::VfioUserBackend;
use udriver::bench::qhash::qhash_rates;
use udriver::bench::{Better, Case, Target};

const TARGET_OPS: f64 = 300_000.0;

pub fn qhash_throughput(budget: Duration) -> Case {
    Case::new("d", "qhash add+delete throughput by WQEs per CQP doorbell (direct vfio-user, CCQ polled)").run(|case| {
        let engine = Arc::new(Irdma::new(IrdmaConfig::default()));
        let served = Served::new(engine as Arc<dyn Engine>, PciIds::irdma_default()).map_err(|e| e.to_string())?;
        let backend = VfioUserBackend::connect(served.path(), true).map_err(|e| format!("connect: {e}"))?;
        let dev: Arc<dyn DeviceAccess> = Arc::new(backend);
        let rates = qhash_rates(dev, budget)?;
        for r in &rates {
            let n = r.wqes_per_doorbell;
            case.metric(&format!("{n} WQE(s) per doorbell: ops/s"), r.ops_per_second, "1/s");
            case.metric(&format!("{n} WQE(s) per doorbell: median add+delete round"), r.rounds.median(), "ns");
        }
        if let Some(last) = rates.last() {
            case.target(Target::new(
                "ops/s at 256 WQEs per doorbell",
                last.ops_per_second,
                TARGET_OPS,
                "1/s",
                Better::Higher,
            ));
        }
        case.note(
            "one op = one MANAGE_QUAD_HASH_TABLE_ENTRY (add or delete of an IPv4 established entry) completed \
             without error; every add is deleted in the same round, so the table is empty between rounds",
        );
        Ok(())
    })
}
