//! The host side of a QEMU guest run, for the launchers in `ci/` (the model: cloud-hypervisor's `test_infra`):
//!
//! - `scenario`: the table of guest scenarios, one row each: devices, launcher options, `rdma_emu.*` kernel
//!   parameters, the steps the guest must report, and what the run must show;
//! - `verdict`: the verdict of a finished run from its log directory, and the result JSON;
//! - `expect`: what `ci/e2e.sh` requires beyond the verdict (the runs that must fail, and how);
//! - `run`: one whole guest run (`ci/run-qemu.sh` launches it): `dm` starts and stops the servers, `qemu` gives
//!   QEMU's command line, `console` is the protocol the guest and the host speak on the console;
//! - `control`: the launcher's requests of the device model's control socket and the answers to the guest's
//!   requests on the console.

pub mod console;
pub mod control;
pub mod dm;
pub mod expect;
pub mod opafm;
pub mod pty;
pub mod pyfmt;
pub mod qemu;
pub mod run;
pub mod scenario;
pub mod verdict;

// The scripts around a guest run: the bench reports (ci/bench.sh, ci/bench-table.sh), QMP (ci/lifecycle.sh), the
// soak's control queries (ci/soak.sh) and the demo summaries (ci/demo.sh).
pub mod bench;
pub mod demo_summary;
pub mod qmp;
pub mod tools;

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("write {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("encode {path}: {source}")]
    Encode { path: String, source: serde_json::Error },
}

/// Writes `value` as indented JSON through a temporary file, so a reader never sees half of it.
pub fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), WriteError> {
    let shown = || path.display().to_string();
    let mut text =
        serde_json::to_string_pretty(value).map_err(|source| WriteError::Encode { path: shown(), source })?;
    text.push('\n');
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text).map_err(|source| WriteError::Io { path: shown(), source })?;
    std::fs::rename(&tmp, path).map_err(|source| WriteError::Io { path: shown(), source })
}
