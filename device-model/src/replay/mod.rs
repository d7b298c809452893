//! Replay: a recorded session fed to a fresh device model, every reply checked against the recording
//! (docs/observe.md, "Record and replay").
//!
//! The device is rebuilt from the recording's header (kind, options, faults) and served by the real
//! `vfio_user_proto::Server` on a socket pair. Client messages are sent in their recorded order. DMA maps go
//! without their files, so every DMA access of the device comes back as a DMA_READ/DMA_WRITE request, which
//! is answered from the recording (reads) or checked against it (writes): the device sees the bytes it saw
//! then, in the same order relative to the client's messages. Its reads of client-written shared memory
//! come from the recording too ([`crate::probe::SharedReplay`]). Control commands are issued where they were.
//!
//! A device worker publishes its results a little after the DMA access that completes them. Where the
//! recording has the device's steps (irdma: each look of its worker at the registers, each publication and
//! each interrupt raised) and its accesses (when it handled a client message), the replayed device makes
//! each step exactly where the recorded one did: it waits for the replay to reach the step, and for the
//! accesses handled before it; a message that arrived before a step but was handled after it is sent after
//! it. Otherwise (hfi1, older recordings) the answer to the last DMA request is held back until the
//! device is needed to move on: its next DMA, a control command, a client message that changes state (a
//! write, a map, a reset: the worker is then let run until it is idle or asks for its next DMA), a register
//! read that differs. Either way a register read whose reply differs is read again until it matches or 2 s
//! pass (a read that raced a step, or a driver's poll). Everything else must match at once.

#![forbid(unsafe_code)]

mod peer;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use vfio_user_proto::record::{ContentHash, Record, RecordError, RecordingReader};
use vfio_user_proto::sock::Message;
use vfio_user_proto::wire::{command, DmaRw, Header};
use vfio_user_proto::{Server, ServerConfig};

use crate::control::{handle_request, ControlTarget};
use crate::device_options::DeviceOptions;
use crate::pci::Function;
use crate::probe::SharedReplay;
use crate::trace::Filter;
use peer::Peer;

/// How long a reply or a DMA request may take.
const WAIT: Duration = Duration::from_secs(5);
/// A reply slower than this lets a held DMA answer go (the device may be waiting on it).
const SLOW: Duration = Duration::from_millis(50);
/// How long a differing register read is repeated.
const REREAD_FOR: Duration = Duration::from_secs(2);
/// Mismatches listed in a report at most.
const MAX_LISTED: usize = 20;
/// Control commands whose replies depend only on the device's state, and are compared.
const COMPARED: &[&str] = &["inject", "classify", "reset", "fault", "wire", "link-event"];

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{0}")]
    Record(#[from] RecordError),
    #[error("{0}")]
    Header(String),
    #[error("setting up the replay: {0}")]
    Setup(String),
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
}

/// What a replay found.
#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    pub file: PathBuf,
    pub device: String,
    pub records: usize,
    pub messages: u64,
    pub replies: u64,
    /// Register reads sent again until their reply matched (polls).
    pub rereads: u64,
    pub dma_reads: u64,
    pub dma_writes: u64,
    pub control: u64,
    /// The device's own steps made where the recording has them, and those it made on its own.
    pub steps: u64,
    pub steps_overran: u64,
    pub shared_reads: u64,
    /// Recorded shared-memory reads the replayed device did not make, and reads it made that the recording
    /// does not have.
    pub shared_left: usize,
    pub shared_missing: u64,
    /// The recording ended inside a record (the recorder was killed).
    pub truncated: bool,
    pub mismatches: Vec<String>,
    /// Mismatches beyond those listed.
    pub more_mismatches: usize,
    pub seconds: f64,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.mismatches.is_empty() && self.shared_left == 0 && self.shared_missing == 0 && self.steps_overran == 0
    }

    fn mismatch(&mut self, index: usize, what: String) {
        if self.mismatches.len() < MAX_LISTED {
            self.mismatches.push(format!("record {index}: {what}"));
        } else {
            self.more_mismatches += 1;
        }
    }
}

/// The recordings `paths` name: files, and the `.vfurec` files of directories, sorted.
pub fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ReplayError> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| ReplayError::Io(p.clone(), e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "vfurec"))
                .collect();
            found.sort();
            out.extend(found);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// Reads a recording whole.
pub fn load(path: &Path) -> Result<(Value, Vec<Record>, bool), ReplayError> {
    let f = std::fs::File::open(path).map_err(|e| ReplayError::Io(path.to_path_buf(), e))?;
    Ok(RecordingReader::new(std::io::BufReader::new(f))?.records()?)
}

/// Replays the recording at `path` on a fresh device; `trace` traces the replayed device.
pub fn replay_file(path: &Path, trace: Option<&Filter>) -> Result<Report, ReplayError> {
    let (header, records, truncated) = load(path)?;
    let mut report = replay(&header, &records, trace)?;
    report.file = path.to_path_buf();
    report.truncated = truncated;
    Ok(report)
}

/// A DMA answer held back until the device must move on.
type Held = Option<(Header, Vec<u8>)>;

struct Run<'a> {
    records: &'a [Record],
    /// Records already replayed ahead of the message they follow in the file.
    done_early: std::collections::HashSet<usize>,
    /// Client accesses the recorded device had handled so far.
    accesses: u64,
    peer: Peer,
    function: Arc<Function>,
    held: Held,
    report: &'a mut Report,
    /// The recorded client messages still waiting for their recorded reply, by id.
    sent: HashMap<u16, (Header, Vec<u8>, u8)>,
    control: HashMap<u64, (String, JoinHandle<Value>)>,
    /// The recording has the device's steps: the replayed device makes them where they are.
    stepped: bool,
}

/// Replays `records` (a session whose header is `header`).
pub fn replay(header: &Value, records: &[Record], trace: Option<&Filter>) -> Result<Report, ReplayError> {
    let started = Instant::now();
    let (options, faults) = DeviceOptions::from_header(header).map_err(ReplayError::Header)?;
    let function = options.build(&faults).map_err(ReplayError::Setup)?;
    if let Some(f) = trace {
        function.probe().trace.set_filter(f);
    }
    let mut shared = SharedReplay::default();
    for r in records {
        if let Record::SharedRead { region, offset, data } = r {
            shared.push(*region, *offset, data.clone());
        }
    }
    function.probe().set_replay(Some(shared));
    let stepped = records.iter().any(|r| matches!(r, Record::DeviceStep));
    function.probe().set_step_gate(stepped);

    let (client, server_end) = UnixStream::pair().map_err(|e| ReplayError::Setup(e.to_string()))?;
    let config = ServerConfig {
        dma_timeout: Duration::from_secs(30),
        stall_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let server = Server::new(function.clone(), config);
    let serving = std::thread::Builder::new()
        .name("replay-server".into())
        .spawn(move || server.serve_connection(server_end))
        .map_err(|e| ReplayError::Setup(e.to_string()))?;
    let peer = Peer::new(client).map_err(|e| ReplayError::Setup(e.to_string()))?;

    let mut report = Report { device: options.kind.name().to_string(), records: records.len(), ..Report::default() };
    let mut run = Run {
        records,
        done_early: Default::default(),
        accesses: 0,
        peer,
        function: function.clone(),
        held: None,
        report: &mut report,
        sent: HashMap::new(),
        control: HashMap::new(),
        stepped,
    };
    let mut diverged = false;
    for (i, r) in records.iter().enumerate() {
        if run.done_early.remove(&i) {
            continue;
        }
        if !run.step(i, r) {
            diverged = true;
            break;
        }
    }
    run.release();
    if !diverged {
        let extra = run.peer.pending_requests();
        if extra > 0 {
            let n = records.len();
            run.report.mismatch(n, format!("{extra} DMA requests the recording does not have"));
        }
    }
    let Run { peer, control, .. } = run;
    report.steps_overran = function.probe().steps_overran();
    function.probe().set_step_gate(false);
    peer.close();
    for (_, (_, h)) in control {
        let _ = h.join();
    }
    let _ = serving.join();
    if let Some(left) = function.probe().take_replay() {
        report.shared_left = left.left();
        report.shared_missing = left.missing();
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Fresh descriptors standing in for the recorded ones: eventfds (a DMA map goes without its file).
fn stand_ins(header: &Header, n: u8) -> Vec<OwnedFd> {
    if header.command == command::DMA_MAP {
        return Vec::new();
    }
    (0..n).filter_map(|_| rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).ok()).collect()
}

impl Run<'_> {
    fn release(&mut self) {
        if let Some((h, p)) = self.held.take() {
            let _ = self.peer.send(&h, &p, &[]);
        }
    }

    /// Lets a held answer go and, when the recording has no steps to place the device's work by, waits
    /// (bounded) until the worker has done what it can without new input: it is idle, or waits for its next
    /// DMA.
    fn settle(&mut self) {
        if self.held.is_none() {
            return;
        }
        self.release();
        if self.stepped {
            return;
        }
        let until = Instant::now() + WAIT;
        while Instant::now() < until && !self.function.engine().idle() && !self.peer.has_request() {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Replays first what the device did between the arrival of the message (or control request) at
    /// `i` and its handling: the device steps, DMA and shared-memory reads recorded before the device access
    /// that follows it. False when the replay cannot go on.
    fn steps_before_handling(&mut self, i: usize) -> bool {
        if !self.stepped {
            return true;
        }
        let records = self.records;
        let mut end = i + 1;
        while let Some(r) = records.get(end) {
            match r {
                Record::DeviceStep
                | Record::DmaRead { .. }
                | Record::DmaWrite { .. }
                | Record::DmaFailed { .. }
                | Record::SharedRead { .. } => end += 1,
                _ => break,
            }
        }
        if end == i + 1 || !matches!(records.get(end), Some(Record::DeviceAccess)) {
            return true;
        }
        for (k, r) in records.iter().enumerate().take(end).skip(i + 1) {
            self.done_early.insert(k);
            if !self.step(k, r) {
                return false;
            }
        }
        true
    }

    /// One record; false when the replay cannot go on.
    fn step(&mut self, i: usize, r: &Record) -> bool {
        match r {
            Record::Message { header, payload, fds } => {
                self.report.messages += 1;
                if !self.steps_before_handling(i) {
                    return false;
                }
                // A message that changes state finds the device as far along as it was then.
                if header.command != command::REGION_READ {
                    self.settle();
                }
                let mut payload = payload.clone();
                if header.command == command::DMA_MAP && payload.len() >= 16 {
                    // No file: the map's offset must be 0, and the device's accesses come to us as messages.
                    payload[8..16].copy_from_slice(&0u64.to_le_bytes());
                }
                let files = stand_ins(header, *fds);
                if let Err(e) = self.peer.send(header, &payload, &files) {
                    self.report.mismatch(i, format!("the server closed the connection ({e})"));
                    return false;
                }
                if header.is_command() && !header.no_reply() {
                    self.sent.insert(header.msg_id, (*header, payload, *fds));
                }
                true
            }
            Record::Reply { header, payload, fds } => self.check_reply(i, header, payload, *fds),
            Record::DmaRead { iova, data } => {
                self.report.dma_reads += 1;
                self.serve_dma(i, command::DMA_READ, *iova, data.len() as u64, Some(data), None)
            }
            Record::DmaWrite { iova, len, hash } => {
                self.report.dma_writes += 1;
                self.serve_dma(i, command::DMA_WRITE, *iova, *len, None, Some(*hash))
            }
            Record::DmaFailed { .. } => true,
            Record::DeviceStep => {
                self.report.steps += 1;
                self.release();
                let probe = self.function.probe();
                let n = self.report.steps;
                // The accesses handled before the step are handled before it here too.
                if !probe.wait_accesses(self.accesses, WAIT) {
                    self.report.mismatch(i, format!("the device did not handle the accesses before its step {n}"));
                } else if !probe.allow_step(WAIT) {
                    self.report.mismatch(i, format!("the device did not make its step {n}"));
                }
                true
            }
            Record::DeviceAccess => {
                self.accesses += 1;
                true
            }
            Record::SharedRead { .. } => {
                self.report.shared_reads += 1;
                true
            }
            Record::ControlRequest { id, text } => {
                self.report.control += 1;
                if !self.steps_before_handling(i) {
                    return false;
                }
                self.release();
                let target: Arc<dyn ControlTarget> = self.function.clone();
                let line = text.clone().into_bytes();
                let cmd = serde_json::from_str::<Value>(text)
                    .ok()
                    .and_then(|v| v.get("cmd").and_then(Value::as_str).map(str::to_string))
                    .unwrap_or_default();
                match std::thread::Builder::new()
                    .name("replay-control".into())
                    .spawn(move || handle_request(std::slice::from_ref(&target), &line))
                {
                    Ok(h) => {
                        self.control.insert(*id, (cmd, h));
                        true
                    }
                    Err(e) => {
                        self.report.mismatch(i, format!("cannot run control request {id}: {e}"));
                        false
                    }
                }
            }
            Record::ControlReply { id, text } => {
                self.release();
                let Some((cmd, h)) = self.control.remove(id) else { return true };
                let got = h.join().unwrap_or(Value::Null);
                let want: Value = serde_json::from_str(text).unwrap_or(Value::Null);
                if COMPARED.contains(&cmd.as_str()) && got != want {
                    self.report.mismatch(i, format!("control {cmd} replied {got}, recorded {want}"));
                }
                true
            }
        }
    }

    fn check_reply(&mut self, i: usize, want: &Header, payload: &[u8], fds: u8) -> bool {
        self.report.replies += 1;
        let Some((sent, sent_payload, sent_fds)) = self.sent.remove(&want.msg_id) else {
            return true;
        };
        let held = &mut self.held;
        let Some(mut got) = self.peer.reply(want.msg_id, WAIT, SLOW, |p| {
            if let Some((h, pl)) = held.take() {
                let _ = p.send(&h, &pl, &[]);
            }
        }) else {
            self.report.mismatch(i, format!("no reply to message {} (command {})", want.msg_id, want.command));
            return false;
        };
        let same = |m: &Message| m.header == *want && m.payload == payload && m.fds.len() == usize::from(fds);
        if !same(&got) && sent.command == command::REGION_READ {
            // A poll: the device publishes a little after the DMA that completes the work.
            self.settle();
            let until = Instant::now() + REREAD_FOR;
            while !same(&got) && Instant::now() < until {
                std::thread::sleep(Duration::from_micros(200));
                self.report.rereads += 1;
                if self.peer.send(&sent, &sent_payload, &stand_ins(&sent, sent_fds)).is_err() {
                    break;
                }
                match self.peer.reply(sent.msg_id, WAIT, WAIT, |_| {}) {
                    Some(m) => got = m,
                    None => break,
                }
            }
        }
        if !same(&got) {
            let show = |p: &[u8]| p.iter().take(48).map(|b| format!("{b:02x}")).collect::<String>();
            self.report.mismatch(
                i,
                format!(
                    "reply to message {} (command {}): got error {} payload {}, recorded error {} payload {}",
                    want.msg_id,
                    want.command,
                    got.header.error,
                    show(&got.payload),
                    want.error,
                    show(payload)
                ),
            );
        }
        true
    }

    /// Serves a recorded DMA access of `len` bytes at `iova`: requests for it may come in several pieces.
    fn serve_dma(&mut self, i: usize, cmd: u16, iova: u64, len: u64, data: Option<&[u8]>, hash: Option<u64>) -> bool {
        self.release();
        // An empty access sends no message.
        if len == 0 {
            return true;
        }
        let mut done = 0u64;
        let mut h = ContentHash::new();
        while done < len {
            let Some(m) = self.peer.request(WAIT) else {
                self.report.mismatch(i, format!("the device made no DMA {} of {len:#x} bytes at {iova:#x}", dir(cmd)));
                return false;
            };
            let Ok((rw, rest)) = DmaRw::decode(&m.payload) else {
                self.report.mismatch(i, "a malformed DMA request".into());
                return false;
            };
            let expected = iova.wrapping_add(done);
            if m.header.command != cmd || rw.address != expected || rw.count == 0 || done + rw.count > len {
                self.report.mismatch(
                    i,
                    format!(
                        "the device made a DMA {} of {:#x} bytes at {:#x}; the recording has a {} of {len:#x} at {iova:#x} (done {done:#x})",
                        dir(m.header.command),
                        rw.count,
                        rw.address,
                        dir(cmd)
                    ),
                );
                return false;
            }
            let reply = match data {
                Some(d) => {
                    let mut p = rw.encode();
                    p.extend_from_slice(d.get(done as usize..(done + rw.count) as usize).unwrap_or_default());
                    p
                }
                None => {
                    h.update(rest);
                    rw.encode()
                }
            };
            done += rw.count;
            let header = Header::reply(&m.header, reply.len());
            // The last piece's answer waits until the device must move on.
            if done >= len {
                self.held = Some((header, reply));
                break;
            }
            let _ = self.peer.send(&header, &reply, &[]);
        }
        if let Some(want) = hash {
            if h.finish() != want {
                self.report.mismatch(i, format!("the device wrote other bytes ({len:#x} at {iova:#x}) than recorded"));
            }
        }
        true
    }
}

fn dir(cmd: u16) -> &'static str {
    if cmd == command::DMA_READ {
        "read"
    } else {
        "write"
    }
}

/// Writes up to `max` fuzz seeds of `window` client messages from the recording at `path` into `out`, named
/// `rec-DEVICE-SESSION-K`; returns how many.
pub fn write_seeds(path: &Path, out: &Path, window: usize, max: usize) -> Result<usize, ReplayError> {
    use vfio_user_proto::record::seed::{seeds_from_records, SeedDevice};
    let (header, records, _) = load(path)?;
    let (options, _) = DeviceOptions::from_header(&header).map_err(ReplayError::Header)?;
    let device = match options.kind {
        crate::cli::DeviceKind::Hfi1 => SeedDevice::Hfi1,
        crate::cli::DeviceKind::Hfi1Wfr => SeedDevice::Hfi1Wfr,
        crate::cli::DeviceKind::Irdma => SeedDevice::Irdma,
    };
    std::fs::create_dir_all(out).map_err(|e| ReplayError::Io(out.to_path_buf(), e))?;
    let session = header.get("session").and_then(Value::as_u64).unwrap_or(0);
    let seeds = seeds_from_records(&records, device, window, max);
    for (k, seed) in seeds.iter().enumerate() {
        let file = out.join(format!("rec-{}-{session}-{k:03}", options.kind.name()));
        std::fs::write(&file, seed.encode()).map_err(|e| ReplayError::Io(file.clone(), e))?;
    }
    Ok(seeds.len())
}
