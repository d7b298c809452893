//! User expected receive through the stock Linux hfi1 driver, checked from the host.
//!
//! - `abi`: the hfi1 user ABI as the guest kernel defines it (ioctls, structs, tidinfo, mmap tokens, the
//!   TID flow entry of the UREGS page).
//! - `proto`: the host <-> guest messages, one JSON object per line; `channel` carries them with deadlines.
//! - `plan` and `pattern`: which packets go where, and the data both sides compute.
//! - `guest`: the program inside the guest (`hfi1-user`); `host`: the checker/injector (`hfi1-user-host`).
//! - `dc8051_image`: the emulated chip's signed 8051 firmware file (`hfi1-dc8051-image`).
//! - `sys`: the only `unsafe` (ioctls, mmap, volatile access).

pub mod abi;
pub mod channel;
pub mod dc8051_image;
pub mod errno;
pub mod guest;
pub mod host;
pub mod pattern;
pub mod plan;
pub mod proto;
pub mod sys;
