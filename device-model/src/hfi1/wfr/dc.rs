//! DC: the 8051 microcontroller's host interface (command mailbox, RAM window, state), the LCB and the DCC,
//! and the port's link as the functional simulator's 8051 runs it (docs/hfi1-fabric.md, "The link").
//!
//! On the functional simulator the driver loads no 8051 firmware but still talks to it: it loads link
//! configuration, moves the physical port state and reads config fields back. This 8051 completes every host
//! command at once with HCMD_SUCCESS, keeps the loaded fields in its RAM, and follows CHANGE_PHY_STATE. The
//! link itself is the cable's: once the host has seen the port poll, the port asks the cable to train
//! ([`Phy::Polling`]); the cable's link-up moves the port to LinkUp and the logical state to INIT, fills the
//! neighbour registers and posts LINKUP_ACHIEVED (chip.c handle_8051_interrupt, handle_link_up); the
//! neighbour's loss posts LINK_GOING_DOWN with a link-down reason (handle_link_down). Without a cable, or with
//! nobody at the other end, POLLING stays POLLING.

#![forbid(unsafe_code)]

use std::collections::HashMap;

use emu_abi::dc8051::{decode_payload, FirmwareVersion};

use super::csr::*;
use super::WfrShape;
use crate::hfi1::cable::{LinkEvent, Neighbor, Phy, VerifyCapFrame};

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
pub const HCMD_SEND_LCB_IDLE_MSG: u64 = 0x04;
pub const HCMD_READ_LCB_IDLE_MSG: u64 = 0x06;
pub const HCMD_READ_LCB_CSR: u64 = 0x07;
pub const HCMD_WRITE_LCB_CSR: u64 = 0x08;
/// LCB CSR relays: the register is an index from DC_LCB_CFG_RUN in the request's bits 7:0; a write's value
/// has bits 39:0 in the request above that, bits 47:40 in DC_DC8051_CFG_EXT_DEV_0's RETURN_CODE field and
/// 63:48 in its RSP_DATA field; a read's bits 63:48 come back in DC_DC8051_CFG_EXT_DEV_1 bits 31:16
/// (chip.c do_8051_command, read_lcb_via_8051, write_lcb_via_8051).
pub const LCB_REGNO_MASK: u64 = 0xFF;
pub const LCB_WRITE_DATA_SHIFT: u32 = 8;
pub const LCB_WRITE_DATA_MASK: u64 = 0xFF_FFFF_FFFF;
pub const EXT_DEV_0_RETURN_CODE_SHIFT: u32 = 8;
pub const EXT_DEV_0_RSP_DATA_SHIFT: u32 = 16;
pub const EXT_DEV_1_REQ_DATA_SHIFT: u32 = 16;
/// Idle messages (chip.h): the type in bits 3:0 of the request; SMA messages are type 3.
pub const IDLE_MSG_TYPE_MASK: u64 = 0xF;
pub const IDLE_SMA: u64 = 0x3;
/// CHANGE_PHY_STATE's data: the state in bits 7:0, the down reason sent to the neighbour in bits 15:8
/// (goto_offline: `(rem_reason << 8) | PLS_OFFLINE`).
pub const PHY_STATE_MASK: u64 = 0xFF;
pub const PHY_REASON_SHIFT: u32 = 8;
pub const PHY_REASON_MASK: u64 = 0xFF;
pub const HCMD_SUCCESS: u64 = 2;
/// LOAD_CONFIG_DATA's data: field id, lane id, value (chip.h LOAD_DATA_*).
pub const LOAD_DATA_FIELD_ID_SHIFT: u32 = 40;
pub const LOAD_DATA_FIELD_ID_MASK: u64 = 0xF;
pub const LOAD_DATA_LANE_ID_SHIFT: u32 = 32;
pub const LOAD_DATA_LANE_ID_MASK: u64 = 0xF;
pub const LOAD_DATA_DATA_MASK: u64 = 0xFFFF_FFFF;
/// READ_CONFIG_DATA's data: the same places, 8-bit ids (chip.h READ_DATA_*).
pub const READ_DATA_FIELD_ID_MASK: u64 = 0xFF;
pub const READ_DATA_LANE_ID_MASK: u64 = 0xFF;
/// Where read_8051_config finds a field: general fields first, then eight per lane (chip.h NUM_*_FIELDS).
pub const NUM_GENERAL_FIELDS: u64 = 0x17;
pub const NUM_LANE_FIELDS: u64 = 0x8;

// DC_DC8051_CFG_RAM_ACCESS_* fields.
pub const RAM_ACCESS_SETUP_RAM_SEL_SMASK: u64 = 0x1;
pub const RAM_ACCESS_SETUP_AUTO_INCR_ADDR_SMASK: u64 = 0x100;
pub const RAM_ACCESS_CTRL_ADDRESS_MASK: u64 = 0x7FFF;
pub const RAM_ACCESS_CTRL_WRITE_ENA_SMASK: u64 = 0x100_0000;
/// The code RAM: 32 KiB, the reach of the access address (the driver loads the firmware from address 0).
pub const CODE_RAM_QWORDS: usize = (RAM_ACCESS_CTRL_ADDRESS_MASK as usize + 1) / 8;
pub const RAM_ACCESS_STATUS_ACCESS_COMPLETED_SMASK: u64 = 0x1_0000;

// DC_DC8051_STS_CUR_STATE fields and values.
pub const STS_CUR_STATE_FIRMWARE_SHIFT: u32 = 16;
/// The firmware state a ready 8051 reports (firmware.c wait_fm_ready).
pub const FIRMWARE_READY: u64 = 0xA0;
/// Physical link states (chip.h PLS_*): OFFLINE (OFFLINE_QUIET) is where the port starts and goes back to
/// on reset; the offline substates are 0x9X.
pub const PLS_OFFLINE: u64 = 0x90;
pub const PLS_OFFLINE_MASK: u64 = 0xF0;
pub const PLS_POLLING: u64 = 0x20;
pub const PLS_DISABLED: u64 = 0x30;
pub const PLS_LINKUP: u64 = 0x50;
/// Where the 8051 waits while the host handles the neighbour's VerifyCap frame (chip.h
/// PLS_CONFIGPHY_VERIFYCAP; set_link_state(HLS_VERIFY_CAP) logs it).
pub const PLS_CONFIGPHY_VERIFYCAP: u64 = 0x46;
/// DC_DC8051_CFG_RST: the core reset, and the code-RAM reset (chip_registers.h).
pub const DC_DC8051_CFG_RST_M8051W_SMASK: u64 = 0x1;
pub const DC_DC8051_CFG_RST_CRAM_SMASK: u64 = 0x2;

/// DCC_CFG_PORT_CONFIG.LINK_STATE and the logical states (chip.h LSTATE_*); the power-on value is Down.
pub const DCC_CFG_PORT_CONFIG_LINK_STATE_SHIFT: u32 = 48;
pub const DCC_CFG_PORT_CONFIG_LINK_STATE_MASK: u64 = 0x7;
pub const LSTATE_DOWN: u64 = 1;
pub const LSTATE_INIT: u64 = 2;
pub const LSTATE_ARMED: u64 = 3;
pub const LSTATE_ACTIVE: u64 = 4;
pub const DCC_CFG_PORT_CONFIG_RESET: u64 = LSTATE_DOWN << DCC_CFG_PORT_CONFIG_LINK_STATE_SHIFT;
/// DCC_CFG_PORT_CONFIG1: the receive DLID filter (set_lidlmc).
pub const DCC_CFG_PORT_CONFIG1_TARGET_DLID_MASK: u64 = 0xFFFF;
pub const DCC_CFG_PORT_CONFIG1_DLID_MASK_SHIFT: u32 = 16;
pub const DCC_CFG_PORT_CONFIG1_DLID_MASK_MASK: u64 = 0xFFFF;

/// DC_DC8051_ERR_FLG.SET_BY_8051: the 8051 has news in DBG_ERR_INFO_SET_BY_8051.
pub const DC_DC8051_ERR_FLG_SET_BY_8051_SMASK: u64 = 0x1;
/// HOST_MSG flags (chip.h).
pub const BC_SMA_MSG: u64 = 1 << 2;
pub const VERIFY_CAP_FRAME: u64 = 1 << 6;
pub const LINKUP_ACHIEVED: u64 = 1 << 7;
pub const LINK_GOING_DOWN: u64 = 1 << 8;
/// The VerifyCap fields (chip.h): what the host loads for its own frame, where the 8051 shows the
/// neighbour's, and the transmit rate in TX_SETTINGS (MAX_RATE) and in the remote link width.
pub const TX_SETTINGS: u64 = 0x06;
pub const MAX_RATE_SHIFT: u32 = 24;
pub const VERIFY_CAP_LOCAL_PHY: u64 = 0x07;
pub const VERIFY_CAP_LOCAL_FABRIC: u64 = 0x08;
pub const VERIFY_CAP_LOCAL_LINK_MODE: u64 = 0x09;
pub const LOCAL_DEVICE_ID: u64 = 0x0a;
pub const VERIFY_CAP_REMOTE_PHY: u64 = 0x0f;
pub const VERIFY_CAP_REMOTE_FABRIC: u64 = 0x10;
pub const VERIFY_CAP_REMOTE_LINK_WIDTH: u64 = 0x11;
pub const REMOTE_DEVICE_ID: u64 = 0x15;
pub const REMOTE_TX_RATE_SHIFT: u32 = 16;
/// Link widths: bit n-1 enables nX (chip.c opa_to_vc_link_widths); after VerifyCap the 8051 puts the active
/// transmitter and receiver counts in bits 15:12 and 11:8 of the local link mode (chip.c get_linkup_widths).
pub const LINK_WIDTH_ENABLE_MASK: u64 = 0xF;
pub const LINK_WIDTH_ACTIVE_TX_SHIFT: u32 = 12;
pub const LINK_WIDTH_ACTIVE_RX_SHIFT: u32 = 8;
pub const LINK_WIDTH_ACTIVE_MASK: u64 = 0xFF00;
/// LOCAL_LNI_INFO: the lanes receiving after LNI, a bit each in 23:16 (chip.c read_local_lni).
pub const LOCAL_LNI_INFO: u64 = 0x0c;
pub const ENABLE_LANE_RX_SHIFT: u32 = 16;
pub const ENABLE_LANE_RX_MASK: u64 = 0xFF;
/// 8051 general config fields the driver reads after a link loss (chip.h): the reason the link went down
/// (byte 0) and, in LINK_QUALITY_INFO bits 23:16, the neighbour's planned-down reason.
pub const LINK_QUALITY_INFO: u64 = 0x14;
/// LINK_DOWN_REASON is the first byte of its field, VERSION_PATCH the last (chip.h).
pub const LINK_DOWN_REASON: u64 = 0x16;
pub const LINK_DOWN_REASON_MASK: u64 = 0xFF;
pub const VERSION_PATCH: u64 = 0x16;
/// The running firmware's version (chip.c read_misc_status): MISC_STATUS holds major and minor.
pub const MISC_STATUS: u64 = 0x0e;
pub const STS_FM_VERSION_MINOR_SHIFT: u32 = 16;
pub const STS_FM_VERSION_MAJOR_SHIFT: u32 = 24;
pub const STS_FM_VERSION_PATCH_SHIFT: u32 = 24;
pub const GENERAL_CONFIG: u64 = 4;
pub const DOWN_REMOTE_REASON_SHIFT: u32 = 16;
/// Link-down reasons (chip.h LDR_*): the link dropped with no word from the neighbour, or the neighbour sent
/// its link-down idle message.
pub const LDR_LINK_TRANSFER_ACTIVE_LOW: u64 = 0xa;
pub const LDR_RECEIVED_LINKDOWN_IDLE_MSG: u64 = 0xb;

pub const DC_LCB_CFG_RUN_EN_SMASK: u64 = 0x1;

#[derive(Debug)]
pub struct Dc {
    host_cmd_0: u64,
    host_cmd_1: u64,
    /// Physical port state (PLS_*).
    port: u64,
    /// Whether this 8051 runs firmware the host loads (every chip but the functional simulator, whose 8051
    /// is always ready).
    needs_firmware: bool,
    /// The firmware the 8051 runs, once it passed the security engine and left reset.
    firmware: Option<FirmwareVersion>,
    /// 8051 data RAM, by 8-byte-aligned address; absent qwords read 0.
    ram: HashMap<u64, u64>,
    /// 8051 code RAM, where the host loads the firmware.
    code: Vec<u64>,
    ram_setup: u64,
    ram_ctrl: u64,
    ram_wr_data: u64,
    lcb_run: u64,
    /// Commands by type, since reset.
    commands: HashMap<u8, u64>,
    /// DCC_CFG_PORT_CONFIG: the driver's MTU and logical state, which link events move too.
    port_config: u64,
    /// The neighbour the STS_REMOTE_* registers show while the link is up.
    remote: Option<Neighbor>,
    /// DBG_ERR_INFO_SET_BY_8051: messages posted and not yet read.
    info: u64,
    /// POLLING was commanded and the host has not read the port state since.
    poll_unseen: bool,
    /// What the port has to tell the cable, taken after each access.
    signal: Option<Phy>,
    link_ups: u64,
    link_downs: u64,
    /// An LCB CSR access a host command asked for, which the chip carries out (the LCB is not the DC's).
    lcb_request: Option<LcbAccess>,
    /// DC_DC8051_CFG_EXT_DEV_0 (the high bits of an LCB write) and DC_DC8051_CFG_EXT_DEV_1 (of a read).
    ext_dev_0: u64,
    ext_dev_1: u64,
    /// The last idle message of each type the neighbour sent.
    idle: [u64; 16],
    /// A host command posted a host message: the 8051 interrupt is due.
    posted: bool,
    /// The type of the host command being carried out (an LCB relay completes after the write).
    command: u8,
    /// The command type the 8051 replied to in HOST_CMD_1 since the last HOST_CMD_0 write: a hostile
    /// chip's reply hook edits that reply (`Wfr::hostile_8051_reply`).
    replied: Option<u8>,
}

/// An LCB CSR access relayed through the 8051.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LcbAccess {
    Read(u64),
    Write(u64, u64),
}

impl Default for Dc {
    fn default() -> Self {
        Dc {
            host_cmd_0: 0,
            host_cmd_1: 0,
            port: PLS_OFFLINE,
            needs_firmware: false,
            firmware: None,
            ram: HashMap::new(),
            code: vec![0; CODE_RAM_QWORDS],
            ram_setup: 0,
            ram_ctrl: 0,
            ram_wr_data: 0,
            lcb_run: 0,
            commands: HashMap::new(),
            port_config: DCC_CFG_PORT_CONFIG_RESET,
            remote: None,
            info: 0,
            poll_unseen: false,
            signal: None,
            link_ups: 0,
            link_downs: 0,
            lcb_request: None,
            ext_dev_0: 0,
            ext_dev_1: 0,
            idle: [0; 16],
            posted: false,
            command: 0,
            replied: None,
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
    /// The 8051 of a chip that loads firmware (`needs_firmware`), or the functional simulator's.
    pub fn new(needs_firmware: bool) -> Self {
        Dc { needs_firmware, ..Dc::default() }
    }

    /// Whether the 8051 takes host requests: DC_DC8051_STS_CUR_STATE.FIRMWARE reads 0xA0 (wait_fm_ready).
    fn ready(&self) -> bool {
        !self.needs_firmware || self.firmware.is_some()
    }

    /// The code RAM, which the security engine checks.
    pub fn code(&self) -> &[u64] {
        &self.code
    }

    /// The host released the 8051 from reset: it runs the loaded firmware if the security engine passed it
    /// and it is an image of this project (`emu_abi::dc8051`); else it never reports ready.
    pub fn release(&mut self, authorised: bool) {
        if !self.needs_firmware || self.firmware.is_some() || !authorised {
            return;
        }
        let code: Vec<u8> = self.code.iter().flat_map(|q| q.to_le_bytes()).collect();
        let Some(v) = decode_payload(&code) else {
            return;
        };
        self.firmware = Some(v);
        let status =
            (u64::from(v.major) << STS_FM_VERSION_MAJOR_SHIFT) | (u64::from(v.minor) << STS_FM_VERSION_MINOR_SHIFT);
        self.set_ram_u32(config_addr(MISC_STATUS, GENERAL_CONFIG), status);
        let patch_addr = config_addr(VERSION_PATCH, GENERAL_CONFIG);
        let field = self.ram_u32(patch_addr) & !(0xFF << STS_FM_VERSION_PATCH_SHIFT);
        self.set_ram_u32(patch_addr, field | (u64::from(v.patch) << STS_FM_VERSION_PATCH_SHIFT));
    }

    pub fn read(&mut self, offset: u64, shape: &WfrShape) -> Option<u64> {
        Some(match offset {
            DC_DC8051_CFG_HOST_CMD_0 => self.host_cmd_0,
            DC_DC8051_CFG_HOST_CMD_1 => self.host_cmd_1,
            DC_DC8051_STS_CUR_STATE => {
                // The host has seen the port poll (log_physical_state after CHANGE_PHY_STATE): the link may
                // train now without the link-up racing the driver's own POLL bookkeeping.
                if self.port == PLS_POLLING && std::mem::take(&mut self.poll_unseen) {
                    self.signal = Some(Phy::Polling);
                }
                let firmware = if self.ready() { FIRMWARE_READY } else { 0 };
                (firmware << STS_CUR_STATE_FIRMWARE_SHIFT) | self.port
            }
            DC_DC8051_CFG_LOCAL_GUID => shape.guid,
            DC_DC8051_STS_REMOTE_GUID => self.remote.map_or(0, |n| n.guid),
            DC_DC8051_STS_REMOTE_NODE_TYPE => self.remote.map_or(0, |n| u64::from(n.node_type)),
            DC_DC8051_STS_REMOTE_PORT_NO => self.remote.map_or(0, |n| u64::from(n.port)),
            // The neighbour's FM security setting: disabled (0), as the reference suggests.
            DC_DC8051_STS_REMOTE_FM_SECURITY => 0,
            // Read once per SET_BY_8051 interrupt (handle_8051_interrupt) and never written by the driver: it
            // shows the messages posted since the last read, so an old LINKUP_ACHIEVED is not seen twice.
            DC_DC8051_DBG_ERR_INFO_SET_BY_8051 => std::mem::take(&mut self.info),
            DCC_CFG_PORT_CONFIG => self.port_config,
            DC_DC8051_CFG_RAM_ACCESS_CTRL => self.ram_ctrl,
            // Accesses complete at once.
            DC_DC8051_CFG_RAM_ACCESS_STATUS => RAM_ACCESS_STATUS_ACCESS_COMPLETED_SMASK,
            DC_DC8051_CFG_RAM_ACCESS_SETUP => self.ram_setup,
            DC_DC8051_CFG_RAM_ACCESS_RD_DATA => {
                let v = if self.code_selected() { self.code[self.code_index()] } else { self.ram_qword(self.ram_ctrl) };
                self.auto_increment();
                v
            }
            DC_DC8051_CFG_RAM_ACCESS_WR_DATA => self.ram_wr_data,
            DC_DC8051_CFG_EXT_DEV_0 => self.ext_dev_0,
            DC_DC8051_CFG_EXT_DEV_1 => self.ext_dev_1,
            DC_LCB_CFG_RUN => self.lcb_run,
            // The LCB transfers only while it runs; with no partner that is the loopback case.
            DC_LCB_STS_LINK_TRANSFER_ACTIVE => self.lcb_run & DC_LCB_CFG_RUN_EN_SMASK,
            _ => return None,
        })
    }

    pub fn write(&mut self, offset: u64, value: u64) -> bool {
        match offset {
            DC_DC8051_CFG_HOST_CMD_0 => self.host_command(value),
            DC_DC8051_CFG_RAM_ACCESS_SETUP => self.ram_setup = value,
            DC_DC8051_CFG_RAM_ACCESS_CTRL => self.ram_ctrl = value,
            // write_8051: the set-up selects the RAM and auto-increment, CTRL the address and WRITE_ENA; each
            // data write lands at the address.
            DC_DC8051_CFG_RAM_ACCESS_WR_DATA => {
                self.ram_wr_data = value;
                if self.ram_ctrl & RAM_ACCESS_CTRL_WRITE_ENA_SMASK != 0 {
                    if self.code_selected() {
                        let i = self.code_index();
                        self.code[i] = value;
                    } else {
                        self.ram.insert(self.ram_ctrl & RAM_ACCESS_CTRL_ADDRESS_MASK & !7, value);
                    }
                    self.auto_increment();
                }
            }
            DC_DC8051_CFG_RST => {
                if value & DC_DC8051_CFG_RST_M8051W_SMASK != 0 {
                    self.reset_8051(value & DC_DC8051_CFG_RST_CRAM_SMASK == 0);
                }
                return false; // also kept as storage; the caller releases the 8051 when the core reset clears
            }
            DC_LCB_CFG_RUN => self.lcb_run = value,
            DCC_CFG_PORT_CONFIG => self.port_config = value,
            DC_DC8051_CFG_EXT_DEV_0 => self.ext_dev_0 = value,
            DC_DC8051_CFG_EXT_DEV_1 => {}
            DC_DC8051_CFG_HOST_CMD_1
            | DC_DC8051_STS_CUR_STATE
            | DC_DC8051_CFG_LOCAL_GUID
            | DC_DC8051_STS_REMOTE_GUID
            | DC_DC8051_STS_REMOTE_NODE_TYPE
            | DC_DC8051_STS_REMOTE_PORT_NO
            | DC_DC8051_STS_REMOTE_FM_SECURITY
            | DC_DC8051_DBG_ERR_INFO_SET_BY_8051
            | DC_DC8051_CFG_RAM_ACCESS_STATUS
            | DC_DC8051_CFG_RAM_ACCESS_RD_DATA
            | DC_LCB_STS_LINK_TRANSFER_ACTIVE => {}
            _ => return false,
        }
        true
    }

    /// The 8051 in reset forgets its state and stops its firmware; the port is back offline, and a link it
    /// held drops. The code RAM survives unless `keep_code` is false (its own reset bit, or the DC's reset):
    /// dc_shutdown and dc_start hold and release the core alone and expect the firmware to start again.
    pub fn reset_8051(&mut self, keep_code: bool) {
        let commands = std::mem::take(&mut self.commands);
        let (ups, downs) = (self.link_ups, self.link_downs);
        let signal = self.port_active().then_some(Phy::Down { reason: None });
        let code = if keep_code { std::mem::take(&mut self.code) } else { vec![0; CODE_RAM_QWORDS] };
        *self = Dc {
            commands,
            link_ups: ups,
            link_downs: downs,
            signal,
            needs_firmware: self.needs_firmware,
            code,
            ..Dc::default()
        };
    }

    fn code_selected(&self) -> bool {
        self.ram_setup & RAM_ACCESS_SETUP_RAM_SEL_SMASK != 0
    }

    fn code_index(&self) -> usize {
        ((self.ram_ctrl & RAM_ACCESS_CTRL_ADDRESS_MASK) / 8) as usize
    }

    /// After a data access with AUTO_INCR_ADDR, the address moves to the next qword (wrapping in the RAM).
    fn auto_increment(&mut self) {
        if self.ram_setup & RAM_ACCESS_SETUP_AUTO_INCR_ADDR_SMASK == 0 {
            return;
        }
        let addr = ((self.ram_ctrl & RAM_ACCESS_CTRL_ADDRESS_MASK & !7) + 8) & RAM_ACCESS_CTRL_ADDRESS_MASK;
        self.ram_ctrl = (self.ram_ctrl & !RAM_ACCESS_CTRL_ADDRESS_MASK) | addr;
    }

    /// Whether the port is out of Offline and Disabled: polling, or up.
    fn port_active(&self) -> bool {
        self.port & PLS_OFFLINE_MASK != PLS_OFFLINE && self.port != PLS_DISABLED
    }

    /// What the port has to tell the cable since the last call.
    pub fn take_signal(&mut self) -> Option<Phy> {
        self.signal.take()
    }

    /// Whether the physical link is up (packets may leave).
    pub fn link_up(&self) -> bool {
        self.port == PLS_LINKUP
    }

    /// The logical link state (LSTATE_*).
    pub fn logical_state(&self) -> u64 {
        (self.port_config >> DCC_CFG_PORT_CONFIG_LINK_STATE_SHIFT) & DCC_CFG_PORT_CONFIG_LINK_STATE_MASK
    }

    fn set_logical_state(&mut self, state: u64) {
        let field = DCC_CFG_PORT_CONFIG_LINK_STATE_MASK << DCC_CFG_PORT_CONFIG_LINK_STATE_SHIFT;
        self.port_config = (self.port_config & !field) | (state << DCC_CFG_PORT_CONFIG_LINK_STATE_SHIFT);
    }

    /// Applies the cable's news. Returns the HOST_MSG bits posted (the caller raises the 8051 interrupt),
    /// `None` if the event no longer applies: a link-up for a port that left Polling, a loss for a port that
    /// was not up.
    pub fn link_event(&mut self, event: LinkEvent) -> Option<u64> {
        match event {
            LinkEvent::Up(neighbor) => {
                if self.port != PLS_POLLING {
                    return None;
                }
                self.remote = Some(neighbor);
                self.poll_unseen = false;
                if self.needs_firmware {
                    // LNI: the frames are exchanged; the host handles the neighbour's (handle_verify_cap)
                    // and answers CHANGE_PHY_STATE(LINKUP).
                    self.port = PLS_CONFIGPHY_VERIFYCAP;
                    self.take_verify_cap(&neighbor.verify_cap);
                    return Some(self.post(VERIFY_CAP_FRAME));
                }
                // The simulator's 8051 goes from Polling straight to LinkUp and logical INIT (chip.c
                // set_link_state HLS_UP_INIT accepts the jump on ICODE_FUNCTIONAL_SIMULATOR).
                Some(self.achieve_link_up())
            }
            LinkEvent::Down { reason } => {
                if self.port != PLS_LINKUP && self.port != PLS_CONFIGPHY_VERIFYCAP {
                    return None;
                }
                self.port = PLS_OFFLINE;
                self.set_logical_state(LSTATE_DOWN);
                self.remote = None;
                self.link_downs += 1;
                // read_link_down_reason / read_planned_down_reason_code (chip.c handle_link_down).
                let ldr = match reason {
                    Some(r) => {
                        let quality = self.ram_u32(config_addr(LINK_QUALITY_INFO, GENERAL_CONFIG));
                        let field = 0xFF << DOWN_REMOTE_REASON_SHIFT;
                        let q = (quality & !field) | (u64::from(r) << DOWN_REMOTE_REASON_SHIFT);
                        self.set_ram_u32(config_addr(LINK_QUALITY_INFO, GENERAL_CONFIG), q);
                        LDR_RECEIVED_LINKDOWN_IDLE_MSG
                    }
                    None => LDR_LINK_TRANSFER_ACTIVE_LOW,
                };
                let at = config_addr(LINK_DOWN_REASON, GENERAL_CONFIG);
                let field = self.ram_u32(at) & !LINK_DOWN_REASON_MASK;
                self.set_ram_u32(at, field | ldr);
                Some(self.post(LINK_GOING_DOWN))
            }
            LinkEvent::Idle(message) => {
                // Only an 8051 that runs firmware relays idle messages; the simulator's has none (the driver
                // sets neighbor_normal itself there, chip.c set_link_state HLS_UP_ARMED).
                if !self.needs_firmware || self.port != PLS_LINKUP {
                    return None;
                }
                self.idle[(message & IDLE_MSG_TYPE_MASK) as usize] = message;
                (message & IDLE_MSG_TYPE_MASK == IDLE_SMA).then(|| self.post(BC_SMA_MSG))
            }
        }
    }

    /// Posts host message `msg` in DBG_ERR_INFO_SET_BY_8051; the caller raises the 8051 interrupt.
    fn post(&mut self, msg: u64) -> u64 {
        self.info |= msg;
        msg
    }

    /// LinkUp and logical INIT with the neighbour the link trained with.
    fn achieve_link_up(&mut self) -> u64 {
        self.port = PLS_LINKUP;
        self.set_logical_state(LSTATE_INIT);
        self.link_ups += 1;
        self.post(LINKUP_ACHIEVED)
    }

    /// This port's VerifyCap frame, as the host loaded it.
    pub fn verify_cap_frame(&self) -> VerifyCapFrame {
        let field = |f| self.ram_u32(config_addr(f, GENERAL_CONFIG)) as u32;
        VerifyCapFrame {
            phy: field(VERIFY_CAP_LOCAL_PHY),
            fabric: field(VERIFY_CAP_LOCAL_FABRIC),
            link_mode: field(VERIFY_CAP_LOCAL_LINK_MODE),
            device_id: field(LOCAL_DEVICE_ID),
            tx_rate: (field(TX_SETTINGS) >> MAX_RATE_SHIFT) as u8,
        }
    }

    /// The neighbour's frame into the VERIFY_CAP_REMOTE_* fields, and the widths both ends enable into the
    /// active counts of the local link mode (the widest common one).
    fn take_verify_cap(&mut self, peer: &VerifyCapFrame) {
        let set = |dc: &mut Dc, f, v: u64| dc.set_ram_u32(config_addr(f, GENERAL_CONFIG), v);
        set(self, VERIFY_CAP_REMOTE_PHY, u64::from(peer.phy));
        set(self, VERIFY_CAP_REMOTE_FABRIC, u64::from(peer.fabric));
        let widths = u64::from(peer.link_mode) & 0xFFFF;
        set(self, VERIFY_CAP_REMOTE_LINK_WIDTH, (u64::from(peer.tx_rate) << REMOTE_TX_RATE_SHIFT) | widths);
        set(self, REMOTE_DEVICE_ID, u64::from(peer.device_id));
        let local = self.ram_u32(config_addr(VERIFY_CAP_LOCAL_LINK_MODE, GENERAL_CONFIG));
        let common = local & u64::from(peer.link_mode) & LINK_WIDTH_ENABLE_MASK;
        let lanes = 64 - u64::from(common.leading_zeros());
        let active = (lanes << LINK_WIDTH_ACTIVE_TX_SHIFT) | (lanes << LINK_WIDTH_ACTIVE_RX_SHIFT);
        set(self, VERIFY_CAP_LOCAL_LINK_MODE, (local & !LINK_WIDTH_ACTIVE_MASK) | active);
        let lni =
            self.ram_u32(config_addr(LOCAL_LNI_INFO, GENERAL_CONFIG)) & !(ENABLE_LANE_RX_MASK << ENABLE_LANE_RX_SHIFT);
        set(self, LOCAL_LNI_INFO, lni | (((1 << lanes) - 1) << ENABLE_LANE_RX_SHIFT));
    }

    /// Whether a host command posted a host message since the last call (the 8051 interrupt is due).
    pub fn take_posted(&mut self) -> bool {
        std::mem::take(&mut self.posted)
    }

    /// The LCB access a host command asked for, to carry out and then [`Dc::complete_lcb`].
    pub fn take_lcb_request(&mut self) -> Option<LcbAccess> {
        self.lcb_request.take()
    }

    /// An LCB relay is done: a read's value goes back in HOST_CMD_1 and EXT_DEV_1.
    pub fn complete_lcb(&mut self, read: Option<u64>) {
        let value = read.unwrap_or(0);
        self.ext_dev_1 = (value >> 48) << EXT_DEV_1_REQ_DATA_SHIFT;
        self.complete(value);
    }

    fn complete(&mut self, response: u64) {
        self.host_cmd_1 = ((response & HOST_CMD_1_RSP_DATA_MASK) << HOST_CMD_1_RSP_DATA_SHIFT)
            | (HCMD_SUCCESS << HOST_CMD_1_RETURN_CODE_SHIFT)
            | HOST_CMD_1_COMPLETED_SMASK;
        self.replied = Some(self.command);
    }

    /// The command type of the reply the last HOST_CMD_0 write brought, if it brought one.
    pub fn take_replied(&mut self) -> Option<u8> {
        self.replied.take()
    }

    /// Replaces the reply in HOST_CMD_1 (a hostile chip's).
    pub fn set_reply(&mut self, host_cmd_1: u64) {
        self.host_cmd_1 = host_cmd_1;
    }

    pub fn reply(&self) -> u64 {
        self.host_cmd_1
    }

    /// CHANGE_PHY_STATE: the port moves where the host says; leaving Polling or LinkUp for Offline or
    /// Disabled drops the link, with the reason the host gave for the neighbour.
    fn change_phy_state(&mut self, data: u64) {
        let state = data & PHY_STATE_MASK;
        let reason = ((data >> PHY_REASON_SHIFT) & PHY_REASON_MASK) as u8;
        let was_active = self.port_active();
        let was = self.port;
        self.port = state;
        match state {
            PLS_POLLING => self.poll_unseen = true,
            // The host took the neighbour's VerifyCap frame (handle_verify_cap, set_link_state
            // HLS_GOING_UP): the link transfers, and the port is up.
            PLS_LINKUP if was == PLS_CONFIGPHY_VERIFYCAP && self.remote.is_some() => {
                self.achieve_link_up();
                self.posted = true;
            }
            s if s & PLS_OFFLINE_MASK == PLS_OFFLINE || s == PLS_DISABLED => {
                self.poll_unseen = false;
                self.remote = None;
                self.set_logical_state(LSTATE_DOWN);
                if was_active {
                    self.signal = Some(Phy::Down { reason: Some(reason) });
                }
            }
            _ => {}
        }
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
        self.replied = None;
        let starts = value & !self.host_cmd_0 & HOST_CMD_0_REQ_NEW_SMASK != 0;
        self.host_cmd_0 = value;
        if value & HOST_CMD_0_REQ_NEW_SMASK == 0 {
            self.host_cmd_1 = 0;
            return;
        }
        // A stopped 8051 (no firmware running) takes no request: the driver's wait times out.
        if !starts || !self.ready() {
            return;
        }
        let kind = (value >> HOST_CMD_0_REQ_TYPE_SHIFT) & HOST_CMD_0_REQ_TYPE_MASK;
        let data = value >> HOST_CMD_0_REQ_DATA_SHIFT;
        *self.commands.entry(kind as u8).or_default() += 1;
        self.command = kind as u8;
        let response = match kind {
            HCMD_LOAD_CONFIG_DATA => {
                let field = (data >> LOAD_DATA_FIELD_ID_SHIFT) & LOAD_DATA_FIELD_ID_MASK;
                let lane = (data >> LOAD_DATA_LANE_ID_SHIFT) & LOAD_DATA_LANE_ID_MASK;
                self.set_ram_u32(config_addr(field, lane), data & LOAD_DATA_DATA_MASK);
                0
            }
            HCMD_READ_CONFIG_DATA => {
                let field = (data >> LOAD_DATA_FIELD_ID_SHIFT) & READ_DATA_FIELD_ID_MASK;
                let lane = (data >> LOAD_DATA_LANE_ID_SHIFT) & READ_DATA_LANE_ID_MASK;
                self.ram_u32(config_addr(field, lane))
            }
            HCMD_CHANGE_PHY_STATE => {
                self.change_phy_state(data);
                0
            }
            HCMD_SEND_LCB_IDLE_MSG => {
                if self.needs_firmware && self.port == PLS_LINKUP {
                    self.signal = Some(Phy::Idle(data));
                }
                0
            }
            HCMD_READ_LCB_IDLE_MSG => self.idle[(data & IDLE_MSG_TYPE_MASK) as usize],
            // The chip carries the access out and completes the command (take_lcb_request).
            HCMD_READ_LCB_CSR => {
                self.lcb_request = Some(LcbAccess::Read(DC_LCB_CFG_RUN + 8 * (data & LCB_REGNO_MASK)));
                return;
            }
            HCMD_WRITE_LCB_CSR => {
                let low = (data >> LCB_WRITE_DATA_SHIFT) & LCB_WRITE_DATA_MASK;
                let mid = (self.ext_dev_0 >> EXT_DEV_0_RETURN_CODE_SHIFT) & 0xFF;
                let high = (self.ext_dev_0 >> EXT_DEV_0_RSP_DATA_SHIFT) & 0xFFFF;
                let value = low | (mid << 40) | (high << 48);
                self.lcb_request = Some(LcbAccess::Write(DC_LCB_CFG_RUN + 8 * (data & LCB_REGNO_MASK), value));
                return;
            }
            // LCB access grants and the interface test: accepted, nothing to return.
            _ => 0,
        };
        self.complete(response);
    }

    pub fn dump(&self) -> serde_json::Value {
        let mut commands: Vec<(u8, u64)> = self.commands.iter().map(|(&k, &n)| (k, n)).collect();
        commands.sort_unstable();
        serde_json::json!({
            "port_state": format!("{:#x}", self.port),
            "firmware": self.firmware.map(|v| format!("{}.{}.{}", v.major, v.minor, v.patch)),
            "logical_state": match self.logical_state() {
                LSTATE_DOWN => "down",
                LSTATE_INIT => "init",
                LSTATE_ARMED => "armed",
                LSTATE_ACTIVE => "active",
                _ => "reserved",
            },
            "neighbor_guid": self.remote.map(|n| format!("{:#018x}", n.guid)),
            "link_ups": self.link_ups,
            "link_downs": self.link_downs,
            "host_commands": commands.iter().map(|(k, n)| serde_json::json!({"type": k, "count": n}))
                .collect::<Vec<_>>(),
        })
    }
}
