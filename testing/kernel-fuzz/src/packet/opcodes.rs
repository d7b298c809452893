//! The opcodes hfi1's receive path dispatches on (verbs.c opcode_handler_tbl, 188-242) with the extension
//! headers each carries behind the BTH, field by field. Offsets are from the end of the BTH (the kernel's
//! `union ib_ehdrs`, include/rdma/ib_hdrs.h:63-90; the TID RDMA structs, include/rdma/tid_rdma_defs.h:12-71).

/// One field of an extension header. Big-endian on the wire except KDETH's two words (exp_rcv.h:58 KDETH_GET
/// reads them with le32_to_cpu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// RETH (struct ib_reth, ib_hdrs.h:48-52): VA, R_Key, DMA length.
    RethVaddr,
    RethRkey,
    RethLen,
    /// AETH: syndrome (8) | MSN (24) (ib_hdrs.h:42-46).
    Aeth,
    ImmDt,
    /// IETH: the R_Key to invalidate.
    Ieth,
    /// AtomicETH (struct ib_atomic_eth, ib_hdrs.h:54-59).
    AtomicVaddr,
    AtomicRkey,
    AtomicSwap,
    AtomicCompare,
    /// AtomicAckETH: the original remote data.
    AtomicAckData,
    /// DETH: Q_Key, then reserved (8) | source QP (24) (ib_hdrs.h:209-218).
    DethQkey,
    DethSrcQp,
    /// KDETH word 0 (KVer, SH, Intr, TIDCtrl, TID, OM, Offset: exp_rcv.h:37-50) and word 1 (J_KEY, HCRC:
    /// exp_rcv.h:51-56), little-endian.
    Kdeth0,
    Kdeth1,
    TidFlowPsn,
    TidFlowQp,
    /// The RC QP a TID RDMA packet is for (hfi1_kdeth_eager_rcv reads r_req.verbs_qp, verbs.c:355-357).
    VerbsQp,
    VerbsPsn,
    Reserved,
}

impl Field {
    pub const fn bytes(self) -> usize {
        match self {
            Field::RethVaddr | Field::AtomicVaddr | Field::AtomicSwap | Field::AtomicCompare | Field::AtomicAckData => {
                8
            }
            _ => 4,
        }
    }
}

/// Which of the QP's PSNs a packet of this opcode carries: a request the QP's expected receive PSN, a
/// response (ACK, read response, atomic ACK) a PSN of what the QP sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Request,
    Response,
}

/// An opcode with its extension headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opcode {
    /// The kernel's name without IB_OPCODE_ (include/rdma/ib_pack.h, tid_rdma_defs.h).
    pub name: &'static str,
    pub opcode: u8,
    /// (field, offset from the end of the BTH).
    pub ext: &'static [(Field, usize)],
    pub role: Role,
    /// TID RDMA opcodes whose payload the chip places through TIDs (TIDCtrl != 0: tid_rdma.c:2377, 4238);
    /// the others go eager.
    pub expected: bool,
}

/// The opcodes whose packets carry no payload: requests for data or atomics, acknowledgements, TID RDMA's
/// requests and flow control, and the CNP.
pub const NO_PAYLOAD: [&str; 11] = [
    "RC_RDMA_READ_REQUEST",
    "RC_ACKNOWLEDGE",
    "RC_ATOMIC_ACKNOWLEDGE",
    "RC_COMPARE_SWAP",
    "RC_FETCH_ADD",
    "TID_RDMA_WRITE_REQ",
    "TID_RDMA_WRITE_RESP",
    "TID_RDMA_READ_REQ",
    "TID_RDMA_RESYNC",
    "TID_RDMA_ACK",
    "CNP",
];

impl Opcode {
    pub fn carries_payload(&self) -> bool {
        !NO_PAYLOAD.contains(&self.name)
    }

    /// Bytes of extension headers behind the BTH.
    pub fn ext_bytes(&self) -> usize {
        self.ext.iter().map(|&(f, at)| at + f.bytes()).max().unwrap_or(0)
    }
}

use Field::*;

const NONE: &[(Field, usize)] = &[];
const IMM: &[(Field, usize)] = &[(ImmDt, 0)];
const IETH: &[(Field, usize)] = &[(Ieth, 0)];
const RETH: &[(Field, usize)] = &[(RethVaddr, 0), (RethRkey, 8), (RethLen, 12)];
const RETH_IMM: &[(Field, usize)] = &[(RethVaddr, 0), (RethRkey, 8), (RethLen, 12), (ImmDt, 16)];
const AETH: &[(Field, usize)] = &[(Aeth, 0)];
/// `ib_ehdrs.at` (ib_hdrs.h:72-75).
const ATOMIC_ACK: &[(Field, usize)] = &[(Aeth, 0), (AtomicAckData, 4)];
const ATOMIC_ETH: &[(Field, usize)] = &[(AtomicVaddr, 0), (AtomicRkey, 8), (AtomicSwap, 12), (AtomicCompare, 20)];
/// `ib_ehdrs.ud` (ib_hdrs.h:64-67).
const DETH: &[(Field, usize)] = &[(DethQkey, 0), (DethSrcQp, 4)];
const DETH_IMM: &[(Field, usize)] = &[(DethQkey, 0), (DethSrcQp, 4), (ImmDt, 8)];
/// struct tid_rdma_read_req (tid_rdma_defs.h:12-19).
const TID_READ_REQ: &[(Field, usize)] = &[
    (Kdeth0, 0),
    (Kdeth1, 4),
    (RethVaddr, 8),
    (RethRkey, 16),
    (RethLen, 20),
    (TidFlowPsn, 24),
    (TidFlowQp, 28),
    (VerbsQp, 32),
];
/// struct tid_rdma_read_resp (tid_rdma_defs.h:21-28).
const TID_READ_RESP: &[(Field, usize)] = &[
    (Kdeth0, 0),
    (Kdeth1, 4),
    (Aeth, 8),
    (Reserved, 12),
    (Reserved, 16),
    (Reserved, 20),
    (Reserved, 24),
    (VerbsPsn, 28),
    (VerbsQp, 32),
];
/// struct tid_rdma_write_req (tid_rdma_defs.h:30-36).
const TID_WRITE_REQ: &[(Field, usize)] = &[
    (Kdeth0, 0),
    (Kdeth1, 4),
    (RethVaddr, 8),
    (RethRkey, 16),
    (RethLen, 20),
    (Reserved, 24),
    (Reserved, 28),
    (VerbsQp, 32),
];
/// struct tid_rdma_write_resp (tid_rdma_defs.h:38-46).
const TID_WRITE_RESP: &[(Field, usize)] = &[
    (Kdeth0, 0),
    (Kdeth1, 4),
    (Aeth, 8),
    (Reserved, 12),
    (Reserved, 16),
    (Reserved, 20),
    (TidFlowPsn, 24),
    (TidFlowQp, 28),
    (VerbsQp, 32),
];
/// struct tid_rdma_write_data and struct tid_rdma_resync (tid_rdma_defs.h:48-60).
const TID_WRITE_DATA: &[(Field, usize)] = &[
    (Kdeth0, 0),
    (Kdeth1, 4),
    (Reserved, 8),
    (Reserved, 12),
    (Reserved, 16),
    (Reserved, 20),
    (Reserved, 24),
    (Reserved, 28),
    (VerbsQp, 32),
];
/// struct tid_rdma_ack (tid_rdma_defs.h:62-71).
const TID_ACK: &[(Field, usize)] = &[
    (Kdeth0, 0),
    (Kdeth1, 4),
    (Aeth, 8),
    (Reserved, 12),
    (Reserved, 16),
    (TidFlowPsn, 20),
    (VerbsPsn, 24),
    (TidFlowQp, 28),
    (VerbsQp, 32),
];

/// Transport bases (ib_pack.h:53-60).
pub const IB_OPCODE_RC: u8 = 0x00;
pub const IB_OPCODE_UC: u8 = 0x20;
pub const IB_OPCODE_UD: u8 = 0x60;
pub const IB_OPCODE_CNP: u8 = 0x80;
pub const IB_OPCODE_TID_RDMA: u8 = 0xE0;
/// The transport bits of an opcode (RVT_OPCODE_QP_MASK).
pub const OPCODE_QP_MASK: u8 = 0xE0;

const fn op(name: &'static str, opcode: u8, ext: &'static [(Field, usize)], role: Role) -> Opcode {
    Opcode { name, opcode, ext, role, expected: false }
}
const fn tid(name: &'static str, opcode: u8, ext: &'static [(Field, usize)], role: Role, expected: bool) -> Opcode {
    Opcode { name, opcode, ext, role, expected }
}

use Role::{Request as Req, Response as Resp};

/// Every RC opcode opcode_handler_tbl sends to hfi1_rc_rcv (verbs.c:190-212; values ib_pack.h:63-86).
pub const RC: &[Opcode] = &[
    op("RC_SEND_FIRST", 0x00, NONE, Req),
    op("RC_SEND_MIDDLE", 0x01, NONE, Req),
    op("RC_SEND_LAST", 0x02, NONE, Req),
    op("RC_SEND_LAST_WITH_IMMEDIATE", 0x03, IMM, Req),
    op("RC_SEND_ONLY", 0x04, NONE, Req),
    op("RC_SEND_ONLY_WITH_IMMEDIATE", 0x05, IMM, Req),
    op("RC_RDMA_WRITE_FIRST", 0x06, RETH, Req),
    op("RC_RDMA_WRITE_MIDDLE", 0x07, NONE, Req),
    op("RC_RDMA_WRITE_LAST", 0x08, NONE, Req),
    op("RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 0x09, IMM, Req),
    op("RC_RDMA_WRITE_ONLY", 0x0A, RETH, Req),
    op("RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 0x0B, RETH_IMM, Req),
    op("RC_RDMA_READ_REQUEST", 0x0C, RETH, Req),
    op("RC_RDMA_READ_RESPONSE_FIRST", 0x0D, AETH, Resp),
    op("RC_RDMA_READ_RESPONSE_MIDDLE", 0x0E, NONE, Resp),
    op("RC_RDMA_READ_RESPONSE_LAST", 0x0F, AETH, Resp),
    op("RC_RDMA_READ_RESPONSE_ONLY", 0x10, AETH, Resp),
    op("RC_ACKNOWLEDGE", 0x11, AETH, Resp),
    op("RC_ATOMIC_ACKNOWLEDGE", 0x12, ATOMIC_ACK, Resp),
    op("RC_COMPARE_SWAP", 0x13, ATOMIC_ETH, Req),
    op("RC_FETCH_ADD", 0x14, ATOMIC_ETH, Req),
    op("RC_SEND_LAST_WITH_INVALIDATE", 0x16, IETH, Req),
    op("RC_SEND_ONLY_WITH_INVALIDATE", 0x17, IETH, Req),
];

/// The UC opcodes hfi1_uc_rcv takes (verbs.c:225-236).
pub const UC: &[Opcode] = &[
    op("UC_SEND_FIRST", 0x20, NONE, Req),
    op("UC_SEND_MIDDLE", 0x21, NONE, Req),
    op("UC_SEND_LAST", 0x22, NONE, Req),
    op("UC_SEND_LAST_WITH_IMMEDIATE", 0x23, IMM, Req),
    op("UC_SEND_ONLY", 0x24, NONE, Req),
    op("UC_SEND_ONLY_WITH_IMMEDIATE", 0x25, IMM, Req),
    op("UC_RDMA_WRITE_FIRST", 0x26, RETH, Req),
    op("UC_RDMA_WRITE_MIDDLE", 0x27, NONE, Req),
    op("UC_RDMA_WRITE_LAST", 0x28, NONE, Req),
    op("UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 0x29, IMM, Req),
    op("UC_RDMA_WRITE_ONLY", 0x2A, RETH, Req),
    op("UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 0x2B, RETH_IMM, Req),
];

/// hfi1_ud_rcv's opcodes (verbs.c:238-239).
pub const UD: &[Opcode] =
    &[op("UD_SEND_ONLY", 0x64, DETH, Req), op("UD_SEND_ONLY_WITH_IMMEDIATE", 0x65, DETH_IMM, Req)];

/// The TID RDMA opcodes and their handlers' headers (tid_rdma_defs.h:76-95; verbs.c:215-222).
pub const TID_RDMA: &[Opcode] = &[
    tid("TID_RDMA_WRITE_REQ", 0xE0, TID_WRITE_REQ, Req, false),
    tid("TID_RDMA_WRITE_RESP", 0xE1, TID_WRITE_RESP, Resp, false),
    tid("TID_RDMA_WRITE_DATA", 0xE2, TID_WRITE_DATA, Req, true),
    tid("TID_RDMA_WRITE_DATA_LAST", 0xE3, TID_WRITE_DATA, Req, true),
    tid("TID_RDMA_READ_REQ", 0xE4, TID_READ_REQ, Req, false),
    tid("TID_RDMA_READ_RESP", 0xE5, TID_READ_RESP, Resp, true),
    tid("TID_RDMA_RESYNC", 0xE6, TID_WRITE_DATA, Req, false),
    tid("TID_RDMA_ACK", 0xE7, TID_ACK, Resp, false),
];

/// The congestion notification hfi1_cnp_rcv takes on any QP (verbs.c:241, qp_ok 274-283).
pub const CNP: &[Opcode] = &[op("CNP", IB_OPCODE_CNP, NONE, Req)];

/// Every opcode with a handler.
pub fn handled() -> impl Iterator<Item = &'static Opcode> {
    [RC, UC, UD, TID_RDMA, CNP].into_iter().flatten()
}

/// The opcode with a handler named `opcode`, if any.
pub fn lookup(opcode: u8) -> Option<&'static Opcode> {
    handled().find(|o| o.opcode == opcode)
}

/// The opcodes no handler takes (the drop path): RD, the rest of RC/UC/UD, FLUSH and ATOMIC_WRITE, the
/// user KDETH range, and the reserved ones.
pub fn unhandled() -> &'static [u8] {
    static UNHANDLED: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    UNHANDLED.get_or_init(|| (0..=u8::MAX).filter(|&o| lookup(o).is_none()).collect())
}
