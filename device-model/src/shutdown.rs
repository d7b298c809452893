//! Termination by signal: the first SIGTERM or SIGINT asks for a graceful shutdown (the caller stops
//! accepting, closes its clients and removes its sockets), a second one while that runs exits at once with
//! the shell's status for death by that signal (128 + signal number).

#![forbid(unsafe_code)]

use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use signal_hook::consts::{SIGINT, SIGTERM};

/// How often waits look at the shutdown flag.
pub const POLL: Duration = Duration::from_millis(50);

/// Set by the first SIGTERM or SIGINT.
#[derive(Clone)]
pub struct Termination(Arc<AtomicBool>);

impl Termination {
    /// Installs the handlers for SIGTERM and SIGINT.
    pub fn install() -> std::io::Result<Self> {
        let flag = Arc::new(AtomicBool::new(false));
        for signal in [SIGTERM, SIGINT] {
            // Registered first, so it sees the flag before the handler below sets it: the first signal
            // only sets the flag, a second one finds it set and exits.
            signal_hook::flag::register_conditional_shutdown(signal, 128 + signal, flag.clone())?;
            signal_hook::flag::register(signal, flag.clone())?;
        }
        Ok(Termination(flag))
    }

    pub fn requested(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Waits until a signal came or `done()` holds. Returns whether a signal came.
    pub fn wait_until(&self, done: impl Fn() -> bool) -> bool {
        loop {
            if self.requested() {
                return true;
            }
            if done() {
                return false;
            }
            std::thread::sleep(POLL);
        }
    }
}

/// Accepts one connection, or `None` once `stop` is set (or the listener fails).
pub fn accept_one(listener: &UnixListener, stop: &AtomicBool) -> Option<UnixStream> {
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::error!("accept: {e}");
        return None;
    }
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => match stream.set_nonblocking(false) {
                Ok(()) => return Some(stream),
                Err(e) => tracing::warn!("cannot use accepted socket: {e}"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let _ = vfio_user_proto::sock::wait_readable(listener, POLL);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::error!("accept failed: {e}");
                return None;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_one_returns_a_connection_or_gives_up_when_told_to_stop() {
        let dir = std::env::temp_dir().join(format!("dm-accept-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("s.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let stop = Arc::new(AtomicBool::new(false));
        let _client = UnixStream::connect(&path).expect("connect");
        assert!(accept_one(&listener, &stop).is_some());
        let stopper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                stop.store(true, Ordering::Release);
            })
        };
        assert!(accept_one(&listener, &stop).is_none(), "nobody connects; the stop ends the wait");
        stopper.join().expect("stopper");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
