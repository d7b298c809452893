use super::*;

fn spec(s: &str) -> FaultSpec {
    FaultSpec::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn specs_parse_with_their_defaults_and_print_back_the_same_fault() {
    let table = [
        (
            "irdma:cqp-fail,op=manage-qhash,major=0x8002,minor=1,nth=2",
            "irdma:cqp-fail,op=0x25,major=0x8002,minor=0x1,nth=2,count=1",
        ),
        ("cqe-delay,ms=250", "cqe-delay,ms=250,nth=1,count=1"),
        ("irdma:cqe-drop", "irdma:cqe-drop,nth=1,count=1"),
        ("irdma:cqe-corrupt,field=wqe-idx,xor=0x3", "irdma:cqe-corrupt,field=wqe-idx,xor=0x3,nth=1,count=1"),
        ("irdma:cqptail-stall,nth=3", "irdma:cqptail-stall,nth=3,count=forever"),
        ("hfi1:rcvarray-ignore,index=5,count=2", "hfi1:rcvarray-ignore,index=5,nth=1,count=2"),
        ("hfi1:flow-generation,ctxt=1,flow=0", "hfi1:flow-generation,ctxt=1,flow=0,add=1,nth=1,count=1"),
        ("hfi1:packet-reorder,nth=2", "hfi1:packet-reorder,nth=2,count=1"),
        (
            "hfi1-wfr:reg-stuck,reg=SEND_DMA_STATUS[engine 0],mask=0x0200000000000000",
            "hfi1-wfr:reg-stuck,reg=SEND_DMA_STATUS[engine 0],mask=0x200000000000000,value=0x0,nth=1,count=forever",
        ),
        (
            "irdma:reg-stuck,offset=0x50a000,mask=1,value=0",
            "irdma:reg-stuck,bar=0,offset=0x50a000,mask=0x1,value=0x0,nth=1,count=forever",
        ),
        ("irdma:removed,nth=10", "irdma:removed,nth=10,count=forever"),
        ("hfi1:msix-drop,vector=0,prob=0.5,seed=7", "hfi1:msix-drop,vector=0,nth=1,count=forever,prob=0.5,seed=7"),
        ("irdma:dma-map-refuse,errno=EFAULT,nth=3", "irdma:dma-map-refuse,errno=14,nth=3,count=1"),
        ("hfi1:dma-write-fail,count=forever", "hfi1:dma-write-fail,nth=1,count=forever"),
    ];
    for (text, shown) in table {
        let s = spec(text);
        assert_eq!(s.to_string(), shown, "{text}");
        assert_eq!(spec(shown), s, "{shown} parses to the same fault");
    }
}

/// Whether an error is of the expected variant.
type IsVariant = fn(&SpecError) -> bool;

#[test]
fn bad_specs_say_what_is_wrong() {
    let table: [(&str, IsVariant); 10] = [
        ("", |e| matches!(e, SpecError::Empty)),
        ("irdma:melt", |e| matches!(e, SpecError::Unknown(_))),
        ("irdma:cqe-drop,nth", |e| matches!(e, SpecError::Item { .. })),
        ("irdma:cqe-drop,ms=4", |e| matches!(e, SpecError::Key { .. })),
        ("irdma:cqe-drop,nth=0", |e| matches!(e, SpecError::Value { .. })),
        ("irdma:cqe-delay,ms=600000", |e| matches!(e, SpecError::Value { .. })),
        ("irdma:cqp-fail,op=0x25,major=1", |e| matches!(e, SpecError::Missing { key: "minor", .. })),
        ("irdma:cqe-corrupt", |e| matches!(e, SpecError::Missing { key: "field", .. })),
        ("irdma:reg-stuck,offset=0x0", |e| matches!(e, SpecError::Missing { key: "mask", .. })),
        ("irdma:msix-drop,prob=2", |e| matches!(e, SpecError::Value { .. })),
    ];
    for (text, ok) in table {
        let e = FaultSpec::parse(text).err().unwrap_or_else(|| panic!("{text} parsed"));
        assert!(ok(&e), "{text}: {e}");
    }
}

/// Parsing leaves the device's name to the caller; the caller states the kind of the device it arms on.
#[test]
fn a_fault_applies_only_to_the_device_kinds_it_is_for() {
    let table = [
        ("hfi1:cqe-drop", "hfi1", false),
        ("irdma:cqe-drop", "irdma", true),
        ("hfi1:cable-drop", "hfi1", false),
        ("hfi1-wfr1:cable-drop", "hfi1-wfr", true),
        ("hfi1-wfr1:packet-drop", "hfi1-wfr", true),
        ("irdma:packet-drop", "irdma", false),
        ("irdma:reg-stuck,offset=0x0,mask=0x1", "irdma", true),
    ];
    for (text, kind, applies) in table {
        match spec(text).check_device(kind) {
            Ok(()) => assert!(applies, "{text} armed on a {kind}"),
            Err(e) => assert!(!applies && matches!(e, SpecError::Device { .. }), "{text} on a {kind}: {e}"),
        }
    }
}

#[test]
fn a_fault_fires_on_the_nth_matching_event_for_count_events() {
    let f = Faults::default();
    assert!(!f.armed(FaultKind::CqeDrop));
    f.arm(spec("irdma:cqe-drop,nth=3,count=2"));
    let fired: Vec<bool> = (0..6).map(|_| f.hit(FaultKind::CqeDrop, |_| true).is_some()).collect();
    assert_eq!(fired, [false, false, true, true, false, false]);
    assert!(!f.armed(FaultKind::CqeDrop), "spent faults cost nothing at the hook points");
    f.restart();
    assert!(f.armed(FaultKind::CqeDrop), "a new session counts again");
    let events: Vec<u64> = (0..6).filter_map(|_| f.hit(FaultKind::CqeDrop, |_| true)).map(|h| h.event).collect();
    assert_eq!(events, [3, 4]);
}

#[test]
fn only_events_matching_the_parameters_count() {
    let f = Faults::default();
    f.arm(spec("irdma:cqp-fail,op=nop,major=0x8001,minor=1,nth=2"));
    let nop = |p: &Params| p.op == Some(0x24);
    let qhash = |p: &Params| p.op == Some(0x25);
    assert!(f.hit(FaultKind::CqpFail, nop).is_none());
    assert!(f.hit(FaultKind::CqpFail, qhash).is_none());
    assert!(f.hit(FaultKind::CqpFail, qhash).is_none());
    let h = f.hit(FaultKind::CqpFail, nop).unwrap();
    assert_eq!((h.params.major, h.params.minor, h.event), (0x8001, 1, 2));
}

#[test]
fn a_seeded_probability_fires_the_same_events_every_time_and_about_as_often_as_asked() {
    let run = |seed: u64| {
        let f = Faults::default();
        f.arm(spec(&format!("hfi1:packet-drop,prob=0.25,seed={seed}")));
        (0..4000).map(|_| f.hit(FaultKind::PacketDrop, |_| true).is_some()).collect::<Vec<_>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    let n = run(42).iter().filter(|b| **b).count();
    assert!((800..1200).contains(&n), "{n} of 4000 at p = 0.25");
}

#[test]
fn faults_are_listed_with_their_counts_and_removed_by_id() {
    let f = Faults::default();
    let a = f.arm(spec("irdma:cqe-drop"));
    let b = f.arm(spec("irdma:msix-drop,count=forever"));
    f.hit(FaultKind::CqeDrop, |_| true);
    let l = f.list();
    assert_eq!(l[0]["id"], a);
    assert_eq!(
        (l[0]["seen"].as_u64(), l[0]["fired"].as_u64(), l[0]["spent"].as_bool()),
        (Some(1), Some(1), Some(true))
    );
    assert!(f.remove(b));
    assert!(!f.remove(b));
    assert!(!f.armed(FaultKind::MsixDrop));
    f.clear();
    assert_eq!(f.list(), serde_json::json!([]));
}

#[test]
fn each_kinds_discriminant_is_its_index_in_all() {
    for (i, k) in FaultKind::ALL.iter().enumerate() {
        assert_eq!(*k as usize, i, "{k:?}");
    }
}

#[test]
fn splitmix64_matches_its_reference_sequence() {
    // splitmix64 seeded with 0: the first outputs of the reference implementation (Vigna).
    let mut s = 0u64;
    assert_eq!(next_random(&mut s), 0xe220_a839_7b1d_cdaf);
    assert_eq!(next_random(&mut s), 0x6e78_9e6a_a1b9_65f4);
}

/// The hostile chip's faults: each edits one word the driver reads from host memory or HOST_CMD_1. A value
/// without a mask replaces the word; `rhf` names its fields by mask (common.h RHF_*_SMASK).
#[test]
fn the_hostile_chips_word_edits_parse_with_their_defaults_and_print_back_the_same_fault() {
    let table = [
        // RHF EgrIndex (common.h RHF_EGR_INDEX_SMASK: 0x7ff << 16) set to 0x7ff on context 1's 3rd entry.
        (
            "hfi1-wfr:rhf,ctxt=1,mask=0x7ff0000,value=0x7ff0000,nth=3",
            "hfi1-wfr:rhf,ctxt=1,mask=0x7ff0000,value=0x7ff0000,nth=3,count=1",
        ),
        // RHF_ICRC_ERR (bit 63) flipped on every entry.
        ("rhf,xor=0x8000000000000000,count=forever", "rhf,xor=0x8000000000000000,nth=1,count=forever"),
        ("rcvhdrtail-wb,ctxt=0,value=5", "rcvhdrtail-wb,ctxt=0,mask=0xffffffffffffffff,value=0x5,nth=1,count=1"),
        ("sdma-head-wb,engine=15,xor=0x1", "sdma-head-wb,engine=15,xor=0x1,nth=1,count=1"),
        (
            "credit-return,ctxt=159,mask=0x7ff,value=0,xor=0x4000",
            "credit-return,ctxt=159,mask=0x7ff,value=0x0,xor=0x4000,nth=1,count=1",
        ),
        // HOST_CMD_1 RETURN_CODE (bits 15:8) to something other than HCMD_SUCCESS (2).
        (
            "dc8051-reply,cmd=read-config-data,mask=0xff00,value=0x300",
            "dc8051-reply,cmd=0x2,mask=0xff00,value=0x300,nth=1,count=1",
        ),
        ("dc8051-reply,cmd=0xff,xor=1", "dc8051-reply,cmd=0xff,xor=0x1,nth=1,count=1"),
        ("reg-stuck,reg=CCE_ERR_STATUS,xor=0x4", "reg-stuck,reg=CCE_ERR_STATUS,xor=0x4,nth=1,count=forever"),
        (
            "reg-stuck,offset=0x10,mask=0xf,value=0x3,xor=0x100",
            "reg-stuck,bar=0,offset=0x10,mask=0xf,value=0x3,xor=0x100,nth=1,count=forever",
        ),
    ];
    for (text, shown) in table {
        let s = spec(text);
        assert_eq!(s.to_string(), shown, "{text}");
        assert_eq!(spec(shown), s, "{shown} parses to the same fault");
    }
}

#[test]
fn bad_word_edits_say_what_is_wrong() {
    let table: [(&str, IsVariant); 11] = [
        ("rhf", |e| matches!(e, SpecError::Missing { key: "value, mask or xor", .. })),
        ("rhf,ctxt=1,mask=0", |e| matches!(e, SpecError::Missing { .. })),
        ("rhf,mask=0xff,value=0x100", |e| matches!(e, SpecError::Value { .. })),
        ("rhf,engine=0,xor=1", |e| matches!(e, SpecError::Key { .. })),
        ("rhf,ctxt=256,xor=1", |e| matches!(e, SpecError::Value { .. })),
        ("rcvhdrtail-wb,cmd=1,xor=1", |e| matches!(e, SpecError::Key { .. })),
        // chip.h TXE_NUM_SDMA_ENGINES: 16.
        ("sdma-head-wb,engine=16,xor=1", |e| matches!(e, SpecError::Value { .. })),
        ("sdma-head-wb,ctxt=0,xor=1", |e| matches!(e, SpecError::Key { .. })),
        ("credit-return,value=0x1_0000_0000_0000_0000", |e| matches!(e, SpecError::Value { .. })),
        ("dc8051-reply,cmd=reboot,xor=1", |e| matches!(e, SpecError::Value { .. })),
        ("reg-stuck,offset=0x0,value=1", |e| matches!(e, SpecError::Missing { key: "mask", .. })),
    ];
    for (text, ok) in table {
        let e = FaultSpec::parse(text).err().unwrap_or_else(|| panic!("{text} parsed"));
        assert!(ok(&e), "{text}: {e}");
    }
}

#[test]
fn the_hostile_chips_faults_apply_only_to_the_chip_personality() {
    for name in ["rhf", "rcvhdrtail-wb", "sdma-head-wb", "credit-return", "dc8051-reply"] {
        let s = spec(&format!("{name},xor=1"));
        assert_eq!(s.check_device("hfi1-wfr"), Ok(()), "{name}");
        for other in ["hfi1", "irdma"] {
            assert!(matches!(s.check_device(other), Err(SpecError::Device { .. })), "{name} on {other}");
        }
    }
}

#[test]
fn a_word_edit_sets_the_masked_bits_to_value_then_xors() {
    // (mask, value, xor, word, edited)
    let table: [(u64, u64, u64, u64, u64); 5] = [
        (0, 0, 0x8000_0000_0000_0000, 0x1234, 0x8000_0000_0000_1234),
        (0xF000_0000, 0x5000_0000, 0, 0x1234_5678, 0x5234_5678),
        (u64::MAX, 7, 0, 0xdead_beef, 7),
        (0xFF, 0, 0x1, 0xabcd, 0xab01),
        (0x7FF, 0x7FF, 0x7FF, 0x1001, 0x1000),
    ];
    for (mask, value, xor, word, edited) in table {
        let p = Params { mask, value, xor, ..Params::default() };
        assert_eq!(p.edit(word), edited, "mask {mask:#x} value {value:#x} xor {xor:#x} on {word:#x}");
    }
}
