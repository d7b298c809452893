//! How reaching a device can fail, for every backend: one typed error with the errno the kernel-named API
//! reports for it.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum AccessError {
    #[error("{what} at BAR{bar}+{offset:#x} is outside the BAR (size {size:#x})")]
    OutOfRange { what: &'static str, bar: u32, offset: u64, size: u64 },
    #[error("BAR{0} does not exist or is not a memory BAR")]
    NoSuchBar(u32),
    #[error("{width}-byte access at BAR{bar}+{offset:#x}: this device's registers are not that wide")]
    BadWidth { bar: u32, offset: u64, width: u32 },
    #[error("the device failed a {op}: errno {errno}")]
    Errno { op: &'static str, errno: i32 },
    #[error("{op} timed out after {timeout:?}")]
    Timeout { op: &'static str, timeout: Duration },
    #[error("I/O error during {op}: {source}")]
    Io { op: &'static str, source: std::io::Error },
    #[error("{op}: {source}")]
    Vfio { op: &'static str, source: vfio_ioctls::VfioError },
    #[error("short {op}: {done} of {wanted} bytes")]
    Short { op: &'static str, done: usize, wanted: usize },
    #[error("bad DMA map of {offset:#x}+{len:#x} at IOVA {iova:#x} (empty, unaligned or outside the memory)")]
    BadDmaMap { offset: u64, len: u64, iova: u64 },
    #[error("cannot map BAR area of {len:#x} bytes at file offset {fd_offset:#x}")]
    BadBarArea { len: u64, fd_offset: u64 },
    #[error("{requested} MSI-X vectors requested, device has {available}")]
    MsixVectors { requested: u32, available: u32 },
    #[error("MSI-X vector {0} is not enabled")]
    VectorNotEnabled(u32),
    #[error("device has no MSI-X capability")]
    NoMsixCapability,
    #[error("this backend has no PCI config space access")]
    NoConfigSpace,
    #[error("{} has no iommu_group: VFIO needs an IOMMU (boot with intel_iommu=on and a vIOMMU)", .0.display())]
    NoIommuGroup(PathBuf),
    #[error("{0} is not set up")]
    NotSetUp(&'static str),
    #[error(transparent)]
    DmaMemory(Box<DmaMemError>),
}

impl From<DmaMemError> for AccessError {
    fn from(e: DmaMemError) -> Self {
        AccessError::DmaMemory(Box::new(e))
    }
}

impl AccessError {
    /// The negative errno the kernel-named API reports for this failure.
    pub fn to_errno(&self) -> i32 {
        match self {
            AccessError::OutOfRange { .. }
            | AccessError::NoSuchBar(_)
            | AccessError::BadWidth { .. }
            | AccessError::BadDmaMap { .. }
            | AccessError::BadBarArea { .. }
            | AccessError::MsixVectors { .. }
            | AccessError::VectorNotEnabled(_)
            | AccessError::NoMsixCapability
            | AccessError::NotSetUp(_) => -libc::EINVAL,
            AccessError::Errno { errno, .. } => -errno.abs(),
            AccessError::Timeout { .. } => -libc::ETIMEDOUT,
            AccessError::Io { source, .. } => -source.raw_os_error().unwrap_or(libc::EIO),
            AccessError::Vfio { source, .. } => -os_error(source).unwrap_or(libc::EIO),
            AccessError::Short { .. } => -libc::EIO,
            AccessError::NoConfigSpace => -libc::EOPNOTSUPP,
            AccessError::NoIommuGroup(_) => -libc::ENODEV,
            AccessError::DmaMemory(e) => e.to_errno(),
        }
    }
}

/// The OS error under a VFIO error, if it carries one.
fn os_error(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(code) = err.downcast_ref::<std::io::Error>().and_then(std::io::Error::raw_os_error) {
            return Some(code);
        }
        cur = err.source();
    }
    None
}

pub type Result<T> = std::result::Result<T, AccessError>;

/// How DMA memory and its mappings fail.
#[derive(Debug, Error)]
pub enum DmaMemError {
    #[error("cannot create DMA memory of {len} bytes: {source}")]
    Create { len: usize, source: std::io::Error },
    #[error("access {offset:#x}+{len:#x} is outside DMA memory of {size:#x} bytes")]
    OutOfBounds { offset: usize, len: usize, size: usize },
    #[error("IOVA space exhausted allocating {0:#x} bytes")]
    IovaExhausted(u64),
    #[error("mapping for DMA failed: {0}")]
    Map(#[from] AccessError),
}

impl DmaMemError {
    pub fn to_errno(&self) -> i32 {
        match self {
            DmaMemError::Map(e) => e.to_errno(),
            DmaMemError::OutOfBounds { .. } => -libc::EINVAL,
            _ => -libc::ENOMEM,
        }
    }
}
