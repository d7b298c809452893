//! The hfi1 user ABI as the guest kernel defines it (Debian `linux-source-6.12`), restated from
//! `include/uapi/rdma/{rdma_user_ioctl.h, rdma_user_ioctl_cmds.h, hfi/hfi1_ioctl.h, hfi/hfi1_user.h}` and
//! `drivers/infiniband/hw/hfi1/{common.h, exp_rcv.h, file_ops.c, chip.h, chip_registers.h, tid_rdma.c}`.
//! Pure data and encodings; the syscalls are in `sys`.

use serde::{Deserialize, Serialize};

// ---- ioctl numbers (asm-generic/ioctl.h: nr 7:0, type 15:8, size 29:16, dir 31:30) ----

const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (RDMA_IOCTL_MAGIC << 8) | nr
}

/// rdma_user_ioctl_cmds.h.
pub const RDMA_IOCTL_MAGIC: u32 = 0x1b;
/// `_IOWR(RDMA_IOCTL_MAGIC, 0xE1, struct hfi1_user_info)`.
pub const HFI1_IOCTL_ASSIGN_CTXT: u32 = ioc(IOC_READ | IOC_WRITE, 0xE1, size_of::<Hfi1UserInfo>());
/// `_IOW(…, 0xE2, struct hfi1_ctxt_info)`: "W" although the kernel copies out (file_ops.c get_ctxt_info).
pub const HFI1_IOCTL_CTXT_INFO: u32 = ioc(IOC_WRITE, 0xE2, size_of::<Hfi1CtxtInfo>());
/// `_IOW(…, 0xE3, struct hfi1_base_info)`, copied out likewise.
pub const HFI1_IOCTL_USER_INFO: u32 = ioc(IOC_WRITE, 0xE3, size_of::<Hfi1BaseInfo>());
/// `_IOWR(…, 0xE4, struct hfi1_tid_info)`.
pub const HFI1_IOCTL_TID_UPDATE: u32 = ioc(IOC_READ | IOC_WRITE, 0xE4, size_of::<Hfi1TidInfo>());
/// `_IOWR(…, 0xE5, struct hfi1_tid_info)`.
pub const HFI1_IOCTL_TID_FREE: u32 = ioc(IOC_READ | IOC_WRITE, 0xE5, size_of::<Hfi1TidInfo>());
/// `_IOWR(…, 0xED, struct hfi1_tid_info)`.
pub const HFI1_IOCTL_TID_INVAL_READ: u32 = ioc(IOC_READ | IOC_WRITE, 0xED, size_of::<Hfi1TidInfo>());
/// `_IOR(…, 0xEE, int)`.
pub const HFI1_IOCTL_GET_VERS: u32 = ioc(IOC_READ, 0xEE, size_of::<i32>());

/// hfi1_user.h HFI1_USER_SWMAJOR / SWMINOR; common.h HFI1_USER_SWVERSION = major << 16 | minor.
pub const HFI1_USER_SWMAJOR: u32 = 6;
pub const HFI1_USER_SWMINOR: u32 = 3;
pub const HFI1_SWMAJOR_SHIFT: u32 = 16;
pub const HFI1_USER_SWVERSION: u32 = (HFI1_USER_SWMAJOR << HFI1_SWMAJOR_SHIFT) | HFI1_USER_SWMINOR;

// ---- ioctl structures (hfi1_ioctl.h) ----

/// `struct hfi1_user_info` (ASSIGN_CTXT in).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hfi1UserInfo {
    pub userversion: u32,
    pub pad: u32,
    pub subctxt_cnt: u16,
    pub subctxt_id: u16,
    pub uuid: [u8; 16],
}

/// `struct hfi1_ctxt_info` (CTXT_INFO out).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hfi1CtxtInfo {
    pub runtime_flags: u64,
    pub rcvegr_size: u32,
    pub num_active: u16,
    pub unit: u16,
    pub ctxt: u16,
    pub subctxt: u16,
    pub rcvtids: u16,
    pub credits: u16,
    pub numa_node: u16,
    pub rec_cpu: u16,
    pub send_ctxt: u16,
    pub egrtids: u16,
    pub rcvhdrq_cnt: u16,
    pub rcvhdrq_entsize: u16,
    pub sdma_ring_size: u16,
}

/// `struct hfi1_tid_info` (TID_UPDATE / TID_FREE / TID_INVAL_READ in and out).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hfi1TidInfo {
    pub vaddr: u64,
    /// User pointer to a u32 array; TID_UPDATE needs room for one entry per page in the worst case.
    pub tidlist: u64,
    pub tidcnt: u32,
    pub length: u32,
}

/// `struct hfi1_base_info` (USER_INFO out). The `*_bufbase`/`*_addr` fields are mmap tokens.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hfi1BaseInfo {
    pub hw_version: u32,
    pub sw_version: u32,
    pub jkey: u16,
    pub padding1: u16,
    pub bthqp: u32,
    pub sc_credits_addr: u64,
    pub pio_bufbase_sop: u64,
    pub pio_bufbase: u64,
    pub rcvhdr_bufbase: u64,
    pub rcvegr_bufbase: u64,
    pub sdma_comp_bufbase: u64,
    pub user_regbase: u64,
    pub events_bufbase: u64,
    pub status_bufbase: u64,
    pub rcvhdrtail_base: u64,
    pub subctxt_uregbase: u64,
    pub subctxt_rcvegrbuf: u64,
    pub subctxt_rcvhdrbuf: u64,
}

/// HFI1_CAP_HDRSUPP (hfi1_user.h): in the user half of the context flags it makes `user_init` (file_ops.c)
/// enable TID flows (HFI1_RCVCTRL_TIDFLOW_ENB); CTXT_INFO's runtime_flags carry the user half in bits 23:0.
pub const HFI1_CAP_HDRSUPP: u64 = 1 << 4;
/// HFI1_CAP_TID_UNMAP: set in runtime_flags when the fd does not cache TIDs (no MMU notifier).
pub const HFI1_CAP_TID_UNMAP: u64 = 1 << 10;

/// RcvArray entries come in groups of RCV_INCREMENT = 1 << RCV_SHIFT (chip.h); eager entries are rounded up
/// to a group before the expected ones start (init.c hfi1_setup_eagerbufs).
pub const RCV_INCREMENT: u32 = 8;
/// chip.h MAX_TID_PAIR_ENTRIES: a context has at most 2 × 1024 expected entries.
pub const MAX_TID_PAIR_ENTRIES: u32 = 1024;

/// The context's expected-receive entry count (`uctxt->expected_count`), from CTXT_INFO: `get_ctxt_info`
/// reports rcvtids = roundup(egrtids, group size) + expected_count.
pub fn expected_count(info: &Hfi1CtxtInfo) -> Option<u32> {
    let egr = u32::from(info.egrtids).div_ceil(RCV_INCREMENT) * RCV_INCREMENT;
    u32::from(info.rcvtids).checked_sub(egr)
}

// ---- mmap tokens (file_ops.c) ----

/// `enum mmap_types` (file_ops.c).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MmapType {
    PioBufs = 1,
    PioBufsSop = 2,
    PioCred = 3,
    RcvHdrq = 4,
    RcvEgrbuf = 5,
    /// The context's user register page (RXE_PER_CONTEXT_USER + ctxt × 4 KiB), TID flow table included.
    Uregs = 6,
    Events = 7,
    Status = 8,
    Rtail = 9,
    SubctxtUregs = 10,
    SubctxtRcvHdrq = 11,
    SubctxtEgrbuf = 12,
    SdmaComp = 13,
}

impl MmapType {
    pub fn from_code(code: u8) -> Option<Self> {
        use MmapType::*;
        [
            PioBufs,
            PioBufsSop,
            PioCred,
            RcvHdrq,
            RcvEgrbuf,
            Uregs,
            Events,
            Status,
            Rtail,
            SubctxtUregs,
            SubctxtRcvHdrq,
            SubctxtEgrbuf,
            SdmaComp,
        ]
        .into_iter()
        .find(|t| *t as u8 == code)
    }
}

pub const HFI1_MMAP_OFFSET_MASK: u64 = 0xfff;
pub const HFI1_MMAP_OFFSET_SHIFT: u32 = 0;
pub const HFI1_MMAP_SUBCTXT_MASK: u64 = 0xf;
pub const HFI1_MMAP_SUBCTXT_SHIFT: u32 = 12;
pub const HFI1_MMAP_CTXT_MASK: u64 = 0xff;
pub const HFI1_MMAP_CTXT_SHIFT: u32 = 16;
pub const HFI1_MMAP_TYPE_MASK: u64 = 0xf;
pub const HFI1_MMAP_TYPE_SHIFT: u32 = 24;
pub const HFI1_MMAP_MAGIC_MASK: u64 = 0xffff_ffff;
pub const HFI1_MMAP_MAGIC_SHIFT: u32 = 32;
pub const HFI1_MMAP_MAGIC: u64 = 0xdabb_ad00;

/// A decoded mmap token (the mmap offset to pass for that memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmapToken {
    pub kind: Option<MmapType>,
    pub ctxt: u16,
    pub subctxt: u16,
    /// offset_in_page of the object: where it sits inside the mapped page.
    pub offset: u16,
}

impl MmapToken {
    /// HFI1_MMAP_TOKEN(type, ctxt, subctxt, addr).
    pub fn encode(kind: MmapType, ctxt: u16, subctxt: u16, offset: u16) -> u64 {
        (HFI1_MMAP_MAGIC & HFI1_MMAP_MAGIC_MASK) << HFI1_MMAP_MAGIC_SHIFT
            | (u64::from(kind as u8) & HFI1_MMAP_TYPE_MASK) << HFI1_MMAP_TYPE_SHIFT
            | (u64::from(ctxt) & HFI1_MMAP_CTXT_MASK) << HFI1_MMAP_CTXT_SHIFT
            | (u64::from(subctxt) & HFI1_MMAP_SUBCTXT_MASK) << HFI1_MMAP_SUBCTXT_SHIFT
            | (u64::from(offset) & HFI1_MMAP_OFFSET_MASK) << HFI1_MMAP_OFFSET_SHIFT
    }

    /// `None` unless the magic is there (is_valid_mmap).
    pub fn decode(token: u64) -> Option<Self> {
        if (token >> HFI1_MMAP_MAGIC_SHIFT) & HFI1_MMAP_MAGIC_MASK != HFI1_MMAP_MAGIC {
            return None;
        }
        Some(Self {
            kind: MmapType::from_code(((token >> HFI1_MMAP_TYPE_SHIFT) & HFI1_MMAP_TYPE_MASK) as u8),
            ctxt: ((token >> HFI1_MMAP_CTXT_SHIFT) & HFI1_MMAP_CTXT_MASK) as u16,
            subctxt: ((token >> HFI1_MMAP_SUBCTXT_SHIFT) & HFI1_MMAP_SUBCTXT_MASK) as u16,
            offset: ((token >> HFI1_MMAP_OFFSET_SHIFT) & HFI1_MMAP_OFFSET_MASK) as u16,
        })
    }
}

/// The UREGS mapping is exactly one page (file_ops.c: memlen = PAGE_SIZE).
pub const UREGS_SIZE: usize = 4096;

// ---- tidinfo: one u32 per programmed RcvArray entry in TID_UPDATE's tidlist (exp_rcv.h) ----

pub const EXP_TID_TIDLEN_MASK: u32 = 0x7FF;
pub const EXP_TID_TIDLEN_SHIFT: u32 = 0;
pub const EXP_TID_TIDCTRL_MASK: u32 = 0x3;
pub const EXP_TID_TIDCTRL_SHIFT: u32 = 20;
pub const EXP_TID_TIDIDX_MASK: u32 = 0x3FF;
pub const EXP_TID_TIDIDX_SHIFT: u32 = 22;

/// A decoded tidinfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TidInfo {
    /// Pair index relative to the context's expected base (KDETH TID).
    pub idx: u32,
    /// 1: the even entry of the pair, 2: the odd one (KDETH TIDCTRL).
    pub ctrl: u32,
    /// Pages the entry holds.
    pub len: u32,
}

impl TidInfo {
    pub fn decode(tidinfo: u32) -> Self {
        Self {
            idx: (tidinfo >> EXP_TID_TIDIDX_SHIFT) & EXP_TID_TIDIDX_MASK,
            ctrl: (tidinfo >> EXP_TID_TIDCTRL_SHIFT) & EXP_TID_TIDCTRL_MASK,
            len: (tidinfo >> EXP_TID_TIDLEN_SHIFT) & EXP_TID_TIDLEN_MASK,
        }
    }

    pub fn encode(&self) -> u32 {
        ((self.idx & EXP_TID_TIDIDX_MASK) << EXP_TID_TIDIDX_SHIFT)
            | ((self.ctrl & EXP_TID_TIDCTRL_MASK) << EXP_TID_TIDCTRL_SHIFT)
            | ((self.len & EXP_TID_TIDLEN_MASK) << EXP_TID_TIDLEN_SHIFT)
    }

    /// The entry relative to the expected base, as `unprogram_rcvarray` computes it; CTRL 0 and 3 name no
    /// single entry.
    pub fn rcventry(&self) -> Option<u32> {
        matches!(self.ctrl, 1 | 2).then(|| (self.idx << 1) + self.ctrl - 1)
    }
}

/// create_tid(rcventry, npages): `rcventry` relative to the expected base.
pub fn create_tid(rcventry: u32, npages: u32) -> u32 {
    let pair = rcventry & !1;
    TidInfo { idx: pair >> 1, ctrl: 1 << (rcventry - pair), len: npages }.encode()
}

// ---- RcvArray entry (chip_registers.h, chip.c hfi1_put_tid) ----

pub const PAGE_SHIFT: u32 = 12;
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;
/// chip.h: the largest buffer one expected entry holds (find_phys_blocks splits larger runs).
pub const MAX_EXPECTED_BUFFER: u64 = 2048 * 1024;
pub const RCV_ARRAY_RT_ADDR_MASK: u64 = 0xF_FFFF_FFFF;
pub const RCV_ARRAY_RT_ADDR_SHIFT: u32 = 0;
pub const RCV_ARRAY_RT_BUF_SIZE_SHIFT: u32 = 36;
pub const RCV_ARRAY_RT_WRITE_ENABLE_SMASK: u64 = 0x8000_0000_0000_0000;
/// hfi1_put_tid: addresses are stored in 4 KiB units.
pub const RT_ADDR_SHIFT: u32 = 12;

/// The value hfi1_put_tid writes for an expected entry: `order` = ilog2(npages) + 1 (set_rcvarray_entry);
/// order 0 with pa 0 invalidates (PT_INVALID / PT_INVALID_FLUSH).
pub fn put_tid_value(pa: u64, order: u32) -> u64 {
    RCV_ARRAY_RT_WRITE_ENABLE_SMASK
        | u64::from(order) << RCV_ARRAY_RT_BUF_SIZE_SHIFT
        | ((pa >> RT_ADDR_SHIFT) & RCV_ARRAY_RT_ADDR_MASK) << RCV_ARRAY_RT_ADDR_SHIFT
}

/// The BUF_SIZE order set_rcvarray_entry programs for `npages` (a power of two).
pub fn tid_order(npages: u32) -> u32 {
    npages.max(1).ilog2() + 1
}

// ---- receive context control (chip_registers.h) ----

pub const RCV_CTXT_CTRL_ENABLE_SMASK: u64 = 0x1;
pub const RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK: u64 = 0x10;

// ---- TID flow table in the UREGS page (hfi1_user.h enum hfi1_ureg, tid_rdma.c, common.h) ----

/// `ur_rcvtidflowtable = 256`: the flow table starts at u64 register 256 of the user page (byte 0x800),
/// as RCV_TID_FLOW_TABLE (RXE + 0x300800) sits 0x800 into RXE_PER_CONTEXT_USER (RXE + 0x300000).
pub const UR_RCVTIDFLOWTABLE: u64 = 256;
pub const RXE_NUM_TID_FLOWS: u32 = 32;

/// Byte offset of flow `flow` in the UREGS page.
pub fn tid_flow_offset(flow: u32) -> u64 {
    (UR_RCVTIDFLOWTABLE + u64::from(flow)) * 8
}

// The flow entry's fields are the driver side's: udriver defines them (regs.rs), as the kernel's headers do.
pub use udriver::hfi1::regs::{
    GENERATION_MASK, HFI1_KDETH_BTH_SEQ_MASK, HFI1_KDETH_BTH_SEQ_SHIFT, KERN_GENERATION_RESERVED,
    RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK, RCV_TID_FLOW_TABLE_CTRL_HDR_SUPP_EN_SMASK,
    RCV_TID_FLOW_TABLE_CTRL_KEEP_AFTER_SEQ_ERR_SMASK, RCV_TID_FLOW_TABLE_CTRL_KEEP_ON_GEN_ERR_SMASK,
    RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK, RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK,
};
const FLOW_STATUS_W1C: u64 =
    RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK | RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK;

/// One RCV_TID_FLOW_TABLE entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowEntry {
    /// Bits 10:0, the next expected sequence (the kernel writes 0 here with a new generation).
    pub sequence: u32,
    /// Bits 30:11.
    pub generation: u32,
    pub flow_valid: bool,
    pub hdr_supp_en: bool,
    pub keep_after_seq_err: bool,
    pub keep_on_gen_err: bool,
    /// Status bits (write 1 to clear).
    pub seq_mismatch: bool,
    pub gen_mismatch: bool,
}

impl FlowEntry {
    pub fn decode(raw: u64) -> Self {
        Self {
            sequence: (raw & u64::from(HFI1_KDETH_BTH_SEQ_MASK)) as u32,
            generation: ((raw >> HFI1_KDETH_BTH_SEQ_SHIFT) & u64::from(GENERATION_MASK)) as u32,
            flow_valid: raw & RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK != 0,
            hdr_supp_en: raw & RCV_TID_FLOW_TABLE_CTRL_HDR_SUPP_EN_SMASK != 0,
            keep_after_seq_err: raw & RCV_TID_FLOW_TABLE_CTRL_KEEP_AFTER_SEQ_ERR_SMASK != 0,
            keep_on_gen_err: raw & RCV_TID_FLOW_TABLE_CTRL_KEEP_ON_GEN_ERR_SMASK != 0,
            seq_mismatch: raw & RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK != 0,
            gen_mismatch: raw & RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK != 0,
        }
    }
}

/// The value a user program writes to start `generation` on a flow, shaped as kern_set_hw_flow does it:
/// sequence 0, valid, both keep bits (so an error packet drops without invalidating the flow), stale status
/// cleared (W1C), header suppression on.
pub fn flow_program_value(generation: u32) -> u64 {
    u64::from(generation & GENERATION_MASK) << HFI1_KDETH_BTH_SEQ_SHIFT
        | RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK
        | RCV_TID_FLOW_TABLE_CTRL_HDR_SUPP_EN_SMASK
        | RCV_TID_FLOW_TABLE_CTRL_KEEP_AFTER_SEQ_ERR_SMASK
        | RCV_TID_FLOW_TABLE_CTRL_KEEP_ON_GEN_ERR_SMASK
        | FLOW_STATUS_W1C
}

/// What reading the entry back should show after [`flow_program_value`]: the status bits were cleared.
pub fn flow_expected_readback(generation: u32) -> u64 {
    flow_program_value(generation) & !FLOW_STATUS_W1C
}

// ---- KDETH (exp_rcv.h, user_sdma.c) ----

pub const KDETH_OFFSET_MASK: u32 = 0x7fff;
pub const KDETH_TID_MASK: u32 = 0x3ff;
pub const KDETH_OM_SMALL_SHIFT: u32 = 2;
pub const KDETH_OM_LARGE_SHIFT: u32 = 6;
/// KDETH_OM_MAX_SIZE = 1 << ((KDETH_OM_LARGE / KDETH_OM_SMALL) + 1) = 128 KiB: user_sdma.c uses 64-byte
/// offset units for every packet into an entry of at least this size, 4-byte units otherwise. This is the
/// user SDMA path's rule only; the kernel's TID RDMA (tid_rdma.c, udriver's loopback) always uses 64-byte units.
pub const KDETH_OM_MAX_SIZE: u64 = 1 << ((64 / 4) + 1);
/// The largest OPA MTU (10240 bytes): the most payload one packet carries.
pub const OPA_MAX_MTU: u32 = 10240;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    // Sizes, offsets and ioctl numbers of the uapi header (x86-64), derived from hfi1_ioctl.h and
    // rdma_user_ioctl.h by hand and confirmed once by compiling that header.
    #[test]
    fn structs_have_the_uapi_layout() {
        let table: [(&str, usize, usize); 14] = [
            ("sizeof hfi1_user_info", size_of::<Hfi1UserInfo>(), 28),
            ("hfi1_user_info.subctxt_cnt", offset_of!(Hfi1UserInfo, subctxt_cnt), 8),
            ("hfi1_user_info.uuid", offset_of!(Hfi1UserInfo, uuid), 12),
            ("sizeof hfi1_ctxt_info", size_of::<Hfi1CtxtInfo>(), 40),
            ("hfi1_ctxt_info.rcvtids", offset_of!(Hfi1CtxtInfo, rcvtids), 20),
            ("hfi1_ctxt_info.egrtids", offset_of!(Hfi1CtxtInfo, egrtids), 30),
            ("hfi1_ctxt_info.sdma_ring_size", offset_of!(Hfi1CtxtInfo, sdma_ring_size), 36),
            ("sizeof hfi1_tid_info", size_of::<Hfi1TidInfo>(), 24),
            ("hfi1_tid_info.tidcnt", offset_of!(Hfi1TidInfo, tidcnt), 16),
            ("hfi1_tid_info.length", offset_of!(Hfi1TidInfo, length), 20),
            ("sizeof hfi1_base_info", size_of::<Hfi1BaseInfo>(), 120),
            ("hfi1_base_info.bthqp", offset_of!(Hfi1BaseInfo, bthqp), 12),
            ("hfi1_base_info.user_regbase", offset_of!(Hfi1BaseInfo, user_regbase), 64),
            ("hfi1_base_info.subctxt_rcvhdrbuf", offset_of!(Hfi1BaseInfo, subctxt_rcvhdrbuf), 112),
        ];
        for (what, got, want) in table {
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn ioctl_numbers_are_the_kernels() {
        let table = [
            ("HFI1_IOCTL_ASSIGN_CTXT", HFI1_IOCTL_ASSIGN_CTXT, 0xc01c_1be1),
            ("HFI1_IOCTL_CTXT_INFO", HFI1_IOCTL_CTXT_INFO, 0x4028_1be2),
            ("HFI1_IOCTL_USER_INFO", HFI1_IOCTL_USER_INFO, 0x4078_1be3),
            ("HFI1_IOCTL_TID_UPDATE", HFI1_IOCTL_TID_UPDATE, 0xc018_1be4),
            ("HFI1_IOCTL_TID_FREE", HFI1_IOCTL_TID_FREE, 0xc018_1be5),
            ("HFI1_IOCTL_TID_INVAL_READ", HFI1_IOCTL_TID_INVAL_READ, 0xc018_1bed),
            ("HFI1_IOCTL_GET_VERS", HFI1_IOCTL_GET_VERS, 0x8004_1bee),
        ];
        for (name, got, want) in table {
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn user_software_version_is_6_3() {
        assert_eq!(HFI1_USER_SWVERSION, 0x0006_0003);
    }

    #[test]
    fn create_tid_encodes_pair_index_half_and_page_count() {
        // (relative rcventry, npages, tidinfo): IDX 31:22 = pair, CTRL 21:20 = 1 << (entry & 1), LEN 10:0.
        let table = [
            (0, 1, 0x0010_0001),
            (1, 1, 0x0020_0001),
            (5, 4, (2 << 22) | (2 << 20) | 4),
            (8, 512, (4 << 22) | (1 << 20) | 0x200),
            (2047, 512, 0xffe0_0200),
        ];
        for (entry, npages, want) in table {
            assert_eq!(create_tid(entry, npages), want, "entry {entry}");
            let t = TidInfo::decode(want);
            assert_eq!((t.rcventry(), t.len), (Some(entry), npages), "entry {entry}");
        }
    }

    #[test]
    fn tidinfo_with_ctrl_0_or_3_names_no_entry() {
        for ctrl in [0, 3] {
            assert_eq!(TidInfo { idx: 4, ctrl, len: 1 }.rcventry(), None);
        }
    }

    #[test]
    fn uregs_token_carries_magic_type_context_and_subcontext() {
        // HFI1_MMAP_TOKEN(UREGS = 6, ctxt 3, subctxt 0, 0).
        let token = MmapToken::encode(MmapType::Uregs, 3, 0, 0);
        assert_eq!(token, 0xdabb_ad00_0603_0000);
        let t = MmapToken::decode(0xdabb_ad00_0d13_2040).unwrap();
        assert_eq!((t.kind, t.ctxt, t.subctxt, t.offset), (Some(MmapType::SdmaComp), 0x13, 2, 0x40));
        assert_eq!(MmapToken::decode(0x1234_5678_0603_0000), None);
    }

    #[test]
    fn flow_table_sits_at_0x800_of_the_user_page() {
        assert_eq!(tid_flow_offset(0), 0x800);
        assert_eq!(tid_flow_offset(31), 0x8f8);
    }

    #[test]
    fn flow_value_is_the_kernels_programming_of_a_generation() {
        // hardware-facts G3: kern_set_hw_flow(generation 0x12345) writes 0x6F091A2800.
        assert_eq!(flow_program_value(0x12345), 0x0000_006F_091A_2800);
        assert_eq!(flow_expected_readback(0x12345), 0x0000_000F_091A_2800);
        let e = FlowEntry::decode(0x0000_006F_091A_2803);
        assert_eq!((e.generation, e.sequence), (0x12345, 3));
        assert!(e.flow_valid && e.hdr_supp_en && e.keep_after_seq_err && e.keep_on_gen_err);
        assert!(e.seq_mismatch && e.gen_mismatch);
    }

    #[test]
    fn put_tid_value_is_hfi1_put_tid() {
        // hardware-facts G1: 8 KiB (order 2) at 0x12345000.
        assert_eq!(put_tid_value(0x1234_5000, tid_order(2)), 0x8000_0020_0001_2345);
        assert_eq!(put_tid_value(0x20_0000, tid_order(512)), 0x8000_00A0_0000_0200);
        assert_eq!(put_tid_value(0, 0), RCV_ARRAY_RT_WRITE_ENABLE_SMASK);
    }

    #[test]
    fn expected_count_is_rcvtids_minus_the_eager_groups() {
        let info = |rcvtids, egrtids| Hfi1CtxtInfo { rcvtids, egrtids, ..Default::default() };
        assert_eq!(expected_count(&info(512 + 2048, 512)), Some(2048));
        assert_eq!(expected_count(&info(256 + 160, 250)), Some(160));
        assert_eq!(expected_count(&info(4, 250)), None);
    }

    #[test]
    fn kdeth_large_offsets_start_at_128_kib() {
        assert_eq!(KDETH_OM_MAX_SIZE, 128 * 1024);
    }
}
