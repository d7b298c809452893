//! The chip personality's registers that no block models: kept as written, so that the driver reads back
//! what it wrote and a FLR restores their reset values, but only at offsets the kernel's register list
//! names ([`super::names`]). A write anywhere else has no register to land in, on the chip as here: it is
//! counted and dropped, and the offset reads as its reset value. A guest that writes every offset of BAR0
//! so grows this to the named set at most, not to millions of entries.

#![forbid(unsafe_code)]

use std::collections::HashMap;

use super::names;

#[derive(Debug, Default)]
pub struct Storage {
    /// Named offset to the value last written; absent offsets hold their reset value.
    values: HashMap<u64, u64>,
    /// Writes to offsets no register list names, since reset.
    dropped: u64,
}

impl Storage {
    /// The value written at `offset`, if any.
    pub fn get(&self, offset: u64) -> Option<u64> {
        self.values.get(&offset).copied()
    }

    /// Keeps `value` at `offset` if the kernel names a register there; otherwise counts the write and drops
    /// it. Returns whether it was kept.
    pub fn write(&mut self, offset: u64, value: u64) -> bool {
        if !names::is_named(offset) {
            self.dropped += 1;
            return false;
        }
        self.values.insert(offset, value);
        true
    }

    /// Every kept (offset, value), in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.values.iter().map(|(&o, &v)| (o, v))
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Writes dropped since reset.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Bytes the map holds at most for its entries now (keys, values and the table's control bytes).
    pub fn footprint(&self) -> usize {
        self.values.capacity() * (std::mem::size_of::<(u64, u64)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vfio_user_proto::device::{region, Device, DeviceContext};
    use vfio_user_proto::dma::HeapMemory;
    use vfio_user_proto::irq::IrqState;

    use super::super::csr::{CCE_SCRATCH, SEND_CTRL};
    use super::super::TXE_PIO_SEND;
    use super::*;
    use crate::hfi1::config::Hfi1Config;
    use crate::hfi1::device::Hfi1;
    use crate::pci::{Function, PciIds};

    /// Named registers below the PIO send buffers: how many entries the storage can ever hold.
    fn named_below_pio() -> usize {
        (0..TXE_PIO_SEND).step_by(8).filter(|&o| names::is_named(o)).count()
    }

    #[test]
    fn a_named_register_keeps_its_value_and_an_unnamed_offset_drops_the_write_and_counts_it() {
        // (offset, kept): registers from the kernel's list, and gaps of the chip's map.
        let table = [(CCE_SCRATCH, true), (SEND_CTRL, true), (0x70_0000, false), (TXE_PIO_SEND - 8, false)];
        let mut s = Storage::default();
        for (i, (offset, kept)) in table.into_iter().enumerate() {
            assert_eq!(names::is_named(offset), kept, "{offset:#x}: the table follows the register list");
            assert_eq!(s.write(offset, 0x5a00 + i as u64), kept, "{offset:#x}");
            assert_eq!(s.get(offset), kept.then_some(0x5a00 + i as u64), "{offset:#x}");
        }
        assert_eq!((s.len(), s.dropped()), (2, 2));
    }

    #[test]
    fn a_hostile_guest_writing_every_csr_below_32_mib_through_the_function_leaves_memory_bounded() {
        let engine = Arc::new(Hfi1::new(Hfi1Config::wfr().inline()).unwrap());
        let f = Function::try_new(engine.clone(), PciIds::hfi1_wfr_default()).unwrap();
        f.attach(DeviceContext { dma: Arc::new(HeapMemory::new()), irq: Arc::new(IrqState::new()) });
        // Memory decoding on, as pci_enable_device leaves it.
        f.region_write(region::CONFIG, 0x04, &0x0006u16.to_le_bytes()).unwrap();
        let mut refused = 0u64;
        for offset in (0..TXE_PIO_SEND).step_by(8) {
            // The MSI-X table and PBA inside BAR0 are the function's; every other offset reaches the chip.
            if f.region_write(region::BAR0, offset, &(!offset).to_le_bytes()).is_err() {
                refused += 1;
            }
        }
        assert_eq!(refused, 0, "every 8-byte write below the PIO buffers is a valid access");
        let dump = engine.as_ref().dump();
        let entries = dump["wfr"]["storage_entries"].as_u64().unwrap();
        let bytes = dump["wfr"]["storage_bytes"].as_u64().unwrap();
        let dropped = dump["wfr"]["storage_dropped"].as_u64().unwrap();
        // The bound comes from the kernel's register list: at most every named register below the PIO buffers
        // (142,837 of them, most modelled by a block and never stored), in a table at most twice their number
        // (about 4.6 MB). Before, each of the 4 Mi offsets took an entry (over 100 MB). This run: 9,545 entries
        // in 238 KiB.
        let bound = named_below_pio() as u64;
        eprintln!("the register file after writes to every offset: {entries} entries, {bytes} bytes, {dropped} writes dropped");
        assert!(entries <= bound, "{entries} stored registers, more than the {bound} named");
        let table = (bound * 8 / 7).next_power_of_two() * (std::mem::size_of::<(u64, u64)>() as u64 + 1);
        assert!(bytes <= table, "the register file takes {bytes} bytes, more than a table of every named one");
        assert!(dropped > 0, "writes to offsets the register list does not name were dropped");
        f.detach();
    }
}
