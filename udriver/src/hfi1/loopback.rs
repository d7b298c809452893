//! The emulated device's loopback send path (project-specific, docs/hfi1-device.md "Loopback send path"):
//! TID RDMA data packets built from a set-up flow the way the responder builds them
//! (`hfi1_build_tid_rdma_read_resp`), written as descriptors into DMA memory and handed to the receive
//! engine with one doorbell. Completion is polled with a timeout; every value the device reports is checked.

#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use thiserror::Error;
use vfio_user_proto::sync::Unpoison;

use super::exp_rcv::{TidRdmaFlow, TID_RDMA_MAX_PAGES};
use super::regs::*;
use super::tid_rdma::TidRdmaReadReq;
use crate::access::{poll_until, AccessError, DeviceAccess};
use crate::dma::{DmaBuffer, DmaMemError, DmaPool};

// The loopback block and its descriptor are the project's own ABI (`emu_abi::hfi1`); registers are relative
// to LB_BASE.
pub use emu_abi::hfi1::{
    LbDescHeader, RxResult as LbResult, LB_BASE, LB_DB_DONE, LB_DB_DROPPED, LB_DB_SUBMITTED, LB_DESC_ADDR,
    LB_DESC_DONE, LB_DESC_ERR, LB_DESC_HDR_LEN, LB_DOORBELL, LB_LAST_RESULT, LB_LAST_RESULT_CODE_MASK, LB_MAX_CHAIN,
    LB_MAX_PAYLOAD,
};

/// DMA memory the sender keeps for descriptors; a larger batch takes several doorbells.
pub const LB_RING_BYTES: usize = 1 << 20;

// ---- KDETH offset mode and the TID RDMA destination QP (§1.5, §1.10) ----
/// OFFSET unit of every TID RDMA data packet (exp_rcv.h KDETH_OM_LARGE): tid_rdma.c builds READ responses
/// and WRITE data with `om = KDETH_OM_LARGE` whatever the entry's size. (The 128 KiB KDETH_OM_MAX_SIZE
/// rule is user_sdma.c's, for PSM's expected receive; hfi1-user follows it there.)
pub const KDETH_OM_LARGE: u32 = 64;
pub const TID_RDMA_DESTQP_FLOW_SHIFT: u32 = 11;
pub const TID_RDMA_DESTQP_FLOW_MASK: u32 = 0x1F;

/// `tid_flow_qp`: the destination QP a requester gives for flow `flow_idx` of receive context `ctxt`.
/// `local_qp` is the local TID QP value (KDETH QP in bits 23:16).
pub fn tid_flow_qp(local_qp: u32, flow_idx: u32, ctxt: u32) -> u32 {
    local_qp | ((flow_idx & TID_RDMA_DESTQP_FLOW_MASK) << TID_RDMA_DESTQP_FLOW_SHIFT) | ctxt
}

/// KDETH word 0 of a data packet.
pub fn kdeth0(offset: u32, om_large: bool, tid: u32, tidctrl: u32) -> u32 {
    ((offset & KDETH_OFFSET_MASK) << KDETH_OFFSET_SHIFT)
        | (u32::from(om_large) << KDETH_OM_SHIFT)
        | ((tid & KDETH_TID_MASK) << KDETH_TID_SHIFT)
        | ((tidctrl & KDETH_TIDCTRL_MASK) << KDETH_TIDCTRL_SHIFT)
}

/// One TID RDMA data packet: its header words and which bytes of the segment it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TidDataPacket {
    pub kdeth0: u32,
    pub dest_qp: u32,
    /// BTH PSN: the flow PSN (generation and sequence).
    pub psn: u32,
    /// The READ RESP's `verbs_psn`: the IB PSN, `ib_spsn + pkt`.
    pub verbs_psn: u32,
    /// Byte offset of the payload in the segment.
    pub seg_offset: u32,
    pub len: u32,
}

/// The data packets of a set-up flow, in order, as the responder builds them: the tidarray one entry after
/// the other, at most `pmtu` bytes per packet, KDETH TID/TIDCTRL from the entry, OFFSET inside the entry in
/// 64-byte units with OM set, PSN = `full_flow_psn(generation, spsn + pkt)`. -EINVAL for `pmtu` 0 or a
/// tidarray that does not cover the flow's length.
pub fn tid_rdma_data_packets(flow: &TidRdmaFlow, dest_qp: u32, pmtu: u32) -> Result<Vec<TidDataPacket>, i32> {
    if pmtu == 0 {
        return Err(-libc::EINVAL);
    }
    let mut out = Vec::new();
    let (mut sent, mut pkt) = (0u32, 0u32);
    for &entry in &flow.tid_entry {
        let tidlen = exp_tid_get_len(entry) << RT_ADDR_SHIFT;
        let mut tid_offset = 0u32;
        while tid_offset < tidlen && sent < flow.length {
            let len = pmtu.min(tidlen - tid_offset).min(flow.length - sent);
            let seq = flow.flow_state.spsn.wrapping_add(pkt);
            out.push(TidDataPacket {
                kdeth0: kdeth0(tid_offset / KDETH_OM_LARGE, true, exp_tid_get_idx(entry), exp_tid_get_ctrl(entry)),
                dest_qp,
                psn: full_flow_psn(flow.flow_state.generation, seq),
                verbs_psn: flow.flow_state.ib_spsn.wrapping_add(pkt) & PSN_MASK,
                seg_offset: sent,
                len,
            });
            pkt += 1;
            sent += len;
            tid_offset += len;
        }
    }
    if sent < flow.length {
        return Err(-libc::EINVAL);
    }
    Ok(out)
}

/// The responder's flow for a READ REQ, as `tid_rdma_rcv_read_request` fills it: the tidarray from the
/// payload, generation and first sequence from `tid_flow_psn`, the destination QP (`tid_qpn`) and flow
/// index from `tid_flow_qp`, the IB PSNs from the request's BTH PSN `psn`, `npkts` = ceil(length / pmtu).
/// -EINVAL where the kernel refuses the request: a payload larger than the flow's tidarray, an entry of
/// no pages, or entries too short for `reth.length` (a pair's second entry is not listed, its first
/// entry's LEN covers both); or `pmtu` 0.
pub fn tid_rdma_rcv_read_request(
    rreq: &TidRdmaReadReq,
    payload: &[u32],
    psn: u32,
    pmtu: u32,
) -> Result<TidRdmaFlow, i32> {
    let len = rreq.reth.length;
    if payload.len() > TID_RDMA_MAX_PAGES || pmtu == 0 {
        return Err(-libc::EINVAL);
    }
    let mut tidlen = 0u64;
    for &e in payload {
        match exp_tid_get_len(e) {
            0 => return Err(-libc::EINVAL),
            n => tidlen += u64::from(n),
        }
    }
    if tidlen << RT_ADDR_SHIFT < u64::from(len) {
        return Err(-libc::EINVAL);
    }
    let npkts = len.div_ceil(pmtu);
    let flow_psn = rreq.tid_flow_psn & PSN_MASK;
    let mut flow = TidRdmaFlow {
        tid_entry: payload.to_vec(),
        tidcnt: payload.len() as u8,
        tid_qpn: rreq.tid_flow_qp,
        idx: (rreq.tid_flow_qp >> TID_RDMA_DESTQP_FLOW_SHIFT) & TID_RDMA_DESTQP_FLOW_MASK,
        length: len,
        npkts,
        ..Default::default()
    };
    let fs = &mut flow.flow_state;
    fs.generation = flow_psn >> HFI1_KDETH_BTH_SEQ_SHIFT;
    fs.spsn = flow_psn & HFI1_KDETH_BTH_SEQ_MASK;
    fs.lpsn = fs.spsn.wrapping_add(npkts).wrapping_sub(1);
    fs.ib_spsn = psn;
    fs.ib_lpsn = psn.wrapping_add(npkts).wrapping_sub(1);
    Ok(flow)
}

/// A descriptor to send: header words and the payload.
#[derive(Debug, Clone, Copy)]
pub struct LbDescriptor<'a> {
    pub kdeth0: u32,
    pub dest_qp: u32,
    pub psn: u32,
    pub payload: &'a [u8],
}

impl TidDataPacket {
    /// This packet's descriptor, carrying its bytes of `segment` (the whole segment's payload).
    pub fn descriptor<'a>(&self, segment: &'a [u8]) -> Option<LbDescriptor<'a>> {
        let start = self.seg_offset as usize;
        let payload = segment.get(start..start.checked_add(self.len as usize)?)?;
        Some(LbDescriptor { kdeth0: self.kdeth0, dest_qp: self.dest_qp, psn: self.psn, payload })
    }
}

#[derive(Debug, Error)]
pub enum LbError {
    #[error(transparent)]
    Access(#[from] AccessError),
    #[error(transparent)]
    Dma(#[from] DmaMemError),
    #[error("payload of {0} bytes exceeds the loopback maximum of {LB_MAX_PAYLOAD}")]
    PayloadTooLarge(usize),
    #[error("the device dropped the doorbell (its queue was full)")]
    DoorbellDropped,
    #[error("device reports {what} = {value:#x}, which is impossible")]
    BadDeviceValue { what: &'static str, value: u64 },
}

impl LbError {
    pub fn to_errno(&self) -> i32 {
        match self {
            LbError::Access(e) => e.to_errno(),
            LbError::Dma(e) => e.to_errno(),
            LbError::PayloadTooLarge(_) => -libc::EMSGSIZE,
            LbError::DoorbellDropped => -libc::EBUSY,
            LbError::BadDeviceValue { .. } => -libc::EIO,
        }
    }
}

/// What one `send` did, from the device's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LbOutcome {
    pub doorbells: u64,
    /// Descriptors the device processed for this send.
    pub descriptors: u64,
    /// Of which were not placed.
    pub errors: u64,
    /// Result code of the last descriptor.
    pub last_result: u8,
}

impl LbOutcome {
    pub fn last(&self) -> Option<LbResult> {
        LbResult::from_code(self.last_result)
    }
}

/// The loopback sender of one device: a descriptor area in DMA memory and the doorbell sequence, one
/// sender at a time (LB_DESC_ADDR + LB_DOORBELL is a two-register sequence).
pub struct Hfi1Loopback {
    dev: Arc<dyn DeviceAccess>,
    ring: Mutex<DmaBuffer>,
}

const POLL_INTERVAL: Duration = Duration::from_micros(20);

impl Hfi1Loopback {
    pub fn new(dev: Arc<dyn DeviceAccess>, pool: &DmaPool) -> Result<Self, LbError> {
        Ok(Self { dev, ring: Mutex::new(pool.alloc_contiguous(LB_RING_BYTES)?) })
    }

    /// Gives the descriptor memory back to `pool`.
    pub fn release(self, pool: &DmaPool) {
        self.ring.into_inner().unpoison().release(pool);
    }

    /// Reads loopback register `reg` (relative to LB_BASE).
    fn read(&self, reg: u64) -> Result<u64, AccessError> {
        self.dev.read64(HFI1_BAR, LB_BASE + reg)
    }

    /// Sends `descs` in order and waits (at most `timeout` per doorbell) until the device has processed
    /// them. The outcome counts this send's descriptors and errors.
    pub fn send(&self, descs: &[LbDescriptor<'_>], timeout: Duration) -> Result<LbOutcome, LbError> {
        if let Some(d) = descs.iter().find(|d| d.payload.len() > LB_MAX_PAYLOAD) {
            return Err(LbError::PayloadTooLarge(d.payload.len()));
        }
        let ring = self.ring.lock().unpoison();
        let done0 = self.read(LB_DESC_DONE)?;
        let err0 = self.read(LB_DESC_ERR)?;
        let mut doorbells = 0u64;
        let mut rest = descs;
        while !rest.is_empty() {
            let n = self.write_chain(&ring, rest)?;
            if n == 0 {
                return Err(DmaMemError::OutOfBounds { offset: 0, len: LB_RING_BYTES + 1, size: ring.len() }.into());
            }
            rest = rest.get(n..).unwrap_or(&[]);
            self.ring_and_wait(&ring, timeout)?;
            doorbells += 1;
        }
        let descriptors = self.read(LB_DESC_DONE)?.wrapping_sub(done0);
        let errors = self.read(LB_DESC_ERR)?.wrapping_sub(err0);
        if descriptors != descs.len() as u64 || errors > descriptors {
            return Err(LbError::BadDeviceValue { what: "LB_DESC_DONE/LB_DESC_ERR delta", value: descriptors });
        }
        let last_result = (self.read(LB_LAST_RESULT)? & LB_LAST_RESULT_CODE_MASK) as u8;
        Ok(LbOutcome { doorbells, descriptors, errors, last_result })
    }

    /// Writes as many descriptors as fit (and the chain limit allows) as one chain; returns how many.
    fn write_chain(&self, ring: &DmaBuffer, descs: &[LbDescriptor<'_>]) -> Result<usize, LbError> {
        let mut at = 0usize;
        let mut n = 0usize;
        let mut prev: Option<usize> = None;
        for d in descs.iter().take(LB_MAX_CHAIN) {
            let size = (LB_DESC_HDR_LEN + d.payload.len()).next_multiple_of(8);
            if at + size > ring.len() {
                break;
            }
            if let Some(p) = prev {
                // Link the previous descriptor to this one.
                let iova = ring.iova(at).ok_or(DmaMemError::OutOfBounds { offset: at, len: size, size: ring.len() })?;
                ring.write_u64(p + LbDescHeader::NEXT_OFFSET, iova)?;
            }
            let (kdeth0, dest_qp, psn) = (d.kdeth0, d.dest_qp, d.psn);
            // `next` stays 0 (end of chain) until a following descriptor links itself in.
            let hdr = LbDescHeader { kdeth0, dest_qp, psn, payload_len: d.payload.len() as u32, next: 0 };
            ring.write(at, &hdr.to_bytes())?;
            ring.write(at + LB_DESC_HDR_LEN, d.payload)?;
            prev = Some(at);
            at += size;
            n += 1;
        }
        Ok(n)
    }

    fn ring_and_wait(&self, ring: &DmaBuffer, timeout: Duration) -> Result<(), LbError> {
        let head = ring.iova(0).ok_or(DmaMemError::OutOfBounds { offset: 0, len: 1, size: 0 })?;
        let submitted0 = self.read(LB_DB_SUBMITTED)?;
        self.dev.write64(HFI1_BAR, LB_BASE + LB_DESC_ADDR, head)?;
        self.dev.write64(HFI1_BAR, LB_BASE + LB_DOORBELL, 1)?;
        let target = self.read(LB_DB_SUBMITTED)?;
        if target == submitted0 {
            return Err(LbError::DoorbellDropped);
        }
        poll_until("hfi1 loopback doorbell", timeout, POLL_INTERVAL, || {
            Ok((self.read(LB_DB_DONE)? >= target).then_some(()))
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dest_qp_carries_context_and_flow_index_in_bits_15_11() {
        // §1.5: local KDETH qp | (flow & 0x1F) << 11 | ctxt.
        assert_eq!(tid_flow_qp(0x80 << 16, 3, 2), 0x80_1802);
        assert_eq!(tid_flow_qp(0, 0x25, 0), 5 << 11);
    }

    /// tid_rdma.c hfi1_build_tid_rdma_read_resp: `om = KDETH_OM_LARGE`, KDETH OM = 1 and OFFSET =
    /// tid_offset / 64 for every entry, 3-page and lone 1-page ones too; `*len = min(pmtu, tidlen -
    /// tid_offset)`; bth2 = (spsn + pkt) & 0x7FF | generation << 11.
    #[test]
    fn packets_walk_the_tidarray_in_64_byte_offset_units_as_the_kernels_read_responder() {
        // G6 tidarray: a pair of 3 pages (idx 0, ctrl 3) then a lone page (idx 1, ctrl 1), plus a 32-page
        // entry.
        let mut flow = TidRdmaFlow {
            tid_entry: vec![exp_tid_entry(0, 3, 3), exp_tid_entry(1, 1, 1), exp_tid_entry(2, 1, 32)],
            length: 36 * 4096,
            ..Default::default()
        };
        flow.flow_state.generation = 0x12345;
        flow.flow_state.spsn = 2;
        let p = tid_rdma_data_packets(&flow, 0x1802, 8192).unwrap();
        let got: Vec<(u32, u32, u32, u32, u32)> = p
            .iter()
            .map(|p| {
                (
                    (p.kdeth0 >> KDETH_TID_SHIFT) & KDETH_TID_MASK,
                    (p.kdeth0 >> KDETH_TIDCTRL_SHIFT) & KDETH_TIDCTRL_MASK,
                    p.kdeth0 & (KDETH_OFFSET_MASK | (1 << KDETH_OM_SHIFT)),
                    p.seg_offset,
                    p.len,
                )
            })
            .collect();
        let om = 1 << KDETH_OM_SHIFT;
        // The pair's second packet starts 8192 bytes in: OFFSET 8192 / 64 = 128.
        let mut want = vec![(0, 3, om, 0, 8192), (0, 3, om | 128, 8192, 4096), (1, 1, om, 12288, 4096)];
        want.extend((0..16).map(|k| (2, 1, om | (k * 128), 16384 + k * 8192, 8192)));
        assert_eq!(got, want);
        // G4: generation 0x12345, sequence 3 is 0x091A2803; the second packet has sequence spsn + 1 = 3.
        assert_eq!(p[1].psn, 0x091A_2803);
        assert!(p.iter().all(|x| x.dest_qp == 0x1802));
    }

    /// tid_rdma.c tid_rdma_rcv_read_request: generation = flow_psn >> 11, spsn = flow_psn & 0x7FF, flow index
    /// from tid_flow_qp bits 15:11, lpsn = spsn + npkts - 1, ib_spsn = the REQ's PSN; refused (returns 1) for
    /// a LEN 0 entry, entries shorter than the length, or more entries than `tid_entry[]` holds. The
    /// responses then carry verbs_psn = ib_spsn + pkt (hfi1_build_tid_rdma_read_resp).
    #[test]
    fn a_read_request_becomes_the_responders_flow_and_its_responses() {
        let payload = [exp_tid_entry(0, 3, 3), exp_tid_entry(1, 1, 2)];
        let mut rreq = TidRdmaReadReq { tid_flow_psn: 0x091A_2803, tid_flow_qp: 0x80_1802, ..Default::default() };
        rreq.reth.length = 5 * 4096;
        let f = tid_rdma_rcv_read_request(&rreq, &payload, 200, 4096).unwrap();
        let fs = f.flow_state;
        assert_eq!((f.idx, f.tid_qpn, f.npkts, f.tidcnt, f.length), (3, 0x80_1802, 5, 2, 5 * 4096));
        assert_eq!((fs.generation, fs.spsn, fs.lpsn, fs.ib_spsn, fs.ib_lpsn), (0x12345, 3, 7, 200, 204));
        let p = tid_rdma_data_packets(&f, f.tid_qpn, 4096).unwrap();
        let psns: Vec<(u32, u32)> = p.iter().map(|p| (p.psn, p.verbs_psn)).collect();
        assert_eq!(psns, (0..5).map(|k| (0x091A_2803 + k, 200 + k)).collect::<Vec<_>>());
        for (bad, why) in [
            (vec![exp_tid_entry(0, 3, 3), exp_tid_entry(1, 1, 0)], "an entry of no pages"),
            (vec![exp_tid_entry(0, 3, 3), exp_tid_entry(1, 1, 1)], "4 pages for 5"),
            (vec![exp_tid_entry(0, 1, 1); TID_RDMA_MAX_PAGES + 1], "more entries than tid_entry[] holds"),
        ] {
            assert_eq!(tid_rdma_rcv_read_request(&rreq, &bad, 200, 4096).unwrap_err(), -libc::EINVAL, "{why}");
        }
    }

    #[test]
    fn a_tidarray_short_of_the_flow_length_or_a_zero_pmtu_is_rejected() {
        let flow = TidRdmaFlow { tid_entry: vec![exp_tid_entry(0, 1, 1)], length: 8192, ..Default::default() };
        assert_eq!(tid_rdma_data_packets(&flow, 0, 4096), Err(-libc::EINVAL));
        assert_eq!(tid_rdma_data_packets(&flow, 0, 0), Err(-libc::EINVAL));
    }

    /// A device whose loopback block misbehaves: it may drop doorbells, never finish them, or report more
    /// descriptors than were sent.
    struct Hostile {
        accepts: bool,
        finishes: bool,
        desc_done_per_doorbell: u64,
        submitted: std::sync::atomic::AtomicU64,
    }

    impl DeviceAccess for Hostile {
        fn identity(&self) -> crate::access::DeviceIdentity {
            Default::default()
        }
        fn read32(&self, _: u32, _: u64) -> crate::access::Result<u32> {
            Ok(u32::MAX)
        }
        fn write32(&self, _: u32, _: u64, _: u32) -> crate::access::Result<()> {
            Ok(())
        }
        fn read64(&self, _: u32, offset: u64) -> crate::access::Result<u64> {
            let n = self.submitted.load(std::sync::atomic::Ordering::Relaxed);
            Ok(match offset.wrapping_sub(LB_BASE) {
                LB_DB_SUBMITTED => n,
                LB_DB_DONE if self.finishes => n,
                LB_DESC_DONE => n * self.desc_done_per_doorbell,
                _ => 0,
            })
        }
        fn write64(&self, _: u32, offset: u64, _: u64) -> crate::access::Result<()> {
            if offset == LB_BASE + LB_DOORBELL && self.accepts {
                self.submitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        }
        fn dma_map(
            &self,
            _: &std::sync::Arc<crate::dma::DmaMemory>,
            _: u64,
            _: u64,
            _: u64,
        ) -> crate::access::Result<()> {
            Ok(())
        }
        fn dma_unmap(&self, _: u64, _: u64) -> crate::access::Result<()> {
            Ok(())
        }
        fn enable_msix(&self, _: u32) -> crate::access::Result<()> {
            Ok(())
        }
        fn wait_irq(&self, _: u32, _: Duration) -> crate::access::Result<bool> {
            Ok(false)
        }
    }

    #[test]
    fn a_misbehaving_loopback_block_gives_errors_never_a_hang() {
        let payload = [7u8; 16];
        let desc = LbDescriptor { kdeth0: 0, dest_qp: 0, psn: 0, payload: &payload };
        // (accepts the doorbell, finishes it, descriptors it claims per doorbell, expected errno)
        let cases =
            [(false, true, 1, -libc::EBUSY), (true, false, 1, -libc::ETIMEDOUT), (true, true, 1000, -libc::EIO)];
        for (accepts, finishes, per_db, errno) in cases {
            let dev =
                Arc::new(Hostile { accepts, finishes, desc_done_per_doorbell: per_db, submitted: Default::default() });
            let pool = DmaPool::new(dev.clone(), false);
            let lb = Hfi1Loopback::new(dev, &pool).unwrap();
            let start = std::time::Instant::now();
            let err = lb.send(&[desc], Duration::from_millis(50)).unwrap_err();
            assert_eq!(err.to_errno(), errno, "{err}");
            assert!(start.elapsed() < Duration::from_secs(2));
        }
    }

    #[test]
    fn an_oversized_payload_is_refused_before_touching_the_device() {
        let big = vec![0u8; LB_MAX_PAYLOAD + 1];
        let dev = Arc::new(Hostile {
            accepts: true,
            finishes: true,
            desc_done_per_doorbell: 1,
            submitted: Default::default(),
        });
        let pool = DmaPool::new(dev.clone(), false);
        let lb = Hfi1Loopback::new(dev.clone(), &pool).unwrap();
        let err = lb.send(&[LbDescriptor { kdeth0: 0, dest_qp: 0, psn: 0, payload: &big }], Duration::from_millis(50));
        assert_eq!(err.unwrap_err().to_errno(), -libc::EMSGSIZE);
        assert_eq!(dev.submitted.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}
