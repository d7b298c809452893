//! The device interface this project invented, defined once for both sides.
//!
//! Linux defines the engines' real registers, and the device model and udriver each restate those from the
//! reference on purpose (docs/architecture.md). What is here has no outside reference: the hfi1 loopback send
//! block, the irdma loopback classification block, their descriptor layouts, and the result and error codes
//! the emulator reports. A second copy could only be checked against the first, so there is one.

#![forbid(unsafe_code)]

pub mod dc8051;
pub mod hfi1;
pub mod irdma;
