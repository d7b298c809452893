//! The fuzzer's initial corpus: every template at least once with the dictionary's fields, and batches that
//! walk a message through its PSNs.

use super::frame::{
    at, encode, flag, method, Class, Record, BAD_LNH, KDETH_FOR_UNHANDLED, LEN_MTU, MAX_PACKETS_PER_EXEC, VARIANT_SHIFT,
};
use super::mad::{self, id, Attr};
use super::opcodes::{self, Opcode};
use crate::target::{QpType, Target, PSN_MASK};

/// Bytes of payload a seed carries when the opcode takes some.
const SEED_PAYLOAD: usize = 64;
/// DMA_LEN entries: the payload's length, one MTU, and a three-packet message.
const DMA_LEN_ONE_MTU: u8 = 1;
const DMA_LEN_THREE_MTUS: u8 = 3;
/// The PSN knob's "dictionary + 1" and raw variants.
const PSN_PLUS_ONE: u8 = 4 << VARIANT_SHIFT;
const PSN_RAW: u8 = 7 << VARIANT_SHIFT;
/// The kernel receive context a TID RDMA seed names (the first after the control context).
const SEED_CTXT: u8 = 1;
/// The first opcode of the user KDETH range (PSM2's; wire.rs USER_KDETH_OPCODES).
const USER_KDETH_OPCODE: u8 = 0xC0;

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| i as u8).collect()
}

/// A transport seed: payload as the opcode's role asks (whole MTUs for FIRST and MIDDLE packets).
fn transport(class: Class, i: usize, op: &Opcode) -> Record {
    let r = Record::new(class, i);
    let name = op.name;
    if !op.carries_payload() {
        let dma = if name.ends_with("READ_REQUEST") || name.ends_with("READ_REQ") { DMA_LEN_ONE_MTU } else { 0 };
        return r.len(0).knob(at::DMA_LEN, dma);
    }
    if name.ends_with("_FIRST") || name.ends_with("_MIDDLE") {
        return r.len(LEN_MTU).knob(at::DMA_LEN, DMA_LEN_THREE_MTUS);
    }
    r.payload(pattern(SEED_PAYLOAD))
}

/// A MAD seed's data: what a well-formed request of the attribute carries.
fn mad_data(t: &Target, attr: &Attr, method: u8) -> Vec<u8> {
    // PMA requests select the port by a bit in the last of four 64-bit port select masks, then a VL or
    // counter mask (mad.c:2374-2398: opa_clear_port_status, opa_port_data_counters_msg).
    const PORT_SELECT_LAST: usize = 24;
    const SELECT_MASK: usize = 32;
    const VL0: u32 = 1;
    let port_select = |mask: u32| {
        let mut d = vec![0u8; SELECT_MASK + 4];
        d[PORT_SELECT_LAST..SELECT_MASK].copy_from_slice(&(1u64 << t.port).to_be_bytes());
        d[SELECT_MASK..].copy_from_slice(&mask.to_be_bytes());
        d
    };
    match (attr.mgmt_class, attr.id) {
        // struct opa_port_status_req (mad.c:2280-2284): port number, 3 reserved, VL select mask.
        (mad::IB_MGMT_CLASS_PERF_MGMT, id::OPA_PM_ATTRIB_ID_PORT_STATUS)
            if attr.base_version == mad::OPA_MGMT_BASE_VERSION =>
        {
            let mut d = vec![t.port, 0, 0, 0];
            d.extend_from_slice(&VL0.to_be_bytes());
            d
        }
        (mad::IB_MGMT_CLASS_PERF_MGMT, id::OPA_PM_ATTRIB_ID_CLEAR_PORT_STATUS) => port_select(u32::MAX),
        // struct ib_pma_portcounters and _ext (ib_pma.h:67-70, 106-109): reserved, then the port, which
        // pma_get_ib_portcounters{,_ext} require (mad.c:3090, 3256).
        (mad::IB_MGMT_CLASS_PERF_MGMT, id::IB_PMA_PORT_COUNTERS | id::IB_PMA_PORT_COUNTERS_EXT) => vec![0, t.port],
        (mad::IB_MGMT_CLASS_PERF_MGMT, id::OPA_PM_ATTRIB_ID_DATA_PORT_COUNTERS)
        | (mad::IB_MGMT_CLASS_PERF_MGMT, id::OPA_PM_ATTRIB_ID_ERROR_PORT_COUNTERS) => port_select(VL0),
        (mad::IB_MGMT_CLASS_PERF_MGMT, id::OPA_PM_ATTRIB_ID_ERROR_INFO) => port_select(u32::MAX),
        // Aggregate: segments of (attr_id, request length in 8-byte units, attr_mod, data) (mad.c:2379-2384):
        // NodeInfo then PortInfo.
        (_, id::OPA_ATTRIB_ID_AGGREGATE) => {
            // Each segment must hold its attribute (smp_length_check): struct opa_node_info is 44 bytes
            // (opa_smi.h:76-90), struct opa_port_info 242 (opa_port_info.h:253-383), both packed.
            const NODE_INFO_UNITS: u16 = 6;
            const PORT_INFO_UNITS: u16 = 31;
            const MAP_UNITS: u16 = 4; // 32 one-byte entries
            let segments: Vec<(u16, u16, u32, Vec<u8>)> = if method == mad::IB_MGMT_METHOD_SET {
                vec![
                    (id::OPA_ATTRIB_ID_SL_TO_SC_MAP, MAP_UNITS, 0, identity_map()),
                    (id::OPA_ATTRIB_ID_SC_TO_SL_MAP, MAP_UNITS, 0, identity_map()),
                ]
            } else {
                vec![
                    (id::IB_SMP_ATTR_NODE_INFO, NODE_INFO_UNITS, 0, Vec::new()),
                    (id::IB_SMP_ATTR_PORT_INFO, PORT_INFO_UNITS, mad::Am::NPort.value(0), Vec::new()),
                ]
            };
            let mut d = Vec::new();
            for (attr_id, units, am, data) in segments {
                d.extend_from_slice(&attr_id.to_be_bytes());
                d.extend_from_slice(&units.to_be_bytes());
                d.extend_from_slice(&am.to_be_bytes());
                let end = d.len() + usize::from(units) * 8;
                d.extend_from_slice(&data);
                d.resize(end, 0);
            }
            d
        }
        // P_Key table block 0: the dictionary's P_Keys (set_pkeys ignores a table without the limited
        // management key, mad.c:1645-1653).
        (_, id::IB_SMP_ATTR_PKEY_TABLE) if method == mad::IB_MGMT_METHOD_SET => {
            t.pkeys.iter().flat_map(|k| k.to_be_bytes()).collect()
        }
        // The SL-to-SC and SC-to-SL maps hfi1 starts with: the identity (verbs.c:1547-1549).
        (_, id::OPA_ATTRIB_ID_SL_TO_SC_MAP) | (_, id::OPA_ATTRIB_ID_SC_TO_SL_MAP) => identity_map(),
        _ => Vec::new(),
    }
}

/// The identity map of the 32 SLs or SCs (OPA_MAX_SLS, opa_smi.h:17).
fn identity_map() -> Vec<u8> {
    const OPA_MAX_SLS: u8 = 32;
    (0..OPA_MAX_SLS).collect()
}

/// The Sets a seed carries: those whose data the dictionary or the driver's defaults give, so the first exec
/// leaves the fabric as it found it. PortInfo, BufferControlTable, VLArbitration and the SC-to-VL maps hold
/// state the dictionary cannot read back (a Set of zeros would take the link's VLs or credits away:
/// mad.c __subn_set_opa_portinfo, __subn_set_opa_bct); mutating METHOD reaches them.
pub const SEEDED_SETS: &[u16] = &[
    id::IB_SMP_ATTR_PKEY_TABLE,
    id::OPA_ATTRIB_ID_SL_TO_SC_MAP,
    id::OPA_ATTRIB_ID_SC_TO_SL_MAP,
    id::OPA_ATTRIB_ID_PORT_STATE_INFO,
    id::OPA_ATTRIB_ID_HFI_CONGESTION_SETTING,
    id::OPA_ATTRIB_ID_CONGESTION_CONTROL_TABLE,
    id::IB_SMP_ATTR_LED_INFO,
    id::IB_SMP_ATTR_SM_INFO,
    id::OPA_ATTRIB_ID_AGGREGATE,
    id::OPA_PM_ATTRIB_ID_CLEAR_PORT_STATUS,
    id::OPA_PM_ATTRIB_ID_ERROR_INFO,
];

fn mad_seed(t: &Target, class: Class, i: usize, attr: &Attr, set: bool, directed: bool) -> Record {
    let mut m = if set { method::SET } else { 0 };
    if directed {
        m |= method::DIRECTED;
    }
    let meth = if set { mad::IB_MGMT_METHOD_SET } else { mad::IB_MGMT_METHOD_GET };
    Record::new(class, i).knob(at::METHOD, m).payload(mad_data(t, attr, meth))
}

/// Seeds that decode to every template at least once, with the dictionary's fields, as one input each, and
/// a few batches.
pub fn seeds(t: &Target) -> Vec<Vec<u8>> {
    let mut one: Vec<Record> = Vec::new();
    for class in [Class::Rc, Class::Uc, Class::Ud, Class::TidRdma, Class::Cnp] {
        for (i, op) in class.opcodes().iter().enumerate() {
            let r = transport(class, i, op);
            one.push(if class == Class::TidRdma { r.knob(at::CTXT, SEED_CTXT) } else { r });
        }
    }
    // UD to each destination: the keeper's first UD QP, the GSI, the SMI; and once with a GRH.
    let uds = t.qps_of(QpType::Ud).count() as u8;
    for dest in [0, uds, uds + 1] {
        one.push(Record::new(Class::Ud, 0).knob(at::QP, dest).payload(pattern(SEED_PAYLOAD)));
    }
    one.push(Record::new(Class::Ud, 1).knob(at::FLAGS, flag::GRH).payload(pattern(SEED_PAYLOAD)));
    // A CNP on each transport's QPs.
    for kind in [QpType::Rc, QpType::Uc, QpType::Ud] {
        if let Some(i) = t.qps.iter().position(|q| q.kind == kind) {
            one.push(Record::new(Class::Cnp, 0).knob(at::QP, i as u8).knob(at::FLAGS, flag::BECN));
        }
    }
    // Every unhandled opcode is a template; seed one of each transport's range.
    let unhandled = opcodes::unhandled();
    for op in [0x15u8, 0x1C, 0x1D, 0x2C, 0x44, 0x60, 0x81, 0xC0, 0xE8, 0xFF] {
        if let Some(i) = unhandled.iter().position(|&u| u == op) {
            one.push(Record::new(Class::NoHandler, i).payload(pattern(SEED_PAYLOAD)));
        }
    }
    // A user (PSM) KDETH opcode on a kernel context's KDETH DestQP (the CTXT knob's upper half).
    if let Some(i) = unhandled.iter().position(|&u| u == USER_KDETH_OPCODE) {
        let kdeth_ctxt = (KDETH_FOR_UNHANDLED << VARIANT_SHIFT) | SEED_CTXT;
        one.push(Record::new(Class::NoHandler, i).knob(at::CTXT, kdeth_ctxt).payload(pattern(SEED_PAYLOAD)));
    }
    for (i, attr) in mad::OPA_SMA.iter().enumerate() {
        one.push(mad_seed(t, Class::OpaSmp, i, attr, false, false));
        one.push(mad_seed(t, Class::OpaSmp, i, attr, false, true));
        if attr.set && SEEDED_SETS.contains(&attr.id) {
            one.push(mad_seed(t, Class::OpaSmp, i, attr, true, false));
        }
    }
    for (i, attr) in mad::IB_SMA.iter().enumerate() {
        one.push(mad_seed(t, Class::IbSmp, i, attr, false, false));
    }
    one.push(mad_seed(t, Class::IbSmp, 0, &mad::IB_SMA[0], false, true));
    for (i, attr) in mad::GSI.iter().enumerate() {
        one.push(mad_seed(t, Class::Gsi, i, attr, false, false));
        if attr.set && SEEDED_SETS.contains(&attr.id) {
            one.push(mad_seed(t, Class::Gsi, i, attr, true, false));
        }
    }
    for (i, _) in BAD_LNH.iter().enumerate() {
        one.push(Record::new(Class::BadLnh, i).payload(pattern(SEED_PAYLOAD)));
    }
    let mut out: Vec<Vec<u8>> = one.iter().map(|r| encode(std::slice::from_ref(r))).collect();

    // A message through its PSNs on the first RC QP: SEND FIRST, MIDDLE, LAST; and an RDMA WRITE likewise.
    if let Some(qp) = t.qps_of(QpType::Rc).next() {
        let psn2 = (qp.psn + 2) & PSN_MASK;
        for (first, middle, last) in [
            ("RC_SEND_FIRST", "RC_SEND_MIDDLE", "RC_SEND_LAST"),
            ("RC_RDMA_WRITE_FIRST", "RC_RDMA_WRITE_MIDDLE", "RC_RDMA_WRITE_LAST"),
        ] {
            let i = |name: &str| opcodes::RC.iter().position(|o| o.name == name).unwrap_or(0);
            let batch = [
                transport(Class::Rc, i(first), &opcodes::RC[i(first)]),
                transport(Class::Rc, i(middle), &opcodes::RC[i(middle)]).knob(at::PSN, PSN_PLUS_ONE),
                Record::new(Class::Rc, i(last)).len(LEN_MTU).knob(at::PSN, PSN_RAW).raw32(psn2),
            ];
            out.push(encode(&batch));
        }
    }
    // One packet of every class in one batch, and a batch of the OPA SMA's Gets.
    let mixed: Vec<Record> = Class::ALL
        .iter()
        .filter_map(|&c| one.iter().find(|r| usize::from(r.knobs[at::CLASS]) == class_index(c)).cloned())
        .collect();
    out.push(encode(&mixed));
    let gets: Vec<Record> = (0..mad::OPA_SMA.len().min(MAX_PACKETS_PER_EXEC))
        .map(|i| mad_seed(t, Class::OpaSmp, i, &mad::OPA_SMA[i], false, false))
        .collect();
    out.push(encode(&gets));
    out
}

fn class_index(c: Class) -> usize {
    Class::ALL.iter().position(|&x| x == c).unwrap_or(0)
}
