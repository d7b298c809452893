//! The emulated chip's 8051 firmware file, `hfi_dc8051.bin`: the kernel's augmented firmware file (firmware.c
//! `struct augmented_firmware_file`) around this project's payload (`emu_abi::dc8051`), signed with the
//! emulator's test key so that the chip's security engine accepts it. `ci/build-guest.sh` puts it in the
//! guest's /lib/firmware.

use emu_abi::dc8051::{
    emsa_pkcs1_v15_sha256, encode_payload, FirmwareVersion, CSS_HEADER_BYTES, KEY_BYTES, KEY_EXPONENT, KEY_MODULUS,
    MU_BYTES,
};
use num_bigint::BigUint;
use sha2::{Digest, Sha256};

/// The name the stock driver requests on a chip that is not RTL silicon (firmware.c DEFAULT_FW_8051_NAME_FPGA).
pub const FILE_NAME: &str = "hfi_dc8051.bin";

/// CSS header values the driver checks (firmware.c verify_css_header and its CSS_* constants).
const CSS_MODULE_TYPE: u32 = 0x6;
const CSS_HEADER_VERSION: u32 = 0x1_0000;
const CSS_MODULE_VENDOR: u32 = 0x8086;
const EXPONENT_BYTES: usize = 4;
/// `struct firmware_file` without the payload: header, modulus, exponent, signature.
const FIRMWARE_FILE_BYTES: usize = CSS_HEADER_BYTES + KEY_BYTES + EXPONENT_BYTES + KEY_BYTES;
/// The date field, BCD yyyymmdd.
const CSS_DATE: u32 = 0x2026_1203;

/// The private exponent of the emulator's test key, least significant byte first. It is published on purpose:
/// the emulated chip's key guards nothing, and anyone may build an image for it.
const KEY_PRIVATE_EXPONENT: [u8; KEY_BYTES] = [
    0x31, 0x89, 0x8b, 0x0d, 0x3b, 0x54, 0x0e, 0x0f, 0xd0, 0x6e, 0xaf, 0x53, 0x6a, 0xc7, 0xed, 0x84, 0xcc, 0x0c, 0x91,
    0x6d, 0x9c, 0xbd, 0x1c, 0xb3, 0x5c, 0x13, 0x8f, 0xde, 0x01, 0x78, 0xe5, 0xa3, 0xb1, 0x44, 0x9a, 0xba, 0xa2, 0x4a,
    0x39, 0xc7, 0x74, 0x77, 0xaa, 0x76, 0x91, 0xd7, 0x8c, 0xda, 0xfa, 0xbd, 0x06, 0x0d, 0x15, 0x96, 0x69, 0x19, 0x1e,
    0x6d, 0xc0, 0xeb, 0x8a, 0xf4, 0x28, 0xb8, 0xf6, 0xa0, 0xdf, 0xbb, 0xab, 0x3b, 0x89, 0x2f, 0x0b, 0x85, 0x63, 0xf7,
    0x4d, 0xcf, 0x7c, 0x41, 0x0d, 0xeb, 0x99, 0xe5, 0xf5, 0x1a, 0xa6, 0xa1, 0xbf, 0x95, 0xa6, 0x4d, 0xe2, 0xb3, 0xb2,
    0x86, 0x46, 0xd3, 0xfb, 0xce, 0x32, 0x97, 0xff, 0x5e, 0xae, 0x95, 0xba, 0x9d, 0x8d, 0xc3, 0xb9, 0x85, 0x9d, 0x78,
    0x28, 0xd8, 0x5c, 0x76, 0x3f, 0xe7, 0x93, 0xf6, 0x1b, 0x49, 0x97, 0x06, 0xed, 0x1e, 0x43, 0x6f, 0x61, 0xe3, 0x50,
    0x92, 0x28, 0x6f, 0x84, 0x20, 0xb5, 0xef, 0x6d, 0xe7, 0xbe, 0xa8, 0xa5, 0xdd, 0x97, 0x99, 0x7d, 0xef, 0x9c, 0x3f,
    0x5f, 0x88, 0x2c, 0x03, 0xd6, 0x77, 0x24, 0xd2, 0x57, 0xb4, 0x10, 0x75, 0x8a, 0x5a, 0x81, 0xe2, 0x13, 0x8b, 0xbc,
    0x49, 0x22, 0x66, 0xbd, 0xde, 0xac, 0xe6, 0x52, 0xc4, 0xeb, 0xd6, 0x28, 0xae, 0x07, 0xce, 0x52, 0xd7, 0x38, 0x5b,
    0x5e, 0xd0, 0xe8, 0x85, 0xe9, 0x0c, 0x57, 0x84, 0x15, 0x75, 0xe2, 0x93, 0xbd, 0xae, 0xf8, 0x11, 0x1c, 0xa5, 0xfb,
    0xaa, 0x15, 0xcf, 0x78, 0x61, 0x33, 0x3d, 0xb6, 0xf4, 0x55, 0x12, 0xbc, 0x6d, 0xb9, 0x15, 0xb2, 0x52, 0xba, 0x83,
    0x33, 0x3d, 0x4e, 0xd1, 0x87, 0xa8, 0xd1, 0x65, 0x0a, 0xe2, 0x12, 0x0b, 0xbd, 0xa4, 0x99, 0x64, 0x5f, 0xc0, 0x40,
    0xf8, 0x10, 0xbf, 0x4f, 0x14, 0x42, 0x00, 0x9c, 0x05,
];

/// The CSS header of a file with `payload_len` payload bytes (`size` counts the non-augmented file, in dwords,
/// which is how obtain_one_firmware recognises the augmented one).
fn css_header(payload_len: usize) -> [u8; CSS_HEADER_BYTES] {
    let dwords = |bytes: usize| u32::try_from(bytes / 4).expect("firmware file fits u32 dwords");
    let fields = [
        CSS_MODULE_TYPE,
        dwords(FIRMWARE_FILE_BYTES),
        CSS_HEADER_VERSION,
        0, // module_id
        CSS_MODULE_VENDOR,
        CSS_DATE,
        dwords(FIRMWARE_FILE_BYTES + payload_len),
        dwords(KEY_BYTES),
        dwords(KEY_BYTES),
        dwords(EXPONENT_BYTES),
    ];
    let mut h = [0u8; CSS_HEADER_BYTES];
    for (i, f) in fields.iter().enumerate() {
        h[4 * i..4 * i + 4].copy_from_slice(&f.to_le_bytes());
    }
    h
}

/// `value` as `len` little-endian bytes.
fn le_bytes(value: &BigUint, len: usize) -> Vec<u8> {
    let mut b = value.to_bytes_le();
    b.resize(len, 0);
    b
}

/// The Montgomery constants of the modulus that the driver writes next to it: r2 = R^2 mod n with R = 2^2048,
/// and mu = -n^-1 mod 2^64.
pub fn montgomery_constants(n: &BigUint) -> (BigUint, BigUint) {
    let r2 = (BigUint::from(1u8) << (2 * 8 * KEY_BYTES)) % n;
    let two64 = BigUint::from(1u8) << 64;
    let n0 = n % &two64;
    // n is odd, so n0 is invertible mod 2^64: Newton's iteration x <- x(2 - n0 x) doubles the correct bits.
    let mut inv = BigUint::from(1u8);
    for _ in 0..6 {
        let t = (&n0 * &inv) % &two64;
        inv = (&inv * ((BigUint::from(2u8) + &two64 - t) % &two64)) % &two64;
    }
    let mu = (&two64 - inv) % &two64;
    (r2, mu)
}

/// The whole file for an image declaring `version`.
pub fn build_image(version: FirmwareVersion) -> Vec<u8> {
    let payload = encode_payload(version);
    let header = css_header(payload.len());
    let n = BigUint::from_bytes_le(&KEY_MODULUS);
    let d = BigUint::from_bytes_le(&KEY_PRIVATE_EXPONENT);
    let digest: [u8; 32] = Sha256::new().chain_update(header).chain_update(payload).finalize().into();
    let em = BigUint::from_bytes_be(&emsa_pkcs1_v15_sha256(&digest));
    let signature = em.modpow(&d, &n);
    let (r2, mu) = montgomery_constants(&n);

    let mut f = Vec::with_capacity(FIRMWARE_FILE_BYTES + KEY_BYTES + MU_BYTES + payload.len());
    f.extend_from_slice(&header);
    f.extend_from_slice(&KEY_MODULUS);
    f.extend_from_slice(&KEY_EXPONENT.to_le_bytes());
    f.extend_from_slice(&le_bytes(&signature, KEY_BYTES));
    f.extend_from_slice(&le_bytes(&r2, KEY_BYTES));
    f.extend_from_slice(&le_bytes(&mu, MU_BYTES));
    f.extend_from_slice(&payload);
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use emu_abi::dc8051::{decode_payload, DEFAULT_VERSION};

    fn u32_at(f: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(f[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn header_passes_the_drivers_checks_and_marks_the_file_augmented() {
        let f = build_image(DEFAULT_VERSION);
        // verify_css_header: module_type 6, header_len 0xa1 (CSS_HEADER_LEN), version 0x10000, vendor 0x8086,
        // key and modulus 64 dwords, exponent 1.
        let expect = [(0, 0x6), (4, 0xa1), (8, 0x1_0000), (16, 0x8086), (28, 64), (32, 64), (36, 1)];
        for (at, v) in expect {
            assert_eq!(u32_at(&f, at), v, "header field at {at}");
        }
        // obtain_one_firmware: size*4 + AUGMENT_SIZE (r2 256 + mu 8) is the file's length.
        assert_eq!(u32_at(&f, 24) as usize * 4 + 264, f.len());
        assert_eq!(decode_payload(&f[f.len() - 24..]), Some(DEFAULT_VERSION));
    }

    #[test]
    fn signature_is_what_openssl_makes_with_the_test_key() {
        // `openssl dgst -sha256 -sign` with the test key over header || payload of the default image (PKCS#1
        // v1.5 signatures are deterministic), big-endian.
        let golden: String = [
            "2e86fe58d699220b886e42e673e5363763d2438e8cfdddf9352470091a0802fc9192939c8451d46c0d002e903cde727f",
            "705c7007e641b88c8720858e5073266e6d4e92666b3a37ddb2d861846bc26c7fcd691ac1c02c95e97e47cafd7e972e9f",
            "94a0bc904013ae86ab97ac4ca28ae39d59e1473feadbfb979fc1c1b238b151bc8b181471b2b852850033f3ffe77d6bf2",
            "b3e847bbb9edff066eaf514cf03b25d50068232b20d19f31d195d6034c8e55edacbdaf401392707dceea7726b4f4497b",
            "5f9ed1f690eb50f0ef66cabbff9e0931eef7810a462eaae924719497a8cb78b55c673b91cb6ab708f2182ae50be92d43",
            "50d36a32c9099373d361e73cd9ccb05f",
        ]
        .concat();
        let f = build_image(DEFAULT_VERSION);
        let ours: String = f[388..644].iter().rev().map(|b| format!("{b:02x}")).collect();
        assert_eq!(ours, golden);
    }

    #[test]
    fn signature_verifies_with_the_public_exponent() {
        let f = build_image(DEFAULT_VERSION);
        let n = BigUint::from_bytes_le(&KEY_MODULUS);
        let sig = BigUint::from_bytes_le(&f[388..644]);
        let mut em = sig.modpow(&BigUint::from(KEY_EXPONENT), &n).to_bytes_be();
        em.insert(0, 0);
        let digest: [u8; 32] = Sha256::new().chain_update(&f[..128]).chain_update(&f[908..]).finalize().into();
        assert_eq!(em, emsa_pkcs1_v15_sha256(&digest));
    }

    #[test]
    fn montgomery_constants_satisfy_their_definitions() {
        let n = BigUint::from_bytes_le(&KEY_MODULUS);
        let (r2, mu) = montgomery_constants(&n);
        let r = BigUint::from(1u8) << 2048;
        assert_eq!(r2, (&r * &r) % &n);
        // n * mu == -1 mod 2^64
        let two64 = BigUint::from(1u8) << 64;
        assert_eq!((&n * &mu) % &two64, &two64 - 1u8);
    }
}
