//! One boot of the fuzz guest: `guest-run run` of the `fuzz-wire` row as a child process, its reports of the
//! fabric (the QP keeper's `FUZZ-TARGET` lines on guest-run's stdout) and its console (serial.log), and its end.
//!
//! A crash ends the guest (`panic=-1` with QEMU's `-no-reboot`), so the campaign starts another [`Boot`]: nothing
//! of the first survives but its log directory, which the finding keeps.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::oracle::{Report, Scanner};
use crate::target::Target;

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("start {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("boot {n}: the guest reported no fabric within {secs} s (logs in {logs})")]
    NoTarget { n: u64, secs: u64, logs: String },
    #[error("boot {n}: guest-run ended before the guest reported its fabric (logs in {logs}): {why}")]
    Ended { n: u64, logs: String, why: String },
    #[error("boot {n}: a FUZZ-TARGET line that does not parse: {error}")]
    BadTarget { n: u64, error: String },
}

/// How to boot the fuzz guest.
#[derive(Debug, Clone)]
pub struct BootSpec {
    pub guest_run: PathBuf,
    /// guest-run's options that select the row (the scenario table's `fuzz-wire` row: `--fuzz-wire`, ...).
    pub row_options: Vec<String>,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub device_model: PathBuf,
    /// The coverage region's backing file, shared with QEMU's ivshmem-plain device.
    pub coverage_file: PathBuf,
    pub coverage_bytes: usize,
    /// Extra kernel parameters (guest-run `--append`).
    pub append: String,
    /// The whole boot's limit for guest-run (it stops QEMU after it).
    pub timeout_s: u64,
    /// How long the fabric may take to come up and the keeper to report.
    pub ready_s: u64,
}

/// A running boot.
pub struct Boot {
    pub n: u64,
    pub logs: PathBuf,
    child: Child,
    targets: Receiver<Result<Target, String>>,
    reader: Option<JoinHandle<()>>,
    console: Console,
    pub target: Target,
}

impl Boot {
    /// Boots boot number `n` with its logs in `logs`, and waits until the guest's keeper reported the fabric.
    pub fn start(spec: &BootSpec, n: u64, logs: PathBuf) -> Result<Boot, BootError> {
        let _ = std::fs::remove_dir_all(&logs);
        let _ = std::fs::create_dir_all(&logs);
        let mem = format!(
            "memory-backend-file,id=hfi1cov,mem-path={},share=on,size={}",
            spec.coverage_file.display(),
            spec.coverage_bytes
        );
        let mut cmd = Command::new(&spec.guest_run);
        cmd.arg("run")
            .args(&spec.row_options)
            .arg("--kernel")
            .arg(&spec.kernel)
            .arg("--initrd")
            .arg(&spec.initrd)
            .arg("--device-model")
            .arg(&spec.device_model)
            .arg("--logs")
            .arg(&logs)
            .arg("--keep-logs")
            .arg("--quiet")
            .arg("--timeout")
            .arg(spec.timeout_s.to_string());
        if !spec.append.is_empty() {
            cmd.arg("--append").arg(&spec.append);
        }
        cmd.args(["--", "-object", &mem, "-device", "ivshmem-plain,memdev=hfi1cov"]);
        let stderr = File::create(logs.join("guest-run.log"))
            .map_err(|source| BootError::Spawn { program: "guest-run.log".into(), source })?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|source| BootError::Spawn { program: spec.guest_run.display().to_string(), source })?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, targets) = mpsc::sync_channel(16);
        let reader = std::thread::Builder::new()
            .name(format!("boot-{n}-stdout"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Some(json) = line.strip_prefix("FUZZ-TARGET ") {
                        // A full channel means the campaign has not taken the last ones yet: keep the newest only
                        // by blocking (16 reports are far more than a keeper sends between two execs).
                        if tx.send(Target::parse(json).map_err(|e| e.to_string())).is_err() {
                            break;
                        }
                    }
                }
            })
            .map_err(|source| BootError::Spawn { program: "stdout reader".into(), source })?;
        let deadline = Instant::now() + Duration::from_secs(spec.ready_s);
        // Until the keeper reports, the boot has no target: a failed start stops guest-run by hand.
        let fail = |mut child: Child, reader: JoinHandle<()>, e: BootError| {
            terminate(&mut child);
            let _ = reader.join();
            Err(e)
        };
        let shown = logs.display().to_string();
        let target = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return fail(child, reader, BootError::NoTarget { n, secs: spec.ready_s, logs: shown });
            }
            match targets.recv_timeout(left.min(Duration::from_secs(1))) {
                Ok(Ok(t)) => break t,
                Ok(Err(error)) => return fail(child, reader, BootError::BadTarget { n, error }),
                Err(RecvTimeoutError::Timeout) => {
                    // guest-run's stdout stays open until it exits: a timeout with a dead child means it is gone.
                    if let Ok(Some(status)) = child.try_wait() {
                        let why = format!("{status}; {}", tail(&logs.join("guest-run.log"), 3));
                        return fail(child, reader, BootError::Ended { n, logs: shown, why });
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let why = tail(&logs.join("guest-run.log"), 3);
                    return fail(child, reader, BootError::Ended { n, logs: shown, why });
                }
            }
        };
        let console = Console::new(logs.join("serial.log"));
        Ok(Boot { n, logs, child, targets, reader: Some(reader), console, target })
    }

    /// The device model's control socket of this boot (guest-run starts it in the log directory).
    pub fn control_socket(&self) -> PathBuf {
        self.logs.join("control.sock")
    }

    /// Takes the keeper's newest report, if it sent one since the last call (a QP was recreated).
    pub fn refresh_target(&mut self) -> bool {
        let mut changed = false;
        while let Ok(Ok(t)) = self.targets.try_recv() {
            self.target = t;
            changed = true;
        }
        changed
    }

    /// The detectors' reports that arrived on the console since the last call.
    pub fn reports(&mut self) -> Vec<Report> {
        self.console.poll()
    }

    /// Whether guest-run (and so QEMU) still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `wait` for guest-run to end by itself (a panicked guest ends QEMU), then reads the console
    /// to its end: the reports a crash left.
    pub fn finish(&mut self, wait: Duration) -> Vec<Report> {
        let deadline = Instant::now() + wait;
        while self.alive() && Instant::now() < deadline {
            // guest-run exits within a moment of QEMU: wait on its stdout closing rather than spinning.
            match self.targets.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Err(RecvTimeoutError::Disconnected) => break,
                _ => continue,
            }
        }
        self.stop();
        self.console.finish()
    }

    /// Ends the boot: SIGTERM to guest-run (it stops QEMU and the device model), then SIGKILL if it lingers.
    pub fn stop(&mut self) {
        terminate(&mut self.child);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// SIGTERM to guest-run, up to 20 s for it to stop QEMU and the device model, then SIGKILL; reaped.
fn terminate(child: &mut Child) {
    if matches!(child.try_wait(), Ok(None)) {
        if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            // guest-run checks for the signal once a second; a short nap between checks of its exit.
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
    }
    let _ = child.wait();
}

impl Drop for Boot {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The guest's console as guest-run writes it, read from where the last read stopped.
struct Console {
    path: PathBuf,
    file: Option<File>,
    offset: u64,
    scanner: Scanner,
}

/// Console bytes read per poll at most (the rest waits for the next).
const CONSOLE_CHUNK: usize = 1 << 20;

impl Console {
    fn new(path: PathBuf) -> Console {
        Console { path, file: None, offset: 0, scanner: Scanner::default() }
    }

    fn poll(&mut self) -> Vec<Report> {
        if self.file.is_none() {
            self.file = File::open(&self.path).ok();
        }
        if let Some(f) = self.file.as_mut() {
            let mut buf = vec![0u8; CONSOLE_CHUNK];
            if f.seek(SeekFrom::Start(self.offset)).is_ok() {
                while let Ok(n) = f.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    self.offset += n as u64;
                    self.scanner.feed(&buf[..n]);
                }
            }
        }
        self.scanner.take()
    }

    fn finish(&mut self) -> Vec<Report> {
        let mut r = self.poll();
        self.scanner.flush();
        r.extend(self.scanner.take());
        r
    }
}

/// The last `n` lines of a file, for error messages.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}
