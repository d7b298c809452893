//! Send-side WQE setup (§2): rdmavt's generic post step and the `hfi1_setup_wqe` hook, including the
//! TID RDMA conversion of large RC READ/WRITE requests.

#![forbid(unsafe_code)]

use super::exp_rcv::{hfi1_kern_exp_rcv_alloc_flows, TidRdmaRequest, TidRequestState};
use super::exp_rcv::{TID_RDMA_MAX_SEGMENT_SIZE, TID_RDMA_MIN_SEGMENT_SIZE};
use super::qp::{IbQpType, QpLocked, HFI1_PKT_TYPE_9B};
use super::sge::RvtSge;
use crate::dma::PAGE_SIZE;

/// `enum ib_wr_opcode` plus hfi1's TID RDMA opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IbWrOpcode {
    RdmaWrite,
    RdmaWriteWithImm,
    Send,
    SendWithImm,
    RdmaRead,
    AtomicCmpAndSwp,
    AtomicFetchAndAdd,
    SendWithInv,
    LocalInv,
    RegMr,
    TidRdmaWrite,
    TidRdmaRead,
}

impl IbWrOpcode {
    /// RVT_OPERATION_LOCAL: consumes no PSNs.
    pub fn is_local(self) -> bool {
        matches!(self, IbWrOpcode::LocalInv | IbWrOpcode::RegMr)
    }
}

/// The parts of `struct rvt_ah` the hook reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RvtAh {
    pub log_pmtu: u32,
    pub sl: u8,
}

/// `struct hfi1_swqe_priv`.
pub struct Hfi1SwqePriv {
    pub tid_req: TidRdmaRequest,
    /// What `ss` describes once a TID RDMA READ REQ is built: its payload, the flow's tidarray words.
    pub ss: Vec<u32>,
}

impl Hfi1SwqePriv {
    pub fn new(tid_req: TidRdmaRequest) -> Self {
        Self { tid_req, ss: Vec::new() }
    }
}

/// `struct rvt_swqe`.
pub struct RvtSwqe {
    pub opcode: IbWrOpcode,
    pub remote_addr: u64,
    /// `rdma_wr.rkey`.
    pub rkey: u32,
    pub length: u32,
    pub ssn: u32,
    pub psn: u32,
    pub lpsn: u32,
    pub sg_list: Vec<RvtSge>,
    pub ah: Option<RvtAh>,
    /// hfi1 per-WQE data; RC QPs have it (`wqe->priv`).
    pub priv_: Option<Box<Hfi1SwqePriv>>,
}

/// `rvt_div_round_up_mtu(qp, len)`.
pub fn rvt_div_round_up_mtu(qp: &QpLocked<'_>, len: u32) -> u32 {
    ((u64::from(len) + u64::from(qp.pmtu) - 1) >> qp.log_pmtu) as u32
}

/// `hfi1_check_sge_align(qp, sge, num_sge)`: every SGE starts on a page and spans whole pages.
pub fn hfi1_check_sge_align(sg_list: &[RvtSge]) -> bool {
    sg_list.iter().all(RvtSge::page_aligned)
}

/// `setup_tid_rdma_wqe(qp, wqe)`: turns an eligible RC READ/WRITE into TID RDMA when OPFN enabled it, unless
/// the remote LID is the port's own or the QP does not use 9B headers. The segment is also capped at
/// TID_RDMA_MAX_SEGMENT_SIZE, whatever max_len the peer advertised (docs/udriver-hfi1.md).
pub fn setup_tid_rdma_wqe(qp: &mut QpLocked<'_>, wqe: &mut RvtSwqe) {
    let params = &qp.qp.rcd.dd.params;
    let lmc_mask = 1u32.checked_shl(u32::from(params.lmc)).map_or(0, |m| m.wrapping_sub(1));
    if qp.remote_dlid & !lmc_mask == params.lid || qp.hdr_type != HFI1_PKT_TYPE_9B {
        return;
    }
    let Some(remote) = qp.tid_rdma_remote else { return };
    let new_opcode = match wqe.opcode {
        IbWrOpcode::RdmaRead if hfi1_check_sge_align(&wqe.sg_list) => IbWrOpcode::TidRdmaRead,
        IbWrOpcode::RdmaWrite
            if wqe.remote_addr.is_multiple_of(PAGE_SIZE) && u64::from(wqe.length) % PAGE_SIZE == 0 =>
        {
            IbWrOpcode::TidRdmaWrite
        }
        _ => return,
    };
    let seg_len = remote.max_len.min(TID_RDMA_MAX_SEGMENT_SIZE).min(wqe.length);
    if seg_len == 0 {
        return;
    }
    let pmtu_segs = rvt_div_round_up_mtu(qp, wqe.length);
    let Some(p) = wqe.priv_.as_mut() else { return };
    let req = &mut p.tid_req;
    if hfi1_kern_exp_rcv_alloc_flows(req).is_err() {
        return;
    }
    wqe.opcode = new_opcode;
    req.seg_len = seg_len;
    req.total_segs = wqe.length.div_ceil(seg_len);
    wqe.lpsn = wqe.psn;
    if new_opcode == IbWrOpcode::TidRdmaRead {
        req.n_flows = u32::from(remote.max_read);
        qp.tid_r_reqs += 1;
        wqe.lpsn = wqe.lpsn.wrapping_add(pmtu_segs).wrapping_sub(1);
    } else {
        wqe.lpsn = wqe.lpsn.wrapping_add(req.total_segs).wrapping_sub(1);
        qp.n_requests += 1;
    }
    req.cur_seg = 0;
    req.comp_seg = 0;
    req.ack_seg = 0;
    req.state = TidRequestState::Inactive;
    // READ has no ACKs; reset acked_tail so a later WRITE is not confused.
    req.acked_tail = req.setup_head;
}

/// `hfi1_setup_tid_rdma_wqe(qp, wqe)`: only RC READ/WRITE of at least one segment are candidates.
pub fn hfi1_setup_tid_rdma_wqe(qp: &mut QpLocked<'_>, wqe: &mut RvtSwqe) {
    if wqe.priv_.is_some()
        && matches!(wqe.opcode, IbWrOpcode::RdmaRead | IbWrOpcode::RdmaWrite)
        && wqe.length >= TID_RDMA_MIN_SEGMENT_SIZE
    {
        setup_tid_rdma_wqe(qp, wqe);
    }
}

/// RC/UC messages are limited to 2 GiB.
const RC_UC_MAX_LENGTH: u32 = 0x8000_0000;
/// `sl_to_sc` value that marks an SL as unusable.
const SC_INVALID: u8 = 0xF;

/// `hfi1_setup_wqe(qp, wqe, call_send)`: per-QP-type checks, TID RDMA conversion, and the piothreshold
/// rule for sending inline.
pub fn hfi1_setup_wqe(qp: &mut QpLocked<'_>, wqe: &mut RvtSwqe, call_send: &mut bool) -> Result<(), i32> {
    let params = qp.qp.rcd.dd.params.clone();
    match qp.qp_type {
        IbQpType::Rc | IbQpType::Uc => {
            if qp.qp_type == IbQpType::Rc {
                hfi1_setup_tid_rdma_wqe(qp, wqe);
            }
            if wqe.length > RC_UC_MAX_LENGTH {
                return Err(-libc::EINVAL);
            }
            if wqe.length > qp.pmtu {
                *call_send = false;
            }
        }
        // SMPs always go on VL15 whatever the AH says.
        IbQpType::Smi => {
            if wqe.length > params.vl15_mtu {
                return Err(-libc::EINVAL);
            }
        }
        IbQpType::Gsi | IbQpType::Ud => {
            let ah = wqe.ah.ok_or(-libc::EINVAL)?;
            if u64::from(wqe.length) > 1u64.checked_shl(ah.log_pmtu).unwrap_or(u64::MAX) {
                return Err(-libc::EINVAL);
            }
            if params.sl_to_sc.get(usize::from(ah.sl)).is_none_or(|sc| *sc == SC_INVALID) {
                return Err(-libc::EINVAL);
            }
        }
        IbQpType::Other => {}
    }
    if wqe.length <= params.piothreshold {
        *call_send = true;
    }
    Ok(())
}

/// rdmavt's part of `rvt_post_one_wr` around the hook: SSN and PSN range, the hook, then `s_next_psn`
/// from the (possibly moved) lpsn.
pub fn rvt_post_one_wr(qp: &mut QpLocked<'_>, wqe: &mut RvtSwqe, call_send: &mut bool) -> Result<(), i32> {
    let log_pmtu = match (qp.qp_type, wqe.ah) {
        (IbQpType::Ud | IbQpType::Gsi | IbQpType::Smi, Some(ah)) => ah.log_pmtu,
        _ => qp.log_pmtu,
    };
    if !wqe.opcode.is_local() {
        wqe.ssn = qp.s_ssn;
        qp.s_ssn = qp.s_ssn.wrapping_add(1);
        wqe.psn = qp.s_next_psn;
        let extra = if wqe.length == 0 { 0 } else { (wqe.length - 1).checked_shr(log_pmtu).unwrap_or(0) };
        wqe.lpsn = wqe.psn.wrapping_add(extra);
    }
    hfi1_setup_wqe(qp, wqe, call_send)?;
    if !wqe.opcode.is_local() {
        qp.s_next_psn = wqe.lpsn.wrapping_add(1);
    }
    Ok(())
}
