//! The real driver (`udriver::irdma`) against the real engine (`device_model::irdma::Irdma`) inside a
//! `pci::Function`, through the in-process backend. Expected values come from hardware-facts.md §3 and §4
//! (G9–G12) and from the device's documented error codes (docs/irdma-device.md).

use std::sync::Arc;
use std::time::Duration;

use device_model::engine::Engine;
use device_model::irdma::{Irdma, IrdmaConfig};
use device_model::pci::{Function, PciIds};
use serde_json::{json, Value};
use testbed::InProcess;
use udriver::access::DeviceAccess;
use udriver::backend::vfio_user::VfioUserBackend;

// Only its vfio-user server is used here; the module allows its own dead code.
mod hfi1_common;
use udriver::dma::DmaPool;
use udriver::irdma::cqp::{irdma_sc_cqp_get_next_send_wqe_idx, irdma_sc_cqp_post_sq};
use udriver::irdma::defs::*;
use udriver::irdma::dev::{irdma_sc_dev_init, irdma_wait_pe_ready};
use udriver::irdma::process::{irdma_handle_cqp_op, irdma_manage_qhash, irdma_post_cqp_op, irdma_wait_cqp_op};
use udriver::irdma::qhash::IrdmaVsiQos;
use udriver::irdma::regs::{IrdmaHw, IrdmaRegisters::*};
use udriver::irdma::*;

use IrdmaQuadEntryType::{IrdmaQhashTypeTcpEstablished as ESTABLISHED, IrdmaQhashTypeTcpSyn as SYN};
use IrdmaQuadHashManageType::{
    IrdmaQhashManageTypeAdd as ADD, IrdmaQhashManageTypeDelete as DELETE, IrdmaQhashManageTypeModify as MODIFY,
};

/// Device-defined codes (docs/irdma-device.md, "Error codes").
const MAJ_BAD_WQE: u16 = 0x8001;
const MAJ_QHASH: u16 = 0x8002;
const MIN_UNKNOWN_OPCODE: u16 = 0x0001;
const MIN_DUPLICATE: u16 = 0x0001;
const MIN_MISSING: u16 = 0x0002;
const MIN_FULL: u16 = 0x0003;

const MAC: [u8; 6] = [0x00, 0x11, 0x22, 0x33, 0x44, 0x55];
const IP4_LOCAL: u32 = 0x0A00_0001; // 10.0.0.1
const IP4_REMOTE: u32 = 0x0A00_0002; // 10.0.0.2
const IP6_LOCAL: [u32; 4] = [0xFE80_0000, 0, 0, 1]; // fe80::1
const IP6_REMOTE: [u32; 4] = [0xFE80_0000, 0, 0, 2]; // fe80::2

struct Rig {
    engine: Arc<Irdma>,
    access: Arc<dyn DeviceAccess>,
    pool: Arc<DmaPool>,
    func: Arc<Function>,
    /// Declared last: the client (in `access` and `pool`) goes before the server stops.
    _served: Option<hfi1_common::ServedSocket>,
}

impl Rig {
    /// In-process by default; `UDRIVER_IT_BACKEND=vfio-user` runs every test over a real vfio-user socket
    /// (ci/test.sh runs both).
    fn new(cfg: IrdmaConfig) -> Rig {
        let engine = Arc::new(Irdma::new(cfg));
        let func = Function::new(engine.clone(), PciIds::irdma_default());
        let (access, served): (Arc<dyn DeviceAccess>, _) =
            if std::env::var("UDRIVER_IT_BACKEND").as_deref() == Ok("vfio-user") {
                let s = hfi1_common::ServedSocket::function(func.clone()).unwrap();
                (Arc::new(VfioUserBackend::connect(s.path(), true).unwrap()), Some(s))
            } else {
                (Arc::new(InProcess::new(func.clone())), None)
            };
        access.pci_enable_device().unwrap();
        let pool = Arc::new(DmaPool::new(access.clone(), false));
        Rig { engine, access, pool, func, _served: served }
    }

    fn up(&self, sq_size: u32, ccq_size: u32, wait_mode: IrdmaCqpWaitMode) -> IrdmaDev {
        IrdmaDev::new(self.pool.clone(), dev_config(sq_size, ccq_size, wait_mode)).unwrap()
    }

    fn dump(&self) -> Value {
        self.engine.control(&json!({"cmd": "dump"})).unwrap()
    }

    fn loopback(&self) -> IrdmaLoopback {
        IrdmaLoopback::new(&self.pool, Duration::from_secs(5), Duration::from_micros(10)).unwrap()
    }
}

fn dev_config(sq_size: u32, ccq_size: u32, wait_mode: IrdmaCqpWaitMode) -> IrdmaDevConfig {
    IrdmaDevConfig {
        hw_attrs: IrdmaHwAttrs { pe_ready_delay: Duration::from_millis(1), ..Default::default() },
        sq_size,
        ccq_size,
        wait_mode,
        ..Default::default()
    }
}

fn hex(v: u64) -> String {
    format!("{v:#x}")
}

/// A quad-hash entry as `irdma_manage_qhash` fills it: dest = local, src = remote (ESTABLISHED only).
fn entry(
    manage: IrdmaQuadHashManageType,
    entry_type: IrdmaQuadEntryType,
    ipv4: bool,
    ports: (u16, u16),
    vlan: Option<u16>,
    qp_num: u32,
) -> IrdmaQhashTableInfo {
    let (dest_ip, src_ip) = if ipv4 { ([IP4_LOCAL, 0, 0, 0], [IP4_REMOTE, 0, 0, 0]) } else { (IP6_LOCAL, IP6_REMOTE) };
    let established = entry_type == ESTABLISHED;
    IrdmaQhashTableInfo {
        vsi: IrdmaVsiQos::default(),
        manage,
        entry_type,
        vlan_valid: vlan.is_some(),
        ipv4_valid: ipv4,
        mac_addr: MAC,
        vlan_id: vlan.unwrap_or(0),
        user_pri: 0,
        qp_num,
        dest_ip,
        src_ip: if established { src_ip } else { [0; 4] },
        dest_port: ports.0,
        src_port: if established { ports.1 } else { 0 },
    }
}

fn segment(ipv4: bool, ports: (u16, u16), vlan: Option<u16>, syn: bool, ack: bool) -> IrdmaTcpSegment {
    let (local, remote) = if ipv4 { ([IP4_LOCAL, 0, 0, 0], [IP4_REMOTE, 0, 0, 0]) } else { (IP6_LOCAL, IP6_REMOTE) };
    IrdmaTcpSegment { ipv4, src_ip: remote, dst_ip: local, src_port: ports.1, dst_port: ports.0, vlan, syn, ack }
}

fn qhash_err(r: udriver::irdma::Result<IrdmaCcqCqeInfo>) -> (i32, u8, u16, u16) {
    match r {
        Err(e @ IrdmaError::CqeError { op, maj, min }) => (e.to_errno(), op, maj, min),
        other => panic!("expected an error completion, got {other:?}"),
    }
}

#[test]
fn device_init_finds_an_8_mib_doorbell_bar_and_a_ready_protocol_engine() {
    let rig = Rig::new(IrdmaConfig::default());
    let hw = IrdmaHw::new(rig.access.clone());
    // §3.2: PE_DB_SIZE 2 = 8 MiB; GLPE_CPUSTATUS0..2 read 0x80 when ready.
    assert_eq!(irdma_sc_dev_init(&hw).unwrap(), 2);
    for reg in [IRDMA_GLPE_CPUSTATUS0, IRDMA_GLPE_CPUSTATUS1, IRDMA_GLPE_CPUSTATUS2] {
        assert_eq!(hw.rd32(reg).unwrap(), 0x80, "{reg:?}");
    }
    irdma_wait_pe_ready(&hw, &IrdmaHwAttrs::default()).unwrap();
}

#[test]
fn cqp_create_hands_the_host_context_over_ccqphigh_low_and_destroy_clears_cqp_and_ccq() {
    let rig = Rig::new(IrdmaConfig::default());
    let dev = rig.up(2048, 2050, IrdmaCqpWaitMode::Poll);
    let (ctx_pa, sq_pa, ccq_pa, shadow_pa) = {
        let st = dev.lock();
        (st.cqp.host_ctx_pa, st.cqp.sq_pa, st.ccq.cq_pa, st.ccq.shadow_area_pa)
    };
    let d = rig.dump();
    // G10: CCQPHIGH/LOW carry the context PA; CCQPSTATUS 0x1 = done, no error.
    assert_eq!(d["registers"]["CCQPHIGH"], format!("{:#010x}", ctx_pa >> 32));
    assert_eq!(d["registers"]["CCQPLOW"], format!("{:#010x}", ctx_pa & 0xFFFF_FFFF));
    assert_eq!(d["registers"]["CCQPSTATUS"], "0x00000001");
    // The device read the context: SQ 2048 (code 10), RoCE only (2), HMC profile 1, GEN2 (HW_MAJVER 1).
    let cqp = &d["cqp"];
    assert_eq!((cqp["sq_size"].as_u64(), cqp["sq_base"].clone()), (Some(2048), json!(hex(sq_pa))));
    assert_eq!((cqp["protocol_used"].as_u64(), cqp["hmc_profile"].as_u64()), (Some(2), Some(1)));
    assert_eq!(cqp["hw_maj_ver"], 1);
    assert_eq!(cqp["completion_context"], hex(ctx_pa), "host-context qw3 is the completion context");
    // CREATE_CQ made the CCQ: CQ 0, 2050 entries, its own completion in slot 0.
    let ccq = &d["ccq"];
    assert_eq!((ccq["cq_id"].as_u64(), ccq["size"].as_u64(), ccq["head"].as_u64()), (Some(0), Some(2050), Some(1)));
    assert_eq!((ccq["ring_pa"].clone(), ccq["shadow_pa"].clone()), (json!(hex(ccq_pa)), json!(hex(shadow_pa))));

    dev.destroy().unwrap();
    let d = rig.dump();
    assert_eq!((d["cqp"].clone(), d["ccq"].clone()), (Value::Null, Value::Null));
    assert_eq!(d["registers"]["CCQPSTATUS"], "0x00000000");
    // DESTROY_CQ completed through CQPTAIL (slot 1), not through the CCQ it destroyed.
    assert_eq!(d["registers"]["CQPTAIL"], "0x00000002");
    assert_eq!((d["counters"]["wqe_errors"].as_u64(), d["counters"]["cqp_destroys"].as_u64()), (Some(0), Some(1)));
    // A second bring-up on the same function works.
    rig.up(16, 16, IrdmaCqpWaitMode::Poll).destroy().unwrap();
}

/// `enum irdma_quad_entry_type`, all six.
const ALL_TYPES: [IrdmaQuadEntryType; 6] = [
    ESTABLISHED,
    SYN,
    IrdmaQuadEntryType::IrdmaQhashTypeUdpUnicast,
    IrdmaQuadEntryType::IrdmaQhashTypeUdpMcast,
    IrdmaQuadEntryType::IrdmaQhashTypeRoceMcast,
    IrdmaQuadEntryType::IrdmaQhashTypeRocev2Hw,
];

/// Adds, modifies and deletes `n` entries of all six types in batches that overfill the SQ (the backlog takes the rest),
/// checking every completion's WQE index, op and status.
fn run_batches(dev: &IrdmaDev, rig: &Rig, sq_size: u32, n: u16, rounds: u32) -> u32 {
    // CREATE_CQ took slot 0, so the k-th command after it sits in slot (k + 1) % sq_size.
    let mut k = 0u32;
    for round in 0..rounds {
        for manage in [ADD, MODIFY, DELETE] {
            let infos: Vec<_> = (0..n)
                .map(|i| {
                    let ty = ALL_TYPES[usize::from(i) % ALL_TYPES.len()];
                    let vlan = (i % 3 == 0).then_some(100 + i);
                    let qpn = if manage == MODIFY { 1000 + u32::from(i) } else { 1 + u32::from(i) };
                    entry(manage, ty, i % 4 < 2, (4000 + i, 5000 + i), vlan, qpn)
                })
                .collect();
            let scratches: Vec<u64> =
                infos.iter().map(|i| irdma_post_cqp_op(dev, IrdmaCqpCmd::ManageQhashTableEntry(*i)).unwrap()).collect();
            for s in scratches {
                let info = irdma_wait_cqp_op(dev, s).unwrap();
                k += 1;
                assert_eq!(
                    (info.op_code, info.error, info.maj_err_code, info.wqe_idx),
                    (IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY, false, 0, k % sq_size),
                    "round {round}, {manage:?}, command {k}"
                );
            }
            let table = &rig.dump()["qhash"];
            match manage {
                DELETE => assert_eq!(table["len"], 0),
                _ => {
                    assert_eq!(table["len"], u64::from(n));
                    let mut types: Vec<&str> = table["entries"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|e| e["entry_type"].as_str().unwrap())
                        .collect();
                    types.dedup();
                    assert_eq!(types.len(), ALL_TYPES.len(), "entries are listed by type: {types:?}");
                    let want = if manage == MODIFY { 1000 } else { 1 };
                    let mut qpns: Vec<u64> =
                        table["entries"].as_array().unwrap().iter().map(|e| e["qpn"].as_u64().unwrap()).collect();
                    qpns.sort_unstable();
                    assert_eq!(qpns, (0..u64::from(n)).map(|i| want + i).collect::<Vec<_>>());
                }
            }
        }
    }
    k
}

#[test]
fn qhash_batches_wrap_both_rings_several_times_with_every_completion_and_the_table_checked() {
    let rig = Rig::new(IrdmaConfig::default());
    let dev = rig.up(16, 16, IrdmaCqpWaitMode::Poll);
    let done = run_batches(&dev, &rig, 16, 24, 4);
    assert_eq!(done, 4 * 3 * 24);
    let d = rig.dump();
    // 289 WQEs through a 16-entry SQ and 16-entry CCQ: 18 wraps each.
    assert_eq!((d["cqp"]["wraps"].as_u64(), d["ccq"]["wraps"].as_u64()), (Some(18), Some(18)));
    assert_eq!((d["counters"]["cqes"].as_u64(), d["counters"]["wqe_errors"].as_u64()), (Some(289), Some(0)));
    let st = dev.lock();
    assert_eq!((st.cqp.completed_ops, st.cqp.requested_ops), (289, 289));
    assert!(st.cqp_cmd_head.is_empty());
    drop(st);
    dev.destroy().unwrap();
}

#[test]
fn the_first_entry_lands_in_the_table_exactly_as_g9_describes_it() {
    let rig = Rig::new(IrdmaConfig::default());
    let dev = rig.up(16, 16, IrdmaCqpWaitMode::Poll);
    // G9: IPv4 ESTABLISHED 10.0.0.1:4791 <- 10.0.0.2:5000, QP 5; and the IPv6 VLAN 100 listener on fe80::1.
    irdma_manage_qhash(&dev, &entry(ADD, ESTABLISHED, true, (4791, 5000), None, 5)).unwrap();
    irdma_manage_qhash(&dev, &entry(ADD, SYN, false, (4791, 0), Some(100), 7)).unwrap();
    let entries = rig.dump()["qhash"]["entries"].clone();
    let want = json!([
        {"entry_type": "IRDMA_QHASH_TYPE_TCP_ESTABLISHED", "ipv4": true, "vlan": null, "dest_ip": "10.0.0.1",
         "dest_port": 4791, "src_ip": "10.0.0.2", "src_port": 5000, "qpn": 5, "mac": "00:11:22:33:44:55",
         "qs_handle": 0},
        {"entry_type": "IRDMA_QHASH_TYPE_TCP_SYN", "ipv4": false, "vlan": 100, "dest_ip": "fe80::1",
         "dest_port": 4791, "src_ip": "::", "src_port": 0, "qpn": 7, "mac": "00:11:22:33:44:55", "qs_handle": 0},
    ]);
    assert_eq!(entries, want);
    dev.destroy().unwrap();
}

#[test]
fn duplicate_add_missing_delete_and_full_table_give_eio_with_the_device_codes() {
    let rig = Rig::new(IrdmaConfig { qhash_capacity: 3, ..Default::default() });
    let dev = rig.up(8, 8, IrdmaCqpWaitMode::Poll);
    for port in 1..=3 {
        irdma_manage_qhash(&dev, &entry(ADD, SYN, true, (port, 0), None, 10)).unwrap();
    }
    let op = IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY;
    let eio = -libc::EIO;
    let cases = [
        ("add to a full table", entry(ADD, SYN, true, (4, 0), None, 10), (eio, op, MAJ_QHASH, MIN_FULL)),
        ("duplicate add (table full)", entry(ADD, SYN, true, (1, 0), None, 11), (eio, op, MAJ_QHASH, MIN_DUPLICATE)),
        ("delete of a missing entry", entry(DELETE, SYN, true, (9, 0), None, 0), (eio, op, MAJ_QHASH, MIN_MISSING)),
        ("modify of a missing entry", entry(MODIFY, SYN, false, (1, 0), None, 3), (eio, op, MAJ_QHASH, MIN_MISSING)),
    ];
    for (what, info, want) in cases {
        assert_eq!(qhash_err(irdma_manage_qhash(&dev, &info)), want, "{what}");
    }
    // The failures changed nothing, and the CQP goes on.
    let d = rig.dump();
    assert_eq!(d["qhash"]["len"], 3);
    assert!(d["qhash"]["entries"].as_array().unwrap().iter().all(|e| e["qpn"] == 10));
    irdma_manage_qhash(&dev, &entry(DELETE, SYN, true, (2, 0), None, 0)).unwrap();
    irdma_manage_qhash(&dev, &entry(ADD, SYN, true, (4, 0), None, 10)).unwrap();
    assert_eq!(rig.dump()["qhash"]["len"], 3);
    dev.destroy().unwrap();
}

#[test]
fn an_unknown_opcode_gets_an_error_completion_and_the_ring_goes_on() {
    const BAD_OPCODE: u64 = 0x3F;
    const SCRATCH: u64 = 0xBAD0_0000_0000_0001;
    let rig = Rig::new(IrdmaConfig::default());
    let dev = rig.up(4, 4, IrdmaCqpWaitMode::Poll);
    // Four passes over the 4-entry SQ, so the bad WQE is posted with both valid-bit values.
    for pass in 0..8 {
        {
            let mut st = dev.lock();
            let cqp = &mut st.cqp;
            let mut idx = 0;
            irdma_sc_cqp_get_next_send_wqe_idx(cqp, SCRATCH, &mut idx).unwrap();
            let hdr = IRDMA_CQPSQ_OPCODE.prep(BAD_OPCODE) | IRDMA_CQPSQ_WQEVALID.prep(cqp.polarity.into());
            let wqe = cqp.wqe(idx).unwrap();
            wqe.dma_wmb();
            wqe.set_64bit_val(IRDMA_BYTE_24, hdr).unwrap();
            irdma_sc_cqp_post_sq(cqp).unwrap();
        }
        let r = irdma_wait_cqp_op(&dev, SCRATCH);
        assert_eq!(qhash_err(r), (-libc::EIO, BAD_OPCODE as u8, MAJ_BAD_WQE, MIN_UNKNOWN_OPCODE), "pass {pass}");
        let ok = irdma_manage_qhash(&dev, &entry(ADD, SYN, true, (pass, 0), None, 3)).unwrap();
        assert!(!ok.error, "pass {pass}");
    }
    let d = rig.dump();
    assert_eq!((d["qhash"]["len"].as_u64(), d["counters"]["wqe_errors"].as_u64()), (Some(8), Some(8)));
    irdma_handle_cqp_op(&dev, IrdmaCqpCmd::Nop).unwrap();
    dev.destroy().unwrap();
}

#[test]
fn waiting_by_interrupt_uses_the_vector_programmed_in_glint_ceqctl() {
    let rig = Rig::new(IrdmaConfig::default());
    let vector = 2;
    let dev = rig.up(8, 8, IrdmaCqpWaitMode::Event { vector });
    for i in 0..40u16 {
        let manage = if i % 2 == 0 { ADD } else { DELETE };
        let info = irdma_manage_qhash(&dev, &entry(manage, SYN, true, (i / 2, 0), None, 4)).unwrap();
        assert_eq!(info.wqe_idx, (u32::from(i) + 1) % 8, "command {i}");
    }
    let d = rig.dump();
    // icrdma_cfg_ceq(dev, 0, 2, true): CAUSE_ENA (bit 30) | ITR_INDX 3 (12:11) | MSIX_INDX 2.
    assert_eq!(d["registers"]["GLINT_CEQCTL"][0], "0x40001802");
    let c = &d["counters"];
    assert!(c["interrupts"].as_u64().unwrap() >= 1, "{c}");
    assert_eq!((c["interrupts_dropped"].as_u64(), c["arms"].as_u64().map(|a| a >= 1)), (Some(0), Some(true)));
    assert_eq!(d["qhash"]["len"], 0);
    dev.destroy().unwrap();
}

#[test]
fn segments_are_classified_through_the_loopback_registers_to_the_right_qps() {
    let rig = Rig::new(IrdmaConfig::default());
    let dev = rig.up(16, 16, IrdmaCqpWaitMode::Poll);
    let lb = rig.loopback();
    let (p4, p6) = ((4791, 5000), (4791, 6000));
    for info in [
        entry(ADD, SYN, true, p4, None, 7),
        entry(ADD, ESTABLISHED, true, p4, None, 5),
        entry(ADD, SYN, false, p6, Some(100), 9),
        entry(ADD, ESTABLISHED, false, p6, Some(100), 11),
    ] {
        irdma_manage_qhash(&dev, &info).unwrap();
    }
    use IrdmaClassifyResult::*;
    let cases = [
        ("IPv4 SYN to the listener", segment(true, p4, None, true, false), Listener { qpn: 7 }),
        ("IPv4 established segment", segment(true, p4, None, false, true), Established { qpn: 5 }),
        ("IPv4 SYN+ACK is not a new connection", segment(true, p4, None, true, true), Established { qpn: 5 }),
        ("IPv4 segment of an unknown quad", segment(true, (4791, 5001), None, false, true), ToHost),
        ("IPv4 SYN to a port nobody listens on", segment(true, (80, 5000), None, true, false), ToHost),
        ("IPv6 SYN on VLAN 100", segment(false, p6, Some(100), true, false), Listener { qpn: 9 }),
        ("IPv6 SYN on another VLAN", segment(false, p6, Some(101), true, false), ToHost),
        ("IPv6 SYN without VLAN", segment(false, p6, None, true, false), ToHost),
        ("IPv6 established on VLAN 100", segment(false, p6, Some(100), false, true), Established { qpn: 11 }),
    ];
    for (what, seg, want) in cases {
        assert_eq!(lb.classify(&seg).unwrap(), want, "{what}");
    }
    // MODIFY moves the connection to QP 6; DELETE of the listener sends SYNs to the host.
    irdma_manage_qhash(&dev, &entry(MODIFY, ESTABLISHED, true, p4, None, 6)).unwrap();
    irdma_manage_qhash(&dev, &entry(DELETE, SYN, true, p4, None, 0)).unwrap();
    assert_eq!(lb.classify(&segment(true, p4, None, false, true)).unwrap(), Established { qpn: 6 });
    assert_eq!(lb.classify(&segment(true, p4, None, true, false)).unwrap(), ToHost);
    let c = &rig.dump()["counters"];
    let counts = [&c["classify_listener"], &c["classify_established"], &c["classify_to_host"], &c["loopback_ok"]];
    assert_eq!(counts.map(|v| v.as_u64().unwrap()), [2, 4, 5, 11]);
    dev.destroy().unwrap();
}

#[test]
fn the_ccq_is_destroyed_cleanly_right_after_an_error_completion() {
    let rig = Rig::new(IrdmaConfig::default());
    let dev = rig.up(8, 8, IrdmaCqpWaitMode::Poll);
    let missing = entry(DELETE, ESTABLISHED, true, (4791, 5000), None, 0);
    let want = (-libc::EIO, IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY, MAJ_QHASH, MIN_MISSING);
    assert_eq!(qhash_err(irdma_manage_qhash(&dev, &missing)), want);
    // The error travelled in its CQE; CQPTAIL carries no stale CQP_OP_ERR for the register-polled destroy.
    assert_eq!(rig.dump()["registers"]["CQPTAIL"], "0x00000002");
    dev.destroy().unwrap();
    assert_eq!(rig.dump()["ccq"], Value::Null);
}

#[test]
fn a_function_reset_under_the_driver_gives_errors_not_hangs_and_a_fresh_bring_up_works() {
    let rig = Rig::new(IrdmaConfig::default());
    let cfg = IrdmaDevConfig { cqp_timeout: Duration::from_millis(50), ..dev_config(16, 16, IrdmaCqpWaitMode::Poll) };
    let dev = IrdmaDev::new(rig.pool.clone(), cfg).unwrap();
    let scratches: Vec<u64> = (0..24)
        .map(|i| {
            let cmd = IrdmaCqpCmd::ManageQhashTableEntry(entry(ADD, SYN, true, (i, 0), None, 1));
            irdma_post_cqp_op(&dev, cmd).unwrap()
        })
        .collect();
    // FLR mid-batch: memory decoding goes off and the engine forgets the CQP.
    rig.func.function_level_reset();
    for s in scratches {
        // Completed before the reset, or an error: never a hang.
        if let Err(e) = irdma_wait_cqp_op(&dev, s) {
            assert!([-libc::EIO, -libc::ETIMEDOUT].contains(&e.to_errno()), "{e}");
        }
    }
    assert!(dev.destroy().is_err(), "BAR access is refused until the driver re-enables the device");
    rig.access.pci_enable_device().unwrap();
    let dev = rig.up(16, 16, IrdmaCqpWaitMode::Poll);
    irdma_manage_qhash(&dev, &entry(ADD, SYN, true, (1, 0), None, 1)).unwrap();
    assert_eq!(rig.dump()["qhash"]["len"], 1, "the reset emptied the table");
    dev.destroy().unwrap();
}
