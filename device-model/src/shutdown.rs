//! Termination by signal: the first SIGTERM or SIGINT asks for a graceful shutdown (the caller stops
//! accepting, closes its clients and removes its sockets), a second one while that runs exits at once with
//! the shell's status for death by that signal (128 + signal number).
//!
//! Nothing here wakes periodically: the main thread sleeps in a read of a self-pipe that the signal handler
//! and the finishing server threads write to, and the threads blocked on sockets are reached by a
//! [`Stop`], which shuts their sockets down.

#![forbid(unsafe_code)]

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGINT, SIGTERM};
use vfio_user_proto::stop::Stop;

/// Set by the first SIGTERM or SIGINT.
pub struct Termination {
    flag: Arc<AtomicBool>,
    /// The self-pipe's read end: a byte arrives with each signal and each [`Waker::wake`].
    wakes: UnixStream,
    /// Its write end, cloned for each waker (non-blocking: a full pipe is readable already).
    wake: UnixStream,
}

/// Wakes [`Termination::wait_until`] so that it looks at its condition again (a thread finished).
pub struct Waker(UnixStream);

impl Waker {
    pub fn wake(&self) {
        // WouldBlock: the pipe is full, so the waiter has bytes to read and will look anyway.
        let _ = (&self.0).write(&[1]);
    }
}

impl Termination {
    /// Installs the handlers for SIGTERM and SIGINT.
    pub fn install() -> std::io::Result<Self> {
        let flag = Arc::new(AtomicBool::new(false));
        let (wakes, wake) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        for signal in [SIGTERM, SIGINT] {
            // Registered first, so it sees the flag before the handler below sets it: the first signal
            // only sets the flag, a second one finds it set and exits.
            signal_hook::flag::register_conditional_shutdown(signal, 128 + signal, flag.clone())?;
            signal_hook::flag::register(signal, flag.clone())?;
            // After the flag: the waiter that wakes finds it set.
            signal_hook::low_level::pipe::register(signal, wake.try_clone()?)?;
        }
        Ok(Termination { flag, wakes, wake })
    }

    pub fn requested(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// A waker for a thread whose end `done` (in [`Termination::wait_until`]) looks for.
    pub fn waker(&self) -> std::io::Result<Waker> {
        Ok(Waker(self.wake.try_clone()?))
    }

    /// Sleeps until a signal came or `done()` holds, looking again at each wake. Returns whether a signal
    /// came.
    pub fn wait_until(&self, mut done: impl FnMut() -> bool) -> bool {
        let mut buf = [0u8; 64];
        loop {
            if self.requested() {
                return true;
            }
            if done() {
                return false;
            }
            match (&self.wakes).read(&mut buf) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    // The pipe is ours and never closed while we wait: not expected. Give up waiting rather
                    // than spin on the error.
                    tracing::error!("termination wait: {e}");
                    return self.requested();
                }
            }
        }
    }
}

/// Accepts one connection, or `None` once `stop` fires (it shuts the listener down) or the listener fails.
/// Blocks in `accept`, with no timeout.
pub fn accept_one(listener: &UnixListener, stop: &Stop) -> Option<UnixStream> {
    let watch = match listener.set_nonblocking(false).and_then(|()| stop.watch(listener)) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!("accept: {e}");
            return None;
        }
    };
    while !stop.is_stopped() {
        match listener.accept() {
            Ok((stream, _)) => match stream.set_nonblocking(false) {
                Ok(()) => return Some(stream),
                Err(e) => tracing::warn!("cannot use accepted socket: {e}"),
            },
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) if stop.is_stopped() => {}
            Err(e) => {
                tracing::error!("accept failed: {e}");
                return None;
            }
        }
    }
    drop(watch);
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Long enough to mean "never" here: each wait below ends on its event long before.
    const NEVER: Duration = Duration::from_secs(30);

    #[test]
    fn accept_one_returns_a_connection_or_gives_up_when_told_to_stop() {
        let dir = std::env::temp_dir().join(format!("dm-accept-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("s.sock");
        let listener = Arc::new(UnixListener::bind(&path).expect("bind"));
        let stop = Stop::new();
        let _client = UnixStream::connect(&path).expect("connect");
        assert!(accept_one(&listener, &stop).is_some());
        assert_eq!(stop.watched(), 0, "the listener is no longer watched once accept_one returns");
        let (waiting_tx, waiting) = mpsc::channel();
        let acceptor = {
            let (listener, stop) = (listener.clone(), stop.clone());
            std::thread::spawn(move || {
                waiting_tx.send(()).expect("send");
                accept_one(&listener, &stop).is_none()
            })
        };
        waiting.recv_timeout(NEVER).expect("the acceptor started");
        // Whether it is already blocked in accept or about to be, the stop ends its wait.
        stop.stop();
        assert!(acceptor.join().expect("acceptor"), "nobody connects; the stop ends the wait");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_waker_wakes_the_termination_wait_to_look_at_its_condition_again() {
        let t = Termination::install().expect("install");
        let done = Arc::new(AtomicBool::new(false));
        let waker = t.waker().expect("waker");
        let setter = {
            let done = done.clone();
            std::thread::spawn(move || {
                done.store(true, Ordering::Release);
                waker.wake();
            })
        };
        assert!(!t.wait_until(|| done.load(Ordering::Acquire)), "no signal came; the condition held");
        setter.join().expect("setter");
    }
}
