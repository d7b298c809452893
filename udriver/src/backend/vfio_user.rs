//! Direct vfio-user client backend: udriver talks to the device model over its UNIX socket, no VM.
//! Registers are reached through mmapped sparse areas where the server offers them, else by
//! REGION_READ/REGION_WRITE; DMA memory is shared by passing the memfd in DMA_MAP.

#![forbid(unsafe_code)]

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vfio_user_proto::client::{Client, ClientConfig, DmaProt};
use vfio_user_proto::device::{irq, region};
use vfio_user_proto::sync::Unpoison;

use super::mmio::MappedBar;
use super::wait_eventfd;
use crate::access::{AccessError, DeviceAccess, DeviceIdentity, Result};
use crate::dma::DmaMemory;

/// `VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER` (linux/vfio.h).
const IRQ_SET_EVENTFD_TRIGGER: u32 = (1 << 2) | (1 << 5);

struct Bar {
    size: u64,
    maps: Vec<MappedBar>,
}

pub struct VfioUserBackend {
    client: Client,
    bars: Vec<Option<Bar>>,
    msix: Mutex<Vec<OwnedFd>>,
    msix_count: u32,
}

fn client_err(op: &'static str, e: vfio_user_proto::client::ClientError) -> AccessError {
    AccessError::Errno { op, errno: e.errno() }
}

impl VfioUserBackend {
    /// Connects to a vfio-user server. `map_bars` = false keeps every register access trapped (for
    /// comparing the fast path with the slow one).
    pub fn connect(socket: &Path, map_bars: bool) -> Result<Self> {
        let client = Client::connect(socket, ClientConfig::default()).map_err(|e| client_err("connect", e))?;
        let mut bars = Vec::new();
        for index in region::BAR0..=region::BAR5 {
            let info = client.region_info(index).map_err(|e| client_err("DEVICE_GET_REGION_INFO", e))?;
            if info.size == 0 {
                bars.push(None);
                continue;
            }
            let mut maps = Vec::new();
            if map_bars {
                if let Some(rfd) = &info.fd {
                    for a in
                        info.sparse_areas.iter().filter(|a| a.size > 0 && a.offset.saturating_add(a.size) <= info.size)
                    {
                        match MappedBar::new(rfd.fd.as_fd(), rfd.fd_offset + a.offset, a.size, a.offset) {
                            Ok(m) => maps.push(m),
                            Err(e) => tracing::warn!("BAR{index}: mmap of sparse area failed, trapping instead: {e}"),
                        }
                    }
                }
            }
            bars.push(Some(Bar { size: info.size, maps }));
        }
        let msix_count = client.irq_info(irq::MSIX).map_or(0, |i| i.count);
        Ok(Self { client, bars, msix: Mutex::new(Vec::new()), msix_count })
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    fn mapped(&self, bar: u32, offset: u64, width: u64) -> Result<Option<&MappedBar>> {
        let b = self.bars.get(bar as usize).and_then(|b| b.as_ref());
        super::check_register(bar, b.map(|b| b.size), offset, width)?;
        Ok(b.and_then(|b| b.maps.iter().find(|m| m.covers(offset, width))))
    }

    fn read(&self, bar: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.client.region_read(bar, offset, buf).map_err(|e| client_err("REGION_READ", e))
    }

    fn write(&self, bar: u32, offset: u64, buf: &[u8]) -> Result<()> {
        self.client.region_write(bar, offset, buf).map_err(|e| client_err("REGION_WRITE", e))
    }
}

impl DeviceAccess for VfioUserBackend {
    fn identity(&self) -> DeviceIdentity {
        let mut ids = [0u8; 4];
        let config = self.read(region::CONFIG, 0, &mut ids).map(|()| ids);
        let bars = self
            .bars
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.as_ref().map(|b| (i as u32, b.size, !b.maps.is_empty())));
        super::identity("vfio-user", config, bars, self.msix_count)
    }

    fn config_read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read(region::CONFIG, offset, buf)
    }
    fn config_write(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.write(region::CONFIG, offset, buf)
    }

    fn read32(&self, bar: u32, offset: u64) -> Result<u32> {
        if let Some(m) = self.mapped(bar, offset, 4)? {
            return m.read32(bar, offset);
        }
        let mut b = [0u8; 4];
        self.read(bar, offset, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    fn write32(&self, bar: u32, offset: u64, value: u32) -> Result<()> {
        match self.mapped(bar, offset, 4)? {
            Some(m) => m.write32(bar, offset, value),
            None => self.write(bar, offset, &value.to_le_bytes()),
        }
    }
    fn read64(&self, bar: u32, offset: u64) -> Result<u64> {
        if let Some(m) = self.mapped(bar, offset, 8)? {
            return m.read64(bar, offset);
        }
        let mut b = [0u8; 8];
        self.read(bar, offset, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    fn write64(&self, bar: u32, offset: u64, value: u64) -> Result<()> {
        match self.mapped(bar, offset, 8)? {
            Some(m) => m.write64(bar, offset, value),
            None => self.write(bar, offset, &value.to_le_bytes()),
        }
    }

    fn dma_map(&self, mem: &Arc<DmaMemory>, offset: u64, len: u64, iova: u64) -> Result<()> {
        super::check_dma_map(mem, offset, len, iova)?;
        self.client.dma_map_fd(iova, len, mem.fd(), offset, DmaProt::READ_WRITE).map_err(|e| client_err("DMA_MAP", e))
    }

    fn dma_unmap(&self, iova: u64, len: u64) -> Result<()> {
        self.client.dma_unmap(iova, len).map_err(|e| client_err("DMA_UNMAP", e))
    }

    fn enable_msix(&self, nvec: u32) -> Result<()> {
        super::check_msix_vectors(nvec, self.msix_count)?;
        let fds: Vec<OwnedFd> = (0..nvec)
            .map(|_| {
                rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)
                    .map_err(|e| AccessError::Io { op: "eventfd", source: e.into() })
            })
            .collect::<Result<_>>()?;
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        self.client
            .set_irqs(irq::MSIX, IRQ_SET_EVENTFD_TRIGGER, 0, &borrowed)
            .map_err(|e| client_err("DEVICE_SET_IRQS", e))?;
        *self.msix.lock().unpoison() = fds;
        // No kernel in between: the driver turns MSI-X on in config space itself.
        super::msix_enable(self)
    }

    fn wait_irq(&self, vector: u32, timeout: Duration) -> Result<bool> {
        // A duplicate, so a waiter on one vector never holds up another vector's waiter or a re-enable.
        let fd = {
            let fds = self.msix.lock().unpoison();
            let fd = fds.get(vector as usize).ok_or(AccessError::VectorNotEnabled(vector))?;
            fd.try_clone().map_err(|e| AccessError::Io { op: "dup eventfd", source: e })?
        };
        wait_eventfd(fd.as_fd(), timeout)
    }
}
