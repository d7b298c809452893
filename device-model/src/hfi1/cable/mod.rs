//! The cable between two HFI ports: it trains the link when both ends poll, tells each end when the other
//! leaves LinkUp, and carries 9B packets between them in order, through the cable faults and the capture.
//!
//! The cable is a thread that owns the link's state. The ends talk to it only through messages
//! ([`CableEnd`]) and it talks to them only through the [`Port`] trait, never holding a lock of its own
//! while it calls one; a port applies a link event under its own lock and queues a packet for its own
//! worker, so the cable never waits on an HFI. That seam is where a remote end would sit: a `Port` that
//! forwards to another device-model process over a socket, and a reader there that feeds this thread.
//! The thread blocks on its queue when idle and exits when both ends are gone.
//!
//! Packets share one bounded queue, and a full one drops them (counted). A port's physical news ([`Phy`])
//! has a path of its own that never waits and loses no state: each end's mailbox. Each piece of news is
//! stamped with the packets its end had queued, and the thread applies it once it has taken those packets
//! (so a packet sent before the link came up still finds it down), before the next one. A state is
//! idempotent, so a run of them with no packet between comes to its net effect (Polling after Polling is one
//! Polling; a Down ends the run before it, keeping the newest reason; a Polling after a Down stays: the link
//! bounced). The mailbox therefore holds at most two states per packet in the queue, plus idle messages:
//! these are not states and keep their order, at most [`MAX_IDLE_PENDING`] per end (more are dropped and
//! counted).

#![forbid(unsafe_code)]

pub mod capture;
pub mod wire;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select, Sender};
use vfio_user_proto::sync::Unpoison;

use crate::clock::{Clock, RealClock};
use crate::fault::{FaultKind, Params};
use crate::probe::Probe;
use crate::trace::{Block, Level, Val};
use capture::{Capture, Direction};
pub use wire::WirePacket;

/// The two ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum End {
    A,
    B,
}

impl End {
    pub fn index(self) -> usize {
        match self {
            End::A => 0,
            End::B => 1,
        }
    }
    pub fn peer(self) -> End {
        match self {
            End::A => End::B,
            End::B => End::A,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            End::A => "a",
            End::B => "b",
        }
    }
}

/// What a port tells its neighbour at link-up: the DC8051 STS_REMOTE_* registers the other end shows, and
/// the VerifyCap frame its 8051 sends during LNI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Neighbor {
    /// The port GUID (DC_DC8051_CFG_LOCAL_GUID of the port).
    pub guid: u64,
    /// STS_REMOTE_NODE_TYPE: 0 for an HFI (hfi.h NEIGHBOR_TYPE_HFI).
    pub node_type: u8,
    /// STS_REMOTE_PORT_NO.
    pub port: u8,
    /// The port's VerifyCap frame.
    pub verify_cap: VerifyCapFrame,
}

/// A port's VerifyCap frame: the 8051 config fields the host loaded for it (chip.h VERIFY_CAP_LOCAL_PHY,
/// VERIFY_CAP_LOCAL_FABRIC, VERIFY_CAP_LOCAL_LINK_MODE, LOCAL_DEVICE_ID) and its transmit rate (the
/// MAX_RATE of TX_SETTINGS), which the neighbour's 8051 shows in its VERIFY_CAP_REMOTE_* fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VerifyCapFrame {
    pub phy: u32,
    pub fabric: u32,
    pub link_mode: u32,
    pub device_id: u32,
    pub tx_rate: u8,
}

/// What a port's physical layer asks of the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phy {
    /// Polling, and the host has seen it poll: ready to train.
    Polling,
    /// Offline, disabled or reset: the link drops. `reason` is the down reason the host gave when it took
    /// the port offline, which the neighbour reads as the planned-down code of its link-down message; `None`
    /// when the port just went away (reset, detach).
    Down { reason: Option<u8> },
    /// The 8051 sends an idle message (HCMD_SEND_LCB_IDLE_MSG: type in 3:0, payload above): it reaches the
    /// neighbour only while the link is up.
    Idle(u64),
}

/// What the cable tells a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEvent {
    /// Both ends polled: the link is up, with this neighbour.
    Up(Neighbor),
    /// The neighbour left LinkUp, with its reason if it gave one.
    Down { reason: Option<u8> },
    /// The neighbour's 8051 sent an idle message.
    Idle(u64),
}

/// The HFI side of an end.
pub trait Port: Send + Sync {
    /// Who this port is, for the neighbour's registers.
    fn identity(&self) -> Neighbor;
    /// The device's probe: its trace and the cable faults armed on it (they act on packets it receives).
    fn probe(&self) -> Arc<Probe>;
    /// Applies a link event; false if the port is no longer in the state the event was meant for (it left
    /// Polling), and so ignores it.
    fn link(&self, event: LinkEvent) -> bool;
    /// A packet arrives. Never blocks.
    fn receive(&self, packet: WirePacket);
}

/// Messages to the cable thread.
enum Msg {
    Packet(End, WirePacket),
    Capture(Option<Capture>, Sender<Result<(), String>>),
}

/// Idle messages one end may have waiting for the cable thread at most. The driver sends one per port state
/// change it announces (mad.c: SMA_IDLE_ARM, SMA_IDLE_ACTIVE), and each waits for its 8051 command to
/// complete.
pub const MAX_IDLE_PENDING: usize = 64;

/// One end's physical news the cable thread has not applied yet, each stamped with the packets the end had
/// queued when it said it, coalesced (module docs).
#[derive(Debug, Default)]
struct PhyMail {
    pending: VecDeque<(u64, Phy)>,
    idles: usize,
}

impl PhyMail {
    /// False when `phy` is an idle message past the bound (dropped).
    fn push(&mut self, stamp: u64, phy: Phy) -> bool {
        let state_of_this_run = |p: &(u64, Phy)| p.0 == stamp && matches!(p.1, Phy::Polling | Phy::Down { .. });
        match phy {
            Phy::Idle(_) => {
                if self.idles >= MAX_IDLE_PENDING {
                    return false;
                }
                self.idles += 1;
            }
            Phy::Polling => {
                if self.pending.back() == Some(&(stamp, Phy::Polling)) {
                    return true;
                }
            }
            Phy::Down { .. } => {
                while self.pending.back().is_some_and(state_of_this_run) {
                    self.pending.pop_back();
                }
            }
        }
        self.pending.push_back((stamp, phy));
        true
    }

    /// The news said before the end's packet number `taken` (counted from 0) was queued, in order; all of it
    /// with `None`.
    fn take(&mut self, taken: Option<u64>) -> Vec<Phy> {
        let ready = self.pending.iter().take_while(|(stamp, _)| taken.is_none_or(|t| *stamp <= t)).count();
        let news: Vec<Phy> = self.pending.drain(..ready).map(|(_, phy)| phy).collect();
        self.idles -= news.iter().filter(|p| matches!(p, Phy::Idle(_))).count();
        news
    }
}

/// What the ends hand the cable thread outside its queue: the ports, each end's physical news, and how many
/// packets each end has queued (the news's stamps).
#[derive(Default)]
struct Mailboxes {
    ports: Mutex<[Option<Weak<dyn Port>>; 2]>,
    phy: [Mutex<PhyMail>; 2],
    queued: [AtomicU64; 2],
}

/// Packets one direction holds back (delay and reorder faults) at most; more are dropped and counted.
pub const MAX_HELD: usize = 1024;
/// Packets queued to the cable thread at most; a sender past this is dropping (counted).
pub const QUEUE: usize = 1024;
/// Packets the cable remembers for its status.
pub const RECENT: usize = 32;
/// How long a reordered packet waits for the packet that is to overtake it before it goes alone.
pub const REORDER_WAIT: Duration = Duration::from_millis(100);
/// How long the link takes to train once both ends poll, unless configured. A real link's LNI takes seconds
/// (SerDes tuning, VerifyCap). The stock driver starts the link in `hfi1_init` and registers its IB device
/// only afterwards (init.c); a link up in between reaches `add_full_mgmt_pkey`, which dispatches a P_Key
/// event on the unregistered device and oopses in `ib_query_port`. A second end probing next to a polling
/// first one would otherwise see LinkUp within microseconds, inside that window (docs/hfi1-fabric.md).
pub const TRAINING_DEFAULT: Duration = Duration::from_millis(1000);
/// The longest training time a cable accepts.
pub const TRAINING_MAX: Duration = Duration::from_secs(60);

/// Per direction (indexed by the receiving end): what the cable did with packets.
#[derive(Debug, Default)]
pub struct DirCounters {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    /// Sent while the link was not up.
    pub dropped_link_down: AtomicU64,
    /// Dropped by a cable-drop fault.
    pub dropped_fault: AtomicU64,
    /// Too many held back at once.
    pub dropped_held_overflow: AtomicU64,
    /// The sender's queue to the cable was full.
    pub dropped_queue_full: AtomicU64,
    /// Idle messages past [`MAX_IDLE_PENDING`] waiting from the sender.
    pub dropped_idle_overflow: AtomicU64,
    pub delayed: AtomicU64,
    pub corrupted: AtomicU64,
    pub reordered: AtomicU64,
}

impl DirCounters {
    fn json(&self) -> serde_json::Value {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "packets": l(&self.packets), "bytes": l(&self.bytes),
            "dropped_link_down": l(&self.dropped_link_down), "dropped_fault": l(&self.dropped_fault),
            "dropped_held_overflow": l(&self.dropped_held_overflow),
            "dropped_queue_full": l(&self.dropped_queue_full),
            "dropped_idle_overflow": l(&self.dropped_idle_overflow), "delayed": l(&self.delayed),
            "corrupted": l(&self.corrupted), "reordered": l(&self.reordered),
        })
    }
}

/// What the ends and the control socket see of the cable.
#[derive(Debug, Default)]
struct Status {
    up: Mutex<bool>,
    /// Both ends poll and the link trains until then.
    training_until: Mutex<Option<Instant>>,
    trainings: AtomicU64,
    /// Indexed by the receiving end.
    dirs: [DirCounters; 2],
    capture: Mutex<Option<(PathBuf, Arc<AtomicU64>)>>,
    /// The last packets on the wire, newest last (what a stalled run reports).
    recent: Mutex<VecDeque<Seen>>,
}

/// A packet as the cable's status lists it: copied fields, formatted only when asked for.
#[derive(Debug, Clone, Copy)]
struct Seen {
    to: End,
    sc: u8,
    dlid: u16,
    slid: u16,
    opcode: u8,
    qp: u32,
    psn: u32,
    len: usize,
    fate: &'static str,
}

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "to {} sc {} dlid {:#x} slid {:#x} op {:#04x} qp {:#x} psn {:#x} len {} {}",
            self.to.name(),
            self.sc,
            self.dlid,
            self.slid,
            self.opcode,
            self.qp,
            self.psn,
            self.len,
            self.fate
        )
    }
}

struct Inner {
    tx: Sender<Msg>,
    /// A wake-up of the cable thread for its mailboxes: one pending is enough.
    wake: Sender<()>,
    mail: Arc<Mailboxes>,
    status: Arc<Status>,
    clock: Arc<dyn Clock>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last end is gone: the thread sees its queue close.
        let (tx, _) = crossbeam_channel::bounded(0);
        drop(std::mem::replace(&mut self.tx, tx));
        if let Some(t) = self.thread.lock().unpoison().take() {
            // The cable thread itself may drop the last end (a port it held last): it ends on its own then.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// A cable: both ends, before they are handed out.
pub struct Cable {
    inner: Arc<Inner>,
}

impl Cable {
    /// A cable whose link trains for `training` (at most [`TRAINING_MAX`]) once both ends poll.
    pub fn new(training: Duration) -> std::io::Result<Cable> {
        Cable::with_clock(training, Arc::new(RealClock))
    }

    /// [`Cable::new`] on `clock`: training and the cable faults' waits run on its time.
    pub fn with_clock(training: Duration, clock: Arc<dyn Clock>) -> std::io::Result<Cable> {
        let (tx, rx) = crossbeam_channel::bounded(QUEUE);
        let (wake, woken) = crossbeam_channel::bounded(1);
        let status = Arc::new(Status::default());
        let mail = Arc::new(Mailboxes::default());
        let (thread_status, thread_mail, thread_clock) = (Arc::clone(&status), Arc::clone(&mail), Arc::clone(&clock));
        let training = training.min(TRAINING_MAX);
        let thread = std::thread::Builder::new()
            .name("hfi1-cable".into())
            .spawn(move || Link::new(thread_status, thread_mail, thread_clock, training).run(rx, woken))?;
        Ok(Cable { inner: Arc::new(Inner { tx, wake, mail, status, clock, thread: Mutex::new(Some(thread)) }) })
    }

    /// The handle for `end`; `port` receives what the cable sends that end.
    pub fn end(&self, end: End, port: Weak<dyn Port>) -> CableEnd {
        self.inner.mail.ports.lock().unpoison()[end.index()] = Some(port);
        CableEnd { end, inner: Arc::clone(&self.inner) }
    }
}

/// One end's handle on the cable. Dropping it takes the end's link down.
pub struct CableEnd {
    end: End,
    inner: Arc<Inner>,
}

impl CableEnd {
    pub fn end(&self) -> End {
        self.end
    }

    fn send(&self, msg: Msg) -> bool {
        self.inner.tx.try_send(msg).is_ok()
    }

    /// The port's physical layer changed. Never waits: the news goes to this end's mailbox (module docs),
    /// whatever the packet queue holds.
    pub fn phy(&self, phy: Phy) {
        let mail = &self.inner.mail;
        let stamp = mail.queued[self.end.index()].load(Ordering::Acquire);
        if !mail.phy[self.end.index()].lock().unpoison().push(stamp, phy) {
            self.inner.status.dirs[self.end.peer().index()].dropped_idle_overflow.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Full: a wake-up is pending already, and the thread empties the mailbox when it takes it.
        let _ = self.inner.wake.try_send(());
    }

    /// A packet leaves this end.
    pub fn transmit(&self, packet: WirePacket) {
        if !self.send(Msg::Packet(self.end, packet)) {
            self.inner.status.dirs[self.end.peer().index()].dropped_queue_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Counted once queued: news stamped before this count is applied before this packet, and never
        // waits for a packet that did not make it into the queue.
        self.inner.mail.queued[self.end.index()].fetch_add(1, Ordering::AcqRel);
    }

    /// Starts recording every packet to `path` (replacing a capture in progress), or stops with `None`.
    pub fn capture(&self, path: Option<PathBuf>, max_bytes: u64) -> Result<(), String> {
        let capture = match &path {
            Some(p) => Some(Capture::open(p, max_bytes).map_err(|e| format!("capture {}: {e}", p.display()))?),
            None => None,
        };
        let (reply, done) = crossbeam_channel::bounded(1);
        if !self.send(Msg::Capture(capture, reply)) {
            return Err("the cable is busy".into());
        }
        done.recv_timeout(Duration::from_secs(5)).map_err(|_| "the cable did not answer".to_string())?
    }

    /// The cable's state for the control socket.
    pub fn status(&self) -> serde_json::Value {
        let s = &self.inner.status;
        let now = self.inner.clock.now();
        let capture =
            s.capture.lock().unpoison().as_ref().map(
                |(p, n)| serde_json::json!({"file": p.display().to_string(), "packets": n.load(Ordering::Relaxed)}),
            );
        serde_json::json!({
            "end": self.end.name(),
            "link_up": *s.up.lock().unpoison(),
            "training_ms_left": s.training_until.lock().unpoison().map(|t| t.saturating_duration_since(now).as_millis() as u64),
            "trainings": s.trainings.load(Ordering::Relaxed),
            "to_a": s.dirs[0].json(),
            "to_b": s.dirs[1].json(),
            "capture": capture,
            "recent_packets": s.recent.lock().unpoison().iter().map(Seen::to_string).collect::<Vec<_>>(),
        })
    }

    /// Whether the link is up now.
    pub fn link_up(&self) -> bool {
        *self.inner.status.up.lock().unpoison()
    }
}

impl Drop for CableEnd {
    fn drop(&mut self) {
        self.phy(Phy::Down { reason: None });
    }
}

/// A packet held back by a fault, due at `due` (or, for a reorder, after the next packet of its direction).
struct Held {
    due: Instant,
    to: End,
    packet: WirePacket,
    reorder: bool,
}

/// The cable thread's state.
struct Link {
    status: Arc<Status>,
    mail: Arc<Mailboxes>,
    clock: Arc<dyn Clock>,
    /// The clock's timer for the next deadline, kept while that deadline stands.
    timer: Option<(Instant, Receiver<Instant>)>,
    polling: [bool; 2],
    up: bool,
    training: Duration,
    /// When the link comes up: both ends poll and it trains.
    train_due: Option<Instant>,
    held: VecDeque<Held>,
    capture: Option<Capture>,
    capture_count: Arc<AtomicU64>,
}

impl Link {
    fn new(status: Arc<Status>, mail: Arc<Mailboxes>, clock: Arc<dyn Clock>, training: Duration) -> Self {
        Link {
            status,
            mail,
            clock,
            timer: None,
            polling: [false; 2],
            up: false,
            training,
            train_due: None,
            held: VecDeque::new(),
            capture: None,
            capture_count: Arc::new(AtomicU64::new(0)),
        }
    }

    fn port(&self, end: End) -> Option<Arc<dyn Port>> {
        let weak = self.mail.ports.lock().unpoison()[end.index()].clone();
        weak?.upgrade()
    }

    /// The next message, `None` on a wake-up or when `due` passed; `Err` once the ends are gone.
    fn next(&mut self, rx: &Receiver<Msg>, woken: &Receiver<()>, due: Option<Instant>) -> Result<Option<Msg>, ()> {
        if due.is_none() {
            if let Some(c) = &mut self.capture {
                c.flush();
            }
        }
        if self.timer.as_ref().map(|(at, _)| *at) != due {
            self.timer = due.map(|at| (at, self.clock.at(at)));
        }
        let mut sel = Select::new();
        let msgs = sel.recv(rx);
        let wakes = sel.recv(woken);
        let timer = self.timer.as_ref().map(|(_, t)| t.clone());
        if let Some(t) = &timer {
            sel.recv(t);
        }
        let op = sel.select();
        match op.index() {
            i if i == msgs => op.recv(rx).map(Some).map_err(|_| ()),
            i if i == wakes => op.recv(woken).map(|()| None).map_err(|_| ()),
            _ => {
                // The timer fired (its only message): the next deadline gets a timer of its own.
                if let Some(t) = &timer {
                    let _ = op.recv(t);
                }
                self.timer = None;
                Ok(None)
            }
        }
    }

    /// Applies the news of `end` said before its packet number `taken` was queued (`None`: all of it).
    fn take_mail(&mut self, end: End, taken: Option<u64>) {
        let news = self.mail.phy[end.index()].lock().unpoison().take(taken);
        for phy in news {
            self.phy(end, phy);
        }
    }

    fn run(mut self, rx: Receiver<Msg>, woken: Receiver<()>) {
        // Packets taken from each end.
        let mut taken = [0u64; 2];
        loop {
            let due = self.held.iter().map(|h| h.due).chain(self.train_due).min();
            let Ok(msg) = self.next(&rx, &woken, due) else { break };
            for end in [End::A, End::B] {
                self.take_mail(end, Some(taken[end.index()]));
            }
            match msg {
                Some(Msg::Packet(from, packet)) => {
                    taken[from.index()] += 1;
                    self.packet(from.peer(), packet);
                    // News said after this packet was queued, before the next one.
                    self.take_mail(from, Some(taken[from.index()]));
                }
                Some(Msg::Capture(c, reply)) => {
                    // Emptied only now that the cable took it: a busy cable leaves the file as it was.
                    let path = c.as_ref().map(|c| c.path().display().to_string()).unwrap_or_default();
                    match c.map(Capture::start).transpose() {
                        Ok(c) => {
                            self.set_capture(c);
                            let _ = reply.send(Ok(()));
                        }
                        Err(e) => drop(reply.send(Err(format!("capture {path}: {e}")))),
                    }
                }
                None => {}
            }
            if self.train_due.is_some_and(|due| due <= self.clock.now()) {
                self.set_training(None);
                self.train();
            }
            self.release_due();
        }
        // The ends are gone: what they said last still counts (an end dropped last went down).
        self.take_mail(End::A, None);
        self.take_mail(End::B, None);
        self.set_capture(None);
    }

    fn set_capture(&mut self, capture: Option<Capture>) {
        if let Some(mut old) = self.capture.take() {
            old.flush();
        }
        let mut slot = self.status.capture.lock().unpoison();
        *slot = capture.as_ref().map(|c| {
            self.capture_count = Arc::new(AtomicU64::new(0));
            (c.path().to_path_buf(), Arc::clone(&self.capture_count))
        });
        self.capture = capture;
    }

    fn trace(&self, end: End, kind: &'static str, fields: &[(&'static str, Val<'_>)]) {
        if let Some(p) = self.port(end) {
            p.probe().trace.event(Block::Cable, Level::Info, kind, fields);
        }
    }

    fn phy(&mut self, end: End, phy: Phy) {
        match phy {
            Phy::Polling => {
                self.polling[end.index()] = true;
                if self.polling == [true, true] && !self.up && self.train_due.is_none() {
                    if self.training.is_zero() {
                        self.train();
                    } else {
                        self.set_training(Some(self.clock.now() + self.training));
                        let ms = Val::Dec(self.training.as_millis() as u64);
                        self.trace(end, "link-training", &[("ms", ms)]);
                    }
                }
            }
            Phy::Down { reason } => {
                self.polling[end.index()] = false;
                // An end that stops polling ends the training; both must poll again.
                self.set_training(None);
                if self.up {
                    self.set_up(false);
                    // The link is down for both: each end trains again only once it polls again.
                    self.polling = [false, false];
                    // Packets in flight die with the link.
                    self.held.clear();
                    let why = reason.map_or(Val::Str("none"), |r| Val::Dec(r.into()));
                    self.trace(end, "link-down", &[("from", Val::Str(end.name())), ("reason", why)]);
                    if let Some(peer) = self.port(end.peer()) {
                        peer.link(LinkEvent::Down { reason });
                    }
                }
            }
            Phy::Idle(message) => {
                if self.up {
                    self.trace(end, "idle-message", &[("from", Val::Str(end.name())), ("message", Val::Hex(message))]);
                    if let Some(peer) = self.port(end.peer()) {
                        peer.link(LinkEvent::Idle(message));
                    }
                }
            }
        }
    }

    fn set_training(&mut self, due: Option<Instant>) {
        self.train_due = due;
        *self.status.training_until.lock().unpoison() = due;
    }

    fn set_up(&mut self, up: bool) {
        self.up = up;
        *self.status.up.lock().unpoison() = up;
    }

    /// Both ends poll: the link trains and each end learns the other.
    fn train(&mut self) {
        let (Some(a), Some(b)) = (self.port(End::A), self.port(End::B)) else { return };
        self.set_up(true);
        self.status.trainings.fetch_add(1, Ordering::Relaxed);
        let (ida, idb) = (a.identity(), b.identity());
        for (end, port, peer) in [(End::A, &a, idb), (End::B, &b, ida)] {
            port.probe().trace.event(
                Block::Cable,
                Level::Info,
                "link-up",
                &[("end", Val::Str(end.name())), ("neighbor_guid", Val::Hex(peer.guid))],
            );
            if !port.link(LinkEvent::Up(peer)) {
                // That end left Polling since it asked; its Down is on its way and takes the link down.
                self.polling[end.index()] = false;
            }
        }
    }

    /// A packet for `to` enters the cable.
    fn packet(&mut self, to: End, mut packet: WirePacket) {
        let status = Arc::clone(&self.status);
        let dir = &status.dirs[to.index()];
        if !self.up {
            dir.dropped_link_down.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(port) = self.port(to) else {
            dir.dropped_link_down.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let probe = port.probe();
        let opcode = packet.opcode();
        let ours = |p: &Params| p.opcode.is_none_or(|o| o == opcode);
        if probe.fault(FaultKind::CableDrop, ours).is_some() {
            dir.dropped_fault.fetch_add(1, Ordering::Relaxed);
            self.record(to, &packet, "dropped");
            return;
        }
        if let Some(f) = probe.fault(FaultKind::CableCorrupt, ours) {
            let at = f.params.byte.map_or(packet.bytes.len() / 2, |b| b as usize) % packet.bytes.len();
            // A zero XOR would leave the packet intact: flip the low bit then.
            let xor = (f.params.xor as u8).max(1);
            packet.bytes[at] ^= xor;
            dir.corrupted.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(f) = probe.fault(FaultKind::CableDelay, ours) {
            dir.delayed.fetch_add(1, Ordering::Relaxed);
            let due = self.clock.now() + Duration::from_millis(f.params.ms);
            self.hold(Held { due, to, packet, reorder: false });
            return;
        }
        if probe.fault(FaultKind::CableReorder, ours).is_some() {
            dir.reordered.fetch_add(1, Ordering::Relaxed);
            let due = self.clock.now() + REORDER_WAIT;
            self.hold(Held { due, to, packet, reorder: true });
            return;
        }
        self.deliver(to, &*port, packet);
        // A packet held to be overtaken goes right after the one that overtook it.
        while let Some(i) = self.held.iter().position(|h| h.reorder && h.to == to) {
            if let Some(h) = self.held.remove(i) {
                self.deliver(to, &*port, h.packet);
            }
        }
    }

    fn hold(&mut self, held: Held) {
        if self.held.len() >= MAX_HELD {
            self.status.dirs[held.to.index()].dropped_held_overflow.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.held.push_back(held);
    }

    fn release_due(&mut self) {
        let now = self.clock.now();
        while let Some(i) = self.held.iter().position(|h| h.due <= now) {
            let Some(h) = self.held.remove(i) else { break };
            match self.port(h.to) {
                Some(port) if self.up => self.deliver(h.to, &*port, h.packet),
                _ => {
                    self.status.dirs[h.to.index()].dropped_link_down.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    fn deliver(&mut self, to: End, port: &dyn Port, packet: WirePacket) {
        let status = Arc::clone(&self.status);
        let dir = &status.dirs[to.index()];
        dir.packets.fetch_add(1, Ordering::Relaxed);
        dir.bytes.fetch_add(packet.bytes.len() as u64, Ordering::Relaxed);
        self.record(to, &packet, "delivered");
        port.receive(packet);
    }

    /// The capture, the status and the trace of one packet on the wire.
    fn record(&mut self, to: End, packet: &WirePacket, fate: &'static str) {
        {
            let mut recent = self.status.recent.lock().unpoison();
            if recent.len() >= RECENT {
                recent.pop_front();
            }
            recent.push_back(Seen {
                to,
                sc: packet.sc(),
                dlid: packet.dlid(),
                slid: packet.slid(),
                opcode: packet.opcode(),
                qp: packet.dest_qp(),
                psn: packet.psn(),
                len: packet.bytes.len(),
                fate,
            });
        }
        if let Some(c) = &mut self.capture {
            let dir = if to == End::B { Direction::AToB } else { Direction::BToA };
            if c.write(dir, packet) {
                self.capture_count.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(p) = self.port(to) {
            let probe = p.probe();
            if probe.trace.on(Block::Cable, Level::Info) {
                probe.trace.event(
                    Block::Cable,
                    Level::Info,
                    "packet",
                    &[
                        ("to", Val::Str(to.name())),
                        ("sc", Val::Dec(packet.sc().into())),
                        ("dlid", Val::Hex(packet.dlid().into())),
                        ("slid", Val::Hex(packet.slid().into())),
                        ("opcode", Val::Hex(packet.opcode().into())),
                        ("qp", Val::Hex(packet.dest_qp().into())),
                        ("psn", Val::Hex(packet.psn().into())),
                        ("len", Val::Dec(packet.bytes.len() as u64)),
                        ("fate", Val::Str(fate)),
                    ],
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
