//! The contract between a hardware engine (hfi1, irdma) and the PCI function that carries it.
//!
//! An engine knows its BARs' registers and its behaviour, and nothing of PCI config space, vfio-user or
//! sockets. The PCI layer (`crate::pci`) adds config space and the MSI-X table, and adapts the whole to
//! `vfio_user_proto::device::Device`.

#![forbid(unsafe_code)]

use std::sync::Arc;

use vfio_user_proto::device::RegionFd;
use vfio_user_proto::dma::DmaAccess;

use crate::probe::Probe;
use crate::trace::RegisterName;

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

/// Where a function's MSI-X table and PBA live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsixPlacement {
    /// In a BAR of their own that the PCI layer adds (`crate::pci::MSIX_BAR`).
    OwnBar,
    /// Inside one of the engine's BARs, as on a chip whose BAR map fixes them. The PCI layer serves these
    /// windows itself; the engine never sees accesses to them.
    InBar { bar: u32, table_offset: u64, pba_offset: u64 },
}

/// A PCI Express link as the Link Capabilities/Status registers report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcieLink {
    /// Link speed encoding of LNKCAP/LNKSTA (1 = 2.5 GT/s, 2 = 5 GT/s, 3 = 8 GT/s).
    pub speed: u8,
    /// Lanes.
    pub width: u8,
}

/// What the PCI function around an engine looks like beyond its BARs: where its capabilities sit, its link,
/// and device-specific config registers. The default is the project's own layout (docs/pci.md); a chip
/// personality gives the chip's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciShape {
    /// Config offset of the PCI Express capability.
    pub pcie_cap: u8,
    /// Config offset of the MSI-X capability.
    pub msix_cap: u8,
    pub msix: MsixPlacement,
    pub link: PcieLink,
    /// Device-specific registers in extended config space, outside any capability, that are plain
    /// read/write storage: (offset, length), dword aligned.
    pub config_storage: Vec<(u16, u16)>,
}

impl Default for PciShape {
    fn default() -> Self {
        PciShape {
            pcie_cap: 0x40,
            msix_cap: 0x80,
            msix: MsixPlacement::OwnBar,
            link: PcieLink { speed: 1, width: 1 },
            config_storage: Vec::new(),
        }
    }
}

/// A hardware engine behind one PCI function.
pub trait Engine: Send + Sync + 'static {
    /// Short name used in logs and on the control socket ("hfi1", "irdma").
    fn name(&self) -> &'static str;
    /// The kind of engine, which fault specs and PCI defaults go by; the name unless several engines of
    /// one kind are served ("hfi1-wfr1" is of kind "hfi1-wfr").
    fn kind(&self) -> &'static str {
        self.name()
    }
    /// The register BARs. With [`MsixPlacement::OwnBar`] they must not use the BAR index the PCI layer
    /// reserves for MSI-X (`crate::pci::MSIX_BAR`).
    fn bars(&self) -> Vec<BarSpec>;
    fn msix_vectors(&self) -> u16;
    /// Capability placement, link and device-specific config registers.
    fn pci_shape(&self) -> PciShape {
        PciShape::default()
    }
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
    /// The engine's trace switches and faults, shared with its PCI function. An engine with no hook points
    /// of its own gets a fresh one (the PCI function asks once).
    fn probe(&self) -> Arc<Probe> {
        Probe::new(self.name())
    }
    /// The kernel's name of the register at `offset` of `bar`, its block, and (given a value) its decoded
    /// fields: the one naming path of traces, access logs and fault specs.
    fn register_name(&self, _bar: u32, _offset: u64, _value: Option<u64>) -> RegisterName {
        RegisterName::unnamed()
    }
    /// Whether [`Engine::register_name`] names the register, without building the name: the access log
    /// asks this of every access, tracing or not.
    fn register_is_named(&self, bar: u32, offset: u64) -> bool {
        self.register_name(bar, offset, None).name.is_some()
    }
    /// Where the register the kernel calls `name` is (`SEND_DMA_STATUS[engine 0]`, `CQPTAIL`): (bar, offset).
    fn register_offset(&self, _name: &str) -> Option<(u32, u64)> {
        None
    }
    /// Whether the engine's worker has nothing queued or running (a replay waits for it, docs/observe.md).
    fn idle(&self) -> bool {
        true
    }
    /// Whether the PCI function keeps the session's access log from the start (see `trace::access_log`).
    fn keeps_access_log(&self) -> bool {
        false
    }
}
