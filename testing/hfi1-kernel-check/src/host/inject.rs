//! One round of traffic: every planned KDETH expected-receive packet of the round's buffers, then packets
//! that must be dropped (wrong TID, context, generation), then one good packet again; and what the device
//! model's counters and flow must show afterwards.

use std::collections::BTreeMap;

use super::control::{ControlClient, ControlError, InjectPacket};
use super::dump::{Context, Dump};
use crate::abi::{FlowEntry, GENERATION_MASK, HFI1_KDETH_BTH_SEQ_MASK, KDETH_TID_MASK};
use crate::pattern::{self, POISON_SALT};
use crate::plan::plan_buffer;
use crate::proto::{BufferReport, Hello, NegativeReport};

/// Placement failures listed one by one (all are counted).
const MAX_LISTED: usize = 10;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundInjection {
    pub packets: u32,
    pub placed: u32,
    pub payload_bytes: u64,
    pub negatives: Vec<NegativeReport>,
    pub errors: Vec<String>,
}

fn next_sequence(seq: u32) -> u32 {
    (seq + 1) & HFI1_KDETH_BTH_SEQ_MASK
}

/// The counter each dropped result raises.
fn counter_of(result: &str) -> &'static str {
    match result {
        "gen_mismatch" => "rx_gen_mismatch",
        "bad_context" => "rx_bad_context",
        "context_disabled" => "rx_context_disabled",
        "tid_invalid_entry" => "rx_tid_invalid_entry",
        "tid_out_of_range" => "rx_tid_out_of_range",
        _ => "rx_placed",
    }
}

/// Sends the round's traffic for `buffers` (those whose entries passed the registration check). `before`
/// is the dump taken after TID_UPDATE.
pub fn inject_round(
    ctl: &mut ControlClient,
    hello: &Hello,
    before: &Dump,
    buffers: &[&BufferReport],
) -> Result<RoundInjection, ControlError> {
    let mut inj = RoundInjection::default();
    let ours = u32::from(hello.info.ctxt);
    let Some(ctx) = before.context(ours) else {
        inj.errors.push(format!("context {ours} is not in the dump"));
        return Ok(inj);
    };
    let flow = FlowEntry::decode(ctx.flow(hello.flow));
    if !flow.flow_valid || flow.generation != hello.generation {
        inj.errors.push(format!(
            "flow {} of context {ours} is {flow:?}, not valid with generation {:#x}: nothing can be placed",
            hello.flow, hello.generation
        ));
        return Ok(inj);
    }
    let mut seq = flow.sequence;
    let mut failures = 0usize;
    let mut first: Option<(u32, u64, InjectPacket)> = None;
    for b in buffers {
        let plan = match plan_buffer(&b.tidlist, hello.mtu) {
            Ok(p) => p,
            Err(e) => {
                inj.errors.push(format!("buffer {}: {e}", b.id));
                continue;
            }
        };
        for p in plan {
            let pkt = InjectPacket {
                ctxt: ours,
                flow: hello.flow,
                tid: p.tid,
                tidctrl: p.tidctrl,
                offset: p.offset,
                om: p.om,
                generation: hello.generation,
                sequence: seq,
                payload: pattern::bytes(hello.seed, b.id, p.buffer_offset, p.len as usize),
            };
            let result = ctl.inject(&pkt)?;
            inj.packets += 1;
            inj.payload_bytes += u64::from(p.len);
            if result == "placed" {
                inj.placed += 1;
                seq = next_sequence(seq);
                first.get_or_insert((b.id, p.buffer_offset, pkt));
                continue;
            }
            failures += 1;
            if failures <= MAX_LISTED {
                inj.errors.push(format!(
                    "buffer {} offset {:#x} (TID {} CTRL {}, entry offset {:#x}, {} bytes): {result}",
                    b.id, p.buffer_offset, p.tid, p.tidctrl, p.entry_offset, p.len
                ));
            }
            // The device decides whether a failed packet consumed its sequence: ask it.
            seq = ctl.dump()?.context(ours).map_or(seq, |c| FlowEntry::decode(c.flow(hello.flow)).sequence);
        }
    }
    if failures > MAX_LISTED {
        inj.errors.push(format!("… {} more packets not placed", failures - MAX_LISTED));
    }
    let Some((buffer, buffer_offset, good)) = first else {
        inj.errors.push("no packet was placed, so no packet could be aimed to be dropped".into());
        return Ok(inj);
    };

    // Each carries other data for the same place: had one been placed, the guest would see it.
    let poison = InjectPacket {
        sequence: seq,
        payload: pattern::bytes(hello.seed ^ POISON_SALT, buffer, buffer_offset, good.payload.len()),
        ..good.clone()
    };
    let mut negatives = vec![(
        "wrong_generation",
        "gen_mismatch",
        InjectPacket { generation: (hello.generation + 1) & GENERATION_MASK, ..poison.clone() },
    )];
    if let Some(&n) = before.global.get("RCV_CONTEXTS").filter(|&&n| n <= 0xFF) {
        negatives.push(("wrong_context_absent", "bad_context", InjectPacket { ctxt: n as u32, ..poison.clone() }));
    }
    // Only a disabled context: an enabled one (a kernel context) would take the data into kernel buffers.
    if let Some(c) = before.contexts.iter().find(|c| c.ctxt != ours && !c.enabled()) {
        negatives.push(("wrong_context_disabled", "context_disabled", InjectPacket { ctxt: c.ctxt, ..poison.clone() }));
    }
    let at_entry = |rel: u64| InjectPacket {
        tid: (rel / 2) as u32,
        tidctrl: (rel % 2) as u32 + 1,
        offset: 0,
        om: false,
        ..poison.clone()
    };
    if let Some(rel) = (0..ctx.tid_count).find(|r| !before.entries.contains_key(&(ctx.tid_base + r))) {
        negatives.push(("wrong_tid_invalid_entry", "tid_invalid_entry", at_entry(rel)));
    }
    // A pair just past the range, if the 10-bit TID field can name it.
    if ctx.tid_count / 2 <= u64::from(KDETH_TID_MASK) {
        negatives.push(("wrong_tid_out_of_range", "tid_out_of_range", at_entry(ctx.tid_count)));
    }
    let mut expected_rise: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (kind, expected, pkt) in negatives {
        let result = ctl.inject(&pkt)?;
        let ok = result == expected;
        if !ok {
            inj.errors.push(format!("{kind}: the device answered {result}, {expected} expected"));
        }
        *expected_rise.entry(counter_of(expected)).or_default() += 1;
        inj.negatives.push(NegativeReport { kind: kind.into(), expected: expected.into(), result, ok });
    }

    // The flow still takes its next packet (both keep bits are set): the first packet again, same data.
    let again = ctl.inject(&InjectPacket { sequence: seq, ..good })?;
    inj.packets += 1;
    if again == "placed" {
        inj.placed += 1;
        seq = next_sequence(seq);
    } else {
        inj.errors.push(format!("after the dropped packets, a good packet came back {again}"));
    }
    *expected_rise.entry("rx_placed").or_default() += u64::from(inj.placed);

    let after = ctl.dump()?;
    let sent = u64::from(inj.packets) + inj.negatives.len() as u64;
    expected_rise.insert("rx_packets", sent);
    for (name, want) in expected_rise {
        let rise = after.counter(name).wrapping_sub(before.counter(name));
        if rise != want {
            inj.errors.push(format!("counter {name} rose by {rise} during the round, {want} expected"));
        }
    }
    check_flow_after(&mut inj, &after, ours, hello, seq);
    Ok(inj)
}

fn check_flow_after(inj: &mut RoundInjection, after: &Dump, ours: u32, hello: &Hello, seq: u32) {
    let Some(ctx): Option<&Context> = after.context(ours) else {
        inj.errors.push(format!("context {ours} vanished from the dump"));
        return;
    };
    let f = FlowEntry::decode(ctx.flow(hello.flow));
    let gen_dropped = inj.negatives.iter().any(|n| n.kind == "wrong_generation");
    if !f.flow_valid || f.generation != hello.generation || f.sequence != seq || (gen_dropped && !f.gen_mismatch) {
        inj.errors.push(format!(
            "flow {} after the round is {f:?}: valid, generation {:#x}, next sequence {seq}{} expected",
            hello.flow,
            hello.generation,
            if gen_dropped { " and GEN_MISMATCH set" } else { "" }
        ));
    }
}
