//! Waiting for TID resources (§1.12): the per-context FIFO queues of QPs, and the port workqueue that
//! wakes them. A wakeup runs the QP's `do_send` callback with no lock held, so one QP never takes another
//! QP's `s_lock` (§1.13).

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::hfi::{ExpLocked, Hfi1Qp, QpLocked, HFI1_S_WAIT_TID_SPACE, RVT_S_WAIT_KMEM};
pub use super::hfi::{QueueId, TidQueue, TidWork, TidWorkQueue};

fn queue<'a>(rcd: &'a mut ExpLocked<'_>, id: QueueId) -> &'a mut TidQueue {
    match id {
        QueueId::Flow => &mut rcd.flow_queue,
        QueueId::Rarr => &mut rcd.rarr_queue,
    }
}

/// `kernel_tid_waiters(rcd, queue, qp)`: true when another QP is ahead of `qp`, so `qp` must queue.
pub fn kernel_tid_waiters(rcd: &mut ExpLocked<'_>, queue_id: QueueId, qp: &QpLocked<'_>) -> bool {
    let q = queue(rcd, queue_id);
    match q.queue_head.front() {
        None => false,
        Some(head) => !(Arc::ptr_eq(head, qp.qp) && qp.s_flags & HFI1_S_WAIT_TID_SPACE != 0),
    }
}

/// `queue_qp_for_tid_wait(rcd, queue, qp)`: appends `qp` unless it already waits somewhere.
pub fn queue_qp_for_tid_wait(rcd: &mut ExpLocked<'_>, queue_id: QueueId, qp: &mut QpLocked<'_>) {
    if qp.tid_wait.is_some() {
        return;
    }
    qp.s_flags |= HFI1_S_WAIT_TID_SPACE;
    let q = queue(rcd, queue_id);
    q.queue_head.push_back(qp.qp.clone());
    q.enqueue = q.enqueue.wrapping_add(1);
    qp.tid_enqueue = q.enqueue;
    qp.tid_wait = Some(queue_id);
    rcd.rcd.dd.n_tidwait.fetch_add(1, Ordering::Relaxed);
}

/// `dequeue_tid_waiter(rcd, queue, qp)`: unlinks `qp` from whichever queue it waits on, clears
/// WAIT_TID_SPACE and counts the dequeue on `queue_id`, the queue passed, as tid_rdma.c:537-551 does
/// (`list_del_init(&priv->tid_wait)`, then `queue->dequeue++`).
pub fn dequeue_tid_waiter(rcd: &mut ExpLocked<'_>, queue_id: QueueId, qp: &mut QpLocked<'_>) {
    let Some(on) = qp.tid_wait.take() else { return };
    let list = &mut queue(rcd, on).queue_head;
    if let Some(pos) = list.iter().position(|w| Arc::ptr_eq(w, qp.qp)) {
        list.remove(pos);
    }
    qp.s_flags &= !HFI1_S_WAIT_TID_SPACE;
    let q = queue(rcd, queue_id);
    q.dequeue = q.dequeue.wrapping_add(1);
}

/// `first_qp(rcd, queue)`: the head waiter, with a reference.
pub fn first_qp(rcd: &mut ExpLocked<'_>, queue_id: QueueId) -> Option<Arc<Hfi1Qp>> {
    queue(rcd, queue_id).queue_head.front().cloned()
}

/// `tid_rdma_schedule_tid_wakeup(qp)`: queues `trigger_work` for `qp` unless already queued.
pub fn tid_rdma_schedule_tid_wakeup(qp: Option<Arc<Hfi1Qp>>) {
    let Some(qp) = qp else { return };
    if qp.trigger_queued.swap(true, Ordering::AcqRel) {
        return;
    }
    let wq = &qp.rcd.dd.wq;
    wq.push(TidWork::TriggerResume(qp.clone()));
}

/// `tid_rdma_trigger_resume`: the work item. Sends only if the QP still waits for TID space.
pub fn tid_rdma_trigger_resume(qp: &Arc<Hfi1Qp>) {
    qp.trigger_queued.store(false, Ordering::Release);
    let waiting = qp.lock().s_flags & HFI1_S_WAIT_TID_SPACE != 0;
    if waiting {
        qp.do_send();
    }
}

/// `hfi1_schedule_send(qp)`: the send engine runs later, outside the caller's `s_lock`.
pub fn hfi1_schedule_send(qp: &QpLocked<'_>) {
    qp.qp.rcd.dd.wq.push(TidWork::Send(qp.qp.clone()));
}

/// `__trigger_tid_waiter(qp)`: the caller is the waiter itself and holds its `s_lock`.
pub fn trigger_tid_waiter(qp: &QpLocked<'_>) {
    if qp.s_flags & HFI1_S_WAIT_TID_SPACE != 0 {
        hfi1_schedule_send(qp);
    }
}

/// `hfi1_wait_kmem(qp)`: marks the QP as waiting for memory and schedules a retry.
pub fn hfi1_wait_kmem(qp: &mut QpLocked<'_>) {
    if qp.s_flags & RVT_S_WAIT_KMEM == 0 {
        qp.s_flags |= RVT_S_WAIT_KMEM;
        qp.qp.rcd.dd.wq.push(TidWork::Kmem(qp.qp.clone()));
    }
}

/// `hfi1_tid_rdma_flush_wait(qp)` (QP reset / error): `_tid_rdma_flush_wait` on the flow queue, then on the
/// RcvArray queue (tid_rdma.c:669-696). Each clears WAIT_TID_SPACE and, if the QP is on any list, unlinks it
/// and counts the dequeue on the queue it was called for: a QP waiting for RcvArray space is counted on the
/// flow queue, as in the kernel.
pub fn tid_rdma_flush_wait(qp: &mut QpLocked<'_>) {
    let rcd = qp.qp.rcd.clone();
    for id in [QueueId::Flow, QueueId::Rarr] {
        qp.s_flags &= !HFI1_S_WAIT_TID_SPACE;
        let mut exp = rcd.lock_exp();
        dequeue_tid_waiter(&mut exp, id, qp);
    }
}

impl Default for TidWorkQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl TidWorkQueue {
    pub fn new() -> Self {
        let (tx, rx) = crossbeam_channel::unbounded();
        Self { tx, rx }
    }

    fn push(&self, w: TidWork) {
        // The receiver lives as long as `self`, so sending cannot fail.
        let _ = self.tx.send(w);
    }

    fn run(w: TidWork) {
        match w {
            TidWork::TriggerResume(qp) => tid_rdma_trigger_resume(&qp),
            TidWork::Send(qp) => qp.do_send(),
            TidWork::Kmem(qp) => {
                qp.lock().s_flags &= !RVT_S_WAIT_KMEM;
                qp.do_send();
            }
        }
    }

    /// Runs every queued item, including ones queued meanwhile; returns how many ran. `limit` bounds the
    /// loop when wakeups keep queuing more wakeups.
    pub fn run_pending(&self, limit: usize) -> usize {
        let mut n = 0;
        while n < limit {
            match self.rx.try_recv() {
                Ok(w) => Self::run(w),
                Err(_) => break,
            }
            n += 1;
        }
        n
    }

    /// Waits up to `timeout` for one item and runs it; false if none came.
    pub fn run_one(&self, timeout: Duration) -> bool {
        match self.rx.recv_timeout(timeout) {
            Ok(w) => {
                Self::run(w);
                true
            }
            Err(_) => false,
        }
    }

    pub fn len(&self) -> usize {
        self.rx.len()
    }
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}
