//! hfi1 loopback send path: a register block at the top of the TXE window (a page the real TXE CSR map leaves
//! unused) through which a driver, with MMIO and DMA alone, hands TID RDMA data packets to the device's own
//! receive engine. All registers are 64-bit. docs/hfi1-device.md has the table.

#![forbid(unsafe_code)]

/// Base of the block in BAR0: TXE (0x1800000) + 0x7F0000.
pub const LB_BASE: u64 = 0x1FF_0000;
pub const LB_SIZE: u64 = 0x1000;

// Registers, relative to LB_BASE.
/// RW: IOVA of the first descriptor of the next chain.
pub const LB_DESC_ADDR: u64 = 0x00;
/// WO (reads 0): any write submits the chain at LB_DESC_ADDR.
pub const LB_DOORBELL: u64 = 0x08;
/// RO: doorbells whose chain was fully processed.
pub const LB_DB_DONE: u64 = 0x10;
/// RO: doorbells accepted (queued for the device's worker).
pub const LB_DB_SUBMITTED: u64 = 0x18;
/// RO: descriptors processed.
pub const LB_DESC_DONE: u64 = 0x20;
/// RO: descriptors whose result was not "placed".
pub const LB_DESC_ERR: u64 = 0x28;
/// RO: bits 7:0 = [`RxResult`] code of the last descriptor processed.
pub const LB_LAST_RESULT: u64 = 0x30;
pub const LB_LAST_RESULT_CODE_MASK: u64 = 0xFF;
/// RO: doorbells dropped because the device's queue was full.
pub const LB_DB_DROPPED: u64 = 0x38;

/// MSI-X vector raised when a doorbell's chain is done.
pub const LB_MSIX_VECTOR: u16 = 0;
/// Descriptor header bytes; the payload follows.
pub const LB_DESC_HDR_LEN: usize = 24;
/// Largest payload: the Omni-Path maximum MTU (10 KiB).
pub const LB_MAX_PAYLOAD: usize = 10240;
/// Descriptors per doorbell at most; a longer (or cyclic) chain is cut there.
pub const LB_MAX_CHAIN: usize = 4096;

/// A descriptor header (little-endian): kdeth0 u32 @0, dest_qp u32 @4, psn u32 @8, payload_len u32 @12,
/// next u64 @16 (IOVA of the next descriptor, 0 ends the chain); the payload follows at @24.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LbDescHeader {
    pub kdeth0: u32,
    pub dest_qp: u32,
    pub psn: u32,
    pub payload_len: u32,
    pub next: u64,
}

impl LbDescHeader {
    /// Byte offset of `next`, which a sender patches once it knows where the following descriptor goes.
    pub const NEXT_OFFSET: usize = 16;

    pub fn parse(b: &[u8; LB_DESC_HDR_LEN]) -> Self {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut next = [0u8; 8];
        next.copy_from_slice(&b[Self::NEXT_OFFSET..LB_DESC_HDR_LEN]);
        Self {
            kdeth0: u32_at(0),
            dest_qp: u32_at(4),
            psn: u32_at(8),
            payload_len: u32_at(12),
            next: u64::from_le_bytes(next),
        }
    }

    pub fn to_bytes(&self) -> [u8; LB_DESC_HDR_LEN] {
        let mut b = [0u8; LB_DESC_HDR_LEN];
        b[0..4].copy_from_slice(&self.kdeth0.to_le_bytes());
        b[4..8].copy_from_slice(&self.dest_qp.to_le_bytes());
        b[8..12].copy_from_slice(&self.psn.to_le_bytes());
        b[12..16].copy_from_slice(&self.payload_len.to_le_bytes());
        b[Self::NEXT_OFFSET..LB_DESC_HDR_LEN].copy_from_slice(&self.next.to_le_bytes());
        b
    }
}

/// What the receive engine did with a packet: `LB_LAST_RESULT`, the control socket's `inject` reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RxResult {
    Placed = 0,
    BadContext = 1,
    ContextDisabled = 2,
    BadTidCtrl = 3,
    FlowInvalid = 4,
    GenMismatch = 5,
    SeqMismatch = 6,
    TidOutOfRange = 7,
    TidInvalidEntry = 8,
    BufferOverrun = 9,
    DmaError = 10,
    /// Loopback only: the descriptor could not be read or is malformed.
    BadDescriptor = 11,
    /// Loopback only: reset or detach stopped the work.
    Aborted = 12,
}

impl RxResult {
    pub const ALL: [RxResult; 13] = [
        Self::Placed,
        Self::BadContext,
        Self::ContextDisabled,
        Self::BadTidCtrl,
        Self::FlowInvalid,
        Self::GenMismatch,
        Self::SeqMismatch,
        Self::TidOutOfRange,
        Self::TidInvalidEntry,
        Self::BufferOverrun,
        Self::DmaError,
        Self::BadDescriptor,
        Self::Aborted,
    ];

    pub fn code(self) -> u8 {
        self as u8
    }

    /// `None` for a code the device never reports.
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.code() == code)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Placed => "placed",
            Self::BadContext => "bad_context",
            Self::ContextDisabled => "context_disabled",
            Self::BadTidCtrl => "bad_tidctrl",
            Self::FlowInvalid => "flow_invalid",
            Self::GenMismatch => "gen_mismatch",
            Self::SeqMismatch => "seq_mismatch",
            Self::TidOutOfRange => "tid_out_of_range",
            Self::TidInvalidEntry => "tid_invalid_entry",
            Self::BufferOverrun => "buffer_overrun",
            Self::DmaError => "dma_error",
            Self::BadDescriptor => "bad_descriptor",
            Self::Aborted => "aborted",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_block_sits_at_txe_plus_0x7f0000() {
        // TXE is 0x1800000 (chip_registers.h); docs/hfi1-device.md places the block 0x7F0000 above it.
        assert_eq!(LB_BASE, 0x180_0000 + 0x7F_0000);
        assert_eq!(
            (LB_BASE + LB_DESC_ADDR, LB_BASE + LB_DOORBELL, LB_BASE + LB_DB_DONE, LB_BASE + LB_DB_DROPPED),
            (0x1FF_0000, 0x1FF_0008, 0x1FF_0010, 0x1FF_0038)
        );
    }

    #[test]
    fn descriptor_layout_is_little_endian_at_the_documented_offsets() {
        let mut b = [0u8; LB_DESC_HDR_LEN];
        b[0..4].copy_from_slice(&[0x10, 0x80, 0x02, 0x08]);
        b[4..8].copy_from_slice(&[0x02, 0x18, 0x80, 0x00]);
        b[8..12].copy_from_slice(&[0x03, 0x28, 0x1A, 0x09]);
        b[12..16].copy_from_slice(&[0x00, 0x01, 0x00, 0x00]);
        b[16..24].copy_from_slice(&[0x00, 0x30, 0, 0, 1, 0, 0, 0]);
        let d = LbDescHeader::parse(&b);
        let want = LbDescHeader {
            kdeth0: 0x08028010,
            dest_qp: 0x00801802,
            psn: 0x091A2803,
            payload_len: 256,
            next: 0x1_0000_3000,
        };
        assert_eq!(d, want);
        assert_eq!(d.to_bytes(), b);
    }

    #[test]
    fn result_codes_decode_and_unknown_codes_do_not() {
        assert_eq!(RxResult::from_code(5), Some(RxResult::GenMismatch));
        assert_eq!(RxResult::from_code(12), Some(RxResult::Aborted));
        assert_eq!(RxResult::from_code(13), None);
        for (i, r) in RxResult::ALL.iter().enumerate() {
            assert_eq!(usize::from(r.code()), i, "{}", r.name());
        }
    }
}
