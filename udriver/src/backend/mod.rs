//! How the driver reaches a device: every backend implements `crate::access::DeviceAccess`.

pub mod inproc;
pub mod mmio;
pub mod vfio;

use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::access::{AccessError, Result};

/// Waits for an eventfd to become readable, then consumes its count. `Ok(false)` on timeout.
pub fn wait_eventfd(fd: BorrowedFd<'_>, timeout: Duration) -> Result<bool> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ts = Timespec { tv_sec: left.as_secs() as i64, tv_nsec: left.subsec_nanos() as i64 };
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        match poll(&mut fds, Some(&ts)) {
            Ok(0) => return Ok(false),
            Ok(_) => {
                let mut buf = [0u8; 8];
                return match rustix::io::read(fd, &mut buf) {
                    Ok(8) => Ok(true),
                    Ok(_) | Err(rustix::io::Errno::AGAIN) => Ok(false),
                    Err(e) => Err(AccessError::Io { op: "read eventfd", source: e.into() }),
                };
            }
            Err(rustix::io::Errno::INTR) if !left.is_zero() => continue,
            Err(e) => return Err(AccessError::Io { op: "poll eventfd", source: e.into() }),
        }
    }
}
