//! A synchronous vfio-user client with timeouts.
//!
//! Requests may be issued from several threads. A caller reads the socket itself while it waits (no
//! hand-off between threads on the fast path), routing other callers' replies by message id and
//! answering the server's DMA_READ/DMA_WRITE from the memory registered with
//! [`Client::dma_map_backed`]; an idle reader thread does that while nobody waits (see `reader`).
//! Everything the server sends is checked like client input is on the server side.

#![forbid(unsafe_code)]

mod reader;
mod types;

use std::fs::File;
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::AtomicU16;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};

use crate::device::{DeviceInfo, IrqInfo, RegionFd, RegionInfo, SparseArea};
use crate::frame_reader::{recv_message, FrameLimits, FrameReader};
use crate::sock::{Message, SCM_MAX_FD};
use crate::sync::Unpoison;
use crate::wire::{
    command as cmd, parse_sparse_caps, put_u16, put_u32, put_u64, DmaMap, DmaUnmap, FourU32, Header, Reader,
    RegionInfoWire, RegionRw, SetIrqs, DEVICE_INFO_SIZE, DMA_MAP_SIZE, DMA_UNMAP_SIZE, IRQ_INFO_SIZE, PAGE_SIZE,
    REGION_INFO_SIZE, REGION_RW_SIZE, SET_IRQS_SIZE, VERSION_MAJOR, VERSION_MINOR, WRITE_MULTI_MAX_DATA,
    WRITE_MULTI_MAX_ENTRIES,
};
use reader::{Backed, FdBacking, Shared};
pub use types::{ClientConfig, ClientDmaBacking, ClientError, DmaProt};

/// What the server advertised in its VERSION reply.
#[derive(Debug, Clone, Copy)]
pub struct ServerCaps {
    pub max_msg_fds: u32,
    pub max_data_xfer_size: u32,
    pub max_dma_maps: u32,
    pub write_multiple: bool,
}

pub struct Client {
    shared: Arc<Shared>,
    idle: Option<JoinHandle<()>>,
    next_id: AtomicU16,
    config: ClientConfig,
    caps: ServerCaps,
    max_msg_size: u32,
}

fn protocol(what: &str) -> ClientError {
    ClientError::Protocol(what.to_string())
}

const MSG_OVERHEAD: u32 = 8192;

impl Client {
    pub fn connect(path: &Path, config: ClientConfig) -> Result<Client, ClientError> {
        Self::from_stream(UnixStream::connect(path)?, config)
    }

    pub fn from_stream(stream: UnixStream, mut config: ClientConfig) -> Result<Client, ClientError> {
        config.max_msg_fds = config.max_msg_fds.clamp(1, SCM_MAX_FD);
        config.max_data_xfer_size = config.max_data_xfer_size.max(1);
        // A zero socket timeout would mean "none" to the kernel (and is refused by std).
        config.timeout = config.timeout.max(Duration::from_millis(1));
        let max_msg_size = config.max_data_xfer_size.saturating_add(MSG_OVERHEAD);
        stream.set_write_timeout(Some(config.timeout))?;
        let caps = Self::negotiate(&stream, &config, max_msg_size)?;
        let limits = FrameLimits { max_msg_size, max_fds: config.max_msg_fds, stall_timeout: config.timeout };
        let frames = if config.exact_reads { FrameReader::exact(limits) } else { FrameReader::new(limits) };
        let shared =
            Arc::new(Shared::new(stream, frames, config.max_data_xfer_size, config.timeout, config.busy_poll)?);
        let s = shared.clone();
        let idle = std::thread::Builder::new().name("vfio-user-client".into()).spawn(move || s.idle_reader())?;
        Ok(Client { shared, idle: Some(idle), next_id: AtomicU16::new(1), config, caps, max_msg_size })
    }

    fn negotiate(stream: &UnixStream, config: &ClientConfig, max_msg_size: u32) -> Result<ServerCaps, ClientError> {
        let text = json!({ "capabilities": {
            "max_msg_fds": config.max_msg_fds,
            "max_data_xfer_size": config.max_data_xfer_size,
            "pgsizes": PAGE_SIZE,
            "max_dma_maps": 65535,
            "write_multiple": true,
        }})
        .to_string();
        let mut p = Vec::with_capacity(text.len() + 5);
        put_u16(&mut p, VERSION_MAJOR);
        put_u16(&mut p, VERSION_MINOR);
        p.extend_from_slice(text.as_bytes());
        p.push(0);
        crate::sock::send_message(stream, &Header::command(0, cmd::VERSION, p.len()), &[&p], &[])?;
        stream.set_read_timeout(Some(config.timeout))?;
        let limits = FrameLimits { max_msg_size, max_fds: 1, stall_timeout: config.timeout };
        let reply = recv_message(stream, &limits);
        stream.set_read_timeout(None)?;
        let reply = reply?;
        let h = reply.header;
        if !h.is_reply() || h.command != cmd::VERSION || h.msg_id != 0 {
            return Err(protocol("VERSION reply expected"));
        }
        if h.is_error() {
            return Err(ClientError::Remote { command: cmd::VERSION, errno: errno_of(&h) });
        }
        let mut r = Reader::new(&reply.payload);
        let major = r.u16().map_err(|_| protocol("short VERSION reply"))?;
        let minor = r.u16().map_err(|_| protocol("short VERSION reply"))?;
        if major != VERSION_MAJOR || minor > VERSION_MINOR {
            return Err(protocol("unsupported server version"));
        }
        let caps = parse_server_caps(r.rest())?;
        let get = |k: &str, d: u64| caps.get(k).and_then(Value::as_u64).unwrap_or(d);
        let clamp32 = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        Ok(ServerCaps {
            max_msg_fds: clamp32(get("max_msg_fds", 1)).clamp(1, SCM_MAX_FD),
            max_data_xfer_size: clamp32(get("max_data_xfer_size", 1 << 20)).clamp(1, config.max_data_xfer_size),
            max_dma_maps: clamp32(get("max_dma_maps", 65535)),
            write_multiple: caps.get("write_multiple").and_then(Value::as_bool).unwrap_or(false),
        })
    }

    /// The server's advertised limits.
    pub fn server_caps(&self) -> ServerCaps {
        self.caps
    }

    fn request(&self, command: u16, parts: &[&[u8]], fds: &[BorrowedFd]) -> Result<Message, ClientError> {
        let m = self.shared.round_trip(&self.next_id, command, parts, fds, self.config.timeout)?;
        if m.header.is_error() {
            return Err(ClientError::Remote { command, errno: errno_of(&m.header) });
        }
        if m.header.command != command {
            return Err(protocol("reply to another command"));
        }
        Ok(m)
    }

    pub fn device_info(&self) -> Result<DeviceInfo, ClientError> {
        let q = FourU32([DEVICE_INFO_SIZE as u32, 0, 0, 0]).encode();
        let m = self.request(cmd::DEVICE_GET_INFO, &[&q], &[])?;
        let [_, flags, num_regions, num_irqs] = FourU32::decode(&m.payload).map_err(|_| protocol("DEVICE_GET_INFO"))?.0;
        Ok(DeviceInfo { flags, num_regions, num_irqs })
    }

    fn region_info_raw(&self, index: u32, argsz: u32) -> Result<Message, ClientError> {
        let q = RegionInfoWire { argsz, index, ..Default::default() }.encode();
        self.request(cmd::DEVICE_GET_REGION_INFO, &[&q], &[])
    }

    /// Region size and flags, its sparse-mmap areas and the fd to mmap them, when offered.
    pub fn region_info(&self, index: u32) -> Result<RegionInfo, ClientError> {
        let mut m = self.region_info_raw(index, REGION_INFO_SIZE as u32)?;
        let first = RegionInfoWire::decode_prefix(&m.payload).map_err(|_| protocol("DEVICE_GET_REGION_INFO"))?;
        if first.argsz as usize > m.payload.len() {
            if first.argsz > self.max_msg_size {
                return Err(protocol("region info too large"));
            }
            m = self.region_info_raw(index, first.argsz)?;
        }
        let w = RegionInfoWire::decode_prefix(&m.payload).map_err(|_| protocol("DEVICE_GET_REGION_INFO"))?;
        let areas = if w.cap_offset != 0 {
            parse_sparse_caps(&m.payload, w.cap_offset).map_err(|e| ClientError::Protocol(e.to_string()))?
        } else {
            Vec::new()
        };
        let fd = m.fds.into_iter().next().map(|fd| RegionFd { fd: Arc::new(fd), fd_offset: w.offset });
        Ok(RegionInfo {
            size: w.size,
            flags: w.flags,
            sparse_areas: areas.into_iter().map(|(offset, size)| SparseArea { offset, size }).collect(),
            fd,
        })
    }

    pub fn irq_info(&self, index: u32) -> Result<IrqInfo, ClientError> {
        let q = FourU32([IRQ_INFO_SIZE as u32, 0, index, 0]).encode();
        let m = self.request(cmd::DEVICE_GET_IRQ_INFO, &[&q], &[])?;
        let [_, flags, _, count] = FourU32::decode(&m.payload).map_err(|_| protocol("DEVICE_GET_IRQ_INFO"))?.0;
        Ok(IrqInfo { flags, count })
    }

    fn chunk(&self) -> usize {
        self.caps.max_data_xfer_size as usize
    }

    pub fn region_read(&self, index: u32, offset: u64, buf: &mut [u8]) -> Result<(), ClientError> {
        let mut off = offset;
        for dst in buf.chunks_mut(self.chunk()) {
            let q = RegionRw { offset: off, region: index, count: dst.len() as u32 };
            let m = self.request(cmd::REGION_READ, &[&q.to_bytes()], &[])?;
            let (got, data) = RegionRw::decode(&m.payload).map_err(|_| protocol("REGION_READ"))?;
            if got != q || data.len() != dst.len() {
                return Err(protocol("REGION_READ reply does not match the request"));
            }
            dst.copy_from_slice(data);
            off = off.wrapping_add(dst.len() as u64); // the server rejects offsets past the region
        }
        Ok(())
    }

    pub fn region_write(&self, index: u32, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        let mut off = offset;
        for src in data.chunks(self.chunk()) {
            let q = RegionRw { offset: off, region: index, count: src.len() as u32 };
            let m = self.request(cmd::REGION_WRITE, &[&q.to_bytes(), src], &[])?;
            if m.payload.len() < REGION_RW_SIZE {
                return Err(protocol("short REGION_WRITE reply"));
            }
            off = off.wrapping_add(src.len() as u64);
        }
        Ok(())
    }

    /// Several writes: REGION_WRITE_MULTI when the server offers it and every write fits an entry
    /// (at most 8 bytes), otherwise one REGION_WRITE each, in order.
    pub fn region_write_multi(&self, writes: &[(u32, u64, &[u8])]) -> Result<(), ClientError> {
        let fits = writes.iter().all(|(_, _, d)| (1..=WRITE_MULTI_MAX_DATA).contains(&d.len()));
        if !self.caps.write_multiple || !fits {
            return writes.iter().try_for_each(|(r, o, d)| self.region_write(*r, *o, d));
        }
        for batch in writes.chunks(WRITE_MULTI_MAX_ENTRIES) {
            let mut p = Vec::with_capacity(8 + batch.len() * 24);
            put_u64(&mut p, batch.len() as u64);
            for (region, offset, data) in batch {
                put_u64(&mut p, *offset);
                put_u32(&mut p, *region);
                put_u32(&mut p, data.len() as u32);
                let mut d = [0u8; WRITE_MULTI_MAX_DATA];
                d.get_mut(..data.len()).ok_or(ClientError::Invalid("write too large"))?.copy_from_slice(data);
                p.extend_from_slice(&d);
            }
            let m = self.request(cmd::REGION_WRITE_MULTI, &[&p], &[])?;
            let done = Reader::new(&m.payload).u64().map_err(|_| protocol("REGION_WRITE_MULTI"))?;
            if done != batch.len() as u64 {
                return Err(protocol("REGION_WRITE_MULTI completed fewer writes"));
            }
        }
        Ok(())
    }

    pub fn dma_map_fd(
        &self,
        iova: u64,
        size: u64,
        fd: BorrowedFd,
        fd_offset: u64,
        prot: DmaProt,
    ) -> Result<(), ClientError> {
        let q = DmaMap { argsz: DMA_MAP_SIZE as u32, flags: prot.bits(), offset: fd_offset, address: iova, size };
        // Kept so we can answer DMA_READ/WRITE if the server does not mmap the file (not sealed).
        let st = rustix::fs::fstat(fd).map_err(std::io::Error::from)?;
        let key = (st.st_dev, st.st_ino);
        let shared =
            self.backed().iter().find_map(|b| b.file.as_ref().filter(|(k, _)| *k == key).map(|(_, f)| f.clone()));
        let file = match shared {
            Some(f) => f,
            None => Arc::new(File::from(fd.try_clone_to_owned()?)),
        };
        let backing = Arc::new(FdBacking { file: file.clone(), base: fd_offset });
        self.register(Backed { iova, size, prot, backing, file: Some((key, file)) }, &q, &[fd])
    }

    /// Registers `b` (the server may DMA as soon as it has replied) and sends the map; undone on failure.
    fn register(&self, b: Backed, q: &DmaMap, fds: &[BorrowedFd]) -> Result<(), ClientError> {
        // Identity of this registration: an earlier one may have the same range (the map then fails).
        let this = Arc::as_ptr(&b.backing).cast::<u8>();
        self.backed_mut().push(b);
        let r = self.request(cmd::DMA_MAP, &[&q.encode()], fds).map(drop);
        if r.is_err() {
            self.backed_mut().retain(|b| Arc::as_ptr(&b.backing).cast::<u8>() != this);
        }
        r
    }

    /// fd-less map: the client answers the server's DMA_READ/DMA_WRITE for this range from `backing`.
    pub fn dma_map_backed(
        &self,
        iova: u64,
        size: u64,
        backing: Arc<dyn ClientDmaBacking>,
        prot: DmaProt,
    ) -> Result<(), ClientError> {
        let q = DmaMap { argsz: DMA_MAP_SIZE as u32, flags: prot.bits(), offset: 0, address: iova, size };
        self.register(Backed { iova, size, prot, backing, file: None }, &q, &[])
    }

    fn backed(&self) -> std::sync::RwLockReadGuard<'_, Vec<Backed>> {
        self.shared.backed.read().unpoison()
    }

    fn backed_mut(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Backed>> {
        self.shared.backed.write().unpoison()
    }

    pub fn dma_unmap(&self, iova: u64, size: u64) -> Result<(), ClientError> {
        let q = DmaUnmap { argsz: DMA_UNMAP_SIZE as u32, flags: 0, address: iova, size };
        self.request(cmd::DMA_UNMAP, &[&q.encode()], &[])?;
        let end = iova.saturating_add(size);
        self.backed_mut().retain(|b| !(b.iova >= iova && b.iova.saturating_add(b.size) <= end));
        Ok(())
    }

    /// DEVICE_SET_IRQS. With fds (DATA_EVENTFD) vector `start + i` gets `fds[i]`, split over as many
    /// messages as the server's `max_msg_fds` needs. Without fds, `count` is 0 (with DATA_NONE and
    /// ACTION_TRIGGER: disable the whole index).
    pub fn set_irqs(&self, index: u32, flags: u32, start: u32, fds: &[BorrowedFd]) -> Result<(), ClientError> {
        if fds.is_empty() {
            return self.set_irqs_count(index, flags, start, 0);
        }
        let per = self.caps.max_msg_fds as usize;
        for (n, chunk) in fds.chunks(per).enumerate() {
            let first = u32::try_from(n * per).ok().and_then(|o| start.checked_add(o));
            let first = first.ok_or(ClientError::Invalid("vector index overflows"))?;
            let q = SetIrqs { argsz: SET_IRQS_SIZE as u32, flags, index, start: first, count: chunk.len() as u32 };
            self.request(cmd::DEVICE_SET_IRQS, &[&q.encode()], chunk)?;
        }
        Ok(())
    }

    /// DEVICE_SET_IRQS without data: mask, unmask or trigger `count` vectors from `start`.
    pub fn set_irqs_count(&self, index: u32, flags: u32, start: u32, count: u32) -> Result<(), ClientError> {
        let q = SetIrqs { argsz: SET_IRQS_SIZE as u32, flags, index, start, count };
        self.request(cmd::DEVICE_SET_IRQS, &[&q.encode()], &[]).map(drop)
    }

    pub fn reset(&self) -> Result<(), ClientError> {
        self.request(cmd::DEVICE_RESET, &[], &[]).map(drop)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.shared.close();
        if let Some(r) = self.idle.take() {
            let _ = r.join();
        }
    }
}

fn errno_of(h: &Header) -> i32 {
    match i32::try_from(h.error) {
        Ok(e) if e > 0 => e,
        _ => libc::EIO,
    }
}

fn parse_server_caps(data: &[u8]) -> Result<serde_json::Map<String, Value>, ClientError> {
    if data.is_empty() {
        return Ok(serde_json::Map::new());
    }
    let (last, body) = data.split_last().ok_or(protocol("VERSION"))?;
    if *last != 0 {
        return Err(protocol("VERSION data not NUL-terminated"));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(mut top)) => match top.remove("capabilities") {
            Some(Value::Object(c)) => Ok(c),
            None => Ok(serde_json::Map::new()),
            Some(_) => Err(protocol("capabilities is not an object")),
        },
        _ => Err(protocol("VERSION data is not a JSON object")),
    }
}
