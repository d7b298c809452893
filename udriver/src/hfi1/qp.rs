//! The QP as the TID code sees it: `s_lock` guarding the send state (flags, flow state, PSNs, OPFN
//! parameters), and the callback that stands in for `hfi1_do_send`.

#![forbid(unsafe_code)]

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use vfio_user_proto::sync::Unpoison;

pub use super::hfi::{
    DoSend, Hfi1Ctxtdata, Hfi1Qp, IbQpType, QpLocked, QpSendState, TidFlowState, TidRdmaParams, HFI1_DEFAULT_PORT_LID,
    HFI1_MAX_RDMA_ATOMIC, HFI1_PKT_TYPE_16B, HFI1_PKT_TYPE_9B, HFI1_R_TID_SW_PSN, HFI1_S_AHG_CLEAR, HFI1_S_AHG_VALID,
    HFI1_S_MIN_BIT_MASK, HFI1_S_WAIT_HALT, HFI1_S_WAIT_PIO_DRAIN, HFI1_S_WAIT_TID_RESP, HFI1_S_WAIT_TID_SPACE,
    RVT_S_WAIT_KMEM, RVT_S_WAIT_RDMAR,
};

const OPFN_N_SHIFT: u32 = 56;
const OPFN_K_SHIFT: u32 = 48;
const OPFN_M_SHIFT: u32 = 37;
const OPFN_M_MASK: u64 = 0x7FF;
const OPFN_T_SHIFT: u32 = 32;
const OPFN_T_MASK: u64 = 0x1F;
const OPFN_U_SHIFT: u32 = 25;
const OPFN_V_SHIFT: u32 = 22;
const OPFN_V_MASK: u64 = 0x7;
const OPFN_J_SHIFT: u32 = 16;
const OPFN_J_MASK: u64 = 0x3F;
const OPFN_R_SHIFT: u32 = 10;
const OPFN_RW_MASK: u64 = 0x3F;
const OPFN_W_SHIFT: u32 = 4;
const OPFN_C_MASK: u64 = 0xF;
/// N and K carry the QPN's low byte and its KDETH QP byte (bits 23:16).
const OPFN_QP_BYTE_MASK: u32 = 0xFF;
const OPFN_QP_KDETH_SHIFT: u32 = 16;
/// M counts 4 KiB pages.
const OPFN_M_PAGE_SHIFT: u32 = 12;

/// `tid_rdma_opfn_encode`: the 64-bit OPFN capability word (§1.14).
pub fn tid_rdma_opfn_encode(p: &TidRdmaParams) -> u64 {
    let max_len_pages = u64::from(p.max_len >> OPFN_M_PAGE_SHIFT).saturating_sub(1) & OPFN_M_MASK;
    (u64::from(p.qp & OPFN_QP_BYTE_MASK) << OPFN_N_SHIFT)
        | (u64::from((p.qp >> OPFN_QP_KDETH_SHIFT) & OPFN_QP_BYTE_MASK) << OPFN_K_SHIFT)
        | (max_len_pages << OPFN_M_SHIFT)
        | ((u64::from(p.timeout) & OPFN_T_MASK) << OPFN_T_SHIFT)
        | ((u64::from(p.urg) & 1) << OPFN_U_SHIFT)
        | ((u64::from(p.version) & OPFN_V_MASK) << OPFN_V_SHIFT)
        | ((u64::from(p.jkey) & OPFN_J_MASK) << OPFN_J_SHIFT)
        | ((u64::from(p.max_read) & OPFN_RW_MASK) << OPFN_R_SHIFT)
        | ((u64::from(p.max_write) & OPFN_RW_MASK) << OPFN_W_SHIFT)
        | (u64::from(p.capcode) & OPFN_C_MASK)
}

/// `tid_rdma_opfn_decode`: the peer's parameters from its capability word. Every field is masked, so any
/// value a peer sends decodes without error.
pub fn tid_rdma_opfn_decode(data: u64) -> TidRdmaParams {
    TidRdmaParams {
        qp: ((((data >> OPFN_K_SHIFT) as u32) & OPFN_QP_BYTE_MASK) << OPFN_QP_KDETH_SHIFT)
            | (((data >> OPFN_N_SHIFT) as u32) & OPFN_QP_BYTE_MASK),
        max_len: ((((data >> OPFN_M_SHIFT) & OPFN_M_MASK) + 1) << OPFN_M_PAGE_SHIFT) as u32,
        jkey: ((data >> OPFN_J_SHIFT) & OPFN_J_MASK) as u16,
        max_read: ((data >> OPFN_R_SHIFT) & OPFN_RW_MASK) as u8,
        max_write: ((data >> OPFN_W_SHIFT) & OPFN_RW_MASK) as u8,
        timeout: ((data >> OPFN_T_SHIFT) & OPFN_T_MASK) as u8,
        urg: ((data >> OPFN_U_SHIFT) & 1) as u8,
        capcode: (data & OPFN_C_MASK) as u8,
        version: ((data >> OPFN_V_SHIFT) & OPFN_V_MASK) as u8,
    }
}

/// Everything `qp->s_lock` protects that the TID and WQE code touches.
impl Hfi1Qp {
    pub fn new(qp_num: u32, rcd: Arc<Hfi1Ctxtdata>, state: QpSendState, do_send: DoSend) -> Arc<Self> {
        Arc::new(Self { qp_num, rcd, s_lock: Mutex::new(state), trigger_queued: AtomicBool::new(false), do_send })
    }

    /// Takes `s_lock`, the outer lock of §1.13.
    pub fn lock(self: &Arc<Self>) -> QpLocked<'_> {
        QpLocked { qp: self, s: self.s_lock.lock().unpoison() }
    }

    /// `hfi1_do_send(qp, true)`; must be called without `s_lock`.
    pub fn do_send(self: &Arc<Self>) {
        (self.do_send)(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opfn_word_round_trips_and_decodes_max_len_in_pages() {
        let p = TidRdmaParams {
            qp: 0x80_0003,
            max_len: 256 << 10,
            jkey: 32,
            max_read: 6,
            max_write: 4,
            timeout: 0x11,
            urg: 1,
            capcode: 1,
            version: 0,
        };
        let w = tid_rdma_opfn_encode(&p);
        // M = 64 pages - 1 = 63 at bits 47:37; N = 3 at 63:56; K = 0x80 at 55:48.
        assert_eq!((w >> 37) & 0x7FF, 63);
        assert_eq!(w >> 56, 3);
        assert_eq!((w >> 48) & 0xFF, 0x80);
        assert_eq!(tid_rdma_opfn_decode(w), p);
        // Garbage from a peer decodes to bounded values.
        let g = tid_rdma_opfn_decode(u64::MAX);
        assert_eq!((g.max_len, g.max_read, g.max_write), (2048 << 12, 63, 63));
    }
}
