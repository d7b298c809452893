//! MADs: the attributes hfi1's SMA and PMA handle (mad.c), and the layout of the MADs that carry them.

/// Management base and class versions (include/rdma/ib_mad.h:19-22).
pub const IB_MGMT_BASE_VERSION: u8 = 1;
pub const OPA_MGMT_BASE_VERSION: u8 = 0x80;
pub const OPA_SM_CLASS_VERSION: u8 = 0x80;
/// IB classes answer only class version 1 (mad.c process_subn 4583, process_perf 4643).
pub const IB_CLASS_VERSION: u8 = 1;
/// Management classes (ib_mad.h:25-28).
pub const IB_MGMT_CLASS_SUBN_LID_ROUTED: u8 = 0x01;
pub const IB_MGMT_CLASS_SUBN_DIRECTED_ROUTE: u8 = 0x81;
pub const IB_MGMT_CLASS_PERF_MGMT: u8 = 0x04;
/// A class no agent on a CA registers for (ib_mad.h:29: Baseboard management).
pub const IB_MGMT_CLASS_BM: u8 = 0x05;
/// Methods (ib_mad.h:43-50).
pub const IB_MGMT_METHOD_GET: u8 = 0x01;
pub const IB_MGMT_METHOD_SET: u8 = 0x02;
pub const IB_MGMT_METHOD_GET_RESP: u8 = 0x81;
pub const IB_MGMT_METHOD_TRAP: u8 = 0x05;
pub const IB_MGMT_METHOD_REPORT: u8 = 0x06;
pub const IB_MGMT_METHOD_TRAP_REPRESS: u8 = 0x07;
/// The GSI's Q_Key (ib_mad.h:97).
pub const IB_QP1_QKEY: u32 = 0x8001_0000;
/// The management P_Keys (common.h:237-238): SMPs need the full one (ud.c opa_smp_check 780).
pub const FULL_MGMT_P_KEY: u16 = 0xFFFF;
pub const LIM_MGMT_P_KEY: u16 = 0x7FFF;
/// The status word's direction bit: a response (IB_SMP_DIRECTION, ib_smi.h:39).
pub const IB_SMP_DIRECTION: u16 = 0x8000;

/// Sizes: the common MAD header (IB_MGMT_MAD_HDR) and whole MADs (IB_MGMT_MAD_SIZE, OPA_MGMT_MAD_SIZE:
/// ib_mad.h:121-134). hfi1_ud_rcv drops a MAD above 2048 bytes (ud.c:899, 908).
pub const IB_MGMT_MAD_HDR: usize = 24;
pub const IB_MGMT_MAD_SIZE: usize = 256;
pub const OPA_MGMT_MAD_SIZE: usize = 2048;

/// Offsets in the common header (struct ib_mad_hdr, ib_mad.h:137-147; struct opa_smp, opa_smi.h:22-47).
pub mod hdr {
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: usize = 4;
    /// SMPs: hop pointer and hop count in place of class_specific.
    pub const HOP_PTR: usize = 6;
    pub const HOP_CNT: usize = 7;
    pub const TID: usize = 8;
    pub const ATTR_ID: usize = 16;
    pub const ATTR_MOD: usize = 20;
    /// SMPs: the M_Key.
    pub const MKEY: usize = 24;
}

/// Where an SMP's fields behind the M_Key are, by flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmpLayout {
    /// DR SLID and DLID, and their width.
    pub dr_slid: usize,
    pub dr_dlid: usize,
    pub dr_lid_bytes: usize,
    pub initial_path: usize,
    pub return_path: usize,
    /// The attribute data.
    pub data: usize,
    pub size: usize,
}

/// struct opa_smp route.lid (opa_smi.h:36-38): data right behind the M_Key.
pub const OPA_SMP_LID: SmpLayout = SmpLayout {
    dr_slid: 32,
    dr_dlid: 36,
    dr_lid_bytes: 4,
    initial_path: 40,
    return_path: 104,
    data: 32,
    size: OPA_MGMT_MAD_SIZE,
};
/// struct opa_smp route.dr (opa_smi.h:39-46): dr_slid, dr_dlid, 64-hop paths, 8 reserved, then data.
pub const OPA_SMP_DR: SmpLayout = SmpLayout { data: 176, ..OPA_SMP_LID };
/// struct ib_smp (ib_smi.h:18-37): 16-bit DR LIDs, 28 reserved, 64 bytes of data, then the paths.
pub const IB_SMP: SmpLayout = SmpLayout {
    dr_slid: 32,
    dr_dlid: 34,
    dr_lid_bytes: 2,
    initial_path: 128,
    return_path: 192,
    data: 64,
    size: IB_MGMT_MAD_SIZE,
};
/// struct opa_pma_mad (mad.c:2275-2278): data right behind the common header.
pub const OPA_PMA_DATA: usize = IB_MGMT_MAD_HDR;
/// struct ib_pma_mad (ib_pma.h:28-32): 40 reserved bytes before the data.
pub const IB_PMA_DATA: usize = 64;

/// How an attribute reads its attribute modifier (mad.c; OPA_AM_* in mad.h:316-364).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Am {
    /// Must be 0 (e.g. __subn_get_opa_nodedesc 546, sl_to_sc 1794).
    Zero,
    /// OPA_AM_NPORT = 1 in bits 31:24 (portinfo 767, psi 2006, bct 2148, led_info 4003, sc_to_vlnt 1949).
    NPort,
    /// OPA_AM_NBLK blocks from OPA_AM_START_BLK (pkeytable 984-985 with an 11-bit start, sc_to_vlt 1885,
    /// cc_table 3893-3894).
    NBlk,
    /// NPORT = 1 and the section in bits 23:16 (vl_arb 2197-2198).
    VlArbSection,
    /// OPA_AM_CI_ADDR (bits 30:19) and OPA_AM_CI_LEN - 1 (bits 18:13) (cable_info 2097-2098).
    CableInfo,
    /// The segment count in bits 7:0, 1..=117 (subn_get_opa_aggregate 4220-4225).
    Aggregate,
    /// PMA requests: NPORT = 1 in bits 31:24 (pma_get_opa_portstatus 2692, datacounters 2955).
    PmaNPort,
}

pub const OPA_AM_NPORT_SHIFT: u32 = 24;
pub const OPA_AM_NBLK_SHIFT: u32 = 24;
pub const OPA_AM_VLARB_SECTION_SHIFT: u32 = 16;
pub const OPA_AM_CI_ADDR_SHIFT: u32 = 19;
pub const OPA_AM_CI_ADDR_MASK: u32 = 0xFFF;
pub const OPA_AM_CI_LEN_SHIFT: u32 = 13;
pub const OPA_AM_CI_LEN_MASK: u32 = 0x3F;
/// Aggregate: at most this many segments (mad.c 4222).
pub const OPA_AGGREGATE_MAX: u32 = 117;
/// VL arbitration sections: low, high, preempt table, preempt matrix (OPA_VLARB_*_ELEMENTS, mad.c 2207-2219).
pub const OPA_VLARB_SECTIONS: u32 = 4;
/// P_Key table start blocks: OPA_AM_START_BLK is 11 bits for the P_Key table (mad.c 985).
pub const PKEY_START_BLOCK_MASK: u32 = 0x7FF;
/// CableInfo's QSFP memory: 128-byte pages (mad.c __CI_PAGE_SIZE 2107).
pub const CABLE_INFO_PAGE: u32 = 128;

impl Am {
    /// The modifier a well-formed request carries; `n` varies the free part (block, section, address,
    /// segment count).
    pub fn value(self, n: u8) -> u32 {
        let n = u32::from(n);
        match self {
            Am::Zero => 0,
            Am::NPort | Am::PmaNPort => 1 << OPA_AM_NPORT_SHIFT,
            Am::NBlk => (1 << OPA_AM_NBLK_SHIFT) | (n & 0x7),
            Am::VlArbSection => (1 << OPA_AM_NPORT_SHIFT) | ((n % OPA_VLARB_SECTIONS) << OPA_AM_VLARB_SECTION_SHIFT),
            Am::CableInfo => {
                let addr = (n * CABLE_INFO_PAGE / 2) & OPA_AM_CI_ADDR_MASK;
                let len = (CABLE_INFO_PAGE / 2 - 1) & OPA_AM_CI_LEN_MASK;
                (addr << OPA_AM_CI_ADDR_SHIFT) | (len << OPA_AM_CI_LEN_SHIFT)
            }
            Am::Aggregate => 1 + n % OPA_AGGREGATE_MAX,
        }
    }

    /// The modifier with its count field (NPORT, NBLK, segments) replaced by `count`.
    pub fn with_count(self, base: u32, count: u8) -> u32 {
        let count = u32::from(count);
        match self {
            Am::Zero => count,
            Am::NPort | Am::PmaNPort | Am::NBlk | Am::VlArbSection => {
                (base & !(0xFF << OPA_AM_NPORT_SHIFT)) | (count << OPA_AM_NPORT_SHIFT)
            }
            Am::CableInfo => {
                (base & !(OPA_AM_CI_LEN_MASK << OPA_AM_CI_LEN_SHIFT))
                    | ((count & OPA_AM_CI_LEN_MASK) << OPA_AM_CI_LEN_SHIFT)
            }
            Am::Aggregate => (base & !0xFF) | count,
        }
    }
}

/// An attribute a MAD class's agent dispatches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// The kernel's name of its ID.
    pub name: &'static str,
    pub id: u16,
    pub mgmt_class: u8,
    pub base_version: u8,
    pub class_version: u8,
    /// Whether the agent has a Set for it (a Get is always tried).
    pub set: bool,
    pub am: Am,
}

const fn opa_sma(name: &'static str, id: u16, set: bool, am: Am) -> Attr {
    Attr {
        name,
        id,
        mgmt_class: IB_MGMT_CLASS_SUBN_LID_ROUTED,
        base_version: OPA_MGMT_BASE_VERSION,
        class_version: OPA_SM_CLASS_VERSION,
        set,
        am,
    }
}
const fn ib_sma(name: &'static str, id: u16) -> Attr {
    Attr {
        name,
        id,
        mgmt_class: IB_MGMT_CLASS_SUBN_LID_ROUTED,
        base_version: IB_MGMT_BASE_VERSION,
        class_version: IB_CLASS_VERSION,
        set: false,
        am: Am::Zero,
    }
}
const fn opa_pma(name: &'static str, id: u16, set: bool) -> Attr {
    Attr {
        name,
        id,
        mgmt_class: IB_MGMT_CLASS_PERF_MGMT,
        base_version: OPA_MGMT_BASE_VERSION,
        class_version: OPA_SM_CLASS_VERSION,
        set,
        am: Am::PmaNPort,
    }
}
const fn ib_gsi(name: &'static str, mgmt_class: u8, id: u16) -> Attr {
    Attr {
        name,
        id,
        mgmt_class,
        base_version: IB_MGMT_BASE_VERSION,
        class_version: IB_CLASS_VERSION,
        set: false,
        am: Am::Zero,
    }
}

/// Attribute IDs: ib_smi.h:42-56, opa_smi.h:53-69, opa_compat.h:16-26, ib_pma.h:21-25.
pub mod id {
    pub const IB_SMP_ATTR_NOTICE: u16 = 0x0002;
    pub const IB_SMP_ATTR_NODE_DESC: u16 = 0x0010;
    pub const IB_SMP_ATTR_NODE_INFO: u16 = 0x0011;
    pub const IB_SMP_ATTR_GUID_INFO: u16 = 0x0014;
    pub const IB_SMP_ATTR_PORT_INFO: u16 = 0x0015;
    pub const IB_SMP_ATTR_PKEY_TABLE: u16 = 0x0016;
    pub const IB_SMP_ATTR_SL_TO_VL_TABLE: u16 = 0x0017;
    pub const IB_SMP_ATTR_VL_ARB_TABLE: u16 = 0x0018;
    pub const IB_SMP_ATTR_SM_INFO: u16 = 0x0020;
    pub const IB_SMP_ATTR_LED_INFO: u16 = 0x0031;
    pub const OPA_ATTRIB_ID_SL_TO_SC_MAP: u16 = 0x0017;
    pub const OPA_ATTRIB_ID_CABLE_INFO: u16 = 0x0032;
    pub const OPA_ATTRIB_ID_AGGREGATE: u16 = 0x0080;
    pub const OPA_ATTRIB_ID_SC_TO_SL_MAP: u16 = 0x0082;
    pub const OPA_ATTRIB_ID_SC_TO_VLR_MAP: u16 = 0x0083;
    pub const OPA_ATTRIB_ID_SC_TO_VLT_MAP: u16 = 0x0084;
    pub const OPA_ATTRIB_ID_SC_TO_VLNT_MAP: u16 = 0x0085;
    pub const OPA_ATTRIB_ID_PORT_STATE_INFO: u16 = 0x0087;
    pub const OPA_ATTRIB_ID_BUFFER_CONTROL_TABLE: u16 = 0x008A;
    pub const OPA_ATTRIB_ID_CONGESTION_INFO: u16 = 0x008B;
    pub const OPA_ATTRIB_ID_HFI_CONGESTION_LOG: u16 = 0x008F;
    pub const OPA_ATTRIB_ID_HFI_CONGESTION_SETTING: u16 = 0x0090;
    pub const OPA_ATTRIB_ID_CONGESTION_CONTROL_TABLE: u16 = 0x0091;
    pub const IB_PMA_CLASS_PORT_INFO: u16 = 0x0001;
    pub const IB_PMA_PORT_COUNTERS: u16 = 0x0012;
    pub const IB_PMA_PORT_COUNTERS_EXT: u16 = 0x001D;
    pub const OPA_PM_ATTRIB_ID_PORT_STATUS: u16 = 0x0040;
    pub const OPA_PM_ATTRIB_ID_CLEAR_PORT_STATUS: u16 = 0x0041;
    pub const OPA_PM_ATTRIB_ID_DATA_PORT_COUNTERS: u16 = 0x0042;
    pub const OPA_PM_ATTRIB_ID_ERROR_PORT_COUNTERS: u16 = 0x0043;
    pub const OPA_PM_ATTRIB_ID_ERROR_INFO: u16 = 0x0044;
}
use id::*;

/// Every case of subn_get_opa_sma / subn_set_opa_sma (mad.c:4049-4203), the Aggregate of process_subn_opa
/// (4530, 4543), and two IDs that take the default (unsupported) branch.
pub const OPA_SMA: &[Attr] = &[
    opa_sma("NODE_DESC", IB_SMP_ATTR_NODE_DESC, false, Am::Zero),
    opa_sma("NODE_INFO", IB_SMP_ATTR_NODE_INFO, false, Am::Zero),
    opa_sma("PORT_INFO", IB_SMP_ATTR_PORT_INFO, true, Am::NPort),
    opa_sma("PKEY_TABLE", IB_SMP_ATTR_PKEY_TABLE, true, Am::NBlk),
    opa_sma("SL_TO_SC_MAP", OPA_ATTRIB_ID_SL_TO_SC_MAP, true, Am::Zero),
    opa_sma("SC_TO_SL_MAP", OPA_ATTRIB_ID_SC_TO_SL_MAP, true, Am::Zero),
    opa_sma("SC_TO_VLT_MAP", OPA_ATTRIB_ID_SC_TO_VLT_MAP, true, Am::NBlk),
    opa_sma("SC_TO_VLNT_MAP", OPA_ATTRIB_ID_SC_TO_VLNT_MAP, true, Am::NPort),
    opa_sma("PORT_STATE_INFO", OPA_ATTRIB_ID_PORT_STATE_INFO, true, Am::NPort),
    opa_sma("BUFFER_CONTROL_TABLE", OPA_ATTRIB_ID_BUFFER_CONTROL_TABLE, true, Am::NPort),
    opa_sma("CABLE_INFO", OPA_ATTRIB_ID_CABLE_INFO, false, Am::CableInfo),
    opa_sma("VL_ARB_TABLE", IB_SMP_ATTR_VL_ARB_TABLE, true, Am::VlArbSection),
    opa_sma("CONGESTION_INFO", OPA_ATTRIB_ID_CONGESTION_INFO, false, Am::Zero),
    opa_sma("HFI_CONGESTION_SETTING", OPA_ATTRIB_ID_HFI_CONGESTION_SETTING, true, Am::Zero),
    opa_sma("HFI_CONGESTION_LOG", OPA_ATTRIB_ID_HFI_CONGESTION_LOG, false, Am::Zero),
    opa_sma("CONGESTION_CONTROL_TABLE", OPA_ATTRIB_ID_CONGESTION_CONTROL_TABLE, true, Am::NBlk),
    opa_sma("LED_INFO", IB_SMP_ATTR_LED_INFO, true, Am::NPort),
    opa_sma("SM_INFO", IB_SMP_ATTR_SM_INFO, true, Am::Zero),
    opa_sma("AGGREGATE", OPA_ATTRIB_ID_AGGREGATE, true, Am::Aggregate),
    opa_sma("SC_TO_VLR_MAP", OPA_ATTRIB_ID_SC_TO_VLR_MAP, false, Am::Zero),
    opa_sma("NOTICE", IB_SMP_ATTR_NOTICE, false, Am::Zero),
];

/// IB (base version 1) SMPs: process_subn answers a Get of NodeInfo (mad.c:4617-4625); the rest take its
/// unsupported branch.
pub const IB_SMA: &[Attr] = &[
    ib_sma("NODE_INFO", IB_SMP_ATTR_NODE_INFO),
    ib_sma("NODE_DESC", IB_SMP_ATTR_NODE_DESC),
    ib_sma("PORT_INFO", IB_SMP_ATTR_PORT_INFO),
    ib_sma("PKEY_TABLE", IB_SMP_ATTR_PKEY_TABLE),
    ib_sma("GUID_INFO", IB_SMP_ATTR_GUID_INFO),
    ib_sma("SL_TO_VL_TABLE", IB_SMP_ATTR_SL_TO_VL_TABLE),
    ib_sma("VL_ARB_TABLE", IB_SMP_ATTR_VL_ARB_TABLE),
    ib_sma("SM_INFO", IB_SMP_ATTR_SM_INFO),
];

/// GSI MADs on QP1: every case of process_perf_opa (mad.c:4712-4755), IB process_perf's (4650-4674), and a
/// class no agent takes.
pub const GSI: &[Attr] = &[
    opa_pma("CLASS_PORT_INFO", IB_PMA_CLASS_PORT_INFO, false),
    opa_pma("PORT_STATUS", OPA_PM_ATTRIB_ID_PORT_STATUS, false),
    opa_pma("CLEAR_PORT_STATUS", OPA_PM_ATTRIB_ID_CLEAR_PORT_STATUS, true),
    opa_pma("DATA_PORT_COUNTERS", OPA_PM_ATTRIB_ID_DATA_PORT_COUNTERS, false),
    opa_pma("ERROR_PORT_COUNTERS", OPA_PM_ATTRIB_ID_ERROR_PORT_COUNTERS, false),
    opa_pma("ERROR_INFO", OPA_PM_ATTRIB_ID_ERROR_INFO, true),
    ib_gsi("IB_PMA_PORT_COUNTERS", IB_MGMT_CLASS_PERF_MGMT, IB_PMA_PORT_COUNTERS),
    ib_gsi("IB_PMA_PORT_COUNTERS_EXT", IB_MGMT_CLASS_PERF_MGMT, IB_PMA_PORT_COUNTERS_EXT),
    ib_gsi("IB_PMA_CLASS_PORT_INFO", IB_MGMT_CLASS_PERF_MGMT, IB_PMA_CLASS_PORT_INFO),
    ib_gsi("BM_CLASS_PORT_INFO", IB_MGMT_CLASS_BM, IB_PMA_CLASS_PORT_INFO),
];

/// Where an attribute's data starts in its MAD and how long the MAD is.
pub fn data_offset_and_size(attr: &Attr, directed: bool) -> (usize, usize) {
    match (attr.mgmt_class, attr.base_version) {
        (IB_MGMT_CLASS_SUBN_LID_ROUTED, OPA_MGMT_BASE_VERSION) if directed => (OPA_SMP_DR.data, OPA_SMP_DR.size),
        (IB_MGMT_CLASS_SUBN_LID_ROUTED, OPA_MGMT_BASE_VERSION) => (OPA_SMP_LID.data, OPA_SMP_LID.size),
        (IB_MGMT_CLASS_SUBN_LID_ROUTED, _) => (IB_SMP.data, IB_SMP.size),
        (_, OPA_MGMT_BASE_VERSION) => (OPA_PMA_DATA, OPA_MGMT_MAD_SIZE),
        _ => (IB_PMA_DATA, IB_MGMT_MAD_SIZE),
    }
}

/// The attribute's name in a table by class and ID, for descriptions.
pub fn name_of(base_version: u8, mgmt_class: u8, attr_id: u16) -> Option<&'static str> {
    let smp = matches!(mgmt_class, IB_MGMT_CLASS_SUBN_LID_ROUTED | IB_MGMT_CLASS_SUBN_DIRECTED_ROUTE);
    let table = match (smp, base_version) {
        (true, OPA_MGMT_BASE_VERSION) => OPA_SMA,
        (true, _) => IB_SMA,
        (false, _) => GSI,
    };
    table
        .iter()
        .find(|a| a.id == attr_id && a.base_version == base_version && (smp || a.mgmt_class == mgmt_class))
        .map(|a| a.name)
}
