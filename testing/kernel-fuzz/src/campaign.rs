//! The wire side's campaign: LibAFL's loop over a guest that runs the stock driver, one exec per batch of
//! packets, steered by the module's edge map, judged by the kernel's own detectors and by the device model's
//! view of whether the driver took the batch.
//!
//! Why LibAFL (docs/fuzzing-kernel.md): its map observer and feedbacks, corpus scheduling with minimisation
//! (the minimizer scheduler), havoc and token mutators and its stats are what a home-made loop would grow into;
//! its executor trait lets an exec be "send a batch, wait for the driver's head write", nothing in-process.

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use guest_run::control::Control;
use kernel_cov::layout::MAP_SIZE;
use kernel_cov::region::Region;
use libafl::corpus::{InMemoryCorpus, OnDiskCorpus};
use libafl::events::SimpleEventManager;
use libafl::executors::{Executor, ExitKind, HasObservers};
use libafl::feedbacks::{CrashFeedback, MaxMapFeedback, TimeoutFeedback};
use libafl::inputs::{BytesInput, HasTargetBytes};
use libafl::monitors::SimpleMonitor;
use libafl::mutators::{havoc_mutations, tokens_mutations, HavocScheduledMutator, Tokens};
use libafl::observers::{CanTrack, HitcountsMapObserver, StdMapObserver};
use libafl::schedulers::{IndexesLenTimeMinimizerScheduler, QueueScheduler};
use libafl::stages::StdMutationalStage;
use libafl::state::{HasExecutions, StdState};
use libafl::{feedback_or_fast, Evaluator, Fuzzer, HasMetadata, StdFuzzer};
use libafl_bolts::rands::StdRand;
use libafl_bolts::tuples::{tuple_list, Merge, RefIndexable};
use serde_json::{json, Value};

use crate::findings::{Confirmed, Findings};
use crate::guest::{Boot, BootSpec};
use crate::oracle::Report;
use crate::packet;

/// How long a replay waits after its last batch for a report from deferred work.
pub const REPLAY_SETTLE: Duration = Duration::from_secs(20);

/// Batches of a boot kept for a finding's reproducer.
pub const HISTORY: usize = 32;

#[derive(Debug, Clone)]
pub struct Options {
    pub boot: BootSpec,
    pub out: PathBuf,
    pub minutes: f64,
    /// The control socket's name of the HFI whose port the packets enter (the keeper's device).
    pub device: String,
    /// How long an exec may wait for the driver's head write.
    pub wait_ms: u64,
    /// The further wait, with an empty batch, before a batch the driver did not take counts as a stall.
    pub grace_ms: u64,
    pub seed: u64,
    /// Extra seeds (each file one input), e.g. the smoke's planted payload.
    pub extra_seeds: Vec<Vec<u8>>,
    /// Byte strings the token mutators insert (the dictionary beyond the fabric's own numbers).
    pub tokens: Vec<Vec<u8>>,
    /// Say what the device model answered to each batch, and keep every boot's logs (a reproducer's run).
    pub verbose: bool,
    /// Whether a WARN (and a KFENCE report) ends the boot, as the row's `panic_on_warn=1` makes it. Off
    /// (`--warn-continues`, which boots with `panic_on_warn=0`), the report is a finding and the guest goes on:
    /// a WARN_ON_ONCE the fuzzer hits every minute no longer costs a boot each time.
    pub warn_fatal: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CampaignError {
    #[error(transparent)]
    Boot(#[from] crate::guest::BootError),
    #[error("coverage region {path}: {error}")]
    Region { path: String, error: String },
    #[error("LibAFL: {0}")]
    Libafl(#[from] libafl::Error),
    #[error(transparent)]
    Findings(#[from] crate::findings::FindingsError),
    #[error("{0}")]
    Other(String),
}

/// A batch to replay: a line as it was sent, or an input to decode against the boot's fabric.
#[derive(Debug, Clone)]
pub enum Batch {
    Line(String),
    Input(Vec<u8>),
}

/// What one exec saw.
enum Outcome {
    Done,
    /// The driver had not taken the batch by the deadline, but took it within the grace period.
    Slow,
    /// The driver never took it, and no detector spoke: `where` is the device model's view.
    Stalled(Value),
    /// The guest or the device model went away.
    Gone(String),
}

/// The campaign's running state outside LibAFL: the boot, the coverage region, the history, the findings.
pub struct Session {
    opts: Options,
    boot: Option<Boot>,
    control: Option<Control>,
    region: Region,
    boots: u64,
    /// The boot's last batches: the line sent and the input it was decoded from.
    history: VecDeque<(String, Vec<u8>)>,
    findings: Findings,
    /// Call sites reached over all boots (text offsets).
    pub sites: HashSet<u32>,
    /// Call sites reached when the first boot's keeper reported (fabric up, before any exec).
    pub sites_at_ready: Option<u64>,
    /// Wall time spent booting, replaying findings and stopping guests: the campaign's time minus this is the
    /// time it fuzzed.
    pub setup_time: Duration,
    pub execs_done: u64,
    pub execs_slow: u64,
    pub placed: u64,
    pub dropped: u64,
    pub boot_failures: Vec<String>,
}

impl Session {
    pub fn new(opts: Options) -> Result<Session, CampaignError> {
        let region = Region::open(&opts.boot.coverage_file).map_err(|e| CampaignError::Region {
            path: opts.boot.coverage_file.display().to_string(),
            error: e.to_string(),
        })?;
        let findings = Findings::new(&opts.out);
        Ok(Session {
            opts,
            boot: None,
            control: None,
            region,
            boots: 0,
            history: VecDeque::new(),
            findings,
            sites: HashSet::new(),
            sites_at_ready: None,
            setup_time: Duration::ZERO,
            execs_done: 0,
            execs_slow: 0,
            placed: 0,
            dropped: 0,
            boot_failures: vec![],
        })
    }

    pub fn findings(&self) -> &Findings {
        &self.findings
    }

    pub fn boots(&self) -> u64 {
        self.boots
    }

    /// A fresh boot with its control connection; boots that fail to come up are retried a few times.
    fn ensure_boot(&mut self) -> Result<(), CampaignError> {
        if self.boot.is_some() {
            return Ok(());
        }
        let t = Instant::now();
        let r = self.boot_once();
        self.setup_time += t.elapsed();
        r
    }

    fn boot_once(&mut self) -> Result<(), CampaignError> {
        let mut last = None;
        for _ in 0..3 {
            self.boots += 1;
            let logs = self.opts.out.join("boots").join(format!("boot-{}", self.boots));
            match Boot::start(&self.opts.boot, self.boots, logs) {
                Ok(boot) => {
                    let control = Control::connect(&boot.control_socket(), Duration::from_secs(120))
                        .map_err(|e| CampaignError::Other(e.to_string()))?;
                    if self.sites_at_ready.is_none() {
                        self.sites_at_ready = Some(self.region.seen_count());
                    }
                    self.boot = Some(boot);
                    self.control = Some(control);
                    self.history.clear();
                    return Ok(());
                }
                Err(e) => {
                    eprintln!("kernel-fuzz: {e}");
                    self.boot_failures.push(e.to_string());
                    last = Some(e);
                }
            }
        }
        Err(last.map_or_else(|| CampaignError::Other("no boot".into()), CampaignError::Boot))
    }

    /// Ends the boot: takes its call sites into the campaign's union first, and removes its logs unless a
    /// finding points at them (the finding has copies of what it needs).
    fn end_boot(&mut self) {
        self.collect_sites();
        self.control = None;
        if let Some(mut b) = self.boot.take() {
            b.stop();
            if !self.opts.verbose {
                let _ = std::fs::remove_dir_all(&b.logs);
            }
        }
    }

    pub fn collect_sites(&mut self) {
        if self.region.header().is_ok() {
            self.sites.extend(self.region.pc_log().offsets);
        }
    }

    /// One request on the control socket; a broken connection is `Err`.
    fn request(&mut self, line: &Value) -> Result<Value, String> {
        let c = self.control.as_mut().ok_or("no control connection")?;
        // The error names the request, which can be 20 KiB of hex: kept short for the log.
        c.request(line).map_err(|e| {
            let e = e.to_string();
            match e.char_indices().nth(240) {
                Some((cut, _)) => format!("{}...{}", &e[..cut], &e[e.len().saturating_sub(40)..]),
                None => e,
            }
        })
    }

    fn send_batch(&mut self, input: &[u8], frames: &[packet::Frame]) -> Outcome {
        let line = packet::batch_request(&self.opts.device, frames, self.opts.wait_ms);
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back((line.clone(), input.to_vec()));
        match serde_json::from_str::<Value>(&line) {
            Ok(req) => self.send_line(&req),
            Err(e) => Outcome::Gone(format!("our own batch line does not parse: {e}")),
        }
    }

    /// Sends one batch request and judges it: taken, taken late (within the grace period, asked with an empty
    /// batch: done once the driver has caught up with everything placed), never taken, or the peer is gone.
    fn send_line(&mut self, req: &Value) -> Outcome {
        let reply = self.request(req);
        if self.opts.verbose {
            match &reply {
                Ok(r) => eprintln!(
                    "kernel-fuzz: batch: done {}, placed {}, dropped {} {}",
                    r["done"], r["placed"], r["dropped"], r["drops"]
                ),
                Err(e) => eprintln!("kernel-fuzz: batch: {e}"),
            }
        }
        match reply {
            Ok(r) if r.get("done").and_then(Value::as_bool) == Some(true) => {
                self.placed += r.get("placed").and_then(Value::as_u64).unwrap_or(0);
                self.dropped += r.get("dropped").and_then(Value::as_u64).unwrap_or(0);
                Outcome::Done
            }
            Ok(r) => {
                let grace = json!({"device": self.opts.device, "cmd": "wire-batch", "packets": [],
                                   "wait_ms": self.opts.grace_ms});
                match self.request(&grace) {
                    Ok(g) if g.get("done").and_then(Value::as_bool) == Some(true) => Outcome::Slow,
                    Ok(g) => Outcome::Stalled(g.get("where").cloned().unwrap_or_else(|| r["where"].clone())),
                    Err(e) => Outcome::Gone(e),
                }
            }
            Err(e) => Outcome::Gone(e),
        }
    }

    fn ends_boot(&self, r: &Report) -> bool {
        ends_boot(r, self.opts.warn_fatal)
    }

    /// The finding of a batch the driver never took while no detector spoke.
    fn stall_report(&self, place: &Value) -> Report {
        let title =
            format!("stall: the driver did not take a batch within {} ms", self.opts.wait_ms + self.opts.grace_ms);
        Report {
            kind: crate::oracle::Kind::Stall,
            text: vec![title.clone(), format!("device model's view: {place}")],
            title,
        }
    }

    /// One exec: the batch `input` decodes to, and its judgement.
    fn exec(&mut self, input: &[u8], edges: &mut [u8]) -> Result<ExitKind, CampaignError> {
        self.ensure_boot()?;
        let exec_no = self.execs_done;
        let boot = self.boot.as_mut().expect("ensured");
        boot.refresh_target();
        let frames = packet::decode(input, &boot.target);
        self.region.reset_edges();
        let outcome = self.send_batch(input, &frames);
        self.execs_done += 1;
        if let Ok(map) = <&mut [u8; MAP_SIZE]>::try_from(edges) {
            self.region.edge_map_into(map);
        }
        let mut reports = self.boot.as_mut().expect("ensured").reports();
        let (kind, gone) = match outcome {
            Outcome::Done => (ExitKind::Ok, false),
            Outcome::Slow => {
                self.execs_slow += 1;
                (ExitKind::Ok, false)
            }
            Outcome::Stalled(place) => {
                // A stall with no detector report: the guest may be dying (a panic takes a moment to print).
                let stall = self.stall_report(&place);
                let boot = self.boot.as_mut().expect("ensured");
                reports.extend(boot.finish(Duration::from_secs(5)));
                if reports.is_empty() {
                    reports.push(stall);
                }
                (ExitKind::Timeout, true)
            }
            Outcome::Gone(why) => {
                let boot = self.boot.as_mut().expect("ensured");
                reports.extend(boot.finish(Duration::from_secs(30)));
                if reports.is_empty() {
                    eprintln!("kernel-fuzz: boot {} ended without a detector report ({why}); restarting", boot.n);
                }
                (ExitKind::Crash, true)
            }
        };
        // A fatal report with the batch taken: the guest is going down (panic_on_warn, oops=panic); its console's
        // rest belongs to this exec, and the next one needs a fresh boot.
        let (kind, gone) = if !gone && reports.iter().any(|r| self.ends_boot(r)) {
            reports.extend(self.boot.as_mut().expect("ensured").finish(Duration::from_secs(30)));
            (ExitKind::Crash, true)
        } else {
            (kind, gone)
        };
        let boot_n = self.boot.as_ref().map_or(0, |b| b.n);
        let logs = self.boot.as_ref().map(|b| b.logs.clone()).unwrap_or_default();
        let lines: Vec<String> = self.history.iter().map(|(l, _)| l.clone()).collect();
        let inputs: Vec<Vec<u8>> = self.history.iter().map(|(_, i)| i.clone()).collect();
        let mut any = false;
        for r in &reports {
            let (id, new) = self.findings.record(r, boot_n, exec_no, &lines, &inputs, &logs)?;
            eprintln!("kernel-fuzz: {} finding {id}: {}", if new { "NEW" } else { "known" }, r.title);
            any = true;
        }
        if gone {
            let t = Instant::now();
            self.end_boot();
            let r = self.replay_pending();
            self.setup_time += t.elapsed();
            r?;
        }
        Ok(if any && kind == ExitKind::Ok { ExitKind::Crash } else { kind })
    }

    /// Replays each pending finding on a fresh boot: its last batch as sent; its last input decoded against the
    /// fresh boot's fabric (a QP the keeper recreated before the hit has another number there); the boot's last
    /// inputs so decoded. The first that gives the same report is the reproducer, as the lines it sent.
    pub fn replay_pending(&mut self) -> Result<(), CampaignError> {
        for f in self.findings.pending() {
            let history = self.findings.lines(&f, "history.jsonl");
            let inputs = self.findings.inputs(&f);
            let (Some(last), Some(last_input)) = (history.last().cloned(), inputs.last().cloned()) else { continue };
            let attempts = [
                (Confirmed::LastBatch, vec![Batch::Line(last)]),
                (Confirmed::LastInput, vec![Batch::Input(last_input)]),
                (Confirmed::History, inputs.into_iter().map(Batch::Input).collect()),
            ];
            let mut how = (Confirmed::No, None);
            for (attempt, batches) in attempts {
                if let Some(sent) = self.replay(&batches, &f.signature)? {
                    how = (attempt, Some(sent));
                    break;
                }
            }
            eprintln!("kernel-fuzz: finding {} replayed on a fresh boot: {:?}", f.id, how.0);
            self.findings.confirm(&f.id, how.0, how.1.as_deref())?;
        }
        Ok(())
    }

    /// Sends `batches` on a fresh boot, inputs decoded against its fabric; the lines sent up to a report with
    /// `signature`, or None if none came. The boot is ended after.
    pub fn replay(&mut self, batches: &[Batch], signature: &str) -> Result<Option<Vec<String>>, CampaignError> {
        self.ensure_boot()?;
        let mut seen = false;
        let mut sent = vec![];
        for batch in batches {
            let line = match batch {
                Batch::Line(l) => l.clone(),
                Batch::Input(i) => {
                    let target = &self.boot.as_ref().expect("ensured").target;
                    packet::batch_request(&self.opts.device, &packet::decode(i, target), self.opts.wait_ms)
                }
            };
            let Ok(req) = serde_json::from_str::<Value>(&line) else { continue };
            sent.push(line);
            let outcome = self.send_line(&req);
            let boot = self.boot.as_mut().expect("ensured");
            let mut reports = boot.reports();
            let gone = !matches!(outcome, Outcome::Done | Outcome::Slow);
            if gone || !reports.is_empty() {
                reports.extend(boot.finish(Duration::from_secs(30)));
            }
            if let (Outcome::Stalled(place), true) = (&outcome, reports.is_empty()) {
                reports.push(self.stall_report(place));
            }
            if reports.iter().any(|r| r.signature() == signature) {
                seen = true;
                break;
            }
            if gone {
                break;
            }
        }
        if !seen {
            // A report may still be on its way: a defect in deferred work (the send workqueue, a timer) oopses
            // after the batch was taken. A guest that panics ends its boot at once; one that does not is given
            // REPLAY_SETTLE.
            if let Some(b) = self.boot.as_mut() {
                seen = b.finish(REPLAY_SETTLE).iter().any(|r| r.signature() == signature);
            }
        }
        self.end_boot();
        Ok(seen.then_some(sent))
    }

    pub fn shutdown(&mut self) {
        self.end_boot();
    }

    /// Ends the boot, then replays the findings still pending on fresh boots (setup time, not fuzzing).
    pub fn end_boot_and_replay(&mut self) -> Result<(), CampaignError> {
        let t = Instant::now();
        self.end_boot();
        let r = self.replay_pending();
        self.setup_time += t.elapsed();
        r
    }
}

type Edges = HitcountsMapObserver<StdMapObserver<'static, u8, false>>;

/// LibAFL's view of an exec: the batch sent, the edge map copied in from the region.
pub struct WireExecutor<OT> {
    observers: OT,
    pub session: Session,
}

impl<OT> HasObservers for WireExecutor<OT> {
    type Observers = OT;
    fn observers(&self) -> RefIndexable<&OT, OT> {
        RefIndexable::from(&self.observers)
    }
    fn observers_mut(&mut self) -> RefIndexable<&mut OT, OT> {
        RefIndexable::from(&mut self.observers)
    }
}

/// The edges observer's map, whatever wraps it.
pub trait EdgeMap {
    fn edge_slice(&mut self) -> &mut [u8];
}

impl<T: AsMut<Edges>, R> EdgeMap for (T, R) {
    fn edge_slice(&mut self) -> &mut [u8] {
        let hc: &mut Edges = self.0.as_mut();
        let std: &mut StdMapObserver<'static, u8, false> = hc;
        &mut std[..]
    }
}

impl<EM, S, Z, OT: EdgeMap> Executor<EM, BytesInput, S, Z> for WireExecutor<OT>
where
    S: HasExecutions,
{
    fn run_target(
        &mut self,
        _fuzzer: &mut Z,
        state: &mut S,
        _mgr: &mut EM,
        input: &BytesInput,
    ) -> Result<ExitKind, libafl::Error> {
        *state.executions_mut() += 1;
        let bytes = input.target_bytes();
        let edges = self.observers.edge_slice();
        self.session.exec(&bytes, edges).map_err(|e| libafl::Error::unknown(e.to_string()))
    }
}

/// What the campaign reports when it ends.
pub struct Ended {
    pub session: Session,
    pub execs: u64,
    pub wall: Duration,
    pub corpus: usize,
}

/// Runs the campaign for its minutes.
pub fn run(opts: Options) -> Result<Ended, CampaignError> {
    let started = Instant::now();
    let minutes = opts.minutes;
    let seed = opts.seed;
    let extra = opts.extra_seeds.clone();
    let tokens = opts.tokens.clone();
    let solutions = opts.out.join("solutions");
    let stats = opts.out.join("stats.log");
    let mut session = Session::new(opts)?;
    session.ensure_boot()?;
    let seeds = {
        let target = &session.boot.as_ref().expect("booted").target;
        let mut s = packet::seeds(target);
        s.extend(extra);
        s
    };

    let edges = HitcountsMapObserver::new(StdMapObserver::owned("hfi1-edges", vec![0u8; MAP_SIZE])).track_indices();
    let mut feedback = MaxMapFeedback::new(&edges);
    let mut objective = feedback_or_fast!(CrashFeedback::new(), TimeoutFeedback::new());
    let mut state = StdState::new(
        StdRand::with_seed(seed),
        InMemoryCorpus::<BytesInput>::new(),
        OnDiskCorpus::new(&solutions)?,
        &mut feedback,
        &mut objective,
    )?;
    let mut dict = Tokens::new();
    // The record marker lets the token mutators add and split records (packet::decode).
    dict.add_tokens(tokens.iter().chain(std::iter::once(&packet::RECORD_MARKER.to_vec())));
    state.add_metadata(dict);
    let stats_file = std::sync::Mutex::new(std::fs::File::create(&stats).ok());
    let monitor = SimpleMonitor::new(move |s: &str| {
        use std::io::Write;
        if let Ok(mut f) = stats_file.lock() {
            if let Some(f) = f.as_mut() {
                let _ = writeln!(f, "{s}");
            }
        }
    });
    let mut mgr = SimpleEventManager::new(monitor);
    let scheduler = IndexesLenTimeMinimizerScheduler::new(&edges, QueueScheduler::new());
    let mut fuzzer = StdFuzzer::new(scheduler, feedback, objective);
    let mut executor = WireExecutor { observers: tuple_list!(edges), session };
    for s in seeds {
        fuzzer.add_input(&mut state, &mut executor, &mut mgr, BytesInput::new(s))?;
    }
    let mutator = HavocScheduledMutator::new(havoc_mutations().merge(tokens_mutations()));
    let mut stages = tuple_list!(StdMutationalStage::new(mutator));
    let limit = Duration::from_secs_f64(minutes * 60.0);
    let mut last_sites = Instant::now();
    // SIGINT or SIGTERM end the campaign as its time would: the guest stopped, the summary written.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, std::sync::Arc::clone(&stop))
            .map_err(|e| CampaignError::Other(format!("signal handler: {e}")))?;
    }
    // The minutes are fuzzing time: boots and replays do not count against them.
    while started.elapsed().saturating_sub(executor.session.setup_time) < limit
        && !stop.load(std::sync::atomic::Ordering::Relaxed)
    {
        fuzzer.fuzz_one(&mut stages, &mut executor, &mut state, &mut mgr)?;
        if last_sites.elapsed() > Duration::from_secs(30) {
            executor.session.collect_sites();
            last_sites = Instant::now();
        }
    }
    let execs = *state.executions();
    let corpus = libafl::corpus::Corpus::count(libafl::state::HasCorpus::corpus(&state));
    let mut session = executor.session;
    // Findings of reports the guest survived are replayed once the campaign is over.
    session.end_boot_and_replay()?;
    Ok(Ended { session, execs, wall: started.elapsed(), corpus })
}

/// Whether the guest goes down after this report: with `panic_on_warn` (`warn_fatal`) every fatal kind does;
/// without it a WARN and a KFENCE report leave the kernel running (kernel/panic.c `__warn`, mm/kfence/report.c
/// both panic only through `check_panic_on_warn`).
pub fn ends_boot(r: &Report, warn_fatal: bool) -> bool {
    use crate::oracle::Kind;
    r.is_fatal() && (warn_fatal || !matches!(r.kind, Kind::Warn | Kind::Kfence))
}

/// The magic kernel-cov/hfi1_cov.c's test-only planted WARN looks for at the start of a received payload.
pub const PLANT_MAGIC: &[u8] = b"RDMAEMU-PLANT-40";

/// A seed input whose one packet carries the planted defect's payload: a UD SEND_ONLY to the keeper's first UD
/// QP (the plant fires in hfi1_ib_rcv before any QP or P_Key check).
pub fn plant_seed() -> Vec<u8> {
    let mut payload = PLANT_MAGIC.to_vec();
    payload.resize(64, b'.');
    packet::encode(&[packet::Record::new(packet::Class::Ud, 0).payload(payload)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use device_model::hfi1::cable::wire::{BTH_BYTES, LRH_BYTES};

    #[test]
    fn a_warn_ends_the_boot_only_under_panic_on_warn_and_an_oops_always() {
        use crate::oracle::Kind;
        let table = [
            (Kind::Warn, true, true),
            (Kind::Warn, false, false),
            (Kind::Kfence, false, false),
            (Kind::Oops, false, true),
            (Kind::Bug, false, true),
            (Kind::SoftLockup, false, true),
            (Kind::RcuStall, true, false),
        ];
        for (kind, warn_fatal, want) in table {
            let r = Report { kind, title: String::new(), text: vec![] };
            assert_eq!(ends_boot(&r, warn_fatal), want, "{kind:?} warn_fatal {warn_fatal}");
        }
    }

    /// ib_pack.h: IB_OPCODE_UD_SEND_ONLY = IB_OPCODE_UD (0x60) + IB_OPCODE_SEND_ONLY (0x04); the DETH is 8 bytes
    /// (ib_pack.h IB_DETH_BYTES).
    #[test]
    fn the_plant_seed_is_a_ud_send_only_whose_payload_starts_with_the_magic() {
        const IB_OPCODE_UD_SEND_ONLY: u8 = 0x64;
        const IB_DETH_BYTES: usize = 8;
        let target = crate::target::Target::parse(
            r#"{"generation":1,"device":"hfi1_0","port":1,"lid":1,"sm_lid":1,"peer_lid":2,"mtu":4096,
                "pkeys":[32769,32767,65535],"qkey":286331153,"sl":0,
                "qps":[{"type":"ud","qpn":10,"psn":0,"peer_qpn":2048,"peer_psn":0}],
                "mr":{"addr":4096,"len":65536,"rkey":256,"lkey":256},"recreated":0}"#,
        )
        .unwrap();
        let frames = packet::decode(&plant_seed(), &target);
        assert_eq!(frames.len(), 1);
        let w = frames[0].wire();
        assert_eq!(w.opcode(), IB_OPCODE_UD_SEND_ONLY);
        assert_eq!(w.dest_qp(), 10);
        assert!(w.icrc_ok());
        let at = LRH_BYTES + BTH_BYTES + IB_DETH_BYTES;
        assert_eq!(&w.bytes[at..at + PLANT_MAGIC.len()], PLANT_MAGIC);
    }
}
