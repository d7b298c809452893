//! The one naming path of the irdma engine: each BAR0 register by the name docs/irdma-device.md and the
//! kernel's icrdma register table give it, its block, and its decoded fields.

#![forbid(unsafe_code)]

use super::regs::*;
use crate::trace::{flag_names, Block, RegisterName};
use emu_abi::irdma::{LbKind, LbResult, LbStatus};

/// Name and block of a decoded register.
fn name_of(reg: Reg, offset: u64) -> (String, Block) {
    let s = |n: &str, b| (n.to_string(), b);
    match reg {
        Reg::CqpTail => s("CQPTAIL", Block::Cqp),
        Reg::CqpDb => s("CQPDB", Block::Cqp),
        Reg::CcqpStatus => s("CCQPSTATUS", Block::Cqp),
        Reg::CcqpHigh => s("CCQPHIGH", Block::Cqp),
        Reg::CcqpLow => s("CCQPLOW", Block::Cqp),
        Reg::CqpErrCodes => s("CQPERRCODES", Block::Cqp),
        Reg::CqArm => s("CQARM", Block::Ccq),
        Reg::CqAck => s("CQACK", Block::Ccq),
        Reg::AeqAlloc => s("AEQALLOC", Block::Db),
        Reg::WqeAlloc => s("WQEALLOC", Block::Db),
        Reg::DbPage => (format!("DB_PAGE+{:#x}", offset - IRDMA_DB_ADDR_OFFSET), Block::Db),
        Reg::LbarCtrl => s("GLPCI_LBARCTRL", Block::Pe),
        Reg::CpuStatus => (format!("GLPE_CPUSTATUS{}", (offset - IRDMA_GLPE_CPUSTATUS0) / 4), Block::Pe),
        Reg::CeqCtl(i) => (format!("GLINT_CEQCTL[{i}]"), Block::Ceq),
        Reg::LbDescLow => s("EMU_LB_DESC_LOW", Block::Classify),
        Reg::LbDescHigh => s("EMU_LB_DESC_HIGH", Block::Classify),
        Reg::LbDoorbell => s("EMU_LB_DOORBELL", Block::Classify),
        Reg::LbStatus => s("EMU_LB_STATUS", Block::Classify),
        Reg::LbResult => s("EMU_LB_RESULT", Block::Classify),
        Reg::LbSeq => s("EMU_LB_SEQ", Block::Classify),
    }
}

fn fields(reg: Reg, v: u64) -> String {
    let f = |name: &str, field: Field| format!("{name}={:#x}", field.get(v));
    let mut out: Vec<String> = Vec::new();
    match reg {
        Reg::CqpTail => {
            out.push(format!("wqtail={}", IRDMA_CQPTAIL_WQTAIL.get(v)));
            out.extend(flag_names(v, &[(IRDMA_CQPTAIL_CQP_OP_ERR.mask(), "CQP_OP_ERR")]));
        }
        Reg::CcqpStatus => out.extend(flag_names(
            v,
            &[(IRDMA_CCQPSTATUS_CCQP_DONE.mask(), "CCQP_DONE"), (IRDMA_CCQPSTATUS_CCQP_ERR.mask(), "CCQP_ERR")],
        )),
        Reg::CqpErrCodes => {
            out.push(f("major", IRDMA_CQPERRCODES_CQP_MAJOR_CODE));
            out.push(f("minor", IRDMA_CQPERRCODES_CQP_MINOR_CODE));
        }
        Reg::CeqCtl(_) => {
            out.push(format!("msix_indx={}", IRDMA_GLINT_CEQCTL_MSIX_INDX.get(v)));
            out.push(format!("itr_indx={}", IRDMA_GLINT_CEQCTL_ITR_INDX.get(v)));
            out.extend(flag_names(v, &[(IRDMA_GLINT_CEQCTL_CAUSE_ENA.mask(), "CAUSE_ENA")]));
        }
        Reg::LbStatus => {
            let st = LbStatus::new_with_raw_value(v as u32);
            for (on, name) in [(st.done(), "DONE"), (st.busy(), "BUSY"), (st.err(), "ERR")] {
                if on {
                    out.push(name.into());
                }
            }
            if st.errcode() != 0 {
                out.push(format!("errcode={}", st.errcode()));
            }
        }
        Reg::LbResult => {
            let r = LbResult::new_with_raw_value(v as u32);
            let kind = match r.kind() {
                Ok(LbKind::ToHost) => "to-host".to_string(),
                Ok(LbKind::Established) => "established".to_string(),
                Ok(LbKind::Listener) => "listener".to_string(),
                Err(k) => format!("{k}"),
            };
            out.push(format!("kind={kind} qpn={}", r.qpn()));
        }
        Reg::LbarCtrl => out.push(f("pe_db_size", IRDMA_GLPCI_LBARCTRL_PE_DB_SIZE)),
        _ => {}
    }
    out.join(" ")
}

/// The register at `offset` of BAR0 (`ceqs` GLINT_CEQCTL registers), decoded when `value` is given.
pub fn describe(offset: u64, ceqs: usize, value: Option<u64>) -> RegisterName {
    match Reg::decode(offset, ceqs) {
        Some(reg) => {
            let (name, block) = name_of(reg, offset);
            RegisterName { block, name: Some(name), fields: value.map(|v| fields(reg, v)).unwrap_or_default() }
        }
        None => RegisterName::unnamed(),
    }
}

/// The offset of the register called `name` (as [`describe`] prints it).
pub fn offset_of(name: &str, ceqs: usize) -> Option<u64> {
    let fixed = [
        IRDMA_CQPTAIL,
        IRDMA_CQPDB,
        IRDMA_CCQPSTATUS,
        IRDMA_CCQPHIGH,
        IRDMA_CCQPLOW,
        IRDMA_CQPERRCODES,
        IRDMA_CQARM,
        IRDMA_CQACK,
        IRDMA_AEQALLOC,
        IRDMA_WQEALLOC,
        IRDMA_GLPCI_LBARCTRL,
        IRDMA_GLPE_CPUSTATUS0,
        IRDMA_GLPE_CPUSTATUS1,
        IRDMA_GLPE_CPUSTATUS2,
        IRDMA_EMU_LB_DESC_LOW,
        IRDMA_EMU_LB_DESC_HIGH,
        IRDMA_EMU_LB_DOORBELL,
        IRDMA_EMU_LB_STATUS,
        IRDMA_EMU_LB_RESULT,
        IRDMA_EMU_LB_SEQ,
    ];
    let ceq = (0..ceqs as u64).map(|i| IRDMA_GLINT_CEQCTL + 4 * i);
    fixed.into_iter().chain(ceq).find(|o| describe(*o, ceqs, None).name.as_deref() == Some(name.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_are_named_with_their_block_and_decoded_fields() {
        let table: [(u64, u64, &str, Block, &str); 6] = [
            (0x0050_0880, 0x8000_0005, "CQPTAIL", Block::Cqp, "wqtail=5 CQP_OP_ERR"),
            (0x0050_A000, 0x8000_0001, "CCQPSTATUS", Block::Cqp, "CCQP_DONE CCQP_ERR"),
            (0x0050_A200, 0x8002_0001, "CQPERRCODES", Block::Cqp, "major=0x8002 minor=0x1"),
            (0x0015_C004, 0x4000_0001, "GLINT_CEQCTL[1]", Block::Ceq, "msix_indx=1 itr_indx=0 CAUSE_ENA"),
            (0x0050_2C00, 0, "CQARM", Block::Ccq, ""),
            (0x007F_0010, 1, "DB_PAGE+0x10", Block::Db, ""),
        ];
        for (offset, value, name, block, f) in table {
            let n = describe(offset, 4, Some(value));
            assert_eq!((n.name.as_deref(), n.block, n.fields.as_str()), (Some(name), block, f), "{offset:#x}");
            if !name.starts_with("DB_PAGE") {
                assert_eq!(offset_of(name, 4), Some(offset), "{name}");
            }
        }
        assert_eq!(describe(0x1234, 4, Some(0)), RegisterName::unnamed());
        assert_eq!(offset_of("GLINT_CEQCTL[4]", 4), None, "beyond the function's vectors");
    }
}
