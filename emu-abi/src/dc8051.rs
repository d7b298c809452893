//! The 8051 firmware image of the emulated chip (`hfi_dc8051.bin`, the name the stock driver asks for on a
//! chip that is not RTL silicon): what this project puts in its signed payload, the signing rule the chip's
//! security engine checks, and the public key the emulated chip holds (the part a real chip has fused in).
//!
//! The file around the payload is the kernel's augmented firmware file (firmware.c `struct
//! augmented_firmware_file`: CSS header, modulus, exponent, signature, r2, mu, payload); the driver checks its
//! header, writes the header to MISC_CFG_SHA_PRELOAD, the payload to the 8051's code RAM and the key material
//! to the MISC_CFG_RSA_* registers, and waits for the engine's verdict (docs/hfi1-fabric.md, "The 8051").
//!
//! The emulated 8051 does not execute 8051 code: its program is the device model. The payload tells it which
//! firmware it runs (the version it reports), so a developer can build images that exercise the driver's
//! version-dependent paths. The key below is the emulator's test key; it guards nothing.

#![forbid(unsafe_code)]

/// Bytes of an RSA key, modulus and signature (firmware.c KEY_SIZE).
pub const KEY_BYTES: usize = 256;
/// Bytes of the Montgomery constant mu (firmware.c MU_SIZE).
pub const MU_BYTES: usize = 8;
/// Bytes of the CSS header (firmware.c `struct css_header`), the SHA engine's preload.
pub const CSS_HEADER_BYTES: usize = 128;
/// The public exponent. The driver never writes the file's exponent field to the chip, so the engine's
/// exponent is fixed; this is the one the emulated engine uses.
pub const KEY_EXPONENT: u32 = 65_537;

/// The emulated chip's public key: the modulus, least significant byte first, as the driver writes it to
/// MISC_CFG_RSA_MODULUS (key material in the file is little-endian, so qword i of the register array is
/// bytes 8i..8i+8 of the file's field).
pub const KEY_MODULUS: [u8; KEY_BYTES] = [
    0xb9, 0xf2, 0x47, 0x24, 0x20, 0xa6, 0x0c, 0x99, 0xc2, 0xc6, 0xe0, 0xfe, 0xd2, 0x55, 0xde, 0x6c, 0x9f, 0x7f, 0xec,
    0xb6, 0x9c, 0x39, 0xbc, 0x89, 0x72, 0xd5, 0x70, 0xfc, 0x0a, 0x21, 0xc2, 0xd2, 0x6d, 0xc5, 0x7a, 0x9d, 0x20, 0xd3,
    0xb3, 0x5b, 0xcc, 0x65, 0xa6, 0xd5, 0xa7, 0x43, 0x3b, 0xa4, 0xea, 0x35, 0x2f, 0xd1, 0x10, 0x6e, 0x14, 0x94, 0xff,
    0x25, 0xda, 0x3c, 0x93, 0xc8, 0x06, 0x01, 0x59, 0x3f, 0x1c, 0x92, 0x05, 0x88, 0x21, 0x72, 0xc1, 0xaf, 0xe9, 0x80,
    0x63, 0xbb, 0x7d, 0xb5, 0x55, 0xf9, 0x03, 0x8f, 0x00, 0xee, 0x49, 0x2c, 0x72, 0xfb, 0xd5, 0xb3, 0xdc, 0x50, 0x2d,
    0x8a, 0x21, 0x47, 0x64, 0x5e, 0x24, 0x81, 0xa0, 0xce, 0xea, 0x08, 0xa8, 0x30, 0x04, 0xd7, 0x8f, 0x1f, 0x37, 0x72,
    0xa3, 0xd9, 0x92, 0x25, 0x42, 0x81, 0x6f, 0xaf, 0xb8, 0x04, 0x78, 0xce, 0x33, 0xb3, 0x1a, 0x6c, 0x97, 0xaa, 0xd7,
    0xc1, 0xb4, 0x7d, 0xc8, 0x22, 0xa1, 0x12, 0x2b, 0xc4, 0xcf, 0xc7, 0x37, 0xc4, 0x16, 0x82, 0xfd, 0x60, 0x69, 0x43,
    0xe6, 0xf3, 0x31, 0x20, 0xb6, 0x65, 0xed, 0x2f, 0xaf, 0xe3, 0x14, 0xc5, 0xb0, 0x55, 0x4f, 0x8a, 0x91, 0xe3, 0xf5,
    0x32, 0x68, 0x70, 0x71, 0x2f, 0x97, 0xa4, 0xa2, 0xc1, 0xd8, 0x7f, 0x32, 0xfd, 0xcf, 0x78, 0xa8, 0xb1, 0xf9, 0xa2,
    0xbe, 0x11, 0x74, 0x97, 0xf6, 0xfb, 0xb5, 0xaa, 0xb3, 0x3b, 0xd9, 0x1d, 0x83, 0xfb, 0x29, 0x0b, 0x05, 0xf9, 0x11,
    0x00, 0xfb, 0x01, 0xbd, 0x16, 0xf7, 0xc9, 0x30, 0x09, 0xcb, 0xae, 0x93, 0xd8, 0x3e, 0xac, 0x02, 0xe6, 0x63, 0x9f,
    0x06, 0xf9, 0x21, 0x31, 0xd9, 0xf2, 0x2b, 0x3a, 0xc2, 0x94, 0x7c, 0x8d, 0x7c, 0xd8, 0x34, 0x26, 0x9e, 0xb1, 0xa7,
    0x5e, 0xff, 0xd1, 0x38, 0xe8, 0x5c, 0xd5, 0x3f, 0xe6,
];

/// The DER DigestInfo prefix of a SHA-256 digest in an EMSA-PKCS1-v1_5 block (RFC 8017 9.2, note 1).
pub const SHA256_DIGEST_INFO: [u8; 19] =
    [0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20];

/// What the engine checks: the signature, raised to [`KEY_EXPONENT`] modulo [`KEY_MODULUS`], is this block of
/// SHA-256 over the CSS header (streamed to MISC_CFG_SHA_PRELOAD) followed by the payload (written to the
/// 8051's code RAM from address 0). Signature, r2 and mu are little-endian like the modulus.
///
/// The EMSA-PKCS1-v1_5 block of a SHA-256 digest for a 2048-bit key, most significant byte first:
/// `00 01 FF..FF 00 DigestInfo digest`.
pub fn emsa_pkcs1_v15_sha256(digest: &[u8; 32]) -> [u8; KEY_BYTES] {
    let mut em = [0xFF_u8; KEY_BYTES];
    em[0] = 0x00;
    em[1] = 0x01;
    let t = KEY_BYTES - SHA256_DIGEST_INFO.len() - digest.len();
    em[t - 1] = 0x00;
    em[t..t + SHA256_DIGEST_INFO.len()].copy_from_slice(&SHA256_DIGEST_INFO);
    em[KEY_BYTES - digest.len()..].copy_from_slice(digest);
    em
}

/// The payload's first bytes: which image this is.
pub const IMAGE_MAGIC: [u8; 16] = *b"rdma-emu dc8051\0";
/// Payload bytes: the magic, the version (major, minor, patch), a reserved byte, and padding to a qword.
pub const IMAGE_BYTES: usize = 24;

/// The firmware version the payload declares; the 8051 reports it in its MISC_STATUS and VERSION_PATCH
/// config fields once it runs (chip.c read_misc_status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirmwareVersion {
    pub major: u8,
    pub minor: u8,
    pub patch: u8,
}

/// The version images carry unless built otherwise: the last public release of the 8051 firmware. From
/// 0.20 the driver reaches LCB CSRs through the 8051 (chip.c read_lcb_via_8051, write_lcb_via_8051); from
/// 1.25 it offers the LCB-reset configuration request (chip.c set_local_link_attributes).
pub const DEFAULT_VERSION: FirmwareVersion = FirmwareVersion { major: 1, minor: 27, patch: 0 };

/// The payload of an image declaring `version`.
pub fn encode_payload(version: FirmwareVersion) -> [u8; IMAGE_BYTES] {
    let mut p = [0u8; IMAGE_BYTES];
    p[..IMAGE_MAGIC.len()].copy_from_slice(&IMAGE_MAGIC);
    p[16] = version.major;
    p[17] = version.minor;
    p[18] = version.patch;
    p
}

/// The version a loaded payload declares, or `None` if it is not an image of this project (the 8051 then
/// never reports ready).
pub fn decode_payload(payload: &[u8]) -> Option<FirmwareVersion> {
    if payload.len() < IMAGE_BYTES || payload[..IMAGE_MAGIC.len()] != IMAGE_MAGIC {
        return None;
    }
    Some(FirmwareVersion { major: payload[16], minor: payload[17], patch: payload[18] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips_and_other_bytes_are_not_an_image() {
        let v = FirmwareVersion { major: 0, minor: 19, patch: 3 };
        assert_eq!(decode_payload(&encode_payload(v)), Some(v));
        assert_eq!(decode_payload(&[0u8; IMAGE_BYTES]), None);
        assert_eq!(decode_payload(&encode_payload(v)[..IMAGE_BYTES - 1]), None);
    }

    #[test]
    fn emsa_block_has_the_rfc_8017_shape() {
        let em = emsa_pkcs1_v15_sha256(&[0xAB; 32]);
        // 2048 bits: 00 01, 202 bytes of FF, 00, 19 bytes of DigestInfo, 32 of digest (RFC 8017 9.2).
        assert_eq!(&em[..2], &[0x00, 0x01]);
        assert!(em[2..204].iter().all(|&b| b == 0xFF));
        assert_eq!(em[204], 0x00);
        assert_eq!(&em[205..224], &SHA256_DIGEST_INFO);
        assert!(em[224..].iter().all(|&b| b == 0xAB));
    }

    #[test]
    fn key_is_a_2048_bit_odd_modulus() {
        assert!(KEY_MODULUS[KEY_BYTES - 1] & 0x80 != 0, "top bit set");
        assert!(KEY_MODULUS[0] & 1 == 1, "odd");
    }
}
