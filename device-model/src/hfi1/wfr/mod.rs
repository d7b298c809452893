//! The real chip's personality ("WFR", PCI 8086:24f0): the CSR blocks outside the RXE that the stock Linux hfi1
//! driver touches when it probes the chip, opens user contexts and tears down (docs/hfi1-kernel-driver.md).
//!
//! Each block lives in its own module and claims the offsets whose behaviour it models; every other offset is
//! storage with its reset value, so the register file as a whole is what a FLR restores. The RXE (receive
//! contexts, flow tables, RcvArray) stays in `super::chip`; this module never sees those offsets it models.

mod asic;
mod cce;
pub mod csr;
mod dc;
mod errs;
pub mod names;
mod txe;

pub use txe::{SEND_DMA_STATUS_ENG_CLEANED_UP_SMASK, SEND_DMA_STATUS_ENG_HALTED_SMASK};

use std::collections::HashMap;

use csr::*;

/// First byte of the PIO send buffers (TXE_PIO_SEND): the top 32 MiB of BAR0, write-only on the chip.
pub const TXE_PIO_SEND: u64 = TXE + 0x80_0000;
/// TXE_PIO_SIZE.
pub const TXE_PIO_SIZE: u64 = 0x200_0000;
/// BAR0 of the chip: CSRs, RcvArray and user pages below TXE_PIO_SEND, the PIO send buffers above.
pub const WFR_BAR0_SIZE: u64 = TXE_PIO_SEND + TXE_PIO_SIZE;
/// MSI-X vectors of the chip (CCE_NUM_MSIX_VECTORS), its table and PBA in BAR0.
pub const CCE_NUM_MSIX_VECTORS: u16 = 256;
pub const CCE_MSIX_PBA: u64 = CCE + 0x11_0000;
/// The PCIe core's vendor registers in extended config space (chip_registers.h PCIE_CFG_REG_PL*, 0x708 up to
/// 0x8A8): aspm.c read-modify-writes PL3; the Gen3 equalisation ones are written only on RTL silicon.
pub const PCIE_CFG_REG_PL_BASE: u16 = 0x700;
pub const PCIE_CFG_REG_PL_LEN: u16 = 0x200;
/// Most send contexts and SDMA engines the chip has (TXE_NUM_CONTEXTS, TXE_NUM_SDMA_ENGINES).
pub const TXE_NUM_CONTEXTS: u32 = 160;
pub const TXE_NUM_SDMA_ENGINES: u32 = 16;

/// Interrupt source numbers (chip.h IS_*): 768 sources, 64 per CCE_INT_* register.
pub const IS_SDMAENG_ERR_START: u32 = 16;
pub const NUM_INTERRUPT_SOURCES: u32 = 768;

/// Chip size and identity registers: read-only, unchanged by a FLR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WfrShape {
    /// SEND_CONTEXTS, 1..=160.
    pub send_contexts: u32,
    /// SEND_DMA_ENGINES, 1..=16.
    pub sdma_engines: u32,
    /// SEND_PIO_MEM_SIZE in bytes.
    pub pio_mem_size: u64,
    /// SEND_DMA_MEM_SIZE in bytes.
    pub sdma_mem_size: u64,
    /// DC_DC8051_CFG_LOCAL_GUID.
    pub guid: u64,
}

impl Default for WfrShape {
    /// The chip's maximum send contexts and engines, so the driver's defaults fit as on hardware; the memory
    /// sizes and GUID are this project's choices (docs/hfi1-kernel-driver.md).
    fn default() -> Self {
        WfrShape {
            send_contexts: TXE_NUM_CONTEXTS,
            sdma_engines: TXE_NUM_SDMA_ENGINES,
            pio_mem_size: 0x2_0000,
            sdma_mem_size: 0x10_0000,
            guid: 0x0011_7501_0100_0001,
        }
    }
}

impl WfrShape {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=TXE_NUM_CONTEXTS).contains(&self.send_contexts) {
            return Err(format!("send_contexts {} not in 1..={TXE_NUM_CONTEXTS}", self.send_contexts));
        }
        if !(1..=TXE_NUM_SDMA_ENGINES).contains(&self.sdma_engines) {
            return Err(format!("sdma_engines {} not in 1..={TXE_NUM_SDMA_ENGINES}", self.sdma_engines));
        }
        // SEND_CTXT_CTRL's 14-bit BASE field counts 64-byte blocks.
        if self.pio_mem_size < 0x1000 || self.pio_mem_size > 0x10_0000 || self.pio_mem_size % 64 != 0 {
            return Err(format!("pio_mem_size {:#x} not a multiple of 64 in 0x1000..=0x100000", self.pio_mem_size));
        }
        if self.sdma_mem_size < 64 * u64::from(self.sdma_engines) || self.sdma_mem_size % 64 != 0 {
            return Err(format!("sdma_mem_size {:#x} too small or unaligned", self.sdma_mem_size));
        }
        Ok(())
    }
}

/// Interrupt sources a register write raised.
#[derive(Debug, Default)]
pub struct Raised(Vec<u32>);

impl Raised {
    pub fn raise(&mut self, source: u32) {
        self.0.push(source);
    }
}

/// The CSR file of the chip outside the RXE.
pub struct Wfr {
    shape: WfrShape,
    cce: cce::Cce,
    asic: asic::Asic,
    dc: dc::Dc,
    txe: txe::Txe,
    errs: errs::ErrGroups,
    /// Every other register: offset to value; absent offsets hold their reset value.
    storage: HashMap<u64, u64>,
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
            storage: HashMap::new(),
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
                self.storage.get(&offset).copied().unwrap_or_else(|| reset_value(offset))
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
            self.storage.insert(offset, value);
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
        let mut storage: Vec<(u64, u64)> = self.storage.iter().map(|(&o, &v)| (o, v)).collect();
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
