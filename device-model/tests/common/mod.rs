//! What the tests that run device-model as a process share: the process in a directory of its own, killed
//! and its directory removed when dropped, and the wait for its sockets.

// Each test binary uses part of this.
#![allow(dead_code)]

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a socket may take to appear before a test gives up: a guard against hanging, not a measure.
pub const SOCKET_GUARD: Duration = Duration::from_secs(10);

/// A device-model process.
pub struct DeviceModel {
    pub child: Child,
    /// Its sockets' directory, `dm-TAG-PID` in the temporary directory.
    pub dir: PathBuf,
}

impl DeviceModel {
    /// Starts `device-model ARGS --log-level warn`; an ARG ending in `.sock` names a socket file in the
    /// process's directory.
    pub fn start(tag: &str, args: &[&str]) -> DeviceModel {
        DeviceModel::spawn(tag, None, args)
    }

    /// [`DeviceModel::start`] under `umask` (through sh, which sets it before exec).
    pub fn start_with_umask(tag: &str, umask: &str, args: &[&str]) -> DeviceModel {
        DeviceModel::spawn(tag, Some(umask), args)
    }

    fn spawn(tag: &str, umask: Option<&str>, args: &[&str]) -> DeviceModel {
        let dir = std::env::temp_dir().join(format!("dm-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let args: Vec<String> = args
            .iter()
            .map(|a| if a.ends_with(".sock") { dir.join(a).display().to_string() } else { a.to_string() })
            .collect();
        let binary = env!("CARGO_BIN_EXE_device-model");
        let mut command = match umask {
            Some(umask) => {
                let mut sh = Command::new("sh");
                sh.arg("-c").arg(format!("umask {umask} && exec \"$0\" \"$@\"")).arg(binary);
                sh
            }
            None => Command::new(binary),
        };
        let child = command
            .args(&args)
            .args(["--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        DeviceModel { child, dir }
    }

    /// The path of socket `name`.
    pub fn sock(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Waits until socket `name` accepts a connection (a probe: the server sees a client come and go).
    pub fn wait_for(&self, name: &str) -> PathBuf {
        let path = self.sock(name);
        let deadline = Instant::now() + SOCKET_GUARD;
        while UnixStream::connect(&path).is_err() {
            assert!(Instant::now() < deadline, "{name} did not appear");
            std::thread::sleep(Duration::from_millis(20));
        }
        path
    }
}

impl Drop for DeviceModel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
