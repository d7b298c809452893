//! The demo's SYNC step: one TID RDMA READ long enough to run out of its flow's PSN space. Each segment
//! goes the kernel's way: `hfi1_make_tid_rdma_read_req` builds the READ REQ (flow, receive buffers,
//! tidarray), the responder's side (`tid_rdma_rcv_read_request`, then the data packets of
//! `hfi1_build_tid_rdma_read_resp`) sends the segment through the device's loopback, the bytes are
//! checked, and the last response completes the segment (`hfi1_rc_rcv_tid_rdma_read_resp`). One segment
//! stays in flight, so at the SYNC point the build has to wait for it; its completion clears the flow and
//! the next segment takes the next generation. Packets of the old generation are then shown refused.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::port::{device_flow, errno, pattern, Port, SEG_BYTES};
use crate::dma::DmaBuffer;
use crate::hfi1::exp_rcv::{hfi1_kern_exp_rcv_clear_all, hfi1_kern_exp_rcv_free_flows, TidRdmaRequest};
use crate::hfi1::flow::{hfi1_kern_clear_hw_flow, kern_flow_generation_next};
use crate::hfi1::loopback::{
    tid_rdma_data_packets, tid_rdma_rcv_read_request, LbDescriptor, LbResult, TidDataPacket, TID_RDMA_DESTQP_FLOW_MASK,
    TID_RDMA_DESTQP_FLOW_SHIFT,
};
use crate::hfi1::qp::{Hfi1Qp, IbQpType, QpSendState, TidRdmaParams};
use crate::hfi1::regs::*;
use crate::hfi1::sge::{RvtSge, RvtSgeState};
use crate::hfi1::tid_rdma::{TidRdmaReadReq, TidRequestState};
use crate::hfi1::tid_read::{hfi1_make_tid_rdma_read_req, hfi1_rc_rcv_tid_rdma_read_resp};
use crate::hfi1::wait::tid_rdma_flush_wait;
use crate::hfi1::wqe::{rvt_post_one_wr, Hfi1SwqePriv, IbWrOpcode, RvtSwqe};

/// The QP number and first IB PSN of the demo's reader.
const SYNC_QPN: u32 = 3;
const FIRST_PSN: u32 = 0x10_0000;

/// Segments of one request: one more than fit a generation (tid_rdma.c:1839: a segment of `npkts` packets
/// goes on the flow while psn + npkts <= MAX_TID_FLOW_PSN - 1).
pub(crate) fn segments_to_cross(pmtu: u32) -> u32 {
    let npkts = SEG_BYTES as u32 / pmtu;
    (MAX_TID_FLOW_PSN - 1) / npkts + 1
}

/// The hardware flow a READ REQ names (`tid_flow_qp` bits 15:11).
fn flow_of(ohdr: &TidRdmaReadReq) -> u32 {
    (ohdr.tid_flow_qp >> TID_RDMA_DESTQP_FLOW_SHIFT) & TID_RDMA_DESTQP_FLOW_MASK
}

/// One READ REQ on the wire: its header, BTH PSN and payload (the tidarray).
struct ReadReq {
    ohdr: TidRdmaReadReq,
    bth2: u32,
    payload: Vec<u32>,
}

struct Reader<'a> {
    port: &'a Port,
    qp: Arc<Hfi1Qp>,
    wqe: RvtSwqe,
    buf: Arc<DmaBuffer>,
    pmtu: u32,
    timeout: Duration,
}

impl Reader<'_> {
    fn req(&self) -> Result<&TidRdmaRequest, String> {
        self.wqe.priv_.as_ref().map(|p| &p.tid_req).ok_or_else(|| "the WQE has no request".to_string())
    }

    /// `hfi1_make_tid_rdma_read_req`: `None` when nothing may be sent yet.
    fn make(&mut self) -> Result<Option<ReadReq>, String> {
        let (mut ohdr, mut bth1, mut bth2, mut len) = (TidRdmaReadReq::default(), 0, 0, 0);
        let mut g = self.qp.lock();
        let hdwords = hfi1_make_tid_rdma_read_req(&mut g, &mut self.wqe, &mut ohdr, &mut bth1, &mut bth2, &mut len)
            .map_err(|e| format!("hfi1_make_tid_rdma_read_req: {}", errno(e)))?;
        drop(g);
        let payload = self.wqe.priv_.as_ref().map(|p| p.ss.clone()).unwrap_or_default();
        Ok((hdwords > 0).then_some(ReadReq { ohdr, bth2, payload }))
    }

    /// The responder's data packets for `rr`.
    fn response(&self, rr: &ReadReq) -> Result<Vec<TidDataPacket>, String> {
        let flow = tid_rdma_rcv_read_request(&rr.ohdr, &rr.payload, rr.bth2 & PSN_MASK, self.pmtu)
            .map_err(|e| format!("tid_rdma_rcv_read_request: {}", errno(e)))?;
        tid_rdma_data_packets(&flow, flow.tid_qpn, self.pmtu).map_err(errno)
    }

    /// Sends segment `seg`'s response, checks its bytes in the reader's buffer, and hands the last packet
    /// (the one header suppression lets through) to `hfi1_rc_rcv_tid_rdma_read_resp`. Returns the packets.
    fn respond(&mut self, seg: u32, rr: &ReadReq) -> Result<u64, String> {
        let packets = self.response(rr)?;
        let data = pattern(SEG_BYTES, 0x5C00 | seg);
        let descs: Option<Vec<LbDescriptor<'_>>> = packets.iter().map(|p| p.descriptor(&data)).collect();
        let out =
            self.port.lb.send(&descs.ok_or("packet outside the segment")?, self.timeout).map_err(|e| e.to_string())?;
        if out.errors != 0 {
            return Err(format!(
                "segment {seg}: {} of {} packets refused, last {:?}",
                out.errors,
                packets.len(),
                out.last()
            ));
        }
        let mut got = vec![0u8; SEG_BYTES];
        self.buf.read(seg as usize * SEG_BYTES, &mut got).map_err(|e| e.to_string())?;
        // A slice compare first: a byte loop over megabytes is slow in debug builds.
        if got != data {
            let i = got.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!("segment {seg}: byte {i} is {:#04x}, sent {:#04x}", got[i], data[i]));
        }
        let last = packets.last().ok_or("a segment of no packets")?;
        hfi1_rc_rcv_tid_rdma_read_resp(&mut self.qp.lock(), &mut self.wqe, last.psn, last.verbs_psn)
            .map_err(|e| format!("hfi1_rc_rcv_tid_rdma_read_resp: {}", errno(e)))?;
        Ok(packets.len() as u64)
    }

    /// Packets of generation `gen` aimed at `rr`'s first TID: the device must refuse them all and write
    /// nothing into the segment `seg` they point at.
    fn stale(&self, seg: u32, rr: &ReadReq, gen: u32, sequences: &[u32]) -> Result<Value, String> {
        let first = *self.response(rr)?.first().ok_or("no packets")?;
        let at = seg as usize * SEG_BYTES;
        self.buf.write(at, &vec![0u8; SEG_BYTES]).map_err(|e| e.to_string())?;
        let junk = vec![0xA5u8; first.len as usize];
        let descs: Vec<LbDescriptor<'_>> = sequences
            .iter()
            .map(|&seq| LbDescriptor {
                kdeth0: first.kdeth0,
                dest_qp: first.dest_qp,
                psn: full_flow_psn(gen, seq),
                payload: &junk,
            })
            .collect();
        let out = self.port.lb.send(&descs, self.timeout).map_err(|e| e.to_string())?;
        let f = device_flow(self.port, flow_of(&rr.ohdr))?;
        let mut got = vec![0u8; SEG_BYTES];
        self.buf.read(at, &mut got).map_err(|e| e.to_string())?;
        let placed = if got.iter().all(|b| *b == 0) { 0 } else { got.iter().filter(|b| **b != 0).count() };
        if out.errors != descs.len() as u64
            || out.last() != Some(LbResult::GenMismatch)
            || !f.gen_mismatch
            || !f.valid
            || placed != 0
        {
            return Err(format!(
                "old generation {gen:#x}: {} of {} refused, last {:?}, GEN_MISMATCH {}, FLOW_VALID {}, {placed} bytes placed",
                out.errors,
                descs.len(),
                out.last(),
                f.gen_mismatch,
                f.valid
            ));
        }
        Ok(json!({"generation": format!("{gen:#x}"), "sequences": sequences, "refused": out.errors,
                  "result": format!("{:?}", LbResult::GenMismatch), "gen_mismatch_status": f.gen_mismatch,
                  "flow_still_valid": f.valid, "bytes_placed": placed}))
    }

    fn run(&mut self) -> Result<Value, String> {
        let n = segments_to_cross(self.pmtu);
        let npkts = SEG_BYTES as u32 / self.pmtu;
        let mut packets = 0u64;
        let mut inflight = self.make()?.ok_or("the first segment was not sent")?;
        let old_gen = inflight.ohdr.tid_flow_psn >> HFI1_KDETH_BTH_SEQ_SHIFT;
        let flow_idx = flow_of(&inflight.ohdr);
        // Segments 1..n-1: request the next one, then answer the one before it.
        for seg in 1..n - 1 {
            let next = self.make()?.ok_or_else(|| format!("segment {seg} was not sent"))?;
            packets += self.respond(seg - 1, &inflight)?;
            inflight = next;
        }
        // The SYNC point: segment n-1 does not fit; the build waits for segment n-2.
        let waited = self.make()?.is_none() && self.req()?.state == TidRequestState::Sync;
        if !waited {
            return Err(format!("segment {} was sent on a flow with no PSNs left for it", n - 1));
        }
        let parked = device_flow(self.port, flow_idx)?.generation;
        if parked != old_gen {
            return Err(format!(
                "flow {flow_idx} holds generation {parked:#x} with a segment of {old_gen:#x} in flight"
            ));
        }
        packets += self.respond(n - 2, &inflight)?;
        let cleared = device_flow(self.port, flow_idx)?.generation;
        let last = self.make()?.ok_or("the segment after the SYNC point was not sent")?;
        let new_gen = last.ohdr.tid_flow_psn >> HFI1_KDETH_BTH_SEQ_SHIFT;
        let new_idx = flow_of(&last.ohdr);
        let dev = device_flow(self.port, new_idx)?;
        if new_gen != kern_flow_generation_next(old_gen) || last.ohdr.tid_flow_psn & HFI1_KDETH_BTH_SEQ_MASK != 0 {
            return Err(format!(
                "after the SYNC point: flow PSN {:#x}, generation was {old_gen:#x}",
                last.ohdr.tid_flow_psn
            ));
        }
        if cleared != KERN_GENERATION_RESERVED || dev.generation != new_gen || !dev.valid {
            return Err(format!("device flow {new_idx}: {cleared:#x} after the clear, then {:#x}", dev.generation));
        }
        // A stale packet of the old generation, at the new flow's next sequence and where the old one
        // would have gone on.
        let stale = self.stale(n - 1, &last, old_gen, &[0, (n - 1) * npkts])?;
        packets += self.respond(n - 1, &last)?;
        let req = self.req()?;
        let g = self.qp.lock();
        if req.state != TidRequestState::Complete || g.flow_state.index != RXE_NUM_TID_FLOWS {
            return Err(format!("request {:?}, flow {} still held", req.state, g.flow_state.index));
        }
        Ok(json!({
            "pmtu": self.pmtu, "segments": n, "packets_per_segment": npkts, "packets": packets,
            "bytes_verified": n as usize * SEG_BYTES, "sync_segment": n - 1,
            "waited_for_pending_segment": waited,
            "old": {"flow_idx": flow_idx, "generation": format!("{old_gen:#x}"), "last_spsn": (n - 2) * npkts},
            "new": {"flow_idx": new_idx, "generation": format!("{new_gen:#x}"), "spsn": 0},
            "device_generation": {"before_sync": format!("{parked:#x}"), "cleared": format!("{cleared:#x}"),
                                  "after_sync": format!("{:#x}", dev.generation)},
            "ib_psns": {"first": FIRST_PSN, "last_segment": last.bth2 & PSN_MASK},
            "old_generation_packets": stale,
        }))
    }

    /// Everything the request holds goes back, whatever happened.
    fn teardown(mut self) -> Result<(), String> {
        let mut g = self.qp.lock();
        let mut done = Ok(());
        if let Some(p) = self.wqe.priv_.as_mut() {
            done = hfi1_kern_exp_rcv_clear_all(&mut p.tid_req, &mut g);
        }
        done = done.and(hfi1_kern_clear_hw_flow(&self.qp.rcd, &mut g));
        tid_rdma_flush_wait(&mut g);
        // The SGE state holds the buffer too.
        g.s_sge = RvtSgeState::default();
        drop(g);
        if let Some(p) = self.wqe.priv_.as_mut() {
            done = done.and(hfi1_kern_exp_rcv_free_flows(&mut p.tid_req));
        }
        // Queued sends and wakeups hold the QP: run them before it goes.
        self.port.dd.wq.run_pending(usize::MAX);
        self.wqe.sg_list.clear();
        self.wqe.priv_ = None;
        let released = match Arc::try_unwrap(self.buf) {
            Ok(buf) => {
                buf.release(&self.port.pool);
                Ok(())
            }
            Err(_) => Err("the READ's buffer is still referenced: its DMA mapping would stay".to_string()),
        };
        done.map_err(errno).and(released)
    }
}

/// The step: a TID RDMA READ of [`segments_to_cross`] segments on a QP of its own.
pub(super) fn sync_step(port: &Port, pmtu: u32, timeout: Duration) -> Result<Value, String> {
    let n = segments_to_cross(pmtu);
    let len = n * SEG_BYTES as u32;
    let buf = Arc::new(port.pool.alloc_contiguous(len as usize).map_err(|e| format!("{len}-byte buffer: {e}"))?);
    let mut st = QpSendState::new(IbQpType::Rc, pmtu);
    (st.s_next_psn, st.s_psn) = (FIRST_PSN, FIRST_PSN);
    st.tid_rdma_remote = Some(TidRdmaParams { max_len: SEG_BYTES as u32, max_read: 6, ..Default::default() });
    let qp = Hfi1Qp::new(SYNC_QPN, port.rcd.clone(), st, Box::new(|_| {}));
    let sge = RvtSge::new(buf.clone(), 0, len).map_err(errno)?;
    let mut wqe = RvtSwqe {
        opcode: IbWrOpcode::RdmaRead,
        remote_addr: 0,
        rkey: 0,
        length: len,
        ssn: 0,
        psn: 0,
        lpsn: 0,
        sg_list: vec![sge],
        ah: None,
        priv_: Some(Box::new(Hfi1SwqePriv::new(TidRdmaRequest::new(&qp)))),
    };
    let posted = rvt_post_one_wr(&mut qp.lock(), &mut wqe, &mut false);
    let mut reader = Reader { port, qp, wqe, buf, pmtu, timeout };
    let out = match posted {
        Ok(()) if reader.wqe.opcode == IbWrOpcode::TidRdmaRead => reader.run(),
        Ok(()) => Err(format!("the READ stayed {:?}", reader.wqe.opcode)),
        Err(e) => Err(format!("rvt_post_one_wr: {}", errno(e))),
    };
    let down = reader.teardown();
    let detail = out?;
    down?;
    Ok(detail)
}
