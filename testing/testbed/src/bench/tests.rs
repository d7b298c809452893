//! One short run of every case end to end (the report's and the statistics' own logic are tested in
//! udriver::bench). No test asserts a time: only that each case ran, checked its data, and reported.

#![forbid(unsafe_code)]

use std::time::Duration;

use super::*;

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
        let points = c.curves.iter().flat_map(|cv| cv.points.iter());
        assert!(points.clone().all(|[x, y]| x.is_finite() && y.is_finite() && *y >= 0.0), "case {}", c.id);
    }
    let scale = report.cases.iter().find(|c| c.id == "scale").map(|c| c.curves.len());
    assert_eq!(scale, Some(9), "qhash x3, contexts x2, clients, DMA x3");
    let targets: Vec<(&str, usize)> = report.cases.iter().map(|c| (c.id.as_str(), c.targets.len())).collect();
    assert_eq!(targets, [("a", 4), ("b", 1), ("c", 1), ("d", 1), ("e", 1), ("spin", 0), ("scale", 0), ("fabric", 0)]);
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

/// The link between two ports loses nothing (docs/hfi1-fabric.md, "The cable": in order, lossless; the real
/// chip's link credits hold the sender back): one SDMA doorbell of 4096 packets of 4 KiB, far more than any
/// queue between the engine and the peer's receive context holds, arrives whole, every packet where its RHF
/// says and in order, while the receive context has room for all of it.
#[test]
fn a_16_mib_sdma_doorbell_arrives_whole_at_the_peer() {
    use super::fabric_rig::{ud_header, Expected, Fabric, PAYLOAD_BYTES, SDMA_MAX_PACKETS, SDMA_PAYLOAD};
    let mut fabric = Fabric::new().unwrap();
    let payload: Vec<u8> = (0..PAYLOAD_BYTES).map(|i| (i * 7 + i / 4093) as u8).collect();
    fabric.load_payload(&payload).unwrap();
    let headers: Vec<Vec<u8>> = (0..SDMA_MAX_PACKETS as u32).map(|k| ud_header(SDMA_PAYLOAD, k)).collect();
    fabric.sdma(&headers, 0).unwrap();
    let expected: Vec<Expected<'_>> = headers
        .iter()
        .enumerate()
        .map(|(k, h)| Expected { header: h, payload: &payload[k * SDMA_PAYLOAD..][..SDMA_PAYLOAD] })
        .collect();
    fabric.check(&expected).unwrap();
}
