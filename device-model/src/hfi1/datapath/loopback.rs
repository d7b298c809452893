//! The loopback send path (project-specific, not on the real chip): a register block at the top of the TXE
//! window through which a guest driver, with MMIO and DMA alone, hands TID RDMA data packets to its own
//! receive engine. See docs/hfi1-device.md for the descriptor layout and the register table.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use vfio_user_proto::dma::DmaAccess;

use crate::hfi1::observe::{self, Fate, HeldInject, InjectOutcome};
use crate::hfi1::rxe::rcv::{place, place_from, Packet, Placement, RxResult};
use crate::hfi1::shared::{LbRegs, Shared};

pub use emu_abi::hfi1::{
    LbDescHeader, LB_BASE, LB_DB_DONE, LB_DB_DROPPED, LB_DB_SUBMITTED, LB_DESC_ADDR, LB_DESC_DONE, LB_DESC_ERR,
    LB_DESC_HDR_LEN, LB_DOORBELL, LB_LAST_RESULT, LB_MAX_CHAIN, LB_MAX_PAYLOAD, LB_MSIX_VECTOR, LB_SIZE,
};

/// A loopback descriptor as the receive engine takes it: the header's packet words, the payload length and
/// the next descriptor's IOVA. The byte layout is `LbDescHeader`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Descriptor {
    pub packet: Packet,
    pub payload_len: u32,
    pub next: u64,
}

impl Descriptor {
    pub fn parse(b: &[u8; LB_DESC_HDR_LEN]) -> Self {
        let h = LbDescHeader::parse(b);
        Self {
            packet: Packet { kdeth0: h.kdeth0, dest_qp: h.dest_qp, psn: h.psn },
            payload_len: h.payload_len,
            next: h.next,
        }
    }

    pub fn to_bytes(&self) -> [u8; LB_DESC_HDR_LEN] {
        let Packet { kdeth0, dest_qp, psn } = self.packet;
        LbDescHeader { kdeth0, dest_qp, psn, payload_len: self.payload_len, next: self.next }.to_bytes()
    }
}

/// What became of a descriptor's packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    Judged(RxResult),
    /// Lost on the way (`packet-drop`): counted as done, no result.
    Dropped,
    /// Held back (`packet-reorder`): delivered after the next descriptor.
    Held,
}

/// Processes one doorbell: the chain at `desc`, submitted in reset epoch `epoch`. Returns false if reset or
/// detach stopped it (nothing more is published then).
pub(in crate::hfi1) fn run_doorbell(shared: &Shared, lb: &LbRegs, dma: &dyn DmaAccess, desc: u64, epoch: u64) -> bool {
    let mut next = desc;
    // A descriptor held back by `packet-reorder`, re-read and delivered after the one that follows it.
    let mut held: Option<u64> = None;
    for _ in 0..LB_MAX_CHAIN {
        if !shared.current(epoch) {
            return false;
        }
        // The packet after a held one arrives as it is, then the held one.
        let (delivery, following) = run_descriptor(shared, dma, next, epoch, held.is_none());
        if delivery == Delivery::Held {
            held = Some(next);
        } else {
            if !publish_descriptor(shared, lb, epoch, delivery) {
                return false;
            }
            if let Some(h) = held.take() {
                if !publish_descriptor(shared, lb, epoch, run_descriptor(shared, dma, h, epoch, false).0) {
                    return false;
                }
            }
        }
        match following {
            Some(0) | None => {
                // A held packet with nothing behind it arrives last.
                if let Some(h) = held.take() {
                    if !publish_descriptor(shared, lb, epoch, run_descriptor(shared, dma, h, epoch, false).0) {
                        return false;
                    }
                }
                return finish(shared, lb, epoch);
            }
            Some(n) => next = n,
        }
    }
    // Chain too long (or cyclic): cut, and say so.
    shared.counters.lb_bad_descriptors.fetch_add(1, Ordering::Relaxed);
    shared.publish(epoch, || lb.last_result.store(u64::from(RxResult::BadDescriptor.code()), Ordering::Release));
    finish(shared, lb, epoch)
}

/// Publishes one descriptor's result; false when a reset intervened.
fn publish_descriptor(shared: &Shared, lb: &LbRegs, epoch: u64, delivery: Delivery) -> bool {
    shared.publish(epoch, || {
        if let Delivery::Judged(result) = delivery {
            lb.last_result.store(u64::from(result.code()), Ordering::Release);
            if result != RxResult::Placed {
                lb.desc_err.fetch_add(1, Ordering::AcqRel);
            }
        }
        lb.desc_done.fetch_add(1, Ordering::AcqRel);
    })
}

fn finish(shared: &Shared, lb: &LbRegs, epoch: u64) -> bool {
    let done = shared.publish(epoch, || {
        lb.db_done.fetch_add(1, Ordering::AcqRel);
    });
    if done {
        shared.raise(LB_MSIX_VECTOR);
    }
    done
}

/// One descriptor: what became of its packet and the next descriptor's IOVA (`None` if the header could not
/// be read). With `faults`, the packet faults may drop, duplicate or hold it.
///
/// The payload is checked readable before the packet is judged (a descriptor whose payload cannot be read
/// changes no flow), then copied by DMA straight from the descriptor into the RcvArray buffer.
fn run_descriptor(
    shared: &Shared,
    dma: &dyn DmaAccess,
    iova: u64,
    epoch: u64,
    faults: bool,
) -> (Delivery, Option<u64>) {
    let mut hdr = [0u8; LB_DESC_HDR_LEN];
    if dma.read(iova, &mut hdr).is_err() {
        shared.counters.lb_bad_descriptors.fetch_add(1, Ordering::Relaxed);
        return (Delivery::Judged(RxResult::BadDescriptor), None);
    }
    let d = Descriptor::parse(&hdr);
    let len = u64::from(d.payload_len);
    let payload = iova
        .checked_add(LB_DESC_HDR_LEN as u64)
        .filter(|&p| len <= LB_MAX_PAYLOAD as u64 && (len == 0 || dma.check_read(p, len).is_ok()));
    let Some(payload) = payload else {
        shared.counters.lb_bad_descriptors.fetch_add(1, Ordering::Relaxed);
        return (Delivery::Judged(RxResult::BadDescriptor), Some(d.next));
    };
    let fate = if faults { observe::fate(&shared.probe, &d.packet) } else { Fate::Deliver };
    let once =
        || judge(shared, &d.packet, len, epoch, "loopback", |p| place_from(dma, p, payload, len, &shared.counters));
    let delivery = match fate {
        Fate::Drop | Fate::Hold => {
            observe::packet(&shared.probe, "loopback", &d.packet, len, observe::result_name(None, fate));
            if fate == Fate::Drop {
                Delivery::Dropped
            } else {
                Delivery::Held
            }
        }
        Fate::Duplicate => {
            once();
            Delivery::Judged(once())
        }
        Fate::Deliver => Delivery::Judged(once()),
    };
    (delivery, Some(d.next))
}

/// Receives one packet whose payload the caller holds (control `inject`).
pub(in crate::hfi1) fn receive(
    shared: &Shared,
    dma: &dyn DmaAccess,
    pkt: &Packet,
    payload: &[u8],
    epoch: u64,
) -> RxResult {
    judge(shared, pkt, payload.len() as u64, epoch, "inject", |p| place(dma, p, payload, &shared.counters))
}

/// A control-socket inject through the packet faults; `held` is the worker's slot for a reordered packet.
pub(in crate::hfi1) fn inject(
    shared: &Shared,
    dma: &dyn DmaAccess,
    packet: Packet,
    payload: Vec<u8>,
    epoch: u64,
    held: &mut Option<HeldInject>,
) -> InjectOutcome {
    // The packet after a held one arrives as it is, then the held one.
    let fate = if held.is_none() { observe::fate(&shared.probe, &packet) } else { Fate::Deliver };
    let len = payload.len() as u64;
    let mut out = match fate {
        Fate::Deliver => InjectOutcome::plain(receive(shared, dma, &packet, &payload, epoch)),
        Fate::Duplicate => {
            let first = receive(shared, dma, &packet, &payload, epoch);
            InjectOutcome {
                first: Some(first),
                fault: Some("packet-dup"),
                ..InjectOutcome::plain(receive(shared, dma, &packet, &payload, epoch))
            }
        }
        Fate::Drop | Fate::Hold => {
            observe::packet(&shared.probe, "inject", &packet, len, observe::result_name(None, fate));
            let fault = if fate == Fate::Drop { "packet-drop" } else { "packet-reorder" };
            InjectOutcome { result: None, fault: Some(fault), first: None, released: None }
        }
    };
    if fate == Fate::Hold {
        *held = Some(HeldInject { packet, payload, epoch });
    } else if let Some(h) = held.take() {
        // Held across a reset: the reset dropped it, as it drops all older work.
        if shared.current(h.epoch) {
            out.released = Some(receive(shared, dma, &h.packet, &h.payload, h.epoch));
        }
    }
    out
}

/// Judges a packet of `len` payload bytes under the RXE lock, then places it with the lock dropped.
fn judge(
    shared: &Shared,
    pkt: &Packet,
    len: u64,
    epoch: u64,
    source: &'static str,
    place: impl FnOnce(&Placement) -> RxResult,
) -> RxResult {
    let plan = {
        let mut rxe = shared.lock_rxe();
        if !shared.current(epoch) {
            return RxResult::Aborted;
        }
        observe::shift_generation(&shared.probe, &mut rxe, pkt);
        rxe.receive(pkt, len, &shared.counters)
    };
    let result = match plan {
        Ok(p) if shared.current(epoch) => place(&p),
        Ok(_) => RxResult::Aborted,
        Err(r) => r,
    };
    observe::packet(&shared.probe, source, pkt, len, result.name());
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_registers_read_and_reset() {
        let lb = LbRegs::default();
        lb.desc_addr.store(0x1000, Ordering::Relaxed);
        lb.db_done.store(3, Ordering::Relaxed);
        assert_eq!(lb.read(LB_DESC_ADDR), Some(0x1000));
        assert_eq!(lb.read(LB_DOORBELL), Some(0));
        assert_eq!(lb.read(LB_DB_DONE), Some(3));
        assert_eq!(lb.read(0x40), None);
        lb.reset();
        assert_eq!(lb.read(LB_DB_DONE), Some(0));
    }
}
