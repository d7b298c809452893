//! `irdma_demo` and `irdma_stress` against the real engine in a `pci::Function`, in-process, reached only
//! through `Arc<dyn DeviceAccess>` as over VFIO or vfio-user.

use std::sync::Arc;
use std::time::Duration;

use device_model::engine::Engine;
use device_model::irdma::{Irdma, IrdmaConfig};
use device_model::pci::{Function, PciIds};
use serde_json::{json, Value};
use testbed::InProcess;
use udriver::access::DeviceAccess;
use udriver::demo::irdma::{irdma_demo, irdma_stress, IrdmaDemoOptions};
use udriver::demo::DemoReport;
use udriver::irdma::IrdmaCqpWaitMode;

fn device() -> (Arc<Irdma>, Arc<dyn DeviceAccess>) {
    let engine = Arc::new(Irdma::new(IrdmaConfig::default()));
    let func = Function::new(engine.clone(), PciIds::irdma_default());
    (engine, Arc::new(InProcess::new(func)))
}

fn dump(engine: &Irdma) -> Value {
    engine.control(&json!({"cmd": "dump"})).unwrap()
}

fn detail<'a>(report: &'a DemoReport, name_prefix: &str) -> &'a Value {
    let step = report.steps.iter().find(|s| s.name.starts_with(name_prefix));
    &step.unwrap_or_else(|| panic!("no step {name_prefix:?} in\n{}", report.render())).detail
}

fn classified_qpns(v: &Value) -> Vec<Value> {
    v.as_array().unwrap().iter().map(|c| c["qpn"].clone()).collect()
}

/// Device-defined quad-hash codes (docs/irdma-device.md): major 0x8002, minor 1 duplicate, 2 missing.
const MAJ_QHASH: u64 = 0x8002;

fn check_demo(report: &DemoReport) {
    assert!(report.ok, "{}", report.render());
    let names: Vec<&str> = report.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names.len(), 11, "{names:?}");
    // Four adds on a fresh SQ: WQE slots 1..=4 (CREATE_CQ took slot 0), no error.
    let adds = detail(report, "add qhash").as_array().unwrap();
    let slots: Vec<Value> = adds.iter().map(|a| a["completion"]["wqe_idx"].clone()).collect();
    assert_eq!(slots, [1, 2, 3, 4].map(Value::from));
    assert!(adds.iter().all(|a| a["completion"]["maj"] == 0));
    let qpns = classified_qpns(detail(report, "classify"));
    assert_eq!(qpns, [json!(7), json!(5), Value::Null, json!(9), json!(11), Value::Null]);
    let codes = |name| {
        let d = detail(report, name);
        (d["errno"].as_i64(), d["maj"].as_u64(), d["min"].as_u64())
    };
    let eio = Some(-i64::from(libc::EIO));
    assert_eq!(codes("duplicate add"), (eio, Some(MAJ_QHASH), Some(1)));
    assert_eq!(codes("delete of a missing"), (eio, Some(MAJ_QHASH), Some(2)));
    assert_eq!(classified_qpns(&detail(report, "modify")["classified"]), [json!(6)]);
    assert_eq!(detail(report, "delete the IPv4 listener")["classified"][0]["target"], "host");
    // CREATE_CQ, 4 adds, duplicate, modify, delete, missing delete, 3 deletes.
    assert_eq!(detail(report, "destroy")["completions"], 12);
}

#[test]
fn the_demo_passes_every_step_when_waiting_by_polling() {
    let (engine, dev) = device();
    // Keep our handle: dropping the last one detaches the function, which resets it.
    let report = irdma_demo(dev.clone(), &IrdmaDemoOptions::default());
    check_demo(&report);
    let d = dump(&engine);
    assert_eq!((d["cqp"].clone(), d["ccq"].clone(), d["qhash"]["len"].clone()), (Value::Null, Value::Null, json!(0)));
    assert_eq!(d["counters"]["classify_listener"], 2);
    // The report is machine-readable.
    let text = serde_json::to_string(&report).unwrap();
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["ok"], true);
}

#[test]
fn the_demo_passes_every_step_when_waiting_by_interrupt() {
    let (engine, dev) = device();
    let mut opts = IrdmaDemoOptions::default();
    opts.config.wait_mode = IrdmaCqpWaitMode::Event { vector: 1 };
    let report = irdma_demo(dev.clone(), &opts);
    check_demo(&report);
    assert_eq!(detail(&report, "create CQP")["wait"], "msix vector 1");
    let c = &dump(&engine)["counters"];
    assert!(c["interrupts"].as_u64().unwrap() >= 1, "{c}");
    assert_eq!(c["interrupts_dropped"], 0);
}

#[test]
fn a_refused_bring_up_is_a_failed_step_not_a_panic() {
    let (_engine, dev) = device();
    let mut opts = IrdmaDemoOptions::default();
    opts.config.sq_size = 3; // not a power of two: irdma_sc_cqp_init refuses it with -EINVAL
    let report = irdma_demo(dev, &opts);
    assert!(!report.ok);
    let failed = report.steps.iter().find(|s| !s.ok).unwrap();
    assert!(failed.name.starts_with("create CQP"), "{}", report.render());
    assert!(failed.detail.as_str().unwrap().contains("errno -22"), "{}", report.render());
}

#[test]
fn stress_threads_share_the_cqp_through_the_backlog_and_leave_the_table_empty() {
    let (engine, dev) = device();
    let report = irdma_stress(dev.clone(), Duration::from_millis(1500), 4);
    assert!(report.ok, "{}", report.render());
    let run = detail(&report, "threads share");
    assert_eq!(run["threads"], 4);
    let ops = run["ops"].as_u64().unwrap();
    // Each round is an add, a modify and a delete batch of 24 entries per thread.
    assert!(ops > 0 && ops.is_multiple_of(3 * 24), "{run}");
    assert!(run["backlogged_ops"].as_u64().unwrap() > 0, "{run}");
    assert_eq!(detail(&report, "every completion")["completions"], ops + 1);
    assert_eq!(detail(&report, "device table")["keys_checked"], 4 * 24);
    let d = dump(&engine);
    assert_eq!((d["qhash"]["len"].clone(), d["cqp"].clone()), (json!(0), Value::Null));
    // Every WQE was executed: CREATE_CQ, the ops, 96 refused deletes, DESTROY_CQ.
    assert_eq!(d["counters"]["wqes"], ops + 1 + 96 + 1);
    assert_eq!(d["counters"]["wqe_errors"], 96);
}
