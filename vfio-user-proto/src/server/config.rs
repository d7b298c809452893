//! What a server is configured with: the limits it advertises and enforces, and its timeouts.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use super::PeerPolicy;
use crate::dma_space::MmapLimits;
use crate::record::Recorder;

/// Room for the fixed parts of any message beyond its data (REGION_WRITE_MULTI's 200 entries are the largest).
const MSG_OVERHEAD: u32 = 8192;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Most descriptors accepted in one message (advertised as `max_msg_fds`, at most 253).
    pub max_msg_fds: u32,
    /// Largest data count of one REGION_READ/WRITE or DMA_READ/WRITE (advertised).
    pub max_data_xfer_size: u32,
    /// Most DMA mappings at once (advertised).
    pub max_dma_maps: u32,
    /// How long a worker waits for the client's DMA_READ/DMA_WRITE reply, and the socket send timeout.
    pub dma_timeout: Duration,
    /// How long a client may stall in the middle of one message before it is disconnected.
    pub stall_timeout: Duration,
    /// Most distinct files mmapped for one client, and their total size; beyond them sealed fd maps
    /// are served by DMA_READ/DMA_WRITE (each mmap holds a descriptor and address space).
    pub mmap_limits: MmapLimits,
    /// Records every session to a file of its own (docs/observe.md); `None`: nothing is recorded.
    pub recorder: Option<Arc<Recorder>>,
    /// After a reply, how long the connection thread polls the socket without blocking while requests
    /// come in bursts (`server::poll`); zero never polls. Costs a core while it polls.
    pub busy_poll: Duration,
    /// Whether `write_multiple` is agreed to when the client proposes it. Off by default: QEMU 10.1 and
    /// 10.2, once it is agreed, send every request from their I/O thread instead of the vCPU's (their
    /// `VFIO_PROXY_USE_MULTI` is 0x16, which holds `VFIO_PROXY_FORCE_QUEUED`'s bit too; fixed upstream in
    /// QEMU commit 6a66c9f7), which added a thread hand-off to every trapped access: 1.3-1.5x in the guest
    /// (docs/bench.md). REGION_WRITE_MULTI is served either way.
    pub write_multiple: bool,
    /// Read each message with exact reads (`FrameReader::exact`) instead of peeking: the simple path the peek
    /// mode is measured against (testbed bench case (a)). Off by default.
    pub exact_reads: bool,
    /// Who may connect: a peer it refuses is closed before any message is read (`server::peer`). Default:
    /// this process's user and root.
    pub peers: PeerPolicy,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_msg_fds: 16,
            max_data_xfer_size: 1 << 20,
            max_dma_maps: 65535,
            dma_timeout: Duration::from_secs(5),
            stall_timeout: Duration::from_secs(5),
            mmap_limits: MmapLimits::default(),
            recorder: None,
            busy_poll: Duration::ZERO,
            write_multiple: false,
            exact_reads: false,
            peers: PeerPolicy::default(),
        }
    }
}

impl ServerConfig {
    pub(super) fn max_msg_size(&self) -> u32 {
        self.max_data_xfer_size.saturating_add(MSG_OVERHEAD)
    }
}
