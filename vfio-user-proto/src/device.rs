//! What a vfio-user server serves: one device (for us, one PCI function).
//!
//! This is the contract between the protocol layer and the device model. The server owns the socket,
//! the DMA mappings and the IRQ eventfds; the device owns its registers and state.

#![forbid(unsafe_code)]

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::dma::DmaAccess;

/// A positive errno value carried in an error reply (`EINVAL`, `ENOENT`, ...).
pub type Errno = i32;

/// Region indices of a VFIO PCI device (linux/vfio.h `VFIO_PCI_*_REGION_INDEX`).
pub mod region {
    pub const BAR0: u32 = 0;
    pub const BAR5: u32 = 5;
    pub const ROM: u32 = 6;
    pub const CONFIG: u32 = 7;
    pub const VGA: u32 = 8;
    pub const NUM_REGIONS: u32 = 9;
}

/// IRQ indices of a VFIO PCI device (linux/vfio.h `VFIO_PCI_*_IRQ_INDEX`).
pub mod irq {
    pub const INTX: u32 = 0;
    pub const MSI: u32 = 1;
    pub const MSIX: u32 = 2;
    pub const ERR: u32 = 3;
    pub const REQ: u32 = 4;
    pub const NUM_IRQS: u32 = 5;
}

/// `VFIO_DEVICE_FLAGS_*` as used in DEVICE_GET_INFO.
pub mod device_flags {
    pub const RESET: u32 = 1 << 0;
    pub const PCI: u32 = 1 << 1;
}

/// `VFIO_REGION_INFO_FLAG_*`.
pub mod region_flags {
    pub const READ: u32 = 1 << 0;
    pub const WRITE: u32 = 1 << 1;
    pub const MMAP: u32 = 1 << 2;
    pub const CAPS: u32 = 1 << 3;
}

/// `VFIO_IRQ_INFO_*`.
pub mod irq_flags {
    pub const EVENTFD: u32 = 1 << 0;
    pub const MASKABLE: u32 = 1 << 1;
    pub const AUTOMASKED: u32 = 1 << 2;
    pub const NORESIZE: u32 = 1 << 3;
}

/// A part of a region the client may mmap (sparse-mmap capability).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SparseArea {
    /// Offset inside the region.
    pub offset: u64,
    pub size: u64,
}

/// The file backing a region's mmappable parts. The client mmaps `fd` at `fd_offset + area.offset`.
#[derive(Debug, Clone)]
pub struct RegionFd {
    pub fd: Arc<OwnedFd>,
    pub fd_offset: u64,
}

#[derive(Debug, Clone, Default)]
pub struct RegionInfo {
    pub size: u64,
    /// `region_flags::*`
    pub flags: u32,
    /// Empty when nothing is mmappable. When non-empty, `fd` must be set and `flags` has `MMAP | CAPS`.
    pub sparse_areas: Vec<SparseArea>,
    pub fd: Option<RegionFd>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IrqInfo {
    /// `irq_flags::*`
    pub flags: u32,
    pub count: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `device_flags::*`
    pub flags: u32,
    pub num_regions: u32,
    pub num_irqs: u32,
}

/// Signals an interrupt to the connected client. Implemented by the server over the eventfds the client
/// gave in DEVICE_SET_IRQS; it honours DEVICE_SET_IRQS mask/unmask. A vector with no eventfd is dropped.
pub trait IrqTrigger: Send + Sync {
    fn trigger(&self, index: u32, vector: u32);
}

/// What a device gets while a client is connected.
#[derive(Clone)]
pub struct DeviceContext {
    pub dma: Arc<dyn DmaAccess>,
    pub irq: Arc<dyn IrqTrigger>,
}

/// A device served over vfio-user. Every method is called from the connection's message-reading thread
/// and must not block on device work (DMA in particular): long work goes to the device's own threads.
pub trait Device: Send + Sync + 'static {
    fn device_info(&self) -> DeviceInfo;
    /// `None` for an index the device does not have (the server replies EINVAL). A region's size and
    /// flags must not change while a client is attached: the server looks them up once per connection to
    /// check every access.
    fn region_info(&self, index: u32) -> Option<RegionInfo>;
    fn irq_info(&self, index: u32) -> Option<IrqInfo>;
    /// `offset + data.len()` is already checked against the region size by the server.
    fn region_read(&self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno>;
    fn region_write(&self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno>;
    /// A client connected: from now on DMA and IRQs go to it.
    fn attach(&self, ctx: DeviceContext);
    /// The client is gone (cleanly or not). Called after in-flight device work was stopped or finished;
    /// the device must drop the context and reset itself.
    fn detach(&self);
    /// DEVICE_RESET from the client.
    fn reset(&self);
    /// A DMA_MAP of `[iova, iova + size)` the server is about to make: an error refuses it with that errno
    /// (fault injection, docs/observe.md). Called before the mapping is checked or made.
    fn vet_dma_map(&self, _iova: u64, _size: u64, _flags: u32) -> Result<(), Errno> {
        Ok(())
    }
}
