//! `device-model`: serves the emulated hfi1 and irdma PCI functions over vfio-user (see `--help`).

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use device_model::cli::{Args, DeviceKind, Listen, Served};
use device_model::control::{serve_control, ControlTarget};
use device_model::engine::Engine;
use device_model::hfi1::{Hfi1, Hfi1Config};
use device_model::irdma::{Irdma, IrdmaConfig};
use device_model::pci::Function;
use device_model::shutdown::{accept_one, Termination};
use device_model::socket_owner::{self, SocketFile};
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
    let termination = Termination::install().map_err(|e| format!("installing signal handlers: {e}"))?;
    let mut functions = Vec::new();
    let mut listeners = Vec::new();
    let mut socket_files: Vec<SocketFile> = Vec::new();
    for s in &served {
        let engine = engine_for(args, s.kind)?;
        let function = Function::try_new(engine, s.ids).map_err(|e| format!("{}: {e}", s.kind.name()))?;
        let listener = match &s.listen {
            Listen::Path(p) => {
                // Dropped on every way out of `run`, which removes the file.
                let (l, file) = socket_owner::bind(p).map_err(|e| e.to_string())?;
                socket_files.push(file);
                l
            }
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

    let config =
        ServerConfig { busy_poll: Duration::from_micros(args.busy_poll_us.unwrap_or(0)), ..ServerConfig::default() };
    let mut threads = Vec::new();
    let mut stops = Vec::new();
    for ((function, listener), s) in functions.into_iter().zip(listeners).zip(&served) {
        let once = args.once;
        let name = s.kind.name();
        let server = Server::new(function, config.clone());
        stops.push(server.shutdown_handle());
        let stop = shutdown.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{name}-accept"))
            .spawn(move || {
                if once {
                    if let Some(stream) = accept_one(&listener, &stop) {
                        match server.serve_connection(stream) {
                            Ok(()) => tracing::info!("{name}: client disconnected"),
                            Err(e) => tracing::warn!("{name}: client dropped: {e}"),
                        }
                    }
                } else if let Err(e) = server.serve(listener) {
                    tracing::error!("{name}: serving stopped: {e}");
                }
            })
            .map_err(|e| format!("spawning the {name} server thread: {e}"))?;
        threads.push(thread);
    }
    if termination.wait_until(|| threads.iter().all(|t| t.is_finished())) {
        tracing::info!("signal received: shutting down (a second one exits at once)");
    }
    // Stop accepting and close the clients: each connection detaches its device, which fails the device's
    // pending DMA and unmaps the client's memory after the accesses in flight.
    shutdown.store(true, Ordering::Release);
    stops.iter().for_each(|s| s.shutdown());
    for t in threads {
        let _ = t.join();
    }
    if let Some(c) = control {
        let _ = c.join();
    }
    drop(socket_files);
    Ok(())
}
