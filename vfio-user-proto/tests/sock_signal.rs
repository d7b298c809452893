//! A signal that interrupts the wait for the rest of a message (poll() returns EINTR) is not the peer
//! stalling: the message must still arrive whole. Found by the `vfio_user_server` fuzz target, where
//! libFuzzer's SIGALRM made the server drop a client in the middle of a message.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use vfio_user_proto::sock::{recv_message, RecvLimits};
use vfio_user_proto::wire::{command, Header};

extern "C" fn ignore(_signal: libc::c_int) {}

#[test]
fn a_signal_while_waiting_for_the_rest_of_a_message_does_not_drop_it() {
    // SAFETY: installs a handler that does nothing, for SIGUSR1 only, without SA_RESTART so the waiting
    // poll() sees EINTR; the sigaction struct is fully initialised (zeroed, then an empty mask).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ignore as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let (mut tx, rx) = UnixStream::pair().expect("socketpair");
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        // SAFETY: pthread_self has no preconditions.
        tid_tx.send(unsafe { libc::pthread_self() }).expect("send thread id");
        let limits = RecvLimits { max_msg_size: 4096, max_fds: 1, stall_timeout: Duration::from_secs(3) };
        recv_message(&rx, &limits)
    });
    let tid = tid_rx.recv().expect("thread id");
    let mut first = Header::command(7, command::DEVICE_RESET, 16).encode().to_vec();
    first.extend_from_slice(&[1; 8]);
    tx.write_all(&first).expect("first half");
    // The reader now waits inside the message for the other 8 bytes.
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: `tid` is the reader thread, alive until joined below; SIGUSR1 has a handler installed.
    assert_eq!(unsafe { libc::pthread_kill(tid, libc::SIGUSR1) }, 0);
    std::thread::sleep(Duration::from_millis(200));
    tx.write_all(&[2; 8]).expect("second half");
    let msg = reader.join().expect("reader thread").expect("the whole message");
    assert_eq!(msg.header.msg_id, 7);
    assert_eq!(msg.payload, [[1u8; 8], [2u8; 8]].concat());
}

/// The same for the buffered reader the server and client use: EINTR inside a message is "nothing yet",
/// and the message still arrives whole.
#[test]
fn a_signal_inside_a_message_does_not_drop_it_from_the_buffered_reader() {
    use vfio_user_proto::frame_reader::{FrameLimits, FrameReader, Wait};
    // SAFETY: as above: a do-nothing handler for SIGUSR1, no SA_RESTART, fully initialised sigaction.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ignore as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let (mut tx, rx) = UnixStream::pair().expect("socketpair");
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        // SAFETY: pthread_self has no preconditions.
        tid_tx.send(unsafe { libc::pthread_self() }).expect("send thread id");
        let limits = FrameLimits { max_msg_size: 4096, max_fds: 1, stall_timeout: Duration::from_secs(3) };
        let mut r = FrameReader::new(limits);
        let mut interrupted = 0;
        loop {
            match r.next(&rx, Wait::Block) {
                Ok(Some(m)) => return Ok((m, interrupted)),
                Ok(None) => interrupted += 1,
                Err(e) => return Err(e),
            }
        }
    });
    let tid = tid_rx.recv().expect("thread id");
    let mut first = Header::command(9, command::DEVICE_RESET, 16).encode().to_vec();
    first.extend_from_slice(&[3; 8]);
    tx.write_all(&first).expect("first half");
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: `tid` is the reader thread, alive until joined below; SIGUSR1 has a handler installed.
    assert_eq!(unsafe { libc::pthread_kill(tid, libc::SIGUSR1) }, 0);
    std::thread::sleep(Duration::from_millis(200));
    tx.write_all(&[4; 8]).expect("second half");
    let (msg, interrupted) = reader.join().expect("reader thread").expect("the whole message");
    assert_eq!(msg.header.msg_id, 9);
    assert_eq!(msg.payload, [[3u8; 8], [4u8; 8]].concat());
    assert!(interrupted >= 1, "the signal reached the blocking read");
}
