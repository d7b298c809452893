//! The verdict, case by case, on small console excerpts written as the guest's init writes them
//! (ci/guest/init: emit_result prints the block between RDMA-EMU-RESULT-BEGIN and -END, record writes each step
//! as `{"name","ok","start","end","error",...}`) and the host records as ci/run-qemu.sh writes them.

use std::path::Path;

use serde_json::{json, Value};

use super::*;
use crate::scenario::find;

/// One step record as ci/guest/init's `record` writes it.
fn step(name: &str, ok: bool, error: Option<&str>) -> Value {
    json!({"name": name, "ok": ok, "start": 10.0, "end": 12.5, "error": error})
}

fn ok_steps(names: &[&str]) -> Vec<Value> {
    names.iter().map(|n| step(n, true, None)).collect()
}

/// A result block as emit_result prints it, with `devices` listing the functions the guest found.
fn block(steps: &[Value], devices: &[&str]) -> String {
    let devices: serde_json::Map<String, Value> =
        devices.iter().map(|d| (d.to_string(), json!({"address": "0000:00:03.0"}))).collect();
    let doc = json!({
        "format": "rdma-emu-result/1", "ok": true, "error": null, "kernel": "6.12", "guest": {},
        "cmdline": "console=ttyS0", "init_start": 4.25, "end": 30.5, "devices": devices, "pci": [],
        "fabric": null, "kernel_functions": null, "fabric_perf": null, "tid_rdma": null, "steps": steps,
    });
    format!("[    4.1] boot noise\nRDMA-EMU-INIT uptime=4.25\nrdma-emu: [5] mount: ok\nRDMA-EMU-RESULT-BEGIN\n{doc}\nRDMA-EMU-RESULT-END\n")
}

fn facts(dir: &Path, scenario: &str) -> Facts {
    Facts {
        log_dir: dir.to_path_buf(),
        scenario: find(scenario).unwrap(),
        options: RunOptions { rtl_icode: true, ..RunOptions::default() },
        mode: "share".into(),
        memory: "memfd-shared".into(),
        accel: "tcg".into(),
        qemu: "qemu-system-x86_64".into(),
        kernel: "vmlinuz".into(),
        initrd: "initrd".into(),
        qemu_exit_status: 0,
        device_model: "running until stopped".into(),
        t_qemu: 1000.0,
        t_qemu_end: 1040.0,
        device_model_start_s: Some(0.25),
        icode: "rtl-simulation".into(),
        hfi1_dma: "translated".into(),
        hfi1_user_host: "not started".into(),
        reply_poll_us: 50,
        capture: None,
    }
}

fn judge_logs(scenario: &str, files: &[(&str, &str)], tweak: impl FnOnce(&mut Facts)) -> RunResult {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let mut f = facts(dir.path(), scenario);
    tweak(&mut f);
    judge(&f)
}

const DEMO_STEPS: &[&str] = &["mount", "modules", "iommu", "demo-hfi1", "demo-irdma", "demo-irdma-irq"];

/// A udriver hfi1 demo report whose SYNC step shows what issue 15 requires.
fn hfi1_report(sync_refused: u64) -> String {
    json!({"demo": "hfi1", "ok": true, "steps": [{
        "name": "a request crossing the flow PSN space waits and resyncs", "ok": true,
        "detail": {"waited_for_pending_segment": true, "old": {"generation": 5}, "new": {"generation": 6},
                   "device_generation": {"before_sync": 5, "cleared": "0xfffff", "after_sync": 6},
                   "old_generation_packets": {"refused": sync_refused, "bytes_placed": 0, "result": "GenMismatch"}}}]})
    .to_string()
}

#[test]
fn the_console_cases_give_these_problems() {
    let all_ok = ok_steps(DEMO_STEPS);
    let mut one_failed = all_ok.clone();
    one_failed[3] = step("demo-hfi1", false, Some("udriver hfi1-demo: exit status 1: no BAR"));
    let full = block(&all_ok, &["hfi1", "irdma"]);
    let cut_off = full.replace("RDMA-EMU-RESULT-END\n", "");
    let cases: Vec<(&str, String, Vec<String>)> = vec![
        ("every expected step ran and passed", full.clone(), vec![]),
        ("no result block", "[    4.1] Kernel panic\n".into(), vec!["the guest printed no result block".into()]),
        ("a result block cut off", cut_off, vec!["the guest's result block is not terminated".into()]),
        (
            "a step missing",
            block(&ok_steps(&DEMO_STEPS[..5]), &["hfi1", "irdma"]),
            vec!["step demo-irdma-irq did not run".into()],
        ),
        (
            "a step failed",
            block(&one_failed, &["hfi1", "irdma"]),
            vec!["step demo-hfi1: udriver hfi1-demo: exit status 1: no BAR".into()],
        ),
        ("a function the guest did not find is not expected", block(&ok_steps(&DEMO_STEPS[..4]), &["hfi1"]), vec![]),
        (
            "no step at all",
            block(&[], &[]),
            vec![
                "the guest ran no step".into(),
                "step mount did not run".into(),
                "step modules did not run".into(),
                "step iommu did not run".into(),
            ],
        ),
        (
            "the last of two blocks counts (a held guest prints one per round)",
            format!("{}{full}", block(&ok_steps(&["mount"]), &[])),
            vec![],
        ),
    ];
    for (what, serial, want) in cases {
        let r = judge_logs("demo", &[("serial.log", &serial)], |_| {});
        assert_eq!(r.problems, want, "{what}");
        assert_eq!(r.ok, want.is_empty(), "{what}");
    }
}

#[test]
fn the_guests_own_error_is_a_problem() {
    let mut doc = block(&ok_steps(DEMO_STEPS), &["hfi1", "irdma"]);
    doc = doc.replace(r#""error":null"#, r#""error":"init watchdog expired after 600 s, during step demo-irdma""#);
    let r = judge_logs("demo", &[("serial.log", &doc)], |_| {});
    assert_eq!(r.problems, ["guest: init watchdog expired after 600 s, during step demo-irdma"]);
}

#[test]
fn a_demo_whose_report_says_it_failed_fails_although_udriver_exited_0() {
    let mut steps = ok_steps(DEMO_STEPS);
    steps[4]["stdout"] =
        json!(r#"{"demo":"irdma","ok":false,"steps":[{"name":"cqp","ok":true},{"name":"qp","ok":false}]}"#);
    steps[3]["stdout"] = json!(hfi1_report(2));
    let r = judge_logs("demo", &[("serial.log", &block(&steps, &["hfi1", "irdma"]))], |_| {});
    assert_eq!(r.problems, ["step demo-irdma: udriver reports failure in qp"]);
    let hfi1 = &r.guest.as_ref().unwrap()["steps"][3];
    assert_eq!(hfi1["output"]["demo"], "hfi1", "the report is parsed into output");
}

#[test]
fn an_hfi1_demo_whose_sync_step_placed_an_old_generation_packet_fails() {
    let mut steps = ok_steps(DEMO_STEPS);
    steps[3]["stdout"] = json!(hfi1_report(1));
    let r = judge_logs("demo", &[("serial.log", &block(&steps, &["hfi1", "irdma"]))], |_| {});
    assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
    assert!(r.problems[0].starts_with("step demo-hfi1: udriver hfi1-demo: its SYNC step shows {"), "{:?}", r.problems);
}

#[test]
fn a_step_that_overran_its_deadline_is_reported_with_the_last_csr_accesses() {
    let serial =
        "RDMA-EMU-INIT uptime=4.25\nRDMA-EMU {\"seq\":9,\"req\":\"deadline\",\"step\":\"kdriver-rmmod\",\"secs\":20}\n";
    let accesses = json!({"reads": 9, "writes": 3, "unnamed": 0, "recent": [
        {"seq": 41, "op": "read", "csr": "SEND_DMA_STATUS[engine 0]", "offset": "0x200018", "value": "0x0"}]});
    let r = judge_logs(
        "kernel-driver",
        &[("serial.log", serial), ("stalled", "kdriver-rmmod\n"), ("stall-accesses.json", &accesses.to_string())],
        |f| f.qemu_exit_status = 0,
    );
    assert_eq!(
        r.problems,
        [
            "the guest printed no result block",
            "guest step kdriver-rmmod overran its deadline (the host stopped QEMU); last CSR accesses: \
             #41 read SEND_DMA_STATUS[engine 0] = 0x0",
        ]
    );
}

#[test]
fn a_fabric_stall_also_names_the_second_hfi_and_the_cable() {
    let link = json!({"cable": {"recent_packets": ["to b: 0x1", "to a: 0x2"]}});
    let r = judge_logs(
        "fabric-bounce",
        &[("stalled", "fabric-link-bounce"), ("stall-link.json", &link.to_string())],
        |_| {},
    );
    assert_eq!(
        r.problems[1],
        "guest step fabric-link-bounce overran its deadline (the host stopped QEMU); last CSR accesses: ; \
         hfi1-wfr1's last CSR accesses: ; last cable packets: to b: 0x1; to a: 0x2"
    );
}

#[test]
fn a_chip_access_to_an_unnamed_offset_during_a_step_is_a_problem() {
    let steps = [
        ok_steps(&DEMO_STEPS[..3]),
        ok_steps(&[
            "find-hfi1-wfr",
            "kdriver-modprobe",
            "kdriver-sysfs",
            "fabric-userland",
            "kdriver-rmmod",
            "kdriver-reprobe",
            "kdriver-rmmod-again",
            "kdriver-params-beyond-chip",
            "kdriver-dmesg",
            "kdriver-params-invalid",
            "kdriver-final-probe",
            "kdriver-dmesg-final",
        ]),
    ]
    .concat();
    let accesses = "kdriver-modprobe start 0 0 0\nkdriver-modprobe end 1500 700 3\n";
    let r = judge_logs("kernel-driver", &[("serial.log", &block(&steps, &[])), ("step-accesses", accesses)], |_| {});
    assert_eq!(r.problems, ["kdriver-modprobe: 3 accesses to offsets the chip's register list does not name"]);
    let a = r.hfi1_wfr_step_accesses.unwrap();
    assert_eq!(a.0, [("kdriver-modprobe".to_string(), logs::Accesses { reads: 1500, writes: 700, unnamed: 3 })]);
}

#[test]
fn the_tid_rdma_run_must_show_each_kernel_function_and_tid_placement() {
    let r = judge_logs("tid-rdma", &[("serial.log", &block(&[step("mount", true, None)], &[]))], |_| {});
    let counted: Vec<&String> =
        r.problems.iter().filter(|p| p.contains("not a count") || p.contains("not a positive")).collect();
    assert_eq!(counted.len(), 8, "{:?}", r.problems);
    assert_eq!(counted[0], "kernel_functions.hfi1_setup_wqe is None, not a count of calls");
    assert_eq!(counted[4], "tid_rdma.read_bytes is None, not a positive count");
}

#[test]
fn the_psm2_run_must_show_checked_bytes_and_each_user_context_count() {
    let r = judge_logs("psm2", &[("serial.log", &block(&[step("mount", true, None)], &[]))], |_| {});
    let counted: Vec<&String> = r.problems.iter().filter(|p| p.starts_with("psm2.")).collect();
    assert_eq!(
        counted,
        [
            "psm2.bytes_checked is None, not a positive count",
            "psm2.pio_user_launches is None, not a positive count",
            "psm2.user_sdma_bytes is None, not a positive count",
            "psm2.tid_entries_programmed is None, not a positive count",
            "psm2.tidflow_user_writes is None, not a positive count",
            "psm2.expected_packets_placed is None, not a positive count",
        ],
        "{:?}",
        r.problems
    );
}

#[test]
fn how_qemu_and_the_device_model_ended_are_problems() {
    let serial = block(&ok_steps(DEMO_STEPS), &["hfi1", "irdma"]);
    let cases: &[(&str, i32, &str, &str, &[&str])] = &[
        ("QEMU timed out", 124, "running until stopped", "", &["QEMU timed out"]),
        (
            "QEMU failed",
            1,
            "running until stopped",
            "",
            &["QEMU exited with status 1: qemu: cannot connect | vfio-user: bad socket"],
        ),
        (
            "the device model died",
            0,
            "exited early with status 101",
            "",
            &["device model exited early with status 101"],
        ),
        (
            "the device model panicked",
            0,
            "running until stopped",
            "thread 'w' panicked at src/x.rs:1",
            &["the device model panicked (see device-model.log)"],
        ),
        ("an external device model is not judged here", 0, "external (--sockets)", "panicked at", &[]),
    ];
    for (what, rc, dm, dm_log, want) in cases {
        let r = judge_logs(
            "demo",
            &[
                ("serial.log", &serial),
                ("qemu.stderr", "qemu: warning: x\nqemu: cannot connect\n\nvfio-user: bad socket\n"),
                ("device-model.log", dm_log),
            ],
            |f| {
                f.qemu_exit_status = *rc;
                f.device_model = dm.to_string();
            },
        );
        assert_eq!(r.problems, *want, "{what}");
    }
}

#[test]
fn the_timing_splits_the_wall_time_at_the_console_markers() {
    let serial = block(&ok_steps(DEMO_STEPS), &["hfi1", "irdma"]);
    let r = judge_logs(
        "demo",
        &[("serial.log", &serial), ("host-times", "init 1010.5\nresult_end 1038.0\ninit 1020\n")],
        |_| {},
    );
    let t = serde_json::to_value(&r.timing).unwrap();
    // QEMU started at 1000, init printed its marker at 1010.5 after 4.25 s of kernel uptime, the block ended at
    // 1038 and QEMU at 1040; each demo step ran from 10.0 to 12.5.
    assert_eq!(
        t,
        json!({"total_s": 40.0, "device_model_start_s": 0.25, "qemu_start_s": 6.25, "kernel_boot_s": 4.25,
               "init_s": 26.25, "demo_s": {"hfi1": 2.5, "irdma": 2.5, "irdma-irq": 2.5}, "poweroff_s": 2.0})
    );
}

#[test]
fn the_result_keeps_the_fields_its_readers_use() {
    let r = judge_logs("demo", &[("serial.log", &block(&ok_steps(DEMO_STEPS), &["hfi1", "irdma"]))], |_| {});
    let v = serde_json::to_value(&r).unwrap();
    for field in [
        "ok",
        "problems",
        "mode",
        "memory",
        "accel",
        "qemu",
        "qemu_reply_poll_us",
        "kernel",
        "initrd",
        "qemu_exit_status",
        "device_model",
        "timing",
        "guest",
        "hfi1_wfr_icode",
        "hfi1_wfr_dma",
        "hfi1_wfr_step_accesses",
        "fabric",
        "kernel_functions",
        "fabric_perf",
        "tid_rdma",
        "capture",
        "hfi1_user_host",
        "bench",
    ] {
        assert!(v.get(field).is_some(), "no field {field}");
    }
    assert_eq!(v["hfi1_wfr_icode"], Value::Null, "a run without the chip personality has no icode");
}
