//! A minimal, deliberately unhardened vfio-user peer for the harnesses: sends whatever it is given and reads
//! whole messages with a deadline. Built on the protocol crate's framing (`sock`), not on its client, so
//! the bytes on the wire are exactly what the fuzzer chose.

use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vfio_user_proto::frame_reader::{recv_message, FrameLimits};
use vfio_user_proto::sock::{send_message, FrameError, Message};
use vfio_user_proto::wire::Header;

/// What came back for one request.
#[derive(Debug)]
pub enum Answer {
    Reply(Message),
    /// The peer closed the connection (cleanly, or after a message it could not resynchronise on).
    Closed,
}

pub struct Peer {
    pub stream: UnixStream,
    limits_max_msg: u32,
    spin: Duration,
}

impl Peer {
    pub fn new(stream: UnixStream, max_msg: u32) -> Self {
        Peer { stream, limits_max_msg: max_msg, spin: Duration::ZERO }
    }

    /// Polls without blocking for up to `spin` before each wait sleeps. When the other end answers within
    /// microseconds on a thread of its own (a busy-polling server), a sleep costs a wake-up on each side of
    /// every round trip; with a core to spare, spinning saves both.
    pub fn spinning(self, spin: Duration) -> Self {
        Peer { spin, ..self }
    }

    /// Sends one message; a send error means the peer is gone.
    pub fn send(&self, header: &Header, payload: &[u8], fds: &[BorrowedFd]) -> bool {
        send_message(&self.stream, header, &[payload], fds).is_ok()
    }

    /// Reads the next message, waiting at most `wait`. `Ok(None)` on timeout.
    pub fn recv(&self, wait: Duration) -> Result<Option<Message>, FrameError> {
        let limits = FrameLimits { max_msg_size: self.limits_max_msg, max_fds: 253, stall_timeout: wait };
        if !readable(&self.stream, self.spin, wait) {
            return Ok(None);
        }
        recv_message(&self.stream, &limits).map(Some)
    }

    /// Waits for the reply to `id`, answering requests the peer sends meanwhile with `on_request`.
    /// `None` means no reply and no close within `wait`.
    pub fn await_reply(&self, id: u16, wait: Duration, mut on_request: impl FnMut(&Peer, Message)) -> Option<Answer> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            match self.recv(left) {
                Ok(Some(m)) if m.header.is_reply() && m.header.msg_id == id => return Some(Answer::Reply(m)),
                Ok(Some(m)) if m.header.is_command() => on_request(self, m),
                // A reply to something else (an earlier no-reply command, say): not ours, keep waiting.
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(_) => return Some(Answer::Closed),
            }
        }
    }
}

/// Whether `stream` has data (or EOF) within `wait`, polled without blocking for the first `spin` of it. A
/// signal (libFuzzer's SIGALRM) does not cut the wait short.
pub fn readable(stream: &UnixStream, spin: Duration, wait: Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let start = Instant::now();
    let deadline = start + wait;
    let spin = spin.min(wait);
    if !spin.is_zero() {
        let now = Timespec { tv_sec: 0, tv_nsec: 0 };
        loop {
            let mut fds = [PollFd::new(stream, PollFlags::IN)];
            match poll(&mut fds, Some(&now)) {
                Ok(n) if n > 0 => return true,
                Ok(_) | Err(rustix::io::Errno::INTR) if start.elapsed() < spin => std::hint::spin_loop(),
                Ok(_) | Err(rustix::io::Errno::INTR) => break,
                Err(_) => return false,
            }
        }
    }
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fds = [PollFd::new(stream, PollFlags::IN)];
        let ts = Timespec { tv_sec: left.as_secs() as i64, tv_nsec: i64::from(left.subsec_nanos()) };
        match poll(&mut fds, Some(&ts)) {
            Ok(n) => return n > 0,
            Err(rustix::io::Errno::INTR) if !left.is_zero() => continue,
            Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPIN: Duration = Duration::from_millis(1);

    #[test]
    fn queued_bytes_are_readable_at_once_whether_or_not_the_wait_spins() {
        let _fds = crate::FD_TESTS.lock();
        for spin in [Duration::ZERO, SPIN] {
            let (a, b) = UnixStream::pair().unwrap_or_else(|e| panic!("socketpair: {e}"));
            std::io::Write::write_all(&mut &a, b"x").unwrap_or_else(|e| panic!("write: {e}"));
            assert!(readable(&b, spin, Duration::from_secs(5)), "spin {spin:?}");
        }
    }

    #[test]
    fn a_silent_peer_is_not_readable_after_the_wait_even_when_the_spin_is_longer() {
        let _fds = crate::FD_TESTS.lock();
        for spin in [Duration::ZERO, SPIN, Duration::from_secs(1)] {
            let (_a, b) = UnixStream::pair().unwrap_or_else(|e| panic!("socketpair: {e}"));
            let start = Instant::now();
            assert!(!readable(&b, spin, SPIN), "spin {spin:?}");
            assert!(start.elapsed() < Duration::from_millis(900), "the wait, not the spin, bounds a silent peer");
        }
    }

    #[test]
    fn bytes_sent_after_the_spin_ended_wake_the_blocking_wait() {
        let _fds = crate::FD_TESTS.lock();
        let (a, b) = UnixStream::pair().unwrap_or_else(|e| panic!("socketpair: {e}"));
        let late = std::thread::spawn(move || {
            std::thread::sleep(SPIN * 20);
            std::io::Write::write_all(&mut &a, b"x").map(|_| a)
        });
        assert!(readable(&b, SPIN, Duration::from_secs(5)));
        assert!(late.join().is_ok_and(|r| r.is_ok()));
    }

    #[test]
    fn a_closed_peer_is_readable_its_end_of_stream_is_news() {
        let _fds = crate::FD_TESTS.lock();
        for spin in [Duration::ZERO, SPIN] {
            let (a, b) = UnixStream::pair().unwrap_or_else(|e| panic!("socketpair: {e}"));
            drop(a);
            assert!(readable(&b, spin, Duration::from_secs(5)), "spin {spin:?}");
        }
    }
}
