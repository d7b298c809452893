//! The QP as the TID code sees it: `s_lock` guarding the send state (flags, flow state, PSNs, OPFN
//! parameters), and the callback that stands in for `hfi1_do_send`.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use super::ctxt::Hfi1Ctxtdata;
use super::regs::{KERN_GENERATION_RESERVED, RXE_NUM_TID_FLOWS};
use super::wait::QueueId;
use vfio_user_proto::sync::Unpoison;

// rdmavt s_flags used here.
pub const RVT_S_WAIT_KMEM: u32 = 0x0000_2000;
// hfi1 s_flags (qp.h).
pub const HFI1_S_AHG_VALID: u32 = 0x8000_0000;
pub const HFI1_S_AHG_CLEAR: u32 = 0x4000_0000;
pub const HFI1_S_WAIT_PIO_DRAIN: u32 = 0x2000_0000;
pub const HFI1_S_WAIT_TID_SPACE: u32 = 0x1000_0000;
pub const HFI1_S_WAIT_TID_RESP: u32 = 0x0800_0000;
pub const HFI1_S_WAIT_HALT: u32 = 0x0400_0000;
pub const HFI1_S_MIN_BIT_MASK: u32 = 0x0100_0000;

/// `enum ib_qp_type`, the ones `hfi1_setup_wqe` distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IbQpType {
    Smi,
    Gsi,
    Rc,
    Uc,
    Ud,
    /// Any other type (e.g. XRC): no checks.
    Other,
}

/// `struct tid_flow_state`: the hardware flow a QP holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TidFlowState {
    pub generation: u32,
    pub psn: u32,
    /// RXE_NUM_TID_FLOWS = no flow held.
    pub index: u32,
    pub last_index: u32,
}

impl Default for TidFlowState {
    fn default() -> Self {
        Self { generation: KERN_GENERATION_RESERVED, psn: 0, index: RXE_NUM_TID_FLOWS, last_index: RXE_NUM_TID_FLOWS }
    }
}

/// `struct tid_rdma_params` as negotiated through OPFN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TidRdmaParams {
    pub qp: u32,
    pub max_len: u32,
    pub jkey: u16,
    pub max_read: u8,
    pub max_write: u8,
    pub timeout: u8,
    pub urg: u8,
    pub capcode: u8,
    pub version: u8,
}

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

/// `tid_rdma_opfn_encode`: the 64-bit OPFN capability word (§1.14).
pub fn tid_rdma_opfn_encode(p: &TidRdmaParams) -> u64 {
    let max_len_pages = u64::from(p.max_len >> 12).saturating_sub(1) & OPFN_M_MASK;
    (u64::from(p.qp & 0xFF) << OPFN_N_SHIFT)
        | (u64::from((p.qp >> 16) & 0xFF) << OPFN_K_SHIFT)
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
        qp: (((data >> OPFN_K_SHIFT) & 0xFF) << 16) as u32 | ((data >> OPFN_N_SHIFT) & 0xFF) as u32,
        max_len: ((((data >> OPFN_M_SHIFT) & OPFN_M_MASK) + 1) << 12) as u32,
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
#[derive(Debug, Clone)]
pub struct QpSendState {
    pub s_flags: u32,
    pub qp_type: IbQpType,
    pub pmtu: u32,
    pub log_pmtu: u32,
    pub flow_state: TidFlowState,
    /// The tid queue this QP waits on (`priv->tid_wait` non-empty), if any.
    pub tid_wait: Option<QueueId>,
    pub tid_enqueue: u32,
    pub tid_rdma_local: TidRdmaParams,
    /// Set once OPFN has negotiated TID RDMA; None disables it.
    pub tid_rdma_remote: Option<TidRdmaParams>,
    pub s_ssn: u32,
    pub s_next_psn: u32,
    pub tid_r_reqs: u32,
    pub n_requests: u32,
}

impl QpSendState {
    pub fn new(qp_type: IbQpType, pmtu: u32) -> Self {
        Self {
            s_flags: 0,
            qp_type,
            pmtu,
            log_pmtu: pmtu.max(1).ilog2(),
            flow_state: TidFlowState::default(),
            tid_wait: None,
            tid_enqueue: 0,
            tid_rdma_local: TidRdmaParams::default(),
            tid_rdma_remote: None,
            s_ssn: 1,
            s_next_psn: 0,
            tid_r_reqs: 0,
            n_requests: 0,
        }
    }
}

/// What runs when a QP is woken (`hfi1_do_send`); called with no lock held.
pub type DoSend = Box<dyn Fn(&Arc<Hfi1Qp>) + Send + Sync>;

/// A QP on one receive context.
pub struct Hfi1Qp {
    pub qp_num: u32,
    pub rcd: Arc<Hfi1Ctxtdata>,
    s_lock: Mutex<QpSendState>,
    /// `trigger_work` is queued and has not started yet.
    pub(crate) trigger_queued: AtomicBool,
    do_send: DoSend,
}

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

/// `s_lock` held on `qp`: the proof a "caller holds s_lock" function takes.
pub struct QpLocked<'a> {
    pub qp: &'a Arc<Hfi1Qp>,
    s: MutexGuard<'a, QpSendState>,
}

impl Deref for QpLocked<'_> {
    type Target = QpSendState;
    fn deref(&self) -> &QpSendState {
        &self.s
    }
}
impl DerefMut for QpLocked<'_> {
    fn deref_mut(&mut self) -> &mut QpSendState {
        &mut self.s
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
