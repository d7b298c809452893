//! What the hfi1 register path and its worker share: the receive engine behind one lock (never held across a
//! DMA access), the personality's [`Front`] (the loopback registers a driver polls, atomics; or the chip's other
//! blocks and its port), the reset epoch, and the DMA/IRQ handles.

#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::Duration;

use emu_abi::hfi1::{
    LB_DB_DONE, LB_DB_DROPPED, LB_DB_SUBMITTED, LB_DESC_ADDR, LB_DESC_DONE, LB_DESC_ERR, LB_DOORBELL, LB_LAST_RESULT,
};
use vfio_user_proto::dma::{DmaAccess, NoDma};
use vfio_user_proto::sync::Unpoison;

use super::cable::{CableEnd, Phy};
use super::counters::Counters;
use super::observe::HeldInject;
use super::rxe::batch::{Queued, Waiters};
use super::rxe::state::Rxe;
use super::wfr::Wfr;
use crate::engine::{Interrupt, NoInterrupt};
use crate::probe::Probe;

/// How long detach waits for the descriptor in flight, and a control inject for its result.
pub(super) const WORK_TIMEOUT: Duration = Duration::from_secs(2);

/// The registers a driver polls while the worker runs: atomics, never behind a lock a DMA path holds.
#[derive(Debug, Default)]
pub struct LbRegs {
    pub desc_addr: AtomicU64,
    pub db_done: AtomicU64,
    pub db_submitted: AtomicU64,
    pub desc_done: AtomicU64,
    pub desc_err: AtomicU64,
    pub last_result: AtomicU64,
    pub db_dropped: AtomicU64,
}

impl LbRegs {
    /// A register read; `None` for offsets in the block that hold nothing (they read as all-ones).
    pub fn read(&self, rel: u64) -> Option<u64> {
        let reg = match rel {
            LB_DESC_ADDR => &self.desc_addr,
            LB_DOORBELL => return Some(0),
            LB_DB_DONE => &self.db_done,
            LB_DB_SUBMITTED => &self.db_submitted,
            LB_DESC_DONE => &self.desc_done,
            LB_DESC_ERR => &self.desc_err,
            LB_LAST_RESULT => &self.last_result,
            LB_DB_DROPPED => &self.db_dropped,
            _ => return None,
        };
        Some(reg.load(Ordering::Acquire))
    }

    pub fn reset(&self) {
        for r in [
            &self.desc_addr,
            &self.db_done,
            &self.db_submitted,
            &self.desc_done,
            &self.desc_err,
            &self.last_result,
            &self.db_dropped,
        ] {
            r.store(0, Ordering::Release);
        }
    }
}

/// The function's front: what one personality has beside the receive engine both share. Code that needs the
/// chip matches here once and passes the [`WfrFront`] down; a loopback function holds no chip state.
pub(super) enum Front {
    /// The project's function (1b36:1100): the loopback send block's registers.
    Loopback(LbRegs),
    /// The real chip (8086:24f0): its blocks outside the RXE and its port. Shared with the port the cable calls.
    Wfr(Arc<WfrFront>),
}

/// The chip personality's state beside the RXE: its other blocks, its cable and the port's queues.
pub(super) struct WfrFront {
    /// Lock order: `Shared::rxe`, then this.
    wfr: Mutex<Wfr>,
    /// The cable, once connected.
    pub(super) cable: OnceLock<CableEnd>,
    /// Packets from the cable waiting for the worker (bounded: `ingress::INGRESS_QUEUE`).
    pub(super) ingress: Mutex<VecDeque<Queued>>,
    /// The control socket's batches waiting for the driver (bounded: `batch::BATCH_WAITERS`).
    pub(super) batches: Waiters,
    /// The packet at the head of `ingress` waits for room in its context.
    pub(super) ingress_held: AtomicBool,
    /// An ingress or egress job is queued.
    pub(super) ingress_kicked: AtomicBool,
    pub(super) egress_kicked: AtomicBool,
    /// An SDMA job is queued, a bit per engine.
    pub(super) sdma_kicked: AtomicU32,
}

impl WfrFront {
    pub(super) fn new(wfr: Wfr) -> Self {
        WfrFront {
            wfr: Mutex::new(wfr),
            cable: OnceLock::new(),
            ingress: Mutex::new(VecDeque::new()),
            batches: Waiters::default(),
            ingress_held: AtomicBool::new(false),
            ingress_kicked: AtomicBool::new(false),
            egress_kicked: AtomicBool::new(false),
            sdma_kicked: AtomicU32::new(0),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Wfr> {
        self.wfr.lock().unpoison()
    }

    /// Power-on state of the chip's blocks and the port's queue (call under the RXE lock, after the epoch
    /// moved: a waiting batch wakes to its end); the link loss to tell the cable.
    fn reset(&self) -> Option<Phy> {
        let signal = self.lock().reset();
        self.ingress.lock().unpoison().clear();
        self.ingress_held.store(false, Ordering::Release);
        self.batches.nudge_all();
        signal
    }

    /// Passes the port's physical news to the cable (call without locks: the cable may take a moment).
    pub(super) fn tell_cable(&self, signal: Option<Phy>) {
        if let (Some(phy), Some(end)) = (signal, self.cable.get()) {
            end.phy(phy);
        }
    }
}

/// State shared by the register path and the worker.
pub(super) struct Shared {
    /// The receive engine, both personalities.
    pub(super) rxe: Mutex<Rxe>,
    pub(super) front: Front,
    /// Traces and faults of this device (shared with its PCI function).
    pub probe: Arc<Probe>,
    /// An injected packet `packet-reorder` holds back until the next inject.
    pub(super) held_inject: Mutex<Option<HeldInject>>,
    pub counters: Counters,
    /// Bumped (under the RXE lock) by every reset and detach; work from an older epoch is dropped.
    pub(super) epoch: AtomicU64,
    pub(super) dma: RwLock<Arc<dyn DmaAccess>>,
    pub(super) irq: RwLock<Arc<dyn Interrupt>>,
}

impl Shared {
    pub(super) fn new(rxe: Rxe, front: Front, probe: Arc<Probe>) -> Self {
        Shared {
            rxe: Mutex::new(rxe),
            front,
            probe,
            held_inject: Mutex::new(None),
            counters: Counters::default(),
            epoch: AtomicU64::new(0),
            dma: RwLock::new(Arc::new(NoDma)),
            irq: RwLock::new(Arc::new(NoInterrupt)),
        }
    }

    pub fn lock_rxe(&self) -> MutexGuard<'_, Rxe> {
        self.rxe.lock().unpoison()
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Whether work of `epoch` may still run.
    pub fn current(&self, epoch: u64) -> bool {
        self.epoch() == epoch
    }

    /// Runs `f` (a result landing in registers a driver polls) unless a reset came since `epoch` (checked
    /// under the RXE lock, which resets take, so a result never lands in freshly reset registers).
    pub fn publish(&self, epoch: u64, f: impl FnOnce()) -> bool {
        let _rxe = self.lock_rxe();
        if !self.current(epoch) {
            return false;
        }
        f();
        true
    }

    pub fn raise(&self, vector: u16) {
        let irq = Arc::clone(&self.irq.read().unpoison());
        irq.raise(vector);
    }

    pub(super) fn dma(&self) -> Arc<dyn DmaAccess> {
        Arc::clone(&self.dma.read().unpoison())
    }

    /// Power-on state; in-flight and queued work of the old epoch is abandoned, and a link the port held
    /// drops.
    pub(super) fn reset(&self) {
        let signal = {
            let mut rxe = self.lock_rxe();
            self.epoch.fetch_add(1, Ordering::SeqCst);
            rxe.reset();
            self.counters.reset();
            self.held_inject.lock().unpoison().take();
            match &self.front {
                Front::Loopback(lb) => {
                    lb.reset();
                    None
                }
                Front::Wfr(front) => front.reset().map(|signal| (front, signal)),
            }
        };
        if let Some((front, signal)) = signal {
            front.tell_cable(Some(signal));
        }
    }

    /// Logs an input from outside the device (the cable's packets and link events) in the session being
    /// recorded, as the control request that reproduces it and its reply. The request is built only while a
    /// session records: a packet's hex costs more than the rest of its way through the port.
    pub(super) fn record_input(&self, request: impl FnOnce() -> serde_json::Value, result: serde_json::Value) {
        let Some(session) = self.probe.recorder().and_then(|r| r.current()) else { return };
        let mut request = request();
        request["device"] = self.probe.device().into();
        let id = session.control_request(&request.to_string());
        session.control_reply(id, &serde_json::json!({"ok": true, "result": result}).to_string());
    }
}
