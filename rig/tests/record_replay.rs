//! Sessions of udriver's demos recorded by the device model's server, replayed on a fresh device model: the
//! replies match; a recording whose DMA contents were changed does not replay clean (docs/observe.md).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use device_model::build::DeviceOptions;
use device_model::cli::DeviceKind;
use device_model::control::{handle_request, ControlTarget};
use device_model::replay::{load, replay, replay_file};
use rig::Served;
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
    function.probe().set_recorder(Some(recorder.clone()));
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
