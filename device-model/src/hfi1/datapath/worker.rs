//! The hfi1 worker's jobs: loopback doorbells and control-socket injects, each run through the receive
//! engine on the engine's `WorkQueue` thread, dropped (or answered `Aborted`) once a reset came since it
//! was queued.

#![forbid(unsafe_code)]

use crossbeam_channel::Sender;

use super::{egress, ingress, loopback};
use crate::hfi1::observe::InjectOutcome;
use crate::hfi1::rxe::rcv::{Packet, RxResult};
use crate::hfi1::shared::{Front, Shared};
use crate::hfi1::wfr::sdma::walk as sdma_walk;
use crate::worker::{JobTag, Stamped};
use vfio_user_proto::sync::Unpoison;

pub(in crate::hfi1) enum Job {
    Doorbell {
        desc: u64,
    },
    Inject {
        packet: Packet,
        payload: Vec<u8>,
        reply: Sender<InjectOutcome>,
    },
    /// PIO send contexts launched packets (or were asked to return credits).
    Egress,
    /// An SDMA engine has descriptors to walk.
    Sdma {
        engine: usize,
    },
    /// Packets arrived from the cable, or a context the head of the queue waits for has room again.
    Ingress,
}

impl JobTag for Job {
    fn tag(&self) -> (&'static str, u64) {
        match self {
            Job::Doorbell { desc } => ("doorbell", *desc),
            Job::Inject { payload, .. } => ("inject", payload.len() as u64),
            Job::Egress => ("egress", 0),
            Job::Sdma { engine } => ("sdma", *engine as u64),
            Job::Ingress => ("ingress", 0),
        }
    }
}

/// Runs `job`. The register path queues doorbells only on the loopback front and the port's jobs only on the
/// chip's; a job that meets the other front has nothing to do.
pub(in crate::hfi1) fn run_job(shared: &Shared, Stamped { epoch, job }: Stamped<Job>) {
    use std::sync::atomic::Ordering::{AcqRel, Release};
    match (job, &shared.front) {
        (Job::Doorbell { desc }, Front::Loopback(lb)) => {
            if shared.current(epoch) {
                loopback::run_doorbell(shared, lb, shared.dma().as_ref(), desc, epoch);
            }
        }
        (Job::Inject { packet, payload, reply }, _) => {
            let result = if shared.current(epoch) {
                let mut held = shared.held_inject.lock().unpoison();
                loopback::inject(shared, shared.dma().as_ref(), packet, payload, epoch, &mut held)
            } else {
                InjectOutcome::plain(RxResult::Aborted)
            };
            let _ = reply.try_send(result);
        }
        (Job::Egress, Front::Wfr(front)) => {
            front.egress_kicked.store(false, Release);
            egress::run(shared, front, epoch);
        }
        (Job::Sdma { engine }, Front::Wfr(front)) => {
            front.sdma_kicked.fetch_and(!(1 << engine), AcqRel);
            sdma_walk::run(shared, front, epoch, engine);
        }
        (Job::Ingress, Front::Wfr(front)) => {
            front.ingress_kicked.store(false, Release);
            ingress::run(shared, front, epoch);
        }
        (Job::Doorbell { .. }, Front::Wfr(_)) | (Job::Egress | Job::Sdma { .. } | Job::Ingress, Front::Loopback(_)) => {
        }
    }
}
