//! The bench's own logic (statistics, target verdicts, dates, machine facts) and one short run of every case
//! end to end. No test asserts a time: only that each case ran, checked its data, and reported.

#![forbid(unsafe_code)]

use std::time::Duration;

use super::*;

#[test]
fn quantiles_use_the_nearest_rank_of_the_sorted_samples() {
    let s = Samples { ns: vec![50, 10, 40, 20, 30] };
    let cases = [(0.0, 10.0), (0.2, 10.0), (0.5, 30.0), (0.8, 40.0), (0.99, 50.0), (1.0, 50.0)];
    for (q, want) in cases {
        assert_eq!(s.quantile(q), want, "q = {q}");
    }
    assert_eq!(s.mean(), 30.0);
    assert_eq!(s.per_second(), 1e9 / 30.0);
    assert_eq!(Samples::default().median(), 0.0);
    assert_eq!(Samples::default().per_second(), 0.0);
}

#[test]
fn sampling_stops_at_the_first_error_and_returns_it() {
    let mut calls = 0;
    let r = stats::sample(Duration::from_secs(5), 2, 10, 100, || {
        calls += 1;
        if calls == 5 {
            Err("device gone")
        } else {
            Ok(())
        }
    });
    assert_eq!(r, Err("device gone"));
    assert_eq!(calls, 5);
}

#[test]
fn sampling_takes_at_least_min_and_at_most_max_samples() {
    let s = stats::sample(Duration::ZERO, 0, 7, 100, || Ok::<(), ()>(())).unwrap_or_default();
    assert_eq!(s.len(), 7);
    let s = stats::sample(Duration::from_secs(60), 0, 1, 9, || Ok::<(), ()>(())).unwrap_or_default();
    assert_eq!(s.len(), 9);
}

#[test]
fn a_target_is_met_on_the_right_side_of_its_bound_and_says_by_how_much_otherwise() {
    // (measured, bound, better, met, factor)
    let table = [
        (1.2, 1.3, Better::Lower, true, 1.2 / 1.3),
        (2.6, 1.3, Better::Lower, false, 2.0),
        (1.3, 1.3, Better::Lower, true, 1.0),
        (400.0, 100.0, Better::Higher, true, 0.25),
        (25.0, 100.0, Better::Higher, false, 4.0),
        (0.0, 0.5, Better::Higher, false, f64::INFINITY),
    ];
    for (measured, bound, better, met, factor) in table {
        let t = Target::new("x", measured, bound, "x", better);
        assert_eq!((t.met, t.factor), (met, factor), "{measured} vs {bound} {better:?}");
    }
}

#[test]
fn dates_are_utc_calendar_dates() {
    let table = [
        (0, "1970-01-01T00:00:00Z"),
        (951_782_400, "2000-02-29T00:00:00Z"),
        (1_798_444_799, "2026-12-28T07:59:59Z"),
        (4_107_542_400, "2100-03-01T00:00:00Z"),
    ];
    for (secs, want) in table {
        assert_eq!(utc_string(secs), want);
    }
}

#[test]
fn the_cpu_model_is_the_first_model_name_line() {
    let cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nmodel name\t: other\n";
    assert_eq!(cpu_model(cpuinfo), "AMD EPYC 7B13");
    assert_eq!(cpu_model("processor : 0\n"), "unknown");
}

#[test]
fn render_names_every_missed_target_and_its_factor() {
    let mut c = Case::new("a", "round trip");
    c.metric("raw", 1000.0, "ns");
    c.target(Target::new("ratio", 2.6, 1.3, "x", Better::Lower));
    let r = BenchReport {
        date: "2026-01-01T00:00:00Z".into(),
        machine: Machine { nproc: 2, cpu_model: "cpu".into(), kernel: "k".into() },
        build: "release",
        budget_ms: 1,
        cases: vec![c],
    };
    assert_eq!(r.score(), (0, 1));
    let text = r.render();
    assert!(text.contains("0/1 targets met"), "{text}");
    assert!(text.contains("MISSED by 2.00x"), "{text}");
}

/// Every case against the real device model over vfio-user, with a tiny budget: each must run without
/// error (the cases verify what the device did: entries taken, bytes placed, completions clean) and report
/// its targets.
#[test]
fn a_short_run_of_every_case_completes_and_reports_each_target() {
    let report = run(&BenchOptions { budget: Duration::from_millis(20), cases: Vec::new() });
    let ids: Vec<&str> = report.cases.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, CASES);
    for c in &report.cases {
        assert_eq!(c.error, None, "case {}", c.id);
        assert!(!c.metrics.is_empty(), "case {}", c.id);
        assert!(c.metrics.iter().all(|m| m.value.is_finite() && m.value >= 0.0), "case {}: {:?}", c.id, c.metrics);
    }
    let targets: Vec<(&str, usize)> = report.cases.iter().map(|c| (c.id.as_str(), c.targets.len())).collect();
    assert_eq!(targets, [("a", 2), ("b", 1), ("c", 1), ("d", 1), ("e", 1), ("spin", 0)]);
    let json = serde_json::to_value(&report).unwrap_or_default();
    assert_eq!(json["cases"][0]["targets"][0]["better"], "lower");
    assert_eq!(json["machine"]["nproc"], report.machine.nproc);
}

#[test]
fn only_the_requested_cases_run() {
    let report = run(&BenchOptions { budget: Duration::from_millis(5), cases: vec!["b".into()] });
    assert_eq!(report.cases.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["b"]);
    assert_eq!(report.cases[0].error, None);
}
