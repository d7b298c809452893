//! A device-model function served over vfio-user in this process: a `pci::Function` around an engine, a
//! `Server` on its own thread listening on a private UNIX socket, stopped and joined on drop.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use device_model::engine::Engine;
use device_model::pci::{Function, PciIds};
use vfio_user_proto::server::{Server, ServerConfig, ShutdownHandle};

pub struct Served {
    path: PathBuf,
    stop: ShutdownHandle,
    thread: Option<JoinHandle<()>>,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

impl Served {
    pub fn new(engine: Arc<dyn Engine>, ids: PciIds) -> Result<Self, String> {
        let function = Function::try_new(engine, ids).map_err(|e| format!("PCI function: {e}"))?;
        let path = std::env::temp_dir().join(format!(
            "udriver-bench-{}-{}.sock",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|e| format!("bind {}: {e}", path.display()))?;
        let server = Server::new(function, ServerConfig::default());
        let stop = server.shutdown_handle();
        let thread = std::thread::Builder::new()
            .name("bench-server".into())
            .spawn(move || {
                if let Err(e) = server.serve(listener) {
                    tracing::warn!("bench server stopped: {e}");
                }
            })
            .map_err(|e| format!("server thread: {e}"))?;
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
