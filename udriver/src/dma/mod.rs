//! DMA memory for the driver: memfd-backed shared mappings (`memory`), an IOVA allocator, and buffers that
//! are either contiguous or deliberately fragmented in IOVA space (so both TID page-set finders get real
//! work).

mod memory;

use std::sync::{Arc, Mutex};

use vfio_user_proto::sync::Unpoison;

pub use crate::error::DmaMemError;
pub use memory::{DmaMemory, PAGE_SIZE};

use crate::access::DeviceAccess;

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
        self.iova.lock().unpoison().alloc(len).ok_or(DmaMemError::IovaExhausted(len))
    }

    /// A buffer whose pages are contiguous in IOVA space (one mapping).
    pub fn alloc_contiguous(&self, len: usize) -> Result<DmaBuffer, DmaMemError> {
        let mem = Arc::new(DmaMemory::new(len, self.try_huge)?);
        let npages = (len.max(1) as u64).div_ceil(PAGE_SIZE);
        let iova = self.alloc_iova(npages * PAGE_SIZE)?;
        if let Err(e) = self.dev.dma_map(&mem, 0, npages * PAGE_SIZE, iova) {
            self.iova.lock().unpoison().free(iova, npages * PAGE_SIZE);
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
                self.iova.lock().unpoison().free(base, span);
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
        let mut alloc = pool.iova.lock().unpoison();
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
