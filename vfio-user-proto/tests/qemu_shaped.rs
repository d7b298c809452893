//! Message sequences shaped like what QEMU 10.2 sends (qemu-vfio-user-facts.md), and a client that
//! never answers the server's DMA_READ.

mod common;

use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use common::raw::Raw;
use common::{cmd, memfd, regs, status, Running};
use vfio_user_proto::device::region;
use vfio_user_proto::sock::Message;
use vfio_user_proto::wire::{command as c, dma_map_flags, DmaMap, DmaUnmap, Reader, RegionRw};
use vfio_user_proto::ServerConfig;

const R: u32 = dma_map_flags::READ;
const RW: u32 = dma_map_flags::READ | dma_map_flags::WRITE;
/// QEMU 10.2's VERSION proposal (facts: "QEMU's VERSION advertised ...").
const QEMU_VERSION: &[u8] = b"\0\0\0\0{\"capabilities\":{\"max_msg_fds\":16,\"max_data_xfer_size\":1048576,\
\"pgsizes\":4096,\"max_dma_maps\":65535,\"migration\":{\"pgsize\":4096,\"max_bitmap_size\":1048576},\
\"write_multiple\":true}}\0";
const GUEST_RAM: u64 = 0x2000_0000;

/// `write_multiple` is agreed only when the server is configured for it and the client proposes it (QEMU
/// 10.2 then queues every request through its I/O thread: ServerConfig::write_multiple).
#[test]
fn write_multiple_is_agreed_only_when_configured_and_proposed() {
    let without = b"\0\0\0\0{\"capabilities\":{\"max_msg_fds\":16,\"pgsizes\":4096}}\0";
    let cases: [(bool, &[u8], Option<bool>); 4] =
        [(false, QEMU_VERSION, None), (true, QEMU_VERSION, Some(true)), (true, without, None), (false, without, None)];
    for (configured, proposal, agreed) in cases {
        let srv = Running::start(ServerConfig { write_multiple: configured, ..ServerConfig::default() });
        let v = Raw::connect(&srv).version_with(proposal);
        let text = v.payload.get(4..).and_then(|t| t.strip_suffix(b"\0")).unwrap_or_default();
        let caps: serde_json::Value = serde_json::from_slice(text).unwrap();
        assert_eq!(caps["capabilities"]["write_multiple"].as_bool(), agreed, "configured {configured}");
    }
}

fn map(r: &Raw, iova: u64, size: u64, offset: u64, flags: u32, fd: Option<&std::fs::File>) {
    let fds: Vec<OwnedFd> = fd.map(|f| OwnedFd::from(f.try_clone().unwrap())).into_iter().collect();
    r.ok(c::DMA_MAP, &DmaMap { argsz: 32, flags, offset, address: iova, size }.encode(), &fds);
}

/// Unmaps and returns the reply's size (bytes unmapped).
fn unmap(r: &Raw, iova: u64, size: u64) -> u64 {
    let m = r.ok(c::DMA_UNMAP, &DmaUnmap { argsz: 24, flags: 0, address: iova, size }.encode(), &[]);
    DmaUnmap::decode(&m.payload).unwrap().size
}

fn write32(r: &Raw, off: u64, v: u32) {
    let mut p = RegionRw { offset: off, region: region::BAR0, count: 4 }.encode();
    p.extend(v.to_le_bytes());
    r.send(c::REGION_WRITE, &p, &[]);
    assert!(!reply_skipping_requests(r).header.is_error());
}

/// The next reply, skipping (and never answering) any request the server sends meanwhile.
fn reply_skipping_requests(r: &Raw) -> Message {
    loop {
        let m = r.recv().unwrap();
        if m.header.is_reply() {
            return m;
        }
    }
}

/// Reads a register, skipping (and never answering) any request the server sends meanwhile.
fn read32(r: &Raw, off: u64) -> u32 {
    r.send(c::REGION_READ, &RegionRw { offset: off, region: region::BAR0, count: 4 }.encode(), &[]);
    let m = reply_skipping_requests(r);
    assert!(!m.header.is_error() && m.header.command == c::REGION_READ, "{:?}", m.header);
    let (_, data) = RegionRw::decode(&m.payload).unwrap();
    u32::from_le_bytes(data.try_into().unwrap())
}

fn run_job(r: &Raw, command: u32, addr: u64, len: u32) -> (u32, u32) {
    write32(r, regs::DMA_ADDR_LO, addr as u32);
    write32(r, regs::DMA_ADDR_HI, (addr >> 32) as u32);
    write32(r, regs::DMA_LEN, len);
    write32(r, regs::DMA_CMD, command);
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let st = read32(r, regs::DMA_STATUS);
        if st != status::BUSY || Instant::now() > end {
            return (st, read32(r, regs::DMA_RESULT));
        }
    }
}

#[test]
fn qemu_10_2_boot_viommu_and_guest_dma_sequence_is_served() {
    let srv = Running::start(ServerConfig::default());
    let r = Raw::connect(&srv);
    let v = r.version_with(QEMU_VERSION);
    let mut rd = Reader::new(&v.payload);
    assert_eq!((rd.u16().unwrap(), rd.u16().unwrap()), (0, 0), "minor is min(client, ours)");
    let text = rd.rest();
    assert_eq!(text.last(), Some(&0));
    let caps: serde_json::Value = serde_json::from_slice(&text[..text.len() - 1]).unwrap();
    let caps = &caps["capabilities"];
    assert_eq!((caps["max_msg_fds"].as_u64(), caps["pgsizes"].as_u64()), (Some(16), Some(4096)));
    assert_eq!(caps["write_multiple"].as_bool(), None, "not agreed unless configured");

    let ram = memfd("qemu-guest-ram", GUEST_RAM, true);
    // Boot: RAM with fd and offset = GPA, ROM/VRAM/own BAR without fd.
    map(&r, 0x0, 0xa0000, 0x0, RW, Some(&ram));
    map(&r, 0xc0000, 0x1ff40000, 0xc0000, RW, Some(&ram));
    map(&r, 0xfffc0000, 0x40000, 0, R, None);
    map(&r, 0xfd000000, 0x1000000, 0, RW, None);
    map(&r, 0xfebd1000, 0xf000, 0, RW, None);
    // SeaBIOS PAM reconfiguration: unmap, then RO/RW pieces.
    assert_eq!(unmap(&r, 0xc0000, 0x1ff40000), 0x1ff40000);
    let pam = [(0xc0000, 0xb000, R), (0xcb000, 0x3000, RW), (0xce000, 0x16000, R), (0xe4000, 0xc000, RW)];
    for (iova, size, flags) in pam.into_iter().chain([(0xf0000, 0x10000, R), (0x100000, 0x1ff00000, RW)]) {
        map(&r, iova, size, iova, flags, Some(&ram));
    }
    // The guest enables DMAR: every mapping goes, then whole-space unmaps of ranges never mapped.
    for (iova, size) in [(0x0, 0xa0000)].into_iter().chain(pam.map(|(i, s, _)| (i, s))) {
        assert_eq!(unmap(&r, iova, size), size);
    }
    for (iova, size) in [(0xf0000, 0x10000), (0x100000, 0x1ff00000), (0xfd000000, 0x1000000), (0xfebd1000, 0xf000)] {
        assert_eq!(unmap(&r, iova, size), size);
    }
    assert_eq!(unmap(&r, 0xfffc0000, 0x40000), 0x40000);
    for (iova, size) in [
        (0xfef00000, 0x100000),
        (0x100000000, 0x100000000),
        (0x800000000000, 0x800000000000),
        (0x0, 0x80000000),
        (0xfec00000, 0x200000),
    ] {
        assert_eq!(unmap(&r, iova, size), 0, "never mapped: success, 0 bytes");
    }
    // The guest's VFIO_IOMMU_MAP_DMA of 64 KiB at IOVA 0x100000: one map per page, offset = GPA
    // (the first seven GPAs are those of the facts' run 1, the rest distinct pages).
    let gpas: Vec<u64> = [0x1ffbf000u64, 0x1ffb6000, 0x1ffb4000, 0x1ffb2000, 0x1ff9c000, 0x1ff9b000, 0x1ff9a000]
        .into_iter()
        .chain((0..9).map(|i| 0x1ffc0000 + i * 0x3000))
        .collect();
    for (i, gpa) in gpas.iter().enumerate() {
        map(&r, 0x100000 + i as u64 * 0x1000, 0x1000, *gpa, RW, Some(&ram));
    }
    // The guest fills its buffer with i & 0xff; the device sums 0x1000 bytes at IOVA 0x102000.
    for (i, gpa) in gpas.iter().enumerate() {
        let page: Vec<u8> = (0..0x1000).map(|b| ((i * 0x1000 + b) & 0xff) as u8).collect();
        ram.write_all_at(&page, *gpa).unwrap();
    }
    assert_eq!(run_job(&r, cmd::SUM, 0x102000, 0x1000), (status::DONE, 0x7f800), "facts: expected=0x7f800");
    // The device fills 0x3000 bytes at IOVA 0x104000: three separately mapped pages.
    write32(&r, regs::FILL_BYTE, 0xa5);
    assert_eq!(run_job(&r, cmd::FILL, 0x104000, 0x3000).0, status::DONE);
    for (i, gpa) in gpas.iter().enumerate() {
        let mut page = vec![0u8; 0x1000];
        ram.read_exact_at(&mut page, *gpa).unwrap();
        let filled = (4..7).contains(&i);
        assert!(page
            .iter()
            .enumerate()
            .all(|(b, v)| *v == if filled { 0xa5 } else { ((i * 0x1000 + b) & 0xff) as u8 }));
    }
    for i in 0..16u64 {
        assert_eq!(unmap(&r, 0x100000 + i * 0x1000, 0x1000), 0x1000);
    }
    // Poweroff: the IOMMU region removals, the last one ending exactly at 2^64.
    assert_eq!(unmap(&r, 0x0, 0xfee00000), 0);
    assert_eq!(unmap(&r, 0xfef00000, 0xffff_ffff_0110_0000), 0);
    r.ok(c::DEVICE_RESET, &[], &[]);
}

#[test]
fn a_client_that_never_answers_dma_read_fails_the_job_after_the_timeout_while_registers_stay_served() {
    let srv = Running::start(ServerConfig { dma_timeout: Duration::from_millis(300), ..Default::default() });
    let r = Raw::connect(&srv);
    r.version();
    map(&r, 0x1000, 0x1000, 0, RW, None);
    let start = Instant::now();
    let (st, _) = run_job(&r, cmd::SUM, 0x1000, 0x100);
    assert_eq!(st, status::ERROR);
    assert!(start.elapsed() >= Duration::from_millis(300));
    // The connection still works.
    write32(&r, regs::SCRATCH, 9);
    assert_eq!(read32(&r, regs::SCRATCH), 9);
}

#[test]
fn region_info_asked_with_a_short_argsz_passes_qemus_cap_offset_check_and_the_full_ask_gets_caps_and_fd() {
    use vfio_user_proto::device::region_flags::CAPS;
    use vfio_user_proto::wire::RegionInfoWire;
    let srv = Running::start(ServerConfig::default());
    let r = Raw::connect(&srv);
    r.version_with(QEMU_VERSION);
    let ask = |argsz: u32| {
        let m =
            r.ok(c::DEVICE_GET_REGION_INFO, &RegionInfoWire { argsz, index: 2, ..Default::default() }.encode(), &[]);
        (RegionInfoWire::decode_prefix(&m.payload).unwrap(), m)
    };
    let (short, m) = ask(32);
    // hw/vfio-user/device.c: CAPS with cap_offset < 32 or > argsz is -EINVAL.
    assert!(short.flags & CAPS == 0 || (32..=short.argsz).contains(&short.cap_offset));
    assert_eq!((short.argsz, m.payload.len(), m.fds.len()), (32 + 16 + 16, 32, 0));
    let (full, m) = ask(short.argsz);
    assert_eq!((full.flags & CAPS, full.cap_offset, m.payload.len(), m.fds.len()), (CAPS, 32, 64, 1));
}

#[test]
fn advertised_limits_never_exceed_what_qemu_proposed() {
    let srv = Running::start(ServerConfig { max_msg_fds: 64, max_data_xfer_size: 8 << 20, ..Default::default() });
    let r = Raw::connect(&srv);
    let v = r.version_with(QEMU_VERSION);
    let text = &v.payload[4..v.payload.len() - 1];
    let caps: serde_json::Value = serde_json::from_slice(text).unwrap();
    let caps = &caps["capabilities"];
    // QEMU's check_max_fds refuses > 16, check_max_dma > 65535; its proposal had 1 MiB transfers.
    assert_eq!(caps["max_msg_fds"].as_u64(), Some(16));
    assert_eq!(caps["max_dma_maps"].as_u64(), Some(65535));
    assert_eq!(caps["max_data_xfer_size"].as_u64(), Some(1 << 20));
    assert!(caps.get("migration").is_none() && caps.get("twin_socket").is_none());
}

/// Answers the server's DMA requests as QEMU's hw/vfio-user/pci.c does: DMA_READ with header, address,
/// count and data; DMA_WRITE with the bare header. Returns the next reply to our own request.
fn recv_serving_dma_like_qemu(r: &Raw, mem: &mut [u8], base: u64) -> Message {
    use vfio_user_proto::wire::{DmaRw, Header};
    loop {
        let m = r.recv().unwrap();
        if m.header.is_reply() {
            return m;
        }
        let (rw, data) = DmaRw::decode(&m.payload).unwrap();
        let at = (rw.address - base) as usize..(rw.address - base + rw.count) as usize;
        match m.header.command {
            c::DMA_READ => {
                let mut p = rw.encode();
                p.extend_from_slice(&mem[at]);
                r.send_hdr(Header::reply(&m.header, p.len()), &p, &[]);
            }
            c::DMA_WRITE => {
                mem[at].copy_from_slice(data);
                r.send_hdr(Header::reply(&m.header, 0), &[], &[]);
            }
            other => panic!("unexpected server request {other}"),
        }
    }
}

#[test]
fn dma_read_and_write_answered_the_way_qemu_answers_them_complete_the_job() {
    // Small transfers: the job needs several DMA messages, interleaved with our register reads.
    let srv = Running::start(ServerConfig { max_data_xfer_size: 0x400, ..Default::default() });
    let r = Raw::connect(&srv);
    r.version_with(QEMU_VERSION);
    // Fd-less, as QEMU maps RAM without a shared memory backend.
    map(&r, 0x4000, 0x2000, 0, RW, None);
    let mut mem: Vec<u8> = (0..0x2000).map(|i| (i % 7) as u8).collect();
    let rw_req = |off: u64| RegionRw { offset: off, region: region::BAR0, count: 4 };
    let write = |mem: &mut Vec<u8>, off: u64, v: u32| {
        let mut p = rw_req(off).encode();
        p.extend(v.to_le_bytes());
        r.send(c::REGION_WRITE, &p, &[]);
        assert!(!recv_serving_dma_like_qemu(&r, mem, 0x4000).header.is_error());
    };
    let read = |mem: &mut Vec<u8>, off: u64| {
        r.send(c::REGION_READ, &rw_req(off).encode(), &[]);
        let m = recv_serving_dma_like_qemu(&r, mem, 0x4000);
        u32::from_le_bytes(RegionRw::decode(&m.payload).unwrap().1.try_into().unwrap())
    };
    let job = |mem: &mut Vec<u8>, command: u32, addr: u32, len: u32| {
        for (off, v) in
            [(regs::DMA_ADDR_LO, addr), (regs::DMA_ADDR_HI, 0), (regs::DMA_LEN, len), (regs::DMA_CMD, command)]
        {
            write(mem, off, v);
        }
        let end = Instant::now() + Duration::from_secs(5);
        while read(mem, regs::DMA_STATUS) == status::BUSY && Instant::now() < end {}
        (read(mem, regs::DMA_STATUS), read(mem, regs::DMA_RESULT))
    };
    let expect: u32 = (0x800..0x2000u32).map(|i| i % 7).sum();
    assert_eq!(job(&mut mem, cmd::SUM, 0x4800, 0x1800), (status::DONE, expect));
    write(&mut mem, regs::FILL_BYTE, 0xee);
    assert_eq!(job(&mut mem, cmd::FILL, 0x4100, 0x1000).0, status::DONE);
    assert!(mem[0x100..0x1100].iter().all(|b| *b == 0xee));
    assert_eq!((mem[0xff], mem[0x1100]), ((0xff % 7) as u8, (0x1100 % 7) as u8));
}

#[test]
fn a_client_that_stops_reading_replies_is_disconnected_after_the_send_timeout() {
    use std::io::Write;
    let srv = Running::start(ServerConfig { dma_timeout: Duration::from_millis(200), ..Default::default() });
    let r = Raw::connect(&srv);
    r.version();
    r.s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let req = RegionRw { offset: 0, region: region::CONFIG, count: 256 }.encode();
    let msg = [vfio_user_proto::wire::Header::command(1, c::REGION_READ, req.len()).encode().to_vec(), req].concat();
    // Far more reply bytes than socket buffers hold; our own writes may fail once the server gives up.
    for _ in 0..20_000 {
        if (&r.s).write_all(&msg).is_err() {
            break;
        }
    }
    let end = Instant::now() + Duration::from_secs(5);
    let closed = loop {
        match r.recv() {
            Ok(_) if Instant::now() < end => continue,
            Ok(_) => break false,
            Err(_) => break true,
        }
    };
    assert!(closed, "server still talking after 5 s");
    Raw::connect(&srv).good();
}

#[test]
fn posted_writes_and_write_multi_with_no_reply_take_effect_in_order_without_replies() {
    use vfio_user_proto::wire::{hdr_flags, Header};
    let srv = Running::start(ServerConfig::default());
    let r = Raw::connect(&srv);
    r.version_with(QEMU_VERSION);
    // A posted REGION_WRITE, as QEMU sends when x-no-posted-writes is off.
    let mut p = RegionRw { offset: regs::SCRATCH, region: region::BAR0, count: 4 }.encode();
    p.extend(0x1111u32.to_le_bytes());
    let posted = |cmd: u16, p: &[u8]| {
        let mut h = Header::command(9, cmd, p.len());
        h.flags |= hdr_flags::NO_REPLY;
        r.send_hdr(h, p, &[]);
    };
    posted(c::REGION_WRITE, &p);
    // A REGION_WRITE_MULTI as QEMU's vfio_user_create_multi builds it: NO_REPLY, 8-byte data slots.
    let mut m = 2u64.to_ne_bytes().to_vec();
    for (off, v) in [(regs::FILL_BYTE, 0x22u32), (regs::DMA_LEN, 0x33)] {
        m.extend(RegionRw { offset: off, region: region::BAR0, count: 4 }.encode());
        m.extend(u64::from(v).to_le_bytes());
    }
    posted(c::REGION_WRITE_MULTI, &m);
    // The first message back is the reply to this read: the posted writes were applied, unanswered.
    assert_eq!(read32(&r, regs::SCRATCH), 0x1111);
    assert_eq!((read32(&r, regs::FILL_BYTE), read32(&r, regs::DMA_LEN)), (0x22, 0x33));
}
