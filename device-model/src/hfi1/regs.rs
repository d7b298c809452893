//! hfi1 BAR0 map: every CSR offset and field the emulator implements, named as in chip_registers.h
//! (reference §1.1, §1.2, §1.5), plus the project-specific loopback block (see `loopback`).
//!
//! Registers are data plus masks: each [`RegDef`] carries a read/write mask, a write-1-to-clear mask and a
//! reset value, and [`apply_write`] is the one write rule for all of them.

#![forbid(unsafe_code)]

/// Receive contexts the chip has (RXE_NUM_CONTEXTS).
pub const RXE_NUM_CONTEXTS: usize = 160;
/// TID flows per receive context (RXE_NUM_TID_FLOWS).
pub const RXE_NUM_TID_FLOWS: usize = 32;

/// Base of the CCE block.
pub const CCE: u64 = 0x000_0000;
/// Base of the receive engine.
pub const RXE: u64 = 0x100_0000;
/// Base of the transmit engine.
pub const TXE: u64 = 0x180_0000;

pub const RCV_CTRL: u64 = RXE;
pub const RCV_STATUS: u64 = RXE + 0x8;
pub const RCV_CONTEXTS: u64 = RXE + 0x10;
pub const RCV_ARRAY_CNT: u64 = RXE + 0x18;
pub const RCV_BTH_QP: u64 = RXE + 0x28;
pub const RCV_BTH_QP_KDETH_QP_SHIFT: u32 = 16;
pub const RCV_BTH_QP_KDETH_QP_MASK: u64 = 0xFF;
pub const RCV_BTH_QP_KDETH_QP_SMASK: u64 = RCV_BTH_QP_KDETH_QP_MASK << RCV_BTH_QP_KDETH_QP_SHIFT;
pub const RCV_MULTICAST: u64 = RXE + 0x30;
pub const RCV_BYPASS: u64 = RXE + 0x38;
pub const RCV_VL15: u64 = RXE + 0x48;
pub const RCV_ERR_INFO: u64 = RXE + 0x50;
pub const RCV_ERR_STATUS: u64 = RXE + 0x60;
pub const RCV_ERR_MASK: u64 = RXE + 0x68;
pub const RCV_ERR_CLEAR: u64 = RXE + 0x70;
pub const RCV_QP_MAP_TABLE: u64 = RXE + 0x100;
/// RCV_QP_MAP_TABLE: 32 registers of eight one-byte context numbers, indexed by QPN[8:1] (init_qpmap_table).
pub const RCV_QP_MAP_TABLE_REGS: usize = 32;
// RCV_CTRL fields.
pub const RCV_CTRL_RCV_PORT_ENABLE_SMASK: u64 = 0x1;
pub const RCV_CTRL_RCV_QP_MAP_ENABLE_SMASK: u64 = 0x2;
pub const RCV_CTRL_RCV_RSM_ENABLE_SMASK: u64 = 0x20;
pub const RCV_PARTITION_KEY: u64 = RXE + 0x200;
pub const RCV_COUNTER_ARRAY32: u64 = RXE + 0x400;
pub const RCV_COUNTER_ARRAY64: u64 = RXE + 0x500;
pub const RCV_RSM_CFG: u64 = RXE + 0x600;
pub const RCV_RSM_SELECT: u64 = RXE + 0x700;
pub const RCV_RSM_MATCH: u64 = RXE + 0x800;
pub const RCV_RSM_MAP_TABLE: u64 = RXE + 0x900;

/// The RcvArray: one 64-bit entry per index.
pub const RCV_ARRAY: u64 = RXE + 0x20_0000;
/// Bytes per RcvArray entry.
pub const RCV_ARRAY_ENTRY_SIZE: u64 = 8;

/// First kernel-spaced per-context CSR (context 0).
pub const RXE_KCTXT_BASE: u64 = RXE + 0x10_0000;
/// Kernel per-context CSRs are spaced by 0x100 (chip.h read_kctxt_csr).
pub const KCTXT_STRIDE: u64 = 0x100;
pub const RCV_CTXT_CTRL: u64 = RXE_KCTXT_BASE;
pub const RCV_CTXT_STATUS: u64 = RXE_KCTXT_BASE + 0x8;
pub const RCV_EGR_CTRL: u64 = RXE_KCTXT_BASE + 0x10;
pub const RCV_TID_CTRL: u64 = RXE_KCTXT_BASE + 0x18;
pub const RCV_KEY_CTRL: u64 = RXE_KCTXT_BASE + 0x20;
pub const RCV_HDR_ADDR: u64 = RXE_KCTXT_BASE + 0x28;
pub const RCV_HDR_CNT: u64 = RXE_KCTXT_BASE + 0x30;
pub const RCV_HDR_ENT_SIZE: u64 = RXE_KCTXT_BASE + 0x38;
pub const RCV_HDR_SIZE: u64 = RXE_KCTXT_BASE + 0x40;
pub const RCV_HDR_TAIL_ADDR: u64 = RXE_KCTXT_BASE + 0x48;
pub const RCV_AVAIL_TIME_OUT: u64 = RXE_KCTXT_BASE + 0x50;
pub const RCV_HDR_OVFL_CNT: u64 = RXE_KCTXT_BASE + 0x58;

/// First user-spaced per-context CSR (context 0).
pub const RXE_UCTXT_BASE: u64 = RXE + 0x30_0000;
/// User per-context CSRs are page-spaced (RXE_PER_CONTEXT_SIZE).
pub const UCTXT_STRIDE: u64 = 0x1000;
pub const RCV_HDR_TAIL: u64 = RXE_UCTXT_BASE;
pub const RCV_HDR_HEAD: u64 = RXE_UCTXT_BASE + 0x8;
pub const RCV_EGR_INDEX_HEAD: u64 = RXE_UCTXT_BASE + 0x18;
/// RcvEgrIndexTail and RcvEgrOffsetTail: read-only (chip.c reset_rxe_csrs names both); chip_registers.h gives
/// no offset, the user ABI does: qwords ur_rcvegrindextail 2 and ur_rcvegroffsettail 4 of the user register
/// page (hfi1_user.h enum hfi1_ureg).
pub const RCV_EGR_INDEX_TAIL: u64 = RXE_UCTXT_BASE + 0x10;
pub const RCV_EGR_OFFSET_TAIL: u64 = RXE_UCTXT_BASE + 0x20;
pub const RCV_TID_FLOW_TABLE: u64 = RXE_UCTXT_BASE + 0x800;

// RCV_CTXT_CTRL fields.
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

// RCV_EGR_CTRL fields.
pub const RCV_EGR_CTRL_EGR_BASE_INDEX_SHIFT: u32 = 0;
pub const RCV_EGR_CTRL_EGR_BASE_INDEX_MASK: u64 = 0x1FFF;
pub const RCV_EGR_CTRL_EGR_CNT_SHIFT: u32 = 32;
pub const RCV_EGR_CTRL_EGR_CNT_MASK: u64 = 0x1FF;

// RCV_TID_CTRL fields.
pub const RCV_TID_CTRL_TID_BASE_INDEX_SHIFT: u32 = 0;
pub const RCV_TID_CTRL_TID_BASE_INDEX_MASK: u64 = 0x1FFF;
pub const RCV_TID_CTRL_TID_PAIR_CNT_SHIFT: u32 = 32;
pub const RCV_TID_CTRL_TID_PAIR_CNT_MASK: u64 = 0x1FF;

/// RCV_SHIFT: base and count fields of RCV_EGR_CTRL / RCV_TID_CTRL hold entry numbers >> 3.
pub const RCV_SHIFT: u32 = 3;

// Other fields.
/// RCV_HDR_SIZE: dwords of a KDETH packet behind its BTH that go to the header queue (DEFAULT_RCVHDRSIZE 9).
pub const RCV_HDR_SIZE_HDR_SIZE_MASK: u64 = 0x1F;
pub const RCV_HDR_HEAD_COUNTER_SHIFT: u32 = 32;
pub const RCV_HDR_HEAD_COUNTER_MASK: u64 = 0xFF;
pub const RCV_EGR_INDEX_HEAD_HEAD_MASK: u64 = 0x7FF;
/// INFERRED widths (no kernel mask): the eager index as RCV_EGR_INDEX_HEAD and the RHF's EgrIndex hold it, the
/// offset in 64-byte blocks as the RHF's EgrOffset (common.h RHF_EGR_INDEX_MASK, RHF_EGR_OFFSET_MASK).
pub const RCV_EGR_INDEX_TAIL_TAIL_MASK: u64 = 0x7FF;
pub const RCV_EGR_OFFSET_TAIL_TAIL_MASK: u64 = 0xFFF;
pub const RCV_AVAIL_TIME_OUT_TIME_OUT_RELOAD_MASK: u64 = 0xFF;

// RcvArray entry fields (hfi1_put_tid; reference §1.3).
pub const RCV_ARRAY_RT_ADDR_SHIFT: u32 = 0;
pub const RCV_ARRAY_RT_ADDR_MASK: u64 = 0xF_FFFF_FFFF;
pub const RCV_ARRAY_RT_BUF_SIZE_SHIFT: u32 = 36;
/// INFERRED 4-bit width: the largest code is 0xA, codes up to 0xF are reserved.
pub const RCV_ARRAY_RT_BUF_SIZE_MASK: u64 = 0xF;
pub const RCV_ARRAY_RT_WRITE_ENABLE_SMASK: u64 = 1 << 63;
/// The RcvArray ADDR field counts 4 KiB units.
pub const RT_ADDR_SHIFT: u32 = 12;

// RCV_TID_FLOW_TABLE entry fields (tid_rdma.c; reference §1.5).
/// INFERRED: the expected 11-bit in-flow sequence.
pub const RCV_TID_FLOW_TABLE_SEQ_SHIFT: u32 = 0;
pub const RCV_TID_FLOW_TABLE_SEQ_MASK: u64 = 0x7FF;
pub const RCV_TID_FLOW_TABLE_GEN_SHIFT: u32 = 11;
pub const RCV_TID_FLOW_TABLE_GEN_MASK: u64 = 0xFFFFF;
pub const RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK: u64 = 1 << 32;
pub const RCV_TID_FLOW_TABLE_CTRL_HDR_SUPP_EN_SMASK: u64 = 1 << 33;
pub const RCV_TID_FLOW_TABLE_CTRL_KEEP_AFTER_SEQ_ERR_SMASK: u64 = 1 << 34;
pub const RCV_TID_FLOW_TABLE_CTRL_KEEP_ON_GEN_ERR_SMASK: u64 = 1 << 35;
pub const RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK: u64 = 1 << 37;
pub const RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK: u64 = 1 << 38;

/// One flow-table entry: control fields read/write, the two mismatch status bits W1C, bits 31, 36 and 63:39
/// reserved (read 0).
pub const TID_FLOW_REG: RegDef = RegDef {
    offset: RCV_TID_FLOW_TABLE,
    name: "RCV_TID_FLOW_TABLE",
    rw_mask: (RCV_TID_FLOW_TABLE_SEQ_MASK << RCV_TID_FLOW_TABLE_SEQ_SHIFT)
        | (RCV_TID_FLOW_TABLE_GEN_MASK << RCV_TID_FLOW_TABLE_GEN_SHIFT)
        | RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK
        | RCV_TID_FLOW_TABLE_CTRL_HDR_SUPP_EN_SMASK
        | RCV_TID_FLOW_TABLE_CTRL_KEEP_AFTER_SEQ_ERR_SMASK
        | RCV_TID_FLOW_TABLE_CTRL_KEEP_ON_GEN_ERR_SMASK,
    w1c_mask: RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK | RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK,
};

/// One register: where it is, and how a driver write lands in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegDef {
    /// Offset in BAR0 (context 0 for per-context registers).
    pub offset: u64,
    pub name: &'static str,
    /// Bits a driver write sets or clears.
    pub rw_mask: u64,
    /// Bits a driver write of 1 clears (write-1-to-clear status).
    pub w1c_mask: u64,
}

impl RegDef {
    const fn rw(offset: u64, name: &'static str, rw_mask: u64) -> Self {
        Self { offset, name, rw_mask, w1c_mask: 0 }
    }
    const fn ro(offset: u64, name: &'static str) -> Self {
        Self { offset, name, rw_mask: 0, w1c_mask: 0 }
    }
    /// A write to this register changes nothing.
    pub const fn is_read_only(&self) -> bool {
        self.rw_mask == 0 && self.w1c_mask == 0
    }
}

/// The one write rule: read/write bits take the written value, W1C bits written as 1 clear, the rest stay.
pub const fn apply_write(def: &RegDef, old: u64, value: u64) -> u64 {
    let kept = old & !def.rw_mask & !(value & def.w1c_mask);
    kept | (value & def.rw_mask)
}

const ALL: u64 = u64::MAX;

/// Global RXE registers. RCV_CONTEXTS and RCV_ARRAY_CNT read the configuration; RCV_STATUS has no modelled
/// status and reads 0. Registers whose fields the reference does not give are 64-bit storage.
pub const GLOBAL_REGS: [RegDef; 6] = [
    RegDef::rw(RCV_CTRL, "RCV_CTRL", ALL),
    RegDef::ro(RCV_STATUS, "RCV_STATUS"),
    RegDef::ro(RCV_CONTEXTS, "RCV_CONTEXTS"),
    RegDef::ro(RCV_ARRAY_CNT, "RCV_ARRAY_CNT"),
    RegDef::rw(RCV_BTH_QP, "RCV_BTH_QP", RCV_BTH_QP_KDETH_QP_SMASK),
    RegDef::rw(RCV_VL15, "RCV_VL15", ALL),
];

/// Kernel-spaced per-context registers, in offset order (index = (offset - RXE_KCTXT_BASE) / 8).
pub const KCTXT_REGS: [RegDef; 12] = [
    RegDef::rw(
        RCV_CTXT_CTRL,
        "RCV_CTXT_CTRL",
        RCV_CTXT_CTRL_ENABLE_SMASK
            | RCV_CTXT_CTRL_ONE_PACKET_PER_EGR_BUFFER_SMASK
            | RCV_CTXT_CTRL_DONT_DROP_EGR_FULL_SMASK
            | RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK
            | RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK
            | RCV_CTXT_CTRL_INTR_AVAIL_SMASK
            | RCV_CTXT_CTRL_TAIL_UPD_SMASK
            | RCV_CTXT_CTRL_EGR_BUF_SIZE_SMASK,
    ),
    RegDef::ro(RCV_CTXT_STATUS, "RCV_CTXT_STATUS"),
    RegDef::rw(
        RCV_EGR_CTRL,
        "RCV_EGR_CTRL",
        (RCV_EGR_CTRL_EGR_BASE_INDEX_MASK << RCV_EGR_CTRL_EGR_BASE_INDEX_SHIFT)
            | (RCV_EGR_CTRL_EGR_CNT_MASK << RCV_EGR_CTRL_EGR_CNT_SHIFT),
    ),
    RegDef::rw(
        RCV_TID_CTRL,
        "RCV_TID_CTRL",
        (RCV_TID_CTRL_TID_BASE_INDEX_MASK << RCV_TID_CTRL_TID_BASE_INDEX_SHIFT)
            | (RCV_TID_CTRL_TID_PAIR_CNT_MASK << RCV_TID_CTRL_TID_PAIR_CNT_SHIFT),
    ),
    RegDef::rw(RCV_KEY_CTRL, "RCV_KEY_CTRL", ALL),
    RegDef::rw(RCV_HDR_ADDR, "RCV_HDR_ADDR", ALL),
    RegDef::rw(RCV_HDR_CNT, "RCV_HDR_CNT", ALL),
    RegDef::rw(RCV_HDR_ENT_SIZE, "RCV_HDR_ENT_SIZE", ALL),
    RegDef::rw(RCV_HDR_SIZE, "RCV_HDR_SIZE", ALL),
    RegDef::rw(RCV_HDR_TAIL_ADDR, "RCV_HDR_TAIL_ADDR", ALL),
    RegDef::rw(RCV_AVAIL_TIME_OUT, "RCV_AVAIL_TIME_OUT", ALL),
    RegDef::ro(RCV_HDR_OVFL_CNT, "RCV_HDR_OVFL_CNT"),
];

/// User-spaced per-context registers other than the flow table. The tails are written by hardware only (reads
/// give the context's live place, rxe::state).
pub const UCTXT_REGS: [RegDef; 5] = [
    RegDef::ro(RCV_HDR_TAIL, "RCV_HDR_TAIL"),
    RegDef::rw(RCV_HDR_HEAD, "RCV_HDR_HEAD", ALL),
    RegDef::ro(RCV_EGR_INDEX_TAIL, "RCV_EGR_INDEX_TAIL"),
    RegDef::rw(RCV_EGR_INDEX_HEAD, "RCV_EGR_INDEX_HEAD", RCV_EGR_INDEX_HEAD_HEAD_MASK),
    RegDef::ro(RCV_EGR_OFFSET_TAIL, "RCV_EGR_OFFSET_TAIL"),
];

/// Offset of a kernel-spaced per-context CSR (read_kctxt_csr / write_kctxt_csr).
pub const fn kctxt_csr(offset: u64, ctxt: u64) -> u64 {
    offset + KCTXT_STRIDE * ctxt
}

/// Offset of a user-spaced per-context CSR (read_uctxt_csr / write_uctxt_csr).
pub const fn uctxt_csr(offset: u64, ctxt: u64) -> u64 {
    offset + UCTXT_STRIDE * ctxt
}

/// Offset of flow `flow` of context `ctxt` in the TID flow table.
pub const fn tid_flow_csr(ctxt: u64, flow: u64) -> u64 {
    uctxt_csr(RCV_TID_FLOW_TABLE, ctxt) + 8 * flow
}

/// What a BAR0 offset addresses, for a device with `contexts` receive contexts and `rcv_array_count` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Csr {
    /// Index into [`GLOBAL_REGS`].
    Global(usize),
    /// Context and index into [`KCTXT_REGS`].
    Kctxt {
        ctxt: usize,
        reg: usize,
    },
    /// Context and index into [`UCTXT_REGS`].
    Uctxt {
        ctxt: usize,
        reg: usize,
    },
    /// Context and flow index of a TID flow table entry.
    Flow {
        ctxt: usize,
        flow: usize,
    },
    /// Index of an RCV_QP_MAP_TABLE register.
    QpMap(usize),
    /// RcvArray entry index (may be beyond the configured count: the caller judges it).
    RcvArray(u64),
    /// An offset in the project-specific loopback block (relative to its base).
    Loopback(u64),
    Unimplemented,
}

/// Decodes the 8-byte-aligned offset `offset` (callers align first); `loopback` is the loopback block's
/// (base, size) on the personality that has one.
pub fn decode(offset: u64, contexts: usize, loopback: Option<(u64, u64)>) -> Csr {
    let ctxts = contexts as u64;
    if let Some(i) = GLOBAL_REGS.iter().position(|r| r.offset == offset) {
        return Csr::Global(i);
    }
    if (RCV_QP_MAP_TABLE..RCV_QP_MAP_TABLE + 8 * RCV_QP_MAP_TABLE_REGS as u64).contains(&offset) {
        return Csr::QpMap(((offset - RCV_QP_MAP_TABLE) / 8) as usize);
    }
    if (RXE_KCTXT_BASE..RXE_KCTXT_BASE + KCTXT_STRIDE * ctxts).contains(&offset) {
        let rel = offset - RXE_KCTXT_BASE;
        let reg = ((rel % KCTXT_STRIDE) / 8) as usize;
        if reg < KCTXT_REGS.len() {
            return Csr::Kctxt { ctxt: (rel / KCTXT_STRIDE) as usize, reg };
        }
        return Csr::Unimplemented;
    }
    if (RCV_ARRAY..RXE_UCTXT_BASE).contains(&offset) {
        return Csr::RcvArray((offset - RCV_ARRAY) / RCV_ARRAY_ENTRY_SIZE);
    }
    if (RXE_UCTXT_BASE..RXE_UCTXT_BASE + UCTXT_STRIDE * ctxts).contains(&offset) {
        let rel = offset - RXE_UCTXT_BASE;
        let (ctxt, in_page) = ((rel / UCTXT_STRIDE) as usize, rel % UCTXT_STRIDE);
        let flow_base = RCV_TID_FLOW_TABLE - RXE_UCTXT_BASE;
        if (flow_base..flow_base + 8 * RXE_NUM_TID_FLOWS as u64).contains(&in_page) {
            return Csr::Flow { ctxt, flow: ((in_page - flow_base) / 8) as usize };
        }
        if let Some(reg) = UCTXT_REGS.iter().position(|r| r.offset - RXE_UCTXT_BASE == in_page) {
            return Csr::Uctxt { ctxt, reg };
        }
        return Csr::Unimplemented;
    }
    if let Some((base, size)) = loopback {
        if (base..base + size).contains(&offset) {
            return Csr::Loopback(offset - base);
        }
    }
    Csr::Unimplemented
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_g7_per_context_csr_addresses() {
        assert_eq!(kctxt_csr(RCV_CTXT_CTRL, 3), 0x1100300);
        assert_eq!(kctxt_csr(RCV_EGR_CTRL, 5), 0x1100510);
        assert_eq!(uctxt_csr(RCV_HDR_HEAD, 5), 0x1305008);
    }

    #[test]
    fn golden_g3_flow_table_address() {
        assert_eq!(tid_flow_csr(2, 3), 0x1302818);
    }

    #[test]
    fn block_offsets_match_chip_registers() {
        let table = [
            (RXE, 0x1000000),
            (TXE, 0x1800000),
            (RCV_ARRAY, 0x1200000),
            (RCV_ARRAY_CNT, 0x1000018),
            (RCV_CONTEXTS, 0x1000010),
            (RCV_BTH_QP, 0x1000028),
            (RCV_TID_CTRL, 0x1100018),
            (RCV_HDR_OVFL_CNT, 0x1100058),
            (RCV_EGR_INDEX_HEAD, 0x1300018),
            // hfi1_user.h: ur_rcvegrindextail = 2, ur_rcvegroffsettail = 4 qwords into the page.
            (RCV_EGR_INDEX_TAIL, 0x1300010),
            (RCV_EGR_OFFSET_TAIL, 0x1300020),
            (RCV_TID_FLOW_TABLE, 0x1300800),
        ];
        for (got, want) in table {
            assert_eq!(got, want);
        }
    }

    #[test]
    fn kctxt_table_is_in_offset_order() {
        for (i, r) in KCTXT_REGS.iter().enumerate() {
            assert_eq!(r.offset, RXE_KCTXT_BASE + 8 * i as u64, "{}", r.name);
        }
    }

    #[test]
    fn decode_finds_each_block() {
        let lb = TXE + 0x7F_0000;
        let table = [
            (RCV_ARRAY_CNT, Csr::Global(3)),
            (0x1100300, Csr::Kctxt { ctxt: 3, reg: 0 }),
            (0x1100518, Csr::Kctxt { ctxt: 5, reg: 3 }),
            (0x1100560, Csr::Unimplemented),
            (0x1100800, Csr::Unimplemented),
            (0x1200800, Csr::RcvArray(0x100)),
            (0x1305008, Csr::Uctxt { ctxt: 5, reg: 1 }),
            (0x1305010, Csr::Uctxt { ctxt: 5, reg: 2 }),
            (0x1305018, Csr::Uctxt { ctxt: 5, reg: 3 }),
            (0x1305020, Csr::Uctxt { ctxt: 5, reg: 4 }),
            (0x1305028, Csr::Unimplemented),
            (0x1302818, Csr::Flow { ctxt: 2, flow: 3 }),
            (0x1000100, Csr::QpMap(0)),
            (0x10001F8, Csr::QpMap(31)),
            (0x1000200, Csr::Unimplemented),
            (0x1302900, Csr::Unimplemented),
            (0x1308000, Csr::Unimplemented),
            (lb + 0x10, Csr::Loopback(0x10)),
            (CCE, Csr::Unimplemented),
        ];
        for (offset, want) in table {
            assert_eq!(decode(offset, 8, Some((lb, 0x1000))), want, "{offset:#x}");
        }
    }

    #[test]
    fn write_rule_keeps_read_only_bits_and_clears_w1c_bits() {
        let def = RegDef { offset: 0, name: "T", rw_mask: 0x0F, w1c_mask: 0x30 };
        assert_eq!(apply_write(&def, 0xF0, 0x05), 0xF5);
        assert_eq!(apply_write(&def, 0xF0, 0x10), 0xE0);
        assert_eq!(apply_write(&def, 0xF0, 0xFF), 0xCF);
        assert!(GLOBAL_REGS[3].is_read_only());
    }
}
