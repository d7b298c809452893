//! The report's and the statistics' own logic: quantiles, sampling limits, target verdicts, dates, machine
//! facts, rendering.

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
    let r = sample(Duration::from_secs(5), 2, 10, 100, || {
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
    let s = sample(Duration::ZERO, 0, 7, 100, || Ok::<(), ()>(())).unwrap_or_default();
    assert_eq!(s.len(), 7);
    let s = sample(Duration::from_secs(60), 0, 1, 9, || Ok::<(), ()>(())).unwrap_or_default();
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
        tool: "testbed",
        date: "2026-01-01T00:00:00Z".into(),
        machine: Machine { nproc: 2, cpu_model: "cpu".into(), kernel: "k".into() },
        build: "release",
        budget_ms: 1,
        cases: vec![c],
    };
    assert_eq!(r.score(), (0, 1));
    let text = r.render();
    assert!(text.starts_with("testbed bench, 2026-01-01") && text.contains("0/1 targets met"), "{text}");
    assert!(text.contains("MISSED by 2.00x"), "{text}");
}
