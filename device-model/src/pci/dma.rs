//! DMA as a PCI function issues it: only while Bus Master Enable is set in the command register.
//!
//! Clearing Bus Master Enable (QEMU does it before every reset) therefore makes an engine's in-flight DMA fail
//! fast with an error the engine reports as a device error, instead of landing in memory the client is
//! tearing down. A DMA read that fails in the IOMMU/mapping (an Unsupported Request completion on real
//! hardware) sets Received Master Abort in PCI_STATUS, which the driver clears by writing 1.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;

use vfio_user_proto::dma::{DmaAccess, DmaError, DmaRegion};

use super::regs::{PCI_COMMAND_MASTER, PCI_STATUS_REC_MASTER_ABORT};

pub struct BusMasterDma {
    inner: Arc<dyn DmaAccess>,
    /// Mirror of the command register, updated by every config write and reset.
    command: Arc<AtomicU16>,
    refused: Arc<AtomicU64>,
    /// PCI_STATUS bits to raise, folded into config space at its next access.
    status_events: Arc<AtomicU16>,
}

impl BusMasterDma {
    pub fn new(
        inner: Arc<dyn DmaAccess>,
        command: Arc<AtomicU16>,
        refused: Arc<AtomicU64>,
        status_events: Arc<AtomicU16>,
    ) -> Self {
        BusMasterDma { inner, command, refused, status_events }
    }

    fn allowed(&self, iova: u64, dir: &'static str) -> Result<(), DmaError> {
        if self.command.load(Ordering::Acquire) & PCI_COMMAND_MASTER != 0 {
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err(DmaError::Permission { iova, dir })
    }
}

impl DmaAccess for BusMasterDma {
    fn regions(&self) -> Option<Vec<DmaRegion>> {
        self.inner.regions()
    }
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        self.allowed(iova, "read (Bus Master Enable clear)")?;
        let result = self.inner.read(iova, buf);
        if matches!(result, Err(DmaError::Unmapped { .. } | DmaError::Permission { .. })) {
            self.status_events.fetch_or(PCI_STATUS_REC_MASTER_ABORT, Ordering::AcqRel);
        }
        result
    }
    fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        self.allowed(iova, "write (Bus Master Enable clear)")?;
        self.inner.write(iova, buf)
    }
    fn check_read(&self, iova: u64, len: u64) -> Result<(), DmaError> {
        self.allowed(iova, "read (Bus Master Enable clear)")?;
        let result = self.inner.check_read(iova, len);
        if matches!(result, Err(DmaError::Unmapped { .. } | DmaError::Permission { .. })) {
            self.status_events.fetch_or(PCI_STATUS_REC_MASTER_ABORT, Ordering::AcqRel);
        }
        result
    }
    /// Forwarded whole, so the backend's direct copy is kept; a failure on the source side is a read's.
    fn copy(&self, src: u64, dst: u64, len: u64) -> Result<(), DmaError> {
        self.allowed(src, "read (Bus Master Enable clear)")?;
        let result = self.inner.copy(src, dst, len);
        let read_failed = match &result {
            Err(DmaError::Unmapped { iova, .. }) => *iova == src,
            Err(DmaError::Permission { dir, .. }) => dir.starts_with("read"),
            _ => false,
        };
        if read_failed {
            self.status_events.fetch_or(PCI_STATUS_REC_MASTER_ABORT, Ordering::AcqRel);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_user_proto::dma::HeapMemory;

    #[test]
    fn dma_passes_only_while_bus_master_is_enabled() {
        let mem = Arc::new(HeapMemory::new());
        assert!(mem.map(0x1000, 0x1000));
        let command = Arc::new(AtomicU16::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let events = Arc::new(AtomicU16::new(0));
        let dma = BusMasterDma::new(mem.clone(), command.clone(), refused.clone(), events.clone());
        assert!(matches!(dma.write_u32(0x1000, 7), Err(DmaError::Permission { iova: 0x1000, .. })));
        assert!(matches!(dma.read_u32(0x1000), Err(DmaError::Permission { iova: 0x1000, .. })));
        assert_eq!(mem.write_count(), 0);
        command.store(PCI_COMMAND_MASTER, Ordering::Release);
        dma.write_u32(0x1000, 7).unwrap();
        assert_eq!(dma.read_u32(0x1000), Ok(7));
        assert!(dma.write_u32(0x5000, 1).is_err(), "a posted write has no completion to abort");
        assert_eq!(refused.load(Ordering::Relaxed), 2);
        assert_eq!(events.load(Ordering::Relaxed), 0, "refused before reaching memory: nothing aborted");
        assert_eq!(dma.read_u32(0x5000), Err(DmaError::Unmapped { iova: 0x5000, len: 4 }));
        assert_eq!(events.load(Ordering::Relaxed), PCI_STATUS_REC_MASTER_ABORT, "a failed read is a master abort");
    }

    #[test]
    fn copy_and_check_read_pass_only_while_bus_master_is_enabled_and_a_failed_source_is_a_master_abort() {
        let mem = Arc::new(HeapMemory::new());
        assert!(mem.map(0x1000, 0x1000));
        mem.write_u32(0x1000, 0xfeed).unwrap();
        let command = Arc::new(AtomicU16::new(0));
        let events = Arc::new(AtomicU16::new(0));
        let dma = BusMasterDma::new(mem.clone(), command.clone(), Arc::new(AtomicU64::new(0)), events.clone());
        assert!(matches!(dma.copy(0x1000, 0x1800, 4), Err(DmaError::Permission { iova: 0x1000, .. })));
        assert!(matches!(dma.check_read(0x1000, 4), Err(DmaError::Permission { iova: 0x1000, .. })));
        command.store(PCI_COMMAND_MASTER, Ordering::Release);
        dma.copy(0x1000, 0x1800, 4).unwrap();
        assert_eq!(dma.read_u32(0x1800), Ok(0xfeed));
        assert_eq!(dma.copy(0x1000, 0x5000, 4), Err(DmaError::Unmapped { iova: 0x5000, len: 4 }));
        assert_eq!(events.load(Ordering::Relaxed), 0, "a failed destination is a posted write: no abort");
        assert_eq!(dma.copy(0x5000, 0x1000, 4), Err(DmaError::Unmapped { iova: 0x5000, len: 4 }));
        assert_eq!(events.load(Ordering::Relaxed), PCI_STATUS_REC_MASTER_ABORT);
        events.store(0, Ordering::Relaxed);
        assert_eq!(dma.check_read(0x1ffe, 4), Err(DmaError::Unmapped { iova: 0x1ffe, len: 4 }));
        assert_eq!(events.load(Ordering::Relaxed), PCI_STATUS_REC_MASTER_ABORT);
    }
}
