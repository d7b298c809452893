//! PIO send contexts: the 32 MiB send-buffer area at TXE_PIO_SEND that the driver fills with `writeq`s of
//! 64-byte blocks (pio_copy.c), the per-context CSRs that shape each ring, and credit return
//! (docs/hfi1-fabric.md, "PIO").
//!
//! Each hardware context has a 64 KiB window at `(hw_context & 0xff) << 16` (pio.c sc_alloc), mirrored 16
//! MiB higher as the start-of-packet alias. Its ring is CTXT_DEPTH blocks; the driver fills blocks in ring
//! order, the first block of a packet through the SOP alias with the PBC in its first qword, and pads the
//! last block with zeros, so every block gets all 8 qwords. There is no doorbell: a packet launches once
//! every block from the ring head through its PBC length is complete, in ring order (different CPUs may
//! fill neighbouring packets at once). Launched packets wait for the engine's worker, which puts them on
//! the wire and returns their credits: the context's cumulative free counter DMA'd to its credit-return
//! slot (`addr + 8 * (hw_context & 7)`, pio.c cr_group_addresses) and, with CREDIT_INTR, the SendCredit
//! interrupt. Writes a context cannot take (disabled, beyond its ring) are dropped and counted.
//!
//! A launched block stays the chip's until its credit is returned: the driver writes only the blocks its
//! credits cover (pio.c sc_buffer_alloc: `credits - (fill - free)`, `free` from the returned counter). A
//! write to a block still held is the chip's WriteOverflow: dropped, SEND_CTXT_ERR_STATUS.PIO_WRITE_OVERFLOW
//! set, the context halted and its error interrupt raised (chip.c sc_err_status_flags, is_sendctxt_err_int)
//! until a PIO init (pio.c sc_enable). So a context has at most its ring's blocks waiting for the worker,
//! whatever the guest writes: the launch queue is bounded by the rings ([`MAX_QUEUED_PER_CONTEXT`]).
//!
//! A user context's packet must pass its send checks before it launches (`super::send_check`); one that
//! fails is dropped like a discarded block run and halts the context (DisallowedPacket), the chip personality
//! raising the error (`Wfr::disallowed_vectors`).

#![forbid(unsafe_code)]

use std::collections::VecDeque;

use super::csr::*;
use super::errs::ErrGroups;
use super::send_check::SendChecks;
use super::shape::IS_SENDCTXT_ERR_START;
use super::{Raised, WfrShape};

/// The SOP alias lies this far above each buffer (pio_copy.c SOP_DISTANCE: half of TXE_PIO_SIZE).
pub const SOP_DISTANCE: u64 = super::TXE_PIO_SIZE / 2;
/// A PIO block (PIO_BLOCK_SIZE) and its qwords.
pub const PIO_BLOCK_SIZE: u64 = 64;
const BLOCK_QWS: usize = (PIO_BLOCK_SIZE / 8) as usize;
const ALL_QWS: u8 = 0xFF;
/// Each context's address window (pio.c PIO_ADDR_CONTEXT_SHIFT / _MASK).
pub const PIO_ADDR_CONTEXT_SHIFT: u32 = 16;
pub const PIO_ADDR_CONTEXT_MASK: u64 = 0xFF;
/// Blocks a context's window can address: the most a ring can use.
pub const MAX_RING_BLOCKS: usize = (1 << PIO_ADDR_CONTEXT_SHIFT) / PIO_BLOCK_SIZE as usize;
/// Launches one context can have waiting for the worker: a block each at most (every launch frees at least
/// one, and only held blocks are launched), and one forced return (a rising edge while one waits adds none).
pub const MAX_QUEUED_PER_CONTEXT: usize = MAX_RING_BLOCKS + 1;

// SEND_CTXT_CTRL, _STATUS, _ERR_STATUS (chip_registers.h).
pub const SEND_CTXT_CTRL_CTXT_ENABLE_SMASK: u64 = 0x1;
pub const SEND_CTXT_STATUS_CTXT_HALTED_SMASK: u64 = 0x1;
pub const SEND_CTXT_ERR_STATUS_PIO_DISALLOWED_PACKET_ERR_SMASK: u64 = 0x2;
pub const SEND_CTXT_ERR_STATUS_PIO_WRITE_OVERFLOW_ERR_SMASK: u64 = 0x8;
pub const SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT: u32 = 48;
pub const SEND_CTXT_CTRL_CTXT_DEPTH_MASK: u64 = 0x7FF;
// SEND_CTXT_CREDIT_CTRL, _FORCE, _RETURN_ADDR, _STATUS.
pub const SEND_CTXT_CREDIT_CTRL_CREDIT_INTR_SMASK: u64 = 0x2_0000;
pub const SEND_CTXT_CREDIT_FORCE_FORCE_RETURN_SMASK: u64 = 0x1;
pub const SEND_CTXT_CREDIT_RETURN_ADDR_ADDRESS_SMASK: u64 = 0xFFFF_FFFF_FFC0;
pub const SEND_CTXT_CREDIT_STATUS_CURRENT_FREE_COUNTER_SHIFT: u32 = 32;
// SEND_PIO_INIT_CTXT.
pub const SEND_PIO_INIT_CTXT_PIO_ALL_CTXT_INIT_SMASK: u64 = 0x1;
pub const SEND_PIO_INIT_CTXT_PIO_SINGLE_CTXT_INIT_SMASK: u64 = 0x2;
pub const SEND_PIO_INIT_CTXT_PIO_CTXT_NUM_SHIFT: u32 = 8;
pub const SEND_PIO_INIT_CTXT_PIO_CTXT_NUM_MASK: u64 = 0xFF;

// The PBC (chip.h).
pub const PBC_LENGTH_DWS_MASK: u64 = 0xFFF;
pub const PBC_VL_SHIFT: u32 = 12;
pub const PBC_VL_MASK: u64 = 0xF;
pub const PBC_TEST_EBP: u64 = 1 << 29;
pub const PBC_PACKET_BYPASS: u64 = 1 << 28;
pub const PBC_DC_INFO: u64 = 1 << 30;
/// Bytes of the PBC in front of every packet.
pub const PBC_BYTES: usize = 8;

// The credit-return word (chip.h CR_*).
pub const CR_COUNTER_MASK: u64 = 0x7FF;
pub const CR_CREDIT_RETURN_DUE_TO_PBC_SMASK: u64 = 1 << 12;
pub const CR_CREDIT_RETURN_DUE_TO_ERR_SMASK: u64 = 1 << 14;
pub const CR_CREDIT_RETURN_DUE_TO_FORCE_SMASK: u64 = 1 << 15;
/// The credit-return slots are eight u64s per group (struct credit_return).
const CR_SLOTS: u64 = 8;

/// Per-context CSR spacing (write_kctxt_csr).
const STRIDE: u64 = 0x100;

/// What a context launched (or gave back), for the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub ctxt: u32,
    /// The context's init generation when the blocks were written: a return for an older one is void.
    pub generation: u64,
    /// The blocks freed by this launch.
    pub blocks: u16,
    pub kind: LaunchKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchKind {
    /// A packet: its PBC and the bytes after it, up to the PBC length; `user` if its context was a user's
    /// when it launched (jkey.rs).
    Packet { pbc: u64, body: Vec<u8>, user: bool },
    /// Blocks that held no packet (a bad PBC or a missing SOP): returned with the error reason.
    Discarded,
    /// A forced credit return (SEND_CTXT_CREDIT_FORCE): nothing freed, the counter reported.
    Force,
}

/// Where the worker writes a credit return, what, and whether it interrupts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreditReturn {
    pub ctxt: u32,
    pub addr: u64,
    pub word: u64,
    pub interrupt: bool,
}

/// Dropped writes and launches, by cause.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PioCounters {
    pub packets: u64,
    /// Writes to a context that does not exist or is not enabled.
    pub writes_disabled: u64,
    /// Writes beyond the context's ring.
    pub writes_out_of_bounds: u64,
    /// A complete block where a packet should start that was not written through the SOP alias.
    pub bad_sop: u64,
    /// A PBC whose length is 0 or longer than the ring.
    pub bad_length: u64,
    /// Writes to a block whose credit the chip has not returned yet (WriteOverflow: the context halts).
    pub writes_overflow: u64,
    /// Writes to a halted context.
    pub writes_halted: u64,
    /// Rising CREDIT_FORCE edges while a forced return was already waiting.
    pub forces_coalesced: u64,
    /// Packets of a user context that failed its checks (DisallowedPacket: dropped, the context halted).
    pub disallowed: u64,
}

#[derive(Debug, Default)]
struct Ctxt {
    ctrl: u64,
    credit_ctrl: u64,
    credit_addr: u64,
    force: u64,
    /// The ring, allocated on the first write after an enable: CTXT_DEPTH blocks (at most the window).
    blocks: Vec<[u64; BLOCK_QWS]>,
    written: Vec<u8>,
    sop: Vec<bool>,
    /// The next block to launch.
    head: usize,
    /// Blocks launched from this ring since init whose credits the worker has not returned: the ring
    /// positions just behind `head`, which the driver may not write yet.
    held: usize,
    /// Blocks of this context the worker has not returned, of any generation (an init recalls none).
    inflight: usize,
    /// A forced return waits for the worker.
    force_queued: bool,
    /// Halted by an error (SEND_CTXT_STATUS.CTXT_HALTED) until a PIO init.
    halted: bool,
    /// Blocks freed since init, mod 2048 (the credit counter).
    free: u64,
    generation: u64,
    /// The context's check registers, which the chip personality's storage holds (send_check.rs): they make it
    /// a user's (jkey.rs), whose packets are checked.
    checks: SendChecks,
}

impl Ctxt {
    fn depth(&self) -> usize {
        (((self.ctrl >> SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT) & SEND_CTXT_CTRL_CTXT_DEPTH_MASK) as usize)
            .min(MAX_RING_BLOCKS)
    }
    fn enabled(&self) -> bool {
        self.ctrl & SEND_CTXT_CTRL_CTXT_ENABLE_SMASK != 0
    }
    /// sc_enable's PIO init: the ring empties, the counter restarts at 0 and a halt clears (pio.c sc_enable).
    /// Blocks of the old ring still with the worker stay in `inflight`.
    fn init(&mut self) {
        self.blocks = Vec::new();
        self.written = Vec::new();
        self.sop = Vec::new();
        self.head = 0;
        self.held = 0;
        self.halted = false;
        self.free = 0;
        self.generation += 1;
    }

    /// Whether ring block `block` was launched and its credit not yet returned.
    fn holds(&self, block: usize) -> bool {
        let depth = self.blocks.len();
        depth != 0 && (self.head + depth - 1 - block) % depth < self.held
    }
}

/// The send contexts of one chip.
#[derive(Debug)]
pub struct Pio {
    ctxts: Vec<Ctxt>,
    launches: VecDeque<Launch>,
    counters: PioCounters,
    disallowed: Vec<(u32, u64)>,
}

/// The context and register of a per-context CSR this block claims.
fn ctxt_csr(offset: u64, contexts: u32) -> Option<(usize, u64)> {
    let rel = offset.checked_sub(SEND_CTXT_CTRL)?;
    let (ctxt, reg) = (rel / STRIDE, SEND_CTXT_CTRL + rel % STRIDE);
    let claimed = matches!(
        reg,
        SEND_CTXT_CTRL
            | SEND_CTXT_CREDIT_CTRL
            | SEND_CTXT_CREDIT_STATUS
            | SEND_CTXT_CREDIT_RETURN_ADDR
            | SEND_CTXT_CREDIT_FORCE
            | SEND_CTXT_STATUS
    );
    (claimed && ctxt < u64::from(contexts)).then_some((ctxt as usize, reg))
}

impl Pio {
    pub fn new(shape: &WfrShape) -> Self {
        Pio {
            ctxts: (0..shape.send_contexts).map(|_| Ctxt::default()).collect(),
            launches: VecDeque::new(),
            counters: PioCounters::default(),
            disallowed: Vec::new(),
        }
    }

    pub fn counters(&self) -> PioCounters {
        self.counters
    }

    pub fn read(&self, offset: u64) -> Option<u64> {
        let (c, reg) = ctxt_csr(offset, self.ctxts.len() as u32)?;
        let ctxt = &self.ctxts[c];
        Some(match reg {
            SEND_CTXT_CTRL => ctxt.ctrl,
            SEND_CTXT_CREDIT_CTRL => ctxt.credit_ctrl,
            SEND_CTXT_CREDIT_RETURN_ADDR => ctxt.credit_addr,
            SEND_CTXT_CREDIT_FORCE => ctxt.force,
            SEND_CTXT_STATUS => {
                if ctxt.halted {
                    SEND_CTXT_STATUS_CTXT_HALTED_SMASK
                } else {
                    0
                }
            }
            // Both counters: every freed block is returned at once.
            _ => (ctxt.free << SEND_CTXT_CREDIT_STATUS_CURRENT_FREE_COUNTER_SHIFT) | ctxt.free,
        })
    }

    /// A per-context CSR write; false if this block does not claim the offset.
    pub fn write(&mut self, offset: u64, value: u64) -> bool {
        let Some((c, reg)) = ctxt_csr(offset, self.ctxts.len() as u32) else { return false };
        let generation = self.ctxts[c].generation;
        let ctxt = &mut self.ctxts[c];
        match reg {
            SEND_CTXT_CTRL => {
                if value & SEND_CTXT_CTRL_CTXT_ENABLE_SMASK == 0 {
                    // Disabled: what was written and not launched is gone (sc_disable waits for egress first).
                    ctxt.blocks = Vec::new();
                    ctxt.written = Vec::new();
                    ctxt.sop = Vec::new();
                }
                ctxt.ctrl = value;
            }
            SEND_CTXT_CREDIT_CTRL => ctxt.credit_ctrl = value,
            SEND_CTXT_CREDIT_RETURN_ADDR => ctxt.credit_addr = value & SEND_CTXT_CREDIT_RETURN_ADDR_ADDRESS_SMASK,
            SEND_CTXT_CREDIT_FORCE => {
                // A 0 to 1 transition schedules a credit return (pio.c sc_return_credits).
                let rising = value & !ctxt.force & SEND_CTXT_CREDIT_FORCE_FORCE_RETURN_SMASK != 0;
                ctxt.force = value & SEND_CTXT_CREDIT_FORCE_FORCE_RETURN_SMASK;
                // One waiting return reports the counter as it is when the worker takes it.
                if rising && ctxt.force_queued {
                    self.counters.forces_coalesced += 1;
                } else if rising {
                    ctxt.force_queued = true;
                    self.launches.push_back(Launch { ctxt: c as u32, generation, blocks: 0, kind: LaunchKind::Force });
                }
            }
            _ => {} // CREDIT_STATUS and STATUS are read-only
        }
        true
    }

    /// Context `c`'s check registers (or SEND_BTH_QP) were written.
    pub fn set_checks(&mut self, c: usize, checks: SendChecks) {
        if let Some(ctxt) = self.ctxts.get_mut(c) {
            ctxt.checks = checks;
        }
    }

    /// Contexts halted by a disallowed packet since the last call, with the SEND_EGRESS_ERR_INFO bit of the
    /// check it failed: at most one per context, as a halted context launches nothing.
    pub fn take_disallowed(&mut self) -> Vec<(u32, u64)> {
        std::mem::take(&mut self.disallowed)
    }

    /// SEND_PIO_INIT_CTXT: one context (sc_enable) or all (pio_reset_all).
    pub fn init(&mut self, value: u64) {
        if value & SEND_PIO_INIT_CTXT_PIO_ALL_CTXT_INIT_SMASK != 0 {
            self.ctxts.iter_mut().for_each(Ctxt::init);
        } else if value & SEND_PIO_INIT_CTXT_PIO_SINGLE_CTXT_INIT_SMASK != 0 {
            let c = ((value >> SEND_PIO_INIT_CTXT_PIO_CTXT_NUM_SHIFT) & SEND_PIO_INIT_CTXT_PIO_CTXT_NUM_MASK) as usize;
            if let Some(ctxt) = self.ctxts.get_mut(c) {
                ctxt.init();
            }
        }
    }

    /// A qword written at `rel`, the offset in the PIO area (0 up to TXE_PIO_SIZE). Returns whether packets
    /// launched. A write to a held block halts the context with its error bit in `errs` and its error
    /// interrupt in `raised`.
    pub fn buffer_write(&mut self, rel: u64, value: u64, errs: &mut ErrGroups, raised: &mut Raised) -> bool {
        let sop = rel >= SOP_DISTANCE;
        let rel = rel % SOP_DISTANCE;
        let c = ((rel >> PIO_ADDR_CONTEXT_SHIFT) & PIO_ADDR_CONTEXT_MASK) as usize;
        let within = rel & ((1 << PIO_ADDR_CONTEXT_SHIFT) - 1);
        let (block, qw) = ((within / PIO_BLOCK_SIZE) as usize, ((within % PIO_BLOCK_SIZE) / 8) as usize);
        let Some(ctxt) = self.ctxts.get_mut(c).filter(|x| x.enabled()) else {
            self.counters.writes_disabled += 1;
            return false;
        };
        let depth = ctxt.depth();
        if block >= depth {
            self.counters.writes_out_of_bounds += 1;
            return false;
        }
        if ctxt.halted {
            self.counters.writes_halted += 1;
            return false;
        }
        if ctxt.blocks.len() != depth {
            ctxt.blocks = vec![[0; BLOCK_QWS]; depth];
            ctxt.written = vec![0; depth];
            ctxt.sop = vec![false; depth];
            ctxt.head %= depth;
        }
        if ctxt.holds(block) {
            // chip.c sc_err_status_flags "WriteOverflow": SEC_WRITE_DROPPED | SEC_SC_HALTED.
            self.counters.writes_overflow += 1;
            ctxt.halted = true;
            errs.set(SEND_CTXT_ERR_STATUS + STRIDE * c as u64, SEND_CTXT_ERR_STATUS_PIO_WRITE_OVERFLOW_ERR_SMASK);
            raised.raise(IS_SENDCTXT_ERR_START + c as u32);
            return false;
        }
        ctxt.blocks[block][qw] = value;
        ctxt.written[block] |= 1 << qw;
        if sop {
            ctxt.sop[block] = true;
        }
        self.launch(c)
    }

    /// Launches every complete packet at the ring head of context `c`, in ring order.
    fn launch(&mut self, c: usize) -> bool {
        let mut any = false;
        loop {
            let ctxt = &mut self.ctxts[c];
            let depth = ctxt.blocks.len();
            let head = ctxt.head;
            if depth == 0 || ctxt.halted || ctxt.written[head] != ALL_QWS {
                return any;
            }
            // The old ring's blocks still with the worker take room too (an init came since); this waits
            // for their return.
            if ctxt.inflight >= depth {
                return any;
            }
            let generation = ctxt.generation;
            if !ctxt.sop[head] {
                self.counters.bad_sop += 1;
                self.discard(c, 1);
                any = true;
                continue;
            }
            let pbc = ctxt.blocks[head][0];
            let bytes = ((pbc & PBC_LENGTH_DWS_MASK) * 4) as usize;
            let nblocks = bytes.div_ceil(PIO_BLOCK_SIZE as usize);
            if bytes < PBC_BYTES || nblocks > depth {
                self.counters.bad_length += 1;
                self.discard(c, 1);
                any = true;
                continue;
            }
            if ctxt.inflight + nblocks > depth {
                return any;
            }
            let ring: Vec<usize> = (0..nblocks).map(|i| (head + i) % depth).collect();
            // The packet launches once all its blocks are complete.
            if ring[1..].iter().any(|&b| ctxt.written[b] != ALL_QWS) {
                return any;
            }
            let mut packet = Vec::with_capacity(nblocks * PIO_BLOCK_SIZE as usize);
            for &b in &ring {
                packet.extend(ctxt.blocks[b].iter().flat_map(|q| q.to_le_bytes()));
            }
            packet.truncate(bytes);
            let body = packet.split_off(PBC_BYTES);
            let user = ctxt.checks.user();
            let (vl, bypass) = ((pbc >> PBC_VL_SHIFT) & PBC_VL_MASK, pbc & PBC_PACKET_BYPASS != 0);
            if let Err(info) = if user { ctxt.checks.check(vl, bypass, &body) } else { Ok(()) } {
                // DisallowedPacket: SEC_PACKET_DROPPED | SEC_SC_HALTED (chip.c sc_err_status_flags).
                ctxt.halted = true;
                self.counters.disallowed += 1;
                self.disallowed.push((c as u32, info));
                self.discard(c, nblocks);
                return true;
            }
            for &b in &ring {
                ctxt.written[b] = 0;
                ctxt.sop[b] = false;
            }
            ctxt.head = (head + nblocks) % depth;
            ctxt.held += nblocks;
            ctxt.inflight += nblocks;
            self.counters.packets += 1;
            self.launches.push_back(Launch {
                ctxt: c as u32,
                generation,
                blocks: nblocks as u16,
                kind: LaunchKind::Packet { pbc, body, user },
            });
            any = true;
        }
    }

    /// Gives back `n` blocks at the head of context `c` that held no packet.
    fn discard(&mut self, c: usize, n: usize) {
        let ctxt = &mut self.ctxts[c];
        let depth = ctxt.blocks.len();
        for i in 0..n {
            let b = (ctxt.head + i) % depth;
            ctxt.written[b] = 0;
            ctxt.sop[b] = false;
        }
        ctxt.head = (ctxt.head + n) % depth;
        ctxt.held += n;
        ctxt.inflight += n;
        let generation = ctxt.generation;
        self.launches.push_back(Launch { ctxt: c as u32, generation, blocks: n as u16, kind: LaunchKind::Discarded });
    }

    /// Launches the worker has not taken yet.
    pub fn take_launches(&mut self) -> Vec<Launch> {
        let taken: Vec<Launch> = self.launches.drain(..).collect();
        for l in taken.iter().filter(|l| l.kind == LaunchKind::Force) {
            if let Some(ctxt) = self.ctxts.get_mut(l.ctxt as usize) {
                ctxt.force_queued = false;
            }
        }
        taken
    }

    /// Launches waiting for the worker, and the packet bytes they hold: at most [`MAX_QUEUED_PER_CONTEXT`]
    /// launches and [`MAX_RING_BLOCKS`] blocks of bytes per context.
    pub fn queued(&self) -> (usize, usize) {
        let bytes =
            self.launches.iter().map(|l| if let LaunchKind::Packet { body, .. } = &l.kind { body.len() } else { 0 });
        (self.launches.len(), bytes.sum())
    }

    pub fn pending(&self) -> bool {
        !self.launches.is_empty()
    }

    /// The worker sent (or dropped) `launch`: its blocks are free. The credit return to DMA, unless the
    /// context was initialised since (its counter restarted) or has no return address.
    pub fn returned(&mut self, launch: &Launch) -> Option<CreditReturn> {
        let c = launch.ctxt as usize;
        let ctxt = self.ctxts.get_mut(c)?;
        let blocks = usize::from(launch.blocks);
        ctxt.inflight = ctxt.inflight.saturating_sub(blocks);
        if ctxt.generation != launch.generation {
            // A packet the new ring completed may have waited for this room.
            self.launch(c);
            return None;
        }
        ctxt.held = ctxt.held.saturating_sub(blocks);
        ctxt.free = (ctxt.free + u64::from(launch.blocks)) & CR_COUNTER_MASK;
        let reason = match launch.kind {
            LaunchKind::Packet { .. } => CR_CREDIT_RETURN_DUE_TO_PBC_SMASK,
            LaunchKind::Discarded => CR_CREDIT_RETURN_DUE_TO_ERR_SMASK,
            LaunchKind::Force => CR_CREDIT_RETURN_DUE_TO_FORCE_SMASK,
        };
        (ctxt.credit_addr != 0).then(|| CreditReturn {
            ctxt: launch.ctxt,
            addr: ctxt.credit_addr + 8 * (u64::from(launch.ctxt) % CR_SLOTS),
            word: ctxt.free | reason,
            interrupt: ctxt.credit_ctrl & SEND_CTXT_CREDIT_CTRL_CREDIT_INTR_SMASK != 0,
        })
    }

    pub fn dump(&self) -> serde_json::Value {
        let c = self.counters;
        let (queued, queued_bytes) = self.queued();
        let active: Vec<_> = self
            .ctxts
            .iter()
            .enumerate()
            .filter(|(_, x)| x.enabled())
            .map(|(i, x)| {
                serde_json::json!({"hw_ctxt": i, "depth": x.depth(), "head": x.head, "free": x.free,
                                   "held": x.held, "inflight": x.inflight, "halted": x.halted,
                                   "credit_addr": format!("{:#x}", x.credit_addr)})
            })
            .collect();
        serde_json::json!({
            "packets": c.packets, "writes_disabled": c.writes_disabled,
            "writes_out_of_bounds": c.writes_out_of_bounds, "bad_sop": c.bad_sop, "bad_length": c.bad_length,
            "writes_overflow": c.writes_overflow, "writes_halted": c.writes_halted,
            "forces_coalesced": c.forces_coalesced, "disallowed": c.disallowed, "queued_launches": queued, "queued_bytes": queued_bytes,
            "enabled_contexts": active,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CTXT: u64 = 5;

    fn csr(reg: u64) -> u64 {
        reg + STRIDE * CTXT
    }

    /// The send contexts with the error groups and interrupt sources their writes reach.
    struct Rig {
        p: Pio,
        errs: ErrGroups,
        raised: Vec<u32>,
    }

    impl Rig {
        fn put(&mut self, at: u64, value: u64) {
            let mut raised = Raised::default();
            self.p.buffer_write(at, value, &mut self.errs, &mut raised);
            self.raised.extend(raised.0);
        }
        fn err_status(&self) -> u64 {
            self.errs.read(SEND_CTXT_ERR_STATUS + STRIDE * CTXT).unwrap()
        }
        fn halted(&self) -> bool {
            self.p.read(csr(SEND_CTXT_STATUS)).unwrap() & SEND_CTXT_STATUS_CTXT_HALTED_SMASK != 0
        }
        /// sc_enable: PIO init of the context, then enabled with `depth` credits.
        fn enable(&mut self, depth: u64) {
            self.p
                .init(SEND_PIO_INIT_CTXT_PIO_SINGLE_CTXT_INIT_SMASK | (CTXT << SEND_PIO_INIT_CTXT_PIO_CTXT_NUM_SHIFT));
            let ctrl = (depth << SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT) | SEND_CTXT_CTRL_CTXT_ENABLE_SMASK;
            self.p.write(csr(SEND_CTXT_CTRL), ctrl);
        }
    }

    /// sc_alloc and sc_enable for context 5 with `depth` credits and the credit-return array at 0x10000.
    fn pio(depth: u64, credit_intr: bool) -> Rig {
        let mut p = Pio::new(&WfrShape::default());
        assert!(p.write(csr(SEND_CTXT_CTRL), depth << SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT));
        p.write(csr(SEND_CTXT_CREDIT_RETURN_ADDR), 0x10000);
        let intr = if credit_intr { SEND_CTXT_CREDIT_CTRL_CREDIT_INTR_SMASK } else { 0 };
        p.write(csr(SEND_CTXT_CREDIT_CTRL), intr | (depth / 2));
        let mut rig = Rig { p, errs: ErrGroups::default(), raised: Vec::new() };
        rig.enable(depth);
        rig
    }

    /// pio_copy of a packet whose PBC says `dws` dwords, starting at ring block `start`: the SOP block
    /// through the alias, the rest plain, wrapping at `depth`, each block padded to 8 qwords.
    fn copy(r: &mut Rig, start: usize, depth: usize, dws: u64) {
        let base = CTXT << PIO_ADDR_CONTEXT_SHIFT;
        let qwords = (dws * 4).div_ceil(8);
        let blocks = (dws * 4).div_ceil(64).max(1);
        for q in 0..blocks * 8 {
            let block = (start + (q / 8) as usize) % depth;
            let at = base + block as u64 * PIO_BLOCK_SIZE + (q % 8) * 8 + if q < 8 { SOP_DISTANCE } else { 0 };
            let value = match q {
                0 => dws,
                q if q < qwords => 0x1111_0000 + q,
                _ => 0,
            };
            r.put(at, value);
        }
    }

    #[test]
    fn a_packet_launches_when_its_last_block_is_complete_and_returns_its_credits() {
        let mut r = pio(16, true);
        // 2 dwords PBC + 28 bytes of header + 256 of MAD: 73 dwords, 5 blocks.
        copy(&mut r, 0, 16, 73);
        let l = r.p.take_launches();
        assert_eq!(l.len(), 1);
        let LaunchKind::Packet { pbc, body, .. } = &l[0].kind else { panic!("{l:?}") };
        assert_eq!((*pbc, body.len(), l[0].blocks), (73, 73 * 4 - 8, 5));
        assert_eq!(&body[0..8], &0x1111_0001u64.to_le_bytes());
        let cr = r.p.returned(&l[0]).unwrap();
        assert_eq!(
            cr,
            CreditReturn {
                ctxt: 5,
                addr: 0x10000 + 8 * 5,
                word: 5 | CR_CREDIT_RETURN_DUE_TO_PBC_SMASK,
                interrupt: true
            }
        );
    }

    #[test]
    fn packets_launch_in_ring_order_even_when_a_later_one_completes_first() {
        let mut r = pio(8, false);
        // Packet 2 (blocks 3..5) is written before packet 1 (blocks 0..2).
        copy(&mut r, 3, 8, 40);
        assert!(r.p.take_launches().is_empty());
        copy(&mut r, 0, 8, 40);
        let l = r.p.take_launches();
        assert_eq!(l.iter().map(|x| x.blocks).collect::<Vec<_>>(), vec![3, 3]);
    }

    #[test]
    fn a_packet_wraps_at_the_ring_end() {
        let mut r = pio(8, false);
        copy(&mut r, 0, 8, 96); // 6 blocks
        let first = r.p.take_launches();
        r.p.returned(&first[0]);
        copy(&mut r, 6, 8, 64); // blocks 6, 7, 0, 1
        let l = r.p.take_launches();
        assert_eq!(l.len(), 1);
        let LaunchKind::Packet { body, .. } = &l[0].kind else { panic!() };
        assert_eq!(body.len(), 64 * 4 - 8);
        assert_eq!(r.p.returned(&l[0]).unwrap().word & CR_COUNTER_MASK, 10);
    }

    #[test]
    fn pio_init_restarts_the_counter_and_voids_returns_of_the_old_ring() {
        let mut r = pio(8, false);
        copy(&mut r, 0, 8, 20);
        let old = r.p.take_launches();
        r.p.init(SEND_PIO_INIT_CTXT_PIO_ALL_CTXT_INIT_SMASK);
        assert_eq!(r.p.returned(&old[0]), None);
        copy(&mut r, 0, 8, 20); // 80 bytes: 2 blocks, counted from 0 again
        let l = r.p.take_launches();
        assert_eq!(r.p.returned(&l[0]).unwrap().word & CR_COUNTER_MASK, 2);
    }

    #[test]
    fn writes_a_context_cannot_take_are_dropped_and_counted() {
        let mut r = pio(8, false);
        // Context 6 is not enabled; block 8 is beyond context 5's ring.
        r.put(6 << PIO_ADDR_CONTEXT_SHIFT, 1);
        r.put((CTXT << PIO_ADDR_CONTEXT_SHIFT) + 8 * PIO_BLOCK_SIZE, 1);
        let c = r.p.counters();
        assert_eq!((c.writes_disabled, c.writes_out_of_bounds, c.packets), (1, 1, 0));
    }

    #[test]
    fn a_block_without_sop_or_with_a_bad_pbc_is_discarded_with_its_credit() {
        let mut r = pio(8, false);
        for q in 0..8 {
            r.put((CTXT << PIO_ADDR_CONTEXT_SHIFT) + q * 8, 7);
        }
        copy(&mut r, 1, 8, 0); // PBC length 0: one block
        let l = r.p.take_launches();
        assert_eq!(l.iter().map(|x| &x.kind).collect::<Vec<_>>(), vec![&LaunchKind::Discarded; 2]);
        let c = r.p.counters();
        assert_eq!((c.bad_sop, c.bad_length), (1, 1));
        r.p.returned(&l[0]);
        assert_eq!(r.p.returned(&l[1]).unwrap().word, 2 | CR_CREDIT_RETURN_DUE_TO_ERR_SMASK);
    }

    #[test]
    fn a_rising_force_queues_a_return_of_the_counter() {
        let mut r = pio(8, true);
        r.p.write(csr(SEND_CTXT_CREDIT_FORCE), 1);
        r.p.write(csr(SEND_CTXT_CREDIT_FORCE), 1);
        r.p.write(csr(SEND_CTXT_CREDIT_FORCE), 0);
        let l = r.p.take_launches();
        assert_eq!(l.len(), 1);
        assert_eq!(r.p.returned(&l[0]).unwrap().word, CR_CREDIT_RETURN_DUE_TO_FORCE_SMASK);
    }

    #[test]
    fn a_guest_ignoring_credits_queues_at_most_its_ring_and_the_next_write_overflows_and_halts() {
        // (ring depth, packet dwords, rounds of the whole ring written while the worker takes nothing,
        //  launches the ring holds: blocks / blocks per packet).
        let table: [(u64, u64, usize, usize); 4] =
            [(8, 16, 4, 8), (16, 73, 3, 3), (13, 40, 5, 4), (MAX_RING_BLOCKS as u64, 2, 2, MAX_RING_BLOCKS)];
        for (depth, dws, rounds, held) in table {
            let mut r = pio(depth, true);
            let per = (dws * 4).div_ceil(PIO_BLOCK_SIZE) as usize;
            let d = depth as usize;
            for n in 0..rounds * d / per {
                copy(&mut r, n * per % d, d, dws);
            }
            let (queued, bytes) = r.p.queued();
            let c = r.p.counters();
            let case = format!("depth {depth}, {dws} dwords, {rounds} rounds");
            assert_eq!(queued, held, "{case}: the held blocks' packets, no more");
            assert!(queued <= MAX_QUEUED_PER_CONTEXT && bytes <= d * PIO_BLOCK_SIZE as usize, "{case}");
            assert_eq!(c.packets as usize, held, "{case}");
            // The first write past the held ring is WriteOverflow (chip.c sc_err_status_flags): the write is
            // dropped, the context halts, its error interrupt (IS_SENDCTXT_ERR_START + hw context) is raised
            // once, and every later write is dropped.
            assert_eq!(c.writes_overflow, 1, "{case}");
            assert!(c.writes_halted > 0, "{case}");
            assert_eq!(r.err_status(), SEND_CTXT_ERR_STATUS_PIO_WRITE_OVERFLOW_ERR_SMASK, "{case}");
            assert_eq!(r.raised, vec![IS_SENDCTXT_ERR_START + CTXT as u32], "{case}");
            assert!(r.halted(), "{case}: sc_restart waits for SEND_CTXT_STATUS.CTXT_HALTED");
        }
    }

    #[test]
    fn a_driver_that_waits_for_its_credits_never_overflows() {
        // sc_buffer_alloc: a packet is written only once `credits - (fill - free)` covers it. The worker returns
        // the oldest launch whenever the ring lacks room; the ring wraps many times.
        let (depth, dws) = (8usize, 40u64); // 3-block packets on an 8-block ring
        let per = 3;
        let mut r = pio(depth as u64, false);
        let (mut fill, mut free) = (0usize, 0usize);
        let mut waiting = VecDeque::new();
        for _ in 0..50 {
            while depth - (fill - free) < per {
                let l: Launch = waiting.pop_front().expect("a launch holds the missing credits");
                // 150 blocks in all: the counter (mod 2048) does not wrap.
                free = (r.p.returned(&l).unwrap().word & CR_COUNTER_MASK) as usize;
            }
            copy(&mut r, fill % depth, depth, dws);
            fill += per;
            waiting.extend(r.p.take_launches());
        }
        let c = r.p.counters();
        assert_eq!((c.packets, c.writes_overflow, c.writes_halted), (50, 0, 0));
        assert!(!r.halted());
    }

    #[test]
    fn an_init_with_the_old_ring_still_at_the_worker_launches_only_into_the_room_returns_leave() {
        let mut r = pio(8, false);
        for b in 0..8 {
            copy(&mut r, b, 8, 16);
        }
        let old = r.p.take_launches();
        assert_eq!(old.len(), 8);
        // sc_restart/sc_enable while the worker still has the old ring: the new ring is written whole.
        r.enable(8);
        for b in 0..8 {
            copy(&mut r, b, 8, 16);
        }
        assert_eq!(r.p.queued().0, 0, "the old ring's 8 blocks take the context's room until returned");
        // Each return of the old ring makes room for one waiting packet of the new one, and reports nothing.
        for (i, l) in old.iter().enumerate() {
            assert_eq!(r.p.returned(l), None);
            assert_eq!(r.p.queued().0, i + 1);
        }
        let c = r.p.counters();
        assert_eq!((c.packets, c.writes_overflow), (16, 0));
    }

    #[test]
    fn force_edges_coalesce_while_a_forced_return_waits() {
        // (CREDIT_FORCE writes, forced returns the worker takes after them, edges coalesced).
        let table: [(&[u64], usize, u64); 4] =
            [(&[1], 1, 0), (&[1, 1, 1], 1, 0), (&[1, 0, 1, 0, 1], 1, 2), (&[0, 1, 0, 1, 0, 1, 0, 1], 1, 3)];
        for (writes, taken, coalesced) in table {
            let mut r = pio(8, false);
            for &v in writes {
                r.p.write(csr(SEND_CTXT_CREDIT_FORCE), v);
            }
            assert!(r.p.queued().0 <= 1, "{writes:?}");
            assert_eq!(r.p.take_launches().len(), taken, "{writes:?}");
            assert_eq!(r.p.counters().forces_coalesced, coalesced, "{writes:?}");
            // Once the worker took it, the next edge queues a return again.
            r.p.write(csr(SEND_CTXT_CREDIT_FORCE), 0);
            r.p.write(csr(SEND_CTXT_CREDIT_FORCE), 1);
            assert_eq!(r.p.take_launches().len(), 1, "{writes:?}");
        }
    }

    #[test]
    fn a_halted_context_drops_writes_until_a_pio_init_restarts_it() {
        let mut r = pio(4, false);
        for b in 0..5 {
            copy(&mut r, b % 4, 4, 16);
        }
        assert!(r.halted());
        let launches = r.p.take_launches();
        for l in &launches {
            r.p.returned(l);
        }
        // Credits back do not end a halt: only sc_restart's disable and sc_enable (PIO init) do.
        copy(&mut r, 0, 4, 16);
        assert!(r.halted() && r.p.queued().0 == 0);
        r.p.write(csr(SEND_CTXT_CTRL), 4 << SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT);
        r.enable(4);
        assert!(!r.halted());
        copy(&mut r, 0, 4, 16);
        assert_eq!(r.p.queued().0, 1);
        assert_eq!(r.p.counters().writes_overflow, 1);
    }
}
