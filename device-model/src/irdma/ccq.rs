//! The CCQ (hardware-facts §3.8, §3.9): CQE layout and polarity, the consumer index and the arm request
//! the driver keeps in the shadow area.
//!
//! The device keeps one slot free: it writes a CQE only when `(head + 1) % size != consumer`, so
//! `head == consumer` always means "nothing unconsumed" and an unconsumed CQE is never overwritten.

#![forbid(unsafe_code)]

use serde_json::{json, Value};
use vfio_user_proto::dma::{DmaAccess, DmaError};

use super::regs::Field;
use super::wqe::CqCreate;
use super::WqeError;

pub const IRDMA_CQE_SIZE: u64 = 32;
pub const IRDMA_EXTENDED_CQE_SIZE: u64 = 64;
/// Shadow area: 8 qwords.
pub const IRDMA_SHADOW_AREA_SIZE: usize = 64;
/// The only CQ this device implements.
pub const IRDMA_CCQ_CQ_ID: u32 = 0;
/// Smallest CCQ: with one slot kept free, two entries hold one CQE.
pub const IRDMA_EMU_MIN_CCQ_SIZE: u64 = 2;

// CQE qw2 / qw3.
pub const IRDMA_CCQ_OPRETVAL: Field = Field::new(31, 0);
pub const IRDMA_CQ_MINERR: Field = Field::new(15, 0);
pub const IRDMA_CQ_MAJERR: Field = Field::new(31, 16);
pub const IRDMA_CQ_WQEIDX: Field = Field::new(46, 32);
pub const IRDMA_CQ_EXTCQE: Field = Field::bit(50);
pub const IRDMA_CQ_ERROR: Field = Field::bit(55);
pub const IRDMA_CQ_VALID: Field = Field::bit(63);

// Shadow area qw0 and qw4.
pub const IRDMA_CQ_DBSA_CQEIDX: Field = Field::new(19, 0);
pub const IRDMA_CQ_DBSA_SW_CQ_SELECT: Field = Field::new(13, 0);
pub const IRDMA_CQ_DBSA_ARM_NEXT: Field = Field::bit(14);
pub const IRDMA_CQ_DBSA_ARM_NEXT_SE: Field = Field::bit(15);
pub const IRDMA_CQ_DBSA_ARM_SEQ_NUM: Field = Field::new(17, 16);

/// qw0..qw3 of a CCQ CQE. qw0's meaning is NOT FOUND in the reference: the device writes 0.
pub fn encode_cqe(
    valid: bool,
    completion_context: u64,
    wqe_idx: u32,
    op_ret_val: u32,
    error: Option<(u16, u16)>,
) -> [u64; 4] {
    let mut qw3 = IRDMA_CQ_WQEIDX.put(u64::from(wqe_idx)) | IRDMA_CQ_VALID.put(u64::from(valid));
    if let Some((major, minor)) = error {
        qw3 |= IRDMA_CQ_ERROR.put(1) | IRDMA_CQ_MAJERR.put(u64::from(major)) | IRDMA_CQ_MINERR.put(u64::from(minor));
    }
    [0, completion_context, IRDMA_CCQ_OPRETVAL.put(u64::from(op_ret_val)), qw3]
}

/// The device's side of the CCQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ccq {
    pub cfg: CqCreate,
    pub size: u32,
    /// Next slot the device writes.
    pub head: u32,
    /// Valid bit of CQEs written on this pass; starts at 1.
    pub polarity: bool,
    /// Consumer index as last read from shadow qw0.
    pub consumer: u32,
    pub armed: bool,
    /// ARM_SEQ_NUM of the last accepted arm.
    pub arm_seq: u8,
    pub wraps: u64,
}

impl Ccq {
    pub fn new(cfg: CqCreate, max_size: u64) -> Result<Ccq, WqeError> {
        if cfg.cq_id != IRDMA_CCQ_CQ_ID {
            return Err(WqeError::CqIdUnsupported(cfg.cq_id));
        }
        if !(IRDMA_EMU_MIN_CCQ_SIZE..=max_size.min(IRDMA_CQ_DBSA_CQEIDX.mask() + 1)).contains(&cfg.cq_size) {
            return Err(WqeError::BadField("cq_size outside the supported range"));
        }
        let cqe = if cfg.extended_cqe { IRDMA_EXTENDED_CQE_SIZE } else { IRDMA_CQE_SIZE };
        if cfg.ring_pa.checked_add(cfg.cq_size * cqe).is_none() || cfg.shadow_pa.checked_add(64).is_none() {
            return Err(WqeError::BadField("CQ ring or shadow area wraps the address space"));
        }
        Ok(Ccq {
            cfg,
            size: cfg.cq_size as u32,
            head: 0,
            polarity: true,
            consumer: 0,
            armed: false,
            arm_seq: 0,
            wraps: 0,
        })
    }

    pub fn cqe_size(&self) -> u64 {
        if self.cfg.extended_cqe {
            IRDMA_EXTENDED_CQE_SIZE
        } else {
            IRDMA_CQE_SIZE
        }
    }

    pub fn slot_addr(&self, idx: u32) -> u64 {
        self.cfg.ring_pa + u64::from(idx) * self.cqe_size()
    }

    pub fn has_space(&self) -> bool {
        (self.head + 1) % self.size != self.consumer
    }

    /// CQEs written and not yet consumed (per the last consumer index read).
    pub fn unconsumed(&self) -> bool {
        self.head != self.consumer
    }

    /// Reads the shadow area (consumer index in qw0, arm word in qw4).
    pub fn read_shadow(&self, dma: &dyn DmaAccess) -> Result<[u64; 8], DmaError> {
        let mut bytes = [0u8; IRDMA_SHADOW_AREA_SIZE];
        dma.read(self.cfg.shadow_pa, &mut bytes)?;
        let mut qw = [0u64; 8];
        for (q, chunk) in qw.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *q = u64::from_le_bytes(b);
        }
        Ok(qw)
    }

    /// Takes the consumer index from shadow qw0. Returns false (and keeps the old one) if it is out of range.
    pub fn set_consumer(&mut self, shadow_qw0: u64) -> bool {
        let ci = IRDMA_CQ_DBSA_CQEIDX.get(shadow_qw0) as u32;
        if ci >= self.size {
            return false;
        }
        self.consumer = ci;
        true
    }

    /// Checks that the ring's first and last slots and the shadow area are mapped.
    pub fn probe(&self, dma: &dyn DmaAccess) -> Result<(), DmaError> {
        let mut slot = [0u8; IRDMA_CQE_SIZE as usize];
        dma.read(self.slot_addr(0), &mut slot)?;
        dma.read(self.slot_addr(self.size - 1), &mut slot)?;
        self.read_shadow(dma).map(|_| ())
    }

    /// Writes one CQE at `head` (qw0..2 first, then qw3 with the valid bit, as hardware orders it) and
    /// advances. On a DMA error nothing advances.
    pub fn push(&mut self, dma: &dyn DmaAccess, cqe: [u64; 4]) -> Result<(), DmaError> {
        self.write_slot(dma, self.head, cqe)?;
        self.advance();
        Ok(())
    }

    /// Writes `cqe` into `slot`, its valid qword last.
    pub fn write_slot(&self, dma: &dyn DmaAccess, slot: u32, cqe: [u64; 4]) -> Result<(), DmaError> {
        self.write_body(dma, slot, cqe)?;
        self.write_valid(dma, slot, cqe)
    }

    /// Writes qwords 0..2 of `cqe` into `slot` (and zeroes an extended CQE's second half): the driver does not
    /// see the CQE yet, its valid bit is in qword 3.
    pub fn write_body(&self, dma: &dyn DmaAccess, slot: u32, cqe: [u64; 4]) -> Result<(), DmaError> {
        let addr = self.slot_addr(slot);
        let mut body = [0u8; 24];
        for (chunk, q) in body.chunks_exact_mut(8).zip(&cqe[..3]) {
            chunk.copy_from_slice(&q.to_le_bytes());
        }
        dma.write(addr, &body)?;
        if self.cfg.extended_cqe {
            dma.write(addr + IRDMA_CQE_SIZE, &[0u8; 32])?;
        }
        Ok(())
    }

    /// Writes qword 3 of `cqe`, with its valid bit, into `slot`: from here the CQE is the driver's.
    pub fn write_valid(&self, dma: &dyn DmaAccess, slot: u32, cqe: [u64; 4]) -> Result<(), DmaError> {
        dma.write_u64(self.slot_addr(slot) + 24, cqe[3])
    }

    /// Moves the head to the next slot, flipping the polarity at the wrap.
    pub fn advance(&mut self) {
        self.head = (self.head + 1) % self.size;
        if self.head == 0 {
            self.polarity = !self.polarity;
            self.wraps += 1;
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "cq_id": self.cfg.cq_id,
            "ring_pa": format!("{:#x}", self.cfg.ring_pa),
            "shadow_pa": format!("{:#x}", self.cfg.shadow_pa),
            "size": self.size,
            "cqe_size": self.cqe_size(),
            "head": self.head,
            "consumer": self.consumer,
            "polarity": u8::from(self.polarity),
            "wraps": self.wraps,
            "armed": self.armed,
            "arm_seq": self.arm_seq,
            "ceq_id": self.cfg.ceq_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use vfio_user_proto::dma::HeapMemory;

    use super::*;

    fn cfg(size: u64) -> CqCreate {
        CqCreate {
            cq_id: 0,
            cq_size: size,
            ring_pa: 0x10000,
            shadow_pa: 0x20000,
            ceq_id: Some(0),
            shadow_read_threshold: 16,
            extended_cqe: false,
        }
    }

    #[test]
    fn g12_cqe_qw3_layouts() {
        assert_eq!(encode_cqe(true, 0, 5, 0, None)[3], 0x8000_0005_0000_0000);
        assert_eq!(encode_cqe(true, 0, 5, 0, Some((0xF001, 0x0001)))[3], 0x8080_0005_F001_0001);
        assert_eq!(encode_cqe(false, 0xABCD, 2047, 7, None), [0, 0xABCD, 7, 0x0000_07FF_0000_0000]);
    }

    #[test]
    fn g12_first_arm_word_decodes_as_arm_next_with_sequence_1() {
        let qw4 = 0x0000_0000_0001_4000;
        assert!(IRDMA_CQ_DBSA_ARM_NEXT.is_set(qw4));
        assert_eq!(IRDMA_CQ_DBSA_ARM_SEQ_NUM.get(qw4), 1);
        assert_eq!(IRDMA_CQ_DBSA_SW_CQ_SELECT.get(qw4), 0);
        assert!(!IRDMA_CQ_DBSA_ARM_NEXT_SE.is_set(qw4));
    }

    #[test]
    fn ccq_keeps_one_slot_free_and_flips_polarity_on_wrap() {
        let mem = HeapMemory::new();
        assert!(mem.map(0x10000, 0x1000));
        let mut ccq = Ccq::new(cfg(3), 1 << 20).unwrap();
        ccq.push(&mem, encode_cqe(ccq.polarity, 0, 0, 0, None)).unwrap();
        ccq.push(&mem, encode_cqe(ccq.polarity, 0, 1, 0, None)).unwrap();
        assert!(!ccq.has_space(), "two CQEs fill a 3-entry ring");
        assert!(ccq.set_consumer(2));
        assert!(ccq.has_space());
        ccq.push(&mem, encode_cqe(ccq.polarity, 0, 2, 0, None)).unwrap();
        assert_eq!((ccq.head, ccq.polarity), (0, false));
        assert_eq!(mem.read_u64(0x10000 + 2 * 32 + 24).unwrap(), 0x8000_0002_0000_0000);
    }

    #[test]
    fn out_of_range_consumer_index_is_refused() {
        let mut ccq = Ccq::new(cfg(4), 1 << 20).unwrap();
        assert!(!ccq.set_consumer(4));
        assert_eq!(ccq.consumer, 0);
    }

    #[test]
    fn ccq_create_checks_id_and_size() {
        assert_eq!(Ccq::new(CqCreate { cq_id: 1, ..cfg(4) }, 1 << 20), Err(WqeError::CqIdUnsupported(1)));
        assert!(matches!(Ccq::new(cfg(1), 1 << 20), Err(WqeError::BadField(_))));
        assert!(matches!(Ccq::new(cfg(5000), 4096), Err(WqeError::BadField(_))));
        assert!(Ccq::new(cfg(2050), 1 << 20).is_ok());
    }

    #[test]
    fn failed_cqe_write_advances_nothing() {
        let mem = HeapMemory::new();
        let mut ccq = Ccq::new(cfg(4), 1 << 20).unwrap();
        assert!(ccq.push(&mem, encode_cqe(true, 0, 0, 0, None)).is_err());
        assert_eq!((ccq.head, ccq.polarity), (0, true));
    }
}
