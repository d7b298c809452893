//! The one naming path of the hfi1 engine, for both personalities: each BAR0 offset by the kernel's name
//! (`wfr::names`, the project's loopback block by its own), the block it belongs to, and the decoded fields
//! of the registers whose fields a driver developer reads (flows, RcvArray entries, context control, SDMA
//! status).

#![forbid(unsafe_code)]

use super::config::Personality;
use super::datapath::loopback::{
    LB_BASE, LB_DB_DONE, LB_DB_DROPPED, LB_DB_SUBMITTED, LB_DESC_ADDR, LB_DESC_DONE, LB_DESC_ERR, LB_DOORBELL,
    LB_LAST_RESULT, LB_SIZE,
};
use super::regs::*;
use super::rxe::rcv::RxResult;
use super::rxe::rcvarray::{judge, Judgement};
use super::wfr::csr::{ASIC, DC_TOP_CSRS, MISC, SEND_DMA_STATUS};
use super::wfr::{
    self, names as chip_names, SEND_DMA_STATUS_ENG_CLEANED_UP_SMASK, SEND_DMA_STATUS_ENG_HALTED_SMASK, TXE_PIO_SEND,
};
use crate::trace::{flag_names, Block, RegisterName};
use emu_abi::hfi1::LB_LAST_RESULT_CODE_MASK;

const LB_NAMES: &[(u64, &str)] = &[
    (LB_DESC_ADDR, "LB_DESC_ADDR"),
    (LB_DOORBELL, "LB_DOORBELL"),
    (LB_DB_DONE, "LB_DB_DONE"),
    (LB_DB_SUBMITTED, "LB_DB_SUBMITTED"),
    (LB_DESC_DONE, "LB_DESC_DONE"),
    (LB_DESC_ERR, "LB_DESC_ERR"),
    (LB_LAST_RESULT, "LB_LAST_RESULT"),
    (LB_DB_DROPPED, "LB_DB_DROPPED"),
];

/// Per-engine SDMA CSRs are 0x100 apart.
const SEND_DMA_STRIDE: u64 = 0x100;

/// The block of a BAR0 offset of the chip's map.
fn block_of(offset: u64) -> Block {
    match offset {
        o if (RCV_ARRAY..RXE_UCTXT_BASE).contains(&o) => Block::RcvArray,
        o if (RXE_UCTXT_BASE..TXE).contains(&o) && (o - RXE_UCTXT_BASE) % UCTXT_STRIDE >= 0x800 => Block::Flow,
        o if (RXE..TXE).contains(&o) => Block::Rxe,
        o if (LB_BASE..LB_BASE + LB_SIZE).contains(&o) => Block::Loopback,
        o if o >= TXE_PIO_SEND => Block::Pio,
        o if o >= TXE => Block::Txe,
        o if o >= DC_TOP_CSRS => Block::Dc,
        o if o >= MISC => Block::Misc,
        o if o >= ASIC => Block::Asic,
        _ => Block::Cce,
    }
}

/// The register at `offset` on `personality`, decoded when `value` is given.
pub fn describe(personality: &Personality, offset: u64, value: Option<u64>) -> RegisterName {
    let name = match personality {
        Personality::Emu if (LB_BASE..LB_BASE + LB_SIZE).contains(&offset) => {
            LB_NAMES.iter().find(|(o, _)| LB_BASE + o == offset).map(|(_, n)| (*n).to_string())
        }
        Personality::Emu if !(RXE..TXE).contains(&offset) => None,
        _ => chip_names::name(offset),
    };
    let block = if name.is_some() { block_of(offset) } else { Block::Other };
    let fields = match (&name, value) {
        (Some(_), Some(v)) => decode(offset, v),
        _ => String::new(),
    };
    RegisterName { block, name, fields }
}

/// Whether [`describe`] names `offset`, without formatting anything.
pub fn is_named(personality: &Personality, offset: u64) -> bool {
    match personality {
        Personality::Emu if (LB_BASE..LB_BASE + LB_SIZE).contains(&offset) => {
            LB_NAMES.iter().any(|(o, _)| LB_BASE + o == offset)
        }
        Personality::Emu if !(RXE..TXE).contains(&offset) => false,
        _ => chip_names::is_named(offset),
    }
}

/// The offset of a register by the kernel's (or the loopback block's) name.
pub fn offset_of(personality: &Personality, name: &str) -> Option<u64> {
    if let Some((o, _)) = LB_NAMES.iter().find(|(_, n)| *n == name) {
        return matches!(personality, Personality::Emu).then_some(LB_BASE + o);
    }
    let off = chip_names::offset_of(name)?;
    match personality {
        Personality::Emu if !(RXE..TXE).contains(&off) => None,
        _ => Some(off),
    }
}

fn hex(name: &str, v: u64) -> String {
    format!("{name}={v:#x}")
}

/// The fields of the registers that have them, as `name=0x..` and flag names.
fn decode(offset: u64, v: u64) -> String {
    let mut out: Vec<String> = Vec::new();
    let in_family = |base: u64, stride: u64, count: u64| {
        offset.checked_sub(base).is_some_and(|r| r % stride == 0 && r / stride < count)
    };
    let ctxts = super::regs::RXE_NUM_CONTEXTS as u64;
    if (RCV_ARRAY..RXE_UCTXT_BASE).contains(&offset) {
        match judge(v) {
            Judgement::Ignored => out.push("no WRITE_ENABLE".into()),
            Judgement::Invalidate => out.push("WRITE_ENABLE invalid".into()),
            Judgement::Program(e) => {
                out.push(format!("WRITE_ENABLE buf_size={}K addr={:#x}", e.buf_size.bytes() >> 10, e.iova()))
            }
            Judgement::BadSize(c) => out.push(format!("WRITE_ENABLE reserved_buf_size={c:#x}")),
        }
        if v & RCV_ARRAY_RT_WRITE_ENABLE_SMASK == 0 && v != 0 {
            // A read: the effective entry, without the write strobe.
            out = vec![format!(
                "buf_size_code={:#x} addr={:#x}",
                (v >> RCV_ARRAY_RT_BUF_SIZE_SHIFT) & RCV_ARRAY_RT_BUF_SIZE_MASK,
                (v & RCV_ARRAY_RT_ADDR_MASK) << RT_ADDR_SHIFT
            )];
        }
    } else if block_of(offset) == Block::Flow {
        let e = super::FlowEntry::decode(v);
        out.push(hex("gen", u64::from(e.generation)));
        out.push(hex("seq", u64::from(e.sequence)));
        out.extend(flag_names(
            v,
            &[
                (RCV_TID_FLOW_TABLE_CTRL_FLOW_VALID_SMASK, "FLOW_VALID"),
                (RCV_TID_FLOW_TABLE_CTRL_HDR_SUPP_EN_SMASK, "HDR_SUPP_EN"),
                (RCV_TID_FLOW_TABLE_CTRL_KEEP_AFTER_SEQ_ERR_SMASK, "KEEP_AFTER_SEQ_ERR"),
                (RCV_TID_FLOW_TABLE_CTRL_KEEP_ON_GEN_ERR_SMASK, "KEEP_ON_GEN_ERR"),
                (RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK, "SEQ_MISMATCH"),
                (RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK, "GEN_MISMATCH"),
            ],
        ));
    } else if in_family(RCV_CTXT_CTRL, KCTXT_STRIDE, ctxts) {
        out.extend(flag_names(
            v,
            &[
                (RCV_CTXT_CTRL_ENABLE_SMASK, "ENABLE"),
                (RCV_CTXT_CTRL_ONE_PACKET_PER_EGR_BUFFER_SMASK, "ONE_PACKET_PER_EGR_BUFFER"),
                (RCV_CTXT_CTRL_DONT_DROP_EGR_FULL_SMASK, "DONT_DROP_EGR_FULL"),
                (RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK, "DONT_DROP_RHQ_FULL"),
                (RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK, "TID_FLOW_ENABLE"),
                (RCV_CTXT_CTRL_INTR_AVAIL_SMASK, "INTR_AVAIL"),
                (RCV_CTXT_CTRL_TAIL_UPD_SMASK, "TAIL_UPD"),
            ],
        ));
    } else if in_family(RCV_TID_CTRL, KCTXT_STRIDE, ctxts) {
        let base = (v >> RCV_TID_CTRL_TID_BASE_INDEX_SHIFT) & RCV_TID_CTRL_TID_BASE_INDEX_MASK;
        let pairs = (v >> RCV_TID_CTRL_TID_PAIR_CNT_SHIFT) & RCV_TID_CTRL_TID_PAIR_CNT_MASK;
        out.push(format!("tid_base={} tid_count={}", base << RCV_SHIFT, pairs << RCV_SHIFT));
    } else if in_family(SEND_DMA_STATUS, SEND_DMA_STRIDE, u64::from(wfr::TXE_NUM_SDMA_ENGINES)) {
        out.extend(flag_names(
            v,
            &[
                (SEND_DMA_STATUS_ENG_HALTED_SMASK, "ENG_HALTED"),
                (SEND_DMA_STATUS_ENG_CLEANED_UP_SMASK, "ENG_CLEANED_UP"),
            ],
        ));
    } else if offset == LB_BASE + LB_LAST_RESULT {
        let code = (v & LB_LAST_RESULT_CODE_MASK) as u8;
        let result = RxResult::from_code(code);
        out.push(result.map_or_else(|| format!("result={code}"), |r| format!("result={}", r.name())));
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hfi1::config::HFI1_BAR0_SIZE;
    use crate::hfi1::datapath::loopback::LB_DOORBELL;
    use crate::hfi1::regs::{kctxt_csr, RCV_ARRAY, RCV_ARRAY_CNT, RCV_CTXT_CTRL, RCV_TID_FLOW_TABLE};

    #[test]
    fn is_named_agrees_with_describe_on_both_personalities() {
        let offsets = [
            0,             // CCE_REVISION: named on the chip personality only
            RCV_ARRAY_CNT, // an RXE CSR
            kctxt_csr(RCV_CTXT_CTRL, 3),
            RCV_TID_FLOW_TABLE + 8,
            RCV_ARRAY,             // the RcvArray's first entry
            RXE + 0x10_0000,       // inside the RXE, between families
            LB_BASE + LB_DOORBELL, // the project's loopback block
            LB_BASE + 0x40,        // past its registers
            0x70_0000,             // a gap of the chip's register map
            HFI1_BAR0_SIZE - 8,
        ];
        for personality in [Personality::Emu, Personality::Wfr(Default::default())] {
            for offset in offsets {
                assert_eq!(
                    is_named(&personality, offset),
                    describe(&personality, offset, None).name.is_some(),
                    "{personality:?} at {offset:#x}"
                );
            }
        }
    }
}
