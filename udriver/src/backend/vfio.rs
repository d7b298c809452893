//! Linux VFIO backend (inside a guest, or on any host with an IOMMU): container, group and device through
//! vfio-ioctls; BARs mmapped where VFIO allows it, else read and written with pread/pwrite on the device fd
//! (vfio-ioctls' own region_read/region_write only log errors, so they are not used).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use vfio_bindings::bindings::vfio::{
    VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_MSIX_IRQ_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
};
use vfio_ioctls::{VfioContainer, VfioDevice, VfioRegionInfoCap};
use vfio_user_proto::sync::Unpoison;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::mmio::MappedBar;
use super::wait_eventfd;
use crate::access::{AccessError, DeviceAccess, DeviceIdentity, Result};
use crate::dma::{DmaMemory, PAGE_SIZE};

/// One BAR: its size, where it lives in the device fd, and the parts we could map.
struct Bar {
    size: u64,
    fd_offset: u64,
    maps: Vec<MappedBar>,
}

/// Fields drop in declaration order, and the order matters: the BAR mmaps hold the device file open, and
/// while it is open the kernel refuses VFIO_GROUP_UNSET_CONTAINER (EBUSY), which `VfioDevice`'s drop does.
pub struct VfioBackend {
    bars: Vec<Option<Bar>>,
    msix: std::sync::Mutex<Vec<EventFd>>,
    device: VfioDevice,
    container: Arc<VfioContainer>,
    sysfs: PathBuf,
}

/// Turns `0000:00:03.0`, `00:03.0` or a sysfs directory into the device's sysfs path.
pub fn sysfs_path(dev: &str) -> PathBuf {
    if dev.starts_with('/') {
        return PathBuf::from(dev);
    }
    let full = if dev.matches(':').count() == 1 { format!("0000:{dev}") } else { dev.to_string() };
    Path::new("/sys/bus/pci/devices").join(full)
}

fn vfio_err(op: &'static str, e: vfio_ioctls::VfioError) -> AccessError {
    AccessError::Vfio { op, source: e }
}

impl VfioBackend {
    pub fn open(dev: &str) -> Result<Self> {
        let sysfs = sysfs_path(dev);
        if !sysfs.join("iommu_group").exists() {
            return Err(AccessError::NoIommuGroup(sysfs));
        }
        let container = Arc::new(VfioContainer::new(None).map_err(|e| vfio_err("open VFIO container", e))?);
        let device = VfioDevice::new(&sysfs, container.clone(), false).map_err(|e| vfio_err("open VFIO device", e))?;
        let mut bars = Vec::new();
        for index in 0..6u32 {
            let size = device.get_region_size(index);
            if size == 0 {
                bars.push(None);
                continue;
            }
            let fd_offset = device.get_region_offset(index);
            let mut maps = Vec::new();
            if device.get_region_flags(index) & VFIO_REGION_INFO_FLAG_MMAP != 0 {
                let sparse: Vec<(u64, u64)> = device
                    .get_region_caps(index)
                    .into_iter()
                    .find_map(|c| match c {
                        VfioRegionInfoCap::SparseMmap(s) => Some(s.areas.iter().map(|a| (a.offset, a.size)).collect()),
                        _ => None,
                    })
                    .unwrap_or_else(|| vec![(0, size)]);
                let fd = device_fd(&device);
                for (off, len) in sparse.into_iter().filter(|(o, l)| *l > 0 && o.saturating_add(*l) <= size) {
                    match MappedBar::new(fd, fd_offset + off, len, off) {
                        Ok(m) => maps.push(m),
                        Err(e) => tracing::warn!("BAR{index}: mmap of {off:#x}+{len:#x} failed, trapping instead: {e}"),
                    }
                }
            }
            bars.push(Some(Bar { size, fd_offset, maps }));
        }
        Ok(Self { container, device, bars, msix: std::sync::Mutex::new(Vec::new()), sysfs })
    }

    fn bar(&self, bar: u32) -> Result<&Bar> {
        self.bars.get(bar as usize).and_then(|b| b.as_ref()).ok_or(AccessError::NoSuchBar(bar))
    }

    fn check(&self, bar: u32, offset: u64, width: u64) -> Result<&Bar> {
        let b = self.bar(bar)?;
        super::check_register(bar, Some(b.size), offset, width)?;
        Ok(b)
    }

    fn fd(&self) -> BorrowedFd<'_> {
        device_fd(&self.device)
    }

    /// The mapping covering `[offset, offset + width)` of a BAR, after the range check.
    fn mapped(&self, bar: u32, offset: u64, width: u64) -> Result<(&Bar, Option<&MappedBar>)> {
        let b = self.check(bar, offset, width)?;
        Ok((b, b.maps.iter().find(|m| m.covers(offset, width))))
    }

    fn pread(&self, fd_offset: u64, buf: &mut [u8]) -> Result<()> {
        let n = rustix::io::pread(self.fd(), &mut *buf, fd_offset)
            .map_err(|e| AccessError::Io { op: "VFIO region read", source: e.into() })?;
        if n != buf.len() {
            return Err(AccessError::Short { op: "VFIO region read", done: n, wanted: buf.len() });
        }
        Ok(())
    }

    fn pwrite(&self, fd_offset: u64, buf: &[u8]) -> Result<()> {
        let n = rustix::io::pwrite(self.fd(), buf, fd_offset)
            .map_err(|e| AccessError::Io { op: "VFIO region write", source: e.into() })?;
        if n != buf.len() {
            return Err(AccessError::Short { op: "VFIO region write", done: n, wanted: buf.len() });
        }
        Ok(())
    }

    fn config_read_raw(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.pread(self.device.get_region_offset(VFIO_PCI_CONFIG_REGION_INDEX) + offset, buf)
    }

    pub fn sysfs(&self) -> &Path {
        &self.sysfs
    }
}

/// The device fd, borrowed for as long as the device lives (`VfioDevice` only offers `AsRawFd`).
fn device_fd(device: &VfioDevice) -> BorrowedFd<'_> {
    // SAFETY: the raw fd belongs to `device`, which outlives the returned borrow by the signature.
    unsafe { BorrowedFd::borrow_raw(device.as_raw_fd()) }
}

impl DeviceAccess for VfioBackend {
    fn identity(&self) -> DeviceIdentity {
        let mut ids = [0u8; 4];
        let config = self.config_read_raw(0, &mut ids).map(|()| ids);
        let bars = self
            .bars
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.as_ref().map(|b| (i as u32, b.size, !b.maps.is_empty())));
        let msix = self.device.get_irq_info(VFIO_PCI_MSIX_IRQ_INDEX).map_or(0, |i| i.count);
        super::identity("vfio", config, bars, msix)
    }

    fn config_read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.config_read_raw(offset, buf)
    }
    fn config_write(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.pwrite(self.device.get_region_offset(VFIO_PCI_CONFIG_REGION_INDEX) + offset, buf)
    }

    fn read32(&self, bar: u32, offset: u64) -> Result<u32> {
        match self.mapped(bar, offset, 4)? {
            (_, Some(m)) => m.read32(bar, offset),
            (b, None) => {
                let mut buf = [0u8; 4];
                self.pread(b.fd_offset + offset, &mut buf)?;
                Ok(u32::from_le_bytes(buf))
            }
        }
    }

    fn write32(&self, bar: u32, offset: u64, value: u32) -> Result<()> {
        match self.mapped(bar, offset, 4)? {
            (_, Some(m)) => m.write32(bar, offset, value),
            (b, None) => self.pwrite(b.fd_offset + offset, &value.to_le_bytes()),
        }
    }

    fn read64(&self, bar: u32, offset: u64) -> Result<u64> {
        match self.mapped(bar, offset, 8)? {
            (_, Some(m)) => m.read64(bar, offset),
            (b, None) => {
                let mut buf = [0u8; 8];
                self.pread(b.fd_offset + offset, &mut buf)?;
                Ok(u64::from_le_bytes(buf))
            }
        }
    }

    fn write64(&self, bar: u32, offset: u64, value: u64) -> Result<()> {
        match self.mapped(bar, offset, 8)? {
            (_, Some(m)) => m.write64(bar, offset, value),
            (b, None) => self.pwrite(b.fd_offset + offset, &value.to_le_bytes()),
        }
    }

    fn dma_map(&self, mem: &Arc<DmaMemory>, offset: u64, len: u64, iova: u64) -> Result<()> {
        super::check_dma_map(mem, offset, len, iova)?;
        // The IOMMU maps whole pages.
        if [offset, len, iova].iter().any(|v| v % PAGE_SIZE != 0) {
            return Err(AccessError::BadDmaMap { offset, len, iova });
        }
        let addr = (mem.addr() + offset) as *mut u8;
        // SAFETY: `[addr, addr+len)` lies inside `mem`'s mapping (checked above). DmaMemory only ever
        // touches it through volatile accesses on raw pointers and never creates references to it, which
        // is what vfio_dma_map requires; the buffer's owner unmaps it before releasing the memory.
        unsafe { self.container.vfio_dma_map(iova, len as usize, addr) }.map_err(|e| vfio_err("VFIO_IOMMU_MAP_DMA", e))
    }

    fn dma_unmap(&self, iova: u64, len: u64) -> Result<()> {
        self.container.vfio_dma_unmap(iova, len as usize).map_err(|e| vfio_err("VFIO_IOMMU_UNMAP_DMA", e))
    }

    fn enable_msix(&self, nvec: u32) -> Result<()> {
        let max = self.device.get_irq_info(VFIO_PCI_MSIX_IRQ_INDEX).map_or(0, |i| i.count);
        super::check_msix_vectors(nvec, max)?;
        let fds: Vec<EventFd> = (0..nvec)
            .map(|_| EventFd::new(EFD_NONBLOCK).map_err(|e| AccessError::Io { op: "eventfd", source: e }))
            .collect::<Result<_>>()?;
        self.device.enable_msix(fds.iter().collect()).map_err(|e| vfio_err("VFIO_DEVICE_SET_IRQS", e))?;
        *self.msix.lock().unpoison() = fds;
        Ok(())
    }

    fn wait_irq(&self, vector: u32, timeout: Duration) -> Result<bool> {
        // A duplicate, so a waiter on one vector never holds up another vector's waiter or a re-enable.
        let fd = {
            let fds = self.msix.lock().unpoison();
            let fd = fds.get(vector as usize).ok_or(AccessError::VectorNotEnabled(vector))?;
            fd.try_clone().map_err(|e| AccessError::Io { op: "dup eventfd", source: e })?
        };
        // SAFETY: `fd` is our own duplicate and outlives the wait.
        let bfd = unsafe { BorrowedFd::borrow_raw(fd.as_raw_fd()) };
        wait_eventfd(bfd, timeout)
    }
}

impl Drop for VfioBackend {
    fn drop(&mut self) {
        if !self.msix.get_mut().map(|v| v.is_empty()).unwrap_or(true) {
            let _ = self.device.disable_msix();
        }
    }
}
