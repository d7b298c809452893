//! The benchmarks' peer: rust-vmm's `vfio_user` server (0.1.7) serving one of our `Device`s. The same
//! device behind a second, independent vfio-user server, so a client (ours, or QEMU in the guest) can
//! compare what our server adds with what another implementation adds.
//!
//! The peer does no DMA: a device behind it sees no memory (every access fails, as before a client maps
//! any), and DMA_MAP/UNMAP are accepted and dropped. Interrupts go to the client's eventfds through our
//! own `IrqState`, so SET_IRQS behaves as it does on our server.

#![forbid(unsafe_code)]

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use device_model::hfi1::{Hfi1, Hfi1Config};
use device_model::pci::{Function, PciIds};
use vfio_user_proto::server::{Server, ServerConfig};

use vfio_bindings::bindings::vfio::vfio_region_info;
use vfio_user_proto::device::{irq, region, Device, DeviceContext, RegionFd};
use vfio_user_proto::dma::NoDma;
use vfio_user_proto::irq::IrqState;
use vfio_user_proto::wire::SetIrqs;

use crate::RigError;

/// Our device as rust-vmm's server backend.
pub struct PeerBackend {
    device: Arc<dyn Device>,
    irq: Arc<IrqState>,
}

fn errno(e: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(e)
}

impl PeerBackend {
    /// Attaches `device` for the peer's one client.
    pub fn new(device: Arc<dyn Device>) -> Self {
        let irq = Arc::new(IrqState::new());
        device.attach(DeviceContext { dma: Arc::new(NoDma), irq: irq.clone() });
        Self { device, irq }
    }
}

impl Drop for PeerBackend {
    fn drop(&mut self) {
        self.irq.clear();
        self.device.detach();
    }
}

impl vfio_user::ServerBackend for PeerBackend {
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> std::io::Result<()> {
        // rust-vmm's server does not check the range; ours does before calling a device.
        let size = self.device.region_info(region).map_or(0, |r| r.size);
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > size) {
            return Err(errno(libc::EINVAL));
        }
        self.device.region_read(region, offset, data).map_err(errno)
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let size = self.device.region_info(region).map_or(0, |r| r.size);
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > size) {
            return Err(errno(libc::EINVAL));
        }
        self.device.region_write(region, offset, data).map_err(errno)
    }

    fn dma_map(
        &mut self,
        _flags: vfio_user::DmaMapFlags,
        _offset: u64,
        _address: u64,
        _size: u64,
        _fd: Option<File>,
    ) -> std::io::Result<()> {
        Ok(())
    }

    fn dma_unmap(&mut self, _flags: vfio_user::DmaUnmapFlags, _address: u64, _size: u64) -> std::io::Result<()> {
        Ok(())
    }

    fn reset(&mut self) -> std::io::Result<()> {
        self.device.reset();
        Ok(())
    }

    fn set_irqs(&mut self, index: u32, flags: u32, start: u32, count: u32, fds: Vec<File>) -> std::io::Result<()> {
        let req = SetIrqs { argsz: 0, flags, index, start, count };
        let fds = fds.into_iter().map(OwnedFd::from).collect();
        self.irq.set_irqs(&req, self.device.irq_info(index), &[], fds).map_err(errno)
    }
}

/// What rust-vmm's server announces for `device`: every region index up to the config space (a missing one
/// with size 0, as VFIO reports an absent BAR) and every IRQ index, and the descriptor of the mmappable parts.
/// The descriptors stay owned by the device; the returned `RegionFd`s keep them open.
fn layout(device: &dyn Device) -> (Vec<vfio_user::ServerRegion>, Vec<vfio_user::IrqInfo>, Vec<RegionFd>) {
    let mut regions = Vec::new();
    let mut fds = Vec::new();
    for index in 0..region::NUM_REGIONS {
        let info = device.region_info(index).unwrap_or_default();
        let fd = info.fd.clone().filter(|_| !info.sparse_areas.is_empty());
        let region_info = vfio_region_info {
            argsz: std::mem::size_of::<vfio_region_info>() as u32,
            flags: info.flags,
            index,
            cap_offset: 0,
            size: info.size,
            offset: fd.as_ref().map_or(0, |f| f.fd_offset),
        };
        let sparse_areas = info
            .sparse_areas
            .iter()
            .map(|a| vfio_user::SparseArea {
                area: vfio_bindings::bindings::vfio::vfio_region_sparse_mmap_area { offset: a.offset, size: a.size },
            })
            .collect();
        regions.push(vfio_user::ServerRegion {
            region_info,
            sparse_areas,
            mmap_fd: fd.as_ref().map(|f| f.fd.as_raw_fd()),
        });
        fds.extend(fd);
    }
    let irqs = (0..irq::NUM_IRQS)
        .map(|index| {
            let i = device.irq_info(index).unwrap_or_default();
            vfio_user::IrqInfo { index, flags: i.flags, count: i.count }
        })
        .collect();
    (regions, irqs, fds)
}

/// Serves `device` with rust-vmm's server on `path`, one client after another, until a client's session
/// ends in an error other than a disconnect or the socket cannot be bound again. Blocks.
pub fn serve(device: Arc<dyn Device>, path: &Path) -> Result<(), RigError> {
    loop {
        serve_one(device.clone(), path)?;
    }
}

/// Serves one client of `device` on `path`, returning when it disconnects.
pub fn serve_one(device: Arc<dyn Device>, path: &Path) -> Result<(), RigError> {
    let (regions, irqs, _fds) = layout(device.as_ref());
    let server = vfio_user::Server::new(path, true, irqs, regions)
        .map_err(|e| RigError::Peer(format!("bind {}: {e}", path.display())))?;
    let mut backend = PeerBackend::new(device);
    server.run(&mut backend).map_err(|e| RigError::Peer(format!("serving {}: {e}", path.display())))
}

/// PCI device IDs of the in-guest benchmark's extra hfi1 functions (beside ours, 1b36:1100).
pub const PEER_DEVICE_ID: u16 = 0x1102;
pub const POLLED_DEVICE_ID: u16 = 0x1103;

/// An hfi1 function of its own with device ID `device_id`.
pub fn hfi1_function(device_id: u16) -> Result<Arc<Function>, RigError> {
    let engine = Arc::new(Hfi1::new(Hfi1Config::default()).map_err(|e| RigError::Peer(format!("hfi1 engine: {e}")))?);
    Ok(Function::try_new(engine, PciIds { device_id, ..PciIds::hfi1_default() })?)
}

/// `testbed serve-peers`: an hfi1 function behind rust-vmm's server on `peer` and one behind ours with `busy_poll`
/// (zero: off) on `polled`, each serving one client after another until the process is killed or a socket fails.
pub fn serve_peers(peer: &Path, polled: &Path, busy_poll: Duration) -> Result<(), RigError> {
    let peer_fn = hfi1_function(PEER_DEVICE_ID)?;
    let polled_fn = hfi1_function(POLLED_DEVICE_ID)?;
    let _ = std::fs::remove_file(polled);
    let listener = UnixListener::bind(polled).map_err(|source| RigError::Io { op: "bind", source })?;
    let server = Server::new(polled_fn, ServerConfig { busy_poll, ..Default::default() });
    let ours = std::thread::Builder::new()
        .name("testbed-polled".into())
        .spawn(move || server.serve(listener))
        .map_err(|source| RigError::Io { op: "spawn server thread", source })?;
    let _ = std::fs::remove_file(peer);
    let result = serve(peer_fn, peer);
    drop(ours);
    for path in [peer, polled] {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// How long dropping a [`PeerServed`] waits for its thread.
const PEER_JOIN_WAIT: Duration = Duration::from_secs(5);

/// The peer on its own thread for one client, on a private socket; the thread ends when that client
/// disconnects, and is joined on drop (drop the client first: with it still connected, drop waits
/// [`PEER_JOIN_WAIT`] and leaves the thread).
pub struct PeerServed {
    path: PathBuf,
    thread: Option<JoinHandle<Result<(), RigError>>>,
}

impl PeerServed {
    pub fn new(device: Arc<dyn Device>) -> Result<Self, RigError> {
        let path = crate::served::socket_path("peer");
        let _ = std::fs::remove_file(&path);
        // Bound before the thread starts, so a client may connect as soon as this returns.
        let (regions, irqs, fds) = layout(device.as_ref());
        let server = vfio_user::Server::new(&path, true, irqs, regions)
            .map_err(|e| RigError::Peer(format!("bind {}: {e}", path.display())))?;
        let thread = std::thread::Builder::new()
            .name("testbed-peer".into())
            .spawn(move || {
                let _fds = fds;
                let mut backend = PeerBackend::new(device);
                server.run(&mut backend).map_err(|e| RigError::Peer(e.to_string()))
            })
            .map_err(|source| RigError::Io { op: "spawn peer thread", source })?;
        Ok(Self { path, thread: Some(thread) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PeerServed {
    fn drop(&mut self) {
        // rust-vmm's server has no stop: a thread whose client never came is woken by a connection that
        // closes at once.
        if let Some(t) = self.thread.take() {
            if !t.is_finished() {
                let _ = std::os::unix::net::UnixStream::connect(&self.path);
            }
            // A client still connected keeps the thread serving: wait a bounded time, then leave it rather
            // than hang the caller.
            let deadline = Instant::now() + PEER_JOIN_WAIT;
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::warn!(
                    "testbed: the peer on {} still serves a client; its thread is left",
                    self.path.display()
                );
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
