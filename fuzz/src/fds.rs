//! File-descriptor accounting for the "no fd leak" oracle.

use std::collections::BTreeSet;
use std::sync::Mutex;

use rustix::fs::{Dir, Mode, OFlags};
use vfio_user_proto::sync::Unpoison;

/// The process's open descriptors, from `/proc/self/fd`. The directory is read through one handle kept
/// open for the process's life, so that handle is in every listing: opening procfs twice per input cost
/// client_parse 5% of its time.
pub fn open_fds() -> BTreeSet<i32> {
    static DIR: Mutex<Option<Dir>> = Mutex::new(None);
    let mut dir = DIR.lock().unpoison();
    // A handle that fails to read (closed under us by code under test, say) is opened again, once.
    for _ in 0..2 {
        if dir.is_none() {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
            *dir = rustix::fs::open("/proc/self/fd", flags, Mode::empty()).ok().and_then(|fd| Dir::new(fd).ok());
        }
        let Some(d) = dir.as_mut() else { return BTreeSet::new() };
        d.rewind();
        let listed: Result<BTreeSet<i32>, _> = d
            .by_ref()
            .filter_map(|e| e.map(|e| e.file_name().to_str().ok().and_then(|s| s.parse().ok())).transpose())
            .collect();
        match listed {
            Ok(fds) => return fds,
            Err(_) => *dir = None,
        }
    }
    BTreeSet::new()
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
    fn listings_with_nothing_opened_between_them_are_equal_and_hold_the_standard_streams() {
        let _alone = crate::FD_TESTS.lock();
        let first = open_fds();
        assert!([0, 1, 2].iter().all(|fd| first.contains(fd)), "{first:?}");
        assert_eq!(open_fds(), first, "the listing's own handle is the same in both");
    }

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
