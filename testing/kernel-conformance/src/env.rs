//! The shim's runtime for one device: what the kernel code's register accesses, DMA allocations, barriers,
//! delays and warnings become. Register access goes to a udriver `DeviceAccess` (BAR0), DMA memory comes
//! from a udriver `DmaPool`, so the same kernel code runs in-process, over vfio-user, or against a test
//! device.

#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use thiserror::Error;
use udriver::access::DeviceAccess;
use udriver::dma::{DmaBuffer, DmaPool};
use vfio_user_proto::sync::Unpoison;

use crate::ffi::{abi_matches, BarWindow};

/// irdma's BAR0 size (GLPCI_LBARCTRL.PE_DB_SIZE 8 MiB).
pub const IRDMA_BAR0_SIZE: usize = 8 << 20;

#[derive(Debug, Error)]
pub enum EnvError {
    #[error("cannot reserve the BAR window: {0}")]
    BarWindow(std::io::Error),
    #[error("the kernel code's C objects could not be allocated")]
    NoMemory,
    #[error("C and Rust disagree on the harness structures' sizes (rebuild both)")]
    Abi,
}

impl EnvError {
    pub fn to_errno(&self) -> i32 {
        match self {
            EnvError::BarWindow(e) => -e.raw_os_error().unwrap_or(libc::ENOMEM),
            EnvError::NoMemory => -libc::ENOMEM,
            EnvError::Abi => -libc::EINVAL,
        }
    }
}

/// Called at the kernel's `dma_wmb()` / `dma_rmb()`: where the differential tests look at queue memory.
pub trait BarrierObserver: Send + Sync {
    fn dma_wmb(&self);
    fn dma_rmb(&self) {}
}

/// What `udelay`/`mdelay` do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delays {
    /// Sleep at least the time asked for (a real device needs it).
    Real,
    /// Return at once: the device is a passive fake answering on the caller's thread (the differential
    /// tests), so a wait could change nothing but the run time.
    Skip,
}

pub struct ShimEnv {
    access: Arc<dyn DeviceAccess>,
    pool: Arc<DmaPool>,
    bar: BarWindow,
    delays: Delays,
    /// Live coherent allocations with their CPU addresses: a handful per function, so a list, scanned (a
    /// lookup per kernel memory access; a map's generic code cost the instrumented fuzz target more).
    buffers: Mutex<Vec<(usize, DmaBuffer)>>,
    observer: Mutex<Option<Arc<dyn BarrierObserver>>>,
    /// WARNs, traps and misuse the kernel code or the shim ran into; a test fails on any.
    bugs: Mutex<Vec<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unpoison()
}

impl ShimEnv {
    pub fn new(pool: Arc<DmaPool>, delays: Delays) -> Result<Arc<Self>, EnvError> {
        if !abi_matches() {
            return Err(EnvError::Abi);
        }
        let bar = BarWindow::new(IRDMA_BAR0_SIZE).map_err(EnvError::BarWindow)?;
        Ok(Arc::new(Self {
            access: pool.device().clone(),
            pool,
            bar,
            delays,
            buffers: Mutex::new(Vec::new()),
            observer: Mutex::new(None),
            bugs: Mutex::new(Vec::new()),
        }))
    }

    pub fn bar_base(&self) -> usize {
        self.bar.base()
    }
    pub fn access(&self) -> &Arc<dyn DeviceAccess> {
        &self.access
    }
    pub fn set_observer(&self, o: Option<Arc<dyn BarrierObserver>>) {
        *lock(&self.observer) = o;
    }

    /// Everything that went wrong so far (and clears it).
    pub fn take_bugs(&self) -> Vec<String> {
        std::mem::take(&mut lock(&self.bugs))
    }
    pub(crate) fn bug(&self, what: String) {
        tracing::error!(target: "kernel", "{what}");
        lock(&self.bugs).push(what);
    }

    fn reg(&self, addr: usize, width: usize, op: &str) -> Option<u64> {
        let off = self.bar.offset_of(addr, width);
        if off.is_none() {
            self.bug(format!("{op} of {addr:#x}, outside BAR0 [{:#x}, +{IRDMA_BAR0_SIZE:#x})", self.bar.base()));
        }
        off
    }

    /// A failed access reads all-ones, as a PCIe read of a vanished device does; it is also a bug here.
    pub(crate) fn mmio_read32(&self, addr: usize) -> u32 {
        let Some(off) = self.reg(addr, 4, "readl") else { return u32::MAX };
        self.access.read32(0, off).unwrap_or_else(|e| {
            self.bug(format!("readl BAR0+{off:#x}: {e}"));
            u32::MAX
        })
    }
    pub(crate) fn mmio_write32(&self, addr: usize, val: u32) {
        let Some(off) = self.reg(addr, 4, "writel") else { return };
        if let Err(e) = self.access.write32(0, off, val) {
            self.bug(format!("writel {val:#x} to BAR0+{off:#x}: {e}"));
        }
    }
    pub(crate) fn mmio_read64(&self, addr: usize) -> u64 {
        let Some(off) = self.reg(addr, 8, "readq") else { return u64::MAX };
        self.access.read64(0, off).unwrap_or_else(|e| {
            self.bug(format!("readq BAR0+{off:#x}: {e}"));
            u64::MAX
        })
    }
    pub(crate) fn mmio_write64(&self, addr: usize, val: u64) {
        let Some(off) = self.reg(addr, 8, "writeq") else { return };
        if let Err(e) = self.access.write64(0, off, val) {
            self.bug(format!("writeq {val:#x} to BAR0+{off:#x}: {e}"));
        }
    }

    /// `dma_alloc_coherent`: a contiguous pool buffer; the kernel gets its CPU address and IOVA.
    pub(crate) fn dma_alloc(&self, size: usize) -> Option<(usize, u64)> {
        let buf = match self.pool.alloc_contiguous(size.max(1)) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(target: "kernel", size, "dma_alloc_coherent failed: {e}");
                return None;
            }
        };
        let (va, iova) = (buf.addr() as usize, buf.iova(0)?);
        lock(&self.buffers).push((va, buf));
        Some((va, iova))
    }

    pub(crate) fn dma_free(&self, va: usize, size: usize, pa: u64) {
        let buf = {
            let mut bufs = lock(&self.buffers);
            bufs.iter().position(|(at, _)| *at == va).map(|i| bufs.swap_remove(i).1)
        };
        match buf {
            Some(b) if b.iova(0) == Some(pa) && b.len() >= size => b.release(&self.pool),
            Some(b) => {
                self.bug(format!("dma_free_coherent({va:#x}, {size:#x}, {pa:#x}) does not match the allocation"));
                lock(&self.buffers).push((va, b));
            }
            None => self.bug(format!("dma_free_coherent of {va:#x}, which is not allocated")),
        }
    }

    /// Live coherent allocations (a test checks that teardown freed them all).
    pub fn dma_allocations(&self) -> usize {
        lock(&self.buffers).len()
    }

    fn with_buffer<R>(&self, va: u64, len: usize, f: impl FnOnce(&DmaBuffer, usize) -> Option<R>) -> Option<R> {
        let va = usize::try_from(va).ok()?;
        let bufs = lock(&self.buffers);
        // Allocations never overlap: the one holding `va` is the only candidate.
        let (base, buf) = bufs.iter().find(|(base, b)| va >= *base && va - *base < b.len())?;
        let off = va - base;
        if off.checked_add(len)? > buf.len() {
            return None;
        }
        f(buf, off)
    }

    /// Reads kernel DMA memory by CPU address (what the kernel's pointers hold).
    pub fn read(&self, va: u64, out: &mut [u8]) -> bool {
        self.with_buffer(va, out.len(), |b, off| b.read(off, out).ok()).is_some()
    }
    pub fn read_u64(&self, va: u64) -> Option<u64> {
        self.with_buffer(va, 8, |b, off| b.read_u64(off).ok())
    }
    /// Writes kernel DMA memory by CPU address, as the device would (a test device's CQEs, a whole WQE).
    pub fn write(&self, va: u64, data: &[u8]) -> bool {
        self.with_buffer(va, data.len(), |b, off| b.write(off, data).ok()).is_some()
    }
    /// One qword of kernel DMA memory by CPU address, little-endian, as the device would write it.
    pub fn write_u64(&self, va: u64, v: u64) -> bool {
        self.with_buffer(va, 8, |b, off| b.write_u64(off, v).ok()).is_some()
    }

    pub(crate) fn on_wmb(&self) {
        let o = lock(&self.observer).clone();
        if let Some(o) = o {
            o.dma_wmb();
        }
    }
    pub(crate) fn on_rmb(&self) {
        let o = lock(&self.observer).clone();
        if let Some(o) = o {
            o.dma_rmb();
        }
    }

    pub(crate) fn udelay(&self, us: u64) {
        match self.delays {
            Delays::Real => std::thread::sleep(Duration::from_micros(us)),
            Delays::Skip => {}
        }
    }
}

impl Drop for ShimEnv {
    fn drop(&mut self) {
        // Whatever the kernel code did not free goes back to the pool, so no device mapping outlives it.
        let bufs = std::mem::take(&mut *lock(&self.buffers));
        for (_, b) in bufs {
            b.release(&self.pool);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diff::fake::{CreateResponse, FakeIrdma, Trace};

    fn env() -> Arc<ShimEnv> {
        let fake = FakeIrdma::new(Trace::default(), CreateResponse::Done);
        ShimEnv::new(Arc::new(DmaPool::new(fake, false)), Delays::Skip).unwrap()
    }

    #[test]
    fn a_register_access_outside_bar0_reads_all_ones_and_is_reported() {
        let e = env();
        assert_eq!(e.mmio_read32(e.bar_base() + IRDMA_BAR0_SIZE), u32::MAX);
        e.mmio_write32(e.bar_base().wrapping_sub(4), 1);
        assert_eq!(e.take_bugs().len(), 2);
        // GLPCI_LBARCTRL through the window: the fake's PE_DB_SIZE 2.
        assert_eq!(e.mmio_read32(e.bar_base() + 0x9DE74), 0x20);
        assert!(e.take_bugs().is_empty());
    }

    #[test]
    fn coherent_memory_is_freed_only_with_its_own_address_pair() {
        let e = env();
        let (va, pa) = e.dma_alloc(100).unwrap();
        assert!(e.write_u64(va as u64 + 8, 0x1234));
        assert_eq!(e.read_u64(va as u64 + 8), Some(0x1234));
        assert_eq!(e.read_u64(va as u64 + 4096), None, "past the buffer");
        e.dma_free(va, 100, pa + 0x1000);
        assert_eq!((e.take_bugs().len(), e.dma_allocations()), (1, 1), "a wrong IOVA keeps the buffer");
        e.dma_free(va, 100, pa);
        assert_eq!((e.take_bugs().len(), e.dma_allocations()), (0, 0));
        e.dma_free(va, 100, pa);
        assert_eq!(e.take_bugs().len(), 1, "a double free is reported");
    }

    /// Every access names the one allocation that holds all of its bytes, or none.
    #[test]
    fn kernel_memory_is_reached_only_inside_one_live_allocation() {
        let e = env();
        let (a, _) = e.dma_alloc(4096).unwrap();
        let (b, b_pa) = e.dma_alloc(8192).unwrap();
        let (a, b) = (a as u64, b as u64);
        // The two mappings may be adjacent, either way round: "past" means past both.
        let (first, past) = (a.min(b), (a + 4096).max(b + 8192));
        let cases: [(&str, u64, usize, bool); 8] = [
            ("the first byte of one", a, 1, true),
            ("the last qword of one", a + 4088, 8, true),
            ("a whole WQE of the other", b + 8128, 64, true),
            ("across the end of one", a + 4090, 8, false),
            ("across the end of the other", b + 8190, 4, false),
            ("before both", first - 1, 1, false),
            ("just past both", past, 8, false),
            ("a zero-length access past both", past, 0, false),
        ];
        for (what, va, len, reached) in cases {
            assert_eq!(e.write(va, &vec![0x5A; len]), reached, "write: {what}");
            assert_eq!(e.read(va, &mut vec![0; len]), reached, "read: {what}");
        }
        e.write(b + 64, &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(e.read_u64(b + 64), Some(0x0102_0304_0506_0708), "bytes land little-endian");
        e.dma_free(b as usize, 8192, b_pa);
        assert_eq!(e.read_u64(b + 64), None, "freed memory is not reached");
    }
}
