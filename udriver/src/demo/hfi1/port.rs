//! What the hfi1 demo, its stress mode and its SYNC step share: a device brought up for TID RDMA (`Port`),
//! one QP's request over one buffer (`Transfer`), the device's view of a flow, and the payload patterns.
//! A module of its own, so its users are its children's siblings, not each other's.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

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
pub(crate) const FRAGMENT_RUNS: [u64; 10] = [1, 3, 2, 5, 8, 1, 16, 2, 7, 19];

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

    /// The next segment's receive side as `hfi1_build_tid_rdma_read_req` sets it up (hardware flow, then
    /// receive buffers), without its SYNC rule or READ REQ: these requests stay far below a generation's
    /// 2047 PSNs. The SYNC step (`sync.rs`) drives the whole function.
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

/// A flow-table entry as the device reports it.
pub(crate) struct DeviceFlow {
    pub generation: u32,
    pub valid: bool,
    pub gen_mismatch: bool,
    pub seq_mismatch: bool,
}

/// The flow-table entry of `flow` in the port's context, read from the device.
pub(crate) fn device_flow(port: &Port, flow: u32) -> Result<DeviceFlow, String> {
    let off = RCV_TID_FLOW_TABLE + 8 * u64::from(flow % RXE_NUM_TID_FLOWS);
    let v = port.dd.csr().read_uctxt_csr(port.rcd.ctxt, off).map_err(|e| e.to_string())?;
    Ok(DeviceFlow {
        generation: ((v >> HFI1_KDETH_BTH_SEQ_SHIFT) as u32) & GENERATION_MASK,
        valid: v & RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK != 0,
        gen_mismatch: v & RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK != 0,
        seq_mismatch: v & RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK != 0,
    })
}
