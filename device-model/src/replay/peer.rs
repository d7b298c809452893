//! The replay's side of the socket: sends the recorded client messages, and sorts what the server sends back
//! into replies (by message id) and the server's own DMA requests (in order).

#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vfio_user_proto::frame_reader::{recv_message, FrameLimits};
use vfio_user_proto::sock::{send_message, Message};
use vfio_user_proto::wire::Header;

/// Largest message accepted from the server (a DMA_WRITE of its largest transfer and then some).
const MAX_MSG: u32 = (1 << 20) + 8192;

pub(super) struct Peer {
    stream: UnixStream,
    incoming: Receiver<Message>,
    replies: HashMap<u16, VecDeque<Message>>,
    requests: VecDeque<Message>,
    closed: bool,
    reader: Option<JoinHandle<()>>,
}

impl Peer {
    pub fn new(stream: UnixStream) -> std::io::Result<Peer> {
        let read_side = stream.try_clone()?;
        let (tx, incoming) = channel();
        let reader = std::thread::Builder::new().name("replay-reader".into()).spawn(move || {
            let limits = FrameLimits { max_msg_size: MAX_MSG, max_fds: 253, stall_timeout: Duration::from_secs(10) };
            // Blocks until the next message; `close` shuts the socket down, which ends it.
            while let Ok(m) = recv_message(&read_side, &limits) {
                if tx.send(m).is_err() {
                    break;
                }
            }
        })?;
        Ok(Peer {
            stream,
            incoming,
            replies: HashMap::new(),
            requests: VecDeque::new(),
            closed: false,
            reader: Some(reader),
        })
    }

    pub fn send(&self, header: &Header, payload: &[u8], fds: &[OwnedFd]) -> std::io::Result<()> {
        let fds: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        send_message(&self.stream, header, &[payload], &fds)
    }

    /// Sorts one incoming message, waiting at most `wait`; false on timeout or close.
    fn pump(&mut self, wait: Duration) -> bool {
        match self.incoming.recv_timeout(wait) {
            Ok(m) => {
                if m.header.is_reply() {
                    self.replies.entry(m.header.msg_id).or_default().push_back(m);
                } else {
                    self.requests.push_back(m);
                }
                true
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => {
                self.closed = true;
                false
            }
        }
    }

    /// The reply to `id`, within `wait`; `on_slow` runs once if it takes longer than `slow`.
    pub fn reply(
        &mut self,
        id: u16,
        wait: Duration,
        slow: Duration,
        mut on_slow: impl FnMut(&mut Peer),
    ) -> Option<Message> {
        let start = Instant::now();
        let mut slowed = false;
        loop {
            if let Some(m) = self.replies.get_mut(&id).and_then(VecDeque::pop_front) {
                return Some(m);
            }
            if self.closed || start.elapsed() >= wait {
                return None;
            }
            if !slowed && start.elapsed() >= slow {
                slowed = true;
                on_slow(self);
            }
            self.pump(Duration::from_millis(5));
        }
    }

    /// The server's next DMA request, within `wait`.
    pub fn request(&mut self, wait: Duration) -> Option<Message> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(m) = self.requests.pop_front() {
                return Some(m);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if self.closed || left.is_zero() {
                return None;
            }
            self.pump(left.min(Duration::from_millis(50)));
        }
    }

    /// Whether a DMA request is waiting, after sorting what has arrived.
    pub fn has_request(&mut self) -> bool {
        while self.pump(Duration::ZERO) {}
        !self.requests.is_empty()
    }

    /// Requests that arrived and were not asked for.
    pub fn pending_requests(&mut self) -> usize {
        while self.pump(Duration::ZERO) {}
        self.requests.len()
    }

    /// Ends the connection: the server sees the client leave.
    pub fn close(self) {
        drop(self);
    }
}

impl Drop for Peer {
    /// Shutting the socket down ends the reader's blocked read, so the join is prompt.
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}
