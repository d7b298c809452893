//! The device-model process's life: who owns its socket paths, and how signals end it.

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
    Command::new(env!("CARGO_BIN_EXE_device-model"))
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
    for s in SOCKETS {
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(dir.join(s)).is_err() {
            assert!(Instant::now() < deadline, "{s} did not appear");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    child
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
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
    let fds_of_first = || std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    std::thread::sleep(Duration::from_millis(200)); // the start-up probes are closed
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
    // The refused processes' probes cost the first nothing.
    let deadline = Instant::now() + Duration::from_secs(3);
    while fds_of_first() > fds_before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fds_of_first(), fds_before, "descriptors of the first device model");
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
        let status = wait_exit(&mut guard.0[0], Duration::from_secs(5)).expect("exits after the signal");
        assert_eq!(status.code(), Some(0), "{sig:?}: graceful exit is 0, got {status:?}");
        for s in SOCKETS {
            assert!(!d.join(s).exists(), "{sig:?}: {s} removed");
        }
        let mut b = [0u8; 4];
        assert!(c.region_read(region::CONFIG, 0, &mut b).is_err(), "{sig:?}: the client was disconnected");
    }
}

#[test]
fn a_second_signal_during_a_stuck_shutdown_exits_at_once() {
    let d = dir("second");
    let child = start(&d);
    let mut guard = Cleanup(vec![child], d.clone());
    // A client that sends requests and never reads the replies: the server's reply send blocks (for up to its
    // 5 s send timeout), so the graceful shutdown cannot finish at once.
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
    let mut blocked_since: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    // Until our sends stay blocked: the server has stopped reading, stuck sending us replies.
    while blocked_since.is_none_or(|t| t.elapsed() < Duration::from_millis(300)) {
        assert!(Instant::now() < deadline, "the server kept reading");
        match (&s).write(&req) {
            Ok(n) if n == req.len() => {
                sent += 1;
                blocked_since = None;
            }
            Ok(_) => break, // a partial message: the stream is out of sync from here, which is fine
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                blocked_since.get_or_insert_with(Instant::now);
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("send: {e}"),
        }
    }
    signal(&guard.0[0], rustix::process::Signal::TERM);
    let early = wait_exit(&mut guard.0[0], Duration::from_millis(500));
    assert!(
        early.is_none(),
        "still shutting down (send blocked), but: {early:?} after {sent} requests, {}",
        stderr_of(guard.0.pop().unwrap())
    );
    signal(&guard.0[0], rustix::process::Signal::TERM);
    let status = wait_exit(&mut guard.0[0], Duration::from_secs(1)).expect("the second signal exits at once");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
    assert_eq!(status.signal(), None);
    drop(s);
}
