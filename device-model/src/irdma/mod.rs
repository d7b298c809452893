//! irdma (E810, GEN2) control QP: the CQP SQ ring, the CCQ, the quad-hash table and TCP classification.
//!
//! Register map, layouts, error codes and decisions: docs/irdma-device.md.

#![forbid(unsafe_code)]

pub mod ccq;
pub mod classify;
mod config;
mod control;
pub mod cqp;
pub mod device;
mod error;
pub mod loopback;
mod names;
mod observe;
pub mod qhash;
pub mod regs;
mod shared;
mod worker;
pub mod wqe;

#[cfg(test)]
mod tests;

pub use crate::worker::WorkerMode;
pub use classify::{ClassifyTarget, Segment};
pub use config::{IrdmaConfig, IRDMA_EMU_MAX_QHASH_CAPACITY};
pub use device::Irdma;
pub use error::{
    CreateError, DmaStage, WqeError, IRDMA_CQPSQ_MAJ_NO_ERROR, IRDMA_EMU_MAJ_BAD_WQE, IRDMA_EMU_MAJ_CQ,
    IRDMA_EMU_MAJ_CQP_CREATE, IRDMA_EMU_MAJ_DMA, IRDMA_EMU_MAJ_QHASH,
};
pub use qhash::{EntryType, QhashKey, QhashTable};
