//! The verdict of one guest run and its result JSON: what the guest reported (its result block), checked
//! against the steps its scenario expects, with what the host saw (QEMU's exit, the device model's state, a
//! step that overran its deadline).

pub mod console;
pub mod logs;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::pyfmt;
use crate::scenario::{Check, RunOptions, Scenario};
use logs::{Accesses, Ordered};

/// The host side's facts of one run, as the launcher knows them.
#[derive(Debug, Clone)]
pub struct Facts {
    pub log_dir: PathBuf,
    pub scenario: &'static Scenario,
    pub options: RunOptions,
    /// `share`, `no-share` or `no-devices`.
    pub mode: String,
    pub memory: String,
    pub accel: String,
    pub qemu: String,
    pub kernel: String,
    pub initrd: String,
    pub qemu_exit_status: i32,
    /// How the device model ended (`running until stopped`, `exited early with status N`, `external (--sockets)`).
    pub device_model: String,
    /// Epoch seconds at QEMU's start and end.
    pub t_qemu: f64,
    pub t_qemu_end: f64,
    pub device_model_start_s: Option<f64>,
    pub icode: String,
    pub hfi1_dma: String,
    /// `not started`, `exited with status N` or `stopped after QEMU exited`.
    pub hfi1_user_host: String,
    pub reply_poll_us: u64,
    pub capture: Option<String>,
}

/// The phases of the run's wall time, in seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timing {
    pub total_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_model_start_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qemu_start_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_boot_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demo_s: Option<Ordered<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hfi1_probe_s: Option<Ordered<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poweroff_s: Option<f64>,
}

/// The result JSON (its fields are what ci/e2e.sh, ci/bench.sh and ci/lifecycle.sh read).
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub ok: bool,
    pub problems: Vec<String>,
    pub mode: String,
    pub memory: String,
    pub accel: String,
    pub qemu: String,
    pub qemu_reply_poll_us: u64,
    pub kernel: String,
    pub initrd: String,
    pub qemu_exit_status: i32,
    pub device_model: Option<String>,
    pub timing: Timing,
    pub guest: Option<Value>,
    pub hfi1_wfr_icode: Option<String>,
    pub hfi1_wfr_dma: Option<String>,
    pub hfi1_wfr_step_accesses: Option<Ordered<Accesses>>,
    pub fabric: Option<Value>,
    pub kernel_functions: Option<Value>,
    pub fabric_perf: Option<Value>,
    pub tid_rdma: Option<Value>,
    /// The psm2 scenario's evidence (ci/guest/psm2.sh): bytes checked, and what the user contexts made the chip do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psm2: Option<Value>,
    pub capture: Option<String>,
    pub hfi1_user_host: Option<Value>,
    pub bench: Option<Value>,
    /// The scenario table's row the run was judged by, and the steps it expected.
    pub scenario: String,
    pub expected_steps: Vec<String>,
}

/// A run that failed before the guest could report: the launcher's error, so nobody reads a stale result.
#[derive(Debug, Clone, Serialize)]
pub struct EarlyFailure {
    pub ok: bool,
    pub problems: Vec<String>,
    pub mode: String,
    pub guest: Option<Value>,
}

impl EarlyFailure {
    pub fn new(problem: &str, mode: &str) -> Self {
        Self { ok: false, problems: vec![problem.to_string()], mode: mode.to_string(), guest: None }
    }
}

/// A log file's text; nothing if it is not there (lossy: a console can carry any byte).
fn read(dir: &Path, name: &str) -> String {
    std::fs::read(dir.join(name)).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

fn load_json(dir: &Path, name: &str) -> Option<Value> {
    serde_json::from_str(&read(dir, name)).ok()
}

const KDRIVER_PREFIXES: [&str; 4] = ["kdriver-", "fabric-", "verbs-", "fault-"];
/// The four kernel functions the TID RDMA steps must reach (docs/kernel-tid-rdma.md).
const TID_KFUNCS: [&str; 4] =
    ["hfi1_setup_wqe", "hfi1_kern_exp_rcv_setup", "hfi1_kern_setup_hw_flow", "queue_qp_for_tid_wait"];
const TID_COUNTS: [&str; 4] = ["read_bytes", "write_bytes", "flows_programmed", "rcvarray_entries_programmed"];
/// What the psm2 scenario must show (issue 41): the bytes mpi-check compared, and what PSM2's user contexts made
/// the chip do (the device model's user-context counters, both HFIs, over the MPI step).
const PSM2_COUNTS: [&str; 6] = [
    "bytes_checked",
    "pio_user_launches",
    "user_sdma_bytes",
    "tid_entries_programmed",
    "tidflow_user_writes",
    "expected_packets_placed",
];

fn count_problem(what: &str, v: Option<&Value>, kind: &str) -> Option<String> {
    match pyfmt::as_int(v) {
        Some(n) if n > 0 => None,
        _ => Some(format!("{what} is {}, not {kind}", pyfmt::repr(v))),
    }
}

fn check_problems(check: Check, guest: &serde_json::Map<String, Value>) -> Vec<String> {
    let kf = guest.get("kernel_functions").filter(|v| pyfmt::truthy(Some(v)));
    let kf_get = |name: &str| kf.and_then(|k| k.get(name));
    match check {
        Check::SetupWqeCalled => {
            count_problem("kernel_functions.hfi1_setup_wqe", kf_get("hfi1_setup_wqe"), "a count of calls")
                .into_iter()
                .collect()
        }
        Check::TidRdmaCounts => {
            let tid = guest.get("tid_rdma").filter(|v| pyfmt::truthy(Some(v)));
            let funcs = TID_KFUNCS
                .iter()
                .filter_map(|f| count_problem(&format!("kernel_functions.{f}"), kf_get(f), "a count of calls"));
            let counts = TID_COUNTS.iter().filter_map(|c| {
                count_problem(&format!("tid_rdma.{c}"), tid.and_then(|t| t.get(*c)), "a positive count")
            });
            funcs.chain(counts).collect()
        }
        Check::Psm2Counts => {
            let psm2 = guest.get("psm2").filter(|v| pyfmt::truthy(Some(v)));
            PSM2_COUNTS
                .iter()
                .filter_map(|c| count_problem(&format!("psm2.{c}"), psm2.and_then(|t| t.get(*c)), "a positive count"))
                .collect()
        }
    }
}

fn step_name(s: &Value) -> &str {
    s.get("name").and_then(Value::as_str).unwrap_or("")
}

/// Judges the run whose logs are in `facts.log_dir`.
pub fn judge(facts: &Facts) -> RunResult {
    let dir = facts.log_dir.as_path();
    let row = facts.scenario;
    let chip = !row.devices.chip_hfis.is_empty();
    let fabric = row.is_fabric();
    let mut problems = Vec::new();

    let mut guest = match console::result_block(&read(dir, "serial.log")) {
        Ok(g) => Some(g),
        Err(p) => {
            problems.push(p);
            None
        }
    };
    if let Some(g) = guest.as_mut().and_then(|g| g.get_mut("steps")).and_then(Value::as_array_mut) {
        console::read_udriver_reports(g);
        console::check_hfi1_sync(g);
    }
    let empty = Vec::new();
    let steps: &Vec<Value> = guest.as_ref().and_then(|g| g.get("steps")).and_then(Value::as_array).unwrap_or(&empty);

    // The guest runs hfi1-user only when the host side serves its second serial port.
    let host_side_started = facts.hfi1_user_host != "not started";
    let mut expected = Vec::new();
    if let Some(g) = &guest {
        match g.as_object() {
            None => problems.push("the guest's result block is not a JSON object".into()),
            Some(g) => {
                if pyfmt::truthy(g.get("error")) {
                    problems.push(format!("guest: {}", pyfmt::str_of(g.get("error"))));
                }
                if steps.is_empty() {
                    problems.push("the guest ran no step".into());
                }
                let devices = g.get("devices").and_then(Value::as_object).map(|d| d.keys().cloned().collect());
                let opts = RunOptions {
                    guest_devices: Some(devices.unwrap_or_default()),
                    host_side: facts.options.host_side || host_side_started,
                    ..facts.options.clone()
                };
                expected = row.expected_steps(&opts);
                for check in row.checks {
                    problems.extend(check_problems(*check, g));
                }
                for name in &expected {
                    if !steps.iter().any(|s| s.get("name").and_then(Value::as_str) == Some(name)) {
                        problems.push(format!("step {name} did not run"));
                    }
                }
                for s in steps {
                    if !pyfmt::truthy(s.get("ok")) {
                        problems.push(format!(
                            "step {}: {}",
                            pyfmt::str_of(s.get("name")),
                            pyfmt::str_of(s.get("error"))
                        ));
                    }
                }
            }
        }
    }

    let step_accesses = logs::step_accesses(&read(dir, "step-accesses"));
    if chip {
        // Every offset the stock driver touches must be a register of the chip: one that is not means the
        // model (or the driver's reading of it) has a gap.
        for (name, a) in &step_accesses.0 {
            if a.unnamed != 0 {
                problems
                    .push(format!("{name}: {} accesses to offsets the chip's register list does not name", a.unnamed));
            }
        }
    }
    let stalled = read(dir, "stalled").trim().to_string();
    if !stalled.is_empty() {
        let mut report = format!(
            "guest step {stalled} overran its deadline (the host stopped QEMU); last CSR accesses: {}",
            logs::last_accesses(load_json(dir, "stall-accesses.json").as_ref(), 16).join("; ")
        );
        if fabric {
            report += &format!(
                "; hfi1-wfr1's last CSR accesses: {}; last cable packets: {}",
                logs::last_accesses(load_json(dir, "stall-accesses-1.json").as_ref(), 16).join("; "),
                logs::last_packets(load_json(dir, "stall-link.json").as_ref(), 8).join("; ")
            );
        }
        problems.push(report);
    } else if chip {
        let state = load_json(dir, "device-state.json");
        let accesses = state
            .as_ref()
            .and_then(|s| s.get("hfi1-wfr"))
            .and_then(|d| d.get("accesses"))
            .and_then(|a| a.get("result"));
        let driver_failed = steps
            .iter()
            .any(|s| KDRIVER_PREFIXES.iter().any(|p| step_name(s).starts_with(p)) && !pyfmt::truthy(s.get("ok")));
        if driver_failed {
            problems.push(format!(
                "kernel-driver step failed; last CSR accesses: {}",
                logs::last_accesses(accesses, 16).join("; ")
            ));
        }
    }
    let hfi1_user_host = host_side_started.then(|| load_json(dir, "hfi1-user-host.json")).flatten();
    if host_side_started && !facts.hfi1_user_host.starts_with("exited with status 0") {
        // The host side's own verdict: what it checked of the device model while the guest's kernel ran.
        let log = read(dir, "hfi1-user-host.log");
        let lines = pyfmt::splitlines(&log);
        let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
        problems.push(format!("hfi1-user-host {}: {tail}", facts.hfi1_user_host));
    }
    match facts.qemu_exit_status {
        0 => {}
        124 => problems.push("QEMU timed out".into()),
        rc => {
            let stderr = read(dir, "qemu.stderr");
            let errs: Vec<&str> = pyfmt::splitlines(&stderr)
                .into_iter()
                .filter(|l| !l.trim().is_empty() && !l.contains("warning:"))
                .collect();
            let mut p = format!("QEMU exited with status {rc}");
            if !errs.is_empty() {
                p += &format!(": {}", errs[errs.len().saturating_sub(3)..].join(" | "));
            }
            problems.push(p);
        }
    }
    let devices = facts.mode != "no-devices";
    if devices && !facts.device_model.starts_with("external") {
        if !facts.device_model.starts_with("running until stopped") {
            problems.push(format!("device model {}", facts.device_model));
        }
        if read(dir, "device-model.log").contains("panicked at") {
            problems.push("the device model panicked (see device-model.log)".into());
        }
    }

    let timing = timing(facts, guest.as_ref(), steps, &logs::host_marks(&read(dir, "host-times")));
    let member = |name: &str| guest.as_ref().and_then(|g| g.get(name)).cloned();
    RunResult {
        ok: problems.is_empty(),
        problems,
        mode: facts.mode.clone(),
        memory: facts.memory.clone(),
        accel: facts.accel.clone(),
        qemu: facts.qemu.clone(),
        qemu_reply_poll_us: facts.reply_poll_us,
        kernel: facts.kernel.clone(),
        initrd: facts.initrd.clone(),
        qemu_exit_status: facts.qemu_exit_status,
        device_model: devices.then(|| facts.device_model.clone()),
        timing,
        hfi1_wfr_icode: chip.then(|| facts.icode.clone()),
        hfi1_wfr_dma: chip.then(|| facts.hfi1_dma.clone()),
        hfi1_wfr_step_accesses: chip.then_some(step_accesses),
        fabric: if fabric { member("fabric") } else { None },
        kernel_functions: if fabric { member("kernel_functions") } else { None },
        fabric_perf: if facts.options.fabric_perf { member("fabric_perf") } else { None },
        tid_rdma: if row.checks.contains(&Check::TidRdmaCounts) { member("tid_rdma") } else { None },
        psm2: if row.checks.contains(&Check::Psm2Counts) { member("psm2") } else { None },
        capture: facts.capture.clone().filter(|c| !c.is_empty()),
        hfi1_user_host,
        bench: steps.iter().find(|s| step_name(s) == "bench").and_then(|s| s.get("output")).cloned(),
        guest,
        scenario: row.name.to_string(),
        expected_steps: expected.iter().map(|s| s.to_string()).collect(),
    }
}

fn timing(facts: &Facts, guest: Option<&Value>, steps: &[Value], marks: &Ordered<f64>) -> Timing {
    let mut t = Timing {
        total_s: pyfmt::round3(facts.t_qemu_end - facts.t_qemu),
        device_model_start_s: facts.device_model_start_s,
        ..Timing::default()
    };
    let (Some(g), Some(&init)) = (guest, marks.get("init")) else { return t };
    let init_up = g.get("init_start").map_or(Some(0.0), pyfmt::as_f64).unwrap_or(0.0);
    t.qemu_start_s = Some(pyfmt::round3(init - facts.t_qemu - init_up));
    t.kernel_boot_s = Some(pyfmt::round3(init_up));
    let end = g.get("end").and_then(pyfmt::as_f64).unwrap_or(init_up);
    t.init_s = Some(pyfmt::round3(end - init_up));
    let mut demos = Ordered::default();
    let mut probes = Ordered::default();
    for s in steps {
        let name = step_name(s);
        if let Some(dev) = name.strip_prefix("demo-") {
            if let (Some(a), Some(b)) = (s.get("start").and_then(pyfmt::as_f64), s.get("end").and_then(pyfmt::as_f64)) {
                demos.set(dev, pyfmt::round3(b - a));
            }
        }
        if let Some(p) = s.get("probe_s") {
            probes.set(name, p.clone());
        }
    }
    t.demo_s = Some(demos);
    t.hfi1_probe_s = (!probes.is_empty()).then_some(probes);
    t.poweroff_s = marks.get("result_end").map(|&r| pyfmt::round3(facts.t_qemu_end - r));
    t
}

/// The console summary: one line per step, then the problems, then (if asked) the timing.
pub fn summary(result: &RunResult, with_timing: bool) -> String {
    let mut out = String::new();
    let steps = result.guest.as_ref().and_then(|g| g.get("steps")).and_then(Value::as_array);
    for s in steps.into_iter().flatten() {
        let ok = pyfmt::truthy(s.get("ok"));
        let at = |k: &str| s.get(k).and_then(pyfmt::as_f64).unwrap_or(0.0);
        let msg = if ok { String::new() } else { format!("  {}", pyfmt::str_of(s.get("error"))) };
        let name = s.get("name").map_or("?".to_string(), |n| pyfmt::str_of(Some(n)));
        out += &format!("  {} {name:<12} {:6.2}s{msg}\n", if ok { "ok " } else { "ERR" }, at("end") - at("start"));
    }
    for p in &result.problems {
        out += &format!("  problem: {p}\n");
    }
    if with_timing {
        let t = &result.timing;
        let map = |m: &Ordered<f64>| Value::Object(m.0.iter().map(|(k, v)| (k.clone(), Value::from(*v))).collect());
        let mut parts = vec![("total", Some(Value::from(t.total_s)))];
        parts.push(("device_model_start", t.device_model_start_s.map(Value::from)));
        parts.push(("qemu_start", t.qemu_start_s.map(Value::from)));
        parts.push(("kernel_boot", t.kernel_boot_s.map(Value::from)));
        parts.push(("init", t.init_s.map(Value::from)));
        parts.push(("demo", t.demo_s.as_ref().map(map)));
        let probes = |m: &Ordered<Value>| Value::Object(m.0.iter().cloned().collect());
        parts.push(("hfi1_probe", t.hfi1_probe_s.as_ref().map(probes)));
        parts.push(("poweroff", t.poweroff_s.map(Value::from)));
        let parts: Vec<String> =
            parts.into_iter().filter_map(|(k, v)| v.map(|v| format!("{k}={}", pyfmt::repr(Some(&v))))).collect();
        out += &format!("timing (s): {}\n", parts.join(", "));
    }
    out
}
