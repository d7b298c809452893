//! The TID RDMA READ requester against the fake BAR0: READ REQ fields, the SYNC rule and its new
//! generation, rate limiting, queueing and completion. Expected values are read off tid_rdma.c
//! (hfi1_build_tid_rdma_read_req / _read_packet, hfi1_rc_rcv_tid_rdma_read_resp) and rc.c
//! (hfi1_make_rc_req), cited per test.

#![forbid(unsafe_code)]

use std::sync::Arc;

use super::exp_rcv::*;
use super::fake::{rig, Rig};
use super::flow::kern_flow_generation_next;
use super::qp::*;
use super::regs::*;
use super::sge::RvtSge;
use super::tests::assert_groups_consistent;
use super::tid_rdma::TidRdmaReadReq;
use super::tid_read::*;
use super::wait::QueueId;
use super::wqe::*;
use crate::dma::{DmaBuffer, PAGE_SIZE};

const SEG: u32 = 256 << 10;
const REMOTE: TidRdmaParams = TidRdmaParams {
    qp: 0x00AB_0007,
    max_len: SEG,
    jkey: 0x1234,
    max_read: 6,
    max_write: 4,
    timeout: 0,
    urg: 0,
    capcode: 0,
    version: 0,
};
const LOCAL_QP: u32 = 0x80 << 16;
const REMOTE_QPN: u32 = 0x42;
const FIRST_PSN: u32 = 100;

fn reader(r: &Rig, num: u32, pmtu: u32) -> Arc<Hfi1Qp> {
    let mut st = QpSendState::new(IbQpType::Rc, pmtu);
    (st.s_next_psn, st.s_psn) = (FIRST_PSN, FIRST_PSN);
    st.tid_rdma_remote = Some(REMOTE);
    st.tid_rdma_local.qp = LOCAL_QP;
    st.remote_qpn = REMOTE_QPN;
    Hfi1Qp::new(num, r.rcd.clone(), st, Box::new(|_| {}))
}

/// An RDMA READ of all of `buf`, posted: rvt_post_one_wr makes it a TID RDMA READ.
fn posted(qp: &Arc<Hfi1Qp>, buf: &Arc<DmaBuffer>) -> RvtSwqe {
    let len = buf.len() as u32;
    let mut w = RvtSwqe {
        opcode: IbWrOpcode::RdmaRead,
        remote_addr: 0x7000_0000,
        rkey: 0xBEEF,
        length: len,
        ssn: 0,
        psn: 0,
        lpsn: 0,
        sg_list: vec![RvtSge::new(buf.clone(), 0, len).unwrap()],
        ah: None,
        priv_: Some(Box::new(Hfi1SwqePriv::new(TidRdmaRequest::new(qp)))),
    };
    rvt_post_one_wr(&mut qp.lock(), &mut w, &mut false).unwrap();
    assert_eq!(w.opcode, IbWrOpcode::TidRdmaRead);
    w
}

/// What one `hfi1_make_tid_rdma_read_req` call put on the wire.
#[derive(Debug)]
struct Sent {
    hdwords: u32,
    ohdr: TidRdmaReadReq,
    bth1: u32,
    bth2: u32,
    len: u32,
}

fn make(qp: &Arc<Hfi1Qp>, w: &mut RvtSwqe) -> Result<Sent, i32> {
    let (mut ohdr, mut bth1, mut bth2, mut len) = (TidRdmaReadReq::default(), 0xFF00_0000, 0, 0);
    let hdwords = hfi1_make_tid_rdma_read_req(&mut qp.lock(), w, &mut ohdr, &mut bth1, &mut bth2, &mut len)?;
    Ok(Sent { hdwords, ohdr, bth1, bth2, len })
}

fn req(w: &RvtSwqe) -> &TidRdmaRequest {
    &w.priv_.as_ref().unwrap().tid_req
}

/// The last READ RESP packet of the oldest requested segment, as the responder numbers it
/// (hfi1_build_tid_rdma_read_resp: bth2 = generation | spsn + pkt, verbs_psn = ib_spsn + pkt).
fn complete_oldest(qp: &Arc<Hfi1Qp>, w: &mut RvtSwqe) -> Result<(), i32> {
    let f = req(w).flow(req(w).clear_tail).unwrap();
    let kpsn = full_flow_psn(f.flow_state.generation, f.flow_state.lpsn);
    let ipsn = f.flow_state.ib_lpsn;
    hfi1_rc_rcv_tid_rdma_read_resp(&mut qp.lock(), w, kpsn, ipsn)
}

fn flow_table_writes(r: &Rig) -> Vec<(u64, u64)> {
    r.fake.writes().into_iter().filter(|(a, _)| (RCV_TID_FLOW_TABLE..RCV_TID_FLOW_TABLE + 0x100).contains(a)).collect()
}

/// tid_rdma.c:1703-1772 and 1787-1882, rc.c:757-829: the first READ REQ of a request.
#[test]
fn a_read_req_carries_the_flow_psn_tidarray_and_destination_as_the_kernel_builds_them() {
    let r = rig(4);
    let qp = reader(&r, 1, 4096);
    let buf = Arc::new(r.pool.alloc_contiguous(4 * SEG as usize).unwrap());
    let mut w = posted(&qp, &buf);
    let s = make(&qp, &mut w).unwrap();
    let (idx, gen) = {
        let g = qp.lock();
        (g.flow_state.index, g.flow_state.generation)
    };
    let f = req(&w).flow(0).unwrap().clone();
    assert_eq!(s.hdwords, 9, "sizeof(struct tid_rdma_read_req) / 4");
    // bth2 = mask_psn(ib_spsn + pkt) | IB_BTH_REQ_ACK, ib_spsn = req->s_next_psn = qp->s_psn.
    assert_eq!(s.bth2, FIRST_PSN | 1 << 31);
    // bth1: the QPN bits replaced by the remote TID QP.
    assert_eq!(s.bth1, 0xFF00_0000 | REMOTE.qp);
    assert_eq!(s.ohdr.kdeth0, 1 << 30, "KVER 1");
    assert_eq!(s.ohdr.kdeth1, 0x34, "JKEY masked with KDETH_JKEY_MASK 0xff");
    assert_eq!((s.ohdr.reth.vaddr, s.ohdr.reth.rkey, s.ohdr.reth.length), (0x7000_0000, 0xBEEF, SEG));
    assert_eq!(s.ohdr.tid_flow_psn, gen << 11);
    assert_eq!(s.ohdr.tid_flow_qp, LOCAL_QP | idx << 11 | r.rcd.ctxt);
    assert_eq!(s.ohdr.verbs_qp, REMOTE_QPN);
    // The payload is the tidarray: *len = 4 * (tidcnt - tid_idx).
    assert_eq!(s.len, 4 * u32::from(f.tidcnt));
    assert_eq!(w.priv_.as_ref().unwrap().ss, f.tid_entry);
    // 64 packets of 4 KiB: IB PSNs 100..=163, flow PSNs 0..=63.
    assert_eq!((f.flow_state.ib_spsn, f.flow_state.ib_lpsn, f.flow_state.spsn, f.npkts), (100, 163, 0, 64));
    assert_eq!((f.sent, f.pkt, f.tid_idx), (SEG, 0, 0));
    let rq = req(&w);
    assert_eq!((rq.cur_seg, rq.flow_idx, rq.setup_head, rq.ack_pending, rq.s_next_psn), (1, 1, 1, 1, 164));
    assert_eq!(rq.state, TidRequestState::Active);
    let g = qp.lock();
    assert_eq!((g.s_psn, g.flow_state.psn, g.pending_tid_r_segs, g.s_num_rd_atomic), (164, 64, 1, 1));
    drop(g);
    // The second segment goes on where the first stopped, in both PSN spaces and in the remote buffer.
    let s2 = make(&qp, &mut w).unwrap();
    assert_eq!((s2.bth2, s2.ohdr.tid_flow_psn, s2.ohdr.reth.vaddr), (164 | 1 << 31, gen << 11 | 64, 0x7004_0000));
    hfi1_kern_exp_rcv_clear_all(req_mut(&mut w), &mut qp.lock()).unwrap();
}

fn req_mut(w: &mut RvtSwqe) -> &mut TidRdmaRequest {
    &mut w.priv_.as_mut().unwrap().tid_req
}

/// Segments of `pmtu`-sized packets until one past the first SYNC point.
fn segments_to_cross(pmtu: u32) -> u32 {
    let npkts = SEG / pmtu;
    // tid_rdma.c:1839: a segment goes on the flow while psn + npkts <= MAX_TID_FLOW_PSN - 1.
    (MAX_TID_FLOW_PSN - 1) / npkts + 1
}

/// tid_rdma.c:1807-1841 and 2540-2557. 4 KiB pmtu: 64 packets a segment, so segments 0-30 use flow PSNs
/// 0..=1983 and segment 31 (1984 + 64 > 2047) is a SYNC point. With segment 30 still pending the build
/// sends nothing; its last response then clears the flow (SYNC and comp_seg == cur_seg), which advances
/// the generation, and segment 31 takes the flow again at PSN 0 of the next generation. IB PSNs run on.
#[test]
fn a_segment_past_psn_2046_waits_for_the_pending_one_then_takes_the_next_generation() {
    for pmtu in [4096, 8192] {
        let n = segments_to_cross(pmtu);
        let npkts = SEG / pmtu;
        assert_eq!(n, if pmtu == 4096 { 32 } else { 64 });
        let r = rig(2);
        let qp = reader(&r, 1, pmtu);
        let buf = Arc::new(r.pool.alloc_contiguous((n * SEG) as usize).unwrap());
        let mut w = posted(&qp, &buf);
        let first = make(&qp, &mut w).unwrap();
        let old_gen = first.ohdr.tid_flow_psn >> 11;
        let idx = qp.lock().flow_state.index;
        for k in 1..n - 1 {
            // One segment in flight: request k, then complete k - 1.
            let s = make(&qp, &mut w).unwrap();
            assert_eq!(s.ohdr.tid_flow_psn, old_gen << 11 | (k * npkts), "pmtu {pmtu} segment {k}");
            complete_oldest(&qp, &mut w).unwrap();
        }
        r.fake.clear_log();
        // Segment n - 1 would pass PSN 2046 while segment n - 2 is pending.
        assert_eq!(make(&qp, &mut w).unwrap().hdwords, 0);
        assert_eq!(req(&w).state, TidRequestState::Sync);
        assert_eq!(req(&w).cur_seg, n - 1, "nothing requested");
        assert!(flow_table_writes(&r).is_empty(), "the flow stays until the segment in flight is back");
        complete_oldest(&qp, &mut w).unwrap();
        let new_gen = kern_flow_generation_next(old_gen);
        let entry = RCV_TID_FLOW_TABLE + 8 * u64::from(idx);
        assert_eq!(flow_table_writes(&r), vec![(entry, tid_flow_table_value(KERN_GENERATION_RESERVED))]);
        assert_eq!(req(&w).state, TidRequestState::Active);
        assert_eq!(qp.lock().flow_state.index, RXE_NUM_TID_FLOWS, "the flow was released");
        let s = make(&qp, &mut w).unwrap();
        // kern_reserve_flow gives the QP its last flow back, armed with the next generation.
        assert_eq!(s.ohdr.tid_flow_psn, new_gen << 11, "pmtu {pmtu}");
        assert_eq!((s.ohdr.tid_flow_qp >> 11) & 0x1F, idx);
        assert_eq!(flow_table_writes(&r).last(), Some(&(entry, tid_flow_table_value(new_gen))));
        assert_eq!(s.bth2, (FIRST_PSN + (n - 1) * npkts) | 1 << 31, "IB PSNs do not restart");
        complete_oldest(&qp, &mut w).unwrap();
        // The request is complete (tid_r_comp == tid_r_reqs): its flow is released too.
        let g = qp.lock();
        assert_eq!((g.tid_r_comp, g.tid_r_reqs, g.flow_state.index, g.pending_tid_r_segs), (1, 1, 32, 0));
        drop(g);
        assert_eq!(req(&w).state, TidRequestState::Complete);
        assert_eq!(assert_groups_consistent(&r.rcd), (2, 0, 0));
    }
}

/// tid_rdma.c:1807-1813: at a SYNC point with nothing pending the build itself clears the flow and
/// goes on with the next generation.
#[test]
fn with_nothing_pending_the_sync_point_clears_the_flow_in_the_build_itself() {
    let r = rig(2);
    let qp = reader(&r, 1, 4096);
    let buf = Arc::new(r.pool.alloc_contiguous((32 * SEG) as usize).unwrap());
    let mut w = posted(&qp, &buf);
    let old_gen = make(&qp, &mut w).unwrap().ohdr.tid_flow_psn >> 11;
    complete_oldest(&qp, &mut w).unwrap();
    for _ in 1..31 {
        make(&qp, &mut w).unwrap();
        complete_oldest(&qp, &mut w).unwrap();
    }
    assert_eq!(qp.lock().flow_state.psn, 31 * 64);
    let s = make(&qp, &mut w).unwrap();
    assert_eq!((s.hdwords, s.ohdr.tid_flow_psn), (9, kern_flow_generation_next(old_gen) << 11));
    assert_eq!(req(&w).state, TidRequestState::Active);
    complete_oldest(&qp, &mut w).unwrap();
}

/// rc.c:777-780 and tid_rdma.c:2522-2525: no READ REQ while s_num_rd_atomic is at its limit; a response
/// takes the wait off and schedules the send engine.
#[test]
fn the_read_atomic_limit_holds_requests_until_a_response_arrives() {
    let r = rig(4);
    let qp = reader(&r, 1, 4096);
    qp.lock().s_max_rd_atomic = 1;
    let buf = Arc::new(r.pool.alloc_contiguous(2 * SEG as usize).unwrap());
    let mut w = posted(&qp, &buf);
    make(&qp, &mut w).unwrap();
    assert_eq!(make(&qp, &mut w).unwrap().hdwords, 0);
    assert_ne!(qp.lock().s_flags & RVT_S_WAIT_RDMAR, 0);
    let queued = r.dd.wq.len();
    complete_oldest(&qp, &mut w).unwrap();
    assert_eq!(qp.lock().s_flags & RVT_S_WAIT_RDMAR, 0);
    assert!(r.dd.wq.len() > queued, "hfi1_schedule_send");
    assert_eq!(make(&qp, &mut w).unwrap().hdwords, 9);
    complete_oldest(&qp, &mut w).unwrap();
    r.dd.wq.run_pending(usize::MAX);
}

/// tid_rdma.c:1848-1857: no RcvArray space: the QP is queued, the state is TID_REQUEST_QUEUED and nothing
/// is sent; once space frees the same call builds the READ REQ. Nothing in the build resets QUEUED, so
/// it stays until the next SYNC point or request.
#[test]
fn without_rcvarray_space_the_request_is_queued_and_goes_out_after_a_clear() {
    let r = rig(1);
    let (a, b) = (reader(&r, 1, 4096), reader(&r, 2, 4096));
    // A 1-page-run buffer needs one entry per page: 8 pages take the context's only group.
    let frag = |runs: &[u64]| Arc::new(r.pool.alloc_fragmented(runs).unwrap());
    let (buf_a, buf_b) = (frag(&[1; 64]), frag(&[1; 64]));
    let (mut wa, mut wb) = (posted(&a, &buf_a), posted(&b, &buf_b));
    req_mut(&mut wa).seg_len = 8 * PAGE_SIZE as u32;
    req_mut(&mut wb).seg_len = 8 * PAGE_SIZE as u32;
    make(&a, &mut wa).unwrap();
    assert_eq!(make(&b, &mut wb).unwrap_err(), -libc::EAGAIN);
    assert_eq!(req(&wb).state, TidRequestState::Queued);
    assert_eq!((b.lock().tid_wait, req(&wb).cur_seg), (Some(QueueId::Rarr), 0));
    complete_oldest(&a, &mut wa).unwrap();
    let s = make(&b, &mut wb).unwrap();
    assert_eq!((s.hdwords, s.bth2), (9, FIRST_PSN | 1 << 31));
    assert_eq!(req(&wb).state, TidRequestState::Queued);
    complete_oldest(&b, &mut wb).unwrap();
    hfi1_kern_exp_rcv_clear_all(req_mut(&mut wa), &mut a.lock()).unwrap();
    r.dd.wq.run_pending(usize::MAX);
}

/// tid_rdma.c:1822-1833, rc.h restart_sge: the first new segment after re-sent ones rewinds the SGE state
/// to (s_next_psn - wqe->psn) · pmtu bytes into the WQE.
#[test]
fn after_a_resend_the_next_new_segment_walks_pages_from_its_own_start() {
    let r = rig(4);
    let qp = reader(&r, 1, 4096);
    let buf = Arc::new(r.pool.alloc_contiguous(3 * SEG as usize).unwrap());
    let mut w = posted(&qp, &buf);
    make(&qp, &mut w).unwrap();
    complete_oldest(&qp, &mut w).unwrap();
    // As if segment 0 had been re-sent: the SGE state is elsewhere; the next new segment starts at PSN
    // 100 + 64.
    qp.lock().s_sge.restart(&w.sg_list, 0).unwrap();
    let rq = req_mut(&mut w);
    (rq.state, rq.s_next_psn) = (TidRequestState::Resend, FIRST_PSN + 64);
    let (mut ohdr, mut b1, mut b2, mut len) = (TidRdmaReadReq::default(), 0, 0, SEG);
    let hd = hfi1_build_tid_rdma_read_req(&mut qp.lock(), &mut w, &mut ohdr, &mut b1, &mut b2, &mut len).unwrap();
    assert_eq!(hd, 9);
    let f = req(&w).flow(1).unwrap();
    assert_eq!(f.pages[0], buf.pages()[64], "256 KiB = 64 PSNs · 4096 into the WQE");
    assert_eq!(req(&w).state, TidRequestState::Active);
    hfi1_kern_exp_rcv_clear_all(req_mut(&mut w), &mut qp.lock()).unwrap();
}

/// tid_rdma.c:2470-2481: a response outside the request is refused (the kernel's ack_op_err); one that is
/// not the segment's last moves the flow's next PSN on only when it is the expected one.
#[test]
fn responses_outside_the_request_are_refused_and_middle_ones_only_move_the_next_psn() {
    let r = rig(4);
    let qp = reader(&r, 1, 4096);
    let buf = Arc::new(r.pool.alloc_contiguous(SEG as usize).unwrap());
    let mut w = posted(&qp, &buf);
    make(&qp, &mut w).unwrap();
    let gen = req(&w).flow(0).unwrap().flow_state.generation;
    let mut g = qp.lock();
    assert_eq!(hfi1_rc_rcv_tid_rdma_read_resp(&mut g, &mut w, 0, FIRST_PSN - 1), Err(-libc::EINVAL));
    assert_eq!(hfi1_rc_rcv_tid_rdma_read_resp(&mut g, &mut w, 0, FIRST_PSN + 64), Err(-libc::EINVAL));
    hfi1_rc_rcv_tid_rdma_read_resp(&mut g, &mut w, full_flow_psn(gen, 5), FIRST_PSN + 5).unwrap();
    assert_eq!(req(&w).flow(0).unwrap().flow_state.r_next_psn, full_flow_psn(gen, 0), "not the expected one");
    hfi1_rc_rcv_tid_rdma_read_resp(&mut g, &mut w, full_flow_psn(gen, 0), FIRST_PSN).unwrap();
    assert_eq!(req(&w).flow(0).unwrap().flow_state.r_next_psn, full_flow_psn(gen, 1));
    assert_eq!((g.pending_tid_r_segs, req(&w).comp_seg), (1, 0), "no segment completed");
    drop(g);
    complete_oldest(&qp, &mut w).unwrap();
    assert_eq!(req(&w).comp_seg, 1);
}

/// Decision: tid_rdma.c:1807-1841 would loop for ever on a segment of more than 2047 packets (after the
/// clear its psn is 0 and it still does not fit), or on a flow PSN that the clear does not reset; udriver
/// refuses both with -EINVAL.
#[test]
fn decision_a_segment_of_more_packets_than_a_generation_holds_is_refused() {
    let r = rig(4);
    let qp = reader(&r, 1, 4096);
    let buf = Arc::new(r.pool.alloc_contiguous(SEG as usize).unwrap());
    let mut w = posted(&qp, &buf);
    let (mut ohdr, mut b1, mut b2, mut len) = (TidRdmaReadReq::default(), 0, 0, MAX_TID_FLOW_PSN * 4096);
    let got = hfi1_build_tid_rdma_read_req(&mut qp.lock(), &mut w, &mut ohdr, &mut b1, &mut b2, &mut len);
    assert_eq!(got, Err(-libc::EINVAL));
    assert_eq!((req(&w).cur_seg, qp.lock().flow_state.index), (0, RXE_NUM_TID_FLOWS), "nothing taken");
    // A flow PSN past the SYNC point with no flow to clear (so it stays) would loop the same way.
    qp.lock().flow_state.psn = 2000;
    len = SEG;
    let got = hfi1_build_tid_rdma_read_req(&mut qp.lock(), &mut w, &mut ohdr, &mut b1, &mut b2, &mut len);
    assert_eq!(got, Err(-libc::EINVAL));
}

/// cmp_psn / delta_psn (verbs.h, PSN_SHIFT 1) compare modulo 2^31.
#[test]
fn psn_comparison_wraps_at_31_bits() {
    assert!(cmp_psn(0, 0x7FFF_FFFF) > 0);
    assert!(cmp_psn(5, 6) < 0);
    assert_eq!(cmp_psn(7, 7), 0);
    assert_eq!(delta_psn(2, 0x7FFF_FFFF), 3);
    assert_eq!(mask_psn(0xFFFF_FFFF), 0x7FFF_FFFF);
}
