//! What ci/demo.sh prints of its two runs' result JSON: each demo's steps, the guest's own hfi1 driver on the
//! emulated HFI, the timing; and the fabric's ports, the SM's sweep and its steps.

use std::fmt::Write;

use serde_json::Value;

use crate::pyfmt;

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn steps(v: Option<&Value>) -> &[Value] {
    v.and_then(|g| g.get("steps")).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn ok_mark(ok: bool) -> &'static str {
    if ok {
        " ok "
    } else {
        "FAIL"
    }
}

fn ok_word(ok: bool) -> &'static str {
    if ok {
        "OK"
    } else {
        "FAILED"
    }
}

/// The first `n` characters.
fn cut(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// `json.dumps(v)` as Python writes it: ", " and ": " between items, non-ASCII escaped.
pub fn py_dumps(v: &Value) -> String {
    match v {
        Value::String(s) => {
            let mut out = String::from('"');
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    '\u{08}' => out.push_str("\\b"),
                    '\u{0c}' => out.push_str("\\f"),
                    c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                        let mut buf = [0u16; 2];
                        for u in c.encode_utf16(&mut buf) {
                            let _ = write!(out, "\\u{u:04x}");
                        }
                    }
                    c => out.push(c),
                }
            }
            out.push('"');
            out
        }
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if !n.is_i64() && !n.is_u64() => pyfmt::float(f),
            _ => n.to_string(),
        },
        Value::Array(a) => format!("[{}]", a.iter().map(py_dumps).collect::<Vec<_>>().join(", ")),
        Value::Object(o) => format!(
            "{{{}}}",
            o.iter()
                .map(|(k, x)| format!("{}: {}", py_dumps(&Value::String(k.clone())), py_dumps(x)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `(x.get(key) or "")`.
fn or_empty(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(x) if pyfmt::truthy(Some(x)) => pyfmt::str_of(Some(x)),
        _ => String::new(),
    }
}

fn get_str(v: Option<&Value>, key: &str) -> String {
    pyfmt::str_of(v.and_then(|v| v.get(key)))
}

/// The text after the last `sep` (all of it without one): Python's `s.split(sep)[-1]`.
fn after_last<'a>(s: &'a str, sep: &str) -> &'a str {
    s.rsplit(sep).next().unwrap_or(s)
}

fn sum(rounds: &[Value], key: &str) -> i64 {
    rounds.iter().map(|x| x.get(key).and_then(Value::as_i64).unwrap_or(0)).sum()
}

/// A kdriver step that timed a probe: the device registered, and what the probe trapped.
fn probe_detail(r: &Value, st: &Value) -> String {
    let empty = Value::Object(Default::default());
    let acc = r.get("hfi1_wfr_step_accesses").filter(|a| pyfmt::truthy(Some(a))).unwrap_or(&empty);
    let a = acc.get(s(st, "name")).unwrap_or(&empty);
    let q = |k: &str| a.get(k).map_or("?".to_string(), |v| pyfmt::str_of(Some(v)));
    format!(
        "{} registered in {} s, {} CSR reads, {} writes; {}",
        get_str(Some(st), "ib_device"),
        get_str(Some(st), "probe_s"),
        q("reads"),
        q("writes"),
        get_str(Some(st), "params")
    )
}

/// ci/demo.sh's summary of the shared-memory (or --no-share) run.
pub fn demo(r: &Value) -> String {
    let mut o = String::new();
    let guest = r.get("guest");
    let _ = writeln!(
        o,
        "\nguest run: {} ({}, {}, kernel {})",
        ok_word(pyfmt::truthy(r.get("ok"))),
        get_str(Some(r), "memory"),
        get_str(Some(r), "accel"),
        get_str(guest, "kernel")
    );
    for step in steps(guest) {
        let Some(out) = step.get("output").filter(|o| o.is_object() && o.get("steps").is_some()) else {
            continue;
        };
        let name = s(step, "name");
        let label = name.strip_prefix("demo-").unwrap_or(name).replace("-irq", " (CQP completions by MSI-X)");
        let _ = writeln!(o, "\n{label} demo over VFIO in the guest: {}", ok_word(pyfmt::truthy(out.get("ok"))));
        for x in steps(Some(out)) {
            let d = match x.get("detail") {
                Some(Value::String(d)) => d.clone(),
                d => py_dumps(d.unwrap_or(&Value::Null)),
            };
            let _ = writeln!(o, "  [{}] {:<48} {}", ok_mark(pyfmt::truthy(x.get("ok"))), s(x, "name"), cut(&d, 110));
        }
    }
    let kdrv: Vec<&Value> = steps(guest)
        .iter()
        .filter(|x| s(x, "name").starts_with("kdriver-") || s(x, "name") == "find-hfi1-wfr")
        .collect();
    if !kdrv.is_empty() {
        let ok = kdrv.iter().all(|x| pyfmt::truthy(x.get("ok")));
        let _ = writeln!(o, "\nthe guest's own hfi1 driver on the emulated HFI (8086:24f0): {}", ok_word(ok));
        for st in kdrv {
            let name = s(st, "name");
            let d = if !pyfmt::truthy(st.get("ok")) {
                or_empty(st, "error")
            } else if st.get("probe_s").is_some() {
                probe_detail(r, st)
            } else if name == "kdriver-sysfs" {
                let fs = st.get("sysfs").cloned().unwrap_or_default();
                let sdes = or_empty(&fs, "sdes");
                let sde = after_last(&sdes, " STE ").split(' ').next().unwrap_or("");
                format!(
                    "port {}, {}; node GUID {}; hw_rev {}; SDMA engine 0 {sde}",
                    get_str(Some(&fs), "ports/1/state"),
                    get_str(Some(&fs), "ports/1/phys_state"),
                    get_str(Some(&fs), "node_guid"),
                    get_str(Some(&fs), "hw_rev")
                )
            } else if name == "kdriver-user" {
                let h = r.get("hfi1_user_host").filter(|h| pyfmt::truthy(Some(h))).cloned().unwrap_or_default();
                let rounds = h.get("rounds").and_then(Value::as_array).cloned().unwrap_or_default();
                let neg = rounds
                    .iter()
                    .flat_map(|x| x.get("negatives").and_then(Value::as_array).cloned().unwrap_or_default())
                    .filter(|n| pyfmt::truthy(n.get("ok")))
                    .count();
                format!(
                    "TID_UPDATE through the kernel: {} TIDs in {} rounds matched the RcvArray and the DMA maps on the host; {} packets ({} KiB) placed and verified byte for byte in the guest; {neg} wrong-TID/context/generation packets dropped; nothing valid after TID_FREE",
                    sum(&rounds, "tids"),
                    rounds.len(),
                    sum(&rounds, "placed"),
                    sum(&rounds, "payload_bytes").div_euclid(1024)
                )
            } else if name.starts_with("kdriver-params") {
                let said = or_empty(st, "driver_said");
                let said = said.splitn(3, ": ").last().unwrap_or("").to_string();
                let mut d = format!(
                    "modprobe hfi1 {}: the driver says {}; function {}",
                    get_str(Some(st), "params"),
                    pyfmt::repr(Some(&Value::String(said))),
                    get_str(Some(st), "device")
                );
                if pyfmt::truthy(st.get("kernel_warning")) {
                    d += "; known kernel warning at rmmod (init_one leaks its devdata on this error path)";
                }
                d
            } else if name.starts_with("kdriver-dmesg") {
                let since = if name.ends_with("final") { " since the invalid-parameter step" } else { "" };
                format!("no oops, WARN, BUG or hung task in the kernel log{since}")
            } else if name == "kdriver-final-probe" {
                format!(
                    "{} registered again in {} s: the device model still serves",
                    get_str(Some(st), "ib_device"),
                    get_str(Some(st), "probe_s")
                )
            } else if name.starts_with("kdriver-rmmod") {
                "rmmod hfi1 returned; the function is unbound".into()
            } else if name == "find-hfi1-wfr" {
                format!("{} at {}", get_str(Some(st), "id"), get_str(Some(st), "address"))
            } else {
                let mut rest = st.clone();
                if let Some(m) = rest.as_object_mut() {
                    for k in ["name", "ok", "start", "end", "error"] {
                        m.shift_remove(k);
                    }
                }
                py_dumps(&rest)
            };
            let _ = writeln!(o, "  [{}] {name:<48} {}", ok_mark(pyfmt::truthy(st.get("ok"))), cut(&d, 150));
        }
    }
    let t = r.get("timing");
    let _ = writeln!(
        o,
        "\ntiming: QEMU start {} s, kernel boot {} s, demos {}, hfi1 probes {}",
        get_str(t, "qemu_start_s"),
        get_str(t, "kernel_boot_s"),
        get_str(t, "demo_s"),
        get_str(t, "hfi1_probe_s")
    );
    o
}

/// ci/demo.sh's summary of the fabric run.
pub fn fabric(r: &Value) -> String {
    let mut o = String::new();
    let empty = Value::Object(Default::default());
    let g = r.get("guest").filter(|g| pyfmt::truthy(Some(g))).unwrap_or(&empty);
    let fab = g.get("fabric").filter(|f| pyfmt::truthy(Some(f))).unwrap_or(&empty);
    let _ = writeln!(
        o,
        "\nthe fabric: two emulated HFIs on one cable, the stock hfi1 driver and opa-fm: {}",
        ok_word(pyfmt::truthy(r.get("ok")))
    );
    for p in fab.get("ports").and_then(Value::as_array).map_or(&[][..], Vec::as_slice) {
        let q = |k: &str| get_str(Some(p), k);
        let _ = writeln!(
            o,
            "  {}: node GUID {}, {}, {}, LID {}, neighbour {}",
            q("device"),
            q("node_guid"),
            q("phys_state"),
            q("state"),
            q("lid"),
            q("neighbor_guid")
        );
    }
    let _ = writeln!(o, "  opa-fm: {}", after_last(&or_empty(fab, "sm_discovery"), "topology_main: "));
    let kf = g.get("kernel_functions").filter(|k| pyfmt::truthy(Some(k))).unwrap_or(&empty);
    let _ = writeln!(o, "  hfi1_setup_wqe calls counted by ftrace: {}", get_str(Some(kf), "hfi1_setup_wqe"));
    for st in steps(Some(g)) {
        let name = s(st, "name");
        if !["fabric-", "verbs-", "fault-"].iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let q = |k: &str| get_str(Some(st), k);
        let d = if !pyfmt::truthy(st.get("ok")) {
            or_empty(st, "error")
        } else if name == "fabric-modprobe" {
            let fns: Vec<String> = st
                .get("functions")
                .and_then(Value::as_array)
                .map_or(vec![], |a| a.iter().map(|f| pyfmt::str_of(Some(f))).collect());
            format!("modprobe hfi1: {} bound in {} s", fns.join(", "), q("probe_s"))
        } else if name == "fabric-init" {
            format!("both ports LinkUp/INIT {} s after modprobe, each the other's neighbour", q("init_s"))
        } else if name == "fabric-sm" {
            format!("both ACTIVE {} s after modprobe; sweep {} s", q("active_s"), q("sweep_s"))
        } else if name == "fabric-smp" {
            let guids: Vec<String> = st
                .get("queries")
                .and_then(Value::as_array)
                .map_or(vec![], |a| a.iter().map(|x| get_str(Some(x), "node_guid")).collect());
            let a = st.get("accesses").filter(|a| pyfmt::truthy(Some(a))).unwrap_or(&empty);
            format!(
                "NodeInfo across the cable: {}; {} trapped accesses per SMP",
                guids.join(", "),
                get_str(Some(a), "per_smp")
            )
        } else if st.get("bw_avg_mb_s").is_some() {
            format!("{} B messages: {} MB/s (perftest checks no data)", q("bytes"), q("bw_avg_mb_s"))
        } else if name == "verbs-check" {
            let x = st.get("summary").filter(|x| pyfmt::truthy(Some(x))).unwrap_or(&empty);
            format!(
                "RDMA WRITE + READ, {} transfers, {} bytes compared, {} failed",
                get_str(Some(x), "transfers"),
                get_str(Some(x), "bytes_compared"),
                get_str(Some(x), "failed")
            )
        } else if name.starts_with("fault-") {
            let kernel = match st.get("rc_counters_moved").filter(|v| pyfmt::truthy(Some(v))) {
                Some(v) => v.clone(),
                None => Value::String(after_last(s(st, "sm_line"), "topology_main: ").to_string()),
            };
            format!("{} fired {}x; the kernel: {}", q("fault"), q("fired"), py_dumps(&kernel))
        } else if st.get("rate").is_some() {
            format!("{} -c: every byte checked; {}", q("command"), q("rate"))
        } else if name == "fabric-link-bounce" {
            "opaportconfig bounce: the link trained again (VerifyCap) and both ports are ACTIVE".into()
        } else if name == "fabric-peer-loss" {
            format!(
                "{} unbound with the link up: hfi1_0 went down and came out of its freeze; rebound, ACTIVE, every byte again",
                q("address")
            )
        } else if name == "fabric-rmmod" {
            "rmmod hfi1 with both links up: completed on both HFIs".into()
        } else {
            String::new()
        };
        let _ = writeln!(o, "  [{}] {name:<20} {}", ok_mark(pyfmt::truthy(st.get("ok"))), cut(&d, 160));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_dumps_matches_python_separators_and_escapes() {
        let cases: &[(Value, &str)] = &[
            (json!({"a": 1, "b": [true, null]}), r#"{"a": 1, "b": [true, null]}"#),
            (json!(2.0), "2.0"),
            (json!("µs \"q\""), r#""\u00b5s \"q\"""#),
        ];
        for (v, want) in cases {
            assert_eq!(py_dumps(v), *want);
        }
    }

    #[test]
    fn a_demo_report_lists_each_udriver_step_with_its_detail() {
        let r = json!({"ok": true, "memory": "shared", "accel": "tcg", "guest": {"kernel": "6.12", "steps": [
            {"name": "demo-irdma-irq", "ok": true, "output": {"ok": false, "steps": [
                {"name": "cqp-create", "ok": true, "detail": "ok"},
                {"name": "ring", "ok": false, "detail": {"head": 3}}]}},
            {"name": "find-hfi1-wfr", "ok": true, "id": "8086:24f0", "address": "0000:01:00.0"},
            {"name": "kdriver-probe", "ok": true, "ib_device": "hfi1_0", "probe_s": 1.5, "params": "krcvqs=1"},
            {"name": "kdriver-dmesg-final", "ok": true}]},
            "hfi1_wfr_step_accesses": {"kdriver-probe": {"reads": 10, "writes": 20}},
            "timing": {"qemu_start_s": 0.5, "kernel_boot_s": 2.25, "demo_s": {"hfi1": 1.0}}});
        let out = demo(&r);
        let want = [
            "\nguest run: OK (shared, tcg, kernel 6.12)",
            "\nirdma (CQP completions by MSI-X) demo over VFIO in the guest: FAILED",
            &format!("  [ ok ] {:<48} ok", "cqp-create"),
            &format!("  [FAIL] {:<48} {{\"head\": 3}}", "ring"),
            "\nthe guest's own hfi1 driver on the emulated HFI (8086:24f0): OK",
            &format!("  [ ok ] {:<48} 8086:24f0 at 0000:01:00.0", "find-hfi1-wfr"),
            &format!("  [ ok ] {:<48} hfi1_0 registered in 1.5 s, 10 CSR reads, 20 writes; krcvqs=1", "kdriver-probe"),
            &format!(
                "  [ ok ] {:<48} no oops, WARN, BUG or hung task in the kernel log since the invalid-parameter step",
                "kdriver-dmesg-final"
            ),
            "\ntiming: QEMU start 0.5 s, kernel boot 2.25 s, demos {'hfi1': 1.0}, hfi1 probes None",
        ];
        assert_eq!(out, want.join("\n") + "\n");
    }

    #[test]
    fn a_fabric_report_lists_the_ports_and_each_fabric_step() {
        let r = json!({"ok": false, "guest": {
            "fabric": {"ports": [{"device": "hfi1_0", "node_guid": "0x1", "phys_state": "LinkUp", "state": "ACTIVE",
                                  "lid": 1, "neighbor_guid": "0x2"}],
                       "sm_discovery": "x topology_main: DISCOVERY CYCLE END"},
            "kernel_functions": {"hfi1_setup_wqe": 42},
            "steps": [{"name": "mount", "ok": true},
                      {"name": "fabric-sm", "ok": true, "active_s": 3.5, "sweep_s": 0.25},
                      {"name": "verbs-rc-bw", "ok": true, "bytes": 65536, "bw_avg_mb_s": 12.5},
                      {"name": "fault-drop", "ok": true, "fault": "drop", "fired": 2, "rc_counters_moved": {"a": 1}},
                      {"name": "fabric-rmmod", "ok": false, "error": "timeout"}]}});
        let out = fabric(&r);
        let want = [
            "\nthe fabric: two emulated HFIs on one cable, the stock hfi1 driver and opa-fm: FAILED",
            "  hfi1_0: node GUID 0x1, LinkUp, ACTIVE, LID 1, neighbour 0x2",
            "  opa-fm: DISCOVERY CYCLE END",
            "  hfi1_setup_wqe calls counted by ftrace: 42",
            &format!("  [ ok ] {:<20} both ACTIVE 3.5 s after modprobe; sweep 0.25 s", "fabric-sm"),
            &format!("  [ ok ] {:<20} 65536 B messages: 12.5 MB/s (perftest checks no data)", "verbs-rc-bw"),
            &format!("  [ ok ] {:<20} drop fired 2x; the kernel: {{\"a\": 1}}", "fault-drop"),
            &format!("  [FAIL] {:<20} timeout", "fabric-rmmod"),
        ];
        assert_eq!(out, want.join("\n") + "\n");
    }
}
