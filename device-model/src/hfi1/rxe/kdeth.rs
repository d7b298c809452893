//! KDETH packets from the cable: TID RDMA as the receiving chip sees it (docs/hfi1-fabric.md, "TID RDMA on
//! the wire"). Runs under the RXE lock, from ingress.rs, once the port has routed a packet whose BTH
//! DestQP[23:16] is RCV_BTH_QP.KDETH_QP to the context in DestQP[7:0].
//!
//! The header queue takes LRH, BTH and RCV_HDR_SIZE dwords of KDETH header. TIDCTRL 0 makes an EAGER entry
//! (the payload in an eager buffer, TidErr instead when there is no eager room). Any other TIDCTRL is an
//! expected packet: checked against its flow (with RCV_CTXT_CTRL.TID_FLOW_ENABLE) and its TIDs (rcv.rs), its
//! payload placed there, and an EXPECTED entry written unless the flow suppresses headers and KDETH.SH asks
//! for it. A flow or TID error makes a header-only EXPECTED entry with the RHF error the kernel reads
//! (hfi1_handle_kdeth_eflags); a short or wrong-version KDETH header an ERROR entry. A packet that must wait
//! for room changes nothing until it is judged again.

#![forbid(unsafe_code)]

use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;

use super::flow::{FlowCheck, FlowEntry};
#[cfg(test)]
use super::rcv::full_flow_psn;
use super::rcv::{count_refusal, flow_refusal, Packet, Placement, RxResult};
use super::rhq::{
    Arrival, Plan, Refusal, RHF_RCV_TYPE_EAGER, RHF_RCV_TYPE_ERROR, RHF_RCV_TYPE_ERR_SHIFT, RHF_RCV_TYPE_EXPECTED,
    RHF_RTE_ERROR_KHDR_KVER_ERR, RHF_RTE_ERROR_KHDR_MIN_LEN_ERR, RHF_RTE_EXPECTED_FLOW_GEN_ERR,
    RHF_RTE_EXPECTED_FLOW_SEQ_ERR, RHF_TID_ERR,
};
use super::state::Rxe;
use crate::hfi1::cable::wire::{WirePacket, BTH_BYTES, ICRC_BYTES, LRH_BYTES};
use crate::hfi1::counters::Counters;
use crate::hfi1::regs::{
    RCV_CTXT_CTRL_ENABLE_SMASK, RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK, RCV_HDR_SIZE, RCV_HDR_SIZE_HDR_SIZE_MASK,
};

// KDETH word 0 fields beyond the ones placement reads (exp_rcv.h).
/// The sender asks for the receiver's urgent interrupt (RcvUrgent, docs/decisions.md).
pub const KDETH_INTR_SHIFT: u32 = 28;
pub const KDETH_SH_SHIFT: u32 = 29;
pub const KDETH_KVER_SHIFT: u32 = 30;
pub const KDETH_KVER_MASK: u32 = 0x3;
/// The KDETH version every TID RDMA packet carries (KDETH_RESET(kdeth0, KVER, 0x1)).
pub const KDETH_KVER: u32 = 1;
/// KDETH proper: its two words, which the chip must see to judge a packet.
pub const KDETH_BYTES: usize = 8;
/// The context number in a KDETH DestQP (tid_rdma.c ORs rcd->ctxt into the low bits).
pub const KDETH_DESTQP_CTXT_MASK: u32 = 0xFF;

/// Whether a KDETH packet carries KDETH.INTR (false when its KDETH does not fit in it).
pub fn intr(pkt: &WirePacket) -> bool {
    let at = pkt.bth_offset().unwrap_or(LRH_BYTES) + BTH_BYTES;
    pkt.bytes
        .get(at..at + 4)
        .is_some_and(|w| (u32::from_le_bytes([w[0], w[1], w[2], w[3]]) >> KDETH_INTR_SHIFT) & 1 != 0)
}

/// The receive context a KDETH DestQP names.
pub fn destqp_ctxt(dest_qp: u32) -> usize {
    (dest_qp & KDETH_DESTQP_CTXT_MASK) as usize
}

/// What the chip makes of a KDETH packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Not KDETH: an IB packet (ingress.rs's own path).
    Ib,
    /// TIDCTRL 0, with its payload in an eager buffer (or without payload).
    Eager,
    /// Placed through its TIDs; the entry was suppressed when the delivery has none.
    Expected,
    /// An error entry: the RHF says which.
    Error(&'static str),
}

/// Where a KDETH packet's pieces go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub kind: Kind,
    /// The header queue entry; `None` when header suppression hides the packet.
    pub rhq: Option<Plan>,
    /// The TID placement of an expected packet, with the payload's bytes in the packet.
    pub tid: Option<(Placement, Range<usize>)>,
}

/// Judges a KDETH packet for context `ctxt` and reserves what it takes. On success the context, the flow
/// and the eager state have moved past the packet; on refusal nothing changed but the drop counters.
pub fn judge(rxe: &mut Rxe, ctxt: usize, pkt: &WirePacket, counters: &Counters) -> Result<Delivery, Refusal> {
    // A suppressed packet takes no entry, so rhq_reserve's check would not see a disabled context.
    if rxe.ctxt_ctrl(ctxt) & RCV_CTXT_CTRL_ENABLE_SMASK == 0 {
        counters.rx_context_disabled.fetch_add(1, Relaxed);
        return Err(Refusal::Drop("context disabled"));
    }
    let khdr = pkt.bth_offset().unwrap_or(LRH_BYTES) + BTH_BYTES;
    let hdr_size = (rxe.kctxt(ctxt, RCV_HDR_SIZE).unwrap_or(0) & RCV_HDR_SIZE_HDR_SIZE_MASK) as usize * 4;
    let header_len = khdr + hdr_size.max(KDETH_BYTES);
    // The wire holds whole dwords with the ICRC last (WirePacket::seal).
    let body = pkt.bytes.len().saturating_sub(ICRC_BYTES);
    if header_len > body {
        let (header, rest) = pkt.bytes.split_at(body);
        let why = "KDETH header too short";
        let d = error_entry(rxe, ctxt, pkt, (header, rest), RHF_RTE_ERROR_KHDR_MIN_LEN_ERR, why, counters)?;
        counters.rx_khdr_min_len.fetch_add(1, Relaxed);
        return Ok(d);
    }
    let (header, rest) = pkt.bytes.split_at(header_len);
    let word = |at: usize| u32::from_le_bytes([pkt.bytes[at], pkt.bytes[at + 1], pkt.bytes[at + 2], pkt.bytes[at + 3]]);
    // KDETH is little-endian (KDETH_GET's le32_to_cpu).
    let p = Packet { kdeth0: word(khdr), dest_qp: pkt.dest_qp(), psn: pkt.psn() };
    if (p.kdeth0 >> KDETH_KVER_SHIFT) & KDETH_KVER_MASK != KDETH_KVER {
        let why = "KDETH version not 1";
        let d = error_entry(rxe, ctxt, pkt, (header, rest), RHF_RTE_ERROR_KHDR_KVER_ERR, why, counters)?;
        counters.rx_khdr_kver.fetch_add(1, Relaxed);
        return Ok(d);
    }
    let payload = header_len..body.saturating_sub(usize::from(pkt.pad())).max(header_len);
    if p.tidctrl() == 0 {
        let a = Arrival {
            rcv_type: RHF_RCV_TYPE_EAGER,
            tid_err_without_eager: true,
            ..Arrival::ib(header, rest, !payload.is_empty(), pkt.sc4, pkt.icrc_ok())
        };
        let plan = rxe.rhq_reserve(ctxt, &a, counters)?;
        let kind = if plan.rhf & RHF_TID_ERR != 0 {
            counters.wire_rx_kdeth_errors.fetch_add(1, Relaxed);
            Kind::Error("no eager room (TidErr)")
        } else {
            counters.wire_rx_kdeth_eager.fetch_add(1, Relaxed);
            Kind::Eager
        };
        return Ok(Delivery { kind, rhq: Some(plan), tid: None });
    }
    expected(rxe, ctxt, pkt, &p, (header, rest), payload, counters)
}

/// An expected packet (TIDCTRL 1..=3): flow, TIDs, placement, and the entry unless suppressed.
fn expected(
    rxe: &mut Rxe,
    ctxt: usize,
    pkt: &WirePacket,
    p: &Packet,
    (header, rest): (&[u8], &[u8]),
    payload: Range<usize>,
    counters: &Counters,
) -> Result<Delivery, Refusal> {
    let icrc_ok = pkt.icrc_ok();
    let entry = |errors| Arrival {
        rcv_type: RHF_RCV_TYPE_EXPECTED,
        errors,
        ..Arrival::ib(header, rest, false, pkt.sc4, icrc_ok)
    };
    // A corrupted packet is neither placed nor counted by its flow: its entry carries IcrcErr, which the
    // kernel drops (hfi1_handle_kdeth_eflags), and the next packet's sequence error starts the recovery.
    if !icrc_ok {
        let plan = rxe.rhq_reserve(ctxt, &entry(0), counters)?;
        counters.wire_rx_kdeth_errors.fetch_add(1, Relaxed);
        return Ok(Delivery { kind: Kind::Error("bad ICRC"), rhq: Some(plan), tid: None });
    }
    let flow_checked = rxe.ctxt_ctrl(ctxt) & RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK != 0;
    let (outcome, flow) = if flow_checked {
        let flow = FlowEntry::decode(rxe.flows.read(ctxt, p.flow()).unwrap_or(0));
        (rxe.flows.peek(ctxt, p.flow(), p.generation(), p.sequence()), flow)
    } else {
        (FlowCheck::Match, FlowEntry::default())
    };
    let judged = match flow_refusal(outcome) {
        Some(RxResult::FlowInvalid) => {
            count_refusal(RxResult::FlowInvalid, counters);
            return Err(Refusal::Drop("flow not valid"));
        }
        Some(r) => Err(r),
        None => rxe.tid_placement(ctxt, p, p.tidctrl(), payload.len() as u64, counters),
    };
    match judged {
        Ok(placement) => {
            // After a sequence error every packet of the flow reports one until the driver writes the flow, so the
            // kernel's software PSN check (HFI1_R_TID_SW_PSN) sees each; an error is never suppressed.
            let after_seq_err = outcome == FlowCheck::MatchAfterSeqErr;
            let errors = if after_seq_err { RHF_RTE_EXPECTED_FLOW_SEQ_ERR << RHF_RCV_TYPE_ERR_SHIFT } else { 0 };
            let suppressed = !after_seq_err && flow.hdr_supp_en && (p.kdeth0 >> KDETH_SH_SHIFT) & 1 != 0;
            let rhq = if suppressed { None } else { Some(rxe.rhq_reserve(ctxt, &entry(errors), counters)?) };
            if flow_checked {
                rxe.flows.accept(ctxt, p.flow());
            }
            counters.wire_rx_kdeth_expected.fetch_add(1, Relaxed);
            if rxe.is_user_ctxt(ctxt) {
                counters.wire_rx_kdeth_user_expected.fetch_add(1, Relaxed);
            }
            if suppressed {
                counters.wire_rx_kdeth_suppressed.fetch_add(1, Relaxed);
            }
            if after_seq_err {
                counters.wire_rx_kdeth_placed_after_seq_err.fetch_add(1, Relaxed);
                counters.wire_rx_kdeth_errors.fetch_add(1, Relaxed);
            }
            Ok(Delivery { kind: Kind::Expected, rhq, tid: Some((placement, payload)) })
        }
        Err(r) => {
            let (errors, why) = match r {
                RxResult::GenMismatch => (RHF_RTE_EXPECTED_FLOW_GEN_ERR << RHF_RCV_TYPE_ERR_SHIFT, "flow generation"),
                RxResult::SeqMismatch => (RHF_RTE_EXPECTED_FLOW_SEQ_ERR << RHF_RCV_TYPE_ERR_SHIFT, "flow sequence"),
                RxResult::TidOutOfRange => (RHF_TID_ERR, "TID outside the context's range (TidErr)"),
                RxResult::TidInvalidEntry => (RHF_TID_ERR, "TID entry not valid (TidErr)"),
                _ => (RHF_TID_ERR, "payload beyond the TID's buffer (TidErr)"),
            };
            let plan = rxe.rhq_reserve(ctxt, &entry(errors), counters)?;
            rxe.flows.record(ctxt, p.flow(), outcome);
            count_refusal(r, counters);
            counters.wire_rx_kdeth_errors.fetch_add(1, Relaxed);
            Ok(Delivery { kind: Kind::Error(why), rhq: Some(plan), tid: None })
        }
    }
}

/// An ERROR entry of RcvTypeErr `rte`: the header only.
fn error_entry(
    rxe: &mut Rxe,
    ctxt: usize,
    pkt: &WirePacket,
    (header, rest): (&[u8], &[u8]),
    rte: u64,
    why: &'static str,
    counters: &Counters,
) -> Result<Delivery, Refusal> {
    let a = Arrival {
        rcv_type: RHF_RCV_TYPE_ERROR,
        errors: rte << RHF_RCV_TYPE_ERR_SHIFT,
        ..Arrival::ib(header, rest, false, pkt.sc4, pkt.icrc_ok())
    };
    let plan = rxe.rhq_reserve(ctxt, &a, counters)?;
    counters.wire_rx_kdeth_errors.fetch_add(1, Relaxed);
    Ok(Delivery { kind: Kind::Error(why), rhq: Some(plan), tid: None })
}

#[cfg(test)]
#[path = "kdeth_tests.rs"]
mod tests;
