//! `device-model`: serves the emulated hfi1 and irdma PCI functions over vfio-user (see `--help`).

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use device_model::cli::{Args, DeviceKind, Listen, Served};
use device_model::control::{serve_control, ControlTarget};
use device_model::engine::Engine;
use device_model::hfi1::{Hfi1, Hfi1Config};
use device_model::irdma::{Irdma, IrdmaConfig};
use device_model::pci::Function;
use vfio_user_proto::{Server, ServerConfig};

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(args.log_level.level().as_str()));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("device-model: {e}");
            ExitCode::from(1)
        }
    }
}

fn engine_for(args: &Args, kind: DeviceKind) -> Result<Arc<dyn Engine>, String> {
    Ok(match kind {
        DeviceKind::Hfi1 | DeviceKind::Hfi1Wfr => {
            let mut config = if kind == DeviceKind::Hfi1 { Hfi1Config::default() } else { Hfi1Config::wfr() };
            // The size options shape the project's own function; the chip personality keeps the chip's.
            if kind == DeviceKind::Hfi1 {
                if let Some(n) = args.hfi1_contexts {
                    config.rcv_contexts = n as usize;
                }
                if let Some(n) = args.hfi1_rcvarray_entries {
                    config.rcv_array_count = n as usize;
                }
            }
            if let Some(us) = args.worker_spin_us {
                config.worker_spin = Duration::from_micros(us);
            }
            Arc::new(Hfi1::new(config).map_err(|e| format!("hfi1: {e}"))?)
        }
        DeviceKind::Irdma => {
            let mut config = IrdmaConfig::default();
            if let Some(n) = args.irdma_qhash_capacity {
                config.qhash_capacity = n as usize;
            }
            if let Some(us) = args.worker_spin_us {
                config.worker_spin = Duration::from_micros(us);
            }
            Arc::new(Irdma::new(config))
        }
    })
}

/// Binds a vfio-user socket at `path`, replacing a stale socket but never another kind of file.
fn bind(path: &std::path::Path) -> Result<UnixListener, String> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(format!("{} exists and is not a socket", path.display()));
        }
        std::fs::remove_file(path).map_err(|e| format!("removing stale {}: {e}", path.display()))?;
    }
    UnixListener::bind(path).map_err(|e| format!("binding {}: {e}", path.display()))
}

/// Adopts an inherited listening socket (`--fd`), after checking that it is one.
fn adopt(fd: i32) -> Result<UnixListener, String> {
    // SAFETY: borrowed only for this one fcntl; a closed or invalid number gives EBADF, not UB.
    rustix::io::fcntl_getfd(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
        .map_err(|e| format!("--fd {fd}: {e}"))?;
    // SAFETY: the descriptor is open (checked above) and was handed to this process to own by the
    // command line convention; nothing else in the process uses it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let stat = rustix::fs::fstat(&owned).map_err(|e| format!("--fd {fd}: {e}"))?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::Socket {
        return Err(format!("--fd {fd} is not a socket"));
    }
    Ok(UnixListener::from(owned))
}

fn run(args: &Args) -> Result<(), String> {
    let served: Vec<Served> = args.served().map_err(|e| e.to_string())?;
    let mut functions = Vec::new();
    let mut listeners = Vec::new();
    for s in &served {
        let engine = engine_for(args, s.kind)?;
        let function = Function::try_new(engine, s.ids).map_err(|e| format!("{}: {e}", s.kind.name()))?;
        let listener = match &s.listen {
            Listen::Path(p) => bind(p)?,
            Listen::Fd(fd) => adopt(*fd)?,
        };
        tracing::info!(
            "{} ({:04x}:{:04x}) listening on {:?}",
            s.kind.name(),
            s.ids.vendor_id,
            s.ids.device_id,
            s.listen
        );
        functions.push(function);
        listeners.push(listener);
    }

    let shutdown = Arc::new(AtomicBool::new(false));
    let control = match &args.control {
        Some(path) => {
            let targets: Vec<Arc<dyn ControlTarget>> =
                functions.iter().map(|f| f.clone() as Arc<dyn ControlTarget>).collect();
            let handle = serve_control(path, targets, shutdown.clone())
                .map_err(|e| format!("control socket {}: {e}", path.display()))?;
            tracing::info!("control socket on {}", path.display());
            Some(handle)
        }
        None => None,
    };

    let mut threads = Vec::new();
    for ((function, listener), s) in functions.into_iter().zip(listeners).zip(&served) {
        let once = args.once;
        let name = s.kind.name();
        let thread = std::thread::Builder::new()
            .name(format!("{name}-accept"))
            .spawn(move || {
                let server = Server::new(function, ServerConfig::default());
                if once {
                    match listener.accept() {
                        Ok((stream, _)) => match server.serve_connection(stream) {
                            Ok(()) => tracing::info!("{name}: client disconnected"),
                            Err(e) => tracing::warn!("{name}: client dropped: {e}"),
                        },
                        Err(e) => tracing::error!("{name}: accept failed: {e}"),
                    }
                } else if let Err(e) = server.serve(listener) {
                    tracing::error!("{name}: serving stopped: {e}");
                }
            })
            .map_err(|e| format!("spawning the {name} server thread: {e}"))?;
        threads.push(thread);
    }
    for t in threads {
        let _ = t.join();
    }
    shutdown.store(true, std::sync::atomic::Ordering::Release);
    if let Some(c) = control {
        let _ = c.join();
    }
    for s in &served {
        if let Listen::Path(p) = &s.listen {
            let _ = std::fs::remove_file(p);
        }
    }
    Ok(())
}
