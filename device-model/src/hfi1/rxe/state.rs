//! The RXE state a driver programs: global and per-context CSRs, the flow tables and the RcvArray, with the
//! register read/write rules. Lives behind one lock that no DMA path holds.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;

use serde_json::{json, Value};

use super::flow::{FlowEntry, FlowTable, KERN_GENERATION_RESERVED};
use super::rcvarray::RcvArray;
use crate::hfi1::counters::Counters;
use crate::hfi1::jkey;
use crate::hfi1::regs::RXE_NUM_TID_FLOWS;
use crate::hfi1::regs::{
    apply_write, decode, Csr, GLOBAL_REGS, KCTXT_REGS, RCV_ARRAY_CNT, RCV_CONTEXTS, RCV_CTXT_CTRL,
    RCV_CTXT_CTRL_ENABLE_SMASK, RCV_EGR_CTRL, RCV_EGR_INDEX_TAIL, RCV_EGR_INDEX_TAIL_TAIL_MASK, RCV_EGR_OFFSET_TAIL,
    RCV_EGR_OFFSET_TAIL_TAIL_MASK, RCV_HDR_CNT, RCV_HDR_ENT_SIZE, RCV_HDR_OVFL_CNT, RCV_HDR_TAIL, RCV_KEY_CTRL,
    RCV_QP_MAP_TABLE_REGS, RCV_SHIFT, RCV_TID_CTRL, RCV_TID_CTRL_TID_BASE_INDEX_MASK,
    RCV_TID_CTRL_TID_BASE_INDEX_SHIFT, RCV_TID_CTRL_TID_PAIR_CNT_MASK, RCV_TID_CTRL_TID_PAIR_CNT_SHIFT, RXE_KCTXT_BASE,
    UCTXT_REGS,
};
use crate::hfi1::shm::SharedWords;
use emu_abi::hfi1::{LB_BASE, LB_SIZE};

/// A context's place in its header queue and eager buffers (rhq.rs moves it; the chip keeps one per context).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RhqState {
    /// The entry the next packet takes.
    pub(super) tail: u32,
    /// RCV_HDR_TAIL as the driver reads it: dwords of the entries written.
    published: u64,
    pub(super) seq: u8,
    pub(super) egr_index: u32,
    /// 64-byte blocks used of the current eager buffer.
    pub(super) egr_offset: u64,
}

impl Default for RhqState {
    fn default() -> Self {
        RhqState { tail: 0, published: 0, seq: 1, egr_index: 0, egr_offset: 0 }
    }
}

impl RhqState {
    pub fn published(&self) -> u64 {
        self.published
    }
    pub(super) fn set_published(&mut self, published: u64) {
        self.published = published;
    }
}

/// Index of a kernel per-context register in [`KCTXT_REGS`].
pub const fn kreg(offset: u64) -> usize {
    ((offset - RXE_KCTXT_BASE) / 8) as usize
}

/// What an MMIO access to the chip (not the loopback block) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Handled (a read gives the value).
    Done(u64),
    /// Nothing implemented at this offset: reads are all-ones, writes ignored.
    Unimplemented,
    /// Read-only register: the write changed nothing.
    ReadOnly,
    /// The offset belongs to the loopback block.
    Loopback(u64),
}

pub struct Rxe {
    contexts: usize,
    /// Where the loopback block sits, on the personality that has one.
    loopback: Option<(u64, u64)>,
    global: [u64; GLOBAL_REGS.len()],
    kctxt: Vec<[u64; KCTXT_REGS.len()]>,
    uctxt: Vec<[u64; UCTXT_REGS.len()]>,
    qp_map: [u64; RCV_QP_MAP_TABLE_REGS],
    /// Each context's place in its header queue and eager buffers.
    rhq: Vec<RhqState>,
    /// Entries each context's header queue has been given, ever (never reset: a `wire-batch` marks against it).
    placed: Vec<u64>,
    pub flows: FlowTable,
    pub rcv_array: RcvArray,
}

impl Rxe {
    pub fn new(contexts: usize, shm: SharedWords, loopback: bool) -> Self {
        let mut rxe = Self {
            contexts,
            loopback: loopback.then_some((LB_BASE, LB_SIZE)),
            global: [0; GLOBAL_REGS.len()],
            kctxt: vec![[0; KCTXT_REGS.len()]; contexts],
            uctxt: vec![[0; UCTXT_REGS.len()]; contexts],
            qp_map: [0; RCV_QP_MAP_TABLE_REGS],
            rhq: vec![RhqState::default(); contexts],
            placed: vec![0; contexts],
            flows: FlowTable::new(contexts),
            rcv_array: RcvArray::new(shm),
        };
        rxe.reset();
        rxe
    }

    pub fn contexts(&self) -> usize {
        self.contexts
    }

    /// reset_rxe_csrs plus the RcvArray invalidated: per-context CSRs and flow tables zero, the read-only
    /// size registers show the configuration.
    pub fn reset(&mut self) {
        self.global = [0; GLOBAL_REGS.len()];
        for (i, def) in GLOBAL_REGS.iter().enumerate() {
            self.global[i] = match def.offset {
                RCV_CONTEXTS => self.contexts as u64,
                RCV_ARRAY_CNT => self.rcv_array.count() as u64,
                _ => 0,
            };
        }
        self.kctxt.iter_mut().for_each(|r| *r = [0; KCTXT_REGS.len()]);
        self.uctxt.iter_mut().for_each(|r| *r = [0; UCTXT_REGS.len()]);
        self.qp_map = [0; RCV_QP_MAP_TABLE_REGS];
        self.rhq.iter_mut().for_each(|r| *r = RhqState::default());
        self.flows.reset();
        self.rcv_array.reset();
    }

    /// A kernel per-context register value (`None` if the context does not exist).
    pub fn kctxt(&self, ctxt: usize, offset: u64) -> Option<u64> {
        self.kctxt.get(ctxt)?.get(kreg(offset)).copied()
    }

    /// A user-spaced per-context register value (0 if the context does not exist).
    pub fn uctxt_reg(&self, ctxt: usize, offset: u64) -> u64 {
        let reg = UCTXT_REGS.iter().position(|r| r.offset == offset);
        reg.and_then(|i| self.uctxt.get(ctxt).map(|r| r[i])).unwrap_or(0)
    }

    /// A global RXE register value.
    pub fn global(&self, offset: u64) -> u64 {
        GLOBAL_REGS.iter().position(|r| r.offset == offset).map_or(0, |i| self.global[i])
    }

    /// The context RCV_QP_MAP_TABLE gives QPN `qpn`: byte QPN[8:1] of the table.
    pub fn qp_map_ctxt(&self, qpn: u32) -> usize {
        let idx = ((qpn >> 1) & 0xFF) as usize;
        ((self.qp_map[idx / 8] >> (8 * (idx % 8))) & 0xFF) as usize
    }

    pub fn rhq(&self, ctxt: usize) -> RhqState {
        self.rhq.get(ctxt).copied().unwrap_or_default()
    }

    pub(super) fn set_rhq(&mut self, ctxt: usize, state: RhqState) {
        if let Some(r) = self.rhq.get_mut(ctxt) {
            *r = state;
        }
    }

    /// RCV_HDR_TAIL moves to `published` dwords once a packet's writes are done.
    pub fn rhq_publish(&mut self, ctxt: usize, published: u64) {
        if let Some(r) = self.rhq.get_mut(ctxt) {
            r.set_published(published);
        }
        if let Some(n) = self.placed.get_mut(ctxt) {
            *n += 1;
        }
    }

    /// Entries published to context `ctxt` since the engine was made.
    pub fn rhq_placed(&self, ctxt: usize) -> u64 {
        self.placed.get(ctxt).copied().unwrap_or(0)
    }

    /// A packet dropped for a full header queue (RCV_HDR_OVFL_CNT).
    pub(super) fn count_overflow(&mut self, ctxt: usize) {
        if let Some(r) = self.kctxt.get_mut(ctxt) {
            let i = super::state::kreg(RCV_HDR_OVFL_CNT);
            r[i] = r[i].wrapping_add(1);
        }
    }

    /// The context's expected-receive range from RCV_TID_CTRL: (first entry, entry count).
    pub fn tid_range(&self, ctxt: usize) -> Option<(u64, u64)> {
        let v = self.kctxt(ctxt, RCV_TID_CTRL)?;
        let base = (v >> RCV_TID_CTRL_TID_BASE_INDEX_SHIFT) & RCV_TID_CTRL_TID_BASE_INDEX_MASK;
        let cnt = (v >> RCV_TID_CTRL_TID_PAIR_CNT_SHIFT) & RCV_TID_CTRL_TID_PAIR_CNT_MASK;
        Some((base << RCV_SHIFT, cnt << RCV_SHIFT))
    }

    /// The contexts whose expected range holds RcvArray entry `index` (one, unless the driver overlapped them).
    fn expected_owners(&self, index: u64) -> impl Iterator<Item = usize> + '_ {
        (0..self.contexts).filter(move |&c| self.tid_range(c).is_some_and(|(b, n)| (b..b + n).contains(&index)))
    }

    /// Whether receive context `ctxt` is a user's: its job key is on with a user's key (jkey.rs).
    pub fn is_user_ctxt(&self, ctxt: usize) -> bool {
        self.kctxt(ctxt, RCV_KEY_CTRL).is_some_and(jkey::rcv_is_user)
    }

    /// A 64-bit register read at the 8-byte-aligned `offset`.
    pub fn read(&mut self, offset: u64, counters: &Counters) -> Access {
        match decode(offset, self.contexts, self.loopback) {
            Csr::Global(i) => Access::Done(self.global[i]),
            Csr::Kctxt { ctxt, reg } => self.kctxt.get(ctxt).map_or(Access::Unimplemented, |r| Access::Done(r[reg])),
            // RCV_HDR_TAIL reads the live tail: check_packet_present compares it with the driver's head.
            Csr::Uctxt { ctxt, reg } if UCTXT_REGS[reg].offset == RCV_HDR_TAIL => {
                self.rhq.get(ctxt).map_or(Access::Unimplemented, |r| Access::Done(r.published()))
            }
            // The eager tails read the context's place in its eager buffers: the buffer the last packet took and
            // the next free 64-byte block in it (PSM2's eager-overflow recovery compares them with its heads).
            Csr::Uctxt { ctxt, reg } if UCTXT_REGS[reg].offset == RCV_EGR_INDEX_TAIL => self
                .rhq
                .get(ctxt)
                .map_or(Access::Unimplemented, |r| Access::Done(u64::from(r.egr_index) & RCV_EGR_INDEX_TAIL_TAIL_MASK)),
            Csr::Uctxt { ctxt, reg } if UCTXT_REGS[reg].offset == RCV_EGR_OFFSET_TAIL => self
                .rhq
                .get(ctxt)
                .map_or(Access::Unimplemented, |r| Access::Done(r.egr_offset & RCV_EGR_OFFSET_TAIL_TAIL_MASK)),
            Csr::Uctxt { ctxt, reg } => self.uctxt.get(ctxt).map_or(Access::Unimplemented, |r| Access::Done(r[reg])),
            Csr::Flow { ctxt, flow } => self.flows.read(ctxt, flow).map_or(Access::Unimplemented, Access::Done),
            Csr::QpMap(i) => Access::Done(self.qp_map[i]),
            Csr::RcvArray(i) => self.rcv_array.read(i, counters).map_or(Access::Unimplemented, Access::Done),
            Csr::Loopback(rel) => Access::Loopback(rel),
            Csr::Unimplemented => Access::Unimplemented,
        }
    }

    /// A 64-bit register write at the 8-byte-aligned `offset`.
    pub fn write(&mut self, offset: u64, value: u64, counters: &Counters) -> Access {
        match decode(offset, self.contexts, self.loopback) {
            Csr::Global(i) => Self::write_reg(&GLOBAL_REGS[i], &mut self.global[i], value),
            Csr::Kctxt { ctxt, reg } => match self.kctxt.get_mut(ctxt) {
                Some(r) => {
                    let was = r[reg];
                    let access = Self::write_reg(&KCTXT_REGS[reg], &mut r[reg], value);
                    // Enabling a context restarts its header queue: entry 0, sequence 1, eager buffer 0
                    // (hfi1_rcvctrl zeroes the queue and resets its own count to match).
                    let enabled = |v: u64| v & RCV_CTXT_CTRL_ENABLE_SMASK != 0;
                    let offset = KCTXT_REGS[reg].offset;
                    if offset == RCV_CTXT_CTRL && !enabled(was) && enabled(r[reg]) {
                        self.rhq[ctxt] = RhqState::default();
                    }
                    // The queue's or the eager buffers' size changed: their position must lie in the new rings.
                    if matches!(offset, RCV_HDR_CNT | RCV_HDR_ENT_SIZE | RCV_EGR_CTRL) && was != r[reg] {
                        self.refit_rhq(ctxt);
                    }
                    access
                }
                None => Access::Unimplemented,
            },
            Csr::Uctxt { ctxt, reg } => match self.uctxt.get_mut(ctxt) {
                Some(r) => Self::write_reg(&UCTXT_REGS[reg], &mut r[reg], value),
                None => Access::Unimplemented,
            },
            Csr::Flow { ctxt, flow } => {
                if !self.flows.write(ctxt, flow, value) {
                    return Access::Unimplemented;
                }
                if self.is_user_ctxt(ctxt) {
                    counters.tidflow_user_writes.fetch_add(1, Relaxed);
                }
                let e = FlowEntry::decode(self.flows.read(ctxt, flow).unwrap_or(0));
                match (e.flow_valid, e.generation == KERN_GENERATION_RESERVED) {
                    (true, false) => counters.flows_programmed.fetch_add(1, Relaxed),
                    (true, true) => counters.flows_parked.fetch_add(1, Relaxed),
                    (false, _) => 0,
                };
                Access::Done(value)
            }
            Csr::QpMap(i) => {
                self.qp_map[i] = value;
                Access::Done(value)
            }
            Csr::RcvArray(i) => {
                // Out-of-range indices are counted by the RcvArray itself.
                if self.rcv_array.write(i, value, counters) {
                    let mut owners = self.expected_owners(i).peekable();
                    if owners.peek().is_some() {
                        counters.rcv_array_expected_programmed.fetch_add(1, Relaxed);
                    }
                    if owners.any(|c| self.is_user_ctxt(c)) {
                        counters.rcv_array_user_programmed.fetch_add(1, Relaxed);
                    }
                }
                Access::Done(value)
            }
            Csr::Loopback(rel) => Access::Loopback(rel),
            Csr::Unimplemented => Access::Unimplemented,
        }
    }

    fn write_reg(def: &crate::hfi1::regs::RegDef, slot: &mut u64, value: u64) -> Access {
        if def.is_read_only() {
            return Access::ReadOnly;
        }
        *slot = apply_write(def, *slot, value);
        Access::Done(value)
    }

    /// The dump of the control socket: registers, flow tables and valid RcvArray entries.
    pub fn dump(&mut self, counters: &Counters) -> Value {
        let global: serde_json::Map<String, Value> =
            GLOBAL_REGS.iter().zip(self.global).map(|(d, v)| (d.name.to_string(), json!(format!("{v:#x}")))).collect();
        let contexts: Vec<Value> = (0..self.contexts)
            .map(|c| {
                let mut regs = serde_json::Map::new();
                for (d, v) in KCTXT_REGS.iter().zip(self.kctxt[c]).chain(UCTXT_REGS.iter().zip(self.uctxt[c])) {
                    regs.insert(d.name.to_string(), json!(format!("{v:#x}")));
                }
                let flows: Vec<Value> = (0..RXE_NUM_TID_FLOWS)
                    .filter_map(|f| {
                        let raw = self.flows.read(c, f).filter(|r| *r != 0)?;
                        Some(json!({"flow": f, "raw": format!("{raw:#x}"), "decoded": FlowEntry::decode(raw)}))
                    })
                    .collect();
                let (base, count) = self.tid_range(c).unwrap_or((0, 0));
                json!({"ctxt": c, "csrs": regs, "tid_base": base, "tid_count": count, "flows": flows})
            })
            .collect();
        let entries: Vec<Value> = self
            .rcv_array
            .valid_entries(counters)
            .into_iter()
            .map(|(i, e)| {
                json!({"index": i, "raw": format!("{:#x}", e.encode()), "buf_size_code": e.buf_size.code(),
                       "buf_size": e.buf_size.bytes(), "addr": format!("{:#x}", e.iova())})
            })
            .collect();
        json!({"global": global, "contexts": contexts, "rcv_array": entries})
    }

    /// RCV_CTXT_CTRL of a context, 0 when it does not exist.
    pub fn ctxt_ctrl(&self, ctxt: usize) -> u64 {
        self.kctxt(ctxt, RCV_CTXT_CTRL).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hfi1::regs::*;
    use std::sync::atomic::Ordering;

    fn rxe() -> (Rxe, Counters) {
        (Rxe::new(8, SharedWords::new("t", RCV_ARRAY, 4096).unwrap(), true), Counters::default())
    }

    #[test]
    fn size_registers_read_the_configuration_and_ignore_writes() {
        let (mut c, n) = rxe();
        assert_eq!(c.read(RCV_CONTEXTS, &n), Access::Done(8));
        assert_eq!(c.read(RCV_ARRAY_CNT, &n), Access::Done(4096));
        assert_eq!(c.write(RCV_ARRAY_CNT, 5, &n), Access::ReadOnly);
        assert_eq!(c.write(RCV_CONTEXTS, 5, &n), Access::ReadOnly);
        assert_eq!(c.read(RCV_ARRAY_CNT, &n), Access::Done(4096));
    }

    #[test]
    fn golden_g7_tid_ctrl_value_gives_the_expected_range() {
        let (mut c, n) = rxe();
        assert_eq!(c.write(kctxt_csr(RCV_TID_CTRL, 5), 0x0000008000000100, &n), Access::Done(0x0000008000000100));
        assert_eq!(c.tid_range(5), Some((2048, 1024)));
        assert_eq!(c.read(kctxt_csr(RCV_TID_CTRL, 5), &n), Access::Done(0x0000008000000100));
    }

    #[test]
    fn writes_keep_only_the_defined_fields() {
        let (mut c, n) = rxe();
        let table = [
            (kctxt_csr(RCV_TID_CTRL, 1), u64::MAX, 0x000001FF00001FFF),
            (kctxt_csr(RCV_EGR_CTRL, 1), u64::MAX, 0x000001FF00001FFF),
            (kctxt_csr(RCV_CTXT_CTRL, 1), u64::MAX, 0x77F),
            (RCV_BTH_QP, u64::MAX, 0x00FF0000),
            (uctxt_csr(RCV_EGR_INDEX_HEAD, 1), u64::MAX, 0x7FF),
            (uctxt_csr(RCV_HDR_HEAD, 1), u64::MAX, u64::MAX),
        ];
        for (offset, write, read) in table {
            c.write(offset, write, &n);
            assert_eq!(c.read(offset, &n), Access::Done(read), "{offset:#x}");
        }
    }

    #[test]
    fn read_only_registers_ignore_writes() {
        let (mut c, n) = rxe();
        for offset in
            [RCV_STATUS, kctxt_csr(RCV_CTXT_STATUS, 2), kctxt_csr(RCV_HDR_OVFL_CNT, 2), uctxt_csr(RCV_HDR_TAIL, 2)]
        {
            assert_eq!(c.write(offset, u64::MAX, &n), Access::ReadOnly, "{offset:#x}");
            assert_eq!(c.read(offset, &n), Access::Done(0), "{offset:#x}");
        }
    }

    #[test]
    fn offsets_of_missing_contexts_and_holes_are_unimplemented() {
        let (mut c, n) = rxe();
        for offset in [kctxt_csr(RCV_CTXT_CTRL, 8), uctxt_csr(RCV_HDR_HEAD, 8), tid_flow_csr(8, 0), CCE, TXE, 0x1000020]
        {
            assert_eq!(c.read(offset, &n), Access::Unimplemented, "{offset:#x}");
            assert_eq!(c.write(offset, 1, &n), Access::Unimplemented, "{offset:#x}");
        }
        assert_eq!(c.read(RCV_ARRAY + 8 * 4096, &n), Access::Unimplemented);
        c.write(RCV_ARRAY + 8 * 4096, 0x8000002000012345, &n);
        assert_eq!(n.rcv_array_bad_index.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn reset_returns_every_register_and_table_to_power_on_values() {
        let (mut c, n) = rxe();
        c.write(kctxt_csr(RCV_CTXT_CTRL, 3), 0x11, &n);
        c.write(tid_flow_csr(3, 4), 0x0000006F091A2800, &n);
        c.write(RCV_ARRAY + 8, 0x8000002000012345, &n);
        c.rcv_array.shared().store(2, 0x8000002000012345);
        c.reset();
        assert_eq!(c.read(kctxt_csr(RCV_CTXT_CTRL, 3), &n), Access::Done(0));
        assert_eq!(c.read(tid_flow_csr(3, 4), &n), Access::Done(0));
        assert_eq!(c.read(RCV_ARRAY + 8, &n), Access::Done(0));
        assert_eq!(c.read(RCV_ARRAY + 16, &n), Access::Done(0));
        assert_eq!(c.read(RCV_ARRAY_CNT, &n), Access::Done(4096));
    }

    #[test]
    fn dump_lists_valid_entries_and_programmed_flows() {
        let (mut c, n) = rxe();
        c.write(RCV_ARRAY + 8 * 0x100, 0x8000002000012345, &n);
        c.write(tid_flow_csr(2, 3), 0x0000006F091A2800, &n);
        let d = c.dump(&n);
        assert_eq!(d["rcv_array"][0]["index"], 0x100);
        assert_eq!(d["rcv_array"][0]["addr"], "0x12345000");
        assert_eq!(d["rcv_array"][0]["buf_size"], 8192);
        assert_eq!(d["contexts"][2]["flows"][0]["decoded"]["generation"], 0x12345);
        assert_eq!(d["global"]["RCV_ARRAY_CNT"], "0x1000");
    }
}
