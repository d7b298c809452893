//! Quad-hash add + delete throughput through the CQP at 1, 16 and 256 WQEs per doorbell, on any device: the
//! WQEs are built with `post_sq` false except the last (one CQPDB write per batch), then the CCQ is polled
//! for the batch's completions. Case (d) on the host, and the guest mode's qhash rows.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::stats::{sample, Samples};
use crate::access::DeviceAccess;
use crate::dma::DmaPool;
use crate::irdma::ccq::irdma_sc_ccq_get_cqe_info;
use crate::irdma::defs::IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY;
use crate::irdma::process::IrdmaCqpState;
use crate::irdma::qhash::irdma_sc_manage_qhash_table_entry;
use crate::irdma::{
    IrdmaCcqCqeInfo, IrdmaDev, IrdmaDevConfig, IrdmaError, IrdmaQhashTableInfo, IrdmaQuadHashManageType,
};

pub const BATCHES: [u32; 3] = [1, 16, 256];
const WAIT: Duration = Duration::from_secs(5);
const MAC: [u8; 6] = [0x00, 0x11, 0x22, 0x33, 0x44, 0x55];

/// Established IPv4 connection `i`: 10.0.0.1:4791 <- 10.0.0.2:(10000 + i), steered to QP 100.
pub fn entry(i: u32, manage: IrdmaQuadHashManageType) -> IrdmaQhashTableInfo {
    IrdmaQhashTableInfo {
        manage,
        mac_addr: MAC,
        qp_num: 100,
        src_port: 10000u32.wrapping_add(i) as u16,
        ..crate::irdma::golden::g9_established()
    }
}

/// Posts commands for entries `first..first + n` as one doorbell and collects their `n` clean completions.
pub fn batch(st: &mut IrdmaCqpState, first: u32, n: u32, manage: IrdmaQuadHashManageType) -> Result<(), String> {
    for i in 0..n {
        irdma_sc_manage_qhash_table_entry(&mut st.cqp, &entry(first + i, manage), u64::from(i), i + 1 == n)
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

/// Add + delete rounds at one batch size.
pub struct QhashRate {
    pub wqes_per_doorbell: u32,
    /// Adds plus deletes per second, at the mean round.
    pub ops_per_second: f64,
    /// One round: `wqes_per_doorbell` adds, then as many deletes.
    pub rounds: Samples,
}

/// Brings the CQP up on `dev` (polling the CCQ), measures every batch size of [`BATCHES`] for `budget`
/// each, and destroys the CQP. Every add is deleted in the same round, so the table is empty between rounds.
pub fn qhash_rates(dev: Arc<dyn DeviceAccess>, budget: Duration) -> Result<Vec<QhashRate>, String> {
    dev.pci_enable_device().map_err(|e| format!("pci_enable_device: {e}"))?;
    let pool = Arc::new(DmaPool::new(dev, true));
    let irdma = IrdmaDev::new(pool, IrdmaDevConfig::default()).map_err(|e| format!("CQP bring-up: {e}"))?;
    let mut rates = Vec::new();
    {
        let mut st = irdma.lock();
        for n in BATCHES {
            let s = sample(budget, 3, 3, usize::MAX, || {
                batch(&mut st, 0, n, IrdmaQuadHashManageType::IrdmaQhashManageTypeAdd)?;
                batch(&mut st, 0, n, IrdmaQuadHashManageType::IrdmaQhashManageTypeDelete)
            })?;
            rates.push(QhashRate {
                wqes_per_doorbell: n,
                ops_per_second: s.per_second() * f64::from(2 * n),
                rounds: s,
            });
        }
    }
    irdma.destroy().map_err(|e| format!("destroy: {e}"))?;
    Ok(rates)
}
