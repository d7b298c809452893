//! The coverage region's layout, as `kernel-cov/hfi1_cov.h` defines it (the one definition: the test
//! `the_layout_matches_the_c_header` reads that header and checks every constant here against it).

/// "HCOV", little-endian.
pub const MAGIC: u32 = 0x564f_4348;
pub const VERSION: u32 = 1;
/// The header's STATE once the guest has written the header.
pub const STATE_ATTACHED: u32 = 1;

/// Header fields: byte offsets from the region start.
pub mod field {
    pub const MAGIC: usize = 0x00;
    pub const VERSION: usize = 0x04;
    pub const STATE: usize = 0x08;
    pub const MAP_SIZE: usize = 0x0c;
    pub const SEEN_BITS: usize = 0x10;
    pub const PCS_CAPACITY: usize = 0x14;
    pub const TEXT_BASE: usize = 0x18;
    pub const TEXT_SIZE: usize = 0x20;
    pub const PC_COUNT: usize = 0x28;
    pub const GENERATION: usize = 0x30;
    pub const HITS: usize = 0x38;
}

pub const HEADER_SIZE: usize = 0x1000;
/// One byte per edge: AFL-style hit counts of (previous call site hash >> 1) ^ current call site hash.
pub const MAP_OFFSET: usize = 0x1000;
pub const MAP_SIZE: usize = 0x10000;
/// One bit per byte offset of the module's text, set at a call site's first hit.
pub const SEEN_OFFSET: usize = 0x11000;
pub const SEEN_BYTES: usize = 0x80000;
/// u32 per first hit: the call site's return address minus the module's MOD_TEXT base.
pub const PCS_OFFSET: usize = 0x91000;
/// The size of the ivshmem-plain backend (a power of two, as ivshmem requires).
pub const REGION_SIZE: usize = 0x20_0000;
pub const PCS_CAPACITY: usize = (REGION_SIZE - PCS_OFFSET) / 4;

// The areas follow each other without overlap, inside a region ivshmem accepts (a power of two).
const _: () = {
    assert!(MAP_OFFSET == HEADER_SIZE);
    assert!(SEEN_OFFSET == MAP_OFFSET + MAP_SIZE);
    assert!(PCS_OFFSET == SEEN_OFFSET + SEEN_BYTES);
    assert!(PCS_OFFSET + 4 * PCS_CAPACITY <= REGION_SIZE);
    assert!(REGION_SIZE.is_power_of_two());
    assert!(field::HITS + 8 <= HEADER_SIZE);
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The `#define HFI1_COV_* <literal>` lines of the C header, the literal parsed (hex or decimal, an
    /// optional `u` suffix); defines whose value is an expression are left out.
    fn c_defines() -> HashMap<String, u64> {
        let header = include_str!("../../../kernel-cov/hfi1_cov.h");
        header
            .lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                (words.next()? == "#define").then_some(())?;
                let name = words.next()?.strip_prefix("HFI1_COV_")?.to_string();
                let lit = words.next()?.trim_end_matches('u');
                let v = match lit.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16).ok()?,
                    None => lit.parse().ok()?,
                };
                Some((name, v))
            })
            .collect()
    }

    #[test]
    fn the_layout_matches_the_c_header() {
        let c = c_defines();
        let ours: &[(&str, u64)] = &[
            ("MAGIC", MAGIC.into()),
            ("VERSION", VERSION.into()),
            ("STATE_ATTACHED", STATE_ATTACHED.into()),
            ("OFF_MAGIC", field::MAGIC as u64),
            ("OFF_VERSION", field::VERSION as u64),
            ("OFF_STATE", field::STATE as u64),
            ("OFF_MAP_SIZE", field::MAP_SIZE as u64),
            ("OFF_SEEN_BITS", field::SEEN_BITS as u64),
            ("OFF_PCS_CAPACITY", field::PCS_CAPACITY as u64),
            ("OFF_TEXT_BASE", field::TEXT_BASE as u64),
            ("OFF_TEXT_SIZE", field::TEXT_SIZE as u64),
            ("OFF_PC_COUNT", field::PC_COUNT as u64),
            ("OFF_GENERATION", field::GENERATION as u64),
            ("OFF_HITS", field::HITS as u64),
            ("HEADER_SIZE", HEADER_SIZE as u64),
            ("MAP_OFFSET", MAP_OFFSET as u64),
            ("MAP_SIZE", MAP_SIZE as u64),
            ("SEEN_OFFSET", SEEN_OFFSET as u64),
            ("SEEN_BYTES", SEEN_BYTES as u64),
            ("PCS_OFFSET", PCS_OFFSET as u64),
            ("REGION_SIZE", REGION_SIZE as u64),
        ];
        for (name, value) in ours {
            assert_eq!(c.get(*name), Some(value), "HFI1_COV_{name}");
        }
        // Every literal define of the header has its counterpart here.
        assert_eq!(c.len(), ours.len(), "defines in hfi1_cov.h: {c:?}");
    }
}
