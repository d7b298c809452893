//! The emulation's loopback classification block (project-specific, BAR0 0x600000; docs/irdma-device.md):
//! the driver places a TCP segment descriptor in DMA memory, rings a doorbell, and reads where the device's
//! quad-hash table sent it. A guest can exercise classification with MMIO and DMA alone.
//!
//! Every value read back is checked: an unknown result kind or a sequence that never moves is an error.

#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emu_abi::irdma::LbSegment;
use vfio_user_proto::sync::Unpoison;

use super::cqp::{sleep, PooledBuffer, QueueMemory};
use super::regs::IRDMA_BAR;
use super::{IrdmaError, Result};
use crate::access::DeviceAccess;
use crate::dma::DmaPool;

// The block, its descriptor and its codes are the project's own ABI (`emu_abi::irdma`).
pub use emu_abi::irdma::{
    LbKind, LbResult, LbStatus, IRDMA_EMU_LB_DESC_HIGH, IRDMA_EMU_LB_DESC_LOW, IRDMA_EMU_LB_DESC_SIZE,
    IRDMA_EMU_LB_DOORBELL, IRDMA_EMU_LB_RESULT, IRDMA_EMU_LB_SEQ, IRDMA_EMU_LB_STATUS,
};

/// An incoming TCP segment, as the loopback descriptor carries it (the project's ABI). Addresses are
/// host-order u32 words as in `IrdmaQhashTableInfo` (IPv4 in `[0]`, IPv6 `[0]` most significant); `dst` is
/// the local end.
pub type IrdmaTcpSegment = LbSegment;

/// Where the device sent a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrdmaClassifyResult {
    ToHost,
    Established { qpn: u32 },
    Listener { qpn: u32 },
}

impl IrdmaClassifyResult {
    pub fn qpn(&self) -> Option<u32> {
        match self {
            IrdmaClassifyResult::ToHost => None,
            IrdmaClassifyResult::Established { qpn } | IrdmaClassifyResult::Listener { qpn } => Some(*qpn),
        }
    }
    pub fn name(&self) -> &'static str {
        match self {
            IrdmaClassifyResult::ToHost => "host",
            IrdmaClassifyResult::Established { .. } => "established",
            IrdmaClassifyResult::Listener { .. } => "listener",
        }
    }
}

/// The loopback classifier of one function: a descriptor buffer in DMA memory, one request at a time.
pub struct IrdmaLoopback {
    dev: Arc<dyn DeviceAccess>,
    /// The descriptor buffer; the lock serialises requests (SEQ counts them all).
    desc: Mutex<PooledBuffer>,
    desc_pa: u64,
    timeout: Duration,
    poll: Duration,
}

impl IrdmaLoopback {
    /// Allocates the descriptor buffer. `timeout` bounds each request.
    pub fn new(pool: &Arc<DmaPool>, timeout: Duration, poll: Duration) -> Result<Self> {
        let desc = PooledBuffer::alloc_contiguous(pool, IRDMA_EMU_LB_DESC_SIZE)?;
        let desc_pa = desc.iova(0).ok_or_else(|| IrdmaError::Inval("descriptor has no IOVA".into()))?;
        Ok(Self { dev: pool.device().clone(), desc: Mutex::new(desc), desc_pa, timeout, poll })
    }

    fn rd32(&self, offset: u64) -> Result<u32> {
        Ok(self.dev.read32(IRDMA_BAR, offset)?)
    }
    fn wr32(&self, offset: u64, value: u32) -> Result<()> {
        Ok(self.dev.write32(IRDMA_BAR, offset, value)?)
    }

    /// Waits until no request is queued (STATUS.BUSY clear); returns that STATUS.
    fn wait_idle(&self, deadline: Instant) -> Result<u32> {
        loop {
            let status = self.rd32(IRDMA_EMU_LB_STATUS)?;
            if !LbStatus::new_with_raw_value(status).busy() {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(IrdmaError::Timeout("loopback classification (EMU_LB_STATUS.BUSY)"));
            }
            sleep(self.poll);
        }
    }

    /// Classifies `seg`: descriptor to DMA memory, its address to DESC_LOW/HIGH, DOORBELL, then wait for SEQ
    /// to move and BUSY to clear, and read STATUS and RESULT. -EIO for a device-reported error or a nonsensical result,
    /// -ETIMEDOUT if SEQ never moves.
    pub fn classify(&self, seg: &IrdmaTcpSegment) -> Result<IrdmaClassifyResult> {
        let desc = self.desc.lock().unpoison();
        for (i, chunk) in seg.encode().chunks_exact(8).enumerate() {
            let mut q = [0u8; 8];
            q.copy_from_slice(chunk);
            desc.write_u64(8 * i, u64::from_le_bytes(q))?;
        }
        desc.dma_wmb();
        let deadline = Instant::now() + self.timeout;
        // A request left over from a timed-out caller must finish first, or its SEQ step would pass for ours.
        self.wait_idle(deadline)?;
        self.wr32(IRDMA_EMU_LB_DESC_LOW, self.desc_pa as u32)?;
        self.wr32(IRDMA_EMU_LB_DESC_HIGH, (self.desc_pa >> 32) as u32)?;
        let seq = self.rd32(IRDMA_EMU_LB_SEQ)?;
        self.wr32(IRDMA_EMU_LB_DOORBELL, 1)?;
        while self.rd32(IRDMA_EMU_LB_SEQ)? == seq {
            if Instant::now() >= deadline {
                return Err(IrdmaError::Timeout("loopback classification (EMU_LB_SEQ)"));
            }
            sleep(self.poll);
        }
        let status = self.wait_idle(deadline)?;
        let st = LbStatus::new_with_raw_value(status);
        if st.err() || !st.done() {
            return Err(IrdmaError::BadRegister { reg: "EMU_LB_STATUS", value: status });
        }
        let result = self.rd32(IRDMA_EMU_LB_RESULT)?;
        let r = LbResult::new_with_raw_value(result);
        let qpn = r.qpn().value();
        match r.kind() {
            Ok(LbKind::ToHost) if qpn == 0 => Ok(IrdmaClassifyResult::ToHost),
            Ok(LbKind::Established) => Ok(IrdmaClassifyResult::Established { qpn }),
            Ok(LbKind::Listener) => Ok(IrdmaClassifyResult::Listener { qpn }),
            _ => Err(IrdmaError::BadRegister { reg: "EMU_LB_RESULT", value: result }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::irdma::testdev::FakeIrdma;

    fn loopback(dev: &Arc<FakeIrdma>) -> IrdmaLoopback {
        let pool = Arc::new(DmaPool::new(dev.clone(), false));
        IrdmaLoopback::new(&pool, Duration::from_millis(20), Duration::from_micros(1)).unwrap()
    }

    fn listener_syn() -> IrdmaTcpSegment {
        IrdmaTcpSegment {
            ipv4: true,
            src_ip: [0x0A00_0002, 0, 0, 0],
            dst_ip: [0x0A00_0001, 0, 0, 0],
            src_port: 5000,
            dst_port: 4791,
            syn: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_request_places_the_descriptor_in_dma_memory_and_decodes_the_result() {
        let dev = FakeIrdma::scripted();
        let lb = loopback(&dev);
        // SEQ sampled 4, then moves to 5; RESULT = KIND 2 (listener) | QPN 7 << 8.
        dev.script_offset(IRDMA_EMU_LB_SEQ, &[4, 5]);
        dev.script_offset(IRDMA_EMU_LB_STATUS, &[0, 1]);
        dev.script_offset(IRDMA_EMU_LB_RESULT, &[0x0702]);
        assert_eq!(lb.classify(&listener_syn()).unwrap(), IrdmaClassifyResult::Listener { qpn: 7 });
        let w = dev.writes();
        let at = |o| w.iter().find(|(off, _)| *off == o).map(|(_, v)| *v).unwrap();
        let iova = u64::from(at(IRDMA_EMU_LB_DESC_HIGH)) << 32 | u64::from(at(IRDMA_EMU_LB_DESC_LOW));
        let d = listener_syn().encode();
        for (i, chunk) in d.chunks_exact(8).enumerate() {
            assert_eq!(dev.dma_read_u64(iova + 8 * i as u64).to_le_bytes(), chunk, "qword {i}");
        }
        assert_eq!(w.last(), Some(&(IRDMA_EMU_LB_DOORBELL, 1)), "the doorbell comes last");
    }

    #[test]
    fn a_hostile_or_stuck_loopback_block_gives_errors_not_hangs() {
        // (what, SEQ: first reads then steady value, STATUS likewise, RESULT, errno)
        type Reg<'a> = (&'a [u32], u32);
        let cases: [(&str, Reg, Reg, u32, i32); 5] = [
            ("SEQ never moves", (&[], 3), (&[], 0), 0, -libc::ETIMEDOUT),
            ("BUSY never clears", (&[3], 4), (&[0], 0x2), 0, -libc::ETIMEDOUT),
            ("device-reported error", (&[3], 4), (&[0], 0x8000_0100), 0, -libc::EIO),
            ("unknown result kind", (&[3], 4), (&[0], 1), 0x0705, -libc::EIO),
            ("to host with a QPN", (&[3], 4), (&[0], 1), 0x0700, -libc::EIO),
        ];
        for (what, seq, status, result, errno) in cases {
            let dev = FakeIrdma::scripted();
            let lb = loopback(&dev);
            for (offset, (first, steady)) in [(IRDMA_EMU_LB_SEQ, seq), (IRDMA_EMU_LB_STATUS, status)] {
                dev.script_offset(offset, first);
                dev.set_offset(offset, steady);
            }
            dev.set_offset(IRDMA_EMU_LB_RESULT, result);
            let r = lb.classify(&listener_syn());
            assert_eq!(r.err().map(|e| e.to_errno()), Some(errno), "{what}");
        }
    }
}
