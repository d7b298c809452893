//! Differential testing: the kernel's ctrl.c and udriver run the same case against identical fake
//! devices; after every step their results, ring states and device-visible traces must be equal.
//!
//! A trace holds every register read and write, and the watched queue memory (host context, the SQ slot
//! being built, the CCQ shadow area) at every `dma_wmb()` and register write. Equal traces mean equal WQE
//! and context bytes, equal register sequences, and the same store order as far as a device can tell:
//! the barrier and the doorbell see the same memory. Each WQE is also checked against the rule itself
//! (zeroed slot, body, barrier, then the valid header, then the doorbell), on both sides.
//!
//! One difference is normalised, a documented decision (docs/kernel-conformance.md): a `dma_wmb()`
//! directly before a register write, with no store between, is dropped: the kernel relies on `writel()`'s
//! own ordering (ctrl.c irdma_sc_cqp_create: `writel(p1, ...CCQPHIGH)` right after the host-context
//! stores), udriver issues an explicit barrier.

#![forbid(unsafe_code)]

pub mod case;
pub mod fake;
pub mod sides;

use std::fmt::Debug;

use thiserror::Error;

pub use case::{Case, Consume, Step};
use fake::{Event, CQPDB};
use sides::{KernelSide, Region, Rig, Side, UdriverSide};

/// defs.h: an opcode none of the cases posts, for polls that wait for the wrong one.
const IRDMA_CQP_OP_NOP: u8 = 0x24;
/// CQE qw3 (defs.h IRDMA_CQ_*).
const CQ_VALID: u32 = 63;
const CQ_ERROR: u32 = 55;
const CQ_WQEIDX_SHIFT: u32 = 32;
const CQ_MAJERR_SHIFT: u32 = 16;
const WQEVALID: u32 = 63;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DiffError {
    #[error("step {step} ({what}): kernel {kernel}, udriver {udriver}")]
    Differs { step: usize, what: String, kernel: String, udriver: String },
    #[error("step {step} ({what}): {side} broke the WQE publication rule: {why}")]
    Order { step: usize, what: String, side: &'static str, why: String },
    #[error("the kernel code or the shim reported: {0:?}")]
    KernelBug(Vec<String>),
    #[error("setting up the case failed: {0}")]
    Setup(String),
}

/// What a case exercised (for the runs' summary).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    pub steps: usize,
    pub wqes: usize,
    pub cqes: usize,
    pub error_cqes: usize,
    pub sq_full: usize,
    /// Cases whose CQP was created (1 or 0 for one case).
    pub cqps_created: usize,
}

impl Coverage {
    pub const ZERO: Coverage = Coverage { steps: 0, wqes: 0, cqes: 0, error_cqes: 0, sq_full: 0, cqps_created: 0 };

    pub fn add(&mut self, o: &Coverage) {
        self.steps += o.steps;
        self.wqes += o.wqes;
        self.cqes += o.cqes;
        self.error_cqes += o.error_cqes;
        self.sq_full += o.sq_full;
        self.cqps_created += o.cqps_created;
    }
}

/// What a step does, for its error messages: formatted only when one is reported. Formatted up front, the
/// descriptions (a quad-hash entry's every field) cost the fuzz target as much as a step's kernel code.
struct What(Box<dyn Fn() -> String>);

impl What {
    fn lazy(f: impl Fn() -> String + 'static) -> Self {
        What(Box::new(f))
    }

    fn text(&self) -> String {
        (self.0)()
    }
}

impl From<&'static str> for What {
    fn from(s: &'static str) -> Self {
        What::lazy(move || s.to_owned())
    }
}

struct Run {
    k: KernelSide,
    u: UdriverSide,
    step: usize,
    what: What,
    cov: Coverage,
    /// The device's CCQ producer position and valid bit.
    dev_head: u32,
    dev_pol: u64,
    ccq_size: u32,
}

/// Drops barriers that change nothing before a register write (see the module comment).
fn normalize(events: Vec<Event>) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::with_capacity(events.len());
    for e in events.into_iter() {
        if let Event::Write { mem, .. } = &e {
            if matches!(out.last(), Some(Event::Wmb { mem: m }) if m == mem) {
                out.pop();
            }
        }
        out.push(e);
    }
    out
}

fn qword(b: &[u8], i: usize) -> u64 {
    b.get(8 * i..8 * i + 8).map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
}

/// The rule every CQP WQE builder follows (ctrl.c: IRDMA_CQP_INIT_WQE, the body, `dma_wmb()`, then
/// `set_64bit_val(wqe, 24, hdr)`), as the device sees it: at the barrier the slot holds the final body and
/// a zero header; the final header carries the valid bit; a doorbell sees the whole WQE. (A qword left
/// unzeroed shows as the two sides' different poison patterns in the WQE comparison.)
fn check_publication(events: &[Event], slot_watch: usize, final_slot: &[u8], polarity: u8) -> Result<(), String> {
    let wmbs: Vec<&fake::Mem> =
        events.iter().filter_map(|e| if let Event::Wmb { mem } = e { Some(mem) } else { None }).collect();
    let [at_barrier] = wmbs.as_slice() else { return Err(format!("{} barriers, not 1", wmbs.len())) };
    let at_barrier = at_barrier.get(slot_watch).ok_or("slot not watched")?;
    for i in 0..8 {
        let (b, f) = (qword(at_barrier, i), qword(final_slot, i));
        if i == 3 && b != 0 {
            return Err(format!("header {b:#x} stored before the barrier"));
        }
        if i != 3 && b != f {
            return Err(format!("qword {i} stored after the barrier ({b:#x} -> {f:#x})"));
        }
    }
    let hdr = qword(final_slot, 3);
    if (hdr >> WQEVALID) & 1 != u64::from(polarity) {
        return Err(format!("header {hdr:#x} has not the valid bit {polarity}"));
    }
    for e in events {
        if let Event::Write { off: CQPDB, mem, .. } = e {
            if mem.get(slot_watch) != Some(final_slot) {
                return Err("the doorbell rang before the WQE was complete".into());
            }
        }
    }
    Ok(())
}

impl Run {
    fn same<T: PartialEq + Debug>(&self, what: impl std::fmt::Display, k: T, u: T) -> Result<(), DiffError> {
        if k == u {
            return Ok(());
        }
        Err(DiffError::Differs {
            step: self.step,
            what: format!("{}: {what}", self.what.text()),
            kernel: format!("{k:?}"),
            udriver: format!("{u:?}"),
        })
    }

    fn begin(&mut self, what: What, regions: &[Region]) {
        self.step += 1;
        self.what = what;
        self.k.trace().set_watches(regions.iter().map(|r| self.k.watch(*r)).collect());
        self.u.trace().set_watches(regions.iter().map(|r| self.u.watch(*r)).collect());
    }

    /// Compares the step's traces and ring states; returns the kernel's (normalised) events.
    fn end(&mut self) -> Result<Vec<Event>, DiffError> {
        let ke = normalize(self.k.trace().take());
        let ue = normalize(self.u.trace().take());
        if ke != ue {
            let i = ke.iter().zip(&ue).take_while(|(a, b)| a == b).count();
            self.same(
                format_args!("trace from event {i}"),
                ke.get(i..).unwrap_or_default(),
                ue.get(i..).unwrap_or_default(),
            )?;
        }
        self.same("rings", self.k.rings(), self.u.rings())?;
        let bugs = self.k.take_bugs();
        if !bugs.is_empty() {
            return Err(DiffError::KernelBug(bugs));
        }
        Ok(ke)
    }

    fn regions(&self) -> Vec<Region> {
        let head = self.k.rings().sq_head;
        vec![Region::HostCtx, Region::SqSlot(head), Region::Shadow]
    }

    /// Builds one WQE on both sides and checks it.
    fn wqe_step(&mut self, what: What, f: impl Fn(&mut dyn Side) -> i32) -> Result<i32, DiffError> {
        let head = self.k.rings().sq_head;
        let before = self.k.read_region(Region::SqSlot(head));
        self.k.poison_slot(head);
        self.u.poison_slot(head);
        let regions = self.regions();
        self.begin(what, &regions);
        let (rk, ru) = (f(&mut self.k), f(&mut self.u));
        self.same("return", rk, ru)?;
        if rk != 0 {
            // The builder did not take the slot: give it back its contents (the same on both sides).
            if let Some(b) = &before {
                let qw: [u64; 8] = std::array::from_fn(|i| qword(b, i));
                self.k.fill_slot(head, &qw);
                self.u.fill_slot(head, &qw);
            }
        }
        let ke = self.end()?;
        if rk == -libc::ENOMEM {
            self.cov.sq_full += 1;
        }
        if rk != 0 {
            return Ok(rk);
        }
        self.cov.wqes += 1;
        let (ks, us) = (self.k.read_region(Region::SqSlot(head)), self.u.read_region(Region::SqSlot(head)));
        self.same(format_args!("WQE {head}"), &ks, &us)?;
        let polarity = self.k.rings().polarity;
        if let Some(slot) = &ks {
            check_publication(&ke, 1, slot, polarity).map_err(|why| DiffError::Order {
                step: self.step,
                what: self.what.text(),
                side: "kernel",
                why,
            })?;
        }
        Ok(rk)
    }

    fn simple(&mut self, what: What, f: impl Fn(&mut dyn Side) -> i32) -> Result<i32, DiffError> {
        let regions = self.regions();
        self.begin(what, &regions);
        let (rk, ru) = (f(&mut self.k), f(&mut self.u));
        self.same("return", rk, ru)?;
        self.end()?;
        Ok(rk)
    }

    /// The device completes the oldest outstanding WQE into both CCQs (qw0-2, then qw3 with the valid bit).
    fn device_completes(&mut self, error: bool, maj: u16, min: u16, op_ret_val: u32) -> bool {
        let r = self.k.rings();
        if r.sq_tail == r.sq_head || self.ccq_size == 0 {
            return false;
        }
        let qw3 = (self.dev_pol << CQ_VALID)
            | (u64::from(error) << CQ_ERROR)
            | (u64::from(r.sq_tail) << CQ_WQEIDX_SHIFT)
            | (u64::from(maj) << CQ_MAJERR_SHIFT)
            | u64::from(min);
        let ctx = self.k.contexts().cqp;
        for s in [&self.k as &dyn Side, &self.u] {
            s.write_cqe(self.dev_head, [0, ctx, u64::from(op_ret_val), qw3]);
        }
        self.dev_head = (self.dev_head + 1) % self.ccq_size;
        if self.dev_head == 0 {
            self.dev_pol ^= 1;
        }
        self.cov.cqes += 1;
        self.cov.error_cqes += usize::from(error);
        true
    }

    fn consume(&mut self, what: What, consume: Consume) -> Result<(), DiffError> {
        let op = {
            let r = self.k.rings();
            let slot = self.k.read_region(Region::SqSlot(r.sq_tail)).unwrap_or_default();
            ((qword(&slot, 3) >> 32) & 0x3F) as u8
        };
        let regions = self.regions();
        self.begin(what, &regions);
        let run = |s: &mut dyn Side| match consume {
            Consume::GetCqeInfo => s.get_cqe_info(),
            Consume::PollMatching => s.poll_for_cqp_op_done(op),
            Consume::PollOther => s.poll_for_cqp_op_done(if op == IRDMA_CQP_OP_NOP { 0x01 } else { IRDMA_CQP_OP_NOP }),
        };
        let (k, u) = (run(&mut self.k), run(&mut self.u));
        self.same("CQE (return, info)", k, u)?;
        self.end()?;
        Ok(())
    }

    fn step(&mut self, i: usize, s: &Step) -> Result<(), DiffError> {
        self.cov.steps += 1;
        match *s {
            Step::Qhash { q, post_sq } => {
                let scratch = 0x1000 + i as u64;
                self.wqe_step(What::lazy(move || format!("qhash {q:?} post_sq {post_sq}")), |d| {
                    d.qhash(&q, scratch, post_sq)
                })?;
            }
            Step::Complete { error, maj, min, op_ret_val, consume } => {
                if self.device_completes(error, maj, min, op_ret_val) {
                    self.consume(
                        What::lazy(move || format!("CQE error {error} {maj:#x}/{min:#x} by {consume:?}")),
                        consume,
                    )?;
                } else {
                    self.consume("CQE poll, nothing outstanding".into(), Consume::GetCqeInfo)?;
                }
            }
            Step::PollEmpty => self.consume("CQE poll, nothing new".into(), Consume::GetCqeInfo)?,
            Step::Arm => {
                self.simple("irdma_sc_ccq_arm".into(), |d| {
                    d.ccq_arm();
                    0
                })?;
            }
            Step::CfgCeq { ceq_id, idx, enable } => {
                self.simple(What::lazy(move || format!("irdma_cfg_ceq({ceq_id}, {idx}, {enable})")), |d| {
                    d.cfg_ceq(ceq_id, idx, enable)
                })?;
            }
            Step::PostSq => {
                self.simple("irdma_sc_cqp_post_sq".into(), |d| {
                    d.post_sq();
                    0
                })?;
            }
        }
        Ok(())
    }
}

thread_local! {
    /// The two sides' rigs, kept for the thread's next case while they come back idle.
    static RIGS: std::cell::RefCell<Option<(Rig, Rig)>> = const { std::cell::RefCell::new(None) };
}

/// Runs one case on both drivers. `Ok` means no difference anywhere.
pub fn run_case(case: &Case) -> Result<Coverage, DiffError> {
    let (rk, ru) = RIGS.with(|r| r.borrow_mut().take()).unwrap_or_default();
    let result = run_case_on(&rk, &ru, case);
    if rk.end_case() & ru.end_case() {
        RIGS.with(|r| *r.borrow_mut() = Some((rk, ru)));
    }
    result
}

fn run_case_on(rk: &Rig, ru: &Rig, case: &Case) -> Result<Coverage, DiffError> {
    let k = KernelSide::new(rk, case.create, case.max_done_count).map_err(DiffError::Setup)?;
    let u = UdriverSide::new(ru, case.create, case.max_done_count, k.contexts());
    let mut r = Run { k, u, step: 0, what: "".into(), cov: Coverage::default(), dev_head: 0, dev_pol: 1, ccq_size: 0 };

    if r.simple("irdma_sc_dev_init".into(), |d| d.dev_init())? != 0 {
        return Ok(r.cov);
    }
    let cqp = case.cqp;
    if r.simple(What::lazy(move || format!("irdma_sc_cqp_init {cqp:?}")), |d| d.cqp_init(&cqp))? != 0 {
        return Ok(r.cov);
    }
    r.begin("irdma_sc_cqp_create".into(), &[Region::HostCtx]);
    let (kc, uc) = (r.k.cqp_create(), r.u.cqp_create());
    r.same("return, maj, min", kc, uc)?;
    r.end()?;
    r.same("host context", r.k.read_region(Region::HostCtx), r.u.read_region(Region::HostCtx))?;
    if kc.0 != 0 {
        return Ok(r.cov);
    }
    r.cov.cqps_created = 1;

    let ccq = case.ccq;
    if r.simple(What::lazy(move || format!("irdma_sc_ccq_init {ccq:?}")), |d| d.ccq_init(&ccq))? == 0 {
        r.ccq_size = ccq.num_elem;
        r.wqe_step("irdma_sc_ccq_create (CREATE_CQ WQE)".into(), |d| d.ccq_create(0, ccq.check_overflow))?;
        r.simple("irdma_sc_cqp_post_sq".into(), |d| {
            d.post_sq();
            0
        })?;
        let (error, maj, min) = case.ccq_create_error.map_or((false, 0, 0), |(a, b)| (true, a, b));
        r.device_completes(error, maj, min, 0);
        r.consume(What::lazy(move || format!("CREATE_CQ completion error {error}")), Consume::PollMatching)?;

        for (i, s) in case.steps.iter().enumerate() {
            r.step(i, s)?;
        }
        if let Some(codes) = case.destroy_op_err {
            r.k.fake().set_op_err(codes);
            r.u.fake().set_op_err(codes);
        }
        r.wqe_step("irdma_sc_ccq_destroy (DESTROY_CQ WQE, register polling)".into(), |d| d.ccq_destroy(0xD))?;
    }
    r.simple("irdma_sc_cqp_destroy".into(), |d| d.cqp_destroy())?;
    Ok(r.cov)
}

#[cfg(test)]
mod tests {
    use super::fake::{Mem, CQPERRCODES};
    use super::*;

    fn slot(q: [u64; 8]) -> Vec<u8> {
        q.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
    fn mem(q: [u64; 8]) -> Mem {
        Mem::of(&[&[], &slot(q)]).unwrap_or_else(|| panic!("two regions of at most 64 bytes"))
    }
    fn wmb(q: [u64; 8]) -> Event {
        Event::Wmb { mem: mem(q) }
    }
    fn db(q: [u64; 8]) -> Event {
        Event::Write { off: CQPDB, val: 1, mem: mem(q) }
    }

    /// A case on rigs an earlier case used runs as on new ones, and every case gives its rigs back idle.
    #[test]
    fn cases_on_reused_rigs_run_as_on_new_ones_and_leave_them_idle() {
        use arbitrary::{Arbitrary, Unstructured};
        let (rk, ru) = (Rig::default(), Rig::default());
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for i in 0..60 {
            let bytes = case::xorshift_bytes(&mut x, 3000);
            let Ok(case) = Case::arbitrary(&mut Unstructured::new(&bytes)) else { continue };
            let fresh = run_case_on(&Rig::default(), &Rig::default(), &case);
            let reused = run_case_on(&rk, &ru, &case);
            assert_eq!(reused, fresh, "case {i}: {case:#?}");
            assert!(fresh.is_ok(), "case {i}: {fresh:?}");
            assert_eq!((rk.end_case(), ru.end_case()), (true, true), "case {i} left a buffer out: {case:#?}");
        }
    }

    #[test]
    fn only_a_barrier_that_changes_nothing_before_a_register_write_is_dropped() {
        let a = [1, 0, 0, 0, 0, 0, 0, 0];
        let b = [1, 0, 0, 9, 0, 0, 0, 0];
        let kept = vec![wmb(a), db(b)];
        assert_eq!(normalize(kept.clone()), kept, "a store between them");
        assert_eq!(normalize(vec![wmb(b), db(b)]), vec![db(b)]);
        let errread = Event::Read { off: CQPERRCODES, val: 5 };
        assert_eq!(
            normalize(vec![errread.clone(), Event::Rmb]),
            vec![errread.clone(), Event::Rmb],
            "register reads are kept"
        );
        let long = vec![Event::Rmb, wmb(b), db(b), wmb(a), errread.clone(), db(a), wmb(a), db(a)];
        let want = vec![Event::Rmb, db(b), wmb(a), errread, db(a), db(a)];
        assert_eq!(normalize(long), want, "only a barrier directly before its write goes, wherever it is");
    }

    #[test]
    fn the_publication_rule_needs_body_then_barrier_then_valid_header_then_doorbell() {
        let body = [7, 8, 9, 0, 1, 2, 3, 4];
        let full = [7, 8, 9, 1 << 63, 1, 2, 3, 4];
        let cases: [(&str, Vec<Event>, u8, bool); 6] = [
            ("in order", vec![wmb(body), db(full)], 1, true),
            ("no barrier", vec![db(full)], 1, false),
            ("header before the barrier", vec![wmb(full), db(full)], 1, false),
            ("body after the barrier", vec![wmb([7, 0, 9, 0, 1, 2, 3, 4]), db(full)], 1, false),
            ("doorbell before the header", vec![wmb(body), db(body)], 1, false),
            ("wrong valid bit", vec![wmb(body), db(full)], 0, false),
        ];
        for (what, events, polarity, ok) in cases {
            assert_eq!(check_publication(&events, 1, &slot(full), polarity).is_ok(), ok, "{what}");
        }
    }
}
