//! Descriptors go to the message they were sent with, whether the client sends each message with its own
//! sendmsg (QEMU) or several messages in one sendmsg (a pipelining client, which the specification allows:
//! "A client may pipeline multiple commands without waiting for previous command replies"). A send's
//! SCM_RIGHTS ride on its first bytes, so they belong to the first message of that send.
//! Descriptor and thread counts are taken around each test; the tests take turns so the counts are theirs.

mod common;

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use common::raw::Raw;
use common::{cmd, fd_count, memfd, regs, wait_for, Running};
use rustix::event::{eventfd, EventfdFlags};
use vfio_user_proto::device::{irq, region};
use vfio_user_proto::sock::{send_message, Message};
use vfio_user_proto::sync::Unpoison;
use vfio_user_proto::wire::{
    command as c, dma_map_flags, irq_set_flags as f, DmaMap, DmaUnmap, FourU32, Header, RegionInfoWire, RegionRw,
    SetIrqs, HEADER_SIZE,
};
use vfio_user_proto::ServerConfig;

const RW: u32 = dma_map_flags::READ | dma_map_flags::WRITE;
const PAGE: u64 = 0x1000;

/// One message as bytes, with its own id.
fn msg(id: u16, command: u16, payload: &[u8]) -> Vec<u8> {
    let mut m = Header::command(id, command, payload.len()).encode().to_vec();
    m.extend_from_slice(payload);
    m
}

/// One sendmsg carrying `messages` back to back, `fds` on its first bytes.
fn send_together(r: &Raw, messages: &[Vec<u8>], fds: &[OwnedFd]) {
    let all = messages.concat();
    let (h, rest) = all.split_at(HEADER_SIZE);
    let header = Header::decode(h.first_chunk().unwrap());
    let fds: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    send_message(&r.s, &header, &[rest], &fds).unwrap();
}

/// Each message with its own sendmsg, all sent before any reply is read; `fds[i]` go with message `i`.
fn send_apart(r: &Raw, messages: &[Vec<u8>], fds: Vec<Vec<OwnedFd>>) {
    for (m, f) in messages.iter().zip(fds) {
        send_together(r, std::slice::from_ref(m), &f);
    }
}

/// The replies to `ids`, in order: `Ok(())` or the errno.
fn replies(r: &Raw, ids: &[u16]) -> Vec<(u16, Result<(), i32>)> {
    ids.iter()
        .map(|_| {
            let m: Message = r.recv().unwrap();
            assert!(m.header.is_reply(), "{:?}", m.header);
            let res = if m.header.is_error() { Err(m.header.error as i32) } else { Ok(()) };
            (m.header.msg_id, res)
        })
        .collect()
}

fn map_payload(iova: u64, size: u64, offset: u64) -> Vec<u8> {
    DmaMap { argsz: 32, flags: RW, offset, address: iova, size }.encode()
}

fn read_scratch() -> Vec<u8> {
    RegionRw { offset: regs::SCRATCH, region: region::BAR0, count: 4 }.encode()
}

fn ram(len: u64, fill: u8) -> OwnedFd {
    let f = memfd("pipelined-ram", len, true);
    std::os::unix::fs::FileExt::write_all_at(&f, &vec![fill; len as usize], 0).unwrap();
    OwnedFd::from(f)
}

/// Threads of this process, less libtest's test threads: they are named after their test and come and go
/// as libtest starts the tests that then wait for their turn, which is not the server's doing.
fn threads() -> usize {
    const TESTS: [&str; 3] = [
        "dma_map_descriptors_belong_to_the_first_message_of_their_send",
        "set_irqs_eventfds_belong_to_the_first_message_of_their_send",
        "descriptors_on_commands_that_take_none_are_refused_in_every_send_pattern",
    ];
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|t| {
            // comm is the name cut to 15 bytes.
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let comm = comm.trim_end();
            comm.is_empty() || !TESTS.iter().any(|name| name.starts_with(comm))
        })
        .count()
}

/// Reads `len` bytes at `iova` as the device does. Only for fd maps: an fd-less map would ask the raw
/// client, which does not answer.
fn device_reads(srv: &Running, iova: u64, len: usize) -> Option<Vec<u8>> {
    let dma = srv.device.last_dma.lock().unwrap().clone()?;
    let mut b = vec![0; len];
    dma.read(iova, &mut b).ok().map(|()| b)
}

/// The tests of this binary run one at a time: each counts the process's descriptors and threads.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn server() -> (std::sync::MutexGuard<'static, ()>, Running) {
    let turn = TURN.lock().unpoison();
    (turn, Running::start(ServerConfig { dma_timeout: Duration::from_millis(300), ..Default::default() }))
}

#[test]
fn dma_map_descriptors_belong_to_the_first_message_of_their_send() {
    use libc::EINVAL;
    let (_turn, srv) = server();
    let (fds0, threads0) = (fd_count(), threads());
    {
        let r = Raw::connect(&srv);
        r.version();
        // QEMU's pattern, queued: a register read, then a DMA_MAP with its memfd, each sent alone.
        send_apart(
            &r,
            &[msg(1, c::REGION_READ, &read_scratch()), msg(2, c::DMA_MAP, &map_payload(0x10000, PAGE, 0))],
            vec![vec![], vec![ram(PAGE, 0xa1)]],
        );
        assert_eq!(replies(&r, &[1, 2]), [(1, Ok(())), (2, Ok(()))]);
        assert_eq!(device_reads(&srv, 0x10000, 4), Some(vec![0xa1; 4]), "the map is backed by its fd");

        // Pipelined: DMA_MAP with its memfd and a register read in one send.
        send_together(
            &r,
            &[msg(3, c::DMA_MAP, &map_payload(0x20000, PAGE, 0)), msg(4, c::REGION_READ, &read_scratch())],
            &[ram(PAGE, 0xb2)],
        );
        assert_eq!(replies(&r, &[3, 4]), [(3, Ok(())), (4, Ok(()))]);
        assert_eq!(device_reads(&srv, 0x20000, 4), Some(vec![0xb2; 4]), "the map is backed by its fd");

        // Pipelined, two descriptors on the DMA_MAP: refused, and the read after it is unaffected.
        send_together(
            &r,
            &[msg(5, c::DMA_MAP, &map_payload(0x30000, PAGE, 0)), msg(6, c::REGION_READ, &read_scratch())],
            &[ram(PAGE, 0), ram(PAGE, 0)],
        );
        assert_eq!(replies(&r, &[5, 6]), [(5, Err(EINVAL)), (6, Ok(()))]);

        // Pipelined, a file range that wraps 64 bits: refused, the read served.
        send_together(
            &r,
            &[msg(7, c::DMA_MAP, &map_payload(0x40000, PAGE, !(PAGE - 1))), msg(8, c::REGION_READ, &read_scratch())],
            &[ram(PAGE, 0)],
        );
        assert_eq!(replies(&r, &[7, 8]), [(7, Err(EINVAL)), (8, Ok(()))]);

        // The descriptor rides on a register read that leads the send: the read is refused, and the DMA_MAP
        // behind it arrives without fd, where a file offset is refused (the specification: 0 when the
        // region is not mappable) and offset 0 makes a message-served map.
        send_together(
            &r,
            &[
                msg(9, c::REGION_READ, &read_scratch()),
                msg(10, c::DMA_MAP, &map_payload(0x50000, PAGE, PAGE)),
                msg(11, c::DMA_MAP, &map_payload(0x60000, PAGE, 0)),
            ],
            &[ram(2 * PAGE, 0)],
        );
        assert_eq!(replies(&r, &[9, 10, 11]), [(9, Err(EINVAL)), (10, Err(EINVAL)), (11, Ok(()))]);
        r.good();
    }
    assert!(wait_for(Duration::from_secs(3), || fd_count() <= fds0), "descriptors leaked: {} -> {}", fds0, fd_count());
    // No growth: a thread of the previous test may still have been winding down at the first count.
    assert!(wait_for(Duration::from_secs(3), || threads() <= threads0), "threads: {} -> {}", threads0, threads());
}

#[test]
fn set_irqs_eventfds_belong_to_the_first_message_of_their_send() {
    use libc::EINVAL;
    let (_turn, srv) = server();
    let (fds0, threads0) = (fd_count(), threads());
    {
        let r = Raw::connect(&srv);
        r.version();
        let trigger = |count: u32| {
            SetIrqs { argsz: 20, flags: f::DATA_EVENTFD | f::ACTION_TRIGGER, index: irq::MSIX, start: 0, count }
                .encode()
        };
        // A device job's completion fires MSI-X vector 0: does our copy of the eventfd count it?
        let fires = |r: &Raw, efd: &OwnedFd| {
            let mut p = RegionRw { offset: regs::DMA_CMD, region: region::BAR0, count: 4 }.encode();
            p.extend(cmd::SUM.to_le_bytes());
            r.ok(c::REGION_WRITE, &p, &[]);
            let status = RegionRw { offset: regs::DMA_STATUS, region: region::BAR0, count: 4 }.encode();
            assert!(wait_for(Duration::from_secs(3), || r.ok(c::REGION_READ, &status, &[]).payload[16] != 1));
            let mut b = [0u8; 8];
            wait_for(Duration::from_millis(200), || rustix::io::read(efd, &mut b).is_ok_and(|n| n == 8))
        };
        let mut last = None;
        for (name, together) in [("each message alone", false), ("one send for both", true)] {
            let efd = eventfd(0, EventfdFlags::NONBLOCK).unwrap();
            let theirs = efd.try_clone().unwrap();
            let m = [msg(1, c::DEVICE_SET_IRQS, &trigger(1)), msg(2, c::REGION_READ, &read_scratch())];
            if together {
                send_together(&r, &m, &[theirs]);
            } else {
                send_apart(&r, &m, vec![vec![theirs], vec![]]);
            }
            assert_eq!(replies(&r, &[1, 2]), [(1, Ok(())), (2, Ok(()))], "{name}");
            assert!(fires(&r, &efd), "{name}: the eventfd is vector 0's");
            last = Some(efd);
        }
        // Pipelined with one eventfd for two vectors: refused; the read behind it is served.
        let efd = eventfd(0, EventfdFlags::NONBLOCK).unwrap();
        send_together(&r, &[msg(3, c::DEVICE_SET_IRQS, &trigger(2)), msg(4, c::REGION_READ, &read_scratch())], &[efd]);
        assert_eq!(replies(&r, &[3, 4]), [(3, Err(EINVAL)), (4, Ok(()))]);
        // The eventfd rides on a read that leads the send: the read is refused, and SET_IRQS arrives with no
        // eventfd, which de-assigns vector 0 (as VFIO's fd -1): the previous eventfd no longer fires.
        let efd = eventfd(0, EventfdFlags::NONBLOCK).unwrap();
        send_together(&r, &[msg(5, c::REGION_READ, &read_scratch()), msg(6, c::DEVICE_SET_IRQS, &trigger(1))], &[efd]);
        assert_eq!(replies(&r, &[5, 6]), [(5, Err(EINVAL)), (6, Ok(()))]);
        assert!(!fires(&r, &last.unwrap()), "vector 0 de-assigned");
        r.good();
    }
    assert!(wait_for(Duration::from_secs(3), || fd_count() <= fds0), "descriptors leaked: {} -> {}", fds0, fd_count());
    // No growth: a thread of the previous test may still have been winding down at the first count.
    assert!(wait_for(Duration::from_secs(3), || threads() <= threads0), "threads: {} -> {}", threads0, threads());
}

#[test]
fn descriptors_on_commands_that_take_none_are_refused_in_every_send_pattern() {
    use libc::EINVAL;
    let (_turn, srv) = server();
    let info = FourU32([16, 0, 0, 0]).encode();
    let mut write_scratch = RegionRw { offset: regs::SCRATCH, region: region::BAR0, count: 4 }.encode();
    write_scratch.extend(7u32.to_le_bytes());
    let mut multi = 1u64.to_ne_bytes().to_vec();
    multi.extend(RegionRw { offset: regs::SCRATCH, region: region::BAR0, count: 4 }.encode());
    multi.extend([1u8; 8]);
    let unmap = DmaUnmap { argsz: 24, flags: 0, address: 0x900000, size: PAGE }.encode();
    let rinfo = RegionInfoWire { argsz: 32, index: region::BAR0, ..Default::default() }.encode();
    // Every command but DMA_MAP and SET_IRQS, well formed (VERSION is covered by its own rule: only once).
    let commands: Vec<(&str, u16, Vec<u8>)> = vec![
        ("DMA_UNMAP", c::DMA_UNMAP, unmap),
        ("DEVICE_GET_INFO", c::DEVICE_GET_INFO, info.clone()),
        ("DEVICE_GET_REGION_INFO", c::DEVICE_GET_REGION_INFO, rinfo),
        ("DEVICE_GET_IRQ_INFO", c::DEVICE_GET_IRQ_INFO, FourU32([16, 0, irq::MSIX, 0]).encode()),
        ("REGION_READ", c::REGION_READ, read_scratch()),
        ("REGION_WRITE", c::REGION_WRITE, write_scratch),
        ("REGION_WRITE_MULTI", c::REGION_WRITE_MULTI, multi),
        ("DEVICE_RESET", c::DEVICE_RESET, vec![]),
        ("an unknown command", 99, vec![]),
    ];
    let r = Raw::connect(&srv);
    r.version();
    let fds0 = fd_count();
    for (name, command, payload) in &commands {
        let one_fd = || vec![ram(PAGE, 0)];
        // Alone, with a descriptor.
        send_apart(&r, &[msg(1, *command, payload)], vec![one_fd()]);
        assert_eq!(replies(&r, &[1]), [(1, Err(EINVAL))], "{name} alone");
        // Leading a send that carries a descriptor, a well-formed request behind it.
        send_together(&r, &[msg(2, *command, payload), msg(3, c::DEVICE_GET_INFO, &info)], &one_fd());
        assert_eq!(replies(&r, &[2, 3]), [(2, Err(EINVAL)), (3, Ok(()))], "{name} leading a send");
        // Sent alone with a descriptor right behind a request queued before it (QEMU's pattern).
        send_apart(&r, &[msg(4, c::DEVICE_GET_INFO, &info), msg(5, *command, payload)], vec![vec![], one_fd()]);
        assert_eq!(replies(&r, &[4, 5]), [(4, Ok(())), (5, Err(EINVAL))], "{name} behind a queued request");
        // Second in a send whose descriptor belongs to the first (an fd-less map at offset 0 takes none).
        send_together(&r, &[msg(6, c::DEVICE_GET_INFO, &info), msg(7, *command, payload)], &one_fd());
        assert_eq!(replies(&r, &[6, 7]).first(), Some(&(6, Err(EINVAL))), "{name} second in a send");
    }
    r.good();
    assert!(wait_for(Duration::from_secs(3), || fd_count() <= fds0), "descriptors leaked: {} -> {}", fds0, fd_count());
}
