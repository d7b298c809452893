//! Quiet by default (issue 31): what the device-model process costs in CPU while idle and with a sparse
//! client (one register read every 2 ms), with its defaults, with every latency knob at zero (the fully
//! event-driven configuration) and with `--low-latency`, side by side in one run.
//!
//! CPU time and wake-ups are the kernel's per-thread counts (`/proc/PID/task/*/schedstat`: run time in ns and
//! how often the thread was scheduled in), summed over the process's threads; they are work, not wall time, so
//! a loaded machine changes them little. The test prints the figures as a benchmark case (`BENCH_CASE` line,
//! which `ci/bench.sh` adds to the results) and asserts what issue 31 asks of the defaults: no wake-up at all
//! while idle, and a sparse client costing at most 1.5x the event-driven configuration's CPU.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use udriver::bench::{Better, Case, Target};
use vfio_user_proto::device::region;
use vfio_user_proto::{Client, ClientConfig};

mod common;

use common::DeviceModel;

/// How long the idle window lasts.
const IDLE: Duration = Duration::from_secs(2);
/// The sparse client: rounds of this many config-space reads, this far apart, the configurations taking turns
/// round by round and each leading in turn (so a burst of load from elsewhere falls on one round of one
/// configuration, and the least disturbed round leaves it out).
const ROUNDS: usize = 6;
const READS_PER_ROUND: u32 = 200;
const SPARSE_GAP: Duration = Duration::from_millis(2);
/// Issue 31: a sparse client costs the defaults at most this multiple of the event-driven configuration's CPU.
const SPARSE_RATIO: f64 = 1.5;
/// A guard against hanging, not a measure: every condition waited on holds within milliseconds.
const HANG_GUARD: Duration = Duration::from_secs(30);

/// The configurations compared: a name, and the options besides the sockets.
const CONFIGS: [(&str, &[&str]); 3] = [
    ("defaults", &[]),
    ("event-driven", &["--busy-poll-us", "0", "--worker-spin-us", "0"]),
    ("--low-latency", &["--low-latency"]),
];

/// CPU time and scheduling of a process's live threads, from the kernel's counts.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    cpu_ns: u64,
    /// Times a thread was scheduled in: each is a wake-up (or a preemption of a running thread).
    runs: u64,
}

impl std::ops::Sub for Usage {
    type Output = Usage;
    fn sub(self, before: Usage) -> Usage {
        Usage { cpu_ns: self.cpu_ns.saturating_sub(before.cpu_ns), runs: self.runs.saturating_sub(before.runs) }
    }
}

fn tasks(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.filter_map(|t| t.ok()).map(|t| t.path()).collect())
        .unwrap_or_default()
}

fn usage(pid: u32) -> Usage {
    let mut u = Usage::default();
    for t in tasks(pid) {
        let Ok(s) = std::fs::read_to_string(t.join("schedstat")) else { continue };
        let f: Vec<u64> = s.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        if let [run_ns, _wait_ns, runs] = f[..] {
            u.cpu_ns += run_ns;
            u.runs += runs;
        }
    }
    u
}

/// Whether every thread of `pid` sleeps in the kernel (state S): the process has started all its threads (the
/// main thread spawns them before it sleeps) and each has reached its blocking wait.
fn all_asleep(pid: u32) -> bool {
    let states: Vec<char> = tasks(pid)
        .iter()
        .filter_map(|t| std::fs::read_to_string(t.join("stat")).ok())
        .filter_map(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()))
        .collect();
    !states.is_empty() && states.iter().all(|&c| c == 'S')
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `path` is a listening UNIX socket (its line in /proc/net/unix has __SO_ACCEPTCON): ready for a
/// client, found without connecting to it.
fn listening(path: &Path) -> bool {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let path = path.display().to_string();
    table.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 8 && f[7] == path && u32::from_str_radix(f[3], 16).is_ok_and(|flags| flags & 0x10000 != 0)
    })
}

/// A device model serving hfi1 and irdma with `options`, once both sockets listen and every thread sleeps.
fn start(tag: &str, options: &[&str]) -> DeviceModel {
    let mut args = vec!["--hfi1", "hfi1.sock", "--irdma", "irdma.sock"];
    args.extend_from_slice(options);
    let dm = DeviceModel::start(&format!("quiet-{tag}"), &args);
    let pid = dm.child.id();
    wait_until("both sockets listen", || ["hfi1.sock", "irdma.sock"].iter().all(|s| listening(&dm.sock(s))));
    wait_until("every thread sleeps", || all_asleep(pid));
    dm
}

/// What one configuration costs: idle, and per round under the sparse client.
struct Figures {
    idle: Usage,
    rounds: Vec<Usage>,
}

impl Figures {
    /// The least disturbed round: load from elsewhere only adds CPU time (cache misses, a vCPU descheduled
    /// while it runs our thread), never takes it away, so the lowest round is the nearest to what the
    /// configuration itself costs.
    fn sparse(&self) -> Usage {
        self.rounds.iter().copied().min_by_key(|u| u.cpu_ns).unwrap_or_default()
    }
}

/// Every configuration started, idle side by side, then the sparse client's rounds taking turns.
fn measure() -> Vec<(&'static str, Figures)> {
    let dms: Vec<(&str, DeviceModel)> = CONFIGS.iter().map(|(name, opts)| (*name, start(name, opts))).collect();
    let before: Vec<Usage> = dms.iter().map(|(_, dm)| usage(dm.child.id())).collect();
    std::thread::sleep(IDLE);
    let idle: Vec<Usage> = dms.iter().zip(&before).map(|((_, dm), b)| usage(dm.child.id()) - *b).collect();
    let clients: Vec<Client> = dms
        .iter()
        .map(|(name, dm)| {
            let c = Client::connect(&dm.dir.join("hfi1.sock"), ClientConfig::default()).unwrap();
            let mut id = [0u8; 4];
            c.region_read(region::CONFIG, 0, &mut id).unwrap();
            assert_eq!(id, [0x36, 0x1b, 0x00, 0x11], "{name}: the hfi1 function answers");
            c
        })
        .collect();
    let mut rounds: Vec<Vec<Usage>> = vec![Vec::new(); dms.len()];
    for round in 0..ROUNDS {
        // Each configuration leads a round in turn: none is always first after the pause between rounds.
        for k in (0..dms.len()).map(|i| (i + round) % dms.len()) {
            let ((_, dm), client) = (&dms[k], &clients[k]);
            let pid = dm.child.id();
            let before = usage(pid);
            let mut b = [0u8; 4];
            for _ in 0..READS_PER_ROUND {
                // The client's pace: the workload, not a wait for the server.
                std::thread::sleep(SPARSE_GAP);
                client.region_read(region::CONFIG, 0, &mut b).unwrap();
            }
            rounds[k].push(usage(pid) - before);
        }
    }
    drop(clients);
    dms.into_iter()
        .zip(idle)
        .zip(rounds)
        .map(|(((name, _dm), idle), rounds)| (name, Figures { idle, rounds }))
        .collect()
}

#[test]
fn an_idle_device_model_never_wakes_and_a_sparse_client_costs_the_defaults_no_more_than_event_driven() {
    // Does this kernel count per-thread run time (schedstats)? This process has run, so its count is not 0.
    let me = usage(std::process::id());
    assert!(me.cpu_ns > 0, "no per-thread run time in /proc/PID/task/*/schedstat on this kernel");
    let figures = measure();
    let get = |name: &str| &figures.iter().find(|(n, _)| *n == name).unwrap().1;

    let mut case = Case::new("quiet", "device-model CPU while idle and with a sparse client (one read every 2 ms)");
    for (name, f) in &figures {
        let sparse = f.sparse();
        case.metric(&format!("{name}: idle, CPU over {} s", IDLE.as_secs()), f.idle.cpu_ns as f64 / 1e6, "ms");
        case.metric(&format!("{name}: idle, thread wake-ups over {} s", IDLE.as_secs()), f.idle.runs as f64, "");
        case.metric(
            &format!("{name}: sparse client, CPU per round (least disturbed)"),
            sparse.cpu_ns as f64 / 1e6,
            "ms",
        );
        case.metric(
            &format!("{name}: sparse client, CPU per read"),
            sparse.cpu_ns as f64 / f64::from(READS_PER_ROUND) / 1e3,
            "us",
        );
        case.metric(&format!("{name}: sparse client, thread wake-ups in that round"), sparse.runs as f64, "");
    }
    let ratio = |name: &str| get(name).sparse().cpu_ns as f64 / (get("event-driven").sparse().cpu_ns.max(1)) as f64;
    case.metric("--low-latency / event-driven, sparse client CPU", ratio("--low-latency"), "x");
    case.target(Target::new(
        "sparse client: defaults / event-driven CPU",
        ratio("defaults"),
        SPARSE_RATIO,
        "x",
        Better::Lower,
    ));
    case.target(Target::new(
        "idle: wake-ups of the defaults' threads",
        get("defaults").idle.runs as f64,
        0.0,
        "",
        Better::Lower,
    ));
    case.note(format!(
        "device-model --hfi1 --irdma spawned once per configuration (defaults; --busy-poll-us 0 --worker-spin-us \
         0; --low-latency), all idle side by side for {} s once every thread sleeps; then a client of each hfi1 \
         socket reads config space {READS_PER_ROUND} times, {} ms apart, the configurations taking turns for \
         {ROUNDS} rounds, each configuration's least disturbed round judged; CPU and wake-ups summed over each process's threads from \
         /proc/PID/task/*/schedstat",
        IDLE.as_secs(),
        SPARSE_GAP.as_millis()
    ));
    println!("BENCH_CASE {}", serde_json::to_string(&case).unwrap());
    for t in &case.targets {
        assert!(t.met, "{}: {} (bound {})", t.what, t.measured, t.bound);
    }
    for name in ["event-driven", "--low-latency"] {
        assert_eq!(get(name).idle.runs, 0, "{name}: an idle device model wakes for nothing");
    }
}
