//! The control CQ: created by a CREATE_CQ WQE on the CQP, consumed with a polarity bit, armed through the
//! shadow area and CQARM (reference 3.8, 3.9).

#![forbid(unsafe_code)]

use super::cqp::{irdma_cqp_poll_registers, irdma_get_cqp_reg_info, irdma_sc_cqp_get_next_send_wqe_idx};
use super::cqp::{irdma_sc_cqp_post_sq, queue_pa, sleep, IrdmaRing};
use super::cqp::{IrdmaScCqp, QueueMemory};
use super::defs::*;
use super::regs::IrdmaRegisters::{IRDMA_CQARM, IRDMA_CQPERRCODES};
use super::regs::{IrdmaHw, IRDMA_CQPSQ_CQ_CEQID, IRDMA_CQPSQ_CQ_CQID};
use super::{IrdmaError, Result};

/// `struct irdma_ccq_init_info`.
pub struct IrdmaCcqInitInfo {
    pub cq_base: Box<dyn QueueMemory>,
    pub shadow_area: Box<dyn QueueMemory>,
    pub num_elem: u32,
    pub shadow_read_threshold: u32,
    pub ceq_id: u32,
    pub ceq_id_valid: bool,
    pub ceqe_mask: bool,
    pub vsi_idx: u16,
    /// CQ-create qw1: the kernel puts the CQ pointer >> 1 there; we put this opaque value >> 1.
    pub cq_ctx: u64,
}

/// `struct irdma_sc_cq` used as the CCQ (cq_id 0).
pub struct IrdmaScCq {
    hw: IrdmaHw,
    cq_base: Box<dyn QueueMemory>,
    shadow_area: Box<dyn QueueMemory>,
    pub cq_pa: u64,
    pub shadow_area_pa: u64,
    pub cq_id: u32,
    pub cq_size: u32,
    pub(crate) cq_ring: IrdmaRing,
    pub polarity: u8,
    pub shadow_read_threshold: u32,
    pub ceq_id: u32,
    pub ceq_id_valid: bool,
    pub ceqe_mask: bool,
    pub vsi_idx: u16,
    pub cq_ctx: u64,
}

/// The CCQ is always CQ 0 (3.9).
pub const IRDMA_CCQ_CQ_ID: u32 = 0;

/// `struct irdma_ccq_cqe_info`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IrdmaCcqCqeInfo {
    pub scratch: u64,
    pub op_ret_val: u32,
    pub maj_err_code: u16,
    pub min_err_code: u16,
    pub op_code: u8,
    pub error: bool,
    pub wqe_idx: u32,
}

impl IrdmaScCq {
    pub fn cq_ring(&self) -> IrdmaRing {
        self.cq_ring
    }
    /// Whether the next CQE slot holds a valid-bit match, without consuming it.
    pub fn has_new_cqe(&self) -> Result<bool> {
        let qw3 = self.cq_base.read_u64(self.cq_ring.head() as usize * IRDMA_CQE_SIZE + IRDMA_BYTE_24)?;
        Ok(IRDMA_CQ_VALID.get(qw3) == u64::from(self.polarity))
    }
}

/// `irdma_sc_ccq_init(ccq, info)`; the initialised ccq is the return value. -EINVAL for an empty ring,
/// memory too small or misaligned.
pub fn irdma_sc_ccq_init(hw: IrdmaHw, info: IrdmaCcqInitInfo) -> Result<IrdmaScCq> {
    // The kernel accepts 1 entry (IRDMA_MIN_CQ_SIZE), but its IRDMA_RING_MOVE_HEAD never moves a 1-entry
    // ring, so such a CCQ completes nothing (decision 25).
    if info.num_elem < 2 || info.num_elem > IRDMA_CQ_DBSA_CQEIDX.mask() as u32 {
        return Err(IrdmaError::Inval(format!("CCQ size {}", info.num_elem)));
    }
    // ctrl.c checks `ceq_id >= dev->hmc_fpm_misc.max_ceqs`, valid or not; without an FPM query the limit is
    // what the CQ context's CEQID field can name.
    if info.ceq_id >= IRDMA_CEQ_MAX_COUNT {
        return Err(IrdmaError::Inval(format!("CEQ id {}", info.ceq_id)));
    }
    let ring_len = info.num_elem as usize * IRDMA_CQE_SIZE;
    let cq_pa = queue_pa(info.cq_base.as_ref(), ring_len, IRDMA_CQ0_ALIGNMENT, "CCQ ring")?;
    let shadow_area_pa =
        queue_pa(info.shadow_area.as_ref(), IRDMA_SHADOW_AREA_SIZE, IRDMA_SHADOW_AREA_ALIGNMENT, "CCQ shadow area")?;
    Ok(IrdmaScCq {
        hw,
        cq_base: info.cq_base,
        shadow_area: info.shadow_area,
        cq_pa,
        shadow_area_pa,
        cq_id: IRDMA_CCQ_CQ_ID,
        cq_size: info.num_elem,
        cq_ring: IrdmaRing::new(info.num_elem),
        polarity: 1,
        shadow_read_threshold: info.shadow_read_threshold,
        ceq_id: info.ceq_id,
        ceq_id_valid: info.ceq_id_valid,
        ceqe_mask: info.ceqe_mask,
        vsi_idx: info.vsi_idx,
        cq_ctx: info.cq_ctx,
    })
}

/// `irdma_sc_ccq_create(ccq, scratch, check_overflow, post_sq)`, with the CQP explicit (the kernel reaches it
/// through `ccq->dev->cqp`). Builds the CREATE_CQ WQE (3.9); with `post_sq`, rings the doorbell and waits
/// for the CCQ's own completion, which lands in the CCQ.
pub fn irdma_sc_ccq_create(
    ccq: &mut IrdmaScCq,
    cqp: &mut IrdmaScCqp,
    scratch: u64,
    check_overflow: bool,
    post_sq: bool,
) -> Result<()> {
    let mut idx = 0;
    irdma_sc_cqp_get_next_send_wqe_idx(cqp, scratch, &mut idx)?;
    let wqe = cqp.wqe(idx)?;
    wqe.set_64bit_val(IRDMA_BYTE_0, ccq.cq_size.into())?;
    wqe.set_64bit_val(IRDMA_BYTE_8, ccq.cq_ctx >> 1)?;
    wqe.set_64bit_val(IRDMA_BYTE_16, IRDMA_CQPSQ_CQ_SHADOW_READ_THRESHOLD.prep(ccq.shadow_read_threshold.into()))?;
    wqe.set_64bit_val(IRDMA_BYTE_32, ccq.cq_pa)?;
    wqe.set_64bit_val(IRDMA_BYTE_40, ccq.shadow_area_pa)?;
    wqe.set_64bit_val(IRDMA_BYTE_48, IRDMA_CQPSQ_CQ_FIRSTPMPBLIDX.prep(0))?;
    wqe.set_64bit_val(IRDMA_BYTE_56, IRDMA_CQPSQ_TPHVAL.prep(0) | IRDMA_CQPSQ_VSIIDX.prep(ccq.vsi_idx.into()))?;
    let hdr = IRDMA_CQPSQ_CQ_CQID.prep(ccq.cq_id.into())
        | IRDMA_CQPSQ_CQ_CEQID.prep(if ccq.ceq_id_valid { ccq.ceq_id.into() } else { 0 })
        | IRDMA_CQPSQ_OPCODE.prep(IRDMA_CQP_OP_CREATE_CQ.into())
        | IRDMA_CQPSQ_CQ_LPBLSIZE.prep(0)
        | IRDMA_CQPSQ_CQ_CHKOVERFLOW.prep_bool(check_overflow)
        | IRDMA_CQPSQ_CQ_VIRTMAP.prep_bool(false)
        | IRDMA_CQPSQ_CQ_ENCEQEMASK.prep_bool(ccq.ceqe_mask)
        | IRDMA_CQPSQ_CQ_CEQIDVALID.prep_bool(ccq.ceq_id_valid)
        | IRDMA_CQPSQ_TPHEN.prep_bool(false)
        | IRDMA_CQPSQ_CQ_AVOIDMEMCNFLCT.prep_bool(false)
        | IRDMA_CQPSQ_WQEVALID.prep(cqp.polarity.into());
    wqe.dma_wmb();
    wqe.set_64bit_val(IRDMA_BYTE_24, hdr)?;
    if post_sq {
        irdma_sc_cqp_post_sq(cqp)?;
        let mut info = IrdmaCcqCqeInfo::default();
        irdma_sc_poll_for_cqp_op_done(cqp, ccq, IRDMA_CQP_OP_CREATE_CQ, &mut info)?;
    }
    Ok(())
}

/// `irdma_sc_ccq_destroy(ccq, scratch, post_sq)`, with the CQP explicit. The CCQ cannot report its own
/// destruction, so completion is by register polling (CQPTAIL), up to max_done_count reads.
pub fn irdma_sc_ccq_destroy(ccq: &mut IrdmaScCq, cqp: &mut IrdmaScCqp, scratch: u64, post_sq: bool) -> Result<()> {
    let mut idx = 0;
    irdma_sc_cqp_get_next_send_wqe_idx(cqp, scratch, &mut idx)?;
    let wqe = cqp.wqe(idx)?;
    wqe.set_64bit_val(IRDMA_BYTE_0, ccq.cq_size.into())?;
    wqe.set_64bit_val(IRDMA_BYTE_8, ccq.cq_ctx >> 1)?;
    wqe.set_64bit_val(IRDMA_BYTE_40, ccq.shadow_area_pa)?;
    let hdr = IRDMA_CQPSQ_CQ_CQID.prep(ccq.cq_id.into())
        | IRDMA_CQPSQ_CQ_CEQID.prep(if ccq.ceq_id_valid { ccq.ceq_id.into() } else { 0 })
        | IRDMA_CQPSQ_OPCODE.prep(IRDMA_CQP_OP_DESTROY_CQ.into())
        | IRDMA_CQPSQ_CQ_ENCEQEMASK.prep_bool(ccq.ceqe_mask)
        | IRDMA_CQPSQ_CQ_CEQIDVALID.prep_bool(ccq.ceq_id_valid)
        | IRDMA_CQPSQ_TPHEN.prep_bool(false)
        | IRDMA_CQPSQ_CQ_AVOIDMEMCNFLCT.prep_bool(false)
        | IRDMA_CQPSQ_WQEVALID.prep(cqp.polarity.into());
    wqe.dma_wmb();
    wqe.set_64bit_val(IRDMA_BYTE_24, hdr)?;
    // §3.9: sample WQTAIL before posting. CQP_OP_ERR is not judged here but while polling, as the kernel
    // does: it belongs to the command being polled.
    let (val, tail, _) = irdma_get_cqp_reg_info(cqp)?;
    if tail >= cqp.sq_size {
        return Err(IrdmaError::BadRegister { reg: "CQPTAIL", value: val });
    }
    if post_sq {
        irdma_sc_cqp_post_sq(cqp)?;
        irdma_cqp_poll_registers(cqp, tail, cqp.hw_attrs.max_done_count)?;
    }
    Ok(())
}

/// `irdma_sc_ccq_get_cqe_info(ccq, info)`, with the CQP explicit. -ENOENT (`NoCqe`) when the next CQE's valid
/// bit is not the CCQ polarity. A CQE whose valid bit matches is consumed; if it names a WQE that is not
/// outstanding, or its completion context is not ours, it frees nothing and gives -EIO (`BadCqe`).
pub fn irdma_sc_ccq_get_cqe_info(ccq: &mut IrdmaScCq, cqp: &mut IrdmaScCqp, info: &mut IrdmaCcqCqeInfo) -> Result<()> {
    let base = ccq.cq_ring.head() as usize * IRDMA_CQE_SIZE;
    let qw3 = ccq.cq_base.read_u64(base + IRDMA_BYTE_24)?;
    if IRDMA_CQ_VALID.get(qw3) != u64::from(ccq.polarity) {
        return Err(IrdmaError::NoCqe);
    }
    ccq.cq_base.dma_rmb();
    let ctx = ccq.cq_base.read_u64(base + IRDMA_BYTE_8)?;
    let error = IRDMA_CQ_ERROR.get(qw3) != 0;
    if error {
        // The kernel reads CQPERRCODES here, only for its debug log.
        let codes = cqp.hw.rd32(IRDMA_CQPERRCODES)?;
        tracing::debug!(cqperrcodes = format_args!("{codes:#010x}"), "CQP error CQE");
    }
    let qw2 = ccq.cq_base.read_u64(base + IRDMA_BYTE_16)?;
    // Consume the slot before judging it, so one bad entry cannot wedge the ring.
    ccq.cq_ring.move_head();
    if ccq.cq_ring.head() == 0 {
        ccq.polarity ^= 1;
    }
    ccq.cq_ring.move_tail();
    ccq.shadow_area.write_u64(IRDMA_BYTE_0, IRDMA_CQ_DBSA_CQEIDX.prep(ccq.cq_ring.head().into()))?;
    ccq.shadow_area.dma_wmb();

    let wqe_idx = IRDMA_CQ_WQEIDX.get(qw3) as u32;
    if ctx != cqp.cqp_compl_ctx {
        return Err(IrdmaError::BadCqe(format!("completion context {ctx:#x}, expected {:#x}", cqp.cqp_compl_ctx)));
    }
    if wqe_idx >= cqp.sq_size || cqp.scratch(wqe_idx).is_none() {
        return Err(IrdmaError::BadCqe(format!("WQE index {wqe_idx} is not an outstanding SQ entry")));
    }
    // The opcode comes from the WQE we posted, not from the CQE.
    let op_code = IRDMA_CQPSQ_OPCODE.get(cqp.wqe(wqe_idx)?.get_64bit_val(IRDMA_BYTE_24)?) as u8;
    let scratch = cqp.complete_wqe(wqe_idx).unwrap_or_default();
    *info = IrdmaCcqCqeInfo {
        scratch,
        op_ret_val: IRDMA_CCQ_OPRETVAL.get(qw2) as u32,
        maj_err_code: if error { IRDMA_CQ_MAJERR.get(qw3) as u16 } else { IRDMA_CQPSQ_MAJ_NO_ERROR },
        min_err_code: IRDMA_CQ_MINERR.get(qw3) as u16,
        op_code,
        error,
        wqe_idx,
    };
    Ok(())
}

/// `irdma_sc_ccq_arm(ccq)`: bumps the 2-bit arm sequence in shadow qw4 with ARM_NEXT, then writes the
/// CQ id to CQARM.
pub fn irdma_sc_ccq_arm(ccq: &IrdmaScCq) -> Result<()> {
    let v = ccq.shadow_area.read_u64(IRDMA_BYTE_32)?;
    let arm_seq_num = (IRDMA_CQ_DBSA_ARM_SEQ_NUM.get(v) + 1) & IRDMA_CQ_DBSA_ARM_SEQ_NUM.get(u64::MAX);
    let temp = IRDMA_CQ_DBSA_ARM_SEQ_NUM.prep(arm_seq_num)
        | IRDMA_CQ_DBSA_SW_CQ_SELECT.prep(IRDMA_CQ_DBSA_SW_CQ_SELECT.get(v))
        | IRDMA_CQ_DBSA_ARM_NEXT_SE.prep(IRDMA_CQ_DBSA_ARM_NEXT_SE.get(v))
        | IRDMA_CQ_DBSA_ARM_NEXT.prep(1);
    ccq.shadow_area.write_u64(IRDMA_BYTE_32, temp)?;
    ccq.shadow_area.dma_wmb();
    ccq.hw.wr32(IRDMA_CQARM, ccq.cq_id)?;
    Ok(())
}

/// `irdma_sc_poll_for_cqp_op_done(cqp, op_code, info)`, with the CCQ explicit. Polls the CCQ for up to
/// 100 x max_done_count + 1 attempts, sleeping max_sleep when it is empty. A CQE with the error bit (any op but
/// QUERY_STAG) gives -EIO with `info` filled; another op's completion and a garbage CQE are consumed and
/// skipped, as ctrl.c irdma_sc_poll_for_cqp_op_done polls on past any CQE that is not the wanted op; running
/// out of attempts gives -ETIMEDOUT.
pub fn irdma_sc_poll_for_cqp_op_done(
    cqp: &mut IrdmaScCqp,
    ccq: &mut IrdmaScCq,
    op_code: u8,
    info: &mut IrdmaCcqCqeInfo,
) -> Result<()> {
    // `if (cnt++ > 100 * max_done_count)`: one attempt more than the product.
    let limit = 100 * u64::from(cqp.hw_attrs.max_done_count);
    for _ in 0..=limit {
        let mut cqe = IrdmaCcqCqeInfo::default();
        match irdma_sc_ccq_get_cqe_info(ccq, cqp, &mut cqe) {
            Err(IrdmaError::NoCqe) => {
                sleep(cqp.hw_attrs.max_sleep);
                continue;
            }
            // The kernel takes any consumed CQE as a completion and polls on unless it is the wanted op;
            // a garbage one (decision 10: consumed, frees nothing) is skipped the same way.
            Err(IrdmaError::BadCqe(why)) => {
                tracing::debug!(expected = op_code, %why, "garbage CQE skipped");
                continue;
            }
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        if cqe.error && cqe.op_code != IRDMA_CQP_OP_QUERY_STAG {
            *info = cqe;
            return Err(IrdmaError::CqeError { op: cqe.op_code, maj: cqe.maj_err_code, min: cqe.min_err_code });
        }
        if cqe.op_code == op_code {
            *info = cqe;
            return Ok(());
        }
        tracing::debug!(expected = op_code, got = cqe.op_code, wqe_idx = cqe.wqe_idx, "CQP opcode mismatch");
    }
    Err(IrdmaError::Timeout("poll for CQP op done"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::irdma::cqp::irdma_sc_cqp_nop;
    use crate::irdma::regs::IrdmaRegisters::IRDMA_CQARM;
    use crate::irdma::testdev::*;
    use std::sync::Arc;

    struct Rig {
        dev: Arc<FakeIrdma>,
        _pool: Arc<crate::dma::DmaPool>,
        cqp: IrdmaScCqp,
        ccq: IrdmaScCq,
    }

    /// A CQP of `sq` entries and a CCQ of `cq` entries; CQEs are written by the test through the device's
    /// view of the ring.
    fn rig(sq: u32, cq: u32) -> Rig {
        let dev = FakeIrdma::scripted();
        let (pool, cqp) = plain_cqp(&dev, sq);
        let ccq = plain_ccq(&dev, &pool, cq);
        Rig { dev, _pool: pool, cqp, ccq }
    }

    impl Rig {
        fn write_cqe(&self, slot: u32, qw1: u64, qw2: u64, qw3: u64) {
            let base = self.ccq.cq_pa + u64::from(slot) * IRDMA_CQE_SIZE as u64;
            self.dev.dma_write_u64(base + 8, qw1);
            self.dev.dma_write_u64(base + 16, qw2);
            self.dev.dma_write_u64(base + 24, qw3);
        }
        fn shadow(&self, byte: u64) -> u64 {
            self.dev.dma_read_u64(self.ccq.shadow_area_pa + byte)
        }
        fn nops(&mut self, n: u32) {
            for s in 0..n {
                irdma_sc_cqp_nop(&mut self.cqp, 0x100 + u64::from(s), false).unwrap();
            }
        }
    }

    fn errno(r: Result<()>) -> i32 {
        r.err().map_or(0, |e| e.to_errno())
    }

    /// G12 first example: qw3 0x8000000500000000.
    #[test]
    fn a_valid_cqe_for_wqe_5_reports_its_scratch_and_the_opcode_of_the_posted_wqe() {
        let mut r = rig(8, 8);
        r.nops(6);
        r.write_cqe(0, r.cqp.cqp_compl_ctx, 0x1234, 0x8000_0005_0000_0000);
        let mut info = IrdmaCcqCqeInfo::default();
        irdma_sc_ccq_get_cqe_info(&mut r.ccq, &mut r.cqp, &mut info).unwrap();
        let want = IrdmaCcqCqeInfo {
            scratch: 0x105,
            op_ret_val: 0x1234,
            maj_err_code: 0,
            min_err_code: 0,
            op_code: IRDMA_CQP_OP_NOP,
            error: false,
            wqe_idx: 5,
        };
        assert_eq!(info, want);
        assert_eq!(r.shadow(0), 1, "shadow area qw0 holds the new CQ head");
        assert_eq!((r.cqp.sq_ring().tail(), r.cqp.scratch(5)), (1, None));
        assert_eq!(errno(irdma_sc_ccq_get_cqe_info(&mut r.ccq, &mut r.cqp, &mut info)), -libc::ENOENT);
    }

    /// G12 second example: qw3 0x80800005F0010001.
    #[test]
    fn an_error_cqe_makes_poll_for_op_done_return_eio_with_the_codes_copied_out() {
        let mut r = rig(8, 8);
        r.nops(6);
        r.write_cqe(0, r.cqp.cqp_compl_ctx, 0, 0x8080_0005_F001_0001);
        let mut info = IrdmaCcqCqeInfo::default();
        let res = irdma_sc_poll_for_cqp_op_done(&mut r.cqp, &mut r.ccq, IRDMA_CQP_OP_NOP, &mut info);
        assert!(matches!(res, Err(IrdmaError::CqeError { op: IRDMA_CQP_OP_NOP, maj: 0xF001, min: 0x0001 })));
        assert_eq!(errno(res), -libc::EIO);
        assert_eq!((info.error, info.maj_err_code, info.min_err_code, info.wqe_idx), (true, 0xF001, 1, 5));
    }

    /// ctrl.c irdma_sc_ccq_get_cqe_info: `if (info->error) { ... error = readl(...IRDMA_CQPERRCODES) }`.
    #[test]
    fn decoding_an_error_cqe_reads_cqperrcodes_once_and_a_good_cqe_does_not() {
        for (qw3, reads) in [(0x8080_0005_F001_0001u64, 1), (0x8000_0005_0000_0000, 0)] {
            let mut r = rig(8, 8);
            r.nops(6);
            r.write_cqe(0, r.cqp.cqp_compl_ctx, 0, qw3);
            let mut info = IrdmaCcqCqeInfo::default();
            irdma_sc_ccq_get_cqe_info(&mut r.ccq, &mut r.cqp, &mut info).unwrap();
            assert_eq!(r.dev.reads_of(IRDMA_CQPERRCODES), reads, "qw3 {qw3:#x}");
        }
    }

    #[test]
    fn a_cqe_whose_valid_bit_is_not_the_ccq_polarity_is_not_consumed() {
        let mut r = rig(8, 8);
        r.nops(1);
        r.write_cqe(0, r.cqp.cqp_compl_ctx, 0, 0x0000_0000_0000_0000);
        let mut info = IrdmaCcqCqeInfo::default();
        let res = irdma_sc_ccq_get_cqe_info(&mut r.ccq, &mut r.cqp, &mut info);
        assert!(matches!(res, Err(IrdmaError::NoCqe)));
        assert_eq!((r.ccq.cq_ring().head(), r.cqp.sq_ring().tail()), (0, 0));
    }

    #[test]
    fn garbage_cqes_are_consumed_and_rejected_without_freeing_an_sq_slot() {
        struct Case {
            name: &'static str,
            wrong_ctx: bool,
            qw3: u64,
        }
        let cases = [
            Case { name: "completion context not ours", wrong_ctx: true, qw3: 0x8000_0000_0000_0000 },
            Case { name: "WQE index beyond the SQ", wrong_ctx: false, qw3: 0x8000_7FFF_0000_0000 },
            Case { name: "WQE index with nothing outstanding", wrong_ctx: false, qw3: 0x8000_0003_0000_0000 },
        ];
        for c in cases {
            let mut r = rig(8, 8);
            r.nops(2);
            let ctx = if c.wrong_ctx { !r.cqp.cqp_compl_ctx } else { r.cqp.cqp_compl_ctx };
            r.write_cqe(0, ctx, 0, c.qw3);
            let mut info = IrdmaCcqCqeInfo::default();
            let res = irdma_sc_ccq_get_cqe_info(&mut r.ccq, &mut r.cqp, &mut info);
            assert!(matches!(res, Err(IrdmaError::BadCqe(_))), "{}", c.name);
            assert_eq!(errno(res), -libc::EIO, "{}", c.name);
            assert_eq!(r.ccq.cq_ring().head(), 1, "{}: the slot is consumed", c.name);
            assert_eq!(r.cqp.sq_ring().tail(), 0, "{}: no SQ slot is freed", c.name);
            assert_eq!(r.cqp.scratch(0), Some(0x100), "{}", c.name);
        }
    }

    #[test]
    fn a_second_completion_for_the_same_wqe_is_rejected() {
        let mut r = rig(8, 8);
        r.nops(2);
        r.write_cqe(0, r.cqp.cqp_compl_ctx, 0, 0x8000_0000_0000_0000);
        r.write_cqe(1, r.cqp.cqp_compl_ctx, 0, 0x8000_0000_0000_0000);
        let mut info = IrdmaCcqCqeInfo::default();
        irdma_sc_ccq_get_cqe_info(&mut r.ccq, &mut r.cqp, &mut info).unwrap();
        let res = irdma_sc_ccq_get_cqe_info(&mut r.ccq, &mut r.cqp, &mut info);
        assert!(matches!(res, Err(IrdmaError::BadCqe(_))));
        assert_eq!(r.cqp.sq_ring().tail(), 1);
    }

    #[test]
    fn the_ccq_polarity_flips_each_time_the_ring_wraps() {
        let mut r = rig(4, 4);
        for i in 0..9u32 {
            r.nops(1);
            let slot = i % 4;
            let valid = if (i / 4) % 2 == 0 { 1u64 << 63 } else { 0 };
            r.write_cqe(slot, r.cqp.cqp_compl_ctx, 0, valid | u64::from(i % 4) << 32);
            let mut info = IrdmaCcqCqeInfo::default();
            irdma_sc_ccq_get_cqe_info(&mut r.ccq, &mut r.cqp, &mut info).unwrap();
            assert_eq!(info.wqe_idx, i % 4, "completion {i}");
            assert_eq!(r.shadow(0), u64::from((i + 1) % 4), "completion {i}");
            let wraps = (i + 1) / 4;
            assert_eq!(r.ccq.polarity, if wraps % 2 == 0 { 1 } else { 0 }, "after completion {i}");
        }
        assert_eq!((r.ccq.polarity, r.ccq.cq_ring().head()), (1, 1));
    }

    #[test]
    fn arming_bumps_the_sequence_keeps_select_and_se_and_writes_the_cq_id_to_cqarm() {
        // (shadow qw4 before, after); the first row is G12's arm from a zeroed shadow.
        let cases = [(0x0, 0x1_4000), (0x1_4000, 0x2_4000), (0x3_8005, 0x0_C005)];
        for (before, after) in cases {
            let r = rig(4, 4);
            r.dev.dma_write_u64(r.ccq.shadow_area_pa + 32, before);
            r.dev.clear_writes();
            irdma_sc_ccq_arm(&r.ccq).unwrap();
            assert_eq!(r.shadow(32), after, "from {before:#x}");
            assert_eq!(r.dev.writes(), [(off(IRDMA_CQARM), 0)], "from {before:#x}");
        }
    }

    #[test]
    fn poll_for_op_done_skips_other_ops_and_stops_at_the_wanted_one() {
        let mut r = rig(8, 8);
        r.nops(1);
        irdma_sc_ccq_create(&mut r.ccq, &mut r.cqp, 7, true, false).unwrap();
        r.write_cqe(0, r.cqp.cqp_compl_ctx, 0, 0x8000_0000_0000_0000);
        r.write_cqe(1, r.cqp.cqp_compl_ctx, 0, 0x8000_0001_0000_0000);
        let mut info = IrdmaCcqCqeInfo::default();
        irdma_sc_poll_for_cqp_op_done(&mut r.cqp, &mut r.ccq, IRDMA_CQP_OP_CREATE_CQ, &mut info).unwrap();
        assert_eq!((info.op_code, info.scratch, info.wqe_idx), (IRDMA_CQP_OP_CREATE_CQ, 7, 1));
        assert_eq!(r.cqp.sq_ring().tail(), 2, "the skipped NOP completion still frees its slot");
    }

    /// A CCQ ring whose first CQE (WQE 0, our completion context) becomes valid at the `visible_at`-th read
    /// of its header: counts the driver's polls.
    struct LateCqe {
        ctx: u64,
        reads: std::sync::atomic::AtomicU64,
        visible_at: u64,
        pa: u64,
    }

    impl QueueMemory for LateCqe {
        fn read_u64(&self, offset: usize) -> std::result::Result<u64, crate::dma::DmaMemError> {
            Ok(match offset {
                8 => self.ctx,
                24 if self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 >= self.visible_at => {
                    IRDMA_CQ_VALID.prep(1)
                }
                _ => 0,
            })
        }
        fn write_u64(&self, _: usize, _: u64) -> std::result::Result<(), crate::dma::DmaMemError> {
            Ok(())
        }
        fn len(&self) -> usize {
            4 * IRDMA_CQE_SIZE
        }
        fn iova(&self, offset: usize) -> Option<u64> {
            Some(self.pa + offset as u64)
        }
    }

    /// Item 9 (fixed in issue 12): ctrl.c irdma_sc_poll_for_cqp_op_done `if (cnt++ > 100 * max_done_count)`
    /// allows 100 * max_done_count + 1 polls; irdma_sc_cqp_create's `if (cnt++ > max_done_count)` allows
    /// max_done_count + 1 reads of CCQPSTATUS.
    #[test]
    fn the_kernels_cnt_plus_plus_loops_allow_one_poll_more_than_their_limit() {
        let max = 3u32;
        for (visible_at, ok) in [(u64::from(100 * max + 1), true), (u64::from(100 * max + 2), false)] {
            let mut r = rig(4, 4);
            r.cqp.hw_attrs.max_done_count = max;
            r.nops(1);
            let late = LateCqe { ctx: r.cqp.cqp_compl_ctx, reads: Default::default(), visible_at, pa: 0x10_0000 };
            let info = IrdmaCcqInitInfo {
                cq_base: Box::new(late),
                shadow_area: Box::new(r._pool.alloc_contiguous(IRDMA_SHADOW_AREA_SIZE).unwrap()),
                num_elem: 4,
                shadow_read_threshold: IRDMA_CCQ_SHADOW_READ_THRESHOLD,
                ceq_id: 0,
                ceq_id_valid: true,
                ceqe_mask: false,
                vsi_idx: 0,
                cq_ctx: 0x1000,
            };
            let mut ccq = irdma_sc_ccq_init(IrdmaHw::new(r.dev.clone()), info).unwrap();
            let mut cqe = IrdmaCcqCqeInfo::default();
            let res = irdma_sc_poll_for_cqp_op_done(&mut r.cqp, &mut ccq, IRDMA_CQP_OP_NOP, &mut cqe);
            assert_eq!(res.is_ok(), ok, "CQE visible at poll {visible_at}: {res:?}");
        }
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = plain_cqp(&dev, 4);
        cqp.hw_attrs.max_done_count = max;
        assert_eq!(errno(crate::irdma::cqp::irdma_sc_cqp_create(&mut cqp, &mut 0, &mut 0)), -libc::ETIMEDOUT);
        assert_eq!(dev.reads_of(crate::irdma::regs::IrdmaRegisters::IRDMA_CCQPSTATUS), max as usize + 1);
    }

    #[test]
    fn poll_for_op_done_times_out_on_a_device_that_never_completes() {
        let mut r = rig(4, 4);
        r.cqp.hw_attrs.max_done_count = 5;
        r.nops(1);
        let mut info = IrdmaCcqCqeInfo::default();
        let res = irdma_sc_poll_for_cqp_op_done(&mut r.cqp, &mut r.ccq, IRDMA_CQP_OP_NOP, &mut info);
        assert!(matches!(res, Err(IrdmaError::Timeout(_))));
        assert_eq!(errno(res), -libc::ETIMEDOUT);
    }

    /// ctrl.c irdma_sc_poll_for_cqp_op_done leaves its loop only on an error CQE, the wanted op or the
    /// attempt limit; garbage CQEs are skipped (decision 10: they free no SQ slot).
    #[test]
    fn poll_for_op_done_polls_on_past_garbage_cqes_to_the_real_completion() {
        let mut r = rig(8, 8);
        r.nops(1);
        r.write_cqe(0, 0xDEAD, 0, 0x8000_0000_0000_0000);
        r.write_cqe(1, r.cqp.cqp_compl_ctx, 0, 0x8000_0005_0000_0000);
        r.write_cqe(2, r.cqp.cqp_compl_ctx, 0x77, 0x8000_0000_0000_0000);
        let mut info = IrdmaCcqCqeInfo::default();
        irdma_sc_poll_for_cqp_op_done(&mut r.cqp, &mut r.ccq, IRDMA_CQP_OP_NOP, &mut info).unwrap();
        assert_eq!((info.scratch, info.op_ret_val, info.wqe_idx), (0x100, 0x77, 0));
        assert_eq!((r.ccq.cq_ring().head(), r.cqp.sq_ring().tail()), (3, 1), "3 CQEs consumed, 1 slot freed");
        // Garbage alone never completes: the poll runs out of attempts.
        r.cqp.hw_attrs.max_done_count = 1;
        r.nops(1);
        r.write_cqe(3, 0xDEAD, 0, 0x8000_0001_0000_0000);
        let res = irdma_sc_poll_for_cqp_op_done(&mut r.cqp, &mut r.ccq, IRDMA_CQP_OP_NOP, &mut info);
        assert_eq!(errno(res), -libc::ETIMEDOUT);
    }

    #[test]
    fn the_create_cq_wqe_carries_size_threshold_addresses_and_header_bits() {
        let mut r = rig(4, 6);
        irdma_sc_ccq_create(&mut r.ccq, &mut r.cqp, 0, true, false).unwrap();
        let w = r.cqp.wqe(0).unwrap();
        let q: Vec<u64> = (0..8).map(|i| w.get_64bit_val(i * 8).unwrap()).collect();
        assert_eq!(q[0], 6);
        assert_eq!(q[1], 0x1000 >> 1);
        assert_eq!(q[2], 16);
        // VALID 1<<63 | CEQIDVALID 1<<49 | CHKOVERFLOW 1<<46 | OPCODE 3<<32, cq_id 0, ceq_id 0.
        assert_eq!(q[3], 0x8002_4003_0000_0000);
        assert_eq!((q[4], q[5], q[6], q[7]), (r.ccq.cq_pa, r.ccq.shadow_area_pa, 0, 0));
    }

    #[test]
    fn ccq_init_rejects_an_empty_one_entry_or_too_small_ring_and_a_ceq_id_past_1023() {
        let dev = FakeIrdma::scripted();
        let pool = Arc::new(crate::dma::DmaPool::new(dev.clone(), false));
        // (entries, ring bytes, CEQ id): user.h IRDMA_MAX_CEQID is 1023.
        for (num_elem, ring_len, ceq_id) in [(0u32, 4096usize, 0), (1, 4096, 0), (200, 4096, 0), (8, 4096, 1024)] {
            let info = IrdmaCcqInitInfo {
                cq_base: Box::new(pool.alloc_contiguous(ring_len).unwrap()),
                shadow_area: Box::new(pool.alloc_contiguous(64).unwrap()),
                num_elem,
                shadow_read_threshold: 16,
                ceq_id,
                ceq_id_valid: true,
                ceqe_mask: false,
                vsi_idx: 0,
                cq_ctx: 0,
            };
            let res = irdma_sc_ccq_init(IrdmaHw::new(dev.clone()), info).map(|_| ());
            assert_eq!(errno(res), -libc::EINVAL, "{num_elem} entries in {ring_len} bytes, CEQ {ceq_id}");
        }
    }
}
