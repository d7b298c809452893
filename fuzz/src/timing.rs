//! Short sleeps that last as long as asked.
//!
//! Linux lets a sleeping thread's timer fire up to its timer slack late, 50 µs by default, so each 20 µs
//! poll sleep of the driver (or 100 µs wait of a harness) took 70-150 µs. A fuzz input that polls a
//! withheld completion thousands of times spent most of its time there.

use std::num::NonZeroU64;

/// Sets the calling thread's timer slack to 1 ns; threads it starts afterwards inherit it. Call it before
/// the engines (and their workers) are created.
pub fn precise_sleeps() {
    // Best effort: without it the sleeps are only longer.
    let _ = rustix::thread::set_current_timer_slack(NonZeroU64::new(1));
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_slack_is_one_nanosecond_for_the_thread_and_the_threads_it_starts() {
        super::precise_sleeps();
        assert_eq!(rustix::thread::current_timer_slack().ok(), Some(1));
        let child = std::thread::spawn(|| rustix::thread::current_timer_slack().ok()).join().ok().flatten();
        assert_eq!(child, Some(1));
    }
}
