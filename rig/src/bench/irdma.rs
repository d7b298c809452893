//! (d) Quad-hash add + delete throughput through the CQP at 1, 16 and 256 WQEs per doorbell: the WQEs are
//! built with `post_sq` false except the last (one CQPDB write per batch), then the CCQ is polled for the
//! batch's completions.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use device_model::engine::Engine;
use device_model::irdma::{Irdma, IrdmaConfig};
use device_model::pci::PciIds;

use super::stats::sample;
use super::{Better, Case, Target};
use crate::served::Served;
use udriver::access::DeviceAccess;
use udriver::backend::vfio_user::VfioUserBackend;
use udriver::dma::DmaPool;
use udriver::irdma::ccq::irdma_sc_ccq_get_cqe_info;
use udriver::irdma::defs::IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY;
use udriver::irdma::process::IrdmaCqpState;
use udriver::irdma::qhash::{irdma_sc_manage_qhash_table_entry, IrdmaVsiQos};
use udriver::irdma::{
    IrdmaCcqCqeInfo, IrdmaDev, IrdmaDevConfig, IrdmaError, IrdmaQhashTableInfo, IrdmaQuadEntryType,
    IrdmaQuadHashManageType,
};

pub const BATCHES: [u32; 3] = [1, 16, 256];
const TARGET_OPS: f64 = 300_000.0;
const WAIT: Duration = Duration::from_secs(5);
const MAC: [u8; 6] = [0x00, 0x11, 0x22, 0x33, 0x44, 0x55];

/// Established IPv4 connection `i`: 10.0.0.1:4791 <- 10.0.0.2:(10000 + i), steered to QP 100.
fn entry(i: u32, manage: IrdmaQuadHashManageType) -> IrdmaQhashTableInfo {
    IrdmaQhashTableInfo {
        vsi: IrdmaVsiQos::default(),
        manage,
        entry_type: IrdmaQuadEntryType::IrdmaQhashTypeTcpEstablished,
        vlan_valid: false,
        ipv4_valid: true,
        mac_addr: MAC,
        vlan_id: 0,
        user_pri: 0,
        qp_num: 100,
        dest_ip: [0x0A00_0001, 0, 0, 0],
        src_ip: [0x0A00_0002, 0, 0, 0],
        dest_port: 4791,
        src_port: 10000 + i as u16,
    }
}

/// Posts `n` quad-hash commands as one doorbell and collects their `n` clean completions.
fn batch(st: &mut IrdmaCqpState, n: u32, manage: IrdmaQuadHashManageType) -> Result<(), String> {
    for i in 0..n {
        irdma_sc_manage_qhash_table_entry(&mut st.cqp, &entry(i, manage), u64::from(i), i + 1 == n)
            .map_err(|e| format!("post: {e}"))?;
    }
    let deadline = Instant::now() + WAIT;
    let mut seen = 0;
    while seen < n {
        let mut info = IrdmaCcqCqeInfo::default();
        match irdma_sc_ccq_get_cqe_info(&mut st.ccq, &mut st.cqp, &mut info) {
            Ok(()) if info.error || info.op_code != IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY => {
                return Err(format!("completion op {:#x} major {:#x}", info.op_code, info.maj_err_code));
            }
            Ok(()) => seen += 1,
            Err(IrdmaError::NoCqe) if Instant::now() < deadline => std::thread::yield_now(),
            Err(IrdmaError::NoCqe) => return Err(format!("{seen} of {n} completions within {WAIT:?}")),
            Err(e) => return Err(format!("CCQ: {e}")),
        }
    }
    Ok(())
}

pub fn qhash_throughput(budget: Duration) -> Case {
    Case::new("d", "qhash add+delete throughput by WQEs per CQP doorbell (direct vfio-user, CCQ polled)").run(|case| {
        let engine = Arc::new(Irdma::new(IrdmaConfig::default()));
        let served = Served::new(engine as Arc<dyn Engine>, PciIds::irdma_default()).map_err(|e| e.to_string())?;
        let backend = VfioUserBackend::connect(served.path(), true).map_err(|e| format!("connect: {e}"))?;
        let dev: Arc<dyn DeviceAccess> = Arc::new(backend);
        dev.pci_enable_device().map_err(|e| format!("pci_enable_device: {e}"))?;
        let pool = Arc::new(DmaPool::new(dev.clone(), true));
        let irdma = IrdmaDev::new(pool, IrdmaDevConfig::default()).map_err(|e| format!("CQP bring-up: {e}"))?;
        let mut rates = Vec::new();
        {
            let mut st = irdma.lock();
            for n in BATCHES {
                let s = sample(budget, 3, 3, usize::MAX, || {
                    batch(&mut st, n, IrdmaQuadHashManageType::IrdmaQhashManageTypeAdd)?;
                    batch(&mut st, n, IrdmaQuadHashManageType::IrdmaQhashManageTypeDelete)
                })?;
                let ops = s.per_second() * f64::from(2 * n);
                case.metric(&format!("{n} WQE(s) per doorbell: ops/s"), ops, "1/s");
                case.metric(&format!("{n} WQE(s) per doorbell: median add+delete round"), s.median(), "ns");
                rates.push(ops);
            }
        }
        if let Some(last) = rates.last() {
            case.target(Target::new("ops/s at 256 WQEs per doorbell", *last, TARGET_OPS, "1/s", Better::Higher));
        }
        irdma.destroy().map_err(|e| format!("destroy: {e}"))?;
        case.note(
            "one op = one MANAGE_QUAD_HASH_TABLE_ENTRY (add or delete of an IPv4 established entry) completed \
             without error; every add is deleted in the same round, so the table is empty between rounds",
        );
        Ok(())
    })
}
