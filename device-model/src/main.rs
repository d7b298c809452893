//! `device-model`: serves the emulated hfi1 and irdma PCI functions over vfio-user (see `--help`).

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use device_model::cli::{Args, DeviceKind, Listen, Served, Tool};
use device_model::control::{serve_control_with, ControlTarget, SocketReport};
use device_model::device_options::DeviceOptions;
use device_model::hfi1::{cable, CAPTURE_DEFAULT_MIB, WFR_NAMES};
use device_model::pci::Function;
use device_model::replay::{self, Report};
use device_model::shutdown::{accept_one, Termination, Waker};
use device_model::socket_owner::{self, SocketFile};
use device_model::trace::{Filter, Sink};
use vfio_user_proto::record::Recorder;
use vfio_user_proto::server::PeerPolicy;
use vfio_user_proto::stop::Stop;
use vfio_user_proto::{Server, ServerConfig};

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(args.log_level.level().as_str()));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    if let Some(tool) = &args.tool {
        return run_tool(tool);
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("device-model: {e}");
            ExitCode::from(1)
        }
    }
}

fn options_for(args: &Args, s: &Served) -> DeviceOptions {
    let hfi1 = s.kind == DeviceKind::Hfi1;
    let ids = (s.ids != DeviceOptions::new(s.kind).pci_ids()).then_some((s.ids.vendor_id, s.ids.device_id));
    DeviceOptions {
        kind: s.kind,
        ids,
        hfi1_contexts: args.hfi1_contexts.filter(|_| hfi1),
        hfi1_rcvarray_entries: args.hfi1_rcvarray_entries.filter(|_| hfi1),
        irdma_qhash_capacity: args.irdma_qhash_capacity.filter(|_| s.kind == DeviceKind::Irdma),
        worker_spin_us: args.worker_spin_us(),
        instance: s.instance,
        icode: args.hfi1_wfr_icode.filter(|_| s.kind == DeviceKind::Hfi1Wfr),
    }
}

/// `replay` and `seeds`.
fn run_tool(tool: &Tool) -> ExitCode {
    let result = match tool {
        Tool::Replay { files, json, trace } => replay_all(files, *json, trace.as_ref()),
        Tool::Seeds { files, out, window, max } => (|| {
            let mut total = 0;
            for f in replay::expand(files).map_err(|e| e.to_string())? {
                let n = replay::write_seeds(&f, out, *window as usize, *max)
                    .map_err(|e| format!("{}: {e}", f.display()))?;
                println!("{}: {n} seeds", f.display());
                total += n;
            }
            println!("{total} seeds in {}", out.display());
            Ok(true)
        })(),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("device-model: {e}");
            ExitCode::from(2)
        }
    }
}

fn replay_all(files: &[std::path::PathBuf], json: bool, trace: Option<&Filter>) -> Result<bool, String> {
    let files = replay::expand(files).map_err(|e| e.to_string())?;
    if files.is_empty() {
        return Err("no recordings found".into());
    }
    let mut reports: Vec<Report> = Vec::new();
    for f in &files {
        let r = replay::replay_file(f, trace).map_err(|e| format!("{}: {e}", f.display()))?;
        if !json {
            let verdict = if r.ok() { "replays clean" } else { "DIFFERS" };
            println!(
                "{}: {} {verdict}: {} records, {} messages, {} replies ({} register reads repeated as polls), {} DMA reads, \
                 {} DMA writes, {} shared-memory reads, {} control commands, {} device steps, {:.2} s{}",
                f.display(),
                r.device,
                r.records,
                r.messages,
                r.replies,
                r.rereads,
                r.dma_reads,
                r.dma_writes,
                r.shared_reads,
                r.control,
                r.steps,
                r.seconds,
                if r.truncated { " (the recording ends inside a record)" } else { "" }
            );
            for m in &r.mismatches {
                println!("  {m}");
            }
            if r.more_mismatches > 0 {
                println!("  ... and {} more", r.more_mismatches);
            }
            if r.steps_overran > 0 {
                println!("  {} device steps made beyond where the recording has them", r.steps_overran);
            }
            if r.shared_left > 0 || r.shared_missing > 0 {
                println!(
                    "  shared memory: {} recorded reads not made, {} made beyond the recording",
                    r.shared_left, r.shared_missing
                );
            }
        }
        reports.push(r);
    }
    let ok = reports.iter().all(Report::ok);
    if json {
        println!("{}", serde_json::json!({ "ok": ok, "recordings": reports }));
    }
    Ok(ok)
}

/// The functions the command line asks for, in its order; two chip-personality functions share a cable.
fn build_functions(args: &Args, served: &[Served]) -> Result<Vec<Arc<Function>>, String> {
    let faults_of = |s: &Served| -> Vec<_> {
        args.fault.iter().filter(|f| f.device.as_deref() == Some(s.name())).cloned().collect()
    };
    let wfr: Vec<usize> = (0..served.len()).filter(|&i| served[i].kind == DeviceKind::Hfi1Wfr).collect();
    let mut cabled = match wfr.as_slice() {
        [a, b] => {
            let (oa, ob) = (options_for(args, &served[*a]), options_for(args, &served[*b]));
            let (fa, fb) = (faults_of(&served[*a]), faults_of(&served[*b]));
            let training = args.link_training_ms.map_or(cable::TRAINING_DEFAULT, Duration::from_millis);
            let [x, y] = DeviceOptions::build_cabled((&oa, &fa), (&ob, &fb), training)?;
            tracing::info!("{} and {} are joined by a cable", served[*a].name(), served[*b].name());
            vec![(*a, x), (*b, y)]
        }
        _ => Vec::new(),
    };
    served
        .iter()
        .enumerate()
        .map(|(i, s)| match cabled.iter().position(|(j, _)| *j == i) {
            Some(k) => Ok(cabled.remove(k).1),
            None => options_for(args, s).build(&faults_of(s)),
        })
        .collect()
}

/// Counts its server thread as finished, and wakes the main thread to look, when the thread ends (however).
struct Finished(Arc<AtomicUsize>, Waker);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
        self.1.wake();
    }
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
    let mut sockets: Vec<SocketReport> = Vec::new();
    let socket_mode = args.socket_mode.unwrap_or(socket_owner::DEFAULT_MODE);
    let uid = rustix::process::geteuid().as_raw();
    let sink = Sink::global();
    sink.set_format(args.trace_format);
    sink.set_max_file_bytes(args.trace_max_mib.map_or(device_model::trace::DEFAULT_MAX_FILE_BYTES, |m| m << 20));
    if let Some(path) = &args.trace_file {
        sink.to_file(path).map_err(|e| format!("--trace-file {}: {e}", path.display()))?;
    }
    let mut recorders = Vec::new();
    let built = build_functions(args, &served)?;
    for (s, function) in served.iter().zip(built) {
        let options = options_for(args, s);
        if let Some(filter) = &args.trace {
            function.probe().trace.set_filter(filter);
        }
        // Every device has a recorder, idle unless --record or {"cmd":"record","dir":...} gives it a directory.
        let recorder = Recorder::idle(s.name(), options.header(&function.probe().faults.specs()));
        if let Some(mib) = args.record_max_mib {
            recorder.set_max_session_bytes(mib << 20);
        }
        if let Some(mib) = args.record_max_total_mib {
            recorder.set_max_total_bytes(mib << 20);
        }
        if let Some(dir) = &args.record {
            recorder.set_dir(Some(dir)).map_err(|e| format!("--record {}: {e}", dir.display()))?;
        }
        if !function.probe().set_recorder(recorder.clone()) {
            return Err(format!("{}: the device already has a recorder", s.name()));
        }
        recorders.push(recorder);
        let (listener, report) = match &s.listen {
            Listen::Path(p) => {
                // Dropped on every way out of `run`, which removes the file.
                let (l, file) = socket_owner::bind_with_mode(p, socket_mode).map_err(|e| e.to_string())?;
                let mut peers = PeerPolicy::new(socket_mode, uid, file.gid());
                if let Ok(h) = file.handle() {
                    peers = peers.with_group_of(h);
                }
                let report = SocketReport {
                    name: s.name().into(),
                    path: p.display().to_string(),
                    mode: Some(socket_mode),
                    peers: peers.with_label(&format!("{} socket {}", s.name(), p.display())),
                };
                socket_files.push(file);
                (l, report)
            }
            Listen::Fd(fd) => {
                let peers = PeerPolicy::new(socket_mode, uid, rustix::process::getegid().as_raw());
                let label = format!("{} socket (fd {fd})", s.name());
                let report = SocketReport {
                    name: s.name().into(),
                    path: format!("fd {fd}"),
                    mode: None,
                    peers: peers.with_label(&label),
                };
                (adopt(*fd)?, report)
            }
        };
        tracing::info!("{} ({:04x}:{:04x}) listening on {:?}", s.name(), s.ids.vendor_id, s.ids.device_id, s.listen);
        functions.push(function);
        listeners.push(listener);
        sockets.push(report);
    }

    if let Some(path) = &args.capture {
        let first = functions.iter().find(|f| f.name() == WFR_NAMES[0]).ok_or("--capture needs a cable")?;
        let mib = args.capture_max_mib.unwrap_or(CAPTURE_DEFAULT_MIB);
        let request = serde_json::json!({"cmd": "capture", "file": path, "max_mib": mib});
        first.engine().control(&request).map_err(|e| format!("--capture {}: {e}", path.display()))?;
        tracing::info!("capturing the cable to {}", path.display());
    }

    let shutdown = Stop::new();
    let control = match &args.control {
        Some(path) => {
            let targets: Vec<Arc<dyn ControlTarget>> =
                functions.iter().map(|f| f.clone() as Arc<dyn ControlTarget>).collect();
            let handle = serve_control_with(path, targets, shutdown.clone(), sockets.clone())
                .map_err(|e| format!("control socket {}: {e}", path.display()))?;
            tracing::info!("control socket on {}", path.display());
            Some(handle)
        }
        None => None,
    };

    let config =
        ServerConfig { busy_poll: args.busy_poll(), write_multiple: args.write_multiple, ..ServerConfig::default() };
    if args.low_latency || !config.busy_poll.is_zero() || args.worker_spin_us().is_some_and(|us| us > 0) {
        tracing::info!(
            "low latency: connections busy-poll {} us after a reply, workers poll {} us after a job",
            config.busy_poll.as_micros(),
            args.worker_spin_us().unwrap_or(0)
        );
    }
    let mut threads = Vec::new();
    let mut stops = Vec::new();
    let finished = Arc::new(AtomicUsize::new(0));
    let all = functions.into_iter().zip(listeners).zip(&served).zip(recorders).zip(sockets);
    for ((((function, listener), s), recorder), socket) in all {
        let once = args.once;
        let name = s.name();
        let server =
            Server::new(function, ServerConfig { recorder: Some(recorder), peers: socket.peers, ..config.clone() });
        stops.push(server.shutdown_handle());
        let stop = shutdown.clone();
        let finished = Finished(finished.clone(), termination.waker().map_err(|e| format!("{name}: {e}"))?);
        let thread = std::thread::Builder::new()
            .name(format!("{name}-accept"))
            .spawn(move || {
                let _finished = finished;
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
    if termination.wait_until(|| finished.load(Ordering::Acquire) == threads.len()) {
        tracing::info!("signal received: shutting down (a second one exits at once)");
    }
    // Stop accepting and close the clients: each connection detaches its device, which fails the device's
    // pending DMA and unmaps the client's memory after the accesses in flight.
    shutdown.stop();
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
