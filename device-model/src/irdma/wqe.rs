//! CQP WQE decoding (hardware-facts §3.6, §3.7, §3.9): 64 bytes in, a typed command or a `WqeError` out.

#![forbid(unsafe_code)]

use super::qhash::{EntryType, QhashData, QhashKey};
use super::regs::Field;
use super::WqeError;

pub const IRDMA_CQP_WQE_SIZE: usize = 64;

// Generic header (qw3).
pub const IRDMA_CQPSQ_OPCODE: Field = Field::new(37, 32);
pub const IRDMA_CQPSQ_WQEVALID: Field = Field::bit(63);

// IRDMA_CQP_OP_* codes this device knows by name.
pub const IRDMA_CQP_OP_CREATE_CQ: u8 = 0x03;
pub const IRDMA_CQP_OP_DESTROY_CQ: u8 = 0x05;
pub const IRDMA_CQP_OP_NOP: u8 = 0x24;
pub const IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY: u8 = 0x25;

// Quad-hash WQE fields.
pub const IRDMA_CQPSQ_QHASH_MAC: Field = Field::new(47, 0); // qw0
pub const IRDMA_CQPSQ_QHASH_DEST_PORT: Field = Field::new(15, 0); // qw1
pub const IRDMA_CQPSQ_QHASH_SRC_PORT: Field = Field::new(31, 16); // qw1
pub const IRDMA_CQPSQ_QHASH_QPN: Field = Field::new(49, 32); // qw1
pub const IRDMA_CQPSQ_QHASH_QS_HANDLE: Field = Field::new(9, 0); // qw2
pub const IRDMA_CQPSQ_QHASH_VLANID: Field = Field::new(43, 32); // qw2
pub const IRDMA_CQPSQ_QHASH_ENTRYTYPE: Field = Field::new(44, 42); // qw3
pub const IRDMA_CQPSQ_QHASH_VLANVALID: Field = Field::bit(59); // qw3
pub const IRDMA_CQPSQ_QHASH_IPV4VALID: Field = Field::bit(60); // qw3
pub const IRDMA_CQPSQ_QHASH_MANAGE: Field = Field::new(62, 61); // qw3
/// IPv6 words: ADDR0/ADDR2 in 63:32, ADDR1/ADDR3 in 31:0 (qw4/5 source, qw6/7 destination).
pub const IRDMA_CQPSQ_QHASH_ADDR0: Field = Field::new(63, 32);
pub const IRDMA_CQPSQ_QHASH_ADDR1: Field = Field::new(31, 0);
pub const IRDMA_CQPSQ_QHASH_ADDR2: Field = Field::new(63, 32);
pub const IRDMA_CQPSQ_QHASH_ADDR3: Field = Field::new(31, 0);

// CQ create WQE fields (GEN2 widths for CQID/CEQID).
pub const IRDMA_CQPSQ_CQ_SHADOW_READ_THRESHOLD: Field = Field::new(17, 0); // qw2
pub const IRDMA_CQPSQ_CQ_CQID: Field = Field::new(18, 0); // qw3
pub const IRDMA_CQPSQ_CQ_CEQID: Field = Field::new(31, 22); // qw3
pub const IRDMA_CQPSQ_CQ_LPBLSIZE: Field = Field::new(45, 44); // qw3
pub const IRDMA_CQPSQ_CQ_CHKOVERFLOW: Field = Field::bit(46); // qw3
pub const IRDMA_CQPSQ_CQ_VIRTMAP: Field = Field::bit(47); // qw3
pub const IRDMA_CQPSQ_CQ_ENCEQEMASK: Field = Field::bit(48); // qw3
pub const IRDMA_CQPSQ_CQ_CEQIDVALID: Field = Field::bit(49); // qw3
pub const IRDMA_CQPSQ_TPHEN: Field = Field::bit(60); // qw3
pub const IRDMA_CQPSQ_CQ_AVOIDMEMCNFLCT: Field = Field::bit(61); // qw3
pub const IRDMA_CQPSQ_CQ_FIRSTPMPBLIDX: Field = Field::new(27, 0); // qw6

/// CQ ring alignment (CQ0 alignment, §3.3).
pub const IRDMA_CQ0_ALIGNMENT: u64 = 0x100;

/// `MANAGE` values (`enum irdma_quad_hash_manage_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Manage {
    Delete = 0,
    Add = 1,
    Modify = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QhashOp {
    pub manage: Manage,
    pub key: QhashKey,
    pub data: QhashData,
}

/// CREATE_CQ as far as this device implements it (the CCQ, physically contiguous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqCreate {
    pub cq_id: u32,
    pub cq_size: u64,
    pub ring_pa: u64,
    pub shadow_pa: u64,
    pub ceq_id: Option<u16>,
    pub shadow_read_threshold: u32,
    /// 64-byte CQEs (AVOIDMEMCNFLCT).
    pub extended_cqe: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Nop,
    CreateCq(CqCreate),
    DestroyCq { cq_id: u32 },
    ManageQhash(QhashOp),
}

/// One WQE as eight little-endian qwords.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wqe(pub [u64; 8]);

impl Wqe {
    pub fn from_bytes(bytes: &[u8; IRDMA_CQP_WQE_SIZE]) -> Self {
        let mut qw = [0u64; 8];
        for (q, chunk) in qw.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *q = u64::from_le_bytes(b);
        }
        Wqe(qw)
    }

    pub fn to_bytes(&self) -> [u8; IRDMA_CQP_WQE_SIZE] {
        let mut out = [0u8; IRDMA_CQP_WQE_SIZE];
        for (chunk, q) in out.chunks_exact_mut(8).zip(self.0) {
            chunk.copy_from_slice(&q.to_le_bytes());
        }
        out
    }

    pub fn header(&self) -> u64 {
        self.0[3]
    }

    pub fn opcode(&self) -> u8 {
        IRDMA_CQPSQ_OPCODE.get(self.header()) as u8
    }

    pub fn valid(&self) -> bool {
        IRDMA_CQPSQ_WQEVALID.is_set(self.header())
    }

    pub fn decode(&self) -> Result<Command, WqeError> {
        match self.opcode() {
            IRDMA_CQP_OP_NOP => {
                reserved(3, self.header(), IRDMA_CQPSQ_OPCODE.mask() | IRDMA_CQPSQ_WQEVALID.mask())?;
                Ok(Command::Nop)
            }
            IRDMA_CQP_OP_CREATE_CQ => decode_create_cq(&self.0).map(Command::CreateCq),
            IRDMA_CQP_OP_DESTROY_CQ => {
                // irdma_sc_cq_destroy repeats the create-time header flags: all of them are accepted.
                let allowed = CQ_HEADER_FIELDS | IRDMA_CQPSQ_CQ_VIRTMAP.mask() | IRDMA_CQPSQ_TPHEN.mask();
                reserved(3, self.header(), allowed)?;
                Ok(Command::DestroyCq { cq_id: IRDMA_CQPSQ_CQ_CQID.get(self.header()) as u32 })
            }
            IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY => decode_qhash(&self.0).map(Command::ManageQhash),
            other => Err(WqeError::UnsupportedOpcode(other)),
        }
    }
}

/// Fails if `word` has a bit outside `allowed`.
fn reserved(qw: u8, word: u64, allowed: u64) -> Result<(), WqeError> {
    let bits = word & !allowed;
    if bits == 0 {
        Ok(())
    } else {
        Err(WqeError::ReservedBits { qw, bits })
    }
}

/// An address from its two qwords (`lo_qw` holds ADDR2/ADDR3, `hi_qw` ADDR0/ADDR1, per §3.7).
fn decode_ip(ipv4: bool, lo_qw: u64, hi_qw: u64, lo_idx: u8) -> Result<[u32; 4], WqeError> {
    if ipv4 {
        reserved(lo_idx, lo_qw, IRDMA_CQPSQ_QHASH_ADDR3.mask())?;
        reserved(lo_idx + 1, hi_qw, 0)?;
        return Ok([IRDMA_CQPSQ_QHASH_ADDR3.get(lo_qw) as u32, 0, 0, 0]);
    }
    Ok([
        IRDMA_CQPSQ_QHASH_ADDR0.get(hi_qw) as u32,
        IRDMA_CQPSQ_QHASH_ADDR1.get(hi_qw) as u32,
        IRDMA_CQPSQ_QHASH_ADDR2.get(lo_qw) as u32,
        IRDMA_CQPSQ_QHASH_ADDR3.get(lo_qw) as u32,
    ])
}

fn decode_qhash(qw: &[u64; 8]) -> Result<QhashOp, WqeError> {
    let hdr = qw[3];
    let manage = match IRDMA_CQPSQ_QHASH_MANAGE.get(hdr) {
        0 => Manage::Delete,
        1 => Manage::Add,
        2 => Manage::Modify,
        m => return Err(WqeError::BadManage(m as u8)),
    };
    let code = IRDMA_CQPSQ_QHASH_ENTRYTYPE.get(hdr);
    let entry_type = EntryType::from_code(code).ok_or(WqeError::BadEntryType(code as u8))?;
    reserved(
        3,
        hdr,
        IRDMA_CQPSQ_OPCODE.mask()
            | IRDMA_CQPSQ_QHASH_ENTRYTYPE.mask()
            | IRDMA_CQPSQ_QHASH_VLANVALID.mask()
            | IRDMA_CQPSQ_QHASH_IPV4VALID.mask()
            | IRDMA_CQPSQ_QHASH_MANAGE.mask()
            | IRDMA_CQPSQ_WQEVALID.mask(),
    )?;
    reserved(0, qw[0], IRDMA_CQPSQ_QHASH_MAC.mask())?;
    let established = entry_type == EntryType::TcpEstablished;
    // SRC_PORT and the source address are written only for ESTABLISHED entries; elsewhere they are reserved.
    let src_port_mask = if established { IRDMA_CQPSQ_QHASH_SRC_PORT.mask() } else { 0 };
    reserved(1, qw[1], IRDMA_CQPSQ_QHASH_DEST_PORT.mask() | src_port_mask | IRDMA_CQPSQ_QHASH_QPN.mask())?;
    let vlan_valid = IRDMA_CQPSQ_QHASH_VLANVALID.is_set(hdr);
    let vlan_mask = if vlan_valid { IRDMA_CQPSQ_QHASH_VLANID.mask() } else { 0 };
    reserved(2, qw[2], IRDMA_CQPSQ_QHASH_QS_HANDLE.mask() | vlan_mask)?;
    let ipv4 = IRDMA_CQPSQ_QHASH_IPV4VALID.is_set(hdr);
    let dest_ip = decode_ip(ipv4, qw[6], qw[7], 6)?;
    let src_ip = if established {
        decode_ip(ipv4, qw[4], qw[5], 4)?
    } else {
        reserved(4, qw[4], 0)?;
        reserved(5, qw[5], 0)?;
        [0; 4]
    };
    let key = QhashKey {
        entry_type,
        ipv4,
        vlan: vlan_valid.then(|| IRDMA_CQPSQ_QHASH_VLANID.get(qw[2]) as u16),
        dest_ip,
        dest_port: IRDMA_CQPSQ_QHASH_DEST_PORT.get(qw[1]) as u16,
        src_ip,
        src_port: IRDMA_CQPSQ_QHASH_SRC_PORT.get(qw[1]) as u16,
    };
    let data = QhashData {
        qpn: IRDMA_CQPSQ_QHASH_QPN.get(qw[1]) as u32,
        mac: IRDMA_CQPSQ_QHASH_MAC.get(qw[0]),
        qs_handle: IRDMA_CQPSQ_QHASH_QS_HANDLE.get(qw[2]) as u16,
    };
    Ok(QhashOp { manage, key, data })
}

/// CQ create/destroy header bits this device accepts (VIRTMAP and TPHEN are refused separately at create).
const CQ_HEADER_FIELDS: u64 = IRDMA_CQPSQ_CQ_CQID.mask()
    | IRDMA_CQPSQ_CQ_CEQID.mask()
    | IRDMA_CQPSQ_OPCODE.mask()
    | IRDMA_CQPSQ_CQ_LPBLSIZE.mask()
    | IRDMA_CQPSQ_CQ_CHKOVERFLOW.mask()
    | IRDMA_CQPSQ_CQ_ENCEQEMASK.mask()
    | IRDMA_CQPSQ_CQ_CEQIDVALID.mask()
    | IRDMA_CQPSQ_CQ_AVOIDMEMCNFLCT.mask()
    | IRDMA_CQPSQ_WQEVALID.mask();

fn decode_create_cq(qw: &[u64; 8]) -> Result<CqCreate, WqeError> {
    let hdr = qw[3];
    if IRDMA_CQPSQ_CQ_VIRTMAP.is_set(hdr) {
        return Err(WqeError::BadField("VIRTMAP: PBL-mapped CQs are not supported"));
    }
    if IRDMA_CQPSQ_TPHEN.is_set(hdr) {
        return Err(WqeError::BadField("TPHEN: TPH is not supported"));
    }
    reserved(3, hdr, CQ_HEADER_FIELDS)?;
    reserved(2, qw[2], IRDMA_CQPSQ_CQ_SHADOW_READ_THRESHOLD.mask())?;
    let ring_pa = qw[4];
    if ring_pa == 0 || !ring_pa.is_multiple_of(IRDMA_CQ0_ALIGNMENT) {
        return Err(WqeError::BadField("CQ ring PA zero or not 0x100-aligned"));
    }
    if qw[5] == 0 || !qw[5].is_multiple_of(8) {
        return Err(WqeError::BadField("shadow area PA zero or not 8-byte aligned"));
    }
    Ok(CqCreate {
        cq_id: IRDMA_CQPSQ_CQ_CQID.get(hdr) as u32,
        cq_size: qw[0],
        ring_pa,
        shadow_pa: qw[5],
        ceq_id: IRDMA_CQPSQ_CQ_CEQIDVALID.is_set(hdr).then(|| IRDMA_CQPSQ_CQ_CEQID.get(hdr) as u16),
        shadow_read_threshold: IRDMA_CQPSQ_CQ_SHADOW_READ_THRESHOLD.get(qw[2]) as u32,
        extended_cqe: IRDMA_CQPSQ_CQ_AVOIDMEMCNFLCT.is_set(hdr),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: u64 = 0x0000_0011_2233_4455;

    /// G9 base: IPv4 ADD TCP_ESTABLISHED, local 10.0.0.1:4791, remote 10.0.0.2:5000, QPN 5, polarity 1.
    fn g9_established() -> Wqe {
        Wqe([
            0x0000_0011_2233_4455,
            0x0000_0005_1388_12B7,
            0,
            0xB000_0425_0000_0000,
            0x0000_0000_0A00_0002,
            0,
            0x0000_0000_0A00_0001,
            0,
        ])
    }

    fn qhash(w: &Wqe) -> QhashOp {
        match w.decode() {
            Ok(Command::ManageQhash(op)) => op,
            other => panic!("not a qhash op: {other:?}"),
        }
    }

    #[test]
    fn g9_ipv4_established_add_decodes_local_and_remote_sides() {
        let w = g9_established();
        assert!(w.valid());
        let op = qhash(&w);
        assert_eq!(op.manage, Manage::Add);
        assert_eq!(
            op.key,
            QhashKey {
                entry_type: EntryType::TcpEstablished,
                ipv4: true,
                vlan: None,
                dest_ip: [0x0A00_0001, 0, 0, 0],
                dest_port: 4791,
                src_ip: [0x0A00_0002, 0, 0, 0],
                src_port: 5000,
            }
        );
        assert_eq!(op.data, QhashData { qpn: 5, mac: MAC, qs_handle: 0 });
    }

    #[test]
    fn g9_syn_listener_decodes_without_a_remote_side() {
        let mut w = g9_established();
        w.0[1] = 0x0000_0005_0000_12B7;
        w.0[3] = 0xB000_0825_0000_0000;
        w.0[4] = 0;
        let op = qhash(&w);
        assert_eq!(op.key.entry_type, EntryType::TcpSyn);
        assert_eq!((op.key.dest_port, op.key.src_port, op.key.src_ip), (4791, 0, [0; 4]));
        assert_eq!(op.data.qpn, 5);
    }

    #[test]
    fn g9_delete_posted_with_polarity_0_has_valid_bit_clear() {
        let mut w = g9_established();
        w.0[3] = 0x1000_0425_0000_0000;
        assert!(!w.valid());
        assert_eq!(qhash(&w).manage, Manage::Delete);
    }

    #[test]
    fn g9_ipv6_vlan_listener_puts_word_0_in_qw7_high() {
        let w = Wqe([
            MAC,
            0x0000_0005_0000_12B7,
            0x0000_0064_0000_0000,
            0xA800_0825_0000_0000,
            0,
            0,
            1,
            0xFE80_0000_0000_0000,
        ]);
        let op = qhash(&w);
        assert!(!op.key.ipv4);
        assert_eq!(op.key.vlan, Some(100));
        assert_eq!(op.key.dest_ip, [0xFE80_0000, 0, 0, 1]);
        assert_eq!(op.key.entry_type, EntryType::TcpSyn);
    }

    #[test]
    fn malformed_qhash_wqes_are_rejected_by_variant() {
        let base = g9_established();
        let cases: [(usize, u64, WqeError); 8] = [
            (3, 0xF000_0425_0000_0000, WqeError::BadManage(3)),
            (3, 0xB000_0025_0000_0000, WqeError::BadEntryType(0)),
            (3, 0xB000_1C25_0000_0000, WqeError::BadEntryType(7)),
            (3, 0xB000_0425_0000_0001, WqeError::ReservedBits { qw: 3, bits: 1 }),
            (0, 0x0001_0011_2233_4455, WqeError::ReservedBits { qw: 0, bits: 1 << 48 }),
            (2, 0x0000_0064_0000_0000, WqeError::ReservedBits { qw: 2, bits: 0x64 << 32 }),
            (6, 0x0000_0001_0A00_0001, WqeError::ReservedBits { qw: 6, bits: 1 << 32 }),
            (1, 0x0004_0005_1388_12B7, WqeError::ReservedBits { qw: 1, bits: 1 << 50 }),
        ];
        for (qw, value, err) in cases {
            let mut w = base;
            w.0[qw] = value;
            assert_eq!(w.decode(), Err(err), "qw{qw} = {value:#x}");
        }
    }

    #[test]
    fn listener_with_a_source_port_is_malformed() {
        let mut w = g9_established();
        w.0[3] = 0xB000_0825_0000_0000;
        w.0[4] = 0;
        assert_eq!(w.decode(), Err(WqeError::ReservedBits { qw: 1, bits: 0x1388 << 16 }));
    }

    #[test]
    fn unknown_and_unimplemented_opcodes_are_unsupported() {
        for op in [0x00u64, 0x16, 0x2F, 0x3F] {
            let w = Wqe([0, 0, 0, (1 << 63) | (op << 32), 0, 0, 0, 0]);
            assert_eq!(w.decode(), Err(WqeError::UnsupportedOpcode(op as u8)));
        }
    }

    #[test]
    fn nop_decodes_and_bytes_round_trip() {
        let w = Wqe([0, 0, 0, 0x8000_0024_0000_0000, 0, 0, 0, 0]);
        assert_eq!(w.decode(), Ok(Command::Nop));
        assert_eq!(Wqe::from_bytes(&w.to_bytes()), w);
    }

    #[test]
    fn create_cq_for_the_ccq_decodes_ring_shadow_and_ceq() {
        // cq_size 2050, ring 0x10000, shadow 0x20000, CQID 0, CEQID 0 valid, CHKOVERFLOW.
        let hdr = (1 << 63) | (1 << 49) | (1 << 46) | (0x03 << 32);
        let w = Wqe([2050, 0x1234, 16, hdr, 0x10000, 0x20000, 0, 0]);
        assert_eq!(
            w.decode(),
            Ok(Command::CreateCq(CqCreate {
                cq_id: 0,
                cq_size: 2050,
                ring_pa: 0x10000,
                shadow_pa: 0x20000,
                ceq_id: Some(0),
                shadow_read_threshold: 16,
                extended_cqe: false,
            }))
        );
    }

    #[test]
    fn destroy_cq_accepts_the_create_time_flags_and_refuses_reserved_bits() {
        let hdr = (1u64 << 63) | (1 << 49) | (1 << 46) | (0x05 << 32);
        assert_eq!(Wqe([16, 0, 0, hdr, 0, 0, 0, 0]).decode(), Ok(Command::DestroyCq { cq_id: 0 }));
        let bad = Wqe([0, 0, 0, hdr | (1 << 20), 0, 0, 0, 0]);
        assert_eq!(bad.decode(), Err(WqeError::ReservedBits { qw: 3, bits: 1 << 20 }));
    }

    #[test]
    fn create_cq_with_virtual_map_or_misaligned_ring_is_rejected() {
        let hdr = (1u64 << 63) | (0x03 << 32);
        let virt = Wqe([16, 0, 0, hdr | (1 << 47), 0x10000, 0x20000, 0, 0]);
        assert!(matches!(virt.decode(), Err(WqeError::BadField(_))));
        let misaligned = Wqe([16, 0, 0, hdr, 0x10080, 0x20000, 0, 0]);
        assert!(matches!(misaligned.decode(), Err(WqeError::BadField(_))));
    }
}
