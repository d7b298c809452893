//! The chip personality's registers against the sequences the Linux hfi1 driver runs on them (the kernel
//! function each test follows is named in it; expected values are the kernel's conditions).

#![forbid(unsafe_code)]

use super::asic::*;
use super::cce::*;
use super::dc::*;
use super::sdma::*;
use super::txe::*;
use super::*;
use crate::hfi1::cable::Phy;

fn wfr() -> Wfr {
    Wfr::new(WfrShape::default())
}

/// Writes that must not raise an interrupt.
fn w(c: &mut Wfr, offset: u64, value: u64) {
    assert_eq!(c.write(offset, value), Vec::<u16>::new(), "write {offset:#x} = {value:#x} raised an interrupt");
}

#[test]
fn identity_registers_say_b0_functional_simulator() {
    let mut c = wfr();
    let rev = c.read(CCE_REVISION);
    assert_ne!(rev, u64::MAX, "hfi1_pcie_ddinit: CSRs must be readable");
    let minrev = rev & 0xFF;
    assert_eq!(minrev & 0xF0, 0x10, "is_bx");
    let rev2 = c.read(CCE_REVISION2);
    assert_eq!((rev2 >> 8) & 0xFF, 3, "icode: ICODE_FUNCTIONAL_SIMULATOR");
    assert_eq!(rev2 & 1, 0, "hfi1_id 0");
    w(&mut c, CCE_REVISION, 0);
    assert_eq!(c.read(CCE_REVISION), rev, "read-only");
}

#[test]
fn size_registers_read_the_shape_and_ignore_writes() {
    let shape = WfrShape { send_contexts: 24, sdma_engines: 2, ..WfrShape::default() };
    let mut c = Wfr::new(shape);
    let table = [
        (SEND_CONTEXTS, 24),
        (SEND_DMA_ENGINES, 2),
        (SEND_PIO_MEM_SIZE, shape.pio_mem_size),
        (SEND_DMA_MEM_SIZE, shape.sdma_mem_size),
        (DC_DC8051_CFG_LOCAL_GUID, shape.guid),
    ];
    for (offset, want) in table {
        w(&mut c, offset, 0x1234);
        assert_eq!(c.read(offset), want, "{offset:#x}");
    }
}

#[test]
fn check_int_registers_sequence_passes() {
    let mut c = wfr();
    let all = u64::MAX;
    let mask = c.read(CCE_INT_MASK);
    w(&mut c, CCE_INT_MASK, 0);
    assert_eq!(c.read(CCE_INT_MASK), 0);
    w(&mut c, CCE_INT_CLEAR, all);
    assert_eq!(c.read(CCE_INT_STATUS), 0);
    // Forcing with everything masked sets status and delivers nothing.
    w(&mut c, CCE_INT_FORCE, all);
    assert_eq!(c.read(CCE_INT_STATUS), all);
    w(&mut c, CCE_INT_CLEAR, all);
    w(&mut c, CCE_INT_MASK, mask);
    assert_eq!(c.read(CCE_INT_STATUS), 0);
}

#[test]
fn forced_source_is_delivered_once_on_its_mapped_vector_when_unmasked() {
    let mut c = wfr();
    // Source 200 (IS_SDMA_START + 8): CCE_INT_MAP[25], byte 0 (remap_intr); status word 3, bit 8.
    w(&mut c, CCE_INT_MAP + 8 * 25, 7);
    w(&mut c, CCE_INT_MASK + 8 * 3, 1 << 8);
    assert_eq!(c.write(CCE_INT_FORCE + 8 * 3, 1 << 8), vec![7]);
    // Still pending: forcing again is no new edge.
    assert_eq!(c.write(CCE_INT_FORCE + 8 * 3, 1 << 8), Vec::<u16>::new());
    w(&mut c, CCE_INT_CLEAR + 8 * 3, 1 << 8);
    assert_eq!(c.write(CCE_INT_FORCE + 8 * 3, 1 << 8), vec![7]);
}

#[test]
fn unmasking_a_pending_source_delivers_it() {
    let mut c = wfr();
    w(&mut c, CCE_INT_FORCE, 1 << 5);
    assert_eq!(c.write(CCE_INT_MASK, 1 << 5), vec![0]);
}

#[test]
fn freeze_and_unfreeze_through_cce_ctrl() {
    let mut c = wfr();
    w(&mut c, CCE_CTRL, CCE_CTRL_SPC_FREEZE_SMASK);
    assert_eq!(c.read(CCE_STATUS) & ALL_FROZE, ALL_FROZE, "wait_for_freeze_status(freeze)");
    w(&mut c, CCE_CTRL, CCE_CTRL_SPC_UNFREEZE_SMASK);
    assert_eq!(c.read(CCE_STATUS) & ALL_FROZE, 0, "wait_for_freeze_status(unfreeze)");
    assert_eq!(c.read(CCE_CTRL), 0, "CCE_CTRL bits clear automatically");
}

#[test]
fn asic_mutex_reads_back_the_owner_byte() {
    // acquire_hw_mutex: write 1 << hfi1_id, succeed when the low byte reads back; release writes 0.
    let mut c = wfr();
    assert_eq!(c.read(ASIC_CFG_MUTEX), 0);
    w(&mut c, ASIC_CFG_MUTEX, 1);
    assert_eq!(c.read(ASIC_CFG_MUTEX) as u8, 1);
    w(&mut c, ASIC_CFG_MUTEX, 0);
    assert_eq!(c.read(ASIC_CFG_MUTEX), 0);
}

#[test]
fn chip_resources_in_scratch_start_free() {
    // acquire_chip_resource waits while (scratch & (res | res << 8)) != 0: every resource bit starts clear.
    let mut c = wfr();
    assert_eq!(c.read(ASIC_CFG_SCRATCH), 0);
    w(&mut c, ASIC_CFG_SCRATCH, 0x2);
    assert_eq!(c.read(ASIC_CFG_SCRATCH), 0x2);
}

#[test]
fn sbus_read_in_fast_mode_completes_with_read_complete() {
    let mut c = wfr();
    w(&mut c, ASIC_CFG_SBUS_EXECUTE, ASIC_CFG_SBUS_EXECUTE_FAST_MODE_SMASK);
    // sbus_request(dd, 0xfd, 0x08, READ_SBUS_RECEIVER, 1): receiver 7:0, data address 15:8, command 23:16.
    w(&mut c, ASIC_CFG_SBUS_REQUEST, (1 << 32) | (READ_SBUS_RECEIVER << 16) | (0x08 << 8) | 0xfd);
    let result = c.read(ASIC_STS_SBUS_RESULT);
    assert_eq!((result >> 2) & 0x7, SBUS_READ_COMPLETE);
    // clear_sbus_fast_mode waits for the EXECUTE and RCV_DATA_VALID counters to agree.
    let counters = c.read(ASIC_STS_SBUS_COUNTERS);
    assert_eq!(counters & 0xFFFF, (counters >> 16) & 0xFFFF);
    assert_eq!(counters & 0xFFFF, 1);
}

#[test]
fn sbus_slow_request_sets_done_and_data_valid_until_execute_clears() {
    // sbus_request_slow: EXECUTE, wait for DONE and RCV_DATA_VALID, clear EXECUTE, wait for DONE to drop.
    let mut c = wfr();
    w(&mut c, ASIC_CFG_SBUS_REQUEST, 0x21 << 16);
    w(&mut c, ASIC_CFG_SBUS_EXECUTE, ASIC_CFG_SBUS_EXECUTE_EXECUTE_SMASK);
    assert_eq!(c.read(ASIC_STS_SBUS_RESULT) & 0x3, 0x3);
    w(&mut c, ASIC_CFG_SBUS_EXECUTE, 0);
    assert_eq!(c.read(ASIC_STS_SBUS_RESULT) & 0x1, 0);
}

/// eprom.c read_page: set the address with CMD_READ_DATA, then read 64 dwords.
fn read_page(c: &mut Wfr, addr: u64) -> Vec<u32> {
    w(c, ASIC_EEP_ADDR_CMD, (0x03 << 24) | addr);
    let page = (0..64).map(|_| c.read(ASIC_EEP_DATA) as u32).collect();
    w(c, ASIC_EEP_ADDR_CMD, 0);
    page
}

#[test]
fn eprom_directory_page_ends_with_an_empty_footer() {
    // eprom_read_platform_config reads the last page of the first 128 KiB segment and looks for the footer:
    // oprom_size, num_table_entries + version << 16, magic "eprm".
    let mut c = wfr();
    let page = read_page(&mut c, 128 * 1024 - 256);
    assert_eq!(&page[61..], &[0, 1 << 16, 0x6d72_7065]);
    assert!(page[..61].iter().all(|&d| d == 0xFFFF_FFFF), "erased flash elsewhere");
    assert_eq!(read_page(&mut c, 0), vec![0xFFFF_FFFF; 64]);
}

#[test]
fn qsfp_reports_no_module_plugged_in() {
    // qsfp_mod_present: !(ASIC_QSFP1_IN & QSFP_HFI0_MODPRST_N).
    let mut c = wfr();
    assert_ne!(c.read(ASIC_QSFP1_IN) & QSFP_HFI0_MODPRST_N, 0);
    assert_ne!(c.read(ASIC_QSFP1_IN) & QSFP_HFI0_INT_N, 0);
    w(&mut c, ASIC_QSFP1_OUT, 0x1f);
    assert_ne!(c.read(ASIC_QSFP1_IN) & QSFP_HFI0_RESET_N, 0);
}

/// do_8051_command: write type and data, then the same with REQ_NEW, poll COMPLETED, read the result, write 0.
fn host_command(c: &mut Wfr, kind: u64, data: u64) -> (u64, u64) {
    let reg = (kind << 8) | (data << 16);
    w(c, DC_DC8051_CFG_HOST_CMD_0, reg);
    assert_eq!(c.read(DC_DC8051_CFG_HOST_CMD_1) & 1, 0, "not complete before REQ_NEW");
    w(c, DC_DC8051_CFG_HOST_CMD_0, reg | 1);
    let r = c.read(DC_DC8051_CFG_HOST_CMD_1);
    assert_eq!(r & 1, 1, "COMPLETED");
    w(c, DC_DC8051_CFG_HOST_CMD_0, 0);
    assert_eq!(c.read(DC_DC8051_CFG_HOST_CMD_1) & 1, 0, "cleared for the next user");
    ((r >> 8) & 0xFF, r >> 16)
}

#[test]
fn host_commands_succeed_and_change_phy_state_moves_the_port() {
    let mut c = wfr();
    let state = c.read(DC_DC8051_STS_CUR_STATE);
    assert_eq!((state >> 16) & 0xFF, 0xA0, "firmware ready");
    assert_eq!(state & 0xFF, 0x90, "PLS_OFFLINE");
    assert_eq!(host_command(&mut c, HCMD_CHANGE_PHY_STATE, 0x20), (HCMD_SUCCESS, 0));
    assert_eq!(c.read(DC_DC8051_STS_CUR_STATE) & 0xFF, 0x20, "PLS_POLLING");
    // goto_offline: PLS_OFFLINE | reason << 8; wait_phys_link_offline_substates wants (state & 0xF0) == 0x90.
    assert_eq!(host_command(&mut c, HCMD_CHANGE_PHY_STATE, 0x90 | (3 << 8)), (HCMD_SUCCESS, 0));
    assert_eq!(c.read(DC_DC8051_STS_CUR_STATE) & 0xF0, 0x90);
    // MISC (LCB access request) and an unknown type also succeed.
    assert_eq!(host_command(&mut c, 0x05, 1).0, HCMD_SUCCESS);
}

/// __read_8051_data: set the address, enable the read, poll ACCESS_COMPLETED, read RD_DATA.
fn read_8051(c: &mut Wfr, addr: u64) -> u64 {
    w(c, DC_DC8051_CFG_RAM_ACCESS_CTRL, addr);
    w(c, DC_DC8051_CFG_RAM_ACCESS_CTRL, addr | 0x1_0000);
    assert_ne!(c.read(DC_DC8051_CFG_RAM_ACCESS_STATUS) & 0x1_0000, 0, "ACCESS_COMPLETED");
    c.read(DC_DC8051_CFG_RAM_ACCESS_RD_DATA)
}

#[test]
fn loaded_config_fields_read_back_through_the_ram_window() {
    // load_8051_config(field 5, GENERAL_CONFIG lane 4, value), then read_8051_config: address 4 * field,
    // upper half of the qword for an address with bit 2 set.
    let mut c = wfr();
    let (field, lane, value) = (5u64, 4u64, 0xdead_beefu64);
    let data = (field << 40) | (lane << 32) | value;
    assert_eq!(host_command(&mut c, HCMD_LOAD_CONFIG_DATA, data).0, HCMD_SUCCESS);
    let addr = 4 * field;
    assert_eq!(read_8051(&mut c, addr) >> 32, value);
    // Lane 2 fields sit after the general ones: (4 * 0x17) + 2 * 4 * 8 + 4 * field.
    let data = (1 << 40) | (2 << 32) | 0x55;
    host_command(&mut c, HCMD_LOAD_CONFIG_DATA, data);
    let addr = 4 * 0x17 + 2 * 4 * 8 + 4;
    let q = read_8051(&mut c, addr & !7);
    assert_eq!(if addr & 4 != 0 { q >> 32 } else { q & 0xFFFF_FFFF }, 0x55);
}

#[test]
fn sdma_halt_is_reported_and_cleanup_completes() {
    let mut c = wfr();
    let e = 1u64;
    let (ctrl, status, err_status, err_clear) = (
        SEND_DMA_CTRL + 0x100 * e,
        SEND_DMA_STATUS + 0x100 * e,
        SEND_DMA_ENG_ERR_STATUS + 0x100 * e,
        SEND_DMA_ENG_ERR_CLEAR + 0x100 * e,
    );
    // enable_sdma_srcs unmasks SDMAENG_ERR 16 + e; it is not remapped, so vector 0.
    w(&mut c, CCE_INT_MASK, 1 << (16 + e));
    // s10_hw_start_up_halt_wait: CTRL = HALT; the engine answers with a halt error interrupt.
    assert_eq!(c.write(ctrl, SEND_DMA_CTRL_SDMA_HALT_SMASK), vec![0]);
    assert_ne!(c.read(CCE_INT_STATUS) & (1 << (16 + e)), 0);
    assert_eq!(c.read(err_status), SDMA_HALT_ERR);
    assert_ne!(c.read(status) & SEND_DMA_STATUS_ENG_HALTED_SMASK, 0, "sdma_err_halt_wait");
    // interrupt_clear_down: CLEAR, then STATUS must read 0.
    w(&mut c, err_clear, u64::MAX);
    assert_eq!(c.read(err_status), 0);
    // s15: CTRL = INT_ENABLE | CLEANUP; sdma_hw_clean_up_task polls ENG_CLEANED_UP with no timeout.
    w(&mut c, ctrl, 0x8 | SEND_DMA_CTRL_SDMA_CLEANUP_SMASK);
    let st = c.read(status);
    assert_ne!(st & SEND_DMA_STATUS_ENG_CLEANED_UP_SMASK, 0);
    assert_eq!(st & SEND_DMA_STATUS_ENG_HALTED_SMASK, 0);
    assert_eq!(c.read(ctrl), 0x8, "CLEANUP is a pulse");
    // Another engine is untouched.
    assert_eq!(c.read(SEND_DMA_STATUS), 0);
}

#[test]
fn pio_init_never_shows_in_progress_or_error() {
    // sc_enable / pio_init_wait_progress: after writing a single-context init, bits 2 and 3 must be clear.
    let mut c = wfr();
    w(&mut c, SEND_PIO_INIT_CTXT, (5 << 8) | 0x2);
    assert_eq!(c.read(SEND_PIO_INIT_CTXT) & 0xC, 0);
}

#[test]
fn send_ctrl_cm_reset_clears_itself() {
    // __cm_reset polls SEND_CTRL.CM_RESET with no timeout.
    let mut c = wfr();
    w(&mut c, SEND_CTRL, SEND_CTRL_CM_RESET_SMASK | 0x1);
    assert_eq!(c.read(SEND_CTRL), 0x1);
}

#[test]
fn send_contexts_report_nothing_in_flight() {
    // sc_wait_for_packet_egress: occupancy 0 ends the wait; SEND_CTXT_STATUS not halted.
    let mut c = wfr();
    for offset in [SEND_EGRESS_CTXT_STATUS + 8 * 3, SEND_CTXT_STATUS + 0x100 * 3, SEND_EGRESS_SEND_DMA_STATUS] {
        assert_eq!(c.read(offset), 0, "{offset:#x}");
    }
}

#[test]
fn error_status_registers_are_cleared_by_their_clear_registers() {
    let mut c = wfr();
    for (status, clear) in [(CCE_ERR_STATUS, CCE_ERR_CLEAR), (DC_DC8051_ERR_FLG, DC_DC8051_ERR_CLR)] {
        c.errs.set(status, 0b1010);
        assert_eq!(c.read(status), 0b1010);
        w(&mut c, clear, 0b0010);
        assert_eq!(c.read(status), 0b1000);
        assert_eq!(c.read(clear), 0, "CLEAR reads 0");
        w(&mut c, status, 0);
        assert_eq!(c.read(status), 0b1000, "STATUS is read-only");
    }
}

#[test]
fn storage_registers_hold_their_value_and_reset_to_the_chip_defaults() {
    let mut c = wfr();
    // The values reset_*_csrs write as "chip reset defaults", and the DC's logical link state Down.
    let resets = [
        (CCE_DC_CTRL, 0x1),
        (ASIC_EEP_CTL_STAT, 0x8381_8000),
        (SEND_CM_CTRL, 0x20),
        (SEND_CM_GLOBAL_CREDIT, 0x0000_0940_0003_0000),
        (DCC_CFG_PORT_CONFIG, 1 << 48),
        (SEND_CTXT_CHECK_ENABLE + 0x100 * 4, 0),
    ];
    for (offset, reset) in resets {
        assert_eq!(c.read(offset), reset, "{offset:#x}");
        w(&mut c, offset, 0x0123_4567_89ab_cdef);
        assert_eq!(c.read(offset), 0x0123_4567_89ab_cdef, "{offset:#x}");
    }
    w(&mut c, ASIC_CFG_MUTEX, 1);
    host_command(&mut c, HCMD_CHANGE_PHY_STATE, 0x20);
    w(&mut c, SEND_DMA_CTRL, SEND_DMA_CTRL_SDMA_HALT_SMASK);
    // The port was polling: the cable hears that it went away.
    assert_eq!(c.reset(), Some(Phy::Down { reason: None }));
    for (offset, reset) in resets {
        assert_eq!(c.read(offset), reset, "{offset:#x} after reset");
    }
    assert_eq!(c.read(ASIC_CFG_MUTEX), 0);
    assert_eq!(c.read(DC_DC8051_STS_CUR_STATE) & 0xFF, 0x90);
    assert_eq!(c.read(SEND_DMA_STATUS), 0);
    assert_eq!((c.read(CCE_REVISION2) >> 8) & 0xFF, 3, "identity survives");
}

#[test]
fn dc_reset_puts_the_8051_back_offline() {
    let mut c = wfr();
    host_command(&mut c, HCMD_CHANGE_PHY_STATE, 0x20);
    w(&mut c, CCE_DC_CTRL, 1);
    assert_eq!(c.read(DC_DC8051_STS_CUR_STATE) & 0xFF, 0x90);
    assert_eq!(c.take_signal(), Some(Phy::Down { reason: None }), "the link it was training for drops");
}

#[test]
fn pio_send_space_is_write_only() {
    let mut c = wfr();
    w(&mut c, TXE_PIO_SEND + 0x10000, 0x55);
    assert_eq!(c.read(TXE_PIO_SEND + 0x10000), 0);
    assert_eq!(c.unnamed(), 0);
}

#[test]
fn accesses_to_unnamed_offsets_are_counted() {
    let mut c = wfr();
    w(&mut c, CHIP_DEBUG_GAP, 1);
    assert_eq!(c.read(CHIP_DEBUG_GAP), 0, "no register there: the write was dropped (wfr::storage)");
    assert_eq!(c.unnamed(), 2);
    c.read(SEND_CTRL);
    assert_eq!(c.unnamed(), 2);
}
const CHIP_DEBUG_GAP: u64 = 0x70_0000;

#[test]
fn shape_limits_are_the_chips() {
    let bad = [
        WfrShape { send_contexts: 0, ..WfrShape::default() },
        WfrShape { send_contexts: 161, ..WfrShape::default() },
        WfrShape { sdma_engines: 0, ..WfrShape::default() },
        WfrShape { sdma_engines: 17, ..WfrShape::default() },
        WfrShape { pio_mem_size: 100, ..WfrShape::default() },
    ];
    for s in bad {
        assert!(s.validate().is_err(), "{s:?}");
    }
    assert_eq!(WfrShape::default().validate(), Ok(()));
}

#[test]
fn names_follow_the_kernel() {
    let table = [
        (0x0, "CCE_REVISION"),
        (0x110508, "CCE_INT_MAP[1]"),
        (0x110918, "CCE_INT_MASK[3]"),
        (0x400040, "ASIC_CFG_MUTEX"),
        (0x602030, "DC_DC8051_CFG_HOST_CMD_1"),
        (0x1000010, "RCV_CONTEXTS"),
        (0x1100318, "RCV_TID_CTRL[ctxt 3]"),
        (0x1200010, "RCV_ARRAY[2]"),
        (0x1302818, "RCV_TID_FLOW_TABLE[ctxt 2][3]"),
        (0x1305008, "RCV_HDR_HEAD[ctxt 5]"),
        (0x1800038, "SEND_PIO_INIT_CTXT"),
        (0x1900200, "SEND_CTXT_CTRL[ctxt 2]"),
        (0x1a00108, "SEND_DMA_STATUS[engine 1]"),
        (0x1800818, "SEND_EGRESS_CTXT_STATUS[3]"),
        (0x2030000, "PIO_SEND[ctxt 3]"),
        (0x3030000, "PIO_SEND_SOP[ctxt 3]"),
        (0x100010, "CCE_MSIX_TABLE_LOWER[1]"),
        (0x6001f0, "DCC_PRF_PORT_VL_RCV_DATA_CNT[8]"),
        // The first element of an array or a family carries its index too.
        (0x1a00008, "SEND_DMA_STATUS[engine 0]"),
        (0x1100000, "RCV_CTXT_CTRL[ctxt 0]"),
        (0x110500, "CCE_INT_MAP[0]"),
        (0x1300800, "RCV_TID_FLOW_TABLE[ctxt 0][0]"),
    ];
    for (offset, name) in table {
        assert_eq!(names::name(offset).as_deref(), Some(name), "{offset:#x}");
        assert_eq!(names::offset_of(name), Some(offset), "{name}");
    }
    for bad in
        ["NO_SUCH_CSR", "SEND_DMA_STATUS[engine 16]", "SEND_DMA_STATUS[ctxt 0]", "RCV_ARRAY[x]", "CCE_INT_MAP[96]"]
    {
        assert_eq!(names::offset_of(bad), None, "{bad}");
    }
    assert_eq!(names::name(WFR_BAR0_SIZE), None);
    assert!(!names::is_named(CHIP_DEBUG_GAP));
}

/// A PIO packet is a user's when its send context's job-key check is on with a user's key (jkey.rs):
/// hfi1_set_ctxt_jkey writes SEND_CTXT_CHECK_JOB_KEY (MASK all ones, the key) and sets CHECK_JOB_KEY in
/// SEND_CTXT_CHECK_ENABLE; hfi1_clear_ctxt_jkey clears both; kernel contexts carry TID_RDMA_JKEY 32.
#[test]
fn a_pio_packet_launches_as_a_users_when_its_context_checks_a_users_job_key() {
    use super::pio::*;
    const CTXT: u64 = 3;
    const MASK_ALL_ONES: u64 = 0xFFFF_0000;
    // (SEND_CTXT_CHECK_JOB_KEY, SEND_CTXT_CHECK_ENABLE, user?): the kernel's sc_enable leaves CHECK_ENABLE
    // (bit 0) and friends, set_ctxt_jkey adds CHECK_JOB_KEY (bit 2).
    let table = [
        (MASK_ALL_ONES | 1000, 0x1 | 0x4, true),
        (MASK_ALL_ONES | 0x8005, 0x1 | 0x4, true),
        (MASK_ALL_ONES | 32, 0x1 | 0x4, false),
        (MASK_ALL_ONES | 1000, 0x1, false),
        (0, 0x1, false),
    ];
    for (job_key, enable, user) in table {
        let mut c = wfr();
        let at = |base: u64| base + 0x100 * CTXT;
        // init_kdeth_qp: KDETH QPs are 0x80xxxx, so the packet below (QP 0) is no KDETH packet.
        w(&mut c, SEND_BTH_QP, 0x80 << 16);
        w(&mut c, at(SEND_CTXT_CHECK_JOB_KEY), job_key);
        w(&mut c, at(SEND_CTXT_CHECK_ENABLE), enable);
        w(&mut c, SEND_PIO_INIT_CTXT, SEND_PIO_INIT_CTXT_PIO_SINGLE_CTXT_INIT_SMASK | (CTXT << 8));
        w(&mut c, at(SEND_CTXT_CTRL), (8 << SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT) | SEND_CTXT_CTRL_CTXT_ENABLE_SMASK);
        // One block: a PBC of 16 dwords (8 bytes of PBC, 56 of header) through the SOP alias.
        let block = TXE_PIO_SEND + SOP_DISTANCE + (CTXT << PIO_ADDR_CONTEXT_SHIFT);
        for q in 0..8 {
            w(&mut c, block + 8 * q, if q == 0 { 16 } else { 0 });
        }
        let l = c.take_launches();
        let [Launch { kind: LaunchKind::Packet { user: got, .. }, .. }] = l.as_slice() else { panic!("{l:?}") };
        assert_eq!(*got, user, "{job_key:#x} {enable:#x}");
    }
}

/// A user send context as the kernel leaves it for PSM2 (pio.c sc_alloc(SC_USER) and set_pio_integrity;
/// chip.c hfi1_set_ctxt_jkey for uid 1000, hfi1_set_ctxt_pkey 0x8001, set_lidlmc LID 2; init_kdeth_qp), or with
/// the kernel's TID RDMA J_KEY 32 instead, enabled with 8 credits; its error interrupt on vector 7.
fn checked_context(c: &mut Wfr, ctxt: u64, jkey: u64) {
    use super::pio::*;
    let at = |base: u64| base + 0x100 * ctxt;
    w(c, SEND_BTH_QP, 0x80 << 16);
    // hfi1_pkt_default_send_ctxt_mask(SC_USER) on B0, then SET_PKEY: +CHECK_PARTITION_KEY, -DISALLOW_KDETH.
    let default = 0x3F_F000 | 0x2000 | 0x1000 | 0x800 | 0x400 | 0x200 | 0x100 | 0xF3 | 0x4;
    w(c, at(SEND_CTXT_CHECK_ENABLE), (default | 0x8) & !0x1000);
    w(c, at(SEND_CTXT_CHECK_OPCODE), (0xC0 << 8) | 0xC0);
    w(c, at(SEND_CTXT_CHECK_VL), 1 << 15);
    w(c, at(SEND_CTXT_CHECK_JOB_KEY), 0xFFFF_0000 | jkey);
    w(c, at(SEND_CTXT_CHECK_PARTITION_KEY), 0x8001);
    w(c, at(SEND_CTXT_CHECK_SLID), (0xFFFF << 16) | 2);
    let source = super::shape::IS_SENDCTXT_ERR_START as u64 + ctxt;
    w(c, CCE_INT_MAP + 8 * (source / 8), 7 << (8 * (source % 8)));
    w(c, CCE_INT_MASK + 8 * (source / 64), 1 << (source % 64));
    w(c, SEND_PIO_INIT_CTXT, SEND_PIO_INIT_CTXT_PIO_SINGLE_CTXT_INIT_SMASK | (ctxt << 8));
    w(c, at(SEND_CTXT_CTRL), (8 << SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT) | SEND_CTXT_CTRL_CTXT_ENABLE_SMASK);
}

/// pio_copy of a header-only 9B packet (PBC VL `vl`, 16 dwords: PBC, LRH, BTH, 36 bytes of KDETH) of
/// `opcode`, DestQP `qp`, J_KEY `jkey`, from LID 2 in partition 0x8001: the MSI-X vectors the last write sent.
fn pio_send(c: &mut Wfr, ctxt: u64, vl: u64, opcode: u8, qp: u32, jkey: u16) -> Vec<u16> {
    use super::pio::*;
    let mut b = [0u8; 64];
    b[..8].copy_from_slice(&((vl << PBC_VL_SHIFT) | 16).to_le_bytes());
    b[9] = 0x2;
    b[14..16].copy_from_slice(&2u16.to_be_bytes());
    b[16] = opcode;
    b[18..20].copy_from_slice(&0x8001u16.to_be_bytes());
    b[20..24].copy_from_slice(&qp.to_be_bytes());
    b[32..34].copy_from_slice(&jkey.to_le_bytes());
    let block = TXE_PIO_SEND + SOP_DISTANCE + (ctxt << PIO_ADDR_CONTEXT_SHIFT);
    let mut vectors = Vec::new();
    for (q, chunk) in b.chunks(8).enumerate() {
        vectors = c.write(block + 8 * q as u64, u64::from_le_bytes(chunk.try_into().unwrap()));
    }
    vectors
}

/// The send checks of a user context, with negative cases: a packet failing one is dropped, the context halts
/// with SEND_CTXT_ERR_STATUS.PIO_DISALLOWED_PACKET_ERR and its error interrupt, and SEND_EGRESS_ERR_INFO names
/// the checks, which the driver clears by writing back what it read (chip.c sc_err_status_flags
/// "DisallowedPacket": SEC_PACKET_DROPPED | SEC_SC_HALTED; is_sendctxt_err_int; handle_send_egress_err_info).
/// A kernel context is not checked.
#[test]
fn a_user_context_packet_failing_a_send_check_is_dropped_and_halts_the_context() {
    use super::pio::*;
    use super::send_check::*;
    const CTXT: u64 = 20;
    const USER: u64 = 1000;
    // (what, J_KEY of the context, VL, opcode, DestQP, J_KEY in the packet, SEND_EGRESS_ERR_INFO or launched)
    let table = [
        ("PSM2's packet", USER, 0, 0xC1, 0x80_0014, 1000, None),
        ("another job's J_KEY", USER, 0, 0xC1, 0x80_0014, 1001, Some(SEND_EGRESS_ERR_INFO_JOB_KEY_ERR_SMASK)),
        (
            "a forged SMP on VL15",
            USER,
            15,
            0x64,
            0,
            0,
            Some(
                SEND_EGRESS_ERR_INFO_VL_ERR_SMASK
                    | SEND_EGRESS_ERR_INFO_NON_KDETH_PACKETS_ERR_SMASK
                    | SEND_EGRESS_ERR_INFO_OPCODE_ERR_SMASK,
            ),
        ),
        ("a KDETH verbs opcode", USER, 0, 0x04, 0x80_0014, 1000, Some(SEND_EGRESS_ERR_INFO_OPCODE_ERR_SMASK)),
        ("the same SMP from a kernel context", 32, 15, 0x64, 0, 0, None),
    ];
    for (what, jkey, vl, opcode, qp, pkt_jkey, refused) in table {
        let mut c = wfr();
        checked_context(&mut c, CTXT, jkey);
        let vectors = pio_send(&mut c, CTXT, vl, opcode, qp, pkt_jkey);
        let l = c.take_launches();
        let status = c.read(SEND_CTXT_ERR_STATUS + 0x100 * CTXT);
        let halted = c.read(SEND_CTXT_STATUS + 0x100 * CTXT) & SEND_CTXT_STATUS_CTXT_HALTED_SMASK != 0;
        let info = c.read(SEND_EGRESS_ERR_INFO);
        match refused {
            None => {
                assert!(matches!(l.as_slice(), [Launch { kind: LaunchKind::Packet { .. }, .. }]), "{what}: {l:?}");
                assert_eq!((status, halted, info, vectors), (0, false, 0, vec![]), "{what}");
            }
            Some(bits) => {
                assert!(
                    matches!(l.as_slice(), [Launch { kind: LaunchKind::Discarded, blocks: 1, .. }]),
                    "{what}: {l:?}"
                );
                assert_eq!(status, SEND_CTXT_ERR_STATUS_PIO_DISALLOWED_PACKET_ERR_SMASK, "{what}");
                assert!(halted, "{what}");
                assert_eq!(info, bits, "{what}");
                assert_eq!(vectors, vec![7], "{what}: the send context's error interrupt");
                // The halted context drops what follows until the driver's CTXT_RESET runs a PIO init.
                pio_send(&mut c, CTXT, 0, 0xC1, 0x80_0014, 1000);
                assert!(c.take_launches().is_empty(), "{what}");
                w(&mut c, SEND_EGRESS_ERR_INFO, info);
                assert_eq!(c.read(SEND_EGRESS_ERR_INFO), 0, "{what}: written back, cleared");
            }
        }
    }
}
