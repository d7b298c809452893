//! vfio-user message layouts (QEMU `docs/interop/vfio-user.rst`), shared by server and client.
//!
//! All integers are in host byte order, as the specification says. Decoders take the payload that
//! follows the 16-byte header and never index past it: a short payload is an error value.

#![forbid(unsafe_code)]

use thiserror::Error;

/// Size of the header every message starts with.
pub const HEADER_SIZE: usize = 16;

/// Protocol version we speak. The reply's minor is `min(ours, client's)`.
pub const VERSION_MAJOR: u16 = 0;
pub const VERSION_MINOR: u16 = 1;

/// The only DMA page size we support (`pgsizes`).
pub const PAGE_SIZE: u64 = 4096;

/// Command numbers (the specification's "Commands" table).
pub mod command {
    pub const VERSION: u16 = 1;
    pub const DMA_MAP: u16 = 2;
    pub const DMA_UNMAP: u16 = 3;
    pub const DEVICE_GET_INFO: u16 = 4;
    pub const DEVICE_GET_REGION_INFO: u16 = 5;
    pub const DEVICE_GET_REGION_IO_FDS: u16 = 6;
    pub const DEVICE_GET_IRQ_INFO: u16 = 7;
    pub const DEVICE_SET_IRQS: u16 = 8;
    pub const REGION_READ: u16 = 9;
    pub const REGION_WRITE: u16 = 10;
    pub const DMA_READ: u16 = 11;
    pub const DMA_WRITE: u16 = 12;
    pub const DEVICE_RESET: u16 = 13;
    pub const REGION_WRITE_MULTI: u16 = 15;
}

/// Header `flags` bits.
pub mod hdr_flags {
    /// Bits 0-3: message type.
    pub const TYPE_MASK: u32 = 0xf;
    pub const TYPE_COMMAND: u32 = 0;
    pub const TYPE_REPLY: u32 = 1;
    pub const NO_REPLY: u32 = 1 << 4;
    pub const ERROR: u32 = 1 << 5;
    /// Every bit the specification defines.
    pub const KNOWN: u32 = TYPE_MASK | NO_REPLY | ERROR;
}

/// DMA_MAP `flags`.
pub mod dma_map_flags {
    pub const READ: u32 = 1 << 0;
    pub const WRITE: u32 = 1 << 1;
}

/// DMA_UNMAP `flags` (linux/vfio.h `VFIO_DMA_UNMAP_FLAG_*`).
pub mod dma_unmap_flags {
    pub const GET_DIRTY_BITMAP: u32 = 1 << 0;
    /// QEMU sends this with address 0 and size 0 to drop every mapping.
    pub const ALL: u32 = 1 << 1;
}

/// DEVICE_SET_IRQS `flags` (linux/vfio.h `VFIO_IRQ_SET_*`).
pub mod irq_set_flags {
    pub const DATA_NONE: u32 = 1 << 0;
    pub const DATA_BOOL: u32 = 1 << 1;
    pub const DATA_EVENTFD: u32 = 1 << 2;
    pub const ACTION_MASK: u32 = 1 << 3;
    pub const ACTION_UNMASK: u32 = 1 << 4;
    pub const ACTION_TRIGGER: u32 = 1 << 5;
    pub const DATA_TYPE_MASK: u32 = DATA_NONE | DATA_BOOL | DATA_EVENTFD;
    pub const ACTION_TYPE_MASK: u32 = ACTION_MASK | ACTION_UNMASK | ACTION_TRIGGER;
}

/// `VFIO_REGION_INFO_CAP_SPARSE_MMAP` and its version.
pub const CAP_SPARSE_MMAP: u16 = 1;
pub const CAP_SPARSE_MMAP_VERSION: u16 = 1;

/// Fixed payload sizes.
pub const DMA_MAP_SIZE: usize = 32;
pub const DMA_UNMAP_SIZE: usize = 24;
pub const DEVICE_INFO_SIZE: usize = 16;
pub const REGION_INFO_SIZE: usize = 32;
pub const IRQ_INFO_SIZE: usize = 16;
pub const SET_IRQS_SIZE: usize = 20;
pub const REGION_RW_SIZE: usize = 16;
pub const DMA_RW_SIZE: usize = 16;
pub const WRITE_MULTI_ENTRY_SIZE: usize = 24;
/// Largest write one REGION_WRITE_MULTI entry can carry.
pub const WRITE_MULTI_MAX_DATA: usize = 8;
/// Entries per REGION_WRITE_MULTI message (QEMU's `VFIO_USER_MULTI_MAX`).
pub const WRITE_MULTI_MAX_ENTRIES: usize = 200;
/// Sparse cap: header (8) + nr_areas/reserved (8), then 16 per area.
pub const SPARSE_CAP_HEADER_SIZE: usize = 16;
pub const SPARSE_AREA_SIZE: usize = 16;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WireError {
    #[error("payload of {got} bytes, {want} expected")]
    Length { got: usize, want: usize },
    #[error("malformed payload: {0}")]
    Malformed(&'static str),
}

/// The 16-byte message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    pub msg_id: u16,
    pub command: u16,
    pub msg_size: u32,
    pub flags: u32,
    pub error: u32,
}

impl Header {
    pub fn decode(b: &[u8; HEADER_SIZE]) -> Self {
        let mut r = Reader::new(b);
        // The array has exactly HEADER_SIZE bytes, so these reads cannot fail; defaults keep it total.
        Header {
            msg_id: r.u16().unwrap_or_default(),
            command: r.u16().unwrap_or_default(),
            msg_size: r.u32().unwrap_or_default(),
            flags: r.u32().unwrap_or_default(),
            error: r.u32().unwrap_or_default(),
        }
    }

    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut w = Vec::with_capacity(HEADER_SIZE);
        put_u16(&mut w, self.msg_id);
        put_u16(&mut w, self.command);
        put_u32(&mut w, self.msg_size);
        put_u32(&mut w, self.flags);
        put_u32(&mut w, self.error);
        let mut out = [0u8; HEADER_SIZE];
        out.copy_from_slice(&w);
        out
    }

    pub fn is_reply(&self) -> bool {
        self.flags & hdr_flags::TYPE_MASK == hdr_flags::TYPE_REPLY
    }
    pub fn is_command(&self) -> bool {
        self.flags & hdr_flags::TYPE_MASK == hdr_flags::TYPE_COMMAND
    }
    pub fn no_reply(&self) -> bool {
        self.flags & hdr_flags::NO_REPLY != 0
    }
    pub fn is_error(&self) -> bool {
        self.flags & hdr_flags::ERROR != 0
    }

    pub fn command(msg_id: u16, command: u16, payload_len: usize) -> Self {
        Header { msg_id, command, msg_size: msg_size(payload_len), flags: hdr_flags::TYPE_COMMAND, error: 0 }
    }

    pub fn reply(to: &Header, payload_len: usize) -> Self {
        Header {
            msg_id: to.msg_id,
            command: to.command,
            msg_size: msg_size(payload_len),
            flags: hdr_flags::TYPE_REPLY,
            error: 0,
        }
    }

    pub fn error_reply(to: &Header, errno: i32) -> Self {
        Header {
            msg_id: to.msg_id,
            command: to.command,
            msg_size: HEADER_SIZE as u32,
            flags: hdr_flags::TYPE_REPLY | hdr_flags::ERROR,
            error: errno.unsigned_abs(),
        }
    }
}

/// Message size for a payload: callers only build payloads far below 4 GiB (bounded by
/// `max_data_xfer_size`), so saturation never happens in practice and would be caught by the peer.
fn msg_size(payload_len: usize) -> u32 {
    u32::try_from(payload_len.saturating_add(HEADER_SIZE)).unwrap_or(u32::MAX)
}

/// Bounds-checked little cursor over a payload.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).ok_or(WireError::Malformed("length overflow"))?;
        let s = self.buf.get(self.pos..end).ok_or(WireError::Length { got: self.buf.len(), want: end })?;
        self.pos = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }
    pub fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_ne_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_ne_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_ne_bytes(self.array()?))
    }
    pub fn rest(&mut self) -> &'a [u8] {
        let s = self.buf.get(self.pos..).unwrap_or_default();
        self.pos = self.buf.len();
        s
    }
}

pub fn put_u16(w: &mut Vec<u8>, v: u16) {
    w.extend_from_slice(&v.to_ne_bytes());
}
pub fn put_u32(w: &mut Vec<u8>, v: u32) {
    w.extend_from_slice(&v.to_ne_bytes());
}
pub fn put_u64(w: &mut Vec<u8>, v: u64) {
    w.extend_from_slice(&v.to_ne_bytes());
}

fn exact(payload: &[u8], want: usize) -> Result<(), WireError> {
    if payload.len() == want {
        Ok(())
    } else {
        Err(WireError::Length { got: payload.len(), want })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaMap {
    pub argsz: u32,
    pub flags: u32,
    pub offset: u64,
    pub address: u64,
    pub size: u64,
}

impl DmaMap {
    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        exact(p, DMA_MAP_SIZE)?;
        let mut r = Reader::new(p);
        Ok(DmaMap { argsz: r.u32()?, flags: r.u32()?, offset: r.u64()?, address: r.u64()?, size: r.u64()? })
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(DMA_MAP_SIZE);
        put_u32(&mut w, self.argsz);
        put_u32(&mut w, self.flags);
        put_u64(&mut w, self.offset);
        put_u64(&mut w, self.address);
        put_u64(&mut w, self.size);
        w
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaUnmap {
    pub argsz: u32,
    pub flags: u32,
    pub address: u64,
    pub size: u64,
}

impl DmaUnmap {
    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        exact(p, DMA_UNMAP_SIZE)?;
        let mut r = Reader::new(p);
        Ok(DmaUnmap { argsz: r.u32()?, flags: r.u32()?, address: r.u64()?, size: r.u64()? })
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(DMA_UNMAP_SIZE);
        put_u32(&mut w, self.argsz);
        put_u32(&mut w, self.flags);
        put_u64(&mut w, self.address);
        put_u64(&mut w, self.size);
        w
    }
}

/// DEVICE_GET_INFO and DEVICE_GET_IRQ_INFO share this four-u32 shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FourU32(pub [u32; 4]);

impl FourU32 {
    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        exact(p, 16)?;
        let mut r = Reader::new(p);
        Ok(FourU32([r.u32()?, r.u32()?, r.u32()?, r.u32()?]))
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(16);
        self.0.iter().for_each(|v| put_u32(&mut w, *v));
        w
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegionInfoWire {
    pub argsz: u32,
    pub flags: u32,
    pub index: u32,
    pub cap_offset: u32,
    pub size: u64,
    pub offset: u64,
}

impl RegionInfoWire {
    /// Requests are exactly the structure; replies may carry capabilities after it.
    pub fn decode_prefix(p: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(p);
        Ok(RegionInfoWire {
            argsz: r.u32()?,
            flags: r.u32()?,
            index: r.u32()?,
            cap_offset: r.u32()?,
            size: r.u64()?,
            offset: r.u64()?,
        })
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(REGION_INFO_SIZE);
        put_u32(&mut w, self.argsz);
        put_u32(&mut w, self.flags);
        put_u32(&mut w, self.index);
        put_u32(&mut w, self.cap_offset);
        put_u64(&mut w, self.size);
        put_u64(&mut w, self.offset);
        w
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetIrqs {
    pub argsz: u32,
    pub flags: u32,
    pub index: u32,
    pub start: u32,
    pub count: u32,
}

impl SetIrqs {
    /// Returns the fixed part and the trailing data (the DATA_BOOL array).
    pub fn decode(p: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let mut r = Reader::new(p);
        let s = SetIrqs { argsz: r.u32()?, flags: r.u32()?, index: r.u32()?, start: r.u32()?, count: r.u32()? };
        Ok((s, r.rest()))
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(SET_IRQS_SIZE);
        [self.argsz, self.flags, self.index, self.start, self.count].iter().for_each(|v| put_u32(&mut w, *v));
        w
    }
}

/// REGION_READ/REGION_WRITE fixed part: offset, region, count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionRw {
    pub offset: u64,
    pub region: u32,
    pub count: u32,
}

impl RegionRw {
    pub fn decode(p: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let mut r = Reader::new(p);
        let s = RegionRw { offset: r.u64()?, region: r.u32()?, count: r.u32()? };
        Ok((s, r.rest()))
    }
    pub fn encode(&self) -> Vec<u8> {
        self.to_bytes().to_vec()
    }
    /// The fixed part without allocating: every register access sends one.
    pub fn to_bytes(&self) -> [u8; REGION_RW_SIZE] {
        let mut b = [0u8; REGION_RW_SIZE];
        b[..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.region.to_le_bytes());
        b[12..].copy_from_slice(&self.count.to_le_bytes());
        b
    }
}

/// DMA_READ/DMA_WRITE fixed part: address, count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaRw {
    pub address: u64,
    pub count: u64,
}

impl DmaRw {
    pub fn decode(p: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let mut r = Reader::new(p);
        let s = DmaRw { address: r.u64()?, count: r.u64()? };
        Ok((s, r.rest()))
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(DMA_RW_SIZE);
        put_u64(&mut w, self.address);
        put_u64(&mut w, self.count);
        w
    }
}

/// Encodes a sparse-mmap capability list entry (`next` = 0: it is the only capability).
pub fn encode_sparse_cap(areas: &[(u64, u64)]) -> Vec<u8> {
    let mut w = Vec::with_capacity(SPARSE_CAP_HEADER_SIZE + areas.len() * SPARSE_AREA_SIZE);
    put_u16(&mut w, CAP_SPARSE_MMAP);
    put_u16(&mut w, CAP_SPARSE_MMAP_VERSION);
    put_u32(&mut w, 0);
    put_u32(&mut w, u32::try_from(areas.len()).unwrap_or(u32::MAX));
    put_u32(&mut w, 0);
    for (off, size) in areas {
        put_u64(&mut w, *off);
        put_u64(&mut w, *size);
    }
    w
}

/// Walks a region-info capability chain (`info` is the whole reply payload, offsets relative to its start)
/// and collects the sparse-mmap areas. Bounded: every hop must move forward, areas must fit.
pub fn parse_sparse_caps(info: &[u8], first: u32) -> Result<Vec<(u64, u64)>, WireError> {
    let mut areas = Vec::new();
    let mut next = first as usize;
    let mut prev = 0usize;
    while next != 0 {
        if next < REGION_INFO_SIZE || next <= prev {
            return Err(WireError::Malformed("capability offset does not advance"));
        }
        prev = next;
        let mut r = Reader::new(info.get(next..).ok_or(WireError::Malformed("capability outside reply"))?);
        let id = r.u16()?;
        let _version = r.u16()?;
        next = r.u32()? as usize;
        if id != CAP_SPARSE_MMAP {
            continue;
        }
        let nr = r.u32()? as usize;
        let _reserved = r.u32()?;
        let need = nr.checked_mul(SPARSE_AREA_SIZE).ok_or(WireError::Malformed("area count overflow"))?;
        let mut body = Reader::new(r.bytes(need)?);
        for _ in 0..nr {
            areas.push((body.u64()?, body.u64()?));
        }
    }
    Ok(areas)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_is_host_order() {
        let h = Header { msg_id: 0x1234, command: command::DMA_MAP, msg_size: 48, flags: 1, error: 22 };
        let b = h.encode();
        assert_eq!(&b[0..2], &0x1234u16.to_ne_bytes());
        assert_eq!(&b[4..8], &48u32.to_ne_bytes());
        assert_eq!(Header::decode(&b), h);
    }

    #[test]
    fn short_payloads_are_errors_not_panics() {
        assert!(DmaMap::decode(&[0; 31]).is_err());
        assert!(DmaUnmap::decode(&[0; 25]).is_err());
        assert!(RegionRw::decode(&[0; 15]).is_err());
        assert!(SetIrqs::decode(&[0; 19]).is_err());
        assert!(FourU32::decode(&[]).is_err());
    }

    #[test]
    fn sparse_cap_chain_that_loops_or_overflows_is_rejected() {
        let mut info = RegionInfoWire { argsz: 0, cap_offset: 32, ..Default::default() }.encode();
        info.extend(encode_sparse_cap(&[(0x1000, 0x1000)]));
        assert_eq!(parse_sparse_caps(&info, 32).unwrap(), vec![(0x1000, 0x1000)]);
        // next pointing at itself
        let mut looping = info.clone();
        looping[36..40].copy_from_slice(&32u32.to_ne_bytes());
        assert!(parse_sparse_caps(&looping, 32).is_err());
        // nr_areas far beyond the bytes present
        let mut huge = info.clone();
        huge[40..44].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(parse_sparse_caps(&huge, 32).is_err());
    }
}
