//! hfi1 cases: (b) RcvArray programming through the sparse mmap vs trapped writes, (c) expected-receive
//! setup + clear of a 256 KiB segment. Placement (e) and the worker spin are in `placement.rs`.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use device_model::engine::Engine;
use device_model::hfi1::{Hfi1, Hfi1Config};
use device_model::pci::PciIds;
use serde_json::json;

use crate::served::Served;
use udriver::access::DeviceAccess;
use udriver::backend::vfio_user::VfioUserBackend;
use udriver::bench::loopback::Hfi1Driver;
use udriver::bench::{sample, sample_prepared, Better, Case, Samples, Target};
use udriver::dma::PAGE_SIZE;
use udriver::hfi1::exp_rcv::{
    hfi1_kern_exp_rcv_alloc_flows, hfi1_kern_exp_rcv_clear, hfi1_kern_exp_rcv_setup, TidRdmaRequest,
};
use udriver::hfi1::flow::hfi1_kern_setup_hw_flow;
use udriver::hfi1::qp::{Hfi1Qp, IbQpType, QpSendState};
use udriver::hfi1::sge::{RvtSge, RvtSgeState};

pub use udriver::bench::loopback::SEGMENT;
const SEGMENT_PAGES: usize = SEGMENT / PAGE_SIZE as usize;
const PMTU: u32 = 4096;
/// Mapped stores are a few ns each: time them in batches so the clock read does not dominate.
const MAPPED_BATCH: u32 = 4096;
const TRAPPED_BATCH: u32 = 16;
const TARGET_SPEEDUP: f64 = 100.0;
const TARGET_SETUP_CLEAR_NS: f64 = 5000.0;

/// The hfi1 function served over vfio-user and the driver attached to it in direct mode, one receive
/// context owning the whole RcvArray. Fields drop in order: driver state first, the server last.
pub struct Rig {
    pub drv: Hfi1Driver,
    _served: Served,
    pub engine: Arc<Hfi1>,
}

impl std::ops::Deref for Rig {
    type Target = Hfi1Driver;
    fn deref(&self) -> &Hfi1Driver {
        &self.drv
    }
}

impl Rig {
    pub fn new(config: Hfi1Config, map_bars: bool) -> Result<Self, String> {
        let engine = Arc::new(Hfi1::new(config).map_err(|e| format!("hfi1 engine: {e}"))?);
        let served =
            Served::new(engine.clone() as Arc<dyn Engine>, PciIds::hfi1_default()).map_err(|e| e.to_string())?;
        let backend = VfioUserBackend::connect(served.path(), map_bars).map_err(|e| format!("connect: {e}"))?;
        let dev: Arc<dyn DeviceAccess> = Arc::new(backend);
        let drv = Hfi1Driver::probe(dev)?;
        if map_bars && drv.dev.identity().mapped_bars.is_empty() {
            return Err("the server offered no mappable RcvArray".into());
        }
        Ok(Self { drv, _served: served, engine })
    }

    /// Valid entries of the device's effective RcvArray (its control dump), taking every mapped store.
    pub fn valid_entries(&self) -> Result<usize, String> {
        let dump = self.engine.control(&json!({"cmd": "dump"}))?;
        dump["rcv_array"].as_array().map(Vec::len).ok_or_else(|| "dump without rcv_array".to_string())
    }
}

fn entries_per_second(s: &Samples, batch: u32) -> f64 {
    s.per_second() * f64::from(batch)
}

/// (b) Entries/s through the mapping and through trapped REGION_WRITEs, and the ratio.
pub fn rcvarray_programming(budget: Duration) -> Case {
    Case::new("b", "RcvArray programming: sparse mmap vs trapped writes (hfi1_put_tid)").run(|case| {
        let mut rates = [0.0f64; 2];
        for (i, (mapped, batch)) in [(true, MAPPED_BATCH), (false, TRAPPED_BATCH)].into_iter().enumerate() {
            let rig = Rig::new(Hfi1Config::default(), mapped)?;
            let mut next = 0;
            let s = sample(budget, 2, 3, usize::MAX, || rig.program_expected(&mut next, batch))?;
            let rate = entries_per_second(&s, batch);
            // Every entry of the context was programmed at least once, so the device must see them all.
            let written = if s.len() as u64 * u64::from(batch) >= u64::from(rig.rcd.expected_count) {
                rig.rcd.expected_count as usize
            } else {
                next as usize
            };
            let seen = rig.valid_entries()?;
            if seen != written {
                return Err(format!("device holds {seen} valid entries after {written} were programmed"));
            }
            let how = if mapped { "sparse mmap" } else { "trapped REGION_WRITE" };
            case.metric(&format!("{how}: entries/s"), rate, "1/s");
            case.metric(&format!("{how}: ns per entry"), 1e9 / rate.max(1e-9), "ns");
            rates[i] = rate;
        }
        case.target(Target::new(
            "mmap / trapped speed-up",
            rates[0] / rates[1].max(1e-9),
            TARGET_SPEEDUP,
            "x",
            Better::Higher,
        ));
        case.note(format!(
            "batches of {MAPPED_BATCH} (mapped) / {TRAPPED_BATCH} (trapped) hfi1_put_tid calls; afterwards the \
             device's dump must hold every programmed entry as valid (the mapped stores were taken)"
        ));
        Ok(())
    })
}

/// One QP with its hardware flow set up and a request for 256 KiB segments.
struct Segmenter {
    qp: Arc<Hfi1Qp>,
    req: TidRdmaRequest,
}

impl Segmenter {
    fn new(rig: &Rig) -> Result<Self, String> {
        let qp = Hfi1Qp::new(1, rig.rcd.clone(), QpSendState::new(IbQpType::Rc, PMTU), Box::new(|_| {}));
        let mut req = TidRdmaRequest::new(&qp);
        hfi1_kern_exp_rcv_alloc_flows(&mut req).map_err(|e| format!("alloc_flows: {e}"))?;
        req.seg_len = SEGMENT as u32;
        req.n_flows = 1;
        hfi1_kern_setup_hw_flow(&rig.rcd, &mut qp.lock()).map_err(|e| format!("setup_hw_flow: {e}"))?;
        Ok(Self { qp, req })
    }

    fn setup(&mut self, ss: &mut RvtSgeState) -> Result<(), String> {
        let mut last = false;
        self.req.isge = 0;
        hfi1_kern_exp_rcv_setup(&mut self.req, ss, &mut last, &mut self.qp.lock()).map_err(|e| format!("setup: {e}"))
    }

    fn clear(&mut self) -> Result<(), String> {
        hfi1_kern_exp_rcv_clear(&mut self.req, &mut self.qp.lock()).map_err(|e| format!("clear: {e}"))
    }
}

fn sge_state(buf: &Arc<udriver::dma::DmaBuffer>) -> Result<RvtSgeState, String> {
    let sge = RvtSge::new(buf.clone(), 0, SEGMENT as u32).map_err(|e| format!("sge: {e}"))?;
    RvtSgeState::new(vec![sge]).map_err(|e| format!("sge state: {e}"))
}

/// Times setup + clear of one segment over `buf`; also returns (TID entries, packets) of the segment.
fn setup_clear(rig: &Rig, buf: &Arc<udriver::dma::DmaBuffer>, budget: Duration) -> Result<(Samples, u8, u32), String> {
    let mut seg = Segmenter::new(rig)?;
    seg.setup(&mut sge_state(buf)?)?;
    let (tidcnt, npkts) = seg.req.flow(0).map(|f| (f.tidcnt, f.npkts)).ok_or("no flow 0")?;
    seg.clear()?;
    let s = sample_prepared(
        budget,
        100,
        100,
        usize::MAX,
        || sge_state(buf),
        |mut ss| {
            seg.setup(&mut ss)?;
            seg.clear()
        },
    )?;
    Ok((s, tidcnt, npkts))
}

/// (c) ops/s and median latency of setup + clear, contiguous and fragmented, mapped RcvArray.
pub fn exp_rcv_setup_clear(budget: Duration) -> Case {
    Case::new("c", "hfi1_kern_exp_rcv_setup + hfi1_kern_exp_rcv_clear of a 256 KiB segment (direct vfio-user)").run(
        |case| {
            for mapped in [true, false] {
                let rig = Rig::new(Hfi1Config::default(), mapped)?;
                let contiguous = Arc::new(rig.pool.alloc_contiguous(SEGMENT).map_err(|e| e.to_string())?);
                let fragmented = Arc::new(rig.pool.alloc_fragmented(&[1; SEGMENT_PAGES]).map_err(|e| e.to_string())?);
                let how = if mapped { "mapped RcvArray" } else { "trapped RcvArray" };
                for (layout, buf) in [("contiguous", &contiguous), ("fragmented (64 single pages)", &fragmented)] {
                    let (s, tidcnt, npkts) = setup_clear(&rig, buf, budget)?;
                    case.metric(&format!("{how}, {layout}: median"), s.median(), "ns");
                    case.metric(&format!("{how}, {layout}: p99"), s.quantile(0.99), "ns");
                    case.metric(&format!("{how}, {layout}: ops/s"), s.per_second(), "1/s");
                    if mapped {
                        case.note(format!("{layout}: {tidcnt} TID entries, {npkts} packets per segment"));
                        if layout == "contiguous" {
                            case.target(Target::new(
                                "contiguous setup+clear median (mapped)",
                                s.median(),
                                TARGET_SETUP_CLEAR_NS,
                                "ns",
                                Better::Lower,
                            ));
                        }
                    }
                }
            }
            case.note(format!("pmtu {PMTU}, one receive context owning the RcvArray; ops/s at the mean"));
            Ok(())
        },
    )
}
