//! The emulated 8051 running its firmware (`hfi1-dc8051-image`), driven the way the stock driver drives it on a
//! chip that is not the functional simulator: the VerifyCap exchange and link-up (chip.c
//! set_local_link_attributes, handle_verify_cap, set_link_state HLS_GOING_UP), the LCB relays behind
//! read_lcb_csr/write_lcb_csr (do_8051_command), idle SMA messages (send_idle_sma, read_idle_sma), and the
//! neighbour's loss in each state.

use device_model::hfi1::cable::{LinkEvent, Neighbor, Phy, VerifyCapFrame};
use device_model::hfi1::wfr::csr::*;
use device_model::hfi1::wfr::{Icode, Wfr, WfrShape};
use emu_abi::dc8051::DEFAULT_VERSION;
use hfi1_kernel_check::dc8051_image::build_image;

// chip.h / chip_registers.h values, restated.
const HCMD_LOAD_CONFIG_DATA: u64 = 0x01;
const HCMD_READ_CONFIG_DATA: u64 = 0x02;
const HCMD_CHANGE_PHY_STATE: u64 = 0x03;
const HCMD_SEND_LCB_IDLE_MSG: u64 = 0x04;
const HCMD_READ_LCB_IDLE_MSG: u64 = 0x06;
const HCMD_READ_LCB_CSR: u64 = 0x07;
const HCMD_WRITE_LCB_CSR: u64 = 0x08;
const HCMD_SUCCESS: u64 = 2;
const GENERAL_CONFIG: u64 = 4;
const TX_SETTINGS: u64 = 0x06;
const VERIFY_CAP_LOCAL_PHY: u64 = 0x07;
const VERIFY_CAP_LOCAL_FABRIC: u64 = 0x08;
const VERIFY_CAP_LOCAL_LINK_MODE: u64 = 0x09;
const LOCAL_DEVICE_ID: u64 = 0x0a;
const LOCAL_LNI_INFO: u64 = 0x0c;
const VERIFY_CAP_REMOTE_PHY: u64 = 0x0f;
const VERIFY_CAP_REMOTE_FABRIC: u64 = 0x10;
const VERIFY_CAP_REMOTE_LINK_WIDTH: u64 = 0x11;
const REMOTE_DEVICE_ID: u64 = 0x15;
const LINK_DOWN_REASON: u64 = 0x16;
const PLS_POLLING: u64 = 0x20;
const PLS_CONFIGPHY_VERIFYCAP: u64 = 0x46;
const PLS_LINKUP: u64 = 0x50;
const PLS_OFFLINE: u64 = 0x90;
const BC_SMA_MSG: u64 = 1 << 2;
const VERIFY_CAP_FRAME: u64 = 1 << 6;
const LINKUP_ACHIEVED: u64 = 1 << 7;
const LINK_GOING_DOWN: u64 = 1 << 8;
const LSTATE_DOWN: u64 = 1;
const LSTATE_INIT: u64 = 2;
const SET_BY_8051: u64 = 0x1;
const LDR_LINK_TRANSFER_ACTIVE_LOW: u64 = 0xa;

// The driver's frame on a default port (set_local_link_attributes, as the guest logged it): PHY continuous
// updates, fabric vAU 3 / Z / vCU 0 / vl15 0x110 / CRC 0x3, 4X only, device 0x24f0 rev 0x10, tx rate 25G (2).
const FRAME: VerifyCapFrame =
    VerifyCapFrame { phy: 0x10, fabric: 0x0031_100b, link_mode: 0x8, device_id: 0x24_f010, tx_rate: 2 };

fn chip_running_firmware() -> Wfr {
    let mut c = Wfr::new(WfrShape { icode: Icode::RtlSimulation, ..WfrShape::default() });
    let f = build_image(DEFAULT_VERSION);
    let qwords = |b: &[u8]| b.chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
    c.write(DC_DC8051_CFG_RST, 0x1f);
    c.write(DC_DC8051_CFG_RST, 0x1);
    for (base, range) in [(MISC_CFG_RSA_MODULUS, 128..384), (MISC_CFG_RSA_R2, 644..900), (MISC_CFG_RSA_MU, 900..908)] {
        for (i, q) in qwords(&f[range]).into_iter().enumerate() {
            c.write(base + 8 * i as u64, q);
        }
    }
    qwords(&f[..128]).into_iter().for_each(|q| {
        c.write(MISC_CFG_SHA_PRELOAD, q);
    });
    c.write(DC_DC8051_CFG_RAM_ACCESS_SETUP, 0x101);
    c.write(DC_DC8051_CFG_RAM_ACCESS_CTRL, 0x100_0000);
    let mut payload = f[908..].to_vec();
    payload.resize(payload.len().next_multiple_of(8), 0);
    qwords(&payload).into_iter().for_each(|q| {
        c.write(DC_DC8051_CFG_RAM_ACCESS_WR_DATA, q);
    });
    c.write(DC_DC8051_CFG_RAM_ACCESS_SETUP, 0);
    c.write(MISC_CFG_FW_CTRL, 0x2);
    for (i, q) in qwords(&f[388..644]).into_iter().enumerate() {
        c.write(MISC_CFG_RSA_SIGNATURE + 8 * i as u64, q);
    }
    c.write(MISC_CFG_RSA_CMD, 1);
    c.write(MISC_CFG_RSA_CMD, 2);
    c.write(DC_DC8051_CFG_RST, 0);
    assert_eq!((c.read(DC_DC8051_STS_CUR_STATE) >> 16) & 0xff, 0xa0, "the 8051 runs");
    // handle_8051_interrupt's source enabled (init_chip: DC_DC8051_ERR_EN).
    c.write(DC_DC8051_ERR_EN, SET_BY_8051);
    c
}

/// do_8051_command: request, REQ_NEW, COMPLETED, clear. Returns (return code, response data).
fn hcmd(c: &mut Wfr, kind: u64, data: u64) -> (u64, u64) {
    let reg = (kind << 8) | (data << 16);
    c.write(DC_DC8051_CFG_HOST_CMD_0, reg);
    c.write(DC_DC8051_CFG_HOST_CMD_0, reg | 1);
    let r = c.read(DC_DC8051_CFG_HOST_CMD_1);
    assert_eq!(r & 1, 1, "command {kind:#x} completed");
    c.write(DC_DC8051_CFG_HOST_CMD_0, 0);
    ((r >> 8) & 0xff, r >> 16)
}

fn load_config(c: &mut Wfr, field: u64, value: u32) {
    let data = (field << 40) | (GENERAL_CONFIG << 32) | u64::from(value);
    assert_eq!(hcmd(c, HCMD_LOAD_CONFIG_DATA, data).0, HCMD_SUCCESS);
}

fn read_config(c: &mut Wfr, field: u64) -> u64 {
    let (rc, v) = hcmd(c, HCMD_READ_CONFIG_DATA, (field << 40) | (GENERAL_CONFIG << 32));
    assert_eq!(rc, HCMD_SUCCESS);
    v & 0xffff_ffff
}

fn port_state(c: &mut Wfr) -> u64 {
    c.read(DC_DC8051_STS_CUR_STATE) & 0xff
}

fn logical_state(c: &mut Wfr) -> u64 {
    (c.read(DCC_CFG_PORT_CONFIG) >> 48) & 0x7
}

/// The 8051 interrupt was raised with `msg` (handle_8051_interrupt reads DBG_ERR_INFO once).
fn posted(c: &mut Wfr) -> u64 {
    assert_ne!(c.read(DC_DC8051_ERR_FLG) & SET_BY_8051, 0, "SET_BY_8051");
    c.write(DC_DC8051_ERR_CLR, SET_BY_8051);
    c.read(DC_DC8051_DBG_ERR_INFO_SET_BY_8051) & 0xffff
}

/// set_local_link_attributes, then start_link's CHANGE_PHY_STATE(POLLING) and log_physical_state's read.
fn poll(c: &mut Wfr) {
    load_config(c, TX_SETTINGS, u32::from(FRAME.tx_rate) << 24 | 0xf);
    load_config(c, VERIFY_CAP_LOCAL_PHY, FRAME.phy);
    load_config(c, VERIFY_CAP_LOCAL_FABRIC, FRAME.fabric);
    load_config(c, VERIFY_CAP_LOCAL_LINK_MODE, FRAME.link_mode);
    load_config(c, LOCAL_DEVICE_ID, FRAME.device_id);
    assert_eq!(hcmd(c, HCMD_CHANGE_PHY_STATE, PLS_POLLING).0, HCMD_SUCCESS);
    assert_eq!(port_state(c), PLS_POLLING);
    assert_eq!(c.take_signal(), Some(Phy::Polling), "the host saw it poll: the cable may train");
}

fn neighbor(guid: u64, frame: VerifyCapFrame) -> Neighbor {
    Neighbor { guid, node_type: 0, port: 1, verify_cap: frame }
}

/// Polling, VerifyCap, CHANGE_PHY_STATE(LINKUP): the port up at INIT.
fn bring_up(c: &mut Wfr, peer: Neighbor) {
    poll(c);
    assert!(c.link_event(LinkEvent::Up(peer)).is_some());
    assert_eq!(posted(c), VERIFY_CAP_FRAME);
    assert_eq!(hcmd(c, HCMD_CHANGE_PHY_STATE, PLS_LINKUP).0, HCMD_SUCCESS);
    assert_eq!(posted(c), LINKUP_ACHIEVED);
}

#[test]
fn verify_cap_shows_the_neighbours_frame_then_the_hosts_linkup_brings_the_port_up() {
    let mut c = chip_running_firmware();
    poll(&mut c);
    assert!(c.link_event(LinkEvent::Up(neighbor(0x11_7501_0100_0002, FRAME))).is_some());
    assert_eq!(posted(&mut c), VERIFY_CAP_FRAME);
    // set_link_state(HLS_VERIFY_CAP) logs PLS_CONFIGPHY_VERIFYCAP; the logical state is still Down.
    assert_eq!(port_state(&mut c), PLS_CONFIGPHY_VERIFYCAP);
    assert_eq!(logical_state(&mut c), LSTATE_DOWN);
    // handle_verify_cap's reads: the neighbour's fields, its tx rate beside its widths in the remote width.
    let expect = [
        (VERIFY_CAP_REMOTE_PHY, u64::from(FRAME.phy)),
        (VERIFY_CAP_REMOTE_FABRIC, u64::from(FRAME.fabric)),
        (VERIFY_CAP_REMOTE_LINK_WIDTH, (2 << 16) | 0x8),
        (REMOTE_DEVICE_ID, u64::from(FRAME.device_id)),
        // get_linkup_widths: 4 transmitters (15:12), 4 receivers (11:8), the enabled widths kept.
        (VERIFY_CAP_LOCAL_LINK_MODE, 0x4408),
        // read_local_lni: the four receiving lanes, a bit each in 23:16.
        (LOCAL_LNI_INFO, 0xf << 16),
    ];
    for (field, value) in expect {
        assert_eq!(read_config(&mut c, field), value, "field {field:#x}");
    }
    // set_link_state(HLS_GOING_UP): CHANGE_PHY_STATE(LINKUP); handle_link_up's polls pass at once.
    assert_eq!(hcmd(&mut c, HCMD_CHANGE_PHY_STATE, PLS_LINKUP).0, HCMD_SUCCESS);
    assert_eq!(posted(&mut c), LINKUP_ACHIEVED);
    assert_eq!(port_state(&mut c), PLS_LINKUP);
    assert_eq!(logical_state(&mut c), LSTATE_INIT);
    assert_eq!(c.read(DC_DC8051_STS_REMOTE_GUID), 0x11_7501_0100_0002);
}

#[test]
fn lcb_csrs_are_relayed_through_the_8051_whole() {
    let mut c = chip_running_firmware();
    // write_lcb_via_8051: regno in 7:0, value bits 39:0 above it, 47:40 and 63:48 in EXT_DEV_0.
    let value: u64 = 0xfedc_ba98_7654_3210;
    let regno = (DC_LCB_ERR_INFO_SEQ_CRC_CNT - DC_LCB_CFG_RUN) >> 3;
    c.write(DC_DC8051_CFG_EXT_DEV_0, ((value >> 40) & 0xff) << 8 | ((value >> 48) & 0xffff) << 16);
    let (rc, _) = hcmd(&mut c, HCMD_WRITE_LCB_CSR, regno | (value & 0xff_ffff_ffff) << 8);
    assert_eq!(rc, HCMD_SUCCESS);
    assert_eq!(c.read(DC_LCB_ERR_INFO_SEQ_CRC_CNT), value, "the LCB register holds the whole value");
    // read_lcb_via_8051: bits 47:0 in the response, 63:48 in EXT_DEV_1 bits 31:16.
    let (rc, low) = hcmd(&mut c, HCMD_READ_LCB_CSR, regno);
    assert_eq!(rc, HCMD_SUCCESS);
    let high = (c.read(DC_DC8051_CFG_EXT_DEV_1) & 0xffff_0000) << 32;
    assert_eq!(low | high, value);
}

#[test]
fn idle_sma_messages_reach_the_neighbour_only_while_the_link_is_up() {
    let mut c = chip_running_firmware();
    // Not up: send_idle_sma succeeds but nothing leaves the port.
    assert_eq!(hcmd(&mut c, HCMD_SEND_LCB_IDLE_MSG, 0x103).0, HCMD_SUCCESS);
    assert_eq!(c.take_signal(), None);
    bring_up(&mut c, neighbor(2, FRAME));
    // Up: the message goes on the cable (SMA_IDLE_ARM 1 << 8 | IDLE_SMA 3).
    assert_eq!(hcmd(&mut c, HCMD_SEND_LCB_IDLE_MSG, 0x103).0, HCMD_SUCCESS);
    assert_eq!(c.take_signal(), Some(Phy::Idle(0x103)));
    // The neighbour's arrives: BC_SMA_MSG, and read_idle_sma reads it back.
    assert!(c.link_event(LinkEvent::Idle(0x203)).is_some());
    assert_eq!(posted(&mut c), BC_SMA_MSG);
    assert_eq!(hcmd(&mut c, HCMD_READ_LCB_IDLE_MSG, 0x3), (HCMD_SUCCESS, 0x203));
}

#[test]
fn the_neighbours_loss_takes_the_port_down_from_verify_cap_and_from_linkup_but_not_from_polling() {
    type Reach = fn(&mut Wfr);
    let cases: [(&str, Reach, bool); 3] = [
        ("polling", |c| poll(c), false),
        (
            "verify cap",
            |c| {
                poll(c);
                c.link_event(LinkEvent::Up(neighbor(2, FRAME)));
                posted(c);
            },
            true,
        ),
        ("linkup", |c| bring_up(c, neighbor(2, FRAME)), true),
    ];
    for (what, reach, applies) in cases {
        let mut c = chip_running_firmware();
        reach(&mut c);
        let before = port_state(&mut c);
        let applied = c.link_event(LinkEvent::Down { reason: None });
        assert_eq!(applied.is_some(), applies, "{what}");
        if applies {
            assert_eq!(posted(&mut c), LINK_GOING_DOWN, "{what}");
            assert_eq!(port_state(&mut c), PLS_OFFLINE, "{what}");
            assert_eq!(logical_state(&mut c), LSTATE_DOWN, "{what}");
            // read_link_down_reason: byte 0 of its field.
            assert_eq!(read_config(&mut c, LINK_DOWN_REASON) & 0xff, LDR_LINK_TRANSFER_ACTIVE_LOW, "{what}");
        } else {
            assert_eq!(port_state(&mut c), before, "{what}");
        }
    }
}
