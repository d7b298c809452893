//! The packet templates as the kernel reads them. Expected values come from the kernel's headers and
//! hfi1's source (linux-source-6.12), cited per table.

use super::frame::DAMAGES;
use super::mad::{self, Am};
use super::opcodes::{self, Field};
use super::*;
use crate::target::{Mr, Qp, QpType, Target};
use device_model::hfi1::cable::wire::{
    ext_header_bytes, BTH_BYTES, ICRC_BYTES, LRH_BYTES, MAX_PACKET_BYTES, MIN_PACKET_BYTES,
};

const RC_QPN: u32 = 0x12;
const RC_PSN: u32 = 100;
const RC_PEER_PSN: u32 = 200;

fn target() -> Target {
    let qp = |kind, qpn, psn, peer_qpn, peer_psn| Qp { kind, qpn, psn, peer_qpn, peer_psn };
    Target {
        generation: 7,
        device: "hfi1_0".into(),
        port: 1,
        lid: 1,
        sm_lid: 3,
        peer_lid: 2,
        mtu: 4096,
        pkeys: vec![0xFFFF, 0x7FFF],
        qkey: 0x1111_1111,
        sl: 0,
        qps: vec![
            qp(QpType::Rc, RC_QPN, RC_PSN, 0x800, RC_PEER_PSN),
            qp(QpType::Rc, 0x13, 300, 0x801, 400),
            qp(QpType::Uc, 0x14, 500, 0x802, 600),
            qp(QpType::Ud, 0x16, 0, 0x804, 0),
        ],
        mr: Mr { addr: 0x7f00_0000_0000, len: 0x1_0000, rkey: 0x1234, lkey: 0x1235 },
        recreated: 0,
        kdeth_qp: 0x80,
    }
}

fn template(class: Class, name: &str) -> usize {
    class.opcodes().iter().position(|o| o.name == name).unwrap_or_else(|| panic!("{name}"))
}

fn one(r: Record) -> Frame {
    let f = decode(&encode(&[r]), &target());
    assert_eq!(f.len(), 1);
    f.into_iter().next().unwrap()
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// LRH + BTH: where the extension headers start on a packet without a GRH.
const EXT: usize = 20;

#[test]
fn every_handled_opcode_has_the_header_length_hfi1_splits_off() {
    // hdr_len_by_opcode (verbs.c:137-186): 12 + 8 + extension headers.
    let table: [(u8, usize); 47] = [
        (0x00, 20),
        (0x01, 20),
        (0x02, 20),
        (0x03, 24),
        (0x04, 20),
        (0x05, 24),
        (0x06, 36),
        (0x07, 20),
        (0x08, 20),
        (0x09, 24),
        (0x0A, 36),
        (0x0B, 40),
        (0x0C, 36),
        (0x0D, 24),
        (0x0E, 20),
        (0x0F, 24),
        (0x10, 24),
        (0x11, 24),
        (0x12, 32),
        (0x13, 48),
        (0x14, 48),
        (0x16, 24),
        (0x17, 24),
        (0xE4, 56),
        (0xE5, 56),
        (0xE0, 56),
        (0xE1, 56),
        (0xE2, 56),
        (0xE3, 56),
        (0xE7, 56),
        (0xE6, 56),
        (0x20, 20),
        (0x21, 20),
        (0x22, 20),
        (0x23, 24),
        (0x24, 20),
        (0x25, 24),
        (0x26, 36),
        (0x27, 20),
        (0x28, 20),
        (0x29, 24),
        (0x2A, 36),
        (0x2B, 40),
        (0x64, 28),
        (0x65, 32),
        // CNP has no entry there (it carries nothing behind the BTH) and the device model agrees.
        (0x80, 20),
        (0x80, 20),
    ];
    for (op, len) in table {
        let o = opcodes::lookup(op).unwrap_or_else(|| panic!("{op:#x} has a handler"));
        assert_eq!(LRH_BYTES + BTH_BYTES + o.ext_bytes(), len, "{}", o.name);
        assert_eq!(ext_header_bytes(op).map(usize::from), Some(o.ext_bytes()), "{} vs the device model", o.name);
    }
}

#[test]
fn the_templates_are_exactly_the_opcodes_opcode_handler_tbl_dispatches() {
    // verbs.c:188-242: RC 0x00-0x14, 0x16, 0x17; TID RDMA 0xE0-0xE7; UC 0x00-0x0B; UD 0x04, 0x05; CNP.
    let mut want: Vec<u8> = (0x00..=0x14).chain([0x16, 0x17]).chain(0xE0..=0xE7).chain(0x20..=0x2B).collect();
    want.extend([0x64, 0x65, 0x80]);
    want.sort();
    let mut got: Vec<u8> = opcodes::handled().map(|o| o.opcode).collect();
    got.sort();
    assert_eq!(got, want);
    let unhandled = opcodes::unhandled();
    assert_eq!(unhandled.len(), 256 - want.len());
    for name in opcodes::NO_PAYLOAD {
        assert!(opcodes::handled().any(|o| o.name == name), "{name}");
    }
    assert!(unhandled.iter().all(|o| !want.contains(o)));
}

#[test]
fn extension_fields_sit_where_the_kernel_structs_put_them() {
    // (opcode, field, offset behind the BTH): struct ib_reth/ib_atomic_eth and union ib_ehdrs
    // (ib_hdrs.h:48-90), the TID RDMA structs (tid_rdma_defs.h:12-71).
    let table = [
        ("RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Field::RethRkey, 8),
        ("RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Field::RethLen, 12),
        ("RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Field::ImmDt, 16),
        ("RC_ATOMIC_ACKNOWLEDGE", Field::AtomicAckData, 4),
        ("RC_COMPARE_SWAP", Field::AtomicRkey, 8),
        ("RC_COMPARE_SWAP", Field::AtomicSwap, 12),
        ("RC_COMPARE_SWAP", Field::AtomicCompare, 20),
        ("RC_SEND_ONLY_WITH_INVALIDATE", Field::Ieth, 0),
        ("UD_SEND_ONLY_WITH_IMMEDIATE", Field::DethSrcQp, 4),
        ("UD_SEND_ONLY_WITH_IMMEDIATE", Field::ImmDt, 8),
        ("TID_RDMA_READ_REQ", Field::RethVaddr, 8),
        ("TID_RDMA_READ_REQ", Field::TidFlowPsn, 24),
        ("TID_RDMA_READ_REQ", Field::TidFlowQp, 28),
        ("TID_RDMA_READ_RESP", Field::Aeth, 8),
        ("TID_RDMA_READ_RESP", Field::VerbsPsn, 28),
        ("TID_RDMA_WRITE_REQ", Field::RethLen, 20),
        ("TID_RDMA_WRITE_RESP", Field::TidFlowPsn, 24),
        ("TID_RDMA_WRITE_RESP", Field::TidFlowQp, 28),
        ("TID_RDMA_ACK", Field::TidFlowPsn, 20),
        ("TID_RDMA_ACK", Field::VerbsPsn, 24),
        ("TID_RDMA_ACK", Field::TidFlowQp, 28),
    ];
    for (name, field, offset) in table {
        let o = opcodes::handled().find(|o| o.name == name).unwrap();
        assert!(o.ext.contains(&(field, offset)), "{name} {field:?} at {offset}: {:?}", o.ext);
    }
    // Every TID RDMA header starts with KDETH's two words and ends with verbs_qp at 32.
    for o in opcodes::TID_RDMA {
        assert!(o.ext.starts_with(&[(Field::Kdeth0, 0), (Field::Kdeth1, 4)]), "{}", o.name);
        assert_eq!(o.ext.last(), Some(&(Field::VerbsQp, 32)), "{}", o.name);
    }
    // No two fields of one opcode overlap.
    for o in opcodes::handled() {
        let mut spans: Vec<(usize, usize)> = o.ext.iter().map(|&(f, at)| (at, at + f.bytes())).collect();
        spans.sort();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "{}: {spans:?}", o.name);
    }
}

#[test]
fn an_rc_send_only_reads_back_through_the_device_models_accessors() {
    let f = one(Record::new(Class::Rc, template(Class::Rc, "RC_SEND_ONLY")).payload(vec![0xAB; 61]));
    let p = f.wire();
    assert_eq!(p.opcode(), 0x04);
    assert_eq!((p.dest_qp(), p.psn()), (RC_QPN, RC_PSN));
    assert_eq!((p.dlid(), p.slid(), p.pkey()), (1, 2, 0xFFFF));
    assert_eq!((p.sc(), p.sl(), p.lnh()), (0, 0, 2));
    assert!(p.icrc_ok());
    assert_eq!(usize::from(p.lrh_pkt_len()) * 4, p.bytes.len());
    // 61 bytes of payload: 3 of pad, whole dwords.
    assert_eq!(p.pad(), 3);
    assert_eq!(p.header_bytes(), Some(EXT));
    assert_eq!(p.bytes.len(), EXT + 61 + 3 + ICRC_BYTES);
    assert_eq!(&p.bytes[EXT..EXT + 61], &[0xAB; 61][..]);
}

#[test]
fn extension_headers_carry_the_dictionarys_memory_region_and_qps() {
    let t = target();
    let w = one(Record::new(Class::Rc, template(Class::Rc, "RC_RDMA_WRITE_ONLY")).payload(vec![1; 64])).bytes;
    assert_eq!((be64(&w, EXT), be32(&w, EXT + 8), be32(&w, EXT + 12)), (t.mr.addr, t.mr.rkey, 64));
    let ack = one(Record::new(Class::Rc, template(Class::Rc, "RC_ACKNOWLEDGE")).raw32(5)).wire();
    // A response carries the QP's send PSN; AETH syndrome 0 (ACK) and the MSN.
    assert_eq!(ack.psn(), RC_PEER_PSN);
    assert_eq!(be32(&ack.bytes, EXT), 5);
    let ud = one(Record::new(Class::Ud, 1).raw32(0xDEAD_BEEF)).bytes;
    // DETH: Q_Key, source QP = the peer's QPN; then ImmDt (ib_hdrs.h:209-218).
    assert_eq!((be32(&ud, EXT), be32(&ud, EXT + 4), be32(&ud, EXT + 8)), (t.qkey, 0x804, 0xDEAD_BEEF));
    assert_eq!(u32::from_be_bytes([0, ud[13], ud[14], ud[15]]), 0x16);
}

#[test]
fn tid_rdma_goes_to_a_kdeth_destqp_with_kdeth_for_a_verbs_qp() {
    for (i, o) in opcodes::TID_RDMA.iter().enumerate() {
        let f = one(Record::new(Class::TidRdma, i).knob(at::CTXT, 1).payload(vec![0; 64]));
        let p = f.wire();
        // DestQP = RVT_KDETH_QP_PREFIX << 16 | ctxt (tid_rdma.c:197).
        assert_eq!(p.dest_qp(), 0x80_0001, "{}", o.name);
        let k0 = le32(&p.bytes, EXT);
        // KVer 1 (tid_rdma.c:1746); TIDCtrl non-zero only for the data the chip places (exp_rcv.h:43-50).
        assert_eq!(k0 >> 30, 1, "{}", o.name);
        assert_eq!((k0 >> 26) & 0x3, u32::from(o.expected), "{}", o.name);
        // J_KEY = TID_RDMA_JKEY (tid_rdma.c:54), in KDETH word 1's low byte.
        assert_eq!(le32(&p.bytes, EXT + 4) & 0xFF, 32, "{}", o.name);
        assert_eq!(be32(&p.bytes, EXT + 32), RC_QPN, "{} verbs_qp", o.name);
        // hfi1_kdeth_eager_rcv drops anything under LRH + BTH + KDETH(9 dwords) + CRC = 15 dwords (verbs.c:342).
        assert!(p.bytes.len() >= 15 * 4, "{}", o.name);
        assert!(p.icrc_ok());
    }
}

#[test]
fn smps_go_on_vl15_to_qp0_and_gsi_mads_to_qp1_with_its_qkey() {
    let t = target();
    let port_info = mad::OPA_SMA.iter().position(|a| a.id == mad::id::IB_SMP_ATTR_PORT_INFO).unwrap();
    let lr = one(Record::new(Class::OpaSmp, port_info)).wire();
    // SC 15, QP0, P_Key 0xFFFF (ud.c opa_smp_check 735, 780), LID-routed from the SM.
    assert_eq!((lr.sc(), lr.dest_qp(), lr.pkey()), (15, 0, 0xFFFF));
    assert_eq!((lr.dlid(), lr.slid()), (t.lid, t.sm_lid));
    let m = &lr.bytes[28..];
    // struct opa_smp (opa_smi.h:22-34): OPA base and class versions, Get, PortInfo, NPORT = 1.
    assert_eq!(&m[..4], &[0x80, 0x01, 0x80, 0x01]);
    assert_eq!(u16::from_be_bytes([m[16], m[17]]), 0x15);
    assert_eq!(be32(m, 20), 1 << 24);
    // The whole OPA MAD, no pad.
    assert_eq!(lr.bytes.len(), 28 + 2048 + ICRC_BYTES);
    assert!(lr.icrc_ok());

    let dr = one(Record::new(Class::OpaSmp, port_info).knob(at::METHOD, method::DIRECTED)).wire();
    assert_eq!((dr.dlid(), dr.slid(), dr.sc()), (0xFFFF, 0xFFFF, 15));
    let m = &dr.bytes[28..];
    // Directed route, hop pointer = hop count = 1, permissive DR LIDs, initial_path[1] the port
    // (opa_smi.h:39-45).
    assert_eq!((m[1], m[6], m[7]), (0x81, 1, 1));
    assert_eq!((be32(m, 32), be32(m, 36), m[40 + 1]), (u32::MAX, u32::MAX, t.port));

    let ib = one(Record::new(Class::IbSmp, 0)).wire();
    // An IB SMP is 256 bytes, base and class version 1 (process_subn 4583).
    assert_eq!(&ib.bytes[28..32], &[1, 1, 1, 1]);
    assert_eq!(ib.bytes.len(), 28 + 256 + ICRC_BYTES);

    let gsi = one(Record::new(Class::Gsi, 1)).wire();
    // QP1, Q_Key IB_QP1_QKEY (ib_mad.h:97), not SC 15 (ud.c:908), the PMA class.
    assert_eq!((gsi.dest_qp(), be32(&gsi.bytes, EXT), gsi.sc()), (1, 0x8001_0000, 0));
    assert_eq!(&gsi.bytes[28..32], &[0x80, 0x04, 0x80, 0x01]);
    assert!(gsi.bytes.len() - 28 - ICRC_BYTES <= 2048);
}

#[test]
fn mad_tables_cover_every_case_of_the_agents() {
    // subn_get_opa_sma's cases (mad.c:4057-4125) and subn_set_opa_sma's (4147-4195), plus Aggregate.
    let gets = [
        0x10, 0x11, 0x15, 0x16, 0x17, 0x82, 0x84, 0x85, 0x87, 0x8A, 0x32, 0x18, 0x8B, 0x90, 0x8F, 0x91, 0x31, 0x20,
        0x80,
    ];
    let sets = [0x15, 0x16, 0x17, 0x82, 0x84, 0x85, 0x87, 0x8A, 0x18, 0x90, 0x91, 0x31, 0x20, 0x80];
    for id in gets {
        assert!(mad::OPA_SMA.iter().any(|a| a.id == id), "Get {id:#x}");
    }
    for id in sets {
        assert!(mad::OPA_SMA.iter().any(|a| a.id == id && a.set), "Set {id:#x}");
    }
    // process_perf_opa (4712-4755): Gets of ClassPortInfo, PortStatus, DataPortCounters, ErrorPortCounters,
    // ErrorInfo; Sets of ClearPortStatus and ErrorInfo.
    let opa_pma = |id: u16, set: bool| {
        mad::GSI.iter().any(|a| a.id == id && a.base_version == 0x80 && a.mgmt_class == 0x04 && (a.set || !set))
    };
    for id in [0x01, 0x40, 0x42, 0x43, 0x44] {
        assert!(opa_pma(id, false), "PMA Get {id:#x}");
    }
    for id in [0x41, 0x44] {
        assert!(opa_pma(id, true), "PMA Set {id:#x}");
    }
}

#[test]
fn attribute_modifiers_are_laid_out_as_mad_h_reads_them() {
    // OPA_AM_NPORT 31:24 (mad.h:316-320), the VL arbitration section 23:16 (mad.c:2198), OPA_AM_CI_ADDR
    // 30:19 and OPA_AM_CI_LEN 18:13 (mad.h:354-364), the aggregate count 7:0 (mad.c:4221).
    let table = [
        (Am::Zero, 5, 0),
        (Am::NPort, 0, 0x0100_0000),
        (Am::NBlk, 2, 0x0100_0002),
        (Am::VlArbSection, 3, 0x0103_0000),
        (Am::CableInfo, 0, 63 << 13),
        (Am::CableInfo, 2, (128 << 19) | (63 << 13)),
        (Am::Aggregate, 0, 1),
        (Am::Aggregate, 117, 1),
    ];
    for (am, n, want) in table {
        assert_eq!(am.value(n), want, "{am:?} {n}");
    }
    assert_eq!(Am::NPort.with_count(Am::NPort.value(0), 2), 0x0200_0000);
    assert_eq!(Am::Aggregate.with_count(1, 200), 200);
}

#[test]
fn each_damage_breaks_what_it_names_and_nothing_else() {
    let write = template(Class::Rc, "RC_RDMA_WRITE_ONLY");
    let base = Record::new(Class::Rc, write).payload(vec![7; 62]);
    let clean = one(base.clone()).wire();
    assert_eq!(clean.pad(), 2);
    for d in DAMAGES {
        let p = one(base.clone().knob(at::DAMAGE, d.knob())).wire();
        let len_dwords = p.bytes.len() / 4;
        assert_eq!(p.icrc_ok(), d != Damage::IcrcCorrupt, "{d:?}");
        assert!(p.bytes.len() >= MIN_PACKET_BYTES && p.bytes.len().is_multiple_of(4), "{d:?}");
        match d {
            Damage::IcrcCorrupt => assert_eq!(p.bytes.len(), clean.bytes.len()),
            Damage::BadPad => assert_ne!(p.pad(), 2),
            Damage::LrhLenShort => assert_eq!(usize::from(p.lrh_pkt_len()), len_dwords - 1),
            Damage::LrhLenLong => assert_eq!(usize::from(p.lrh_pkt_len()), len_dwords + 1),
            // LNH says GRH, the bytes after the LRH are the BTH.
            Damage::WrongLnh => assert_eq!((p.lnh(), p.bytes[8]), (3, 0x0A)),
            // Half the RETH.
            Damage::TruncatedExt => assert_eq!(p.bytes.len(), EXT + 8 + ICRC_BYTES),
            Damage::TestEbp => assert!(p.test_ebp),
            // GRH version 6 and next header 0x1B are what hfi1_setup_9B_packet accepts (driver.c:1491-1495).
            Damage::BadGrh => {
                assert_eq!(p.lnh(), 3);
                assert!(p.bytes[8] >> 4 != 6 || p.bytes[8 + 6] != 0x1B);
            }
        }
        if !matches!(d, Damage::LrhLenShort | Damage::LrhLenLong) {
            assert_eq!(usize::from(p.lrh_pkt_len()), len_dwords, "{d:?}");
        }
    }
    // RAW64 bit 0 moves a bad GRH's fault from its version to its next header.
    let g = one(base.clone().knob(at::DAMAGE, Damage::BadGrh.knob()).raw64(1)).wire();
    assert_eq!((g.bytes[8] >> 4, g.bytes[8 + 6]), (6, 0x1A));
    // Below DAMAGE_FIRST nothing is damaged.
    assert_eq!(one(base.clone().knob(at::DAMAGE, DAMAGE_FIRST - 1)).bytes, clean.bytes);
}

#[test]
fn a_grh_is_version_6_with_next_header_bth_and_its_payload_length() {
    let p = one(Record::new(Class::Ud, 0).knob(at::FLAGS, flag::GRH).payload(vec![0; 32])).wire();
    assert_eq!(p.lnh(), 3);
    // struct ib_grh (ib_verbs.h:788-795), IB_GRH_VERSION and IB_GRH_NEXT_HDR (ib_hdrs.h:27-34).
    assert_eq!(p.bytes[8] >> 4, 6);
    assert_eq!(p.bytes[8 + 6], 0x1B);
    assert_eq!(usize::from(u16::from_be_bytes([p.bytes[12], p.bytes[13]])), p.bytes.len() - 48);
    assert_eq!(p.bth_offset(), Ok(48));
    assert_eq!(p.opcode(), 0x64);
    assert!(p.icrc_ok());
}

#[test]
fn an_unhandled_opcode_goes_to_a_verbs_qp_or_with_ctxt_to_a_kdeth_destqp() {
    let user_kdeth = opcodes::unhandled().iter().position(|&o| o == 0xC0).unwrap();
    let verbs = one(Record::new(Class::NoHandler, user_kdeth)).wire();
    assert_eq!((verbs.opcode(), verbs.dest_qp()), (0xC0, RC_QPN));
    let kdeth = one(Record::new(Class::NoHandler, user_kdeth).knob(at::CTXT, 0x81)).wire();
    // DestQP[23:16] = RCV_BTH_QP's KDETH_QP (chip.c init_kdeth_qp), the context below.
    assert_eq!(kdeth.dest_qp(), 0x80_0001);
}

#[test]
fn bad_lnh_packets_carry_the_raw_and_ip_lnhs_with_a_correct_icrc() {
    for i in 0..2 {
        let f = one(Record::new(Class::BadLnh, i).payload(vec![3; 20]));
        let p = f.wire();
        assert_eq!(p.lnh(), i as u8);
        assert!(p.icrc_ok());
        assert_eq!(usize::from(p.lrh_pkt_len()) * 4, p.bytes.len());
    }
}

fn classes_and_opcodes(frames: &[Frame]) -> Vec<(Class, u8)> {
    frames.iter().map(|f| (f.class, f.wire().opcode())).collect()
}

#[test]
fn every_seed_decodes_to_sound_packets_and_together_they_cover_every_template() {
    let t = target();
    let seeds = seeds(&t);
    let mut frames = Vec::new();
    for s in &seeds {
        let f = decode(s, &t);
        assert_eq!(f.len(), records(s).len());
        for fr in &f {
            let p = fr.wire();
            assert!(p.icrc_ok(), "{}", fr.describe());
            assert_eq!(usize::from(p.lrh_pkt_len()) * 4, p.bytes.len(), "{}", fr.describe());
            assert!(!fr.test_ebp);
        }
        frames.extend(f);
    }
    let seen = classes_and_opcodes(&frames);
    for class in [Class::Rc, Class::Uc, Class::Ud, Class::TidRdma, Class::Cnp] {
        for o in class.opcodes() {
            assert!(seen.contains(&(class, o.opcode)), "{}", o.name);
        }
    }
    assert!(seen.iter().any(|&(c, _)| c == Class::NoHandler));
    let mads: Vec<(Class, u8, u16)> = frames
        .iter()
        .filter(|f| f.is_mad())
        .map(|f| (f.class, f.bytes[28 + 3], u16::from_be_bytes([f.bytes[28 + 16], f.bytes[28 + 17]])))
        .collect();
    for (class, table) in [(Class::OpaSmp, mad::OPA_SMA), (Class::IbSmp, mad::IB_SMA), (Class::Gsi, mad::GSI)] {
        for a in table {
            assert!(mads.contains(&(class, mad::IB_MGMT_METHOD_GET, a.id)), "{class:?} Get {}", a.name);
            if a.set && seeds::SEEDED_SETS.contains(&a.id) {
                assert!(mads.contains(&(class, mad::IB_MGMT_METHOD_SET, a.id)), "{class:?} Set {}", a.name);
            }
        }
    }
    let lnhs: Vec<u8> = frames.iter().filter(|f| f.class == Class::BadLnh).map(|f| f.wire().lnh()).collect();
    assert!(lnhs.contains(&0) && lnhs.contains(&1));
    // Some seeds are batches.
    assert!(seeds.iter().any(|s| records(s).len() > 1));
}

#[test]
fn the_psn_batch_walks_a_message_through_consecutive_psns() {
    let t = target();
    let send =
        seeds(&t).into_iter().map(|s| decode(&s, &t)).find(|f| f.len() == 3 && f[0].wire().opcode() == 0x00).unwrap();
    let psns: Vec<u32> = send.iter().map(|f| f.wire().psn()).collect();
    assert_eq!(psns, [RC_PSN, RC_PSN + 1, RC_PSN + 2]);
    // SEND_FIRST and SEND_MIDDLE carry exactly one MTU (rc.c checks pmtu).
    assert_eq!(send[0].wire().header_bytes().map(|h| send[0].bytes.len() - h - ICRC_BYTES), Some(4096));
}

/// xorshift64*: a deterministic stream for the sweeps.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

#[test]
fn decode_is_total_and_every_frame_is_a_wire_packet() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut empty = target();
    empty.qps.clear();
    empty.pkeys.clear();
    let targets = [target(), empty];
    for i in 0..4000 {
        let len = (rng.next() % 3000) as usize;
        let mut input = rng.bytes(len);
        // Markers at random places, sometimes many.
        for _ in 0..(rng.next() % 24) {
            let at = if input.is_empty() { 0 } else { (rng.next() as usize) % input.len() };
            input.splice(at..at, RECORD_MARKER);
        }
        // Now and then a huge record.
        if i % 97 == 0 {
            input.extend(rng.bytes(MAX_PACKET_BYTES + 100));
        }
        for t in &targets {
            let frames = decode(&input, t);
            assert!((1..=MAX_PACKETS_PER_EXEC).contains(&frames.len()), "{} frames", frames.len());
            for f in &frames {
                let n = f.bytes.len();
                assert!((MIN_PACKET_BYTES..=MAX_PACKET_BYTES).contains(&n) && n.is_multiple_of(4), "{n} bytes");
                let _ = f.describe();
            }
        }
    }
    assert_eq!(decode(&[], &targets[0]).len(), 1);
    assert_eq!(decode(&RECORD_MARKER.repeat(40), &targets[0]).len(), MAX_PACKETS_PER_EXEC);
}

#[test]
fn a_mutated_record_leaves_the_other_records_packets_unchanged() {
    let t = target();
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let batch = seeds(&t).into_iter().max_by_key(|s| records(s).len()).unwrap();
    let recs: Vec<Vec<u8>> = records(&batch).into_iter().map(<[u8]>::to_vec).collect();
    let before = decode(&batch, &t);
    let join = |rs: &[Vec<u8>]| rs.join(&RECORD_MARKER[..]);
    for _ in 0..500 {
        let k = (rng.next() as usize) % recs.len();
        let mut rs = recs.clone();
        let r = &mut rs[k];
        match rng.next() % 3 {
            0 if !r.is_empty() => {
                let i = (rng.next() as usize) % r.len();
                r[i] ^= 1 << (rng.next() % 8);
            }
            1 => {
                let i = (rng.next() as usize) % (r.len() + 1);
                r.insert(i, rng.next() as u8);
            }
            _ if !r.is_empty() => {
                let i = (rng.next() as usize) % r.len();
                r.remove(i);
            }
            _ => {}
        }
        if r.windows(4).any(|w| w == RECORD_MARKER) {
            continue;
        }
        let after = decode(&join(&rs), &t);
        assert_eq!(after.len(), before.len());
        for (j, (a, b)) in after.iter().zip(&before).enumerate() {
            if j != k {
                assert_eq!(a, b, "record {j} changed when record {k} was mutated");
            }
        }
    }
}

#[test]
fn the_batch_request_is_the_control_sockets_wire_batch_line() {
    let plain = one(Record::new(Class::Rc, 4));
    let flagged = one(Record::new(Class::Rc, 4).knob(at::FLAGS, flag::SC4).knob(at::DAMAGE, Damage::TestEbp.knob()));
    let line = batch_request("hfi1-wfr", &[plain.clone(), flagged.clone()], 250);
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["device"], "hfi1-wfr");
    assert_eq!(v["cmd"], "wire-batch");
    assert_eq!(v["wait_ms"], 250);
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    assert_eq!(v["packets"][0], serde_json::Value::String(hex(&plain.bytes)));
    assert_eq!(v["packets"][1]["packet_hex"], serde_json::Value::String(hex(&flagged.bytes)));
    assert_eq!((v["packets"][1]["sc4"].as_u64(), v["packets"][1]["test_ebp"].as_u64()), (Some(1), Some(1)));
    assert!(!line.contains('\n'));
}

#[test]
fn describe_names_the_template_its_fields_and_its_damage() {
    let write = template(Class::Rc, "RC_RDMA_WRITE_ONLY");
    let f = one(Record::new(Class::Rc, write).payload(vec![0; 64]).knob(at::DAMAGE, Damage::IcrcCorrupt.knob()));
    let d = f.describe();
    assert!(d.starts_with("RC RC_RDMA_WRITE_ONLY qpn 0x12 psn 100 len 64"), "{d}");
    assert!(d.ends_with(", ICRC corrupt"), "{d}");
    let smp = one(Record::new(Class::OpaSmp, 2)).describe();
    assert!(smp.contains("class 0x01 method 0x01 PORT_INFO am 0x1000000"), "{smp}");
}

#[test]
fn ib_pma_counter_seeds_select_the_port() {
    let t = target();
    let frames: Vec<Frame> = seeds(&t).iter().flat_map(|s| decode(s, &t)).collect();
    for id in [mad::id::IB_PMA_PORT_COUNTERS, mad::id::IB_PMA_PORT_COUNTERS_EXT] {
        let f = frames
            .iter()
            .find(|f| f.class == Class::Gsi && f.bytes[28] == 1 && be16(&f.bytes, 28 + 16) == id)
            .unwrap_or_else(|| panic!("{id:#x}"));
        // struct ib_pma_mad's data at 64 (ib_pma.h:28-32); port_select its second byte (ib_pma.h:67-70),
        // which pma_get_ib_portcounters compares with the port (mad.c:3256); the modifier 0.
        assert_eq!((f.bytes[28 + 64 + 1], be32(&f.bytes, 28 + 20)), (t.port, 0), "{id:#x}");
    }
}

#[test]
fn the_aggregate_seeds_segments_each_hold_their_attribute() {
    // smp_length_check (mad.c:31-37) refuses a segment shorter than its attribute: struct opa_node_info is
    // 44 bytes (opa_smi.h:76-90), struct opa_port_info 242 (opa_port_info.h:253-383), the SL/SC maps 32.
    let size_of = |id: u16| match id {
        mad::id::IB_SMP_ATTR_NODE_INFO => 44,
        mad::id::IB_SMP_ATTR_PORT_INFO => 242,
        mad::id::OPA_ATTRIB_ID_SL_TO_SC_MAP | mad::id::OPA_ATTRIB_ID_SC_TO_SL_MAP => 32,
        other => panic!("unexpected segment {other:#x}"),
    };
    let t = target();
    let aggregates: Vec<Frame> = seeds(&t)
        .iter()
        .flat_map(|s| decode(s, &t))
        .filter(|f| f.class == Class::OpaSmp && be16(&f.bytes, 28 + 16) == mad::id::OPA_ATTRIB_ID_AGGREGATE)
        .filter(|f| f.bytes[28 + 1] == mad::IB_MGMT_CLASS_SUBN_LID_ROUTED)
        .collect();
    assert_eq!(aggregates.len(), 2, "a Get and a Set");
    for f in aggregates {
        // LID-routed data follows the 32-byte header and M_Key; the count is the modifier's low byte.
        let (data, count) = (28 + 32, be32(&f.bytes, 28 + 20) & 0xFF);
        let mut at = data;
        for _ in 0..count {
            let (id, units) = (be16(&f.bytes, at), usize::from(be16(&f.bytes, at + 2) & 0x7F));
            assert!(units * 8 >= size_of(id), "segment {id:#x}: {} bytes", units * 8);
            at += 8 + units * 8;
        }
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
