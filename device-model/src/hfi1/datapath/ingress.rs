//! The receive side of the port: packets the cable brought, routed to a receive context and written to its
//! header queue and eager buffers (docs/hfi1-fabric.md, "Receive"). Runs on the engine's worker.
//!
//! Context selection follows what the driver programs (the RSM is not modelled): the port must be enabled
//! (RCV_CTRL.RcvPortEnable, set at link INIT), the DLID must pass the port's filter, SC 15 goes to
//! RCV_VL15's context, and every other packet to RCV_QP_MAP_TABLE[QPN[8:1]] (context 0 while the map is
//! off); KDETH packets (DestQP[23:16] = RCV_BTH_QP.KDETH_QP) go to the context in DestQP[7:0] and are
//! judged by kdeth.rs (TID RDMA).
//! A context without room holds the packet at the head of the port's queue until the driver moves a head
//! register; the port's queue itself is bounded, and every drop is counted by cause.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;

use vfio_user_proto::dma::DmaAccess;
use vfio_user_proto::sync::Unpoison;

use crate::hfi1::cable::wire::{
    ICRC_BYTES, OPCODE_TID_RDMA_READ_RESP, OPCODE_TID_RDMA_WRITE_DATA, OPCODE_TID_RDMA_WRITE_DATA_LAST, SC_VL15,
};
use crate::hfi1::cable::WirePacket;
use crate::hfi1::counters::Counters;
use crate::hfi1::datapath::batch::{Judged, Queued};
use crate::hfi1::regs::*;
use crate::hfi1::rxe::kdeth::{self, Delivery, Kind};
use crate::hfi1::rxe::rcv;
use crate::hfi1::rxe::rhq::{Arrival, Refusal};
use crate::hfi1::rxe::state::Rxe;
use crate::hfi1::shared::{Shared, WfrFront};
use crate::hfi1::wfr::{Wfr, IS_RCVAVAIL_START, IS_RCVURGENT_START};
use crate::trace::{Block, Level, Val};

/// Packets the port queues for its worker at most (one more while the worker has the head out to judge it);
/// more are dropped (counted).
pub const INGRESS_QUEUE: usize = 1024;
/// RCV_VL15 holds the management context's number.
const RCV_VL15_CTXT_MASK: u64 = 0xFF;

/// Where the port sends a packet: a receive context, as an IB packet or as KDETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::hfi1) enum Route {
    Ib(usize),
    Kdeth(usize),
}

/// The receive context `pkt` goes to, or why it goes nowhere.
pub(in crate::hfi1) fn route(
    rxe: &Rxe,
    wfr: &Wfr,
    pkt: &WirePacket,
    counters: &Counters,
) -> Result<Route, &'static str> {
    if rxe.global(RCV_CTRL) & RCV_CTRL_RCV_PORT_ENABLE_SMASK == 0 {
        counters.wire_rx_port_disabled.fetch_add(1, Relaxed);
        return Err("port disabled");
    }
    if pkt.test_ebp {
        counters.wire_rx_test_ebp.fetch_add(1, Relaxed);
        return Err("bad end of packet (TestEBP)");
    }
    if !wfr.dlid_accepts(pkt.dlid()) {
        counters.wire_rx_dlid_filtered.fetch_add(1, Relaxed);
        return Err("DLID filtered");
    }
    let route = if pkt.sc() == SC_VL15 {
        Route::Ib((rxe.global(RCV_VL15) & RCV_VL15_CTXT_MASK) as usize)
    } else {
        let kdeth = (rxe.global(RCV_BTH_QP) >> RCV_BTH_QP_KDETH_QP_SHIFT) & RCV_BTH_QP_KDETH_QP_MASK;
        let qpn = pkt.dest_qp();
        if kdeth != 0 && u64::from(qpn >> 16) == kdeth {
            Route::Kdeth(kdeth::destqp_ctxt(qpn))
        } else if rxe.global(RCV_CTRL) & RCV_CTRL_RCV_QP_MAP_ENABLE_SMASK != 0 {
            Route::Ib(rxe.qp_map_ctxt(qpn))
        } else {
            Route::Ib(0)
        }
    };
    let (Route::Ib(ctxt) | Route::Kdeth(ctxt)) = route;
    if ctxt >= rxe.contexts() {
        counters.wire_rx_bad_context.fetch_add(1, Relaxed);
        return Err("no such receive context");
    }
    Ok(route)
}

/// What became of the packet at the head of the queue.
enum Step {
    Placed(Delivery),
    Dropped(&'static str),
    Held,
}

/// Drains the port's queue in order, until it is empty or a packet must wait for room. Work of an older
/// epoch stops. A `wire-batch` packet's batch hears what became of it.
pub(in crate::hfi1) fn run(shared: &Shared, front: &WfrFront, epoch: u64) {
    let dma = shared.dma();
    loop {
        if !shared.current(epoch) {
            return;
        }
        let Some(Queued { packet: pkt, batch }) = front.ingress.lock().unpoison().pop_front() else {
            front.ingress_held.store(false, Relaxed);
            return;
        };
        let step = judge(shared, front, &pkt);
        let judged = match step {
            Step::Held => {
                // Back at the head, unless a reset emptied the queue meanwhile (it moves the epoch first).
                let mut q = front.ingress.lock().unpoison();
                if shared.current(epoch) {
                    q.push_front(Queued { packet: pkt, batch });
                }
                drop(q);
                if !front.ingress_held.swap(true, Relaxed) {
                    shared.counters.wire_rx_held.fetch_add(1, Relaxed);
                }
                return;
            }
            Step::Dropped(why) => Some(Judged::Dropped(why)),
            Step::Placed(plan) => write(shared, front, dma.as_ref(), &pkt, plan, epoch).then_some(Judged::Placed),
        };
        front.ingress_held.store(false, Relaxed);
        if let (Some(b), Some(judged)) = (batch, judged) {
            b.judged(&shared.lock_rxe(), judged);
        }
    }
}

/// Routes the packet and reserves its slot, under the RXE and chip-personality locks.
fn judge(shared: &Shared, front: &WfrFront, pkt: &WirePacket) -> Step {
    let mut rxe = shared.lock_rxe();
    let wfr = front.lock();
    let route = match route(&rxe, &wfr, pkt, &shared.counters) {
        Ok(r) => r,
        Err(why) => {
            trace(shared, pkt, None, why);
            return Step::Dropped(why);
        }
    };
    drop(wfr);
    let (ctxt, judged) = match route {
        Route::Kdeth(ctxt) => (ctxt, kdeth::judge(&mut rxe, ctxt, pkt, &shared.counters)),
        Route::Ib(ctxt) => {
            // A packet whose opcode the chip does not know keeps just its LRH and BTH as header; the driver
            // drops it.
            let header = pkt.header_bytes().unwrap_or_else(|| pkt.bth_offset().unwrap_or(8) + 12);
            let (head, rest) = pkt.bytes.split_at(header);
            let payload = rest.len().saturating_sub(usize::from(pkt.pad()) + ICRC_BYTES);
            let arrival = Arrival::ib(head, rest, payload > 0, pkt.sc4, pkt.icrc_ok());
            let plan = rxe.rhq_reserve(ctxt, &arrival, &shared.counters);
            (ctxt, plan.map(|p| Delivery { kind: Kind::Ib, rhq: Some(p), tid: None }))
        }
    };
    match judged {
        Ok(delivery) => Step::Placed(delivery),
        Err(Refusal::Hold(_)) => Step::Held,
        Err(Refusal::Drop(why)) => {
            trace(shared, pkt, Some(ctxt), why);
            Step::Dropped(why)
        }
    }
}

/// The writes of a placed packet, in the order the driver's polling needs: the TID payload of an expected
/// packet; then, for a packet with a header queue entry, eager payload, header, RHF, tail; then the tail
/// register and the interrupt. False when a reset came first: nothing was published.
fn write(shared: &Shared, front: &WfrFront, dma: &dyn DmaAccess, pkt: &WirePacket, d: Delivery, epoch: u64) -> bool {
    let counters = &shared.counters;
    if let Some((placement, range)) = &d.tid {
        let payload = pkt.bytes.get(range.clone()).unwrap_or_default();
        if rcv::place(dma, placement, payload, counters) == rcv::RxResult::Placed {
            let n = payload.len() as u64;
            counters.wire_rx_kdeth_bytes.fetch_add(n, Relaxed);
            match pkt.opcode() {
                OPCODE_TID_RDMA_READ_RESP => counters.wire_rx_kdeth_read_resp_bytes.fetch_add(n, Relaxed),
                OPCODE_TID_RDMA_WRITE_DATA | OPCODE_TID_RDMA_WRITE_DATA_LAST => {
                    counters.wire_rx_kdeth_write_data_bytes.fetch_add(n, Relaxed)
                }
                _ => 0,
            };
        }
    }
    trace_kdeth(shared, pkt, &d);
    let urgent = d.kind != Kind::Ib && kdeth::intr(pkt);
    let Some(plan) = d.rhq.map(|p| p.hostile(&shared.probe)) else { return true };
    let header_len = (plan.rhf_at - plan.header_at) as usize;
    let (header, rest) = pkt.bytes.split_at(header_len);
    let mut ok = plan.eager.is_none_or(|at| dma.write(at, rest).is_ok());
    ok = ok && dma.write(plan.header_at, header).is_ok();
    ok = ok && dma.write_u64(plan.rhf_at, plan.rhf).is_ok();
    ok = ok && plan.tail.is_none_or(|(at, v)| dma.write_u64(at, v).is_ok());
    if !ok {
        counters.wire_rx_dma_errors.fetch_add(1, Relaxed);
    }
    let vectors = {
        let mut rxe = shared.lock_rxe();
        if !shared.current(epoch) {
            return false;
        }
        rxe.rhq_publish(plan.ctxt, plan.published);
        counters.wire_rx_written.fetch_add(1, Relaxed);
        let mut wfr = front.lock();
        // A KDETH.INTR packet raises its context's RcvUrgent once its entry is there to read; the driver gates
        // it with CCE_INT_MASK alone (chip.c hfi1_rcvctrl URGENT_ENB: set_intr_bits), not with INTR_AVAIL.
        let urgent = urgent.then(|| {
            counters.wire_rx_kdeth_urgent.fetch_add(1, Relaxed);
            wfr.raise(IS_RCVURGENT_START + plan.ctxt as u32)
        });
        let avail = plan.interrupt.then(|| wfr.raise(IS_RCVAVAIL_START + plan.ctxt as u32));
        [urgent.flatten(), avail.flatten()]
    };
    let probe = &shared.probe;
    if probe.trace.on(Block::Rhq, Level::Info) {
        probe.trace.event(
            Block::Rhq,
            Level::Info,
            "rhq-write",
            &[
                ("ctxt", Val::Dec(plan.ctxt as u64)),
                ("entry", Val::Hex(plan.rhf_at)),
                ("rhf", Val::Hex(plan.rhf)),
                ("eager", plan.eager.map_or(Val::Str("none"), Val::Hex)),
                ("len", Val::Dec(pkt.bytes.len() as u64)),
                ("tail", Val::Dec(plan.published)),
            ],
        );
    }
    for v in vectors.into_iter().flatten() {
        shared.raise(v);
    }
    true
}

/// Names what became of a KDETH packet: eager, placed through a TID (where, how much, suppressed or not),
/// or the error entry it made.
fn trace_kdeth(shared: &Shared, pkt: &WirePacket, d: &Delivery) {
    let probe = &shared.probe;
    let name = match d.kind {
        Kind::Ib => return,
        Kind::Eager => "kdeth-eager",
        Kind::Expected => "kdeth-expected",
        Kind::Error(_) => "kdeth-error",
    };
    if !probe.trace.on(Block::Rhq, Level::Info) {
        return;
    }
    let psn = pkt.psn();
    let mut fields = vec![
        ("qp", Val::Hex(pkt.dest_qp().into())),
        ("opcode", Val::Hex(pkt.opcode().into())),
        ("generation", Val::Hex(u64::from(psn >> rcv::HFI1_KDETH_BTH_SEQ_SHIFT))),
        ("seq", Val::Dec(u64::from(psn & rcv::HFI1_KDETH_BTH_SEQ_MASK))),
    ];
    if let Some((placement, range)) = &d.tid {
        fields.push(("iova", Val::Hex(placement.iova)));
        fields.push(("len", Val::Dec(range.len() as u64)));
        fields.push(("suppressed", Val::Str(if d.rhq.is_none() { "yes" } else { "no" })));
    }
    if let Kind::Error(why) = d.kind {
        fields.push(("why", Val::Str(why)));
    }
    if let Some(plan) = &d.rhq {
        fields.push(("rhf", Val::Hex(plan.rhf)));
    }
    probe.trace.event(Block::Rhq, Level::Info, name, &fields);
}

fn trace(shared: &Shared, pkt: &WirePacket, ctxt: Option<usize>, why: &'static str) {
    let probe = &shared.probe;
    if probe.trace.on(Block::Rhq, Level::Info) {
        probe.trace.event(
            Block::Rhq,
            Level::Info,
            "dropped",
            &[
                ("ctxt", ctxt.map_or(Val::Str("none"), |c| Val::Dec(c as u64))),
                ("sc", Val::Dec(pkt.sc().into())),
                ("dlid", Val::Hex(pkt.dlid().into())),
                ("qp", Val::Hex(pkt.dest_qp().into())),
                ("why", Val::Str(why)),
            ],
        );
    }
}
