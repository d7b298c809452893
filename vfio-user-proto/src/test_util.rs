//! Helpers for the tests of this crate and of the crates built on it (feature `test-util`, which only
//! dev-dependencies turn on).

use std::os::unix::net::UnixStream;
use std::path::Path;

/// Runs `f` on a thread running as `uid`/`gid` with no supplementary groups, and returns what it made
/// (credentials are per thread to the kernel: the raw setresuid of rustix changes only the calling thread's, and
/// SO_PEERCRED takes the connecting thread's). Needs root; panics where a step fails, as a test helper does.
pub fn as_user<T: Send + 'static>(uid: u32, gid: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        use rustix::process::{Gid, Uid};
        let (gid, uid) = (Gid::from_raw(gid), Uid::from_raw(uid));
        rustix::thread::set_thread_groups(&[]).expect("setgroups (the tests run as root)");
        rustix::thread::set_thread_res_gid(gid, gid, gid).expect("setresgid");
        rustix::thread::set_thread_res_uid(uid, uid, uid).expect("setresuid");
        f()
    })
    .join()
    .expect("thread")
}

/// A connection to `path` made as `uid`/`gid` (see [`as_user`]).
pub fn connect_as(path: &Path, uid: u32, gid: u32) -> UnixStream {
    let path = path.to_path_buf();
    as_user(uid, gid, move || UnixStream::connect(&path).expect("connect as another user"))
}
