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
    let want = [("a", 4), ("b", 1), ("c", 1), ("d", 1), ("e", 1), ("spin", 0), ("scale", 0), ("fabric", 0), ("tid", 0)];
    assert_eq!(targets, want);
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

/// A run of packets from one sender on a fresh fabric.
#[derive(Clone, Copy)]
enum Burst {
    /// `n` PIO packets of `payload` bytes each.
    Pio { payload: usize, n: usize },
    /// `doorbells` SDMA doorbells of `n` 4 KiB packets each.
    Sdma { n: usize, doorbells: usize },
}

/// Sends `burst` and checks each of its packets with `expect` (which may alter what the check looks for);
/// the check's verdict.
fn send_and_check(burst: Burst, expect: impl Fn(&mut Vec<(Vec<u8>, Vec<u8>)>)) -> Result<(), String> {
    use super::fabric_rig::{pio_packet, ud_header, Expected, Fabric, PAYLOAD_BYTES, SDMA_PAYLOAD};
    let mut fabric = Fabric::new()?;
    let source: Vec<u8> = (0..PAYLOAD_BYTES).map(|i| (i * 7 + i / 4093) as u8).collect();
    let (rounds, n) = match burst {
        Burst::Pio { n, .. } => (1, n),
        Burst::Sdma { n, doorbells } => {
            fabric.load_payload(&source)?;
            (doorbells, n)
        }
    };
    for round in 0..rounds {
        let psn = |k: usize| (round * n + k) as u32;
        let mut sent: Vec<(Vec<u8>, Vec<u8>)> = match burst {
            Burst::Pio { payload, .. } => {
                (0..n).map(|k| (ud_header(payload, psn(k)), source[k * 5..][..payload].to_vec())).collect()
            }
            Burst::Sdma { .. } => (0..n)
                .map(|k| {
                    (ud_header(SDMA_PAYLOAD, psn(k)), source[round * 64 + k * SDMA_PAYLOAD..][..SDMA_PAYLOAD].to_vec())
                })
                .collect(),
        };
        match burst {
            Burst::Pio { .. } => fabric.pio(&sent.iter().map(|(h, p)| pio_packet(h, p)).collect::<Vec<_>>())?,
            Burst::Sdma { .. } => fabric.sdma(&sent.iter().map(|(h, _)| h.clone()).collect::<Vec<_>>(), round * 64)?,
        };
        expect(&mut sent);
        let expected: Vec<Expected<'_>> = sent.iter().map(|(h, p)| Expected { header: h, payload: p }).collect();
        fabric.check(&expected)?;
    }
    Ok(())
}

/// What the receiving driver finds after each burst (docs/hfi1-fabric.md "Receive"): every packet in the header
/// queue in order, its RHF (PktLen, RcvType IB, no error bit, RcvSeq 1..13 wrapping, HdrqOffset, UseEgrBfr), its
/// header right against the RHF, its payload packed in the eager buffer the RHF names. Bursts as long as the
/// peer's port queues, three doorbells in a row, wrap the header queue and the eager buffers.
#[test]
fn every_burst_lands_where_its_rhf_says() {
    use super::fabric_rig::{MAX_BURST, PIO_MAX_PAYLOAD};
    let cases = [
        ("PIO, 40 packets of 64 B", Burst::Pio { payload: 64, n: 40 }),
        ("PIO, 100 packets of the largest payload", Burst::Pio { payload: PIO_MAX_PAYLOAD, n: 100 }),
        ("SDMA, one packet", Burst::Sdma { n: 1, doorbells: 1 }),
        ("SDMA, three doorbells of the longest burst", Burst::Sdma { n: MAX_BURST, doorbells: 3 }),
    ];
    for (what, burst) in cases {
        assert_eq!(send_and_check(burst, |_| {}), Ok(()), "{what}");
    }
}

/// The check reads what landed, so a run measures real work: checked against anything but what was sent, it
/// fails and names the packet.
#[test]
fn the_check_names_the_packet_that_differs_from_what_was_sent() {
    type Alter = fn(&mut Vec<(Vec<u8>, Vec<u8>)>);
    let cases: [(&str, Burst, Alter, &str); 5] = [
        ("a payload byte", Burst::Pio { payload: 64, n: 8 }, |s| s[3].1[10] ^= 1, "packet 3: the payload"),
        (
            "a PSN in the header",
            Burst::Pio { payload: 64, n: 8 },
            |s| s[5].0[19] ^= 1,
            "packet 5 (entry 5): the header",
        ),
        ("two packets swapped", Burst::Pio { payload: 64, n: 8 }, |s| s.swap(2, 6), "packet 2 (entry 2): the header"),
        ("a shorter payload", Burst::Pio { payload: 64, n: 8 }, |s| s[4].1.truncate(60), "packet 4 (entry 4): RHF"),
        ("an SDMA payload byte", Burst::Sdma { n: 16, doorbells: 1 }, |s| s[15].1[4095] ^= 1, "packet 15: the payload"),
    ];
    for (what, burst, alter, error) in cases {
        let got = send_and_check(burst, alter);
        assert!(got.as_ref().is_err_and(|e| e.starts_with(error)), "{what}: {got:?}");
    }
}

/// What the requester's driver finds after each TID RDMA round (docs/hfi1-fabric.md "TID RDMA on the wire"):
/// every payload on the page its TID names and nothing else of the receive region changed, one EXPECTED entry
/// per segment (the header suppressed on the others), the flow's next PSN past the round. Nine doorbells of
/// four segments take 2304 sequences, more than a generation holds (MAX_TID_FLOW_PSN 2048), so the flow is
/// synced onto the next generation on the way, as the kernel does; both paths, and single segments between.
#[test]
fn every_tid_round_lands_in_its_pages_across_generations() {
    use super::tid::{Path, TidRig};
    use super::tid_rig::MAX_SEGMENTS;
    let mut rig = TidRig::new().unwrap();
    for k in 0..9 {
        let path = if k % 2 == 0 { Path::Sdma } else { Path::Port };
        assert!(rig.round(path, MAX_SEGMENTS, |_| {}).is_ok(), "doorbell {k} of four segments by {path:?}");
        assert!(rig.round(path, 1, |_| {}).is_ok(), "one segment after doorbell {k}, by {path:?}");
    }
}

/// The TID check reads what landed: checked against anything but what was sent, or after a stray write into
/// the receive region, it fails and names the packet or the page.
#[test]
fn the_tid_check_names_the_packet_or_page_that_differs() {
    use super::tid::{Path, TidRig};
    use super::tid_rig::REGION;
    use vfio_user_proto::dma::DmaAccess;
    type Alter = fn(&mut Vec<Vec<u8>>);
    let cases: [(&str, Path, Alter, &str); 3] = [
        ("a payload byte", Path::Sdma, |p| p[5][100] ^= 1, "packet 5: its payload differs"),
        ("two payloads swapped", Path::Port, |p| p.swap(2, 40), "packet 2: its payload differs"),
        ("the last payload cut short", Path::Sdma, |p| p[63].truncate(4000), "segment 0 (entry 1): RHF"),
    ];
    for (what, path, alter, error) in cases {
        let mut rig = TidRig::new().unwrap();
        assert_eq!(rig.round(path, 1, |_| {}).map(|_| ()), Ok(()), "{what}: the round before");
        let got = rig.round(path, 1, alter);
        assert!(got.as_ref().is_err_and(|e| e.starts_with(error)), "{what}: {got:?}");
    }
    // Region page 0 lies between buffer pages: nothing may write it.
    let mut rig = TidRig::new().unwrap();
    rig.receiver().mem.write(REGION + 10, &[0]).unwrap();
    let got = rig.round(Path::Sdma, 1, |_| {});
    assert!(got.as_ref().is_err_and(|e| e.starts_with("region page 0, a gap, was written")), "{got:?}");
}
