//! Interrupt state of one connection: the eventfds the client gave in DEVICE_SET_IRQS, per
//! (index, vector), with mask state and pending-while-masked.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Mutex;

use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};

use crate::device::{irq_flags, Errno, IrqInfo, IrqTrigger};
use crate::sync::Unpoison;
use crate::wire::{irq_set_flags as f, SetIrqs};

#[derive(Default)]
struct Vector {
    fd: Option<OwnedFd>,
    masked: bool,
    pending: bool,
}

/// Implements [`IrqTrigger`] over the client's eventfds. Storage grows only with vectors the client
/// touched, each bounded by the device's advertised count.
#[derive(Default)]
pub struct IrqState {
    inner: Mutex<BTreeMap<(u32, u32), Vector>>,
}

/// The kernel's name for an eventfd in /proc/self/fd.
const EVENTFD_LINK: &str = "anon_inode:[eventfd]";

fn is_eventfd(fd: &OwnedFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).is_ok_and(|p| p.as_os_str() == EVENTFD_LINK)
}

fn signal(fd: &OwnedFd) {
    // Non-blocking (set when the fd arrived): a saturated counter drops the signal instead of hanging us.
    if let Err(e) = rustix::io::write(fd, &1u64.to_ne_bytes()) {
        tracing::debug!("eventfd signal failed: {e}");
    }
}

impl IrqState {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(u32, u32), Vector>> {
        self.inner.lock().unpoison()
    }

    /// Drops every eventfd and mask state (disconnect).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// How many eventfds are held (for tests and leak checks).
    pub fn fd_count(&self) -> usize {
        self.lock().values().filter(|v| v.fd.is_some()).count()
    }

    /// DEVICE_SET_IRQS. `info` is the device's description of `req.index` (`None`: no such index).
    pub fn set_irqs(&self, req: &SetIrqs, info: Option<IrqInfo>, data: &[u8], fds: Vec<OwnedFd>) -> Result<(), Errno> {
        let info = info.ok_or(libc::EINVAL)?;
        let data_kind = req.flags & f::DATA_TYPE_MASK;
        let action = req.flags & f::ACTION_TYPE_MASK;
        if req.flags & !(f::DATA_TYPE_MASK | f::ACTION_TYPE_MASK) != 0
            || data_kind.count_ones() != 1
            || action.count_ones() != 1
        {
            return Err(libc::EINVAL);
        }
        if data_kind != f::DATA_EVENTFD && !fds.is_empty() {
            return Err(libc::EINVAL);
        }
        if data_kind != f::DATA_BOOL && !data.is_empty() {
            return Err(libc::EINVAL);
        }
        if req.count == 0 {
            // The special case: DATA_NONE | ACTION_TRIGGER with count 0 disables the whole index.
            if data_kind == f::DATA_NONE && action == f::ACTION_TRIGGER && req.start == 0 {
                self.lock().retain(|(i, _), _| *i != req.index);
                return Ok(());
            }
            return Err(libc::EINVAL);
        }
        let end = req.start.checked_add(req.count).ok_or(libc::EINVAL)?;
        if end > info.count {
            return Err(libc::EINVAL);
        }
        if action != f::ACTION_TRIGGER && info.flags & irq_flags::MASKABLE == 0 {
            return Err(libc::EINVAL);
        }
        let selected = |i: u32| -> bool {
            match data_kind {
                f::DATA_BOOL => data.get(i as usize).is_some_and(|b| *b != 0),
                _ => true,
            }
        };
        if data_kind == f::DATA_BOOL && data.len() != req.count as usize {
            return Err(libc::EINVAL);
        }
        match (data_kind, action) {
            (f::DATA_EVENTFD, f::ACTION_TRIGGER) => self.assign(req, fds),
            // Mask/unmask notification eventfds are not supported (as for MSI/MSI-X in vfio-pci).
            (f::DATA_EVENTFD, _) => Err(libc::EINVAL),
            (_, f::ACTION_TRIGGER) => {
                (0..req.count).filter(|i| selected(*i)).for_each(|i| self.trigger(req.index, req.start + i));
                Ok(())
            }
            (_, f::ACTION_MASK) => {
                let mut map = self.lock();
                for i in (0..req.count).filter(|i| selected(*i)) {
                    map.entry((req.index, req.start + i)).or_default().masked = true;
                }
                Ok(())
            }
            (_, f::ACTION_UNMASK) => {
                let mut map = self.lock();
                for i in (0..req.count).filter(|i| selected(*i)) {
                    if let Some(v) = map.get_mut(&(req.index, req.start + i)) {
                        v.masked = false;
                        if std::mem::take(&mut v.pending) {
                            if let Some(fd) = &v.fd {
                                signal(fd);
                            }
                        }
                    }
                }
                Ok(())
            }
            _ => Err(libc::EINVAL),
        }
    }

    /// ACTION_TRIGGER | DATA_EVENTFD: `count` fds assign, none de-assigns `[start, start+count)`.
    fn assign(&self, req: &SetIrqs, fds: Vec<OwnedFd>) -> Result<(), Errno> {
        if !fds.is_empty() && fds.len() != req.count as usize {
            return Err(libc::EINVAL);
        }
        for fd in &fds {
            if !is_eventfd(fd) {
                return Err(libc::EINVAL);
            }
            let fl = fcntl_getfl(fd.as_fd()).map_err(|e| e.raw_os_error())?;
            fcntl_setfl(fd.as_fd(), fl | OFlags::NONBLOCK).map_err(|e| e.raw_os_error())?;
        }
        let mut map = self.lock();
        if fds.is_empty() {
            for i in 0..req.count {
                if let Some(v) = map.get_mut(&(req.index, req.start + i)) {
                    v.fd = None;
                }
            }
        } else {
            for (i, fd) in (0..req.count).zip(fds) {
                map.entry((req.index, req.start + i)).or_default().fd = Some(fd);
            }
        }
        Ok(())
    }
}

impl IrqTrigger for IrqState {
    fn trigger(&self, index: u32, vector: u32) {
        let mut map = self.lock();
        let Some(v) = map.get_mut(&(index, vector)) else { return };
        if v.masked {
            v.pending = true;
        } else if let Some(fd) = &v.fd {
            signal(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::event::{eventfd, EventfdFlags};

    fn read_count(fd: &OwnedFd) -> u64 {
        let mut b = [0u8; 8];
        match rustix::io::read(fd, &mut b) {
            Ok(8) => u64::from_ne_bytes(b),
            _ => 0,
        }
    }

    const MSIX: IrqInfo = IrqInfo { flags: irq_flags::EVENTFD | irq_flags::MASKABLE, count: 4 };

    fn req(flags: u32, start: u32, count: u32) -> SetIrqs {
        SetIrqs { argsz: 20, flags, index: 2, start, count }
    }

    #[test]
    fn trigger_while_masked_fires_once_on_unmask() {
        let s = IrqState::new();
        let efd = eventfd(0, EventfdFlags::NONBLOCK).unwrap();
        let dup = efd.try_clone().unwrap();
        s.set_irqs(&req(f::DATA_EVENTFD | f::ACTION_TRIGGER, 1, 1), Some(MSIX), &[], vec![dup]).unwrap();
        s.set_irqs(&req(f::DATA_NONE | f::ACTION_MASK, 1, 1), Some(MSIX), &[], vec![]).unwrap();
        s.trigger(2, 1);
        s.trigger(2, 1);
        assert_eq!(read_count(&efd), 0);
        s.set_irqs(&req(f::DATA_NONE | f::ACTION_UNMASK, 1, 1), Some(MSIX), &[], vec![]).unwrap();
        assert_eq!(read_count(&efd), 1);
    }

    #[test]
    fn count_zero_data_none_trigger_disables_the_index() {
        let s = IrqState::new();
        let efd = eventfd(0, EventfdFlags::NONBLOCK).unwrap();
        s.set_irqs(&req(f::DATA_EVENTFD | f::ACTION_TRIGGER, 0, 1), Some(MSIX), &[], vec![efd.try_clone().unwrap()])
            .unwrap();
        assert_eq!(s.fd_count(), 1);
        s.set_irqs(&req(f::DATA_NONE | f::ACTION_TRIGGER, 0, 0), Some(MSIX), &[], vec![]).unwrap();
        assert_eq!(s.fd_count(), 0);
        s.trigger(2, 0);
        assert_eq!(read_count(&efd), 0);
    }

    #[test]
    fn invalid_set_irqs_requests_are_einval() {
        let s = IrqState::new();
        let cases: &[(u32, u32, u32, &[u8])] = &[
            (f::DATA_NONE | f::DATA_BOOL | f::ACTION_TRIGGER, 0, 1, &[]),
            (f::DATA_NONE | f::ACTION_MASK | f::ACTION_UNMASK, 0, 1, &[]),
            (f::DATA_NONE | f::ACTION_TRIGGER, 3, 2, &[]),
            (f::DATA_NONE | f::ACTION_TRIGGER, u32::MAX, 2, &[]),
            (f::DATA_BOOL | f::ACTION_TRIGGER, 0, 2, &[1]),
            (f::DATA_NONE | f::ACTION_TRIGGER | (1 << 9), 0, 1, &[]),
        ];
        for (flags, start, count, data) in cases {
            assert_eq!(s.set_irqs(&req(*flags, *start, *count), Some(MSIX), data, vec![]), Err(libc::EINVAL));
        }
        assert_eq!(s.set_irqs(&req(f::DATA_NONE | f::ACTION_TRIGGER, 0, 1), None, &[], vec![]), Err(libc::EINVAL));
    }

    #[test]
    fn a_non_eventfd_is_refused() {
        let s = IrqState::new();
        let (r, _w) = rustix::pipe::pipe().unwrap();
        assert_eq!(
            s.set_irqs(&req(f::DATA_EVENTFD | f::ACTION_TRIGGER, 0, 1), Some(MSIX), &[], vec![r]),
            Err(libc::EINVAL)
        );
        assert_eq!(s.fd_count(), 0);
    }
}
