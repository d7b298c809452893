//! The client's configuration, its error, DMA protection flags and the trait for DMA-backed memory: what
//! the client and its reader share, apart from both.

#![forbid(unsafe_code)]

use std::time::Duration;

use thiserror::Error;

use crate::device::Errno;
use crate::sock::FrameError;
use crate::wire::{command as cmd, dma_map_flags};

/// Client memory the server reaches through DMA_READ/DMA_WRITE; `offset` is relative to the mapping.
pub trait ClientDmaBacking: Send + Sync {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno>;
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), Errno>;
}

/// DMA_MAP protection (`dma_map_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaProt(u32);

impl DmaProt {
    pub const READ: DmaProt = DmaProt(dma_map_flags::READ);
    pub const WRITE: DmaProt = DmaProt(dma_map_flags::WRITE);
    pub const READ_WRITE: DmaProt = DmaProt(dma_map_flags::READ | dma_map_flags::WRITE);
    pub fn bits(self) -> u32 {
        self.0
    }
    pub fn contains(self, other: DmaProt) -> bool {
        self.0 & other.0 == other.0
    }
}

#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// How long one request waits for its reply.
    pub timeout: Duration,
    /// Most descriptors we accept in one message (advertised).
    pub max_msg_fds: u32,
    /// Largest data count we accept in one message (advertised).
    pub max_data_xfer_size: u32,
    /// How long a caller waiting for its reply reads without blocking before it sleeps (0: off). A server
    /// that answers within microseconds then costs no wake-up of the caller, at the price of a busy core
    /// while it polls; worth it where a wake-up is expensive (a VM's halted vCPU: docs/fuzzing.md).
    pub busy_poll: Duration,
    /// Read each message with exact reads (`FrameReader::exact`) instead of peeking: the simple path the peek
    /// mode is measured against (testbed bench case (a)). Off by default.
    pub exact_reads: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            timeout: Duration::from_secs(5),
            max_msg_fds: 16,
            max_data_xfer_size: 1 << 20,
            busy_poll: Duration::ZERO,
            exact_reads: false,
        }
    }
}

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("server answered command {command} with errno {errno}")]
    Remote { command: u16, errno: i32 },
    #[error("timed out waiting for the reply to command {0}")]
    Timeout(u16),
    #[error("connection closed")]
    Disconnected,
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol violation by the server: {0}")]
    Protocol(String),
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
}

impl ClientError {
    /// Positive errno: the server's for error replies, ETIMEDOUT for timeouts, EIO for transport.
    pub fn errno(&self) -> i32 {
        match self {
            ClientError::Remote { errno, .. } => *errno,
            ClientError::Timeout(_) => libc::ETIMEDOUT,
            ClientError::Invalid(_) => libc::EINVAL,
            _ => libc::EIO,
        }
    }
}

impl From<FrameError> for ClientError {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::Timeout => ClientError::Timeout(cmd::VERSION),
            FrameError::Io(e) => ClientError::Io(e),
            FrameError::Closed | FrameError::Truncated => ClientError::Disconnected,
            e @ FrameError::BadSize { .. } => ClientError::Protocol(e.to_string()),
        }
    }
}
