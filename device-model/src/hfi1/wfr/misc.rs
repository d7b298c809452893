//! MISC: the firmware security engine that must pass the 8051's code before the 8051 may run it (firmware.c
//! load_8051_firmware, load_security_variables, run_rsa).
//!
//! The driver writes the key (MISC_CFG_RSA_MODULUS, _R2, _MU), streams the file's CSS header to
//! MISC_CFG_SHA_PRELOAD, loads the code into the 8051's code RAM, writes the signature and runs the engine
//! (RSA_CMD INIT, then START). The engine here does what the driver's sequence implies: it checks the modulus
//! against the chip's key (else KEY_MISMATCH), checks that r2 and mu are that modulus's Montgomery constants
//! (the engine computes with them), and checks the signature over the header and the code the header's size
//! names (`emu_abi::dc8051`), then reports DONE or FAILED (with FW_AUTH_FAILED). It finishes at once: the
//! driver's first poll sees the verdict.

#![forbid(unsafe_code)]

use std::collections::VecDeque;

use emu_abi::dc8051::{emsa_pkcs1_v15_sha256, CSS_HEADER_BYTES, KEY_BYTES, KEY_EXPONENT, KEY_MODULUS, MU_BYTES};
use num_bigint::BigUint;
use sha2::{Digest, Sha256};

use super::csr::*;

/// MISC_CFG_FW_CTRL fields (chip_registers.h).
pub const MISC_CFG_FW_CTRL_FW_8051_LOADED_SMASK: u64 = 0x2;
pub const MISC_CFG_FW_CTRL_RSA_STATUS_SHIFT: u32 = 2;
/// MISC_CFG_RSA_CMD values and RSA_STATUS values (firmware.c RSA_CMD_*, RSA_STATUS_*).
pub const RSA_CMD_INIT: u64 = 0x1;
pub const RSA_CMD_START: u64 = 0x2;
pub const RSA_STATUS_IDLE: u64 = 0x0;
pub const RSA_STATUS_DONE: u64 = 0x2;
pub const RSA_STATUS_FAILED: u64 = 0x3;
/// MISC_ERR_STATUS bits the engine keeps high while its last run stands (chip_registers.h).
pub const MISC_ERR_STATUS_MISC_KEY_MISMATCH_ERR_SMASK: u64 = 0x10;
pub const MISC_ERR_STATUS_MISC_FW_AUTH_FAILED_ERR_SMASK: u64 = 0x20;

const KEY_QWORDS: usize = KEY_BYTES / 8;
const PRELOAD_QWORDS: usize = CSS_HEADER_BYTES / 8;
/// The CSS header's `size` field (dwords of the file without r2 and mu), and what precedes the code in that
/// file: header, modulus, exponent (4 bytes), signature (firmware.c `struct firmware_file`).
const CSS_SIZE_OFFSET: usize = 24;
const FIRMWARE_FILE_PREFIX_BYTES: usize = CSS_HEADER_BYTES + KEY_BYTES + 4 + KEY_BYTES;

/// Why a run failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Authenticated,
    /// The modulus is not the chip's key.
    KeyMismatch,
    /// r2 or mu are not the modulus's Montgomery constants, the header names more code than the RAM holds,
    /// or the signature does not match.
    AuthFailed,
}

#[derive(Debug)]
pub struct Misc {
    modulus: [u64; KEY_QWORDS],
    r2: [u64; KEY_QWORDS],
    mu: u64,
    signature: [u64; KEY_QWORDS],
    /// The last CSS header's worth of qwords streamed to MISC_CFG_SHA_PRELOAD.
    preload: VecDeque<u64>,
    fw_8051_loaded: bool,
    status: u64,
    /// The last run's verdict, until INIT starts another.
    verdict: Option<Verdict>,
    runs: u64,
}

impl Default for Misc {
    fn default() -> Self {
        Misc {
            modulus: [0; KEY_QWORDS],
            r2: [0; KEY_QWORDS],
            mu: 0,
            signature: [0; KEY_QWORDS],
            preload: VecDeque::with_capacity(PRELOAD_QWORDS),
            fw_8051_loaded: false,
            status: RSA_STATUS_IDLE,
            verdict: None,
            runs: 0,
        }
    }
}

/// Index of `offset` in the qword array starting at `base`.
fn element(offset: u64, base: u64, len: usize) -> Option<usize> {
    let i = usize::try_from(offset.checked_sub(base)? / 8).ok()?;
    (i < len && offset.is_multiple_of(8)).then_some(i)
}

fn le_bytes(qwords: &[u64]) -> Vec<u8> {
    qwords.iter().flat_map(|q| q.to_le_bytes()).collect()
}

impl Misc {
    pub fn read(&self, offset: u64) -> Option<u64> {
        if let Some(i) = element(offset, MISC_CFG_RSA_MODULUS, KEY_QWORDS) {
            return Some(self.modulus[i]);
        }
        if let Some(i) = element(offset, MISC_CFG_RSA_R2, KEY_QWORDS) {
            return Some(self.r2[i]);
        }
        if let Some(i) = element(offset, MISC_CFG_RSA_SIGNATURE, KEY_QWORDS) {
            return Some(self.signature[i]);
        }
        Some(match offset {
            MISC_CFG_RSA_MU => self.mu,
            MISC_CFG_SHA_PRELOAD | MISC_CFG_RSA_CMD => 0,
            MISC_CFG_FW_CTRL => {
                let loaded = if self.fw_8051_loaded { MISC_CFG_FW_CTRL_FW_8051_LOADED_SMASK } else { 0 };
                loaded | (self.status << MISC_CFG_FW_CTRL_RSA_STATUS_SHIFT)
            }
            _ => return None,
        })
    }

    /// A write the engine claims; `code` is the 8051's code RAM, which START checks.
    pub fn write(&mut self, offset: u64, value: u64, code: &[u64]) -> bool {
        if let Some(i) = element(offset, MISC_CFG_RSA_MODULUS, KEY_QWORDS) {
            self.modulus[i] = value;
            return true;
        }
        if let Some(i) = element(offset, MISC_CFG_RSA_R2, KEY_QWORDS) {
            self.r2[i] = value;
            return true;
        }
        if let Some(i) = element(offset, MISC_CFG_RSA_SIGNATURE, KEY_QWORDS) {
            self.signature[i] = value;
            return true;
        }
        match offset {
            MISC_CFG_RSA_MU => self.mu = value,
            MISC_CFG_SHA_PRELOAD => {
                if self.preload.len() == PRELOAD_QWORDS {
                    self.preload.pop_front();
                }
                self.preload.push_back(value);
            }
            MISC_CFG_FW_CTRL => self.fw_8051_loaded = value & MISC_CFG_FW_CTRL_FW_8051_LOADED_SMASK != 0,
            MISC_CFG_RSA_CMD => match value {
                // A new run forgets the last verdict: a passed image is no longer authorised (firmware.c's
                // note on re-initialising after a successful run).
                RSA_CMD_INIT => {
                    self.status = RSA_STATUS_IDLE;
                    self.verdict = None;
                }
                RSA_CMD_START if self.status == RSA_STATUS_IDLE => {
                    let verdict = self.check(code);
                    self.runs += 1;
                    self.status = if verdict == Verdict::Authenticated { RSA_STATUS_DONE } else { RSA_STATUS_FAILED };
                    self.verdict = Some(verdict);
                }
                _ => {}
            },
            _ => return false,
        }
        true
    }

    fn check(&self, code: &[u64]) -> Verdict {
        let modulus = le_bytes(&self.modulus);
        if modulus[..] != KEY_MODULUS[..] {
            return Verdict::KeyMismatch;
        }
        let n = BigUint::from_bytes_le(&modulus);
        let r = BigUint::from(1u8) << (8 * KEY_BYTES);
        let two64 = BigUint::from(1u8) << (8 * MU_BYTES);
        let r2_ok = BigUint::from_bytes_le(&le_bytes(&self.r2)) == (&r * &r) % &n;
        // mu = -n^-1 mod 2^64: n * mu + 1 is a multiple of 2^64.
        let mu_ok = ((&n * BigUint::from(self.mu)) + 1u8) % &two64 == BigUint::ZERO;
        if !r2_ok || !mu_ok {
            return Verdict::AuthFailed;
        }
        let header = le_bytes(&self.preload.iter().copied().collect::<Vec<_>>());
        if header.len() != CSS_HEADER_BYTES {
            return Verdict::AuthFailed;
        }
        let size_dwords = u32::from_le_bytes([
            header[CSS_SIZE_OFFSET],
            header[CSS_SIZE_OFFSET + 1],
            header[CSS_SIZE_OFFSET + 2],
            header[CSS_SIZE_OFFSET + 3],
        ]) as usize;
        let code_bytes = le_bytes(code);
        let Some(len) = (size_dwords * 4).checked_sub(FIRMWARE_FILE_PREFIX_BYTES) else {
            return Verdict::AuthFailed;
        };
        if len == 0 || len > code_bytes.len() {
            return Verdict::AuthFailed;
        }
        let digest: [u8; 32] = Sha256::new().chain_update(&header).chain_update(&code_bytes[..len]).finalize().into();
        let sig = BigUint::from_bytes_le(&le_bytes(&self.signature));
        if sig >= n {
            return Verdict::AuthFailed;
        }
        let em = sig.modpow(&BigUint::from(KEY_EXPONENT), &n);
        if em == BigUint::from_bytes_be(&emsa_pkcs1_v15_sha256(&digest)) {
            Verdict::Authenticated
        } else {
            Verdict::AuthFailed
        }
    }

    /// Whether the 8051 may run its code: loaded, and passed by the last run.
    pub fn authorised(&self) -> bool {
        self.fw_8051_loaded && self.verdict == Some(Verdict::Authenticated)
    }

    /// MISC_ERR_STATUS bits the last run holds high (a clear does not lower them).
    pub fn held_errors(&self) -> u64 {
        match self.verdict {
            Some(Verdict::KeyMismatch) => MISC_ERR_STATUS_MISC_KEY_MISMATCH_ERR_SMASK,
            Some(Verdict::AuthFailed) => MISC_ERR_STATUS_MISC_FW_AUTH_FAILED_ERR_SMASK,
            _ => 0,
        }
    }

    pub fn dump(&self) -> serde_json::Value {
        serde_json::json!({
            "fw_8051_loaded": self.fw_8051_loaded,
            "rsa_status": self.status,
            "verdict": self.verdict.map(|v| format!("{v:?}")),
            "runs": self.runs,
        })
    }
}
