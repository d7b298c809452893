//! Stopping threads that block on sockets, without waking them periodically: a [`Stop`] shuts down every
//! socket it watches (`shutdown(2)`), which ends a blocked `recvmsg` with end of stream and a blocked
//! `accept` on a listening UNIX socket with EINVAL (Linux's `unix_accept`: "receive shutdown"). So a
//! thread blocks on its socket alone, with no timeout, and a stop reaches it at once.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::sync::Unpoison;

#[derive(Default)]
struct Inner {
    stopped: AtomicBool,
    next: AtomicU64,
    /// Duplicates of the watched sockets (one per live [`Watch`]), shut down by [`Stop::stop`].
    watched: Mutex<HashMap<u64, OwnedFd>>,
}

/// A one-way stop flag that also shuts down the sockets its threads block on. Clones share it.
#[derive(Clone, Default)]
pub struct Stop(Arc<Inner>);

impl std::fmt::Debug for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stop").field("stopped", &self.is_stopped()).finish_non_exhaustive()
    }
}

/// A socket watched by a [`Stop`] until this drops (its duplicate is closed then, so the set stays as
/// small as the sockets in use).
#[must_use = "the socket is watched only while the Watch lives"]
pub struct Watch {
    stop: Stop,
    key: u64,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.0.watched.lock().unpoison().remove(&self.key);
    }
}

fn shut(fd: &OwnedFd) {
    // ENOTCONN for a socket the peer already left: nothing to wake then.
    let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Both);
}

impl Stop {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the flag and shuts down every watched socket.
    pub fn stop(&self) {
        let watched = self.0.watched.lock().unpoison();
        // Under the lock: a socket being watched now is either in the set or sees the flag.
        self.0.stopped.store(true, Ordering::Release);
        watched.values().for_each(shut);
    }

    pub fn is_stopped(&self) -> bool {
        self.0.stopped.load(Ordering::Acquire)
    }

    /// Watches `socket` (a listener or a connection): [`Stop::stop`] shuts it down, now if it has already
    /// been called. Fails only if the socket cannot be duplicated (EMFILE).
    pub fn watch(&self, socket: impl AsFd) -> std::io::Result<Watch> {
        let dup = rustix::io::fcntl_dupfd_cloexec(socket.as_fd(), 0)?;
        let mut watched = self.0.watched.lock().unpoison();
        if self.is_stopped() {
            shut(&dup);
        }
        let key = self.0.next.fetch_add(1, Ordering::Relaxed);
        watched.insert(key, dup);
        Ok(Watch { stop: self.clone(), key })
    }

    /// Sockets watched now.
    pub fn watched(&self) -> usize {
        self.0.watched.lock().unpoison().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::sync::mpsc;
    use std::time::Duration;

    /// Long enough to mean "never" here: every wait below ends on an event long before it.
    const NEVER: Duration = Duration::from_secs(30);

    #[test]
    fn a_stop_ends_a_blocked_read_with_end_of_stream() {
        let (a, _b) = UnixStream::pair().unwrap();
        let stop = Stop::new();
        let watch = stop.watch(&a).unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut a = a;
            tx.send(()).unwrap();
            let mut buf = [0u8; 8];
            a.read(&mut buf).map_err(|e| e.kind())
        });
        rx.recv_timeout(NEVER).unwrap();
        stop.stop();
        assert_eq!(reader.join().unwrap(), Ok(0), "the read returned end of stream");
        drop(watch);
        assert_eq!(stop.watched(), 0, "a dropped watch closes its duplicate");
    }

    #[test]
    fn a_stop_ends_a_blocked_accept_and_a_later_watch_is_shut_at_once() {
        let dir = std::env::temp_dir().join(format!("vu-stop-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join("s")).unwrap();
        let stop = Stop::new();
        let _watch = stop.watch(&listener).unwrap();
        let acceptor = std::thread::spawn(move || listener.accept().map(|_| ()).map_err(|e| e.raw_os_error()));
        // Whether the accept is already blocked or not, it fails once the listener is shut down.
        stop.stop();
        assert_eq!(acceptor.join().unwrap(), Err(Some(libc::EINVAL)));
        let (a, _b) = UnixStream::pair().unwrap();
        let _late = stop.watch(&a).unwrap();
        let mut buf = [0u8; 1];
        assert_eq!((&a).read(&mut buf).unwrap(), 0, "watched after the stop: shut down already");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
