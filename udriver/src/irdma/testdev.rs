//! Test doubles: a fake irdma function that records register writes, plays scripted register reads and,
//! when asked, executes CQP WQEs the way the reference describes (CQEs into the CCQ, CQPTAIL, interrupts);
//! and a queue memory that records the order of its stores.

#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vfio_user_proto::sync::Unpoison;

use super::cqp::QueueMemory;
use super::defs::*;
use super::regs::IrdmaRegisters::{self, *};
use super::regs::*;
use crate::access::{AccessError, DeviceAccess, DeviceIdentity, Result};
use crate::dma::{DmaBuffer, DmaMemError, DmaMemory, DmaPool};

pub fn off(reg: IrdmaRegisters) -> u64 {
    IrdmaHw::offset(reg)
}

struct Map {
    iova: u64,
    len: u64,
    file: File,
    file_off: u64,
}

/// The CCQ as the device sees it after CREATE_CQ.
#[derive(Clone, Copy, Debug)]
pub struct DevCcq {
    pub pa: u64,
    pub size: u32,
    pub shadow_pa: u64,
    pub head: u32,
    pub polarity: u8,
}

#[derive(Default)]
struct State {
    regs: HashMap<u64, u32>,
    scripted: HashMap<u64, VecDeque<u32>>,
    writes: Vec<(u64, u32)>,
    reads: HashMap<u64, usize>,
    maps: Vec<Map>,
    execute: bool,
    hold: bool,
    fail_op: Option<(u8, u16, u16)>,
    sq_pa: u64,
    sq_size: u32,
    ctx: u64,
    tail: u32,
    sq_polarity: u8,
    ccq: Option<DevCcq>,
    pending: VecDeque<u32>,
    executed: Vec<[u64; 8]>,
    armed: bool,
    irq_pending: u32,
    irqs_raised: u32,
}

pub struct FakeIrdma {
    st: Mutex<State>,
    irq: Condvar,
}

impl FakeIrdma {
    /// A device whose registers read as a ready GEN2 function (8 MiB doorbell BAR, PE ready) and that
    /// only records what the driver writes.
    pub fn scripted() -> Arc<Self> {
        let mut st = State::default();
        st.regs.insert(off(IRDMA_GLPCI_LBARCTRL), IRDMA_GLPCI_LBARCTRL_PE_DB_SIZE.prep(2) as u32);
        for r in [IRDMA_GLPE_CPUSTATUS0, IRDMA_GLPE_CPUSTATUS1, IRDMA_GLPE_CPUSTATUS2] {
            st.regs.insert(off(r), IRDMA_CPU_STATUS_READY);
        }
        Arc::new(Self { st: Mutex::new(st), irq: Condvar::new() })
    }

    /// A device that also creates the CQP and executes posted WQEs.
    pub fn executing() -> Arc<Self> {
        let d = Self::scripted();
        d.lock().execute = true;
        d
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unpoison()
    }

    pub fn set_reg(&self, reg: IrdmaRegisters, v: u32) {
        self.lock().regs.insert(off(reg), v);
    }
    /// Values returned by the next reads of `reg`, before it falls back to its register value.
    pub fn script(&self, reg: IrdmaRegisters, values: &[u32]) {
        self.lock().scripted.entry(off(reg)).or_default().extend(values);
    }
    /// `set_reg` for a BAR0 offset outside the kernel register table.
    pub fn set_offset(&self, offset: u64, v: u32) {
        self.lock().regs.insert(offset, v);
    }
    /// `script` for a BAR0 offset outside the kernel register table (the emulation's own blocks).
    pub fn script_offset(&self, offset: u64, values: &[u32]) {
        self.lock().scripted.entry(offset).or_default().extend(values);
    }
    pub fn writes(&self) -> Vec<(u64, u32)> {
        self.lock().writes.clone()
    }
    pub fn writes_to(&self, reg: IrdmaRegisters) -> Vec<u32> {
        self.lock().writes.iter().filter(|(o, _)| *o == off(reg)).map(|(_, v)| *v).collect()
    }
    /// How often `reg` was read.
    pub fn reads_of(&self, reg: IrdmaRegisters) -> usize {
        self.lock().reads.get(&off(reg)).copied().unwrap_or(0)
    }
    pub fn clear_writes(&self) {
        self.lock().writes.clear();
    }
    /// Executed WQEs are completed only by `release` while holding.
    pub fn hold(&self, hold: bool) {
        self.lock().hold = hold;
    }
    /// The executed-but-held WQEs never complete: their completions are lost.
    pub fn lose_held(&self) {
        self.lock().pending.clear();
    }
    /// Completes every executed-but-held WQE.
    pub fn release(&self) {
        let mut st = self.lock();
        Self::flush(&mut st, &self.irq);
    }
    pub fn fail_op(&self, op: u8, maj: u16, min: u16) {
        self.lock().fail_op = Some((op, maj, min));
    }
    pub fn executed(&self) -> Vec<[u64; 8]> {
        self.lock().executed.clone()
    }
    pub fn ccq(&self) -> Option<DevCcq> {
        self.lock().ccq
    }
    pub fn mapped(&self) -> usize {
        self.lock().maps.len()
    }
    pub fn irqs_raised(&self) -> u32 {
        self.lock().irqs_raised
    }

    fn find(st: &State, iova: u64, len: u64) -> Option<(&File, u64)> {
        st.maps
            .iter()
            .find(|m| iova >= m.iova && iova.checked_add(len).is_some_and(|e| e <= m.iova + m.len))
            .map(|m| (&m.file, m.file_off + (iova - m.iova)))
    }
    fn rd64(st: &State, iova: u64) -> u64 {
        let mut b = [0u8; 8];
        if let Some((f, o)) = Self::find(st, iova, 8) {
            let _ = f.read_exact_at(&mut b, o);
        }
        u64::from_le_bytes(b)
    }
    fn wr64(st: &State, iova: u64, v: u64) {
        if let Some((f, o)) = Self::find(st, iova, 8) {
            let _ = f.write_all_at(&v.to_le_bytes(), o);
        }
    }
    pub fn dma_read_u64(&self, iova: u64) -> u64 {
        Self::rd64(&self.lock(), iova)
    }
    pub fn dma_write_u64(&self, iova: u64, v: u64) {
        Self::wr64(&self.lock(), iova, v)
    }

    /// Writes one CQE into the device's CCQ as the hardware would (qw3 last).
    pub fn post_cqe(&self, qw1: u64, qw2: u64, qw3_no_valid: u64) {
        let mut st = self.lock();
        Self::post_cqe_locked(&mut st, &self.irq, qw1, qw2, qw3_no_valid);
    }

    fn post_cqe_locked(st: &mut State, irq: &Condvar, qw1: u64, qw2: u64, qw3: u64) {
        let Some(mut c) = st.ccq else { return };
        let base = c.pa + u64::from(c.head) * IRDMA_CQE_SIZE as u64;
        Self::wr64(st, base + 8, qw1);
        Self::wr64(st, base + 16, qw2);
        Self::wr64(st, base + 24, qw3 | IRDMA_CQ_VALID.prep(c.polarity.into()));
        c.head = (c.head + 1) % c.size.max(1);
        if c.head == 0 {
            c.polarity ^= 1;
        }
        st.ccq = Some(c);
        if st.armed {
            st.armed = false;
            st.irq_pending += 1;
            st.irqs_raised += 1;
            irq.notify_all();
        }
    }

    fn flush(st: &mut State, irq: &Condvar) {
        while let Some(idx) = st.pending.pop_front() {
            let hdr = Self::rd64(st, st.sq_pa + u64::from(idx) * 64 + 24);
            let op = IRDMA_CQPSQ_OPCODE.get(hdr) as u8;
            let mut qw3 = IRDMA_CQ_WQEIDX.prep(idx.into());
            if let Some((fop, maj, min)) = st.fail_op {
                if fop == op {
                    qw3 |= IRDMA_CQ_ERROR.prep(1) | IRDMA_CQ_MAJERR.prep(maj.into()) | IRDMA_CQ_MINERR.prep(min.into());
                }
            }
            let ctx = st.ctx;
            Self::post_cqe_locked(st, irq, ctx, 0, qw3);
            st.regs.insert(off(IRDMA_CQPTAIL), (idx + 1) % st.sq_size.max(1));
        }
    }

    fn on_write(&self, st: &mut State, offset: u64, value: u32) {
        if offset == off(IRDMA_CCQPLOW) {
            let pa = u64::from(st.regs.get(&off(IRDMA_CCQPHIGH)).copied().unwrap_or(0)) << 32 | u64::from(value);
            if pa == 0 {
                st.regs.insert(off(IRDMA_CCQPSTATUS), 0);
                return;
            }
            let q0 = Self::rd64(st, pa);
            st.sq_pa = Self::rd64(st, pa + 8);
            st.ctx = Self::rd64(st, pa + 24);
            st.sq_size = 1 << (super::defs::IRDMA_CQPHC_SQSIZE.get(q0) + 1);
            st.tail = 0;
            st.sq_polarity = 1;
            st.regs.insert(off(IRDMA_CCQPSTATUS), IRDMA_CCQPSTATUS_CCQP_DONE.prep(1) as u32);
        } else if offset == off(IRDMA_CQPDB) && st.sq_size != 0 {
            let head = value % st.sq_size;
            while st.tail != head {
                let base = st.sq_pa + u64::from(st.tail) * 64;
                let wqe: [u64; 8] = std::array::from_fn(|i| Self::rd64(st, base + 8 * i as u64));
                if IRDMA_CQPSQ_WQEVALID.get(wqe[3]) != u64::from(st.sq_polarity) {
                    break;
                }
                let op = IRDMA_CQPSQ_OPCODE.get(wqe[3]) as u8;
                if op == IRDMA_CQP_OP_CREATE_CQ {
                    st.ccq = Some(DevCcq { pa: wqe[4], size: wqe[0] as u32, shadow_pa: wqe[5], head: 0, polarity: 1 });
                } else if op == IRDMA_CQP_OP_DESTROY_CQ {
                    // Completes through CQPTAIL only: the CCQ is gone.
                    Self::flush(st, &self.irq);
                    st.ccq = None;
                }
                st.executed.push(wqe);
                st.pending.push_back(st.tail);
                st.tail = (st.tail + 1) % st.sq_size;
                if st.tail == 0 {
                    st.sq_polarity ^= 1;
                }
            }
            if !st.hold {
                Self::flush(st, &self.irq);
            }
        } else if offset == off(IRDMA_CQARM) {
            st.armed = true;
        }
    }
}

impl DeviceAccess for FakeIrdma {
    fn identity(&self) -> DeviceIdentity {
        DeviceIdentity { backend: "in-process", ..Default::default() }
    }
    fn read32(&self, _bar: u32, offset: u64) -> Result<u32> {
        let mut st = self.lock();
        *st.reads.entry(offset).or_default() += 1;
        if let Some(v) = st.scripted.get_mut(&offset).and_then(VecDeque::pop_front) {
            return Ok(v);
        }
        Ok(st.regs.get(&offset).copied().unwrap_or(0))
    }
    fn write32(&self, _bar: u32, offset: u64, value: u32) -> Result<()> {
        let mut st = self.lock();
        st.writes.push((offset, value));
        st.regs.insert(offset, value);
        if st.execute {
            self.on_write(&mut st, offset, value);
        }
        Ok(())
    }
    fn read64(&self, bar: u32, offset: u64) -> Result<u64> {
        Err(AccessError::BadWidth { bar, offset, width: 8 })
    }
    fn write64(&self, bar: u32, offset: u64, _value: u64) -> Result<()> {
        Err(AccessError::BadWidth { bar, offset, width: 8 })
    }
    fn dma_map(&self, mem: &Arc<DmaMemory>, offset: u64, len: u64, iova: u64) -> Result<()> {
        let fd = mem.fd().try_clone_to_owned().map_err(|source| AccessError::Io { op: "dup", source })?;
        self.lock().maps.push(Map { iova, len, file: File::from(fd), file_off: offset });
        Ok(())
    }
    fn dma_unmap(&self, iova: u64, _len: u64) -> Result<()> {
        self.lock().maps.retain(|m| m.iova != iova);
        Ok(())
    }
    fn enable_msix(&self, _nvec: u32) -> Result<()> {
        Ok(())
    }
    fn wait_irq(&self, _vector: u32, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        while st.irq_pending == 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            st = self.irq.wait_timeout(st, left).unpoison().0;
        }
        st.irq_pending -= 1;
        Ok(true)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemOp {
    Store { offset: usize, value: u64 },
    Wmb,
}

/// Queue memory over a real DMA buffer that logs every store and barrier.
pub struct RecordingMemory {
    pub inner: DmaBuffer,
    pub log: Arc<Mutex<Vec<MemOp>>>,
}

impl QueueMemory for RecordingMemory {
    fn read_u64(&self, offset: usize) -> std::result::Result<u64, DmaMemError> {
        self.inner.read_u64(offset)
    }
    fn write_u64(&self, offset: usize, value: u64) -> std::result::Result<(), DmaMemError> {
        self.log.lock().unpoison().push(MemOp::Store { offset, value });
        self.inner.write_u64(offset, value)
    }
    fn dma_wmb(&self) {
        self.log.lock().unpoison().push(MemOp::Wmb);
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn iova(&self, offset: usize) -> Option<u64> {
        self.inner.iova(offset)
    }
}

/// Fast timing for tests: 1000 polls 1 µs apart, PE readiness retried every millisecond.
pub fn fast_attrs() -> super::dev::IrdmaHwAttrs {
    super::dev::IrdmaHwAttrs {
        max_done_count: 1000,
        max_sleep: Duration::from_micros(1),
        max_pe_ready_count: 14,
        pe_ready_delay: Duration::from_millis(1),
    }
}

/// Memory shared with the test, presented to the driver at a chosen IOVA.
pub struct AtIova {
    pub inner: Arc<DmaBuffer>,
    pub base: u64,
}

impl QueueMemory for AtIova {
    fn read_u64(&self, offset: usize) -> std::result::Result<u64, DmaMemError> {
        self.inner.read_u64(offset)
    }
    fn write_u64(&self, offset: usize, value: u64) -> std::result::Result<(), DmaMemError> {
        self.inner.write_u64(offset, value)
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn iova(&self, offset: usize) -> Option<u64> {
        (offset < self.inner.len()).then(|| self.base + offset as u64)
    }
}

/// An initialised CQP with both memories given; completion context = host-context IOVA.
pub fn cqp_with(
    dev: &Arc<FakeIrdma>,
    pool: &Arc<DmaPool>,
    sq_size: u32,
    sq: Box<dyn QueueMemory>,
    host_ctx: Box<dyn QueueMemory>,
) -> super::Result<super::cqp::IrdmaScCqp> {
    let host_ctx_pa = host_ctx.iova(0).unwrap_or_default();
    super::cqp::irdma_sc_cqp_init(super::cqp::IrdmaCqpInitInfo {
        sq,
        host_ctx,
        pool: pool.clone(),
        hw: IrdmaHw::new(dev.clone()),
        hw_attrs: fast_attrs(),
        sq_size,
        struct_ver: 0,
        hw_maj_ver: 1,
        hw_min_ver: 0,
        hmc_profile: 1,
        ena_vf_count: 0,
        ceqs_per_vf: 0,
        disable_packed: false,
        rocev2_rto_policy: false,
        protocol_used: super::cqp::IrdmaProtocolUsed::IrdmaRoceProtocolOnly,
        dcqcn_params: Default::default(),
        cqp_compl_ctx: host_ctx_pa,
    })
}

/// A CQP on `dev` (initialised, not created) with its SQ and host context in plain DMA memory of one pool.
pub fn plain_cqp(dev: &Arc<FakeIrdma>, sq_size: u32) -> (Arc<DmaPool>, super::cqp::IrdmaScCqp) {
    let pool = Arc::new(DmaPool::new(dev.clone(), false));
    let sq = pool.alloc_contiguous(sq_size as usize * 64).expect("test SQ allocation");
    let ctx = pool.alloc_contiguous(64).expect("test host context allocation");
    let cqp = cqp_with(dev, &pool, sq_size, Box::new(sq), Box::new(ctx)).expect("test CQP init");
    (pool, cqp)
}

/// A CCQ of `num_elem` entries on `pool` (initialised, not created).
pub fn plain_ccq(dev: &Arc<FakeIrdma>, pool: &Arc<DmaPool>, num_elem: u32) -> super::ccq::IrdmaScCq {
    let ring = pool.alloc_contiguous(num_elem as usize * IRDMA_CQE_SIZE).expect("test CCQ ring allocation");
    let shadow = pool.alloc_contiguous(IRDMA_SHADOW_AREA_SIZE).expect("test shadow area allocation");
    super::ccq::irdma_sc_ccq_init(
        IrdmaHw::new(dev.clone()),
        super::ccq::IrdmaCcqInitInfo {
            cq_base: Box::new(ring),
            shadow_area: Box::new(shadow),
            num_elem,
            shadow_read_threshold: IRDMA_CCQ_SHADOW_READ_THRESHOLD,
            ceq_id: 0,
            ceq_id_valid: true,
            ceqe_mask: false,
            vsi_idx: 0,
            cq_ctx: 0x1000,
        },
    )
    .expect("test CCQ init")
}

// G9's qhash entries live in `golden`, for the crate's users' tests too.
pub use super::golden::*;
