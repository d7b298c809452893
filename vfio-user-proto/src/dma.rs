//! The device's view of the client's memory.
//!
//! Contract shared by every crate in the workspace: device logic only ever reads or writes bytes at an
//! IOVA through [`DmaAccess`]. An access outside mapped memory is an error value, never a crash.

#![forbid(unsafe_code)]

use thiserror::Error;

use crate::sync::Unpoison;

/// Why a DMA access failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DmaError {
    /// Some byte of `[iova, iova + len)` is not covered by a mapping.
    #[error("DMA to unmapped IOVA range {iova:#x}+{len:#x}")]
    Unmapped { iova: u64, len: u64 },
    /// The mapping covering `iova` does not allow this direction.
    #[error("DMA {dir} not permitted at IOVA {iova:#x}")]
    Permission { iova: u64, dir: &'static str },
    /// `iova + len` overflows the 64-bit address space.
    #[error("DMA range {iova:#x}+{len:#x} overflows")]
    Overflow { iova: u64, len: u64 },
    /// The message path (DMA_READ/DMA_WRITE to the client) failed: disconnect, timeout or error reply.
    #[error("DMA message to the client failed: {0}")]
    Transport(String),
}

/// One range the client mapped for DMA, as the device sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaRegion {
    pub iova: u64,
    pub size: u64,
    /// `dma_map_flags::*`.
    pub flags: u32,
    /// Offset of `iova` in the file the client passed, or `None` for a map without fd (message DMA).
    pub fd_offset: Option<u64>,
}

/// Bytes at an IOVA. Implemented by the server's per-connection DMA space and by test memories.
pub trait DmaAccess: Send + Sync {
    /// The client's current DMA mappings, in IOVA order, for diagnostics and checks outside the device;
    /// `None` where the backend does not know them.
    fn regions(&self) -> Option<Vec<DmaRegion>> {
        None
    }

    /// Fills `buf` from `[iova, iova + buf.len())`.
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError>;
    /// Stores `buf` at `[iova, iova + buf.len())`.
    fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError>;

    fn read_u32(&self, iova: u64) -> Result<u32, DmaError> {
        let mut b = [0u8; 4];
        self.read(iova, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    fn read_u64(&self, iova: u64) -> Result<u64, DmaError> {
        let mut b = [0u8; 8];
        self.read(iova, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    fn write_u32(&self, iova: u64, value: u32) -> Result<(), DmaError> {
        self.write(iova, &value.to_le_bytes())
    }
    fn write_u64(&self, iova: u64, value: u64) -> Result<(), DmaError> {
        self.write(iova, &value.to_le_bytes())
    }

    /// Whether `read` of `[iova, iova + len)` would succeed now, with the error it would return; the bytes
    /// are not kept. Lets a device refuse a request whose source it cannot read before it changes any state.
    /// The provided version reads through a bounded buffer; backends that can look the range up override it.
    fn check_read(&self, iova: u64, len: u64) -> Result<(), DmaError> {
        bounce_check_read(self, iova, len)
    }

    /// Copies `[src, src + len)` to `[dst, dst + len)` as if read into a buffer and then written, so
    /// overlapping ranges behave like `memmove`, and fails as that read and write would (the source first).
    ///
    /// The provided version bounces through a buffer of at most [`DMA_BOUNCE_CHUNK`] bytes: a copy that fits
    /// one chunk is exactly one `read` and one `write`, so a failure writes nothing. A longer one checks the
    /// whole source and the destination's address range first, then goes chunk by chunk (back to front when
    /// the destination overlaps the source from above), so a destination fault found in a later chunk leaves
    /// the earlier chunks written. The server's `DmaSpace` overrides it: both ranges checked before any byte
    /// moves, then one direct copy between its mmaps.
    fn copy(&self, src: u64, dst: u64, len: u64) -> Result<(), DmaError> {
        bounce_copy(self, src, dst, len)
    }
}

/// Largest buffer the provided [`DmaAccess::copy`] and [`DmaAccess::check_read`] bounce through: above the
/// largest loopback payload, so a packet's copy is one read and one write.
pub const DMA_BOUNCE_CHUNK: usize = 16 * 1024;

/// An error of a chunk's access, restated for the whole access where it names the chunk's own range (as
/// `Unmapped` and `Overflow` name the requested range).
fn widen(e: DmaError, chunk_iova: u64, chunk_len: u64, iova: u64, len: u64) -> DmaError {
    match e {
        DmaError::Unmapped { iova: i, len: l } if (i, l) == (chunk_iova, chunk_len) => DmaError::Unmapped { iova, len },
        DmaError::Overflow { iova: i, len: l } if (i, l) == (chunk_iova, chunk_len) => DmaError::Overflow { iova, len },
        other => other,
    }
}

/// `iova + len` without leaving the address space (a range may end exactly at 2^64).
fn check_range(iova: u64, len: u64) -> Result<(), DmaError> {
    if len > 0 && iova.checked_add(len - 1).is_none() {
        return Err(DmaError::Overflow { iova, len });
    }
    Ok(())
}

/// The chunks of a `len`-byte access: (offset, length), front to back.
fn chunks(len: u64) -> impl DoubleEndedIterator<Item = (u64, usize)> {
    let chunk = DMA_BOUNCE_CHUNK as u64;
    (0..len.div_ceil(chunk)).map(move |k| (k * chunk, (len - k * chunk).min(chunk) as usize))
}

/// [`DmaAccess::check_read`] for any backend: reads the range through a bounded buffer.
pub fn bounce_check_read<D: DmaAccess + ?Sized>(dma: &D, iova: u64, len: u64) -> Result<(), DmaError> {
    check_range(iova, len)?;
    let mut buf = vec![0u8; len.min(DMA_BOUNCE_CHUNK as u64) as usize];
    for (off, n) in chunks(len) {
        let at = iova + off;
        let part = buf.get_mut(..n).ok_or(DmaError::Overflow { iova, len })?;
        dma.read(at, part).map_err(|e| widen(e, at, n as u64, iova, len))?;
    }
    Ok(())
}

/// [`DmaAccess::copy`] for any backend: `read` then `write` through a bounded buffer (see there).
pub fn bounce_copy<D: DmaAccess + ?Sized>(dma: &D, src: u64, dst: u64, len: u64) -> Result<(), DmaError> {
    if len <= DMA_BOUNCE_CHUNK as u64 {
        let mut buf = vec![0u8; len as usize];
        dma.read(src, &mut buf)?;
        return dma.write(dst, &buf);
    }
    dma.check_read(src, len)?;
    check_range(dst, len)?;
    let mut buf = vec![0u8; DMA_BOUNCE_CHUNK];
    // Back to front when the destination overlaps the source from above, so no chunk of the source is
    // overwritten before it is read.
    let backward = dst > src && dst - src < len;
    let mut step = |(off, n): (u64, usize)| -> Result<(), DmaError> {
        let part = buf.get_mut(..n).ok_or(DmaError::Overflow { iova: src, len })?;
        dma.read(src + off, part).map_err(|e| widen(e, src + off, n as u64, src, len))?;
        dma.write(dst + off, part).map_err(|e| widen(e, dst + off, n as u64, dst, len))
    };
    if backward {
        chunks(len).rev().try_for_each(&mut step)
    } else {
        chunks(len).try_for_each(&mut step)
    }
}

/// No memory at all: what a device sees while no client is connected.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoDma;

impl DmaAccess for NoDma {
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        Err(DmaError::Unmapped { iova, len: buf.len() as u64 })
    }
    fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        Err(DmaError::Unmapped { iova, len: buf.len() as u64 })
    }
}

/// Plain process memory at chosen IOVAs, for in-process devices, tests and fuzzing.
///
/// Accesses may span adjacent ranges; any byte outside every range makes the whole access fail before
/// anything is copied. Every completed write is counted, so tests can assert what a device touched.
#[derive(Debug, Default)]
pub struct HeapMemory {
    inner: std::sync::Mutex<HeapInner>,
}

#[derive(Debug, Default)]
struct HeapInner {
    /// Sorted by IOVA, non-overlapping.
    ranges: Vec<(u64, Vec<u8>)>,
    writes: u64,
}

impl HeapInner {
    /// The (range index, offset in range, length) pieces covering `[iova, iova+len)`, or an error.
    fn pieces(&self, iova: u64, len: usize) -> Result<Vec<(usize, usize, usize)>, DmaError> {
        let len64 = len as u64;
        iova.checked_add(len64).ok_or(DmaError::Overflow { iova, len: len64 })?;
        let mut out = Vec::new();
        let (mut cur, mut left) = (iova, len);
        while left > 0 {
            let idx = self
                .ranges
                .iter()
                .position(|(base, mem)| cur >= *base && cur - *base < mem.len() as u64)
                .ok_or(DmaError::Unmapped { iova, len: len64 })?;
            let (base, mem) = &self.ranges[idx];
            let off = (cur - base) as usize;
            let n = left.min(mem.len() - off);
            out.push((idx, off, n));
            cur += n as u64;
            left -= n;
        }
        Ok(out)
    }
}

impl HeapMemory {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `len` zeroed bytes at `iova`. Fails (returns false) on overlap or overflow.
    pub fn map(&self, iova: u64, len: usize) -> bool {
        let mut inner = self.inner.lock().unpoison();
        let Some(end) = iova.checked_add(len as u64) else { return false };
        if len == 0 || inner.ranges.iter().any(|(b, m)| iova < b + m.len() as u64 && *b < end) {
            return false;
        }
        inner.ranges.push((iova, vec![0; len]));
        inner.ranges.sort_by_key(|(b, _)| *b);
        true
    }

    /// Removes the range starting at `iova`. Returns whether one was there.
    pub fn unmap(&self, iova: u64) -> bool {
        let mut inner = self.inner.lock().unpoison();
        let before = inner.ranges.len();
        inner.ranges.retain(|(b, _)| *b != iova);
        inner.ranges.len() != before
    }

    /// `f` on the bytes of the range that `map` made at `iova`, without copying them; `None` when no range
    /// starts there. For oracles that compare a whole memory after each run.
    pub fn inspect<R>(&self, iova: u64, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let inner = self.inner.lock().unpoison();
        inner.ranges.iter().find(|(b, _)| *b == iova).map(|(_, mem)| f(mem))
    }

    /// How many write calls succeeded so far.
    pub fn write_count(&self) -> u64 {
        self.inner.lock().unpoison().writes
    }
}

impl DmaAccess for HeapMemory {
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let inner = self.inner.lock().unpoison();
        let mut done = 0;
        for (idx, off, n) in inner.pieces(iova, buf.len())? {
            buf[done..done + n].copy_from_slice(&inner.ranges[idx].1[off..off + n]);
            done += n;
        }
        Ok(())
    }

    fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        let mut inner = self.inner.lock().unpoison();
        let mut done = 0;
        for (idx, off, n) in inner.pieces(iova, buf.len())? {
            inner.ranges[idx].1[off..off + n].copy_from_slice(&buf[done..done + n]);
            done += n;
        }
        inner.writes += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_memory_access_spanning_adjacent_ranges_succeeds() {
        let m = HeapMemory::new();
        assert!(m.map(0x1000, 0x1000));
        assert!(m.map(0x2000, 0x1000));
        m.write(0x1ffc, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        assert_eq!(m.read_u64(0x1ffc).unwrap(), u64::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 8]));
    }

    #[test]
    fn heap_memory_inspect_sees_a_whole_range_by_its_start_only() {
        let m = HeapMemory::new();
        assert!(m.map(0x1000, 0x1000));
        m.write(0x1ff8, &[9; 8]).unwrap();
        assert_eq!(m.inspect(0x1000, |b| (b.len(), b[0xff8..].to_vec())), Some((0x1000, vec![9; 8])));
        assert_eq!(m.inspect(0x1008, |b| b.len()), None);
        assert_eq!(m.inspect(0x2000, |b| b.len()), None);
    }

    #[test]
    fn heap_memory_access_touching_a_hole_fails_and_writes_nothing() {
        let m = HeapMemory::new();
        assert!(m.map(0x1000, 0x1000));
        assert!(m.map(0x3000, 0x1000));
        assert_eq!(m.write(0x1ffc, &[0xff; 8]), Err(DmaError::Unmapped { iova: 0x1ffc, len: 8 }));
        assert_eq!(m.read_u32(0x1ffc).unwrap(), 0);
        assert_eq!(m.write_count(), 0);
    }

    /// A memory of `0x10000` bytes at 0x10000 holding `i % 251`, and a separate page at 0x30000.
    fn patterned() -> HeapMemory {
        let m = HeapMemory::new();
        assert!(m.map(0x10000, 0x10000) && m.map(0x30000, 0x1000));
        let bytes: Vec<u8> = (0..0x10000).map(|i| (i % 251) as u8).collect();
        m.write(0x10000, &bytes).unwrap();
        m
    }

    #[test]
    fn provided_copy_moves_bytes_like_memmove_at_any_length_and_direction() {
        let long = DMA_BOUNCE_CHUNK as u64 * 2 + 0x123;
        // (src, dst, len): offsets into the 0x10000-byte range.
        let table: [(u64, u64, u64); 6] = [
            (0, 0x8000, 0x100),
            (0, 0x10, 0x400),
            (0x10, 0, 0x400),
            (0, 0x100, long),
            (0x100, 0, long),
            (0x40, 0x40, 64),
        ];
        for (src, dst, len) in table {
            let m = patterned();
            let mut expect = vec![0u8; 0x10000];
            m.read(0x10000, &mut expect).unwrap();
            expect.copy_within(src as usize..(src + len) as usize, dst as usize);
            m.copy(0x10000 + src, 0x10000 + dst, len).unwrap();
            let mut got = vec![0u8; 0x10000];
            m.read(0x10000, &mut got).unwrap();
            assert!(got == expect, "{src:#x} -> {dst:#x} + {len:#x}");
        }
    }

    #[test]
    fn provided_copy_reports_the_whole_range_and_writes_nothing_when_a_range_check_fails() {
        let long = DMA_BOUNCE_CHUNK as u64 + 1;
        let table: [(u64, u64, u64, DmaError); 5] = [
            (0x1fff0, 0x10000, 0x20, DmaError::Unmapped { iova: 0x1fff0, len: 0x20 }),
            (0x10000, 0x1fff0, 0x20, DmaError::Unmapped { iova: 0x1fff0, len: 0x20 }),
            // Longer than a chunk: the hole is in the second chunk of the source, found before any write.
            (0x1c000, 0x30000, long, DmaError::Unmapped { iova: 0x1c000, len: long }),
            (u64::MAX - 1, 0x10000, 4, DmaError::Overflow { iova: u64::MAX - 1, len: 4 }),
            (0x10000, u64::MAX - 1, long, DmaError::Overflow { iova: u64::MAX - 1, len: long }),
        ];
        for (src, dst, len, want) in table {
            let m = patterned();
            let writes = m.write_count();
            assert_eq!(m.copy(src, dst, len), Err(want.clone()));
            assert_eq!(m.write_count(), writes, "{want:?}");
        }
    }

    #[test]
    fn provided_check_read_fails_as_read_would() {
        let m = patterned();
        assert_eq!(m.check_read(0x10000, 0x10000), Ok(()));
        assert_eq!(m.check_read(0x1fff0, 0x20), Err(DmaError::Unmapped { iova: 0x1fff0, len: 0x20 }));
        let long = DMA_BOUNCE_CHUNK as u64 * 3;
        assert_eq!(m.check_read(0x18000, long), Err(DmaError::Unmapped { iova: 0x18000, len: long }));
        assert_eq!(NoDma.check_read(0x1000, 1), Err(DmaError::Unmapped { iova: 0x1000, len: 1 }));
    }

    #[test]
    fn heap_memory_rejects_overlap_and_overflow() {
        let m = HeapMemory::new();
        assert!(m.map(0x1000, 0x2000));
        assert!(!m.map(0x2000, 0x1000));
        assert!(!m.map(u64::MAX - 10, 100));
        assert_eq!(m.read(u64::MAX - 2, &mut [0; 8]), Err(DmaError::Overflow { iova: u64::MAX - 2, len: 8 }));
    }
}
