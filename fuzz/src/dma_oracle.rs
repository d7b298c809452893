//! The "device never writes where it may not" oracle.
//!
//! [`GuardedMemory`] is a [`HeapMemory`] that the harness fills (as the driver would) and the device reaches
//! through [`DmaAccess`]. Every device write is checked at the moment it happens: against the ranges the
//! harness declared writable (CCQ rings a fetched command names), or by a [`WritePolicy`] that decides from
//! the programming as it is at that moment (`hfi1_oracle`). [`GuardedMemory::check_snapshot`] also compares
//! the memory with the harness's own copy afterwards, so a write that bypassed the check would still show.

use std::sync::{Arc, Mutex};

use vfio_user_proto::dma::{DmaAccess, DmaError, HeapMemory};
use vfio_user_proto::sync::Unpoison;

/// A device write that was not allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub iova: u64,
    pub len: u64,
    pub why: &'static str,
}

/// Decides, from what the device reads, which ranges it may write next (e.g. a CREATE_CQ WQE it fetched
/// names a CCQ ring). Returns ranges `(iova, len)` to allow.
pub type ReadHook = Box<dyn Fn(u64, &[u8]) -> Vec<(u64, u64)> + Send + Sync>;

/// Decides, when the device writes, whether it may write there now.
pub trait WritePolicy: Send + Sync {
    /// `Err(why)` when the device may not write `[iova, iova + len)` now.
    fn check(&self, iova: u64, len: u64) -> Result<(), &'static str>;
    /// Back to nothing programmed (the harness starts a new input).
    fn reset(&self);
}

struct State {
    /// Ranges the device may write: `(start, end)` exclusive.
    allowed: Vec<(u64, u64)>,
    /// The harness's copy of each mapped range, as the harness wrote it.
    model: Vec<(u64, Vec<u8>)>,
    violations: Vec<Violation>,
    device_writes: u64,
    /// Ranges anyone wrote since the last reset `(start, end)`: what [`GuardedMemory::reset`] zeroes.
    dirty: Vec<(u64, u64)>,
}

impl State {
    fn touch(&mut self, iova: u64, len: usize) {
        let end = iova.saturating_add(len as u64);
        // Coalesce with the last range: inputs mostly write next to what they wrote before.
        if let Some(last) = self.dirty.last_mut() {
            if iova <= last.1 && end >= last.0 {
                *last = (last.0.min(iova), last.1.max(end));
                return;
            }
        }
        self.dirty.push((iova, end));
    }
}

pub struct GuardedMemory {
    mem: HeapMemory,
    state: Mutex<State>,
    on_read: Option<ReadHook>,
    /// Where the device may write besides the declared ranges.
    policy: Option<Arc<dyn WritePolicy>>,
}

impl GuardedMemory {
    /// Memory whose device writes `policy` judges (there are no declared ranges until `allow`).
    pub fn with_policy(ranges: &[(u64, usize)], policy: Arc<dyn WritePolicy>) -> Self {
        GuardedMemory { policy: Some(policy), ..Self::new(ranges, None) }
    }

    /// `ranges`: `(iova, len)` of each mapping, zero-filled.
    pub fn new(ranges: &[(u64, usize)], on_read: Option<ReadHook>) -> Self {
        let mem = HeapMemory::new();
        let mut model = Vec::new();
        for &(iova, len) in ranges {
            if mem.map(iova, len) {
                model.push((iova, vec![0u8; len]));
            }
        }
        let state = Mutex::new(State {
            allowed: Vec::new(),
            model,
            violations: Vec::new(),
            device_writes: 0,
            dirty: Vec::new(),
        });
        GuardedMemory { mem, state, on_read, policy: None }
    }

    /// Back to the state `new` left: every byte written since zeroed again (memory and the harness's copy),
    /// no allowance, no violation. A fuzz worker keeps one memory across inputs: allocating and faulting in
    /// fresh windows per input cost more than the device code under test.
    pub fn reset(&self) {
        let mut st = self.lock();
        let dirty = std::mem::take(&mut st.dirty);
        let zeros = vec![0u8; 4096];
        for (start, end) in dirty {
            for (base, model) in st.model.iter_mut() {
                let (lo, hi) = (start.max(*base), end.min(*base + model.len() as u64));
                if lo >= hi {
                    continue;
                }
                model[(lo - *base) as usize..(hi - *base) as usize].fill(0);
                let mut at = lo;
                while at < hi {
                    let n = ((hi - at) as usize).min(zeros.len());
                    let _ = self.mem.write(at, &zeros[..n]);
                    at += n as u64;
                }
            }
        }
        st.allowed.clear();
        st.violations.clear();
        st.device_writes = 0;
        drop(st);
        if let Some(p) = &self.policy {
            p.reset();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unpoison()
    }

    /// The harness (playing the driver) stores bytes. Out-of-range stores are dropped, like a driver bug
    /// would fault: they are not part of what the device is judged on.
    pub fn host_write(&self, iova: u64, data: &[u8]) -> bool {
        if self.mem.write(iova, data).is_err() {
            return false;
        }
        let mut st = self.lock();
        st.touch(iova, data.len());
        let mut at = 0usize;
        while at < data.len() {
            let cur = iova + at as u64;
            let Some((base, buf)) = st.model.iter_mut().find(|(b, m)| cur >= *b && cur - *b < m.len() as u64) else {
                break;
            };
            let off = (cur - *base) as usize;
            let n = (buf.len() - off).min(data.len() - at);
            buf[off..off + n].copy_from_slice(&data[at..at + n]);
            at += n;
        }
        true
    }

    /// Reads memory without any device bookkeeping.
    pub fn host_read(&self, iova: u64, buf: &mut [u8]) -> bool {
        self.mem.read(iova, buf).is_ok()
    }

    /// Declares `[iova, iova + len)` writable by the device from now on.
    pub fn allow(&self, iova: u64, len: u64) {
        let Some(end) = iova.checked_add(len) else { return };
        // Bounded by the input: one allowance per programming step the harness makes.
        self.lock().allowed.push((iova, end));
    }

    pub fn violations(&self) -> Vec<Violation> {
        self.lock().violations.clone()
    }

    pub fn device_writes(&self) -> u64 {
        self.lock().device_writes
    }

    /// Compares memory with the harness's copy, which every checked write and every host write keeps in step:
    /// returns the first byte that differs, a change no checked write made.
    pub fn check_snapshot(&self) -> Option<u64> {
        let st = self.lock();
        for (base, model) in &st.model {
            // In place, whole slice first (a memcmp): this runs once per input over every mapped byte, and a
            // copy of each window cost as much as the comparison.
            let changed = self.mem.inspect(*base, |now| {
                if now == model.as_slice() {
                    return None;
                }
                let mut diffs = now.iter().zip(model.iter()).enumerate().filter(|(_, (a, b))| a != b);
                diffs.next().map(|(i, _)| base + i as u64)
            });
            match changed {
                None => return Some(*base),
                Some(Some(at)) => return Some(at),
                Some(None) => {}
            }
        }
        None
    }
}

impl DmaAccess for GuardedMemory {
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        self.mem.read(iova, buf)?;
        if let Some(hook) = &self.on_read {
            for (start, len) in hook(iova, buf) {
                self.allow(start, len);
            }
        }
        Ok(())
    }

    fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        let len = buf.len() as u64;
        let declared = {
            let st = self.lock();
            let end = iova.saturating_add(len);
            st.allowed.iter().any(|(s, e)| iova >= *s && end <= *e)
        };
        // The policy reads the device's registers: it runs without this memory's lock.
        let verdict = match (&self.policy, declared) {
            (_, true) => Ok(()),
            (Some(p), false) => p.check(iova, len),
            (None, false) => Err("device write outside every allowed buffer"),
        };
        if let Err(why) = verdict {
            self.lock().violations.push(Violation { iova, len, why });
            // Refuse it, so the snapshot shows only what was allowed and the violation is reported once.
            return Err(DmaError::Permission { iova, dir: "write" });
        }
        self.mem.write(iova, buf)?;
        let mut st = self.lock();
        st.device_writes += 1;
        st.touch(iova, buf.len());
        // Keep the model in step with allowed writes so the snapshot compares only unexpected changes.
        let mut at = 0usize;
        while at < buf.len() {
            let cur = iova + at as u64;
            let Some((base, m)) = st.model.iter_mut().find(|(b, m)| cur >= *b && cur - *b < m.len() as u64) else {
                break;
            };
            let off = (cur - *base) as usize;
            let n = (m.len() - off).min(buf.len() - at);
            m[off..off + n].copy_from_slice(&buf[at..at + n]);
            at += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_write_inside_an_allowed_buffer_lands_and_is_not_a_violation() {
        let m = GuardedMemory::new(&[(0x1000, 0x1000)], None);
        m.allow(0x1100, 0x100);
        assert_eq!(m.write(0x1100, &[1; 0x100]), Ok(()));
        assert!(m.violations().is_empty());
        assert_eq!(m.check_snapshot(), None);
        assert_eq!(m.device_writes(), 1);
    }

    #[test]
    fn a_device_write_straddling_the_end_of_an_allowed_buffer_is_a_violation_and_changes_nothing() {
        let m = GuardedMemory::new(&[(0x1000, 0x1000)], None);
        m.allow(0x1100, 0x100);
        assert!(m.write(0x11f8, &[1; 16]).is_err());
        assert_eq!(
            m.violations(),
            vec![Violation { iova: 0x11f8, len: 16, why: "device write outside every allowed buffer" }]
        );
        let mut b = [0u8; 16];
        assert!(m.host_read(0x11f8, &mut b));
        assert_eq!(b, [0; 16]);
    }

    #[test]
    fn host_writes_are_not_device_changes_in_the_snapshot() {
        let m = GuardedMemory::new(&[(0x1000, 0x1000)], None);
        assert!(m.host_write(0x1800, &[7; 32]));
        assert_eq!(m.check_snapshot(), None);
    }

    #[test]
    fn a_change_behind_the_oracles_back_is_found_by_the_snapshot() {
        let m = GuardedMemory::new(&[(0x1000, 0x1000)], None);
        // Write through the inner memory directly, as a device path that skipped the check would.
        m.mem.write(0x1234, &[9]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.check_snapshot(), Some(0x1234));
    }

    #[test]
    fn reset_zeroes_what_host_and_device_wrote_and_forgets_allowances_and_violations() {
        let m = GuardedMemory::new(&[(0x1000, 0x1000), (0x4000, 0x1000)], None);
        assert!(m.host_write(0x1ff0, &[7; 16]));
        m.allow(0x4000, 0x100);
        assert_eq!(m.write(0x4010, &[3; 8]), Ok(()));
        assert!(m.write(0x4800, &[3; 8]).is_err());
        m.reset();
        assert!(m.violations().is_empty());
        assert_eq!(m.device_writes(), 0);
        let mut b = [1u8; 16];
        for at in [0x1ff0, 0x4010] {
            assert!(m.host_read(at, &mut b));
            assert_eq!(b, [0; 16], "{at:#x}");
        }
        assert_eq!(m.check_snapshot(), None);
        // The allowance is gone with the reset.
        assert!(m.write(0x4010, &[3; 8]).is_err());
    }

    #[test]
    fn the_read_hook_can_allow_what_a_fetched_command_names() {
        let hook: ReadHook =
            Box::new(|_iova, data| if data.first() == Some(&0xcc) { vec![(0x1f00, 0x100)] } else { vec![] });
        let m = GuardedMemory::new(&[(0x1000, 0x1000)], Some(hook));
        assert!(m.host_write(0x1000, &[0xcc]));
        assert!(m.write(0x1f00, &[1]).is_err());
        let mut b = [0u8; 1];
        m.read(0x1000, &mut b).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.write(0x1f00, &[1]), Ok(()));
    }
}
