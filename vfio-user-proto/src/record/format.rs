//! The recording's format: its magic, the records and their tags, their encoding, and the reader.

#![forbid(unsafe_code)]

use std::io::{self, Read};

use thiserror::Error;

use crate::wire::{Header, HEADER_SIZE};

/// The first bytes of every recording.
pub const MAGIC: &[u8; 8] = b"VFUREC01";
/// Largest header accepted.
pub const MAX_HEADER: usize = 1 << 20;
/// Largest record body accepted.
pub const MAX_RECORD: usize = 64 << 20;

pub(super) mod tag {
    pub const MESSAGE: u8 = 1;
    pub const REPLY: u8 = 2;
    pub const DMA_READ: u8 = 3;
    pub const DMA_WRITE: u8 = 4;
    pub const DMA_FAILED: u8 = 5;
    pub const SHARED_READ: u8 = 6;
    pub const CONTROL_REQUEST: u8 = 7;
    pub const CONTROL_REPLY: u8 = 8;
    pub const DEVICE_STEP: u8 = 9;
    pub const DEVICE_ACCESS: u8 = 10;
}

/// One event of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A client command (or a stray reply) as received; `fds`: descriptors it carried.
    Message {
        header: Header,
        payload: Vec<u8>,
        fds: u8,
    },
    /// The server's answer to a client message.
    Reply {
        header: Header,
        payload: Vec<u8>,
        fds: u8,
    },
    DmaRead {
        iova: u64,
        data: Vec<u8>,
    },
    DmaWrite {
        iova: u64,
        len: u64,
        hash: u64,
    },
    DmaFailed {
        iova: u64,
        len: u64,
        write: bool,
    },
    /// The device took `data` from a shared-memory (sparse-mmap) area of `region` at `offset`.
    SharedRead {
        region: u32,
        offset: u64,
        data: Vec<u8>,
    },
    ControlRequest {
        id: u64,
        text: String,
    },
    ControlReply {
        id: u64,
        text: String,
    },
    /// The device read or published state of its own here (where a replay lets the replayed device do the
    /// same).
    DeviceStep,
    /// The device handled the client message logged last before this (it arrived earlier).
    DeviceAccess,
}

#[derive(Debug, Error)]
pub enum RecordError {
    #[error("not a recording (bad magic)")]
    Magic,
    #[error("recording header: {0}")]
    Header(String),
    #[error("record {index}: {what}")]
    Malformed { index: u64, what: String },
    #[error("reading the recording: {0}")]
    Io(#[from] io::Error),
}

/// FNV-1a, 64 bits: enough to tell two DMA writes apart without storing them.
pub fn content_hash(data: &[u8]) -> u64 {
    let mut h = ContentHash::new();
    h.update(data);
    h.finish()
}

/// [`content_hash`] over several pieces.
#[derive(Debug, Clone, Copy)]
pub struct ContentHash(u64);

impl ContentHash {
    pub fn new() -> Self {
        ContentHash(0xcbf2_9ce4_8422_2325)
    }
    pub fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    pub fn finish(self) -> u64 {
        self.0
    }
}

impl Default for ContentHash {
    fn default() -> Self {
        Self::new()
    }
}

impl Record {
    /// The record's tag and body.
    pub fn encode(&self) -> (u8, Vec<u8>) {
        let mut b = Vec::new();
        let tag = match self {
            Record::Message { header, payload, fds } | Record::Reply { header, payload, fds } => {
                b.push(*fds);
                b.extend_from_slice(&header.encode());
                b.extend_from_slice(payload);
                if matches!(self, Record::Message { .. }) {
                    tag::MESSAGE
                } else {
                    tag::REPLY
                }
            }
            Record::DmaRead { iova, data } => {
                b.extend_from_slice(&iova.to_le_bytes());
                b.extend_from_slice(data);
                tag::DMA_READ
            }
            Record::DmaWrite { iova, len, hash } => {
                for v in [iova, len, hash] {
                    b.extend_from_slice(&v.to_le_bytes());
                }
                tag::DMA_WRITE
            }
            Record::DmaFailed { iova, len, write } => {
                b.extend_from_slice(&iova.to_le_bytes());
                b.extend_from_slice(&len.to_le_bytes());
                b.push(u8::from(*write));
                tag::DMA_FAILED
            }
            Record::SharedRead { region, offset, data } => {
                b.extend_from_slice(&region.to_le_bytes());
                b.extend_from_slice(&offset.to_le_bytes());
                b.extend_from_slice(data);
                tag::SHARED_READ
            }
            Record::ControlRequest { id, text } | Record::ControlReply { id, text } => {
                b.extend_from_slice(&id.to_le_bytes());
                b.extend_from_slice(text.as_bytes());
                if matches!(self, Record::ControlRequest { .. }) {
                    tag::CONTROL_REQUEST
                } else {
                    tag::CONTROL_REPLY
                }
            }
            Record::DeviceStep => tag::DEVICE_STEP,
            Record::DeviceAccess => tag::DEVICE_ACCESS,
        };
        (tag, b)
    }

    /// The record of `tag` with `body`; `None` when the body does not fit the tag.
    pub fn decode(tag: u8, body: &[u8]) -> Option<Record> {
        let u64_at = |o: usize| body.get(o..o + 8).and_then(|s| s.try_into().ok()).map(u64::from_le_bytes);
        Some(match tag {
            tag::MESSAGE | tag::REPLY => {
                let fds = *body.first()?;
                let raw: &[u8; HEADER_SIZE] = body.get(1..1 + HEADER_SIZE)?.try_into().ok()?;
                let header = Header::decode(raw);
                let payload = body.get(1 + HEADER_SIZE..)?.to_vec();
                if tag == tag::MESSAGE {
                    Record::Message { header, payload, fds }
                } else {
                    Record::Reply { header, payload, fds }
                }
            }
            tag::DMA_READ => Record::DmaRead { iova: u64_at(0)?, data: body.get(8..)?.to_vec() },
            tag::DMA_WRITE if body.len() == 24 => {
                Record::DmaWrite { iova: u64_at(0)?, len: u64_at(8)?, hash: u64_at(16)? }
            }
            tag::DMA_FAILED if body.len() == 17 => {
                Record::DmaFailed { iova: u64_at(0)?, len: u64_at(8)?, write: *body.get(16)? != 0 }
            }
            tag::SHARED_READ => {
                let region = u32::from_le_bytes(body.get(0..4)?.try_into().ok()?);
                let offset = body.get(4..12).and_then(|s| s.try_into().ok()).map(u64::from_le_bytes)?;
                Record::SharedRead { region, offset, data: body.get(12..)?.to_vec() }
            }
            tag::CONTROL_REQUEST | tag::CONTROL_REPLY => {
                let id = u64_at(0)?;
                let text = String::from_utf8(body.get(8..)?.to_vec()).ok()?;
                if tag == tag::CONTROL_REQUEST {
                    Record::ControlRequest { id, text }
                } else {
                    Record::ControlReply { id, text }
                }
            }
            tag::DEVICE_STEP if body.is_empty() => Record::DeviceStep,
            tag::DEVICE_ACCESS if body.is_empty() => Record::DeviceAccess,
            _ => return None,
        })
    }
}

/// Reads a recording: its header, then its records one by one.
pub struct RecordingReader<R> {
    input: R,
    header: serde_json::Value,
    index: u64,
    /// The file ended inside a record: what was complete before it is all there is.
    truncated: bool,
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` if the input ended first (a partial read counts as ended).
fn fill(input: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut done = 0;
    while done < buf.len() {
        match input.read(&mut buf[done..]) {
            Ok(0) => return Ok(false),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

impl<R: Read> RecordingReader<R> {
    pub fn new(mut input: R) -> Result<Self, RecordError> {
        let mut magic = [0u8; 8];
        if !fill(&mut input, &mut magic)? || &magic != MAGIC {
            return Err(RecordError::Magic);
        }
        let mut len = [0u8; 4];
        if !fill(&mut input, &mut len)? {
            return Err(RecordError::Header("missing".into()));
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_HEADER {
            return Err(RecordError::Header(format!("{len} bytes, at most {MAX_HEADER}")));
        }
        let mut text = vec![0u8; len];
        if !fill(&mut input, &mut text)? {
            return Err(RecordError::Header("truncated".into()));
        }
        let header = serde_json::from_slice(&text).map_err(|e| RecordError::Header(e.to_string()))?;
        Ok(RecordingReader { input, header, index: 0, truncated: false })
    }

    pub fn header(&self) -> &serde_json::Value {
        &self.header
    }

    /// Whether the file ended inside a record.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The next record, `Ok(None)` at the end (or at a truncated last record).
    pub fn next_record(&mut self) -> Result<Option<Record>, RecordError> {
        let mut head = [0u8; 5];
        let mut got = 0;
        // Distinguish a clean end (no byte of a new record) from a cut one.
        while got < head.len() {
            match self.input.read(&mut head[got..]) {
                Ok(0) => {
                    self.truncated = got > 0;
                    return Ok(None);
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        let index = self.index;
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > MAX_RECORD {
            return Err(RecordError::Malformed { index, what: format!("{len} bytes, at most {MAX_RECORD}") });
        }
        let mut body = vec![0u8; len];
        if !fill(&mut self.input, &mut body)? {
            self.truncated = true;
            return Ok(None);
        }
        self.index += 1;
        Record::decode(head[0], &body)
            .map(Some)
            .ok_or_else(|| RecordError::Malformed { index, what: format!("tag {} with {len} bytes", head[0]) })
    }

    /// Every remaining record.
    pub fn records(mut self) -> Result<(serde_json::Value, Vec<Record>, bool), RecordError> {
        let mut out = Vec::new();
        while let Some(r) = self.next_record()? {
            out.push(r);
        }
        Ok((self.header, out, self.truncated))
    }
}

/// The file form of `header` and `records`, as a [`Session`] writes it.
pub fn encode_recording(header: &serde_json::Value, records: &[Record]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    let text = header.to_string();
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    for r in records {
        let (tag, body) = r.encode();
        out.push(tag);
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
    }
    out
}
