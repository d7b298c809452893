//! The RcvArray: entry format (reference §1.3), the hardware's judgement of a written value, and the device's
//! effective entry table fed from shared memory (the sparse-mmap fast path) and from trapped writes.
//!
//! The swap/adopt rule: the client's stores land in shared memory with no trap. Whenever the device needs entry
//! `i` (placement, dump, trapped read or write) it atomically swaps shared word `i` with 0. A taken value with
//! WRITE_ENABLE is judged and adopted into the effective table; a taken value without it (the kernel's
//! `rcv_array_wc_fill` 0) is dropped, exactly as hardware ignores such a write.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::fault::FaultKind;
use crate::hfi1::config::HFI1_BAR;
use crate::hfi1::counters::Counters;
use crate::hfi1::regs::{
    RCV_ARRAY, RCV_ARRAY_ENTRY_SIZE, RCV_ARRAY_RT_ADDR_MASK, RCV_ARRAY_RT_ADDR_SHIFT, RCV_ARRAY_RT_BUF_SIZE_MASK,
    RCV_ARRAY_RT_BUF_SIZE_SHIFT, RCV_ARRAY_RT_WRITE_ENABLE_SMASK, RT_ADDR_SHIFT,
};
use crate::hfi1::shm::SharedWords;
use crate::probe::Probe;
use crate::trace::{Block, Level, Val};

/// A valid BUF_SIZE code: 1 = 4 KiB … 0xA = 2 MiB (`encoded_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufSize(u8);

impl BufSize {
    /// Largest valid code (2 MiB, MAX_EXPECTED_BUFFER).
    pub const MAX_CODE: u8 = 0xA;

    /// `None` for 0 (invalid entry) and the reserved codes 0xB..=0xF.
    pub fn from_code(code: u8) -> Option<Self> {
        (1..=Self::MAX_CODE).contains(&code).then_some(Self(code))
    }
    pub fn code(self) -> u8 {
        self.0
    }
    /// Buffer size in bytes: 4 KiB << (code − 1).
    pub fn bytes(self) -> u64 {
        4096 << (self.0 - 1)
    }
}

/// A valid, programmed RcvArray entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcvEntry {
    pub buf_size: BufSize,
    /// ADDR field: the buffer's DMA address >> 12.
    pub addr: u64,
}

impl RcvEntry {
    /// The buffer's first byte.
    pub fn iova(&self) -> u64 {
        self.addr << RT_ADDR_SHIFT
    }
    /// The entry as hardware holds it (without WRITE_ENABLE, which is a write strobe, not state).
    pub fn encode(&self) -> u64 {
        (u64::from(self.buf_size.code()) << RCV_ARRAY_RT_BUF_SIZE_SHIFT) | (self.addr << RCV_ARRAY_RT_ADDR_SHIFT)
    }
}

/// What hardware makes of a value written to an RcvArray entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    /// No WRITE_ENABLE: the write does nothing.
    Ignored,
    /// WRITE_ENABLE with BUF_SIZE 0 (PT_INVALID / PT_INVALID_FLUSH): the entry becomes invalid.
    Invalidate,
    /// WRITE_ENABLE with a valid code: the entry points at a buffer.
    Program(RcvEntry),
    /// WRITE_ENABLE with a reserved code: counted as an error; the entry becomes invalid.
    BadSize(u8),
}

/// Judges a written value. Bits 62:40 are undefined and ignored.
pub fn judge(value: u64) -> Judgement {
    if value & RCV_ARRAY_RT_WRITE_ENABLE_SMASK == 0 {
        return Judgement::Ignored;
    }
    let code = ((value >> RCV_ARRAY_RT_BUF_SIZE_SHIFT) & RCV_ARRAY_RT_BUF_SIZE_MASK) as u8;
    let addr = (value >> RCV_ARRAY_RT_ADDR_SHIFT) & RCV_ARRAY_RT_ADDR_MASK;
    match (code, BufSize::from_code(code)) {
        (0, _) => Judgement::Invalidate,
        (_, Some(buf_size)) => Judgement::Program(RcvEntry { buf_size, addr }),
        (bad, None) => Judgement::BadSize(bad),
    }
}

/// The effective entry table plus the shared words the client programs.
pub struct RcvArray {
    shm: SharedWords,
    entries: Vec<Option<RcvEntry>>,
    /// Traces, faults and the recording of shared-memory takes (the engine's probe).
    probe: Option<Arc<Probe>>,
}

impl RcvArray {
    pub fn new(shm: SharedWords) -> Self {
        let entries = vec![None; shm.len()];
        Self { shm, entries, probe: None }
    }

    pub fn set_probe(&mut self, probe: Arc<Probe>) {
        self.probe = Some(probe);
    }

    #[cfg(test)]
    pub fn shared(&self) -> &SharedWords {
        &self.shm
    }

    pub fn count(&self) -> usize {
        self.entries.len()
    }

    /// Returns whether the entry now points at a buffer it was given by this value.
    fn adopt(&mut self, index: usize, value: u64, counters: &Counters) -> bool {
        let Some(slot) = self.entries.get_mut(index) else { return false };
        // Only writes with WRITE_ENABLE count as the fault's events: the ones that change an entry.
        if let Some(p) = self.probe.as_ref().filter(|_| value & RCV_ARRAY_RT_WRITE_ENABLE_SMASK != 0) {
            if p.fault(FaultKind::RcvarrayIgnore, |f| f.index.is_none_or(|i| i == index as u64)).is_some() {
                return false;
            }
        }
        let programmed = match judge(value) {
            Judgement::Ignored => {
                counters.rcv_array_no_write_enable.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            Judgement::Invalidate => {
                *slot = None;
                false
            }
            Judgement::Program(e) => {
                *slot = Some(e);
                true
            }
            Judgement::BadSize(_) => {
                counters.rcv_array_bad_buf_size.fetch_add(1, Ordering::Relaxed);
                *slot = None;
                false
            }
        };
        counters.rcv_array_adopted.fetch_add(1, Ordering::Relaxed);
        programmed
    }

    /// Takes shared word `index` and adopts it. A taken 0 is indistinguishable from "nothing written" and is
    /// dropped without counting; other values without WRITE_ENABLE are counted.
    fn sync(&mut self, index: usize, counters: &Counters) {
        let Some(mut taken) = self.shm.take(index) else { return };
        if let Some(p) = &self.probe {
            let offset = RCV_ARRAY + RCV_ARRAY_ENTRY_SIZE * index as u64;
            taken = p.shared_take(HFI1_BAR, offset, taken);
            if taken != 0 && p.trace.on(Block::RcvArray, Level::Debug) {
                let fields = [("index", Val::Dec(index as u64)), ("value", Val::Hex(taken))];
                p.trace.event(Block::RcvArray, Level::Debug, "rcvarray-take", &fields);
            }
        }
        if taken != 0 {
            self.adopt(index, taken, counters);
        }
    }

    /// A trapped write of `value` to entry `index`: older shared stores first, then this value. Returns
    /// whether this value programmed the entry (a buffer, not an invalidation).
    pub fn write(&mut self, index: u64, value: u64, counters: &Counters) -> bool {
        let Some(i) = usize::try_from(index).ok().filter(|i| *i < self.entries.len()) else {
            counters.rcv_array_bad_index.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        self.sync(i, counters);
        self.adopt(i, value, counters)
    }

    /// The effective entry `index` after adopting any pending shared store. `None` if invalid or out of range.
    pub fn entry(&mut self, index: u64, counters: &Counters) -> Option<RcvEntry> {
        let i = usize::try_from(index).ok().filter(|i| *i < self.entries.len())?;
        self.sync(i, counters);
        self.entries[i]
    }

    /// A trapped read: the effective entry encoded (0 when invalid), `None` when out of range.
    pub fn read(&mut self, index: u64, counters: &Counters) -> Option<u64> {
        let i = usize::try_from(index).ok().filter(|i| *i < self.entries.len())?;
        Some(self.entry(i as u64, counters).map_or(0, |e| e.encode()))
    }

    /// Every valid entry, after adopting all pending shared stores.
    pub fn valid_entries(&mut self, counters: &Counters) -> Vec<(usize, RcvEntry)> {
        (0..self.entries.len()).filter_map(|i| self.entry(i as u64, counters).map(|e| (i, e))).collect()
    }

    /// Power-on state: every entry invalid, shared memory zero.
    pub fn reset(&mut self) {
        self.shm.clear();
        self.entries.fill(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hfi1::regs::{RCV_ARRAY, RCV_ARRAY_ENTRY_SIZE};

    fn array() -> (RcvArray, Counters) {
        (RcvArray::new(SharedWords::new("t", RCV_ARRAY, 512).unwrap()), Counters::default())
    }

    fn get(c: &std::sync::atomic::AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    #[test]
    fn golden_g1_expected_8k_entry_decodes() {
        let want = RcvEntry { buf_size: BufSize::from_code(2).unwrap(), addr: 0x12345 };
        assert_eq!(judge(0x8000002000012345), Judgement::Program(want));
        assert_eq!(want.iova(), 0x12345000);
        assert_eq!(want.buf_size.bytes(), 8192);
        assert_eq!(RCV_ARRAY + RCV_ARRAY_ENTRY_SIZE * 0x100, 0x1200800);
    }

    #[test]
    fn golden_g1_invalid_and_wc_fill_values() {
        assert_eq!(judge(0x8000000000000000), Judgement::Invalidate);
        assert_eq!(judge(0), Judgement::Ignored);
    }

    #[test]
    fn golden_g2_2m_entry_decodes() {
        let Judgement::Program(e) = judge(0x800000A000123400) else { panic!("G2 must program an entry") };
        assert_eq!((e.buf_size.code(), e.buf_size.bytes(), e.iova()), (0xA, 2 << 20, 0x1_2340_0000));
    }

    #[test]
    fn buf_size_codes_follow_encoded_size() {
        let table = [(1, 4096), (2, 8192), (3, 16384), (4, 32768), (5, 65536), (7, 262144), (9, 1 << 20)];
        for (code, bytes) in table {
            assert_eq!(BufSize::from_code(code).map(BufSize::bytes), Some(bytes));
        }
        for code in [0, 0xB, 0xC, 0xF] {
            assert_eq!(BufSize::from_code(code), None);
        }
    }

    #[test]
    fn reserved_size_code_counts_an_error_and_invalidates() {
        let (mut a, c) = array();
        a.write(4, 0x8000002000012345, &c);
        a.write(4, 0x800000B000012345, &c);
        assert_eq!(a.entry(4, &c), None);
        assert_eq!(get(&c.rcv_array_bad_buf_size), 1);
    }

    #[test]
    fn trapped_write_without_write_enable_is_ignored() {
        let (mut a, c) = array();
        a.write(4, 0x8000002000012345, &c);
        a.write(4, 0x0000002000099999, &c);
        assert_eq!(a.entry(4, &c).map(|e| e.addr), Some(0x12345));
        assert_eq!(get(&c.rcv_array_no_write_enable), 1);
    }

    #[test]
    fn trapped_write_beyond_rcv_array_cnt_counts_an_error() {
        let (mut a, c) = array();
        a.write(512, 0x8000002000012345, &c);
        a.write(u64::MAX, 0x8000002000012345, &c);
        assert_eq!(get(&c.rcv_array_bad_index), 2);
        assert_eq!(a.read(512, &c), None);
    }

    #[test]
    fn shared_store_is_adopted_when_the_entry_is_needed() {
        let (mut a, c) = array();
        a.shared().store(0x100, 0x8000002000012345);
        assert_eq!(a.read(0x100, &c), Some(0x0000002000012345));
        assert_eq!(a.shared().load(0x100), Some(0));
        // Once adopted, the entry stays although the shared word is now 0.
        assert_eq!(a.entry(0x100, &c).map(|e| e.iova()), Some(0x12345000));
    }

    #[test]
    fn shared_wc_fill_zero_is_dropped_and_keeps_the_entry() {
        let (mut a, c) = array();
        a.shared().store(9, 0x8000002000012345);
        assert!(a.entry(9, &c).is_some());
        a.shared().store(9, 0);
        assert_eq!(a.entry(9, &c).map(|e| e.addr), Some(0x12345));
        assert_eq!(get(&c.rcv_array_no_write_enable), 0);
    }

    #[test]
    fn shared_value_without_write_enable_is_dropped_and_counted() {
        let (mut a, c) = array();
        a.shared().store(9, 0x0000002000012345);
        assert_eq!(a.entry(9, &c), None);
        assert_eq!(a.shared().load(9), Some(0));
        assert_eq!(get(&c.rcv_array_no_write_enable), 1);
    }

    #[test]
    fn shared_invalidate_clears_an_adopted_entry() {
        let (mut a, c) = array();
        a.shared().store(9, 0x8000002000012345);
        assert!(a.entry(9, &c).is_some());
        a.shared().store(9, 0x8000000000000000);
        assert_eq!(a.entry(9, &c), None);
    }

    #[test]
    fn trapped_write_applies_after_a_pending_shared_store() {
        let (mut a, c) = array();
        a.shared().store(2, 0x8000002000011111);
        a.write(2, 0x8000001000022222, &c);
        assert_eq!(a.read(2, &c), Some(0x0000001000022222));
        assert_eq!(get(&c.rcv_array_adopted), 2);
    }

    #[test]
    fn valid_entries_lists_only_programmed_ones_and_reset_clears_all() {
        let (mut a, c) = array();
        a.shared().store(1, 0x8000002000012345);
        a.write(3, 0x800000A000123400, &c);
        a.shared().store(5, 0x8000000000000000);
        let got: Vec<usize> = a.valid_entries(&c).into_iter().map(|(i, _)| i).collect();
        assert_eq!(got, vec![1, 3]);
        a.shared().store(7, 0x8000002000012345);
        a.reset();
        assert!(a.valid_entries(&c).is_empty());
    }
}
