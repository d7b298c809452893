//! The allocator's policy for freed memory, set once per harness.
//!
//! glibc hands the top of its heap back to the kernel once more than 128 KiB is free there, and gets it
//! again with the next allocation. Each hand-back is a `brk` shrink that, in a process with several threads,
//! flushes the other CPUs' TLBs by IPI: on this VM that cost client_parse 16% of its time, for an input that
//! frees one 128 KiB buffer. What a harness frees it will soon allocate again, so it is kept.

/// Keeps freed memory in the process (no heap trimming, no per-allocation mmap for large blocks). Call it
/// before the harness's first allocation of its own; best effort.
pub fn keep_freed_memory() {
    // SAFETY: mallopt only sets two of the allocator's tuning parameters; it reads and writes no memory of
    // ours, and any value is valid for both (glibc clamps the mmap threshold to its maximum).
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
    }
}
