//! Buffered message reading for the hot loops (the server's read loop, the client's reader role): one
//! receive per message, and descriptors given to the message they were sent with, however the peer
//! grouped its messages into sends.
//!
//! On an AF_UNIX stream the kernel hands a send's descriptors to the first read that touches that send
//! and ends that read at the send's end, but the read also takes the sends queued before it. A read that
//! holds several messages plus descriptors could be one send with them on its first message (a client
//! pipelining), or separate sends with them on the last (QEMU): the bytes and descriptors are the same.
//! So bytes are first *peeked* (MSG_PEEK from the socket's peek offset, SO_PEEK_OFF) into the buffer,
//! usually a whole message per receive, and messages are cut from the buffer. A peek without a control
//! buffer only says *that* descriptors are in its range (MSG_CTRUNC) and leaves them queued. When it
//! does, what was peeked before is consumed and the range is read again exactly, each read within one
//! message (the rest of its header, then the rest of its body), so the descriptors go to the message
//! whose bytes the send began in.
//!
//! Peeked bytes are consumed in one read for several messages, so a register round trip costs one
//! receive, as a plain read would. They keep the sender's buffer charged (about 768 bytes per small
//! send), so the reader never waits holding a partial message, more than [`HOLD_MESSAGES`] messages or
//! [`HOLD_BYTES`] bytes, and a peer with Linux's smallest send buffer (4608) can still send.
//!
//! A message larger than what is buffered switches to body mode: the rest is read straight into its
//! payload (after consuming what was peeked), so big transfers are not copied twice and the buffer stays
//! small. At most `max_fds` descriptors are kept per message; the rest are closed and the message is
//! marked `fds_truncated`, as is one whose descriptors the kernel cut (MSG_CTRUNC). A socket that refuses
//! SO_PEEK_OFF is read exactly, message by message, throughout.

#![forbid(unsafe_code)]

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rustix::net::{recv, recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};

use crate::sock::{set_peek_offset, wait_readable, FrameError, Message};
use crate::wire::{Header, HEADER_SIZE};

/// Holds any small message whole (REGION_WRITE_MULTI's 200 entries are the largest fixed part).
const BUF_SIZE: usize = 16 * 1024;
/// Most whole messages left peeked but unconsumed while the reader waits for more.
pub const HOLD_MESSAGES: usize = 3;
/// Most bytes left peeked but unconsumed while the reader waits for more.
pub const HOLD_BYTES: usize = 1024;

#[derive(Debug, Clone, Copy)]
pub struct FrameLimits {
    /// Largest whole message (header included) accepted.
    pub max_msg_size: u32,
    pub max_fds: u32,
    /// Longest a peer may stall inside one message.
    pub stall_timeout: Duration,
}

/// How [`FrameReader::next`] reads when nothing complete is buffered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// A blocking receive: returns when data arrives or at the socket's receive timeout (SO_RCVTIMEO),
    /// which bounds how long `next` may block.
    Block,
    /// `MSG_DONTWAIT`: only what has already arrived.
    NoWait,
}

/// A message whose payload is larger than what was buffered: read into directly.
struct Body {
    header: Header,
    payload: Vec<u8>,
    filled: usize,
    fds: Vec<OwnedFd>,
    truncated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// SO_PEEK_OFF is set on the first read, when the reader has taken the socket over.
    Unset,
    Peek,
    /// Descriptors ride in the next `left` bytes: read them within one message at a time.
    Exact {
        left: usize,
    },
    /// The socket refused SO_PEEK_OFF.
    ExactOnly,
}

pub struct FrameReader {
    limits: FrameLimits,
    buf: Box<[u8]>,
    /// Unparsed bytes are `buf[start..end]`.
    start: usize,
    end: usize,
    /// Bytes peeked but not consumed yet: the last `held` bytes seen, none of them with descriptors.
    held: usize,
    /// Messages cut while some of their bytes are held.
    held_msgs: usize,
    mode: Mode,
    /// Descriptors of the message at `buf[start]`, from exact reads.
    fds: Vec<OwnedFd>,
    fds_truncated: bool,
    body: Option<Body>,
    control: Vec<MaybeUninit<u8>>,
    /// Where consumed bytes go: they were kept when peeked.
    scratch: Box<[u8]>,
    /// Since when the message in progress has been waiting for more bytes (the stall clock), set when a read
    /// first finds nothing and cleared by every read that brings bytes: no clock read on the fast path.
    stalled_since: Option<Instant>,
}

enum Filled {
    Bytes,
    /// Nothing buffered, but bytes are there to be read another way.
    Again,
    Nothing,
    Eof,
}

impl FrameReader {
    pub fn new(limits: FrameLimits) -> Self {
        let fds = limits.max_fds.max(1) as usize;
        FrameReader {
            limits,
            buf: vec![0u8; BUF_SIZE].into_boxed_slice(),
            start: 0,
            end: 0,
            held: 0,
            held_msgs: 0,
            mode: Mode::Unset,
            fds: Vec::new(),
            fds_truncated: false,
            body: None,
            control: vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds))],
            scratch: vec![0u8; BUF_SIZE].into_boxed_slice(),
            stalled_since: None,
        }
    }

    /// A reader that reads message by message (the rest of the header, then the rest of the body) from
    /// the start, as it does on a socket that refuses SO_PEEK_OFF: two receives per message where the peek
    /// mode usually needs one. Measured against the peek mode by `testbed bench` case (a) (docs/vfio-user.md).
    pub fn exact(limits: FrameLimits) -> Self {
        FrameReader { mode: Mode::ExactOnly, ..Self::new(limits) }
    }

    /// Bytes of a message have been received but not the whole message.
    pub fn in_message(&self) -> bool {
        self.body.is_some() || self.end > self.start
    }

    /// Consumes every byte already seen, so that the socket polls readable only for bytes not seen yet.
    /// Call it before waiting on the socket with anything but [`FrameReader::next`].
    pub fn consume_seen(&mut self, stream: &UnixStream) -> Result<(), FrameError> {
        while self.held > 0 {
            let n = self.held.min(self.scratch.len());
            let dst = self.scratch.get_mut(..n).unwrap_or_default();
            // Without a control buffer: these bytes carried no descriptors when peeked; were that ever
            // wrong, the kernel would close them rather than leak them.
            match recv(stream, dst, RecvFlags::DONTWAIT) {
                Ok((_, 0)) => return Err(FrameError::Io(std::io::Error::other("peeked bytes vanished"))),
                Ok((_, k)) => self.held = self.held.saturating_sub(k),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(FrameError::Io(e.into())),
            }
        }
        self.held_msgs = 0;
        Ok(())
    }

    /// Reads without blocking until a whole message is there (`Some`) or `until` has passed (`None`): the
    /// busy-poll of a server's connection and of a client waiting for its reply.
    pub fn poll_until(&mut self, stream: &UnixStream, until: Instant) -> Result<Option<Message>, FrameError> {
        loop {
            if let Some(m) = self.next(stream, Wait::NoWait)? {
                return Ok(Some(m));
            }
            if Instant::now() >= until {
                return Ok(None);
            }
            std::hint::spin_loop();
        }
    }

    /// The next complete message: from the buffer if one is there, otherwise after reading. `Ok(None)`
    /// when nothing complete has arrived (with [`Wait::Block`]: by the receive timeout, the stall clock inside
    /// a message, or a signal). After `BadSize` the stream cannot be resynchronised and the reader must not be
    /// used further.
    pub fn next(&mut self, stream: &UnixStream, wait: Wait) -> Result<Option<Message>, FrameError> {
        // Whether the wait for the rest of the message (below) has been made since the last bytes came.
        let mut waited = false;
        loop {
            if let Some(m) = self.parse()? {
                return Ok(Some(m));
            }
            // Inside a message the rest has almost always arrived with its start: read without blocking, and
            // wait (with the stall clock) only if it has not.
            let inside = wait == Wait::Block && self.in_message();
            match self.fill(stream, if inside { Wait::NoWait } else { wait })? {
                Filled::Bytes | Filled::Again => waited = false,
                Filled::Eof if self.in_message() => return Err(FrameError::Truncated),
                Filled::Eof => return Err(FrameError::Closed),
                Filled::Nothing if inside && !waited => {
                    self.wait_for_rest(stream)?;
                    waited = true;
                }
                Filled::Nothing => {
                    if self.in_message() {
                        let since = *self.stalled_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= self.limits.stall_timeout {
                            return Err(FrameError::Timeout);
                        }
                    }
                    return Ok(None);
                }
            }
        }
    }

    /// Inside a message a blocking read must not outlast the stall timeout, whatever the socket's own receive
    /// timeout (a server's is none, so that an idle connection sleeps until its next message): waits for more
    /// bytes for what is left of it (or of the socket's timeout, if shorter). A signal ends the wait early.
    fn wait_for_rest(&mut self, stream: &UnixStream) -> Result<(), FrameError> {
        // Peeked bytes would keep the socket readable: the wait must see only new ones.
        self.consume_seen(stream)?;
        let since = *self.stalled_since.get_or_insert_with(Instant::now);
        let mut left = self.limits.stall_timeout.saturating_sub(since.elapsed());
        if let Ok(Some(t)) = stream.read_timeout() {
            left = left.min(t);
        }
        if !left.is_zero() {
            // false: timed out or interrupted; the read that follows finds nothing and `next` judges the stall.
            wait_readable(stream, left)?;
        }
        Ok(())
    }

    /// Cuts the next complete message, or starts body mode for one that is not complete yet.
    fn parse(&mut self) -> Result<Option<Message>, FrameError> {
        if let Some(body) = &self.body {
            if body.filled < body.payload.len() {
                return Ok(None);
            }
            let Some(b) = self.body.take() else { return Ok(None) };
            return Ok(Some(Message { header: b.header, payload: b.payload, fds: b.fds, fds_truncated: b.truncated }));
        }
        let Some(hb) = self.buf.get(self.start..self.end).and_then(|b| b.first_chunk::<HEADER_SIZE>()) else {
            return Ok(None);
        };
        let header = Header::decode(hb);
        let size = header.msg_size;
        if (size as usize) < HEADER_SIZE || size > self.limits.max_msg_size {
            self.start += HEADER_SIZE;
            return Err(FrameError::BadSize { header, size, max: self.limits.max_msg_size });
        }
        let size = size as usize;
        let fds = std::mem::take(&mut self.fds);
        let truncated = std::mem::replace(&mut self.fds_truncated, false);
        let payload_start = self.start + HEADER_SIZE;
        if self.end - self.start >= size {
            let payload = self.buf.get(payload_start..self.start + size).unwrap_or_default().to_vec();
            self.start += size;
            if self.start == self.end {
                (self.start, self.end) = (0, 0);
            }
            if self.held > 0 {
                self.held_msgs += 1;
            }
            return Ok(Some(Message { header, payload, fds, fds_truncated: truncated }));
        }
        let mut payload = vec![0u8; size - HEADER_SIZE];
        let have = self.buf.get(payload_start..self.end).unwrap_or_default();
        let filled = have.len();
        if let Some(dst) = payload.get_mut(..filled) {
            dst.copy_from_slice(have);
        }
        (self.start, self.end) = (0, 0);
        self.body = Some(Body { header, payload, filled, fds, truncated });
        Ok(None)
    }

    /// One receive: a peek, or an exact read within the message in progress.
    fn fill(&mut self, stream: &UnixStream, wait: Wait) -> Result<Filled, FrameError> {
        if self.mode == Mode::Unset {
            self.mode = Self::peek_mode(stream);
        }
        if self.body.is_none() && self.mode == Mode::Peek {
            let waits_with_too_much = self.in_message() || self.held_msgs > HOLD_MESSAGES || self.held > HOLD_BYTES;
            if self.held > 0 && waits_with_too_much {
                self.consume_seen(stream)?;
            }
            return self.peek(stream, wait);
        }
        self.consume_seen(stream)?;
        self.read_part(stream, wait)
    }

    fn peek_mode(stream: &UnixStream) -> Mode {
        match set_peek_offset(stream, 0) {
            Ok(()) => Mode::Peek,
            Err(e) => {
                tracing::debug!("no SO_PEEK_OFF ({e}): reading message by message");
                Mode::ExactOnly
            }
        }
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            (self.end, self.start) = (self.end - self.start, 0);
        }
    }

    fn recv_flags(wait: Wait) -> RecvFlags {
        if wait == Wait::NoWait {
            RecvFlags::DONTWAIT
        } else {
            RecvFlags::empty()
        }
    }

    /// Peeks whatever has arrived past what was seen into the buffer.
    fn peek(&mut self, stream: &UnixStream, wait: Wait) -> Result<Filled, FrameError> {
        self.compact();
        // The scratch buffer takes every held byte in one read.
        let room = (BUF_SIZE - self.end).min(self.scratch.len().saturating_sub(self.held));
        if room == 0 {
            self.consume_seen(stream)?;
            return Ok(Filled::Again);
        }
        let dst = self.buf.get_mut(self.end..self.end + room).unwrap_or_default();
        let mut none = RecvAncillaryBuffer::default();
        let msg =
            match recvmsg(stream, &mut [IoSliceMut::new(dst)], &mut none, RecvFlags::PEEK | Self::recv_flags(wait)) {
                Ok(m) => m,
                // A receive timeout, nothing there yet, or a signal. A sender may be waiting for room in its buffer
                // that the held bytes take: give it back before the caller waits again.
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {
                    self.consume_seen(stream)?;
                    return Ok(Filled::Nothing);
                }
                Err(e) => return Err(FrameError::Io(e.into())),
            };
        if msg.bytes == 0 {
            return Ok(Filled::Eof);
        }
        if msg.flags.contains(ReturnFlags::CTRUNC) {
            // Descriptors ride in these bytes: drop the peeked copy and read them again exactly.
            self.consume_seen(stream)?;
            self.mode = Mode::Exact { left: msg.bytes };
            return Ok(Filled::Again);
        }
        self.end += msg.bytes;
        self.held += msg.bytes;
        self.stalled_since = None;
        Ok(Filled::Bytes)
    }

    /// Reads the rest of the header in progress, or into the body: never past the message.
    fn read_part(&mut self, stream: &UnixStream, wait: Wait) -> Result<Filled, FrameError> {
        if self.body.is_none() {
            self.compact();
        }
        let dst: &mut [u8] = match &mut self.body {
            Some(b) => b.payload.get_mut(b.filled..).unwrap_or_default(),
            // parse() turns a whole header into a message or body mode, so less than a header is buffered.
            None => {
                let want = HEADER_SIZE.saturating_sub(self.end).max(1);
                self.buf.get_mut(self.end..self.end + want).unwrap_or_default()
            }
        };
        let mut control = RecvAncillaryBuffer::new(&mut self.control);
        let flags = RecvFlags::CMSG_CLOEXEC | Self::recv_flags(wait);
        let msg = match recvmsg(stream, &mut [IoSliceMut::new(dst)], &mut control, flags) {
            Ok(m) => m,
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => return Ok(Filled::Nothing),
            Err(e) => return Err(FrameError::Io(e.into())),
        };
        let mut got: Vec<Option<OwnedFd>> = Vec::new();
        if msg.flags.contains(ReturnFlags::CTRUNC) {
            got.push(None);
        }
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = m {
                got.extend(rights.map(Some));
            }
        }
        drop(control);
        if msg.bytes == 0 {
            return Ok(Filled::Eof); // descriptors without data cannot belong to a message: closed
        }
        self.stalled_since = None;
        let (fds, truncated) = match &mut self.body {
            Some(b) => {
                b.filled += msg.bytes;
                (&mut b.fds, &mut b.truncated)
            }
            None => {
                self.end += msg.bytes;
                (&mut self.fds, &mut self.fds_truncated)
            }
        };
        for fd in got {
            match fd {
                Some(fd) if fds.len() < self.limits.max_fds as usize => fds.push(fd),
                _ => *truncated = true, // over the limit (dropped here, so closed) or cut by the kernel
            }
        }
        if let Mode::Exact { left } = self.mode {
            let left = left.saturating_sub(msg.bytes);
            // The kernel's peek offset went past the bytes read again; peeking resumes from here.
            self.mode = if left == 0 { Self::peek_mode(stream) } else { Mode::Exact { left } };
        }
        Ok(Filled::Bytes)
    }
}

/// Reads one whole message, with the same reader as the server and the client ([`FrameReader::exact`]: no
/// read goes past the message, so the stream may go on with another reader). Between messages it blocks for
/// as long as the socket's receive timeout lets it (none: until the next message, the peer's close, or a
/// [`crate::stop::Stop`]), and a timeout there is [`FrameError::Timeout`]. On `BadSize` the header was
/// consumed but the body was not.
pub fn recv_message(stream: &UnixStream, limits: &FrameLimits) -> Result<Message, FrameError> {
    let deadline = stream.read_timeout()?.map(|t| Instant::now() + t);
    let mut reader = FrameReader::exact(*limits);
    loop {
        if let Some(m) = reader.next(stream, Wait::Block)? {
            return Ok(m);
        }
        // The receive timeout, or a signal (then the read goes on).
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(FrameError::Timeout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sock::send_message;
    use crate::wire::command;
    use std::io::Write;
    use std::os::fd::AsFd;

    fn limits() -> FrameLimits {
        FrameLimits { max_msg_size: 1 << 20, max_fds: 2, stall_timeout: Duration::from_millis(300) }
    }

    /// Both ways of reading: peeking ahead (what every Linux socket gets) and the exact reads of a socket
    /// that refuses SO_PEEK_OFF.
    const MODES: [Mode; 2] = [Mode::Unset, Mode::ExactOnly];

    fn reader(mode: Mode) -> FrameReader {
        FrameReader { mode, ..FrameReader::new(limits()) }
    }

    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().expect("socketpair");
        b.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        (a, b)
    }

    fn raw(id: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Header::command(id, command::REGION_READ, payload.len()).encode().to_vec();
        v.extend_from_slice(payload);
        v
    }

    fn next_blocking(r: &mut FrameReader, s: &UnixStream) -> Result<Message, FrameError> {
        for _ in 0..100 {
            if let Some(m) = r.next(s, Wait::Block)? {
                return Ok(m);
            }
        }
        Err(FrameError::Timeout)
    }

    #[test]
    fn several_messages_in_one_read_come_out_one_by_one_in_order() {
        for mode in MODES {
            let (mut tx, rx) = pair();
            let mut all = Vec::new();
            for id in 1..=3u16 {
                all.extend(raw(id, &vec![id as u8; id as usize * 5]));
            }
            tx.write_all(&all).expect("write");
            let mut r = reader(mode);
            for id in 1..=3u16 {
                let m = next_blocking(&mut r, &rx).expect("message");
                assert_eq!((m.header.msg_id, m.payload), (id, vec![id as u8; id as usize * 5]));
            }
            assert!(matches!(r.next(&rx, Wait::NoWait), Ok(None)));
            assert!(!r.in_message());
        }
    }

    #[test]
    fn a_message_larger_than_the_buffer_arrives_whole_through_body_mode() {
        for mode in MODES {
            let (tx, rx) = pair();
            let payload: Vec<u8> = (0..BUF_SIZE * 3 + 7).map(|i| (i % 251) as u8).collect();
            let p2 = payload.clone();
            let sender = std::thread::spawn(move || {
                let mut tx = tx;
                let m = raw(9, &p2);
                for piece in m.chunks(5000) {
                    tx.write_all(piece).expect("write");
                    std::thread::sleep(Duration::from_millis(2));
                }
                tx
            });
            let mut r = reader(mode);
            let m = next_blocking(&mut r, &rx).expect("message");
            assert_eq!(m.header.msg_id, 9);
            assert!(m.payload == payload);
            drop(sender.join());
        }
    }

    #[test]
    fn a_header_split_byte_by_byte_still_frames() {
        for mode in MODES {
            let (mut tx, rx) = pair();
            let mut r = reader(mode);
            let m = raw(4, &[7; 3]);
            let (last, head) = m.split_last().expect("not empty");
            for b in head {
                tx.write_all(std::slice::from_ref(b)).expect("write");
                assert!(r.next(&rx, Wait::NoWait).expect("no error").is_none());
                assert!(r.in_message());
            }
            tx.write_all(std::slice::from_ref(last)).expect("write");
            let got = next_blocking(&mut r, &rx).expect("message");
            assert_eq!((got.header.msg_id, got.payload), (4, vec![7; 3]));
            assert!(!r.in_message());
        }
    }

    /// (message id, descriptors) for each of `n` messages read.
    fn ids_and_fds(r: &mut FrameReader, rx: &UnixStream, n: usize) -> Vec<(u16, usize)> {
        (0..n).map(|_| next_blocking(r, rx).map(|m| (m.header.msg_id, m.fds.len())).expect("message")).collect()
    }

    fn null_fds(n: usize) -> Vec<std::fs::File> {
        (0..n).map(|_| std::fs::File::open("/dev/null").expect("open")).collect()
    }

    /// A whole message as bytes: header and `len` bytes of payload.
    fn encoded(id: u16, len: usize) -> Vec<u8> {
        raw(id, &vec![id as u8; len])
    }

    #[test]
    fn descriptors_go_to_the_message_they_were_sent_with() {
        for mode in MODES {
            let (tx, rx) = pair();
            let file = std::fs::File::open("/dev/null").expect("open");
            // One send per message (QEMU's pattern), all queued before the first read.
            send_message(&tx, &Header::command(1, command::DMA_MAP, 4), &[&[1; 4]], &[]).expect("send 1");
            send_message(&tx, &Header::command(2, command::DMA_MAP, 4), &[&[2; 4]], &[file.as_fd()]).expect("send 2");
            send_message(&tx, &Header::command(3, command::DMA_MAP, 4), &[&[3; 4]], &[]).expect("send 3");
            let mut r = reader(mode);
            assert_eq!(ids_and_fds(&mut r, &rx, 3), [(1, 0), (2, 1), (3, 0)]);
        }
    }

    #[test]
    fn descriptors_of_a_send_holding_several_messages_go_to_its_first_message() {
        for mode in MODES {
            let (tx, rx) = pair();
            let files = null_fds(2);
            let fds: Vec<_> = files.iter().map(|f| f.as_fd()).collect();
            // Message 1 alone; messages 2, 3 and 4 in one sendmsg carrying two descriptors; message 5 alone.
            send_message(&tx, &Header::command(1, command::REGION_READ, 16), &[&[1; 16]], &[]).expect("send 1");
            let (m3, m4) = (encoded(3, 16), encoded(4, 0));
            send_message(&tx, &Header::command(2, command::DMA_MAP, 32), &[&[2; 32], &m3, &m4], &fds)
                .expect("send 2-4");
            send_message(&tx, &Header::command(5, command::REGION_READ, 16), &[&[5; 16]], &[]).expect("send 5");
            let mut r = reader(mode);
            assert_eq!(ids_and_fds(&mut r, &rx, 5), [(1, 0), (2, 2), (3, 0), (4, 0), (5, 0)]);
            assert!(matches!(r.next(&rx, Wait::NoWait), Ok(None)));
        }
    }

    #[test]
    fn descriptors_are_attributed_right_in_every_grouping_of_the_same_messages() {
        for mode in MODES {
            // Four messages cut into sends at message boundaries in every possible way; a send carries one
            // descriptor when it begins at message 2 or 4, or begins at message 1 and holds message 2. A send's
            // descriptors belong to its first message (they ride on its first bytes).
            let sizes = [16usize, 0, 32, 8];
            for cuts in 0u32..8 {
                let (tx, rx) = pair();
                let files = null_fds(2);
                // Send starts: message 1 always; message k+2 when bit k of `cuts` is set.
                let starts: Vec<usize> = (0..4).filter(|&i| i == 0 || cuts & (1 << (i - 1)) != 0).collect();
                let mut expected = Vec::new();
                for (n, &first) in starts.iter().enumerate() {
                    let last = starts.get(n + 1).copied().unwrap_or(4);
                    let carries = first == 1 || first == 3 || (first == 0 && last > 1);
                    let bytes: Vec<u8> = (first..last).flat_map(|i| encoded(i as u16 + 1, sizes[i])).collect();
                    let fds = if carries { vec![files[n % 2].as_fd()] } else { vec![] };
                    // A send carrying descriptors gives them to its first message.
                    for i in first..last {
                        expected.push((i as u16 + 1, usize::from(carries && i == first)));
                    }
                    let (h, rest) = bytes.split_at(HEADER_SIZE);
                    let header = Header::decode(h.first_chunk().expect("header"));
                    send_message(&tx, &header, &[rest], &fds).expect("send");
                }
                let mut r = reader(mode);
                assert_eq!(ids_and_fds(&mut r, &rx, 4), expected, "sends starting at messages {starts:?}");
            }
        }
    }

    #[test]
    fn a_send_starting_inside_a_message_gives_its_descriptors_to_that_message() {
        for mode in MODES {
            let (mut tx, rx) = pair();
            let file = std::fs::File::open("/dev/null").expect("open");
            let m = encoded(6, 24);
            // The header and 8 payload bytes first, then the rest with a descriptor, then a message alone.
            tx.write_all(&m[..HEADER_SIZE + 8]).expect("write");
            let mut bytes = m[HEADER_SIZE + 8..].to_vec();
            bytes.extend_from_slice(&encoded(7, 4));
            send_raw(&tx, &bytes, &[file.as_fd()]);
            let mut r = reader(mode);
            assert_eq!(ids_and_fds(&mut r, &rx, 2), [(6, 1), (7, 0)]);
        }
    }

    /// One sendmsg of `bytes` with `fds` attached.
    fn send_raw(tx: &UnixStream, bytes: &[u8], fds: &[std::os::fd::BorrowedFd]) {
        use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
        let n = sendmsg(tx, &[std::io::IoSlice::new(bytes)], &mut control, SendFlags::empty()).expect("sendmsg");
        assert_eq!(n, bytes.len());
    }

    #[test]
    fn a_peer_with_the_smallest_send_buffer_can_always_send_its_next_message() {
        let (tx, rx) = pair();
        // Linux rounds this up to its minimum (4608 bytes: about six small sends in flight).
        rustix::net::sockopt::set_socket_send_buffer_size(&tx, 1).expect("SO_SNDBUF");
        let mut r = FrameReader::new(limits());
        for id in 1..=64u16 {
            // Non-blocking: a send that would wait for room means the reader holds the sender's buffer.
            let m = encoded(id, 16);
            let sent = rustix::net::send(&tx, &m, rustix::net::SendFlags::DONTWAIT).expect("room for the next message");
            assert_eq!(sent, m.len());
            let got = next_blocking(&mut r, &rx).expect("message");
            assert_eq!(got.header.msg_id, id);
        }
    }

    #[test]
    fn after_consume_seen_the_socket_polls_readable_only_for_new_bytes() {
        let (mut tx, rx) = pair();
        tx.write_all(&encoded(1, 8)).expect("write");
        let mut r = FrameReader::new(limits());
        assert_eq!(next_blocking(&mut r, &rx).expect("message").header.msg_id, 1);
        r.consume_seen(&rx).expect("consume");
        assert!(!crate::sock::wait_readable(&rx, Duration::ZERO).expect("poll"), "nothing new");
        tx.write_all(&encoded(2, 8)).expect("write");
        assert!(crate::sock::wait_readable(&rx, Duration::from_secs(1)).expect("poll"));
        assert_eq!(next_blocking(&mut r, &rx).expect("message").header.msg_id, 2);
    }

    #[test]
    fn descriptors_are_closed_when_their_message_is_dropped() {
        // Named memfds, so the check counts only this test's descriptors (other tests run alongside).
        let open_named = |name: &str| {
            std::fs::read_dir("/proc/self/fd")
                .expect("fds")
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy().contains(name))
                .count()
        };
        for (k, mode) in MODES.into_iter().enumerate() {
            let name = format!("frame-reader-drop-{}-{k}", std::process::id());
            {
                let (tx, rx) = pair();
                let files: Vec<OwnedFd> = (0..3)
                    .map(|_| rustix::fs::memfd_create(&name, rustix::fs::MemfdFlags::CLOEXEC).expect("memfd"))
                    .collect();
                let fds: Vec<_> = files.iter().map(|f| f.as_fd()).collect();
                let (m2, m3) = (encoded(2, 4), encoded(3, 4));
                send_message(&tx, &Header::command(1, command::DMA_MAP, 4), &[&[1; 4], &m2, &m3], &fds).expect("send");
                drop(fds);
                drop(files);
                let mut r = reader(mode);
                let got = ids_and_fds(&mut r, &rx, 3);
                assert_eq!(got, [(1, 2), (2, 0), (3, 0)], "two kept (max_fds), the third closed");
                assert_eq!(open_named(&name), 0, "the messages were dropped, and their descriptors with them");
            }
        }
    }

    #[test]
    fn descriptors_over_the_limit_are_closed_and_the_message_marked_truncated() {
        for mode in MODES {
            let (tx, rx) = pair();
            let files: Vec<std::fs::File> = (0..3).map(|_| std::fs::File::open("/dev/null").expect("open")).collect();
            let fds: Vec<_> = files.iter().map(|f| f.as_fd()).collect();
            send_message(&tx, &Header::command(5, command::DMA_MAP, 4), &[&[0; 4]], &fds).expect("send");
            let mut r = reader(mode);
            let m = next_blocking(&mut r, &rx).expect("message");
            // max_fds 2: the control buffer holds two, the kernel cuts the third (MSG_CTRUNC).
            assert!(m.fds_truncated);
            assert!(m.fds.len() <= 2);
        }
    }

    #[test]
    fn a_message_sent_from_more_parts_than_the_inline_iovec_arrives_intact() {
        for mode in MODES {
            let (tx, rx) = pair();
            let parts: Vec<Vec<u8>> = (0..12u8).map(|k| vec![k; usize::from(k) + 1]).collect();
            let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
            let len = parts.iter().map(|p| p.len()).sum();
            send_message(&tx, &Header::command(8, command::REGION_WRITE, len), &refs, &[]).expect("send");
            let m = next_blocking(&mut reader(mode), &rx).expect("message");
            assert_eq!((m.header.msg_id, m.payload), (8, parts.concat()));
        }
    }

    #[test]
    fn bad_sizes_are_reported_with_the_header() {
        for mode in MODES {
            for (size, what) in [(8u32, "below the header"), ((1 << 20) + 1, "above the limit")] {
                let (mut tx, rx) = pair();
                let mut h = Header::command(6, command::REGION_READ, 0);
                h.msg_size = size;
                tx.write_all(&h.encode()).expect("write");
                let mut r = reader(mode);
                match next_blocking(&mut r, &rx) {
                    Err(FrameError::BadSize { header, size: s, .. }) => {
                        assert_eq!((header.msg_id, s), (6, size), "{what}")
                    }
                    other => panic!("{what}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn end_of_stream_is_closed_between_messages_and_truncated_inside_one() {
        for mode in MODES {
            let (tx, rx) = pair();
            drop(tx);
            assert!(matches!(reader(mode).next(&rx, Wait::Block), Err(FrameError::Closed)));
            let (mut tx, rx) = pair();
            tx.write_all(&raw(1, &[0; 32])[..20]).expect("write");
            drop(tx);
            assert!(matches!(next_blocking(&mut reader(mode), &rx), Err(FrameError::Truncated)));
        }
    }

    #[test]
    fn a_peer_stalling_inside_a_message_times_out_but_an_idle_one_does_not() {
        for mode in MODES {
            let (mut tx, rx) = pair();
            let mut r = reader(mode);
            std::thread::sleep(Duration::from_millis(350));
            assert!(matches!(r.next(&rx, Wait::Block), Ok(None)), "idle between messages is fine");
            tx.write_all(&raw(1, &[0; 32])[..20]).expect("write");
            assert!(matches!(next_blocking(&mut r, &rx), Err(FrameError::Timeout)));
        }
    }
}
