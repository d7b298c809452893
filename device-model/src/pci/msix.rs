//! The MSI-X table and Pending Bit Array in `MSIX_BAR`, and the delivery policy (docs/pci.md "MSI-X").
//!
//! Interrupts leave through `IrqTrigger::trigger(irq::MSIX, vector)`, i.e. the eventfds the client gave with
//! DEVICE_SET_IRQS. The Message Address/Data in the table are stored but never used for delivery. Gates, in
//! order: vector in range; MSI-X Enable and Bus Master Enable set in config space (else dropped); Function Mask
//! or a per-vector mask (else pending in the PBA, sent on unmask). The per-vector masks count only once the
//! client has written the table since reset: QEMU overlays the table with its own emulation and never writes
//! ours, so its power-on "all masked" must not gate QEMU's interrupts.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vfio_user_proto::device::{irq, IrqTrigger};
use vfio_user_proto::sync::Unpoison;

use super::config::MsixLayout;
use super::regs::*;

/// The BAR that holds the MSI-X table and PBA: a 32-bit memory BAR. Engines use BAR0 as a 64-bit BAR (slots
/// 0-1) and may use 2-3; slot 4 is the first one nobody else needs, and 32-bit keeps it below 4 GiB.
pub const MSIX_BAR: u32 = 4;

/// Page alignment that keeps the table and the PBA on separate pages.
const MSIX_PAGE: u64 = 4096;

/// Where the table and PBA go in `MSIX_BAR` for `vectors`, and the BAR size.
pub fn msix_bar_layout(vectors: u16) -> (MsixLayout, u64) {
    let vectors = vectors.clamp(1, PCI_MSIX_MAX_VECTORS);
    let table_bytes = u64::from(vectors) * PCI_MSIX_ENTRY_SIZE as u64;
    let pba_offset = table_bytes.div_ceil(MSIX_PAGE) * MSIX_PAGE;
    let pba_bytes = u64::from(vectors).div_ceil(64) * 8;
    let size = (pba_offset + pba_bytes).next_power_of_two().max(MSIX_PAGE);
    let layout =
        MsixLayout { vectors, table_bar: MSIX_BAR, table_offset: 0, pba_bar: MSIX_BAR, pba_offset: pba_offset as u32 };
    (layout, size)
}

/// Writable bits of one table entry, byte by byte: the address is dword aligned (bits 1:0 read 0), and
/// only the Mask bit of Vector Control is implemented.
const ENTRY_WMASK: [u8; PCI_MSIX_ENTRY_SIZE] =
    [0xfc, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0, 0];

/// Counters of the delivery policy, for dumps and tests.
#[derive(Debug, Default)]
pub struct MsixStats {
    pub delivered: AtomicU64,
    pub pended: AtomicU64,
    /// MSI-X or Bus Master disabled, or no client attached.
    pub dropped_disabled: AtomicU64,
    /// The engine raised a vector the function does not have.
    pub dropped_bad_vector: AtomicU64,
}

struct MsixState {
    table: Vec<u8>,
    pba: Vec<u64>,
    enabled: bool,
    function_masked: bool,
    bus_master: bool,
    /// The client wrote the table since reset, so its per-vector masks are live.
    table_programmed: bool,
    irq: Option<Arc<dyn IrqTrigger>>,
}

impl MsixState {
    fn vector_masked(&self, v: u16) -> bool {
        let ctrl = usize::from(v) * PCI_MSIX_ENTRY_SIZE + PCI_MSIX_ENTRY_VECTOR_CTRL;
        self.table_programmed && self.table.get(ctrl).is_some_and(|b| u32::from(*b) & PCI_MSIX_ENTRY_CTRL_MASKBIT != 0)
    }
    fn masked(&self, v: u16) -> bool {
        self.function_masked || self.vector_masked(v)
    }
    fn pending(&self, v: u16) -> bool {
        self.pba.get(usize::from(v / 64)).is_some_and(|w| w & (1 << (v % 64)) != 0)
    }
    fn set_pending(&mut self, v: u16, on: bool) {
        if let Some(w) = self.pba.get_mut(usize::from(v / 64)) {
            if on {
                *w |= 1 << (v % 64);
            } else {
                *w &= !(1 << (v % 64));
            }
        }
    }
    /// Pending vectors that may go now; their pending bits are cleared.
    fn take_deliverable(&mut self, vectors: u16) -> Vec<u16> {
        if !self.enabled || !self.bus_master || self.function_masked {
            return Vec::new();
        }
        let ready: Vec<u16> = (0..vectors).filter(|&v| self.pending(v) && !self.vector_masked(v)).collect();
        for &v in &ready {
            self.set_pending(v, false);
        }
        ready
    }
}

pub struct Msix {
    vectors: u16,
    pba_offset: u64,
    bar_size: u64,
    state: Mutex<MsixState>,
    pub stats: MsixStats,
}

impl Msix {
    pub fn new(vectors: u16) -> Self {
        let (layout, bar_size) = msix_bar_layout(vectors);
        let vectors = layout.vectors;
        let state = MsixState {
            table: power_on_table(vectors),
            pba: vec![0; usize::from(vectors).div_ceil(64)],
            enabled: false,
            function_masked: false,
            bus_master: false,
            table_programmed: false,
            irq: None,
        };
        Msix {
            vectors,
            pba_offset: u64::from(layout.pba_offset),
            bar_size,
            state: Mutex::new(state),
            stats: MsixStats::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, MsixState> {
        self.state.lock().unpoison()
    }

    /// Bytes of the vector table.
    pub fn table_len(&self) -> u64 {
        u64::from(self.vectors) * PCI_MSIX_ENTRY_SIZE as u64
    }
    /// Bytes of the Pending Bit Array (whole qwords).
    pub fn pba_len(&self) -> u64 {
        u64::from(self.vectors).div_ceil(64) * 8
    }
    /// Where the PBA sits in this structure's own address space (the table is at 0).
    pub fn pba_offset(&self) -> u64 {
        self.pba_offset
    }
    pub fn vectors(&self) -> u16 {
        self.vectors
    }
    pub fn bar_size(&self) -> u64 {
        self.bar_size
    }

    pub fn attach(&self, irq: Arc<dyn IrqTrigger>) {
        self.lock().irq = Some(irq);
    }
    pub fn detach(&self) {
        self.lock().irq = None;
    }

    /// Power-on state: every vector masked, nothing pending, MSI-X off. The client connection stays.
    pub fn reset(&self) {
        let mut s = self.lock();
        s.table = power_on_table(self.vectors);
        s.pba.iter_mut().for_each(|w| *w = 0);
        s.enabled = false;
        s.function_masked = false;
        s.bus_master = false;
        s.table_programmed = false;
    }

    /// Follows config space: MSI-X Message Control and the command register's Bus Master Enable.
    pub fn set_control(&self, msix_control: u16, bus_master: bool) {
        let (irq, ready) = {
            let mut s = self.lock();
            s.enabled = msix_control & PCI_MSIX_FLAGS_ENABLE != 0;
            s.function_masked = msix_control & PCI_MSIX_FLAGS_MASKALL != 0;
            s.bus_master = bus_master;
            if !s.enabled {
                // A disabled function does not use MSI-X; nothing stays pending for a later enable.
                s.pba.iter_mut().for_each(|w| *w = 0);
            }
            (s.irq.clone(), s.take_deliverable(self.vectors))
        };
        self.send(irq, &ready);
    }

    /// The engine's interrupt.
    pub fn raise(&self, vector: u16) {
        if vector >= self.vectors {
            self.stats.dropped_bad_vector.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(vector, vectors = self.vectors, "MSI-X vector out of range dropped");
            return;
        }
        let irq = {
            let mut s = self.lock();
            if !s.enabled || !s.bus_master || s.irq.is_none() {
                self.stats.dropped_disabled.fetch_add(1, Ordering::Relaxed);
                return;
            }
            if s.masked(vector) {
                s.set_pending(vector, true);
                self.stats.pended.fetch_add(1, Ordering::Relaxed);
                return;
            }
            s.irq.clone()
        };
        self.send(irq, &[vector]);
    }

    fn send(&self, irq: Option<Arc<dyn IrqTrigger>>, vectors: &[u16]) {
        let Some(irq) = irq else {
            self.stats.dropped_disabled.fetch_add(vectors.len() as u64, Ordering::Relaxed);
            return;
        };
        for &v in vectors {
            irq.trigger(irq::MSIX, u32::from(v));
            self.stats.delivered.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A read of `MSIX_BAR` (range already checked against `bar_size`). Bytes outside the table and the
    /// PBA read as all-ones.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        let s = self.lock();
        let table_end = s.table.len() as u64;
        let pba_end = self.pba_offset + s.pba.len() as u64 * 8;
        for (i, b) in data.iter_mut().enumerate() {
            let at = offset.saturating_add(i as u64);
            *b = if at < table_end {
                s.table.get(at as usize).copied().unwrap_or(0xff)
            } else if (self.pba_offset..pba_end).contains(&at) {
                let rel = at - self.pba_offset;
                let word = s.pba.get((rel / 8) as usize).copied().unwrap_or(0);
                word.to_le_bytes()[(rel % 8) as usize]
            } else {
                0xff
            };
        }
    }

    /// A write of `MSIX_BAR`. Table bytes follow the entry mask; the PBA is read-only; the rest is ignored.
    pub fn write(&self, offset: u64, data: &[u8]) {
        let (irq, ready) = {
            let mut s = self.lock();
            let table_end = s.table.len() as u64;
            let mut touched = false;
            for (i, &val) in data.iter().enumerate() {
                let at = offset.saturating_add(i as u64);
                if at >= table_end {
                    continue;
                }
                let wm = ENTRY_WMASK[at as usize % PCI_MSIX_ENTRY_SIZE];
                if let Some(b) = s.table.get_mut(at as usize) {
                    *b = (*b & !wm) | (val & wm);
                    touched = true;
                }
            }
            if touched {
                s.table_programmed = true;
            }
            (s.irq.clone(), s.take_deliverable(self.vectors))
        };
        self.send(irq, &ready);
    }

    /// Pending bits, for dumps and tests.
    pub fn pending_vectors(&self) -> Vec<u16> {
        let s = self.lock();
        (0..self.vectors).filter(|&v| s.pending(v)).collect()
    }

    pub fn snapshot(&self) -> serde_json::Value {
        let s = self.lock();
        serde_json::json!({
            "vectors": self.vectors,
            "enabled": s.enabled,
            "function_masked": s.function_masked,
            "bus_master": s.bus_master,
            "table_programmed": s.table_programmed,
            "pending": (0..self.vectors).filter(|&v| s.pending(v)).collect::<Vec<_>>(),
            "delivered": self.stats.delivered.load(Ordering::Relaxed),
            "pended": self.stats.pended.load(Ordering::Relaxed),
            "dropped_disabled": self.stats.dropped_disabled.load(Ordering::Relaxed),
            "dropped_bad_vector": self.stats.dropped_bad_vector.load(Ordering::Relaxed),
        })
    }
}

fn power_on_table(vectors: u16) -> Vec<u8> {
    let mut t = vec![0u8; usize::from(vectors) * PCI_MSIX_ENTRY_SIZE];
    for entry in t.chunks_exact_mut(PCI_MSIX_ENTRY_SIZE) {
        entry[PCI_MSIX_ENTRY_VECTOR_CTRL] = PCI_MSIX_ENTRY_CTRL_MASKBIT as u8;
    }
    t
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Records every trigger.
    #[derive(Default)]
    pub(crate) struct RecordingIrq(pub Mutex<Vec<(u32, u32)>>);
    impl IrqTrigger for RecordingIrq {
        fn trigger(&self, index: u32, vector: u32) {
            self.0.lock().unwrap().push((index, vector));
        }
    }
    impl RecordingIrq {
        pub(crate) fn take(&self) -> Vec<(u32, u32)> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    const ON: u16 = PCI_MSIX_FLAGS_ENABLE;
    const ON_MASKED: u16 = PCI_MSIX_FLAGS_ENABLE | PCI_MSIX_FLAGS_MASKALL;

    fn msix(vectors: u16) -> (Msix, Arc<RecordingIrq>) {
        let m = Msix::new(vectors);
        let irq = Arc::new(RecordingIrq::default());
        m.attach(irq.clone());
        (m, irq)
    }

    fn ctrl_write(m: &Msix, v: u16, mask: bool) {
        let off = u64::from(v) * 16 + PCI_MSIX_ENTRY_VECTOR_CTRL as u64;
        m.write(off, &u32::from(mask).to_le_bytes());
    }

    #[test]
    fn layout_puts_pba_on_its_own_page_and_sizes_the_bar() {
        // (vectors, PBA offset, BAR size)
        let cases = [
            (1u16, 0x1000u64, 0x2000u64),
            (16, 0x1000, 0x2000),
            (256, 0x1000, 0x2000),
            (257, 0x2000, 0x4000),
            (2048, 0x8000, 0x10000),
        ];
        for (n, pba, size) in cases {
            let (l, s) = msix_bar_layout(n);
            assert_eq!((l.vectors, u64::from(l.pba_offset), s, l.table_offset), (n, pba, size, 0), "{n} vectors");
            assert_eq!((l.table_bar, l.pba_bar), (MSIX_BAR, MSIX_BAR));
        }
        assert_eq!(msix_bar_layout(5000).0.vectors, 2048);
    }

    #[test]
    fn power_on_table_has_every_vector_masked_and_pba_clear() {
        let m = Msix::new(3);
        let mut entry = [0u8; 16];
        for v in 0..3u64 {
            m.read(v * 16, &mut entry);
            assert_eq!(entry, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
        }
        let mut pba = [0xaau8; 8];
        m.read(0x1000, &mut pba);
        assert_eq!(pba, [0; 8]);
        let mut gap = [0u8; 4];
        m.read(0x40, &mut gap);
        assert_eq!(gap, [0xff; 4], "between table and PBA nothing claims the bytes");
    }

    #[test]
    fn table_entry_keeps_only_implemented_bits() {
        let m = Msix::new(2);
        m.write(16, &[0xff; 16]);
        let mut e = [0u8; 16];
        m.read(16, &mut e);
        assert_eq!(e, [0xfc, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0, 0]);
    }

    #[test]
    fn pba_is_read_only() {
        let (m, _irq) = msix(4);
        m.set_control(ON_MASKED, true);
        m.raise(2);
        m.write(0x1000, &[0; 8]);
        let mut pba = [0u8; 8];
        m.read(0x1000, &mut pba);
        assert_eq!(pba[0], 0b100);
    }

    #[test]
    fn untouched_table_delivers_once_enabled_like_under_qemu() {
        let (m, irq) = msix(4);
        m.raise(1);
        assert_eq!(irq.take(), vec![], "MSI-X disabled: dropped");
        m.set_control(ON, false);
        m.raise(1);
        assert_eq!(irq.take(), vec![], "bus master disabled: dropped");
        m.set_control(ON, true);
        m.raise(1);
        assert_eq!(irq.take(), vec![(irq::MSIX, 1)]);
        assert_eq!(m.stats.dropped_disabled.load(Ordering::Relaxed), 2);
        assert!(m.pending_vectors().is_empty());
    }

    #[test]
    fn function_mask_pends_and_unmask_delivers_once() {
        let (m, irq) = msix(4);
        m.set_control(ON_MASKED, true);
        m.raise(3);
        m.raise(3);
        m.raise(0);
        assert_eq!(irq.take(), vec![]);
        assert_eq!(m.pending_vectors(), vec![0, 3]);
        m.set_control(ON, true);
        assert_eq!(irq.take(), vec![(irq::MSIX, 0), (irq::MSIX, 3)]);
        assert!(m.pending_vectors().is_empty());
    }

    #[test]
    fn programmed_table_vector_mask_pends_and_table_unmask_delivers() {
        let (m, irq) = msix(4);
        m.set_control(ON, true);
        ctrl_write(&m, 0, false);
        m.raise(0);
        assert_eq!(irq.take(), vec![(irq::MSIX, 0)]);
        // Vector 2 still has its power-on mask, which counts now that the client wrote the table.
        m.raise(2);
        assert_eq!(irq.take(), vec![]);
        assert_eq!(m.pending_vectors(), vec![2]);
        ctrl_write(&m, 2, false);
        assert_eq!(irq.take(), vec![(irq::MSIX, 2)]);
    }

    #[test]
    fn disabling_msix_discards_pending_bits() {
        let (m, irq) = msix(4);
        m.set_control(ON_MASKED, true);
        m.raise(1);
        m.set_control(PCI_MSIX_FLAGS_MASKALL, true);
        assert!(m.pending_vectors().is_empty());
        m.set_control(ON, true);
        assert_eq!(irq.take(), vec![]);
    }

    #[test]
    fn out_of_range_vector_is_counted_and_dropped() {
        let (m, irq) = msix(4);
        m.set_control(ON, true);
        m.raise(4);
        m.raise(u16::MAX);
        assert_eq!(irq.take(), vec![]);
        assert_eq!(m.stats.dropped_bad_vector.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn reset_restores_masks_and_forgets_programming() {
        let (m, irq) = msix(2);
        m.set_control(ON_MASKED, true);
        ctrl_write(&m, 1, false);
        m.raise(1);
        m.reset();
        assert!(m.pending_vectors().is_empty());
        let mut e = [0u8; 16];
        m.read(16, &mut e);
        assert_eq!(e[12], 1);
        m.set_control(ON, true);
        m.raise(1);
        assert_eq!(irq.take(), vec![(irq::MSIX, 1)], "reset table is unprogrammed again, so it does not gate");
    }
}
