//! File-descriptor accounting for the "no fd leak" oracle.

use std::collections::BTreeSet;

/// The process's open descriptors, from `/proc/self/fd`. The directory handle used to read it is
/// excluded (it is open while listing and closed after).
pub fn open_fds() -> BTreeSet<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return BTreeSet::new() };
    let listed: Vec<i32> =
        dir.filter_map(|e| e.ok()).filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect();
    // The listing's own descriptor is gone once `read_dir` is dropped: keep only those still valid.
    listed.into_iter().filter(|fd| is_open(*fd)).collect()
}

fn is_open(fd: i32) -> bool {
    // SAFETY: F_GETFD on any integer only queries the descriptor table; it never touches memory.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// Waits up to `timeout` for the open descriptors to return to `before` (threads that own fds may still be
/// finishing), and returns the descriptors still leaked (`now - before`).
pub fn leaked_since(before: &BTreeSet<i32>, timeout: std::time::Duration) -> Vec<i32> {
    let start = std::time::Instant::now();
    loop {
        let now = open_fds();
        let leaked: Vec<i32> = now.difference(before).copied().collect();
        if leaked.is_empty() || start.elapsed() >= timeout {
            return leaked;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_fd_opened_after_the_snapshot_is_reported_and_a_closed_one_is_not() {
        let _alone = crate::FD_TESTS.lock();
        let before = open_fds();
        let f = std::fs::File::open("/proc/self/status").unwrap_or_else(|e| panic!("open: {e}"));
        let leaked = leaked_since(&before, std::time::Duration::ZERO);
        assert_eq!(leaked.len(), 1);
        drop(f);
        assert!(leaked_since(&before, std::time::Duration::from_millis(100)).is_empty());
    }
}
