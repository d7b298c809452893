//! The hfi1 engine's error type.

/// Errors of the hfi1 engine.
#[derive(Debug, thiserror::Error)]
pub enum Hfi1Error {
    #[error("invalid hfi1 configuration: {0}")]
    Config(String),
    #[error("shared RcvArray memory: {0}")]
    Shm(#[from] std::io::Error),
    #[error("worker thread: {0}")]
    Worker(String),
    #[error("bad control request: {0}")]
    Control(String),
}

impl Hfi1Error {
    /// Negative errno, for callers that speak the kernel's convention.
    pub fn errno(&self) -> i32 {
        match self {
            Self::Config(_) | Self::Control(_) => -libc::EINVAL,
            Self::Shm(e) => -e.raw_os_error().unwrap_or(libc::ENOMEM),
            Self::Worker(_) => -libc::EIO,
        }
    }
}

pub type Result<T> = std::result::Result<T, Hfi1Error>;
