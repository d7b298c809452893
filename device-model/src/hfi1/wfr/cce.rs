//! CCE: chip identity, the freeze/pause state, and the interrupt block (768 sources in twelve 64-bit status,
//! mask, clear and force registers, routed to MSI-X vectors by CCE_INT_MAP).

#![forbid(unsafe_code)]

use super::csr::*;
use super::{Icode, NUM_INTERRUPT_SOURCES};

/// CCE_REVISION fields.
pub const CCE_REVISION_CHIP_REV_MINOR_SHIFT: u32 = 0;
pub const CCE_REVISION_CHIP_REV_MAJOR_SHIFT: u32 = 8;
pub const CCE_REVISION_SW_SHIFT: u32 = 24;
/// CCE_REVISION2: HFI_ID in bit 0 and IMPL_REVISION in bits 31:16 are 0 here.
pub const CCE_REVISION2_IMPL_CODE_SHIFT: u32 = 8;

/// Chip revision 7.16: minor 0x10 is a B0 part (is_bx: high nibble 1), so the driver does one FLR and none of
/// its A-step work-arounds. Major 7 and SW 3 are this project's choice; the driver only prints them.
pub const CHIP_REV_MAJOR: u64 = 7;
pub const CHIP_REV_MINOR_B0: u64 = 0x10;
pub const CHIP_REV_SW: u64 = 3;

pub const CCE_REVISION_VALUE: u64 = (CHIP_REV_SW << CCE_REVISION_SW_SHIFT)
    | (CHIP_REV_MAJOR << CCE_REVISION_CHIP_REV_MAJOR_SHIFT)
    | (CHIP_REV_MINOR_B0 << CCE_REVISION_CHIP_REV_MINOR_SHIFT);
/// HFI 0 of its ASIC, implementation revision 0, with the chip's implementation code.
pub fn cce_revision2(icode: Icode) -> u64 {
    icode.value() << CCE_REVISION2_IMPL_CODE_SHIFT
}

// CCE_CTRL bits (write-only triggers) and the CCE_STATUS bits they act on.
pub const CCE_CTRL_SPC_FREEZE_SMASK: u64 = 0x100;
pub const CCE_CTRL_SPC_UNFREEZE_SMASK: u64 = 0x200;
pub const CCE_CTRL_RXE_RESUME_SMASK: u64 = 0x800;
pub const CCE_CTRL_TXE_RESUME_SMASK: u64 = 0x2000;
pub const CCE_STATUS_SDMA_FROZE_SMASK: u64 = 0x1;
pub const CCE_STATUS_RXE_FROZE_SMASK: u64 = 0x2;
pub const CCE_STATUS_TXE_FROZE_SMASK: u64 = 0x4;
pub const CCE_STATUS_TXE_PIO_FROZE_SMASK: u64 = 0x8;
pub const CCE_STATUS_SDMA_PAUSED_SMASK: u64 = 0x10;
pub const CCE_STATUS_RXE_PAUSED_SMASK: u64 = 0x20;
pub const CCE_STATUS_TXE_PAUSED_SMASK: u64 = 0x40;
pub const CCE_STATUS_TXE_PIO_PAUSED_SMASK: u64 = 0x80;
/// ALL_FROZE (chip.c).
pub const ALL_FROZE: u64 = CCE_STATUS_SDMA_FROZE_SMASK
    | CCE_STATUS_RXE_FROZE_SMASK
    | CCE_STATUS_TXE_FROZE_SMASK
    | CCE_STATUS_TXE_PIO_FROZE_SMASK;
const ALL_TXE_PAUSE: u64 = CCE_STATUS_TXE_PIO_PAUSED_SMASK | CCE_STATUS_TXE_PAUSED_SMASK | CCE_STATUS_SDMA_PAUSED_SMASK;

/// Interrupt registers per kind (CCE_NUM_INT_CSRS) and CCE_INT_MAP registers (CCE_NUM_INT_MAP_CSRS).
pub const CCE_NUM_INT_CSRS: usize = 12;
pub const CCE_NUM_INT_MAP_CSRS: usize = 96;
const _: () = assert!(CCE_NUM_INT_CSRS * 64 == NUM_INTERRUPT_SOURCES as usize);

#[derive(Debug)]
pub struct Cce {
    /// CCE_REVISION2: identity, set at power-on.
    revision2: u64,
    status: u64,
    int_status: [u64; CCE_NUM_INT_CSRS],
    int_mask: [u64; CCE_NUM_INT_CSRS],
    int_map: [u64; CCE_NUM_INT_MAP_CSRS],
    /// Sources that became deliverable by a FORCE or MASK write, sent after the access.
    deliverable: Vec<u32>,
}

impl Cce {
    pub fn new(icode: Icode) -> Self {
        Cce {
            revision2: cce_revision2(icode),
            status: 0,
            int_status: [0; CCE_NUM_INT_CSRS],
            int_mask: [0; CCE_NUM_INT_CSRS],
            int_map: [0; CCE_NUM_INT_MAP_CSRS],
            deliverable: Vec::new(),
        }
    }
}

/// Index into an array register of `count` 8-byte elements at `base`.
pub(super) fn array_index(offset: u64, base: u64, count: usize) -> Option<usize> {
    let rel = offset.checked_sub(base)?;
    let i = (rel / 8) as usize;
    (i < count).then_some(i)
}

impl Cce {
    pub fn read(&self, offset: u64) -> Option<u64> {
        if let Some(i) = array_index(offset, CCE_INT_STATUS, CCE_NUM_INT_CSRS) {
            return Some(self.int_status[i]);
        }
        if let Some(i) = array_index(offset, CCE_INT_MASK, CCE_NUM_INT_CSRS) {
            return Some(self.int_mask[i]);
        }
        if let Some(i) = array_index(offset, CCE_INT_MAP, CCE_NUM_INT_MAP_CSRS) {
            return Some(self.int_map[i]);
        }
        // CLEAR and FORCE are write-only; BLOCKED (masked-off pending sources held back) has nothing held.
        if array_index(offset, CCE_INT_CLEAR, CCE_NUM_INT_CSRS).is_some()
            || array_index(offset, CCE_INT_FORCE, CCE_NUM_INT_CSRS).is_some()
            || array_index(offset, CCE_INT_BLOCKED, CCE_NUM_INT_CSRS).is_some()
        {
            return Some(0);
        }
        match offset {
            CCE_REVISION => Some(CCE_REVISION_VALUE),
            CCE_REVISION2 => Some(self.revision2),
            CCE_CTRL | CCE_MSIX_INT_GRANTED | CCE_MSIX_VEC_CLR_WITHOUT_INT => Some(0),
            CCE_STATUS => Some(self.status),
            _ => None,
        }
    }

    pub fn write(&mut self, offset: u64, value: u64) -> bool {
        if let Some(i) = array_index(offset, CCE_INT_MASK, CCE_NUM_INT_CSRS) {
            let newly = value & !self.int_mask[i] & self.int_status[i];
            self.int_mask[i] = value;
            self.note_deliverable(i, newly);
            return true;
        }
        if let Some(i) = array_index(offset, CCE_INT_CLEAR, CCE_NUM_INT_CSRS) {
            self.int_status[i] &= !value;
            return true;
        }
        if let Some(i) = array_index(offset, CCE_INT_FORCE, CCE_NUM_INT_CSRS) {
            let newly = value & !self.int_status[i] & self.int_mask[i];
            self.int_status[i] |= value;
            self.note_deliverable(i, newly);
            return true;
        }
        if let Some(i) = array_index(offset, CCE_INT_MAP, CCE_NUM_INT_MAP_CSRS) {
            self.int_map[i] = value;
            return true;
        }
        if array_index(offset, CCE_INT_STATUS, CCE_NUM_INT_CSRS).is_some()
            || array_index(offset, CCE_INT_BLOCKED, CCE_NUM_INT_CSRS).is_some()
        {
            return true; // read-only
        }
        match offset {
            CCE_REVISION | CCE_REVISION2 | CCE_STATUS => true,
            CCE_CTRL => {
                if value & CCE_CTRL_SPC_FREEZE_SMASK != 0 {
                    self.status |= ALL_FROZE;
                }
                if value & CCE_CTRL_SPC_UNFREEZE_SMASK != 0 {
                    self.status &= !ALL_FROZE;
                }
                if value & CCE_CTRL_TXE_RESUME_SMASK != 0 {
                    self.status &= !ALL_TXE_PAUSE;
                }
                if value & CCE_CTRL_RXE_RESUME_SMASK != 0 {
                    self.status &= !CCE_STATUS_RXE_PAUSED_SMASK;
                }
                true
            }
            // Write-only MSI-X maintenance registers with nothing to act on: QEMU owns the PBA.
            CCE_MSIX_INT_GRANTED | CCE_MSIX_VEC_CLR_WITHOUT_INT => true,
            _ => false,
        }
    }

    fn note_deliverable(&mut self, reg: usize, bits: u64) {
        (0..64).filter(|b| bits & (1 << b) != 0).for_each(|b| self.deliverable.push(reg as u32 * 64 + b));
    }

    /// The MSI-X vector CCE_INT_MAP assigns to `source`: one byte per source, eight per register.
    fn vector(&self, source: u32) -> u16 {
        let reg = self.int_map[(source / 8) as usize];
        ((reg >> (8 * (source % 8))) & 0xFF) as u16
    }

    /// Sets `source`'s status bit; returns the vector to send if that made an unmasked source pending.
    pub fn raise(&mut self, source: u32) -> Option<u16> {
        if source >= NUM_INTERRUPT_SOURCES {
            return None;
        }
        let (reg, bit) = ((source / 64) as usize, 1u64 << (source % 64));
        let newly = self.int_status[reg] & bit == 0 && self.int_mask[reg] & bit != 0;
        self.int_status[reg] |= bit;
        newly.then(|| self.vector(source))
    }

    pub fn take_deliverable(&mut self) -> Vec<u16> {
        let sources = std::mem::take(&mut self.deliverable);
        sources.into_iter().map(|s| self.vector(s)).collect()
    }

    pub fn dump(&self) -> serde_json::Value {
        let hex = |a: &[u64]| a.iter().map(|v| format!("{v:#x}")).collect::<Vec<_>>();
        serde_json::json!({
            "status": format!("{:#x}", self.status),
            "int_status": hex(&self.int_status),
            "int_mask": hex(&self.int_mask),
        })
    }
}
