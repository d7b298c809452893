//! Receive header queues and eager buffers: where a receive context puts a packet the wire brought
//! (docs/hfi1-fabric.md, "Receive").
//!
//! Each entry of a context's header queue (RCV_HDR_ADDR, RCV_HDR_CNT << 5 entries of RCV_HDR_ENT_SIZE
//! dwords) ends with the 8-byte RHF; the packet's headers sit right against it (the driver takes the header
//! at `rhf - entsize + HdrqOffset` and its length as the distance to the RHF: driver.c hfi1_get_header,
//! hfi1_setup_ib_header) and its payload, pad and ICRC go to an eager buffer, the RcvArray entry
//! `eager base + EgrIndex`, at `EgrOffset` 64-byte blocks: packets are packed into a buffer (MULTI_PKT_EGR)
//! and the next buffer is taken when the rest does not fit, unless it is the one the driver still reads
//! (RCV_EGR_INDEX_HEAD). Every entry carries RcvSeq 1..13 (the context starts at 1 on enable: hfi1_rcvctrl);
//! with TAIL_UPD the tail (in dwords, as RCV_HDR_TAIL reads it) is also DMA'd to RCV_HDR_TAIL_ADDR.
//! A full queue or a full set of eager buffers holds the packet back (DONT_DROP_*_FULL) or drops it.
//!
//! Reserving a slot happens under the RXE lock; the writes are the caller's, without it, in the order
//! payload, header, RHF, tail; then [`Rxe::rhq_publish`] moves the RCV_HDR_TAIL the driver reads.

#![forbid(unsafe_code)]

use super::state::{RhqState, Rxe};
use crate::fault::{FaultKind, Params};
use crate::hfi1::counters::Counters;
use crate::hfi1::regs::*;
use crate::probe::Probe;

/// RHF fields (common.h).
pub const RHF_PKT_LEN_MASK: u64 = 0xFFF;
pub const RHF_RCV_TYPE_SHIFT: u32 = 12;
pub const RHF_RCV_TYPE_MASK: u64 = 0x7;
pub const RHF_USE_EGR_BFR: u64 = 1 << 15;
pub const RHF_EGR_INDEX_SHIFT: u32 = 16;
pub const RHF_EGR_INDEX_MASK: u64 = 0x7FF;
pub const RHF_DC_INFO: u64 = 1 << 27;
pub const RHF_RCV_SEQ_SHIFT: u32 = 28;
pub const RHF_RCV_SEQ_MASK: u64 = 0xF;
pub const RHF_EGR_OFFSET_SHIFT: u32 = 32;
pub const RHF_EGR_OFFSET_MASK: u64 = 0xFFF;
pub const RHF_HDRQ_OFFSET_SHIFT: u32 = 44;
pub const RHF_HDRQ_OFFSET_MASK: u64 = 0x1FF;
/// Every error bit (63:53).
pub const RHF_ERROR_SMASK: u64 = 0xFFE0_0000_0000_0000;
pub const RHF_RCV_TYPE_ERR_SHIFT: u32 = 56;
pub const RHF_TID_ERR: u64 = 1 << 59;
pub const RHF_ICRC_ERR: u64 = 1 << 63;
/// RcvSeq runs 1..=RHF_MAX_SEQ and wraps to 1.
pub const RHF_MAX_SEQ: u8 = 13;
/// RHF receive types.
pub const RHF_RCV_TYPE_EXPECTED: u64 = 0;
pub const RHF_RCV_TYPE_EAGER: u64 = 1;
pub const RHF_RCV_TYPE_IB: u64 = 2;
pub const RHF_RCV_TYPE_ERROR: u64 = 3;
/// RcvTypeErr of an EXPECTED entry: the flow's sequence or generation did not match.
pub const RHF_RTE_EXPECTED_FLOW_SEQ_ERR: u64 = 0x2;
pub const RHF_RTE_EXPECTED_FLOW_GEN_ERR: u64 = 0x4;
/// RcvTypeErr of an ERROR entry: a KDETH header too short, or of a version other than 1.
pub const RHF_RTE_ERROR_KHDR_MIN_LEN_ERR: u64 = 0x2;
pub const RHF_RTE_ERROR_KHDR_KVER_ERR: u64 = 0x4;
/// Bytes of the RHF, and of an eager block (RCV_BUF_BLOCK_SIZE).
pub const RHF_BYTES: usize = 8;
pub const RCV_BUF_BLOCK_SIZE: u64 = 64;
/// RCV_HDR_CNT counts entries in 32s (HDRQ_SIZE_SHIFT).
pub const HDRQ_SIZE_SHIFT: u32 = 5;
pub const RCV_HDR_CNT_CNT_MASK: u64 = 0x1FF;
pub const RCV_HDR_ENT_SIZE_ENT_SIZE_MASK: u64 = 0x7;
pub const RCV_HDR_HEAD_HEAD_MASK: u64 = 0x7FFFF;
/// The smallest eager buffer (MIN_EAGER_BUFFER): the EGR_BUF_SIZE code n means 4 KiB << (n - 1).
pub const MIN_EAGER_BUFFER: u64 = 4096;

/// Entry size in dwords from its RCV_HDR_ENT_SIZE code (encode_rcv_header_entry_size's inverse).
pub fn entry_dwords(code: u64) -> Option<u32> {
    match code & RCV_HDR_ENT_SIZE_ENT_SIZE_MASK {
        1 => Some(2),
        2 => Some(16),
        4 => Some(32),
        _ => None,
    }
}

/// Bytes of the tail DMA.
const TAIL_BYTES: u64 = 8;

/// Where entry `tail` of a queue at `addr` with entries of `entsize` dwords starts; `None` when the entry
/// does not lie wholly below 2^64 (RCV_HDR_ADDR takes any 64-bit value).
fn entry_at(addr: u64, tail: u32, entsize: u32) -> Option<u64> {
    let bytes = u64::from(entsize) * 4;
    let entry = addr.checked_add(u64::from(tail).checked_mul(bytes)?)?;
    entry.checked_add(bytes - 1).map(|_| entry)
}

/// A packet for a receive context: its header bytes and what follows them.
#[derive(Debug)]
pub struct Arrival<'a> {
    pub header: &'a [u8],
    /// Payload, pad and ICRC.
    pub rest: &'a [u8],
    /// Whether anything but pad and ICRC follows the header (a packet without payload takes no eager
    /// buffer).
    pub has_payload: bool,
    pub sc4: bool,
    pub icrc_ok: bool,
    /// RHF RcvType.
    pub rcv_type: u64,
    /// RHF error bits the receive path found (RcvTypeErr, TidErr).
    pub errors: u64,
    /// A KDETH eager packet: when there is no eager room for its payload and the context does not hold it,
    /// the entry still goes in, without the payload and with TidErr (tid_rdma_tid_err restarts the request).
    pub tid_err_without_eager: bool,
}

impl<'a> Arrival<'a> {
    /// An IB packet: header and the payload, pad and ICRC behind it.
    pub fn ib(header: &'a [u8], rest: &'a [u8], has_payload: bool, sc4: bool, icrc_ok: bool) -> Self {
        Arrival {
            header,
            rest,
            has_payload,
            sc4,
            icrc_ok,
            rcv_type: RHF_RCV_TYPE_IB,
            errors: 0,
            tid_err_without_eager: false,
        }
    }
}

/// Where the pieces of a placed packet go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub ctxt: usize,
    /// The eager buffer address of the payload, pad and ICRC.
    pub eager: Option<u64>,
    pub header_at: u64,
    pub rhf_at: u64,
    pub rhf: u64,
    /// The tail DMA (address, value), with TAIL_UPD.
    pub tail: Option<(u64, u64)>,
    /// RCV_HDR_TAIL once written.
    pub published: u64,
    /// RcvAvail (RCV_CTXT_CTRL.INTR_AVAIL).
    pub interrupt: bool,
}

impl Plan {
    /// The plan as a hostile chip writes it: the RHF and the DMA'd tail edited where an `rhf` or
    /// `rcvhdrtail-wb` fault fires (docs/observe.md, "Faults"). The RCV_HDR_TAIL register stays true.
    pub fn hostile(mut self, probe: &Probe) -> Plan {
        let ctxt = self.ctxt as u32;
        let ours = |p: &Params| p.ctxt.is_none_or(|c| c == ctxt);
        if let Some(f) = probe.fault(FaultKind::Rhf, ours) {
            self.rhf = f.params.edit(self.rhf);
        }
        if let Some((at, tail)) = self.tail {
            if let Some(f) = probe.fault(FaultKind::RcvhdrtailWb, ours) {
                self.tail = Some((at, f.params.edit(tail)));
            }
        }
        self
    }
}

/// Why a context cannot take a packet now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Full, and the context keeps the packet until the driver frees room (DONT_DROP_*_FULL).
    Hold(Full),
    /// Dropped (counted).
    Drop(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    Rhq,
    Eager,
}

impl Rxe {
    /// Takes the next entry (and eager room) of context `ctxt` for `a`. On success the context's state has
    /// moved past the packet; on refusal nothing changed but the counters.
    pub fn rhq_reserve(&mut self, ctxt: usize, a: &Arrival<'_>, counters: &Counters) -> Result<Plan, Refusal> {
        use std::sync::atomic::Ordering::Relaxed;
        let k = |rxe: &Rxe, reg| rxe.kctxt(ctxt, reg).unwrap_or(0);
        let ctrl = k(self, RCV_CTXT_CTRL);
        if ctrl & RCV_CTXT_CTRL_ENABLE_SMASK == 0 {
            counters.rx_context_disabled.fetch_add(1, Relaxed);
            return Err(Refusal::Drop("context disabled"));
        }
        let cnt = ((k(self, RCV_HDR_CNT) & RCV_HDR_CNT_CNT_MASK) << HDRQ_SIZE_SHIFT) as u32;
        let (Some(entsize), true) = (entry_dwords(k(self, RCV_HDR_ENT_SIZE)), cnt > 0) else {
            counters.rx_rhq_unconfigured.fetch_add(1, Relaxed);
            return Err(Refusal::Drop("header queue not configured"));
        };
        let hdr_dwords = (a.header.len() / 4) as u32;
        let rhf_dwords = (RHF_BYTES / 4) as u32;
        if hdr_dwords + rhf_dwords > entsize {
            counters.rx_header_too_long.fetch_add(1, Relaxed);
            return Err(Refusal::Drop("header longer than an entry"));
        }
        let head = self.uctxt_reg(ctxt, RCV_HDR_HEAD) & RCV_HDR_HEAD_HEAD_MASK;
        let mut st = self.rhq(ctxt);
        // A size write re-derives the tail (refit_rhq), so it lies in the ring; the modulo keeps any other
        // path inside it too.
        st.tail %= cnt;
        if (st.tail + 1) % cnt == (head / u64::from(entsize)) as u32 % cnt {
            return self.full(ctxt, Full::Rhq, ctrl & RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK != 0, counters);
        }
        let tail_upd = ctrl & RCV_CTXT_CTRL_TAIL_UPD_SMASK != 0;
        let tail_addr = k(self, RCV_HDR_TAIL_ADDR);
        let entry = entry_at(k(self, RCV_HDR_ADDR), st.tail, entsize);
        let (Some(entry), true) = (entry, !tail_upd || tail_addr.checked_add(TAIL_BYTES - 1).is_some()) else {
            counters.rx_rhq_bad_address.fetch_add(1, Relaxed);
            return Err(Refusal::Drop("header queue or tail address beyond 64 bits"));
        };
        let mut tid_err = false;
        let eager = if a.has_payload {
            match self.eager_room(ctxt, ctrl, &mut st, a.rest.len() as u64, counters) {
                Ok(e) => Some(e),
                Err(Refusal::Hold(f)) => {
                    let keep = ctrl & RCV_CTXT_CTRL_DONT_DROP_EGR_FULL_SMASK != 0;
                    if keep || !a.tid_err_without_eager {
                        return self.full(ctxt, f, keep, counters);
                    }
                    counters.rx_eager_full.fetch_add(1, Relaxed);
                    tid_err = true;
                    None
                }
                // eager_room counted the cause.
                Err(_) if a.tid_err_without_eager => {
                    tid_err = true;
                    None
                }
                Err(r) => return Err(r),
            }
        } else {
            None
        };
        // entry_at checked that the whole entry lies below 2^64.
        let rhf_at = entry + u64::from(entsize - rhf_dwords) * 4;
        let pkt_dwords = ((a.header.len() + a.rest.len()) / 4) as u64;
        let mut rhf = (pkt_dwords & RHF_PKT_LEN_MASK)
            | (a.rcv_type << RHF_RCV_TYPE_SHIFT)
            | a.errors
            | (u64::from(st.seq) << RHF_RCV_SEQ_SHIFT)
            | (u64::from(entsize - hdr_dwords - rhf_dwords) << RHF_HDRQ_OFFSET_SHIFT);
        if let Some(e) = &eager {
            rhf |= RHF_USE_EGR_BFR
                | ((u64::from(e.index) & RHF_EGR_INDEX_MASK) << RHF_EGR_INDEX_SHIFT)
                | ((e.offset & RHF_EGR_OFFSET_MASK) << RHF_EGR_OFFSET_SHIFT);
        }
        if a.sc4 {
            rhf |= RHF_DC_INFO;
        }
        if !a.icrc_ok {
            rhf |= RHF_ICRC_ERR;
        }
        if tid_err {
            rhf |= RHF_TID_ERR;
        }
        st.tail = (st.tail + 1) % cnt;
        st.seq = if st.seq >= RHF_MAX_SEQ { 1 } else { st.seq + 1 };
        let published = u64::from(st.tail) * u64::from(entsize);
        let plan = Plan {
            ctxt,
            eager: eager.map(|e| e.at),
            header_at: rhf_at - a.header.len() as u64,
            rhf_at,
            rhf,
            tail: tail_upd.then_some((tail_addr, published)),
            published,
            interrupt: ctrl & RCV_CTXT_CTRL_INTR_AVAIL_SMASK != 0,
        };
        self.set_rhq(ctxt, st);
        Ok(plan)
    }

    /// Entries of context `ctxt` the driver has yet to read: from RCV_HDR_HEAD's entry up to the tail it reads
    /// (RCV_HDR_TAIL). A context disabled or without a configured queue has none: the driver no longer reads
    /// them, and enabling restarts the queue.
    pub fn rhq_pending(&self, ctxt: usize) -> u32 {
        let k = |reg| self.kctxt(ctxt, reg).unwrap_or(0);
        let cnt = ((k(RCV_HDR_CNT) & RCV_HDR_CNT_CNT_MASK) << HDRQ_SIZE_SHIFT) as u32;
        let (Some(entsize), true) = (entry_dwords(k(RCV_HDR_ENT_SIZE)), cnt > 0) else { return 0 };
        if k(RCV_CTXT_CTRL) & RCV_CTXT_CTRL_ENABLE_SMASK == 0 {
            return 0;
        }
        let entry = |dwords: u64| (dwords / u64::from(entsize) % u64::from(cnt)) as u32;
        let head = entry(self.uctxt_reg(ctxt, RCV_HDR_HEAD) & RCV_HDR_HEAD_HEAD_MASK);
        let tail = entry(self.rhq(ctxt).published());
        (tail + cnt - head) % cnt
    }

    /// Entries of context `ctxt` the driver's head has passed (or a restart of the queue discarded), counted
    /// like [`Rxe::rhq_placed`]: the entries placed less those pending. The queue keeps one entry free, so the
    /// pending ones are always the newest.
    pub fn rhq_consumed(&self, ctxt: usize) -> u64 {
        self.rhq_placed(ctxt).saturating_sub(u64::from(self.rhq_pending(ctxt)))
    }

    /// Re-derives the context's place in its header queue and eager buffers from the size registers
    /// (RCV_HDR_CNT, RCV_HDR_ENT_SIZE, RCV_EGR_CTRL) after one of them changed. The kernel writes them only
    /// while the context is disabled (set_hdrq_regs from hfi1_create_rcvhdrq, RCV_EGR_CTRL in hfi1_rcvctrl
    /// before ENABLE), and enabling restarts the queue anyway; a change under a live context is the guest's
    /// error, and the model's answer (docs/decisions.md) is that the tail and the eager index wrap into the
    /// rings now programmed, so no later write lands outside them.
    pub(super) fn refit_rhq(&mut self, ctxt: usize) {
        let Some(hdr_cnt) = self.kctxt(ctxt, RCV_HDR_CNT) else { return };
        let cnt = ((hdr_cnt & RCV_HDR_CNT_CNT_MASK) << HDRQ_SIZE_SHIFT) as u32;
        let entsize = entry_dwords(self.kctxt(ctxt, RCV_HDR_ENT_SIZE).unwrap_or(0));
        let egr = self.kctxt(ctxt, RCV_EGR_CTRL).unwrap_or(0);
        let egr_cnt = (((egr >> RCV_EGR_CTRL_EGR_CNT_SHIFT) & RCV_EGR_CTRL_EGR_CNT_MASK) << RCV_SHIFT) as u32;
        let mut st = self.rhq(ctxt);
        st.tail = match entsize {
            Some(_) if cnt > 0 => st.tail % cnt,
            _ => 0,
        };
        st.set_published(u64::from(st.tail) * u64::from(entsize.unwrap_or(0)));
        let index = st.egr_index.checked_rem(egr_cnt).unwrap_or(0);
        if index != st.egr_index {
            // Packing continues only in the buffer it started in.
            (st.egr_index, st.egr_offset) = (index, 0);
        }
        self.set_rhq(ctxt, st);
    }

    fn full(&mut self, ctxt: usize, full: Full, keep: bool, counters: &Counters) -> Result<Plan, Refusal> {
        use std::sync::atomic::Ordering::Relaxed;
        if keep {
            return Err(Refusal::Hold(full));
        }
        match full {
            Full::Rhq => {
                counters.rx_rhq_full.fetch_add(1, Relaxed);
                self.count_overflow(ctxt);
                Err(Refusal::Drop("header queue full"))
            }
            Full::Eager => {
                counters.rx_eager_full.fetch_add(1, Relaxed);
                Err(Refusal::Drop("eager buffers full"))
            }
        }
    }

    /// Room for `len` bytes in the context's eager buffers, moving to the next buffer when the current one
    /// cannot take them (or, one packet per buffer, was used at all). Moves `st` past them.
    fn eager_room(
        &mut self,
        ctxt: usize,
        ctrl: u64,
        st: &mut RhqState,
        len: u64,
        counters: &Counters,
    ) -> Result<EagerSlot, Refusal> {
        use std::sync::atomic::Ordering::Relaxed;
        let egr = self.kctxt(ctxt, RCV_EGR_CTRL).unwrap_or(0);
        let base = ((egr >> RCV_EGR_CTRL_EGR_BASE_INDEX_SHIFT) & RCV_EGR_CTRL_EGR_BASE_INDEX_MASK) << RCV_SHIFT;
        let cnt = (((egr >> RCV_EGR_CTRL_EGR_CNT_SHIFT) & RCV_EGR_CTRL_EGR_CNT_MASK) << RCV_SHIFT) as u32;
        if cnt == 0 {
            counters.rx_no_eager.fetch_add(1, Relaxed);
            return Err(Refusal::Drop("no eager buffers"));
        }
        let one_per_buffer = ctrl & RCV_CTXT_CTRL_ONE_PACKET_PER_EGR_BUFFER_SMASK != 0;
        let code = (ctrl >> RCV_CTXT_CTRL_EGR_BUF_SIZE_SHIFT) & RCV_CTXT_CTRL_EGR_BUF_SIZE_MASK;
        let blocks = len.div_ceil(RCV_BUF_BLOCK_SIZE);
        // One packet per buffer takes the size from the RcvArray entry (hfi1_rcvctrl), packing the context's.
        let fits = |rxe: &mut Rxe, i: u32, off: u64| {
            let size = if one_per_buffer || code == 0 {
                rxe.rcv_array.entry(base + u64::from(i), counters).map_or(0, |e| e.buf_size.bytes())
            } else {
                MIN_EAGER_BUFFER << (code - 1)
            };
            off.checked_add(blocks).and_then(|b| b.checked_mul(RCV_BUF_BLOCK_SIZE)).is_some_and(|end| end <= size)
        };
        let (mut index, mut offset) = (st.egr_index % cnt, st.egr_offset);
        if (one_per_buffer && offset > 0) || !fits(self, index, offset) {
            let next = (index + 1) % cnt;
            let egr_head = (self.uctxt_reg(ctxt, RCV_EGR_INDEX_HEAD) & RCV_EGR_INDEX_HEAD_HEAD_MASK) as u32;
            if next == egr_head % cnt {
                return Err(Refusal::Hold(Full::Eager));
            }
            if !fits(self, next, 0) {
                counters.rx_eager_too_small.fetch_add(1, Relaxed);
                return Err(Refusal::Drop("packet larger than an eager buffer"));
            }
            (index, offset) = (next, 0);
        }
        let Some(buf) = self.rcv_array.entry(base + u64::from(index), counters) else {
            counters.rx_eager_invalid.fetch_add(1, Relaxed);
            return Err(Refusal::Drop("eager RcvArray entry not valid"));
        };
        // `fits` bounded offset + blocks by the buffer's size: the sums below cannot overflow.
        let Some(at) = offset.checked_mul(RCV_BUF_BLOCK_SIZE).and_then(|o| buf.iova().checked_add(o)) else {
            counters.rx_rhq_bad_address.fetch_add(1, Relaxed);
            return Err(Refusal::Drop("eager address beyond 64 bits"));
        };
        st.egr_index = index;
        st.egr_offset = offset + blocks;
        Ok(EagerSlot { at, index, offset })
    }
}

/// Where a packet's payload goes: the address, and the RHF's EgrIndex and EgrOffset.
#[derive(Debug, Clone, Copy)]
struct EagerSlot {
    at: u64,
    index: u32,
    offset: u64,
}

#[cfg(test)]
#[path = "rhq_tests.rs"]
mod tests;
