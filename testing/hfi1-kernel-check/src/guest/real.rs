//! The real user context: `/dev/hfi1_N` ioctls, the mapped UREGS page, anonymous memory and
//! `/proc/self/pagemap`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{ContextFacts, GuestError, GuestMemory, Result, TidUpdate, UserContext};
use crate::abi::{tid_flow_offset, Hfi1UserInfo, MmapToken, MmapType, HFI1_USER_SWVERSION, PAGE_SIZE};
use crate::errno::io_error_name;
use crate::proto::BufferKind;
use crate::sys::{Hfi1Dev, Mapping, Uregs};

const PAGE: usize = PAGE_SIZE as usize;
/// pagemap entry: PFN in bits 54:0, "present" in bit 63 (Documentation/admin-guide/mm/pagemap.rst).
const PAGEMAP_PFN_MASK: u64 = (1 << 55) - 1;
const PAGEMAP_PRESENT: u64 = 1 << 63;

pub struct RealContext {
    dev: Hfi1Dev,
    uregs: Uregs,
    facts: ContextFacts,
    /// The driver's HFI1_IOCTL_GET_VERS answer.
    pub driver_version: Option<i32>,
    /// Whether the last huge mapping got its MADV_HUGEPAGE advice taken.
    pub huge_advised: Option<bool>,
}

impl RealContext {
    /// Opens `path`, assigns a context of its own (no subcontexts), reads CTXT_INFO and USER_INFO and maps
    /// the UREGS page with the token USER_INFO gave.
    pub fn open(path: &Path, uuid: [u8; 16]) -> Result<Self> {
        let dev = Hfi1Dev::open(path)?;
        let driver_version = dev.get_vers().ok();
        dev.assign_ctxt(&Hfi1UserInfo { userversion: HFI1_USER_SWVERSION, uuid, ..Default::default() })?;
        let info = dev.ctxt_info()?;
        let base = dev.user_info()?;
        let token = MmapToken::decode(base.user_regbase)
            .filter(|t| t.kind == Some(MmapType::Uregs) && t.ctxt == info.ctxt && t.subctxt == info.subctxt)
            .ok_or_else(|| {
                GuestError::Setup(format!(
                    "USER_INFO user_regbase {:#x} is not a UREGS token of context {}:{}",
                    base.user_regbase, info.ctxt, info.subctxt
                ))
            })?;
        if token.offset != 0 {
            return Err(GuestError::Setup(format!("UREGS token has page offset {:#x}", token.offset)));
        }
        let uregs = dev.map_uregs(base.user_regbase)?;
        Ok(Self { dev, uregs, facts: ContextFacts { info, base }, driver_version, huge_advised: None })
    }
}

impl GuestMemory for Mapping {
    fn vaddr(&self) -> u64 {
        Mapping::vaddr(self)
    }
    fn size(&self) -> usize {
        Mapping::len(self)
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        Ok(Mapping::read(self, offset, out)?)
    }
    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        Ok(Mapping::write(self, offset, data)?)
    }
}

impl UserContext for RealContext {
    type Mem = Mapping;

    fn facts(&self) -> ContextFacts {
        self.facts
    }

    fn write_flow(&mut self, flow: u32, value: u64) -> Result<u64> {
        let offset = tid_flow_offset(flow);
        self.uregs.write64(offset, value)?;
        Ok(self.uregs.read64(offset)?)
    }

    fn map(&mut self, kind: BufferKind, pages: usize) -> Result<Mapping> {
        let buffer_pages = pages.saturating_sub(1);
        Ok(match kind {
            BufferKind::Separate | BufferKind::Carved => Mapping::anonymous(pages * PAGE)?,
            BufferKind::Scattered => Mapping::scattered(buffer_pages, 1)?,
            BufferKind::Huge => {
                let (m, advised) = Mapping::huge(buffer_pages * PAGE, 1)?;
                self.huge_advised = Some(advised);
                m
            }
        })
    }

    fn tid_update(&mut self, mem: &Mapping, offset: usize, len: usize) -> Result<TidUpdate> {
        let mut tidlist = vec![0u32; len.div_ceil(PAGE)];
        let (tidcnt, length) = self.dev.tid_update(mem, offset, len, &mut tidlist)?;
        tidlist.truncate(tidcnt as usize);
        Ok(TidUpdate { tidlist, length })
    }

    fn tid_free(&mut self, tidlist: &[u32]) -> Result<u32> {
        Ok(self.dev.tid_free(tidlist)?)
    }

    fn pfns(&self, mem: &Mapping, offset: usize, pages: usize) -> Result<Vec<u64>> {
        read_pfns(mem.vaddr() + offset as u64, pages)
    }
}

/// The PFNs of `pages` pages from `vaddr`, or an empty list when pagemap hides them (no CAP_SYS_ADMIN) or a
/// page is not present.
pub fn read_pfns(vaddr: u64, pages: usize) -> Result<Vec<u64>> {
    let pagemap = File::open("/proc/self/pagemap")
        .map_err(|e| GuestError::Setup(format!("open /proc/self/pagemap: {}", io_error_name(&e))))?;
    let mut raw = vec![0u8; pages * 8];
    pagemap
        .read_exact_at(&mut raw, vaddr / PAGE_SIZE * 8)
        .map_err(|e| GuestError::Setup(format!("read /proc/self/pagemap: {}", io_error_name(&e))))?;
    let mut pfns = Vec::with_capacity(pages);
    for e in raw.chunks_exact(8) {
        let e = u64::from_le_bytes(e.try_into().unwrap_or([0; 8]));
        let pfn = e & PAGEMAP_PFN_MASK;
        if e & PAGEMAP_PRESENT == 0 || pfn == 0 {
            return Ok(Vec::new());
        }
        pfns.push(pfn);
    }
    Ok(pfns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pfns_of_touched_pages_are_all_or_nothing() {
        let m = Mapping::anonymous(2 * PAGE).unwrap();
        m.write(0, &[1]).unwrap();
        m.write(PAGE, &[1]).unwrap();
        let pfns = read_pfns(m.vaddr(), 2).unwrap();
        // Unprivileged readers see PFN 0 and get nothing; privileged ones get both pages.
        assert!(pfns.is_empty() || (pfns.len() == 2 && pfns.iter().all(|&p| p != 0)));
        let untouched = Mapping::anonymous(PAGE).unwrap();
        assert!(read_pfns(untouched.vaddr(), 1).unwrap().is_empty());
    }
}
