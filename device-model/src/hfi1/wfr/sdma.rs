//! SDMA engines: each a ring of 16-byte descriptors in host memory that the driver fills and hands over by
//! writing SEND_DMA_TAIL; the engine gathers each packet (FIRST through LAST descriptor), sends it, moves
//! SEND_DMA_HEAD past it, writes the head back to host memory where a descriptor asks, and interrupts
//! (docs/hfi1-fabric.md, "SDMA"). This module keeps the engines' registers and state; the engine's worker
//! walks the ring (`hfi1::sdma_walk`) and reports back through [`Sdma::advance`] and [`Sdma::fail`].
//!
//! The halt and clean-up handshake the driver's state machine runs at start-up and after every error
//! (sdma.c): HALT stops the engine, which reports a halt error on its SDMAENG_ERR interrupt
//! (s10_hw_start_up_halt_wait waits for it); CLEANUP is a pulse that empties the halted engine, puts its head
//! back to 0 and reports ENG_CLEANED_UP (polled with no timeout in sdma_hw_clean_up_task).

#![forbid(unsafe_code)]

use super::csr::*;
use super::errs::ErrGroups;
use super::{Raised, WfrShape, IS_SDMAENG_ERR_START};

pub const SEND_DMA_CTRL_SDMA_ENABLE_SMASK: u64 = 0x1;
pub const SEND_DMA_CTRL_SDMA_HALT_SMASK: u64 = 0x2;
pub const SEND_DMA_CTRL_SDMA_CLEANUP_SMASK: u64 = 0x4;
pub const SEND_DMA_CTRL_SDMA_INT_ENABLE_SMASK: u64 = 0x8;
pub const SEND_DMA_STATUS_ENG_HALTED_SMASK: u64 = 1 << 56;
pub const SEND_DMA_STATUS_ENG_CLEANED_UP_SMASK: u64 = 1 << 57;
/// SEND_DMA_LEN_GEN: the ring length in 64-descriptor units, and the generation field whose MSB, set, turns on
/// generation checking and loads the internal generation with 0 (sdma_setlengen).
pub const SEND_DMA_LEN_GEN_LENGTH_SHIFT: u32 = 6;
pub const SEND_DMA_LEN_GEN_LENGTH_MASK: u64 = 0x3FF;
pub const SEND_DMA_LEN_GEN_GENERATION_SHIFT: u32 = 16;
pub const SEND_DMA_LEN_GEN_GENERATION_CHECK: u64 = 4 << SEND_DMA_LEN_GEN_GENERATION_SHIFT;
pub const SEND_DMA_TAIL_MASK: u64 = 0xFFFF;
pub const SEND_DMA_DESC_CNT_CNT_MASK: u64 = 0xFFFF;
/// SEND_DMA_ENG_ERR_STATUS bits this model reports (chip_registers.h); all halt the engine (sdma.c
/// ALL_SDMA_ENG_HALT_ERRS).
pub const SDMA_GEN_MISMATCH_ERR: u64 = 0x2;
pub const SDMA_TOO_LONG_ERR: u64 = 0x4;
pub const SDMA_TAIL_OUT_OF_BOUNDS_ERR: u64 = 0x8;
pub const SDMA_FIRST_DESC_ERR: u64 = 0x10;
pub const SDMA_MEM_READ_ERR: u64 = 0x20;
pub const SDMA_HALT_ERR: u64 = 0x40;
pub const SDMA_LENGTH_MISMATCH_ERR: u64 = 0x80;
pub const SDMA_PACKET_DESC_OVERFLOW_ERR: u64 = 0x1_0000;
pub const SDMA_HEADER_SELECT_ERR: u64 = 0x400;

/// Interrupt sources per engine (chip.h): a descriptor with INT_REQ done, DESC_CNT descriptors done, the
/// engine idle.
pub const IS_SDMA_START: u32 = 192;
pub const IS_SDMA_PROGRESS_START: u32 = 208;
pub const IS_SDMA_IDLE_START: u32 = 224;

/// AHG: header slots per engine (sdma_ahg_alloc hands out 0..31), and the bytes one keeps: the PBC and
/// headers of the packet that stored it (at most 32 dwords).
pub const AHG_SLOTS: usize = 32;
pub const AHG_SLOT_BYTES: usize = 128;

/// Per-engine CSR spacing (write_kctxt_csr).
const STRIDE: u64 = 0x100;

/// One engine.
#[derive(Debug, Default, Clone)]
struct Engine {
    ctrl: u64,
    halted: bool,
    cleaned_up: bool,
    base: u64,
    len_gen: u64,
    tail: u64,
    /// The next descriptor to process.
    head: u64,
    head_addr: u64,
    desc_cnt: u64,
    /// Generation of the descriptors at `head`, and whether it is checked.
    gen: u8,
    gen_check: bool,
    /// Bumped by every clean-up and reset: a walk begun before is void.
    epoch: u64,
    /// Descriptors done since the last progress interrupt.
    since_progress: u64,
    /// AHG header slots, allocated on first use.
    ahg: Vec<Vec<u8>>,
}

impl Engine {
    /// Ring length in descriptors.
    fn count(&self) -> u64 {
        ((self.len_gen >> SEND_DMA_LEN_GEN_LENGTH_SHIFT) & SEND_DMA_LEN_GEN_LENGTH_MASK) * 64
    }
    fn running(&self) -> bool {
        self.ctrl & SEND_DMA_CTRL_SDMA_ENABLE_SMASK != 0 && !self.halted
    }
}

/// What the worker needs to walk an engine's ring from its head to its tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walk {
    pub engine: usize,
    pub epoch: u64,
    pub base: u64,
    pub count: u64,
    pub head: u64,
    pub tail: u64,
    pub gen: u8,
    pub gen_check: bool,
}

/// What the device does after the worker finished descriptors: the head write-back and the interrupt
/// sources to raise.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Progress {
    pub head_write: Option<(u64, u64)>,
    pub sources: Vec<u32>,
}

#[derive(Debug)]
pub struct Sdma {
    engines: Vec<Engine>,
}

/// Engine and register of a per-engine CSR.
fn engine_csr(offset: u64, engines: usize) -> Option<(usize, u64)> {
    let rel = offset.checked_sub(SEND_DMA_CTRL)?;
    let (e, reg) = ((rel / STRIDE) as usize, SEND_DMA_CTRL + rel % STRIDE);
    (e < engines).then_some((e, reg))
}

impl Sdma {
    pub fn new(shape: &WfrShape) -> Self {
        Sdma { engines: vec![Engine::default(); shape.sdma_engines as usize] }
    }

    pub fn read(&self, offset: u64) -> Option<u64> {
        let (e, reg) = engine_csr(offset, self.engines.len())?;
        let eng = &self.engines[e];
        Some(match reg {
            SEND_DMA_CTRL => eng.ctrl,
            SEND_DMA_STATUS => {
                let mut v = 0;
                if eng.halted {
                    v |= SEND_DMA_STATUS_ENG_HALTED_SMASK;
                }
                if eng.cleaned_up {
                    v |= SEND_DMA_STATUS_ENG_CLEANED_UP_SMASK;
                }
                v
            }
            SEND_DMA_BASE_ADDR => eng.base,
            SEND_DMA_LEN_GEN => eng.len_gen,
            SEND_DMA_TAIL => eng.tail,
            // The live head (sdma_gethead reads the CSR unless USE_SDMA_HEAD).
            SEND_DMA_HEAD => eng.head,
            SEND_DMA_HEAD_ADDR => eng.head_addr,
            SEND_DMA_DESC_CNT => eng.desc_cnt,
            _ => return None,
        })
    }

    /// A per-engine CSR write; `None` if this block does not claim the offset, else whether the engine has
    /// descriptors to walk now.
    pub fn write(
        &mut self,
        offset: u64,
        value: u64,
        errs: &mut ErrGroups,
        raised: &mut Raised,
    ) -> Option<Option<usize>> {
        let (e, reg) = engine_csr(offset, self.engines.len())?;
        let eng = &mut self.engines[e];
        match reg {
            SEND_DMA_CTRL => {
                let halting =
                    value & SEND_DMA_CTRL_SDMA_HALT_SMASK != 0 && eng.ctrl & SEND_DMA_CTRL_SDMA_HALT_SMASK == 0;
                eng.ctrl = value & !SEND_DMA_CTRL_SDMA_CLEANUP_SMASK;
                if halting {
                    Self::halt(eng, e, SDMA_HALT_ERR, errs, raised);
                }
                if value & SEND_DMA_CTRL_SDMA_CLEANUP_SMASK != 0 {
                    // The clean-up empties the engine: what it had fetched is dropped, the head goes back to 0
                    // (sdma.c, comment before sdma_hw_clean_up_task).
                    eng.halted = false;
                    eng.cleaned_up = true;
                    eng.head = 0;
                    eng.epoch += 1;
                }
            }
            SEND_DMA_BASE_ADDR => eng.base = value,
            SEND_DMA_LEN_GEN => {
                let loads = value & !eng.len_gen & SEND_DMA_LEN_GEN_GENERATION_CHECK != 0;
                eng.len_gen = value;
                if loads {
                    eng.gen = 0;
                    eng.gen_check = true;
                }
            }
            SEND_DMA_TAIL => eng.tail = value & SEND_DMA_TAIL_MASK,
            SEND_DMA_HEAD_ADDR => eng.head_addr = value,
            SEND_DMA_DESC_CNT => eng.desc_cnt = value & SEND_DMA_DESC_CNT_CNT_MASK,
            SEND_DMA_STATUS | SEND_DMA_HEAD => {} // read-only
            _ => return None,
        }
        Some(self.pending(e).then_some(e))
    }

    fn halt(eng: &mut Engine, e: usize, bits: u64, errs: &mut ErrGroups, raised: &mut Raised) {
        eng.halted = true;
        eng.cleaned_up = false;
        eng.epoch += 1;
        errs.set(SEND_DMA_ENG_ERR_STATUS + STRIDE * e as u64, bits);
        raised.raise(IS_SDMAENG_ERR_START + e as u32);
    }

    /// Whether engine `e` runs and has descriptors between its head and its tail.
    pub fn pending(&self, e: usize) -> bool {
        self.engines.get(e).is_some_and(|eng| eng.running() && eng.head != eng.tail)
    }

    /// The walk the worker makes on engine `e` now, if it has work. A tail or a head outside the ring halts
    /// it with TailOutOfBounds: the head is left past the end when SEND_DMA_LEN_GEN shrinks the ring under it
    /// (docs/decisions.md, "An SDMA head outside its ring").
    pub fn walk(&mut self, e: usize, errs: &mut ErrGroups, raised: &mut Raised) -> Option<Walk> {
        let eng = self.engines.get_mut(e)?;
        if !eng.running() || eng.head == eng.tail {
            return None;
        }
        let count = eng.count();
        if count == 0 || eng.tail >= count || eng.head >= count {
            Self::halt(eng, e, SDMA_TAIL_OUT_OF_BOUNDS_ERR, errs, raised);
            return None;
        }
        Some(Walk {
            engine: e,
            epoch: eng.epoch,
            base: eng.base,
            count,
            head: eng.head,
            tail: eng.tail,
            gen: eng.gen,
            gen_check: eng.gen_check,
        })
    }

    /// The worker finished `done` descriptors of `walk`, the last of them asking for a head write-back
    /// (`to_host`) and an interrupt (`int_req`). `None` if the walk is void (the engine was cleaned up, halted
    /// or reset since it began).
    pub fn advance(&mut self, walk: &Walk, done: u64, to_host: bool, int_req: bool) -> Option<Progress> {
        let eng = self.engines.get_mut(walk.engine).filter(|eng| eng.epoch == walk.epoch)?;
        // The ring may have been resized since the walk began: the head stays inside the ring it has now.
        let count = eng.count().max(1);
        let end = eng.head.saturating_add(done);
        if end >= count {
            eng.gen = eng.gen.wrapping_add(1) & 3;
        }
        eng.head = end % count;
        let mut p = Progress::default();
        if to_host && eng.head_addr != 0 {
            p.head_write = Some((eng.head_addr, eng.head));
        }
        let e = walk.engine as u32;
        if eng.ctrl & SEND_DMA_CTRL_SDMA_INT_ENABLE_SMASK != 0 {
            if int_req {
                p.sources.push(IS_SDMA_START + e);
            }
            eng.since_progress += done;
            if eng.desc_cnt != 0 && eng.since_progress >= eng.desc_cnt {
                eng.since_progress = 0;
                p.sources.push(IS_SDMA_PROGRESS_START + e);
            }
            if eng.head == eng.tail {
                p.sources.push(IS_SDMA_IDLE_START + e);
            }
        }
        Some(p)
    }

    /// The worker found an error in `walk`'s descriptors: the engine halts with `bits` (and its error
    /// interrupt), unless the walk is void.
    pub fn fail(&mut self, walk: &Walk, bits: u64, errs: &mut ErrGroups, raised: &mut Raised) {
        if let Some(eng) = self.engines.get_mut(walk.engine).filter(|eng| eng.epoch == walk.epoch) {
            Self::halt(eng, walk.engine, bits, errs, raised);
        }
    }

    /// AHG COPY: `header` (the first descriptor's bytes) is kept in slot `slot` of `walk`'s engine.
    pub fn ahg_store(&mut self, walk: &Walk, slot: usize, header: &[u8]) {
        let Some(eng) = self.engines.get_mut(walk.engine).filter(|eng| eng.epoch == walk.epoch) else { return };
        if eng.ahg.is_empty() {
            eng.ahg = vec![Vec::new(); AHG_SLOTS];
        }
        if let Some(s) = eng.ahg.get_mut(slot) {
            *s = header[..header.len().min(AHG_SLOT_BYTES)].to_vec();
        }
    }

    /// AHG APPLY: the header kept in slot `slot` of `walk`'s engine (empty if none was stored).
    pub fn ahg_load(&self, walk: &Walk, slot: usize) -> Vec<u8> {
        self.engines.get(walk.engine).and_then(|eng| eng.ahg.get(slot)).cloned().unwrap_or_default()
    }

    pub fn engines(&self) -> usize {
        self.engines.len()
    }

    /// The SPC unfreeze: every engine comes out empty, head 0 and not halted. The driver restarts an engine
    /// after a freeze with tail 0 and no clean-up (sdma.c, s82_freeze_sw_clean on e82_hw_unfreeze:
    /// sdma_hw_start_up), so the freeze itself must have emptied it.
    pub fn unfreeze(&mut self) {
        for eng in &mut self.engines {
            eng.head = 0;
            eng.halted = false;
            eng.since_progress = 0;
            eng.epoch += 1;
        }
    }

    pub fn dump(&self) -> serde_json::Value {
        self.engines
            .iter()
            .enumerate()
            .map(|(i, e)| {
                serde_json::json!({"engine": i, "ctrl": format!("{:#x}", e.ctrl), "halted": e.halted,
                    "cleaned_up": e.cleaned_up, "ring": e.count(), "head": e.head, "tail": e.tail,
                    "generation": e.gen})
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sdma() -> (Sdma, ErrGroups) {
        (Sdma::new(&WfrShape { sdma_engines: 2, ..WfrShape::default() }), ErrGroups::default())
    }

    fn w(s: &mut Sdma, errs: &mut ErrGroups, reg: u64, e: u64, value: u64) -> (Option<usize>, Vec<u32>) {
        let mut raised = Raised::default();
        let pending = s.write(reg + STRIDE * e, value, errs, &mut raised).expect("claimed");
        (pending, raised.0)
    }

    /// init_sdma_regs, sdma_setlengen, then running with interrupts (s99_running), DESC_CNT 64.
    fn running(s: &mut Sdma, errs: &mut ErrGroups) {
        w(s, errs, SEND_DMA_BASE_ADDR, 1, 0x10_0000);
        w(s, errs, SEND_DMA_LEN_GEN, 1, (2048 / 64) << 6);
        w(s, errs, SEND_DMA_LEN_GEN, 1, ((2048 / 64) << 6) | (4 << 16));
        w(s, errs, SEND_DMA_TAIL, 1, 0);
        w(s, errs, SEND_DMA_HEAD_ADDR, 1, 0x20_0000);
        w(s, errs, SEND_DMA_DESC_CNT, 1, 64);
        w(s, errs, SEND_DMA_CTRL, 1, SEND_DMA_CTRL_SDMA_ENABLE_SMASK | SEND_DMA_CTRL_SDMA_INT_ENABLE_SMASK);
    }

    #[test]
    fn a_tail_write_on_a_running_engine_is_a_walk_from_head_to_tail() {
        let (mut s, mut errs) = sdma();
        running(&mut s, &mut errs);
        assert_eq!(w(&mut s, &mut errs, SEND_DMA_TAIL, 1, 3), (Some(1), vec![]));
        let walk = s.walk(1, &mut errs, &mut Raised::default()).unwrap();
        assert_eq!((walk.base, walk.count, walk.head, walk.tail, walk.gen), (0x10_0000, 2048, 0, 3, 0));
        // Done: the head moves, the head goes home, and the engine is idle.
        let p = s.advance(&walk, 3, true, false).unwrap();
        assert_eq!(p.head_write, Some((0x20_0000, 3)));
        assert_eq!(p.sources, vec![IS_SDMA_IDLE_START + 1]);
        assert_eq!(s.read(SEND_DMA_HEAD + STRIDE), Some(3));
    }

    #[test]
    fn int_req_and_desc_cnt_raise_their_sources_and_the_generation_turns_at_the_ring_end() {
        let (mut s, mut errs) = sdma();
        running(&mut s, &mut errs);
        w(&mut s, &mut errs, SEND_DMA_TAIL, 1, 2000);
        let walk = s.walk(1, &mut errs, &mut Raised::default()).unwrap();
        let p = s.advance(&walk, 100, false, true).unwrap();
        assert_eq!(p.sources, vec![IS_SDMA_START + 1, IS_SDMA_PROGRESS_START + 1]);
        assert_eq!(p.head_write, None);
        let walk = s.walk(1, &mut errs, &mut Raised::default()).unwrap();
        s.advance(&walk, 1900, false, false).unwrap();
        w(&mut s, &mut errs, SEND_DMA_TAIL, 1, 20);
        let walk = s.walk(1, &mut errs, &mut Raised::default()).unwrap();
        assert_eq!((walk.head, walk.tail, walk.gen), (2000, 20, 0));
        s.advance(&walk, 58, false, false).unwrap();
        assert_eq!(s.walk(1, &mut errs, &mut Raised::default()).unwrap().gen, 1, "a lap later");
    }

    #[test]
    fn a_clean_up_voids_the_walk_in_flight_and_puts_the_head_back_to_0() {
        let (mut s, mut errs) = sdma();
        running(&mut s, &mut errs);
        w(&mut s, &mut errs, SEND_DMA_TAIL, 1, 5);
        let walk = s.walk(1, &mut errs, &mut Raised::default()).unwrap();
        let (_, raised) = w(&mut s, &mut errs, SEND_DMA_CTRL, 1, SEND_DMA_CTRL_SDMA_HALT_SMASK);
        assert_eq!(raised, vec![IS_SDMAENG_ERR_START + 1]);
        w(&mut s, &mut errs, SEND_DMA_CTRL, 1, SEND_DMA_CTRL_SDMA_CLEANUP_SMASK);
        assert_eq!(s.advance(&walk, 5, true, true), None);
        assert_eq!(s.read(SEND_DMA_HEAD + STRIDE), Some(0));
        assert_eq!(s.read(SEND_DMA_STATUS + STRIDE), Some(SEND_DMA_STATUS_ENG_CLEANED_UP_SMASK));
    }

    #[test]
    fn the_unfreeze_empties_every_engine_for_a_restart_at_tail_0() {
        let (mut s, mut errs) = sdma();
        running(&mut s, &mut errs);
        w(&mut s, &mut errs, SEND_DMA_TAIL, 1, 5);
        let walk = s.walk(1, &mut errs, &mut Raised::default()).unwrap();
        s.advance(&walk, 2, false, false).unwrap();
        let in_flight = s.walk(1, &mut errs, &mut Raised::default()).unwrap();
        s.unfreeze();
        // The walk begun before the freeze is void; sdma_hw_start_up then writes tail 0 (sdma.c, e82).
        assert_eq!(s.advance(&in_flight, 3, true, true), None);
        assert_eq!(s.read(SEND_DMA_HEAD + STRIDE), Some(0));
        assert_eq!(w(&mut s, &mut errs, SEND_DMA_TAIL, 1, 0), (None, vec![]));
        assert_eq!(w(&mut s, &mut errs, SEND_DMA_TAIL, 1, 1), (Some(1), vec![]));
        assert_eq!(s.walk(1, &mut errs, &mut Raised::default()).unwrap().head, 0);
    }

    #[test]
    fn a_head_beyond_a_shrunk_ring_halts_the_engine_with_an_error_bit() {
        let (mut s, mut errs) = sdma();
        running(&mut s, &mut errs);
        // Ring 128, the head advanced to 64.
        w(&mut s, &mut errs, SEND_DMA_LEN_GEN, 1, (128 / 64) << SEND_DMA_LEN_GEN_LENGTH_SHIFT);
        w(&mut s, &mut errs, SEND_DMA_TAIL, 1, 64);
        let walk = s.walk(1, &mut errs, &mut Raised::default()).unwrap();
        s.advance(&walk, 64, false, false).unwrap();
        assert_eq!(s.read(SEND_DMA_HEAD + STRIDE), Some(64));
        // The ring shrinks to 64 under the head, and the tail is written 0: nothing lies between them.
        w(&mut s, &mut errs, SEND_DMA_LEN_GEN, 1, (64 / 64) << SEND_DMA_LEN_GEN_LENGTH_SHIFT);
        w(&mut s, &mut errs, SEND_DMA_TAIL, 1, 0);
        let mut raised = Raised::default();
        assert_eq!(s.walk(1, &mut errs, &mut raised), None, "no walk");
        assert_eq!(raised.0, vec![IS_SDMAENG_ERR_START + 1]);
        assert_eq!(errs.read(SEND_DMA_ENG_ERR_STATUS + STRIDE), Some(SDMA_TAIL_OUT_OF_BOUNDS_ERR));
        assert_ne!(s.read(SEND_DMA_STATUS + STRIDE).unwrap() & SEND_DMA_STATUS_ENG_HALTED_SMASK, 0);
        assert!(!s.pending(1));
        // The driver's recovery (sdma.c: e60_hw_halted, then the clean-up) puts the head back to 0.
        w(&mut s, &mut errs, SEND_DMA_CTRL, 1, SEND_DMA_CTRL_SDMA_CLEANUP_SMASK);
        assert_eq!(s.read(SEND_DMA_HEAD + STRIDE), Some(0));
    }

    #[test]
    fn errors_halt_the_engine_with_their_bit_and_its_error_interrupt() {
        let (mut s, mut errs) = sdma();
        running(&mut s, &mut errs);
        w(&mut s, &mut errs, SEND_DMA_TAIL, 1, 4096); // beyond the 2048-descriptor ring
        let mut raised = Raised::default();
        assert_eq!(s.walk(1, &mut errs, &mut raised), None);
        assert_eq!(raised.0, vec![IS_SDMAENG_ERR_START + 1]);
        assert_eq!(errs.read(SEND_DMA_ENG_ERR_STATUS + STRIDE), Some(SDMA_TAIL_OUT_OF_BOUNDS_ERR));
        assert_ne!(s.read(SEND_DMA_STATUS + STRIDE).unwrap() & SEND_DMA_STATUS_ENG_HALTED_SMASK, 0);
        assert!(!s.pending(1));
    }
}
