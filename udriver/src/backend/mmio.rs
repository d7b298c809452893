//! A BAR (or part of one) mapped into our address space: register access without a trap.
//!
//! The only `unsafe` of the backends: one shared mapping per `MappedBar`, bounds and alignment checked
//! before every access, which is a `volatile::VolatilePtr` read or write (never a Rust reference).

use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

use volatile::VolatilePtr;

use crate::access::{AccessError, Result};

pub struct MappedBar {
    ptr: NonNull<u8>,
    len: usize,
    /// Offset of the mapping inside the BAR (sparse areas need not start at 0).
    bar_offset: u64,
}

// SAFETY: the mapping is device memory (or memory shared with the device model) accessed only through
// volatile loads and stores of naturally aligned words; concurrent access from threads is how registers
// are used.
unsafe impl Send for MappedBar {}
// SAFETY: as above.
unsafe impl Sync for MappedBar {}

impl MappedBar {
    /// Maps `len` bytes of `fd` at `fd_offset`, standing for BAR bytes `[bar_offset, bar_offset + len)`.
    pub fn new(fd: BorrowedFd<'_>, fd_offset: u64, len: u64, bar_offset: u64) -> Result<Self> {
        use rustix::mm::{mmap, MapFlags, ProtFlags};
        let len_usize = usize::try_from(len).map_err(|_| AccessError::BadBarArea { len, fd_offset })?;
        if len_usize == 0 || !fd_offset.is_multiple_of(4096) {
            return Err(AccessError::BadBarArea { len, fd_offset });
        }
        // SAFETY: a new shared mapping chosen by the kernel (no fixed address), so it aliases nothing in
        // this process; it is unmapped once in Drop.
        let ptr = unsafe {
            mmap(std::ptr::null_mut(), len_usize, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd, fd_offset)
        }
        .map_err(|e| AccessError::Io { op: "mmap BAR", source: e.into() })?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(AccessError::BadBarArea { len, fd_offset })?;
        Ok(Self { ptr, len: len_usize, bar_offset })
    }

    /// Whether `[offset, offset + width)` of the BAR lies inside this mapping.
    pub fn covers(&self, offset: u64, width: u64) -> bool {
        offset >= self.bar_offset
            && offset.checked_add(width).is_some_and(|end| end <= self.bar_offset + self.len as u64)
    }

    /// The register of type `T` at BAR offset `offset`, after the bounds and alignment checks: the one place
    /// a pointer into the mapping is made.
    fn reg<T: Copy>(&self, bar: u32, offset: u64) -> Result<VolatilePtr<'_, T>> {
        let width = std::mem::size_of::<T>() as u64;
        if !self.covers(offset, width) || !offset.is_multiple_of(width) {
            return Err(AccessError::OutOfRange { what: "mapped access", bar, offset, size: self.len as u64 });
        }
        let rel = (offset - self.bar_offset) as usize;
        // SAFETY: `rel + width <= len` (checked by `covers`), so the pointer stays inside the mapping, which
        // lives as long as `self`; the mapping is page-aligned and `offset` a multiple of `width`, so the
        // pointer is aligned for `T`. Device memory is only ever reached through volatile accesses.
        Ok(unsafe { VolatilePtr::new(self.ptr.add(rel).cast::<T>()) })
    }

    pub fn read32(&self, bar: u32, offset: u64) -> Result<u32> {
        Ok(u32::from_le(self.reg::<u32>(bar, offset)?.read()))
    }
    pub fn write32(&self, bar: u32, offset: u64, value: u32) -> Result<()> {
        self.reg::<u32>(bar, offset)?.write(value.to_le());
        Ok(())
    }
    pub fn read64(&self, bar: u32, offset: u64) -> Result<u64> {
        Ok(u64::from_le(self.reg::<u64>(bar, offset)?.read()))
    }
    pub fn write64(&self, bar: u32, offset: u64, value: u64) -> Result<()> {
        self.reg::<u64>(bar, offset)?.write(value.to_le());
        Ok(())
    }
}

impl Drop for MappedBar {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`, once.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn mapped_access_checks_bounds_and_alignment() {
        let fd = rustix::fs::memfd_create("bar", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 8192).unwrap();
        let bar = MappedBar::new(fd.as_fd(), 4096, 4096, 0x10000).unwrap();
        bar.write64(0, 0x10008, 0xdead_beef_0000_0001).unwrap();
        assert_eq!(bar.read64(0, 0x10008).unwrap(), 0xdead_beef_0000_0001);
        assert_eq!(bar.read32(0, 0x1000c).unwrap(), 0xdead_beef);
        assert!(matches!(bar.read64(0, 0x10004), Err(AccessError::OutOfRange { .. })));
        assert!(matches!(bar.read32(0, 0xfffc), Err(AccessError::OutOfRange { .. })));
        assert!(matches!(bar.write32(0, 0x11000, 0), Err(AccessError::OutOfRange { .. })));
        assert!(matches!(bar.read64(0, u64::MAX - 3), Err(AccessError::OutOfRange { .. })));
    }
}
