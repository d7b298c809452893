//! The TID RDMA structs the receive setup works on (the kernel's tid_rdma.h): the per-request ring of flows,
//! each flow's group picks, page sets and tidarray. Only types and the ring arithmetic live here.

#![forbid(unsafe_code)]

use std::sync::Arc;

use super::hfi::{Hfi1Ctxtdata, Hfi1Qp};
use super::pageset::TidRdmaPageset;
use crate::dma::PAGE_SIZE;

pub const TID_RDMA_MIN_SEGMENT_SIZE: u32 = 256 << 10;
pub const TID_RDMA_MAX_SEGMENT_SIZE: u32 = 256 << 10;
pub const TID_RDMA_MAX_PAGES: usize = (TID_RDMA_MAX_SEGMENT_SIZE as u64 / PAGE_SIZE) as usize;
pub const TID_RDMA_MAX_READ_SEGS_PER_REQ: u32 = 6;
pub const TID_RDMA_MAX_WRITE_SEGS_PER_REQ: u32 = 4;
pub const MAX_REQ: u32 = 6;
/// Size of the per-request flow ring: roundup_pow_of_two(MAX_REQ + 1).
pub const MAX_FLOWS: u16 = 8;
/// 4 KiB path MTU selects the 4k page-set finder.
pub const OPA_MTU_4096: u32 = 4096;

/// `CIRC_CNT(head, tail, MAX_FLOWS)`.
pub fn circ_cnt(head: u16, tail: u16) -> u16 {
    head.wrapping_sub(tail) & (MAX_FLOWS - 1)
}
/// `CIRC_SPACE(head, tail, MAX_FLOWS)`.
pub fn circ_space(head: u16, tail: u16) -> u16 {
    tail.wrapping_sub(head).wrapping_sub(1) & (MAX_FLOWS - 1)
}

/// `struct kern_tid_node`: one group pick of `kern_alloc_tids`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernTidNode {
    /// Index into the context's groups.
    pub grp: usize,
    /// The group's map when picked.
    pub map: u8,
    /// Entries to program in it.
    pub cnt: u8,
}

/// `struct flow_state` of one TID flow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowState {
    pub flags: u32,
    pub resp_ib_psn: u32,
    pub generation: u32,
    pub spsn: u32,
    pub lpsn: u32,
    pub r_next_psn: u32,
    pub ib_spsn: u32,
    pub ib_lpsn: u32,
}

/// `struct tid_rdma_flow`: one segment's receive resources.
#[derive(Debug, Clone, Default)]
pub struct TidRdmaFlow {
    pub flow_state: FlowState,
    pub tid_qpn: u32,
    pub tid_offset: u32,
    pub length: u32,
    pub sent: u32,
    pub tnode_cnt: u8,
    pub tidcnt: u8,
    pub tid_idx: u8,
    /// Hardware flow index used for this segment.
    pub idx: u32,
    pub npagesets: u8,
    pub npkts: u32,
    pub pkt: u32,
    pub resync_npkts: u32,
    pub tnode: Vec<KernTidNode>,
    pub pagesets: Vec<TidRdmaPageset>,
    /// The tidarray sent to the responder.
    pub tid_entry: Vec<u32>,
    /// IOVA of each page of the segment (the kernel's `pages[]`), kept for reuse after -EAGAIN.
    pub pages: Vec<u64>,
}

/// `enum tid_rdma_req_state` (tid_rdma.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TidRequestState {
    #[default]
    Inactive,
    Init,
    InitResend,
    Active,
    Resend,
    ResendActive,
    /// `hfi1_kern_exp_rcv_setup` found no RcvArray space; the QP waits on the RcvArray queue.
    Queued,
    /// The next segment would pass the flow's PSN space: the flow is cleared and a new generation taken
    /// once the segments in flight have arrived.
    Sync,
    RnrNak,
    Complete,
}

/// `struct tid_rdma_request`.
pub struct TidRdmaRequest {
    pub qp: Arc<Hfi1Qp>,
    pub rcd: Arc<Hfi1Ctxtdata>,
    /// The ring of MAX_FLOWS flows, allocated lazily.
    pub flows: Option<Vec<TidRdmaFlow>>,
    pub setup_head: u16,
    pub clear_tail: u16,
    pub flow_idx: u16,
    pub acked_tail: u16,
    /// Segments allowed in flight (remote max_read for READ).
    pub n_flows: u32,
    pub seg_len: u32,
    pub total_len: u32,
    pub total_segs: u32,
    pub cur_seg: u32,
    pub comp_seg: u32,
    pub ack_seg: u32,
    pub alloc_seg: u32,
    /// READ REQs sent whose responses have not all arrived.
    pub ack_pending: u32,
    /// Index of the SGE `kern_find_pages` is in.
    pub isge: u8,
    pub s_next_psn: u32,
    pub state: TidRequestState,
}

impl TidRdmaRequest {
    pub fn new(qp: &Arc<Hfi1Qp>) -> Self {
        Self {
            qp: qp.clone(),
            rcd: qp.rcd.clone(),
            flows: None,
            setup_head: 0,
            clear_tail: 0,
            flow_idx: 0,
            acked_tail: 0,
            n_flows: 0,
            seg_len: 0,
            total_len: 0,
            total_segs: 0,
            cur_seg: 0,
            comp_seg: 0,
            ack_seg: 0,
            alloc_seg: 0,
            ack_pending: 0,
            isge: 0,
            s_next_psn: 0,
            state: TidRequestState::Inactive,
        }
    }

    /// The flow at ring position `i`.
    pub fn flow(&self, i: u16) -> Option<&TidRdmaFlow> {
        self.flows.as_ref()?.get(usize::from(i & (MAX_FLOWS - 1)))
    }
}

/// `struct ib_reth`, in host order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbReth {
    pub vaddr: u64,
    pub rkey: u32,
    pub length: u32,
}

/// `struct tid_rdma_read_req` (rdma/tid_rdma_defs.h), in host order: the header of a TID RDMA READ REQ after
/// its BTH. The payload is the flow's tidarray.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TidRdmaReadReq {
    pub kdeth0: u32,
    pub kdeth1: u32,
    pub reth: IbReth,
    pub tid_flow_psn: u32,
    pub tid_flow_qp: u32,
    pub verbs_qp: u32,
}

impl TidRdmaReadReq {
    /// `sizeof(struct tid_rdma_read_req) / sizeof(u32)`: 4 + 4 + 16 (packed `ib_reth`) + 3 · 4 bytes.
    pub const DWORDS: u32 = 9;
}
