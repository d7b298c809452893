//! The per-context TID flow table (RCV_TID_FLOW_TABLE, reference §1.5): 32 entries per context, the driver's
//! write rule (control bits read/write, mismatch status bits W1C) and the receive engine's flow check.
//!
//! Decisions (the reference has only names): the 11-bit field at bits 10:0 is the expected sequence and
//! advances on every accepted packet; KEEP_ON_GEN_ERR / KEEP_AFTER_SEQ_ERR decide whether FLOW_VALID survives a
//! generation / sequence error; SEQ_MISMATCH, once set, marks every later packet of the flow as a sequence
//! error until the driver writes the flow (the ones in sequence are still placed), which is what the kernel's
//! software PSN check expects (docs/hfi1-fabric.md, "TID RDMA on the wire"); HDR_SUPP_EN matters on the wire
//! only (kdeth.rs): the loopback block has no receive header queue to suppress.

#![forbid(unsafe_code)]

use crate::hfi1::regs::RXE_NUM_TID_FLOWS;
use crate::hfi1::regs::{
    apply_write, RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK, RCV_TID_FLOW_TABLE_CTRL_HDR_SUPP_EN_SMASK,
    RCV_TID_FLOW_TABLE_CTRL_KEEP_AFTER_SEQ_ERR_SMASK, RCV_TID_FLOW_TABLE_CTRL_KEEP_ON_GEN_ERR_SMASK,
    RCV_TID_FLOW_TABLE_GEN_MASK, RCV_TID_FLOW_TABLE_GEN_SHIFT, RCV_TID_FLOW_TABLE_SEQ_MASK,
    RCV_TID_FLOW_TABLE_SEQ_SHIFT, RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK,
    RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK, TID_FLOW_REG,
};

/// A decoded flow-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct FlowEntry {
    pub sequence: u16,
    pub generation: u32,
    pub flow_valid: bool,
    pub hdr_supp_en: bool,
    pub keep_after_seq_err: bool,
    pub keep_on_gen_err: bool,
    pub seq_mismatch: bool,
    pub gen_mismatch: bool,
}

impl FlowEntry {
    pub fn decode(raw: u64) -> Self {
        Self {
            sequence: ((raw >> RCV_TID_FLOW_TABLE_SEQ_SHIFT) & RCV_TID_FLOW_TABLE_SEQ_MASK) as u16,
            generation: ((raw >> RCV_TID_FLOW_TABLE_GEN_SHIFT) & RCV_TID_FLOW_TABLE_GEN_MASK) as u32,
            flow_valid: raw & RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK != 0,
            hdr_supp_en: raw & RCV_TID_FLOW_TABLE_CTRL_HDR_SUPP_EN_SMASK != 0,
            keep_after_seq_err: raw & RCV_TID_FLOW_TABLE_CTRL_KEEP_AFTER_SEQ_ERR_SMASK != 0,
            keep_on_gen_err: raw & RCV_TID_FLOW_TABLE_CTRL_KEEP_ON_GEN_ERR_SMASK != 0,
            seq_mismatch: raw & RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK != 0,
            gen_mismatch: raw & RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK != 0,
        }
    }
}

/// Outcome of checking a packet's PSN against its flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowCheck {
    /// Generation and sequence match: the packet may be placed; call [`FlowTable::accept`] once it is.
    Match,
    /// Generation and sequence match, but the flow has had a sequence error since the driver last wrote it
    /// (SEQ_MISMATCH still set): placed and accepted as on `Match`, and reported as a FLOW_SEQ_ERR all the same,
    /// so the driver's software PSN check sees every packet until it writes the flow again.
    MatchAfterSeqErr,
    /// FLOW_VALID is clear: no status bit, nothing changes.
    Invalid,
    /// GEN_MISMATCH was set (and FLOW_VALID cleared unless KEEP_ON_GEN_ERR).
    GenMismatch,
    /// SEQ_MISMATCH was set (and FLOW_VALID cleared unless KEEP_AFTER_SEQ_ERR).
    SeqMismatch,
}

/// The generation the kernel parks an unused flow on (KERN_GENERATION_RESERVED, tid_rdma.c:47-48): the chip
/// gives it no meaning; the counters tell a flow set up for a segment from a parked one by it.
pub const KERN_GENERATION_RESERVED: u32 = RCV_TID_FLOW_TABLE_GEN_MASK as u32;

/// The flow tables of every context.
pub struct FlowTable {
    raw: Vec<[u64; RXE_NUM_TID_FLOWS]>,
}

impl FlowTable {
    pub fn new(contexts: usize) -> Self {
        Self { raw: vec![[0; RXE_NUM_TID_FLOWS]; contexts] }
    }

    fn slot(&mut self, ctxt: usize, flow: usize) -> Option<&mut u64> {
        self.raw.get_mut(ctxt)?.get_mut(flow)
    }

    /// The raw entry, `None` when out of range.
    pub fn read(&self, ctxt: usize, flow: usize) -> Option<u64> {
        self.raw.get(ctxt)?.get(flow).copied()
    }

    /// A driver write. Returns false when out of range.
    pub fn write(&mut self, ctxt: usize, flow: usize, value: u64) -> bool {
        self.slot(ctxt, flow).map(|e| *e = apply_write(&TID_FLOW_REG, *e, value)).is_some()
    }

    /// Checks `generation`/`sequence` against the flow and records a mismatch. Nothing changes on `Match`.
    pub fn check(&mut self, ctxt: usize, flow: usize, generation: u32, sequence: u16) -> FlowCheck {
        let outcome = self.peek(ctxt, flow, generation, sequence);
        self.record(ctxt, flow, outcome);
        outcome
    }

    /// What [`FlowTable::check`] would find, changing nothing: a packet that must wait for room in its header
    /// queue is judged again later and must leave no trace the first time.
    pub fn peek(&self, ctxt: usize, flow: usize, generation: u32, sequence: u16) -> FlowCheck {
        let Some(raw) = self.read(ctxt, flow) else { return FlowCheck::Invalid };
        let e = FlowEntry::decode(raw);
        if !e.flow_valid {
            FlowCheck::Invalid
        } else if e.generation != generation {
            FlowCheck::GenMismatch
        } else if e.sequence != sequence {
            FlowCheck::SeqMismatch
        } else if e.seq_mismatch {
            FlowCheck::MatchAfterSeqErr
        } else {
            FlowCheck::Match
        }
    }

    /// Records a mismatch [`FlowTable::peek`] found: the status bit set, FLOW_VALID cleared unless the
    /// matching KEEP bit is set. `Match` and `Invalid` change nothing.
    pub fn record(&mut self, ctxt: usize, flow: usize, outcome: FlowCheck) {
        let Some(raw) = self.slot(ctxt, flow) else { return };
        let (status, keep) = match outcome {
            FlowCheck::GenMismatch => {
                (RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK, RCV_TID_FLOW_TABLE_CTRL_KEEP_ON_GEN_ERR_SMASK)
            }
            FlowCheck::SeqMismatch => {
                (RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK, RCV_TID_FLOW_TABLE_CTRL_KEEP_AFTER_SEQ_ERR_SMASK)
            }
            FlowCheck::Match | FlowCheck::MatchAfterSeqErr | FlowCheck::Invalid => return,
        };
        if *raw & keep == 0 {
            *raw &= !RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK;
        }
        *raw |= status;
    }

    /// The device changes a flow's generation by itself (a `flow-generation` fault): `add` is added to the
    /// generation field, everything else stays. Returns the new generation.
    pub fn shift_generation(&mut self, ctxt: usize, flow: usize, add: u32) -> Option<u32> {
        let slot = self.slot(ctxt, flow)?;
        let field = RCV_TID_FLOW_TABLE_GEN_MASK << RCV_TID_FLOW_TABLE_GEN_SHIFT;
        let generation =
            ((*slot >> RCV_TID_FLOW_TABLE_GEN_SHIFT).wrapping_add(u64::from(add))) & RCV_TID_FLOW_TABLE_GEN_MASK;
        *slot = (*slot & !field) | (generation << RCV_TID_FLOW_TABLE_GEN_SHIFT);
        Some(generation as u32)
    }

    /// The packet that matched was accepted: the expected sequence advances (modulo 2048; the generation is
    /// the driver's to change).
    pub fn accept(&mut self, ctxt: usize, flow: usize) {
        if let Some(raw) = self.slot(ctxt, flow) {
            let next = (FlowEntry::decode(*raw).sequence as u64 + 1) & RCV_TID_FLOW_TABLE_SEQ_MASK;
            let field = RCV_TID_FLOW_TABLE_SEQ_MASK << RCV_TID_FLOW_TABLE_SEQ_SHIFT;
            *raw = (*raw & !field) | (next << RCV_TID_FLOW_TABLE_SEQ_SHIFT);
        }
    }

    /// reset_rxe_csrs: every entry of every context to 0.
    pub fn reset(&mut self) {
        self.raw.iter_mut().for_each(|t| *t = [0; RXE_NUM_TID_FLOWS]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// G3: context 2, flow 3, generation 0x12345, as kern_set_hw_flow writes it.
    const G3_VALUE: u64 = 0x0000006F091A2800;
    /// G3: the same flow cleared (RESERVED generation, no HDR_SUPP_EN).
    const G3_CLEARED: u64 = 0x0000006D7FFFF800;

    fn table_with(value: u64) -> FlowTable {
        let mut t = FlowTable::new(4);
        assert!(t.write(2, 3, value));
        t
    }

    #[test]
    fn golden_g3_flow_value_decodes_and_status_bits_read_back_clear() {
        let t = table_with(G3_VALUE);
        let e = FlowEntry::decode(t.read(2, 3).unwrap());
        assert_eq!((e.generation, e.sequence), (0x12345, 0));
        assert!(e.flow_valid && e.hdr_supp_en && e.keep_after_seq_err && e.keep_on_gen_err);
        assert!(!e.seq_mismatch && !e.gen_mismatch);
        assert_eq!(t.read(2, 3), Some(0x0000000F091A2800));
    }

    #[test]
    fn golden_g3_cleared_flow_has_reserved_generation_without_header_suppression() {
        let e = FlowEntry::decode(table_with(G3_CLEARED).read(2, 3).unwrap());
        assert_eq!(e.generation, 0xFFFFF);
        assert!(e.flow_valid && !e.hdr_supp_en);
    }

    #[test]
    fn status_bits_are_write_one_to_clear() {
        let mut t = table_with(G3_VALUE);
        assert_eq!(t.check(2, 3, 0x12346, 0), FlowCheck::GenMismatch);
        assert_eq!(t.check(2, 3, 0x12345, 5), FlowCheck::SeqMismatch);
        let both = RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK | RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK;
        assert_eq!(t.read(2, 3).unwrap() & both, both);
        // Writing the control bits back with the status bits as 0 keeps the status.
        assert!(t.write(2, 3, G3_VALUE & !both));
        assert_eq!(t.read(2, 3).unwrap() & both, both);
        // Writing 1 to SEQ_MISMATCH clears only it.
        assert!(t.write(2, 3, (G3_VALUE & !both) | RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK));
        assert_eq!(t.read(2, 3).unwrap() & both, RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK);
    }

    #[test]
    fn reserved_bits_read_zero() {
        let t = table_with(u64::MAX);
        assert_eq!(t.read(2, 3), Some(0x0000000F7FFFFFFF));
    }

    #[test]
    fn matching_packets_advance_the_sequence_and_wrap_at_2048() {
        let mut t = table_with(G3_VALUE | 2046);
        for seq in [2046, 2047, 0, 1] {
            assert_eq!(t.check(2, 3, 0x12345, seq), FlowCheck::Match);
            t.accept(2, 3);
        }
        assert_eq!(FlowEntry::decode(t.read(2, 3).unwrap()).sequence, 2);
    }

    #[test]
    fn keep_bits_decide_whether_the_flow_stays_valid_after_an_error() {
        let keep_gen = RCV_TID_FLOW_TABLE_CTRL_KEEP_ON_GEN_ERR_SMASK;
        let keep_seq = RCV_TID_FLOW_TABLE_CTRL_KEEP_AFTER_SEQ_ERR_SMASK;
        // (entry, generation, sequence) -> (check, still valid)
        let table = [
            (G3_VALUE, 0x1, 0, FlowCheck::GenMismatch, true),
            (G3_VALUE & !keep_gen, 0x1, 0, FlowCheck::GenMismatch, false),
            (G3_VALUE, 0x12345, 9, FlowCheck::SeqMismatch, true),
            (G3_VALUE & !keep_seq, 0x12345, 9, FlowCheck::SeqMismatch, false),
        ];
        for (value, generation, seq, want, valid) in table {
            let mut t = table_with(value);
            assert_eq!(t.check(2, 3, generation, seq), want);
            let e = FlowEntry::decode(t.read(2, 3).unwrap());
            assert_eq!(e.flow_valid, valid, "{value:#x}");
            assert_eq!(e.sequence, 0, "an error never advances the sequence");
        }
    }

    /// The SYNC point of tid_rdma.c as the flow table sees it: kern_clear_hw_flow parks the entry on the
    /// reserved generation (G3 cleared value), kern_setup_hw_flow arms it with the next generation at
    /// sequence 0. From the clear on, a packet of the old generation is a generation mismatch, whatever
    /// its sequence: the one after the last accepted, or 0; the new generation's sequence 0 is accepted.
    #[test]
    fn after_the_generation_changes_packets_of_the_old_one_are_refused() {
        let mut t = table_with(G3_VALUE);
        for seq in 0..3 {
            assert_eq!(t.check(2, 3, 0x12345, seq), FlowCheck::Match);
            t.accept(2, 3);
        }
        assert!(t.write(2, 3, G3_CLEARED));
        assert_eq!(t.check(2, 3, 0x12345, 3), FlowCheck::GenMismatch, "parked on the reserved generation");
        // kern_set_hw_flow(0x12346): (0x12346 << 11) | 0x6F00000000, status bits written 1 (cleared).
        assert!(t.write(2, 3, 0x0000_006F_091A_3000));
        for seq in [3, 0, 2047] {
            assert_eq!(t.check(2, 3, 0x12345, seq), FlowCheck::GenMismatch, "old generation, sequence {seq}");
        }
        let e = FlowEntry::decode(t.read(2, 3).unwrap());
        assert!(e.gen_mismatch && e.flow_valid && !e.seq_mismatch, "KEEP_ON_GEN_ERR keeps the flow");
        assert_eq!((e.generation, e.sequence), (0x12346, 0), "an error never advances the sequence");
        assert_eq!(t.check(2, 3, 0x12346, 0), FlowCheck::Match);
    }

    #[test]
    fn invalid_flow_sets_no_status_and_out_of_range_is_refused() {
        let mut t = table_with(G3_VALUE & !RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK);
        assert_eq!(t.check(2, 3, 0x12345, 0), FlowCheck::Invalid);
        assert_eq!(t.read(2, 3), Some(0x0000000E091A2800));
        assert!(!t.write(4, 0, 1));
        assert!(!t.write(0, 32, 1));
        assert_eq!(t.check(9, 0, 0, 0), FlowCheck::Invalid);
        t.reset();
        assert_eq!(t.read(2, 3), Some(0));
    }
}
