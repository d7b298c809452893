//! A line-oriented JSON channel over a non-blocking fd (a tty in raw mode, a UNIX socket) where every
//! read and write has a deadline.
//!
//! A line that does not start with `{` is noise (a serial line can carry stray bytes before the program
//! starts): counted and skipped. A line that starts with `{` but is not a message is a protocol error.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Longest line accepted by default: a tidlist and PFN list of 2048 pages each is about 40 KiB of JSON.
pub const MAX_LINE: usize = 4 << 20;
const READ_CHUNK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
    #[error("the peer closed the channel while we waited for {what}")]
    Closed { what: String },
    #[error("a line longer than {max} bytes arrived while we waited for {what}")]
    TooLong { what: String, max: usize },
    #[error("{op}: {errno}")]
    Io { op: &'static str, errno: String },
    #[error("bad message while waiting for {what}: {error} (line starts {start:?})")]
    Protocol { what: String, error: String, start: String },
    #[error("cannot encode a message: {0}")]
    Encode(String),
}

pub type Result<T> = std::result::Result<T, ChannelError>;

fn io(op: &'static str, e: &std::io::Error) -> ChannelError {
    ChannelError::Io { op, errno: crate::errno::io_error_name(e) }
}

pub struct LineChannel<S> {
    stream: S,
    buf: Vec<u8>,
    noise: u64,
    last_noise: Option<String>,
    max_line: usize,
}

impl<S: Read + Write + AsFd> LineChannel<S> {
    /// Takes the stream and makes it non-blocking, so no read or write can outlive its deadline.
    pub fn new(stream: S) -> Result<Self> {
        let flags = fcntl_getfl(&stream).map_err(|e| io("fcntl(F_GETFL)", &e.into()))?;
        fcntl_setfl(&stream, flags | OFlags::NONBLOCK).map_err(|e| io("fcntl(F_SETFL, O_NONBLOCK)", &e.into()))?;
        Ok(Self { stream, buf: Vec::new(), noise: 0, last_noise: None, max_line: MAX_LINE })
    }

    /// Accepts lines up to `max` bytes (a device-model dump can be megabytes).
    pub fn with_max_line(mut self, max: usize) -> Self {
        self.max_line = max;
        self
    }

    /// Lines skipped as noise so far, and the last of them.
    pub fn noise(&self) -> (u64, Option<&str>) {
        (self.noise, self.last_noise.as_deref())
    }

    /// Writes `msg` as one line within `timeout`.
    pub fn send<T: Serialize>(&mut self, msg: &T, timeout: Duration) -> Result<()> {
        let mut line = serde_json::to_vec(msg).map_err(|e| ChannelError::Encode(e.to_string()))?;
        line.push(b'\n');
        let deadline = Instant::now() + timeout;
        let mut done = 0;
        while done < line.len() {
            match self.stream.write(&line[done..]) {
                Ok(0) => return Err(ChannelError::Closed { what: "the peer to take our message".into() }),
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.wait(PollFlags::OUT, deadline, "room to send our message", timeout)?;
                }
                Err(e) => return Err(io("write", &e)),
            }
        }
        loop {
            match self.stream.flush() {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.wait(PollFlags::OUT, deadline, "room to send our message", timeout)?;
                }
                Err(e) => return Err(io("flush", &e)),
            }
        }
    }

    /// The next message, waiting at most `timeout`; `what` names it in errors.
    pub fn recv<T: DeserializeOwned>(&mut self, what: &str, timeout: Duration) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            while let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let raw: Vec<u8> = self.buf.drain(..=pos).collect();
                let line = String::from_utf8_lossy(&raw);
                let line = line.trim_matches(|c: char| c.is_whitespace() || c == '\0');
                if line.is_empty() {
                    continue;
                }
                if !line.starts_with('{') {
                    self.noise += 1;
                    self.last_noise = Some(line.chars().take(120).collect());
                    continue;
                }
                return serde_json::from_str(line).map_err(|e| ChannelError::Protocol {
                    what: what.to_string(),
                    error: e.to_string(),
                    start: line.chars().take(120).collect(),
                });
            }
            if self.buf.len() > self.max_line {
                return Err(ChannelError::TooLong { what: what.to_string(), max: self.max_line });
            }
            let mut chunk = [0u8; READ_CHUNK];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ChannelError::Closed { what: what.to_string() }),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => self.wait(PollFlags::IN, deadline, what, timeout)?,
                Err(e) => return Err(io("read", &e)),
            }
        }
    }

    fn wait(&self, flags: PollFlags, deadline: Instant, what: &str, timeout: Duration) -> Result<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ChannelError::Timeout { what: what.to_string(), after: timeout });
        }
        let ts = rustix::event::Timespec::try_from(left).unwrap_or(rustix::event::Timespec { tv_sec: 1, tv_nsec: 0 });
        let mut fds = [PollFd::new(&self.stream, flags)];
        match poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(io("poll", &e.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{GuestMsg, HostMsg};
    use std::os::unix::net::UnixStream;

    fn pair() -> (LineChannel<UnixStream>, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (LineChannel::new(a).unwrap(), b)
    }

    #[test]
    fn messages_cross_and_noise_lines_are_skipped_and_counted() {
        let (mut ch, mut peer) = pair();
        peer.write_all(b"\0\0login: \r\n\n{\"type\":\"abort\",\"error\":\"x\"}\r\n").unwrap();
        let m: HostMsg = ch.recv("abort", Duration::from_secs(5)).unwrap();
        assert_eq!(m, HostMsg::Abort { error: "x".into() });
        assert_eq!(ch.noise(), (1, Some("login:")));
        ch.send(&GuestMsg::Done { ok: true, error: None }, Duration::from_secs(5)).unwrap();
        let mut peer_ch = LineChannel::new(peer).unwrap();
        let m: GuestMsg = peer_ch.recv("done", Duration::from_secs(5)).unwrap();
        assert_eq!(m, GuestMsg::Done { ok: true, error: None });
    }

    #[test]
    fn a_silent_peer_is_a_timeout_and_a_closed_one_is_closed() {
        let (mut ch, peer) = pair();
        let start = Instant::now();
        let e = ch.recv::<HostMsg>("welcome", Duration::from_millis(100)).unwrap_err();
        assert!(matches!(e, ChannelError::Timeout { ref what, .. } if what == "welcome"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(5));
        drop(peer);
        assert!(matches!(ch.recv::<HostMsg>("welcome", Duration::from_secs(5)), Err(ChannelError::Closed { .. })));
    }

    #[test]
    fn a_json_line_that_is_not_a_message_is_a_protocol_error() {
        let (mut ch, mut peer) = pair();
        peer.write_all(b"{\"type\":\"nonsense\"}\n").unwrap();
        assert!(matches!(ch.recv::<HostMsg>("welcome", Duration::from_secs(5)), Err(ChannelError::Protocol { .. })));
    }

    #[test]
    fn an_endless_line_is_refused() {
        let (mut ch, peer) = pair();
        let writer = std::thread::spawn(move || {
            let mut peer = peer;
            let chunk = vec![b'{'; 1 << 16];
            for _ in 0..(MAX_LINE / chunk.len() + 2) {
                if peer.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
        assert!(matches!(ch.recv::<HostMsg>("welcome", Duration::from_secs(20)), Err(ChannelError::TooLong { .. })));
        drop(ch);
        writer.join().unwrap();
    }

    #[test]
    fn a_peer_that_never_reads_makes_send_time_out() {
        let (mut ch, _peer) = pair();
        let big = GuestMsg::Abort { error: "x".repeat(1 << 20) };
        let mut result = Ok(());
        for _ in 0..64 {
            result = ch.send(&big, Duration::from_millis(100));
            if result.is_err() {
                break;
            }
        }
        assert!(matches!(result, Err(ChannelError::Timeout { .. })), "{result:?}");
    }
}
