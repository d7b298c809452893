//! Command line of the `device-model` binary, following the vfio-user/vhost-user backend program conventions
//! (`--socket-path PATH` or `--fd FD`), plus one option per device to serve several from one process.

#![forbid(unsafe_code)]

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use thiserror::Error;

use crate::fault::{FaultKind, FaultSpec};
use crate::hfi1::{MAX_WFR_FUNCTIONS, RXE_NUM_CONTEXTS, WFR_NAMES};
use crate::pci::PciIds;
use crate::trace::{Block, Filter, Format};

/// RcvArray sizes come in whole pages of the shared mapping (512 entries of 8 bytes), which also keeps
/// them a multiple of RCV_INCREMENT (docs/hfi1-device.md).
pub const RCV_ARRAY_GRANULE: u32 = 512;
/// Largest RcvArray the emulation offers: what RCV_TID_CTRL's 13-bit base index can address.
pub const MAX_RCV_ARRAY_ENTRIES: u32 = crate::hfi1::MAX_RCV_ARRAY_COUNT as u32;
/// Largest qhash table the emulation offers.
pub const MAX_QHASH_CAPACITY: u32 = 65536;
/// Largest `--worker-spin-us`: the hfi1 engine's limit ([`crate::hfi1::MAX_WORKER_SPIN`]).
pub const MAX_WORKER_SPIN_US: u64 = crate::hfi1::MAX_WORKER_SPIN.as_micros() as u64;
/// Largest `--busy-poll-us`: longer than any gap between a guest's trapped accesses in a burst.
pub const MAX_BUSY_POLL_US: u64 = 1000;
/// `--busy-poll-us` under `--low-latency`: in a QEMU guest it took a trapped access to 0.93x (vCPUs halting)
/// and 0.68-0.75x (polling) of the same without it (docs/bench.md, "The guest's thread hand-offs").
pub const LOW_LATENCY_BUSY_POLL_US: u64 = 50;
/// `--worker-spin-us` under `--low-latency`: back-to-back small doorbells 1.7-1.8x faster on an idle host
/// (testbed bench's `spin` case).
pub const LOW_LATENCY_WORKER_SPIN_US: u64 = crate::worker::LOW_LATENCY_SPIN.as_micros() as u64;
/// Largest `--record-max-mib`, `--record-max-total-mib` and `--trace-max-mib`: 1 TiB.
pub const MAX_RECORD_MIB: u64 = 1 << 20;

const EXAMPLES: &str = "\
Examples:
  Serve both functions, each on its own vfio-user socket, with a control socket:
    device-model --hfi1 /tmp/hfi1.sock --irdma /tmp/irdma.sock --control /tmp/dm.sock

  An HFI with the real chip's personality, for the guest's own hfi1 driver (docs/hfi1-kernel-driver.md):
    device-model --hfi1-wfr /tmp/wfr.sock --control /tmp/dm.sock

  Two of them on one cable, an Omni-Path fabric, with a wire capture for Wireshark (docs/hfi1-fabric.md):
    device-model --hfi1-wfr /tmp/wfr0.sock --hfi1-wfr /tmp/wfr1.sock --control /tmp/dm.sock --capture /tmp/opa.pcap
    echo '{\"device\":\"hfi1-wfr\",\"cmd\":\"link\"}' | socat - UNIX-CONNECT:/tmp/dm.sock
    tshark -r /tmp/opa.pcap
  and attach QEMU to one of them:
    qemu-system-x86_64 ... -device '{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"/tmp/hfi1.sock\",\"type\":\"unix\"}}'

  QEMU running as another user (the vfio-user sockets are 0600, this user's only, by default): let the
  socket's group in, and make it a group QEMU's user is in:
    device-model --hfi1-wfr /tmp/wfr.sock --socket-mode 0660 &
    chgrp kvm /tmp/wfr.sock

  Backend program convention, one device per process:
    device-model --socket-path /tmp/irdma.sock --device irdma
    device-model --fd 3 --device hfi1        # FD 3: an inherited UNIX socket, already listening

  Serve one client per socket, then exit (tests):
    device-model --hfi1 /tmp/hfi1.sock --once --log-level debug

  A smaller hfi1, a bigger qhash table, other PCI IDs:
    device-model --hfi1 /tmp/h.sock --hfi1-contexts 8 --hfi1-rcvarray-entries 2048 \\
                 --irdma /tmp/i.sock --irdma-qhash-capacity 4096 --irdma-ids 1b36:1102

  Query the control socket (JSON lines):
    echo '{\"cmd\":\"list\"}' | socat - UNIX-CONNECT:/tmp/dm.sock
    echo '{\"device\":\"irdma\",\"cmd\":\"dump\"}' | socat - UNIX-CONNECT:/tmp/dm.sock
    echo '{\"cmd\":\"reset\",\"device\":\"hfi1\"}' | socat - UNIX-CONNECT:/tmp/dm.sock

  Trace register accesses by name, the flow table in detail, JSON lines to a file (docs/observe.md):
    device-model --hfi1 /tmp/h.sock --trace 'hfi1=debug,hfi1::dma=trace' --trace-format json --trace-file /tmp/t.jsonl

  Fail the second quad-hash WQE with the device's duplicate-entry codes, drop the fourth CQE:
    device-model --irdma /tmp/i.sock --fault 'irdma:cqp-fail,op=manage-qhash,major=0x8002,minor=1,nth=2' \\
                 --fault 'irdma:cqe-drop,nth=4'

  Record every session, replay one on a fresh device model, turn it into fuzz seeds:
    device-model --hfi1 /tmp/h.sock --irdma /tmp/i.sock --record /tmp/rec
    device-model replay /tmp/rec/irdma-1.vfurec
    device-model seeds /tmp/rec/irdma-1.vfurec --out fuzz/corpus/vfio_user_server

  The same at run time, on the control socket:
    echo '{\"cmd\":\"trace\",\"filter\":\"irdma::cqp=info\"}' | socat - UNIX-CONNECT:/tmp/dm.sock
    echo '{\"device\":\"irdma\",\"cmd\":\"fault\",\"add\":\"cqe-delay,ms=500\"}' | socat - UNIX-CONNECT:/tmp/dm.sock
    echo '{\"cmd\":\"help\"}' | socat - UNIX-CONNECT:/tmp/dm.sock

Default PCI IDs are 1b36:1100 (hfi1, class 020800) and 1b36:1101 (irdma, class 020000), which no in-tree
Linux driver claims. Giving a real chip's IDs lets the guest's own hfi1/ice driver bind to the emulation.";

/// The long help: the examples, then the trace blocks and faults, listed from their definitions.
pub fn long_help() -> String {
    let mut s = format!("{EXAMPLES}\n\n{}", reference());
    s.truncate(s.trim_end().len());
    s
}

/// Trace filter syntax, blocks and the fault spec language, for `--help` and the control socket's `help`.
pub fn reference() -> String {
    let mut s = String::from(
        "Trace filters (--trace, {\"cmd\":\"trace\",\"filter\":...}): comma-separated TARGET=LEVEL, RUST_LOG style;\n\
         TARGET is DEVICE, DEVICE::BLOCK or *::BLOCK; LEVEL off|info (engine events)|debug (+ registers)|trace (+ DMA).\n\
         Blocks:\n",
    );
    for b in Block::ALL {
        s.push_str(&format!("  {:<10} {}\n", b.name(), b.doc()));
    }
    s.push_str(
        "\nFaults (--fault, {\"device\":D,\"cmd\":\"fault\",\"add\":SPEC}): [DEVICE:]FAULT[,KEY=VALUE]...; triggers:\n\
         nth=N (first matching event that fires, default 1), count=K|forever (default 1; forever for lasting\n\
         faults), prob=P seed=S (seeded probability from the Nth event on). Counts restart with each client.\n",
    );
    for k in FaultKind::ALL {
        let (keys, doc) = k.usage();
        let keys = if keys.is_empty() { String::new() } else { format!(" [{}]", keys.join(", ")) };
        let only = k.devices().map_or("any device".to_string(), |d| d.join("/"));
        s.push_str(&format!("  {:<16} {doc}{keys} ({only})\n", k.name()));
    }
    s
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKind {
    Hfi1,
    /// The hfi1 engine with the real chip's personality, for the stock Linux hfi1 driver.
    Hfi1Wfr,
    Irdma,
}

impl DeviceKind {
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Hfi1 => "hfi1",
            DeviceKind::Hfi1Wfr => "hfi1-wfr",
            DeviceKind::Irdma => "irdma",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub fn level(self) -> tracing::Level {
        match self {
            LogLevel::Error => tracing::Level::ERROR,
            LogLevel::Warn => tracing::Level::WARN,
            LogLevel::Info => tracing::Level::INFO,
            LogLevel::Debug => tracing::Level::DEBUG,
            LogLevel::Trace => tracing::Level::TRACE,
        }
    }
}

/// A PCI vendor:device pair from the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VendorDevice {
    pub vendor_id: u16,
    pub device_id: u16,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CliError {
    #[error("\"{0}\" is not VENDOR:DEVICE (two hex IDs, e.g. 1b36:1100)")]
    IdsFormat(String),
    #[error("\"{0}\" is not a 16-bit hex ID")]
    IdHex(String),
    #[error("vendor ID {0:#06x} means \"no device\" to PCI enumeration")]
    IdReserved(u16),
    #[error("\"{0}\" is not a file descriptor number")]
    Fd(String),
    #[error("RcvArray entries must be a multiple of {RCV_ARRAY_GRANULE} in {RCV_ARRAY_GRANULE}..={MAX_RCV_ARRAY_ENTRIES}, not \"{0}\"")]
    RcvArrayEntries(String),
    #[error("nothing to serve: give --hfi1 PATH, --hfi1-wfr PATH, --irdma PATH, or --socket-path PATH / --fd FD with --device")]
    NothingToServe,
    #[error("--hfi1-wfr is given {0} times: a process serves at most {MAX_WFR_FUNCTIONS} chip-personality functions (the two ends of a cable)")]
    TooManyWfr(usize),
    #[error("--socket-path and --fd need --device hfi1|hfi1-wfr|irdma")]
    DeviceMissing,
    #[error("--device only goes with --socket-path or --fd")]
    DeviceWithoutSocket,
    #[error("{0} is used twice: each device and the control socket need their own socket path")]
    PathReused(PathBuf),
    #[error("{0} needs a cable: give --hfi1-wfr twice")]
    NeedsCable(&'static str),
    #[error("{option} given but {device} is not served")]
    OptionForAbsentDevice { option: &'static str, device: &'static str },
    #[error("--fault {spec}: {why}")]
    Fault { spec: String, why: String },
    #[error("\"{0}\" is not a socket mode: give octal permission bits 0600..=0777 (e.g. 0660), the owner keeping read and write")]
    SocketMode(String),
}

#[derive(Debug, Clone, PartialEq, Parser)]
#[command(
    name = "device-model",
    version,
    about = "vfio-user server emulating the hfi1 TID receive side and the irdma control QP as PCI functions",
    long_about = "vfio-user server emulating two Intel RDMA engines as PCI functions: the hfi1 (Omni-Path HFI) TID \
receive structures and the irdma (E810) control QP. Each device is served on its own UNIX socket to one vfio-user \
client at a time (QEMU's vfio-user-pci, or a direct client); when a client leaves, the device is reset and the \
next client is served. An optional control socket (JSON lines) injects packets, dumps state and resets devices.",
    after_help = "See --help for examples, trace blocks and faults.",
    after_long_help = long_help(),
    args_conflicts_with_subcommands = true
)]
pub struct Args {
    /// A tool instead of serving devices.
    #[command(subcommand)]
    pub tool: Option<Tool>,

    /// Serve the hfi1 function on a vfio-user socket created at PATH (a stale socket is replaced).
    #[arg(long, value_name = "PATH")]
    pub hfi1: Option<PathBuf>,

    /// Serve an hfi1 function with the real chip's personality (PCI 8086:24f0, the chip's BAR0 map, no
    /// loopback block) on a vfio-user socket created at PATH, for the stock Linux hfi1 driver. Given twice,
    /// two such functions ("hfi1-wfr" and "hfi1-wfr1", node GUIDs ...01 and ...02) are served.
    #[arg(long, value_name = "PATH")]
    pub hfi1_wfr: Vec<PathBuf>,

    /// Record every packet that crosses the cable between the two --hfi1-wfr functions to FILE: a pcap of
    /// ERF records that Wireshark and tshark decode as Omni-Path (the ERF interface is the direction: 0 from
    /// the first function to the second). Also {"device":"hfi1-wfr","cmd":"capture","file":...}.
    #[arg(long, value_name = "FILE")]
    pub capture: Option<PathBuf>,

    /// Most MiB the capture file takes, 1..=1048576 [default: 1024]; later packets are left out and counted.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=crate::hfi1::CAPTURE_MAX_MIB))]
    pub capture_max_mib: Option<u64>,

    /// How long the cable's link trains once both ends poll, 0..=60000 [default: 1000]. A real link takes
    /// seconds; the stock driver needs its IB device registered before the link comes up (docs/hfi1-fabric.md).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub link_training_ms: Option<u64>,

    /// The implementation code the --hfi1-wfr functions report [default: functional-simulator]:
    /// functional-simulator (no firmware; the stock driver cannot take an up link down on it) or
    /// rtl-simulation (the driver loads and authenticates 8051 firmware, hfi_dc8051.bin from
    /// hfi1-dc8051-image, and runs the full link bring-up; docs/hfi1-fabric.md).
    #[arg(long, value_name = "ICODE", value_parser = crate::hfi1::wfr::Icode::parse)]
    pub hfi1_wfr_icode: Option<crate::hfi1::wfr::Icode>,

    /// Serve the irdma function on a vfio-user socket created at PATH (a stale socket is replaced).
    #[arg(long, value_name = "PATH")]
    pub irdma: Option<PathBuf>,

    /// Backend program convention: serve the single device chosen by --device on a socket created at PATH.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["fd", "hfi1", "hfi1_wfr", "irdma"])]
    pub socket_path: Option<PathBuf>,

    /// Backend program convention: serve the single device chosen by --device on the inherited, already
    /// listening UNIX socket FD.
    #[arg(long, value_name = "FD", value_parser = parse_fd, conflicts_with_all = ["socket_path", "hfi1", "hfi1_wfr", "irdma"])]
    pub fd: Option<i32>,

    /// The device served on --socket-path or --fd.
    #[arg(long, value_enum, value_name = "DEVICE")]
    pub device: Option<DeviceKind>,

    /// Also serve the control socket (JSON lines: list, dump, inject, reset) at PATH, mode 0600, for this
    /// user and root only (--socket-mode does not widen it).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,

    /// Permission bits of the vfio-user sockets created, in octal, 0600..=0777 [default: 0600]. A socket has
    /// them from the moment it appears, whatever the umask. A connecting process of another user is refused
    /// (closed and counted, {"cmd":"sockets"}) unless they let it in: group write (0660) admits members of
    /// the socket's group, write for others (0666) anyone; this user and root are always admitted. For QEMU
    /// running as another user. Also applies to an inherited --fd socket (its group: this process's).
    #[arg(long, value_name = "MODE", value_parser = parse_socket_mode)]
    pub socket_mode: Option<u32>,

    /// PCI vendor:device IDs of the hfi1 function, in hex [default: 1b36:1100].
    #[arg(long, value_name = "VENDOR:DEVICE", value_parser = parse_ids)]
    pub hfi1_ids: Option<VendorDevice>,

    /// PCI vendor:device IDs of the irdma function, in hex [default: 1b36:1101].
    #[arg(long, value_name = "VENDOR:DEVICE", value_parser = parse_ids)]
    pub irdma_ids: Option<VendorDevice>,

    /// Number of hfi1 receive contexts (RCV_CONTEXTS), 1..=160 [default: the engine's].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=RXE_NUM_CONTEXTS as i64))]
    pub hfi1_contexts: Option<u32>,

    /// Number of hfi1 RcvArray entries (RCV_ARRAY_CNT), a multiple of 512 up to 65536 [default: the engine's].
    #[arg(long, value_name = "N", value_parser = parse_rcvarray_entries)]
    pub hfi1_rcvarray_entries: Option<u32>,

    /// Capacity of the irdma quad-hash table, 1..=65536 entries [default: the engine's].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_QHASH_CAPACITY)))]
    pub irdma_qhash_capacity: Option<u32>,

    /// Trade CPU for latency: each connection thread polls its socket for 50 us after a reply while requests
    /// come in bursts, and each device worker polls its queue for 50 us after a job (as --busy-poll-us 50
    /// --worker-spin-us 50; either option given as well overrides its part). Off by default: then every thread
    /// sleeps until its next event, and an idle or sparse client costs no CPU (docs/bench.md, "Quiet by
    /// default").
    #[arg(long)]
    pub low_latency: bool,

    /// How long an idle device worker polls for the next doorbell before it sleeps, in microseconds, 0..=1000
    /// (both engines) [default: 0, 50 with --low-latency].
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(0..=MAX_WORKER_SPIN_US))]
    pub worker_spin_us: Option<u64>,

    /// After each reply, how long a connection's thread polls its socket without blocking while requests come
    /// in bursts, in microseconds, 0..=1000 (0: off) [default: 0, 50 with --low-latency]. Saves a wake-up per
    /// trapped access while a client waits for each reply, at the cost of a busy core while it polls: faster
    /// for a QEMU guest, slower for a client that shares the server's cores (docs/bench.md, case (a)).
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(0..=MAX_BUSY_POLL_US))]
    pub busy_poll_us: Option<u64>,

    /// Agree to `write_multiple` when a client proposes it [default: off]. QEMU 10.1 and 10.2 then send every
    /// request from their I/O thread, a thread hand-off more per trapped access (docs/bench.md, the guest mode).
    #[arg(long)]
    pub write_multiple: bool,

    /// Serve one client per socket, then exit once every socket has had its client.
    #[arg(long)]
    pub once: bool,

    /// Log level (logs go to stderr; RUST_LOG, when set, overrides this).
    #[arg(long, value_enum, value_name = "LEVEL", default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,

    /// Named trace of the devices' events, RUST_LOG-style (`hfi1::flow=debug,irdma=info`; see below).
    #[arg(long, value_name = "FILTER", value_parser = parse_filter)]
    pub trace: Option<Filter>,

    /// Trace lines go to this file (appended) instead of stderr. It must be a regular file (or not exist:
    /// created 0600); a symbolic link or a FIFO is refused.
    #[arg(long, value_name = "PATH")]
    pub trace_file: Option<PathBuf>,

    /// Most MiB a trace file takes, 1..=1048576 [default: 1024]; later lines are left out and counted
    /// ({"cmd":"trace"}'s "dropped_over_cap"), with one warning.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=MAX_RECORD_MIB))]
    pub trace_max_mib: Option<u64>,

    /// Trace lines as text or as JSON lines.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = Format::Text)]
    pub trace_format: Format,

    /// Arm a fault, DEVICE:FAULT[,KEY=VALUE]... (repeatable; see below).
    #[arg(long, value_name = "SPEC", value_parser = parse_fault)]
    pub fault: Vec<FaultSpec>,

    /// Record every client session of every device to DIR/DEVICE-N.vfurec (for `replay` and `seeds`).
    #[arg(long, value_name = "DIR")]
    pub record: Option<PathBuf>,

    /// Most MiB of records one session file takes, 1..=1048576 [default: 4096]; the session's recording stops
    /// there with a warning, and what came before stays readable.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=MAX_RECORD_MIB))]
    pub record_max_mib: Option<u64>,

    /// Most MiB all the session files of one device take together, 1..=1048576 [default: 16384]; a session
    /// that reaches it stops there and later sessions record nothing, counted ({"cmd":"record"}), with one
    /// warning.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=MAX_RECORD_MIB))]
    pub record_max_total_mib: Option<u64>,
}

/// The tools beside the server.
#[derive(Debug, Clone, PartialEq, Subcommand)]
pub enum Tool {
    /// Feeds each recording to a fresh device model and checks that every reply matches; exits 1 otherwise.
    Replay {
        /// Recordings (DEVICE-N.vfurec files, or directories of them).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// One JSON report instead of text.
        #[arg(long)]
        json: bool,
        /// Trace the replayed devices (as --trace; lines to stderr).
        #[arg(long, value_name = "FILTER", value_parser = parse_filter)]
        trace: Option<Filter>,
    },
    /// Turns recordings into seeds for the vfio_user_server fuzz target.
    Seeds {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// Where the seeds go (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Client messages per seed (the target runs at most 48 operations).
        #[arg(long, value_name = "N", default_value_t = 40, value_parser = clap::value_parser!(u64).range(1..=46))]
        window: u64,
        /// Seeds per recording at most, spread over the session.
        #[arg(long, value_name = "N", default_value_t = 32)]
        max: usize,
    },
}

/// Where a device listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// Create a listening socket at this path.
    Path(PathBuf),
    /// An inherited, already listening socket.
    Fd(i32),
}

/// One device to serve, as the command line asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub kind: DeviceKind,
    pub listen: Listen,
    pub ids: PciIds,
    /// Which function of its kind this is (0 but for a second --hfi1-wfr).
    pub instance: u8,
}

impl Served {
    /// The device's name on the control socket, in fault specs and in traces.
    pub fn name(&self) -> &'static str {
        match self.kind {
            DeviceKind::Hfi1Wfr => WFR_NAMES.get(usize::from(self.instance)).copied().unwrap_or(WFR_NAMES[0]),
            k => k.name(),
        }
    }
}

impl Args {
    /// The connections' busy-poll budget: `--busy-poll-us`, else `--low-latency`'s, else none.
    pub fn busy_poll(&self) -> std::time::Duration {
        let default = if self.low_latency { LOW_LATENCY_BUSY_POLL_US } else { 0 };
        std::time::Duration::from_micros(self.busy_poll_us.unwrap_or(default))
    }

    /// The device workers' idle spin in microseconds: `--worker-spin-us`, else `--low-latency`'s, else `None`
    /// (the engines' default, which does not spin).
    pub fn worker_spin_us(&self) -> Option<u64> {
        self.worker_spin_us.or(self.low_latency.then_some(LOW_LATENCY_WORKER_SPIN_US))
    }

    /// The devices to serve, after the checks clap cannot express.
    pub fn served(&self) -> Result<Vec<Served>, CliError> {
        let ids = |kind: DeviceKind| {
            let (default, given) = match kind {
                DeviceKind::Hfi1 => (PciIds::hfi1_default(), self.hfi1_ids),
                DeviceKind::Hfi1Wfr => (PciIds::hfi1_wfr_default(), None),
                DeviceKind::Irdma => (PciIds::irdma_default(), self.irdma_ids),
            };
            given.map_or(default, |g| default.with_vendor_device(g.vendor_id, g.device_id))
        };
        let mut out = Vec::new();
        let single = match (&self.socket_path, self.fd) {
            (Some(p), _) => Some(Listen::Path(p.clone())),
            (None, Some(fd)) => Some(Listen::Fd(fd)),
            (None, None) => None,
        };
        match (single, self.device) {
            (Some(listen), Some(kind)) => out.push(Served { kind, listen, ids: ids(kind), instance: 0 }),
            (Some(_), None) => return Err(CliError::DeviceMissing),
            (None, Some(_)) => return Err(CliError::DeviceWithoutSocket),
            (None, None) => {
                if self.hfi1_wfr.len() > usize::from(MAX_WFR_FUNCTIONS) {
                    return Err(CliError::TooManyWfr(self.hfi1_wfr.len()));
                }
                let wfr = self.hfi1_wfr.iter().enumerate().map(|(i, p)| (DeviceKind::Hfi1Wfr, p, i as u8));
                let devices = self.hfi1.iter().map(|p| (DeviceKind::Hfi1, p, 0)).chain(wfr);
                for (kind, p, instance) in devices.chain(self.irdma.iter().map(|p| (DeviceKind::Irdma, p, 0))) {
                    out.push(Served { kind, listen: Listen::Path(p.clone()), ids: ids(kind), instance });
                }
            }
        }
        if out.is_empty() {
            return Err(CliError::NothingToServe);
        }
        let mut paths: Vec<&PathBuf> = out
            .iter()
            .filter_map(|s| match &s.listen {
                Listen::Path(p) => Some(p),
                Listen::Fd(_) => None,
            })
            .chain(self.control.iter())
            .collect();
        paths.sort();
        if let Some(w) = paths.windows(2).find(|w| w[0] == w[1]) {
            return Err(CliError::PathReused(w[0].clone()));
        }
        let serves = |k: DeviceKind| out.iter().any(|s| s.kind == k);
        let per_device: [(&'static str, bool, DeviceKind); 5] = [
            ("--hfi1-ids", self.hfi1_ids.is_some(), DeviceKind::Hfi1),
            ("--hfi1-contexts", self.hfi1_contexts.is_some(), DeviceKind::Hfi1),
            ("--hfi1-rcvarray-entries", self.hfi1_rcvarray_entries.is_some(), DeviceKind::Hfi1),
            ("--irdma-ids", self.irdma_ids.is_some(), DeviceKind::Irdma),
            ("--irdma-qhash-capacity", self.irdma_qhash_capacity.is_some(), DeviceKind::Irdma),
        ];
        for (option, given, kind) in per_device {
            if given && !serves(kind) {
                return Err(CliError::OptionForAbsentDevice { option, device: kind.name() });
            }
        }
        let cabled = out.iter().filter(|s| s.kind == DeviceKind::Hfi1Wfr).count() == 2;
        for (option, given) in
            [("--capture", self.capture.is_some()), ("--link-training-ms", self.link_training_ms.is_some())]
        {
            if given && !cabled {
                return Err(CliError::NeedsCable(option));
            }
        }
        for f in &self.fault {
            let fail = |why: String| CliError::Fault { spec: f.to_string(), why };
            let device = f.device.as_deref().ok_or_else(|| fail("name the device: DEVICE:FAULT,...".into()))?;
            let Some(target) = out.iter().find(|s| s.name() == device) else {
                return Err(fail(format!("{device} is not served")));
            };
            f.check_device(target.kind.name()).map_err(|e| fail(e.to_string()))?;
        }
        Ok(out)
    }
}

fn parse_hex16(s: &str) -> Result<u16, CliError> {
    let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
    // from_str_radix alone would take a sign.
    if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(CliError::IdHex(s.to_string()));
    }
    u16::from_str_radix(digits, 16).map_err(|_| CliError::IdHex(s.to_string()))
}

/// `VENDOR:DEVICE` in hex, as lspci prints it (`1b36:1100`, `0x8086:0x1592`).
pub fn parse_ids(s: &str) -> Result<VendorDevice, CliError> {
    let (v, d) = s.split_once(':').ok_or_else(|| CliError::IdsFormat(s.to_string()))?;
    let vendor_id = parse_hex16(v.trim())?;
    let device_id = parse_hex16(d.trim())?;
    if vendor_id == 0x0000 || vendor_id == 0xffff {
        return Err(CliError::IdReserved(vendor_id));
    }
    Ok(VendorDevice { vendor_id, device_id })
}

/// A file descriptor number (0 included: a socket on stdin is the inetd convention).
pub fn parse_fd(s: &str) -> Result<i32, CliError> {
    s.parse::<i32>().ok().filter(|fd| *fd >= 0).ok_or_else(|| CliError::Fd(s.to_string()))
}

fn parse_filter(s: &str) -> Result<Filter, String> {
    Filter::parse(s).map_err(|e| e.to_string())
}

fn parse_fault(s: &str) -> Result<FaultSpec, String> {
    FaultSpec::parse(s).map_err(|e| e.to_string())
}

/// Socket permission bits in octal (`0660`, `660`, `0o660`), as [`crate::socket_owner::check_mode`] allows.
pub fn parse_socket_mode(s: &str) -> Result<u32, CliError> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    (!digits.is_empty() && digits.len() <= 4 && digits.bytes().all(|b| (b'0'..=b'7').contains(&b)))
        .then(|| u32::from_str_radix(digits, 8).ok())
        .flatten()
        .filter(|m| crate::socket_owner::check_mode(*m).is_ok())
        .ok_or_else(|| CliError::SocketMode(s.to_string()))
}

/// RcvArray size: a whole number of shared-mapping pages, at most `MAX_RCV_ARRAY_ENTRIES`.
pub fn parse_rcvarray_entries(s: &str) -> Result<u32, CliError> {
    s.parse::<u32>()
        .ok()
        .filter(|n| *n >= RCV_ARRAY_GRANULE && *n <= MAX_RCV_ARRAY_ENTRIES && n % RCV_ARRAY_GRANULE == 0)
        .ok_or_else(|| CliError::RcvArrayEntries(s.to_string()))
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
