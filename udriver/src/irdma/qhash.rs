//! Quad-hash table management: the MANAGE_QUAD_HASH_TABLE_ENTRY WQE (reference 3.7).

use super::cqp::{irdma_sc_cqp_get_next_send_wqe_idx, irdma_sc_cqp_post_sq, IrdmaScCqp};
use super::defs::*;
use super::regs::Field;
use super::{IrdmaError, Result};

pub const IRDMA_CQPSQ_QHASH_MAC: Field = Field::new(47, 0);
pub const IRDMA_CQPSQ_QHASH_DEST_PORT: Field = Field::new(15, 0);
pub const IRDMA_CQPSQ_QHASH_SRC_PORT: Field = Field::new(31, 16);
pub const IRDMA_CQPSQ_QHASH_QPN: Field = Field::new(49, 32);
pub const IRDMA_CQPSQ_QHASH_QS_HANDLE: Field = Field::new(9, 0);
pub const IRDMA_CQPSQ_QHASH_VLANID: Field = Field::new(43, 32);
pub const IRDMA_CQPSQ_QHASH_ENTRYTYPE: Field = Field::new(44, 42);
pub const IRDMA_CQPSQ_QHASH_VLANVALID: Field = Field::bit(59);
pub const IRDMA_CQPSQ_QHASH_IPV4VALID: Field = Field::bit(60);
pub const IRDMA_CQPSQ_QHASH_MANAGE: Field = Field::new(62, 61);
pub const IRDMA_CQPSQ_QHASH_ADDR0: Field = Field::new(63, 32);
pub const IRDMA_CQPSQ_QHASH_ADDR1: Field = Field::new(31, 0);
pub const IRDMA_CQPSQ_QHASH_ADDR2: Field = Field::new(63, 32);
pub const IRDMA_CQPSQ_QHASH_ADDR3: Field = Field::new(31, 0);

/// IRDMA_MAX_USER_PRIORITY: entries of `vsi->qos[]`.
pub const IRDMA_MAX_USER_PRIORITY: usize = 8;

/// `enum irdma_quad_entry_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrdmaQuadEntryType {
    IrdmaQhashTypeTcpEstablished = 1,
    IrdmaQhashTypeTcpSyn = 2,
    IrdmaQhashTypeUdpUnicast = 3,
    IrdmaQhashTypeUdpMcast = 4,
    IrdmaQhashTypeRoceMcast = 5,
    IrdmaQhashTypeRocev2Hw = 6,
}

/// `enum irdma_quad_hash_manage_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrdmaQuadHashManageType {
    IrdmaQhashManageTypeDelete = 0,
    IrdmaQhashManageTypeAdd = 1,
    IrdmaQhashManageTypeModify = 2,
}

/// The part of `struct irdma_sc_vsi` the qhash WQE reads: the LAN queue-set handle per user priority.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IrdmaVsiQos {
    pub qs_handle: [u16; IRDMA_MAX_USER_PRIORITY],
}

/// `struct irdma_qhash_table_info`. Addresses are host-order u32 words, [0] most significant for IPv6;
/// `dest_*` is the local end, `src_*` the remote end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IrdmaQhashTableInfo {
    pub vsi: IrdmaVsiQos,
    pub manage: IrdmaQuadHashManageType,
    pub entry_type: IrdmaQuadEntryType,
    pub vlan_valid: bool,
    pub ipv4_valid: bool,
    pub mac_addr: [u8; 6],
    pub vlan_id: u16,
    pub user_pri: u8,
    pub qp_num: u32,
    pub dest_ip: [u32; 4],
    pub src_ip: [u32; 4],
    pub dest_port: u16,
    pub src_port: u16,
}

/// `ether_addr_to_u64`: mac[0] is the most significant byte.
pub fn ether_addr_to_u64(mac: &[u8; 6]) -> u64 {
    mac.iter().fold(0, |acc, b| acc << 8 | u64::from(*b))
}

/// `irdma_sc_manage_qhash_table_entry(cqp, info, scratch, post_sq)`. Stores qw0, qw6 (qw7 first for IPv6),
/// qw2, qw4/qw5 (ESTABLISHED only), qw1, then a write barrier, then the header qw3 carrying the valid bit.
/// -ENOMEM when the SQ has no free WQE; -EINVAL for a user priority outside `vsi.qs_handle`.
pub fn irdma_sc_manage_qhash_table_entry(
    cqp: &mut IrdmaScCqp,
    info: &IrdmaQhashTableInfo,
    scratch: u64,
    post_sq: bool,
) -> Result<()> {
    let qs_handle = *info
        .vsi
        .qs_handle
        .get(usize::from(info.user_pri))
        .ok_or_else(|| IrdmaError::Inval(format!("user priority {}", info.user_pri)))?;
    let mut idx = 0;
    irdma_sc_cqp_get_next_send_wqe_idx(cqp, scratch, &mut idx)?;
    let polarity = cqp.polarity;
    let wqe = cqp.wqe(idx)?;

    wqe.set_64bit_val(IRDMA_BYTE_0, IRDMA_CQPSQ_QHASH_MAC.prep(ether_addr_to_u64(&info.mac_addr)))?;
    let mut qw1 =
        IRDMA_CQPSQ_QHASH_QPN.prep(info.qp_num.into()) | IRDMA_CQPSQ_QHASH_DEST_PORT.prep(info.dest_port.into());
    let [d0, d1, d2, d3] = info.dest_ip.map(u64::from);
    if info.ipv4_valid {
        wqe.set_64bit_val(IRDMA_BYTE_48, IRDMA_CQPSQ_QHASH_ADDR3.prep(d0))?;
    } else {
        wqe.set_64bit_val(IRDMA_BYTE_56, IRDMA_CQPSQ_QHASH_ADDR0.prep(d0) | IRDMA_CQPSQ_QHASH_ADDR1.prep(d1))?;
        wqe.set_64bit_val(IRDMA_BYTE_48, IRDMA_CQPSQ_QHASH_ADDR2.prep(d2) | IRDMA_CQPSQ_QHASH_ADDR3.prep(d3))?;
    }
    let mut qw2 = IRDMA_CQPSQ_QHASH_QS_HANDLE.prep(qs_handle.into());
    if info.vlan_valid {
        qw2 |= IRDMA_CQPSQ_QHASH_VLANID.prep(info.vlan_id.into());
    }
    wqe.set_64bit_val(IRDMA_BYTE_16, qw2)?;
    if info.entry_type == IrdmaQuadEntryType::IrdmaQhashTypeTcpEstablished {
        qw1 |= IRDMA_CQPSQ_QHASH_SRC_PORT.prep(info.src_port.into());
        let [s0, s1, s2, s3] = info.src_ip.map(u64::from);
        if info.ipv4_valid {
            wqe.set_64bit_val(IRDMA_BYTE_32, IRDMA_CQPSQ_QHASH_ADDR3.prep(s0))?;
        } else {
            wqe.set_64bit_val(IRDMA_BYTE_40, IRDMA_CQPSQ_QHASH_ADDR0.prep(s0) | IRDMA_CQPSQ_QHASH_ADDR1.prep(s1))?;
            wqe.set_64bit_val(IRDMA_BYTE_32, IRDMA_CQPSQ_QHASH_ADDR2.prep(s2) | IRDMA_CQPSQ_QHASH_ADDR3.prep(s3))?;
        }
    }
    wqe.set_64bit_val(IRDMA_BYTE_8, qw1)?;
    let temp = IRDMA_CQPSQ_WQEVALID.prep(polarity.into())
        | IRDMA_CQPSQ_OPCODE.prep(IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY.into())
        | IRDMA_CQPSQ_QHASH_MANAGE.prep(info.manage as u64)
        | IRDMA_CQPSQ_QHASH_IPV4VALID.prep_bool(info.ipv4_valid)
        | IRDMA_CQPSQ_QHASH_VLANVALID.prep_bool(info.vlan_valid)
        | IRDMA_CQPSQ_QHASH_ENTRYTYPE.prep(info.entry_type as u64);
    // The valid bit must not reach the device before the rest of the WQE.
    wqe.dma_wmb();
    wqe.set_64bit_val(IRDMA_BYTE_24, temp)?;
    if post_sq {
        irdma_sc_cqp_post_sq(cqp)?;
    }
    Ok(())
}
