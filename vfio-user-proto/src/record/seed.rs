//! Fuzz seeds made from recordings, for the `vfio_user_server` target (fuzz/, docs/fuzzing.md).
//!
//! A seed is a short run of a recorded session's client messages, with the descriptors they carried
//! replaced by fresh ones of the same kind and the DMA contents the device read, which the harness hands back
//! when the server asks. Layout (little-endian):
//! `SEED_MAGIC`, `u8` device (0 hfi1, 1 irdma, 2 hfi1-wfr), then items, each `u8` kind:
//! - 1 message: `u16` command, `u32` header flags, `u8` fd kind (0 none, 1 a memfd of `n` pages, 2 `n`
//!   eventfds), `u8` n, `u32` length, payload;
//! - 2 DMA data: `u32` length, bytes (answers for the server's next DMA_READs, in order).

#![forbid(unsafe_code)]

use super::format::Record;
use crate::wire::command;

pub const SEED_MAGIC: &[u8; 8] = b"VFUSEED1";
/// Items of one seed at most (the harness runs at most 48 operations).
pub const MAX_ITEMS: usize = 256;
/// Largest item body.
pub const MAX_ITEM: usize = 1 << 20;
/// Pages of a seed's DMA memfd at most (what the harness creates).
pub const MAX_MEMFD_PAGES: u8 = 15;
const PAGE: u64 = 4096;

/// Which server a seed is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeedDevice {
    Hfi1 = 0,
    Irdma = 1,
    Hfi1Wfr = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeedFds {
    None,
    /// A memfd of this many pages (a DMA_MAP's backing).
    Memfd(u8),
    /// This many eventfds (DEVICE_SET_IRQS).
    Eventfds(u8),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeedItem {
    Message { command: u16, flags: u32, fds: SeedFds, payload: Vec<u8> },
    DmaData(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    pub device: SeedDevice,
    pub items: Vec<SeedItem>,
}

impl Seed {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = SEED_MAGIC.to_vec();
        out.push(self.device as u8);
        for item in &self.items {
            match item {
                SeedItem::Message { command, flags, fds, payload } => {
                    out.push(1);
                    out.extend_from_slice(&command.to_le_bytes());
                    out.extend_from_slice(&flags.to_le_bytes());
                    let (kind, n) = match fds {
                        SeedFds::None => (0, 0),
                        SeedFds::Memfd(n) => (1, *n),
                        SeedFds::Eventfds(n) => (2, *n),
                    };
                    out.extend_from_slice(&[kind, n]);
                    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
                    out.extend_from_slice(payload);
                }
                SeedItem::DmaData(data) => {
                    out.push(2);
                    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
                    out.extend_from_slice(data);
                }
            }
        }
        out
    }

    /// A seed, or `None` for anything else (the harness then decodes its input the ordinary way). Trailing
    /// bytes that do not form a whole item are ignored, so mutated seeds still run.
    pub fn decode(data: &[u8]) -> Option<Seed> {
        let rest = data.strip_prefix(SEED_MAGIC.as_slice())?;
        let (&dev, mut rest) = rest.split_first()?;
        let device = match dev % 3 {
            0 => SeedDevice::Hfi1,
            1 => SeedDevice::Irdma,
            _ => SeedDevice::Hfi1Wfr,
        };
        let mut items = Vec::new();
        let take = |rest: &mut &[u8], n: usize| -> Option<Vec<u8>> {
            let (a, b) = rest.split_at_checked(n)?;
            *rest = b;
            Some(a.to_vec())
        };
        let u32_of = |b: &[u8]| b.try_into().ok().map(u32::from_le_bytes);
        while items.len() < MAX_ITEMS {
            let Some((&kind, after)) = rest.split_first() else { break };
            rest = after;
            let item = match kind {
                1 => {
                    let Some(head) = take(&mut rest, 12) else { break };
                    let command = u16::from_le_bytes([head[0], head[1]]);
                    let flags = u32_of(&head[2..6])?;
                    let fds = match head[6] % 3 {
                        0 => SeedFds::None,
                        1 => SeedFds::Memfd(head[7].min(MAX_MEMFD_PAGES)),
                        _ => SeedFds::Eventfds(head[7] % 10),
                    };
                    let len = (u32_of(&head[8..12])? as usize).min(MAX_ITEM);
                    let Some(payload) = take(&mut rest, len) else { break };
                    SeedItem::Message { command, flags, fds, payload }
                }
                2 => {
                    let Some(head) = take(&mut rest, 4) else { break };
                    let len = (u32_of(&head)? as usize).min(MAX_ITEM);
                    let Some(data) = take(&mut rest, len) else { break };
                    SeedItem::DmaData(data)
                }
                _ => break,
            };
            items.push(item);
        }
        Some(Seed { device, items })
    }
}

/// A recorded client message as a seed message: descriptors become fresh ones of the same kind; a DMA_MAP
/// with a file gets a memfd the harness can make (offset 0, at most `MAX_MEMFD_PAGES` pages).
fn seed_message(header: &crate::wire::Header, payload: &[u8], fds: u8) -> SeedItem {
    let mut payload = payload.to_vec();
    let fds = match header.command {
        command::DMA_MAP if fds > 0 && payload.len() >= 32 => {
            let size = u64::from_le_bytes(payload[24..32].try_into().unwrap_or_default());
            let pages = (size / PAGE).clamp(1, u64::from(MAX_MEMFD_PAGES)) as u8;
            payload[8..16].copy_from_slice(&0u64.to_le_bytes());
            payload[24..32].copy_from_slice(&(u64::from(pages) * PAGE).to_le_bytes());
            SeedFds::Memfd(pages)
        }
        command::DEVICE_SET_IRQS => SeedFds::Eventfds(fds.min(9)),
        _ if fds > 0 => SeedFds::Memfd(1),
        _ => SeedFds::None,
    };
    SeedItem::Message { command: header.command, flags: header.flags, fds, payload }
}

/// Up to `max` seeds from a session: consecutive windows of `window` client messages (and the DMA data read
/// meanwhile), evenly spread over the session, each after the session's VERSION and its last PCI Command
/// write before the window (so BAR accesses are decoded), without duplicates.
pub fn seeds_from_records(records: &[Record], device: SeedDevice, window: usize, max: usize) -> Vec<Seed> {
    let window = window.max(1);
    // Positions of client messages.
    let messages: Vec<usize> =
        records.iter().enumerate().filter(|(_, r)| matches!(r, Record::Message { .. })).map(|(i, _)| i).collect();
    let version = records.iter().find_map(|r| match r {
        Record::Message { header, payload, fds } if header.command == command::VERSION => {
            Some(seed_message(header, payload, *fds))
        }
        _ => None,
    });
    let starts: Vec<usize> = (0..messages.len()).step_by(window).collect();
    let pick: Vec<usize> = if starts.len() <= max || max == 0 {
        starts
    } else {
        (0..max).map(|k| starts[k * starts.len() / max]).collect()
    };
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for start in pick.into_iter().take(if max == 0 { usize::MAX } else { max }) {
        let first = messages[start];
        let last = messages.get(start + window).copied().unwrap_or(records.len());
        let mut items = Vec::new();
        if let Some(v) = &version {
            items.push(v.clone());
        }
        if let Some(enable) = records[..first].iter().rev().find_map(command_write) {
            items.push(enable);
        }
        for r in &records[first..last] {
            match r {
                Record::Message { header, payload, fds } if header.command != command::VERSION => {
                    items.push(seed_message(header, payload, *fds))
                }
                Record::DmaRead { data, .. } if data.len() <= MAX_ITEM => items.push(SeedItem::DmaData(data.clone())),
                _ => {}
            }
        }
        let seed = Seed { device, items };
        if seen.insert(seed.encode()) {
            out.push(seed);
        }
    }
    out
}

/// A client's REGION_WRITE of the PCI Command register (config region 7, offset 4).
fn command_write(r: &Record) -> Option<SeedItem> {
    let Record::Message { header, payload, fds } = r else { return None };
    let config = crate::device::region::CONFIG;
    let is_cmd = header.command == command::REGION_WRITE
        && payload.len() > 16
        && u64::from_le_bytes(payload[0..8].try_into().ok()?) == 4
        && u32::from_le_bytes(payload[8..12].try_into().ok()?) == config;
    is_cmd.then(|| seed_message(header, payload, *fds))
}
