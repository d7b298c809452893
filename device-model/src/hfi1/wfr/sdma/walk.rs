//! The worker's walk of an SDMA engine's ring (docs/hfi1-fabric.md, "SDMA"): fetch the descriptors from the
//! engine's head to its tail, gather each packet from FIRST to LAST, check it, send it, and report each
//! packet's descriptors done (the head moves, the head goes back to host memory where the packet's last
//! descriptor asks, interrupts follow). Descriptor layout: sdma.h (SDMA_DESC0_*, SDMA_DESC1_*). With AHG
//! (cap_mask SDMA_AHG) a packet's headers are kept in one of the engine's 32 slots (COPY) and later packets
//! send the kept header with up to 9 field updates (APPLY), as the verbs layer does for MIDDLE packets.

#![forbid(unsafe_code)]

use vfio_user_proto::dma::DmaAccess;

use super::state::{
    Walk, SDMA_FIRST_DESC_ERR, SDMA_GEN_MISMATCH_ERR, SDMA_HEADER_SELECT_ERR, SDMA_LENGTH_MISMATCH_ERR,
    SDMA_MEM_READ_ERR, SDMA_PACKET_DESC_OVERFLOW_ERR, SDMA_TOO_LONG_ERR,
};
use crate::fault::FaultKind;
use crate::hfi1::datapath::egress;
use crate::hfi1::shared::{Shared, WfrFront};
use crate::hfi1::wfr::pio::{PBC_BYTES, PBC_LENGTH_DWS_MASK};
use crate::trace::{Block, Level, Val};

#[cfg(test)]
#[path = "walk_tests.rs"]
mod tests;

/// Bytes of one descriptor.
pub const DESC_BYTES: usize = 16;
pub const SDMA_DESC0_FIRST_DESC_FLAG: u64 = 1 << 63;
pub const SDMA_DESC0_LAST_DESC_FLAG: u64 = 1 << 62;
pub const SDMA_DESC0_BYTE_COUNT_SHIFT: u32 = 48;
pub const SDMA_DESC0_BYTE_COUNT_MASK: u64 = (1 << 14) - 1;
pub const SDMA_DESC0_PHY_ADDR_MASK: u64 = (1 << 48) - 1;
pub const SDMA_DESC1_HEADER_UPDATE1_SHIFT: u32 = 32;
pub const SDMA_DESC1_HEADER_MODE_SHIFT: u32 = 13;
pub const SDMA_DESC1_HEADER_MODE_MASK: u64 = 0x7;
pub const SDMA_DESC1_HEADER_INDEX_SHIFT: u32 = 8;
pub const SDMA_DESC1_HEADER_INDEX_MASK: u64 = 0x1F;
pub const SDMA_DESC1_HEADER_DWS_SHIFT: u32 = 4;
pub const SDMA_DESC1_HEADER_DWS_MASK: u64 = 0xF;
/// AHG modes (sdma.h SDMA_AHG_*; 0 is none): store the header, apply 1, up to 5, up to 9 updates to a stored one.
pub const SDMA_AHG_COPY: u64 = 1;
pub const SDMA_AHG_APPLY_UPDATE1: u64 = 2;
pub const SDMA_AHG_APPLY_UPDATE2: u64 = 3;
pub const SDMA_AHG_APPLY_UPDATE3: u64 = 4;
/// An AHG update word (sdma.h SDMA_AHG_*: sdma_build_ahg_descriptor): the value, the header dword it goes to
/// (counted from the PBC), the field's length and first bit in that dword, and the enable bit.
pub const SDMA_AHG_VALUE_MASK: u32 = 0xFFFF;
pub const SDMA_AHG_INDEX_SHIFT: u32 = 16;
pub const SDMA_AHG_INDEX_MASK: u32 = 0xF;
pub const SDMA_AHG_FIELD_LEN_SHIFT: u32 = 20;
pub const SDMA_AHG_FIELD_LEN_MASK: u32 = 0xF;
pub const SDMA_AHG_FIELD_START_SHIFT: u32 = 24;
pub const SDMA_AHG_FIELD_START_MASK: u32 = 0x1F;
pub const SDMA_AHG_UPDATE_ENABLE: u32 = 1 << 31;
pub const SDMA_DESC1_GENERATION_SHIFT: u32 = 2;
pub const SDMA_DESC1_GENERATION_MASK: u64 = 0x3;
pub const SDMA_DESC1_INT_REQ_FLAG: u64 = 1 << 1;
pub const SDMA_DESC1_HEAD_TO_HOST_FLAG: u64 = 1 << 0;
/// Descriptors of one packet at most (sdma.h MAX_DESC), and its largest size (MAX_SDMA_PKT_SIZE).
pub const MAX_DESC: usize = 64;
pub const MAX_SDMA_PKT_SIZE: usize = 16 * 1024 - 1;
/// Descriptors fetched at once.
const FETCH: u64 = 256;

#[derive(Debug, Clone, Copy)]
struct Desc {
    qw0: u64,
    qw1: u64,
}

impl Desc {
    fn addr(&self) -> u64 {
        self.qw0 & SDMA_DESC0_PHY_ADDR_MASK
    }
    fn len(&self) -> usize {
        ((self.qw0 >> SDMA_DESC0_BYTE_COUNT_SHIFT) & SDMA_DESC0_BYTE_COUNT_MASK) as usize
    }
    fn first(&self) -> bool {
        self.qw0 & SDMA_DESC0_FIRST_DESC_FLAG != 0
    }
    fn last(&self) -> bool {
        self.qw0 & SDMA_DESC0_LAST_DESC_FLAG != 0
    }
    fn generation(&self) -> u8 {
        ((self.qw1 >> SDMA_DESC1_GENERATION_SHIFT) & SDMA_DESC1_GENERATION_MASK) as u8
    }
    fn header_mode(&self) -> u64 {
        (self.qw1 >> SDMA_DESC1_HEADER_MODE_SHIFT) & SDMA_DESC1_HEADER_MODE_MASK
    }
    fn header_index(&self) -> usize {
        ((self.qw1 >> SDMA_DESC1_HEADER_INDEX_SHIFT) & SDMA_DESC1_HEADER_INDEX_MASK) as usize
    }
    fn header_dws(&self) -> usize {
        ((self.qw1 >> SDMA_DESC1_HEADER_DWS_SHIFT) & SDMA_DESC1_HEADER_DWS_MASK) as usize
    }
    /// The edit descriptors that follow a FIRST descriptor applying AHG updates (they hold update words, not
    /// an address, and carry no generation: sdma.c _sdma_txreq_ahgadd, submit_tx).
    fn edits(&self) -> usize {
        match self.header_mode() {
            SDMA_AHG_APPLY_UPDATE2 => 1,
            SDMA_AHG_APPLY_UPDATE3 => 2,
            _ => 0,
        }
    }
}

/// How many descriptors the packet starting at `descs[0]` takes: `Ok(None)` while its LAST descriptor is not
/// among them.
fn packet_len(descs: &[Desc]) -> Result<Option<usize>, u64> {
    let first = descs[0];
    if !first.first() {
        return Err(SDMA_FIRST_DESC_ERR);
    }
    if first.header_mode() > SDMA_AHG_APPLY_UPDATE3 {
        return Err(SDMA_HEADER_SELECT_ERR);
    }
    let edits = first.edits();
    if edits == 0 && first.last() {
        return Ok(Some(1));
    }
    for (k, d) in descs.iter().enumerate().take(MAX_DESC).skip(1 + edits) {
        if d.first() {
            return Err(SDMA_FIRST_DESC_ERR);
        }
        if d.last() {
            return Ok(Some(k + 1));
        }
    }
    if descs.len() >= MAX_DESC {
        return Err(SDMA_PACKET_DESC_OVERFLOW_ERR);
    }
    Ok(None)
}

/// The AHG update words of an applying packet: update 1 in the FIRST descriptor, 2 to 9 in its edit
/// descriptors (qw0 low, qw0 high, qw1 low, qw1 high of each).
fn ahg_updates(packet: &[Desc]) -> Vec<u32> {
    let first = packet[0];
    let mut words = vec![(first.qw1 >> SDMA_DESC1_HEADER_UPDATE1_SHIFT) as u32];
    for d in &packet[1..1 + first.edits()] {
        words.extend([d.qw0 as u32, (d.qw0 >> 32) as u32, d.qw1 as u32, (d.qw1 >> 32) as u32]);
    }
    words.into_iter().filter(|w| w & SDMA_AHG_UPDATE_ENABLE != 0).collect()
}

/// Applies AHG updates to a stored header: each sets a field of one little-endian header dword (a field
/// length of 0 means 16 bits: the 4-bit field cannot hold the 16 the kernel passes, ruc.c build_ahg).
fn apply_updates(header: &mut [u8], updates: &[u32]) -> Result<(), u64> {
    for &u in updates {
        let index = ((u >> SDMA_AHG_INDEX_SHIFT) & SDMA_AHG_INDEX_MASK) as usize;
        let len = match (u >> SDMA_AHG_FIELD_LEN_SHIFT) & SDMA_AHG_FIELD_LEN_MASK {
            0 => 16,
            l => l,
        };
        let start = (u >> SDMA_AHG_FIELD_START_SHIFT) & SDMA_AHG_FIELD_START_MASK;
        let bytes = header.get_mut(index * 4..index * 4 + 4).ok_or(SDMA_HEADER_SELECT_ERR)?;
        if start + len > 32 {
            return Err(SDMA_HEADER_SELECT_ERR);
        }
        let mut dw = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let mask = (((1u64 << len) - 1) << start) as u32;
        dw = (dw & !mask) | (((u & SDMA_AHG_VALUE_MASK) << start) & mask);
        bytes.copy_from_slice(&dw.to_le_bytes());
    }
    Ok(())
}

/// Walks engine `engine` until it has nothing left (or halts). Work of an older epoch stops.
pub(in crate::hfi1) fn run(shared: &Shared, front: &WfrFront, epoch: u64, engine: usize) {
    let dma = shared.dma();
    loop {
        let walk = {
            let _rxe = shared.lock_rxe();
            if !shared.current(epoch) {
                return;
            }
            let (walk, vectors) = front.lock().sdma_raising(|e, errs, raised| e.walk(engine, errs, raised));
            vectors.into_iter().for_each(|v| shared.raise(v));
            walk
        };
        let Some(walk) = walk else { return };
        if !walk_once(shared, front, dma.as_ref(), walk, epoch) {
            return;
        }
    }
}

/// The descriptors a walk hands over: from its head up to its tail, wrapping at the ring end. `None` when
/// either index lies outside the ring (`Sdma::walk` halts such an engine before it makes a walk).
fn ring_span(walk: &Walk) -> Option<u64> {
    if walk.head >= walk.count || walk.tail >= walk.count {
        return None;
    }
    Some(match walk.tail.checked_sub(walk.head) {
        Some(n) => n,
        None => walk.count - walk.head + walk.tail,
    })
}

/// One fetch of descriptors and the packets complete in it. False when nothing more can be done now; true
/// only after at least one packet went, so `run` never loops without progress whatever the walk says.
fn walk_once(shared: &Shared, front: &WfrFront, dma: &dyn DmaAccess, walk: Walk, epoch: u64) -> bool {
    let n = match ring_span(&walk) {
        Some(n) if n > 0 => n.min(FETCH),
        _ => return false,
    };
    let Some(descs) = fetch(dma, &walk, n) else {
        fail(shared, front, &walk, SDMA_MEM_READ_ERR, epoch);
        return false;
    };
    let mut i = 0usize;
    let mut sent = false;
    while i < descs.len() {
        // ring_span checked the head against the ring (below 2^16 descriptors) and i < FETCH: no overflow.
        let start = walk.head + i as u64;
        let len = match packet_len(&descs[i..]) {
            Ok(Some(len)) => len,
            // The packet's LAST descriptor is not handed over (or fetched) yet: the next walk looks again.
            Ok(None) => return sent,
            Err(bits) => {
                fail(shared, front, &walk, bits, epoch);
                return false;
            }
        };
        let packet = &descs[i..i + len];
        let checked = check(packet, &walk, start).and_then(|()| gather(front, dma, &walk, packet));
        let (pbc, body) = match checked {
            Ok(p) => p,
            Err(bits) => {
                fail(shared, front, &walk, bits, epoch);
                return false;
            }
        };
        egress::send(shared, front, "sdma", walk.engine as u32, pbc, &body, len as u16);
        let last = packet[len - 1];
        let progress = {
            let _rxe = shared.lock_rxe();
            if !shared.current(epoch) {
                return false;
            }
            let to_host = last.qw1 & SDMA_DESC1_HEAD_TO_HOST_FLAG != 0;
            let int_req = last.qw1 & SDMA_DESC1_INT_REQ_FLAG != 0;
            let step = Walk { head: (walk.head + i as u64) % walk.count, ..walk };
            match front.lock().sdma().advance(&step, len as u64, to_host, int_req) {
                Some(p) => p,
                None => return false, // cleaned up, halted or reset since the walk began
            }
        };
        if let Some((addr, head)) = progress.head_write {
            let engine = walk.engine as u32;
            let head = match shared.probe.fault(FaultKind::SdmaHeadWb, |p| p.engine.is_none_or(|e| e == engine)) {
                Some(f) => f.params.edit(head),
                None => head,
            };
            if dma.write_u64(addr, head).is_err() {
                shared.counters.sdma_head_dma_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        // The sources one completion raises (INT_REQ, progress, idle: remap_sdma_interrupts maps all three to
        // the engine's vector) reach the host as one message per vector. On the chip their edges are simultaneous
        // and merge in the CPU's pending vector; sent one by one, the second finds the status the first handler
        // already took ("SDMA engine N interrupt, but no status bits set", chip.c sdma_interrupt).
        let mut vectors: Vec<u16> = Vec::new();
        {
            let mut w = front.lock();
            for v in progress.sources.into_iter().filter_map(|source| w.raise(source)) {
                if !vectors.contains(&v) {
                    vectors.push(v);
                }
            }
        }
        for v in vectors {
            shared.raise(v);
        }
        sent = true;
        i += len;
    }
    true
}

/// The `n` descriptors from the walk's head, wrapping at the ring end; `None` (a read error) where the ring's
/// address does not fit the address space.
fn fetch(dma: &dyn DmaAccess, walk: &Walk, n: u64) -> Option<Vec<Desc>> {
    let first = n.min(walk.count.checked_sub(walk.head)?);
    let mut bytes = vec![0u8; (n as usize) * DESC_BYTES];
    let (a, b) = bytes.split_at_mut(first as usize * DESC_BYTES);
    let at = walk.head.checked_mul(DESC_BYTES as u64).and_then(|off| walk.base.checked_add(off))?;
    dma.read(at, a).ok()?;
    if !b.is_empty() {
        dma.read(walk.base, b).ok()?;
    }
    Some(
        bytes
            .chunks_exact(DESC_BYTES)
            .map(|c| Desc {
                qw0: u64::from_le_bytes(c[0..8].try_into().unwrap_or_default()),
                qw1: u64::from_le_bytes(c[8..16].try_into().unwrap_or_default()),
            })
            .collect(),
    )
}

/// Each descriptor's generation is the ring lap of its slot (add_gen: `(descq_tail >> log2(cnt)) & 3`); AHG
/// edit descriptors carry none.
fn check(packet: &[Desc], walk: &Walk, start: u64) -> Result<(), u64> {
    let edits = 1..1 + packet[0].edits();
    if walk.gen_check {
        for (k, d) in packet.iter().enumerate().filter(|(k, _)| !edits.contains(k)) {
            let laps = ((start + k as u64) / walk.count) as u8;
            if d.generation() != walk.gen.wrapping_add(laps) & 3 {
                return Err(SDMA_GEN_MISMATCH_ERR);
            }
        }
    }
    Ok(())
}

/// The packet's bytes, split into PBC and the rest; its length must be the PBC's. Its header comes from its
/// first descriptor (and is kept, with AHG COPY) or, with AHG APPLY, from the kept header with the updates;
/// the rest from its data descriptors.
fn gather(front: &WfrFront, dma: &dyn DmaAccess, walk: &Walk, packet: &[Desc]) -> Result<(u64, Vec<u8>), u64> {
    let first = packet[0];
    let mode = first.header_mode();
    let mut bytes = Vec::new();
    let data = if mode >= SDMA_AHG_APPLY_UPDATE1 {
        let stored = front.lock().sdma().ahg_load(walk, first.header_index());
        let mut header = stored.get(..first.header_dws() * 4).ok_or(SDMA_HEADER_SELECT_ERR)?.to_vec();
        apply_updates(&mut header, &ahg_updates(packet))?;
        bytes = header;
        &packet[1 + first.edits()..]
    } else {
        packet
    };
    let total = bytes.len() + data.iter().map(Desc::len).sum::<usize>();
    if total > MAX_SDMA_PKT_SIZE {
        return Err(SDMA_TOO_LONG_ERR);
    }
    let mut at = bytes.len();
    bytes.resize(total, 0);
    for d in data {
        dma.read(d.addr(), &mut bytes[at..at + d.len()]).map_err(|_| SDMA_MEM_READ_ERR)?;
        at += d.len();
    }
    if mode == SDMA_AHG_COPY {
        let header = &bytes[..first.len().min(bytes.len())];
        front.lock().sdma().ahg_store(walk, first.header_index(), header);
    }
    if bytes.len() < PBC_BYTES {
        return Err(SDMA_LENGTH_MISMATCH_ERR);
    }
    let pbc = u64::from_le_bytes(bytes[..PBC_BYTES].try_into().unwrap_or_default());
    if (pbc & PBC_LENGTH_DWS_MASK) as usize * 4 != total {
        return Err(SDMA_LENGTH_MISMATCH_ERR);
    }
    Ok((pbc, bytes.split_off(PBC_BYTES)))
}

fn fail(shared: &Shared, front: &WfrFront, walk: &Walk, bits: u64, epoch: u64) {
    let vectors = {
        let _rxe = shared.lock_rxe();
        if !shared.current(epoch) {
            return;
        }
        front.lock().sdma_raising(|e, errs, raised| e.fail(walk, bits, errs, raised)).1
    };
    shared.counters.sdma_halts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    shared.probe.trace.event(
        Block::Txe,
        Level::Info,
        "sdma-halt",
        &[("engine", Val::Dec(walk.engine as u64)), ("err_status", Val::Hex(bits))],
    );
    vectors.into_iter().for_each(|v| shared.raise(v));
}
