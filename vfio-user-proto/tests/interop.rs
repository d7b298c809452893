//! Interoperability with rust-vmm `vfio_user` 0.1.7, both ways.

mod common;

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{cmd, memfd, regs, status, wait_for, Running, TempDir, BAR2_SIZE};
use rustix::event::{eventfd, EventfdFlags};
use vfio_bindings::bindings::vfio::{vfio_region_info, vfio_region_sparse_mmap_area};
use vfio_user_proto::device::{irq, irq_flags, region, region_flags, SparseArea};
use vfio_user_proto::wire::irq_set_flags as f;
use vfio_user_proto::{Client, ClientConfig, DmaProt, ServerConfig};

#[test]
fn rust_vmm_client_drives_our_server() {
    let srv = Running::start(ServerConfig::default());
    let mut c = vfio_user::Client::new(&srv.path).expect("rust-vmm client connects and reads all regions");
    let bar2 = c.region(2).unwrap();
    assert_eq!(bar2.size, BAR2_SIZE);
    assert!(bar2.file_offset.is_some());
    assert_eq!((bar2.sparse_areas[0].offset, bar2.sparse_areas[0].size), (0x1000, 0x1000));

    c.region_write(region::BAR0, regs::SCRATCH, &0x1234_5678u32.to_le_bytes()).unwrap();
    let mut b = [0u8; 4];
    c.region_read(region::BAR0, regs::SCRATCH, &mut b).unwrap();
    assert_eq!(u32::from_le_bytes(b), 0x1234_5678);

    // Guest RAM as QEMU shares it: a sealed memfd; the device DMAs through the mmap.
    let ram = memfd("interop-ram", 0x10000, true);
    ram.write_all_at(&[3; 0x100], 0x2000).unwrap();
    c.dma_map(0x2000, 0x100_0000, 0x1000, ram.as_raw_fd()).unwrap();
    for (off, v) in
        [(regs::DMA_ADDR_LO, 0x100_0000u32), (regs::DMA_ADDR_HI, 0), (regs::DMA_LEN, 0x100), (regs::DMA_CMD, cmd::SUM)]
    {
        c.region_write(region::BAR0, off, &v.to_le_bytes()).unwrap();
    }
    assert!(wait_for(Duration::from_secs(5), || {
        c.region_read(region::BAR0, regs::DMA_STATUS, &mut b).unwrap();
        u32::from_le_bytes(b) == status::DONE
    }));
    c.region_read(region::BAR0, regs::DMA_RESULT, &mut b).unwrap();
    assert_eq!(u32::from_le_bytes(b), 3 * 0x100);

    let info = c.get_irq_info(irq::MSIX).unwrap();
    assert_eq!(info.count, 4);
    let efd = eventfd(0, EventfdFlags::NONBLOCK).unwrap();
    c.set_irqs(irq::MSIX, f::DATA_EVENTFD | f::ACTION_TRIGGER, 0, 1, &[efd.as_raw_fd()]).unwrap();
    c.set_irqs(irq::MSIX, f::DATA_NONE | f::ACTION_TRIGGER, 0, 1, &[]).unwrap();
    let mut cnt = [0u8; 8];
    assert_eq!(rustix::io::read(&efd, &mut cnt).unwrap(), 8);

    c.dma_unmap(0x100_0000, 0x1000).unwrap();
    c.reset().unwrap();
    assert_eq!(srv.device.resets.load(Ordering::Acquire), 1);
    c.shutdown().unwrap();
}

/// What the rust-vmm server's backend saw.
#[derive(Default)]
struct Backend {
    bar0: Vec<u8>,
    maps: Vec<(u64, u64, u64, bool)>,
    unmaps: Vec<(u64, u64)>,
    irq_fds: Vec<File>,
    resets: usize,
}

impl vfio_user::ServerBackend for Backend {
    fn region_read(&mut self, _region: u32, offset: u64, data: &mut [u8]) -> std::io::Result<()> {
        let o = offset as usize;
        data.copy_from_slice(self.bar0.get(o..o + data.len()).ok_or(std::io::ErrorKind::InvalidInput)?);
        Ok(())
    }
    fn region_write(&mut self, _region: u32, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let o = offset as usize;
        self.bar0.get_mut(o..o + data.len()).ok_or(std::io::ErrorKind::InvalidInput)?.copy_from_slice(data);
        Ok(())
    }
    fn dma_map(
        &mut self,
        _f: vfio_user::DmaMapFlags,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<File>,
    ) -> std::io::Result<()> {
        self.maps.push((address, size, offset, fd.is_some()));
        Ok(())
    }
    fn dma_unmap(&mut self, _f: vfio_user::DmaUnmapFlags, address: u64, size: u64) -> std::io::Result<()> {
        self.unmaps.push((address, size));
        Ok(())
    }
    fn reset(&mut self) -> std::io::Result<()> {
        self.resets += 1;
        Ok(())
    }
    fn set_irqs(&mut self, _index: u32, _flags: u32, _start: u32, _count: u32, fds: Vec<File>) -> std::io::Result<()> {
        self.irq_fds.extend(fds);
        Ok(())
    }
}

#[test]
fn our_client_drives_a_rust_vmm_server() {
    let dir = TempDir::new();
    let path = dir.0.join("rust-vmm.sock");
    let bar2 = memfd("interop-bar2", 0x2000, false);
    let rw = region_flags::READ | region_flags::WRITE;
    let mk = |index: u32, size: u64, flags: u32| vfio_region_info {
        argsz: 32,
        flags,
        index,
        cap_offset: 0,
        size,
        offset: 0,
    };
    let regions = vec![
        vfio_user::ServerRegion { region_info: mk(0, 0x1000, rw), sparse_areas: vec![], mmap_fd: None },
        vfio_user::ServerRegion {
            region_info: mk(1, 0x2000, rw | region_flags::MMAP),
            sparse_areas: vec![vfio_user::SparseArea {
                area: vfio_region_sparse_mmap_area { offset: 0x1000, size: 0x1000 },
            }],
            mmap_fd: Some(bar2.as_raw_fd()),
        },
    ];
    let irqs = vec![vfio_user::IrqInfo { index: 0, flags: irq_flags::EVENTFD, count: 2 }];
    let server = vfio_user::Server::new(&path, true, irqs, regions).unwrap();
    let t = std::thread::spawn(move || {
        let mut backend = Backend { bar0: vec![0; 0x1000], ..Default::default() };
        server.run(&mut backend).unwrap();
        backend
    });

    let c = Client::connect(&path, ClientConfig::default()).unwrap();
    assert_eq!(c.server_caps().max_msg_fds, 1);
    let info = c.device_info().unwrap();
    assert_eq!((info.num_regions, info.num_irqs), (2, 1));
    let r1 = c.region_info(1).unwrap();
    assert_eq!(r1.sparse_areas, vec![SparseArea { offset: 0x1000, size: 0x1000 }]);
    assert!(r1.fd.is_some());
    assert_eq!(c.irq_info(0).unwrap().count, 2);

    c.region_write(0, 0x10, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    let mut b = [0u8; 8];
    c.region_read(0, 0x10, &mut b).unwrap();
    assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8]);
    // Its server does not offer REGION_WRITE_MULTI: our client falls back to single writes.
    c.region_write_multi(&[(0, 0x20, &[9; 4]), (0, 0x24, &[10; 4])]).unwrap();
    c.region_read(0, 0x20, &mut b).unwrap();
    assert_eq!(b, [9, 9, 9, 9, 10, 10, 10, 10]);

    let ram = memfd("interop-client-ram", 0x4000, true);
    c.dma_map_fd(0x10_0000, 0x4000, ram.as_fd(), 0, DmaProt::READ_WRITE).unwrap();
    c.dma_unmap(0x10_0000, 0x4000).unwrap();
    // Two vectors with a server taking one fd per message: two SET_IRQS.
    let efds: Vec<OwnedFd> = (0..2).map(|_| eventfd(0, EventfdFlags::NONBLOCK).unwrap()).collect();
    c.set_irqs(0, f::DATA_EVENTFD | f::ACTION_TRIGGER, 0, &[efds[0].as_fd(), efds[1].as_fd()]).unwrap();
    c.reset().unwrap();
    drop(c);

    let backend = t.join().unwrap();
    assert_eq!(backend.maps, vec![(0x10_0000, 0x4000, 0, true)]);
    assert_eq!(backend.unmaps, vec![(0x10_0000, 0x4000)]);
    assert_eq!(backend.irq_fds.len(), 2);
    assert_eq!(backend.resets, 1);
}
