//! A small test device (registers + a DMA sum/fill engine on a worker thread) and helpers shared by the
//! integration tests.
#![allow(dead_code)]

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Sender};
use memfd::{FileSeal, MemfdOptions};
use vfio_user_proto::device::{
    device_flags, irq, irq_flags, region, region_flags, Device, DeviceContext, DeviceInfo, Errno, IrqInfo, RegionFd,
    RegionInfo, SparseArea,
};
use vfio_user_proto::dma::DmaAccess;
use vfio_user_proto::{Server, ServerConfig, ShutdownHandle};

/// BAR0 registers of the test device (4-byte, 4-aligned accesses only).
pub mod regs {
    pub const DMA_ADDR_LO: u64 = 0x00;
    pub const DMA_ADDR_HI: u64 = 0x04;
    pub const DMA_LEN: u64 = 0x08;
    /// Writing a command starts the job on the worker thread.
    pub const DMA_CMD: u64 = 0x0c;
    pub const DMA_STATUS: u64 = 0x10;
    pub const DMA_RESULT: u64 = 0x14;
    pub const SCRATCH: u64 = 0x18;
    pub const FILL_BYTE: u64 = 0x1c;
    pub const BAR0_SIZE: u64 = 0x1000;
}
pub mod cmd {
    /// Sum of the bytes at DMA_ADDR (wrapping u32) into DMA_RESULT.
    pub const SUM: u32 = 1;
    /// Fill DMA_LEN bytes at DMA_ADDR with FILL_BYTE.
    pub const FILL: u32 = 2;
}
pub mod status {
    pub const IDLE: u32 = 0;
    pub const BUSY: u32 = 1;
    pub const DONE: u32 = 2;
    pub const ERROR: u32 = 3;
}
pub const BAR2_SIZE: u64 = 0x2000;
pub const CONFIG_SIZE: u64 = 256;
pub const MSIX_VECTORS: u32 = 4;
/// The DMA engine refuses longer jobs.
pub const MAX_JOB: u64 = 1 << 20;

#[derive(Default)]
struct Regs {
    addr: AtomicU64,
    len: AtomicU32,
    status: AtomicU32,
    result: AtomicU32,
    scratch: AtomicU32,
    fill: AtomicU32,
}

struct Job {
    cmd: u32,
    addr: u64,
    len: u64,
    fill: u8,
}

pub struct TestDevice {
    regs: Arc<Regs>,
    ctx: Arc<Mutex<Option<DeviceContext>>>,
    /// The DMA space of the last client, kept past detach so tests can see it fail.
    pub last_dma: Mutex<Option<Arc<dyn DmaAccess>>>,
    config: Mutex<[u8; CONFIG_SIZE as usize]>,
    bar2: Arc<OwnedFd>,
    jobs: Sender<Job>,
    pub attaches: AtomicUsize,
    pub detaches: AtomicUsize,
    pub resets: AtomicUsize,
    /// Completion interrupts the worker has triggered (masked or not).
    pub triggers: Arc<AtomicUsize>,
    _worker: JoinHandle<()>,
}

fn run_job(ctx: &DeviceContext, job: &Job) -> Option<u32> {
    if job.len > MAX_JOB {
        return None;
    }
    let mut buf = vec![0u8; job.len as usize];
    match job.cmd {
        cmd::SUM => {
            ctx.dma.read(job.addr, &mut buf).ok()?;
            Some(buf.iter().fold(0u32, |a, b| a.wrapping_add(u32::from(*b))))
        }
        cmd::FILL => {
            buf.fill(job.fill);
            ctx.dma.write(job.addr, &buf).ok()?;
            Some(0)
        }
        _ => None,
    }
}

impl TestDevice {
    pub fn new() -> Arc<Self> {
        let regs = Arc::new(Regs::default());
        let ctx: Arc<Mutex<Option<DeviceContext>>> = Arc::default();
        let (tx, rx) = unbounded::<Job>();
        let (wregs, wctx) = (regs.clone(), ctx.clone());
        let triggers = Arc::new(AtomicUsize::new(0));
        let wtriggers = triggers.clone();
        let worker = std::thread::spawn(move || {
            for job in rx {
                // Copy the context and drop the lock before any DMA (the deadlock rule).
                let Some(c) = wctx.lock().unwrap().clone() else {
                    wregs.status.store(status::ERROR, Ordering::Release);
                    continue;
                };
                let r = run_job(&c, &job);
                wregs.result.store(r.unwrap_or(0), Ordering::Release);
                wregs.status.store(if r.is_some() { status::DONE } else { status::ERROR }, Ordering::Release);
                c.irq.trigger(irq::MSIX, 0);
                wtriggers.fetch_add(1, Ordering::AcqRel);
            }
        });
        let bar2 = MemfdOptions::default().create("testdev-bar2").unwrap().into_file();
        bar2.set_len(BAR2_SIZE).unwrap();
        Arc::new(TestDevice {
            regs,
            ctx,
            last_dma: Mutex::new(None),
            config: Mutex::new([0; CONFIG_SIZE as usize]),
            bar2: Arc::new(OwnedFd::from(bar2)),
            jobs: tx,
            attaches: AtomicUsize::new(0),
            detaches: AtomicUsize::new(0),
            resets: AtomicUsize::new(0),
            triggers,
            _worker: worker,
        })
    }

    fn reset_regs(&self) {
        for r in [&self.regs.len, &self.regs.status, &self.regs.result, &self.regs.scratch, &self.regs.fill] {
            r.store(0, Ordering::Release);
        }
        self.regs.addr.store(0, Ordering::Release);
    }

    fn reg_write(&self, offset: u64, v: u32) {
        let r = &self.regs;
        match offset {
            regs::DMA_ADDR_LO => {
                let old = r.addr.load(Ordering::Acquire);
                r.addr.store((old & !0xffff_ffff) | u64::from(v), Ordering::Release);
            }
            regs::DMA_ADDR_HI => {
                let old = r.addr.load(Ordering::Acquire);
                r.addr.store((old & 0xffff_ffff) | (u64::from(v) << 32), Ordering::Release);
            }
            regs::DMA_LEN => r.len.store(v, Ordering::Release),
            regs::DMA_CMD => {
                r.status.store(status::BUSY, Ordering::Release);
                let job = Job {
                    cmd: v,
                    addr: r.addr.load(Ordering::Acquire),
                    len: r.len.load(Ordering::Acquire).into(),
                    fill: r.fill.load(Ordering::Acquire) as u8,
                };
                let _ = self.jobs.send(job);
            }
            regs::SCRATCH => r.scratch.store(v, Ordering::Release),
            regs::FILL_BYTE => r.fill.store(v, Ordering::Release),
            _ => {}
        }
    }

    fn reg_read(&self, offset: u64) -> u32 {
        let r = &self.regs;
        match offset {
            regs::DMA_ADDR_LO => r.addr.load(Ordering::Acquire) as u32,
            regs::DMA_ADDR_HI => (r.addr.load(Ordering::Acquire) >> 32) as u32,
            regs::DMA_LEN => r.len.load(Ordering::Acquire),
            regs::DMA_STATUS => r.status.load(Ordering::Acquire),
            regs::DMA_RESULT => r.result.load(Ordering::Acquire),
            regs::SCRATCH => r.scratch.load(Ordering::Acquire),
            regs::FILL_BYTE => r.fill.load(Ordering::Acquire),
            _ => 0xffff_ffff,
        }
    }
}

fn reg_offset(offset: u64, len: usize) -> Result<u64, Errno> {
    if len != 4 || !offset.is_multiple_of(4) {
        return Err(libc::EINVAL);
    }
    Ok(offset)
}

impl Device for TestDevice {
    fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            flags: device_flags::PCI | device_flags::RESET,
            num_regions: region::NUM_REGIONS,
            num_irqs: irq::NUM_IRQS,
        }
    }
    fn region_info(&self, index: u32) -> Option<RegionInfo> {
        let rw = region_flags::READ | region_flags::WRITE;
        match index {
            region::BAR0 => Some(RegionInfo { size: regs::BAR0_SIZE, flags: rw, ..Default::default() }),
            2 => Some(RegionInfo {
                size: BAR2_SIZE,
                flags: rw | region_flags::MMAP | region_flags::CAPS, // as the Device contract says
                sparse_areas: vec![SparseArea { offset: 0x1000, size: 0x1000 }],
                fd: Some(RegionFd { fd: self.bar2.clone(), fd_offset: 0 }),
            }),
            region::CONFIG => Some(RegionInfo { size: CONFIG_SIZE, flags: rw, ..Default::default() }),
            // As vfio-pci: every index below num_regions exists, absent BARs have size 0.
            i if i < region::NUM_REGIONS => Some(RegionInfo::default()),
            _ => None,
        }
    }
    fn irq_info(&self, index: u32) -> Option<IrqInfo> {
        match index {
            irq::INTX => {
                Some(IrqInfo { flags: irq_flags::EVENTFD | irq_flags::MASKABLE | irq_flags::AUTOMASKED, count: 1 })
            }
            irq::MSIX => Some(IrqInfo { flags: irq_flags::EVENTFD | irq_flags::MASKABLE, count: MSIX_VECTORS }),
            _ => None,
        }
    }
    fn region_read(&self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno> {
        match index {
            region::BAR0 => {
                data.copy_from_slice(&self.reg_read(reg_offset(offset, data.len())?).to_le_bytes());
                Ok(())
            }
            region::CONFIG => {
                let c = self.config.lock().unwrap();
                data.copy_from_slice(&c[offset as usize..offset as usize + data.len()]);
                Ok(())
            }
            _ => Err(libc::EINVAL),
        }
    }
    fn region_write(&self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno> {
        match index {
            region::BAR0 => {
                let off = reg_offset(offset, data.len())?;
                let mut b = [0u8; 4];
                b.copy_from_slice(data);
                self.reg_write(off, u32::from_le_bytes(b));
                Ok(())
            }
            region::CONFIG => {
                self.config.lock().unwrap()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
                Ok(())
            }
            _ => Err(libc::EINVAL),
        }
    }
    fn attach(&self, ctx: DeviceContext) {
        self.attaches.fetch_add(1, Ordering::AcqRel);
        *self.last_dma.lock().unwrap() = Some(ctx.dma.clone());
        *self.ctx.lock().unwrap() = Some(ctx);
    }
    fn detach(&self) {
        self.detaches.fetch_add(1, Ordering::AcqRel);
        *self.ctx.lock().unwrap() = None;
        self.reset_regs();
    }
    fn reset(&self) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        self.reset_regs();
    }
}

/// A server serving `device` on a fresh socket path in its own thread.
pub struct Running {
    pub path: PathBuf,
    pub device: Arc<TestDevice>,
    stop: ShutdownHandle,
    thread: Option<JoinHandle<std::io::Result<()>>>,
    _dir: TempDir,
}

impl Running {
    pub fn start(config: ServerConfig) -> Self {
        let dir = TempDir::new();
        let path = dir.0.join("sock");
        let device = TestDevice::new();
        let server = Server::new(device.clone(), config);
        let stop = server.shutdown_handle();
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let thread = std::thread::spawn(move || server.serve(listener));
        // Serving: the listener's watch (a duplicate descriptor) is in place before a test counts descriptors.
        assert!(wait_for(Duration::from_secs(10), || stop.watched_sockets() == 1), "the server never served");
        Running { path, device, stop, thread: Some(thread), _dir: dir }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "vfio-user-proto-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A memfd of `len` bytes, sealed against shrinking when `seal`.
pub fn memfd(name: &str, len: u64, seal: bool) -> File {
    let m = MemfdOptions::default().allow_sealing(true).create(name).unwrap();
    m.as_file().set_len(len).unwrap();
    if seal {
        m.add_seal(FileSeal::SealShrink).unwrap();
    }
    m.into_file()
}

/// Open descriptors of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Mappings of this process whose backing file name contains `name`.
pub fn maps_named(name: &str) -> usize {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().filter(|l| l.contains(name)).count()
}

/// Polls `f` until it is true or `timeout` passes.
pub fn wait_for(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

/// A hand-driven client speaking raw messages, for hostile and QEMU-shaped sequences.
pub mod raw {
    use std::io::Write;
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    use vfio_user_proto::device::region;
    use vfio_user_proto::frame_reader::{recv_message, FrameLimits};
    use vfio_user_proto::sock::{borrow_all, send_message, FrameError, Message};
    use vfio_user_proto::wire::{command as c, FourU32, Header};

    use super::Running;

    /// The message id every raw request uses.
    pub const ID: u16 = 0x77;
    pub const GOOD_VERSION: &[u8] = b"\0\0\x01\0{\"capabilities\":{\"max_msg_fds\":16}}\0";

    pub struct Raw {
        pub s: UnixStream,
        negotiated: std::cell::Cell<bool>,
    }

    impl Raw {
        pub fn connect(srv: &Running) -> Raw {
            let s = UnixStream::connect(&srv.path).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            Raw { s, negotiated: false.into() }
        }
        pub fn send(&self, command: u16, payload: &[u8], fds: &[OwnedFd]) {
            self.send_hdr(Header::command(ID, command, payload.len()), payload, fds);
        }
        pub fn send_hdr(&self, h: Header, payload: &[u8], fds: &[OwnedFd]) {
            send_message(&self.s, &h, &[payload], &borrow_all(fds)).unwrap();
        }
        pub fn raw(&self, bytes: &[u8]) {
            (&self.s).write_all(bytes).unwrap();
        }
        pub fn recv(&self) -> Result<Message, FrameError> {
            let lim = FrameLimits { max_msg_size: 1 << 21, max_fds: 4, stall_timeout: Duration::from_secs(3) };
            recv_message(&self.s, &lim)
        }
        /// Sends a request and returns its successful reply.
        pub fn ok(&self, command: u16, payload: &[u8], fds: &[OwnedFd]) -> Message {
            self.send(command, payload, fds);
            let m = self.recv().unwrap();
            assert!(m.header.is_reply() && !m.header.is_error(), "request {command} failed: {:?}", m.header);
            m
        }
        pub fn version_with(&self, payload: &[u8]) -> Message {
            let m = self.ok(c::VERSION, payload, &[]);
            self.negotiated.set(true);
            m
        }
        pub fn version(&self) {
            self.version_with(GOOD_VERSION);
        }
        /// A well-formed request is served.
        pub fn good(&self) {
            if !self.negotiated.get() {
                self.version();
            }
            let m = self.ok(c::DEVICE_GET_INFO, &FourU32([16, 0, 0, 0]).encode(), &[]);
            assert_eq!(FourU32::decode(&m.payload).unwrap().0[2], region::NUM_REGIONS);
        }
    }
}
