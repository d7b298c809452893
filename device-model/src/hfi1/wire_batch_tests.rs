//! The control socket's `wire-batch` on the chip personality, driven the way the Linux hfi1 driver drives a
//! kernel receive context: hfi1_rcvctrl enables it, the receive interrupt drains the entries and writes
//! RCV_HDR_HEAD in dwords at its end (driver.c finish_packet, chip.c update_usrhead). A batch is done when every
//! packet was judged and the head has passed every entry placed by then; the deadline's reply says where the
//! driver stopped.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use vfio_user_proto::dma::{DmaAccess, HeapMemory};

use super::*;
use crate::clock::FakeClock;
use crate::engine::Engine;
use crate::hfi1::cable::WirePacket;
use crate::hfi1::datapath::batch::{BATCH_WAITERS, WIRE_BATCH_MAX};
use crate::hfi1::regs::*;
use crate::hfi1::wfr::csr::{CCE_INT_MAP, CCE_INT_MASK, DCC_CFG_PORT_CONFIG1};

use super::tests::Irqs;

const HDRQ: u64 = 0x10_0000;
const TAIL: u64 = 0x11_0000;
const EAGER: u64 = 0x20_0000;
const EGR_SIZE: u64 = 16 * 1024;
/// Header queue entries (RCV_HDR_CNT 2, in 32s) of 32 dwords (RCV_HDR_ENT_SIZE code 4).
const ENTRIES: u64 = 64;
const ENTSIZE: u64 = 32;
/// IS_RCVAVAIL_START (chip.h) and the vector the driver's receive interrupt gets here.
const RCVAVAIL_SOURCE: u64 = 256;
const RCVAVAIL_VECTOR: u16 = 1;
/// The port's LID, as set_lidlmc programs it with LMC 0 (DLID mask ~0).
const LID: u16 = 1;

fn w(h: &Hfi1, off: u64, v: u64) {
    h.mmio_write(crate::hfi1::config::HFI1_BAR, off, &v.to_le_bytes());
}

/// A chip-personality HFI whose kernel context 0 takes every packet: hfi1_rcvctrl's enable with a DMA'd tail,
/// 64 entries of 32 dwords, 8 eager buffers of 16 KiB, DONT_DROP on full (the driver's default), RcvAvail
/// routed to vector 1; set_lidlmc with LID 1. The port is enabled (set_link_state HLS_UP_INIT) if `port_up`.
fn hfi(port_up: bool) -> (Hfi1, Arc<Irqs>) {
    chip(Hfi1Config::wfr().inline(), port_up)
}

/// [`hfi`] with the worker `config` gives.
fn chip(config: Hfi1Config, port_up: bool) -> (Hfi1, Arc<Irqs>) {
    let h = Hfi1::new(config).unwrap();
    let (mem, irqs) = (Arc::new(HeapMemory::new()), Arc::new(Irqs::default()));
    mem.map(HDRQ, (ENTRIES * ENTSIZE * 4) as usize);
    mem.map(TAIL, 4096);
    mem.map(EAGER, (8 * EGR_SIZE) as usize);
    h.attach(mem as Arc<dyn DmaAccess>, irqs.clone());
    let k = |reg| kctxt_csr(reg, 0);
    w(&h, k(RCV_HDR_CNT), ENTRIES >> 5);
    w(&h, k(RCV_HDR_ENT_SIZE), 4);
    w(&h, k(RCV_HDR_ADDR), HDRQ);
    w(&h, k(RCV_HDR_TAIL_ADDR), TAIL);
    w(&h, k(RCV_EGR_CTRL), 1 << 32);
    for i in 0..8 {
        w(&h, RCV_ARRAY + 8 * i, (1 << 63) | (3 << 36) | ((EAGER + i * EGR_SIZE) >> 12));
    }
    let ctrl = RCV_CTXT_CTRL_ENABLE_SMASK
        | RCV_CTXT_CTRL_INTR_AVAIL_SMASK
        | RCV_CTXT_CTRL_TAIL_UPD_SMASK
        | RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK
        | RCV_CTXT_CTRL_DONT_DROP_EGR_FULL_SMASK
        | (3 << RCV_CTXT_CTRL_EGR_BUF_SIZE_SHIFT);
    w(&h, k(RCV_CTXT_CTRL), ctrl);
    w(&h, CCE_INT_MASK + 8 * (RCVAVAIL_SOURCE / 64), 1 << (RCVAVAIL_SOURCE % 64));
    w(&h, CCE_INT_MAP + 8 * (RCVAVAIL_SOURCE / 8), u64::from(RCVAVAIL_VECTOR) << (8 * (RCVAVAIL_SOURCE % 8)));
    w(&h, DCC_CFG_PORT_CONFIG1, u64::from(LID) | (0xFFFF << 16));
    if port_up {
        w(&h, RCV_CTRL, RCV_CTRL_RCV_PORT_ENABLE_SMASK);
    }
    (h, irqs)
}

/// A UD SEND_ONLY to QP 2 with a dword of payload, as hfi1_make_ud_req builds it: LRH (VL 0, LNH BTH, DLID
/// `dlid`), BTH (opcode 0x64, P_Key 0xffff, PSN `psn`), DETH; the ICRC appended.
fn ud(dlid: u16, psn: u32) -> WirePacket {
    let mut p = vec![0u8; 28 + 4];
    p[1] = 0x2;
    p[2..4].copy_from_slice(&dlid.to_be_bytes());
    let dwords = ((p.len() + 4) / 4) as u16;
    p[4..6].copy_from_slice(&dwords.to_be_bytes());
    p[6..8].copy_from_slice(&2u16.to_be_bytes());
    p[8] = 0x64;
    p[10..12].copy_from_slice(&[0xFF, 0xFF]);
    p[12..16].copy_from_slice(&2u32.to_be_bytes());
    p[16..20].copy_from_slice(&psn.to_be_bytes());
    WirePacket::seal(p, false, false).unwrap()
}

fn hex(p: &WirePacket) -> String {
    p.bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn batch_request(packets: Vec<Value>, wait_ms: u64) -> Value {
    json!({"cmd": "wire-batch", "packets": packets, "wait_ms": wait_ms})
}

/// The driver's receive interrupt after reading `entries` entries: update_usrhead writes the head in dwords.
fn head_past(h: &Hfi1, entries: u64) {
    w(h, uctxt_csr(RCV_HDR_HEAD, 0), (entries * ENTSIZE) % (ENTRIES * ENTSIZE));
}

/// Packets the port drops never reach a header queue: the batch is judged, nothing waits for the driver, and
/// the reply comes as the worker (its own thread, as the device model serves) judges the last one, not at the
/// deadline, with the drops by ingress's cause.
#[test]
fn a_batch_the_port_drops_is_done_at_once_with_its_drop_causes() {
    let other = LID + 1;
    let ebp = WirePacket { test_ebp: true, ..ud(LID, 0) };
    // (port enabled, packets, drops by cause)
    let table = [
        (false, vec![json!(hex(&ud(LID, 0))), json!(hex(&ud(LID, 1)))], json!({"port disabled": 2})),
        (true, vec![json!(hex(&ud(other, 0)))], json!({"DLID filtered": 1})),
        (
            true,
            vec![json!({"packet_hex": hex(&ebp), "test_ebp": 1}), json!({"packet_hex": hex(&ud(other, 0))})],
            json!({"bad end of packet (TestEBP)": 1, "DLID filtered": 1}),
        ),
    ];
    for (port_up, packets, drops) in table {
        let (h, _) = chip(Hfi1Config::wfr(), port_up);
        let n = packets.len();
        let reply = h.control(&batch_request(packets, 30_000)).unwrap();
        assert_eq!(reply["done"], true, "{reply}");
        assert!(reply["waited_us"].as_u64().unwrap() < 30_000_000, "woken by the worker: {reply}");
        assert_eq!((reply["placed"].as_u64(), reply["dropped"].as_u64()), (Some(0), Some(n as u64)), "{reply}");
        assert_eq!(reply["drops"], drops);
        assert_eq!(h.dump()["contexts"][0]["csrs"]["RCV_HDR_TAIL"], "0x0", "no entry placed");
    }
}

/// The head register is the driver's read position in the ring; entries are read in order, so a batch is done
/// once the head has passed the batch's last entry, whatever else arrived before or after it.
#[test]
fn a_placed_batch_is_done_only_once_the_head_passes_its_last_entry() {
    // (plain `wire` packets before the batch, batch packets, `wire` packets after, entries the head passes, done)
    let table = [
        (0, 3, 0, 0, false),
        (0, 3, 0, 2, false),
        (0, 3, 0, 3, true),
        (1, 3, 0, 3, false),
        (1, 3, 0, 4, true),
        (0, 3, 2, 3, true),
        (0, 3, 2, 5, true),
        (2, 0, 0, 1, false),
        (2, 0, 0, 2, true),
    ];
    for (before, size, after, passed, done) in table {
        let case = format!("before {before} batch {size} after {after} head {passed}");
        let (h, _) = hfi(true);
        let clock = FakeClock::default();
        for i in 0..before {
            assert!(h.wire(ud(LID, i)).unwrap());
        }
        let batch = h.start_wire_batch((0..size).map(|i| ud(LID, 100 + i)).collect(), &clock).unwrap();
        for i in 0..after {
            assert!(h.wire(ud(LID, 200 + i)).unwrap());
        }
        assert_eq!(batch.finished(&clock), None, "{case}: no head written yet");
        let _ = batch.nudged();
        head_past(&h, passed);
        assert!(batch.nudged(), "{case}: the head write wakes the waiter");
        clock.advance(Duration::from_micros(1500));
        match batch.finished(&clock) {
            Some(reply) => {
                assert!(done, "{case}: {reply}");
                let want = json!({"done": true, "placed": size, "dropped": 0, "drops": {}, "unjudged": 0,
                                  "waited_us": 1500});
                assert_eq!(reply, want, "{case}");
            }
            None => assert!(!done, "{case}: still waiting"),
        }
    }
}

/// A packet held at the port for a full header queue (DONT_DROP_RHQ_FULL) is not judged: the queue keeps one
/// entry free, so a batch of 64 into an empty 64-entry queue places 63 and holds one until the head moves.
#[test]
fn a_packet_held_for_room_is_not_judged_until_the_driver_frees_an_entry() {
    let (h, _) = hfi(true);
    let clock = FakeClock::default();
    let n = WIRE_BATCH_MAX as u64;
    assert_eq!(n, ENTRIES, "the batch fills the queue");
    let batch = h.start_wire_batch((0..n as u32).map(|i| ud(LID, i)).collect(), &clock).unwrap();
    let reply = batch.stalled_now(&clock);
    assert_eq!((reply["placed"].as_u64(), reply["unjudged"].as_u64()), (Some(ENTRIES - 1), Some(1)), "{reply}");
    assert_eq!(reply["where"]["ingress_held"], true, "{reply}");
    assert_eq!(reply["where"]["ingress_queued"], 1, "{reply}");
    head_past(&h, ENTRIES - 1);
    assert_eq!(batch.finished(&clock), None, "the held packet went in behind the head");
    head_past(&h, ENTRIES);
    let reply = batch.finished(&clock).expect("done once the head passed the 64th entry");
    assert_eq!((reply["done"].as_bool(), reply["placed"].as_u64()), (Some(true), Some(ENTRIES)), "{reply}");
}

/// At the deadline the reply says where the driver stopped: the context's head and tail as it reads them
/// (dwords: RCV_HDR_TAIL is what check_packet_present compares with the head, chip.c:8385), the entries pending,
/// and its RcvAvail interrupt (INTR_AVAIL on, source 256 pending in CCE_INT_STATUS, unmasked in CCE_INT_MASK).
#[test]
fn the_deadline_reply_says_where_the_driver_stopped() {
    let (h, irqs) = hfi(true);
    let reply = h.control(&batch_request(vec![json!(hex(&ud(LID, 0))), json!(hex(&ud(LID, 1)))], 0)).unwrap();
    assert!(irqs.wait_for(RCVAVAIL_VECTOR), "RcvAvail was sent");
    assert_eq!((reply["done"].as_bool(), reply["placed"].as_u64()), (Some(false), Some(2)), "{reply}");
    assert_eq!(reply["unjudged"], 0);
    let want = json!({
        "contexts": [{
            "ctxt": 0, "head": 0, "tail": 2 * ENTSIZE, "pending": 2, "batch_pending": 2,
            "rcvavail": {"enabled": true, "pending": true, "masked": false},
            "rcvurgent": {"pending": false, "masked": true},
        }],
        "ingress_queued": 0,
        "ingress_held": false,
    });
    assert_eq!(reply["where"], want);
}

/// The waiter sleeps until the driver's head write wakes it: the control request blocks on its own thread, the
/// driver's interrupt (RcvAvail) comes, and its head write ends the wait long before the deadline.
#[test]
fn the_head_write_wakes_a_waiting_batch() {
    let (h, irqs) = hfi(true);
    let h = Arc::new(h);
    let request = batch_request(vec![json!(hex(&ud(LID, 0)))], 30_000);
    let waiter = {
        let h = Arc::clone(&h);
        std::thread::spawn(move || h.control(&request))
    };
    assert!(irqs.wait_for(RCVAVAIL_VECTOR), "RcvAvail: the entry is there");
    head_past(&h, 1);
    let reply = waiter.join().unwrap().unwrap();
    assert_eq!((reply["done"].as_bool(), reply["placed"].as_u64()), (Some(true), Some(1)), "{reply}");
    assert!(reply["waited_us"].as_u64().unwrap() < 30_000_000, "woken by the head write: {reply}");
}

/// A reset throws the port's queue and the header queues away: a waiting batch ends at once, saying so.
#[test]
fn a_reset_ends_a_waiting_batch() {
    let (h, _) = hfi(true);
    let clock = FakeClock::default();
    let batch = h.start_wire_batch(vec![ud(LID, 0)], &clock).unwrap();
    let _ = batch.nudged();
    Engine::reset(&h);
    assert!(batch.nudged(), "the reset wakes the waiter");
    let reply = batch.finished(&clock).expect("over");
    assert_eq!((reply["done"].as_bool(), reply["reset"].as_bool()), (Some(false), Some(true)), "{reply}");
}

/// Every field is checked as `wire` checks it, before anything is queued; a batch over the bound is refused.
#[test]
fn a_malformed_or_oversized_batch_queues_nothing() {
    let good = json!(hex(&ud(LID, 0)));
    let table = [
        json!({"cmd": "wire-batch"}),
        json!({"cmd": "wire-batch", "packets": "00"}),
        json!({"cmd": "wire-batch", "packets": [good, "zz"]}),
        json!({"cmd": "wire-batch", "packets": [good, "f002"]}),
        json!({"cmd": "wire-batch", "packets": [good, 7]}),
        json!({"cmd": "wire-batch", "packets": [good, {"hex": good}]}),
        json!({"cmd": "wire-batch", "packets": [good, {"packet_hex": good, "sc4": 2}]}),
        json!({"cmd": "wire-batch", "packets": [good], "wait_ms": 60_001}),
        json!({"cmd": "wire-batch", "packets": [good], "wait_ms": -1}),
        json!({"cmd": "wire-batch", "packets": [good], "wait_ms": "1"}),
        json!({"cmd": "wire-batch", "packets": vec![good.clone(); WIRE_BATCH_MAX + 1]}),
    ];
    for req in table {
        let (h, _) = hfi(true);
        let err = h.control(&req).unwrap_err();
        assert_eq!(err.matches("bad control request").count(), 1, "{err}");
        assert_eq!(h.counters().into_iter().find(|(n, _)| *n == "wire_rx_packets"), Some(("wire_rx_packets", 0)));
    }
    let lb = Hfi1::new(Hfi1Config::default().inline()).unwrap();
    let err = lb.control(&batch_request(vec![good], 0)).unwrap_err();
    assert!(err.contains("no port"), "{err}");
}

/// The control socket serves a bounded number of clients; the batches waiting at once are bounded too.
#[test]
fn batches_waiting_at_once_are_bounded() {
    let (h, _) = hfi(true);
    let clock = FakeClock::default();
    let waiting: Vec<_> = (0..BATCH_WAITERS).map(|i| h.start_wire_batch(vec![ud(LID, i as u32)], &clock)).collect();
    assert!(waiting.iter().all(Result::is_ok));
    assert!(h.start_wire_batch(vec![ud(LID, 99)], &clock).is_err());
    let arrived = h.counters().into_iter().find(|(n, _)| *n == "wire_rx_packets").map(|(_, v)| v);
    assert_eq!(arrived, Some(BATCH_WAITERS as u64), "the refused batch queued nothing");
    drop(waiting);
    assert!(h.start_wire_batch(vec![], &clock).is_ok(), "a finished wait gives its place back");
}
