//! What the irdma register path and its worker share: the register file and published CQP/CCQ copies behind
//! one lock that no DMA path holds, the reset epoch, the counters, and the DMA/IRQ handles.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use serde_json::{json, Value};
use vfio_user_proto::dma::DmaAccess;
use vfio_user_proto::sync::Unpoison;

use super::ccq::Ccq;
use super::classify::{ClassifyTarget, Segment, SegmentJson};
use super::cqp::Cqp;
use super::qhash::QhashTable;
use super::IrdmaConfig;
use crate::engine::Interrupt;
use crate::probe::Probe;

/// Classification results kept for the dump.
pub const RESULT_LOG_LEN: usize = 16;

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// Event counters, all reset by a function reset.
        #[derive(Debug, Default)]
        pub struct Counters { $(pub $name: AtomicU64,)* }
        impl Counters {
            pub fn to_json(&self) -> Value {
                static ORDER: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
                crate::counter_json::to_json(&[$((stringify!($name), self.$name.load(Relaxed)),)*], &ORDER)
            }
            pub(super) fn clear(&self) { $(self.$name.store(0, Relaxed);)* }
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
    pub(super) fn power_on(ceqs: usize) -> Self {
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

    pub(super) fn to_json(&self) -> Value {
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
    /// Traces and faults of this device (shared with its PCI function).
    pub probe: Arc<Probe>,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unpoison()
    }

    /// The lock for a client's access (a register read or write, a reset), reported under it so that a
    /// recording orders it with the worker's steps (docs/observe.md, "Record and replay").
    pub fn access(&self) -> MutexGuard<'_, State> {
        let st = self.lock();
        self.probe.device_access();
        st
    }

    pub fn count_target(&self, target: &ClassifyTarget) {
        bump(match target {
            ClassifyTarget::ToHost => &self.counters.classify_to_host,
            ClassifyTarget::Established { .. } => &self.counters.classify_established,
            ClassifyTarget::Listener { .. } => &self.counters.classify_listener,
        });
    }
}
