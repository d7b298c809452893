#![forbid(unsafe_code)]

use clap::CommandFactory;
use std::time::Duration;

use super::*;

fn parse(args: &[&str]) -> Result<Args, clap::Error> {
    Args::try_parse_from(std::iter::once("device-model").chain(args.iter().copied()))
}

fn served(args: &[&str]) -> Result<Vec<Served>, CliError> {
    parse(args).unwrap().served()
}

#[test]
fn parse_ids_reads_hex_vendor_and_device() {
    let ok = [
        ("1b36:1100", 0x1b36, 0x1100),
        ("8086:1592", 0x8086, 0x1592),
        ("0x8086:0x24f0", 0x8086, 0x24f0),
        ("1B36:00ff", 0x1b36, 0x00ff),
        ("1:2", 0x0001, 0x0002),
    ];
    for (s, v, d) in ok {
        assert_eq!(parse_ids(s), Ok(VendorDevice { vendor_id: v, device_id: d }), "{s}");
    }
    let bad = [
        ("1b36", CliError::IdsFormat("1b36".into())),
        ("1b36-1100", CliError::IdsFormat("1b36-1100".into())),
        (":1100", CliError::IdHex("".into())),
        ("1b36:", CliError::IdHex("".into())),
        ("1b36:11000", CliError::IdHex("11000".into())),
        ("xyz:1100", CliError::IdHex("xyz".into())),
        ("1b36:1100:1", CliError::IdHex("1100:1".into())),
        ("ffff:1100", CliError::IdReserved(0xffff)),
        ("0000:1100", CliError::IdReserved(0)),
        ("+1b3:1100", CliError::IdHex("+1b3".into())),
    ];
    for (s, e) in bad {
        assert_eq!(parse_ids(s), Err(e), "{s}");
    }
}

#[test]
fn a_socket_mode_is_octal_keeps_the_owners_read_and_write_and_has_no_special_bits() {
    for (s, m) in [("0600", 0o600), ("600", 0o600), ("0660", 0o660), ("0o666", 0o666), ("0777", 0o777), ("640", 0o640)]
    {
        assert_eq!(parse_socket_mode(s), Ok(m), "{s}");
    }
    for s in
        ["", "0o", "0400", "0200", "0060", "660x", "0680", "1660", "4600", "01777", "06600", "-600", "+600", "0x1b0"]
    {
        assert_eq!(parse_socket_mode(s), Err(CliError::SocketMode(s.into())), "{s}");
    }
    assert_eq!(parse(&["--hfi1", "/a", "--socket-mode", "0660"]).unwrap().socket_mode, Some(0o660));
    assert!(parse(&["--hfi1", "/a", "--socket-mode", "0644x"]).is_err());
}

#[test]
fn parse_fd_and_rcvarray_entries_check_their_ranges() {
    assert_eq!(parse_fd("3"), Ok(3));
    assert_eq!(parse_fd("0"), Ok(0));
    for s in ["-1", "x", "", "99999999999"] {
        assert_eq!(parse_fd(s), Err(CliError::Fd(s.into())), "{s}");
    }
    for (s, n) in [("512", 512), ("2048", 2048), ("65536", 65536)] {
        assert_eq!(parse_rcvarray_entries(s), Ok(n));
    }
    for s in ["0", "8", "520", "65600", "66048", "-512", "lots"] {
        assert_eq!(parse_rcvarray_entries(s), Err(CliError::RcvArrayEntries(s.into())), "{s}");
    }
}

#[test]
fn per_device_sockets_serve_each_device_with_its_ids() {
    let s = served(&["--hfi1", "/tmp/h.sock", "--irdma", "/tmp/i.sock", "--irdma-ids", "1b36:1102"]).unwrap();
    assert_eq!(
        s,
        vec![
            Served {
                kind: DeviceKind::Hfi1,
                listen: Listen::Path("/tmp/h.sock".into()),
                ids: PciIds::hfi1_default(),
                instance: 0
            },
            Served {
                kind: DeviceKind::Irdma,
                listen: Listen::Path("/tmp/i.sock".into()),
                ids: PciIds { device_id: 0x1102, ..PciIds::irdma_default() },
                instance: 0,
            },
        ]
    );
}

#[test]
fn backend_convention_serves_one_device_on_a_path_or_an_fd() {
    assert_eq!(
        served(&["--socket-path", "/tmp/x.sock", "--device", "irdma"]).unwrap(),
        vec![Served {
            kind: DeviceKind::Irdma,
            listen: Listen::Path("/tmp/x.sock".into()),
            ids: PciIds::irdma_default(),
            instance: 0,
        }]
    );
    let s = served(&["--fd", "3", "--device", "hfi1", "--hfi1-ids", "8086:24f0"]).unwrap();
    assert_eq!(s[0].listen, Listen::Fd(3));
    assert_eq!((s[0].ids.vendor_id, s[0].ids.device_id, s[0].ids.subsystem_vendor_id), (0x8086, 0x24f0, 0x8086));
    assert_eq!(s[0].ids.class_code, 0x020800);
}

#[test]
fn two_chip_personality_functions_are_served_with_their_own_names() {
    let s = served(&["--hfi1-wfr", "/tmp/a.sock", "--hfi1-wfr", "/tmp/b.sock", "--fault", "hfi1-wfr1:packet-drop"])
        .unwrap();
    let got: Vec<_> = s.iter().map(|s| (s.kind, s.name(), s.instance, s.ids)).collect();
    assert_eq!(
        got,
        vec![
            (DeviceKind::Hfi1Wfr, "hfi1-wfr", 0, PciIds::hfi1_wfr_default()),
            (DeviceKind::Hfi1Wfr, "hfi1-wfr1", 1, PciIds::hfi1_wfr_default()),
        ]
    );
}

#[test]
fn inconsistent_command_lines_are_refused() {
    let cases: Vec<(&[&str], CliError)> = vec![
        (&[], CliError::NothingToServe),
        (&["--control", "/tmp/c"], CliError::NothingToServe),
        (&["--socket-path", "/tmp/x"], CliError::DeviceMissing),
        (&["--fd", "3"], CliError::DeviceMissing),
        (&["--hfi1", "/tmp/x", "--device", "hfi1"], CliError::DeviceWithoutSocket),
        (&["--hfi1", "/tmp/x", "--irdma", "/tmp/x"], CliError::PathReused("/tmp/x".into())),
        (&["--hfi1", "/tmp/x", "--control", "/tmp/x"], CliError::PathReused("/tmp/x".into())),
        (&["--hfi1-wfr", "/tmp/a", "--hfi1-wfr", "/tmp/a"], CliError::PathReused("/tmp/a".into())),
        (&["--hfi1-wfr", "/a", "--hfi1-wfr", "/b", "--hfi1-wfr", "/c"], CliError::TooManyWfr(3)),
        (&["--hfi1-wfr", "/a", "--capture", "/tmp/c.pcap"], CliError::NeedsCable("--capture")),
        (&["--hfi1-wfr", "/a", "--link-training-ms", "5"], CliError::NeedsCable("--link-training-ms")),
        (
            &["--hfi1-wfr", "/tmp/a", "--fault", "hfi1-wfr1:packet-drop"],
            CliError::Fault {
                spec: "hfi1-wfr1:packet-drop,nth=1,count=1".into(),
                why: "hfi1-wfr1 is not served".into(),
            },
        ),
        (
            &["--irdma", "/tmp/i", "--hfi1-contexts", "4"],
            CliError::OptionForAbsentDevice { option: "--hfi1-contexts", device: "hfi1" },
        ),
        (
            &["--hfi1", "/tmp/h", "--irdma-qhash-capacity", "4"],
            CliError::OptionForAbsentDevice { option: "--irdma-qhash-capacity", device: "irdma" },
        ),
        (
            &["--socket-path", "/tmp/s", "--device", "hfi1", "--irdma-ids", "1b36:1101"],
            CliError::OptionForAbsentDevice { option: "--irdma-ids", device: "irdma" },
        ),
    ];
    for (args, e) in cases {
        assert_eq!(served(args), Err(e), "{args:?}");
    }
}

#[test]
fn clap_rejects_conflicts_and_out_of_range_values() {
    use clap::error::ErrorKind;
    let cases: &[(&[&str], ErrorKind)] = &[
        (&["--socket-path", "/a", "--fd", "3", "--device", "hfi1"], ErrorKind::ArgumentConflict),
        (&["--socket-path", "/a", "--hfi1", "/b", "--device", "hfi1"], ErrorKind::ArgumentConflict),
        (&["--fd", "3", "--irdma", "/b", "--device", "irdma"], ErrorKind::ArgumentConflict),
        (&["--hfi1", "/a", "--hfi1-contexts", "0"], ErrorKind::ValueValidation),
        (&["--hfi1", "/a", "--hfi1-contexts", "161"], ErrorKind::ValueValidation),
        (&["--irdma", "/a", "--irdma-qhash-capacity", "65537"], ErrorKind::ValueValidation),
        (&["--hfi1", "/a", "--hfi1-ids", "zz:1"], ErrorKind::ValueValidation),
        (&["--hfi1", "/a", "--hfi1-rcvarray-entries", "10"], ErrorKind::ValueValidation),
        (&["--socket-path", "/a", "--device", "ice"], ErrorKind::InvalidValue),
        (&["--hfi1", "/a", "--log-level", "loud"], ErrorKind::InvalidValue),
        (&["--fd=-3", "--device", "hfi1"], ErrorKind::ValueValidation),
    ];
    for (args, kind) in cases {
        assert_eq!(parse(args).unwrap_err().kind(), *kind, "{args:?}");
    }
}

#[test]
fn options_reach_args_with_defaults() {
    let a = parse(&[
        "--hfi1",
        "/tmp/h",
        "--hfi1-contexts",
        "16",
        "--hfi1-rcvarray-entries",
        "4096",
        "--once",
        "--log-level",
        "debug",
    ])
    .unwrap();
    assert_eq!((a.hfi1_contexts, a.hfi1_rcvarray_entries, a.once), (Some(16), Some(4096), true));
    assert_eq!(a.log_level.level(), tracing::Level::DEBUG);
    let d = parse(&["--irdma", "/tmp/i"]).unwrap();
    assert_eq!((d.log_level, d.once, d.irdma_qhash_capacity, d.control), (LogLevel::Info, false, None, None));
}

#[test]
fn long_help_documents_every_option_and_examples() {
    Args::command().debug_assert();
    let help = Args::command().render_long_help().to_string();
    for needle in [
        "--hfi1 <PATH>",
        "--irdma <PATH>",
        "--socket-path <PATH>",
        "--fd <FD>",
        "--device <DEVICE>",
        "--control <PATH>",
        "--hfi1-ids <VENDOR:DEVICE>",
        "--irdma-ids <VENDOR:DEVICE>",
        "--hfi1-contexts <N>",
        "--hfi1-rcvarray-entries <N>",
        "--irdma-qhash-capacity <N>",
        "--worker-spin-us <US>",
        "--busy-poll-us <US>",
        "--low-latency",
        "--write-multiple",
        "--once",
        "--log-level <LEVEL>",
        "Examples:",
        "vfio-user-pci",
        "1b36:1100",
        "--trace <FILTER>",
        "--trace-file <PATH>",
        "--trace-format <FORMAT>",
        "--fault <SPEC>",
        "--record <DIR>",
        "replay",
        "seeds",
    ] {
        assert!(help.contains(needle), "--help lacks {needle}");
    }
    // Every trace block and every fault is listed, from their definitions.
    for b in crate::trace::Block::ALL {
        assert!(help.contains(&format!("  {:<10} ", b.name())), "--help lacks block {}", b.name());
    }
    for k in FaultKind::ALL {
        assert!(help.contains(&format!("  {:<16} ", k.name())), "--help lacks fault {}", k.name());
    }
}

#[test]
fn trace_fault_and_record_options_are_checked_against_the_served_devices() {
    let a = parse(&[
        "--irdma",
        "/tmp/i",
        "--trace",
        "irdma::cqp=debug",
        "--fault",
        "irdma:cqe-drop,nth=2",
        "--record",
        "/tmp/r",
    ])
    .unwrap();
    assert_eq!(a.trace.as_ref().map(|f| f.to_string()), Some("irdma::cqp=debug".into()));
    assert_eq!(a.fault.len(), 1);
    assert_eq!(a.record, Some(PathBuf::from("/tmp/r")));
    assert!(a.served().is_ok());
    let refused = [
        (vec!["--hfi1", "/tmp/h", "--fault", "irdma:cqe-drop"], "irdma is not served"),
        (vec!["--hfi1", "/tmp/h", "--fault", "cqe-drop"], "name the device"),
        (vec!["--hfi1", "/tmp/h", "--fault", "hfi1:cqe-drop"], "does not apply"),
    ];
    for (args, why) in refused {
        let e = parse(&args).map(|a| a.served());
        match e {
            Ok(Err(CliError::Fault { why: w, .. })) => assert!(w.contains(why), "{args:?}: {w}"),
            // A fault the spec language refuses is clap's to report.
            Err(_) => assert!(why == "does not apply", "{args:?}"),
            other => panic!("{args:?}: {other:?}"),
        }
    }
    assert!(parse(&["--irdma", "/tmp/i", "--trace", "irdma::nosuch=debug"]).is_err());
    assert!(parse(&["--irdma", "/tmp/i", "--fault", "irdma:melt"]).is_err());
}

#[test]
fn replay_and_seeds_are_tools_that_take_files_and_no_serving_options() {
    let a = parse(&["replay", "a.vfurec", "dir", "--json"]).unwrap();
    assert_eq!(a.tool, Some(Tool::Replay { files: vec!["a.vfurec".into(), "dir".into()], json: true, trace: None }));
    let s = parse(&["seeds", "a.vfurec", "--out", "corpus", "--window", "10"]).unwrap();
    assert_eq!(s.tool, Some(Tool::Seeds { files: vec!["a.vfurec".into()], out: "corpus".into(), window: 10, max: 32 }));
    assert!(parse(&["replay"]).is_err(), "needs a file");
    assert!(parse(&["seeds", "a"]).is_err(), "needs --out");
    assert!(parse(&["--irdma", "/tmp/i", "replay", "a"]).is_err(), "serving options do not go with a tool");
}

#[test]
fn worker_spin_is_microseconds_from_zero_to_the_engine_limit() {
    let table: [(&str, Option<u64>); 5] =
        [("0", Some(0)), ("50", Some(50)), ("1000", Some(1000)), ("1001", None), ("-1", None)];
    for (given, want) in table {
        let got = parse(&["--hfi1", "/tmp/h", "--worker-spin-us", given]).ok().map(|a| a.worker_spin_us);
        assert_eq!(got, want.map(Some), "--worker-spin-us {given}");
    }
    assert_eq!(parse(&["--irdma", "/tmp/i"]).unwrap().worker_spin_us, None);
}

#[test]
fn the_session_record_limit_is_mib_from_one_to_a_tebibyte_and_unset_unless_given() {
    let table: [(&str, Option<u64>); 4] = [("0", None), ("1", Some(1)), ("1048576", Some(1 << 20)), ("1048577", None)];
    for (given, want) in table {
        let got = parse(&["--hfi1", "/tmp/h", "--record-max-mib", given]).ok().map(|a| a.record_max_mib);
        assert_eq!(got, want.map(Some), "--record-max-mib {given}");
    }
    assert_eq!(parse(&["--irdma", "/tmp/i"]).unwrap().record_max_mib, None);
}

#[test]
fn write_multiple_is_off_unless_given() {
    let cases: [(&[&str], bool); 2] =
        [(&["--hfi1", "/tmp/h"], false), (&["--hfi1", "/tmp/h", "--write-multiple"], true)];
    for (args, want) in cases {
        assert_eq!(parse(args).ok().map(|a| a.write_multiple), Some(want), "{args:?}");
    }
}

#[test]
fn busy_poll_is_microseconds_up_to_a_millisecond() {
    let table: [(&str, Option<u64>); 4] = [("0", Some(0)), ("50", Some(50)), ("1000", Some(1000)), ("1001", None)];
    for (given, want) in table {
        let got = parse(&["--hfi1", "/tmp/h", "--busy-poll-us", given]).ok().map(|a| a.busy_poll_us);
        assert_eq!(got, want.map(Some), "--busy-poll-us {given}");
    }
}

#[test]
fn nothing_spins_by_default_and_low_latency_turns_both_polls_on_unless_a_knob_says_otherwise() {
    // (arguments, busy-poll in us, worker spin in us: None leaves the engines' default, which sleeps at once)
    let table: [(&[&str], u64, Option<u64>); 6] = [
        (&[], 0, None),
        (&["--low-latency"], LOW_LATENCY_BUSY_POLL_US, Some(LOW_LATENCY_WORKER_SPIN_US)),
        (&["--low-latency", "--busy-poll-us", "0"], 0, Some(LOW_LATENCY_WORKER_SPIN_US)),
        (&["--low-latency", "--worker-spin-us", "0"], LOW_LATENCY_BUSY_POLL_US, Some(0)),
        (&["--busy-poll-us", "20"], 20, None),
        (&["--worker-spin-us", "10"], 0, Some(10)),
    ];
    for (extra, poll_us, spin_us) in table {
        let args = parse(&[&["--hfi1", "/tmp/h"], extra].concat()).unwrap();
        assert_eq!(args.busy_poll(), Duration::from_micros(poll_us), "{extra:?}");
        assert_eq!(args.worker_spin_us(), spin_us, "{extra:?}");
    }
    assert_eq!(crate::worker::WorkerMode::default(), crate::worker::WorkerMode::Thread { spin: Duration::ZERO });
    assert_eq!(LOW_LATENCY_BUSY_POLL_US, 50);
    assert_eq!(LOW_LATENCY_WORKER_SPIN_US, 50);
}
