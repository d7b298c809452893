//! irdma control path: the control QP (CQP), its completion queue (CCQ) and quad-hash management, driven
//! the way the Linux irdma driver drives an E810 (GEN2). See docs/udriver-irdma.md.
//!
//! Everything the device writes (registers, CQEs) is validated before use: a device that returns garbage
//! gets an error, never a panic or a hang.

#![forbid(unsafe_code)]

pub mod ccq;
pub mod cqp;
pub mod defs;
pub mod dev;
mod error;
pub mod golden;
pub mod loopback;
pub mod process;
pub mod qhash;
pub mod regs;
pub mod types;

#[cfg(test)]
pub(crate) mod testdev;

pub use ccq::{IrdmaCcqCqeInfo, IrdmaCcqInitInfo, IrdmaScCq};
pub use cqp::{IrdmaCqpInitInfo, IrdmaCqpWqe, IrdmaScCqp, QueueMemory};
pub use dev::{IrdmaDev, IrdmaDevConfig, IrdmaHwAttrs};
pub use error::{IrdmaError, Result};
pub use loopback::{IrdmaClassifyResult, IrdmaLoopback, IrdmaTcpSegment};
pub use process::{IrdmaCqpCmd, IrdmaCqpWaitMode};
pub use qhash::{IrdmaQhashTableInfo, IrdmaQuadEntryType, IrdmaQuadHashManageType};
