//! The CQP: its 64-byte host context (hardware-facts §3.4) and the SQ ring position with its valid-bit
//! polarity (§3.6).
//!
//! The driver's polarity starts at 0 and flips before it writes index 0, so WQEs of the first pass carry
//! valid = 1, the second pass 0, and so on (G11). The device tracks the value it expects at its tail.

#![forbid(unsafe_code)]

use serde_json::{json, Value};

use super::regs::Field;
use super::wqe::IRDMA_CQP_WQE_SIZE;
use super::CreateError;

pub const IRDMA_CQP_CTX_SIZE: usize = 64;
/// SQ base alignment.
pub const IRDMA_CQP_ALIGNMENT: u64 = 0x200;
/// Encoded SQ size range: 4 (code 1) to 2048 (code 10) entries.
pub const IRDMA_CQP_SW_SQSIZE_MIN_CODE: u64 = 1;
pub const IRDMA_CQP_SW_SQSIZE_MAX_CODE: u64 = 10;
/// HW_MAJVER of GEN2 (icrdma).
pub const IRDMA_GEN_2: u64 = 1;

// Host-context fields (IRDMA_CQPHC_*).
pub const IRDMA_CQPHC_DISABLE_PFPDUS: Field = Field::bit(1); // qw0
pub const IRDMA_CQPHC_ROCEV2_RTO_POLICY: Field = Field::bit(2); // qw0
pub const IRDMA_CQPHC_PROTOCOL_USED: Field = Field::new(4, 3); // qw0
pub const IRDMA_CQPHC_SQSIZE: Field = Field::new(11, 8); // qw0
pub const IRDMA_CQPHC_SVER: Field = Field::new(31, 24); // qw0
pub const IRDMA_CQPHC_CEQPERVF: Field = Field::new(39, 32); // qw0
pub const IRDMA_CQPHC_HMC_PROFILE: Field = Field::new(2, 0); // qw2
pub const IRDMA_CQPHC_ENABLED_VFS: Field = Field::new(37, 32); // qw2
pub const IRDMA_CQPHC_HW_MINVER: Field = Field::new(15, 0); // qw4
pub const IRDMA_CQPHC_HW_MAJVER: Field = Field::new(31, 16); // qw4

/// PROTOCOL_USED value 3 is not defined (0 any, 1 iWARP, 2 RoCE).
const PROTOCOL_USED_MAX: u64 = 2;
/// HMC_PROFILE values 1 (default), 2 (favour VF), 3 (equal).
const HMC_PROFILE_RANGE: std::ops::RangeInclusive<u64> = 1..=3;

/// The validated host context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostContext {
    pub sq_size: u32,
    pub sq_base: u64,
    pub protocol_used: u8,
    pub hmc_profile: u8,
    /// qw3, returned in every CQE's qw1.
    pub completion_context: u64,
    pub hw_maj_ver: u16,
    pub hw_min_ver: u16,
    pub struct_ver: u8,
}

impl HostContext {
    pub fn decode(bytes: &[u8; IRDMA_CQP_CTX_SIZE]) -> Result<HostContext, CreateError> {
        let mut qw = [0u64; 8];
        for (q, chunk) in qw.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *q = u64::from_le_bytes(b);
        }
        let code = IRDMA_CQPHC_SQSIZE.get(qw[0]);
        if !(IRDMA_CQP_SW_SQSIZE_MIN_CODE..=IRDMA_CQP_SW_SQSIZE_MAX_CODE).contains(&code) {
            return Err(CreateError::BadSqSize(code));
        }
        let sq_base = qw[1];
        if sq_base == 0 || sq_base % IRDMA_CQP_ALIGNMENT != 0 {
            return Err(CreateError::BadSqBase(sq_base));
        }
        let sq_bytes = (IRDMA_CQP_WQE_SIZE as u64) << (code + 1);
        if sq_base.checked_add(sq_bytes).is_none() {
            return Err(CreateError::BadSqBase(sq_base));
        }
        let maj = IRDMA_CQPHC_HW_MAJVER.get(qw[4]);
        if maj != IRDMA_GEN_2 {
            return Err(CreateError::BadMajorVersion(maj));
        }
        let protocol_used = IRDMA_CQPHC_PROTOCOL_USED.get(qw[0]);
        if protocol_used > PROTOCOL_USED_MAX {
            return Err(CreateError::BadField("PROTOCOL_USED"));
        }
        let hmc_profile = IRDMA_CQPHC_HMC_PROFILE.get(qw[2]);
        if !HMC_PROFILE_RANGE.contains(&hmc_profile) {
            return Err(CreateError::BadField("HMC_PROFILE"));
        }
        Ok(HostContext {
            // Encoded size = log2(size) - 1 (§3.3).
            sq_size: 1 << (code + 1),
            sq_base,
            protocol_used: protocol_used as u8,
            hmc_profile: hmc_profile as u8,
            completion_context: qw[3],
            hw_maj_ver: maj as u16,
            hw_min_ver: IRDMA_CQPHC_HW_MINVER.get(qw[4]) as u16,
            struct_ver: IRDMA_CQPHC_SVER.get(qw[0]) as u8,
        })
    }
}

/// The device's side of the CQP SQ ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqp {
    pub ctx: HostContext,
    /// Next WQE the device executes.
    pub tail: u32,
    /// The valid bit the WQE at `tail` carries on this pass.
    pub polarity: bool,
    /// Ring passes completed (for the dump).
    pub wraps: u64,
}

impl Cqp {
    pub fn new(ctx: HostContext) -> Self {
        Self { ctx, tail: 0, polarity: true, wraps: 0 }
    }

    /// IOVA of SQ entry `idx` (`idx < sq_size`, so no overflow: checked at decode).
    pub fn wqe_addr(&self, idx: u32) -> u64 {
        self.ctx.sq_base + u64::from(idx) * IRDMA_CQP_WQE_SIZE as u64
    }

    /// Moves past the WQE at `tail`; the expected valid bit flips when the tail wraps to 0.
    pub fn advance(&mut self) {
        self.tail = (self.tail + 1) % self.ctx.sq_size;
        if self.tail == 0 {
            self.polarity = !self.polarity;
            self.wraps += 1;
        }
    }

    pub fn to_json(&self, head: u32) -> Value {
        json!({
            "sq_base": format!("{:#x}", self.ctx.sq_base),
            "sq_size": self.ctx.sq_size,
            "head": head,
            "tail": self.tail,
            "polarity": u8::from(self.polarity),
            "wraps": self.wraps,
            "completion_context": format!("{:#x}", self.ctx.completion_context),
            "hw_maj_ver": self.ctx.hw_maj_ver,
            "hw_min_ver": self.ctx.hw_min_ver,
            "protocol_used": self.ctx.protocol_used,
            "hmc_profile": self.ctx.hmc_profile,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(qw: [u64; 8]) -> [u8; 64] {
        let mut b = [0u8; 64];
        for (chunk, q) in b.chunks_exact_mut(8).zip(qw) {
            chunk.copy_from_slice(&q.to_le_bytes());
        }
        b
    }

    /// G10: GEN2, SQ 2048, RoCE only, hmc_profile 1.
    fn g10(sq_pa: u64) -> [u64; 8] {
        [0x0000_0000_0000_0A10, sq_pa, 0x1, 0xFFFF_8880_1234_5678, 0x0000_0000_0001_0000, 0, 0, 0]
    }

    #[test]
    fn g10_host_context_decodes_to_a_2048_entry_roce_cqp() {
        let hc = HostContext::decode(&ctx(g10(0x4000_0000))).unwrap();
        assert_eq!(hc.sq_size, 2048);
        assert_eq!(hc.sq_base, 0x4000_0000);
        assert_eq!(hc.protocol_used, 2);
        assert_eq!(hc.hmc_profile, 1);
        assert_eq!(hc.hw_maj_ver, 1);
        assert_eq!(hc.completion_context, 0xFFFF_8880_1234_5678);
    }

    #[test]
    fn encoded_sq_sizes_map_to_powers_of_two() {
        for (code, size) in [(1u64, 4u32), (2, 8), (7, 256), (10, 2048)] {
            let mut qw = g10(0x10000);
            qw[0] = code << 8;
            assert_eq!(HostContext::decode(&ctx(qw)).map(|h| h.sq_size), Ok(size), "code {code}");
        }
    }

    #[test]
    fn bad_host_contexts_are_refused_by_variant() {
        let cases: [(usize, u64, CreateError); 7] = [
            (0, 0x0000, CreateError::BadSqSize(0)),
            (0, 0x0B00, CreateError::BadSqSize(11)),
            (1, 0x10100, CreateError::BadSqBase(0x10100)),
            (1, 0, CreateError::BadSqBase(0)),
            (4, 0x0002_0000, CreateError::BadMajorVersion(2)),
            (0, 0x0A18, CreateError::BadField("PROTOCOL_USED")),
            (2, 0x4, CreateError::BadField("HMC_PROFILE")),
        ];
        for (qw, value, err) in cases {
            let mut c = g10(0x10000);
            c[qw] = value;
            assert_eq!(HostContext::decode(&ctx(c)), Err(err), "qw{qw} = {value:#x}");
        }
    }

    #[test]
    fn expected_polarity_starts_at_1_and_flips_on_each_wrap() {
        let mut hc = HostContext::decode(&ctx(g10(0x10000))).unwrap();
        hc.sq_size = 4;
        let mut cqp = Cqp::new(hc);
        let mut seen = Vec::new();
        for _ in 0..12 {
            seen.push((cqp.tail, cqp.polarity));
            cqp.advance();
        }
        let pass = |p| (0..4).map(move |i| (i, p));
        let want: Vec<_> = pass(true).chain(pass(false)).chain(pass(true)).collect();
        assert_eq!(seen, want);
        assert_eq!(cqp.wqe_addr(3), 0x10000 + 3 * 64);
    }
}
