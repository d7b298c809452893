//! The TID RDMA READ requester (tid_rdma.c "TID RDMA READ functions", and the READ cases of rc.c's
//! `hfi1_make_rc_req`): one READ REQ per segment, each taking the QP's hardware flow and receive buffers
//! through `hfi1_kern_exp_rcv_setup`; the SYNC point where a segment would not fit the flow's 2047 usable
//! PSNs, so the flow is cleared (a new generation) once every segment in flight has arrived; and the READ
//! RESP that completes a segment and gives its resources back.

#![forbid(unsafe_code)]

use std::sync::Arc;

use super::exp_rcv::{hfi1_kern_exp_rcv_clear, hfi1_kern_exp_rcv_setup};
use super::flow::{hfi1_kern_clear_hw_flow, hfi1_kern_setup_hw_flow};
use super::loopback::tid_flow_qp;
use super::qp::{QpLocked, HFI1_R_TID_SW_PSN, RVT_S_WAIT_RDMAR};
use super::regs::*;
use super::sge::RvtSgeState;
use super::tid_rdma::{TidRdmaReadReq, TidRequestState, MAX_FLOWS};
use super::wait::hfi1_schedule_send;
use super::wqe::{rvt_div_round_up_mtu, IbWrOpcode, RvtSwqe};

/// BTH word 2: ask the responder for an ACK (rdma/ib_hdrs.h).
pub const IB_BTH_REQ_ACK: u32 = 1 << 31;
/// BTH word 1: the destination QP (`RVT_QPN_MASK` = `IB_QPN_MASK`).
pub const RVT_QPN_MASK: u32 = 0xFF_FFFF;
/// KDETH version every TID RDMA packet carries (`KDETH_RESET(kdeth0, KVER, 0x1)`).
pub const KDETH_KVER: u32 = 1;

/// `mask_psn(a)` (verbs.h): 31-bit PSNs.
pub fn mask_psn(a: u32) -> u32 {
    a & PSN_MASK
}

/// `cmp_psn(a, b)` (verbs.h): negative, zero or positive as `a` is before, at or after `b`, modulo 2^31.
pub fn cmp_psn(a: u32, b: u32) -> i32 {
    (a as i32).wrapping_sub(b as i32).wrapping_shl(1)
}

/// `delta_psn(a, b)` (verbs.h).
pub fn delta_psn(a: u32, b: u32) -> u32 {
    ((a as i32).wrapping_sub(b as i32).wrapping_shl(1) >> 1) as u32
}

/// The QP's TID RDMA READ work request, or -EINVAL if `wqe` is none or belongs to another QP.
fn checked(qp: &QpLocked<'_>, wqe: &RvtSwqe) -> Result<(), i32> {
    let ok = wqe.opcode == IbWrOpcode::TidRdmaRead
        && wqe.priv_.as_ref().is_some_and(|p| Arc::ptr_eq(&p.tid_req.qp, qp.qp) && p.tid_req.flows.is_some());
    if ok {
        Ok(())
    } else {
        Err(-libc::EINVAL)
    }
}

/// `hfi1_build_tid_rdma_read_packet(wqe, ohdr, bth1, bth2, len)`: the READ REQ of the flow at `flow_idx`,
/// whose payload (`wpriv->ss`) is that flow's tidarray. Moves on to the next segment and flow; `len` becomes
/// the payload's length. Returns the header's size in dwords.
pub fn hfi1_build_tid_rdma_read_packet(
    wqe: &mut RvtSwqe,
    ohdr: &mut TidRdmaReadReq,
    bth1: &mut u32,
    bth2: &mut u32,
    len: &mut u32,
    qp: &mut QpLocked<'_>,
) -> Result<u32, i32> {
    checked(qp, wqe)?;
    let remote = qp.tid_rdma_remote.ok_or(-libc::EINVAL)?;
    let (remote_addr, rkey) = (wqe.remote_addr, wqe.rkey);
    let Some(wpriv) = wqe.priv_.as_mut() else { return Err(-libc::EINVAL) };
    let req = &mut wpriv.tid_req;
    let (cur_seg, seg_len, ctxt) = (req.cur_seg, req.seg_len, req.rcd.ctxt);
    let flow_idx = req.flow_idx;
    let Some(flow) = req.flows.as_mut().and_then(|f| f.get_mut(usize::from(flow_idx))) else {
        return Err(-libc::EINVAL);
    };
    // The IB PSN of the request, then the tidarray entries not yet requested as the payload.
    *bth2 = mask_psn(flow.flow_state.ib_spsn.wrapping_add(flow.pkt));
    let entries = flow.tid_entry.get(usize::from(flow.tid_idx)..usize::from(flow.tidcnt)).unwrap_or(&[]);
    wpriv.ss = entries.to_vec();
    let req_len = 4 * entries.len() as u32;
    *ohdr = TidRdmaReadReq {
        kdeth0: KDETH_KVER << KDETH_KVER_SHIFT,
        kdeth1: (u32::from(remote.jkey) & KDETH_JKEY_MASK) << KDETH_JKEY_SHIFT,
        reth: super::tid_rdma::IbReth {
            vaddr: remote_addr.wrapping_add(u64::from(cur_seg) * u64::from(seg_len)).wrapping_add(u64::from(flow.sent)),
            rkey,
            length: *len,
        },
        tid_flow_psn: (flow.flow_state.generation << HFI1_KDETH_BTH_SEQ_SHIFT)
            | (flow.flow_state.spsn.wrapping_add(flow.pkt) & HFI1_KDETH_BTH_SEQ_MASK),
        tid_flow_qp: tid_flow_qp(qp.tid_rdma_local.qp, flow.idx, ctxt),
        verbs_qp: qp.remote_qpn,
    };
    *bth1 = (*bth1 & !RVT_QPN_MASK) | remote.qp;
    *bth2 |= IB_BTH_REQ_ACK;
    // This segment is requested.
    flow.sent = flow.sent.wrapping_add(*len);
    let req = &mut wpriv.tid_req;
    req.cur_seg += 1;
    req.ack_pending += 1;
    req.flow_idx = (req.flow_idx + 1) & (MAX_FLOWS - 1);
    qp.pending_tid_r_segs += 1;
    qp.s_num_rd_atomic += 1;
    *len = req_len;
    Ok(TidRdmaReadReq::DWORDS)
}

/// `hfi1_build_tid_rdma_read_req(qp, wqe, ohdr, bth1, bth2, len)`: the READ REQ of the next segment,
/// `len` bytes on entry, the payload length on return. A new segment first passes the SYNC rule (its
/// packets must fit the flow's PSNs 0..=2046; 2047 is kept for RESYNC), then takes the hardware flow and
/// the receive buffers. At a SYNC point the flow is cleared, which advances its generation, once no
/// segment is pending; until then `Ok(0)`: nothing to send, as the kernel's 0. Where the kernel returns 0
/// because a setup failed, this returns that errno (-EAGAIN: queued for a flow or for RcvArray space,
/// the state QUEUED for the latter; -ENOMEM: waiting for memory; -EINVAL: too many segments in flight;
/// others: a device error).
pub fn hfi1_build_tid_rdma_read_req(
    qp: &mut QpLocked<'_>,
    wqe: &mut RvtSwqe,
    ohdr: &mut TidRdmaReadReq,
    bth1: &mut u32,
    bth2: &mut u32,
    len: &mut u32,
) -> Result<u32, i32> {
    checked(qp, wqe)?;
    let npkts = rvt_div_round_up_mtu(qp, *len);
    // A segment that cannot fit one generation would make the kernel's sync_check loop for ever.
    if npkts > MAX_TID_FLOW_PSN - 1 {
        return Err(-libc::EINVAL);
    }
    let pmtu = qp.pmtu;
    let RvtSwqe { psn: wqe_psn, sg_list, priv_, .. } = &mut *wqe;
    let Some(wpriv) = priv_.as_mut() else { return Err(-libc::EINVAL) };
    let req = &mut wpriv.tid_req;
    let (mut retry, mut synced) = (true, false);
    loop {
        // sync_check: the flow may be freed only once every segment requested on it has arrived.
        if req.state == TidRequestState::Sync {
            if qp.pending_tid_r_segs != 0 {
                return Ok(0);
            }
            let cleared = hfi1_kern_clear_hw_flow(&req.rcd, qp);
            qp.priv_s_flags &= !HFI1_R_TID_SW_PSN;
            req.state = TidRequestState::Active;
            cleared?;
        }
        if req.flow_idx != req.setup_head {
            // A re-sent segment: its resources are still set up.
            break;
        }
        retry = false;
        if req.state == TidRequestState::Resend {
            // The first new segment after re-sent ones: the SGE state from where it starts.
            let skip = delta_psn(req.s_next_psn, *wqe_psn).wrapping_mul(pmtu);
            req.isge = qp.s_sge.restart(sg_list, skip)?;
            req.state = TidRequestState::Active;
        }
        // The last PSN of each generation is kept for RESYNC.
        if qp.flow_state.psn + npkts > MAX_TID_FLOW_PSN - 1 {
            // Once through sync_check the flow PSN is 0; if not (no flow was held to clear), going round
            // again would never end.
            if synced {
                return Err(-libc::EINVAL);
            }
            synced = true;
            req.state = TidRequestState::Sync;
            continue;
        }
        hfi1_kern_setup_hw_flow(&req.rcd, qp)?;
        let mut ss = std::mem::take(&mut qp.s_sge);
        let mut last = false;
        let set_up = hfi1_kern_exp_rcv_setup(req, &mut ss, &mut last, qp);
        qp.s_sge = ss;
        if let Err(e) = set_up {
            req.state = TidRequestState::Queued;
            return Err(e);
        }
        break;
    }
    let flow_idx = req.flow_idx;
    let s_next_psn = req.s_next_psn;
    let Some(flow) = req.flows.as_mut().and_then(|f| f.get_mut(usize::from(flow_idx))) else {
        return Err(-libc::EINVAL);
    };
    flow.pkt = 0;
    flow.tid_idx = 0;
    flow.sent = 0;
    if !retry {
        flow.flow_state.ib_spsn = s_next_psn;
        flow.flow_state.ib_lpsn = s_next_psn.wrapping_add(flow.npkts).wrapping_sub(1);
    }
    req.s_next_psn = req.s_next_psn.wrapping_add(flow.npkts);
    hfi1_build_tid_rdma_read_packet(wqe, ohdr, bth1, bth2, len, qp)
}

/// The TID RDMA READ request cases of rc.c's `hfi1_make_rc_req` for one work request: the READ/atomic
/// limit (`RVT_S_WAIT_RDMAR`, `Ok(0)`), the SGE state and flow ring set up for a new request (unless an
/// earlier try already walked its pages), `len = min(seg_len, what is left)`, then
/// `hfi1_build_tid_rdma_read_req` and `s_psn` moved past the segment. -EINVAL once every segment has been
/// requested (rc.c has moved on to the next work request by then).
pub fn hfi1_make_tid_rdma_read_req(
    qp: &mut QpLocked<'_>,
    wqe: &mut RvtSwqe,
    ohdr: &mut TidRdmaReadReq,
    bth1: &mut u32,
    bth2: &mut u32,
    len: &mut u32,
) -> Result<u32, i32> {
    checked(qp, wqe)?;
    if qp.s_num_rd_atomic >= qp.s_max_rd_atomic {
        qp.s_flags |= RVT_S_WAIT_RDMAR;
        return Ok(0);
    }
    let RvtSwqe { length, sg_list, priv_, .. } = &mut *wqe;
    let Some(wpriv) = priv_.as_mut() else { return Err(-libc::EINVAL) };
    let req = &mut wpriv.tid_req;
    if req.cur_seg >= req.total_segs {
        return Err(-libc::EINVAL);
    }
    if req.cur_seg == 0 {
        // newreq: the first segment, perhaps tried before.
        let head = req.setup_head;
        if req.flow(head).is_some_and(|f| f.npagesets == 0) {
            qp.s_sge = RvtSgeState::new(sg_list.clone())?;
            req.isge = 0;
            req.clear_tail = head;
            req.flow_idx = head;
            req.state = TidRequestState::Active;
        }
        req.s_next_psn = qp.s_psn;
    }
    *len = req.seg_len.min(*length - req.seg_len * req.cur_seg);
    let hdwords = hfi1_build_tid_rdma_read_req(qp, wqe, ohdr, bth1, bth2, len)?;
    if hdwords > 0 {
        if let Some(p) = wqe.priv_.as_ref() {
            qp.s_psn = p.tid_req.s_next_psn;
        }
    }
    Ok(hdwords)
}

/// `hfi1_rc_rcv_tid_rdma_read_resp(packet)` for a READ RESP of `wqe` with BTH PSN `kpsn` (the flow PSN) and
/// `verbs_psn` `ipsn`. With header suppression only a segment's last packet reaches the driver; any other
/// only moves the flow's next expected PSN. The last one completes the segment: the READ/atomic count
/// and the pending segments go down, the segment's receive buffers are cleared, and the hardware flow is
/// released when the request is at its SYNC point with every requested segment back, or when every TID
/// RDMA READ of the QP is complete. -EINVAL if `ipsn` is not one of `wqe`'s PSNs (the kernel's
/// `find_tid_request` failing puts the QP in error). A device error clearing the buffers is returned
/// after the rest has been done.
pub fn hfi1_rc_rcv_tid_rdma_read_resp(
    qp: &mut QpLocked<'_>,
    wqe: &mut RvtSwqe,
    kpsn: u32,
    ipsn: u32,
) -> Result<(), i32> {
    checked(qp, wqe)?;
    let (kpsn, ipsn) = (mask_psn(kpsn), mask_psn(ipsn));
    if cmp_psn(ipsn, wqe.psn) < 0 || cmp_psn(ipsn, wqe.lpsn) > 0 {
        return Err(-libc::EINVAL);
    }
    let Some(wpriv) = wqe.priv_.as_mut() else { return Err(-libc::EINVAL) };
    let req = &mut wpriv.tid_req;
    let tail = req.clear_tail;
    let Some(flow) = req.flows.as_mut().and_then(|f| f.get_mut(usize::from(tail))) else {
        return Err(-libc::EINVAL);
    };
    if cmp_psn(ipsn, flow.flow_state.ib_lpsn) != 0 {
        if cmp_psn(kpsn, flow.flow_state.r_next_psn) == 0 {
            flow.flow_state.r_next_psn = mask_psn(kpsn.wrapping_add(1));
        }
        return Ok(());
    }
    flow.flow_state.r_next_psn = mask_psn(kpsn.wrapping_add(1));
    req.ack_pending = req.ack_pending.saturating_sub(1);
    qp.pending_tid_r_segs = qp.pending_tid_r_segs.saturating_sub(1);
    qp.s_num_rd_atomic = qp.s_num_rd_atomic.saturating_sub(1);
    if qp.s_flags & RVT_S_WAIT_RDMAR != 0 {
        qp.s_flags &= !RVT_S_WAIT_RDMAR;
        hfi1_schedule_send(qp);
    }
    // Release the segment's receive buffers.
    let cleared = hfi1_kern_exp_rcv_clear(req, qp);
    req.comp_seg += 1;
    if req.comp_seg >= req.total_segs {
        qp.tid_r_comp += 1;
        req.state = TidRequestState::Complete;
    }
    let mut flow_cleared = Ok(());
    if (req.state == TidRequestState::Sync && req.comp_seg == req.cur_seg) || qp.tid_r_comp == qp.tid_r_reqs {
        flow_cleared = hfi1_kern_clear_hw_flow(&req.rcd, qp);
        qp.priv_s_flags &= !HFI1_R_TID_SW_PSN;
        if req.state == TidRequestState::Sync {
            req.state = TidRequestState::Active;
        }
    }
    hfi1_schedule_send(qp);
    cleared.and(flow_cleared)
}
