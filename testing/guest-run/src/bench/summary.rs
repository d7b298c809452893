//! What ci/bench.sh prints at the end of a run: (a) against the peer, the quiet case, the host's fabric and TID
//! figures, the in-guest tables, the verbs and TID RDMA tables, the scale curves, and how many targets were met.

use std::fmt::Write;

use serde_json::Value;

use super::doc::{case, list, num, text};
use super::pyformat::{fmt_g, g};
use crate::pyfmt;

fn metric(case: Option<&Value>, name: &str) -> Option<f64> {
    case.map_or(&[][..], |c| list(c, "metrics"))
        .iter()
        .find(|m| text(m, "name") == name)
        .and_then(|m| num(m.get("value")))
}

/// A figure as the summary shows it: nanoseconds as microseconds, others to 3 significant figures.
pub fn fmt(v: Option<f64>, unit: &str) -> String {
    match v {
        None => "-".into(),
        Some(v) if unit == "ns" => format!("{:.1} us", v / 1000.0),
        Some(v) if unit.is_empty() => fmt_g(v, 3, false),
        Some(v) => format!("{} {unit}", fmt_g(v, 3, false)),
    }
}

fn ratio(x: Option<f64>, y: Option<f64>) -> String {
    match (x, y) {
        (Some(x), Some(y)) if x != 0.0 && y != 0.0 => format!("{:.2}x", x / y),
        _ => "-".into(),
    }
}

fn met_word(t: &Value) -> &'static str {
    if pyfmt::truthy(t.get("met")) {
        "met"
    } else {
        "MISSED"
    }
}

fn error_line(out: &mut String, c: Option<&Value>, id: &str) {
    if let Some(e) = c.and_then(|c| c.get("error")).filter(|e| pyfmt::truthy(Some(e))) {
        let _ = writeln!(out, "  ({id}) {}", pyfmt::str_of(Some(e)));
    }
}

fn measured_in_this_run(c: &Value, report: &Value) -> bool {
    let run = report.get("date").unwrap_or(&Value::Null);
    pyfmt::eq(Some(c.get("date").unwrap_or(run)), Some(run))
}

fn guest_table(out: &mut String, ga: Option<&Value>, heading: &str) {
    let _ = writeln!(out, "{heading}");
    let Some(ga) = ga.filter(|c| !pyfmt::truthy(c.get("error"))) else {
        return;
    };
    let _ = writeln!(out, "  {:<18} {:>10} {:>10}", "", "read", "write");
    for who in ["ours", "ours, defaults", "peer", "edu"] {
        let r = metric(Some(ga), &format!("{who}: trapped read, median"));
        let w = metric(Some(ga), &format!("{who}: trapped write, median"));
        if r.is_some() {
            let _ = writeln!(out, "  {who:<18} {:>10} {:>10}", fmt(r, "ns"), fmt(w, "ns"));
        }
    }
    for name in ["ours / edu, read", "defaults / ours, read", "ours, defaults / peer, trapped read"] {
        if let Some(v) = metric(Some(ga), name) {
            let _ = writeln!(out, "  {name:<28} {v:.2}x");
        }
    }
    let mut per: Vec<(String, Vec<String>)> = Vec::new();
    for m in list(ga, "metrics") {
        let name = text(m, "name");
        if let (true, Some((boot, what))) = (name.starts_with("boot "), name.split_once(": ")) {
            let v = format!("{boot} {:.2}x", num(m.get("value")).unwrap_or(f64::NAN));
            match per.iter_mut().find(|(w, _)| w == what) {
                Some(e) => e.1.push(v),
                None => per.push((what.to_string(), vec![v])),
            }
        }
    }
    for (what, vals) in per {
        let _ = writeln!(out, "  {what}, by boot: {}", vals.join(", "));
    }
    for t in list(ga, "targets") {
        let _ = writeln!(
            out,
            "  {:<28} {:.2}x (target <= {}x): {}",
            pyfmt::str_of(t.get("what")),
            num(t.get("measured")).unwrap_or(f64::NAN),
            pyfmt::str_of(t.get("bound")),
            met_word(t)
        );
    }
}

/// A guest-verbs case measured in this run, as a table of hfi1 against SoftRoCE.
fn verbs_table(out: &mut String, report: &Value, gv: Option<&Value>, gv_id: &str, heading: &str) {
    let Some(gv) = gv.filter(|c| measured_in_this_run(c, report)) else {
        return;
    };
    let _ = writeln!(
        out,
        "\n({gv_id}) perftest in the guest, hfi1_0 -> hfi1_1 against SoftRoCE over veth, {heading} (MiB/s; latency us):"
    );
    let mut rows: Vec<(String, Vec<(String, f64)>)> = Vec::new();
    let mut device = Vec::new();
    for m in list(gv, "metrics") {
        let name = text(m, "name");
        if name.contains(" on hfi1: ") || name.starts_with("boot ") {
            device.push(m);
            continue;
        }
        let (what, who) = name.rsplit_once(": ").unwrap_or(("", name));
        let v = num(m.get("value")).unwrap_or(f64::NAN);
        match rows.iter_mut().find(|(w, _)| w == what) {
            Some(e) => match e.1.iter_mut().find(|(k, _)| k == who) {
                Some(x) => x.1 = v,
                None => e.1.push((who.to_string(), v)),
            },
            None => rows.push((what.to_string(), vec![(who.to_string(), v)])),
        }
    }
    let _ = writeln!(out, "  {:<36} {:>10} {:>10} {:>9}", "", "hfi1", "rxe", "hfi1/rxe");
    for (what, v) in &rows {
        let get = |k: &str| v.iter().find(|(x, _)| x == k).map(|x| x.1);
        let r = get("hfi1 / rxe").or_else(|| get("hfi1 / rxe (lower is better)"));
        let r = r.map_or("-".to_string(), |r| format!("{r:.3}x"));
        let _ = writeln!(out, "  {what:<36} {:>10} {:>10} {r:>9}", fmt(get("hfi1"), ""), fmt(get("rxe"), ""));
    }
    for m in device {
        let _ = writeln!(out, "  {:<64} {}", text(m, "name"), g(num(m.get("value")).unwrap_or(f64::NAN)));
    }
    for t in list(gv, "targets") {
        let _ = writeln!(
            out,
            "  {:<44} {:.3}x (target >= {}x): {}",
            pyfmt::str_of(t.get("what")),
            num(t.get("measured")).unwrap_or(f64::NAN),
            g(num(t.get("bound")).unwrap_or(f64::NAN)),
            met_word(t)
        );
    }
    error_line(out, Some(gv), gv_id);
}

/// The summary of a report whose files went to `out_dir`.
pub fn render(report: &Value, out_dir: &str) -> String {
    let mut out = String::new();
    let o = &mut out;
    let a = case(report, "a");
    if a.is_some() {
        let _ = writeln!(o, "\n(a) trapped round trip, host, one process:");
        // --low-latency (the opt-in): judged against the peer; defaults: judged against the raw socket; exact:
        // the opt-in reading message by message on both sides (what the peek mode saves).
        let _ = writeln!(
            o,
            "  {:<18} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>13} {:>12}",
            "", "opt-in", "defaults", "exact", "rust-vmm", "raw", "opt-in/peer", "default/peer", "default/raw"
        );
        for op in ["REGION_READ 8 B", "REGION_WRITE 8 B"] {
            let m = |s: &str| metric(a, &format!("{op}: {s}, median"));
            let (on, n, e, p, r) = (
                m("ours --low-latency"),
                m("ours with the defaults"),
                m("ours --low-latency, exact reads both sides"),
                m("rust-vmm peer server"),
                m("raw socket ping-pong"),
            );
            let _ = writeln!(
                o,
                "  {op:<18} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>13} {:>12}",
                fmt(on, "ns"),
                fmt(n, "ns"),
                fmt(e, "ns"),
                fmt(p, "ns"),
                fmt(r, "ns"),
                ratio(on, p),
                ratio(n, p),
                ratio(n, r)
            );
        }
    }
    if let Some(quiet) = case(report, "quiet") {
        let _ = writeln!(o, "\n(quiet) device-model CPU, idle 2 s and a read every 2 ms:");
        for name in ["defaults", "event-driven", "--low-latency"] {
            let q = |s: &str| metric(Some(quiet), &format!("{name}: {s}"));
            let _ = writeln!(
                o,
                "  {name:<14} idle {}, {} wake-ups; sparse {} CPU per read",
                fmt(q("idle, CPU over 2 s"), "ms"),
                fmt(q("idle, thread wake-ups over 2 s"), ""),
                fmt(q("sparse client, CPU per read"), "us")
            );
        }
        for t in list(quiet, "targets") {
            let _ = writeln!(
                o,
                "  {:<44} {} (target <= {}): {}",
                pyfmt::str_of(t.get("what")),
                fmt_g(num(t.get("measured")).unwrap_or(f64::NAN), 3, false),
                g(num(t.get("bound")).unwrap_or(f64::NAN)),
                met_word(t)
            );
        }
        error_line(o, Some(quiet), "quiet");
    }
    for (cid, heading) in [("fabric", "two HFIs on one cable"), ("tid", "TID RDMA through the flow table, two HFIs")] {
        if let Some(host) = case(report, cid).filter(|c| measured_in_this_run(c, report)) {
            let _ = writeln!(o, "\n({cid}) {heading}, host, one process (reported, no target):");
            for m in list(host, "metrics") {
                let _ = writeln!(o, "  {:<54} {}", text(m, "name"), fmt(num(m.get("value")), text(m, "unit")));
            }
            error_line(o, Some(host), cid);
        }
    }
    let ga = case(report, "guest-a");
    guest_table(
        o,
        ga,
        "\nin the guest (udriver bench over VFIO, TCG; ours: device-model --low-latency; ours, defaults: the same \
         function served with the device model's defaults):",
    );
    let lat0 = case(report, "guest-a-lat0");
    guest_table(o, lat0, "\nthe same, the host's idle exit latency held at 0 us (PM QoS):");
    error_line(o, lat0, "guest-a-lat0");
    let nopoll = case(report, "guest-a-no-reply-poll");
    guest_table(o, nopoll, "\nthe same, QEMU's vCPU waiting for its I/O thread (--reply-poll-us 0, not judged):");
    if let Some(nopoll) = nopoll {
        error_line(o, Some(nopoll), "guest-a-no-reply-poll");
        for m in list(nopoll, "metrics") {
            if text(m, "name").starts_with("ours / peer, trapped read") {
                let _ = writeln!(o, "  {:<28} {:.2}x", text(m, "name"), num(m.get("value")).unwrap_or(f64::NAN));
            }
        }
    }
    const APART: [&str; 6] =
        ["guest-a", "guest-a-lat0", "guest-a-no-reply-poll", "guest-verbs", "guest-verbs-iommu", "guest-tid"];
    for c in list(report, "cases") {
        let id = text(c, "id");
        if id.starts_with("guest") && !APART.contains(&id) {
            error_line(o, Some(c), id);
            for m in list(c, "metrics") {
                let _ = writeln!(o, "  ({id}) {:<44} {}", text(m, "name"), fmt(num(m.get("value")), text(m, "unit")));
            }
        }
    }
    error_line(o, ga, "guest-a");
    for (gv_id, heading) in [
        ("guest-verbs", "hfi1 in an identity IOMMU domain"),
        ("guest-verbs-iommu", "hfi1 behind the vIOMMU's translation, not judged"),
    ] {
        verbs_table(o, report, case(report, gv_id), gv_id, heading);
    }
    if let Some(gt) = case(report, "guest-tid").filter(|c| measured_in_this_run(c, report)) {
        let _ =
            writeln!(o, "\n(guest-tid) perftest READ and WRITE in the guest: TID RDMA, plain RDMA, SoftRoCE (MiB/s):");
        for m in list(gt, "metrics") {
            let _ = writeln!(o, "  {:<56} {}", text(m, "name"), fmt(num(m.get("value")), text(m, "unit")));
        }
        error_line(o, Some(gt), "guest-tid");
    }
    let curves = case(report, "scale").map_or(&[][..], |s| list(s, "curves"));
    if !curves.is_empty() {
        let _ = writeln!(o, "\nscale curves ({out_dir}/scale.svg):");
        for cv in curves {
            let pts: Vec<String> = list(cv, "points")
                .iter()
                .map(|p| {
                    let x = num(p.get(0)).unwrap_or(f64::NAN);
                    let y = num(p.get(1)).unwrap_or(f64::NAN);
                    format!("{}: {}", g(x), fmt_g(y, 3, false))
                })
                .collect();
            let _ = writeln!(
                o,
                "  {} [{} by {}]: {}",
                text(cv, "name"),
                pyfmt::str_of(cv.get("unit")),
                pyfmt::str_of(cv.get("x")),
                pts.join(", ")
            );
        }
    }
    let (met, total) = targets_met(report);
    let _ = writeln!(o, "{met}/{total} targets met; results in {out_dir}/results.json and {out_dir}/results.svg");
    out
}

/// How many targets of the report were met, of how many.
pub fn targets_met(report: &Value) -> (usize, usize) {
    let targets = list(report, "cases").iter().flat_map(|c| list(c, "targets"));
    targets.fold((0, 0), |(m, t), x| (m + usize::from(pyfmt::truthy(x.get("met"))), t + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn figures_print_in_microseconds_or_to_three_significant_figures() {
        let cases: &[(Option<f64>, &str, &str)] = &[
            (None, "ns", "-"),
            (Some(10509.0), "ns", "10.5 us"),
            (Some(0.01234), "ms", "0.0123 ms"),
            (Some(37.0), "", "37"),
        ];
        for &(v, unit, want) in cases {
            assert_eq!(fmt(v, unit), want, "{v:?} {unit}");
        }
        assert_eq!(ratio(Some(10509.0), Some(16050.0)), "0.65x");
        assert_eq!(ratio(Some(1.0), Some(0.0)), "-");
    }

    #[test]
    fn the_last_line_counts_the_targets_met() {
        let r = json!({"date": "D", "cases": [
            {"id": "b", "targets": [{"met": true}, {"met": false}]}, {"id": "c", "targets": [{"met": true}]}]});
        assert_eq!(targets_met(&r), (2, 3));
        assert!(render(&r, "docs/bench")
            .ends_with("2/3 targets met; results in docs/bench/results.json and docs/bench/results.svg\n"));
    }
}
