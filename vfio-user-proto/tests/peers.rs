//! A peer of another user is closed unserved on a socket whose policy does not admit it, whatever the socket
//! file's mode lets through; the owner's next client is served.

mod common;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::Running;
use vfio_user_proto::server::PeerPolicy;
use vfio_user_proto::test_util::connect_as;
use vfio_user_proto::{Client, ClientConfig, ServerConfig};

const NOBODY: u32 = 65534;

#[test]
fn a_peer_of_another_user_is_closed_unserved_even_through_a_socket_anyone_may_open() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: making a peer of another user needs root");
        return;
    }
    let peers = PeerPolicy::default();
    let srv = Running::start(ServerConfig { peers: peers.clone(), ..ServerConfig::default() });
    // The file mode lets anyone in (loosened behind the server's back, or a socket it did not create).
    std::fs::set_permissions(&srv.path, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::set_permissions(srv.path.parent().unwrap(), std::fs::Permissions::from_mode(0o755)).unwrap();

    let mut stranger = connect_as(&srv.path, NOBODY, NOBODY);
    stranger.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    // Closed before any message: end of stream, not a timeout waiting for our VERSION.
    assert_eq!(stranger.read(&mut buf).expect("the server closes the connection"), 0);
    assert_eq!(peers.refused(), 1);

    let owner = Client::connect(&srv.path, ClientConfig::default()).expect("the owner is served");
    assert!(owner.device_info().is_ok());
    assert_eq!(peers.refused(), 1);
}
