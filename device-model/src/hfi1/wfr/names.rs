//! The kernel's name of any BAR0 offset of the chip, with the array index or context when it has one
//! (`SEND_DMA_CTRL[engine 0]`, `RCV_TID_FLOW_TABLE[ctxt 2][3]`), for dumps and access traces.

#![forbid(unsafe_code)]

use super::csr::{self, *};
use super::{TXE_NUM_CONTEXTS, TXE_NUM_SDMA_ENGINES, TXE_PIO_SEND, WFR_BAR0_SIZE};
use crate::hfi1::regs::RXE_NUM_CONTEXTS;
use crate::hfi1::regs::{self, *};

/// RXE registers outside the per-context blocks.
const RXE_NAMES: &[(u64, &str)] = &[
    (RCV_CTRL, "RCV_CTRL"),
    (RCV_STATUS, "RCV_STATUS"),
    (RCV_CONTEXTS, "RCV_CONTEXTS"),
    (RCV_ARRAY_CNT, "RCV_ARRAY_CNT"),
    (RCV_BTH_QP, "RCV_BTH_QP"),
    (RCV_MULTICAST, "RCV_MULTICAST"),
    (RCV_BYPASS, "RCV_BYPASS"),
    (RCV_VL15, "RCV_VL15"),
    (RCV_ERR_INFO, "RCV_ERR_INFO"),
    (RCV_ERR_STATUS, "RCV_ERR_STATUS"),
    (RCV_ERR_MASK, "RCV_ERR_MASK"),
    (RCV_ERR_CLEAR, "RCV_ERR_CLEAR"),
];

/// Arrays of 8-byte registers: base, elements, name.
const ARRAYS: &[(u64, u64, &str)] = &[
    (CCE_SCRATCH, 4, "CCE_SCRATCH"),
    (CCE_COUNTER_ARRAY32, 3, "CCE_COUNTER_ARRAY32"),
    (CCE_INT_MAP, 96, "CCE_INT_MAP"),
    (CCE_INT_STATUS, 12, "CCE_INT_STATUS"),
    (CCE_INT_MASK, 12, "CCE_INT_MASK"),
    (CCE_INT_CLEAR, 12, "CCE_INT_CLEAR"),
    (CCE_INT_FORCE, 12, "CCE_INT_FORCE"),
    (CCE_INT_BLOCKED, 12, "CCE_INT_BLOCKED"),
    (CCE_INT_COUNTER_ARRAY32, 6, "CCE_INT_COUNTER_ARRAY32"),
    (ASIC_CFG_SCRATCH, 4, "ASIC_CFG_SCRATCH"),
    // Per-VL port counters: VLs 0-7 then VL15 at index 8 (port_access_u64_csr adds 8 * vl index).
    (DCC_PRF_PORT_VL_RCV_DATA_CNT, 9, "DCC_PRF_PORT_VL_RCV_DATA_CNT"),
    (DCC_PRF_PORT_VL_RCV_PKTS_CNT, 9, "DCC_PRF_PORT_VL_RCV_PKTS_CNT"),
    (DCC_PRF_PORT_VL_RCV_FECN_CNT, 9, "DCC_PRF_PORT_VL_RCV_FECN_CNT"),
    (DCC_PRF_PORT_VL_RCV_BECN_CNT, 9, "DCC_PRF_PORT_VL_RCV_BECN_CNT"),
    (DCC_PRF_PORT_VL_RCV_BUBBLE_CNT, 9, "DCC_PRF_PORT_VL_RCV_BUBBLE_CNT"),
    (DCC_PRF_PORT_VL_MARK_FECN_CNT, 9, "DCC_PRF_PORT_VL_MARK_FECN_CNT"),
    (MISC_CFG_RSA_R2, 32, "MISC_CFG_RSA_R2"),
    (MISC_CFG_RSA_SIGNATURE, 32, "MISC_CFG_RSA_SIGNATURE"),
    (MISC_CFG_RSA_MODULUS, 32, "MISC_CFG_RSA_MODULUS"),
    (RCV_QP_MAP_TABLE, 32, "RCV_QP_MAP_TABLE"),
    (RCV_PARTITION_KEY, 4, "RCV_PARTITION_KEY"),
    (RCV_COUNTER_ARRAY32, 32, "RCV_COUNTER_ARRAY32"),
    (RCV_COUNTER_ARRAY64, 32, "RCV_COUNTER_ARRAY64"),
    (RCV_RSM_CFG, 4, "RCV_RSM_CFG"),
    (RCV_RSM_SELECT, 4, "RCV_RSM_SELECT"),
    (RCV_RSM_MATCH, 4, "RCV_RSM_MATCH"),
    (RCV_RSM_MAP_TABLE, 32, "RCV_RSM_MAP_TABLE"),
    (SEND_LOW_PRIORITY_LIST, 16, "SEND_LOW_PRIORITY_LIST"),
    (SEND_HIGH_PRIORITY_LIST, 16, "SEND_HIGH_PRIORITY_LIST"),
    (SEND_CONTEXT_SET_CTRL, 20, "SEND_CONTEXT_SET_CTRL"),
    (SEND_COUNTER_ARRAY32, 32, "SEND_COUNTER_ARRAY32"),
    (SEND_COUNTER_ARRAY64, 32, "SEND_COUNTER_ARRAY64"),
    (SEND_CM_CREDIT_VL, 15, "SEND_CM_CREDIT_VL"),
    (SEND_EGRESS_CTXT_STATUS, TXE_NUM_CONTEXTS as u64, "SEND_EGRESS_CTXT_STATUS"),
    (SEND_EGRESS_SEND_DMA_STATUS, TXE_NUM_SDMA_ENGINES as u64, "SEND_EGRESS_SEND_DMA_STATUS"),
];

/// Per-context blocks: first offset, stride, elements, what the index is.
const FAMILIES: &[(u64, u64, u64, &str)] = &[
    (RXE_KCTXT_BASE, KCTXT_STRIDE, RXE_NUM_CONTEXTS as u64, "ctxt"),
    (RXE_UCTXT_BASE, UCTXT_STRIDE, RXE_NUM_CONTEXTS as u64, "ctxt"),
    (SEND_CTXT_CTRL, 0x100, TXE_NUM_CONTEXTS as u64, "ctxt"),
    (SEND_DMA_CTRL, 0x100, TXE_NUM_SDMA_ENGINES as u64, "engine"),
];

/// The name lists by offset, the first list's name where two name one offset (CSR list, then RXE, then the
/// per-context registers): built once, so naming an access (every access the log records) is a binary
/// search rather than a walk over every name.
fn exact(offset: u64) -> Option<&'static str> {
    static SORTED: std::sync::OnceLock<Vec<(u64, &'static str)>> = std::sync::OnceLock::new();
    let sorted = SORTED.get_or_init(|| {
        let mut v: Vec<(u64, &'static str)> = all_exact().collect();
        // Stable: among equal offsets the list order stays, and dedup keeps the first.
        v.sort_by_key(|&(o, _)| o);
        v.dedup_by_key(|e| e.0);
        v
    });
    sorted.binary_search_by_key(&offset, |&(o, _)| o).ok().and_then(|i| sorted.get(i)).map(|&(_, n)| n)
}

/// What an offset is, before formatting.
enum Named {
    Exact(&'static str),
    Indexed(&'static str, &'static str, u64),
    Flow(u64, u64),
    Pio(bool, u64),
}

fn classify(offset: u64) -> Option<Named> {
    if offset >= WFR_BAR0_SIZE {
        return None;
    }
    if offset >= TXE_PIO_SEND {
        // One 64 KiB window per hardware send context (pio.c), the SOP copies in the upper half.
        let rel = offset - TXE_PIO_SEND;
        return Some(Named::Pio(rel >= 0x100_0000, (rel % 0x100_0000) >> 16));
    }
    let own = exact(offset);
    if (RCV_ARRAY..RXE_UCTXT_BASE).contains(&offset) {
        return Some(Named::Indexed("RCV_ARRAY", "", (offset - RCV_ARRAY) / RCV_ARRAY_ENTRY_SIZE));
    }
    let msix = CCE_MSIX_TABLE_LOWER;
    if (msix..msix + 16 * u64::from(super::CCE_NUM_MSIX_VECTORS)).contains(&offset) {
        let part = if offset.is_multiple_of(16) { "CCE_MSIX_TABLE_LOWER" } else { "CCE_MSIX_TABLE_UPPER" };
        return Some(Named::Indexed(part, "", (offset - msix) / 16));
    }
    // Elements of arrays and per-context families carry their index, the first one too
    // (SEND_DMA_STATUS[engine 0]); a register of its own inside such a range keeps its own name.
    if let Some(&(base, _, n)) = ARRAYS.iter().find(|&&(b, c, _)| (b..b + 8 * c).contains(&offset)) {
        if own.is_none_or(|o| o == n) {
            return Some(Named::Indexed(n, "", (offset - base) / 8));
        }
    }
    for &(first, stride, count, what) in FAMILIES {
        if !(first..first + stride * count).contains(&offset) {
            continue;
        }
        let (index, member) = ((offset - first) / stride, first + (offset - first) % stride);
        if let Some(n) = exact(member).filter(|n| own.is_none_or(|o| o == *n)) {
            return Some(Named::Indexed(n, what, index));
        }
        let flows = RCV_TID_FLOW_TABLE;
        if first == RXE_UCTXT_BASE && (flows..flows + 8 * crate::hfi1::regs::RXE_NUM_TID_FLOWS as u64).contains(&member)
        {
            return Some(Named::Flow(index, (member - flows) / 8));
        }
    }
    own.map(Named::Exact)
}

/// The name of `offset`, or `None` where the chip has no register the driver knows.
pub fn name(offset: u64) -> Option<String> {
    Some(match classify(offset)? {
        Named::Exact(n) => n.to_string(),
        Named::Indexed(n, "", i) => format!("{n}[{i}]"),
        Named::Indexed(n, what, i) => format!("{n}[{what} {i}]"),
        Named::Flow(c, f) => format!("RCV_TID_FLOW_TABLE[ctxt {c}][{f}]"),
        Named::Pio(sop, c) => format!("PIO_SEND{}[ctxt {c}]", if sop { "_SOP" } else { "" }),
    })
}

/// Whether [`name`] knows `offset`, without formatting the name.
pub fn is_named(offset: u64) -> bool {
    classify(offset).is_some()
}

/// Every register with a name of its own: (offset, name).
fn all_exact() -> impl Iterator<Item = (u64, &'static str)> {
    let ctxt = regs::KCTXT_REGS.iter().chain(regs::UCTXT_REGS.iter()).map(|d| (d.offset, d.name));
    csr::NAMES.iter().copied().chain(RXE_NAMES.iter().copied()).chain(ctxt)
}

/// The offset of the register the kernel calls `name`, as [`name`] prints it (`SEND_DMA_STATUS[engine 0]`,
/// `RCV_TID_FLOW_TABLE[ctxt 2][3]`, `CCE_INT_MASK[3]`, `RCV_CTRL`).
pub fn offset_of(name: &str) -> Option<u64> {
    let name = name.trim();
    let (base, rest) = name.split_once('[').unwrap_or((name, ""));
    let mut idx = Vec::new();
    for part in rest.split('[').filter(|p| !p.is_empty()) {
        let inner = part.strip_suffix(']')?;
        let (what, n) = inner.rsplit_once(' ').unwrap_or(("", inner));
        idx.push((what, n.parse::<u64>().ok()?));
    }
    let by_name = |n: &str| all_exact().find(|&(_, x)| x == n).map(|(o, _)| o);
    let off = match (base, idx.as_slice()) {
        (b, []) => by_name(b)?,
        ("RCV_ARRAY", [("", i)]) => RCV_ARRAY + RCV_ARRAY_ENTRY_SIZE * i,
        ("RCV_TID_FLOW_TABLE", [("ctxt", c), ("", f)]) if *f < crate::hfi1::regs::RXE_NUM_TID_FLOWS as u64 => {
            RCV_TID_FLOW_TABLE + UCTXT_STRIDE * c + 8 * f
        }
        ("PIO_SEND", [("ctxt", c)]) => TXE_PIO_SEND + (c << 16),
        ("PIO_SEND_SOP", [("ctxt", c)]) => TXE_PIO_SEND + 0x100_0000 + (c << 16),
        ("CCE_MSIX_TABLE_LOWER", [("", v)]) => CCE_MSIX_TABLE_LOWER + 16 * v,
        ("CCE_MSIX_TABLE_UPPER", [("", v)]) => CCE_MSIX_TABLE_LOWER + 16 * v + 8,
        (b, [("", i)]) => {
            let &(start, count, _) = ARRAYS.iter().find(|(_, _, n)| *n == b)?;
            (*i < count).then_some(start + 8 * i)?
        }
        (b, [(what, i)]) => {
            let reg = by_name(b)?;
            let &(_, stride, count, _) =
                FAMILIES.iter().find(|&&(first, stride, _, w)| w == *what && (first..first + stride).contains(&reg))?;
            (*i < count).then_some(reg + stride * i)?
        }
        _ => return None,
    };
    // Only a name that reads back as given is the register's.
    (self::name(off).as_deref() == Some(name)).then_some(off)
}
