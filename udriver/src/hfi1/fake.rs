//! A fake hfi1 BAR0 for tests: registers read back what was written (with RCV_ARRAY_CNT / RCV_CONTEXTS
//! preset), every 64-bit write and WC flush is logged in order, and DMA mapping is a no-op.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::access::{AccessError, DeviceAccess, DeviceIdentity, Result};
use crate::dma::{DmaMemory, DmaPool};

use super::ctxt::{Hfi1Ctxtdata, Hfi1Devdata, Hfi1Params};
use super::regs::{RCV_ARRAY_CNT, RCV_CONTEXTS};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Write(u64, u64),
    Flush,
}

#[derive(Default)]
pub struct FakeHfi1 {
    regs: Mutex<HashMap<u64, u64>>,
    log: Mutex<Vec<Op>>,
    /// Writes at or above this offset fail (to exercise device-error paths).
    fail_from: Mutex<Option<u64>>,
    /// BARs reported as mapped memory in `identity()`.
    mapped_bars: Mutex<Vec<u32>>,
}

impl FakeHfi1 {
    pub fn new(rcv_array_cnt: u64, rcv_contexts: u64) -> Arc<Self> {
        let f = Self::default();
        {
            let mut r = f.regs.lock().unwrap();
            r.insert(RCV_ARRAY_CNT, rcv_array_cnt);
            r.insert(RCV_CONTEXTS, rcv_contexts);
        }
        Arc::new(f)
    }
    pub fn log(&self) -> Vec<Op> {
        self.log.lock().unwrap().clone()
    }
    pub fn clear_log(&self) {
        self.log.lock().unwrap().clear();
    }
    /// Writes only, in order.
    pub fn writes(&self) -> Vec<(u64, u64)> {
        self.log()
            .into_iter()
            .filter_map(|o| match o {
                Op::Write(a, v) => Some((a, v)),
                Op::Flush => None,
            })
            .collect()
    }
    pub fn reg(&self, offset: u64) -> Option<u64> {
        self.regs.lock().unwrap().get(&offset).copied()
    }
    pub fn set_mapped_bars(&self, bars: &[u32]) {
        *self.mapped_bars.lock().unwrap() = bars.to_vec();
    }
    pub fn fail_writes_from(&self, offset: Option<u64>) {
        *self.fail_from.lock().unwrap() = offset;
    }
}

impl DeviceAccess for FakeHfi1 {
    fn identity(&self) -> DeviceIdentity {
        DeviceIdentity {
            backend: "in-process",
            mapped_bars: self.mapped_bars.lock().unwrap().clone(),
            ..Default::default()
        }
    }
    fn read32(&self, _bar: u32, offset: u64) -> Result<u32> {
        Ok(self.reg(offset).unwrap_or(0) as u32)
    }
    fn write32(&self, _bar: u32, offset: u64, value: u32) -> Result<()> {
        self.write64(0, offset, u64::from(value))
    }
    fn read64(&self, _bar: u32, offset: u64) -> Result<u64> {
        Ok(self.reg(offset).unwrap_or(0))
    }
    fn write64(&self, _bar: u32, offset: u64, value: u64) -> Result<()> {
        if self.fail_from.lock().unwrap().is_some_and(|f| offset >= f) {
            return Err(AccessError::Errno { op: "write64", errno: libc::EIO });
        }
        self.regs.lock().unwrap().insert(offset, value);
        self.log.lock().unwrap().push(Op::Write(offset, value));
        Ok(())
    }
    fn dma_map(&self, _mem: &Arc<DmaMemory>, _offset: u64, _len: u64, _iova: u64) -> Result<()> {
        Ok(())
    }
    fn dma_unmap(&self, _iova: u64, _len: u64) -> Result<()> {
        Ok(())
    }
    fn enable_msix(&self, _nvec: u32) -> Result<()> {
        Ok(())
    }
    fn wait_irq(&self, _vector: u32, timeout: Duration) -> Result<bool> {
        std::thread::sleep(timeout.min(Duration::from_millis(1)));
        Ok(false)
    }
    fn flush_wc(&self) {
        self.log.lock().unwrap().push(Op::Flush);
    }
}

/// A fake device, its devdata, context `ctxt` and a DMA pool on it.
pub struct Rig {
    pub fake: Arc<FakeHfi1>,
    pub dd: Arc<Hfi1Devdata>,
    pub rcd: Arc<Hfi1Ctxtdata>,
    pub pool: DmaPool,
}

/// One context owning `groups` TID groups: RcvArray of `groups` * 8 expected entries after an eager part
/// that rcvarr_split 0 makes empty.
pub fn rig(groups: u32) -> Rig {
    let fake = FakeHfi1::new(u64::from(groups) * 8, 1);
    let params = Hfi1Params { rcvarr_split: 0, ..Default::default() };
    let dd = Hfi1Devdata::probe(fake.clone(), params).unwrap();
    let rcd = Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, 0).unwrap();
    let pool = DmaPool::new(fake.clone(), false);
    fake.clear_log();
    Rig { fake, dd, rcd, pool }
}
