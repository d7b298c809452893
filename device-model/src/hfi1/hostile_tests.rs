//! The hostile chip (docs/observe.md, "Faults"): faults that edit the words the chip writes into host memory
//! (RHF, DMA'd RcvHdrTail, SDMA head write-back, PIO credit return) and the 8051's replies change exactly the
//! word they name, on the Nth matching event, for `count` events, and nothing else. Driven through the fabric
//! rig as the Linux hfi1 driver drives the chip; the truthful words come from the kernel's definitions
//! (common.h RHF_*, chip.h CR_* and HCMD_*, sdma.c sdma_gethead).

use super::*;

/// common.h: RHF_PKT_LEN (11:0), RHF_RCV_TYPE (14:12, IB = 2), RHF_USE_EGR_BFR (15), RHF_EGR_INDEX (26:16),
/// RHF_RCV_SEQ (31:28), RHF_EGR_OFFSET (43:32, 64-byte blocks), RHF_HDRQ_OFFSET (52:44), RHF_ICRC_ERR (63).
const RHF_RCV_TYPE_IB: u64 = 2 << 12;
const RHF_USE_EGR_BFR: u64 = 1 << 15;
const RHF_EGR_INDEX_SMASK: u64 = 0x7FF << 16;
const RHF_ICRC_ERR: u64 = 1 << 63;
/// chip.h CR_COUNTER_SMASK: the credit return's freed-block counter.
const CR_COUNTER_SMASK: u64 = 0x7FF;
/// chip.h DC_DC8051_CFG_HOST_CMD_1: COMPLETED (0), RETURN_CODE (15:8), RSP_DATA (63:16); HCMD_SUCCESS 2.
const HCMD_SUCCESS: u64 = 2;
const HCMD_LOAD_CONFIG_DATA: u64 = 0x01;
const HCMD_READ_CONFIG_DATA: u64 = 0x02;

/// An SMP takes 5 blocks of its send context: PBC and 284 bytes, padded to 64 (pio.c sc_buffer_alloc).
const SMP_BLOCKS: u64 = 5;

fn u64_at(h: &Hfi, at: u64) -> u64 {
    u64::from_le_bytes(read(h, at, 8).try_into().unwrap())
}

/// `pio_copy` of the SMP into the ring blocks from `block` (the driver's fill position).
fn pio_copy_at(h: &Hfi, packet: &[u8], block: u64) {
    let pbc = (15 << 12) | ((packet.len() / 4 + 2) as u64);
    let mut bytes = pbc.to_le_bytes().to_vec();
    bytes.extend_from_slice(packet);
    bytes.resize(bytes.len().div_ceil(64) * 64, 0);
    let base = TXE_PIO_SEND + (SEND_CTXT << 16) + 64 * block;
    for (q, chunk) in bytes.chunks(8).enumerate() {
        let sop = if q < 8 { SOP_DISTANCE } else { 0 };
        h.w(base + sop + 8 * q as u64, u64::from_le_bytes(chunk.try_into().unwrap()));
    }
}

/// general_interrupt: acknowledges `source` in CCE_INT_CLEAR so its next event sends a message again.
fn ack(h: &Hfi, source: u64) {
    h.w(CCE_INT_CLEAR + 8 * (source / 64), 1 << (source % 64));
}

/// Sends `n` SMPs from `a`'s VL15 send context to `b`'s control context 0 (DMA'd tail on), one at a time:
/// each lands (RcvAvail) and returns its credits (SendCredit) before the next. Returns, per packet, the RHF
/// of its entry, the DMA'd tail after it, and the credit return word after it.
fn smps(a: &Hfi, b: &Hfi, n: u64) -> Vec<(u64, u64, u64)> {
    let packet = smp();
    (0..n)
        .map(|i| {
            pio_copy_at(a, &packet, SMP_BLOCKS * i);
            assert!(b.irqs.wait(1), "RcvAvail for packet {i}");
            ack(b, RCVAVAIL_SOURCE);
            assert!(a.irqs.wait(2), "SendCredit for packet {i}");
            ack(a, SENDCREDIT_SOURCE + SEND_CTXT);
            // Entry i of 32 dwords; the RHF in its last two (rhf_offset = entsize - 2).
            (u64_at(b, HDRQ + 128 * i + 30 * 4), u64_at(b, TAIL), u64_at(a, CR_BASE + 8 * (SEND_CTXT % 8)))
        })
        .collect()
}

/// What the chip truthfully writes for SMP `i` (0-based) of a run: the RHF (72 dwords with the ICRC, IB,
/// eager, buffer 0 at 5 blocks per earlier packet, RcvSeq from 1, the 28-byte header against the RHF at
/// dword 30 - 7), the tail in dwords after it (32 per entry), and the credit counter (5 blocks per packet).
fn truth(i: u64) -> (u64, u64, u64) {
    let rhf = 72 | RHF_RCV_TYPE_IB | RHF_USE_EGR_BFR | ((i + 1) << 28) | ((SMP_BLOCKS * i) << 32) | (23 << 44);
    (rhf, 32 * (i + 1), SMP_BLOCKS * (i + 1))
}

fn arm(h: &Hfi, spec: &str) {
    let spec = crate::fault::FaultSpec::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    h.f.arm_fault(spec).unwrap();
}

/// Which word of each packet a case edits, and how.
type Edit = fn(u64) -> u64;

#[test]
fn an_rhf_or_tail_fault_edits_exactly_the_word_it_names_on_its_nth_event_for_count_events() {
    let same: Edit = |w| w;
    // (spec armed on the receiver, per packet: RHF edit, tail edit)
    let table: [(&str, [(Edit, Edit); 4]); 6] = [
        ("", [(same, same); 4]),
        (
            "rhf,ctxt=0,mask=0x7ff0000,value=0x7ff0000,nth=2",
            [(same, same), (|w| w | RHF_EGR_INDEX_SMASK, same), (same, same), (same, same)],
        ),
        (
            "rhf,xor=0x8000000000000000,nth=2,count=2",
            [(same, same), (|w| w ^ RHF_ICRC_ERR, same), (|w| w ^ RHF_ICRC_ERR, same), (same, same)],
        ),
        // Another context's entries do not count.
        ("rhf,ctxt=1,xor=0xfff", [(same, same); 4]),
        ("rcvhdrtail-wb,ctxt=0,value=0x7,nth=3", [(same, same), (same, same), (same, |_| 7), (same, same)]),
        ("rcvhdrtail-wb,xor=0x1,count=forever", [(same, |w| w ^ 1); 4]),
    ];
    for (spec, edits) in table {
        let (a, b) = pair();
        link_up(&a, &b);
        send_context(&a);
        control_context(&b);
        if !spec.is_empty() {
            arm(&b, spec);
        }
        let got = smps(&a, &b, 4);
        for (i, ((rhf, tail, _), (edit_rhf, edit_tail))) in got.into_iter().zip(edits).enumerate() {
            let (true_rhf, true_tail, _) = truth(i as u64);
            assert_eq!(rhf, edit_rhf(true_rhf), "{spec:?}: RHF of packet {i}");
            assert_eq!(tail, edit_tail(true_tail), "{spec:?}: DMA'd tail after packet {i}");
        }
        // The tail register the driver reads without DMA_RTAIL stays true (chip.c hfi1_rcvctrl).
        assert_eq!(b.r(uctxt_csr(RCV_HDR_TAIL, 0)), truth(3).1, "{spec:?}: RCV_HDR_TAIL");
        // The header and payload of the last packet are the packet's, whatever the RHF says.
        let packet = smp();
        assert_eq!(read(&b, HDRQ + 3 * 128 + 23 * 4, 28), packet[..28], "{spec:?}");
        assert_eq!(read(&b, EAGER + 64 * SMP_BLOCKS * 3, 256), packet[28..], "{spec:?}");
    }
}

#[test]
fn a_credit_return_fault_edits_that_send_contexts_return_on_its_nth_event() {
    let run = |spec: &str| {
        let (a, b) = pair();
        link_up(&a, &b);
        send_context(&a);
        control_context(&b);
        if !spec.is_empty() {
            arm(&a, spec);
        }
        smps(&a, &b, 3).into_iter().map(|(_, _, word)| word).collect::<Vec<_>>()
    };
    // Unarmed: the counter counts the freed blocks (pio.c sc_release_update reads CR_COUNTER), the rest of
    // the word (CR_CREDIT_RETURN_DUE_TO_*) the chip's reason, the same for each packet.
    let truthful = run("");
    for (i, word) in truthful.iter().enumerate() {
        assert_eq!(word & CR_COUNTER_SMASK, truth(i as u64).2, "counter after packet {i}");
        assert_eq!(word & !CR_COUNTER_SMASK, truthful[0] & !CR_COUNTER_SMASK, "reason after packet {i}");
    }
    let same: Edit = |w| w;
    let table: [(&str, [Edit; 3]); 3] = [
        ("credit-return,ctxt=159,mask=0x7ff,value=0x123,nth=2", [same, |w| (w & !CR_COUNTER_SMASK) | 0x123, same]),
        ("credit-return,xor=0x800,nth=1,count=2", [|w| w ^ 0x800, |w| w ^ 0x800, same]),
        ("credit-return,ctxt=158,value=0", [same; 3]),
    ];
    for (spec, edits) in table {
        let got = run(spec);
        for (i, ((word, truth), edit)) in got.into_iter().zip(&truthful).zip(edits).enumerate() {
            assert_eq!(word, edit(*truth), "{spec:?}: credit return after packet {i}");
        }
    }
}

#[test]
fn an_sdma_head_fault_edits_that_engines_write_back_on_its_nth_event_and_the_csr_stays_true() {
    let same: Edit = |w| w;
    let table: [(&str, [Edit; 3]); 4] = [
        ("", [same; 3]),
        ("sdma-head-wb,engine=0,xor=0x800,nth=2", [same, |w| w ^ 0x800, same]),
        ("sdma-head-wb,value=0xffff,count=forever", [|_| 0xFFFF; 3]),
        ("sdma-head-wb,engine=1,value=0", [same; 3]),
    ];
    for (spec, edits) in table {
        let (a, b) = pair();
        link_up(&a, &b);
        sdma_engine(&a);
        verbs_context(&b);
        if !spec.is_empty() {
            arm(&a, spec);
        }
        for (round, edit) in (0..3u64).zip(edits) {
            ud_packet_by_sdma(&a, 2 * round, false);
            a.w(SEND_DMA_TAIL, 2 * (round + 1));
            assert!(a.irqs.wait(3), "{spec:?}: SDmaIdle in round {round}");
            ack(&a, 224);
            // Two descriptors per packet: the head after round r is 2(r + 1) (sdma.c sdma_gethead).
            let head = 2 * (round + 1);
            assert_eq!(u64_at(&a, HEAD_HOME), edit(head), "{spec:?}: head written back in round {round}");
            assert_eq!(a.r(SEND_DMA_HEAD), head, "{spec:?}: SEND_DMA_HEAD in round {round}");
        }
    }
}

#[test]
fn an_8051_reply_fault_edits_host_cmd_1_for_its_command_type_only() {
    // (spec, per command of the sequence: the reply's edit)
    let same: Edit = |w| w;
    let table: [(&str, [Edit; 4]); 4] = [
        ("", [same; 4]),
        // RETURN_CODE 3 instead of HCMD_SUCCESS on the second READ_CONFIG_DATA only.
        (
            "dc8051-reply,cmd=read-config-data,mask=0xff00,value=0x300,nth=2",
            [same, same, |w| (w & !0xFF00) | 0x300, same],
        ),
        // COMPLETED never set, for every command type, from the first.
        ("dc8051-reply,mask=0x1,value=0,count=forever", [|w| w & !1; 4]),
        ("dc8051-reply,cmd=change-phy-state,xor=0xffff0000", [same; 4]),
    ];
    // LOAD_CONFIG_DATA of general field 0x0a (LOCAL_DEVICE_ID) = 0x1234, then three READ_CONFIG_DATA of it
    // (chip.h LOAD_DATA_FIELD_ID_SHIFT 40; read_8051_config's request has the field at the same place).
    let field = 0x0a << 40;
    let commands = [
        (HCMD_LOAD_CONFIG_DATA, field | 0x1234, 0),
        (HCMD_READ_CONFIG_DATA, field, 0x1234),
        (HCMD_READ_CONFIG_DATA, field, 0x1234),
        (HCMD_READ_CONFIG_DATA, field, 0x1234),
    ];
    for (spec, edits) in table {
        let (a, _b) = pair();
        if !spec.is_empty() {
            arm(&a, spec);
        }
        for (i, ((kind, data, rsp), edit)) in commands.into_iter().zip(edits).enumerate() {
            // do_8051_command: the request, then with REQ_NEW; HOST_CMD_1 polled; then cleared.
            let req = (kind << 8) | (data << 16);
            a.w(DC_DC8051_CFG_HOST_CMD_0, req);
            a.w(DC_DC8051_CFG_HOST_CMD_0, req | 1);
            let reply = (rsp << 16) | (HCMD_SUCCESS << 8) | 1;
            assert_eq!(a.r(DC_DC8051_CFG_HOST_CMD_1), edit(reply), "{spec:?}: reply to command {i}");
            assert_eq!(a.r(DC_DC8051_CFG_HOST_CMD_1), edit(reply), "{spec:?}: the reply stays until cleared");
            a.w(DC_DC8051_CFG_HOST_CMD_0, 0);
        }
    }
}

/// `reg-stuck` reaches every register the hostile chip names by the kernel's name, per context and per
/// engine as read_kctxt_csr (0x100 apart) and read_uctxt_csr (0x1000 apart) address them (chip.h), and its
/// `xor` flips the bits the driver reads. Offsets from chip_registers.h.
#[test]
fn reg_stuck_reaches_the_status_registers_the_driver_reads_by_their_kernel_names() {
    const RXE: u64 = 0x100_0000;
    const TXE: u64 = 0x180_0000;
    const DC_8051: u64 = 0x60_2000;
    let table: [(&str, u64); 19] = [
        ("RCV_HDR_TAIL[ctxt 0]", RXE + 0x30_0000),
        ("RCV_HDR_TAIL[ctxt 3]", RXE + 0x30_0000 + 3 * 0x1000),
        ("RCV_HDR_HEAD[ctxt 1]", RXE + 0x30_0008 + 0x1000),
        ("SEND_DMA_HEAD[engine 0]", TXE + 0x20_0028),
        ("SEND_DMA_HEAD[engine 15]", TXE + 0x20_0028 + 15 * 0x100),
        ("SEND_DMA_STATUS[engine 2]", TXE + 0x20_0008 + 2 * 0x100),
        ("SEND_DMA_ENG_ERR_STATUS[engine 1]", TXE + 0x20_0060 + 0x100),
        ("CCE_INT_STATUS[0]", 0x11_0800),
        ("CCE_INT_STATUS[11]", 0x11_0800 + 11 * 8),
        ("CCE_ERR_STATUS", 0x40),
        ("RCV_ERR_STATUS", RXE + 0x60),
        ("MISC_ERR_STATUS", 0x50_2000),
        ("SEND_PIO_ERR_STATUS", TXE + 0x40),
        ("SEND_DMA_ERR_STATUS", TXE + 0x60),
        ("SEND_EGRESS_ERR_STATUS", TXE + 0x80),
        ("SEND_ERR_STATUS", TXE + 0xE0),
        ("SEND_CTXT_ERR_STATUS[ctxt 159]", TXE + 0x10_0040 + 159 * 0x100),
        ("DC_DC8051_CFG_HOST_CMD_1", DC_8051 + 0x30),
        ("DC_DC8051_DBG_ERR_INFO_SET_BY_8051", DC_8051 + 0xD8),
    ];
    for (name, offset) in table {
        let (a, _b) = pair();
        let before = a.r(offset);
        arm(&a, &format!("reg-stuck,reg={name},mask=0xff00,value=0x5a00,xor=0x3"));
        let want = ((before & !0xFF00) | 0x5A00) ^ 0x3;
        assert_eq!(a.r(offset), want, "{name} at {offset:#x}");
    }
    // The DC's other flag registers and the 8051's state, as handle_8051_interrupt and the link code read them.
    for (name, offset) in [
        ("DCC_ERR_FLG", 0x60_0050),
        ("DC_LCB_ERR_FLG", 0x60_1300),
        ("DC_DC8051_ERR_FLG", DC_8051 + 0xE0),
        ("DC_DC8051_STS_CUR_STATE", DC_8051 + 0x60),
        ("DC_DC8051_CFG_EXT_DEV_1", DC_8051 + 0x120),
    ] {
        let (a, _b) = pair();
        arm(&a, &format!("reg-stuck,reg={name},mask=0xffffffffffffffff,value=0x1"));
        assert_eq!(a.r(offset), 1, "{name} at {offset:#x}");
    }
}
