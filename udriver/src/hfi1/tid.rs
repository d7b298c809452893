//! TID groups, the three group sets, `kern_alloc_tids` and RcvArray programming (§1.3, §1.7, §1.10).

#![forbid(unsafe_code)]

use super::hfi::{ExpLocked, Hfi1Devdata};
pub use super::hfi::{ExpTidSet, TidGroup};
use super::regs::*;
use super::tid_rdma::{KernTidNode, TidRdmaFlow};
use crate::access::AccessError;

/// Which of a context's three group sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TidSetId {
    /// `tid_group_list`: free groups.
    Group,
    /// `tid_used_list`: partly used groups.
    Used,
    /// `tid_full_list`: full groups.
    Full,
}

fn set_mut<'a>(rcd: &'a mut ExpLocked<'_>, id: TidSetId) -> &'a mut ExpTidSet {
    match id {
        TidSetId::Group => &mut rcd.tid_group_list,
        TidSetId::Used => &mut rcd.tid_used_list,
        TidSetId::Full => &mut rcd.tid_full_list,
    }
}

/// `tid_group_move(grp, s1, s2)`: unlink from `s1`, append at the tail of `s2`.
pub fn tid_group_move(rcd: &mut ExpLocked<'_>, grp: usize, s1: TidSetId, s2: TidSetId) {
    if set_mut(rcd, s1).remove(grp) {
        set_mut(rcd, s2).push_back(grp);
    } else {
        tracing::error!(grp, ?s1, ?s2, "tid group not on the list it is moved from");
    }
}

/// `kern_add_tid_node`: records a pick with a snapshot of the group's map.
fn kern_add_tid_node(flow: &mut TidRdmaFlow, rcd: &ExpLocked<'_>, grp: usize, cnt: u32) {
    let map = rcd.groups.get(grp).map_or(0, |g| g.map);
    if cnt & 1 != 0 {
        tracing::warn!(grp, cnt, "unexpected odd allocation cnt");
    }
    flow.tnode.push(KernTidNode { grp, map, cnt: cnt as u8 });
    flow.tnode_cnt = flow.tnode.len() as u8;
}

/// `kern_alloc_tids(flow)`: reserves RcvArray entries for `flow.npagesets` page sets. Reserves only; groups
/// move when programmed. -EAGAIN when the context cannot hold them now.
pub fn kern_alloc_tids(flow: &mut TidRdmaFlow, rcd: &mut ExpLocked<'_>) -> Result<(), i32> {
    flow.tnode.clear();
    flow.tnode_cnt = 0;
    let npagesets = u32::from(flow.npagesets);
    let group_size = rcd.rcd.dd.rcv_entries.group_size;
    let mut ngroups = npagesets / group_size;
    let mut pageidx = 0u32;
    // Position in the free list after the whole-group walk: None = none taken, Some(len) = walked off the end.
    let mut last_free: Option<usize> = None;
    if ngroups > 0 {
        let free: Vec<usize> = rcd.tid_group_list.list.iter().copied().collect();
        last_free = Some(free.len());
        for (pos, grp) in free.iter().enumerate() {
            let size = u32::from(rcd.groups.get(*grp).map_or(0, |g| g.size));
            kern_add_tid_node(flow, rcd, *grp, size);
            pageidx += size;
            ngroups -= 1;
            if ngroups == 0 {
                last_free = Some(pos);
                break;
            }
        }
        if pageidx >= npagesets {
            return Ok(());
        }
    }
    let used: Vec<usize> = rcd.tid_used_list.list.iter().copied().collect();
    for grp in used {
        let Some(g) = rcd.groups.get(grp).copied() else { continue };
        let take = (npagesets - pageidx).min(u32::from(g.size.saturating_sub(g.used)));
        kern_add_tid_node(flow, rcd, grp, take);
        pageidx += take;
        if pageidx >= npagesets {
            return Ok(());
        }
    }
    // One more free group, continuing after the last one taken whole.
    let free_len = rcd.tid_group_list.list.len();
    let next = match last_free {
        Some(pos) if pos >= free_len => return Err(-libc::EAGAIN),
        Some(pos) => pos + 1,
        None => 0,
    };
    let Some(&grp) = rcd.tid_group_list.list.get(next) else { return Err(-libc::EAGAIN) };
    let size = u32::from(rcd.groups.get(grp).map_or(0, |g| g.size));
    let take = (npagesets - pageidx).min(size);
    kern_add_tid_node(flow, rcd, grp, take);
    pageidx += take;
    if pageidx >= npagesets {
        return Ok(());
    }
    Err(-libc::EAGAIN)
}

/// `hfi1_put_tid(dd, index, type, pa, order)`: one 64-bit store to RcvArray entry `index`, then the WC
/// flush rule: after EAGER, after INVALID_FLUSH, and at the end of every 4-entry block.
pub fn hfi1_put_tid(dd: &Hfi1Devdata, index: u32, ty: PtType, pa: u64, order: u32) -> Result<(), AccessError> {
    if index >= dd.chip_rcv_array_count {
        return Err(AccessError::OutOfRange {
            what: "RcvArray entry",
            bar: HFI1_BAR,
            offset: rcv_array_offset(index),
            size: rcv_array_offset(dd.chip_rcv_array_count),
        });
    }
    dd.csr().write_csr(rcv_array_offset(index), rcv_array_entry(ty, pa, order))?;
    if matches!(ty, PtType::PT_EAGER | PtType::PT_INVALID_FLUSH) || index & 3 == 3 {
        dd.device().flush_wc();
    }
    Ok(())
}

/// `rcv_array_wc_fill(dd, index)`: writes 0 (no WE, ignored by hardware) to keep a WC block whole. Does
/// nothing without a WC path (`dd.rcvarray_wc` clear), as the kernel does, which a mapped RcvArray needs.
pub fn rcv_array_wc_fill(dd: &Hfi1Devdata, index: u32) -> Result<(), AccessError> {
    if !dd.rcvarray_wc || index >= dd.chip_rcv_array_count {
        return Ok(());
    }
    dd.csr().write_csr(rcv_array_offset(index), 0)?;
    if index & 3 == 3 {
        dd.device().flush_wc();
    }
    Ok(())
}

/// `trdma_pset_order`: size code of a page set of `count` pages.
pub fn trdma_pset_order(count: u32) -> u32 {
    count.max(1).ilog2() + 1
}

/// Keeps the first MMIO error and goes on, so software bookkeeping always completes.
fn note(first: &mut Result<(), AccessError>, r: Result<(), AccessError>) {
    if let (Ok(()), Err(e)) = (&*first, r) {
        *first = Err(e);
    }
}

/// `kern_program_rcv_group(flow, grp_num, pset_idx)`: programs node `grp_num`'s entries, emits TID entries
/// (pairs as CTRL 3), counts npkts and moves the group between sets. `pmtu` is the QP's path MTU.
pub fn kern_program_rcv_group(
    flow: &mut TidRdmaFlow,
    grp_num: usize,
    pset_idx: &mut usize,
    rcd: &mut ExpLocked<'_>,
    pmtu: u32,
) -> Result<(), AccessError> {
    let dd = rcd.rcd.dd.clone();
    let expected_base = rcd.rcd.expected_base;
    let Some(node) = flow.tnode.get(grp_num).copied() else { return Ok(()) };
    let Some(grp) = rcd.groups.get(node.grp).copied() else { return Ok(()) };
    let pmtu_pg = (pmtu >> 12).max(1);
    let mut first = Ok(());
    let (mut npages, mut pair, mut cnt) = (0u32, false, 0u8);
    for i in 0..grp.size {
        let rcventry = grp.base + u32::from(i);
        if node.map & (1 << i) != 0 || cnt >= node.cnt {
            note(&mut first, rcv_array_wc_fill(&dd, rcventry));
            continue;
        }
        let Some(pset) = flow.pagesets.get(*pset_idx).copied() else { break };
        *pset_idx += 1;
        let count = u32::from(pset.count);
        if count > 0 {
            note(&mut first, hfi1_put_tid(&dd, rcventry, PtType::PT_EXPECTED, pset.addr, trdma_pset_order(count)));
        } else {
            note(&mut first, hfi1_put_tid(&dd, rcventry, PtType::PT_INVALID, 0, 0));
        }
        npages += count;
        let rel = rcventry - expected_base;
        let mut tidctrl = if pair {
            3
        } else if rel & 1 != 0 {
            2
        } else {
            1
        };
        // A pair needs: an even slot, this and the next entry free, and two more entries wanted.
        pair = i & 1 == 0 && (node.map >> i) & 3 == 0 && node.cnt >= cnt + 2;
        if !pair {
            if count == 0 {
                tidctrl = 1;
            }
            flow.tid_entry.push(exp_tid_entry(rel >> 1, tidctrl, npages));
            flow.tidcnt = flow.tid_entry.len() as u8;
            flow.npkts += (npages + pmtu_pg - 1) >> pmtu_pg.ilog2();
            npages = 0;
        }
        let used = rcd.groups.get(node.grp).map_or(0, |g| g.used);
        if used == grp.size - 1 {
            tid_group_move(rcd, node.grp, TidSetId::Used, TidSetId::Full);
        } else if used == 0 {
            tid_group_move(rcd, node.grp, TidSetId::Group, TidSetId::Used);
        }
        if let Some(g) = rcd.groups.get_mut(node.grp) {
            g.used += 1;
            g.map |= 1 << i;
        }
        cnt += 1;
    }
    first
}

/// `kern_unprogram_rcv_group(flow, grp_num)`: invalidates what node `grp_num` programmed and moves the
/// group back towards the free set.
pub fn kern_unprogram_rcv_group(
    flow: &TidRdmaFlow,
    grp_num: usize,
    rcd: &mut ExpLocked<'_>,
) -> Result<(), AccessError> {
    let dd = rcd.rcd.dd.clone();
    let Some(node) = flow.tnode.get(grp_num).copied() else { return Ok(()) };
    let Some(grp) = rcd.groups.get(node.grp).copied() else { return Ok(()) };
    let mut first = Ok(());
    let mut cnt = 0u8;
    for i in 0..grp.size {
        let rcventry = grp.base + u32::from(i);
        if node.map & (1 << i) != 0 || cnt >= node.cnt {
            note(&mut first, rcv_array_wc_fill(&dd, rcventry));
            continue;
        }
        note(&mut first, hfi1_put_tid(&dd, rcventry, PtType::PT_INVALID, 0, 0));
        let used = match rcd.groups.get_mut(node.grp) {
            Some(g) => {
                g.used = g.used.saturating_sub(1);
                g.map &= !(1 << i);
                g.used
            }
            None => 0,
        };
        cnt += 1;
        if used == grp.size - 1 {
            tid_group_move(rcd, node.grp, TidSetId::Full, TidSetId::Used);
        } else if used == 0 {
            tid_group_move(rcd, node.grp, TidSetId::Used, TidSetId::Group);
        }
    }
    if cnt & 1 != 0 {
        tracing::warn!(grp = node.grp, cnt, "unexpected odd free cnt");
    }
    first
}

/// `kern_program_rcvarray(flow)`: programs every node; resets npkts and the TID entry list first.
pub fn kern_program_rcvarray(flow: &mut TidRdmaFlow, rcd: &mut ExpLocked<'_>, pmtu: u32) -> Result<(), AccessError> {
    flow.npkts = 0;
    flow.tidcnt = 0;
    flow.tid_entry.clear();
    let mut pset_idx = 0usize;
    let mut first = Ok(());
    for i in 0..flow.tnode.len() {
        note(&mut first, kern_program_rcv_group(flow, i, &mut pset_idx, rcd, pmtu));
    }
    first
}

/// `kern_unprogram_rcvarray(flow)`: unprograms every node and forgets them.
pub fn kern_unprogram_rcvarray(flow: &mut TidRdmaFlow, rcd: &mut ExpLocked<'_>) -> Result<(), AccessError> {
    let mut first = Ok(());
    for i in 0..flow.tnode.len() {
        note(&mut first, kern_unprogram_rcv_group(flow, i, rcd));
    }
    flow.tnode.clear();
    flow.tnode_cnt = 0;
    first
}
