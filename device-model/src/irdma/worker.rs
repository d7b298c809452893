//! The CQP worker thread: CQP create/destroy, SQ ring processing, CCQ completions and arming, loopback
//! classification. It owns the CQP and CCQ state; it takes the state lock only to read registers and to
//! publish results, never across a DMA access, and drops results from before a reset (epoch check).
//!
//! Steady-state doorbell processing allocates nothing: WQEs, CQEs and the shadow area live in stack
//! buffers, the queue is a bounded channel of `Copy` messages, and the qhash table has reserved storage.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfio_user_proto::dma::DmaAccess;
use vfio_user_proto::sync::Unpoison;

use super::ccq::{encode_cqe, Ccq, IRDMA_CQ_DBSA_ARM_NEXT, IRDMA_CQ_DBSA_ARM_SEQ_NUM};
use super::classify::classify;
use super::cqp::{Cqp, HostContext, IRDMA_CQP_CTX_SIZE};
use super::loopback::{decode_descriptor, result_word, status_word, LoopbackError, IRDMA_EMU_LB_DESC_SIZE};
use super::observe;
use super::regs::*;
use super::shared::{bump, Shared, State};
use super::wqe::{Command, Manage, Wqe, IRDMA_CQP_WQE_SIZE};
use super::{CreateError, DmaStage, WqeError};
use crate::worker::Stamped;

/// Pause between re-reads of the consumer index while the CCQ is full.
const CCQ_FULL_POLL: Duration = Duration::from_micros(20);

#[derive(Debug, Clone, Copy)]
pub(super) enum Work {
    CqpCreate { ctx_pa: u64 },
    CqpDestroy,
    Doorbell,
    Arm,
    Loopback { desc_pa: u64 },
    Reset,
}

pub(super) struct Worker {
    shared: Arc<Shared>,
    epoch: u64,
    cqp: Option<Cqp>,
    ccq: Option<Ccq>,
}

/// What one WQE produced: the op return value, or the error for its CQE.
type Outcome = Result<u32, WqeError>;

impl Worker {
    pub fn new(shared: Arc<Shared>) -> Self {
        Worker { shared, epoch: 0, cqp: None, ccq: None }
    }

    /// True while no reset happened since this worker last synchronised.
    fn current(&self) -> bool {
        self.shared.epoch.load(Relaxed) == self.epoch && !self.shared.stop.load(Relaxed)
    }

    pub fn handle(&mut self, msg: Stamped<Work>) {
        let epoch = self.look(|st| st.epoch);
        if epoch != self.epoch {
            self.epoch = epoch;
            self.cqp = None;
            self.ccq = None;
        }
        if msg.epoch != self.epoch {
            return;
        }
        let dma = self.shared.dma.read().unpoison().clone();
        match msg.job {
            Work::CqpCreate { ctx_pa } => self.cqp_create(&*dma, ctx_pa),
            Work::CqpDestroy => self.cqp_destroy(),
            Work::Arm => self.arm(&*dma),
            Work::Loopback { desc_pa } => self.loopback(&*dma, desc_pa),
            Work::Doorbell | Work::Reset => {}
        }
        self.process_ring(&*dma);
    }

    /// Reads what the register path wrote: one device step, as what it reads depends on when.
    fn look<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        let probe = &self.shared.probe;
        probe.step_begin();
        let st = self.shared.lock();
        let v = f(&st);
        probe.step_done();
        v
    }

    /// Publishes under the lock if no reset intervened. Returns false when the work is stale. One device
    /// step either way (docs/observe.md, "Record and replay").
    fn publish(&self, f: impl FnOnce(&mut State)) -> bool {
        let probe = &self.shared.probe;
        probe.step_begin();
        let mut st = self.shared.lock();
        let current = st.epoch == self.epoch;
        if current {
            f(&mut st);
            st.cqp = self.cqp;
            st.ccq = self.ccq;
        }
        probe.step_done();
        current
    }

    fn cqp_create(&mut self, dma: &dyn DmaAccess, ctx_pa: u64) {
        let result = self.read_host_context(dma, ctx_pa);
        let c = &self.shared.counters;
        match result {
            Ok(ctx) => {
                bump(&c.cqp_creates);
                self.cqp = Some(Cqp::new(ctx));
                self.ccq = None;
                self.publish(|st| {
                    st.regs.ccqpstatus = IRDMA_CCQPSTATUS_CCQP_DONE.put(1) as u32;
                    st.regs.cqptail = 0;
                    st.regs.cqpdb = 0;
                    st.regs.cqperrcodes = 0;
                });
            }
            Err(e) => {
                bump(&c.cqp_create_errors);
                tracing::warn!("irdma: CQP create failed: {e}");
                let (major, minor) = e.codes();
                self.publish(|st| {
                    st.regs.ccqpstatus = (IRDMA_CCQPSTATUS_CCQP_DONE.put(1) | IRDMA_CCQPSTATUS_CCQP_ERR.put(1)) as u32;
                    st.regs.cqperrcodes = cqperrcodes(major, minor);
                });
            }
        }
    }

    fn read_host_context(&self, dma: &dyn DmaAccess, ctx_pa: u64) -> Result<HostContext, CreateError> {
        if self.cqp.is_some() {
            return Err(CreateError::AlreadyExists);
        }
        let mut bytes = [0u8; IRDMA_CQP_CTX_SIZE];
        if dma.read(ctx_pa, &mut bytes).is_err() {
            bump(&self.shared.counters.dma_errors);
            return Err(CreateError::ContextDma);
        }
        HostContext::decode(&bytes)
    }

    /// Destroying the CQP also forgets the CCQ, which only exists through it.
    fn cqp_destroy(&mut self) {
        bump(&self.shared.counters.cqp_destroys);
        self.cqp = None;
        self.ccq = None;
        self.publish(|st| {
            st.regs.ccqpstatus = 0;
            st.regs.cqpdb = 0;
        });
    }

    /// Executes WQEs from the tail up to the latest CQPDB head.
    fn process_ring(&mut self, dma: &dyn DmaAccess) {
        loop {
            let Some(head) = self.look(|st| (st.epoch == self.epoch).then_some(st.regs.cqpdb)) else { return };
            let Some(cqp) = self.cqp else { return };
            if cqp.tail == head {
                return;
            }
            while self.cqp.is_some_and(|c| c.tail != head) {
                if !self.current() || !self.step(dma) {
                    return;
                }
            }
        }
    }

    /// One WQE. Returns false when processing must pause (stale, CCQ full, WQE not yet valid).
    fn step(&mut self, dma: &dyn DmaAccess) -> bool {
        let Some(cqp) = self.cqp else { return false };
        if let Some(ccq) = self.ccq.as_mut() {
            if let Err(e) = wait_ccq_space(&self.shared, self.epoch, ccq, dma) {
                let (major, minor) = e.codes();
                self.publish(|st| {
                    st.regs.cqptail |= IRDMA_CQPTAIL_CQP_OP_ERR.put(1) as u32;
                    st.regs.cqperrcodes = cqperrcodes(major, minor);
                });
                return false;
            }
        }
        let idx = cqp.tail;
        let mut bytes = [0u8; IRDMA_CQP_WQE_SIZE];
        let outcome = match dma.read(cqp.wqe_addr(idx), &mut bytes) {
            Err(_) => {
                bump(&self.shared.counters.dma_errors);
                Err(WqeError::Dma(DmaStage::WqeFetch))
            }
            Ok(()) => {
                let wqe = Wqe::from_bytes(&bytes);
                if wqe.valid() != cqp.polarity {
                    // Not written yet on this pass: wait for the next doorbell.
                    bump(&self.shared.counters.polarity_stalls);
                    return false;
                }
                let outcome = match observe::injected_failure(&self.shared.probe, wqe.opcode()) {
                    Some(e) => Err(e),
                    None => self.execute(&wqe, dma),
                };
                observe::wqe(&self.shared.probe, idx, wqe.opcode(), &outcome);
                outcome
            }
        };
        self.complete(idx, cqp.ctx.completion_context, outcome, dma)
    }

    fn execute(&mut self, wqe: &Wqe, dma: &dyn DmaAccess) -> Outcome {
        bump(&self.shared.counters.wqes);
        match wqe.decode()? {
            Command::Nop => Ok(0),
            Command::CreateCq(cfg) => {
                if self.ccq.is_some() {
                    return Err(WqeError::CcqExists);
                }
                let ccq = Ccq::new(cfg, self.shared.config.max_ccq_size)?;
                if ccq.probe(dma).is_err() {
                    bump(&self.shared.counters.dma_errors);
                    return Err(WqeError::Dma(DmaStage::CqMemory));
                }
                // From here on completions, this WQE's own included, land in the new CCQ. Published before
                // that CQE: a driver may arm (CQARM) the moment it sees it, as irdma_sc_ccq_create_done lets it.
                self.ccq = Some(ccq);
                self.publish(|_| {});
                Ok(0)
            }
            Command::DestroyCq { cq_id } => {
                if cq_id != super::ccq::IRDMA_CCQ_CQ_ID || self.ccq.is_none() {
                    return Err(WqeError::NoSuchCq(cq_id));
                }
                // Its completion shows in CQPTAIL only, as irdma_cqp_poll_registers expects.
                self.ccq = None;
                Ok(0)
            }
            Command::ManageQhash(op) => {
                // Stale (a reset came): nothing to change, nothing to report.
                let (mut result, mut entries) = (Ok(()), 0);
                if self.publish(|st| {
                    result = match op.manage {
                        Manage::Add => st.qhash.add(op.key, op.data),
                        Manage::Delete => st.qhash.delete(&op.key).map(|_| ()),
                        Manage::Modify => st.qhash.modify(&op.key, op.data),
                    };
                    entries = st.qhash.len();
                }) {
                    observe::qhash(&self.shared.probe, &op, &result, entries);
                }
                result.map(|()| 0)
            }
        }
    }

    /// Writes the CQE (if a CCQ exists), advances the tail, publishes CQPTAIL/CQPERRCODES and raises the
    /// CCQ's vector if it is armed. CQP_OP_ERR is set only for an error no CQE reports.
    fn complete(&mut self, idx: u32, completion_context: u64, outcome: Outcome, dma: &dyn DmaAccess) -> bool {
        let c = &self.shared.counters;
        let mut status = outcome.err().map(|e| e.codes());
        if status.is_some() {
            bump(&c.wqe_errors);
        }
        let probe = self.shared.probe.clone();
        observe::delay_completion(&self.shared, self.epoch);
        if let Some(cqp) = self.cqp.as_mut() {
            cqp.advance();
        }
        let tail = self.cqp.map_or(0, |c| c.tail);
        let stalled = observe::tail_stalled(&probe);
        let cqe = self.ccq.as_ref().and_then(|ccq| {
            let cqe = encode_cqe(ccq.polarity, completion_context, idx, *outcome.as_ref().unwrap_or(&0), status);
            match observe::cqe(&probe, cqe) {
                Some(cqe) => Some((ccq.head, cqe)),
                // Dropped: the WQE counts as executed, nothing reaches the ring.
                None => {
                    observe::cqe_written(&probe, ccq.head, None, true);
                    None
                }
            }
        });
        // One publish per completion, made once it is known whether the CQE reaches the ring and before the
        // driver can see it: the CQE's body is written first (the driver sees nothing until the valid qword),
        // then CQPTAIL, CQPERRCODES and the CCQ's head are published, then the valid qword lands. So a driver
        // that has seen the CQE samples the tail past it, as irdma_sc_ccq_destroy does before it posts and
        // waits for the tail to move; it finds an error CQE's codes in CQPERRCODES (irdma_sc_ccq_get_cqe_info
        // reads them); the control dump shows the device past it; and a CQE that could not be written shows
        // with the tail, CQP_OP_ERR set, never the tail alone.
        let before = self.ccq;
        let mut landing = None;
        if let (Some((slot, cqe)), Some(ccq)) = (cqe, self.ccq.as_mut()) {
            match ccq.write_body(dma, slot, cqe) {
                Ok(()) => {
                    ccq.advance();
                    landing = Some((slot, cqe));
                }
                Err(_) => status = Some(self.cqe_lost(slot)),
            }
        }
        let mut vector = None;
        if let Some(ccq) = self.ccq.as_mut().filter(|q| landing.is_some() && q.armed) {
            ccq.armed = false;
            vector = Some(ccq.cfg.ceq_id);
        }
        let mut target = None;
        let published = self.publish(|st| {
            // An error delivered in a CQE is the driver's already; CQP_OP_ERR flags only errors the CQE
            // could not carry, so irdma_cqp_poll_registers never sees a stale one (§3.9).
            let err = IRDMA_CQPTAIL_CQP_OP_ERR.put(u64::from(status.is_some() && landing.is_none()));
            if !stalled {
                st.regs.cqptail = (IRDMA_CQPTAIL_WQTAIL.put(u64::from(tail)) | err) as u32;
            }
            if let Some((major, minor)) = status {
                st.regs.cqperrcodes = cqperrcodes(major, minor);
            }
            target = vector.map(|ceq| msix_vector(st, ceq, self.shared.config.msix_vectors));
        });
        let Some((slot, cqe)) = landing.filter(|_| published) else { return published };
        let valid = self.ccq.as_ref().map(|ccq| ccq.write_valid(dma, slot, cqe));
        if let Some(Err(_)) = valid {
            // The ring lost its mapping between the CQE's two writes (a client unmapping it under a running
            // CQP): the valid bit never landed, so the head goes back and the loss is flagged as above, in a
            // second publish. Only such a client sees the tail before the flag.
            self.ccq = before;
            let codes = self.cqe_lost(slot);
            return self.publish(|st| {
                if !stalled {
                    st.regs.cqptail |= IRDMA_CQPTAIL_CQP_OP_ERR.put(1) as u32;
                }
                st.regs.cqperrcodes = cqperrcodes(codes.0, codes.1);
            });
        }
        bump(&c.cqes);
        observe::cqe_written(&probe, slot, Some(&cqe), false);
        if vector.is_some() {
            self.raise(target.flatten());
        }
        true
    }

    /// A CQE that did not reach the ring: counted and traced; returns the codes CQPERRCODES then carries.
    fn cqe_lost(&self, slot: u32) -> (u16, u16) {
        let c = &self.shared.counters;
        bump(&c.dma_errors);
        bump(&c.cqe_write_errors);
        observe::cqe_written(&self.shared.probe, slot, None, false);
        WqeError::Dma(DmaStage::CqeWrite).codes()
    }

    /// One device step: whether the vector was masked then shows in the PBA.
    fn raise(&self, vector: Option<u16>) {
        self.shared.probe.step_begin();
        match vector {
            Some(v) => {
                bump(&self.shared.counters.interrupts);
                self.shared.irq.read().unpoison().raise(v);
            }
            None => bump(&self.shared.counters.interrupts_dropped),
        }
        self.shared.probe.step_done();
    }

    /// CQARM for the CCQ: accept the arm if the shadow area says ARM_NEXT; fire at once if CQEs are
    /// already waiting (so an arm after a drain never misses one that raced it).
    fn arm(&mut self, dma: &dyn DmaAccess) {
        let c = &self.shared.counters;
        let Some(ccq) = self.ccq.as_mut() else {
            bump(&c.arms_ignored);
            return;
        };
        let shadow = match ccq.read_shadow(dma) {
            Ok(s) => s,
            Err(_) => {
                bump(&c.dma_errors);
                let (major, minor) = WqeError::Dma(DmaStage::ShadowArea).codes();
                self.publish(|st| st.regs.cqperrcodes = cqperrcodes(major, minor));
                return;
            }
        };
        if !ccq.set_consumer(shadow[0]) {
            bump(&c.bad_consumer_index);
        }
        if !IRDMA_CQ_DBSA_ARM_NEXT.is_set(shadow[4]) {
            bump(&c.arms_ignored);
            self.publish(|_| {});
            return;
        }
        bump(&c.arms);
        ccq.armed = true;
        ccq.arm_seq = IRDMA_CQ_DBSA_ARM_SEQ_NUM.get(shadow[4]) as u8;
        let fire = ccq.unconsumed();
        if fire {
            ccq.armed = false;
        }
        let ceq = ccq.cfg.ceq_id;
        let mut target = None;
        if self.publish(|st| target = msix_vector(st, ceq, self.shared.config.msix_vectors)) && fire {
            self.raise(target);
        }
    }

    fn loopback(&mut self, dma: &dyn DmaAccess, desc_pa: u64) {
        let c = &self.shared.counters;
        let mut bytes = [0u8; IRDMA_EMU_LB_DESC_SIZE];
        let seg = match dma.read(desc_pa, &mut bytes) {
            Ok(()) => decode_descriptor(&bytes),
            Err(_) => {
                bump(&c.dma_errors);
                Err(LoopbackError::Dma)
            }
        };
        self.publish(|st| {
            st.regs.lb_pending = st.regs.lb_pending.saturating_sub(1);
            let pending = st.regs.lb_pending > 0;
            match seg {
                Ok(seg) => {
                    let target = classify(&st.qhash, &seg);
                    st.results.record(seg, target, "loopback");
                    st.regs.lb_result = result_word(&target);
                    st.regs.lb_status = status_word(Ok(()), pending);
                    self.shared.count_target(&target);
                    bump(&c.loopback_ok);
                }
                Err(e) => {
                    st.regs.lb_status = status_word(Err(e), pending);
                    bump(&c.loopback_errors);
                }
            }
            st.regs.lb_seq = st.regs.lb_seq.wrapping_add(1);
        });
    }
}

/// The MSI-X vector of a CQ on `ceq`: GLINT_CEQCTL(ceq).MSIX_INDX, as `icrdma_cfg_ceq` programs it. None
/// (the interrupt is dropped) when the CQ has no CEQ, the CEQ's cause is not enabled (CAUSE_ENA clear, the
/// power-on state) or the vector does not exist.
fn msix_vector(st: &State, ceq: Option<u16>, vectors: u16) -> Option<u16> {
    let ctl = u64::from(*st.regs.ceqctl.get(usize::from(ceq?))?);
    if !IRDMA_GLINT_CEQCTL_CAUSE_ENA.is_set(ctl) {
        return None;
    }
    let vector = IRDMA_GLINT_CEQCTL_MSIX_INDX.get(ctl);
    u16::try_from(vector).ok().filter(|v| *v < vectors)
}

/// Makes sure the next CQE has a free slot, re-reading the consumer index for up to `ccq_full_wait`.
fn wait_ccq_space(shared: &Shared, epoch: u64, ccq: &mut Ccq, dma: &dyn DmaAccess) -> Result<(), WqeError> {
    if ccq.has_space() {
        return Ok(());
    }
    let deadline = Instant::now() + shared.config.ccq_full_wait;
    let mut counted = false;
    loop {
        match ccq.read_shadow(dma) {
            Ok(shadow) => {
                if !ccq.set_consumer(shadow[0]) {
                    bump(&shared.counters.bad_consumer_index);
                }
            }
            Err(_) => {
                bump(&shared.counters.dma_errors);
                return Err(WqeError::Dma(DmaStage::ShadowArea));
            }
        }
        if ccq.has_space() {
            return Ok(());
        }
        if shared.epoch.load(Relaxed) != epoch || shared.stop.load(Relaxed) {
            // Reset or shutdown: the caller's publish is dropped, so nothing is counted.
            return Err(WqeError::CcqFull);
        }
        if !counted {
            bump(&shared.counters.ccq_full_waits);
            counted = true;
        }
        if Instant::now() >= deadline {
            bump(&shared.counters.ccq_overflows);
            return Err(WqeError::CcqFull);
        }
        std::thread::sleep(CCQ_FULL_POLL);
    }
}
