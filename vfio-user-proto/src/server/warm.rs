//! Keeping idle CPUs from halting while a client's requests come in bursts (`ServerConfig::keep_warm`).
//!
//! On a VM whose idle vCPUs halt (cpuidle `haltpoll` with `guest_halt_poll_ns` 0, as on this project's
//! machines), a thread woken on an idle CPU waits until the hypervisor runs that vCPU again: tens of
//! microseconds, most of a guest's trapped access (docs/bench.md). The connection's busy-poll keeps the
//! server's own CPU awake, but the access's other hand-offs (QEMU's I/O thread taking the reply, its vCPU
//! thread woken by it) land on the other CPUs. For a window after each request, one of two means keeps them
//! awake:
//!
//! - [`WarmMeans::Spin`] (the default): threads spinning at `SCHED_IDLE`, which run only where nothing else
//!   wants the CPU; the scheduler counts such a CPU as idle when it places a woken thread, which preempts the
//!   spinner at once. No privilege needed, and nothing outside this process changes.
//! - [`WarmMeans::PmQos`]: a CPU latency request of 0 us on `/dev/cpu_dma_latency` (PM QoS), so that idle
//!   CPUs poll instead of halting and a wake-up needs no interrupt. It takes write access to that device
//!   (root, as a rule), and it is a machine-wide setting: while it is held every process's wake-ups are
//!   faster, and measured beside us the peer server got faster too (docs/bench.md, "Keep-warm").
//!
//! Either way the threads (one for the request, the spinners for spinning) sleep between bursts: the first
//! request of a burst wakes them, and they stop once a window has passed without a request.
//!
//! Whether either pays depends on the machine, so by default ([`WarmPolicy::Tried`]) it is tried against
//! not keeping warm, on the clients' own round trips, and kept only where it wins (`super::trial`).

#![forbid(unsafe_code)]

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::trial::{Trial, Verdict, MIN_BURST_GAP};
use crate::sched::set_idle_policy;
use crate::sync::Unpoison;

/// The PM QoS device of the CPU latency request.
pub const CPU_LATENCY_QOS: &str = "/dev/cpu_dma_latency";
/// Spin-loop hints between looks at the clock.
const SPINS_PER_LOOK: u32 = 64;
/// The latency request while warm: idle CPUs must be able to wake at once, so they poll.
const QOS_WARM_US: i32 = 0;
/// The request between bursts: no constraint (anything at or above the kernel's default of 2000 s).
const QOS_COLD_US: i32 = i32::MAX;

/// How idle CPUs are kept from halting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmMeans {
    /// A 0 us CPU latency request on [`CPU_LATENCY_QOS`] while warm.
    PmQos,
    /// This many threads spinning at `SCHED_IDLE` while warm.
    Spin { threads: usize },
}

impl Default for WarmMeans {
    fn default() -> Self {
        WarmMeans::Spin { threads: WarmMeans::default_spinners() }
    }
}

impl WarmMeans {
    /// Spinners by default: one per CPU besides the one the connection's busy-poll holds, at most two (a
    /// trapped access wakes two threads besides the server's: QEMU's I/O thread and its vCPU thread).
    pub fn default_spinners() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).clamp(1, 2))
    }
}

/// Whether keeping warm is tried against not, or done after every request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WarmPolicy {
    /// Tried in blocks of a burst's requests against not keeping warm, and kept only where it shortens the
    /// gap between a reply and the next request.
    #[default]
    Tried,
    /// After every request.
    Always,
}

struct Shared {
    base: Instant,
    /// `None` under [`WarmPolicy::Always`].
    trial: Option<Mutex<Trial>>,
    /// The longest gap the trial counts as a round trip.
    burst_gap: Duration,
    /// Nanoseconds after `base` until which the CPUs are kept warm.
    until: AtomicU64,
    window: u64,
    stop: AtomicBool,
    /// Threads waiting on `wake` for a burst (a request only takes the lock when one is).
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

impl Shared {
    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn warm(&self) -> bool {
        self.now() < self.until.load(Ordering::SeqCst)
    }

    /// Wakes the threads waiting for a burst (a request only takes the lock when one is).
    fn wake_sleepers(&self) {
        if self.sleeping.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unpoison();
            self.wake.notify_all();
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Sleeps until a burst begins or the threads are stopped; false when stopped.
    fn wait_for_burst(&self) -> bool {
        let mut guard = self.lock.lock().unpoison();
        // Counted before `until` is looked at again: a request either sees a sleeper or is seen here.
        self.sleeping.fetch_add(1, Ordering::SeqCst);
        while !self.stopped() && !self.warm() {
            guard = self.wake.wait(guard).unpoison();
        }
        self.sleeping.fetch_sub(1, Ordering::SeqCst);
        !self.stopped()
    }

    /// Sleeps until a window has passed without a request, or the threads are stopped.
    fn wait_out_burst(&self) {
        let mut guard = self.lock.lock().unpoison();
        loop {
            let (now, until) = (self.now(), self.until.load(Ordering::SeqCst));
            if self.stopped() || now >= until {
                return;
            }
            guard = self.wake.wait_timeout(guard, Duration::from_nanos(until - now)).unpoison().0;
        }
    }

    fn spin(&self) {
        if let Err(e) = set_idle_policy() {
            // At normal priority the spinner would take time from the client's threads: do not spin at all.
            tracing::warn!("keep-warm thread cannot take SCHED_IDLE ({e}); it stays off");
            return;
        }
        while self.wait_for_burst() {
            while !self.stopped() && self.warm() {
                for _ in 0..SPINS_PER_LOOK {
                    std::hint::spin_loop();
                }
            }
        }
    }

    fn hold_qos(&self, mut qos: File) {
        let mut set = |us: i32| {
            if let Err(e) = qos.write_all(&us.to_ne_bytes()) {
                tracing::warn!("{CPU_LATENCY_QOS}: cannot request {us} us: {e}");
            }
        };
        while self.wait_for_burst() {
            set(QOS_WARM_US);
            self.wait_out_burst();
            set(QOS_COLD_US);
        }
        // Closing the file drops the request too.
    }
}

fn open_qos() -> std::io::Result<File> {
    File::options()
        .write(true)
        .open(CPU_LATENCY_QOS)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{CPU_LATENCY_QOS}: {e}")))
}

/// Keeps idle CPUs from halting for a window after each request; shared by the servers of one process.
/// Dropping it stops and joins its threads (and so lifts the means).
pub struct KeepWarm {
    shared: Arc<Shared>,
    means: WarmMeans,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for KeepWarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeepWarm")
            .field("means", &self.means)
            .field("window_ns", &self.shared.window)
            .field("tried", &self.shared.trial.is_some())
            .finish()
    }
}

impl KeepWarm {
    /// Starts the thread(s) of `means`, asleep until the first request.
    pub fn start(window: Duration, means: WarmMeans, policy: WarmPolicy) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            base: Instant::now(),
            trial: (policy == WarmPolicy::Tried).then(|| Mutex::new(Trial::default())),
            burst_gap: window.max(MIN_BURST_GAP),
            until: AtomicU64::new(0),
            window: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            stop: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut warm = KeepWarm { shared, means, threads: Vec::new() };
        let builder = || std::thread::Builder::new().name("keep-warm".into());
        match means {
            WarmMeans::PmQos => {
                let (s, qos) = (warm.shared.clone(), open_qos()?);
                warm.threads.push(builder().spawn(move || s.hold_qos(qos))?);
            }
            WarmMeans::Spin { threads } => {
                for _ in 0..threads {
                    let s = warm.shared.clone();
                    // On error `warm` drops here, stopping the threads already started.
                    warm.threads.push(builder().spawn(move || s.spin())?);
                }
            }
        }
        Ok(warm)
    }

    pub fn means(&self) -> WarmMeans {
        self.means
    }

    /// A request arrived, `since_reply` after the reply before it on its connection (`None` when there is
    /// no such reply to time it from): keep the CPUs awake for one window from now, unless the trial says
    /// it does not pay. Only a gap up to the window (at least [`MIN_BURST_GAP`]) is a round trip of a burst;
    /// a longer one is the client's idle time. The servers sharing this `KeepWarm` feed one trial.
    pub fn request(&self, since_reply: Option<Duration>) {
        let s = &*self.shared;
        let deadline = s.now().saturating_add(s.window);
        let Some(trial) = &s.trial else {
            // fetch_max: servers sharing it may race, and the later deadline must win.
            s.until.fetch_max(deadline, Ordering::SeqCst);
            return s.wake_sleepers();
        };
        let (warm, verdict) = {
            let mut t = trial.lock().unpoison();
            let was_warm = t.warm();
            let verdict = since_reply.filter(|&g| g <= s.burst_gap).and_then(|g| t.record(g));
            let warm = t.warm();
            if warm {
                s.until.fetch_max(deadline, Ordering::SeqCst);
            } else if was_warm {
                // A cold arm begins: close the warm window now, or its spinners would run into the cold
                // block. Under the trial's lock, so no warm request can reopen it behind this one.
                s.until.store(s.now(), Ordering::SeqCst);
            }
            (warm, verdict)
        };
        if let Some(v) = verdict {
            tracing::debug!("keep-warm trial: {v}");
        }
        if warm {
            s.wake_sleepers();
        }
    }

    /// Whether the trial runs (`WarmPolicy::Tried`): only then do servers time their replies.
    pub fn is_tried(&self) -> bool {
        self.shared.trial.is_some()
    }

    /// The outcome of the latest trial (`None` before the first ends, or under [`WarmPolicy::Always`]).
    pub fn verdict(&self) -> Option<Verdict> {
        self.shared.trial.as_ref().and_then(|t| t.lock().unpoison().last())
    }

    /// Whether the window of the latest request is still open.
    pub fn is_warm(&self) -> bool {
        self.shared.warm()
    }

    /// How many of its threads wait for a burst.
    pub fn sleeping(&self) -> usize {
        self.shared.sleeping.load(Ordering::SeqCst)
    }
}

impl Drop for KeepWarm {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _guard = self.shared.lock.lock().unpoison();
            self.shared.wake.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spinners run at SCHED_IDLE: on a loaded machine they get little CPU, so waits are generous.
    fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn spinners_sleep_until_a_request_spin_while_requests_come_and_sleep_a_window_after_the_last() {
        let warm =
            KeepWarm::start(Duration::from_millis(100), WarmMeans::Spin { threads: 2 }, WarmPolicy::Always).unwrap();
        wait_until("both threads sleep before any request", || warm.sleeping() == 2);
        assert!(!warm.is_warm());
        // Requests closer together than the window keep both threads up.
        wait_until("a request wakes both threads", || {
            warm.request(None);
            warm.sleeping() == 0
        });
        wait_until("both threads sleep again once no request came for a window", || {
            warm.sleeping() == 2 && !warm.is_warm()
        });
    }

    #[test]
    fn a_tried_keep_warm_closes_the_window_when_a_cold_block_begins_and_its_spinner_sleeps() {
        use super::super::trial::BLOCK;
        let warm = KeepWarm::start(Duration::from_secs(60), WarmMeans::Spin { threads: 1 }, WarmPolicy::Tried).unwrap();
        assert!(warm.is_tried());
        let round_trip = Some(Duration::from_micros(20));
        warm.request(None);
        for _ in 0..BLOCK - 1 {
            warm.request(round_trip);
        }
        assert!(warm.is_warm(), "the first block is warm");
        wait_until("the spinner spins in the warm block", || warm.sleeping() == 0);
        warm.request(round_trip);
        assert!(!warm.is_warm(), "the first request of the cold block closed the 60 s window");
        wait_until("the spinner sleeps in the cold block", || warm.sleeping() == 1);
        warm.request(round_trip);
        assert!(!warm.is_warm(), "and cold requests do not reopen it");
    }

    /// Which arm the trial is in, read from the trial itself (the window may be too short to see it).
    fn trial_warm(warm: &KeepWarm) -> bool {
        warm.shared.trial.as_ref().expect("tried").lock().unpoison().warm()
    }

    #[test]
    fn only_gaps_up_to_the_window_or_min_burst_gap_move_the_trial_on() {
        use super::super::trial::BLOCK;
        // (window, a gap that counts, a gap that does not)
        let table = [
            (Duration::from_secs(10), Duration::from_secs(10), Duration::from_secs(11)),
            (Duration::from_micros(50), MIN_BURST_GAP, MIN_BURST_GAP + Duration::from_micros(1)),
        ];
        for (window, counts, idle) in table {
            let warm = KeepWarm::start(window, WarmMeans::Spin { threads: 1 }, WarmPolicy::Tried).unwrap();
            for _ in 0..4 * BLOCK {
                warm.request(Some(idle));
            }
            warm.request(None);
            for _ in 0..BLOCK - 1 {
                warm.request(Some(counts));
            }
            assert!(trial_warm(&warm), "window {window:?}: idle gaps and no gap left the first block warm");
            warm.request(Some(counts));
            assert!(!trial_warm(&warm), "window {window:?}: the block's last round trip ended it");
            assert!(!warm.is_warm(), "window {window:?}: and the cold block closed the window");
        }
    }

    #[test]
    fn dropping_it_joins_every_thread_spinning_or_asleep() {
        for window in [Duration::ZERO, Duration::from_secs(60)] {
            let warm = KeepWarm::start(window, WarmMeans::Spin { threads: 2 }, WarmPolicy::Always).unwrap();
            warm.request(None);
            let shared = Arc::downgrade(&warm.shared);
            drop(warm);
            assert!(shared.upgrade().is_none(), "every thread ended and let go of it (window {window:?})");
        }
    }

    /// What the request's value is, read back from the kernel: the PM QoS device reads as the current
    /// aggregate (the minimum over every holder), so this only runs where nobody else holds one.
    fn qos_value() -> Option<i32> {
        use std::io::Read;
        let mut b = [0u8; 4];
        File::open(CPU_LATENCY_QOS).ok()?.read_exact(&mut b).ok()?;
        Some(i32::from_ne_bytes(b))
    }

    #[test]
    fn the_qos_request_is_zero_during_a_burst_and_lifted_after_it_and_on_drop() {
        let Ok(warm) = KeepWarm::start(Duration::from_millis(100), WarmMeans::PmQos, WarmPolicy::Always) else {
            eprintln!("skipped: {CPU_LATENCY_QOS} is not writable here");
            return;
        };
        let Some(before) = qos_value().filter(|&v| v > 0) else {
            eprintln!("skipped: another holder keeps the CPU latency request at 0");
            return;
        };
        wait_until("the request is 0 during a burst", || {
            warm.request(None);
            qos_value() == Some(QOS_WARM_US)
        });
        wait_until("the request is lifted a window after the last request", || qos_value() == Some(before));
        wait_until("a new burst requests 0 again", || {
            warm.request(None);
            qos_value() == Some(QOS_WARM_US)
        });
        drop(warm);
        assert_eq!(qos_value(), Some(before), "dropping it lifts the request at once");
    }
}
