//! GEN2 (icrdma) BAR0 register offsets and fields (hardware-facts §3.1–3.2), plus where the project's loopback block decodes.
//!
//! Registers are 32 bits wide. Fields are `Field` values so every bit position has one definition.

#![forbid(unsafe_code)]

/// A bit field `[hi:lo]` of a 32- or 64-bit word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub hi: u32,
    pub lo: u32,
}

impl Field {
    pub const fn new(hi: u32, lo: u32) -> Self {
        Self { hi, lo }
    }
    /// A one-bit field.
    pub const fn bit(b: u32) -> Self {
        Self { hi: b, lo: b }
    }
    /// The field's bits in place.
    pub const fn mask(self) -> u64 {
        let width = self.hi - self.lo + 1;
        let ones = if width >= 64 { u64::MAX } else { (1u64 << width) - 1 };
        ones << self.lo
    }
    pub const fn get(self, word: u64) -> u64 {
        (word & self.mask()) >> self.lo
    }
    /// `value` shifted into place; bits that do not fit are dropped.
    pub const fn put(self, value: u64) -> u64 {
        (value << self.lo) & self.mask()
    }
    pub const fn is_set(self, word: u64) -> bool {
        word & self.mask() != 0
    }
}

// Register offsets into BAR0 (`icrdma_regs[]`).
pub const IRDMA_CQPTAIL: u64 = 0x0050_0880;
pub const IRDMA_CQPDB: u64 = 0x0050_0800;
pub const IRDMA_CCQPSTATUS: u64 = 0x0050_A000;
pub const IRDMA_CCQPHIGH: u64 = 0x0050_A100;
pub const IRDMA_CCQPLOW: u64 = 0x0050_A080;
pub const IRDMA_CQARM: u64 = 0x0050_2C00;
pub const IRDMA_CQACK: u64 = 0x0050_2C80;
pub const IRDMA_AEQALLOC: u64 = 0x0050_2D00;
pub const IRDMA_CQPERRCODES: u64 = 0x0050_A200;
pub const IRDMA_WQEALLOC: u64 = 0x0050_4400;
/// Not a register: the offset of the doorbell pages (8 MiB − 64 KiB).
pub const IRDMA_DB_ADDR_OFFSET: u64 = 0x007F_0000;
pub const IRDMA_GLPCI_LBARCTRL: u64 = 0x0009_DE74;
pub const IRDMA_GLPE_CPUSTATUS0: u64 = 0x0050_BA5C;
pub const IRDMA_GLPE_CPUSTATUS1: u64 = 0x0050_BA60;
pub const IRDMA_GLPE_CPUSTATUS2: u64 = 0x0050_BA64;
/// `GLINT_CEQCTL(i)` at `+ 4·i`: routes CEQ `i` to an MSI-X vector.
pub const IRDMA_GLINT_CEQCTL: u64 = 0x0015_C000;

/// BAR0 size: the doorbell pages end at 8 MiB.
pub const IRDMA_BAR0_SIZE: u64 = 8 << 20;
/// Doorbell page area size (`IRDMA_DB_ADDR_OFFSET` to the end of BAR0).
pub const IRDMA_DB_AREA_SIZE: u64 = IRDMA_BAR0_SIZE - IRDMA_DB_ADDR_OFFSET;

// CCQPSTATUS (GEN2 masks).
pub const IRDMA_CCQPSTATUS_CCQP_DONE: Field = Field::bit(0);
pub const IRDMA_CCQPSTATUS_CCQP_ERR: Field = Field::bit(31);

// CQPTAIL.
pub const IRDMA_CQPTAIL_WQTAIL: Field = Field::new(10, 0);
pub const IRDMA_CQPTAIL_CQP_OP_ERR: Field = Field::bit(31);

// CQPERRCODES.
pub const IRDMA_CQPERRCODES_CQP_MINOR_CODE: Field = Field::new(15, 0);
pub const IRDMA_CQPERRCODES_CQP_MAJOR_CODE: Field = Field::new(31, 16);

// WQEALLOC.
pub const IRDMA_WQEALLOC_WQE_DESC_INDEX: Field = Field::new(31, 20);

// GLPCI_LBARCTRL.PE_DB_SIZE codes.
pub const IRDMA_GLPCI_LBARCTRL_PE_DB_SIZE: Field = Field::new(5, 4);
pub const IRDMA_PE_DB_SIZE_4M: u64 = 1;
pub const IRDMA_PE_DB_SIZE_8M: u64 = 2;

/// GLPE_CPUSTATUSn value meaning "PE ready".
pub const IRDMA_GLPE_CPUSTATUS_READY: u32 = 0x80;

// GLINT_CEQCTL.
pub const IRDMA_GLINT_CEQCTL_MSIX_INDX: Field = Field::new(10, 0);
pub const IRDMA_GLINT_CEQCTL_ITR_INDX: Field = Field::new(12, 11);
pub const IRDMA_GLINT_CEQCTL_CAUSE_ENA: Field = Field::bit(30);

// The project's loopback classification block: its own ABI, defined once in `emu_abi::irdma`.
pub use emu_abi::irdma::{
    IRDMA_EMU_LB_BASE, IRDMA_EMU_LB_DESC_HIGH, IRDMA_EMU_LB_DESC_LOW, IRDMA_EMU_LB_DOORBELL, IRDMA_EMU_LB_RESULT,
    IRDMA_EMU_LB_SEQ, IRDMA_EMU_LB_STATUS,
};

/// The CQPERRCODES value for a (major, minor) pair.
pub fn cqperrcodes(major: u16, minor: u16) -> u32 {
    (IRDMA_CQPERRCODES_CQP_MAJOR_CODE.put(u64::from(major)) | IRDMA_CQPERRCODES_CQP_MINOR_CODE.put(u64::from(minor)))
        as u32
}

/// A decoded register offset. Only 4-byte aligned offsets decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reg {
    CqpTail,
    CqpDb,
    CcqpStatus,
    CcqpHigh,
    CcqpLow,
    CqArm,
    CqAck,
    AeqAlloc,
    CqpErrCodes,
    WqeAlloc,
    LbarCtrl,
    CpuStatus,
    /// `GLINT_CEQCTL(i)`.
    CeqCtl(usize),
    /// A write anywhere in the doorbell pages.
    DbPage,
    LbDescLow,
    LbDescHigh,
    LbDoorbell,
    LbStatus,
    LbResult,
    LbSeq,
}

impl Reg {
    /// The register at `offset`, for a function with `ceqs` GLINT_CEQCTL registers.
    pub fn decode(offset: u64, ceqs: usize) -> Option<Reg> {
        if !offset.is_multiple_of(4) {
            return None;
        }
        let reg = match offset {
            IRDMA_CQPTAIL => Reg::CqpTail,
            IRDMA_CQPDB => Reg::CqpDb,
            IRDMA_CCQPSTATUS => Reg::CcqpStatus,
            IRDMA_CCQPHIGH => Reg::CcqpHigh,
            IRDMA_CCQPLOW => Reg::CcqpLow,
            IRDMA_CQARM => Reg::CqArm,
            IRDMA_CQACK => Reg::CqAck,
            IRDMA_AEQALLOC => Reg::AeqAlloc,
            IRDMA_CQPERRCODES => Reg::CqpErrCodes,
            IRDMA_WQEALLOC => Reg::WqeAlloc,
            IRDMA_GLPCI_LBARCTRL => Reg::LbarCtrl,
            IRDMA_GLPE_CPUSTATUS0 | IRDMA_GLPE_CPUSTATUS1 | IRDMA_GLPE_CPUSTATUS2 => Reg::CpuStatus,
            IRDMA_EMU_LB_DESC_LOW => Reg::LbDescLow,
            IRDMA_EMU_LB_DESC_HIGH => Reg::LbDescHigh,
            IRDMA_EMU_LB_DOORBELL => Reg::LbDoorbell,
            IRDMA_EMU_LB_STATUS => Reg::LbStatus,
            IRDMA_EMU_LB_RESULT => Reg::LbResult,
            IRDMA_EMU_LB_SEQ => Reg::LbSeq,
            o if (IRDMA_DB_ADDR_OFFSET..IRDMA_BAR0_SIZE).contains(&o) => Reg::DbPage,
            o if o >= IRDMA_GLINT_CEQCTL && ((o - IRDMA_GLINT_CEQCTL) / 4) < ceqs as u64 => {
                Reg::CeqCtl(((o - IRDMA_GLINT_CEQCTL) / 4) as usize)
            }
            _ => return None,
        };
        Some(reg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gen2_offsets_decode_to_their_registers() {
        let table = [
            (0x0050_0880, Reg::CqpTail),
            (0x0050_0800, Reg::CqpDb),
            (0x0050_A000, Reg::CcqpStatus),
            (0x0050_A100, Reg::CcqpHigh),
            (0x0050_A080, Reg::CcqpLow),
            (0x0050_2C00, Reg::CqArm),
            (0x0050_2C80, Reg::CqAck),
            (0x0050_A200, Reg::CqpErrCodes),
            (0x0050_4400, Reg::WqeAlloc),
            (0x0009_DE74, Reg::LbarCtrl),
            (0x0050_BA5C, Reg::CpuStatus),
            (0x0050_BA60, Reg::CpuStatus),
            (0x0050_BA64, Reg::CpuStatus),
            (0x0015_C004, Reg::CeqCtl(1)),
            (0x007F_0000, Reg::DbPage),
        ];
        for (offset, reg) in table {
            assert_eq!(Reg::decode(offset, 4), Some(reg), "offset {offset:#x}");
        }
    }

    #[test]
    fn misaligned_unknown_and_out_of_range_ceqctl_offsets_do_not_decode() {
        for offset in [0x0050_0881, 0x0, 0x0015_C010, IRDMA_BAR0_SIZE, 0x0050_A004] {
            assert_eq!(Reg::decode(offset, 4), None, "offset {offset:#x}");
        }
    }

    #[test]
    fn field_helpers_match_reference_bit_positions() {
        // G12: CQPTAIL = 0x80000005 means CQP_OP_ERR with tail 5.
        assert!(IRDMA_CQPTAIL_CQP_OP_ERR.is_set(0x8000_0005));
        assert_eq!(IRDMA_CQPTAIL_WQTAIL.get(0x8000_0005), 5);
        assert_eq!(IRDMA_CQPERRCODES_CQP_MAJOR_CODE.put(0xF001) | 0x0001, 0xF001_0001);
        // PE_DB_SIZE = 8 MiB code 2 at bits 5:4.
        assert_eq!(IRDMA_GLPCI_LBARCTRL_PE_DB_SIZE.put(IRDMA_PE_DB_SIZE_8M), 0x20);
        assert_eq!(Field::new(63, 0).mask(), u64::MAX);
    }
}
