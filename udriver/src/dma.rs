//! DMA memory: memfd-backed shared mappings, an IOVA allocator, and buffers that are either contiguous
//! or deliberately fragmented in IOVA space (so both TID page-set finders get real work).
//!
//! `DmaMemory` is the only type here with `unsafe`: it owns one mmap of a memfd and checks bounds
//! before every access. The device may write the memory at any time (it is shared with another
//! process or thread), so every access is volatile and no Rust reference ever points into it.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use thiserror::Error;

use crate::access::{AccessError, DeviceAccess};

pub const PAGE_SIZE: u64 = 4096;
const HUGE_PAGE_SIZE: usize = 2 << 20;

#[derive(Debug, Error)]
pub enum DmaMemError {
    #[error("cannot create DMA memory of {len} bytes: {source}")]
    Create { len: usize, source: std::io::Error },
    #[error("access {offset:#x}+{len:#x} is outside DMA memory of {size:#x} bytes")]
    OutOfBounds { offset: usize, len: usize, size: usize },
    #[error("IOVA space exhausted allocating {0:#x} bytes")]
    IovaExhausted(u64),
    #[error("mapping for DMA failed: {0}")]
    Map(#[from] AccessError),
}

impl DmaMemError {
    pub fn to_errno(&self) -> i32 {
        match self {
            DmaMemError::Map(e) => e.to_errno(),
            DmaMemError::OutOfBounds { .. } => -libc::EINVAL,
            _ => -libc::ENOMEM,
        }
    }
}

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

    /// A second mapping of the same file: shares the pages, outlives `other`. An in-process device model
    /// holds one so its view of the driver's memory never dangles.
    pub fn alias(other: &DmaMemory) -> Result<Self, DmaMemError> {
        let fd = other.fd.try_clone().map_err(|e| DmaMemError::Create { len: other.len, source: e })?;
        Self::map(fd, other.len, other.huge)
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn is_huge(&self) -> bool {
        self.huge
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

    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), DmaMemError> {
        self.check(offset, buf.len())?;
        // SAFETY: the range is inside the mapping (checked above); volatile byte reads of shared memory.
        for (i, b) in buf.iter_mut().enumerate() {
            *b = unsafe { self.ptr.as_ptr().add(offset + i).read_volatile() };
        }
        Ok(())
    }

    pub fn write(&self, offset: usize, buf: &[u8]) -> Result<(), DmaMemError> {
        self.check(offset, buf.len())?;
        // SAFETY: the range is inside the mapping (checked above); volatile byte writes to shared memory.
        for (i, b) in buf.iter().enumerate() {
            unsafe { self.ptr.as_ptr().add(offset + i).write_volatile(*b) };
        }
        Ok(())
    }

    /// One aligned 64-bit volatile load (descriptor qwords are read whole, never torn).
    pub fn read_u64(&self, offset: usize) -> Result<u64, DmaMemError> {
        self.check(offset, 8)?;
        if offset % 8 != 0 {
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
        if offset % 8 != 0 {
            return self.write(offset, &value.to_le_bytes());
        }
        // SAFETY: in bounds and 8-byte aligned (the mapping is page-aligned).
        unsafe { self.ptr.as_ptr().add(offset).cast::<u64>().write_volatile(value.to_le()) };
        Ok(())
    }

    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), DmaMemError> {
        self.check(offset, len)?;
        for i in 0..len {
            // SAFETY: in bounds (checked above).
            unsafe { self.ptr.as_ptr().add(offset + i).write_volatile(byte) };
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

/// Hands out page-aligned IOVA ranges from `[base, limit)`, first fit, with coalescing frees.
#[derive(Debug)]
pub struct IovaAllocator {
    /// Free ranges: start -> length, non-overlapping and non-adjacent.
    free: std::collections::BTreeMap<u64, u64>,
}

impl IovaAllocator {
    pub fn new(base: u64, limit: u64) -> Self {
        let mut free = std::collections::BTreeMap::new();
        if limit > base {
            free.insert(base, limit - base);
        }
        Self { free }
    }

    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = len.checked_next_multiple_of(PAGE_SIZE)?.max(PAGE_SIZE);
        let (&start, &flen) = self.free.iter().find(|(_, l)| **l >= len)?;
        self.free.remove(&start);
        if flen > len {
            self.free.insert(start + len, flen - len);
        }
        Some(start)
    }

    pub fn free(&mut self, start: u64, len: u64) {
        let Some(len) = len.checked_next_multiple_of(PAGE_SIZE) else { return };
        let (mut s, mut l) = (start, len.max(PAGE_SIZE));
        if let Some((&ps, &pl)) = self.free.range(..s).next_back() {
            if ps + pl == s {
                self.free.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(s + l)) {
            self.free.remove(&(s + l));
            l += nl;
        }
        self.free.insert(s, l);
    }
}

/// Allocates DMA buffers and maps them for one device.
pub struct DmaPool {
    dev: Arc<dyn DeviceAccess>,
    iova: Mutex<IovaAllocator>,
    try_huge: bool,
}

/// Where the driver's IOVAs start; below it stays unused so a stray zero address faults.
pub const IOVA_BASE: u64 = 0x1_0000_0000;
pub const IOVA_LIMIT: u64 = 0x100_0000_0000;

impl DmaPool {
    pub fn new(dev: Arc<dyn DeviceAccess>, try_huge: bool) -> Self {
        Self { dev, iova: Mutex::new(IovaAllocator::new(IOVA_BASE, IOVA_LIMIT)), try_huge }
    }

    fn alloc_iova(&self, len: u64) -> Result<u64, DmaMemError> {
        self.iova.lock().unwrap_or_else(|e| e.into_inner()).alloc(len).ok_or(DmaMemError::IovaExhausted(len))
    }

    /// A buffer whose pages are contiguous in IOVA space (one mapping).
    pub fn alloc_contiguous(&self, len: usize) -> Result<DmaBuffer, DmaMemError> {
        let mem = Arc::new(DmaMemory::new(len, self.try_huge)?);
        let npages = (len.max(1) as u64).div_ceil(PAGE_SIZE);
        let iova = self.alloc_iova(npages * PAGE_SIZE)?;
        if let Err(e) = self.dev.dma_map(&mem, 0, npages * PAGE_SIZE, iova) {
            self.iova.lock().unwrap_or_else(|e| e.into_inner()).free(iova, npages * PAGE_SIZE);
            return Err(e.into());
        }
        Ok(DmaBuffer {
            pool: None,
            mem,
            len,
            pages: (0..npages).map(|i| iova + i * PAGE_SIZE).collect(),
            maps: vec![(iova, npages * PAGE_SIZE)],
        })
    }

    /// A buffer that is contiguous for the CPU but whose pages sit in IOVA runs given by `runs`
    /// (page counts), each run separated from the next by an unmapped guard page. For example
    /// `[3, 1]` gives pages 0-2 contiguous and page 3 elsewhere.
    pub fn alloc_fragmented(&self, runs: &[u64]) -> Result<DmaBuffer, DmaMemError> {
        let npages: u64 = runs.iter().sum();
        let len = (npages * PAGE_SIZE) as usize;
        let mem = Arc::new(DmaMemory::new(len, false)?);
        let span = (npages + runs.len() as u64) * PAGE_SIZE;
        let base = self.alloc_iova(span)?;
        let mut pages = Vec::with_capacity(npages as usize);
        let mut maps = Vec::new();
        // Runs go downwards from the top of the span, each followed by an unmapped guard page, so no
        // two consecutive runs are adjacent in IOVA space in either direction.
        let (mut cursor, mut off) = (base + span, 0u64);
        for &run in runs.iter().filter(|r| **r > 0) {
            cursor -= (run + 1) * PAGE_SIZE;
            if let Err(e) = self.dev.dma_map(&mem, off, run * PAGE_SIZE, cursor) {
                for (i, l) in &maps {
                    let _ = self.dev.dma_unmap(*i, *l);
                }
                self.iova.lock().unwrap_or_else(|e| e.into_inner()).free(base, span);
                return Err(e.into());
            }
            maps.push((cursor, run * PAGE_SIZE));
            pages.extend((0..run).map(|i| cursor + i * PAGE_SIZE));
            off += run * PAGE_SIZE;
        }
        Ok(DmaBuffer { pool: None, mem, len, pages, maps }.with_span(base, span))
    }

    pub fn device(&self) -> &Arc<dyn DeviceAccess> {
        &self.dev
    }
}

/// A DMA buffer: CPU-contiguous memory plus the IOVA of each 4 KiB page.
pub struct DmaBuffer {
    /// (IOVA base, span) to give back to the allocator; set for fragmented buffers.
    pool: Option<(u64, u64)>,
    mem: Arc<DmaMemory>,
    len: usize,
    pages: Vec<u64>,
    /// The device mappings this buffer made: (iova, len).
    maps: Vec<(u64, u64)>,
}

impl DmaBuffer {
    fn with_span(mut self, base: u64, span: u64) -> Self {
        self.pool = Some((base, span));
        self
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn memory(&self) -> &DmaMemory {
        &self.mem
    }
    /// IOVA of each 4 KiB page, in CPU order.
    pub fn pages(&self) -> &[u64] {
        &self.pages
    }
    /// The IOVA of byte `offset`, if inside the buffer.
    pub fn iova(&self, offset: usize) -> Option<u64> {
        if offset >= self.len {
            return None;
        }
        let page = self.pages.get(offset / PAGE_SIZE as usize)?;
        Some(page + (offset as u64 % PAGE_SIZE))
    }
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), DmaMemError> {
        self.bound(offset, buf.len())?;
        self.mem.read(offset, buf)
    }
    pub fn write(&self, offset: usize, buf: &[u8]) -> Result<(), DmaMemError> {
        self.bound(offset, buf.len())?;
        self.mem.write(offset, buf)
    }
    pub fn read_u64(&self, offset: usize) -> Result<u64, DmaMemError> {
        self.bound(offset, 8)?;
        self.mem.read_u64(offset)
    }
    pub fn write_u64(&self, offset: usize, value: u64) -> Result<(), DmaMemError> {
        self.bound(offset, 8)?;
        self.mem.write_u64(offset, value)
    }
    fn bound(&self, offset: usize, len: usize) -> Result<(), DmaMemError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(DmaMemError::OutOfBounds { offset, len, size: self.len }),
        }
    }
    /// Unmaps the buffer from the device and gives its IOVA back.
    pub fn release(self, pool: &DmaPool) {
        for (iova, len) in &self.maps {
            let _ = pool.dev.dma_unmap(*iova, *len);
        }
        let mut alloc = pool.iova.lock().unwrap_or_else(|e| e.into_inner());
        match self.pool {
            Some((base, span)) => alloc.free(base, span),
            None => {
                for (iova, len) in &self.maps {
                    alloc.free(*iova, *len);
                }
            }
        }
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

    #[test]
    fn iova_allocator_coalesces_freed_ranges() {
        let mut a = IovaAllocator::new(0x10000, 0x14000);
        let x = a.alloc(0x1000).unwrap();
        let y = a.alloc(0x2000).unwrap();
        let z = a.alloc(0x1000).unwrap();
        assert_eq!((x, y, z), (0x10000, 0x11000, 0x13000));
        assert_eq!(a.alloc(0x1000), None);
        a.free(y, 0x2000);
        a.free(x, 0x1000);
        a.free(z, 0x1000);
        assert_eq!(a.alloc(0x4000), Some(0x10000));
    }
}
