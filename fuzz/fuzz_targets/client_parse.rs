//! The vfio-user client, from a hostile server's side.
//!
//! A fake server on one end of a socketpair answers a real `Client` with what the fuzzer chose: the
//! VERSION reply (capabilities JSON or garbage), then, per client request, a well-formed reply, a reply
//! with a fuzzed payload (region info with sparse-mmap capabilities and fds, short or long payloads), an
//! error, a reply with the wrong id or command, raw bytes, silence, or a close. Between replies it sends
//! its own DMA_READ/DMA_WRITE requests against the client's registered memory. The client side makes a
//! fuzzer-chosen sequence of calls. Oracles: no panic; every call returns within its timeout; the
//! client's reader thread ends and no descriptor stays open after the client is dropped.
#![no_main]

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use vfio_user_proto::sync::Unpoison;

use rdma_emu_fuzz::fds::{leaked_since, open_fds};
use rdma_emu_fuzz::reused_thread;
use rdma_emu_fuzz::wire_client::Peer;
use vfio_user_proto::device::Errno;
use vfio_user_proto::wire::{command as cmd, hdr_flags, put_u16, put_u32, put_u64, Header};
use vfio_user_proto::{Client, ClientConfig, ClientDmaBacking, DmaProt};

/// The client's per-request timeout: short, so silence costs little. The scripted server answers at once
/// or never, so a longer wait only adds idle time to every input with a silent step (it was 30 ms, then
/// 4 ms: a fifth of the wall time, docs/fuzzing.md). A reply that still comes late is a late reply, which
/// the client must drop anyway.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(1);
/// The client busy-polls for its replies, as the scripted server for its requests: on a VM, waking the other
/// side's vCPU was most of an input's time (docs/fuzzing.md). Both busy-poll paths are then fuzzed too.
const CLIENT_POLL: Duration = Duration::from_micros(100);
/// How long the scripted server polls for the client's next request before it sleeps.
const SERVER_POLL: Duration = Duration::from_micros(100);
/// A call that takes longer than this (several timeouts) is a hang.
const CALL_DEADLINE: Duration = Duration::from_secs(2);
const MAX_STEPS: usize = 32;
const MAX_XFER: u32 = 1 << 16;

#[derive(Arbitrary, Debug)]
enum VersionReply {
    Good { minor: u16, max_fds: u64, xfer: u64, maps: u64, multi: bool, extra: Option<String> },
    Payload { major: u16, minor: u16, text: Vec<u8> },
    Raw { id: u16, command: u16, flags: u8, error: u32, payload: Vec<u8> },
    Close,
}

#[derive(Arbitrary, Debug)]
struct Area {
    offset: u64,
    size: u64,
}

#[derive(Arbitrary, Debug)]
enum Answer {
    /// A reply shaped for the request, with these fuzzed values.
    Shaped {
        values: [u64; 4],
        areas: Vec<Area>,
        cap_offset: Option<u16>,
        cap_id: u16,
        fd: bool,
        trim: u8,
    },
    Payload {
        payload: Vec<u8>,
        memfds: u8,
    },
    Error {
        errno: u32,
    },
    WrongId {
        payload: Vec<u8>,
    },
    WrongCommand {
        command: u16,
    },
    Raw(Vec<u8>),
    Silence,
    Close,
}

#[derive(Arbitrary, Debug)]
enum Step {
    Answer(Answer),
    DmaRead { address: u64, count: u32, no_reply: bool },
    DmaWrite { address: u64, data: Vec<u8>, claimed: Option<u32> },
}

#[derive(Arbitrary, Debug)]
enum Call {
    DeviceInfo,
    RegionInfo(u8),
    IrqInfo(u8),
    RegionRead { index: u8, offset: u32, len: u16 },
    RegionWrite { index: u8, offset: u32, data: Vec<u8> },
    WriteMulti(Vec<(u8, u32, u8)>),
    MapBacked { iova_page: u16, pages: u8, write: bool },
    MapFd { iova_page: u16, pages: u8 },
    Unmap { iova_page: u16, pages: u8 },
    SetIrqs { index: u8, flags: u8, start: u8, eventfds: u8 },
    SetIrqsCount { index: u8, flags: u8, start: u8, count: u32 },
    Reset,
}

#[derive(Arbitrary, Debug)]
struct Input {
    version: VersionReply,
    steps: Vec<Step>,
    calls: Vec<Call>,
}

/// Client memory behind DMA_READ/DMA_WRITE.
struct Backing(Mutex<Vec<u8>>);

impl ClientDmaBacking for Backing {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let m = self.0.lock().unpoison();
        let start = usize::try_from(offset).map_err(|_| libc::EFAULT)?;
        let src = start.checked_add(buf.len()).and_then(|end| m.get(start..end)).ok_or(libc::EFAULT)?;
        buf.copy_from_slice(src);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let mut m = self.0.lock().unpoison();
        let start = usize::try_from(offset).map_err(|_| libc::EFAULT)?;
        let dst = start.checked_add(data.len()).and_then(|end| m.get_mut(start..end)).ok_or(libc::EFAULT)?;
        dst.copy_from_slice(data);
        Ok(())
    }
}

fn memfd(pages: u8) -> Option<OwnedFd> {
    use rustix::fs::{memfd_create, MemfdFlags};
    let fd = memfd_create("fuzz-srv", MemfdFlags::CLOEXEC).ok()?;
    rustix::fs::ftruncate(&fd, u64::from(pages % 8) * 4096).ok()?;
    Some(fd)
}

/// The payload a well-behaved server would send for `command`, filled with fuzzed values.
fn shaped(
    command: u16,
    request: &[u8],
    values: [u64; 4],
    areas: &[Area],
    cap_offset: Option<u16>,
    cap_id: u16,
) -> Vec<u8> {
    let mut p = Vec::new();
    let v32 = |i: usize| values[i] as u32;
    match command {
        cmd::DEVICE_GET_INFO => {
            put_u32(&mut p, 16);
            put_u32(&mut p, v32(0));
            put_u32(&mut p, v32(1));
            put_u32(&mut p, v32(2));
        }
        cmd::DEVICE_GET_REGION_INFO => {
            let caps_at = cap_offset.map_or(0, u32::from);
            put_u32(&mut p, 32 + 16 + 16 * areas.len() as u32);
            put_u32(&mut p, v32(0));
            put_u32(&mut p, request.get(8..12).map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4]))));
            put_u32(&mut p, caps_at);
            put_u64(&mut p, values[1]);
            put_u64(&mut p, values[2]);
            if cap_offset.is_some() {
                p.resize((caps_at as usize).clamp(32, 4096), 0);
                put_u16(&mut p, cap_id);
                put_u16(&mut p, 1);
                put_u32(&mut p, v32(3));
                put_u32(&mut p, areas.len() as u32);
                put_u32(&mut p, 0);
                for a in areas.iter().take(64) {
                    put_u64(&mut p, a.offset);
                    put_u64(&mut p, a.size);
                }
            }
        }
        cmd::DEVICE_GET_IRQ_INFO => {
            put_u32(&mut p, 16);
            put_u32(&mut p, v32(0));
            put_u32(&mut p, request.get(8..12).map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4]))));
            put_u32(&mut p, v32(1));
        }
        cmd::REGION_READ => {
            // Echo the request header with a fuzzed count, then that many bytes (bounded).
            p.extend_from_slice(request.get(..12).unwrap_or_default());
            let count = v32(0) % (MAX_XFER + 16);
            put_u32(&mut p, count);
            p.resize(p.len() + (values[1] as usize % (count as usize + 2)), 0xA5);
        }
        cmd::REGION_WRITE => {
            p.extend_from_slice(request.get(..12).unwrap_or_default());
            put_u32(&mut p, v32(0));
        }
        cmd::REGION_WRITE_MULTI => put_u64(&mut p, values[0]),
        _ => {}
    }
    p
}

fn server_loop(peer: Peer, version: VersionReply, steps: Vec<Step>) {
    // VERSION first.
    let Ok(Some(v)) = peer.recv(CALL_DEADLINE) else { return };
    match version {
        VersionReply::Close => return,
        VersionReply::Good { minor, max_fds, xfer, maps, multi, extra } => {
            let mut caps = serde_json::json!({"capabilities": {
                "max_msg_fds": max_fds, "max_data_xfer_size": xfer, "max_dma_maps": maps,
                "write_multiple": multi, "pgsizes": 4096,
            }});
            if let Some(e) = extra {
                caps["capabilities"]["extra"] = serde_json::Value::String(e);
            }
            let mut p = Vec::new();
            put_u16(&mut p, 0);
            put_u16(&mut p, minor % 3);
            p.extend_from_slice(caps.to_string().as_bytes());
            p.push(0);
            peer.send(&Header::reply(&v.header, p.len()), &p, &[]);
        }
        VersionReply::Payload { major, minor, text } => {
            let mut p = Vec::new();
            put_u16(&mut p, major % 2);
            put_u16(&mut p, minor % 3);
            p.extend_from_slice(&text);
            peer.send(&Header::reply(&v.header, p.len()), &p, &[]);
        }
        VersionReply::Raw { id, command, flags, error, payload } => {
            let h = Header {
                msg_id: id % 2,
                command: command % 3,
                msg_size: 16 + payload.len() as u32,
                flags: u32::from(flags),
                error,
            };
            peer.send(&h, &payload, &[]);
        }
    }
    let mut dma_id: u16 = 0x8000;
    for step in steps.into_iter().take(MAX_STEPS) {
        match step {
            Step::DmaRead { address, count, no_reply } => {
                dma_id = dma_id.wrapping_add(1);
                let mut p = Vec::new();
                put_u64(&mut p, address % (1 << 20));
                put_u64(&mut p, u64::from(count % (2 * MAX_XFER)));
                let mut h = Header::command(dma_id, cmd::DMA_READ, p.len());
                if no_reply {
                    h.flags |= hdr_flags::NO_REPLY;
                }
                if !peer.send(&h, &p, &[]) {
                    return;
                }
            }
            Step::DmaWrite { address, data, claimed } => {
                dma_id = dma_id.wrapping_add(1);
                let mut p = Vec::new();
                put_u64(&mut p, address % (1 << 20));
                put_u64(&mut p, claimed.map_or(data.len() as u64, u64::from));
                p.extend_from_slice(&data);
                if !peer.send(&Header::command(dma_id, cmd::DMA_WRITE, p.len()), &p, &[]) {
                    return;
                }
            }
            Step::Answer(answer) => {
                // The next request of the client (its replies to our DMA requests are skipped).
                let req = loop {
                    match peer.recv(CALL_DEADLINE) {
                        Ok(Some(m)) if m.header.is_command() => break m,
                        Ok(Some(_)) => continue,
                        _ => return,
                    }
                };
                let h = req.header;
                let sent = match answer {
                    Answer::Shaped { values, areas, cap_offset, cap_id, fd, trim } => {
                        let mut p = shaped(h.command, &req.payload, values, &areas, cap_offset, cap_id);
                        p.truncate(p.len().saturating_sub(usize::from(trim % 8)));
                        let f = if fd { memfd(1) } else { None };
                        let fds: Vec<BorrowedFd> = f.iter().map(|f| f.as_fd()).collect();
                        peer.send(&Header::reply(&h, p.len()), &p, &fds)
                    }
                    Answer::Payload { payload, memfds } => {
                        let owned: Vec<OwnedFd> = (0..memfds % 4).filter_map(|_| memfd(1)).collect();
                        let fds: Vec<BorrowedFd> = owned.iter().map(|f| f.as_fd()).collect();
                        peer.send(&Header::reply(&h, payload.len()), &payload, &fds)
                    }
                    Answer::Error { errno } => {
                        let mut e = Header::error_reply(&h, 1);
                        e.error = errno;
                        peer.send(&e, &[], &[])
                    }
                    Answer::WrongId { payload } => {
                        let mut r = Header::reply(&h, payload.len());
                        r.msg_id = r.msg_id.wrapping_add(1);
                        peer.send(&r, &payload, &[])
                    }
                    Answer::WrongCommand { command } => {
                        let mut r = Header::reply(&h, 0);
                        r.command = command % 20;
                        peer.send(&r, &[], &[])
                    }
                    Answer::Raw(bytes) => {
                        use std::io::Write;
                        (&peer.stream).write_all(&bytes).is_ok()
                    }
                    Answer::Silence => true,
                    Answer::Close => false,
                };
                if !sent {
                    return;
                }
            }
        }
    }
}

fn call(client: &Client, c: &Call, backing: &Arc<Backing>) {
    let page = 4096u64;
    let _ = match *c {
        Call::DeviceInfo => client.device_info().map(drop),
        Call::RegionInfo(i) => client.region_info(u32::from(i % 10)).map(drop),
        Call::IrqInfo(i) => client.irq_info(u32::from(i % 6)).map(drop),
        Call::RegionRead { index, offset, len } => {
            let mut buf = vec![0u8; usize::from(len % 4097)];
            client.region_read(u32::from(index % 10), u64::from(offset), &mut buf)
        }
        Call::RegionWrite { index, offset, ref data } => {
            client.region_write(u32::from(index % 10), u64::from(offset), data)
        }
        Call::WriteMulti(ref entries) => {
            let data = [0x5Au8; 8];
            let w: Vec<(u32, u64, &[u8])> = entries
                .iter()
                .map(|(r, o, n)| (u32::from(r % 10), u64::from(*o), &data[..usize::from(n % 9)]))
                .collect();
            client.region_write_multi(&w)
        }
        Call::MapBacked { iova_page, pages, write } => {
            let prot = if write { DmaProt::READ_WRITE } else { DmaProt::READ };
            let b: Arc<dyn ClientDmaBacking> = backing.clone();
            client.dma_map_backed(u64::from(iova_page) * page, u64::from(pages % 32) * page, b, prot)
        }
        Call::MapFd { iova_page, pages } => match memfd(pages) {
            Some(fd) => client.dma_map_fd(
                u64::from(iova_page) * page,
                u64::from(pages % 8) * page,
                fd.as_fd(),
                0,
                DmaProt::READ_WRITE,
            ),
            None => Ok(()),
        },
        Call::Unmap { iova_page, pages } => client.dma_unmap(u64::from(iova_page) * page, u64::from(pages % 32) * page),
        Call::SetIrqs { index, flags, start, eventfds } => {
            let owned: Vec<OwnedFd> = (0..eventfds % 5)
                .filter_map(|_| rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).ok())
                .collect();
            let fds: Vec<BorrowedFd> = owned.iter().map(|f| f.as_fd()).collect();
            client.set_irqs(u32::from(index % 6), u32::from(flags & 0x3f), u32::from(start), &fds)
        }
        Call::SetIrqsCount { index, flags, start, count } => {
            client.set_irqs_count(u32::from(index % 6), u32::from(flags & 0x3f), u32::from(start), count)
        }
        Call::Reset => client.reset(),
    };
}

fn run(input: Input) {
    let Some(server_thread) = reused_thread::other_end() else { return };
    let fds_before = open_fds();
    let Ok((client_end, server_end)) = UnixStream::pair() else { return };
    let (version, steps) = (input.version, input.steps);
    let server = server_thread
        .run(move || server_loop(Peer::new(server_end, MAX_XFER + 8192).spinning(SERVER_POLL), version, steps));
    let config = ClientConfig {
        timeout: CLIENT_TIMEOUT,
        max_msg_fds: 8,
        max_data_xfer_size: MAX_XFER,
        busy_poll: CLIENT_POLL,
        exact_reads: false,
    };
    let start = Instant::now();
    let client = Client::from_stream(client_end, config);
    assert!(start.elapsed() < CALL_DEADLINE, "negotiation took {:?}", start.elapsed());
    if let Ok(client) = client {
        let backing = Arc::new(Backing(Mutex::new(vec![0u8; 32 * 4096])));
        for c in input.calls.into_iter().take(MAX_STEPS) {
            let start = Instant::now();
            call(&client, &c, &backing);
            // The call is formatted only when it overran its deadline: a Debug of its data on every step was
            // CPU time.
            assert!(start.elapsed() < CALL_DEADLINE, "{c:?} took {:?}", start.elapsed());
        }
        drop(client);
    }
    let _ = server.wait();
    let leaked = leaked_since(&fds_before, Duration::from_secs(2));
    assert!(leaked.is_empty(), "descriptors left open after the client was dropped: {leaked:?}");
}

fuzz_target!(|input: Input| run(input));
