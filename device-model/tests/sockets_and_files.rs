//! What the device model process hands out and creates, seen from outside: the sockets' modes whatever the
//! umask, and the RcvArray file a client gets, which it cannot shrink under the device.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use vfio_user_proto::device::region;
use vfio_user_proto::{Client, ClientConfig};

mod common;

use common::DeviceModel;

fn mode(path: &Path) -> u32 {
    let m = std::fs::symlink_metadata(path).unwrap();
    assert!(m.file_type().is_socket(), "{} is a socket", path.display());
    m.permissions().mode() & 0o7777
}

#[test]
fn every_socket_has_the_mode_asked_for_whatever_the_umask() {
    // (umask the process starts with, --socket-mode, the vfio-user sockets' mode). The control socket is
    // 0600 in every case.
    let cases: &[(&str, Option<&str>, u32)] =
        &[("000", None, 0o600), ("022", None, 0o600), ("000", Some("0660"), 0o660), ("077", Some("0660"), 0o660)];
    for (i, &(umask, socket_mode, want)) in cases.iter().enumerate() {
        let mut args = vec!["--hfi1", "hfi1.sock", "--irdma", "irdma.sock", "--control", "control.sock"];
        if let Some(m) = socket_mode {
            args.extend(["--socket-mode", m]);
        }
        let dm = DeviceModel::start_with_umask(&format!("files-mode{i}"), umask, &args);
        for (name, want) in [("hfi1.sock", want), ("irdma.sock", want), ("control.sock", 0o600)] {
            let path = dm.wait_for(name);
            assert_eq!(mode(&path), want, "{name}, umask {umask}, --socket-mode {socket_mode:?}");
        }
        let names: Vec<String> =
            std::fs::read_dir(&dm.dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        assert_eq!(names.len(), 3, "nothing but the three sockets: {names:?}");
    }
}

/// A client holds the RcvArray's file read-write (it maps it): shrinking it would make the device's next
/// access to the mapping a SIGBUS that kills every device of the process; growing it is refused alike.
#[test]
fn a_client_cannot_resize_the_rcvarray_file_and_the_device_places_data_through_it_afterwards() {
    let dm = DeviceModel::start_with_umask("files-rcvarray", "022", &["--hfi1", "hfi1.sock"]);
    let sock = dm.wait_for("hfi1.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    let client = loop {
        match Client::connect(&sock, ClientConfig::default()) {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "connect: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let bar0 = client.region_info(region::BAR0).unwrap();
    let fd = bar0.fd.expect("the RcvArray is offered for mmap").fd;
    let size = rustix::fs::fstat(&*fd).unwrap().st_size as u64;
    // memfd_create(2): a change a seal forbids fails with EPERM.
    for (what, len) in [("shrink to nothing", 0), ("shrink by a page", size - 4096), ("grow", size + 4096)] {
        assert_eq!(rustix::fs::ftruncate(&*fd, len), Err(Errno::PERM), "{what}");
    }
    assert_eq!(rustix::fs::fcntl_add_seals(&*fd, rustix::fs::SealFlags::FUTURE_WRITE), Err(Errno::PERM));
    assert_eq!(rustix::fs::fstat(&*fd).unwrap().st_size as u64, size);
    drop(client);

    // The device still works through the same file: the hfi1 demo programs the RcvArray through its mapping
    // and checks every byte placed.
    use udriver::demo::hfi1::{hfi1_demo, Hfi1DemoOptions};
    let dev = udriver::backend::vfio_user::VfioUserBackend::connect(&sock, true).unwrap();
    let rep = hfi1_demo(std::sync::Arc::new(dev), &Hfi1DemoOptions::default());
    assert!(rep.ok, "{}", rep.render());
}
