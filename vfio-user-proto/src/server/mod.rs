//! The vfio-user server: serves one [`Device`] to one client at a time.
//!
//! Per connection, the calling thread reads the socket and answers requests (register accesses call the
//! device directly); device worker threads send DMA_READ/DMA_WRITE on the same socket and wait for the
//! reply, which the reading thread routes to them by message id. On disconnect the connection's DMA
//! space is closed (mappings dropped, waiting workers woken with an error), the IRQ eventfds are closed
//! and the device is detached, which resets it.

#![forbid(unsafe_code)]

mod config;
mod conn;
mod outbound;
mod peer;
mod poll;

use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use thiserror::Error;

use crate::device::{Device, DeviceContext};
use crate::dma_space::{DmaSpace, MessageDma};
use crate::frame_reader::{FrameLimits, FrameReader, Wait};
use crate::irq::IrqState;
use crate::record::{RecordingDma, Session};
use crate::sock::{FrameError, SCM_MAX_FD};
use crate::stop::Stop;
use crate::wire::{Header, HEADER_SIZE};

pub use config::ServerConfig;
use conn::Conn;
use outbound::Outbound;
pub use peer::{Peer, PeerError, PeerPolicy, MODE_GROUP_WRITE, MODE_OTHER_WRITE};
use poll::BusyPoll;

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("connection closed: {0}")]
    Frame(#[from] FrameError),
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
    #[error("another client is being served")]
    Busy,
    /// A device method panicked; the connection was closed and the device detached.
    #[error("device panicked while serving a request")]
    DevicePanic,
    /// The peer is not allowed on this socket; it was closed unserved (and counted in [`PeerPolicy`]).
    #[error(transparent)]
    Peer(#[from] PeerError),
}

/// Makes [`Server::serve`] (and a running connection) return promptly: it shuts down the listening
/// socket and the connection, whose threads block on them with no timeout ([`crate::stop`]).
#[derive(Clone)]
pub struct ShutdownHandle(Stop);

impl ShutdownHandle {
    pub fn shutdown(&self) {
        self.0.stop();
    }

    /// Sockets a shutdown would shut down now: the listener once `serve` has taken it, and the connection
    /// while one is served (each holds a duplicate descriptor meanwhile).
    pub fn watched_sockets(&self) -> usize {
        self.0.watched()
    }
}

pub struct Server {
    device: Arc<dyn Device>,
    config: ServerConfig,
    stop: Stop,
    /// One client at a time: the device has one context.
    busy: Mutex<()>,
}

/// How long `serve` backs off after an accept error other than "no connection" (EMFILE and the like).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
const MIN_TIMEOUT: Duration = Duration::from_millis(1);

impl Server {
    pub fn new(device: Arc<dyn Device>, mut config: ServerConfig) -> Self {
        config.max_msg_fds = config.max_msg_fds.clamp(1, SCM_MAX_FD);
        config.max_data_xfer_size = config.max_data_xfer_size.max(1);
        // A zero socket timeout would mean "none" to the kernel (and is refused by std).
        config.dma_timeout = config.dma_timeout.max(MIN_TIMEOUT);
        config.stall_timeout = config.stall_timeout.max(MIN_TIMEOUT);
        Server { device, config, stop: Stop::new(), busy: Mutex::new(()) }
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.stop.clone())
    }

    /// Accepts and serves clients one after another until the shutdown handle fires. Blocks in `accept`
    /// while no client is connected: an idle server wakes for nothing.
    pub fn serve(&self, listener: UnixListener) -> std::io::Result<()> {
        listener.set_nonblocking(false)?;
        let _watch = self.stop.watch(&listener)?;
        while !self.stop.is_stopped() {
            match listener.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = stream.set_nonblocking(false) {
                        tracing::warn!("cannot use accepted socket: {e}");
                        continue;
                    }
                    match self.serve_connection(stream) {
                        Ok(()) => tracing::info!("client disconnected"),
                        // Logged (rate-limited) by the policy.
                        Err(ServerError::Peer(_)) => {}
                        Err(e) => tracing::warn!("client dropped: {e}"),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // The shutdown handle shut the listener down (EINVAL).
                Err(_) if self.stop.is_stopped() => {}
                Err(e) => {
                    // EMFILE and friends pass; keep serving.
                    tracing::warn!("accept failed: {e}");
                    std::thread::sleep(ACCEPT_BACKOFF);
                }
            }
        }
        Ok(())
    }

    /// Serves one connected client until it disconnects, then detaches (and so resets) the device. A peer the
    /// configured [`PeerPolicy`] refuses is closed at once, unserved.
    pub fn serve_connection(&self, stream: UnixStream) -> Result<(), ServerError> {
        self.config.peers.admit(&stream)?;
        let _busy = match self.busy.try_lock() {
            Ok(g) => g,
            // A previous connection's device panic poisoned the lock; the device was detached since.
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(ServerError::Busy),
        };
        // A stop shuts the connection down, which ends its blocked read.
        let _watch = self.stop.watch(&stream)?;
        stream.set_write_timeout(Some(self.config.dma_timeout))?;
        let out = Arc::new(Outbound::new(stream.try_clone()?, self.config.dma_timeout, self.config.max_data_xfer_size));
        let messages: Arc<dyn MessageDma> = out.clone();
        let dma =
            Arc::new(DmaSpace::new(self.config.max_dma_maps, Some(messages)).with_mmap_limits(self.config.mmap_limits));
        let irq = Arc::new(IrqState::new());
        let session = self.config.recorder.as_ref().and_then(|r| match r.begin() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("cannot record this session: {e}");
                None
            }
        });
        let device_dma: Arc<dyn crate::dma::DmaAccess> = match &session {
            Some(s) => Arc::new(RecordingDma::new(dma.clone(), s.clone())),
            None => dma.clone(),
        };
        // A device bug must not take the whole server down: contain it to this connection.
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            self.device.attach(DeviceContext { dma: device_dma, irq: irq.clone() });
            self.read_loop(&stream, &out, &dma, &irq, session.as_ref())
        }))
        .unwrap_or_else(|_| {
            tracing::error!("device panicked; closing the connection");
            Err(ServerError::DevicePanic)
        });
        // Order matters: wake workers blocked on DMA first, so the device can stop its work in detach.
        out.close();
        dma.close();
        irq.clear();
        // The session ends with the client: what the device does while it detaches belongs to no session (a
        // replay's device detaches only once the replay is over).
        if let (Some(r), Some(_)) = (&self.config.recorder, &session) {
            r.end();
        }
        if std::panic::catch_unwind(AssertUnwindSafe(|| self.device.detach())).is_err() {
            tracing::error!("device panicked in detach");
        }
        let _ = stream.shutdown(std::net::Shutdown::Both);
        result
    }

    fn read_loop(
        &self,
        stream: &UnixStream,
        out: &Outbound,
        dma: &DmaSpace,
        irq: &IrqState,
        session: Option<&Arc<Session>>,
    ) -> Result<(), ServerError> {
        // A blocking read per message, with no poll first and no timeout between messages (a stop shuts the
        // socket down); inside a message the reader's stall clock bounds it.
        stream.set_read_timeout(None)?;
        let limits = FrameLimits {
            max_msg_size: self.config.max_msg_size(),
            max_fds: self.config.max_msg_fds,
            stall_timeout: self.config.stall_timeout,
        };
        let mut reader = if self.config.exact_reads { FrameReader::exact(limits) } else { FrameReader::new(limits) };
        let mut conn = Conn::new(&*self.device, &self.config, out, dma, irq, session);
        let result = self.serve_messages(stream, &mut reader, &mut conn, out);
        // Bytes peeked but left unread would turn the client's end of stream into ECONNRESET.
        let _ = reader.consume_seen(stream);
        result
    }

    fn serve_messages(
        &self,
        stream: &UnixStream,
        reader: &mut FrameReader,
        conn: &mut Conn,
        out: &Outbound,
    ) -> Result<(), ServerError> {
        let mut poll = BusyPoll::new(self.config.busy_poll);
        loop {
            if self.stop.is_stopped() {
                return Ok(());
            }
            let next = match poll.budget() {
                Some(budget) => Self::poll_for(stream, reader, budget, &mut poll),
                None => reader.next(stream, Wait::Block).inspect(|m| {
                    if m.is_some() {
                        poll.woke();
                    }
                }),
            };
            match next {
                Ok(Some(msg)) => {
                    conn.handle(msg)?;
                    poll.handled();
                }
                Ok(None) => {}
                Err(FrameError::Closed) => return Ok(()),
                Err(FrameError::BadSize { header, size, max }) => {
                    // The body length is unknown, so the stream cannot be resynchronised: answer and close.
                    let errno = if (size as usize) < HEADER_SIZE { libc::EINVAL } else { libc::E2BIG };
                    let _ = out.send(&Header::error_reply(&header, errno), &[], &[]);
                    return Err(FrameError::BadSize { header, size, max }.into());
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads without blocking for up to `budget`; `Ok(None)` (and polling disarmed) if nothing came.
    fn poll_for(
        stream: &UnixStream,
        reader: &mut FrameReader,
        budget: Duration,
        poll: &mut BusyPoll,
    ) -> Result<Option<crate::sock::Message>, FrameError> {
        let m = reader.poll_until(stream, std::time::Instant::now() + budget)?;
        if m.is_none() {
            poll.missed();
        }
        Ok(m)
    }
}
