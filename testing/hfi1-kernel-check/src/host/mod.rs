//! The host side: serves the guest's second serial port (QEMU connects to our UNIX socket), checks the
//! device model's RcvArray and DMA maps against what the guest's kernel returned, injects the data and
//! the packets that must be dropped, and judges the run.

pub mod check;
pub mod control;
pub mod dump;
pub mod inject;
pub mod session;

use std::path::PathBuf;
use std::time::Duration;

use crate::channel::ChannelError;
use control::ControlError;

#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The UNIX socket QEMU's `-chardev socket,path=…,server=off` connects to.
    pub listen: PathBuf,
    /// The device model's control socket.
    pub control: PathBuf,
    /// The hfi1 function's name on the control socket.
    pub device: String,
    /// How long QEMU may take to connect.
    pub accept_timeout: Duration,
    /// How long the guest may take to say hello after QEMU connected (boot, modprobe, context setup).
    pub hello_timeout: Duration,
    /// Every later wait for the guest.
    pub step_timeout: Duration,
    /// Each control-socket request.
    pub control_timeout: Duration,
    /// Match every entry's pages to the guest's page frame numbers (needs fd-backed DMA maps whose file
    /// offset is the guest-physical address, as q35 RAM below 4 GiB has).
    pub gpa_check: bool,
    /// Progress lines on stderr.
    pub progress: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("listen on {path}: {errno}")]
    Listen { path: String, errno: String },
    #[error("{path} exists and is not a socket: not replacing it")]
    NotSocket { path: String },
    #[error(
        "no connection on {path} within {after:?}: QEMU was not started, or not with \
         -chardev socket,id=…,path={path},server=off and -serial chardev:…"
    )]
    AcceptTimeout { path: String, after: Duration },
    #[error("accept on {path}: {errno}")]
    Accept { path: String, errno: String },
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error("guest channel: {0}")]
    Channel(#[from] ChannelError),
    #[error("the guest aborted: {0}")]
    GuestAbort(String),
    #[error("expected {expected} from the guest, got {got}")]
    Unexpected { expected: &'static str, got: &'static str },
    #[error("{0}")]
    Protocol(String),
}
