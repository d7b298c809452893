//! DC: the 8051 microcontroller's host interface (command mailbox, RAM window, state), the LCB and the DCC.
//!
//! On the functional simulator the driver loads no 8051 firmware but still talks to it: it loads link
//! configuration, moves the physical port state and reads config fields back. This fake 8051 completes every
//! host command at once with HCMD_SUCCESS, keeps the loaded fields in its RAM, and follows CHANGE_PHY_STATE.
//! No link partner exists, so the port never trains: POLLING stays POLLING.

#![forbid(unsafe_code)]

use std::collections::HashMap;

use super::csr::*;
use super::WfrShape;

// DC_DC8051_CFG_HOST_CMD_0 / _1 fields.
pub const HOST_CMD_0_REQ_NEW_SMASK: u64 = 0x1;
pub const HOST_CMD_0_REQ_TYPE_SHIFT: u32 = 8;
pub const HOST_CMD_0_REQ_TYPE_MASK: u64 = 0xFF;
pub const HOST_CMD_0_REQ_DATA_SHIFT: u32 = 16;
pub const HOST_CMD_1_COMPLETED_SMASK: u64 = 0x1;
pub const HOST_CMD_1_RETURN_CODE_SHIFT: u32 = 8;
pub const HOST_CMD_1_RSP_DATA_SHIFT: u32 = 16;
pub const HOST_CMD_1_RSP_DATA_MASK: u64 = 0xFFFF_FFFF_FFFF;

/// Host command types and the success code (chip.h).
pub const HCMD_LOAD_CONFIG_DATA: u64 = 0x01;
pub const HCMD_READ_CONFIG_DATA: u64 = 0x02;
pub const HCMD_CHANGE_PHY_STATE: u64 = 0x03;
pub const HCMD_SUCCESS: u64 = 2;
/// LOAD_CONFIG_DATA's data: field id, lane id, value (chip.h LOAD_DATA_*).
pub const LOAD_DATA_FIELD_ID_SHIFT: u32 = 40;
pub const LOAD_DATA_FIELD_ID_MASK: u64 = 0xF;
pub const LOAD_DATA_LANE_ID_SHIFT: u32 = 32;
pub const LOAD_DATA_LANE_ID_MASK: u64 = 0xF;
pub const LOAD_DATA_DATA_MASK: u64 = 0xFFFF_FFFF;
/// Where read_8051_config finds a field: general fields first, then eight per lane (chip.h NUM_*_FIELDS).
pub const NUM_GENERAL_FIELDS: u64 = 0x17;
pub const NUM_LANE_FIELDS: u64 = 0x8;

// DC_DC8051_CFG_RAM_ACCESS_* fields.
pub const RAM_ACCESS_CTRL_ADDRESS_MASK: u64 = 0x7FFF;
pub const RAM_ACCESS_CTRL_WRITE_ENA_SMASK: u64 = 0x100_0000;
pub const RAM_ACCESS_STATUS_ACCESS_COMPLETED_SMASK: u64 = 0x1_0000;

// DC_DC8051_STS_CUR_STATE fields and values.
pub const STS_CUR_STATE_PORT_MASK: u64 = 0xFF;
pub const STS_CUR_STATE_FIRMWARE_SHIFT: u32 = 16;
/// The firmware state a ready 8051 reports (firmware.c wait_fm_ready).
pub const FIRMWARE_READY: u64 = 0xA0;
/// PLS_OFFLINE_QUIET: where the port starts and goes back to on reset.
pub const PLS_OFFLINE: u64 = 0x90;
pub const DC_DC8051_CFG_RST_M8051W_SMASK: u64 = 0x1;

/// DCC_CFG_PORT_CONFIG's power-on value: logical link state 1 (Down).
pub const DCC_CFG_PORT_CONFIG_LINK_STATE_SHIFT: u32 = 48;
pub const LSTATE_DOWN: u64 = 1;
pub const DCC_CFG_PORT_CONFIG_RESET: u64 = LSTATE_DOWN << DCC_CFG_PORT_CONFIG_LINK_STATE_SHIFT;

pub const DC_LCB_CFG_RUN_EN_SMASK: u64 = 0x1;

#[derive(Debug)]
pub struct Dc {
    host_cmd_0: u64,
    host_cmd_1: u64,
    /// Physical port state (PLS_*).
    port: u64,
    /// 8051 RAM, by 8-byte-aligned address; absent qwords read 0.
    ram: HashMap<u64, u64>,
    ram_ctrl: u64,
    ram_wr_data: u64,
    lcb_run: u64,
    /// Commands by type, since reset.
    commands: HashMap<u8, u64>,
}

impl Default for Dc {
    fn default() -> Self {
        Dc {
            host_cmd_0: 0,
            host_cmd_1: 0,
            port: PLS_OFFLINE,
            ram: HashMap::new(),
            ram_ctrl: 0,
            ram_wr_data: 0,
            lcb_run: 0,
            commands: HashMap::new(),
        }
    }
}

/// The RAM address of config field `field` of `lane` (read_8051_config): lanes 0-3 after the general fields,
/// anything else is the general block.
pub fn config_addr(field: u64, lane: u64) -> u64 {
    let base = if lane < 4 { 4 * NUM_GENERAL_FIELDS + lane * 4 * NUM_LANE_FIELDS } else { 0 };
    base + field * 4
}

impl Dc {
    pub fn read(&mut self, offset: u64, shape: &WfrShape) -> Option<u64> {
        Some(match offset {
            DC_DC8051_CFG_HOST_CMD_0 => self.host_cmd_0,
            DC_DC8051_CFG_HOST_CMD_1 => self.host_cmd_1,
            DC_DC8051_STS_CUR_STATE => (FIRMWARE_READY << STS_CUR_STATE_FIRMWARE_SHIFT) | self.port,
            DC_DC8051_CFG_LOCAL_GUID => shape.guid,
            DC_DC8051_CFG_RAM_ACCESS_CTRL => self.ram_ctrl,
            // Accesses complete at once.
            DC_DC8051_CFG_RAM_ACCESS_STATUS => RAM_ACCESS_STATUS_ACCESS_COMPLETED_SMASK,
            DC_DC8051_CFG_RAM_ACCESS_RD_DATA => self.ram_qword(self.ram_ctrl),
            DC_DC8051_CFG_RAM_ACCESS_WR_DATA => self.ram_wr_data,
            DC_LCB_CFG_RUN => self.lcb_run,
            // The LCB transfers only while it runs; with no partner that is the loopback case.
            DC_LCB_STS_LINK_TRANSFER_ACTIVE => self.lcb_run & DC_LCB_CFG_RUN_EN_SMASK,
            _ => return None,
        })
    }

    pub fn write(&mut self, offset: u64, value: u64) -> bool {
        match offset {
            DC_DC8051_CFG_HOST_CMD_0 => self.host_command(value),
            DC_DC8051_CFG_RAM_ACCESS_CTRL => {
                self.ram_ctrl = value;
                if value & RAM_ACCESS_CTRL_WRITE_ENA_SMASK != 0 {
                    self.ram.insert(value & RAM_ACCESS_CTRL_ADDRESS_MASK & !7, self.ram_wr_data);
                }
            }
            DC_DC8051_CFG_RAM_ACCESS_WR_DATA => self.ram_wr_data = value,
            DC_DC8051_CFG_RST => {
                if value & DC_DC8051_CFG_RST_M8051W_SMASK != 0 {
                    self.reset_8051();
                }
                return false; // also kept as storage
            }
            DC_LCB_CFG_RUN => self.lcb_run = value,
            DC_DC8051_CFG_HOST_CMD_1
            | DC_DC8051_STS_CUR_STATE
            | DC_DC8051_CFG_LOCAL_GUID
            | DC_DC8051_CFG_RAM_ACCESS_STATUS
            | DC_DC8051_CFG_RAM_ACCESS_RD_DATA
            | DC_LCB_STS_LINK_TRANSFER_ACTIVE => {}
            _ => return false,
        }
        true
    }

    /// The 8051 in reset forgets its state; the port is back offline.
    pub fn reset_8051(&mut self) {
        let commands = std::mem::take(&mut self.commands);
        *self = Dc { commands, ..Dc::default() };
    }

    fn ram_qword(&self, ctrl: u64) -> u64 {
        self.ram.get(&(ctrl & RAM_ACCESS_CTRL_ADDRESS_MASK & !7)).copied().unwrap_or(0)
    }

    fn ram_u32(&self, addr: u64) -> u64 {
        let q = self.ram_qword(addr);
        if addr & 4 != 0 {
            q >> 32
        } else {
            q & 0xFFFF_FFFF
        }
    }

    fn set_ram_u32(&mut self, addr: u64, value: u64) {
        let key = addr & RAM_ACCESS_CTRL_ADDRESS_MASK & !7;
        let q = self.ram.get(&key).copied().unwrap_or(0);
        let q = if addr & 4 != 0 { (q & 0xFFFF_FFFF) | (value << 32) } else { (q & !0xFFFF_FFFF) | value };
        self.ram.insert(key, q);
    }

    /// HOST_CMD_0: the driver writes the request, then the same with REQ_NEW, polls COMPLETED, and writes 0.
    fn host_command(&mut self, value: u64) {
        let starts = value & !self.host_cmd_0 & HOST_CMD_0_REQ_NEW_SMASK != 0;
        self.host_cmd_0 = value;
        if value & HOST_CMD_0_REQ_NEW_SMASK == 0 {
            self.host_cmd_1 = 0;
            return;
        }
        if !starts {
            return;
        }
        let kind = (value >> HOST_CMD_0_REQ_TYPE_SHIFT) & HOST_CMD_0_REQ_TYPE_MASK;
        let data = value >> HOST_CMD_0_REQ_DATA_SHIFT;
        *self.commands.entry(kind as u8).or_default() += 1;
        let response = match kind {
            HCMD_LOAD_CONFIG_DATA => {
                let field = (data >> LOAD_DATA_FIELD_ID_SHIFT) & LOAD_DATA_FIELD_ID_MASK;
                let lane = (data >> LOAD_DATA_LANE_ID_SHIFT) & LOAD_DATA_LANE_ID_MASK;
                self.set_ram_u32(config_addr(field, lane), data & LOAD_DATA_DATA_MASK);
                0
            }
            HCMD_READ_CONFIG_DATA => {
                let field = (data >> LOAD_DATA_FIELD_ID_SHIFT) & LOAD_DATA_FIELD_ID_MASK;
                let lane = (data >> LOAD_DATA_LANE_ID_SHIFT) & LOAD_DATA_LANE_ID_MASK;
                self.ram_u32(config_addr(field, lane))
            }
            HCMD_CHANGE_PHY_STATE => {
                self.port = data & STS_CUR_STATE_PORT_MASK;
                0
            }
            // LCB access grants, idle messages, LCB CSR relays, the interface test: accepted, nothing to return.
            _ => 0,
        };
        self.host_cmd_1 = ((response & HOST_CMD_1_RSP_DATA_MASK) << HOST_CMD_1_RSP_DATA_SHIFT)
            | (HCMD_SUCCESS << HOST_CMD_1_RETURN_CODE_SHIFT)
            | HOST_CMD_1_COMPLETED_SMASK;
    }

    pub fn dump(&self) -> serde_json::Value {
        let mut commands: Vec<(u8, u64)> = self.commands.iter().map(|(&k, &n)| (k, n)).collect();
        commands.sort_unstable();
        serde_json::json!({
            "port_state": format!("{:#x}", self.port),
            "host_commands": commands.iter().map(|(k, n)| serde_json::json!({"type": k, "count": n}))
                .collect::<Vec<_>>(),
        })
    }
}
