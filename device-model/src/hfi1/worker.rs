//! The hfi1 worker's jobs: loopback doorbells and control-socket injects, each run through the receive
//! engine on the engine's `WorkQueue` thread, dropped (or answered `Aborted`) once a reset came since it
//! was queued.

#![forbid(unsafe_code)]

use crossbeam_channel::Sender;

use super::observe::InjectOutcome;
use super::rcv::{Packet, RxResult};
use super::shared::Shared;
use super::{egress, ingress, loopback, sdma_walk};
use crate::worker::{JobTag, Stamped};
use vfio_user_proto::sync::Unpoison;

pub(super) enum Job {
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

pub(super) fn run_job(shared: &Shared, Stamped { epoch, job }: Stamped<Job>) {
    match job {
        Job::Doorbell { desc } => {
            if shared.current(epoch) {
                loopback::run_doorbell(shared, shared.dma().as_ref(), desc, epoch);
            }
        }
        Job::Inject { packet, payload, reply } => {
            let result = if shared.current(epoch) {
                let mut held = shared.held_inject.lock().unpoison();
                loopback::inject(shared, shared.dma().as_ref(), packet, payload, epoch, &mut held)
            } else {
                InjectOutcome::plain(RxResult::Aborted)
            };
            let _ = reply.try_send(result);
        }
        Job::Egress => {
            shared.egress_kicked.store(false, std::sync::atomic::Ordering::Release);
            egress::run(shared, epoch);
        }
        Job::Sdma { engine } => {
            shared.sdma_kicked.fetch_and(!(1 << engine), std::sync::atomic::Ordering::AcqRel);
            sdma_walk::run(shared, epoch, engine);
        }
        Job::Ingress => {
            shared.ingress_kicked.store(false, std::sync::atomic::Ordering::Release);
            ingress::run(shared, epoch);
        }
    }
}
