//! Adaptive busy-poll of a connection's socket (`ServerConfig::busy_poll`).
//!
//! A client that waits for each reply before its next request (QEMU's vCPU on a trapped register) sends
//! the next message microseconds after our reply. Sleeping in `recvmsg` in between costs a wake-up on each
//! side; polling without blocking for a short while saves ours. Polling only pays while messages come in
//! such bursts, so it is armed by a message that arrived within the budget of the previous reply, and
//! disarmed by a poll that found nothing: an idle client costs one budget, then nothing.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

pub(super) struct BusyPoll {
    budget: Duration,
    armed: bool,
    /// When the last message was handled (only read while polling is configured).
    handled: Option<Instant>,
}

impl BusyPoll {
    pub(super) fn new(budget: Duration) -> Self {
        BusyPoll { budget, armed: !budget.is_zero(), handled: None }
    }

    /// How long to poll before blocking, if at all.
    pub(super) fn budget(&self) -> Option<Duration> {
        self.armed.then_some(self.budget)
    }

    /// A message was handled (its reply sent).
    pub(super) fn handled(&mut self) {
        if !self.budget.is_zero() {
            self.handled = Some(Instant::now());
        }
    }

    /// Polling for `budget()` found nothing.
    pub(super) fn missed(&mut self) {
        self.armed = false;
    }

    /// A blocking read brought a message: a burst again if it came within the budget of the last reply.
    pub(super) fn woke(&mut self) {
        self.armed = self.handled.is_some_and(|t| t.elapsed() <= self.budget);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_is_off_with_a_zero_budget_whatever_happens() {
        let mut p = BusyPoll::new(Duration::ZERO);
        p.handled();
        p.woke();
        assert_eq!(p.budget(), None);
    }

    #[test]
    fn a_miss_disarms_and_only_a_message_soon_after_a_reply_rearms() {
        let budget = Duration::from_millis(50);
        let mut p = BusyPoll::new(budget);
        assert_eq!(p.budget(), Some(budget), "armed from the start");
        p.missed();
        assert_eq!(p.budget(), None);
        p.handled();
        p.woke();
        assert_eq!(p.budget(), Some(budget), "the next request came right after the reply");
        p.missed();
        p.handled();
        std::thread::sleep(budget * 2);
        p.woke();
        assert_eq!(p.budget(), None, "an idle gap longer than the budget is no burst");
    }
}
