//! DmaSpace: fd maps through one shared mmap per file, message-backed maps, splitting, and the rules
//! DMA_MAP/DMA_UNMAP enforce.

mod common;

use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use common::{maps_named, memfd};
use vfio_user_proto::dma::{DmaAccess, DmaError};
use vfio_user_proto::wire::dma_map_flags::{READ, WRITE};
use vfio_user_proto::{DmaSpace, MapError, MessageDma};

const RW: u32 = READ | WRITE;
const PAGE: u64 = 0x1000;

/// Records message-path accesses and serves them from a flat buffer indexed by IOVA.
#[derive(Default)]
struct FakeClient {
    calls: Mutex<Vec<(&'static str, u64, usize)>>,
}

impl MessageDma for FakeClient {
    fn dma_read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        self.calls.lock().unwrap().push(("read", iova, buf.len()));
        buf.fill(0xab);
        Ok(())
    }
    fn dma_write(&self, iova: u64, data: &[u8]) -> Result<(), DmaError> {
        self.calls.lock().unwrap().push(("write", iova, data.len()));
        Ok(())
    }
}

fn space() -> (DmaSpace, Arc<FakeClient>) {
    let fake = Arc::new(FakeClient::default());
    (DmaSpace::new(65535, Some(fake.clone() as Arc<dyn MessageDma>)), fake)
}

fn fd(f: &std::fs::File) -> Option<OwnedFd> {
    Some(OwnedFd::from(f.try_clone().unwrap()))
}

#[test]
fn per_page_maps_of_one_memfd_share_one_mmap() {
    let name = "dmaspace-per-page";
    let ram = memfd(name, 0x100_0000, true);
    let (s, fake) = space();
    // As QEMU under a vIOMMU: one DMA_MAP per 4 KiB page, offsets = scattered guest-physical pages.
    for i in 0..64u64 {
        let off = 0x80_0000 - i * 3 * PAGE;
        s.map(0x10_0000 + i * PAGE, PAGE, off, RW, fd(&ram)).unwrap();
    }
    assert_eq!(s.mapping_count(), 64);
    assert_eq!(s.mmap_count(), 1);
    assert_eq!(maps_named(name), 1);
    s.write(0x10_0000 + 5 * PAGE + 8, &[7; 4]).unwrap();
    let mut b = [0u8; 4];
    ram.read_at(&mut b, 0x80_0000 - 15 * PAGE + 8).unwrap();
    assert_eq!(b, [7; 4]);
    assert!(fake.calls.lock().unwrap().is_empty());
    s.unmap(0x10_0000, 64 * PAGE).unwrap();
    assert_eq!(s.mmap_count(), 0);
    assert_eq!(maps_named(name), 0);
}

#[test]
fn access_spanning_two_mappings_is_split_at_the_boundary() {
    let ram = memfd("dmaspace-span", 0x10000, true);
    let (s, _) = space();
    s.map(0x1000, PAGE, 0x5000, RW, fd(&ram)).unwrap();
    s.map(0x2000, PAGE, 0x3000, RW, fd(&ram)).unwrap();
    s.write(0x1ffc, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    let (mut a, mut b) = ([0u8; 4], [0u8; 4]);
    ram.read_at(&mut a, 0x5ffc).unwrap();
    ram.read_at(&mut b, 0x3000).unwrap();
    assert_eq!((a, b), ([1, 2, 3, 4], [5, 6, 7, 8]));
    assert_eq!(s.read_u64(0x1ffc).unwrap(), u64::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 8]));
}

#[test]
fn access_touching_a_hole_fails_and_writes_nothing() {
    let ram = memfd("dmaspace-hole", 0x10000, true);
    let (s, _) = space();
    s.map(0x1000, PAGE, 0, RW, fd(&ram)).unwrap();
    s.map(0x3000, PAGE, PAGE, RW, fd(&ram)).unwrap();
    assert_eq!(s.write(0x1ffc, &[0xff; 8]), Err(DmaError::Unmapped { iova: 0x1ffc, len: 8 }));
    assert_eq!(s.read_u32(0x1ffc).unwrap(), 0);
    assert_eq!(s.read(u64::MAX - 2, &mut [0; 8]), Err(DmaError::Overflow { iova: u64::MAX - 2, len: 8 }));
}

#[test]
fn unsealed_fd_and_fd_less_maps_are_served_by_messages_split_per_mapping() {
    let unsealed = memfd("dmaspace-unsealed", 0x10000, false);
    let sealed = memfd("dmaspace-sealed", 0x10000, true);
    let (s, fake) = space();
    s.map(0x1000, PAGE, 0, RW, fd(&unsealed)).unwrap();
    s.map(0x2000, PAGE, 0, RW, None).unwrap();
    s.map(0x3000, PAGE, 0, RW, fd(&sealed)).unwrap();
    assert_eq!(s.mmap_count(), 1);
    let mut buf = [0u8; 0x20];
    s.read(0x1ff0, &mut buf).unwrap();
    assert_eq!(buf, [0xab; 0x20]);
    s.write(0x2ff0, &[9; 0x20]).unwrap();
    assert_eq!(
        *fake.calls.lock().unwrap(),
        vec![("read", 0x1ff0, 0x10), ("read", 0x2000, 0x10), ("write", 0x2ff0, 0x10)]
    );
    let mut b = [0u8; 0x10];
    sealed.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [9; 0x10]);
}

/// (name, iova, size, file offset, flags, fd, expected error)
type MapCase = (&'static str, u64, u64, u64, u32, Option<OwnedFd>, MapError);

#[test]
fn dma_map_rules_reject_bad_requests_with_the_right_error() {
    let ram = memfd("dmaspace-rules", 0x4000, true);
    let ro = std::fs::File::open(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&ram))).unwrap();
    let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
    let (s, _) = space();
    s.map(0x10000, 0x2000, 0, RW, fd(&ram)).unwrap();
    let cases: Vec<MapCase> = vec![
        ("overlap at start", 0x10000, PAGE, 0, RW, None, MapError::Exists),
        ("overlap inside", 0x11000, PAGE, 0, RW, None, MapError::Exists),
        ("overlap from below", 0xf000, 0x2000, 0, RW, None, MapError::Exists),
        (
            "fd smaller than mapping",
            0x20000,
            0x2000,
            0x3000,
            RW,
            fd(&ram),
            MapError::Invalid("mapping exceeds the file"),
        ),
        ("offset overflows", 0x20000, PAGE, u64::MAX - 0xfff, RW, fd(&ram), MapError::Invalid("offset overflows")),
        // The specification: "the offset is 0 when the region is not mappable"; QEMU's fd-less maps have 0.
        ("file offset without an fd", 0x20000, PAGE, PAGE, RW, None, MapError::Invalid("file offset without a file")),
        ("unaligned iova", 0x20800, PAGE, 0, RW, None, MapError::Invalid("unaligned or empty range")),
        ("empty", 0x20000, 0, 0, RW, None, MapError::Invalid("unaligned or empty range")),
        ("wraps the address space", u64::MAX - 0xfff, 0x2000, 0, RW, None, MapError::Invalid("range overflows")),
        ("unknown flag", 0x20000, PAGE, 0, RW | 4, None, MapError::Invalid("flags")),
        ("no access", 0x20000, PAGE, 0, 0, None, MapError::Invalid("flags")),
        ("a pipe", 0x20000, PAGE, 0, RW, Some(pipe_r), MapError::Invalid("fd is not a regular file")),
        ("writable map of a read-only fd", 0x20000, PAGE, 0, RW, Some(OwnedFd::from(ro)), MapError::Access),
    ];
    for (name, iova, size, off, flags, f, want) in cases {
        assert_eq!(s.map(iova, size, off, flags, f), Err(want), "{name}");
    }
    assert_eq!(s.mapping_count(), 1);
}

#[test]
fn the_map_limit_is_enforced() {
    let s = DmaSpace::new(2, None);
    s.map(0x1000, PAGE, 0, RW, None).unwrap();
    s.map(0x2000, PAGE, 0, RW, None).unwrap();
    assert_eq!(s.map(0x3000, PAGE, 0, RW, None), Err(MapError::TooMany(2)));
}

#[test]
fn unmap_follows_vfio_type1() {
    let (s, _) = space();
    s.map(0x1000, 0x2000, 0, RW, None).unwrap();
    s.map(0x4000, PAGE, 0, RW, None).unwrap();
    // Never mapped: success, nothing unmapped.
    assert_eq!(s.unmap(0x100000, 0x100000), Ok(0));
    // Splitting a mapping is refused.
    assert_eq!(s.unmap(0x2000, PAGE), Err(MapError::Invalid("unmap would split a mapping")));
    assert_eq!(s.unmap(0x0, 0x2000), Err(MapError::Invalid("unmap would split a mapping")));
    // QEMU's whole-space unmap ending exactly at 2^64.
    assert_eq!(s.unmap(0xfef0_0000, 0xffff_ffff_0110_0000), Ok(0));
    assert_eq!(s.unmap(0, 0x4000), Ok(0x2000));
    assert_eq!(s.unmap(0x4000, PAGE), Ok(PAGE));
    assert_eq!(s.mapping_count(), 0);
}

#[test]
fn permissions_and_close_are_enforced() {
    let ram = memfd("dmaspace-perm", 0x4000, true);
    let (s, _) = space();
    s.map(0x1000, PAGE, 0, READ, fd(&ram)).unwrap();
    s.map(0x2000, PAGE, PAGE, WRITE, fd(&ram)).unwrap();
    assert_eq!(s.write(0x1000, &[1]), Err(DmaError::Permission { iova: 0x1000, dir: "write" }));
    assert_eq!(s.read(0x2000, &mut [0]), Err(DmaError::Permission { iova: 0x2000, dir: "read" }));
    s.close();
    assert!(matches!(s.read(0x1000, &mut [0]), Err(DmaError::Transport(_))));
    assert_eq!(s.map(0x3000, PAGE, 0, RW, None), Err(MapError::Closed));
    assert_eq!(s.mapping_count(), 0);
}

#[test]
fn a_sealed_file_that_grew_is_remapped_for_maps_beyond_the_first_mmap() {
    let ram = memfd("dmaspace-grow", 0x2000, true);
    let (s, _) = space();
    s.map(0x1000, PAGE, 0, RW, fd(&ram)).unwrap();
    ram.set_len(0x8000).unwrap();
    s.map(0x2000, PAGE, 0x7000, RW, fd(&ram)).unwrap();
    s.write(0x2000, &[3]).unwrap();
    let mut b = [0u8];
    ram.read_at(&mut b, 0x7000).unwrap();
    assert_eq!(b, [3]);
    // Shrinking is prevented by the seal, so the old mmap can never fault.
    assert!(ram.set_len(0x1000).is_err());
}

#[test]
fn a_write_sealed_file_maps_read_only() {
    let m = memfd::MemfdOptions::default().allow_sealing(true).create("dmaspace-wseal").unwrap();
    m.as_file().set_len(0x2000).unwrap();
    m.add_seal(memfd::FileSeal::SealShrink).unwrap();
    m.add_seal(memfd::FileSeal::SealWrite).unwrap();
    let f = m.into_file();
    let (s, fake) = space();
    assert_eq!(s.map(0x1000, PAGE, 0, RW, fd(&f)), Err(MapError::Access));
    s.map(0x1000, PAGE, 0, READ, fd(&f)).unwrap();
    assert_eq!(s.read_u32(0x1000).unwrap(), 0);
    assert_eq!(s.mmap_count(), 1);
    assert!(fake.calls.lock().unwrap().is_empty());
}

#[test]
fn beyond_the_mmap_limits_sealed_maps_fall_back_to_messages() {
    let (fake, files) =
        (Arc::new(FakeClient::default()), [0, 1, 2].map(|i| memfd(&format!("dmaspace-limit{i}"), 0x4000, true)));
    let limits = vfio_user_proto::MmapLimits { max_files: 2, max_bytes: 1 << 30 };
    let s = DmaSpace::new(100, Some(fake.clone() as Arc<dyn MessageDma>)).with_mmap_limits(limits);
    for (i, f) in files.iter().enumerate() {
        s.map(0x10000 * (i as u64 + 1), PAGE, 0, RW, fd(f)).unwrap();
    }
    assert_eq!(s.mmap_count(), 2);
    s.read(0x30000, &mut [0; 4]).unwrap();
    assert_eq!(*fake.calls.lock().unwrap(), vec![("read", 0x30000, 4)]);
    // Unmapping frees the budget for the next file.
    s.unmap(0x10000, PAGE).unwrap();
    assert_eq!(s.mmap_count(), 1);
    s.map(0x40000, PAGE, PAGE, RW, fd(&files[0])).unwrap();
    assert_eq!(s.mmap_count(), 2);
    // A byte budget smaller than the file sends it to messages too.
    let tiny =
        DmaSpace::new(100, None).with_mmap_limits(vfio_user_proto::MmapLimits { max_files: 8, max_bytes: 0x1000 });
    tiny.map(0x1000, PAGE, 0, RW, fd(&files[1])).unwrap();
    assert_eq!(tiny.mmap_count(), 0);
}

#[test]
fn regions_list_every_mapping_with_its_file_offset() {
    let ram = memfd("dmaspace-regions", 0x10_0000, true);
    let (s, _) = space();
    s.map(0x20_0000, 2 * PAGE, 0x5000, READ, fd(&ram)).unwrap();
    s.map(0x1000, PAGE, 0, RW, None).unwrap();
    s.map(0x40_0000, 3 * PAGE, 0x8000, RW, fd(&ram)).unwrap();
    s.unmap(0x20_0000, 2 * PAGE).unwrap();
    s.map(0x20_0000, PAGE, 0x5000, READ, fd(&ram)).unwrap();
    let got: Vec<(u64, u64, u32, Option<u64>)> =
        s.regions().unwrap().into_iter().map(|r| (r.iova, r.size, r.flags, r.fd_offset)).collect();
    assert_eq!(
        got,
        [(0x1000, PAGE, RW, None), (0x20_0000, PAGE, READ, Some(0x5000)), (0x40_0000, 3 * PAGE, RW, Some(0x8000)),]
    );
}
