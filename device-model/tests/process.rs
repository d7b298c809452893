//! The device model as a separate process, reached over its sockets the way QEMU and udriver reach it.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use device_model::hfi1::regs::{RCV_ARRAY, RCV_ARRAY_CNT, RCV_CONTEXTS};
use device_model::irdma::regs::{IRDMA_CCQPHIGH, IRDMA_CCQPLOW, IRDMA_CCQPSTATUS, IRDMA_GLPE_CPUSTATUS0};
use vfio_user_proto::device::region;
use vfio_user_proto::{Client, ClientConfig, DmaProt};

mod common;

use common::DeviceModel;

/// A device model serving hfi1, irdma and control sockets, once each of them answers.
fn start(tag: &str) -> DeviceModel {
    let dm = DeviceModel::start(
        &format!("process-{tag}"),
        &["--hfi1", "hfi1.sock", "--irdma", "irdma.sock", "--control", "control.sock"],
    );
    for s in ["hfi1.sock", "irdma.sock", "control.sock"] {
        dm.wait_for(s);
    }
    // The probe connections above were clients too: the server serves its clients one after another, so
    // the next one is answered only once it has seen them go.
    dm
}

fn client(dm: &DeviceModel, name: &str) -> Client {
    connect(&dm.sock(name))
}

fn control(dm: &DeviceModel, request: &str) -> serde_json::Value {
    let mut s = UnixStream::connect(dm.sock("control.sock")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    writeln!(s, "{request}").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

/// Connects, retrying while the server is still finishing the previous client.
fn connect(path: &Path) -> Client {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Client::connect(path, ClientConfig::default()) {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("connect {}: {e}", path.display()),
        }
    }
}

fn enable(c: &Client) {
    // Memory space + bus master, as pci_enable_device() + pci_set_master() do.
    c.region_write(region::CONFIG, 4, &6u16.to_le_bytes()).unwrap();
}

fn read64(c: &Client, off: u64) -> u64 {
    let mut b = [0u8; 8];
    c.region_read(region::BAR0, off, &mut b).unwrap();
    u64::from_le_bytes(b)
}

fn read32(c: &Client, off: u64) -> u32 {
    let mut b = [0u8; 4];
    c.region_read(region::BAR0, off, &mut b).unwrap();
    u32::from_le_bytes(b)
}

#[test]
fn both_functions_answer_with_their_identity_and_chip_registers() {
    let dm = start("identity");
    let h = client(&dm, "hfi1.sock");
    let mut ids = [0u8; 4];
    h.region_read(region::CONFIG, 0, &mut ids).unwrap();
    assert_eq!(ids, [0x36, 0x1b, 0x00, 0x11], "hfi1 is 1b36:1100");
    enable(&h);
    assert_eq!(read64(&h, RCV_ARRAY_CNT), 4096);
    assert_eq!(read64(&h, RCV_CONTEXTS), 8);
    let bar0 = h.region_info(region::BAR0).unwrap();
    assert_eq!(bar0.sparse_areas.len(), 1, "the RcvArray is offered as a sparse mmap area");
    assert_eq!(bar0.sparse_areas[0].offset, RCV_ARRAY);
    assert!(bar0.fd.is_some());
    drop(h);

    let i = client(&dm, "irdma.sock");
    i.region_read(region::CONFIG, 0, &mut ids).unwrap();
    assert_eq!(ids, [0x36, 0x1b, 0x01, 0x11], "irdma is 1b36:1101");
    enable(&i);
    assert_eq!(read32(&i, IRDMA_GLPE_CPUSTATUS0), 0x80, "PE ready");
}

#[test]
fn a_client_killed_in_the_middle_of_a_message_leaves_the_next_client_served() {
    let dm = start("midmsg");
    // Half a header, then gone.
    let mut raw = UnixStream::connect(dm.sock("hfi1.sock")).unwrap();
    raw.write_all(&[1, 0, 1, 0, 0x40, 0, 0, 0]).unwrap();
    drop(raw);
    let c = client(&dm, "hfi1.sock");
    enable(&c);
    assert_eq!(read64(&c, RCV_ARRAY_CNT), 4096);
}

#[test]
fn a_client_killed_while_a_cqp_create_runs_leaves_a_reset_device_for_the_next_client() {
    let dm = start("midcmd");
    {
        let c = client(&dm, "irdma.sock");
        enable(&c);
        let mem = rustix::fs::memfd_create("ctx", rustix::fs::MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&mem, 0x10000).unwrap();
        rustix::fs::fcntl_add_seals(&mem, rustix::fs::SealFlags::SHRINK).unwrap();
        use std::os::fd::AsFd;
        c.dma_map_fd(0x10_0000, 0x10000, mem.as_fd(), 0, DmaProt::READ_WRITE).unwrap();
        // A host context that asks for an SQ the device then reads: create starts, and the client dies.
        c.region_write(region::BAR0, IRDMA_CCQPHIGH, &0u32.to_le_bytes()).unwrap();
        c.region_write(region::BAR0, IRDMA_CCQPLOW, &0x10_0000u32.to_le_bytes()).unwrap();
    }
    let c = client(&dm, "irdma.sock");
    enable(&c);
    assert_eq!(read32(&c, IRDMA_CCQPSTATUS), 0, "the next client sees a device without a CQP");
    assert_eq!(read32(&c, IRDMA_GLPE_CPUSTATUS0), 0x80);
    let dump = control(&dm, r#"{"device":"irdma","cmd":"dump"}"#);
    assert_eq!(dump["ok"], true, "{dump}");
}

#[test]
fn the_control_socket_lists_both_devices_and_rejects_garbage() {
    let dm = start("control");
    let list = control(&dm, r#"{"cmd":"list"}"#);
    let names: Vec<&str> = list["result"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["hfi1", "irdma"]);
    let bad = control(&dm, "{not json");
    assert_eq!(bad["ok"], false);
}

/// The real driver over the process's socket: the hfi1 demo programs the RcvArray and flows, sends TID RDMA
/// data through the loopback path and checks every byte in its buffers; a wrong generation or sequence sets
/// its status bit and places nothing; a READ crossing its flow's PSN space moves to the next generation.
#[test]
fn the_driver_places_and_verifies_tid_rdma_data_through_the_separate_process() {
    use udriver::access::DeviceAccess;
    use udriver::demo::hfi1::{hfi1_demo, Hfi1DemoOptions};
    let dm = start("hfi1-demo");
    for map_bars in [true, false] {
        let dev: std::sync::Arc<dyn DeviceAccess> = std::sync::Arc::new(
            udriver::backend::vfio_user::VfioUserBackend::connect(&dm.sock("hfi1.sock"), map_bars).unwrap(),
        );
        let rep = hfi1_demo(dev.clone(), &Hfi1DemoOptions::default());
        assert!(rep.ok, "map_bars={map_bars}\n{}", rep.render());
        // Still connected (a disconnect resets the device): the device's own view agrees.
        let dump = control(&dm, r#"{"device":"hfi1","cmd":"dump"}"#);
        let counters = &dump["result"]["counters"];
        let mismatches = (counters["rx_gen_mismatch"].as_u64(), counters["rx_seq_mismatch"].as_u64());
        // The wrong-generation packet, and the SYNC step's two packets of the generation its flow left.
        assert_eq!(mismatches, (Some(3), Some(1)), "map_bars={map_bars}");
        assert!(dump["result"]["rcv_array"].as_array().is_none_or(|a| a.is_empty()), "nothing left programmed");
        drop(dev);
    }
}

/// Several threads share one CQP with a 16-entry SQ (so the backlog is used) through the process: both rings
/// wrap many times, every completion is seen, and the quad-hash table ends empty.
#[test]
fn qhash_batches_wrap_both_rings_through_the_separate_process() {
    let dm = start("irdma-stress");
    let dev: std::sync::Arc<dyn udriver::access::DeviceAccess> = std::sync::Arc::new(
        udriver::backend::vfio_user::VfioUserBackend::connect(&dm.sock("irdma.sock"), true).unwrap(),
    );
    let rep = udriver::demo::irdma::irdma_stress(dev.clone(), Duration::from_secs(2), 3);
    assert!(rep.ok, "{}", rep.render());
    let step = |name: &str| rep.steps.iter().find(|s| s.name == name).map(|s| s.detail.clone()).unwrap();
    let rings = step("create CQP and CCQ (CREATE_CQ)");
    let completions = step("every completion seen")["completions"].as_u64().unwrap();
    let ccq_size = rings["ccq_size"].as_u64().unwrap();
    assert!(ccq_size >= rings["sq_size"].as_u64().unwrap());
    assert!(completions > 4 * ccq_size, "{completions} completions through a {ccq_size}-entry CCQ: both rings wrapped");
    // Torn down by the stress itself, still connected: the device holds no CQP and no quad-hash entry.
    let dump = control(&dm, r#"{"device":"irdma","cmd":"dump"}"#);
    assert_eq!(dump["ok"], true);
    assert!(dump["result"]["qhash"]["entries"].as_array().is_some_and(|e| e.is_empty()), "{}", dump["result"]["qhash"]);
    drop(dev);
}

/// The real driver creates the CQP and CCQ, posts qhash add/modify/delete and has segments classified.
#[test]
fn the_driver_manages_qhash_entries_and_classifies_segments_through_the_separate_process() {
    use udriver::demo::irdma::{irdma_demo, IrdmaDemoOptions};
    let dm = start("irdma-demo");
    let dev = udriver::backend::vfio_user::VfioUserBackend::connect(&dm.sock("irdma.sock"), true).unwrap();
    let rep = irdma_demo(std::sync::Arc::new(dev), &IrdmaDemoOptions::default());
    assert!(rep.ok, "{}", rep.render());
}
