//! What observes and perturbs one device: its trace switches, its armed faults, and the session recording
//! or replay its engine reports shared-memory reads to. Engines and their PCI function share one `Probe`.

#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use vfio_user_proto::record::Recorder;

use crate::fault::{FaultKind, Faults, Fired, Params};
use crate::trace::{Block, Level, Tracer, Val};

/// What a replay hands the device instead of shared memory: per (region, offset), the values the recorded
/// device took, in order.
#[derive(Debug, Default)]
pub struct SharedReplay {
    takes: HashMap<(u32, u64), VecDeque<Vec<u8>>>,
    /// Takes the recording does not have: the replay diverged.
    missing: u64,
}

impl SharedReplay {
    pub fn push(&mut self, region: u32, offset: u64, data: Vec<u8>) {
        self.takes.entry((region, offset)).or_default().push_back(data);
    }
    /// Recorded takes the replayed device did not make.
    pub fn left(&self) -> usize {
        self.takes.values().map(VecDeque::len).sum()
    }
    pub fn missing(&self) -> u64 {
        self.missing
    }
}

pub struct Probe {
    pub trace: Tracer,
    pub faults: Faults,
    recorder: RwLock<Option<Arc<Recorder>>>,
    replay: Mutex<Option<SharedReplay>>,
    /// Set while a recorder or a replay wants shared-memory takes: the hook's one check otherwise.
    hooked: AtomicBool,
}

impl Probe {
    pub fn new(device: &'static str) -> Arc<Probe> {
        Arc::new(Probe {
            trace: Tracer::new(device),
            faults: Faults::default(),
            recorder: RwLock::new(None),
            replay: Mutex::new(None),
            hooked: AtomicBool::new(false),
        })
    }

    pub fn device(&self) -> &'static str {
        self.trace.device()
    }

    /// One event at a fault hook point: the fault that fires, if any, traced under `fault`.
    #[inline]
    pub fn fault(&self, kind: FaultKind, matches: impl Fn(&Params) -> bool) -> Option<Fired> {
        if !self.faults.armed(kind) {
            return None;
        }
        let fired = self.faults.hit(kind, matches)?;
        self.trace.event(
            Block::Fault,
            Level::Info,
            "fault",
            &[("fault", Val::Str(kind.name())), ("id", Val::Dec(fired.id)), ("event", Val::Dec(fired.event))],
        );
        Some(fired)
    }

    /// Sessions of this device are recorded by `recorder` (shared-memory reads and control commands go to its
    /// current session).
    pub fn set_recorder(&self, recorder: Option<Arc<Recorder>>) {
        *self.recorder.write().unwrap_or_else(|e| e.into_inner()) = recorder;
        self.rehook();
    }

    fn rehook(&self) {
        let hooked = self.recorder().is_some() || self.replay.lock().unwrap_or_else(|e| e.into_inner()).is_some();
        self.hooked.store(hooked, Ordering::Release);
    }

    pub fn recorder(&self) -> Option<Arc<Recorder>> {
        self.recorder.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Shared-memory takes come from `replay` instead of memory, from now on.
    pub fn set_replay(&self, replay: Option<SharedReplay>) {
        *self.replay.lock().unwrap_or_else(|e| e.into_inner()) = replay;
        self.rehook();
    }

    /// What is left of the replay source (for the replay's report).
    pub fn take_replay(&self) -> Option<SharedReplay> {
        let left = self.replay.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.rehook();
        left
    }

    /// The device took `actual` from client-written shared memory at (`region`, `offset`): logged when
    /// recording; under a replay the recorded value replaces it.
    pub fn shared_take(&self, region: u32, offset: u64, actual: u64) -> u64 {
        if !self.hooked.load(Ordering::Acquire) {
            return actual;
        }
        if let Some(replay) = self.replay.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            return match replay.takes.get_mut(&(region, offset)).and_then(VecDeque::pop_front) {
                Some(d) => d.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes),
                None => {
                    replay.missing += 1;
                    0
                }
            };
        }
        if let Some(s) = self.recorder().and_then(|r| r.current()) {
            s.shared_read(region, offset, &actual.to_le_bytes());
        }
        actual
    }
}
