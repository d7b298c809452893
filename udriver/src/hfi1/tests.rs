//! hfi1 driver behaviour against the fake BAR0 of `fake.rs`. Expected register values and TID entries come
//! from hardware-facts §4 (G1-G8) or are derived by hand from the rules it cites.

#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex};

use super::ctxt::*;
use super::exp_rcv::*;
use super::fake::{rig, FakeHfi1, Op, Rig};
use super::flow::*;
use super::qp::*;
use super::regs::*;
use super::sge::{RvtSge, RvtSgeState};
use super::tid::*;
use super::Hfi1Error;
use crate::dma::DmaBuffer;

pub(super) const INVALID: u64 = RCV_ARRAY_RT_WRITE_ENABLE_SMASK;

pub(super) fn mk_qp(r: &Rig, num: u32, pmtu: u32, do_send: DoSend) -> Arc<Hfi1Qp> {
    Hfi1Qp::new(num, r.rcd.clone(), QpSendState::new(IbQpType::Rc, pmtu), do_send)
}
pub(super) fn quiet_qp(r: &Rig, num: u32, pmtu: u32) -> Arc<Hfi1Qp> {
    mk_qp(r, num, pmtu, Box::new(|_| {}))
}
pub(super) fn req_for(qp: &Arc<Hfi1Qp>, seg_len: u32, n_flows: u32) -> TidRdmaRequest {
    let mut req = TidRdmaRequest::new(qp);
    hfi1_kern_exp_rcv_alloc_flows(&mut req).unwrap();
    req.seg_len = seg_len;
    req.n_flows = n_flows;
    req
}
pub(super) fn ss_over(buf: &Arc<DmaBuffer>) -> RvtSgeState {
    RvtSgeState::new(vec![RvtSge::new(buf.clone(), 0, buf.len() as u32).unwrap()]).unwrap()
}
pub(super) fn frag(r: &Rig, runs: &[u64]) -> Arc<DmaBuffer> {
    Arc::new(r.pool.alloc_fragmented(runs).unwrap())
}
/// Hardware flow then one segment: the receive part of `hfi1_build_tid_rdma_read_req`, without its SYNC
/// rule or READ REQ (those are tested in `tests_read.rs`).
pub(super) fn setup_segment(qp: &Arc<Hfi1Qp>, req: &mut TidRdmaRequest, ss: &mut RvtSgeState) -> Result<(), i32> {
    let mut g = qp.lock();
    hfi1_kern_setup_hw_flow(&qp.rcd, &mut g)?;
    let mut last = false;
    hfi1_kern_exp_rcv_setup(req, ss, &mut last, &mut g)
}

/// The three group sets agree with each group's `used` and with their counts.
pub(super) fn assert_groups_consistent(rcd: &Hfi1Ctxtdata) -> (u32, u32, u32) {
    let exp = rcd.lock_exp();
    for (set, ok) in [
        (&exp.tid_group_list, &(|u: u8, _s: u8| u == 0) as &dyn Fn(u8, u8) -> bool),
        (&exp.tid_used_list, &|u: u8, s: u8| u > 0 && u < s),
        (&exp.tid_full_list, &|u: u8, s: u8| u == s),
    ] {
        assert_eq!(set.count as usize, set.list.len());
        for g in &set.list {
            let grp = exp.groups[*g];
            assert!(ok(grp.used, grp.size), "group {g} used {} on the wrong list", grp.used);
            assert_eq!(grp.map.count_ones(), u32::from(grp.used));
        }
    }
    let total = exp.tid_group_list.count + exp.tid_used_list.count + exp.tid_full_list.count;
    assert_eq!(total as usize, exp.groups.len());
    (exp.tid_group_list.count, exp.tid_used_list.count, exp.tid_full_list.count)
}

// ---------------------------------------------------------------- probe, partition, rcvctrl (G7)

#[test]
fn probe_rejects_implausible_chip_geometry() {
    let cases: [(u64, u64, &str); 6] = [
        (0, 1, "RCV_ARRAY_CNT"),
        (12, 1, "RCV_ARRAY_CNT"),
        (u64::from(MAX_RCV_ARRAY_CNT) + 8, 1, "RCV_ARRAY_CNT"),
        (u64::MAX, 1, "RCV_ARRAY_CNT"),
        (64, 0, "RCV_CONTEXTS"),
        (64, 161, "RCV_CONTEXTS"),
    ];
    for (cnt, ctxts, what) in cases {
        let fake = FakeHfi1::new(cnt, ctxts);
        match Hfi1Devdata::probe(fake, Hfi1Params::default()) {
            Err(Hfi1Error::BadChipValue { what: w, .. }) => assert_eq!(w, what, "{cnt} {ctxts}"),
            other => panic!("{cnt} {ctxts}: expected BadChipValue, got {:?}", other.err()),
        }
    }
    let fake = FakeHfi1::new(64, 1);
    let p = Hfi1Params { num_rcv_contexts: 2, ..Default::default() };
    assert!(matches!(Hfi1Devdata::probe(fake, p), Err(Hfi1Error::BadParam { .. })));
}

#[test]
fn extra_groups_go_to_the_first_contexts() {
    // 10 groups over 3 contexts: 3 each, one extra for context 0.
    let fake = FakeHfi1::new(80, 3);
    let dd =
        Hfi1Devdata::probe(fake, Hfi1Params { num_rcv_contexts: 3, rcvarr_split: 0, ..Default::default() }).unwrap();
    let bases: Vec<(u32, u32)> = (0..3)
        .map(|c| {
            let r = Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, c).unwrap();
            (r.eager_base, r.rcv_array_groups)
        })
        .collect();
    assert_eq!(bases, vec![(0, 4), (32, 3), (56, 3)]);
    assert!(Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, 3).is_err());
}

#[test]
fn context_csr_values_and_addresses_match_golden_g7() {
    // 3 contexts of 1024 entries, no eager part: context 2 has expected_base 2048, count 1024.
    let fake = FakeHfi1::new(3072, 3);
    let dd =
        Hfi1Devdata::probe(fake.clone(), Hfi1Params { num_rcv_contexts: 3, rcvarr_split: 0, ..Default::default() })
            .unwrap();
    let rcd = Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, 2).unwrap();
    assert_eq!((rcd.expected_base, rcd.expected_count), (2048, 1024));
    assert_eq!(rcd.rcv_tid_ctrl(), 0x0000_0080_0000_0100);
    // 2 contexts of 1024 entries, all eager: context 1 has eager_base 1024, count 1024.
    let fake2 = FakeHfi1::new(2048, 2);
    let dd2 =
        Hfi1Devdata::probe(fake2, Hfi1Params { num_rcv_contexts: 2, rcvarr_split: 100, ..Default::default() }).unwrap();
    let rcd2 = Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd2, 1).unwrap();
    assert_eq!(rcd2.rcv_egr_ctrl(), 0x0000_0080_0000_0080);
    fake.clear_log();
    let csr = dd.csr();
    csr.write_kctxt_csr(3, RCV_CTXT_CTRL, 1).unwrap();
    csr.write_kctxt_csr(5, RCV_EGR_CTRL, 2).unwrap();
    csr.write_uctxt_csr(5, RCV_HDR_HEAD, 3).unwrap();
    assert_eq!(fake.writes(), vec![(0x110_0300, 1), (0x110_0510, 2), (0x130_5008, 3)]);
}

#[test]
fn context_enable_writes_csrs_in_the_kernel_order() {
    let fake = FakeHfi1::new(3072, 3);
    let params = Hfi1Params { num_rcv_contexts: 3, rcvarr_split: 0, rcv_intr_timeout_csr: 10, ..Default::default() };
    let dd = Hfi1Devdata::probe(fake.clone(), params).unwrap();
    let rcd = Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, 2).unwrap();
    let pool = crate::dma::DmaPool::new(fake.clone(), false);
    let hdrq = Arc::new(pool.alloc_contiguous(8192).unwrap());
    let tail = Arc::new(pool.alloc_contiguous(4096).unwrap());
    rcd.set_rcvhdrq(hdrq.clone(), Some(tail.clone()));
    fake.clear_log();
    hfi1_rcvctrl(&dd, HFI1_RCVCTRL_CTXT_ENB | HFI1_RCVCTRL_TIDFLOW_ENB, &rcd).unwrap();
    let k = |off: u64| off + 0x200;
    let u = |off: u64| off + 0x2000;
    // ENABLE | TID_FLOW_ENABLE | EGR_BUF_SIZE code 5 (64 KiB).
    let ctrl = 0x1 | 0x10 | (5 << 8);
    assert_eq!(
        fake.writes(),
        vec![
            (k(RCV_HDR_ADDR), hdrq.iova(0).unwrap()),
            (k(RCV_HDR_TAIL_ADDR), tail.iova(0).unwrap()),
            (u(RCV_HDR_HEAD), 0),
            (u(RCV_EGR_INDEX_HEAD), 0),
            // No eager entries, eager_base 2048: EGR_CNT 0, EGR_BASE_INDEX 2048 >> 3.
            (k(RCV_EGR_CTRL), 0x100),
            (k(RCV_TID_CTRL), 0x0000_0080_0000_0100),
            (k(RCV_CTXT_CTRL), ctrl),
            (k(RCV_AVAIL_TIME_OUT), 10),
            (u(RCV_HDR_HEAD), 16 << 32),
        ]
    );
    // Enabling again only rewrites the control register; disabling parks the tail on the dummy address.
    fake.clear_log();
    hfi1_rcvctrl(&dd, HFI1_RCVCTRL_CTXT_ENB, &rcd).unwrap();
    assert_eq!(fake.writes(), vec![(k(RCV_CTXT_CTRL), ctrl)]);
    fake.clear_log();
    hfi1_rcvctrl(&dd, HFI1_RCVCTRL_CTXT_DIS, &rcd).unwrap();
    assert_eq!(fake.writes(), vec![(RCV_VL15, 0), (k(RCV_CTXT_CTRL), 0x10 | (5 << 8)), (k(RCV_HDR_TAIL_ADDR), 0)]);
}

#[test]
fn enabling_without_a_header_queue_is_an_error() {
    let r = rig(1);
    assert!(hfi1_rcvctrl(&r.dd, HFI1_RCVCTRL_CTXT_ENB, &r.rcd).is_err());
}

// ---------------------------------------------------------------- RcvArray (G1, G2, WC rule)

#[test]
fn put_tid_writes_golden_g1_g2_values_and_flushes_by_rule() {
    let r = rig(64);
    let dd = &r.dd;
    hfi1_put_tid(dd, 0x100, PtType::PT_EXPECTED, 0x1234_5000, 2).unwrap();
    hfi1_put_tid(dd, 0x101, PtType::PT_EXPECTED, 0x1_2340_0000, 0xA).unwrap();
    hfi1_put_tid(dd, 0x102, PtType::PT_INVALID, 0x1234_5000, 2).unwrap();
    hfi1_put_tid(dd, 0x103, PtType::PT_INVALID, 0, 0).unwrap();
    hfi1_put_tid(dd, 0x104, PtType::PT_EAGER, 0x1000, 1).unwrap();
    hfi1_put_tid(dd, 0x105, PtType::PT_INVALID_FLUSH, 0, 0).unwrap();
    rcv_array_wc_fill(dd, 0x106).unwrap();
    rcv_array_wc_fill(dd, 0x107).unwrap();
    assert_eq!(
        r.fake.log(),
        vec![
            Op::Write(0x120_0800, 0x8000_0020_0001_2345),
            Op::Write(0x120_0808, 0x8000_00A0_0012_3400),
            Op::Write(0x120_0810, INVALID),
            Op::Write(0x120_0818, INVALID),
            Op::Flush, // index & 3 == 3
            Op::Write(0x120_0820, 0x8000_0010_0000_0001),
            Op::Flush, // EAGER
            Op::Write(0x120_0828, INVALID),
            Op::Flush, // INVALID_FLUSH
            Op::Write(0x120_0830, 0),
            Op::Write(0x120_0838, 0),
            Op::Flush, // fill at index & 3 == 3
        ]
    );
    assert!(hfi1_put_tid(dd, 64 * 8, PtType::PT_EXPECTED, 0, 1).is_err(), "index past RCV_ARRAY_CNT");
}

// ---------------------------------------------------------------- flows (G3, wrap, -EAGAIN)

#[test]
fn flow_table_writes_match_golden_g3() {
    let fake = FakeHfi1::new(24, 3);
    let dd = Hfi1Devdata::probe(fake.clone(), Hfi1Params { num_rcv_contexts: 3, ..Default::default() }).unwrap();
    let rcd = Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, 2).unwrap();
    fake.clear_log();
    let mut exp = rcd.lock_exp();
    exp.flows[3].generation = 0x12345;
    assert_eq!(kern_setup_hw_flow(&mut exp, 3).unwrap(), 0x12345);
    kern_clear_hw_flow(&mut exp, 3).unwrap();
    assert_eq!(exp.flows[3].generation, 0x12346);
    assert_eq!(fake.writes(), vec![(0x130_2818, 0x0000_006F_091A_2800), (0x130_2818, 0x0000_006D_7FFF_F800)]);
}

#[test]
fn creating_a_context_parks_every_flow_on_the_reserved_generation() {
    let fake = FakeHfi1::new(8, 1);
    let dd = Hfi1Devdata::probe(fake.clone(), Hfi1Params::default()).unwrap();
    let rcd = Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, 0).unwrap();
    let r = Rig { fake: fake.clone(), dd: dd.clone(), rcd, pool: crate::dma::DmaPool::new(fake, false) };
    let w = r.fake.writes();
    assert_eq!(w.len(), 32);
    for (i, (off, val)) in w.into_iter().enumerate() {
        assert_eq!(off, RCV_TID_FLOW_TABLE + 8 * i as u64);
        assert_eq!(val, 0x0000_006D_7FFF_F800);
    }
    let exp = r.rcd.lock_exp();
    // mask_generation(get_random_u32()): any 20-bit value (tid_rdma.c:853).
    assert!(exp.flows.iter().all(|f| f.generation <= GENERATION_MASK));
}

#[test]
fn reserve_flow_prefers_the_last_flow_and_fails_with_eagain_when_full() {
    let r = rig(1);
    let mut exp = r.rcd.lock_exp();
    assert_eq!(kern_reserve_flow(&mut exp, 5), Ok(5));
    assert_eq!(kern_reserve_flow(&mut exp, 5), Ok(0), "5 taken: lowest free");
    assert_eq!(kern_reserve_flow(&mut exp, RXE_NUM_TID_FLOWS), Ok(1), "don't care");
    for _ in 3..32 {
        kern_reserve_flow(&mut exp, RXE_NUM_TID_FLOWS).unwrap();
    }
    assert_eq!(exp.flow_mask, u32::MAX);
    assert_eq!(kern_reserve_flow(&mut exp, 7), Err(-libc::EAGAIN));
    assert_eq!(kern_reserve_flow(&mut exp, RXE_NUM_TID_FLOWS), Err(-libc::EAGAIN));
}

#[test]
fn generation_wraps_past_the_reserved_value_through_setup_and_clear() {
    let r = rig(1);
    let qp = quiet_qp(&r, 1, 4096);
    r.rcd.lock_exp().flows[0].generation = 0xFFFFE;
    let mut g = qp.lock();
    hfi1_kern_setup_hw_flow(&r.rcd, &mut g).unwrap();
    assert_eq!((g.flow_state.index, g.flow_state.generation), (0, 0xFFFFE));
    hfi1_kern_clear_hw_flow(&r.rcd, &mut g).unwrap();
    assert_eq!(r.rcd.lock_exp().flows[0].generation, 0, "0xFFFFF skipped");
    hfi1_kern_setup_hw_flow(&r.rcd, &mut g).unwrap();
    assert_eq!((g.flow_state.index, g.flow_state.generation), (0, 0), "same flow again, next generation");
    let gen_bits = |v: u64| (v >> 11) & 0xFFFFF;
    let w: Vec<u64> = r.fake.writes().into_iter().map(|(_, v)| v).collect();
    assert_eq!(w.iter().map(|v| gen_bits(*v)).collect::<Vec<_>>(), vec![0xFFFFE, 0xFFFFF, 0]);
    assert_eq!(w[2], 0x0000_006F_0000_0000);
}

#[test]
fn flows_run_out_with_eagain_and_the_waiter_gets_one_after_a_clear() {
    let r = rig(1);
    let woken = Arc::new(Mutex::new(Vec::new()));
    let qps: Vec<Arc<Hfi1Qp>> = (0..33)
        .map(|n| {
            let w = woken.clone();
            mk_qp(&r, n, 4096, Box::new(move |qp| w.lock().unwrap().push(qp.qp_num)))
        })
        .collect();
    for qp in &qps[..32] {
        hfi1_kern_setup_hw_flow(&r.rcd, &mut qp.lock()).unwrap();
    }
    let last = &qps[32];
    assert_eq!(hfi1_kern_setup_hw_flow(&r.rcd, &mut last.lock()), Err(-libc::EAGAIN));
    assert_ne!(last.lock().s_flags & HFI1_S_WAIT_TID_SPACE, 0);
    hfi1_kern_clear_hw_flow(&r.rcd, &mut qps[7].lock()).unwrap();
    r.dd.wq.run_pending(100);
    assert_eq!(*woken.lock().unwrap(), vec![32]);
    let mut g = last.lock();
    let other = Hfi1Ctxtdata::hfi1_create_ctxtdata(&r.dd, 0).unwrap();
    assert_eq!(hfi1_kern_setup_hw_flow(&other, &mut g), Err(-libc::EINVAL), "not the QP's context");
    hfi1_kern_setup_hw_flow(&r.rcd, &mut g).unwrap();
    assert_eq!(g.flow_state.index, 7);
    assert_eq!(g.s_flags & HFI1_S_WAIT_TID_SPACE, 0);
    assert!(r.rcd.lock_exp().flow_queue.queue_head.is_empty());
}

#[test]
fn with_the_rcv_array_mapped_wc_fill_stores_nothing() {
    // The G6 segment (pages 3 + 1) on a device whose BAR0 is mapped memory: entries 0-3 are programmed
    // as in G6, and entries 4-7 of the group get no 0 stores that could erase another flow's programming.
    let fake = FakeHfi1::new(16, 1);
    fake.set_mapped_bars(&[HFI1_BAR]);
    let dd = Hfi1Devdata::probe(fake.clone(), Hfi1Params { rcvarr_split: 0, ..Default::default() }).unwrap();
    assert!(!dd.rcvarray_wc);
    let rcd = Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, 0).unwrap();
    let pool = crate::dma::DmaPool::new(fake.clone(), false);
    let buf = Arc::new(pool.alloc_fragmented(&[3, 1]).unwrap());
    let qp = Hfi1Qp::new(1, rcd.clone(), QpSendState::new(IbQpType::Rc, 4096), Box::new(|_| {}));
    let mut req = req_for(&qp, 4 * 4096, 4);
    let mut ss = ss_over(&buf);
    fake.clear_log();
    setup_segment(&qp, &mut req, &mut ss).unwrap();
    let rcv: Vec<u64> = fake
        .writes()
        .into_iter()
        .filter(|(a, _)| (RCV_ARRAY..RCV_ARRAY + 0x10_0000).contains(a))
        .map(|(a, _)| (a - RCV_ARRAY) / 8)
        .collect();
    assert_eq!(rcv, vec![0, 1, 2, 3]);
    // Unprogramming invalidates the same four and again stores nothing else.
    fake.clear_log();
    hfi1_kern_exp_rcv_clear(&mut req, &mut qp.lock()).unwrap();
    let rcv: Vec<(u64, u64)> =
        fake.writes().into_iter().filter(|(a, _)| *a >= RCV_ARRAY && *a < RCV_ARRAY + 0x10_0000).collect();
    assert_eq!(rcv.iter().map(|(a, _)| (a - RCV_ARRAY) / 8).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert!(rcv.iter().all(|(_, v)| *v == INVALID));
}
