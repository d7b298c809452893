//! PCI / PCI Express configuration-space registers used by the function (names from linux/pci_regs.h).

#![forbid(unsafe_code)]

/// Size of PCI Express configuration space.
pub const PCI_CFG_SPACE_EXP_SIZE: usize = 4096;
/// End of the legacy (type 0 header + capabilities) part; extended capabilities start here.
pub const PCI_CFG_SPACE_SIZE: usize = 256;

pub const PCI_VENDOR_ID: usize = 0x00;
pub const PCI_DEVICE_ID: usize = 0x02;
pub const PCI_COMMAND: usize = 0x04;
pub const PCI_STATUS: usize = 0x06;
pub const PCI_CLASS_REVISION: usize = 0x08;
/// Programming interface byte; sub-class at +1, base class at +2.
pub const PCI_CLASS_PROG: usize = 0x09;
pub const PCI_CACHE_LINE_SIZE: usize = 0x0c;
pub const PCI_HEADER_TYPE: usize = 0x0e;
pub const PCI_BASE_ADDRESS_0: usize = 0x10;
pub const PCI_SUBSYSTEM_VENDOR_ID: usize = 0x2c;
pub const PCI_SUBSYSTEM_ID: usize = 0x2e;
pub const PCI_ROM_ADDRESS: usize = 0x30;
pub const PCI_CAPABILITY_LIST: usize = 0x34;
pub const PCI_INTERRUPT_LINE: usize = 0x3c;
pub const PCI_INTERRUPT_PIN: usize = 0x3d;

/// Number of BAR slots in a type 0 header.
pub const PCI_NUM_BARS: usize = 6;

// PCI_COMMAND bits.
pub const PCI_COMMAND_IO: u16 = 0x0001;
pub const PCI_COMMAND_MEMORY: u16 = 0x0002;
pub const PCI_COMMAND_MASTER: u16 = 0x0004;
pub const PCI_COMMAND_PARITY: u16 = 0x0040;
pub const PCI_COMMAND_SERR: u16 = 0x0100;
pub const PCI_COMMAND_INTX_DISABLE: u16 = 0x0400;

// PCI_STATUS bits.
pub const PCI_STATUS_INTERRUPT: u16 = 0x0008;
pub const PCI_STATUS_CAP_LIST: u16 = 0x0010;
pub const PCI_STATUS_PARITY: u16 = 0x0100;
pub const PCI_STATUS_SIG_TARGET_ABORT: u16 = 0x0800;
pub const PCI_STATUS_REC_TARGET_ABORT: u16 = 0x1000;
pub const PCI_STATUS_REC_MASTER_ABORT: u16 = 0x2000;
pub const PCI_STATUS_SIG_SYSTEM_ERROR: u16 = 0x4000;
pub const PCI_STATUS_DETECTED_PARITY: u16 = 0x8000;
/// The error bits of PCI_STATUS, all write-1-to-clear.
pub const PCI_STATUS_ERROR_BITS: u16 = PCI_STATUS_PARITY
    | PCI_STATUS_SIG_TARGET_ABORT
    | PCI_STATUS_REC_TARGET_ABORT
    | PCI_STATUS_REC_MASTER_ABORT
    | PCI_STATUS_SIG_SYSTEM_ERROR
    | PCI_STATUS_DETECTED_PARITY;

pub const PCI_HEADER_TYPE_NORMAL: u8 = 0;

// BAR low bits.
pub const PCI_BASE_ADDRESS_SPACE_MEMORY: u32 = 0x0;
pub const PCI_BASE_ADDRESS_MEM_TYPE_32: u32 = 0x0;
pub const PCI_BASE_ADDRESS_MEM_TYPE_64: u32 = 0x4;
pub const PCI_BASE_ADDRESS_MEM_PREFETCH: u32 = 0x8;
/// Address bits of a memory BAR (the low four bits are flags).
pub const PCI_BASE_ADDRESS_MEM_MASK: u32 = !0xf;

// Capability list.
pub const PCI_CAP_LIST_ID: usize = 0;
pub const PCI_CAP_LIST_NEXT: usize = 1;
pub const PCI_CAP_ID_EXP: u8 = 0x10;
pub const PCI_CAP_ID_MSIX: u8 = 0x11;

// PCI Express capability (offsets inside the capability).
pub const PCI_EXP_FLAGS: usize = 0x02;
pub const PCI_EXP_FLAGS_VERS_2: u16 = 0x0002;
/// Device/Port type field value for a PCI Express endpoint (bits 7:4).
pub const PCI_EXP_TYPE_ENDPOINT: u16 = 0x0 << 4;
pub const PCI_EXP_DEVCAP: usize = 0x04;
/// Max_Payload_Size Supported, encoding 1 = 256 bytes.
pub const PCI_EXP_DEVCAP_PAYLOAD_256B: u32 = 0x1;
pub const PCI_EXP_DEVCAP_RBER: u32 = 0x0000_8000;
pub const PCI_EXP_DEVCAP_FLR: u32 = 0x1000_0000;
pub const PCI_EXP_DEVCTL: usize = 0x08;
pub const PCI_EXP_DEVCTL_CERE: u16 = 0x0001;
pub const PCI_EXP_DEVCTL_NFERE: u16 = 0x0002;
pub const PCI_EXP_DEVCTL_FERE: u16 = 0x0004;
pub const PCI_EXP_DEVCTL_URRE: u16 = 0x0008;
pub const PCI_EXP_DEVCTL_RELAX_EN: u16 = 0x0010;
pub const PCI_EXP_DEVCTL_PAYLOAD: u16 = 0x00e0;
pub const PCI_EXP_DEVCTL_NOSNOOP_EN: u16 = 0x0800;
pub const PCI_EXP_DEVCTL_READRQ: u16 = 0x7000;
/// Max_Read_Request_Size power-on value 010b = 512 bytes.
pub const PCI_EXP_DEVCTL_READRQ_512B: u16 = 0x2000;
/// Initiate Function Level Reset: write 1 to reset, always reads 0.
pub const PCI_EXP_DEVCTL_BCR_FLR: u16 = 0x8000;
pub const PCI_EXP_DEVSTA: usize = 0x0a;
pub const PCI_EXP_DEVSTA_CED: u16 = 0x0001;
pub const PCI_EXP_DEVSTA_NFED: u16 = 0x0002;
pub const PCI_EXP_DEVSTA_FED: u16 = 0x0004;
pub const PCI_EXP_DEVSTA_URD: u16 = 0x0008;
pub const PCI_EXP_LNKCAP: usize = 0x0c;
/// Max Link Speed (bits 3:0): 1 = 2.5 GT/s, 2 = 5 GT/s, 3 = 8 GT/s.
pub const PCI_EXP_LNKCAP_SLS: u32 = 0x0000_000f;
pub const PCI_EXP_LNKCAP_SLS_2_5GB: u32 = 0x1;
pub const PCI_EXP_LNKCAP_SLS_8_0GB: u32 = 0x3;
/// Max Link Width (bits 9:4).
pub const PCI_EXP_LNKCAP_MLW_SHIFT: u32 = 4;
pub const PCI_EXP_LNKCTL: usize = 0x10;
pub const PCI_EXP_LNKCTL_ASPMC: u16 = 0x0003;
pub const PCI_EXP_LNKCTL_RCB: u16 = 0x0008;
pub const PCI_EXP_LNKCTL_CCC: u16 = 0x0040;
pub const PCI_EXP_LNKCTL_ES: u16 = 0x0080;
pub const PCI_EXP_LNKSTA: usize = 0x12;
pub const PCI_EXP_LNKCAP2: usize = 0x2c;
pub const PCI_EXP_LNKCTL2: usize = 0x30;
/// Length of a version 2 endpoint PCI Express capability (through Slot Status 2).
pub const PCI_CAP_EXP_ENDPOINT_SIZEOF_V2: usize = 0x3c;

// MSI-X capability (offsets inside the capability).
pub const PCI_MSIX_FLAGS: usize = 0x02;
/// Table Size field: number of vectors minus one.
pub const PCI_MSIX_FLAGS_QSIZE: u16 = 0x07ff;
pub const PCI_MSIX_FLAGS_MASKALL: u16 = 0x4000;
pub const PCI_MSIX_FLAGS_ENABLE: u16 = 0x8000;
pub const PCI_MSIX_TABLE: usize = 0x04;
pub const PCI_MSIX_PBA: usize = 0x08;
/// BAR indicator bits of the Table and PBA offset registers.
pub const PCI_MSIX_TABLE_BIR: u32 = 0x7;
pub const PCI_MSIX_TABLE_OFFSET: u32 = !0x7;
pub const PCI_CAP_MSIX_SIZEOF: usize = 12;
/// Most vectors the 11-bit Table Size field can describe.
pub const PCI_MSIX_MAX_VECTORS: u16 = 2048;

// MSI-X table entry (linux/pci_regs.h PCI_MSIX_ENTRY_*).
pub const PCI_MSIX_ENTRY_SIZE: usize = 16;
pub const PCI_MSIX_ENTRY_LOWER_ADDR: usize = 0x0;
pub const PCI_MSIX_ENTRY_UPPER_ADDR: usize = 0x4;
pub const PCI_MSIX_ENTRY_DATA: usize = 0x8;
pub const PCI_MSIX_ENTRY_VECTOR_CTRL: usize = 0xc;
pub const PCI_MSIX_ENTRY_CTRL_MASKBIT: u32 = 0x1;
