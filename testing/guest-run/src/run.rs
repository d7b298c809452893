//! `guest-run run`: one guest run, as `ci/run-qemu.sh` launches it (its options are that script's, described in
//! its header): the device model started, the guest built and booted in QEMU, its console read and its requests
//! answered (`console`), a stuck step stopped, and the verdict written.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;

use crate::console::{self, Line, Request, Watch};
use crate::control::{self, Control};
use crate::dm::{self, Server};
use crate::qemu::{Console, Machine, VfioUser};
use crate::scenario::{self, RunOptions};
use crate::verdict::{self, EarlyFailure, Facts};
use crate::write_json;

/// Small enough for TCG: 2 kernel and 1 user receive contexts, one SDMA engine, no accelerated IP
/// (docs/hfi1-kernel-driver.md).
pub const HFI1_PARAMS: &str =
    "num_vls=1 num_sdma=1 krcvqs=1 num_user_contexts=1 cap_mask=0x4c09000cb9a eager_buffer_size=131072 rcvhdrcnt=64";
/// A user's shell session, and a fuzz-wire run the fuzzer ends, have no deadline unless asked for.
const SHELL_TIMEOUT_S: u64 = 100 * 365 * 86400;
/// A fuzz-wire run with --fuzz-secs: the boot and the fabric's bring-up under TCG (a few minutes), beyond the
/// fuzz time.
const FUZZ_SETUP_S: u64 = 900;
/// The file in the log directory that holds the fuzz-wire guest's latest report (`fuzz-target` requests).
pub const FUZZ_TARGET_FILE: &str = "fuzz-target.json";
/// The fabric run (about 2 minutes under TCG) and then some 60 perftest runs with their set-ups.
const PERF_TIMEOUT_S: u64 = 1800;

/// `ci/run-qemu.sh`'s options (its header describes each).
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[arg(long)]
    pub device_model: Option<PathBuf>,
    #[arg(long = "dm-arg", allow_hyphen_values = true)]
    pub dm_args: Vec<String>,
    #[arg(long)]
    pub sockets: Option<PathBuf>,
    #[arg(long)]
    pub hotplug: bool,
    #[arg(long)]
    pub allow_reboot: bool,
    #[arg(long)]
    pub udriver: Option<PathBuf>,
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    #[arg(long)]
    pub initrd: Option<PathBuf>,
    #[arg(long)]
    pub no_share: bool,
    #[arg(long)]
    pub no_devices: bool,
    #[arg(long)]
    pub accel: Option<String>,
    #[arg(long)]
    pub timeout: Option<u64>,
    #[arg(long, default_value_t = 120)]
    pub demo_timeout: u64,
    #[arg(long = "args", allow_hyphen_values = true, default_value = "")]
    pub udriver_args: String,
    #[arg(long, default_value = "1b36:1100")]
    pub hfi1_id: String,
    #[arg(long, default_value = "1b36:1101")]
    pub irdma_id: String,
    #[arg(long)]
    pub hfi1_wfr: bool,
    #[arg(long)]
    pub fabric: bool,
    #[arg(long)]
    pub capture: Option<PathBuf>,
    #[arg(long)]
    pub fabric_bounce: bool,
    #[arg(long, default_value = "rtl-simulation")]
    pub icode: String,
    #[arg(long, default_value = "translated")]
    pub hfi1_dma: String,
    #[arg(long)]
    pub fabric_perf: bool,
    #[arg(long)]
    pub tid_rdma: bool,
    #[arg(long)]
    pub psm2: bool,
    #[arg(long)]
    pub fuzz_wire: bool,
    #[arg(long, default_value_t = 0)]
    pub fuzz_secs: u64,
    #[arg(long)]
    pub shell: bool,
    #[arg(long, default_value = HFI1_PARAMS, allow_hyphen_values = true)]
    pub hfi1_params: String,
    #[arg(long, default_value_t = 120)]
    pub kdriver_timeout: u64,
    #[arg(long)]
    pub hfi1_user: Option<PathBuf>,
    #[arg(long)]
    pub hfi1_user_host: Option<PathBuf>,
    #[arg(long)]
    pub bench: bool,
    #[arg(long)]
    pub testbed: Option<PathBuf>,
    #[arg(long, default_value_t = 1000)]
    pub bench_budget_ms: u64,
    #[arg(long)]
    pub reply_poll_us: Option<u64>,
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub append: String,
    #[arg(long)]
    pub result: Option<PathBuf>,
    #[arg(long)]
    pub logs: Option<PathBuf>,
    #[arg(long)]
    pub keep_logs: bool,
    #[arg(long)]
    pub timing: bool,
    #[arg(long)]
    pub quiet: bool,
    /// Extra QEMU arguments (after `--`).
    #[arg(last = true)]
    pub qemu_extra: Vec<String>,
}

pub fn log(msg: &str) {
    eprintln!("\x1b[1m[{}] {msg}\x1b[0m", clock());
}

fn error(msg: &str) {
    eprintln!("\x1b[31m[{}] error: {msg}\x1b[0m", clock());
}

/// The local time of day, as `date +%H:%M:%S` prints it.
fn clock() -> String {
    Command::new("date")
        .arg("+%H:%M:%S")
        .output()
        .ok()
        .map_or_else(String::new, |o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn epoch() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn is_pci_id(id: &str) -> bool {
    id == "none"
        || (id.len() == 9
            && id.as_bytes()[4] == b':'
            && id.bytes().enumerate().all(|(i, b)| i == 4 || b.is_ascii_hexdigit()))
}

/// The run's options once defaults and implications are applied and checked.
#[derive(Debug, Clone)]
pub struct Plan {
    pub a: RunArgs,
    pub accel: String,
    pub timeout_s: u64,
    pub timeout_set: bool,
    pub reply_poll_us: u64,
    pub reply_poll_set: bool,
    pub scenario: &'static str,
    pub mode: &'static str,
    pub memory: &'static str,
}

/// Applies `ci/run-qemu.sh`'s implications and checks (`Err`: the message it dies with).
pub fn plan(mut a: RunArgs) -> Result<Plan, String> {
    if a.shell && !a.hfi1_wfr {
        a.fabric = true;
    }
    if a.tid_rdma || a.psm2 || a.fuzz_wire {
        a.fabric = true;
    }
    if a.fabric {
        a.hfi1_wfr = true;
    }
    let accel = a.accel.clone().or_else(|| env("RDMA_EMU_ACCEL")).unwrap_or_else(|| "auto".into());
    let timeout_set = a.timeout.is_some();
    let timeout_s = a.timeout.unwrap_or(if a.shell || (a.fuzz_wire && a.fuzz_secs == 0) {
        SHELL_TIMEOUT_S
    } else if a.fuzz_wire {
        a.fuzz_secs.saturating_add(FUZZ_SETUP_S)
    } else if a.fabric_perf {
        PERF_TIMEOUT_S
    } else {
        600
    });
    let env_poll = env("RDMA_EMU_REPLY_POLL_US");
    let reply_poll_set = a.reply_poll_us.is_some() || env_poll.is_some();
    let reply_poll_us = match (a.reply_poll_us, env_poll) {
        (Some(v), _) => v,
        (None, Some(v)) => v.parse().map_err(|_| "--reply-poll-us must be a number of microseconds <= 1000000")?,
        (None, None) => 50,
    };
    let checks: &[(bool, &str)] = &[
        (timeout_s >= 10, "--timeout must be a number of seconds >= 10"),
        (a.demo_timeout >= 1, "--demo-timeout must be a number of seconds"),
        (is_pci_id(&a.hfi1_id), "--hfi1-id must be VVVV:DDDD or none"),
        (is_pci_id(&a.irdma_id), "--irdma-id must be VVVV:DDDD or none"),
        (!a.udriver_args.contains('"'), "--args cannot contain a double quote (it travels on the kernel command line)"),
        (
            a.hfi1_params.bytes().all(|b| b.is_ascii_alphanumeric() || b"_=,. -".contains(&b)),
            "--hfi1-params takes name=value words only (it travels on the kernel command line)",
        ),
        (a.kdriver_timeout >= 1, "--kdriver-timeout must be a number of seconds"),
        (a.hfi1_user_host.is_none() || a.hfi1_wfr, "--hfi1-user-host needs --hfi1-wfr"),
        (matches!(accel.as_str(), "auto" | "tcg" | "kvm"), "--accel must be auto, tcg or kvm"),
        (a.bench_budget_ms >= 1, "--bench-budget-ms must be a number of milliseconds"),
        (reply_poll_us <= 1_000_000, "--reply-poll-us must be a number of microseconds <= 1000000"),
        (!a.bench || !a.no_devices, "--bench needs the devices"),
        (!(a.shell && a.bench), "--shell and --bench do not go together"),
        (!(a.shell && a.no_devices), "--shell sets up the devices: not with --no-devices"),
        (!(a.shell && a.hfi1_user_host.is_some()), "--shell runs no hfi1-user (no --hfi1-user-host)"),
        (!a.fabric || a.shell || a.hfi1_user_host.is_none(), "--fabric runs no hfi1-user (no --hfi1-user-host)"),
        (a.capture.is_none() || a.fabric, "--capture needs --fabric"),
        (!a.fabric_bounce || a.fabric, "--fabric-bounce needs --fabric"),
        (
            matches!(a.icode.as_str(), "rtl-simulation" | "functional-simulator"),
            "--icode must be rtl-simulation or functional-simulator",
        ),
        (matches!(a.hfi1_dma.as_str(), "translated" | "identity"), "--hfi1-dma must be translated or identity"),
        (!a.fabric_perf || (a.fabric && !a.shell), "--fabric-perf needs --fabric (and no --shell)"),
        (
            !(a.fabric_perf && a.fabric_bounce),
            "--fabric-perf and --fabric-bounce do not go together (the bounce run stops after the link)",
        ),
        (!(a.tid_rdma && a.fabric_bounce), "--tid-rdma and --fabric-bounce do not go together"),
        (
            !(a.psm2 && (a.tid_rdma || a.fabric_bounce || a.fabric_perf)),
            "--psm2 runs its own steps: not with --tid-rdma, --fabric-bounce or --fabric-perf",
        ),
        (!(a.bench && a.sockets.is_some()), "--bench starts its own servers: not with --sockets"),
        (
            !(a.fuzz_wire && (a.psm2 || a.tid_rdma || a.fabric_bounce || a.fabric_perf || a.shell || a.no_devices)),
            "--fuzz-wire runs its own steps: not with --psm2, --tid-rdma, --fabric-bounce, --fabric-perf, --shell or \
             --no-devices",
        ),
        (a.fuzz_secs == 0 || a.fuzz_wire, "--fuzz-secs needs --fuzz-wire"),
    ];
    if let Some((_, msg)) = checks.iter().find(|(ok, _)| !ok) {
        return Err(msg.to_string());
    }
    if let Some(h) = &a.hfi1_user_host {
        if !is_executable(h) {
            return Err(format!("--hfi1-user-host {} is not executable", h.display()));
        }
    }
    if a.tid_rdma {
        a.hfi1_params = tid_rdma_params(&a.hfi1_params)?;
    }
    if a.psm2 {
        a.hfi1_params = psm2_params(&a.hfi1_params);
    }
    let scenario = if a.bench {
        "bench"
    } else if a.no_devices {
        "no-devices"
    } else if a.shell {
        "shell"
    } else if a.fabric_bounce {
        "fabric-bounce"
    } else if a.tid_rdma {
        "tid-rdma"
    } else if a.psm2 {
        "psm2"
    } else if a.fuzz_wire {
        "fuzz-wire"
    } else if a.fabric {
        "fabric"
    } else if a.hfi1_wfr {
        "kernel-driver"
    } else if a.sockets.is_some() {
        "lifecycle"
    } else {
        "demo"
    };
    let mode = match (a.no_devices, a.no_share) {
        (true, _) => "no-devices",
        (false, false) => "share",
        (false, true) => "no-share",
    };
    let memory = if a.no_share { "ram-private" } else { "memfd-shared" };
    Ok(Plan { a, accel, timeout_s, timeout_set, reply_poll_us, reply_poll_set, scenario, mode, memory })
}

/// The hfi1 module parameters of a TID RDMA run. HFI1_CAP_TID_RDMA (1 << 5) and HFI1_CAP_OPFN (1 << 16),
/// include/uapi/rdma/hfi/hfi1_user.h, are ORed into the cap_mask (the driver's default mask has neither, common.h
/// HFI1_CAP_MASK_DEFAULT). And a smaller RcvArray partition, so the tid-exhaust step runs a kernel context out of
/// RcvArray groups as well as flows: 14 user contexts and the 2 kernel ones share the chip's 16 receive contexts,
/// so each gets 512 / 16 = 32 groups of the 4096 entries (set_up_context_variables, chip.c:13484-13491) instead
/// of 170.
pub fn tid_rdma_params(params: &str) -> Result<String, String> {
    const CAP_TID_RDMA: u64 = 1 << 5;
    const CAP_OPFN: u64 = 1 << 16;
    let mut words: Vec<String> = params.split_whitespace().map(String::from).collect();
    let cap = words
        .iter_mut()
        .find_map(|w| {
            w.strip_prefix("cap_mask=0x").or_else(|| w.strip_prefix("cap_mask=0X")).map(String::from).map(|v| (v, w))
        })
        .and_then(|(v, w)| u64::from_str_radix(&v, 16).ok().map(|m| (m, w)));
    let Some((mask, word)) = cap else {
        return Err("--tid-rdma needs a hexadecimal cap_mask in --hfi1-params".into());
    };
    *word = format!("cap_mask={:#x}", mask | CAP_TID_RDMA | CAP_OPFN);
    match words.iter_mut().find(|w| w.starts_with("num_user_contexts=")) {
        Some(w) => *w = "num_user_contexts=14".into(),
        None => words.push("num_user_contexts=14".into()),
    }
    Ok(words.join(" "))
}

/// The hfi1 module parameters of a PSM2 run (psm2-on-hfi1 reference, "Module"): a user context per rank on each
/// HFI and to spare (PSM2 takes one per process, file_ops.c allocate_ctxt), and a header queue and eager buffers
/// of the size PSM2 expects, so its receive queues do not overflow: 2048 header entries (rcvhdrcnt, init.c) and
/// 2 MiB of eager buffers per context (eager_buffer_size).
pub fn psm2_params(params: &str) -> String {
    let set = [("num_user_contexts", "4"), ("rcvhdrcnt", "2048"), ("eager_buffer_size", "2097152")];
    let mut words: Vec<String> = params.split_whitespace().map(String::from).collect();
    for (name, value) in set {
        let word = format!("{name}={value}");
        match words.iter_mut().find(|w| w.split_once('=').is_some_and(|(k, _)| k == name)) {
            Some(w) => *w = word,
            None => words.push(word),
        }
    }
    words.join(" ")
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn is_socket(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// A run that ended before the guest could report: its result file says why, so nobody reads a stale one.
struct Fail(String);

pub struct Run {
    p: Plan,
    repo: PathBuf,
    target_dir: PathBuf,
    result: PathBuf,
    log_dir: PathBuf,
    qemu: PathBuf,
    kernel: PathBuf,
    initrd: PathBuf,
    accel: String,
    reply_poll: Option<u64>,
    control_sock: PathBuf,
    chips: Vec<String>,
    dm: Option<Server>,
    dm_status: String,
    dm_start_s: Option<f64>,
    peers: Option<Server>,
    started: Instant,
}

impl Run {
    /// The scenario table's row of this run (plan() picks only names of rows).
    fn row(&self) -> &'static scenario::Scenario {
        scenario::find(self.p.scenario).unwrap_or(&scenario::SCENARIOS[0])
    }

    /// The guest machine: the row's, except that `--shell --psm2` boots the psm2 row's (its layer, CPU and RAM)
    /// for the user's own PSM2 programs.
    fn guest(&self) -> scenario::Guest {
        match scenario::find("psm2") {
            Some(psm2) if self.p.a.psm2 => psm2.guest,
            _ => self.row().guest,
        }
    }

    fn row_options(&self) -> RunOptions {
        RunOptions {
            fabric_perf: self.p.a.fabric_perf,
            rtl_icode: self.p.a.icode == "rtl-simulation",
            host_side: self.p.a.hfi1_user_host.is_some(),
            guest_devices: None,
        }
    }

    fn deadline_left(&self) -> u64 {
        self.p.timeout_s.saturating_sub(self.started.elapsed().as_secs()).max(1)
    }

    fn fail_result(&self, msg: &str) {
        let _ = write_json(&self.result, &EarlyFailure::new(msg, self.p.mode));
    }
}

/// Runs a script of the repository; its stdout.
fn script(repo: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("bash")
        .args(args)
        .current_dir(repo)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("bash {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!("{} failed", args.first().copied().unwrap_or("bash")));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `bin` is a static executable (no program interpreter).
fn is_static(bin: &Path) -> bool {
    is_executable(bin)
        && Command::new("readelf")
            .args(["-lW"])
            .arg(bin)
            .output()
            .is_ok_and(|o| o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("program interpreter"))
}

/// Does the run; its exit status.
pub fn run(args: RunArgs, repo: PathBuf) -> i32 {
    let p = match plan(args) {
        Ok(p) => p,
        Err(e) => {
            error(&e);
            return 1;
        }
    };
    // QEMU runs while this process waits, so a signal is handled at once: QEMU and the servers are stopped.
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(sig, Arc::clone(interrupt_flag()));
    }
    let target_dir = env("CARGO_TARGET_DIR").map_or_else(|| repo.join("target"), PathBuf::from);
    let suffix = if p.a.no_devices && p.a.no_share { "no-devices-no-share" } else { p.mode };
    let result =
        absolute(&p.a.result.clone().unwrap_or_else(|| target_dir.join(format!("rdma-emu/result-{suffix}.json"))));
    if let Some(d) = result.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    let _ = std::fs::remove_file(&result);
    let mut run = Run {
        p,
        repo,
        target_dir,
        result,
        log_dir: PathBuf::new(),
        qemu: PathBuf::new(),
        kernel: PathBuf::new(),
        initrd: PathBuf::new(),
        accel: String::new(),
        reply_poll: None,
        control_sock: PathBuf::new(),
        chips: vec![],
        dm: None,
        dm_status: "not started".into(),
        dm_start_s: None,
        peers: None,
        started: Instant::now(),
    };
    match run.go() {
        Ok(rc) => rc,
        Err(Fail(msg)) => {
            run.fail_result(&msg);
            if let Some(dm) = run.dm.as_mut() {
                dm.stop();
            }
            if let Some(peers) = run.peers.as_mut() {
                peers.stop();
            }
            error(&msg);
            1
        }
    }
}

impl Run {
    fn go(&mut self) -> Result<i32, Fail> {
        let fail = |m: String| Fail(m);
        // --- QEMU, guest, accelerator
        self.qemu = match env("RDMA_EMU_QEMU") {
            Some(q) => q.into(),
            None => script(&self.repo, &["ci/get-qemu.sh"]).map(|s| s.trim().into()).map_err(fail)?,
        };
        if !is_executable(&self.qemu) {
            return Err(Fail(format!("QEMU {} is not executable", self.qemu.display())));
        }
        // The vCPU thread reading its own reply (qemu-patches/0005) takes two wake-ups off every trapped access
        // (docs/bench.md, "The waiter reads its own reply"). A QEMU without it is still usable unless asked for.
        if self.p.reply_poll_us != 0 {
            let help = Command::new(&self.qemu).args(["-device", "vfio-user-pci,help"]).stdin(Stdio::null()).output();
            let has = help.is_ok_and(|o| {
                String::from_utf8_lossy(&o.stdout).contains("x-reply-poll-us=")
                    || String::from_utf8_lossy(&o.stderr).contains("x-reply-poll-us=")
            });
            if has {
                self.reply_poll = Some(self.p.reply_poll_us);
            } else if self.p.reply_poll_set {
                return Err(Fail(format!(
                    "--reply-poll-us {}: {} has no vfio-user-pci.x-reply-poll-us (qemu-patches/0005)",
                    self.p.reply_poll_us,
                    self.qemu.display()
                )));
            } else {
                log(&format!(
                    "note: {} has no vfio-user-pci.x-reply-poll-us (qemu-patches/0005): its vCPU waits for the I/O thread",
                    self.qemu.display()
                ));
            }
        }
        let a = self.p.a.clone();
        let guest = self.guest();
        match (&a.kernel, &a.initrd) {
            (Some(k), Some(i)) => {
                if a.udriver.is_some() {
                    log("--udriver is ignored with --kernel/--initrd");
                }
                (self.kernel, self.initrd) = (k.clone(), i.clone());
            }
            (None, None) => {
                let mut udriver = a.udriver.clone().or_else(|| env("RDMA_EMU_UDRIVER").map(PathBuf::from));
                if udriver.is_none() && !a.no_devices {
                    // A static build for the explicit host target, as `cargo build --target
                    // x86_64-unknown-linux-gnu` with `-C target-feature=+crt-static` leaves it.
                    udriver = ["gnu", "musl"]
                        .iter()
                        .flat_map(|libc| {
                            ["release", "debug"]
                                .map(|prof| self.target_dir.join(format!("x86_64-unknown-linux-{libc}/{prof}/udriver")))
                        })
                        .find(|c| is_static(c));
                    if let Some(u) = &udriver {
                        log(&format!("using udriver {}", u.display()));
                    }
                }
                let mut args: Vec<String> = vec!["ci/build-guest.sh".into()];
                if let Some(u) = &udriver {
                    args.extend(["--udriver".into(), u.display().to_string()]);
                }
                if let Some(h) = &a.hfi1_user {
                    args.extend(["--hfi1-user".into(), h.display().to_string()]);
                }
                let argv: Vec<&str> = args.iter().map(String::as_str).collect();
                let out = script(&self.repo, &argv).map_err(fail)?;
                for line in out.lines() {
                    match line.split_once('=') {
                        Some(("KERNEL", v)) => self.kernel = v.into(),
                        Some(("INITRD", v)) if !guest.psm2_layer => self.initrd = v.into(),
                        Some(("INITRD_PSM2", v)) if guest.psm2_layer => self.initrd = v.into(),
                        _ => {}
                    }
                }
            }
            _ => return Err(Fail("--kernel and --initrd go together".into())),
        }
        if !self.kernel.is_file() || !self.initrd.is_file() {
            return Err(Fail(format!(
                "guest kernel/initrd missing ({}, {})",
                self.kernel.display(),
                self.initrd.display()
            )));
        }
        self.accel = if self.p.accel == "auto" {
            let out = Command::new("bash")
                .args(["-c", r#"source "$1/ci/lib.sh" && accel_for "$2" "$3" "$4""#, "accel"])
                .arg(&self.repo)
                .arg(&self.qemu)
                .arg(&self.kernel)
                .arg(&self.initrd)
                .stdin(Stdio::null())
                .stderr(Stdio::inherit())
                .output();
            out.ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .filter(|s| s == "kvm")
                .unwrap_or("tcg".into())
        } else {
            self.p.accel.clone()
        };
        log(&format!("mode {}, accel {}, QEMU {}", self.p.mode, self.accel, self.qemu.display()));

        // --- log directory
        self.log_dir = match &a.logs {
            Some(d) => {
                std::fs::create_dir_all(d).map_err(|e| Fail(format!("log directory {}: {e}", d.display())))?;
                absolute(d)
            }
            None => make_temp_dir().map_err(fail)?,
        };
        let shown = self.log_dir.display().to_string();
        if !shown.bytes().all(|b| b.is_ascii_alphanumeric() || b"._/+-".contains(&b)) {
            return Err(Fail(format!("log directory {shown}: use plain characters (it goes into QEMU's JSON)")));
        }
        if shown.len() > 80 {
            return Err(Fail(format!("log directory {shown} is too long for UNIX socket paths")));
        }
        for f in ["serial.log", "qemu.stderr", "qemu.pid", "qemu.rc", "device-model.log", "host-times", "result.json"] {
            let _ = std::fs::remove_file(self.log_dir.join(f));
        }

        // --- device model
        self.start_device_model()?;
        if a.bench {
            self.start_peers()?;
        }

        // --- QEMU
        let qemu_timeout = self.deadline_left();
        let machine = self.machine(qemu_timeout)?;
        std::fs::write(self.log_dir.join("qemu-command.txt"), format!("{}\n", machine.shell_line())).ok();
        if a.shell {
            return Ok(self.run_shell(machine));
        }
        for f in ["deadline", "stalled", "step-accesses"] {
            let _ = std::fs::remove_file(self.log_dir.join(f));
        }
        let mut machine = machine;
        let mut hu = None;
        let mut hu_status = "not started".to_string();
        if let (Some(host), false) = (&a.hfi1_user_host, a.no_devices) {
            // The hfi1-user host side listens on the guest's second serial port (QEMU connects as a client).
            let sock = self.log_dir.join("hfi1-user.sock");
            let _ = std::fs::remove_file(&sock);
            let _ = std::fs::remove_file(self.log_dir.join("hfi1-user-host.json"));
            let args: Vec<String> = [
                "--listen".into(),
                sock.display().to_string(),
                "--control".into(),
                self.control_sock.display().to_string(),
                "--device".into(),
                "hfi1-wfr".into(),
                "--result".into(),
                self.log_dir.join("hfi1-user-host.json").display().to_string(),
                "--accept-timeout-s".into(),
                "60".into(),
                "--hello-timeout-s".into(),
                qemu_timeout.to_string(),
                "--step-timeout-s".into(),
                a.kdriver_timeout.to_string(),
            ]
            .into();
            let mut s = Server::start("hfi1-user-host", host, &args, &self.log_dir.join("hfi1-user-host.log"))
                .map_err(|e| Fail(e.to_string()))?;
            if !s.wait_for_sockets(std::slice::from_ref(&sock), Duration::from_secs(10)) {
                return Err(Fail(format!(
                    "hfi1-user-host did not listen on {} within 10 s: {}",
                    sock.display(),
                    tail(&self.log_dir.join("hfi1-user-host.log"), 5)
                )));
            }
            machine.second_serial = Some(sock);
            std::fs::write(self.log_dir.join("qemu-command.txt"), format!("{}\n", machine.shell_line())).ok();
            hu_status = "started".into();
            hu = Some(s);
        }
        log(&format!(
            "booting the guest (timeout {qemu_timeout}s; QEMU command in {}/qemu-command.txt)",
            self.log_dir.display()
        ));
        let t_qemu = epoch();
        let qemu_rc = self.run_console(&machine, qemu_timeout);
        let t_qemu_end = epoch();
        if let Some(mut s) = hu.take() {
            // QEMU is gone, so the host side's channel is closed: it finishes at once, or it is stopped.
            let ended = s.wait_exit(Duration::from_secs(10));
            s.stop();
            hu_status = if ended {
                s.status.replace("exited early with", "exited with")
            } else {
                "stopped after QEMU exited".into()
            };
        }
        if qemu_rc == 124 {
            log(&format!("QEMU did not finish within {qemu_timeout}s"));
        }
        if self.dm.is_some() && is_socket(&self.control_sock) {
            // The device model's final state, for the logs: best effort.
            match Control::connect(&self.control_sock, Duration::from_secs(5))
                .and_then(|mut c| control::device_state(&mut c))
            {
                Ok(state) => {
                    let _ = write_json(&self.log_dir.join("device-state.json"), &state);
                }
                Err(e) => {
                    let _ = std::fs::write(self.log_dir.join("device-state.err"), format!("{e}\n"));
                }
            }
        }
        self.stop_servers();

        // --- result
        let facts = Facts {
            log_dir: self.log_dir.clone(),
            scenario: scenario::find(self.p.scenario)
                .ok_or_else(|| Fail(format!("no scenario {}", self.p.scenario)))?,
            options: self.row_options(),
            mode: self.p.mode.into(),
            memory: self.p.memory.into(),
            accel: self.accel.clone(),
            qemu: self.qemu.display().to_string(),
            kernel: self.kernel.display().to_string(),
            initrd: self.initrd.display().to_string(),
            qemu_exit_status: qemu_rc,
            device_model: self.dm_status.clone(),
            t_qemu,
            t_qemu_end,
            device_model_start_s: self.dm_start_s,
            icode: a.icode.clone(),
            hfi1_dma: a.hfi1_dma.clone(),
            hfi1_user_host: hu_status,
            reply_poll_us: self.reply_poll.unwrap_or(0),
            capture: a.capture.as_ref().map(|c| absolute(c).display().to_string()),
        };
        let result = verdict::judge(&facts);
        write_json(&self.result, &result).map_err(|e| Fail(e.to_string()))?;
        write_json(&self.log_dir.join("result.json"), &result).map_err(|e| Fail(e.to_string()))?;
        eprint!("{}", verdict::summary(&result, a.timing));
        let shown = self.result.display();
        if result.ok {
            log(&format!("PASS ({}): result in {shown}", self.p.mode));
            if a.keep_logs {
                log(&format!("logs kept in {}", self.log_dir.display()));
            } else {
                let _ = std::fs::remove_dir_all(&self.log_dir);
            }
        } else {
            log(&format!(
                "FAIL ({}): result in {shown}; logs kept in {} (serial.log, qemu.stderr, device-model.log)",
                self.p.mode,
                self.log_dir.display()
            ));
        }
        println!("{shown}");
        Ok(if result.ok { 0 } else { 1 })
    }

    fn stop_servers(&mut self) {
        if let Some(mut dm) = self.dm.take() {
            dm.stop();
            self.dm_status = dm.status.clone();
        }
        if let Some(mut peers) = self.peers.take() {
            peers.stop();
        }
    }

    fn start_device_model(&mut self) -> Result<(), Fail> {
        let a = self.p.a.clone();
        if a.hfi1_wfr {
            self.chips.push("hfi1-wfr".into());
            if a.fabric {
                self.chips.push("hfi1-wfr1".into());
            }
        }
        if a.no_devices {
            return Ok(());
        }
        let dir = match &a.sockets {
            Some(d) => {
                let d = std::fs::canonicalize(d)
                    .map_err(|_| Fail(format!("--sockets {} is not a directory", d.display())))?;
                for s in self.sockets(&d) {
                    if !is_socket(&s) {
                        return Err(Fail(format!(
                            "--sockets: {} is not a socket (is the device model running?)",
                            s.display()
                        )));
                    }
                }
                self.control_sock = d.join("control.sock");
                self.dm_status = "external (--sockets)".into();
                log(&format!("using the device model serving {}", d.display()));
                return Ok(());
            }
            None => self.log_dir.clone(),
        };
        let dm = match a.device_model.clone().or_else(|| env("RDMA_EMU_DEVICE_MODEL").map(PathBuf::from)) {
            Some(d) => d,
            None => ["release", "debug"]
                .iter()
                .map(|p| self.target_dir.join(p).join("device-model"))
                .find(|c| is_executable(c))
                .ok_or_else(|| {
                    Fail("no device-model binary: build it (cargo build --release -p device-model) or pass --device-model".into())
                })?,
        };
        if !is_executable(&dm) {
            return Err(Fail(format!("device model {} is not executable", dm.display())));
        }
        let sockets = self.sockets(&dir);
        for s in &sockets {
            let _ = std::fs::remove_file(s);
        }
        self.control_sock = dir.join("control.sock");
        let mut args: Vec<String> = vec![
            "--hfi1".into(),
            dir.join("hfi1.sock").display().to_string(),
            "--irdma".into(),
            dir.join("irdma.sock").display().to_string(),
            "--control".into(),
            self.control_sock.display().to_string(),
        ];
        args.extend(a.dm_args.iter().cloned());
        for c in &self.chips {
            args.extend(["--hfi1-wfr".into(), dir.join(format!("{c}.sock")).display().to_string()]);
        }
        if a.hfi1_wfr {
            args.extend(["--hfi1-wfr-icode".into(), a.icode.clone()]);
        }
        // Non-default IDs must be presented by the device model too (its defaults are 1b36:1100 and 1b36:1101).
        if a.hfi1_id != "1b36:1100" && a.hfi1_id != "none" {
            args.extend(["--hfi1-ids".into(), a.hfi1_id.clone()]);
        }
        if a.irdma_id != "1b36:1101" && a.irdma_id != "none" {
            args.extend(["--irdma-ids".into(), a.irdma_id.clone()]);
        }
        if let Some(c) = &a.capture {
            let c = absolute(c);
            if let Some(d) = c.parent() {
                let _ = std::fs::create_dir_all(d);
            }
            args.extend(["--capture".into(), c.display().to_string()]);
        }
        log(&format!("starting {}", dm.display()));
        let t0 = Instant::now();
        let mut server = Server::start("device model", &dm, &args, &self.log_dir.join("device-model.log"))
            .map_err(|e| Fail(e.to_string()))?;
        self.dm_status = "started".into();
        let up = server.wait_for_sockets(&sockets, Duration::from_secs(20));
        if !up {
            server.stop();
            self.dm_status = server.status.clone();
            eprintln!("{}", tail(&self.log_dir.join("device-model.log"), 20));
            return Err(Fail(format!(
                "the device model did not create its sockets within 20 s ({}); logs kept in {}",
                self.dm_status,
                self.log_dir.display()
            )));
        }
        let secs = (t0.elapsed().as_millis() as f64 / 1000.0 * 1000.0).round() / 1000.0;
        self.dm_start_s = Some(secs);
        log(&format!(
            "device model ready in {secs:.3}s (pid {}, control socket {})",
            server.pid().unwrap_or(0),
            self.control_sock.display()
        ));
        self.dm = Some(server);
        Ok(())
    }

    /// The device model's sockets in `dir`: our two functions and the chip-personality HFIs (the device model
    /// names them so on its control socket, and QEMU's device ids follow).
    fn sockets(&self, dir: &Path) -> Vec<PathBuf> {
        let mut s = vec![dir.join("hfi1.sock"), dir.join("irdma.sock"), dir.join("control.sock")];
        s.extend(self.chips.iter().map(|c| dir.join(format!("{c}.sock"))));
        s
    }

    fn socket_dir(&self) -> PathBuf {
        self.control_sock.parent().map_or_else(|| self.log_dir.clone(), Path::to_path_buf)
    }

    fn start_peers(&mut self) -> Result<(), Fail> {
        let testbed = self
            .p
            .a
            .testbed
            .clone()
            .or_else(|| env("RDMA_EMU_TESTBED").map(PathBuf::from))
            .or_else(|| {
                ["release", "debug"].iter().map(|p| self.target_dir.join(p).join("testbed")).find(|c| is_executable(c))
            })
            .filter(|t| is_executable(t))
            .ok_or_else(|| {
                Fail("--bench needs the testbed binary (cargo build --release -p testbed, or --testbed PATH)".into())
            })?;
        let (peer, polled) = (self.log_dir.join("peer.sock"), self.log_dir.join("polled.sock"));
        let _ = std::fs::remove_file(&peer);
        let _ = std::fs::remove_file(&polled);
        let args = ["serve-peers", "--peer", &peer.display().to_string(), "--polled", &polled.display().to_string()]
            .map(String::from);
        let mut s = Server::start("testbed serve-peers", &testbed, &args, &self.log_dir.join("serve-peers.log"))
            .map_err(|e| Fail(e.to_string()))?;
        if !s.wait_for_sockets(&[peer, polled], Duration::from_secs(10)) {
            return Err(Fail(format!(
                "testbed serve-peers did not listen within 10 s: {}",
                tail(&self.log_dir.join("serve-peers.log"), 5)
            )));
        }
        log(&format!(
            "testbed serve-peers ready (pid {}): rust-vmm's peer and ours with the defaults",
            s.pid().unwrap_or(0)
        ));
        self.peers = Some(s);
        Ok(())
    }

    /// The guest's kernel command line.
    fn append(&self, qemu_timeout: u64) -> Result<String, Fail> {
        let a = &self.p.a;
        // no_timer_check: under TCG on a loaded host the IO-APIC timer probe can miss its window and the kernel
        // panics with "timer doesn't work through Interrupt-remapped IO-APIC"; the probe tests nothing we need.
        let mut p = vec![
            "console=ttyS0 panic=-1 intel_iommu=on no_timer_check quiet".to_string(),
            format!("rdma_emu.timeout={}", a.demo_timeout),
            format!("rdma_emu.watchdog={}", if qemu_timeout > 40 { qemu_timeout - 20 } else { 20 }),
        ];
        if !a.no_devices {
            p.push(format!("rdma_emu.hfi1={} rdma_emu.irdma={}", a.hfi1_id, a.irdma_id));
        }
        if !a.udriver_args.is_empty() {
            p.push(format!("rdma_emu.args=\"{}\"", a.udriver_args));
        }
        if a.hfi1_wfr && !a.no_devices {
            p.push(format!(
                "rdma_emu.hfi1_params=\"{}\" rdma_emu.kdriver_timeout={}",
                a.hfi1_params, a.kdriver_timeout
            ));
            p.push(format!("rdma_emu.hfi1_icode={} rdma_emu.hfi1_dma={}", a.icode, a.hfi1_dma));
        }
        if a.bench {
            p.push(format!("rdma_emu.bench_budget_ms={}", a.bench_budget_ms));
        }
        if a.fuzz_wire {
            p.push(format!("rdma_emu.fuzz_secs={}", a.fuzz_secs));
        }
        p.extend(self.guest().kernel_args.iter().map(|k| k.to_string()));
        if a.fabric && !a.shell && !a.no_devices {
            // The node GUIDs the device model gave its two HFIs: the guest checks that opasmaquery reads them.
            let mut guids = vec![];
            for chip in &self.chips {
                let g = Control::connect(&self.control_sock, Duration::from_secs(10))
                    .and_then(|mut c| c.query(chip, "link"))
                    .ok()
                    .and_then(|l| l.get("node_guid").and_then(|g| g.as_str().map(String::from)))
                    .unwrap_or_default();
                guids.push(g);
            }
            let good = |g: &String| {
                g.len() == 18
                    && g.starts_with("0x")
                    && g[2..].bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            };
            if guids.len() != 2 || !guids.iter().all(good) {
                return Err(Fail(format!(
                    "the device model did not tell its HFIs' node GUIDs (got '{}')",
                    guids.join(",")
                )));
            }
            p.push(format!("rdma_emu.fabric_guids={}", guids.join(",")));
        }
        // The scenario's own parameters (after the computed ones: the last occurrence wins), then the caller's.
        let row = scenario::find(self.p.scenario).ok_or_else(|| Fail(format!("no scenario {}", self.p.scenario)))?;
        p.extend(row.kernel_params(&self.row_options()));
        if !a.append.is_empty() {
            p.push(a.append.clone());
        }
        Ok(p.join(" "))
    }

    fn machine(&self, qemu_timeout: u64) -> Result<Machine, Fail> {
        let a = &self.p.a;
        let mut devices = vec![];
        if !a.no_devices {
            let dir = self.socket_dir();
            for (id, pci, chassis) in [("hfi1", &a.hfi1_id, 1), ("irdma", &a.irdma_id, 2)] {
                // A function the guest does not look for is not attached, so its socket stays free for others.
                if pci != "none" {
                    devices.push(VfioUser {
                        id: id.into(),
                        socket: dir.join(format!("{id}.sock")),
                        root_port: a.hotplug.then_some(chassis),
                    });
                }
            }
            for c in &self.chips {
                devices.push(VfioUser { id: c.clone(), socket: dir.join(format!("{c}.sock")), root_port: None });
            }
            if a.bench {
                for p in ["peer", "polled"] {
                    devices.push(VfioUser {
                        id: p.into(),
                        socket: self.log_dir.join(format!("{p}.sock")),
                        root_port: None,
                    });
                }
            }
        }
        let console = if a.shell && std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            Console::Terminal { log: self.log_dir.join("serial.log") }
        } else {
            Console::Stdio
        };
        Ok(Machine {
            qemu: self.qemu.clone(),
            accel: self.accel.clone(),
            memory: self.guest().memory.into(),
            cpu: self.guest().cpu.map(String::from),
            smp: self.guest().smp,
            share: !a.no_share,
            kernel: self.kernel.clone(),
            initrd: self.initrd.clone(),
            append: self.append(qemu_timeout)?,
            console,
            no_reboot: !a.allow_reboot,
            reply_poll_us: self.reply_poll,
            devices,
            edu: a.bench && !a.no_devices,
            extra: a.qemu_extra.clone(),
            second_serial: None,
            pidfile: Some(self.log_dir.join("qemu.pid")),
        })
    }

    /// Boots the guest with its console on a pipe: copies it to serial.log (and stderr), answers the guest's
    /// requests, and stops QEMU if an announced step overruns its deadline or the run its timeout. QEMU's exit
    /// status (124: timed out).
    fn run_console(&mut self, machine: &Machine, qemu_timeout: u64) -> i32 {
        let stderr = match File::create(self.log_dir.join("qemu.stderr")) {
            Ok(f) => f,
            Err(e) => {
                error(&format!("qemu.stderr: {e}"));
                return 255;
            }
        };
        let mut child = match Command::new(&machine.qemu)
            .args(machine.args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                error(&format!("start {}: {e}", machine.qemu.display()));
                return 255;
            }
        };
        let pid = child.id();
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else { return 255 };
        let watch = Arc::new(Mutex::new(Watch::<Instant>::default()));
        let host = Host {
            log_dir: self.log_dir.clone(),
            control: (!self.p.a.no_devices).then(|| self.control_sock.clone()),
            chips: self.chips.clone(),
            quiet: self.p.a.quiet,
            watch: Arc::clone(&watch),
            input: stdin,
        };
        let (done_tx, done_rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            host.serve(stdout);
            let _ = done_tx.send(());
        });
        let until = Instant::now() + Duration::from_secs(qemu_timeout);
        let mut rc_override = None;
        let mut term_sent: Option<Instant> = None;
        loop {
            match done_rx.recv_timeout(Duration::from_secs(1)) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            let now = Instant::now();
            if interrupted() {
                log(&format!("interrupted; logs kept in {}", self.log_dir.display()));
                dm::terminate(pid);
                let _ = child.wait();
                self.stop_servers();
                std::process::exit(130);
            }
            if let Some(t) = term_sent {
                // `timeout -k 5`: a QEMU that ignores SIGTERM is killed 5 s later.
                if now > t + Duration::from_secs(5) {
                    let _ = child.kill();
                }
                continue;
            }
            if now > until {
                rc_override = Some(124);
                dm::terminate(pid);
                term_sent = Some(now);
                continue;
            }
            let overdue = watch.lock().ok().and_then(|w| w.overdue(now).map(String::from));
            if let Some(step) = overdue {
                self.stalled(&step);
                dm::terminate(pid);
                term_sent = Some(now);
            }
        }
        let _ = reader.join();
        let status = child.wait().map_or(255, dm::shell_status);
        let rc = rc_override.unwrap_or(status);
        std::fs::write(self.log_dir.join("qemu.rc"), format!("{rc}\n")).ok();
        rc
    }

    /// A guest step overran its deadline: saves what the device model saw last, for the verdict.
    fn stalled(&self, step: &str) {
        std::fs::write(self.log_dir.join("stalled"), format!("{step}\n")).ok();
        log(&format!("guest step {step} overran its deadline; stopping QEMU"));
        let save = |device: &str, cmd: &str, file: &str| {
            if let Ok(v) =
                Control::connect(&self.control_sock, Duration::from_secs(10)).and_then(|mut c| c.query(device, cmd))
            {
                let _ = write_json(&self.log_dir.join(file), &v);
            }
        };
        save("hfi1-wfr", "accesses", "stall-accesses.json");
        if self.p.a.fabric {
            save("hfi1-wfr1", "accesses", "stall-accesses-1.json");
            save("hfi1-wfr", "link", "stall-link.json");
        }
    }

    /// `--shell`: the console belongs to the user; leaving the guest's shell powers it off.
    fn run_shell(&mut self, machine: Machine) -> i32 {
        log(&format!(
            "booting the guest; its shell comes on this console (logs in {}; QEMU command in qemu-command.txt)",
            self.log_dir.display()
        ));
        let timed_out = Arc::new(AtomicBool::new(false));
        let stderr = match File::create(self.log_dir.join("qemu.stderr")) {
            Ok(f) => f,
            Err(e) => {
                error(&format!("qemu.stderr: {e}"));
                return 255;
            }
        };
        let tty = matches!(machine.console, Console::Terminal { .. });
        let mut cmd = Command::new(&machine.qemu);
        cmd.args(machine.args()).stderr(stderr);
        let saved_tty = if tty { stty(&["-g"]) } else { None };
        if !tty {
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                error(&format!("start {}: {e}", machine.qemu.display()));
                return 255;
            }
        };
        let pid = child.id();
        if self.p.timeout_set {
            let left = Duration::from_secs(self.deadline_left());
            let flag = Arc::clone(&timed_out);
            std::thread::spawn(move || {
                std::thread::sleep(left);
                flag.store(true, Ordering::SeqCst);
                log("--timeout: stopping QEMU");
                dm::terminate(pid);
            });
        }
        if let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) {
            let serial = self.log_dir.join("serial.log");
            std::thread::spawn(move || shell_reader(output, input, &serial));
        }
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break dm::shell_status(st),
                Ok(None) => {}
                Err(_) => break 255,
            }
            if interrupted() {
                log(&format!("interrupted; logs kept in {}", self.log_dir.display()));
                dm::terminate(pid);
                let _ = child.wait();
                self.stop_servers();
                std::process::exit(130);
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        if let Some(s) = saved_tty {
            stty(&[s.trim()]);
        }
        self.stop_servers();
        let shown = self.log_dir.display();
        let dm = &self.dm_status;
        // QEMU ends with status 0 on SIGTERM too.
        if timed_out.load(Ordering::SeqCst) {
            log(&format!("the session outlived --timeout; QEMU was stopped; device model {dm}; logs in {shown}"));
            124
        } else if status == 0 && !dm.starts_with("exited early") {
            log(&format!("guest powered off; device model {dm}; logs in {shown}"));
            0
        } else {
            let why: Vec<String> = std::fs::read_to_string(self.log_dir.join("qemu.stderr"))
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.contains("warning:"))
                .map(String::from)
                .collect();
            let why = why[why.len().saturating_sub(2)..].join(" ");
            log(&format!("QEMU exited with status {status} ({why} ); device model {dm}; logs in {shown}"));
            status
        }
    }
}

/// `stty ARGS` on the terminal of stdin; its output.
fn stty(args: &[&str]) -> Option<String> {
    Command::new("stty")
        .args(args)
        .stdin(Stdio::inherit())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Piped input goes to the guest only once its shell is ready: bytes that reach the UART before the kernel opens
/// the console are dropped by the port's start-up (it clears the FIFO). At the input's end the shell is told to
/// exit, which ends the session. (A Ctrl-D would do that at a terminal, but typed ahead it is only an EOF if the
/// tty is in canonical mode when it arrives, which depends on what the shell is doing then.)
fn shell_reader(output: impl Read, input: std::process::ChildStdin, serial: &Path) {
    let mut log = OpenOptions::new().create(true).append(true).open(serial).ok();
    let input = Arc::new(Mutex::new(input));
    let mut feeding = false;
    let mut out = std::io::stdout();
    for line in BufReader::new(output).split(b'\n') {
        let Ok(mut line) = line else { break };
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        line.push(b'\n');
        if let Some(l) = log.as_mut() {
            let _ = l.write_all(&line);
        }
        let _ = out.write_all(&line);
        let _ = out.flush();
        let text = String::from_utf8_lossy(&line);
        if !feeding && text.starts_with("rdma-emu: [") && text.contains("] shell ready") {
            feeding = true;
            let input = Arc::clone(&input);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut stdin = std::io::stdin();
                loop {
                    match stdin.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let Ok(mut i) = input.lock() else { return };
                            if i.write_all(&buf[..n]).and_then(|()| i.flush()).is_err() {
                                return;
                            }
                        }
                    }
                }
                if let Ok(mut i) = input.lock() {
                    let _ = i.write_all(b"\nexit\n").and_then(|()| i.flush());
                }
            });
        }
    }
}

/// The console's host end: what the reader thread needs.
struct Host {
    log_dir: PathBuf,
    /// The device model's control socket (none without devices).
    control: Option<PathBuf>,
    chips: Vec<String>,
    quiet: bool,
    watch: Arc<Mutex<Watch<Instant>>>,
    input: std::process::ChildStdin,
}

impl Host {
    fn append(&self, file: &str, text: &str) {
        if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(self.log_dir.join(file)) {
            let _ = f.write_all(text.as_bytes());
        }
    }

    /// "READS WRITES UNNAMED" of the chip-personality HFIs ("- - -" if the device model does not answer).
    fn access_totals(&self) -> String {
        self.control
            .as_ref()
            .and_then(|s| Control::connect(s, Duration::from_secs(10)).ok())
            .and_then(|mut c| control::access_totals(&mut c, &self.chips).ok())
            .map_or("- - -".into(), |[r, w, u]| format!("{r} {w} {u}"))
    }

    /// The fuzz-wire guest's latest report: replaces `fuzz-target.json` at once (a temporary file renamed over
    /// it, so a reader never sees half of one) and goes to stdout as one `FUZZ-TARGET` line, flushed, for the
    /// fuzzer that runs this process.
    fn publish_fuzz_target(&self, json: &str) -> std::io::Result<()> {
        let path = self.log_dir.join(FUZZ_TARGET_FILE);
        let tmp = self.log_dir.join(format!("{FUZZ_TARGET_FILE}.tmp"));
        std::fs::write(&tmp, format!("{json}\n"))?;
        std::fs::rename(&tmp, &path)?;
        let mut out = std::io::stdout().lock();
        out.write_all(format!("{}{json}\n", console::FUZZ_TARGET_LINE).as_bytes())?;
        out.flush()
    }

    fn answer(&mut self, r: &Request) -> (bool, String) {
        match r {
            Request::Deadline { step, secs, .. } => {
                if let Ok(mut w) = self.watch.lock() {
                    w.start(step, *secs, Instant::now());
                }
                // The device model's totals at each edge of the step: the probe's share (before the answer, so
                // before the step's first access).
                if !self.chips.is_empty() {
                    let t = self.access_totals();
                    self.append("step-accesses", &format!("{step} start {t}\n"));
                }
                (true, String::new())
            }
            Request::DeadlineEnd { step, .. } => {
                if let Ok(mut w) = self.watch.lock() {
                    w.end();
                }
                if !self.chips.is_empty() {
                    let t = self.access_totals();
                    self.append("step-accesses", &format!("{step} end {t}\n"));
                }
                (true, String::new())
            }
            Request::FuzzTarget { target, .. } => match console::fuzz_target(target) {
                Ok(line) => match self.publish_fuzz_target(&line) {
                    Ok(()) => (true, String::new()),
                    Err(e) => (false, format!("{FUZZ_TARGET_FILE}: {e}")),
                },
                Err(e) => (false, e),
            },
            other => {
                let (Some(words), Some(sock)) = (other.host_words(), self.control.as_ref()) else {
                    return (false, "no device model on this run".into());
                };
                let line = control::host_answer(sock, &self.chips, &words);
                match line.split_once(' ').unwrap_or((&line, "")) {
                    ("ok", rest) => (true, rest.to_string()),
                    (_, rest) => (false, rest.to_string()),
                }
            }
        }
    }

    fn serve(mut self, output: impl Read) {
        let mut serial = OpenOptions::new().create(true).append(true).open(self.log_dir.join("serial.log")).ok();
        let mut err = std::io::stderr();
        for line in BufReader::new(output).split(b'\n') {
            let Ok(mut bytes) = line else { break };
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let reply = match console::parse(&text) {
                Line::EchoedAck => continue,
                Line::Init => {
                    self.append("host-times", &format!("init {:.6}\n", epoch()));
                    None
                }
                Line::ResultEnd => {
                    self.append("host-times", &format!("result_end {:.6}\n", epoch()));
                    None
                }
                Line::Request(r) => {
                    let (ok, reply) = self.answer(&r);
                    Some(console::ack(r.seq(), ok, &reply))
                }
                Line::BadRequest { seq: Some(seq), error } => Some(console::ack(seq, false, &error)),
                Line::BadRequest { seq: None, .. } | Line::Other => None,
            };
            bytes.push(b'\n');
            if let Some(s) = serial.as_mut() {
                let _ = s.write_all(&bytes);
            }
            if !self.quiet {
                let _ = err.write_all(b"  | ").and_then(|()| err.write_all(&bytes));
            }
            if let Some(ack) = reply {
                let _ = self.input.write_all(ack.as_bytes()).and_then(|()| self.input.flush());
            }
        }
    }
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn make_temp_dir() -> Result<PathBuf, String> {
    let out =
        Command::new("mktemp").args(["-d", "/tmp/rdma-emu-run.XXXXXX"]).output().map_err(|e| format!("mktemp: {e}"))?;
    if !out.status.success() {
        return Err("mktemp -d failed".into());
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn interrupt_flag() -> &'static Arc<AtomicBool> {
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    FLAG.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

fn interrupted() -> bool {
    interrupt_flag().load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psm2_gives_hfi1_user_contexts_and_the_queues_psm2_expects_keeping_the_other_parameters() {
        let cases: &[(&str, &str)] = &[
            (HFI1_PARAMS, "num_vls=1 num_sdma=1 krcvqs=1 num_user_contexts=4 cap_mask=0x4c09000cb9a eager_buffer_size=2097152 rcvhdrcnt=2048"),
            ("num_vls=1", "num_vls=1 num_user_contexts=4 rcvhdrcnt=2048 eager_buffer_size=2097152"),
        ];
        for (params, want) in cases {
            assert_eq!(psm2_params(params), *want, "{params}");
        }
    }

    #[test]
    fn tid_rdma_adds_the_tid_rdma_and_opfn_capabilities_and_fourteen_user_contexts() {
        // HFI1_CAP_TID_RDMA is 1 << 5 and HFI1_CAP_OPFN 1 << 16 (include/uapi/rdma/hfi/hfi1_user.h).
        let cases: &[(&str, Result<&str, ()>)] = &[
            (HFI1_PARAMS, Ok("num_vls=1 num_sdma=1 krcvqs=1 num_user_contexts=14 cap_mask=0x4c09001cbba eager_buffer_size=131072 rcvhdrcnt=64")),
            ("cap_mask=0x0", Ok("cap_mask=0x10020 num_user_contexts=14")),
            ("cap_mask=0x10020 num_user_contexts=-1", Ok("cap_mask=0x10020 num_user_contexts=14")),
            ("num_vls=1", Err(())),
            ("cap_mask=12", Err(())),
        ];
        for (params, want) in cases {
            assert_eq!(tid_rdma_params(params).map_err(|_| ()), want.map(String::from), "{params}");
        }
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        a: RunArgs,
    }

    fn plan_of(args: &[&str]) -> Result<Plan, String> {
        let cli = <Cli as clap::Parser>::try_parse_from(std::iter::once("run").chain(args.iter().copied()));
        plan(cli.map_err(|e| e.to_string())?.a)
    }

    #[test]
    fn a_fuzz_wire_run_is_the_fabric_held_until_the_host_ends_it_unless_given_a_fuzz_time() {
        // (arguments, the run's timeout in seconds, or the refusal's start)
        let cases: &[(&[&str], Result<u64, &str>)] = &[
            (&["--fuzz-wire"], Ok(SHELL_TIMEOUT_S)),
            (&["--fuzz-wire", "--fuzz-secs", "3600"], Ok(3600 + FUZZ_SETUP_S)),
            (&["--fuzz-wire", "--fuzz-secs", "3600", "--timeout", "300"], Ok(300)),
            (&["--fuzz-wire", "--psm2"], Err("--fuzz-wire runs its own steps")),
            (&["--fuzz-wire", "--no-devices"], Err("--fuzz-wire runs its own steps")),
            (&["--fuzz-secs", "60"], Err("--fuzz-secs needs --fuzz-wire")),
        ];
        for (args, want) in cases {
            match (plan_of(args), want) {
                (Ok(p), Ok(secs)) => {
                    assert_eq!((p.scenario, p.a.fabric, p.a.hfi1_wfr), ("fuzz-wire", true, true), "{args:?}");
                    assert_eq!(p.timeout_s, *secs, "{args:?}");
                }
                (Err(e), Err(why)) => assert!(e.starts_with(why), "{args:?}: {e}"),
                (got, _) => panic!("{args:?}: {:?}", got.map(|p| p.timeout_s)),
            }
        }
    }
}
