//! The coverage region: the ivshmem-plain backend file (e.g. /dev/shm/hfi1cov) mapped shared, or an owned
//! buffer (a snapshot, or a fake written by a test). The guest writes it while the host reads, so every access
//! goes through volatile loads and stores of the raw mapping, never through a Rust reference to its bytes.

use crate::layout::{self, field};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    #[error("opening {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("{path} is {len} bytes; the coverage region needs {need}")]
    TooSmall { path: PathBuf, len: u64, need: usize },
    #[error("mapping {path}: {source}")]
    Map { path: PathBuf, source: rustix::io::Errno },
    #[error("a buffer of {len} bytes is not a coverage region ({need} bytes)")]
    BufferSize { len: usize, need: usize },
    #[error("the module has not attached the region yet (state {state}, magic {magic:#010x})")]
    NotAttached { state: u32, magic: u32 },
    #[error("the region's version is {found}; this reader knows {known}")]
    Version { found: u32, known: u32 },
    #[error("the region's header says {field} = {guest}, the layout {host}")]
    Layout { field: &'static str, guest: u64, host: u64 },
}

/// What the module wrote into the header when it attached, plus the live counters.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Header {
    pub text_base: u64,
    pub text_size: u64,
    /// First hits so far, including those past the log's capacity.
    pub pc_count: u64,
    pub generation: u64,
    /// Call-site hits; approximate (the hook counts without atomics).
    pub hits: u64,
}

/// The call sites in first-hit order, as text offsets (return addresses minus the MOD_TEXT base).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcLog {
    pub offsets: Vec<u32>,
    /// First hits the log had no room for.
    pub dropped: u64,
}

enum Backing {
    Mapped,
    // Owns the memory `ptr` points into; u64 for the header's alignment.
    Owned(#[allow(dead_code)] Box<[u64]>),
}

pub struct Region {
    ptr: NonNull<u8>,
    backing: Backing,
}

// SAFETY: the region is plain shared memory; every access is a volatile load or store of a whole
// naturally aligned field, so moving the handle to another thread is no different from using it here.
unsafe impl Send for Region {}

impl Region {
    /// Maps the ivshmem-plain backend file shared and read-write (the host resets what the guest wrote).
    pub fn open(path: &Path) -> Result<Region, RegionError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| RegionError::Open { path: path.into(), source })?;
        let len = file.metadata().map_err(|source| RegionError::Open { path: path.into(), source })?.len();
        if len < layout::REGION_SIZE as u64 {
            return Err(RegionError::TooSmall { path: path.into(), len, need: layout::REGION_SIZE });
        }
        // SAFETY: a fresh shared mapping of REGION_SIZE bytes of a file at least that long; nothing else in
        // this process maps it, and Drop unmaps exactly this range.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                layout::REGION_SIZE,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &file,
                0,
            )
        }
        .map_err(|source| RegionError::Map { path: path.into(), source })?;
        let ptr = NonNull::new(ptr.cast::<u8>()).expect("mmap returned a null mapping");
        Ok(Region { ptr, backing: Backing::Mapped })
    }

    /// A region over a copy of `bytes` (exactly REGION_SIZE of them): a snapshot, or a test's fake.
    pub fn from_bytes(bytes: &[u8]) -> Result<Region, RegionError> {
        if bytes.len() != layout::REGION_SIZE {
            return Err(RegionError::BufferSize { len: bytes.len(), need: layout::REGION_SIZE });
        }
        let mut words = vec![0u64; layout::REGION_SIZE / 8].into_boxed_slice();
        for (w, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            *w = u64::from_ne_bytes(chunk.try_into().expect("8-byte chunk"));
        }
        let ptr = NonNull::new(words.as_mut_ptr().cast::<u8>()).expect("a boxed slice is not null");
        Ok(Region { ptr, backing: Backing::Owned(words) })
    }

    fn check(off: usize, size: usize) {
        assert!(
            off.is_multiple_of(size) && off + size <= layout::REGION_SIZE,
            "field {off:#x}+{size} outside the region"
        );
    }

    fn read_u32(&self, off: usize) -> u32 {
        Self::check(off, 4);
        // SAFETY: in bounds and aligned (checked above); the memory stays mapped while `self` lives.
        u32::from_le(unsafe { self.ptr.as_ptr().add(off).cast::<u32>().read_volatile() })
    }

    fn read_u64(&self, off: usize) -> u64 {
        Self::check(off, 8);
        // SAFETY: in bounds and aligned (checked above); the memory stays mapped while `self` lives.
        u64::from_le(unsafe { self.ptr.as_ptr().add(off).cast::<u64>().read_volatile() })
    }

    fn write_u64(&self, off: usize, v: u64) {
        Self::check(off, 8);
        // SAFETY: in bounds and aligned (checked above); the memory stays mapped while `self` lives.
        unsafe { self.ptr.as_ptr().add(off).cast::<u64>().write_volatile(v.to_le()) }
    }

    /// Copies `out.len()` bytes from `off`, a u64 at a time.
    fn copy_out(&self, off: usize, out: &mut [u8]) {
        assert!(off.is_multiple_of(8) && out.len().is_multiple_of(8));
        for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&self.read_u64(off + 8 * i).to_le_bytes());
        }
    }

    fn zero(&self, off: usize, len: usize) {
        assert!(off.is_multiple_of(8) && len.is_multiple_of(8));
        for i in (0..len).step_by(8) {
            self.write_u64(off + i, 0);
        }
    }

    /// The header, once the module has attached and if its layout is this reader's.
    pub fn header(&self) -> Result<Header, RegionError> {
        let (magic, state) = (self.read_u32(field::MAGIC), self.read_u32(field::STATE));
        if magic != layout::MAGIC || state != layout::STATE_ATTACHED {
            return Err(RegionError::NotAttached { state, magic });
        }
        let version = self.read_u32(field::VERSION);
        if version != layout::VERSION {
            return Err(RegionError::Version { found: version, known: layout::VERSION });
        }
        let fields: [(&'static str, u64, u64); 3] = [
            ("map_size", self.read_u32(field::MAP_SIZE).into(), layout::MAP_SIZE as u64),
            ("seen_bits", self.read_u32(field::SEEN_BITS).into(), (layout::SEEN_BYTES * 8) as u64),
            ("pcs_capacity", self.read_u32(field::PCS_CAPACITY).into(), layout::PCS_CAPACITY as u64),
        ];
        for (name, guest, host) in fields {
            if guest != host {
                return Err(RegionError::Layout { field: name, guest, host });
            }
        }
        Ok(Header {
            text_base: self.read_u64(field::TEXT_BASE),
            text_size: self.read_u64(field::TEXT_SIZE),
            pc_count: self.read_u64(field::PC_COUNT),
            generation: self.read_u64(field::GENERATION),
            hits: self.read_u64(field::HITS),
        })
    }

    /// The edge map (hit counts), copied into `out`.
    pub fn edge_map_into(&self, out: &mut [u8; layout::MAP_SIZE]) {
        self.copy_out(layout::MAP_OFFSET, out);
    }

    pub fn edge_map(&self) -> Box<[u8; layout::MAP_SIZE]> {
        let mut map = Box::new([0u8; layout::MAP_SIZE]);
        self.edge_map_into(&mut map);
        map
    }

    /// The first-hit log, bounded by its capacity. The hook counts a hit before it stores the entry, so an
    /// entry still 0 (never a return address) is one being written: it is left out.
    pub fn pc_log(&self) -> PcLog {
        let count = self.read_u64(field::PC_COUNT);
        let kept = count.min(layout::PCS_CAPACITY as u64) as usize;
        let mut offsets = Vec::with_capacity(kept);
        for i in 0..kept {
            let v = self.read_u32(layout::PCS_OFFSET + 4 * i);
            if v != 0 {
                offsets.push(v);
            }
        }
        PcLog { offsets, dropped: count - kept as u64 }
    }

    /// Distinct call sites hit, from the first-hit bitmap (complete even when the log overflowed).
    pub fn seen_count(&self) -> u64 {
        (0..layout::SEEN_BYTES).step_by(8).map(|i| u64::from(self.read_u64(layout::SEEN_OFFSET + i).count_ones())).sum()
    }

    /// Per exec: clears the edge map and bumps the generation; the first-hit state stays.
    pub fn reset_edges(&self) {
        self.zero(layout::MAP_OFFSET, layout::MAP_SIZE);
        self.bump_generation();
    }

    /// Clears the edge map, the first-hit bitmap and log and the counters, and bumps the generation. Hits the
    /// guest makes during the reset may survive it.
    pub fn reset_all(&self) {
        self.write_u64(field::PC_COUNT, 0);
        self.write_u64(field::HITS, 0);
        self.zero(layout::MAP_OFFSET, layout::REGION_SIZE - layout::MAP_OFFSET);
        self.bump_generation();
    }

    fn bump_generation(&self) {
        self.write_u64(field::GENERATION, self.read_u64(field::GENERATION).wrapping_add(1));
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Backing::Mapped = self.backing {
            // SAFETY: exactly the range `open` mapped; no access outlives `self`.
            let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), layout::REGION_SIZE) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A region as the hook leaves it after attaching (hfi1_cov.c cov_attach), the fields put where
    /// hfi1_cov.h says (layout.rs is checked against that header).
    struct Fake(Vec<u8>);

    impl Fake {
        fn attached() -> Fake {
            let mut f = Fake(vec![0; layout::REGION_SIZE]);
            f.u32(field::MAGIC, layout::MAGIC);
            f.u32(field::VERSION, layout::VERSION);
            f.u32(field::MAP_SIZE, layout::MAP_SIZE as u32);
            f.u32(field::SEEN_BITS, (layout::SEEN_BYTES * 8) as u32);
            f.u32(field::PCS_CAPACITY, layout::PCS_CAPACITY as u32);
            f.u64(field::TEXT_BASE, 0xffff_ffff_c0a0_0000);
            f.u64(field::TEXT_SIZE, 0x11_c000);
            f.u32(field::STATE, layout::STATE_ATTACHED);
            f
        }
        fn u32(&mut self, off: usize, v: u32) {
            self.0[off..off + 4].copy_from_slice(&v.to_le_bytes());
        }
        fn u64(&mut self, off: usize, v: u64) {
            self.0[off..off + 8].copy_from_slice(&v.to_le_bytes());
        }
        /// A first hit at `site`, as the hook records it.
        fn hit(&mut self, site: u32) {
            self.0[layout::SEEN_OFFSET + site as usize / 8] |= 1 << (site % 8);
            let count = u64::from_le_bytes(self.0[field::PC_COUNT..field::PC_COUNT + 8].try_into().unwrap());
            if (count as usize) < layout::PCS_CAPACITY {
                self.u32(layout::PCS_OFFSET + 4 * count as usize, site);
            }
            self.u64(field::PC_COUNT, count + 1);
        }
        fn region(&self) -> Region {
            Region::from_bytes(&self.0).unwrap()
        }
    }

    #[test]
    fn the_header_reads_back_what_the_module_wrote() {
        let mut f = Fake::attached();
        f.u64(field::GENERATION, 7);
        f.u64(field::HITS, 12345);
        f.hit(0x1234);
        let h = f.region().header().unwrap();
        assert_eq!(
            h,
            Header { text_base: 0xffff_ffff_c0a0_0000, text_size: 0x11_c000, pc_count: 1, generation: 7, hits: 12345 }
        );
    }

    #[test]
    fn a_region_is_refused_until_the_module_attached_it_with_this_layout() {
        type Edit = fn(&mut Fake);
        let cases: &[(&str, Edit, &str)] = &[
            ("untouched backend file", |f| f.0.fill(0), "not attached"),
            ("header written, state not yet", |f| f.u32(field::STATE, 0), "not attached"),
            ("another magic", |f| f.u32(field::MAGIC, 0x1234_5678), "not attached"),
            ("another version", |f| f.u32(field::VERSION, 2), "version is 2"),
            ("another map size", |f| f.u32(field::MAP_SIZE, 0x8000), "map_size = 32768"),
            ("another seen bitmap", |f| f.u32(field::SEEN_BITS, 8), "seen_bits = 8"),
            ("another log capacity", |f| f.u32(field::PCS_CAPACITY, 16), "pcs_capacity = 16"),
        ];
        for (name, edit, want) in cases {
            let mut f = Fake::attached();
            edit(&mut f);
            let err = f.region().header().unwrap_err().to_string();
            assert!(err.contains(want), "{name}: {err}");
        }
    }

    #[test]
    fn the_pc_log_keeps_first_hits_in_order_up_to_its_capacity_and_counts_the_rest_as_dropped() {
        let mut f = Fake::attached();
        let sites: Vec<u32> = (1..=layout::PCS_CAPACITY as u32 + 3).collect();
        for &s in &sites {
            f.hit(s);
        }
        let region = f.region();
        let log = region.pc_log();
        assert_eq!(log.offsets, sites[..layout::PCS_CAPACITY]);
        assert_eq!(log.dropped, 3);
        // The bitmap still counts every site.
        assert_eq!(region.seen_count(), sites.len() as u64);
    }

    #[test]
    fn a_log_entry_counted_but_not_yet_stored_is_left_out() {
        let mut f = Fake::attached();
        f.hit(0x40);
        f.u64(field::PC_COUNT, 2); // the hook's increment, before its store of the second entry
        assert_eq!(f.region().pc_log(), PcLog { offsets: vec![0x40], dropped: 0 });
    }

    #[test]
    fn an_edge_reset_clears_the_map_only_and_a_full_reset_everything_but_the_header() {
        let mut f = Fake::attached();
        f.0[layout::MAP_OFFSET + 5] = 3;
        f.0[layout::MAP_OFFSET + layout::MAP_SIZE - 1] = 1;
        f.hit(0x99);
        f.u64(field::HITS, 10);
        let region = f.region();
        assert_eq!(region.edge_map().iter().filter(|&&b| b != 0).count(), 2);

        region.reset_edges();
        assert!(region.edge_map().iter().all(|&b| b == 0));
        assert_eq!(region.pc_log().offsets, vec![0x99]);
        assert_eq!(region.header().unwrap().generation, 1);

        region.reset_all();
        let h = region.header().unwrap();
        assert_eq!((h.pc_count, h.hits, h.generation), (0, 0, 2));
        assert_eq!(region.seen_count(), 0);
        assert!(region.pc_log().offsets.is_empty());
        assert_eq!(h.text_base, 0xffff_ffff_c0a0_0000, "the header survives");
    }

    #[test]
    fn the_backend_file_is_mapped_shared_and_a_short_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, vec![0u8; layout::REGION_SIZE / 2]).unwrap();
        let err = Region::open(&short).err().expect("a short file is refused");
        assert!(matches!(err, RegionError::TooSmall { len, .. } if len == layout::REGION_SIZE as u64 / 2));

        let full = dir.path().join("hfi1cov");
        let mut f = Fake::attached();
        f.hit(0x777);
        std::fs::write(&full, &f.0).unwrap();
        let region = Region::open(&full).unwrap();
        assert_eq!(region.pc_log().offsets, vec![0x777]);
        region.reset_all();
        drop(region);
        // The reset went to the file, where QEMU's backend (and the guest) see it.
        let bytes = std::fs::read(&full).unwrap();
        assert_eq!(&bytes[field::PC_COUNT..field::PC_COUNT + 8], &[0; 8]);
        assert_eq!(bytes[layout::SEEN_OFFSET + 0x777 / 8], 0);
    }
}
