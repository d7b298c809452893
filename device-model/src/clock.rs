//! Time as the device model reads it where a wait is part of the behaviour (the hfi1 cable's link training,
//! its delay and reorder faults): one seam, [`Clock`]. Production runs on [`RealClock`]; unit tests move a
//! [`FakeClock`] by hand (as crosvm's `base::FakeClock`), so no test waits for, or asserts on, the wall clock.

#![forbid(unsafe_code)]

use std::time::Instant;

use crossbeam_channel::Receiver;

/// Where time comes from.
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
    /// A channel that yields once, when [`Clock::now`] reaches `deadline`: a waiter selects on it beside its
    /// other channels.
    fn at(&self, deadline: Instant) -> Receiver<Instant>;
}

/// The monotonic clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealClock;

impl Clock for RealClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn at(&self, deadline: Instant) -> Receiver<Instant> {
        crossbeam_channel::at(deadline)
    }
}

#[cfg(test)]
pub use fake::FakeClock;

#[cfg(test)]
mod fake {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use crossbeam_channel::{Receiver, Sender};

    use super::Clock;

    /// A clock that stands still until [`FakeClock::advance`] moves it; the timers it passes fire then.
    #[derive(Debug)]
    pub struct FakeClock {
        state: Mutex<State>,
    }

    #[derive(Debug)]
    struct State {
        now: Instant,
        /// Timers not yet due (a waiter asks for one per deadline it waits for).
        timers: Vec<(Instant, Sender<Instant>)>,
    }

    impl Default for FakeClock {
        fn default() -> Self {
            // An origin only: the fake time never reads the real clock again.
            FakeClock { state: Mutex::new(State { now: Instant::now(), timers: Vec::new() }) }
        }
    }

    impl FakeClock {
        /// Moves time on by `by` and fires every timer it reached.
        pub fn advance(&self, by: Duration) {
            let mut s = self.state.lock().unwrap();
            s.now += by;
            let now = s.now;
            s.timers.retain(|(due, tx)| {
                if *due <= now {
                    let _ = tx.try_send(now);
                    false
                } else {
                    true
                }
            });
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> Instant {
            self.state.lock().unwrap().now
        }

        fn at(&self, deadline: Instant) -> Receiver<Instant> {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let mut s = self.state.lock().unwrap();
            if deadline <= s.now {
                let _ = tx.try_send(s.now);
            } else {
                s.timers.push((deadline, tx));
            }
            rx
        }
    }

    #[test]
    fn a_timer_fires_once_the_clock_reaches_its_deadline_and_not_before() {
        let clock = FakeClock::default();
        let t0 = clock.now();
        let timer = clock.at(t0 + Duration::from_millis(10));
        clock.advance(Duration::from_millis(9));
        assert!(timer.try_recv().is_err(), "not due yet");
        clock.advance(Duration::from_millis(1));
        assert_eq!(timer.try_recv(), Ok(t0 + Duration::from_millis(10)));
        assert!(clock.at(t0).try_recv().is_ok(), "a deadline already passed fires at once");
    }
}
