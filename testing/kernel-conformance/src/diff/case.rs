//! One differential case: a device configuration, CQP and CCQ parameters, and a sequence of control-path
//! operations and device completions. Built from raw bytes (`arbitrary`), so proptest and libFuzzer
//! generate cases the same way.
//!
//! The domain is every input both drivers accept as a value of their types: enums in range, booleans as
//! 0/1, a user priority indexing `vsi->qos[]` (the kernel does not check it), CQEs for the oldest
//! outstanding WQE with the right completion context (the kernel dereferences it), and the CCQ features
//! hw.c never turns on (TPH, 64-byte CQEs, PBLs). docs/kernel-conformance.md lists each with its reason.

#![forbid(unsafe_code)]

use arbitrary::{Arbitrary, Result, Unstructured};

use super::fake::CreateResponse;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqpCfg {
    pub sq_size: u32,
    pub struct_ver: u8,
    pub hw_maj_ver: u16,
    pub hw_min_ver: u16,
    pub hmc_profile: u8,
    pub ena_vf_count: u8,
    pub ceqs_per_vf: u8,
    pub disable_packed: bool,
    pub rocev2_rto_policy: bool,
    /// enum irdma_protocol_used: 0..=2.
    pub protocol_used: u8,
    pub cc_cfg_valid: bool,
    pub min_dec_factor: u8,
    pub min_rate: u8,
    pub dcqcn_f: u8,
    pub rai_factor: u16,
    pub hai_factor: u16,
    pub dcqcn_t: u16,
    pub dcqcn_b: u32,
    pub rreduce_mperiod: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CcqCfg {
    pub num_elem: u32,
    pub ceq_id: u32,
    pub ceq_id_valid: bool,
    pub ceqe_mask: bool,
    pub shadow_read_threshold: u32,
    pub vsi_idx: u16,
    pub check_overflow: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QhashCfg {
    /// enum irdma_quad_hash_manage_type: 0..=2.
    pub manage: u32,
    /// enum irdma_quad_entry_type: 1..=6.
    pub entry_type: u32,
    pub vlan_valid: bool,
    pub ipv4_valid: bool,
    pub mac_addr: [u8; 6],
    pub vlan_id: u16,
    /// 0..=7: `vsi->qos[user_pri]`.
    pub user_pri: u8,
    pub qs_handle: [u16; 8],
    pub qp_num: u32,
    pub dest_ip: [u32; 4],
    pub src_ip: [u32; 4],
    pub dest_port: u16,
    pub src_port: u16,
}

/// How a completion is consumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consume {
    /// `irdma_sc_ccq_get_cqe_info`.
    GetCqeInfo,
    /// `irdma_sc_poll_for_cqp_op_done` for the WQE's own opcode.
    PollMatching,
    /// ... for another opcode: the CQE is consumed and skipped, then the poll times out.
    PollOther,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Qhash {
        q: QhashCfg,
        post_sq: bool,
    },
    /// The device completes the oldest outstanding WQE (nothing if none is outstanding).
    Complete {
        error: bool,
        maj: u16,
        min: u16,
        op_ret_val: u32,
        consume: Consume,
    },
    /// A CQE poll with nothing new.
    PollEmpty,
    Arm,
    PostSq,
    /// `irdma_cfg_ceq` (icrdma_cfg_ceq): GLINT_CEQCTL routing of a CEQ to an MSI-X vector.
    CfgCeq {
        ceq_id: u32,
        idx: u32,
        enable: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Case {
    pub cqp: CqpCfg,
    pub ccq: CcqCfg,
    pub create: CreateResponse,
    /// Kernel `max_done_count` (and udriver's): small, so timeouts take microseconds.
    pub max_done_count: u32,
    /// The CCQ-create completion's error, if any.
    pub ccq_create_error: Option<(u16, u16)>,
    pub steps: Vec<Step>,
    /// CQPTAIL.CQP_OP_ERR for the register-polled CCQ destroy, with these codes.
    pub destroy_op_err: Option<u32>,
}

fn sq_size(u: &mut Unstructured) -> Result<u32> {
    // Mostly small rings, so that a case wraps them; sometimes the largest; rarely an invalid size.
    Ok(match u.int_in_range(0..=99u8)? {
        0..=2 => u.arbitrary()?,
        3..=7 => 2048,
        n => 1 << [2, 2, 2, 3, 3, 3, 4, 4, 5, 6, 7, 8][usize::from(n) % 12],
    })
}

impl<'a> Arbitrary<'a> for QhashCfg {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(Self {
            manage: u.int_in_range(0..=2)?,
            entry_type: u.int_in_range(1..=6)?,
            vlan_valid: u.arbitrary()?,
            ipv4_valid: u.arbitrary()?,
            mac_addr: u.arbitrary()?,
            vlan_id: u.arbitrary()?,
            user_pri: u.int_in_range(0..=7)?,
            qs_handle: u.arbitrary()?,
            qp_num: u.arbitrary()?,
            dest_ip: u.arbitrary()?,
            src_ip: u.arbitrary()?,
            dest_port: u.arbitrary()?,
            src_port: u.arbitrary()?,
        })
    }
}

impl<'a> Arbitrary<'a> for Step {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(match u.int_in_range(0..=12u8)? {
            0..=4 => Step::Qhash { q: u.arbitrary()?, post_sq: u.ratio(7, 8)? },
            5..=8 => Step::Complete {
                error: u.ratio(1, 4)?,
                maj: u.arbitrary()?,
                min: u.arbitrary()?,
                op_ret_val: u.arbitrary()?,
                consume: match u.int_in_range(0..=5u8)? {
                    0..=2 => Consume::GetCqeInfo,
                    3 | 4 => Consume::PollMatching,
                    _ => Consume::PollOther,
                },
            },
            9 => Step::PollEmpty,
            10 => Step::Arm,
            11 => Step::PostSq,
            // CEQ ids the CQ context can name; vectors that fit MSIX_INDX (10:0).
            _ => Step::CfgCeq {
                ceq_id: u.int_in_range(0..=1023)?,
                idx: u.int_in_range(0..=2047)?,
                enable: u.arbitrary()?,
            },
        })
    }
}

impl<'a> Arbitrary<'a> for Case {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let sq = sq_size(u)?;
        let cqp = CqpCfg {
            sq_size: sq,
            struct_ver: u.arbitrary()?,
            hw_maj_ver: u.arbitrary()?,
            hw_min_ver: u.arbitrary()?,
            hmc_profile: u.arbitrary()?,
            ena_vf_count: u.arbitrary()?,
            ceqs_per_vf: u.arbitrary()?,
            disable_packed: u.arbitrary()?,
            rocev2_rto_policy: u.arbitrary()?,
            protocol_used: u.int_in_range(0..=2)?,
            cc_cfg_valid: u.arbitrary()?,
            min_dec_factor: u.arbitrary()?,
            min_rate: u.arbitrary()?,
            dcqcn_f: u.arbitrary()?,
            rai_factor: u.arbitrary()?,
            hai_factor: u.arbitrary()?,
            dcqcn_t: u.arbitrary()?,
            dcqcn_b: u.arbitrary()?,
            rreduce_mperiod: u.arbitrary()?,
        };
        let max_ring = sq.clamp(4, 2048);
        let ccq = CcqCfg {
            // Not 1: a 1-entry CCQ completes nothing in the kernel, and udriver refuses it (decision 25).
            num_elem: match u.ratio(1, 50)? {
                true => u.arbitrary::<u32>()?.max(2),
                false => u.int_in_range(2..=2 * max_ring + 2)?,
            },
            ceq_id: if u.ratio(1, 20)? { u.arbitrary()? } else { u.int_in_range(0..=1023)? },
            ceq_id_valid: u.arbitrary()?,
            ceqe_mask: u.arbitrary()?,
            shadow_read_threshold: u.arbitrary()?,
            vsi_idx: u.arbitrary()?,
            check_overflow: u.arbitrary()?,
        };
        let create = match u.int_in_range(0..=39u8)? {
            0 => CreateResponse::Error { errcodes: u.arbitrary()? },
            1 => CreateResponse::Never,
            2 => CreateResponse::Status { value: u.int_in_range(1..=u32::MAX)? },
            _ => CreateResponse::Done,
        };
        let ccq_create_error = if u.ratio(1, 30)? { Some((u.arbitrary()?, u.arbitrary()?)) } else { None };
        let n = u.int_in_range(0..=3 * max_ring.min(64) as usize)?;
        let mut steps = Vec::with_capacity(n);
        for _ in 0..n {
            steps.push(u.arbitrary()?);
        }
        let destroy_op_err = if u.ratio(1, 20)? { Some(u.arbitrary()?) } else { None };
        Ok(Case { cqp, ccq, create, max_done_count: u.int_in_range(1..=4)?, ccq_create_error, steps, destroy_op_err })
    }
}

/// `n` bytes of a xorshift64 stream from `state`, which moves on: reproducible inputs for cases built from a
/// fixed seed (the tests that need the same cases every run).
pub fn xorshift_bytes(state: &mut u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            *state as u8
        })
        .collect()
}
