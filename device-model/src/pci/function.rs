//! `Function`: one engine as a PCI function served over vfio-user (docs/pci.md for every policy here).

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vfio_user_proto::device::{
    device_flags, irq, irq_flags, region, region_flags, Device, DeviceContext, DeviceInfo, Errno, IrqInfo, RegionInfo,
    SparseArea,
};
use vfio_user_proto::sync::Unpoison;

use super::config::{BarLayout, CapLayout, ConfigLayout, ConfigSpace, MsixLayout};
use super::dma::BusMasterDma;
use super::error::PciError;
use super::ids::PciIds;
use super::msix::MSIX_BAR;
use super::msix::{msix_bar_layout, Msix};
use super::probed::{Observer, ProbedDma, ProbedInterrupt, RegisterNaming};
use super::regs::*;
use crate::engine::{BarSpec, Engine, Interrupt, MsixPlacement, NoInterrupt, PciShape};
use crate::fault::{FaultKind, FaultSpec, RegRef};
use crate::probe::Probe;
use crate::trace::{Block, RegisterName};

/// Smallest BAR an engine may declare, and the mmap granule.
const PAGE_SIZE: u64 = 4096;
/// Widths a BAR access may have.
const BAR_ACCESS_WIDTHS: [usize; 4] = [1, 2, 4, 8];

/// What sits behind a BAR slot.
enum Bar {
    Engine(BarSpec),
    Msix,
}

/// The MSI-X table and PBA inside an engine BAR: BAR offsets of each window and their lengths.
#[derive(Debug, Clone, Copy)]
struct MsixWindows {
    bar: usize,
    table: (u64, u64),
    pba: (u64, u64),
}

/// Where a BAR access goes.
enum Target {
    Engine,
    /// The MSI-X structure, at this offset of its own address space (table at 0, PBA at its offset).
    Msix(u64),
    /// Memory Space Enable is clear: nothing decodes the access.
    Undecoded,
}

/// The engine's `raise(vector)` path: the MSI-X policy, then the client's eventfd.
struct MsixInterrupt(Arc<Msix>);
impl Interrupt for MsixInterrupt {
    fn raise(&self, vector: u16) {
        self.0.raise(vector);
    }
}

pub struct Function {
    engine: Arc<dyn Engine>,
    layout: ConfigLayout,
    bars: [Option<Bar>; PCI_NUM_BARS],
    bar_sizes: [u64; PCI_NUM_BARS],
    config: Mutex<ConfigSpace>,
    /// Mirror of PCI_COMMAND read without the config lock (BAR gate, DMA gate).
    command: Arc<AtomicU16>,
    msix: Option<Arc<Msix>>,
    msix_windows: Option<MsixWindows>,
    /// Counted refusals: BAR accesses with Memory Space disabled, DMA with Bus Master disabled.
    mmio_refused: AtomicU64,
    dma_refused: Arc<AtomicU64>,
    /// Status bits the DMA path raised, folded into config space under its lock.
    status_events: Arc<AtomicU16>,
    /// The attached client's DMA space, for `dma_maps`.
    dma: Mutex<Option<Arc<BusMasterDma>>>,
    /// Traces, the access log and faults of what passes through the function.
    obs: Arc<Observer>,
}

/// Checks an engine's MSI-X placement and capability layout against its BARs.
fn validate_shape(specs: &[BarSpec], shape: &PciShape, vectors: u16) -> Result<(), PciError> {
    if !caps_of(shape).is_valid() {
        return Err(PciError::CapLayout);
    }
    let MsixPlacement::InBar { bar, table_offset, pba_offset } = shape.msix else {
        return Ok(());
    };
    let (own, _) = msix_bar_layout(vectors);
    let table_len = u64::from(own.vectors) * PCI_MSIX_ENTRY_SIZE as u64;
    let pba_len = u64::from(own.vectors).div_ceil(64) * 8;
    let size = specs.iter().find(|b| b.index == bar).map(|b| b.size).ok_or(PciError::MsixPlacement { bar })?;
    let fits = |off: u64, len: u64| off.is_multiple_of(8) && off <= u64::from(u32::MAX) && off + len <= size;
    let apart = table_offset + table_len <= pba_offset || pba_offset + pba_len <= table_offset;
    let mmapped = specs.iter().filter(|b| b.index == bar).flat_map(|b| b.mmap.iter().flat_map(|m| m.areas.iter()));
    let clear = mmapped.clone().all(|&(o, l)| {
        let overlaps = |off: u64, len: u64| off < o + l && o < off + len;
        !overlaps(table_offset, table_len) && !overlaps(pba_offset, pba_len)
    });
    if fits(table_offset, table_len) && fits(pba_offset, pba_len) && apart && clear {
        Ok(())
    } else {
        Err(PciError::MsixPlacement { bar })
    }
}

fn caps_of(shape: &PciShape) -> CapLayout {
    CapLayout {
        pcie: usize::from(shape.pcie_cap),
        msix: usize::from(shape.msix_cap),
        link: shape.link,
        storage: shape.config_storage.iter().map(|&(o, l)| (usize::from(o), usize::from(l))).collect(),
    }
}

/// Checks an engine's BARs against each other and the MSI-X slot.
fn validate_bars(specs: &[BarSpec], reserve_msix: bool) -> Result<(), PciError> {
    let mut used = [false; PCI_NUM_BARS];
    if reserve_msix {
        used[MSIX_BAR as usize] = true;
    }
    for b in specs {
        let index = b.index;
        let slots = if b.is_64bit { 2 } else { 1 };
        if index as usize + slots > PCI_NUM_BARS {
            return Err(PciError::BarIndex { index });
        }
        if !b.size.is_power_of_two() || b.size < PAGE_SIZE {
            return Err(PciError::BarSize { index, size: b.size });
        }
        if !b.is_64bit && b.size > 1 << 31 {
            return Err(PciError::BarTooLargeFor32Bit { index, size: b.size });
        }
        for slot in used.iter_mut().skip(index as usize).take(slots) {
            if std::mem::replace(slot, true) {
                return Err(PciError::BarOverlap { index });
            }
        }
        for &(offset, size) in b.mmap.iter().flat_map(|m| m.areas.iter()) {
            let inside = offset.checked_add(size).is_some_and(|end| end <= b.size);
            if size == 0 || offset % PAGE_SIZE != 0 || size % PAGE_SIZE != 0 || !inside {
                return Err(PciError::MmapArea { index, offset, size });
            }
        }
    }
    Ok(())
}

/// Splits `[offset, offset + len)` into naturally aligned config accesses of 4, 2 or 1 bytes, as Linux
/// vfio-pci does, so a client may read all of config space at once (QEMU does at realize).
fn config_chunks(offset: u64, len: usize) -> impl Iterator<Item = (u64, usize)> {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        if pos >= len {
            return None;
        }
        let at = offset + pos as u64;
        let left = len - pos;
        let width = [4usize, 2, 1].into_iter().find(|&w| at.is_multiple_of(w as u64) && left >= w).unwrap_or(1);
        pos += width;
        Some((at, width))
    })
}

impl Function {
    /// A function for `engine`. A BAR the engine declares badly (see `try_new`) is logged and left out.
    pub fn new(engine: Arc<dyn Engine>, ids: PciIds) -> Arc<Function> {
        let specs = engine.bars();
        let mut shape = engine.pci_shape();
        if let Err(e) = validate_shape(&specs, &shape, engine.msix_vectors()) {
            tracing::error!(engine = engine.name(), "{e}; the default PCI layout is used instead");
            shape = PciShape::default();
        }
        let reserve = engine.msix_vectors() > 0 && shape.msix == MsixPlacement::OwnBar;
        let good: Vec<BarSpec> = specs
            .into_iter()
            .filter(|b| match validate_bars(std::slice::from_ref(b), reserve) {
                Ok(()) => true,
                Err(e) => {
                    tracing::error!(engine = engine.name(), "{e}; BAR left out");
                    false
                }
            })
            .collect();
        // Pairwise overlaps: keep the first claimant of each slot.
        let mut kept: Vec<BarSpec> = Vec::new();
        for b in good {
            let mut trial = kept.clone();
            trial.push(b.clone());
            match validate_bars(&trial, reserve) {
                Ok(()) => kept.push(b),
                Err(e) => tracing::error!(engine = engine.name(), "{e}; BAR left out"),
            }
        }
        Self::build(engine, ids, kept, shape)
    }

    /// Like `new`, but an engine BAR that is misplaced, missized or overlapping, or a PCI shape that does
    /// not fit, is an error.
    pub fn try_new(engine: Arc<dyn Engine>, ids: PciIds) -> Result<Arc<Function>, PciError> {
        let specs = engine.bars();
        let shape = engine.pci_shape();
        validate_shape(&specs, &shape, engine.msix_vectors())?;
        validate_bars(&specs, engine.msix_vectors() > 0 && shape.msix == MsixPlacement::OwnBar)?;
        Ok(Self::build(engine, ids, specs, shape))
    }

    fn build(engine: Arc<dyn Engine>, ids: PciIds, specs: Vec<BarSpec>, shape: PciShape) -> Arc<Function> {
        let mut bars: [Option<Bar>; PCI_NUM_BARS] = Default::default();
        let mut bar_sizes = [0u64; PCI_NUM_BARS];
        let mut layouts = Vec::new();
        for b in specs {
            let i = b.index as usize;
            bar_sizes[i] = b.size;
            layouts.push(BarLayout { index: i, size: b.size, is_64bit: b.is_64bit, prefetchable: b.prefetchable });
            bars[i] = Some(Bar::Engine(b));
        }
        let vectors = engine.msix_vectors().min(PCI_MSIX_MAX_VECTORS);
        let mut msix_windows = None;
        let (msix, msix_layout) = if vectors == 0 {
            (None, None)
        } else {
            let (own, size) = msix_bar_layout(vectors);
            let msix = Arc::new(Msix::new(vectors));
            match shape.msix {
                MsixPlacement::OwnBar => {
                    let i = MSIX_BAR as usize;
                    bar_sizes[i] = size;
                    bars[i] = Some(Bar::Msix);
                    layouts.push(BarLayout { index: i, size, is_64bit: false, prefetchable: false });
                    (Some(msix), Some(own))
                }
                MsixPlacement::InBar { bar, table_offset, pba_offset } => {
                    msix_windows = Some(MsixWindows {
                        bar: bar as usize,
                        table: (table_offset, msix.table_len()),
                        pba: (pba_offset, msix.pba_len()),
                    });
                    // validate_shape checked that both offsets fit 32 bits.
                    let ml = MsixLayout {
                        vectors: own.vectors,
                        table_bar: bar,
                        table_offset: table_offset as u32,
                        pba_bar: bar,
                        pba_offset: pba_offset as u32,
                    };
                    (Some(msix), Some(ml))
                }
            }
        };
        let layout = ConfigLayout { ids, bars: layouts, msix: msix_layout, caps: caps_of(&shape) };
        let obs = Arc::new(Observer::new(engine.probe(), engine.keeps_access_log()));
        Arc::new(Function {
            obs,
            engine,
            config: Mutex::new(ConfigSpace::new(&layout)),
            layout,
            bars,
            bar_sizes,
            command: Arc::new(AtomicU16::new(0)),
            msix,
            msix_windows,
            mmio_refused: AtomicU64::new(0),
            dma_refused: Arc::new(AtomicU64::new(0)),
            status_events: Arc::new(AtomicU16::new(0)),
            dma: Mutex::new(None),
        })
    }

    fn lock_config(&self) -> MutexGuard<'_, ConfigSpace> {
        let mut cfg = self.config.lock().unpoison();
        let events = self.status_events.swap(0, Ordering::AcqRel);
        if events != 0 {
            cfg.raise_status(PCI_STATUS, events);
        }
        cfg
    }

    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }
    pub fn name(&self) -> &'static str {
        self.engine.name()
    }
    pub fn ids(&self) -> PciIds {
        self.layout.ids
    }
    pub fn msix(&self) -> Option<&Arc<Msix>> {
        self.msix.as_ref()
    }
    /// The device's trace switches and faults.
    pub fn probe(&self) -> &Arc<Probe> {
        &self.obs.probe
    }

    /// Arms `spec` on this device, resolving a register it names by the kernel's name; returns its id.
    pub fn arm_fault(&self, mut spec: FaultSpec) -> Result<u64, String> {
        spec.check_device(self.engine.kind()).map_err(|e| e.to_string())?;
        if let Some(RegRef::Name(n)) = &spec.params.reg {
            let (bar, offset) =
                self.engine.register_offset(n).ok_or_else(|| format!("{}: no register named \"{n}\"", self.name()))?;
            spec.params.reg = Some(RegRef::Offset { bar, offset });
        }
        spec.device = Some(self.name().to_string());
        if self.obs.probe.faults.count() >= crate::fault::MAX_ARMED {
            return Err(format!("{}: {} faults armed already (the limit)", self.name(), crate::fault::MAX_ARMED));
        }
        let id = self.obs.probe.faults.arm(spec);
        self.faults_changed();
        Ok(id)
    }

    /// Sessions that begin from now on are recorded with the faults armed now.
    pub fn faults_changed(&self) {
        if let Some(r) = self.obs.probe.recorder() {
            r.set_header_field("faults", self.obs.probe.faults.specs().into());
        }
    }

    /// `{"cmd":"accesses"}`: the session's access totals and last accesses by name; `keep` switches the log.
    pub fn accesses(&self, keep: Option<bool>) -> serde_json::Value {
        self.obs.accesses(self.engine.as_ref(), keep)
    }

    /// The register at `offset` of `bar` by name: the MSI-X structure is the function's, the rest the engine's.
    fn register_name(&self, bar: u32, offset: u64, value: u64, msix: Option<u64>) -> RegisterName {
        match msix {
            Some(at) => {
                let name = match self.msix.as_ref() {
                    Some(m) if at >= m.pba_offset() => format!("MSIX_PBA[{}]", (at - m.pba_offset()) / 8),
                    _ => format!(
                        "MSIX_TABLE[{}]+{:#x}",
                        at / PCI_MSIX_ENTRY_SIZE as u64,
                        at % PCI_MSIX_ENTRY_SIZE as u64
                    ),
                };
                RegisterName { block: Block::Pci, name: Some(name), fields: String::new() }
            }
            None => self.engine.register_name(bar, offset, Some(value)),
        }
    }

    /// Whether [`Function::register_name`] names the register (the MSI-X structure's always are).
    fn register_is_named(&self, bar: u32, offset: u64, msix: Option<u64>) -> bool {
        msix.is_some() || self.engine.register_is_named(bar, offset)
    }

    /// Makes the gates follow config space. Called with the config lock held (lock order: config, then MSI-X).
    fn sync_gates(&self, cfg: &ConfigSpace) {
        let command = cfg.command();
        self.command.store(command, Ordering::Release);
        if let Some(m) = &self.msix {
            m.set_control(cfg.msix_control(), command & PCI_COMMAND_MASTER != 0);
        }
    }

    /// Function-level reset (DEVICE_RESET, Initiate FLR): config space back to power-on values
    /// except what PCIe keeps across FLR (Max_Payload_Size and the Link Control bits), MSI-X masked, engine
    /// reset. Bus mastering stops before the engine resets, so in-flight DMA fails instead of landing.
    pub fn function_level_reset(&self) {
        {
            let mut cfg = self.lock_config();
            let devctl = cfg.pcie_cap() + PCI_EXP_DEVCTL;
            let lnkctl = cfg.pcie_cap() + PCI_EXP_LNKCTL;
            let payload = cfg.get_u16(devctl) & PCI_EXP_DEVCTL_PAYLOAD;
            let link = cfg.get_u16(lnkctl);
            *cfg = ConfigSpace::new(&self.layout);
            self.status_events.store(0, Ordering::Release);
            let fresh = cfg.get_u16(devctl) & !PCI_EXP_DEVCTL_PAYLOAD;
            cfg.set_u16(devctl, fresh | payload);
            cfg.set_u16(lnkctl, link);
            if let Some(m) = &self.msix {
                m.reset();
            }
            self.sync_gates(&cfg);
        }
        self.engine.reset();
    }

    /// Power-on reset: every config register to its power-on value (a new client sees a new device).
    fn power_on_reset(&self) {
        let mut cfg = self.lock_config();
        *cfg = ConfigSpace::new(&self.layout);
        self.status_events.store(0, Ordering::Release);
        if let Some(m) = &self.msix {
            m.reset();
        }
        self.sync_gates(&cfg);
    }

    fn bar_index(index: u32) -> Option<usize> {
        (index <= region::BAR5).then_some(index as usize)
    }

    /// Common checks of a BAR access; returns where it goes.
    fn bar_access(&self, index: u32, offset: u64, len: usize) -> Result<Target, Errno> {
        let i = Self::bar_index(index).ok_or(libc::EINVAL)?;
        let target = match &self.bars[i] {
            None => return Err(libc::EINVAL),
            Some(Bar::Msix) => Target::Msix(offset),
            Some(Bar::Engine(_)) => self.msix_window(i, offset, len as u64)?,
        };
        if !BAR_ACCESS_WIDTHS.contains(&len) {
            return Err(libc::EINVAL);
        }
        let end = offset.checked_add(len as u64).ok_or(libc::EINVAL)?;
        if end > self.bar_sizes[i] {
            return Err(libc::EINVAL);
        }
        // As the hardware: with memory decoding off the function does not claim the access (docs/pci.md).
        if self.command.load(Ordering::Acquire) & PCI_COMMAND_MEMORY == 0 {
            if self.mmio_refused.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(
                    device = self.name(),
                    index,
                    offset,
                    "BAR access with Memory Space disabled: reads return all-ones, writes are dropped \
                     (set Command bit 1 first, as pci_enable_device() does)"
                );
            }
            return Ok(Target::Undecoded);
        }
        Ok(target)
    }

    /// An engine-BAR access that falls in the MSI-X table or PBA window goes to the MSI-X structure; one that
    /// straddles a window's edge is refused, as it can only be a malformed access.
    fn msix_window(&self, bar: usize, offset: u64, len: u64) -> Result<Target, Errno> {
        let (Some(w), Some(m)) = (&self.msix_windows, &self.msix) else { return Ok(Target::Engine) };
        if w.bar != bar {
            return Ok(Target::Engine);
        }
        let end = offset.saturating_add(len);
        for ((start, size), base) in [(w.table, 0), (w.pba, m.pba_offset())] {
            if offset >= start && end <= start + size {
                return Ok(Target::Msix(base + (offset - start)));
            }
            if offset < start + size && start < end {
                return Err(libc::EINVAL);
            }
        }
        Ok(Target::Engine)
    }

    fn config_range(offset: u64, len: usize) -> Result<(), Errno> {
        let end = offset.checked_add(len as u64).ok_or(libc::EINVAL)?;
        if len == 0 || end > PCI_CFG_SPACE_EXP_SIZE as u64 {
            return Err(libc::EINVAL);
        }
        Ok(())
    }

    /// The client's current DMA mappings, for the control socket's `{"cmd":"dma_maps"}`: what a guest kernel
    /// mapped for the device (one 4 KiB page per map under a vIOMMU), to check programmed addresses against.
    pub fn dma_maps(&self) -> serde_json::Value {
        let dma = self.dma.lock().unpoison().clone();
        let regions = dma.and_then(|d| vfio_user_proto::dma::DmaAccess::regions(d.as_ref()));
        let maps: Vec<serde_json::Value> = regions
            .unwrap_or_default()
            .into_iter()
            .map(|r| {
                serde_json::json!({
                    "iova": format!("{:#x}", r.iova),
                    "size": format!("{:#x}", r.size),
                    "flags": r.flags,
                    "fd": r.fd_offset.is_some(),
                    "offset": format!("{:#x}", r.fd_offset.unwrap_or(0)),
                })
            })
            .collect();
        serde_json::json!({ "maps": maps })
    }

    /// A dump for the control socket's `{"cmd":"pci"}`.
    pub fn pci_state(&self) -> serde_json::Value {
        let cfg = self.lock_config();
        let header: String = cfg.bytes()[..PCI_CFG_SPACE_SIZE].iter().map(|b| format!("{b:02x}")).collect();
        serde_json::json!({
            "name": self.name(),
            "ids": self.layout.ids,
            "command": cfg.command(),
            "status": cfg.get_u16(PCI_STATUS),
            "bars": (0..PCI_NUM_BARS).map(|i| cfg.get_u32(PCI_BASE_ADDRESS_0 + 4 * i)).collect::<Vec<_>>(),
            "config_256": header,
            "msix": self.msix.as_ref().map(|m| m.snapshot()),
            "mmio_refused": self.mmio_refused.load(Ordering::Relaxed),
            "dma_refused": self.dma_refused.load(Ordering::Relaxed),
            "worker_panics": self.obs.probe.worker_panics(),
        })
    }
}

impl Device for Function {
    fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            flags: device_flags::PCI | device_flags::RESET,
            num_regions: region::NUM_REGIONS,
            num_irqs: irq::NUM_IRQS,
        }
    }

    fn region_info(&self, index: u32) -> Option<RegionInfo> {
        match index {
            region::CONFIG => Some(RegionInfo {
                size: PCI_CFG_SPACE_EXP_SIZE as u64,
                flags: region_flags::READ | region_flags::WRITE,
                ..Default::default()
            }),
            i if i <= region::BAR5 => {
                let rw = region_flags::READ | region_flags::WRITE;
                Some(match &self.bars[i as usize] {
                    None => RegionInfo::default(),
                    Some(Bar::Msix) => RegionInfo { size: self.bar_sizes[i as usize], flags: rw, ..Default::default() },
                    Some(Bar::Engine(spec)) => match &spec.mmap {
                        Some(m) if !m.areas.is_empty() => RegionInfo {
                            size: spec.size,
                            flags: rw | region_flags::MMAP | region_flags::CAPS,
                            sparse_areas: m.areas.iter().map(|&(offset, size)| SparseArea { offset, size }).collect(),
                            fd: Some(m.fd.clone()),
                        },
                        _ => RegionInfo { size: spec.size, flags: rw, ..Default::default() },
                    },
                })
            }
            region::ROM | region::VGA => Some(RegionInfo::default()),
            _ => None,
        }
    }

    fn irq_info(&self, index: u32) -> Option<IrqInfo> {
        let vectors = self.msix.as_ref().map_or(0, |m| u32::from(m.vectors()));
        match index {
            // Interrupt pin 0: no INTx. Flags as Linux vfio-pci reports them.
            irq::INTX => {
                Some(IrqInfo { flags: irq_flags::EVENTFD | irq_flags::MASKABLE | irq_flags::AUTOMASKED, count: 0 })
            }
            // No MSI capability.
            irq::MSI => Some(IrqInfo { flags: irq_flags::EVENTFD | irq_flags::NORESIZE, count: 0 }),
            irq::MSIX => Some(IrqInfo { flags: irq_flags::EVENTFD | irq_flags::NORESIZE, count: vectors }),
            // No AER to forward and no device request: a client must not be told to stop its VM on an error.
            irq::ERR | irq::REQ => Some(IrqInfo { flags: irq_flags::EVENTFD, count: 0 }),
            _ => None,
        }
    }

    fn region_read(&self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno> {
        if index == region::CONFIG {
            Self::config_range(offset, data.len())?;
            if self.obs.removed() {
                data.fill(0xff);
                return Ok(());
            }
            {
                let cfg = self.lock_config();
                let mut done = 0;
                for (at, w) in config_chunks(offset, data.len()) {
                    cfg.read(at, &mut data[done..done + w]).map_err(|e| e.errno())?;
                    done += w;
                }
            }
            self.obs.config(false, offset, data);
            return Ok(());
        }
        let target = self.bar_access(index, offset, data.len())?;
        if self.obs.removed() {
            data.fill(0xff);
            return Ok(());
        }
        let msix = match target {
            Target::Msix(at) => {
                self.msix.as_ref().ok_or(libc::EINVAL)?.read(at, data);
                Some(at)
            }
            Target::Engine => {
                self.engine.mmio_read(index, offset, data);
                None
            }
            Target::Undecoded => {
                data.fill(0xff);
                None
            }
        };
        self.obs.bar_read(&BarRegister { function: self, bar: index, offset, msix }, index, offset, data);
        Ok(())
    }

    fn region_write(&self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno> {
        if index == region::CONFIG {
            Self::config_range(offset, data.len())?;
            if self.obs.removed() {
                return Ok(());
            }
            self.obs.config(true, offset, data);
            let flr_byte = (self.layout.caps.pcie + PCI_EXP_DEVCTL + 1) as u64;
            let flr_bit = (PCI_EXP_DEVCTL_BCR_FLR >> 8) as u8;
            let flr = offset <= flr_byte
                && flr_byte < offset + data.len() as u64
                && data.get((flr_byte - offset) as usize).is_some_and(|b| b & flr_bit != 0);
            {
                let mut cfg = self.lock_config();
                let mut done = 0;
                for (at, w) in config_chunks(offset, data.len()) {
                    cfg.write(at, &data[done..done + w]).map_err(|e| e.errno())?;
                    done += w;
                }
                self.sync_gates(&cfg);
            }
            if flr {
                tracing::info!(device = self.name(), "function level reset initiated through Device Control");
                self.function_level_reset();
            }
            return Ok(());
        }
        let target = self.bar_access(index, offset, data.len())?;
        if self.obs.removed() {
            return Ok(());
        }
        let msix = match target {
            Target::Msix(at) => Some(at),
            _ => None,
        };
        // Traced before the engine acts, so the events a write causes follow it.
        self.obs.bar_write(&BarRegister { function: self, bar: index, offset, msix }, index, offset, data);
        match target {
            Target::Msix(at) => self.msix.as_ref().ok_or(libc::EINVAL)?.write(at, data),
            Target::Engine => self.engine.mmio_write(index, offset, data),
            Target::Undecoded => {}
        }
        Ok(())
    }

    fn attach(&self, ctx: DeviceContext) {
        self.obs.new_session();
        let irq: Arc<dyn Interrupt> = match &self.msix {
            Some(m) => {
                m.attach(ctx.irq.clone());
                Arc::new(ProbedInterrupt::new(Arc::new(MsixInterrupt(m.clone())), self.obs.clone()))
            }
            None => Arc::new(NoInterrupt),
        };
        let dma = Arc::new(BusMasterDma::new(
            ctx.dma,
            self.command.clone(),
            self.dma_refused.clone(),
            self.status_events.clone(),
        ));
        *self.dma.lock().unpoison() = Some(dma.clone());
        self.engine.attach(Arc::new(ProbedDma::new(dma, self.obs.clone())), irq);
    }

    fn detach(&self) {
        // Stop bus mastering first so any work still running fails its DMA, then let the engine wind down.
        self.power_on_reset();
        *self.dma.lock().unpoison() = None;
        self.engine.detach();
        if let Some(m) = &self.msix {
            m.detach();
        }
    }

    fn reset(&self) {
        self.function_level_reset();
    }

    fn vet_dma_map(&self, _iova: u64, _size: u64, _flags: u32) -> Result<(), Errno> {
        match self.obs.probe.fault(FaultKind::DmaMapRefuse, |_| true) {
            Some(f) => Err(f.params.errno),
            None => Ok(()),
        }
    }
}

/// One BAR access's register, named for the observer (`probed::RegisterNaming`).
struct BarRegister<'a> {
    function: &'a Function,
    bar: u32,
    offset: u64,
    /// The offset inside the MSI-X structure, when the access falls there.
    msix: Option<u64>,
}

impl RegisterNaming for BarRegister<'_> {
    fn name(&self, value: u64) -> RegisterName {
        self.function.register_name(self.bar, self.offset, value, self.msix)
    }
    fn is_named(&self) -> bool {
        self.function.register_is_named(self.bar, self.offset, self.msix)
    }
}

#[cfg(test)]
#[path = "function_tests.rs"]
mod tests;
