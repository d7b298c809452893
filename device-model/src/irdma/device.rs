//! The irdma engine: BAR0 register file, the hand-off to the worker thread, reset/detach and control.
//!
//! Register reads and writes take the state lock briefly and never do DMA; everything that touches client
//! memory runs on the worker (`worker.rs`), which drops the lock around each DMA (docs/architecture.md).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Sender};
use serde_json::{json, Value};
use vfio_user_proto::dma::{DmaAccess, NoDma};
use vfio_user_proto::sync::Unpoison;

use super::ccq::Ccq;
use super::classify::{classify, ClassifyTarget, Segment};
use super::cqp::Cqp;
use super::qhash::QhashTable;
use super::regs::*;
use super::worker::{Msg, Work, Worker};
use super::{CreateError, IrdmaConfig};
use crate::engine::{BarSpec, Engine, Interrupt, NoInterrupt};

/// Queue depth between the register path and the worker. Doorbells coalesce (the worker always reads the
/// latest CQPDB value), so a full queue loses nothing but redundant wake-ups.
const WORK_QUEUE_DEPTH: usize = 64;
/// Classification results kept for the dump.
pub const RESULT_LOG_LEN: usize = 16;

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// Event counters, all reset by a function reset.
        #[derive(Debug, Default)]
        pub struct Counters { $(pub $name: AtomicU64,)* }
        impl Counters {
            pub fn to_json(&self) -> Value {
                let mut m = serde_json::Map::new();
                $(m.insert(stringify!($name).into(), self.$name.load(Relaxed).into());)*
                Value::Object(m)
            }
            fn clear(&self) { $(self.$name.store(0, Relaxed);)* }
        }
    };
}

counters!(
    doorbells,
    doorbells_ignored,
    wqes,
    wqe_errors,
    cqes,
    cqe_write_errors,
    dma_errors,
    polarity_stalls,
    ccq_full_waits,
    ccq_overflows,
    bad_consumer_index,
    arms,
    arms_ignored,
    interrupts,
    interrupts_dropped,
    cqp_creates,
    cqp_create_errors,
    cqp_destroys,
    ro_writes_ignored,
    bad_mmio,
    unknown_writes,
    unsupported_doorbells,
    classify_listener,
    classify_established,
    classify_to_host,
    loopback_ok,
    loopback_errors,
    work_dropped,
);

pub(super) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

/// The 32-bit registers that hold state.
#[derive(Debug, Default)]
pub(super) struct Regs {
    pub cqptail: u32,
    pub cqpdb: u32,
    pub cqperrcodes: u32,
    pub ccqpstatus: u32,
    pub ccqphigh: u32,
    pub ccqplow: u32,
    pub ceqctl: Vec<u32>,
    pub lb_desc_low: u32,
    pub lb_desc_high: u32,
    pub lb_status: u32,
    pub lb_result: u32,
    pub lb_seq: u32,
    /// Loopback requests queued and not finished.
    pub lb_pending: u32,
}

impl Regs {
    fn power_on(ceqs: usize) -> Self {
        Regs { ceqctl: vec![0; ceqs], ..Regs::default() }
    }
}

/// Last classification results, oldest overwritten first.
#[derive(Debug, Default)]
pub(super) struct ResultLog {
    entries: [Option<(Segment, ClassifyTarget, &'static str)>; RESULT_LOG_LEN],
    next: usize,
}

impl ResultLog {
    pub fn record(&mut self, seg: Segment, target: ClassifyTarget, source: &'static str) {
        self.entries[self.next] = Some((seg, target, source));
        self.next = (self.next + 1) % RESULT_LOG_LEN;
    }

    fn to_json(&self) -> Value {
        let order = (self.next..RESULT_LOG_LEN).chain(0..self.next);
        let items = order.filter_map(|i| self.entries[i].as_ref()).map(
            |(seg, target, source)| json!({"source": source, "segment": seg.to_json(), "result": target.to_json()}),
        );
        Value::Array(items.collect())
    }
}

/// Everything a register access or the worker's publish step needs, behind one lock never held over DMA.
pub(super) struct State {
    /// Bumped by reset/detach: work from an older epoch is dropped, never published.
    pub epoch: u64,
    pub regs: Regs,
    /// Published copies of the worker's CQP/CCQ, for register decisions and the dump.
    pub cqp: Option<Cqp>,
    pub ccq: Option<Ccq>,
    pub qhash: QhashTable,
    pub results: ResultLog,
}

pub(super) struct Shared {
    pub config: IrdmaConfig,
    pub state: Mutex<State>,
    /// Mirror of `State::epoch` for cheap checks between DMA accesses.
    pub epoch: AtomicU64,
    pub counters: Counters,
    pub dma: RwLock<Arc<dyn DmaAccess>>,
    pub irq: RwLock<Arc<dyn Interrupt>>,
    pub stop: AtomicBool,
    pub submitted: AtomicU64,
    pub completed: AtomicU64,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unpoison()
    }

    pub fn count_target(&self, target: &ClassifyTarget) {
        bump(match target {
            ClassifyTarget::ToHost => &self.counters.classify_to_host,
            ClassifyTarget::Established { .. } => &self.counters.classify_established,
            ClassifyTarget::Listener { .. } => &self.counters.classify_listener,
        });
    }
}

/// The irdma PCI function's engine.
pub struct Irdma {
    shared: Arc<Shared>,
    tx: Sender<Msg>,
    worker: Mutex<Option<JoinHandle<()>>>,
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
            submitted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
        });
        let (tx, rx) = bounded(WORK_QUEUE_DEPTH);
        let worker = Worker::new(shared.clone(), rx);
        let handle = std::thread::Builder::new().name("irdma-cqp".into()).spawn(move || worker.run());
        let handle = match handle {
            Ok(h) => Some(h),
            Err(e) => {
                // Without a worker every command stays pending; the driver sees its polls time out.
                tracing::error!("irdma: cannot start the worker thread: {e}");
                None
            }
        };
        Irdma { shared, tx, worker: Mutex::new(handle) }
    }

    /// Waits until the worker has handled every queued request. For tests and benchmarks.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.shared.completed.load(Relaxed) >= self.shared.submitted.load(Relaxed) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    pub fn counters(&self) -> Value {
        self.shared.counters.to_json()
    }

    /// Queues work for the worker; never blocks.
    fn submit(&self, st: &State, work: Work) -> bool {
        self.shared.submitted.fetch_add(1, Relaxed);
        if self.tx.try_send(Msg { epoch: st.epoch, work }).is_ok() {
            return true;
        }
        self.shared.submitted.fetch_sub(1, Relaxed);
        bump(&self.shared.counters.work_dropped);
        false
    }

    fn read_reg(&self, reg: Reg) -> u32 {
        let st = self.shared.lock();
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
        let mut st = self.shared.lock();
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
                    st.regs.cqperrcodes = errcodes(major, minor);
                    bump(&c.cqp_create_errors);
                } else {
                    st.regs.ccqpstatus = 0;
                    let ctx_pa = (u64::from(st.regs.ccqphigh) << 32) | u64::from(value);
                    if !self.submit(&st, Work::CqpCreate { ctx_pa }) {
                        let (major, minor) = CreateError::Busy.codes();
                        st.regs.ccqpstatus =
                            (IRDMA_CCQPSTATUS_CCQP_DONE.put(1) | IRDMA_CCQPSTATUS_CCQP_ERR.put(1)) as u32;
                        st.regs.cqperrcodes = errcodes(major, minor);
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

    fn dump(&self) -> Value {
        let st = self.shared.lock();
        let r = &st.regs;
        let hex = |v: u32| format!("{v:#010x}");
        json!({
            "engine": "irdma",
            "registers": {
                "CQPTAIL": hex(r.cqptail),
                "CQPDB": hex(r.cqpdb),
                "CCQPSTATUS": hex(r.ccqpstatus),
                "CCQPHIGH": hex(r.ccqphigh),
                "CCQPLOW": hex(r.ccqplow),
                "CQPERRCODES": hex(r.cqperrcodes),
                "GLINT_CEQCTL": r.ceqctl.iter().map(|v| hex(*v)).collect::<Vec<_>>(),
                "EMU_LB_STATUS": hex(r.lb_status),
                "EMU_LB_RESULT": hex(r.lb_result),
                "EMU_LB_SEQ": r.lb_seq,
            },
            "cqp": st.cqp.map(|c| c.to_json(r.cqpdb)),
            "ccq": st.ccq.map(|c| c.to_json()),
            "qhash": {
                "capacity": st.qhash.capacity(),
                "len": st.qhash.len(),
                "entries": st.qhash.to_json(),
            },
            "last_results": st.results.to_json(),
            "counters": self.shared.counters.to_json(),
        })
    }

    fn classify_cmd(&self, request: &Value) -> Result<Value, String> {
        let seg = Segment::from_json(request)?;
        let target = {
            let mut st = self.shared.lock();
            let target = classify(&st.qhash, &seg);
            st.results.record(seg, target, "control");
            target
        };
        self.shared.count_target(&target);
        Ok(target.to_json())
    }
}

pub(super) fn errcodes(major: u16, minor: u16) -> u32 {
    (IRDMA_CQPERRCODES_CQP_MAJOR_CODE.put(u64::from(major)) | IRDMA_CQPERRCODES_CQP_MINOR_CODE.put(u64::from(minor)))
        as u32
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
        if bar != 0 || offset % 4 != 0 {
            bump(&self.shared.counters.bad_mmio);
            return;
        }
        match Reg::decode(offset, usize::from(self.shared.config.msix_vectors)) {
            Some(reg) => self.write_reg(reg, u32::from_le_bytes(bytes)),
            None => bump(&self.shared.counters.unknown_writes),
        }
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
        let mut st = self.shared.lock();
        st.epoch += 1;
        self.shared.epoch.store(st.epoch, Relaxed);
        st.regs = Regs::power_on(usize::from(self.shared.config.msix_vectors));
        st.cqp = None;
        st.ccq = None;
        st.qhash.clear();
        st.results = ResultLog::default();
        self.shared.counters.clear();
        // Wakes the worker so it drops its CQP/CCQ now rather than at the next command.
        self.submit(&st, Work::Reset);
    }

    fn control(&self, request: &Value) -> Result<Value, String> {
        let cmd = request.get("cmd").and_then(Value::as_str).ok_or("request needs a string \"cmd\"")?;
        match cmd {
            "dump" => Ok(self.dump()),
            "counters" => Ok(self.shared.counters.to_json()),
            "reset" => {
                self.reset();
                Ok(json!({"ok": true}))
            }
            "classify" => self.classify_cmd(request),
            other => Err(format!("unknown irdma command {other:?} (dump, counters, reset, classify)")),
        }
    }
}

impl Drop for Irdma {
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        let _ = self.tx.try_send(Msg { epoch: u64::MAX, work: Work::Stop });
        let handle = self.worker.lock().unpoison().take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}
