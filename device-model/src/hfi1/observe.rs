//! The receive engine's trace events and packet faults (docs/observe.md): what became of each packet, and the
//! faults that lose, duplicate or reorder packets, or change a flow's generation behind the driver's back.

#![forbid(unsafe_code)]

use super::rxe::rcv::{Packet, RxResult};
use super::rxe::state::Rxe;
use crate::fault::{FaultKind, Params};
use crate::probe::Probe;
use crate::trace::{Block, Level, Val};

/// What the packet faults make of one packet on its way to the receive engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    Deliver,
    /// Never arrives.
    Drop,
    /// Arrives twice.
    Duplicate,
    /// Arrives after the next packet.
    Hold,
}

fn for_ctxt(pkt: &Packet) -> impl Fn(&Params) -> bool + '_ {
    move |p: &Params| p.ctxt.is_none_or(|c| c as usize == pkt.ctxt())
}

/// The packet faults in order: `packet-drop`, then `packet-dup`, then `packet-reorder`; a packet one of them
/// takes is no event for those after it.
pub(super) fn fate(probe: &Probe, pkt: &Packet) -> Fate {
    if probe.fault(FaultKind::PacketDrop, for_ctxt(pkt)).is_some() {
        Fate::Drop
    } else if probe.fault(FaultKind::PacketDup, for_ctxt(pkt)).is_some() {
        Fate::Duplicate
    } else if probe.fault(FaultKind::PacketReorder, for_ctxt(pkt)).is_some() {
        Fate::Hold
    } else {
        Fate::Deliver
    }
}

/// `flow-generation`, under the RXE lock just before the packet is judged.
pub(super) fn shift_generation(probe: &Probe, rxe: &mut Rxe, pkt: &Packet) {
    let (ctxt, flow) = (pkt.ctxt(), pkt.flow());
    let matches = |p: &Params| p.ctxt.is_none_or(|c| c as usize == ctxt) && p.flow.is_none_or(|f| f as usize == flow);
    if let Some(f) = probe.fault(FaultKind::FlowGeneration, matches) {
        if let Some(g) = rxe.flows.shift_generation(ctxt, flow, f.params.add) {
            probe.trace.event(
                Block::Flow,
                Level::Info,
                "generation-changed",
                &[("ctxt", Val::Dec(ctxt as u64)), ("flow", Val::Dec(flow as u64)), ("gen", Val::Hex(g.into()))],
            );
        }
    }
}

/// A packet's outcome, at `info`: `hfi1 packet source=loopback ctxt=2 flow=3 tid=4 psn=0x... len=8192 result=placed`.
pub(super) fn packet(probe: &Probe, source: &'static str, pkt: &Packet, len: u64, result: &str) {
    if !probe.trace.on(Block::Rcv, Level::Info) {
        return;
    }
    let fields = [
        ("source", Val::Str(source)),
        ("ctxt", Val::Dec(pkt.ctxt() as u64)),
        ("flow", Val::Dec(pkt.flow() as u64)),
        ("tid", Val::Dec(pkt.tid().into())),
        ("tidctrl", Val::Dec(pkt.tidctrl().into())),
        ("gen", Val::Hex(pkt.generation().into())),
        ("seq", Val::Dec(pkt.sequence().into())),
        ("offset", Val::Dec(pkt.offset_bytes())),
        ("len", Val::Dec(len)),
        ("result", Val::Str(result)),
    ];
    probe.trace.emit(Block::Rcv, &crate::trace::Event { kind: "packet", head: None, fields: &fields });
}

/// The name a result is traced and reported under.
pub(super) fn result_name(r: Option<RxResult>, fate: Fate) -> &'static str {
    match (r, fate) {
        (_, Fate::Drop) => "dropped",
        (_, Fate::Hold) => "held",
        (Some(r), _) => r.name(),
        (None, _) => "none",
    }
}

/// What a control-socket `inject` came to: its packet's result (none when dropped or held), and what the
/// packet faults did besides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectOutcome {
    pub result: Option<RxResult>,
    pub fault: Option<&'static str>,
    /// `packet-dup`: the first copy's result (`result` is the second's).
    pub first: Option<RxResult>,
    /// A packet held by `packet-reorder` at an earlier inject, delivered after this one.
    pub released: Option<RxResult>,
}

impl InjectOutcome {
    pub fn plain(result: RxResult) -> Self {
        InjectOutcome { result: Some(result), fault: None, first: None, released: None }
    }

    /// `{"result":"placed","code":0}`, plus `fault`, `first` and `released` when the faults acted.
    pub fn to_json(&self) -> serde_json::Value {
        let one = |r: RxResult| serde_json::json!({"result": r.name(), "code": r.code()});
        let mut v = match (self.result, self.fault) {
            (Some(r), _) => one(r),
            (None, Some("packet-drop")) => serde_json::json!({"result": "dropped", "code": null}),
            (None, _) => serde_json::json!({"result": "held", "code": null}),
        };
        if let Some(f) = self.fault {
            v["fault"] = f.into();
        }
        if let Some(r) = self.first {
            v["first"] = one(r);
        }
        if let Some(r) = self.released {
            v["released"] = one(r);
        }
        v
    }
}

/// A packet `packet-reorder` held back at an inject, until the next one.
pub(super) struct HeldInject {
    pub packet: Packet,
    pub payload: Vec<u8>,
    pub epoch: u64,
}
