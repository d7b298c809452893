//! How the driver reaches a device: every backend implements `crate::access::DeviceAccess`.

pub mod mmio;
pub mod vfio;
pub mod vfio_user;

use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::access::{pci, AccessError, DeviceAccess, DeviceIdentity, Result};
use crate::dma::DmaMemory;

// The checks and the identity every backend shares, written once.

/// A register access: the BAR exists (`size` is its size), `[offset, offset + width)` lies inside it, and the
/// access is naturally aligned.
pub fn check_register(bar: u32, size: Option<u64>, offset: u64, width: u64) -> Result<()> {
    let size = size.ok_or(AccessError::NoSuchBar(bar))?;
    if offset.checked_add(width).is_none_or(|end| end > size) || !offset.is_multiple_of(width) {
        return Err(AccessError::OutOfRange { what: "register access", bar, offset, size });
    }
    Ok(())
}

/// A DMA map of `[offset, offset + len)` of `mem` at `iova`: not empty, inside the memory, and not wrapping
/// the IOVA space.
pub fn check_dma_map(mem: &DmaMemory, offset: u64, len: u64, iova: u64) -> Result<()> {
    let inside = offset.checked_add(len).is_some_and(|e| e <= mem.len() as u64);
    if len == 0 || !inside || iova.checked_add(len).is_none() {
        return Err(AccessError::BadDmaMap { offset, len, iova });
    }
    Ok(())
}

/// `nvec` MSI-X vectors asked of a device that has `available`.
pub fn check_msix_vectors(nvec: u32, available: u32) -> Result<()> {
    if nvec == 0 || nvec > available {
        return Err(AccessError::MsixVectors { requested: nvec, available });
    }
    Ok(())
}

/// A device's identity: vendor and device ID from config space (all-ones when it cannot be read, as a
/// missing device reads), and its BARs as (index, size, mapped).
pub fn identity(
    backend: &'static str,
    config_ids: Result<[u8; 4]>,
    bars: impl Iterator<Item = (u32, u64, bool)>,
    msix_vectors: u32,
) -> DeviceIdentity {
    let ids = config_ids.unwrap_or([0xff; 4]);
    let bars: Vec<(u32, u64, bool)> = bars.collect();
    DeviceIdentity {
        vendor_id: u16::from_le_bytes([ids[0], ids[1]]),
        device_id: u16::from_le_bytes([ids[2], ids[3]]),
        bars: bars.iter().map(|(i, size, _)| (*i, *size)).collect(),
        msix_vectors,
        backend,
        mapped_bars: bars.iter().filter(|(_, _, mapped)| *mapped).map(|(i, _, _)| *i).collect(),
    }
}

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
