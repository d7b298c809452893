//! irdma loopback classification block (BAR0 0x600000, an offset range no irdma register uses): a driver
//! places a TCP segment descriptor in DMA memory, rings a doorbell, and reads where the device's quad-hash
//! table sent it. Also the major/minor completion codes the emulator reports where the reference lists none.
//! Registers are 32-bit. docs/irdma-device.md has the tables.

#![forbid(unsafe_code)]

use arbitrary_int::{u12, u18};
use bitbybit::{bitenum, bitfield};

pub const IRDMA_EMU_LB_BASE: u64 = 0x0060_0000;
/// RW: low 32 bits of the segment descriptor IOVA.
pub const IRDMA_EMU_LB_DESC_LOW: u64 = IRDMA_EMU_LB_BASE;
/// RW: high 32 bits of the segment descriptor IOVA.
pub const IRDMA_EMU_LB_DESC_HIGH: u64 = IRDMA_EMU_LB_BASE + 0x4;
/// WO: any write classifies the descriptor at DESC_HIGH:DESC_LOW.
pub const IRDMA_EMU_LB_DOORBELL: u64 = IRDMA_EMU_LB_BASE + 0x8;
/// RO: [`LbStatus`].
pub const IRDMA_EMU_LB_STATUS: u64 = IRDMA_EMU_LB_BASE + 0xC;
/// RO: [`LbResult`].
pub const IRDMA_EMU_LB_RESULT: u64 = IRDMA_EMU_LB_BASE + 0x10;
/// RO: loopback requests finished (done or error) since reset; wraps.
pub const IRDMA_EMU_LB_SEQ: u64 = IRDMA_EMU_LB_BASE + 0x14;

/// EMU_LB_STATUS: DONE or ERR with ERRCODE for the last request; BUSY while requests remain queued.
#[bitfield(u32, default = 0)]
#[derive(Debug, PartialEq, Eq)]
pub struct LbStatus {
    #[bit(31, rw)]
    err: bool,
    /// An [`LbErrCode`] when ERR is set.
    #[bits(8..=15, rw)]
    errcode: u8,
    #[bit(1, rw)]
    busy: bool,
    #[bit(0, rw)]
    done: bool,
}

/// EMU_LB_STATUS.ERRCODE: why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum LbErrCode {
    /// The descriptor could not be read by DMA.
    Dma = 1,
    /// Reserved bits of qword 0 are set.
    ReservedBits = 2,
    /// An IPv4 descriptor with non-zero address words 1..3.
    Ipv4Upper = 3,
    /// A VLAN id without VLAN_VALID.
    VlanWithoutValid = 4,
}

/// EMU_LB_RESULT.KIND: where the segment went (the matched quad-hash entry type; 0 for the host).
#[bitenum(u3, exhaustive = false)]
#[derive(Debug, PartialEq, Eq)]
pub enum LbKind {
    ToHost = 0,
    /// IRDMA_QHASH_TYPE_TCP_ESTABLISHED.
    Established = 1,
    /// IRDMA_QHASH_TYPE_TCP_SYN.
    Listener = 2,
}

/// EMU_LB_RESULT: KIND and the QPN of the matched entry (0 for the host).
#[bitfield(u32, default = 0)]
#[derive(Debug, PartialEq, Eq)]
pub struct LbResult {
    #[bits(8..=25, rw)]
    qpn: u18,
    #[bits(0..=2, rw)]
    kind: Option<LbKind>,
}

impl LbResult {
    /// KIND and QPN; a QPN wider than the field's 18 bits keeps its low bits, as a register field would.
    pub fn of(kind: LbKind, qpn: u32) -> Self {
        Self::DEFAULT.with_kind(kind).with_qpn(u18::new(qpn & 0x3_FFFF))
    }
}

pub const IRDMA_EMU_LB_DESC_SIZE: usize = 40;
/// Byte offsets of the source and destination IP words in the descriptor.
pub const IRDMA_EMU_LB_DESC_SRC_IP: usize = 8;
pub const IRDMA_EMU_LB_DESC_DST_IP: usize = 24;

/// Descriptor qword 0; bits not named here are reserved (0).
#[bitfield(u64, default = 0)]
#[derive(Debug, PartialEq, Eq)]
pub struct LbDescQw0 {
    #[bit(51, rw)]
    ack: bool,
    #[bit(50, rw)]
    syn: bool,
    #[bit(49, rw)]
    ipv4: bool,
    #[bit(48, rw)]
    vlan_valid: bool,
    #[bits(32..=43, rw)]
    vlanid: u12,
    #[bits(16..=31, rw)]
    dst_port: u16,
    #[bits(0..=15, rw)]
    src_port: u16,
}

impl LbDescQw0 {
    /// The bits this layout defines.
    pub const DEFINED: u64 = ((1 << 52) - 1) & !((1 << 48) - (1 << 44));
}

/// A TCP segment as the descriptor carries it. IP addresses are four u32 words, `[0]` most significant;
/// IPv4 uses word 0 only. `dst` is the local end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LbSegment {
    pub ipv4: bool,
    pub src_ip: [u32; 4],
    pub dst_ip: [u32; 4],
    pub src_port: u16,
    pub dst_port: u16,
    /// 12 bits: larger values lose their upper bits.
    pub vlan: Option<u16>,
    pub syn: bool,
    pub ack: bool,
}

impl LbSegment {
    /// The 40-byte little-endian descriptor: qword 0, then the source and destination IP words.
    pub fn encode(&self) -> [u8; IRDMA_EMU_LB_DESC_SIZE] {
        let qw0 = LbDescQw0::DEFAULT
            .with_src_port(self.src_port)
            .with_dst_port(self.dst_port)
            .with_vlanid(u12::new(self.vlan.unwrap_or(0) & 0xFFF))
            .with_vlan_valid(self.vlan.is_some())
            .with_ipv4(self.ipv4)
            .with_syn(self.syn)
            .with_ack(self.ack);
        let mut d = [0u8; IRDMA_EMU_LB_DESC_SIZE];
        d[..8].copy_from_slice(&qw0.raw_value().to_le_bytes());
        for (base, ip) in [(IRDMA_EMU_LB_DESC_SRC_IP, &self.src_ip), (IRDMA_EMU_LB_DESC_DST_IP, &self.dst_ip)] {
            for (i, w) in ip.iter().enumerate() {
                d[base + 4 * i..base + 4 * i + 4].copy_from_slice(&w.to_le_bytes());
            }
        }
        d
    }

    /// The inverse of `encode`, refusing what no encoder produces.
    pub fn decode(d: &[u8; IRDMA_EMU_LB_DESC_SIZE]) -> Result<Self, LbErrCode> {
        let word = |at: usize| u32::from_le_bytes([d[at], d[at + 1], d[at + 2], d[at + 3]]);
        let mut q = [0u8; 8];
        q.copy_from_slice(&d[..8]);
        let raw = u64::from_le_bytes(q);
        if raw & !LbDescQw0::DEFINED != 0 {
            return Err(LbErrCode::ReservedBits);
        }
        let qw0 = LbDescQw0::new_with_raw_value(raw);
        let ip = |base: usize| [word(base), word(base + 4), word(base + 8), word(base + 12)];
        let (src_ip, dst_ip) = (ip(IRDMA_EMU_LB_DESC_SRC_IP), ip(IRDMA_EMU_LB_DESC_DST_IP));
        if qw0.ipv4() && (src_ip[1..] != [0; 3] || dst_ip[1..] != [0; 3]) {
            return Err(LbErrCode::Ipv4Upper);
        }
        if !qw0.vlan_valid() && qw0.vlanid().value() != 0 {
            return Err(LbErrCode::VlanWithoutValid);
        }
        Ok(Self {
            ipv4: qw0.ipv4(),
            src_ip,
            dst_ip,
            src_port: qw0.src_port(),
            dst_port: qw0.dst_port(),
            vlan: qw0.vlan_valid().then(|| qw0.vlanid().value()),
            syn: qw0.syn(),
            ack: qw0.ack(),
        })
    }
}

// Major codes this device reports (CQE MAJERR / CQPERRCODES) for conditions the reference gives no code for.
pub const IRDMA_EMU_MAJ_BAD_WQE: u16 = 0x8001;
pub const IRDMA_EMU_MAJ_QHASH: u16 = 0x8002;
pub const IRDMA_EMU_MAJ_CQ: u16 = 0x8003;
pub const IRDMA_EMU_MAJ_DMA: u16 = 0x8004;
pub const IRDMA_EMU_MAJ_CQP_CREATE: u16 = 0x8005;

// Minor codes under IRDMA_EMU_MAJ_BAD_WQE.
pub const IRDMA_EMU_MIN_UNSUPPORTED_OPCODE: u16 = 0x0001;
pub const IRDMA_EMU_MIN_BAD_MANAGE: u16 = 0x0002;
pub const IRDMA_EMU_MIN_BAD_ENTRY_TYPE: u16 = 0x0003;
pub const IRDMA_EMU_MIN_RESERVED_BITS: u16 = 0x0004;
pub const IRDMA_EMU_MIN_BAD_FIELD: u16 = 0x0005;
// Under IRDMA_EMU_MAJ_QHASH.
pub const IRDMA_EMU_MIN_QHASH_DUPLICATE: u16 = 0x0001;
pub const IRDMA_EMU_MIN_QHASH_MISSING: u16 = 0x0002;
pub const IRDMA_EMU_MIN_QHASH_FULL: u16 = 0x0003;
// Under IRDMA_EMU_MAJ_CQ.
pub const IRDMA_EMU_MIN_CQ_ID_UNSUPPORTED: u16 = 0x0001;
pub const IRDMA_EMU_MIN_CCQ_EXISTS: u16 = 0x0002;
pub const IRDMA_EMU_MIN_NO_SUCH_CQ: u16 = 0x0003;
pub const IRDMA_EMU_MIN_CCQ_FULL: u16 = 0x0004;
// Under IRDMA_EMU_MAJ_DMA: which access failed.
pub const IRDMA_EMU_MIN_DMA_WQE_FETCH: u16 = 0x0001;
pub const IRDMA_EMU_MIN_DMA_CQE_WRITE: u16 = 0x0002;
pub const IRDMA_EMU_MIN_DMA_HOST_CONTEXT: u16 = 0x0003;
pub const IRDMA_EMU_MIN_DMA_SHADOW_AREA: u16 = 0x0004;
pub const IRDMA_EMU_MIN_DMA_CQ_MEMORY: u16 = 0x0005;
pub const IRDMA_EMU_MIN_DMA_LOOPBACK_DESCRIPTOR: u16 = 0x0006;
// Under IRDMA_EMU_MAJ_CQP_CREATE (a host-context DMA failure reports MAJ_DMA / MIN_DMA_HOST_CONTEXT).
pub const IRDMA_EMU_MIN_BAD_SQ_SIZE: u16 = 0x0001;
pub const IRDMA_EMU_MIN_BAD_SQ_BASE: u16 = 0x0002;
pub const IRDMA_EMU_MIN_BAD_MAJOR_VERSION: u16 = 0x0003;
pub const IRDMA_EMU_MIN_CQP_EXISTS: u16 = 0x0004;
pub const IRDMA_EMU_MIN_BAD_CONTEXT_FIELD: u16 = 0x0006;
pub const IRDMA_EMU_MIN_CREATE_BUSY: u16 = 0x0007;

#[cfg(test)]
mod tests {
    use super::*;

    fn syn() -> LbSegment {
        LbSegment {
            ipv4: true,
            src_ip: [0x0A00_0002, 0, 0, 0],
            dst_ip: [0x0A00_0001, 0, 0, 0],
            src_port: 5000,
            dst_port: 4791,
            vlan: Some(100),
            syn: true,
            ack: false,
        }
    }

    #[test]
    fn descriptor_layout_places_ports_flags_and_words() {
        let d = syn().encode();
        // 5000 = 0x1388, 4791 = 0x12B7, VLAN 100 = 0x64, VLAN_VALID|IPV4|SYN = bits 48,49,50.
        assert_eq!(u64::from_le_bytes(d[..8].try_into().unwrap()), 0x0007_0064_12B7_1388);
        assert_eq!(&d[8..12], &0x0A00_0002u32.to_le_bytes());
        assert_eq!(&d[24..28], &0x0A00_0001u32.to_le_bytes());
        assert_eq!(LbSegment::decode(&d), Ok(syn()));
    }

    #[test]
    fn an_ipv6_vlan_syn_descriptor_packs_ports_flags_and_words_in_order() {
        let seg = LbSegment {
            ipv4: false,
            src_ip: [0xFE80_0000, 0, 0, 2],
            dst_ip: [0xFE80_0000, 0, 0, 1],
            src_port: 5000,
            dst_port: 4791,
            vlan: Some(100),
            syn: true,
            ack: false,
        };
        let d = seg.encode();
        // SRC_PORT 0x1388 | DST_PORT 0x12B7 << 16 | VLANID 100 << 32 | VLAN_VALID 1 << 48 | SYN 1 << 50.
        assert_eq!(d[..8], 0x0005_0064_12B7_1388u64.to_le_bytes());
        assert_eq!(d[8..12], 0xFE80_0000u32.to_le_bytes());
        assert_eq!(d[20..24], 2u32.to_le_bytes());
        assert_eq!(d[24..28], 0xFE80_0000u32.to_le_bytes());
        assert_eq!(d[36..40], 1u32.to_le_bytes());
    }

    #[test]
    fn malformed_descriptors_are_refused_by_code() {
        let mut d = syn().encode();
        d[7] = 0x80;
        assert_eq!(LbSegment::decode(&d), Err(LbErrCode::ReservedBits));
        let mut d = syn().encode();
        d[5] = 0x10; // bit 44: between VLANID (43:32) and VLAN_VALID (48)
        assert_eq!(LbSegment::decode(&d), Err(LbErrCode::ReservedBits));
        let mut d = syn().encode();
        d[12] = 1;
        assert_eq!(LbSegment::decode(&d), Err(LbErrCode::Ipv4Upper));
        let mut d = LbSegment { vlan: None, ..syn() }.encode();
        d[4] = 5;
        assert_eq!(LbSegment::decode(&d), Err(LbErrCode::VlanWithoutValid));
    }

    #[test]
    fn result_and_status_words_sit_at_the_documented_bits() {
        let listener = LbResult::of(LbKind::Listener, 7);
        assert_eq!(listener.raw_value(), 0x0000_0702);
        let established = LbResult::of(LbKind::Established, 0x3FFFF);
        assert_eq!(LbResult::of(LbKind::Established, 0x4_0001).qpn().value(), 1);
        assert_eq!(established.raw_value(), 0x03FF_FF01);
        assert!(LbResult::new_with_raw_value(0x0705).kind().is_err());
        assert_eq!(LbResult::new_with_raw_value(0x0702).kind(), Ok(LbKind::Listener));
        assert_eq!(LbStatus::DEFAULT.with_done(true).raw_value(), 0x1);
        let err = LbStatus::DEFAULT.with_busy(true).with_err(true).with_errcode(LbErrCode::Dma as u8);
        assert_eq!(err.raw_value(), 0x8000_0102);
    }
}
