//! Where the host puts data, computed by both sides from the kernel's tidlist alone: the host to build
//! the packets, the guest to know which bytes must hold data and which the guard.
//!
//! The tidlist covers the buffer in order (find_phys_blocks walks the pages in order and program_rcvarray
//! hands out page sets in that order), so TID k starts at the sum of the earlier TIDs' LEN pages. Each
//! entry gets MTU-sized packets from its start; the last [`ENTRY_GUARD`] bytes of every entry are left
//! unplaced, so a packet that lands one entry off, or runs past its entry, shows in the guard bytes.

use crate::abi::{
    TidInfo, KDETH_OFFSET_MASK, KDETH_OM_LARGE_SHIFT, KDETH_OM_MAX_SIZE, KDETH_OM_SMALL_SHIFT, MAX_EXPECTED_BUFFER,
    OPA_MAX_MTU, PAGE_SIZE,
};

/// Bytes at the end of each entry no packet targets.
pub const ENTRY_GUARD: u64 = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("MTU {0} is not a multiple of 64 in 64..={OPA_MAX_MTU}")]
    BadMtu(u32),
    #[error("tidlist[{index}] = {tidinfo:#x} has CTRL {ctrl} (1 or 2 expected)")]
    BadCtrl { index: usize, tidinfo: u32, ctrl: u32 },
    #[error("tidlist[{index}] = {tidinfo:#x} has LEN {len} pages (a power of two up to 512 expected)")]
    BadLen { index: usize, tidinfo: u32, len: u32 },
}

/// One expected-receive packet for a TID entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedPacket {
    /// Index into the buffer's tidlist.
    pub tid_index: usize,
    /// KDETH TID (the pair index) and TIDCTRL (1 even, 2 odd).
    pub tid: u32,
    pub tidctrl: u32,
    /// KDETH OM: offsets in 64-byte units (entries of at least 128 KiB, as user_sdma.c chooses) or 4-byte.
    pub om: bool,
    /// KDETH OFFSET field, in OM units.
    pub offset: u32,
    pub entry_offset: u64,
    pub buffer_offset: u64,
    pub len: u32,
}

pub fn check_mtu(mtu: u32) -> Result<(), PlanError> {
    if !(64..=OPA_MAX_MTU).contains(&mtu) || !mtu.is_multiple_of(64) {
        return Err(PlanError::BadMtu(mtu));
    }
    Ok(())
}

/// The packets for a buffer whose TID_UPDATE returned `tidlist`.
pub fn plan_buffer(tidlist: &[u32], mtu: u32) -> Result<Vec<PlannedPacket>, PlanError> {
    check_mtu(mtu)?;
    let mut packets = Vec::new();
    let mut page_base = 0u64;
    for (index, &tidinfo) in tidlist.iter().enumerate() {
        let t = TidInfo::decode(tidinfo);
        if !matches!(t.ctrl, 1 | 2) {
            return Err(PlanError::BadCtrl { index, tidinfo, ctrl: t.ctrl });
        }
        let size = u64::from(t.len) * PAGE_SIZE;
        if !t.len.is_power_of_two() || size > MAX_EXPECTED_BUFFER {
            return Err(PlanError::BadLen { index, tidinfo, len: t.len });
        }
        let shift = if size >= KDETH_OM_MAX_SIZE { KDETH_OM_LARGE_SHIFT } else { KDETH_OM_SMALL_SHIFT };
        let end = size - ENTRY_GUARD;
        let mut off = 0;
        while off < end {
            let len = (end - off).min(u64::from(mtu));
            // off < 2 MiB and is a multiple of 64, so the field fits 15 bits in either unit.
            let units = (off >> shift) as u32 & KDETH_OFFSET_MASK;
            packets.push(PlannedPacket {
                tid_index: index,
                tid: t.idx,
                tidctrl: t.ctrl,
                om: shift == KDETH_OM_LARGE_SHIFT,
                offset: units,
                entry_offset: off,
                buffer_offset: page_base + off,
                len: len as u32,
            });
            off += len;
        }
        page_base += size;
    }
    Ok(packets)
}

/// The byte ranges `[start, end)` of the buffer the plan fills, in order.
pub fn placed_ranges(plan: &[PlannedPacket]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for p in plan {
        let (s, e) = (p.buffer_offset, p.buffer_offset + u64::from(p.len));
        match out.last_mut() {
            Some(last) if last.1 == s => last.1 = e,
            _ => out.push((s, e)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::create_tid;

    #[test]
    fn one_page_entry_gets_one_packet_short_of_the_guard() {
        let plan = plan_buffer(&[create_tid(3, 1)], 8192).unwrap();
        assert_eq!(plan.len(), 1);
        let p = plan[0];
        assert_eq!((p.tid, p.tidctrl, p.om, p.offset, p.len), (1, 2, false, 0, 4096 - 64));
    }

    #[test]
    fn entries_follow_each_other_through_the_buffer() {
        // 4 pages at relative entry 0, then 1 page at entry 1, MTU 4096.
        let plan = plan_buffer(&[create_tid(0, 4), create_tid(1, 1)], 4096).unwrap();
        let got: Vec<_> = plan.iter().map(|p| (p.tid_index, p.offset, p.buffer_offset, p.len)).collect();
        // 4-byte units: 4096 bytes = OFFSET 1024.
        assert_eq!(
            got,
            [
                (0, 0, 0, 4096),
                (0, 1024, 4096, 4096),
                (0, 2048, 8192, 4096),
                (0, 3072, 12288, 4032),
                (1, 0, 16384, 4032)
            ]
        );
        assert_eq!(placed_ranges(&plan), [(0, 16320), (16384, 20416)]);
    }

    #[test]
    fn entries_of_128_kib_and_more_use_64_byte_offsets() {
        let plan = plan_buffer(&[create_tid(0, 32), create_tid(2, 16)], 8192).unwrap();
        let large: Vec<_> = plan.iter().filter(|p| p.tid_index == 0).collect();
        assert!(large.iter().all(|p| p.om));
        assert_eq!((large[1].offset, large[1].entry_offset), (8192 / 64, 8192));
        let small: Vec<_> = plan.iter().filter(|p| p.tid_index == 1).collect();
        assert!(small.iter().all(|p| !p.om));
        assert_eq!((small[1].offset, small[1].entry_offset), (8192 / 4, 8192));
        // 2 MiB entry, the largest: its last packet's offset still fits the 15-bit field.
        let last = *plan_buffer(&[create_tid(0, 512)], 10240).unwrap().last().unwrap();
        assert!(last.om && last.offset <= KDETH_OFFSET_MASK);
        assert_eq!(last.entry_offset + u64::from(last.len), MAX_EXPECTED_BUFFER - ENTRY_GUARD);
    }

    #[test]
    fn malformed_tidinfo_and_mtu_are_refused() {
        assert_eq!(
            plan_buffer(&[0x0030_0001], 4096),
            Err(PlanError::BadCtrl { index: 0, tidinfo: 0x0030_0001, ctrl: 3 })
        );
        assert!(matches!(plan_buffer(&[create_tid(0, 3)], 4096), Err(PlanError::BadLen { len: 3, .. })));
        assert!(matches!(plan_buffer(&[create_tid(0, 1024)], 4096), Err(PlanError::BadLen { len: 1024, .. })));
        assert!(matches!(plan_buffer(&[create_tid(0, 0)], 4096), Err(PlanError::BadLen { len: 0, .. })));
        for mtu in [0, 100, 10304] {
            assert_eq!(plan_buffer(&[], mtu), Err(PlanError::BadMtu(mtu)));
        }
    }
}
