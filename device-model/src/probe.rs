//! What observes and perturbs one device: its trace switches, its armed faults, and the session recording
//! or replay its engine reports shared-memory reads and its own steps to. Engines and their PCI function
//! share one `Probe`.

#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use vfio_user_proto::record::{Recorder, Session};
use vfio_user_proto::sync::Unpoison;

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

/// How long a device step waits for a replay to reach it before it goes ahead (the replay has diverged).
const STEP_WAIT: Duration = Duration::from_secs(5);

/// A replay's hold on the device's own steps: the k-th may begin once the replay reached the k-th recorded.
#[derive(Debug, Default)]
struct StepGate {
    allowed: u64,
    begun: u64,
    done: u64,
    /// Client accesses the replayed device handled.
    accesses: u64,
    /// Steps that went ahead without the replay (it had no more, or waited too long).
    overran: u64,
}

pub struct Probe {
    pub trace: Tracer,
    pub faults: Faults,
    /// Set once, before the device is served; the hooks ask it whether it records (an atomic) on every access.
    recorder: OnceLock<Arc<Recorder>>,
    replay: Mutex<Option<SharedReplay>>,
    steps: Mutex<Option<StepGate>>,
    steps_changed: Condvar,
    /// Set while a replay or a step gate is attached: the hooks' first check.
    gated: AtomicBool,
    /// Jobs of the device's worker whose handler panicked; from the first on the device is dead
    /// (`crate::worker`, docs/decisions.md).
    worker_panics: AtomicU64,
}

impl Probe {
    pub fn new(device: &'static str) -> Arc<Probe> {
        Arc::new(Probe {
            trace: Tracer::new(device),
            faults: Faults::default(),
            recorder: OnceLock::new(),
            replay: Mutex::new(None),
            steps: Mutex::new(None),
            steps_changed: Condvar::new(),
            gated: AtomicBool::new(false),
            worker_panics: AtomicU64::new(0),
        })
    }

    /// A job of the device's worker panicked: the device is dead from now on, until the process restarts.
    /// Its PCI function then answers as a removed one (all-ones, writes dropped, no DMA, no interrupts).
    pub fn worker_panicked(&self) {
        self.worker_panics.fetch_add(1, Ordering::AcqRel);
    }

    /// Jobs of the device's worker that panicked.
    pub fn worker_panics(&self) -> u64 {
        self.worker_panics.load(Ordering::Acquire)
    }

    /// Whether the device is dead (a worker job panicked).
    #[inline]
    pub fn dead(&self) -> bool {
        self.worker_panics() != 0
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
    /// current session). A probe has one recorder for its life: false, and `recorder` unused, if it has one.
    #[must_use]
    pub fn set_recorder(&self, recorder: Arc<Recorder>) -> bool {
        self.recorder.set(recorder).is_ok()
    }

    fn rehook(&self) {
        let gated = self.replay.lock().unpoison().is_some() || self.steps.lock().unpoison().is_some();
        self.gated.store(gated, Ordering::Release);
    }

    pub fn recorder(&self) -> Option<Arc<Recorder>> {
        self.recorder.get().cloned()
    }

    /// The session being recorded, if any: two atomic loads while none is (`Recorder::current` looks at its
    /// flag before its lock).
    fn recording(&self) -> Option<Arc<Session>> {
        self.recorder.get()?.current()
    }

    /// Shared-memory takes come from `replay` instead of memory, from now on.
    pub fn set_replay(&self, replay: Option<SharedReplay>) {
        *self.replay.lock().unpoison() = replay;
        self.rehook();
    }

    /// What is left of the replay source (for the replay's report).
    pub fn take_replay(&self) -> Option<SharedReplay> {
        let left = self.replay.lock().unpoison().take();
        self.rehook();
        left
    }

    /// The device took `actual` from client-written shared memory at (`region`, `offset`): logged when
    /// recording; under a replay the recorded value replaces it.
    pub fn shared_take(&self, region: u32, offset: u64, actual: u64) -> u64 {
        if self.gated.load(Ordering::Acquire) {
            if let Some(replay) = self.replay.lock().unpoison().as_mut() {
                return match replay.takes.get_mut(&(region, offset)).and_then(VecDeque::pop_front) {
                    Some(d) => d.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes),
                    None => {
                        replay.missing += 1;
                        0
                    }
                };
            }
        }
        if let Some(s) = self.recording() {
            s.shared_read(region, offset, &actual.to_le_bytes());
        }
        actual
    }

    /// The device is about to publish work of its own (a worker's result, an interrupt); called before it
    /// takes the lock its registers are read under. Under a replay of a recording that has its steps, waits
    /// until the replay has reached this one.
    pub fn step_begin(&self) {
        if !self.gated.load(Ordering::Acquire) {
            return;
        }
        let mut steps = self.steps.lock().unpoison();
        let until = Instant::now() + STEP_WAIT;
        loop {
            let held = steps.as_ref().is_some_and(|g| g.begun >= g.allowed);
            let left = until.saturating_duration_since(Instant::now());
            if !held || left.is_zero() {
                break;
            }
            steps = self.steps_changed.wait_timeout(steps, left).unpoison().0;
        }
        if let Some(g) = steps.as_mut() {
            if g.begun >= g.allowed {
                g.overran += 1;
            }
            g.begun += 1;
        }
    }

    /// The step is published; called under the lock its registers are read under, so that a recording has
    /// it between the accesses that saw the state before and those that saw it after.
    pub fn step_done(&self) {
        self.note(|g| g.done += 1, |s| s.device_step());
    }

    /// The device handled a client access (a register read or write, a reset); called under the lock its
    /// registers are accessed under. Recorded after the message it handled, or counted by a replay.
    pub fn device_access(&self) {
        self.note(|g| g.accesses += 1, |s| s.device_access());
    }

    /// Counts an event on a replay's gate, or else hands it to the recording session; nothing while
    /// neither is attached.
    fn note(&self, count: impl FnOnce(&mut StepGate), record: impl FnOnce(&Session)) {
        if self.gated.load(Ordering::Acquire) {
            if let Some(g) = self.steps.lock().unpoison().as_mut() {
                count(g);
                self.steps_changed.notify_all();
                return;
            }
        }
        if let Some(s) = self.recording() {
            record(&s);
        }
    }

    /// Waits up to `wait` until the replayed device has handled `n` client accesses; false if it has not.
    pub fn wait_accesses(&self, n: u64, wait: Duration) -> bool {
        let mut steps = self.steps.lock().unpoison();
        let until = Instant::now() + wait;
        while steps.as_ref().is_some_and(|g| g.accesses < n) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            steps = self.steps_changed.wait_timeout(steps, left).unpoison().0;
        }
        true
    }

    /// From now on (`on`) the device's steps wait for [`Probe::allow_step`]; off lets them all go.
    pub fn set_step_gate(&self, on: bool) {
        *self.steps.lock().unpoison() = on.then(StepGate::default);
        self.steps_changed.notify_all();
        self.rehook();
    }

    /// Lets the device make its next step and waits up to `wait` until it has; false if it did not.
    pub fn allow_step(&self, wait: Duration) -> bool {
        let mut steps = self.steps.lock().unpoison();
        let Some(g) = steps.as_mut() else { return true };
        g.allowed += 1;
        let want = g.allowed;
        self.steps_changed.notify_all();
        let until = Instant::now() + wait;
        while steps.as_ref().is_some_and(|g| g.done < want) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            steps = self.steps_changed.wait_timeout(steps, left).unpoison().0;
        }
        true
    }

    /// Steps the device made beyond those the replay allowed.
    pub fn steps_overran(&self) -> u64 {
        self.steps.lock().unpoison().as_ref().map_or(0, |g| g.overran)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_user_proto::record::{Record, RecordingReader};

    #[test]
    fn a_probe_keeps_its_first_recorder_and_records_only_while_it_has_a_session() {
        let dir = std::env::temp_dir().join(format!("probe-recorder-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let probe = Probe::new("hfi1");
        let rec = Recorder::idle("hfi1", serde_json::json!({}));
        assert!(probe.set_recorder(rec.clone()));
        assert!(!probe.set_recorder(Recorder::idle("other", serde_json::json!({}))), "the first recorder stays");
        assert!(probe.recorder().is_some_and(|r| Arc::ptr_eq(&r, &rec)));
        // Idle: the device takes what memory holds, and nothing is kept.
        assert_eq!(probe.shared_take(2, 8, 7), 7);
        probe.device_access();
        probe.step_done();
        rec.set_dir(Some(&dir)).unwrap_or_else(|e| panic!("set_dir: {e}"));
        let session = rec.begin().unwrap_or_else(|e| panic!("begin: {e}")).unwrap_or_else(|| panic!("no session"));
        assert_eq!(probe.shared_take(2, 8, 9), 9);
        probe.device_access();
        probe.step_done();
        rec.end();
        probe.device_access();
        let file = std::fs::File::open(session.path()).unwrap_or_else(|e| panic!("open: {e}"));
        let reader = RecordingReader::new(std::io::BufReader::new(file)).unwrap_or_else(|e| panic!("reader: {e}"));
        let (_, records, _) = reader.records().unwrap_or_else(|e| panic!("records: {e}"));
        assert_eq!(
            records,
            [
                Record::SharedRead { region: 2, offset: 8, data: 9u64.to_le_bytes().to_vec() },
                Record::DeviceAccess,
                Record::DeviceStep,
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
