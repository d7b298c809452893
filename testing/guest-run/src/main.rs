//! `guest-run`: the host side of a guest run that the launchers (ci/run-qemu.sh, ci/e2e.sh) call.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use guest_run::control::{self, Control};
use guest_run::scenario::{self, Outcome, RunOptions, Scenario};
use guest_run::verdict::{self, EarlyFailure, Facts};
use guest_run::{expect, pyfmt, write_json};
use serde_json::Value;

#[derive(Parser)]
#[command(
    version,
    about = "The host side of a QEMU guest run: the scenario table, the verdict and the result JSON, \
                            the control-socket requests of the launchers"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One row of the scenario table (its name alone: every row's name).
    Scenario(ScenarioArgs),
    /// Judges a finished run from its log directory and writes the result JSON; exit status 0 only if it passed.
    Verdict(Box<VerdictArgs>),
    /// Writes the result of a run that failed before the guest could report.
    FailResult {
        #[arg(long)]
        result: PathBuf,
        #[arg(long)]
        mode: String,
        message: String,
    },
    /// Checks a result against what a scenario's row requires (`ci/e2e.sh`'s stall and fabric-bounce runs).
    Expect {
        scenario: String,
        #[arg(long)]
        result: PathBuf,
        /// How long the run took, in seconds.
        #[arg(long)]
        took: u64,
    },
    /// Prints each guest step's stderr line that says ERROR (a demo that passes but logs errors); exit status 1
    /// if there is one.
    DriverErrors {
        #[arg(long)]
        result: PathBuf,
    },
    /// A top-level field of the JSON document on stdin (nothing if it is null or missing).
    JsonField { field: String },
    /// The JSON document on stdin as Python's repr() shows it (ci/guest/test-init.sh).
    JsonRepr,
    /// The JSON array on stdin, one row per element: the values at the dotted paths COLS (Python's str(),
    /// None where missing), joined by spaces; rows joined by ";" (ci/guest/test-init.sh).
    JsonRows { cols: Vec<String> },
    /// Drives a command in a pseudo-terminal through a dialog (ci/guest/test-shell.sh's terminal session).
    PtyDrive(guest_run::pty::DriveArgs),
    /// One control-socket request; prints the reply's result as JSON, or fails with its error.
    Request {
        #[command(flatten)]
        socket: Socket,
        #[arg(long, conflicts_with = "json")]
        device: Option<String>,
        #[arg(long, conflicts_with = "json")]
        cmd: Option<String>,
        /// The whole request.
        #[arg(long)]
        json: Option<String>,
        /// Print only this top-level field of the result.
        #[arg(long)]
        field: Option<String>,
    },
    /// "READS WRITES UNNAMED" of the chip-personality HFIs together ("- - -" if the device model does not answer).
    AccessTotals {
        #[command(flatten)]
        socket: Socket,
        chips: Vec<String>,
    },
    /// The answer line to a request of the guest's fabric run, given as words (`fault HFI SPEC`, `fault-clear`,
    /// `accesses`, `counters NAME...`).
    HostAnswer {
        #[command(flatten)]
        socket: Socket,
        /// A chip-personality HFI (repeatable).
        #[arg(long = "chip")]
        chips: Vec<String>,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        words: Vec<String>,
    },
    /// One guest run with ci/run-qemu.sh's options (its header describes them); prints the result file's path.
    Run(Box<guest_run::run::RunArgs>),
    /// The device model's final state, for the logs.
    DeviceState {
        #[command(flatten)]
        socket: Socket,
        #[arg(long)]
        out: PathBuf,
    },
    /// Edits opa-fm's packaged opafm.xml IN for the guest and writes it to OUT (ci/build-guest.sh).
    OpafmConfig(guest_run::opafm::ConfigArgs),
    #[command(flatten)]
    Tools(guest_run::tools::ToolCmd),
}

#[derive(Args)]
struct Socket {
    /// The device model's control socket.
    #[arg(long = "socket")]
    path: PathBuf,
    #[arg(long, default_value_t = 5)]
    timeout_s: u64,
}

impl Socket {
    fn connect(&self) -> Result<Control, control::ControlError> {
        Control::connect(&self.path, Duration::from_secs(self.timeout_s))
    }
}

#[derive(Args)]
struct RowOptions {
    /// --fabric-perf: perftest after the fabric's steps.
    #[arg(long)]
    fabric_perf: bool,
    /// The chip-personality HFIs' icode (rtl-simulation or functional-simulator).
    #[arg(long, default_value = "rtl-simulation")]
    icode: String,
    /// hfi1-user-host serves the guest's second serial port.
    #[arg(long)]
    host_side: bool,
}

impl RowOptions {
    fn run_options(&self) -> RunOptions {
        RunOptions {
            fabric_perf: self.fabric_perf,
            rtl_icode: self.icode == "rtl-simulation",
            host_side: self.host_side,
            guest_devices: None,
        }
    }
}

#[derive(Args)]
struct ScenarioArgs {
    name: Option<String>,
    #[command(flatten)]
    row: RowOptions,
    /// The kernel parameters the host gives the guest for it (its name, and those that depend on the run).
    #[arg(long, group = "what")]
    kernel_params: bool,
    /// The steps the guest must report, one a line (demo steps included: they are expected for the functions
    /// the guest finds).
    #[arg(long, group = "what")]
    expected_steps: bool,
    /// The ci/run-qemu.sh options that run it, one a line.
    #[arg(long, group = "what")]
    options: bool,
    /// Its chip-personality HFIs' names, one a line.
    #[arg(long, group = "what")]
    chip_hfis: bool,
    /// The guest's scenario file (every row's settings, for ci/build-guest.sh; no NAME).
    #[arg(long, group = "what", conflicts_with = "name")]
    guest_env: bool,
}

#[derive(Args)]
struct VerdictArgs {
    #[arg(long)]
    scenario: String,
    #[command(flatten)]
    row: RowOptions,
    #[arg(long)]
    log_dir: PathBuf,
    #[arg(long)]
    result: PathBuf,
    #[arg(long)]
    mode: String,
    #[arg(long)]
    memory: String,
    #[arg(long)]
    accel: String,
    #[arg(long)]
    qemu: String,
    #[arg(long)]
    kernel: String,
    #[arg(long)]
    initrd: String,
    #[arg(long)]
    qemu_exit_status: i32,
    #[arg(long)]
    device_model: String,
    /// Epoch seconds at QEMU's start.
    #[arg(long)]
    t_qemu: f64,
    #[arg(long)]
    t_qemu_end: f64,
    #[arg(long)]
    device_model_start_s: Option<f64>,
    #[arg(long, default_value = "translated")]
    hfi1_dma: String,
    /// How hfi1-user-host ended.
    #[arg(long, default_value = "not started")]
    hfi1_user_host: String,
    /// vfio-user-pci.x-reply-poll-us given to QEMU (0: none).
    #[arg(long, default_value_t = 0)]
    reply_poll_us: u64,
    #[arg(long)]
    capture: Option<String>,
    /// Print how long each phase took.
    #[arg(long)]
    timing: bool,
}

fn row(name: &str) -> Result<&'static Scenario, String> {
    scenario::find(name).ok_or_else(|| format!("no scenario {name} (rows: {})", scenario::names().join(", ")))
}

fn print_scenario(args: &ScenarioArgs) -> Result<(), String> {
    if args.guest_env {
        print!("{}", scenario::guest_env());
        return Ok(());
    }
    let Some(name) = &args.name else {
        for s in scenario::SCENARIOS {
            println!("{:<14} {}", s.name, s.about);
        }
        return Ok(());
    };
    let s = row(name)?;
    let opts = args.row.run_options();
    if args.kernel_params {
        println!("{}", s.kernel_params(&opts).join(" "));
    } else if args.expected_steps {
        s.expected_steps(&opts).iter().for_each(|n| println!("{n}"));
    } else if args.options {
        s.options.iter().for_each(|o| println!("{o}"));
    } else if args.chip_hfis {
        s.devices.chip_hfis.iter().for_each(|c| println!("{c}"));
    } else {
        println!("{}", serde_json::to_string_pretty(s).map_err(|e| e.to_string())?);
    }
    Ok(())
}

fn run_verdict(a: &VerdictArgs) -> Result<bool, String> {
    let facts = Facts {
        log_dir: a.log_dir.clone(),
        scenario: row(&a.scenario)?,
        options: a.row.run_options(),
        mode: a.mode.clone(),
        memory: a.memory.clone(),
        accel: a.accel.clone(),
        qemu: a.qemu.clone(),
        kernel: a.kernel.clone(),
        initrd: a.initrd.clone(),
        qemu_exit_status: a.qemu_exit_status,
        device_model: a.device_model.clone(),
        t_qemu: a.t_qemu,
        t_qemu_end: a.t_qemu_end,
        device_model_start_s: a.device_model_start_s,
        icode: a.row.icode.clone(),
        hfi1_dma: a.hfi1_dma.clone(),
        hfi1_user_host: a.hfi1_user_host.clone(),
        reply_poll_us: a.reply_poll_us,
        capture: a.capture.clone(),
    };
    let result = verdict::judge(&facts);
    write_json(&a.result, &result).map_err(|e| e.to_string())?;
    write_json(&a.log_dir.join("result.json"), &result).map_err(|e| e.to_string())?;
    eprint!("{}", verdict::summary(&result, a.timing));
    Ok(result.ok)
}

fn read_result(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn stdin_json() -> Result<Value, String> {
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text).map_err(|e| format!("stdin: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("stdin is not JSON: {e}"))
}

fn run(cli: Cli) -> Result<bool, String> {
    match cli.cmd {
        Cmd::Scenario(args) => print_scenario(&args).map(|()| true),
        Cmd::Verdict(args) => run_verdict(&args),
        Cmd::FailResult { result, mode, message } => {
            write_json(&result, &EarlyFailure::new(&message, &mode)).map_err(|e| e.to_string()).map(|()| true)
        }
        Cmd::Expect { scenario, result, took } => {
            let s = row(&scenario)?;
            let Outcome::FailsReporting { .. } = s.outcome else {
                return Err(format!("scenario {scenario} is not one that must fail"));
            };
            let check = expect::check(s, &read_result(&result)?, took);
            eprint!("{}", check.report);
            Ok(check.met)
        }
        Cmd::DriverErrors { result } => {
            let errors = expect::driver_errors(&read_result(&result)?);
            errors.iter().for_each(|e| println!("{e}"));
            Ok(errors.is_empty())
        }
        Cmd::JsonField { field } => {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).map_err(|e| format!("stdin: {e}"))?;
            let doc: Value = serde_json::from_str(&text).map_err(|e| format!("stdin is not JSON: {e}"))?;
            match doc.get(&field) {
                None | Some(Value::Null) => println!(),
                v => println!("{}", pyfmt::str_of(v)),
            }
            Ok(true)
        }
        Cmd::JsonRepr => {
            let doc = stdin_json()?;
            println!("{}", pyfmt::repr(Some(&doc)));
            Ok(true)
        }
        Cmd::JsonRows { cols } => {
            let doc = stdin_json()?;
            let rows: Vec<String> = doc
                .as_array()
                .ok_or("stdin is not a JSON array")?
                .iter()
                .map(|r| {
                    cols.iter()
                        .map(|c| pyfmt::str_of(c.split('.').try_fold(r, |v, k| v.get(k).filter(|x| !x.is_null()))))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .collect();
            println!("{}", rows.join(";"));
            Ok(true)
        }
        Cmd::PtyDrive(args) => guest_run::pty::drive(&args).map_err(|e| e.to_string()),
        Cmd::Request { socket, device, cmd, json, field } => {
            let request: Value = match (json, cmd) {
                (Some(j), _) => serde_json::from_str(&j).map_err(|e| format!("--json is not JSON: {e}"))?,
                (None, Some(cmd)) => match device {
                    Some(d) => serde_json::json!({"device": d, "cmd": cmd}),
                    None => serde_json::json!({"cmd": cmd}),
                },
                (None, None) => return Err("give --json or --cmd".into()),
            };
            let result = socket.connect().and_then(|mut c| c.request(&request)).map_err(|e| e.to_string())?;
            match field {
                Some(f) => println!(
                    "{}",
                    result.get(&f).filter(|v| !v.is_null()).map_or(String::new(), |v| pyfmt::str_of(Some(v)))
                ),
                None => println!("{result}"),
            }
            Ok(true)
        }
        Cmd::AccessTotals { socket, chips } => {
            match socket.connect().and_then(|mut c| control::access_totals(&mut c, &chips)) {
                Ok([r, w, u]) => println!("{r} {w} {u}"),
                Err(_) => println!("- - -"),
            }
            Ok(true)
        }
        Cmd::HostAnswer { socket, chips, words } => {
            println!("{}", control::host_answer(&socket.path, &chips, &words));
            Ok(true)
        }
        Cmd::Run(args) => {
            let repo = std::env::var_os("RDMA_EMU_REPO_ROOT")
                .map_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")), PathBuf::from);
            std::process::exit(guest_run::run::run(*args, repo))
        }
        Cmd::DeviceState { socket, out } => {
            let state = socket.connect().and_then(|mut c| control::device_state(&mut c)).map_err(|e| e.to_string())?;
            write_json(&out, &state).map_err(|e| e.to_string()).map(|()| true)
        }
        Cmd::OpafmConfig(args) => guest_run::opafm::run(&args).map(|()| true).map_err(|e| e.to_string()),
        Cmd::Tools(cmd) => guest_run::tools::run(cmd),
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("guest-run: {e}");
            ExitCode::from(2)
        }
    }
}
