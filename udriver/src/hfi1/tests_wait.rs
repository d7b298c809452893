//! Wakeup mechanics of §1.12: deduplicated scheduling, the self-wakeup path and the memory wait.

#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex};

use super::exp_rcv::*;
use super::fake::rig;
use super::qp::*;
use super::tests::{frag, mk_qp, req_for, setup_segment, ss_over};
use super::wait::*;
use crate::dma::PAGE_SIZE;

const PG: u32 = PAGE_SIZE as u32;

fn recorder() -> (Arc<Mutex<Vec<u32>>>, DoSend) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    (log, Box::new(move |qp: &Arc<Hfi1Qp>| l.lock().unwrap().push(qp.qp_num)))
}

#[test]
fn a_wakeup_scheduled_twice_runs_once_and_only_while_the_qp_waits() {
    let r = rig(1);
    let (log, cb) = recorder();
    let qp = mk_qp(&r, 4, 4096, cb);
    qp.lock().s_flags |= HFI1_S_WAIT_TID_SPACE;
    tid_rdma_schedule_tid_wakeup(Some(qp.clone()));
    tid_rdma_schedule_tid_wakeup(Some(qp.clone()));
    assert_eq!(r.dd.wq.len(), 1);
    r.dd.wq.run_pending(10);
    assert_eq!(*log.lock().unwrap(), vec![4]);
    // Once no longer waiting, a wakeup does nothing.
    qp.lock().s_flags &= !HFI1_S_WAIT_TID_SPACE;
    tid_rdma_schedule_tid_wakeup(Some(qp.clone()));
    tid_rdma_schedule_tid_wakeup(None);
    assert_eq!(r.dd.wq.run_pending(10), 1);
    assert_eq!(log.lock().unwrap().len(), 1);
}

#[test]
fn a_qp_at_the_head_that_frees_its_own_tids_schedules_its_own_send() {
    let r = rig(1);
    let (log, cb) = recorder();
    let qp = mk_qp(&r, 9, 4096, cb);
    let buf = frag(&r, &[1; 6]);
    let mut ss = ss_over(&buf);
    let mut req = req_for(&qp, 6 * PG, 4);
    setup_segment(&qp, &mut req, &mut ss).unwrap();
    let buf2 = frag(&r, &[1; 4]);
    let mut ss2 = ss_over(&buf2);
    let mut req2 = req_for(&qp, 4 * PG, 4);
    assert_eq!(setup_segment(&qp, &mut req2, &mut ss2), Err(-libc::EAGAIN));
    hfi1_kern_exp_rcv_clear(&mut req, &mut qp.lock()).unwrap();
    r.dd.wq.run_pending(10);
    assert_eq!(*log.lock().unwrap(), vec![9], "hfi1_schedule_send ran the QP's send");
    assert_eq!(setup_segment(&qp, &mut req2, &mut ss2), Ok(()));
    assert_eq!(qp.lock().s_flags & HFI1_S_WAIT_TID_SPACE, 0);
}

#[test]
fn waiting_for_memory_sets_wait_kmem_until_the_retry_runs() {
    let r = rig(1);
    let (log, cb) = recorder();
    let qp = mk_qp(&r, 5, 4096, cb);
    hfi1_wait_kmem(&mut qp.lock());
    hfi1_wait_kmem(&mut qp.lock());
    assert_ne!(qp.lock().s_flags & RVT_S_WAIT_KMEM, 0);
    assert_eq!(r.dd.wq.run_pending(10), 1, "one retry however often it waited");
    assert_eq!(qp.lock().s_flags & RVT_S_WAIT_KMEM, 0);
    assert_eq!(*log.lock().unwrap(), vec![5]);
}
