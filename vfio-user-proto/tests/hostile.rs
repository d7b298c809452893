//! Malformed and hostile messages, table-driven. For every case: the exact reply (or a clean close),
//! then a well-formed request is still served, and no descriptor leaked (counted in /proc/self/fd).
//! One test function: descriptor counts must not race with other tests of this binary.

mod common;

use std::os::fd::OwnedFd;
use std::time::Duration;

use common::raw::{Raw, GOOD_VERSION, ID};
use common::{fd_count, maps_named, memfd, Running};
use rustix::event::{eventfd, EventfdFlags};
use vfio_user_proto::device::{irq, region};
use vfio_user_proto::sock::{FrameError, Message};
use vfio_user_proto::wire::{
    command as c, dma_map_flags, dma_unmap_flags, hdr_flags, irq_set_flags as f, DmaMap, DmaUnmap, FourU32, Header,
    RegionInfoWire, RegionRw, SetIrqs,
};
use vfio_user_proto::ServerConfig;

const RW: u32 = dma_map_flags::READ | dma_map_flags::WRITE;

enum Expect {
    /// Error reply with this errno; the connection stays usable.
    Errno(i32),
    /// Error reply, then the server closes the connection.
    ErrnoThenClose(i32),
    /// The server closes the connection without a reply.
    Close,
    /// Nothing is sent back for this message.
    NoReply,
    /// A success reply.
    Ok,
}

fn dma_map(iova: u64, size: u64, offset: u64, flags: u32) -> Vec<u8> {
    DmaMap { argsz: 32, flags, offset, address: iova, size }.encode()
}
fn unmap(iova: u64, size: u64, flags: u32) -> Vec<u8> {
    DmaUnmap { argsz: 24, flags, address: iova, size }.encode()
}
fn rw(region: u32, offset: u64, count: u32) -> Vec<u8> {
    RegionRw { offset, region, count }.encode()
}
fn set_irqs(flags: u32, index: u32, start: u32, count: u32) -> Vec<u8> {
    SetIrqs { argsz: 20, flags, index, start, count }.encode()
}
fn efds(n: usize) -> Vec<OwnedFd> {
    (0..n).map(|_| eventfd(0, EventfdFlags::NONBLOCK).unwrap()).collect()
}
fn sealed_fd(len: u64) -> Vec<OwnedFd> {
    vec![OwnedFd::from(memfd("hostile-ram", len, true))]
}
fn version(payload: &[u8]) -> impl Fn(&Raw) + '_ {
    move |r: &Raw| r.send(c::VERSION, payload, &[])
}

type Act = Box<dyn Fn(&Raw)>;

fn hdr(command: u16, size: u32, flags: u32) -> Header {
    Header { msg_id: ID, command, msg_size: size, flags, error: 0 }
}

fn cases() -> Vec<(&'static str, bool, Act, Expect)> {
    use libc::{E2BIG, EEXIST, EINVAL, ENOSPC, ENOSYS, ENOTSUP};
    vec![
        // Framing
        (
            "short header then disconnect",
            true,
            Box::new(|r| {
                r.raw(&hdr(c::DEVICE_GET_INFO, 32, 0).encode()[..8]);
                r.s.shutdown(std::net::Shutdown::Write).unwrap();
            }),
            Expect::Close,
        ),
        (
            "body cut short by a disconnect",
            true,
            Box::new(|r| {
                r.raw(&hdr(c::DEVICE_GET_INFO, 32, 0).encode());
                r.raw(&[0; 6]);
                r.s.shutdown(std::net::Shutdown::Write).unwrap();
            }),
            Expect::Close,
        ),
        (
            "stall in the middle of a message",
            true,
            Box::new(|r| {
                r.raw(&hdr(c::DEVICE_GET_INFO, 32, 0).encode());
                r.raw(&[16, 0]);
            }),
            Expect::Close,
        ),
        (
            "size field below the header size",
            true,
            Box::new(|r| r.raw(&hdr(c::DEVICE_GET_INFO, 8, 0).encode())),
            Expect::ErrnoThenClose(EINVAL),
        ),
        (
            "size field of 4 GiB",
            true,
            Box::new(|r| r.raw(&hdr(c::REGION_WRITE, u32::MAX, 0).encode())),
            Expect::ErrnoThenClose(E2BIG),
        ),
        (
            "size field smaller than the command's payload",
            true,
            Box::new(|r| r.send(c::DEVICE_GET_INFO, &[16, 0, 0, 0, 0, 0, 0, 0], &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "size field larger than the command's payload",
            true,
            Box::new(|r| r.send(c::DEVICE_GET_INFO, &[0; 20], &[])),
            Expect::Errno(EINVAL),
        ),
        // Header fields
        ("unknown command", true, Box::new(|r| r.send(99, &[], &[])), Expect::Errno(ENOSYS)),
        ("command 0", true, Box::new(|r| r.send(0, &[1, 2, 3], &[])), Expect::Errno(ENOSYS)),
        (
            "GET_REGION_IO_FDS is not implemented",
            true,
            Box::new(|r| r.send(c::DEVICE_GET_REGION_IO_FDS, &[0; 16], &[])),
            Expect::Errno(ENOSYS),
        ),
        ("DMA_READ sent by the client", true, Box::new(|r| r.send(c::DMA_READ, &[0; 16], &[])), Expect::Errno(ENOSYS)),
        (
            "reply flag on a request",
            true,
            Box::new(|r| {
                r.send_hdr(hdr(c::DEVICE_GET_INFO, 32, hdr_flags::TYPE_REPLY), &FourU32([16, 0, 0, 0]).encode(), &[])
            }),
            Expect::Errno(EINVAL),
        ),
        (
            "error flag on a request",
            true,
            Box::new(|r| {
                r.send_hdr(hdr(c::DEVICE_GET_INFO, 32, hdr_flags::ERROR), &FourU32([16, 0, 0, 0]).encode(), &[])
            }),
            Expect::Errno(EINVAL),
        ),
        (
            "unknown message type",
            true,
            Box::new(|r| r.send_hdr(hdr(c::DEVICE_GET_INFO, 32, 7), &FourU32([16, 0, 0, 0]).encode(), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "unknown header flag bit",
            true,
            Box::new(|r| r.send_hdr(hdr(c::DEVICE_GET_INFO, 32, 1 << 9), &FourU32([16, 0, 0, 0]).encode(), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "bad request with no-reply set gets no reply",
            true,
            Box::new(|r| r.send_hdr(hdr(c::REGION_READ, 32, hdr_flags::NO_REPLY), &rw(99, 0, 4), &[])),
            Expect::NoReply,
        ),
        // VERSION
        (
            "request before VERSION",
            false,
            Box::new(|r| r.send(c::DEVICE_GET_INFO, &FourU32([16, 0, 0, 0]).encode(), &[])),
            Expect::Errno(EINVAL),
        ),
        ("VERSION shorter than major and minor", false, Box::new(version(&[0, 0])), Expect::Errno(EINVAL)),
        ("VERSION with a wrong major", false, Box::new(version(b"\x01\0\0\0{}\0")), Expect::Errno(ENOTSUP)),
        (
            "VERSION JSON not NUL-terminated",
            false,
            Box::new(version(b"\0\0\0\0{\"capabilities\":{}}")),
            Expect::Errno(EINVAL),
        ),
        ("VERSION JSON with a NUL inside", false, Box::new(version(b"\0\0\0\0{}\0{}\0")), Expect::Errno(EINVAL)),
        ("VERSION data that is not JSON", false, Box::new(version(b"\0\0\0\0{capabilities\0")), Expect::Errno(EINVAL)),
        (
            "VERSION capabilities of the wrong type",
            false,
            Box::new(version(b"\0\0\0\0{\"capabilities\":{\"max_msg_fds\":\"many\"}}\0")),
            Expect::Errno(EINVAL),
        ),
        (
            "VERSION without 4 KiB pages",
            false,
            Box::new(version(b"\0\0\0\0{\"capabilities\":{\"pgsizes\":8192}}\0")),
            Expect::Errno(EINVAL),
        ),
        (
            "VERSION deeply nested",
            false,
            Box::new(|r| {
                let mut v = b"\0\0\0\0".to_vec();
                v.extend(std::iter::repeat_n(b'[', 10000));
                v.push(0);
                r.send(c::VERSION, &v, &[]);
            }),
            Expect::Errno(EINVAL),
        ),
        ("second VERSION", true, Box::new(version(GOOD_VERSION)), Expect::Errno(EINVAL)),
        // Region access
        (
            "region index out of range",
            true,
            Box::new(|r| r.send(c::REGION_READ, &rw(99, 0, 4), &[])),
            Expect::Errno(EINVAL),
        ),
        ("region of size 0", true, Box::new(|r| r.send(c::REGION_READ, &rw(1, 0, 4), &[])), Expect::Errno(EINVAL)),
        (
            "read past the region end",
            true,
            Box::new(|r| r.send(c::REGION_READ, &rw(region::BAR0, 0xffc, 8), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "offset that overflows",
            true,
            Box::new(|r| r.send(c::REGION_READ, &rw(region::BAR0, u64::MAX - 1, 4), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "read count beyond max_data_xfer_size",
            true,
            Box::new(|r| r.send(c::REGION_READ, &rw(region::BAR0, 0, u32::MAX), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "zero-length read",
            true,
            Box::new(|r| r.send(c::REGION_READ, &rw(region::BAR0, 0, 0), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "unaligned register access",
            true,
            Box::new(|r| r.send(c::REGION_READ, &rw(region::BAR0, 2, 4), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "write whose count disagrees with its data",
            true,
            Box::new(|r| {
                let mut p = rw(region::BAR0, 0, 8);
                p.extend([0; 4]);
                r.send(c::REGION_WRITE, &p, &[]);
            }),
            Expect::Errno(EINVAL),
        ),
        (
            "WRITE_MULTI with a huge count",
            true,
            Box::new(|r| r.send(c::REGION_WRITE_MULTI, &u64::MAX.to_ne_bytes(), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "WRITE_MULTI entry of 9 bytes",
            true,
            Box::new(|r| {
                let mut p = 1u64.to_ne_bytes().to_vec();
                p.extend(rw(region::BAR0, 0, 9));
                p.extend([0; 8]);
                r.send(c::REGION_WRITE_MULTI, &p, &[]);
            }),
            Expect::Errno(EINVAL),
        ),
        (
            "region info with argsz below the structure",
            true,
            Box::new(|r| {
                r.send(c::DEVICE_GET_REGION_INFO, &RegionInfoWire { argsz: 8, ..Default::default() }.encode(), &[])
            }),
            Expect::Errno(EINVAL),
        ),
        (
            "DEVICE_RESET with a payload",
            true,
            Box::new(|r| r.send(c::DEVICE_RESET, &[0; 8], &[])),
            Expect::Errno(EINVAL),
        ),
        // IRQs and descriptors
        (
            "IRQ info for a bad index",
            true,
            Box::new(|r| r.send(c::DEVICE_GET_IRQ_INFO, &FourU32([16, 0, 99, 0]).encode(), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "SET_IRQS on a bad index",
            true,
            Box::new(|r| r.send(c::DEVICE_SET_IRQS, &set_irqs(f::DATA_NONE | f::ACTION_TRIGGER, 99, 0, 1), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "SET_IRQS start+count overflowing",
            true,
            Box::new(|r| {
                r.send(c::DEVICE_SET_IRQS, &set_irqs(f::DATA_NONE | f::ACTION_TRIGGER, irq::MSIX, u32::MAX, 2), &[])
            }),
            Expect::Errno(EINVAL),
        ),
        (
            "SET_IRQS with fewer fds than count",
            true,
            Box::new(|r| {
                r.send(c::DEVICE_SET_IRQS, &set_irqs(f::DATA_EVENTFD | f::ACTION_TRIGGER, irq::MSIX, 0, 2), &efds(1))
            }),
            Expect::Errno(EINVAL),
        ),
        (
            "SET_IRQS with a pipe instead of an eventfd",
            true,
            Box::new(|r| {
                let (a, b) = rustix::pipe::pipe().unwrap();
                r.send(c::DEVICE_SET_IRQS, &set_irqs(f::DATA_EVENTFD | f::ACTION_TRIGGER, irq::MSIX, 0, 2), &[a, b]);
            }),
            Expect::Errno(EINVAL),
        ),
        (
            "SET_IRQS DATA_BOOL with a count of 4 billion",
            true,
            Box::new(|r| {
                let mut p = set_irqs(f::DATA_BOOL | f::ACTION_TRIGGER, irq::MSIX, 0, u32::MAX);
                p.extend([1; 4]);
                r.send(c::DEVICE_SET_IRQS, &p, &[]);
            }),
            Expect::Errno(EINVAL),
        ),
        (
            "WRITE_MULTI whose entries do not match its count",
            true,
            Box::new(|r| {
                let mut p = 2u64.to_ne_bytes().to_vec();
                p.extend(rw(region::BAR0, 0x18, 4));
                p.extend([0; 8]);
                r.send(c::REGION_WRITE_MULTI, &p, &[]);
            }),
            Expect::Errno(EINVAL),
        ),
        (
            "more fds than max_msg_fds",
            true,
            Box::new(|r| {
                r.send(c::DEVICE_SET_IRQS, &set_irqs(f::DATA_EVENTFD | f::ACTION_TRIGGER, irq::MSIX, 0, 4), &efds(17))
            }),
            Expect::Errno(EINVAL),
        ),
        (
            "fds on a message that takes none",
            true,
            Box::new(|r| r.send(c::DEVICE_GET_INFO, &FourU32([16, 0, 0, 0]).encode(), &efds(3))),
            Expect::Errno(EINVAL),
        ),
        // DMA maps
        (
            "DMA_MAP over an existing mapping",
            true,
            Box::new(|r| {
                r.ok(c::DMA_MAP, &dma_map(0x10000, 0x2000, 0, RW), &[]);
                r.send(c::DMA_MAP, &dma_map(0x11000, 0x1000, 0, RW), &sealed_fd(0x1000));
            }),
            Expect::Errno(EEXIST),
        ),
        (
            "DMA_MAP fd smaller than the mapping",
            true,
            Box::new(|r| r.send(c::DMA_MAP, &dma_map(0x10000, 0x4000, 0, RW), &sealed_fd(0x2000))),
            Expect::Errno(EINVAL),
        ),
        (
            "DMA_MAP with two fds",
            true,
            Box::new(|r| {
                let mut fds = sealed_fd(0x1000);
                fds.extend(sealed_fd(0x1000));
                r.send(c::DMA_MAP, &dma_map(0x10000, 0x1000, 0, RW), &fds);
            }),
            Expect::Errno(EINVAL),
        ),
        (
            "DMA_MAP with an eventfd",
            true,
            Box::new(|r| r.send(c::DMA_MAP, &dma_map(0x10000, 0x1000, 0, RW), &efds(1))),
            Expect::Errno(EINVAL),
        ),
        (
            "DMA_MAP unaligned",
            true,
            Box::new(|r| r.send(c::DMA_MAP, &dma_map(0x10010, 0x1000, 0, RW), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "DMA_MAP wrapping the address space",
            true,
            Box::new(|r| r.send(c::DMA_MAP, &dma_map(u64::MAX - 0xfff, 0x2000, 0, RW), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "fd-less DMA_MAP with a file offset",
            true,
            Box::new(|r| r.send(c::DMA_MAP, &dma_map(0x10000, 0x1000, 0x1000, RW), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "DMA_MAP with unknown flags",
            true,
            Box::new(|r| r.send(c::DMA_MAP, &dma_map(0x10000, 0x1000, 0, 0xff), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "DMA_MAP beyond max_dma_maps",
            true,
            Box::new(|r| {
                for i in 0..4 {
                    r.ok(c::DMA_MAP, &dma_map(0x10000 * (i + 1), 0x1000, 0, RW), &[]);
                }
                r.send(c::DMA_MAP, &dma_map(0x100000, 0x1000, 0, RW), &[]);
            }),
            Expect::Errno(ENOSPC),
        ),
        (
            "DMA_UNMAP splitting a mapping",
            true,
            Box::new(|r| {
                r.ok(c::DMA_MAP, &dma_map(0x10000, 0x2000, 0, RW), &sealed_fd(0x2000));
                r.send(c::DMA_UNMAP, &unmap(0x11000, 0x1000, 0), &[]);
            }),
            Expect::Errno(EINVAL),
        ),
        (
            "DMA_UNMAP asking for a dirty bitmap",
            true,
            Box::new(|r| r.send(c::DMA_UNMAP, &unmap(0x10000, 0x1000, dma_unmap_flags::GET_DIRTY_BITMAP), &[])),
            Expect::Errno(EINVAL),
        ),
        (
            "DMA_UNMAP of a range never mapped succeeds (type1)",
            true,
            Box::new(|r| r.send(c::DMA_UNMAP, &unmap(0xfef0_0000, 0xffff_ffff_0110_0000, 0), &[])),
            Expect::Ok,
        ),
    ]
}

#[test]
fn hostile_messages_get_exact_errors_and_leave_the_server_serving_without_leaks() {
    let srv = Running::start(ServerConfig {
        max_dma_maps: 4,
        stall_timeout: Duration::from_millis(300),
        ..Default::default()
    });
    let table = cases();
    assert!(table.len() >= 30);
    for (name, negotiate, act, expect) in table {
        let sync = Raw::connect(&srv);
        sync.good();
        let before = fd_count();
        drop(sync);

        let r = Raw::connect(&srv);
        if negotiate {
            r.version();
        }
        act(&r);
        let error_reply = |m: Message, errno: i32| {
            assert!(m.header.is_reply() && m.header.is_error(), "{name}: {:?}", m.header);
            assert_eq!((m.header.msg_id, m.header.error as i32), (ID, errno), "{name}");
        };
        match expect {
            Expect::Errno(e) => {
                error_reply(r.recv().unwrap_or_else(|err| panic!("{name}: {err}")), e);
                r.good();
            }
            Expect::ErrnoThenClose(e) => {
                error_reply(r.recv().unwrap_or_else(|err| panic!("{name}: {err}")), e);
                assert!(matches!(r.recv(), Err(FrameError::Closed)), "{name}: not closed");
            }
            Expect::Close => assert!(matches!(r.recv(), Err(FrameError::Closed)), "{name}: not closed"),
            Expect::NoReply => r.good(),
            Expect::Ok => {
                let m = r.recv().unwrap();
                assert!(m.header.is_reply() && !m.header.is_error(), "{name}");
                r.good();
            }
        }
        drop(r);

        let sync = Raw::connect(&srv);
        sync.good();
        assert_eq!(fd_count(), before, "{name}: descriptor leaked");
        drop(sync);
    }
    assert_eq!(maps_named("hostile-ram"), 0);
}
