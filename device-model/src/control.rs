//! The control socket: JSON lines over a UNIX socket, one request per line, one reply per line.
//!
//! Requests: `{"cmd":"list"}`; `{"cmd":"help"}`; `{"cmd":"sockets"}` (each listening socket's mode and the
//! peers it refused); `{"cmd":"trace",...}` and `{"cmd":"record",...}` for every device at once; `{"cmd":"reset","device":NAME}` (the engine's reset); `{"device":NAME,"cmd":...}` for
//! anything else, handed whole to that device (for a `Function`, `{"cmd":"pci"}` dumps PCI state,
//! `{"cmd":"dma_maps"}` lists the client's DMA mappings, `accesses`, `fault` and `trace` are the function's
//! (docs/observe.md), and every other command goes to its engine's `control()`).
//! Replies: `{"ok":true,"result":...}` or `{"ok":false,"error":"..."}`. A line longer than `MAX_LINE`, bad
//! JSON or an unknown device gets an error reply and the connection goes on.
//!
//! The socket is created 0600 and admits its owner and root only ([`PeerPolicy`]): it can reset devices and
//! inject traffic, and QEMU never needs it, so `--socket-mode` does not widen it.

#![forbid(unsafe_code)]

use std::io::{self, ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};
use vfio_user_proto::server::PeerPolicy;
use vfio_user_proto::stop::Stop;

use crate::engine::Engine;
use crate::fault::FaultSpec;
use crate::pci::Function;
use crate::probe::Probe;
use crate::socket_owner::SocketFile;
use crate::trace::{Filter, Format, Sink};

/// Longest request line accepted.
pub const MAX_LINE: usize = 1 << 20;
/// Clients served at once; one more is told so and closed.
pub const MAX_CLIENTS: usize = 8;
/// How long `accept` backs off after an error other than an interruption (EMFILE and the like).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// A client that cannot take its reply within this time is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// A client silent for this long gives its slot back.
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
const READ_CHUNK: usize = 64 * 1024;

/// Something the control socket can address by name.
pub trait ControlTarget: Send + Sync {
    fn name(&self) -> &str;
    /// What `list` shows for this device.
    fn describe(&self) -> Value {
        json!({ "name": self.name() })
    }
    fn control(&self, request: &Value) -> Result<Value, String>;
    fn reset(&self);
    /// The device's trace switches, faults and recorder, for the commands that address every device.
    fn probe(&self) -> Option<Arc<Probe>> {
        None
    }
}

/// Commands that only look: a recorded session leaves them out, since replaying them changes nothing.
const OBSERVING: &[&str] = &["pci", "dma_maps", "accesses", "counters", "trace", "help"];

impl ControlTarget for Function {
    fn name(&self) -> &str {
        Function::name(self)
    }
    fn describe(&self) -> Value {
        json!({
            "name": Function::name(self),
            "ids": self.ids(),
            "msix_vectors": self.msix().map_or(0, |m| m.vectors()),
        })
    }
    fn control(&self, request: &Value) -> Result<Value, String> {
        let cmd = request.get("cmd").and_then(Value::as_str).unwrap_or_default();
        let run = || match cmd {
            "pci" => Ok(self.pci_state()),
            "dma_maps" => Ok(self.dma_maps()),
            "accesses" => Ok(self.accesses(request.get("keep").and_then(Value::as_bool))),
            "fault" => fault_command(self, request),
            "trace" => trace_command(std::slice::from_ref(self.probe()), request),
            _ => self.engine().control(request),
        };
        if OBSERVING.contains(&cmd) {
            return run();
        }
        recorded(self.probe(), request, run)
    }
    /// The engine's registers and tables only: config space and MSI-X belong to the connected client, and an
    /// FLR behind QEMU's back would turn memory decoding off under a running guest.
    fn reset(&self) {
        let request = json!({"device": self.name(), "cmd": "reset"});
        let _ = recorded(self.probe(), &request, || {
            self.engine().reset();
            Ok(json!({ "reset": self.name() }))
        });
    }
    fn probe(&self) -> Option<Arc<Probe>> {
        Some(Function::probe(self).clone())
    }
}

/// Runs a control command of the device's session: logged with its reply when the session is recorded, so
/// a replay issues it at the same point.
fn recorded(probe: &Probe, request: &Value, run: impl FnOnce() -> Result<Value, String>) -> Result<Value, String> {
    let session = probe.recorder().and_then(|r| r.current());
    let id = session.as_ref().map(|s| s.control_request(&request.to_string()));
    let result = run();
    if let (Some(s), Some(id)) = (&session, id) {
        let reply = match &result {
            Ok(v) => ok(v.clone()),
            Err(e) => err(e.clone()),
        };
        s.control_reply(id, &reply.to_string());
    }
    result
}

/// `{"device":D,"cmd":"fault"}` lists the armed faults; `"add":SPEC` arms one (DEVICE: may be left out),
/// `"remove":ID` disarms one, `"clear":true` all.
fn fault_command(f: &Function, request: &Value) -> Result<Value, String> {
    let faults = &f.probe().faults;
    if let Some(spec) = request.get("add") {
        let text = spec.as_str().ok_or("\"add\" takes a fault spec string")?;
        let spec = FaultSpec::parse(text).map_err(|e| e.to_string())?;
        if spec.device.as_deref().is_some_and(|d| d != f.name()) {
            return Err(format!("the spec names another device than {}", f.name()));
        }
        let id = f.arm_fault(spec)?;
        return Ok(json!({ "id": id, "faults": faults.list() }));
    }
    if let Some(id) = request.get("remove") {
        let id = id.as_u64().ok_or("\"remove\" takes a fault id")?;
        if !faults.remove(id) {
            return Err(format!("no fault {id}"));
        }
        f.faults_changed();
    } else if request.get("clear").and_then(Value::as_bool) == Some(true) {
        faults.clear();
        f.faults_changed();
    }
    Ok(json!({ "faults": faults.list() }))
}

/// `{"cmd":"trace"}` (every device) or `{"device":D,"cmd":"trace"}`: `"filter"` sets the filter, `"format"`
/// text|json, `"file"` a path to append to (or "stderr"); replies with what is traced where.
fn trace_command(probes: &[Arc<Probe>], request: &Value) -> Result<Value, String> {
    let sink = probes.first().map_or_else(Sink::global, |p| p.trace.sink());
    if let Some(f) = request.get("format") {
        let f = f.as_str().and_then(Format::parse).ok_or("\"format\" is text or json")?;
        sink.set_format(f);
    }
    match request.get("file").map(|v| v.as_str().ok_or("\"file\" is a path or \"stderr\"")) {
        Some(Ok("stderr")) => sink.to_stderr(),
        Some(Ok(path)) => sink.to_file(Path::new(path)).map_err(|e| format!("{path}: {e}"))?,
        Some(Err(e)) => return Err(e.into()),
        None => {}
    }
    if let Some(text) = request.get("filter") {
        let text = text.as_str().ok_or("\"filter\" is a filter string")?;
        let filter = Filter::parse(text).map_err(|e| e.to_string())?;
        for p in probes {
            p.trace.set_filter(&filter);
        }
    }
    let devices: serde_json::Map<String, Value> = probes
        .iter()
        .map(|p| {
            let on: serde_json::Map<String, Value> =
                p.trace.enabled().into_iter().map(|(b, l)| (b.name().to_string(), l.name().into())).collect();
            (p.device().to_string(), Value::Object(on))
        })
        .collect();
    let (bytes, over_cap) = sink.file_status();
    Ok(json!({
        "format": sink.format().name(),
        "destination": sink.destination(),
        "lines": sink.lines(),
        "file_bytes": bytes,
        "max_file_bytes": sink.max_file_bytes(),
        "dropped_over_cap": over_cap,
        "devices": devices,
    }))
}

/// `{"cmd":"record"}`: where each device's sessions go and the session being recorded; `"dir":PATH` records
/// the sessions that begin from now on there, `"stop":true` stops (the current session is finished).
fn record_command(targets: &[Arc<dyn ControlTarget>], request: &Value) -> Result<Value, String> {
    let recorders: Vec<(String, Arc<vfio_user_proto::record::Recorder>)> =
        targets.iter().filter_map(|t| Some((t.name().to_string(), t.probe()?.recorder()?))).collect();
    if let Some(dir) = request.get("dir") {
        let dir = dir.as_str().ok_or("\"dir\" is a path")?;
        for (_, r) in &recorders {
            r.set_dir(Some(Path::new(dir))).map_err(|e| format!("{dir}: {e}"))?;
        }
    } else if request.get("stop").and_then(Value::as_bool) == Some(true) {
        for (_, r) in &recorders {
            r.set_dir(None).map_err(|e| e.to_string())?;
        }
    }
    let status: serde_json::Map<String, Value> = recorders
        .iter()
        .map(|(name, r)| {
            let current = r
                .current()
                .map(|s| json!({"file": s.path(), "records": s.records(), "bytes": s.bytes(), "failed": s.failed()}));
            let status = json!({
                "dir": r.dir(),
                "max_session_bytes": r.max_session_bytes(),
                "total_bytes": r.total_bytes(),
                "max_total_bytes": r.max_total_bytes(),
                "records_over_cap": r.records_over_cap(),
                "sessions_over_cap": r.sessions_over_cap(),
                "session": current,
            });
            (name.clone(), status)
        })
        .collect();
    Ok(Value::Object(status))
}

/// A listening socket of the process, as `{"cmd":"sockets"}` reports it.
#[derive(Debug, Clone)]
pub struct SocketReport {
    /// The device it serves, or "control".
    pub name: String,
    /// Its path, or how it was inherited (`fd 3`).
    pub path: String,
    /// The file's permission bits, when this process created it.
    pub mode: Option<u32>,
    /// Whom it admits; counts the peers it refused.
    pub peers: PeerPolicy,
}

impl SocketReport {
    fn json(&self) -> Value {
        json!({
            "name": self.name,
            "path": self.path,
            "mode": self.mode.map(|m| format!("{m:04o}")),
            "refused_peers": self.peers.refused(),
        })
    }
}

/// `{"cmd":"help"}`: every command, and the trace and fault languages.
pub fn help() -> Value {
    json!({
        "commands": {
            "list": "{\"cmd\":\"list\"}: the devices",
            "help": "{\"cmd\":\"help\"}: this",
            "sockets": "{\"cmd\":\"sockets\"}: each listening socket, its mode and the peers of other users it refused",
            "trace": "{\"cmd\":\"trace\",\"filter\":\"hfi1::flow=debug,irdma=info\",\"format\":\"text|json\",\"file\":PATH|\"stderr\"}: the named trace of every device (with \"device\": that device only)",
            "record": "{\"cmd\":\"record\",\"dir\":PATH} records sessions that begin from now on; {\"cmd\":\"record\",\"stop\":true}; {\"cmd\":\"record\"}: status. Replay with `device-model replay FILE`, fuzz seeds with `device-model seeds FILE --out DIR`",
            "reset": "{\"cmd\":\"reset\",\"device\":D}: the engine's reset",
            "pci": "{\"device\":D,\"cmd\":\"pci\"}: config space, BARs, MSI-X state",
            "dma_maps": "{\"device\":D,\"cmd\":\"dma_maps\"}: the client's DMA mappings",
            "accesses": "{\"device\":D,\"cmd\":\"accesses\",\"keep\":true|false}: the session's register accesses by name (totals and the last 64)",
            "fault": "{\"device\":D,\"cmd\":\"fault\",\"add\":SPEC} arms a fault; \"remove\":ID, \"clear\":true; without them: the armed faults and their counts",
            "hfi1": "{\"device\":\"hfi1\",\"cmd\":\"inject|dump|counters|reset\",...} (docs/hfi1-device.md)",
            "hfi1-wfr": "{\"device\":\"hfi1-wfr\",\"cmd\":\"link|capture|wire|wire-batch|link-event\",...} (docs/hfi1-fabric.md)",
            "irdma": "{\"device\":\"irdma\",\"cmd\":\"dump|counters|reset|classify\",...} (docs/irdma-device.md)",
        },
        "reference": crate::cli::reference().lines().collect::<Vec<_>>(),
    })
}

/// A bare engine on the control socket (no PCI function around it): `reset` is the engine's own.
pub struct EngineTarget(pub Arc<dyn Engine>);

impl ControlTarget for EngineTarget {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn control(&self, request: &Value) -> Result<Value, String> {
        self.0.control(request)
    }
    fn reset(&self) {
        self.0.reset();
    }
}

fn ok(result: Value) -> Value {
    json!({ "ok": true, "result": result })
}
fn err(message: impl Into<String>) -> Value {
    json!({ "ok": false, "error": message.into() })
}

/// The reply to one request line.
pub fn handle_request(targets: &[Arc<dyn ControlTarget>], line: &[u8]) -> Value {
    handle(targets, &[], line)
}

/// [`handle_request`] on a control socket that reports `sockets`.
fn handle(targets: &[Arc<dyn ControlTarget>], sockets: &[SocketReport], line: &[u8]) -> Value {
    let request: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => return err(format!("bad JSON: {e}")),
    };
    let Some(obj) = request.as_object() else { return err("request must be a JSON object") };
    let Some(cmd) = obj.get("cmd").and_then(Value::as_str) else { return err("missing string field \"cmd\"") };
    let device = match obj.get("device") {
        None => None,
        Some(Value::String(d)) => Some(d.as_str()),
        Some(_) => return err("field \"device\" must be a string"),
    };
    let names = || targets.iter().map(|t| t.name().to_string()).collect::<Vec<_>>().join(", ");
    let target = match device {
        Some(d) => match targets.iter().find(|t| t.name() == d) {
            Some(t) => Some(t),
            None => return err(format!("unknown device \"{d}\" (devices: {})", names())),
        },
        None => None,
    };
    match (cmd, target) {
        ("list", None) => ok(Value::Array(targets.iter().map(|t| t.describe()).collect())),
        ("help", None) => ok(help()),
        ("sockets", None) => ok(Value::Array(sockets.iter().map(SocketReport::json).collect())),
        ("trace", None) => {
            let probes: Vec<Arc<Probe>> = targets.iter().filter_map(|t| t.probe()).collect();
            guarded(|| trace_command(&probes, &request))
        }
        ("record", None) => guarded(|| record_command(targets, &request)),
        ("reset", Some(t)) => guarded(|| {
            t.reset();
            Ok(json!({ "reset": t.name() }))
        }),
        ("reset", None) => err(format!("\"reset\" needs a \"device\" (devices: {})", names())),
        (_, Some(t)) => guarded(|| t.control(&request)),
        (other, None) => err(format!("unknown command \"{other}\" without a \"device\" (devices: {})", names())),
    }
}

/// A device bug must cost one reply, not the control thread.
fn guarded(f: impl FnOnce() -> Result<Value, String>) -> Value {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => ok(v),
        Ok(Err(e)) => err(e),
        Err(_) => {
            tracing::error!("control command panicked");
            err("internal error while executing the command")
        }
    }
}

/// Serves the control socket at `path` until `shutdown` fires; the thread then joins its clients and
/// removes the socket file. A stale socket at `path` is replaced; a live server or any other file there is
/// an error ([`crate::socket_owner`]). Its threads block on their sockets with no timeout but a client's idle
/// one; `shutdown` shuts those sockets down.
pub fn serve_control(path: &Path, targets: Vec<Arc<dyn ControlTarget>>, shutdown: Stop) -> io::Result<JoinHandle<()>> {
    serve_control_with(path, targets, shutdown, Vec::new())
}

/// [`serve_control`], reporting the process's other listening `sockets` (and this one) on `{"cmd":"sockets"}`.
pub fn serve_control_with(
    path: &Path,
    targets: Vec<Arc<dyn ControlTarget>>,
    shutdown: Stop,
    mut sockets: Vec<SocketReport>,
) -> io::Result<JoinHandle<()>> {
    // The socket can reset devices and inject traffic: owner only, from the moment it exists.
    let (listener, file) = crate::socket_owner::bind(path)?;
    let peers = PeerPolicy::new(file.mode(), rustix::process::geteuid().as_raw(), file.gid())
        .with_label(&format!("control socket {}", path.display()));
    sockets.push(SocketReport {
        name: "control".into(),
        path: path.display().to_string(),
        mode: Some(file.mode()),
        peers: peers.clone(),
    });
    let started = (|| {
        listener.set_nonblocking(false)?;
        shutdown.watch(&listener)
    })();
    let watch = started?; // on error `file` drops, which removes the socket
    let serving = Serving { targets: Arc::from(targets), sockets: Arc::from(sockets), peers };
    std::thread::Builder::new().name("control-accept".into()).spawn(move || {
        accept_loop(listener, file, serving, &shutdown);
        drop(watch);
    })
}

/// What the control socket's threads share.
#[derive(Clone)]
struct Serving {
    targets: Arc<[Arc<dyn ControlTarget>]>,
    sockets: Arc<[SocketReport]>,
    peers: PeerPolicy,
}

fn accept_loop(listener: UnixListener, file: SocketFile, serving: Serving, shutdown: &Stop) {
    let active = Arc::new(AtomicUsize::new(0));
    let mut clients: Vec<JoinHandle<()>> = Vec::new();
    while !shutdown.is_stopped() {
        match listener.accept() {
            Ok((stream, _)) => {
                // A peer the socket does not admit is closed unanswered (logged and counted by the policy).
                if serving.peers.admit(&stream).is_err() {
                    continue;
                }
                clients.retain(|h| !h.is_finished());
                if active.load(Ordering::Acquire) >= MAX_CLIENTS {
                    reject(stream);
                    continue;
                }
                active.fetch_add(1, Ordering::AcqRel);
                let (serving, shutdown, active2) = (serving.clone(), shutdown.clone(), active.clone());
                let spawned = std::thread::Builder::new().name("control-client".into()).spawn(move || {
                    if let Err(e) = serve_client(stream, &serving, &shutdown) {
                        tracing::debug!("control client ended: {e}");
                    }
                    active2.fetch_sub(1, Ordering::AcqRel);
                });
                match spawned {
                    Ok(h) => clients.push(h),
                    Err(e) => {
                        active.fetch_sub(1, Ordering::AcqRel);
                        tracing::warn!("cannot start a control client thread: {e}");
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // The stop shut the listener down.
            Err(_) if shutdown.is_stopped() => {}
            Err(e) => {
                tracing::warn!("control socket accept failed: {e}");
                std::thread::sleep(ACCEPT_BACKOFF);
            }
        }
    }
    for h in clients {
        let _ = h.join();
    }
    drop(file);
}

fn reject(mut stream: UnixStream) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let line = err(format!("too many control clients (at most {MAX_CLIENTS})")).to_string() + "\n";
    let _ = stream.write_all(line.as_bytes());
}

fn reply(stream: &mut UnixStream, value: &Value) -> io::Result<()> {
    let mut line = value.to_string();
    line.push('\n');
    stream.write_all(line.as_bytes())
}

fn serve_client(mut stream: UnixStream, serving: &Serving, shutdown: &Stop) -> io::Result<()> {
    let (targets, sockets) = (&serving.targets[..], &serving.sockets[..]);
    stream.set_nonblocking(false)?;
    // The read blocks until the client writes, leaves or idles out; a stop shuts the socket down.
    stream.set_read_timeout(Some(IDLE_TIMEOUT))?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let _watch = shutdown.watch(&stream)?;
    let mut line: Vec<u8> = Vec::new();
    // After an over-long line, bytes up to the next newline are dropped.
    let mut discarding = false;
    let mut chunk = vec![0u8; READ_CHUNK];
    loop {
        if shutdown.is_stopped() {
            return Ok(());
        }
        let n = match stream.read(&mut chunk) {
            Ok(0) => {
                if !discarding && !shutdown.is_stopped() && !line.iter().all(u8::is_ascii_whitespace) {
                    reply(&mut stream, &handle(targets, sockets, &line))?;
                }
                return Ok(());
            }
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // Silent for IDLE_TIMEOUT: the slot goes back.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut rest = chunk.get(..n).unwrap_or_default();
        while !rest.is_empty() {
            let (piece, complete) = match rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&rest[..i], true),
                None => (rest, false),
            };
            rest = if complete { &rest[piece.len() + 1..] } else { &[] };
            if !discarding {
                line.extend_from_slice(piece);
                if line.len() > MAX_LINE {
                    line.clear();
                    discarding = !complete;
                    reply(&mut stream, &err(format!("request line longer than {MAX_LINE} bytes")))?;
                    continue;
                }
            }
            if complete {
                if !discarding && !line.iter().all(u8::is_ascii_whitespace) {
                    reply(&mut stream, &handle(targets, sockets, &line))?;
                }
                line.clear();
                discarding = false;
            }
        }
    }
}

#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;
