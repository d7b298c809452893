//! Session recordings: what a client sent, what the server answered, and what the device read of the
//! client's memory, in the order the device saw it (docs/observe.md, "Record and replay").
//!
//! A recording is one file per client connection:
//! - `MAGIC`, then a `u32` length and a JSON header (which device, its configuration, armed faults: the
//!   device model's business, opaque here);
//! - records, each `u8` tag, `u32` length, body (little-endian):
//!
//! | Tag | Record | Body |
//! |---|---|---|
//! | 1 | client message | `u8` fd count, 16-byte header, payload |
//! | 2 | reply | `u8` fd count, 16-byte header, payload |
//! | 3 | DMA read | `u64` IOVA, the bytes the device read |
//! | 4 | DMA write | `u64` IOVA, `u64` length, `u64` FNV-1a hash of the bytes |
//! | 5 | DMA failed | `u64` IOVA, `u64` length, `u8` 1 for a write |
//! | 6 | shared read | `u32` region, `u64` offset, the bytes the device took from client-written shared memory |
//! | 7 | control request | `u64` id, JSON text |
//! | 8 | control reply | `u64` id, JSON text |
//! | 9 | device step | empty: the device read or published state of its own (a worker's look at the registers, its result, an interrupt) |
//! | 10 | device access | empty: the device handled the client message logged last (a register access, a reset) |
//!
//! Client messages are logged when they arrive, before the device acts on them; DMA reads once their data
//! is known, before the device uses it; DMA writes before they land, so a client reacting to one is logged
//! after it. Device steps and accesses are logged under the lock the device's registers are accessed under
//! (by a device that reports them), so that a step logged after a message that arrived is known to have come
//! before or after the device handled it. Replies of the client to the server's own DMA_READ/DMA_WRITE are not logged: the DMA records
//! carry their content. A reader stops cleanly at a truncated last record (a killed recorder).

#![forbid(unsafe_code)]

mod dma;
mod format;
pub mod seed;
mod writer;

pub use dma::RecordingDma;
pub use format::{
    content_hash, encode_recording, ContentHash, Record, RecordError, RecordingReader, MAGIC, MAX_HEADER, MAX_RECORD,
};
pub use writer::{Recorder, Session, DEFAULT_MAX_SESSION_BYTES, DEFAULT_MAX_TOTAL_BYTES};

#[cfg(test)]
mod tests;
