//! Deterministic fault injection (docs/observe.md, "Faults"): faults armed from the command line or the
//! control socket fire on the Nth matching event, or with a seeded probability, at hook points in the PCI
//! function and the engines. With nothing armed a hook point costs one relaxed atomic load.

#![forbid(unsafe_code)]

mod spec;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

pub use spec::{CqeField, FaultKind, FaultSpec, Params, RegRef, SpecError, Trigger};

/// splitmix64: small, fast, and the same sequence for the same seed everywhere.
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

struct Armed {
    id: u64,
    spec: FaultSpec,
    /// Matching events so far.
    seen: u64,
    fired: u64,
    rng: u64,
}

impl Armed {
    /// Counts one matching event; whether it fires.
    fn event(&mut self) -> bool {
        self.seen += 1;
        let t = &self.spec.trigger;
        if self.seen < t.nth || t.count.is_some_and(|c| self.fired >= c) {
            return false;
        }
        // prob = 1 never draws, so a plain "nth" fault is independent of the generator.
        if t.prob < 1.0 {
            let draw = next_random(&mut self.rng) as f64 / (u64::MAX as f64 + 1.0);
            if draw >= t.prob {
                return false;
            }
        }
        self.fired += 1;
        true
    }

    fn spent(&self) -> bool {
        self.spec.trigger.count.is_some_and(|c| self.fired >= c)
    }
}

/// A fault that fired: which one, and its parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Fired {
    pub id: u64,
    pub kind: FaultKind,
    pub params: Params,
    /// The matching event it fired on (1-based).
    pub event: u64,
}

/// The faults armed on one device.
#[derive(Default)]
pub struct Faults {
    /// Bit `k` set while a fault of kind `k` is armed: the hook points' fast check.
    kinds: AtomicU32,
    armed: Mutex<Vec<Armed>>,
    next_id: Mutex<u64>,
}

/// Bit of `kind` in `Faults::kinds`: its discriminant, which is its index in `FaultKind::ALL` (a test
/// holds them equal).
fn bit(kind: FaultKind) -> u32 {
    1 << (kind as u32)
}

/// At most this many faults armed on a device at once: every matching event walks them.
pub const MAX_ARMED: usize = 64;

impl Faults {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Armed>> {
        self.armed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn refresh(&self, armed: &[Armed]) {
        let kinds = armed.iter().filter(|a| !a.spent()).fold(0, |m, a| m | bit(a.spec.kind));
        self.kinds.store(kinds, Ordering::Release);
    }

    /// Arms `spec` (already checked against the device); returns its id.
    pub fn arm(&self, spec: FaultSpec) -> u64 {
        let id = {
            let mut n = self.next_id.lock().unwrap_or_else(|e| e.into_inner());
            *n += 1;
            *n
        };
        let mut armed = self.lock();
        let rng = spec.trigger.seed;
        armed.push(Armed { id, spec, seen: 0, fired: 0, rng });
        self.refresh(&armed);
        id
    }

    /// Disarms fault `id`; whether it was armed.
    pub fn remove(&self, id: u64) -> bool {
        let mut armed = self.lock();
        let before = armed.len();
        armed.retain(|a| a.id != id);
        self.refresh(&armed);
        armed.len() != before
    }

    /// A new client session: every fault counts its events from the start again (a session replays alone).
    pub fn restart(&self) {
        let mut armed = self.lock();
        for a in armed.iter_mut() {
            a.seen = 0;
            a.fired = 0;
            a.rng = a.spec.trigger.seed;
        }
        self.refresh(&armed);
    }

    pub fn clear(&self) {
        let mut armed = self.lock();
        armed.clear();
        self.refresh(&armed);
    }

    /// Whether any fault of `kind` may still fire: the cheap check before [`Faults::hit`].
    #[inline]
    pub fn armed(&self, kind: FaultKind) -> bool {
        self.kinds.load(Ordering::Acquire) & bit(kind) != 0
    }

    /// One event of `kind`: each armed fault of that kind whose parameters `matches` counts it, and the first
    /// that fires is returned.
    pub fn hit(&self, kind: FaultKind, matches: impl Fn(&Params) -> bool) -> Option<Fired> {
        if !self.armed(kind) {
            return None;
        }
        let mut armed = self.lock();
        let mut fired = None;
        for a in armed.iter_mut().filter(|a| a.spec.kind == kind && matches(&a.spec.params)) {
            if a.event() && fired.is_none() {
                fired = Some(Fired { id: a.id, kind, params: a.spec.params.clone(), event: a.seen });
            }
        }
        if fired.is_some() {
            self.refresh(&armed);
        }
        fired
    }

    /// Every armed fault with its counts, for `{"cmd":"fault"}`.
    pub fn list(&self) -> serde_json::Value {
        let armed = self.lock();
        let items: Vec<serde_json::Value> = armed
            .iter()
            .map(|a| {
                serde_json::json!({
                    "id": a.id,
                    "spec": a.spec.to_string(),
                    "seen": a.seen,
                    "fired": a.fired,
                    "spent": a.spent(),
                })
            })
            .collect();
        serde_json::Value::Array(items)
    }

    /// The armed specs, for a recording's header.
    /// How many faults are armed (spent ones included until removed).
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    pub fn specs(&self) -> Vec<String> {
        self.lock().iter().map(|a| a.spec.to_string()).collect()
    }
}

/// How many bits `kinds` needs: one per kind.
const _: () = assert!(FaultKind::ALL.len() <= 32);

#[cfg(test)]
mod tests;
