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

    /// Whether all of `[base, limit)`, the range it was made with, is free again.
    pub fn is_unused(&self, base: u64, limit: u64) -> bool {
        match limit.checked_sub(base) {
            Some(len) if len > 0 => self.free.len() == 1 && self.free.get(&base) == Some(&len),
            _ => self.free.is_empty(),
        }
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
///
/// By default every buffer has its own memfd and mapping, so a device access past a buffer's end hits an
/// unmapped IOVA and fails where it happens: what a driver under test wants. A pool made with
/// [`DmaPool::sub_allocating`] carves small contiguous buffers out of shared 2 MiB slabs instead (one memfd,
/// one mapping each), for clients that need many buffers over a transport that limits files: the vfio-user
/// server mmaps at most 64 files per client and serves the rest by messages (docs/bench.md, "Scale").
/// A pool made with [`DmaPool::recycling`] keeps released memory for the next buffer of its size.
pub struct DmaPool {
    dev: Arc<dyn DeviceAccess>,
    iova: Mutex<IovaAllocator>,
    try_huge: bool,
    /// `None`: no sub-allocation.
    slabs: Option<Mutex<Vec<Slab>>>,
    /// `None`: released memory is unmapped and closed. `Some`: at most [`MAX_SPARE`] released memories,
    /// kept for reuse.
    spare: Option<Mutex<Vec<DmaMemory>>>,
}

/// Most released memories a recycling pool keeps.
pub const MAX_SPARE: usize = 16;

/// One shared memfd mapped once; its pages are handed out by IOVA.
struct Slab {
    mem: Arc<DmaMemory>,
    iova: u64,
    free: IovaAllocator,
    /// Buffers handed out and not released: the slab is unmapped when the last goes.
    live: usize,
}

/// Bytes of a slab, and the largest buffer taken from one.
pub const SLAB_SIZE: u64 = 2 << 20;
pub const SLAB_MAX_BUFFER: u64 = 64 << 10;

/// Where the driver's IOVAs start; below it stays unused so a stray zero address faults.
pub const IOVA_BASE: u64 = 0x1_0000_0000;
pub const IOVA_LIMIT: u64 = 0x100_0000_0000;

impl DmaPool {
    pub fn new(dev: Arc<dyn DeviceAccess>, try_huge: bool) -> Self {
        Self { dev, iova: Mutex::new(IovaAllocator::new(IOVA_BASE, IOVA_LIMIT)), try_huge, slabs: None, spare: None }
    }

    /// A pool that keeps the memory (memfd and mapping) of released contiguous buffers and hands it out
    /// again, zeroed, to the next contiguous buffer of the same page count: no memfd, mmap, munmap and close
    /// per buffer. Only for a device that lets go of memory once it is unmapped, one in this process (the
    /// kernel diff's passive fake): a device that kept its mapping would see the memory's next user.
    pub fn recycling(dev: Arc<dyn DeviceAccess>) -> Self {
        Self { spare: Some(Mutex::new(Vec::new())), ..Self::new(dev, false) }
    }

    /// Whether every buffer has been released: no IOVA is in use, so the next buffers get the IOVAs the
    /// first ones got (a pool kept across runs then starts each from the same state).
    pub fn is_idle(&self) -> bool {
        self.iova.lock().unpoison().is_unused(IOVA_BASE, IOVA_LIMIT)
    }

    /// Spare memory of exactly `bytes`, zeroed, if a recycling pool has some.
    fn take_spare(&self, bytes: usize) -> Option<DmaMemory> {
        let mut spare = self.spare.as_ref()?.lock().unpoison();
        let i = spare.iter().position(|m| m.len() == bytes)?;
        let mut mem = spare.remove(i);
        mem.zero_unshared();
        Some(mem)
    }

    /// Keeps released memory no device maps any more, if this pool recycles; the oldest spare makes room.
    fn keep_spare(&self, mem: Arc<DmaMemory>) {
        let Some(spare) = &self.spare else { return };
        // Unshared: no other buffer (a slab's) holds it.
        let Ok(mem) = Arc::try_unwrap(mem) else { return };
        let mut spare = spare.lock().unpoison();
        if spare.len() >= MAX_SPARE {
            spare.remove(0);
        }
        spare.push(mem);
    }

    /// A pool whose contiguous buffers of at most [`SLAB_MAX_BUFFER`] share [`SLAB_SIZE`] slabs.
    pub fn sub_allocating(dev: Arc<dyn DeviceAccess>, try_huge: bool) -> Self {
        Self { slabs: Some(Mutex::new(Vec::new())), ..Self::new(dev, try_huge) }
    }

    /// A zeroed buffer from a slab with room, or from a new slab (`bytes` is at most SLAB_MAX_BUFFER).
    fn alloc_from_slab(&self, slabs: &Mutex<Vec<Slab>>, len: usize, bytes: u64) -> Result<DmaBuffer, DmaMemError> {
        let mut slabs = slabs.lock().unpoison();
        let found = slabs.iter_mut().enumerate().find_map(|(i, s)| s.free.alloc(bytes).map(|iova| (i, iova)));
        let (i, iova) = match found {
            Some(f) => f,
            None => {
                // Fresh memfd pages are zero; the buffer takes the slab's first bytes.
                let mem = Arc::new(DmaMemory::new(SLAB_SIZE as usize, self.try_huge)?);
                let base = self.alloc_iova(SLAB_SIZE)?;
                if let Err(e) = self.dev.dma_map(&mem, 0, SLAB_SIZE, base) {
                    self.iova.lock().unpoison().free(base, SLAB_SIZE);
                    return Err(e.into());
                }
                let free = IovaAllocator::new(base + bytes, base + SLAB_SIZE);
                slabs.push(Slab { mem, iova: base, free, live: 0 });
                (slabs.len() - 1, base)
            }
        };
        let slab = &mut slabs[i];
        slab.live += 1;
        Ok(DmaBuffer {
            origin: Origin::Slab,
            mem: slab.mem.clone(),
            base: (iova - slab.iova) as usize,
            len,
            pages: (0..bytes / PAGE_SIZE).map(|p| iova + p * PAGE_SIZE).collect(),
            maps: Vec::new(),
        })
    }

    /// Gives a slab buffer's pages back, zeroed for their next user; unmaps and frees the slab with its last
    /// buffer.
    fn release_to_slab(&self, iova: u64, bytes: u64) {
        let Some(slabs) = &self.slabs else { return };
        let mut slabs = slabs.lock().unpoison();
        let Some(i) = slabs.iter().position(|s| iova >= s.iova && iova < s.iova + SLAB_SIZE) else { return };
        let slab = &mut slabs[i];
        slab.live -= 1;
        if slab.live > 0 {
            // In bounds: the range came from this slab. Should it fail, the pages stay out of use.
            if slab.mem.fill((iova - slab.iova) as usize, bytes as usize, 0).is_ok() {
                slab.free.free(iova, bytes);
            }
        } else {
            let slab = slabs.swap_remove(i);
            let _ = self.dev.dma_unmap(slab.iova, SLAB_SIZE);
            self.iova.lock().unpoison().free(slab.iova, SLAB_SIZE);
        }
    }

    fn alloc_iova(&self, len: u64) -> Result<u64, DmaMemError> {
        self.iova.lock().unpoison().alloc(len).ok_or(DmaMemError::IovaExhausted(len))
    }

    /// A buffer whose pages are contiguous in IOVA space (one mapping).
    pub fn alloc_contiguous(&self, len: usize) -> Result<DmaBuffer, DmaMemError> {
        let npages = (len.max(1) as u64).div_ceil(PAGE_SIZE);
        if let Some(slabs) = &self.slabs {
            if npages * PAGE_SIZE <= SLAB_MAX_BUFFER {
                return self.alloc_from_slab(slabs, len, npages * PAGE_SIZE);
            }
        }
        let iova = self.alloc_iova(npages * PAGE_SIZE)?;
        let mem = match self.take_spare((npages * PAGE_SIZE) as usize) {
            Some(m) => Arc::new(m),
            None => match DmaMemory::new(len, self.try_huge) {
                Ok(m) => Arc::new(m),
                Err(e) => {
                    self.iova.lock().unpoison().free(iova, npages * PAGE_SIZE);
                    return Err(e);
                }
            },
        };
        if let Err(e) = self.dev.dma_map(&mem, 0, npages * PAGE_SIZE, iova) {
            self.iova.lock().unpoison().free(iova, npages * PAGE_SIZE);
            return Err(e.into());
        }
        Ok(DmaBuffer {
            origin: Origin::Maps,
            mem,
            base: 0,
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
        Ok(DmaBuffer { origin: Origin::Span { base, span }, mem, base: 0, len, pages, maps })
    }

    pub fn device(&self) -> &Arc<dyn DeviceAccess> {
        &self.dev
    }
}

/// What a buffer gives back on release.
enum Origin {
    /// Its own mappings' IOVA ranges.
    Maps,
    /// An IOVA span (its runs and the guard pages between them).
    Span { base: u64, span: u64 },
    /// Its pages in a slab.
    Slab,
}

/// A DMA buffer: CPU-contiguous memory plus the IOVA of each 4 KiB page.
pub struct DmaBuffer {
    origin: Origin,
    mem: Arc<DmaMemory>,
    /// Where the buffer starts in `mem` (non-zero in a slab).
    base: usize,
    len: usize,
    pages: Vec<u64>,
    /// The device mappings this buffer made: (iova, len).
    maps: Vec<(u64, u64)>,
}

impl DmaBuffer {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The CPU address of byte 0.
    pub fn addr(&self) -> u64 {
        self.mem.addr() + self.base as u64
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
        self.mem.read(self.base + offset, buf)
    }
    pub fn write(&self, offset: usize, buf: &[u8]) -> Result<(), DmaMemError> {
        self.bound(offset, buf.len())?;
        self.mem.write(self.base + offset, buf)
    }
    pub fn read_u64(&self, offset: usize) -> Result<u64, DmaMemError> {
        self.bound(offset, 8)?;
        self.mem.read_u64(self.base + offset)
    }
    pub fn write_u64(&self, offset: usize, value: u64) -> Result<(), DmaMemError> {
        self.bound(offset, 8)?;
        self.mem.write_u64(self.base + offset, value)
    }
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), DmaMemError> {
        self.bound(offset, len)?;
        self.mem.fill(self.base + offset, len, byte)
    }
    fn bound(&self, offset: usize, len: usize) -> Result<(), DmaMemError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(DmaMemError::OutOfBounds { offset, len, size: self.len }),
        }
    }
    /// Unmaps the buffer from the device and gives its IOVA back.
    pub fn release(self, pool: &DmaPool) {
        let mut unmapped = true;
        for (iova, len) in &self.maps {
            unmapped &= pool.dev.dma_unmap(*iova, *len).is_ok();
        }
        match self.origin {
            Origin::Maps => {
                {
                    let mut alloc = pool.iova.lock().unpoison();
                    for (iova, len) in &self.maps {
                        alloc.free(*iova, *len);
                    }
                }
                // Memory a device may still map is never handed to another buffer.
                if unmapped {
                    pool.keep_spare(self.mem);
                }
            }
            Origin::Span { base, span } => pool.iova.lock().unpoison().free(base, span),
            Origin::Slab => {
                if let Some(&first) = self.pages.first() {
                    pool.release_to_slab(first, self.pages.len() as u64 * PAGE_SIZE);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::irdma::testdev::FakeIrdma;

    #[test]
    fn small_buffers_of_a_sub_allocating_pool_share_one_mapping_and_keep_their_own_pages() {
        let dev = FakeIrdma::scripted();
        let pool = DmaPool::sub_allocating(dev.clone(), false);
        let bufs: Vec<DmaBuffer> = [100, 4096, 8192, SLAB_MAX_BUFFER as usize]
            .iter()
            .map(|&len| pool.alloc_contiguous(len).unwrap())
            .collect();
        assert_eq!(dev.mapped(), 1, "one slab");
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.pages().iter().all(|p| p % PAGE_SIZE == 0));
            assert!(b.pages().windows(2).all(|w| w[1] == w[0] + PAGE_SIZE), "contiguous in IOVA");
            b.write_u64(0, 0x1111 * (i as u64 + 1)).unwrap();
        }
        // Each buffer's first qword is where its IOVA says, as the device sees it.
        for (i, b) in bufs.iter().enumerate() {
            assert_eq!(dev.dma_read_u64(b.iova(0).unwrap()), 0x1111 * (i as u64 + 1));
        }
        let mut pages: Vec<u64> = bufs.iter().flat_map(|b| b.pages().to_vec()).collect();
        let n = pages.len();
        pages.sort_unstable();
        pages.dedup();
        assert_eq!(pages.len(), n, "no page handed out twice");
        // Past the limit, a buffer has its own mapping again.
        let big = pool.alloc_contiguous(SLAB_MAX_BUFFER as usize + 1).unwrap();
        assert_eq!(dev.mapped(), 2);
        big.release(&pool);
        for b in bufs {
            b.release(&pool);
        }
        assert_eq!(dev.mapped(), 0, "the slab goes with its last buffer");
    }

    #[test]
    fn a_reused_slab_range_reads_zero_and_the_default_pool_maps_each_buffer() {
        let dev = FakeIrdma::scripted();
        let pool = DmaPool::sub_allocating(dev.clone(), false);
        let keep = pool.alloc_contiguous(64).unwrap();
        let a = pool.alloc_contiguous(4096).unwrap();
        let at = a.iova(0).unwrap();
        a.fill(0, 4096, 0xEE).unwrap();
        a.release(&pool);
        let b = pool.alloc_contiguous(4096).unwrap();
        assert_eq!(b.iova(0), Some(at), "first fit reuses the range");
        let mut data = vec![1u8; 4096];
        b.read(0, &mut data).unwrap();
        assert!(data.iter().all(|&x| x == 0));
        b.release(&pool);
        keep.release(&pool);

        let plain = DmaPool::new(dev.clone(), false);
        let (x, y) = (plain.alloc_contiguous(64).unwrap(), plain.alloc_contiguous(64).unwrap());
        assert_eq!(dev.mapped(), 2);
        x.release(&plain);
        y.release(&plain);
        assert_eq!(dev.mapped(), 0);
    }

    /// A device whose unmaps fail while `fail` is set (and then leave the mapping in place).
    struct FailingUnmap {
        inner: Arc<FakeIrdma>,
        fail: std::sync::atomic::AtomicBool,
    }

    impl DeviceAccess for FailingUnmap {
        fn identity(&self) -> crate::access::DeviceIdentity {
            self.inner.identity()
        }
        fn read32(&self, bar: u32, offset: u64) -> crate::access::Result<u32> {
            self.inner.read32(bar, offset)
        }
        fn write32(&self, bar: u32, offset: u64, value: u32) -> crate::access::Result<()> {
            self.inner.write32(bar, offset, value)
        }
        fn read64(&self, bar: u32, offset: u64) -> crate::access::Result<u64> {
            self.inner.read64(bar, offset)
        }
        fn write64(&self, bar: u32, offset: u64, value: u64) -> crate::access::Result<()> {
            self.inner.write64(bar, offset, value)
        }
        fn dma_map(&self, mem: &Arc<DmaMemory>, offset: u64, len: u64, iova: u64) -> crate::access::Result<()> {
            self.inner.dma_map(mem, offset, len, iova)
        }
        fn dma_unmap(&self, iova: u64, len: u64) -> crate::access::Result<()> {
            if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(crate::access::AccessError::Io {
                    op: "dma_unmap",
                    source: std::io::Error::from_raw_os_error(libc::EIO),
                });
            }
            self.inner.dma_unmap(iova, len)
        }
        fn enable_msix(&self, nvec: u32) -> crate::access::Result<()> {
            self.inner.enable_msix(nvec)
        }
        fn wait_irq(&self, vector: u32, timeout: std::time::Duration) -> crate::access::Result<bool> {
            self.inner.wait_irq(vector, timeout)
        }
    }

    #[test]
    fn a_recycling_pool_never_keeps_memory_whose_unmap_failed() {
        let dev = Arc::new(FailingUnmap { inner: FakeIrdma::scripted(), fail: true.into() });
        let pool = DmaPool::recycling(dev.clone());
        let spares = |pool: &DmaPool| pool.spare.as_ref().map(|s| s.lock().unpoison().len());
        let a = pool.alloc_contiguous(4096).unwrap();
        a.release(&pool);
        assert_eq!(spares(&pool), Some(0), "the device may still map it: not kept for another buffer");
        assert_eq!(dev.inner.mapped(), 1, "the failed unmap left the mapping");
        dev.fail.store(false, std::sync::atomic::Ordering::Relaxed);
        let b = pool.alloc_contiguous(4096).unwrap();
        b.release(&pool);
        assert_eq!(spares(&pool), Some(1), "an unmapped one is kept");
    }

    #[test]
    fn a_recycling_pool_gives_released_memory_to_the_next_buffer_of_its_size_zeroed() {
        let dev = FakeIrdma::scripted();
        let pool = DmaPool::recycling(dev.clone());
        assert!(pool.is_idle());
        let a = pool.alloc_contiguous(100).unwrap();
        let (addr, iova) = (a.addr(), a.iova(0));
        a.fill(0, 100, 0xEE).unwrap();
        assert!(!pool.is_idle(), "a buffer is out");
        a.release(&pool);
        assert!(pool.is_idle());
        assert_eq!(dev.mapped(), 0, "released memory is unmapped from the device");

        let other = pool.alloc_contiguous(2 * PAGE_SIZE as usize).unwrap();
        assert_ne!(other.addr(), addr, "two pages do not reuse one");
        let b = pool.alloc_contiguous(4096).unwrap();
        assert_eq!(b.addr(), addr, "the same page count reuses the memory");
        let mut data = vec![1u8; 4096];
        b.read(0, &mut data).unwrap();
        assert!(data.iter().all(|&x| x == 0), "handed out zeroed");
        assert_ne!(b.iova(0), iova, "a new IOVA: the first one now belongs to the two-page buffer");
        assert_eq!(dev.mapped(), 2);
        other.release(&pool);
        b.release(&pool);
        assert!(pool.is_idle());
    }

    #[test]
    fn a_pool_is_idle_only_when_every_iova_is_back() {
        let dev = FakeIrdma::scripted();
        let pool = DmaPool::new(dev.clone(), false);
        let a = pool.alloc_contiguous(64).unwrap();
        let f = pool.alloc_fragmented(&[1, 2]).unwrap();
        assert!(!pool.is_idle());
        a.release(&pool);
        assert!(!pool.is_idle(), "the fragmented buffer's span is still out");
        f.release(&pool);
        assert!(pool.is_idle());
        // (range, lengths taken from it, whether it is all free)
        let cases: [(u64, u64, &[u64], bool); 4] = [
            (0x1000, 0x3000, &[], true),
            (0x1000, 0x3000, &[0x1000], false),
            (0x1000, 0x3000, &[0x1000, 0x1000], false),
            (0x1000, 0x1000, &[], true),
        ];
        for (base, limit, taken, unused) in cases {
            let mut alloc = IovaAllocator::new(base, limit);
            for len in taken {
                assert!(alloc.alloc(*len).is_some());
            }
            assert_eq!(alloc.is_unused(base, limit), unused, "[{base:#x}, {limit:#x}) with {taken:?} taken");
        }
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
