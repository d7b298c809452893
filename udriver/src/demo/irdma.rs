//! `udriver irdma-demo` and the irdma stress mode: the control path doing its real work against a device
//! reached only through `DeviceAccess` (VFIO, vfio-user or in-process alike).
//!
//! The demo brings up the CQP and CCQ, manages IPv4/IPv6, listener/established and VLAN quad-hash entries,
//! has segments classified through the loopback block, checks each outcome, and tears down. The stress mode
//! has several threads share the CQP (and its backlog) for a while, then proves the table empty.

#![forbid(unsafe_code)]

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::DemoReport;
use crate::access::DeviceAccess;
use crate::dma::DmaPool;
use crate::irdma::defs::IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY;
use crate::irdma::dev::{irdma_sc_dev_init, irdma_wait_pe_ready};
use crate::irdma::process::{irdma_manage_qhash, irdma_post_cqp_op, irdma_wait_cqp_op};
use crate::irdma::qhash::IrdmaVsiQos;
use crate::irdma::regs::IrdmaHw;
use crate::irdma::{
    IrdmaCcqCqeInfo, IrdmaClassifyResult, IrdmaCqpCmd, IrdmaCqpWaitMode, IrdmaDev, IrdmaDevConfig, IrdmaError,
    IrdmaLoopback, IrdmaQhashTableInfo, IrdmaQuadEntryType, IrdmaQuadHashManageType, IrdmaTcpSegment,
};

use IrdmaQuadEntryType::{IrdmaQhashTypeTcpEstablished as ESTABLISHED, IrdmaQhashTypeTcpSyn as SYN};
use IrdmaQuadHashManageType::{
    IrdmaQhashManageTypeAdd as ADD, IrdmaQhashManageTypeDelete as DELETE, IrdmaQhashManageTypeModify as MODIFY,
};

/// How the demo drives the device.
#[derive(Clone, Copy, Debug)]
pub struct IrdmaDemoOptions {
    /// CQP/CCQ sizes, timeouts and the wait mode (poll, or interrupt on an MSI-X vector).
    pub config: IrdmaDevConfig,
    /// The netdev MAC the entries carry.
    pub mac_addr: [u8; 6],
    /// Bound of one loopback classification.
    pub classify_timeout: Duration,
}

impl Default for IrdmaDemoOptions {
    fn default() -> Self {
        Self {
            config: IrdmaDevConfig::default(),
            mac_addr: [0x00, 0x11, 0x22, 0x33, 0x44, 0x55],
            classify_timeout: Duration::from_secs(5),
        }
    }
}

/// Demo addresses (host-order words, as `irdma_manage_qhash` passes them): 10.0.0.1 / fe80::1 local.
const IP4_LOCAL: [u32; 4] = [0x0A00_0001, 0, 0, 0];
const IP4_REMOTE: [u32; 4] = [0x0A00_0002, 0, 0, 0];
const IP6_LOCAL: [u32; 4] = [0xFE80_0000, 0, 0, 1];
const IP6_REMOTE: [u32; 4] = [0xFE80_0000, 0, 0, 2];
const VLAN: u16 = 100;
const CLASSIFY_POLL: Duration = Duration::from_micros(10);

/// One entry of the demo: the table key plus the QP it steers to.
#[derive(Clone, Copy, Debug)]
struct Conn {
    ipv4: bool,
    listener: bool,
    local_port: u16,
    remote_port: u16,
    vlan: Option<u16>,
    qpn: u32,
}

impl Conn {
    fn ips(&self) -> ([u32; 4], [u32; 4]) {
        if self.ipv4 {
            (IP4_LOCAL, IP4_REMOTE)
        } else {
            (IP6_LOCAL, IP6_REMOTE)
        }
    }

    /// `struct irdma_qhash_table_info` as `irdma_manage_qhash` fills it: remote end only for ESTABLISHED.
    fn info(&self, manage: IrdmaQuadHashManageType, mac_addr: [u8; 6]) -> IrdmaQhashTableInfo {
        let (local, remote) = self.ips();
        IrdmaQhashTableInfo {
            vsi: IrdmaVsiQos::default(),
            manage,
            entry_type: if self.listener { SYN } else { ESTABLISHED },
            vlan_valid: self.vlan.is_some(),
            ipv4_valid: self.ipv4,
            mac_addr,
            vlan_id: self.vlan.unwrap_or(0),
            user_pri: 0,
            qp_num: self.qpn,
            dest_ip: local,
            src_ip: if self.listener { [0; 4] } else { remote },
            dest_port: self.local_port,
            src_port: if self.listener { 0 } else { self.remote_port },
        }
    }

    /// A segment this entry should catch: a SYN for a listener, an ACK for a connection.
    fn segment(&self) -> IrdmaTcpSegment {
        let (local, remote) = self.ips();
        IrdmaTcpSegment {
            ipv4: self.ipv4,
            src_ip: remote,
            dst_ip: local,
            src_port: self.remote_port,
            dst_port: self.local_port,
            vlan: self.vlan,
            syn: self.listener,
            ack: !self.listener,
        }
    }

    fn expected(&self) -> IrdmaClassifyResult {
        if self.listener {
            IrdmaClassifyResult::Listener { qpn: self.qpn }
        } else {
            IrdmaClassifyResult::Established { qpn: self.qpn }
        }
    }

    fn to_json(self) -> Value {
        let (local, remote) = self.ips();
        json!({
            "type": if self.listener { "listener" } else { "established" },
            "local": endpoint(self.ipv4, &local, self.local_port),
            "remote": if self.listener { Value::Null } else { endpoint(self.ipv4, &remote, self.remote_port).into() },
            "vlan": self.vlan,
            "qpn": self.qpn,
        })
    }
}

fn endpoint(ipv4: bool, ip: &[u32; 4], port: u16) -> String {
    if ipv4 {
        format!("{}:{port}", Ipv4Addr::from(ip[0]))
    } else {
        let bits = ip.iter().fold(0u128, |acc, w| (acc << 32) | u128::from(*w));
        format!("[{}]:{port}", Ipv6Addr::from(bits))
    }
}

fn cqe_json(info: &IrdmaCcqCqeInfo) -> Value {
    json!({"wqe_idx": info.wqe_idx, "op": info.op_code, "maj": info.maj_err_code, "min": info.min_err_code})
}

fn err(e: IrdmaError) -> String {
    format!("{e} (errno {})", e.to_errno())
}

/// Runs `info` and requires a clean completion of a quad-hash op.
fn manage(dev: &IrdmaDev, info: &IrdmaQhashTableInfo) -> Result<IrdmaCcqCqeInfo, String> {
    let cqe = irdma_manage_qhash(dev, info).map_err(err)?;
    if cqe.op_code != IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY || cqe.error {
        return Err(format!("unexpected completion {}", cqe_json(&cqe)));
    }
    Ok(cqe)
}

/// Runs `info` and requires the device to refuse it (-EIO with a major code); returns the codes seen.
fn refused(dev: &IrdmaDev, info: &IrdmaQhashTableInfo) -> Result<Value, String> {
    match irdma_manage_qhash(dev, info) {
        Err(e @ IrdmaError::CqeError { maj, min, .. }) if maj != 0 => {
            Ok(json!({"errno": e.to_errno(), "maj": maj, "min": min}))
        }
        Err(e) => Err(format!("expected an error completion, got {}", err(e))),
        Ok(cqe) => Err(format!("expected a refusal, got completion {}", cqe_json(&cqe))),
    }
}

/// Classifies each connection's segment and checks the outcome.
fn classify_all(lb: &IrdmaLoopback, cases: &[(&str, IrdmaTcpSegment, IrdmaClassifyResult)]) -> Result<Value, String> {
    let mut out = Vec::new();
    for (what, seg, want) in cases {
        let got = lb.classify(seg).map_err(err)?;
        if got != *want {
            return Err(format!("{what}: expected {want:?}, got {got:?}"));
        }
        out.push(json!({"segment": what, "target": got.name(), "qpn": got.qpn()}));
    }
    Ok(Value::Array(out))
}

/// Memory and bus mastering on, PE_DB_SIZE and PE readiness checked: the start of every irdma run.
fn bring_up_checks(report: &mut DemoReport, dev: &Arc<dyn DeviceAccess>, config: &IrdmaDevConfig) -> bool {
    report.step("pci_enable_device", || {
        dev.pci_enable_device().map_err(|e| e.to_string())?;
        Ok(json!({"memory": true, "bus_master": true}))
    }) && report.step("irdma_sc_dev_init + irdma_wait_pe_ready", || {
        let hw = IrdmaHw::new(dev.clone());
        let db = irdma_sc_dev_init(&hw).map_err(err)?;
        irdma_wait_pe_ready(&hw, &config.hw_attrs).map_err(err)?;
        Ok(json!({"pe_db_size": db, "pe_db_mib": 2u32 << db, "cpustatus": "0x80 x3"}))
    })
}

fn create(report: &mut DemoReport, pool: &Arc<DmaPool>, config: IrdmaDevConfig) -> Option<IrdmaDev> {
    let mut created = None;
    report.step("create CQP and CCQ (CREATE_CQ)", || {
        let dev = IrdmaDev::new(pool.clone(), config).map_err(err)?;
        let detail = {
            let st = dev.lock();
            json!({
                "sq_size": st.cqp.sq_size, "ccq_size": st.ccq.cq_size,
                "host_ctx_pa": format!("{:#x}", st.cqp.host_ctx_pa), "sq_pa": format!("{:#x}", st.cqp.sq_pa),
                "ccq_pa": format!("{:#x}", st.ccq.cq_pa), "completions": st.cqp.completed_ops,
                "wait": match config.wait_mode {
                    IrdmaCqpWaitMode::Poll => "poll".to_string(),
                    IrdmaCqpWaitMode::Event { vector } => format!("msix vector {vector}"),
                },
            })
        };
        created = Some(dev);
        Ok(detail)
    });
    created
}

fn destroy(report: &mut DemoReport, dev: IrdmaDev) {
    report.step("destroy CCQ (DESTROY_CQ) and CQP", || {
        let (requested, completed) = {
            let st = dev.lock();
            (st.cqp.requested_ops, st.cqp.completed_ops)
        };
        if requested != completed {
            return Err(format!("{requested} commands posted but {completed} completed"));
        }
        dev.destroy().map_err(err)?;
        Ok(json!({"completions": completed}))
    });
}

/// The irdma demo. Every step's detail holds what it observed (QPNs, completions, codes).
pub fn irdma_demo(dev: Arc<dyn DeviceAccess>, opts: &IrdmaDemoOptions) -> DemoReport {
    let mut report = DemoReport::new("irdma");
    if !bring_up_checks(&mut report, &dev, &opts.config) {
        return report;
    }
    let pool = Arc::new(DmaPool::new(dev.clone(), true));
    let Some(irdma) = create(&mut report, &pool, opts.config) else { return report };
    let lb = match IrdmaLoopback::new(&pool, opts.classify_timeout, CLASSIFY_POLL) {
        Ok(lb) => lb,
        Err(e) => {
            report.step("loopback descriptor buffer", || Err(err(e)));
            destroy(&mut report, irdma);
            return report;
        }
    };
    let mac = opts.mac_addr;
    let listen4 = Conn { ipv4: true, listener: true, local_port: 4791, remote_port: 5000, vlan: None, qpn: 7 };
    let conn4 = Conn { listener: false, qpn: 5, ..listen4 };
    let listen6 = Conn { ipv4: false, listener: true, local_port: 4791, remote_port: 6000, vlan: Some(VLAN), qpn: 9 };
    let conn6 = Conn { listener: false, qpn: 11, ..listen6 };
    let conns = [listen4, conn4, listen6, conn6];

    report.step("add qhash entries (IPv4/IPv6, listener/established, VLAN)", || {
        let mut out = Vec::new();
        for c in &conns {
            let cqe = manage(&irdma, &c.info(ADD, mac))?;
            out.push(json!({"entry": c.to_json(), "completion": cqe_json(&cqe)}));
        }
        Ok(Value::Array(out))
    });
    let unknown4 = IrdmaTcpSegment { src_port: 5001, ..conn4.segment() };
    let other_vlan6 = IrdmaTcpSegment { vlan: Some(VLAN + 1), ..listen6.segment() };
    report.step("classify: SYN to listener, established to its QP, unknown to host", || {
        classify_all(
            &lb,
            &[
                ("IPv4 SYN to 10.0.0.1:4791", listen4.segment(), listen4.expected()),
                ("IPv4 ACK of 10.0.0.2:5000", conn4.segment(), conn4.expected()),
                ("IPv4 ACK of unknown 10.0.0.2:5001", unknown4, IrdmaClassifyResult::ToHost),
                ("IPv6 SYN on VLAN 100", listen6.segment(), listen6.expected()),
                ("IPv6 ACK on VLAN 100", conn6.segment(), conn6.expected()),
                ("IPv6 SYN on VLAN 101", other_vlan6, IrdmaClassifyResult::ToHost),
            ],
        )
    });
    report.step("duplicate add is refused", || refused(&irdma, &conn4.info(ADD, mac)));
    let moved4 = Conn { qpn: 6, ..conn4 };
    report.step("modify the IPv4 connection to QP 6", || {
        let cqe = manage(&irdma, &moved4.info(MODIFY, mac))?;
        let got = classify_all(&lb, &[("IPv4 ACK of 10.0.0.2:5000", moved4.segment(), moved4.expected())])?;
        Ok(json!({"completion": cqe_json(&cqe), "classified": got}))
    });
    report.step("delete the IPv4 listener: SYNs go to the host", || {
        let cqe = manage(&irdma, &listen4.info(DELETE, mac))?;
        let got = classify_all(&lb, &[("IPv4 SYN to 10.0.0.1:4791", listen4.segment(), IrdmaClassifyResult::ToHost)])?;
        Ok(json!({"completion": cqe_json(&cqe), "classified": got}))
    });
    report.step("delete of a missing entry is refused", || refused(&irdma, &listen4.info(DELETE, mac)));
    report.step("delete the remaining entries", || {
        let mut out = Vec::new();
        for c in [moved4, listen6, conn6] {
            out.push(cqe_json(&manage(&irdma, &c.info(DELETE, mac))?));
        }
        let gone = [moved4, listen6, conn6].map(|c| (c.segment(), IrdmaClassifyResult::ToHost));
        let cases: Vec<_> = gone.iter().map(|(s, w)| ("deleted entry", *s, *w)).collect();
        let classified = classify_all(&lb, &cases)?;
        Ok(json!({"completions": out, "classified": classified}))
    });
    drop(lb);
    destroy(&mut report, irdma);
    report
}

/// Keys each stress thread cycles through, all posted in one batch: more than the stress SQ holds, so every
/// batch goes partly through the backlog.
const STRESS_KEYS: u16 = 24;
const STRESS_SQ_SIZE: u32 = 16;
const STRESS_MAX_THREADS: usize = 64;
const STRESS_BASE_PORT: u16 = 20000;

/// The stress connections of thread `t`: every kind of entry, disjoint from other threads' keys.
fn stress_conns(t: usize) -> Vec<Conn> {
    (0..STRESS_KEYS)
        .map(|j| Conn {
            ipv4: j % 2 == 0,
            listener: j % 4 < 2,
            local_port: STRESS_BASE_PORT + t as u16 * STRESS_KEYS + j,
            remote_port: 30000 + j,
            vlan: (j % 3 == 0).then_some(VLAN + j),
            qpn: 100 + t as u32,
        })
        .collect()
}

#[derive(Default)]
struct StressStats {
    ops: AtomicU64,
    max_backlog: AtomicU64,
    failed: AtomicBool,
}

/// One batch: post every info without waiting (the backlog absorbs what the SQ cannot), then wait for
/// each and require a clean quad-hash completion.
fn stress_batch(dev: &IrdmaDev, infos: &[IrdmaQhashTableInfo], stats: &StressStats) -> Result<(), String> {
    let mut scratches = Vec::with_capacity(infos.len());
    for i in infos {
        scratches.push(irdma_post_cqp_op(dev, IrdmaCqpCmd::ManageQhashTableEntry(*i)).map_err(err)?);
    }
    let backlog = dev.lock().cqp_cmd_head.len() as u64;
    stats.max_backlog.fetch_max(backlog, Ordering::Relaxed);
    for s in scratches {
        let cqe = irdma_wait_cqp_op(dev, s).map_err(err)?;
        if cqe.op_code != IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY || cqe.error {
            return Err(format!("unexpected completion {}", cqe_json(&cqe)));
        }
        stats.ops.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

fn stress_thread(dev: &IrdmaDev, t: usize, deadline: Instant, stats: &StressStats) -> Result<u64, String> {
    let conns = stress_conns(t);
    let mac = IrdmaDemoOptions::default().mac_addr;
    let mut rounds = 0;
    while Instant::now() < deadline && !stats.failed.load(Ordering::Relaxed) {
        for manage in [ADD, MODIFY, DELETE] {
            // MODIFY steers each entry to another QP.
            let qp_delta = if manage == MODIFY { 1000 } else { 0 };
            let infos: Vec<_> = conns.iter().map(|c| Conn { qpn: c.qpn + qp_delta, ..*c }.info(manage, mac)).collect();
            stress_batch(dev, &infos, stats)?;
        }
        rounds += 1;
    }
    Ok(rounds)
}

/// The irdma stress mode: `threads` threads (1..=64) add, modify and delete quad-hash entries through the one
/// shared CQP for `duration`, batches overfilling a small SQ so the backlog is used. Then every completion
/// must have been seen and none of the keys ever used may remain in the device's table (each delete is
/// refused and each segment goes to the host).
pub fn irdma_stress(dev: Arc<dyn DeviceAccess>, duration: Duration, threads: usize) -> DemoReport {
    let mut report = DemoReport::new("irdma-stress");
    let threads = threads.clamp(1, STRESS_MAX_THREADS);
    // A small SQ so that the threads' batches overfill it; the CCQ holds a completion for every slot.
    let config = IrdmaDevConfig {
        sq_size: STRESS_SQ_SIZE,
        ccq_size: 2 * STRESS_SQ_SIZE,
        cqp_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    if !bring_up_checks(&mut report, &dev, &config) {
        return report;
    }
    let pool = Arc::new(DmaPool::new(dev.clone(), true));
    let Some(irdma) = create(&mut report, &pool, config) else { return report };
    let irdma = Arc::new(irdma);
    let stats = Arc::new(StressStats::default());

    report.step("threads share the CQP", || {
        let start = Instant::now();
        let deadline = start + duration;
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (irdma, stats) = (irdma.clone(), stats.clone());
                std::thread::Builder::new().name(format!("irdma-stress-{t}")).spawn(move || {
                    let r = stress_thread(&irdma, t, deadline, &stats);
                    if r.is_err() {
                        stats.failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let mut rounds = 0;
        let mut first_err = None;
        for (t, w) in workers.into_iter().enumerate() {
            let outcome = match w {
                Ok(handle) => handle.join().unwrap_or_else(|_| Err("thread panicked".into())),
                Err(e) => Err(format!("cannot spawn: {e}")),
            };
            match outcome {
                Ok(r) => rounds += r,
                Err(e) => {
                    first_err.get_or_insert(format!("thread {t}: {e}"));
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let secs = start.elapsed().as_secs_f64();
        let ops = stats.ops.load(Ordering::Relaxed);
        let backlogged = irdma.lock().backlogged_ops;
        Ok(json!({
            "threads": threads, "rounds": rounds, "ops": ops, "ops_per_sec": (ops as f64 / secs).round(),
            "backlogged_ops": backlogged, "max_backlog": stats.max_backlog.load(Ordering::Relaxed),
            "seconds": (secs * 1000.0).round() / 1000.0,
        }))
    });

    report.step("every completion seen", || {
        let st = irdma.lock();
        // CREATE_CQ plus every quad-hash op.
        let want = 1 + stats.ops.load(Ordering::Relaxed);
        if st.cqp.requested_ops != want || st.cqp.completed_ops != want || !st.cqp_cmd_head.is_empty() {
            return Err(format!(
                "posted {}, completed {}, expected {want}, backlog {}",
                st.cqp.requested_ops,
                st.cqp.completed_ops,
                st.cqp_cmd_head.len()
            ));
        }
        Ok(json!({"completions": st.cqp.completed_ops, "backlog": 0}))
    });

    report.step("device table holds none of the keys", || {
        let lb = IrdmaLoopback::new(&pool, Duration::from_secs(5), CLASSIFY_POLL).map_err(err)?;
        let mac = IrdmaDemoOptions::default().mac_addr;
        let mut refusals = 0;
        for c in (0..threads).flat_map(stress_conns) {
            let got = lb.classify(&c.segment()).map_err(err)?;
            if got != IrdmaClassifyResult::ToHost {
                return Err(format!("{} still steers to {got:?}", c.to_json()));
            }
            refused(&irdma, &c.info(DELETE, mac))?;
            refusals += 1;
        }
        Ok(json!({"keys_checked": refusals, "all_to_host": true}))
    });

    match Arc::try_unwrap(irdma) {
        Ok(irdma) => destroy(&mut report, irdma),
        Err(_) => {
            report.step("destroy CCQ (DESTROY_CQ) and CQP", || Err("the CQP is still shared".into()));
        }
    }
    report
}
