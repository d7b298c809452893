//! `Function`: one engine as a PCI function served over vfio-user (docs/pci.md for every policy here).

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vfio_user_proto::device::{
    device_flags, irq, irq_flags, region, region_flags, Device, DeviceContext, DeviceInfo, Errno, IrqInfo, RegionInfo,
    SparseArea,
};

use super::config::{BarLayout, ConfigLayout, ConfigSpace, PCIE_CAP_OFFSET};
use super::dma::BusMasterDma;
use super::msix::{msix_bar_layout, Msix};
use super::regs::*;
use super::{PciError, PciIds, MSIX_BAR};
use crate::engine::{BarSpec, Engine, Interrupt, NoInterrupt};

/// Smallest BAR an engine may declare, and the mmap granule.
const PAGE_SIZE: u64 = 4096;
/// Widths a BAR access may have.
const BAR_ACCESS_WIDTHS: [usize; 4] = [1, 2, 4, 8];

/// Who answers a trapped BAR access.
enum BarTarget {
    Msix,
    Engine,
    /// Memory Space Enable is clear: nothing decodes the access.
    Undecoded,
}

/// What sits behind a BAR slot.
enum Bar {
    Engine(BarSpec),
    Msix,
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
    /// Counted refusals: BAR accesses with Memory Space disabled, DMA with Bus Master disabled.
    mmio_refused: AtomicU64,
    dma_refused: Arc<AtomicU64>,
    /// Status bits the DMA path raised, folded into config space under its lock.
    status_events: Arc<AtomicU16>,
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
        let width = [4usize, 2, 1].into_iter().find(|&w| at % w as u64 == 0 && left >= w).unwrap_or(1);
        pos += width;
        Some((at, width))
    })
}

impl Function {
    /// A function for `engine`. A BAR the engine declares badly (see `try_new`) is logged and left out.
    pub fn new(engine: Arc<dyn Engine>, ids: PciIds) -> Arc<Function> {
        let specs = engine.bars();
        let reserve = engine.msix_vectors() > 0;
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
        Self::build(engine, ids, kept)
    }

    /// Like `new`, but an engine BAR that is misplaced, missized or overlapping is an error.
    pub fn try_new(engine: Arc<dyn Engine>, ids: PciIds) -> Result<Arc<Function>, PciError> {
        let specs = engine.bars();
        validate_bars(&specs, engine.msix_vectors() > 0)?;
        Ok(Self::build(engine, ids, specs))
    }

    fn build(engine: Arc<dyn Engine>, ids: PciIds, specs: Vec<BarSpec>) -> Arc<Function> {
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
        let (msix, msix_layout) = if vectors > 0 {
            let (ml, size) = msix_bar_layout(vectors);
            let i = MSIX_BAR as usize;
            bar_sizes[i] = size;
            bars[i] = Some(Bar::Msix);
            layouts.push(BarLayout { index: i, size, is_64bit: false, prefetchable: false });
            (Some(Arc::new(Msix::new(vectors))), Some(ml))
        } else {
            (None, None)
        };
        let layout = ConfigLayout { ids, bars: layouts, msix: msix_layout };
        Arc::new(Function {
            engine,
            config: Mutex::new(ConfigSpace::new(&layout)),
            layout,
            bars,
            bar_sizes,
            command: Arc::new(AtomicU16::new(0)),
            msix,
            mmio_refused: AtomicU64::new(0),
            dma_refused: Arc::new(AtomicU64::new(0)),
            status_events: Arc::new(AtomicU16::new(0)),
        })
    }

    fn lock_config(&self) -> MutexGuard<'_, ConfigSpace> {
        let mut cfg = self.config.lock().unwrap_or_else(|e| e.into_inner());
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
            let devctl = PCIE_CAP_OFFSET + PCI_EXP_DEVCTL;
            let lnkctl = PCIE_CAP_OFFSET + PCI_EXP_LNKCTL;
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

    /// Common checks of a BAR access; returns whether the MSI-X BAR is behind it (else the engine's).
    fn bar_access(&self, index: u32, offset: u64, len: usize) -> Result<BarTarget, Errno> {
        let i = Self::bar_index(index).ok_or(libc::EINVAL)?;
        let target = match &self.bars[i] {
            None => return Err(libc::EINVAL),
            Some(Bar::Msix) => BarTarget::Msix,
            Some(Bar::Engine(_)) => BarTarget::Engine,
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
            return Ok(BarTarget::Undecoded);
        }
        Ok(target)
    }

    fn config_range(offset: u64, len: usize) -> Result<(), Errno> {
        let end = offset.checked_add(len as u64).ok_or(libc::EINVAL)?;
        if len == 0 || end > PCI_CFG_SPACE_EXP_SIZE as u64 {
            return Err(libc::EINVAL);
        }
        Ok(())
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
            let cfg = self.lock_config();
            let mut done = 0;
            for (at, w) in config_chunks(offset, data.len()) {
                cfg.read(at, &mut data[done..done + w]).map_err(|e| e.errno())?;
                done += w;
            }
            return Ok(());
        }
        match self.bar_access(index, offset, data.len())? {
            BarTarget::Msix => self.msix.as_ref().ok_or(libc::EINVAL)?.read(offset, data),
            BarTarget::Engine => self.engine.mmio_read(index, offset, data),
            BarTarget::Undecoded => data.fill(0xff),
        }
        Ok(())
    }

    fn region_write(&self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno> {
        if index == region::CONFIG {
            Self::config_range(offset, data.len())?;
            let flr_byte = (PCIE_CAP_OFFSET + PCI_EXP_DEVCTL + 1) as u64;
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
        match self.bar_access(index, offset, data.len())? {
            BarTarget::Msix => self.msix.as_ref().ok_or(libc::EINVAL)?.write(offset, data),
            BarTarget::Engine => self.engine.mmio_write(index, offset, data),
            BarTarget::Undecoded => {}
        }
        Ok(())
    }

    fn attach(&self, ctx: DeviceContext) {
        let irq: Arc<dyn Interrupt> = match &self.msix {
            Some(m) => {
                m.attach(ctx.irq.clone());
                Arc::new(MsixInterrupt(m.clone()))
            }
            None => Arc::new(NoInterrupt),
        };
        let dma = Arc::new(BusMasterDma::new(
            ctx.dma,
            self.command.clone(),
            self.dma_refused.clone(),
            self.status_events.clone(),
        ));
        self.engine.attach(dma, irq);
    }

    fn detach(&self) {
        // Stop bus mastering first so any work still running fails its DMA, then let the engine wind down.
        self.power_on_reset();
        self.engine.detach();
        if let Some(m) = &self.msix {
            m.detach();
        }
    }

    fn reset(&self) {
        self.function_level_reset();
    }
}

#[cfg(test)]
#[path = "function_tests.rs"]
mod tests;
