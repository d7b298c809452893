//! The integrity checks a send context applies to each PIO packet it launches (SEND_CTXT_CHECK_*), for user
//! send contexts: what stops a process from sending a forged SMP, a verbs packet or another job's KDETH.
//!
//! The kernel sets them at context allocation (pio.c sc_alloc: CHECK_ENABLE from hfi.h
//! hfi1_pkt_default_send_ctxt_mask, CHECK_OPCODE 0xC0/0xC0 and CHECK_VL with VL15 for SC_USER) and at open
//! (chip.c hfi1_set_ctxt_jkey: CHECK_JOB_KEY). A packet failing one is dropped, the context halts with
//! SEND_CTXT_ERR_STATUS.PIO_DISALLOWED_PACKET_ERR and its error interrupt, and SEND_EGRESS_ERR_INFO names the
//! check (chip.c sc_err_status_flags "DisallowedPacket", is_sendctxt_err_int, handle_send_egress_err_info).
//! Only user contexts are checked (docs/decisions.md).

#![forbid(unsafe_code)]

use crate::hfi1::cable::wire::{BTH_BYTES, GRH_BYTES, LNH_GRH, LRH_BYTES};
use crate::hfi1::jkey;

// SEND_CTXT_CHECK_ENABLE fields (chip_registers.h).
pub const SEND_CTXT_CHECK_ENABLE_CHECK_VL_SMASK: u64 = 0x2;
pub const SEND_CTXT_CHECK_ENABLE_CHECK_JOB_KEY_SMASK: u64 = jkey::SEND_CTXT_CHECK_ENABLE_CHECK_JOB_KEY_SMASK;
pub const SEND_CTXT_CHECK_ENABLE_CHECK_PARTITION_KEY_SMASK: u64 = 0x8;
pub const SEND_CTXT_CHECK_ENABLE_CHECK_SLID_SMASK: u64 = 0x10;
pub const SEND_CTXT_CHECK_ENABLE_CHECK_OPCODE_SMASK: u64 = 0x20;
pub const SEND_CTXT_CHECK_ENABLE_DISALLOW_GRH_SMASK: u64 = 0x400;
pub const SEND_CTXT_CHECK_ENABLE_DISALLOW_BYPASS_SMASK: u64 = 0x800;
pub const SEND_CTXT_CHECK_ENABLE_DISALLOW_KDETH_PACKETS_SMASK: u64 = 0x1000;
pub const SEND_CTXT_CHECK_ENABLE_DISALLOW_NON_KDETH_PACKETS_SMASK: u64 = 0x2000;
// SEND_CTXT_CHECK_JOB_KEY, SEND_CTXT_CHECK_OPCODE, SEND_BTH_QP fields.
pub const SEND_CTXT_CHECK_JOB_KEY_ALLOW_PERMISSIVE_SMASK: u64 = 0x1_0000_0000;
pub const SEND_CTXT_CHECK_JOB_KEY_MASK_SHIFT: u32 = 16;
pub const SEND_CTXT_CHECK_PARTITION_KEY_VALUE_MASK: u64 = 0xFFFF;
pub const SEND_CTXT_CHECK_SLID_MASK_SHIFT: u32 = 16;
pub const SEND_CTXT_CHECK_SLID_VALUE_MASK: u64 = 0xFFFF;
/// A partition key without its membership bit: INFERRED, keys match as the IBTA matches them, on bits 14:0.
const PKEY_KEY_MASK: u16 = 0x7FFF;
pub const SEND_CTXT_CHECK_OPCODE_MASK_SHIFT: u32 = 8;
pub const SEND_CTXT_CHECK_OPCODE_VALUE_SHIFT: u32 = 0;
const BYTE: u64 = 0xFF;
pub const SEND_BTH_QP_KDETH_QP_SHIFT: u32 = 16;
pub const SEND_BTH_QP_KDETH_QP_MASK: u64 = 0xFF;
// SEND_EGRESS_ERR_INFO: which check a disallowed packet failed.
pub const SEND_EGRESS_ERR_INFO_VL_ERR_SMASK: u64 = 0x2;
pub const SEND_EGRESS_ERR_INFO_JOB_KEY_ERR_SMASK: u64 = 0x4;
pub const SEND_EGRESS_ERR_INFO_PARTITION_KEY_ERR_SMASK: u64 = 0x8;
pub const SEND_EGRESS_ERR_INFO_SLID_ERR_SMASK: u64 = 0x10;
pub const SEND_EGRESS_ERR_INFO_OPCODE_ERR_SMASK: u64 = 0x20;
pub const SEND_EGRESS_ERR_INFO_GRH_ERR_SMASK: u64 = 0x400;
pub const SEND_EGRESS_ERR_INFO_BYPASS_ERR_SMASK: u64 = 0x800;
pub const SEND_EGRESS_ERR_INFO_KDETH_PACKETS_ERR_SMASK: u64 = 0x1000;
pub const SEND_EGRESS_ERR_INFO_NON_KDETH_PACKETS_ERR_SMASK: u64 = 0x2000;
/// The J_KEY a KDETH header may carry to pass any job-key check that allows it (the permissive key).
const PERMISSIVE_JKEY: u16 = 0xFFFF;

/// A send context's check registers, as the driver last wrote them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SendChecks {
    pub enable: u64,
    pub job_key: u64,
    pub opcode: u64,
    /// hfi1_set_ctxt_pkey's key (pio.c sc_alloc: DEFAULT_PKEY 0xffff until then).
    pub partition_key: u64,
    /// set_lidlmc's LID and LMC mask (chip.c).
    pub slid: u64,
    /// SEND_CTXT_CHECK_VL: a bit per VL the context may not send on (pio.c sc_alloc sets bit 15 for users;
    /// init_pervl_scs sets every other VL for the VL15 context).
    pub vl: u64,
    /// SEND_BTH_QP: the KDETH QP prefix (chip.c init_kdeth_qp).
    pub bth_qp: u64,
}

impl SendChecks {
    /// Whether these registers make the context a user's (jkey.rs).
    pub fn user(&self) -> bool {
        jkey::send_is_user(self.enable, self.job_key)
    }

    /// The SEND_EGRESS_ERR_INFO bits of every check the packet fails: the register has a bit per check, and
    /// one packet may set several (chip.c handle_send_egress_err_info). `vl` and `bypass` are its PBC's VL and
    /// PacketBypass, `body` the bytes from its LRH.
    pub fn check(&self, vl: u64, bypass: bool, body: &[u8]) -> Result<(), u64> {
        let on = |bit: u64| self.enable & bit != 0;
        let mut failed = 0;
        let mut fail = |cond: bool, info: u64| {
            if cond {
                failed |= info;
            }
        };
        if bypass {
            // A 16B packet has none of the 9B fields below.
            fail(on(SEND_CTXT_CHECK_ENABLE_DISALLOW_BYPASS_SMASK), SEND_EGRESS_ERR_INFO_BYPASS_ERR_SMASK);
            return if failed == 0 { Ok(()) } else { Err(failed) };
        }
        fail(on(SEND_CTXT_CHECK_ENABLE_CHECK_VL_SMASK) && self.vl & (1 << vl) != 0, SEND_EGRESS_ERR_INFO_VL_ERR_SMASK);
        let grh = body.get(1).is_some_and(|b| b & 0x3 == LNH_GRH);
        if let Some(l) = body.get(6..8) {
            let slid = u64::from(u16::from_be_bytes([l[0], l[1]]));
            let mask = (self.slid >> SEND_CTXT_CHECK_SLID_MASK_SHIFT) & SEND_CTXT_CHECK_SLID_VALUE_MASK;
            let value = self.slid & SEND_CTXT_CHECK_SLID_VALUE_MASK;
            fail(
                on(SEND_CTXT_CHECK_ENABLE_CHECK_SLID_SMASK) && slid & mask != value & mask,
                SEND_EGRESS_ERR_INFO_SLID_ERR_SMASK,
            );
        }
        fail(grh && on(SEND_CTXT_CHECK_ENABLE_DISALLOW_GRH_SMASK), SEND_EGRESS_ERR_INFO_GRH_ERR_SMASK);
        // Bytes too short for a BTH are the egress's to refuse (wire_tx_malformed); the BTH checks pass them.
        let bth = if grh { LRH_BYTES + GRH_BYTES } else { LRH_BYTES };
        if let Some(b) = body.get(bth..bth + BTH_BYTES) {
            let opcode = u64::from(b[0]);
            let pkey = u16::from_be_bytes([b[2], b[3]]);
            let ctxt_pkey = (self.partition_key & SEND_CTXT_CHECK_PARTITION_KEY_VALUE_MASK) as u16;
            fail(
                on(SEND_CTXT_CHECK_ENABLE_CHECK_PARTITION_KEY_SMASK)
                    && pkey & PKEY_KEY_MASK != ctxt_pkey & PKEY_KEY_MASK,
                SEND_EGRESS_ERR_INFO_PARTITION_KEY_ERR_SMASK,
            );
            let kdeth = u64::from(b[5]) == (self.bth_qp >> SEND_BTH_QP_KDETH_QP_SHIFT) & SEND_BTH_QP_KDETH_QP_MASK;
            fail(
                kdeth && on(SEND_CTXT_CHECK_ENABLE_DISALLOW_KDETH_PACKETS_SMASK),
                SEND_EGRESS_ERR_INFO_KDETH_PACKETS_ERR_SMASK,
            );
            fail(
                !kdeth && on(SEND_CTXT_CHECK_ENABLE_DISALLOW_NON_KDETH_PACKETS_SMASK),
                SEND_EGRESS_ERR_INFO_NON_KDETH_PACKETS_ERR_SMASK,
            );
            let mask = (self.opcode >> SEND_CTXT_CHECK_OPCODE_MASK_SHIFT) & BYTE;
            let value = (self.opcode >> SEND_CTXT_CHECK_OPCODE_VALUE_SHIFT) & BYTE;
            fail(
                on(SEND_CTXT_CHECK_ENABLE_CHECK_OPCODE_SMASK) && opcode & mask != value & mask,
                SEND_EGRESS_ERR_INFO_OPCODE_ERR_SMASK,
            );
            // The J_KEY is KDETH's (hfi1_user.h struct hfi1_kdeth_header: jkey after the first word); a KDETH
            // packet too short to hold one fails.
            let at = bth + BTH_BYTES + 4;
            if kdeth && on(SEND_CTXT_CHECK_ENABLE_CHECK_JOB_KEY_SMASK) {
                let key = body.get(at..at + 2).map(|j| u16::from_le_bytes([j[0], j[1]]));
                let mask = ((self.job_key >> SEND_CTXT_CHECK_JOB_KEY_MASK_SHIFT) & 0xFFFF) as u16;
                let value = (self.job_key & jkey::SEND_CTXT_CHECK_JOB_KEY_VALUE_MASK) as u16;
                let permissive = self.job_key & SEND_CTXT_CHECK_JOB_KEY_ALLOW_PERMISSIVE_SMASK != 0;
                let ok = key.is_some_and(|k| k & mask == value & mask || (permissive && k == PERMISSIVE_JKEY));
                fail(!ok, SEND_EGRESS_ERR_INFO_JOB_KEY_ERR_SMASK);
            }
        }
        if failed == 0 {
            Ok(())
        } else {
            Err(failed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SEND_CTXT_CHECK_ENABLE of a user send context on B0 hardware: hfi1_pkt_default_send_ctxt_mask(SC_USER)
    /// (hfi.h: the base checks, DISALLOW_PBC_TEST, HFI1_PKT_USER_SC_INTEGRITY, CHECK_JOB_KEY).
    /// Then HFI1_IOCTL_SET_PKEY (chip.c hfi1_set_ctxt_pkey): CHECK_PARTITION_KEY on, DISALLOW_KDETH_PACKETS off.
    const USER_ENABLE: u64 = (USER_DEFAULT | 0x8) & !0x1000;
    const USER_DEFAULT: u64 = 0x20000 // DISALLOW_BAD_PKT_LEN
        | 0x4000 | 0x8000 | 0x40000 | 0x80000 | 0x100000 | 0x200000 // static rate, too long/small bypass and IB
        | 0x10000 // DISALLOW_PBC_TEST
        | 0x200 | 0x100 // DISALLOW_RAW_IPV6, DISALLOW_RAW
        | 0x80 | 0x40 | 0x20 | 0x10 | 0x2 | 0x1 // CHECK_BYPASS_VL_MAPPING .. CHECK_ENABLE
        | 0x2000 | 0x1000 | 0x800 | 0x400 // HFI1_PKT_USER_SC_INTEGRITY
        | 0x4; // CHECK_JOB_KEY
    const JKEY: u16 = 1000;
    /// PSM2's default key (PSM2_PKEY 0x8001) and the port's LID 2 with LMC 0 (set_lidlmc: mask 0xffff).
    const PKEY: u16 = 0x8001;
    const LID: u16 = 2;

    /// sc_alloc(SC_USER) and hfi1_set_ctxt_jkey for uid 1000, with init_kdeth_qp's SEND_BTH_QP.
    fn user() -> SendChecks {
        SendChecks {
            enable: USER_ENABLE,
            job_key: 0xFFFF_0000 | u64::from(JKEY),
            opcode: (0xC0 << 8) | 0xC0,
            partition_key: u64::from(PKEY),
            slid: (0xFFFF << 16) | u64::from(LID),
            vl: 1 << 15,
            bth_qp: 0x80 << 16,
        }
    }

    /// A 9B packet: LRH (`lnh`), BTH (`opcode`, DestQP[23:16] `qp_prefix`), KDETH word 0 and the J_KEY `jkey`.
    fn packet(lnh: u8, opcode: u8, qp_prefix: u8, jkey: u16) -> Vec<u8> {
        let at = if lnh == LNH_GRH { LRH_BYTES + GRH_BYTES } else { LRH_BYTES };
        let mut b = vec![0u8; at + BTH_BYTES + 36];
        b[1] = lnh;
        b[6..8].copy_from_slice(&LID.to_be_bytes());
        b[at] = opcode;
        b[at + 2..at + 4].copy_from_slice(&PKEY.to_be_bytes());
        b[at + 5] = qp_prefix;
        b[at + BTH_BYTES + 4..at + BTH_BYTES + 6].copy_from_slice(&jkey.to_le_bytes());
        b
    }

    /// (what, PBC, packet, the checks it fails).
    type Case = (&'static str, (u64, bool), Vec<u8>, Result<(), u64>);

    /// The PBC fields the checks read: VL, PacketBypass.
    const fn pbc(vl: u64) -> (u64, bool) {
        (vl, false)
    }
    const BYPASS: (u64, bool) = (0, true);

    #[test]
    fn a_user_context_sends_only_its_own_kdeth_packets() {
        let psm2 = packet(0x2, 0xC1, 0x80, JKEY);
        let mut other_pkey = psm2.clone();
        other_pkey[LRH_BYTES + 2..LRH_BYTES + 4].copy_from_slice(&0x8002u16.to_be_bytes());
        let mut limited = psm2.clone();
        limited[LRH_BYTES + 2..LRH_BYTES + 4].copy_from_slice(&0x0001u16.to_be_bytes());
        let mut other_slid = psm2.clone();
        other_slid[6..8].copy_from_slice(&3u16.to_be_bytes());
        let table: [Case; 12] = [
            ("a partition it is not in", pbc(0), other_pkey, Err(SEND_EGRESS_ERR_INFO_PARTITION_KEY_ERR_SMASK)),
            ("its partition as a limited member", pbc(0), limited, Ok(())),
            ("another port's SLID", pbc(0), other_slid, Err(SEND_EGRESS_ERR_INFO_SLID_ERR_SMASK)),
            ("PSM2's KDETH packet", pbc(0), psm2.clone(), Ok(())),
            ("the top of the user range", pbc(0), packet(0x2, 0xFF, 0x80, JKEY), Ok(())),
            (
                "another job's J_KEY",
                pbc(0),
                packet(0x2, 0xC1, 0x80, JKEY + 1),
                Err(SEND_EGRESS_ERR_INFO_JOB_KEY_ERR_SMASK),
            ),
            (
                "the permissive J_KEY, not allowed",
                pbc(0),
                packet(0x2, 0xC1, 0x80, 0xFFFF),
                Err(SEND_EGRESS_ERR_INFO_JOB_KEY_ERR_SMASK),
            ),
            (
                "a forged SMP on VL15",
                pbc(15),
                packet(0x2, 0x64, 0, 0),
                Err(SEND_EGRESS_ERR_INFO_VL_ERR_SMASK
                    | SEND_EGRESS_ERR_INFO_NON_KDETH_PACKETS_ERR_SMASK
                    | SEND_EGRESS_ERR_INFO_OPCODE_ERR_SMASK),
            ),
            (
                "a verbs UD packet",
                pbc(0),
                packet(0x2, 0x64, 0, 0),
                Err(SEND_EGRESS_ERR_INFO_NON_KDETH_PACKETS_ERR_SMASK | SEND_EGRESS_ERR_INFO_OPCODE_ERR_SMASK),
            ),
            (
                "a KDETH packet with a verbs opcode",
                pbc(0),
                packet(0x2, 0x04, 0x80, JKEY),
                Err(SEND_EGRESS_ERR_INFO_OPCODE_ERR_SMASK),
            ),
            (
                "a KDETH packet with a GRH",
                pbc(0),
                packet(LNH_GRH, 0xC1, 0x80, JKEY),
                Err(SEND_EGRESS_ERR_INFO_GRH_ERR_SMASK),
            ),
            ("a 16B bypass packet", BYPASS, psm2, Err(SEND_EGRESS_ERR_INFO_BYPASS_ERR_SMASK)),
        ];
        for (what, (vl, bypass), body, want) in table {
            assert_eq!(user().check(vl, bypass, &body), want, "{what}");
        }
    }

    #[test]
    fn the_permissive_j_key_passes_only_where_the_context_allows_it() {
        let body = packet(0x2, 0xC1, 0x80, 0xFFFF);
        let allowed = SendChecks { job_key: user().job_key | SEND_CTXT_CHECK_JOB_KEY_ALLOW_PERMISSIVE_SMASK, ..user() };
        assert_eq!(allowed.check(0, false, &body), Ok(()));
        assert_eq!(user().check(0, false, &body), Err(SEND_EGRESS_ERR_INFO_JOB_KEY_ERR_SMASK));
    }

    #[test]
    fn checks_the_enable_register_leaves_off_pass_everything() {
        let none = SendChecks { enable: 0, ..user() };
        assert_eq!(none.check(15, false, &packet(LNH_GRH, 0x64, 0, 0)), Ok(()));
        assert_eq!(none.check(0, true, &[]), Ok(()));
    }

    #[test]
    fn before_set_pkey_a_user_context_may_send_nothing() {
        // sc_alloc's set_pio_integrity disallows KDETH and non-KDETH packets alike; hfi1_set_ctxt_pkey lifts the
        // first.
        let fresh = SendChecks { enable: USER_DEFAULT, ..user() };
        let err = fresh.check(0, false, &packet(0x2, 0xC1, 0x80, JKEY));
        assert_eq!(err, Err(SEND_EGRESS_ERR_INFO_KDETH_PACKETS_ERR_SMASK));
    }
}
