//! The only `unsafe` of the crate: the ioctls of `/dev/hfi1_N`, anonymous memory the device may write
//! (plain, scattered, huge-page aligned), and the mapped UREGS page.
//!
//! Each type owns its mapping, checks bounds before every access and never hands out a Rust reference
//! into memory a device can write: reads and writes are volatile copies.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::ptr::NonNull;

use rustix::fs::{open, Mode, OFlags};
use rustix::mm::{madvise, mmap, mmap_anonymous, mremap_fixed, munmap, Advice, MapFlags, MremapFlags, ProtFlags};

use crate::abi::{
    Hfi1BaseInfo, Hfi1CtxtInfo, Hfi1TidInfo, Hfi1UserInfo, HFI1_IOCTL_ASSIGN_CTXT, HFI1_IOCTL_CTXT_INFO,
    HFI1_IOCTL_GET_VERS, HFI1_IOCTL_TID_FREE, HFI1_IOCTL_TID_UPDATE, HFI1_IOCTL_USER_INFO, PAGE_SIZE, UREGS_SIZE,
};
use crate::errno::errno_name;

const PAGE: usize = PAGE_SIZE as usize;
/// A transparent huge page on x86-64.
pub const HUGE_PAGE: usize = 2 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SysError {
    #[error("open {path}: {errno}")]
    Open { path: String, errno: String },
    #[error("{name}: {errno}")]
    Ioctl { name: &'static str, errno: String, raw: i32 },
    #[error("{op}: {errno}")]
    Mm { op: &'static str, errno: String },
    #[error("{0}")]
    Bounds(String),
}

impl SysError {
    /// The errno of a failed ioctl.
    pub fn ioctl_errno(&self) -> Option<i32> {
        match self {
            Self::Ioctl { raw, .. } => Some(*raw),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, SysError>;

fn mm_err(op: &'static str, e: rustix::io::Errno) -> SysError {
    SysError::Mm { op, errno: errno_name(e.raw_os_error()) }
}

/// An open `/dev/hfi1_N`.
pub struct Hfi1Dev {
    fd: OwnedFd,
}

impl Hfi1Dev {
    pub fn open(path: &Path) -> Result<Self> {
        let fd = open(path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| SysError::Open { path: path.display().to_string(), errno: errno_name(e.raw_os_error()) })?;
        Ok(Self { fd })
    }

    /// One ioctl on a `T` whose size the request number encodes.
    fn ioctl<T>(&self, name: &'static str, request: u32, arg: &mut T) -> Result<()> {
        debug_assert_eq!(((request >> 16) & 0x3fff) as usize, size_of::<T>(), "{name}");
        // SAFETY: `arg` is a live, exclusively borrowed `T` of exactly the size the request encodes (the
        // ABI tests pin each number to its struct), so the kernel reads and writes only inside it.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), request as libc::Ioctl, std::ptr::from_mut(arg)) };
        if rc < 0 {
            let raw = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(SysError::Ioctl { name, errno: errno_name(raw), raw });
        }
        Ok(())
    }

    pub fn get_vers(&self) -> Result<i32> {
        let mut v = 0i32;
        self.ioctl("HFI1_IOCTL_GET_VERS", HFI1_IOCTL_GET_VERS, &mut v)?;
        Ok(v)
    }

    pub fn assign_ctxt(&self, info: &Hfi1UserInfo) -> Result<()> {
        let mut i = *info;
        self.ioctl("HFI1_IOCTL_ASSIGN_CTXT", HFI1_IOCTL_ASSIGN_CTXT, &mut i)
    }

    pub fn ctxt_info(&self) -> Result<Hfi1CtxtInfo> {
        let mut i = Hfi1CtxtInfo::default();
        self.ioctl("HFI1_IOCTL_CTXT_INFO", HFI1_IOCTL_CTXT_INFO, &mut i)?;
        Ok(i)
    }

    pub fn user_info(&self) -> Result<Hfi1BaseInfo> {
        let mut i = Hfi1BaseInfo::default();
        self.ioctl("HFI1_IOCTL_USER_INFO", HFI1_IOCTL_USER_INFO, &mut i)?;
        Ok(i)
    }

    /// TID_UPDATE of `[offset, offset + len)` of `mem`. Returns (tidcnt, length): the first `tidcnt`
    /// entries of `tidlist` are the kernel's tidinfo words. `tidlist` must hold one entry per page, the
    /// most the kernel writes (one page set per page).
    pub fn tid_update(&self, mem: &Mapping, offset: usize, len: usize, tidlist: &mut [u32]) -> Result<(u32, u32)> {
        mem.check(offset, len)?;
        let pages = len.div_ceil(PAGE);
        let len32 = u32::try_from(len).map_err(|_| SysError::Bounds(format!("TID_UPDATE of {len} bytes")))?;
        if !offset.is_multiple_of(PAGE) || tidlist.len() < pages {
            return Err(SysError::Bounds(format!(
                "TID_UPDATE needs a page-aligned buffer and a tidlist of {pages} entries (offset {offset:#x}, \
                 tidlist {})",
                tidlist.len()
            )));
        }
        let mut t = Hfi1TidInfo {
            vaddr: mem.vaddr() + offset as u64,
            tidlist: tidlist.as_mut_ptr() as u64,
            tidcnt: 0,
            length: len32,
        };
        // The kernel writes at most one tidinfo per pinned page into `tidlist` (checked to hold `pages`).
        self.ioctl("HFI1_IOCTL_TID_UPDATE", HFI1_IOCTL_TID_UPDATE, &mut t)?;
        if t.tidcnt as usize > pages {
            return Err(SysError::Bounds(format!("TID_UPDATE returned tidcnt {} for {pages} pages", t.tidcnt)));
        }
        Ok((t.tidcnt, t.length))
    }

    /// TID_FREE of `tidlist`; returns how many the kernel released.
    pub fn tid_free(&self, tidlist: &[u32]) -> Result<u32> {
        let tidcnt = u32::try_from(tidlist.len()).map_err(|_| SysError::Bounds("TID_FREE list too long".into()))?;
        // The kernel only reads `tidcnt` entries of the list (memdup_array_user).
        let mut t = Hfi1TidInfo { vaddr: 0, tidlist: tidlist.as_ptr() as u64, tidcnt, length: 0 };
        self.ioctl("HFI1_IOCTL_TID_FREE", HFI1_IOCTL_TID_FREE, &mut t)?;
        Ok(t.tidcnt)
    }

    /// Maps the context's user register page with the USER_INFO `user_regbase` token.
    pub fn map_uregs(&self, token: u64) -> Result<Uregs> {
        // SAFETY: a new shared mapping at an address the kernel picks, so it aliases nothing; it is device
        // memory, accessed only by Uregs' volatile, bounds-checked loads and stores, unmapped once in Drop.
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                UREGS_SIZE,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &self.fd,
                token,
            )
        }
        .map_err(|e| mm_err("mmap UREGS", e))?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| SysError::Bounds("mmap UREGS gave NULL".into()))?;
        Ok(Uregs { ptr })
    }
}

impl AsFd for Hfi1Dev {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The mapped UREGS page: 64-bit registers at 8-byte aligned offsets below 4 KiB.
pub struct Uregs {
    ptr: NonNull<u8>,
}

impl Uregs {
    fn at(&self, offset: u64) -> Result<*mut u64> {
        if !offset.is_multiple_of(8) || offset + 8 > UREGS_SIZE as u64 {
            return Err(SysError::Bounds(format!("UREGS offset {offset:#x}")));
        }
        // SAFETY: offset + 8 <= UREGS_SIZE (checked), so the pointer stays inside the mapping.
        Ok(unsafe { self.ptr.as_ptr().add(offset as usize) }.cast::<u64>())
    }

    pub fn read64(&self, offset: u64) -> Result<u64> {
        let p = self.at(offset)?;
        // SAFETY: in bounds and 8-byte aligned (the mapping is page-aligned); one 64-bit MMIO load.
        Ok(u64::from_le(unsafe { p.read_volatile() }))
    }

    pub fn write64(&self, offset: u64, value: u64) -> Result<()> {
        let p = self.at(offset)?;
        // SAFETY: in bounds and 8-byte aligned; one 64-bit MMIO store (the chip takes writeq only).
        unsafe { p.write_volatile(value.to_le()) };
        Ok(())
    }
}

impl Drop for Uregs {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the page mapped in map_uregs, once.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), UREGS_SIZE) };
    }
}

/// Private anonymous memory the program registers with TID_UPDATE: `[start, start + len)` of a mapping of
/// `total` bytes at `base`.
pub struct Mapping {
    base: NonNull<u8>,
    total: usize,
    start: usize,
    len: usize,
}

fn anon(len: usize, what: &'static str) -> Result<NonNull<u8>> {
    // SAFETY: a new private anonymous mapping at an address the kernel picks: it aliases nothing.
    let p = unsafe { mmap_anonymous(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::PRIVATE) }
        .map_err(|e| mm_err(what, e))?;
    NonNull::new(p.cast::<u8>()).ok_or_else(|| SysError::Bounds(format!("{what} gave NULL")))
}

/// Slot i of a scattered buffer takes the page faulted in `i`-th place of this order: all even pages, then
/// all odd ones, so neighbouring slots never hold pages faulted one after the other.
pub fn interleaved(pages: usize) -> Vec<usize> {
    (0..pages).step_by(2).chain((1..pages).step_by(2)).collect()
}

impl Mapping {
    /// `len` bytes (rounded up to pages) of fresh memory; nothing is faulted in yet.
    pub fn anonymous(len: usize) -> Result<Self> {
        let total = len.div_ceil(PAGE).max(1) * PAGE;
        Ok(Self { base: anon(total, "mmap")?, total, start: 0, len: total })
    }

    /// `pages` pages faulted in one order and moved into place interleaved (see [`interleaved`]), then
    /// `extra` untouched pages.
    pub fn scattered(pages: usize, extra: usize) -> Result<Self> {
        let target = Self::anonymous((pages + extra) * PAGE)?;
        let pool = Self::anonymous(pages * PAGE)?;
        for p in 0..pages {
            pool.write(p * PAGE, &[0])?;
        }
        // From here the pool's range empties page by page, and a freed page may be handed to another mapping:
        // the pool must never be unmapped as a whole again, only what is still its own.
        let pool = std::mem::ManuallyDrop::new(pool);
        let order = interleaved(pages);
        for (slot, &src) in order.iter().enumerate() {
            // SAFETY: both ranges are whole pages inside mappings this function owns (pool page `src` is
            // moved exactly once, to slot `slot` of `target`, replacing an untouched page there).
            let moved = unsafe {
                mremap_fixed(
                    pool.base.as_ptr().add(src * PAGE).cast(),
                    PAGE,
                    PAGE,
                    MremapFlags::MAYMOVE,
                    target.base.as_ptr().add(slot * PAGE).cast(),
                )
            };
            if let Err(e) = moved {
                for &left in &order[slot..] {
                    // SAFETY: pool pages not moved yet (this one failed, the rest were not tried) are still
                    // mapped and still ours.
                    let _ = unsafe { munmap(pool.base.as_ptr().add(left * PAGE).cast(), PAGE) };
                }
                return Err(mm_err("mremap a page into the scattered buffer", e));
            }
        }
        Ok(target)
    }

    /// `len` bytes starting on a 2 MiB boundary, advised MADV_HUGEPAGE, then `extra` pages. Returns whether
    /// the advice was taken (the kernel may still fall back to small pages).
    pub fn huge(len: usize, extra: usize) -> Result<(Self, bool)> {
        let len = len.div_ceil(PAGE) * PAGE;
        let total = len + extra * PAGE + HUGE_PAGE;
        let base = anon(total, "mmap (huge-page window)")?;
        let start = (base.as_ptr() as usize).next_multiple_of(HUGE_PAGE) - base.as_ptr() as usize;
        let map = Self { base, total, start, len: len + extra * PAGE };
        // SAFETY: the advised range lies inside the mapping just created; advice changes no contents.
        let advised = unsafe { madvise(base.as_ptr().add(start).cast(), len, Advice::LinuxHugepage) }.is_ok();
        Ok((map, advised))
    }

    pub fn vaddr(&self) -> u64 {
        self.base.as_ptr() as u64 + self.start as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(SysError::Bounds(format!("[{offset:#x}, +{len:#x}) outside a mapping of {:#x}", self.len)));
        }
        Ok(())
    }

    fn ptr(&self, offset: usize) -> *mut u8 {
        // SAFETY: callers checked offset <= len, and start + len <= total, so this stays in the mapping.
        unsafe { self.base.as_ptr().add(self.start + offset) }
    }

    /// Copies `out.len()` bytes from `offset` with volatile loads (8 bytes at a time where aligned).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        let mut i = 0;
        while i < out.len() {
            let p = self.ptr(offset + i);
            if (p as usize).is_multiple_of(8) && out.len() - i >= 8 {
                // SAFETY: 8 bytes inside the checked range, 8-byte aligned.
                let w = unsafe { p.cast::<u64>().read_volatile() };
                out[i..i + 8].copy_from_slice(&w.to_ne_bytes());
                i += 8;
            } else {
                // SAFETY: one byte inside the checked range.
                out[i] = unsafe { p.read_volatile() };
                i += 1;
            }
        }
        Ok(())
    }

    /// Copies `data` to `offset` with volatile stores.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        for (i, b) in data.iter().enumerate() {
            // SAFETY: one byte inside the checked range.
            unsafe { self.ptr(offset + i).write_volatile(*b) };
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created for this value, once.
        let _ = unsafe { munmap(self.base.as_ptr().cast(), self.total) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_access_is_bounds_checked() {
        let m = Mapping::anonymous(3 * PAGE).unwrap();
        m.write(PAGE - 3, &[1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
        let mut b = [0u8; 11];
        m.read(PAGE - 4, &mut b).unwrap();
        assert_eq!(b, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0]);
        assert!(matches!(m.read(3 * PAGE - 1, &mut [0; 2]), Err(SysError::Bounds(_))));
        assert!(matches!(m.write(usize::MAX, &[0]), Err(SysError::Bounds(_))));
    }

    #[test]
    fn scattered_pages_land_in_interleaved_slots_with_their_contents() {
        assert_eq!(interleaved(5), [0, 2, 4, 1, 3]);
        let m = Mapping::scattered(6, 1).unwrap();
        assert_eq!(m.len(), 7 * PAGE);
        // The pool's pages were zero-filled and moved: every slot reads zeros and takes writes.
        for slot in 0..7 {
            m.write(slot * PAGE + 10, &[slot as u8 + 1]).unwrap();
        }
        let mut b = [0u8; 1];
        for slot in 0..7 {
            m.read(slot * PAGE + 10, &mut b).unwrap();
            assert_eq!(b[0], slot as u8 + 1);
        }
    }

    #[test]
    fn huge_window_starts_on_a_2_mib_boundary() {
        let (m, _advised) = Mapping::huge(HUGE_PAGE, 1).unwrap();
        assert_eq!(m.vaddr() % HUGE_PAGE as u64, 0);
        assert_eq!(m.len(), HUGE_PAGE + PAGE);
        m.write(HUGE_PAGE + PAGE - 1, &[7]).unwrap();
    }

    #[test]
    fn opening_a_missing_device_names_the_errno() {
        let e = Hfi1Dev::open(Path::new("/nonexistent/hfi1_0")).err().unwrap();
        assert_eq!(e, SysError::Open { path: "/nonexistent/hfi1_0".into(), errno: "ENOENT".into() });
    }

    #[test]
    fn ioctls_on_a_file_that_is_not_hfi1_report_their_errno() {
        let dev = Hfi1Dev { fd: std::fs::File::open("/dev/null").unwrap().into() };
        let e = dev.ctxt_info().unwrap_err();
        assert_eq!(e.ioctl_errno(), Some(libc::ENOTTY));
        assert_eq!(e.to_string(), "HFI1_IOCTL_CTXT_INFO: ENOTTY");
    }
}
