//! How the harness reaches a device model: udriver's in-process backend, or a real vfio-user socket served
//! by `vfio_user_proto::Server`. Kept in one module so a move of the in-process backend (issue 14) is a
//! change here only.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use device_model::irdma::{Irdma, IrdmaConfig};
use device_model::pci::{Function, PciIds};
use udriver::access::DeviceAccess;
use udriver::backend::inproc::InProcess;
use udriver::backend::vfio_user::VfioUserBackend;
use udriver::dma::DmaPool;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    InProcess,
    VfioUser,
}

/// A vfio-user server for one function on a fresh socket, stopped and removed on drop.
pub struct ServedSocket {
    path: PathBuf,
    stop: vfio_user_proto::ShutdownHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServedSocket {
    pub fn new(function: Arc<Function>) -> std::io::Result<Self> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("kernel-conformance-{}-{n}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path)?;
        let server = vfio_user_proto::Server::new(function, vfio_user_proto::ServerConfig::default());
        let stop = server.shutdown_handle();
        let thread = std::thread::spawn(move || {
            let _ = server.serve(listener);
        });
        Ok(Self { path, stop, thread: Some(thread) })
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ServedSocket {
    fn drop(&mut self) {
        self.stop.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An irdma device model with a driver-side view of it (register access and a DMA pool).
pub struct IrdmaModel {
    pub engine: Arc<Irdma>,
    pub function: Arc<Function>,
    pub access: Arc<dyn DeviceAccess>,
    pub pool: Arc<DmaPool>,
    /// Declared last: the client goes before the server stops.
    _served: Option<ServedSocket>,
}

impl IrdmaModel {
    /// Memory decoding and bus mastering are enabled, as a probe does before touching BARs or DMA.
    pub fn new(cfg: IrdmaConfig, transport: Transport) -> Result<Self, String> {
        let engine = Arc::new(Irdma::new(cfg));
        let function = Function::new(engine.clone(), PciIds::irdma_default());
        let (access, served): (Arc<dyn DeviceAccess>, _) = match transport {
            Transport::InProcess => (Arc::new(InProcess::new(function.clone())), None),
            Transport::VfioUser => {
                let s = ServedSocket::new(function.clone()).map_err(|e| format!("serve: {e}"))?;
                let c = VfioUserBackend::connect(s.path(), true).map_err(|e| format!("connect: {e}"))?;
                (Arc::new(c), Some(s))
            }
        };
        access.pci_enable_device().map_err(|e| format!("pci_enable_device: {e}"))?;
        let pool = Arc::new(DmaPool::new(access.clone(), false));
        Ok(Self { engine, function, access, pool, _served: served })
    }
}
