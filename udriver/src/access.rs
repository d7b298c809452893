//! The one trait between the driver and how it reaches the device: MMIO, DMA mappings and interrupts.
//!
//! Backends: Linux VFIO inside a guest, a direct vfio-user client of the device model, and an
//! in-process device model. Everything above this trait is the same code for all of them.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use crate::dma::DmaMemory;

pub use crate::error::{AccessError, Result};

/// Identity of the device behind a backend, for `udriver info`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DeviceIdentity {
    pub vendor_id: u16,
    pub device_id: u16,
    /// (BAR index, size) of every memory BAR.
    pub bars: Vec<(u32, u64)>,
    pub msix_vectors: u32,
    /// "vfio", "vfio-user" or "in-process".
    pub backend: &'static str,
    /// Whether register access is mapped memory (no trap per access).
    pub mapped_bars: Vec<u32>,
}

/// How the driver reaches one device. Register accesses are single volatile accesses of the given width
/// (64-bit for hfi1 CSRs, 32-bit for irdma registers); no `&mut [u8]` ever spans device memory.
pub trait DeviceAccess: Send + Sync {
    fn identity(&self) -> DeviceIdentity;
    fn read32(&self, bar: u32, offset: u64) -> Result<u32>;
    fn write32(&self, bar: u32, offset: u64, value: u32) -> Result<()>;
    fn read64(&self, bar: u32, offset: u64) -> Result<u64>;
    fn write64(&self, bar: u32, offset: u64, value: u64) -> Result<()>;
    /// Makes `[offset, offset + len)` of `mem` visible to the device at `iova`. Page-aligned. An in-process
    /// device keeps `mem` (a reference, not a second mapping) so its view never dangles.
    fn dma_map(&self, mem: &Arc<DmaMemory>, offset: u64, len: u64, iova: u64) -> Result<()>;
    fn dma_unmap(&self, iova: u64, len: u64) -> Result<()>;
    /// Sets up `nvec` MSI-X vectors with eventfds.
    fn enable_msix(&self, nvec: u32) -> Result<()>;
    /// Waits until `vector` fires (true) or `timeout` passes (false). Consumes the event.
    fn wait_irq(&self, vector: u32, timeout: Duration) -> Result<bool>;
    /// Flushes posted/write-combined writes (the kernel's `flush_wc()`): a no-op where writes are not
    /// buffered.
    fn flush_wc(&self) {}

    /// Reads PCI config space. Backends without config access (test fakes) keep this default.
    fn config_read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let _ = (offset, buf);
        Err(AccessError::NoConfigSpace)
    }
    /// Writes PCI config space.
    fn config_write(&self, offset: u64, buf: &[u8]) -> Result<()> {
        let _ = (offset, buf);
        Err(AccessError::NoConfigSpace)
    }

    /// `pci_enable_device()` + `pci_set_master()`: memory decoding and bus mastering on, the way Linux
    /// prepares a device before touching its BARs or letting it DMA.
    fn pci_enable_device(&self) -> Result<()> {
        let mut cmd = [0u8; 2];
        self.config_read(pci::COMMAND, &mut cmd)?;
        let cmd = u16::from_le_bytes(cmd) | pci::COMMAND_MEMORY | pci::COMMAND_MASTER;
        self.config_write(pci::COMMAND, &cmd.to_le_bytes())
    }

    fn set_bits32(&self, bar: u32, offset: u64, bits: u32) -> Result<()> {
        let v = self.read32(bar, offset)?;
        self.write32(bar, offset, v | bits)
    }
    fn clear_bits32(&self, bar: u32, offset: u64, bits: u32) -> Result<()> {
        let v = self.read32(bar, offset)?;
        self.write32(bar, offset, v & !bits)
    }
}

/// The few PCI config-space fields the driver touches itself (include/uapi/linux/pci_regs.h).
pub mod pci {
    pub const COMMAND: u64 = 0x04;
    pub const COMMAND_MEMORY: u16 = 1 << 1;
    pub const COMMAND_MASTER: u16 = 1 << 2;
    pub const CAPABILITY_LIST: u64 = 0x34;
    pub const CAP_ID_MSIX: u8 = 0x11;
    /// Message Control word of the MSI-X capability, relative to the capability.
    pub const MSIX_FLAGS: u64 = 2;
    pub const MSIX_FLAGS_ENABLE: u16 = 1 << 15;
}

/// Polls `cond` every `interval` until it returns `Some`, or fails with `Timeout` after `timeout`.
pub fn poll_until<T>(
    op: &'static str,
    timeout: Duration,
    interval: Duration,
    mut cond: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = cond()? {
            return Ok(v);
        }
        if start.elapsed() >= timeout {
            return Err(AccessError::Timeout { op, timeout });
        }
        if interval.is_zero() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(interval);
        }
    }
}
