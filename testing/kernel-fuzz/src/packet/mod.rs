//! The packets the wire-side fuzzer sends, and the decoding of a fuzzer input into a batch of them.
//!
//! An input is a list of records separated by [`RECORD_MARKER`]; each record makes one packet (at most
//! [`MAX_PACKETS_PER_EXEC`]; any byte string gives at least one). A record is [`RECORD_HEADER_BYTES`] of knobs
//! at fixed offsets ([`at`]; missing bytes read as 0) followed by payload bytes. A flipped, inserted or
//! deleted byte changes only its own record's packet. Each knob picks a field's value from the fabric's
//! dictionary ([`Target`](crate::target::Target)) for most of its values, and a boundary or raw value for the rest, so zero knobs
//! give a packet the driver accepts and a mutation walks away from it one field at a time.

pub mod frame;
pub mod mad;
pub mod opcodes;
mod seeds;
#[cfg(test)]
mod tests;

pub use frame::{
    at, batch_request, decode, encode, flag, kdeth_knob, method, misc, records, Class, Damage, Frame, Record,
    DAMAGE_FIRST, LEN_BOUNDARY, LEN_MTU, MAX_PACKETS_PER_EXEC, RECORD_HEADER_BYTES, RECORD_MARKER,
};
pub use seeds::{seeds, SEEDED_SETS};
