//! docs/bench.md's results table, from docs/bench/results.json (ci/bench-table.sh): every judged target, then,
//! for each case without one, its ratios (or its first figures), and every skipped case with its reason.

use serde_json::Value;

use super::doc::{list, text};
use super::pyformat::{fmt_g, group_thousands};
use crate::pyfmt;

pub const BEGIN: &str =
    "<!-- results table: written by ci/bench-table.sh from docs/bench/results.json; do not edit -->";
pub const END: &str = "<!-- end of results table -->";

/// A value with its unit, in the unit a reader expects: ratios to 3 significant figures, nanoseconds as us
/// from 1000 up, rates with k/M, other units to 4 significant figures.
pub fn fmt(v: Option<&Value>, unit: &str) -> String {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return "-".into();
    };
    let Some(v) = v.as_f64() else {
        return format!("{} {unit}", pyfmt::str_of(Some(v))).trim().to_string();
    };
    match unit {
        "x" if v < 1000.0 => format!("{}x", fmt_g(v, 3, true)),
        "x" => format!("{}x", group_thousands(&format!("{v:.0}"))),
        "ns" if v >= 1000.0 => format!("{} us", fmt_g(v / 1000.0, 3, false)),
        "ns" => format!("{} ns", fmt_g(v, 3, false)),
        "1/s" => {
            for (div, pre) in [(1e6, "M"), (1e3, "k")] {
                if v >= div {
                    return format!("{} {pre}/s", fmt_g(v / div, 3, false));
                }
            }
            format!("{}/s", fmt_g(v, 3, false))
        }
        "s" | "GB/s" => format!("{} {unit}", fmt_g(v, 3, false)),
        _ => format!("{} {unit}", fmt_g(v, 4, true)).trim().to_string(),
    }
}

fn bound(t: &Value) -> String {
    let op = if text(t, "better") == "lower" { "<= " } else { ">= " };
    op.to_string() + &fmt(t.get("bound"), text(t, "unit"))
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// `d.get(key, "?")` as Python's str.
fn or_q(v: Option<&Value>, key: &str) -> String {
    match v.and_then(|v| v.get(key)) {
        None => "?".into(),
        x => pyfmt::str_of(x),
    }
}

fn cpu(m: Option<&Value>) -> String {
    format!("{} x {}", or_q(m, "nproc"), or_q(m, "cpu_model"))
}

/// The table (its heading line, a blank line, the Markdown table), without the markers.
pub fn render(r: &Value) -> String {
    let (mut rows, mut met, mut total, mut carried) = (Vec::<[String; 5]>::new(), 0, 0, false);
    let run_date = r.get("date").cloned().unwrap_or(Value::Null);
    for c in list(r, "cases") {
        let id = text(c, "id");
        let mut cid = if id.chars().count() == 1 { format!("({id})") } else { format!("`{id}`") };
        let elsewhere = c.get("machine").is_some() && cpu(c.get("machine")) != cpu(r.get("machine"));
        let date = c.get("date").unwrap_or(&run_date);
        if !pyfmt::eq(Some(date), Some(&run_date)) || elsewhere {
            cid += &format!(" (run of {}", pyfmt::str_of(Some(date)));
            cid += &if elsewhere { format!(" on {})", cpu(c.get("machine"))) } else { ")".into() };
            carried = true;
        }
        if pyfmt::truthy(c.get("error")) {
            rows.push([
                cid,
                pyfmt::str_of(c.get("title")),
                pyfmt::str_of(c.get("error")),
                "-".into(),
                "not run".into(),
            ]);
            continue;
        }
        let targets = list(c, "targets");
        for t in targets {
            total += 1;
            let ok = pyfmt::truthy(t.get("met"));
            met += usize::from(ok);
            rows.push([
                cid.clone(),
                pyfmt::str_of(t.get("what")),
                format!("**{}**", fmt(t.get("measured"), text(t, "unit"))),
                bound(t),
                if ok { "met" } else { "**missed**" }.into(),
            ]);
        }
        if !targets.is_empty() {
            continue;
        }
        let metrics = list(c, "metrics");
        let shown: Vec<&Value> =
            metrics.iter().filter(|m| text(m, "unit") == "x" && !text(m, "name").starts_with("boot ")).collect();
        let shown = if shown.is_empty() { metrics.iter().take(3).collect() } else { shown };
        for m in shown {
            rows.push([
                cid.clone(),
                pyfmt::str_of(m.get("name")),
                fmt(m.get("value"), text(m, "unit")),
                "-".into(),
                "reported".into(),
            ]);
        }
    }
    let m = r.get("machine");
    let mut head = format!(
        "`ci/bench.sh` of {}: {} build, {} x {}, kernel {}, {} ms per variant on the host; **{met} of {total} \
         targets met**. Plots: [results.svg](bench/results.svg), [scale.svg](bench/scale.svg).",
        or_q(Some(r), "date"),
        or_q(Some(r), "build"),
        or_q(m, "nproc"),
        or_q(m, "cpu_model"),
        or_q(m, "kernel"),
        or_q(Some(r), "budget_ms"),
    );
    if carried {
        head += " Cases marked with an earlier run were not run this time (`ci/bench.sh --case`).";
    }
    let mut table =
        vec![head, String::new(), "| Case | What | Measured | Target | |".into(), "|---|---|---|---|---|".into()];
    table.extend(rows.iter().map(|row| format!("| {} |", row.iter().map(|x| cell(x)).collect::<Vec<_>>().join(" | "))));
    table.join("\n")
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TableError {
    #[error("{doc} has no results table markers:\n{BEGIN}\n{END}")]
    NoMarkers { doc: String },
}

/// The doc with its table (between the markers) replaced by `table`.
pub fn replace(doc_name: &str, doc: &str, table: &str) -> Result<String, TableError> {
    let no_markers = || TableError::NoMarkers { doc: doc_name.to_string() };
    let (before, rest) = doc.split_once(BEGIN).ok_or_else(no_markers)?;
    let (_, after) = rest.split_once(END).ok_or_else(no_markers)?;
    Ok(format!("{before}{BEGIN}\n{table}\n{END}{after}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_are_shown_in_the_unit_a_reader_expects() {
        let cases: &[(Value, &str, &str)] = &[
            (Value::Null, "x", "-"),
            (json!(1.1243), "x", "1.12x"),
            (json!(1909.4), "x", "1,909x"),
            (json!(461.0), "ns", "461 ns"),
            (json!(10509.0), "ns", "10.5 us"),
            (json!(2_500_000.0), "1/s", "2.5 M/s"),
            (json!(4200.0), "1/s", "4.2 k/s"),
            (json!(12.0), "1/s", "12/s"),
            (json!(1.2345), "s", "1.23 s"),
            (json!(12345.0), "accesses", "1.234e+04 accesses"),
            (json!(1234.0), "MiB/s", "1,234 MiB/s"),
            (json!(0.5), "", "0.5"),
        ];
        for (v, unit, want) in cases {
            assert_eq!(fmt(Some(v), unit), *want, "{v} {unit}");
        }
    }

    fn results(cases: Value) -> Value {
        json!({"date": "D1", "build": "release", "budget_ms": 1500,
               "machine": {"nproc": 2, "cpu_model": "CPU", "kernel": "K"}, "cases": cases})
    }

    #[test]
    fn each_target_is_a_row_marked_met_or_missed_and_the_heading_counts_them() {
        let r = results(json!([{"id": "b", "title": "T", "error": null, "metrics": [], "targets": [
            {"what": "speed-up", "measured": 1909.0, "bound": 100.0, "unit": "x", "better": "higher", "met": true},
            {"what": "setup", "measured": 600.0, "bound": 500.0, "unit": "ns", "better": "lower", "met": false}]}]));
        let t = render(&r);
        assert!(t.contains("**1 of 2 targets met**"), "{t}");
        assert!(t.contains("| (b) | speed-up | **1,909x** | >= 100x | met |"), "{t}");
        assert!(t.contains("| (b) | setup | **600 ns** | <= 500 ns | **missed** |"), "{t}");
    }

    #[test]
    fn a_case_without_targets_shows_its_ratios_or_else_its_first_three_figures() {
        let m = |n: &str, u: &str| json!({"name": n, "value": 2.0, "unit": u});
        let r = results(json!([
            {"id": "guest-x", "title": "T", "targets": [], "metrics": [m("a", "s"), m("r", "x"), m("boot 1: r", "x")]},
            {"id": "g", "title": "T", "targets": [], "metrics": [m("1", "s"), m("2", "s"), m("3", "s"), m("4", "s")]}]));
        let t = render(&r);
        assert!(t.contains("| `guest-x` | r | 2x | - | reported |"), "{t}");
        assert!(!t.contains("boot 1"), "{t}");
        assert!(t.contains("| (g) | 3 | 2 s | - | reported |") && !t.contains("| (g) | 4 |"), "{t}");
    }

    #[test]
    fn a_skipped_case_shows_its_reason_and_a_carried_case_its_run() {
        let r = results(json!([
            {"id": "f", "title": "QEMU | TCG", "targets": [], "metrics": [], "error": "skipped: no QEMU"},
            {"id": "h", "title": "T", "targets": [], "metrics": [{"name": "n", "value": 1.0, "unit": "s"}],
             "date": "D0", "machine": {"nproc": 4, "cpu_model": "Other"}}]));
        let t = render(&r);
        assert!(t.contains("| (f) | QEMU \\| TCG | skipped: no QEMU | - | not run |"), "{t}");
        assert!(t.contains("| (h) (run of D0 on 4 x Other) | n | 1 s | - | reported |"), "{t}");
        assert!(t.contains("were not run this time"), "{t}");
    }

    #[test]
    fn the_table_replaces_only_what_is_between_the_markers() {
        let doc = format!("intro\n{BEGIN}\nold\n{END}\noutro\n");
        assert_eq!(replace("d", &doc, "new").as_deref(), Ok(format!("intro\n{BEGIN}\nnew\n{END}\noutro\n").as_str()));
        assert_eq!(replace("d", "no markers", "new"), Err(TableError::NoMarkers { doc: "d".into() }));
    }
}
