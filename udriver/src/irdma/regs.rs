//! GEN2 (icrdma, E810) register map, register fields and the per-generation masks/shifts table (reference 3.1,
//! 3.2). All irdma registers are 32-bit and sit in BAR0.

#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::access::{AccessError, DeviceAccess};

/// A bit field `[hi:lo]` of a register or descriptor qword (the kernel's GENMASK / FIELD_PREP / FIELD_GET).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub hi: u32,
    pub lo: u32,
}

impl Field {
    pub const fn new(hi: u32, lo: u32) -> Self {
        Self { hi, lo }
    }
    pub const fn bit(b: u32) -> Self {
        Self { hi: b, lo: b }
    }
    pub const fn mask(self) -> u64 {
        (u64::MAX >> (63 - (self.hi - self.lo))) << self.lo
    }
    /// FIELD_PREP: a value wider than the field is truncated to it.
    pub const fn prep(self, value: u64) -> u64 {
        (value << self.lo) & self.mask()
    }
    pub const fn prep_bool(self, value: bool) -> u64 {
        self.prep(value as u64)
    }
    /// FIELD_GET.
    pub const fn get(self, qword: u64) -> u64 {
        (qword & self.mask()) >> self.lo
    }
    pub const fn get32(self, reg: u32) -> u32 {
        self.get(reg as u64) as u32
    }
}

/// `enum irdma_registers`: the index into the per-generation offset table.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrdmaRegisters {
    IRDMA_CQPTAIL = 0,
    IRDMA_CQPDB,
    IRDMA_CCQPSTATUS,
    IRDMA_CCQPHIGH,
    IRDMA_CCQPLOW,
    IRDMA_CQARM,
    IRDMA_CQACK,
    IRDMA_AEQALLOC,
    IRDMA_CQPERRCODES,
    IRDMA_WQEALLOC,
    IRDMA_GLINT_DYN_CTL,
    IRDMA_DB_ADDR_OFFSET,
    IRDMA_GLPCI_LBARCTRL,
    IRDMA_GLPE_CPUSTATUS0,
    IRDMA_GLPE_CPUSTATUS1,
    IRDMA_GLPE_CPUSTATUS2,
    IRDMA_PFINT_AEQCTL,
    IRDMA_GLINT_CEQCTL,
    IRDMA_VSIQF_PE_CTL1,
    IRDMA_PFHMC_PDINV,
    IRDMA_GLHMC_VFPDINV,
    IRDMA_GLPE_CRITERR,
    IRDMA_GLINT_RATE,
    IRDMA_PFHMC_ERRORINFO,
    IRDMA_PFHMC_ERRORDATA,
}

pub const IRDMA_MAX_REGS: usize = 25;

/// `icrdma_regs[]`: GEN2 PF offsets into BAR0, indexed by `IrdmaRegisters`.
pub const ICRDMA_REGS: [u64; IRDMA_MAX_REGS] = [
    0x0050_0880, // CQPTAIL
    0x0050_0800, // CQPDB
    0x0050_A000, // CCQPSTATUS
    0x0050_A100, // CCQPHIGH
    0x0050_A080, // CCQPLOW
    0x0050_2C00, // CQARM
    0x0050_2C80, // CQACK
    0x0050_2D00, // AEQALLOC
    0x0050_A200, // CQPERRCODES
    0x0050_4400, // WQEALLOC
    0x0016_0000, // GLINT_DYN_CTL (+4 per vector)
    0x007F_0000, // DB_ADDR_OFFSET: a doorbell-page offset (8 MiB - 64 KiB), not a register
    0x0009_DE74, // GLPCI_LBARCTRL
    0x0050_BA5C, // GLPE_CPUSTATUS0
    0x0050_BA60, // GLPE_CPUSTATUS1
    0x0050_BA64, // GLPE_CPUSTATUS2
    0x0016_CB00, // PFINT_AEQCTL
    0x0015_C000, // GLINT_CEQCTL (+4 per vector)
    0x0041_4000, // VSIQF_PE_CTL1 (+4 per VSI)
    0x0052_0300, // PFHMC_PDINV
    0x0052_8300, // GLHMC_VFPDINV (+4 per VF)
    0x0053_4000, // GLPE_CRITERR
    0x0015_A000, // GLINT_RATE (+4 per vector)
    0x0052_0400, // PFHMC_ERRORINFO
    0x0052_0500, // PFHMC_ERRORDATA
];

// Fixed register fields (irdma.h / defs.h).
pub const IRDMA_CQPTAIL_WQTAIL: Field = Field::new(10, 0);
pub const IRDMA_CQPTAIL_CQP_OP_ERR: Field = Field::bit(31);
pub const IRDMA_CQPERRCODE_CQP_MINOR_CODE: Field = Field::new(15, 0);
pub const IRDMA_CQPERRCODE_CQP_MAJOR_CODE: Field = Field::new(31, 16);
pub const IRDMA_WQEALLOC_WQE_DESC_INDEX: Field = Field::new(31, 20);
pub const IRDMA_GLPCI_LBARCTRL_PE_DB_SIZE: Field = Field::new(5, 4);
pub const IRDMA_GLINT_DYN_CTL_INTENA: Field = Field::bit(0);
pub const IRDMA_GLINT_DYN_CTL_CLEARPBA: Field = Field::bit(1);
pub const IRDMA_GLINT_DYN_CTL_ITR_INDX: Field = Field::new(4, 3);
pub const IRDMA_GLINT_DYN_CTL_INTERVAL: Field = Field::new(16, 5);
pub const IRDMA_GLINT_CEQCTL_MSIX_INDX: Field = Field::new(10, 0);
pub const IRDMA_GLINT_CEQCTL_ITR_INDX: Field = Field::new(12, 11);
pub const IRDMA_GLINT_CEQCTL_CAUSE_ENA: Field = Field::bit(30);

/// GLPCI_LBARCTRL.PE_DB_SIZE encodings the driver accepts.
pub const IRDMA_PE_DB_SIZE_4M: u32 = 1;
pub const IRDMA_PE_DB_SIZE_8M: u32 = 2;

/// GLPE_CPUSTATUSn value of a ready protocol engine.
pub const IRDMA_CPU_STATUS_READY: u32 = 0x80;

/// `enum irdma_shifts` / `enum irdma_masks`: per-generation fields.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrdmaShifts {
    IRDMA_CCQPSTATUS_CCQP_DONE = 0,
    IRDMA_CCQPSTATUS_CCQP_ERR,
    IRDMA_CQPSQ_STAG_PDID,
    IRDMA_CQPSQ_CQ_CEQID,
    IRDMA_CQPSQ_CQ_CQID,
    IRDMA_COMMIT_FPM_CQCNT,
    IRDMA_CQPSQ_UPESD_HMCFNID,
}

pub const IRDMA_MAX_SHIFTS: usize = 7;

/// `icrdma_masks` / `icrdma_shifts` as fields; GEN2 has no UPESD_HMCFNID entry.
pub const ICRDMA_FIELDS: [Option<Field>; IRDMA_MAX_SHIFTS] = [
    Some(Field::bit(0)),
    Some(Field::bit(31)),
    Some(Field::new(63, 46)),
    Some(Field::new(31, 22)),
    Some(Field::new(18, 0)),
    Some(Field::new(19, 0)),
    None,
];

/// The GEN2 field of a per-generation mask/shift entry. Only `IRDMA_CQPSQ_UPESD_HMCFNID` is absent on GEN2.
pub const fn icrdma_field(idx: IrdmaShifts) -> Option<Field> {
    ICRDMA_FIELDS[idx as usize]
}

pub const IRDMA_CCQPSTATUS_CCQP_DONE: Field = Field::bit(0);
pub const IRDMA_CCQPSTATUS_CCQP_ERR: Field = Field::bit(31);
pub const IRDMA_CQPSQ_CQ_CEQID: Field = Field::new(31, 22);
pub const IRDMA_CQPSQ_CQ_CQID: Field = Field::new(18, 0);

/// 32-bit register access to one irdma function's BAR0 (the kernel's `readl`/`writel` on `dev->hw_regs[]`).
#[derive(Clone)]
pub struct IrdmaHw {
    dev: Arc<dyn DeviceAccess>,
}

pub const IRDMA_BAR: u32 = 0;

impl IrdmaHw {
    pub fn new(dev: Arc<dyn DeviceAccess>) -> Self {
        Self { dev }
    }
    pub fn device(&self) -> &Arc<dyn DeviceAccess> {
        &self.dev
    }
    pub const fn offset(reg: IrdmaRegisters) -> u64 {
        ICRDMA_REGS[reg as usize]
    }
    pub fn rd32(&self, reg: IrdmaRegisters) -> Result<u32, AccessError> {
        self.dev.read32(IRDMA_BAR, Self::offset(reg))
    }
    pub fn wr32(&self, reg: IrdmaRegisters, value: u32) -> Result<(), AccessError> {
        self.dev.write32(IRDMA_BAR, Self::offset(reg), value)
    }
    /// A write to instance `idx` of a per-vector/per-CEQ register array (`hw_regs[reg] + idx`, 4 bytes
    /// apart).
    pub fn wr32_idx(&self, reg: IrdmaRegisters, idx: u32, value: u32) -> Result<(), AccessError> {
        self.dev.write32(IRDMA_BAR, Self::offset(reg) + 4 * u64::from(idx), value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_prepare_and_extract_like_field_prep_and_field_get() {
        let cases: [(Field, u64, u64); 4] = [
            (Field::new(10, 0), 0x7FF, 0x7FF),
            (Field::bit(63), 1, 0x8000_0000_0000_0000),
            (Field::new(37, 32), 0x25, 0x0000_0025_0000_0000),
            // Too wide a value is truncated to the field, never spills into neighbours.
            (Field::new(5, 4), 0xF, 0x30),
        ];
        for (f, v, q) in cases {
            assert_eq!(f.prep(v), q, "{f:?}");
            assert_eq!(f.get(q), v & (f.mask() >> f.lo), "{f:?}");
        }
        assert_eq!(Field::new(63, 0).mask(), u64::MAX);
    }

    #[test]
    fn gen2_offsets_match_the_icrdma_table() {
        use IrdmaRegisters::*;
        let cases = [
            (IRDMA_CQPTAIL, 0x500880),
            (IRDMA_CQPDB, 0x500800),
            (IRDMA_CCQPSTATUS, 0x50A000),
            (IRDMA_CCQPHIGH, 0x50A100),
            (IRDMA_CCQPLOW, 0x50A080),
            (IRDMA_CQARM, 0x502C00),
            (IRDMA_CQPERRCODES, 0x50A200),
            (IRDMA_GLPCI_LBARCTRL, 0x9DE74),
            (IRDMA_GLPE_CPUSTATUS0, 0x50BA5C),
            (IRDMA_GLPE_CPUSTATUS2, 0x50BA64),
            (IRDMA_PFHMC_ERRORDATA, 0x520500),
        ];
        for (reg, off) in cases {
            assert_eq!(IrdmaHw::offset(reg), off, "{reg:?}");
        }
    }

    #[test]
    fn gen2_mask_table_has_no_upesd_hmcfnid() {
        assert_eq!(icrdma_field(IrdmaShifts::IRDMA_CQPSQ_CQ_CQID), Some(IRDMA_CQPSQ_CQ_CQID));
        assert_eq!(icrdma_field(IrdmaShifts::IRDMA_CQPSQ_CQ_CEQID).map(Field::mask), Some(0xFFC0_0000));
        assert_eq!(icrdma_field(IrdmaShifts::IRDMA_CCQPSTATUS_CCQP_ERR).map(Field::mask), Some(0x8000_0000));
        assert_eq!(icrdma_field(IrdmaShifts::IRDMA_CQPSQ_UPESD_HMCFNID), None);
    }
}
