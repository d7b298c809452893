//! The deterministic data both sides compute: what the host injects at a buffer offset, and the guard byte
//! every byte the host never targets must keep.

/// Every byte of a buffer mapping is set to this before TID_UPDATE; unplaced bytes must still hold it.
pub const GUARD_BYTE: u8 = 0xA5;

/// Salt for the payload of packets that must be dropped: if one were placed, its bytes would differ from
/// the data the guest expects there.
pub const POISON_SALT: u64 = 0xD20B_5EED_0000_0001;

/// splitmix64: a cheap, well-mixed function of a counter.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn word(seed: u64, buffer: u32, index: u64) -> u64 {
    splitmix64(seed ^ (u64::from(buffer) << 48) ^ splitmix64(index))
}

/// The data byte at `offset` of buffer `buffer`.
pub fn data_byte(seed: u64, buffer: u32, offset: u64) -> u8 {
    word(seed, buffer, offset / 8).to_le_bytes()[(offset % 8) as usize]
}

/// Fills `out` with the data of buffer `buffer` from `offset` on.
pub fn fill(seed: u64, buffer: u32, offset: u64, out: &mut [u8]) {
    for (i, b) in out.iter_mut().enumerate() {
        *b = data_byte(seed, buffer, offset + i as u64);
    }
}

/// The data of buffer `buffer` for `[offset, offset + len)`.
pub fn bytes(seed: u64, buffer: u32, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    fill(seed, buffer, offset, &mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_its_reference_outputs() {
        // The first outputs of Vigna's splitmix64 generator seeded with 0 (state advanced before mixing).
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(0x9E37_79B9_7F4A_7C15), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn data_depends_on_seed_buffer_and_offset() {
        let a = bytes(1, 0, 0, 64);
        assert_ne!(a, bytes(2, 0, 0, 64));
        assert_ne!(a, bytes(1, 1, 0, 64));
        assert_ne!(a, bytes(1, 0, 64, 64));
        // A slice starting mid-word is the same bytes as the whole run.
        assert_eq!(bytes(1, 0, 3, 20), a[3..23]);
    }
}
