//! In-process backend: the device model's PCI function lives in this process. Register accesses are
//! direct calls, DMA goes straight to our `DmaMemory`, interrupts are counted per vector. Used by tests,
//! benchmarks and the hostile-device fuzz target; the same driver code runs over it as over VFIO.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use vfio_user_proto::device::{region, Device, DeviceContext, IrqTrigger};
use vfio_user_proto::dma::{DmaAccess, DmaError};
use vfio_user_proto::sync::Unpoison;

use udriver::access::{AccessError, DeviceAccess, DeviceIdentity, Result};
use udriver::backend;
use udriver::dma::DmaMemory;

/// One mapping: its length, the memory (a reference to the driver's, so it stays valid whatever the driver
/// frees, as a real device's pinned pages do) and the offset in that memory.
#[derive(Clone)]
struct Mapping {
    len: u64,
    mem: Arc<DmaMemory>,
    offset: u64,
}

/// The device's view of the driver's DMA mappings.
#[derive(Default)]
struct Mappings {
    map: Mutex<BTreeMap<u64, Mapping>>,
}

impl Mappings {
    fn walk(
        &self,
        iova: u64,
        len: usize,
        mut f: impl FnMut(&DmaMemory, usize, usize, usize) -> Result<()>,
    ) -> std::result::Result<(), DmaError> {
        let len64 = len as u64;
        iova.checked_add(len64).ok_or(DmaError::Overflow { iova, len: len64 })?;
        let map = self.map.lock().unpoison();
        // Check coverage first so a failing access touches nothing.
        let mut pieces = Vec::new();
        let (mut cur, mut done) = (iova, 0usize);
        while done < len {
            let (base, m) = map
                .range(..=cur)
                .next_back()
                .filter(|(b, m)| cur < **b + m.len)
                .ok_or(DmaError::Unmapped { iova, len: len64 })?;
            let off_in = cur - base;
            let n = ((m.len - off_in) as usize).min(len - done);
            pieces.push((m.mem.clone(), (m.offset + off_in) as usize, done, n));
            cur += n as u64;
            done += n;
        }
        drop(map);
        for (mem, off, at, n) in pieces {
            f(&mem, off, at, n).map_err(|e| DmaError::Transport(e.to_string()))?;
        }
        Ok(())
    }
}

impl DmaAccess for Mappings {
    fn read(&self, iova: u64, buf: &mut [u8]) -> std::result::Result<(), DmaError> {
        let len = buf.len();
        self.walk(iova, len, |mem, off, at, n| mem.read(off, &mut buf[at..at + n]).map_err(AccessError::from))
    }
    fn write(&self, iova: u64, buf: &[u8]) -> std::result::Result<(), DmaError> {
        self.walk(iova, buf.len(), |mem, off, at, n| mem.write(off, &buf[at..at + n]).map_err(AccessError::from))
    }
}

/// Interrupt counts per (index, vector), with a condvar to wait on.
#[derive(Default)]
struct Irqs {
    pending: Mutex<BTreeMap<u32, u64>>,
    cond: Condvar,
}

impl IrqTrigger for Irqs {
    fn trigger(&self, index: u32, vector: u32) {
        if index != vfio_user_proto::device::irq::MSIX {
            return;
        }
        *self.pending.lock().unpoison().entry(vector).or_default() += 1;
        self.cond.notify_all();
    }
}

pub struct InProcess {
    device: Arc<dyn Device>,
    dma: Arc<Mappings>,
    irqs: Arc<Irqs>,
    bar_sizes: Vec<(u32, u64)>,
}

impl InProcess {
    /// Attaches `device` as if a client had connected.
    pub fn new(device: Arc<dyn Device>) -> Self {
        let dma = Arc::new(Mappings::default());
        let irqs = Arc::new(Irqs::default());
        device.attach(DeviceContext { dma: dma.clone(), irq: irqs.clone() });
        let bar_sizes = (region::BAR0..=region::BAR5)
            .filter_map(|i| device.region_info(i).filter(|r| r.size > 0).map(|r| (i, r.size)))
            .collect();
        Self { device, dma, irqs, bar_sizes }
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// DMA mappings the device can reach now (a driver that leaks none has none after its teardown).
    pub fn mappings(&self) -> usize {
        self.dma.map.lock().unpoison().len()
    }

    fn check(&self, bar: u32, offset: u64, width: u64) -> Result<()> {
        let size = self.bar_sizes.iter().find(|(i, _)| *i == bar).map(|(_, s)| *s);
        backend::check_register(bar, size, offset, width)
    }

    fn read(&self, bar: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(bar, offset, buf.len() as u64)?;
        self.device.region_read(bar, offset, buf).map_err(|errno| AccessError::Errno { op: "region read", errno })
    }

    fn write(&self, bar: u32, offset: u64, buf: &[u8]) -> Result<()> {
        self.check(bar, offset, buf.len() as u64)?;
        self.device.region_write(bar, offset, buf).map_err(|errno| AccessError::Errno { op: "region write", errno })
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.device.detach();
    }
}

impl DeviceAccess for InProcess {
    fn identity(&self) -> DeviceIdentity {
        let mut ids = [0u8; 4];
        let config = self.config_read(0, &mut ids).map(|()| ids);
        let msix = self.device.irq_info(vfio_user_proto::device::irq::MSIX).map_or(0, |i| i.count);
        backend::identity("in-process", config, self.bar_sizes.iter().map(|(i, s)| (*i, *s, false)), msix)
    }
    fn config_read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.device
            .region_read(region::CONFIG, offset, buf)
            .map_err(|errno| AccessError::Errno { op: "config read", errno })
    }
    fn config_write(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.device
            .region_write(region::CONFIG, offset, buf)
            .map_err(|errno| AccessError::Errno { op: "config write", errno })
    }
    fn read32(&self, bar: u32, offset: u64) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read(bar, offset, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    fn write32(&self, bar: u32, offset: u64, value: u32) -> Result<()> {
        self.write(bar, offset, &value.to_le_bytes())
    }
    fn read64(&self, bar: u32, offset: u64) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(bar, offset, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    fn write64(&self, bar: u32, offset: u64, value: u64) -> Result<()> {
        self.write(bar, offset, &value.to_le_bytes())
    }

    fn dma_map(&self, mem: &Arc<DmaMemory>, offset: u64, len: u64, iova: u64) -> Result<()> {
        backend::check_dma_map(mem, offset, len, iova)?;
        // What the vfio-user server asks the device before mapping (a `dma-map-refuse` fault).
        let rw = vfio_user_proto::wire::dma_map_flags::READ | vfio_user_proto::wire::dma_map_flags::WRITE;
        self.device.vet_dma_map(iova, len, rw).map_err(|errno| AccessError::Errno { op: "DMA map", errno })?;
        let end = iova.checked_add(len);
        let mut map = self.dma.map.lock().unpoison();
        let overlaps = map.range(..end.unwrap_or(u64::MAX)).next_back().is_some_and(|(b, m)| b + m.len > iova);
        if overlaps {
            return Err(AccessError::Errno { op: "DMA map", errno: libc::EEXIST });
        }
        map.insert(iova, Mapping { len, mem: Arc::clone(mem), offset });
        Ok(())
    }

    fn dma_unmap(&self, iova: u64, len: u64) -> Result<()> {
        let mut map = self.dma.map.lock().unpoison();
        let end = iova.saturating_add(len);
        map.retain(|b, m| !(*b >= iova && *b + m.len <= end));
        Ok(())
    }

    fn enable_msix(&self, nvec: u32) -> Result<()> {
        let max = self.device.irq_info(vfio_user_proto::device::irq::MSIX).map_or(0, |i| i.count);
        backend::check_msix_vectors(nvec, max)?;
        // No kernel in between: the driver turns MSI-X on in config space itself.
        backend::msix_enable(self)
    }

    fn wait_irq(&self, vector: u32, timeout: Duration) -> Result<bool> {
        let deadline = std::time::Instant::now() + timeout;
        let mut pending = self.irqs.pending.lock().unpoison();
        loop {
            if let Some(n) = pending.get_mut(&vector).filter(|n| **n > 0) {
                *n = 0;
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            pending = self.irqs.cond.wait_timeout(pending, left).unpoison().0;
        }
    }
}
