//! The chip personality as a PCI function, the way a VMM and the Linux hfi1 driver see it: config space,
//! BAR0 layout, MSI-X inside BAR0, interrupts from register writes, FLR, and the RXE shared with the emulated
//! receive engine.

#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex};

use vfio_user_proto::device::{irq, region, region_flags, Device, DeviceContext, IrqTrigger};
use vfio_user_proto::dma::HeapMemory;

use super::config::Hfi1Config;
use super::device::Hfi1;
use super::regs::*;
use super::wfr::csr::*;
use super::wfr::{TXE_PIO_SEND, WFR_BAR0_SIZE};
use crate::pci::{Function, PciIds};

#[derive(Default)]
struct Irqs(Mutex<Vec<u32>>);
impl IrqTrigger for Irqs {
    fn trigger(&self, index: u32, vector: u32) {
        assert_eq!(index, irq::MSIX);
        self.0.lock().unwrap().push(vector);
    }
}

fn function() -> (Arc<Function>, Arc<Irqs>) {
    let engine = Arc::new(Hfi1::new(Hfi1Config::wfr().inline()).unwrap());
    let f = Function::try_new(engine, PciIds::hfi1_wfr_default()).expect("the chip's layout is valid");
    let irqs = Arc::new(Irqs::default());
    f.attach(DeviceContext { dma: Arc::new(HeapMemory::new()), irq: irqs.clone() });
    (f, irqs)
}

fn cfg_r(f: &Function, off: u64, len: usize) -> u32 {
    let mut b = [0u8; 4];
    f.region_read(region::CONFIG, off, &mut b[..len]).unwrap();
    u32::from_le_bytes(b)
}
fn cfg_w(f: &Function, off: u64, bytes: &[u8]) {
    f.region_write(region::CONFIG, off, bytes).unwrap();
}
fn bar_r(f: &Function, off: u64) -> u64 {
    let mut b = [0u8; 8];
    f.region_read(region::BAR0, off, &mut b).unwrap();
    u64::from_le_bytes(b)
}
fn bar_w(f: &Function, off: u64, v: u64) {
    f.region_write(region::BAR0, off, &v.to_le_bytes()).unwrap();
}
/// pci_enable_device + pci_set_master, then MSI-X enabled as pci_alloc_irq_vectors leaves it.
fn enable(f: &Function) {
    cfg_w(f, 0x04, &0x0006u16.to_le_bytes());
    cfg_w(f, 0xB2, &0x8000u16.to_le_bytes());
}

#[test]
fn identity_is_the_discrete_hfi() {
    let (f, _) = function();
    assert_eq!(cfg_r(&f, 0x00, 4), 0x24f0_8086, "PCI_DEVICE_ID_INTEL0 of the hfi1 driver");
    assert_eq!(cfg_r(&f, 0x08, 4) >> 8, 0x02_08_00, "fabric controller");
}

#[test]
fn config_space_has_the_chips_capabilities() {
    let (f, _) = function();
    // Capability chain 0x34 -> PCIe at 0x70 -> MSI-X at 0xB0 (the dword hfi1 saves as PCI_CFG_MSIX0).
    assert_eq!(cfg_r(&f, 0x34, 1), 0x70);
    assert_eq!(cfg_r(&f, 0x70, 2), 0xB010);
    assert_eq!(cfg_r(&f, 0xB0, 2), 0x0011);
    // Link Capabilities: 8 GT/s (pcie_speeds wants PCI_EXP_LNKCAP_SLS_8_0GB), x16.
    assert_eq!(cfg_r(&f, 0x70 + 0x0c, 4) & 0x3ff, 0x3 | (16 << 4));
    assert_ne!(cfg_r(&f, 0x70 + 0x04, 4) & (1 << 28), 0, "FLR capable: init_chip does pcie_flr");
    // MSI-X: 256 vectors (CCE_NUM_MSIX_VECTORS), table at BAR0 0x100000, PBA at BAR0 0x110000.
    assert_eq!(cfg_r(&f, 0xB2, 2) & 0x7ff, 255);
    assert_eq!(cfg_r(&f, 0xB4, 4), 0x10_0000);
    assert_eq!(cfg_r(&f, 0xB8, 4), 0x11_0000);
    // aspm_init read-modify-writes PCIE_CFG_REG_PL3 (0x70C); no extended capability chain.
    cfg_w(&f, 0x70C, &0x2000_0000u32.to_le_bytes());
    assert_eq!(cfg_r(&f, 0x70C, 4), 0x2000_0000);
    assert_eq!(cfg_r(&f, 0x100, 4), 0);
}

#[test]
fn bar0_is_64_mib_and_traps_every_rcv_array_store() {
    let (f, _) = function();
    let info = f.region_info(region::BAR0).unwrap();
    assert_eq!(info.size, WFR_BAR0_SIZE);
    assert_eq!(WFR_BAR0_SIZE, TXE_PIO_SEND + 0x200_0000, "hfi1_pcie_ddinit: TXE_PIO_SEND + TXE_PIO_SIZE");
    assert_eq!(info.flags & region_flags::MMAP, 0, "no sparse mmap: rcv_array_wc_fill needs every store seen");
    // No BAR but BAR0 (and its upper half).
    for i in 2..=region::BAR5 {
        assert_eq!(f.region_info(i).unwrap().size, 0, "BAR{i}");
    }
}

#[test]
fn a_wc_fill_over_an_entry_in_use_leaves_it_programmed() {
    // program_rcvarray: an entry is programmed (hfi1_put_tid: WRITE_ENABLE | order << 36 | pfn), and a later
    // TID_UPDATE into the same group writes 0 over it (rcv_array_wc_fill), which the chip ignores.
    let (f, _) = function();
    enable(&f);
    let entry = RCV_ARRAY + 8 * 0x150;
    let value = (1u64 << 63) | (2 << 36) | 0x12345;
    bar_w(&f, entry, value);
    bar_w(&f, entry, 0);
    // An entry reads back without the write-only WRITE_ENABLE bit.
    assert_eq!(bar_r(&f, entry), value & !(1 << 63));
}

#[test]
fn msix_table_in_bar0_is_the_functions_not_the_engines() {
    let (f, _) = function();
    enable(&f);
    // reset_cce_csrs writes CCE_MSIX_TABLE_UPPER[i] = CCE_MSIX_TABLE_UPPER_RESETCSR (vector masked).
    bar_w(&f, CCE_MSIX_TABLE_UPPER + 16 * 3, 0x0000_0001_0000_0000);
    assert_eq!(bar_r(&f, CCE_MSIX_TABLE_UPPER + 16 * 3), 0x0000_0001_0000_0000);
    bar_w(&f, CCE_MSIX_TABLE_LOWER + 16 * 3, 0xfee0_0000);
    assert_eq!(bar_r(&f, CCE_MSIX_TABLE_LOWER + 16 * 3), 0xfee0_0000);
    // The PBA window is read-only; the CCE registers right after it are the chip's.
    assert_eq!(bar_r(&f, 0x11_0000), 0);
    bar_w(&f, CCE_INT_MASK, 0x5);
    assert_eq!(bar_r(&f, CCE_INT_MASK), 0x5);
}

#[test]
fn sdma_halt_interrupt_arrives_on_the_vector_cce_int_map_gives() {
    let (f, irqs) = function();
    enable(&f);
    // Source 16 (SDMAENG_ERR engine 0) mapped to vector 2, unmasked.
    bar_w(&f, CCE_INT_MAP + 8 * 2, 2);
    bar_w(&f, CCE_INT_MASK, 1 << 16);
    bar_w(&f, SEND_DMA_CTRL, 0x2);
    assert_eq!(*irqs.0.lock().unwrap(), vec![2]);
}

#[test]
fn flr_returns_the_register_file_to_reset_values() {
    let (f, _) = function();
    enable(&f);
    bar_w(&f, SEND_CTXT_CHECK_ENABLE + 0x100 * 2, 0xff);
    bar_w(&f, ASIC_CFG_MUTEX, 1);
    bar_w(&f, CCE_INT_MASK + 8, 0xf0);
    bar_w(&f, kctxt_csr(RCV_TID_CTRL, 1), 0x0000_0008_0000_0010);
    // pcie_flr: Initiate Function Level Reset in Device Control of the PCIe capability at 0x70.
    cfg_w(&f, 0x70 + 0x08 + 1, &[0x80]);
    enable(&f);
    let table = [
        (SEND_CTXT_CHECK_ENABLE + 0x100 * 2, 0),
        (ASIC_CFG_MUTEX, 0),
        (CCE_INT_MASK + 8, 0),
        (kctxt_csr(RCV_TID_CTRL, 1), 0),
        (SEND_CM_CTRL, 0x20),
        (RCV_CONTEXTS, 16),
        (RCV_ARRAY_CNT, 4096),
    ];
    for (offset, want) in table {
        assert_eq!(bar_r(&f, offset), want, "{offset:#x}");
    }
    assert_eq!(bar_r(&f, CCE_REVISION) & 0xF0, 0x10, "still a B0 part");
}

#[test]
fn rxe_registers_the_model_does_not_name_are_storage_on_the_chip() {
    let (f, _) = function();
    enable(&f);
    // init_rxe read-modify-writes RCV_BYPASS; hfi1_get_qp_map reads RCV_QP_MAP_TABLE back.
    bar_w(&f, RCV_BYPASS, 0x1234);
    assert_eq!(bar_r(&f, RCV_BYPASS), 0x1234);
    bar_w(&f, RCV_QP_MAP_TABLE + 8 * 3, 0x0101_0101);
    assert_eq!(bar_r(&f, RCV_QP_MAP_TABLE + 8 * 3), 0x0101_0101);
    // The RXE model still owns what it models.
    assert_eq!(bar_r(&f, RCV_CONTEXTS), 16);
    bar_w(&f, kctxt_csr(RCV_CTXT_CTRL, 2), u64::MAX);
    assert_eq!(bar_r(&f, kctxt_csr(RCV_CTXT_CTRL, 2)), 0x77F);
}

#[test]
fn trapped_accesses_are_logged_by_name() {
    let (f, _) = function();
    enable(&f);
    bar_w(&f, SEND_CTRL, 0x1);
    bar_r(&f, SEND_DMA_STATUS + 0x100);
    let dump = f.accesses(None);
    let recent = dump["recent"].as_array().unwrap();
    let last: Vec<(&str, &str)> =
        recent.iter().rev().take(2).map(|a| (a["op"].as_str().unwrap(), a["csr"].as_str().unwrap())).collect();
    assert_eq!(last, [("R", "SEND_DMA_STATUS[engine 1]"), ("W", "SEND_CTRL")]);
    assert_eq!((dump["reads"].as_u64(), dump["writes"].as_u64()), (Some(1), Some(1)));
}
