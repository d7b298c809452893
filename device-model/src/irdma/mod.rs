//! irdma (E810, GEN2) control QP: the CQP SQ ring, the CCQ, the quad-hash table and TCP classification.
//!
//! Register map, layouts, error codes and decisions: docs/irdma-device.md.

#![forbid(unsafe_code)]

pub mod ccq;
pub mod classify;
mod control;
pub mod cqp;
pub mod device;
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

use std::time::Duration;

use thiserror::Error;

pub use crate::worker::WorkerMode;
pub use classify::{ClassifyTarget, Segment};
pub use device::Irdma;
pub use qhash::{EntryType, QhashKey, QhashTable};

/// Construction parameters of an irdma function.
#[derive(Debug, Clone)]
pub struct IrdmaConfig {
    /// Quad-hash table capacity (entries). Default 4096; at most `IRDMA_EMU_MAX_QHASH_CAPACITY` (larger values
    /// are clamped). Storage is reserved up front.
    pub qhash_capacity: usize,
    /// MSI-X vectors of the function. Default 4. Also the number of GLINT_CEQCTL registers.
    pub msix_vectors: u16,
    /// How long the worker waits for the driver to consume a CCQ entry when the CCQ is full. Default 10 ms.
    pub ccq_full_wait: Duration,
    /// Largest CCQ the device accepts in CREATE_CQ (entries). Default 1 << 20 (CQEIDX is 20 bits).
    pub max_ccq_size: u64,
    /// Where the CQP worker's jobs run. Default a thread that sleeps between jobs ([`WorkerMode::default`]).
    pub worker: WorkerMode,
}

impl Default for IrdmaConfig {
    fn default() -> Self {
        Self {
            qhash_capacity: 4096,
            msix_vectors: 4,
            ccq_full_wait: Duration::from_millis(10),
            max_ccq_size: 1 << 20,
            worker: WorkerMode::default(),
        }
    }
}

/// Largest quad-hash table the device builds.
pub const IRDMA_EMU_MAX_QHASH_CAPACITY: usize = 1 << 20;

/// The reference's "no error" major code.
pub const IRDMA_CQPSQ_MAJ_NO_ERROR: u16 = 0x0000;
use emu_abi::irdma as abi;
/// Codes for conditions the reference gives none for: the project's ABI (docs/irdma-device.md).
pub use emu_abi::irdma::{
    IRDMA_EMU_MAJ_BAD_WQE, IRDMA_EMU_MAJ_CQ, IRDMA_EMU_MAJ_CQP_CREATE, IRDMA_EMU_MAJ_DMA, IRDMA_EMU_MAJ_QHASH,
};

/// Which DMA access failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DmaStage {
    WqeFetch = abi::IRDMA_EMU_MIN_DMA_WQE_FETCH as isize,
    CqeWrite = abi::IRDMA_EMU_MIN_DMA_CQE_WRITE as isize,
    HostContext = abi::IRDMA_EMU_MIN_DMA_HOST_CONTEXT as isize,
    ShadowArea = abi::IRDMA_EMU_MIN_DMA_SHADOW_AREA as isize,
    CqMemory = abi::IRDMA_EMU_MIN_DMA_CQ_MEMORY as isize,
    LoopbackDescriptor = abi::IRDMA_EMU_MIN_DMA_LOOPBACK_DESCRIPTOR as isize,
}

/// Why a CQP WQE (or the ring around it) failed. Each maps to one (major, minor) pair.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum WqeError {
    #[error("unknown or unsupported CQP opcode {0:#x}")]
    UnsupportedOpcode(u8),
    #[error("bad MANAGE value {0}")]
    BadManage(u8),
    #[error("bad quad-hash entry type {0}")]
    BadEntryType(u8),
    #[error("reserved bits {bits:#x} set in qw{qw}")]
    ReservedBits { qw: u8, bits: u64 },
    #[error("bad field value: {0}")]
    BadField(&'static str),
    #[error("quad-hash entry already present")]
    QhashDuplicate,
    #[error("quad-hash entry not found")]
    QhashMissing,
    #[error("quad-hash table full")]
    QhashFull,
    #[error("CQ id {0} not supported (only the CCQ, cq_id 0)")]
    CqIdUnsupported(u32),
    #[error("the CCQ already exists")]
    CcqExists,
    #[error("no such CQ {0}")]
    NoSuchCq(u32),
    #[error("CCQ full: the driver did not consume in time")]
    CcqFull,
    #[error("DMA failed: {0:?}")]
    Dma(DmaStage),
    /// A `cqp-fail` fault (docs/observe.md).
    #[error("injected failure {major:#06x}/{minor:#06x}")]
    Injected { major: u16, minor: u16 },
}

impl WqeError {
    /// (major, minor) as written to the CQE and CQPERRCODES.
    pub fn codes(&self) -> (u16, u16) {
        match *self {
            WqeError::UnsupportedOpcode(_) => (IRDMA_EMU_MAJ_BAD_WQE, abi::IRDMA_EMU_MIN_UNSUPPORTED_OPCODE),
            WqeError::BadManage(_) => (IRDMA_EMU_MAJ_BAD_WQE, abi::IRDMA_EMU_MIN_BAD_MANAGE),
            WqeError::BadEntryType(_) => (IRDMA_EMU_MAJ_BAD_WQE, abi::IRDMA_EMU_MIN_BAD_ENTRY_TYPE),
            WqeError::ReservedBits { .. } => (IRDMA_EMU_MAJ_BAD_WQE, abi::IRDMA_EMU_MIN_RESERVED_BITS),
            WqeError::BadField(_) => (IRDMA_EMU_MAJ_BAD_WQE, abi::IRDMA_EMU_MIN_BAD_FIELD),
            WqeError::QhashDuplicate => (IRDMA_EMU_MAJ_QHASH, abi::IRDMA_EMU_MIN_QHASH_DUPLICATE),
            WqeError::QhashMissing => (IRDMA_EMU_MAJ_QHASH, abi::IRDMA_EMU_MIN_QHASH_MISSING),
            WqeError::QhashFull => (IRDMA_EMU_MAJ_QHASH, abi::IRDMA_EMU_MIN_QHASH_FULL),
            WqeError::CqIdUnsupported(_) => (IRDMA_EMU_MAJ_CQ, abi::IRDMA_EMU_MIN_CQ_ID_UNSUPPORTED),
            WqeError::CcqExists => (IRDMA_EMU_MAJ_CQ, abi::IRDMA_EMU_MIN_CCQ_EXISTS),
            WqeError::NoSuchCq(_) => (IRDMA_EMU_MAJ_CQ, abi::IRDMA_EMU_MIN_NO_SUCH_CQ),
            WqeError::CcqFull => (IRDMA_EMU_MAJ_CQ, abi::IRDMA_EMU_MIN_CCQ_FULL),
            WqeError::Dma(stage) => (IRDMA_EMU_MAJ_DMA, stage as u16),
            WqeError::Injected { major, minor } => (major, minor),
        }
    }
}

/// Why CQP create (CCQPLOW write) failed: CCQPSTATUS.CCQP_ERR with these codes in CQPERRCODES.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum CreateError {
    #[error("SQSIZE code {0} outside 1..=10")]
    BadSqSize(u64),
    #[error("SQ base {0:#x} is zero or not 0x200-aligned")]
    BadSqBase(u64),
    #[error("HW_MAJVER {0} is not GEN2 (1)")]
    BadMajorVersion(u64),
    #[error("a CQP already exists")]
    AlreadyExists,
    #[error("host context DMA read failed")]
    ContextDma,
    #[error("bad host-context field: {0}")]
    BadField(&'static str),
    #[error("the worker queue is full")]
    Busy,
}

impl CreateError {
    pub fn codes(&self) -> (u16, u16) {
        let minor = match self {
            CreateError::BadSqSize(_) => abi::IRDMA_EMU_MIN_BAD_SQ_SIZE,
            CreateError::BadSqBase(_) => abi::IRDMA_EMU_MIN_BAD_SQ_BASE,
            CreateError::BadMajorVersion(_) => abi::IRDMA_EMU_MIN_BAD_MAJOR_VERSION,
            CreateError::AlreadyExists => abi::IRDMA_EMU_MIN_CQP_EXISTS,
            CreateError::ContextDma => return WqeError::Dma(DmaStage::HostContext).codes(),
            CreateError::BadField(_) => abi::IRDMA_EMU_MIN_BAD_CONTEXT_FIELD,
            CreateError::Busy => abi::IRDMA_EMU_MIN_CREATE_BUSY,
        };
        (IRDMA_EMU_MAJ_CQP_CREATE, minor)
    }
}
