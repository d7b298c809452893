//! `udriver hfi1-demo`: the hfi1 TID RDMA receive side doing its real work on a device. Flows are reserved,
//! a multi-segment request is set up over contiguous and over fragmented memory, data is sent through the
//! device's loopback path and verified byte for byte, packets of a wrong generation and a wrong sequence are
//! shown rejected,
//! and everything is cleared and freed. `hfi1_stress` drives several QPs on one context, then checks that
//! nothing leaked. Only `DeviceAccess` is used, so the demo runs the same over VFIO, vfio-user and
//! in-process.

#![forbid(unsafe_code)]

mod stress;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

pub use stress::hfi1_stress;

use super::DemoReport;
use crate::access::DeviceAccess;
use crate::dma::{DmaBuffer, DmaPool, PAGE_SIZE};
use crate::hfi1::ctxt::*;
use crate::hfi1::exp_rcv::*;
use crate::hfi1::flow::{hfi1_kern_clear_hw_flow, hfi1_kern_setup_hw_flow};
use crate::hfi1::loopback::*;
use crate::hfi1::qp::{Hfi1Qp, IbQpType, QpSendState};
use crate::hfi1::regs::*;
use crate::hfi1::sge::{RvtSge, RvtSgeState};
use crate::hfi1::wait::tid_rdma_flush_wait;

/// Pages of one segment (TID_RDMA_MAX_SEGMENT_SIZE).
pub const SEG_PAGES: usize = TID_RDMA_MAX_PAGES;
pub const SEG_BYTES: usize = SEG_PAGES * PAGE_SIZE as usize;
/// Page runs the fragmented buffers are cut into, repeated: odd and even runs, single pages, power-of-two
/// and other lengths, so both page-set finders split them.
const FRAGMENT_RUNS: [u64; 10] = [1, 3, 2, 5, 8, 1, 16, 2, 7, 19];

#[derive(Debug, Clone)]
pub struct Hfi1DemoOptions {
    /// Receive context to use; contexts 0..=ctxt are set up as kernel contexts.
    pub ctxt: u32,
    /// Path MTU, 4096 (4k page-set finder) or 8192 (8k finder).
    pub pmtu: u32,
    /// Segments per request, 1..=TID_RDMA_MAX_READ_SEGS_PER_REQ.
    pub segments: u32,
    /// Bound of every wait on the device.
    pub timeout: Duration,
}

impl Default for Hfi1DemoOptions {
    fn default() -> Self {
        Self { ctxt: 0, pmtu: 4096, segments: 3, timeout: Duration::from_secs(5) }
    }
}

/// A device brought up for TID RDMA: one enabled receive context, a DMA pool and the loopback sender.
pub(crate) struct Port {
    pub dd: Arc<Hfi1Devdata>,
    pub rcd: Arc<Hfi1Ctxtdata>,
    pub pool: DmaPool,
    pub lb: Hfi1Loopback,
    hdrq: Arc<DmaBuffer>,
}

impl Port {
    /// `pci_enable_device`, MSI-X, probe with `nctxt` kernel contexts, then context `ctxt` created and
    /// enabled with TID flow checking (`hfi1_rcvctrl`).
    pub fn bring_up(dev: Arc<dyn DeviceAccess>, ctxt: u32, nctxt: u32) -> Result<(Self, Value), String> {
        dev.pci_enable_device().map_err(|e| format!("pci_enable_device: {e}"))?;
        dev.enable_msix(1).map_err(|e| format!("enable_msix: {e}"))?;
        let params = Hfi1Params { num_rcv_contexts: nctxt, ..Default::default() };
        let dd = Hfi1Devdata::probe(dev.clone(), params).map_err(|e| format!("probe: {e}"))?;
        let rcd = Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, ctxt).map_err(|e| format!("create ctxt {ctxt}: {e}"))?;
        let pool = DmaPool::new(dev.clone(), true);
        let hdrq = Arc::new(pool.alloc_contiguous(PAGE_SIZE as usize).map_err(|e| format!("header queue: {e}"))?);
        rcd.set_rcvhdrq(hdrq.clone(), None);
        hfi1_rcvctrl(&dd, HFI1_RCVCTRL_CTXT_ENB | HFI1_RCVCTRL_TIDFLOW_ENB, &rcd)
            .map_err(|e| format!("hfi1_rcvctrl: {e}"))?;
        let lb = Hfi1Loopback::new(dev.clone(), &pool).map_err(|e| format!("loopback: {e}"))?;
        let detail = json!({
            "backend": dev.identity().backend,
            "rcv_array_cnt": dd.chip_rcv_array_count,
            "rcv_contexts": dd.chip_rcv_contexts,
            "ctxt": ctxt,
            "expected_base": rcd.expected_base,
            "expected_count": rcd.expected_count,
            "rcvarray_wc_fill": dd.rcvarray_wc,
        });
        Ok((Self { dd, rcd, pool, lb, hdrq }, detail))
    }

    /// Number of the context's expected RcvArray entries the device holds valid, found with zero-length
    /// packets to each entry while flow checking is off: a device-side leak check over MMIO and DMA only.
    pub fn valid_rcv_entries(&self, timeout: Duration) -> Result<u64, String> {
        let op = |op: u32| hfi1_rcvctrl(&self.dd, op, &self.rcd).map_err(|e| format!("hfi1_rcvctrl: {e}"));
        op(HFI1_RCVCTRL_TIDFLOW_DIS)?;
        let descs: Vec<LbDescriptor<'_>> = (0..self.rcd.expected_count)
            .map(|rel| LbDescriptor {
                kdeth0: kdeth0(0, false, rel >> 1, if rel & 1 == 0 { 1 } else { 2 }),
                dest_qp: tid_flow_qp(0, 0, self.rcd.ctxt),
                psn: 0,
                payload: &[],
            })
            .collect();
        let out = self.lb.send(&descs, timeout);
        op(HFI1_RCVCTRL_TIDFLOW_ENB)?;
        let out = out.map_err(|e| format!("loopback: {e}"))?;
        Ok(out.descriptors - out.errors)
    }

    /// Gives the DMA memory back.
    pub fn release(self) {
        let Port { rcd, pool, lb, hdrq, .. } = self;
        lb.release(&pool);
        drop(rcd);
        if let Ok(h) = Arc::try_unwrap(hdrq) {
            h.release(&pool);
        }
    }
}

pub(crate) fn errno(e: i32) -> String {
    format!("errno {e} ({})", std::io::Error::from_raw_os_error(-e))
}

/// Page runs adding up to `pages`, cut from [`FRAGMENT_RUNS`] starting at `phase`.
pub(crate) fn fragment_runs(pages: u64, phase: usize) -> Vec<u64> {
    let mut runs = Vec::new();
    let mut left = pages;
    for run in FRAGMENT_RUNS.iter().cycle().skip(phase % FRAGMENT_RUNS.len()) {
        if left == 0 {
            break;
        }
        let r = (*run).min(left);
        runs.push(r);
        left -= r;
    }
    runs
}

/// Payload bytes no two segments or offsets share.
pub(crate) fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(0x9E37)) >> 13) as u8)
        .collect()
}

/// One QP's TID RDMA request over one buffer.
pub(crate) struct Transfer {
    pub kind: &'static str,
    pub qp: Arc<Hfi1Qp>,
    pub req: TidRdmaRequest,
    pub buf: Arc<DmaBuffer>,
    pub ss: RvtSgeState,
}

impl Transfer {
    pub fn new(
        port: &Port,
        kind: &'static str,
        qpn: u32,
        pmtu: u32,
        segments: u32,
        buf: DmaBuffer,
        do_send: crate::hfi1::qp::DoSend,
    ) -> Result<Self, String> {
        let buf = Arc::new(buf);
        let qp = Hfi1Qp::new(qpn, port.rcd.clone(), QpSendState::new(IbQpType::Rc, pmtu), do_send);
        let mut req = TidRdmaRequest::new(&qp);
        hfi1_kern_exp_rcv_alloc_flows(&mut req).map_err(errno)?;
        req.seg_len = SEG_BYTES as u32;
        req.n_flows = segments;
        let len = u32::try_from(buf.len()).map_err(|_| "buffer too large for one SGE".to_string())?;
        let ss = RvtSgeState::new(vec![RvtSge::new(buf.clone(), 0, len).map_err(errno)?]).map_err(errno)?;
        Ok(Self { kind, qp, req, buf, ss })
    }

    /// The next segment as `hfi1_build_tid_rdma_read_req` sets it up: hardware flow, then receive buffers.
    pub fn setup_segment(&mut self) -> Result<(), i32> {
        let mut g = self.qp.lock();
        hfi1_kern_setup_hw_flow(&self.qp.rcd, &mut g)?;
        let mut last = false;
        hfi1_kern_exp_rcv_setup(&mut self.req, &mut self.ss, &mut last, &mut g)
    }

    /// Sends the segment in ring position `slot`, carrying `payload`, and checks every byte landed in order
    /// at byte `at` of the buffer.
    pub fn send_and_verify(
        &self,
        port: &Port,
        slot: u16,
        at: usize,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<LbOutcome, String> {
        let flow = self.req.flow(slot).ok_or("no such flow")?;
        let pmtu = self.qp.lock().pmtu;
        let packets = tid_rdma_data_packets(flow, tid_flow_qp(0, flow.idx, port.rcd.ctxt), pmtu).map_err(errno)?;
        let descs: Option<Vec<LbDescriptor<'_>>> = packets.iter().map(|p| p.descriptor(payload)).collect();
        let out = port.lb.send(&descs.ok_or("packet outside the payload")?, timeout).map_err(|e| e.to_string())?;
        if out.errors != 0 || out.descriptors != packets.len() as u64 {
            return Err(format!("{} of {} packets rejected, last result {:?}", out.errors, packets.len(), out.last()));
        }
        let mut got = vec![0u8; payload.len()];
        self.buf.read(at, &mut got).map_err(|e| e.to_string())?;
        if let Some(i) = got.iter().zip(payload).position(|(a, b)| a != b) {
            return Err(format!("{} segment {slot}: byte {i} is {:#04x}, sent {:#04x}", self.kind, got[i], payload[i]));
        }
        Ok(out)
    }

    /// Clears every set-up segment and the hardware flow; `leave_queues` also takes the QP off the wait
    /// queues (`tid_rdma_flush_wait`).
    pub fn release(&mut self, leave_queues: bool) -> Result<(), String> {
        let mut g = self.qp.lock();
        let cleared = hfi1_kern_exp_rcv_clear_all(&mut self.req, &mut g);
        let flow = hfi1_kern_clear_hw_flow(&self.qp.rcd, &mut g);
        if leave_queues {
            tid_rdma_flush_wait(&mut g);
        }
        cleared.and(flow).map_err(errno)
    }

    /// `release`, off the queues, and the flow ring freed.
    pub fn teardown(&mut self) -> Result<(), String> {
        self.release(true)?;
        hfi1_kern_exp_rcv_free_flows(&mut self.req).map_err(errno)
    }
}

fn segment_detail(t: &Transfer, slot: u16) -> Value {
    let f = t.req.flow(slot);
    json!({
        "slot": slot,
        "flow_idx": f.map(|f| f.idx),
        "generation": f.map(|f| format!("{:#x}", f.flow_state.generation)),
        "spsn": f.map(|f| f.flow_state.spsn),
        "npagesets": f.map(|f| f.npagesets),
        "tidcnt": f.map(|f| f.tidcnt),
        "npkts": f.map(|f| f.npkts),
        "tidarray": f.map(|f| f.tid_entry.iter().map(|e| format!("{e:#010x}")).collect::<Vec<_>>()),
    })
}

/// The flow-table entry of `flow` as the device holds it: (generation, FLOW_VALID, GEN_MISMATCH).
/// A flow-table entry as the device reports it.
struct DeviceFlow {
    generation: u32,
    valid: bool,
    gen_mismatch: bool,
    seq_mismatch: bool,
}

fn device_flow(port: &Port, flow: u32) -> Result<DeviceFlow, String> {
    let off = RCV_TID_FLOW_TABLE + 8 * u64::from(flow % RXE_NUM_TID_FLOWS);
    let v = port.dd.csr().read_uctxt_csr(port.rcd.ctxt, off).map_err(|e| e.to_string())?;
    Ok(DeviceFlow {
        generation: ((v >> HFI1_KDETH_BTH_SEQ_SHIFT) as u32) & GENERATION_MASK,
        valid: v & RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK != 0,
        gen_mismatch: v & RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK != 0,
        seq_mismatch: v & RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK != 0,
    })
}

fn check_options(opts: &Hfi1DemoOptions) -> Result<(), String> {
    if opts.pmtu != 4096 && opts.pmtu != 8192 {
        return Err(format!("pmtu {} must be 4096 or 8192", opts.pmtu));
    }
    if !(1..=TID_RDMA_MAX_READ_SEGS_PER_REQ).contains(&opts.segments) {
        return Err(format!("segments {} not in 1..={TID_RDMA_MAX_READ_SEGS_PER_REQ}", opts.segments));
    }
    Ok(())
}

/// Runs the hfi1 demo on `dev`. Each step's detail holds the values it observed.
pub fn hfi1_demo(dev: Arc<dyn DeviceAccess>, opts: &Hfi1DemoOptions) -> DemoReport {
    let mut rep = DemoReport::new("hfi1");
    let mut port = None;
    let ok = rep.step("probe and enable the receive context", || {
        check_options(opts)?;
        let (p, detail) = Port::bring_up(dev, opts.ctxt, opts.ctxt + 1)?;
        port = Some(p);
        Ok(detail)
    });
    let Some(port) = port.filter(|_| ok) else { return rep };
    let segs = opts.segments;
    let pages = u64::from(segs) * SEG_PAGES as u64;
    let mut xfers: Vec<Transfer> = Vec::new();
    let ok = rep.step("reserve flows", || {
        let bufs = [
            ("contiguous", port.pool.alloc_contiguous((pages * PAGE_SIZE) as usize)),
            ("fragmented", port.pool.alloc_fragmented(&fragment_runs(pages, 0))),
        ];
        let mut out = Vec::new();
        for (qpn, (kind, buf)) in (1u32..).zip(bufs) {
            let buf = buf.map_err(|e| format!("{kind} buffer: {e}"))?;
            let t = Transfer::new(&port, kind, qpn, opts.pmtu, segs, buf, Box::new(|_| {}))?;
            let mut g = t.qp.lock();
            hfi1_kern_setup_hw_flow(&port.rcd, &mut g).map_err(errno)?;
            let (idx, gen) = (g.flow_state.index, g.flow_state.generation);
            drop(g);
            let DeviceFlow { generation: dev_gen, valid, .. } = device_flow(&port, idx)?;
            if dev_gen != gen || !valid {
                return Err(format!("flow {idx}: device holds generation {dev_gen:#x} valid {valid}, set {gen:#x}"));
            }
            out.push(json!({"qp": qpn, "buffer": kind, "flow_idx": idx, "generation": format!("{gen:#x}"),
                            "device_generation": format!("{dev_gen:#x}"), "flow_valid": valid}));
            xfers.push(t);
        }
        Ok(json!({ "flows": out }))
    });
    if !ok {
        return finish(rep, port, xfers, opts.timeout);
    }
    for t in xfers.iter_mut() {
        let name = format!("set up a {segs}-segment request over {} memory", t.kind);
        let ok = rep.step(&name, || {
            for _ in 0..segs {
                t.setup_segment().map_err(errno)?;
            }
            let runs = if t.kind == "fragmented" { fragment_runs(pages, 0).len() } else { 1 };
            Ok(json!({"pages": pages, "iova_runs": runs, "pmtu": opts.pmtu,
                      "segments": (0..segs as u16).map(|s| segment_detail(t, s)).collect::<Vec<_>>()}))
        });
        if !ok {
            return finish(rep, port, xfers, opts.timeout);
        }
    }
    for wrong in [Mismatch::Generation, Mismatch::Sequence] {
        let name = format!("a packet of the wrong {} is rejected", wrong.name());
        if !rep.step(&name, || psn_mismatch(&port, &xfers[1], wrong, opts.timeout)) {
            return finish(rep, port, xfers, opts.timeout);
        }
    }
    for (n, t) in xfers.iter().enumerate() {
        let name = format!("send through loopback and verify ({})", t.kind);
        let ok = rep.step(&name, || {
            let (mut packets, mut doorbells, mut bytes) = (0, 0, 0);
            for slot in 0..segs as u16 {
                let payload = pattern(SEG_BYTES, ((n as u32) << 8) | u32::from(slot));
                let out = t.send_and_verify(&port, slot, usize::from(slot) * SEG_BYTES, &payload, opts.timeout)?;
                (packets, doorbells, bytes) = (packets + out.descriptors, doorbells + out.doorbells, bytes + SEG_BYTES);
            }
            Ok(json!({"segments": segs, "packets": packets, "doorbells": doorbells, "bytes_verified": bytes}))
        });
        if !ok {
            return finish(rep, port, xfers, opts.timeout);
        }
    }
    finish(rep, port, xfers, opts.timeout)
}

#[derive(Clone, Copy)]
enum Mismatch {
    Generation,
    Sequence,
}

impl Mismatch {
    fn name(self) -> &'static str {
        match self {
            Mismatch::Generation => "generation",
            Mismatch::Sequence => "sequence",
        }
    }
}

/// The first packet of `t`'s first segment, sent with the generation after the flow's, or with the sequence
/// after the one the flow expects: the device must refuse it, set GEN_MISMATCH or SEQ_MISMATCH, keep the flow
/// valid (KEEP_ON_GEN_ERR / KEEP_AFTER_SEQ_ERR are set) and write nothing.
fn psn_mismatch(port: &Port, t: &Transfer, wrong: Mismatch, timeout: Duration) -> Result<Value, String> {
    let flow = t.req.flow(0).ok_or("no flow")?;
    let pmtu = t.qp.lock().pmtu;
    let packets = tid_rdma_data_packets(flow, tid_flow_qp(0, flow.idx, port.rcd.ctxt), pmtu).map_err(errno)?;
    let first = packets.first().ok_or("segment has no packets")?;
    let (gen, spsn) = (flow.flow_state.generation, flow.flow_state.spsn);
    let (sent_gen, sent_seq, want) = match wrong {
        Mismatch::Generation => ((gen + 1) & GENERATION_MASK, spsn, LbResult::GenMismatch),
        Mismatch::Sequence => (gen, (spsn + 1) & HFI1_KDETH_BTH_SEQ_MASK, LbResult::SeqMismatch),
    };
    let payload = vec![0xA5u8; first.len as usize];
    let bad = LbDescriptor {
        kdeth0: first.kdeth0,
        dest_qp: first.dest_qp,
        psn: full_flow_psn(sent_gen, sent_seq),
        payload: &payload,
    };
    let out = port.lb.send(&[bad], timeout).map_err(|e| e.to_string())?;
    let f = device_flow(port, flow.idx)?;
    let status = match wrong {
        Mismatch::Generation => f.gen_mismatch,
        Mismatch::Sequence => f.seq_mismatch,
    };
    let mut seg = vec![0u8; SEG_BYTES];
    t.buf.read(0, &mut seg).map_err(|e| e.to_string())?;
    let placed = seg.iter().filter(|b| **b != 0).count();
    if out.last() != Some(want) || !status || placed != 0 || !f.valid {
        return Err(format!(
            "result {:?}, {} status {status}, FLOW_VALID {}, {placed} bytes placed",
            out.last(),
            wrong.name(),
            f.valid
        ));
    }
    Ok(json!({"flow_idx": flow.idx, "expected": {"generation": format!("{gen:#x}"), "sequence": spsn},
              "sent": {"generation": format!("{sent_gen:#x}"), "sequence": sent_seq},
              "result": format!("{want:?}"), "status_bit_set": status, "flow_still_valid": f.valid,
              "bytes_placed": placed}))
}

/// Last step, also after a failure: clear and free everything, then check nothing is left.
fn finish(mut rep: DemoReport, port: Port, xfers: Vec<Transfer>, timeout: Duration) -> DemoReport {
    rep.step("clear and free", || {
        let mut first_err = None;
        for mut t in xfers {
            if let Err(e) = t.teardown() {
                first_err.get_or_insert(format!("{}: {e}", t.kind));
            }
            if let Ok(buf) = Arc::try_unwrap(t.buf) {
                buf.release(&port.pool);
            }
        }
        let exp = port.rcd.lock_exp();
        let counts = (exp.tid_group_list.count, exp.tid_used_list.count, exp.tid_full_list.count);
        let (flow_mask, ngroups) = (exp.flow_mask, exp.groups.len() as u32);
        drop(exp);
        let valid = port.valid_rcv_entries(timeout)?;
        if let Some(e) = first_err {
            return Err(e);
        }
        if counts != (ngroups, 0, 0) || flow_mask != 0 || valid != 0 {
            return Err(format!("leak: groups free/used/full {counts:?} of {ngroups}, flow_mask {flow_mask:#x}, {valid} RcvArray entries valid"));
        }
        Ok(json!({"free_groups": counts.0, "used_groups": counts.1, "full_groups": counts.2,
                  "flow_mask": flow_mask, "valid_rcv_entries_on_device": valid}))
    });
    port.release();
    rep
}
