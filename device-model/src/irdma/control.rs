//! The irdma engine's control-socket side: the JSON dump of its state and the `classify` command.

#![forbid(unsafe_code)]

use serde_json::{json, Value};

use super::classify::{classify as classify_segment, Segment, SegmentJson};
use super::shared::Shared;

/// The engine's whole state, for the control socket's `dump`.
pub(super) fn dump(shared: &Shared) -> Value {
    let st = shared.lock();
    let r = &st.regs;
    let hex = |v: u32| format!("{v:#010x}");
    json!({
        "engine": "irdma",
        "registers": {
            "CQPTAIL": hex(r.cqptail),
            "CQPDB": hex(r.cqpdb),
            "CCQPSTATUS": hex(r.ccqpstatus),
            "CCQPHIGH": hex(r.ccqphigh),
            "CCQPLOW": hex(r.ccqplow),
            "CQPERRCODES": hex(r.cqperrcodes),
            "GLINT_CEQCTL": r.ceqctl.iter().map(|v| hex(*v)).collect::<Vec<_>>(),
            "EMU_LB_STATUS": hex(r.lb_status),
            "EMU_LB_RESULT": hex(r.lb_result),
            "EMU_LB_SEQ": r.lb_seq,
        },
        "cqp": st.cqp.map(|c| c.to_json(r.cqpdb)),
        "ccq": st.ccq.map(|c| c.to_json()),
        "qhash": {
            "capacity": st.qhash.capacity(),
            "len": st.qhash.len(),
            "entries": st.qhash.to_json(),
        },
        "last_results": st.results.to_json(),
        "counters": shared.counters.to_json(),
    })
}

/// `classify`: a segment from JSON against the quad-hash table, recorded in the result log.
pub(super) fn classify(shared: &Shared, request: &Value) -> Result<Value, String> {
    let seg = Segment::from_json(request)?;
    let target = {
        let mut st = shared.lock();
        let target = classify_segment(&st.qhash, &seg);
        st.results.record(seg, target, "control");
        target
    };
    shared.count_target(&target);
    Ok(target.to_json())
}
