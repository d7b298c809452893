//! Random message streams after VERSION: the server never panics or hangs, answers or closes, and
//! keeps serving the next client.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::raw::Raw;
use common::Running;
use proptest::prelude::*;
use vfio_user_proto::sock::FrameError;
use vfio_user_proto::wire::{Header, HEADER_SIZE};
use vfio_user_proto::ServerConfig;

#[derive(Debug, Clone)]
struct Msg {
    command: u16,
    flags: u32,
    payload: Vec<u8>,
    /// `None`: the true size; `Some`: a size field that lies.
    size: Option<u32>,
}

fn msg() -> impl Strategy<Value = Msg> {
    (
        prop_oneof![0u16..20, any::<u16>()],
        prop_oneof![Just(0u32), Just(1u32 << 4), any::<u32>()],
        proptest::collection::vec(any::<u8>(), 0..80),
        proptest::option::weighted(0.1, any::<u32>()),
    )
        .prop_map(|(command, flags, payload, size)| Msg { command, flags, payload, size })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_messages_never_stop_the_server(msgs in proptest::collection::vec(msg(), 1..12)) {
        let srv = Running::start(ServerConfig {
            dma_timeout: Duration::from_millis(200),
            stall_timeout: Duration::from_millis(200),
            ..Default::default()
        });
        {
            let r = Raw::connect(&srv);
            r.version();
            for m in &msgs {
                let size = m.size.unwrap_or((HEADER_SIZE + m.payload.len()) as u32);
                let h = Header { msg_id: 1, command: m.command, msg_size: size, flags: m.flags, error: 0 };
                // The server may already have closed (a lying size): writes may fail, that is fine.
                let _ = (&r.s).write_all(&h.encode());
                let _ = (&r.s).write_all(&m.payload);
            }
            let _ = r.s.shutdown(std::net::Shutdown::Write);
            // Drain whatever comes back until the server closes; it must close within the bounds.
            let end = Instant::now() + Duration::from_secs(5);
            loop {
                match r.recv() {
                    Ok(_) => prop_assert!(Instant::now() < end, "server keeps talking"),
                    Err(FrameError::Closed) => break,
                    // Closing with our unread bytes in its buffer makes the kernel reset the connection.
                    Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                    Err(e) => prop_assert!(false, "unexpected end: {e}"),
                }
            }
        }
        Raw::connect(&srv).good();
    }
}
