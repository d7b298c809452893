//! The server's view of one client's memory: the DMA_MAP table plus the two ways to reach it.
//!
//! - A mapping with an fd sealed against shrinking (F_SEAL_SHRINK) is served from an mmap of the whole
//!   file through vm-memory. Each distinct file (st_dev, st_ino) is mapped once, and every DMA_MAP of it
//!   translates IOVA to a file offset, so QEMU's one-map-per-4-KiB-page costs no mmap per page.
//! - Any other mapping (no fd, or an unsealed fd that could shrink under us and fault the server) is
//!   served by DMA_READ/DMA_WRITE messages to the client.
//!
//! Accesses are split at mapping boundaries and fully checked before any byte moves.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};

use rustix::fs::{fcntl_get_seals, fcntl_getfl, fstat, FileType, OFlags, SealFlags};
use thiserror::Error;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryRegion, GuestRegionMmap, MemoryRegionAddress, MmapRegion};

use crate::dma::{bounce_copy, DmaAccess, DmaError, DmaRegion};
use crate::sync::Unpoison;
use crate::wire::{dma_map_flags, PAGE_SIZE};

/// The message path for mappings that are not mmapped (DMA_READ/DMA_WRITE to the client).
pub trait MessageDma: Send + Sync {
    fn dma_read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError>;
    fn dma_write(&self, iova: u64, data: &[u8]) -> Result<(), DmaError>;
}

/// Why a DMA_MAP or DMA_UNMAP was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MapError {
    #[error("mapping overlaps an existing one")]
    Exists,
    #[error("invalid mapping: {0}")]
    Invalid(&'static str),
    #[error("too many mappings (limit {0})")]
    TooMany(u32),
    #[error("fd does not allow the requested access")]
    Access,
    #[error("mapping the file failed: {0}")]
    Mmap(String),
    #[error("client disconnected")]
    Closed,
}

impl MapError {
    /// The errno sent in the error reply.
    pub fn errno(&self) -> i32 {
        match self {
            MapError::Exists => libc::EEXIST,
            MapError::Invalid(_) => libc::EINVAL,
            MapError::TooMany(_) => libc::ENOSPC,
            MapError::Access => libc::EACCES,
            MapError::Mmap(_) => libc::ENOMEM,
            MapError::Closed => libc::ENODEV,
        }
    }
}

/// One mmap of a whole file, shared by every mapping of that file.
struct FileMap {
    region: GuestRegionMmap<()>,
    /// (st_dev, st_ino): two maps of one file (an older one of a file that grew) alias the same bytes.
    key: (u64, u64),
    size: u64,
    writable: bool,
    budget: Arc<Budget>,
}

impl Drop for FileMap {
    fn drop(&mut self) {
        self.budget.files.fetch_sub(1, Ordering::AcqRel);
        self.budget.bytes.fetch_sub(self.size, Ordering::AcqRel);
    }
}

/// Live mmaps of one space. Each keeps its file open and address space in use, so a client must not
/// be able to make us hold an unbounded number; beyond the limits maps fall back to messages.
#[derive(Default)]
struct Budget {
    files: AtomicU64,
    bytes: AtomicU64,
}

/// Limits on what one DMA space keeps mmapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmapLimits {
    /// Distinct files mmapped at once (each holds one descriptor).
    pub max_files: u32,
    /// Total bytes mmapped at once (address space).
    pub max_bytes: u64,
}

impl Default for MmapLimits {
    fn default() -> Self {
        MmapLimits { max_files: 64, max_bytes: 1 << 40 }
    }
}

#[derive(Clone)]
enum Backing {
    File { map: Arc<FileMap>, offset: u64 },
    Message,
}

struct Mapping {
    /// Inclusive, so a mapping may end at 2^64 without overflow.
    last: u64,
    flags: u32,
    backing: Backing,
}

#[derive(Default)]
struct Inner {
    /// Keyed by first IOVA; non-overlapping.
    maps: BTreeMap<u64, Mapping>,
    files: HashMap<(u64, u64), Weak<FileMap>>,
    budget: Arc<Budget>,
    limits: MmapLimits,
}

/// One piece of an access: `len` bytes at `iova`, all inside one mapping.
struct Piece {
    iova: u64,
    len: usize,
    backing: Backing,
}

/// The pieces of one access. Almost every access lies inside one DMA_MAP: that piece is kept inline, so the
/// per-packet accesses of a device allocate nothing.
enum Pieces {
    One(Piece),
    Many(Vec<Piece>),
}

impl Pieces {
    fn push(self, p: Piece) -> Self {
        match self {
            Pieces::Many(v) if v.is_empty() => Pieces::One(p),
            Pieces::One(first) => Pieces::Many(vec![first, p]),
            Pieces::Many(mut v) => {
                v.push(p);
                Pieces::Many(v)
            }
        }
    }
}

impl std::ops::Deref for Pieces {
    type Target = [Piece];
    fn deref(&self) -> &[Piece] {
        match self {
            Pieces::One(p) => std::slice::from_ref(p),
            Pieces::Many(v) => v,
        }
    }
}

/// A connection's DMA space. Given to the device as its `DmaAccess`; after `close` every access fails.
pub struct DmaSpace {
    inner: RwLock<Inner>,
    closed: AtomicBool,
    messages: Option<Arc<dyn MessageDma>>,
    max_maps: u32,
}

impl DmaSpace {
    /// `messages` serves fd-less mappings; `None` makes them fail with a transport error.
    pub fn new(max_maps: u32, messages: Option<Arc<dyn MessageDma>>) -> Self {
        DmaSpace { inner: RwLock::default(), closed: AtomicBool::new(false), messages, max_maps }
    }

    /// Replaces the default [`MmapLimits`].
    pub fn with_mmap_limits(self, limits: MmapLimits) -> Self {
        self.write_inner().limits = limits;
        self
    }

    fn read_inner(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unpoison()
    }
    fn write_inner(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unpoison()
    }

    /// DMA_MAP. `flags` are `dma_map_flags::*`; `offset` is the file offset, and must be 0 without fd (the
    /// specification: "the offset is 0 when the region is not mappable").
    pub fn map(&self, iova: u64, size: u64, offset: u64, flags: u32, fd: Option<OwnedFd>) -> Result<(), MapError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(MapError::Closed);
        }
        let known = dma_map_flags::READ | dma_map_flags::WRITE;
        if flags & !known != 0 || flags == 0 {
            return Err(MapError::Invalid("flags"));
        }
        if size == 0 || !iova.is_multiple_of(PAGE_SIZE) || !size.is_multiple_of(PAGE_SIZE) {
            return Err(MapError::Invalid("unaligned or empty range"));
        }
        let last = iova.checked_add(size - 1).ok_or(MapError::Invalid("range overflows"))?;
        let backing_fd = match fd {
            Some(fd) => Some(FdInfo::inspect(fd, offset, size, flags)?),
            None if offset != 0 => return Err(MapError::Invalid("file offset without a file")),
            None => None,
        };
        let mut inner = self.write_inner();
        if inner.maps.len() >= self.max_maps as usize {
            return Err(MapError::TooMany(self.max_maps));
        }
        if let Some((_, prev)) = inner.maps.range(..=last).next_back() {
            if prev.last >= iova {
                return Err(MapError::Exists);
            }
        }
        let backing = match backing_fd {
            Some(info) if info.sealed => match inner.file_map(info)? {
                Some(map) => Backing::File { map, offset },
                None => Backing::Message,
            },
            // An unsealed file could shrink under an mmap and fault us: use messages (fd dropped).
            _ => Backing::Message,
        };
        inner.maps.insert(iova, Mapping { last, flags, backing });
        Ok(())
    }

    /// DMA_UNMAP with Linux VFIO type1 semantics: removes every mapping inside the range and returns the
    /// bytes removed (0 for a range never mapped); a range that would split a mapping is EINVAL.
    pub fn unmap(&self, iova: u64, size: u64) -> Result<u64, MapError> {
        if size == 0 {
            return Err(MapError::Invalid("empty range"));
        }
        let last = iova.checked_add(size - 1).ok_or(MapError::Invalid("range overflows"))?;
        let mut inner = self.write_inner();
        if let Some((&start, m)) = inner.maps.range(..iova).next_back() {
            if m.last >= iova && start < iova {
                return Err(MapError::Invalid("unmap would split a mapping"));
            }
        }
        if let Some((_, m)) = inner.maps.range(iova..=last).next_back() {
            if m.last > last {
                return Err(MapError::Invalid("unmap would split a mapping"));
            }
        }
        let keys: Vec<u64> = inner.maps.range(iova..=last).map(|(k, _)| *k).collect();
        let mut removed = 0u64;
        for k in keys {
            if let Some(m) = inner.maps.remove(&k) {
                removed = removed.saturating_add(m.last - k).saturating_add(1);
            }
        }
        inner.files.retain(|_, w| w.strong_count() > 0);
        Ok(removed)
    }

    /// Drops every mapping (DMA_UNMAP with the ALL flag).
    pub fn unmap_all(&self) {
        let mut inner = self.write_inner();
        inner.maps.clear();
        inner.files.clear();
    }

    /// The client is gone: drop every mapping; from now on every access and map fails.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.unmap_all();
    }

    pub fn mapping_count(&self) -> usize {
        self.read_inner().maps.len()
    }

    /// How many file mmaps are alive right now (one per distinct file, plus any older mmap of a file
    /// that grew and is still used).
    pub fn mmap_count(&self) -> usize {
        self.read_inner().budget.files.load(Ordering::Acquire) as usize
    }

    /// Splits `[iova, iova+len)` into per-mapping pieces, checking coverage and permission first.
    fn plan(&self, inner: &Inner, iova: u64, len: usize, write: bool) -> Result<Pieces, DmaError> {
        let len64 = len as u64;
        let unmapped = DmaError::Unmapped { iova, len: len64 };
        if len == 0 {
            return Ok(Pieces::Many(Vec::new()));
        }
        let last = iova.checked_add(len64 - 1).ok_or(DmaError::Overflow { iova, len: len64 })?;
        let (need, dir) = if write { (dma_map_flags::WRITE, "write") } else { (dma_map_flags::READ, "read") };
        let mut pieces = Pieces::Many(Vec::new());
        let mut cur = iova;
        loop {
            let (&start, m) = inner.maps.range(..=cur).next_back().ok_or(unmapped.clone())?;
            if m.last < cur {
                return Err(unmapped);
            }
            if m.flags & need == 0 {
                return Err(DmaError::Permission { iova: cur, dir });
            }
            let piece_last = m.last.min(last);
            let n = usize::try_from(piece_last - cur + 1).map_err(|_| unmapped.clone())?;
            let backing = match &m.backing {
                Backing::File { map, offset } => Backing::File { map: map.clone(), offset: offset + (cur - start) },
                Backing::Message => Backing::Message,
            };
            pieces = pieces.push(Piece { iova: cur, len: n, backing });
            if piece_last == last {
                return Ok(pieces);
            }
            cur = piece_last + 1;
        }
    }

    fn run(
        &self,
        iova: u64,
        len: usize,
        write: bool,
        mut op: impl FnMut(&Piece, usize) -> Result<(), DmaError>,
    ) -> Result<(), DmaError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(DmaError::Transport("client disconnected".into()));
        }
        let inner = self.read_inner();
        let pieces = self.plan(&inner, iova, len, write)?;
        // mmapped pieces run under the read lock, so an unmap waits for them (the spec asks the server to
        // drop its references before replying). Message pieces must not hold it: their reply is read by
        // the thread that would take the write lock for the next DMA_UNMAP.
        let all_mapped = pieces.iter().all(|p| matches!(p.backing, Backing::File { .. }));
        let _guard = if all_mapped {
            Some(inner)
        } else {
            drop(inner);
            None
        };
        let mut done = 0;
        for p in pieces.iter() {
            op(p, done)?;
            done += p.len;
        }
        Ok(())
    }

    /// A copy's source and destination, both checked (coverage, direction, a writable mmap for every
    /// mmapped destination byte) before anything moves.
    fn plan_copy(&self, inner: &Inner, src: u64, dst: u64, len: u64) -> Result<(Pieces, Pieces), DmaError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(DmaError::Transport("client disconnected".into()));
        }
        let n = usize::try_from(len).map_err(|_| DmaError::Overflow { iova: src, len })?;
        let from = self.plan(inner, src, n, false)?;
        let to = self.plan(inner, dst, n, true)?;
        for p in to.iter() {
            if let Backing::File { map, .. } = &p.backing {
                if !map.writable {
                    return Err(DmaError::Permission { iova: p.iova, dir: "write" });
                }
            }
        }
        Ok((from, to))
    }

    fn no_messages() -> DmaError {
        DmaError::Transport("mapping without fd and no message path".into())
    }
}

impl DmaAccess for DmaSpace {
    fn regions(&self) -> Option<Vec<DmaRegion>> {
        let inner = self.read_inner();
        let regions = inner.maps.iter().map(|(&iova, m)| DmaRegion {
            iova,
            size: m.last.wrapping_sub(iova).wrapping_add(1),
            flags: m.flags,
            fd_offset: match &m.backing {
                Backing::File { offset, .. } => Some(*offset),
                Backing::Message => None,
            },
        });
        Some(regions.collect())
    }

    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let len = buf.len();
        self.run(iova, len, false, |p, done| {
            let dst = buf.get_mut(done..done + p.len).ok_or(DmaError::Overflow { iova, len: len as u64 })?;
            match &p.backing {
                Backing::File { map, offset } => map
                    .region
                    .read_slice(dst, MemoryRegionAddress(*offset))
                    .map_err(|e| DmaError::Transport(e.to_string())),
                Backing::Message => self.messages.as_ref().ok_or_else(Self::no_messages)?.dma_read(p.iova, dst),
            }
        })
    }

    fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        let len = buf.len();
        self.run(iova, len, true, |p, done| {
            let src = buf.get(done..done + p.len).ok_or(DmaError::Overflow { iova, len: len as u64 })?;
            match &p.backing {
                Backing::File { map, offset } => {
                    if !map.writable {
                        return Err(DmaError::Permission { iova: p.iova, dir: "write" });
                    }
                    map.region
                        .write_slice(src, MemoryRegionAddress(*offset))
                        .map_err(|e| DmaError::Transport(e.to_string()))
                }
                Backing::Message => self.messages.as_ref().ok_or_else(Self::no_messages)?.dma_write(p.iova, src),
            }
        })
    }

    fn check_read(&self, iova: u64, len: u64) -> Result<(), DmaError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(DmaError::Transport("client disconnected".into()));
        }
        let n = usize::try_from(len).map_err(|_| DmaError::Overflow { iova, len })?;
        self.plan(&self.read_inner(), iova, n, false).map(drop)
    }

    /// One direct copy between the mmaps when every byte of both ranges is mmapped; otherwise (message
    /// pieces, or ranges sharing backing bytes through several pieces or two maps of one file) the bounce
    /// copy, which keeps `memmove` semantics. Both ranges are checked before anything is written.
    fn copy(&self, src: u64, dst: u64, len: u64) -> Result<(), DmaError> {
        let inner = self.read_inner();
        let (from, to) = self.plan_copy(&inner, src, dst, len)?;
        if direct(&from, &to) {
            // Under the read lock, like a mapped read or write: an unmap waits for the copy.
            return copy_mapped(&from, &to);
        }
        // The bounce copy re-enters read/write, which take the lock themselves (message pieces must not hold it).
        drop(inner);
        bounce_copy(self, src, dst, len)
    }
}

/// Whether a copy can go straight between the mmaps: every piece mmapped, and either one piece each way in
/// the same map (a single `memmove` handles any overlap) or no byte of backing memory shared by both sides.
fn direct(from: &[Piece], to: &[Piece]) -> bool {
    // (map, file, first offset, end offset) of an mmapped piece.
    let file = |p: &Piece| match &p.backing {
        Backing::File { map, offset } => Some((Arc::as_ptr(map), map.key, *offset, *offset + p.len as u64)),
        Backing::Message => None,
    };
    // The common case (each side inside one DMA_MAP) without allocating.
    if let ([s], [d]) = (from, to) {
        return match (file(s), file(d)) {
            (Some(s), Some(d)) => s.0 == d.0 || s.1 != d.1 || s.3 <= d.2 || d.3 <= s.2,
            _ => false,
        };
    }
    let (Some(srcs), Some(dsts)) =
        (from.iter().map(file).collect::<Option<Vec<_>>>(), to.iter().map(file).collect::<Option<Vec<_>>>())
    else {
        return false;
    };
    // Destination extents sorted by (file, start), each with the furthest end so far in its file, so a
    // source extent is checked against all of them by one binary search.
    let mut ext: Vec<((u64, u64), u64, u64)> = dsts.iter().map(|d| (d.1, d.2, d.3)).collect();
    ext.sort_unstable();
    let mut reach: Vec<u64> = Vec::with_capacity(ext.len());
    for (i, e) in ext.iter().enumerate() {
        let prev = match i.checked_sub(1).and_then(|j| ext.get(j).zip(reach.get(j))) {
            Some((p, r)) if p.0 == e.0 => *r,
            _ => 0,
        };
        reach.push(e.2.max(prev));
    }
    srcs.iter().all(|&(_, key, start, end)| {
        // Destination extents of this file starting before the source extent ends.
        let below = ext.partition_point(|e| (e.0, e.1) < (key, end));
        match below.checked_sub(1).and_then(|j| ext.get(j).zip(reach.get(j))) {
            Some((e, r)) if e.0 == key => *r <= start,
            _ => true,
        }
    })
}

/// Copies piece by piece between mmaps; `direct` said the order does not matter.
fn copy_mapped(from: &[Piece], to: &[Piece]) -> Result<(), DmaError> {
    fn region(p: &Piece, at: usize, n: usize) -> Result<vm_memory::VolatileSlice<'_, ()>, DmaError> {
        match &p.backing {
            Backing::File { map, offset } => map
                .region
                .get_slice(MemoryRegionAddress(offset + at as u64), n)
                .map_err(|e| DmaError::Transport(e.to_string())),
            Backing::Message => Err(DmaError::Transport("message piece in a mapped copy".into())),
        }
    }
    let (mut srcs, mut dsts) = (from.iter(), to.iter());
    let (mut s, mut d) = (srcs.next(), dsts.next());
    let (mut s_at, mut d_at) = (0usize, 0usize);
    while let (Some(sp), Some(dp)) = (s, d) {
        let n = (sp.len - s_at).min(dp.len - d_at);
        // vm-memory's volatile slice copy is `ptr::copy`, i.e. memmove, bounds-checked by get_slice.
        region(sp, s_at, n)?.copy_to_volatile_slice(region(dp, d_at, n)?);
        s_at += n;
        d_at += n;
        if s_at == sp.len {
            (s, s_at) = (srcs.next(), 0);
        }
        if d_at == dp.len {
            (d, d_at) = (dsts.next(), 0);
        }
    }
    Ok(())
}

/// What DMA_MAP learned about a passed fd.
struct FdInfo {
    fd: OwnedFd,
    key: (u64, u64),
    file_size: u64,
    /// End of the range this DMA_MAP needs (offset + size).
    end: u64,
    sealed: bool,
    writable: bool,
    need_write: bool,
}

impl FdInfo {
    fn inspect(fd: OwnedFd, offset: u64, size: u64, flags: u32) -> Result<Self, MapError> {
        let st = fstat(&fd).map_err(|_| MapError::Invalid("fstat failed"))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(MapError::Invalid("fd is not a regular file"));
        }
        let file_size = u64::try_from(st.st_size).map_err(|_| MapError::Invalid("negative file size"))?;
        let end = offset.checked_add(size).ok_or(MapError::Invalid("offset overflows"))?;
        if !offset.is_multiple_of(PAGE_SIZE) || end > file_size {
            return Err(MapError::Invalid("mapping exceeds the file"));
        }
        let mode = fcntl_getfl(&fd).map_err(|_| MapError::Invalid("fcntl failed"))? & OFlags::ACCMODE;
        // Files that are not memfds have no seals (EINVAL): treat as unsealed.
        let seals = fcntl_get_seals(&fd).unwrap_or(SealFlags::empty());
        let sealed = seals.contains(SealFlags::SHRINK);
        // A write seal forbids shared writable mappings.
        let write_sealed = seals.intersects(SealFlags::WRITE | SealFlags::FUTURE_WRITE);
        let (readable, writable) = (mode != OFlags::WRONLY, mode == OFlags::RDWR && !write_sealed);
        if !readable || (flags & dma_map_flags::WRITE != 0 && !writable) {
            return Err(MapError::Access);
        }
        let need_write = flags & dma_map_flags::WRITE != 0;
        Ok(FdInfo { fd, key: (st.st_dev, st.st_ino), file_size, end, sealed, writable, need_write })
    }
}

impl Inner {
    /// The shared mmap of this file, created (whole file) if none covers the need; `None` when a new
    /// mmap would exceed the limits (the caller then serves the map by messages).
    fn file_map(&mut self, info: FdInfo) -> Result<Option<Arc<FileMap>>, MapError> {
        if let Some(existing) = self.files.get(&info.key).and_then(Weak::upgrade) {
            // A sealed file never shrinks; it may have grown since, or this fd may allow writing.
            if existing.size >= info.end && (existing.writable || !info.need_write) {
                return Ok(Some(existing));
            }
        }
        let (files, bytes) = (self.budget.files.load(Ordering::Acquire), self.budget.bytes.load(Ordering::Acquire));
        if files >= u64::from(self.limits.max_files) || bytes.saturating_add(info.file_size) > self.limits.max_bytes {
            tracing::debug!(files, bytes, "mmap limits reached: DMA_MAP served by messages");
            return Ok(None);
        }
        let len = usize::try_from(info.file_size).map_err(|_| MapError::Invalid("file too large"))?;
        let prot = if info.writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        let file = FileOffset::new(File::from(info.fd), 0);
        let region = MmapRegion::<()>::build(Some(file), len, prot, libc::MAP_SHARED | libc::MAP_NORESERVE)
            .map_err(|e| MapError::Mmap(e.to_string()))?;
        let region = GuestRegionMmap::new(region, GuestAddress(0)).ok_or(MapError::Invalid("empty file"))?;
        self.budget.files.fetch_add(1, Ordering::AcqRel);
        self.budget.bytes.fetch_add(info.file_size, Ordering::AcqRel);
        let budget = self.budget.clone();
        let map = Arc::new(FileMap { region, key: info.key, size: info.file_size, writable: info.writable, budget });
        self.files.insert(info.key, Arc::downgrade(&map));
        Ok(Some(map))
    }
}
