//! ASIC: the hardware mutex the two HFIs of an ASIC share, the SBus master, the EPROM controller and the QSFP
//! pins. Scratch, GPIO, thermal and PCIe SerDes registers are plain storage (the parent's fallback).

#![forbid(unsafe_code)]

use super::csr::*;

// ASIC_CFG_SBUS_REQUEST / EXECUTE / ASIC_STS_SBUS_RESULT / COUNTERS fields.
pub const ASIC_CFG_SBUS_REQUEST_COMMAND_SHIFT: u32 = 16;
pub const ASIC_CFG_SBUS_EXECUTE_EXECUTE_SMASK: u64 = 0x1;
pub const ASIC_CFG_SBUS_EXECUTE_FAST_MODE_SMASK: u64 = 0x2;
pub const ASIC_STS_SBUS_RESULT_DONE_SMASK: u64 = 0x1;
pub const ASIC_STS_SBUS_RESULT_RCV_DATA_VALID_SMASK: u64 = 0x2;
pub const ASIC_STS_SBUS_RESULT_RESULT_CODE_SHIFT: u32 = 2;
pub const ASIC_STS_SBUS_COUNTERS_RCV_DATA_VALID_CNT_SHIFT: u32 = 16;
/// READ_SBUS_RECEIVER (chip.h) and the result code of a completed read (firmware.c SBUS_READ_COMPLETE).
pub const READ_SBUS_RECEIVER: u64 = 0x22;
pub const SBUS_READ_COMPLETE: u64 = 0x4;
/// Result code of a completed write. INFERRED: the driver never checks it.
pub const SBUS_WRITE_COMPLETE: u64 = 0x1;

// EPROM controller: ASIC_EEP_ADDR_CMD holds a command in bits 31:24 and an address in 23:0.
pub const ASIC_EEP_ADDR_CMD_EP_ADDR_MASK: u64 = 0xFF_FFFF;
pub const EEP_CMD_SHIFT: u32 = 24;
/// CMD_READ_DATA (eprom.c): sets the read address; ASIC_EEP_DATA then returns 4 bytes per read.
pub const EEP_CMD_READ_DATA: u64 = 0x03;

/// The EPROM's first segment (eprom.c SEG_SIZE) ends with a directory footer: this EPROM is formatted but
/// holds no file, so the driver finds no platform configuration after reading one page, as on a board whose
/// EPROM was never programmed with one. Everything else reads as erased flash (0xFF).
pub const EPROM_SEG_SIZE: u64 = 128 * 1024;
/// The footer's dwords, by address: oprom_size 0; num_table_entries 0 and version 1 (FOOTER_VERSION);
/// magic "eprm" (FOOTER_MAGIC, little-endian).
pub const EPROM_FOOTER: [(u64, u32); 3] =
    [(EPROM_SEG_SIZE - 12, 0), (EPROM_SEG_SIZE - 8, 1 << 16), (EPROM_SEG_SIZE - 4, u32::from_le_bytes(*b"eprm"))];
const EPROM_ERASED: u32 = 0xFFFF_FFFF;

// QSFP pins (qsfp.h): inputs read high when nothing drives them low.
pub const QSFP_HFI0_I2CCLK: u64 = 1 << 0;
pub const QSFP_HFI0_I2CDAT: u64 = 1 << 1;
pub const QSFP_HFI0_RESET_N: u64 = 1 << 2;
pub const QSFP_HFI0_INT_N: u64 = 1 << 3;
pub const QSFP_HFI0_MODPRST_N: u64 = 1 << 4;

#[derive(Debug, Default)]
pub struct Asic {
    /// ASIC_CFG_MUTEX: the owner byte written last (0 = free).
    mutex: u8,
    sbus_request: u64,
    sbus_execute: u64,
    sbus_result: u64,
    sbus_executed: u16,
    /// EPROM read address.
    eep_addr: u64,
    qsfp_out: [u64; 2],
}

impl Asic {
    pub fn read(&mut self, offset: u64) -> Option<u64> {
        Some(match offset {
            ASIC_EEP_DATA => self.eep_read(),
            ASIC_CFG_MUTEX => u64::from(self.mutex),
            ASIC_CFG_SBUS_REQUEST => self.sbus_request,
            ASIC_CFG_SBUS_EXECUTE => self.sbus_execute,
            ASIC_STS_SBUS_RESULT => self.sbus_result,
            // Every request executed has returned its data, so the two counters agree.
            ASIC_STS_SBUS_COUNTERS => {
                let n = u64::from(self.sbus_executed);
                n | (n << ASIC_STS_SBUS_COUNTERS_RCV_DATA_VALID_CNT_SHIFT)
            }
            ASIC_EEP_ADDR_CMD => self.eep_addr,
            ASIC_QSFP1_IN => self.qsfp_in(0),
            ASIC_QSFP2_IN => self.qsfp_in(1),
            ASIC_QSFP1_OUT => self.qsfp_out[0],
            ASIC_QSFP2_OUT => self.qsfp_out[1],
            // No module events: STATUS stays 0; CLEAR is write-only.
            ASIC_QSFP1_STATUS | ASIC_QSFP2_STATUS | ASIC_QSFP1_CLEAR | ASIC_QSFP2_CLEAR => 0,
            _ => return None,
        })
    }

    /// Four bytes at the read address, which then advances.
    fn eep_read(&mut self) -> u64 {
        let addr = self.eep_addr;
        self.eep_addr = (addr + 4) & ASIC_EEP_ADDR_CMD_EP_ADDR_MASK;
        u64::from(EPROM_FOOTER.iter().find(|(a, _)| *a == addr).map_or(EPROM_ERASED, |&(_, w)| w))
    }

    pub fn write(&mut self, offset: u64, value: u64) -> bool {
        match offset {
            ASIC_CFG_MUTEX => self.mutex = value as u8,
            ASIC_CFG_SBUS_REQUEST => {
                self.sbus_request = value;
                if self.sbus_execute & ASIC_CFG_SBUS_EXECUTE_FAST_MODE_SMASK != 0 {
                    self.sbus_run();
                }
            }
            ASIC_CFG_SBUS_EXECUTE => {
                let starts = value & !self.sbus_execute & ASIC_CFG_SBUS_EXECUTE_EXECUTE_SMASK != 0;
                self.sbus_execute = value;
                if starts {
                    self.sbus_run();
                } else if value & ASIC_CFG_SBUS_EXECUTE_EXECUTE_SMASK == 0 {
                    // DONE follows EXECUTE down (sbus_request_slow waits for it).
                    self.sbus_result &= !ASIC_STS_SBUS_RESULT_DONE_SMASK;
                }
            }
            ASIC_STS_SBUS_RESULT | ASIC_STS_SBUS_COUNTERS => {}
            ASIC_EEP_ADDR_CMD => {
                if (value >> EEP_CMD_SHIFT) & 0xFF == EEP_CMD_READ_DATA {
                    self.eep_addr = value & ASIC_EEP_ADDR_CMD_EP_ADDR_MASK;
                }
            }
            ASIC_EEP_DATA | ASIC_QSFP1_IN | ASIC_QSFP2_IN | ASIC_QSFP1_STATUS | ASIC_QSFP2_STATUS => {}
            ASIC_QSFP1_CLEAR | ASIC_QSFP2_CLEAR => {}
            ASIC_QSFP1_OUT => self.qsfp_out[0] = value,
            ASIC_QSFP2_OUT => self.qsfp_out[1] = value,
            _ => return false,
        }
        true
    }

    /// One SBus transaction, completed at once: no receiver has firmware, so reads return 0.
    fn sbus_run(&mut self) {
        let command = (self.sbus_request >> ASIC_CFG_SBUS_REQUEST_COMMAND_SHIFT) & 0xFF;
        let code = if command == READ_SBUS_RECEIVER { SBUS_READ_COMPLETE } else { SBUS_WRITE_COMPLETE };
        self.sbus_result = ASIC_STS_SBUS_RESULT_DONE_SMASK
            | ASIC_STS_SBUS_RESULT_RCV_DATA_VALID_SMASK
            | (code << ASIC_STS_SBUS_RESULT_RESULT_CODE_SHIFT);
        self.sbus_executed = self.sbus_executed.wrapping_add(1);
    }

    /// No module is plugged in: MODPRST_N and INT_N read high, the I2C lines float high, RESET_N follows OUT.
    fn qsfp_in(&self, port: usize) -> u64 {
        QSFP_HFI0_I2CCLK
            | QSFP_HFI0_I2CDAT
            | QSFP_HFI0_INT_N
            | QSFP_HFI0_MODPRST_N
            | (self.qsfp_out[port] & QSFP_HFI0_RESET_N)
    }
}
