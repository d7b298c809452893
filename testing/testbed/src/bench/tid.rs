//! `tid`: TID RDMA data placed through the flow table, measured on the host in one run (issue 29). Bytes per
//! second of a responder's READ_RESP packets (4 KiB KDETH expected packets, 256 KiB segments) from end A's SDMA
//! engine over the cable into the TIDs of end B's kernel context, and of the same packets handed to B's port
//! directly, each against memcpy of the same bytes. Every round's pages, header-queue entries and flow PSN are
//! checked as the requester's driver would find them. Reported, not judged. See docs/bench.md.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use device_model::hfi1::cable::WirePacket;

use super::fabric::{gbps, paired, pattern, size, Paired};
use super::fabric_rig::{Fabric, PAYLOAD_BYTES, SDMA_PAYLOAD};
use super::tid_rig::{Round, TidContext, MAX_SEGMENTS, PMTU, SEGMENT_BYTES};
use udriver::bench::Case;

// The rig's SDMA packets carry one PMTU of payload each.
const _: () = assert!(PMTU == SDMA_PAYLOAD);

/// Segments per doorbell: one (the kernel sends a segment at a time per flow) and as many as the TIDs are
/// programmed for (a READ request's segments in flight).
const SEGMENTS: [usize; 2] = [1, MAX_SEGMENTS];
/// Fewest pairs per variant, and each side of a pair the fastest of this many runs, interleaved.
const MIN_PAIRS: usize = 5;
const BEST_OF: usize = 3;
/// Below this budget (the unit test's) a variant is one pair of single rounds of one segment: the data checks
/// run, the figures mean little (the longer doorbells and the generation change have a test of their own,
/// `every_tid_round_lands_in_its_pages_across_generations`).
const SHORT: Duration = Duration::from_millis(100);

struct Plan {
    min_pairs: usize,
    best_of: usize,
    segments: &'static [usize],
}

impl Plan {
    fn for_budget(budget: Duration) -> Self {
        if budget < SHORT {
            Plan { min_pairs: 1, best_of: 1, segments: &SEGMENTS[..1] }
        } else {
            Plan { min_pairs: MIN_PAIRS, best_of: BEST_OF, segments: &SEGMENTS }
        }
    }
}

/// How the packets reach end B.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Posted on end A's SDMA engine (two descriptors a packet), sent over the cable: what a guest gets.
    Sdma,
    /// Handed to B's port as the cable would (`Hfi1::wire`), sealed beforehand: the placement alone.
    Port,
}

/// The TID RDMA rig: the two HFIs and B's kernel context, with the source of every payload in A's memory.
pub struct TidRig {
    fabric: Fabric,
    tid: TidContext,
    source: Vec<u8>,
    /// Doorbells rung so far: each slides the payload window by 64 bytes, so each lands other bytes.
    doorbells: usize,
}

impl TidRig {
    pub fn new() -> Result<Self, String> {
        let fabric = Fabric::new()?;
        let tid = TidContext::enable(fabric.receiver())?;
        let source = pattern(PAYLOAD_BYTES, 0x5eed_0004);
        fabric.load_payload(&source)?;
        Ok(TidRig { fabric, tid, source, doorbells: 0 })
    }

    /// One doorbell of `segments` segments by `path`, checked; the nanoseconds from the first packet handed
    /// over (the doorbell, or the first packet to the port) until the last segment's entry is in B's header
    /// queue. `expect` may change what the check looks for (the tests' way to show that it looks).
    pub fn round(
        &mut self,
        path: Path,
        segments: usize,
        expect: impl FnOnce(&mut Vec<Vec<u8>>),
    ) -> Result<u64, String> {
        let offset = (self.doorbells * 64) % (PAYLOAD_BYTES - MAX_SEGMENTS * SEGMENT_BYTES);
        self.doorbells += 1;
        let round = self.tid.round(self.fabric.receiver(), segments)?;
        let source = &self.source;
        let mut payloads: Vec<Vec<u8>> =
            (0..round.packets()).map(|i| source[offset + i * PMTU..][..PMTU].to_vec()).collect();
        let ns = match path {
            Path::Sdma => {
                let tid = &self.tid;
                self.fabric.sdma_to(&round.headers, offset, |b| tid.wait(b, segments))?
            }
            Path::Port => self.port(&round, &payloads, segments)?,
        };
        expect(&mut payloads);
        self.tid.check(self.fabric.receiver(), &round, |i| &payloads[i])?;
        Ok(ns)
    }

    /// End B, for what a test does to it between rounds.
    #[cfg(test)]
    pub fn receiver(&self) -> &super::fabric_rig::Hfi {
        self.fabric.receiver()
    }

    fn port(&self, round: &Round, payloads: &[Vec<u8>], segments: usize) -> Result<u64, String> {
        let packets = round
            .headers
            .iter()
            .zip(payloads)
            .map(|(h, p)| WirePacket::seal([h.as_slice(), p].concat(), false, false).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let b = self.fabric.receiver();
        let start = Instant::now();
        for p in packets {
            if !b.engine.wire(p).map_err(|e| format!("port: {e}"))? {
                return Err(format!("B's port queue was full; {}", b.state()));
            }
        }
        self.tid.wait(b, segments)?;
        Ok(start.elapsed().as_nanos() as u64)
    }
}

/// Doorbells of `segments` segments by `path`, against memcpy of their bytes.
fn variant(rig: &mut TidRig, budget: Duration, plan: &Plan, path: Path, segments: usize) -> Result<Paired, String> {
    let bytes = segments * SEGMENT_BYTES;
    let (src, mut dst) = (pattern(bytes, 0x5eed_0005), vec![0u8; bytes]);
    let memcpy = || {
        let start = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        Ok(start.elapsed().as_nanos() as u64)
    };
    paired(budget, (plan.min_pairs, plan.best_of), || rig.round(path, segments, |_| {}), memcpy)
}

/// The case: TID placement bytes/s by each path and doorbell size, each with memcpy of the same bytes.
pub fn tid(budget: Duration) -> Case {
    Case::new("tid", "TID RDMA READ responses placed through the flow table into the requester's TIDs").run(|case| {
        let plan = Plan::for_budget(budget);
        let mut rig = TidRig::new()?;
        let mut spread = Vec::new();
        for &segments in plan.segments {
            let bytes = segments * SEGMENT_BYTES;
            let many = if segments == 1 { "segment" } else { "segments" };
            for (path, how) in [(Path::Sdma, "SDMA over the cable"), (Path::Port, "handed to B's port")] {
                let p = variant(&mut rig, budget, &plan, path, segments)?;
                let what = format!("{how}, {segments} {many} ({}) at once", size(bytes));
                case.metric(&format!("{what}: TID placement"), gbps(bytes, &p.device), "GB/s");
                case.metric(&format!("{what}: memcpy"), gbps(bytes, &p.floor), "GB/s");
                case.metric(&format!("{what}: TID placement / memcpy, median of pairs"), p.ratio(0.5), "x");
                spread.push(format!("{what} {:.3}-{:.3}x over {} pairs", p.ratio(0.1), p.ratio(0.9), p.ratios.len()));
            }
        }
        case.note(format!(
            "both HFIs as device-model --low-latency runs them, the cable training at once, driven through \
             pci::Function register accesses with HeapMemory as host memory; end B's kernel context 2 as \
             hfi1_rcvctrl enables it for TID RDMA (TID_FLOW_ENABLE, RCV_HDR_SIZE 9, 2048-entry header queue with \
             a DMA'd tail), one hardware flow whose generation changes as the kernel's SYNC changes it, and the \
             RcvArray pairs (TIDCTRL 3) of {MAX_SEGMENTS} segments of 64 scattered 4 KiB pages; each segment 64 \
             READ_RESP packets of 4 KiB, KDETH SH on all but the last; SDMA: two descriptors a packet, from the \
             doorbell until the last segment's entry is in B's header queue; port: the sealed packets handed to \
             Hfi1::wire, the same span; memcpy: copy_from_slice of as many bytes; every round's pages (and that \
             nothing else of the receive region changed), entries, flow PSN and B's counters checked; a pair = \
             the fastest of {} device runs and of {} memcpy runs, interleaved; the ratio is the median over pairs \
             (p10-p90: {})",
            plan.best_of,
            plan.best_of,
            spread.join("; ")
        ));
        Ok(())
    })
}
