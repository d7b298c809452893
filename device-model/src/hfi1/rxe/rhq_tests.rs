//! Header queue and eager placement against what the driver programs (hfi1_rcvctrl, hfi1_setup_eagerbufs)
//! and what it reads back (driver.c): expected values come from those, not from the model.

#![forbid(unsafe_code)]

use super::*;
use crate::hfi1::shm::SharedWords;

const CTXT: usize = 1;
const HDRQ: u64 = 0x10_0000;
const TAIL: u64 = 0x20_0000;
const EAGER: u64 = 0x40_0000;
/// rcvhdrcnt 64, hdrq_entsize 32 dwords, 8 eager buffers of 16 KiB (the project's module parameters).
const ENTRIES: u64 = 64;
const ENTSIZE: u64 = 32;
const EGR_BUFS: u64 = 8;
const EGR_SIZE: u64 = 16 * 1024;

/// The context as hfi1_rcvctrl enables it, with `ctrl_extra` bits on top of ENABLE, INTR_AVAIL and the
/// 16 KiB eager size.
fn chip(ctrl_extra: u64) -> (Chip, Counters) {
    let n = Counters::default();
    let mut c = Chip::new(4, SharedWords::new("rhq", RCV_ARRAY, 4096).unwrap(), false);
    let k = |reg| kctxt_csr(reg, CTXT as u64);
    c.write(k(RCV_HDR_ADDR), HDRQ, &n);
    c.write(k(RCV_HDR_CNT), ENTRIES >> HDRQ_SIZE_SHIFT, &n);
    c.write(k(RCV_HDR_ENT_SIZE), 4, &n);
    c.write(k(RCV_HDR_TAIL_ADDR), TAIL, &n);
    c.write(k(RCV_EGR_CTRL), (EGR_BUFS >> RCV_SHIFT) << RCV_EGR_CTRL_EGR_CNT_SHIFT, &n);
    for i in 0..EGR_BUFS {
        // hfi1_put_tid(PT_EAGER): WRITE_ENABLE, size code log2(16K / 4K) + 1 = 3, address in 4 KiB units.
        let addr = (EAGER + i * EGR_SIZE) >> 12;
        c.write(RCV_ARRAY + 8 * i, (1 << 63) | (3 << 36) | addr, &n);
    }
    let ctrl = RCV_CTXT_CTRL_ENABLE_SMASK | RCV_CTXT_CTRL_INTR_AVAIL_SMASK | (3 << RCV_CTXT_CTRL_EGR_BUF_SIZE_SHIFT);
    c.write(k(RCV_CTXT_CTRL), ctrl | ctrl_extra, &n);
    (c, n)
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
    let (mut c, n) = chip(RCV_CTXT_CTRL_TAIL_UPD_SMASK);
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
    assert_eq!(tail, crate::hfi1::rxe::chip::Access::Done(ENTSIZE));
}

#[test]
fn packets_pack_into_an_eager_buffer_at_64_byte_offsets_and_move_on_when_one_does_not_fit() {
    let (mut c, n) = chip(0);
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
    let (mut c, n) = chip(0);
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
    let (mut c, n) = chip(0);
    let p = c.rhq_reserve(CTXT, &arrive(&[0; 24], &[0; 4]), &n).unwrap();
    assert_eq!((p.rhf & RHF_USE_EGR_BFR, p.eager), (0, None));
}

#[test]
fn a_full_header_queue_holds_with_dont_drop_and_drops_without() {
    for (dont_drop, want) in [(true, Err(Refusal::Hold(Full::Rhq))), (false, Err(Refusal::Drop("header queue full")))] {
        let extra = if dont_drop { RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK } else { 0 };
        let (mut c, n) = chip(extra);
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
    let (mut c, n) = chip(RCV_CTXT_CTRL_DONT_DROP_EGR_FULL_SMASK);
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
    let (mut c, n) = chip(0);
    c.rhq_reserve(CTXT, &arrive(&[0; 24], &[0; 4]), &n).unwrap();
    let k = kctxt_csr(RCV_CTXT_CTRL, CTXT as u64);
    let ctrl = match c.read(k, &n) {
        crate::hfi1::rxe::chip::Access::Done(v) => v,
        a => panic!("{a:?}"),
    };
    c.write(k, ctrl & !RCV_CTXT_CTRL_ENABLE_SMASK, &n);
    c.write(k, ctrl, &n);
    let p = c.rhq_reserve(CTXT, &arrive(&[0; 24], &[0; 4]), &n).unwrap();
    assert_eq!((p.rhf_at, rhf_field(p.rhf, 28, 0xF)), (HDRQ + (ENTSIZE - 2) * 4, 1));
}

#[test]
fn contexts_that_cannot_take_a_packet_drop_it_by_cause() {
    let (mut c, n) = chip(0);
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
