//! The CQP worker's trace events and fault hooks (docs/observe.md): what a WQE did, what a CQE carried, what
//! a quad-hash operation changed, and the faults that fail an operation, delay, drop or corrupt its completion, or stall CQPTAIL.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::ccq::{
    IRDMA_CCQ_OPRETVAL, IRDMA_CQ_ERROR, IRDMA_CQ_MAJERR, IRDMA_CQ_MINERR, IRDMA_CQ_VALID, IRDMA_CQ_WQEIDX,
};
use super::qhash::ip_to_string;
use super::shared::Shared;
use super::wqe::{
    Manage, QhashOp, IRDMA_CQP_OP_CREATE_CQ, IRDMA_CQP_OP_DESTROY_CQ, IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY,
    IRDMA_CQP_OP_NOP,
};
use super::WqeError;
use crate::fault::{CqeField, FaultKind};
use crate::probe::Probe;
use crate::trace::{Block, Level, Val};

/// The longest slice a delayed completion sleeps before looking at reset and shutdown again.
const DELAY_SLICE: Duration = Duration::from_millis(5);

/// The kernel's name of a CQP opcode (IRDMA_CQP_OP_*).
pub fn opcode_name(op: u8) -> &'static str {
    match op {
        IRDMA_CQP_OP_CREATE_CQ => "CREATE_CQ",
        IRDMA_CQP_OP_DESTROY_CQ => "DESTROY_CQ",
        IRDMA_CQP_OP_NOP => "NOP",
        IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY => "MANAGE_QUAD_HASH_TABLE_ENTRY",
        _ => "unknown",
    }
}

/// `cqp-fail`: the error this WQE completes with instead of executing.
pub fn injected_failure(probe: &Probe, opcode: u8) -> Option<WqeError> {
    let f = probe.fault(FaultKind::CqpFail, |p| p.op == Some(opcode))?;
    Some(WqeError::Injected { major: f.params.major, minor: f.params.minor })
}

/// A WQE executed, at `info`: `irdma wqe idx=3 op=MANAGE_QUAD_HASH_TABLE_ENTRY result=ok`.
pub fn wqe(probe: &Probe, idx: u32, opcode: u8, outcome: &Result<u32, WqeError>) {
    if !probe.trace.on(Block::Cqp, Level::Info) {
        return;
    }
    let result = match outcome {
        Ok(_) => "ok".to_string(),
        Err(e) => {
            let (major, minor) = e.codes();
            format!("{major:#06x}/{minor:#06x} ({e})")
        }
    };
    let fields = [
        ("idx", Val::Dec(u64::from(idx))),
        ("op", Val::Str(opcode_name(opcode))),
        ("opcode", Val::Hex(u64::from(opcode))),
        ("result", Val::Owned(result)),
    ];
    probe.trace.emit(Block::Cqp, &crate::trace::Event { kind: "wqe", head: None, fields: &fields });
}

/// A quad-hash operation, at `info`: `irdma qhash manage=add type=IRDMA_QHASH_TYPE_TCP_SYN
/// dest=10.0.0.1:4791 src=0.0.0.0:0 vlan=none qpn=5 result=ok entries=1`.
pub fn qhash(probe: &Probe, op: &QhashOp, result: &Result<(), WqeError>, entries: usize) {
    if !probe.trace.on(Block::Qhash, Level::Info) {
        return;
    }
    let k = &op.key;
    let manage = match op.manage {
        Manage::Add => "add",
        Manage::Delete => "delete",
        Manage::Modify => "modify",
    };
    let result = match result {
        Ok(()) => "ok".to_string(),
        Err(e) => {
            let (major, minor) = e.codes();
            format!("{major:#06x}/{minor:#06x} ({e})")
        }
    };
    let fields = [
        ("manage", Val::Str(manage)),
        ("type", Val::Str(k.entry_type.name())),
        ("dest", Val::Owned(format!("{}:{}", ip_to_string(k.ipv4, &k.dest_ip), k.dest_port))),
        ("src", Val::Owned(format!("{}:{}", ip_to_string(k.ipv4, &k.src_ip), k.src_port))),
        ("vlan", k.vlan.map_or(Val::Str("none"), |v| Val::Dec(u64::from(v)))),
        ("qpn", Val::Dec(u64::from(op.data.qpn))),
        ("result", Val::Owned(result)),
        ("entries", Val::Dec(entries as u64)),
    ];
    probe.trace.emit(Block::Qhash, &crate::trace::Event { kind: "qhash", head: None, fields: &fields });
}

/// `cqe-delay`: waits the fault's delay before the completion is published, in slices, giving up at reset
/// or shutdown (the completion is then dropped by the epoch check, as any stale work is).
pub fn delay_completion(shared: &Shared, epoch: u64) {
    let Some(f) = shared.probe.fault(FaultKind::CqeDelay, |_| true) else { return };
    let until = Instant::now() + Duration::from_millis(f.params.ms);
    while Instant::now() < until {
        if shared.epoch.load(Relaxed) != epoch || shared.stop.load(Relaxed) {
            return;
        }
        std::thread::sleep(DELAY_SLICE.min(until.saturating_duration_since(Instant::now())));
    }
}

/// What happens to a CQE about to be written: `None` when `cqe-drop` fires, else the CQE, corrupted if
/// `cqe-corrupt` fires.
pub fn cqe(probe: &Probe, mut cqe: [u64; 4]) -> Option<[u64; 4]> {
    if probe.fault(FaultKind::CqeDrop, |_| true).is_some() {
        return None;
    }
    if let Some(f) = probe.fault(FaultKind::CqeCorrupt, |_| true) {
        let x = f.params.xor;
        let flip = |field: super::regs::Field, q: &mut u64| *q ^= field.put(x);
        match f.params.field {
            Some(CqeField::WqeIdx) => flip(IRDMA_CQ_WQEIDX, &mut cqe[3]),
            Some(CqeField::Major) => flip(IRDMA_CQ_MAJERR, &mut cqe[3]),
            Some(CqeField::Minor) => flip(IRDMA_CQ_MINERR, &mut cqe[3]),
            Some(CqeField::Error) => cqe[3] ^= IRDMA_CQ_ERROR.mask(),
            Some(CqeField::Valid) => cqe[3] ^= IRDMA_CQ_VALID.mask(),
            Some(CqeField::OpRet) => flip(IRDMA_CCQ_OPRETVAL, &mut cqe[2]),
            Some(CqeField::Ctx) | None => cqe[1] ^= x,
        }
    }
    Some(cqe)
}

/// A CQE written (or not), at `info`.
pub fn cqe_written(probe: &Probe, slot: u32, cqe: Option<&[u64; 4]>, dropped: bool) {
    if !probe.trace.on(Block::Ccq, Level::Info) {
        return;
    }
    let mut fields = vec![("slot", Val::Dec(u64::from(slot)))];
    match cqe {
        Some(q) => {
            fields.push(("wqe_idx", Val::Dec(IRDMA_CQ_WQEIDX.get(q[3]))));
            fields.push(("error", Val::Bool(IRDMA_CQ_ERROR.is_set(q[3]))));
            fields.push(("major", Val::Hex(IRDMA_CQ_MAJERR.get(q[3]))));
            fields.push(("minor", Val::Hex(IRDMA_CQ_MINERR.get(q[3]))));
            fields.push(("valid", Val::Bool(IRDMA_CQ_VALID.is_set(q[3]))));
            fields.push(("ctx", Val::Hex(q[1])));
        }
        None => fields.push(("result", Val::Str(if dropped { "dropped by fault" } else { "write failed" }))),
    }
    probe.trace.emit(Block::Ccq, &crate::trace::Event { kind: "cqe", head: None, fields: &fields });
}

/// `cqptail-stall`: whether this completion leaves CQPTAIL as it is.
pub fn tail_stalled(probe: &Probe) -> bool {
    probe.fault(FaultKind::CqptailStall, |_| true).is_some()
}
