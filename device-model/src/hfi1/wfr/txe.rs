//! TXE: send control, the send contexts' PIO initialisation, and the SDMA engines' halt / clean-up handshake.
//! Nothing is ever sent (no link), so send contexts report no packets in flight and engines never move their
//! head; what the driver waits for completes at once.

#![forbid(unsafe_code)]

use super::cce::array_index;
use super::csr::*;
use super::errs::ErrGroups;
use super::{Raised, WfrShape, IS_SDMAENG_ERR_START, TXE_NUM_CONTEXTS, TXE_NUM_SDMA_ENGINES};

pub const SEND_CTRL_CM_RESET_SMASK: u64 = 0x4;
pub const SEND_PIO_INIT_CTXT_PIO_CTXT_NUM_SMASK: u64 = 0xFF << 8;

pub const SEND_DMA_CTRL_SDMA_HALT_SMASK: u64 = 0x2;
pub const SEND_DMA_CTRL_SDMA_CLEANUP_SMASK: u64 = 0x4;
pub const SEND_DMA_STATUS_ENG_HALTED_SMASK: u64 = 1 << 56;
pub const SEND_DMA_STATUS_ENG_CLEANED_UP_SMASK: u64 = 1 << 57;
pub const SEND_DMA_ENG_ERR_STATUS_SDMA_HALT_ERR_SMASK: u64 = 0x40;

/// Per-context and per-engine CSRs are spaced like the kernel-context CSRs.
const STRIDE: u64 = 0x100;

/// One SDMA engine's state.
#[derive(Debug, Default, Clone, Copy)]
struct Engine {
    ctrl: u64,
    halted: bool,
    cleaned_up: bool,
}

#[derive(Debug)]
pub struct Txe {
    send_ctrl: u64,
    pio_init: u64,
    engines: Vec<Engine>,
}

/// Engine index of a per-engine CSR `reg` (the engine-0 offset) at `offset`, below `engines`.
fn engine_of(offset: u64, reg: u64, engines: u32) -> Option<usize> {
    let rel = offset.checked_sub(reg)?;
    (rel % STRIDE == 0 && rel / STRIDE < u64::from(engines)).then_some((rel / STRIDE) as usize)
}

/// Context index of a per-send-context CSR.
fn ctxt_of(offset: u64, reg: u64, contexts: u32) -> Option<usize> {
    engine_of(offset, reg, contexts)
}

impl Txe {
    pub fn new(shape: &WfrShape) -> Self {
        Txe { send_ctrl: 0, pio_init: 0, engines: vec![Engine::default(); shape.sdma_engines as usize] }
    }

    pub fn read(&mut self, offset: u64, shape: &WfrShape) -> Option<u64> {
        if let Some(e) = engine_of(offset, SEND_DMA_STATUS, shape.sdma_engines) {
            let eng = self.engines[e];
            let mut v = 0;
            if eng.halted {
                v |= SEND_DMA_STATUS_ENG_HALTED_SMASK;
            }
            if eng.cleaned_up {
                v |= SEND_DMA_STATUS_ENG_CLEANED_UP_SMASK;
            }
            return Some(v);
        }
        if let Some(e) = engine_of(offset, SEND_DMA_CTRL, shape.sdma_engines) {
            return Some(self.engines[e].ctrl);
        }
        // The hardware head never moves: nothing is ever fetched.
        if engine_of(offset, SEND_DMA_HEAD, shape.sdma_engines).is_some() {
            return Some(0);
        }
        // Not halted; no packet occupancy.
        if ctxt_of(offset, SEND_CTXT_STATUS, shape.send_contexts).is_some()
            || array_index(offset, SEND_EGRESS_CTXT_STATUS, TXE_NUM_CONTEXTS as usize).is_some()
            || array_index(offset, SEND_EGRESS_SEND_DMA_STATUS, TXE_NUM_SDMA_ENGINES as usize).is_some()
        {
            return Some(0);
        }
        Some(match offset {
            SEND_CTRL => self.send_ctrl,
            SEND_CONTEXTS => u64::from(shape.send_contexts),
            SEND_DMA_ENGINES => u64::from(shape.sdma_engines),
            SEND_PIO_MEM_SIZE => shape.pio_mem_size,
            SEND_DMA_MEM_SIZE => shape.sdma_mem_size,
            // An init completes at once: neither PIO_INIT_IN_PROGRESS nor PIO_INIT_ERR is ever seen.
            SEND_PIO_INIT_CTXT => self.pio_init,
            SEND_CM_CREDIT_USED_STATUS => 0,
            _ => return None,
        })
    }

    pub fn write(
        &mut self,
        offset: u64,
        value: u64,
        shape: &WfrShape,
        errs: &mut ErrGroups,
        raised: &mut Raised,
    ) -> bool {
        if let Some(e) = engine_of(offset, SEND_DMA_CTRL, shape.sdma_engines) {
            self.sdma_ctrl(e, value, errs, raised);
            return true;
        }
        if engine_of(offset, SEND_DMA_STATUS, shape.sdma_engines).is_some()
            || engine_of(offset, SEND_DMA_HEAD, shape.sdma_engines).is_some()
            || ctxt_of(offset, SEND_CTXT_STATUS, shape.send_contexts).is_some()
            || array_index(offset, SEND_EGRESS_CTXT_STATUS, TXE_NUM_CONTEXTS as usize).is_some()
            || array_index(offset, SEND_EGRESS_SEND_DMA_STATUS, TXE_NUM_SDMA_ENGINES as usize).is_some()
        {
            return true; // read-only
        }
        match offset {
            // CM_RESET resets the credit manager and clears itself.
            SEND_CTRL => self.send_ctrl = value & !SEND_CTRL_CM_RESET_SMASK,
            SEND_PIO_INIT_CTXT => self.pio_init = value & SEND_PIO_INIT_CTXT_PIO_CTXT_NUM_SMASK,
            SEND_CONTEXTS | SEND_DMA_ENGINES | SEND_PIO_MEM_SIZE | SEND_DMA_MEM_SIZE | SEND_CM_CREDIT_USED_STATUS => {}
            _ => return false,
        }
        true
    }

    /// SEND_DMA_CTRL: HALT stops the engine, which reports it as a halt error on its SDMAENG_ERR interrupt
    /// (the driver's state machine waits for that: sdma.c s10_hw_start_up_halt_wait); CLEANUP is a pulse that
    /// empties the halted engine, which reports ENG_CLEANED_UP (polled with no timeout in
    /// sdma_hw_clean_up_task).
    fn sdma_ctrl(&mut self, e: usize, value: u64, errs: &mut ErrGroups, raised: &mut Raised) {
        let eng = &mut self.engines[e];
        let halting = value & SEND_DMA_CTRL_SDMA_HALT_SMASK != 0 && eng.ctrl & SEND_DMA_CTRL_SDMA_HALT_SMASK == 0;
        eng.ctrl = value & !SEND_DMA_CTRL_SDMA_CLEANUP_SMASK;
        if halting {
            eng.halted = true;
            eng.cleaned_up = false;
            errs.set(SEND_DMA_ENG_ERR_STATUS + STRIDE * e as u64, SEND_DMA_ENG_ERR_STATUS_SDMA_HALT_ERR_SMASK);
            raised.raise(IS_SDMAENG_ERR_START + e as u32);
        }
        if value & SEND_DMA_CTRL_SDMA_CLEANUP_SMASK != 0 {
            eng.halted = false;
            eng.cleaned_up = true;
        }
    }

    pub fn dump(&self) -> serde_json::Value {
        self.engines
            .iter()
            .enumerate()
            .map(|(i, e)| {
                serde_json::json!({"engine": i, "ctrl": format!("{:#x}", e.ctrl), "halted": e.halted,
                                   "cleaned_up": e.cleaned_up})
            })
            .collect()
    }
}
