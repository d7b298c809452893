//! Sessions of udriver's demos recorded by the device model's server, replayed on a fresh device model: the
//! replies match; a recording whose DMA contents were changed does not replay clean (docs/observe.md).

mod irdma_common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use device_model::cli::DeviceKind;
use device_model::control::{handle_request, ControlTarget};
use device_model::device_options::DeviceOptions;
use device_model::replay::{load, replay, replay_file};
use testbed::Served;
use udriver::access::DeviceAccess;
use udriver::backend::vfio_user::VfioUserBackend;
use udriver::demo::hfi1::{hfi1_demo, Hfi1DemoOptions};
use udriver::demo::irdma::{irdma_demo, IrdmaDemoOptions};
use vfio_user_proto::record::{Record, Recorder};
use vfio_user_proto::server::ServerConfig;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rig-rec-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Records one session of `drive` on a fresh device of `kind`; returns the recording's path.
fn record(
    kind: DeviceKind,
    dir: &Path,
    drive: impl FnOnce(Arc<dyn DeviceAccess>, &Arc<device_model::pci::Function>),
) -> PathBuf {
    let options = DeviceOptions::new(kind);
    let function = options.build(&[]).unwrap();
    let recorder = Recorder::new(dir, kind.name(), options.header(&[])).unwrap();
    assert!(function.probe().set_recorder(recorder.clone()));
    {
        let served = Served::with_config(
            function.clone(),
            ServerConfig { recorder: Some(recorder.clone()), ..Default::default() },
        )
        .unwrap();
        let access: Arc<dyn DeviceAccess> = Arc::new(VfioUserBackend::connect(served.path(), true).unwrap());
        drive(access, &function);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while recorder.current().is_some() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    dir.join(format!("{}-1.vfurec", kind.name()))
}

#[test]
fn a_recorded_irdma_demo_with_control_commands_replays_clean() {
    let dir = temp_dir("irdma");
    let path = record(DeviceKind::Irdma, &dir, |access, function| {
        let report = irdma_demo(access.clone(), &IrdmaDemoOptions::default());
        assert!(report.ok, "{}", report.render());
        // A control command in the session is replayed where it was, and its reply compared.
        let target: Arc<dyn ControlTarget> = function.clone();
        let line = br#"{"device":"irdma","cmd":"classify","src_ip":"10.0.0.2","dst_ip":"10.0.0.1","src_port":5000,"dst_port":4791,"syn":true}"#;
        assert_eq!(handle_request(&[target], line)["ok"], true);
    });
    let r = replay_file(&path, None).unwrap();
    assert!(r.ok(), "{:#?}", r.mismatches);
    assert!(r.messages > 50 && r.dma_reads > 10 && r.dma_writes > 10, "{r:?}");
    assert_eq!(r.control, 1);
    // The reset of the detach after the client left is no access of the session.
    let (_, records, _) = load(&path).unwrap();
    let last_reply = records.iter().rposition(|r| matches!(r, Record::Reply { .. })).unwrap();
    assert!(!records[last_reply..].contains(&Record::DeviceAccess));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_recorded_hfi1_demo_with_the_rcvarray_mapped_replays_clean() {
    let dir = temp_dir("hfi1");
    let path = record(DeviceKind::Hfi1, &dir, |access, _| {
        let report = hfi1_demo(access, &Hfi1DemoOptions::default());
        assert!(report.ok, "{}", report.render());
    });
    let r = replay_file(&path, None).unwrap();
    assert!(r.ok(), "{:#?}", r.mismatches);
    assert!(r.shared_reads > 100, "the mapped RcvArray's stores came from the recording: {r:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_client_write_after_a_completion_finds_the_replayed_device_as_far_along_as_the_recorded_one() {
    use device_model::irdma::regs::*;
    use device_model::pci::regs::{PCI_MSIX_ENTRY_SIZE, PCI_MSIX_ENTRY_VECTOR_CTRL};
    use device_model::pci::MSIX_BAR;
    use udriver::dma::DmaPool;
    use udriver::irdma::ccq::irdma_sc_ccq_arm;
    use udriver::irdma::process::irdma_manage_qhash;
    use udriver::irdma::*;
    // The MSI-X table at 0 of its BAR, the PBA on the page after it (docs/pci.md).
    const VECTOR_1_CONTROL: u64 = (PCI_MSIX_ENTRY_SIZE + PCI_MSIX_ENTRY_VECTOR_CTRL) as u64;
    const PBA: u64 = 0x1000;
    let dir = temp_dir("settle");
    let path = record(DeviceKind::Irdma, &dir, |access, function| {
        let idle = || {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !function.engine().idle() && std::time::Instant::now() < until {
                std::thread::yield_now();
            }
        };
        let config = IrdmaDevConfig {
            hw_attrs: IrdmaHwAttrs { pe_ready_delay: std::time::Duration::from_millis(1), ..Default::default() },
            sq_size: 16,
            ccq_size: 16,
            wait_mode: IrdmaCqpWaitMode::Poll,
            ..Default::default()
        };
        access.pci_enable_device().unwrap();
        let dev = IrdmaDev::new(Arc::new(DmaPool::new(access.clone(), false)), config).unwrap();
        // The CCQ's CEQ 0 on MSI-X vector 1 (icrdma_cfg_ceq: CAUSE_ENA, no ITR), armed once.
        access.enable_msix(2).unwrap();
        let ceqctl = IRDMA_GLINT_CEQCTL_CAUSE_ENA.put(1)
            | IRDMA_GLINT_CEQCTL_ITR_INDX.put(dev::IRDMA_GLINT_CEQCTL_ITR_INDX_NOITR.into())
            | IRDMA_GLINT_CEQCTL_MSIX_INDX.put(1);
        access.write32(0, IRDMA_GLINT_CEQCTL, ceqctl as u32).unwrap();
        irdma_sc_ccq_arm(&dev.lock().ccq).unwrap();
        let entry = irdma_common::listener(IrdmaQuadHashManageType::IrdmaQhashManageTypeAdd, 4791);
        irdma_manage_qhash(&dev, &entry).unwrap();
        // The CQE is in and the device's interrupt delivered; only then does the client mask the vector.
        idle();
        access.write32(MSIX_BAR, VECTOR_1_CONTROL, 1).unwrap();
        access.read32(0, IRDMA_CQPTAIL).unwrap();
        assert_eq!(access.read32(MSIX_BAR, PBA).unwrap() & 2, 0, "the interrupt came before the mask");
        access.write32(MSIX_BAR, VECTOR_1_CONTROL, 0).unwrap();
        let delete = IrdmaQhashTableInfo { manage: IrdmaQuadHashManageType::IrdmaQhashManageTypeDelete, ..entry };
        irdma_manage_qhash(&dev, &delete).unwrap();
        dev.destroy().unwrap();
    });
    // Replayed, the mask must not overtake the completion it followed: else the interrupt would be pending.
    let r = replay_file(&path, None).unwrap();
    assert!(r.ok(), "{:#?}", r.mismatches);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_doorbell_that_arrived_before_a_step_of_the_device_but_was_handled_after_it_is_replayed_after_it() {
    use device_model::irdma::regs::IRDMA_CQPDB;
    use vfio_user_proto::wire::command;
    let dir = temp_dir("order");
    let path = record(DeviceKind::Irdma, &dir, |access, _| {
        assert!(irdma_demo(access, &IrdmaDemoOptions::default()).ok);
    });
    let (header, mut records, _) = load(&path).unwrap();
    // A CQPDB write right after the worker's last look at CQPDB, handled (its access) right after it.
    let is_doorbell = |r: &Record| match r {
        Record::Message { header, payload, .. } if header.command == command::REGION_WRITE => {
            payload.len() >= 16 && payload[..8] == IRDMA_CQPDB.to_le_bytes() && payload[8..12] == 0u32.to_le_bytes()
        }
        _ => false,
    };
    let m = (1..records.len() - 1)
        .find(|&k| {
            is_doorbell(&records[k]) && records[k - 1] == Record::DeviceStep && records[k + 1] == Record::DeviceAccess
        })
        .expect("a doorbell after a device step");
    // What a connection thread preempted between logging the doorbell and handling it records: the step
    // between the two. The worker's look did not see the doorbell, so the replay must not let it.
    records.swap(m - 1, m);
    let r = replay(&header, &records, None).unwrap();
    assert!(r.ok(), "{:#?}", r.mismatches);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_recording_with_other_dma_contents_does_not_replay_clean() {
    let dir = temp_dir("tampered");
    let path = record(DeviceKind::Irdma, &dir, |access, _| {
        assert!(irdma_demo(access, &IrdmaDemoOptions::default()).ok);
    });
    let (header, mut records, _) = load(&path).unwrap();
    // The first WQE the device fetched after the CQP create: its opcode byte (qw3 bits 37:32) flipped.
    let wqe = records
        .iter_mut()
        .filter_map(|r| match r {
            Record::DmaRead { data, .. } if data.len() == 64 => Some(data),
            _ => None,
        })
        .nth(1)
        .unwrap();
    wqe[28] ^= 0x3f;
    let r = replay(&header, &records, None).unwrap();
    assert!(!r.ok(), "the changed WQE must change what the device does");
    assert!(!r.mismatches.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
