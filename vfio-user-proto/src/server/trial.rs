//! Whether keeping warm pays on this machine, judged from the clients' own round trips ([`super::KeepWarm`]).
//!
//! Spinners help where idle CPUs halt and waking one is expensive, and hurt where they do not: a CPU that
//! polls in idle is woken by a flag, one that runs a spinner needs a rescheduling interrupt, which on a VM is
//! an exit. Which of the two a machine is cannot be read without privilege, and it changed between this
//! project's machines (docs/bench.md, "Keep-warm tries itself"). So the requests of a burst are split into
//! blocks kept warm and blocks not, alternately, and what is kept is whichever gave the shorter median gap
//! between a reply and the client's next request: the part of the client's round trip the server's side
//! of the machine decides. The trial is run again after a while, since a machine's state drifts.

#![forbid(unsafe_code)]

use std::time::Duration;

/// Requests in a block of the trial: 8-25 ms of a guest's trapped accesses, long enough for the machine to
/// settle into the arm (a hypervisor's own halt-polling adapts over several wake-ups).
pub(super) const BLOCK: u32 = 256;
/// The first requests of a block are not counted: the machine may not have settled into the arm yet.
const SETTLE: u32 = 64;
/// The arms: kept warm, and not.
const ARMS: u32 = 2;
/// Blocks in a trial, warm first, then alternating.
const BLOCKS: u32 = 2 * ARMS;
/// The shortest gap that still counts as a round trip of a burst, whatever the window: a guest's trapped
/// accesses come 10-80 us apart (p99 under 0.5 ms); a longer gap is the client's own idle time.
pub(super) const MIN_BURST_GAP: Duration = Duration::from_millis(1);
/// Burst requests served with the winner before the next trial.
const SETTLED: u32 = 64 * BLOCK;
/// Kept warm only when its median gap is at most this fraction of the cold one's: spinning costs CPU time
/// the machine could give elsewhere, so a tie goes to not spinning.
const MARGIN: f64 = 0.95;
const _: () = assert!(SETTLE < BLOCK && SETTLED > 0 && BLOCKS.is_multiple_of(ARMS));

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Trying the two arms: block `block` of [`BLOCKS`], `n` requests into it.
    Trying { block: u32, n: u32 },
    /// Keeping (or not) for `left` more burst requests.
    Settled { warm: bool, left: u32 },
}

/// The outcome of the last trial, for the log and the tests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// Whether keeping warm won, and so is kept until the next trial.
    pub warm: bool,
    /// The median gap between a reply and the next request in the warm blocks.
    pub median_warm: Duration,
    /// The same in the blocks not kept warm.
    pub median_cold: Duration,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = if self.warm { "keeping warm" } else { "not keeping warm" };
        write!(f, "{kept} (median gap {:?} warm, {:?} not)", self.median_warm, self.median_cold)
    }
}

#[derive(Debug)]
pub(super) struct Trial {
    phase: Phase,
    warm_gaps: Vec<Duration>,
    cold_gaps: Vec<Duration>,
    last: Option<Verdict>,
}

impl Default for Trial {
    fn default() -> Self {
        let per_arm = (BLOCKS / ARMS * (BLOCK - SETTLE)) as usize;
        Trial {
            phase: Phase::Trying { block: 0, n: 0 },
            warm_gaps: Vec::with_capacity(per_arm),
            cold_gaps: Vec::with_capacity(per_arm),
            last: None,
        }
    }
}

fn median(gaps: &mut [Duration]) -> Option<Duration> {
    let mid = gaps.len() / 2;
    (!gaps.is_empty()).then(|| *gaps.select_nth_unstable(mid).1)
}

impl Trial {
    /// Whether requests are kept warm now.
    pub(super) fn warm(&self) -> bool {
        match self.phase {
            Phase::Trying { block, .. } => block.is_multiple_of(ARMS),
            Phase::Settled { warm, .. } => warm,
        }
    }

    pub(super) fn last(&self) -> Option<Verdict> {
        self.last
    }

    /// A request that came `gap` after the reply before it on its connection, within a burst (a request
    /// after an idle spell is no round trip and is not recorded). Returns the verdict of a trial it ended.
    pub(super) fn record(&mut self, gap: Duration) -> Option<Verdict> {
        match &mut self.phase {
            Phase::Settled { left, .. } => {
                *left -= 1;
                if *left == 0 {
                    self.phase = Phase::Trying { block: 0, n: 0 };
                }
                None
            }
            Phase::Trying { block, n } => {
                if *n >= SETTLE {
                    let arm = if block.is_multiple_of(ARMS) { &mut self.warm_gaps } else { &mut self.cold_gaps };
                    arm.push(gap);
                }
                *n += 1;
                if *n < BLOCK {
                    return None;
                }
                *block += 1;
                *n = 0;
                if *block < BLOCKS {
                    return None;
                }
                let verdict = self.decide();
                self.phase = match verdict {
                    Some(v) => Phase::Settled { warm: v.warm, left: SETTLED },
                    None => Phase::Trying { block: 0, n: 0 },
                };
                self.last = verdict.or(self.last);
                verdict
            }
        }
    }

    /// `None` if an arm has no samples (then the trial starts over).
    fn decide(&mut self) -> Option<Verdict> {
        let verdict = match (median(&mut self.warm_gaps), median(&mut self.cold_gaps)) {
            (Some(median_warm), Some(median_cold)) => Some(Verdict {
                warm: median_warm.as_secs_f64() <= median_cold.as_secs_f64() * MARGIN,
                median_warm,
                median_cold,
            }),
            _ => None,
        };
        self.warm_gaps.clear();
        self.cold_gaps.clear();
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs one whole trial whose warm blocks' requests came `warm` after their replies and whose cold
    /// blocks' came `cold` after, and returns its verdict; `arms` collects whether each request was warm.
    fn trial(t: &mut Trial, warm: Duration, cold: Duration, arms: &mut Vec<bool>) -> Verdict {
        loop {
            let w = t.warm();
            arms.push(w);
            if let Some(v) = t.record(if w { warm } else { cold }) {
                return v;
            }
        }
    }

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn the_arm_with_the_shorter_median_gap_wins_and_a_near_tie_goes_to_not_spinning() {
        // (warm gap, cold gap, kept warm)
        let table = [
            (20 * US, 40 * US, true),  // spinning halves the gap (halting CPUs)
            (30 * US, 20 * US, false), // spinning costs a rescheduling interrupt (polling CPUs)
            (30 * US, 30 * US, false), // no difference: do not spin
            (29 * US, 30 * US, false), // inside the margin
            (28 * US, 30 * US, true),  // outside it
        ];
        for (warm, cold, want) in table {
            let mut t = Trial::default();
            let v = trial(&mut t, warm, cold, &mut Vec::new());
            assert_eq!(v, Verdict { warm: want, median_warm: warm, median_cold: cold }, "{warm:?} vs {cold:?}");
            assert_eq!(t.warm(), want, "the winner is kept after the trial");
            assert_eq!(t.last(), Some(v));
        }
    }

    #[test]
    fn a_trial_alternates_blocks_starting_warm_and_the_winner_holds_until_the_next_trial() {
        let mut t = Trial::default();
        let mut arms = Vec::new();
        let v = trial(&mut t, 50 * US, 10 * US, &mut arms);
        assert!(!v.warm);
        assert_eq!(arms.len(), (BLOCKS * BLOCK) as usize);
        let blocks: Vec<bool> = arms.chunks(BLOCK as usize).map(|b| b[0]).collect();
        assert_eq!(blocks, [true, false, true, false]);
        assert!(arms.chunks(BLOCK as usize).all(|b| b.iter().all(|&w| w == b[0])), "one arm per block");
        // Not warm for exactly SETTLED burst requests; the next trial starts warm.
        for _ in 0..SETTLED {
            assert!(!t.warm());
            assert_eq!(t.record(10 * US), None);
        }
        assert!(t.warm(), "the second trial began after SETTLED requests");
        let mut arms = Vec::new();
        let v = trial(&mut t, 10 * US, 50 * US, &mut arms);
        assert_eq!(arms.len(), (BLOCKS * BLOCK) as usize);
        assert!(v.warm && t.warm(), "the machine changed and the second trial saw it");
    }

    #[test]
    fn the_first_requests_of_each_block_are_not_counted() {
        // The counted requests of a warm block are 20 us for a bare majority, then 30 us: counting the
        // settling requests' 1000 us outliers as well would move the warm median to 30 us.
        let counted = BLOCK - SETTLE;
        let mut t = Trial::default();
        let (mut i, mut verdict) = (0u32, None);
        while verdict.is_none() {
            let k = i % BLOCK;
            let gap = match (t.warm(), k.checked_sub(SETTLE)) {
                (_, None) => 1000 * US,
                (true, Some(c)) if c <= counted / 2 => 20 * US,
                (true, Some(_)) => 30 * US,
                (false, Some(_)) => 40 * US,
            };
            verdict = t.record(gap);
            i += 1;
        }
        assert_eq!(verdict, Some(Verdict { warm: true, median_warm: 20 * US, median_cold: 40 * US }));
    }
}
