//! The two drivers under one interface: the kernel's ctrl.c (through the shim) and udriver's
//! `udriver::irdma`, each on its own fake device and DMA pool, allocating in the same order so that
//! their IOVAs, and therefore the WQEs that carry them, are equal.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use udriver::dma::{DmaBuffer, DmaMemError, DmaPool};
use udriver::irdma::ccq::{
    irdma_sc_ccq_arm, irdma_sc_ccq_create, irdma_sc_ccq_destroy, irdma_sc_ccq_get_cqe_info, irdma_sc_ccq_init,
    irdma_sc_poll_for_cqp_op_done,
};
use udriver::irdma::cqp::{
    irdma_sc_cqp_create, irdma_sc_cqp_destroy, irdma_sc_cqp_init, irdma_sc_cqp_post_sq, IrdmaDcqcnParams,
    IrdmaProtocolUsed,
};
use udriver::irdma::dev::{icrdma_cfg_ceq, irdma_sc_dev_init, irdma_wait_pe_ready};
use udriver::irdma::qhash::{irdma_sc_manage_qhash_table_entry, IrdmaVsiQos};
use udriver::irdma::regs::IrdmaHw;
use udriver::irdma::{
    IrdmaCcqCqeInfo, IrdmaCcqInitInfo, IrdmaCqpInitInfo, IrdmaHwAttrs, IrdmaQhashTableInfo, IrdmaQuadEntryType,
    IrdmaQuadHashManageType, IrdmaScCq, IrdmaScCqp, QueueMemory,
};

use super::case::{CcqCfg, CqpCfg, QhashCfg};
use super::fake::{CreateResponse, FakeIrdma, Trace, Watch};
use crate::kernel::{KcCcqParams, KcCqeInfo, KcCqpParams, KcQhash, KernelHwAttrs};
use crate::{Delays, KernelIrdma, ShimEnv};

/// `struct irdma_ccq_cqe_info` as both drivers report it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqeObs {
    pub scratch: u64,
    pub op_ret_val: u32,
    pub maj_err_code: u16,
    pub min_err_code: u16,
    pub op_code: u8,
    pub error: bool,
}

/// Ring positions and counters both drivers keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingObs {
    pub sq_head: u32,
    pub sq_tail: u32,
    pub polarity: u8,
    pub ccq_head: u32,
    pub ccq_tail: u32,
    pub ccq_polarity: u8,
    pub requested_ops: u64,
    pub completed_ops: u64,
}

/// The addresses the kernel code uses as opaque contexts (host-context qw3, CQ-create qw1): udriver is
/// given the same values so that WQEs and contexts compare bit for bit.
#[derive(Clone, Copy, Debug, Default)]
pub struct Contexts {
    pub cqp: u64,
    pub ccq: u64,
}

/// The queue memories a step watches: host context, one SQ slot, the CCQ shadow area.
#[derive(Clone, Copy, Debug)]
pub enum Region {
    HostCtx,
    SqSlot(u32),
    Shadow,
}

pub trait Side {
    fn trace(&self) -> &Trace;
    fn fake(&self) -> &FakeIrdma;
    fn dev_init(&mut self) -> i32;
    fn cqp_init(&mut self, c: &CqpCfg) -> i32;
    fn cqp_create(&mut self) -> (i32, u16, u16);
    fn ccq_init(&mut self, c: &CcqCfg) -> i32;
    fn ccq_create(&mut self, scratch: u64, check_overflow: bool) -> i32;
    fn post_sq(&mut self);
    fn qhash(&mut self, q: &QhashCfg, scratch: u64, post_sq: bool) -> i32;
    fn get_cqe_info(&mut self) -> (i32, CqeObs);
    fn poll_for_cqp_op_done(&mut self, op_code: u8) -> (i32, CqeObs);
    fn ccq_arm(&mut self);
    fn cfg_ceq(&mut self, ceq_id: u32, idx: u32, enable: bool) -> i32;
    fn ccq_destroy(&mut self, scratch: u64) -> i32;
    fn cqp_destroy(&mut self) -> i32;
    fn rings(&self) -> RingObs;
    /// Reads a watched region as the device sees it (None if it does not exist).
    fn read_region(&self, r: Region) -> Option<Vec<u8>>;
    fn watch(&self, r: Region) -> Watch;
    /// The device writes CCQ slot `slot` (qw0..qw3, qw3 last).
    fn write_cqe(&self, slot: u32, qw: [u64; 4]);
    /// The harness fills an SQ slot the driver is about to build with this side's own pattern: a qword the
    /// builder neither zeroes nor writes then differs between the sides.
    fn poison_slot(&self, idx: u32) {
        self.fill_slot(idx, &[self.poison(); 8]);
    }
    fn poison(&self) -> u64;
    /// Writes an SQ slot's eight qwords as the harness (poison, or restoring what a refused builder left).
    fn fill_slot(&self, idx: u32, qw: &[u64; 8]);
    /// Bugs the shim or the kernel code reported (kernel side only).
    fn take_bugs(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Distinct per side: any 64-bit value is a legal qword (IPv6 address halves), so no single pattern can
/// be told from data; two different ones can.
pub const POISON_KERNEL: u64 = 0xA5A5_A5A5_A5A5_A5A5;
pub const POISON_UDRIVER: u64 = 0x5A5A_5A5A_5A5A_5A5A;
const WQE: usize = 64;
const CQE: usize = 32;

fn hw_attrs(max_done_count: u32) -> KernelHwAttrs {
    // One PE-ready check is all a ready device needs; the sleep is skipped (Delays::Skip).
    KernelHwAttrs { max_pe_ready_count: 14, max_done_count, max_sleep_count: 10 }
}

/// Qwords as the little-endian bytes a device sees, for one write of a whole CQE or WQE.
fn qwords_le<const N: usize>(qw: &[u64; N]) -> Vec<u8> {
    qw.iter().flat_map(|q| q.to_le_bytes()).collect()
}

/// What one side keeps from case to case: its trace, its fake device and a recycling DMA pool. A pool per
/// case made a memfd and a mapping per buffer and tore them down again: a tenth of the fuzz target's time.
#[derive(Clone)]
pub struct Rig {
    trace: Trace,
    fake: Arc<FakeIrdma>,
    pool: Arc<DmaPool>,
}

impl Default for Rig {
    fn default() -> Self {
        let trace = Trace::default();
        let fake = FakeIrdma::new(trace.clone(), CreateResponse::Done);
        let pool = Arc::new(DmaPool::recycling(fake.clone()));
        Rig { trace, fake, pool }
    }
}

impl Rig {
    /// The rig as a new case finds it: no events, no watches, the registers as after reset.
    fn start(&self, create: CreateResponse) -> Self {
        self.trace.reset();
        self.fake.reset(create);
        self.clone()
    }
    /// Ends a case once its sides are gone: drops what the trace still holds of it (its watches hold the
    /// memory), and says whether a next case can run on this rig as on a new one: every buffer came back,
    /// so the next case's buffers get the same IOVAs (which the WQEs and contexts the sides compare carry).
    pub fn end_case(&self) -> bool {
        self.trace.reset();
        self.pool.is_idle()
    }
}

// ---- kernel ------------------------------------------------------------------------------------------------

pub struct KernelSide {
    trace: Trace,
    fake: Arc<FakeIrdma>,
    k: KernelIrdma,
    max_done_count: u32,
    /// The shadow area counts as queue memory once irdma_sc_ccq_init took it.
    ccq_ok: bool,
}

impl KernelSide {
    pub fn new(rig: &Rig, create: CreateResponse, max_done_count: u32) -> Result<Self, String> {
        let Rig { trace, fake, pool } = rig.start(create);
        let env = ShimEnv::new(pool, Delays::Skip).map_err(|e| e.to_string())?;
        env.set_observer(Some(Arc::new(trace.clone())));
        let k = KernelIrdma::new(env).map_err(|e| e.to_string())?;
        Ok(Self { trace, fake, k, max_done_count, ccq_ok: false })
    }
    pub fn contexts(&self) -> Contexts {
        let s = self.k.state();
        Contexts { cqp: s.cqp_addr, ccq: s.ccq_addr }
    }
    fn region(&self, r: Region) -> Option<(u64, usize)> {
        let s = self.k.state();
        match r {
            Region::HostCtx if s.host_ctx_va != 0 => Some((s.host_ctx_va, 64)),
            Region::SqSlot(i) if s.sq_va != 0 && i < s.sq_size => Some((s.sq_va + u64::from(i) * WQE as u64, WQE)),
            Region::Shadow if self.ccq_ok && s.shadow_va != 0 => Some((s.shadow_va, 64)),
            _ => None,
        }
    }
}

fn errno(r: Result<(), crate::KernelError>) -> i32 {
    r.err().map_or(0, |e| e.errno)
}

fn kc_cqe(i: &KcCqeInfo) -> CqeObs {
    CqeObs {
        scratch: i.scratch,
        op_ret_val: i.op_ret_val,
        maj_err_code: i.maj_err_code,
        min_err_code: i.min_err_code,
        op_code: i.op_code,
        error: i.error != 0,
    }
}

impl Side for KernelSide {
    fn trace(&self) -> &Trace {
        &self.trace
    }
    fn fake(&self) -> &FakeIrdma {
        &self.fake
    }
    fn dev_init(&mut self) -> i32 {
        errno(self.k.irdma_sc_dev_init(hw_attrs(self.max_done_count)))
    }
    fn cqp_init(&mut self, c: &CqpCfg) -> i32 {
        let p = KcCqpParams {
            sq_size: c.sq_size,
            dcqcn_b: c.dcqcn_b,
            rreduce_mperiod: c.rreduce_mperiod,
            hw_maj_ver: c.hw_maj_ver,
            hw_min_ver: c.hw_min_ver,
            rai_factor: c.rai_factor,
            hai_factor: c.hai_factor,
            dcqcn_t: c.dcqcn_t,
            struct_ver: c.struct_ver,
            hmc_profile: c.hmc_profile,
            ena_vf_count: c.ena_vf_count,
            ceqs_per_vf: c.ceqs_per_vf,
            disable_packed: c.disable_packed.into(),
            rocev2_rto_policy: c.rocev2_rto_policy.into(),
            protocol_used: c.protocol_used,
            en_datacenter_tcp: 0,
            cc_cfg_valid: c.cc_cfg_valid.into(),
            min_dec_factor: c.min_dec_factor,
            min_rate: c.min_rate,
            dcqcn_f: c.dcqcn_f,
        };
        errno(self.k.irdma_sc_cqp_init(&p))
    }
    fn cqp_create(&mut self) -> (i32, u16, u16) {
        let (mut maj, mut min) = (0, 0);
        let r = errno(self.k.irdma_sc_cqp_create(&mut maj, &mut min));
        (r, maj, min)
    }
    fn ccq_init(&mut self, c: &CcqCfg) -> i32 {
        let p = KcCcqParams {
            num_elem: c.num_elem,
            ceq_id: c.ceq_id,
            shadow_read_threshold: c.shadow_read_threshold,
            vsi_idx: c.vsi_idx,
            ceqe_mask: c.ceqe_mask.into(),
            ceq_id_valid: c.ceq_id_valid.into(),
            ..Default::default()
        };
        let r = errno(self.k.irdma_sc_ccq_init(&p));
        self.ccq_ok = r == 0;
        r
    }
    fn ccq_create(&mut self, scratch: u64, check_overflow: bool) -> i32 {
        errno(self.k.irdma_sc_ccq_create(scratch, check_overflow, false))
    }
    fn post_sq(&mut self) {
        self.k.irdma_sc_cqp_post_sq()
    }
    fn qhash(&mut self, q: &QhashCfg, scratch: u64, post_sq: bool) -> i32 {
        let kq = KcQhash {
            manage: q.manage,
            entry_type: q.entry_type,
            qp_num: q.qp_num,
            dest_ip: q.dest_ip,
            src_ip: q.src_ip,
            qs_handle: q.qs_handle,
            vlan_id: q.vlan_id,
            dest_port: q.dest_port,
            src_port: q.src_port,
            mac_addr: q.mac_addr,
            vlan_valid: q.vlan_valid.into(),
            ipv4_valid: q.ipv4_valid.into(),
            user_pri: q.user_pri,
            pad: [0; 3],
        };
        errno(self.k.irdma_sc_manage_qhash_table_entry(&kq, scratch, post_sq))
    }
    fn get_cqe_info(&mut self) -> (i32, CqeObs) {
        let mut i = KcCqeInfo::default();
        let r = errno(self.k.irdma_sc_ccq_get_cqe_info(&mut i));
        (r, kc_cqe(&i))
    }
    fn poll_for_cqp_op_done(&mut self, op_code: u8) -> (i32, CqeObs) {
        let mut i = KcCqeInfo::default();
        let r = errno(self.k.irdma_sc_poll_for_cqp_op_done(op_code, &mut i));
        (r, kc_cqe(&i))
    }
    fn ccq_arm(&mut self) {
        self.k.irdma_sc_ccq_arm()
    }
    fn cfg_ceq(&mut self, ceq_id: u32, idx: u32, enable: bool) -> i32 {
        self.k.irdma_cfg_ceq(ceq_id, idx, enable);
        0
    }
    fn ccq_destroy(&mut self, scratch: u64) -> i32 {
        errno(self.k.irdma_sc_ccq_destroy(scratch, true))
    }
    fn cqp_destroy(&mut self) -> i32 {
        errno(self.k.irdma_sc_cqp_destroy())
    }
    fn rings(&self) -> RingObs {
        let s = self.k.state();
        RingObs {
            sq_head: s.sq_head,
            sq_tail: s.sq_tail,
            polarity: s.polarity,
            ccq_head: s.ccq_head,
            ccq_tail: s.ccq_tail,
            ccq_polarity: s.ccq_polarity,
            requested_ops: s.requested_ops,
            completed_ops: s.completed_ops,
        }
    }
    fn read_region(&self, r: Region) -> Option<Vec<u8>> {
        let (va, len) = self.region(r)?;
        let mut b = vec![0; len];
        self.k.env().read(va, &mut b).then_some(b)
    }
    fn watch(&self, r: Region) -> Watch {
        let env = self.k.env().clone();
        let at = self.region(r);
        Box::new(move |buf| {
            let Some((va, len)) = at else { return 0 };
            let read = buf.get_mut(..len).is_some_and(|b| env.read(va, b));
            if read {
                len
            } else {
                0
            }
        })
    }
    fn write_cqe(&self, slot: u32, qw: [u64; 4]) {
        let s = self.k.state();
        self.k.env().write(s.ccq_va + u64::from(slot) * CQE as u64, &qwords_le(&qw));
    }
    fn poison(&self) -> u64 {
        POISON_KERNEL
    }
    fn fill_slot(&self, idx: u32, qw: &[u64; 8]) {
        if let Some((va, _)) = self.region(Region::SqSlot(idx)) {
            self.k.env().write(va, &qwords_le(qw));
        }
    }
    fn take_bugs(&self) -> Vec<String> {
        self.k.env().take_bugs()
    }
}

// ---- udriver -----------------------------------------------------------------------------------------------

/// A udriver queue memory that records its barriers in the trace.
struct RecQueue {
    buf: Arc<DmaBuffer>,
    trace: Trace,
}

impl QueueMemory for RecQueue {
    fn read_u64(&self, offset: usize) -> Result<u64, DmaMemError> {
        self.buf.read_u64(offset)
    }
    fn write_u64(&self, offset: usize, value: u64) -> Result<(), DmaMemError> {
        self.buf.write_u64(offset, value)
    }
    fn dma_wmb(&self) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        self.trace.push_wmb();
    }
    fn dma_rmb(&self) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        self.trace.push_rmb();
    }
    fn len(&self) -> usize {
        self.buf.len()
    }
    fn iova(&self, offset: usize) -> Option<u64> {
        self.buf.iova(offset)
    }
}

pub struct UdriverSide {
    trace: Trace,
    fake: Arc<FakeIrdma>,
    pool: Arc<DmaPool>,
    hw: IrdmaHw,
    attrs: IrdmaHwAttrs,
    ctx: Contexts,
    sq: Option<Arc<DmaBuffer>>,
    host_ctx: Option<Arc<DmaBuffer>>,
    ring: Option<Arc<DmaBuffer>>,
    shadow: Option<Arc<DmaBuffer>>,
    cqp: Option<IrdmaScCqp>,
    ccq: Option<IrdmaScCq>,
}

fn uerr<T>(r: udriver::irdma::Result<T>) -> i32 {
    r.err().map_or(0, |e| e.to_errno())
}

fn ucqe(i: &IrdmaCcqCqeInfo) -> CqeObs {
    CqeObs {
        scratch: i.scratch,
        op_ret_val: i.op_ret_val,
        maj_err_code: i.maj_err_code,
        min_err_code: i.min_err_code,
        op_code: i.op_code,
        error: i.error,
    }
}

/// udriver's typed enums for the kernel's integers (the case keeps them in range).
fn manage(v: u32) -> IrdmaQuadHashManageType {
    match v {
        0 => IrdmaQuadHashManageType::IrdmaQhashManageTypeDelete,
        1 => IrdmaQuadHashManageType::IrdmaQhashManageTypeAdd,
        _ => IrdmaQuadHashManageType::IrdmaQhashManageTypeModify,
    }
}

fn entry_type(v: u32) -> IrdmaQuadEntryType {
    use IrdmaQuadEntryType::*;
    match v {
        1 => IrdmaQhashTypeTcpEstablished,
        2 => IrdmaQhashTypeTcpSyn,
        3 => IrdmaQhashTypeUdpUnicast,
        4 => IrdmaQhashTypeUdpMcast,
        5 => IrdmaQhashTypeRoceMcast,
        _ => IrdmaQhashTypeRocev2Hw,
    }
}

impl UdriverSide {
    pub fn new(rig: &Rig, create: CreateResponse, max_done_count: u32, ctx: Contexts) -> Self {
        let Rig { trace, fake, pool } = rig.start(create);
        let hw = IrdmaHw::new(fake.clone());
        let attrs = IrdmaHwAttrs {
            max_done_count,
            max_sleep: Duration::ZERO,
            max_pe_ready_count: 14,
            pe_ready_delay: Duration::ZERO,
        };
        Self {
            trace,
            fake,
            pool,
            hw,
            attrs,
            ctx,
            sq: None,
            host_ctx: None,
            ring: None,
            shadow: None,
            cqp: None,
            ccq: None,
        }
    }

    fn alloc(&self, len: usize) -> Option<Arc<DmaBuffer>> {
        self.pool.alloc_contiguous(len).ok().map(Arc::new)
    }
    /// Gives a buffer back to the pool once nothing else holds it (else it is just dropped, and the pool is
    /// not idle: its rig is not reused).
    fn release(&self, b: Option<Arc<DmaBuffer>>) {
        if let Some(b) = b.and_then(|b| Arc::try_unwrap(b).ok()) {
            b.release(&self.pool);
        }
    }
    fn queue(&self, b: &Arc<DmaBuffer>) -> Box<dyn QueueMemory> {
        Box::new(RecQueue { buf: b.clone(), trace: self.trace.clone() })
    }
    fn region(&self, r: Region) -> Option<(Arc<DmaBuffer>, usize, usize)> {
        match r {
            Region::HostCtx => Some((self.host_ctx.clone()?, 0, 64)),
            Region::SqSlot(i) => {
                let sq = self.sq.clone()?;
                let off = i as usize * WQE;
                (off + WQE <= sq.len()).then_some((sq, off, WQE))
            }
            Region::Shadow if self.ccq.is_some() => Some((self.shadow.clone()?, 0, 64)),
            Region::Shadow => None,
        }
    }
}

impl Drop for KernelSide {
    fn drop(&mut self) {
        // The trace's watches hold the environment, whose observer holds the trace: break the cycle, so
        // the kernel's memory goes back to the pool with the side.
        self.trace.reset();
    }
}

impl Drop for UdriverSide {
    fn drop(&mut self) {
        // The trace's watches and the queues hold the buffers too: they go first.
        self.trace.reset();
        self.cqp = None;
        self.ccq = None;
        for b in [self.sq.take(), self.host_ctx.take(), self.ring.take(), self.shadow.take()] {
            self.release(b);
        }
    }
}

impl Side for UdriverSide {
    fn trace(&self) -> &Trace {
        &self.trace
    }
    fn fake(&self) -> &FakeIrdma {
        &self.fake
    }
    fn dev_init(&mut self) -> i32 {
        let r = irdma_wait_pe_ready(&self.hw, &self.attrs).and_then(|()| irdma_sc_dev_init(&self.hw));
        uerr(r)
    }
    fn cqp_init(&mut self, c: &CqpCfg) -> i32 {
        // As the kernel's caller: SQ and host context memory, then init.
        let valid = (4..=2048).contains(&c.sq_size);
        let (Some(sq), Some(hc)) = (self.alloc(if valid { c.sq_size as usize * WQE } else { 4096 }), self.alloc(64))
        else {
            return -libc::ENOMEM;
        };
        let protocol_used = match c.protocol_used {
            0 => IrdmaProtocolUsed::IrdmaAnyProtocol,
            1 => IrdmaProtocolUsed::IrdmaIwarpProtocolOnly,
            _ => IrdmaProtocolUsed::IrdmaRoceProtocolOnly,
        };
        let info = IrdmaCqpInitInfo {
            sq: self.queue(&sq),
            host_ctx: self.queue(&hc),
            pool: self.pool.clone(),
            hw: self.hw.clone(),
            hw_attrs: self.attrs,
            sq_size: c.sq_size,
            struct_ver: c.struct_ver,
            hw_maj_ver: c.hw_maj_ver,
            hw_min_ver: c.hw_min_ver,
            hmc_profile: c.hmc_profile,
            ena_vf_count: c.ena_vf_count,
            ceqs_per_vf: c.ceqs_per_vf,
            disable_packed: c.disable_packed,
            rocev2_rto_policy: c.rocev2_rto_policy,
            protocol_used,
            dcqcn_params: IrdmaDcqcnParams {
                cc_cfg_valid: c.cc_cfg_valid,
                min_dec_factor: c.min_dec_factor,
                min_rate: c.min_rate,
                dcqcn_f: c.dcqcn_f,
                rai_factor: c.rai_factor,
                hai_factor: c.hai_factor,
                dcqcn_t: c.dcqcn_t,
                dcqcn_b: c.dcqcn_b,
                rreduce_mperiod: c.rreduce_mperiod,
            },
            cqp_compl_ctx: self.ctx.cqp,
        };
        for old in [self.sq.replace(sq), self.host_ctx.replace(hc)] {
            self.release(old);
        }
        match irdma_sc_cqp_init(info) {
            Ok(cqp) => {
                self.cqp = Some(cqp);
                0
            }
            Err(e) => e.to_errno(),
        }
    }
    fn cqp_create(&mut self) -> (i32, u16, u16) {
        let Some(cqp) = self.cqp.as_mut() else { return (-libc::EINVAL, 0, 0) };
        let (mut maj, mut min) = (0, 0);
        let r = uerr(irdma_sc_cqp_create(cqp, &mut maj, &mut min));
        (r, maj, min)
    }
    fn ccq_init(&mut self, c: &CcqCfg) -> i32 {
        let sane = (1..=0xF_FFFF).contains(&c.num_elem);
        let ring_len = if sane { (c.num_elem as usize * CQE).next_multiple_of(0x100) } else { 4096 };
        let (Some(ring), Some(shadow)) = (self.alloc(ring_len), self.alloc(64)) else { return -libc::ENOMEM };
        let info = IrdmaCcqInitInfo {
            cq_base: self.queue(&ring),
            shadow_area: self.queue(&shadow),
            num_elem: c.num_elem,
            shadow_read_threshold: c.shadow_read_threshold,
            ceq_id: c.ceq_id,
            ceq_id_valid: c.ceq_id_valid,
            ceqe_mask: c.ceqe_mask,
            vsi_idx: c.vsi_idx,
            cq_ctx: self.ctx.ccq,
        };
        for old in [self.ring.replace(ring), self.shadow.replace(shadow)] {
            self.release(old);
        }
        match irdma_sc_ccq_init(self.hw.clone(), info) {
            Ok(ccq) => {
                self.ccq = Some(ccq);
                0
            }
            Err(e) => e.to_errno(),
        }
    }
    fn ccq_create(&mut self, scratch: u64, check_overflow: bool) -> i32 {
        let (Some(ccq), Some(cqp)) = (self.ccq.as_mut(), self.cqp.as_mut()) else { return -libc::EINVAL };
        uerr(irdma_sc_ccq_create(ccq, cqp, scratch, check_overflow, false))
    }
    fn post_sq(&mut self) {
        if let Some(cqp) = self.cqp.as_ref() {
            let _ = irdma_sc_cqp_post_sq(cqp);
        }
    }
    fn qhash(&mut self, q: &QhashCfg, scratch: u64, post_sq: bool) -> i32 {
        let Some(cqp) = self.cqp.as_mut() else { return -libc::EINVAL };
        let info = IrdmaQhashTableInfo {
            vsi: IrdmaVsiQos { qs_handle: q.qs_handle },
            manage: manage(q.manage),
            entry_type: entry_type(q.entry_type),
            vlan_valid: q.vlan_valid,
            ipv4_valid: q.ipv4_valid,
            mac_addr: q.mac_addr,
            vlan_id: q.vlan_id,
            user_pri: q.user_pri,
            qp_num: q.qp_num,
            dest_ip: q.dest_ip,
            src_ip: q.src_ip,
            dest_port: q.dest_port,
            src_port: q.src_port,
        };
        uerr(irdma_sc_manage_qhash_table_entry(cqp, &info, scratch, post_sq))
    }
    fn get_cqe_info(&mut self) -> (i32, CqeObs) {
        let (Some(ccq), Some(cqp)) = (self.ccq.as_mut(), self.cqp.as_mut()) else {
            return (-libc::EINVAL, CqeObs::default());
        };
        let mut i = IrdmaCcqCqeInfo::default();
        let r = uerr(irdma_sc_ccq_get_cqe_info(ccq, cqp, &mut i));
        (r, ucqe(&i))
    }
    fn poll_for_cqp_op_done(&mut self, op_code: u8) -> (i32, CqeObs) {
        let (Some(ccq), Some(cqp)) = (self.ccq.as_mut(), self.cqp.as_mut()) else {
            return (-libc::EINVAL, CqeObs::default());
        };
        let mut i = IrdmaCcqCqeInfo::default();
        let r = uerr(irdma_sc_poll_for_cqp_op_done(cqp, ccq, op_code, &mut i));
        (r, ucqe(&i))
    }
    fn ccq_arm(&mut self) {
        if let Some(ccq) = self.ccq.as_ref() {
            let _ = irdma_sc_ccq_arm(ccq);
        }
    }
    fn cfg_ceq(&mut self, ceq_id: u32, idx: u32, enable: bool) -> i32 {
        uerr(icrdma_cfg_ceq(&self.hw, ceq_id, idx, enable))
    }
    fn ccq_destroy(&mut self, scratch: u64) -> i32 {
        let (Some(ccq), Some(cqp)) = (self.ccq.as_mut(), self.cqp.as_mut()) else { return -libc::EINVAL };
        uerr(irdma_sc_ccq_destroy(ccq, cqp, scratch, true))
    }
    fn cqp_destroy(&mut self) -> i32 {
        let Some(cqp) = self.cqp.as_mut() else { return -libc::EINVAL };
        uerr(irdma_sc_cqp_destroy(cqp))
    }
    fn rings(&self) -> RingObs {
        let mut o = RingObs::default();
        if let Some(c) = &self.cqp {
            (o.sq_head, o.sq_tail, o.polarity) = (c.sq_ring().head(), c.sq_ring().tail(), c.polarity);
            (o.requested_ops, o.completed_ops) = (c.requested_ops, c.completed_ops);
        }
        if let Some(c) = &self.ccq {
            (o.ccq_head, o.ccq_tail, o.ccq_polarity) = (c.cq_ring().head(), c.cq_ring().tail(), c.polarity);
        }
        o
    }
    fn read_region(&self, r: Region) -> Option<Vec<u8>> {
        let (b, off, len) = self.region(r)?;
        let mut v = vec![0; len];
        b.read(off, &mut v).ok().map(|()| v)
    }
    fn watch(&self, r: Region) -> Watch {
        let at = self.region(r);
        Box::new(move |buf| {
            let Some((b, off, len)) = &at else { return 0 };
            let read = buf.get_mut(..*len).is_some_and(|v| b.read(*off, v).is_ok());
            if read {
                *len
            } else {
                0
            }
        })
    }
    fn write_cqe(&self, slot: u32, qw: [u64; 4]) {
        if let Some(r) = &self.ring {
            for (i, q) in qw.iter().enumerate() {
                let _ = r.write_u64(slot as usize * CQE + 8 * i, *q);
            }
        }
    }
    fn poison(&self) -> u64 {
        POISON_UDRIVER
    }
    fn fill_slot(&self, idx: u32, qw: &[u64; 8]) {
        if let Some((b, off, _)) = self.region(Region::SqSlot(idx)) {
            for (i, q) in qw.iter().enumerate() {
                let _ = b.write_u64(off + 8 * i, *q);
            }
        }
    }
}
