//! The worker's walk of an SDMA engine's ring (docs/hfi1-fabric.md, "SDMA"): fetch the descriptors from the
//! engine's head to its tail, gather each packet from FIRST to LAST, check it, send it, and report each
//! packet's descriptors done (the head moves, the head goes back to host memory where the packet's last
//! descriptor asks, interrupts follow). Descriptor layout: sdma.h (SDMA_DESC0_*, SDMA_DESC1_*).

#![forbid(unsafe_code)]

use vfio_user_proto::dma::DmaAccess;

use super::egress;
use super::shared::Shared;
use super::wfr::pio::{PBC_BYTES, PBC_LENGTH_DWS_MASK};
use super::wfr::sdma::{
    Walk, SDMA_FIRST_DESC_ERR, SDMA_GEN_MISMATCH_ERR, SDMA_HEADER_SELECT_ERR, SDMA_LENGTH_MISMATCH_ERR,
    SDMA_MEM_READ_ERR, SDMA_PACKET_DESC_OVERFLOW_ERR, SDMA_TOO_LONG_ERR,
};

/// Bytes of one descriptor.
pub const DESC_BYTES: usize = 16;
pub const SDMA_DESC0_FIRST_DESC_FLAG: u64 = 1 << 63;
pub const SDMA_DESC0_LAST_DESC_FLAG: u64 = 1 << 62;
pub const SDMA_DESC0_BYTE_COUNT_SHIFT: u32 = 48;
pub const SDMA_DESC0_BYTE_COUNT_MASK: u64 = (1 << 14) - 1;
pub const SDMA_DESC0_PHY_ADDR_MASK: u64 = (1 << 48) - 1;
pub const SDMA_DESC1_HEADER_MODE_SHIFT: u32 = 13;
pub const SDMA_DESC1_HEADER_MODE_MASK: u64 = 0x7;
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
}

/// Walks engine `engine` until it has nothing left (or halts). Work of an older epoch stops.
pub(super) fn run(shared: &Shared, epoch: u64, engine: usize) {
    let dma = shared.dma();
    loop {
        let walk = {
            let _chip = shared.lock_chip();
            if !shared.current(epoch) {
                return;
            }
            let Some((walk, vectors)) = shared.lock_wfr().map(|mut w| w.sdma_walk(engine)) else { return };
            vectors.into_iter().for_each(|v| shared.raise(v));
            walk
        };
        let Some(walk) = walk else { return };
        if !walk_once(shared, dma.as_ref(), walk, epoch) {
            return;
        }
    }
}

/// One fetch of descriptors and the packets complete in it. False when nothing more can be done now.
fn walk_once(shared: &Shared, dma: &dyn DmaAccess, walk: Walk, epoch: u64) -> bool {
    let avail = (walk.tail + walk.count - walk.head) % walk.count;
    let n = avail.min(FETCH);
    let Some(descs) = fetch(dma, &walk, n) else {
        fail(shared, &walk, SDMA_MEM_READ_ERR, epoch);
        return false;
    };
    let mut i = 0usize;
    let mut sent = false;
    while i < descs.len() {
        let start = walk.head + i as u64;
        let Some(len) = descs[i..].iter().take(MAX_DESC).position(Desc::last).map(|p| p + 1) else {
            if descs.len() - i >= MAX_DESC {
                fail(shared, &walk, SDMA_PACKET_DESC_OVERFLOW_ERR, epoch);
                return false;
            }
            // The packet's LAST descriptor is not handed over (or fetched) yet: the next walk looks again.
            return sent;
        };
        let packet = &descs[i..i + len];
        let checked = check(packet, &walk, start).and_then(|()| gather(dma, packet));
        let (pbc, body) = match checked {
            Ok(p) => p,
            Err(bits) => {
                fail(shared, &walk, bits, epoch);
                return false;
            }
        };
        egress::send(shared, "sdma", walk.engine as u32, pbc, &body, len as u16);
        let last = packet[len - 1];
        let progress = {
            let _chip = shared.lock_chip();
            if !shared.current(epoch) {
                return false;
            }
            let to_host = last.qw1 & SDMA_DESC1_HEAD_TO_HOST_FLAG != 0;
            let int_req = last.qw1 & SDMA_DESC1_INT_REQ_FLAG != 0;
            let step = Walk { head: (walk.head + i as u64) % walk.count, ..walk };
            match shared.lock_wfr().and_then(|mut w| w.sdma_advance(&step, len as u64, to_host, int_req)) {
                Some(p) => p,
                None => return false, // cleaned up, halted or reset since the walk began
            }
        };
        if let Some((addr, head)) = progress.head_write {
            if dma.write_u64(addr, head).is_err() {
                shared.counters.sdma_head_dma_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        for source in progress.sources {
            if let Some(v) = shared.lock_wfr().and_then(|mut w| w.raise(source)) {
                shared.raise(v);
            }
        }
        sent = true;
        i += len;
    }
    true
}

/// The `n` descriptors from the walk's head, wrapping at the ring end.
fn fetch(dma: &dyn DmaAccess, walk: &Walk, n: u64) -> Option<Vec<Desc>> {
    let first = n.min(walk.count - walk.head);
    let mut bytes = vec![0u8; (n as usize) * DESC_BYTES];
    let (a, b) = bytes.split_at_mut(first as usize * DESC_BYTES);
    dma.read(walk.base + walk.head * DESC_BYTES as u64, a).ok()?;
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

/// The chip's checks of one packet's descriptors: FIRST on the first only, each descriptor's generation the
/// ring lap of its slot (add_gen: `(descq_tail >> log2(cnt)) & 3`), no AHG (not modelled).
fn check(packet: &[Desc], walk: &Walk, start: u64) -> Result<(), u64> {
    if !packet[0].first() || packet[1..].iter().any(Desc::first) {
        return Err(SDMA_FIRST_DESC_ERR);
    }
    if packet.iter().any(|d| d.header_mode() != 0) {
        return Err(SDMA_HEADER_SELECT_ERR);
    }
    if walk.gen_check {
        for (k, d) in packet.iter().enumerate() {
            let laps = ((start + k as u64) / walk.count) as u8;
            if d.generation() != walk.gen.wrapping_add(laps) & 3 {
                return Err(SDMA_GEN_MISMATCH_ERR);
            }
        }
    }
    Ok(())
}

/// The packet's bytes from its descriptors, split into PBC and the rest; its length must be the PBC's.
fn gather(dma: &dyn DmaAccess, packet: &[Desc]) -> Result<(u64, Vec<u8>), u64> {
    let total: usize = packet.iter().map(Desc::len).sum();
    if total > MAX_SDMA_PKT_SIZE {
        return Err(SDMA_TOO_LONG_ERR);
    }
    let mut bytes = vec![0u8; total];
    let mut at = 0;
    for d in packet {
        dma.read(d.addr(), &mut bytes[at..at + d.len()]).map_err(|_| SDMA_MEM_READ_ERR)?;
        at += d.len();
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

fn fail(shared: &Shared, walk: &Walk, bits: u64, epoch: u64) {
    let vectors = {
        let _chip = shared.lock_chip();
        if !shared.current(epoch) {
            return;
        }
        shared.lock_wfr().map(|mut w| w.sdma_fail(walk, bits)).unwrap_or_default()
    };
    shared.counters.sdma_halts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    vectors.into_iter().for_each(|v| shared.raise(v));
}
