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

#![forbid(unsafe_code)]

use std::collections::VecDeque;

use super::csr::*;
use super::WfrShape;

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

// SEND_CTXT_CTRL.
pub const SEND_CTXT_CTRL_CTXT_ENABLE_SMASK: u64 = 0x1;
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
    /// A packet: its PBC and the bytes after it, up to the PBC length.
    Packet { pbc: u64, body: Vec<u8> },
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
    /// Blocks freed since init, mod 2048 (the credit counter).
    free: u64,
    generation: u64,
}

impl Ctxt {
    fn depth(&self) -> usize {
        (((self.ctrl >> SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT) & SEND_CTXT_CTRL_CTXT_DEPTH_MASK) as usize)
            .min(MAX_RING_BLOCKS)
    }
    fn enabled(&self) -> bool {
        self.ctrl & SEND_CTXT_CTRL_CTXT_ENABLE_SMASK != 0
    }
    /// sc_enable's PIO init: the ring empties and the counter restarts at 0.
    fn init(&mut self) {
        self.blocks = Vec::new();
        self.written = Vec::new();
        self.sop = Vec::new();
        self.head = 0;
        self.free = 0;
        self.generation += 1;
    }
}

/// The send contexts of one chip.
#[derive(Debug)]
pub struct Pio {
    ctxts: Vec<Ctxt>,
    launches: VecDeque<Launch>,
    counters: PioCounters,
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
    );
    (claimed && ctxt < u64::from(contexts)).then_some((ctxt as usize, reg))
}

impl Pio {
    pub fn new(shape: &WfrShape) -> Self {
        Pio {
            ctxts: (0..shape.send_contexts).map(|_| Ctxt::default()).collect(),
            launches: VecDeque::new(),
            counters: PioCounters::default(),
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
                if rising {
                    self.launches.push_back(Launch { ctxt: c as u32, generation, blocks: 0, kind: LaunchKind::Force });
                }
            }
            _ => {} // CREDIT_STATUS is read-only
        }
        true
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
    /// launched.
    pub fn buffer_write(&mut self, rel: u64, value: u64) -> bool {
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
        if ctxt.blocks.len() != depth {
            ctxt.blocks = vec![[0; BLOCK_QWS]; depth];
            ctxt.written = vec![0; depth];
            ctxt.sop = vec![false; depth];
            ctxt.head %= depth;
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
            if depth == 0 || ctxt.written[head] != ALL_QWS {
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
            let ring: Vec<usize> = (0..nblocks).map(|i| (head + i) % depth).collect();
            // The packet launches once all its blocks are complete.
            if ring[1..].iter().any(|&b| ctxt.written[b] != ALL_QWS) {
                return any;
            }
            let mut packet = Vec::with_capacity(nblocks * PIO_BLOCK_SIZE as usize);
            for &b in &ring {
                packet.extend(ctxt.blocks[b].iter().flat_map(|q| q.to_le_bytes()));
                ctxt.written[b] = 0;
                ctxt.sop[b] = false;
            }
            packet.truncate(bytes);
            let body = packet.split_off(PBC_BYTES);
            ctxt.head = (head + nblocks) % depth;
            self.counters.packets += 1;
            self.launches.push_back(Launch {
                ctxt: c as u32,
                generation,
                blocks: nblocks as u16,
                kind: LaunchKind::Packet { pbc, body },
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
        let generation = ctxt.generation;
        self.launches.push_back(Launch { ctxt: c as u32, generation, blocks: n as u16, kind: LaunchKind::Discarded });
    }

    /// Launches the worker has not taken yet.
    pub fn take_launches(&mut self) -> Vec<Launch> {
        self.launches.drain(..).collect()
    }

    pub fn pending(&self) -> bool {
        !self.launches.is_empty()
    }

    /// The worker sent (or dropped) `launch`: its blocks are free. The credit return to DMA, unless the
    /// context was initialised since (its counter restarted) or has no return address.
    pub fn returned(&mut self, launch: &Launch) -> Option<CreditReturn> {
        let ctxt = self.ctxts.get_mut(launch.ctxt as usize)?;
        if ctxt.generation != launch.generation {
            return None;
        }
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
        let active: Vec<_> = self
            .ctxts
            .iter()
            .enumerate()
            .filter(|(_, x)| x.enabled())
            .map(|(i, x)| {
                serde_json::json!({"hw_ctxt": i, "depth": x.depth(), "head": x.head, "free": x.free,
                                   "credit_addr": format!("{:#x}", x.credit_addr)})
            })
            .collect();
        serde_json::json!({
            "packets": c.packets, "writes_disabled": c.writes_disabled,
            "writes_out_of_bounds": c.writes_out_of_bounds, "bad_sop": c.bad_sop, "bad_length": c.bad_length,
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

    /// sc_alloc and sc_enable for context 5 with `depth` credits and the credit-return array at 0x10000.
    fn pio(depth: u64, credit_intr: bool) -> Pio {
        let mut p = Pio::new(&WfrShape::default());
        assert!(p.write(csr(SEND_CTXT_CTRL), depth << SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT));
        p.write(csr(SEND_CTXT_CREDIT_RETURN_ADDR), 0x10000);
        let intr = if credit_intr { SEND_CTXT_CREDIT_CTRL_CREDIT_INTR_SMASK } else { 0 };
        p.write(csr(SEND_CTXT_CREDIT_CTRL), intr | (depth / 2));
        p.init(SEND_PIO_INIT_CTXT_PIO_SINGLE_CTXT_INIT_SMASK | (CTXT << SEND_PIO_INIT_CTXT_PIO_CTXT_NUM_SHIFT));
        p.write(csr(SEND_CTXT_CTRL), (depth << SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT) | SEND_CTXT_CTRL_CTXT_ENABLE_SMASK);
        p
    }

    /// pio_copy of a packet whose PBC says `dws` dwords, starting at ring block `start`: the SOP block
    /// through the alias, the rest plain, wrapping at `depth`, each block padded to 8 qwords.
    fn copy(p: &mut Pio, start: usize, depth: usize, dws: u64) {
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
            p.buffer_write(at, value);
        }
    }

    #[test]
    fn a_packet_launches_when_its_last_block_is_complete_and_returns_its_credits() {
        let mut p = pio(16, true);
        // 2 dwords PBC + 28 bytes of header + 256 of MAD: 73 dwords, 5 blocks.
        copy(&mut p, 0, 16, 73);
        let l = p.take_launches();
        assert_eq!(l.len(), 1);
        let LaunchKind::Packet { pbc, body } = &l[0].kind else { panic!("{l:?}") };
        assert_eq!((*pbc, body.len(), l[0].blocks), (73, 73 * 4 - 8, 5));
        assert_eq!(&body[0..8], &0x1111_0001u64.to_le_bytes());
        let cr = p.returned(&l[0]).unwrap();
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
        let mut p = pio(8, false);
        // Packet 2 (blocks 3..5) is written before packet 1 (blocks 0..2).
        copy(&mut p, 3, 8, 40);
        assert!(p.take_launches().is_empty());
        copy(&mut p, 0, 8, 40);
        let l = p.take_launches();
        assert_eq!(l.iter().map(|x| x.blocks).collect::<Vec<_>>(), vec![3, 3]);
    }

    #[test]
    fn a_packet_wraps_at_the_ring_end() {
        let mut p = pio(8, false);
        copy(&mut p, 0, 8, 96); // 6 blocks
        let first = p.take_launches();
        p.returned(&first[0]);
        copy(&mut p, 6, 8, 64); // blocks 6, 7, 0, 1
        let l = p.take_launches();
        assert_eq!(l.len(), 1);
        let LaunchKind::Packet { body, .. } = &l[0].kind else { panic!() };
        assert_eq!(body.len(), 64 * 4 - 8);
        assert_eq!(p.returned(&l[0]).unwrap().word & CR_COUNTER_MASK, 10);
    }

    #[test]
    fn pio_init_restarts_the_counter_and_voids_returns_of_the_old_ring() {
        let mut p = pio(8, false);
        copy(&mut p, 0, 8, 20);
        let old = p.take_launches();
        p.init(SEND_PIO_INIT_CTXT_PIO_ALL_CTXT_INIT_SMASK);
        assert_eq!(p.returned(&old[0]), None);
        copy(&mut p, 0, 8, 20); // 80 bytes: 2 blocks, counted from 0 again
        let l = p.take_launches();
        assert_eq!(p.returned(&l[0]).unwrap().word & CR_COUNTER_MASK, 2);
    }

    #[test]
    fn writes_a_context_cannot_take_are_dropped_and_counted() {
        let mut p = pio(8, false);
        // Context 6 is not enabled; block 8 is beyond context 5's ring.
        p.buffer_write(6 << PIO_ADDR_CONTEXT_SHIFT, 1);
        p.buffer_write((CTXT << PIO_ADDR_CONTEXT_SHIFT) + 8 * PIO_BLOCK_SIZE, 1);
        let c = p.counters();
        assert_eq!((c.writes_disabled, c.writes_out_of_bounds, c.packets), (1, 1, 0));
    }

    #[test]
    fn a_block_without_sop_or_with_a_bad_pbc_is_discarded_with_its_credit() {
        let mut p = pio(8, false);
        for q in 0..8 {
            p.buffer_write((CTXT << PIO_ADDR_CONTEXT_SHIFT) + q * 8, 7);
        }
        copy(&mut p, 1, 8, 0); // PBC length 0: one block
        let l = p.take_launches();
        assert_eq!(l.iter().map(|x| &x.kind).collect::<Vec<_>>(), vec![&LaunchKind::Discarded; 2]);
        let c = p.counters();
        assert_eq!((c.bad_sop, c.bad_length), (1, 1));
        p.returned(&l[0]);
        assert_eq!(p.returned(&l[1]).unwrap().word, 2 | CR_CREDIT_RETURN_DUE_TO_ERR_SMASK);
    }

    #[test]
    fn a_rising_force_queues_a_return_of_the_counter() {
        let mut p = pio(8, true);
        p.write(csr(SEND_CTXT_CREDIT_FORCE), 1);
        p.write(csr(SEND_CTXT_CREDIT_FORCE), 1);
        p.write(csr(SEND_CTXT_CREDIT_FORCE), 0);
        let l = p.take_launches();
        assert_eq!(l.len(), 1);
        assert_eq!(p.returned(&l[0]).unwrap().word, CR_CREDIT_RETURN_DUE_TO_FORCE_SMASK);
    }
}
