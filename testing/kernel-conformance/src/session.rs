//! A whole control-path session run by the kernel's ctrl.c, step by step, for the `kernel-irdma` binary:
//! bring-up, quad-hash entries of every kind the device classifies, modify, delete, teardown. Each step
//! reports what the kernel returned; the first failing step ends the session (teardown still runs).

#![forbid(unsafe_code)]

use std::sync::Arc;

use serde_json::{json, Value};
use udriver::dma::DmaPool;

use crate::kernel::{KcCcqParams, KcCqeInfo, KcCqpParams, KcQhash, KernelHwAttrs};
use crate::{Delays, KernelError, KernelIrdma, ShimEnv};

/// defs.h / type.h values the session uses.
const IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY: u8 = 0x25;
const IRDMA_CQPHC_HW_MAJVER_GEN_2: u16 = 1;
const IW_CCQ_SIZE: u32 = 2049;
const MANAGE_DELETE: u32 = 0;
const MANAGE_ADD: u32 = 1;
const MANAGE_MODIFY: u32 = 2;
const TCP_ESTABLISHED: u32 = 1;
const TCP_SYN: u32 = 2;

#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    pub sq_size: u32,
    pub mac_addr: [u8; 6],
}

impl Default for SessionOptions {
    /// The kernel's own sizes (IRDMA_CQP_SW_SQSIZE_2048, IW_CCQ_SIZE of 6.12).
    fn default() -> Self {
        Self { sq_size: 2048, mac_addr: [0x00, 0x11, 0x22, 0x33, 0x44, 0x55] }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub name: String,
    pub ok: bool,
    pub detail: Value,
}

fn cqe_json(i: &KcCqeInfo) -> Value {
    json!({"scratch": i.scratch, "op_code": i.op_code, "error": i.error != 0,
           "maj_err_code": format!("{:#06x}", i.maj_err_code), "min_err_code": format!("{:#06x}", i.min_err_code),
           "op_ret_val": i.op_ret_val})
}

/// dest = the local end, src = the remote end, as cm.c fills the info.
fn entry(manage: u32, entry_type: u32, v6: bool, vlan: Option<u16>, qp_num: u32, mac: [u8; 6]) -> KcQhash {
    let established = entry_type == TCP_ESTABLISHED;
    let (local, remote) = if v6 {
        ([0xFE80_0000, 0, 0, 1], [0xFE80_0000, 0, 0, 2])
    } else {
        ([0x0A00_0001, 0, 0, 0], [0x0A00_0002, 0, 0, 0])
    };
    KcQhash {
        manage,
        entry_type,
        qp_num,
        dest_ip: local,
        src_ip: if established { remote } else { [0; 4] },
        dest_port: 4791,
        src_port: if established { 5000 } else { 0 },
        vlan_id: vlan.unwrap_or(0),
        vlan_valid: vlan.is_some().into(),
        ipv4_valid: (!v6).into(),
        mac_addr: mac,
        ..Default::default()
    }
}

struct Runner {
    k: KernelIrdma,
    steps: Vec<Step>,
}

impl Runner {
    fn record(&mut self, name: &str, r: Result<Value, KernelError>) -> bool {
        let (ok, detail) = match r {
            Ok(v) => (true, v),
            Err(e) => (false, json!({"error": e.to_string(), "errno": e.errno})),
        };
        self.steps.push(Step { name: name.into(), ok, detail });
        ok
    }

    fn qhash(&mut self, name: &str, q: &KcQhash, scratch: u64) -> bool {
        let r = self.k.irdma_process_cqp_cmd_qhash(q, scratch).and_then(|()| {
            let mut info = KcCqeInfo::default();
            let r = self.k.irdma_sc_poll_for_cqp_op_done(IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY, &mut info);
            r.map(|()| cqe_json(&info)).map_err(|e| KernelError { func: e.func, errno: e.errno })
        });
        self.record(name, r)
    }
}

/// hw.c's order: dev init, CQP init and create, CCQ init and create (its completion polled from the CCQ).
fn bring_up(r: &mut Runner, opts: &SessionOptions) -> bool {
    let res = r.k.irdma_sc_dev_init(KernelHwAttrs::default()).map(|()| json!({}));
    if !r.record("irdma_sc_dev_init", res) {
        return false;
    }
    let p = KcCqpParams {
        sq_size: opts.sq_size,
        hw_maj_ver: IRDMA_CQPHC_HW_MAJVER_GEN_2,
        hmc_profile: 1,
        ..Default::default()
    };
    let res = r.k.irdma_sc_cqp_init(&p).map(|()| json!({"sq_size": opts.sq_size}));
    if !r.record("irdma_sc_cqp_init", res) {
        return false;
    }
    let (mut maj, mut min) = (0, 0);
    let res = r.k.irdma_sc_cqp_create(&mut maj, &mut min);
    let s = r.k.state();
    let res = res.map(|()| json!({"host_ctx_pa": format!("{:#x}", s.host_ctx_pa), "sq_pa": format!("{:#x}", s.sq_pa)}));
    if !r.record("irdma_sc_cqp_create", res) {
        return false;
    }
    let p = KcCcqParams { num_elem: IW_CCQ_SIZE, ceq_id_valid: 1, shadow_read_threshold: 16, ..Default::default() };
    let res = r.k.irdma_sc_ccq_init(&p).and_then(|()| r.k.irdma_sc_ccq_create(0, true, true));
    let pa = r.k.state().ccq_pa;
    r.record(
        "irdma_sc_ccq_init + irdma_sc_ccq_create",
        res.map(|()| json!({"ccq_size": IW_CCQ_SIZE, "ccq_pa": format!("{pa:#x}")})),
    )
}

/// Runs the session on the device behind `pool` (real delays: a real device model answers).
pub fn run_session(pool: Arc<DmaPool>, opts: &SessionOptions) -> Result<Vec<Step>, crate::EnvError> {
    let env = ShimEnv::new(pool, Delays::Real)?;
    let mut r = Runner { k: KernelIrdma::new(env.clone())?, steps: Vec::new() };
    let up = bring_up(&mut r, opts);
    if up {
        let mac = opts.mac_addr;
        let entries = [
            ("IPv4 listener, QP 7", entry(MANAGE_ADD, TCP_SYN, false, None, 7, mac)),
            ("IPv4 connection, QP 5", entry(MANAGE_ADD, TCP_ESTABLISHED, false, None, 5, mac)),
            ("IPv6 listener on VLAN 100, QP 9", entry(MANAGE_ADD, TCP_SYN, true, Some(100), 9, mac)),
            ("IPv6 connection on VLAN 100, QP 11", entry(MANAGE_ADD, TCP_ESTABLISHED, true, Some(100), 11, mac)),
        ];
        let mut all = true;
        for (i, (what, q)) in entries.iter().enumerate() {
            all &= r.qhash(&format!("add {what}"), q, 0x100 + i as u64);
        }
        if all {
            let moved = entry(MANAGE_MODIFY, TCP_ESTABLISHED, false, None, 6, mac);
            r.qhash("modify the IPv4 connection to QP 6", &moved, 0x200);
            for (i, (what, q)) in entries.iter().enumerate() {
                let del = KcQhash { manage: MANAGE_DELETE, ..*q };
                r.qhash(&format!("delete {what}"), &del, 0x300 + i as u64);
            }
        }
        let res = r.k.irdma_sc_ccq_destroy(0, true).map(|()| json!({}));
        r.record("irdma_sc_ccq_destroy", res);
    }
    if r.k.state().sq_va != 0 {
        let res = r.k.irdma_sc_cqp_destroy().map(|()| json!({}));
        r.record("irdma_sc_cqp_destroy", res);
    }
    let Runner { k, mut steps } = r;
    drop(k);
    let bugs = env.take_bugs();
    steps.push(Step {
        name: "teardown".into(),
        ok: bugs.is_empty() && env.dma_allocations() == 0,
        detail: json!({"bugs": bugs, "dma_allocations_left": env.dma_allocations()}),
    });
    Ok(steps)
}
