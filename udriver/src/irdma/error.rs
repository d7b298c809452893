//! The errors of the irdma control path, with the errno each maps to.

#![forbid(unsafe_code)]

use thiserror::Error;

use crate::access::AccessError;
use crate::dma::DmaMemError;

#[derive(Debug, Error)]
pub enum IrdmaError {
    #[error("invalid argument: {0}")]
    Inval(String),
    #[error("GLPCI_LBARCTRL.PE_DB_SIZE = {0} is neither 4 MiB (1) nor 8 MiB (2)")]
    NoDevice(u32),
    #[error("protocol engine not ready: GLPE_CPUSTATUS0..2 = {0:#x?}")]
    PeNotReady([u32; 3]),
    #[error("CQP SQ is full")]
    SqFull,
    #[error("{0} timed out")]
    Timeout(&'static str),
    #[error("CQP create failed: CCQPSTATUS {status:#x}, major {maj:#x}, minor {min:#x}")]
    CqpCreate { status: u32, maj: u16, min: u16 },
    #[error("CQPTAIL.CQP_OP_ERR: major {maj:#x}, minor {min:#x}")]
    CqpOpErr { maj: u16, min: u16 },
    #[error("CQP op {op:#x} completed with error: major {maj:#x}, minor {min:#x}")]
    CqeError { op: u8, maj: u16, min: u16 },
    #[error("no new CQE")]
    NoCqe,
    #[error("device wrote a bad CQE: {0}")]
    BadCqe(String),
    #[error("device register {reg} holds an impossible value {value:#x}")]
    BadRegister { reg: &'static str, value: u32 },
    #[error("{0}")]
    State(&'static str),
    #[error(transparent)]
    Access(#[from] AccessError),
    #[error(transparent)]
    Dma(#[from] DmaMemError),
}

impl IrdmaError {
    /// The negative errno the kernel function returns for this failure.
    pub fn to_errno(&self) -> i32 {
        match self {
            IrdmaError::Inval(_) | IrdmaError::State(_) => -libc::EINVAL,
            IrdmaError::NoDevice(_) => -libc::ENODEV,
            IrdmaError::PeNotReady(_) | IrdmaError::Timeout(_) => -libc::ETIMEDOUT,
            IrdmaError::SqFull => -libc::ENOMEM,
            IrdmaError::CqpCreate { .. } => -libc::EOPNOTSUPP,
            IrdmaError::CqpOpErr { .. }
            | IrdmaError::CqeError { .. }
            | IrdmaError::BadCqe(_)
            | IrdmaError::BadRegister { .. } => -libc::EIO,
            IrdmaError::NoCqe => -libc::ENOENT,
            IrdmaError::Access(e) => e.to_errno(),
            IrdmaError::Dma(e) => e.to_errno(),
        }
    }
}

pub type Result<T> = std::result::Result<T, IrdmaError>;
