//! KDETH packets against a context programmed as the kernel's TID RDMA programs it (hfi1_rcvctrl,
//! kern_set_hw_flow, kern_program_rcv_group) and the RHF bits its receive path decodes (common.h, driver.c,
//! tid_rdma.c hfi1_handle_kdeth_eflags): the expected values come from those, not from the model.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;

use super::*;
use crate::hfi1::cable::wire::WirePacket;
use crate::hfi1::regs::*;
use crate::hfi1::rxe::rhq::RHF_USE_EGR_BFR;
use crate::hfi1::rxe::test_context::{self, EAGER, ENTRIES, ENTSIZE};

const CTXT: usize = 2;
const FLOW: u32 = 3;
/// kern_set_hw_flow(0x12345): generation << 11, FLOW_VALID, HDR_SUPP_EN, both KEEP bits, W1C status.
const GEN: u32 = 0x12345;
const FLOW_VALUE: u64 = 0x0000_006F_091A_2800;
/// The context's expected range: RcvArray entries 2048.. (RCV_TID_CTRL base 256, 128 pair groups).
const TID_BASE: u64 = 2048;
/// TID pair 2 (entries 2052, 2053): 8 KiB at EVEN_BUF, 4 KiB at ODD_BUF (hfi1_put_tid PT_EXPECTED).
const EVEN_BUF: u64 = 0x1234_5000;
const ODD_BUF: u64 = 0x2000_0000;
/// TID RDMA opcodes (tid_rdma_defs.h): WRITE_REQ, READ_REQ, READ_RESP, ACK.
const WRITE_REQ: u8 = 0xE0;
const READ_REQ: u8 = 0xE4;
const READ_RESP: u8 = 0xE5;
const ACK: u8 = 0xE7;

/// Context 2 as hfi1_rcvctrl enables a kernel context with TID RDMA: RCV_HDR_SIZE 9, the expected range
/// with TID pair 2 programmed, flow 3 set as kern_set_hw_flow sets it, TID_FLOW_ENABLE, and `extra` control bits.
fn rxe(extra: u64) -> (Rxe, Counters) {
    rxe_keyed(extra, 0)
}

/// The same context with RCV_KEY_CTRL `key_ctrl` written first, as the kernel gives a context its J_KEY before
/// its TIDs and flows are programmed (file_ops.c user_init, tid_rdma.c hfi1_kern_exp_rcv_init).
fn rxe_keyed(extra: u64, key_ctrl: u64) -> (Rxe, Counters) {
    test_context::enabled("kdeth", CTXT, RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK | extra, |c, n| {
        c.write(kctxt_csr(RCV_KEY_CTRL, CTXT as u64), key_ctrl, n);
        c.write(kctxt_csr(RCV_HDR_SIZE, CTXT as u64), 9, n);
        c.write(kctxt_csr(RCV_TID_CTRL, CTXT as u64), (128 << 32) | (TID_BASE >> 3), n);
        c.write(RCV_ARRAY + 8 * (TID_BASE + 4), (1 << 63) | (2 << 36) | (EVEN_BUF >> 12), n);
        c.write(RCV_ARRAY + 8 * (TID_BASE + 5), (1 << 63) | (1 << 36) | (ODD_BUF >> 12), n);
        c.write(tid_flow_csr(CTXT as u64, u64::from(FLOW)), FLOW_VALUE, n);
    })
}

/// A KDETH packet as the kernel builds one: LRH (VL 0, BTH next), BTH (`opcode`, pad, DestQP
/// 0x80 << 16 | flow << 11 | ctxt, PSN), KDETH0 (little-endian), KDETH1 and the rest of the 36-byte TID RDMA
/// header, then `payload` bytes and the pad.
struct K {
    opcode: u8,
    kdeth0: u32,
    psn: u32,
    payload: usize,
    pad: u8,
}

fn kdeth0(offset: u32, tid: u32, tidctrl: u32, sh: bool) -> u32 {
    Packet::kdeth0(offset, true, tid, tidctrl) | (u32::from(sh) << KDETH_SH_SHIFT) | (KDETH_KVER << KDETH_KVER_SHIFT)
}

fn data(seq: u32, offset_64: u32, sh: bool) -> K {
    K { opcode: READ_RESP, kdeth0: kdeth0(offset_64, 2, 1, sh), psn: full_flow_psn(GEN, seq), payload: 4096, pad: 0 }
}

fn eager(opcode: u8, payload: usize) -> K {
    K { opcode, kdeth0: KDETH_KVER << KDETH_KVER_SHIFT, psn: 7, payload, pad: 0 }
}

impl K {
    fn wire(&self) -> WirePacket {
        let mut b = vec![0u8; 56];
        b[1] = 0x2;
        b[2..4].copy_from_slice(&2u16.to_be_bytes());
        let dwords = ((56 + self.payload + usize::from(self.pad) + 4) / 4) as u16;
        b[4..6].copy_from_slice(&dwords.to_be_bytes());
        b[6..8].copy_from_slice(&1u16.to_be_bytes());
        b[8] = self.opcode;
        b[9] = self.pad << 4;
        let qp = (0x80 << 16) | (FLOW << 11) | CTXT as u32;
        b[12..16].copy_from_slice(&qp.to_be_bytes());
        b[16..20].copy_from_slice(&self.psn.to_be_bytes());
        b[20..24].copy_from_slice(&self.kdeth0.to_le_bytes());
        b.extend((0..self.payload).map(|i| (i * 13) as u8));
        b.resize(b.len() + usize::from(self.pad), 0);
        WirePacket::seal(b, false, false).unwrap()
    }
}

fn judge_k(c: &mut Rxe, n: &Counters, k: &K) -> Result<Delivery, Refusal> {
    judge(c, CTXT, &k.wire(), n)
}

fn field(rhf: u64, shift: u32, mask: u64) -> u64 {
    (rhf >> shift) & mask
}

/// RcvType, RcvTypeErr, TidErr, UseEgrBfr of an entry, as rhf_rcv_type, rhf_rcv_type_err and the flag tests
/// of driver.c decode them.
fn decoded(rhf: u64) -> (u64, u64, bool, bool) {
    (field(rhf, 12, 7), field(rhf, 56, 7), rhf & (1 << 59) != 0, rhf & (1 << 15) != 0)
}

fn flow_raw(c: &Rxe) -> u64 {
    c.flows.read(CTXT, FLOW as usize).unwrap()
}

/// read_r_next_psn: the low 31 bits of the flow entry.
fn next_psn(c: &Rxe) -> u32 {
    (flow_raw(c) & 0x7FFF_FFFF) as u32
}

#[test]
fn eager_kdeth_packets_make_eager_entries_and_payload_goes_to_an_eager_buffer() {
    // (packet, eager used): READ_REQ carries the TID list, WRITE_REQ and ACK only headers.
    let table = [(eager(READ_REQ, 256), true), (eager(WRITE_REQ, 0), false), (eager(ACK, 0), false)];
    for (k, uses_eager) in table {
        let (mut c, n) = rxe(0);
        let d = judge_k(&mut c, &n, &k).unwrap();
        let plan = d.rhq.unwrap();
        assert_eq!(decoded(plan.rhf), (1, 0, false, uses_eager), "RHF_RCV_TYPE_EAGER, opcode {:#x}", k.opcode);
        // LRH + BTH + RCV_HDR_SIZE 9 dwords = 14 dwords against the RHF (hfi.h DEFAULT_RCVHDRSIZE).
        assert_eq!(field(plan.rhf, 44, 0x1FF), ENTSIZE - 2 - 14);
        assert_eq!(plan.rhf_at - plan.header_at, 56);
        assert_eq!(field(plan.rhf, 0, 0xFFF), ((56 + k.payload + 4) / 4) as u64, "PktLen with the ICRC");
        assert_eq!(plan.eager, uses_eager.then_some(EAGER));
        assert_eq!((d.kind, d.tid), (Kind::Eager, None));
    }
}

#[test]
fn in_sequence_expected_packets_are_placed_and_only_the_last_of_a_segment_makes_an_entry() {
    let (mut c, n) = rxe(0);
    // Three packets of a segment into TID pair 2's even entry (OM 64): SH on all but the last.
    let table = [(data(0, 0, true), EVEN_BUF, false), (data(1, 64, true), EVEN_BUF + 4096, false)];
    for (k, iova, entry) in table {
        let d = judge_k(&mut c, &n, &k).unwrap();
        assert_eq!(d.kind, Kind::Expected);
        let (placement, range) = d.tid.unwrap();
        assert_eq!((placement.iova, range), (iova, 56..56 + 4096));
        assert_eq!(d.rhq.is_some(), entry, "header suppression on SH with HDR_SUPP_EN");
    }
    let last = K { kdeth0: kdeth0(0, 2, 2, false), payload: 1000, pad: 0, ..data(2, 0, false) };
    let d = judge_k(&mut c, &n, &last).unwrap();
    assert_eq!(d.tid.unwrap().0.iova, ODD_BUF, "TIDCTRL 2: the odd entry of the pair");
    let plan = d.rhq.unwrap();
    assert_eq!(decoded(plan.rhf), (0, 0, false, false), "RHF_RCV_TYPE_EXPECTED, no eager buffer");
    assert_eq!(field(plan.rhf, 0, 0xFFF), (56 + 1000 + 4) / 4);
    assert_eq!(field(plan.rhf, 28, 0xF), 1, "the context's first entry: RcvSeq 1");
    // The flow now expects sequence 3 of its generation: what read_r_next_psn returns.
    assert_eq!(next_psn(&c), full_flow_psn(GEN, 3));
    assert_eq!((n.wire_rx_kdeth_expected.load(Relaxed), n.wire_rx_kdeth_suppressed.load(Relaxed)), (3, 2));
}

#[test]
fn flow_errors_make_expected_entries_with_the_kernels_receive_type_error_and_place_nothing() {
    let gen_mismatch = RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK;
    let seq_mismatch = RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK;
    // (packet, RcvTypeErr, status bit): RHF_RTE_EXPECTED_FLOW_GEN_ERR 4, RHF_RTE_EXPECTED_FLOW_SEQ_ERR 2.
    let table = [
        (K { psn: full_flow_psn(GEN + 1, 0), ..data(0, 0, true) }, 4, gen_mismatch),
        (K { psn: full_flow_psn(0xFFFFF, 0), ..data(0, 0, false) }, 4, gen_mismatch),
        (data(1, 0, true), 2, seq_mismatch),
        (data(2047, 0, false), 2, seq_mismatch),
    ];
    for (k, rte, status) in table {
        let (mut c, n) = rxe(0);
        let d = judge_k(&mut c, &n, &k).unwrap();
        assert_eq!(d.tid, None, "rte {rte}: nothing placed");
        let plan = d.rhq.expect("an error is never suppressed");
        assert_eq!(decoded(plan.rhf), (0, rte, false, false));
        assert_eq!(plan.rhf_at - plan.header_at, 56, "the header, for hfi1_handle_kdeth_eflags");
        let raw = flow_raw(&c);
        assert_eq!(raw & (gen_mismatch | seq_mismatch), status);
        assert_ne!(raw & RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK, 0, "KEEP_* keep the flow valid");
        assert_eq!(next_psn(&c), full_flow_psn(GEN, 0), "read_r_next_psn: still the first missing packet");
    }
}

/// One arrival of a recovery scenario, or the kernel's write of the flow.
enum Step {
    /// Sequence `seq` of generation `gen`, 2 KiB at 2 KiB steps of TID pair 2's even entry; `last` clears SH.
    Pkt { gen: u32, seq: u32, last: bool },
    /// kern_set_hw_flow(`gen`) on the live flow: sequence 0, the status bits written 1 (FLOW_VALUE has them).
    Program(u32),
}

/// What the kernel's receive path gets from a step: `None` when the packet is placed without an entry
/// (suppressed), `Some(rte)` for an EXPECTED entry with RcvTypeErr `rte` (0: the last of a segment; 2:
/// FLOW_SEQ_ERR, 4: FLOW_GEN_ERR); whether its payload was placed; and the flow's next PSN afterwards
/// (read_r_next_psn).
type Seen = (Option<u64>, bool, u32);

/// The kernel's recoveries, as the flow table must carry them. A mismatch never advances the flow, so the
/// first FLOW_SEQ_ERR entry finds the first missing packet in the flow table (read_r_next_psn at
/// tid_rdma.c:2798 and 2960). From then on the kernel checks PSNs in software (HFI1_R_TID_SW_PSN, set at 2801
/// and 2958, cleared only where it writes the flow: 1812, 2554, 3501, 3528, 4920): it counts an entry whose PSN
/// equals its own next PSN as received without copying anything (2780-2795, 2971-2993), and clears its NAK
/// state there (2981), so that a later loss is NAKed again. So until the flow is written, every packet reports
/// FLOW_SEQ_ERR, and the ones in sequence are placed and advance the flow. The READ restarts from the segment's
/// start (restart_tid_rdma_read_req, 2639) and the kernel drops what lies behind that PSN (2766-2777); the WRITE
/// is NAKed at the next PSN (2956-2964, 3029-3035) and the sender resends from there (hfi1_tid_rdma_restart_req,
/// 3068-3071). RESYNC reprograms the flow on the next generation at sequence 0 (hfi1_rc_rcv_tid_rdma_resync,
/// 4911-4913; kern_set_hw_flow, 735-752, writing the status bits clears them): stale packets of the old
/// generation are FLOW_GEN_ERR, which the kernel drops (READ, 2813-2818) or NAKs (WRITE, 2997-2998), and the new
/// generation runs from 0, suppressed again.
#[test]
fn after_a_sequence_error_the_flow_reports_every_packet_until_the_kernel_writes_it() {
    use Step::*;
    let p = |seq, last| Pkt { gen: GEN, seq, last };
    let next = |seq| full_flow_psn(GEN, seq);
    let scenarios: [(&str, Vec<(Step, Seen)>); 5] = [
        (
            "WRITE: packet 1 lost, NAK from the next PSN, resend 1..3",
            vec![
                (p(0, false), (None, true, next(1))),
                (p(2, false), (Some(2), false, next(1))),
                (p(3, true), (Some(2), false, next(1))),
                (p(1, false), (Some(2), true, next(2))),
                (p(2, false), (Some(2), true, next(3))),
                (p(3, true), (Some(2), true, next(4))),
            ],
        ),
        (
            "WRITE: packet 1 lost, and packet 2 lost again in the resend: NAKed again from 2",
            vec![
                (p(0, false), (None, true, next(1))),
                (p(2, false), (Some(2), false, next(1))),
                (p(1, false), (Some(2), true, next(2))),
                (p(3, true), (Some(2), false, next(2))),
                (p(2, false), (Some(2), true, next(3))),
                (p(3, true), (Some(2), true, next(4))),
            ],
        ),
        (
            "READ: packet 2 lost, the segment requested again from its start",
            vec![
                (p(0, false), (None, true, next(1))),
                (p(1, false), (None, true, next(2))),
                (p(3, true), (Some(2), false, next(2))),
                (p(0, false), (Some(2), false, next(2))),
                (p(1, false), (Some(2), false, next(2))),
                (p(2, false), (Some(2), true, next(3))),
                (p(3, true), (Some(2), true, next(4))),
            ],
        ),
        (
            "duplicates of a whole segment after it completed (an RC retry)",
            vec![
                (p(0, false), (None, true, next(1))),
                (p(1, true), (Some(0), true, next(2))),
                (p(0, false), (Some(2), false, next(2))),
                (p(1, true), (Some(2), false, next(2))),
                (p(2, false), (Some(2), true, next(3))),
            ],
        ),
        (
            "RESYNC: the flow on the next generation, stale packets of the old one",
            vec![
                (p(0, false), (None, true, next(1))),
                (p(2, false), (Some(2), false, next(1))),
                (Program(GEN + 1), (None, false, full_flow_psn(GEN + 1, 0))),
                (p(3, true), (Some(4), false, full_flow_psn(GEN + 1, 0))),
                (Pkt { gen: GEN + 1, seq: 0, last: false }, (None, true, full_flow_psn(GEN + 1, 1))),
                (Pkt { gen: GEN + 1, seq: 1, last: true }, (Some(0), true, full_flow_psn(GEN + 1, 2))),
            ],
        ),
    ];
    let status = RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK | RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK;
    for (name, steps) in scenarios {
        let (mut c, n) = rxe(0);
        for (i, (step, (entry, placed, next_after))) in steps.into_iter().enumerate() {
            match step {
                Pkt { gen, seq, last } => {
                    let k = K { psn: full_flow_psn(gen, seq), payload: 2048, ..data(seq, 32 * seq, !last) };
                    let d = judge_k(&mut c, &n, &k).unwrap();
                    let rte = d.rhq.map(|plan| decoded(plan.rhf).1);
                    assert_eq!(rte, entry, "{name}, step {i}: the entry");
                    let at = d.tid.map(|(placement, _)| placement.iova);
                    let want = placed.then_some(EVEN_BUF + 2048 * u64::from(seq));
                    assert_eq!(at, want, "{name}, step {i}: placed only in sequence");
                }
                Program(gen) => {
                    let value = (u64::from(gen) << 11) | (FLOW_VALUE & !(u64::from(GEN) << 11));
                    c.write(tid_flow_csr(CTXT as u64, u64::from(FLOW)), value, &n);
                    assert_eq!(flow_raw(&c) & status, 0, "{name}: kern_set_hw_flow clears the status");
                }
            }
            assert_eq!(next_psn(&c), next_after, "{name}, step {i}: read_r_next_psn");
        }
    }
}

#[test]
fn tid_errors_make_entries_with_tid_err_and_leave_the_flow_where_it_was() {
    let table = [
        // TID pair 600 (entry 1200) lies beyond the context's 1024 entries.
        (K { kdeth0: kdeth0(0, 600, 1, true), ..data(0, 0, true) }, RxResult::TidOutOfRange),
        // Pair 3 was never programmed.
        (K { kdeth0: kdeth0(0, 3, 1, true), ..data(0, 0, true) }, RxResult::TidInvalidEntry),
        // 4 KiB at offset 8 KiB - 64 of the 8 KiB even buffer.
        (K { kdeth0: kdeth0(127, 2, 1, true), ..data(0, 0, true) }, RxResult::BufferOverrun),
        // The odd entry holds 4 KiB.
        (K { kdeth0: kdeth0(1, 2, 2, false), ..data(0, 0, false) }, RxResult::BufferOverrun),
    ];
    for (k, why) in table {
        let (mut c, n) = rxe(0);
        let d = judge_k(&mut c, &n, &k).unwrap();
        assert_eq!(d.tid, None, "{why:?}");
        assert_eq!(decoded(d.rhq.unwrap().rhf), (0, 0, true, false), "{why:?}: EXPECTED with RHF_TID_ERR");
        assert_eq!(next_psn(&c), full_flow_psn(GEN, 0), "{why:?}: the lost packet is still the next one");
        assert_eq!(flow_raw(&c) & (3 << 37), 0, "{why:?}: no flow status");
        let count = match why {
            RxResult::TidOutOfRange => &n.rx_tid_out_of_range,
            RxResult::TidInvalidEntry => &n.rx_tid_invalid_entry,
            _ => &n.rx_buffer_overrun,
        };
        assert_eq!(count.load(Relaxed), 1, "{why:?}");
    }
}

#[test]
fn malformed_kdeth_headers_make_error_entries() {
    let short = {
        let mut b = data(0, 0, false).wire().bytes[..40].to_vec();
        b[4..6].copy_from_slice(&11u16.to_be_bytes());
        WirePacket::seal(b[..40].to_vec(), false, false).unwrap()
    };
    // (packet, RcvTypeErr): RHF_RTE_ERROR_KHDR_MIN_LEN_ERR 2, RHF_RTE_ERROR_KHDR_KVER_ERR 4.
    let kver = |v: u32| K { kdeth0: kdeth0(0, 2, 1, false) & !(3 << 30) | (v << 30), ..data(0, 0, false) }.wire();
    let table = [(short, 2, 40 + 4), (kver(0), 4, 56 + 4096 + 4), (kver(2), 4, 56 + 4096 + 4)];
    for (pkt, rte, len) in table {
        let (mut c, n) = rxe(0);
        let d = judge(&mut c, CTXT, &pkt, &n).unwrap();
        let plan = d.rhq.unwrap();
        assert_eq!(decoded(plan.rhf), (3, rte, false, false), "RHF_RCV_TYPE_ERROR");
        assert_eq!(field(plan.rhf, 0, 0xFFF), len as u64 / 4);
        assert_eq!((d.tid, next_psn(&c)), (None, full_flow_psn(GEN, 0)));
    }
}

#[test]
fn an_eager_kdeth_packet_without_eager_room_gets_tid_err_or_waits_with_dont_drop() {
    // 10000 bytes and the ICRC take 157 of a buffer's 256 blocks: one packet per buffer.
    let big = eager(READ_REQ, 10000);
    for (dont_drop, held) in [(false, false), (true, true)] {
        let (mut c, n) = rxe(if dont_drop { RCV_CTXT_CTRL_DONT_DROP_EGR_FULL_SMASK } else { 0 });
        for _ in 0..8 {
            assert!(judge_k(&mut c, &n, &big).unwrap().rhq.unwrap().rhf & RHF_USE_EGR_BFR != 0);
        }
        // Buffer 0 is the one the driver still reads (RCV_EGR_INDEX_HEAD 0).
        match judge_k(&mut c, &n, &big) {
            Err(Refusal::Hold(_)) => assert!(held),
            Ok(d) => {
                assert!(!held);
                // tid_rdma_tid_err: an EAGER entry with TidErr and no payload restarts the WRITE request.
                assert_eq!(decoded(d.rhq.unwrap().rhf), (1, 0, true, false));
                assert_eq!(n.rx_eager_full.load(Relaxed), 1);
            }
            Err(e) => panic!("{e:?}"),
        }
    }
}

#[test]
fn an_expected_packet_waiting_for_header_queue_room_changes_nothing_until_it_has_room() {
    let (mut c, n) = rxe(RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK);
    for _ in 0..ENTRIES - 1 {
        judge_k(&mut c, &n, &eager(ACK, 0)).unwrap();
    }
    // The last packet of a segment needs an entry; a mismatched one too.
    for k in [data(0, 0, false), data(5, 0, false)] {
        assert_eq!(judge_k(&mut c, &n, &k), Err(Refusal::Hold(crate::hfi1::rxe::rhq::Full::Rhq)));
        assert_eq!(flow_raw(&c) & 0x7FFF_FFFF | (flow_raw(&c) & (3 << 37)), u64::from(full_flow_psn(GEN, 0)));
    }
    // A suppressed packet needs no entry and goes through.
    assert_eq!(judge_k(&mut c, &n, &data(0, 0, true)).unwrap().rhq, None);
    c.write(uctxt_csr(RCV_HDR_HEAD, CTXT as u64), 16 * ENTSIZE, &n);
    assert!(judge_k(&mut c, &n, &data(1, 64, false)).unwrap().rhq.is_some());
    assert_eq!(next_psn(&c), full_flow_psn(GEN, 2));
    assert_eq!(n.rx_seq_mismatch.load(Relaxed), 0, "a held packet is not counted");
}

#[test]
fn without_tid_flow_enable_the_flow_is_not_consulted_and_every_packet_makes_an_entry() {
    let (mut c, n) = rxe(0);
    let k = kctxt_csr(RCV_CTXT_CTRL, CTXT as u64);
    let ctrl = RCV_CTXT_CTRL_ENABLE_SMASK | (3 << RCV_CTXT_CTRL_EGR_BUF_SIZE_SHIFT);
    c.write(k, ctrl, &n);
    let d = judge_k(&mut c, &n, &K { psn: full_flow_psn(1, 99), ..data(0, 0, true) }).unwrap();
    assert_eq!(d.tid.unwrap().0.iova, EVEN_BUF);
    assert_eq!(decoded(d.rhq.unwrap().rhf), (0, 0, false, false));
    assert_eq!(next_psn(&c), full_flow_psn(GEN, 0));
}

#[test]
fn packets_a_context_cannot_judge_are_dropped_by_cause() {
    let (mut c, n) = rxe(0);
    c.flows.write(CTXT, FLOW as usize, FLOW_VALUE & !RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK);
    assert_eq!(judge_k(&mut c, &n, &data(0, 0, true)), Err(Refusal::Drop("flow not valid")));
    assert_eq!(judge(&mut c, 1, &data(0, 0, true).wire(), &n), Err(Refusal::Drop("context disabled")));
    assert_eq!((n.rx_flow_invalid.load(Relaxed), n.rx_context_disabled.load(Relaxed)), (1, 1));
}

#[test]
fn a_corrupted_expected_packet_makes_an_icrc_err_entry_and_is_not_placed() {
    let (mut c, n) = rxe(0);
    let mut pkt = data(0, 0, true).wire();
    pkt.bytes[100] ^= 0xFF;
    let d = judge(&mut c, CTXT, &pkt, &n).unwrap();
    let rhf = d.rhq.expect("never suppressed").rhf;
    assert_ne!(rhf & (1 << 63), 0, "RHF_ICRC_ERR: hfi1_handle_kdeth_eflags drops it");
    assert_eq!((field(rhf, 12, 7), d.tid), (0, None));
    assert_eq!(next_psn(&c), full_flow_psn(GEN, 0), "the flow still expects it");
}

/// What the guest's TID RDMA steps count: the setup above is the kernel's own programming (8 eager buffers
/// outside the expected range, one TID pair inside it, one flow on a live generation); kern_clear_hw_flow then
/// parks the flow on KERN_GENERATION_RESERVED without HDR_SUPP_EN (tid_rdma.c:735-752, 772-778), and
/// PT_INVALID (BUF_SIZE 0) releases a TID without programming one.
#[test]
fn programmed_tids_and_flows_are_counted_apart_from_eager_buffers_parked_flows_and_invalidations() {
    let (mut c, n) = rxe(0);
    assert_eq!(n.rcv_array_expected_programmed.load(Relaxed), 2);
    assert_eq!(n.flows_programmed.load(Relaxed), 1);
    assert_eq!(n.flows_parked.load(Relaxed), 0);
    let parked = (0xF_FFFF << 11) | (0x6D << 32);
    c.write(tid_flow_csr(CTXT as u64, u64::from(FLOW)), parked, &n);
    assert_eq!(n.flows_parked.load(Relaxed), 1);
    assert_eq!(n.flows_programmed.load(Relaxed), 1);
    c.write(RCV_ARRAY + 8 * (TID_BASE + 4), 1 << 63, &n);
    assert_eq!(n.rcv_array_expected_programmed.load(Relaxed), 2);
}

/// hfi1_set_ctxt_jkey's RCV_KEY_CTRL: JOB_KEY_ENABLE (bit 33) and the key.
const fn job_key(key: u64) -> u64 {
    (1 << 33) | key
}

/// A user context is one whose receive job key is on with a key outside the kernel's 32..=63 (hfi.h
/// generate_jkey; tid_rdma.c TID_RDMA_JKEY 32 for kernel contexts): its programmed TIDs, its flow writes and
/// the expected packets placed for it are counted as a user's; the same work on a kernel context is not.
#[test]
fn tids_flows_and_expected_packets_of_a_user_context_are_counted_as_a_users() {
    // (RCV_KEY_CTRL, user?): uid 1000's key, root's (0), an unprivileged uid 5's (0x8005), the kernel's TID RDMA
    // key, the top of the kernel's range, a key with JOB_KEY_ENABLE clear, and hfi1_clear_ctxt_jkey's 0.
    let table = [
        (job_key(1000), true),
        (job_key(0), true),
        (job_key(0x8005), true),
        (job_key(32), false),
        (job_key(63), false),
        (1000, false),
        (0, false),
    ];
    for (key_ctrl, user) in table {
        let (mut c, n) = rxe_keyed(0, key_ctrl);
        judge_k(&mut c, &n, &data(0, 0, false)).unwrap();
        let all = (
            n.rcv_array_expected_programmed.load(Relaxed),
            n.flows_programmed.load(Relaxed),
            n.wire_rx_kdeth_expected.load(Relaxed),
        );
        assert_eq!(all, (2, 1, 1), "{key_ctrl:#x}");
        let users = (
            n.rcv_array_user_programmed.load(Relaxed),
            n.tidflow_user_writes.load(Relaxed),
            n.wire_rx_kdeth_user_expected.load(Relaxed),
        );
        assert_eq!(users, if user { (2, 1, 1) } else { (0, 0, 0) }, "{key_ctrl:#x}");
    }
}

/// PSM2 parks its 32 flows at open (every write counts, not only the valid ones), and an eager buffer of a
/// user context lies outside its expected range, so it is no programmed TID.
#[test]
fn every_flow_write_of_a_user_context_counts_and_its_eager_buffers_are_no_tids() {
    let (mut c, n) = rxe_keyed(0, job_key(1000));
    let before = n.tidflow_user_writes.load(Relaxed);
    for flow in 0..RXE_NUM_TID_FLOWS as u64 {
        c.write(tid_flow_csr(CTXT as u64, flow), 0, &n);
    }
    assert_eq!(n.tidflow_user_writes.load(Relaxed) - before, RXE_NUM_TID_FLOWS as u64);
    // Another context's flow page: not this user's.
    c.write(tid_flow_csr(CTXT as u64 + 1, 0), 0, &n);
    assert_eq!(n.tidflow_user_writes.load(Relaxed) - before, RXE_NUM_TID_FLOWS as u64);
    assert_eq!(n.rcv_array_user_programmed.load(Relaxed), 2, "the 8 eager entries are not counted");
}
