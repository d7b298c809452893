//! The host's checks of the device model's RcvArray against what the guest's kernel returned, and against
//! the DMA maps the device model received. Pure functions of parsed state.

use std::collections::BTreeMap;

use serde::Serialize;

use super::dump::{Context, DmaMaps, Dump, DMA_REGION_WRITE};
use crate::abi::{TidInfo, PAGE_SHIFT, PAGE_SIZE};
use crate::proto::BufferReport;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error("buffer {buffer}: tidlist[{pos}] = {tidinfo:#x} has CTRL {ctrl}, which names no single entry")]
    BadCtrl { buffer: u32, pos: usize, tidinfo: u32, ctrl: u32 },
    #[error(
        "buffer {buffer}: tidlist[{pos}] = {tidinfo:#x} names relative entry {rel}, outside the context's {count} \
         expected entries"
    )]
    OutsideContext { buffer: u32, pos: usize, tidinfo: u32, rel: u64, count: u64 },
    #[error("buffer {buffer}: tidlist[{pos}] = {tidinfo:#x} names RcvArray entry {index}, as buffer {other} does")]
    Duplicate { buffer: u32, pos: usize, tidinfo: u32, index: u64, other: u32 },
    #[error("buffer {buffer}: tidlist[{pos}] = {tidinfo:#x}: RcvArray entry {index} is not valid")]
    MissingEntry { buffer: u32, pos: usize, tidinfo: u32, index: u64 },
    #[error("buffer {buffer}: RcvArray entry {index} holds {entry_bytes} bytes, its TID says {tid_bytes}")]
    SizeMismatch { buffer: u32, index: u64, entry_bytes: u64, tid_bytes: u64 },
    #[error("buffer {buffer}: RcvArray entry {index}: IOVA {iova:#x} is in no DMA map")]
    NotDmaMapped { buffer: u32, index: u64, iova: u64 },
    #[error(
        "buffer {buffer}: RcvArray entry {index}: IOVA {iova:#x} is mapped without write permission (flags {flags:#x})"
    )]
    NotWritable { buffer: u32, index: u64, iova: u64, flags: u64 },
    #[error(
        "buffer {buffer}: RcvArray entry {index}: IOVA {iova:#x} maps guest-physical {gpa:#x}, but the buffer's page \
         {page} is at {want:#x}"
    )]
    GpaMismatch { buffer: u32, index: u64, iova: u64, gpa: u64, page: u64, want: u64 },
    #[error("buffer {buffer}: its TIDs cover {tid_pages} pages, but the kernel said it programmed {length} bytes")]
    LengthMismatch { buffer: u32, tid_pages: u64, length: u64 },
    #[error("buffer {buffer}: the guest sent {got} page frame numbers for {pages} pages: entries cannot be matched to pages")]
    NoPfns { buffer: u32, got: usize, pages: u32 },
    #[error(
        "RcvArray entry {index} (addr {addr:#x}) of context {ctxt} is valid, but no TID the kernel returned names it"
    )]
    ExtraEntry { ctxt: u32, index: u64, addr: u64 },
    #[error("RcvArray entry {index} (addr {addr:#x}) of context {ctxt} is still valid after TID_FREE")]
    ValidAfterFree { ctxt: u32, index: u64, addr: u64 },
}

impl CheckError {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::BadCtrl { .. } => "bad_ctrl",
            Self::OutsideContext { .. } => "outside_context",
            Self::Duplicate { .. } => "duplicate",
            Self::MissingEntry { .. } => "missing_entry",
            Self::SizeMismatch { .. } => "size_mismatch",
            Self::NotDmaMapped { .. } => "not_dma_mapped",
            Self::NotWritable { .. } => "not_writable",
            Self::GpaMismatch { .. } => "gpa_mismatch",
            Self::LengthMismatch { .. } => "length_mismatch",
            Self::NoPfns { .. } => "no_pfns",
            Self::ExtraEntry { .. } => "extra_entry",
            Self::ValidAfterFree { .. } => "valid_after_free",
        }
    }

    /// The buffer this error makes unsafe to send data to (its entries may point anywhere).
    fn unsafe_buffer(&self) -> Option<u32> {
        match self {
            Self::NoPfns { .. } | Self::ExtraEntry { .. } | Self::ValidAfterFree { .. } => None,
            Self::BadCtrl { buffer, .. }
            | Self::OutsideContext { buffer, .. }
            | Self::Duplicate { buffer, .. }
            | Self::MissingEntry { buffer, .. }
            | Self::SizeMismatch { buffer, .. }
            | Self::NotDmaMapped { buffer, .. }
            | Self::NotWritable { buffer, .. }
            | Self::GpaMismatch { buffer, .. }
            | Self::LengthMismatch { buffer, .. } => Some(*buffer),
        }
    }
}

/// A failed check as the reports carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Issue {
    pub kind: &'static str,
    pub message: String,
}

impl From<&CheckError> for Issue {
    fn from(e: &CheckError) -> Self {
        Self { kind: e.kind(), message: e.to_string() }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistrationCheck {
    pub errors: Vec<CheckError>,
    pub tids: usize,
    /// Entries valid with the right size and every page DMA-mapped writable (and at the right GPA where
    /// that could be checked).
    pub entries_ok: usize,
    pub pages_gpa_checked: u64,
    /// Pages whose map came without a file (no GPA to compare), or with the GPA check off.
    pub pages_gpa_unchecked: u64,
}

impl RegistrationCheck {
    /// Buffers whose entries all point where the guest's pages are: safe to send data to.
    pub fn injectable(&self, buffers: &[BufferReport]) -> Vec<u32> {
        buffers.iter().map(|b| b.id).filter(|id| !self.errors.iter().any(|e| e.unsafe_buffer() == Some(*id))).collect()
    }
}

/// After TID_UPDATE: every TID names a valid entry of `ctx` of its size, whose pages are DMA-mapped for
/// writing (and, with `gpa_check`, are the buffer's own pages in order); no other entry of `ctx` is valid.
pub fn check_registration(
    ctx: &Context,
    dump: &Dump,
    maps: &DmaMaps,
    buffers: &[BufferReport],
    gpa_check: bool,
) -> RegistrationCheck {
    let mut c = RegistrationCheck::default();
    let mut named: BTreeMap<u64, u32> = BTreeMap::new();
    for b in buffers {
        let pfns_ok = b.pfns.len() == b.pages as usize;
        if gpa_check && !pfns_ok {
            c.errors.push(CheckError::NoPfns { buffer: b.id, got: b.pfns.len(), pages: b.pages });
        }
        let tid_pages: u64 = b.tidlist.iter().map(|&t| u64::from(TidInfo::decode(t).len)).sum();
        if tid_pages * PAGE_SIZE != b.length {
            c.errors.push(CheckError::LengthMismatch { buffer: b.id, tid_pages, length: b.length });
        }
        let mut page = 0u64;
        for (pos, &tidinfo) in b.tidlist.iter().enumerate() {
            c.tids += 1;
            let t = TidInfo::decode(tidinfo);
            let first_page = page;
            page += u64::from(t.len);
            let Some(rel) = t.rcventry().map(u64::from) else {
                c.errors.push(CheckError::BadCtrl { buffer: b.id, pos, tidinfo, ctrl: t.ctrl });
                continue;
            };
            if rel >= ctx.tid_count {
                c.errors.push(CheckError::OutsideContext { buffer: b.id, pos, tidinfo, rel, count: ctx.tid_count });
                continue;
            }
            let index = ctx.tid_base + rel;
            if let Some(other) = named.insert(index, b.id) {
                c.errors.push(CheckError::Duplicate { buffer: b.id, pos, tidinfo, index, other });
                continue;
            }
            let Some(entry) = dump.entries.get(&index) else {
                c.errors.push(CheckError::MissingEntry { buffer: b.id, pos, tidinfo, index });
                continue;
            };
            let tid_bytes = u64::from(t.len) * PAGE_SIZE;
            if entry.buf_size != tid_bytes {
                c.errors.push(CheckError::SizeMismatch { buffer: b.id, index, entry_bytes: entry.buf_size, tid_bytes });
                continue;
            }
            let before = c.errors.len();
            for j in 0..u64::from(t.len) {
                let iova = entry.addr + j * PAGE_SIZE;
                let Some(m) = maps.lookup(iova) else {
                    c.errors.push(CheckError::NotDmaMapped { buffer: b.id, index, iova });
                    break;
                };
                if m.flags & DMA_REGION_WRITE == 0 {
                    c.errors.push(CheckError::NotWritable { buffer: b.id, index, iova, flags: m.flags });
                    break;
                }
                if !(gpa_check && pfns_ok && m.fd) {
                    c.pages_gpa_unchecked += 1;
                    continue;
                }
                let (gpa, want) = (m.offset_of(iova), b.pfns[(first_page + j) as usize] << PAGE_SHIFT);
                if gpa != want {
                    c.errors.push(CheckError::GpaMismatch {
                        buffer: b.id,
                        index,
                        iova,
                        gpa,
                        page: first_page + j,
                        want,
                    });
                    break;
                }
                c.pages_gpa_checked += 1;
            }
            if c.errors.len() == before {
                c.entries_ok += 1;
            }
        }
    }
    for e in dump.context_entries(ctx) {
        if !named.contains_key(&e.index) {
            c.errors.push(CheckError::ExtraEntry { ctxt: ctx.ctxt, index: e.index, addr: e.addr });
        }
    }
    c
}

/// After TID_FREE: no entry of the context's expected range is valid.
pub fn check_freed(ctx: &Context, dump: &Dump) -> Vec<CheckError> {
    dump.context_entries(ctx)
        .map(|e| CheckError::ValidAfterFree { ctxt: ctx.ctxt, index: e.index, addr: e.addr })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::create_tid;
    use crate::host::dump::{DmaMap, Entry};
    use crate::proto::BufferKind;

    const BASE: u64 = 512;
    /// Guest-physical address of buffer page p in the tests: pages sit at 0x4000_0000 + 0x3000·p (never
    /// adjacent), mapped one to one at IOVA 0x10_0000 + 0x1000·(entry page).
    fn gpa(p: u64) -> u64 {
        0x4000_0000 + 0x3000 * p
    }

    fn ctx() -> Context {
        Context { ctxt: 2, csrs: BTreeMap::new(), tid_base: BASE, tid_count: 16, flows: vec![] }
    }

    /// Buffer 0: 3 pages as TIDs at relative entries 0 (2 pages, IOVA 0x100000) and 3 (1 page, 0x200000).
    fn buffer() -> BufferReport {
        BufferReport {
            id: 0,
            kind: BufferKind::Separate,
            pages: 3,
            len: 3 * 4096,
            length: 3 * 4096,
            vaddr: 0x7f00_0000_0000,
            tidlist: vec![create_tid(0, 2), create_tid(3, 1)],
            pfns: (0..3).map(|p| gpa(p) >> 12).collect(),
        }
    }

    fn state() -> (Dump, Vec<DmaMap>) {
        let entries = [(BASE, 0x10_0000, 8192), (BASE + 3, 0x20_0000, 4096)]
            .into_iter()
            .map(|(index, addr, buf_size)| (index, Entry { index, addr, buf_size }))
            .collect();
        let dump = Dump { global: BTreeMap::new(), contexts: vec![ctx()], entries, counters: BTreeMap::new() };
        let map = |iova: u64, offset: u64| DmaMap { iova, size: 4096, fd: true, offset, flags: 3 };
        (dump, vec![map(0x10_0000, gpa(0)), map(0x10_1000, gpa(1)), map(0x20_0000, gpa(2))])
    }

    fn kinds(c: &RegistrationCheck) -> Vec<&'static str> {
        c.errors.iter().map(CheckError::kind).collect()
    }

    #[test]
    fn entries_matching_the_tidlist_and_the_guests_pages_pass() {
        let (dump, maps) = state();
        let c = check_registration(&ctx(), &dump, &DmaMaps::from_maps(maps), &[buffer()], true);
        assert_eq!(c.errors, []);
        assert_eq!((c.tids, c.entries_ok, c.pages_gpa_checked, c.pages_gpa_unchecked), (2, 2, 3, 0));
        assert_eq!(c.injectable(&[buffer()]), [0]);
    }

    #[test]
    fn each_mismatch_between_device_and_kernel_is_its_own_error() {
        type Case = (&'static str, fn(&mut Dump, &mut Vec<DmaMap>, &mut BufferReport), &'static [&'static str]);
        let table: [Case; 11] = [
            (
                "entry missing",
                |d, _, _| {
                    d.entries.remove(&(BASE + 3));
                },
                &["missing_entry"],
            ),
            (
                "entry not reported",
                |d, _, _| {
                    d.entries.insert(BASE + 9, Entry { index: BASE + 9, addr: 0x30_0000, buf_size: 4096 });
                },
                &["extra_entry"],
            ),
            ("wrong size", |d, _, _| d.entries.get_mut(&BASE).unwrap().buf_size = 4096, &["size_mismatch"]),
            (
                "page not mapped",
                |_, m, _| {
                    m.remove(1);
                },
                &["not_dma_mapped"],
            ),
            ("read-only map", |_, m, _| m[2].flags = 1, &["not_writable"]),
            ("another page", |_, m, _| m[1].offset = gpa(7), &["gpa_mismatch"]),
            ("pages swapped", |_, _, b| b.pfns.swap(0, 1), &["gpa_mismatch"]),
            ("beyond the context", |_, _, b| b.tidlist[1] = create_tid(16, 1), &["outside_context", "extra_entry"]),
            ("CTRL 3", |_, _, b| b.tidlist[1] |= 3 << 20, &["bad_ctrl", "extra_entry"]),
            ("short length", |_, _, b| b.length = 2 * 4096, &["length_mismatch"]),
            ("no PFNs", |_, _, b| b.pfns.clear(), &["no_pfns"]),
        ];
        for (why, mutate, want) in table {
            let (mut dump, mut maps) = state();
            let mut b = buffer();
            mutate(&mut dump, &mut maps, &mut b);
            let c = check_registration(&ctx(), &dump, &DmaMaps::from_maps(maps), &[b.clone()], true);
            assert_eq!(kinds(&c), want, "{why}: {:?}", c.errors);
            let safe = !["no_pfns", "extra_entry"].contains(&want[0]);
            assert_eq!(c.injectable(&[b]).is_empty(), safe, "{why}");
        }
    }

    #[test]
    fn two_buffers_naming_one_entry_is_a_duplicate() {
        let (dump, maps) = state();
        let mut other = buffer();
        other.id = 1;
        let c = check_registration(&ctx(), &dump, &DmaMaps::from_maps(maps), &[buffer(), other], true);
        assert_eq!(kinds(&c), ["duplicate", "duplicate"]);
    }

    #[test]
    fn maps_without_a_file_are_checked_for_coverage_only() {
        let (dump, mut maps) = state();
        maps.iter_mut().for_each(|m| m.fd = false);
        let c = check_registration(&ctx(), &dump, &DmaMaps::from_maps(maps.clone()), &[buffer()], true);
        assert_eq!((c.errors.len(), c.pages_gpa_checked, c.pages_gpa_unchecked), (0, 0, 3));
        let c = check_registration(&ctx(), &dump, &DmaMaps::from_maps(maps), &[buffer()], false);
        assert_eq!((c.errors.len(), c.pages_gpa_unchecked), (0, 3));
    }

    #[test]
    fn entries_left_valid_after_free_are_reported_and_others_contexts_are_not() {
        let (mut dump, _) = state();
        dump.entries.insert(100, Entry { index: 100, addr: 0x1000, buf_size: 4096 });
        let left = check_freed(&ctx(), &dump);
        assert_eq!(left.iter().map(CheckError::kind).collect::<Vec<_>>(), ["valid_after_free", "valid_after_free"]);
        dump.entries.retain(|i, _| *i == 100);
        assert_eq!(check_freed(&ctx(), &dump), []);
    }
}
