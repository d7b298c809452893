//! (e) Loopback TID data placement in GB/s against memcpy of the same size, and the hfi1 worker's idle spin
//! measured on the same path (issue 7: "spin briefly before sleeping, wherever measurement shows that wins").

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use device_model::hfi1::Hfi1Config;
use emu_abi::hfi1::{
    LbDescHeader, LB_BASE, LB_DB_DONE, LB_DESC_ADDR, LB_DESC_ERR, LB_DESC_HDR_LEN, LB_DOORBELL, LB_MAX_CHAIN,
    LB_MSIX_VECTOR,
};

use super::hfi1::{Rig, SEGMENT};
use super::stats::{sample, Samples};
use super::{Better, Case, Target};
use udriver::dma::{DmaBuffer, PAGE_SIZE};
use udriver::hfi1::ctxt::{hfi1_rcvctrl, HFI1_RCVCTRL_CTXT_ENB};
use udriver::hfi1::regs::{
    PtType, HFI1_BAR, KDETH_OFFSET_MASK, KDETH_OFFSET_SHIFT, KDETH_OM_SHIFT, KDETH_TIDCTRL_SHIFT, KDETH_TID_SHIFT,
};
use udriver::hfi1::tid::{hfi1_put_tid, trdma_pset_order};

/// KDETH OFFSET unit with OM set: 64 bytes (hardware-facts §1.10, the kernel's KDETH_OM_LARGE_SHIFT).
const KDETH_OM_LARGE_SHIFT: u32 = 6;
/// TIDCTRL of a packet for the even / odd entry of a TID pair.
const TIDCTRL_EVEN: u32 = 1;
const TIDCTRL_ODD: u32 = 2;
/// OPA's largest common MTU: the payload of one packet.
const PACKET: usize = 8192;
/// The small doorbell, reported as a metric: 4 RcvArray entries of one segment each (1 MiB, 128 packets),
/// where the fixed cost of a doorbell (three trapped register accesses and an MSI-X wake-up) dominates.
const SMALL_ENTRIES: usize = 4;
/// The doorbell the target is judged at: 64 entries of one segment each (16 MiB, 2048 packets, half of
/// LB_MAX_CHAIN), and memcpy of the same 16 MiB; source plus destination (32 MiB) are the size of this
/// machine's L3, so both sides run mostly from memory. See docs/bench.md, "Decisions".
const LARGE_ENTRIES: usize = 64;
const WAIT: Duration = Duration::from_secs(2);
const TARGET_FRACTION: f64 = 0.5;
/// The spin the irdma worker uses; the hfi1 worker is measured with it.
const SPIN: Duration = Duration::from_micros(50);
const ROUNDS: u32 = 4;
/// Fewest doorbell/memcpy pairs per size, whatever the budget.
const MIN_PAIRS: usize = 5;

/// A receive context enabled, `entries` RcvArray entries over `dst`, and a descriptor chain in `chain` that
/// places `dst.len()` bytes with `packet`-byte packets; MSI-X vector 0 signals each finished doorbell.
struct Loopback {
    rig: Rig,
    dst: DmaBuffer,
    /// Read by the device at every doorbell: kept mapped as long as the rig.
    _chain: DmaBuffer,
    rung: u64,
}

fn kdeth0(entry: usize, offset: usize) -> u32 {
    let rel = entry as u32;
    let tidctrl = if rel & 1 == 0 { TIDCTRL_EVEN } else { TIDCTRL_ODD };
    ((offset as u32 >> KDETH_OM_LARGE_SHIFT) & KDETH_OFFSET_MASK) << KDETH_OFFSET_SHIFT
        | 1 << KDETH_OM_SHIFT
        | (rel >> 1) << KDETH_TID_SHIFT
        | tidctrl << KDETH_TIDCTRL_SHIFT
}

impl Loopback {
    fn new(config: Hfi1Config, entry_size: usize, entries: usize, packet: usize) -> Result<Self, String> {
        let rig = Rig::new(config, true)?;
        if entries > rig.rcd.expected_count as usize {
            return Err(format!("{entries} RcvArray entries wanted, the context has {}", rig.rcd.expected_count));
        }
        let hdrq = rig.pool.alloc_contiguous(PAGE_SIZE as usize).map_err(|e| e.to_string())?;
        rig.rcd.set_rcvhdrq(Arc::new(hdrq), None);
        hfi1_rcvctrl(&rig.dd, HFI1_RCVCTRL_CTXT_ENB, &rig.rcd).map_err(|e| format!("rcvctrl: {e}"))?;
        rig.dev.enable_msix(1).map_err(|e| format!("MSI-X: {e}"))?;
        let dst = rig.pool.alloc_contiguous(entry_size * entries).map_err(|e| e.to_string())?;
        let order = trdma_pset_order((entry_size / PAGE_SIZE as usize) as u32);
        for e in 0..entries {
            let pa = dst.iova(e * entry_size).ok_or("entry outside the buffer")?;
            hfi1_put_tid(&rig.dd, rig.rcd.expected_base + e as u32, PtType::PT_EXPECTED, pa, order)
                .map_err(|e| e.to_string())?;
        }
        let packets = entry_size * entries / packet;
        if packets > LB_MAX_CHAIN {
            return Err(format!("{packets} descriptors exceed the chain limit {LB_MAX_CHAIN}"));
        }
        let stride = LB_DESC_HDR_LEN + packet;
        let chain = rig.pool.alloc_contiguous(packets * stride).map_err(|e| e.to_string())?;
        let ctxt = rig.rcd.ctxt;
        for k in 0..packets {
            let at = k * stride;
            let next = if k + 1 < packets { chain.iova(at + stride).ok_or("chain overflow")? } else { 0 };
            let (entry, offset) = (k * packet / entry_size, k * packet % entry_size);
            let d = LbDescHeader {
                kdeth0: kdeth0(entry, offset),
                dest_qp: ctxt,
                psn: k as u32,
                payload_len: packet as u32,
                next,
            };
            chain.write(at, &d.to_bytes()).map_err(|e| e.to_string())?;
            chain.memory().fill(at + LB_DESC_HDR_LEN, packet, k as u8 ^ 0x5A).map_err(|e| e.to_string())?;
        }
        // Every doorbell replays the same chain, and LB_DESC_ADDR keeps its value: written once.
        let head = chain.iova(0).ok_or("empty chain")?;
        rig.dev.write64(HFI1_BAR, LB_BASE + LB_DESC_ADDR, head).map_err(|e| e.to_string())?;
        Ok(Self { rig, dst, _chain: chain, rung: 0 })
    }

    fn reg(&self, rel: u64) -> u64 {
        LB_BASE + rel
    }

    /// One doorbell: the whole chain placed, waited for by interrupt. A driver's minimum per doorbell: one
    /// trapped write, the MSI-X wake-up (an eventfd, so an interrupt raised before the wait is not lost), and one
    /// trapped read to confirm which doorbell finished.
    fn ring(&mut self) -> Result<(), String> {
        let dev = &self.rig.dev;
        dev.write64(HFI1_BAR, self.reg(LB_DOORBELL), 1).map_err(|e| e.to_string())?;
        self.rung += 1;
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            dev.wait_irq(u32::from(LB_MSIX_VECTOR), left).map_err(|e| e.to_string())?;
            let done = dev.read64(HFI1_BAR, self.reg(LB_DB_DONE)).map_err(|e| e.to_string())?;
            if done >= self.rung {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("doorbell {} not done within {WAIT:?} (done {done})", self.rung));
            }
        }
    }

    /// Every packet placed without error, every byte where its offset says.
    fn verify(&self, packet: usize) -> Result<(), String> {
        let errors = self.rig.dev.read64(HFI1_BAR, self.reg(LB_DESC_ERR)).map_err(|e| e.to_string())?;
        if errors != 0 {
            return Err(format!("{errors} descriptors were not placed"));
        }
        let mut got = vec![0u8; packet];
        for k in 0..self.dst.len() / packet {
            self.dst.read(k * packet, &mut got).map_err(|e| e.to_string())?;
            if got.iter().any(|b| *b != k as u8 ^ 0x5A) {
                return Err(format!("packet {k} was not placed at offset {}", k * packet));
            }
        }
        Ok(())
    }
}

/// `copy_from_slice` of `len` bytes between two buffers of their own.
struct Memcpy {
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl Memcpy {
    fn new(len: usize) -> Self {
        Self { src: vec![0xA5u8; len], dst: vec![0u8; len] }
    }

    fn once(&mut self) -> Result<(), String> {
        self.dst.copy_from_slice(std::hint::black_box(&self.src));
        std::hint::black_box(&mut self.dst);
        Ok(())
    }
}

fn gbps(bytes: usize, s: &Samples) -> f64 {
    bytes as f64 / s.median().max(1.0)
}

/// One doorbell's placement and one memcpy of the same bytes, timed back to back, pair after pair.
struct Paired {
    placed: Samples,
    copied: Samples,
    /// Per pair: placement GB/s over memcpy GB/s (memcpy time over placement time).
    ratios: Vec<f64>,
}

impl Paired {
    fn ratio_quantile(&self, q: f64) -> f64 {
        let mut v = self.ratios.clone();
        v.sort_unstable_by(f64::total_cmp);
        let rank = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1));
        v.get(rank - 1).copied().unwrap_or(0.0)
    }
}

/// Nanoseconds `op` took.
fn timed(op: impl FnOnce() -> Result<(), String>) -> Result<u64, String> {
    let t = Instant::now();
    op()?;
    Ok(t.elapsed().as_nanos() as u64)
}

/// Placement and memcpy of one doorbell's bytes, each doorbell paired with a memcpy timed right next to it
/// (the order alternating), for at least `MIN_PAIRS` pairs or `budget`. This host's memory bandwidth swings
/// several-fold within a second as other tenants load it, so only measurements taken milliseconds apart
/// compare; the target is the median of the per-pair ratios.
fn measure(budget: Duration, entries: usize) -> Result<Paired, String> {
    let mut lb = Loopback::new(Hfi1Config::default(), SEGMENT, entries, PACKET)?;
    lb.ring()?;
    lb.verify(PACKET)?;
    let mut copy = Memcpy::new(entries * SEGMENT);
    for _ in 0..3 {
        lb.ring()?;
        copy.once()?;
    }
    let mut p = Paired { placed: Samples::default(), copied: Samples::default(), ratios: Vec::new() };
    let start = Instant::now();
    while p.ratios.len() < MIN_PAIRS || start.elapsed() < budget {
        let (placed, copied) = if p.ratios.len() % 2 == 0 {
            let placed = timed(|| lb.ring())?;
            (placed, timed(|| copy.once())?)
        } else {
            let copied = timed(|| copy.once())?;
            (timed(|| lb.ring())?, copied)
        };
        p.ratios.push(copied as f64 / placed.max(1) as f64);
        p.placed.ns.push(placed);
        p.copied.ns.push(copied);
    }
    Ok(p)
}

/// (e) GB/s of loopback placement against memcpy of the same size: the target at 16 MiB per doorbell, the
/// 1 MiB doorbell reported beside it.
pub fn placement(budget: Duration) -> Case {
    Case::new("e", "loopback TID data placement vs memcpy of the same size").run(|case| {
        let (small, large) = (SMALL_ENTRIES * SEGMENT, LARGE_ENTRIES * SEGMENT);
        let s = measure(budget, SMALL_ENTRIES)?;
        case.metric("1 MiB doorbell: loopback placement", gbps(small, &s.placed), "GB/s");
        case.metric("1 MiB doorbell: memcpy of 1 MiB", gbps(small, &s.copied), "GB/s");
        case.metric("1 MiB doorbell: median per doorbell", s.placed.median(), "ns");
        case.metric("1 MiB doorbell: placement / memcpy, median of pairs", s.ratio_quantile(0.5), "x");
        let l = measure(budget, LARGE_ENTRIES)?;
        case.metric("16 MiB doorbell: loopback placement", gbps(large, &l.placed), "GB/s");
        case.metric("16 MiB doorbell: memcpy of 16 MiB", gbps(large, &l.copied), "GB/s");
        case.metric("16 MiB doorbell: memcpy, p10 of pairs", large as f64 / l.copied.quantile(0.9).max(1.0), "GB/s");
        case.metric("16 MiB doorbell: memcpy, p90 of pairs", large as f64 / l.copied.quantile(0.1).max(1.0), "GB/s");
        case.metric("16 MiB doorbell: median per doorbell", l.placed.median(), "ns");
        case.metric("16 MiB doorbell: pair ratio p10", l.ratio_quantile(0.1), "x");
        case.metric("16 MiB doorbell: pair ratio p90", l.ratio_quantile(0.9), "x");
        case.metric("16 MiB doorbell: pairs", l.ratios.len() as f64, "");
        case.target(Target::new(
            "placement / memcpy (16 MiB), median of pairs",
            l.ratio_quantile(0.5),
            TARGET_FRACTION,
            "x",
            Better::Higher,
        ));
        case.note(format!(
            "{large} B per doorbell: {} descriptors of {PACKET} B into {LARGE_ENTRIES} RcvArray entries of {SEGMENT} \
             B; also {small} B ({} descriptors, {SMALL_ENTRIES} entries); completion by MSI-X; the bytes are checked \
             once per size; memcpy = copy_from_slice of the same size, each doorbell paired with one memcpy timed \
             next to it (order alternating); the ratio is the median over pairs",
            large / PACKET,
            small / PACKET
        ));
        Ok(())
    })
}

/// Doorbell latency of `lb` (median ns) per round, alternating with `other`.
fn alternate(budget: Duration, a: &mut Loopback, b: &mut Loopback) -> Result<(Samples, Samples), String> {
    let (mut sa, mut sb) = (Samples::default(), Samples::default());
    for _ in 0..ROUNDS {
        sa.extend(sample(budget / ROUNDS, 20, 5, usize::MAX, || a.ring())?);
        sb.extend(sample(budget / ROUNDS, 20, 5, usize::MAX, || b.ring())?);
    }
    Ok((sa, sb))
}

/// The hfi1 worker with and without a 50 us idle spin: small doorbells (latency) and bulk placement.
pub fn worker_spin(budget: Duration) -> Case {
    Case::new("spin", "hfi1 loopback worker: 50 us idle spin vs sleeping at once").run(|case| {
        let sleepy = Hfi1Config { worker_spin: Duration::ZERO, ..Default::default() };
        let spinny = Hfi1Config { worker_spin: SPIN, ..Default::default() };
        // One 4 KiB packet per doorbell: the wake-up dominates.
        let small = PAGE_SIZE as usize;
        let mut a = Loopback::new(sleepy, small, SMALL_ENTRIES, small)?;
        let mut b = Loopback::new(spinny, small, SMALL_ENTRIES, small)?;
        a.ring()?;
        a.verify(small)?;
        b.ring()?;
        b.verify(small)?;
        let (sa, sb) = alternate(budget, &mut a, &mut b)?;
        drop((a, b));
        case.metric("4 x 4 KiB packets per doorbell, no spin: median", sa.median(), "ns");
        case.metric("4 x 4 KiB packets per doorbell, 50 us spin: median", sb.median(), "ns");
        let mut a = Loopback::new(sleepy, SEGMENT, SMALL_ENTRIES, PACKET)?;
        let mut b = Loopback::new(spinny, SEGMENT, SMALL_ENTRIES, PACKET)?;
        let (la, lb) = alternate(budget, &mut a, &mut b)?;
        let bytes = SMALL_ENTRIES * SEGMENT;
        case.metric("1 MiB per doorbell, no spin", gbps(bytes, &la), "GB/s");
        case.metric("1 MiB per doorbell, 50 us spin", gbps(bytes, &lb), "GB/s");
        let gain = sa.median() / sb.median().max(1.0);
        case.metric("small-doorbell speed-up from spinning", gain, "x");
        case.note(
            "the device model's default (Hfi1Config::worker_spin) follows this measurement: see docs/bench.md; the \
             spin costs a core for 50 us after every doorbell, so it must win clearly to be kept",
        );
        Ok(())
    })
}
