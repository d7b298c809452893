//! What crosses the cable: an Omni-Path 9B packet (LRH, optional GRH, BTH, extended headers, payload, pad)
//! with its 4-byte ICRC, plus the sideband the PBC carried that the wire keeps (SC[4], the TestEBP marker).
//! Field positions are the IBTA's, which the 9B format keeps (include/rdma/ib_hdrs.h, hfi1's verbs.c).

#![forbid(unsafe_code)]

/// Bytes of the local route header.
pub const LRH_BYTES: usize = 8;
/// Bytes of the global route header (LRH.LNH = GRH).
pub const GRH_BYTES: usize = 40;
/// Bytes of the base transport header.
pub const BTH_BYTES: usize = 12;
/// Bytes of the invariant CRC that ends every packet on the wire.
pub const ICRC_BYTES: usize = 4;
/// The smallest packet the cable carries: LRH, BTH and ICRC.
pub const MIN_PACKET_BYTES: usize = LRH_BYTES + BTH_BYTES + ICRC_BYTES;
/// The largest: a 10 KiB MTU payload behind the longest header, with its pad and ICRC (OPA MTU 10240,
/// hfi1's max_mtu).
pub const MAX_PACKET_BYTES: usize = 10240 + 128;

/// LRH.LNH values (HFI1_LRH_BTH, HFI1_LRH_GRH).
pub const LNH_BTH: u8 = 0x2;
pub const LNH_GRH: u8 = 0x3;
/// The permissive LID (IB_LID_PERMISSIVE) and the first multicast LID (IB_MULTICAST_LID_BASE) of 9B.
pub const LID_PERMISSIVE: u16 = 0xFFFF;
pub const LID_MULTICAST_BASE: u16 = 0xC000;
/// SC 15: the management VL, whose packets go to RCV_VL15's context.
pub const SC_VL15: u8 = 15;

// Extended transport header lengths (IBTA 9.3): RETH, AETH, DETH, ImmDt, AtomicETH, AtomicAckETH, IETH; and
// the 36 bytes behind the BTH of every TID RDMA opcode (KDETH plus the TID RDMA header, tid_rdma_defs.h).
const RETH: u8 = 16;
const AETH: u8 = 4;
const DETH: u8 = 8;
const IMMDT: u8 = 4;
const ATOMIC_ETH: u8 = 28;
const ATOMIC_ACK_ETH: u8 = 8;
const IETH: u8 = 4;
const TID_RDMA_HDR: u8 = 36;

/// Opcode ranges by transport (IB_OPCODE_RC/UC/UD, IB_OPCODE_TID_RDMA) and the congestion notice hfi1 sends
/// (IB_OPCODE_CNP).
const RC: u8 = 0x00;
const UC: u8 = 0x20;
const UD: u8 = 0x60;
pub const OPCODE_TID_RDMA: u8 = 0xE0;
/// The TID RDMA opcodes that carry data through TIDs (include/rdma/tid_rdma_defs.h:76-95).
pub const OPCODE_TID_RDMA_WRITE_DATA: u8 = OPCODE_TID_RDMA + 0x2;
pub const OPCODE_TID_RDMA_WRITE_DATA_LAST: u8 = OPCODE_TID_RDMA + 0x3;
pub const OPCODE_TID_RDMA_READ_RESP: u8 = OPCODE_TID_RDMA + 0x5;
const TID_RDMA_OPCODES: u8 = 8;
/// The KDETH opcodes a user process may send (user_sdma.c, pio.c: opcode & 0xC0 == 0xC0) below the kernel's
/// TID RDMA ones, where PSM2 sends (docs/decisions.md).
pub const USER_KDETH_OPCODES: std::ops::RangeInclusive<u8> = 0xC0..=0xDF;
pub const OPCODE_CNP: u8 = 0x80;

/// Bytes of extended headers behind the BTH for `opcode`, `None` for an opcode the chip does not know.
pub fn ext_header_bytes(opcode: u8) -> Option<u8> {
    // Within RC and UC: SEND_FIRST..SEND_ONLY_IMM, RDMA_WRITE_*, then RC-only reads, ACKs and atomics.
    const RC_UC: [Option<u8>; 0x18] = [
        Some(0),                     // SEND_FIRST
        Some(0),                     // SEND_MIDDLE
        Some(0),                     // SEND_LAST
        Some(IMMDT),                 // SEND_LAST_WITH_IMMEDIATE
        Some(0),                     // SEND_ONLY
        Some(IMMDT),                 // SEND_ONLY_WITH_IMMEDIATE
        Some(RETH),                  // RDMA_WRITE_FIRST
        Some(0),                     // RDMA_WRITE_MIDDLE
        Some(0),                     // RDMA_WRITE_LAST
        Some(IMMDT),                 // RDMA_WRITE_LAST_WITH_IMMEDIATE
        Some(RETH),                  // RDMA_WRITE_ONLY
        Some(RETH + IMMDT),          // RDMA_WRITE_ONLY_WITH_IMMEDIATE
        Some(RETH),                  // RDMA_READ_REQUEST
        Some(AETH),                  // RDMA_READ_RESPONSE_FIRST
        Some(0),                     // RDMA_READ_RESPONSE_MIDDLE
        Some(AETH),                  // RDMA_READ_RESPONSE_LAST
        Some(AETH),                  // RDMA_READ_RESPONSE_ONLY
        Some(AETH),                  // ACKNOWLEDGE
        Some(AETH + ATOMIC_ACK_ETH), // ATOMIC_ACKNOWLEDGE
        Some(ATOMIC_ETH),            // COMPARE_SWAP
        Some(ATOMIC_ETH),            // FETCH_ADD
        None,                        // (RD RESYNC)
        Some(IETH),                  // SEND_LAST_WITH_INVALIDATE
        Some(IETH),                  // SEND_ONLY_WITH_INVALIDATE
    ];
    /// UC has SEND_* and RDMA_WRITE_* only (up to RDMA_WRITE_ONLY_WITH_IMMEDIATE).
    const UC_LAST: u8 = 0x0B;
    /// UD has SEND_ONLY and SEND_ONLY_WITH_IMMEDIATE.
    const UD_SEND_ONLY: u8 = 0x04;
    match opcode {
        o if o < RC + RC_UC.len() as u8 => RC_UC[usize::from(o - RC)],
        o if (UC..=UC + UC_LAST).contains(&o) => RC_UC[usize::from(o - UC)],
        o if o == UD + UD_SEND_ONLY => Some(DETH),
        o if o == UD + UD_SEND_ONLY + 1 => Some(DETH + IMMDT),
        o if (OPCODE_TID_RDMA..OPCODE_TID_RDMA + TID_RDMA_OPCODES).contains(&o) => Some(TID_RDMA_HDR),
        OPCODE_CNP => Some(0),
        _ => None,
    }
}

/// One packet on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WirePacket {
    /// LRH through the ICRC.
    pub bytes: Vec<u8>,
    /// SC[4], which the 9B LRH cannot hold: the PBC's DcInfo, the receiver's RHF DcInfo.
    pub sc4: bool,
    /// The PBC asked for a bad end-of-packet (TestEBP): the receiver drops the packet.
    pub test_ebp: bool,
}

/// Why bytes are not a 9B packet the cable can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("{0} bytes: a 9B packet has {MIN_PACKET_BYTES}..={MAX_PACKET_BYTES} bytes in whole dwords")]
    Length(usize),
    #[error("LRH.LNH {0:#x}: neither BTH nor GRH follows the LRH")]
    Lnh(u8),
}

impl WirePacket {
    /// A packet from the sender's header and payload (PBC removed, pad included, no ICRC): the ICRC is
    /// appended.
    pub fn seal(mut body: Vec<u8>, sc4: bool, test_ebp: bool) -> Result<Self, WireError> {
        let len = body.len() + ICRC_BYTES;
        if !(MIN_PACKET_BYTES..=MAX_PACKET_BYTES).contains(&len) || !len.is_multiple_of(4) {
            return Err(WireError::Length(len));
        }
        let icrc = icrc(&body);
        body.extend_from_slice(&icrc.to_le_bytes());
        let pkt = WirePacket { bytes: body, sc4, test_ebp };
        pkt.bth_offset()?;
        Ok(pkt)
    }

    fn be16(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.bytes[at], self.bytes[at + 1]])
    }

    /// LRH.VL: SC[3:0] on the 9B wire.
    pub fn vl(&self) -> u8 {
        self.bytes[0] >> 4
    }
    /// The packet's service channel: LRH SC[3:0] with the sideband SC[4].
    pub fn sc(&self) -> u8 {
        self.vl() | (u8::from(self.sc4) << 4)
    }
    pub fn sl(&self) -> u8 {
        self.bytes[1] >> 4
    }
    pub fn lnh(&self) -> u8 {
        self.bytes[1] & 0x3
    }
    pub fn dlid(&self) -> u16 {
        self.be16(2)
    }
    /// LRH.PktLen: dwords from the LRH through the ICRC.
    pub fn lrh_pkt_len(&self) -> u16 {
        self.be16(4) & 0x7FF
    }
    pub fn slid(&self) -> u16 {
        self.be16(6)
    }

    /// Where the BTH starts.
    pub fn bth_offset(&self) -> Result<usize, WireError> {
        match self.lnh() {
            LNH_BTH => Ok(LRH_BYTES),
            LNH_GRH if self.bytes.len() >= LRH_BYTES + GRH_BYTES + BTH_BYTES + ICRC_BYTES => Ok(LRH_BYTES + GRH_BYTES),
            l => Err(WireError::Lnh(l)),
        }
    }

    fn bth(&self) -> &[u8] {
        let at = self.bth_offset().unwrap_or(LRH_BYTES);
        &self.bytes[at..at + BTH_BYTES]
    }
    pub fn opcode(&self) -> u8 {
        self.bth()[0]
    }
    /// BTH.PadCnt: bytes of pad before the ICRC.
    pub fn pad(&self) -> u8 {
        (self.bth()[1] >> 4) & 0x3
    }
    pub fn pkey(&self) -> u16 {
        u16::from_be_bytes([self.bth()[2], self.bth()[3]])
    }
    /// BTH.DestQP (24 bits).
    pub fn dest_qp(&self) -> u32 {
        let b = self.bth();
        u32::from_be_bytes([0, b[5], b[6], b[7]])
    }
    /// BTH PSN word (bits 30:0: the 31-bit PSN of KDETH flows, whose low 24 bits are the IB PSN).
    pub fn psn(&self) -> u32 {
        let b = self.bth();
        u32::from_be_bytes([b[8], b[9], b[10], b[11]]) & 0x7FFF_FFFF
    }

    /// Bytes of headers (LRH through the extended headers) the receiver splits off, `None` for an opcode the
    /// chip does not know.
    pub fn header_bytes(&self) -> Option<usize> {
        let bth = self.bth_offset().ok()?;
        let len = bth + BTH_BYTES + usize::from(ext_header_bytes(self.opcode())?);
        (len + ICRC_BYTES <= self.bytes.len()).then_some(len)
    }

    /// Whether the ICRC still matches the packet (a corrupted packet's does not).
    pub fn icrc_ok(&self) -> bool {
        let (body, tail) = self.bytes.split_at(self.bytes.len() - ICRC_BYTES);
        tail == icrc(body).to_le_bytes()
    }
}

/// The invariant CRC: CRC-32 over the packet with the fields a switch may change set to ones (LRH.VL; in the
/// GRH the traffic class, flow label and hop limit; the BTH's FECN/BECN byte), as the IBTA's ICRC masks them.
pub fn icrc(body: &[u8]) -> u32 {
    // Only the headers are masked: they are copied, the payload is hashed where it lies.
    let mut head = [0u8; LRH_BYTES + GRH_BYTES + BTH_BYTES];
    let n = head.len().min(body.len());
    head[..n].copy_from_slice(&body[..n]);
    let masked = &mut head[..n];
    if let Some(b) = masked.first_mut() {
        *b |= 0xF0;
    }
    let bth = match masked.get(1).map(|b| b & 0x3) {
        Some(LNH_GRH) if masked.len() >= LRH_BYTES + GRH_BYTES => {
            let g = LRH_BYTES;
            // Version (4) | TClass (8) | FlowLabel (20): everything but the version.
            masked[g] |= 0x0F;
            masked[g + 1..g + 4].fill(0xFF);
            // Hop limit.
            masked[g + 7] = 0xFF;
            LRH_BYTES + GRH_BYTES
        }
        _ => LRH_BYTES,
    };
    if let Some(b) = masked.get_mut(bth + 4) {
        *b = 0xFF;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(masked);
    h.update(&body[n..]);
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A UD SMP as hfi1_make_ud_req builds it for QP0 (ud.c): SC = VL = 15, DLID/SLID permissive, 256 bytes of
    /// MAD, pad 0.
    fn smp() -> Vec<u8> {
        let mut b = vec![0u8; LRH_BYTES + BTH_BYTES + 8 + 256];
        let dwords = ((b.len() + ICRC_BYTES) / 4) as u16;
        b[0] = 0xF0; // VL 15, LVer 0
        b[1] = LNH_BTH; // SL 0
        b[2..4].copy_from_slice(&LID_PERMISSIVE.to_be_bytes());
        b[4..6].copy_from_slice(&dwords.to_be_bytes());
        b[6..8].copy_from_slice(&LID_PERMISSIVE.to_be_bytes());
        b[8] = 0x64; // UD SEND_ONLY
        b[10..12].copy_from_slice(&0xFFFFu16.to_be_bytes());
        b
    }

    #[test]
    fn header_lengths_are_the_ibta_ones_the_kernel_restates() {
        // (opcode, LRH + BTH + extended headers): hdr_len_by_opcode's values (verbs.c).
        let table = [
            (0x00, 20),
            (0x03, 24),
            (0x06, 36),
            (0x0B, 40),
            (0x0C, 36),
            (0x0D, 24),
            (0x0E, 20),
            (0x11, 24),
            (0x12, 32),
            (0x13, 48),
            (0x14, 48),
            (0x17, 24),
            (0x24, 20),
            (0x2A, 36),
            (0x2B, 40),
            (0x64, 28),
            (0x65, 32),
            (0xE0, 56),
            (0xE7, 56),
        ];
        for (op, len) in table {
            assert_eq!(ext_header_bytes(op).map(|e| usize::from(e) + LRH_BYTES + BTH_BYTES), Some(len), "{op:#x}");
        }
        for op in [0x15, 0x2C, 0x2F, 0x40, 0x63, 0x66, 0xC0, 0xE8, 0xFF] {
            assert_eq!(ext_header_bytes(op), None, "{op:#x}");
        }
    }

    #[test]
    fn a_sealed_smp_reads_back_its_fields_and_checks() {
        let p = WirePacket::seal(smp(), false, false).unwrap();
        assert_eq!(p.bytes.len(), 8 + 12 + 8 + 256 + 4);
        assert_eq!((p.vl(), p.sc(), p.dlid(), p.slid(), p.opcode()), (15, 15, 0xFFFF, 0xFFFF, 0x64));
        assert_eq!(usize::from(p.lrh_pkt_len()) * 4, p.bytes.len());
        assert_eq!(p.header_bytes(), Some(28));
        assert!(p.icrc_ok());
    }

    #[test]
    fn the_icrc_ignores_what_a_switch_may_change_and_catches_the_rest() {
        let p = WirePacket::seal(smp(), false, false).unwrap();
        let mut vl = p.clone();
        vl.bytes[0] = 0x00; // VL rewritten on the way
        vl.bytes[LRH_BYTES + 4] = 0xC0; // FECN and BECN marked
        assert!(vl.icrc_ok());
        let mut bad = p.clone();
        bad.bytes[100] ^= 1;
        assert!(!bad.icrc_ok());
    }

    /// Golden ICRCs: CRC-32 (Python's zlib.crc32) over each packet with the IBTA's variant fields set to ones
    /// (LRH.VL; GRH traffic class, flow label and hop limit; BTH byte 4), computed outside this crate.
    #[test]
    fn the_icrc_is_the_crc32_of_the_packet_with_the_variant_fields_masked() {
        let mut bth_only = smp();
        (28..bth_only.len()).for_each(|i| bth_only[i] = (i * 7 + 3) as u8);
        let mut grh = vec![0u8; LRH_BYTES + GRH_BYTES + BTH_BYTES + 64];
        grh[0] = 0x10;
        grh[1] = LNH_GRH;
        let dwords = ((grh.len() + ICRC_BYTES) / 4) as u16;
        grh[4..6].copy_from_slice(&dwords.to_be_bytes());
        grh[8..12].copy_from_slice(&[0x6A, 0xBC, 0xDE, 0xF1]); // version 6, traffic class, flow label
        grh[15] = 0x40; // hop limit
        (16..48).for_each(|i| grh[i] = i as u8);
        grh[48] = 0x04;
        grh[52] = 0x3F;
        (60..grh.len()).for_each(|i| grh[i] = (i * 13 + 1) as u8);
        for (name, body, golden) in [("LRH+BTH", bth_only, 0x23b1_d7f9u32), ("LRH+GRH+BTH", grh, 0x1000_0306)] {
            assert_eq!(icrc(&body), golden, "{name}");
        }
    }

    #[test]
    fn malformed_bodies_are_refused() {
        assert_eq!(WirePacket::seal(vec![0; 8], false, false), Err(WireError::Length(12)));
        assert_eq!(WirePacket::seal(vec![0; 23], false, false), Err(WireError::Length(27)));
        let mut raw = smp();
        raw[1] = 0; // LNH raw
        assert_eq!(WirePacket::seal(raw, false, false), Err(WireError::Lnh(0)));
    }
}
