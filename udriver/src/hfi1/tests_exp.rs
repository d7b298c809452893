//! Expected-receive setup/teardown, waiting and WQE setup against the fake BAR0 (G5, G6, G8 and the
//! acceptance list of issue 4), plus a bounded multi-thread run checking nothing leaks.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::exp_rcv::*;
use super::fake::{rig, Rig};
use super::flow::{hfi1_kern_clear_hw_flow, hfi1_kern_setup_hw_flow};
use super::pageset::TidRdmaPageset;
use super::qp::*;
use super::regs::*;
use super::sge::{RvtSge, RvtSgeState};
use super::tests::{assert_groups_consistent, frag, mk_qp, quiet_qp, req_for, setup_segment, ss_over, INVALID};
use super::tid::*;
use super::wait::*;
use super::wqe::*;
use crate::dma::PAGE_SIZE;

const PG: u32 = PAGE_SIZE as u32;

fn rcv_writes(r: &Rig) -> Vec<(u32, u64)> {
    r.fake
        .writes()
        .into_iter()
        .filter(|(a, _)| (RCV_ARRAY..RCV_ARRAY + 0x10_0000).contains(a))
        .map(|(a, v)| (((a - RCV_ARRAY) / 8) as u32, v))
        .collect()
}

#[test]
fn golden_g6_segment_programs_three_tids_a_filler_and_two_tid_entries() {
    let r = rig(2);
    let qp = quiet_qp(&r, 1, 4096);
    let buf = frag(&r, &[3, 1]);
    let p = buf.pages().to_vec();
    let mut req = req_for(&qp, 4 * PG, 4);
    let mut ss = ss_over(&buf);
    r.fake.clear_log();
    let mut g = qp.lock();
    hfi1_kern_setup_hw_flow(&r.rcd, &mut g).unwrap();
    r.fake.clear_log();
    let mut last = true;
    hfi1_kern_exp_rcv_setup(&mut req, &mut ss, &mut last, &mut g).unwrap();
    assert!(!last, "the only SGE is consumed");
    let flow = req.flow(0).unwrap();
    assert_eq!(flow.tid_entry, vec![0x0030_0003, 0x0050_0001]);
    assert_eq!((flow.tidcnt, flow.npkts, flow.length), (2, 4, 4 * PG));
    let order_addr = |order: u64, a: u64| INVALID | (order << 36) | (a >> 12);
    assert_eq!(
        rcv_writes(&r),
        vec![
            (0, order_addr(2, p[0])),
            (1, order_addr(1, p[2])),
            (2, order_addr(1, p[3])),
            (3, INVALID),
            (4, 0),
            (5, 0),
            (6, 0),
            (7, 0),
        ]
    );
    let exp = r.rcd.lock_exp();
    assert_eq!(exp.groups[0], TidGroup { base: 0, size: 8, used: 4, map: 0x0F });
    assert_eq!(exp.tid_used_list.list, [0]);
    assert_eq!((exp.tid_group_list.count, exp.tid_used_list.count), (1, 1));
    drop(exp);
    // PSNs: the flow starts at the QP's flow psn and the QP's psn moves on by npkts.
    assert_eq!((flow.flow_state.spsn, flow.flow_state.lpsn), (0, 3));
    assert_eq!(flow.flow_state.r_next_psn, full_flow_psn(g.flow_state.generation, 0));
    assert_eq!(g.flow_state.psn, 4);
    assert_eq!(req.setup_head, 1);
}

/// Programs `counts` page sets (one page each set unless given) as a flow of their own.
fn program(r: &Rig, counts: &[u8], pmtu: u32) -> TidRdmaFlow {
    let pagesets: Vec<TidRdmaPageset> = counts
        .iter()
        .enumerate()
        .map(|(i, c)| TidRdmaPageset { addr: 0x10_0000 * (i as u64 + 1), idx: i as u8, count: *c, mapped: true })
        .collect();
    let mut flow = TidRdmaFlow { npagesets: counts.len() as u8, pagesets, ..Default::default() };
    let mut exp = r.rcd.lock_exp();
    kern_alloc_tids(&mut flow, &mut exp).unwrap();
    kern_program_rcvarray(&mut flow, &mut exp, pmtu).unwrap();
    flow
}

#[test]
fn golden_g5_pairs_and_lone_entries_get_the_right_ctrl() {
    let r = rig(1);
    // Entries 0-3 taken first, then a pair of 16-page sets lands on entries 4 and 5.
    program(&r, &[1, 1, 1, 1], 4096);
    let pair = program(&r, &[16, 16], 4096);
    assert_eq!((pair.tid_entry.clone(), pair.npkts), (vec![0x00B0_0020], 32));
    let mut r8 = rig(1);
    program(&r8, &[1, 1, 1, 1], 8192);
    assert_eq!(program(&r8, &[16, 16], 8192).npkts, 16, "8 KiB pmtu: 2 pages per packet");
    // Entries 0-4 taken: a lone 4-page set on odd entry 5, then a 1-page set on even entry 6.
    r8 = rig(1);
    program(&r8, &[1, 1, 1, 1, 1], 4096);
    assert_eq!(program(&r8, &[4], 4096).tid_entry, vec![0x00A0_0004]);
    assert_eq!(program(&r8, &[1], 4096).tid_entry, vec![0x00D0_0001]);
    assert_groups_consistent(&r8.rcd);
}

#[test]
fn alloc_tids_takes_whole_groups_then_used_then_the_next_free_group() {
    // (free groups, page sets of an earlier flow, page sets asked, expected (group, cnt) picks or None).
    type Case = (u32, &'static [u8], u8, Option<&'static [(usize, u8)]>);
    let cases: &[Case] = &[
        (3, &[], 10, Some(&[(0, 8), (1, 2)])),
        (2, &[], 16, Some(&[(0, 8), (1, 8)])),
        (2, &[], 18, None),
        (1, &[], 8, Some(&[(0, 8)])),
        (1, &[1, 1], 8, None),
        (2, &[1, 1], 4, Some(&[(0, 4)])),
        (2, &[1, 1, 1, 1, 1, 1], 4, Some(&[(0, 2), (1, 2)])),
        (1, &[], 0, Some(&[(0, 0)])),
    ];
    for (i, (groups, earlier, asked, want)) in cases.iter().enumerate() {
        let r = rig(*groups);
        if !earlier.is_empty() {
            program(&r, earlier, 4096);
        }
        let mut flow = TidRdmaFlow { npagesets: *asked, ..Default::default() };
        let got = kern_alloc_tids(&mut flow, &mut r.rcd.lock_exp());
        match want {
            Some(w) => {
                assert_eq!(got, Ok(()), "case {i}");
                let picks: Vec<(usize, u8)> = flow.tnode.iter().map(|t| (t.grp, t.cnt)).collect();
                assert_eq!(&picks, w, "case {i}");
            }
            None => assert_eq!(got, Err(-libc::EAGAIN), "case {i}"),
        }
    }
}

#[test]
fn eight_k_setup_on_fragmented_memory_programs_single_pages_and_fillers() {
    let r = rig(1);
    let qp = quiet_qp(&r, 1, 8192);
    let buf = frag(&r, &[4, 1, 2, 1]);
    let p = buf.pages().to_vec();
    let mut req = req_for(&qp, 8 * PG, 4);
    let mut ss = ss_over(&buf);
    setup_segment(&qp, &mut req, &mut ss).unwrap();
    let flow = req.flow(0).unwrap();
    let sets: Vec<(u8, u8)> = flow.pagesets.iter().map(|s| (s.idx, s.count)).collect();
    assert_eq!(sets, vec![(0, 4), (4, 0), (4, 1), (5, 1), (6, 1), (7, 1)]);
    // Entry 0/1: 4 pages then a filler, which forces CTRL 1; then two real pairs. npkts = 2 + 1 + 1.
    assert_eq!(flow.tid_entry, vec![0x0010_0004, 0x0070_0002, 0x00B0_0002]);
    assert_eq!(flow.npkts, 4);
    let w = rcv_writes(&r);
    assert_eq!(w[0], (0, INVALID | (3 << 36) | (p[0] >> 12)));
    assert_eq!(w[1], (1, INVALID));
    assert_eq!(w[2], (2, INVALID | (1 << 36) | (p[4] >> 12)));
}

#[test]
fn four_k_setup_walks_several_sges_segment_by_segment() {
    let r = rig(4);
    let qp = quiet_qp(&r, 1, 4096);
    let a = Arc::new(r.pool.alloc_contiguous(3 * PAGE_SIZE as usize).unwrap());
    let b = frag(&r, &[1, 2]);
    let mut ss =
        RvtSgeState::new(vec![RvtSge::new(a.clone(), 0, 3 * PG).unwrap(), RvtSge::new(b.clone(), 0, 3 * PG).unwrap()])
            .unwrap();
    let mut req = req_for(&qp, 4 * PG, 4);
    let mut g = qp.lock();
    hfi1_kern_setup_hw_flow(&r.rcd, &mut g).unwrap();
    let mut last = false;
    hfi1_kern_exp_rcv_setup(&mut req, &mut ss, &mut last, &mut g).unwrap();
    assert!(last, "an SGE remains after the first segment");
    let f0 = req.flow(0).unwrap();
    assert_eq!(f0.pages, vec![a.pages()[0], a.pages()[1], a.pages()[2], b.pages()[0]]);
    assert_eq!(f0.pagesets.iter().map(|s| s.count).collect::<Vec<_>>(), vec![2, 1, 1, 0]);
    hfi1_kern_exp_rcv_setup(&mut req, &mut ss, &mut last, &mut g).unwrap();
    assert!(!last);
    let f1 = req.flow(1).unwrap();
    assert_eq!((f1.length, f1.pagesets.iter().map(|s| s.count).collect::<Vec<_>>()), (2 * PG, vec![2, 0]));
    assert_eq!(f1.flow_state.spsn, 4, "continues after the first segment's 4 packets");
    hfi1_kern_exp_rcv_clear_all(&mut req, &mut g).unwrap();
    assert_eq!(assert_groups_consistent(&r.rcd), (4, 0, 0));
}

#[test]
fn setup_fails_with_einval_when_the_flow_ring_is_full_or_too_many_flows_are_in_flight() {
    // (n_flows, setups that succeed before -EINVAL)
    for (n_flows, ok) in [(8u32, 7usize), (2, 2), (0, 0)] {
        let r = rig(2);
        let qp = quiet_qp(&r, 1, 4096);
        let buf = frag(&r, &[1; 16]);
        let mut ss = ss_over(&buf);
        let mut req = req_for(&qp, 2 * PG, n_flows);
        for i in 0..ok {
            assert_eq!(setup_segment(&qp, &mut req, &mut ss), Ok(()), "n_flows {n_flows} setup {i}");
        }
        assert_eq!(setup_segment(&qp, &mut req, &mut ss), Err(-libc::EINVAL), "n_flows {n_flows}");
        let mut g = qp.lock();
        hfi1_kern_exp_rcv_clear_all(&mut req, &mut g).unwrap();
        assert_eq!(hfi1_kern_exp_rcv_clear(&mut req, &mut g), Err(-libc::EINVAL), "nothing left to clear");
    }
    let r = rig(1);
    let qp = quiet_qp(&r, 1, 4096);
    let mut req = TidRdmaRequest::new(&qp);
    req.n_flows = 4;
    let buf = frag(&r, &[2]);
    assert_eq!(setup_segment(&qp, &mut req, &mut ss_over(&buf)), Err(-libc::EINVAL), "no flows allocated");
    hfi1_kern_exp_rcv_alloc_flows(&mut req).unwrap();
    req.seg_len = 2 * PG;
    let mut ss = ss_over(&buf);
    assert_eq!(setup_segment(&qp, &mut req, &mut ss), Ok(()));
    assert_eq!(setup_segment(&qp, &mut req, &mut ss), Ok(()), "SGE state exhausted: an empty flow");
}

/// tid_rdma.c:1087-1118, 1461-1538: with the SGE state used up kern_find_pages finds no page, so the flow
/// has no page set, no TID and npkts 0; lpsn = spsn + 0 - 1; the flow PSN does not move; setup_head does.
#[test]
fn an_exhausted_sge_state_sets_up_an_empty_flow_as_the_kernel_does() {
    let r = rig(1);
    let qp = quiet_qp(&r, 1, 4096);
    let buf = frag(&r, &[2]);
    let mut req = req_for(&qp, 2 * PG, 4);
    let mut ss = ss_over(&buf);
    setup_segment(&qp, &mut req, &mut ss).unwrap();
    let mut g = qp.lock();
    let mut last = true;
    hfi1_kern_exp_rcv_setup(&mut req, &mut ss, &mut last, &mut g).unwrap();
    let f = req.flow(1).unwrap();
    assert_eq!((f.npagesets, f.tidcnt, f.npkts, f.length, last), (0, 0, 0, 0, false));
    assert_eq!((f.flow_state.spsn, f.flow_state.lpsn), (2, 1), "the first segment's 2 pages took PSNs 0-1");
    assert_eq!((g.flow_state.psn, req.setup_head, g.tid_wait), (2, 2, None));
    hfi1_kern_exp_rcv_clear_all(&mut req, &mut g).unwrap();
    drop(g);
    assert_eq!(assert_groups_consistent(&r.rcd), (1, 0, 0));
}

/// tid_rdma.c:1489-1492: any kern_get_phys_blocks failure is `hfi1_wait_kmem(qp)` and -ENOMEM.
#[test]
fn a_segment_whose_pages_cannot_be_mapped_waits_for_memory_with_enomem() {
    let r = rig(1);
    let qp = quiet_qp(&r, 1, 4096);
    let mut req = req_for(&qp, 2 * PG, 4);
    // Page sets from an earlier attempt, on a page whose IOVA does not fit the 48-bit page-set address.
    if let Some(f) = req.flows.as_mut().and_then(|f| f.first_mut()) {
        f.pages = vec![1 << 48, (1 << 48) + u64::from(PG)];
        f.pagesets = vec![TidRdmaPageset { addr: 0, idx: 0, count: 2, mapped: false }, TidRdmaPageset::default()];
        f.npagesets = 2;
    }
    let buf = frag(&r, &[2]);
    assert_eq!(setup_segment(&qp, &mut req, &mut ss_over(&buf)), Err(-libc::ENOMEM));
    let g = qp.lock();
    assert_ne!(g.s_flags & RVT_S_WAIT_KMEM, 0);
    assert_eq!((g.tid_wait, req.setup_head), (None, 0));
    assert!(req.flow(0).unwrap().pagesets.iter().all(|p| !p.mapped));
}

#[test]
fn tids_run_out_with_eagain_and_the_same_call_succeeds_after_a_clear() {
    let r = rig(1);
    let woken = Arc::new(Mutex::new(Vec::new()));
    let w = woken.clone();
    let a = quiet_qp(&r, 1, 4096);
    let b = mk_qp(&r, 2, 4096, Box::new(move |qp| w.lock().unwrap().push(qp.qp_num)));
    let (abuf, bbuf) = (frag(&r, &[1; 8]), frag(&r, &[2]));
    let mut areq = req_for(&a, 8 * PG, 4);
    setup_segment(&a, &mut areq, &mut ss_over(&abuf)).unwrap();
    assert_eq!(assert_groups_consistent(&r.rcd), (0, 0, 1));
    let mut breq = req_for(&b, 2 * PG, 4);
    let mut bss = ss_over(&bbuf);
    assert_eq!(setup_segment(&b, &mut breq, &mut bss), Err(-libc::EAGAIN));
    assert_ne!(b.lock().s_flags & HFI1_S_WAIT_TID_SPACE, 0);
    assert_eq!(r.rcd.lock_exp().rarr_queue.enqueue, 1);
    hfi1_kern_exp_rcv_clear(&mut areq, &mut a.lock()).unwrap();
    assert_eq!(assert_groups_consistent(&r.rcd), (1, 0, 0));
    r.dd.wq.run_pending(100);
    assert_eq!(*woken.lock().unwrap(), vec![2], "the waiter is woken");
    assert_eq!(setup_segment(&b, &mut breq, &mut bss), Ok(()));
    assert_eq!(b.lock().s_flags & HFI1_S_WAIT_TID_SPACE, 0);
    let exp = r.rcd.lock_exp();
    assert!(exp.rarr_queue.queue_head.is_empty());
    assert_eq!((exp.rarr_queue.enqueue, exp.rarr_queue.dequeue), (1, 1));
}

type Pending = Arc<Mutex<Vec<(u32, TidRdmaRequest, RvtSgeState)>>>;

#[test]
fn waiters_are_woken_in_fifo_order_and_each_wakeup_passes_the_turn_on() {
    let r = rig(1);
    let order = Arc::new(Mutex::new(Vec::new()));
    let pending: Pending = Arc::new(Mutex::new(Vec::new()));
    // Each wakeup retries that QP's setup, as hfi1_do_send would.
    let mk = |n: u32| {
        let (o, p) = (order.clone(), pending.clone());
        mk_qp(
            &r,
            n,
            4096,
            Box::new(move |qp: &Arc<Hfi1Qp>| {
                let mut list = p.lock().unwrap();
                let Some(pos) = list.iter().position(|(q, _, _)| *q == qp.qp_num) else { return };
                let (_, mut req, mut ss) = list.remove(pos);
                drop(list);
                o.lock().unwrap().push((qp.qp_num, setup_segment(qp, &mut req, &mut ss)));
            }),
        )
    };
    let hog = quiet_qp(&r, 100, 4096);
    let hbuf = frag(&r, &[1; 8]);
    let mut hreq = req_for(&hog, 8 * PG, 4);
    setup_segment(&hog, &mut hreq, &mut ss_over(&hbuf)).unwrap();
    let qps: Vec<Arc<Hfi1Qp>> = [3, 1, 2].into_iter().map(mk).collect();
    for qp in &qps {
        let buf = frag(&r, &[2]);
        let mut req = req_for(qp, 2 * PG, 4);
        let mut ss = ss_over(&buf);
        assert_eq!(setup_segment(qp, &mut req, &mut ss), Err(-libc::EAGAIN));
        pending.lock().unwrap().push((qp.qp_num, req, ss));
    }
    let waiting: Vec<(u32, bool)> =
        qps.iter().map(|q| q.lock()).map(|g| (g.tid_enqueue, g.s_flags & HFI1_S_WAIT_TID_SPACE != 0)).collect();
    assert_eq!(waiting, vec![(1, true), (2, true), (3, true)]);
    hfi1_kern_exp_rcv_clear(&mut hreq, &mut hog.lock()).unwrap();
    r.dd.wq.run_pending(100);
    assert_eq!(*order.lock().unwrap(), vec![(3, Ok(())), (1, Ok(())), (2, Ok(()))]);
    for qp in &qps {
        assert_eq!(qp.lock().s_flags & HFI1_S_WAIT_TID_SPACE, 0);
    }
    assert!(r.rcd.lock_exp().rarr_queue.queue_head.is_empty());
}

#[test]
fn a_newcomer_queues_behind_existing_waiters() {
    let r = rig(2);
    let hog = quiet_qp(&r, 1, 4096);
    let hbuf = frag(&r, &[1; 16]);
    let mut hreq = req_for(&hog, 16 * PG, 4);
    setup_segment(&hog, &mut hreq, &mut ss_over(&hbuf)).unwrap();
    let w = quiet_qp(&r, 2, 4096);
    let wbuf = frag(&r, &[2]);
    assert_eq!(setup_segment(&w, &mut req_for(&w, 2 * PG, 4), &mut ss_over(&wbuf)), Err(-libc::EAGAIN));
    hfi1_kern_exp_rcv_clear(&mut hreq, &mut hog.lock()).unwrap();
    // Space exists now, but the woken waiter has not run yet: the newcomer must queue.
    let n = quiet_qp(&r, 3, 4096);
    let nbuf = frag(&r, &[2]);
    assert_eq!(setup_segment(&n, &mut req_for(&n, 2 * PG, 4), &mut ss_over(&nbuf)), Err(-libc::EAGAIN));
    let exp = r.rcd.lock_exp();
    let q: Vec<u32> = exp.rarr_queue.queue_head.iter().map(|q| q.qp_num).collect();
    assert_eq!(q, vec![2, 3]);
}

/// tid_rdma.c:669-696: `_tid_rdma_flush_wait(qp, &rcd->flow_queue)` runs first and unlinks the QP from
/// whatever list it is on, counting the dequeue on the flow queue.
#[test]
fn flush_wait_unlinks_a_rarr_waiter_and_counts_it_on_the_flow_queue() {
    let r = rig(1);
    let hog = quiet_qp(&r, 1, 4096);
    let hbuf = frag(&r, &[1; 8]);
    setup_segment(&hog, &mut req_for(&hog, 8 * PG, 4), &mut ss_over(&hbuf)).unwrap();
    let w = quiet_qp(&r, 2, 4096);
    let wbuf = frag(&r, &[2]);
    assert_eq!(setup_segment(&w, &mut req_for(&w, 2 * PG, 4), &mut ss_over(&wbuf)), Err(-libc::EAGAIN));
    let mut g = w.lock();
    tid_rdma_flush_wait(&mut g);
    assert_eq!((g.s_flags & HFI1_S_WAIT_TID_SPACE, g.tid_wait), (0, None));
    drop(g);
    let exp = r.rcd.lock_exp();
    assert!(exp.rarr_queue.queue_head.is_empty());
    let counts = |q: &TidQueue| (q.enqueue, q.dequeue);
    assert_eq!((counts(&exp.rarr_queue), counts(&exp.flow_queue)), ((1, 0), (0, 1)));
}

/// tid_rdma.c:537-551: dequeue_tid_waiter unlinks the QP from whichever list it is on and bumps the
/// dequeue counter of the queue passed. A QP waiting for RcvArray space that gets a new hardware flow
/// (hfi1_kern_setup_hw_flow, tid_rdma.c:807) leaves the RcvArray queue and loses its place there.
#[test]
fn a_new_hardware_flow_takes_a_rarr_waiter_off_the_rarr_queue_and_counts_on_the_flow_queue() {
    let r = rig(1);
    let hog = quiet_qp(&r, 1, 4096);
    let hbuf = frag(&r, &[1; 8]);
    setup_segment(&hog, &mut req_for(&hog, 8 * PG, 4), &mut ss_over(&hbuf)).unwrap();
    let (a, b) = (quiet_qp(&r, 2, 4096), quiet_qp(&r, 3, 4096));
    let buf = frag(&r, &[2]);
    for qp in [&a, &b] {
        assert_eq!(setup_segment(qp, &mut req_for(qp, 2 * PG, 4), &mut ss_over(&buf)), Err(-libc::EAGAIN));
    }
    let mut g = a.lock();
    hfi1_kern_clear_hw_flow(&r.rcd, &mut g).unwrap();
    hfi1_kern_setup_hw_flow(&r.rcd, &mut g).unwrap();
    assert_eq!((g.s_flags & HFI1_S_WAIT_TID_SPACE, g.tid_wait), (0, None));
    drop(g);
    let exp = r.rcd.lock_exp();
    let q: Vec<u32> = exp.rarr_queue.queue_head.iter().map(|q| q.qp_num).collect();
    assert_eq!(q, vec![3], "QP 2 left the RcvArray queue; QP 3 is its head now");
    let counts = |q: &TidQueue| (q.enqueue, q.dequeue);
    assert_eq!((counts(&exp.rarr_queue), counts(&exp.flow_queue)), ((2, 0), (0, 1)));
}

/// Decision: tid_rdma.c:1610 frees the flows unconditionally (its callers have cleared them, e.g.
/// hfi1_kern_read_tid_flow_free); udriver refuses while segments are set up, as their RcvArray entries and
/// TID groups would stay taken for ever.
#[test]
fn decision_free_flows_refuses_with_ebusy_while_segments_are_programmed() {
    let r = rig(1);
    let qp = quiet_qp(&r, 1, 4096);
    let buf = frag(&r, &[2]);
    let mut req = req_for(&qp, 2 * PG, 4);
    setup_segment(&qp, &mut req, &mut ss_over(&buf)).unwrap();
    assert_eq!(hfi1_kern_exp_rcv_free_flows(&mut req), Err(-libc::EBUSY));
    hfi1_kern_exp_rcv_clear_all(&mut req, &mut qp.lock()).unwrap();
    assert_eq!(hfi1_kern_exp_rcv_free_flows(&mut req), Ok(()));
    assert!(req.flows.is_none());
}

#[test]
fn a_failing_rcvarray_write_undoes_the_setup_and_leaks_nothing() {
    let r = rig(1);
    let qp = quiet_qp(&r, 1, 4096);
    let buf = frag(&r, &[2, 2]);
    let mut req = req_for(&qp, 4 * PG, 4);
    let mut ss = ss_over(&buf);
    let mut g = qp.lock();
    hfi1_kern_setup_hw_flow(&r.rcd, &mut g).unwrap();
    r.fake.fail_writes_from(Some(RCV_ARRAY));
    let mut last = false;
    assert_eq!(hfi1_kern_exp_rcv_setup(&mut req, &mut ss, &mut last, &mut g), Err(-libc::EIO));
    assert_eq!(assert_groups_consistent(&r.rcd), (1, 0, 0));
    assert_eq!(req.setup_head, 0);
    // The same call succeeds once the device behaves, reusing the page sets.
    r.fake.fail_writes_from(None);
    assert_eq!(hfi1_kern_exp_rcv_setup(&mut req, &mut ss, &mut last, &mut g), Ok(()));
    // Two 2-page sets on entries 0 and 1 form one pair: IDX 0, CTRL 3, LEN 4.
    assert_eq!(req.flow(0).unwrap().tid_entry, vec![0x0030_0004]);
    // A flow-table write failure gives the flow back.
    hfi1_kern_clear_hw_flow(&r.rcd, &mut g).unwrap();
    r.fake.fail_writes_from(Some(RCV_TID_FLOW_TABLE));
    assert_eq!(hfi1_kern_setup_hw_flow(&r.rcd, &mut g), Err(-libc::EIO));
    assert_eq!(r.rcd.lock_exp().flow_mask, 0);
}

/// Decision "device write errors": the kernel's kern_program_rcvarray and kern_set_hw_flow cannot fail
/// (void, tid_rdma.c:1406, 735). When udriver's fail, the resources go back and the QP leaves its queue
/// and wakes the next waiter, as a success would (tid_rdma.c:1528-1532, 807-812).
#[test]
fn decision_a_failed_device_write_takes_the_qp_off_its_queue_and_wakes_the_next_waiter() {
    for failing in [RCV_ARRAY, RCV_TID_FLOW_TABLE] {
        let r = rig(1);
        let woken = Arc::new(Mutex::new(Vec::new()));
        let hog = quiet_qp(&r, 1, 4096);
        let (a, b) = {
            let (w1, w2) = (woken.clone(), woken.clone());
            (
                mk_qp(&r, 2, 4096, Box::new(move |qp| w1.lock().unwrap().push(qp.qp_num))),
                mk_qp(&r, 3, 4096, Box::new(move |qp| w2.lock().unwrap().push(qp.qp_num))),
            )
        };
        let queue = if failing == RCV_ARRAY { QueueId::Rarr } else { QueueId::Flow };
        let hbuf = frag(&r, &[1; 8]);
        let mut hreq = req_for(&hog, 8 * PG, 4);
        if queue == QueueId::Rarr {
            setup_segment(&hog, &mut hreq, &mut ss_over(&hbuf)).unwrap();
        } else {
            // Every flow taken: QPs 2 and 3 queue on the flow queue.
            let mut exp = r.rcd.lock_exp();
            exp.flow_mask = u32::MAX;
        }
        let buf = frag(&r, &[2]);
        let (mut areq, mut breq) = (req_for(&a, 2 * PG, 4), req_for(&b, 2 * PG, 4));
        let (mut ass, mut bss) = (ss_over(&buf), ss_over(&buf));
        assert_eq!(setup_segment(&a, &mut areq, &mut ass), Err(-libc::EAGAIN));
        assert_eq!(setup_segment(&b, &mut breq, &mut bss), Err(-libc::EAGAIN));
        if queue == QueueId::Rarr {
            hfi1_kern_exp_rcv_clear(&mut hreq, &mut hog.lock()).unwrap();
        } else {
            r.rcd.lock_exp().flow_mask = 0;
        }
        r.fake.fail_writes_from(Some(failing));
        assert_eq!(setup_segment(&a, &mut areq, &mut ass), Err(-libc::EIO), "{queue:?}");
        woken.lock().unwrap().clear();
        r.dd.wq.run_pending(100);
        let g = a.lock();
        assert_eq!((g.tid_wait, g.s_flags & HFI1_S_WAIT_TID_SPACE), (None, 0), "{queue:?}");
        drop(g);
        assert_eq!(*woken.lock().unwrap(), vec![3], "{queue:?}: the next waiter is woken");
        r.fake.fail_writes_from(None);
        assert_eq!(setup_segment(&b, &mut breq, &mut bss), Ok(()), "{queue:?}");
    }
}

/// Decision: tid_rdma.c:1596-1604 stops clear_all at the first failing clear, whose only failure there is
/// "nothing to clear". udriver's clear also reports a failed RcvArray write, after releasing the flow in
/// software; clear_all goes on, so every flow is released even when the device stops answering.
#[test]
fn decision_clear_all_releases_every_flow_even_when_device_writes_fail() {
    let r = rig(2);
    let qp = quiet_qp(&r, 1, 4096);
    let buf = frag(&r, &[1; 6]);
    let mut req = req_for(&qp, 2 * PG, 4);
    let mut ss = ss_over(&buf);
    for _ in 0..3 {
        setup_segment(&qp, &mut req, &mut ss).unwrap();
    }
    r.fake.fail_writes_from(Some(RCV_ARRAY));
    assert_eq!(hfi1_kern_exp_rcv_clear_all(&mut req, &mut qp.lock()), Err(-libc::EIO));
    assert_eq!(circ_cnt(req.setup_head, req.clear_tail), 0, "all three flows released");
    assert_eq!(assert_groups_consistent(&r.rcd), (2, 0, 0));
}

/// Decision: tid_rdma.c:1087-1118 kern_find_pages walks seg_len / PAGE_SIZE pages into qpriv->pages, an
/// array of TID_RDMA_MAX_PAGES (tid_rdma.c:371); udriver stops at TID_RDMA_MAX_PAGES (64) pages whatever
/// seg_len says, so a segment is at most 256 KiB.
#[test]
fn decision_kern_find_pages_stops_at_64_pages_whatever_seg_len_says() {
    let r = rig(4);
    let qp = quiet_qp(&r, 1, 4096);
    let buf = Arc::new(r.pool.alloc_contiguous(128 * PAGE_SIZE as usize).unwrap());
    let mut req = req_for(&qp, 128 * PG, 4);
    let mut ss = ss_over(&buf);
    setup_segment(&qp, &mut req, &mut ss).unwrap();
    setup_segment(&qp, &mut req, &mut ss).unwrap();
    let (f0, f1) = (req.flow(0).unwrap(), req.flow(1).unwrap());
    assert_eq!((f0.pages.len(), f0.length, f1.pages.len()), (64, 64 * PG, 64));
    assert_eq!(f1.pages[0], buf.pages()[64]);
    hfi1_kern_exp_rcv_clear_all(&mut req, &mut qp.lock()).unwrap();
}

/// Decision: opfn.c:257-258 negotiates TID RDMA only at pmtu 4096 or 8192, so kern_program_rcv_group's
/// `pmtu_pg = pmtu >> PAGE_SHIFT` (tid_rdma.c:1308, 1351) is never 0 in the kernel. udriver's setup can be
/// called for any QP: below 4 KiB it counts one page per packet.
#[test]
fn decision_a_path_mtu_below_4_kib_counts_one_page_per_packet() {
    let r = rig(1);
    let qp = quiet_qp(&r, 1, 2048);
    let buf = frag(&r, &[1; 4]);
    let mut req = req_for(&qp, 4 * PG, 4);
    setup_segment(&qp, &mut req, &mut ss_over(&buf)).unwrap();
    assert_eq!(req.flow(0).unwrap().npkts, 4);
    hfi1_kern_exp_rcv_clear_all(&mut req, &mut qp.lock()).unwrap();
}

// ---------------------------------------------------------------- WQE setup (G8)

fn wqe(qp: &Arc<Hfi1Qp>, opcode: IbWrOpcode, length: u32, sg_list: Vec<RvtSge>) -> RvtSwqe {
    RvtSwqe {
        opcode,
        remote_addr: 0x10_0000,
        rkey: 0,
        length,
        ssn: 0,
        psn: 0,
        lpsn: 0,
        sg_list,
        ah: None,
        priv_: Some(Box::new(Hfi1SwqePriv::new(TidRdmaRequest::new(qp)))),
    }
}

#[test]
fn setup_wqe_follows_the_per_type_rules_of_golden_g8() {
    let r = rig(1);
    // (qp type, length, AH, call_send before, expected result, call_send after)
    let ah12 = Some(RvtAh { log_pmtu: 12, sl: 0 });
    type Case = (IbQpType, u32, Option<RvtAh>, bool, Result<(), i32>, bool);
    let cases: &[Case] = &[
        (IbQpType::Rc, 8192, None, true, Ok(()), false),
        (IbQpType::Rc, 200, None, false, Ok(()), true),
        (IbQpType::Rc, 4096, None, false, Ok(()), false),
        (IbQpType::Uc, 0x8000_0001, None, true, Err(-libc::EINVAL), true),
        (IbQpType::Uc, 8192, None, true, Ok(()), false),
        (IbQpType::Ud, 5000, ah12, false, Err(-libc::EINVAL), false),
        (IbQpType::Ud, 4096, ah12, false, Ok(()), false),
        (IbQpType::Gsi, 256, ah12, false, Ok(()), true),
        (IbQpType::Gsi, 256, Some(RvtAh { log_pmtu: 12, sl: 15 }), false, Err(-libc::EINVAL), false),
        (IbQpType::Gsi, 256, None, false, Err(-libc::EINVAL), false),
        (IbQpType::Smi, 2049, None, false, Err(-libc::EINVAL), false),
        (IbQpType::Smi, 2048, None, false, Ok(()), false),
        (IbQpType::Other, 1 << 20, None, false, Ok(()), false),
        (IbQpType::Other, 256, None, false, Ok(()), true),
    ];
    for (i, (ty, len, ah, before, res, after)) in cases.iter().enumerate() {
        let mut sl_to_sc = [0u8; 32];
        sl_to_sc[15] = 0xF;
        let dd = super::ctxt::Hfi1Devdata::probe(
            r.fake.clone(),
            super::ctxt::Hfi1Params { rcvarr_split: 0, sl_to_sc, ..Default::default() },
        )
        .unwrap();
        let rcd = super::ctxt::Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, 0).unwrap();
        let qp = Hfi1Qp::new(1, rcd, QpSendState::new(*ty, 4096), Box::new(|_| {}));
        let mut w = wqe(&qp, IbWrOpcode::Send, *len, vec![]);
        w.ah = *ah;
        let mut call_send = *before;
        assert_eq!(hfi1_setup_wqe(&mut qp.lock(), &mut w, &mut call_send), *res, "case {i}");
        assert_eq!(call_send, *after, "case {i}");
    }
}

fn tid_qp(r: &Rig, remote: Option<TidRdmaParams>) -> Arc<Hfi1Qp> {
    let mut st = QpSendState::new(IbQpType::Rc, 4096);
    st.s_next_psn = 100;
    st.tid_rdma_remote = remote;
    Hfi1Qp::new(1, r.rcd.clone(), st, Box::new(|_| {}))
}

#[test]
fn large_rc_read_and_write_become_tid_rdma_with_golden_g8_psns() {
    let r = rig(1);
    let remote = TidRdmaParams { max_len: 256 << 10, max_read: 6, max_write: 4, ..Default::default() };
    let buf = Arc::new(r.pool.alloc_contiguous(1 << 20).unwrap());
    let sge = || vec![RvtSge::new(buf.clone(), 0, 1 << 20).unwrap()];
    // (opcode, SGEs, remote params, expected opcode, lpsn, s_next_psn after, segments, n_flows)
    type Case = (IbWrOpcode, bool, bool, IbWrOpcode, u32, u32, u32, u32);
    let cases: &[Case] = &[
        (IbWrOpcode::RdmaRead, true, true, IbWrOpcode::TidRdmaRead, 355, 356, 4, 6),
        (IbWrOpcode::RdmaWrite, true, true, IbWrOpcode::TidRdmaWrite, 103, 104, 4, 0),
        (IbWrOpcode::RdmaRead, true, false, IbWrOpcode::RdmaRead, 355, 356, 0, 0),
        (IbWrOpcode::RdmaRead, false, true, IbWrOpcode::RdmaRead, 355, 356, 0, 0),
    ];
    for (i, (op, aligned, negotiated, want_op, lpsn, next, segs, n_flows)) in cases.iter().enumerate() {
        let qp = tid_qp(&r, negotiated.then_some(remote));
        let sg = if *aligned { sge() } else { vec![RvtSge::new(buf.clone(), 512, (1 << 20) - 512).unwrap()] };
        let mut w = wqe(&qp, *op, 1 << 20, sg);
        let mut call_send = true;
        let mut g = qp.lock();
        rvt_post_one_wr(&mut g, &mut w, &mut call_send).unwrap();
        assert_eq!((w.opcode, w.psn, w.lpsn, g.s_next_psn), (*want_op, 100, *lpsn, *next), "case {i}");
        assert!(!call_send, "case {i}: 1 MiB is above pmtu and piothreshold");
        let req = &w.priv_.as_ref().unwrap().tid_req;
        assert_eq!((req.total_segs, req.n_flows), (*segs, *n_flows), "case {i}");
        if *segs > 0 {
            assert_eq!(req.seg_len, 256 << 10);
            assert!(req.flows.is_some());
        }
    }
    // Below one segment, a READ stays an RDMA READ.
    let qp = tid_qp(&r, Some(remote));
    let mut w = wqe(&qp, IbWrOpcode::RdmaRead, 128 << 10, sge());
    rvt_post_one_wr(&mut qp.lock(), &mut w, &mut false).unwrap();
    assert_eq!((w.opcode, w.lpsn), (IbWrOpcode::RdmaRead, 131));
}

/// tid_rdma.c:3291-3295: no TID RDMA when the remote LID, without its LMC bits, is the port's LID, or when
/// the QP does not use 9B headers.
#[test]
fn setup_tid_rdma_wqe_leaves_a_loopback_lid_or_a_16b_header_qp_on_rdma() {
    let fake = super::fake::FakeHfi1::new(8, 1);
    let params = super::ctxt::Hfi1Params { rcvarr_split: 0, lid: 4, lmc: 2, ..Default::default() };
    let dd = super::ctxt::Hfi1Devdata::probe(fake.clone(), params).unwrap();
    let rcd = super::ctxt::Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, 0).unwrap();
    let pool = crate::dma::DmaPool::new(fake, false);
    let buf = Arc::new(pool.alloc_contiguous(1 << 20).unwrap());
    let remote = TidRdmaParams { max_len: 256 << 10, max_read: 6, ..Default::default() };
    // (remote LID, header type, becomes TID RDMA READ)
    let cases = [
        (4, HFI1_PKT_TYPE_9B, false),
        (7, HFI1_PKT_TYPE_9B, false),
        (8, HFI1_PKT_TYPE_9B, true),
        (3, HFI1_PKT_TYPE_9B, true),
        (8, HFI1_PKT_TYPE_16B, false),
    ];
    for (dlid, hdr_type, tid) in cases {
        let mut st = QpSendState::new(IbQpType::Rc, 4096);
        (st.remote_dlid, st.hdr_type, st.tid_rdma_remote) = (dlid, hdr_type, Some(remote));
        let qp = Hfi1Qp::new(1, rcd.clone(), st, Box::new(|_| {}));
        let mut w = wqe(&qp, IbWrOpcode::RdmaRead, 1 << 20, vec![RvtSge::new(buf.clone(), 0, 1 << 20).unwrap()]);
        rvt_post_one_wr(&mut qp.lock(), &mut w, &mut false).unwrap();
        assert_eq!(w.opcode == IbWrOpcode::TidRdmaRead, tid, "dlid {dlid} hdr_type {hdr_type}");
    }
}

/// Decision: tid_rdma.c:3331 takes `seg_len = min(remote->max_len, length)`; OPFN lets a peer claim up to
/// 2048 pages (tid_rdma.c:178), which would overrun the kernel's 64-entry page array. udriver caps the
/// segment at TID_RDMA_MAX_SEGMENT_SIZE. The last PSN is the kernel's: psn + ceil(length / pmtu) - 1.
#[test]
fn decision_a_peer_advertising_segments_above_256_kib_gets_256_kib_segments() {
    let r = rig(1);
    let buf = Arc::new(r.pool.alloc_contiguous(1 << 20).unwrap());
    let remote = TidRdmaParams { max_len: 2048 << 12, max_read: 6, ..Default::default() };
    let qp = tid_qp(&r, Some(remote));
    let mut w = wqe(&qp, IbWrOpcode::RdmaRead, 1 << 20, vec![RvtSge::new(buf.clone(), 0, 1 << 20).unwrap()]);
    rvt_post_one_wr(&mut qp.lock(), &mut w, &mut false).unwrap();
    let req = &w.priv_.as_ref().unwrap().tid_req;
    assert_eq!((w.opcode, w.lpsn, req.seg_len, req.total_segs), (IbWrOpcode::TidRdmaRead, 355, 256 << 10, 4));
}

/// Decision: rdmavt's rvt_qp_valid_operation dereferences a UD/GSI work request's AH before the driver
/// sees it (sw/rdmavt/qp.c:1886), and hfi1_setup_wqe reads it unchecked (qp.c:295). udriver's WQE can
/// lack one; hfi1_setup_wqe refuses it with -EINVAL.
#[test]
fn decision_a_ud_or_gsi_wqe_without_an_ah_is_refused_with_einval() {
    let r = rig(1);
    for ty in [IbQpType::Ud, IbQpType::Gsi] {
        let qp = Hfi1Qp::new(1, r.rcd.clone(), QpSendState::new(ty, 4096), Box::new(|_| {}));
        let mut w = wqe(&qp, IbWrOpcode::Send, 256, vec![]);
        w.ah = None;
        assert_eq!(hfi1_setup_wqe(&mut qp.lock(), &mut w, &mut false), Err(-libc::EINVAL), "{ty:?}");
    }
}

// ---------------------------------------------------------------- concurrency

struct StressReport {
    setups: u64,
    eagains: u64,
}

/// `threads` QPs share one context with `groups` TID groups and only `free_flows` hardware flows, each
/// looping flow setup -> 1..3 segments -> clear for `duration`. A worker thread runs the wakeups.
fn stress(threads: u32, groups: u32, free_flows: u32, duration: Duration) -> (Rig, StressReport) {
    let r = rig(groups);
    {
        let mut exp = r.rcd.lock_exp();
        for _ in free_flows..RXE_NUM_TID_FLOWS {
            super::flow::kern_reserve_flow(&mut exp, RXE_NUM_TID_FLOWS).unwrap();
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (setups, eagains) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let dd = r.dd.clone();
    let stop_w = stop.clone();
    let rcd = r.rcd.clone();
    // The wakeup runner also checks the group sets between wakeups while everything runs.
    let worker = std::thread::spawn(move || {
        while !stop_w.load(Ordering::Relaxed) {
            dd.wq.run_one(Duration::from_millis(5));
            assert_groups_consistent(&rcd);
        }
    });
    let deadline = Instant::now() + duration;
    let mut handles = Vec::new();
    let mut qps = Vec::new();
    for t in 0..threads {
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        let qp = mk_qp(
            &r,
            t,
            if t % 2 == 0 { 4096 } else { 8192 },
            Box::new(move |_| {
                let _ = tx.try_send(());
            }),
        );
        qps.push(qp.clone());
        let runs: Vec<u64> = (0..12).map(|i| 1 + u64::from((t + i) % 3)).collect();
        let buf = frag(&r, &runs);
        let (setups, eagains) = (setups.clone(), eagains.clone());
        handles.push(std::thread::spawn(move || {
            let mut seed = 0x9E37_79B9u32.wrapping_mul(t + 1);
            let mut rnd = move || {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                seed
            };
            let mut req = TidRdmaRequest::new(&qp);
            hfi1_kern_exp_rcv_alloc_flows(&mut req).unwrap();
            req.seg_len = 4 * PG;
            req.n_flows = 6;
            while Instant::now() < deadline {
                let want = 1 + rnd() % 3;
                let mut ss = ss_over(&buf);
                let mut got = 0;
                let mut g = qp.lock();
                let mut res = hfi1_kern_setup_hw_flow(&qp.rcd, &mut g);
                while res.is_ok() && got < want {
                    let mut last = false;
                    res = hfi1_kern_exp_rcv_setup(&mut req, &mut ss, &mut last, &mut g);
                    if res.is_ok() {
                        got += 1;
                        setups.fetch_add(1, Ordering::Relaxed);
                    }
                }
                match res {
                    Ok(()) | Err(-11) => {}
                    Err(e) => panic!("unexpected errno {e}"),
                }
                let waited = res.is_err();
                if waited {
                    eagains.fetch_add(1, Ordering::Relaxed);
                }
                hfi1_kern_exp_rcv_clear_all(&mut req, &mut g).unwrap();
                if rnd() % 2 == 0 || waited {
                    hfi1_kern_clear_hw_flow(&qp.rcd, &mut g).unwrap();
                }
                drop(g);
                if waited {
                    let _ = rx.recv_timeout(Duration::from_millis(20));
                }
            }
            let mut g = qp.lock();
            hfi1_kern_exp_rcv_clear_all(&mut req, &mut g).unwrap();
            hfi1_kern_clear_hw_flow(&qp.rcd, &mut g).unwrap();
            tid_rdma_flush_wait(&mut g);
            drop(g);
            hfi1_kern_exp_rcv_free_flows(&mut req).unwrap();
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();
    r.dd.wq.run_pending(10_000);
    for qp in &qps {
        assert_eq!(qp.lock().s_flags & HFI1_S_WAIT_TID_SPACE, 0);
    }
    let report = StressReport { setups: setups.load(Ordering::Relaxed), eagains: eagains.load(Ordering::Relaxed) };
    (r, report)
}

fn stress_duration() -> Duration {
    let secs = std::env::var("UDRIVER_HFI1_STRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    Duration::from_secs(secs)
}

#[test]
fn threads_driving_qps_on_one_context_leak_no_tid_group_or_flow() {
    let (r, rep) = stress(6, 3, 3, stress_duration());
    eprintln!("stress: {} segment setups, {} -EAGAIN waits", rep.setups, rep.eagains);
    assert!(rep.setups > 0, "work was done");
    assert!(rep.eagains > 0, "resources were contended");
    assert_eq!(assert_groups_consistent(&r.rcd), (3, 0, 0));
    let exp = r.rcd.lock_exp();
    assert!(exp.groups.iter().all(|g| g.used == 0 && g.map == 0));
    // The test held flows 0-28; 29-31 were shared.
    assert_eq!(exp.flow_mask, u32::MAX >> 3, "only the flows the test held stay reserved");
    assert!(exp.flow_queue.queue_head.is_empty() && exp.rarr_queue.queue_head.is_empty());
    // dequeue_tid_waiter counts on the queue passed, not the one left (tid_rdma.c:549): only the sums balance.
    let (fq, rq) = (&exp.flow_queue, &exp.rarr_queue);
    assert_eq!(fq.enqueue.wrapping_add(rq.enqueue), fq.dequeue.wrapping_add(rq.dequeue));
    drop(exp);
    // Every expected entry ends invalid (or was never written / only WC-filled).
    let mut last = std::collections::HashMap::new();
    for (idx, v) in rcv_writes(&r) {
        if v != 0 {
            last.insert(idx, v);
        }
    }
    assert!(last.values().all(|v| *v == INVALID), "an RcvArray entry stayed programmed");
}
