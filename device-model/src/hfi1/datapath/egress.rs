//! The send side of the port: packets the PIO send contexts launched go on the wire, and their credits go
//! back to the driver (docs/hfi1-fabric.md, "PIO"). Runs on the engine's worker.
//!
//! The PBC is the chip's, not the wire's: it is stripped, its SC[4] (DcInfo) and TestEBP ride along as the
//! cable's sideband, and the ICRC is appended. Packets launched while the link is down, 16B packets (PBC
//! PacketBypass: not modelled) and bytes that are no 9B packet are dropped and counted; their credits come
//! back all the same, as the chip frees the blocks of every packet it consumed.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;

use crate::fault::FaultKind;
use crate::hfi1::cable::wire::{BTH_BYTES, ICRC_BYTES, USER_KDETH_OPCODES};
use crate::hfi1::cable::WirePacket;
use crate::hfi1::shared::{Shared, WfrFront};
use crate::hfi1::wfr::pio::{LaunchKind, PBC_DC_INFO, PBC_PACKET_BYPASS, PBC_TEST_EBP, PBC_VL_MASK, PBC_VL_SHIFT};
use crate::hfi1::wfr::IS_SENDCREDIT_START;
use crate::trace::{Block, Level, Val};

/// Sends every launch waiting, returning credits as each one is done. Work of an older epoch stops.
pub(in crate::hfi1) fn run(shared: &Shared, front: &WfrFront, epoch: u64) {
    let dma = shared.dma();
    loop {
        if !shared.current(epoch) {
            return;
        }
        let launches = front.lock().take_launches();
        if launches.is_empty() {
            return;
        }
        for l in launches {
            if let LaunchKind::Packet { pbc, body, user } = &l.kind {
                if *user {
                    shared.counters.pio_user_launches.fetch_add(1, Relaxed);
                }
                send(shared, front, "pio", l.ctxt, *pbc, body, l.blocks);
            }
            let (cr, halts) = {
                // Under the RXE lock, which resets take: a return never lands on a freshly reset context.
                let _rxe = shared.lock_rxe();
                if !shared.current(epoch) {
                    return;
                }
                let mut wfr = front.lock();
                let cr = wfr.credit_returned(&l);
                // A packet the return made room for may have launched, and failed its context's checks.
                (cr, wfr.disallowed_vectors())
            };
            for v in halts {
                shared.raise(v);
            }
            let Some(cr) = cr else { continue };
            let word = match shared.probe.fault(FaultKind::CreditReturn, |p| p.ctxt.is_none_or(|c| c == cr.ctxt)) {
                Some(f) => f.params.edit(cr.word),
                None => cr.word,
            };
            if dma.write_u64(cr.addr, word).is_err() {
                shared.counters.pio_credit_dma_errors.fetch_add(1, Relaxed);
            }
            if cr.interrupt {
                let source = IS_SENDCREDIT_START + cr.ctxt;
                if !shared.current(epoch) {
                    return;
                }
                if let Some(v) = front.lock().raise(source) {
                    shared.raise(v);
                }
            }
        }
    }
}

/// Puts a packet a send context (`source` "pio", `unit` its hardware context, `pieces` its blocks) or an SDMA
/// engine ("sdma", the engine, its descriptors) launched on the wire: PBC stripped, ICRC appended.
pub(in crate::hfi1) fn send(
    shared: &Shared,
    front: &WfrFront,
    source: &'static str,
    unit: u32,
    pbc: u64,
    body: &[u8],
    pieces: u16,
) {
    let c = &shared.counters;
    let probe = &shared.probe;
    let fate = if pbc & PBC_PACKET_BYPASS != 0 {
        c.wire_tx_bypass_unmodelled.fetch_add(1, Relaxed);
        "dropped: 16B bypass packets are not modelled"
    } else {
        match WirePacket::seal(body.to_vec(), pbc & PBC_DC_INFO != 0, pbc & PBC_TEST_EBP != 0) {
            Err(_) => {
                c.wire_tx_malformed.fetch_add(1, Relaxed);
                "dropped: not a 9B packet"
            }
            Ok(pkt) => {
                let up = front.lock().link_up();
                match front.cable.get() {
                    Some(end) if up => {
                        if source == "sdma" {
                            count_user_sdma(c, &pkt);
                        }
                        end.transmit(pkt);
                        c.wire_tx_packets.fetch_add(1, Relaxed);
                        "sent"
                    }
                    _ => {
                        c.wire_tx_link_down.fetch_add(1, Relaxed);
                        "dropped: link down"
                    }
                }
            }
        }
    };
    if probe.trace.on(Block::Pio, Level::Info) {
        probe.trace.event(
            Block::Pio,
            Level::Info,
            "launch",
            &[
                ("source", Val::Str(source)),
                ("unit", Val::Dec(unit.into())),
                ("vl", Val::Dec((pbc >> PBC_VL_SHIFT) & PBC_VL_MASK)),
                ("len", Val::Dec(body.len() as u64)),
                ("pieces", Val::Dec(pieces.into())),
                ("fate", Val::Str(fate)),
            ],
        );
    }
}

/// Bytes of the KDETH header a user packet carries behind its BTH (hfi1_user.h struct hfi1_kdeth_header).
const USER_KDETH_HEADER_BYTES: usize = 36;

/// A packet an SDMA engine sends is a user's when its opcode is in the user KDETH range (user_sdma.c
/// hfi1_user_sdma_process_request: opcode & USER_OPCODE_CHECK_MASK == USER_OPCODE_CHECK_VAL, 0xC0); the
/// kernel's own KDETH packets are TID RDMA, 0xE0..=0xEF, and its verbs opcodes are below 0xC0.
fn count_user_sdma(c: &crate::hfi1::counters::Counters, pkt: &WirePacket) {
    if !USER_KDETH_OPCODES.contains(&pkt.opcode()) {
        return;
    }
    let Ok(bth) = pkt.bth_offset() else { return };
    let header = bth + BTH_BYTES + USER_KDETH_HEADER_BYTES;
    let payload = pkt.bytes.len().saturating_sub(header + usize::from(pkt.pad()) + ICRC_BYTES);
    c.sdma_user_packets.fetch_add(1, Relaxed);
    c.sdma_user_bytes.fetch_add(payload as u64, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hfi1::counters::Counters;

    /// A 9B packet of `opcode` behind an LRH (BTH next) with the user ABI's 36-byte KDETH header, `payload`
    /// bytes and `pad` bytes of pad.
    fn packet(opcode: u8, payload: usize, pad: u8) -> WirePacket {
        let mut b = vec![0u8; 8 + BTH_BYTES + USER_KDETH_HEADER_BYTES];
        b[1] = 0x2;
        b[8] = opcode;
        b[9] = pad << 4;
        b.resize(b.len() + payload + usize::from(pad), 0);
        WirePacket::seal(b, false, false).unwrap()
    }

    #[test]
    fn sdma_packets_count_as_a_users_by_their_kdeth_opcode() {
        // (opcode, payload, pad, user?): the ends of the user KDETH range (user_sdma.c: & 0xC0 == 0xC0), the
        // kernel's TID RDMA WRITE DATA (0xE2) and a UD SEND_ONLY (0x64).
        let table = [(0xC0, 4096, 0, true), (0xDF, 1021, 3, true), (0xE2, 4096, 0, false), (0x64, 256, 0, false)];
        for (opcode, payload, pad, user) in table {
            let c = Counters::default();
            count_user_sdma(&c, &packet(opcode, payload, pad));
            let want = if user { (1, payload as u64) } else { (0, 0) };
            assert_eq!((c.sdma_user_packets.load(Relaxed), c.sdma_user_bytes.load(Relaxed)), want, "{opcode:#x}");
        }
    }
}
