//! Our client against our server: register access, device DMA from a worker thread through both the
//! mmap and the DMA_READ/DMA_WRITE message paths, interrupts, region info, reset, disconnect.

mod common;

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{cmd, memfd, regs, status, wait_for, Running, BAR2_SIZE};
use rustix::event::{eventfd, EventfdFlags};
use vfio_user_proto::device::{
    irq, region, region_flags, Device, DeviceContext, DeviceInfo, IrqInfo, RegionInfo, SparseArea,
};
use vfio_user_proto::dma::DmaError;
use vfio_user_proto::wire::irq_set_flags as f;
use vfio_user_proto::{Client, ClientConfig, ClientDmaBacking, DmaProt, ServerConfig};

/// Client memory served over DMA_READ/DMA_WRITE.
struct VecBacking(Mutex<Vec<u8>>);

impl ClientDmaBacking for VecBacking {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
        let m = self.0.lock().unwrap();
        let s = m.get(offset as usize..offset as usize + buf.len()).ok_or(libc::EFAULT)?;
        buf.copy_from_slice(s);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), i32> {
        let mut m = self.0.lock().unwrap();
        m.get_mut(offset as usize..offset as usize + data.len()).ok_or(libc::EFAULT)?.copy_from_slice(data);
        Ok(())
    }
}

fn w32(c: &Client, off: u64, v: u32) {
    c.region_write(region::BAR0, off, &v.to_le_bytes()).unwrap();
}
fn r32(c: &Client, off: u64) -> u32 {
    let mut b = [0u8; 4];
    c.region_read(region::BAR0, off, &mut b).unwrap();
    u32::from_le_bytes(b)
}

/// Starts a job and polls STATUS with register reads (answered while the worker's DMA is in flight).
fn run_job(c: &Client, command: u32, addr: u64, len: u32) -> (u32, u32) {
    w32(c, regs::DMA_ADDR_LO, addr as u32);
    w32(c, regs::DMA_ADDR_HI, (addr >> 32) as u32);
    w32(c, regs::DMA_LEN, len);
    w32(c, regs::DMA_CMD, command);
    let mut st = status::BUSY;
    assert!(wait_for(Duration::from_secs(10), || {
        st = r32(c, regs::DMA_STATUS);
        st != status::BUSY
    }));
    (st, r32(c, regs::DMA_RESULT))
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// Sum of `pattern(len)`: full cycles of 0..=250 sum to 31375 each.
fn pattern_sum(len: usize) -> u32 {
    let full = (len / 251) as u32 * 31375;
    let rest = (len % 251) as u32;
    full + rest * rest.saturating_sub(1) / 2
}

#[test]
fn device_dma_reaches_memory_mapped_without_fd_through_dma_read_and_write_messages() {
    // A small transfer size forces the server to split the device's access over several messages.
    let srv = Running::start(ServerConfig { max_data_xfer_size: 0x1000, ..Default::default() });
    let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    let mem = Arc::new(VecBacking(Mutex::new(pattern(0x8000))));
    c.dma_map_backed(0x4000_0000, 0x8000, mem.clone(), DmaProt::READ_WRITE).unwrap();

    assert_eq!(run_job(&c, cmd::SUM, 0x4000_0000, 0x4000), (status::DONE, pattern_sum(0x4000)));

    w32(&c, regs::FILL_BYTE, 0x5a);
    assert_eq!(run_job(&c, cmd::FILL, 0x4000_0800, 0x3000).0, status::DONE);
    let m = mem.0.lock().unwrap();
    let expect: Vec<u8> = pattern(0x8000)
        .into_iter()
        .enumerate()
        .map(|(i, b)| if (0x800..0x3800).contains(&i) { 0x5a } else { b })
        .collect();
    assert!(*m == expect);
}

#[test]
fn device_dma_reaches_per_page_fd_maps_through_the_shared_mmap() {
    let srv = Running::start(ServerConfig::default());
    let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    let ram = memfd("cs-guest-ram", 0x40_0000, true);
    ram.write_all_at(&pattern(0x1000), 0x1f_b000).unwrap();
    ram.write_all_at(&pattern(0x2000)[0x1000..], 0x2_3000).unwrap();
    // Three IOVA-contiguous pages at scattered file offsets, one DMA_MAP each, as QEMU sends them.
    let pages = [(0x10_0000u64, 0x1f_b000u64), (0x10_1000, 0x2_3000), (0x10_2000, 0x9000)];
    for (iova, off) in pages {
        c.dma_map_fd(iova, 0x1000, ram.as_fd(), off, DmaProt::READ_WRITE).unwrap();
    }
    assert_eq!(run_job(&c, cmd::SUM, 0x10_0000, 0x2000), (status::DONE, pattern_sum(0x2000)));
    w32(&c, regs::FILL_BYTE, 0xc3);
    assert_eq!(run_job(&c, cmd::FILL, 0x10_0ffc, 0x1008).0, status::DONE);
    let (mut a, mut b, mut cc) = ([0u8; 5], [0u8; 0x1000], [0u8; 5]);
    ram.read_at(&mut a, 0x1f_bffb).unwrap();
    ram.read_at(&mut b, 0x2_3000).unwrap();
    ram.read_at(&mut cc, 0x8fff).unwrap();
    assert_eq!(a, [pattern(0x1000)[0xffb], 0xc3, 0xc3, 0xc3, 0xc3]);
    assert_eq!(b, [0xc3; 0x1000]);
    assert_eq!(cc, [0, 0xc3, 0xc3, 0xc3, 0xc3]);
}

#[test]
fn dma_to_an_unmapped_iova_fails_in_the_device_and_the_server_keeps_serving() {
    let srv = Running::start(ServerConfig::default());
    let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    c.dma_map_backed(0x1000, 0x1000, Arc::new(VecBacking(Mutex::new(vec![0; 0x1000]))), DmaProt::READ).unwrap();
    assert_eq!(run_job(&c, cmd::SUM, 0x1800, 0x1000).0, status::ERROR);
    assert_eq!(run_job(&c, cmd::FILL, 0x1000, 0x10).0, status::ERROR, "read-only mapping");
    assert_eq!(run_job(&c, cmd::SUM, 0x1000, 0x1000), (status::DONE, 0));
}

#[test]
fn msix_eventfd_fires_on_completion_and_is_held_while_masked() {
    let srv = Running::start(ServerConfig::default());
    let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    c.dma_map_backed(0x1000, 0x1000, Arc::new(VecBacking(Mutex::new(vec![1; 0x1000]))), DmaProt::READ).unwrap();
    let efds: Vec<OwnedFd> = (0..4).map(|_| eventfd(0, EventfdFlags::NONBLOCK).unwrap()).collect();
    let borrowed: Vec<_> = efds.iter().map(|e| e.as_fd()).collect();
    c.set_irqs(irq::MSIX, f::DATA_EVENTFD | f::ACTION_TRIGGER, 0, &borrowed).unwrap();
    let count = |e: &OwnedFd| {
        let mut b = [0u8; 8];
        rustix::io::read(e, &mut b).map(|_| u64::from_ne_bytes(b)).unwrap_or(0)
    };
    run_job(&c, cmd::SUM, 0x1000, 0x10);
    assert!(wait_for(Duration::from_secs(2), || count(&efds[0]) == 1));
    c.set_irqs_count(irq::MSIX, f::DATA_NONE | f::ACTION_MASK, 0, 1).unwrap();
    run_job(&c, cmd::SUM, 0x1000, 0x10);
    // The device publishes the job's status before it raises the vector: wait for the raise itself.
    assert!(wait_for(Duration::from_secs(30), || srv.device.triggers.load(Ordering::Acquire) == 2));
    assert_eq!(count(&efds[0]), 0, "masked: held pending");
    c.set_irqs_count(irq::MSIX, f::DATA_NONE | f::ACTION_UNMASK, 0, 1).unwrap();
    assert_eq!(count(&efds[0]), 1);
    // The client can trigger a vector itself.
    c.set_irqs_count(irq::MSIX, f::DATA_NONE | f::ACTION_TRIGGER, 3, 1).unwrap();
    assert_eq!(count(&efds[3]), 1);
}

#[test]
fn set_irqs_splits_vectors_over_the_servers_fd_limit() {
    let srv = Running::start(ServerConfig { max_msg_fds: 1, ..Default::default() });
    let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    assert_eq!(c.server_caps().max_msg_fds, 1);
    let efds: Vec<OwnedFd> = (0..4).map(|_| eventfd(0, EventfdFlags::NONBLOCK).unwrap()).collect();
    let borrowed: Vec<_> = efds.iter().map(|e| e.as_fd()).collect();
    c.set_irqs(irq::MSIX, f::DATA_EVENTFD | f::ACTION_TRIGGER, 0, &borrowed).unwrap();
    c.set_irqs_count(irq::MSIX, f::DATA_NONE | f::ACTION_TRIGGER, 0, 4).unwrap();
    for e in &efds {
        let mut b = [0u8; 8];
        assert_eq!(rustix::io::read(e, &mut b).unwrap(), 8);
        assert_eq!(u64::from_ne_bytes(b), 1);
    }
}

#[test]
fn region_info_carries_sparse_areas_and_the_region_fd() {
    let srv = Running::start(ServerConfig::default());
    let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    let info = c.device_info().unwrap();
    assert_eq!((info.num_regions, info.num_irqs), (9, 5));
    let bar2 = c.region_info(2).unwrap();
    assert_eq!(bar2.size, BAR2_SIZE);
    assert_eq!(bar2.flags & (region_flags::MMAP | region_flags::CAPS), region_flags::MMAP | region_flags::CAPS);
    assert_eq!(bar2.sparse_areas, vec![SparseArea { offset: 0x1000, size: 0x1000 }]);
    let fd = bar2.fd.expect("region fd");
    assert_eq!(rustix::fs::fstat(&*fd.fd).unwrap().st_size as u64, BAR2_SIZE);
    let bar0 = c.region_info(region::BAR0).unwrap();
    assert!(bar0.fd.is_none() && bar0.sparse_areas.is_empty());
    assert_eq!(c.region_info(1).unwrap().size, 0);
    assert_eq!(c.region_info(9).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(c.irq_info(irq::MSIX).unwrap().count, 4);
}

#[test]
fn write_multi_and_reset_reach_the_device() {
    let srv = Running::start(ServerConfig { write_multiple: true, ..ServerConfig::default() });
    let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    assert!(c.server_caps().write_multiple);
    let (a, b) = (7u32.to_le_bytes(), 0x42u32.to_le_bytes());
    c.region_write_multi(&[(region::BAR0, regs::SCRATCH, &a), (region::BAR0, regs::FILL_BYTE, &b)]).unwrap();
    assert_eq!((r32(&c, regs::SCRATCH), r32(&c, regs::FILL_BYTE)), (7, 0x42));
    // Config space accepts any width, as QEMU reads it whole.
    c.region_write(region::CONFIG, 0, &[0xaa; 64]).unwrap();
    let mut cfg = [0u8; 256];
    c.region_read(region::CONFIG, 0, &mut cfg).unwrap();
    assert_eq!(&cfg[..64], &[0xaa; 64]);
    c.reset().unwrap();
    assert_eq!(srv.device.resets.load(Ordering::Acquire), 1);
    assert_eq!(r32(&c, regs::SCRATCH), 0);
    assert_eq!(c.region_read(region::BAR0, 2, &mut [0; 4]).unwrap_err().errno(), libc::EINVAL);
}

#[test]
fn after_disconnect_the_device_is_detached_and_its_old_dma_space_fails() {
    let srv = Running::start(ServerConfig::default());
    let ram = memfd("cs-detach", 0x10000, true);
    {
        let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
        c.dma_map_fd(0x1000, 0x1000, ram.as_fd(), 0, DmaProt::READ_WRITE).unwrap();
        w32(&c, regs::SCRATCH, 5);
    }
    assert!(wait_for(Duration::from_secs(2), || srv.device.detaches.load(Ordering::Acquire) == 1));
    let old = srv.device.last_dma.lock().unwrap().clone().unwrap();
    assert!(matches!(old.read(0x1000, &mut [0; 4]), Err(DmaError::Transport(_))));
    // The next client finds a reset device.
    let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    assert_eq!(r32(&c, regs::SCRATCH), 0);
    assert_eq!(srv.device.attaches.load(Ordering::Acquire), 2);
}

#[test]
fn a_request_to_a_dead_server_times_out_with_etimedout_however_long_the_client_busy_polls() {
    // A busy-poll longer than the timeout still ends at the deadline: the "server" stays silent but keeps
    // the socket open until the client has its answer, so a poll past the deadline would never end.
    for busy_poll in [Duration::ZERO, Duration::from_millis(1), Duration::from_secs(10)] {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (answered, hold) = std::sync::mpsc::channel::<()>();
        // A "server" that answers VERSION and then never again.
        let t = std::thread::spawn(move || {
            use vfio_user_proto::frame_reader::{recv_message, FrameLimits};
            use vfio_user_proto::sock::send_message;
            use vfio_user_proto::wire::Header;
            let lim = FrameLimits { max_msg_size: 1 << 16, max_fds: 1, stall_timeout: Duration::from_secs(1) };
            let m = recv_message(&b, &lim).unwrap();
            let p = [0u8, 0, 0, 0];
            send_message(&b, &Header::reply(&m.header, 4), &[&p], &[]).unwrap();
            let _ = recv_message(&b, &lim);
            let _ = hold.recv();
        });
        let config = ClientConfig { timeout: Duration::from_millis(200), busy_poll, ..Default::default() };
        let c = Client::from_stream(a, config).unwrap();
        assert_eq!(c.device_info().unwrap_err().errno(), libc::ETIMEDOUT, "busy-poll {busy_poll:?}");
        drop(answered);
        t.join().unwrap();
    }
}

#[test]
fn a_busy_polling_client_gets_every_reply_of_a_blocking_and_of_a_polling_server() {
    for (server_poll, client_poll) in
        [(Duration::ZERO, Duration::from_millis(1)), (Duration::from_millis(1), Duration::from_millis(1))]
    {
        let srv = Running::start(ServerConfig { busy_poll: server_poll, ..Default::default() });
        let c = Client::connect(&srv.path, ClientConfig { busy_poll: client_poll, ..Default::default() }).unwrap();
        for i in 0..50 {
            w32(&c, regs::SCRATCH, i + 3);
            assert_eq!(r32(&c, regs::SCRATCH), i + 3, "server poll {server_poll:?}");
        }
    }
}

#[test]
fn an_unsealed_fd_map_is_served_by_messages_that_the_client_answers_through_the_fd() {
    let srv = Running::start(ServerConfig::default());
    let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    let ram = memfd("cs-unsealed", 0x10000, false);
    ram.write_all_at(&pattern(0x1000), 0x3000).unwrap();
    c.dma_map_fd(0x20_0000, 0x2000, ram.as_fd(), 0x3000, DmaProt::READ_WRITE).unwrap();
    assert_eq!(run_job(&c, cmd::SUM, 0x20_0000, 0x1000), (status::DONE, pattern_sum(0x1000)));
    w32(&c, regs::FILL_BYTE, 0x11);
    assert_eq!(run_job(&c, cmd::FILL, 0x20_1000, 0x10).0, status::DONE);
    let mut b = [0u8; 0x11];
    ram.read_at(&mut b, 0x4000).unwrap();
    assert_eq!(b[..0x10], [0x11; 0x10]);
    assert_eq!(b[0x10], 0);
}

#[test]
fn a_refused_duplicate_map_keeps_the_original_backing() {
    let srv = Running::start(ServerConfig::default());
    let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    let first = Arc::new(VecBacking(Mutex::new(vec![2; 0x1000])));
    c.dma_map_backed(0x1000, 0x1000, first, DmaProt::READ).unwrap();
    let dup = Arc::new(VecBacking(Mutex::new(vec![9; 0x1000])));
    assert_eq!(c.dma_map_backed(0x1000, 0x1000, dup, DmaProt::READ).unwrap_err().errno(), libc::EEXIST);
    assert_eq!(run_job(&c, cmd::SUM, 0x1000, 0x10), (status::DONE, 0x20));
}

/// Delegates to the test device but panics on a read of BAR0's last register: a device bug.
struct PanickyDevice(Arc<common::TestDevice>);

impl Device for PanickyDevice {
    fn device_info(&self) -> DeviceInfo {
        self.0.device_info()
    }
    fn region_info(&self, index: u32) -> Option<RegionInfo> {
        self.0.region_info(index)
    }
    fn irq_info(&self, index: u32) -> Option<IrqInfo> {
        self.0.irq_info(index)
    }
    fn region_read(&self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), i32> {
        assert!(offset != 0xffc, "device bug");
        self.0.region_read(index, offset, data)
    }
    fn region_write(&self, index: u32, offset: u64, data: &[u8]) -> Result<(), i32> {
        self.0.region_write(index, offset, data)
    }
    fn attach(&self, ctx: DeviceContext) {
        self.0.attach(ctx)
    }
    fn detach(&self) {
        self.0.detach()
    }
    fn reset(&self) {
        self.0.reset()
    }
}

#[test]
fn a_panicking_device_costs_only_its_connection() {
    let inner = common::TestDevice::new();
    let server = vfio_user_proto::Server::new(Arc::new(PanickyDevice(inner.clone())), ServerConfig::default());
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let t = std::thread::spawn(move || {
        let c = Client::from_stream(a, ClientConfig::default()).unwrap();
        c.region_read(region::BAR0, 0xffc, &mut [0; 4]).unwrap_err().errno()
    });
    let r = server.serve_connection(b);
    assert!(matches!(r, Err(vfio_user_proto::ServerError::DevicePanic)));
    assert_eq!(t.join().unwrap(), libc::EIO);
    assert_eq!(inner.detaches.load(Ordering::Acquire), 1);
    // The same server serves the next client.
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let t = std::thread::spawn(move || Client::from_stream(a, ClientConfig::default()).unwrap().device_info().is_ok());
    let _ = std::thread::spawn(move || server.serve_connection(b));
    assert!(t.join().unwrap());
}

#[test]
fn a_busy_polling_server_serves_bursts_message_dma_and_idle_gaps_alike() {
    let srv = Running::start(ServerConfig {
        busy_poll: Duration::from_millis(1),
        max_data_xfer_size: 0x1000,
        ..Default::default()
    });
    let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    for i in 0..200 {
        w32(&c, regs::SCRATCH, i);
        assert_eq!(r32(&c, regs::SCRATCH), i);
    }
    // The device's DMA_READ/WRITE replies reach the worker while the connection thread polls.
    let mem = Arc::new(VecBacking(Mutex::new(pattern(0x4000))));
    c.dma_map_backed(0x4000_0000, 0x4000, mem, DmaProt::READ_WRITE).unwrap();
    assert_eq!(run_job(&c, cmd::SUM, 0x4000_0000, 0x4000), (status::DONE, pattern_sum(0x4000)));
    // Idle longer than the budget (polling disarms), then a burst again: the gap is the scenario, not a wait
    // for anything.
    std::thread::sleep(Duration::from_millis(20));
    for i in 0..20 {
        w32(&c, regs::SCRATCH, i + 7);
        assert_eq!(r32(&c, regs::SCRATCH), i + 7);
    }
}

#[test]
fn shutdown_makes_serve_return_promptly_even_with_an_idle_client_connected() {
    for busy_poll in [Duration::ZERO, Duration::from_millis(1)] {
        shutdown_with_an_idle_client(ServerConfig { busy_poll, ..Default::default() });
    }
}

fn shutdown_with_an_idle_client(config: ServerConfig) {
    let dir = common::TempDir::new();
    let path = dir.0.join("sock");
    let device = common::TestDevice::new();
    let server = vfio_user_proto::Server::new(device.clone(), config);
    let stop = server.shutdown_handle();
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let (served, done) = std::sync::mpsc::channel();
    let _t = std::thread::spawn(move || served.send(server.serve(listener)));
    let c = Client::connect(&path, ClientConfig::default()).unwrap();
    c.device_info().unwrap();
    stop.shutdown();
    // The serving thread blocks on its sockets with no timeout: only the shutdown can end it.
    done.recv_timeout(Duration::from_secs(30)).expect("serve returned after the shutdown").unwrap();
    assert_eq!(device.detaches.load(Ordering::Acquire), 1);
    assert_eq!(c.device_info().unwrap_err().errno(), libc::EIO);
}

#[test]
fn one_client_shared_by_threads_gets_each_reply_routed_to_its_caller() {
    let srv = Running::start(ServerConfig::default());
    let c = Arc::new(Client::connect(&srv.path, ClientConfig::default()).unwrap());
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in 0..100u32 {
                    let v = (t << 24) | i;
                    c.region_write(region::CONFIG, u64::from(t) * 4, &v.to_le_bytes()).unwrap();
                    let mut b = [0u8; 4];
                    c.region_read(region::CONFIG, u64::from(t) * 4, &mut b).unwrap();
                    assert_eq!(u32::from_le_bytes(b), v);
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
}

#[test]
fn dma_requests_that_arrive_while_no_call_waits_are_answered_by_the_idle_reader() {
    let srv = Running::start(ServerConfig { max_data_xfer_size: 0x1000, ..Default::default() });
    let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    let mem = Arc::new(VecBacking(Mutex::new(vec![0u8; 0x4000])));
    c.dma_map_backed(0x4000_0000, 0x4000, mem.clone(), DmaProt::READ_WRITE).unwrap();
    w32(&c, regs::FILL_BYTE, 0xc3);
    w32(&c, regs::DMA_ADDR_LO, 0x4000_0000);
    w32(&c, regs::DMA_ADDR_HI, 0);
    w32(&c, regs::DMA_LEN, 0x4000);
    w32(&c, regs::DMA_CMD, cmd::FILL);
    // No request from here on until the memory shows the job done: only the idle reader can answer the
    // four DMA_WRITE messages the fill takes.
    assert!(wait_for(Duration::from_secs(10), || mem.0.lock().unwrap().iter().all(|b| *b == 0xc3)));
    assert!(wait_for(Duration::from_secs(10), || r32(&c, regs::DMA_STATUS) == status::DONE));
}

#[test]
fn callers_on_several_threads_and_the_servers_dma_requests_share_the_socket() {
    let srv = Running::start(ServerConfig { max_data_xfer_size: 0x1000, ..Default::default() });
    let c = Arc::new(Client::connect(&srv.path, ClientConfig::default()).unwrap());
    let mem = Arc::new(VecBacking(Mutex::new(pattern(0x10000))));
    c.dma_map_backed(0x4000_0000, 0x10000, mem.clone(), DmaProt::READ_WRITE).unwrap();
    let busy: Vec<_> = (0..3u32)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in 0..200u32 {
                    let v = (t << 24) | i;
                    c.region_write(region::CONFIG, u64::from(t) * 4, &v.to_le_bytes()).unwrap();
                    let mut b = [0u8; 4];
                    c.region_read(region::CONFIG, u64::from(t) * 4, &mut b).unwrap();
                    assert_eq!(u32::from_le_bytes(b), v);
                }
            })
        })
        .collect();
    for _ in 0..5 {
        assert_eq!(run_job(&c, cmd::SUM, 0x4000_0000, 0x10000), (status::DONE, pattern_sum(0x10000)));
    }
    busy.into_iter().for_each(|t| t.join().unwrap());
}
