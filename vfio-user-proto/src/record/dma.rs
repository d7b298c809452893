//! The device's DMA as a session records it.

#![forbid(unsafe_code)]

use std::sync::Arc;

use super::writer::Session;
use crate::dma::{DmaAccess, DmaError, DmaRegion};

/// Forwards every access to `inner` and logs it: reads with their data once known, writes before they land.
/// A copy goes through [`crate::dma::bounce_copy`] (a read then a write), so a replay over DMA messages,
/// which copies the same way, sees the same accesses.
pub struct RecordingDma {
    inner: Arc<dyn DmaAccess>,
    session: Arc<Session>,
}

impl RecordingDma {
    pub fn new(inner: Arc<dyn DmaAccess>, session: Arc<Session>) -> Self {
        RecordingDma { inner, session }
    }
}

impl DmaAccess for RecordingDma {
    fn regions(&self) -> Option<Vec<DmaRegion>> {
        self.inner.regions()
    }
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let result = self.inner.read(iova, buf);
        match &result {
            Ok(()) => self.session.dma_read(iova, buf),
            Err(_) => self.session.dma_failed(iova, buf.len() as u64, false),
        }
        result
    }
    fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        self.session.dma_write(iova, buf);
        let result = self.inner.write(iova, buf);
        if result.is_err() {
            self.session.dma_failed(iova, buf.len() as u64, true);
        }
        result
    }
    fn check_read(&self, iova: u64, len: u64) -> Result<(), DmaError> {
        self.inner.check_read(iova, len)
    }
}
