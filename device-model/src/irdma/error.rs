//! Why a CQP command or the CQP's creation failed, and the (major, minor) codes each reports.

#![forbid(unsafe_code)]

use emu_abi::irdma as abi;
use thiserror::Error;

/// The reference's "no error" major code.
pub const IRDMA_CQPSQ_MAJ_NO_ERROR: u16 = 0x0000;
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
