//! The device-model process's life: who owns its socket paths, and how signals end it.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use vfio_user_proto::device::region;
use vfio_user_proto::wire::{command, Header, RegionRw};
use vfio_user_proto::{Client, ClientConfig};

const SOCKETS: [&str; 3] = ["hfi1.sock", "irdma.sock", "control.sock"];

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dm-lifecycle-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn spawn(dir: &Path) -> Child {
    spawn_with(dir, &[])
}

fn spawn_with(dir: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_device-model"))
        .args(extra)
        .arg("--hfi1")
        .arg(dir.join("hfi1.sock"))
        .arg("--irdma")
        .arg(dir.join("irdma.sock"))
        .arg("--control")
        .arg(dir.join("control.sock"))
        .arg("--log-level")
        .arg("warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Starts a device model and waits until every socket answers.
fn start(dir: &Path) -> Child {
    let child = spawn(dir);
    wait_for_sockets(dir);
    child
}

fn wait_for_sockets(dir: &Path) {
    for s in SOCKETS {
        assert!(wait_until(|| UnixStream::connect(dir.join(s)).is_ok()), "{s} did not appear");
    }
}

/// How long a condition may take before a test gives up on it: a guard against hanging, not a measure (every
/// condition here normally holds within milliseconds).
const HANG_GUARD: Duration = Duration::from_secs(30);

/// Looks at `cond` until it holds; false if it still does not after [`HANG_GUARD`].
fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + HANG_GUARD;
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// The child's exit status once it has exited.
fn wait_exit(child: &mut Child) -> Option<ExitStatus> {
    let mut status = None;
    wait_until(|| {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status
}

fn signal(child: &Child, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_child(child);
    rustix::process::kill_process(pid, sig).unwrap();
}

fn stderr_of(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

struct Cleanup(Vec<Child>, PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

#[test]
fn a_second_device_model_on_live_sockets_refuses_and_the_first_keeps_serving() {
    let d = dir("live");
    let first = start(&d);
    let pid = first.id();
    let mut guard = Cleanup(vec![first], d.clone());
    // What the descriptors of the first refer to (a socket by its inode). The start-up probes' connections may
    // still be open here; they can only close. Its threads may still be taking further descriptors on objects
    // it already has (a duplicate of a listener, to shut it down at exit), so objects are compared, not
    // descriptor numbers: a connection the refused processes made it accept would be a new socket.
    let fds_of_first = || -> BTreeSet<String> {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| std::fs::read_link(e.path()).map(|t| t.display().to_string()).unwrap_or_default())
            .collect()
    };
    let fds_before = fds_of_first();
    // Each socket alone, so the refusal is about that socket (the others are fresh paths).
    for (i, s) in SOCKETS.iter().enumerate() {
        let other = d.join(format!("other{i}"));
        std::fs::create_dir_all(&other).unwrap();
        let mut args: Vec<(String, PathBuf)> = vec![
            ("--hfi1".into(), other.join("hfi1.sock")),
            ("--irdma".into(), other.join("irdma.sock")),
            ("--control".into(), other.join("control.sock")),
        ];
        args[i].1 = d.join(s);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_device-model"));
        for (flag, path) in &args {
            cmd.arg(flag).arg(path);
        }
        let second = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let out = second.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{s}: {err}");
        assert!(err.contains("already listening"), "{s}: a clear error, got {err:?}");
        for f in SOCKETS {
            assert!(!other.join(f).exists(), "{s}: the refused process left {f} behind");
        }
    }
    // The refused processes' probes cost the first nothing: every descriptor they made it open is closed again.
    let leftover = || fds_of_first().difference(&fds_before).cloned().collect::<Vec<_>>();
    assert!(wait_until(|| leftover().is_empty()), "descriptors the first device model kept: {:?}", leftover());
    // The first still answers on every socket.
    let c = Client::connect(&d.join("hfi1.sock"), ClientConfig::default()).unwrap();
    let mut ids = [0u8; 4];
    c.region_read(region::CONFIG, 0, &mut ids).unwrap();
    assert_eq!(ids, [0x36, 0x1b, 0x00, 0x11]);
    drop(c);
    let first = guard.0.pop().unwrap();
    signal(&first, rustix::process::Signal::TERM);
    let _ = stderr_of(first);
}

#[test]
fn stale_sockets_left_by_a_killed_device_model_are_replaced() {
    let d = dir("stale");
    let mut first = start(&d);
    first.kill().unwrap();
    first.wait().unwrap();
    for s in SOCKETS {
        assert!(d.join(s).exists(), "SIGKILL leaves {s} behind");
    }
    let second = start(&d);
    let mut guard = Cleanup(vec![second], d.clone());
    let c = Client::connect(&d.join("irdma.sock"), ClientConfig::default()).unwrap();
    let mut ids = [0u8; 4];
    c.region_read(region::CONFIG, 0, &mut ids).unwrap();
    assert_eq!(ids, [0x36, 0x1b, 0x01, 0x11]);
    drop(c);
    let second = guard.0.pop().unwrap();
    signal(&second, rustix::process::Signal::TERM);
    let _ = stderr_of(second);
}

#[test]
fn sigterm_and_sigint_shut_down_gracefully_closing_clients_and_removing_the_sockets() {
    for sig in [rustix::process::Signal::TERM, rustix::process::Signal::INT] {
        let d = dir(&format!("graceful{}", sig.as_raw()));
        let child = start(&d);
        let mut guard = Cleanup(vec![child], d.clone());
        // A client in the middle of its session, and a control client.
        let c = Client::connect(&d.join("hfi1.sock"), ClientConfig::default()).unwrap();
        c.region_write(region::CONFIG, 4, &6u16.to_le_bytes()).unwrap();
        let _control = UnixStream::connect(d.join("control.sock")).unwrap();
        signal(&guard.0[0], sig);
        let status = wait_exit(&mut guard.0[0]).expect("exits after the signal");
        assert_eq!(status.code(), Some(0), "{sig:?}: graceful exit is 0, got {status:?}");
        for s in SOCKETS {
            assert!(!d.join(s).exists(), "{sig:?}: {s} removed");
        }
        let mut b = [0u8; 4];
        assert!(c.region_read(region::CONFIG, 0, &mut b).is_err(), "{sig:?}: the client was disconnected");
    }
}

#[test]
fn a_client_that_never_reads_its_replies_does_not_hold_up_the_shutdown() {
    let d = dir("unread");
    let child = start(&d);
    let mut guard = Cleanup(vec![child], d.clone());
    // A client that sends requests and never reads the replies, until the server's reply send blocks (it would
    // for its 5 s send timeout): the shutdown shuts the connection down, which ends that send at once.
    let s = UnixStream::connect(d.join("hfi1.sock")).unwrap();
    let version = b"\0\0\x01\0{}\0";
    let mut m = Header::command(0, command::VERSION, version.len()).encode().to_vec();
    m.extend_from_slice(version);
    (&s).write_all(&m).unwrap();
    s.set_nonblocking(true).unwrap();
    let read = RegionRw { offset: 0, region: region::CONFIG, count: 4 }.encode();
    let mut req = Header::command(1, command::REGION_READ, read.len()).encode().to_vec();
    req.extend_from_slice(&read);
    let mut sent = 0;
    // Until the socket's buffers both ways are full: the server is stuck sending us a reply. (Our sends stay
    // refused from then on, however often we try.)
    assert!(
        wait_until(|| {
            // As many as fit now: the server must not wait for us between replies.
            loop {
                match (&s).write(&req) {
                    Ok(n) if n == req.len() => sent += 1,
                    Ok(_) => break, // a partial message: the stream is out of sync from here, which is fine
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("send: {e}"),
                }
            }
            server_is_sending(guard.0[0].id())
        }),
        "the server never blocked sending ({sent} requests)"
    );
    signal(&guard.0[0], rustix::process::Signal::TERM);
    let status = wait_exit(&mut guard.0[0]).expect("exits after the signal");
    assert_eq!(status.code(), Some(0), "a graceful exit: {status:?}");
    for f in SOCKETS {
        assert!(!d.join(f).exists(), "{f} removed");
    }
    drop(s);
}

/// Whether a thread of `pid` sleeps waiting for room to send (its kernel wait channel: the socket buffer
/// allocation of `sendmsg`).
fn server_is_sending(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks
        .filter_map(|t| t.ok())
        .any(|t| std::fs::read_to_string(t.path().join("wchan")).is_ok_and(|w| w.contains("sock_alloc_send_pskb")))
}

#[test]
fn a_second_signal_during_a_stuck_shutdown_exits_at_once() {
    let d = dir("second");
    // Trace lines to a stderr nobody drains (a pipe this test reads only once the process is gone; a FIFO
    // is refused as a trace file). Once the pipe is full, the thread that traces a register access blocks in
    // its write, and a graceful shutdown cannot finish.
    let child = spawn_with(&d, &["--trace", "hfi1=debug"]);
    let mut guard = Cleanup(vec![child], d.clone());
    wait_for_sockets(&d);
    let c = Client::connect(
        &d.join("hfi1.sock"),
        ClientConfig { timeout: Duration::from_millis(500), ..ClientConfig::default() },
    )
    .unwrap();
    // Each access traces a line; the first that gets no reply found the pipe full.
    let mut accesses = 0u32;
    let mut b = [0u8; 4];
    while c.region_read(region::CONFIG, 0, &mut b).is_ok() {
        accesses += 1;
        assert!(accesses < 1_000_000, "the trace never blocked");
    }
    signal(&guard.0[0], rustix::process::Signal::TERM);
    // The graceful shutdown has begun once the listeners are shut down (a new connection is refused); it
    // cannot end while the trace write blocks.
    assert!(wait_until(|| UnixStream::connect(d.join("control.sock")).is_err()), "the shutdown never began");
    assert_eq!(guard.0[0].try_wait().unwrap(), None, "stuck in the trace write, the device model is still there");
    signal(&guard.0[0], rustix::process::Signal::TERM);
    let status = wait_exit(&mut guard.0[0]).expect("the second signal ends it");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "the second signal's exit, not a graceful one: {status:?}");
    assert_eq!(status.signal(), None);
    drop(c);
}
