//! The kernel's own control path (ctrl.c, unmodified) drives the irdma device model: dev init, CQP and
//! CCQ create, quad-hash add/modify/delete for IPv4/IPv6, VLAN, SYN and established entries, CQE handling,
//! arming with the kernel's GLINT_CEQCTL programming, and teardown. Every test runs in-process and over a
//! real vfio-user socket.
//!
//! Expected values: opcodes and enums from the kernel source (defs.h, type.h), error codes from the device
//! model's documented table (docs/irdma-device.md), classification from the entries the kernel added.

// Nothing to run without the kernel source (build.rs says so and how to get it).
#![cfg(kernel_source)]

use std::time::Duration;

use device_model::engine::Engine;
use device_model::irdma::IrdmaConfig;
use kernel_conformance::backend::{IrdmaModel, Transport};
use kernel_conformance::kernel::{KcCcqParams, KcCqeInfo, KcCqpParams, KcQhash};
use kernel_conformance::{Delays, KernelHwAttrs, KernelIrdma, ShimEnv};
use serde_json::{json, Value};

// defs.h
const IRDMA_CQP_OP_CREATE_CQ: u8 = 0x03;
const IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY: u8 = 0x25;
const IRDMA_CQPHC_HW_MAJVER_GEN_2: u16 = 1;
// type.h enum irdma_quad_hash_manage_type / irdma_quad_entry_type
const DELETE: u32 = 0;
const ADD: u32 = 1;
const MODIFY: u32 = 2;
const ESTABLISHED: u32 = 1;
const SYN: u32 = 2;
// main.h IW_CCQ_SIZE (IRDMA_CQP_SW_SQSIZE_2048 + 1)
const IW_CCQ_SIZE: u32 = 2049;
// Device codes (docs/irdma-device.md).
const MAJ_QHASH: u16 = 0x8002;
const MIN_DUPLICATE: u16 = 0x0001;
const MIN_MISSING: u16 = 0x0002;

const TRANSPORTS: [Transport; 2] = [Transport::InProcess, Transport::VfioUser];
const MAC: [u8; 6] = [0x00, 0x11, 0x22, 0x33, 0x44, 0x55];
const IP4_LOCAL: u32 = 0x0A00_0001;
const IP4_REMOTE: u32 = 0x0A00_0002;
const IP6_LOCAL: [u32; 4] = [0xFE80_0000, 0, 0, 1];
const IP6_REMOTE: [u32; 4] = [0xFE80_0000, 0, 0, 2];

struct Rig {
    model: IrdmaModel,
    k: KernelIrdma,
}

impl Rig {
    fn new(t: Transport) -> Rig {
        let model = IrdmaModel::new(IrdmaConfig::default(), t).unwrap();
        let env = ShimEnv::new(model.pool.clone(), Delays::Real).unwrap();
        let k = KernelIrdma::new(env).unwrap();
        Rig { model, k }
    }

    fn dump(&self) -> Value {
        self.model.engine.control(&json!({"cmd": "dump"})).unwrap()
    }

    /// hw.c irdma_create_cqp + irdma_create_ccq, as the kernel brings them up for GEN2.
    fn up(&mut self, sq_size: u32) {
        self.k.irdma_sc_dev_init(KernelHwAttrs::default()).unwrap();
        let cqp =
            KcCqpParams { sq_size, hw_maj_ver: IRDMA_CQPHC_HW_MAJVER_GEN_2, hmc_profile: 1, ..Default::default() };
        self.k.irdma_sc_cqp_init(&cqp).unwrap();
        let (mut maj, mut min) = (0xFFFF, 0xFFFF);
        self.k.irdma_sc_cqp_create(&mut maj, &mut min).unwrap();
        let ccq =
            KcCcqParams { num_elem: IW_CCQ_SIZE, ceq_id_valid: 1, shadow_read_threshold: 16, ..Default::default() };
        self.k.irdma_sc_ccq_init(&ccq).unwrap();
        self.k.irdma_sc_ccq_create(0, true, true).unwrap();
    }

    /// Posts one qhash command through irdma_process_cqp_cmd and waits for its CQE.
    fn qhash(&mut self, q: &KcQhash, scratch: u64) -> (Result<(), i32>, KcCqeInfo) {
        self.k.irdma_process_cqp_cmd_qhash(q, scratch).unwrap();
        let mut info = KcCqeInfo::default();
        let r = self.k.irdma_sc_poll_for_cqp_op_done(IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY, &mut info);
        (r.map_err(|e| e.errno), info)
    }

    fn down(mut self) {
        self.k.irdma_sc_ccq_destroy(0, true).unwrap();
        self.k.irdma_sc_cqp_destroy().unwrap();
        let env = self.k.env().clone();
        drop(self.k);
        assert_eq!(env.dma_allocations(), 0, "teardown frees every coherent allocation");
        assert_eq!(env.take_bugs(), Vec::<String>::new());
        let d = self.model.engine.control(&json!({"cmd": "dump"})).unwrap();
        assert_eq!((d["cqp"].clone(), d["ccq"].clone()), (Value::Null, Value::Null), "the device forgot both");
    }
}

/// dest = local end, src = remote end, as cm.c fills irdma_qhash_table_info.
fn entry(manage: u32, entry_type: u32, ipv4: bool, ports: (u16, u16), vlan: Option<u16>, qp_num: u32) -> KcQhash {
    let (dest_ip, src_ip) = if ipv4 { ([IP4_LOCAL, 0, 0, 0], [IP4_REMOTE, 0, 0, 0]) } else { (IP6_LOCAL, IP6_REMOTE) };
    let established = entry_type == ESTABLISHED;
    KcQhash {
        manage,
        entry_type,
        qp_num,
        dest_ip,
        src_ip: if established { src_ip } else { [0; 4] },
        vlan_id: vlan.unwrap_or(0),
        vlan_valid: vlan.is_some() as u8,
        ipv4_valid: ipv4 as u8,
        dest_port: ports.0,
        src_port: if established { ports.1 } else { 0 },
        mac_addr: MAC,
        ..Default::default()
    }
}

/// A segment from the remote end to the local one.
fn classify(rig: &Rig, ipv4: bool, ports: (u16, u16), vlan: Option<u16>, syn: bool, ack: bool) -> Value {
    let (src, dst) = if ipv4 { ("10.0.0.2", "10.0.0.1") } else { ("fe80::2", "fe80::1") };
    let req = json!({"cmd": "classify", "src_ip": src, "dst_ip": dst, "src_port": ports.1, "dst_port": ports.0,
                     "vlan": vlan, "syn": syn, "ack": ack});
    rig.model.engine.control(&req).unwrap()
}

fn target(t: &str, qpn: Option<u32>) -> Value {
    match qpn {
        Some(q) => json!({"target": t, "qpn": q}),
        None => json!({"target": t}),
    }
}

#[test]
fn the_kernel_creates_the_cqp_and_ccq_the_device_accepts_and_destroys_them() {
    for t in TRANSPORTS {
        let mut rig = Rig::new(t);
        rig.up(2048);
        let d = rig.dump();
        assert_eq!(d["registers"]["CCQPSTATUS"], "0x00000001", "{t:?}: CCQP_DONE, no error");
        let s = rig.k.state();
        // The kernel hands CCQPHIGH:CCQPLOW the host context's address.
        let ctx_pa = format!("{:#010x}", s.host_ctx_pa as u32);
        assert_eq!(d["registers"]["CCQPLOW"], ctx_pa.as_str(), "{t:?}");
        // The CCQ's own CREATE_CQ completion came through the CCQ: WQE 0 done, ring moved by one.
        assert_eq!((s.sq_head, s.sq_tail, s.ccq_head, s.polarity, s.ccq_polarity), (1, 1, 1, 1, 1), "{t:?}");
        assert!(d["ccq"].is_object(), "{t:?}: {}", d["ccq"]);
        rig.down();
    }
}

#[test]
fn kernel_quad_hash_entries_route_segments_to_the_qps_they_name() {
    for t in TRANSPORTS {
        let mut rig = Rig::new(t);
        rig.up(64);
        let (p4, p6) = ((4791, 5000), (4791, 6000));
        let adds = [
            entry(ADD, SYN, true, p4, None, 7),
            entry(ADD, ESTABLISHED, true, p4, None, 5),
            entry(ADD, SYN, false, p6, Some(100), 9),
            entry(ADD, ESTABLISHED, false, p6, Some(100), 11),
        ];
        for (i, q) in adds.iter().enumerate() {
            let (r, info) = rig.qhash(q, 0x100 + i as u64);
            assert_eq!(r, Ok(()), "{t:?}: add {i}");
            assert_eq!((info.scratch, info.op_code, info.error, info.cqp_is_ours), (0x100 + i as u64, 0x25, 0, 1));
        }
        assert_eq!(rig.dump()["qhash"]["len"], 4, "{t:?}");
        let cases = [
            ("IPv4 SYN to the listener", classify(&rig, true, p4, None, true, false), target("listener", Some(7))),
            ("IPv4 established", classify(&rig, true, p4, None, false, true), target("established", Some(5))),
            ("IPv6 SYN on VLAN 100", classify(&rig, false, p6, Some(100), true, false), target("listener", Some(9))),
            (
                "IPv6 established, VLAN 100",
                classify(&rig, false, p6, Some(100), false, true),
                target("established", Some(11)),
            ),
            ("IPv6 SYN on another VLAN", classify(&rig, false, p6, Some(101), true, false), target("host", None)),
        ];
        for (what, got, want) in cases {
            assert_eq!(got, want, "{t:?}: {what}");
        }

        // A duplicate add is refused by the device; the kernel reports the CQE's codes with -EIO.
        let (r, info) = rig.qhash(&adds[0], 0x200);
        assert_eq!((r, info.error, info.maj_err_code, info.min_err_code), (Err(-5), 1, MAJ_QHASH, MIN_DUPLICATE));

        // MODIFY moves the IPv4 connection to QP 6; DELETE of the IPv4 listener sends its SYNs to the host.
        assert_eq!(rig.qhash(&entry(MODIFY, ESTABLISHED, true, p4, None, 6), 0x300).0, Ok(()));
        assert_eq!(rig.qhash(&entry(DELETE, SYN, true, p4, None, 0), 0x301).0, Ok(()));
        assert_eq!(classify(&rig, true, p4, None, false, true), target("established", Some(6)), "{t:?}");
        assert_eq!(classify(&rig, true, p4, None, true, false), target("host", None), "{t:?}");

        // Deleting what is not there is refused with the device's "missing" code.
        let (r, info) = rig.qhash(&entry(DELETE, SYN, true, p4, None, 0), 0x302);
        assert_eq!((r, info.maj_err_code, info.min_err_code), (Err(-5), MAJ_QHASH, MIN_MISSING), "{t:?}");
        for q in &adds[1..] {
            let mut del = *q;
            del.manage = DELETE;
            assert_eq!(rig.qhash(&del, 0x400).0, Ok(()), "{t:?}");
        }
        assert_eq!(rig.dump()["qhash"]["len"], 0, "{t:?}");
        assert_eq!(classify(&rig, false, p6, Some(100), false, true), target("host", None), "{t:?}");
        rig.down();
    }
}

#[test]
fn the_kernel_backlog_and_both_rings_wrap_against_the_device() {
    for t in TRANSPORTS {
        let mut rig = Rig::new(t);
        rig.up(4);
        // 3 usable slots: posting 5 without waiting queues 2 on dev->cqp_cmd_head.
        for round in 0..12u16 {
            for i in 0..5u16 {
                let q = entry(if round % 2 == 0 { ADD } else { DELETE }, SYN, true, (1000 + i, 0), None, 3);
                rig.k.irdma_process_cqp_cmd_qhash(&q, u64::from(round * 5 + i)).unwrap();
            }
            assert_eq!(rig.k.state().backlog_len, 2, "{t:?} round {round}: SQ full, two wait");
            let mut done = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while done.len() < 5 {
                assert!(std::time::Instant::now() < deadline, "{t:?} round {round}: only {done:?} completed");
                let mut info = KcCqeInfo::default();
                if rig.k.irdma_sc_ccq_get_cqe_info(&mut info).is_ok() {
                    assert_eq!(info.error, 0, "{t:?} round {round}");
                    done.push(info.scratch);
                    rig.k.irdma_process_bh().unwrap();
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
            let want: Vec<u64> = (0..5).map(|i| u64::from(round * 5 + i)).collect();
            assert_eq!(done, want, "{t:?} round {round}: completions in posting order");
        }
        let s = rig.k.state();
        // 1 (CREATE_CQ) + 60 commands through a 4-entry SQ.
        assert_eq!((s.requested_ops, s.completed_ops, s.sq_head), (61, 61, 61 % 4), "{t:?}");
        assert_eq!(rig.dump()["qhash"]["len"], 0, "{t:?}");
        rig.down();
    }
}

#[test]
fn an_armed_ccq_interrupts_on_the_vector_the_kernel_programmed() {
    for t in TRANSPORTS {
        let mut rig = Rig::new(t);
        rig.up(16);
        rig.model.access.enable_msix(2).unwrap();
        // icrdma_cfg_ceq(dev, ceq 0, vector 1, enable): CAUSE_ENA | ITR_INDX 3 | MSIX_INDX 1.
        rig.k.irdma_cfg_ceq(0, 1, true);
        assert_eq!(rig.dump()["registers"]["GLINT_CEQCTL"][0], "0x40001801", "{t:?}");
        rig.k.irdma_sc_ccq_arm();
        rig.k.irdma_process_cqp_cmd_qhash(&entry(ADD, SYN, true, (80, 0), None, 1), 9).unwrap();
        assert!(rig.model.access.wait_irq(1, Duration::from_secs(5)).unwrap(), "{t:?}: vector 1 fired");
        let mut info = KcCqeInfo::default();
        rig.k.irdma_sc_poll_for_cqp_op_done(IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY, &mut info).unwrap();
        assert_eq!(info.scratch, 9);
        assert_eq!(rig.qhash(&entry(DELETE, SYN, true, (80, 0), None, 1), 10).0, Ok(()));
        rig.down();
    }
}

#[test]
fn ccq_create_polls_its_own_completion_out_of_the_new_ccq() {
    for t in TRANSPORTS {
        let mut rig = Rig::new(t);
        rig.k.irdma_sc_dev_init(KernelHwAttrs::default()).unwrap();
        let cqp =
            KcCqpParams { sq_size: 8, hw_maj_ver: IRDMA_CQPHC_HW_MAJVER_GEN_2, hmc_profile: 1, ..Default::default() };
        rig.k.irdma_sc_cqp_init(&cqp).unwrap();
        rig.k.irdma_sc_cqp_create(&mut 0, &mut 0).unwrap();
        rig.k.irdma_sc_ccq_init(&KcCcqParams { num_elem: 8, ceq_id_valid: 1, ..Default::default() }).unwrap();
        // Built without posting, then posted and polled by hand: the same functions ccq_create chains.
        rig.k.irdma_sc_ccq_create(0x77, true, false).unwrap();
        rig.k.irdma_sc_cqp_post_sq();
        let mut info = KcCqeInfo::default();
        rig.k.irdma_sc_poll_for_cqp_op_done(IRDMA_CQP_OP_CREATE_CQ, &mut info).unwrap();
        assert_eq!((info.scratch, info.op_code, info.error), (0x77, IRDMA_CQP_OP_CREATE_CQ, 0), "{t:?}");
        rig.down();
    }
}

#[test]
fn the_harness_reports_the_kernel_source_it_was_built_from() {
    assert!(
        kernel_conformance::KERNEL_SOURCE_VERSION.starts_with("linux-source-6.12 "),
        "{}",
        kernel_conformance::KERNEL_SOURCE_VERSION
    );
}

#[test]
fn the_kernel_irdma_session_passes_every_step_on_both_transports() {
    use kernel_conformance::session::{run_session, SessionOptions};
    for t in TRANSPORTS {
        let model = IrdmaModel::new(IrdmaConfig::default(), t).unwrap();
        let steps = run_session(model.pool.clone(), &SessionOptions { sq_size: 16, ..Default::default() }).unwrap();
        let failed: Vec<_> = steps.iter().filter(|s| !s.ok).collect();
        assert!(failed.is_empty(), "{t:?}: {failed:?}");
        // Bring-up (4), 4 adds, 1 modify, 4 deletes, CCQ and CQP destroy, teardown.
        assert_eq!(steps.len(), 16, "{t:?}");
        assert_eq!(model.engine.control(&json!({"cmd": "dump"})).unwrap()["qhash"]["len"], 0);
    }
}
