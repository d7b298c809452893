//! The hfi1 function as an [`Engine`]: BAR0 dispatch, the worker thread that places packets, attach/detach and
//! reset.
//!
//! Locks: `rxe` (registers, flow tables, RcvArray) is never held across a DMA access; `dma`/`irq` are held
//! only to clone the handle. The loopback registers a driver polls are atomics.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use vfio_user_proto::device::RegionFd;
use vfio_user_proto::dma::{DmaAccess, NoDma};
use vfio_user_proto::sync::Unpoison;

use super::cable::{Cable, End, Port, WirePacket};
use super::config::{Hfi1Config, Personality, HFI1_BAR, HFI1_BAR0_SIZE, HFI1_MSIX_VECTORS};
use super::counters::Counters;
use super::datapath::batch::{BatchWait, WIRE_BATCH_MAX};
use super::datapath::loopback::{LB_DESC_ADDR, LB_DOORBELL, LB_MAX_PAYLOAD};
use super::datapath::port::{kick, HfiPort};
use super::datapath::worker::{run_job, Job};
use super::error::{Hfi1Error, Result};
use super::observe::InjectOutcome;
use super::regs::{RCV_ARRAY, RCV_ARRAY_ENTRY_SIZE, RXE, TXE};
use super::rxe::rcv::{Packet, RxResult};
use super::rxe::state::{Access, Rxe};
use super::shared::{Front, LbRegs, Shared, WfrFront, WORK_TIMEOUT};
use super::shm::SharedWords;
use super::wfr::{self, Wfr};
use crate::clock::Clock;
use crate::engine::{BarMmap, BarSpec, Engine, Interrupt, MsixPlacement, NoInterrupt, PciShape, PcieLink};
use crate::probe::Probe;
use crate::trace::RegisterName;
use crate::worker::WorkQueue;

/// The emulated hfi1 receive side. Dropping it stops its worker thread.
pub struct Hfi1 {
    config: Hfi1Config,
    shared: Arc<Shared>,
    region_fd: RegionFd,
    worker: Arc<WorkQueue<Job>>,
    /// This function's end of a cable, once connected (the cable holds it weakly).
    port: OnceLock<Arc<HfiPort>>,
}

impl Hfi1 {
    pub fn new(config: Hfi1Config) -> Result<Self> {
        config.validate()?;
        let shm = SharedWords::new("hfi1-bar0", RCV_ARRAY, config.rcv_array_count)?;
        let region_fd = RegionFd { fd: shm.fd(), fd_offset: 0 };
        let front = match config.personality {
            Personality::Emu => Front::Loopback(LbRegs::default()),
            Personality::Wfr(shape) => Front::Wfr(Arc::new(WfrFront::new(Wfr::new(shape)))),
        };
        let probe = Probe::new(config.name());
        let mut rxe = Rxe::new(config.rcv_contexts, shm, matches!(front, Front::Loopback(_)));
        rxe.rcv_array.set_probe(probe.clone());
        let shared = Arc::new(Shared::new(rxe, front, probe));
        let worker_shared = Arc::clone(&shared);
        let probe = Arc::clone(&shared.probe);
        let worker = WorkQueue::spawn("hfi1-worker", config.doorbell_queue, config.worker, probe, move |job| {
            run_job(&worker_shared, job)
        })
        .map_err(|e| Hfi1Error::Worker(e.to_string()))?;
        Ok(Self { config, shared, region_fd, worker: Arc::new(worker), port: OnceLock::new() })
    }

    /// Joins two chip-personality functions with a cable whose link trains for `training` once both poll
    /// (docs/hfi1-fabric.md): `a` is its end A.
    pub fn connect(a: &Hfi1, b: &Hfi1, training: Duration) -> Result<()> {
        let fronts = [a, b].map(|h| match &h.shared.front {
            Front::Wfr(front) if h.port.get().is_none() => Ok(Arc::clone(front)),
            _ => Err(Hfi1Error::Config(format!("{} cannot take a cable", h.config.name()))),
        });
        let [front_a, front_b] = fronts;
        let (front_a, front_b) = (front_a?, front_b?);
        let cable = Cable::new(training).map_err(|e| Hfi1Error::Worker(format!("cable thread: {e}")))?;
        for (end, h, front) in [(End::A, a, front_a), (End::B, b, front_b)] {
            let port = Arc::new(HfiPort::new(Arc::clone(&h.shared), front, Arc::downgrade(&h.worker)));
            let weak: Weak<dyn Port> = Arc::downgrade(&(Arc::clone(&port) as Arc<dyn Port>));
            let _ = port.front.cable.set(cable.end(end, weak));
            let _ = h.port.set(port);
        }
        Ok(())
    }

    pub fn config(&self) -> &Hfi1Config {
        &self.config
    }

    fn bar0_size(&self) -> u64 {
        match self.config.personality {
            Personality::Emu => HFI1_BAR0_SIZE,
            Personality::Wfr(_) => wfr::WFR_BAR0_SIZE,
        }
    }

    pub(super) fn shared_counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// Every counter by name.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        self.shared.counters.snapshot()
    }

    /// Sends one packet through the receive engine on the worker thread and waits for its result. A packet a
    /// fault drops or holds back reports `Aborted` here; [`Hfi1::inject_packet`] tells what happened.
    pub fn inject(&self, packet: Packet, payload: Vec<u8>) -> Result<RxResult> {
        self.inject_packet(packet, payload).map(|o| o.result.unwrap_or(RxResult::Aborted))
    }

    /// [`Hfi1::inject`], with what the packet faults did.
    pub fn inject_packet(&self, packet: Packet, payload: Vec<u8>) -> Result<InjectOutcome> {
        if payload.len() > LB_MAX_PAYLOAD {
            return Err(Hfi1Error::Control(format!("payload of {} bytes exceeds {LB_MAX_PAYLOAD}", payload.len())));
        }
        let (reply, result) = crossbeam_channel::bounded(1);
        if !self.worker.submit_timeout(self.shared.epoch(), Job::Inject { packet, payload, reply }, WORK_TIMEOUT) {
            let why =
                if self.worker.failed() { "the device is dead (a worker job panicked)" } else { "worker queue full" };
            return Err(Hfi1Error::Worker(why.into()));
        }
        self.worker.run_queued();
        result.recv_timeout(WORK_TIMEOUT).map_err(|_| Hfi1Error::Worker("no result from the worker".into()))
    }

    /// A packet as if the cable had brought it (the control socket's `wire`), queued at the port for the
    /// worker: `false` when the port's queue was full (the packet is dropped and counted). Only the chip
    /// personality has a port.
    pub fn wire(&self, packet: WirePacket) -> Result<bool> {
        let Front::Wfr(front) = &self.shared.front else {
            return Err(Hfi1Error::Config(format!("{} has no port", self.config.name())));
        };
        Ok(super::datapath::port::arrive(&self.shared, front, &self.worker, packet, false, None))
    }

    /// The control socket's `wire-batch`: `packets` queued as [`Hfi1::wire`] queues them, then a wait of at
    /// most `wait` until the worker has judged every one and the driver's RCV_HDR_HEAD has passed every entry
    /// placed by then (datapath/batch.rs). The reply is the JSON the control socket sends.
    pub fn wire_batch(&self, packets: Vec<WirePacket>, wait: Duration) -> Result<serde_json::Value> {
        let clock = crate::clock::RealClock;
        Ok(self.start_wire_batch(packets, &clock)?.wait(&clock, wait))
    }

    /// The first half of [`Hfi1::wire_batch`]: the batch queued and registered for its wake-ups.
    pub(super) fn start_wire_batch<'a>(&'a self, packets: Vec<WirePacket>, clock: &dyn Clock) -> Result<BatchWait<'a>> {
        let Front::Wfr(front) = &self.shared.front else {
            return Err(Hfi1Error::Config(format!("{} has no port", self.config.name())));
        };
        if packets.len() > WIRE_BATCH_MAX {
            return Err(Hfi1Error::Control(format!("a batch holds at most {WIRE_BATCH_MAX} packets")));
        }
        BatchWait::start(&self.shared, front, packets, clock, |p, batch| {
            super::datapath::port::arrive(&self.shared, front, &self.worker, p, false, Some(batch));
        })
    }

    /// Packets waiting at the port for the worker, one held back for room included: what an observer that
    /// follows each packet until it is written or dropped (the fuzz DMA oracle) still expects.
    pub fn ingress_queued(&self) -> usize {
        match &self.shared.front {
            Front::Wfr(front) => front.ingress.lock().unpoison().len(),
            Front::Loopback(_) => 0,
        }
    }

    /// The port as the control socket's `link` shows it: physical and logical state, neighbour, cable.
    pub fn link_status(&self) -> serde_json::Value {
        let (guid, dc, cable) = match &self.shared.front {
            Front::Wfr(front) => {
                let w = front.lock();
                let guid = format!("{:#018x}", w.shape().guid);
                (Some(guid), Some(w.dump()["dc8051"].clone()), front.cable.get().map(|e| e.status()))
            }
            Front::Loopback(_) => (None, None, None),
        };
        serde_json::json!({
            "device": self.config.name(),
            "node_guid": guid,
            "port": dc,
            "cable": cable,
        })
    }

    /// The control socket's dump.
    pub fn dump(&self) -> serde_json::Value {
        let mut v = self.shared.lock_rxe().dump(&self.shared.counters);
        v["counters"] = counters_json(&self.shared.counters);
        match &self.shared.front {
            Front::Loopback(lb) => {
                v["loopback"] = serde_json::json!({
                    "desc_addr": format!("{:#x}", lb.desc_addr.load(Ordering::Acquire)),
                    "db_submitted": lb.db_submitted.load(Ordering::Acquire),
                    "db_done": lb.db_done.load(Ordering::Acquire),
                    "desc_done": lb.desc_done.load(Ordering::Acquire),
                    "desc_err": lb.desc_err.load(Ordering::Acquire),
                    "last_result": lb.last_result.load(Ordering::Acquire),
                    "db_dropped": lb.db_dropped.load(Ordering::Acquire),
                });
            }
            Front::Wfr(front) => {
                v["wfr"] = front.lock().dump();
                if let Some(end) = front.cable.get() {
                    v["cable"] = end.status();
                }
            }
        }
        v
    }

    fn read64(&self, offset: u64) -> u64 {
        match &self.shared.front {
            Front::Loopback(lb) => match self.shared.lock_rxe().read(offset, &self.shared.counters) {
                Access::Done(v) => v,
                Access::Loopback(rel) => lb.read(rel).unwrap_or(u64::MAX),
                Access::Unimplemented | Access::ReadOnly => u64::MAX,
            },
            Front::Wfr(front) => self.wfr_read(front, offset),
        }
    }

    /// On the chip personality the RXE model answers what it models and the chip's register file the rest.
    fn wfr_read(&self, front: &WfrFront, offset: u64) -> u64 {
        if (RXE..TXE).contains(&offset) {
            if let Access::Done(v) = self.shared.lock_rxe().read(offset, &self.shared.counters) {
                return v;
            }
        }
        let (value, signal) = {
            let mut w = front.lock();
            (w.read(offset), w.take_signal())
        };
        front.tell_cable(signal);
        value
    }

    fn write64(&self, offset: u64, value: u64) {
        let lb = match &self.shared.front {
            Front::Loopback(lb) => lb,
            Front::Wfr(front) => return self.wfr_write(front, offset, value),
        };
        let access = self.shared.lock_rxe().write(offset, value, &self.shared.counters);
        match access {
            Access::Done(_) => {}
            Access::Loopback(LB_DESC_ADDR) => lb.desc_addr.store(value, Ordering::Release),
            Access::Loopback(LB_DOORBELL) => self.ring_doorbell(lb),
            Access::Loopback(_) | Access::Unimplemented | Access::ReadOnly => {
                self.shared.counters.mmio_ignored_writes.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn wfr_write(&self, front: &WfrFront, offset: u64, value: u64) {
        if (RXE..TXE).contains(&offset) {
            let access = self.shared.lock_rxe().write(offset, value, &self.shared.counters);
            // A head register moved, or a context changed: the packet waiting for room may fit now.
            if matches!(access, Access::Done(_)) && front.ingress_held.load(Ordering::Acquire) {
                kick(&self.worker, &self.shared, &front.ingress_kicked, Job::Ingress);
            }
            // The driver read entries, or restarted a queue: a batch waiting for that may be done.
            if matches!(access, Access::Done(_)) {
                front.batches.nudge_for_write(offset, self.config.rcv_contexts);
            }
            match access {
                Access::Done(_) => return,
                Access::ReadOnly => {
                    self.shared.counters.mmio_ignored_writes.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Access::Unimplemented | Access::Loopback(_) => {}
            }
        }
        let (vectors, signal, launched, engines) = {
            let mut w = front.lock();
            let vectors = w.write(offset, value);
            w.hostile_8051_reply(offset, &self.shared.probe);
            (vectors, w.take_signal(), w.launches_pending(), w.take_sdma_pending())
        };
        for v in vectors {
            self.shared.raise(v);
        }
        front.tell_cable(signal);
        if launched {
            kick(&self.worker, &self.shared, &front.egress_kicked, Job::Egress);
        }
        for engine in (0..32).filter(|e| engines & (1 << e) != 0) {
            self.kick_sdma(front, engine);
        }
    }

    /// Queues a walk of SDMA engine `engine` unless one is queued.
    fn kick_sdma(&self, front: &WfrFront, engine: usize) {
        let bit = 1u32 << engine;
        if front.sdma_kicked.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return;
        }
        if !self.worker.try_submit(self.shared.epoch(), Job::Sdma { engine }) {
            front.sdma_kicked.fetch_and(!bit, Ordering::AcqRel);
            return;
        }
        self.worker.run_queued();
    }

    /// Queues the chain at LB_DESC_ADDR and returns at once; a full queue drops the doorbell (counted).
    fn ring_doorbell(&self, lb: &LbRegs) {
        {
            // Under the RXE lock so a concurrent reset sees the bookkeeping whole; try_send never blocks.
            let _rxe = self.shared.lock_rxe();
            let desc = lb.desc_addr.load(Ordering::Acquire);
            lb.db_submitted.fetch_add(1, Ordering::AcqRel);
            if !self.worker.try_submit(self.shared.epoch(), Job::Doorbell { desc }) {
                lb.db_submitted.fetch_sub(1, Ordering::AcqRel);
                lb.db_dropped.fetch_add(1, Ordering::AcqRel);
                self.shared.counters.lb_doorbell_overruns.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.worker.run_queued();
    }
}

pub(super) fn counters_json(c: &Counters) -> serde_json::Value {
    static ORDER: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    crate::counter_json::to_json(&c.snapshot(), &ORDER)
}

impl Drop for Hfi1 {
    fn drop(&mut self) {
        // Work in flight sees the new epoch and stops; the queue's own drop then joins the worker.
        self.shared.reset();
    }
}

impl Engine for Hfi1 {
    fn name(&self) -> &'static str {
        self.config.name()
    }

    fn kind(&self) -> &'static str {
        self.config.kind()
    }

    fn bars(&self) -> Vec<BarSpec> {
        let len = RCV_ARRAY_ENTRY_SIZE * self.config.rcv_array_count as u64;
        // The stock driver's rcv_array_wc_fill stores 0 over entries in use and relies on the chip ignoring
        // a store without WRITE_ENABLE (exp_rcv.h:92, user_exp_rcv.c:678-718). Shared memory keeps only the
        // last store, so on the chip personality every RcvArray store traps (docs/hfi1-kernel-driver.md).
        let mmap = match self.config.personality {
            Personality::Emu => Some(BarMmap { areas: vec![(RCV_ARRAY, len)], fd: self.region_fd.clone() }),
            Personality::Wfr(_) => None,
        };
        vec![BarSpec { index: HFI1_BAR, size: self.bar0_size(), is_64bit: true, prefetchable: false, mmap }]
    }

    fn msix_vectors(&self) -> u16 {
        match self.config.personality {
            Personality::Emu => HFI1_MSIX_VECTORS,
            Personality::Wfr(_) => wfr::CCE_NUM_MSIX_VECTORS,
        }
    }

    fn pci_shape(&self) -> PciShape {
        match self.config.personality {
            Personality::Emu => PciShape::default(),
            // The chip's config space: PCIe capability at 0x70, MSI-X at 0xB0 (the dword hfi1 saves and
            // restores as PCI_CFG_MSIX0) with its table and PBA in BAR0; Gen3 x16; the PL vendor registers
            // that aspm.c programs are storage.
            Personality::Wfr(_) => PciShape {
                pcie_cap: 0x70,
                msix_cap: 0xB0,
                msix: MsixPlacement::InBar {
                    bar: HFI1_BAR,
                    table_offset: wfr::csr::CCE_MSIX_TABLE_LOWER,
                    pba_offset: wfr::CCE_MSIX_PBA,
                },
                link: PcieLink { speed: 3, width: 16 },
                config_storage: vec![(wfr::PCIE_CFG_REG_PL_BASE, wfr::PCIE_CFG_REG_PL_LEN)],
            },
        }
    }

    fn mmio_read(&self, bar: u32, offset: u64, data: &mut [u8]) {
        data.fill(0xFF);
        let shift = (offset % 8) as usize;
        if bar != HFI1_BAR || offset >= self.bar0_size() || shift + data.len() > 8 || data.is_empty() {
            return;
        }
        let value = self.read64(offset - shift as u64).to_le_bytes();
        data.copy_from_slice(&value[shift..shift + data.len()]);
    }

    fn mmio_write(&self, bar: u32, offset: u64, data: &[u8]) {
        // hfi1 CSRs are 64-bit registers written with writeq; anything else is counted and ignored.
        let Ok(bytes) = <[u8; 8]>::try_from(data) else {
            self.shared.counters.mmio_bad_width.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if bar != HFI1_BAR || offset >= self.bar0_size() || !offset.is_multiple_of(8) {
            self.shared.counters.mmio_bad_width.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.write64(offset, u64::from_le_bytes(bytes));
    }

    fn attach(&self, dma: Arc<dyn DmaAccess>, irq: Arc<dyn Interrupt>) {
        *self.shared.dma.write().unpoison() = dma;
        *self.shared.irq.write().unpoison() = irq;
    }

    fn detach(&self) {
        let old = self.shared.epoch();
        self.shared.reset();
        *self.shared.dma.write().unpoison() = Arc::new(NoDma);
        *self.shared.irq.write().unpoison() = Arc::new(NoInterrupt);
        if !self.worker.wait_not_running(old, WORK_TIMEOUT) {
            tracing::warn!("hfi1: work in flight did not stop within {WORK_TIMEOUT:?} of detach");
        }
    }

    fn reset(&self) {
        // Never waits for the worker: a DMA in flight may need this very thread to deliver its reply.
        self.shared.reset();
    }

    fn control(&self, request: &serde_json::Value) -> std::result::Result<serde_json::Value, String> {
        use super::control::Command;
        match super::control::parse(request).map_err(|e| e.to_string())? {
            Command::Inject { packet, payload } => {
                Ok(self.inject_packet(packet, payload).map_err(|e| e.to_string())?.to_json())
            }
            Command::Dump => Ok(self.dump()),
            Command::Reset => {
                Engine::reset(self);
                Ok(serde_json::json!({"ok": true}))
            }
            Command::Counters => Ok(counters_json(self.shared_counters())),
            Command::Link => Ok(self.link_status()),
            Command::Wire { packet } => {
                Ok(serde_json::json!({"queued": self.wire(packet).map_err(|e| e.to_string())?}))
            }
            Command::WireBatch { packets, wait } => self.wire_batch(packets, wait).map_err(|e| e.to_string()),
            Command::LinkEvent(event) => {
                let applied = match &self.shared.front {
                    Front::Wfr(front) => super::datapath::port::apply_link(&self.shared, front, event, false),
                    Front::Loopback(_) => false,
                };
                Ok(serde_json::json!({ "applied": applied }))
            }
            Command::Capture { file, max_bytes } => {
                let end = match &self.shared.front {
                    Front::Wfr(front) => front.cable.get(),
                    Front::Loopback(_) => None,
                };
                let end = end.ok_or_else(|| format!("{} has no cable", self.config.name()))?;
                let started = file.as_ref().map(|f| f.display().to_string());
                end.capture(file, max_bytes)?;
                Ok(serde_json::json!({"capture": started}))
            }
        }
    }

    fn probe(&self) -> Arc<Probe> {
        self.shared.probe.clone()
    }

    fn register_name(&self, bar: u32, offset: u64, value: Option<u64>) -> RegisterName {
        if bar != HFI1_BAR {
            return RegisterName::unnamed();
        }
        super::names::describe(&self.config.personality, offset, value)
    }

    fn register_is_named(&self, bar: u32, offset: u64) -> bool {
        bar == HFI1_BAR && super::names::is_named(&self.config.personality, offset)
    }

    fn register_offset(&self, name: &str) -> Option<(u32, u64)> {
        super::names::offset_of(&self.config.personality, name).map(|o| (HFI1_BAR, o))
    }

    fn idle(&self) -> bool {
        self.worker.idle()
    }

    /// The chip personality keeps its log from the start: a stalled stock driver's last steps.
    fn keeps_access_log(&self) -> bool {
        matches!(self.config.personality, Personality::Wfr(_))
    }
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "wire_batch_tests.rs"]
mod wire_batch_tests;
