//! A recording server: every client message and reply, and every DMA access of the device with the data it
//! read, lands in the session file in the order the device saw them.

mod common;

use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::{cmd, memfd, regs, status, wait_for, Running, TempDir};
use vfio_user_proto::device::region;
use vfio_user_proto::record::{content_hash, Record, Recorder, RecordingReader};
use vfio_user_proto::wire::command;
use vfio_user_proto::{Client, ClientConfig, DmaProt, ServerConfig};

fn w32(c: &Client, off: u64, v: u32) {
    c.region_write(region::BAR0, off, &v.to_le_bytes()).unwrap();
}
fn r32(c: &Client, off: u64) -> u32 {
    let mut b = [0u8; 4];
    c.region_read(region::BAR0, off, &mut b).unwrap();
    u32::from_le_bytes(b)
}
fn job(c: &Client, command: u32, addr: u64, len: u32) {
    w32(c, regs::DMA_ADDR_LO, addr as u32);
    w32(c, regs::DMA_ADDR_HI, (addr >> 32) as u32);
    w32(c, regs::DMA_LEN, len);
    w32(c, regs::DMA_CMD, command);
    assert!(wait_for(Duration::from_secs(10), || r32(c, regs::DMA_STATUS) != status::BUSY));
}

#[test]
fn a_session_records_messages_replies_and_device_dma_in_causal_order() {
    let dir = TempDir::new();
    let recorder = Recorder::new(&dir.0, "test", serde_json::json!({"device": "test"})).unwrap();
    let srv = Running::start(ServerConfig { recorder: Some(recorder.clone()), ..Default::default() });
    {
        let c = Client::connect(&srv.path, ClientConfig::default()).unwrap();
        let ram = memfd("rec-ram", 0x2000, true);
        ram.write_all_at(&[7u8; 0x40], 0x1000).unwrap();
        c.dma_map_fd(0x10_0000, 0x2000, ram.as_fd(), 0, DmaProt::READ_WRITE).unwrap();
        job(&c, cmd::SUM, 0x10_1000, 0x40);
        w32(&c, regs::FILL_BYTE, 0x5a);
        job(&c, cmd::FILL, 0x10_0000, 0x20);
    }
    assert!(wait_for(Duration::from_secs(5), || recorder.current().is_none()), "the session ends with the client");
    let f = std::fs::File::open(dir.0.join("test-1.vfurec")).unwrap();
    let (header, records, truncated) = RecordingReader::new(f).unwrap().records().unwrap();
    assert_eq!((header["device"].as_str(), header["session"].as_u64()), (Some("test"), Some(1)));
    assert!(!truncated);

    // Every message is answered by the next reply of its id, and no reply precedes its message.
    let mut open = std::collections::HashMap::new();
    for r in &records {
        match r {
            Record::Message { header, .. } => assert!(open.insert(header.msg_id, header.command).is_none()),
            Record::Reply { header, .. } => assert_eq!(open.remove(&header.msg_id), Some(header.command)),
            _ => {}
        }
    }
    assert!(open.is_empty());
    let map = records.iter().find_map(|r| match r {
        Record::Message { header, fds, .. } if header.command == command::DMA_MAP => Some(*fds),
        _ => None,
    });
    assert_eq!(map, Some(1), "the map's fd is counted");
    // The device's read of the SUM job comes after the DMA_CMD write that started it, with its data.
    let cmd_write = records
        .iter()
        .position(|r| {
            matches!(r, Record::Message { header, payload, .. }
            if header.command == command::REGION_WRITE && payload[0..8] == regs::DMA_CMD.to_le_bytes())
        })
        .unwrap();
    let read = records.iter().position(|r| matches!(r, Record::DmaRead { .. })).unwrap();
    assert!(read > cmd_write);
    assert_eq!(records[read], Record::DmaRead { iova: 0x10_1000, data: vec![7; 0x40] });
    assert!(records.contains(&Record::DmaWrite { iova: 0x10_0000, len: 0x20, hash: content_hash(&[0x5a; 0x20]) }));
}
