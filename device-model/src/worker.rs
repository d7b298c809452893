//! The engines' worker, one design for both: a thread per function fed by a bounded queue of jobs, each
//! stamped with the reset epoch it was submitted in.
//!
//! - The register path never blocks on it: a full queue refuses the job, and the engine counts that.
//! - The thread sleeps on its queue between jobs. On request (`WorkerMode::Thread`'s spin, `device-model
//!   --low-latency`) it polls briefly before sleeping, because a driver that waits for each completion rings
//!   again within microseconds and a futex wake-up costs more (docs/bench.md, the `spin` case).
//! - The handler gets the job with its epoch and drops work from before a reset; what it publishes it
//!   publishes under the engine's lock, and it never holds that lock across a DMA access
//!   (docs/architecture.md, "the deadlock rule").
//! - Dropping the queue stops the thread: queued jobs are dropped unrun, and the thread is joined.
//! - A handler that panics is caught (in both modes): the job is logged by its [`JobTag`], the device is dead
//!   from then on (`Probe::worker_panicked`: its PCI function answers as a removed one, all-ones), and the
//!   queue refuses later jobs and drops what it holds, each counted done, so nobody waits for them (an inject's
//!   reply channel closes with its job). Other devices keep their own queues and serve on. Under the fuzz
//!   harness libfuzzer-sys's panic hook aborts the process before anything unwinds, so a handler's panic is
//!   still the crash libFuzzer reports.
//!
//! [`WorkerMode::Inline`] runs the same jobs with no thread: the engine drains its queue on the thread of the
//! access that queued them, once that access has let go of the engine's locks ([`WorkQueue::run_queued`]).
//! Nothing is handed between threads, and a run is deterministic, which is what an in-process harness wants
//! (the `device_mmio` fuzz target). Only for DMA memory that answers without a reply from another thread:
//! served over vfio-user with message-backed memory, a job's DMA would wait for the very thread running it.

#![forbid(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use vfio_user_proto::sync::Unpoison;

use crate::probe::Probe;

/// How long `wait_idle` yields before it sleeps between checks: most jobs finish within microseconds.
const IDLE_YIELD: Duration = Duration::from_micros(200);

/// The idle spin `device-model --low-latency` gives the workers: on an idle host it made back-to-back small
/// doorbells 1.7-1.8x faster (the next doorbell finds the worker awake); it costs a core for that long after
/// every job, so it is an opt-in.
pub const LOW_LATENCY_SPIN: Duration = Duration::from_micros(50);

/// Where an engine's jobs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerMode {
    /// On the engine's own thread, which polls its queue for `spin` (yielding) before it sleeps; zero sleeps
    /// at once. What the device model serves with.
    Thread { spin: Duration },
    /// On the thread that queued them, after its register access (module docs). For in-process harnesses.
    Inline,
}

impl WorkerMode {
    /// The workers as `device-model --low-latency` runs them: a thread polling [`LOW_LATENCY_SPIN`] after each job.
    pub const LOW_LATENCY: WorkerMode = WorkerMode::Thread { spin: LOW_LATENCY_SPIN };
}

impl Default for WorkerMode {
    /// A thread that sleeps as soon as its queue is empty.
    fn default() -> Self {
        WorkerMode::Thread { spin: Duration::ZERO }
    }
}

type Handler<J> = Box<dyn FnMut(Stamped<J>) + Send>;

/// Inline mode's half of the queue: its receiving end, and the handler locked by whichever thread drains.
type InlineRunner<J> = (Receiver<Stamped<J>>, Mutex<Handler<J>>);

/// What a worker logs of a job whose handler panicked: its kind and one number (an engine, an address, a
/// length). Taken before the job runs, as the handler consumes the job; cheap, as every job pays it.
pub trait JobTag {
    fn tag(&self) -> (&'static str, u64);
}

/// A job and the reset epoch it was submitted in.
#[derive(Debug)]
pub struct Stamped<J> {
    pub epoch: u64,
    pub job: J,
}

#[derive(Default)]
struct Progress {
    stop: AtomicBool,
    submitted: AtomicU64,
    completed: AtomicU64,
    /// The epoch of the job running now, if any.
    running: Mutex<Option<u64>>,
    changed: Condvar,
    /// Set once a handler panicked: the queue refuses jobs and drops those it holds.
    failed: AtomicBool,
}

/// Who a queue's jobs work for, for the log of a panic and the dead device.
struct Owner {
    name: String,
    probe: Arc<Probe>,
}

impl Progress {
    fn set_running(&self, epoch: Option<u64>) {
        *self.running.lock().unpoison() = epoch;
        self.changed.notify_all();
    }

    fn run<J: JobTag>(&self, owner: &Owner, job: Stamped<J>, handler: &mut dyn FnMut(Stamped<J>)) {
        if self.failed.load(Ordering::Acquire) {
            drop(job);
            self.completed.fetch_add(1, Ordering::AcqRel);
            return;
        }
        let (kind, arg) = job.job.tag();
        self.set_running(Some(job.epoch));
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| handler(job))) {
            self.failed.store(true, Ordering::Release);
            owner.probe.worker_panicked();
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(
                worker = owner.name,
                device = owner.probe.device(),
                job = kind,
                arg,
                "a job's handler panicked ({what}): the device is dead until the process restarts"
            );
        }
        self.set_running(None);
        self.completed.fetch_add(1, Ordering::AcqRel);
    }
}

/// One engine's worker thread (or inline runner) and its queue.
pub struct WorkQueue<J> {
    tx: Option<Sender<Stamped<J>>>,
    thread: Option<JoinHandle<()>>,
    inline: Option<InlineRunner<J>>,
    progress: Arc<Progress>,
    owner: Arc<Owner>,
}

impl<J: JobTag + Send + 'static> WorkQueue<J> {
    /// A queue of `depth` jobs of the device `probe` observes, each handed to `handler`: on the thread `name`
    /// or, inline, by [`run_queued`](Self::run_queued).
    pub fn spawn(
        name: &str,
        depth: usize,
        mode: WorkerMode,
        probe: Arc<Probe>,
        mut handler: impl FnMut(Stamped<J>) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::bounded::<Stamped<J>>(depth.max(1));
        let progress = Arc::new(Progress::default());
        let owner = Arc::new(Owner { name: name.into(), probe });
        let spin = match mode {
            WorkerMode::Thread { spin } => spin,
            WorkerMode::Inline => {
                let inline = Some((rx, Mutex::new(Box::new(handler) as Handler<J>)));
                return Ok(Self { tx: Some(tx), thread: None, inline, progress, owner });
            }
        };
        let (p, o) = (Arc::clone(&progress), Arc::clone(&owner));
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            while let Some(job) = next(&rx, spin) {
                if p.stop.load(Ordering::Acquire) {
                    break;
                }
                p.run(&o, job, &mut handler);
            }
        })?;
        Ok(Self { tx: Some(tx), thread: Some(thread), inline: None, progress, owner })
    }

    /// Whether a job's handler panicked: the queue refuses jobs from then on.
    pub fn failed(&self) -> bool {
        self.progress.failed.load(Ordering::Acquire)
    }

    /// Inline mode: runs every queued job on this thread, in order; a no-op for a threaded queue. The caller
    /// holds none of the engine's locks. If another thread is draining, that thread runs them; a job queued
    /// while this one finishes is not left behind (the queue is checked again after letting go).
    pub fn run_queued(&self) {
        let Some((rx, handler)) = &self.inline else { return };
        while !rx.is_empty() {
            let mut h = match handler.try_lock() {
                Ok(h) => h,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            };
            while let Ok(job) = rx.try_recv() {
                if self.progress.stop.load(Ordering::Acquire) {
                    return;
                }
                self.progress.run(&self.owner, job, &mut *h);
            }
        }
    }

    /// Queues `job` without waiting; false (nothing queued) when the queue is full or the worker is gone.
    pub fn try_submit(&self, epoch: u64, job: J) -> bool {
        self.submit_with(|tx, msg| tx.try_send(msg).is_ok(), epoch, job)
    }

    /// Queues `job`, waiting up to `timeout` for room (a control request may wait; a register access never).
    pub fn submit_timeout(&self, epoch: u64, job: J, timeout: Duration) -> bool {
        self.submit_with(|tx, msg| tx.send_timeout(msg, timeout).is_ok(), epoch, job)
    }

    fn submit_with(&self, send: impl FnOnce(&Sender<Stamped<J>>, Stamped<J>) -> bool, epoch: u64, job: J) -> bool {
        let Some(tx) = &self.tx else { return false };
        if self.failed() {
            return false;
        }
        self.progress.submitted.fetch_add(1, Ordering::AcqRel);
        if send(tx, Stamped { epoch, job }) {
            return true;
        }
        self.progress.submitted.fetch_sub(1, Ordering::AcqRel);
        false
    }

    /// Whether every queued job has been handled (a job waiting for its DMA reply is not).
    pub fn idle(&self) -> bool {
        let p = &self.progress;
        p.completed.load(Ordering::Acquire) >= p.submitted.load(Ordering::Acquire)
    }

    /// Waits up to `timeout` until every queued job has been handled (inline: runs them first). For tests
    /// and benchmarks.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        self.run_queued();
        let deadline = Instant::now() + timeout;
        loop {
            let p = &self.progress;
            if p.completed.load(Ordering::Acquire) >= p.submitted.load(Ordering::Acquire) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            // Most jobs finish within microseconds: yield for a short while before sleeping.
            if deadline.saturating_duration_since(Instant::now()) + IDLE_YIELD > timeout {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Waits up to `timeout` until no job of `epoch` or older runs (after a reset, before the engine lets go
    /// of what that job may still touch).
    pub fn wait_not_running(&self, epoch: u64, timeout: Duration) -> bool {
        let running = self.progress.running.lock().unpoison();
        let (_r, res) =
            self.progress.changed.wait_timeout_while(running, timeout, |r| r.is_some_and(|e| e <= epoch)).unpoison();
        !res.timed_out()
    }
}

impl<J> Drop for WorkQueue<J> {
    fn drop(&mut self) {
        self.progress.stop.store(true, Ordering::Release);
        // With the only sender gone the thread's receive ends once the queue is drained of dropped jobs.
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The next job: polled (yielding) for up to `spin`, then waited for; `None` once the queue is closed.
fn next<J>(rx: &Receiver<J>, spin: Duration) -> Option<J> {
    if !spin.is_zero() {
        let start = Instant::now();
        while start.elapsed() < spin {
            match rx.try_recv() {
                Ok(job) => return Some(job),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => std::thread::yield_now(),
            }
        }
    }
    rx.recv().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A guard against hanging, not a measure: each wait below ends on its event within milliseconds.
    const HANG_GUARD: Duration = Duration::from_secs(30);

    impl JobTag for u32 {
        fn tag(&self) -> (&'static str, u64) {
            ("test", u64::from(*self))
        }
    }

    fn probe() -> Arc<Probe> {
        Probe::new("test")
    }

    #[test]
    fn jobs_run_in_order_with_their_epochs_and_the_queue_reports_idle() {
        let (seen_tx, seen) = mpsc::channel();
        let q = WorkQueue::spawn(
            "t",
            8,
            WorkerMode::Thread { spin: Duration::from_micros(10) },
            probe(),
            move |s: Stamped<u32>| {
                let _ = seen_tx.send((s.epoch, s.job));
            },
        )
        .unwrap();
        for (epoch, job) in [(0, 1), (0, 2), (1, 3)] {
            assert!(q.try_submit(epoch, job));
        }
        assert!(q.wait_idle(Duration::from_secs(5)));
        assert_eq!(seen.try_iter().collect::<Vec<_>>(), vec![(0, 1), (0, 2), (1, 3)]);
    }

    #[test]
    fn inline_jobs_run_at_run_queued_on_the_callers_thread_in_order() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        let q = WorkQueue::spawn("t", 8, WorkerMode::Inline, probe(), move |j: Stamped<u32>| {
            s.lock().unpoison().push((j.epoch, j.job, std::thread::current().id()));
        })
        .unwrap();
        assert!(q.try_submit(0, 1) && q.try_submit(1, 2));
        assert!(seen.lock().unpoison().is_empty(), "queued, not run: the caller may still hold an engine lock");
        assert!(!q.idle());
        q.run_queued();
        let me = std::thread::current().id();
        assert_eq!(*seen.lock().unpoison(), vec![(0, 1, me), (1, 2, me)]);
        assert!(q.idle());
        // wait_idle runs what is queued, so a harness that only waits is never left with work pending.
        assert!(q.try_submit(2, 3));
        assert!(q.wait_idle(Duration::ZERO));
        assert_eq!(seen.lock().unpoison().len(), 3);
    }

    #[test]
    fn inline_a_full_queue_refuses_like_a_threaded_one() {
        let q = WorkQueue::spawn("t", 1, WorkerMode::Inline, probe(), |_: Stamped<u32>| {}).unwrap();
        assert!(q.try_submit(0, 1));
        assert!(!q.try_submit(0, 2));
        q.run_queued();
        assert!(q.try_submit(0, 3));
    }

    #[test]
    fn inline_a_second_thread_leaves_its_job_to_the_thread_already_draining() {
        let (started_tx, started) = mpsc::channel::<()>();
        let (release_tx, release) = mpsc::channel::<()>();
        let release = Mutex::new(release);
        let ran = Arc::new(Mutex::new(Vec::new()));
        let r = Arc::clone(&ran);
        let q = Arc::new(
            WorkQueue::spawn("t", 8, WorkerMode::Inline, probe(), move |j: Stamped<u32>| {
                r.lock().unpoison().push((j.job, std::thread::current().id()));
                if j.job == 1 {
                    let _ = started_tx.send(());
                    let _ = release.lock().unpoison().recv_timeout(HANG_GUARD);
                }
            })
            .unwrap(),
        );
        let q1 = Arc::clone(&q);
        let drainer = std::thread::spawn(move || {
            assert!(q1.try_submit(0, 1));
            q1.run_queued();
            std::thread::current().id()
        });
        started.recv_timeout(HANG_GUARD).unwrap();
        assert!(q.try_submit(0, 2));
        // Job 1 holds the drainer until released below: had run_queued waited for it, it would return only
        // at the hang guard, with job 2 run by then.
        q.run_queued();
        assert_eq!(ran.lock().unpoison().len(), 1, "job 2 waits for the drainer, not run twice or here");
        let _ = release_tx.send(());
        let other = drainer.join().unwrap();
        assert_eq!(*ran.lock().unpoison(), vec![(1, other), (2, other)]);
        assert!(q.idle());
    }

    #[test]
    fn a_full_queue_refuses_without_blocking_and_drop_stops_a_busy_worker() {
        let (started_tx, started) = mpsc::channel::<()>();
        let (release_tx, release) = mpsc::channel::<()>();
        let release = Mutex::new(release);
        let ran = Arc::new(Mutex::new(Vec::new()));
        let r = Arc::clone(&ran);
        let q =
            WorkQueue::spawn("t", 1, WorkerMode::Thread { spin: Duration::ZERO }, probe(), move |j: Stamped<u32>| {
                r.lock().unpoison().push(j.job);
                let _ = started_tx.send(());
                let _ = release.lock().unpoison().recv_timeout(HANG_GUARD);
            })
            .unwrap();
        assert!(q.try_submit(7, 1));
        started.recv_timeout(HANG_GUARD).unwrap();
        // Job 1 runs (epoch 7) until released: one more fits the queue of one, the next is refused. Had the
        // refusal waited for room, it would have come only at the hang guard, and been a success.
        assert!(!q.wait_not_running(7, Duration::ZERO));
        assert!(q.try_submit(7, 2));
        assert!(!q.try_submit(7, 3));
        // Dropping the queue stops the worker: job 1 is let go once the stop is set, the queued job 2 is dropped
        // unrun, and the thread is joined.
        let progress = Arc::clone(&q.progress);
        let dropper = std::thread::spawn(move || drop(q));
        let deadline = Instant::now() + HANG_GUARD;
        while !progress.stop.load(Ordering::Acquire) {
            assert!(Instant::now() < deadline, "drop never stopped the worker");
            std::thread::yield_now();
        }
        let _ = release_tx.send(());
        dropper.join().unwrap();
        assert_eq!(*ran.lock().unpoison(), vec![1], "the queued job was dropped, not run");
    }

    /// A job that panics when it is 13; the others report (job, epoch) on `seen`, and an inject-like job 14
    /// holds a reply channel the caller waits on.
    enum Test {
        Plain(u32),
        Reply(crossbeam_channel::Sender<u32>),
    }

    impl JobTag for Test {
        fn tag(&self) -> (&'static str, u64) {
            match self {
                Test::Plain(n) => ("plain", u64::from(*n)),
                Test::Reply(_) => ("reply", 0),
            }
        }
    }

    #[test]
    fn a_panicking_handler_kills_its_device_refuses_later_jobs_and_leaves_the_others_serving() {
        for mode in [WorkerMode::Thread { spin: Duration::ZERO }, WorkerMode::Inline] {
            let (seen_tx, seen) = crossbeam_channel::unbounded();
            let handler = move |s: Stamped<Test>| match s.job {
                Test::Plain(13) => panic!("job 13"),
                Test::Plain(n) => {
                    let _ = seen_tx.send(n);
                }
                Test::Reply(reply) => {
                    let _ = reply.send(0);
                }
            };
            let (dead, alive) = (probe(), probe());
            let q = WorkQueue::spawn("dies", 8, mode, Arc::clone(&dead), handler.clone()).unwrap();
            let other = WorkQueue::spawn("lives", 8, mode, Arc::clone(&alive), handler).unwrap();
            // The panicking job, then one queued behind it with a reply the caller waits for.
            let (reply, answer) = crossbeam_channel::bounded(1);
            assert!(q.try_submit(0, Test::Plain(1)) && q.try_submit(0, Test::Plain(13)));
            assert!(q.try_submit(0, Test::Reply(reply)), "{mode:?}");
            assert!(q.wait_idle(HANG_GUARD), "{mode:?}: wait_idle returns");
            assert_eq!(seen.try_iter().collect::<Vec<_>>(), vec![1], "{mode:?}");
            // The waiting caller is told at once: the job behind the panic was dropped with its reply channel.
            assert_eq!(answer.recv_timeout(HANG_GUARD), Err(crossbeam_channel::RecvTimeoutError::Disconnected));
            assert!(q.failed() && dead.dead() && dead.worker_panics() == 1, "{mode:?}: the device is dead");
            assert!(!q.try_submit(0, Test::Plain(2)), "{mode:?}: later jobs are refused");
            assert!(!q.submit_timeout(0, Test::Plain(3), HANG_GUARD), "{mode:?}: without waiting");
            assert!(q.idle() && q.wait_idle(HANG_GUARD) && q.wait_not_running(u64::MAX, HANG_GUARD));
            // Another device's queue serves on.
            assert!(other.try_submit(0, Test::Plain(4)) && other.wait_idle(HANG_GUARD));
            assert_eq!(seen.try_iter().collect::<Vec<_>>(), vec![4], "{mode:?}");
            assert!(!other.failed() && !alive.dead());
        }
    }
}
