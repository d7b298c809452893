//! One thread kept for the whole run to play a harness's other end (a scripted server, the server under
//! test's connection loop), instead of a thread started and joined per input.
//!
//! Starting a thread here costs a `clone3`, a guard page and a signal stack, and its exit an `munmap` that
//! flushes the other CPU's TLB by IPI: 10% of client_parse's time, for two threads per input.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use vfio_user_proto::sync::Unpoison;

type Job = Box<dyn FnOnce() + Send>;

/// The process's thread for a harness's other end, started on first use; `None` if it could not be. With
/// it the process has a second busy thread, which is when a heap trim's TLB flush costs an IPI: the heap
/// is set to keep freed memory first.
pub fn other_end() -> Option<&'static ReusedThread> {
    static T: OnceLock<Option<ReusedThread>> = OnceLock::new();
    T.get_or_init(|| {
        crate::heap::keep_freed_memory();
        ReusedThread::new("other-end")
    })
    .as_ref()
}

/// A thread that runs one job at a time, in order.
pub struct ReusedThread {
    jobs: Mutex<Sender<Job>>,
}

/// The result of a job still running, or done.
pub struct Running<T>(Receiver<T>);

impl ReusedThread {
    /// Starts the thread; `None` if the system refuses one.
    pub fn new(name: &str) -> Option<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            })
            .ok()?;
        Some(ReusedThread { jobs: Mutex::new(tx) })
    }

    /// Runs `f` on the thread once the jobs before it are done.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Running<T> {
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        // A send fails only if the thread is gone (a job panicked): the result's receiver then says so.
        let _ = self.jobs.lock().unpoison().send(job);
        Running(rx)
    }
}

impl<T> Running<T> {
    /// The job's result once it is done; `None` if it never will be (it panicked, or the thread is gone).
    pub fn wait(self) -> Option<T> {
        self.0.recv().ok()
    }

    /// The result if the job ends within `wait`: `Err(true)` while it still runs, `Err(false)` if it never
    /// will end.
    pub fn wait_for(&self, wait: Duration) -> Result<T, bool> {
        self.0.recv_timeout(wait).map_err(|e| e == RecvTimeoutError::Timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_in_order_on_one_thread_and_return_their_results() {
        let t = ReusedThread::new("test-reused").unwrap_or_else(|| panic!("no thread"));
        let ids: Vec<_> = (0..3).map(|i| t.run(move || (i, std::thread::current().id()))).collect();
        let done: Vec<_> = ids.into_iter().filter_map(Running::wait).collect();
        assert_eq!(done.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(done.iter().all(|(_, id)| *id == done[0].1), "the same thread ran them all");
        assert_ne!(done[0].1, std::thread::current().id());
    }

    #[test]
    fn a_running_job_is_reported_running_until_it_ends() {
        let t = ReusedThread::new("test-reused").unwrap_or_else(|| panic!("no thread"));
        let (go, gate) = mpsc::channel::<()>();
        let job = t.run(move || gate.recv().is_ok());
        assert_eq!(job.wait_for(Duration::from_millis(10)), Err(true));
        let _ = go.send(());
        assert_eq!(job.wait_for(Duration::from_secs(5)), Ok(true));
    }
}
