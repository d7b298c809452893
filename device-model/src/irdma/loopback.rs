//! The project-specific loopback classification path: the segment descriptor a driver places in its memory
//! and the result/status words the device publishes in BAR0 (regs `IRDMA_EMU_LB_*`).
//!
//! Descriptor (40 bytes, little-endian):
//! - qw0: SRC_PORT 15:0, DST_PORT 31:16, VLANID 43:32, VLAN_VALID 48, IPV4 49, SYN 50, ACK 51; other bits reserved (0).
//! - bytes 8..24: source IP as four u32 words, word `[0]` (most significant) first; IPv4 uses word 0 only.
//! - bytes 24..40: destination IP, same layout.

use thiserror::Error;

use super::classify::{ClassifyTarget, Segment};
use super::regs::{
    Field, IRDMA_EMU_LB_RESULT_KIND, IRDMA_EMU_LB_RESULT_QPN, IRDMA_EMU_LB_STATUS_BUSY, IRDMA_EMU_LB_STATUS_DONE,
    IRDMA_EMU_LB_STATUS_ERR, IRDMA_EMU_LB_STATUS_ERRCODE,
};

pub const IRDMA_EMU_LB_DESC_SIZE: usize = 40;

pub const IRDMA_EMU_LB_DESC_SRC_PORT: Field = Field::new(15, 0);
pub const IRDMA_EMU_LB_DESC_DST_PORT: Field = Field::new(31, 16);
pub const IRDMA_EMU_LB_DESC_VLANID: Field = Field::new(43, 32);
pub const IRDMA_EMU_LB_DESC_VLAN_VALID: Field = Field::bit(48);
pub const IRDMA_EMU_LB_DESC_IPV4: Field = Field::bit(49);
pub const IRDMA_EMU_LB_DESC_SYN: Field = Field::bit(50);
pub const IRDMA_EMU_LB_DESC_ACK: Field = Field::bit(51);

const QW0_DEFINED: u64 = IRDMA_EMU_LB_DESC_SRC_PORT.mask()
    | IRDMA_EMU_LB_DESC_DST_PORT.mask()
    | IRDMA_EMU_LB_DESC_VLANID.mask()
    | IRDMA_EMU_LB_DESC_VLAN_VALID.mask()
    | IRDMA_EMU_LB_DESC_IPV4.mask()
    | IRDMA_EMU_LB_DESC_SYN.mask()
    | IRDMA_EMU_LB_DESC_ACK.mask();

/// Why a loopback request failed; the discriminant is STATUS.ERRCODE.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum LoopbackError {
    #[error("descriptor DMA read failed")]
    Dma = 1,
    #[error("reserved descriptor bits set")]
    ReservedBits = 2,
    #[error("IPv4 descriptor with non-zero address words 1..3")]
    Ipv4Upper = 3,
    #[error("VLAN id without VLAN_VALID")]
    VlanWithoutValid = 4,
}

pub fn decode_descriptor(bytes: &[u8; IRDMA_EMU_LB_DESC_SIZE]) -> Result<Segment, LoopbackError> {
    let word = |i: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(&bytes[8 + 4 * i..12 + 4 * i]);
        u32::from_le_bytes(b)
    };
    let mut q = [0u8; 8];
    q.copy_from_slice(&bytes[..8]);
    let qw0 = u64::from_le_bytes(q);
    if qw0 & !QW0_DEFINED != 0 {
        return Err(LoopbackError::ReservedBits);
    }
    let src_ip = [word(0), word(1), word(2), word(3)];
    let dst_ip = [word(4), word(5), word(6), word(7)];
    let ipv4 = IRDMA_EMU_LB_DESC_IPV4.is_set(qw0);
    if ipv4 && (src_ip[1..] != [0; 3] || dst_ip[1..] != [0; 3]) {
        return Err(LoopbackError::Ipv4Upper);
    }
    let vlan_valid = IRDMA_EMU_LB_DESC_VLAN_VALID.is_set(qw0);
    if !vlan_valid && IRDMA_EMU_LB_DESC_VLANID.get(qw0) != 0 {
        return Err(LoopbackError::VlanWithoutValid);
    }
    Ok(Segment {
        ipv4,
        src_ip,
        dst_ip,
        src_port: IRDMA_EMU_LB_DESC_SRC_PORT.get(qw0) as u16,
        dst_port: IRDMA_EMU_LB_DESC_DST_PORT.get(qw0) as u16,
        vlan: vlan_valid.then(|| IRDMA_EMU_LB_DESC_VLANID.get(qw0) as u16),
        syn: IRDMA_EMU_LB_DESC_SYN.is_set(qw0),
        ack: IRDMA_EMU_LB_DESC_ACK.is_set(qw0),
    })
}

/// The inverse of `decode_descriptor`, for drivers and tests.
pub fn encode_descriptor(seg: &Segment) -> [u8; IRDMA_EMU_LB_DESC_SIZE] {
    let qw0 = IRDMA_EMU_LB_DESC_SRC_PORT.put(u64::from(seg.src_port))
        | IRDMA_EMU_LB_DESC_DST_PORT.put(u64::from(seg.dst_port))
        | seg.vlan.map_or(0, |v| IRDMA_EMU_LB_DESC_VLANID.put(u64::from(v)) | IRDMA_EMU_LB_DESC_VLAN_VALID.put(1))
        | IRDMA_EMU_LB_DESC_IPV4.put(u64::from(seg.ipv4))
        | IRDMA_EMU_LB_DESC_SYN.put(u64::from(seg.syn))
        | IRDMA_EMU_LB_DESC_ACK.put(u64::from(seg.ack));
    let mut out = [0u8; IRDMA_EMU_LB_DESC_SIZE];
    out[..8].copy_from_slice(&qw0.to_le_bytes());
    for (i, w) in seg.src_ip.iter().chain(seg.dst_ip.iter()).enumerate() {
        out[8 + 4 * i..12 + 4 * i].copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// STATUS after a request: DONE, or ERR with the code; BUSY while requests remain queued.
pub fn status_word(result: Result<(), LoopbackError>, still_pending: bool) -> u32 {
    let mut s = IRDMA_EMU_LB_STATUS_BUSY.put(u64::from(still_pending));
    match result {
        Ok(()) => s |= IRDMA_EMU_LB_STATUS_DONE.put(1),
        Err(e) => s |= IRDMA_EMU_LB_STATUS_ERR.put(1) | IRDMA_EMU_LB_STATUS_ERRCODE.put(e as u64),
    }
    s as u32
}

pub fn result_word(target: &ClassifyTarget) -> u32 {
    (IRDMA_EMU_LB_RESULT_KIND.put(target.code()) | IRDMA_EMU_LB_RESULT_QPN.put(u64::from(target.qpn().unwrap_or(0))))
        as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn syn() -> Segment {
        Segment {
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
        let d = encode_descriptor(&syn());
        // 5000 = 0x1388, 4791 = 0x12B7, VLAN 100 = 0x64, VLAN_VALID|IPV4|SYN = bits 48,49,50.
        assert_eq!(u64::from_le_bytes(d[..8].try_into().unwrap()), 0x0007_0064_12B7_1388);
        assert_eq!(&d[8..12], &0x0A00_0002u32.to_le_bytes());
        assert_eq!(&d[24..28], &0x0A00_0001u32.to_le_bytes());
        assert_eq!(decode_descriptor(&d), Ok(syn()));
    }

    #[test]
    fn malformed_descriptors_are_refused_by_variant() {
        let mut d = encode_descriptor(&syn());
        d[7] = 0x80;
        assert_eq!(decode_descriptor(&d), Err(LoopbackError::ReservedBits));
        let mut d = encode_descriptor(&syn());
        d[12] = 1;
        assert_eq!(decode_descriptor(&d), Err(LoopbackError::Ipv4Upper));
        let mut d = encode_descriptor(&Segment { vlan: None, ..syn() });
        d[4] = 5;
        assert_eq!(decode_descriptor(&d), Err(LoopbackError::VlanWithoutValid));
    }

    #[test]
    fn result_and_status_words() {
        assert_eq!(result_word(&ClassifyTarget::Listener { qpn: 7 }), 0x0000_0702);
        assert_eq!(result_word(&ClassifyTarget::Established { qpn: 0x3FFFF }), 0x03FF_FF01);
        assert_eq!(result_word(&ClassifyTarget::ToHost), 0);
        assert_eq!(status_word(Ok(()), false), 0x1);
        assert_eq!(status_word(Err(LoopbackError::Dma), true), 0x8000_0102);
    }
}
