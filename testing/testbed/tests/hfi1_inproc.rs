//! The real driver against the real device model (hfi1 engine in a PCI function, in-process): probe,
//! context enable, flows, expected-receive setup over contiguous and fragmented memory, TID RDMA data
//! through the loopback send path, and teardown, each checked on the device's own state (`dump`).
//! Every test runs over both ways of reaching BAR0: trapped, and with the RcvArray mapped.

mod hfi1_common;

use std::sync::Arc;

use device_model::hfi1::Hfi1Config;
use hfi1_common::*;
use serde_json::json;
use udriver::hfi1::ctxt::Hfi1Params;
use udriver::hfi1::exp_rcv::*;
use udriver::hfi1::flow::{hfi1_kern_clear_hw_flow, hfi1_kern_setup_hw_flow};
use udriver::hfi1::loopback::*;
use udriver::hfi1::qp::HFI1_S_WAIT_TID_SPACE;
use udriver::hfi1::regs::*;

const SEG: usize = 64 * PG;

fn hex(v: &serde_json::Value) -> u64 {
    v.as_str().and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()).expect("hex string")
}

#[test]
fn probe_and_rcvctrl_give_every_context_its_tid_range_with_flow_checking_and_reserved_flows() {
    for backend in BACKENDS {
        let d = Dev::new(Hfi1Config::default(), backend);
        let drv = bring_up(&d.dev, 8, Hfi1Params::default());
        assert_eq!((drv.dd.chip_rcv_array_count, drv.dd.chip_rcv_contexts), (4096, 8));
        assert_eq!(drv.dd.rcvarray_wc, backend == Backend::Trapped, "wc_fill only without a mapping");
        let dump = d.dump();
        for c in 0..8u64 {
            let ctx = &dump["contexts"][c as usize];
            // §1.4 by hand: 512 entries per context, 25 % eager = 128, the other 384 expected.
            assert_eq!((ctx["tid_base"].as_u64(), ctx["tid_count"].as_u64()), (Some(512 * c + 128), Some(384)));
            let ctrl = hex(&ctx["csrs"]["RCV_CTXT_CTRL"]);
            assert_eq!(ctrl & 0x11, 0x11, "ctxt {c}: ENABLE (bit 0) and TID_FLOW_ENABLE (bit 4)");
            // hfi1_kern_init_ctxt_generations: all 32 flows on the reserved generation (G4), no HDR_SUPP_EN.
            let flows = ctx["flows"].as_array().expect("flows");
            assert_eq!(flows.len(), 32);
            for f in flows {
                let dec = &f["decoded"];
                assert_eq!(dec["generation"], json!(0xFFFFF));
                assert_eq!((dec["flow_valid"].as_bool(), dec["hdr_supp_en"].as_bool()), (Some(true), Some(false)));
            }
        }
    }
}

#[test]
fn a_hardware_flow_carries_its_generation_to_the_device_and_clear_parks_it_on_the_reserved_one() {
    for backend in BACKENDS {
        let d = Dev::new(Hfi1Config::default(), backend);
        let drv = bring_up(&d.dev, 2, Hfi1Params::default());
        let qp = qp(&drv.rcds[1], 7, 4096);
        let mut g = qp.lock();
        hfi1_kern_setup_hw_flow(&drv.rcds[1], &mut g).unwrap();
        let (idx, gen) = (g.flow_state.index, g.flow_state.generation);
        assert_ne!(gen, KERN_GENERATION_RESERVED);
        let f = d.flow(1, idx).expect("flow entry");
        assert_eq!(f["generation"], json!(gen));
        assert_eq!(f["sequence"], json!(0));
        for bit in ["flow_valid", "hdr_supp_en", "keep_after_seq_err", "keep_on_gen_err"] {
            assert_eq!(f[bit], json!(true), "{bit}");
        }
        // Bits 37/38 were written as 1: W1C, so the status reads clear.
        assert_eq!((f["seq_mismatch"].as_bool(), f["gen_mismatch"].as_bool()), (Some(false), Some(false)));
        hfi1_kern_clear_hw_flow(&drv.rcds[1], &mut g).unwrap();
        let f = d.flow(1, idx).expect("flow entry");
        assert_eq!((f["generation"].clone(), f["hdr_supp_en"].clone()), (json!(0xFFFFF), json!(false)));
        // The QP gets its last flow back with the next generation (§1.5: +1, skipping 0xFFFFF).
        hfi1_kern_setup_hw_flow(&drv.rcds[1], &mut g).unwrap();
        let next = if (gen + 1) & 0xFFFFF == 0xFFFFF { 0 } else { (gen + 1) & 0xFFFFF };
        assert_eq!((g.flow_state.index, g.flow_state.generation), (idx, next));
        assert_eq!(d.flow(1, idx).expect("flow")["generation"], json!(next));
    }
}

/// Page runs of a 128-page (two-segment) buffer; `None` = contiguous.
type Layout = Option<&'static [u64]>;
const LAYOUTS: [(&str, Layout); 3] = [
    ("contiguous", None),
    ("fragmented", Some(&[3, 1, 5, 7, 16, 32, 1, 1, 2, 2, 9, 17, 32])),
    ("single pages", Some(&[1; 128])),
];

#[test]
fn a_two_segment_request_receives_every_byte_at_its_place_over_contiguous_and_fragmented_memory() {
    for backend in BACKENDS {
        for (name, layout) in LAYOUTS {
            for pmtu in [4096u32, 8192] {
                let what = format!("{backend:?} {name} pmtu {pmtu}");
                let d = Dev::new(Hfi1Config::default(), backend);
                let drv = bring_up(&d.dev, 1, Hfi1Params::default());
                let buf = Arc::new(match layout {
                    None => drv.pool.alloc_contiguous(2 * SEG).unwrap(),
                    Some(runs) => drv.pool.alloc_fragmented(runs).unwrap(),
                });
                let qp = qp(&drv.rcds[0], 3, pmtu);
                let mut req = request(&qp, SEG as u32, 2);
                let mut ss = sge_state(&buf);
                setup_segment(&qp, &mut req, &mut ss).unwrap();
                setup_segment(&qp, &mut req, &mut ss).unwrap();
                let mut programmed = Vec::new();
                for slot in 0..2 {
                    let flow = req.flow(slot).unwrap();
                    let pages: u32 = flow.tid_entry.iter().map(|e| exp_tid_get_len(*e)).sum();
                    assert_eq!((pages, flow.length), (64, SEG as u32), "{what}");
                    let pmtu_pg = pmtu / 4096;
                    let npkts: u32 = flow.tid_entry.iter().map(|e| exp_tid_get_len(*e).div_ceil(pmtu_pg)).sum();
                    assert_eq!(flow.npkts, npkts, "{what}: §1.10 npkts");
                    programmed.extend(
                        flow.pagesets.iter().filter(|p| p.count > 0).map(|p| (p.addr, u64::from(p.count) * 4096)),
                    );
                }
                // The device holds exactly the page sets, at their addresses and sizes.
                let mut on_device: Vec<(u64, u64)> = d.rcv_entries().into_iter().map(|(_, a, s)| (a, s)).collect();
                on_device.sort_unstable();
                programmed.sort_unstable();
                assert_eq!(on_device, programmed, "{what}");
                let (seg0, seg1) = (pattern(SEG, 1), pattern(SEG, 2));
                let out = send_flow(&drv, &req, 0, &seg0, pmtu);
                let n0 = req.flow(0).unwrap().npkts;
                assert_eq!(
                    (out.descriptors, out.errors, out.last()),
                    (u64::from(n0), 0, Some(LbResult::Placed)),
                    "{what}"
                );
                assert!(bytes(&buf, 0, SEG) == seg0, "{what}: segment 0 bytes");
                assert!(bytes(&buf, SEG, SEG).iter().all(|b| *b == 0), "{what}: segment 1 untouched");
                let out = send_flow(&drv, &req, 1, &seg1, pmtu);
                assert_eq!((out.errors, out.last()), (0, Some(LbResult::Placed)), "{what}");
                assert!(bytes(&buf, SEG, SEG) == seg1, "{what}: segment 1 bytes");
                // The device's expected sequence ran through both segments of the one hardware flow.
                let f = d.flow(0, qp.lock().flow_state.index).unwrap();
                assert_eq!(f["sequence"], json!(n0 + req.flow(1).unwrap().npkts), "{what}");
                let mut g = qp.lock();
                hfi1_kern_exp_rcv_clear_all(&mut req, &mut g).unwrap();
                hfi1_kern_clear_hw_flow(&drv.rcds[0], &mut g).unwrap();
                drop(g);
                hfi1_kern_exp_rcv_free_flows(&mut req).unwrap();
                assert!(d.rcv_entries().is_empty(), "{what}: nothing left programmed");
            }
        }
    }
}

#[test]
fn generation_and_sequence_mismatches_set_the_status_bits_and_place_nothing() {
    for backend in BACKENDS {
        let d = Dev::new(Hfi1Config::default(), backend);
        let drv = bring_up(&d.dev, 1, Hfi1Params::default());
        let buf = Arc::new(drv.pool.alloc_contiguous(SEG).unwrap());
        let qp = qp(&drv.rcds[0], 3, 4096);
        let mut req = request(&qp, SEG as u32, 1);
        setup_segment(&qp, &mut req, &mut sge_state(&buf)).unwrap();
        let flow = req.flow(0).unwrap().clone();
        let seg = pattern(SEG, 9);
        let packets = tid_rdma_data_packets(&flow, tid_flow_qp(0, flow.idx, 0), 4096).unwrap();
        let first = packets[0];
        let gen = flow.flow_state.generation;
        let cases = [
            ("generation", full_flow_psn((gen + 1) & GENERATION_MASK, 0), LbResult::GenMismatch, "gen_mismatch"),
            ("sequence", full_flow_psn(gen, 1), LbResult::SeqMismatch, "seq_mismatch"),
        ];
        for (what, psn, result, bit) in cases {
            let bad = TidDataPacket { psn, ..first };
            let out = drv.lb.send(&[bad.descriptor(&seg).unwrap()], TIMEOUT).unwrap();
            assert_eq!((out.errors, out.last()), (1, Some(result)), "{backend:?} {what}");
            let f = d.flow(0, flow.idx).unwrap();
            assert_eq!(f[bit], json!(true), "{backend:?} {what}");
            assert_eq!(f["sequence"], json!(0), "{backend:?} {what}: no advance");
            assert!(bytes(&buf, 0, SEG).iter().all(|b| *b == 0), "{backend:?} {what}: nothing placed");
        }
        let counters = &d.dump()["counters"];
        assert_eq!((counters["rx_gen_mismatch"].clone(), counters["rx_seq_mismatch"].clone()), (json!(1), json!(1)));
        // KEEP_ON_GEN_ERR / KEEP_AFTER_SEQ_ERR were written set: the flow still takes the right packets.
        let out = send_flow(&drv, &req, 0, &seg, 4096);
        assert_eq!((out.errors, out.last()), (0, Some(LbResult::Placed)), "{backend:?}");
        assert!(bytes(&buf, 0, SEG) == seg, "{backend:?}");
    }
}

#[test]
fn tids_run_out_with_eagain_and_the_same_call_succeeds_after_a_clear() {
    for backend in BACKENDS {
        let d = Dev::new(Hfi1Config::default(), backend);
        // 8 contexts: 384 expected entries = 48 groups; a segment of 64 single pages takes 8 of them.
        let drv = bring_up(&d.dev, 8, Hfi1Params::default());
        let buf = Arc::new(drv.pool.alloc_fragmented(&[1; 7 * 64]).unwrap());
        let qp = qp(&drv.rcds[3], 3, 4096);
        let mut req = request(&qp, SEG as u32, 7);
        let mut ss = sge_state(&buf);
        for s in 0..6u16 {
            setup_segment(&qp, &mut req, &mut ss).unwrap_or_else(|e| panic!("{backend:?} segment {s}: {e}"));
            // Data arrives in order, so the device's flow sequence follows the driver's PSNs.
            let seg = pattern(SEG, u32::from(s));
            assert_eq!(send_flow(&drv, &req, s, &seg, 4096).last(), Some(LbResult::Placed), "{backend:?} {s}");
            assert!(bytes(&buf, usize::from(s) * SEG, SEG) == seg, "{backend:?} segment {s}");
        }
        assert_eq!(d.rcv_entries().len(), 384, "{backend:?}: the context's RcvArray is full");
        assert_eq!(setup_segment(&qp, &mut req, &mut ss), Err(-libc::EAGAIN), "{backend:?}");
        assert_ne!(qp.lock().s_flags & HFI1_S_WAIT_TID_SPACE, 0);
        hfi1_kern_exp_rcv_clear(&mut req, &mut qp.lock()).unwrap();
        assert_eq!(d.rcv_entries().len(), 384 - 64);
        setup_segment(&qp, &mut req, &mut ss).unwrap();
        assert_eq!(qp.lock().s_flags & HFI1_S_WAIT_TID_SPACE, 0, "{backend:?}: left the queue");
        // The retried segment (ring slot 6, the buffer's seventh 256 KiB) receives its data.
        let seg = pattern(SEG, 6);
        let out = send_flow(&drv, &req, 6, &seg, 4096);
        assert_eq!(out.last(), Some(LbResult::Placed), "{backend:?}");
        assert!(bytes(&buf, 6 * SEG, SEG) == seg, "{backend:?}");
        hfi1_kern_exp_rcv_clear_all(&mut req, &mut qp.lock()).unwrap();
        assert!(d.rcv_entries().is_empty());
    }
}

#[test]
fn flows_run_out_with_eagain_and_a_waiter_gets_the_freed_flow_with_its_generation() {
    for backend in BACKENDS {
        let d = Dev::new(Hfi1Config::default(), backend);
        let drv = bring_up(&d.dev, 1, Hfi1Params::default());
        let rcd = &drv.rcds[0];
        let qps: Vec<_> = (0..33).map(|n| qp(rcd, n, 4096)).collect();
        for q in &qps[..32] {
            hfi1_kern_setup_hw_flow(rcd, &mut q.lock()).unwrap();
        }
        let late = &qps[32];
        assert_eq!(hfi1_kern_setup_hw_flow(rcd, &mut late.lock()), Err(-libc::EAGAIN), "{backend:?}");
        assert_ne!(late.lock().s_flags & HFI1_S_WAIT_TID_SPACE, 0);
        let freed = qps[5].lock().flow_state.index;
        hfi1_kern_clear_hw_flow(rcd, &mut qps[5].lock()).unwrap();
        let mut g = late.lock();
        hfi1_kern_setup_hw_flow(rcd, &mut g).unwrap();
        assert_eq!(g.flow_state.index, freed, "{backend:?}");
        assert_eq!(d.flow(0, freed).unwrap()["generation"], json!(g.flow_state.generation));
        assert_eq!(g.s_flags & HFI1_S_WAIT_TID_SPACE, 0);
    }
}

#[test]
fn exp_rcv_clear_leaves_exactly_the_cleared_segments_entries_invalid_on_the_device() {
    for backend in BACKENDS {
        let d = Dev::new(Hfi1Config::default(), backend);
        let drv = bring_up(&d.dev, 1, Hfi1Params::default());
        let buf = Arc::new(drv.pool.alloc_fragmented(&[2, 1, 1, 4, 56, 64]).unwrap());
        let qp = qp(&drv.rcds[0], 3, 4096);
        let mut req = request(&qp, SEG as u32, 2);
        let mut ss = sge_state(&buf);
        setup_segment(&qp, &mut req, &mut ss).unwrap();
        setup_segment(&qp, &mut req, &mut ss).unwrap();
        let addrs = |slot: u16| -> Vec<u64> {
            let mut v: Vec<u64> =
                req.flow(slot).unwrap().pagesets.iter().filter(|p| p.count > 0).map(|p| p.addr).collect();
            v.sort_unstable();
            v
        };
        let second = addrs(1);
        let on_device = || -> Vec<u64> {
            let mut v: Vec<u64> = d.rcv_entries().into_iter().map(|(_, a, _)| a).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(on_device().len(), addrs(0).len() + second.len(), "{backend:?}");
        hfi1_kern_exp_rcv_clear(&mut req, &mut qp.lock()).unwrap();
        assert_eq!(on_device(), second, "{backend:?}: only the second segment stays");
        hfi1_kern_exp_rcv_clear(&mut req, &mut qp.lock()).unwrap();
        assert!(on_device().is_empty(), "{backend:?}");
        assert_eq!(hfi1_kern_exp_rcv_clear(&mut req, &mut qp.lock()), Err(-libc::EINVAL));
        // A packet for the cleared TIDs is refused by the device.
        let flow = req.flow(0).unwrap();
        let p = tid_rdma_data_packets(flow, tid_flow_qp(0, flow.idx, 0), 4096).unwrap()[0];
        let seg = pattern(SEG, 3);
        let out = drv.lb.send(&[p.descriptor(&seg).unwrap()], TIMEOUT).unwrap();
        assert_eq!(out.last(), Some(LbResult::TidInvalidEntry), "{backend:?}");
    }
}

#[test]
fn with_the_rcv_array_mapped_a_neighbours_untaken_programming_survives_only_without_wc_fill() {
    // (the driver is told about the mapping, result for the first flow's packet)
    let cases = [(true, LbResult::Placed), (false, LbResult::TidInvalidEntry)];
    for (told, want) in cases {
        let d = Dev::new(Hfi1Config::default(), if told { Backend::Mapped } else { Backend::MappedUntold });
        let drv = bring_up(&d.dev, 1, Hfi1Params::default());
        assert_eq!(drv.dd.rcvarray_wc, !told);
        // Two one-page segments of two QPs share the first group: entries 0-1 and then 2-3. Nothing makes
        // the device take entry 0 between the two programmings.
        let (qa, qb) = (qp(&drv.rcds[0], 1, 4096), qp(&drv.rcds[0], 2, 4096));
        let (ba, bb) =
            (Arc::new(drv.pool.alloc_contiguous(PG).unwrap()), Arc::new(drv.pool.alloc_contiguous(PG).unwrap()));
        let (mut ra, mut rb) = (request(&qa, PG as u32, 1), request(&qb, PG as u32, 1));
        setup_segment(&qa, &mut ra, &mut sge_state(&ba)).unwrap();
        setup_segment(&qb, &mut rb, &mut sge_state(&bb)).unwrap();
        let (pa, pb) = (pattern(PG, 1), pattern(PG, 2));
        let out = send_flow(&drv, &ra, 0, &pa, 4096);
        assert_eq!(out.last(), Some(want), "told {told}");
        assert_eq!(bytes(&ba, 0, PG) == pa, want == LbResult::Placed, "told {told}");
        let out = send_flow(&drv, &rb, 0, &pb, 4096);
        assert_eq!(out.last(), Some(LbResult::Placed), "told {told}");
        assert!(bytes(&bb, 0, PG) == pb);
    }
}

#[test]
fn every_finished_doorbell_raises_msix_vector_0() {
    for backend in BACKENDS {
        let d = Dev::new(Hfi1Config::default(), backend);
        let drv = bring_up(&d.dev, 1, Hfi1Params::default());
        // An idle flow is parked valid on the reserved generation (G4): the packet is refused, the doorbell
        // still completes.
        let desc = LbDescriptor { kdeth0: kdeth0(0, false, 0, 1), dest_qp: tid_flow_qp(0, 0, 0), psn: 0, payload: &[] };
        let out = drv.lb.send(&[desc], TIMEOUT).unwrap();
        assert_eq!((out.doorbells, out.last()), (1, Some(LbResult::GenMismatch)), "{backend:?}");
        assert!(d.dev.wait_irq(0, TIMEOUT).unwrap(), "{backend:?}: vector 0 fired");
        assert!(!d.dev.wait_irq(0, std::time::Duration::from_millis(20)).unwrap(), "{backend:?}: once");
    }
}
