//! The control socket's `wire-batch`: packets queued at the port as `wire` queues them, and a wait until the
//! driver has read them (docs/hfi1-fabric.md, "A batch from the wire"). One batch is one exec of the kernel
//! fuzzer (testing/kernel-fuzz): the driver's receive interrupt drains every entry and writes RCV_HDR_HEAD at its
//! end (driver.c finish_packet, chip.c update_usrhead), which the device model sees without a guest agent.
//!
//! - A batch's packets carry it through the port's queue. The worker tallies each one it judges: placed (its
//!   header-queue entry published) or dropped with the cause ingress gives. A packet held back for room is not
//!   judged yet.
//! - When the last is judged, the batch marks each context's count of entries placed ever
//!   ([`Rxe::rhq_placed`]). It is done once every context's consumed count ([`Rxe::rhq_consumed`]: placed less
//!   the entries between head and tail) reaches its mark. Other traffic (opa-fm's SMPs) placed before or after
//!   moves both counts alike, so it neither ends a batch early nor holds it.
//! - The waiter sleeps on a channel beside the clock's deadline. The worker nudges it as it judges the batch's
//!   packets, and the register path as the driver moves a head or restarts a context; a reset nudges every
//!   waiter. No waiter, no nudge: an idle device costs nothing.

#![forbid(unsafe_code)]

pub(in crate::hfi1) use crate::hfi1::rxe::batch::{Batch, Judged, Queued, Tally};
pub use crate::hfi1::rxe::batch::{
    BATCH_WAITERS, CAUSE_PORT_QUEUE_FULL, WIRE_BATCH_MAX, WIRE_BATCH_WAIT_DEFAULT_MS, WIRE_BATCH_WAIT_MAX_MS,
};

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vfio_user_proto::sync::Unpoison;

use crate::clock::Clock;
use crate::hfi1::cable::WirePacket;
use crate::hfi1::error::{Hfi1Error, Result};
use crate::hfi1::regs::{RCV_CTXT_CTRL_INTR_AVAIL_SMASK, RCV_HDR_HEAD};
use crate::hfi1::rxe::rhq::RCV_HDR_HEAD_HEAD_MASK;
use crate::hfi1::rxe::state::Rxe;
use crate::hfi1::shared::{Shared, WfrFront};
use crate::hfi1::wfr::csr::{CCE_INT_MASK, CCE_INT_STATUS};
use crate::hfi1::wfr::{Wfr, IS_RCVAVAIL_START, IS_RCVURGENT_START};

/// A batch queued at the port and registered to be woken; dropping it unregisters.
pub(in crate::hfi1) struct BatchWait<'a> {
    shared: &'a Shared,
    front: &'a WfrFront,
    batch: Arc<Batch>,
    epoch: u64,
    started: Instant,
}

impl<'a> BatchWait<'a> {
    /// Registers a batch of `packets` and queues them with `queue` (the port's `arrive`, which gives each the
    /// batch and judges a refused one). Nothing is queued when the batch cannot wait.
    pub(in crate::hfi1) fn start(
        shared: &'a Shared,
        front: &'a WfrFront,
        packets: Vec<WirePacket>,
        clock: &dyn Clock,
        mut queue: impl FnMut(WirePacket, &Arc<Batch>),
    ) -> Result<Self> {
        let started = clock.now();
        let (batch, epoch) = {
            let rxe = shared.lock_rxe();
            (Arc::new(Batch::new(packets.len(), &rxe)), shared.epoch())
        };
        if !front.batches.add(&batch) {
            return Err(Hfi1Error::Control(format!("{BATCH_WAITERS} batches wait already on this port")));
        }
        let wait = BatchWait { shared, front, batch, epoch, started };
        for p in packets {
            queue(p, &wait.batch);
        }
        Ok(wait)
    }

    /// The reply if the batch is over: done, or cut short by a reset.
    pub(in crate::hfi1) fn finished(&self, clock: &dyn Clock) -> Option<Value> {
        let rxe = self.shared.lock_rxe();
        let t = self.batch.tally.lock().unpoison();
        let mut reply = self.counts(&t, clock);
        if !self.shared.current(self.epoch) {
            reply["done"] = false.into();
            reply["reset"] = true.into();
            return Some(reply);
        }
        let mark = t.mark.as_ref()?;
        if mark.iter().enumerate().any(|(c, &m)| rxe.rhq_consumed(c) < m) {
            return None;
        }
        reply["done"] = true.into();
        Some(reply)
    }

    /// Blocks until the batch is over or `wait` has passed on `clock`.
    pub(in crate::hfi1) fn wait(self, clock: &dyn Clock, wait: Duration) -> Value {
        let deadline = clock.at(self.started + wait);
        loop {
            // A nudge from before this look is stale; one after it ends the select below.
            while self.batch.nudge_rx.try_recv().is_ok() {}
            if let Some(reply) = self.finished(clock) {
                return reply;
            }
            crossbeam_channel::select! {
                recv(self.batch.nudge_rx) -> _ => {}
                recv(deadline) -> _ => return self.finished(clock).unwrap_or_else(|| self.stalled(clock)),
            }
        }
    }

    /// The deadline's reply: the counts and where the driver stopped.
    fn stalled(&self, clock: &dyn Clock) -> Value {
        let rxe = self.shared.lock_rxe();
        let t = self.batch.tally.lock().unpoison();
        let mut reply = self.counts(&t, clock);
        reply["done"] = false.into();
        let mut wfr = self.front.lock();
        let contexts: Vec<Value> = (0..rxe.contexts())
            .filter_map(|c| {
                let pending = rxe.rhq_pending(c);
                let marked = t.mark.as_ref().and_then(|m| m.get(c).copied()).unwrap_or(0);
                let behind = marked.saturating_sub(rxe.rhq_consumed(c));
                (pending > 0 || behind > 0).then(|| where_context(&rxe, &mut wfr, c, pending, behind))
            })
            .collect();
        drop(wfr);
        let held = self.front.ingress_held.load(Ordering::Acquire);
        drop(rxe);
        let queued = self.front.ingress.lock().unpoison().len();
        reply["where"] = json!({"contexts": contexts, "ingress_queued": queued, "ingress_held": held});
        reply
    }

    /// Whether the batch was nudged since last asked (takes the nudge).
    #[cfg(test)]
    pub(in crate::hfi1) fn nudged(&self) -> bool {
        self.batch.nudge_rx.try_recv().is_ok()
    }

    /// The deadline's reply, now.
    #[cfg(test)]
    pub(in crate::hfi1) fn stalled_now(&self, clock: &dyn Clock) -> Value {
        self.stalled(clock)
    }

    fn counts(&self, t: &Tally, clock: &dyn Clock) -> Value {
        let waited = clock.now().saturating_duration_since(self.started);
        json!({
            "placed": t.placed,
            "dropped": t.dropped,
            "drops": t.drops,
            "unjudged": self.batch.size.saturating_sub(t.placed + t.dropped),
            "waited_us": u64::try_from(waited.as_micros()).unwrap_or(u64::MAX),
        })
    }
}

impl Drop for BatchWait<'_> {
    fn drop(&mut self) {
        self.front.batches.remove(&self.batch);
    }
}

/// One context in a stalled batch's `where`: its head and tail as the driver reads them (dwords), its entries
/// pending, those of the batch the head has yet to pass, and its receive interrupts in the CCE.
fn where_context(rxe: &Rxe, wfr: &mut Wfr, ctxt: usize, pending: u32, behind: u64) -> Value {
    let mut source = |start: u32| {
        let s = u64::from(start) + ctxt as u64;
        let mut bit = |reg: u64| wfr.read(reg + 8 * (s / 64)) >> (s % 64) & 1 == 1;
        json!({"pending": bit(CCE_INT_STATUS), "masked": !bit(CCE_INT_MASK)})
    };
    let mut avail = source(IS_RCVAVAIL_START);
    avail["enabled"] = (rxe.ctxt_ctrl(ctxt) & RCV_CTXT_CTRL_INTR_AVAIL_SMASK != 0).into();
    let urgent = source(IS_RCVURGENT_START);
    json!({
        "ctxt": ctxt,
        "head": rxe.uctxt_reg(ctxt, RCV_HDR_HEAD) & RCV_HDR_HEAD_HEAD_MASK,
        "tail": rxe.rhq(ctxt).published(),
        "pending": pending,
        "batch_pending": behind,
        "rcvavail": avail,
        "rcvurgent": urgent,
    })
}
