//! The port's batches from the control socket's `wire-batch`, as state: each packet's batch, the batch's tally
//! of its packets judged and its per-context marks, and the list of batches waiting (bounded). The wait itself,
//! which reads the device's registers, is `datapath::batch` (docs/hfi1-fabric.md, "A batch from the wire").

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender};
use vfio_user_proto::sync::Unpoison;

use crate::hfi1::cable::WirePacket;
use crate::hfi1::regs::{
    decode, Csr, KCTXT_REGS, RCV_CTXT_CTRL, RCV_HDR_CNT, RCV_HDR_ENT_SIZE, RCV_HDR_HEAD, UCTXT_REGS,
};
use crate::hfi1::rxe::state::Rxe;

/// Packets a batch holds at most.
pub const WIRE_BATCH_MAX: usize = 64;
/// How long a batch waits for the driver unless told (`wait_ms`), and at most.
pub const WIRE_BATCH_WAIT_DEFAULT_MS: u64 = 2000;
pub const WIRE_BATCH_WAIT_MAX_MS: u64 = 60_000;
/// Batches waiting at once at most (the control socket serves `control::MAX_CLIENTS` clients).
pub const BATCH_WAITERS: usize = 16;
/// The drop cause of a batch packet the port's full queue refused (`wire_rx_ingress_overflow`).
pub const CAUSE_PORT_QUEUE_FULL: &str = "port queue full";

/// A packet in the port's queue, with the batch it belongs to, if any.
pub(in crate::hfi1) struct Queued {
    pub(in crate::hfi1) packet: WirePacket,
    pub(in crate::hfi1) batch: Option<Arc<Batch>>,
}

/// What the worker made of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::hfi1) enum Judged {
    Placed,
    Dropped(&'static str),
}

#[derive(Debug, Default)]
pub(in crate::hfi1) struct Tally {
    pub(in crate::hfi1) placed: usize,
    pub(in crate::hfi1) dropped: usize,
    /// Drops by cause (ingress's and the receive engine's cause strings: a few dozen at most).
    pub(in crate::hfi1) drops: BTreeMap<&'static str, usize>,
    /// Each context's [`Rxe::rhq_placed`] when the batch's last packet was judged.
    pub(in crate::hfi1) mark: Option<Vec<u64>>,
}

/// One `wire-batch` request's packets on their way through the port.
pub(in crate::hfi1) struct Batch {
    pub(in crate::hfi1) size: usize,
    pub(in crate::hfi1) tally: Mutex<Tally>,
    nudge_tx: Sender<()>,
    pub(in crate::hfi1) nudge_rx: Receiver<()>,
}

impl Batch {
    /// A batch of `size` packets; an empty one is judged at once, against the entries placed now.
    pub(in crate::hfi1) fn new(size: usize, rxe: &Rxe) -> Self {
        let (nudge_tx, nudge_rx) = crossbeam_channel::bounded(1);
        let mark = (size == 0).then(|| marks(rxe));
        Batch { size, tally: Mutex::new(Tally { mark, ..Tally::default() }), nudge_tx, nudge_rx }
    }

    /// Wakes the waiter; a nudge already pending covers this one.
    pub(in crate::hfi1) fn nudge(&self) {
        let _ = self.nudge_tx.try_send(());
    }

    /// The worker (or the port, for a packet its full queue refused) judged one of the batch's packets. Call
    /// with the RXE lock held: the last one marks the contexts.
    pub(in crate::hfi1) fn judged(&self, rxe: &Rxe, judged: Judged) {
        {
            let mut t = self.tally.lock().unpoison();
            match judged {
                Judged::Placed => t.placed += 1,
                Judged::Dropped(cause) => {
                    t.dropped += 1;
                    *t.drops.entry(cause).or_default() += 1;
                }
            }
            if t.placed + t.dropped == self.size {
                t.mark = Some(marks(rxe));
            }
        }
        self.nudge();
    }
}

pub(in crate::hfi1) fn marks(rxe: &Rxe) -> Vec<u64> {
    (0..rxe.contexts()).map(|c| rxe.rhq_placed(c)).collect()
}

/// The batches waiting on one port.
#[derive(Default)]
pub(in crate::hfi1) struct Waiters {
    count: AtomicUsize,
    list: Mutex<Vec<Arc<Batch>>>,
}

impl Waiters {
    /// Wakes every waiting batch to look again; free when none waits.
    pub(in crate::hfi1) fn nudge_all(&self) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        self.list.lock().unpoison().iter().for_each(|b| b.nudge());
    }

    /// An RXE register write: wakes the waiting batches if it can end a wait (a head register, or a context's
    /// control or queue size: a restart discards its entries).
    pub(in crate::hfi1) fn nudge_for_write(&self, offset: u64, contexts: usize) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let moves = match decode(offset, contexts, None) {
            Csr::Uctxt { reg, .. } => UCTXT_REGS[reg].offset == RCV_HDR_HEAD,
            Csr::Kctxt { reg, .. } => {
                matches!(KCTXT_REGS[reg].offset, RCV_CTXT_CTRL | RCV_HDR_CNT | RCV_HDR_ENT_SIZE)
            }
            _ => false,
        };
        if moves {
            self.nudge_all();
        }
    }

    pub(in crate::hfi1) fn add(&self, batch: &Arc<Batch>) -> bool {
        let mut list = self.list.lock().unpoison();
        if list.len() >= BATCH_WAITERS {
            return false;
        }
        list.push(Arc::clone(batch));
        self.count.store(list.len(), Ordering::Release);
        true
    }

    pub(in crate::hfi1) fn remove(&self, batch: &Arc<Batch>) {
        let mut list = self.list.lock().unpoison();
        list.retain(|b| !Arc::ptr_eq(b, batch));
        self.count.store(list.len(), Ordering::Release);
    }
}
