//! Expected-receive setup and teardown for TID RDMA (§1.9, §1.11): the per-request ring of flows, page
//! sets, TID allocation, RcvArray programming, the tidarray and npkts, and queueing on shortage.

#![forbid(unsafe_code)]

use std::sync::Arc;

use super::pageset::{dma_map_flow, dma_unmap_flow, tid_rdma_find_phys_blocks_4k, tid_rdma_find_phys_blocks_8k};
use super::qp::QpLocked;
use super::regs::full_flow_psn;
use super::sge::RvtSgeState;
use super::tid::{kern_alloc_tids, kern_program_rcvarray, kern_unprogram_rcvarray};
use super::wait::{
    dequeue_tid_waiter, first_qp, hfi1_wait_kmem, kernel_tid_waiters, queue_qp_for_tid_wait,
    tid_rdma_schedule_tid_wakeup, trigger_tid_waiter, QueueId,
};
use crate::dma::PAGE_SIZE;

pub use super::tid_rdma::{
    circ_cnt, circ_space, FlowState, KernTidNode, TidRdmaFlow, TidRdmaRequest, TidRequestState, MAX_FLOWS, MAX_REQ,
    OPA_MTU_4096, TID_RDMA_MAX_PAGES, TID_RDMA_MAX_READ_SEGS_PER_REQ, TID_RDMA_MAX_SEGMENT_SIZE,
    TID_RDMA_MAX_WRITE_SEGS_PER_REQ, TID_RDMA_MIN_SEGMENT_SIZE,
};

/// `hfi1_kern_exp_rcv_alloc_flows(req, gfp)`: allocates the flow ring once.
pub fn hfi1_kern_exp_rcv_alloc_flows(req: &mut TidRdmaRequest) -> Result<(), i32> {
    if req.flows.is_some() {
        return Ok(());
    }
    let mut flows = Vec::new();
    flows.try_reserve_exact(usize::from(MAX_FLOWS)).map_err(|_| -libc::ENOMEM)?;
    flows.resize_with(usize::from(MAX_FLOWS), TidRdmaFlow::default);
    req.flows = Some(flows);
    Ok(())
}

/// `hfi1_kern_exp_rcv_free_flows(req)`. Refuses with -EBUSY while flows are still programmed, since
/// dropping them would leak RcvArray entries.
pub fn hfi1_kern_exp_rcv_free_flows(req: &mut TidRdmaRequest) -> Result<(), i32> {
    if req.flows.is_some() && circ_cnt(req.setup_head, req.clear_tail) != 0 {
        return Err(-libc::EBUSY);
    }
    req.flows = None;
    Ok(())
}

/// `kern_find_pages(flow, pages, ss, last)`: the pages of the next segment, one per 4 KiB step of the SGE
/// state. `last` is set while SGEs remain, as the kernel does.
fn kern_find_pages(flow: &mut TidRdmaFlow, isge: &mut u8, seg_len: u32, ss: &mut RvtSgeState, last: &mut bool) {
    let mut length = seg_len;
    flow.pages.clear();
    while length > 0 && *isge < ss.num_sge && flow.pages.len() < TID_RDMA_MAX_PAGES {
        let Some(sge) = ss.sge.as_mut() else { break };
        let Some(page) = sge.page_iova() else { break };
        flow.pages.push(page);
        sge.offset += PAGE_SIZE as usize;
        sge.sge_length = sge.sge_length.saturating_sub(PAGE_SIZE as u32);
        if sge.sge_length == 0 {
            *isge += 1;
            ss.select(*isge);
        }
        length = length.saturating_sub(PAGE_SIZE as u32);
    }
    flow.length = seg_len - length;
    *last = *isge != ss.num_sge;
}

/// `kern_get_phys_blocks(flow, pages, ss, last)`: page sets of the segment, reused after an -EAGAIN.
fn kern_get_phys_blocks(
    flow: &mut TidRdmaFlow,
    isge: &mut u8,
    seg_len: u32,
    pmtu: u32,
    ss: &mut RvtSgeState,
    last: &mut bool,
) -> Result<(), i32> {
    if flow.npagesets > 0 {
        if flow.pagesets.iter().any(|p| p.count > 0 && !p.mapped) {
            return dma_map_flow(&flow.pages, &mut flow.pagesets);
        }
        return Ok(());
    }
    // An exhausted SGE state gives no pages, no page sets and, further on, a flow of no TIDs and no
    // packets, as in the kernel.
    kern_find_pages(flow, isge, seg_len, ss, last);
    let n = if pmtu == OPA_MTU_4096 {
        tid_rdma_find_phys_blocks_4k(&flow.pages, &mut flow.pagesets)
    } else {
        tid_rdma_find_phys_blocks_8k(&flow.pages, &mut flow.pagesets)
    };
    flow.npagesets = n as u8;
    dma_map_flow(&flow.pages, &mut flow.pagesets)
}

/// `hfi1_kern_exp_rcv_setup(req, ss, last)`: sets up the receive side of the next segment of `req`
/// (§1.9). The caller holds `qp`'s `s_lock` and has reserved the hardware flow with
/// `hfi1_kern_setup_hw_flow`. -EINVAL: ring full or too many flows in flight; -ENOMEM: the page sets could
/// not be had (the QP waits for memory); -EAGAIN: no RcvArray space now, the QP is queued and woken later.
/// An exhausted `ss` sets up an empty flow (npkts 0), as the kernel does. A failed RcvArray write undoes
/// the programming, leaves the queue as a success would and returns its errno (docs/udriver-hfi1.md).
pub fn hfi1_kern_exp_rcv_setup(
    req: &mut TidRdmaRequest,
    ss: &mut RvtSgeState,
    last: &mut bool,
    qp: &mut QpLocked<'_>,
) -> Result<(), i32> {
    if !Arc::ptr_eq(&req.qp, qp.qp) {
        return Err(-libc::EINVAL);
    }
    // 1. The flow ring.
    let head = req.setup_head;
    let clear_tail = req.clear_tail;
    if circ_space(head, clear_tail) == 0 || u32::from(circ_cnt(head, clear_tail)) >= req.n_flows {
        return Err(-libc::EINVAL);
    }
    let Some(flow) = req.flows.as_mut().and_then(|f| f.get_mut(usize::from(head))) else {
        return Err(-libc::EINVAL);
    };
    // 2. Pages and page sets.
    if kern_get_phys_blocks(flow, &mut req.isge, req.seg_len, qp.pmtu, ss, last).is_err() {
        hfi1_wait_kmem(qp);
        return Err(-libc::ENOMEM);
    }
    // 3. TIDs, in FIFO order behind earlier waiters.
    let rcd = req.rcd.clone();
    let mut exp = rcd.lock_exp();
    if kernel_tid_waiters(&mut exp, QueueId::Rarr, qp) || kern_alloc_tids(flow, &mut exp).is_err() {
        queue_qp_for_tid_wait(&mut exp, QueueId::Rarr, qp);
        return Err(-libc::EAGAIN);
    }
    // 4. RcvArray, tidarray and npkts. A device error undoes the programming; the QP still leaves the
    // queue and passes the turn on, so a failing QP cannot hold up the waiters behind it.
    if let Err(e) = kern_program_rcvarray(flow, &mut exp, qp.pmtu) {
        let _ = kern_unprogram_rcvarray(flow, &mut exp);
        dequeue_tid_waiter(&mut exp, QueueId::Rarr, qp);
        let fqp = first_qp(&mut exp, QueueId::Rarr);
        drop(exp);
        tid_rdma_schedule_tid_wakeup(fqp);
        return Err(e.to_errno());
    }
    // 5. Flow PSNs from the QP's hardware flow.
    flow.flow_state = FlowState::default();
    flow.idx = qp.flow_state.index;
    flow.flow_state.generation = qp.flow_state.generation;
    flow.flow_state.spsn = qp.flow_state.psn;
    flow.flow_state.lpsn = flow.flow_state.spsn.wrapping_add(flow.npkts).wrapping_sub(1);
    flow.flow_state.r_next_psn = full_flow_psn(flow.flow_state.generation, flow.flow_state.spsn);
    qp.flow_state.psn = qp.flow_state.psn.wrapping_add(flow.npkts);
    // 6. Leave the queue and pass the turn on.
    dequeue_tid_waiter(&mut exp, QueueId::Rarr, qp);
    let fqp = first_qp(&mut exp, QueueId::Rarr);
    drop(exp);
    tid_rdma_schedule_tid_wakeup(fqp);
    // 7. Advance the ring.
    req.setup_head = (head + 1) & (MAX_FLOWS - 1);
    Ok(())
}

/// `hfi1_kern_exp_rcv_clear(req)`: releases the oldest set-up flow and wakes the head RcvArray waiter.
/// -EINVAL when nothing is set up. A device write error is returned after the release completed.
pub fn hfi1_kern_exp_rcv_clear(req: &mut TidRdmaRequest, qp: &mut QpLocked<'_>) -> Result<(), i32> {
    if !Arc::ptr_eq(&req.qp, qp.qp) || circ_cnt(req.setup_head, req.clear_tail) == 0 {
        return Err(-libc::EINVAL);
    }
    let tail = req.clear_tail;
    let Some(flow) = req.flows.as_mut().and_then(|f| f.get_mut(usize::from(tail))) else {
        return Err(-libc::EINVAL);
    };
    let mut exp = req.rcd.lock_exp();
    let written = kern_unprogram_rcvarray(flow, &mut exp);
    let fqp = first_qp(&mut exp, QueueId::Rarr);
    drop(exp);
    dma_unmap_flow(&mut flow.pagesets);
    flow.pagesets.clear();
    flow.npagesets = 0;
    req.clear_tail = (tail + 1) & (MAX_FLOWS - 1);
    match fqp {
        Some(f) if Arc::ptr_eq(&f, qp.qp) => trigger_tid_waiter(qp),
        other => tid_rdma_schedule_tid_wakeup(other),
    }
    written.map_err(|e| e.to_errno())
}

/// `hfi1_kern_exp_rcv_clear_all(req)`: clears every set-up flow. Device write errors do not stop it; the
/// first one is returned.
pub fn hfi1_kern_exp_rcv_clear_all(req: &mut TidRdmaRequest, qp: &mut QpLocked<'_>) -> Result<(), i32> {
    let mut first = Ok(());
    while circ_cnt(req.setup_head, req.clear_tail) != 0 {
        match hfi1_kern_exp_rcv_clear(req, qp) {
            Ok(()) => {}
            Err(e) if e == -libc::EINVAL => return Err(e),
            Err(e) => {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
    }
    first
}
