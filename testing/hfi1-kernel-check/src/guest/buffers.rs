//! Which buffers the program registers, how they share mappings, and how they are grouped into rounds
//! that fit the context's TIDs.
//!
//! The per-call limit: `pin_rcv_pages` (user_exp_rcv.c:167) refuses a buffer of more pages than the
//! context's `expected_count` with EINVAL, so one TID_UPDATE covers at most expected_count pages; it then
//! programs at most `tid_limit - tid_used` entries (user_exp_rcv.c:299), where tid_limit is expected_count
//! for a context without subcontexts (user_exp_rcv.c:96). A buffer of N pages needs at most N entries (one
//! per page if no two pages are physically adjacent), so a round whose buffers total at most
//! expected_count pages is always programmed whole.

use crate::proto::BufferKind;

const PAGE: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferSpec {
    pub id: u32,
    pub pages: u32,
    /// Bytes passed to TID_UPDATE (at most pages × 4 KiB; less for a ragged end).
    pub len: u64,
}

/// One mapping and the buffers in it, each followed by one guard page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapSpec {
    pub kind: BufferKind,
    pub buffers: Vec<BufferSpec>,
}

impl MapSpec {
    /// Pages of the mapping: every buffer plus its guard page.
    pub fn pages(&self) -> usize {
        self.buffers.iter().map(|b| b.pages as usize + 1).sum()
    }

    /// Byte offset of each buffer in the mapping.
    pub fn offsets(&self) -> Vec<usize> {
        let mut at = 0;
        self.buffers
            .iter()
            .map(|b| {
                let here = at;
                at += (b.pages as usize + 1) * PAGE as usize;
                here
            })
            .collect()
    }

    /// The most TIDs the mapping's buffers can need: one per page.
    pub fn worst_tids(&self) -> u32 {
        self.buffers.iter().map(|b| b.pages).sum()
    }
}

/// Pages of the huge-page buffer: one 2 MiB entry, MAX_EXPECTED_BUFFER.
pub const HUGE_PAGES: u32 = 512;

/// The buffers for a context of `expected_count` entries: small separate ones (one with a ragged length),
/// three carved from one mapping, two scattered, a huge-page one, and the per-call maximum twice
/// (contiguous and scattered). Mappings needing more TIDs than the context has are left out.
pub fn default_maps(expected_count: u32) -> Vec<MapSpec> {
    use BufferKind::*;
    let mut ids = 0u32..;
    let mut buf = |pages: u32, len: u64| BufferSpec { id: ids.next().unwrap_or(u32::MAX), pages, len };
    let full = |pages: u32| u64::from(pages) * PAGE;
    let mut maps = vec![
        MapSpec { kind: Separate, buffers: vec![buf(1, full(1))] },
        MapSpec { kind: Separate, buffers: vec![buf(2, full(2))] },
        // A length that ends mid-page: the kernel programs whole pages and says so in tinfo.length.
        MapSpec { kind: Separate, buffers: vec![buf(3, full(3) - 100)] },
        MapSpec { kind: Separate, buffers: vec![buf(16, full(16))] },
        MapSpec { kind: Carved, buffers: vec![buf(4, full(4)), buf(8, full(8)), buf(5, full(5))] },
        MapSpec { kind: Scattered, buffers: vec![buf(8, full(8))] },
        MapSpec { kind: Scattered, buffers: vec![buf(64, full(64))] },
    ];
    if expected_count >= HUGE_PAGES {
        maps.push(MapSpec { kind: Huge, buffers: vec![buf(HUGE_PAGES, full(HUGE_PAGES))] });
    }
    maps.push(MapSpec { kind: Separate, buffers: vec![buf(expected_count, full(expected_count))] });
    maps.push(MapSpec { kind: Scattered, buffers: vec![buf(expected_count, full(expected_count))] });
    maps.retain(|m| m.worst_tids() >= 1 && m.worst_tids() <= expected_count);
    maps
}

/// First-fit grouping, in order, of mappings into rounds of at most `tid_limit` worst-case TIDs.
pub fn rounds(maps: Vec<MapSpec>, tid_limit: u32) -> Vec<Vec<MapSpec>> {
    let mut out: Vec<(u32, Vec<MapSpec>)> = Vec::new();
    for m in maps {
        let need = m.worst_tids();
        match out.iter_mut().find(|(used, _)| used + need <= tid_limit) {
            Some((used, round)) => {
                *used += need;
                round.push(m);
            }
            None => out.push((need, vec![m])),
        }
    }
    out.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_context_gets_every_kind_and_the_per_call_maximum_twice() {
        let maps = default_maps(2048);
        let kinds: Vec<_> = maps.iter().map(|m| (m.kind, m.worst_tids())).collect();
        use BufferKind::*;
        assert_eq!(
            kinds,
            [
                (Separate, 1),
                (Separate, 2),
                (Separate, 3),
                (Separate, 16),
                (Carved, 17),
                (Scattered, 8),
                (Scattered, 64),
                (Huge, 512),
                (Separate, 2048),
                (Scattered, 2048)
            ]
        );
        let ids: Vec<u32> = maps.iter().flat_map(|m| m.buffers.iter().map(|b| b.id)).collect();
        assert_eq!(ids, (0..12).collect::<Vec<_>>());
        assert_eq!(maps[2].buffers[0].len, 3 * 4096 - 100);
        assert_eq!(maps[4].offsets(), [0, 5 * 4096, 14 * 4096]);
        assert_eq!(maps[4].pages(), 20);
    }

    #[test]
    fn rounds_never_need_more_tids_than_the_context_has() {
        for e in [16, 111, 256, 512, 623, 2048] {
            let r = rounds(default_maps(e), e);
            assert!(r.iter().all(|round| round.iter().map(MapSpec::worst_tids).sum::<u32>() <= e), "{e}");
            let ids: usize = r.iter().flatten().map(|m| m.buffers.len()).sum();
            assert_eq!(ids, default_maps(e).iter().map(|m| m.buffers.len()).sum::<usize>());
        }
        // 2048 entries: the small ones and the huge page share round 1; each maximum has a round alone.
        let r = rounds(default_maps(2048), 2048);
        assert_eq!(r.iter().map(Vec::len).collect::<Vec<_>>(), [8, 1, 1]);
    }

    #[test]
    fn a_small_context_drops_what_cannot_fit() {
        let maps = default_maps(16);
        assert!(maps.iter().all(|m| m.worst_tids() <= 16));
        assert!(!maps.iter().any(|m| m.kind == BufferKind::Huge));
        assert!(maps.iter().any(|m| m.kind == BufferKind::Scattered && m.worst_tids() == 16));
    }
}
