//! One client connection: the reader loop and the command handlers.
//!
//! Every handler validates the whole request before touching the device and answers with an errno;
//! the message was read completely beforehand, so after an error reply the stream is still in sync.

#![forbid(unsafe_code)]

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::config::ServerConfig;
use crate::device::{region_flags, Device, DeviceInfo, Errno, RegionInfo};
use crate::dma_space::DmaSpace;
use crate::irq::IrqState;
use crate::record::Session;
use crate::server::outbound::Outbound;
use crate::sock::Message;
use crate::wire::{
    command as cmd, dma_unmap_flags, encode_sparse_cap, hdr_flags, put_u16, put_u64, DmaMap, DmaUnmap, FourU32, Header,
    Reader, RegionInfoWire, RegionRw, SetIrqs, DEVICE_INFO_SIZE, DMA_MAP_SIZE, DMA_UNMAP_SIZE, IRQ_INFO_SIZE,
    PAGE_SIZE, REGION_INFO_SIZE, REGION_RW_SIZE, SET_IRQS_SIZE, VERSION_MAJOR, VERSION_MINOR, WRITE_MULTI_ENTRY_SIZE,
    WRITE_MULTI_MAX_DATA, WRITE_MULTI_MAX_ENTRIES,
};

/// The specification's `max_data_xfer_size` when a peer does not give one.
const DEFAULT_MAX_XFER: u32 = 1 << 20;

/// A successful reply: payload and the descriptors to pass with it.
#[derive(Default)]
pub(crate) struct Reply {
    pub payload: Vec<u8>,
    pub fd: Option<Arc<OwnedFd>>,
}

impl Reply {
    fn data(payload: Vec<u8>) -> Self {
        Reply { payload, fd: None }
    }
}

pub(crate) struct Conn<'a> {
    pub device: &'a dyn Device,
    pub cfg: &'a ServerConfig,
    pub info: DeviceInfo,
    pub out: &'a Outbound,
    pub dma: &'a DmaSpace,
    pub irq: &'a IrqState,
    pub negotiated: bool,
    /// The session recording, when the server records.
    session: Option<&'a Arc<Session>>,
    /// (size, flags) of the regions below `ACCESS_CACHE`, looked up once: every register access checks them.
    access: Vec<Option<(u64, u32)>>,
}

/// Regions whose access limits are cached; a device with more (none of ours) has the rest looked up per access.
const ACCESS_CACHE: u32 = 16;

/// Keeps a device's errno inside the range a reply can meaningfully carry.
fn sanitize(e: Errno) -> Errno {
    if (1..4096).contains(&e) {
        e
    } else {
        libc::EIO
    }
}

impl<'a> Conn<'a> {
    pub(crate) fn new(
        device: &'a dyn Device,
        cfg: &'a ServerConfig,
        out: &'a Outbound,
        dma: &'a DmaSpace,
        irq: &'a IrqState,
        session: Option<&'a Arc<Session>>,
    ) -> Self {
        let info = device.device_info();
        let access =
            (0..info.num_regions.min(ACCESS_CACHE)).map(|i| device.region_info(i).map(|r| (r.size, r.flags))).collect();
        Conn { device, cfg, info, out, dma, irq, negotiated: false, session, access }
    }

    /// Handles one complete command and sends its reply. `Err` means the socket failed.
    pub(crate) fn handle(&mut self, msg: Message) -> std::io::Result<()> {
        let h = msg.header;
        if h.is_reply() && (h.command == cmd::DMA_READ || h.command == cmd::DMA_WRITE) {
            if !self.out.route_reply(msg) {
                tracing::debug!(id = h.msg_id, "reply nobody waits for (timed out?), dropped");
            }
            return Ok(());
        }
        if let Some(s) = self.session {
            s.message(&h, &msg.payload, msg.fds.len());
        }
        let result = self.dispatch(msg);
        if h.no_reply() && h.is_command() {
            if let Err(e) = result {
                tracing::debug!(command = h.command, errno = e, "no-reply command failed");
            }
            return Ok(());
        }
        match result {
            Ok(reply) => {
                let fd: Vec<BorrowedFd> = reply.fd.as_ref().map(|f| f.as_fd()).into_iter().collect();
                let header = Header::reply(&h, reply.payload.len());
                if let Some(s) = self.session {
                    s.reply(&header, &reply.payload, fd.len());
                }
                self.out.send(&header, &[&reply.payload], &fd)
            }
            Err(e) => {
                tracing::debug!(command = h.command, errno = e, "error reply");
                let header = Header::error_reply(&h, sanitize(e));
                if let Some(s) = self.session {
                    s.reply(&header, &[], 0);
                }
                self.out.send(&header, &[], &[])
            }
        }
    }

    fn dispatch(&mut self, msg: Message) -> Result<Reply, Errno> {
        let h = msg.header;
        if !h.is_command() || h.is_error() || h.flags & !hdr_flags::KNOWN != 0 {
            return Err(libc::EINVAL);
        }
        if msg.fds_truncated {
            return Err(libc::EINVAL);
        }
        let takes_fds = matches!(h.command, cmd::DMA_MAP | cmd::DEVICE_SET_IRQS);
        if !takes_fds && !msg.fds.is_empty() {
            return Err(libc::EINVAL); // the fds are closed when `msg` drops
        }
        if !self.negotiated && h.command != cmd::VERSION {
            return Err(libc::EINVAL);
        }
        let p = &msg.payload[..];
        match h.command {
            cmd::VERSION => self.version(p),
            cmd::DMA_MAP => self.dma_map(p, msg.fds),
            cmd::DMA_UNMAP => self.dma_unmap(p),
            cmd::DEVICE_GET_INFO => self.device_info(p),
            cmd::DEVICE_GET_REGION_INFO => self.region_info(p),
            cmd::DEVICE_GET_IRQ_INFO => self.irq_info(p),
            cmd::DEVICE_SET_IRQS => self.set_irqs(p, msg.fds),
            cmd::REGION_READ => self.region_read(p),
            cmd::REGION_WRITE => self.region_write(p),
            cmd::REGION_WRITE_MULTI => self.region_write_multi(p),
            cmd::DEVICE_RESET => {
                if !p.is_empty() {
                    return Err(libc::EINVAL);
                }
                self.device.reset();
                Ok(Reply::default())
            }
            _ => Err(libc::ENOSYS),
        }
    }

    fn version(&mut self, p: &[u8]) -> Result<Reply, Errno> {
        if self.negotiated {
            return Err(libc::EINVAL);
        }
        let mut r = Reader::new(p);
        let major = r.u16().map_err(|_| libc::EINVAL)?;
        let minor = r.u16().map_err(|_| libc::EINVAL)?;
        if major != VERSION_MAJOR {
            return Err(libc::ENOTSUP);
        }
        let caps = parse_client_caps(r.rest())?;
        let cap = |k: &str| caps.get(k);
        let as_u32 = |k: &str| -> Result<Option<u32>, Errno> {
            match cap(k) {
                None => Ok(None),
                Some(v) => v.as_u64().map(|n| Some(u32::try_from(n).unwrap_or(u32::MAX))).ok_or(libc::EINVAL),
            }
        };
        let (client_fds, client_xfer, client_maps) =
            (as_u32("max_msg_fds")?, as_u32("max_data_xfer_size")?, as_u32("max_dma_maps")?);
        let pgsizes = cap("pgsizes").map(|v| v.as_u64().ok_or(libc::EINVAL)).transpose()?;
        if pgsizes.is_some_and(|p| p & PAGE_SIZE == 0) {
            return Err(libc::EINVAL);
        }
        let write_multiple = match cap("write_multiple") {
            None => false,
            Some(v) => v.as_bool().ok_or(libc::EINVAL)?,
        };
        // Our limits, never above the client's proposal: QEMU refuses a reply that raises them
        // (max_msg_fds > 16, max_dma_maps > 65535). We still accept up to our configured limits.
        let lower = |ours: u32, theirs: Option<u32>| theirs.map_or(ours, |t| ours.min(t).max(1));
        let xfer = lower(self.cfg.max_data_xfer_size, client_xfer);
        // What we send in one DMA_READ/WRITE: the specification's default when the client is silent.
        self.out.set_max_xfer(client_xfer.unwrap_or(DEFAULT_MAX_XFER).min(self.cfg.max_data_xfer_size));
        let mut ours = Map::new();
        ours.insert("max_msg_fds".into(), json!(lower(self.cfg.max_msg_fds, client_fds)));
        ours.insert("max_data_xfer_size".into(), json!(xfer));
        ours.insert("max_dma_maps".into(), json!(lower(self.cfg.max_dma_maps, client_maps)));
        ours.insert("pgsizes".into(), json!(PAGE_SIZE));
        if write_multiple && self.cfg.write_multiple {
            ours.insert("write_multiple".into(), json!(true));
        }
        let text = json!({ "capabilities": Value::Object(ours) }).to_string();
        let mut payload = Vec::with_capacity(4 + text.len() + 1);
        put_u16(&mut payload, VERSION_MAJOR);
        put_u16(&mut payload, minor.min(VERSION_MINOR));
        payload.extend_from_slice(text.as_bytes());
        payload.push(0);
        self.negotiated = true;
        Ok(Reply::data(payload))
    }

    fn dma_map(&mut self, p: &[u8], mut fds: Vec<OwnedFd>) -> Result<Reply, Errno> {
        let m = DmaMap::decode(p).map_err(|_| libc::EINVAL)?;
        if (m.argsz as usize) < DMA_MAP_SIZE || fds.len() > 1 {
            return Err(libc::EINVAL);
        }
        self.device.vet_dma_map(m.address, m.size, m.flags)?;
        self.dma.map(m.address, m.size, m.offset, m.flags, fds.pop()).map_err(|e| e.errno())?;
        Ok(Reply::default())
    }

    fn dma_unmap(&mut self, p: &[u8]) -> Result<Reply, Errno> {
        let mut u = DmaUnmap::decode(p).map_err(|_| libc::EINVAL)?;
        if (u.argsz as usize) < DMA_UNMAP_SIZE {
            return Err(libc::EINVAL);
        }
        u.size = match u.flags {
            0 => self.dma.unmap(u.address, u.size).map_err(|e| e.errno())?,
            dma_unmap_flags::ALL if u.address == 0 && u.size == 0 => {
                self.dma.unmap_all();
                0
            }
            _ => return Err(libc::EINVAL),
        };
        // As VFIO type1: the reply's size is the number of bytes actually unmapped (0 if none).
        u.argsz = DMA_UNMAP_SIZE as u32;
        Ok(Reply::data(u.encode()))
    }

    fn device_info(&mut self, p: &[u8]) -> Result<Reply, Errno> {
        let q = FourU32::decode(p).map_err(|_| libc::EINVAL)?;
        if (q.0[0] as usize) < DEVICE_INFO_SIZE {
            return Err(libc::EINVAL);
        }
        let i = self.info;
        Ok(Reply::data(FourU32([DEVICE_INFO_SIZE as u32, i.flags, i.num_regions, i.num_irqs]).encode()))
    }

    fn region(&self, index: u32) -> Result<RegionInfo, Errno> {
        if index >= self.info.num_regions {
            return Err(libc::EINVAL);
        }
        self.device.region_info(index).ok_or(libc::EINVAL)
    }

    fn region_info(&mut self, p: &[u8]) -> Result<Reply, Errno> {
        if p.len() != REGION_INFO_SIZE {
            return Err(libc::EINVAL);
        }
        let q = RegionInfoWire::decode_prefix(p).map_err(|_| libc::EINVAL)?;
        if (q.argsz as usize) < REGION_INFO_SIZE {
            return Err(libc::EINVAL);
        }
        let info = self.region(q.index)?;
        let mut out = RegionInfoWire {
            argsz: REGION_INFO_SIZE as u32,
            // CAPS is ours to set: only an answer that carries the capability chain may have it.
            flags: info.flags & !region_flags::CAPS,
            index: q.index,
            cap_offset: 0,
            size: info.size,
            offset: info.fd.as_ref().map_or(0, |f| f.fd_offset),
        };
        let areas: Vec<(u64, u64)> = info.sparse_areas.iter().map(|a| (a.offset, a.size)).collect();
        let cap = if areas.is_empty() { Vec::new() } else { encode_sparse_cap(&areas) };
        let full = u32::try_from(REGION_INFO_SIZE + cap.len()).map_err(|_| libc::E2BIG)?;
        let complete = q.argsz >= full;
        if !cap.is_empty() {
            out.argsz = full;
            // QEMU's vfio-user client rejects CAPS with a cap_offset outside [32, argsz], so an
            // incomplete reply carries no CAPS flag at all (Linux would set it with cap_offset 0).
            if complete {
                out.flags |= region_flags::CAPS;
                out.cap_offset = REGION_INFO_SIZE as u32;
            }
        }
        let mut payload = out.encode();
        if complete {
            payload.extend_from_slice(&cap);
        }
        // The fd goes only with the complete answer, so a client asking twice receives it once.
        let fd = if complete { info.fd.map(|f| f.fd) } else { None };
        Ok(Reply { payload, fd })
    }

    fn irq_info(&mut self, p: &[u8]) -> Result<Reply, Errno> {
        let q = FourU32::decode(p).map_err(|_| libc::EINVAL)?;
        let [argsz, _, index, _] = q.0;
        if (argsz as usize) < IRQ_INFO_SIZE || index >= self.info.num_irqs {
            return Err(libc::EINVAL);
        }
        let i = self.device.irq_info(index).ok_or(libc::EINVAL)?;
        Ok(Reply::data(FourU32([IRQ_INFO_SIZE as u32, i.flags, index, i.count]).encode()))
    }

    fn set_irqs(&mut self, p: &[u8], fds: Vec<OwnedFd>) -> Result<Reply, Errno> {
        let (req, data) = SetIrqs::decode(p).map_err(|_| libc::EINVAL)?;
        if (req.argsz as usize) < SET_IRQS_SIZE || req.index >= self.info.num_irqs {
            return Err(libc::EINVAL);
        }
        self.irq.set_irqs(&req, self.device.irq_info(req.index), data, fds)?;
        Ok(Reply::default())
    }

    /// Checks an access of `count` bytes at `offset` of region `index` needing `need` (READ or WRITE).
    fn check_access(&self, index: u32, offset: u64, count: u64, need: u32) -> Result<(), Errno> {
        if count == 0 || count > u64::from(self.cfg.max_data_xfer_size) {
            return Err(libc::EINVAL);
        }
        let (size, flags) = match self.access.get(index as usize) {
            Some(cached) => cached.ok_or(libc::EINVAL)?,
            None => self.region(index).map(|r| (r.size, r.flags))?,
        };
        let end = offset.checked_add(count).ok_or(libc::EINVAL)?;
        if end > size || flags & need == 0 {
            return Err(libc::EINVAL);
        }
        Ok(())
    }

    fn region_read(&mut self, p: &[u8]) -> Result<Reply, Errno> {
        let (rw, rest) = RegionRw::decode(p).map_err(|_| libc::EINVAL)?;
        if !rest.is_empty() {
            return Err(libc::EINVAL);
        }
        self.check_access(rw.region, rw.offset, rw.count.into(), region_flags::READ)?;
        let mut payload = Vec::with_capacity(REGION_RW_SIZE + rw.count as usize);
        payload.extend_from_slice(&rw.to_bytes());
        payload.resize(REGION_RW_SIZE + rw.count as usize, 0);
        let data = payload.get_mut(REGION_RW_SIZE..).ok_or(libc::EINVAL)?;
        self.device.region_read(rw.region, rw.offset, data).map_err(sanitize)?;
        Ok(Reply::data(payload))
    }

    fn region_write(&mut self, p: &[u8]) -> Result<Reply, Errno> {
        let (rw, data) = RegionRw::decode(p).map_err(|_| libc::EINVAL)?;
        if data.len() as u64 != u64::from(rw.count) {
            return Err(libc::EINVAL);
        }
        self.check_access(rw.region, rw.offset, rw.count.into(), region_flags::WRITE)?;
        self.device.region_write(rw.region, rw.offset, data).map_err(sanitize)?;
        Ok(Reply::data(rw.encode()))
    }

    fn region_write_multi(&mut self, p: &[u8]) -> Result<Reply, Errno> {
        let mut r = Reader::new(p);
        let n = r.u64().map_err(|_| libc::EINVAL)?;
        if n == 0 || n > WRITE_MULTI_MAX_ENTRIES as u64 || r.rest().len() != n as usize * WRITE_MULTI_ENTRY_SIZE {
            return Err(libc::EINVAL);
        }
        let mut entries = Vec::with_capacity(n as usize);
        let mut r = Reader::new(p.get(8..).unwrap_or_default());
        for _ in 0..n {
            let offset = r.u64().map_err(|_| libc::EINVAL)?;
            let region = r.u32().map_err(|_| libc::EINVAL)?;
            let count = r.u32().map_err(|_| libc::EINVAL)?;
            let data = r.bytes(WRITE_MULTI_MAX_DATA).map_err(|_| libc::EINVAL)?;
            if count as usize > WRITE_MULTI_MAX_DATA {
                return Err(libc::EINVAL);
            }
            self.check_access(region, offset, count.into(), region_flags::WRITE)?;
            entries.push((region, offset, data.get(..count as usize).unwrap_or_default()));
        }
        for (region, offset, data) in entries {
            self.device.region_write(region, offset, data).map_err(sanitize)?;
        }
        let mut payload = Vec::with_capacity(8);
        put_u64(&mut payload, n);
        Ok(Reply::data(payload))
    }
}

/// The `capabilities` object of a VERSION payload (after major/minor). Empty data means no capabilities.
fn parse_client_caps(data: &[u8]) -> Result<Map<String, Value>, Errno> {
    if data.is_empty() {
        return Ok(Map::new());
    }
    // NUL-terminated, no NUL inside.
    let (last, body) = data.split_last().ok_or(libc::EINVAL)?;
    if *last != 0 || body.contains(&0) {
        return Err(libc::EINVAL);
    }
    let v: Value = serde_json::from_slice(body).map_err(|_| libc::EINVAL)?;
    let Value::Object(mut top) = v else { return Err(libc::EINVAL) };
    match top.remove("capabilities") {
        None => Ok(Map::new()),
        Some(Value::Object(caps)) => Ok(caps),
        Some(_) => Err(libc::EINVAL),
    }
}
