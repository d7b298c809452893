//! How the driver reaches a device: every backend implements `crate::access::DeviceAccess`.

pub mod mmio;
pub mod vfio;
pub mod vfio_user;

use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::access::{pci, AccessError, DeviceAccess, Result};

/// Sets MSI-X Enable in the device's MSI-X capability (what the kernel's `pci_alloc_irq_vectors` does
/// for a VFIO client; a backend with no kernel in between does it itself).
pub fn msix_enable(dev: &dyn DeviceAccess) -> Result<()> {
    let mut ptr = [0u8; 1];
    dev.config_read(pci::CAPABILITY_LIST, &mut ptr)?;
    let mut cap = u64::from(ptr[0] & !3);
    // A capability list has at most 48 entries in 256 bytes; a longer walk means a loop.
    for _ in 0..48 {
        if cap < 0x40 {
            break;
        }
        let mut hdr = [0u8; 2];
        dev.config_read(cap, &mut hdr)?;
        if hdr[0] == pci::CAP_ID_MSIX {
            let mut flags = [0u8; 2];
            dev.config_read(cap + pci::MSIX_FLAGS, &mut flags)?;
            let flags = u16::from_le_bytes(flags) | pci::MSIX_FLAGS_ENABLE;
            return dev.config_write(cap + pci::MSIX_FLAGS, &flags.to_le_bytes());
        }
        cap = u64::from(hdr[1] & !3);
    }
    Err(AccessError::NoMsixCapability)
}

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
