//! `DmaMemory`, the only type of the driver's DMA code with `unsafe`: it owns one mmap of a memfd and checks
//! bounds before every access. The device may write the memory at any time (it is shared with another
//! process or thread), so every access through a shared reference is volatile and no Rust reference ever
//! points into it; only the owner, with `&mut`, zeroes it in one go for reuse (`zero_unshared`).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use crate::error::DmaMemError;

pub const PAGE_SIZE: u64 = 4096;
const HUGE_PAGE_SIZE: usize = 2 << 20;

/// One shared mapping of a memfd.
pub struct DmaMemory {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
    huge: bool,
}

// SAFETY: the mapping is plain shared memory; all access goes through volatile reads and writes with
// bounds checks, and the pointer is never handed out as a reference.
unsafe impl Send for DmaMemory {}
// SAFETY: as above; concurrent volatile accesses to shared memory are how DMA memory is used.
unsafe impl Sync for DmaMemory {}

impl DmaMemory {
    /// Allocates `len` bytes (rounded up to a page), from 2 MiB huge pages when `try_huge` and the
    /// system has them, else from normal pages.
    pub fn new(len: usize, try_huge: bool) -> Result<Self, DmaMemError> {
        use rustix::fs::{memfd_create, MemfdFlags};
        let page = PAGE_SIZE as usize;
        let len = len.max(1).div_ceil(page) * page;
        if try_huge {
            let huge_len = len.div_ceil(HUGE_PAGE_SIZE) * HUGE_PAGE_SIZE;
            if let Ok(fd) = memfd_create("udriver-dma-huge", MemfdFlags::CLOEXEC | MemfdFlags::HUGETLB) {
                if rustix::fs::ftruncate(&fd, huge_len as u64).is_ok() {
                    if let Ok(m) = Self::map(fd, huge_len, true) {
                        return Ok(m);
                    }
                }
            }
        }
        let fd = memfd_create("udriver-dma", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| DmaMemError::Create { len, source: e.into() })?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(|e| DmaMemError::Create { len, source: e.into() })?;
        // The device model maps this file; sealing it against shrinking means it can never fault.
        let _ = rustix::fs::fcntl_add_seals(&fd, rustix::fs::SealFlags::SHRINK);
        Self::map(fd, len, false)
    }

    fn map(fd: OwnedFd, len: usize, huge: bool) -> Result<Self, DmaMemError> {
        use rustix::mm::{mmap, MapFlags, ProtFlags};
        // SAFETY: a fresh shared mapping of a file we own, of exactly the file's length; nothing else in
        // this process aliases it, and it is unmapped once in Drop.
        let ptr =
            unsafe { mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &fd, 0) }
                .map_err(|e| DmaMemError::Create { len, source: e.into() })?;
        // Touch nothing yet: the kernel zero-fills on first access.
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or(DmaMemError::Create { len, source: std::io::Error::other("mmap returned NULL") })?;
        Ok(Self { fd, ptr, len, huge })
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The process virtual address of the mapping (what VFIO_IOMMU_MAP_DMA takes).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), DmaMemError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(DmaMemError::OutOfBounds { offset, len, size: self.len }),
        }
    }

    /// Splits `[offset, offset + len)` into a byte head up to an 8-byte boundary, whole aligned qwords and a
    /// byte tail: a volatile qword access per 8 bytes instead of eight byte accesses.
    fn spans(offset: usize, len: usize) -> (usize, usize) {
        let head = ((8 - offset % 8) % 8).min(len);
        (head, (len - head) / 8)
    }

    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), DmaMemError> {
        self.check(offset, buf.len())?;
        let (head, _) = Self::spans(offset, buf.len());
        let base = self.ptr.as_ptr();
        let (head_bytes, rest) = buf.split_at_mut(head);
        // Whole qwords as arrays: no slice length check or copy call per qword (this loop snapshots queue
        // memory for the kernel diff at every barrier, instrumented).
        let (qwords, tail_bytes) = rest.as_chunks_mut::<8>();
        for (i, b) in head_bytes.iter_mut().enumerate() {
            // SAFETY: the range is inside the mapping (checked above); volatile byte reads of shared memory.
            *b = unsafe { base.add(offset + i).read_volatile() };
        }
        let body = offset + head;
        for (q, chunk) in qwords.iter_mut().enumerate() {
            // SAFETY: inside the mapping (checked above) and 8-byte aligned (offset + head is, and the
            // mapping is page-aligned); a volatile qword load of shared memory.
            *chunk = unsafe { base.add(body + 8 * q).cast::<u64>().read_volatile() }.to_ne_bytes();
        }
        let tail = body + 8 * qwords.len();
        for (i, b) in tail_bytes.iter_mut().enumerate() {
            // SAFETY: the range is inside the mapping (checked above); volatile byte reads of shared memory.
            *b = unsafe { base.add(tail + i).read_volatile() };
        }
        Ok(())
    }

    pub fn write(&self, offset: usize, buf: &[u8]) -> Result<(), DmaMemError> {
        self.check(offset, buf.len())?;
        let (head, _) = Self::spans(offset, buf.len());
        let base = self.ptr.as_ptr();
        let (head_bytes, rest) = buf.split_at(head);
        let (qwords, tail_bytes) = rest.as_chunks::<8>();
        for (i, b) in head_bytes.iter().enumerate() {
            // SAFETY: the range is inside the mapping (checked above); volatile byte writes to shared memory.
            unsafe { base.add(offset + i).write_volatile(*b) };
        }
        let body = offset + head;
        for (q, chunk) in qwords.iter().enumerate() {
            // SAFETY: inside the mapping (checked above) and 8-byte aligned (offset + head is, and the
            // mapping is page-aligned); a volatile qword store to shared memory.
            unsafe { base.add(body + 8 * q).cast::<u64>().write_volatile(u64::from_ne_bytes(*chunk)) };
        }
        let tail = body + 8 * qwords.len();
        for (i, b) in tail_bytes.iter().enumerate() {
            // SAFETY: the range is inside the mapping (checked above); volatile byte writes to shared memory.
            unsafe { base.add(tail + i).write_volatile(*b) };
        }
        Ok(())
    }

    /// One aligned 64-bit volatile load (descriptor qwords are read whole, never torn).
    pub fn read_u64(&self, offset: usize) -> Result<u64, DmaMemError> {
        self.check(offset, 8)?;
        if !offset.is_multiple_of(8) {
            let mut b = [0u8; 8];
            self.read(offset, &mut b)?;
            return Ok(u64::from_le_bytes(b));
        }
        // SAFETY: in bounds and 8-byte aligned (the mapping is page-aligned).
        Ok(u64::from_le(unsafe { self.ptr.as_ptr().add(offset).cast::<u64>().read_volatile() }))
    }

    /// One aligned 64-bit volatile store (a WQE header qword lands in one piece).
    pub fn write_u64(&self, offset: usize, value: u64) -> Result<(), DmaMemError> {
        self.check(offset, 8)?;
        if !offset.is_multiple_of(8) {
            return self.write(offset, &value.to_le_bytes());
        }
        // SAFETY: in bounds and 8-byte aligned (the mapping is page-aligned).
        unsafe { self.ptr.as_ptr().add(offset).cast::<u64>().write_volatile(value.to_le()) };
        Ok(())
    }

    /// Zeroes the whole mapping with one `memset`, for memory no device holds a mapping of any more (a
    /// recycling pool's spare memory, unmapped from its device and owned by the pool alone): nothing else
    /// accesses it meanwhile, so the stores need not be volatile, and a page of instrumented qword stores cost
    /// the fuzz targets more than a fresh memfd.
    pub(super) fn zero_unshared(&mut self) {
        // SAFETY: the whole mapping, owned by this value, reached through `&mut self`: no other reference of
        // this process points into it, and the pool keeps only memory every device mapping of which was
        // removed (DmaPool::keep_spare).
        unsafe { self.ptr.as_ptr().write_bytes(0, self.len) };
    }

    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), DmaMemError> {
        self.check(offset, len)?;
        let (head, qwords) = Self::spans(offset, len);
        let base = self.ptr.as_ptr();
        for i in (0..head).chain(head + 8 * qwords..len) {
            // SAFETY: in bounds (checked above).
            unsafe { base.add(offset + i).write_volatile(byte) };
        }
        let v = u64::from_ne_bytes([byte; 8]);
        for q in 0..qwords {
            // SAFETY: in bounds (checked above) and 8-byte aligned (offset + head is, and the mapping is
            // page-aligned).
            unsafe { base.add(offset + head + 8 * q).cast::<u64>().write_volatile(v) };
        }
        Ok(())
    }
}

impl Drop for DmaMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping was created in `map` with this pointer and length and is unmapped once.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl std::fmt::Debug for DmaMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaMemory")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("huge", &self.huge)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_bounds_are_checked_before_access() {
        let m = DmaMemory::new(4096, false).unwrap();
        assert!(matches!(m.write(4090, &[0; 8]), Err(DmaMemError::OutOfBounds { .. })));
        assert!(matches!(m.read_u64(usize::MAX - 3), Err(DmaMemError::OutOfBounds { .. })));
        m.write_u64(8, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(m.read_u64(8).unwrap(), 0x1122_3344_5566_7788);
    }

    /// Byte heads and tails around whole qwords, at every alignment: each byte lands where it was asked and
    /// nothing around it changes.
    #[test]
    fn unaligned_reads_writes_and_fills_touch_exactly_their_bytes() {
        let m = DmaMemory::new(4096, false).unwrap();
        let cases: [(usize, usize); 8] = [(0, 0), (0, 8), (1, 7), (3, 1), (5, 16), (7, 9), (8, 64), (4093, 3)];
        for (offset, len) in cases {
            m.fill(0, 4096, 0xAA).unwrap();
            let data: Vec<u8> = (0..len).map(|i| i as u8 ^ 0x5C).collect();
            m.write(offset, &data).unwrap();
            let mut all = vec![0u8; 4096];
            m.read(0, &mut all).unwrap();
            let mut want = vec![0xAAu8; 4096];
            want[offset..offset + len].copy_from_slice(&data);
            assert_eq!(all, want, "write of {len} at {offset}");
            let mut back = vec![0u8; len];
            m.read(offset, &mut back).unwrap();
            assert_eq!(back, data, "read of {len} at {offset}");
            m.fill(offset, len, 0x11).unwrap();
            m.read(0, &mut all).unwrap();
            want[offset..offset + len].fill(0x11);
            assert_eq!(all, want, "fill of {len} at {offset}");
        }
    }
}
