//! A minimal, deliberately unhardened vfio-user peer for the harnesses: sends whatever it is given and reads
//! whole messages with a deadline. Built on the protocol crate's framing (`sock`), not on its client, so
//! the bytes on the wire are exactly what the fuzzer chose.

use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vfio_user_proto::sock::{recv_message, send_message, FrameError, Message, RecvLimits};
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
}

impl Peer {
    pub fn new(stream: UnixStream, max_msg: u32) -> Self {
        Peer { stream, limits_max_msg: max_msg }
    }

    /// Sends one message; a send error means the peer is gone.
    pub fn send(&self, header: &Header, payload: &[u8], fds: &[BorrowedFd]) -> bool {
        send_message(&self.stream, header, &[payload], fds).is_ok()
    }

    /// Reads the next message, waiting at most `wait`. `Ok(None)` on timeout.
    pub fn recv(&self, wait: Duration) -> Result<Option<Message>, FrameError> {
        let limits = RecvLimits { max_msg_size: self.limits_max_msg, max_fds: 253, stall_timeout: wait, stop: None };
        if !readable(&self.stream, wait) {
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

/// Whether `stream` has data (or EOF) within `wait`. A signal (libFuzzer's SIGALRM) does not cut the wait
/// short.
pub fn readable(stream: &UnixStream, wait: Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let deadline = Instant::now() + wait;
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
