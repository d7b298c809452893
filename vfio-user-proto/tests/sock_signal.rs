//! A signal that interrupts the wait for the rest of a message (poll() returns EINTR) is not the peer
//! stalling: the message must still arrive whole. Found by the `vfio_user_server` fuzz target, where
//! libFuzzer's SIGALRM made the server drop a client in the middle of a message.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use vfio_user_proto::frame_reader::{recv_message, FrameLimits};
use vfio_user_proto::wire::{command, Header};

/// Signals the handler has seen.
static HANDLED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn count(_signal: libc::c_int) {
    HANDLED.fetch_add(1, Ordering::SeqCst);
}

/// The tests of this binary share the handler's count: one at a time.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A guard against hanging, not a measure: each condition below holds within milliseconds.
const HANG_GUARD: Duration = Duration::from_secs(30);

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether the kernel thread `tid` of this process sleeps in poll(): waiting for the rest of the message,
/// where a signal makes poll return EINTR (the handler has no SA_RESTART, and poll is never restarted).
fn sleeps_in_poll(tid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/wchan")).is_ok_and(|w| w.contains("poll"))
        && std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
            .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('S')))
}

/// Installs the counting handler for SIGUSR1, without SA_RESTART.
fn install_handler() {
    // SAFETY: installs a handler that only bumps an atomic, for SIGUSR1 only, without SA_RESTART so the
    // waiting poll() sees EINTR; the sigaction struct is fully initialised (zeroed, then an empty mask).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = count as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
}

/// Sends SIGUSR1 to `thread` once its kernel thread `tid` sleeps in poll, and waits until the handler ran.
fn interrupt_the_wait(thread: libc::pthread_t, tid: libc::pid_t) {
    wait_until("the reader waits in poll inside the message", || sleeps_in_poll(tid));
    let before = HANDLED.load(Ordering::SeqCst);
    // SAFETY: `thread` is the reader thread, alive until joined; SIGUSR1 has a handler installed.
    assert_eq!(unsafe { libc::pthread_kill(thread, libc::SIGUSR1) }, 0);
    wait_until("the handler ran", || HANDLED.load(Ordering::SeqCst) > before);
}

#[test]
fn a_signal_while_waiting_for_the_rest_of_a_message_does_not_drop_it() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    install_handler();
    let (mut tx, rx) = UnixStream::pair().expect("socketpair");
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        // SAFETY: pthread_self and gettid have no preconditions.
        tid_tx.send(unsafe { (libc::pthread_self(), libc::gettid()) }).expect("send thread id");
        let limits = FrameLimits { max_msg_size: 4096, max_fds: 1, stall_timeout: Duration::from_secs(30) };
        recv_message(&rx, &limits)
    });
    let (thread, tid) = tid_rx.recv().expect("thread id");
    let mut first = Header::command(7, command::DEVICE_RESET, 16).encode().to_vec();
    first.extend_from_slice(&[1; 8]);
    tx.write_all(&first).expect("first half");
    // The signal lands while the reader sleeps in poll for the other 8 bytes: poll returns EINTR.
    interrupt_the_wait(thread, tid);
    tx.write_all(&[2; 8]).expect("second half");
    let msg = reader.join().expect("reader thread").expect("the whole message");
    assert_eq!(msg.header.msg_id, 7);
    assert_eq!(msg.payload, [[1u8; 8], [2u8; 8]].concat());
}

/// The same for the buffered reader the server and client use: EINTR inside a message is "nothing yet",
/// and the message still arrives whole.
#[test]
fn a_signal_inside_a_message_does_not_drop_it_from_the_buffered_reader() {
    use vfio_user_proto::frame_reader::{FrameReader, Wait};
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    install_handler();
    let (mut tx, rx) = UnixStream::pair().expect("socketpair");
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        // SAFETY: pthread_self and gettid have no preconditions.
        tid_tx.send(unsafe { (libc::pthread_self(), libc::gettid()) }).expect("send thread id");
        let limits = FrameLimits { max_msg_size: 4096, max_fds: 1, stall_timeout: Duration::from_secs(30) };
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
    let (thread, tid) = tid_rx.recv().expect("thread id");
    let mut first = Header::command(9, command::DEVICE_RESET, 16).encode().to_vec();
    first.extend_from_slice(&[3; 8]);
    tx.write_all(&first).expect("first half");
    interrupt_the_wait(thread, tid);
    tx.write_all(&[4; 8]).expect("second half");
    let (msg, interrupted) = reader.join().expect("reader thread").expect("the whole message");
    assert_eq!(msg.header.msg_id, 9);
    assert_eq!(msg.payload, [[3u8; 8], [4u8; 8]].concat());
    assert_eq!(interrupted, 1, "the signal's EINTR came back as \"nothing yet\", once");
}
