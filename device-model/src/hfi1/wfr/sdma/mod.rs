//! The SDMA engines: the CSR state a driver programs and the chip keeps (`state`), and the worker's walk of
//! their rings in host memory (`walk`). Siblings under an interface, so the walk, which reads the worker's
//! shared state, is no child of a module that the shared state imports.

mod state;
pub(in crate::hfi1) mod walk;

pub use state::*;
