//! User expected receive through the stock Linux hfi1 driver, checked from the host.
//!
//! - `abi`: the hfi1 user ABI as the guest kernel defines it (ioctls, structs, tidinfo, mmap tokens, the
//!   TID flow entry of the UREGS page).

pub mod abi;
pub mod errno;
