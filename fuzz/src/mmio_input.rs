//! Input pieces of the `device_mmio` target that are plain data: DMA addresses, access widths, CQP WQEs
//! built from structured fields, and the read hook that tells the DMA oracle which CCQ ring a fetched
//! CREATE_CQ names.

use std::time::Duration;

use arbitrary::Arbitrary;
use device_model::irdma;

use crate::dma_oracle::ReadHook;

/// DMA layout of each engine: two mapped windows with a hole between them.
pub const WIN: [(u64, usize); 2] = [(0x10_0000, 0x1_0000), (0x30_0000, 0x1_0000)];
pub const HOLE: u64 = 0x20_0000;
/// Most operations one input runs: keeps a slow input from dominating.
pub const MAX_OPS: usize = 64;
/// Longest wait for an engine to finish queued work. Longer is a hang.
pub const IDLE_DEADLINE: Duration = Duration::from_secs(5);

/// An IOVA: inside a window (most of the time), in the hole, or anywhere.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Addr {
    Win { w: bool, off: u16 },
    Hole(u16),
    Raw(u64),
}

impl Addr {
    pub fn iova(self) -> u64 {
        match self {
            Addr::Win { w, off } => WIN[w as usize].0 + u64::from(off),
            Addr::Hole(off) => HOLE + u64::from(off),
            Addr::Raw(a) => a,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Width {
    W1,
    W2,
    W4,
    W8,
}

impl Width {
    pub fn bytes(self) -> usize {
        match self {
            Width::W1 => 1,
            Width::W2 => 2,
            Width::W4 => 4,
            Width::W8 => 8,
        }
    }
}

#[derive(Arbitrary, Debug)]
pub enum WqeCmd {
    Nop,
    CreateCq {
        size: u32,
        ring: Addr,
        shadow: Addr,
        ceq: Option<u8>,
        extended: bool,
        extra_qw3: u64,
    },
    DestroyCq {
        cq_id: u8,
    },
    Qhash {
        manage: u8,
        entry_type: u8,
        ipv4: bool,
        vlan: Option<u16>,
        mac: u64,
        ports: u32,
        qpn: u32,
        qs: u16,
        src: [u32; 4],
        dst: [u32; 4],
    },
    Raw([u64; 8]),
}

/// A CREATE_CQ the irdma device fetched names the ring it will write CQEs into.
pub fn irdma_read_hook() -> ReadHook {
    Box::new(|_iova, data| {
        let Ok(bytes) = <&[u8; irdma::wqe::IRDMA_CQP_WQE_SIZE]>::try_from(data) else { return Vec::new() };
        match irdma::wqe::Wqe::from_bytes(bytes).decode() {
            Ok(irdma::wqe::Command::CreateCq(c)) => {
                let cqe = if c.extended_cqe { irdma::ccq::IRDMA_EXTENDED_CQE_SIZE } else { irdma::ccq::IRDMA_CQE_SIZE };
                vec![(c.ring_pa, c.cq_size.saturating_mul(cqe))]
            }
            _ => Vec::new(),
        }
    })
}

pub fn build_wqe(cmd: WqeCmd, valid: bool) -> [u64; 8] {
    use irdma::wqe::*;
    let mut qw = [0u64; 8];
    let op = match cmd {
        WqeCmd::Nop => IRDMA_CQP_OP_NOP,
        WqeCmd::CreateCq { size, ring, shadow, ceq, extended, extra_qw3 } => {
            qw[0] = u64::from(size % 8192);
            qw[4] = ring.iova() & !(IRDMA_CQ0_ALIGNMENT - 1);
            qw[5] = shadow.iova() & !7;
            qw[3] = extra_qw3
                & (IRDMA_CQPSQ_CQ_LPBLSIZE.mask()
                    | IRDMA_CQPSQ_CQ_CHKOVERFLOW.mask()
                    | IRDMA_CQPSQ_CQ_ENCEQEMASK.mask());
            if let Some(c) = ceq {
                qw[3] |= IRDMA_CQPSQ_CQ_CEQID.put(u64::from(c % 8)) | IRDMA_CQPSQ_CQ_CEQIDVALID.put(1);
            }
            if extended {
                qw[3] |= IRDMA_CQPSQ_CQ_AVOIDMEMCNFLCT.put(1);
            }
            IRDMA_CQP_OP_CREATE_CQ
        }
        WqeCmd::DestroyCq { cq_id } => {
            qw[3] = IRDMA_CQPSQ_CQ_CQID.put(u64::from(cq_id % 2));
            IRDMA_CQP_OP_DESTROY_CQ
        }
        WqeCmd::Qhash { manage, entry_type, ipv4, vlan, mac, ports, qpn, qs, src, dst } => {
            qw[0] = IRDMA_CQPSQ_QHASH_MAC.put(mac);
            qw[1] = IRDMA_CQPSQ_QHASH_DEST_PORT.put(u64::from(ports & 0xFFFF))
                | if entry_type % 8 == 1 { IRDMA_CQPSQ_QHASH_SRC_PORT.put(u64::from(ports >> 16)) } else { 0 }
                | IRDMA_CQPSQ_QHASH_QPN.put(u64::from(qpn));
            qw[2] = IRDMA_CQPSQ_QHASH_QS_HANDLE.put(u64::from(qs))
                | vlan.map_or(0, |v| IRDMA_CQPSQ_QHASH_VLANID.put(u64::from(v)));
            qw[3] = IRDMA_CQPSQ_QHASH_ENTRYTYPE.put(u64::from(entry_type % 8))
                | IRDMA_CQPSQ_QHASH_VLANVALID.put(u64::from(vlan.is_some()))
                | IRDMA_CQPSQ_QHASH_IPV4VALID.put(u64::from(ipv4))
                | IRDMA_CQPSQ_QHASH_MANAGE.put(u64::from(manage % 4));
            let words = |w: [u32; 4]| -> (u64, u64) {
                if ipv4 {
                    (u64::from(w[0]), 0)
                } else {
                    ((u64::from(w[2]) << 32) | u64::from(w[3]), (u64::from(w[0]) << 32) | u64::from(w[1]))
                }
            };
            (qw[4], qw[5]) = words(src);
            (qw[6], qw[7]) = words(dst);
            IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY
        }
        WqeCmd::Raw(raw) => {
            qw = raw;
            (IRDMA_CQPSQ_OPCODE.get(raw[3])) as u8
        }
    };
    qw[3] = (qw[3] & !(IRDMA_CQPSQ_OPCODE.mask() | IRDMA_CQPSQ_WQEVALID.mask()))
        | IRDMA_CQPSQ_OPCODE.put(u64::from(op))
        | IRDMA_CQPSQ_WQEVALID.put(u64::from(valid));
    qw
}
