//! Where the PCI function observes and perturbs what passes through it: register and config accesses (named
//! trace, access log, stuck bits, surprise removal), the engine's DMA (trace, failed reads and writes) and its
//! interrupts (trace, suppression). docs/observe.md.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use vfio_user_proto::dma::{DmaAccess, DmaError, DmaRegion};

use crate::engine::{Engine, Interrupt};
use crate::fault::{FaultKind, Params, RegRef};
use crate::probe::Probe;
use crate::trace::access_log::AccessLog;
use crate::trace::{Block, Level, RegisterName, Val};

/// The function's side of its probe.
pub(super) struct Observer {
    pub probe: Arc<Probe>,
    /// Set once a `removed` fault fired in this session.
    removed: AtomicBool,
    log_on: AtomicBool,
    log: Mutex<AccessLog>,
}

fn le_value(data: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = data.len().min(8);
    b[..n].copy_from_slice(&data[..n]);
    u64::from_le_bytes(b)
}

/// Whether the register fault `p` covers any byte of `[offset, offset + len)` of `bar`.
fn covers(p: &Params, bar: u32, offset: u64, len: usize) -> bool {
    matches!(p.reg, Some(RegRef::Offset { bar: b, offset: o }) if b == bar && o < offset + len as u64 && offset < o.saturating_add(8))
}

/// How an observed BAR access names its register: the name, decoded with the value, for a trace; and only
/// whether it has one for the access log, which asks of every access.
pub trait RegisterNaming {
    fn name(&self, value: u64) -> RegisterName;
    fn is_named(&self) -> bool;
}

impl Observer {
    pub fn new(probe: Arc<Probe>, log: bool) -> Self {
        Observer { probe, removed: AtomicBool::new(false), log_on: AtomicBool::new(log), log: Mutex::default() }
    }

    /// A new client: a fresh access log, faults counting from the start, the device present again.
    pub fn new_session(&self) {
        *self.log.lock().unwrap_or_else(|e| e.into_inner()) = AccessLog::default();
        self.probe.faults.restart();
        self.removed.store(false, Ordering::Release);
    }

    /// Whether the device is gone: a `removed` fault fired at this access or before, or the engine died (a
    /// worker job panicked, `Probe::dead`).
    pub fn removed(&self) -> bool {
        if self.gone() {
            return true;
        }
        if self.probe.fault(FaultKind::Removed, |_| true).is_some() {
            self.removed.store(true, Ordering::Release);
            return true;
        }
        false
    }

    /// Whether the device is gone already, without counting an access toward a `removed` fault.
    fn gone(&self) -> bool {
        self.removed.load(Ordering::Acquire) || self.probe.dead()
    }

    /// After a BAR read: stuck (and flipped) bits, then the trace and the access log see the value the client gets.
    /// `name` names the register.
    pub fn bar_read(&self, name: &impl RegisterNaming, bar: u32, offset: u64, data: &mut [u8]) {
        if self.probe.faults.armed(FaultKind::RegStuck) {
            if let Some(f) = self.probe.fault(FaultKind::RegStuck, |p| covers(p, bar, offset, data.len())) {
                if let Some(RegRef::Offset { offset: reg, .. }) = f.params.reg {
                    for (i, byte) in data.iter_mut().enumerate() {
                        let Some(shift) = (offset + i as u64).checked_sub(reg).filter(|s| *s < 8) else { continue };
                        let byte_of = |w: u64| (w >> (8 * shift)) as u8;
                        let (m, v, x) = (byte_of(f.params.mask), byte_of(f.params.value), byte_of(f.params.xor));
                        *byte = ((*byte & !m) | (v & m)) ^ x;
                    }
                }
            }
        }
        self.observe(name, false, bar, offset, data);
    }

    pub fn bar_write(&self, name: &impl RegisterNaming, bar: u32, offset: u64, data: &[u8]) {
        self.observe(name, true, bar, offset, data);
    }

    fn observe(&self, naming: &impl RegisterNaming, write: bool, bar: u32, offset: u64, data: &[u8]) {
        // Tracing off and no log: one load each, and nothing is named.
        let traced = self.probe.trace.any(Level::Debug);
        let logged = self.log_on.load(Ordering::Relaxed);
        if !traced && !logged {
            return;
        }
        let value = le_value(data);
        // The log keeps offsets and whether they are named (names are built when it is dumped), so without a
        // trace nothing is formatted.
        let name = traced.then(|| naming.name(value));
        if logged {
            let named = name.as_ref().map_or_else(|| naming.is_named(), |n| n.name.is_some());
            self.log.lock().unwrap_or_else(|e| e.into_inner()).record(write, bar, offset, value, named);
        }
        if let Some(name) = name.filter(|n| self.probe.trace.on(n.block, Level::Debug)) {
            self.probe.trace.register(&name, write, bar, offset, data.len(), value);
        }
    }

    pub fn config(&self, write: bool, offset: u64, data: &[u8]) {
        if self.probe.trace.on(Block::Pci, Level::Debug) {
            let name = RegisterName { block: Block::Pci, name: Some(config_name(offset)), fields: String::new() };
            self.probe.trace.register(
                &name,
                write,
                vfio_user_proto::device::region::CONFIG,
                offset,
                data.len(),
                le_value(data),
            );
        }
    }

    /// `{"cmd":"accesses"}`: the log (optionally switched on or off first).
    pub fn accesses(&self, engine: &dyn Engine, keep: Option<bool>) -> serde_json::Value {
        if let Some(k) = keep {
            self.log_on.store(k, Ordering::Relaxed);
        }
        let mut d = self
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .dump(|bar, offset, value| engine.register_name(bar, offset, Some(value)));
        d["kept"] = self.log_on.load(Ordering::Relaxed).into();
        d
    }
}

/// Config space registers by their pci_regs.h names (capabilities by their own offsets).
fn config_name(offset: u64) -> String {
    let name = match offset {
        0x00 => "PCI_VENDOR_ID",
        0x02 => "PCI_DEVICE_ID",
        0x04 => "PCI_COMMAND",
        0x06 => "PCI_STATUS",
        0x08 => "PCI_CLASS_REVISION",
        0x0c => "PCI_CACHE_LINE_SIZE",
        0x0e => "PCI_HEADER_TYPE",
        0x10..=0x27 => return format!("PCI_BASE_ADDRESS_{}", (offset - 0x10) / 4),
        0x2c => "PCI_SUBSYSTEM_VENDOR_ID",
        0x2e => "PCI_SUBSYSTEM_ID",
        0x30 => "PCI_ROM_ADDRESS",
        0x34 => "PCI_CAPABILITY_LIST",
        0x3c => "PCI_INTERRUPT_LINE",
        0x3d => "PCI_INTERRUPT_PIN",
        _ => return format!("CONFIG+{offset:#x}"),
    };
    name.to_string()
}

/// The engine's DMA as the function passes it on: traced, and failed where a fault says so.
pub(super) struct ProbedDma {
    inner: Arc<dyn DmaAccess>,
    obs: Arc<Observer>,
}

impl ProbedDma {
    pub fn new(inner: Arc<dyn DmaAccess>, obs: Arc<Observer>) -> Self {
        ProbedDma { inner, obs }
    }

    fn refused(&self, kind: FaultKind, iova: u64, len: u64) -> Result<(), DmaError> {
        if self.obs.gone() || self.obs.probe.fault(kind, |_| true).is_some() {
            return Err(DmaError::Unmapped { iova, len });
        }
        Ok(())
    }

    fn trace(&self, kind: &'static str, iova: u64, len: u64, dst: Option<u64>, result: &Result<(), DmaError>) {
        let t = &self.obs.probe.trace;
        if t.on(Block::Dma, Level::Trace) {
            let outcome = match result {
                Ok(()) => "ok".to_string(),
                Err(e) => e.to_string(),
            };
            let mut fields = vec![("iova", Val::Hex(iova)), ("len", Val::Dec(len))];
            if let Some(d) = dst {
                fields.push(("dst", Val::Hex(d)));
            }
            fields.push(("result", Val::Owned(outcome)));
            t.event(Block::Dma, Level::Trace, kind, &fields);
        }
    }
}

impl DmaAccess for ProbedDma {
    fn regions(&self) -> Option<Vec<DmaRegion>> {
        self.inner.regions()
    }
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let len = buf.len() as u64;
        let r = self.refused(FaultKind::DmaReadFail, iova, len).and_then(|()| self.inner.read(iova, buf));
        self.trace("dma-read", iova, len, None, &r);
        r
    }
    fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        let len = buf.len() as u64;
        let r = self.refused(FaultKind::DmaWriteFail, iova, len).and_then(|()| self.inner.write(iova, buf));
        self.trace("dma-write", iova, len, None, &r);
        r
    }
    fn check_read(&self, iova: u64, len: u64) -> Result<(), DmaError> {
        if self.obs.gone() {
            return Err(DmaError::Unmapped { iova, len });
        }
        self.inner.check_read(iova, len)
    }
    /// A copy is a read and a write to the faults; the inner copy keeps its direct path.
    fn copy(&self, src: u64, dst: u64, len: u64) -> Result<(), DmaError> {
        let r = self
            .refused(FaultKind::DmaReadFail, src, len)
            .and_then(|()| self.refused(FaultKind::DmaWriteFail, dst, len))
            .and_then(|()| self.inner.copy(src, dst, len));
        self.trace("dma-copy", src, len, Some(dst), &r);
        r
    }
}

/// The engine's interrupts as the function passes them on.
pub(super) struct ProbedInterrupt {
    inner: Arc<dyn Interrupt>,
    obs: Arc<Observer>,
}

impl ProbedInterrupt {
    pub fn new(inner: Arc<dyn Interrupt>, obs: Arc<Observer>) -> Self {
        ProbedInterrupt { inner, obs }
    }
}

impl Interrupt for ProbedInterrupt {
    fn raise(&self, vector: u16) {
        let suppressed = self.obs.gone()
            || self.obs.probe.fault(FaultKind::MsixDrop, |p| p.vector.is_none_or(|v| v == vector)).is_some();
        let t = &self.obs.probe.trace;
        if t.on(Block::Irq, Level::Info) {
            let outcome = if suppressed { "suppressed" } else { "raised" };
            t.event(
                Block::Irq,
                Level::Info,
                "irq",
                &[("vector", Val::Dec(u64::from(vector))), ("result", Val::Str(outcome))],
            );
        }
        if !suppressed {
            self.inner.raise(vector);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: u64) -> Params {
        Params { reg: Some(RegRef::Offset { bar: 0, offset }), ..Default::default() }
    }

    /// A register fault covers the 8 bytes of its register, and an offset a client put at the top of the
    /// address space covers nothing rather than overflowing.
    #[test]
    fn a_register_fault_covers_its_eight_bytes_and_nothing_past_the_address_space() {
        let cases: [(u64, u32, u64, usize, bool); 7] = [
            (0x100, 0, 0x100, 8, true),
            (0x100, 0, 0x104, 4, true),
            (0x100, 0, 0xfc, 4, false),
            (0x100, 0, 0x108, 8, false),
            (0x100, 1, 0x100, 8, false),
            (u64::MAX - 7, 0, 0x100, 8, false),
            (u64::MAX - 7, 0, u64::MAX - 15, 8, false),
        ];
        for (fault, bar, offset, len, want) in cases {
            assert_eq!(covers(&at(fault), bar, offset, len), want, "fault {fault:#x}, access {bar}:{offset:#x}+{len}");
        }
    }
}
