//! A hostile device for the driver: a real engine behind an in-process backend, with every register read,
//! write, DMA map, interrupt wait and the DMA-visible memory perturbed by a fuzzer-chosen script.
//!
//! Starting from a working device and corrupting it reaches deeper driver paths than pure noise: the
//! driver gets past probe and CQP creation and then meets a garbage CQE, a flipped status bit, a failed
//! write or a spurious interrupt. The backend also checks the driver's DMA bookkeeping: a map that
//! overlaps a live mapping, or an unmap of something not mapped, is recorded as a violation, and
//! [`Hostile::live_mappings`] must be empty once the driver let go of all its memory.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use testbed::InProcess;
use udriver::access::{AccessError, DeviceAccess, DeviceIdentity, Result};
use udriver::dma::DmaMemory;
use vfio_user_proto::sync::Unpoison;

/// The fuzzer's bytes, consumed one decision at a time; once used up the device behaves.
pub struct Script {
    bytes: Vec<u8>,
    at: usize,
    /// Decisions left before the script starts: lets a run get deep into a working device first.
    quiet: u32,
}

impl Script {
    pub fn new(bytes: Vec<u8>, quiet: u32) -> Self {
        Script { bytes, at: 0, quiet }
    }
    fn byte(&mut self) -> Option<u8> {
        if self.quiet > 0 {
            self.quiet -= 1;
            return None;
        }
        let b = self.bytes.get(self.at).copied();
        self.at += usize::from(b.is_some());
        b
    }
    /// Data bytes of a decision already taken (never skipped by `quiet`).
    fn data(&mut self) -> u8 {
        let b = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0u64, |acc, i| acc | u64::from(self.data()) << (8 * i))
    }
}

/// How long a slow register read takes: a hundred of them last as long as the driver's completion wait in
/// udriver_hostile (500 us), and pushing a wait past its deadline is what a slow read can change for a
/// driver over an inline engine.
const SLOW_READ: Duration = Duration::from_micros(5);

/// What the device does with one register read.
enum ReadAction {
    Real,
    Value(u64),
    Error,
    FlipBit(u32),
    /// Real value, after storing fuzz bytes into DMA memory (mapping index, offset, bytes).
    Poke(u8, u16, Vec<u8>),
    Slow,
}

/// One live DMA mapping as the backend saw it: length, an alias of the memory (so the device can still
/// corrupt it), offset in that memory.
struct Mapping {
    len: u64,
    mem: Arc<DmaMemory>,
    offset: u64,
}

pub struct Hostile {
    inner: InProcess,
    script: Mutex<Script>,
    /// The driver's live mappings as this backend saw them, by IOVA.
    maps: Mutex<BTreeMap<u64, Mapping>>,
    violations: Mutex<Vec<String>>,
}

impl Hostile {
    /// `quiet`: how many device decisions (register accesses, maps, waits) behave before `script` applies.
    pub fn new(inner: InProcess, script: Vec<u8>, quiet: u32) -> Self {
        Hostile {
            inner,
            script: Mutex::new(Script::new(script, quiet)),
            maps: Mutex::new(BTreeMap::new()),
            violations: Mutex::new(Vec::new()),
        }
    }

    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().unpoison()
    }

    fn violation(&self, v: String) {
        self.violations.lock().unpoison().push(v);
    }

    pub fn violations(&self) -> Vec<String> {
        self.violations.lock().unpoison().clone()
    }

    pub fn live_mappings(&self) -> Vec<(u64, u64)> {
        self.maps.lock().unpoison().iter().map(|(i, m)| (*i, m.len)).collect()
    }

    fn read_action(&self) -> ReadAction {
        let mut s = self.script();
        match s.byte() {
            None => ReadAction::Real,
            Some(b) if b < 0x90 => ReadAction::Real,
            Some(b) if b < 0xB0 => ReadAction::Value(s.u64()),
            Some(b) if b < 0xB8 => ReadAction::Error,
            Some(b) if b < 0xD0 => ReadAction::FlipBit(u32::from(s.data() % 64)),
            Some(b) if b < 0xF0 => {
                let map = s.data();
                let off = u16::from_le_bytes([s.data(), s.data()]);
                let len = usize::from(s.data() % 65);
                let data = (0..len).map(|_| s.data()).collect();
                ReadAction::Poke(map, off, data)
            }
            Some(_) => ReadAction::Slow,
        }
    }

    /// Stores `data` at `off` (wrapped) of the `map`-th live mapping, as a device writing DMA memory.
    fn poke(&self, map: u8, off: u16, data: &[u8]) {
        let maps = self.maps.lock().unpoison();
        if maps.is_empty() || data.is_empty() {
            return;
        }
        let Some((_, m)) = maps.iter().nth(usize::from(map) % maps.len()) else { return };
        let n = (data.len() as u64).min(m.len);
        let at = u64::from(off) % (m.len - n + 1);
        let _ = m.mem.write((m.offset + at) as usize, &data[..n as usize]);
    }

    fn read(&self, width_bits: u32, real: impl FnOnce() -> Result<u64>) -> Result<u64> {
        let mask = if width_bits == 64 { u64::MAX } else { (1u64 << width_bits) - 1 };
        match self.read_action() {
            ReadAction::Real => real(),
            ReadAction::Value(v) => Ok(v & mask),
            ReadAction::Error => Err(AccessError::Errno { op: "hostile read", errno: libc::EIO }),
            ReadAction::FlipBit(b) => real().map(|v| (v ^ (1u64 << b)) & mask),
            ReadAction::Poke(m, off, data) => {
                self.poke(m, off, &data);
                real()
            }
            ReadAction::Slow => {
                std::thread::sleep(SLOW_READ);
                real()
            }
        }
    }

    fn write_fails(&self) -> bool {
        self.script().byte().is_some_and(|b| b >= 0xF0)
    }
}

impl DeviceAccess for Hostile {
    fn identity(&self) -> DeviceIdentity {
        self.inner.identity()
    }
    fn config_read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let v = self.read(8 * buf.len() as u32, || {
            let mut b = [0u8; 8];
            let n = buf.len().min(8);
            self.inner.config_read(offset, &mut b[..n])?;
            Ok(u64::from_le_bytes(b))
        })?;
        let n = buf.len().min(8);
        buf[..n].copy_from_slice(&v.to_le_bytes()[..n]);
        Ok(())
    }
    fn config_write(&self, offset: u64, buf: &[u8]) -> Result<()> {
        if self.write_fails() {
            return Err(AccessError::Errno { op: "hostile config write", errno: libc::EIO });
        }
        self.inner.config_write(offset, buf)
    }
    fn read32(&self, bar: u32, offset: u64) -> Result<u32> {
        self.read(32, || self.inner.read32(bar, offset).map(u64::from)).map(|v| v as u32)
    }
    fn write32(&self, bar: u32, offset: u64, value: u32) -> Result<()> {
        if self.write_fails() {
            return Err(AccessError::Errno { op: "hostile write", errno: libc::EIO });
        }
        self.inner.write32(bar, offset, value)
    }
    fn read64(&self, bar: u32, offset: u64) -> Result<u64> {
        self.read(64, || self.inner.read64(bar, offset))
    }
    fn write64(&self, bar: u32, offset: u64, value: u64) -> Result<()> {
        if self.write_fails() {
            return Err(AccessError::Errno { op: "hostile write", errno: libc::EIO });
        }
        self.inner.write64(bar, offset, value)
    }
    fn dma_map(&self, mem: &Arc<DmaMemory>, offset: u64, len: u64, iova: u64) -> Result<()> {
        if self.write_fails() {
            return Err(AccessError::Errno { op: "hostile DMA map", errno: libc::ENOMEM });
        }
        let end = iova.saturating_add(len);
        {
            let maps = self.maps.lock().unpoison();
            if let Some((b, m)) = maps.range(..end).next_back().filter(|(b, m)| **b + m.len > iova) {
                self.violation(format!("map {iova:#x}+{len:#x} overlaps live mapping {b:#x}+{:#x}", m.len));
            }
        }
        self.inner.dma_map(mem, offset, len, iova)?;
        self.maps.lock().unpoison().insert(iova, Mapping { len, mem: Arc::clone(mem), offset });
        Ok(())
    }
    fn dma_unmap(&self, iova: u64, len: u64) -> Result<()> {
        let removed = self.maps.lock().unpoison().remove(&iova);
        match removed {
            Some(m) if m.len == len => {}
            Some(m) => self.violation(format!("unmap {iova:#x}+{len:#x} of a mapping of {:#x}", m.len)),
            None => self.violation(format!("unmap {iova:#x}+{len:#x} of nothing mapped")),
        }
        self.inner.dma_unmap(iova, len)
    }
    fn enable_msix(&self, nvec: u32) -> Result<()> {
        if self.write_fails() {
            return Err(AccessError::Errno { op: "hostile enable MSI-X", errno: libc::EINVAL });
        }
        self.inner.enable_msix(nvec)
    }
    fn wait_irq(&self, vector: u32, timeout: Duration) -> Result<bool> {
        let b = self.script().byte();
        match b {
            Some(b) if b >= 0xE0 => Ok(true),
            Some(b) if b >= 0xC0 => Ok(false),
            _ => self.inner.wait_irq(vector, timeout.min(Duration::from_millis(2))),
        }
    }
    fn flush_wc(&self) {
        self.inner.flush_wc();
    }
}
