//! The vfio-user server, from a hostile client's side.
//!
//! A real `Server::serve_connection` runs on a thread over one end of a socketpair, serving a real PCI
//! function (hfi1 or irdma engine). The input is a sequence of whole client messages: VERSION, DMA maps
//! with and without fds (memfds, and fds that are not memory), unmaps, info queries, IRQ setup with
//! eventfds, region reads and writes, resets, raw commands and stray replies, and disconnects (clean, or
//! in the middle of a message), each in its own sendmsg or several in one (a pipelining client). The server's own DMA_READ/DMA_WRITE requests are answered.
//! Oracles: no panic; every request answered (or the connection closed) within a deadline; the serving
//! thread returns after the client is gone; no descriptor left open afterwards.
//!
//! An input that starts with `vfio_user_proto::record::seed::SEED_MAGIC` is a seed made from a recorded
//! session (`device-model seeds`, docs/fuzzing.md): its client messages go out as recorded, with fresh
//! descriptors of the recorded kinds, and the server's DMA_READs get the data the device read then.
#![no_main]

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;

use device_model::hfi1::{Hfi1, Hfi1Config};
use device_model::irdma::{Irdma, IrdmaConfig};
use device_model::pci::regs::{PCI_COMMAND, PCI_COMMAND_MASTER, PCI_COMMAND_MEMORY};
use device_model::pci::{Function, PciIds};
use rdma_emu_fuzz::fds::{leaked_since, open_fds};
use rdma_emu_fuzz::reused_thread;
use rdma_emu_fuzz::wire_client::{Answer, Peer};
use vfio_user_proto::device::region;
use vfio_user_proto::record::seed::{Seed, SeedDevice, SeedFds, SeedItem};
use vfio_user_proto::sock::Message;
use vfio_user_proto::wire::{command as cmd, hdr_flags, put_u16, put_u32, put_u64, Header};
use vfio_user_proto::{Server, ServerConfig};

/// How long a request may go unanswered before it counts as a hang.
const REPLY_DEADLINE: Duration = Duration::from_secs(3);
/// How long the serving thread may take to return after the client closed.
const CLOSE_DEADLINE: Duration = Duration::from_secs(5);
const MAX_OPS: usize = 48;
/// How long the server (`busy_poll`) and the harness's peer poll the socket before they sleep. Each input is
/// a burst of round trips; with a core each, neither side then pays a wake-up per message (1.6-3.9x the
/// inputs per second here, docs/fuzzing.md), and the server's busy-poll path is fuzzed too.
const SPIN: Duration = Duration::from_micros(100);
/// Stray replies to anything but DMA_READ/WRITE carry ids with this bit set; the harness's own requests count up
/// from 1 and never reach it. The server answers such a reply with an EINVAL error reply under the same id
/// (docs/vfio-user.md), which must not be mistaken for the answer to a later request of ours. Stray DMA
/// replies keep their fuzzed id: the server routes or drops them and never answers.
const STRAY_ID_BIT: u16 = 0x8000;
const _: () = assert!(MAX_OPS < STRAY_ID_BIT as usize);
const MAX_XFER: u32 = 1 << 16;

#[derive(Arbitrary, Debug)]
enum FdKind {
    /// A memfd of this many pages (0..=15), the normal DMA backing.
    Memfd(u8),
    /// The same, sealed against shrinking (what the server mmaps rather than serving by messages).
    SealedMemfd(u8),
    /// Not mappable memory: an eventfd.
    Eventfd,
    /// A pipe end.
    Pipe,
}

#[derive(Arbitrary, Debug)]
enum Caps {
    None,
    Good { max_fds: u8, xfer: u32, pgsize: u64, maps: u16, multi: bool },
    Text(String),
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Version {
        major: u16,
        minor: u16,
        caps: Caps,
        nul: bool,
    },
    DmaMap {
        flags: u8,
        offset: u16,
        iova_page: u32,
        pages: u8,
        fds: Vec<FdKind>,
        argsz_delta: i8,
    },
    DmaUnmap {
        flags: u8,
        iova_page: u32,
        pages: u8,
        argsz_delta: i8,
    },
    DeviceInfo {
        argsz: u8,
    },
    RegionInfo {
        index: u8,
        argsz: u16,
    },
    IrqInfo {
        index: u8,
        argsz: u8,
    },
    SetIrqs {
        flags: u8,
        index: u8,
        start: u16,
        count: u16,
        eventfds: u8,
        data: Vec<u8>,
    },
    RegionRead {
        region: u8,
        offset: u32,
        count: u16,
    },
    RegionWrite {
        region: u8,
        offset: u32,
        data: Vec<u8>,
    },
    WriteMulti {
        entries: Vec<(u8, u32, u8, u64)>,
        count_delta: i8,
    },
    Reset {
        payload: Vec<u8>,
    },
    /// PCI_COMMAND memory decoding and bus mastering on (`pci_enable_device` + `pci_set_master`), without
    /// which BAR reads return all-ones and writes are dropped: a short cut to the device's registers.
    Enable,
    Raw {
        command: u16,
        flags: u8,
        payload: Vec<u8>,
        memfds: u8,
    },
    /// A reply the server did not ask for (or a DMA reply with a made-up id).
    StrayReply {
        command: u16,
        id: u16,
        payload: Vec<u8>,
    },
    /// A header whose size does not match what follows, then the connection ends.
    Truncated {
        command: u16,
        claimed: u32,
        sent: Vec<u8>,
    },
    Disconnect,
    /// The next `n % 4 + 2` messages go out in one sendmsg, every descriptor on its first bytes (a pipelining
    /// client); their replies are awaited in order afterwards.
    Batch(u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    irdma: bool,
    /// Start with a well-formed VERSION (most inputs want to get past negotiation).
    negotiate: bool,
    ops: Vec<Op>,
}

struct Served {
    server: Server,
}

/// hfi1, irdma and the hfi1 chip personality (seeds of the stock driver's sessions), in `SeedDevice` order.
fn servers() -> &'static Option<[Served; 3]> {
    static S: OnceLock<Option<[Served; 3]>> = OnceLock::new();
    S.get_or_init(|| {
        let config = ServerConfig {
            max_msg_fds: 8,
            max_data_xfer_size: MAX_XFER,
            max_dma_maps: 16,
            dma_timeout: Duration::from_millis(200),
            stall_timeout: Duration::from_millis(200),
            busy_poll: SPIN,
            // Off by default (QEMU 10.2's queued sends); on here, so the agreement stays fuzzed.
            write_multiple: true,
            ..Default::default()
        };
        let hfi =
            Hfi1::new(Hfi1Config { rcv_contexts: 4, rcv_array_count: 512, doorbell_queue: 8, ..Default::default() })
                .ok()?;
        let ird = Irdma::new(IrdmaConfig {
            qhash_capacity: 16,
            msix_vectors: 4,
            ccq_full_wait: Duration::from_millis(1),
            max_ccq_size: 4096,
            ..Default::default()
        });
        // The chip's own shape: a seed of the stock driver's probe reaches the same CSRs as it did.
        let wfr = Hfi1::new(Hfi1Config::wfr()).ok()?;
        let f_hfi = Function::try_new(Arc::new(hfi), PciIds::hfi1_default()).ok()?;
        let f_ird = Function::try_new(Arc::new(ird), PciIds::irdma_default()).ok()?;
        let f_wfr = Function::try_new(Arc::new(wfr), PciIds::hfi1_wfr_default()).ok()?;
        Some([
            Served { server: Server::new(f_hfi, config.clone()) },
            Served { server: Server::new(f_ird, config.clone()) },
            Served { server: Server::new(f_wfr, config) },
        ])
    })
}

fn memfd(pages: u8, sealed: bool) -> Option<OwnedFd> {
    use rustix::fs::{memfd_create, MemfdFlags, SealFlags};
    let fd = memfd_create("fuzz-dma", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).ok()?;
    rustix::fs::ftruncate(&fd, u64::from(pages % 16) * 4096).ok()?;
    if sealed {
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK).ok()?;
    }
    Some(fd)
}

fn make_fd(kind: &FdKind) -> Option<OwnedFd> {
    match kind {
        FdKind::Memfd(p) => memfd(*p, false),
        FdKind::SealedMemfd(p) => memfd(*p, true),
        FdKind::Eventfd => rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).ok(),
        FdKind::Pipe => rustix::pipe::pipe().ok().map(|(r, _w)| r),
    }
}

/// Answers the server's DMA_READ (with zeros) and DMA_WRITE (accepted), as a client without fd-backed
/// memory would.
fn answer_dma(peer: &Peer, m: Message) {
    answer_dma_from(peer, m, &mut VecDeque::new())
}

/// As [`answer_dma`], a DMA_READ answered with the next of `data` (cut or zero-filled to the count asked).
fn answer_dma_from(peer: &Peer, m: Message, data: &mut VecDeque<Vec<u8>>) {
    let h = m.header;
    if h.no_reply() {
        return;
    }
    let reply = match h.command {
        cmd::DMA_READ if m.payload.len() >= 16 => {
            let count = u64::from_le_bytes(m.payload[8..16].try_into().unwrap_or([0; 8]));
            if count <= u64::from(MAX_XFER) {
                let mut p = m.payload[..16].to_vec();
                let mut bytes = data.pop_front().unwrap_or_default();
                bytes.resize(count as usize, 0);
                p.extend_from_slice(&bytes);
                Some(p)
            } else {
                None
            }
        }
        cmd::DMA_WRITE if m.payload.len() >= 16 => Some(m.payload[..16].to_vec()),
        _ => None,
    };
    match reply {
        Some(p) => peer.send(&Header::reply(&h, p.len()), &p, &[]),
        None => peer.send(&Header::error_reply(&h, libc::EINVAL), &[], &[]),
    };
}

fn version_payload(major: u16, minor: u16, caps: &Caps, nul: bool) -> Vec<u8> {
    let mut p = Vec::new();
    put_u16(&mut p, major);
    put_u16(&mut p, minor);
    match caps {
        Caps::None => {}
        Caps::Good { max_fds, xfer, pgsize, maps, multi } => {
            let j = serde_json::json!({"capabilities": {
                "max_msg_fds": max_fds, "max_data_xfer_size": xfer,
                "migration": {"pgsize": pgsize}, "pgsizes": pgsize, "max_dma_maps": maps, "write_multiple": multi,
            }});
            p.extend_from_slice(j.to_string().as_bytes());
        }
        Caps::Text(t) => p.extend_from_slice(t.as_bytes()),
        Caps::Bytes(b) => p.extend_from_slice(b),
    }
    if nul {
        p.push(0);
    }
    p
}

/// One message to send: header command and flags, payload, fds.
struct Outgoing {
    command: u16,
    flags: u32,
    payload: Vec<u8>,
    fds: Vec<OwnedFd>,
}

fn build(op: Op) -> Option<Outgoing> {
    let msg = |command: u16, payload: Vec<u8>| Outgoing { command, flags: 0, payload, fds: Vec::new() };
    Some(match op {
        Op::Version { major, minor, caps, nul } => msg(cmd::VERSION, version_payload(major, minor, &caps, nul)),
        Op::DmaMap { flags, offset, iova_page, pages, fds, argsz_delta } => {
            let mut p = Vec::new();
            put_u32(&mut p, (32i32 + i32::from(argsz_delta)) as u32);
            put_u32(&mut p, u32::from(flags));
            put_u64(&mut p, u64::from(offset) * 512);
            put_u64(&mut p, u64::from(iova_page) << 12);
            put_u64(&mut p, u64::from(pages) << 12);
            Outgoing { fds: fds.iter().take(10).filter_map(make_fd).collect(), ..msg(cmd::DMA_MAP, p) }
        }
        Op::DmaUnmap { flags, iova_page, pages, argsz_delta } => {
            let mut p = Vec::new();
            put_u32(&mut p, (24i32 + i32::from(argsz_delta)) as u32);
            put_u32(&mut p, u32::from(flags));
            put_u64(&mut p, u64::from(iova_page) << 12);
            put_u64(&mut p, u64::from(pages) << 12);
            msg(cmd::DMA_UNMAP, p)
        }
        Op::DeviceInfo { argsz } => {
            let mut p = Vec::new();
            for v in [u32::from(argsz), 0, 0, 0] {
                put_u32(&mut p, v);
            }
            msg(cmd::DEVICE_GET_INFO, p)
        }
        Op::RegionInfo { index, argsz } => {
            let mut p = Vec::new();
            put_u32(&mut p, u32::from(argsz));
            put_u32(&mut p, 0);
            put_u32(&mut p, u32::from(index % 12));
            put_u32(&mut p, 0);
            put_u64(&mut p, 0);
            put_u64(&mut p, 0);
            msg(cmd::DEVICE_GET_REGION_INFO, p)
        }
        Op::IrqInfo { index, argsz } => {
            let mut p = Vec::new();
            for v in [u32::from(argsz), 0, u32::from(index % 8), 0] {
                put_u32(&mut p, v);
            }
            msg(cmd::DEVICE_GET_IRQ_INFO, p)
        }
        Op::SetIrqs { flags, index, start, count, eventfds, data } => {
            let mut p = Vec::new();
            put_u32(&mut p, 20 + data.len() as u32);
            put_u32(&mut p, u32::from(flags) & 0x3f);
            put_u32(&mut p, u32::from(index % 6));
            put_u32(&mut p, u32::from(start));
            put_u32(&mut p, u32::from(count));
            p.extend_from_slice(&data);
            let fds = (0..eventfds % 10)
                .filter_map(|_| rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).ok())
                .collect();
            Outgoing { fds, ..msg(cmd::DEVICE_SET_IRQS, p) }
        }
        Op::RegionRead { region, offset, count } => {
            let mut p = Vec::new();
            put_u64(&mut p, u64::from(offset));
            put_u32(&mut p, u32::from(region % 10));
            put_u32(&mut p, u32::from(count));
            msg(cmd::REGION_READ, p)
        }
        Op::RegionWrite { region, offset, data } => {
            let mut p = Vec::new();
            put_u64(&mut p, u64::from(offset));
            put_u32(&mut p, u32::from(region % 10));
            put_u32(&mut p, data.len() as u32);
            p.extend_from_slice(&data);
            msg(cmd::REGION_WRITE, p)
        }
        Op::WriteMulti { entries, count_delta } => {
            let mut p = Vec::new();
            put_u64(&mut p, (entries.len() as i64 + i64::from(count_delta)).max(0) as u64);
            for (region, offset, count, data) in entries.iter().take(210) {
                put_u64(&mut p, u64::from(*offset));
                put_u32(&mut p, u32::from(region % 10));
                put_u32(&mut p, u32::from(count % 10));
                put_u64(&mut p, *data);
            }
            msg(cmd::REGION_WRITE_MULTI, p)
        }
        Op::Reset { payload } => msg(cmd::DEVICE_RESET, payload),
        Op::Enable => {
            let mut p = Vec::new();
            put_u64(&mut p, PCI_COMMAND as u64);
            put_u32(&mut p, region::CONFIG);
            put_u32(&mut p, 2);
            p.extend_from_slice(&(PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER).to_le_bytes());
            msg(cmd::REGION_WRITE, p)
        }
        Op::Raw { command, flags, payload, memfds } => Outgoing {
            flags: u32::from(flags),
            fds: (0..memfds % 4).filter_map(|_| memfd(1, false)).collect(),
            ..msg(command % 20, payload)
        },
        Op::StrayReply { .. } | Op::Truncated { .. } | Op::Disconnect | Op::Batch(_) => return None,
    })
}

/// Every thread's name and kernel wait channel, to tell a blocked lock from a blocked socket in a report.
fn thread_states() -> String {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return String::new() };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let p = t.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default().trim().to_string();
        out.push(format!("{}:{}:{}", read("comm"), read("wchan"), read("syscall").split(' ').next().unwrap_or("")));
    }
    out.join(" ")
}

/// Several messages in one sendmsg, all their descriptors on its first bytes. `false`: the peer is gone.
fn send_batch(peer: &Peer, batch: &[(Header, Outgoing)]) -> bool {
    let Some(((first, _), _)) = batch.split_first() else { return true };
    // The first header is sent as the header; the other messages follow it in the same send.
    let mut rest = Vec::new();
    for (i, (h, out)) in batch.iter().enumerate() {
        if i > 0 {
            rest.extend_from_slice(&h.encode());
        }
        rest.extend_from_slice(&out.payload);
    }
    let fds: Vec<BorrowedFd> = batch.iter().flat_map(|(_, out)| out.fds.iter().map(|f| f.as_fd())).collect();
    vfio_user_proto::sock::send_message(&peer.stream, first, &[&rest], &fds).is_ok()
}

/// The oracle for one request: answered, or the connection closed, within the deadline. `false`: closed.
fn await_answer(peer: &Peer, h: &Header) -> bool {
    await_answer_with(peer, h, answer_dma)
}

fn await_answer_with(peer: &Peer, h: &Header, on_request: impl FnMut(&Peer, Message)) -> bool {
    let sent_at = std::time::Instant::now();
    match peer.await_reply(h.msg_id, REPLY_DEADLINE, on_request) {
        Some(Answer::Reply(m)) => {
            assert_eq!(m.header.command, h.command, "reply to {} names another command", h.msg_id);
            true
        }
        Some(Answer::Closed) => false,
        None => panic!(
            "request {} (command {}) unanswered after {:?} (deadline {REPLY_DEADLINE:?}); threads: {}",
            h.msg_id,
            h.command,
            sent_at.elapsed(),
            thread_states()
        ),
    }
}

fn run(input: Input) {
    let Some(servers) = servers() else { return };
    session(&servers[input.irdma as usize], |peer| drive_ops(peer, input));
}

fn run_seed(seed: Seed) {
    let Some(servers) = servers() else { return };
    let index = match seed.device {
        SeedDevice::Hfi1 => 0,
        SeedDevice::Irdma => 1,
        SeedDevice::Hfi1Wfr => 2,
    };
    session(&servers[index], |peer| drive_seed(peer, seed.items));
}

/// A seed's messages in order (at most `MAX_OPS`), each awaited unless it wants no reply; the server's
/// DMA_READs take the seed's DMA data in order.
fn drive_seed(peer: &Peer, items: Vec<SeedItem>) {
    let mut data: VecDeque<Vec<u8>> = items
        .iter()
        .filter_map(|i| match i {
            SeedItem::DmaData(d) => Some(d.clone()),
            SeedItem::Message { .. } => None,
        })
        .collect();
    let messages = items.into_iter().filter_map(|i| match i {
        SeedItem::Message { command, flags, fds, payload } => Some((command, flags, fds, payload)),
        SeedItem::DmaData(_) => None,
    });
    for (id, (command, flags, fds, payload)) in (1u16..).zip(messages.take(MAX_OPS)) {
        let fds: Vec<OwnedFd> = match fds {
            SeedFds::None => Vec::new(),
            SeedFds::Memfd(pages) => memfd(pages, false).into_iter().collect(),
            SeedFds::Eventfds(n) => {
                (0..n).filter_map(|_| rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).ok()).collect()
            }
        };
        let mut h = Header::command(id, command, payload.len());
        h.flags |= flags & (hdr_flags::KNOWN | 0x40);
        let borrowed: Vec<BorrowedFd> = fds.iter().map(|f| f.as_fd()).collect();
        if !peer.send(&h, &payload, &borrowed) {
            return;
        }
        if h.no_reply() || h.is_reply() {
            continue;
        }
        if !await_answer_with(peer, &h, |p, m| answer_dma_from(p, m, &mut data)) {
            return;
        }
    }
}

/// One client connection: `drive` talks to the server over `peer`, then the client leaves and the
/// disconnect oracles run.
fn session(served: &'static Served, drive: impl FnOnce(&Peer)) {
    let Some(serving_thread) = reused_thread::other_end() else { return };
    let fds_before = open_fds();
    let Ok((client, server_end)) = UnixStream::pair() else { return };
    let server: &'static Server = &served.server;
    let serving = serving_thread.run(move || server.serve_connection(server_end));
    let peer = Peer::new(client, MAX_XFER + 8192).spinning(SPIN);
    drive(&peer);
    // Disconnect, keep answering DMA until the server notices, then require it to be done.
    let _ = peer.stream.shutdown(std::net::Shutdown::Write);
    let deadline = std::time::Instant::now() + CLOSE_DEADLINE;
    // `Err(true)`: still serving.
    while matches!(serving.wait_for(Duration::ZERO), Err(true)) {
        assert!(
            std::time::Instant::now() < deadline,
            "serve_connection still running {CLOSE_DEADLINE:?} after disconnect"
        );
        // A short wait: the server usually returns within microseconds of the close, and each round of
        // this loop that waits for nothing is idle time of every input (it was 5 ms).
        if let Ok(Some(m)) = peer.recv(Duration::from_micros(200)) {
            if m.header.is_command() {
                answer_dma(&peer, m);
            }
        }
    }
    drop(peer);
    let leaked = leaked_since(&fds_before, Duration::from_secs(2));
    assert!(leaked.is_empty(), "descriptors left open after the connection: {leaked:?}");
}

fn drive_ops(peer: &Peer, input: Input) {
    let mut ops = input.ops;
    if input.negotiate {
        ops.insert(0, Op::Version { major: 0, minor: 1, caps: Caps::None, nul: true });
    }
    let mut next_id: u16 = 1;
    let mut ops = ops.into_iter().take(MAX_OPS);
    while let Some(op) = ops.next() {
        let id = next_id;
        next_id = next_id.wrapping_add(1);
        match op {
            Op::Disconnect => break,
            Op::Batch(n) => {
                let batch: Vec<(Header, Outgoing)> = ops
                    .by_ref()
                    .take(usize::from(n % 4) + 2)
                    .filter_map(build)
                    .map(|out| {
                        let mut h = Header::command(next_id, out.command, out.payload.len());
                        h.flags |= out.flags & (hdr_flags::KNOWN | 0x40);
                        next_id = next_id.wrapping_add(1);
                        (h, out)
                    })
                    .collect();
                if !send_batch(peer, &batch) {
                    break;
                }
                let mut closed = false;
                for (h, _) in batch.iter().filter(|(h, _)| !h.no_reply() && !h.is_reply()) {
                    if !await_answer(peer, h) {
                        closed = true;
                        break;
                    }
                }
                if closed {
                    break;
                }
            }
            Op::StrayReply { command, id, payload } => {
                let command = command % 20;
                let dma = command == cmd::DMA_READ || command == cmd::DMA_WRITE;
                let h = Header {
                    msg_id: if dma { id } else { id | STRAY_ID_BIT },
                    command,
                    msg_size: 16 + payload.len() as u32,
                    flags: hdr_flags::TYPE_REPLY,
                    error: 0,
                };
                if !peer.send(&h, &payload, &[]) {
                    break;
                }
                continue;
            }
            Op::Truncated { command, claimed, sent } => {
                let h = Header { msg_id: id, command: command % 20, msg_size: claimed, flags: 0, error: 0 };
                let _ = peer.send(&h, &sent, &[]);
                break;
            }
            op => {
                let Some(out) = build(op) else { continue };
                let mut h = Header::command(id, out.command, out.payload.len());
                h.flags |= out.flags & (hdr_flags::KNOWN | 0x40);
                let fds: Vec<BorrowedFd> = out.fds.iter().map(|f| f.as_fd()).collect();
                if !peer.send(&h, &out.payload, &fds) {
                    break;
                }
                drop(fds);
                drop(out.fds);
                if h.no_reply() || h.is_reply() {
                    continue;
                }
                if !await_answer(peer, &h) {
                    break;
                }
            }
        }
    }
}

// A seed from a recording, or (anything else) the ops an `Arbitrary` input decodes to, as before.
fuzz_target!(|data: &[u8]| match Seed::decode(data) {
    Some(seed) => run_seed(seed),
    None => {
        if let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) {
            run(input)
        }
    }
});
