//! Shared memory behind the RcvArray's sparse-mmap area: a memfd the client maps, seen here as 64-bit atomic
//! words. The only `unsafe` of the hfi1 engine lives in this file.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// `words` 64-bit words at byte `file_offset` of a memfd, mapped shared.
///
/// The file is `file_offset + 8 * words` bytes long and sparse below `file_offset`, so the client can map it at
/// BAR offsets (file offset = BAR offset) without the device paying for the unused part. It is sealed at that
/// size (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`), so the mapping stays backed whatever the client does.
pub struct SharedWords {
    ptr: *mut AtomicU64,
    words: usize,
    fd: Arc<OwnedFd>,
}

// SAFETY: the mapping is owned by this value for its whole life, and every access goes through `AtomicU64`,
// which is safe to share between threads (and with the client process, which only does aligned 64-bit stores
// and loads on it).
unsafe impl Send for SharedWords {}
// SAFETY: as above; `&SharedWords` only hands out atomic operations.
unsafe impl Sync for SharedWords {}

impl SharedWords {
    /// Creates the memfd and maps the words. `file_offset` must be page-aligned.
    pub fn new(name: &str, file_offset: u64, words: usize) -> std::io::Result<Self> {
        let len = words.checked_mul(8).filter(|l| *l > 0).ok_or(std::io::ErrorKind::InvalidInput)?;
        if !file_offset.is_multiple_of(4096) {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, file_offset + len as u64)?;
        // The client gets this file read-write: sealed, it can neither shrink it under the mapping below (the
        // next access would SIGBUS the whole process) nor grow it, nor unseal it.
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        // SAFETY: a fresh shared mapping chosen by the kernel (null hint), of a range the file covers (ftruncate
        // above) and always will (sealed against shrinking); no existing memory is replaced. The result is
        // checked before use.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                file_offset,
            )
        }?;
        Ok(Self { ptr: ptr.cast(), words, fd: Arc::new(fd) })
    }

    pub fn len(&self) -> usize {
        self.words
    }

    /// The file backing the words, for the client to map.
    pub fn fd(&self) -> Arc<OwnedFd> {
        Arc::clone(&self.fd)
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` is the mapping of exactly `words` 64-bit words made in `new`, page-aligned (so every word
        // is 8-byte aligned), and it lives as long as `self`; the file behind it is sealed against shrinking, so
        // every word stays backed (no SIGBUS). AtomicU64 has the layout of u64, and all accesses
        // from this process are atomic.
        unsafe { std::slice::from_raw_parts(self.ptr, self.words) }
    }

    fn word(&self, index: usize) -> Option<&AtomicU64> {
        self.words().get(index)
    }

    /// Atomically takes word `index`, leaving 0. `None` if out of range.
    pub fn take(&self, index: usize) -> Option<u64> {
        self.word(index).map(|w| w.swap(0, Ordering::AcqRel))
    }

    /// Reads word `index` without changing it.
    #[cfg(test)]
    pub fn load(&self, index: usize) -> Option<u64> {
        self.word(index).map(|w| w.load(Ordering::Acquire))
    }

    /// Stores `value` in word `index` (what a client store through its mapping does). Returns false if out of
    /// range.
    #[cfg(test)]
    pub fn store(&self, index: usize, value: u64) -> bool {
        self.word(index).map(|w| w.store(value, Ordering::Release)).is_some()
    }

    /// Zeroes every word.
    pub fn clear(&self) {
        self.words().iter().for_each(|w| w.store(0, Ordering::Release));
    }
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping made in `new`, and no reference into it outlives `self`
        // (`word` borrows `self`).
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.words * 8) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_returns_the_stored_word_and_leaves_zero() {
        let w = SharedWords::new("t", 0x1200000, 512).unwrap();
        assert!(w.store(7, 0x8000002000012345));
        assert_eq!(w.take(7), Some(0x8000002000012345));
        assert_eq!(w.load(7), Some(0));
        assert_eq!(w.take(512), None);
        assert!(!w.store(512, 1));
    }

    #[test]
    fn stores_through_the_file_at_the_bar_offset_reach_the_word() {
        use std::os::fd::AsRawFd;
        let w = SharedWords::new("t", 0x1200000, 512).unwrap();
        // Open the same file, as a client would, and store at the BAR offset of entry 3.
        let path = format!("/proc/self/fd/{}", w.fd().as_raw_fd());
        let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&0x8000000000000000u64.to_le_bytes(), 0x1200000 + 8 * 3).unwrap();
        assert_eq!(w.take(3), Some(0x8000000000000000));
    }

    #[test]
    fn clear_zeroes_every_word_from_the_first_to_the_last() {
        let w = SharedWords::new("t", 0x1200000, 512).unwrap();
        for i in [0, 1, 255, 510, 511] {
            assert!(w.store(i, 0x8000002000012345 | i as u64));
        }
        w.clear();
        assert!((0..512).all(|i| w.load(i) == Some(0)));
    }

    #[test]
    fn a_client_can_neither_shrink_nor_grow_nor_reseal_the_file_and_the_words_stay_usable() {
        use rustix::io::Errno;
        let w = SharedWords::new("t", 0x1200000, 512).unwrap();
        let fd = w.fd();
        let size = 0x1200000 + 512 * 8;
        // What a client holding the fd (read-write, as the server hands it out) may try; memfd_create(2):
        // a sealed change fails with EPERM.
        let attempts: [(&str, Result<(), Errno>); 4] = [
            ("shrink to 0", rustix::fs::ftruncate(&*fd, 0)),
            ("shrink by a page", rustix::fs::ftruncate(&*fd, size - 4096)),
            ("grow", rustix::fs::ftruncate(&*fd, size + 4096)),
            ("add a write seal", rustix::fs::fcntl_add_seals(&*fd, SealFlags::FUTURE_WRITE)),
        ];
        for (what, result) in attempts {
            assert_eq!(result, Err(Errno::PERM), "{what}");
        }
        assert_eq!(rustix::fs::fstat(&*fd).unwrap().st_size as u64, size);
        assert!(w.store(511, 0x8000002000012345));
        assert_eq!(w.take(511), Some(0x8000002000012345));
    }

    #[test]
    fn unaligned_file_offset_is_rejected() {
        assert!(SharedWords::new("t", 8, 512).is_err());
        assert!(SharedWords::new("t", 0, 0).is_err());
    }
}
