//! (scale) How the cost grows with the work (issue 17): each curve measured in this run, from small to the
//! limit, so a cost that grows faster than it should shows as a rising line (docs/bench/scale.svg).
//! - the quad-hash table: add, delete and classify as it fills from 1 entry to its capacity;
//! - RcvArray programming and loopback placement over 1 to all receive contexts;
//! - aggregate register throughput of 1 to 8 concurrent vfio-user clients of one function;
//! - the DMA space: memory and lookup cost as DMA maps grow to `max_dma_maps`, and what the next map gets.

#![forbid(unsafe_code)]

use std::hint::black_box;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use device_model::engine::Engine;
use device_model::hfi1::{regs, Hfi1, Hfi1Config, HFI1_BAR};
use device_model::irdma::classify::classify;
use device_model::irdma::qhash::QhashData;
use device_model::irdma::{EntryType, QhashKey, QhashTable, Segment};
use device_model::pci::PciIds;
use udriver::bench::loopback::{Hfi1Driver, Loopback, PACKET};
use udriver::bench::{sample, Case};
use udriver::dma::{IOVA_BASE, PAGE_SIZE};
use udriver::hfi1::regs::PtType;
use udriver::hfi1::tid::{hfi1_put_tid, trdma_pset_order};
use vfio_user_proto::client::{Client, ClientConfig};
use vfio_user_proto::dma::DmaAccess;
use vfio_user_proto::server::ServerConfig;
use vfio_user_proto::wire::dma_map_flags;
use vfio_user_proto::{DmaSpace, MapError};

use crate::served::Served;
use udriver::access::DeviceAccess;
use udriver::backend::vfio_user::VfioUserBackend;

/// The largest quad-hash table the device model's command line allows (`--irdma-qhash-capacity`).
const QHASH_CAPACITY: usize = device_model::cli::MAX_QHASH_CAPACITY as usize;
/// Timed operations per fill level and kind, in batches so the clock read does not dominate.
const QHASH_BATCH: usize = 256;
/// Receive contexts of the scale rig, up to the chip's (RXE_NUM_CONTEXTS, 160), sharing its 4096 RcvArray
/// entries; each context gets one 64 KiB entry (8 packets) of every placement doorbell.
const CONTEXTS: [u32; 8] = [1, 2, 4, 8, 16, 32, 64, 160];
const PLACE_ENTRY: usize = 64 * 1024;
const CLIENTS: [usize; 5] = [1, 2, 3, 4, 8];
/// DMA map counts, up to the server's default limit (65,535, what QEMU proposes and accepts at most).
const MAPS: [u32; 6] = [1, 64, 1024, 8192, 32768, 65535];

fn key(i: u32) -> QhashKey {
    QhashKey {
        entry_type: EntryType::TcpEstablished,
        ipv4: true,
        vlan: None,
        dest_ip: [0x0A00_0001, 0, 0, 0],
        dest_port: 4791,
        src_ip: [0x0A00_0000 | (i >> 16), 0, 0, 0],
        src_port: i as u16,
    }
}

fn segment(i: u32) -> Segment {
    let k = key(i);
    Segment {
        ipv4: true,
        src_ip: k.src_ip,
        dst_ip: k.dest_ip,
        src_port: k.src_port,
        dst_port: k.dest_port,
        vlan: None,
        syn: false,
        ack: true,
    }
}

/// ns per add, per delete and per classify (hit) at `fill` entries: the table holds `fill` entries; a batch
/// adds `QHASH_BATCH` more (or as many as fit), classifies as many existing ones, and deletes what it added.
fn qhash_at(table: &mut QhashTable, fill: usize, budget: Duration) -> Result<[f64; 3], String> {
    let data = QhashData { qpn: 100, mac: 0x0011_2233_4455, qs_handle: 0 };
    while table.len() < fill {
        table.add(key(table.len() as u32), data).map_err(|e| format!("fill: {e:?}"))?;
    }
    let room = (QHASH_CAPACITY - fill).min(QHASH_BATCH);
    let n = if room == 0 { QHASH_BATCH } else { room };
    let (mut add, mut del, mut cls) = (0u128, 0u128, 0u128);
    let mut rounds = 0u32;
    let start = Instant::now();
    while rounds < 3 || start.elapsed() < budget {
        let fresh = (fill as u32)..(fill + room) as u32;
        let t = Instant::now();
        for i in fresh.clone() {
            table.add(key(i), data).map_err(|e| format!("add: {e:?}"))?;
        }
        add += t.elapsed().as_nanos();
        let t = Instant::now();
        for i in 0..n as u32 {
            // Existing entries spread over the table (a hit each).
            black_box(classify(table, &segment((i.wrapping_mul(2_654_435_761)) % fill.max(1) as u32)));
        }
        cls += t.elapsed().as_nanos();
        let t = Instant::now();
        for i in fresh {
            table.delete(&key(i)).map_err(|e| format!("delete: {e:?}"))?;
        }
        del += t.elapsed().as_nanos();
        rounds += 1;
    }
    let per = |ns: u128| ns as f64 / f64::from(rounds) / n as f64;
    // At capacity nothing fits: adds and deletes are not measured there.
    Ok(if room == 0 { [f64::NAN, f64::NAN, per(cls)] } else { [per(add), per(del), per(cls)] })
}

fn qhash_curves(case: &mut Case, budget: Duration) -> Result<(), String> {
    let mut table = QhashTable::new(QHASH_CAPACITY);
    // Powers of two, then as full as a batch allows, then full (classify only).
    let mut fills: Vec<usize> = (0..16).map(|p| 1usize << p).filter(|f| *f < QHASH_CAPACITY - QHASH_BATCH).collect();
    fills.extend([QHASH_CAPACITY - QHASH_BATCH, QHASH_CAPACITY]);
    let mut pts = [Vec::new(), Vec::new(), Vec::new()];
    for &f in &fills {
        let r = qhash_at(&mut table, f, budget / fills.len() as u32)?;
        for (k, v) in r.into_iter().enumerate() {
            if v.is_finite() {
                pts[k].push([f as f64, v]);
            }
        }
    }
    let [add, del, cls] = pts;
    case.curve("qhash add", "entries in the table", "ns/op", add);
    case.curve("qhash delete", "entries in the table", "ns/op", del);
    case.curve("qhash classify (hit)", "entries in the table", "ns/op", cls);
    Ok(())
}

/// Entries/s of mapped RcvArray programming over every expected entry of `contexts` contexts, and the
/// loopback placement GB/s of one doorbell spread over them.
fn contexts_at(contexts: u32, budget: Duration) -> Result<(f64, f64), String> {
    let config = Hfi1Config { rcv_contexts: device_model::hfi1::RXE_NUM_CONTEXTS, ..Default::default() };
    let engine = Arc::new(Hfi1::new(config).map_err(|e| format!("hfi1 engine: {e}"))?);
    let served = Served::new(engine as Arc<dyn Engine>, PciIds::hfi1_default()).map_err(|e| e.to_string())?;
    let dev: Arc<dyn DeviceAccess> =
        Arc::new(VfioUserBackend::connect(served.path(), true).map_err(|e| format!("connect: {e}"))?);
    let drv = Hfi1Driver::probe_contexts(dev, contexts)?;
    let order = trdma_pset_order(1);
    let s = sample(budget / 2, 1, 3, usize::MAX, || {
        for rcd in &drv.rcds {
            for e in 0..rcd.expected_count {
                let pa = IOVA_BASE + u64::from(e) * PAGE_SIZE;
                hfi1_put_tid(&drv.dd, rcd.expected_base + e, PtType::PT_EXPECTED, pa, order)
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok::<(), String>(())
    })?;
    let entries: u32 = drv.rcds.iter().map(|r| r.expected_count).sum();
    let programming = s.per_second() * f64::from(entries);
    let mut lb = Loopback::new(&drv, PLACE_ENTRY, contexts as usize, PACKET)?;
    lb.ring()?;
    lb.verify()?;
    let p = sample(budget / 2, 1, 3, usize::MAX, || lb.ring())?;
    Ok((programming, lb.bytes() as f64 / p.median().max(1.0)))
}

fn context_curves(case: &mut Case, budget: Duration) -> Result<(), String> {
    let (mut prog, mut place) = (Vec::new(), Vec::new());
    for n in CONTEXTS {
        let (p, g) = contexts_at(n, budget / CONTEXTS.len() as u32)?;
        prog.push([f64::from(n), p]);
        place.push([f64::from(n), g]);
    }
    case.curve("RcvArray programming, all entries of the contexts (mapped)", "receive contexts", "entries/s", prog);
    case.curve("loopback placement, 64 KiB per context per doorbell", "receive contexts", "GB/s", place);
    Ok(())
}

/// Aggregate trapped reads/s of `n` clients, each of its own function (a function has one client at a time,
/// as a VFIO device has one owner), so each with its own connection thread in the server process.
fn clients_at(served: &[Served], n: usize, window: Duration) -> Result<f64, String> {
    let clients = served[..n]
        .iter()
        .map(|s| Client::connect(s.path(), ClientConfig::default()).map_err(|e| format!("connect: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    for c in &clients {
        super::socket::enable(c)?;
    }
    let go = Arc::new(Barrier::new(n));
    let stop = Arc::new(AtomicBool::new(false));
    let counts = std::thread::scope(|s| {
        let threads: Vec<_> = clients
            .iter()
            .map(|c| {
                let (go, stop) = (go.clone(), stop.clone());
                s.spawn(move || {
                    go.wait();
                    let start = Instant::now();
                    let mut done = 0u64;
                    let mut b = [0u8; 8];
                    while !stop.load(Ordering::Relaxed) && start.elapsed() < window {
                        c.region_read(HFI1_BAR, regs::RCV_ARRAY_CNT, &mut b).map_err(|e| e.to_string())?;
                        done += 1;
                    }
                    stop.store(true, Ordering::Relaxed);
                    Ok::<(u64, Duration), String>((done, start.elapsed()))
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err("client thread panicked".into())))
            .collect::<Vec<_>>()
    });
    let mut total = 0.0;
    for c in counts {
        let (done, took) = c?;
        total += done as f64 / took.as_secs_f64().max(1e-9);
    }
    Ok(total)
}

fn client_curves(case: &mut Case, budget: Duration) -> Result<(), String> {
    let most = CLIENTS.iter().copied().max().unwrap_or(1);
    let served = (0..most)
        .map(|_| Served::function(super::socket::hfi1_function()?).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, String>>()?;
    let mut pts = Vec::new();
    for n in CLIENTS {
        pts.push([n as f64, clients_at(&served, n, budget / CLIENTS.len() as u32)?]);
    }
    case.curve(
        "aggregate trapped REGION_READ, one function per client",
        "concurrent vfio-user clients",
        "reads/s",
        pts,
    );
    Ok(())
}

/// This process's resident anonymous memory, in bytes (/proc/self/statm: resident minus shared, so the
/// mapped memfd pages the lookups touch do not count).
fn anon() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let f: Vec<u64> = statm.split_whitespace().filter_map(|p| p.parse().ok()).collect();
    match f.as_slice() {
        [_, resident, shared, ..] => resident.saturating_sub(*shared) * PAGE_SIZE,
        _ => 0,
    }
}

fn sealed_memfd(len: u64) -> Result<OwnedFd, String> {
    use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};
    let fd = memfd_create("scale-dma", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).map_err(|e| e.to_string())?;
    ftruncate(&fd, len).map_err(|e| e.to_string())?;
    fcntl_add_seals(&fd, SealFlags::SHRINK).map_err(|e| e.to_string())?;
    Ok(fd)
}

/// Bytes per map and ns per 8-byte DMA read at each map count, one 4 KiB map per page of one sealed memfd
/// (as QEMU maps guest RAM page by page under the vIOMMU); then the map past the limit.
fn dma_curves(case: &mut Case, budget: Duration) -> Result<(), String> {
    let limit = ServerConfig::default().max_dma_maps;
    let pages = u64::from(limit) + 1;
    let fd = sealed_memfd(pages * PAGE_SIZE)?;
    let space = DmaSpace::new(limit, None);
    let (mut mem, mut lookup, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    // The floor: the same 8-byte reads at the same pages of a plain buffer (cache and TLB misses, no lookup).
    let plain = vec![1u8; (pages * PAGE_SIZE) as usize];
    let before = anon();
    let mut mapped = 0u32;
    for &target in &MAPS {
        while mapped < target {
            let f = fd.try_clone().map_err(|e| e.to_string())?;
            let (iova, off) = (IOVA_BASE + u64::from(mapped) * PAGE_SIZE, u64::from(mapped) * PAGE_SIZE);
            space
                .map(iova, PAGE_SIZE, off, dma_map_flags::READ | dma_map_flags::WRITE, Some(f))
                .map_err(|e| format!("map {mapped}: {e}"))?;
            mapped += 1;
        }
        mem.push([f64::from(target), anon().saturating_sub(before) as f64 / f64::from(target)]);
        // Every page faulted in before timing: the curve is the lookup, not the first touch of a page.
        for page in 0..u64::from(target) {
            space.write(IOVA_BASE + page * PAGE_SIZE, &[1]).map_err(|e| format!("touch page {page}: {e}"))?;
        }
        let mut b = [0u8; 8];
        let mut i = 0u64;
        let s = sample(budget / MAPS.len() as u32, 100, 1000, usize::MAX, || {
            // Pages spread over every map (a multiplicative walk), so the lookups do not hit one cache line.
            i = (i + 40_503) % u64::from(target);
            space.read(IOVA_BASE + i * PAGE_SIZE + 8, &mut b).map_err(|e| e.to_string())
        })?;
        lookup.push([f64::from(target), s.median()]);
        let mut i = 0u64;
        let f = sample(budget / MAPS.len() as u32 / 4, 100, 1000, usize::MAX, || {
            i = (i + 40_503) % u64::from(target);
            let at = (i * PAGE_SIZE + 8) as usize;
            b.copy_from_slice(black_box(&plain[at..at + 8]));
            Ok::<(), String>(())
        })?;
        floor.push([f64::from(target), f.median()]);
    }
    if space.mmap_count() != 1 {
        return Err(format!("{} mmaps for one file", space.mmap_count()));
    }
    // The map past the limit: refused with its own error; every earlier map still serves.
    let f = fd.try_clone().map_err(|e| e.to_string())?;
    let past = space.map(
        IOVA_BASE + u64::from(limit) * PAGE_SIZE,
        PAGE_SIZE,
        u64::from(limit) * PAGE_SIZE,
        dma_map_flags::READ,
        Some(f),
    );
    match past {
        Err(MapError::TooMany(n)) => case.note(format!(
            "map {} of a 4 KiB page: refused (MapError::TooMany({n}), ENOSPC to a vfio-user client); the {limit} \
             maps before it still serve reads",
            limit + 1
        )),
        other => return Err(format!("the map past the limit gave {other:?}")),
    }
    let mut b = [0u8; 8];
    for page in [0, u64::from(limit) - 1] {
        space.read(IOVA_BASE + page * PAGE_SIZE, &mut b).map_err(|e| format!("page {page} after the refusal: {e}"))?;
    }
    case.curve("DMA space memory", "4 KiB DMA maps", "bytes/map", mem);
    case.curve("DMA read lookup (8 B)", "4 KiB DMA maps", "ns/read", lookup);
    case.curve("floor: the same reads from a plain buffer", "4 KiB DMA maps", "ns/read", floor);
    Ok(())
}

pub fn scale(budget: Duration) -> Case {
    Case::new("scale", "how the cost grows: qhash fill, receive contexts, concurrent clients, DMA maps").run(|case| {
        qhash_curves(case, budget)?;
        context_curves(case, budget)?;
        client_curves(case, budget)?;
        dma_curves(case, budget)?;
        // Per curve: how much the cost per operation (or the rate) changed from the smallest work to the largest.
        let growth: Vec<(String, f64, f64)> =
            case.curves.iter().filter_map(|c| c.growth().map(|(x, y)| (c.name.clone(), x, y))).collect();
        for (name, x, y) in growth {
            case.metric(&format!("{name}: last / first point (work grew {x:.0}x)"), y, "x");
        }
        case.note(
            "each curve from the smallest to the largest work, in this run; docs/bench/scale.svg plots them on \
             log-log axes (a flat line: constant cost per operation)",
        );
        Ok(())
    })
}
