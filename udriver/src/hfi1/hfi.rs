//! The shared structs of the hfi1 driver (the kernel's hfi.h, with the QP and queue structs of qp.h,
//! tid_rdma.h and exp_rcv.h they point at): device data, receive contexts, their `exp_lock` state, QPs and
//! the TID wait queues. Only types live here; the code that works on them is in the mechanism modules, so
//! none of those import each other through these types.

#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam_channel::{Receiver, Sender};

use super::regs::*;
use super::sge::RvtSgeState;
use crate::access::DeviceAccess;
use crate::dma::DmaBuffer;

pub const RXE_NUM_CONTEXTS: u32 = 160;
pub const MAX_EAGER_ENTRIES: u32 = 2048;
pub const MAX_TID_PAIR_ENTRIES: u32 = 1024;
/// The RcvArray entry count the base fields of RCV_EGR_CTRL/RCV_TID_CTRL can address (13 bits of 8 entries).
pub const MAX_RCV_ARRAY_CNT: u32 = ((RCV_TID_CTRL_TID_BASE_INDEX_MASK as u32) + 1) << RCV_SHIFT;
pub const HFI1_CTRL_CTXT: u32 = 0;

/// `hfi1_rcvctrl` op bits (hfi.h).
pub const HFI1_RCVCTRL_TAILUPD_ENB: u32 = 0x1;
pub const HFI1_RCVCTRL_TAILUPD_DIS: u32 = 0x2;
pub const HFI1_RCVCTRL_CTXT_ENB: u32 = 0x4;
pub const HFI1_RCVCTRL_CTXT_DIS: u32 = 0x8;
pub const HFI1_RCVCTRL_INTRAVAIL_ENB: u32 = 0x10;
pub const HFI1_RCVCTRL_INTRAVAIL_DIS: u32 = 0x20;
pub const HFI1_RCVCTRL_PKEY_ENB: u32 = 0x40;
pub const HFI1_RCVCTRL_PKEY_DIS: u32 = 0x80;
pub const HFI1_RCVCTRL_TIDFLOW_ENB: u32 = 0x400;
pub const HFI1_RCVCTRL_TIDFLOW_DIS: u32 = 0x800;
pub const HFI1_RCVCTRL_ONE_PKT_EGR_ENB: u32 = 0x1000;
pub const HFI1_RCVCTRL_ONE_PKT_EGR_DIS: u32 = 0x2000;
pub const HFI1_RCVCTRL_NO_RHQ_DROP_ENB: u32 = 0x4000;
pub const HFI1_RCVCTRL_NO_RHQ_DROP_DIS: u32 = 0x8000;
pub const HFI1_RCVCTRL_NO_EGR_DROP_ENB: u32 = 0x10000;
pub const HFI1_RCVCTRL_NO_EGR_DROP_DIS: u32 = 0x20000;
pub const HFI1_RCVCTRL_URGENT_ENB: u32 = 0x40000;
pub const HFI1_RCVCTRL_URGENT_DIS: u32 = 0x80000;

/// Driver parameters the kernel takes from module parameters or port state.
#[derive(Debug, Clone)]
pub struct Hfi1Params {
    /// Receive contexts the driver uses (all kernel contexts); at most what the chip reports.
    pub num_rcv_contexts: u32,
    /// Percent of a context's RcvArray entries used for eager buffers (`rcvarr_split`, default 25).
    pub rcvarr_split: u32,
    /// Eager buffer size programmed into EGR_BUF_SIZE.
    pub eager_buffer_size: u32,
    /// RCV_AVAIL_TIME_OUT reload value (`rcv_intr_timeout_csr`).
    pub rcv_intr_timeout_csr: u64,
    /// RCV_HDR_HEAD counter written after enable (`rcv_intr_count`, default 16).
    pub rcv_intr_count: u64,
    /// DMA address written to RCV_HDR_TAIL_ADDR of a disabled context (`rcvhdrtail_dummy_dma`).
    pub rcvhdrtail_dummy_dma: u64,
    /// `piothreshold` module parameter (default 256).
    pub piothreshold: u32,
    /// `dd->vld[15].mtu`.
    pub vl15_mtu: u32,
    /// `ibp->sl_to_sc`.
    pub sl_to_sc: [u8; 32],
    /// The port's LID and LMC (`ppd->lid`, `ppd->lmc`): a QP whose remote LID is the port's own never uses
    /// TID RDMA. The emulated port has no subnet manager, so the driver is told them.
    pub lid: u32,
    pub lmc: u8,
}

impl Default for Hfi1Params {
    fn default() -> Self {
        Self {
            num_rcv_contexts: 1,
            rcvarr_split: 25,
            eager_buffer_size: 0x1_0000,
            rcv_intr_timeout_csr: 0,
            rcv_intr_count: 16,
            rcvhdrtail_dummy_dma: 0,
            piothreshold: 256,
            vl15_mtu: 2048,
            sl_to_sc: std::array::from_fn(|sl| sl as u8 & 0x7),
            lid: HFI1_DEFAULT_PORT_LID,
            lmc: 0,
        }
    }
}

/// `dd->rcv_entries`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcvEntries {
    pub group_size: u32,
    /// Groups per context.
    pub ngroups: u32,
    /// Groups left over, one each for the first contexts.
    pub nctxt_extra: u32,
}

/// `struct hfi1_devdata`, the parts this driver needs.
pub struct Hfi1Devdata {
    pub(super) dev: Arc<dyn DeviceAccess>,
    pub chip_rcv_array_count: u32,
    pub chip_rcv_contexts: u32,
    pub num_rcv_contexts: u32,
    pub rcv_entries: RcvEntries,
    pub params: Hfi1Params,
    /// Whether `rcv_array_wc_fill` stores its zeros (the kernel's `dd->rcvarray_wc` being set). False when
    /// the backend maps BAR0 as shared memory: there a 0 would replace an entry of another flow that the
    /// device has not taken yet (docs/hfi1-device.md, "Limit of the rule").
    pub rcvarray_wc: bool,
    /// The port workqueue that runs TID wakeups (`ppd->hfi1_wq`).
    pub wq: TidWorkQueue,
    /// `n_tidwait`: QPs ever queued for TID resources.
    pub n_tidwait: AtomicU64,
}

/// State `hfi1_rcvctrl` keeps in the rcd (the header queue and its counters).
#[derive(Default)]
pub struct RcvHdrState {
    pub rcvhdrq: Option<Arc<DmaBuffer>>,
    pub rcvhdrtail: Option<Arc<DmaBuffer>>,
    pub seq_cnt: u32,
    pub head: u32,
    pub rcvavail_timeout: u64,
}

/// `rcd->flows[i]`: the software generation of one hardware flow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TidFlowGeneration {
    pub generation: u32,
}

/// Everything `rcd->exp_lock` protects (§1.13).
pub struct ExpState {
    pub flow_mask: u32,
    pub flows: [TidFlowGeneration; RXE_NUM_TID_FLOWS as usize],
    /// Every `tid_group` of the context; the three sets hold indices into it.
    pub groups: Vec<TidGroup>,
    pub tid_group_list: ExpTidSet,
    pub tid_used_list: ExpTidSet,
    pub tid_full_list: ExpTidSet,
    pub flow_queue: TidQueue,
    pub rarr_queue: TidQueue,
}

/// `exp_lock` held: the proof a "must hold exp_lock" function takes, together with its context.
pub struct ExpLocked<'a> {
    pub rcd: &'a Hfi1Ctxtdata,
    pub(super) st: MutexGuard<'a, ExpState>,
}

impl Deref for ExpLocked<'_> {
    type Target = ExpState;
    fn deref(&self) -> &ExpState {
        &self.st
    }
}
impl DerefMut for ExpLocked<'_> {
    fn deref_mut(&mut self) -> &mut ExpState {
        &mut self.st
    }
}

/// `struct hfi1_ctxtdata` (rcd).
pub struct Hfi1Ctxtdata {
    pub dd: Arc<Hfi1Devdata>,
    pub ctxt: u32,
    pub rcv_array_groups: u32,
    pub eager_base: u32,
    /// `egrbufs.alloced`: eager entries owned by this context.
    pub egrbufs_alloced: u32,
    pub egrbufs_rcvtid_size: u32,
    pub expected_base: u32,
    pub expected_count: u32,
    pub(super) hdr: Mutex<RcvHdrState>,
    pub(super) exp_lock: Mutex<ExpState>,
}

/// `struct tid_group`: 8 consecutive RcvArray entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TidGroup {
    pub base: u32,
    pub size: u8,
    pub used: u8,
    pub map: u8,
}

impl TidGroup {
    pub fn new(base: u32, size: u8) -> Self {
        Self { base, size, used: 0, map: 0 }
    }
}

/// `struct exp_tid_set`: an ordered list of group indices plus the kernel's separate count.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ExpTidSet {
    pub list: VecDeque<usize>,
    pub count: u32,
}

impl ExpTidSet {
    pub fn push_back(&mut self, grp: usize) {
        self.list.push_back(grp);
        self.count += 1;
    }
    pub(super) fn remove(&mut self, grp: usize) -> bool {
        match self.list.iter().position(|g| *g == grp) {
            Some(pos) => {
                self.list.remove(pos);
                self.count = self.count.saturating_sub(1);
                true
            }
            None => false,
        }
    }
}

/// Which of a context's two queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueId {
    /// `rcd->flow_queue`: waiting for a hardware flow.
    Flow,
    /// `rcd->rarr_queue`: waiting for RcvArray space.
    Rarr,
}

/// `struct tid_queue`. Holding an `Arc` is the reference the kernel takes with `rvt_get_qp`.
#[derive(Default)]
pub struct TidQueue {
    pub queue_head: VecDeque<Arc<Hfi1Qp>>,
    pub enqueue: u32,
    pub dequeue: u32,
}

/// Work items of the port workqueue.
pub enum TidWork {
    /// `trigger_work` -> `tid_rdma_trigger_resume`.
    TriggerResume(Arc<Hfi1Qp>),
    /// `hfi1_schedule_send`.
    Send(Arc<Hfi1Qp>),
    /// The memory-wait timer (`mem_timer`) firing for one QP.
    Kmem(Arc<Hfi1Qp>),
}

/// The port workqueue (`ppd->hfi1_wq`): FIFO, run by whoever owns the driver's event loop.
pub struct TidWorkQueue {
    pub(super) tx: Sender<TidWork>,
    pub(super) rx: Receiver<TidWork>,
}

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

/// The port LID `Hfi1Params` defaults to (a QP's remote LID defaults to 0, another node).
pub const HFI1_DEFAULT_PORT_LID: u32 = 1;
/// `priv->hdr_type` values (hfi.h).
pub const HFI1_PKT_TYPE_9B: u8 = 0;
pub const HFI1_PKT_TYPE_16B: u8 = 1;
/// `qpriv->s_flags`: the flow fell back to software PSN checking (tid_rdma.h).
pub const HFI1_R_TID_SW_PSN: u32 = 1 << 19;
/// rdmavt s_flags: waiting for READ/atomic responses before sending more.
pub const RVT_S_WAIT_RDMAR: u32 = 0x0000_0040;
/// `HFI1_MAX_RDMA_ATOMIC` (verbs.h): the default `s_max_rd_atomic`.
pub const HFI1_MAX_RDMA_ATOMIC: u32 = 16;

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

#[derive(Debug, Clone)]
pub struct QpSendState {
    pub s_flags: u32,
    /// `qpriv->s_flags` (HFI1_R_TID_SW_PSN).
    pub priv_s_flags: u32,
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
    /// TID RDMA READ requests completed (`qpriv->tid_r_comp`).
    pub tid_r_comp: u32,
    pub n_requests: u32,
    /// The SGE state of the request being sent (`qp->s_sge`).
    pub s_sge: RvtSgeState,
    /// PSN of the next packet to send (`qp->s_psn`).
    pub s_psn: u32,
    /// READ/atomic requests outstanding, and their limit.
    pub s_num_rd_atomic: u32,
    pub s_max_rd_atomic: u32,
    /// TID RDMA READ segments requested whose last response packet has not arrived.
    pub pending_tid_r_segs: u32,
    /// `qp->remote_qpn` and the remote LID (`rdma_ah_get_dlid(&qp->remote_ah_attr)`).
    pub remote_qpn: u32,
    pub remote_dlid: u32,
    /// `priv->hdr_type`: HFI1_PKT_TYPE_9B or _16B.
    pub hdr_type: u8,
}

impl QpSendState {
    pub fn new(qp_type: IbQpType, pmtu: u32) -> Self {
        Self {
            s_flags: 0,
            priv_s_flags: 0,
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
            tid_r_comp: 0,
            n_requests: 0,
            s_sge: RvtSgeState::default(),
            s_psn: 0,
            s_num_rd_atomic: 0,
            s_max_rd_atomic: HFI1_MAX_RDMA_ATOMIC,
            pending_tid_r_segs: 0,
            remote_qpn: 0,
            remote_dlid: 0,
            hdr_type: HFI1_PKT_TYPE_9B,
        }
    }
}

/// What runs when a QP is woken (`hfi1_do_send`); called with no lock held.
pub type DoSend = Box<dyn Fn(&Arc<Hfi1Qp>) + Send + Sync>;

/// A QP on one receive context.
pub struct Hfi1Qp {
    pub qp_num: u32,
    pub rcd: Arc<Hfi1Ctxtdata>,
    pub(super) s_lock: Mutex<QpSendState>,
    /// `trigger_work` is queued and has not started yet.
    pub(crate) trigger_queued: AtomicBool,
    pub(super) do_send: DoSend,
}

/// `s_lock` held on `qp`: the proof a "caller holds s_lock" function takes.
pub struct QpLocked<'a> {
    pub qp: &'a Arc<Hfi1Qp>,
    pub(super) s: MutexGuard<'a, QpSendState>,
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
