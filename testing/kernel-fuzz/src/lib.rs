//! Fuzzes the stock hfi1 driver from the side only an emulated device reaches (docs/fuzzing-kernel.md).
//!
//! - [`target`]: what the guest's QP keeper reports of the live fabric (LIDs, P_Key, QPNs, PSNs, a memory
//!   region): the dictionary the packets draw their fields from.
//! - [`packet`]: the templates of every class the driver's receive path parses, and the decoding of a fuzzer
//!   input into a batch of sealed wire packets.
//! - [`guest`]: one boot of the fuzz guest (guest-run's `fuzz-wire` row), its keeper's reports and console.
//! - [`oracle`]: the kernel's detectors' reports on that console.
//! - [`campaign`]: LibAFL's loop, its executor (a batch per exec, ended by the driver's head write), restarts.
//! - [`findings`]: one directory per distinct report, with its reproducer as control-socket lines.
//! - [`coverage`]: call sites by file, and the receive dispatch tables' entries reached.

pub mod campaign;
pub mod coverage;
pub mod findings;
pub mod guest;
pub mod oracle;
pub mod packet;
pub mod target;
