//! Shared rig of the hfi1 integration tests: the device model's real hfi1 engine in a PCI function, run
//! in-process behind `DeviceAccess`, either with every BAR access trapped or with the RcvArray mapped as
//! shared memory (the sparse-mmap fast path a vfio-user client uses).
#![allow(dead_code)]

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use device_model::hfi1::{Hfi1, Hfi1Config};
use device_model::pci::{Function, PciIds};
use serde_json::{json, Value};
use testbed::InProcess;
use udriver::access::{AccessError, DeviceAccess, DeviceIdentity, Result};
use udriver::backend::mmio::MappedBar;
use udriver::dma::{DmaBuffer, DmaMemory, DmaPool};
use udriver::hfi1::ctxt::*;
use udriver::hfi1::exp_rcv::*;
use udriver::hfi1::flow::hfi1_kern_setup_hw_flow;
use udriver::hfi1::loopback::*;
use udriver::hfi1::qp::*;
use udriver::hfi1::regs::HFI1_BAR;
use udriver::hfi1::sge::{RvtSge, RvtSgeState};
use vfio_user_proto::device::{region, Device};

pub const TIMEOUT: Duration = Duration::from_secs(5);
pub const PG: usize = 4096;

/// InProcess with BAR0's sparse-mmap areas (the RcvArray) mapped, as the vfio-user client maps them.
/// `report_mapped` false hides the mapping from `identity()`, to show what the driver's rule prevents.
pub struct MappedInProcess {
    inner: InProcess,
    areas: Vec<MappedBar>,
    report_mapped: bool,
}

impl MappedInProcess {
    pub fn new(device: Arc<dyn Device>, report_mapped: bool) -> Self {
        let info = device.region_info(region::BAR0).expect("BAR0");
        let fd = info.fd.clone().expect("BAR0 has an mmap fd");
        let areas = info
            .sparse_areas
            .iter()
            .map(|a| MappedBar::new(fd.fd.as_fd(), fd.fd_offset + a.offset, a.size, a.offset).expect("mmap"))
            .collect();
        Self { inner: InProcess::new(device), areas, report_mapped }
    }
    fn area(&self, bar: u32, offset: u64) -> Option<&MappedBar> {
        (bar == HFI1_BAR).then(|| self.areas.iter().find(|a| a.covers(offset, 8))).flatten()
    }
}

impl DeviceAccess for MappedInProcess {
    fn identity(&self) -> DeviceIdentity {
        let mut id = self.inner.identity();
        if self.report_mapped {
            id.mapped_bars = vec![HFI1_BAR];
        }
        id
    }
    fn read32(&self, bar: u32, offset: u64) -> Result<u32> {
        self.inner.read32(bar, offset)
    }
    fn write32(&self, bar: u32, offset: u64, value: u32) -> Result<()> {
        self.inner.write32(bar, offset, value)
    }
    fn read64(&self, bar: u32, offset: u64) -> Result<u64> {
        match self.area(bar, offset) {
            Some(a) => a.read64(bar, offset),
            None => self.inner.read64(bar, offset),
        }
    }
    fn write64(&self, bar: u32, offset: u64, value: u64) -> Result<()> {
        match self.area(bar, offset) {
            Some(a) => a.write64(bar, offset, value),
            None => self.inner.write64(bar, offset, value),
        }
    }
    fn dma_map(&self, mem: &Arc<DmaMemory>, offset: u64, len: u64, iova: u64) -> Result<()> {
        self.inner.dma_map(mem, offset, len, iova)
    }
    fn dma_unmap(&self, iova: u64, len: u64) -> Result<()> {
        self.inner.dma_unmap(iova, len)
    }
    fn enable_msix(&self, nvec: u32) -> Result<()> {
        self.inner.enable_msix(nvec)
    }
    fn wait_irq(&self, vector: u32, timeout: Duration) -> Result<bool> {
        self.inner.wait_irq(vector, timeout)
    }
    fn config_read(&self, offset: u64, buf: &mut [u8]) -> std::result::Result<(), AccessError> {
        self.inner.config_read(offset, buf)
    }
    fn config_write(&self, offset: u64, buf: &[u8]) -> std::result::Result<(), AccessError> {
        self.inner.config_write(offset, buf)
    }
}

/// How the rig reaches the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Every access trapped (region read/write).
    Trapped,
    /// The RcvArray mapped as shared memory.
    Mapped,
    /// Mapped, but `identity()` does not say so: the driver keeps `rcv_array_wc_fill` (for the test that
    /// shows why it must not).
    MappedUntold,
    /// A real vfio-user socket: the device model's server on its own thread, udriver's vfio-user backend
    /// (RcvArray mmapped from the sparse area, the rest trapped as REGION_READ/WRITE, DMA through memfds).
    VfioUser,
}

pub const BACKENDS: [Backend; 3] = [Backend::Trapped, Backend::Mapped, Backend::VfioUser];

pub use testbed::Served as ServedSocket;

/// The device: its engine (for control commands) and the driver's view of it.
pub struct Dev {
    pub function: Arc<Function>,
    pub dev: Arc<dyn DeviceAccess>,
    /// Declared after `dev`, so the client is gone before the server stops.
    _served: Option<ServedSocket>,
}

impl Dev {
    pub fn new(config: Hfi1Config, backend: Backend) -> Self {
        let d = Self::unprepared(config, backend);
        // No kernel in between: enable memory space, bus mastering and MSI-X as a driver's probe does.
        d.dev.pci_enable_device().expect("pci_enable_device");
        d.dev.enable_msix(1).expect("enable_msix");
        d
    }

    /// The device as a client first sees it: memory space, bus mastering and MSI-X off.
    pub fn unprepared(config: Hfi1Config, backend: Backend) -> Self {
        let engine = Arc::new(Hfi1::new(config).expect("hfi1 engine"));
        let function = Function::try_new(engine, PciIds::hfi1_default()).expect("function");
        let mut served = None;
        let dev: Arc<dyn DeviceAccess> = match backend {
            Backend::Trapped => Arc::new(InProcess::new(function.clone())),
            Backend::Mapped => Arc::new(MappedInProcess::new(function.clone(), true)),
            Backend::MappedUntold => Arc::new(MappedInProcess::new(function.clone(), false)),
            Backend::VfioUser => {
                let s = ServedSocket::function(function.clone()).expect("serve");
                let dev = udriver::backend::vfio_user::VfioUserBackend::connect(s.path(), true).expect("connect");
                served = Some(s);
                Arc::new(dev)
            }
        };
        Self { function, dev, _served: served }
    }

    /// The device's own view (control socket `dump`).
    pub fn dump(&self) -> Value {
        self.function.engine().control(&json!({"cmd": "dump"})).expect("dump")
    }

    /// Flow `flow` of context `ctxt` as the device decodes it (`None`: entry is 0).
    pub fn flow(&self, ctxt: u32, flow: u32) -> Option<Value> {
        let d = self.dump();
        d["contexts"][ctxt as usize]["flows"]
            .as_array()?
            .iter()
            .find(|f| f["flow"] == json!(flow))
            .map(|f| f["decoded"].clone())
    }

    /// Valid RcvArray entries as (index, buffer IOVA, buffer bytes).
    pub fn rcv_entries(&self) -> Vec<(u64, u64, u64)> {
        let d = self.dump();
        d["rcv_array"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| {
                        let addr = e["addr"].as_str().and_then(|s| u64::from_str_radix(&s[2..], 16).ok());
                        (e["index"].as_u64().unwrap(), addr.unwrap(), e["buf_size"].as_u64().unwrap())
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The driver side: devdata, enabled contexts, a DMA pool and the loopback sender.
pub struct Drv {
    pub dd: Arc<Hfi1Devdata>,
    pub rcds: Vec<Arc<Hfi1Ctxtdata>>,
    pub pool: DmaPool,
    pub lb: Hfi1Loopback,
}

/// Probes, creates and enables `n` kernel contexts with TID flow checking on.
pub fn bring_up(dev: &Arc<dyn DeviceAccess>, n: u32, params: Hfi1Params) -> Drv {
    let dd = Hfi1Devdata::probe(dev.clone(), Hfi1Params { num_rcv_contexts: n, ..params }).expect("probe");
    let pool = DmaPool::new(dev.clone(), false);
    let rcds = (0..n)
        .map(|c| {
            let rcd = Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, c).expect("ctxtdata");
            rcd.set_rcvhdrq(Arc::new(pool.alloc_contiguous(PG).expect("hdrq")), None);
            hfi1_rcvctrl(&dd, HFI1_RCVCTRL_CTXT_ENB | HFI1_RCVCTRL_TIDFLOW_ENB, &rcd).expect("rcvctrl");
            rcd
        })
        .collect();
    let lb = Hfi1Loopback::new(dev.clone(), &pool).expect("loopback");
    Drv { dd, rcds, pool, lb }
}

pub fn qp(rcd: &Arc<Hfi1Ctxtdata>, num: u32, pmtu: u32) -> Arc<Hfi1Qp> {
    Hfi1Qp::new(num, rcd.clone(), QpSendState::new(IbQpType::Rc, pmtu), Box::new(|_| {}))
}

pub fn request(qp: &Arc<Hfi1Qp>, seg_len: u32, n_flows: u32) -> TidRdmaRequest {
    let mut req = TidRdmaRequest::new(qp);
    hfi1_kern_exp_rcv_alloc_flows(&mut req).expect("alloc flows");
    req.seg_len = seg_len;
    req.n_flows = n_flows;
    req
}

pub fn sge_state(buf: &Arc<DmaBuffer>) -> RvtSgeState {
    RvtSgeState::new(vec![RvtSge::new(buf.clone(), 0, buf.len() as u32).expect("sge")]).expect("ss")
}

/// The next segment of `req`: hardware flow (if not held) then `hfi1_kern_exp_rcv_setup`.
pub fn setup_segment(qp: &Arc<Hfi1Qp>, req: &mut TidRdmaRequest, ss: &mut RvtSgeState) -> std::result::Result<(), i32> {
    let mut g = qp.lock();
    hfi1_kern_setup_hw_flow(&qp.rcd, &mut g)?;
    let mut last = false;
    hfi1_kern_exp_rcv_setup(req, ss, &mut last, &mut g)
}

/// A payload no two segments or offsets share.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len).map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8).collect()
}

/// Sends flow `slot` of `req` (its bytes taken from `segment`) through the loopback path.
pub fn send_flow(drv: &Drv, req: &TidRdmaRequest, slot: u16, segment: &[u8], pmtu: u32) -> LbOutcome {
    let flow = req.flow(slot).expect("flow");
    let dest = tid_flow_qp(0, flow.idx, req.rcd.ctxt);
    let packets = tid_rdma_data_packets(flow, dest, pmtu).expect("packets");
    let descs: Vec<LbDescriptor<'_>> = packets.iter().map(|p| p.descriptor(segment).expect("in segment")).collect();
    drv.lb.send(&descs, TIMEOUT).expect("loopback send")
}

/// Bytes `[off, off + len)` of `buf`.
pub fn bytes(buf: &DmaBuffer, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    buf.read(off, &mut v).expect("read");
    v
}

/// The SYNC step against tid_rdma.c:1839 (a segment of npkts packets fits while psn + npkts <= 2047): 256 KiB
/// segments are 64 packets at pmtu 4096 and 32 at 8192, so segment 31 (resp. 63) is the SYNC point; the
/// flow is parked on the reserved generation (kern_clear_hw_flow) and comes back with the next one
/// (kern_flow_generation_next), sequence 0; both old-generation packets are refused with nothing placed.
pub fn check_sync_step(s: &Value, pmtu: u32) {
    let (segments, npkts) = if pmtu == 4096 { (32, 64) } else { (64, 32) };
    assert_eq!((s["segments"].clone(), s["packets_per_segment"].clone()), (json!(segments), json!(npkts)), "{s}");
    assert_eq!((s["sync_segment"].clone(), s["packets"].clone()), (json!(segments - 1), json!(segments * npkts)));
    assert_eq!(s["bytes_verified"], json!(segments as usize * 256 * 1024));
    assert_eq!(s["waited_for_pending_segment"], json!(true));
    assert_eq!(s["old"]["last_spsn"], json!((segments - 2) * npkts), "the last segment of the old generation");
    let gen = |v: &Value| u32::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
    let (old, new) = (gen(&s["old"]["generation"]), gen(&s["new"]["generation"]));
    let next = if (old + 1) & 0xFFFFF == 0xFFFFF { 0 } else { (old + 1) & 0xFFFFF };
    assert_eq!(new, next);
    assert_eq!(s["new"]["spsn"], json!(0));
    let dg = &s["device_generation"];
    assert_eq!((gen(&dg["before_sync"]), gen(&dg["cleared"]), gen(&dg["after_sync"])), (old, 0xFFFFF, new));
    let stale = &s["old_generation_packets"];
    assert_eq!((stale["refused"].clone(), stale["bytes_placed"].clone()), (json!(2), json!(0)));
    assert_eq!(stale["sequences"], json!([0, (segments - 1) * npkts]));
    assert_eq!((stale["result"].clone(), stale["flow_still_valid"].clone()), (json!("GenMismatch"), json!(true)));
}
