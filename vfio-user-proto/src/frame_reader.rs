//! Buffered message reading for the hot loops (the server's read loop, the client's reader role).
//!
//! [`crate::sock::recv_message`] reads the header and then the payload, two `recvmsg` per message. A
//! register round trip is two small messages, so those extra calls were a fifth of its cost. Here one
//! `recvmsg` fills a buffer with whatever has arrived, usually a whole message and sometimes several;
//! messages are cut from the buffer. A message larger than what is buffered switches to body mode: the
//! rest is read straight into its payload with exact-length reads, so big transfers are not copied twice
//! and the buffer stays small.
//!
//! Descriptors: Linux ends a stream `recvmsg` right after the segment that carried SCM_RIGHTS, and a
//! sender attaches them to the first bytes of its message, so the descriptors of one read belong to the
//! message holding the read's last byte. They are queued with that stream offset and handed to the
//! message that covers it. At most `max_fds` are kept per message; the rest are closed and the message is
//! marked `fds_truncated`, as is one whose descriptors the kernel cut (MSG_CTRUNC).

use std::collections::VecDeque;
use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};

use crate::sock::{FrameError, Message};
use crate::wire::{Header, HEADER_SIZE};

/// Holds any small message whole (REGION_WRITE_MULTI's 200 entries are the largest fixed part).
const BUF_SIZE: usize = 16 * 1024;

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
    /// A blocking `recvmsg`: returns when data arrives or at the socket's receive timeout (SO_RCVTIMEO),
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

pub struct FrameReader {
    limits: FrameLimits,
    buf: Box<[u8]>,
    /// Unparsed bytes are `buf[start..end]`.
    start: usize,
    end: usize,
    /// Bytes received on the stream so far: the stream offset just past the last byte read.
    received: u64,
    /// Descriptors not yet given to a message, keyed by the stream offset of the last byte of the read
    /// that brought them; `None` stands for descriptors that were cut or dropped.
    fds: VecDeque<(u64, Option<OwnedFd>)>,
    body: Option<Body>,
    control: Vec<MaybeUninit<u8>>,
    /// Since when the message in progress has been waiting for more bytes (the stall clock), set when a read
    /// first finds nothing and cleared by every read that brings bytes: no clock read on the fast path.
    stalled_since: Option<Instant>,
}

enum Filled {
    Bytes,
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
            received: 0,
            fds: VecDeque::new(),
            body: None,
            control: vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds))],
            stalled_since: None,
        }
    }

    /// Bytes of a message have been received but not the whole message.
    pub fn in_message(&self) -> bool {
        self.body.is_some() || self.end > self.start
    }

    /// The next complete message: from the buffer if one is there, otherwise after reading. `Ok(None)`
    /// when nothing complete has arrived (with [`Wait::Block`]: by the receive timeout, or a signal).
    /// After `BadSize` the stream cannot be resynchronised and the reader must not be used further.
    pub fn next(&mut self, stream: &UnixStream, wait: Wait) -> Result<Option<Message>, FrameError> {
        loop {
            if let Some(m) = self.parse()? {
                return Ok(Some(m));
            }
            match self.fill(stream, wait)? {
                Filled::Bytes => {}
                Filled::Eof if self.in_message() => return Err(FrameError::Truncated),
                Filled::Eof => return Err(FrameError::Closed),
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
        let avail = self.end - self.start;
        // Stream offset just past this message.
        let msg_end = (self.received - avail as u64) + size as u64;
        let (fds, truncated) = self.take_fds(msg_end);
        let payload_start = self.start + HEADER_SIZE;
        if avail >= size {
            let payload = self.buf.get(payload_start..self.start + size).unwrap_or_default().to_vec();
            self.start += size;
            if self.start == self.end {
                (self.start, self.end) = (0, 0);
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

    /// The queued descriptors that arrived with bytes before `msg_end`, at most `max_fds` of them.
    fn take_fds(&mut self, msg_end: u64) -> (Vec<OwnedFd>, bool) {
        let (mut fds, mut truncated) = (Vec::new(), false);
        while self.fds.front().is_some_and(|(at, _)| *at < msg_end) {
            match self.fds.pop_front() {
                Some((_, Some(fd))) if fds.len() < self.limits.max_fds as usize => fds.push(fd),
                _ => truncated = true, // over the limit (dropped here, so closed) or cut by the kernel
            }
        }
        (fds, truncated)
    }

    /// One `recvmsg` into the body being read or into the buffer.
    fn fill(&mut self, stream: &UnixStream, wait: Wait) -> Result<Filled, FrameError> {
        let mut flags = RecvFlags::CMSG_CLOEXEC;
        if wait == Wait::NoWait {
            flags |= RecvFlags::DONTWAIT;
        }
        let dst: &mut [u8] = match &mut self.body {
            Some(b) => b.payload.get_mut(b.filled..).unwrap_or_default(),
            None => {
                if self.start > 0 {
                    self.buf.copy_within(self.start..self.end, 0);
                    (self.end, self.start) = (self.end - self.start, 0);
                }
                self.buf.get_mut(self.end..).unwrap_or_default()
            }
        };
        let mut control = RecvAncillaryBuffer::new(&mut self.control);
        let msg = match recvmsg(stream, &mut [IoSliceMut::new(dst)], &mut control, flags) {
            Ok(m) => m,
            // A receive timeout, nothing there yet, or a signal: the caller decides whether to wait on.
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
        self.received += msg.bytes as u64;
        self.stalled_since = None;
        match &mut self.body {
            Some(b) => {
                b.filled += msg.bytes;
                for fd in got {
                    match fd {
                        Some(fd) if b.fds.len() < self.limits.max_fds as usize => b.fds.push(fd),
                        _ => b.truncated = true,
                    }
                }
            }
            None => {
                self.end += msg.bytes;
                // Bounded: a read happens only while fewer than a header's bytes are buffered, and each read
                // brings at least one byte, so at most HEADER_SIZE reads' descriptors wait here.
                if !got.is_empty() {
                    let at = self.received - 1;
                    self.fds.extend(got.into_iter().map(|fd| (at, fd)));
                }
            }
        }
        Ok(Filled::Bytes)
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
        let (mut tx, rx) = pair();
        let mut all = Vec::new();
        for id in 1..=3u16 {
            all.extend(raw(id, &vec![id as u8; id as usize * 5]));
        }
        tx.write_all(&all).expect("write");
        let mut r = FrameReader::new(limits());
        for id in 1..=3u16 {
            let m = next_blocking(&mut r, &rx).expect("message");
            assert_eq!((m.header.msg_id, m.payload), (id, vec![id as u8; id as usize * 5]));
        }
        assert!(matches!(r.next(&rx, Wait::NoWait), Ok(None)));
        assert!(!r.in_message());
    }

    #[test]
    fn a_message_larger_than_the_buffer_arrives_whole_through_body_mode() {
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
        let mut r = FrameReader::new(limits());
        let m = next_blocking(&mut r, &rx).expect("message");
        assert_eq!(m.header.msg_id, 9);
        assert!(m.payload == payload);
        drop(sender.join());
    }

    #[test]
    fn a_header_split_byte_by_byte_still_frames() {
        let (mut tx, rx) = pair();
        let mut r = FrameReader::new(limits());
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

    #[test]
    fn descriptors_go_to_the_message_they_were_sent_with() {
        let (tx, rx) = pair();
        let file = std::fs::File::open("/dev/null").expect("open");
        // Message 1 without fds, message 2 with one, message 3 without: sent back to back.
        send_message(&tx, &Header::command(1, command::DMA_MAP, 4), &[&[1; 4]], &[]).expect("send 1");
        send_message(&tx, &Header::command(2, command::DMA_MAP, 4), &[&[2; 4]], &[file.as_fd()]).expect("send 2");
        send_message(&tx, &Header::command(3, command::DMA_MAP, 4), &[&[3; 4]], &[]).expect("send 3");
        let mut r = FrameReader::new(limits());
        let got: Vec<(u16, usize)> = (0..3)
            .map(|_| next_blocking(&mut r, &rx).map(|m| (m.header.msg_id, m.fds.len())).expect("message"))
            .collect();
        assert_eq!(got, [(1, 0), (2, 1), (3, 0)]);
    }

    #[test]
    fn descriptors_over_the_limit_are_closed_and_the_message_marked_truncated() {
        let (tx, rx) = pair();
        let files: Vec<std::fs::File> = (0..3).map(|_| std::fs::File::open("/dev/null").expect("open")).collect();
        let fds: Vec<_> = files.iter().map(|f| f.as_fd()).collect();
        send_message(&tx, &Header::command(5, command::DMA_MAP, 4), &[&[0; 4]], &fds).expect("send");
        let mut r = FrameReader::new(limits());
        let m = next_blocking(&mut r, &rx).expect("message");
        // max_fds 2: the control buffer holds two, the kernel cuts the third (MSG_CTRUNC).
        assert!(m.fds_truncated);
        assert!(m.fds.len() <= 2);
    }

    #[test]
    fn a_message_sent_from_more_parts_than_the_inline_iovec_arrives_intact() {
        let (tx, rx) = pair();
        let parts: Vec<Vec<u8>> = (0..12u8).map(|k| vec![k; usize::from(k) + 1]).collect();
        let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        let len = parts.iter().map(|p| p.len()).sum();
        send_message(&tx, &Header::command(8, command::REGION_WRITE, len), &refs, &[]).expect("send");
        let m = next_blocking(&mut FrameReader::new(limits()), &rx).expect("message");
        assert_eq!((m.header.msg_id, m.payload), (8, parts.concat()));
    }

    #[test]
    fn bad_sizes_are_reported_with_the_header() {
        for (size, what) in [(8u32, "below the header"), ((1 << 20) + 1, "above the limit")] {
            let (mut tx, rx) = pair();
            let mut h = Header::command(6, command::REGION_READ, 0);
            h.msg_size = size;
            tx.write_all(&h.encode()).expect("write");
            let mut r = FrameReader::new(limits());
            match next_blocking(&mut r, &rx) {
                Err(FrameError::BadSize { header, size: s, .. }) => assert_eq!((header.msg_id, s), (6, size), "{what}"),
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn end_of_stream_is_closed_between_messages_and_truncated_inside_one() {
        let (tx, rx) = pair();
        drop(tx);
        assert!(matches!(FrameReader::new(limits()).next(&rx, Wait::Block), Err(FrameError::Closed)));
        let (mut tx, rx) = pair();
        tx.write_all(&raw(1, &[0; 32])[..20]).expect("write");
        drop(tx);
        assert!(matches!(next_blocking(&mut FrameReader::new(limits()), &rx), Err(FrameError::Truncated)));
    }

    #[test]
    fn a_peer_stalling_inside_a_message_times_out_but_an_idle_one_does_not() {
        let (mut tx, rx) = pair();
        let mut r = FrameReader::new(limits());
        std::thread::sleep(Duration::from_millis(350));
        assert!(matches!(r.next(&rx, Wait::Block), Ok(None)), "idle between messages is fine");
        tx.write_all(&raw(1, &[0; 32])[..20]).expect("write");
        assert!(matches!(next_blocking(&mut r, &rx), Err(FrameError::Timeout)));
    }
}
