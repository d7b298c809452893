//! The irdma engine: BAR0 register dispatch, the hand-off to the worker thread, reset/detach; the shared
//! state is in `shared.rs`, the dump and control commands in `control.rs`.
//!
//! Register reads and writes take the state lock briefly and never do DMA; everything that touches client
//! memory runs on the worker (`worker.rs`), which drops the lock around each DMA (docs/architecture.md).

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde_json::{json, Value};
use vfio_user_proto::dma::{DmaAccess, NoDma};
use vfio_user_proto::sync::Unpoison;

use super::control;
use super::qhash::QhashTable;
use super::regs::*;
use super::shared::{bump, Counters, Regs, ResultLog, Shared, State};
use super::worker::{Work, Worker};
use super::{CreateError, IrdmaConfig};
use crate::engine::{BarSpec, Engine, Interrupt, NoInterrupt};
use crate::probe::Probe;
use crate::trace::{Block, Level, RegisterName, Val};
use crate::worker::{JobTag, WorkQueue};

/// Queue depth between the register path and the worker. Doorbells coalesce (the worker always reads the
/// latest CQPDB value), so a full queue loses nothing but redundant wake-ups.
const WORK_QUEUE_DEPTH: usize = 64;
impl JobTag for Work {
    fn tag(&self) -> (&'static str, u64) {
        match *self {
            Work::CqpCreate { ctx_pa } => ("cqp-create", ctx_pa),
            Work::CqpDestroy => ("cqp-destroy", 0),
            Work::Doorbell => ("doorbell", 0),
            Work::Arm => ("arm", 0),
            Work::Loopback { desc_pa } => ("loopback", desc_pa),
            Work::Reset => ("reset", 0),
        }
    }
}

/// The irdma PCI function's engine.
pub struct Irdma {
    shared: Arc<Shared>,
    /// `None` if the thread could not start: every command then stays pending and the driver's polls time out.
    worker: Option<WorkQueue<Work>>,
}

impl Default for Irdma {
    fn default() -> Self {
        Self::new(IrdmaConfig::default())
    }
}

impl Irdma {
    /// Starts the worker thread. The function is idle until a client attaches and creates a CQP.
    pub fn new(config: IrdmaConfig) -> Self {
        let ceqs = usize::from(config.msix_vectors);
        let state = State {
            epoch: 0,
            regs: Regs::power_on(ceqs),
            cqp: None,
            ccq: None,
            qhash: QhashTable::new(config.qhash_capacity),
            results: ResultLog::default(),
        };
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(state),
            epoch: AtomicU64::new(0),
            counters: Counters::default(),
            dma: RwLock::new(Arc::new(NoDma)),
            irq: RwLock::new(Arc::new(NoInterrupt)),
            stop: AtomicBool::new(false),
            probe: Probe::new("irdma"),
        });
        let mut worker = Worker::new(shared.clone());
        let mode = shared.config.worker;
        let probe = shared.probe.clone();
        let worker = match WorkQueue::spawn("irdma-cqp", WORK_QUEUE_DEPTH, mode, probe, move |msg| worker.handle(msg)) {
            Ok(q) => Some(q),
            Err(e) => {
                tracing::error!("irdma: cannot start the worker thread: {e}");
                None
            }
        };
        Irdma { shared, worker }
    }

    /// Waits until the worker has handled every queued request. For tests and benchmarks.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        self.worker.as_ref().is_none_or(|q| q.wait_idle(timeout))
    }

    pub fn counters(&self) -> Value {
        self.shared.counters.to_json()
    }

    /// What invariant checks read, without serialising a whole dump: (quad-hash entries, its capacity, the SQ
    /// size of a live CQP). For tests and fuzzing.
    pub fn shape(&self) -> (usize, usize, Option<u32>) {
        let st = self.shared.lock();
        (st.qhash.len(), st.qhash.capacity(), st.cqp.as_ref().map(|c| c.ctx.sq_size))
    }

    /// Power-on state under the lock; the worker's wake-up, if any, is queued for after it.
    fn reset_state(&self) {
        let mut st = self.shared.access();
        st.epoch += 1;
        self.shared.epoch.store(st.epoch, Relaxed);
        st.regs = Regs::power_on(usize::from(self.shared.config.msix_vectors));
        // What the worker may hold: it publishes its CQP/CCQ here, and keeps them only while they are.
        let held = st.cqp.take().is_some() | st.ccq.take().is_some();
        st.qhash.clear();
        st.results = ResultLog::default();
        self.shared.counters.clear();
        // Wakes the worker so it drops its CQP/CCQ now rather than at the next command. With none, there
        // is nothing to drop, and a wake-up per reset is what a fuzz worker resetting per input pays most.
        if held {
            self.submit(&st, Work::Reset);
        }
    }

    /// Inline mode: runs what this access queued, now that it holds no lock (`crate::worker`).
    fn run_queued(&self) {
        if let Some(q) = &self.worker {
            q.run_queued();
        }
    }

    /// Queues work for the worker; never blocks.
    fn submit(&self, st: &State, work: Work) -> bool {
        if self.worker.as_ref().is_some_and(|q| q.try_submit(st.epoch, work)) {
            return true;
        }
        bump(&self.shared.counters.work_dropped);
        false
    }

    fn read_reg(&self, reg: Reg) -> u32 {
        let st = self.shared.access();
        let r = &st.regs;
        match reg {
            Reg::CqpTail => r.cqptail,
            Reg::CqpDb => r.cqpdb,
            Reg::CcqpStatus => r.ccqpstatus,
            Reg::CcqpHigh => r.ccqphigh,
            Reg::CcqpLow => r.ccqplow,
            Reg::CqpErrCodes => r.cqperrcodes,
            // Write-only doorbells read as 0.
            Reg::CqArm | Reg::CqAck | Reg::AeqAlloc | Reg::WqeAlloc | Reg::DbPage | Reg::LbDoorbell => 0,
            Reg::LbarCtrl => IRDMA_GLPCI_LBARCTRL_PE_DB_SIZE.put(IRDMA_PE_DB_SIZE_8M) as u32,
            Reg::CpuStatus => IRDMA_GLPE_CPUSTATUS_READY,
            Reg::CeqCtl(i) => r.ceqctl.get(i).copied().unwrap_or(u32::MAX),
            Reg::LbDescLow => r.lb_desc_low,
            Reg::LbDescHigh => r.lb_desc_high,
            Reg::LbStatus => r.lb_status,
            Reg::LbResult => r.lb_result,
            Reg::LbSeq => r.lb_seq,
        }
    }

    fn write_reg(&self, reg: Reg, value: u32) {
        let c = &self.shared.counters;
        let mut st = self.shared.access();
        match reg {
            // irdma_sc_cqp_init writes CQPTAIL <- 0 and CCQPSTATUS <- 0 before any CQP exists: honoured.
            Reg::CqpTail | Reg::CcqpStatus if value == 0 && st.cqp.is_none() => {
                if reg == Reg::CqpTail {
                    st.regs.cqptail = 0;
                } else {
                    st.regs.ccqpstatus = 0;
                }
            }
            Reg::CqpTail
            | Reg::CcqpStatus
            | Reg::CqpErrCodes
            | Reg::LbarCtrl
            | Reg::CpuStatus
            | Reg::LbStatus
            | Reg::LbResult
            | Reg::LbSeq => bump(&c.ro_writes_ignored),
            Reg::CqpDb => match st.cqp {
                Some(cqp) if value < cqp.ctx.sq_size => {
                    st.regs.cqpdb = value;
                    bump(&c.doorbells);
                    let head = [("head", Val::Dec(value.into()))];
                    self.shared.probe.trace.event(Block::Cqp, Level::Info, "doorbell", &head);
                    self.submit(&st, Work::Doorbell);
                }
                _ => bump(&c.doorbells_ignored),
            },
            Reg::CcqpHigh => st.regs.ccqphigh = value,
            Reg::CcqpLow => {
                st.regs.ccqplow = value;
                if st.regs.ccqphigh == 0 && value == 0 {
                    self.submit(&st, Work::CqpDestroy);
                } else if st.cqp.is_some() {
                    // A second create while a CQP runs: refused, the running CQP is untouched.
                    let (major, minor) = CreateError::AlreadyExists.codes();
                    st.regs.ccqpstatus = (IRDMA_CCQPSTATUS_CCQP_DONE.put(1) | IRDMA_CCQPSTATUS_CCQP_ERR.put(1)) as u32;
                    st.regs.cqperrcodes = cqperrcodes(major, minor);
                    bump(&c.cqp_create_errors);
                } else {
                    st.regs.ccqpstatus = 0;
                    let ctx_pa = (u64::from(st.regs.ccqphigh) << 32) | u64::from(value);
                    if !self.submit(&st, Work::CqpCreate { ctx_pa }) {
                        let (major, minor) = CreateError::Busy.codes();
                        st.regs.ccqpstatus =
                            (IRDMA_CCQPSTATUS_CCQP_DONE.put(1) | IRDMA_CCQPSTATUS_CCQP_ERR.put(1)) as u32;
                        st.regs.cqperrcodes = cqperrcodes(major, minor);
                    }
                }
            }
            Reg::CqArm => {
                if value == super::ccq::IRDMA_CCQ_CQ_ID && st.ccq.is_some() {
                    self.submit(&st, Work::Arm);
                } else {
                    bump(&c.arms_ignored);
                }
            }
            Reg::CqAck | Reg::AeqAlloc | Reg::WqeAlloc | Reg::DbPage => bump(&c.unsupported_doorbells),
            Reg::CeqCtl(i) => {
                if let Some(r) = st.regs.ceqctl.get_mut(i) {
                    *r = value;
                }
            }
            Reg::LbDescLow => st.regs.lb_desc_low = value,
            Reg::LbDescHigh => st.regs.lb_desc_high = value,
            Reg::LbDoorbell => {
                let desc_pa = (u64::from(st.regs.lb_desc_high) << 32) | u64::from(st.regs.lb_desc_low);
                if self.submit(&st, Work::Loopback { desc_pa }) {
                    st.regs.lb_pending += 1;
                    st.regs.lb_status = emu_abi::irdma::LbStatus::DEFAULT.with_busy(true).raw_value();
                }
            }
        }
    }
}

impl Engine for Irdma {
    fn name(&self) -> &'static str {
        "irdma"
    }

    fn bars(&self) -> Vec<BarSpec> {
        vec![BarSpec { index: 0, size: IRDMA_BAR0_SIZE, is_64bit: true, prefetchable: false, mmap: None }]
    }

    fn msix_vectors(&self) -> u16 {
        self.shared.config.msix_vectors
    }

    fn mmio_read(&self, bar: u32, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        if bar != 0 {
            return;
        }
        let base = offset & !3;
        let shift = (offset - base) as usize;
        let Some(end) = shift.checked_add(data.len()).filter(|e| *e <= 4) else {
            // Registers are 32-bit: wider or straddling reads return all-ones.
            bump(&self.shared.counters.bad_mmio);
            return;
        };
        if let Some(reg) = Reg::decode(base, usize::from(self.shared.config.msix_vectors)) {
            let bytes = self.read_reg(reg).to_le_bytes();
            data.copy_from_slice(&bytes[shift..end]);
        }
    }

    fn mmio_write(&self, bar: u32, offset: u64, data: &[u8]) {
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            bump(&self.shared.counters.bad_mmio);
            return;
        };
        if bar != 0 || !offset.is_multiple_of(4) {
            bump(&self.shared.counters.bad_mmio);
            return;
        }
        match Reg::decode(offset, usize::from(self.shared.config.msix_vectors)) {
            Some(reg) => self.write_reg(reg, u32::from_le_bytes(bytes)),
            None => bump(&self.shared.counters.unknown_writes),
        }
        self.run_queued();
    }

    fn attach(&self, dma: Arc<dyn DmaAccess>, irq: Arc<dyn Interrupt>) {
        *self.shared.dma.write().unpoison() = dma;
        *self.shared.irq.write().unpoison() = irq;
    }

    fn detach(&self) {
        *self.shared.dma.write().unpoison() = Arc::new(NoDma);
        *self.shared.irq.write().unpoison() = Arc::new(NoInterrupt);
        self.reset();
    }

    fn reset(&self) {
        self.reset_state();
        self.run_queued();
    }

    fn probe(&self) -> Arc<Probe> {
        self.shared.probe.clone()
    }

    fn register_name(&self, bar: u32, offset: u64, value: Option<u64>) -> RegisterName {
        if bar != 0 {
            return RegisterName::unnamed();
        }
        super::names::describe(offset, usize::from(self.shared.config.msix_vectors), value)
    }

    fn idle(&self) -> bool {
        self.worker.as_ref().is_none_or(|q| q.idle())
    }

    fn register_offset(&self, name: &str) -> Option<(u32, u64)> {
        super::names::offset_of(name, usize::from(self.shared.config.msix_vectors)).map(|o| (0, o))
    }

    fn control(&self, request: &Value) -> Result<Value, String> {
        let cmd = request.get("cmd").and_then(Value::as_str).ok_or("request needs a string \"cmd\"")?;
        match cmd {
            "dump" => Ok(control::dump(&self.shared)),
            "counters" => Ok(self.shared.counters.to_json()),
            "reset" => {
                self.reset();
                Ok(json!({"ok": true}))
            }
            "classify" => control::classify(&self.shared, request),
            other => Err(format!("unknown irdma command {other:?} (dump, counters, reset, classify)")),
        }
    }
}

impl Drop for Irdma {
    fn drop(&mut self) {
        // The worker checks this between DMA accesses; the queue's own drop then joins it.
        self.shared.stop.store(true, Relaxed);
    }
}
