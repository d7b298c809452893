//! The chip's error-status groups: a read-only STATUS (FLG) register the device sets, a MASK (EN) that is
//! storage, and a write-1-to-clear CLEAR (CLR) that reads 0. The driver's interrupt handlers read STATUS,
//! write CLEAR and read STATUS again until it is 0 (interrupt_clear_down), so CLEAR must really clear.

#![forbid(unsafe_code)]

use std::collections::HashMap;

use super::csr::*;
use super::{TXE_NUM_CONTEXTS, TXE_NUM_SDMA_ENGINES};
use crate::hfi1::regs::{RCV_ERR_CLEAR, RCV_ERR_STATUS};

/// One group: STATUS and CLEAR offsets of element 0, and `count` elements `stride` apart (a single register
/// has count 1 and stride 8, which no other offset of the group can reach).
struct Group {
    status: u64,
    clear: u64,
    count: u64,
    stride: u64,
}

const fn one(status: u64, clear: u64) -> Group {
    Group { status, clear, count: 1, stride: 8 }
}

/// Kernel per-context stride (write_kctxt_csr).
const KCTXT_STRIDE: u64 = 0x100;

const GROUPS: [Group; 12] = [
    one(CCE_ERR_STATUS, CCE_ERR_CLEAR),
    one(RCV_ERR_STATUS, RCV_ERR_CLEAR),
    one(MISC_ERR_STATUS, MISC_ERR_CLEAR),
    one(SEND_PIO_ERR_STATUS, SEND_PIO_ERR_CLEAR),
    one(SEND_DMA_ERR_STATUS, SEND_DMA_ERR_CLEAR),
    one(SEND_EGRESS_ERR_STATUS, SEND_EGRESS_ERR_CLEAR),
    one(SEND_ERR_STATUS, SEND_ERR_CLEAR),
    one(DCC_ERR_FLG, DCC_ERR_FLG_CLR),
    one(DC_LCB_ERR_FLG, DC_LCB_ERR_CLR),
    one(DC_DC8051_ERR_FLG, DC_DC8051_ERR_CLR),
    Group {
        status: SEND_CTXT_ERR_STATUS,
        clear: SEND_CTXT_ERR_CLEAR,
        count: TXE_NUM_CONTEXTS as u64,
        stride: KCTXT_STRIDE,
    },
    Group {
        status: SEND_DMA_ENG_ERR_STATUS,
        clear: SEND_DMA_ENG_ERR_CLEAR,
        count: TXE_NUM_SDMA_ENGINES as u64,
        stride: KCTXT_STRIDE,
    },
];

/// Status registers that are their own write-1-to-clear: SEND_EGRESS_ERR_INFO, which the driver clears by
/// writing back what it read (chip.c handle_send_egress_err_info).
const SELF_CLEARING: [u64; 1] = [SEND_EGRESS_ERR_INFO];

/// Which register of a group `offset` is, and the STATUS offset of its element.
enum Role {
    Status(u64),
    Clear(u64),
}

fn role(offset: u64) -> Option<Role> {
    if SELF_CLEARING.contains(&offset) {
        return Some(Role::Clear(offset));
    }
    GROUPS.iter().find_map(|g| {
        let element = |base: u64| {
            let rel = offset.checked_sub(base)?;
            let (i, r) = (rel / g.stride, rel % g.stride);
            (r == 0 && i < g.count).then_some(i)
        };
        if let Some(i) = element(g.status) {
            return Some(Role::Status(g.status + i * g.stride));
        }
        element(g.clear).map(|i| Role::Clear(g.status + i * g.stride))
    })
}

#[derive(Debug, Default)]
pub struct ErrGroups {
    /// Set bits by STATUS offset.
    status: HashMap<u64, u64>,
}

impl ErrGroups {
    pub fn read(&self, offset: u64) -> Option<u64> {
        match role(offset)? {
            Role::Status(s) => Some(self.status.get(&s).copied().unwrap_or(0)),
            Role::Clear(s) if s == offset => Some(self.status.get(&s).copied().unwrap_or(0)),
            Role::Clear(_) => Some(0),
        }
    }

    pub fn write(&mut self, offset: u64, value: u64) -> bool {
        match role(offset) {
            Some(Role::Status(_)) => true,
            Some(Role::Clear(s)) => {
                if let Some(v) = self.status.get_mut(&s) {
                    *v &= !value;
                }
                true
            }
            None => false,
        }
    }

    /// The device reports an error: `bits` of the STATUS register at `status`.
    pub fn set(&mut self, status: u64, bits: u64) {
        *self.status.entry(status).or_default() |= bits;
    }
}
