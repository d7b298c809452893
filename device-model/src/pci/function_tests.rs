#![forbid(unsafe_code)]

use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicUsize;

use vfio_user_proto::device::{IrqTrigger, RegionFd};
use vfio_user_proto::dma::{DmaAccess, DmaError, HeapMemory};

use super::*;
use crate::engine::BarMmap;
use crate::pci::msix::tests::RecordingIrq;

const BAR0_SIZE: u64 = 0x10000;
const VECTORS: u16 = 8;

type Attachment = (Arc<dyn DmaAccess>, Arc<dyn Interrupt>);

/// A tiny engine: BAR0 is plain memory, BAR2 a 4 KiB 32-bit BAR; counts lifecycle calls.
#[derive(Default)]
struct FakeEngine {
    mem: Mutex<Vec<u8>>,
    bars: Vec<BarSpec>,
    resets: AtomicUsize,
    detaches: AtomicUsize,
    attached: Mutex<Option<Attachment>>,
}

fn memfd() -> Arc<OwnedFd> {
    let f = memfd::MemfdOptions::default().create("fake-bar").unwrap().into_file();
    f.set_len(BAR0_SIZE).unwrap();
    Arc::new(OwnedFd::from(f))
}

impl FakeEngine {
    fn with_bars(bars: Vec<BarSpec>) -> Arc<Self> {
        Arc::new(FakeEngine { mem: Mutex::new(vec![0; BAR0_SIZE as usize]), bars, ..Default::default() })
    }
    fn standard() -> Arc<Self> {
        Self::with_bars(vec![
            BarSpec {
                index: 0,
                size: BAR0_SIZE,
                is_64bit: true,
                prefetchable: false,
                mmap: Some(BarMmap {
                    areas: vec![(0x1000, 0x2000), (0x8000, 0x1000)],
                    fd: RegionFd { fd: memfd(), fd_offset: 0 },
                }),
            },
            BarSpec { index: 2, size: 0x1000, is_64bit: false, prefetchable: true, mmap: None },
        ])
    }
    fn irq(&self) -> Arc<dyn Interrupt> {
        self.attached.lock().unwrap().as_ref().unwrap().1.clone()
    }
    fn dma(&self) -> Arc<dyn DmaAccess> {
        self.attached.lock().unwrap().as_ref().unwrap().0.clone()
    }
}

impl Engine for FakeEngine {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn bars(&self) -> Vec<BarSpec> {
        self.bars.clone()
    }
    fn msix_vectors(&self) -> u16 {
        VECTORS
    }
    fn mmio_read(&self, _bar: u32, offset: u64, data: &mut [u8]) {
        let m = self.mem.lock().unwrap();
        data.copy_from_slice(&m[offset as usize..offset as usize + data.len()]);
    }
    fn mmio_write(&self, _bar: u32, offset: u64, data: &[u8]) {
        self.mem.lock().unwrap()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    }
    fn attach(&self, dma: Arc<dyn DmaAccess>, irq: Arc<dyn Interrupt>) {
        *self.attached.lock().unwrap() = Some((dma, irq));
    }
    fn detach(&self) {
        self.detaches.fetch_add(1, Ordering::SeqCst);
        *self.attached.lock().unwrap() = None;
    }
    fn reset(&self) {
        self.resets.fetch_add(1, Ordering::SeqCst);
    }
    fn control(&self, request: &serde_json::Value) -> Result<serde_json::Value, String> {
        Ok(request.clone())
    }
}

fn function() -> (Arc<Function>, Arc<FakeEngine>) {
    let e = FakeEngine::standard();
    (Function::try_new(e.clone(), PciIds::hfi1_default()).unwrap(), e)
}

fn attached() -> (Arc<Function>, Arc<FakeEngine>, Arc<RecordingIrq>, Arc<HeapMemory>) {
    let (f, e) = function();
    let irq = Arc::new(RecordingIrq::default());
    let mem = Arc::new(HeapMemory::new());
    assert!(mem.map(0x10_0000, 0x1000));
    f.attach(DeviceContext { dma: mem.clone(), irq: irq.clone() as Arc<dyn IrqTrigger> });
    (f, e, irq, mem)
}

fn cfg_w16(f: &Function, off: u64, v: u16) {
    f.region_write(region::CONFIG, off, &v.to_le_bytes()).unwrap();
}
fn cfg_w32(f: &Function, off: u64, v: u32) {
    f.region_write(region::CONFIG, off, &v.to_le_bytes()).unwrap();
}
fn cfg_r16(f: &Function, off: u64) -> u16 {
    let mut b = [0; 2];
    f.region_read(region::CONFIG, off, &mut b).unwrap();
    u16::from_le_bytes(b)
}
fn cfg_r32(f: &Function, off: u64) -> u32 {
    let mut b = [0; 4];
    f.region_read(region::CONFIG, off, &mut b).unwrap();
    u32::from_le_bytes(b)
}

const MSIX_CTRL: u64 = 0x82;
const DEVCTL: u64 = 0x48;

#[test]
fn device_info_is_a_resettable_pci_device_with_nine_regions_and_five_irq_indices() {
    let (f, _) = function();
    assert_eq!(
        f.device_info(),
        DeviceInfo { flags: device_flags::PCI | device_flags::RESET, num_regions: 9, num_irqs: 5 }
    );
}

#[test]
fn region_info_describes_every_index() {
    let (f, _) = function();
    let rw = region_flags::READ | region_flags::WRITE;
    // (index, size, flags)
    let cases = [
        (0u32, BAR0_SIZE, rw | region_flags::MMAP | region_flags::CAPS),
        (1, 0, 0), // upper half of the 64-bit BAR0
        (2, 0x1000, rw),
        (3, 0, 0),
        (4, 0x2000, rw), // MSI-X: 8 vectors, PBA at 0x1000
        (5, 0, 0),
        (region::ROM, 0, 0),
        (region::CONFIG, 4096, rw),
        (region::VGA, 0, 0),
    ];
    for (index, size, flags) in cases {
        let info = f.region_info(index).unwrap();
        assert_eq!((info.size, info.flags), (size, flags), "region {index}");
    }
    let bar0 = f.region_info(0).unwrap();
    assert_eq!(
        bar0.sparse_areas,
        vec![SparseArea { offset: 0x1000, size: 0x2000 }, SparseArea { offset: 0x8000, size: 0x1000 }]
    );
    assert!(bar0.fd.is_some());
    assert!(f.region_info(2).unwrap().fd.is_none());
    assert!(f.region_info(9).is_none());
    assert!(f.region_info(u32::MAX).is_none());
}

#[test]
fn irq_info_offers_only_msix_vectors() {
    let (f, _) = function();
    let ev = irq_flags::EVENTFD;
    assert_eq!(f.irq_info(irq::MSIX), Some(IrqInfo { flags: ev | irq_flags::NORESIZE, count: 8 }));
    assert_eq!(f.irq_info(irq::INTX).unwrap().count, 0);
    assert_eq!(f.irq_info(irq::MSI).unwrap().count, 0);
    assert_eq!(f.irq_info(irq::ERR).unwrap().count, 0);
    assert_eq!(f.irq_info(irq::REQ).unwrap().count, 0);
    assert_eq!(f.irq_info(5), None);
}

#[test]
fn config_bars_describe_the_engine_bars_and_the_msix_bar() {
    let (f, _) = function();
    for (off, want) in
        [(0x10u64, 0xffff_0004u32), (0x14, 0xffff_ffff), (0x18, 0xffff_f008), (0x1c, 0), (0x20, 0xffff_e000), (0x24, 0)]
    {
        cfg_w32(&f, off, 0xffff_ffff);
        assert_eq!(cfg_r32(&f, off), want, "BAR register {off:#x}");
    }
}

#[test]
fn whole_config_space_reads_in_one_access_as_qemu_does_at_realize() {
    let (f, _) = function();
    let mut all = vec![0u8; 4096];
    f.region_read(region::CONFIG, 0, &mut all).unwrap();
    assert_eq!(&all[..4], &[0x36, 0x1b, 0x00, 0x11]);
    assert_eq!(all[0x34], 0x40);
    // An unaligned multi-byte write is split the same way and still obeys the masks.
    f.region_write(region::CONFIG, 0x03, &[0xff, 0xff, 0xff]).unwrap();
    assert_eq!(cfg_r16(&f, 0x04), 0x0546);
    assert_eq!(cfg_r16(&f, 0x02), 0x1100);
}

#[test]
fn dispatch_errors_are_errno() {
    let (f, _) = function();
    cfg_w16(&f, 0x04, PCI_COMMAND_MEMORY);
    let mut b8 = [0u8; 8];
    // (index, offset, len, errno)
    let cases: &[(u32, u64, usize, i32)] = &[
        (0, 0, 3, libc::EINVAL),
        (0, 0, 16, libc::EINVAL),
        (0, 0, 0, libc::EINVAL),
        (0, BAR0_SIZE - 4, 8, libc::EINVAL),
        (0, u64::MAX - 2, 4, libc::EINVAL),
        (1, 0, 4, libc::EINVAL),
        (3, 0, 4, libc::EINVAL),
        (4, 0x2000, 4, libc::EINVAL),
        (region::ROM, 0, 4, libc::EINVAL),
        (region::VGA, 0, 4, libc::EINVAL),
        (region::NUM_REGIONS, 0, 4, libc::EINVAL),
        (u32::MAX, 0, 4, libc::EINVAL),
        (region::CONFIG, 4094, 4, libc::EINVAL),
        (region::CONFIG, 0, 0, libc::EINVAL),
        (region::CONFIG, u64::MAX, 1, libc::EINVAL),
    ];
    for &(index, offset, len, errno) in cases {
        let mut buf = vec![0u8; len];
        assert_eq!(f.region_read(index, offset, &mut buf), Err(errno), "read {index}@{offset:#x}+{len}");
        assert_eq!(f.region_write(index, offset, &buf), Err(errno), "write {index}@{offset:#x}+{len}");
    }
    assert!(f.region_read(0, BAR0_SIZE - 8, &mut b8).is_ok());
}

#[test]
fn without_memory_space_enable_bar_reads_return_all_ones_and_writes_are_dropped() {
    // PCI: a function whose Memory Space Enable is clear does not claim memory requests; the read
    // completes as all-ones (Unsupported Request) and the posted write is discarded.
    let (f, e) = function();
    f.region_write(0, 0x100, &7u32.to_le_bytes()).unwrap();
    for (index, len) in [(0, 4), (0, 8), (4, 4), (4, 1)] {
        let mut b = vec![0u8; len];
        f.region_read(index, 0, &mut b).unwrap();
        assert_eq!(b, vec![0xff; len], "BAR{index} read of {len}");
    }
    assert_eq!(e.mem.lock().unwrap()[0x100], 0, "the write reached nothing");
    assert_eq!(f.pci_state()["mmio_refused"], 5, "each access counted");
    cfg_w16(&f, 0x04, PCI_COMMAND_MEMORY);
    f.region_write(0, 0x100, &0x1122_3344_5566_7788u64.to_le_bytes()).unwrap();
    let mut b = [0u8; 2];
    f.region_read(0, 0x102, &mut b).unwrap();
    assert_eq!(u16::from_le_bytes(b), 0x5566);
}

#[test]
fn engine_interrupts_follow_the_msix_policy_set_through_config_space() {
    let (f, e, irq, _) = attached();
    let raise = e.irq();
    raise.raise(3);
    assert_eq!(irq.take(), vec![], "MSI-X not enabled");
    cfg_w16(&f, 0x04, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
    cfg_w16(&f, MSIX_CTRL, PCI_MSIX_FLAGS_ENABLE | PCI_MSIX_FLAGS_MASKALL);
    raise.raise(3);
    assert_eq!(irq.take(), vec![]);
    let mut pba = [0u8; 8];
    f.region_read(4, 0x1000, &mut pba).unwrap();
    assert_eq!(pba[0], 1 << 3, "pending while function-masked");
    cfg_w16(&f, MSIX_CTRL, PCI_MSIX_FLAGS_ENABLE);
    assert_eq!(irq.take(), vec![(irq::MSIX, 3)], "delivered on unmask");
    f.region_read(4, 0x1000, &mut pba).unwrap();
    assert_eq!(pba[0], 0);
    // A client that programs the table gets its per-vector masks honoured.
    // Once the table is written, every vector's mask counts: 4 is unmasked explicitly, 5 keeps its mask.
    f.region_write(4, 4 * 16 + 12, &0u32.to_le_bytes()).unwrap();
    raise.raise(5);
    raise.raise(4);
    assert_eq!(irq.take(), vec![(irq::MSIX, 4)]);
    f.region_write(4, 5 * 16 + 12, &0u32.to_le_bytes()).unwrap();
    assert_eq!(irq.take(), vec![(irq::MSIX, 5)]);
}

#[test]
fn engine_dma_needs_bus_master_enable() {
    let (f, e, _, mem) = attached();
    let dma = e.dma();
    assert!(matches!(dma.write_u32(0x10_0000, 5), Err(DmaError::Permission { .. })));
    cfg_w16(&f, 0x04, PCI_COMMAND_MASTER);
    dma.write_u32(0x10_0000, 5).unwrap();
    assert_eq!(mem.read_u32(0x10_0000), Ok(5));
}

#[test]
fn failed_dma_read_sets_received_master_abort_until_cleared() {
    let (f, e, _, _) = attached();
    cfg_w16(&f, 0x04, PCI_COMMAND_MASTER);
    assert_eq!(cfg_r16(&f, 0x06), PCI_STATUS_CAP_LIST);
    assert!(e.dma().read_u32(0xdead_0000).is_err());
    assert_eq!(cfg_r16(&f, 0x06), PCI_STATUS_CAP_LIST | PCI_STATUS_REC_MASTER_ABORT);
    cfg_w16(&f, 0x06, PCI_STATUS_REC_MASTER_ABORT);
    assert_eq!(cfg_r16(&f, 0x06), PCI_STATUS_CAP_LIST);
}

fn program(f: &Function) {
    cfg_w32(f, 0x10, 0xfe00_0000);
    cfg_w16(f, 0x04, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
    cfg_w16(f, MSIX_CTRL, PCI_MSIX_FLAGS_ENABLE);
    // Max_Payload_Size 256 B and common clock: kept across FLR.
    cfg_w16(f, DEVCTL, 0x2810 | 0x0020 | PCI_EXP_DEVCTL_URRE);
    cfg_w16(f, 0x50, PCI_EXP_LNKCTL_CCC);
}

fn assert_flr_state(f: &Function) {
    assert_eq!(cfg_r32(f, 0x10), 0x0000_0004, "BAR address cleared");
    assert_eq!(cfg_r16(f, 0x04), 0, "command cleared");
    assert_eq!(cfg_r16(f, MSIX_CTRL), VECTORS - 1, "MSI-X disabled");
    assert_eq!(cfg_r16(f, DEVCTL), 0x2810 | 0x0020, "error reporting cleared, payload size kept");
    assert_eq!(cfg_r16(f, 0x50), PCI_EXP_LNKCTL_CCC, "link control kept");
    let mut e = [0u8; 4];
    cfg_w16(f, 0x04, PCI_COMMAND_MEMORY);
    f.region_read(4, 12, &mut e).unwrap();
    assert_eq!(e, [1, 0, 0, 0], "vector 0 masked again");
}

#[test]
fn device_reset_is_a_function_level_reset() {
    let (f, e, irq, _) = attached();
    program(&f);
    f.reset();
    assert_eq!(e.resets.load(Ordering::SeqCst), 1);
    assert_flr_state(&f);
    e.irq().raise(0);
    assert_eq!(irq.take(), vec![], "MSI-X off after reset");
    assert!(e.attached.lock().unwrap().is_some(), "the client stays attached");
}

#[test]
fn initiate_flr_bit_resets_the_function_and_reads_zero() {
    let (f, e, _, _) = attached();
    program(&f);
    cfg_w16(&f, DEVCTL, cfg_r16(&f, DEVCTL) | PCI_EXP_DEVCTL_BCR_FLR);
    assert_eq!(e.resets.load(Ordering::SeqCst), 1);
    assert_flr_state(&f);
    // A byte write to the upper half of Device Control initiates it too.
    f.region_write(region::CONFIG, DEVCTL + 1, &[0x80]).unwrap();
    assert_eq!(e.resets.load(Ordering::SeqCst), 2);
}

#[test]
fn detach_returns_the_whole_config_space_to_power_on_values() {
    let (f, e, irq, _) = attached();
    program(&f);
    let power_on = {
        let (g, _) = function();
        let mut all = vec![0u8; 4096];
        g.region_read(region::CONFIG, 0, &mut all).unwrap();
        all
    };
    f.detach();
    assert_eq!(e.detaches.load(Ordering::SeqCst), 1);
    let mut all = vec![0u8; 4096];
    f.region_read(region::CONFIG, 0, &mut all).unwrap();
    assert_eq!(all, power_on);
    // Even if the engine still held the old interrupt, nothing reaches the departed client.
    f.msix().unwrap().raise(0);
    assert_eq!(irq.take(), vec![]);
}

#[test]
fn bad_engine_bars_are_rejected_by_try_new_and_left_out_by_new() {
    let bar = |index, size, is_64bit| BarSpec { index, size, is_64bit, prefetchable: false, mmap: None };
    let fd = || RegionFd { fd: memfd(), fd_offset: 0 };
    let cases: Vec<(Vec<BarSpec>, PciError)> = vec![
        (vec![bar(MSIX_BAR, 0x1000, false)], PciError::BarOverlap { index: MSIX_BAR }),
        (vec![bar(3, 0x1000, true)], PciError::BarOverlap { index: 3 }),
        (vec![bar(5, 0x1000, true)], PciError::BarIndex { index: 5 }),
        (vec![bar(6, 0x1000, false)], PciError::BarIndex { index: 6 }),
        (vec![bar(0, 0x1800, true)], PciError::BarSize { index: 0, size: 0x1800 }),
        (vec![bar(0, 0x800, true)], PciError::BarSize { index: 0, size: 0x800 }),
        (vec![bar(0, 1 << 32, false)], PciError::BarTooLargeFor32Bit { index: 0, size: 1 << 32 }),
        (vec![bar(0, 0x2000, true), bar(1, 0x1000, false)], PciError::BarOverlap { index: 1 }),
        (
            vec![BarSpec { mmap: Some(BarMmap { areas: vec![(0x1800, 0x1000)], fd: fd() }), ..bar(0, 0x4000, true) }],
            PciError::MmapArea { index: 0, offset: 0x1800, size: 0x1000 },
        ),
        (
            vec![BarSpec { mmap: Some(BarMmap { areas: vec![(0x3000, 0x2000)], fd: fd() }), ..bar(0, 0x4000, true) }],
            PciError::MmapArea { index: 0, offset: 0x3000, size: 0x2000 },
        ),
    ];
    for (bars, err) in cases {
        let e = FakeEngine::with_bars(bars);
        assert_eq!(Function::try_new(e.clone(), PciIds::irdma_default()).err(), Some(err.clone()), "{err}");
        let f = Function::new(e, PciIds::irdma_default());
        assert!(f.region_info(4).is_some_and(|i| i.size == 0x2000), "MSI-X BAR survives: {err}");
    }
    // `new` keeps the first valid claimant of a slot.
    let f = Function::new(
        FakeEngine::with_bars(vec![bar(0, 0x2000, true), bar(1, 0x1000, false)]),
        PciIds::irdma_default(),
    );
    assert_eq!(f.region_info(0).unwrap().size, 0x2000);
    assert_eq!(f.region_info(1).unwrap().size, 0);
}

#[test]
fn every_raise_is_delivered_pended_or_dropped_while_masks_change_concurrently() {
    let (f, e, irq, _) = attached();
    cfg_w16(&f, 0x04, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
    cfg_w16(&f, MSIX_CTRL, PCI_MSIX_FLAGS_ENABLE);
    const RAISES: u64 = 2000;
    let raiser = {
        let raise = e.irq();
        std::thread::spawn(move || (0..RAISES).for_each(|i| raise.raise((i % u64::from(VECTORS)) as u16)))
    };
    for i in 0..500u16 {
        let ctrl = if i % 2 == 0 { PCI_MSIX_FLAGS_MASKALL } else { 0 };
        cfg_w16(&f, MSIX_CTRL, PCI_MSIX_FLAGS_ENABLE | ctrl);
    }
    raiser.join().unwrap();
    cfg_w16(&f, MSIX_CTRL, PCI_MSIX_FLAGS_ENABLE);
    let m = f.msix().unwrap();
    let delivered = irq.take().len() as u64;
    let stats = &m.stats;
    assert_eq!(delivered, stats.delivered.load(Ordering::SeqCst));
    assert!(m.pending_vectors().is_empty(), "unmasked at the end: nothing left pending");
    // A raise on an already pending vector coalesces with it, so pended raises outnumber their deliveries.
    let direct = RAISES - stats.pended.load(Ordering::SeqCst) - stats.dropped_disabled.load(Ordering::SeqCst);
    assert!(delivered >= direct && delivered <= RAISES, "delivered {delivered}, direct {direct}");
    assert_eq!(stats.dropped_disabled.load(Ordering::SeqCst), 0);
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    fn op() -> impl Strategy<Value = (bool, u32, u64, Vec<u8>)> {
        let index = prop_oneof![0u32..10, Just(region::CONFIG), any::<u32>()];
        let offset = prop_oneof![0u64..0x40, 0u64..0x1100, (0u64..0x10010), any::<u64>()];
        (any::<bool>(), index, offset, proptest::collection::vec(any::<u8>(), 0..12))
    }

    proptest! {
        #[test]
        fn random_region_accesses_never_panic_and_keep_identity(ops in proptest::collection::vec(op(), 1..150)) {
            let (f, _e, _irq, _mem) = attached();
            let ident = [0x00u64, 0x08, 0x2c, 0x34, 0x40, 0x44, 0x84, 0x88].map(|o| (o, cfg_r32(&f, o)));
            for (write, index, offset, mut data) in ops {
                let r = if write { f.region_write(index, offset, &data) } else { f.region_read(index, offset, &mut data) };
                if let Err(errno) = r {
                    prop_assert!(errno == libc::EINVAL || errno == libc::EIO);
                }
            }
            for (o, v) in ident {
                prop_assert_eq!(cfg_r32(&f, o), v);
            }
        }
    }
}

/// A client memory that knows its mappings.
struct Mapped;
impl DmaAccess for Mapped {
    fn read(&self, iova: u64, _buf: &mut [u8]) -> Result<(), DmaError> {
        Err(DmaError::Unmapped { iova, len: 0 })
    }
    fn write(&self, iova: u64, _buf: &[u8]) -> Result<(), DmaError> {
        Err(DmaError::Unmapped { iova, len: 0 })
    }
    fn regions(&self) -> Option<Vec<vfio_user_proto::dma::DmaRegion>> {
        Some(vec![vfio_user_proto::dma::DmaRegion { iova: 0x1000, size: 0x1000, flags: 3, fd_offset: Some(0x7000) }])
    }
}

#[test]
fn dma_maps_lists_the_attached_clients_mappings_and_nothing_after_detach() {
    let (f, _) = function();
    assert_eq!(f.dma_maps(), serde_json::json!({"maps": []}));
    f.attach(DeviceContext { dma: Arc::new(Mapped), irq: Arc::new(RecordingIrq::default()) });
    assert_eq!(
        f.dma_maps(),
        serde_json::json!({"maps": [{"iova": "0x1000", "size": "0x1000", "flags": 3, "fd": true, "offset": "0x7000"}]})
    );
    f.detach();
    assert_eq!(f.dma_maps(), serde_json::json!({"maps": []}));
}

/// Issue 38: a device whose worker job panicked is dead as a surprise-removed function is: config and BAR
/// reads all-ones (what pci_device_is_present and the drivers' register checks take for a gone device), writes
/// dropped, its DMA refused and its interrupts suppressed, across a new client too. The other function serves.
#[test]
fn a_dead_device_answers_as_a_removed_function_and_the_other_serves() {
    let (dead, e, irq, mem) = attached();
    let (alive, other, other_irq, _) = attached();
    for f in [&dead, &alive] {
        cfg_w16(f, 0x04, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
        cfg_w16(f, MSIX_CTRL, PCI_MSIX_FLAGS_ENABLE);
        f.region_write(0, 0x100, &7u32.to_le_bytes()).unwrap();
    }
    e.irq().raise(1);
    assert_eq!(irq.take(), vec![(irq::MSIX, 1)], "delivered while alive");
    dead.probe().worker_panicked();
    assert_eq!(cfg_r32(&dead, 0x00), 0xffff_ffff, "vendor and device ID");
    let mut b = [0u8; 4];
    dead.region_read(0, 0x100, &mut b).unwrap();
    assert_eq!(b, [0xff; 4]);
    dead.region_write(0, 0x100, &9u32.to_le_bytes()).unwrap();
    assert_eq!(e.mem.lock().unwrap()[0x100], 7, "the write reached nothing");
    assert!(e.dma().write_u32(0x10_0000, 5).is_err());
    assert_eq!(mem.read_u32(0x10_0000), Ok(0));
    e.irq().raise(1);
    assert_eq!(irq.take(), vec![], "suppressed");
    assert_eq!(dead.pci_state()["worker_panics"], 1);
    // A new client finds it dead still.
    dead.detach();
    dead.attach(DeviceContext { dma: Arc::new(HeapMemory::new()), irq: Arc::new(RecordingIrq::default()) });
    assert_eq!(cfg_r32(&dead, 0x00), 0xffff_ffff);
    // The other function is untouched.
    assert_eq!(cfg_r32(&alive, 0x00), 0x1100_1b36);
    alive.region_read(0, 0x100, &mut b).unwrap();
    assert_eq!(u32::from_le_bytes(b), 7);
    assert_eq!(other.mem.lock().unwrap()[0x100], 7);
    other.irq().raise(1);
    assert_eq!(other_irq.take(), vec![(irq::MSIX, 1)]);
    assert_eq!(alive.pci_state()["worker_panics"], 0);
}
