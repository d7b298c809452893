//! The host checker/injector against a real device-model hfi1 engine in this process, over the real control
//! socket, with the real guest session on the channel. Only the guest's kernel is a mock: it programs the
//! RcvArray as TID_UPDATE does (find_phys_blocks, the group lists, program_rcvarray, hfi1_put_tid values
//! stored through the RcvArray mapping) and reports per-page DMA maps with guest-physical offsets, as QEMU's
//! vIOMMU does. Faults make it program a RcvArray that disagrees with its tidlist, which the host must catch.
//!
//! The mock leaves out rcv_array_wc_fill (0 stored over a group's other entries): over the shared mapping
//! a 0 replaces a value the device has not taken yet (docs/hfi1-device.md, "Limit of the rule").

use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use device_model::control::{serve_control, ControlTarget};
use device_model::engine::{Engine, NoInterrupt};
use device_model::hfi1::regs::{kctxt_csr, tid_flow_csr, RCV_ARRAY, RCV_CTXT_CTRL, RCV_TID_CTRL};
use device_model::hfi1::{Hfi1, Hfi1Config, HFI1_BAR};
use serde_json::{json, Value};
use vfio_user_proto::dma::{DmaAccess, HeapMemory};

use hfi1_kernel_check::abi::{
    create_tid, flow_expected_readback, flow_program_value, put_tid_value, tid_order, Hfi1BaseInfo, Hfi1CtxtInfo,
    MmapToken, MmapType, TidInfo, HFI1_CAP_HDRSUPP, HFI1_USER_SWVERSION, RCV_CTXT_CTRL_ENABLE_SMASK,
    RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK,
};
use hfi1_kernel_check::channel::LineChannel;
use hfi1_kernel_check::guest::session::{run, GuestOptions, GuestResult};
use hfi1_kernel_check::guest::{ContextFacts, GuestError, GuestMemory, TidUpdate, UserContext};
use hfi1_kernel_check::host::session::{serve, HostReport};
use hfi1_kernel_check::host::HostConfig;
use hfi1_kernel_check::proto::{BufferKind, GuestMsg, Hello, HostMsg, PROTO_VERSION};
use hfi1_kernel_check::sys::{interleaved, SysError};

const PAGE: u64 = 4096;
/// The context the mock kernel hands out, and its RcvArray layout (eager entries, then expected ones).
const CTXT: u32 = 2;
const EAGER_BASE: u64 = 496;
const EAGER: u32 = 16;
const EXPECTED_BASE: u64 = 512;
const EXPECTED: u32 = 256;

fn w(dev: &Hfi1, offset: u64, value: u64) {
    dev.mmio_write(HFI1_BAR, offset, &value.to_le_bytes());
}

fn r(dev: &Hfi1, offset: u64) -> u64 {
    let mut b = [0u8; 8];
    dev.mmio_read(HFI1_BAR, offset, &mut b);
    u64::from_le_bytes(b)
}

/// How the mock kernel misprograms the RcvArray after its first TID_UPDATE.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    None,
    /// The first TID it returns names an entry it invalidated.
    DropEntry,
    /// One more entry of the context is valid than any tidlist names.
    ExtraEntry,
}

/// Pages as the mock's DMA maps them: IOVA = guest-physical address (the vIOMMU maps 1:1 here).
type Maps = Arc<Mutex<Vec<u64>>>;

struct MockMem {
    vaddr: u64,
    /// Guest-physical (= IOVA) address of each page.
    pages: Vec<u64>,
    mem: Arc<HeapMemory>,
}

impl MockMem {
    fn pieces(&self, offset: usize, len: usize) -> hfi1_kernel_check::guest::Result<Vec<(u64, usize, usize)>> {
        if offset + len > self.pages.len() * PAGE as usize {
            return Err(GuestError::Setup(format!("mock access [{offset:#x}, +{len:#x}) out of range")));
        }
        let mut out = Vec::new();
        let (mut at, mut done) = (offset, 0);
        while done < len {
            let in_page = at % PAGE as usize;
            let n = (PAGE as usize - in_page).min(len - done);
            out.push((self.pages[at / PAGE as usize] + in_page as u64, done, n));
            at += n;
            done += n;
        }
        Ok(out)
    }
}

impl GuestMemory for MockMem {
    fn vaddr(&self) -> u64 {
        self.vaddr
    }
    fn size(&self) -> usize {
        self.pages.len() * PAGE as usize
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> hfi1_kernel_check::guest::Result<()> {
        for (pa, at, n) in self.pieces(offset, out.len())? {
            self.mem.read(pa, &mut out[at..at + n]).map_err(|e| GuestError::Setup(e.to_string()))?;
        }
        Ok(())
    }
    fn write(&self, offset: usize, data: &[u8]) -> hfi1_kernel_check::guest::Result<()> {
        for (pa, at, n) in self.pieces(offset, data.len())? {
            self.mem.write(pa, &data[at..at + n]).map_err(|e| GuestError::Setup(e.to_string()))?;
        }
        Ok(())
    }
}

/// One RcvArray group of the context's expected range (exp_rcv.h struct tid_group).
#[derive(Clone, Copy, Default)]
struct Group {
    /// Relative index of its first entry.
    base: usize,
    /// Bit i: entry base + i is programmed.
    map: u8,
}

const GROUP: usize = 8;

struct MockKernel {
    dev: Arc<Hfi1>,
    /// The RcvArray as the kernel writes it: the write-combining mapping of BAR0 (the shared file here).
    rcvarray: std::fs::File,
    rcvarray_offset: u64,
    mem: Arc<HeapMemory>,
    maps: Maps,
    /// Per relative expected entry: (first page, pages) while programmed.
    entries: Vec<Option<(u64, u32)>>,
    /// Group indices in the kernel's tid_group_list (empty), tid_used_list (partly used) order.
    groups: Vec<Group>,
    free_groups: Vec<usize>,
    used_groups: Vec<usize>,
    /// rcv_array_wc_fill: writes of 0 over the other entries of a group being programmed.
    wc_fill: bool,
    next_pa: u64,
    next_vaddr: u64,
    fault: Fault,
    faulted: bool,
}

impl MockKernel {
    fn new(dev: Arc<Hfi1>, mem: Arc<HeapMemory>, maps: Maps, fault: Fault) -> Self {
        let bars = dev.bars();
        let area = bars[0].mmap.as_ref().expect("the RcvArray is a mappable area");
        let rcvarray = std::fs::File::from(area.fd.fd.try_clone().unwrap());
        let ngroups = EXPECTED as usize / GROUP;
        Self {
            rcvarray,
            rcvarray_offset: area.fd.fd_offset,
            dev,
            mem,
            maps,
            entries: vec![None; EXPECTED as usize],
            groups: (0..ngroups).map(|g| Group { base: g * GROUP, map: 0 }).collect(),
            free_groups: (0..ngroups).collect(),
            used_groups: Vec::new(),
            wc_fill: false,
            next_pa: 0x1000_0000,
            next_vaddr: 0x7f00_0000_0000,
            fault,
            faulted: false,
        }
    }

    /// writeq(value, dd->rcvarray_wc + index * 8).
    fn store(&self, rel: usize, value: u64) {
        let at = self.rcvarray_offset + RCV_ARRAY + 8 * (EXPECTED_BASE + rel as u64);
        self.rcvarray.write_all_at(&value.to_le_bytes(), at).unwrap();
    }

    fn fill(&self, rel: usize) {
        if self.wc_fill {
            self.store(rel, 0);
        }
    }

    /// program_rcvarray (user_exp_rcv.c): up to `count` page sets into group `g`, in the kernel's order.
    fn program_group(&mut self, g: usize, sets: &[(u64, u32)], tidlist: &mut Vec<u32>) -> usize {
        let grp = self.groups[g];
        let mut useidx = (0..GROUP).find(|i| grp.map & (1 << i) == 0).unwrap_or(GROUP);
        for i in 0..useidx {
            self.fill(grp.base + i);
        }
        let mut done = 0;
        while done < sets.len() && useidx < GROUP {
            if self.groups[g].map & (1 << useidx) != 0 {
                self.fill(grp.base + useidx);
                useidx += 1;
                continue;
            }
            let (pa, n) = sets[done];
            let rel = grp.base + useidx;
            self.store(rel, put_tid_value(pa, tid_order(n)));
            self.entries[rel] = Some((pa, n));
            self.maps.lock().unwrap().extend((0..u64::from(n)).map(|j| pa + j * PAGE));
            tidlist.push(create_tid(rel as u32, n));
            self.groups[g].map |= 1 << useidx;
            useidx += 1;
            done += 1;
        }
        for i in useidx..GROUP {
            self.fill(grp.base + i);
        }
        done
    }
}

impl UserContext for MockKernel {
    type Mem = MockMem;

    fn facts(&self) -> ContextFacts {
        ContextFacts {
            info: Hfi1CtxtInfo {
                runtime_flags: HFI1_CAP_HDRSUPP,
                ctxt: CTXT as u16,
                rcvtids: (EAGER + EXPECTED) as u16,
                egrtids: EAGER as u16,
                ..Default::default()
            },
            base: Hfi1BaseInfo {
                sw_version: HFI1_USER_SWVERSION,
                user_regbase: MmapToken::encode(MmapType::Uregs, CTXT as u16, 0, 0),
                ..Default::default()
            },
        }
    }

    fn write_flow(&mut self, flow: u32, value: u64) -> hfi1_kernel_check::guest::Result<u64> {
        let at = tid_flow_csr(u64::from(CTXT), u64::from(flow));
        w(&self.dev, at, value);
        Ok(r(&self.dev, at))
    }

    fn map(&mut self, kind: BufferKind, pages: usize) -> hfi1_kernel_check::guest::Result<MockMem> {
        let mut pas = Vec::with_capacity(pages);
        match kind {
            BufferKind::Scattered => {
                // Buffer pages two apart, in interleaved order: no two neighbours are physically adjacent.
                let n = pages - 1;
                let block = self.next_pa;
                for i in interleaved(n) {
                    pas.push(block + 2 * PAGE * i as u64);
                }
                pas.push(block + 2 * PAGE * n as u64);
                for &pa in &pas {
                    assert!(self.mem.map(pa, PAGE as usize));
                }
                self.next_pa = block + 2 * PAGE * (n as u64 + 2);
            }
            _ => {
                let base = self.next_pa;
                assert!(self.mem.map(base, pages * PAGE as usize));
                pas.extend((0..pages as u64).map(|p| base + p * PAGE));
                self.next_pa = base + (pages as u64 + 1) * PAGE;
            }
        }
        let vaddr = self.next_vaddr;
        self.next_vaddr += (pages as u64 + 1) * PAGE;
        Ok(MockMem { vaddr, pages: pas, mem: self.mem.clone() })
    }

    fn tid_update(&mut self, mem: &MockMem, offset: usize, len: usize) -> hfi1_kernel_check::guest::Result<TidUpdate> {
        let npages = len.div_ceil(PAGE as usize);
        if npages > EXPECTED as usize {
            // pin_rcv_pages: "Expected buffer too big".
            return Err(
                SysError::Ioctl { name: "HFI1_IOCTL_TID_UPDATE", errno: "EINVAL".into(), raw: libc::EINVAL }.into()
            );
        }
        let pages = &mem.pages[offset / PAGE as usize..][..npages];
        // find_phys_blocks: runs of adjacent pages, cut into powers of two of at most 512 pages.
        let mut sets = Vec::new();
        let mut i = 0;
        while i < npages {
            let mut run = 1;
            while i + run < npages && pages[i + run] == pages[i] + run as u64 * PAGE {
                run += 1;
            }
            while run > 0 {
                let take = if run > 512 { 512 } else { 1 << run.ilog2() };
                sets.push((i, take as u32));
                i += take;
                run -= take;
            }
        }
        let sets: Vec<(u64, u32)> = sets.into_iter().map(|(idx, n)| (pages[idx], n)).collect();
        // hfi1_user_exp_rcv_setup: whole groups for each 8 page sets, then partly used groups, then new ones.
        let mut tidlist = Vec::new();
        let mut at = 0;
        while sets.len() - at >= GROUP && !self.free_groups.is_empty() {
            let g = self.free_groups.remove(0);
            at += self.program_group(g, &sets[at..at + GROUP], &mut tidlist);
        }
        while at < sets.len() {
            if self.used_groups.is_empty() {
                if self.free_groups.is_empty() {
                    break;
                }
                let g = self.free_groups.remove(0);
                self.used_groups.push(g);
            }
            for g in self.used_groups.clone() {
                let room = GROUP - self.groups[g].map.count_ones() as usize;
                let take = room.min(sets.len() - at);
                at += self.program_group(g, &sets[at..at + take], &mut tidlist);
                if self.groups[g].map == 0xff {
                    self.used_groups.retain(|&u| u != g);
                }
                if at == sets.len() {
                    break;
                }
            }
        }
        if !self.faulted && self.fault != Fault::None {
            self.faulted = true;
            match self.fault {
                Fault::DropEntry => {
                    self.store(TidInfo::decode(tidlist[0]).rcventry().unwrap() as usize, put_tid_value(0, 0))
                }
                Fault::ExtraEntry => {
                    let spare = self.entries.iter().rposition(Option::is_none).unwrap();
                    self.store(spare, put_tid_value(pages[0], 1));
                }
                Fault::None => {}
            }
        }
        let length = tidlist.iter().map(|&t| TidInfo::decode(t).len).sum::<u32>() * PAGE as u32;
        Ok(TidUpdate { tidlist, length })
    }

    fn tid_free(&mut self, tidlist: &[u32]) -> hfi1_kernel_check::guest::Result<u32> {
        let mut freed = 0;
        for &t in tidlist {
            let rel = TidInfo::decode(t).rcventry().unwrap() as usize;
            let Some((pa, n)) = self.entries[rel].take() else { break };
            // __clear_tid_node: hfi1_put_tid(PT_INVALID_FLUSH), then the group gives the entry back.
            self.store(rel, put_tid_value(0, 0));
            self.maps.lock().unwrap().retain(|&p| p < pa || p >= pa + u64::from(n) * PAGE);
            let g = rel / GROUP;
            let was_full = self.groups[g].map == 0xff;
            self.groups[g].map &= !(1 << (rel % GROUP));
            if was_full {
                self.used_groups.push(g);
            }
            if self.groups[g].map == 0 {
                self.used_groups.retain(|&u| u != g);
                self.free_groups.push(g);
            }
            freed += 1;
        }
        Ok(freed)
    }

    fn pfns(&self, mem: &MockMem, offset: usize, pages: usize) -> hfi1_kernel_check::guest::Result<Vec<u64>> {
        Ok(mem.pages[offset / PAGE as usize..][..pages].iter().map(|pa| pa >> 12).collect())
    }
}

/// The hfi1 engine on the control socket as the device model will name the WFR personality, with the
/// `dma_maps` command answered from the mock's maps.
struct Wfr {
    dev: Arc<Hfi1>,
    maps: Maps,
}

impl ControlTarget for Wfr {
    fn name(&self) -> &str {
        "hfi1-wfr"
    }
    fn control(&self, request: &Value) -> Result<Value, String> {
        if request.get("cmd").and_then(Value::as_str) != Some("dma_maps") {
            return self.dev.control(request);
        }
        let maps: Vec<Value> = self
            .maps
            .lock()
            .unwrap()
            .iter()
            .map(|pa| json!({"iova": format!("{pa:#x}"), "size": "0x1000", "fd": true, "offset": format!("{pa:#x}"), "flags": 3}))
            .collect();
        Ok(json!({ "maps": maps }))
    }
    fn reset(&self) {
        self.dev.reset();
    }
}

/// Removed when the rig is dropped, pass or fail.
fn tempdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("hfi1-user-it-{tag}-")).tempdir().unwrap()
}

fn wait_for(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < Duration::from_secs(10), "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The chip as the kernel leaves it after ASSIGN_CTXT, behind a control socket.
struct Rig {
    dir: tempfile::TempDir,
    dev: Arc<Hfi1>,
    mem: Arc<HeapMemory>,
    maps: Maps,
    shutdown: Arc<AtomicBool>,
    server: Option<std::thread::JoinHandle<()>>,
}

impl Rig {
    fn new(tag: &str) -> Self {
        let dir = tempdir(tag);
        let dev = Arc::new(Hfi1::new(Hfi1Config::default()).unwrap());
        let mem = Arc::new(HeapMemory::new());
        dev.attach(mem.clone(), Arc::new(NoInterrupt));
        // A kernel context, our user context (ENABLE and TID flows, as user_init does with HDRSUPP), its
        // eager entries below its expected range (hfi1_setup_eagerbufs), context 1 left disabled.
        w(&dev, kctxt_csr(RCV_CTXT_CTRL, 0), RCV_CTXT_CTRL_ENABLE_SMASK);
        w(&dev, kctxt_csr(RCV_CTXT_CTRL, 2), RCV_CTXT_CTRL_ENABLE_SMASK | RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK);
        w(&dev, kctxt_csr(RCV_TID_CTRL, 2), (u64::from(EXPECTED) >> 3) << 32 | (EXPECTED_BASE >> 3));
        assert!(mem.map(0x0800_0000, EAGER as usize * PAGE as usize));
        for i in 0..u64::from(EAGER) {
            w(&dev, RCV_ARRAY + 8 * (EAGER_BASE + i), put_tid_value(0x0800_0000 + i * PAGE, 1));
        }
        let maps: Maps = Arc::new(Mutex::new(Vec::new()));
        let shutdown = Arc::new(AtomicBool::new(false));
        let target: Arc<dyn ControlTarget> = Arc::new(Wfr { dev: dev.clone(), maps: maps.clone() });
        let server = serve_control(&dir.path().join("dm.sock"), vec![target], shutdown.clone()).unwrap();
        Self { dir, dev, mem, maps, shutdown, server: Some(server) }
    }

    fn host(&self, step_timeout: Duration) -> (PathBuf, std::thread::JoinHandle<HostReport>) {
        let cfg = HostConfig {
            listen: self.dir.path().join("serial.sock"),
            control: self.dir.path().join("dm.sock"),
            device: "hfi1-wfr".into(),
            accept_timeout: Duration::from_secs(10),
            hello_timeout: Duration::from_secs(10),
            step_timeout,
            control_timeout: Duration::from_secs(10),
            gpa_check: true,
            progress: false,
        };
        let listen = cfg.listen.clone();
        let host = std::thread::spawn(move || serve(&cfg));
        wait_for(&listen);
        (listen, host)
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.shutdown.store(true, std::sync::atomic::Ordering::Release);
        if let Some(s) = self.server.take() {
            let _ = s.join();
        }
    }
}

/// One whole run: the host serving, the guest session over the mock kernel.
fn run_with(fault: Fault, tag: &str) -> (GuestResult, HostReport, Arc<Hfi1>) {
    let rig = Rig::new(tag);
    let (listen, host) = rig.host(Duration::from_secs(60));
    let mut chan = LineChannel::new(UnixStream::connect(&listen).unwrap()).unwrap();
    let mut kernel = MockKernel::new(rig.dev.clone(), rig.mem.clone(), rig.maps.clone(), fault);
    let opts = GuestOptions {
        flow: 5,
        generation: 0x2a5b1,
        seed: 0x5eed_0011,
        mtu: 8192,
        hello_timeout: Duration::from_secs(10),
        timeout: Duration::from_secs(60),
        progress: false,
    };
    let guest = run(&mut kernel, &mut chan, &opts);
    (guest, host.join().unwrap(), rig.dev.clone())
}

fn counter(dev: &Hfi1, name: &str) -> u64 {
    dev.counters().into_iter().find(|(n, _)| *n == name).map_or(u64::MAX, |(_, v)| v)
}

#[test]
fn every_tid_checks_out_data_is_placed_and_bad_packets_are_dropped() {
    let (guest, host, dev) = run_with(Fault::None, "clean");
    assert!(host.ok, "host: {:?}", host.errors);
    assert!(guest.ok, "guest: {}", serde_json::to_string(&guest).unwrap());
    assert_eq!(guest.over_limit.as_ref().and_then(|o| o.errno.as_deref()), Some("EINVAL"));
    // 256 expected entries: the small buffers share round 1, each per-call maximum has a round alone.
    assert_eq!(host.rounds.len(), 3);
    for r in &host.rounds {
        assert!(r.ok && r.registration.is_empty() && r.after_free.is_empty(), "{r:?}");
        assert_eq!(r.entries_ok, r.tids);
        assert!(r.pages_gpa_checked > 0 && r.pages_gpa_unchecked == 0);
        assert!(r.negatives.iter().all(|n| n.ok), "{:?}", r.negatives);
    }
    let kinds: Vec<&str> = host.rounds[0].negatives.iter().map(|n| n.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "wrong_generation",
            "wrong_context_absent",
            "wrong_context_disabled",
            "wrong_tid_invalid_entry",
            "wrong_tid_out_of_range"
        ]
    );
    // Round 3 (256 scattered pages) takes every entry: no unprogrammed one is left to aim at.
    assert!(!host.rounds[2].negatives.iter().any(|n| n.kind == "wrong_tid_invalid_entry"));
    let placed: u32 = host.rounds.iter().map(|r| r.placed).sum();
    assert_eq!(counter(&dev, "rx_placed"), u64::from(placed));
    assert_eq!(counter(&dev, "rx_gen_mismatch"), 3);
    assert_eq!(counter(&dev, "rx_context_disabled"), 3);
    // Scattered buffers got one TID per page; the contiguous maximum one TID of 256 pages (1 MiB, OM large).
    let bufs: Vec<_> = guest.rounds.iter().flat_map(|r| &r.buffers).collect();
    for b in &bufs {
        if b.kind == BufferKind::Scattered {
            assert_eq!(b.single_page_tids as u32, b.pages, "{b:?}");
        }
        assert_eq!(b.length, u64::from(b.pages) * PAGE, "{b:?}");
    }
    assert!(bufs.iter().any(|b| b.kind == BufferKind::Separate && b.pages == 256 && b.tids == 1));
    let data: u64 = guest.rounds.iter().filter_map(|r| r.verified.as_ref()).map(|v| v.data_bytes).sum();
    assert!(data > 2 * 256 * PAGE - 257 * 64, "{data}");
}

#[test]
fn a_tid_whose_entry_is_not_valid_fails_the_check_and_gets_no_data() {
    let (guest, host, _) = run_with(Fault::DropEntry, "drop");
    assert!(!host.ok && !guest.ok);
    let r1 = &host.rounds[0];
    assert_eq!(r1.registration.iter().map(|i| i.kind).collect::<Vec<_>>(), ["missing_entry"]);
    assert_eq!(r1.skipped_buffers, [0]);
    assert!(!r1.ok);
    // The skipped buffer holds its guard bytes where data was due: the guest sees that too.
    let v = guest.rounds[0].verified.as_ref().unwrap();
    assert!(!v.ok && v.mismatches.iter().all(|m| m.buffer == 0 && !m.guard));
    assert!(host.rounds[1..].iter().all(|r| r.ok));
}

#[test]
fn a_valid_entry_no_tid_names_fails_the_check_and_outlives_tid_free() {
    let (guest, host, _) = run_with(Fault::ExtraEntry, "extra");
    assert!(!host.ok && !guest.ok);
    let r1 = &host.rounds[0];
    assert_eq!(r1.registration.iter().map(|i| i.kind).collect::<Vec<_>>(), ["extra_entry"]);
    assert!(r1.skipped_buffers.is_empty());
    assert_eq!(r1.after_free.iter().map(|i| i.kind).collect::<Vec<_>>(), ["valid_after_free"]);
    assert!(guest.rounds[0].verified.as_ref().unwrap().ok);
    assert!(host.errors.iter().any(|e| e.contains("before TID_UPDATE") || e.contains("round 1 failed")));
}

#[test]
fn a_guest_that_goes_silent_after_hello_is_a_timeout_not_a_hang() {
    let rig = Rig::new("silent");
    let (listen, host) = rig.host(Duration::from_millis(300));
    let mut chan = LineChannel::new(UnixStream::connect(&listen).unwrap()).unwrap();
    let kernel = MockKernel::new(rig.dev.clone(), rig.mem.clone(), rig.maps.clone(), Fault::None);
    let hello = Hello {
        proto: PROTO_VERSION,
        info: kernel.facts().info,
        expected_count: EXPECTED,
        hw_version: 0,
        sw_version: HFI1_USER_SWVERSION,
        flow: 5,
        generation: 0x2a5b1,
        flow_value: flow_program_value(0x2a5b1),
        flow_readback: flow_expected_readback(0x2a5b1),
        seed: 1,
        mtu: 8192,
        over_limit_pages: EXPECTED + 1,
        over_limit_errno: Some("EINVAL".into()),
        rounds: 1,
    };
    let start = Instant::now();
    chan.send(&GuestMsg::Hello(hello), Duration::from_secs(5)).unwrap();
    assert!(matches!(chan.recv::<HostMsg>("welcome", Duration::from_secs(10)).unwrap(), HostMsg::Welcome { .. }));
    // Nothing more from us: the host gives up after its step timeout and says so to both sides.
    let told = chan.recv::<HostMsg>("abort", Duration::from_secs(10)).unwrap();
    let report = host.join().unwrap();
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(matches!(told, HostMsg::Abort { ref error } if error.contains("timed out")), "{told:?}");
    assert!(!report.ok);
    assert!(
        report.errors[0].contains("timed out") && report.errors[0].contains("registered or done"),
        "{:?}",
        report.errors
    );
}
