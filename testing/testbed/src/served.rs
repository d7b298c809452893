//! A device-model function served over vfio-user in this process: a `vfio_user_proto::Server` on its own
//! thread, listening on a private UNIX socket, stopped and joined on drop (exactly as the `device-model`
//! binary serves it, without the process).

#![forbid(unsafe_code)]

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use device_model::engine::Engine;
use device_model::pci::{Function, PciIds};
use vfio_user_proto::server::{Server, ServerConfig, ShutdownHandle};

use crate::RigError;

pub struct Served {
    path: PathBuf,
    stop: ShutdownHandle,
    thread: Option<JoinHandle<()>>,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A socket path of this process's own, unique per call.
pub(crate) fn socket_path(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "rdma-emu-testbed-{what}-{}-{}.sock",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

impl Served {
    /// Serves `engine` as a PCI function with `ids`.
    pub fn new(engine: Arc<dyn Engine>, ids: PciIds) -> Result<Self, RigError> {
        Self::function(Function::try_new(engine, ids)?)
    }

    /// Serves an existing function (the caller keeps it, to inspect the device while a client drives it).
    pub fn function(function: Arc<Function>) -> Result<Self, RigError> {
        Self::with_config(function, ServerConfig::default())
    }

    /// Serves `function` with a server configured as `config` (a session recorder, say).
    pub fn with_config(function: Arc<Function>, config: ServerConfig) -> Result<Self, RigError> {
        let path = socket_path("dm");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|source| RigError::Io { op: "bind", source })?;
        let server = Server::new(function, config);
        let stop = server.shutdown_handle();
        let thread = std::thread::Builder::new()
            .name("testbed-server".into())
            .spawn(move || {
                if let Err(e) = server.serve(listener) {
                    tracing::warn!("testbed server stopped: {e}");
                }
            })
            .map_err(|source| RigError::Io { op: "spawn server thread", source })?;
        Ok(Self { path, stop, thread: Some(thread) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // Clients are dropped first by their owners; the serve loop sees the flag within its poll interval.
        self.stop.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
