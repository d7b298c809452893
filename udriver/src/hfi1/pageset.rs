//! Page sets: cutting one segment's pages into physically contiguous, power-of-two chunks the RcvArray can
//! hold (§1.8). "Physically contiguous" is judged on IOVAs: page i+1 follows page i when its IOVA is 4096
//! higher.

#![forbid(unsafe_code)]

use crate::dma::PAGE_SIZE;

/// MAX_EXPECTED_BUFFER = 2 MiB = 512 pages of 4 KiB.
pub const MAX_EXPECTED_BUFFER: u64 = 2 << 20;
pub const MAX_EXPECTED_PAGES: u32 = (MAX_EXPECTED_BUFFER / PAGE_SIZE) as u32;
/// Bits of a page set's DMA address: the RcvArray ADDR field holds 36 bits of 4 KiB units (§1.3).
pub const TID_RDMA_PAGESET_ADDR_BITS: u32 = 48;

/// `struct tid_rdma_pageset`. A set with `count` 0 is a filler that keeps the set count even.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TidRdmaPageset {
    /// DMA address (IOVA) of the first page, valid once `mapped`.
    pub addr: u64,
    pub idx: u8,
    pub count: u8,
    pub mapped: bool,
}

fn set(idx: u32, count: u32) -> TidRdmaPageset {
    TidRdmaPageset { addr: 0, idx: idx as u8, count: count as u8, mapped: false }
}

fn rounddown_pow_of_two(n: u32) -> u32 {
    1 << n.ilog2()
}

fn follows(prev: u64, next: u64) -> bool {
    prev.checked_add(PAGE_SIZE) == Some(next)
}

/// `tid_rdma_find_phys_blocks_4k(flow, pages, npages, list)`: page sets for a 4 KiB path MTU.
pub fn tid_rdma_find_phys_blocks_4k(pages: &[u64], list: &mut Vec<TidRdmaPageset>) -> u32 {
    list.clear();
    let Some(&first) = pages.first() else { return 0 };
    let (mut pageidx, mut pagecount, mut prev) = (0u32, 1u32, first);
    for i in 1..=pages.len() {
        let this = pages.get(i).copied();
        if this.is_some_and(|p| follows(prev, p)) {
            prev += PAGE_SIZE;
            pagecount += 1;
            continue;
        }
        // End of a contiguous run: cut it into at most 2 MiB, power-of-two chunks.
        while pagecount > 0 {
            let maxpages = if u64::from(pagecount) * PAGE_SIZE > MAX_EXPECTED_BUFFER {
                MAX_EXPECTED_PAGES
            } else if !pagecount.is_power_of_two() {
                rounddown_pow_of_two(pagecount)
            } else {
                pagecount
            };
            list.push(set(pageidx, maxpages));
            pagecount -= maxpages;
            pageidx += maxpages;
        }
        pageidx = i as u32;
        pagecount = 1;
        if let Some(p) = this {
            prev = p;
        }
    }
    if list.len() & 1 != 0 {
        list.push(set(pageidx, 0));
    }
    list.len() as u32
}

/// `tid_flush_pages(list, idx, pages, sets)`: cuts `pages` pages starting at `*idx` into chunks, then pads the
/// list to an even length.
fn tid_flush_pages(list: &mut Vec<TidRdmaPageset>, idx: &mut u32, mut pages: u32) {
    while pages > 0 {
        let maxpages = if pages > MAX_EXPECTED_PAGES {
            MAX_EXPECTED_PAGES
        } else if !pages.is_power_of_two() {
            rounddown_pow_of_two(pages)
        } else {
            pages
        };
        list.push(set(*idx, maxpages));
        *idx += maxpages;
        pages -= maxpages;
    }
    if list.len() & 1 != 0 {
        list.push(set(*idx, 0));
    }
}

/// `tid_rdma_find_phys_blocks_8k(flow, pages, npages, list)`: page sets for larger path MTUs, built from
/// page pairs so every packet's 8 KiB lands in one set.
pub fn tid_rdma_find_phys_blocks_8k(pages: &[u64], list: &mut Vec<TidRdmaPageset>) -> u32 {
    list.clear();
    if pages.is_empty() {
        return 0;
    }
    let (mut idx, mut pagecnt, mut vm1): (u32, u32, Option<u64>) = (0, 0, None);
    for i in (0..pages.len()).step_by(2) {
        let v0 = pages[i];
        let v1 = pages.get(i + 1).copied();
        if !v1.is_some_and(|v| follows(v0, v)) {
            tid_flush_pages(list, &mut idx, pagecnt);
            list.push(set(idx, 1));
            idx += 1;
            if v1.is_some() {
                list.push(set(idx, 1));
                idx += 1;
            } else {
                list.push(set(idx, 0));
            }
            vm1 = None;
            pagecnt = 0;
            continue;
        }
        if vm1.is_some_and(|p| !follows(p, v0)) {
            tid_flush_pages(list, &mut idx, pagecnt);
            pagecnt = 0;
        }
        pagecnt += 2;
        vm1 = v1;
    }
    let rest = (pages.len() as u32).saturating_sub(idx);
    tid_flush_pages(list, &mut idx, rest);
    list.len() as u32
}

/// `dma_map_flow`: DMA buffers are mapped when allocated, so mapping a set means taking the IOVA of its
/// first page. Fails when that IOVA does not fit the 48-bit page-set address.
pub fn dma_map_flow(pages: &[u64], list: &mut [TidRdmaPageset]) -> Result<(), i32> {
    for i in 0..list.len() {
        let Some(pset) = list.get_mut(i).filter(|p| p.count > 0) else { continue };
        match pages.get(usize::from(pset.idx)) {
            Some(&addr) if addr >> TID_RDMA_PAGESET_ADDR_BITS == 0 => {
                pset.addr = addr;
                pset.mapped = true;
            }
            // As the kernel, a failed mapping unmaps the sets mapped so far.
            _ => {
                dma_unmap_flow(list);
                return Err(-libc::ENOMEM);
            }
        }
    }
    Ok(())
}

/// `dma_unmap_flow`: forgets the addresses.
pub fn dma_unmap_flow(list: &mut [TidRdmaPageset]) {
    for pset in list.iter_mut() {
        pset.addr = 0;
        pset.mapped = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IOVAs for runs of contiguous pages, each run separated by a gap.
    fn pages(runs: &[u32]) -> Vec<u64> {
        let mut v = Vec::new();
        let mut base = 0x1_0000_0000u64;
        for &r in runs {
            v.extend((0..u64::from(r)).map(|i| base + i * PAGE_SIZE));
            base += (u64::from(r) + 7) * PAGE_SIZE;
        }
        v
    }

    fn idx_count(list: &[TidRdmaPageset]) -> Vec<(u8, u8)> {
        list.iter().map(|p| (p.idx, p.count)).collect()
    }

    #[test]
    fn four_k_finder_splits_golden_g6_segment_into_three_sets_and_a_filler() {
        let mut list = Vec::new();
        assert_eq!(tid_rdma_find_phys_blocks_4k(&pages(&[3, 1]), &mut list), 4);
        let got = idx_count(&list);
        assert_eq!(&got[..3], &[(0, 2), (2, 1), (3, 1)]);
        assert_eq!(got[3].1, 0, "filler");
    }

    #[test]
    fn four_k_finder_cuts_runs_to_powers_of_two() {
        // (runs, expected counts) derived from the §1.8 rules.
        let cases: &[(&[u32], &[u8])] =
            &[(&[64], &[64, 0]), (&[7], &[4, 2, 1, 0]), (&[1, 1], &[1, 1]), (&[5, 3], &[4, 1, 2, 1])];
        for (runs, counts) in cases {
            let mut list = Vec::new();
            tid_rdma_find_phys_blocks_4k(&pages(runs), &mut list);
            let got: Vec<u8> = list.iter().map(|p| p.count).collect();
            assert_eq!(&got, counts, "runs {runs:?}");
            assert_eq!(list.len() % 2, 0);
        }
    }

    #[test]
    fn eight_k_finder_emits_single_pages_for_broken_pairs() {
        // Pages 0-3 contiguous, page 4 alone, 5-6 contiguous but not with 4, page 7 alone at the end.
        // pairs (0,1),(2,3) gather 4 pages; pair (4,5) broken -> flush {0,4}+filler, then {4,1},{5,1};
        // pair (6,7): 6,7 not contiguous -> {6,1},{7,1}.
        let p = pages(&[4, 1, 2, 1]);
        let mut list = Vec::new();
        tid_rdma_find_phys_blocks_8k(&p, &mut list);
        assert_eq!(idx_count(&list), vec![(0, 4), (4, 0), (4, 1), (5, 1), (6, 1), (7, 1)]);
    }

    #[test]
    fn eight_k_finder_handles_odd_page_count_and_contiguous_tail() {
        let mut list = Vec::new();
        // 5 contiguous pages: pairs (0,1),(2,3) gather 4; page 4 has no partner -> flush 4, then {4,1}+filler.
        tid_rdma_find_phys_blocks_8k(&pages(&[5]), &mut list);
        let got = idx_count(&list);
        assert_eq!(got[0], (0, 4));
        assert_eq!(got[1].1, 0);
        assert_eq!(got[2], (4, 1));
        assert_eq!(got[3].1, 0);
        assert_eq!(got.len(), 4);
    }

    #[test]
    fn eight_k_finder_flushes_when_pairs_are_not_contiguous_with_each_other() {
        let mut list = Vec::new();
        tid_rdma_find_phys_blocks_8k(&pages(&[2, 2]), &mut list);
        let got = idx_count(&list);
        assert_eq!(got[0], (0, 2));
        assert_eq!(got[1].1, 0);
        assert_eq!(got[2], (2, 2));
        assert_eq!(got[3].1, 0);
    }

    #[test]
    fn mapping_takes_the_iova_of_each_sets_first_page_and_skips_fillers() {
        let p = pages(&[3, 1]);
        let mut list = Vec::new();
        tid_rdma_find_phys_blocks_4k(&p, &mut list);
        dma_map_flow(&p, &mut list).unwrap();
        assert_eq!(list[0].addr, p[0]);
        assert_eq!(list[1].addr, p[2]);
        assert_eq!(list[2].addr, p[3]);
        assert!(!list[3].mapped);
        let huge = [1u64 << 50];
        let mut l = vec![set(0, 1)];
        assert_eq!(dma_map_flow(&huge, &mut l), Err(-libc::ENOMEM));
    }
}
