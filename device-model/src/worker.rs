//! The engines' worker, one design for both: a thread per function fed by a bounded queue of jobs, each
//! stamped with the reset epoch it was submitted in.
//!
//! - The register path never blocks on it: a full queue refuses the job, and the engine counts that.
//! - The thread polls briefly before sleeping, because a driver that waits for each completion rings again
//!   within microseconds and a futex wake-up costs more (`worker_spin`, docs/bench.md).
//! - The handler gets the job with its epoch and drops work from before a reset; what it publishes it
//!   publishes under the engine's lock, and it never holds that lock across a DMA access
//!   (docs/architecture.md, "the deadlock rule").
//! - Dropping the queue stops the thread: queued jobs are dropped unrun, and the thread is joined.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use vfio_user_proto::sync::Unpoison;

/// How long `wait_idle` yields before it sleeps between checks: most jobs finish within microseconds.
const IDLE_YIELD: Duration = Duration::from_micros(200);

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
}

impl Progress {
    fn set_running(&self, epoch: Option<u64>) {
        *self.running.lock().unpoison() = epoch;
        self.changed.notify_all();
    }
}

/// One engine's worker thread and its queue.
pub struct WorkQueue<J> {
    tx: Option<Sender<Stamped<J>>>,
    thread: Option<JoinHandle<()>>,
    progress: Arc<Progress>,
}

impl<J: Send + 'static> WorkQueue<J> {
    /// Starts the thread `name` with a queue of `depth` jobs, each handed to `handler`.
    pub fn spawn(
        name: &str,
        depth: usize,
        spin: Duration,
        mut handler: impl FnMut(Stamped<J>) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::bounded::<Stamped<J>>(depth.max(1));
        let progress = Arc::new(Progress::default());
        let p = Arc::clone(&progress);
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            while let Some(job) = next(&rx, spin) {
                if p.stop.load(Ordering::Acquire) {
                    break;
                }
                p.set_running(Some(job.epoch));
                handler(job);
                p.set_running(None);
                p.completed.fetch_add(1, Ordering::AcqRel);
            }
        })?;
        Ok(Self { tx: Some(tx), thread: Some(thread), progress })
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

    /// Waits up to `timeout` until every queued job has been handled. For tests and benchmarks.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
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

    #[test]
    fn jobs_run_in_order_with_their_epochs_and_the_queue_reports_idle() {
        let (seen_tx, seen) = mpsc::channel();
        let q = WorkQueue::spawn("t", 8, Duration::from_micros(10), move |s: Stamped<u32>| {
            let _ = seen_tx.send((s.epoch, s.job));
        })
        .unwrap();
        for (epoch, job) in [(0, 1), (0, 2), (1, 3)] {
            assert!(q.try_submit(epoch, job));
        }
        assert!(q.wait_idle(Duration::from_secs(5)));
        assert_eq!(seen.try_iter().collect::<Vec<_>>(), vec![(0, 1), (0, 2), (1, 3)]);
    }

    #[test]
    fn a_full_queue_refuses_without_blocking_and_drop_stops_a_busy_worker() {
        let (started_tx, started) = mpsc::channel::<()>();
        let (release_tx, release) = mpsc::channel::<()>();
        let release = Mutex::new(release);
        let q = WorkQueue::spawn("t", 1, Duration::ZERO, move |_: Stamped<u32>| {
            let _ = started_tx.send(());
            let _ = release.lock().unpoison().recv_timeout(Duration::from_secs(5));
        })
        .unwrap();
        assert!(q.try_submit(7, 1));
        started.recv_timeout(Duration::from_secs(5)).unwrap();
        // Job 1 runs (epoch 7): one more fits the queue of one, the next is refused at once.
        assert!(!q.wait_not_running(7, Duration::from_millis(20)));
        assert!(q.try_submit(7, 2));
        let start = Instant::now();
        assert!(!q.try_submit(7, 3));
        assert!(start.elapsed() < Duration::from_secs(1));
        let _ = release_tx.send(());
        drop(release_tx);
        // The queued job is dropped unrun; the thread is joined.
        drop(q);
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
