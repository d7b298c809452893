//! `udriver hfi1-demo`: the hfi1 TID RDMA receive side doing its real work on a device. Flows are reserved,
//! a multi-segment request is set up over contiguous and over fragmented memory, data is sent through the
//! device's loopback path and verified byte for byte, packets of a wrong generation and a wrong sequence are
//! shown rejected, a TID RDMA READ long enough to cross its flow's PSN space moves to the next generation
//! //! (and packets of the old one are refused), and everything is cleared and freed. `hfi1_stress` drives
//! several QPs on one context, then checks that nothing leaked. Only `DeviceAccess` is used, so the demo
//! runs the same over VFIO, vfio-user and in-process.

#![forbid(unsafe_code)]

mod port;
mod stress;
mod sync;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

pub use port::{SEG_BYTES, SEG_PAGES};
pub use stress::hfi1_stress;

use port::{device_flow, errno, fragment_runs, pattern, DeviceFlow, Port, Transfer};

use super::DemoReport;
use crate::access::DeviceAccess;
use crate::dma::PAGE_SIZE;
use crate::hfi1::exp_rcv::*;
use crate::hfi1::flow::hfi1_kern_setup_hw_flow;
use crate::hfi1::loopback::*;
use crate::hfi1::regs::*;

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
    rep.step(
        "a request crossing the flow PSN space takes a new generation; old-generation packets are rejected",
        || sync::sync_step(&port, opts.pmtu, opts.timeout),
    );
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
