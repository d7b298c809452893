//! Device bring-up (`irdma_sc_dev_init`, PE readiness) and `IrdmaDev`, which owns the CQP, the CCQ and their
//! DMA memory, and serialises commands under the CQP lock (reference 3.2, 3.5, 3.9).

#![forbid(unsafe_code)]

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

use vfio_user_proto::sync::Unpoison;

use super::ccq::{irdma_sc_ccq_arm, irdma_sc_ccq_create, irdma_sc_ccq_destroy, irdma_sc_ccq_init, IrdmaCcqInitInfo};
pub use super::cqp::IrdmaHwAttrs;
use super::cqp::*;
use super::defs::*;
use super::regs::IrdmaRegisters::*;
use super::regs::*;
use super::types::{IrdmaCqpState, IrdmaCqpWaitMode};
pub use super::types::{IrdmaDev, IrdmaDevConfig, IRDMA_GEN2_HW_MAJ_VER, IRDMA_HMC_PROFILE_DEFAULT};
use super::{IrdmaError, Result};
use crate::dma::DmaPool;

/// `irdma_sc_dev_init`'s hardware check: the PE doorbell BAR size must be 4 MiB or 8 MiB, else -ENODEV.
/// Returns the PE_DB_SIZE encoding.
pub fn irdma_sc_dev_init(hw: &IrdmaHw) -> Result<u32> {
    let val = hw.rd32(IRDMA_GLPCI_LBARCTRL)?;
    let db_size = IRDMA_GLPCI_LBARCTRL_PE_DB_SIZE.get32(val);
    if db_size != IRDMA_PE_DB_SIZE_4M && db_size != IRDMA_PE_DB_SIZE_8M {
        return Err(IrdmaError::NoDevice(db_size));
    }
    Ok(db_size)
}

/// `irdma_wait_pe_ready`: GLPE_CPUSTATUS0..2 must all read 0x80; one check plus up to max_pe_ready_count
/// retries, pe_ready_delay apart, else -ETIMEDOUT.
pub fn irdma_wait_pe_ready(hw: &IrdmaHw, attrs: &IrdmaHwAttrs) -> Result<()> {
    let mut last = [0; 3];
    for attempt in 0..=attrs.max_pe_ready_count {
        if attempt > 0 {
            std::thread::sleep(attrs.pe_ready_delay);
        }
        last = [hw.rd32(IRDMA_GLPE_CPUSTATUS0)?, hw.rd32(IRDMA_GLPE_CPUSTATUS1)?, hw.rd32(IRDMA_GLPE_CPUSTATUS2)?];
        if last.iter().all(|s| *s == IRDMA_CPU_STATUS_READY) {
            return Ok(());
        }
    }
    Err(IrdmaError::PeNotReady(last))
}

/// GLINT_CEQCTL.ITR_INDX written by `icrdma_cfg_ceq`: index 3, no interrupt throttling.
pub const IRDMA_GLINT_CEQCTL_ITR_INDX_NOITR: u32 = 3;

/// `icrdma_cfg_ceq(dev, ceq_id, idx, enable)`: routes CEQ `ceq_id` (the CCQ's) to MSI-X vector `idx` through
/// GLINT_CEQCTL(ceq_id) (+4 per CEQ), with the cause enabled or not. -EINVAL for a vector that does not fit
/// MSIX_INDX.
pub fn icrdma_cfg_ceq(hw: &IrdmaHw, ceq_id: u32, idx: u32, enable: bool) -> Result<()> {
    if u64::from(idx) > IRDMA_GLINT_CEQCTL_MSIX_INDX.get(u64::MAX) {
        return Err(IrdmaError::Inval(format!("MSI-X vector {idx} does not fit GLINT_CEQCTL.MSIX_INDX")));
    }
    let reg_val = IRDMA_GLINT_CEQCTL_CAUSE_ENA.prep_bool(enable)
        | IRDMA_GLINT_CEQCTL_MSIX_INDX.prep(idx.into())
        | IRDMA_GLINT_CEQCTL_ITR_INDX.prep(IRDMA_GLINT_CEQCTL_ITR_INDX_NOITR.into());
    hw.wr32_idx(IRDMA_GLINT_CEQCTL, ceq_id, reg_val as u32)?;
    Ok(())
}

impl IrdmaDev {
    /// Brings the control path up as the kernel does: PE readiness, dev init, CQP init and create, CCQ init
    /// and create (and MSI-X plus a first CCQ arm in event mode). Every DMA buffer is given back if a step
    /// fails.
    pub fn new(pool: Arc<DmaPool>, config: IrdmaDevConfig) -> Result<Self> {
        let hw = IrdmaHw::new(pool.device().clone());
        // ctrl.c irdma_sc_dev_init: PE readiness first, then the doorbell BAR size.
        irdma_wait_pe_ready(&hw, &config.hw_attrs)?;
        let db_size = irdma_sc_dev_init(&hw)?;

        let sq = PooledBuffer::alloc_contiguous(&pool, config.sq_size as usize * IRDMA_CQP_WQE_SIZE)?;
        let host_ctx = PooledBuffer::alloc_contiguous(&pool, IRDMA_CQP_CTX_SIZE)?;
        let host_ctx_pa = host_ctx.iova(0).ok_or_else(|| IrdmaError::Inval("host context has no IOVA".into()))?;
        let mut cqp = irdma_sc_cqp_init(IrdmaCqpInitInfo {
            sq: Box::new(sq),
            host_ctx: Box::new(host_ctx),
            pool: pool.clone(),
            hw: hw.clone(),
            hw_attrs: config.hw_attrs,
            sq_size: config.sq_size,
            struct_ver: 0,
            hw_maj_ver: config.hw_maj_ver,
            hw_min_ver: config.hw_min_ver,
            hmc_profile: config.hmc_profile,
            ena_vf_count: 0,
            ceqs_per_vf: 0,
            disable_packed: false,
            rocev2_rto_policy: false,
            protocol_used: config.protocol_used,
            dcqcn_params: IrdmaDcqcnParams::default(),
            cqp_compl_ctx: host_ctx_pa,
        })?;
        let (mut maj, mut min) = (0, 0);
        if let Err(e) = irdma_sc_cqp_create(&mut cqp, &mut maj, &mut min) {
            tracing::error!(error = %e, maj, min, "CQP create failed");
            return Err(e);
        }

        let ring = PooledBuffer::alloc_contiguous(&pool, config.ccq_size as usize * IRDMA_CQE_SIZE)?;
        let shadow = PooledBuffer::alloc_contiguous(&pool, IRDMA_SHADOW_AREA_SIZE)?;
        let cq_ctx = shadow.iova(0).unwrap_or_default();
        let ccq = irdma_sc_ccq_init(
            hw.clone(),
            IrdmaCcqInitInfo {
                cq_base: Box::new(ring),
                shadow_area: Box::new(shadow),
                num_elem: config.ccq_size,
                shadow_read_threshold: IRDMA_CCQ_SHADOW_READ_THRESHOLD,
                ceq_id: 0,
                ceq_id_valid: true,
                ceqe_mask: false,
                vsi_idx: 0,
                cq_ctx,
            },
        );
        let mut ccq = match ccq {
            Ok(c) => c,
            Err(e) => {
                let _ = irdma_sc_cqp_destroy(&mut cqp);
                return Err(e);
            }
        };
        // The CCQ must hold a completion for every SQ entry that can be outstanding.
        if ccq.cq_size < config.sq_size {
            let _ = irdma_sc_cqp_destroy(&mut cqp);
            return Err(IrdmaError::Inval(format!("CCQ size {} below SQ size {}", ccq.cq_size, config.sq_size)));
        }
        let created = irdma_sc_ccq_create(&mut ccq, &mut cqp, 0, true, true).and_then(|()| {
            if let IrdmaCqpWaitMode::Event { vector } = config.wait_mode {
                hw.device().enable_msix(vector.saturating_add(1))?;
                // irdma_cfg_ceq_vector: without CAUSE_ENA the CCQ's CEQ raises nothing.
                icrdma_cfg_ceq(&hw, ccq.ceq_id, vector, true)?;
                irdma_sc_ccq_arm(&ccq)?;
            }
            Ok(())
        });
        if let Err(e) = created {
            let _ = irdma_sc_cqp_destroy(&mut cqp);
            return Err(e);
        }
        Ok(Self {
            hw,
            config,
            db_size,
            cqp_lock: Mutex::new(IrdmaCqpState::new(cqp, ccq)),
            next_scratch: AtomicU64::new(1),
        })
    }

    pub fn config(&self) -> &IrdmaDevConfig {
        &self.config
    }

    /// The CQP lock; nothing in this crate holds it across a wait.
    pub fn lock(&self) -> MutexGuard<'_, IrdmaCqpState> {
        self.cqp_lock.lock().unpoison()
    }

    /// Tears down as `irdma_destroy_ccq` then `irdma_destroy_cqp` do: completions still in the CCQ are
    /// collected first, the CCQ is destroyed by a CQP command polled through CQPTAIL, then the CQP through
    /// the registers. The CQP is destroyed even if the CCQ step fails; the first error is returned. The
    /// queue memory is given back when `self` drops.
    pub fn destroy(self) -> Result<()> {
        let mut st = self.lock();
        if let Err(e) = super::process::irdma_cqp_ce_handler(&mut st) {
            tracing::warn!(error = %e, "bad CQE while draining the CCQ for destroy");
        }
        let st = &mut *st;
        let ccq = irdma_sc_ccq_destroy(&mut st.ccq, &mut st.cqp, 0, true);
        let cqp = irdma_sc_cqp_destroy(&mut st.cqp);
        ccq.and(cqp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::irdma::testdev::*;

    fn errno<T>(r: Result<T>) -> i32 {
        r.err().map_or(0, |e| e.to_errno())
    }

    #[test]
    fn dev_init_accepts_only_a_4_or_8_mib_doorbell_bar() {
        for (pe_db_size, want) in [(0u32, -libc::ENODEV), (1, 0), (2, 0), (3, -libc::ENODEV)] {
            let dev = FakeIrdma::scripted();
            // Bits outside PE_DB_SIZE must not matter.
            dev.set_reg(IRDMA_GLPCI_LBARCTRL, 0xFFFF_FFCF | pe_db_size << 4);
            let r = irdma_sc_dev_init(&IrdmaHw::new(dev.clone()));
            assert_eq!(errno(r), want, "PE_DB_SIZE {pe_db_size}");
        }
    }

    #[test]
    fn pe_readiness_retries_until_all_three_cpustatus_read_0x80() {
        let dev = FakeIrdma::scripted();
        dev.script(IRDMA_GLPE_CPUSTATUS1, &[0x00, 0x40]);
        irdma_wait_pe_ready(&IrdmaHw::new(dev.clone()), &fast_attrs()).unwrap();
        assert!(dev.writes().is_empty());
    }

    #[test]
    fn pe_readiness_gives_up_after_the_retry_count_with_etimedout() {
        let dev = FakeIrdma::scripted();
        let attrs = fast_attrs();
        // Not ready for exactly 1 + max_pe_ready_count checks: the retry budget is spent.
        let tries = attrs.max_pe_ready_count as usize + 1;
        dev.script(IRDMA_GLPE_CPUSTATUS2, &vec![0x81; tries]);
        let r = irdma_wait_pe_ready(&IrdmaHw::new(dev.clone()), &attrs);
        assert!(matches!(r, Err(IrdmaError::PeNotReady([0x80, 0x80, 0x81]))));
        assert_eq!(errno(r), -libc::ETIMEDOUT);
        // One fewer failure and the last retry succeeds.
        let dev = FakeIrdma::scripted();
        dev.script(IRDMA_GLPE_CPUSTATUS2, &vec![0x81; tries - 1]);
        irdma_wait_pe_ready(&IrdmaHw::new(dev.clone()), &attrs).unwrap();
    }

    #[test]
    fn bring_up_creates_the_cqp_then_the_ccq_through_a_create_cq_wqe() {
        let dev = FakeIrdma::executing();
        let pool = Arc::new(DmaPool::new(dev.clone(), false));
        let cfg = IrdmaDevConfig { hw_attrs: fast_attrs(), ..Default::default() };
        let irdma = IrdmaDev::new(pool, cfg).unwrap();
        assert_eq!(irdma.db_size, IRDMA_PE_DB_SIZE_8M);
        let ccq = dev.ccq().unwrap();
        assert_eq!(ccq.size, IW_CCQ_SIZE);
        let exec = dev.executed();
        assert_eq!(exec.len(), 1);
        assert_eq!(IRDMA_CQPSQ_OPCODE.get(exec[0][3]), u64::from(IRDMA_CQP_OP_CREATE_CQ));
        let st = irdma.lock();
        assert_eq!((st.cqp.sq_ring().head(), st.cqp.sq_ring().tail(), st.ccq.cq_ring().head()), (1, 1, 1));
        assert_eq!((ccq.pa, ccq.shadow_pa), (st.ccq.cq_pa, st.ccq.shadow_area_pa));
        assert_eq!(st.ccq.cq_pa % IRDMA_CQ0_ALIGNMENT, 0);
        assert_eq!(st.cqp.sq_pa % IRDMA_CQP_ALIGNMENT, 0);
        drop(st);
        dev.clear_writes();
        irdma.destroy().unwrap();
        let last = *dev.executed().last().unwrap();
        // DESTROY_CQ of CQ 0: VALID 1<<63 | CEQIDVALID 1<<49 | OPCODE 5<<32; size and shadow area echoed.
        assert_eq!(last[3], 0x8002_0005_0000_0000);
        assert_eq!((last[0], last[5]), (u64::from(IW_CCQ_SIZE), ccq.shadow_pa));
        assert!(dev.ccq().is_none());
        let w = dev.writes();
        assert_eq!(w.first().map(|(o, v)| (*o, *v)), Some((IrdmaHw::offset(IRDMA_CQPDB), 2)));
        assert_eq!(w[w.len() - 2..], [(IrdmaHw::offset(IRDMA_CCQPHIGH), 0), (IrdmaHw::offset(IRDMA_CCQPLOW), 0)]);
        assert_eq!(dev.mapped(), 0, "every queue buffer was unmapped");
    }

    #[test]
    fn bring_up_fails_cleanly_when_the_device_rejects_the_cqp() {
        let dev = FakeIrdma::scripted();
        dev.script(IRDMA_CCQPSTATUS, &[0x8000_0001]);
        let pool = Arc::new(DmaPool::new(dev.clone(), false));
        let cfg = IrdmaDevConfig { hw_attrs: fast_attrs(), sq_size: 4, ccq_size: 4, ..Default::default() };
        assert_eq!(errno(IrdmaDev::new(pool.clone(), cfg)), -libc::EOPNOTSUPP);
        // Every buffer went back: nothing is mapped and the first IOVA is free again.
        assert_eq!(dev.mapped(), 0);
        let b = pool.alloc_contiguous(4096).unwrap();
        assert_eq!(b.iova(0), Some(crate::dma::IOVA_BASE));
    }

    #[test]
    fn bring_up_rejects_a_ccq_smaller_than_the_sq() {
        let dev = FakeIrdma::executing();
        let pool = Arc::new(DmaPool::new(dev.clone(), false));
        let cfg = IrdmaDevConfig { hw_attrs: fast_attrs(), sq_size: 8, ccq_size: 4, ..Default::default() };
        assert_eq!(errno(IrdmaDev::new(pool, cfg)), -libc::EINVAL);
    }
}
