//! Who reads the client's socket, and the replies and DMA requests it brings.
//!
//! A caller waiting for its reply reads the socket itself (it takes the reader role, a mutex around the
//! buffered [`FrameReader`]): the reply then reaches it without a thread hand-off, which cost a third of
//! a register round trip. Whatever else it reads on the way is dispatched: other callers' replies go to
//! their slots (and wake them), the server's DMA_READ/DMA_WRITE are answered from the memory registered
//! with `dma_map_backed`. Callers that find the role taken sleep until their reply is routed or the
//! role is free.
//!
//! The server may also send DMA requests while no caller waits (a device worker placing data). The idle
//! reader thread covers those: once no request has been made for [`QUIET`], it takes the role and polls
//! the socket together with an eventfd through which the next caller asks for the role back. While calls
//! keep coming it only wakes every [`QUIET`] to look, so it adds no wake-up to a round trip; a DMA
//! request that arrives between two calls of a busy caller waits at most about 2 x [`QUIET`].

#![forbid(unsafe_code)]

use std::fs::File;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, TryLockError};
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

use super::types::{ClientDmaBacking, ClientError, DmaProt};
use crate::device::Errno;
use crate::frame_reader::{FrameReader, Wait};
use crate::sock::{send_message, FrameError, Message};
use crate::sync::Unpoison;
use crate::wire::{command, DmaRw, Header};

/// How long no request must have been made before the idle reader takes the socket.
pub(crate) const QUIET: Duration = Duration::from_micros(500);
/// How often the idle reader, holding the role while a message is partly received, looks at the stall clock.
/// Between messages it waits for the socket or the kick alone (closing kicks it too).
const IDLE_POLL: Duration = Duration::from_millis(50);
/// Longest a caller sleeps before it looks at the reader role again (notifications normally wake it).
const FOLLOWER_SLICE: Duration = Duration::from_millis(20);
/// Longest receive timeout of the socket: how long the reading caller blocks before it looks at its deadline.
pub(crate) const READ_SLICE: Duration = Duration::from_millis(50);

/// A fd-less mapping the client serves itself.
pub(crate) struct Backed {
    pub iova: u64,
    pub size: u64,
    pub prot: DmaProt,
    pub backing: Arc<dyn ClientDmaBacking>,
    /// For fd maps: the file's (st_dev, st_ino) and the shared handle, so one file is held once.
    pub file: Option<((u64, u64), Arc<File>)>,
}

/// Answers DMA_READ/WRITE for an fd map with pread/pwrite: used when the server did not mmap the
/// file (it is not sealed against shrinking). A file that shrank gives EFAULT, never a fault.
pub(crate) struct FdBacking {
    pub file: Arc<File>,
    pub base: u64,
}

impl ClientDmaBacking for FdBacking {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let at = self.base.checked_add(offset).ok_or(libc::EFAULT)?;
        self.file.read_exact_at(buf, at).map_err(|_| libc::EFAULT)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let at = self.base.checked_add(offset).ok_or(libc::EFAULT)?;
        self.file.write_all_at(data, at).map_err(|_| libc::EFAULT)
    }
}

/// Reply slots by message id: `None` until the reply arrives. A slot missing while its caller waits means
/// closed. A list, not a map: it holds one slot per waiting caller, and hashing cost more than the scan.
#[derive(Default)]
struct Waiters {
    replies: Vec<(u16, Option<Message>)>,
    /// Callers sleeping on `wake`.
    sleepers: usize,
}

impl Waiters {
    fn slot(&mut self, id: u16) -> Option<&mut Option<Message>> {
        self.replies.iter_mut().find(|(i, _)| *i == id).map(|(_, m)| m)
    }
    fn remove(&mut self, id: u16) {
        if let Some(k) = self.replies.iter().position(|(i, _)| *i == id) {
            self.replies.swap_remove(k);
        }
    }
}

/// Why no reply came.
enum NoReply {
    Timeout,
    Closed,
}

pub(crate) struct Shared {
    pub stream: UnixStream,
    write_lock: Mutex<()>,
    /// The reader role.
    reader: Mutex<FrameReader>,
    waiters: Mutex<Waiters>,
    wake: Condvar,
    /// The idle reader's wait between looks (on `waiters`' lock), cut short by `fail`: dropping a client
    /// would otherwise wait out the rest of a [`QUIET`] sleep to join the thread.
    quiet: Condvar,
    /// Callers between registering a request and taking its reply.
    active: AtomicUsize,
    /// Requests made so far: the idle reader waits for this to stand still.
    calls: AtomicU64,
    /// The idle reader holds the role (and sits in poll): a caller kicks it through `kick`.
    idle_holds: AtomicBool,
    kick: OwnedFd,
    /// The socket's receive timeout, and whether it is the whole request timeout (so even the first read of a
    /// call could block past the deadline).
    slice: Duration,
    slice_is_timeout: bool,
    /// `ClientConfig::busy_poll`.
    busy_poll: Duration,
    pub backed: RwLock<Vec<Backed>>,
    pub closed: AtomicBool,
    max_xfer: u32,
}

/// Counts a caller as active for as long as it lives.
struct Active<'a>(&'a Shared);

impl<'a> Active<'a> {
    fn enter(shared: &'a Shared) -> Self {
        shared.active.fetch_add(1, Ordering::SeqCst);
        shared.calls.fetch_add(1, Ordering::SeqCst);
        Active(shared)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

fn to_timespec(d: Duration) -> Timespec {
    Timespec { tv_sec: d.as_secs().try_into().unwrap_or(i64::MAX), tv_nsec: d.subsec_nanos().into() }
}

impl Shared {
    /// Takes over `stream` and sets its receive timeout: a slice of `timeout`, at most [`READ_SLICE`].
    pub(crate) fn new(
        stream: UnixStream,
        reader: FrameReader,
        max_xfer: u32,
        timeout: Duration,
        busy_poll: Duration,
    ) -> std::io::Result<Self> {
        let kick = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let slice = timeout.min(READ_SLICE);
        stream.set_read_timeout(Some(slice))?;
        Ok(Shared {
            stream,
            write_lock: Mutex::new(()),
            reader: Mutex::new(reader),
            waiters: Mutex::new(Waiters::default()),
            wake: Condvar::new(),
            quiet: Condvar::new(),
            active: AtomicUsize::new(0),
            calls: AtomicU64::new(0),
            idle_holds: AtomicBool::new(false),
            kick,
            slice,
            slice_is_timeout: slice == timeout,
            busy_poll,
            backed: RwLock::new(Vec::new()),
            closed: AtomicBool::new(false),
            max_xfer,
        })
    }

    fn send(&self, header: &Header, parts: &[&[u8]], fds: &[BorrowedFd]) -> std::io::Result<()> {
        let _g = self.write_lock.lock().unpoison();
        send_message(&self.stream, header, parts, fds)
    }

    fn waiters(&self) -> MutexGuard<'_, Waiters> {
        self.waiters.lock().unpoison()
    }

    /// Sends one request and waits for its reply until `timeout`.
    pub(crate) fn round_trip(
        &self,
        ids: &AtomicU16,
        cmd: u16,
        parts: &[&[u8]],
        fds: &[BorrowedFd],
        timeout: Duration,
    ) -> Result<Message, ClientError> {
        let _active = Active::enter(self);
        let id = {
            let mut w = self.waiters();
            // Under the lock: `fail` sets the flag before it empties the slots, so either we see the flag
            // here or our slot is removed, which the wait below reports as closed.
            if self.closed.load(Ordering::Acquire) {
                return Err(ClientError::Disconnected);
            }
            // Ids wrap at 2^16; skip any still in flight.
            let mut id = ids.fetch_add(1, Ordering::Relaxed);
            while w.slot(id).is_some() {
                id = ids.fetch_add(1, Ordering::Relaxed);
            }
            w.replies.push((id, None));
            id
        };
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if let Err(e) = self.send(&Header::command(id, cmd, len), parts, fds) {
            self.waiters().remove(id);
            return Err(e.into());
        }
        match self.await_reply(id, Instant::now() + timeout) {
            Ok(m) => Ok(m),
            Err(NoReply::Timeout) => Err(ClientError::Timeout(cmd)),
            Err(NoReply::Closed) => Err(ClientError::Disconnected),
        }
    }

    fn await_reply(&self, id: u16, deadline: Instant) -> Result<Message, NoReply> {
        let mut first = true;
        loop {
            let mut w = self.waiters();
            match w.slot(id) {
                None => return Err(NoReply::Closed),
                Some(slot) => {
                    if let Some(m) = slot.take() {
                        w.remove(id);
                        return Ok(m);
                    }
                }
            }
            // The first pass skips the clock: the deadline was just set.
            if !first && Instant::now() >= deadline {
                w.remove(id);
                return Err(NoReply::Timeout);
            }
            first = false;
            // try_lock never blocks, so holding `waiters` here cannot deadlock with a reader routing a reply.
            let role = match self.reader.try_lock() {
                Ok(r) => Some(r),
                Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            };
            match role {
                Some(r) => {
                    drop(w);
                    if let Some(m) = self.lead(r, id, deadline)? {
                        return Ok(m);
                    }
                }
                None => {
                    if self.idle_holds.load(Ordering::SeqCst) {
                        self.kick_idle();
                    }
                    w.sleepers += 1;
                    let slice = deadline.saturating_duration_since(Instant::now()).min(FOLLOWER_SLICE);
                    let (mut w, _) = self.wake.wait_timeout(w, slice).unpoison();
                    w.sleepers -= 1;
                }
            }
        }
    }

    /// Reads as the role holder until our reply (`Some`), the deadline (`None`) or the end.
    ///
    /// A read blocks for at most the socket's receive timeout (`slice`), which the kernel rounds up to its tick;
    /// when the deadline is nearer than a slice, the rest is waited for exactly (poll) before reading, so a call
    /// that times out takes its timeout. With the default timeout (longer than a slice) a reply that comes in
    /// time costs no clock read and no poll.
    fn lead(&self, mut r: MutexGuard<'_, FrameReader>, id: u16, deadline: Instant) -> Result<Option<Message>, NoReply> {
        let mut near = self.slice_is_timeout;
        loop {
            if near {
                let left = deadline.saturating_duration_since(Instant::now());
                if left < self.slice {
                    // Peeked bytes would keep the socket readable: poll must see only new ones.
                    if let Err(e) = r.consume_seen(&self.stream) {
                        tracing::debug!("client connection ends: {e}");
                        self.fail();
                        self.release(r);
                        return Err(NoReply::Closed);
                    }
                    let ready = !left.is_zero() && crate::sock::wait_readable(&self.stream, left).unwrap_or(false);
                    if !ready {
                        if Instant::now() >= deadline {
                            self.release(r);
                            return Ok(None);
                        }
                        continue; // a signal cut the wait short
                    }
                }
            }
            match self.next_message(&mut r, deadline) {
                Ok(Some(m)) if m.header.is_reply() && m.header.msg_id == id => {
                    self.release(r);
                    self.waiters().remove(id);
                    return Ok(Some(m));
                }
                Ok(Some(m)) => {
                    if let Err(e) = self.dispatch(m) {
                        tracing::debug!("client cannot answer the server: {e}");
                        self.fail();
                        self.release(r);
                        return Err(NoReply::Closed);
                    }
                    near = true;
                }
                Ok(None) => near = true,
                Err(e) => {
                    tracing::debug!("client connection ends: {e}");
                    self.fail();
                    self.release(r);
                    return Err(NoReply::Closed);
                }
            }
        }
    }

    /// The next message: polled for without blocking for up to `busy_poll` (not past `deadline`) first,
    /// then read blocking for at most a slice.
    fn next_message(&self, r: &mut FrameReader, deadline: Instant) -> Result<Option<Message>, FrameError> {
        if !self.busy_poll.is_zero() {
            if let Some(m) = r.poll_until(&self.stream, (Instant::now() + self.busy_poll).min(deadline))? {
                return Ok(Some(m));
            }
        }
        r.next(&self.stream, Wait::Block)
    }

    /// Gives the role up and wakes the callers sleeping for it.
    fn release(&self, r: MutexGuard<'_, FrameReader>) {
        drop(r);
        if self.waiters().sleepers > 0 {
            self.wake.notify_all();
        }
    }

    /// One message that is not the reader's own reply.
    fn dispatch(&self, msg: Message) -> std::io::Result<()> {
        let h = msg.header;
        if h.is_reply() {
            let mut w = self.waiters();
            // A reply nobody waits for (timed out) is dropped, with any descriptors it carried.
            if let Some(slot) = w.slot(h.msg_id) {
                *slot = Some(msg);
                if w.sleepers > 0 {
                    self.wake.notify_all();
                }
            }
            return Ok(());
        }
        if h.no_reply() {
            return Ok(());
        }
        let reply = if msg.fds.is_empty() { self.answer_dma(&msg) } else { Err(libc::EINVAL) };
        match reply {
            Ok(p) => self.send(&Header::reply(&h, p.len()), &[&p], &[]),
            Err(e) => self.send(&Header::error_reply(&h, e), &[], &[]),
        }
    }

    /// The connection is unusable: every waiting caller wakes with "closed", later calls fail at once.
    pub(crate) fn fail(&self) {
        self.closed.store(true, Ordering::Release);
        // Under the lock the idle reader checks `closed` with, so its wait cannot miss this.
        self.waiters().replies.clear();
        self.wake.notify_all();
        self.quiet.notify_all();
        self.kick_idle();
    }

    fn kick_idle(&self) {
        // Non-blocking; the counter is drained at every kick it delivers, so it cannot overflow, and a caller
        // waiting for the role kicks again at each of its looks.
        let _ = rustix::io::write(&self.kick, &1u64.to_ne_bytes());
    }

    /// Serves the server's requests while no caller waits; ends when the connection is closed.
    pub(crate) fn idle_reader(&self) {
        let mut seen = u64::MAX;
        while !self.closed.load(Ordering::Acquire) {
            let w = self.waiters();
            drop(self.quiet.wait_timeout_while(w, QUIET, |_| !self.closed.load(Ordering::Acquire)).unpoison());
            if self.closed.load(Ordering::Acquire) {
                break;
            }
            let calls = self.calls.load(Ordering::SeqCst);
            if calls != seen || self.active.load(Ordering::SeqCst) > 0 {
                seen = calls;
                continue;
            }
            let r = match self.reader.try_lock() {
                Ok(r) => r,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => continue,
            };
            // Paired with `Active::enter` then the `idle_holds` load in `await_reply` (both SeqCst): either
            // the caller sees the flag and kicks, or we see the caller and give the role straight back.
            self.idle_holds.store(true, Ordering::SeqCst);
            let r = if self.active.load(Ordering::SeqCst) == 0 { self.hold_idle(r) } else { r };
            self.idle_holds.store(false, Ordering::SeqCst);
            self.release(r);
        }
    }

    fn hold_idle<'a>(&'a self, mut r: MutexGuard<'a, FrameReader>) -> MutexGuard<'a, FrameReader> {
        while !self.closed.load(Ordering::Acquire) && self.active.load(Ordering::SeqCst) == 0 {
            // Peeked bytes would keep the socket readable: poll must see only new ones.
            if let Err(e) = r.consume_seen(&self.stream) {
                tracing::debug!("client connection ends: {e}");
                self.fail();
                return r;
            }
            let mut fds = [PollFd::new(&self.stream, PollFlags::IN), PollFd::new(&self.kick, PollFlags::IN)];
            let stall_check = r.in_message().then(|| to_timespec(IDLE_POLL));
            match poll(&mut fds, stall_check.as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    tracing::debug!("client idle reader cannot poll: {e}");
                    self.fail();
                    return r;
                }
            }
            if !fds[1].revents().is_empty() {
                let mut b = [0u8; 8];
                let _ = rustix::io::read(&self.kick, &mut b);
                return r;
            }
            // Also after a stall check's timeout: `next` notices a peer stalled inside a message.
            loop {
                match r.next(&self.stream, Wait::NoWait) {
                    Ok(Some(m)) => {
                        if let Err(e) = self.dispatch(m) {
                            tracing::debug!("client cannot answer the server: {e}");
                            self.fail();
                            return r;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!("client connection ends: {e}");
                        self.fail();
                        return r;
                    }
                }
            }
        }
        r
    }

    /// Shuts the connection down from our side and wakes everyone.
    pub(crate) fn close(&self) {
        self.fail();
        // Bytes peeked but left unread would turn the server's end of stream into ECONNRESET. `fail` woke
        // the idle reader, so the role comes free at once.
        let mut r = self.reader.lock().unpoison();
        let _ = r.consume_seen(&self.stream);
        drop(r);
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    fn backed(&self) -> std::sync::RwLockReadGuard<'_, Vec<Backed>> {
        self.backed.read().unpoison()
    }

    /// Finds the backing holding all of `[addr, addr+count)` with permission `need`.
    fn serve_dma(
        &self,
        addr: u64,
        count: u64,
        need: DmaProt,
        op: impl FnOnce(&dyn ClientDmaBacking, u64) -> Result<(), Errno>,
    ) -> Result<(), Errno> {
        let backed = self.backed();
        let end = addr.checked_add(count).ok_or(libc::EFAULT)?;
        let b = backed.iter().find(|b| addr >= b.iova && end <= b.iova.saturating_add(b.size)).ok_or(libc::EFAULT)?;
        if !b.prot.contains(need) {
            return Err(libc::EPERM);
        }
        op(&*b.backing, addr - b.iova)
    }

    fn answer_dma(&self, msg: &Message) -> Result<Vec<u8>, Errno> {
        let (rw, data) = DmaRw::decode(&msg.payload).map_err(|_| libc::EINVAL)?;
        if rw.count == 0 || rw.count > u64::from(self.max_xfer) {
            return Err(libc::EINVAL);
        }
        match msg.header.command {
            command::DMA_READ => {
                if !data.is_empty() {
                    return Err(libc::EINVAL);
                }
                let mut out = rw.encode();
                out.resize(out.len() + rw.count as usize, 0);
                let dst = out.get_mut(crate::wire::DMA_RW_SIZE..).ok_or(libc::EINVAL)?;
                self.serve_dma(rw.address, rw.count, DmaProt::READ, |b, off| b.read(off, dst))?;
                Ok(out)
            }
            command::DMA_WRITE => {
                if data.len() as u64 != rw.count {
                    return Err(libc::EINVAL);
                }
                self.serve_dma(rw.address, rw.count, DmaProt::WRITE, |b, off| b.write(off, data))?;
                Ok(rw.encode())
            }
            _ => Err(libc::ENOSYS),
        }
    }
}
