//! 100 connect/disconnect cycles with DMA maps and IRQ eventfds set: afterwards no descriptor, mmap or
//! device attachment is left over. One test function: descriptor counts must not race.

mod common;

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{cmd, fd_count, maps_named, memfd, regs, status, wait_for, Running};
use rustix::event::{eventfd, EventfdFlags};
use vfio_user_proto::device::{irq, region};
use vfio_user_proto::wire::{irq_set_flags as f, Header};
use vfio_user_proto::{Client, ClientConfig, ClientDmaBacking, DmaProt, ServerConfig};

struct Zeros(Mutex<Vec<u8>>);

impl ClientDmaBacking for Zeros {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
        buf.copy_from_slice(
            self.0.lock().unwrap().get(offset as usize..offset as usize + buf.len()).ok_or(libc::EFAULT)?,
        );
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), i32> {
        self.0
            .lock()
            .unwrap()
            .get_mut(offset as usize..offset as usize + data.len())
            .ok_or(libc::EFAULT)?
            .copy_from_slice(data);
        Ok(())
    }
}

fn r32(c: &Client, off: u64) -> u32 {
    let mut b = [0u8; 4];
    c.region_read(region::BAR0, off, &mut b).unwrap();
    u32::from_le_bytes(b)
}

/// One busy session: 16 per-page fd maps, one fd-less map, 4 MSI-X eventfds, a DMA job.
fn session(srv: &Running, ram: &std::fs::File, cycle: u64) {
    let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    for p in 0..16u64 {
        c.dma_map_fd(0x10_0000 + p * 0x1000, 0x1000, ram.as_fd(), (15 - p) * 0x1000, DmaProt::READ_WRITE).unwrap();
    }
    c.dma_map_backed(0x80_0000, 0x1000, Arc::new(Zeros(Mutex::new(vec![0; 0x1000]))), DmaProt::READ_WRITE).unwrap();
    let efds: Vec<OwnedFd> = (0..4).map(|_| eventfd(0, EventfdFlags::NONBLOCK).unwrap()).collect();
    let b: Vec<_> = efds.iter().map(|e| e.as_fd()).collect();
    c.set_irqs(irq::MSIX, f::DATA_EVENTFD | f::ACTION_TRIGGER, 0, &b).unwrap();
    c.region_write(region::BAR0, regs::DMA_ADDR_LO, &0x10_0000u32.to_le_bytes()).unwrap();
    c.region_write(region::BAR0, regs::DMA_LEN, &0x2000u32.to_le_bytes()).unwrap();
    c.region_write(region::BAR0, regs::DMA_CMD, &cmd::SUM.to_le_bytes()).unwrap();
    if cycle.is_multiple_of(2) {
        // Half the time, leave while the job may still run.
        assert!(wait_for(Duration::from_secs(5), || r32(&c, regs::DMA_STATUS) != status::BUSY));
    }
}

#[test]
fn a_hundred_reconnects_with_maps_and_irqs_leave_nothing_behind() {
    let srv = Running::start(ServerConfig::default());
    let ram = memfd("reconnect-ram", 0x10000, true);
    let sync = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    sync.device_info().unwrap();
    let before = fd_count();
    drop(sync);

    for cycle in 0..100 {
        if cycle % 10 == 9 {
            // A client that vanishes in the middle of a message.
            let mut s = std::os::unix::net::UnixStream::connect(&srv.path).unwrap();
            s.write_all(&Header::command(1, 2, 32).encode()).unwrap();
        } else {
            session(&srv, &ram, cycle);
        }
    }

    let sync = Client::connect(&srv.path, ClientConfig::default()).unwrap();
    sync.device_info().unwrap();
    assert_eq!(fd_count(), before, "descriptors leaked");
    assert_eq!(maps_named("reconnect-ram"), 0, "mmaps leaked");
    let (a, d) = (srv.device.attaches.load(Ordering::Acquire), srv.device.detaches.load(Ordering::Acquire));
    assert_eq!((a, d), (102, 101), "every connection but the live one detached");
}
