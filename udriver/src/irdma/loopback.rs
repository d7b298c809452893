//! The emulation's loopback classification block (project-specific, BAR0 0x600000; docs/irdma-device.md):
//! the driver places a TCP segment descriptor in DMA memory, rings a doorbell, and reads where the device's
//! quad-hash table sent it. A guest can exercise classification with MMIO and DMA alone.
//!
//! Every value read back is checked: an unknown result kind or a sequence that never moves is an error.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::cqp::{sleep, PooledBuffer, QueueMemory};
use super::regs::{Field, IRDMA_BAR};
use super::{IrdmaError, Result};
use crate::access::DeviceAccess;
use crate::dma::DmaPool;

pub const IRDMA_EMU_LB_DESC_LOW: u64 = 0x0060_0000;
pub const IRDMA_EMU_LB_DESC_HIGH: u64 = 0x0060_0004;
pub const IRDMA_EMU_LB_DOORBELL: u64 = 0x0060_0008;
pub const IRDMA_EMU_LB_STATUS: u64 = 0x0060_000C;
pub const IRDMA_EMU_LB_RESULT: u64 = 0x0060_0010;
pub const IRDMA_EMU_LB_SEQ: u64 = 0x0060_0014;

pub const IRDMA_EMU_LB_STATUS_DONE: Field = Field::bit(0);
pub const IRDMA_EMU_LB_STATUS_BUSY: Field = Field::bit(1);
pub const IRDMA_EMU_LB_STATUS_ERRCODE: Field = Field::new(15, 8);
pub const IRDMA_EMU_LB_STATUS_ERR: Field = Field::bit(31);
pub const IRDMA_EMU_LB_RESULT_KIND: Field = Field::new(2, 0);
pub const IRDMA_EMU_LB_RESULT_QPN: Field = Field::new(25, 8);

/// RESULT.KIND values: the matched entry type, 0 for "to host".
pub const IRDMA_EMU_LB_KIND_TO_HOST: u32 = 0;
pub const IRDMA_EMU_LB_KIND_ESTABLISHED: u32 = 1;
pub const IRDMA_EMU_LB_KIND_LISTENER: u32 = 2;

/// Descriptor qword 0 fields; the IP words follow at bytes 8 (source) and 24 (destination).
pub const IRDMA_EMU_LB_DESC_SIZE: usize = 40;
pub const IRDMA_EMU_LB_DESC_SRC_PORT: Field = Field::new(15, 0);
pub const IRDMA_EMU_LB_DESC_DST_PORT: Field = Field::new(31, 16);
pub const IRDMA_EMU_LB_DESC_VLANID: Field = Field::new(43, 32);
pub const IRDMA_EMU_LB_DESC_VLAN_VALID: Field = Field::bit(48);
pub const IRDMA_EMU_LB_DESC_IPV4: Field = Field::bit(49);
pub const IRDMA_EMU_LB_DESC_SYN: Field = Field::bit(50);
pub const IRDMA_EMU_LB_DESC_ACK: Field = Field::bit(51);
const IRDMA_EMU_LB_DESC_SRC_IP: usize = 8;
const IRDMA_EMU_LB_DESC_DST_IP: usize = 24;

/// An incoming TCP segment. Addresses are host-order u32 words as in `IrdmaQhashTableInfo` (IPv4 in `[0]`,
/// IPv6 `[0]` most significant); `dst` is the local end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IrdmaTcpSegment {
    pub ipv4: bool,
    pub src_ip: [u32; 4],
    pub dst_ip: [u32; 4],
    pub src_port: u16,
    pub dst_port: u16,
    pub vlan_id: Option<u16>,
    pub syn: bool,
    pub ack: bool,
}

impl IrdmaTcpSegment {
    /// The 40-byte descriptor.
    pub fn descriptor(&self) -> [u8; IRDMA_EMU_LB_DESC_SIZE] {
        let qw0 = IRDMA_EMU_LB_DESC_SRC_PORT.prep(self.src_port.into())
            | IRDMA_EMU_LB_DESC_DST_PORT.prep(self.dst_port.into())
            | IRDMA_EMU_LB_DESC_VLANID.prep(self.vlan_id.unwrap_or(0).into())
            | IRDMA_EMU_LB_DESC_VLAN_VALID.prep_bool(self.vlan_id.is_some())
            | IRDMA_EMU_LB_DESC_IPV4.prep_bool(self.ipv4)
            | IRDMA_EMU_LB_DESC_SYN.prep_bool(self.syn)
            | IRDMA_EMU_LB_DESC_ACK.prep_bool(self.ack);
        let mut d = [0u8; IRDMA_EMU_LB_DESC_SIZE];
        d[..8].copy_from_slice(&qw0.to_le_bytes());
        for (base, ip) in [(IRDMA_EMU_LB_DESC_SRC_IP, &self.src_ip), (IRDMA_EMU_LB_DESC_DST_IP, &self.dst_ip)] {
            for (i, w) in ip.iter().enumerate() {
                d[base + 4 * i..base + 4 * i + 4].copy_from_slice(&w.to_le_bytes());
            }
        }
        d
    }
}

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
            if IRDMA_EMU_LB_STATUS_BUSY.get32(status) == 0 {
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
        let desc = self.desc.lock().unwrap_or_else(|e| e.into_inner());
        for (i, chunk) in seg.descriptor().chunks_exact(8).enumerate() {
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
        if IRDMA_EMU_LB_STATUS_ERR.get32(status) != 0 || IRDMA_EMU_LB_STATUS_DONE.get32(status) == 0 {
            return Err(IrdmaError::BadRegister { reg: "EMU_LB_STATUS", value: status });
        }
        let result = self.rd32(IRDMA_EMU_LB_RESULT)?;
        let qpn = IRDMA_EMU_LB_RESULT_QPN.get32(result);
        match IRDMA_EMU_LB_RESULT_KIND.get32(result) {
            IRDMA_EMU_LB_KIND_TO_HOST if qpn == 0 => Ok(IrdmaClassifyResult::ToHost),
            IRDMA_EMU_LB_KIND_ESTABLISHED => Ok(IrdmaClassifyResult::Established { qpn }),
            IRDMA_EMU_LB_KIND_LISTENER => Ok(IrdmaClassifyResult::Listener { qpn }),
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
        let d = listener_syn().descriptor();
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

    #[test]
    fn an_ipv6_vlan_syn_descriptor_packs_ports_flags_and_words_in_order() {
        let seg = IrdmaTcpSegment {
            ipv4: false,
            src_ip: [0xFE80_0000, 0, 0, 2],
            dst_ip: [0xFE80_0000, 0, 0, 1],
            src_port: 5000,
            dst_port: 4791,
            vlan_id: Some(100),
            syn: true,
            ack: false,
        };
        let d = seg.descriptor();
        // SRC_PORT 0x1388 | DST_PORT 0x12B7 << 16 | VLANID 100 << 32 | VLAN_VALID 1 << 48 | SYN 1 << 50.
        assert_eq!(d[..8], 0x0005_0064_12B7_1388u64.to_le_bytes());
        assert_eq!(d[8..12], 0xFE80_0000u32.to_le_bytes());
        assert_eq!(d[20..24], 2u32.to_le_bytes());
        assert_eq!(d[24..28], 0xFE80_0000u32.to_le_bytes());
        assert_eq!(d[36..40], 1u32.to_le_bytes());
    }
}
