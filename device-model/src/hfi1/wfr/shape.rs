//! The chip's geometry and identity as the blocks share it: BAR0 layout, counts, the size registers, and
//! the interrupt sources a write raises.

#![forbid(unsafe_code)]

use super::csr::*;

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
pub const IS_SENDCTXT_ERR_START: u32 = 32;
pub const IS_DC_START: u32 = 248;
/// The 8051's source within the DC range (chip.c dc_errs[2], handle_8051_interrupt).
pub const DC_DC8051_INT: u32 = 2;
pub const IS_RCVAVAIL_START: u32 = 256;
/// RcvUrgent: one source per receive context (chip.h IS_RCVURGENT_START).
pub const IS_RCVURGENT_START: u32 = 416;
pub const IS_SENDCREDIT_START: u32 = 576;
pub const NUM_INTERRUPT_SOURCES: u32 = 768;

/// The implementation code the chip reports in CCE_REVISION2 (chip.h ICODE_*): what kind of chip the driver
/// believes it drives. The in-process default is the functional simulator, whose link comes up with no
/// firmware loaded; `device-model` serves the RTL simulation unless told otherwise (`Args::hfi1_wfr_icode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Icode {
    /// ICODE_FUNCTIONAL_SIMULATOR: the driver loads no firmware, and its 8051 skips LNI. The stock driver
    /// cannot take an up link down on it (docs/hfi1-fabric.md, "A kernel deadlock the fabric reproduces").
    #[default]
    FunctionalSimulator,
    /// ICODE_RTL_VCS_SIMULATION: timed like silicon, with 8051 firmware the driver loads and authenticates
    /// (`hfi_dc8051.bin`), a full LNI, and the 8051 relaying LCB access; no SerDes, SBus or PCIe firmware.
    RtlSimulation,
}

impl Icode {
    /// The names the command line and recordings use.
    pub const NAMES: [(&'static str, Icode); 2] =
        [("functional-simulator", Icode::FunctionalSimulator), ("rtl-simulation", Icode::RtlSimulation)];

    pub fn parse(name: &str) -> Result<Icode, String> {
        Self::NAMES.iter().find(|(n, _)| *n == name).map(|&(_, i)| i).ok_or_else(|| {
            let names: Vec<&str> = Self::NAMES.iter().map(|(n, _)| *n).collect();
            format!("{name:?}: not an implementation code; one of {}", names.join(", "))
        })
    }

    /// The CCE_REVISION2 IMPL_CODE value (chip.h).
    pub fn value(self) -> u64 {
        match self {
            Icode::FunctionalSimulator => 3,
            Icode::RtlSimulation => 1,
        }
    }

    /// Whether the chip's 8051 runs firmware the host loads.
    pub fn needs_firmware(self) -> bool {
        self != Icode::FunctionalSimulator
    }
}

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
    /// CCE_REVISION2's implementation code.
    pub icode: Icode,
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
            icode: Icode::default(),
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
        if self.pio_mem_size < 0x1000 || self.pio_mem_size > 0x10_0000 || !self.pio_mem_size.is_multiple_of(64) {
            return Err(format!("pio_mem_size {:#x} not a multiple of 64 in 0x1000..=0x100000", self.pio_mem_size));
        }
        if self.sdma_mem_size < 64 * u64::from(self.sdma_engines) || !self.sdma_mem_size.is_multiple_of(64) {
            return Err(format!("sdma_mem_size {:#x} too small or unaligned", self.sdma_mem_size));
        }
        Ok(())
    }
}

/// Interrupt sources a register write raised.
#[derive(Debug, Default)]
pub struct Raised(pub(super) Vec<u32>);

impl Raised {
    pub fn raise(&mut self, source: u32) {
        self.0.push(source);
    }
}
