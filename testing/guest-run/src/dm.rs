//! The servers a run starts before QEMU (the device model, testbed's peers, hfi1-user-host): started with their
//! output in a log file, ready once their UNIX sockets exist, stopped with SIGTERM (SIGKILL after 5 s).

use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{what}: create its log {log}: {source}")]
    Log { what: String, log: PathBuf, source: std::io::Error },
    #[error("{what}: start {program}: {source}")]
    Spawn { what: String, program: PathBuf, source: std::io::Error },
}

/// A shell's exit status of a finished process: its code, or 128 plus the signal that ended it.
pub fn shell_status(status: ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Sends SIGTERM to `pid` (a process this run started).
pub fn terminate(pid: u32) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
}

pub struct Server {
    what: String,
    child: Option<Child>,
    /// How it ended, as the result JSON reports it (`device_model`).
    pub status: String,
}

impl Server {
    /// Starts `program args` with stdin from /dev/null and stdout and stderr into `log`.
    pub fn start(what: &str, program: &Path, args: &[String], log: &Path) -> Result<Self, ServerError> {
        let file =
            File::create(log).map_err(|source| ServerError::Log { what: what.into(), log: log.into(), source })?;
        let err = file.try_clone().map_err(|source| ServerError::Log { what: what.into(), log: log.into(), source })?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|source| ServerError::Spawn { what: what.into(), program: program.into(), source })?;
        Ok(Self { what: what.into(), child: Some(child), status: "started".into() })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Waits up to `limit` for every socket to exist; false if they do not, or the server exited first.
    pub fn wait_for_sockets(&mut self, sockets: &[PathBuf], limit: Duration) -> bool {
        use std::os::unix::fs::FileTypeExt;
        let up = || sockets.iter().all(|s| std::fs::metadata(s).is_ok_and(|m| m.file_type().is_socket()));
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if up() {
                return true;
            }
            if !self.alive() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        up()
    }

    /// Waits up to `limit` for the server to exit by itself; whether it did.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            if !self.alive() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops it (SIGTERM, SIGKILL after 5 s) and sets `status` to how it ended.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        match child.try_wait() {
            Ok(Some(st)) => self.status = format!("exited early with status {}", shell_status(st)),
            _ => {
                self.status = "running until stopped".into();
                terminate(child.id());
                let until = Instant::now() + Duration::from_secs(5);
                while Instant::now() < until && matches!(child.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                if matches!(child.try_wait(), Ok(None)) {
                    self.status = "running until stopped; ignored SIGTERM for 5 s, killed".into();
                    let _ = child.kill();
                }
                let _ = child.wait();
            }
        }
    }

    pub fn what(&self) -> &str {
        &self.what
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}
