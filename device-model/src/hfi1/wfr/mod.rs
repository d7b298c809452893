//! The real chip's personality ("WFR", PCI 8086:24f0): the CSR blocks outside the RXE that the stock Linux hfi1
//! driver touches when it probes the chip, opens user contexts and tears down (docs/hfi1-kernel-driver.md).
//!
//! Each block lives in its own module and claims the offsets whose behaviour it models; every other offset is
//! storage with its reset value, so the register file as a whole is what a FLR restores. The RXE (receive
//! contexts, flow tables, RcvArray) stays in `super::chip`; this module never sees those offsets it models.

#![forbid(unsafe_code)]

mod asic;
mod cce;
pub mod csr;
mod dc;
mod errs;
pub mod names;
mod shape;
mod storage;
mod txe;

pub use txe::{SEND_DMA_STATUS_ENG_CLEANED_UP_SMASK, SEND_DMA_STATUS_ENG_HALTED_SMASK};

use csr::*;

pub use shape::{
    Raised, WfrShape, CCE_MSIX_PBA, CCE_NUM_MSIX_VECTORS, IS_SDMAENG_ERR_START, NUM_INTERRUPT_SOURCES,
    PCIE_CFG_REG_PL_BASE, PCIE_CFG_REG_PL_LEN, TXE_NUM_CONTEXTS, TXE_NUM_SDMA_ENGINES, TXE_PIO_SEND, TXE_PIO_SIZE,
    WFR_BAR0_SIZE,
};

/// The CSR file of the chip outside the RXE.
pub struct Wfr {
    shape: WfrShape,
    cce: cce::Cce,
    asic: asic::Asic,
    dc: dc::Dc,
    txe: txe::Txe,
    errs: errs::ErrGroups,
    /// Every other register the kernel names: offset to value; absent offsets hold their reset value.
    storage: storage::Storage,
    /// Accesses to offsets that no table names, since reset (a gap in the model).
    unnamed: u64,
}

impl Wfr {
    pub fn new(shape: WfrShape) -> Self {
        Wfr {
            shape,
            cce: cce::Cce::default(),
            asic: asic::Asic::default(),
            dc: dc::Dc::default(),
            txe: txe::Txe::new(&shape),
            errs: errs::ErrGroups::default(),
            storage: storage::Storage::default(),
            unnamed: 0,
        }
    }

    pub fn shape(&self) -> &WfrShape {
        &self.shape
    }

    /// Power-on state (and what a FLR leaves): identity and size registers keep their values.
    pub fn reset(&mut self) {
        *self = Wfr::new(self.shape);
    }

    /// Accesses to offsets no table names, since reset.
    pub fn unnamed(&self) -> u64 {
        self.unnamed
    }

    /// A 64-bit read at the 8-byte-aligned `offset` (outside the RXE).
    pub fn read(&mut self, offset: u64) -> u64 {
        if offset >= TXE_PIO_SEND {
            // The send buffers are write-only; reads return 0.
            return 0;
        }
        let shape = &self.shape;
        let v = self
            .cce
            .read(offset)
            .or_else(|| self.asic.read(offset))
            .or_else(|| self.dc.read(offset, shape))
            .or_else(|| self.txe.read(offset, shape))
            .or_else(|| self.errs.read(offset));
        match v {
            Some(v) => v,
            None => {
                self.note_unnamed(offset);
                self.storage.get(offset).unwrap_or_else(|| reset_value(offset))
            }
        }
    }

    /// A 64-bit write at the 8-byte-aligned `offset` (outside the RXE). Returns the MSI-X vectors the
    /// write made due: sources it raised or forced, or unmasked while pending, on the vectors CCE_INT_MAP
    /// gives them. The caller sends them once it has dropped its locks.
    pub fn write(&mut self, offset: u64, value: u64) -> Vec<u16> {
        if offset >= TXE_PIO_SEND {
            return Vec::new();
        }
        let mut raised = Raised::default();
        let handled = self.cce.write(offset, value)
            || self.asic.write(offset, value)
            || self.dc.write(offset, value)
            || self.txe.write(offset, value, &self.shape, &mut self.errs, &mut raised)
            || self.errs.write(offset, value);
        if !handled {
            self.note_unnamed(offset);
            self.storage.write(offset, value);
            // Holding the DC in reset resets the 8051 (init_chip keeps it there across the FLR).
            if offset == CCE_DC_CTRL && value & CCE_DC_CTRL_DC_RESET_SMASK != 0 {
                self.dc.reset_8051();
            }
        }
        let mut vectors: Vec<u16> = raised.0.into_iter().filter_map(|s| self.cce.raise(s)).collect();
        vectors.extend(self.cce.take_deliverable());
        vectors
    }

    fn note_unnamed(&mut self, offset: u64) {
        if !names::is_named(offset) {
            self.unnamed += 1;
            tracing::debug!("hfi1-wfr: access to {offset:#x}, which the chip's register list does not name");
        }
    }

    /// State for the control socket's dump.
    pub fn dump(&self) -> serde_json::Value {
        let mut storage: Vec<(u64, u64)> = self.storage.iter().collect();
        storage.sort_unstable();
        serde_json::json!({
            "shape": {
                "send_contexts": self.shape.send_contexts,
                "sdma_engines": self.shape.sdma_engines,
                "pio_mem_size": self.shape.pio_mem_size,
                "sdma_mem_size": self.shape.sdma_mem_size,
                "guid": format!("{:#018x}", self.shape.guid),
            },
            "cce": self.cce.dump(),
            "dc8051": self.dc.dump(),
            "sdma": self.txe.dump(),
            "unnamed_accesses": self.unnamed,
            "storage_entries": self.storage.len(),
            "storage_bytes": self.storage.footprint(),
            "storage_dropped": self.storage.dropped(),
            "storage": storage.iter().filter(|(_, v)| *v != 0).map(|&(o, v)| serde_json::json!({
                "offset": format!("{o:#x}"),
                "name": names::name(o),
                "value": format!("{v:#x}"),
            })).collect::<Vec<_>>(),
        })
    }
}

/// Power-on values of the storage registers that are not zero: what the driver's reset_*_csrs write as
/// "chip reset defaults" (chip.c) and the DC's link state.
fn reset_value(offset: u64) -> u64 {
    match offset {
        CCE_DC_CTRL => CCE_DC_CTRL_RESETCSR,
        ASIC_EEP_CTL_STAT => ASIC_EEP_CTL_STAT_RESETCSR,
        SEND_CM_CTRL => SEND_CM_CTRL_RESETCSR,
        SEND_CM_GLOBAL_CREDIT => SEND_CM_GLOBAL_CREDIT_RESETCSR,
        DCC_CFG_PORT_CONFIG => dc::DCC_CFG_PORT_CONFIG_RESET,
        _ => 0,
    }
}

pub const CCE_DC_CTRL_DC_RESET_SMASK: u64 = 0x1;
pub const CCE_DC_CTRL_RESETCSR: u64 = CCE_DC_CTRL_DC_RESET_SMASK;
pub const ASIC_EEP_CTL_STAT_RESETCSR: u64 = 0x8381_8000;
pub const SEND_CM_CTRL_RESETCSR: u64 = 0x20;
pub const SEND_CM_GLOBAL_CREDIT_RESETCSR: u64 = 0x0000_0940_0003_0000;

#[cfg(test)]
mod tests;
