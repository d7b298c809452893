//! Frames from records: a record's knobs and payload laid out as a sealed 9B packet.

use device_model::hfi1::cable::wire::{
    self, WirePacket, BTH_BYTES, GRH_BYTES, ICRC_BYTES, LID_MULTICAST_BASE, LID_PERMISSIVE, LNH_BTH, LNH_GRH,
    LRH_BYTES, MAX_PACKET_BYTES, SC_VL15,
};

use super::mad::{self, Attr};
use super::opcodes::{self, Field, Opcode, Role};
use crate::target::{Qp, QpType, Target, PSN_MASK, QPN_MASK};

/// Packets per exec: one batch, drained by one receive interrupt (docs/fuzzing-kernel.md).
pub const MAX_PACKETS_PER_EXEC: usize = 16;
/// What separates records in an input (give it to the fuzzer as a token).
pub const RECORD_MARKER: [u8; 4] = [0xF1, 0x5E, 0xED, 0x9B];
/// The knobs in front of each record's payload bytes.
pub const RECORD_HEADER_BYTES: usize = 36;

/// Where each knob sits in a record.
pub mod at {
    /// Index into [`Class::ALL`](super::Class::ALL).
    pub const CLASS: usize = 0;
    /// The class's template: opcode or MAD attribute.
    pub const TEMPLATE: usize = 1;
    /// Destination QP: low 5 bits the dictionary entry, high 3 bits the variant.
    pub const QP: usize = 2;
    pub const PSN: usize = 3;
    /// Low nibble DLID (1 permissive, 2 multicast, 3 the port's LID + 1, 4 zero, 5 raw, else the class's),
    /// high nibble SLID (1 permissive, 2 the port's own LID, 3 the class's + 1, 4 zero, 5 raw, else the
    /// class's: the peer, or the SM for MADs).
    pub const LIDS: usize = 4;
    pub const PKEY: usize = 5;
    /// BTH and sideband flags ([`super::flag`]).
    pub const FLAGS: usize = 6;
    /// Deliberate damage ([`super::Damage`]) in its top eighth of values.
    pub const DAMAGE: usize = 7;
    /// Payload length, u16 little-endian: 0 takes the record's payload bytes.
    pub const LEN: usize = 8;
    /// The byte that pads the payload past the record's bytes.
    pub const FILL: usize = 10;
    /// Low nibble SC (0: the class's own), high nibble SL (0: the dictionary's).
    pub const SC_SL: usize = 11;
    pub const VADDR: usize = 12;
    pub const RKEY: usize = 13;
    pub const DMA_LEN: usize = 14;
    pub const AETH: usize = 15;
    pub const QKEY: usize = 16;
    /// MADs: method, routing and version ([`super::method`]).
    pub const METHOD: usize = 17;
    pub const ATTR_MOD: usize = 18;
    /// TID RDMA: KDETH word 0's control fields ([`super::kdeth_knob`]).
    pub const KDETH: usize = 19;
    /// A raw 32-bit value (u32 LE): raw PSN, QPN, MSN, immediate, TID and offset.
    pub const RAW32: usize = 20;
    /// A raw 64-bit value (u64 LE): addresses, atomic operands, M_Key, GIDs.
    pub const RAW64: usize = 24;
    /// TID RDMA: the receive context in a KDETH DestQP; unhandled opcodes: its upper half sends them to one.
    pub const CTXT: usize = 32;
    pub const JKEY: usize = 33;
    /// Directed-route SMPs: 0 a request at the end of a one-hop path (pointer = count = 1), else the low
    /// nibble the hop pointer and the high nibble the hop count.
    pub const HOP: usize = 34;
    /// [`super::misc`] bits.
    pub const MISC: usize = 35;
}

/// MISC bits.
pub mod misc {
    /// The MAD's M_Key from RAW64 (else 0, the M_Key of a port no SM has protected).
    pub const RAW_MKEY: u8 = 1 << 0;
    /// The MAD's transaction ID from RAW64 (else the report's generation).
    pub const RAW_TID: u8 = 1 << 1;
    /// Bits 7:2: the GRH's traffic class.
    pub const TCLASS_SHIFT: u32 = 2;
}

/// FLAGS bits.
pub mod flag {
    pub const SOLICITED: u8 = 1 << 0;
    pub const MIG_REQ: u8 = 1 << 1;
    pub const ACK_REQ: u8 = 1 << 2;
    pub const FECN: u8 = 1 << 3;
    pub const BECN: u8 = 1 << 4;
    pub const SC4: u8 = 1 << 5;
    /// LRH.LNH = GRH, with a GRH.
    pub const GRH: u8 = 1 << 6;
    /// A transport header version other than 0.
    pub const TVER: u8 = 1 << 7;
}

/// METHOD bits.
pub mod method {
    /// Low 3 bits: index into [`METHODS`].
    pub const METHOD_MASK: u8 = 0x7;
    pub const METHODS: [u8; 8] = [
        crate::packet::mad::IB_MGMT_METHOD_GET,
        crate::packet::mad::IB_MGMT_METHOD_SET,
        crate::packet::mad::IB_MGMT_METHOD_GET,
        crate::packet::mad::IB_MGMT_METHOD_SET,
        crate::packet::mad::IB_MGMT_METHOD_GET_RESP,
        crate::packet::mad::IB_MGMT_METHOD_TRAP,
        crate::packet::mad::IB_MGMT_METHOD_TRAP_REPRESS,
        crate::packet::mad::IB_MGMT_METHOD_REPORT,
    ];
    pub const SET: u8 = 1;
    /// SMPs: directed route (class 0x81, permissive LIDs).
    pub const DIRECTED: u8 = 1 << 3;
    /// Bits 5:4: 0 the attribute's versions; 1 the other base version; 2 the wrong class version; 3 a raw
    /// class.
    pub const VERSION_SHIFT: u32 = 4;
    pub const VERSION_MASK: u8 = 0x3;
    /// The status word's direction bit (IB_SMP_DIRECTION, ib_smi.h:39): a response.
    pub const DIRECTION: u8 = 1 << 6;
}

/// KDETH knob bits: 2:0 TIDCtrl (1..=4 TIDCtrl 0..=3, other values the opcode's own), 3 OM, 4 SH, 5 Intr,
/// 7:6 KVer (0 KDETH_KVER; 1 KVer 0; 2 and 3 themselves).
pub mod kdeth_knob {
    pub const TIDCTRL_MASK: u8 = 0x7;
    pub const OM: u8 = 1 << 3;
    pub const SH: u8 = 1 << 4;
    pub const INTR: u8 = 1 << 5;
    pub const KVER_SHIFT: u32 = 6;
}

/// LRH, BTH and GRH bit positions (include/rdma/ib_hdrs.h:23-45, 163-235).
mod ib {
    /// LRH word 0: SC[3:0] (IB_SC_SHIFT 12) is byte 0's high nibble; SL (IB_SL_SHIFT 4) byte 1's.
    pub const LRH_SC_SHIFT: u32 = 4;
    pub const LRH_SL_SHIFT: u32 = 4;
    pub const SC_MASK: u8 = 0xF;
    /// SC[4] travels beside the 9B header (IB_SC5_MASK).
    pub const SC5_BIT: u8 = 0x10;
    pub const LNH_MASK: u8 = 0x3;
    /// LRH.PktLen: 11 bits of dwords.
    pub const PKT_LEN_MASK: u16 = 0x7FF;
    pub const BTH_OPCODE_SHIFT: u32 = 24;
    pub const BTH_SE_SHIFT: u32 = 23;
    pub const BTH_M_SHIFT: u32 = 22;
    pub const BTH_PAD_SHIFT: u32 = 20;
    pub const BTH_TVER_SHIFT: u32 = 16;
    pub const BTH_TVER_MASK: u32 = 0xF;
    pub const FECN_SHIFT: u32 = 31;
    pub const BECN_SHIFT: u32 = 30;
    pub const BTH_A_SHIFT: u32 = 31;
    /// hfi1 reads 31 PSN bits (PSN_MASK, hfi1/verbs.h:304); the 9B wire's own are 24.
    pub const HFI1_PSN_MASK: u32 = 0x7FFF_FFFF;
    pub const GRH_VERSION_SHIFT: u32 = 28;
    pub const GRH_TCLASS_SHIFT: u32 = 20;
    pub const GRH_FLOW_MASK: u32 = 0xF_FFFF;
    /// AETH: syndrome in bits 31:24 over the 24-bit MSN (IB_AETH_CREDIT_SHIFT, IB_MSN_MASK).
    pub const AETH_SYNDROME_SHIFT: u32 = 24;
    pub const MSN_MASK: u32 = 0x00FF_FFFF;
    /// A P_Key's membership bit: full (set) or limited.
    pub const PKEY_FULL_MEMBER: u16 = 0x8000;
    /// A controlled Q_Key (bit 31), which only privileged senders may use (IBTA 10.2.4).
    pub const QKEY_CONTROLLED: u32 = 0x8000_0000;
}

/// KDETH word 0 and 1 fields (drivers/infiniband/hw/hfi1/exp_rcv.h:37-56).
mod kdeth {
    pub const OFFSET_MASK: u32 = 0x7FFF;
    pub const OM_SHIFT: u32 = 15;
    pub const TID_SHIFT: u32 = 16;
    pub const TID_MASK: u32 = 0x3FF;
    /// RAW32 gives the TID in its low bits and the offset above them.
    pub const TID_BITS: u32 = 10;
    pub const TIDCTRL_SHIFT: u32 = 26;
    pub const INTR_SHIFT: u32 = 28;
    pub const SH_SHIFT: u32 = 29;
    pub const KVER_SHIFT: u32 = 30;
    /// The version every TID RDMA packet carries (tid_rdma.c:1746 KDETH_RESET(kdeth0, KVER, 0x1)).
    pub const KVER: u32 = 1;
    pub const JKEY_MASK: u32 = 0xFF;
    pub const HCRC_SHIFT: u32 = 16;
    /// The J_KEY of every kernel context (TID_RDMA_JKEY, tid_rdma.c:54).
    pub const TID_RDMA_JKEY: u32 = 32;
}

/// The packet classes the receive path parses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// RC opcodes to the keeper's RC QPs (hfi1_rc_rcv).
    Rc,
    /// UC opcodes to its UC QPs (hfi1_uc_rcv).
    Uc,
    /// UD SEND_ONLY (+imm) to its UD QPs, QP1 and QP0 (hfi1_ud_rcv).
    Ud,
    /// TID RDMA opcodes on a KDETH DestQP to a kernel receive context (hfi1_kdeth_{eager,expected}_rcv).
    TidRdma,
    /// CNP to any QP (hfi1_cnp_rcv).
    Cnp,
    /// Opcodes no handler takes (the drop path).
    NoHandler,
    /// OPA SMPs on VL15 to QP0 (process_subn_opa).
    OpaSmp,
    /// IB (base version 1) SMPs to QP0 (process_subn).
    IbSmp,
    /// GSI MADs to QP1: the PMA and a class nobody takes.
    Gsi,
    /// An LRH whose LNH is raw (0) or IP (1): neither 9B header hfi1 parses (hfi1_setup_9B_packet).
    BadLnh,
}

impl Class {
    pub const ALL: [Class; 10] = [
        Class::Rc,
        Class::Uc,
        Class::Ud,
        Class::TidRdma,
        Class::Cnp,
        Class::NoHandler,
        Class::OpaSmp,
        Class::IbSmp,
        Class::Gsi,
        Class::BadLnh,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Class::Rc => "RC",
            Class::Uc => "UC",
            Class::Ud => "UD",
            Class::TidRdma => "TID RDMA",
            Class::Cnp => "CNP",
            Class::NoHandler => "no handler",
            Class::OpaSmp => "OPA SMP",
            Class::IbSmp => "IB SMP",
            Class::Gsi => "GSI",
            Class::BadLnh => "bad LNH",
        }
    }

    /// How many templates the TEMPLATE knob chooses among.
    pub fn templates(self) -> usize {
        match self {
            Class::Rc => opcodes::RC.len(),
            Class::Uc => opcodes::UC.len(),
            Class::Ud => opcodes::UD.len(),
            Class::TidRdma => opcodes::TID_RDMA.len(),
            Class::Cnp => opcodes::CNP.len(),
            Class::NoHandler => opcodes::unhandled().len(),
            Class::OpaSmp => mad::OPA_SMA.len(),
            Class::IbSmp => mad::IB_SMA.len(),
            Class::Gsi => mad::GSI.len(),
            Class::BadLnh => BAD_LNH.len(),
        }
    }

    pub(super) fn opcodes(self) -> &'static [Opcode] {
        match self {
            Class::Rc => opcodes::RC,
            Class::Uc => opcodes::UC,
            Class::Ud => opcodes::UD,
            Class::TidRdma => opcodes::TID_RDMA,
            Class::Cnp => opcodes::CNP,
            _ => &[],
        }
    }

    fn attrs(self) -> &'static [Attr] {
        match self {
            Class::OpaSmp => mad::OPA_SMA,
            Class::IbSmp => mad::IB_SMA,
            Class::Gsi => mad::GSI,
            _ => &[],
        }
    }
}

/// The LNH values of [`Class::BadLnh`] (IB_LNH_RAW, IB_LNH_IP: include/rdma/ib_pack.h).
pub(super) const BAD_LNH: [u8; 2] = [0, 1];

/// Deliberate damage, chosen by the DAMAGE knob's top eighth (so a random byte damages one packet in eight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// The ICRC does not match: the chip sets RHF.IcrcErr and the driver drops (driver.c rcv_hdrerr).
    IcrcCorrupt,
    /// BTH.PadCnt is not the pad the packet has.
    BadPad,
    /// LRH.PktLen one dword short of the bytes.
    LrhLenShort,
    /// LRH.PktLen one dword past the bytes.
    LrhLenLong,
    /// LRH.LNH says GRH without one, or BTH with one.
    WrongLnh,
    /// The packet stops inside its extension headers.
    TruncatedExt,
    /// The sender's PBC asked for a bad end of packet.
    TestEbp,
    /// A GRH with the wrong version and next header (hfi1_setup_9B_packet drops it).
    BadGrh,
}

pub(super) const DAMAGES: [Damage; 8] = [
    Damage::IcrcCorrupt,
    Damage::BadPad,
    Damage::LrhLenShort,
    Damage::LrhLenLong,
    Damage::WrongLnh,
    Damage::TruncatedExt,
    Damage::TestEbp,
    Damage::BadGrh,
];
/// DAMAGE values from here on damage the packet; below, none.
pub const DAMAGE_FIRST: u8 = 0xE0;

impl Damage {
    /// The DAMAGE knob value that asks for `self`.
    pub fn knob(self) -> u8 {
        let i = DAMAGES.iter().position(|&d| d == self).unwrap_or(0) as u8;
        DAMAGE_FIRST | (i << 2)
    }
    fn from_knob(k: u8) -> Option<Damage> {
        (k >= DAMAGE_FIRST).then(|| DAMAGES[usize::from((k - DAMAGE_FIRST) >> 2)])
    }
}

/// One packet of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The wire's bytes, ICRC included.
    pub bytes: Vec<u8>,
    /// SC[4], which the 9B LRH cannot hold.
    pub sc4: bool,
    /// The PBC's TestEBP: the receiving chip drops the packet.
    pub test_ebp: bool,
    pub class: Class,
}

/// Splits an input into its records.
pub fn records(input: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i + RECORD_MARKER.len() <= input.len() && out.len() + 1 < MAX_PACKETS_PER_EXEC {
        if input[i..i + RECORD_MARKER.len()] == RECORD_MARKER {
            out.push(&input[start..i]);
            i += RECORD_MARKER.len();
            start = i;
        } else {
            i += 1;
        }
    }
    let rest = &input[start..];
    // The last record ends at the next marker if the batch is full.
    let end = rest.windows(RECORD_MARKER.len()).position(|w| w == RECORD_MARKER).unwrap_or(rest.len());
    out.push(&rest[..end]);
    out
}

/// The packets an input asks for: 1..=MAX_PACKETS_PER_EXEC, whatever the bytes.
pub fn decode(input: &[u8], target: &Target) -> Vec<Frame> {
    records(input).into_iter().map(|r| Knobs::new(r).build(target)).collect()
}

/// Joins records (knobs and payload) into one input, the inverse of [`records`].
pub fn encode(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(&RECORD_MARKER);
        }
        out.extend_from_slice(&r.knobs);
        out.extend_from_slice(&r.payload);
    }
    out
}

/// A record being written (seeds, tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub knobs: [u8; RECORD_HEADER_BYTES],
    pub payload: Vec<u8>,
}

impl Record {
    /// A record of `class`'s `template` with every other knob at its dictionary value.
    pub fn new(class: Class, template: usize) -> Record {
        let mut knobs = [0u8; RECORD_HEADER_BYTES];
        knobs[at::CLASS] = Class::ALL.iter().position(|&c| c == class).unwrap_or(0) as u8;
        knobs[at::TEMPLATE] = template as u8;
        Record { knobs, payload: Vec::new() }
    }
    pub fn knob(mut self, at: usize, value: u8) -> Record {
        self.knobs[at] = value;
        self
    }
    pub fn raw32(mut self, v: u32) -> Record {
        self.knobs[at::RAW32..at::RAW32 + 4].copy_from_slice(&v.to_le_bytes());
        self
    }
    pub fn raw64(mut self, v: u64) -> Record {
        self.knobs[at::RAW64..at::RAW64 + 8].copy_from_slice(&v.to_le_bytes());
        self
    }
    pub fn len(mut self, v: u16) -> Record {
        self.knobs[at::LEN..at::LEN + 2].copy_from_slice(&v.to_le_bytes());
        self
    }
    pub fn payload(mut self, bytes: Vec<u8>) -> Record {
        self.payload = bytes;
        self
    }
}

/// LEN values with the top three bits set pick a boundary length by their low 3 bits: the MTU, one past it,
/// one short of it, none, 1, 2 and 3 bytes (the pad cases), and the most that fits.
pub const LEN_BOUNDARY: u16 = 0xE000;
/// The boundary length of one MTU.
pub const LEN_MTU: u16 = LEN_BOUNDARY;
/// LEN values below [`LEN_BOUNDARY`] are a length in bytes, in its low bits.
const LEN_EXPLICIT_MASK: u16 = 0x3FFF;
const LEN_BOUNDARY_INDEX: u16 = 0x7;
/// The most pad a packet has (BTH.PadCnt, 2 bits of 0..=3 bytes).
const MAX_PAD: usize = 3;

/// A selector's high 3 bits choose the variant (half of the values the dictionary's), its low 5 bits the
/// dictionary entry.
pub(super) const VARIANT_SHIFT: u32 = 5;
const ENTRY_MASK: u8 = 0x1F;
/// How far a PSN must move to leave the receiver's window (half the 24-bit space: rc.c's delta_psn).
const PSN_HALF_SPACE: u32 = 1 << 23;
/// PSN variant 6's low bits: 0, the largest PSN, half the space ahead, half behind.
const PSN_BOUNDARY_MASK: u8 = 0x3;
/// The kernel receive contexts a KDETH DestQP names for most values of CTXT: the control context and the
/// krcvqs queues that follow it (init.c:55-61); other values reach user or missing contexts.
const KERNEL_CTXTS: u8 = 4;
/// CTXT variants from here on send an unhandled opcode to a KDETH DestQP (the upper half of the values).
pub(super) const KDETH_FOR_UNHANDLED: u8 = 4;
/// The GID prefix of a port without a subnet manager's (IB_DEFAULT_GID_PREFIX) and of multicast GIDs.
const LINK_LOCAL_GID_PREFIX: u64 = 0xFE80_0000_0000_0000;
const MULTICAST_GID_PREFIX: u64 = 0xFF12_401B_0000_0000;
/// GRH: the hop limit a sender outside the subnet sets.
const GRH_HOP_LIMIT: u8 = 0x40;
const IB_GRH_VERSION: u32 = 6;
const IB_GRH_NEXT_HDR: u8 = 0x1B;
/// QP0 and QP1 (the SMI and GSI).
const QP0: u32 = 0;
const QP1: u32 = 1;
/// The value a selector's variant asks for: the dictionary's (variants 0-3), one past it, one short of it,
/// 0 or `max`, or the raw value.
fn vary(sel: u8, dict: u64, raw: u64, max: u64) -> u64 {
    match sel >> VARIANT_SHIFT {
        0..=3 => dict & max,
        4 => dict.wrapping_add(1) & max,
        5 => dict.wrapping_sub(1) & max,
        6 if sel & 1 == 0 => 0,
        6 => max,
        _ => raw & max,
    }
}

fn entry(sel: u8, n: usize) -> usize {
    usize::from(sel & ENTRY_MASK) % n.max(1)
}

/// A record's knobs.
struct Knobs<'a> {
    k: [u8; RECORD_HEADER_BYTES],
    payload: &'a [u8],
}

/// The header fields of one packet before it is laid out.
struct Draft {
    class: Class,
    sc: u8,
    sl: u8,
    lnh: u8,
    dlid: u16,
    slid: u16,
    grh: Option<[u8; GRH_BYTES]>,
    opcode: u8,
    pkey: u16,
    dest_qp: u32,
    psn: u32,
    ext: Vec<u8>,
    payload: Vec<u8>,
}

impl<'a> Knobs<'a> {
    fn new(record: &'a [u8]) -> Self {
        let mut k = [0u8; RECORD_HEADER_BYTES];
        let n = record.len().min(RECORD_HEADER_BYTES);
        k[..n].copy_from_slice(&record[..n]);
        let payload = record.get(RECORD_HEADER_BYTES..).unwrap_or_default();
        Knobs { k, payload: &payload[..payload.len().min(MAX_PACKET_BYTES)] }
    }
    fn raw32(&self) -> u32 {
        u32::from_le_bytes(self.k[at::RAW32..at::RAW32 + 4].try_into().unwrap_or_default())
    }
    fn raw64(&self) -> u64 {
        u64::from_le_bytes(self.k[at::RAW64..at::RAW64 + 8].try_into().unwrap_or_default())
    }
    fn flag(&self, f: u8) -> bool {
        self.k[at::FLAGS] & f != 0
    }

    fn build(&self, t: &Target) -> Frame {
        let class = Class::ALL[usize::from(self.k[at::CLASS]) % Class::ALL.len()];
        let draft = match class {
            Class::Rc => self.transport(t, class, t.qps_of(QpType::Rc).collect()),
            Class::Uc => self.transport(t, class, t.qps_of(QpType::Uc).collect()),
            Class::Ud => self.ud(t),
            Class::TidRdma => self.tid_rdma(t),
            Class::Cnp | Class::NoHandler | Class::BadLnh => self.any_qp(t, class),
            Class::OpaSmp | Class::IbSmp | Class::Gsi => self.mad(t, class),
        };
        self.assemble(draft)
    }

    /// The payload: LEN's length (or the record's bytes, up to `natural`), the record's bytes then FILL.
    fn payload(&self, t: &Target, natural: usize, room: usize) -> Vec<u8> {
        let mtu = t.mtu as usize;
        let sel = u16::from_le_bytes([self.k[at::LEN], self.k[at::LEN + 1]]);
        let len = match sel {
            0 => self.payload.len().min(natural),
            s if s & LEN_BOUNDARY == LEN_BOUNDARY => {
                [mtu, mtu + 1, mtu.saturating_sub(1), 0, 1, 2, 3, room][usize::from(s & LEN_BOUNDARY_INDEX)]
            }
            s => usize::from(s & LEN_EXPLICIT_MASK),
        }
        .min(room);
        let mut p: Vec<u8> = self.payload[..len.min(self.payload.len())].to_vec();
        p.resize(len, self.k[at::FILL]);
        p
    }

    fn room(&self, headers: usize) -> usize {
        // Headers, the pad and the ICRC must fit.
        let most = MAX_PACKET_BYTES - ICRC_BYTES - MAX_PAD;
        most - headers.min(most)
    }

    fn grh_bytes(&self) -> usize {
        if self.flag(flag::GRH) || Damage::from_knob(self.k[at::DAMAGE]) == Some(Damage::BadGrh) {
            GRH_BYTES
        } else {
            0
        }
    }

    fn pkey(&self, t: &Target, natural: u16) -> u16 {
        let sel = self.k[at::PKEY];
        let dict = match sel & ENTRY_MASK {
            0 => natural,
            i => t.pkeys.get(usize::from(i - 1) % t.pkeys.len().max(1)).copied().unwrap_or(natural),
        };
        // Variant 4 flips the membership bit (full ↔ limited) rather than adding one.
        match sel >> VARIANT_SHIFT {
            4 => dict ^ ib::PKEY_FULL_MEMBER,
            _ => vary(sel, dict.into(), self.raw32().into(), u16::MAX.into()) as u16,
        }
    }

    fn psn(&self, dict: u32) -> u32 {
        let sel = self.k[at::PSN];
        match sel >> VARIANT_SHIFT {
            6 => match sel & PSN_BOUNDARY_MASK {
                0 => 0,
                1 => PSN_MASK,
                2 => dict.wrapping_add(PSN_HALF_SPACE) & PSN_MASK,
                _ => dict.wrapping_sub(PSN_HALF_SPACE) & PSN_MASK,
            },
            // Raw PSNs may use all the bits hfi1 reads.
            7 => self.raw32() & ib::HFI1_PSN_MASK,
            _ => vary(sel, dict.into(), 0, PSN_MASK.into()) as u32,
        }
    }

    fn qpn(&self, dict: Option<u32>) -> u32 {
        let raw = self.raw32() & QPN_MASK;
        vary(self.k[at::QP], dict.unwrap_or(raw).into(), raw.into(), QPN_MASK.into()) as u32
    }

    fn lids(&self, t: &Target, natural_dlid: u16, natural_slid: u16) -> (u16, u16) {
        let raw = self.raw32() as u16;
        let sel = self.k[at::LIDS];
        let dlid = match sel & 0xF {
            1 => LID_PERMISSIVE,
            2 => LID_MULTICAST_BASE | (raw & !LID_MULTICAST_BASE),
            3 => t.lid.wrapping_add(1),
            4 => 0,
            5 => raw,
            _ => natural_dlid,
        };
        let slid = match sel >> 4 {
            1 => LID_PERMISSIVE,
            2 => t.lid,
            3 => natural_slid.wrapping_add(1),
            4 => 0,
            5 => raw,
            _ => natural_slid,
        };
        (dlid, slid)
    }

    /// SC and SL: the class's SC (SL-to-SC is the identity until an SM sets it: verbs.c:1548), or the
    /// knob's.
    fn sc_sl(&self, t: &Target, natural_sc: u8) -> (u8, u8) {
        let sel = self.k[at::SC_SL];
        let sl = match sel >> 4 {
            0 => t.sl,
            s => s,
        };
        let sc = match sel & 0xF {
            0 => natural_sc,
            s => s,
        };
        (sc | if self.flag(flag::SC4) { ib::SC5_BIT } else { 0 }, sl)
    }

    fn draft(&self, t: &Target, class: Class, natural_sc: u8, natural_lids: (u16, u16)) -> Draft {
        let (sc, sl) = self.sc_sl(t, natural_sc);
        let (dlid, slid) = self.lids(t, natural_lids.0, natural_lids.1);
        Draft {
            class,
            sc,
            sl,
            lnh: if self.flag(flag::GRH) { LNH_GRH } else { LNH_BTH },
            dlid,
            slid,
            grh: None,
            opcode: 0,
            pkey: 0,
            dest_qp: 0,
            psn: 0,
            ext: Vec::new(),
            payload: Vec::new(),
        }
    }

    /// RC and UC: an opcode of the class to one of the keeper's QPs of that type.
    fn transport(&self, t: &Target, class: Class, qps: Vec<&Qp>) -> Draft {
        let table = class.opcodes();
        let op = &table[usize::from(self.k[at::TEMPLATE]) % table.len()];
        let qp = qps.get(entry(self.k[at::QP], qps.len())).copied();
        let mut d = self.draft(t, class, t.sl, (t.lid, t.peer_lid));
        d.opcode = op.opcode;
        d.pkey = self.pkey(t, t.pkeys.first().copied().unwrap_or(mad::FULL_MGMT_P_KEY));
        d.dest_qp = self.qpn(qp.map(|q| q.qpn));
        let dict_psn = qp.map_or(0, |q| if op.role == Role::Request { q.psn } else { q.peer_psn });
        d.psn = self.psn(dict_psn);
        d.ext = self.ext(t, op, qp, &d);
        let natural = if op.carries_payload() { t.mtu as usize } else { 0 };
        d.payload = self.payload(t, natural, self.room(LRH_BYTES + self.grh_bytes() + BTH_BYTES + d.ext.len()));
        d
    }

    /// UD: SEND_ONLY (+imm) to a UD QP of the keeper's, to QP1 or to QP0.
    fn ud(&self, t: &Target) -> Draft {
        let op = &opcodes::UD[usize::from(self.k[at::TEMPLATE]) % opcodes::UD.len()];
        // The keeper's UD QPs, then the GSI and the SMI.
        let uds: Vec<&Qp> = t.qps_of(QpType::Ud).collect();
        let i = entry(self.k[at::QP], uds.len() + 2);
        let (qpn, qkey, src, sc) = match uds.get(i) {
            Some(q) => (q.qpn, t.qkey, q.peer_qpn, t.sl),
            None if i == uds.len() => (QP1, mad::IB_QP1_QKEY, QP1, t.sl),
            None => (QP0, 0, QP0, SC_VL15),
        };
        let mut d = self.draft(t, Class::Ud, sc, (t.lid, t.peer_lid));
        d.opcode = op.opcode;
        d.pkey = self.pkey(t, t.pkeys.first().copied().unwrap_or(mad::FULL_MGMT_P_KEY));
        d.dest_qp = self.qpn(Some(qpn));
        d.psn = self.psn(0);
        d.ext = self.ud_ext(op, qkey, src);
        d.payload = self.payload(t, t.mtu as usize, self.room(LRH_BYTES + self.grh_bytes() + BTH_BYTES + d.ext.len()));
        d
    }

    fn qkey(&self, dict: u32) -> u32 {
        let sel = self.k[at::QKEY];
        match sel >> VARIANT_SHIFT {
            // A controlled Q_Key (bit 31), which only privileged senders may use.
            4 => dict | ib::QKEY_CONTROLLED,
            6 if sel & 1 == 1 => mad::IB_QP1_QKEY,
            _ => vary(sel, dict.into(), self.raw32().into(), u32::MAX.into()) as u32,
        }
    }

    fn ud_ext(&self, op: &Opcode, qkey: u32, src_qp: u32) -> Vec<u8> {
        let mut ext = vec![0u8; op.ext_bytes()];
        for &(f, o) in op.ext {
            let v: u64 = match f {
                Field::DethQkey => self.qkey(qkey).into(),
                Field::DethSrcQp => (src_qp & QPN_MASK).into(),
                Field::ImmDt => self.raw32().into(),
                _ => 0,
            };
            put(&mut ext, o, f.bytes(), v);
        }
        ext
    }

    /// CNP, unhandled opcodes and bad LNHs: to any of the keeper's QPs.
    fn any_qp(&self, t: &Target, class: Class) -> Draft {
        let qps: Vec<&Qp> = t.qps.iter().collect();
        let qp = qps.get(entry(self.k[at::QP], qps.len())).copied();
        let mut d = self.draft(t, class, t.sl, (t.lid, t.peer_lid));
        let tmpl = usize::from(self.k[at::TEMPLATE]);
        d.opcode = match class {
            Class::Cnp => opcodes::IB_OPCODE_CNP,
            Class::NoHandler => {
                let u = opcodes::unhandled();
                u[tmpl % u.len()]
            }
            // The raw and IP headers have no BTH: whatever follows the LRH is the record's.
            _ => {
                d.lnh = BAD_LNH[tmpl % BAD_LNH.len()];
                self.raw32() as u8
            }
        };
        d.pkey = self.pkey(t, t.pkeys.first().copied().unwrap_or(mad::FULL_MGMT_P_KEY));
        let ctxt = self.k[at::CTXT];
        d.dest_qp = if class == Class::NoHandler && ctxt >> VARIANT_SHIFT >= KDETH_FOR_UNHANDLED {
            // On a KDETH DestQP: the eager or expected KDETH path, whose tid_qp_ok refuses anything but TID
            // RDMA (verbs.c:317-325).
            t.kdeth_destqp((ctxt % KERNEL_CTXTS).into())
        } else {
            self.qpn(qp.map(|q| q.qpn))
        };
        d.psn = self.psn(qp.map_or(0, |q| q.psn));
        let natural = if class == Class::Cnp { 0 } else { t.mtu as usize };
        d.payload = self.payload(t, natural, self.room(LRH_BYTES + self.grh_bytes() + BTH_BYTES));
        d
    }

    /// TID RDMA: an opcode of the kernel's on a KDETH DestQP naming a kernel receive context, for one of the
    /// keeper's RC QPs (verbs_qp).
    fn tid_rdma(&self, t: &Target) -> Draft {
        let op = &opcodes::TID_RDMA[usize::from(self.k[at::TEMPLATE]) % opcodes::TID_RDMA.len()];
        let rcs: Vec<&Qp> = t.qps_of(QpType::Rc).collect();
        let qp = rcs.get(entry(self.k[at::QP], rcs.len())).copied();
        let mut d = self.draft(t, Class::TidRdma, t.sl, (t.lid, t.peer_lid));
        d.opcode = op.opcode;
        d.pkey = self.pkey(t, t.pkeys.first().copied().unwrap_or(mad::FULL_MGMT_P_KEY));
        let ctxt = self.k[at::CTXT];
        d.dest_qp = match ctxt >> VARIANT_SHIFT {
            0..=3 => t.kdeth_destqp((ctxt % KERNEL_CTXTS).into()),
            4 | 5 => t.kdeth_destqp(self.raw32()),
            // A TID opcode on a verbs QPN: qp_ok refuses it (verbs.c:274-283).
            6 => qp.map_or(0, |q| q.qpn),
            _ => self.raw32() & QPN_MASK,
        };
        let dict_psn = qp.map_or(0, |q| if op.role == Role::Request { q.psn } else { q.peer_psn });
        d.psn = self.psn(dict_psn);
        d.ext = self.ext(t, op, qp, &d);
        let natural = if op.carries_payload() { t.mtu as usize } else { 0 };
        d.payload = self.payload(t, natural, self.room(LRH_BYTES + self.grh_bytes() + BTH_BYTES + d.ext.len()));
        d
    }

    /// The extension headers of a transport opcode, each field from its knob.
    fn ext(&self, t: &Target, op: &Opcode, qp: Option<&Qp>, d: &Draft) -> Vec<u8> {
        let mut ext = vec![0u8; op.ext_bytes()];
        let raw32 = u64::from(self.raw32());
        let raw64 = self.raw64();
        for &(f, o) in op.ext {
            let v: u64 = match f {
                Field::RethVaddr | Field::AtomicVaddr => self.vaddr(t),
                Field::RethRkey | Field::AtomicRkey | Field::Ieth => {
                    vary(self.k[at::RKEY], t.mr.rkey.into(), raw32, u32::MAX.into())
                }
                Field::RethLen => self.dma_len(t),
                Field::Aeth => self.aeth().into(),
                Field::ImmDt => raw32,
                Field::AtomicSwap | Field::AtomicAckData => raw64,
                Field::AtomicCompare => raw64.rotate_left(32),
                Field::DethQkey => self.qkey(t.qkey).into(),
                Field::DethSrcQp => qp.map_or(0, |q| q.peer_qpn).into(),
                Field::Kdeth0 => self.kdeth0(op).into(),
                Field::Kdeth1 => self.kdeth1().into(),
                Field::TidFlowPsn => d.psn.into(),
                Field::TidFlowQp => d.dest_qp.into(),
                Field::VerbsQp => self.qpn(qp.map(|q| q.qpn)).into(),
                Field::VerbsPsn => qp.map_or(0, |q| if op.role == Role::Request { q.psn } else { q.peer_psn }).into(),
                Field::Reserved => 0,
            };
            if matches!(f, Field::Kdeth0 | Field::Kdeth1) {
                // KDETH is little-endian (exp_rcv.h:58-59, KDETH_GET's le32_to_cpu).
                ext[o..o + 4].copy_from_slice(&(v as u32).to_le_bytes());
            } else {
                put(&mut ext, o, f.bytes(), v);
            }
        }
        ext
    }

    /// An address in the MR (1/32 steps for the entry bits), its end, one before it, 0/max, or raw.
    fn vaddr(&self, t: &Target) -> u64 {
        let sel = self.k[at::VADDR];
        let step = t.mr.len / u64::from(ENTRY_MASK + 1);
        match sel >> VARIANT_SHIFT {
            4 => t.mr.addr.wrapping_add(t.mr.len),
            5 => t.mr.addr.wrapping_sub(1),
            _ => vary(sel, t.mr.addr.wrapping_add(u64::from(sel & ENTRY_MASK) * step), self.raw64(), u64::MAX),
        }
    }

    /// The DMA length: the payload's (entry 0) or whole MTUs (a multi-packet message), ±1, 0/max, raw.
    fn dma_len(&self, t: &Target) -> u64 {
        let sel = self.k[at::DMA_LEN];
        let payload = self.payload(t, t.mtu as usize, MAX_PACKET_BYTES).len() as u64;
        let dict = match sel & ENTRY_MASK {
            0 => payload,
            n => u64::from(t.mtu) * u64::from(n),
        };
        vary(sel, dict, self.raw32().into(), u32::MAX.into())
    }

    /// AETH: syndrome by the knob's low 3 bits (ACK with credits, ACK with invalid credits, RNR NAK with a
    /// timer, four kinds picking among the five NAK codes, raw), credits or timer from the high 5 bits, MSN
    /// from RAW32.
    fn aeth(&self) -> u32 {
        // AETH syndromes (include/rdma/ib_hdrs.h:13-21, 42-45): ACK with credits, RNR NAK with a timer, NAKs.
        const ACK: u8 = 0x00;
        const IB_AETH_CREDIT_INVAL: u8 = 0x1F;
        const IB_RNR_NAK: u8 = 0x20;
        const NAKS: [u8; 5] = [
            0x60, // IB_NAK_PSN_ERROR
            0x61, // IB_NAK_INVALID_REQUEST
            0x62, // IB_NAK_REMOTE_ACCESS_ERROR
            0x63, // IB_NAK_REMOTE_OPERATIONAL_ERROR
            0x64, // IB_NAK_INVALID_RD_REQUEST
        ];
        const KIND_MASK: u8 = 0x7;
        const PARAM_SHIFT: u32 = 3;
        const FIRST_NAK_KIND: usize = 3;
        let sel = self.k[at::AETH];
        let param = sel >> PARAM_SHIFT;
        let syndrome = match sel & KIND_MASK {
            0 => ACK | param,
            1 => ACK | IB_AETH_CREDIT_INVAL,
            2 => IB_RNR_NAK | param,
            k @ 3..=6 => NAKS[usize::from(k) - FIRST_NAK_KIND + usize::from(param & 1)],
            _ => (self.raw32() >> ib::AETH_SYNDROME_SHIFT) as u8,
        };
        (u32::from(syndrome) << ib::AETH_SYNDROME_SHIFT) | (self.raw32() & ib::MSN_MASK)
    }

    fn kdeth0(&self, op: &Opcode) -> u32 {
        let sel = self.k[at::KDETH];
        let tidctrl = match sel & kdeth_knob::TIDCTRL_MASK {
            n @ 1..=4 => u32::from(n - 1),
            _ => u32::from(op.expected),
        };
        let kver = match sel >> kdeth_knob::KVER_SHIFT {
            0 => kdeth::KVER,
            1 => 0,
            v => u32::from(v),
        };
        let raw = self.raw32();
        (kver << kdeth::KVER_SHIFT)
            | (u32::from(sel & kdeth_knob::SH != 0) << kdeth::SH_SHIFT)
            | (u32::from(sel & kdeth_knob::INTR != 0) << kdeth::INTR_SHIFT)
            | (tidctrl << kdeth::TIDCTRL_SHIFT)
            | ((raw & kdeth::TID_MASK) << kdeth::TID_SHIFT)
            | (u32::from(sel & kdeth_knob::OM != 0) << kdeth::OM_SHIFT)
            | ((raw >> kdeth::TID_BITS) & kdeth::OFFSET_MASK)
    }

    fn kdeth1(&self) -> u32 {
        let sel = self.k[at::JKEY];
        match sel >> VARIANT_SHIFT {
            0..=3 => kdeth::TID_RDMA_JKEY,
            4..=6 => u32::from(sel),
            // J_KEY and the HCRC raw.
            _ => (self.raw32() & kdeth::JKEY_MASK) | ((self.raw32() >> kdeth::HCRC_SHIFT) << kdeth::HCRC_SHIFT),
        }
    }

    /// A MAD of the class's table to QP0 (SMPs) or QP1 (GSI).
    fn mad(&self, t: &Target, class: Class) -> Draft {
        let table = class.attrs();
        let attr = &table[usize::from(self.k[at::TEMPLATE]) % table.len()];
        let m = self.k[at::METHOD];
        let smp = class != Class::Gsi;
        let directed = smp && m & method::DIRECTED != 0;
        let (natural_sc, natural_lids, qpn, qkey, natural_pkey) = if smp {
            let lids = if directed { (LID_PERMISSIVE, LID_PERMISSIVE) } else { (t.lid, t.sm_lid) };
            (SC_VL15, lids, QP0, 0, mad::FULL_MGMT_P_KEY)
        } else {
            let pkey = if t.pkeys.contains(&mad::FULL_MGMT_P_KEY) {
                mad::FULL_MGMT_P_KEY
            } else {
                t.pkeys.first().copied().unwrap_or(mad::LIM_MGMT_P_KEY)
            };
            (t.sl, (t.lid, t.sm_lid), QP1, mad::IB_QP1_QKEY, pkey)
        };
        let mut d = self.draft(t, class, natural_sc, natural_lids);
        let op = &opcodes::UD[0];
        d.opcode = op.opcode;
        d.pkey = self.pkey(t, natural_pkey);
        d.dest_qp = self.qpn(Some(qpn));
        d.psn = self.psn(0);
        d.ext = self.ud_ext(op, qkey, qpn);
        let (data_at, size) = mad::data_offset_and_size(attr, directed);
        let mut body = self.payload(t, size, self.room(LRH_BYTES + self.grh_bytes() + BTH_BYTES + d.ext.len()));
        // The MAD's own length unless LEN asks otherwise: the record's bytes are its data.
        let sel = u16::from_le_bytes([self.k[at::LEN], self.k[at::LEN + 1]]);
        if sel == 0 {
            body = vec![self.k[at::FILL]; size];
            let n = self.payload.len().min(size - data_at);
            body[data_at..data_at + n].copy_from_slice(&self.payload[..n]);
        }
        self.mad_header(t, attr, directed, &mut body);
        d.payload = body;
        d
    }

    fn mad_header(&self, t: &Target, attr: &Attr, directed: bool, b: &mut [u8]) {
        use mad::hdr;
        let m = self.k[at::METHOD];
        let raw = self.raw32();
        let (mut base, mut class_version, mut mgmt_class) = (attr.base_version, attr.class_version, attr.mgmt_class);
        if directed {
            mgmt_class = mad::IB_MGMT_CLASS_SUBN_DIRECTED_ROUTE;
        }
        match (m >> method::VERSION_SHIFT) & method::VERSION_MASK {
            1 if base == mad::OPA_MGMT_BASE_VERSION => base = mad::IB_MGMT_BASE_VERSION,
            1 => base = mad::OPA_MGMT_BASE_VERSION,
            2 if class_version == mad::OPA_SM_CLASS_VERSION => class_version = mad::IB_CLASS_VERSION,
            2 => class_version = mad::OPA_SM_CLASS_VERSION,
            3 => mgmt_class = raw as u8,
            _ => {}
        }
        let method = method::METHODS[usize::from(m & method::METHOD_MASK)];
        let am_sel = self.k[at::ATTR_MOD];
        let am = match am_sel >> VARIANT_SHIFT {
            0..=3 => attr.am.value(am_sel),
            4 => attr.am.with_count(attr.am.value(0), am_sel & ENTRY_MASK),
            5 => attr.am.with_count(attr.am.value(0), u8::MAX - (am_sel & ENTRY_MASK)),
            6 => 0,
            _ => raw,
        };
        let misc = self.k[at::MISC];
        let tid = if misc & misc::RAW_TID != 0 { self.raw64() } else { t.generation };
        let fields: [(usize, usize, u64); 9] = [
            (hdr::BASE_VERSION, 1, base.into()),
            (hdr::MGMT_CLASS, 1, mgmt_class.into()),
            (hdr::CLASS_VERSION, 1, class_version.into()),
            (hdr::METHOD, 1, method.into()),
            (hdr::STATUS, 2, if m & method::DIRECTION != 0 { mad::IB_SMP_DIRECTION.into() } else { 0 }),
            (hdr::TID, 8, tid),
            (hdr::ATTR_ID, 2, attr.id.into()),
            (hdr::ATTR_MOD, 4, am.into()),
            (hdr::MKEY, 8, if misc & misc::RAW_MKEY != 0 { self.raw64() } else { 0 }),
        ];
        let smp = matches!(attr.mgmt_class, mad::IB_MGMT_CLASS_SUBN_LID_ROUTED);
        for (o, n, v) in fields {
            // GSI MADs have no M_Key: their data starts there.
            if o == hdr::MKEY && !smp {
                continue;
            }
            put(b, o, n, v);
        }
        if smp && directed {
            let layout = if attr.base_version == mad::OPA_MGMT_BASE_VERSION { mad::OPA_SMP_DR } else { mad::IB_SMP };
            // A request at the end of its directed path: hop pointer = hop count (IBTA C14-9), one hop out
            // of the SM's port, permissive DR LIDs.
            let hop = self.k[at::HOP];
            const NIBBLE: u32 = 4;
            let (ptr, cnt) = if hop == 0 { (1, 1) } else { (hop & 0xF, hop >> NIBBLE) };
            put(b, hdr::HOP_PTR, 1, ptr.into());
            put(b, hdr::HOP_CNT, 1, cnt.into());
            put(b, layout.dr_slid, layout.dr_lid_bytes, u64::MAX);
            put(b, layout.dr_dlid, layout.dr_lid_bytes, u64::MAX);
            put(b, layout.initial_path + 1, 1, t.port.into());
        }
    }

    /// Lays the draft out, applies the damage and seals it.
    fn assemble(&self, mut d: Draft) -> Frame {
        let damage = Damage::from_knob(self.k[at::DAMAGE]);
        let raw64 = self.raw64();
        if self.flag(flag::GRH) || damage == Some(Damage::BadGrh) {
            d.lnh = if d.lnh == LNH_BTH || d.lnh == LNH_GRH { LNH_GRH } else { d.lnh };
            d.grh = Some(self.grh(&d, damage == Some(Damage::BadGrh), raw64));
        }
        let pad = (4 - d.payload.len() % 4) % 4;
        let mut b = Vec::with_capacity(LRH_BYTES + GRH_BYTES + BTH_BYTES + d.ext.len() + d.payload.len() + 8);
        b.extend_from_slice(&[0u8; LRH_BYTES]);
        if let Some(g) = &d.grh {
            b.extend_from_slice(g);
        }
        let bth_at = b.len();
        let f = self.k[at::FLAGS];
        let pad_cnt = if damage == Some(Damage::BadPad) { (pad + 1 + (raw64 as usize % 3)) % 4 } else { pad };
        // A non-zero TVer from RAW64's top nibble.
        let tver = if f & flag::TVER != 0 { ((raw64 >> 60) as u32 & ib::BTH_TVER_MASK) | 1 } else { 0 };
        let bth0 = (u32::from(d.opcode) << ib::BTH_OPCODE_SHIFT)
            | (u32::from(f & flag::SOLICITED != 0) << ib::BTH_SE_SHIFT)
            | (u32::from(f & flag::MIG_REQ != 0) << ib::BTH_M_SHIFT)
            | ((pad_cnt as u32) << ib::BTH_PAD_SHIFT)
            | (tver << ib::BTH_TVER_SHIFT)
            | u32::from(d.pkey);
        let bth1 = (u32::from(f & flag::FECN != 0) << ib::FECN_SHIFT)
            | (u32::from(f & flag::BECN != 0) << ib::BECN_SHIFT)
            | (d.dest_qp & QPN_MASK);
        let bth2 = (u32::from(f & flag::ACK_REQ != 0) << ib::BTH_A_SHIFT) | (d.psn & ib::HFI1_PSN_MASK);
        for w in [bth0, bth1, bth2] {
            b.extend_from_slice(&w.to_be_bytes());
        }
        b.extend_from_slice(&d.ext);
        b.extend_from_slice(&d.payload);
        b.resize(b.len() + pad, 0);
        if damage == Some(Damage::TruncatedExt) {
            // Stop halfway into the extension headers (whole dwords), or right after the BTH.
            let keep = bth_at + BTH_BYTES + (d.ext.len() / 2) / 4 * 4;
            b.truncate(keep);
        }
        if let (Some(_), Some(Damage::WrongLnh)) = (&d.grh, damage) {
            d.lnh = LNH_BTH;
        } else if damage == Some(Damage::WrongLnh) {
            d.lnh = LNH_GRH;
        }
        let dwords = ((b.len() + ICRC_BYTES) / 4) as u16;
        let pkt_len = match damage {
            Some(Damage::LrhLenShort) => dwords.wrapping_sub(1),
            Some(Damage::LrhLenLong) => dwords.wrapping_add(1),
            _ => dwords,
        } & ib::PKT_LEN_MASK;
        b[0] = (d.sc & ib::SC_MASK) << ib::LRH_SC_SHIFT;
        b[1] = (d.sl << ib::LRH_SL_SHIFT) | (d.lnh & ib::LNH_MASK);
        b[2..4].copy_from_slice(&d.dlid.to_be_bytes());
        b[4..6].copy_from_slice(&pkt_len.to_be_bytes());
        b[6..8].copy_from_slice(&d.slid.to_be_bytes());
        if d.grh.is_some() {
            // GRH.PayLen (struct ib_grh's second field): the bytes after the GRH through the ICRC.
            const PAYLEN: usize = LRH_BYTES + 4;
            let paylen = (b.len() + ICRC_BYTES).saturating_sub(LRH_BYTES + GRH_BYTES) as u16;
            if let Some(dst) = b.get_mut(PAYLEN..PAYLEN + 2) {
                dst.copy_from_slice(&paylen.to_be_bytes());
            }
        }
        let sc4 = d.sc & ib::SC5_BIT != 0;
        let test_ebp = damage == Some(Damage::TestEbp);
        let mut bytes = seal(b, sc4, test_ebp);
        if damage == Some(Damage::IcrcCorrupt) {
            let n = bytes.len();
            bytes[n - ICRC_BYTES] ^= (raw64 as u8) | 1;
        }
        Frame { bytes, sc4, test_ebp, class: d.class }
    }

    fn grh(&self, d: &Draft, bad: bool, raw64: u64) -> [u8; GRH_BYTES] {
        let mut g = [0u8; GRH_BYTES];
        let tclass = u32::from(self.k[at::MISC] >> misc::TCLASS_SHIFT);
        // A bad GRH has the wrong version or the wrong next header (RAW64 bit 0 says which: the driver
        // checks them one after the other).
        let (version, next) = match (bad, raw64 & 1) {
            (false, _) => (IB_GRH_VERSION, IB_GRH_NEXT_HDR),
            (true, 0) => (IB_GRH_VERSION - 2, IB_GRH_NEXT_HDR),
            (true, _) => (IB_GRH_VERSION, IB_GRH_NEXT_HDR ^ 1),
        };
        let vtf = (version << ib::GRH_VERSION_SHIFT)
            | (tclass << ib::GRH_TCLASS_SHIFT)
            | ((raw64 as u32) & ib::GRH_FLOW_MASK);
        // struct ib_grh (include/rdma/ib_verbs.h:788-795); PayLen is set once the length is known.
        const VTF: usize = 0;
        const NEXT_HDR: usize = 6;
        const HOP_LIMIT: usize = 7;
        const SGID: usize = 8;
        const DGID: usize = 24;
        const GID_HALF: usize = 8;
        g[VTF..VTF + 4].copy_from_slice(&vtf.to_be_bytes());
        g[NEXT_HDR] = next;
        g[HOP_LIMIT] = GRH_HOP_LIMIT;
        g[SGID..SGID + GID_HALF].copy_from_slice(&LINK_LOCAL_GID_PREFIX.to_be_bytes());
        g[SGID + GID_HALF..DGID].copy_from_slice(&raw64.to_be_bytes());
        let mcast = d.dlid >= LID_MULTICAST_BASE && d.dlid != LID_PERMISSIVE;
        let prefix = if mcast { MULTICAST_GID_PREFIX } else { LINK_LOCAL_GID_PREFIX };
        g[DGID..DGID + GID_HALF].copy_from_slice(&prefix.to_be_bytes());
        g[DGID + GID_HALF..].copy_from_slice(&raw64.swap_bytes().to_be_bytes());
        g
    }
}

/// Writes `v`'s low `n` bytes big-endian at `o`.
fn put(b: &mut [u8], o: usize, n: usize, v: u64) {
    if let Some(dst) = b.get_mut(o..o + n) {
        dst.copy_from_slice(&v.to_be_bytes()[8 - n..]);
    }
}

/// Appends the ICRC: through WirePacket::seal for the 9B headers it carries, through the same CRC for the
/// raw and IP LNHs it refuses.
fn seal(body: Vec<u8>, sc4: bool, test_ebp: bool) -> Vec<u8> {
    let lnh = body.get(1).map_or(0, |b| b & ib::LNH_MASK);
    let sealable =
        lnh == LNH_BTH || (lnh == LNH_GRH && body.len() + ICRC_BYTES >= LRH_BYTES + GRH_BYTES + BTH_BYTES + ICRC_BYTES);
    if sealable {
        if let Ok(p) = WirePacket::seal(body.clone(), sc4, test_ebp) {
            return p.bytes;
        }
    }
    let mut body = body;
    let icrc = wire::icrc(&body);
    body.extend_from_slice(&icrc.to_le_bytes());
    body
}

impl Frame {
    /// The frame as the device model reads it.
    pub fn wire(&self) -> WirePacket {
        WirePacket { bytes: self.bytes.clone(), sc4: self.sc4, test_ebp: self.test_ebp }
    }

    pub(super) fn is_mad(&self) -> bool {
        matches!(self.class, Class::OpaSmp | Class::IbSmp | Class::Gsi)
    }

    /// A short line for reproducers: class, opcode or MAD attribute, QPN, PSN, payload length, and what is
    /// visibly wrong with it.
    pub fn describe(&self) -> String {
        let p = self.wire();
        let mut s = String::from(self.class.name());
        let lnh = p.lnh();
        if lnh != LNH_BTH && lnh != LNH_GRH {
            s += &format!(" LNH {lnh} dlid {:#x} slid {:#x} len {}", p.dlid(), p.slid(), p.bytes.len());
        } else {
            let op = p.opcode();
            let known = opcodes::lookup(op);
            let name = known.map_or_else(|| format!("opcode {op:#04x}"), |o| o.name.to_string());
            s += &format!(" {name} qpn {:#x} psn {}", p.dest_qp(), p.psn() & PSN_MASK);
            match (known, p.header_bytes()) {
                (None, _) => s += &format!(" len {}", p.bytes.len()),
                (Some(_), None) => s += " (extension headers cut short)",
                (Some(_), Some(h)) => {
                    let payload = p.bytes.len().saturating_sub(h + usize::from(p.pad()) + ICRC_BYTES);
                    if let (true, Some(m)) = (self.is_mad(), p.bytes.get(h..h + mad::IB_MGMT_MAD_HDR)) {
                        let id = u16::from_be_bytes([m[mad::hdr::ATTR_ID], m[mad::hdr::ATTR_ID + 1]]);
                        let a = mad::hdr::ATTR_MOD;
                        let am = u32::from_be_bytes([m[a], m[a + 1], m[a + 2], m[a + 3]]);
                        let attr =
                            mad::name_of(m[0], m[1], id).map_or_else(|| format!("attr {id:#06x}"), str::to_string);
                        s += &format!(" class {:#04x} method {:#04x} {attr} am {am:#x}", m[1], m[3]);
                    }
                    s += &format!(" len {payload}");
                }
            }
            if lnh == LNH_GRH {
                s += " GRH";
            }
            s += &format!(" sc {} dlid {:#x} slid {:#x} pkey {:#06x}", p.sc(), p.dlid(), p.slid(), p.pkey());
        }
        if usize::from(p.lrh_pkt_len()) * 4 != p.bytes.len() {
            s += &format!(", LRH PktLen {} dwords for {}", p.lrh_pkt_len(), p.bytes.len() / 4);
        }
        if !p.icrc_ok() {
            s += ", ICRC corrupt";
        }
        if self.test_ebp {
            s += ", TestEBP";
        }
        s
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The control-socket request that sends a batch into `device`'s port and waits up to `wait_ms` for the
/// driver to have consumed it.
pub fn batch_request(device: &str, frames: &[Frame], wait_ms: u64) -> String {
    use serde_json::{json, Value};
    let packets: Vec<Value> = frames
        .iter()
        .map(|f| {
            if f.sc4 || f.test_ebp {
                json!({"packet_hex": hex(&f.bytes), "sc4": u8::from(f.sc4), "test_ebp": u8::from(f.test_ebp)})
            } else {
                Value::String(hex(&f.bytes))
            }
        })
        .collect();
    json!({"device": device, "cmd": "wire-batch", "packets": packets, "wait_ms": wait_ms}).to_string()
}
