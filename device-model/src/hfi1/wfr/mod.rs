//! The real chip's personality ("WFR", PCI 8086:24f0): the CSR blocks outside the RXE that the stock Linux hfi1
//! driver touches when it probes the chip, opens user contexts and tears down (docs/hfi1-kernel-driver.md).
//!
//! Each block lives in its own module and claims the offsets whose behaviour it models; every other offset is
//! storage with its reset value, so the register file as a whole is what a FLR restores. The RXE (receive
//! contexts, flow tables, RcvArray) stays in `hfi1::rxe`; this module never sees those offsets it models.

#![forbid(unsafe_code)]

mod asic;
mod cce;
pub mod csr;
mod dc;
mod errs;
mod misc;
pub mod names;
pub mod pio;
pub mod sdma;
mod send_check;
mod shape;
mod storage;
mod txe;

pub use sdma::{SEND_DMA_STATUS_ENG_CLEANED_UP_SMASK, SEND_DMA_STATUS_ENG_HALTED_SMASK};

use crate::hfi1::cable::{LinkEvent, Phy};
use csr::*;

pub use shape::{
    Icode, Raised, WfrShape, CCE_MSIX_PBA, CCE_NUM_MSIX_VECTORS, DC_DC8051_INT, IS_DC_START, IS_RCVAVAIL_START,
    IS_RCVURGENT_START, IS_SDMAENG_ERR_START, IS_SENDCREDIT_START, NUM_INTERRUPT_SOURCES, PCIE_CFG_REG_PL_BASE,
    PCIE_CFG_REG_PL_LEN, TXE_NUM_CONTEXTS, TXE_NUM_SDMA_ENGINES, TXE_PIO_SEND, TXE_PIO_SIZE, WFR_BAR0_SIZE,
};

/// The CSR file of the chip outside the RXE.
pub struct Wfr {
    shape: WfrShape,
    cce: cce::Cce,
    asic: asic::Asic,
    dc: dc::Dc,
    misc: misc::Misc,
    txe: txe::Txe,
    pio: pio::Pio,
    sdma: sdma::Sdma,
    /// Engines with descriptors to walk since the last access (a bit per engine).
    sdma_pending: u32,
    errs: errs::ErrGroups,
    /// Every other register the kernel names: offset to value; absent offsets hold their reset value.
    storage: storage::Storage,
    /// Accesses to offsets that no table names, since reset (a gap in the model).
    unnamed: u64,
}

impl Wfr {
    pub fn new(shape: WfrShape) -> Self {
        Wfr {
            shape,
            cce: cce::Cce::new(shape.icode),
            asic: asic::Asic::default(),
            dc: dc::Dc::new(shape.icode.needs_firmware()),
            misc: misc::Misc::default(),
            txe: txe::Txe::new(&shape),
            pio: pio::Pio::new(&shape),
            sdma: sdma::Sdma::new(&shape),
            sdma_pending: 0,
            errs: errs::ErrGroups::default(),
            storage: storage::Storage::default(),
            unnamed: 0,
        }
    }

    pub fn shape(&self) -> &WfrShape {
        &self.shape
    }

    /// Power-on state (and what a FLR leaves): identity and size registers keep their values. Returns the
    /// link loss to tell the cable if the port was polling or up.
    #[must_use]
    pub fn reset(&mut self) -> Option<Phy> {
        self.dc.reset_8051(false);
        let signal = self.dc.take_signal();
        *self = Wfr::new(self.shape);
        signal
    }

    /// What the port has to tell the cable since the last access.
    pub fn take_signal(&mut self) -> Option<Phy> {
        self.dc.take_signal()
    }

    /// Whether the physical link is up.
    pub fn link_up(&self) -> bool {
        self.dc.link_up()
    }

    /// The cable's news for the 8051: `None` if it no longer applies, else the MSI-X vectors to send (the
    /// 8051's SET_BY_8051 interrupt, source IS_DC_START + 2, when DC_DC8051_ERR_EN lets it through).
    pub fn link_event(&mut self, event: LinkEvent) -> Option<Vec<u16>> {
        self.dc.link_event(event)?;
        Some(self.interrupt_8051())
    }

    /// The 8051 posted a host message: SET_BY_8051, and its interrupt if enabled.
    fn interrupt_8051(&mut self) -> Vec<u16> {
        self.errs.set(DC_DC8051_ERR_FLG, dc::DC_DC8051_ERR_FLG_SET_BY_8051_SMASK);
        let flg = self.errs.read(DC_DC8051_ERR_FLG).unwrap_or(0);
        if flg & self.stored(DC_DC8051_ERR_EN) == 0 {
            return Vec::new();
        }
        self.cce.raise(IS_DC_START + DC_DC8051_INT).into_iter().collect()
    }

    /// This port's VerifyCap frame, for the neighbour.
    pub fn verify_cap_frame(&self) -> crate::hfi1::cable::VerifyCapFrame {
        self.dc.verify_cap_frame()
    }

    /// Packets and credit returns the send contexts have for the worker.
    pub fn take_launches(&mut self) -> Vec<pio::Launch> {
        self.pio.take_launches()
    }

    /// Engines that have descriptors to walk since the last call (a bit per engine).
    pub fn take_sdma_pending(&mut self) -> u32 {
        std::mem::take(&mut self.sdma_pending)
    }

    /// The send engines' state, which the SDMA walk (`sdma::walk`) works on directly.
    pub(in crate::hfi1) fn sdma(&mut self) -> &mut sdma::Sdma {
        &mut self.sdma
    }

    /// Runs `f` on the send engines' state with the error groups a halt sets (the walk making a walk, or
    /// failing one); the MSI-X vectors of the sources `f` raised.
    pub(in crate::hfi1) fn sdma_raising<T>(
        &mut self,
        f: impl FnOnce(&mut sdma::Sdma, &mut errs::ErrGroups, &mut Raised) -> T,
    ) -> (T, Vec<u16>) {
        let mut raised = Raised::default();
        let out = f(&mut self.sdma, &mut self.errs, &mut raised);
        (out, self.deliver(raised))
    }

    /// The MSI-X vectors of the sources in `raised` that are due (CCE_INT_MAP).
    fn deliver(&mut self, raised: Raised) -> Vec<u16> {
        raised.0.into_iter().filter_map(|s| self.cce.raise(s)).collect()
    }

    /// Whether launches wait for the worker.
    pub fn launches_pending(&self) -> bool {
        self.pio.pending()
    }

    /// The worker is done with `launch`: the credit return to DMA, if any.
    pub fn credit_returned(&mut self, launch: &pio::Launch) -> Option<pio::CreditReturn> {
        self.pio.returned(launch)
    }

    /// Raises interrupt `source`; the vector to send if that made it pending and unmasked.
    pub fn raise(&mut self, source: u32) -> Option<u16> {
        self.cce.raise(source)
    }

    /// The receive DLID filter (DCC_CFG_PORT_CONFIG1, set_lidlmc): the packet's DLID matches the port's LID
    /// in the bits of the mask. The permissive LID and multicast LIDs always pass (OPA's 9B DLID space).
    pub fn dlid_accepts(&self, dlid: u16) -> bool {
        use crate::hfi1::cable::wire::{LID_MULTICAST_BASE, LID_PERMISSIVE};
        if dlid == LID_PERMISSIVE || dlid >= LID_MULTICAST_BASE {
            return true;
        }
        let c1 = self.stored(DCC_CFG_PORT_CONFIG1);
        let target = c1 & dc::DCC_CFG_PORT_CONFIG1_TARGET_DLID_MASK;
        let mask = (c1 >> dc::DCC_CFG_PORT_CONFIG1_DLID_MASK_SHIFT) & dc::DCC_CFG_PORT_CONFIG1_DLID_MASK_MASK;
        (u64::from(dlid) ^ target) & mask == 0
    }

    /// A storage register's value.
    fn stored(&self, offset: u64) -> u64 {
        self.storage.get(offset).unwrap_or_else(|| reset_value(offset))
    }

    /// Accesses to offsets no table names, since reset.
    pub fn unnamed(&self) -> u64 {
        self.unnamed
    }

    /// A 64-bit read at the 8-byte-aligned `offset` (outside the RXE).
    pub fn read(&mut self, offset: u64) -> u64 {
        if offset >= TXE_PIO_SEND {
            // The send buffers are write-only; reads return 0.
            return 0;
        }
        let shape = &self.shape;
        let v = self
            .cce
            .read(offset)
            .or_else(|| self.asic.read(offset))
            .or_else(|| self.dc.read(offset, shape))
            .or_else(|| self.misc.read(offset))
            .or_else(|| self.pio.read(offset))
            .or_else(|| self.sdma.read(offset))
            .or_else(|| self.txe.read(offset, shape))
            .or_else(|| self.errs.read(offset));
        match v {
            Some(v) => v,
            None => {
                self.note_unnamed(offset);
                self.stored(offset)
            }
        }
    }

    /// A 64-bit write at the 8-byte-aligned `offset` (outside the RXE). Returns the MSI-X vectors the
    /// write made due: sources it raised or forced, or unmasked while pending, on the vectors CCE_INT_MAP
    /// gives them. The caller sends them once it has dropped its locks.
    pub fn write(&mut self, offset: u64, value: u64) -> Vec<u16> {
        if offset >= TXE_PIO_SEND {
            let mut raised = Raised::default();
            self.pio.buffer_write(offset - TXE_PIO_SEND, value, &mut self.errs, &mut raised);
            let mut vectors = self.deliver(raised);
            vectors.extend(self.disallowed_vectors());
            return vectors;
        }
        if offset == SEND_PIO_INIT_CTXT {
            self.pio.init(value);
        }
        if offset == CCE_CTRL && value & cce::CCE_CTRL_SPC_UNFREEZE_SMASK != 0 {
            self.sdma.unfreeze();
        }
        let mut raised = Raised::default();
        let handled = self.cce.write(offset, value)
            || self.asic.write(offset, value)
            || self.dc.write(offset, value)
            || self.misc.write(offset, value, self.dc.code())
            || self.pio.write(offset, value)
            || match self.sdma.write(offset, value, &mut self.errs, &mut raised) {
                Some(pending) => {
                    if let Some(e) = pending {
                        self.sdma_pending |= 1 << e;
                    }
                    true
                }
                None => false,
            }
            || self.txe.write(offset, value)
            || self.errs.write(offset, value);
        if !handled {
            self.note_unnamed(offset);
            self.storage.write(offset, value);
            self.note_send_checks(offset);
            // Holding the DC in reset resets the 8051 and its RAMs (init_chip keeps it there across the FLR).
            if offset == CCE_DC_CTRL && value & CCE_DC_CTRL_DC_RESET_SMASK != 0 {
                self.dc.reset_8051(false);
            }
            // Out of core reset, the 8051 starts the code the security engine passed (load_8051_firmware, dc_start).
            if offset == DC_DC8051_CFG_RST && value & dc::DC_DC8051_CFG_RST_M8051W_SMASK == 0 {
                self.dc.release(self.misc.authorised());
            }
        }
        // A run reports its errors, and the engine keeps them high through a clear (firmware.c run_rsa).
        if offset == MISC_CFG_RSA_CMD || offset == MISC_ERR_CLEAR {
            self.errs.set(MISC_ERR_STATUS, self.misc.held_errors());
        }
        let mut vectors: Vec<u16> = raised.0.into_iter().filter_map(|s| self.cce.raise(s)).collect();
        vectors.extend(self.cce.take_deliverable());
        // A host command the 8051 relays to the LCB: the LCB is this chip's, reached as the host would.
        match self.dc.take_lcb_request() {
            Some(dc::LcbAccess::Read(at)) => {
                let v = self.read(at);
                self.dc.complete_lcb(Some(v));
            }
            Some(dc::LcbAccess::Write(at, v)) => {
                vectors.extend(self.write(at, v));
                self.dc.complete_lcb(None);
            }
            None => {}
        }
        if self.dc.take_posted() {
            vectors.extend(self.interrupt_8051());
        }
        vectors
    }

    /// After a write at `offset`: where it was HOST_CMD_0 and the 8051 replied, a `dc8051-reply` fault of the
    /// command's type edits the reply the driver polls (docs/observe.md, "Faults").
    pub fn hostile_8051_reply(&mut self, offset: u64, probe: &crate::probe::Probe) {
        use crate::fault::FaultKind;
        if offset != DC_DC8051_CFG_HOST_CMD_0 || !probe.faults.armed(FaultKind::Dc8051Reply) {
            return;
        }
        let Some(kind) = self.dc.take_replied() else { return };
        if let Some(f) = probe.fault(FaultKind::Dc8051Reply, |p| p.cmd.is_none_or(|c| c == kind)) {
            self.dc.set_reply(f.params.edit(self.dc.reply()));
        }
    }

    /// A write to a send context's check registers, or to SEND_BTH_QP, which every context's KDETH checks read:
    /// the send contexts see the registers as they are now (send_check.rs).
    fn note_send_checks(&mut self, offset: u64) {
        let contexts = u64::from(self.shape.send_contexts);
        let changed = if offset == SEND_BTH_QP {
            0..contexts
        } else {
            let Some(rel) = offset.checked_sub(SEND_CTXT_CHECK_ENABLE) else { return };
            let (c, reg) = (rel / SEND_CTXT_STRIDE, SEND_CTXT_CHECK_ENABLE + rel % SEND_CTXT_STRIDE);
            let check = matches!(
                reg,
                SEND_CTXT_CHECK_ENABLE
                    | SEND_CTXT_CHECK_JOB_KEY
                    | SEND_CTXT_CHECK_OPCODE
                    | SEND_CTXT_CHECK_VL
                    | SEND_CTXT_CHECK_PARTITION_KEY
                    | SEND_CTXT_CHECK_SLID
            );
            if c >= contexts || !check {
                return;
            }
            c..c + 1
        };
        for c in changed {
            let at = |base: u64| base + SEND_CTXT_STRIDE * c;
            let checks = send_check::SendChecks {
                enable: self.stored(at(SEND_CTXT_CHECK_ENABLE)),
                job_key: self.stored(at(SEND_CTXT_CHECK_JOB_KEY)),
                opcode: self.stored(at(SEND_CTXT_CHECK_OPCODE)),
                partition_key: self.stored(at(SEND_CTXT_CHECK_PARTITION_KEY)),
                slid: self.stored(at(SEND_CTXT_CHECK_SLID)),
                vl: self.stored(at(SEND_CTXT_CHECK_VL)),
                bth_qp: self.stored(SEND_BTH_QP),
            };
            self.pio.set_checks(c as usize, checks);
        }
    }

    /// Send contexts a disallowed packet halted: SEND_CTXT_ERR_STATUS.PIO_DISALLOWED_PACKET_ERR, the failed
    /// check in SEND_EGRESS_ERR_INFO, and the context's error interrupt (chip.c is_sendctxt_err_int reads them
    /// in that order); the MSI-X vectors due.
    pub fn disallowed_vectors(&mut self) -> Vec<u16> {
        let mut raised = Raised::default();
        for (c, info) in self.pio.take_disallowed() {
            let status = SEND_CTXT_ERR_STATUS + SEND_CTXT_STRIDE * u64::from(c);
            self.errs.set(status, pio::SEND_CTXT_ERR_STATUS_PIO_DISALLOWED_PACKET_ERR_SMASK);
            self.errs.set(SEND_EGRESS_ERR_INFO, info);
            raised.raise(shape::IS_SENDCTXT_ERR_START + c);
        }
        self.deliver(raised)
    }

    fn note_unnamed(&mut self, offset: u64) {
        if !names::is_named(offset) {
            self.unnamed += 1;
            tracing::debug!("hfi1-wfr: access to {offset:#x}, which the chip's register list does not name");
        }
    }

    /// State for the control socket's dump.
    pub fn dump(&self) -> serde_json::Value {
        let mut storage: Vec<(u64, u64)> = self.storage.iter().collect();
        storage.sort_unstable();
        serde_json::json!({
            "shape": {
                "send_contexts": self.shape.send_contexts,
                "sdma_engines": self.shape.sdma_engines,
                "pio_mem_size": self.shape.pio_mem_size,
                "sdma_mem_size": self.shape.sdma_mem_size,
                "guid": format!("{:#018x}", self.shape.guid),
            },
            "cce": self.cce.dump(),
            "dc8051": self.dc.dump(),
            "security": self.misc.dump(),
            "sdma": self.sdma.dump(),
            "pio": self.pio.dump(),
            "unnamed_accesses": self.unnamed,
            "storage_entries": self.storage.len(),
            "storage_bytes": self.storage.footprint(),
            "storage_dropped": self.storage.dropped(),
            "storage": storage.iter().filter(|(_, v)| *v != 0).map(|&(o, v)| serde_json::json!({
                "offset": format!("{o:#x}"),
                "name": names::name(o),
                "value": format!("{v:#x}"),
            })).collect::<Vec<_>>(),
        })
    }
}

/// Power-on values of the storage registers that are not zero: what the driver's reset_*_csrs write as
/// "chip reset defaults" (chip.c) and the DC's link state.
fn reset_value(offset: u64) -> u64 {
    match offset {
        CCE_DC_CTRL => CCE_DC_CTRL_RESETCSR,
        ASIC_EEP_CTL_STAT => ASIC_EEP_CTL_STAT_RESETCSR,
        SEND_CM_CTRL => SEND_CM_CTRL_RESETCSR,
        SEND_CM_GLOBAL_CREDIT => SEND_CM_GLOBAL_CREDIT_RESETCSR,
        _ => 0,
    }
}

/// Per-send-context CSRs are spaced by 0x100 (write_kctxt_csr).
const SEND_CTXT_STRIDE: u64 = 0x100;

pub const CCE_DC_CTRL_DC_RESET_SMASK: u64 = 0x1;
pub const CCE_DC_CTRL_RESETCSR: u64 = CCE_DC_CTRL_DC_RESET_SMASK;
pub const ASIC_EEP_CTL_STAT_RESETCSR: u64 = 0x8381_8000;
pub const SEND_CM_CTRL_RESETCSR: u64 = 0x20;
pub const SEND_CM_GLOBAL_CREDIT_RESETCSR: u64 = 0x0000_0940_0003_0000;

#[cfg(test)]
mod tests;
