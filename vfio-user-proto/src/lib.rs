//! A hardened vfio-user protocol layer shared by the device model (server) and udriver (client).
//!
//! Every byte from the peer is untrusted: sizes, counts, offsets and indices are checked against
//! their limits before anything is allocated or indexed, and nothing a peer sends may panic.
//! See `docs/vfio-user.md` for the messages, limits and policies.

pub mod client;
pub mod device;
pub mod dma;
pub mod dma_space;
pub mod frame_reader;
pub mod irq;
pub mod record;
pub mod server;
pub mod sock;
pub mod stop;
pub mod sync;
#[cfg(feature = "test-util")]
pub mod test_util;
pub mod wire;

pub use client::{Client, ClientConfig, ClientDmaBacking, ClientError, DmaProt, ServerCaps};
pub use dma_space::{DmaSpace, MapError, MessageDma, MmapLimits};
pub use server::{Server, ServerConfig, ServerError, ShutdownHandle};
