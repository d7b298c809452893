//! udriver's hfi1 expected-receive path against the device model with faults injected (docs/observe.md,
//! "Faults"): what each fault does to a TID RDMA segment sent through the loopback path, how the driver
//! recovers (clear the segment and its hardware flow, set it up again on the next generation, resend: what the
//! kernel's TID RDMA code does after a flow error), and that nothing stays programmed. Every test runs over
//! every backend (trapped, RcvArray mapped, vfio-user).
//!
//! RcvArray and flow-table writes are posted, as on the chip: `hfi1_kern_exp_rcv_setup` returns 0 whatever
//! the device did with them, and the receive side reports the damage per packet (`LB_LAST_RESULT`).

mod hfi1_common;

use std::sync::Arc;
use std::time::Duration;

use device_model::fault::FaultSpec;
use device_model::hfi1::Hfi1Config;
use hfi1_common::*;
use serde_json::json;
use udriver::dma::DmaBuffer;
use udriver::hfi1::ctxt::{Hfi1Devdata, Hfi1Params};
use udriver::hfi1::exp_rcv::*;
use udriver::hfi1::flow::hfi1_kern_clear_hw_flow;
use udriver::hfi1::loopback::*;
use udriver::hfi1::qp::Hfi1Qp;
use udriver::hfi1::sge::RvtSgeState;

/// One segment of 16 pages, sent as 16 packets of 4 KiB.
const PAGES: usize = 16;
const SEG: usize = PAGES * PG;
const PMTU: u32 = 4096;

/// A device, the driver on it, and one TID RDMA read request of one segment set up for receive.
struct Seg {
    d: Dev,
    drv: Drv,
    buf: Arc<DmaBuffer>,
    qp: Arc<Hfi1Qp>,
    req: TidRdmaRequest,
    ss: RvtSgeState,
}

impl Seg {
    fn new(backend: Backend) -> Seg {
        let d = Dev::new(Hfi1Config::default(), backend);
        let drv = bring_up(&d.dev, 1, Hfi1Params::default());
        let buf = Arc::new(drv.pool.alloc_contiguous(SEG).unwrap());
        let qp = qp(&drv.rcds[0], 3, PMTU);
        let req = request(&qp, SEG as u32, 1);
        let ss = sge_state(&buf);
        Seg { d, drv, buf, qp, req, ss }
    }

    fn fault(&self, spec: &str) -> u64 {
        self.d.function.arm_fault(FaultSpec::parse(spec).unwrap()).unwrap()
    }

    fn setup(&mut self) {
        setup_segment(&self.qp, &mut self.req, &mut self.ss).unwrap();
    }

    fn send(&self, payload: &[u8]) -> LbOutcome {
        send_flow(&self.drv, &self.req, 0, payload, PMTU)
    }

    fn npkts(&self) -> u64 {
        u64::from(self.req.flow(0).unwrap().npkts)
    }

    /// The recovery: the segment cleared with its hardware flow, set up again (a new generation), resent.
    fn resend_fresh(&mut self, payload: &[u8], what: &str) {
        self.release();
        hfi1_kern_exp_rcv_free_flows(&mut self.req).unwrap();
        self.req = request(&self.qp, SEG as u32, 1);
        self.ss = sge_state(&self.buf);
        self.setup();
        let out = self.send(payload);
        assert_eq!((out.errors, out.last()), (0, Some(LbResult::Placed)), "{what}: the resent segment");
        assert!(bytes(&self.buf, 0, SEG) == payload, "{what}: every byte after the resend");
    }

    fn release(&mut self) {
        let mut g = self.qp.lock();
        hfi1_kern_exp_rcv_clear_all(&mut self.req, &mut g).unwrap();
        hfi1_kern_clear_hw_flow(&self.drv.rcds[0], &mut g).unwrap();
    }

    /// Teardown, and nothing left programmed on the device.
    fn finish(mut self, what: &str) {
        self.release();
        hfi1_kern_exp_rcv_free_flows(&mut self.req).unwrap();
        assert!(self.d.rcv_entries().is_empty(), "{what}: RcvArray entries left valid");
    }
}

fn page(buf: &DmaBuffer, n: usize) -> Vec<u8> {
    bytes(buf, n * PG, PG)
}

/// For each backend: a segment set up, `fault` armed, `pattern(SEG, seed)` sent; `check` judges the outcome
/// (and may resend), then the segment is torn down with nothing left programmed.
fn send_faulted(fault: &str, seed: u32, check: impl Fn(&mut Seg, &str, &[u8], LbOutcome)) {
    for backend in BACKENDS {
        let what = format!("{backend:?}");
        let mut s = Seg::new(backend);
        s.setup();
        s.fault(fault);
        let payload = pattern(SEG, seed);
        let out = s.send(&payload);
        check(&mut s, &what, &payload, out);
        s.finish(&what);
    }
}

#[test]
fn an_ignored_rcvarray_write_fails_its_packets_with_tid_invalid_entry_and_a_fresh_setup_recovers() {
    for backend in BACKENDS {
        let what = format!("{backend:?}");
        let mut s = Seg::new(backend);
        // Armed after the probe: the first write with WRITE_ENABLE is the segment's first TID.
        s.fault("rcvarray-ignore");
        s.setup();
        let payload = pattern(SEG, 1);
        let out = s.send(&payload);
        // The segment is one TID: its first packet finds the entry invalid, and as the flow's sequence did
        // not advance, every later one is a sequence mismatch.
        assert_eq!(
            (out.descriptors, out.errors, out.last()),
            (s.npkts(), s.npkts(), Some(LbResult::SeqMismatch)),
            "{what}"
        );
        assert_eq!(s.d.dump()["counters"]["rx_tid_invalid_entry"], json!(1), "{what}");
        assert!(page(&s.buf, 0).iter().all(|b| *b == 0), "{what}: nothing placed under the lost entry");
        s.resend_fresh(&payload, &what);
        s.finish(&what);
    }
}

#[test]
fn a_generation_changed_behind_the_drivers_back_fails_the_segment_with_gen_mismatch_until_a_new_flow() {
    send_faulted("flow-generation,ctxt=0,add=1", 2, |s, what, payload, out| {
        assert_eq!((out.errors, out.last()), (s.npkts(), Some(LbResult::GenMismatch)), "{what}");
        let idx = s.qp.lock().flow_state.index;
        assert_eq!(s.d.flow(0, idx).unwrap()["gen_mismatch"], json!(true), "{what}: the status bit");
        assert!(bytes(&s.buf, 0, SEG).iter().all(|b| *b == 0), "{what}: nothing placed");
        s.resend_fresh(payload, what);
    });
}

#[test]
fn a_lost_packet_fails_every_later_one_with_seq_mismatch_and_leaves_its_page_empty() {
    send_faulted("packet-drop,nth=2", 3, |s, what, payload, out| {
        // Packet 1 placed, 2 lost, 3.. expected at sequence 1: mismatches.
        assert_eq!(
            (out.descriptors, out.errors, out.last()),
            (s.npkts(), s.npkts() - 2, Some(LbResult::SeqMismatch)),
            "{what}"
        );
        assert_eq!(page(&s.buf, 0), payload[..PG], "{what}: packet 1 placed");
        assert!(page(&s.buf, 1).iter().all(|b| *b == 0), "{what}: packet 2 never arrived");
        s.resend_fresh(payload, what);
    });
}

#[test]
fn a_duplicated_packet_is_one_seq_mismatch_and_every_byte_still_lands() {
    send_faulted("packet-dup", 4, |s, what, payload, out| {
        assert_eq!((out.descriptors, out.errors, out.last()), (s.npkts(), 1, Some(LbResult::Placed)), "{what}");
        assert!(bytes(&s.buf, 0, SEG) == payload, "{what}: the copy changed nothing");
        let idx = s.qp.lock().flow_state.index;
        assert_eq!(s.d.flow(0, idx).unwrap()["sequence"], json!(s.npkts()), "{what}: the sequence ran through");
    });
}

#[test]
fn a_reordered_packet_fails_all_but_the_first_with_seq_mismatch_and_a_resend_recovers() {
    send_faulted("packet-reorder", 5, |s, what, payload, out| {
        // Packet 2 arrives first (expected 0: mismatch), then 1 (placed), then 3.. (expected 1: mismatches).
        assert_eq!(
            (out.descriptors, out.errors, out.last()),
            (s.npkts(), s.npkts() - 1, Some(LbResult::SeqMismatch)),
            "{what}"
        );
        assert_eq!(page(&s.buf, 0), payload[..PG], "{what}: packet 1 placed late");
        assert!(page(&s.buf, 1).iter().all(|b| *b == 0), "{what}");
        s.resend_fresh(payload, what);
    });
}

#[test]
fn a_failed_dma_write_is_dma_error_for_its_packet_only_and_a_resend_recovers() {
    send_faulted("dma-write-fail", 6, |s, what, payload, out| {
        assert_eq!((out.descriptors, out.errors, out.last()), (s.npkts(), 1, Some(LbResult::Placed)), "{what}");
        assert_eq!(s.d.dump()["counters"]["rx_dma_errors"], json!(1), "{what}");
        assert!(page(&s.buf, 0).iter().all(|b| *b == 0), "{what}: packet 1's bytes never landed");
        assert_eq!(bytes(&s.buf, PG, SEG - PG), payload[PG..], "{what}: the rest did");
        s.resend_fresh(payload, what);
    });
}

fn probe_errno(d: &Dev) -> i32 {
    Hfi1Devdata::probe(d.dev.clone(), Hfi1Params::default()).err().map_or(0, |e| e.to_errno())
}

#[test]
fn a_stuck_rcv_array_cnt_makes_probe_enodev_until_it_reads_right() {
    for backend in BACKENDS {
        let d = Dev::new(Hfi1Config::default(), backend);
        // Not a multiple of RCV_INCREMENT: no real chip has it.
        let spec = FaultSpec::parse("reg-stuck,reg=RCV_ARRAY_CNT,mask=0xffff,value=0x1001").unwrap();
        let id = d.function.arm_fault(spec).unwrap();
        assert_eq!(probe_errno(&d), -libc::ENODEV, "{backend:?}");
        assert!(d.function.probe().faults.remove(id));
        assert_eq!(probe_errno(&d), 0, "{backend:?}");
    }
}

#[test]
fn a_surprise_removed_hfi_fails_probe_with_enodev_and_a_send_without_hanging() {
    for backend in BACKENDS {
        let what = format!("{backend:?}");
        let s = Seg::new(backend);
        s.fault("removed");
        assert_eq!(probe_errno(&s.d), -libc::ENODEV, "{what}: RCV_ARRAY_CNT reads all-ones");
        let payload = pattern(SEG, 7);
        // A doorbell on a removed device is never accepted: the driver says so at once.
        let desc = LbDescriptor { kdeth0: 0, dest_qp: 0, psn: 0, payload: &payload[..64] };
        let r = s.drv.lb.send(&[desc], Duration::from_secs(2));
        assert_eq!(r.err().map(|e| e.to_errno()), Some(-libc::EBUSY), "{what}");
    }
}

#[test]
fn a_refused_dma_map_is_enomem_for_that_buffer_and_the_next_allocation_works() {
    for backend in BACKENDS {
        let what = format!("{backend:?}");
        let s = Seg::new(backend);
        s.fault("dma-map-refuse,errno=ENOMEM");
        let r = s.drv.pool.alloc_contiguous(SEG);
        assert_eq!(r.err().map(|e| e.to_errno()), Some(-libc::ENOMEM), "{what}");
        let again = s.drv.pool.alloc_contiguous(SEG).unwrap();
        again.release(&s.drv.pool);
        s.finish(&what);
    }
}

#[test]
fn a_suppressed_doorbell_interrupt_is_missed_and_the_next_one_arrives() {
    for backend in BACKENDS {
        let what = format!("{backend:?}");
        let mut s = Seg::new(backend);
        s.setup();
        let payload = pattern(SEG, 8);
        s.fault("msix-drop,vector=0");
        // The sender polls LB_DB_DONE: the data lands though the interrupt never comes.
        let out = s.send(&payload);
        assert_eq!((out.errors, out.last()), (0, Some(LbResult::Placed)), "{what}");
        assert!(!s.d.dev.wait_irq(0, Duration::from_millis(50)).unwrap(), "{what}: no interrupt");
        s.resend_fresh(&payload, &what);
        assert!(s.d.dev.wait_irq(0, TIMEOUT).unwrap(), "{what}: the next doorbell's interrupt");
        s.finish(&what);
    }
}
