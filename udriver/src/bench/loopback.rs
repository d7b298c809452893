//! Loopback TID data placement on any hfi1 function: the driver probed with one receive context owning the
//! whole RcvArray, `entries` RcvArray entries over one destination buffer, and a descriptor chain that places
//! the whole buffer in fixed-size packets at every doorbell. Case (e) on the host, and the guest mode's
//! placement row.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_abi::hfi1::{
    LbDescHeader, LB_BASE, LB_DB_DONE, LB_DESC_ADDR, LB_DESC_ERR, LB_DESC_HDR_LEN, LB_DOORBELL, LB_MAX_CHAIN,
    LB_MSIX_VECTOR,
};

use crate::access::DeviceAccess;
use crate::dma::{DmaBuffer, DmaPool, PAGE_SIZE};
use crate::hfi1::ctxt::{hfi1_rcvctrl, Hfi1Ctxtdata, Hfi1Devdata, Hfi1Params, HFI1_RCVCTRL_CTXT_ENB};
use crate::hfi1::regs::{
    PtType, HFI1_BAR, KDETH_OFFSET_MASK, KDETH_OFFSET_SHIFT, KDETH_OM_SHIFT, KDETH_TIDCTRL_SHIFT, KDETH_TID_SHIFT,
};
use crate::hfi1::tid::{hfi1_put_tid, trdma_pset_order};

/// A TID RDMA segment at most (TID_RDMA_MAX_SEGMENT_SIZE): one RcvArray entry's buffer.
pub const SEGMENT: usize = 256 * 1024;
/// OPA's largest common MTU: the payload of one packet.
pub const PACKET: usize = 8192;
/// KDETH OFFSET unit with OM set: 64 bytes (hardware-facts §1.10, the kernel's KDETH_OM_LARGE_SHIFT).
const KDETH_OM_LARGE_SHIFT: u32 = 6;
/// TIDCTRL of a packet for the even / odd entry of a TID pair.
const TIDCTRL_EVEN: u32 = 1;
const TIDCTRL_ODD: u32 = 2;
const WAIT: Duration = Duration::from_secs(5);

/// The driver's side of an hfi1 function for the benchmarks: probed, receive contexts sharing the whole
/// RcvArray (no eager split), a DMA pool.
pub struct Hfi1Driver {
    /// The first context (the only one of [`Hfi1Driver::probe`]).
    pub rcd: Arc<Hfi1Ctxtdata>,
    /// Every context, in order.
    pub rcds: Vec<Arc<Hfi1Ctxtdata>>,
    pub dd: Arc<Hfi1Devdata>,
    pub pool: Arc<DmaPool>,
    pub dev: Arc<dyn DeviceAccess>,
}

impl Hfi1Driver {
    /// One receive context owning the whole RcvArray.
    pub fn probe(dev: Arc<dyn DeviceAccess>) -> Result<Self, String> {
        Self::probe_contexts(dev, 1)
    }

    /// `contexts` receive contexts, each with its share of the RcvArray.
    pub fn probe_contexts(dev: Arc<dyn DeviceAccess>, contexts: u32) -> Result<Self, String> {
        dev.pci_enable_device().map_err(|e| format!("pci_enable_device: {e}"))?;
        let params = Hfi1Params { num_rcv_contexts: contexts, rcvarr_split: 0, ..Default::default() };
        let dd = Hfi1Devdata::probe(dev.clone(), params).map_err(|e| format!("probe: {e}"))?;
        let rcds = (0..contexts.max(1))
            .map(|c| Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, c).map_err(|e| format!("context {c}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let rcd = rcds.first().cloned().ok_or("no receive context")?;
        // Sub-allocating: one header queue per context would otherwise be one memfd each, and over direct
        // vfio-user the server maps only 64 files per client (docs/bench.md, "Scale").
        let pool = Arc::new(DmaPool::sub_allocating(dev.clone(), false));
        Ok(Self { rcd, rcds, dd, pool, dev })
    }

    /// Programs `batch` expected entries of the first context from `*next` on, wrapping inside the context,
    /// each a 4 KiB buffer at `IOVA_BASE` + its index in pages. A context without expected entries (a
    /// device that reports a tiny RcvArray) is an error, not a division by zero.
    pub fn program_expected(&self, next: &mut u32, batch: u32) -> Result<(), String> {
        let (base, count) = (self.rcd.expected_base, self.rcd.expected_count);
        if count == 0 {
            return Err(format!("context {} has no expected RcvArray entries", self.rcd.ctxt));
        }
        for _ in 0..batch {
            *next %= count;
            let pa = crate::dma::IOVA_BASE + u64::from(*next) * PAGE_SIZE;
            hfi1_put_tid(&self.dd, base + *next, PtType::PT_EXPECTED, pa, trdma_pset_order(1))
                .map_err(|e| e.to_string())?;
            *next = (*next + 1) % count;
        }
        Ok(())
    }
}

/// Every receive context of the driver enabled, `entries` RcvArray entries over `dst` (split evenly over the
/// contexts, in order), and a descriptor chain in `chain` that places `dst.len()` bytes with `packet`-byte
/// packets; MSI-X vector 0 signals each finished doorbell.
pub struct Loopback<'a> {
    drv: &'a Hfi1Driver,
    dst: DmaBuffer,
    /// Read by the device at every doorbell: kept mapped as long as the loopback.
    _chain: DmaBuffer,
    packet: usize,
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

fn reg(rel: u64) -> u64 {
    LB_BASE + rel
}

impl<'a> Loopback<'a> {
    /// Sets up the contexts, the entries and the chain. Only once per driver: the contexts are enabled and
    /// their header queues given here.
    pub fn new(drv: &'a Hfi1Driver, entry_size: usize, entries: usize, packet: usize) -> Result<Self, String> {
        let contexts = drv.rcds.len().max(1);
        let per_ctxt = entries.div_ceil(contexts);
        if let Some(small) = drv.rcds.iter().find(|r| per_ctxt > r.expected_count as usize) {
            return Err(format!(
                "{per_ctxt} RcvArray entries wanted per context, context {} has {}",
                small.ctxt, small.expected_count
            ));
        }
        if packet == 0 || !entry_size.is_multiple_of(packet) {
            return Err(format!("{packet}-byte packets do not divide {entry_size}-byte entries"));
        }
        for rcd in &drv.rcds {
            let hdrq = drv.pool.alloc_contiguous(PAGE_SIZE as usize).map_err(|e| e.to_string())?;
            rcd.set_rcvhdrq(Arc::new(hdrq), None);
            hfi1_rcvctrl(&drv.dd, HFI1_RCVCTRL_CTXT_ENB, rcd).map_err(|e| format!("rcvctrl: {e}"))?;
        }
        drv.dev.enable_msix(1).map_err(|e| format!("MSI-X: {e}"))?;
        let dst = drv.pool.alloc_contiguous(entry_size * entries).map_err(|e| e.to_string())?;
        let order = trdma_pset_order((entry_size / PAGE_SIZE as usize) as u32);
        // Entry e of the buffer: context e / per_ctxt, its entry e % per_ctxt.
        let place = |e: usize| (&drv.rcds[e / per_ctxt], e % per_ctxt);
        for e in 0..entries {
            let pa = dst.iova(e * entry_size).ok_or("entry outside the buffer")?;
            let (rcd, rel) = place(e);
            hfi1_put_tid(&drv.dd, rcd.expected_base + rel as u32, PtType::PT_EXPECTED, pa, order)
                .map_err(|e| e.to_string())?;
        }
        let packets = entry_size * entries / packet;
        if packets > LB_MAX_CHAIN {
            return Err(format!("{packets} descriptors exceed the chain limit {LB_MAX_CHAIN}"));
        }
        let stride = LB_DESC_HDR_LEN + packet;
        let chain = drv.pool.alloc_contiguous(packets * stride).map_err(|e| e.to_string())?;
        for k in 0..packets {
            let at = k * stride;
            let next = if k + 1 < packets { chain.iova(at + stride).ok_or("chain overflow")? } else { 0 };
            let (entry, offset) = (k * packet / entry_size, k * packet % entry_size);
            let (rcd, rel) = place(entry);
            let d = LbDescHeader {
                kdeth0: kdeth0(rel, offset),
                dest_qp: rcd.ctxt,
                psn: k as u32,
                payload_len: packet as u32,
                next,
            };
            chain.write(at, &d.to_bytes()).map_err(|e| e.to_string())?;
            chain.fill(at + LB_DESC_HDR_LEN, packet, k as u8 ^ 0x5A).map_err(|e| e.to_string())?;
        }
        // Every doorbell replays the same chain, and LB_DESC_ADDR keeps its value: written once.
        let head = chain.iova(0).ok_or("empty chain")?;
        drv.dev.write64(HFI1_BAR, reg(LB_DESC_ADDR), head).map_err(|e| e.to_string())?;
        Ok(Self { drv, dst, _chain: chain, packet, rung: 0 })
    }

    /// Bytes one doorbell places.
    pub fn bytes(&self) -> usize {
        self.dst.len()
    }

    /// One doorbell: the whole chain placed, waited for by interrupt. A driver's minimum per doorbell: one
    /// trapped write, the MSI-X wake-up (an eventfd, so an interrupt raised before the wait is not lost), and one
    /// trapped read to confirm which doorbell finished.
    pub fn ring(&mut self) -> Result<(), String> {
        let dev = &self.drv.dev;
        dev.write64(HFI1_BAR, reg(LB_DOORBELL), 1).map_err(|e| e.to_string())?;
        self.rung += 1;
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            dev.wait_irq(u32::from(LB_MSIX_VECTOR), left).map_err(|e| e.to_string())?;
            let done = dev.read64(HFI1_BAR, reg(LB_DB_DONE)).map_err(|e| e.to_string())?;
            if done >= self.rung {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("doorbell {} not done within {WAIT:?} (done {done})", self.rung));
            }
        }
    }

    /// Every packet placed without error, every byte where its offset says.
    pub fn verify(&self) -> Result<(), String> {
        let errors = self.drv.dev.read64(HFI1_BAR, reg(LB_DESC_ERR)).map_err(|e| e.to_string())?;
        if errors != 0 {
            return Err(format!("{errors} descriptors were not placed"));
        }
        let mut got = vec![0u8; self.packet];
        for k in 0..self.dst.len() / self.packet {
            self.dst.read(k * self.packet, &mut got).map_err(|e| e.to_string())?;
            if got.iter().any(|b| *b != k as u8 ^ 0x5A) {
                return Err(format!("packet {k} was not placed at offset {}", k * self.packet));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hfi1::fake;

    #[test]
    fn a_context_without_expected_entries_is_an_error_not_a_division_by_zero() {
        // One TID group, all of it eager (rcvarr_split 100): the context has no expected entry.
        let dev = fake::FakeHfi1::new(8, 1);
        let params = Hfi1Params { rcvarr_split: 100, ..Default::default() };
        let dd = Hfi1Devdata::probe(dev.clone(), params).unwrap();
        let rcd = Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, 0).unwrap();
        assert_eq!(rcd.expected_count, 0);
        let pool = Arc::new(DmaPool::new(dev.clone(), false));
        let drv = Hfi1Driver { rcd: rcd.clone(), rcds: vec![rcd], dd, pool, dev };
        let mut next = 0;
        assert_eq!(drv.program_expected(&mut next, 4), Err("context 0 has no expected RcvArray entries".into()));
    }
}
