//! End B's side of TID RDMA for the `tid` case: a kernel receive context with TID RDMA on, as the Linux hfi1
//! driver programs it for a requester's RDMA READ (hfi1_rcvctrl, hfi1_kern_init_ctxt_generations,
//! hfi1_kern_exp_rcv_setup): its header queue with a DMA'd tail, one hardware flow, and the RcvArray pairs of a
//! receive buffer whose pages are scattered (no two of them adjacent, as pinned user memory is). Then the
//! responder's READ_RESP packets for those TIDs (hfi1_build_tid_rdma_read_resp), and the check of what landed.
//! The tidarray, the packets' KDETH fields and the flow values come from udriver's reading of tid_rdma.c, the
//! expectations from the kernel's receive side (tid_rdma.c, common.h), not from the model.

#![forbid(unsafe_code)]

use std::time::Instant;

use device_model::hfi1::cable::wire::{BTH_BYTES, ICRC_BYTES, LNH_BTH, LRH_BYTES, OPCODE_TID_RDMA_READ_RESP};
use device_model::hfi1::wfr::IS_RCVAVAIL_START;
use device_model::hfi1::{
    RHF_BYTES, RHF_ERROR_SMASK, RHF_HDRQ_OFFSET_MASK, RHF_HDRQ_OFFSET_SHIFT, RHF_MAX_SEQ, RHF_PKT_LEN_MASK,
    RHF_RCV_SEQ_MASK, RHF_RCV_SEQ_SHIFT, RHF_RCV_TYPE_MASK, RHF_RCV_TYPE_SHIFT, RHF_USE_EGR_BFR,
};
use udriver::hfi1::exp_rcv::TidRdmaFlow;
use udriver::hfi1::flow::kern_flow_generation_next;
use udriver::hfi1::loopback::{tid_flow_qp, tid_rdma_data_packets, TidDataPacket};
use udriver::hfi1::pageset::{dma_map_flow, tid_rdma_find_phys_blocks_4k};
use udriver::hfi1::regs as k;
use udriver::hfi1::tid::trdma_pset_order;
use vfio_user_proto::dma::DmaAccess;

use super::fabric_rig::{Hfi, ENTRY_DWORDS, RCV_HDR_ENT_SIZE_32, RHQ_ENTRIES, STALL, V_RCVAVAIL_2};

/// TID_RDMA_MAX_SEGMENT_SIZE (tid_rdma.h:18): the kernel cuts every TID RDMA request into segments of 256 KiB.
pub const SEGMENT_BYTES: usize = 256 * 1024;
/// The path MTU of TID RDMA data on this fabric (OPA_MTU_4096: tid_rdma_find_phys_blocks_4k's path,
/// tid_rdma.c:1192-1199), and a page.
pub const PMTU: usize = 4096;
const PAGE: usize = 4096;
pub const SEGMENT_PACKETS: usize = SEGMENT_BYTES / PMTU;
const SEGMENT_PAGES: usize = SEGMENT_BYTES / PAGE;
/// Segments whose TIDs are programmed at once: a READ request keeps at most TID_RDMA_MAX_READ_SEGS_PER_REQ (6,
/// tid_rdma.c:59) in flight; four make a 1 MiB doorbell.
pub const MAX_SEGMENTS: usize = 4;
/// The receive buffer's pages, and the region they are scattered over: every other page of it is a gap that
/// nothing may write.
const BUFFER_PAGES: usize = MAX_SEGMENTS * SEGMENT_PAGES;
const REGION_PAGES: usize = 2 * BUFFER_PAGES;
/// Buffer page `p` sits at region page `2 * (p * SCATTER mod BUFFER_PAGES) + 1`: odd, so a permutation, and
/// neighbours land at least 74 pages apart, so tid_rdma_find_phys_blocks_4k finds a set of one page for each.
const SCATTER: usize = 37;
/// What the gaps hold; a page of the buffer holds it too until a packet lands there.
const CANARY: u8 = 0xC5;

/// The requester's kernel context on end B (the verbs traffic of the `fabric` case has context 1), and the
/// hardware flow its QP got: kern_reserve_flow takes the first free one (ffz, tid_rdma.c:726).
const CTXT: u32 = 2;
const FLOW: u32 = 0;
/// RVT_KDETH_QP_PREFIX, which init_kdeth_qp writes to RCV_BTH_QP (chip.c:14147-14156) and tid_rdma.c puts in
/// bits 23:16 of every TID QP (tid_rdma.c:197).
const KDETH_QP_PREFIX: u32 = 0x80;
/// The flow's first generation: hfi1_kern_init_ctxt_generations draws it at random (tid_rdma.c:848-856).
const FIRST_GENERATION: u32 = 0x2_4680;
/// The context's expected range: RcvArray entries from 2048, 1024 of them (hfi1_rcvctrl writes base and count
/// >> RCV_SHIFT to RCV_TID_CTRL, chip.c:12068-12074); the eager buffers of context 1 are entries 0..32.
const TID_BASE: u32 = 2048;
const TID_COUNT: u32 = 1024;
/// DEFAULT_RCVHDRSIZE (hfi.h:2077): RCV_HDR_SIZE's dwords of KDETH header behind the BTH (chip.c:11987), the
/// 36-byte TID RDMA header.
const RCV_HDR_SIZE_DWORDS: u64 = 9;
/// TID_RDMA_JKEY (tid_rdma.c:54): the J_KEY in KDETH word 1 of every kernel TID RDMA packet.
const TID_RDMA_JKEY: u32 = 32;
/// The TIDCTRL of a pair: both entries, even then odd (kern_program_rcv_group's `tidctrl = pair ? 0x3`,
/// tid_rdma.c:1329).
const TIDCTRL_PAIR: u32 = 3;
/// RHF_RCV_TYPE_EXPECTED (common.h:193).
const RHF_RCV_TYPE_EXPECTED: u64 = 0;
/// The requester's verbs QP, which the response names in `verbs_qp` (the chip does not read it).
const VERBS_QP: u32 = 0x12;
/// LRH addresses: B has LID 2, A LID 1, as in the `fabric` case.
const DLID: u16 = 2;
const SLID: u16 = 1;

/// LRH, BTH and the TID RDMA READ_RESP header (KDETH and the rest of tid_rdma_read_resp: 9 dwords).
pub const HEADER_BYTES: usize = LRH_BYTES + BTH_BYTES + 4 * RCV_HDR_SIZE_DWORDS as usize;

/// Where B keeps the context's memory (the `fabric` rig's is below 0x1100_0000).
const K_HDRQ: u64 = 0x200_0000;
const K_TAIL: u64 = 0x210_0000;
pub const REGION: u64 = 0x4000_0000;

/// The IOVA of buffer page `p`.
fn page_iova(p: usize) -> u64 {
    REGION + ((2 * (p * SCATTER % BUFFER_PAGES) + 1) * PAGE) as u64
}

/// One doorbell's packets: the headers in sending order, the buffer page each payload must land on, the last
/// packet of each segment (the one that makes a header-queue entry), and the flow's next PSN afterwards.
pub struct Round {
    pub headers: Vec<Vec<u8>>,
    pages: Vec<usize>,
    lasts: Vec<usize>,
    next_psn: u32,
}

impl Round {
    pub fn packets(&self) -> usize {
        self.headers.len()
    }
}

/// The requester's receive context, as its driver keeps track of it.
pub struct TidContext {
    /// Header-queue entries consumed, modulo the queue, and the RcvSeq the next entry must carry.
    head: u64,
    seq: u64,
    /// The QP's flow state (qpriv->flow_state): generation, next sequence, and the IB PSN of the next packet.
    generation: u32,
    psn: u32,
    ib_psn: u32,
    /// Per segment slot, its tidarray (EXP_TID entries); the slot the next round starts with.
    tidarrays: Vec<Vec<u32>>,
    next_slot: usize,
    /// What the region must hold: the canary in the gaps, each page's last payload.
    shadow: Vec<u8>,
    /// The device's counters after the last check.
    counted: Counted,
}

/// The counters of end B a round moves.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counted {
    entries: u64,
    expected: u64,
    suppressed: u64,
    errors: u64,
    read_resp_bytes: u64,
}

impl Counted {
    fn read(b: &Hfi) -> Self {
        let mut c = Counted::default();
        for (name, v) in b.engine.counters() {
            match name {
                "wire_rx_written" => c.entries = v,
                "wire_rx_kdeth_expected" => c.expected = v,
                "wire_rx_kdeth_suppressed" => c.suppressed = v,
                "wire_rx_kdeth_errors" => c.errors = v,
                "wire_rx_kdeth_read_resp_bytes" => c.read_resp_bytes = v,
                _ => {}
            }
        }
        c
    }
}

impl TidContext {
    /// hfi1_rcvctrl of context 2 with TID RDMA on: header queue of the driver's defaults with a DMA'd tail,
    /// RCV_HDR_SIZE 9, the expected range, TID_FLOW_ENABLE, don't-drop on full, RcvAvail routed; RCV_BTH_QP
    /// (init_kdeth_qp); every flow on the reserved generation (hfi1_kern_init_ctxt_generations), then the QP's
    /// flow on its generation (hfi1_kern_setup_hw_flow); and the TIDs of every segment slot.
    pub fn enable(b: &Hfi) -> Result<Self, String> {
        b.map(K_HDRQ, (RHQ_ENTRIES * ENTRY_DWORDS * 4) as usize)?;
        b.map(K_TAIL, PAGE)?;
        b.map(REGION, REGION_PAGES * PAGE)?;
        let shadow = vec![CANARY; REGION_PAGES * PAGE];
        b.mem.write(REGION, &shadow).map_err(|e| format!("receive region: {e}"))?;
        let kc = |reg: u64| reg + k::KCTXT_CSR_STRIDE * u64::from(CTXT);
        b.w(kc(k::RCV_HDR_CNT), RHQ_ENTRIES >> device_model::hfi1::HDRQ_SIZE_SHIFT)?;
        b.w(kc(k::RCV_HDR_ENT_SIZE), RCV_HDR_ENT_SIZE_32)?;
        b.w(kc(k::RCV_HDR_SIZE), RCV_HDR_SIZE_DWORDS)?;
        b.w(kc(k::RCV_HDR_ADDR), K_HDRQ)?;
        b.w(kc(k::RCV_HDR_TAIL_ADDR), K_TAIL)?;
        let tid_ctrl = ((u64::from(TID_COUNT >> k::RCV_SHIFT) & k::RCV_TID_CTRL_TID_PAIR_CNT_MASK)
            << k::RCV_TID_CTRL_TID_PAIR_CNT_SHIFT)
            | ((u64::from(TID_BASE >> k::RCV_SHIFT) & k::RCV_TID_CTRL_TID_BASE_INDEX_MASK)
                << k::RCV_TID_CTRL_TID_BASE_INDEX_SHIFT);
        b.w(kc(k::RCV_TID_CTRL), tid_ctrl)?;
        let ctrl = k::RCV_CTXT_CTRL_ENABLE_SMASK
            | k::RCV_CTXT_CTRL_INTR_AVAIL_SMASK
            | k::RCV_CTXT_CTRL_TAIL_UPD_SMASK
            | k::RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK
            | k::RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK
            | k::RCV_CTXT_CTRL_DONT_DROP_EGR_FULL_SMASK;
        b.w(kc(k::RCV_CTXT_CTRL), ctrl)?;
        b.w(k::RCV_BTH_QP, u64::from(KDETH_QP_PREFIX) << k::RCV_BTH_QP_KDETH_QP_SHIFT)?;
        for f in 0..k::RXE_NUM_TID_FLOWS {
            b.w(flow_csr(f), k::tid_flow_table_value(k::KERN_GENERATION_RESERVED))?;
        }
        b.w(flow_csr(FLOW), k::tid_flow_table_value(FIRST_GENERATION))?;
        b.route_irq(IS_RCVAVAIL_START + CTXT, V_RCVAVAIL_2)?;
        let tidarrays = (0..MAX_SEGMENTS).map(|slot| program_segment(b, slot)).collect::<Result<_, _>>()?;
        Ok(TidContext {
            head: 0,
            seq: 1,
            generation: FIRST_GENERATION,
            psn: 0,
            ib_psn: 0,
            tidarrays,
            next_slot: 0,
            shadow,
            counted: Counted::read(b),
        })
    }

    /// The next doorbell's READ_RESP packets: `segments` segments on the next slots, each the responder's
    /// packets for its tidarray (tid_rdma_data_packets: hfi1_build_tid_rdma_read_resp, SH on all but a
    /// segment's last, tid_rdma.c:2363-2399). The QP's flow goes on in its generation while the doorbell's
    /// packets fit below its last sequence, which RESYNC keeps; otherwise the kernel syncs first: the flow is
    /// cleared onto the reserved generation and set up again on the next one from sequence 0
    /// (tid_rdma.c:1835-1846, hfi1_kern_clear_hw_flow 820-846, hfi1_kern_setup_hw_flow 780-818).
    pub fn round(&mut self, b: &Hfi, segments: usize) -> Result<Round, String> {
        let packets = segments * SEGMENT_PACKETS;
        if self.psn as usize + packets > k::MAX_TID_FLOW_PSN as usize - 1 {
            b.w(flow_csr(FLOW), k::tid_flow_table_value(k::KERN_GENERATION_RESERVED))?;
            self.generation = kern_flow_generation_next(self.generation);
            b.w(flow_csr(FLOW), k::tid_flow_table_value(self.generation))?;
            self.psn = 0;
        }
        let dest_qp = tid_flow_qp(KDETH_QP_PREFIX << 16, FLOW, CTXT);
        let mut round =
            Round { headers: Vec::with_capacity(packets), pages: Vec::new(), lasts: Vec::new(), next_psn: 0 };
        for _ in 0..segments {
            let slot = self.next_slot;
            self.next_slot = (slot + 1) % MAX_SEGMENTS;
            let mut flow = TidRdmaFlow {
                tid_entry: self.tidarrays[slot].clone(),
                length: SEGMENT_BYTES as u32,
                ..Default::default()
            };
            flow.flow_state.generation = self.generation;
            flow.flow_state.spsn = self.psn;
            flow.flow_state.ib_spsn = self.ib_psn;
            let sent = tid_rdma_data_packets(&flow, dest_qp, PMTU as u32)
                .map_err(|e| format!("the responder's packets of slot {slot}: errno {e}"))?;
            if sent.len() != SEGMENT_PACKETS {
                return Err(format!("slot {slot}: {} packets for a segment, not {SEGMENT_PACKETS}", sent.len()));
            }
            for (i, p) in sent.iter().enumerate() {
                let last = i + 1 == sent.len();
                round.headers.push(read_resp_header(p, last));
                round.pages.push(slot * SEGMENT_PAGES + p.seg_offset as usize / PAGE);
            }
            round.lasts.push(round.headers.len() - 1);
            self.psn += SEGMENT_PACKETS as u32;
            self.ib_psn = (self.ib_psn + SEGMENT_PACKETS as u32) & k::PSN_MASK;
        }
        round.next_psn = k::full_flow_psn(self.generation, self.psn);
        Ok(round)
    }

    /// Waits until `n` entries past the head are in the header queue: the DMA'd tail, read after each RcvAvail
    /// is cleared. Stalled when no entry came for `STALL`.
    pub fn wait(&self, b: &Hfi, n: usize) -> Result<(), String> {
        let (mut seen, mut deadline) = (None, Instant::now());
        loop {
            b.clear_irq(IS_RCVAVAIL_START + CTXT)?;
            let got = self.arrived(b)?;
            if got >= n as u64 {
                return Ok(());
            }
            if seen != Some(got) {
                (seen, deadline) = (Some(got), Instant::now() + STALL);
            }
            if !b.irq(V_RCVAVAIL_2, deadline) {
                return Err(format!("{got} of {n} header-queue entries of context {CTXT}; {}", b.state()));
            }
        }
    }

    fn arrived(&self, b: &Hfi) -> Result<u64, String> {
        let tail = b.read_u64(K_TAIL)? / ENTRY_DWORDS;
        Ok((tail + RHQ_ENTRIES - self.head) % RHQ_ENTRIES)
    }

    /// What the requester's driver must find after `round`, whose packet `i` carried `payload(i)`:
    /// - one EXPECTED entry per segment and no other (SH = !last_pkt, tid_rdma.c:2375, on a flow with
    ///   HDR_SUPP_EN, 747-748): RcvType EXPECTED, no error bit, no eager buffer, PktLen of the whole packet,
    ///   RcvSeq in sequence, the header right against the RHF, and it is the segment's last packet's header
    ///   (common.h:148-225);
    /// - the flow's next PSN (read_r_next_psn, tid_rdma.c:5490-5500) the generation and the sequence past the
    ///   round, FLOW_VALID and HDR_SUPP_EN as kern_set_hw_flow left them, no mismatch status;
    /// - every payload on the page its TID names and the region otherwise as it was (the gaps hold the canary);
    /// - the device counted a placed expected packet for each, no KDETH error, and no entry anywhere else.
    ///
    /// Then gives the entries back (RCV_HDR_HEAD), as the driver does once it has handled them.
    pub fn check<'p>(&mut self, b: &Hfi, round: &Round, payload: impl Fn(usize) -> &'p [u8]) -> Result<(), String> {
        let entries = round.lasts.len();
        let got = self.arrived(b)?;
        if got != entries as u64 {
            return Err(format!("{got} header-queue entries for {entries} segments"));
        }
        let entry_bytes = (ENTRY_DWORDS * 4) as usize;
        let mut hdrq = vec![0u8; RHQ_ENTRIES as usize * entry_bytes];
        b.mem.read(K_HDRQ, &mut hdrq).map_err(|e| format!("header queue: {e}"))?;
        for (s, &last) in round.lasts.iter().enumerate() {
            let entry = ((self.head + s as u64) % RHQ_ENTRIES) as usize;
            let e = &hdrq[entry * entry_bytes..][..entry_bytes];
            let rhf_at = entry_bytes - RHF_BYTES;
            let rhf = u64::from_le_bytes(e[rhf_at..].try_into().map_err(|_| "short entry")?);
            let field = |shift: u32, mask: u64| (rhf >> shift) & mask;
            let wire = HEADER_BYTES + payload(last).len() + ICRC_BYTES;
            let hdrq_offset = ENTRY_DWORDS - (RHF_BYTES + HEADER_BYTES) as u64 / 4;
            let want = [
                ("PktLen", rhf & RHF_PKT_LEN_MASK, (wire / 4) as u64),
                ("RcvType", field(RHF_RCV_TYPE_SHIFT, RHF_RCV_TYPE_MASK), RHF_RCV_TYPE_EXPECTED),
                ("errors", rhf & RHF_ERROR_SMASK, 0),
                ("UseEgrBfr", rhf & RHF_USE_EGR_BFR, 0),
                ("RcvSeq", field(RHF_RCV_SEQ_SHIFT, RHF_RCV_SEQ_MASK), self.seq),
                ("HdrqOffset", field(RHF_HDRQ_OFFSET_SHIFT, RHF_HDRQ_OFFSET_MASK), hdrq_offset),
            ];
            if let Some((what, got, want)) = want.iter().find(|(_, g, w)| g != w) {
                return Err(format!("segment {s} (entry {entry}): RHF {rhf:#x} {what} {got:#x}, expected {want:#x}"));
            }
            if e[hdrq_offset as usize * 4..rhf_at] != round.headers[last][..] {
                return Err(format!("segment {s} (entry {entry}): not the header of its last packet"));
            }
            self.seq = if self.seq >= u64::from(RHF_MAX_SEQ) { 1 } else { self.seq + 1 };
        }
        let flow = b.r(flow_csr(FLOW))?;
        let live = k::RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK | k::RCV_TID_FLOW_TABLE_CTRL_HDR_SUPP_EN_SMASK;
        let status = k::RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK | k::RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK;
        if (flow as u32) & k::PSN_MASK != round.next_psn || flow & live != live || flow & status != 0 {
            return Err(format!("flow {FLOW}: {flow:#x}, expected next PSN {:#x}, valid, no mismatch", round.next_psn));
        }
        for (i, &p) in round.pages.iter().enumerate() {
            let (at, bytes) = ((page_iova(p) - REGION) as usize, payload(i));
            let page = self.shadow.get_mut(at..at + bytes.len()).filter(|_| bytes.len() <= PAGE);
            page.ok_or(format!("packet {i}: {} bytes for a page", bytes.len()))?.copy_from_slice(bytes);
        }
        // Each packet's page first, in sending order; then the whole region (the gaps, the pages left alone).
        let shadow = &self.shadow;
        let verdict = b.mem.inspect(REGION, |m| {
            for (i, &p) in round.pages.iter().enumerate() {
                let at = (page_iova(p) - REGION) as usize;
                if m[at..at + PAGE] != shadow[at..at + PAGE] {
                    return Err(format!(
                        "packet {i}: its payload differs on its TID's page (region page {})",
                        at / PAGE
                    ));
                }
            }
            match m.chunks(PAGE).zip(shadow.chunks(PAGE)).position(|(a, b)| a != b) {
                None => Ok(()),
                Some(at) if at % 2 == 0 => Err(format!("region page {at}, a gap, was written")),
                Some(at) => Err(format!("region page {at}, a buffer page this round did not use, changed")),
            }
        });
        verdict.ok_or("no receive region")??;
        let now = Counted::read(b);
        let packets = round.packets() as u64;
        let want = Counted {
            entries: self.counted.entries + entries as u64,
            expected: self.counted.expected + packets,
            suppressed: self.counted.suppressed + packets - entries as u64,
            errors: self.counted.errors,
            read_resp_bytes: self.counted.read_resp_bytes
                + (0..round.packets()).map(|i| payload(i).len() as u64).sum::<u64>(),
        };
        if now != want {
            return Err(format!("end B counted {now:?}, expected {want:?}"));
        }
        self.counted = now;
        self.head = (self.head + entries as u64) % RHQ_ENTRIES;
        b.w(k::RCV_HDR_HEAD + k::UCTXT_CSR_STRIDE * u64::from(CTXT), self.head * ENTRY_DWORDS)
    }
}

/// The RCV_TID_FLOW_TABLE entry of flow `f` of the context (a user-spaced CSR, chip_registers.h:776).
fn flow_csr(f: u32) -> u64 {
    k::RCV_TID_FLOW_TABLE + k::UCTXT_CSR_STRIDE * u64::from(CTXT) + 8 * u64::from(f)
}

/// hfi1_kern_exp_rcv_setup for segment slot `slot` on a context whose groups are all free: the slot's pages
/// cut into page sets (tid_rdma_find_phys_blocks_4k: one page each, none adjacent), one RcvArray entry per set
/// from the slot's complete groups (kern_alloc_tids takes complete groups first, tid_rdma.c:1237-1258)
/// programmed PT_EXPECTED (hfi1_put_tid), and the tidarray kern_program_rcv_group builds over them: every even
/// entry of a group with the odd one after it is a pair, TIDCTRL 3, LEN both sets' pages (tid_rdma.c:1300-1366).
fn program_segment(b: &Hfi, slot: usize) -> Result<Vec<u32>, String> {
    let pages: Vec<u64> = (0..SEGMENT_PAGES).map(|p| page_iova(slot * SEGMENT_PAGES + p)).collect();
    let mut sets = Vec::new();
    tid_rdma_find_phys_blocks_4k(&pages, &mut sets);
    dma_map_flow(&pages, &mut sets).map_err(|e| format!("slot {slot}: dma_map_flow errno {e}"))?;
    if sets.len() != SEGMENT_PAGES || sets.iter().any(|s| s.count != 1) {
        return Err(format!("slot {slot}: {} page sets, not one per scattered page", sets.len()));
    }
    let first = TID_BASE + (slot * SEGMENT_PAGES) as u32;
    for (i, set) in sets.iter().enumerate() {
        let entry = k::rcv_array_entry(k::PtType::PT_EXPECTED, set.addr, trdma_pset_order(u32::from(set.count)));
        b.w(k::rcv_array_offset(first + i as u32), entry)?;
    }
    Ok(sets
        .chunks(2)
        .enumerate()
        .map(|(j, pair)| {
            let rel = first - TID_BASE + 2 * j as u32;
            k::exp_tid_entry(rel >> 1, TIDCTRL_PAIR, pair.iter().map(|s| u32::from(s.count)).sum())
        })
        .collect())
}

/// A READ_RESP packet's headers as hfi1_build_tid_rdma_read_resp and the verbs send path lay them out: LRH
/// (VL 0, BTH next, the whole packet's dwords), BTH (opcode, no pad, the default P_Key, the flow's TID QP, the
/// 31-bit flow PSN), then tid_rdma_read_resp: KDETH word 0 (KVER 1, SH unless `last`) and word 1 (the J_KEY),
/// AETH, four reserved words, the verbs PSN and QP. KDETH is little-endian (KDETH_RESET, exp_rcv.h:58-68), the
/// rest big-endian.
pub fn read_resp_header(p: &TidDataPacket, last: bool) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_BYTES];
    let dwords = ((HEADER_BYTES + p.len as usize + ICRC_BYTES) / 4) as u16;
    h[1] = LNH_BTH;
    h[2..4].copy_from_slice(&DLID.to_be_bytes());
    h[4..6].copy_from_slice(&dwords.to_be_bytes());
    h[6..8].copy_from_slice(&SLID.to_be_bytes());
    h[8] = OPCODE_TID_RDMA_READ_RESP;
    h[10..12].copy_from_slice(&0xFFFFu16.to_be_bytes());
    h[13..16].copy_from_slice(&p.dest_qp.to_be_bytes()[1..]);
    h[16..20].copy_from_slice(&p.psn.to_be_bytes());
    let kdeth0 = p.kdeth0 | (1 << k::KDETH_KVER_SHIFT) | (u32::from(!last) << k::KDETH_SH_SHIFT);
    h[20..24].copy_from_slice(&kdeth0.to_le_bytes());
    h[24..28].copy_from_slice(&(TID_RDMA_JKEY << k::KDETH_JKEY_SHIFT).to_le_bytes());
    h[48..52].copy_from_slice(&p.verbs_psn.to_be_bytes());
    h[52..56].copy_from_slice(&VERBS_QP.to_be_bytes());
    h
}
