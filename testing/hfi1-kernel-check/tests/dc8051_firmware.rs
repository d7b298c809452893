//! The image `hfi1-dc8051-image` writes, loaded into the emulated chip the way the stock driver loads 8051
//! firmware (firmware.c load_8051_firmware, load_security_variables, write_8051, run_rsa, wait_fm_ready,
//! chip.c read_misc_status and dc_shutdown/dc_start): the chip's security engine passes it and the 8051 runs
//! it, and every altered image is refused with the error the driver looks for.

use device_model::hfi1::wfr::csr::*;
use device_model::hfi1::wfr::{Icode, Wfr, WfrShape};
use emu_abi::dc8051::{FirmwareVersion, DEFAULT_VERSION};
use hfi1_kernel_check::dc8051_image::build_image;

// Values as the guest kernel defines them (chip_registers.h, firmware.c, chip.h).
const RST_M8051W: u64 = 0x1;
const RST_ALL: u64 = 0x1 | 0x2 | 0x4 | 0x8 | 0x10; // M8051W, CRAM, DRAM, IRAM, SFR
const FW_CTRL_FW_8051_LOADED: u64 = 0x2;
const RAM_SETUP_RAM_SEL: u64 = 0x1;
const RAM_SETUP_AUTO_INCR: u64 = 0x100;
const RAM_CTRL_WRITE_ENA: u64 = 0x100_0000;
const RAM_CTRL_READ_ENA: u64 = 0x1_0000;
const RAM_STATUS_ACCESS_COMPLETED: u64 = 0x1_0000;
const RSA_CMD_INIT: u64 = 0x1;
const RSA_CMD_START: u64 = 0x2;
const RSA_STATUS_IDLE: u64 = 0x0;
const RSA_STATUS_DONE: u64 = 0x2;
const RSA_STATUS_FAILED: u64 = 0x3;
const ERR_KEY_MISMATCH: u64 = 0x10;
const ERR_FW_AUTH_FAILED: u64 = 0x20;
const FIRMWARE_READY: u64 = 0xa0;
const CCE_DC_CTRL_DC_RESET: u64 = 0x1;
// read_8051_config: general fields are 4-byte fields at field * 4.
const MISC_STATUS: u64 = 0x0e;
const VERSION_PATCH: u64 = 0x16;

// The augmented firmware file (firmware.c): header 128, modulus 256, exponent 4, signature 256, r2 256, mu 8.
const HEADER: std::ops::Range<usize> = 0..128;
const MODULUS: std::ops::Range<usize> = 128..384;
const SIGNATURE: std::ops::Range<usize> = 388..644;
const R2: std::ops::Range<usize> = 644..900;
const MU: std::ops::Range<usize> = 900..908;
const PAYLOAD_AT: usize = 908;

fn chip() -> Wfr {
    Wfr::new(WfrShape { icode: Icode::RtlSimulation, ..WfrShape::default() })
}

fn qwords(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes.chunks(8).map(|c| {
        let mut q = [0u8; 8];
        q[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(q)
    })
}

fn write_array(c: &mut Wfr, base: u64, bytes: &[u8]) {
    for (i, q) in qwords(bytes).enumerate() {
        c.write(base + 8 * i as u64, q);
    }
}

fn rsa_status(c: &mut Wfr) -> u64 {
    (c.read(MISC_CFG_FW_CTRL) >> 2) & 0x3
}

fn firmware_state(c: &mut Wfr) -> u64 {
    (c.read(DC_DC8051_STS_CUR_STATE) >> 16) & 0xff
}

/// load_8051_firmware up to the RSA verdict and the release from reset; returns the RSA status it saw.
fn load(c: &mut Wfr, file: &[u8]) -> u64 {
    c.write(DC_DC8051_CFG_RST, RST_ALL);
    c.write(DC_DC8051_CFG_RST, RST_M8051W);
    // load_security_variables
    write_array(c, MISC_CFG_RSA_MODULUS, &file[MODULUS]);
    write_array(c, MISC_CFG_RSA_R2, &file[R2]);
    write_array(c, MISC_CFG_RSA_MU, &file[MU]);
    for q in qwords(&file[HEADER]) {
        c.write(MISC_CFG_SHA_PRELOAD, q);
    }
    c.write(MISC_CFG_FW_CTRL, 0);
    // write_8051(code): auto-increment from address 0, ACCESS_COMPLETED after each qword
    c.write(DC_DC8051_CFG_RAM_ACCESS_SETUP, RAM_SETUP_RAM_SEL | RAM_SETUP_AUTO_INCR);
    c.write(DC_DC8051_CFG_RAM_ACCESS_CTRL, RAM_CTRL_WRITE_ENA);
    for q in qwords(&file[PAYLOAD_AT..]) {
        c.write(DC_DC8051_CFG_RAM_ACCESS_WR_DATA, q);
        assert_ne!(c.read(DC_DC8051_CFG_RAM_ACCESS_STATUS) & RAM_STATUS_ACCESS_COMPLETED, 0);
    }
    c.write(DC_DC8051_CFG_RAM_ACCESS_CTRL, 0);
    c.write(DC_DC8051_CFG_RAM_ACCESS_SETUP, 0);
    c.write(MISC_CFG_FW_CTRL, FW_CTRL_FW_8051_LOADED);
    // run_rsa
    write_array(c, MISC_CFG_RSA_SIGNATURE, &file[SIGNATURE]);
    c.write(MISC_CFG_RSA_CMD, RSA_CMD_INIT);
    assert_eq!(rsa_status(c), RSA_STATUS_IDLE, "engine idle between INIT and START");
    c.write(MISC_CFG_RSA_CMD, RSA_CMD_START);
    let status = rsa_status(c);
    c.write(MISC_ERR_CLEAR, ERR_KEY_MISMATCH | ERR_FW_AUTH_FAILED);
    if status == RSA_STATUS_DONE {
        c.write(DC_DC8051_CFG_RST, 0);
    }
    status
}

/// read_8051_config(field, GENERAL_CONFIG) through the RAM window (read_8051_data, no auto-increment).
fn read_config(c: &mut Wfr, field: u64) -> u32 {
    let addr = field * 4;
    c.write(DC_DC8051_CFG_RAM_ACCESS_SETUP, 0);
    c.write(DC_DC8051_CFG_RAM_ACCESS_CTRL, addr & 0x7fff);
    c.write(DC_DC8051_CFG_RAM_ACCESS_CTRL, (addr & 0x7fff) | RAM_CTRL_READ_ENA);
    assert_ne!(c.read(DC_DC8051_CFG_RAM_ACCESS_STATUS) & RAM_STATUS_ACCESS_COMPLETED, 0);
    let q = c.read(DC_DC8051_CFG_RAM_ACCESS_RD_DATA);
    c.write(DC_DC8051_CFG_RAM_ACCESS_CTRL, 0);
    if addr & 4 != 0 {
        (q >> 32) as u32
    } else {
        q as u32
    }
}

/// read_misc_status: major in MISC_STATUS 31:24, minor in 23:16, patch in VERSION_PATCH 31:24.
fn version(c: &mut Wfr) -> FirmwareVersion {
    let status = read_config(c, MISC_STATUS);
    let patch = read_config(c, VERSION_PATCH);
    FirmwareVersion { major: (status >> 24) as u8, minor: (status >> 16) as u8, patch: (patch >> 24) as u8 }
}

#[test]
fn the_built_image_passes_and_the_8051_reports_its_version() {
    for v in [DEFAULT_VERSION, FirmwareVersion { major: 0, minor: 19, patch: 3 }] {
        let mut c = chip();
        assert_eq!(firmware_state(&mut c), 0, "no firmware, not ready");
        assert_eq!(load(&mut c, &build_image(v)), RSA_STATUS_DONE);
        assert_eq!(c.read(MISC_ERR_STATUS) & (ERR_KEY_MISMATCH | ERR_FW_AUTH_FAILED), 0);
        assert_eq!(firmware_state(&mut c), FIRMWARE_READY, "wait_fm_ready");
        assert_eq!(version(&mut c), v);
    }
}

#[test]
fn altered_images_are_refused_with_the_error_the_driver_reports() {
    type Alter = fn(&mut Vec<u8>);
    let cases: [(&str, Alter, u64); 5] = [
        ("payload byte", |f| f[PAYLOAD_AT + 17] ^= 1, ERR_FW_AUTH_FAILED),
        ("header date", |f| f[20] ^= 1, ERR_FW_AUTH_FAILED),
        ("signature", |f| f[SIGNATURE.start] ^= 1, ERR_FW_AUTH_FAILED),
        ("r2", |f| f[R2.start] ^= 1, ERR_FW_AUTH_FAILED),
        ("modulus", |f| f[MODULUS.start] ^= 2, ERR_KEY_MISMATCH),
    ];
    for (what, alter, err) in cases {
        let mut file = build_image(DEFAULT_VERSION);
        alter(&mut file);
        let mut c = chip();
        assert_eq!(load(&mut c, &file), RSA_STATUS_FAILED, "{what}");
        // run_rsa clears both errors; the current one stays high.
        assert_eq!(c.read(MISC_ERR_STATUS) & (ERR_KEY_MISMATCH | ERR_FW_AUTH_FAILED), err, "{what}");
        c.write(DC_DC8051_CFG_RST, 0);
        assert_eq!(firmware_state(&mut c), 0, "{what}: the 8051 does not run refused code");
    }
}

#[test]
fn the_8051_restarts_its_firmware_after_dc_shutdown_but_not_after_a_dc_reset() {
    let mut c = chip();
    assert_eq!(load(&mut c, &build_image(DEFAULT_VERSION)), RSA_STATUS_DONE);
    // _dc_shutdown holds the core in reset; _dc_start releases it and waits for the firmware.
    c.write(DC_DC8051_CFG_RST, RST_M8051W);
    assert_eq!(firmware_state(&mut c), 0);
    c.write(DC_DC8051_CFG_RST, 0);
    assert_eq!(firmware_state(&mut c), FIRMWARE_READY);
    assert_eq!(version(&mut c), DEFAULT_VERSION);
    // A DC reset clears the code RAM: the firmware has to be loaded again.
    c.write(CCE_DC_CTRL, CCE_DC_CTRL_DC_RESET);
    c.write(CCE_DC_CTRL, 0);
    c.write(DC_DC8051_CFG_RST, 0);
    assert_eq!(firmware_state(&mut c), 0);
    assert_eq!(load(&mut c, &build_image(DEFAULT_VERSION)), RSA_STATUS_DONE);
    assert_eq!(firmware_state(&mut c), FIRMWARE_READY);
}
