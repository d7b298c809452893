//! The loopback send path (project-specific, not on the real chip): a register block at the top of the TXE
//! window through which a guest driver, with MMIO and DMA alone, hands TID RDMA data packets to its own
//! receive engine. See docs/hfi1-device.md for the descriptor layout and the register table.

use std::sync::atomic::{AtomicU64, Ordering};

use vfio_user_proto::dma::DmaAccess;

use super::device::Shared;
use super::observe::{self, Fate, InjectOutcome};
use super::rcv::{place, place_from, Packet, Placement, RxResult};
use super::regs::TXE;

/// Base of the loopback block: TXE + 0x7F0000, a page the real TXE CSR map leaves unused.
pub const LB_BASE: u64 = TXE + 0x7F_0000;
pub const LB_SIZE: u64 = 0x1000;

/// RW: IOVA of the first descriptor of the next chain.
pub const LB_DESC_ADDR: u64 = 0x00;
/// WO (reads 0): any write submits the chain at LB_DESC_ADDR.
pub const LB_DOORBELL: u64 = 0x08;
/// RO: doorbells whose chain was fully processed.
pub const LB_DB_DONE: u64 = 0x10;
/// RO: doorbells accepted (queued for the worker).
pub const LB_DB_SUBMITTED: u64 = 0x18;
/// RO: descriptors processed.
pub const LB_DESC_DONE: u64 = 0x20;
/// RO: descriptors whose result was not "placed".
pub const LB_DESC_ERR: u64 = 0x28;
/// RO: bits 7:0 = [`RxResult`] code of the last descriptor processed.
pub const LB_LAST_RESULT: u64 = 0x30;
/// RO: doorbells dropped because the worker queue was full.
pub const LB_DB_DROPPED: u64 = 0x38;

/// MSI-X vector raised when a doorbell's chain is done.
pub const LB_MSIX_VECTOR: u16 = 0;
/// Descriptor header bytes; the payload follows.
pub const LB_DESC_HDR_LEN: usize = 24;
/// Largest payload: the Omni-Path maximum MTU (10 KiB).
pub const LB_MAX_PAYLOAD: usize = 10240;
/// Descriptors per doorbell at most; a longer (or cyclic) chain is cut there.
pub const LB_MAX_CHAIN: usize = 4096;

/// A loopback descriptor header (little-endian): kdeth0 u32 @0, dest_qp u32 @4, psn u32 @8,
/// payload_len u32 @12, next u64 @16 (0 ends the chain), payload @24.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Descriptor {
    pub packet: Packet,
    pub payload_len: u32,
    pub next: u64,
}

impl Descriptor {
    pub fn parse(b: &[u8; LB_DESC_HDR_LEN]) -> Self {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut next = [0u8; 8];
        next.copy_from_slice(&b[16..24]);
        Self {
            packet: Packet { kdeth0: u32_at(0), dest_qp: u32_at(4), psn: u32_at(8) },
            payload_len: u32_at(12),
            next: u64::from_le_bytes(next),
        }
    }

    pub fn to_bytes(&self) -> [u8; LB_DESC_HDR_LEN] {
        let mut b = [0u8; LB_DESC_HDR_LEN];
        b[0..4].copy_from_slice(&self.packet.kdeth0.to_le_bytes());
        b[4..8].copy_from_slice(&self.packet.dest_qp.to_le_bytes());
        b[8..12].copy_from_slice(&self.packet.psn.to_le_bytes());
        b[12..16].copy_from_slice(&self.payload_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.next.to_le_bytes());
        b
    }
}

/// The registers a driver polls while the worker runs: atomics, never behind a lock a DMA path holds.
#[derive(Debug, Default)]
pub struct LbRegs {
    pub desc_addr: AtomicU64,
    pub db_done: AtomicU64,
    pub db_submitted: AtomicU64,
    pub desc_done: AtomicU64,
    pub desc_err: AtomicU64,
    pub last_result: AtomicU64,
    pub db_dropped: AtomicU64,
}

impl LbRegs {
    /// A register read; `None` for offsets in the block that hold nothing (they read as all-ones).
    pub fn read(&self, rel: u64) -> Option<u64> {
        let reg = match rel {
            LB_DESC_ADDR => &self.desc_addr,
            LB_DOORBELL => return Some(0),
            LB_DB_DONE => &self.db_done,
            LB_DB_SUBMITTED => &self.db_submitted,
            LB_DESC_DONE => &self.desc_done,
            LB_DESC_ERR => &self.desc_err,
            LB_LAST_RESULT => &self.last_result,
            LB_DB_DROPPED => &self.db_dropped,
            _ => return None,
        };
        Some(reg.load(Ordering::Acquire))
    }

    pub fn reset(&self) {
        for r in [
            &self.desc_addr,
            &self.db_done,
            &self.db_submitted,
            &self.desc_done,
            &self.desc_err,
            &self.last_result,
            &self.db_dropped,
        ] {
            r.store(0, Ordering::Release);
        }
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
pub(super) fn run_doorbell(shared: &Shared, dma: &dyn DmaAccess, desc: u64, epoch: u64) -> bool {
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
            if !publish_descriptor(shared, epoch, delivery) {
                return false;
            }
            if let Some(h) = held.take() {
                if !publish_descriptor(shared, epoch, run_descriptor(shared, dma, h, epoch, false).0) {
                    return false;
                }
            }
        }
        match following {
            Some(0) | None => {
                // A held packet with nothing behind it arrives last.
                if let Some(h) = held.take() {
                    if !publish_descriptor(shared, epoch, run_descriptor(shared, dma, h, epoch, false).0) {
                        return false;
                    }
                }
                return finish(shared, epoch);
            }
            Some(n) => next = n,
        }
    }
    // Chain too long (or cyclic): cut, and say so.
    shared.counters.lb_bad_descriptors.fetch_add(1, Ordering::Relaxed);
    shared.publish(epoch, |lb| lb.last_result.store(u64::from(RxResult::BadDescriptor.code()), Ordering::Release));
    finish(shared, epoch)
}

/// Publishes one descriptor's result; false when a reset intervened.
fn publish_descriptor(shared: &Shared, epoch: u64, delivery: Delivery) -> bool {
    shared.publish(epoch, |lb| {
        if let Delivery::Judged(result) = delivery {
            lb.last_result.store(u64::from(result.code()), Ordering::Release);
            if result != RxResult::Placed {
                lb.desc_err.fetch_add(1, Ordering::AcqRel);
            }
        }
        lb.desc_done.fetch_add(1, Ordering::AcqRel);
    })
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
pub(super) fn receive(shared: &Shared, dma: &dyn DmaAccess, pkt: &Packet, payload: &[u8], epoch: u64) -> RxResult {
    judge(shared, pkt, payload.len() as u64, epoch, "inject", |p| place(dma, p, payload, &shared.counters))
}

/// A packet `packet-reorder` held back at an inject, until the next one.
pub(super) struct HeldInject {
    packet: Packet,
    payload: Vec<u8>,
    epoch: u64,
}

/// A control-socket inject through the packet faults; `held` is the worker's slot for a reordered packet.
pub(super) fn inject(
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

/// Judges a packet of `len` payload bytes under the chip lock, then places it with the lock dropped.
fn judge(
    shared: &Shared,
    pkt: &Packet,
    len: u64,
    epoch: u64,
    source: &'static str,
    place: impl FnOnce(&Placement) -> RxResult,
) -> RxResult {
    let plan = {
        let mut chip = shared.lock_chip();
        if !shared.current(epoch) {
            return RxResult::Aborted;
        }
        observe::shift_generation(&shared.probe, &mut chip, pkt);
        chip.receive(pkt, len, &shared.counters)
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
    fn descriptor_layout_is_little_endian_at_the_documented_offsets() {
        let mut b = [0u8; LB_DESC_HDR_LEN];
        b[0..4].copy_from_slice(&[0x10, 0x80, 0x02, 0x08]);
        b[4..8].copy_from_slice(&[0x02, 0x18, 0x80, 0x00]);
        b[8..12].copy_from_slice(&[0x03, 0x28, 0x1A, 0x09]);
        b[12..16].copy_from_slice(&[0x00, 0x01, 0x00, 0x00]);
        b[16..24].copy_from_slice(&[0x00, 0x30, 0, 0, 1, 0, 0, 0]);
        let d = Descriptor::parse(&b);
        assert_eq!(d.packet, Packet { kdeth0: 0x08028010, dest_qp: 0x00801802, psn: 0x091A2803 });
        assert_eq!((d.payload_len, d.next), (256, 0x1_0000_3000));
        assert_eq!(d.to_bytes(), b);
    }

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
