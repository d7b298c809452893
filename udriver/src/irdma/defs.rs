//! Descriptor layouts and constants (defs.h / type.h): CQP WQEs, the CQP host context, CCQ CQEs and the CQ
//! shadow area (reference 3.3, 3.4, 3.6-3.9).

#![forbid(unsafe_code)]

use super::regs::Field;

/// Byte offsets of the qwords of a descriptor (`IRDMA_BYTE_n`).
pub const IRDMA_BYTE_0: usize = 0;
pub const IRDMA_BYTE_8: usize = 8;
pub const IRDMA_BYTE_16: usize = 16;
pub const IRDMA_BYTE_24: usize = 24;
pub const IRDMA_BYTE_32: usize = 32;
pub const IRDMA_BYTE_40: usize = 40;
pub const IRDMA_BYTE_48: usize = 48;
pub const IRDMA_BYTE_56: usize = 56;

// Sizes.
pub const IRDMA_CQP_WQE_SIZE: usize = 64;
pub const IRDMA_CQP_CTX_SIZE: usize = 64;
pub const IRDMA_CQE_SIZE: usize = 32;
pub const IRDMA_SHADOW_AREA_SIZE: usize = 64;
pub const IRDMA_CQP_SW_SQSIZE_4: u32 = 4;
pub const IRDMA_CQP_SW_SQSIZE_2048: u32 = 2048;
pub const IRDMA_CQP_ALIGNMENT: u64 = 0x200;
pub const IRDMA_CQ0_ALIGNMENT: u64 = 0x100;
/// NOT FOUND in the reference; 64 B is the context's own size (decision, docs/udriver-irdma.md).
pub const IRDMA_HOST_CTX_ALIGNMENT: u64 = 64;
pub const IRDMA_SD_BUF_ALIGNMENT: u64 = 0x80;
/// The shadow area is read and written a whole qword at a time (qw0 consumer index, qw4 arm word); the
/// reference gives it no alignment beyond that.
pub const IRDMA_SHADOW_AREA_ALIGNMENT: u64 = 8;
pub const IRDMA_UPDATE_SD_BUFF_SIZE: usize = 128;
/// The newer kernels' value (older ones used 2049).
pub const IW_CCQ_SIZE: u32 = 2050;
pub const IRDMA_CCQ_SHADOW_READ_THRESHOLD: u32 = 16;
/// user.h IRDMA_MAX_CEQID + 1: the CEQ ids a CQ context's 10-bit CEQID can name.
pub const IRDMA_CEQ_MAX_COUNT: u32 = 1024;
/// IRDMA_DONE_COUNT and IRDMA_SLEEP_COUNT (µs), and the PE readiness retry count.
pub const IRDMA_DONE_COUNT: u32 = 1000;
pub const IRDMA_SLEEP_COUNT_US: u64 = 10;
pub const IRDMA_MAX_PE_READY_COUNT: u32 = 14;

/// CQP opcodes (IRDMA_CQP_OP_*).
pub const IRDMA_CQP_OP_CREATE_CQ: u8 = 0x03;
pub const IRDMA_CQP_OP_DESTROY_CQ: u8 = 0x05;
pub const IRDMA_CQP_OP_QUERY_STAG: u8 = 0x0B;
pub const IRDMA_CQP_OP_NOP: u8 = 0x24;
pub const IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY: u8 = 0x25;

// Generic CQP WQE header (qw3).
pub const IRDMA_CQPSQ_OPCODE: Field = Field::new(37, 32);
pub const IRDMA_CQPSQ_WQEVALID: Field = Field::bit(63);

// CQP host context (3.4).
pub const IRDMA_CQPHC_DISABLE_PFPDUS: Field = Field::bit(1);
pub const IRDMA_CQPHC_ROCEV2_RTO_POLICY: Field = Field::bit(2);
pub const IRDMA_CQPHC_PROTOCOL_USED: Field = Field::new(4, 3);
pub const IRDMA_CQPHC_SQSIZE: Field = Field::new(11, 8);
pub const IRDMA_CQPHC_SVER: Field = Field::new(31, 24);
pub const IRDMA_CQPHC_CEQPERVF: Field = Field::new(39, 32);
pub const IRDMA_CQPHC_SQBASE: Field = Field::new(63, 9);
pub const IRDMA_CQPHC_HMC_PROFILE: Field = Field::new(2, 0);
pub const IRDMA_CQPHC_EN_REM_ENDPOINT_TRK: Field = Field::bit(3);
pub const IRDMA_CQPHC_ENABLED_VFS: Field = Field::new(37, 32);
pub const IRDMA_CQPHC_QPCTX: Field = Field::new(63, 0);
pub const IRDMA_CQPHC_HW_MINVER: Field = Field::new(15, 0);
pub const IRDMA_CQPHC_HW_MAJVER: Field = Field::new(31, 16);
pub const IRDMA_CQPHC_MIN_RATE: Field = Field::new(51, 48);
pub const IRDMA_CQPHC_MIN_DEC_FACTOR: Field = Field::new(59, 56);
pub const IRDMA_CQPHC_DCQCN_T: Field = Field::new(15, 0);
pub const IRDMA_CQPHC_HAI_FACTOR: Field = Field::new(47, 32);
pub const IRDMA_CQPHC_RAI_FACTOR: Field = Field::new(63, 48);
pub const IRDMA_CQPHC_DCQCN_B: Field = Field::new(24, 0);
pub const IRDMA_CQPHC_DCQCN_F: Field = Field::new(27, 25);
pub const IRDMA_CQPHC_CC_CFG_VALID: Field = Field::bit(31);
pub const IRDMA_CQPHC_RREDUCE_MPERIOD: Field = Field::new(63, 32);

// CQ create WQE (3.9).
pub const IRDMA_CQPSQ_CQ_SHADOW_READ_THRESHOLD: Field = Field::new(17, 0);
pub const IRDMA_CQPSQ_CQ_FIRSTPMPBLIDX: Field = Field::new(27, 0);
pub const IRDMA_CQPSQ_TPHVAL: Field = Field::new(7, 0);
pub const IRDMA_CQPSQ_VSIIDX: Field = Field::new(17, 8);
pub const IRDMA_CQPSQ_CQ_LPBLSIZE: Field = Field::new(45, 44);
pub const IRDMA_CQPSQ_CQ_CHKOVERFLOW: Field = Field::bit(46);
pub const IRDMA_CQPSQ_CQ_VIRTMAP: Field = Field::bit(47);
pub const IRDMA_CQPSQ_CQ_ENCEQEMASK: Field = Field::bit(48);
pub const IRDMA_CQPSQ_CQ_CEQIDVALID: Field = Field::bit(49);
pub const IRDMA_CQPSQ_TPHEN: Field = Field::bit(60);
pub const IRDMA_CQPSQ_CQ_AVOIDMEMCNFLCT: Field = Field::bit(61);

// CCQ CQE (3.8).
pub const IRDMA_CCQ_OPRETVAL: Field = Field::new(31, 0);
pub const IRDMA_CQ_MINERR: Field = Field::new(15, 0);
pub const IRDMA_CQ_MAJERR: Field = Field::new(31, 16);
pub const IRDMA_CQ_WQEIDX: Field = Field::new(46, 32);
pub const IRDMA_CQ_EXTCQE: Field = Field::bit(50);
pub const IRDMA_CQ_ERROR: Field = Field::bit(55);
pub const IRDMA_CQ_VALID: Field = Field::bit(63);

// CQ shadow area: qw0 consumer index, qw4 arm word.
pub const IRDMA_CQ_DBSA_CQEIDX: Field = Field::new(19, 0);
pub const IRDMA_CQ_DBSA_SW_CQ_SELECT: Field = Field::new(13, 0);
pub const IRDMA_CQ_DBSA_ARM_NEXT: Field = Field::bit(14);
pub const IRDMA_CQ_DBSA_ARM_NEXT_SE: Field = Field::bit(15);
pub const IRDMA_CQ_DBSA_ARM_SEQ_NUM: Field = Field::new(17, 16);

// Major / minor completion codes (3.10).
pub const IRDMA_CQPSQ_MAJ_NO_ERROR: u16 = 0x0000;
pub const IRDMA_CQPSQ_MAJ_OBJCACHE_ERROR: u16 = 0xF000;
pub const IRDMA_CQPSQ_MAJ_CNTXTCACHE_ERROR: u16 = 0xF001;
pub const IRDMA_CQPSQ_MAJ_ERROR: u16 = 0xFFFF;

/// `irdma_get_encoded_wqe_size` for the CQP: log2(size) - 1 (4 -> 1, 2048 -> 10).
pub const fn irdma_get_encoded_wqe_size_cqp(sq_size: u32) -> u8 {
    (sq_size.trailing_zeros() as u8).saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_cqp_sq_size_is_log2_minus_one() {
        for (size, enc) in [(4, 1), (8, 2), (256, 7), (2048, 10)] {
            assert_eq!(irdma_get_encoded_wqe_size_cqp(size), enc, "{size}");
        }
    }
}
