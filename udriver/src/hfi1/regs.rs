//! hfi1 BAR0 CSRs, the RcvArray entry encoding, the TID flow-table value and the EXP_TID / KDETH fields
//! (hardware-facts §1.1-1.3, §1.5, §1.10). All CSRs are 64-bit and reached with single 64-bit MMIO accesses.

#![forbid(unsafe_code)]

use crate::access::{AccessError, DeviceAccess};

/// hfi1 CSRs, the RcvArray and PIO space all live in BAR0.
pub const HFI1_BAR: u32 = 0;

// ---- Blocks (§1.1) ----
pub const CCE: u64 = 0x000_0000;
pub const RXE: u64 = 0x100_0000;
pub const TXE: u64 = 0x180_0000;
pub const TXE_PIO_SEND: u64 = TXE + 0x80_0000;

// ---- Global receive CSRs ----
pub const RCV_CTRL: u64 = RXE;
pub const RCV_STATUS: u64 = RXE + 0x8;
pub const RCV_CONTEXTS: u64 = RXE + 0x10;
pub const RCV_ARRAY_CNT: u64 = RXE + 0x18;
pub const RCV_BTH_QP: u64 = RXE + 0x28;
pub const RCV_BTH_QP_KDETH_QP_SHIFT: u32 = 16;
pub const RCV_BTH_QP_KDETH_QP_MASK: u64 = 0xFF;
pub const RCV_VL15: u64 = RXE + 0x48;
pub const RCV_QP_MAP_TABLE: u64 = RXE + 0x100;
pub const RCV_ARRAY: u64 = RXE + 0x20_0000;

// ---- Per-context CSRs, kernel spacing (§1.2) ----
pub const KCTXT_CSR_STRIDE: u64 = 0x100;
pub const RCV_CTXT_CTRL: u64 = RXE + 0x10_0000;
pub const RCV_CTXT_STATUS: u64 = RXE + 0x10_0008;
pub const RCV_EGR_CTRL: u64 = RXE + 0x10_0010;
pub const RCV_TID_CTRL: u64 = RXE + 0x10_0018;
pub const RCV_KEY_CTRL: u64 = RXE + 0x10_0020;
pub const RCV_HDR_ADDR: u64 = RXE + 0x10_0028;
pub const RCV_HDR_CNT: u64 = RXE + 0x10_0030;
pub const RCV_HDR_ENT_SIZE: u64 = RXE + 0x10_0038;
pub const RCV_HDR_SIZE: u64 = RXE + 0x10_0040;
pub const RCV_HDR_TAIL_ADDR: u64 = RXE + 0x10_0048;
pub const RCV_AVAIL_TIME_OUT: u64 = RXE + 0x10_0050;
pub const RCV_HDR_OVFL_CNT: u64 = RXE + 0x10_0058;

// ---- Per-context CSRs, user (page) spacing ----
pub const UCTXT_CSR_STRIDE: u64 = 0x1000;
pub const RXE_PER_CONTEXT_SIZE: u64 = 0x1000;
pub const RCV_HDR_TAIL: u64 = RXE + 0x30_0000;
pub const RCV_HDR_HEAD: u64 = RXE + 0x30_0008;
pub const RCV_EGR_INDEX_HEAD: u64 = RXE + 0x30_0018;
pub const RCV_TID_FLOW_TABLE: u64 = RXE + 0x30_0800;

// ---- RCV_CTXT_CTRL fields ----
pub const RCV_CTXT_CTRL_ENABLE_SMASK: u64 = 1 << 0;
pub const RCV_CTXT_CTRL_ONE_PACKET_PER_EGR_BUFFER_SMASK: u64 = 1 << 1;
pub const RCV_CTXT_CTRL_DONT_DROP_EGR_FULL_SMASK: u64 = 1 << 2;
pub const RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK: u64 = 1 << 3;
pub const RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK: u64 = 1 << 4;
pub const RCV_CTXT_CTRL_INTR_AVAIL_SMASK: u64 = 1 << 5;
pub const RCV_CTXT_CTRL_TAIL_UPD_SMASK: u64 = 1 << 6;
pub const RCV_CTXT_CTRL_EGR_BUF_SIZE_SHIFT: u32 = 8;
pub const RCV_CTXT_CTRL_EGR_BUF_SIZE_MASK: u64 = 0x7;
pub const RCV_CTXT_CTRL_EGR_BUF_SIZE_SMASK: u64 = RCV_CTXT_CTRL_EGR_BUF_SIZE_MASK << RCV_CTXT_CTRL_EGR_BUF_SIZE_SHIFT;

// ---- RCV_EGR_CTRL / RCV_TID_CTRL fields ----
pub const RCV_EGR_CTRL_EGR_BASE_INDEX_SHIFT: u32 = 0;
pub const RCV_EGR_CTRL_EGR_BASE_INDEX_MASK: u64 = 0x1FFF;
pub const RCV_EGR_CTRL_EGR_CNT_SHIFT: u32 = 32;
pub const RCV_EGR_CTRL_EGR_CNT_MASK: u64 = 0x1FF;
pub const RCV_TID_CTRL_TID_BASE_INDEX_SHIFT: u32 = 0;
pub const RCV_TID_CTRL_TID_BASE_INDEX_MASK: u64 = 0x1FFF;
pub const RCV_TID_CTRL_TID_PAIR_CNT_SHIFT: u32 = 32;
pub const RCV_TID_CTRL_TID_PAIR_CNT_MASK: u64 = 0x1FF;
/// Base and count of RcvArray ranges are programmed in units of 8 entries.
pub const RCV_SHIFT: u32 = 3;
pub const RCV_INCREMENT: u32 = 1 << RCV_SHIFT;

pub const RCV_AVAIL_TIME_OUT_TIME_OUT_RELOAD_SHIFT: u32 = 0;
pub const RCV_AVAIL_TIME_OUT_TIME_OUT_RELOAD_MASK: u64 = 0xFF;
pub const RCV_HDR_HEAD_COUNTER_SHIFT: u32 = 32;
pub const RCV_HDR_HEAD_COUNTER_MASK: u64 = 0xFF;
pub const RCV_EGR_INDEX_HEAD_HEAD_MASK: u64 = 0x7FF;

// ---- RcvArray entry (§1.3) ----
pub const RCV_ARRAY_RT_ADDR_SHIFT: u32 = 0;
pub const RCV_ARRAY_RT_ADDR_MASK: u64 = 0xF_FFFF_FFFF;
pub const RCV_ARRAY_RT_BUF_SIZE_SHIFT: u32 = 36;
/// INFERRED width (4 bits): the largest code is 0xA and 0xB-0xF are reserved.
pub const RCV_ARRAY_RT_BUF_SIZE_MASK: u64 = 0xF;
pub const RCV_ARRAY_RT_WRITE_ENABLE_SMASK: u64 = 1 << 63;
/// hfi1_put_tid stores DMA addresses in 4 KiB units.
pub const RT_ADDR_SHIFT: u32 = 12;

/// RcvArray entry types taken by `hfi1_put_tid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
#[allow(non_camel_case_types)] // kernel names
pub enum PtType {
    PT_EXPECTED = 0,
    PT_EAGER = 1,
    PT_INVALID_FLUSH = 2,
    PT_INVALID = 3,
}

/// The value `hfi1_put_tid` stores for `pa` with size code `order`. Invalid types store WE alone.
pub fn rcv_array_entry(ty: PtType, pa: u64, order: u32) -> u64 {
    let (pa, order) = match ty {
        PtType::PT_INVALID | PtType::PT_INVALID_FLUSH => (0, 0),
        PtType::PT_EXPECTED | PtType::PT_EAGER => (pa, order),
    };
    RCV_ARRAY_RT_WRITE_ENABLE_SMASK
        | ((u64::from(order) & RCV_ARRAY_RT_BUF_SIZE_MASK) << RCV_ARRAY_RT_BUF_SIZE_SHIFT)
        | (((pa >> RT_ADDR_SHIFT) & RCV_ARRAY_RT_ADDR_MASK) << RCV_ARRAY_RT_ADDR_SHIFT)
}

/// BAR0 offset of RcvArray entry `index`.
pub fn rcv_array_offset(index: u32) -> u64 {
    RCV_ARRAY + 8 * u64::from(index)
}

/// `encoded_size`: buffer size to RcvArray / EGR_BUF_SIZE code; unknown sizes fall back to the 4 KiB code.
pub fn encoded_size(size: u32) -> u32 {
    match size {
        0x1000 => 1,
        0x2000 => 2,
        0x4000 => 3,
        0x8000 => 4,
        0x1_0000 => 5,
        0x2_0000 => 6,
        0x4_0000 => 7,
        0x8_0000 => 8,
        0x10_0000 => 9,
        0x20_0000 => 0xA,
        _ => 1,
    }
}

// ---- TID flow table (§1.5) ----
pub const RXE_NUM_TID_FLOWS: u32 = 32;
pub const RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK: u64 = 1 << 32;
pub const RCV_TID_FLOW_TABLE_CTRL_HDR_SUPP_EN_SMASK: u64 = 1 << 33;
pub const RCV_TID_FLOW_TABLE_CTRL_KEEP_AFTER_SEQ_ERR_SMASK: u64 = 1 << 34;
pub const RCV_TID_FLOW_TABLE_CTRL_KEEP_ON_GEN_ERR_SMASK: u64 = 1 << 35;
pub const RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK: u64 = 1 << 37;
pub const RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK: u64 = 1 << 38;
pub const HFI1_KDETH_BTH_SEQ_SHIFT: u32 = 11;
pub const HFI1_KDETH_BTH_SEQ_MASK: u32 = 0x7FF;
pub const GENERATION_MASK: u32 = 0xFFFFF;
/// `mask_generation(U32_MAX)`.
pub const KERN_GENERATION_RESERVED: u32 = GENERATION_MASK;
pub const MAX_TID_FLOW_PSN: u32 = 1 << HFI1_KDETH_BTH_SEQ_SHIFT;
pub const PSN_MASK: u32 = 0x7FFF_FFFF;

/// The flow-table value `kern_set_hw_flow` writes for `generation` (sequence 0).
pub fn tid_flow_table_value(generation: u32) -> u64 {
    let mut v = (u64::from(generation & GENERATION_MASK) << HFI1_KDETH_BTH_SEQ_SHIFT)
        | RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK
        | RCV_TID_FLOW_TABLE_CTRL_KEEP_AFTER_SEQ_ERR_SMASK
        | RCV_TID_FLOW_TABLE_CTRL_KEEP_ON_GEN_ERR_SMASK
        | RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK
        | RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK;
    if generation != KERN_GENERATION_RESERVED {
        v |= RCV_TID_FLOW_TABLE_CTRL_HDR_SUPP_EN_SMASK;
    }
    v
}

/// `full_flow_psn`: generation and in-flow sequence as one 31-bit PSN.
pub fn full_flow_psn(generation: u32, psn: u32) -> u32 {
    ((generation << HFI1_KDETH_BTH_SEQ_SHIFT) | (psn & HFI1_KDETH_BTH_SEQ_MASK)) & PSN_MASK
}

// ---- EXP_TID entries (§1.10) ----
pub const EXP_TID_LEN_SHIFT: u32 = 0;
pub const EXP_TID_LEN_MASK: u32 = 0x7FF;
pub const EXP_TID_CTRL_SHIFT: u32 = 20;
pub const EXP_TID_CTRL_MASK: u32 = 0x3;
pub const EXP_TID_IDX_SHIFT: u32 = 22;
pub const EXP_TID_IDX_MASK: u32 = 0x3FF;

/// `EXP_TID_SET(IDX, idx) | EXP_TID_SET(CTRL, ctrl) | EXP_TID_SET(LEN, len)`.
pub fn exp_tid_entry(idx: u32, ctrl: u32, len: u32) -> u32 {
    ((idx & EXP_TID_IDX_MASK) << EXP_TID_IDX_SHIFT)
        | ((ctrl & EXP_TID_CTRL_MASK) << EXP_TID_CTRL_SHIFT)
        | ((len & EXP_TID_LEN_MASK) << EXP_TID_LEN_SHIFT)
}

pub fn exp_tid_get_idx(e: u32) -> u32 {
    (e >> EXP_TID_IDX_SHIFT) & EXP_TID_IDX_MASK
}
pub fn exp_tid_get_ctrl(e: u32) -> u32 {
    (e >> EXP_TID_CTRL_SHIFT) & EXP_TID_CTRL_MASK
}
pub fn exp_tid_get_len(e: u32) -> u32 {
    (e >> EXP_TID_LEN_SHIFT) & EXP_TID_LEN_MASK
}

// ---- KDETH header fields (§1.10), for the send side ----
pub const KDETH_OFFSET_SHIFT: u32 = 0;
pub const KDETH_OFFSET_MASK: u32 = 0x7FFF;
pub const KDETH_OM_SHIFT: u32 = 15;
pub const KDETH_OM_MASK: u32 = 0x1;
pub const KDETH_TID_SHIFT: u32 = 16;
pub const KDETH_TID_MASK: u32 = 0x3FF;
pub const KDETH_TIDCTRL_SHIFT: u32 = 26;
pub const KDETH_TIDCTRL_MASK: u32 = 0x3;
pub const KDETH_INTR_SHIFT: u32 = 28;
pub const KDETH_INTR_MASK: u32 = 0x1;
pub const KDETH_SH_SHIFT: u32 = 29;
pub const KDETH_SH_MASK: u32 = 0x1;
pub const KDETH_KVER_SHIFT: u32 = 30;
pub const KDETH_KVER_MASK: u32 = 0x3;
pub const KDETH_JKEY_SHIFT: u32 = 0;
pub const KDETH_JKEY_MASK: u32 = 0xFF;
pub const KDETH_HCRC_UPPER_SHIFT: u32 = 16;
pub const KDETH_HCRC_UPPER_MASK: u32 = 0xFF;
pub const KDETH_HCRC_LOWER_SHIFT: u32 = 24;
pub const KDETH_HCRC_LOWER_MASK: u32 = 0xFF;

/// The CSR accessors of chip.c/chip.h over one `DeviceAccess`: global, kernel-spaced and user-spaced.
pub struct Hfi1Csr<'a>(pub &'a dyn DeviceAccess);

impl Hfi1Csr<'_> {
    pub fn read_csr(&self, offset: u64) -> Result<u64, AccessError> {
        self.0.read64(HFI1_BAR, offset)
    }
    pub fn write_csr(&self, offset: u64, value: u64) -> Result<(), AccessError> {
        self.0.write64(HFI1_BAR, offset, value)
    }
    pub fn read_kctxt_csr(&self, ctxt: u32, offset: u64) -> Result<u64, AccessError> {
        self.read_csr(offset + KCTXT_CSR_STRIDE * u64::from(ctxt))
    }
    pub fn write_kctxt_csr(&self, ctxt: u32, offset: u64, value: u64) -> Result<(), AccessError> {
        self.write_csr(offset + KCTXT_CSR_STRIDE * u64::from(ctxt), value)
    }
    pub fn read_uctxt_csr(&self, ctxt: u32, offset: u64) -> Result<u64, AccessError> {
        self.read_csr(offset + UCTXT_CSR_STRIDE * u64::from(ctxt))
    }
    pub fn write_uctxt_csr(&self, ctxt: u32, offset: u64, value: u64) -> Result<(), AccessError> {
        self.write_csr(offset + UCTXT_CSR_STRIDE * u64::from(ctxt), value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rcv_array_entries_match_golden_g1_g2() {
        // (type, pa, order, expected value, index, expected BAR0 offset) from hardware-facts G1/G2.
        let cases = [
            (PtType::PT_EXPECTED, 0x1234_5000, 2, 0x8000_0020_0001_2345, 0x100, 0x120_0800),
            (PtType::PT_INVALID, 0x1234_5000, 2, 0x8000_0000_0000_0000, 0x100, 0x120_0800),
            (PtType::PT_INVALID_FLUSH, 0x1234_5000, 2, 0x8000_0000_0000_0000, 0x100, 0x120_0800),
            (PtType::PT_EXPECTED, 0x1_2340_0000, 0xA, 0x8000_00A0_0012_3400, 0, 0x120_0000),
        ];
        for (ty, pa, order, value, index, offset) in cases {
            assert_eq!(rcv_array_entry(ty, pa, order), value, "{ty:?}");
            assert_eq!(rcv_array_offset(index), offset);
        }
    }

    #[test]
    fn flow_table_values_match_golden_g3_and_g4() {
        assert_eq!(tid_flow_table_value(0x12345), 0x0000_006F_091A_2800);
        assert_eq!(tid_flow_table_value(KERN_GENERATION_RESERVED), 0x0000_006D_7FFF_F800);
        assert_eq!(full_flow_psn(0x12345, 3), 0x091A_2803);
    }

    #[test]
    fn exp_tid_entries_match_golden_g5() {
        assert_eq!(exp_tid_entry(2, 3, 32), 0x00B0_0020);
        assert_eq!(exp_tid_entry(2, 2, 4), 0x00A0_0004);
        assert_eq!(exp_tid_entry(3, 1, 1), 0x00D0_0001);
        let e = 0x00B0_0020;
        assert_eq!((exp_tid_get_idx(e), exp_tid_get_ctrl(e), exp_tid_get_len(e)), (2, 3, 32));
    }

    #[test]
    fn encoded_size_maps_every_power_of_two_and_falls_back_to_4k() {
        let sizes = [(4096, 1), (8192, 2), (256 << 10, 7), (1 << 20, 9), (2 << 20, 0xA), (12288, 1), (0, 1)];
        for (size, code) in sizes {
            assert_eq!(encoded_size(size), code, "size {size:#x}");
        }
    }
}
