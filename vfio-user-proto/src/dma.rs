//! The device's view of the client's memory.
//!
//! Contract shared by every crate in the workspace: device logic only ever reads or writes bytes at an
//! IOVA through [`DmaAccess`]. An access outside mapped memory is an error value, never a crash.

use thiserror::Error;

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

/// Bytes at an IOVA. Implemented by the server's per-connection DMA space and by test memories.
pub trait DmaAccess: Send + Sync {
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
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
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
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let before = inner.ranges.len();
        inner.ranges.retain(|(b, _)| *b != iova);
        inner.ranges.len() != before
    }

    /// How many write calls succeeded so far.
    pub fn write_count(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).writes
    }
}

impl DmaAccess for HeapMemory {
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut done = 0;
        for (idx, off, n) in inner.pieces(iova, buf.len())? {
            buf[done..done + n].copy_from_slice(&inner.ranges[idx].1[off..off + n]);
            done += n;
        }
        Ok(())
    }

    fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
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
    fn heap_memory_access_touching_a_hole_fails_and_writes_nothing() {
        let m = HeapMemory::new();
        assert!(m.map(0x1000, 0x1000));
        assert!(m.map(0x3000, 0x1000));
        assert_eq!(
            m.write(0x1ffc, &[0xff; 8]),
            Err(DmaError::Unmapped { iova: 0x1ffc, len: 8 })
        );
        assert_eq!(m.read_u32(0x1ffc).unwrap(), 0);
        assert_eq!(m.write_count(), 0);
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
