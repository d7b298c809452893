//! Quad-hash table management: the MANAGE_QUAD_HASH_TABLE_ENTRY WQE (reference 3.7).

#![forbid(unsafe_code)]

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::irdma::cqp::{irdma_sc_cqp_nop, IrdmaScCqp};
    use crate::irdma::regs::IrdmaRegisters::IRDMA_CQPDB;
    use crate::irdma::testdev::*;
    use std::sync::{Arc, Mutex};
    use IrdmaQuadHashManageType::*;

    fn wqe(cqp: &IrdmaScCqp, idx: u32) -> [u64; 8] {
        let w = cqp.wqe(idx).unwrap();
        std::array::from_fn(|i| w.get_64bit_val(i * 8).unwrap())
    }

    /// Moves the SQ to its second pass, where the valid bit is 0.
    fn to_second_pass(cqp: &mut IrdmaScCqp) {
        for i in 0..cqp.sq_size {
            irdma_sc_cqp_nop(cqp, 0, false).unwrap();
            cqp.complete_wqe(i).unwrap();
        }
    }

    #[test]
    fn qhash_wqes_match_the_g9_golden_examples_bit_for_bit() {
        struct Case {
            name: &'static str,
            info: IrdmaQhashTableInfo,
            second_pass: bool,
            want: [u64; 8],
        }
        let cases = [
            Case {
                name: "IPv4 ESTABLISHED add, polarity 1",
                info: g9_established(),
                second_pass: false,
                want: [
                    0x0000_0011_2233_4455,
                    0x0000_0005_1388_12B7,
                    0,
                    0xB000_0425_0000_0000,
                    0x0000_0000_0A00_0002,
                    0,
                    0x0000_0000_0A00_0001,
                    0,
                ],
            },
            Case {
                name: "IPv4 SYN listener, polarity 1",
                info: g9_syn_listener(),
                second_pass: false,
                want: [0x0000_0011_2233_4455, 0x0000_0005_0000_12B7, 0, 0xB000_0825_0000_0000, 0, 0, 0x0A00_0001, 0],
            },
            Case {
                name: "IPv4 ESTABLISHED delete, polarity 0",
                info: IrdmaQhashTableInfo { manage: IrdmaQhashManageTypeDelete, ..g9_established() },
                second_pass: true,
                want: [
                    0x0000_0011_2233_4455,
                    0x0000_0005_1388_12B7,
                    0,
                    0x1000_0425_0000_0000,
                    0x0000_0000_0A00_0002,
                    0,
                    0x0000_0000_0A00_0001,
                    0,
                ],
            },
            Case {
                name: "IPv6 SYN listener on fe80::1, VLAN 100, polarity 1",
                info: g9_ipv6_vlan_listener(),
                second_pass: false,
                want: [
                    0x0000_0011_2233_4455,
                    0x0000_0005_0000_12B7,
                    0x0000_0064_0000_0000,
                    0xA800_0825_0000_0000,
                    0,
                    0,
                    0x0000_0000_0000_0001,
                    0xFE80_0000_0000_0000,
                ],
            },
        ];
        for c in cases {
            let dev = FakeIrdma::scripted();
            let (_pool, mut cqp) = plain_cqp(&dev, 4);
            if c.second_pass {
                to_second_pass(&mut cqp);
            }
            let idx = cqp.sq_ring().head();
            dev.clear_writes();
            irdma_sc_manage_qhash_table_entry(&mut cqp, &c.info, 42, true).unwrap();
            assert_eq!(wqe(&cqp, idx), c.want, "{}", c.name);
            assert_eq!(cqp.scratch(idx), Some(42), "{}", c.name);
            assert_eq!(dev.writes_to(IRDMA_CQPDB), [(idx + 1) % 4], "{}", c.name);
        }
    }

    #[test]
    fn the_qs_handle_of_the_user_priority_lands_in_qw2() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = plain_cqp(&dev, 4);
        let mut vsi = IrdmaVsiQos::default();
        vsi.qs_handle[3] = 0x3FF;
        let info = IrdmaQhashTableInfo { vsi, user_pri: 3, ..g9_ipv6_vlan_listener() };
        irdma_sc_manage_qhash_table_entry(&mut cqp, &info, 0, false).unwrap();
        assert_eq!(wqe(&cqp, 0)[2], 0x0000_0064_0000_03FF);
    }

    /// Decision 20: ctrl.c irdma_sc_manage_qhash_table_entry indexes `vsi->qos[info->user_pri]` unchecked
    /// (IRDMA_MAX_USER_PRIORITY = 8 entries); udriver refuses a priority past them before taking a slot.
    #[test]
    fn decision_20_a_user_priority_past_the_8_qos_entries_is_refused_before_a_slot_is_taken() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = plain_cqp(&dev, 4);
        for user_pri in [8, 9, u8::MAX] {
            let bad = IrdmaQhashTableInfo { user_pri, ..g9_ipv6_vlan_listener() };
            let r = irdma_sc_manage_qhash_table_entry(&mut cqp, &bad, 0, false);
            assert!(matches!(r, Err(IrdmaError::Inval(_))), "user_pri {user_pri}");
            assert_eq!(r.err().map(|e| e.to_errno()), Some(-libc::EINVAL));
        }
        assert_eq!((cqp.sq_ring().head(), cqp.requested_ops), (0, 0), "no SQ slot taken");
    }

    #[test]
    fn qhash_stores_every_other_qword_then_a_barrier_then_the_header() {
        use MemOp::*;
        let established_v6 = IrdmaQhashTableInfo {
            ipv4_valid: false,
            dest_ip: [0xFE80_0000, 0, 0, 1],
            src_ip: [0xFE80_0000, 0, 0, 2],
            ..g9_established()
        };
        let cases = [
            ("IPv4 ESTABLISHED", g9_established(), vec![0, 48, 16, 32, 8]),
            ("IPv4 SYN", g9_syn_listener(), vec![0, 48, 16, 8]),
            ("IPv6 SYN VLAN", g9_ipv6_vlan_listener(), vec![0, 56, 48, 16, 8]),
            ("IPv6 ESTABLISHED", established_v6, vec![0, 56, 48, 16, 40, 32, 8]),
        ];
        for (name, info, body) in cases {
            let dev = FakeIrdma::scripted();
            let pool = Arc::new(crate::dma::DmaPool::new(dev.clone(), false));
            let log = Arc::new(Mutex::new(Vec::new()));
            let sq = RecordingMemory { inner: pool.alloc_contiguous(4 * 64).unwrap(), log: log.clone() };
            let ctx = pool.alloc_contiguous(64).unwrap();
            let mut cqp = cqp_with(&dev, &pool, 4, Box::new(sq), Box::new(ctx)).unwrap();
            irdma_sc_manage_qhash_table_entry(&mut cqp, &info, 0, true).unwrap();
            let log = log.lock().unwrap().clone();
            // The slot is zeroed first, then the WQE proper.
            let zeroing: Vec<MemOp> = (0..8).map(|i| Store { offset: i * 8, value: 0 }).collect();
            assert_eq!(log[..8], zeroing[..], "{name}");
            let mut order: Vec<Option<usize>> = log[8..]
                .iter()
                .map(|op| match op {
                    Store { offset, .. } => Some(*offset),
                    Wmb => None,
                })
                .collect();
            let header = order.pop();
            let barrier = order.pop();
            assert_eq!((barrier, header), (Some(None), Some(Some(24))), "{name}: barrier, then header last");
            assert_eq!(order, body.into_iter().map(Some).collect::<Vec<_>>(), "{name}");
        }
    }

    #[test]
    fn qhash_on_a_full_sq_returns_enomem_and_writes_nothing() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = plain_cqp(&dev, 4);
        for _ in 0..3 {
            irdma_sc_manage_qhash_table_entry(&mut cqp, &g9_established(), 0, false).unwrap();
        }
        let before = wqe(&cqp, 3);
        let r = irdma_sc_manage_qhash_table_entry(&mut cqp, &g9_established(), 0, true);
        assert_eq!(r.err().map(|e| e.to_errno()), Some(-libc::ENOMEM));
        assert_eq!(wqe(&cqp, 3), before);
        assert!(dev.writes_to(IRDMA_CQPDB).iter().all(|v| *v == 0), "only init's CQPDB <- 0");
    }

    #[test]
    fn mac_addresses_read_as_a_big_endian_48_bit_number() {
        assert_eq!(ether_addr_to_u64(&[0x00, 0x11, 0x22, 0x33, 0x44, 0x55]), 0x0011_2233_4455);
        assert_eq!(ether_addr_to_u64(&[0xFF; 6]), 0xFFFF_FFFF_FFFF);
    }
}
