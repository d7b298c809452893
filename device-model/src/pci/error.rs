//! Why a function cannot be built from an engine's description.

#![forbid(unsafe_code)]

use thiserror::Error;

use super::msix::MSIX_BAR;

/// An engine's BAR description that the function cannot carry.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PciError {
    #[error("BAR{index}: index out of range (64-bit BARs need index + 1 <= 5)")]
    BarIndex { index: u32 },
    #[error("BAR{index}: slot used twice (or by the MSI-X BAR {MSIX_BAR})")]
    BarOverlap { index: u32 },
    #[error("BAR{index}: size {size:#x} is not a power of two of at least 4 KiB")]
    BarSize { index: u32, size: u64 },
    #[error("BAR{index}: 32-bit BAR of {size:#x} bytes exceeds 2 GiB")]
    BarTooLargeFor32Bit { index: u32, size: u64 },
    #[error("BAR{index}: mmap area {offset:#x}+{size:#x} is empty, unaligned or outside the BAR")]
    MmapArea { index: u32, offset: u64, size: u64 },
    #[error("MSI-X table or PBA in BAR{bar} is unaligned, overlapping, mmapped or outside the BAR")]
    MsixPlacement { bar: u32 },
    #[error("capability offsets, link or config storage ranges do not fit config space")]
    CapLayout,
}
