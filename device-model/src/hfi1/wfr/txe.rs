//! TXE: send control, the PIO init engine, and the egress status registers. Packets leave as soon as they are
//! launched, so no context reports packets in flight. The PIO send contexts (and their SEND_CTXT_STATUS) are
//! `super::pio`, the SDMA engines `super::sdma`.

#![forbid(unsafe_code)]

use super::cce::array_index;
use super::csr::*;
use super::{WfrShape, TXE_NUM_CONTEXTS, TXE_NUM_SDMA_ENGINES};

pub const SEND_CTRL_CM_RESET_SMASK: u64 = 0x4;
pub const SEND_PIO_INIT_CTXT_PIO_CTXT_NUM_SMASK: u64 = 0xFF << 8;

#[derive(Debug)]
pub struct Txe {
    send_ctrl: u64,
    pio_init: u64,
}

impl Txe {
    pub fn new(_shape: &WfrShape) -> Self {
        Txe { send_ctrl: 0, pio_init: 0 }
    }

    /// Egress status: not halted, no packet occupancy.
    fn status(offset: u64) -> bool {
        array_index(offset, SEND_EGRESS_CTXT_STATUS, TXE_NUM_CONTEXTS as usize).is_some()
            || array_index(offset, SEND_EGRESS_SEND_DMA_STATUS, TXE_NUM_SDMA_ENGINES as usize).is_some()
    }

    pub fn read(&mut self, offset: u64, shape: &WfrShape) -> Option<u64> {
        if Self::status(offset) {
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

    pub fn write(&mut self, offset: u64, value: u64) -> bool {
        if Self::status(offset) {
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
}
