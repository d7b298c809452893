//! `DmaAccess::copy` and `check_read`: the provided (bounce) versions and DmaSpace's direct copy between
//! mmaps, both held to what a `read` of the source followed by a `write` of the destination does.

mod common;

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use common::memfd;
use vfio_user_proto::dma::{bounce_check_read, bounce_copy, DmaAccess, DmaError, HeapMemory, DMA_BOUNCE_CHUNK};
use vfio_user_proto::wire::dma_map_flags::{READ, WRITE};
use vfio_user_proto::{DmaSpace, MessageDma};

const RW: u32 = READ | WRITE;
const PAGE: u64 = 0x1000;

/// One map of 16 pages of `ram` (file offsets 0..0x10000).
const A: u64 = 0x10000;
const A_LEN: u64 = 0x10000;
/// Right after A: one read-only page, then one write-only page, then a hole.
const RO: u64 = 0x20000;
const WO: u64 = 0x21000;
const HOLE: u64 = 0x22000;
/// Eight one-page maps of `ram`, scattered backwards from file offset 0x1f000 (as QEMU maps per page),
/// then a hole.
const PAGES: u64 = 0x40000;
const PAGES_END: u64 = PAGES + 0x8000;
/// Two pages with no fd: served by DMA_READ/DMA_WRITE messages.
const MSG: u64 = 0x50000;
/// A second IOVA for `ram`'s first page: the same bytes as A's first page.
const ALIAS: u64 = 0x60000;
/// `grown`'s first two pages through its first mmap, and its first three pages through the second mmap
/// made after the file grew: two mmaps of the same bytes.
const OLD_MMAP: u64 = 0x70000;
const NEW_MMAP: u64 = 0x78000;

/// The message path, served from plain memory at the same IOVAs; counts calls.
#[derive(Default)]
struct Messages {
    mem: HeapMemory,
    calls: Mutex<u32>,
}

impl MessageDma for Messages {
    fn dma_read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        *self.calls.lock().unwrap() += 1;
        self.mem.read(iova, buf)
    }
    fn dma_write(&self, iova: u64, data: &[u8]) -> Result<(), DmaError> {
        *self.calls.lock().unwrap() += 1;
        self.mem.write(iova, data)
    }
}

struct World {
    space: DmaSpace,
    ram: File,
    grown: File,
    messages: Arc<Messages>,
}

fn fd(f: &File) -> Option<OwnedFd> {
    Some(OwnedFd::from(f.try_clone().unwrap()))
}

/// Every byte a distinct-ish pattern so misplaced bytes show.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
}

fn world() -> World {
    let ram = memfd("dmacopy-ram", 0x20000, true);
    ram.write_all_at(&pattern(0x20000, 0x11), 0).unwrap();
    let grown = memfd("dmacopy-grown", 0x2000, true);
    grown.write_all_at(&pattern(0x2000, 0x22), 0).unwrap();
    let messages = Arc::new(Messages::default());
    assert!(messages.mem.map(MSG, 0x2000));
    messages.mem.write(MSG, &pattern(0x2000, 0x33)).unwrap();
    let space = DmaSpace::new(1024, Some(messages.clone() as Arc<dyn MessageDma>));
    space.map(A, A_LEN, 0, RW, fd(&ram)).unwrap();
    space.map(RO, PAGE, 0x10000, READ, fd(&ram)).unwrap();
    space.map(WO, PAGE, 0x11000, WRITE, fd(&ram)).unwrap();
    for i in 0..8 {
        space.map(PAGES + i * PAGE, PAGE, 0x1f000 - i * PAGE, RW, fd(&ram)).unwrap();
    }
    space.map(MSG, 0x2000, 0, RW, None).unwrap();
    space.map(ALIAS, PAGE, 0, RW, fd(&ram)).unwrap();
    space.map(OLD_MMAP, 0x2000, 0, RW, fd(&grown)).unwrap();
    grown.set_len(0x8000).unwrap();
    space.map(NEW_MMAP, 0x3000, 0, RW, fd(&grown)).unwrap();
    assert_eq!(space.mmap_count(), 3, "ram once, grown twice (before and after it grew)");
    World { space, ram, grown, messages }
}

/// The bytes of `ram`, `grown` and the message-backed memory.
type Snapshot = (Vec<u8>, Vec<u8>, Vec<u8>);

impl World {
    /// Everything the copy could have changed.
    fn snapshot(&self) -> Snapshot {
        let mut ram = vec![0; 0x20000];
        self.ram.read_exact_at(&mut ram, 0).unwrap();
        let mut grown = vec![0; 0x3000];
        self.grown.read_exact_at(&mut grown, 0).unwrap();
        let mut msg = vec![0; 0x2000];
        self.messages.mem.read(MSG, &mut msg).unwrap();
        (ram, grown, msg)
    }

    /// The reference: one read of the whole source, then one write of the whole destination.
    fn read_then_write(&self, src: u64, dst: u64, len: u64) -> Result<(), DmaError> {
        let mut buf = vec![0; len as usize];
        self.space.read(src, &mut buf)?;
        self.space.write(dst, &buf)
    }
}

/// How each implementation is run on a fresh world.
#[derive(Debug, Clone, Copy)]
enum Way {
    Reference,
    Provided,
    DmaSpace,
}

fn run(way: Way, src: u64, dst: u64, len: u64) -> (Result<(), DmaError>, Snapshot, u32) {
    let w = world();
    let calls_before = *w.messages.calls.lock().unwrap();
    let result = match way {
        Way::Reference => w.read_then_write(src, dst, len),
        Way::Provided => bounce_copy(&w.space, src, dst, len),
        Way::DmaSpace => w.space.copy(src, dst, len),
    };
    let calls = *w.messages.calls.lock().unwrap() - calls_before;
    (result, w.snapshot(), calls)
}

/// (what, src, dst, len, expected result)
type CopyCase = (&'static str, u64, u64, u64, Result<(), DmaError>);

fn cases() -> Vec<CopyCase> {
    let chunk = DMA_BOUNCE_CHUNK as u64;
    vec![
        ("inside one map", A + 0x10, A + 0x2020, 0x100, Ok(())),
        ("zero bytes", A, A + 0x10, 0, Ok(())),
        ("from per-page maps (three pieces) into one map", PAGES + 0xff0, A + 0x8000, 0x1020, Ok(())),
        ("from one map into per-page maps", A + 0x300, PAGES + 0x800, 0x2000, Ok(())),
        ("overlapping, destination above, one map", A, A + 0x100, 0x2000, Ok(())),
        ("overlapping, destination below, one map", A + 0x100, A, 0x2000, Ok(())),
        ("overlapping by more than a bounce chunk, destination above", A, A + 0x800, chunk + 0x1800, Ok(())),
        ("overlapping by more than a bounce chunk, destination below", A + 0x800, A, chunk + 0x1800, Ok(())),
        ("longer than a bounce chunk, per-page maps into one map", PAGES, A + 0x100, 0x6000, Ok(())),
        ("overlapping through per-page maps of the same file", PAGES + 0x1000, PAGES + 0x1010, 0x1800, Ok(())),
        ("the same bytes through two IOVAs", A + 0x10, ALIAS + 0x20, 0x200, Ok(())),
        ("the same bytes through two mmaps of a grown file", OLD_MMAP, NEW_MMAP + 0x100, 0x800, Ok(())),
        ("message-backed source into an mmap", MSG + 0xff0, A + 0x40, 0x20, Ok(())),
        ("mmap into message-backed destination", A + 0x40, MSG + 0xff0, 0x20, Ok(())),
        (
            "source reaches a hole",
            PAGES_END - 0x10,
            A,
            0x20,
            Err(DmaError::Unmapped { iova: PAGES_END - 0x10, len: 0x20 }),
        ),
        ("destination reaches a hole", A, HOLE - 0x10, 0x20, Err(DmaError::Unmapped { iova: HOLE - 0x10, len: 0x20 })),
        ("source wholly unmapped", 0x9_0000, A, 0x20, Err(DmaError::Unmapped { iova: 0x9_0000, len: 0x20 })),
        ("source not readable", WO, A, 0x20, Err(DmaError::Permission { iova: WO, dir: "read" })),
        ("source partly not readable", RO + 0xff0, A, 0x20, Err(DmaError::Permission { iova: WO, dir: "read" })),
        ("destination read-only", A, RO, 0x20, Err(DmaError::Permission { iova: RO, dir: "write" })),
        ("destination partly read-only", A, RO - 0x10, 0x20, Err(DmaError::Permission { iova: RO, dir: "write" })),
        (
            "source error wins over a destination error",
            WO,
            RO,
            0x20,
            Err(DmaError::Permission { iova: WO, dir: "read" }),
        ),
        ("source overflows", u64::MAX - 4, A, 8, Err(DmaError::Overflow { iova: u64::MAX - 4, len: 8 })),
        ("destination overflows", A, u64::MAX - 4, 8, Err(DmaError::Overflow { iova: u64::MAX - 4, len: 8 })),
    ]
}

#[test]
fn copy_equals_read_then_write_in_result_and_memory_for_the_provided_version_and_dma_space() {
    for (what, src, dst, len, want) in cases() {
        let (ref_result, ref_mem, _) = run(Way::Reference, src, dst, len);
        assert_eq!(ref_result, want, "{what}: the reference itself");
        for way in [Way::Provided, Way::DmaSpace] {
            let (result, mem, _) = run(way, src, dst, len);
            assert_eq!(result, want, "{what}: {way:?}");
            assert!(mem == ref_mem, "{what}: {way:?} left memory different from read-then-write");
        }
    }
}

#[test]
fn failed_checks_write_nothing() {
    let untouched = world().snapshot();
    for (what, src, dst, len, want) in cases() {
        if want.is_ok() {
            continue;
        }
        for way in [Way::Provided, Way::DmaSpace] {
            let (_, mem, _) = run(way, src, dst, len);
            assert!(mem == untouched, "{what}: {way:?} wrote something");
        }
    }
}

#[test]
fn dma_space_copies_between_mmaps_without_messages() {
    let touches_messages = |a: u64, len: u64| a < MSG + 0x2000 && MSG < a.saturating_add(len);
    for (what, src, dst, len, _) in cases() {
        if touches_messages(src, len) || touches_messages(dst, len) {
            continue;
        }
        let (_, _, calls) = run(Way::DmaSpace, src, dst, len);
        assert_eq!(calls, 0, "{what}");
    }
    let (_, _, calls) = run(Way::DmaSpace, MSG + 0xff0, A + 0x40, 0x20);
    assert_eq!(calls, 1, "one DMA_READ for the message-backed source; the destination is written in the mmap");
}

/// A long copy whose destination fails only beyond its first bounce chunk: DmaSpace checks both ranges first
/// and writes nothing; the provided version has written the chunks before (documented).
#[test]
fn long_copy_into_a_destination_failing_late_dma_space_writes_nothing_the_provided_version_writes_chunks() {
    let len = DMA_BOUNCE_CHUNK as u64 + 0x1000;
    let dst = RO - DMA_BOUNCE_CHUNK as u64;
    let want = Err(DmaError::Permission { iova: RO, dir: "write" });
    let untouched = world().snapshot();
    let (result, mem, _) = run(Way::DmaSpace, PAGES, dst, len);
    assert_eq!(result, want);
    assert!(mem == untouched);
    let (result, mem, _) = run(Way::Provided, PAGES, dst, len);
    assert_eq!(result, want);
    let mut first_chunk = vec![0; DMA_BOUNCE_CHUNK];
    world().space.read(PAGES, &mut first_chunk).unwrap();
    // A maps the file from offset 0, so the destination's file offset is its distance from A.
    assert_eq!(&mem.0[(dst - A) as usize..(RO - A) as usize], &first_chunk[..]);
    assert!(mem != untouched);
}

#[test]
fn check_read_reports_what_read_would_and_reads_nothing_into_the_device() {
    let w = world();
    let table: [(u64, u64, Result<(), DmaError>); 6] = [
        (A, A_LEN, Ok(())),
        (PAGES + 0x10, 0x3000, Ok(())),
        (MSG, 0x2000, Ok(())),
        (RO + 0xff0, 0x20, Err(DmaError::Permission { iova: WO, dir: "read" })),
        (PAGES_END - 8, 16, Err(DmaError::Unmapped { iova: PAGES_END - 8, len: 16 })),
        (u64::MAX - 1, 4, Err(DmaError::Overflow { iova: u64::MAX - 1, len: 4 })),
    ];
    for (iova, len, want) in table {
        assert_eq!(w.space.check_read(iova, len), want, "DmaSpace {iova:#x}+{len:#x}");
        assert_eq!(bounce_check_read(&w.space, iova, len), want, "provided {iova:#x}+{len:#x}");
    }
    // DmaSpace looks the range up: no DMA_READ message is sent for a message-backed range.
    let calls = *w.messages.calls.lock().unwrap();
    w.space.check_read(MSG, 0x2000).unwrap();
    assert_eq!(*w.messages.calls.lock().unwrap(), calls);
}

#[test]
fn copy_after_close_fails_without_touching_memory() {
    let w = world();
    let before = w.snapshot();
    w.space.close();
    assert!(matches!(w.space.copy(A, A + 0x100, 0x10), Err(DmaError::Transport(_))));
    assert!(matches!(w.space.check_read(A, 0x10), Err(DmaError::Transport(_))));
    assert!(w.snapshot() == before);
}
