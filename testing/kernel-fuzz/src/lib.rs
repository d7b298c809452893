//! Fuzzes the stock hfi1 driver from the side only an emulated device reaches (docs/fuzzing-kernel.md).
//!
//! - [`target`]: what the guest's QP keeper reports of the live fabric (LIDs, P_Key, QPNs, PSNs, a memory
//!   region): the dictionary the packets draw their fields from.
//! - [`packet`]: the templates of every class the driver's receive path parses, and the decoding of a fuzzer
//!   input into a batch of sealed wire packets.

pub mod packet;
pub mod target;
