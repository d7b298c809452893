//! The contract between a hardware engine (hfi1, irdma) and the PCI function that carries it.
//!
//! An engine knows its BARs' registers and its behaviour, and nothing of PCI config space, vfio-user or
//! sockets. The PCI layer (`crate::pci`) adds config space and the MSI-X table, and adapts the whole to
//! `vfio_user_proto::device::Device`.

use std::sync::Arc;

use vfio_user_proto::device::RegionFd;
use vfio_user_proto::dma::DmaAccess;

/// Raises an MSI-X vector of the function. The PCI layer decides whether it is delivered or left
/// pending (masked), so engines just call it.
pub trait Interrupt: Send + Sync {
    fn raise(&self, vector: u16);
}

/// An interrupt line that goes nowhere: what an engine holds while detached.
pub struct NoInterrupt;
impl Interrupt for NoInterrupt {
    fn raise(&self, _vector: u16) {}
}

/// One memory BAR an engine implements.
#[derive(Debug, Clone)]
pub struct BarSpec {
    /// BAR index 0..=5. A 64-bit BAR also takes `index + 1`.
    pub index: u32,
    /// A power of two, at least 4 KiB.
    pub size: u64,
    pub is_64bit: bool,
    pub prefetchable: bool,
    /// Parts of the BAR backed by shared memory the client may mmap, with the file that backs them.
    pub mmap: Option<BarMmap>,
}

#[derive(Debug, Clone)]
pub struct BarMmap {
    /// (offset in BAR, size), page-aligned.
    pub areas: Vec<(u64, u64)>,
    pub fd: RegionFd,
}

/// A hardware engine behind one PCI function.
pub trait Engine: Send + Sync + 'static {
    /// Short name used in logs and on the control socket ("hfi1", "irdma").
    fn name(&self) -> &'static str;
    /// The register BARs. Must not use the BAR index the PCI layer reserves for MSI-X
    /// (`crate::pci::MSIX_BAR`).
    fn bars(&self) -> Vec<BarSpec>;
    fn msix_vectors(&self) -> u16;
    /// Register read. Widths 1, 2, 4 and 8 arrive here with the range inside the BAR already checked;
    /// anything the engine does not implement reads as all-ones.
    fn mmio_read(&self, bar: u32, offset: u64, data: &mut [u8]);
    /// Register write. Unimplemented or malformed writes are counted and ignored, never a panic.
    fn mmio_write(&self, bar: u32, offset: u64, data: &[u8]);
    /// A client connected: DMA and interrupts go to it from now on.
    fn attach(&self, dma: Arc<dyn DmaAccess>, irq: Arc<dyn Interrupt>);
    /// The client is gone: stop in-flight work (its DMA fails from now on), drop `dma`/`irq`, reset.
    fn detach(&self);
    /// Function-level reset (DEVICE_RESET or the control socket): registers and tables to power-on values.
    fn reset(&self);
    /// One control-socket command for this engine, e.g. `{"cmd":"dump"}` or `{"cmd":"inject", ...}`.
    fn control(&self, request: &serde_json::Value) -> Result<serde_json::Value, String>;
}
