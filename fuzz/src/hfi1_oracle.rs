//! Where an hfi1 function may write, decided at the moment of each write from the programming as it is then.
//!
//! [`Hfi1Oracle`] is the [`WritePolicy`] of a [`GuardedMemory`](crate::dma_oracle::GuardedMemory) in front of
//! an hfi1 function. It keeps what the harness (playing the driver) programmed into the RcvArray and the
//! packets the harness handed to the port that may still be written; it reads every other register from the
//! function when a write comes. A write is allowed only inside:
//! - for a packet being received: the ranges of the receive context the packet's header routes it to, as
//!   that context is programmed now (its header queue at RCV_HDR_ADDR of RCV_HDR_CNT entries of
//!   RCV_HDR_ENT_SIZE, the tail slot with TAIL_UPD, the eager buffers of its RCV_EGR_CTRL range, and for a
//!   KDETH packet the TIDs of its RCV_TID_CTRL range the packet names), and only while the context is enabled;
//! - on the chip personality, each SDMA engine's SEND_DMA_HEAD_ADDR and each send context's credit-return
//!   slot;
//! - on the project's function, whose loopback chains are not announced, a programmed TID of some context.
//!
//! Packets leave the port's queue in order, and each one's writes come before the next one's: a write that
//! only a later pending packet explains means the earlier ones were dropped, and they are forgotten.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, OnceLock};

use device_model::hfi1::regs::*;
use device_model::hfi1::wfr::csr::{SEND_CTXT_CREDIT_RETURN_ADDR, SEND_DMA_HEAD_ADDR};
use device_model::hfi1::wfr::pio::SEND_CTXT_CREDIT_RETURN_ADDR_ADDRESS_SMASK;
use vfio_user_proto::sync::Unpoison;

use crate::dma_oracle::WritePolicy;

/// The function's shape: what it has to be programmed.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// The chip personality (header queues, SDMA, PIO) rather than the project's function (loopback only).
    pub wfr: bool,
    pub rcv_contexts: u64,
    pub send_contexts: u64,
    pub sdma_engines: u64,
}

/// A packet the function may be writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pending {
    /// Bytes from the cable (LRH first, ICRC last), routed by their header.
    Wire { bytes: Vec<u8>, sc4: bool },
    /// A loopback packet (`inject`) for context `ctxt`, naming TID pair `tid` with `tidctrl`.
    Tid { ctxt: u64, tid: u64, tidctrl: u32 },
}

/// What the port does with a packet: the context, and whether it is KDETH (TID RDMA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Route {
    ctxt: u64,
    kdeth: bool,
}

/// Inclusive byte ranges `(first, last)`: a range may end at 2^64 - 1.
type Ranges = Vec<(u64, u64)>;

/// The EGR_BUF_SIZE code n means 4 KiB << (n - 1) (chip.c encoded_size).
const MIN_EAGER_BUFFER: u64 = 4096;
/// Bytes of the tail, SDMA head and credit-return slots.
const SLOT: u64 = 8;
/// Per-engine and per-send-context register blocks (chip_registers.h).
const TXE_STRIDE: u64 = 0x100;
/// The credit-return slot of send context `c` is `c & 7` of its block (pio.c sc_alloc).
const CREDIT_SLOTS: u64 = 8;
/// LRH (9B), GRH, BTH and ICRC bytes; LNH codes (IBA 7.7).
const LRH_BYTES: usize = 8;
const GRH_BYTES: usize = 40;
const BTH_BYTES: usize = 12;
const ICRC_BYTES: usize = 4;
const LNH_MASK: u8 = 0x3;
const LNH_GRH: u8 = 0x3;
/// SC 15 carries VL15 management packets (RCV_VL15's context).
const SC_VL15: u8 = 15;
/// KDETH word 0: TID in bits 25:16, TIDCTRL in bits 27:26 (exp_rcv.h).
const KDETH_TID_SHIFT: u32 = 16;
const KDETH_TID_MASK: u32 = 0x3FF;
const KDETH_TIDCTRL_SHIFT: u32 = 26;
const KDETH_TIDCTRL_MASK: u32 = 0x3;

type Registers = Box<dyn Fn(u64) -> u64 + Send + Sync>;

#[derive(Default)]
struct State {
    /// The buffer each RcvArray index names now, `(first, last)`.
    rcv_array: BTreeMap<u64, (u64, u64)>,
    /// Packets handed to the function that may still write, oldest first.
    pending: VecDeque<Pending>,
}

pub struct Hfi1Oracle {
    shape: Shape,
    regs: OnceLock<Registers>,
    state: Mutex<State>,
}

impl Hfi1Oracle {
    pub fn new(shape: Shape) -> Self {
        Hfi1Oracle { shape, regs: OnceLock::new(), state: Mutex::new(State::default()) }
    }

    /// How the oracle reads a 64-bit register of the function (once; later calls are ignored). Until then
    /// every register reads 0: nothing is enabled.
    pub fn connect(&self, regs: impl Fn(u64) -> u64 + Send + Sync + 'static) {
        self.regs.get_or_init(|| Box::new(regs));
    }

    fn reg(&self, offset: u64) -> u64 {
        self.regs.get().map_or(0, |r| r(offset))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unpoison()
    }

    /// What RcvArray entry `index` names from now on: `(iova, len)`, or nothing. Bounded by the index space
    /// the harness writes.
    pub fn program(&self, index: u64, buf: Option<(u64, u64)>) {
        let mut st = self.lock();
        match buf.filter(|(_, len)| *len > 0).and_then(|(iova, len)| Some((iova, iova.checked_add(len - 1)?))) {
            Some(range) => st.rcv_array.insert(index, range),
            None => st.rcv_array.remove(&index),
        };
    }

    /// The function was reset: its RcvArray is invalid and its port's queue empty.
    pub fn forget(&self) {
        *self.lock() = State::default();
    }

    /// A packet handed to the function (before it is handed over: it may be written at once).
    pub fn arrive(&self, packet: Pending) {
        self.lock().pending.push_back(packet);
    }

    /// The packet last handed over was refused (not queued): it writes nothing.
    pub fn withdraw(&self) {
        self.lock().pending.pop_back();
    }

    /// The function's port holds `queued` packets now (the newest ones): the older ones are done.
    pub fn settle(&self, queued: usize) {
        let mut st = self.lock();
        let done = st.pending.len().saturating_sub(queued);
        st.pending.drain(..done);
    }

    /// The context the port sends a packet to (ingress routing as the driver programs it: SC 15 to
    /// RCV_VL15, a DestQP[23:16] equal to RCV_BTH_QP.KDETH_QP to the context in DestQP[7:0], else
    /// RCV_QP_MAP_TABLE[QPN[8:1]] while the map is on, else context 0). Drops (port disabled, DLID filter,
    /// bad end) write nothing, so they need no rule here.
    fn route(&self, bytes: &[u8], sc4: bool) -> Option<Route> {
        let (&b0, &b1) = (bytes.first()?, bytes.get(1)?);
        let sc = (b0 >> 4) | (u8::from(sc4) << 4);
        let route = if sc == SC_VL15 {
            Route { ctxt: self.reg(RCV_VL15) & 0xFF, kdeth: false }
        } else {
            let global = b1 & LNH_MASK == LNH_GRH && bytes.len() >= LRH_BYTES + GRH_BYTES + BTH_BYTES + ICRC_BYTES;
            let bth = if global { LRH_BYTES + GRH_BYTES } else { LRH_BYTES };
            let qp = bytes.get(bth + 5..bth + 8)?;
            let qpn = u64::from_be_bytes([0, 0, 0, 0, 0, qp[0], qp[1], qp[2]]);
            let kdeth_qp = (self.reg(RCV_BTH_QP) >> RCV_BTH_QP_KDETH_QP_SHIFT) & RCV_BTH_QP_KDETH_QP_MASK;
            if kdeth_qp != 0 && qpn >> 16 == kdeth_qp {
                Route { ctxt: qpn & 0xFF, kdeth: true }
            } else if self.reg(RCV_CTRL) & RCV_CTRL_RCV_QP_MAP_ENABLE_SMASK != 0 {
                let idx = (qpn >> 1) & 0xFF;
                let map = self.reg(RCV_QP_MAP_TABLE + 8 * (idx / 8));
                Route { ctxt: (map >> (8 * (idx % 8))) & 0xFF, kdeth: false }
            } else {
                Route { ctxt: 0, kdeth: false }
            }
        };
        (route.ctxt < self.shape.rcv_contexts).then_some(route)
    }

    /// `(first entry, entries)` of a RCV_EGR_CTRL / RCV_TID_CTRL value (in groups of 8: RCV_SHIFT).
    fn rcv_range(v: u64) -> (u64, u64) {
        let base = (v >> RCV_TID_CTRL_TID_BASE_INDEX_SHIFT) & RCV_TID_CTRL_TID_BASE_INDEX_MASK;
        let cnt = (v >> RCV_TID_CTRL_TID_PAIR_CNT_SHIFT) & RCV_TID_CTRL_TID_PAIR_CNT_MASK;
        (base << RCV_SHIFT, cnt << RCV_SHIFT)
    }

    /// The TIDs of context `ctxt` that pair `tid` with `tidctrl` names, as programmed now.
    fn tids(&self, st: &State, ctxt: u64, tid: u64, tidctrl: u32, out: &mut Ranges) {
        let (base, cnt) = Self::rcv_range(self.reg(kctxt_csr(RCV_TID_CTRL, ctxt)));
        let halves: &[u64] = match tidctrl {
            1 => &[0],
            2 => &[1],
            3 => &[0, 1],
            _ => &[],
        };
        let named = halves.iter().map(|h| 2 * tid + h).filter(|rel| *rel < cnt);
        out.extend(named.filter_map(|rel| st.rcv_array.get(&(base + rel)).copied()));
    }

    /// Header queue, tail slot and eager buffers of context `ctxt`, as programmed now; nothing while it is
    /// disabled.
    fn context(&self, st: &State, ctxt: u64, out: &mut Ranges) {
        let k = |reg| self.reg(kctxt_csr(reg, ctxt));
        let ctrl = k(RCV_CTXT_CTRL);
        if ctrl & RCV_CTXT_CTRL_ENABLE_SMASK == 0 {
            return;
        }
        // RCV_HDR_CNT counts 32 entries; RCV_HDR_ENT_SIZE codes 1, 2, 4 are 2, 16, 32 dwords (chip.c
        // encode_rcv_header_entry_size).
        let entries = (k(RCV_HDR_CNT) & 0x1FF) << 5;
        let dwords = match k(RCV_HDR_ENT_SIZE) & 0x7 {
            1 => 2,
            2 => 16,
            4 => 32,
            _ => 0,
        };
        if entries * dwords > 0 {
            let addr = k(RCV_HDR_ADDR);
            out.push((addr, addr.saturating_add(entries * dwords * 4 - 1)));
        }
        if ctrl & RCV_CTXT_CTRL_TAIL_UPD_SMASK != 0 {
            let tail = k(RCV_HDR_TAIL_ADDR);
            out.push((tail, tail.saturating_add(SLOT - 1)));
        }
        // Packing packets into eager buffers, the chip takes the context's EGR_BUF_SIZE as their size; one
        // packet per buffer, the entry's own (hfi1_rcvctrl programs both alike; rhq.rs follows the chip).
        let code = (ctrl >> RCV_CTXT_CTRL_EGR_BUF_SIZE_SHIFT) & RCV_CTXT_CTRL_EGR_BUF_SIZE_MASK;
        let packed = code != 0 && ctrl & RCV_CTXT_CTRL_ONE_PACKET_PER_EGR_BUFFER_SMASK == 0;
        let (base, cnt) = Self::rcv_range(k(RCV_EGR_CTRL));
        out.extend((base..base + cnt).filter_map(|i| st.rcv_array.get(&i).copied()).map(|(first, last)| {
            if packed {
                (first, first.saturating_add((MIN_EAGER_BUFFER << (code - 1)) - 1))
            } else {
                (first, last)
            }
        }));
    }

    /// What packet `p` may write now.
    fn packet(&self, st: &State, p: &Pending) -> Ranges {
        let mut out = Vec::new();
        match p {
            Pending::Wire { bytes, sc4 } => {
                let Some(route) = self.route(bytes, *sc4) else { return out };
                self.context(st, route.ctxt, &mut out);
                if route.kdeth {
                    let global =
                        bytes[1] & LNH_MASK == LNH_GRH && bytes.len() >= LRH_BYTES + GRH_BYTES + BTH_BYTES + ICRC_BYTES;
                    let at = if global { LRH_BYTES + GRH_BYTES } else { LRH_BYTES } + BTH_BYTES;
                    if let Some(w) = bytes.get(at..at + 4) {
                        let kdeth0 = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                        let tid = u64::from((kdeth0 >> KDETH_TID_SHIFT) & KDETH_TID_MASK);
                        let tidctrl = (kdeth0 >> KDETH_TIDCTRL_SHIFT) & KDETH_TIDCTRL_MASK;
                        self.tids(st, route.ctxt, tid, tidctrl, &mut out);
                    }
                }
            }
            Pending::Tid { ctxt, tid, tidctrl } => {
                if *ctxt < self.shape.rcv_contexts
                    && self.reg(kctxt_csr(RCV_CTXT_CTRL, *ctxt)) & RCV_CTXT_CTRL_ENABLE_SMASK != 0
                {
                    self.tids(st, *ctxt, *tid, *tidctrl, &mut out);
                }
            }
        }
        out
    }

    /// The SDMA head and credit-return slots, as programmed now.
    fn slots(&self) -> Ranges {
        let heads = (0..self.shape.sdma_engines).map(|e| self.reg(SEND_DMA_HEAD_ADDR + TXE_STRIDE * e));
        let credits = (0..self.shape.send_contexts).map(|c| {
            let addr =
                self.reg(SEND_CTXT_CREDIT_RETURN_ADDR + TXE_STRIDE * c) & SEND_CTXT_CREDIT_RETURN_ADDR_ADDRESS_SMASK;
            addr.saturating_add(SLOT * (c % CREDIT_SLOTS))
        });
        heads.chain(credits).map(|a| (a, a.saturating_add(SLOT - 1))).collect()
    }

    /// Every programmed TID of any context: where an unannounced loopback packet may write.
    fn any_tid(&self, st: &State) -> Ranges {
        (0..self.shape.rcv_contexts)
            .flat_map(|c| {
                let (base, cnt) = Self::rcv_range(self.reg(kctxt_csr(RCV_TID_CTRL, c)));
                st.rcv_array.range(base..base + cnt).map(|(_, r)| *r).collect::<Vec<_>>()
            })
            .collect()
    }
}

impl WritePolicy for Hfi1Oracle {
    fn check(&self, iova: u64, len: u64) -> Result<(), &'static str> {
        if len == 0 {
            return Ok(());
        }
        let last = iova.checked_add(len - 1).ok_or("device write wraps past 2^64")?;
        let fits = |ranges: &Ranges| ranges.iter().any(|&(first, end)| iova >= first && last <= end);
        let mut st = self.lock();
        if let Some(i) = (0..st.pending.len()).find(|&i| fits(&self.packet(&st, &st.pending[i]))) {
            // Packets leave the port in order: the ones it took before this one are done. (A loopback packet
            // does not pass the port.)
            if matches!(st.pending[i], Pending::Wire { .. }) {
                let mut at = 0;
                st.pending.retain(|p| {
                    at += 1;
                    at > i || !matches!(p, Pending::Wire { .. })
                });
            }
            return Ok(());
        }
        if self.shape.wfr && fits(&self.slots()) {
            return Ok(());
        }
        if !self.shape.wfr && st.pending.is_empty() && fits(&self.any_tid(&st)) {
            return Ok(());
        }
        Err(if st.pending.is_empty() {
            "device write outside every programmed slot while no packet is being received"
        } else {
            "device write outside what the packets being received may reach as programmed now"
        })
    }

    fn reset(&self) {
        self.forget();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::*;
    use crate::dma_oracle::GuardedMemory;
    use vfio_user_proto::dma::DmaAccess;

    const HDRQ: u64 = 0x10_0000;
    const TAIL: u64 = 0x1F_F000;
    const EAGER: u64 = 0x40_0000;
    const TID_BUF: u64 = 0x60_0000;
    const SDMA_HEAD: u64 = 0x1E_0000;

    /// Registers as a driver programmed them, readable by the oracle and writable by the test.
    #[derive(Clone, Default)]
    struct Regs(Arc<Mutex<HashMap<u64, u64>>>);
    impl Regs {
        fn set(&self, offset: u64, v: u64) {
            self.0.lock().unwrap().insert(offset, v);
        }
        fn k(&self, reg: u64, ctxt: u64, v: u64) {
            self.set(kctxt_csr(reg, ctxt), v);
        }
    }

    /// A chip personality with contexts 1 and 2 as hfi1_rcvctrl enables them: 64 entries of 32 dwords each
    /// (context 2's ring right behind context 1's), TAIL_UPD, eager buffer 8 * c (16 KiB), TID pair 0 of
    /// context 2 at TID_BUF; KDETH QP 0x80; an SDMA engine writing its head back.
    fn rig() -> (Arc<Hfi1Oracle>, GuardedMemory, Regs) {
        let shape = Shape { wfr: true, rcv_contexts: 4, send_contexts: 8, sdma_engines: 2 };
        let oracle = Arc::new(Hfi1Oracle::new(shape));
        let regs = Regs::default();
        let r = regs.clone();
        oracle.connect(move |off| r.0.lock().unwrap().get(&off).copied().unwrap_or(0));
        for c in [1, 2] {
            regs.k(RCV_HDR_ADDR, c, HDRQ + (c - 1) * 0x2000);
            regs.k(RCV_HDR_CNT, c, 2);
            regs.k(RCV_HDR_ENT_SIZE, c, 4);
            regs.k(RCV_HDR_TAIL_ADDR, c, TAIL + 8 * c);
            regs.k(RCV_EGR_CTRL, c, (1 << RCV_EGR_CTRL_EGR_CNT_SHIFT) | c);
            regs.k(RCV_CTXT_CTRL, c, RCV_CTXT_CTRL_ENABLE_SMASK | RCV_CTXT_CTRL_TAIL_UPD_SMASK);
            oracle.program(8 * c, Some((EAGER + 0x4000 * c, 0x4000)));
        }
        regs.k(RCV_TID_CTRL, 2, (1 << RCV_TID_CTRL_TID_PAIR_CNT_SHIFT) | 8);
        oracle.program(64, Some((TID_BUF, 0x1000)));
        regs.set(RCV_BTH_QP, 0x80 << RCV_BTH_QP_KDETH_QP_SHIFT);
        regs.set(SEND_DMA_HEAD_ADDR, SDMA_HEAD);
        let mem = GuardedMemory::with_policy(&[(0x10_0000, 0x60_0000)], oracle.clone());
        (oracle, mem, regs)
    }

    /// A 9B packet (VL 0, BTH next) to `dest_qp`, with KDETH word 0 `kdeth0` behind the BTH.
    fn packet(dest_qp: u32, kdeth0: u32) -> Pending {
        let mut b = vec![0u8; 64];
        b[1] = 0x2;
        b[2..4].copy_from_slice(&0xFFFFu16.to_be_bytes());
        b[12..16].copy_from_slice(&dest_qp.to_be_bytes());
        b[20..24].copy_from_slice(&kdeth0.to_le_bytes());
        Pending::Wire { bytes: b, sc4: false }
    }

    /// KDETH to context `c`, TID pair 0, TIDCTRL 1 (the even entry).
    fn kdeth(c: u32) -> Pending {
        packet((0x80 << 16) | c, 1 << KDETH_TIDCTRL_SHIFT)
    }

    #[test]
    fn a_packets_writes_to_its_own_contexts_queue_tail_eager_buffer_and_named_tid_are_allowed() {
        let (oracle, m, _) = rig();
        oracle.arrive(kdeth(2));
        let writes = [
            (TID_BUF + 0x100, 64),          // the TID it names
            (EAGER + 0x8000 + 0x40, 128),   // context 2's eager buffer
            (HDRQ + 0x2000 + 63 * 128, 40), // the last entry of context 2's queue
            (TAIL + 16, 8),                 // its tail slot
        ];
        for (at, len) in writes {
            assert_eq!(m.write(at, &vec![1; len]), Ok(()), "{at:#x}");
        }
        oracle.settle(0);
        // With no packet left, only the SDMA head slot takes writes.
        assert_eq!(m.write(SDMA_HEAD, &[2; 8]), Ok(()));
        assert!(m.violations().is_empty(), "{:?}", m.violations());
    }

    #[test]
    fn a_write_to_another_contexts_queue_than_the_one_the_packet_is_routed_to_is_a_violation() {
        // (why, the packet, the write)
        let table: [(&str, Pending, u64); 4] = [
            ("KDETH for context 2 into context 1's queue", kdeth(2), HDRQ),
            ("KDETH for context 1 into the TID of context 2", kdeth(1), TID_BUF),
            ("KDETH for context 2 into context 1's eager buffer", kdeth(2), EAGER + 0x4000),
            // QP map off: every non-KDETH packet goes to context 0, which is disabled.
            ("an IB packet into context 2's queue", packet(0x12, 0), HDRQ + 0x2000),
        ];
        for (why, p, at) in table {
            let (oracle, m, _) = rig();
            oracle.arrive(p);
            assert!(m.write(at, &[1; 8]).is_err(), "{why}");
            assert_eq!(m.violations().len(), 1, "{why}");
        }
    }

    #[test]
    fn the_qp_map_and_vl15_route_ib_packets_to_their_context() {
        let (oracle, m, regs) = rig();
        regs.set(RCV_CTRL, RCV_CTRL_RCV_QP_MAP_ENABLE_SMASK);
        // QPN 0x12: index QPN[8:1] = 9, byte 1 of the second map register.
        regs.set(RCV_QP_MAP_TABLE + 8, 2 << 8);
        oracle.arrive(packet(0x12, 0));
        assert_eq!(m.write(HDRQ + 0x2000, &[1; 8]), Ok(()));
        assert!(m.write(HDRQ, &[1; 8]).is_err(), "context 1 is not the map's");
        oracle.settle(0);
        regs.set(RCV_VL15, 1);
        let Pending::Wire { mut bytes, .. } = packet(0x12, 0) else { unreachable!() };
        bytes[0] = 0xF0; // VL 15
        oracle.arrive(Pending::Wire { bytes, sc4: false });
        assert_eq!(m.write(HDRQ, &[1; 8]), Ok(()));
    }

    #[test]
    fn a_write_past_a_ring_that_shrank_while_live_is_a_violation() {
        let (oracle, m, regs) = rig();
        oracle.arrive(kdeth(1));
        assert_eq!(m.write(HDRQ + 40 * 128, &[1; 128]), Ok(()), "entry 40 of 64");
        // The guest shrinks context 1's ring to 32 entries, then to entries of 16 dwords.
        regs.k(RCV_HDR_CNT, 1, 1);
        assert!(m.write(HDRQ + 40 * 128, &[1; 128]).is_err(), "entry 40 of a 32-entry ring: stale tail");
        assert_eq!(m.write(HDRQ + 31 * 128, &[1; 128]), Ok(()));
        regs.k(RCV_HDR_ENT_SIZE, 1, 2);
        assert!(m.write(HDRQ + 31 * 128, &[1; 128]).is_err(), "beyond 32 entries of 64 bytes");
        // Disabled: nothing.
        regs.k(RCV_CTXT_CTRL, 1, 0);
        assert!(m.write(HDRQ, &[1; 8]).is_err());
        assert_eq!(m.violations().len(), 3);
    }

    #[test]
    fn packets_are_written_in_order_and_a_write_only_a_later_one_explains_retires_the_earlier() {
        let (oracle, m, _) = rig();
        oracle.arrive(kdeth(1));
        oracle.arrive(kdeth(2));
        // The first one was dropped: the second one writes context 2.
        assert_eq!(m.write(HDRQ + 0x2000, &[1; 8]), Ok(()));
        assert!(m.write(HDRQ, &[1; 8]).is_err(), "context 1's packet is done");
        // A packet the port did not queue writes nothing.
        oracle.arrive(kdeth(1));
        oracle.withdraw();
        assert!(m.write(HDRQ, &[1; 8]).is_err());
        assert_eq!(m.violations().len(), 2);
    }

    #[test]
    fn a_reprogrammed_rcv_array_entry_no_longer_takes_writes_at_its_old_buffer() {
        let (oracle, m, _) = rig();
        oracle.program(64, Some((TID_BUF + 0x10_000, 0x1000)));
        oracle.arrive(kdeth(2));
        assert!(m.write(TID_BUF, &[1; 8]).is_err());
        assert_eq!(m.write(TID_BUF + 0x10_000, &[1; 8]), Ok(()));
        oracle.program(64, None);
        assert!(m.write(TID_BUF + 0x10_000, &[1; 8]).is_err());
    }

    #[test]
    fn the_projects_function_writes_only_programmed_tids_of_some_context_and_an_injected_packet_only_its_own() {
        let oracle =
            Arc::new(Hfi1Oracle::new(Shape { wfr: false, rcv_contexts: 4, send_contexts: 0, sdma_engines: 0 }));
        let regs = Regs::default();
        let r = regs.clone();
        oracle.connect(move |off| r.0.lock().unwrap().get(&off).copied().unwrap_or(0));
        regs.k(RCV_TID_CTRL, 2, (1 << RCV_TID_CTRL_TID_PAIR_CNT_SHIFT) | 8);
        regs.k(RCV_CTXT_CTRL, 2, RCV_CTXT_CTRL_ENABLE_SMASK);
        oracle.program(64, Some((TID_BUF, 0x1000)));
        oracle.program(65, Some((TID_BUF + 0x1000, 0x1000)));
        oracle.program(7, Some((EAGER, 0x1000)));
        let m = GuardedMemory::with_policy(&[(0x10_0000, 0x60_0000)], oracle.clone());
        assert_eq!(m.write(TID_BUF + 0x1000, &[1; 8]), Ok(()), "a loopback chain: any context's TID");
        assert!(m.write(EAGER, &[1; 8]).is_err(), "entry 7 is no context's TID");
        oracle.arrive(Pending::Tid { ctxt: 2, tid: 0, tidctrl: 1 });
        assert_eq!(m.write(TID_BUF, &[1; 8]), Ok(()));
        assert!(m.write(TID_BUF + 0x1000, &[1; 8]).is_err(), "the odd entry is not the one it names");
    }

    /// The chip personality itself, driven as the kernel drives it, behind the oracle: every write it makes
    /// is one the oracle allows (no false alarm), including a held packet that a later register write
    /// releases and a ring that shrinks while live.
    mod with_the_chip {
        use std::sync::{Arc, Weak};

        use device_model::engine::{Engine, NoInterrupt};
        use device_model::hfi1::cable::wire::WirePacket;
        use device_model::hfi1::regs::*;
        use device_model::hfi1::{Hfi1, Hfi1Config, Personality, WorkerMode, HFI1_BAR};

        use super::super::*;
        use crate::dma_oracle::GuardedMemory;

        const HDRQ: u64 = 0x10_0000;
        const TAIL: u64 = 0x1F_F000;
        const EAGER: u64 = 0x40_0000;
        const TID_BUF: u64 = 0x60_0000;

        struct Chip {
            hfi: Arc<Hfi1>,
            oracle: Arc<Hfi1Oracle>,
            mem: Arc<GuardedMemory>,
        }

        fn read64(hfi: &Hfi1, offset: u64) -> u64 {
            let mut b = [0u8; 8];
            hfi.mmio_read(HFI1_BAR, offset, &mut b);
            u64::from_le_bytes(b)
        }

        impl Chip {
            fn new() -> Chip {
                let cfg = Hfi1Config { worker: WorkerMode::Inline, ..Hfi1Config::wfr() };
                let Personality::Wfr(shape) = cfg.personality else { unreachable!() };
                let shape = Shape {
                    wfr: true,
                    rcv_contexts: cfg.rcv_contexts as u64,
                    send_contexts: u64::from(shape.send_contexts),
                    sdma_engines: u64::from(shape.sdma_engines),
                };
                let hfi = Arc::new(Hfi1::new(cfg).unwrap());
                let oracle = Arc::new(Hfi1Oracle::new(shape));
                let weak: Weak<Hfi1> = Arc::downgrade(&hfi);
                oracle.connect(move |off| weak.upgrade().map_or(0, |h| read64(&h, off)));
                let mem = Arc::new(GuardedMemory::with_policy(&[(0x10_0000, 0x60_0000)], oracle.clone()));
                hfi.attach(mem.clone(), Arc::new(NoInterrupt));
                Chip { hfi, oracle, mem }
            }
            fn w(&self, offset: u64, v: u64) {
                self.hfi.mmio_write(HFI1_BAR, offset, &v.to_le_bytes());
            }
            fn k(&self, reg: u64, ctxt: u64, v: u64) {
                self.w(kctxt_csr(reg, ctxt), v);
            }
            /// hfi1_put_tid: WRITE_ENABLE, size code, address in 4 KiB units; told to the oracle as the
            /// fuzz harness does.
            fn tid(&self, index: u64, iova: u64, code: u64) {
                self.oracle.program(index, Some((iova, 4096 << (code - 1))));
                self.w(RCV_ARRAY + 8 * index, RCV_ARRAY_RT_WRITE_ENABLE_SMASK | (code << 36) | (iova >> 12));
            }
            /// A packet from the cable, announced to the oracle first.
            fn wire(&self, body: Vec<u8>) {
                let p = WirePacket::seal(body, false, false).unwrap();
                self.oracle.arrive(Pending::Wire { bytes: p.bytes.clone(), sc4: false });
                if !self.hfi.wire(p).unwrap() {
                    self.oracle.withdraw();
                }
                self.oracle.settle(self.hfi.ingress_queued());
            }
        }

        /// LRH (VL 0, BTH next, permissive DLID) and BTH to `qp`, then `rest`.
        fn packet(opcode: u8, qp: u32, rest: &[u8]) -> Vec<u8> {
            let mut b = vec![0u8; 20];
            b[1] = 0x2;
            b[2..4].copy_from_slice(&0xFFFFu16.to_be_bytes());
            b[4..6].copy_from_slice(&(((20 + rest.len() + 4) / 4) as u16).to_be_bytes());
            b[8] = opcode;
            b[12..16].copy_from_slice(&qp.to_be_bytes());
            b.extend_from_slice(rest);
            b
        }

        /// A KDETH header (KVER 1, TID pair 0, `tidctrl`) and the rest of the 36-byte TID RDMA header, then
        /// `payload` bytes.
        fn kdeth(tidctrl: u32, payload: usize) -> Vec<u8> {
            let mut k = vec![0u8; 36];
            k[0..4].copy_from_slice(&((1u32 << 30) | (tidctrl << 26)).to_le_bytes());
            k.resize(36 + payload, 0x5A);
            k
        }

        #[test]
        fn everything_a_chip_programmed_as_the_kernel_does_writes_is_allowed() {
            let c = Chip::new();
            // Contexts 1 and 2 as hfi1_rcvctrl enables them: 64 entries of 32 dwords, TAIL_UPD, 8 eager buffers
            // of 16 KiB (entries 8c..8c+8, EGR_BUF_SIZE 16 KiB), context 2 also TIDs 64..72; context 1 holds a
            // packet for a full queue (DONT_DROP_RHQ_FULL).
            for ctxt in [1, 2] {
                c.k(RCV_HDR_ADDR, ctxt, HDRQ + 0x4000 * ctxt);
                c.k(RCV_HDR_CNT, ctxt, 2);
                c.k(RCV_HDR_ENT_SIZE, ctxt, 4);
                c.k(RCV_HDR_SIZE, ctxt, 9);
                c.k(RCV_HDR_TAIL_ADDR, ctxt, TAIL + 8 * ctxt);
                c.k(RCV_EGR_CTRL, ctxt, (1 << RCV_EGR_CTRL_EGR_CNT_SHIFT) | ctxt);
                for i in 0..8 {
                    c.tid(8 * ctxt + i, EAGER + 0x2_0000 * ctxt + 0x4000 * i, 3);
                }
                let ctrl = RCV_CTXT_CTRL_ENABLE_SMASK
                    | RCV_CTXT_CTRL_TAIL_UPD_SMASK
                    | RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK
                    | (3 << RCV_CTXT_CTRL_EGR_BUF_SIZE_SHIFT);
                c.k(RCV_CTXT_CTRL, ctxt, ctrl);
            }
            c.k(RCV_TID_CTRL, 2, (1 << RCV_TID_CTRL_TID_PAIR_CNT_SHIFT) | 8);
            c.tid(64, TID_BUF, 1);
            c.w(RCV_BTH_QP, 0x80 << RCV_BTH_QP_KDETH_QP_SHIFT);
            // The QP map sends QPN 0x12 (index 9) to context 1.
            c.w(RCV_QP_MAP_TABLE + 8, 1 << 8);
            c.w(RCV_CTRL, RCV_CTRL_RCV_PORT_ENABLE_SMASK | RCV_CTRL_RCV_QP_MAP_ENABLE_SMASK);

            // UD SEND_ONLY with a 256-byte payload to context 1; KDETH eager and expected to context 2.
            c.wire(packet(0x64, 0x12, &[0xA5; 8 + 256]));
            c.wire(packet(0xE0, (0x80 << 16) | 2, &kdeth(0, 64)));
            c.wire(packet(0xE5, (0x80 << 16) | 2, &kdeth(1, 512)));
            assert_eq!(c.mem.violations(), vec![]);
            // Each: its payload (eager buffer or TID), header, RHF and tail (docs/hfi1-fabric.md, "Receive").
            assert_eq!(c.mem.device_writes(), 3 * 4);

            // Fill context 1: with the head at 0, 63 entries fit (one is taken) and the 64th packet is held.
            for _ in 0..63 {
                c.wire(packet(0x64, 0x12, &[0xA5; 8 + 64]));
            }
            assert_eq!(c.hfi.ingress_queued(), 1, "held for room");
            // The driver moves the head (update_usrhead): the held packet is written during that write.
            let before = c.mem.device_writes();
            c.w(uctxt_csr(RCV_HDR_HEAD, 1), 8 * 32);
            assert!(c.mem.device_writes() > before);
            c.oracle.settle(c.hfi.ingress_queued());

            // The driver keeps up for 40 more packets, then the guest shrinks context 1's ring to 32 entries of
            // 16 dwords while it is live (the tail is at entry 40).
            let keep_up = |c: &Chip| c.w(uctxt_csr(RCV_HDR_HEAD, 1), read64(&c.hfi, uctxt_csr(RCV_HDR_TAIL, 1)));
            for _ in 0..40 {
                keep_up(&c);
                c.wire(packet(0x64, 0x12, &[0xA5; 8 + 64]));
            }
            c.k(RCV_HDR_CNT, 1, 1);
            c.k(RCV_HDR_ENT_SIZE, 1, 2);
            for _ in 0..40 {
                keep_up(&c);
                c.wire(packet(0x64, 0x12, &[0xA5; 8 + 64]));
            }
            assert_eq!(c.mem.violations(), vec![]);
            assert_eq!(c.mem.check_snapshot(), None);
        }
    }
}
