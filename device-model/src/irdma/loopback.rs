//! The project-specific loopback classification path: the segment descriptor a driver places in its memory
//! and the result/status words the device publishes in BAR0 (regs `IRDMA_EMU_LB_*`).
//!
//! The layout and the codes are the project's ABI, defined once in `emu_abi::irdma`.

#![forbid(unsafe_code)]

use emu_abi::irdma::{LbErrCode, LbKind, LbResult, LbStatus};
use thiserror::Error;

use super::classify::{ClassifyTarget, Segment};

pub use emu_abi::irdma::IRDMA_EMU_LB_DESC_SIZE;

/// Why a loopback request failed; the code is STATUS.ERRCODE.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum LoopbackError {
    #[error("descriptor DMA read failed")]
    Dma,
    #[error("reserved descriptor bits set")]
    ReservedBits,
    #[error("IPv4 descriptor with non-zero address words 1..3")]
    Ipv4Upper,
    #[error("VLAN id without VLAN_VALID")]
    VlanWithoutValid,
}

impl LoopbackError {
    pub fn code(self) -> LbErrCode {
        match self {
            LoopbackError::Dma => LbErrCode::Dma,
            LoopbackError::ReservedBits => LbErrCode::ReservedBits,
            LoopbackError::Ipv4Upper => LbErrCode::Ipv4Upper,
            LoopbackError::VlanWithoutValid => LbErrCode::VlanWithoutValid,
        }
    }
}

impl From<LbErrCode> for LoopbackError {
    fn from(c: LbErrCode) -> Self {
        match c {
            LbErrCode::Dma => LoopbackError::Dma,
            LbErrCode::ReservedBits => LoopbackError::ReservedBits,
            LbErrCode::Ipv4Upper => LoopbackError::Ipv4Upper,
            LbErrCode::VlanWithoutValid => LoopbackError::VlanWithoutValid,
        }
    }
}

pub fn decode_descriptor(bytes: &[u8; IRDMA_EMU_LB_DESC_SIZE]) -> Result<Segment, LoopbackError> {
    Ok(Segment::decode(bytes)?)
}

/// The inverse of `decode_descriptor`, for tests and the control socket.
pub fn encode_descriptor(seg: &Segment) -> [u8; IRDMA_EMU_LB_DESC_SIZE] {
    seg.encode()
}

/// STATUS after a request: DONE, or ERR with the code; BUSY while requests remain queued.
pub fn status_word(result: Result<(), LoopbackError>, still_pending: bool) -> u32 {
    let s = LbStatus::DEFAULT.with_busy(still_pending);
    match result {
        Ok(()) => s.with_done(true),
        Err(e) => s.with_err(true).with_errcode(e.code() as u8),
    }
    .raw_value()
}

pub fn result_word(target: &ClassifyTarget) -> u32 {
    let (kind, qpn) = match *target {
        ClassifyTarget::ToHost => (LbKind::ToHost, 0),
        ClassifyTarget::Established { qpn } => (LbKind::Established, qpn),
        ClassifyTarget::Listener { qpn } => (LbKind::Listener, qpn),
    };
    LbResult::of(kind, qpn).raw_value()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_descriptor_error_code_has_its_variant_and_back() {
        // The codes' meanings are the ABI's (emu-abi tests the decoder); here only the mapping both ways.
        for code in [LbErrCode::Dma, LbErrCode::ReservedBits, LbErrCode::Ipv4Upper, LbErrCode::VlanWithoutValid] {
            assert_eq!(LoopbackError::from(code).code(), code);
        }
        assert_eq!(decode_descriptor(&[0xFF; IRDMA_EMU_LB_DESC_SIZE]), Err(LoopbackError::ReservedBits));
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
