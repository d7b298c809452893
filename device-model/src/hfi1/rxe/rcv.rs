//! The receive engine: checks a TID RDMA data packet against its context, flow and RcvArray entry, and
//! places the payload. Checking happens under the RXE lock; the DMA happens after it is dropped.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use vfio_user_proto::dma::{DmaAccess, DmaError};

use super::flow::FlowCheck;
use super::state::Rxe;
use crate::hfi1::counters::Counters;
use crate::hfi1::regs::{RCV_CTXT_CTRL_ENABLE_SMASK, RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK};

// KDETH word 0 fields (reference §1.10).
pub const KDETH_OFFSET_SHIFT: u32 = 0;
pub const KDETH_OFFSET_MASK: u32 = 0x7FFF;
pub const KDETH_OM_SHIFT: u32 = 15;
pub const KDETH_OM_MASK: u32 = 0x1;
pub const KDETH_TID_SHIFT: u32 = 16;
pub const KDETH_TID_MASK: u32 = 0x3FF;
pub const KDETH_TIDCTRL_SHIFT: u32 = 26;
pub const KDETH_TIDCTRL_MASK: u32 = 0x3;
/// OFFSET unit when OM = 0: 4 bytes.
pub const KDETH_OM_SMALL_SHIFT: u32 = 2;
/// OFFSET unit when OM = 1: 64 bytes.
pub const KDETH_OM_LARGE_SHIFT: u32 = 6;
/// TIDCTRL of a packet for the even entry of its pair.
pub const TIDCTRL_EVEN: u32 = 1;
/// TIDCTRL of a packet for the odd entry of its pair.
pub const TIDCTRL_ODD: u32 = 2;
/// TIDCTRL of a packet for both entries of its pair (a tidarray entry with CTRL 3): the offset runs through
/// the even entry's buffer and continues in the odd one's.
pub const TIDCTRL_PAIR: u32 = 3;

// Destination QP of a TID RDMA packet (tid_flow_qp): context in bits 7:0, flow in bits 15:11.
pub const TID_RDMA_DESTQP_CTXT_MASK: u32 = 0xFF;
pub const TID_RDMA_DESTQP_FLOW_SHIFT: u32 = 11;
pub const TID_RDMA_DESTQP_FLOW_MASK: u32 = 0x1F;

// Flow PSN (full_flow_psn).
pub const HFI1_KDETH_BTH_SEQ_SHIFT: u32 = 11;
pub const HFI1_KDETH_BTH_SEQ_MASK: u32 = 0x7FF;
pub const GENERATION_MASK: u32 = 0xFFFFF;
pub const PSN_MASK: u32 = 0x7FFF_FFFF;

/// full_flow_psn(flow, psn): the generation above the 11-bit sequence.
pub fn full_flow_psn(generation: u32, psn: u32) -> u32 {
    (((generation & GENERATION_MASK) << HFI1_KDETH_BTH_SEQ_SHIFT) | (psn & HFI1_KDETH_BTH_SEQ_MASK)) & PSN_MASK
}

/// The header fields of a TID RDMA data packet the engine uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Packet {
    /// KDETH word 0: OFFSET, OM, TID, TIDCTRL (other bits ignored).
    pub kdeth0: u32,
    /// BTH destination QP: receive context in bits 7:0, flow index in bits 15:11 (other bits ignored).
    pub dest_qp: u32,
    /// BTH PSN: generation in bits 30:11, sequence in bits 10:0.
    pub psn: u32,
}

impl Packet {
    pub fn ctxt(&self) -> usize {
        (self.dest_qp & TID_RDMA_DESTQP_CTXT_MASK) as usize
    }
    pub fn flow(&self) -> usize {
        ((self.dest_qp >> TID_RDMA_DESTQP_FLOW_SHIFT) & TID_RDMA_DESTQP_FLOW_MASK) as usize
    }
    pub fn tid(&self) -> u32 {
        (self.kdeth0 >> KDETH_TID_SHIFT) & KDETH_TID_MASK
    }
    pub fn tidctrl(&self) -> u32 {
        (self.kdeth0 >> KDETH_TIDCTRL_SHIFT) & KDETH_TIDCTRL_MASK
    }
    /// Byte offset in the entry's buffer: OFFSET in 4-byte (OM = 0) or 64-byte (OM = 1) units.
    pub fn offset_bytes(&self) -> u64 {
        let units = u64::from((self.kdeth0 >> KDETH_OFFSET_SHIFT) & KDETH_OFFSET_MASK);
        let om = (self.kdeth0 >> KDETH_OM_SHIFT) & KDETH_OM_MASK;
        units << if om == 0 { KDETH_OM_SMALL_SHIFT } else { KDETH_OM_LARGE_SHIFT }
    }
    pub fn generation(&self) -> u32 {
        (self.psn >> HFI1_KDETH_BTH_SEQ_SHIFT) & GENERATION_MASK
    }
    pub fn sequence(&self) -> u16 {
        (self.psn & HFI1_KDETH_BTH_SEQ_MASK) as u16
    }
    /// Builds kdeth0 from its fields (values are masked to their widths).
    pub fn kdeth0(offset: u32, om: bool, tid: u32, tidctrl: u32) -> u32 {
        ((offset & KDETH_OFFSET_MASK) << KDETH_OFFSET_SHIFT)
            | (u32::from(om) << KDETH_OM_SHIFT)
            | ((tid & KDETH_TID_MASK) << KDETH_TID_SHIFT)
            | ((tidctrl & KDETH_TIDCTRL_MASK) << KDETH_TIDCTRL_SHIFT)
    }
    /// Builds dest_qp from a context and flow index.
    pub fn dest_qp(ctxt: u32, flow: u32) -> u32 {
        (ctxt & TID_RDMA_DESTQP_CTXT_MASK) | ((flow & TID_RDMA_DESTQP_FLOW_MASK) << TID_RDMA_DESTQP_FLOW_SHIFT)
    }
}

/// What became of one packet (the loopback LB_LAST_RESULT code): part of the project's own ABI.
pub use emu_abi::hfi1::RxResult;

/// Where an accepted packet's payload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub iova: u64,
    /// A TIDCTRL 3 packet crossing from the even buffer of its pair into the odd one: the bytes that go at
    /// `iova`, and where the rest goes.
    pub spill: Option<(u64, u64)>,
}

impl Placement {
    fn at(iova: u64) -> Self {
        Self { iova, spill: None }
    }
}

fn count(c: &std::sync::atomic::AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Counts a packet's outcome by its cause.
pub fn count_refusal(r: RxResult, counters: &Counters) {
    let c = match r {
        RxResult::BadContext => &counters.rx_bad_context,
        RxResult::ContextDisabled => &counters.rx_context_disabled,
        RxResult::BadTidCtrl => &counters.rx_bad_tidctrl,
        RxResult::FlowInvalid => &counters.rx_flow_invalid,
        RxResult::GenMismatch => &counters.rx_gen_mismatch,
        RxResult::SeqMismatch => &counters.rx_seq_mismatch,
        RxResult::TidOutOfRange => &counters.rx_tid_out_of_range,
        RxResult::TidInvalidEntry => &counters.rx_tid_invalid_entry,
        RxResult::BufferOverrun => &counters.rx_buffer_overrun,
        RxResult::DmaError => &counters.rx_dma_errors,
        RxResult::Placed => &counters.rx_placed,
        // The loopback block counts its own (lb_bad_descriptors); an abort is no packet's fault.
        RxResult::BadDescriptor | RxResult::Aborted => return,
    };
    count(c);
}

impl Rxe {
    /// Judges a packet of `len` payload bytes. On success the flow's sequence has advanced and the returned
    /// placement lies wholly inside the entry's buffer. On failure nothing but the flow status changed.
    pub fn receive(&mut self, pkt: &Packet, len: u64, counters: &Counters) -> Result<Placement, RxResult> {
        count(&counters.rx_packets);
        let ctxt = pkt.ctxt();
        if ctxt >= self.contexts() {
            count(&counters.rx_bad_context);
            return Err(RxResult::BadContext);
        }
        let ctrl = self.ctxt_ctrl(ctxt);
        if ctrl & RCV_CTXT_CTRL_ENABLE_SMASK == 0 {
            count(&counters.rx_context_disabled);
            return Err(RxResult::ContextDisabled);
        }
        let tidctrl = pkt.tidctrl();
        if !matches!(tidctrl, TIDCTRL_EVEN | TIDCTRL_ODD | TIDCTRL_PAIR) {
            count(&counters.rx_bad_tidctrl);
            return Err(RxResult::BadTidCtrl);
        }
        let flow_checked = ctrl & RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK != 0;
        if flow_checked {
            let outcome = self.flows.check(ctxt, pkt.flow(), pkt.generation(), pkt.sequence());
            if let Some(refused) = flow_refusal(outcome) {
                count_refusal(refused, counters);
                return Err(refused);
            }
        }
        let placement =
            self.tid_placement(ctxt, pkt, tidctrl, len, counters).inspect_err(|r| count_refusal(*r, counters))?;
        if flow_checked {
            self.flows.accept(ctxt, pkt.flow());
        }
        Ok(placement)
    }

    /// The TID checks: the entry (or pair) in the context's range, valid, and holding the whole payload.
    /// Counts nothing: a packet judged again after waiting for room must not be counted twice.
    pub(super) fn tid_placement(
        &mut self,
        ctxt: usize,
        pkt: &Packet,
        tidctrl: u32,
        len: u64,
        counters: &Counters,
    ) -> Result<Placement, RxResult> {
        let (base, cnt) = self.tid_range(ctxt).unwrap_or((0, 0));
        // A pair packet addresses the even entry first; its odd partner must exist as well.
        let (rel, last_rel) = match tidctrl {
            TIDCTRL_ODD => (2 * u64::from(pkt.tid()) + 1, 2 * u64::from(pkt.tid()) + 1),
            TIDCTRL_PAIR => (2 * u64::from(pkt.tid()), 2 * u64::from(pkt.tid()) + 1),
            _ => (2 * u64::from(pkt.tid()), 2 * u64::from(pkt.tid())),
        };
        if last_rel >= cnt || base + last_rel >= self.rcv_array.count() as u64 {
            return Err(RxResult::TidOutOfRange);
        }
        let index = base + rel;
        let Some(entry) = self.rcv_array.entry(index, counters) else {
            return Err(RxResult::TidInvalidEntry);
        };
        let offset = pkt.offset_bytes();
        let end = offset.saturating_add(len);
        let first = entry.buf_size.bytes();
        // The entry's address and size are 36 + 12 and at most 21 bits wide, so the sums below stay under
        // 2^64; checked all the same, an address beyond it is a buffer the packet cannot reach.
        let at = |iova: u64, off: u64| iova.checked_add(off).ok_or(RxResult::BufferOverrun);
        if end <= first {
            return Ok(Placement::at(at(entry.iova(), offset)?));
        }
        if tidctrl != TIDCTRL_PAIR {
            return Err(RxResult::BufferOverrun);
        }
        // Beyond the even buffer: the odd entry takes the rest (a filler pair half is invalid).
        let Some(odd) = self.rcv_array.entry(index + 1, counters) else {
            return Err(RxResult::TidInvalidEntry);
        };
        if end - first > odd.buf_size.bytes() {
            return Err(RxResult::BufferOverrun);
        }
        Ok(if offset >= first {
            Placement::at(at(odd.iova(), offset - first)?)
        } else {
            Placement { iova: at(entry.iova(), offset)?, spill: Some((first - offset, odd.iova())) }
        })
    }
}

/// The refusal a flow check's outcome means, `None` when the packet may go on.
pub fn flow_refusal(outcome: FlowCheck) -> Option<RxResult> {
    match outcome {
        // The loopback block has no header queue to report the sticky sequence error in: placed as a match.
        FlowCheck::Match | FlowCheck::MatchAfterSeqErr => None,
        FlowCheck::Invalid => Some(RxResult::FlowInvalid),
        FlowCheck::GenMismatch => Some(RxResult::GenMismatch),
        FlowCheck::SeqMismatch => Some(RxResult::SeqMismatch),
    }
}

/// DMAs an accepted payload. Call without holding the RXE lock.
pub fn place(dma: &dyn DmaAccess, placement: &Placement, payload: &[u8], counters: &Counters) -> RxResult {
    let len = payload.len() as u64;
    put(placement, len, counters, |from, at, n| {
        let part = usize::try_from(from)
            .ok()
            .zip(usize::try_from(from + n).ok())
            .and_then(|(a, b)| payload.get(a..b))
            .ok_or(DmaError::Overflow { iova: at, len: n })?;
        dma.write(at, part)
    })
}

/// Places an accepted payload of `len` bytes that sits in DMA memory at `src` with one DMA copy, without
/// bringing it into the device. Call without holding the RXE lock.
pub fn place_from(dma: &dyn DmaAccess, placement: &Placement, src: u64, len: u64, counters: &Counters) -> RxResult {
    put(placement, len, counters, |from, at, n| {
        let src = src.checked_add(from).ok_or(DmaError::Overflow { iova: src, len })?;
        dma.copy(src, at, n)
    })
}

/// Stores `len` payload bytes where `placement` says through `store(payload offset, iova, length)`, and counts
/// the outcome.
fn put(
    placement: &Placement,
    len: u64,
    counters: &Counters,
    mut store: impl FnMut(u64, u64, u64) -> Result<(), DmaError>,
) -> RxResult {
    if len == 0 {
        count(&counters.rx_placed);
        return RxResult::Placed;
    }
    let written = match placement.spill {
        None => store(0, placement.iova, len),
        Some((n, rest_iova)) => {
            let head = n.min(len);
            store(0, placement.iova, head).and_then(|()| store(head, rest_iova, len - head))
        }
    };
    match written {
        Ok(()) => {
            count(&counters.rx_placed);
            RxResult::Placed
        }
        Err(e) => {
            tracing::debug!(iova = placement.iova, error = %e, "hfi1: payload DMA failed");
            count(&counters.rx_dma_errors);
            RxResult::DmaError
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hfi1::regs::*;
    use crate::hfi1::shm::SharedWords;
    use vfio_user_proto::dma::HeapMemory;

    const CTXT: u32 = 2;
    const FLOW: u32 = 3;
    const GEN: u32 = 0x12345;
    /// G1: 8 KiB at 0x12345000, programmed at relative entry 4 (pair 2, even).
    const EVEN_BUF: u64 = 0x12345000;
    /// 4 KiB at 0x20000000, relative entry 5 (pair 2, odd).
    const ODD_BUF: u64 = 0x20000000;

    struct Rig {
        rxe: Rxe,
        counters: Counters,
        mem: HeapMemory,
    }

    fn rig() -> Rig {
        let mut rxe = Rxe::new(8, SharedWords::new("t", RCV_ARRAY, 4096).unwrap(), true);
        let counters = Counters::default();
        let ctrl = RCV_CTXT_CTRL_ENABLE_SMASK | RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK;
        rxe.write(kctxt_csr(RCV_CTXT_CTRL, 2), ctrl, &counters);
        // G7: expected_base 2048, expected_count 1024.
        rxe.write(kctxt_csr(RCV_TID_CTRL, 2), 0x0000008000000100, &counters);
        rxe.write(RCV_ARRAY + 8 * 2052, 0x8000002000012345, &counters);
        rxe.rcv_array.shared().store(2053, 0x8000001000020000);
        // G3 flow value.
        rxe.write(tid_flow_csr(2, 3), 0x0000006F091A2800, &counters);
        let mem = HeapMemory::new();
        assert!(mem.map(EVEN_BUF, 8192) && mem.map(ODD_BUF, 4096));
        Rig { rxe, counters, mem }
    }

    fn pkt(offset: u32, om: bool, tid: u32, tidctrl: u32, seq: u32) -> Packet {
        Packet {
            kdeth0: Packet::kdeth0(offset, om, tid, tidctrl),
            dest_qp: Packet::dest_qp(CTXT, FLOW) | (0x80 << 16),
            psn: full_flow_psn(GEN, seq),
        }
    }

    impl Rig {
        fn send(&mut self, p: &Packet, payload: &[u8]) -> RxResult {
            match self.rxe.receive(p, payload.len() as u64, &self.counters) {
                Ok(pl) => place(&self.mem, &pl, payload, &self.counters),
                Err(r) => r,
            }
        }
        fn bytes(&self, iova: u64, n: usize) -> Vec<u8> {
            let mut b = vec![0; n];
            self.mem.read(iova, &mut b).unwrap();
            b
        }
        fn flow(&self) -> u64 {
            self.rxe.flows.read(2, 3).unwrap()
        }
    }

    #[test]
    fn golden_g4_full_flow_psn() {
        assert_eq!(full_flow_psn(0x12345, 3), 0x091A2803);
        let p = Packet { psn: 0x091A2803, ..Default::default() };
        assert_eq!((p.generation(), p.sequence()), (0x12345, 3));
    }

    #[test]
    fn kdeth_and_dest_qp_fields_decode() {
        let p = Packet { kdeth0: 0x0802_8010, dest_qp: 0x80_1802, psn: 0 };
        assert_eq!((p.tidctrl(), p.tid(), p.offset_bytes()), (2, 2, (0x10 << 6)));
        assert_eq!((p.ctxt(), p.flow()), (2, 3));
    }

    #[test]
    fn payloads_land_at_their_offsets_in_both_entries_of_a_pair_and_both_offset_modes() {
        let mut r = rig();
        // Even entry, OM small: 16 units of 4 bytes.
        assert_eq!(r.send(&pkt(16, false, 2, TIDCTRL_EVEN, 0), &[1, 2, 3, 4]), RxResult::Placed);
        // Odd entry, OM large: 3 units of 64 bytes.
        assert_eq!(r.send(&pkt(3, true, 2, TIDCTRL_ODD, 1), &[5, 6]), RxResult::Placed);
        // Even entry again, OM large, into the second page of the 8 KiB buffer.
        assert_eq!(r.send(&pkt(100, true, 2, TIDCTRL_EVEN, 2), &[7; 4]), RxResult::Placed);
        assert_eq!(r.bytes(EVEN_BUF + 60, 12), [0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0]);
        assert_eq!(r.bytes(ODD_BUF + 190, 6), [0, 0, 5, 6, 0, 0]);
        assert_eq!(r.bytes(EVEN_BUF + 6400, 5), [7, 7, 7, 7, 0]);
        assert_eq!(r.mem.write_count(), 3);
        assert_eq!(FlowEntry::decode(r.flow()).sequence, 3);
    }

    #[test]
    fn pair_packets_run_from_the_even_buffer_into_the_odd_one() {
        let mut r = rig();
        // Crossing: the last 4 bytes of the 8 KiB even buffer, then the first 4 of the odd one.
        assert_eq!(
            r.send(&pkt((8192 - 4) / 4, false, 2, TIDCTRL_PAIR, 0), &[1, 2, 3, 4, 5, 6, 7, 8]),
            RxResult::Placed
        );
        // Wholly in the odd buffer: pair offset 8192 + 64 is odd offset 64.
        assert_eq!(r.send(&pkt((8192 + 64) / 64, true, 2, TIDCTRL_PAIR, 1), &[9; 3]), RxResult::Placed);
        // Wholly in the even buffer.
        assert_eq!(r.send(&pkt(1, false, 2, TIDCTRL_PAIR, 2), &[7; 2]), RxResult::Placed);
        assert_eq!(r.bytes(EVEN_BUF + 8188, 4), [1, 2, 3, 4]);
        assert_eq!(r.bytes(ODD_BUF, 5), [5, 6, 7, 8, 0]);
        assert_eq!(r.bytes(ODD_BUF + 63, 5), [0, 9, 9, 9, 0]);
        assert_eq!(r.bytes(EVEN_BUF + 3, 4), [0, 7, 7, 0]);
        assert_eq!(FlowEntry::decode(r.flow()).sequence, 3);
    }

    #[test]
    fn pair_packet_needing_an_invalid_odd_entry_is_rejected_but_the_even_part_alone_is_placed() {
        let mut r = rig();
        r.rxe.write(RCV_ARRAY + 8 * 2053, RCV_ARRAY_RT_WRITE_ENABLE_SMASK, &r.counters);
        assert_eq!(r.send(&pkt((8192 - 4) / 4, false, 2, TIDCTRL_PAIR, 0), &[1; 8]), RxResult::TidInvalidEntry);
        assert_eq!(r.mem.write_count(), 0);
        assert_eq!(r.send(&pkt(0, false, 2, TIDCTRL_PAIR, 0), &[2; 8192]), RxResult::Placed);
        assert_eq!(r.bytes(EVEN_BUF + 8191, 1), [2]);
    }

    /// Where `place_from` takes payloads from: DMA memory apart from both buffers.
    const PAYLOAD: u64 = 0x4000_0000;

    #[test]
    fn payload_copied_from_dma_memory_lands_where_the_slice_path_puts_it() {
        // (packet, payload length, [(buffer iova, offset, length taken from the payload's start + skip)])
        type Case = (Packet, usize, &'static [(u64, u64, usize, usize)]);
        let table: [Case; 4] = [
            (pkt(16, false, 2, TIDCTRL_EVEN, 0), 8192 - 64, &[(EVEN_BUF, 64, 8192 - 64, 0)]),
            (pkt(3, true, 2, TIDCTRL_ODD, 0), 100, &[(ODD_BUF, 192, 100, 0)]),
            // Pair crossing: 4 bytes at the end of the even buffer, the rest at the start of the odd one.
            (
                pkt((8192 - 4) / 4, false, 2, TIDCTRL_PAIR, 0),
                4096 + 4,
                &[(EVEN_BUF, 8188, 4, 0), (ODD_BUF, 0, 4096, 4)],
            ),
            (pkt(0, false, 2, TIDCTRL_EVEN, 0), 0, &[]),
        ];
        for (p, len, lands) in table {
            let mut r = rig();
            assert!(r.mem.map(PAYLOAD, 0x4000));
            let payload: Vec<u8> = (0..len).map(|i| (i % 249) as u8 + 1).collect();
            r.mem.write(PAYLOAD, &payload).unwrap();
            let placement = r.rxe.receive(&p, len as u64, &r.counters).unwrap();
            assert_eq!(place_from(&r.mem, &placement, PAYLOAD, len as u64, &r.counters), RxResult::Placed);
            for &(buf, off, n, skip) in lands {
                assert_eq!(r.bytes(buf + off, n), payload[skip..skip + n], "{p:?}");
            }
            assert_eq!(r.counters.rx_placed.load(Ordering::Relaxed), 1);
            assert_eq!(FlowEntry::decode(r.flow()).sequence, 1);
        }
    }

    #[test]
    fn payload_copy_that_cannot_be_done_is_a_dma_error() {
        // (why, payload source, placement)
        let table: [(&str, u64, Placement); 3] = [
            ("source unmapped", 0x7000_0000, Placement::at(EVEN_BUF)),
            ("destination unmapped", PAYLOAD, Placement::at(0x7000_0000)),
            ("second part unmapped", PAYLOAD, Placement { iova: EVEN_BUF, spill: Some((4, 0x7000_0000)) }),
        ];
        for (why, src, placement) in table {
            let r = rig();
            assert!(r.mem.map(PAYLOAD, 0x4000));
            assert_eq!(place_from(&r.mem, &placement, src, 8, &r.counters), RxResult::DmaError, "{why}");
            assert_eq!(r.counters.rx_dma_errors.load(Ordering::Relaxed), 1, "{why}");
            assert_eq!(r.counters.rx_placed.load(Ordering::Relaxed), 0, "{why}");
        }
    }

    #[test]
    fn payload_filling_the_buffer_exactly_is_placed() {
        let mut r = rig();
        assert_eq!(r.send(&pkt(0, false, 2, TIDCTRL_ODD, 0), &[9; 4096]), RxResult::Placed);
        assert_eq!(r.bytes(ODD_BUF + 4095, 1), [9]);
    }

    use crate::hfi1::rxe::flow::FlowEntry;

    #[test]
    fn generation_mismatch_sets_gen_status_and_places_nothing() {
        let mut r = rig();
        let mut p = pkt(0, false, 2, TIDCTRL_EVEN, 0);
        p.psn = full_flow_psn(GEN + 1, 0);
        assert_eq!(r.send(&p, &[1; 8]), RxResult::GenMismatch);
        let e = FlowEntry::decode(r.flow());
        assert!(e.gen_mismatch && !e.seq_mismatch && e.flow_valid);
        assert_eq!(e.sequence, 0);
        assert_eq!(r.mem.write_count(), 0);
        assert_eq!(r.counters.rx_gen_mismatch.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn sequence_mismatch_sets_seq_status_and_places_nothing_then_the_expected_packet_is_accepted() {
        let mut r = rig();
        assert_eq!(r.send(&pkt(0, false, 2, TIDCTRL_EVEN, 1), &[1; 8]), RxResult::SeqMismatch);
        let e = FlowEntry::decode(r.flow());
        assert!(e.seq_mismatch && !e.gen_mismatch);
        assert_eq!(r.mem.write_count(), 0);
        assert_eq!(r.counters.rx_seq_mismatch.load(Ordering::Relaxed), 1);
        // KEEP_AFTER_SEQ_ERR is set in G3, so the flow still takes sequence 0.
        assert_eq!(r.send(&pkt(0, false, 2, TIDCTRL_EVEN, 0), &[1; 8]), RxResult::Placed);
    }

    #[test]
    fn rejected_packets_write_nothing_and_count_their_error() {
        let table: [(Packet, usize, RxResult); 9] = [
            (pkt(0, false, 2, 0, 0), 8, RxResult::BadTidCtrl),
            // A pair packet may run through both buffers (8 KiB + 4 KiB), not beyond.
            (pkt((8192 + 4096 - 4) / 4, false, 2, TIDCTRL_PAIR, 0), 8, RxResult::BufferOverrun),
            (pkt(0, false, 2, TIDCTRL_PAIR, 0), 8192 + 4097, RxResult::BufferOverrun),
            (pkt(0, false, 512, TIDCTRL_EVEN, 0), 8, RxResult::TidOutOfRange),
            (pkt(0, false, 3, TIDCTRL_EVEN, 0), 8, RxResult::TidInvalidEntry),
            (pkt(0, false, 2, TIDCTRL_ODD, 0), 4097, RxResult::BufferOverrun),
            (pkt(0x7FFF, true, 2, TIDCTRL_EVEN, 0), 1, RxResult::BufferOverrun),
            (Packet { dest_qp: Packet::dest_qp(9, FLOW), ..pkt(0, false, 2, 1, 0) }, 8, RxResult::BadContext),
            (Packet { dest_qp: Packet::dest_qp(1, FLOW), ..pkt(0, false, 2, 1, 0) }, 8, RxResult::ContextDisabled),
        ];
        for (p, len, want) in table {
            let mut r = rig();
            assert_eq!(r.send(&p, &vec![0xAA; len]), want, "{p:?}");
            assert_eq!(r.mem.write_count(), 0, "{want:?}");
            assert_eq!(FlowEntry::decode(r.flow()).sequence, 0, "{want:?} must not advance the flow");
            let errors: u64 = r
                .counters
                .snapshot()
                .iter()
                .filter(|(n, _)| n.starts_with("rx_") && *n != "rx_packets")
                .map(|(_, v)| v)
                .sum();
            assert_eq!(errors, 1, "{want:?}");
        }
    }

    #[test]
    fn invalid_flow_rejects_the_packet() {
        let mut r = rig();
        r.rxe.flows.write(2, 3, 0);
        assert_eq!(r.send(&pkt(0, false, 2, TIDCTRL_EVEN, 0), &[1; 8]), RxResult::FlowInvalid);
        assert_eq!(r.mem.write_count(), 0);
    }

    #[test]
    fn without_tid_flow_enable_the_flow_table_is_not_consulted() {
        let mut r = rig();
        r.rxe.write(kctxt_csr(RCV_CTXT_CTRL, 2), RCV_CTXT_CTRL_ENABLE_SMASK, &r.counters);
        let mut p = pkt(0, false, 2, TIDCTRL_EVEN, 77);
        p.psn = full_flow_psn(1, 77);
        assert_eq!(r.send(&p, &[3; 4]), RxResult::Placed);
        assert_eq!(r.flow() & 0x7FF, 0);
    }

    #[test]
    fn dma_to_unmapped_memory_counts_an_error_and_does_not_crash() {
        let mut r = rig();
        assert!(r.mem.unmap(ODD_BUF));
        assert_eq!(r.send(&pkt(0, false, 2, TIDCTRL_ODD, 0), &[1; 8]), RxResult::DmaError);
        assert_eq!(r.counters.rx_dma_errors.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn entry_invalidated_through_shared_memory_stops_placement() {
        let mut r = rig();
        r.rxe.rcv_array.shared().store(2052, 0x8000000000000000);
        assert_eq!(r.send(&pkt(0, false, 2, TIDCTRL_EVEN, 0), &[1; 8]), RxResult::TidInvalidEntry);
    }

    #[test]
    fn wc_fill_zero_over_an_adopted_entry_leaves_it_programmed() {
        let mut r = rig();
        assert_eq!(r.send(&pkt(0, false, 2, TIDCTRL_ODD, 0), &[1; 8]), RxResult::Placed);
        r.rxe.rcv_array.shared().store(2053, 0);
        assert_eq!(r.send(&pkt(8, false, 2, TIDCTRL_ODD, 1), &[2; 8]), RxResult::Placed);
        assert_eq!(r.bytes(ODD_BUF, 40), [[1; 8], [0; 8], [0; 8], [0; 8], [2; 8]].concat());
    }

    /// The documented limit of the shared-memory rule: memory keeps only the last store, so a 0 stored over a
    /// value the device has not taken yet replaces it. Drivers using the mapped RcvArray skip wc_fill.
    #[test]
    fn wc_fill_zero_over_an_untaken_value_replaces_it() {
        let mut r = rig();
        r.rxe.rcv_array.shared().store(2053, 0);
        assert_eq!(r.send(&pkt(0, false, 2, TIDCTRL_ODD, 0), &[1; 8]), RxResult::TidInvalidEntry);
    }
}
