//! The device both drivers talk to in a differential case: a register file that answers as the device
//! model documents (docs/irdma-device.md) and completes nothing by itself, plus the trace of everything
//! each driver did that the device could see: register reads and writes, and the queue memory at every
//! barrier and register write.

#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use udriver::access::{AccessError, DeviceAccess, DeviceIdentity};
use udriver::dma::DmaMemory;
use vfio_user_proto::sync::Unpoison;

use crate::env::BarrierObserver;

// BAR0 offsets (icrdma_hw.h; docs/irdma-device.md).
pub const CQPTAIL: u64 = 0x0050_0880;
pub const CQPDB: u64 = 0x0050_0800;
pub const CCQPSTATUS: u64 = 0x0050_A000;
pub const CCQPHIGH: u64 = 0x0050_A100;
pub const CCQPLOW: u64 = 0x0050_A080;
pub const CQPERRCODES: u64 = 0x0050_A200;
pub const GLPCI_LBARCTRL: u64 = 0x0009_DE74;
pub const GLPE_CPUSTATUS0: u64 = 0x0050_BA5C;
pub const GLPE_CPUSTATUS2: u64 = 0x0050_BA64;

/// Most regions a step watches, and the most bytes of one (a WQE, the host context, the CCQ shadow area).
pub const MAX_WATCHES: usize = 3;
pub const WATCH_BYTES: usize = 64;

/// The watched queue memory at one moment, held inline: a snapshot is taken at every barrier and register
/// write of both drivers, and a heap vector per region cost the fuzz target more than comparing them.
/// Bytes past a region's length stay zero, so equal snapshots are equal fields.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Mem {
    n: u8,
    lens: [u8; MAX_WATCHES],
    bytes: [[u8; WATCH_BYTES]; MAX_WATCHES],
}

impl Default for Mem {
    fn default() -> Self {
        Mem { n: 0, lens: [0; MAX_WATCHES], bytes: [[0; WATCH_BYTES]; MAX_WATCHES] }
    }
}

impl Mem {
    /// Region `i` as it was (empty if it did not exist), `None` past the watched regions.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        (i < usize::from(self.n)).then(|| &self.bytes[i][..usize::from(self.lens[i])])
    }
    pub fn regions(&self) -> impl Iterator<Item = &[u8]> {
        self.bytes.iter().zip(self.lens).take(usize::from(self.n)).map(|(b, len)| &b[..usize::from(len)])
    }
    /// A snapshot holding these regions (tests); `None` if there are too many or one is too long.
    pub fn of(regions: &[&[u8]]) -> Option<Mem> {
        let mut m = Mem { n: u8::try_from(regions.len()).ok()?, ..Mem::default() };
        for (i, r) in regions.iter().enumerate() {
            m.bytes.get_mut(i)?.get_mut(..r.len())?.copy_from_slice(r);
            m.lens[i] = u8::try_from(r.len()).ok()?;
        }
        Some(m)
    }
}

/// One thing a driver did that the device could observe. `mem` is the watched queue memory at that
/// moment (the order of stores shows there: a header stored before the barrier would already be in the
/// snapshot the barrier takes).
#[derive(Clone, PartialEq, Eq)]
pub enum Event {
    Read { off: u64, val: u32 },
    Write { off: u64, val: u32, mem: Mem },
    Wmb { mem: Mem },
    Rmb,
}

fn qwords(mem: &Mem) -> Vec<Vec<String>> {
    mem.regions()
        .map(|r| {
            r.chunks(8).map(|c| format!("{:#x}", c.iter().rev().fold(0u64, |a, b| a << 8 | u64::from(*b)))).collect()
        })
        .collect()
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Read { off, val } => write!(f, "Read({off:#x}) = {val:#x}"),
            Event::Write { off, val, mem } => write!(f, "Write({off:#x}, {val:#x}) mem {:?}", qwords(mem)),
            Event::Wmb { mem } => write!(f, "Wmb mem {:?}", qwords(mem)),
            Event::Rmb => write!(f, "Rmb"),
        }
    }
}

/// Reads one watched region as the device would see it now into the buffer, and returns its length (0 if
/// it does not exist or cannot be read, the buffer then untouched).
pub type Watch = Box<dyn Fn(&mut [u8; WATCH_BYTES]) -> usize + Send>;

#[derive(Default)]
struct TraceInner {
    events: Vec<Event>,
    watches: Vec<Watch>,
}

/// Shared by the fake device (register events) and the driver's memory (barrier events).
#[derive(Clone, Default)]
pub struct Trace(Arc<Mutex<TraceInner>>);

impl Trace {
    fn lock(&self) -> MutexGuard<'_, TraceInner> {
        self.0.lock().unpoison()
    }
    /// The regions every later snapshot holds, at most [`MAX_WATCHES`] (the rest are not watched).
    pub fn set_watches(&self, mut w: Vec<Watch>) {
        debug_assert!(w.len() <= MAX_WATCHES, "{} regions watched", w.len());
        w.truncate(MAX_WATCHES);
        // The old watches go once the lock is let go: the last of them may take a side's memory with it.
        let old = std::mem::replace(&mut self.lock().watches, w);
        drop(old);
    }
    pub fn take(&self) -> Vec<Event> {
        std::mem::take(&mut self.lock().events)
    }
    /// No events and no watched regions: as new, for the next case.
    pub fn reset(&self) {
        let (events, watches) = {
            let mut g = self.lock();
            (std::mem::take(&mut g.events), std::mem::take(&mut g.watches))
        };
        drop((events, watches));
    }
    fn snapshot(inner: &TraceInner) -> Mem {
        let mut m = Mem::default();
        for (i, w) in inner.watches.iter().enumerate() {
            // A watch reads at most WATCH_BYTES, into a zeroed region.
            m.lens[i] = u8::try_from(w(&mut m.bytes[i])).unwrap_or(0);
        }
        m.n = inner.watches.len() as u8;
        m
    }
    pub fn push_wmb(&self) {
        let mut g = self.lock();
        let mem = Self::snapshot(&g);
        g.events.push(Event::Wmb { mem });
    }
    pub fn push_rmb(&self) {
        self.lock().events.push(Event::Rmb);
    }
    fn push_read(&self, off: u64, val: u32) {
        self.lock().events.push(Event::Read { off, val });
    }
    fn push_write(&self, off: u64, val: u32) {
        let mut g = self.lock();
        let mem = Self::snapshot(&g);
        g.events.push(Event::Write { off, val, mem });
    }
}

impl BarrierObserver for Trace {
    fn dma_wmb(&self) {
        self.push_wmb();
    }
    fn dma_rmb(&self) {
        self.push_rmb();
    }
}

/// How CCQPSTATUS answers a CQP create (the write of a non-zero CCQPLOW).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateResponse {
    /// CCQP_DONE.
    Done,
    /// CCQP_ERR | CCQP_DONE with these CQPERRCODES (docs/irdma-device.md, G10).
    Error { errcodes: u32 },
    /// Stays 0: the driver times out.
    Never,
    /// Any other non-zero value, DONE or ERR set or not (a device's garbage): ctrl.c irdma_sc_cqp_create
    /// stops polling at any non-zero value and judges only CCQP_ERR.
    Status { value: u32 },
}

struct Regs {
    create: CreateResponse,
    ccqpstatus: u32,
    cqpdb: u32,
    cqperrcodes: u32,
    cqptail_op_err: bool,
}

impl Default for Regs {
    fn default() -> Self {
        Regs { create: CreateResponse::Done, ccqpstatus: 0, cqpdb: 0, cqperrcodes: 0, cqptail_op_err: false }
    }
}

/// A passive irdma register file. CQPTAIL follows the last CQPDB value (every posted WQE counts as
/// fetched), which is what the register-polled CCQ destroy waits for; CQEs are written by the harness.
pub struct FakeIrdma {
    trace: Trace,
    regs: Mutex<Regs>,
}

impl FakeIrdma {
    pub fn new(trace: Trace, create: CreateResponse) -> Arc<Self> {
        Arc::new(Self { trace, regs: Mutex::new(Regs { create, ..Regs::default() }) })
    }
    /// Every register as after reset, answering a CQP create with `create` (the next case's device).
    pub fn reset(&self, create: CreateResponse) {
        *self.regs() = Regs { create, ..Regs::default() };
    }
    fn regs(&self) -> MutexGuard<'_, Regs> {
        self.regs.lock().unpoison()
    }
    /// Makes CQPTAIL report CQP_OP_ERR with these codes (a failing register-polled command).
    pub fn set_op_err(&self, errcodes: u32) {
        let mut r = self.regs();
        r.cqptail_op_err = true;
        r.cqperrcodes = errcodes;
    }

    fn read(&self, off: u64) -> u32 {
        let r = self.regs();
        match off {
            CQPTAIL => (r.cqpdb & 0x7FF) | if r.cqptail_op_err { 1 << 31 } else { 0 },
            CCQPSTATUS => r.ccqpstatus,
            CQPERRCODES => r.cqperrcodes,
            // PE_DB_SIZE 2 (8 MiB).
            GLPCI_LBARCTRL => 0x20,
            GLPE_CPUSTATUS0..=GLPE_CPUSTATUS2 => 0x80,
            _ => 0,
        }
    }

    fn write(&self, off: u64, val: u32) {
        let mut r = self.regs();
        match off {
            CQPDB => r.cqpdb = val,
            CQPTAIL if val == 0 => r.cqptail_op_err = false,
            CCQPSTATUS if val == 0 => r.ccqpstatus = 0,
            CCQPLOW if val != 0 => match r.create {
                CreateResponse::Done => r.ccqpstatus = 1,
                CreateResponse::Error { errcodes } => {
                    r.ccqpstatus = 0x8000_0001;
                    r.cqperrcodes = errcodes;
                }
                CreateResponse::Never => {}
                CreateResponse::Status { value } => r.ccqpstatus = value,
            },
            CCQPLOW => r.ccqpstatus = 0,
            _ => {}
        }
    }
}

impl DeviceAccess for FakeIrdma {
    fn identity(&self) -> DeviceIdentity {
        DeviceIdentity {
            bars: vec![(0, crate::env::IRDMA_BAR0_SIZE as u64)],
            backend: "in-process",
            ..Default::default()
        }
    }
    fn read32(&self, _bar: u32, offset: u64) -> udriver::access::Result<u32> {
        let v = self.read(offset);
        self.trace.push_read(offset, v);
        Ok(v)
    }
    fn write32(&self, _bar: u32, offset: u64, value: u32) -> udriver::access::Result<()> {
        self.trace.push_write(offset, value);
        self.write(offset, value);
        Ok(())
    }
    fn read64(&self, bar: u32, offset: u64) -> udriver::access::Result<u64> {
        Err(AccessError::BadWidth { bar, offset, width: 8 })
    }
    fn write64(&self, bar: u32, offset: u64, _value: u64) -> udriver::access::Result<()> {
        Err(AccessError::BadWidth { bar, offset, width: 8 })
    }
    fn dma_map(&self, _mem: &Arc<DmaMemory>, _offset: u64, _len: u64, _iova: u64) -> udriver::access::Result<()> {
        Ok(())
    }
    fn dma_unmap(&self, _iova: u64, _len: u64) -> udriver::access::Result<()> {
        Ok(())
    }
    fn enable_msix(&self, _nvec: u32) -> udriver::access::Result<()> {
        Ok(())
    }
    fn wait_irq(&self, _vector: u32, _timeout: Duration) -> udriver::access::Result<bool> {
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_are_equal_only_with_the_same_regions_lengths_and_bytes() {
        let wqe = [7u8; WATCH_BYTES];
        let of = |r: &[&[u8]]| Mem::of(r).unwrap_or_else(|| panic!("{} regions", r.len()));
        let base = of(&[&[], &wqe]);
        let cases: [(&str, Mem, bool); 5] = [
            ("the same", of(&[&[], &wqe]), true),
            ("a region missing", of(&[&wqe]), false),
            ("a shorter region", of(&[&[], &wqe[..56]]), false),
            ("one byte changed", of(&[&[], &[&wqe[..63], &[8]].concat()]), false),
            ("an empty region added", of(&[&[], &wqe, &[]]), false),
        ];
        for (what, m, equal) in cases {
            assert_eq!(m == base, equal, "{what}");
        }
        assert_eq!(base.get(1), Some(&wqe[..]));
        assert_eq!(base.get(0), Some(&[][..]));
        assert_eq!(base.get(2), None);
    }

    #[test]
    fn a_snapshot_refuses_more_regions_or_bytes_than_it_holds() {
        let long = [0u8; WATCH_BYTES + 1];
        assert!(Mem::of(&[&long]).is_none());
        assert!(Mem::of(&[&[], &[], &[], &[]]).is_none());
        assert!(Mem::of(&[&[1], &[2], &[3]]).is_some());
    }
}
