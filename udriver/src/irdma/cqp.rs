//! The control QP: init, create and destroy through the registers and the host context (reference 3.4,
//! 3.5), the SQ ring with its polarity, the doorbell, and completion by register polling (3.6, 3.9).

#![forbid(unsafe_code)]

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::defs::*;
use super::regs::IrdmaRegisters::*;
use super::regs::*;
use super::{IrdmaError, Result};
use crate::dma::{DmaBuffer, DmaMemError, DmaPool};

/// The timing parts of `struct irdma_hw_attrs`. The kernel's values are the defaults; tests shrink the
/// delays so failures are fast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IrdmaHwAttrs {
    /// Register polls per CQP create/destroy, and 1/100 of the CCQ polls per command.
    pub max_done_count: u32,
    /// Delay between polls (the kernel's max_sleep_count, in µs).
    pub max_sleep: Duration,
    /// Retries of the PE readiness check.
    pub max_pe_ready_count: u32,
    /// Delay between PE readiness checks.
    pub pe_ready_delay: Duration,
}

impl Default for IrdmaHwAttrs {
    fn default() -> Self {
        Self {
            max_done_count: IRDMA_DONE_COUNT,
            max_sleep: Duration::from_micros(IRDMA_SLEEP_COUNT_US),
            max_pe_ready_count: IRDMA_MAX_PE_READY_COUNT,
            pe_ready_delay: Duration::from_secs(1),
        }
    }
}

/// Memory a queue lives in, seen as 64-bit volatile stores and loads. The real path is a `DmaBuffer`; the
/// trait exists so a test can record the order of stores, which is part of the WQE contract.
pub trait QueueMemory: Send {
    fn read_u64(&self, offset: usize) -> std::result::Result<u64, DmaMemError>;
    fn write_u64(&self, offset: usize, value: u64) -> std::result::Result<(), DmaMemError>;
    /// `dma_wmb()`: earlier stores become visible to the device before later ones.
    fn dma_wmb(&self) {
        fence(Ordering::Release);
    }
    /// `dma_rmb()`: later loads are not satisfied before earlier ones.
    fn dma_rmb(&self) {
        fence(Ordering::Acquire);
    }
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn iova(&self, offset: usize) -> Option<u64>;
}

impl QueueMemory for DmaBuffer {
    fn read_u64(&self, offset: usize) -> std::result::Result<u64, DmaMemError> {
        DmaBuffer::read_u64(self, offset)
    }
    fn write_u64(&self, offset: usize, value: u64) -> std::result::Result<(), DmaMemError> {
        DmaBuffer::write_u64(self, offset, value)
    }
    fn len(&self) -> usize {
        DmaBuffer::len(self)
    }
    fn iova(&self, offset: usize) -> Option<u64> {
        DmaBuffer::iova(self, offset)
    }
}

/// A contiguous DMA buffer that unmaps itself and gives its IOVA back to the pool when dropped, so no error
/// path can leak a device mapping.
pub struct PooledBuffer {
    buf: Option<DmaBuffer>,
    pool: Arc<DmaPool>,
}

impl PooledBuffer {
    pub fn alloc_contiguous(pool: &Arc<DmaPool>, len: usize) -> Result<Self> {
        Ok(Self { buf: Some(pool.alloc_contiguous(len)?), pool: pool.clone() })
    }
    fn buf(&self) -> std::result::Result<&DmaBuffer, DmaMemError> {
        self.buf.as_ref().ok_or(DmaMemError::OutOfBounds { offset: 0, len: 0, size: 0 })
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            b.release(&self.pool);
        }
    }
}

impl QueueMemory for PooledBuffer {
    fn read_u64(&self, offset: usize) -> std::result::Result<u64, DmaMemError> {
        self.buf()?.read_u64(offset)
    }
    fn write_u64(&self, offset: usize, value: u64) -> std::result::Result<(), DmaMemError> {
        self.buf()?.write_u64(offset, value)
    }
    fn len(&self) -> usize {
        self.buf.as_ref().map_or(0, DmaBuffer::len)
    }
    fn iova(&self, offset: usize) -> Option<u64> {
        self.buf.as_ref()?.iova(offset)
    }
}

/// The device address of `mem`, checked to be one IOVA-contiguous run of at least `need` bytes aligned to
/// `align` (the device sees a queue as a single base address).
pub(crate) fn queue_pa(mem: &dyn QueueMemory, need: usize, align: u64, what: &str) -> Result<u64> {
    let bad = |why: &str| IrdmaError::Inval(format!("{what}: {why}"));
    if need == 0 || mem.len() < need {
        return Err(bad(&format!("needs {need} bytes, has {}", mem.len())));
    }
    let pa = mem.iova(0).ok_or_else(|| bad("no IOVA"))?;
    if pa % align != 0 {
        return Err(bad(&format!("IOVA {pa:#x} not {align:#x}-aligned")));
    }
    let page = crate::dma::PAGE_SIZE as usize;
    for off in (page..need).step_by(page).chain(std::iter::once(need - 1)) {
        if mem.iova(off) != pa.checked_add(off as u64) {
            return Err(bad("not IOVA-contiguous"));
        }
    }
    Ok(pa)
}

/// One 64-byte WQE slot of the SQ: qword stores go straight to the queue memory.
pub struct IrdmaCqpWqe<'a> {
    mem: &'a dyn QueueMemory,
    base: usize,
    pub idx: u32,
}

impl IrdmaCqpWqe<'_> {
    /// `set_64bit_val(wqe, byte_offset, value)`.
    pub fn set_64bit_val(&self, byte_offset: usize, value: u64) -> Result<()> {
        Ok(self.mem.write_u64(self.base + byte_offset, value)?)
    }
    pub fn get_64bit_val(&self, byte_offset: usize) -> Result<u64> {
        Ok(self.mem.read_u64(self.base + byte_offset)?)
    }
    pub fn dma_wmb(&self) {
        self.mem.dma_wmb()
    }
}

/// `struct irdma_ring`: head and tail indices modulo `size` (never 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IrdmaRing {
    head: u32,
    tail: u32,
    size: u32,
}

impl IrdmaRing {
    pub(crate) fn new(size: u32) -> Self {
        Self { head: 0, tail: 0, size: size.max(1) }
    }
    pub fn head(&self) -> u32 {
        self.head
    }
    pub fn tail(&self) -> u32 {
        self.tail
    }
    pub fn size(&self) -> u32 {
        self.size
    }
    /// IRDMA_RING_USED_QUANTA.
    pub fn used_quanta(&self) -> u32 {
        (self.head + self.size - self.tail) % self.size
    }
    /// IRDMA_RING_FULL_ERR: one slot stays empty so full and empty differ.
    pub fn is_full(&self) -> bool {
        self.used_quanta() == self.size - 1
    }
    pub(crate) fn move_head(&mut self) {
        self.head = (self.head + 1) % self.size;
    }
    pub(crate) fn move_tail(&mut self) {
        self.tail = (self.tail + 1) % self.size;
    }
}

/// `rf->protocol_used`, the host context's PROTOCOL_USED.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IrdmaProtocolUsed {
    #[default]
    IrdmaAnyProtocol = 0,
    IrdmaIwarpProtocolOnly = 1,
    IrdmaRoceProtocolOnly = 2,
}

/// `struct irdma_dcqcn_cc_params` as the host context carries it (GEN2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IrdmaDcqcnParams {
    pub cc_cfg_valid: bool,
    pub min_dec_factor: u8,
    pub min_rate: u8,
    pub dcqcn_f: u8,
    pub rai_factor: u16,
    pub hai_factor: u16,
    pub dcqcn_t: u16,
    pub dcqcn_b: u32,
    pub rreduce_mperiod: u32,
}

/// `struct irdma_cqp_init_info`; the SQ and host context are the memories themselves (their IOVAs are the
/// kernel's sq_pa and host_ctx_pa).
pub struct IrdmaCqpInitInfo {
    pub sq: Box<dyn QueueMemory>,
    pub host_ctx: Box<dyn QueueMemory>,
    /// Where the SD buffer comes from at create time.
    pub pool: Arc<DmaPool>,
    pub hw: IrdmaHw,
    pub hw_attrs: IrdmaHwAttrs,
    pub sq_size: u32,
    pub struct_ver: u8,
    pub hw_maj_ver: u16,
    pub hw_min_ver: u16,
    pub hmc_profile: u8,
    pub ena_vf_count: u8,
    pub ceqs_per_vf: u8,
    pub disable_packed: bool,
    pub rocev2_rto_policy: bool,
    pub protocol_used: IrdmaProtocolUsed,
    pub dcqcn_params: IrdmaDcqcnParams,
    /// Host-context qw3, echoed in every CCQ CQE's qw1 (the kernel stores its `irdma_sc_cqp *`).
    pub cqp_compl_ctx: u64,
}

/// `struct irdma_sc_cqp`.
pub struct IrdmaScCqp {
    pub(crate) hw: IrdmaHw,
    pub(crate) hw_attrs: IrdmaHwAttrs,
    pool: Arc<DmaPool>,
    sq: Box<dyn QueueMemory>,
    host_ctx: Box<dyn QueueMemory>,
    sdbuf: Option<PooledBuffer>,
    pub sq_pa: u64,
    pub host_ctx_pa: u64,
    pub sq_size: u32,
    pub hw_sq_size: u8,
    pub polarity: u8,
    pub(crate) sq_ring: IrdmaRing,
    /// `scratch_array`; `None` marks a slot with no command outstanding, so a completion for it is garbage.
    scratch_array: Vec<Option<u64>>,
    /// The post number of each slot's command (1, 2, ...), the highest post number completed, and whether
    /// a completion ever came after that of a command posted later (the device completed out of order).
    posted: Vec<u64>,
    completed_post: u64,
    out_of_order: bool,
    /// Slots whose command its waiter gave up on (no completion within its timeout).
    given_up: Vec<bool>,
    pub struct_ver: u8,
    pub hw_maj_ver: u16,
    pub hw_min_ver: u16,
    pub hmc_profile: u8,
    pub ena_vf_count: u8,
    pub ceqs_per_vf: u8,
    pub disable_packed: bool,
    pub rocev2_rto_policy: bool,
    pub protocol_used: IrdmaProtocolUsed,
    pub dcqcn_params: IrdmaDcqcnParams,
    pub cqp_compl_ctx: u64,
    pub requested_ops: u64,
    pub completed_ops: u64,
    created: bool,
}

impl IrdmaScCqp {
    pub fn sq_ring(&self) -> IrdmaRing {
        self.sq_ring
    }
    pub fn is_created(&self) -> bool {
        self.created
    }
    /// The WQE at `idx` (for building it and for reading back its opcode).
    pub fn wqe(&self, idx: u32) -> Result<IrdmaCqpWqe<'_>> {
        if idx >= self.sq_size {
            return Err(IrdmaError::Inval(format!("WQE index {idx} outside SQ of {}", self.sq_size)));
        }
        Ok(IrdmaCqpWqe { mem: self.sq.as_ref(), base: idx as usize * IRDMA_CQP_WQE_SIZE, idx })
    }
    /// Scratch of the outstanding command at `wqe_idx`, if one is.
    pub fn scratch(&self, wqe_idx: u32) -> Option<u64> {
        self.scratch_array.get(wqe_idx as usize).copied().flatten()
    }
    /// Whether a command with this scratch is posted and not yet completed.
    pub fn is_outstanding(&self, scratch: u64) -> bool {
        self.scratch_array.contains(&Some(scratch))
    }
    /// The scratches of every command posted and not yet completed (nor retired as lost).
    pub(crate) fn outstanding(&self) -> impl Iterator<Item = u64> + '_ {
        self.scratch_array.iter().flatten().copied()
    }
    /// The waiter of the outstanding command `scratch` gave up on it: its slot may be reused, even if its
    /// completion never comes.
    pub(crate) fn give_up(&mut self, scratch: u64) {
        if let Some(i) = self.scratch_array.iter().position(|s| *s == Some(scratch)) {
            if let Some(g) = self.given_up.get_mut(i) {
                *g = true;
            }
        }
    }
    #[cfg(test)]
    pub(crate) fn is_given_up(&self, scratch: u64) -> bool {
        self.scratch_array.iter().zip(&self.given_up).any(|(s, g)| *s == Some(scratch) && *g)
    }
    /// Retires the command at `wqe_idx` and frees one SQ slot (the SQ tail moves).
    pub(crate) fn complete_wqe(&mut self, wqe_idx: u32) -> Option<u64> {
        let scratch = self.scratch_array.get_mut(wqe_idx as usize)?.take()?;
        if let Some(g) = self.given_up.get_mut(wqe_idx as usize) {
            *g = false;
        }
        let post = self.posted.get(wqe_idx as usize).copied().unwrap_or_default();
        self.out_of_order |= post < self.completed_post;
        self.completed_post = self.completed_post.max(post);
        self.sq_ring.move_tail();
        self.completed_ops += 1;
        Some(scratch)
    }
}

/// `irdma_sc_cqp_init(cqp, info)`; the initialised cqp is the return value. Fails with -EINVAL for an SQ
/// size outside 4..2048 or not a power of two, or queue memory that is too small or misaligned.
pub fn irdma_sc_cqp_init(info: IrdmaCqpInitInfo) -> Result<IrdmaScCqp> {
    let size = info.sq_size;
    if !(IRDMA_CQP_SW_SQSIZE_4..=IRDMA_CQP_SW_SQSIZE_2048).contains(&size) || !size.is_power_of_two() {
        return Err(IrdmaError::Inval(format!("CQP SQ size {size}")));
    }
    let sq_pa = queue_pa(info.sq.as_ref(), size as usize * IRDMA_CQP_WQE_SIZE, IRDMA_CQP_ALIGNMENT, "CQP SQ")?;
    let host_ctx_pa =
        queue_pa(info.host_ctx.as_ref(), IRDMA_CQP_CTX_SIZE, IRDMA_HOST_CTX_ALIGNMENT, "CQP host context")?;
    let cqp = IrdmaScCqp {
        hw: info.hw,
        hw_attrs: info.hw_attrs,
        pool: info.pool,
        sq: info.sq,
        host_ctx: info.host_ctx,
        sdbuf: None,
        sq_pa,
        host_ctx_pa,
        sq_size: size,
        hw_sq_size: irdma_get_encoded_wqe_size_cqp(size),
        polarity: 0,
        sq_ring: IrdmaRing::new(size),
        scratch_array: vec![None; size as usize],
        posted: vec![0; size as usize],
        completed_post: 0,
        out_of_order: false,
        given_up: vec![false; size as usize],
        struct_ver: info.struct_ver,
        hw_maj_ver: info.hw_maj_ver,
        hw_min_ver: info.hw_min_ver,
        hmc_profile: info.hmc_profile,
        ena_vf_count: info.ena_vf_count,
        ceqs_per_vf: info.ceqs_per_vf,
        disable_packed: info.disable_packed,
        rocev2_rto_policy: info.rocev2_rto_policy,
        protocol_used: info.protocol_used,
        dcqcn_params: info.dcqcn_params,
        cqp_compl_ctx: info.cqp_compl_ctx,
        requested_ops: 0,
        completed_ops: 0,
        created: false,
    };
    // 3.5 step 3: the hardware's view of the SQ starts empty.
    cqp.hw.wr32(IRDMA_CQPTAIL, 0)?;
    cqp.hw.wr32(IRDMA_CQPDB, 0)?;
    cqp.hw.wr32(IRDMA_CCQPSTATUS, 0)?;
    Ok(cqp)
}

/// The eight host-context qwords of 3.4, in order.
pub fn irdma_cqp_host_ctx(cqp: &IrdmaScCqp) -> [u64; 8] {
    let d = &cqp.dcqcn_params;
    [
        IRDMA_CQPHC_DISABLE_PFPDUS.prep_bool(cqp.disable_packed)
            | IRDMA_CQPHC_ROCEV2_RTO_POLICY.prep_bool(cqp.rocev2_rto_policy)
            | IRDMA_CQPHC_PROTOCOL_USED.prep(cqp.protocol_used as u64)
            | IRDMA_CQPHC_SQSIZE.prep(cqp.hw_sq_size.into())
            | IRDMA_CQPHC_SVER.prep(cqp.struct_ver.into())
            | IRDMA_CQPHC_CEQPERVF.prep(cqp.ceqs_per_vf.into()),
        cqp.sq_pa,
        IRDMA_CQPHC_HMC_PROFILE.prep(cqp.hmc_profile.into()) | IRDMA_CQPHC_ENABLED_VFS.prep(cqp.ena_vf_count.into()),
        IRDMA_CQPHC_QPCTX.prep(cqp.cqp_compl_ctx),
        IRDMA_CQPHC_HW_MINVER.prep(cqp.hw_min_ver.into())
            | IRDMA_CQPHC_HW_MAJVER.prep(cqp.hw_maj_ver.into())
            | IRDMA_CQPHC_MIN_RATE.prep(d.min_rate.into())
            | IRDMA_CQPHC_MIN_DEC_FACTOR.prep(d.min_dec_factor.into()),
        0,
        IRDMA_CQPHC_DCQCN_T.prep(d.dcqcn_t.into())
            | IRDMA_CQPHC_HAI_FACTOR.prep(d.hai_factor.into())
            | IRDMA_CQPHC_RAI_FACTOR.prep(d.rai_factor.into()),
        IRDMA_CQPHC_DCQCN_B.prep(d.dcqcn_b.into())
            | IRDMA_CQPHC_DCQCN_F.prep(d.dcqcn_f.into())
            | IRDMA_CQPHC_CC_CFG_VALID.prep_bool(d.cc_cfg_valid)
            | IRDMA_CQPHC_RREDUCE_MPERIOD.prep(d.rreduce_mperiod.into()),
    ]
}

fn read_err_codes(cqp: &IrdmaScCqp) -> Result<(u16, u16)> {
    let v = cqp.hw.rd32(IRDMA_CQPERRCODES)?;
    Ok((IRDMA_CQPERRCODE_CQP_MAJOR_CODE.get32(v) as u16, IRDMA_CQPERRCODE_CQP_MINOR_CODE.get32(v) as u16))
}

/// Polls CCQPSTATUS every `max_sleep` until `done` accepts it: up to `max_done_count + 1` reads, as the
/// kernel's `if (cnt++ > max_done_count)` loops in irdma_sc_cqp_create/destroy make.
fn poll_ccqpstatus(cqp: &IrdmaScCqp, done: impl Fn(u32) -> bool) -> Result<Option<u32>> {
    for _ in 0..=cqp.hw_attrs.max_done_count {
        sleep(cqp.hw_attrs.max_sleep);
        let v = cqp.hw.rd32(IRDMA_CCQPSTATUS)?;
        if done(v) {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

/// The kernel's `udelay(max_sleep_count)` between two looks. Zero does not wait at all, as `udelay(0)`
/// does not: the harnesses whose device answers on the driver's own thread set it, and a yield per look was
/// a tenth of the kernel diff's time.
pub(crate) fn sleep(d: Duration) {
    if !d.is_zero() {
        std::thread::sleep(d);
    }
}

/// `irdma_sc_cqp_create(cqp, maj_err, min_err)`: writes the host context, hands its address to the device
/// (CCQPHIGH, then CCQPLOW, which triggers creation) and polls CCQPSTATUS. -ETIMEDOUT if it never becomes
/// non-zero, -EOPNOTSUPP if CCQP_ERR is set (major/minor from CQPERRCODES). Any other non-zero status is
/// success, DONE or not, as in ctrl.c irdma_sc_cqp_create (`while (!val)`, then only CCQP_ERR is judged).
pub fn irdma_sc_cqp_create(cqp: &mut IrdmaScCqp, maj_err: &mut u16, min_err: &mut u16) -> Result<()> {
    if cqp.created {
        return Err(IrdmaError::State("CQP already created"));
    }
    let sd_len = cqp.sq_size as usize * IRDMA_UPDATE_SD_BUFF_SIZE;
    let sdbuf = PooledBuffer::alloc_contiguous(&cqp.pool, sd_len)?;
    queue_pa(&sdbuf, sd_len, IRDMA_SD_BUF_ALIGNMENT, "SD buffer")?;
    cqp_create_hw(cqp, maj_err, min_err)?;
    cqp.sdbuf = Some(sdbuf);
    cqp.created = true;
    Ok(())
}

fn cqp_create_hw(cqp: &IrdmaScCqp, maj_err: &mut u16, min_err: &mut u16) -> Result<()> {
    for (i, q) in irdma_cqp_host_ctx(cqp).into_iter().enumerate() {
        cqp.host_ctx.write_u64(i * 8, q)?;
    }
    cqp.host_ctx.dma_wmb();
    cqp.hw.wr32(IRDMA_CCQPHIGH, (cqp.host_ctx_pa >> 32) as u32)?;
    cqp.hw.wr32(IRDMA_CCQPLOW, cqp.host_ctx_pa as u32)?;
    let status = poll_ccqpstatus(cqp, |v| v != 0)?;
    let fail = |status: u32, maj_err: &mut u16, min_err: &mut u16| -> Result<IrdmaError> {
        let (maj, min) = read_err_codes(cqp)?;
        (*maj_err, *min_err) = (maj, min);
        Ok(IrdmaError::CqpCreate { status, maj, min })
    };
    match status {
        None => {
            (*maj_err, *min_err) = read_err_codes(cqp)?;
            Err(IrdmaError::Timeout("CQP create (CCQPSTATUS)"))
        }
        Some(v) if IRDMA_CCQPSTATUS_CCQP_ERR.get32(v) != 0 => Err(fail(v, maj_err, min_err)?),
        Some(_) => Ok(()),
    }
}

/// `irdma_sc_cqp_destroy(cqp)`: clears CCQPHIGH/LOW and waits for CCQPSTATUS.DONE to drop; -ETIMEDOUT
/// otherwise. The SD buffer is freed either way.
pub fn irdma_sc_cqp_destroy(cqp: &mut IrdmaScCqp) -> Result<()> {
    cqp.hw.wr32(IRDMA_CCQPHIGH, 0)?;
    cqp.hw.wr32(IRDMA_CCQPLOW, 0)?;
    let status = poll_ccqpstatus(cqp, |v| IRDMA_CCQPSTATUS_CCQP_DONE.get32(v) == 0);
    cqp.sdbuf = None;
    cqp.created = false;
    match status? {
        Some(_) => Ok(()),
        None => {
            let (maj, min) = read_err_codes(cqp)?;
            tracing::warn!(maj, min, "CQP destroy timed out");
            Err(IrdmaError::Timeout("CQP destroy (CCQPSTATUS)"))
        }
    }
}

/// `irdma_sc_cqp_get_next_send_wqe_idx(cqp, scratch, wqe_idx)`: the next SQ slot, zeroed, with `scratch`
/// recorded for it. The polarity flips whenever the slot is index 0. -ENOMEM (`SqFull`) when no slot is free.
pub fn irdma_sc_cqp_get_next_send_wqe_idx<'a>(
    cqp: &'a mut IrdmaScCqp,
    scratch: u64,
    wqe_idx: &mut u32,
) -> Result<IrdmaCqpWqe<'a>> {
    let idx = cqp.sq_ring.head;
    // An outstanding slot is free again, as the kernel (which reuses slots without looking) would have it,
    // when its completion is known lost: a command posted after it has completed and the device has only
    // ever completed in order, or its waiter has given up on it. Without this the SQ wedged for good once it
    // wrapped onto such a slot (found with the `cqe-drop` fault, docs/observe.md). Otherwise (completions
    // out of order, still waited for) it counts as full: decision 11.
    let i = idx as usize;
    let overtaken = !cqp.out_of_order && cqp.posted.get(i).is_some_and(|p| *p < cqp.completed_post);
    let given_up = cqp.given_up.get(i).copied().unwrap_or(false);
    if cqp.scratch(idx).is_some() && (overtaken || given_up) {
        let lost = cqp.scratch_array.get_mut(i).and_then(Option::take);
        if let Some(g) = cqp.given_up.get_mut(i) {
            *g = false;
        }
        // The tail counts completions, and this one never comes: count it retired here, or every lost
        // completion would keep one slot in use for good.
        cqp.sq_ring.move_tail();
        tracing::warn!(slot = idx, scratch = lost, given_up, "CQP completion lost; its slot is reused");
    }
    if cqp.sq_ring.is_full() || cqp.scratch(idx).is_some() {
        return Err(IrdmaError::SqFull);
    }
    cqp.sq_ring.move_head();
    if idx == 0 {
        cqp.polarity ^= 1;
    }
    cqp.requested_ops += 1;
    if let Some(slot) = cqp.scratch_array.get_mut(i) {
        *slot = Some(scratch);
    }
    if let Some(p) = cqp.posted.get_mut(i) {
        *p = cqp.requested_ops;
    }
    *wqe_idx = idx;
    let wqe = cqp.wqe(idx)?;
    for off in (0..IRDMA_CQP_WQE_SIZE).step_by(8) {
        wqe.set_64bit_val(off, 0)?;
    }
    Ok(wqe)
}

/// `irdma_sc_cqp_post_sq(cqp)`: rings CQPDB with the new SQ head (32-bit write).
pub fn irdma_sc_cqp_post_sq(cqp: &IrdmaScCqp) -> Result<()> {
    cqp.hw.wr32(IRDMA_CQPDB, cqp.sq_ring.head)?;
    Ok(())
}

/// `irdma_get_cqp_reg_info(cqp, &val, &tail, &error)`: CQPTAIL split, with the tail checked against the SQ.
pub fn irdma_get_cqp_reg_info(cqp: &IrdmaScCqp) -> Result<(u32, u32, bool)> {
    let val = cqp.hw.rd32(IRDMA_CQPTAIL)?;
    let tail = IRDMA_CQPTAIL_WQTAIL.get32(val);
    let error = IRDMA_CQPTAIL_CQP_OP_ERR.get32(val) != 0;
    Ok((val, tail, error))
}

/// `irdma_cqp_poll_registers(cqp, tail, count)`: waits for CQPTAIL.WQTAIL to move away from `tail`
/// (sampled before posting), up to `count` reads. -EIO on CQP_OP_ERR or a tail outside the SQ or with
/// nothing outstanding, -ETIMEDOUT when it never moves.
pub fn irdma_cqp_poll_registers(cqp: &mut IrdmaScCqp, tail: u32, count: u32) -> Result<()> {
    for _ in 0..count {
        let (val, newtail, error) = irdma_get_cqp_reg_info(cqp)?;
        if error {
            let (maj, min) = read_err_codes(cqp)?;
            return Err(IrdmaError::CqpOpErr { maj, min });
        }
        if newtail >= cqp.sq_size {
            return Err(IrdmaError::BadRegister { reg: "CQPTAIL", value: val });
        }
        if newtail != tail {
            // The device's tail is one past the WQE it finished (the ring's own tail lags behind it after a
            // lost completion).
            let done = (newtail + cqp.sq_size - 1) % cqp.sq_size;
            return match cqp.complete_wqe(done) {
                Some(_) => Ok(()),
                None => Err(IrdmaError::BadRegister { reg: "CQPTAIL", value: val }),
            };
        }
        sleep(cqp.hw_attrs.max_sleep);
    }
    Err(IrdmaError::Timeout("CQP register poll (CQPTAIL)"))
}

/// `irdma_sc_cqp_nop(cqp, scratch, post_sq)`: a NOP WQE.
pub fn irdma_sc_cqp_nop(cqp: &mut IrdmaScCqp, scratch: u64, post_sq: bool) -> Result<()> {
    let mut idx = 0;
    irdma_sc_cqp_get_next_send_wqe_idx(cqp, scratch, &mut idx)?;
    let hdr = IRDMA_CQPSQ_OPCODE.prep(IRDMA_CQP_OP_NOP.into()) | IRDMA_CQPSQ_WQEVALID.prep(cqp.polarity.into());
    let wqe = cqp.wqe(idx)?;
    wqe.dma_wmb();
    wqe.set_64bit_val(IRDMA_BYTE_24, hdr)?;
    if post_sq {
        irdma_sc_cqp_post_sq(cqp)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::irdma::testdev::*;

    fn errno(r: Result<impl Sized>) -> i32 {
        r.err().map_or(0, |e| e.to_errno())
    }

    /// Completes WQEs the way a register-polling driver would, without a CCQ.
    fn retire(cqp: &mut IrdmaScCqp, idx: u32) {
        assert!(cqp.complete_wqe(idx).is_some(), "WQE {idx} was not outstanding");
    }

    #[test]
    fn cqp_init_accepts_only_power_of_two_sq_sizes_from_4_to_2048() {
        let dev = FakeIrdma::scripted();
        for (size, ok) in [(0, false), (2, false), (3, false), (4, true), (100, false), (2048, true), (4096, false)] {
            let pool = Arc::new(DmaPool::new(dev.clone(), false));
            let sq = pool.alloc_contiguous(4096 * 64).unwrap();
            let ctx = pool.alloc_contiguous(64).unwrap();
            let r = cqp_with(&dev, &pool, size, Box::new(sq), Box::new(ctx));
            assert_eq!(r.is_ok(), ok, "size {size}");
            if !ok {
                assert_eq!(errno(r), -libc::EINVAL, "size {size}");
            }
        }
    }

    #[test]
    fn cqp_init_rejects_an_sq_that_is_too_small_or_misaligned() {
        let dev = FakeIrdma::scripted();
        let pool = Arc::new(DmaPool::new(dev.clone(), false));
        let small = pool.alloc_contiguous(4 * 64 - 8).unwrap();
        let ctx = pool.alloc_contiguous(64).unwrap();
        assert_eq!(errno(cqp_with(&dev, &pool, 4, Box::new(small), Box::new(ctx))), -libc::EINVAL);
        let sq = AtIova { inner: Arc::new(pool.alloc_contiguous(4 * 64).unwrap()), base: 0x1_0000_0100 };
        let ctx = pool.alloc_contiguous(64).unwrap();
        assert_eq!(errno(cqp_with(&dev, &pool, 4, Box::new(sq), Box::new(ctx))), -libc::EINVAL);
    }

    #[test]
    fn cqp_init_writes_cqptail_then_cqpdb_then_ccqpstatus_as_zero() {
        let dev = FakeIrdma::scripted();
        let (_pool, cqp) = plain_cqp(&dev, 4);
        let want = [(off(IRDMA_CQPTAIL), 0), (off(IRDMA_CQPDB), 0), (off(IRDMA_CCQPSTATUS), 0)];
        assert_eq!(dev.writes(), want);
        assert_eq!((cqp.polarity, cqp.sq_ring.head(), cqp.sq_ring.tail(), cqp.hw_sq_size), (0, 0, 0, 1));
    }

    /// G10: GEN2, SQ 2048, RoCE only, hmc_profile 1, context at 0x1_2345_6000.
    #[test]
    fn cqp_create_writes_the_g10_host_context_then_ccqphigh_then_ccqplow() {
        let dev = FakeIrdma::scripted();
        let pool = Arc::new(DmaPool::new(dev.clone(), false));
        let sq = pool.alloc_contiguous(2048 * 64).unwrap();
        let sq_pa = sq.iova(0).unwrap();
        let ctx_mem = Arc::new(pool.alloc_contiguous(64).unwrap());
        let ctx = AtIova { inner: ctx_mem.clone(), base: 0x0000_0001_2345_6000 };
        let mut cqp = cqp_with(&dev, &pool, 2048, Box::new(sq), Box::new(ctx)).unwrap();
        dev.clear_writes();
        dev.script(IRDMA_CCQPSTATUS, &[0, 0, 0x0000_0001]);
        let (mut maj, mut min) = (0xAA, 0xBB);
        irdma_sc_cqp_create(&mut cqp, &mut maj, &mut min).unwrap();
        let qw: Vec<u64> = (0..8).map(|i| ctx_mem.read_u64(i * 8).unwrap()).collect();
        assert_eq!(qw, [0xA10, sq_pa, 0x1, 0x0000_0001_2345_6000, 0x0001_0000, 0, 0, 0]);
        assert_eq!(dev.writes(), [(off(IRDMA_CCQPHIGH), 0x0000_0001), (off(IRDMA_CCQPLOW), 0x2345_6000)]);
        assert!(cqp.is_created());
    }

    #[test]
    fn cqp_create_reports_eopnotsupp_with_the_cqperrcodes_when_ccqp_err_is_set() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = plain_cqp(&dev, 4);
        dev.set_reg(IRDMA_CCQPSTATUS, 0x8000_0001);
        dev.set_reg(IRDMA_CQPERRCODES, 0xF001_0001);
        let (mut maj, mut min) = (0, 0);
        let r = irdma_sc_cqp_create(&mut cqp, &mut maj, &mut min);
        assert!(matches!(r, Err(IrdmaError::CqpCreate { status: 0x8000_0001, maj: 0xF001, min: 1 })));
        assert_eq!(errno(r), -libc::EOPNOTSUPP);
        assert_eq!((maj, min), (0xF001, 0x0001));
        assert!(!cqp.is_created());
    }

    #[test]
    fn cqp_create_times_out_when_ccqpstatus_never_becomes_nonzero() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = plain_cqp(&dev, 4);
        cqp.hw_attrs.max_done_count = 20;
        let r = irdma_sc_cqp_create(&mut cqp, &mut 0, &mut 0);
        assert!(matches!(r, Err(IrdmaError::Timeout(_))));
        assert_eq!(errno(r), -libc::ETIMEDOUT);
    }

    /// ctrl.c irdma_sc_cqp_create polls `while (!val)` and then judges only CCQPSTATUS.CCQP_ERR (bit 31).
    #[test]
    fn cqp_create_takes_any_nonzero_status_without_ccqp_err_as_success() {
        for status in [0x0000_0001, 0x0000_0002, 0x7FFF_FFFE] {
            let dev = FakeIrdma::scripted();
            let (_pool, mut cqp) = plain_cqp(&dev, 4);
            dev.set_reg(IRDMA_CCQPSTATUS, status);
            irdma_sc_cqp_create(&mut cqp, &mut 0, &mut 0).unwrap();
            assert!(cqp.is_created(), "{status:#x}");
        }
    }

    #[test]
    fn cqp_destroy_clears_the_context_address_and_waits_for_done_to_drop() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = plain_cqp(&dev, 4);
        dev.set_reg(IRDMA_CCQPSTATUS, 1);
        irdma_sc_cqp_create(&mut cqp, &mut 0, &mut 0).unwrap();
        dev.clear_writes();
        dev.script(IRDMA_CCQPSTATUS, &[1, 1, 0]);
        irdma_sc_cqp_destroy(&mut cqp).unwrap();
        assert_eq!(dev.writes(), [(off(IRDMA_CCQPHIGH), 0), (off(IRDMA_CCQPLOW), 0)]);
        // CCQPSTATUS is still 1 once the script runs out: a second destroy never sees DONE drop.
        dev.set_reg(IRDMA_CCQPSTATUS, 1);
        cqp.hw_attrs.max_done_count = 10;
        assert_eq!(errno(irdma_sc_cqp_destroy(&mut cqp)), -libc::ETIMEDOUT);
    }

    /// G11: polarity starts 0 and flips at index 0; the doorbell carries the new head.
    #[test]
    fn sq_polarity_and_doorbell_follow_g11_across_a_2048_entry_wrap() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = plain_cqp(&dev, 2048);
        dev.clear_writes();
        for i in 0..2048u32 {
            irdma_sc_cqp_nop(&mut cqp, u64::from(i), true).unwrap();
            let hdr = cqp.wqe(i).unwrap().get_64bit_val(IRDMA_BYTE_24).unwrap();
            assert_eq!(IRDMA_CQPSQ_WQEVALID.get(hdr), 1, "first pass, WQE {i}");
            retire(&mut cqp, i);
        }
        let db = dev.writes_to(IRDMA_CQPDB);
        assert_eq!(db.len(), 2048);
        assert_eq!((db[0], db[1], db[2046], db[2047]), (1, 2, 2047, 0));
        irdma_sc_cqp_nop(&mut cqp, 9999, true).unwrap();
        let hdr = cqp.wqe(0).unwrap().get_64bit_val(IRDMA_BYTE_24).unwrap();
        assert_eq!(hdr, 0x0000_0024_0000_0000, "second pass: NOP with valid bit 0");
        assert_eq!(dev.writes_to(IRDMA_CQPDB).last(), Some(&1));
    }

    /// The SQ holds sq_size - 1 outstanding commands (IRDMA_RING_FULL_ERR). Commands whose completions are
    /// lost do not stay among them once their slots are reused: with none outstanding, a post succeeds
    /// however many were lost before.
    #[test]
    fn lost_completions_do_not_fill_the_sq_over_many_wraps() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = plain_cqp(&dev, 4);
        let mut idx = 0;
        for round in 0..12u64 {
            // The first NOP's completion is lost; the second completes, after it, in order.
            irdma_sc_cqp_get_next_send_wqe_idx(&mut cqp, 2 * round, &mut idx)
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            let second = irdma_sc_cqp_get_next_send_wqe_idx(&mut cqp, 2 * round + 1, &mut idx)
                .map(|w| w.idx)
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            retire(&mut cqp, second);
        }
        // At most the two last lost ones still wait for their slots to come round.
        assert!(cqp.sq_ring.used_quanta() <= 2, "{} slots in use", cqp.sq_ring.used_quanta());
    }

    /// A 4-slot SQ with NOPs of scratch 0, 1 and 2 posted and none completed.
    fn three_nops_outstanding(dev: &Arc<FakeIrdma>) -> (Arc<DmaPool>, IrdmaScCqp) {
        let (pool, mut cqp) = plain_cqp(dev, 4);
        for s in 0..3 {
            irdma_sc_cqp_nop(&mut cqp, s, false).unwrap();
        }
        (pool, cqp)
    }

    #[test]
    fn next_send_wqe_reports_enomem_when_all_but_one_slot_are_in_use() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = three_nops_outstanding(&dev);
        let mut idx = 77;
        let r = irdma_sc_cqp_get_next_send_wqe_idx(&mut cqp, 3, &mut idx).map(|w| w.idx);
        assert!(matches!(r, Err(IrdmaError::SqFull)));
        assert_eq!(errno(r), -libc::ENOMEM);
        assert_eq!((idx, cqp.sq_ring.head(), cqp.requested_ops), (77, 3, 3));
        retire(&mut cqp, 0);
        assert_eq!(irdma_sc_cqp_get_next_send_wqe_idx(&mut cqp, 3, &mut idx).map(|w| w.idx).unwrap(), 3);
    }

    /// Decision 11: ctrl.c irdma_sc_cqp_get_next_send_wqe_idx checks only IRDMA_RING_FULL_ERR; after
    /// out-of-order completions it would hand out a slot whose command is still outstanding and overwrite
    /// its scratch. udriver reports such a slot as a full SQ.
    #[test]
    fn a_lost_completion_frees_its_slot_when_later_ones_came_in_order() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = three_nops_outstanding(&dev);
        // Slot 0's CQE never comes; slots 1 and 2 complete in order: slot 0's completion is lost.
        retire(&mut cqp, 1);
        retire(&mut cqp, 2);
        irdma_sc_cqp_nop(&mut cqp, 3, false).unwrap();
        let mut idx = 77;
        let idx = irdma_sc_cqp_get_next_send_wqe_idx(&mut cqp, 4, &mut idx).map(|w| w.idx).unwrap();
        assert_eq!((idx, cqp.scratch(0)), (0, Some(4)));
    }

    #[test]
    fn after_out_of_order_completions_a_slot_is_reused_only_once_its_waiter_gave_up() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = three_nops_outstanding(&dev);
        retire(&mut cqp, 2);
        retire(&mut cqp, 1);
        irdma_sc_cqp_nop(&mut cqp, 3, false).unwrap();
        let mut idx = 77;
        let r = irdma_sc_cqp_get_next_send_wqe_idx(&mut cqp, 4, &mut idx).map(|w| w.idx);
        assert!(matches!(r, Err(IrdmaError::SqFull)), "slot 0 is still waited for");
        cqp.give_up(0);
        let idx = irdma_sc_cqp_get_next_send_wqe_idx(&mut cqp, 4, &mut idx).map(|w| w.idx).unwrap();
        assert_eq!((idx, cqp.scratch(0)), (0, Some(4)));
        assert!(!cqp.is_outstanding(0));
    }

    #[test]
    fn decision_11_a_slot_still_outstanding_after_out_of_order_completions_counts_as_full() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = three_nops_outstanding(&dev);
        retire(&mut cqp, 2);
        retire(&mut cqp, 1);
        irdma_sc_cqp_nop(&mut cqp, 3, false).unwrap();
        // The ring has room (head 0, tail 2), but slot 0 still holds scratch 0.
        assert_eq!((cqp.sq_ring.head(), cqp.sq_ring.tail(), cqp.sq_ring.is_full()), (0, 2, false));
        let mut idx = 77;
        let r = irdma_sc_cqp_get_next_send_wqe_idx(&mut cqp, 4, &mut idx).map(|w| w.idx);
        assert!(matches!(r, Err(IrdmaError::SqFull)));
        assert_eq!((idx, cqp.scratch(0)), (77, Some(0)));
        retire(&mut cqp, 0);
        assert_eq!(irdma_sc_cqp_get_next_send_wqe_idx(&mut cqp, 4, &mut idx).map(|w| w.idx).unwrap(), 0);
    }

    #[test]
    fn next_send_wqe_zeroes_the_slot_and_records_the_scratch() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = plain_cqp(&dev, 4);
        for off in (0..64).step_by(8) {
            cqp.wqe(0).unwrap().set_64bit_val(off, u64::MAX).unwrap();
        }
        let mut idx = 9;
        irdma_sc_cqp_get_next_send_wqe_idx(&mut cqp, 0xFEED, &mut idx).unwrap();
        assert_eq!(idx, 0);
        for off in (0..64).step_by(8) {
            assert_eq!(cqp.wqe(0).unwrap().get_64bit_val(off).unwrap(), 0, "qword at {off}");
        }
        assert_eq!(cqp.scratch(0), Some(0xFEED));
    }

    #[test]
    fn register_polling_follows_cqptail_and_its_error_bit() {
        struct Case {
            name: &'static str,
            cqptail: &'static [u32],
            errno: i32,
            tail_after: u32,
        }
        let cases = [
            Case { name: "tail moves 0 -> 1", cqptail: &[0, 0, 1], errno: 0, tail_after: 1 },
            Case { name: "G12: CQPTAIL 0x80000005", cqptail: &[0x8000_0005], errno: -libc::EIO, tail_after: 0 },
            Case { name: "tail never moves", cqptail: &[], errno: -libc::ETIMEDOUT, tail_after: 0 },
            Case { name: "tail outside a 4-entry SQ", cqptail: &[0x7FF], errno: -libc::EIO, tail_after: 0 },
        ];
        for c in cases {
            let dev = FakeIrdma::scripted();
            let (_pool, mut cqp) = plain_cqp(&dev, 4);
            dev.set_reg(IRDMA_CQPERRCODES, 0xF000_0005);
            let (_, tail, _) = irdma_get_cqp_reg_info(&cqp).unwrap();
            irdma_sc_cqp_nop(&mut cqp, 1, true).unwrap();
            dev.script(IRDMA_CQPTAIL, c.cqptail);
            let r = irdma_cqp_poll_registers(&mut cqp, tail, 50);
            assert_eq!(errno(r), c.errno, "{}", c.name);
            assert_eq!(cqp.sq_ring.tail(), c.tail_after, "{}", c.name);
        }
    }

    #[test]
    fn register_polling_carries_the_major_and_minor_codes_of_an_op_error() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = plain_cqp(&dev, 4);
        dev.set_reg(IRDMA_CQPERRCODES, 0xF001_0001);
        irdma_sc_cqp_nop(&mut cqp, 1, true).unwrap();
        dev.set_reg(IRDMA_CQPTAIL, 0x8000_0005);
        let r = irdma_cqp_poll_registers(&mut cqp, 0, 5);
        assert!(matches!(r, Err(IrdmaError::CqpOpErr { maj: 0xF001, min: 1 })));
    }

    #[test]
    fn register_polling_rejects_a_moving_tail_when_nothing_is_outstanding() {
        let dev = FakeIrdma::scripted();
        let (_pool, mut cqp) = plain_cqp(&dev, 4);
        dev.set_reg(IRDMA_CQPTAIL, 2);
        let r = irdma_cqp_poll_registers(&mut cqp, 0, 5);
        assert!(matches!(r, Err(IrdmaError::BadRegister { reg: "CQPTAIL", value: 2 })));
    }
}
