//! The guest program: a user context on `/dev/hfi1_N`, TID_UPDATE on contiguous and fragmented buffers,
//! the host told everything over the serial line, the placed data verified, TID_FREE.
//!
//! The session logic talks to the context through [`UserContext`]: [`real::RealContext`] is the kernel
//! (ioctls, mmap, pagemap); tests put a device-model engine behind it.

pub mod buffers;
pub mod real;
pub mod session;

use crate::abi::{Hfi1BaseInfo, Hfi1CtxtInfo};
use crate::channel::ChannelError;
use crate::proto::BufferKind;
use crate::sys::SysError;

#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    #[error(transparent)]
    Sys(#[from] SysError),
    #[error("serial channel: {0}")]
    Channel(#[from] ChannelError),
    #[error("{0}")]
    Setup(String),
    #[error("the host aborted: {0}")]
    HostAbort(String),
    #[error("expected {expected} from the host, got {got}")]
    Unexpected { expected: &'static str, got: &'static str },
}

pub type Result<T> = std::result::Result<T, GuestError>;

/// What the context's ioctls reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextFacts {
    pub info: Hfi1CtxtInfo,
    pub base: Hfi1BaseInfo,
}

/// What TID_UPDATE returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TidUpdate {
    pub tidlist: Vec<u32>,
    /// tinfo.length: bytes programmed.
    pub length: u32,
}

/// Memory a buffer lives in, addressed by offset; all access is a copy.
pub trait GuestMemory {
    fn vaddr(&self) -> u64;
    /// Bytes of the mapping.
    fn size(&self) -> usize;
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()>;
    fn write(&self, offset: usize, data: &[u8]) -> Result<()>;
}

/// An assigned hfi1 user context.
pub trait UserContext {
    type Mem: GuestMemory;
    fn facts(&self) -> ContextFacts;
    /// Writes `value` into TID flow `flow` of the context's flow table; returns what reads back.
    fn write_flow(&mut self, flow: u32, value: u64) -> Result<u64>;
    /// `pages` pages of `kind` memory; the last one is a guard page, never registered.
    fn map(&mut self, kind: BufferKind, pages: usize) -> Result<Self::Mem>;
    /// HFI1_IOCTL_TID_UPDATE of `[offset, offset + len)` of `mem`.
    fn tid_update(&mut self, mem: &Self::Mem, offset: usize, len: usize) -> Result<TidUpdate>;
    /// HFI1_IOCTL_TID_FREE; returns the count the kernel released.
    fn tid_free(&mut self, tidlist: &[u32]) -> Result<u32>;
    /// Page frame numbers of `pages` pages from `offset`; empty when they cannot be read.
    fn pfns(&self, mem: &Self::Mem, offset: usize, pages: usize) -> Result<Vec<u64>>;
}
