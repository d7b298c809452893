//! Header queue and eager placement against what the driver programs (hfi1_rcvctrl, hfi1_setup_eagerbufs)
//! and what it reads back (driver.c): expected values come from those, not from the model.

#![forbid(unsafe_code)]

use super::*;
use crate::hfi1::rxe::test_context::{self, EAGER, EGR_BUFS, EGR_SIZE, ENTRIES, ENTSIZE, HDRQ};

const CTXT: usize = 1;
const TAIL: u64 = 0x20_0000;

/// The context as hfi1_rcvctrl enables it, its tail written to TAIL, with `ctrl_extra` bits on top of ENABLE,
/// INTR_AVAIL and the 16 KiB eager size.
fn rxe(ctrl_extra: u64) -> (Rxe, Counters) {
    test_context::enabled("rhq", CTXT, ctrl_extra, |c, n| {
        c.write(kctxt_csr(RCV_HDR_TAIL_ADDR, CTXT as u64), TAIL, n);
    })
}

/// A packet of `hdr` header bytes and `rest` bytes of payload, pad and ICRC.
fn arrive<'a>(header: &'a [u8], rest: &'a [u8]) -> Arrival<'a> {
    Arrival::ib(header, rest, rest.len() > 4, false, true)
}

fn rhf_field(rhf: u64, shift: u32, mask: u64) -> u64 {
    (rhf >> shift) & mask
}

#[test]
fn the_first_packet_takes_entry_0_with_sequence_1_and_its_header_against_the_rhf() {
    let (mut c, n) = rxe(RCV_CTXT_CTRL_TAIL_UPD_SMASK);
    let (hdr, rest) = ([0u8; 28], [0u8; 260]); // UD: LRH + BTH + DETH, a 256-byte MAD and the ICRC
    let p = c.rhq_reserve(CTXT, &arrive(&hdr, &rest), &n).unwrap();
    // The RHF is the entry's last two dwords (rhf_offset = entsize - 2); the header ends where it starts.
    assert_eq!(p.rhf_at, HDRQ + (ENTSIZE - 2) * 4);
    assert_eq!(p.header_at, p.rhf_at - 28);
    assert_eq!(rhf_field(p.rhf, 44, 0x1FF), ENTSIZE - 2 - 7, "HdrqOffset: hfi1_get_header finds the header");
    assert_eq!(rhf_field(p.rhf, 0, 0xFFF), (28 + 260) / 4, "PktLen in dwords");
    assert_eq!(rhf_field(p.rhf, 12, 0x7), RHF_RCV_TYPE_IB);
    assert_eq!(rhf_field(p.rhf, 28, 0xF), 1, "RcvSeq starts at 1 (hfi1_set_seq_cnt(rcd, 1))");
    assert_ne!(p.rhf & RHF_USE_EGR_BFR, 0);
    assert_eq!((rhf_field(p.rhf, 16, 0x7FF), rhf_field(p.rhf, 32, 0xFFF)), (0, 0));
    assert_eq!(p.eager, Some(EAGER));
    // The tail counts dwords, like the driver's head (hfi1_rcd_head vs RCV_HDR_TAIL).
    assert_eq!(p.tail, Some((TAIL, ENTSIZE)));
    assert!(p.interrupt);
    c.rhq_publish(CTXT, p.published);
    let tail = c.read(uctxt_csr(RCV_HDR_TAIL, CTXT as u64), &n);
    assert_eq!(tail, crate::hfi1::rxe::state::Access::Done(ENTSIZE));
}

#[test]
fn packets_pack_into_an_eager_buffer_at_64_byte_offsets_and_move_on_when_one_does_not_fit() {
    let (mut c, n) = rxe(0);
    let hdr = [0u8; 20];
    // (payload bytes, EgrIndex, EgrOffset in 64-byte blocks)
    let table = [(100, 0, 0), (64, 0, 2), (16000, 0, 3), (16000, 1, 0), (4, 1, 250)];
    for (i, (len, index, offset)) in table.into_iter().enumerate() {
        let rest = vec![0u8; len];
        let a = Arrival { has_payload: true, ..arrive(&hdr, &rest) };
        let p = c.rhq_reserve(CTXT, &a, &n).unwrap_or_else(|e| panic!("packet {i}: {e:?}"));
        assert_eq!((rhf_field(p.rhf, 16, 0x7FF), rhf_field(p.rhf, 32, 0xFFF)), (index, offset), "packet {i}");
        assert_eq!(p.eager, Some(EAGER + index * EGR_SIZE + offset * 64));
        assert_eq!(p.tail, None, "no TAIL_UPD");
    }
}

#[test]
fn sequence_numbers_run_1_to_13_and_wrap_to_1() {
    let (mut c, n) = rxe(0);
    let hdr = [0u8; 24];
    let seqs: Vec<u64> = (0..15)
        .map(|_| {
            let p = c.rhq_reserve(CTXT, &arrive(&hdr, &[0; 4]), &n).unwrap();
            rhf_field(p.rhf, 28, 0xF)
        })
        .collect();
    assert_eq!(seqs, vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 1, 2]);
}

#[test]
fn a_packet_without_payload_takes_no_eager_buffer() {
    let (mut c, n) = rxe(0);
    let p = c.rhq_reserve(CTXT, &arrive(&[0; 24], &[0; 4]), &n).unwrap();
    assert_eq!((p.rhf & RHF_USE_EGR_BFR, p.eager), (0, None));
}

#[test]
fn a_full_header_queue_holds_with_dont_drop_and_drops_without() {
    for (dont_drop, want) in [(true, Err(Refusal::Hold(Full::Rhq))), (false, Err(Refusal::Drop("header queue full")))] {
        let extra = if dont_drop { RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK } else { 0 };
        let (mut c, n) = rxe(extra);
        // The head stays at 0: 63 entries fit, the 64th would make the tail meet it.
        for _ in 0..ENTRIES - 1 {
            c.rhq_reserve(CTXT, &arrive(&[0; 24], &[0; 4]), &n).unwrap();
        }
        assert_eq!(c.rhq_reserve(CTXT, &arrive(&[0; 24], &[0; 4]), &n), want);
        // update_usrhead moves the head past 16 entries: room again.
        c.write(uctxt_csr(RCV_HDR_HEAD, CTXT as u64), 16 * ENTSIZE, &n);
        assert!(c.rhq_reserve(CTXT, &arrive(&[0; 24], &[0; 4]), &n).is_ok());
    }
}

#[test]
fn eager_buffers_wrap_only_past_the_drivers_eager_head() {
    let (mut c, n) = rxe(RCV_CTXT_CTRL_DONT_DROP_EGR_FULL_SMASK);
    let big = vec![0u8; EGR_SIZE as usize];
    let a = Arrival { has_payload: true, ..arrive(&[0; 20], &big) };
    for i in 0..EGR_BUFS {
        let p = c.rhq_reserve(CTXT, &a, &n).unwrap();
        assert_eq!(rhf_field(p.rhf, 16, 0x7FF), i);
    }
    // Buffer 0 is the one the driver still reads (RCV_EGR_INDEX_HEAD 0).
    assert_eq!(c.rhq_reserve(CTXT, &a, &n), Err(Refusal::Hold(Full::Eager)));
    c.write(uctxt_csr(RCV_EGR_INDEX_HEAD, CTXT as u64), 4, &n);
    let p = c.rhq_reserve(CTXT, &a, &n).unwrap();
    assert_eq!(rhf_field(p.rhf, 16, 0x7FF), 0);
}

#[test]
fn re_enabling_a_context_restarts_its_queue() {
    let (mut c, n) = rxe(0);
    c.rhq_reserve(CTXT, &arrive(&[0; 24], &[0; 4]), &n).unwrap();
    let k = kctxt_csr(RCV_CTXT_CTRL, CTXT as u64);
    let ctrl = match c.read(k, &n) {
        crate::hfi1::rxe::state::Access::Done(v) => v,
        a => panic!("{a:?}"),
    };
    c.write(k, ctrl & !RCV_CTXT_CTRL_ENABLE_SMASK, &n);
    c.write(k, ctrl, &n);
    let p = c.rhq_reserve(CTXT, &arrive(&[0; 24], &[0; 4]), &n).unwrap();
    assert_eq!((p.rhf_at, rhf_field(p.rhf, 28, 0xF)), (HDRQ + (ENTSIZE - 2) * 4, 1));
}

#[test]
fn contexts_that_cannot_take_a_packet_drop_it_by_cause() {
    let (mut c, n) = rxe(0);
    assert_eq!(c.rhq_reserve(2, &arrive(&[0; 24], &[0; 4]), &n), Err(Refusal::Drop("context disabled")));
    // A header longer than an entry of 32 dwords less the RHF.
    assert_eq!(c.rhq_reserve(CTXT, &arrive(&[0; 124], &[0; 4]), &n), Err(Refusal::Drop("header longer than an entry")));
    let huge = vec![0u8; EGR_SIZE as usize + 64];
    let a = Arrival { has_payload: true, ..arrive(&[0; 20], &huge) };
    assert_eq!(c.rhq_reserve(CTXT, &a, &n), Err(Refusal::Drop("packet larger than an eager buffer")));
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(
        (n.rx_context_disabled.load(Relaxed), n.rx_header_too_long.load(Relaxed), n.rx_eager_too_small.load(Relaxed)),
        (1, 1, 1)
    );
}

/// A change of a live context's ring: why, the (register, value) writes, and the ring they program (entries,
/// dwords per entry).
type Shrink = (&'static str, &'static [(u64, u64)], u64, u64);

/// The bytes each of `plans` writes to its header queue entry, `(first, last)`.
fn entries(plans: &[Plan]) -> Vec<(u64, u64)> {
    plans.iter().map(|p| (p.header_at, p.rhf_at + (RHF_BYTES as u64 - 1))).collect()
}

#[test]
fn a_live_context_whose_ring_shrinks_places_every_later_entry_inside_the_ring_now_programmed() {
    // (what changes after 40 packets, RCV_HDR_CNT and RCV_HDR_ENT_SIZE written then; the ring as they program it:
    // entries, dwords). The kernel programs neither on a live context (set_hdrq_regs runs before hfi1_rcvctrl
    // enables it): the tail wraps into the new ring (docs/decisions.md).
    let table: [Shrink; 5] = [
        ("RCV_HDR_CNT 64 -> 32", &[(RCV_HDR_CNT, 1)], 32, 32),
        ("RCV_HDR_ENT_SIZE 32 -> 16 dwords", &[(RCV_HDR_ENT_SIZE, 2)], 64, 16),
        ("both shrink", &[(RCV_HDR_CNT, 1), (RCV_HDR_ENT_SIZE, 2)], 32, 16),
        ("RCV_HDR_CNT 0, then 32", &[(RCV_HDR_CNT, 0), (RCV_HDR_CNT, 1)], 32, 32),
        ("RCV_HDR_CNT 64 -> 32 -> 64", &[(RCV_HDR_CNT, 1), (RCV_HDR_CNT, 2)], 64, 32),
    ];
    for (why, writes, entries_now, dwords_now) in table {
        let (mut c, n) = rxe(RCV_CTXT_CTRL_TAIL_UPD_SMASK);
        let packet = |c: &mut Rxe| c.rhq_reserve(CTXT, &arrive(&[0; 24], &[0; 4]), &n);
        for _ in 0..40 {
            let p = packet(&mut c).unwrap();
            c.rhq_publish(CTXT, p.published);
            // update_usrhead: the driver keeps up, so the queue never fills.
            c.write(uctxt_csr(RCV_HDR_HEAD, CTXT as u64), p.published, &n);
        }
        for &(reg, v) in writes {
            c.write(kctxt_csr(reg, CTXT as u64), v, &n);
        }
        // The driver reads up to RCV_HDR_TAIL (in the new entry size): room for all but one entry.
        let tail = c.read(uctxt_csr(RCV_HDR_TAIL, CTXT as u64), &n);
        let crate::hfi1::rxe::state::Access::Done(tail) = tail else { panic!("{why}: {tail:?}") };
        c.write(uctxt_csr(RCV_HDR_HEAD, CTXT as u64), tail, &n);
        let ring = (HDRQ, HDRQ + entries_now * dwords_now * 4);
        let plans: Vec<Plan> = (0..2 * entries_now).map_while(|_| packet(&mut c).ok()).collect();
        assert_eq!(plans.len() as u64, entries_now - 1, "{why}: the ring holds one entry fewer than its size");
        for (start, end) in entries(&plans) {
            assert!(start >= ring.0 && end < ring.1, "{why}: entry {start:#x}..={end:#x} outside {ring:x?}");
        }
        for p in &plans {
            let (at, tail) = p.tail.unwrap();
            assert_eq!(at, TAIL, "{why}");
            assert!(tail < entries_now * dwords_now && tail % dwords_now == 0, "{why}: tail {tail} outside the ring");
        }
    }
}

#[test]
fn a_header_queue_or_tail_at_the_top_of_the_address_space_drops_the_packet_instead_of_wrapping() {
    use std::sync::atomic::Ordering::Relaxed;
    // (RCV_HDR_ADDR, RCV_HDR_TAIL_ADDR, entries placed before an entry would cross 2^64)
    let table = [
        (u64::MAX - 0xFF, TAIL, 2),
        (u64::MAX - 0x7F, TAIL, 1),
        (u64::MAX - 0x7E, TAIL, 0),
        (u64::MAX, TAIL, 0),
        (HDRQ, u64::MAX - 7, 63),
        (HDRQ, u64::MAX - 3, 0),
    ];
    for (hdrq, tail, placed) in table {
        let (mut c, n) = rxe(RCV_CTXT_CTRL_TAIL_UPD_SMASK);
        c.write(kctxt_csr(RCV_HDR_ADDR, CTXT as u64), hdrq, &n);
        c.write(kctxt_csr(RCV_HDR_TAIL_ADDR, CTXT as u64), tail, &n);
        let results: Vec<_> = (0..ENTRIES).map(|_| c.rhq_reserve(CTXT, &arrive(&[0; 24], &[0; 4]), &n)).collect();
        let plans: Vec<Plan> = results.iter().filter_map(|r| r.clone().ok()).collect();
        assert_eq!(plans.len(), placed, "{hdrq:#x} {tail:#x}");
        for (start, end) in entries(&plans) {
            assert!(start >= hdrq && end > start, "{hdrq:#x}: entry {start:#x}..={end:#x} wrapped");
        }
        let beyond =
            results.iter().filter(|r| **r == Err(Refusal::Drop("header queue or tail address beyond 64 bits")));
        assert_eq!(beyond.count() as u64, n.rx_rhq_bad_address.load(Relaxed), "{hdrq:#x} {tail:#x}");
        assert!(placed == 63 || n.rx_rhq_bad_address.load(Relaxed) > 0, "{hdrq:#x} {tail:#x}");
    }
}

/// The chip personality's receive path end to end, its DMA recorded: what the port writes for packets from
/// the cable.
mod through_the_port {
    use std::sync::{Arc, Mutex};

    use vfio_user_proto::dma::{DmaAccess, DmaError, HeapMemory};

    use super::{Shrink, ENTRIES, ENTSIZE, HDRQ, TAIL};
    use crate::engine::{Engine, NoInterrupt};
    use crate::hfi1::cable::wire::WirePacket;
    use crate::hfi1::regs::*;
    use crate::hfi1::{Hfi1, Hfi1Config, HFI1_BAR};

    /// Memory that records the address and length of every device write, before it is tried.
    #[derive(Default)]
    struct Recorder {
        mem: HeapMemory,
        writes: Mutex<Vec<(u64, u64)>>,
    }

    impl DmaAccess for Recorder {
        fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
            self.mem.read(iova, buf)
        }
        fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
            self.writes.lock().unwrap().push((iova, buf.len() as u64));
            self.mem.write(iova, buf)
        }
    }

    struct Port {
        hfi: Hfi1,
        mem: Arc<Recorder>,
    }

    impl Port {
        /// Context 0 (where packets go while the QP map is off) enabled as hfi1_rcvctrl enables it, with
        /// TAIL_UPD: 64 entries of 32 dwords at `hdrq`; the port enabled (RcvPortEnable).
        fn new(hdrq: u64) -> Port {
            let hfi = Hfi1::new(Hfi1Config::wfr().inline()).unwrap();
            let mem = Arc::new(Recorder::default());
            assert!(mem.mem.map(HDRQ, 0x10000) && mem.mem.map(TAIL, 0x1000));
            hfi.attach(mem.clone(), Arc::new(NoInterrupt));
            let p = Port { hfi, mem };
            p.k(RCV_HDR_ADDR, hdrq);
            p.k(RCV_HDR_CNT, ENTRIES >> 5);
            p.k(RCV_HDR_ENT_SIZE, 4);
            p.k(RCV_HDR_TAIL_ADDR, TAIL);
            p.k(RCV_CTXT_CTRL, RCV_CTXT_CTRL_ENABLE_SMASK | RCV_CTXT_CTRL_TAIL_UPD_SMASK);
            p.w(RCV_CTRL, RCV_CTRL_RCV_PORT_ENABLE_SMASK);
            p
        }
        fn w(&self, offset: u64, v: u64) {
            self.hfi.mmio_write(HFI1_BAR, offset, &v.to_le_bytes());
        }
        fn r(&self, offset: u64) -> u64 {
            let mut b = [0; 8];
            self.hfi.mmio_read(HFI1_BAR, offset, &mut b);
            u64::from_le_bytes(b)
        }
        fn k(&self, reg: u64, v: u64) {
            self.w(kctxt_csr(reg, 0), v);
        }
        /// An RC SEND_ONLY without payload to the permissive DLID: LRH and BTH make the header, no eager buffer.
        fn send(&self) {
            let mut b = vec![0u8; 20];
            b[1] = 0x2; // LNH: BTH follows the LRH
            b[2..4].copy_from_slice(&0xFFFFu16.to_be_bytes());
            b[4..6].copy_from_slice(&6u16.to_be_bytes());
            b[8] = 0x04;
            assert!(self.hfi.wire(WirePacket::seal(b, false, false).unwrap()).unwrap());
        }
        fn take_writes(&self) -> Vec<(u64, u64)> {
            std::mem::take(&mut *self.mem.writes.lock().unwrap())
        }
    }

    #[test]
    fn a_context_whose_ring_shrinks_while_live_never_writes_outside_the_ring_now_programmed() {
        // (what the guest writes after 40 packets; the ring then: entries, dwords per entry)
        let table: [Shrink; 4] = [
            ("RCV_HDR_CNT 64 -> 32", &[(RCV_HDR_CNT, 1)], 32, ENTSIZE),
            ("RCV_HDR_ENT_SIZE 32 -> 16 dwords", &[(RCV_HDR_ENT_SIZE, 2)], 64, 16),
            ("both shrink", &[(RCV_HDR_CNT, 1), (RCV_HDR_ENT_SIZE, 2)], 32, 16),
            ("RCV_HDR_CNT 0, then 32", &[(RCV_HDR_CNT, 0), (RCV_HDR_CNT, 1)], 32, ENTSIZE),
        ];
        for (why, writes, entries, dwords) in table {
            let p = Port::new(HDRQ);
            for _ in 0..40 {
                p.send();
                // update_usrhead: the driver keeps up with the tail it reads.
                p.w(uctxt_csr(RCV_HDR_HEAD, 0), p.r(uctxt_csr(RCV_HDR_TAIL, 0)));
            }
            assert_eq!(p.take_writes().len(), 40 * 3, "{why}: header, RHF and tail of each packet");
            for &(reg, v) in writes {
                p.k(reg, v);
            }
            p.w(uctxt_csr(RCV_HDR_HEAD, 0), p.r(uctxt_csr(RCV_HDR_TAIL, 0)));
            for _ in 0..2 * entries {
                p.send();
            }
            let ring = HDRQ..HDRQ + entries * dwords * 4;
            let written = p.take_writes();
            // All but one entry of the ring fill before the tail meets the head; the rest are dropped.
            assert_eq!(written.len() as u64, (entries - 1) * 3, "{why}");
            for (at, len) in written {
                let inside = (ring.contains(&at) && at + len <= ring.end) || (at, len) == (TAIL, 8);
                assert!(inside, "{why}: a write of {len} bytes at {at:#x}, the ring is {ring:x?}");
            }
        }
    }

    #[test]
    fn a_header_queue_at_the_top_of_the_address_space_never_wraps_into_low_memory() {
        // (RCV_HDR_ADDR, entries that lie below 2^64)
        for (hdrq, fit) in [(u64::MAX - 0xFF, 2u64), (u64::MAX - 0x7F, 1), (u64::MAX - 3, 0), (u64::MAX, 0)] {
            let p = Port::new(hdrq);
            for _ in 0..4 {
                p.send();
            }
            let written = p.take_writes();
            // The header of each entry that fits; nothing is mapped there, so that write fails and the
            // packet's later writes are skipped (counted as DMA errors).
            assert_eq!(written.len() as u64, fit, "{hdrq:#x}");
            assert!(written.iter().all(|&(at, len)| at >= hdrq && at.checked_add(len - 1).is_some()), "{hdrq:#x}");
            let dropped = p.hfi.counters().into_iter().find(|(n, _)| *n == "rx_rhq_bad_address").map(|(_, v)| v);
            assert_eq!(dropped, Some(4 - fit), "{hdrq:#x}");
        }
    }
}

/// RcvEgrIndexTail and RcvEgrOffsetTail (user page qwords 2 and 4, hfi1_user.h) read where the chip is in its
/// eager buffers: the buffer the last packet went to and the 64-byte block after it. PSM2's overflow recovery
/// takes the eager array as full when head == tail + 1 (mod count), which is when the chip holds (the test
/// above). Enabling restarts at buffer 0, as hfi1_rcvctrl zeroes RcvEgrIndexHead with it (chip.c:12050).
#[test]
fn the_eager_tails_read_the_buffer_and_the_next_block_the_chip_wrote() {
    let (mut c, n) = rxe(0);
    let tails = |c: &mut Rxe| {
        let r = |c: &mut Rxe, reg| match c.read(uctxt_csr(reg, CTXT as u64), &n) {
            crate::hfi1::rxe::state::Access::Done(v) => v,
            a => panic!("{a:?}"),
        };
        (r(c, RCV_EGR_INDEX_TAIL), r(c, RCV_EGR_OFFSET_TAIL))
    };
    assert_eq!(tails(&mut c), (0, 0));
    // (payload bytes, tails after it): 100 B takes blocks 0-1, 64 B block 2, 16000 B blocks 3-252 of buffer 0;
    // the next 16000 B do not fit its 3 blocks left and take blocks 0-249 of buffer 1, then 4 B block 250.
    let table = [(100, (0, 2)), (64, (0, 3)), (16000, (0, 253)), (16000, (1, 250)), (4, (1, 251))];
    for (len, want) in table {
        let rest = vec![0u8; len];
        c.rhq_reserve(CTXT, &Arrival { has_payload: true, ..arrive(&[0; 20], &rest) }, &n).unwrap();
        assert_eq!(tails(&mut c), want, "after {len} bytes");
    }
    // Read-only: a write changes nothing.
    for reg in [RCV_EGR_INDEX_TAIL, RCV_EGR_OFFSET_TAIL] {
        let at = uctxt_csr(reg, CTXT as u64);
        assert_eq!(c.write(at, 0, &n), crate::hfi1::rxe::state::Access::ReadOnly);
    }
    assert_eq!(tails(&mut c), (1, 251));
    let k = kctxt_csr(RCV_CTXT_CTRL, CTXT as u64);
    let crate::hfi1::rxe::state::Access::Done(ctrl) = c.read(k, &n) else { panic!() };
    c.write(k, ctrl & !RCV_CTXT_CTRL_ENABLE_SMASK, &n);
    c.write(k, ctrl, &n);
    assert_eq!(tails(&mut c), (0, 0));
}
