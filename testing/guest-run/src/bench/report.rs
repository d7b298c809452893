//! docs/bench/results.json from what a ci/bench.sh run left in its work directory: `udriver.json` (testbed
//! bench --json), `quiet.json` (device-model tests/quiet.rs' case line), the result JSON of each guest boot
//! (`qemu-NAME.json`, `qemu-guest-N.json`, ...), and for each boot that could not be had a `*-skip` or
//! `*-failed` file with the reason. The cases and their targets are docs/bench.md's.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::doc::{list, text};
use crate::pyfmt;

/// (f): the time the devices may add to a guest run, in seconds.
pub const TARGET_ADDED_S: f64 = 2.0;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not JSON: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{path}: {what}")]
    Shape { path: PathBuf, what: String },
}

pub type Result<T> = std::result::Result<T, ReportError>;

/// Which way a target is met.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Better {
    Higher,
    Lower,
}

impl Better {
    fn name(self) -> &'static str {
        match self {
            Better::Higher => "higher",
            Better::Lower => "lower",
        }
    }

    fn of(t: &Value) -> Better {
        if text(t, "better") == "higher" {
            Better::Higher
        } else {
            Better::Lower
        }
    }
}

/// Whether `measured` meets `bound`, and by what factor it is off (how many times worse than the bound it
/// is; below 1 when met with room).
pub fn judge(measured: f64, bound: f64, better: Better) -> (bool, f64) {
    match better {
        Better::Higher => (measured >= bound, if measured > 0.0 { bound / measured } else { f64::INFINITY }),
        Better::Lower => (measured <= bound, if bound > 0.0 { measured / bound } else { f64::INFINITY }),
    }
}

/// A target entry; `measured` and `bound` keep their JSON form.
pub fn target(what: &str, measured: Value, bound: Value, unit: &Value, better: Better) -> Value {
    let (m, b) = (measured.as_f64().unwrap_or(f64::NAN), bound.as_f64().unwrap_or(f64::NAN));
    let (met, factor) = judge(m, b, better);
    json!({"what": what, "measured": measured, "bound": bound, "unit": unit, "better": better.name(),
           "met": met, "factor": factor})
}

/// The median as Python's: the middle value itself for an odd count, the mean of the middle two otherwise,
/// NaN (JSON null) for none.
pub fn median(xs: &[Value]) -> Value {
    let mut xs: Vec<&Value> = xs.iter().collect();
    xs.sort_by(|a, b| a.as_f64().unwrap_or(f64::NAN).total_cmp(&b.as_f64().unwrap_or(f64::NAN)));
    let n = xs.len();
    if n == 0 {
        return json!(f64::NAN);
    }
    if n % 2 == 1 {
        return xs[n / 2].clone();
    }
    let (a, b) = (xs[n / 2 - 1].as_f64().unwrap_or(f64::NAN), xs[n / 2].as_f64().unwrap_or(f64::NAN));
    json!((a + b) / 2.0)
}

fn new_case(id: &str, title: &str) -> Value {
    json!({"id": id, "title": title, "metrics": [], "targets": [], "notes": [], "error": null})
}

fn metric(name: &str, value: Value, unit: &str) -> Value {
    json!({"name": name, "value": value, "unit": unit})
}

fn push(case: &mut Value, key: &str, v: Value) {
    if let Some(a) = case.get_mut(key).and_then(Value::as_array_mut) {
        a.push(v);
    }
}

fn problems(r: &Value) -> Vec<String> {
    list(r, "problems").iter().map(|p| pyfmt::str_of(Some(p))).collect()
}

/// The work directory of a run.
pub struct Work {
    dir: PathBuf,
}

impl Work {
    pub fn new(dir: &Path) -> Self {
        Self { dir: dir.to_path_buf() }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn exists(&self, name: &str) -> bool {
        self.path(name).exists()
    }

    /// A skip file's reason (its text, stripped).
    fn reason(&self, name: &str) -> Result<String> {
        let path = self.path(name);
        std::fs::read_to_string(&path)
            .map(|s| s.trim().to_string())
            .map_err(|source| ReportError::Read { path, source })
    }

    fn json(&self, name: &str) -> Result<Value> {
        read_json(&self.path(name))
    }

    fn json_or_empty(&self, name: &str) -> Result<Value> {
        if self.exists(name) {
            self.json(name)
        } else {
            Ok(json!({}))
        }
    }

    /// The boots written as PREFIX-N.json, in boot order.
    fn boots(&self, prefix: &str) -> Result<Vec<(u64, Value)>> {
        let mut found = Vec::new();
        let entries =
            std::fs::read_dir(&self.dir).map_err(|source| ReportError::Read { path: self.dir.clone(), source })?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let n = name
                .strip_prefix(prefix)
                .and_then(|r| r.strip_prefix('-'))
                .and_then(|r| r.strip_suffix(".json"))
                .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|d| d.parse().ok());
            if let Some(n) = n {
                found.push((n, self.json(&name)?));
            }
        }
        found.sort_by_key(|b| b.0);
        Ok(found)
    }
}

pub fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| ReportError::Read { path: path.into(), source })?;
    serde_json::from_str(&text).map_err(|source| ReportError::Json { path: path.into(), source })
}

fn f(v: Option<&Value>) -> f64 {
    v.and_then(Value::as_f64).unwrap_or(0.0)
}

fn label(k: &str) -> String {
    k.strip_suffix("_s").unwrap_or(k).replace('_', " ")
}

/// (f): the guest run with the devices against the same run without them.
fn qemu_case(w: &Work) -> Result<Value> {
    let mut case = new_case("f", "QEMU end-to-end under TCG: with the devices vs the same guest without them");
    if w.exists("qemu-skip") {
        case["error"] = json!(format!("skipped: {}", w.reason("qemu-skip")?));
        return Ok(case);
    }
    let runs = [w.json("qemu-devices.json")?, w.json("qemu-no-devices.json")?];
    let t: Vec<Value> = runs.iter().map(|r| r.get("timing").cloned().unwrap_or(json!({}))).collect();
    for (n, tn) in ["devices", "no-devices"].iter().zip(&t) {
        for k in ["device_model_start_s", "qemu_start_s", "kernel_boot_s", "init_s", "total_s"] {
            if let Some(v) = tn.get(k) {
                push(&mut case, "metrics", metric(&format!("{n}: {}", label(k)), v.clone(), "s"));
            }
        }
    }
    let demos = t[0].get("demo_s").and_then(Value::as_object).cloned().unwrap_or_default();
    for (d, v) in &demos {
        push(&mut case, "metrics", metric(&format!("devices: driver demo {d}"), v.clone(), "s"));
    }
    if !runs.iter().all(|r| pyfmt::truthy(r.get("ok"))) {
        let all: Vec<String> = runs.iter().flat_map(problems).collect();
        case["error"] = json!(format!("a guest run failed: {}", all.join("; ")));
    }
    for k in ["qemu_start_s", "kernel_boot_s", "init_s"] {
        let d = f(t[0].get(k)) - f(t[1].get(k));
        push(&mut case, "metrics", metric(&format!("difference: {}", label(k)), json!(pyfmt::round3(d)), "s"));
    }
    // What the devices add: device-model start plus the whole run minus the demos' own work, against the run
    // without devices.
    let demo_total: f64 = demos.values().map(|v| v.as_f64().unwrap_or(0.0)).sum();
    let added = f(t[0].get("device_model_start_s")) + f(t[0].get("total_s")) - demo_total - f(t[1].get("total_s"));
    let added = pyfmt::round3(added);
    push(
        &mut case,
        "metrics",
        metric("added by the devices (dm start + total - demos - total without devices)", json!(added), "s"),
    );
    push(
        &mut case,
        "targets",
        target(
            "time the devices add to the guest run",
            json!(added),
            json!(TARGET_ADDED_S),
            &json!("s"),
            Better::Lower,
        ),
    );
    push(
        &mut case,
        "notes",
        json!(format!(
            "accel {}, memory {}; demo time is the driver's work inside the guest, reported apart",
            pyfmt::str_of(runs[0].get("accel")),
            pyfmt::str_of(runs[0].get("memory"))
        )),
    );
    Ok(case)
}

/// The result JSON of the boot `name`, or None with the case's error saying why there is none. A run that
/// failed part-way still left its figures: the case reports them beside the failure.
fn run_result(w: &Work, case: &mut Value, name: &str) -> Result<Option<Value>> {
    let file = format!("qemu-{name}.json");
    if !w.exists(&file) {
        let mut why = None;
        for skip in [format!("{name}-failed"), "qemu-skip".to_string()] {
            if w.exists(&skip) {
                why = Some(w.reason(&skip)?);
                break;
            }
        }
        case["error"] = json!(format!("skipped: {}", why.unwrap_or_else(|| "the boot left no result".into())));
        return Ok(None);
    }
    w.json(&file).map(Some)
}

/// (g): reported, not judged: what the kernel's probe costs under TCG, and how many register accesses it traps.
fn kdriver_case(w: &Work) -> Result<Value> {
    let mut case = new_case("g", "the stock Linux hfi1 driver on the chip personality (TCG guest)");
    let Some(r) = run_result(w, &mut case, "kdriver")? else {
        return Ok(case);
    };
    if !pyfmt::truthy(r.get("ok")) {
        case["error"] = json!(format!("the guest run failed: {}", problems(&r).join("; ")));
    }
    if let Some(probes) = r.get("timing").and_then(|t| t.get("hfi1_probe_s")).and_then(Value::as_object) {
        for (step, s) in probes {
            push(&mut case, "metrics", metric(&format!("{step}: modprobe to hfi1_0 registered"), s.clone(), "s"));
        }
    }
    if let Some(acc) = r.get("hfi1_wfr_step_accesses").and_then(Value::as_object) {
        for (step, a) in acc {
            for k in ["reads", "writes"] {
                let v = a.get(k).cloned().unwrap_or(Value::Null);
                push(&mut case, "metrics", metric(&format!("{step}: trapped CSR {k}"), v, "accesses"));
            }
        }
    }
    push(
        &mut case,
        "notes",
        json!("counted by the device model's access log between the guest's step marks; the RcvArray traps too on this personality (docs/hfi1-kernel-driver.md)"),
    );
    Ok(case)
}

/// One case from several boots' (boot number, case) of the same id: where threads land is fixed per boot, so
/// each figure is the median over the boots of that boot's value, and each target the median of the boots'
/// ratios (every boot's ratio is a metric too).
pub fn over_boots(runs: &[(u64, Value)]) -> Value {
    let first = &runs[0].1;
    if runs.len() == 1 {
        return first.clone();
    }
    let mut case = first.clone();
    case["metrics"] = json!([]);
    case["targets"] = json!([]);
    case["notes"] = json!(list(first, "notes"));
    for m in list(first, "metrics") {
        let vals: Vec<Value> = runs
            .iter()
            .flat_map(|(_, c)| list(c, "metrics").iter().filter(|x| x["name"] == m["name"]).map(|x| x["value"].clone()))
            .collect();
        let mut m = m.clone();
        m["value"] = median(&vals);
        push(&mut case, "metrics", m);
    }
    for t in list(first, "targets") {
        let per: Vec<(u64, Value)> = runs
            .iter()
            .flat_map(|(k, c)| {
                list(c, "targets").iter().filter(|x| x["what"] == t["what"]).map(|x| (*k, x["measured"].clone()))
            })
            .collect();
        for (k, v) in &per {
            push(
                &mut case,
                "metrics",
                json!({"name": format!("boot {k}: {}", text(t, "what")), "value": v, "unit": t["unit"]}),
            );
        }
        let vals: Vec<Value> = per.iter().map(|(_, v)| v.clone()).collect();
        let what = format!("{}, median of {} boots", text(t, "what"), per.len());
        push(&mut case, "targets", target(&what, median(&vals), t["bound"].clone(), &t["unit"], Better::of(t)));
    }
    let boots: Vec<String> = runs.iter().map(|(k, _)| k.to_string()).collect();
    push(
        &mut case,
        "notes",
        json!(format!(
            "{} boots ({}): every figure is the median over the boots of that boot's figure, and the target the median of the boots' ratios",
            runs.len(),
            boots.join(", ")
        )),
    );
    case
}

fn is_guest_a_ok(c: &Value) -> bool {
    text(c, "id") == "guest-a" && !pyfmt::truthy(c.get("error"))
}

fn bench_cases(r: &Value) -> &[Value] {
    r.get("bench").map_or(&[], |b| list(b, "cases"))
}

/// udriver bench's own report from inside the guest: its cases join ours, ids guest-*. The trapped accesses
/// (guest-a) come from every boot, the other cases from the first boot that reported.
fn guest_cases(w: &Work) -> Result<Vec<Value>> {
    let why = if w.exists("guest-skip") { w.reason("guest-skip")? } else { String::new() };
    let all = w.boots("qemu-guest")?;
    let reported: Vec<&(u64, Value)> = all
        .iter()
        .filter(|(_, r)| r.get("bench").is_some_and(Value::is_object) && pyfmt::truthy(r["bench"].get("cases")))
        .collect();
    if let Some((_, first)) = reported.first() {
        let bench = &first["bench"];
        let ga: Vec<(u64, Value)> = reported
            .iter()
            .flat_map(|(k, r)| bench_cases(r).iter().filter(|c| is_guest_a_ok(c)).map(|c| (*k, c.clone())))
            .collect();
        let reported_ks: Vec<u64> = reported.iter().map(|(k, _)| *k).collect();
        let failed: Vec<String> =
            all.iter().filter(|(k, _)| !reported_ks.contains(k)).flat_map(|(_, r)| problems(r)).collect();
        let failed = failed.join("; ");
        let mut cases: Vec<Value> = list(bench, "cases")
            .iter()
            .map(|c| if text(c, "id") == "guest-a" && !ga.is_empty() { over_boots(&ga) } else { c.clone() })
            .collect();
        for c in &mut cases {
            if c.get("notes").and_then(Value::as_array).is_none() {
                c["notes"] = json!([]);
            }
            if !why.is_empty() {
                let extra = if failed.is_empty() { String::new() } else { format!(" ({failed})") };
                push(c, "notes", json!(format!("{why}{extra}")));
            }
            if text(c, "id") == "guest-a" {
                push(c, "notes", json!("ours: the device model run with --low-latency (the opt-in the targets are judged with); ours, defaults: the same hfi1 function served with the device model's defaults (testbed serve-peers), judged by nothing, reported against the peer"));
            }
            let nproc = bench.get("machine").and_then(|m| m.get("nproc"));
            push(
                c,
                "notes",
                json!(format!(
                    "measured inside the TCG guest by udriver bench ({}, budget {} ms per variant, guest nproc {})",
                    pyfmt::str_of(bench.get("date")),
                    pyfmt::str_of(bench.get("budget_ms")),
                    pyfmt::str_of(nproc)
                )),
            );
        }
        return Ok(cases);
    }
    let probs: Vec<String> = all.iter().flat_map(|(_, r)| problems(r)).collect();
    let mut case = new_case("guest", "in-guest benchmark (udriver bench over VFIO)");
    let base = if why.is_empty() { "no report from the guest".to_string() } else { why };
    let extra = if probs.is_empty() { String::new() } else { format!(" ({})", probs.join("; ")) };
    case["error"] = json!(format!("skipped: {base}{extra}"));
    Ok(vec![case])
}

fn guest_step<'a>(r: &'a Value, name: &str) -> Option<&'a Value> {
    r.get("guest").and_then(|g| g.get("steps")).and_then(Value::as_array)?.iter().find(|s| text(s, "name") == name)
}

/// The IOMMU domain of each hfi1 function as the guest read it after modprobe (step fabric-modprobe).
fn modprobe_domains(r: &Value) -> String {
    match guest_step(r, "fabric-modprobe").and_then(|s| s.get("iommu_domains")) {
        Some(v) if pyfmt::truthy(Some(v)) => pyfmt::str_of(Some(v)),
        _ => "not reported".into(),
    }
}

/// (h): reported, not judged: the fabric's bring-up in the TCG guest, from the steps of ci/guest/fabric.sh.
fn fabric_case(w: &Work) -> Result<Value> {
    let mut case =
        new_case("h", "the fabric: two HFIs on one cable brought to ACTIVE by the stock driver and opa-fm (TCG guest)");
    let Some(r) = run_result(w, &mut case, "fabric")? else {
        return Ok(case);
    };
    let mut steps: Vec<(String, Value)> = Vec::new();
    for s in r.get("guest").and_then(|g| g.get("steps")).and_then(Value::as_array).map_or(&[][..], Vec::as_slice) {
        let name = pyfmt::str_of(s.get("name"));
        match steps.iter_mut().find(|(n, _)| *n == name) {
            Some(e) => e.1 = s.clone(),
            None => steps.push((name, s.clone())),
        }
    }
    let step = |n: &str| steps.iter().find(|(x, _)| x == n).map(|(_, s)| s.clone()).unwrap_or(json!({}));
    if !pyfmt::truthy(r.get("ok")) {
        case["error"] = json!(format!("the guest run failed: {}", problems(&r).join("; ")));
    }
    // The first three are the table's (ci/bench-table.sh shows a reported case's first figures).
    let acc = step("fabric-smp").get("accesses").filter(|a| pyfmt::truthy(Some(a))).cloned().unwrap_or(json!({}));
    let smp_name = format!(
        "trapped CSR accesses per SMP (opasmaquery, {} SMPs, both HFIs, idle background subtracted)",
        pyfmt::str_of(acc.get("smps"))
    );
    let figures: [(Option<&str>, &str, &str, &str); 6] = [
        (Some("fabric-sm"), "active_s", "modprobe to both ports ACTIVE", "s"),
        (Some("fabric-sm"), "sweep_s", "the SM's sweep (its DISCOVERY CYCLE END line)", "s"),
        (None, "per_smp", &smp_name, "accesses"),
        (Some("fabric-modprobe"), "probe_s", "modprobe hfi1 to both functions registered", "s"),
        (Some("fabric-init"), "init_s", "modprobe to both ports LinkUp/INIT", "s"),
        (Some("fabric-sm"), "sm_to_active_s", "opa-fm start to both ports ACTIVE", "s"),
    ];
    for (s, key, name, unit) in figures {
        let v = match s {
            None => acc.get(key).cloned(),
            Some(s) => step(s).get(key).cloned(),
        };
        if let Some(v) = v.filter(|v| !v.is_null()) {
            push(&mut case, "metrics", metric(name, v, unit));
        }
    }
    for (name, s) in &steps {
        if name.starts_with("verbs-") && name.ends_with("-bw") && s.get("bw_avg_mb_s").is_some_and(|v| !v.is_null()) {
            let n = format!("{name}: perftest BW average ({} B messages)", pyfmt::str_of(s.get("bytes")));
            push(&mut case, "metrics", metric(&n, s["bw_avg_mb_s"].clone(), "MB/s"));
        }
    }
    if list(&case, "metrics").is_empty() && !pyfmt::truthy(case.get("error")) {
        case["error"] = json!("the fabric run reported none of its figures");
    }
    push(&mut case, "notes", json!("the times are the guest's clock from modprobe hfi1 (ci/guest/fabric.sh); the cable trains for its default 1 s once both ends poll (docs/hfi1-fabric.md)"));
    Ok(case)
}

/// The in-guest trapped accesses once more under another condition, from the boots written as prefix-N.json:
/// judged against the same target (judged), or with the targets turned into metrics (a reference).
fn condition_case(
    w: &Work,
    prefix: &str,
    cid: &str,
    title: &str,
    tag: &str,
    note: &str,
    judged: bool,
) -> Result<Value> {
    let mut ga: Vec<(u64, Value)> = w
        .boots(prefix)?
        .into_iter()
        .flat_map(|(k, r)| {
            bench_cases(&r).iter().filter(|c| is_guest_a_ok(c)).map(|c| (k, c.clone())).collect::<Vec<_>>()
        })
        .collect();
    if ga.is_empty() {
        let skip = format!("{}-skip", prefix.replace("qemu-guest", "guest"));
        let why = if w.exists(&skip) { w.reason(&skip)? } else { "no report from the guest".into() };
        let mut case = new_case(cid, &format!("in-guest trapped accesses, {tag}"));
        case["error"] = json!(format!("skipped: {why}"));
        return Ok(case);
    }
    for (_, c) in &mut ga {
        if let Some(ts) = c.get_mut("targets").and_then(Value::as_array_mut) {
            for t in ts {
                t["what"] = json!(format!("{} ({tag})", text(t, "what")));
            }
        }
    }
    let mut case = over_boots(&ga);
    case["id"] = json!(cid);
    case["title"] = json!(format!("{}, {title}", pyfmt::str_of(case.get("title"))));
    if case.get("notes").and_then(Value::as_array).is_none() {
        case["notes"] = json!([]);
    }
    push(&mut case, "notes", json!(note));
    if !judged {
        let extra: Vec<Value> = list(&case, "targets")
            .iter()
            .map(|t| json!({"name": t["what"], "value": t["measured"], "unit": t["unit"]}))
            .collect();
        for m in extra {
            push(&mut case, "metrics", m);
        }
        case["targets"] = json!([]);
    }
    Ok(case)
}

const VERBS_TITLE: &str = "in the guest: perftest over the emulated HFIs (hfi1_0 -> hfi1_1 across the cable) against SoftRoCE (rdma_rxe over a veth pair), TCG";

fn size_name(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{} MiB", b >> 20)
    } else {
        format!("{} KiB", b >> 10)
    }
}

fn present(v: Option<&Value>) -> bool {
    v.is_some_and(|v| !v.is_null())
}

/// One boot of perftest over the emulated HFIs against SoftRoCE, both measured in that boot: bandwidth per
/// size and tool, latency, and the 1 MiB bandwidth target per tool. `identity`: the IOMMU domain the hfi1
/// functions were to have (ci/run-qemu.sh --hfi1-dma): identity for guest-verbs, translated for
/// guest-verbs-iommu.
fn verbs_boot_case(w: &Work, r: &Value, skip: Option<&str>, dma: &str) -> Result<Value> {
    let identity = dma == "identity";
    let mut case = new_case(
        if identity { "guest-verbs" } else { "guest-verbs-iommu" },
        &format!(
            "{VERBS_TITLE}{}",
            if identity {
                ", hfi1 in an identity IOMMU domain"
            } else {
                ", hfi1 behind the vIOMMU's translation (caching mode, strict)"
            }
        ),
    );
    if let Some(skip) = skip {
        case["error"] = json!(format!("skipped: {}", w.reason(skip)?));
        return Ok(case);
    }
    if pyfmt::truthy(Some(r)) && r.get("hfi1_wfr_dma").and_then(Value::as_str) != Some(dma) {
        case["error"] = json!(format!(
            "the boot ran the hfi1 functions with --hfi1-dma {}, not {dma}",
            pyfmt::str_of(r.get("hfi1_wfr_dma"))
        ));
        return Ok(case);
    }
    let perf = r.get("fabric_perf").filter(|p| pyfmt::truthy(Some(p)));
    let step = guest_step(r, "fabric-perf").filter(|s| pyfmt::truthy(Some(s)));
    let (Some(perf), Some(step)) = (perf, step) else {
        let p = problems(r).join("; ");
        case["error"] =
            json!(format!("the guest reported no fabric-perf: {}", if p.is_empty() { "no result".into() } else { p }));
        return Ok(case);
    };
    for row in list(perf, "bw") {
        let b = row["bytes"].as_u64().unwrap_or(0);
        let tool = pyfmt::str_of(row.get("tool"));
        let what = format!("{tool} {}", size_name(b));
        for who in ["hfi1", "rxe"] {
            if pyfmt::truthy(row.get(who)) {
                push(&mut case, "metrics", metric(&format!("{what}: {who}"), row[who]["mib_s"].clone(), "MiB/s"));
            }
        }
        if present(row.get("ratio")) {
            // The results table shows "x" figures of a case without targets: 1 MiB stands for the sizes.
            let unit = if b == 1048576 { "x" } else { "ratio" };
            push(&mut case, "metrics", metric(&format!("{what}: hfi1 / rxe"), row["ratio"].clone(), unit));
        }
        if b == 1048576 {
            if present(row.get("ratio")) {
                let t = target(
                    &format!("{tool} 1 MiB: hfi1 / SoftRoCE bandwidth"),
                    row["ratio"].clone(),
                    json!(1.0),
                    &json!("x"),
                    Better::Higher,
                );
                push(&mut case, "targets", t);
            } else {
                push(&mut case, "notes", json!(format!("{tool} 1 MiB: no ratio (a transport gave no figure)")));
            }
        }
    }
    for row in list(perf, "lat") {
        let what = format!("{} {} B typical latency", pyfmt::str_of(row.get("tool")), pyfmt::str_of(row.get("bytes")));
        for who in ["hfi1", "rxe"] {
            if pyfmt::truthy(row.get(who)) {
                push(&mut case, "metrics", metric(&format!("{what}: {who}"), row[who]["typical_us"].clone(), "us"));
            }
        }
        if present(row.get("ratio")) {
            push(
                &mut case,
                "metrics",
                metric(&format!("{what}: hfi1 / rxe (lower is better)"), row["ratio"].clone(), "x"),
            );
        }
    }
    // What the device model saw of each hfi1 bandwidth run at 1 MiB (set-up and tear-down included).
    for a in list(perf, "hfi1_accesses") {
        let (bytes, packets) = (f(a.get("bytes")), f(a.get("packets")));
        if bytes == 1048576.0 && packets > 0.0 {
            let tool = pyfmt::str_of(a.get("tool"));
            let mib = bytes * f(a.get("iters")) / 1048576.0;
            let round = |x: f64, d: usize| format!("{x:.d$}").parse::<f64>().unwrap_or(x);
            let (reads, writes) = (f(a.get("reads")), f(a.get("writes")));
            push(
                &mut case,
                "metrics",
                metric(
                    &format!("{tool} 1 MiB on hfi1: cable packets per MiB"),
                    json!(round(packets / mib, 1)),
                    "packets",
                ),
            );
            push(
                &mut case,
                "metrics",
                metric(
                    &format!("{tool} 1 MiB on hfi1: trapped CSR accesses per cable packet"),
                    json!(round((reads + writes) / packets, 2)),
                    "accesses",
                ),
            );
            // The reads are what the vCPU waits for: QEMU posts BAR writes to a function with nothing mmappable.
            push(
                &mut case,
                "metrics",
                metric(
                    &format!("{tool} 1 MiB on hfi1: trapped CSR reads per cable packet"),
                    json!(round(reads / packets, 2)),
                    "reads",
                ),
            );
        }
    }
    if !pyfmt::truthy(step.get("ok")) {
        case["error"] = json!(format!("step fabric-perf failed: {}", pyfmt::str_of(step.get("error"))));
    }
    let other: Vec<String> = problems(r).into_iter().filter(|p| !p.contains("fabric-perf")).collect();
    if !other.is_empty() {
        let s: String = other.join("; ").chars().take(600).collect();
        push(&mut case, "notes", json!(format!("the fabric run's other problems (not the benchmark's): {s}")));
    }
    let mtu = |who: &str| pyfmt::str_of(perf.get(who).and_then(|x| x.get("active_mtu")));
    push(
        &mut case,
        "notes",
        json!(format!(
            "hfi1 MTU {}, rxe MTU {} (veth at 9000); MiB/s as perftest's MB/sec; the device model run with --low-latency; the hfi1 functions' IOMMU domains: {}; guest on TCG",
            mtu("hfi1"),
            mtu("rxe"),
            modprobe_domains(r)
        )),
    );
    push(&mut case, "notes", json!("latency: perftest's two processes busy-poll on the guest's one vCPU, so each ping-pong waits for the scheduler's tick (HZ 250, 4 ms): the typical latency counts ticks for both transports, it is not the wire's"));
    Ok(case)
}

/// perftest in the guest over the emulated HFIs against SoftRoCE (ci/guest/perf.sh), over the boots: each
/// boot's figures and ratios from that boot, the case's their medians (over_boots).
fn verbs_case(w: &Work) -> Result<Value> {
    if w.exists("verbs-skip") {
        return verbs_boot_case(w, &json!({}), Some("verbs-skip"), "identity");
    }
    let mut per = Vec::new();
    for (k, r) in w.boots("qemu-verbs")? {
        per.push((k, verbs_boot_case(w, &r, None, "identity")?));
    }
    let good: Vec<(u64, Value)> = per.iter().filter(|(_, c)| !pyfmt::truthy(c.get("error"))).cloned().collect();
    let (mut case, chosen) = if !good.is_empty() {
        (over_boots(&good), None)
    } else if let Some((k, c)) = per.first() {
        (c.clone(), Some(*k))
    } else {
        (verbs_boot_case(w, &json!({}), None, "identity")?, None)
    };
    if good.len() == 1 {
        push(&mut case, "notes", json!(format!("one boot ({})", good[0].0)));
    }
    for (k, c) in &per {
        // Python's `c is not case`: the boot whose case became the result is not noted against itself.
        if pyfmt::truthy(c.get("error")) && chosen != Some(*k) {
            let s: String = format!("boot {k} left out: {}", pyfmt::str_of(c.get("error"))).chars().take(600).collect();
            push(&mut case, "notes", json!(s));
        }
    }
    Ok(case)
}

/// The same benchmark in one boot with the hfi1 functions in the kernel's default, translated DMA domain:
/// what QEMU's vIOMMU costs hfi1's send path. Reported, not judged.
fn verbs_iommu_case(w: &Work) -> Result<Value> {
    let r = w.json_or_empty("qemu-verbs-iommu.json")?;
    let skip = w.exists("verbs-iommu-skip").then_some("verbs-iommu-skip");
    let mut case = verbs_boot_case(w, &r, skip, "translated")?;
    case["targets"] = json!([]);
    push(&mut case, "notes", json!("one boot"));
    Ok(case)
}

/// perftest READ and WRITE in one TID RDMA boot (ci/guest/perf.sh step_tid_perf): on hfi1 with TID RDMA, on
/// hfi1 without it (OPFN cleared) and on SoftRoCE; the share of each hfi1 run's bytes placed through TIDs.
fn tid_case(w: &Work) -> Result<Value> {
    let mut case = new_case(
        "guest-tid",
        "in the guest: perftest READ and WRITE over the emulated HFIs with the kernel's TID RDMA, without it, and on SoftRoCE (rdma_rxe over a veth pair), TCG",
    );
    if w.exists("tidperf-skip") {
        case["error"] = json!(format!("skipped: {}", w.reason("tidperf-skip")?));
        return Ok(case);
    }
    let r = w.json_or_empty("qemu-tid.json")?;
    let perf = r.get("fabric_perf").filter(|p| pyfmt::truthy(Some(p)));
    let step = guest_step(&r, "tid-perf").filter(|s| pyfmt::truthy(Some(s)));
    let (Some(perf), Some(step)) = (perf.filter(|p| text(p, "kind") == "tid"), step) else {
        let p = problems(&r).join("; ");
        case["error"] =
            json!(format!("the guest reported no tid-perf: {}", if p.is_empty() { "no result".into() } else { p }));
        return Ok(case);
    };
    let names = [("tid", "hfi1 TID RDMA"), ("plain", "hfi1 plain RDMA"), ("rxe", "SoftRoCE")];
    for row in list(perf, "bw") {
        let b = row["bytes"].as_u64().unwrap_or(0);
        let what = format!("{} {}", pyfmt::str_of(row.get("tool")), size_name(b));
        for (who, label) in names {
            if pyfmt::truthy(row.get(who)) {
                push(&mut case, "metrics", metric(&format!("{what}: {label}"), row[who]["mib_s"].clone(), "MiB/s"));
            }
        }
        // The ratios at 1 MiB (guest-verbs' size) go to the results table; the others stay in the figures.
        for (key, label) in [
            ("tid_over_plain", "TID / plain"),
            ("tid_over_rxe", "TID / SoftRoCE"),
            ("plain_over_rxe", "plain / SoftRoCE"),
        ] {
            if present(row.get(key)) {
                let unit = if b == 1048576 { "x" } else { "ratio" };
                push(&mut case, "metrics", metric(&format!("{what}: {label}"), row[key].clone(), unit));
            }
        }
        let share = row.get("tid_share").filter(|s| pyfmt::truthy(Some(s))).cloned().unwrap_or(json!({}));
        for (who, label) in &names[..2] {
            if present(share.get(*who)) {
                let n = format!("{what}: bytes through TIDs, {label} run");
                push(&mut case, "metrics", metric(&n, share[*who].clone(), "share"));
            }
        }
    }
    if !pyfmt::truthy(step.get("ok")) {
        case["error"] = json!(format!("step tid-perf failed: {}", pyfmt::str_of(step.get("error"))));
    }
    let other: Vec<String> = problems(&r).into_iter().filter(|p| !p.contains("tid-perf")).collect();
    if !other.is_empty() {
        let s: String = other.join("; ").chars().take(600).collect();
        push(&mut case, "notes", json!(format!("the TID RDMA run's other problems (not the benchmark's): {s}")));
    }
    push(
        &mut case,
        "notes",
        json!(format!(
            "perftest at send queue depth {} on all three (only work requests posted after a QP's OPFN go by TID RDMA); hfi1 cap_mask {}, OPFN cleared for the plain runs; the device model run with --low-latency; the hfi1 functions' IOMMU domains: {}; one boot, guest on TCG",
            pyfmt::str_of(perf.get("depth")),
            pyfmt::str_of(perf.get("cap_mask")),
            modprobe_domains(&r)
        )),
    );
    Ok(case)
}

/// This machine as testbed bench names it (the first "model name" of /proc/cpuinfo), for a run of only this
/// script's own cases.
pub struct Here {
    pub date: String,
    pub nproc: u64,
    pub cpu_model: String,
    pub kernel: String,
}

impl Here {
    pub fn now() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or("unknown".into(), |(_, v)| v.trim().to_string());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
        let nproc = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        Self { date: utc_now(), nproc, cpu_model, kernel }
    }
}

/// The current UTC time as `%Y-%m-%dT%H:%M:%SZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    utc(secs)
}

/// Epoch seconds as `%Y-%m-%dT%H:%M:%SZ` (the civil-from-days algorithm of Howard Hinnant's date library).
pub fn utc(secs: u64) -> String {
    let (days, rem) = ((secs / 86400) as i64, secs % 86400);
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The report of a run from its work directory. `previous`: the results already in the output directory, for
/// a partial run (--case), whose cases not run keep their entries.
pub fn build(work: &Path, previous: Option<Value>, here: &Here) -> Result<Value> {
    let w = Work::new(work);
    let mut report = if w.exists("udriver.json") {
        w.json("udriver.json")?
    } else {
        // Only this script's own cases were asked for: the header of the results already there, with today's
        // date and this machine.
        let mut r = Map::new();
        if let Some(Value::Object(p)) = &previous {
            for (k, v) in p {
                if k != "cases" {
                    r.insert(k.clone(), v.clone());
                }
            }
        }
        let tool = r.get("tool").cloned().unwrap_or(json!("testbed bench"));
        r.insert("tool".into(), tool);
        r.insert("cases".into(), json!([]));
        r.insert("date".into(), json!(here.date));
        r.insert("machine".into(), json!({"nproc": here.nproc, "cpu_model": here.cpu_model, "kernel": here.kernel}));
        Value::Object(r)
    };
    if !report.get("cases").is_some_and(Value::is_array) {
        return Err(ReportError::Shape { path: w.path("udriver.json"), what: "no \"cases\" list".into() });
    }
    let quiet = w.path("quiet.json");
    if std::fs::metadata(&quiet).is_ok_and(|m| m.len() > 0) {
        let text =
            std::fs::read_to_string(&quiet).map_err(|source| ReportError::Read { path: quiet.clone(), source })?;
        let first = pyfmt::splitlines(&text).first().copied().unwrap_or("");
        let mut q: Value =
            serde_json::from_str(first).map_err(|source| ReportError::Json { path: quiet.clone(), source })?;
        if w.exists("quiet-fail") {
            q["error"] = json!("device-model tests/quiet.rs failed: a target was missed or the run broke");
        }
        push(&mut report, "cases", q);
    }
    let mut cases = vec![qemu_case(&w)?, kdriver_case(&w)?, fabric_case(&w)?];
    cases.extend(guest_cases(&w)?);
    cases.push(condition_case(
        &w,
        "qemu-guest-lat0",
        "guest-a-lat0",
        "with the host's idle exit latency held at 0 us (/dev/cpu_dma_latency)",
        "idle latency 0",
        "boots made as guest-a's, with a PM QoS request of 0 us held open: idle CPUs poll instead of halting, so a thread hand-off does not wait for a halted vCPU to wake",
        true,
    )?);
    cases.push(verbs_case(&w)?);
    cases.push(verbs_iommu_case(&w)?);
    cases.push(tid_case(&w)?);
    cases.push(condition_case(
        &w,
        "qemu-guest-nopoll",
        "guest-a-no-reply-poll",
        "QEMU's vCPU waiting for its I/O thread to read each reply",
        "no reply poll",
        "a boot made as guest-a's with ci/run-qemu.sh --reply-poll-us 0: every server's replies are read by QEMU's I/O thread, which wakes the vCPU thread (QEMU upstream); a reference, not judged",
        false,
    )?);
    for c in cases {
        push(&mut report, "cases", c);
    }
    if let Some(previous) = previous.filter(|p| pyfmt::truthy(Some(p))) {
        merge_previous(&mut report, &previous);
    }
    Ok(report)
}

/// A partial run (--case): the cases it did not run keep their entries from the results already there, each
/// with the date of the run that measured it and the machine it ran on (the header names this run's).
pub fn merge_previous(report: &mut Value, previous: &Value) {
    let date = report.get("date").cloned().unwrap_or(Value::Null);
    let mut ran: Vec<(String, Value)> = Vec::new();
    for c in list(report, "cases") {
        if pyfmt::str_of(c.get("error").filter(|e| pyfmt::truthy(Some(e)))).starts_with("skipped: not requested") {
            continue;
        }
        let id = text(c, "id").to_string();
        let mut c = c.clone();
        c["date"] = date.clone();
        if let Some(o) = c.as_object_mut() {
            o.shift_remove("machine");
        }
        match ran.iter_mut().find(|(i, _)| *i == id) {
            Some(e) => e.1 = c,
            None => ran.push((id, c)),
        }
    }
    let mut merged = Vec::new();
    for c in list(previous, "cases") {
        let id = text(c, "id");
        if let Some(i) = ran.iter().position(|(x, _)| x == id) {
            merged.push(ran.remove(i).1);
        } else {
            let mut c = c.clone();
            if let Some(o) = c.as_object_mut() {
                o.entry("date").or_insert_with(|| previous.get("date").cloned().unwrap_or(Value::Null));
                o.entry("machine").or_insert_with(|| previous.get("machine").cloned().unwrap_or(Value::Null));
            }
            merged.push(c);
        }
    }
    // The cases of this run that the previous results did not have, in this run's order.
    for c in list(report, "cases") {
        if let Some(i) = ran.iter().position(|(x, _)| x == text(c, "id")) {
            merged.push(ran.remove(i).1);
        }
    }
    report["cases"] = Value::Array(merged);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_met_on_its_side_of_the_bound_and_its_factor_is_how_far_off_it_is() {
        // docs/bench.md: "higher" targets are met at measured >= bound, "lower" at measured <= bound; the
        // factor is bound/measured for "higher" and measured/bound for "lower" (> 1: missed by that much).
        let cases: &[(f64, f64, Better, bool, f64)] = &[
            (1909.0, 100.0, Better::Higher, true, 100.0 / 1909.0),
            (100.0, 100.0, Better::Higher, true, 1.0),
            (0.5, 1.0, Better::Higher, false, 2.0),
            (1.5, 2.0, Better::Lower, true, 0.75),
            (2.5, 2.0, Better::Lower, false, 1.25),
            (0.0, 1.0, Better::Higher, false, f64::INFINITY),
            (1.0, 0.0, Better::Lower, false, f64::INFINITY),
        ];
        for &(m, b, better, met, factor) in cases {
            assert_eq!(judge(m, b, better), (met, factor), "{m} against {b} ({better:?})");
        }
    }

    #[test]
    fn the_median_of_boots_is_the_middle_value_or_the_mean_of_the_middle_two() {
        let cases: &[(Value, Value)] =
            &[(json!([3.0, 1.0, 2.0]), json!(2.0)), (json!([4, 1, 3, 2]), json!(2.5)), (json!([7]), json!(7))];
        for (xs, want) in cases {
            assert_eq!(median(xs.as_array().expect("list")), *want, "{xs}");
        }
        assert!(median(&[]).is_null(), "no boots: NaN, which JSON writes as null");
    }

    #[test]
    fn the_boots_give_each_figure_the_median_and_judge_the_median_of_their_ratios() {
        let boot = |v: f64, r: f64| {
            json!({"id": "guest-a", "title": "T", "notes": ["n"], "error": null,
                   "metrics": [{"name": "read", "value": v, "unit": "ns"}],
                   "targets": [{"what": "ours / peer", "measured": r, "bound": 1.0, "unit": "x", "better": "lower",
                                "met": r <= 1.0, "factor": r}]})
        };
        let c = over_boots(&[(1, boot(10.0, 1.2)), (2, boot(30.0, 0.9)), (3, boot(20.0, 0.8))]);
        assert_eq!(c["metrics"][0], json!({"name": "read", "value": 20.0, "unit": "ns"}));
        let boots: Vec<&Value> = list(&c, "metrics")[1..].iter().collect();
        assert_eq!(boots.len(), 3);
        assert_eq!(boots[0], &json!({"name": "boot 1: ours / peer", "value": 1.2, "unit": "x"}));
        let t = &c["targets"][0];
        assert_eq!(t["what"], "ours / peer, median of 3 boots");
        assert_eq!(t["measured"], json!(0.9));
        assert_eq!(t["met"], json!(true));
        assert_eq!(list(&c, "notes").len(), 2);
    }

    #[test]
    fn the_time_the_devices_add_is_dm_start_plus_total_minus_demos_minus_the_run_without_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let with = json!({"ok": true, "accel": "tcg", "memory": "shared", "timing": {"device_model_start_s": 0.1,
            "qemu_start_s": 1.0, "kernel_boot_s": 2.0, "init_s": 0.5, "total_s": 20.0,
            "demo_s": {"hfi1": 5.0, "irdma": 4.0}}});
        let without = json!({"ok": true, "timing": {"qemu_start_s": 0.9, "kernel_boot_s": 2.0, "init_s": 0.4,
            "total_s": 9.5}});
        std::fs::write(dir.path().join("qemu-devices.json"), with.to_string()).expect("write");
        std::fs::write(dir.path().join("qemu-no-devices.json"), without.to_string()).expect("write");
        let c = qemu_case(&Work::new(dir.path())).expect("case");
        // 0.1 + 20.0 - (5.0 + 4.0) - 9.5 = 1.6 s, under the 2 s target.
        let t = &c["targets"][0];
        assert_eq!(t["measured"], json!(1.6));
        assert_eq!(t["bound"], json!(2.0));
        assert_eq!(t["met"], json!(true));
        let diff = list(&c, "metrics").iter().find(|m| m["name"] == "difference: qemu start").expect("difference");
        assert_eq!(diff["value"], json!(0.1));
        assert!(c["error"].is_null());
    }

    #[test]
    fn a_skipped_boot_leaves_its_reason_as_the_case_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("qemu-skip"), "not requested (--no-qemu or --case)\n").expect("write");
        let w = Work::new(dir.path());
        assert_eq!(qemu_case(&w).expect("f")["error"], "skipped: not requested (--no-qemu or --case)");
        assert_eq!(kdriver_case(&w).expect("g")["error"], "skipped: not requested (--no-qemu or --case)");
        std::fs::write(dir.path().join("kdriver-failed"), "ci/run-qemu.sh failed").expect("write");
        assert_eq!(kdriver_case(&w).expect("g")["error"], "skipped: ci/run-qemu.sh failed");
    }

    #[test]
    fn a_partial_run_keeps_the_cases_it_did_not_run_with_their_run_and_replaces_the_others() {
        let previous = json!({"date": "D0", "machine": {"nproc": 2}, "cases": [
            {"id": "a", "error": null}, {"id": "guest-tid", "error": null, "date": "D-1"}]});
        let mut report = json!({"date": "D1", "machine": {"nproc": 4}, "cases": [
            {"id": "f", "error": "skipped: not requested (--no-qemu or --case)"},
            {"id": "guest-tid", "error": null, "machine": {"nproc": 4}},
            {"id": "new", "error": "skipped: QEMU failed"}]});
        merge_previous(&mut report, &previous);
        assert_eq!(
            report["cases"],
            json!([{"id": "a", "error": null, "date": "D0", "machine": {"nproc": 2}},
                   {"id": "guest-tid", "error": null, "date": "D1"},
                   {"id": "new", "error": "skipped: QEMU failed", "date": "D1"}])
        );
    }

    #[test]
    fn epoch_seconds_render_as_utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_609_569), "2026-12-07T02:12:49Z");
    }
}
