//! udriver against a hostile device.
//!
//! The driver's real hfi1 and irdma code runs over [`Hostile`]: a real engine whose register reads,
//! writes, DMA maps, interrupt waits and DMA-visible memory (CQEs, shadow areas, rings) are perturbed by
//! a fuzzer-chosen script. hfi1: probe, context creation, hardware flows, TID setup and clear over
//! fragmented buffers, `hfi1_setup_wqe`, the TID wakeup queue. irdma: bring-up (dev init, PE ready, CQP
//! and CCQ create) in poll or event mode, NOPs and quad-hash commands posted and waited for, the CE
//! handler, destroy. Oracles: no panic; every call returns within a bound (tiny device timeouts); TID
//! group accounting consistent after every step and fully released after clear-all; no DMA mapping
//! overlapping a live one, no unmap of something not mapped, no mapping left once the driver let go.
#![no_main]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

use device_model::hfi1::{Hfi1, Hfi1Config, WorkerMode};
use device_model::irdma::{Irdma, IrdmaConfig};
use device_model::pci::{Function, PciIds};
use rdma_emu_fuzz::hostile::Hostile;
use testbed::InProcess;
use udriver::access::DeviceAccess;
use udriver::dma::{DmaBuffer, DmaPool};
use udriver::hfi1::ctxt::{Hfi1Ctxtdata, Hfi1Devdata, Hfi1Params};
use udriver::hfi1::exp_rcv::*;
use udriver::hfi1::flow::{hfi1_kern_clear_hw_flow, hfi1_kern_setup_hw_flow};
use udriver::hfi1::loopback::{tid_flow_qp, tid_rdma_data_packets, Hfi1Loopback};
use udriver::hfi1::qp::{Hfi1Qp, IbQpType, QpSendState};
use udriver::hfi1::sge::{RvtSge, RvtSgeState};
use udriver::hfi1::tid::ExpTidSet;
use udriver::hfi1::wqe::{hfi1_setup_wqe, rvt_post_one_wr, Hfi1SwqePriv, IbWrOpcode, RvtAh, RvtSwqe};
use udriver::irdma::process::{irdma_cqp_ce_handler, irdma_handle_cqp_op, irdma_post_cqp_op, irdma_wait_cqp_op};
use udriver::irdma::qhash::{IrdmaQhashTableInfo, IrdmaQuadEntryType, IrdmaQuadHashManageType, IrdmaVsiQos};
use udriver::irdma::{IrdmaCqpCmd, IrdmaCqpWaitMode, IrdmaDev, IrdmaDevConfig, IrdmaHwAttrs};

/// Any one driver call taking longer than this is a hang (the device timeouts below are milliseconds).
const CALL_DEADLINE: Duration = Duration::from_secs(3);
const MAX_OPS: usize = 40;
/// How long the driver waits for a completion or a placement (its CQP timeout, the loopback send's). The
/// inline engines finish a command inside the doorbell write that queued it, and the driver looks before it
/// judges its deadline, so a real completion is always seen; a wait that goes on is for something the
/// hostile device withheld, and what it sees then depends only on how many reads the script has perturbed,
/// not on time. Each such wait is idle time of the input (it was 4 ms, then 2,001 polls of 5 us).
const WITHHELD_WAIT: Duration = Duration::from_micros(500);
const MAX_BUFFERS: usize = 4;

#[derive(Arbitrary, Debug)]
enum HfiOp {
    SetupHwFlow {
        qp: u8,
    },
    ClearHwFlow {
        qp: u8,
    },
    Alloc {
        runs: Vec<u8>,
    },
    Free {
        buf: u8,
    },
    Setup {
        qp: u8,
        buf: u8,
        seg_pages: u8,
        n_flows: u8,
    },
    Clear {
        qp: u8,
    },
    ClearAll {
        qp: u8,
    },
    Wqe {
        qp: u8,
        opcode: u8,
        length: u32,
        buf: u8,
        offset: u16,
        ah: Option<(u8, u8)>,
        post: bool,
    },
    RunWakeups,
    /// Sends the data packets of `qp`'s oldest set-up flow through the loopback path (the responder side).
    Loopback {
        qp: u8,
        fill: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Qhash {
    manage: u8,
    entry_type: u8,
    vlan: Option<u16>,
    ipv4: bool,
    mac: [u8; 6],
    user_pri: u8,
    qp_num: u32,
    dest: [u32; 4],
    src: [u32; 4],
    ports: (u16, u16),
}

#[derive(Arbitrary, Debug)]
enum IrdmaOp {
    Nop,
    Qhash(Qhash),
    PostNop,
    PostQhash(Qhash),
    WaitLast,
    CeHandler,
}

#[derive(Arbitrary, Debug)]
struct Input {
    quiet: u16,
    script: Vec<u8>,
    hfi: Option<(u8, u8, Vec<HfiOp>)>,
    irdma: Option<(u8, u8, bool, Vec<IrdmaOp>)>,
}

struct Devices {
    hfi: Arc<Function>,
    irdma: Arc<Function>,
}

fn devices() -> Option<&'static Devices> {
    static D: OnceLock<Option<Devices>> = OnceLock::new();
    D.get_or_init(|| {
        rdma_emu_fuzz::timing::precise_sleeps();
        // The engines run inline, on the driver's thread inside the doorbell write that queued the work: a
        // completion the hostile device does not withhold is there when the driver first looks.
        let hfi = Hfi1::new(Hfi1Config {
            rcv_contexts: 4,
            rcv_array_count: 512,
            doorbell_queue: 8,
            worker: WorkerMode::Inline,
            ..Default::default()
        })
        .ok()?;
        let ird = Irdma::new(IrdmaConfig {
            qhash_capacity: 8,
            msix_vectors: 4,
            // Inline, nothing consumes a CQE while the worker waits: one look, then the error.
            ccq_full_wait: Duration::ZERO,
            max_ccq_size: 4096,
            worker: WorkerMode::Inline,
        });
        Some(Devices {
            hfi: Function::try_new(Arc::new(hfi), PciIds::hfi1_default()).ok()?,
            irdma: Function::try_new(Arc::new(ird), PciIds::irdma_default()).ok()?,
        })
    })
    .as_ref()
}

fn bounded<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let r = f();
    assert!(start.elapsed() < CALL_DEADLINE, "{what} took {:?}", start.elapsed());
    r
}

/// Which (used, size) a group on a list may have.
type UseRule = fn(u8, u8) -> bool;

/// The three TID group sets agree with each group's use count and with their own counts.
fn check_groups(rcd: &Hfi1Ctxtdata) -> u32 {
    let exp = rcd.lock_exp();
    let sets: [(&str, &ExpTidSet, UseRule); 3] = [
        ("free", &exp.tid_group_list, |u, _| u == 0),
        ("used", &exp.tid_used_list, |u, s| u > 0 && u < s),
        ("full", &exp.tid_full_list, |u, s| u == s),
    ];
    let mut total = 0;
    for (name, set, ok) in sets {
        assert_eq!(set.count as usize, set.list.len(), "{name} list count");
        for g in &set.list {
            let grp = exp.groups.get(*g).unwrap_or_else(|| panic!("{name} list names group {g} that does not exist"));
            assert!(ok(grp.used, grp.size), "group {g} (used {} of {}) on the {name} list", grp.used, grp.size);
            assert_eq!(grp.map.count_ones(), u32::from(grp.used), "group {g} map vs used");
        }
        total += set.count;
    }
    assert_eq!(total as usize, exp.groups.len(), "every group is on exactly one list");
    exp.tid_group_list.count
}

struct QpSlot {
    qp: Arc<Hfi1Qp>,
    req: TidRdmaRequest,
}

fn opcode(o: u8) -> IbWrOpcode {
    use IbWrOpcode::*;
    [
        RdmaWrite,
        RdmaWriteWithImm,
        Send,
        SendWithImm,
        RdmaRead,
        AtomicCmpAndSwp,
        AtomicFetchAndAdd,
        SendWithInv,
        LocalInv,
        RegMr,
        TidRdmaWrite,
        TidRdmaRead,
    ][usize::from(o) % 12]
}

fn run_hfi1(dev: Arc<Hostile>, split: u8, pmtu_sel: u8, ops: Vec<HfiOp>) {
    let access: Arc<dyn DeviceAccess> = dev.clone();
    if bounded("enable", || access.pci_enable_device()).is_err() {
        return;
    }
    let params = Hfi1Params { rcvarr_split: u32::from(split % 101), num_rcv_contexts: 1, ..Default::default() };
    let Ok(dd) = bounded("probe", || Hfi1Devdata::probe(access.clone(), params)) else { return };
    let Ok(rcd) = bounded("create ctxtdata", || Hfi1Ctxtdata::hfi1_create_ctxtdata(&dd, 0)) else { return };
    let groups = check_groups(&rcd);
    let pool = DmaPool::new(access, false);
    let pmtu = [256u32, 512, 1024, 2048, 4096, 8192, 10240][usize::from(pmtu_sel) % 7];
    let sends = Arc::new(AtomicU64::new(0));
    let qp_types = [IbQpType::Rc, IbQpType::Rc, IbQpType::Ud, IbQpType::Smi];
    let mut qps: Vec<QpSlot> = (0..4u32)
        .map(|i| {
            let s = sends.clone();
            let qp = Hfi1Qp::new(
                i + 1,
                rcd.clone(),
                QpSendState::new(qp_types[i as usize], pmtu),
                Box::new(move |_| {
                    s.fetch_add(1, Ordering::Relaxed);
                }),
            );
            let mut req = TidRdmaRequest::new(&qp);
            let _ = hfi1_kern_exp_rcv_alloc_flows(&mut req);
            QpSlot { qp, req }
        })
        .collect();
    let mut bufs: Vec<Arc<DmaBuffer>> = Vec::new();
    let lb = bounded("loopback", || Hfi1Loopback::new(pool.device().clone(), &pool)).ok();
    for op in ops.into_iter().take(MAX_OPS) {
        match op {
            HfiOp::SetupHwFlow { qp } => {
                let s = &qps[usize::from(qp) % 4];
                let _ = bounded("setup hw flow", || hfi1_kern_setup_hw_flow(&rcd, &mut s.qp.lock()));
            }
            HfiOp::ClearHwFlow { qp } => {
                let s = &qps[usize::from(qp) % 4];
                let _ = bounded("clear hw flow", || hfi1_kern_clear_hw_flow(&rcd, &mut s.qp.lock()));
            }
            HfiOp::Alloc { runs } => {
                if bufs.len() < MAX_BUFFERS {
                    let runs: Vec<u64> = runs.iter().take(6).map(|r| u64::from(r % 5)).collect();
                    if let Ok(b) = bounded("alloc", || pool.alloc_fragmented(&runs)) {
                        bufs.push(Arc::new(b));
                    }
                }
            }
            HfiOp::Free { buf } => {
                if !bufs.is_empty() {
                    let i = usize::from(buf) % bufs.len();
                    // Only a buffer the driver no longer references is given back (as a ULP would).
                    match Arc::try_unwrap(bufs.remove(i)) {
                        Ok(b) => b.release(&pool),
                        Err(b) => bufs.push(b),
                    }
                }
            }
            HfiOp::Setup { qp, buf, seg_pages, n_flows } => {
                let Some(b) = (!bufs.is_empty()).then(|| bufs[usize::from(buf) % bufs.len()].clone()) else { continue };
                if b.is_empty() {
                    continue;
                }
                let Ok(sge) = RvtSge::new(b.clone(), 0, b.len() as u32) else { continue };
                let Ok(mut ss) = RvtSgeState::new(vec![sge]) else { continue };
                let s = &mut qps[usize::from(qp) % 4];
                s.req.seg_len = u32::from(seg_pages % 17) * 4096;
                s.req.n_flows = u32::from(n_flows % 10);
                let mut last = false;
                let mut g = s.qp.lock();
                let _ = bounded("exp rcv setup", || hfi1_kern_exp_rcv_setup(&mut s.req, &mut ss, &mut last, &mut g));
            }
            HfiOp::Clear { qp } => {
                let s = &mut qps[usize::from(qp) % 4];
                let mut g = s.qp.lock();
                let _ = bounded("exp rcv clear", || hfi1_kern_exp_rcv_clear(&mut s.req, &mut g));
            }
            HfiOp::ClearAll { qp } => {
                let s = &mut qps[usize::from(qp) % 4];
                let mut g = s.qp.lock();
                let _ = bounded("exp rcv clear all", || hfi1_kern_exp_rcv_clear_all(&mut s.req, &mut g));
            }
            HfiOp::Wqe { qp, opcode: o, length, buf, offset, ah, post } => {
                let s = &qps[usize::from(qp) % 4];
                let sg_list = if bufs.is_empty() {
                    Vec::new()
                } else {
                    let b = bufs[usize::from(buf) % bufs.len()].clone();
                    let off = usize::from(offset) % b.len().max(1);
                    RvtSge::new(b.clone(), off, (b.len() - off) as u32).into_iter().collect()
                };
                let mut wqe = RvtSwqe {
                    opcode: opcode(o),
                    remote_addr: u64::from(offset) << 12,
                    rkey: 0,
                    length,
                    ssn: 0,
                    psn: 0,
                    lpsn: 0,
                    sg_list,
                    ah: ah.map(|(l, sl)| RvtAh { log_pmtu: u32::from(l % 40), sl }),
                    priv_: Some(Box::new(Hfi1SwqePriv::new(TidRdmaRequest::new(&s.qp)))),
                };
                let mut call_send = false;
                let mut g = s.qp.lock();
                let _ = if post {
                    rvt_post_one_wr(&mut g, &mut wqe, &mut call_send)
                } else {
                    hfi1_setup_wqe(&mut g, &mut wqe, &mut call_send)
                };
            }
            HfiOp::RunWakeups => {
                bounded("wakeups", || dd.wq.run_pending(16));
            }
            HfiOp::Loopback { qp, fill } => {
                let (Some(lb), s) = (&lb, &qps[usize::from(qp) % 4]) else { continue };
                let Some(flow) = s.req.flow(s.req.clear_tail) else { continue };
                let dest = tid_flow_qp(s.qp.qp_num, flow.idx, rcd.ctxt);
                let Ok(packets) = tid_rdma_data_packets(flow, dest, pmtu) else { continue };
                let segment = vec![fill; flow.length as usize];
                let descs: Vec<_> = packets.iter().filter_map(|p| p.descriptor(&segment)).collect();
                let _ = bounded("loopback send", || lb.send(&descs, WITHHELD_WAIT));
            }
        }
        check_groups(&rcd);
    }
    // Clearing everything gives every group back, whatever the device did meanwhile.
    for s in &mut qps {
        let mut g = s.qp.lock();
        let _ = bounded("final clear all", || hfi1_kern_exp_rcv_clear_all(&mut s.req, &mut g));
        let _ = hfi1_kern_clear_hw_flow(&rcd, &mut g);
    }
    bounded("final wakeups", || dd.wq.run_pending(64));
    assert_eq!(check_groups(&rcd), groups, "TID groups not all free after clear-all");
    for s in &mut qps {
        let _ = hfi1_kern_exp_rcv_free_flows(&mut s.req);
    }
    drop(qps);
    if let Some(lb) = lb {
        lb.release(&pool);
    }
    for b in bufs {
        match Arc::try_unwrap(b) {
            Ok(b) => b.release(&pool),
            Err(_) => panic!("the driver still holds a buffer after clear-all and free_flows"),
        }
    }
    drop(pool);
}

fn qhash_info(q: &Qhash) -> IrdmaQhashTableInfo {
    use IrdmaQuadEntryType::*;
    let entry_type = [
        IrdmaQhashTypeTcpEstablished,
        IrdmaQhashTypeTcpSyn,
        IrdmaQhashTypeUdpUnicast,
        IrdmaQhashTypeUdpMcast,
        IrdmaQhashTypeRoceMcast,
        IrdmaQhashTypeRocev2Hw,
    ][usize::from(q.entry_type) % 6];
    let manage = [
        IrdmaQuadHashManageType::IrdmaQhashManageTypeDelete,
        IrdmaQuadHashManageType::IrdmaQhashManageTypeAdd,
        IrdmaQuadHashManageType::IrdmaQhashManageTypeModify,
    ][usize::from(q.manage) % 3];
    IrdmaQhashTableInfo {
        vsi: IrdmaVsiQos { qs_handle: [1, 2, 3, 4, 5, 6, 7, 8] },
        manage,
        entry_type,
        vlan_valid: q.vlan.is_some(),
        ipv4_valid: q.ipv4,
        mac_addr: q.mac,
        vlan_id: q.vlan.unwrap_or(0),
        user_pri: q.user_pri % 10,
        qp_num: q.qp_num,
        dest_ip: q.dest,
        src_ip: q.src,
        dest_port: q.ports.0,
        src_port: q.ports.1,
    }
}

fn run_irdma(dev: Arc<Hostile>, sq_sel: u8, ccq_extra: u8, event: bool, ops: Vec<IrdmaOp>) {
    let access: Arc<dyn DeviceAccess> = dev.clone();
    if bounded("enable", || access.pci_enable_device()).is_err() {
        return;
    }
    let pool = Arc::new(DmaPool::new(access, false));
    let sq_size = 4u32 << (sq_sel % 4);
    let config = IrdmaDevConfig {
        hw_attrs: IrdmaHwAttrs {
            // A withheld CCQ completion costs 100 x max_done_count + 1 polls (irdma_sc_poll_for_cqp_op_done):
            // 101 here, with no wait between them (a zero max_sleep), as only the number of looks can change
            // what a look sees (WITHHELD_WAIT).
            max_done_count: 1,
            max_sleep: Duration::ZERO,
            max_pe_ready_count: 1,
            pe_ready_delay: Duration::from_micros(10),
        },
        sq_size,
        ccq_size: sq_size + 2 + u32::from(ccq_extra % 8),
        wait_mode: if event { IrdmaCqpWaitMode::Event { vector: 0 } } else { IrdmaCqpWaitMode::Poll },
        cqp_timeout: WITHHELD_WAIT,
        irq_slice: Duration::from_millis(1),
        ..Default::default()
    };
    let Ok(idev) = bounded("irdma dev new", || IrdmaDev::new(pool.clone(), config)) else {
        drop(pool);
        return;
    };
    let mut posted = Vec::new();
    for op in ops.into_iter().take(MAX_OPS) {
        match op {
            IrdmaOp::Nop => {
                let _ = bounded("nop", || irdma_handle_cqp_op(&idev, IrdmaCqpCmd::Nop));
            }
            IrdmaOp::Qhash(q) => {
                let info = qhash_info(&q);
                let _ = bounded("qhash", || irdma_handle_cqp_op(&idev, IrdmaCqpCmd::ManageQhashTableEntry(info)));
            }
            IrdmaOp::PostNop => {
                if let Ok(s) = bounded("post nop", || irdma_post_cqp_op(&idev, IrdmaCqpCmd::Nop)) {
                    posted.push(s);
                }
            }
            IrdmaOp::PostQhash(q) => {
                let info = qhash_info(&q);
                if let Ok(s) =
                    bounded("post qhash", || irdma_post_cqp_op(&idev, IrdmaCqpCmd::ManageQhashTableEntry(info)))
                {
                    posted.push(s);
                }
            }
            IrdmaOp::WaitLast => {
                if let Some(s) = posted.pop() {
                    let _ = bounded("wait", || irdma_wait_cqp_op(&idev, s));
                }
            }
            IrdmaOp::CeHandler => {
                let _ = bounded("ce handler", || irdma_cqp_ce_handler(&mut idev.lock()));
            }
        }
        let st = idev.lock();
        let ring = st.cqp.sq_ring();
        assert!(ring.used_quanta() <= ring.size(), "CQP SQ uses {} of {} slots", ring.used_quanta(), ring.size());
        assert!(ring.head() < ring.size().max(1) && ring.tail() < ring.size().max(1), "SQ head/tail outside the ring");
        assert!(st.cqp_cmd_head.len() <= posted.len() + MAX_OPS, "backlog grew past what was posted");
    }
    for s in posted {
        let _ = bounded("final wait", || irdma_wait_cqp_op(&idev, s));
    }
    let _ = bounded("destroy", || idev.destroy());
    drop(pool);
}

fuzz_target!(|input: Input| {
    let Some(devs) = devices() else { return };
    if let Some((split, pmtu, ops)) = input.hfi {
        let dev =
            Arc::new(Hostile::new(InProcess::new(devs.hfi.clone()), input.script.clone(), u32::from(input.quiet)));
        run_hfi1(dev.clone(), split, pmtu, ops);
        assert_eq!(dev.violations(), Vec::<String>::new(), "hfi1 driver DMA bookkeeping");
        assert_eq!(dev.live_mappings(), Vec::new(), "hfi1 driver left DMA mappings behind");
    }
    if let Some((sq, ccq, event, ops)) = input.irdma {
        let dev = Arc::new(Hostile::new(InProcess::new(devs.irdma.clone()), input.script, u32::from(input.quiet)));
        run_irdma(dev.clone(), sq, ccq, event, ops);
        assert_eq!(dev.violations(), Vec::<String>::new(), "irdma driver DMA bookkeeping");
        assert_eq!(dev.live_mappings(), Vec::new(), "irdma driver left DMA mappings behind");
    }
});
