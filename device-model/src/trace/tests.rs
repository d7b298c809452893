use super::*;

fn level_of(filter: &str, device: &str, block: Block) -> Level {
    Filter::parse(filter).unwrap().levels(device)[block as usize]
}

#[test]
fn the_most_specific_directive_decides_and_among_equals_the_last() {
    let table = [
        ("", "hfi1", Block::Flow, Level::Off),
        ("off", "hfi1", Block::Flow, Level::Off),
        ("debug", "irdma", Block::Cqp, Level::Debug),
        ("hfi1", "hfi1", Block::Flow, Level::Trace),
        ("hfi1", "hfi1-wfr", Block::Flow, Level::Off),
        ("hfi1::flow=debug", "hfi1", Block::Flow, Level::Debug),
        ("hfi1::flow=debug", "hfi1", Block::Rxe, Level::Off),
        ("hfi1=info,hfi1::flow=off", "hfi1", Block::Flow, Level::Off),
        ("hfi1::flow=off,hfi1=info", "hfi1", Block::Flow, Level::Off),
        ("hfi1=info,hfi1::flow=off", "hfi1", Block::Rcv, Level::Info),
        ("*::dma=trace,info", "irdma", Block::Dma, Level::Trace),
        ("*::dma=trace,irdma::dma=off", "irdma", Block::Dma, Level::Off),
        ("irdma=info,*::dma=trace", "irdma", Block::Dma, Level::Trace),
        ("warn,irdma=debug", "hfi1", Block::Rxe, Level::Warn),
        ("irdma=debug,irdma=info", "irdma", Block::Cqp, Level::Info),
        (" irdma::cqp = debug , trace ", "irdma", Block::Cqp, Level::Debug),
        ("IRDMA=DEBUG", "irdma", Block::Cqp, Level::Off),
    ];
    for (filter, device, block, want) in table {
        assert_eq!(level_of(filter, device, block), want, "{filter:?} for {device}::{}", block.name());
    }
}

#[test]
fn bad_directives_are_refused_with_what_is_wrong() {
    assert!(matches!(Filter::parse("hfi1=loud"), Err(FilterError::Level(_))));
    assert!(matches!(Filter::parse("hfi1::nosuch=debug"), Err(FilterError::Block { .. })));
    for bad in ["*=debug", "::flow=debug", "hfi 1=debug", "*"] {
        assert!(matches!(Filter::parse(bad), Err(FilterError::Target(_))), "{bad}");
    }
}

#[test]
fn every_block_name_parses_back_to_its_block() {
    for b in Block::ALL {
        assert_eq!(Block::parse(b.name()), Some(b));
        assert!(!b.doc().is_empty());
    }
}

#[test]
fn a_tracer_is_off_until_a_filter_turns_blocks_on() {
    let t = Tracer::new("irdma");
    let sink = Sink::memory();
    t.set_sink(sink.clone());
    assert!(!t.on(Block::Cqp, Level::Info));
    t.event(Block::Cqp, Level::Info, "doorbell", &[("head", Val::Dec(3))]);
    assert!(sink.take_lines().is_empty());
    t.set_filter(&Filter::parse("irdma::cqp=info").unwrap());
    assert!(t.on(Block::Cqp, Level::Info) && !t.on(Block::Cqp, Level::Debug) && !t.on(Block::Ccq, Level::Info));
    assert_eq!(t.enabled(), vec![(Block::Cqp, Level::Info)]);
    t.event(Block::Cqp, Level::Info, "doorbell", &[("head", Val::Dec(3)), ("tail", Val::Hex(0x10))]);
    let lines = sink.take_lines();
    assert_eq!(lines.len(), 1);
    assert!(lines[0].ends_with("] irdma doorbell head=3 tail=0x10"), "{}", lines[0]);
}

#[test]
fn a_register_access_reads_as_in_the_kernel_with_decoded_fields_in_text_and_json() {
    let t = Tracer::new("hfi1");
    let sink = Sink::memory();
    t.set_sink(sink.clone());
    t.set_filter(&Filter::parse("hfi1=debug").unwrap());
    let name = RegisterName {
        block: Block::Flow,
        name: Some("RCV_TID_FLOW_TABLE[ctxt 0][3]".into()),
        fields: "gen=0x1 FLOW_VALID".into(),
    };
    t.register(&name, true, 0, 0x1300818, 8, 0x6f00000800);
    sink.set_format(Format::Json);
    t.register(&name, false, 0, 0x1300818, 8, 0x0f00000800);
    let lines = sink.take_lines();
    assert!(
        lines[0].ends_with("] hfi1 W RCV_TID_FLOW_TABLE[ctxt 0][3] = 0x6f00000800 gen=0x1 FLOW_VALID"),
        "{}",
        lines[0]
    );
    let j: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
    assert_eq!(j["device"], "hfi1");
    assert_eq!(j["block"], "flow");
    assert_eq!(j["event"], "mmio");
    assert_eq!(j["op"], "R");
    assert_eq!(j["reg"], "RCV_TID_FLOW_TABLE[ctxt 0][3]");
    assert_eq!(j["offset"], "0x1300818");
    assert_eq!(j["value"], "0xf00000800");
    assert_eq!(j["seq"], 1);
}

#[test]
fn an_unnamed_offset_is_shown_by_bar_and_offset() {
    let t = Tracer::new("irdma");
    let sink = Sink::memory();
    t.set_sink(sink.clone());
    t.set_filter(&Filter::parse("debug").unwrap());
    t.register(&RegisterName::unnamed(), false, 0, 0x1234, 4, 0xffff_ffff);
    assert!(sink.take_lines()[0].ends_with("] irdma R BAR0+0x1234 = 0xffffffff"));
}

#[test]
fn a_memory_sink_keeps_its_newest_lines_up_to_its_bound_and_counts_the_rest() {
    let t = Tracer::new("irdma");
    let sink = Sink::memory();
    t.set_sink(sink.clone());
    t.set_filter(&Filter::parse("irdma::cqp=info").unwrap());
    let extra = 3;
    for head in 0..(super::sink::MEMORY_LINES + extra) as u64 {
        t.event(Block::Cqp, Level::Info, "doorbell", &[("head", Val::Dec(head))]);
    }
    assert_eq!(sink.dropped_lines(), extra as u64);
    let lines = sink.take_lines();
    assert_eq!(lines.len(), super::sink::MEMORY_LINES);
    assert!(lines[0].ends_with(&format!(" head={extra}")), "the oldest kept: {}", lines[0]);
}

#[test]
fn a_trace_file_stops_growing_at_its_bound_and_counts_the_lines_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.txt");
    // What an earlier run appended counts toward the bound.
    std::fs::write(&path, "x".repeat(99) + "\n").unwrap();
    let t = Tracer::new("irdma");
    let sink = Sink::memory();
    t.set_sink(sink.clone());
    t.set_filter(&Filter::parse("irdma::cqp=info").unwrap());
    sink.set_max_file_bytes(1000);
    sink.to_file(&path).unwrap();
    for head in 0..1000u64 {
        t.event(Block::Cqp, Level::Info, "doorbell", &[("head", Val::Dec(head))]);
    }
    let len = std::fs::metadata(&path).unwrap().len();
    let (bytes, over_cap) = sink.file_status();
    assert_eq!(bytes, len);
    assert!(len <= 1000 && len > 900, "filled up to its bound: {len}");
    let written = std::fs::read_to_string(&path).unwrap().lines().count() as u64 - 1;
    assert_eq!(over_cap, 1000 - written, "every line left out is counted");
    assert_eq!(sink.lines(), 1000);
}

#[test]
fn a_trace_file_is_refused_if_it_is_a_fifo_or_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(dir.path().join("elsewhere"), &link).unwrap();
    let sink = Sink::memory();
    for path in [fifo, link] {
        // Asked from a thread: opening a FIFO without a reader for writing blocks unless told not to.
        let (tx, rx) = crossbeam_channel::bounded(1);
        let (s, p) = (sink.clone(), path.clone());
        std::thread::spawn(move || tx.send(s.to_file(&p).is_err()));
        let refused = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("answered instead of blocking");
        assert!(refused, "{}", path.display());
    }
    assert_eq!(sink.destination(), "memory");
    assert!(!dir.path().join("elsewhere").exists());
}
