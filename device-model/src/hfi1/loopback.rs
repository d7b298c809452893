//! The loopback send path (project-specific, not on the real chip): a register block at the top of the TXE
//! window through which a guest driver, with MMIO and DMA alone, hands TID RDMA data packets to its own
//! receive engine. See docs/hfi1-device.md for the descriptor layout and the register table.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use vfio_user_proto::dma::DmaAccess;

use super::rcv::{place, place_from, Packet, Placement, RxResult};
use super::shared::Shared;

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

/// Processes one doorbell: the chain at `desc`, submitted in reset epoch `epoch`. Returns false if reset or
/// detach stopped it (nothing more is published then).
pub(super) fn run_doorbell(shared: &Shared, dma: &dyn DmaAccess, desc: u64, epoch: u64) -> bool {
    let mut next = desc;
    for _ in 0..LB_MAX_CHAIN {
        if !shared.current(epoch) {
            return false;
        }
        let (result, following) = run_descriptor(shared, dma, next, epoch);
        if !shared.publish(epoch, |lb| {
            lb.last_result.store(u64::from(result.code()), Ordering::Release);
            if result != RxResult::Placed {
                lb.desc_err.fetch_add(1, Ordering::AcqRel);
            }
            lb.desc_done.fetch_add(1, Ordering::AcqRel);
        }) {
            return false;
        }
        match following {
            Some(0) | None => return finish(shared, epoch),
            Some(n) => next = n,
        }
    }
    // Chain too long (or cyclic): cut, and say so.
    shared.counters.lb_bad_descriptors.fetch_add(1, Ordering::Relaxed);
    shared.publish(epoch, |lb| lb.last_result.store(u64::from(RxResult::BadDescriptor.code()), Ordering::Release));
    finish(shared, epoch)
}

fn finish(shared: &Shared, epoch: u64) -> bool {
    let done = shared.publish(epoch, |lb| {
        lb.db_done.fetch_add(1, Ordering::AcqRel);
    });
    if done {
        shared.raise(LB_MSIX_VECTOR);
    }
    done
}

/// One descriptor: its result and the next descriptor's IOVA (`None` if the header could not be read).
///
/// The payload is checked readable before the packet is judged (a descriptor whose payload cannot be read
/// changes no flow), then copied by DMA straight from the descriptor into the RcvArray buffer.
fn run_descriptor(shared: &Shared, dma: &dyn DmaAccess, iova: u64, epoch: u64) -> (RxResult, Option<u64>) {
    let mut hdr = [0u8; LB_DESC_HDR_LEN];
    if dma.read(iova, &mut hdr).is_err() {
        shared.counters.lb_bad_descriptors.fetch_add(1, Ordering::Relaxed);
        return (RxResult::BadDescriptor, None);
    }
    let d = Descriptor::parse(&hdr);
    let len = u64::from(d.payload_len);
    let payload = iova
        .checked_add(LB_DESC_HDR_LEN as u64)
        .filter(|&p| len <= LB_MAX_PAYLOAD as u64 && (len == 0 || dma.check_read(p, len).is_ok()));
    let Some(payload) = payload else {
        shared.counters.lb_bad_descriptors.fetch_add(1, Ordering::Relaxed);
        return (RxResult::BadDescriptor, Some(d.next));
    };
    let result = judge(shared, &d.packet, len, epoch, |p| place_from(dma, p, payload, len, &shared.counters));
    (result, Some(d.next))
}

/// Receives one packet whose payload the caller holds.
pub(super) fn receive(shared: &Shared, dma: &dyn DmaAccess, pkt: &Packet, payload: &[u8], epoch: u64) -> RxResult {
    judge(shared, pkt, payload.len() as u64, epoch, |p| place(dma, p, payload, &shared.counters))
}

/// Judges a packet of `len` payload bytes under the chip lock, then places it with the lock dropped.
fn judge(shared: &Shared, pkt: &Packet, len: u64, epoch: u64, place: impl FnOnce(&Placement) -> RxResult) -> RxResult {
    let plan = {
        let mut chip = shared.lock_chip();
        if !shared.current(epoch) {
            return RxResult::Aborted;
        }
        chip.receive(pkt, len, &shared.counters)
    };
    match plan {
        Ok(p) if shared.current(epoch) => place(&p),
        Ok(_) => RxResult::Aborted,
        Err(r) => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hfi1::shared::LbRegs;

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
