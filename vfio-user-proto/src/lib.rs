//! A hardened vfio-user protocol layer shared by the device model (server) and udriver (client).
//!
//! Every byte from the peer is untrusted: sizes, counts, offsets and indices are checked against
//! their limits before anything is allocated or indexed, and nothing a peer sends may panic.

pub mod device;
pub mod dma;
