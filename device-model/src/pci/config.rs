//! PCI Express configuration space as data plus masks.
//!
//! Every byte has a value, a writable-bit mask and a write-1-to-clear mask, so one write rule covers the whole
//! space: BAR sizing falls out of the BAR masks, status bits out of the W1C masks, and read-only fields stay
//! put. The device changes read-only state through the `set_*` back door, never through `write`.

#![forbid(unsafe_code)]

use thiserror::Error;

use super::ids::PciIds;
use super::regs::*;
use crate::engine::PcieLink;

/// Where the capabilities live by default (docs/pci.md gives the offsets); a chip personality moves them.
pub const PCIE_CAP_OFFSET: usize = 0x40;
pub const MSIX_CAP_OFFSET: usize = 0x80;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    #[error("config access of {len} bytes (only 1, 2 or 4)")]
    BadWidth { len: usize },
    #[error("config access {offset:#x}+{len:#x} outside the 4 KiB config space")]
    OutOfRange { offset: u64, len: usize },
}

impl ConfigError {
    pub fn errno(&self) -> i32 {
        libc::EINVAL
    }
}

/// One memory BAR as the config header describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarLayout {
    pub index: usize,
    /// Power of two, at least 16 bytes.
    pub size: u64,
    pub is_64bit: bool,
    pub prefetchable: bool,
}

/// Where the MSI-X table and PBA sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsixLayout {
    /// 1..=2048.
    pub vectors: u16,
    pub table_bar: u32,
    pub table_offset: u32,
    pub pba_bar: u32,
    pub pba_offset: u32,
}

/// Capability offsets, the link, and device-specific storage registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapLayout {
    /// Offset of the PCI Express capability, dword aligned in 0x40..0x100.
    pub pcie: usize,
    /// Offset of the MSI-X capability (when there is one), dword aligned in 0x40..0x100, not overlapping
    /// the PCI Express capability.
    pub msix: usize,
    pub link: PcieLink,
    /// (offset, length) ranges of extended config space that are read/write storage.
    pub storage: Vec<(usize, usize)>,
}

impl Default for CapLayout {
    fn default() -> Self {
        CapLayout {
            pcie: PCIE_CAP_OFFSET,
            msix: MSIX_CAP_OFFSET,
            link: PcieLink { speed: PCI_EXP_LNKCAP_SLS_2_5GB as u8, width: 1 },
            storage: Vec::new(),
        }
    }
}

impl CapLayout {
    /// Whether the capabilities fit the legacy space without overlapping and the storage ranges lie in
    /// extended config space.
    pub fn is_valid(&self) -> bool {
        let cap_ok = |off: usize, len: usize| off.is_multiple_of(4) && off >= 0x40 && off + len <= PCI_CFG_SPACE_SIZE;
        let (p, m) = (self.pcie, self.msix);
        let apart = p + PCI_CAP_EXP_ENDPOINT_SIZEOF_V2 <= m || m + PCI_CAP_MSIX_SIZEOF <= p;
        let storage_ok = self.storage.iter().all(|&(off, len)| {
            off % 4 == 0
                && len % 4 == 0
                && len > 0
                && off >= PCI_CFG_SPACE_SIZE + 4
                && off + len <= PCI_CFG_SPACE_EXP_SIZE
        });
        cap_ok(p, PCI_CAP_EXP_ENDPOINT_SIZEOF_V2)
            && cap_ok(m, PCI_CAP_MSIX_SIZEOF)
            && apart
            && (1..=3).contains(&self.link.speed)
            && matches!(self.link.width, 1 | 2 | 4 | 8 | 12 | 16 | 32)
            && storage_ok
    }
}

/// Everything that decides the power-on contents of config space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigLayout {
    pub ids: PciIds,
    pub bars: Vec<BarLayout>,
    pub msix: Option<MsixLayout>,
    pub caps: CapLayout,
}

pub struct ConfigSpace {
    /// Offsets of the PCI Express and MSI-X capabilities.
    pcie_cap: usize,
    msix_cap: usize,
    data: Box<[u8; PCI_CFG_SPACE_EXP_SIZE]>,
    wmask: Box<[u8; PCI_CFG_SPACE_EXP_SIZE]>,
    w1c: Box<[u8; PCI_CFG_SPACE_EXP_SIZE]>,
}

impl std::fmt::Debug for ConfigSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigSpace").field("header", &&self.data[..0x40]).finish_non_exhaustive()
    }
}

fn check(offset: u64, len: usize) -> Result<usize, ConfigError> {
    if !matches!(len, 1 | 2 | 4) {
        return Err(ConfigError::BadWidth { len });
    }
    let start = usize::try_from(offset).map_err(|_| ConfigError::OutOfRange { offset, len })?;
    match start.checked_add(len) {
        Some(end) if end <= PCI_CFG_SPACE_EXP_SIZE => Ok(start),
        _ => Err(ConfigError::OutOfRange { offset, len }),
    }
}

impl ConfigSpace {
    /// Power-on contents for `layout`. BARs that overlap or do not fit the six slots are left out (callers
    /// validate layouts; this never panics on a bad one).
    pub fn new(layout: &ConfigLayout) -> Self {
        let caps = if layout.caps.is_valid() { layout.caps.clone() } else { CapLayout::default() };
        let mut c = ConfigSpace {
            pcie_cap: caps.pcie,
            msix_cap: caps.msix,
            data: Box::new([0; PCI_CFG_SPACE_EXP_SIZE]),
            wmask: Box::new([0; PCI_CFG_SPACE_EXP_SIZE]),
            w1c: Box::new([0; PCI_CFG_SPACE_EXP_SIZE]),
        };
        c.init_header(&layout.ids);
        for bar in &layout.bars {
            c.init_bar(bar);
        }
        // The chain runs in offset order, as on hardware.
        match &layout.msix {
            Some(msix) if caps.msix < caps.pcie => {
                c.set_u8(PCI_CAPABILITY_LIST, caps.msix as u8);
                c.init_msix_cap(msix, caps.pcie);
                c.init_pcie_cap(0, caps.link);
            }
            Some(msix) => {
                c.init_pcie_cap(caps.msix, caps.link);
                c.init_msix_cap(msix, 0);
            }
            None => c.init_pcie_cap(0, caps.link),
        }
        for &(off, len) in &caps.storage {
            c.wmask[off..off + len].fill(0xff);
        }
        c
    }

    /// Offset of the PCI Express capability.
    pub fn pcie_cap(&self) -> usize {
        self.pcie_cap
    }

    fn init_header(&mut self, ids: &PciIds) {
        self.set_u16(PCI_VENDOR_ID, ids.vendor_id);
        self.set_u16(PCI_DEVICE_ID, ids.device_id);
        self.set_wmask_u16(
            PCI_COMMAND,
            PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER | PCI_COMMAND_PARITY | PCI_COMMAND_SERR | PCI_COMMAND_INTX_DISABLE,
        );
        self.set_u16(PCI_STATUS, PCI_STATUS_CAP_LIST);
        self.set_w1c_u16(PCI_STATUS, PCI_STATUS_ERROR_BITS);
        self.set_u32(PCI_CLASS_REVISION, (ids.class_code << 8) | u32::from(ids.revision));
        self.set_u8(PCI_CACHE_LINE_SIZE, 0);
        self.wmask[PCI_CACHE_LINE_SIZE] = 0xff;
        self.set_u8(PCI_HEADER_TYPE, PCI_HEADER_TYPE_NORMAL);
        self.set_u16(PCI_SUBSYSTEM_VENDOR_ID, ids.subsystem_vendor_id);
        self.set_u16(PCI_SUBSYSTEM_ID, ids.subsystem_id);
        // No expansion ROM: PCI_ROM_ADDRESS stays 0 and read-only, so sizing it reads 0.
        self.set_u8(PCI_CAPABILITY_LIST, self.pcie_cap as u8);
        self.wmask[PCI_INTERRUPT_LINE] = 0xff;
        // Interrupt pin 0: no INTx (MSI-X only).
        self.set_u8(PCI_INTERRUPT_PIN, 0);
    }

    fn init_bar(&mut self, bar: &BarLayout) {
        let slots = if bar.is_64bit { 2 } else { 1 };
        if bar.index + slots > PCI_NUM_BARS || !bar.size.is_power_of_two() || bar.size < 16 {
            return;
        }
        let off = PCI_BASE_ADDRESS_0 + 4 * bar.index;
        let mut flags = PCI_BASE_ADDRESS_SPACE_MEMORY;
        flags |= if bar.is_64bit { PCI_BASE_ADDRESS_MEM_TYPE_64 } else { PCI_BASE_ADDRESS_MEM_TYPE_32 };
        if bar.prefetchable {
            flags |= PCI_BASE_ADDRESS_MEM_PREFETCH;
        }
        // Address bits below the size are hardwired to zero: that is what makes sizing work.
        let addr_mask = !(bar.size - 1);
        self.set_u32(off, flags);
        self.set_wmask_u32(off, (addr_mask as u32) & PCI_BASE_ADDRESS_MEM_MASK);
        if bar.is_64bit {
            self.set_u32(off + 4, 0);
            self.set_wmask_u32(off + 4, (addr_mask >> 32) as u32);
        } else if bar.size > 1 << 31 {
            // A 32-bit BAR cannot be larger than 2 GiB; leave it unimplemented.
            self.set_u32(off, 0);
            self.set_wmask_u32(off, 0);
        }
    }

    fn init_pcie_cap(&mut self, next: usize, link: PcieLink) {
        let cap = self.pcie_cap;
        self.set_u8(cap + PCI_CAP_LIST_ID, PCI_CAP_ID_EXP);
        self.set_u8(cap + PCI_CAP_LIST_NEXT, next as u8);
        self.set_u16(cap + PCI_EXP_FLAGS, PCI_EXP_FLAGS_VERS_2 | PCI_EXP_TYPE_ENDPOINT);
        self.set_u32(cap + PCI_EXP_DEVCAP, PCI_EXP_DEVCAP_PAYLOAD_256B | PCI_EXP_DEVCAP_RBER | PCI_EXP_DEVCAP_FLR);
        self.set_u16(
            cap + PCI_EXP_DEVCTL,
            PCI_EXP_DEVCTL_RELAX_EN | PCI_EXP_DEVCTL_NOSNOOP_EN | PCI_EXP_DEVCTL_READRQ_512B,
        );
        // BCR_FLR is not writable storage: Function sees the write and performs the reset; it reads 0.
        self.set_wmask_u16(
            cap + PCI_EXP_DEVCTL,
            PCI_EXP_DEVCTL_CERE
                | PCI_EXP_DEVCTL_NFERE
                | PCI_EXP_DEVCTL_FERE
                | PCI_EXP_DEVCTL_URRE
                | PCI_EXP_DEVCTL_RELAX_EN
                | PCI_EXP_DEVCTL_PAYLOAD
                | PCI_EXP_DEVCTL_NOSNOOP_EN
                | PCI_EXP_DEVCTL_READRQ,
        );
        self.set_w1c_u16(
            cap + PCI_EXP_DEVSTA,
            PCI_EXP_DEVSTA_CED | PCI_EXP_DEVSTA_NFED | PCI_EXP_DEVSTA_FED | PCI_EXP_DEVSTA_URD,
        );
        let speed = u32::from(link.speed) & PCI_EXP_LNKCAP_SLS;
        let width = u32::from(link.width) << PCI_EXP_LNKCAP_MLW_SHIFT;
        self.set_u32(cap + PCI_EXP_LNKCAP, speed | width);
        self.set_wmask_u16(
            cap + PCI_EXP_LNKCTL,
            PCI_EXP_LNKCTL_ASPMC | PCI_EXP_LNKCTL_RCB | PCI_EXP_LNKCTL_CCC | PCI_EXP_LNKCTL_ES,
        );
        self.set_u16(cap + PCI_EXP_LNKSTA, (speed | width) as u16);
        // Supported Link Speeds Vector: every speed up to the maximum (bit 1 is 2.5 GT/s).
        let vector = ((1u32 << (speed + 1)) - 1) & !1;
        self.set_u32(cap + PCI_EXP_LNKCAP2, vector);
        self.set_u16(cap + PCI_EXP_LNKCTL2, speed as u16);
    }

    fn init_msix_cap(&mut self, msix: &MsixLayout, next: usize) {
        let cap = self.msix_cap;
        let vectors = msix.vectors.clamp(1, PCI_MSIX_MAX_VECTORS);
        self.set_u8(cap + PCI_CAP_LIST_ID, PCI_CAP_ID_MSIX);
        self.set_u8(cap + PCI_CAP_LIST_NEXT, next as u8);
        self.set_u16(cap + PCI_MSIX_FLAGS, (vectors - 1) & PCI_MSIX_FLAGS_QSIZE);
        self.set_wmask_u16(cap + PCI_MSIX_FLAGS, PCI_MSIX_FLAGS_MASKALL | PCI_MSIX_FLAGS_ENABLE);
        let table = (msix.table_offset & PCI_MSIX_TABLE_OFFSET) | (msix.table_bar & PCI_MSIX_TABLE_BIR);
        let pba = (msix.pba_offset & PCI_MSIX_TABLE_OFFSET) | (msix.pba_bar & PCI_MSIX_TABLE_BIR);
        self.set_u32(cap + PCI_MSIX_TABLE, table);
        self.set_u32(cap + PCI_MSIX_PBA, pba);
    }

    /// Reads `buf.len()` (1, 2 or 4) bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ConfigError> {
        let start = check(offset, buf.len())?;
        buf.copy_from_slice(&self.data[start..start + buf.len()]);
        Ok(())
    }

    /// Writes `buf.len()` (1, 2 or 4) bytes at `offset` under the masks: read-only bits keep their value,
    /// writable bits take the new one, and a 1 written to a W1C bit clears it.
    pub fn write(&mut self, offset: u64, buf: &[u8]) -> Result<(), ConfigError> {
        let start = check(offset, buf.len())?;
        for (i, &val) in buf.iter().enumerate() {
            let at = start + i;
            let (cur, wm, w1c) = (self.data[at], self.wmask[at], self.w1c[at]);
            self.data[at] = ((cur & !wm) | (val & wm)) & !(val & w1c);
        }
        Ok(())
    }

    // The device's back door. Offsets are the device's own constants, so out-of-range is a bug in this crate;
    // it is still ignored rather than panicking.
    pub fn get_u8(&self, offset: usize) -> u8 {
        self.data.get(offset).copied().unwrap_or(0)
    }
    pub fn get_u16(&self, offset: usize) -> u16 {
        u16::from_le_bytes([self.get_u8(offset), self.get_u8(offset + 1)])
    }
    pub fn get_u32(&self, offset: usize) -> u32 {
        u32::from(self.get_u16(offset)) | (u32::from(self.get_u16(offset + 2)) << 16)
    }
    pub fn set_u8(&mut self, offset: usize, value: u8) {
        if let Some(b) = self.data.get_mut(offset) {
            *b = value;
        }
    }
    pub fn set_u16(&mut self, offset: usize, value: u16) {
        for (i, b) in value.to_le_bytes().into_iter().enumerate() {
            self.set_u8(offset + i, b);
        }
    }
    pub fn set_u32(&mut self, offset: usize, value: u32) {
        for (i, b) in value.to_le_bytes().into_iter().enumerate() {
            self.set_u8(offset + i, b);
        }
    }
    /// Sets W1C status bits from the device side (an error the function detected).
    pub fn raise_status(&mut self, offset: usize, bits: u16) {
        let v = self.get_u16(offset);
        self.set_u16(offset, v | bits);
    }
    fn set_wmask_u16(&mut self, offset: usize, mask: u16) {
        for (i, b) in mask.to_le_bytes().into_iter().enumerate() {
            if let Some(m) = self.wmask.get_mut(offset + i) {
                *m = b;
            }
        }
    }
    fn set_wmask_u32(&mut self, offset: usize, mask: u32) {
        self.set_wmask_u16(offset, mask as u16);
        self.set_wmask_u16(offset + 2, (mask >> 16) as u16);
    }
    fn set_w1c_u16(&mut self, offset: usize, mask: u16) {
        for (i, b) in mask.to_le_bytes().into_iter().enumerate() {
            if let Some(m) = self.w1c.get_mut(offset + i) {
                *m = b;
            }
        }
    }

    pub fn command(&self) -> u16 {
        self.get_u16(PCI_COMMAND)
    }
    /// MSI-X Message Control, 0 when there is no MSI-X capability.
    pub fn msix_control(&self) -> u16 {
        if self.get_u8(self.msix_cap + PCI_CAP_LIST_ID) == PCI_CAP_ID_MSIX {
            self.get_u16(self.msix_cap + PCI_MSIX_FLAGS)
        } else {
            0
        }
    }
    /// The whole space, for dumps.
    pub fn bytes(&self) -> &[u8] {
        &self.data[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> ConfigLayout {
        ConfigLayout {
            ids: PciIds {
                vendor_id: 0x1b36,
                device_id: 0x1100,
                subsystem_vendor_id: 0x1b36,
                subsystem_id: 0x0001,
                class_code: 0x02_08_00,
                revision: 0x02,
            },
            bars: vec![
                BarLayout { index: 0, size: 0x0400_0000, is_64bit: true, prefetchable: false },
                BarLayout { index: 2, size: 0x0002_0000, is_64bit: true, prefetchable: true },
                BarLayout { index: 4, size: 0x1000, is_64bit: false, prefetchable: false },
            ],
            msix: Some(MsixLayout { vectors: 16, table_bar: 4, table_offset: 0, pba_bar: 4, pba_offset: 0x800 }),
            caps: CapLayout::default(),
        }
    }

    fn r32(c: &ConfigSpace, off: u64) -> u32 {
        let mut b = [0; 4];
        c.read(off, &mut b).unwrap();
        u32::from_le_bytes(b)
    }
    fn r16(c: &ConfigSpace, off: u64) -> u16 {
        let mut b = [0; 2];
        c.read(off, &mut b).unwrap();
        u16::from_le_bytes(b)
    }
    fn w32(c: &mut ConfigSpace, off: u64, v: u32) {
        c.write(off, &v.to_le_bytes()).unwrap();
    }
    fn w16(c: &mut ConfigSpace, off: u64, v: u16) {
        c.write(off, &v.to_le_bytes()).unwrap();
    }

    #[test]
    fn ids_and_class_read_back_as_configured() {
        let c = ConfigSpace::new(&layout());
        assert_eq!(r32(&c, 0x00), 0x1100_1b36);
        assert_eq!(r32(&c, 0x08), 0x0208_0002);
        assert_eq!(r32(&c, 0x2c), 0x0001_1b36);
        assert_eq!(c.get_u8(PCI_HEADER_TYPE), 0);
    }

    #[test]
    fn bar_sizing_with_all_ones_reads_back_size_mask_and_flags() {
        // (BAR register offset, value read after writing all-ones)
        let cases: &[(u64, u32)] = &[
            (0x10, 0xfc00_0004), // 64 MiB, 64-bit, non-prefetchable: low dword
            (0x14, 0xffff_ffff), // its upper dword: all address bits writable
            (0x18, 0xfffe_000c), // 128 KiB, 64-bit, prefetchable
            (0x1c, 0xffff_ffff),
            (0x20, 0xffff_f000), // 4 KiB 32-bit
            (0x24, 0x0000_0000), // unused slot
            (0x30, 0x0000_0000), // no expansion ROM
        ];
        for &(off, want) in cases {
            let mut c = ConfigSpace::new(&layout());
            w32(&mut c, off, 0xffff_ffff);
            assert_eq!(r32(&c, off), want, "BAR at {off:#x}");
        }
    }

    #[test]
    fn bar_keeps_programmed_address_and_drops_bits_below_size() {
        let mut c = ConfigSpace::new(&layout());
        w32(&mut c, 0x20, 0xfebd_1234);
        assert_eq!(r32(&c, 0x20), 0xfebd_1000);
        w32(&mut c, 0x10, 0x8000_0000);
        w32(&mut c, 0x14, 0x0000_0001);
        assert_eq!(r32(&c, 0x10), 0x8000_0004);
        assert_eq!(r32(&c, 0x14), 1);
    }

    #[test]
    fn read_only_fields_ignore_writes() {
        let mut c = ConfigSpace::new(&layout());
        // 0x80 is left out: its upper half is MSI-X Message Control (tested below).
        for off in [0x00u64, 0x08, 0x0c, 0x2c, 0x34, 0x40, 0x44, 0x4c, 0x84, 0x88, 0x100] {
            let before = r32(&c, off);
            w32(&mut c, off, !before);
            // Cache line size (0x0c low byte) is the one writable byte in these dwords.
            let want = if off == 0x0c { (before & !0xff) | (!before & 0xff) } else { before };
            assert_eq!(r32(&c, off), want, "dword {off:#x}");
        }
    }

    #[test]
    fn command_register_takes_only_implemented_bits() {
        let mut c = ConfigSpace::new(&layout());
        w16(&mut c, 0x04, 0xffff);
        assert_eq!(r16(&c, 0x04), 0x0546);
    }

    #[test]
    fn status_error_bits_are_write_one_to_clear_and_cap_list_stays() {
        let mut c = ConfigSpace::new(&layout());
        c.raise_status(PCI_STATUS, PCI_STATUS_REC_MASTER_ABORT | PCI_STATUS_SIG_TARGET_ABORT);
        assert_eq!(r16(&c, 0x06), 0x2810);
        // Writing zeros changes nothing; writing 1 to one error bit clears just that bit.
        w16(&mut c, 0x06, 0);
        assert_eq!(r16(&c, 0x06), 0x2810);
        w16(&mut c, 0x06, PCI_STATUS_REC_MASTER_ABORT);
        assert_eq!(r16(&c, 0x06), 0x0810);
        w16(&mut c, 0x06, 0xffff);
        assert_eq!(r16(&c, 0x06), PCI_STATUS_CAP_LIST);
    }

    #[test]
    fn capability_chain_finds_pcie_then_msix_with_their_fields() {
        let c = ConfigSpace::new(&layout());
        let mut found = Vec::new();
        let mut ptr = c.get_u8(PCI_CAPABILITY_LIST) as u64;
        while ptr != 0 && found.len() < 48 {
            found.push((ptr, c.get_u8(ptr as usize)));
            ptr = c.get_u8(ptr as usize + 1) as u64;
        }
        assert_eq!(found, vec![(0x40, 0x10), (0x80, 0x11)]);
        assert_eq!(r16(&c, 0x42), 0x0002, "PCIe v2 endpoint");
        assert_eq!(r32(&c, 0x44), 0x1000_8001, "DEVCAP: FLR, RBER, MPS 256");
        assert_eq!(r16(&c, 0x48), 0x2810, "DEVCTL power-on: RO, no-snoop, MRRS 512");
        assert_eq!(r16(&c, 0x82), 15, "MSI-X table size N-1, disabled, unmasked");
        assert_eq!(r32(&c, 0x84), 0x0000_0004, "table in BAR4 at 0");
        assert_eq!(r32(&c, 0x88), 0x0000_0804, "PBA in BAR4 at 0x800");
        assert_eq!(r32(&c, 0x100), 0, "no extended capabilities");
    }

    #[test]
    fn msix_control_takes_only_enable_and_function_mask() {
        let mut c = ConfigSpace::new(&layout());
        w16(&mut c, 0x82, 0xffff);
        assert_eq!(r16(&c, 0x82), 0xc00f);
        assert_eq!(c.msix_control(), 0xc00f);
    }

    #[test]
    fn pcie_device_control_and_status_follow_their_masks() {
        let mut c = ConfigSpace::new(&layout());
        w16(&mut c, 0x48, 0xffff);
        assert_eq!(r16(&c, 0x48), 0x78ff, "FLR reads 0, phantom/ext-tag/aux-pm not implemented");
        c.raise_status(PCIE_CAP_OFFSET + PCI_EXP_DEVSTA, PCI_EXP_DEVSTA_URD | PCI_EXP_DEVSTA_CED);
        w16(&mut c, 0x4a, PCI_EXP_DEVSTA_URD);
        assert_eq!(r16(&c, 0x4a), PCI_EXP_DEVSTA_CED);
    }

    #[test]
    fn bad_width_and_out_of_range_are_errors() {
        let mut c = ConfigSpace::new(&layout());
        assert_eq!(c.read(0, &mut [0; 3]), Err(ConfigError::BadWidth { len: 3 }));
        assert_eq!(c.write(0, &[0; 8]), Err(ConfigError::BadWidth { len: 8 }));
        assert_eq!(c.read(0xffe, &mut [0; 4]), Err(ConfigError::OutOfRange { offset: 0xffe, len: 4 }));
        assert_eq!(c.write(u64::MAX, &[0]), Err(ConfigError::OutOfRange { offset: u64::MAX, len: 1 }));
        assert!(c.read(0xffc, &mut [0; 4]).is_ok());
    }

    #[test]
    fn function_without_msix_ends_the_chain_at_pcie() {
        let mut l = layout();
        l.msix = None;
        let c = ConfigSpace::new(&l);
        assert_eq!(c.get_u8(PCIE_CAP_OFFSET + 1), 0);
        assert_eq!(c.msix_control(), 0);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn random_writes_never_panic_and_keep_read_only_fields(
                writes in proptest::collection::vec((0u64..4200, prop_oneof![Just(1usize), Just(2), Just(4), 0usize..9], any::<u32>()), 1..200)
            ) {
                let mut c = ConfigSpace::new(&layout());
                let fixed: Vec<(u64, u32)> = [0x00u64, 0x08, 0x2c, 0x34, 0x40, 0x44, 0x4c, 0x84, 0x88]
                    .iter().map(|&o| (o, r32(&c, o))).collect();
                for (off, len, val) in writes {
                    let bytes = val.to_le_bytes();
                    let data: Vec<u8> = bytes.iter().copied().cycle().take(len).collect();
                    let _ = c.write(off, &data);
                    let mut rb = vec![0; len];
                    let _ = c.read(off, &mut rb);
                }
                for (off, v) in fixed {
                    prop_assert_eq!(r32(&c, off), v);
                }
                prop_assert_eq!(r16(&c, 0x80), 0x0011);
                prop_assert!(r16(&c, 0x06) & PCI_STATUS_CAP_LIST != 0);
                prop_assert_eq!(r16(&c, 0x82) & PCI_MSIX_FLAGS_QSIZE, 15);
                prop_assert_eq!(r16(&c, 0x48) & PCI_EXP_DEVCTL_BCR_FLR, 0);
            }
        }
    }
}
