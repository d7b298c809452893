//! The chip personality's end of the cable: what the cable calls to bring news and packets to this HFI
//! (the [`Port`] seam, docs/hfi1-fabric.md "The cable"), and the one way jobs for the port reach the worker.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use vfio_user_proto::sync::Unpoison;

use super::batch::{Batch, Judged, Queued, CAUSE_PORT_QUEUE_FULL};
use super::ingress::INGRESS_QUEUE;
use super::worker::Job;
use crate::hfi1::cable::{LinkEvent, Neighbor, Port, WirePacket};
use crate::hfi1::shared::{Shared, WfrFront};
use crate::probe::Probe;
use crate::trace::{Block, Level, Val};
use crate::worker::WorkQueue;

/// The HFI's port number and node type as a neighbour reads them (one port per HFI; NEIGHBOR_TYPE_HFI 0).
pub const HFI_PORT: u8 = 1;
pub const NODE_TYPE_HFI: u8 = 0;

/// Queues `job` once while `pending` is set: a doorbell-style kick of the worker that never blocks. The
/// worker clears `pending` before it drains, so work queued after that gets a kick of its own.
pub(in crate::hfi1) fn kick(worker: &WorkQueue<Job>, shared: &Shared, pending: &AtomicBool, job: Job) {
    if pending.swap(true, Ordering::AcqRel) {
        return;
    }
    if !worker.try_submit(shared.epoch(), job) {
        pending.store(false, Ordering::Release);
        return;
    }
    worker.run_queued();
}

pub(in crate::hfi1) struct HfiPort {
    pub(in crate::hfi1) shared: Arc<Shared>,
    /// The chip's state beside the RXE (the port is the chip personality's).
    pub(in crate::hfi1) front: Arc<WfrFront>,
    /// The engine's worker; gone once the engine is.
    pub(in crate::hfi1) worker: Weak<WorkQueue<Job>>,
    pub(in crate::hfi1) guid: u64,
}

impl HfiPort {
    pub(in crate::hfi1) fn new(shared: Arc<Shared>, front: Arc<WfrFront>, worker: Weak<WorkQueue<Job>>) -> Self {
        let guid = front.lock().shape().guid;
        HfiPort { shared, front, worker, guid }
    }
}

impl Port for HfiPort {
    fn identity(&self) -> Neighbor {
        let verify_cap = self.front.lock().verify_cap_frame();
        Neighbor { guid: self.guid, node_type: NODE_TYPE_HFI, port: HFI_PORT, verify_cap }
    }

    fn probe(&self) -> Arc<Probe> {
        Arc::clone(&self.shared.probe)
    }

    fn link(&self, event: LinkEvent) -> bool {
        apply_link(&self.shared, &self.front, event, true)
    }

    fn receive(&self, packet: WirePacket) {
        if let Some(worker) = self.worker.upgrade() {
            arrive(&self.shared, &self.front, &worker, packet, true, None);
        }
    }
}

/// What the cable (or a control request standing in for it) tells the port. `record`: log it in the session
/// being recorded as the control request a replay issues at the same point.
pub(in crate::hfi1) fn apply_link(shared: &Shared, front: &WfrFront, event: LinkEvent, record: bool) -> bool {
    let applied = {
        let _rxe = shared.lock_rxe();
        let applied = front.lock().link_event(event);
        if record {
            let request = || match event {
                LinkEvent::Up(n) => {
                    let vc = n.verify_cap;
                    serde_json::json!({"cmd": "link-event", "event": "up",
                        "neighbor_guid": n.guid, "node_type": n.node_type, "port": n.port,
                        "vc_phy": vc.phy, "vc_fabric": vc.fabric, "vc_link_mode": vc.link_mode,
                        "vc_device_id": vc.device_id, "vc_tx_rate": vc.tx_rate})
                }
                LinkEvent::Down { reason } => {
                    serde_json::json!({"cmd": "link-event", "event": "down", "reason": reason})
                }
                LinkEvent::Idle(message) => {
                    serde_json::json!({"cmd": "link-event", "event": "idle", "message": message})
                }
            };
            shared.record_input(request, serde_json::json!({"applied": applied.is_some()}));
        }
        applied
    };
    let (kind, neighbor) = match event {
        LinkEvent::Up(n) => ("link-up", n.guid),
        LinkEvent::Down { .. } => ("link-down", 0),
        LinkEvent::Idle(_) => ("idle-message", 0),
    };
    shared.probe.trace.event(
        Block::Link,
        Level::Info,
        kind,
        &[("neighbor_guid", Val::Hex(neighbor)), ("applied", Val::Bool(applied.is_some()))],
    );
    match applied {
        Some(vectors) => {
            vectors.into_iter().for_each(|v| shared.raise(v));
            true
        }
        None => false,
    }
}

/// A packet from the wire: queued for the worker (false: the queue was full, the packet is dropped and
/// counted). `record` as for [`apply_link`]. A packet of a `wire-batch` carries its batch, which learns of a
/// drop here.
pub(in crate::hfi1) fn arrive(
    shared: &Shared,
    front: &WfrFront,
    worker: &WorkQueue<Job>,
    packet: WirePacket,
    record: bool,
    batch: Option<&Arc<Batch>>,
) -> bool {
    shared.counters.wire_rx_packets.fetch_add(1, Ordering::Relaxed);
    let queued = {
        let mut q = front.ingress.lock().unpoison();
        let queued = q.len() < INGRESS_QUEUE;
        if record {
            let request = || {
                serde_json::json!({"cmd": "wire", "packet_hex": hex(&packet.bytes),
                    "sc4": packet.sc4, "test_ebp": packet.test_ebp})
            };
            shared.record_input(request, serde_json::json!({"queued": queued}));
        }
        if queued {
            q.push_back(Queued { packet, batch: batch.cloned() });
        } else {
            shared.counters.wire_rx_ingress_overflow.fetch_add(1, Ordering::Relaxed);
        }
        queued
    };
    if queued {
        kick(worker, shared, &front.ingress_kicked, Job::Ingress);
    } else if let Some(b) = batch {
        // Lock order: the RXE before the port's queue, so the batch hears of it once the queue is let go.
        b.judged(&shared.lock_rxe(), Judged::Dropped(CAUSE_PORT_QUEUE_FULL));
    }
    queued
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
