//! `rig`: udriver's commands with the device model in this process (no VM, no socket), and the benchmarks.

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use rig::{InProcess, Kind};
use udriver::cli;

#[derive(Parser)]
#[command(
    name = "rig",
    version,
    about = "udriver's demos and stress runs against the device model in this process, and the benchmarks",
    after_help = "Examples:\n  rig --device hfi1 hfi1-demo\n  rig --device irdma stress --seconds 5 --threads 4\n  \
rig bench --case d"
)]
struct Cli {
    /// Which emulated function to build in this process (for the driver commands).
    #[arg(long, global = true, value_enum, value_name = "DEVICE")]
    device: Option<DeviceArg>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: RigCommand,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DeviceArg {
    Hfi1,
    Irdma,
}

#[derive(Subcommand)]
enum RigCommand {
    #[command(flatten)]
    Driver(cli::Command),
    /// Benchmarks (a)-(e) of docs/bench.md, each against its own device-model server thread over a real
    /// vfio-user socket; prints ratios measured in this one run (ci/bench.sh adds the QEMU case and the plot).
    Bench {
        /// Wall time spent measuring each variant of a case.
        #[arg(long, default_value_t = 1500)]
        budget_ms: u64,
        /// Run only these cases (repeatable): a, b, c, d, e, spin.
        #[arg(long = "case", value_name = "ID")]
        cases: Vec<String>,
    },
}

fn run(cli: &Cli) -> Result<ExitCode, String> {
    match &cli.command {
        RigCommand::Driver(command) => {
            if command.device().is_some() {
                return Err("rig builds the device itself: give --device hfi1|irdma, not a PCI address".into());
            }
            let kind = match cli.device.ok_or("give --device hfi1|irdma")? {
                DeviceArg::Hfi1 => Kind::Hfi1,
                DeviceArg::Irdma => Kind::Irdma,
            };
            let function = rig::function(kind).map_err(|e| e.to_string())?;
            cli::run(command, Arc::new(InProcess::new(function)), cli.json)
        }
        RigCommand::Bench { budget_ms, cases } => {
            let opts = rig::bench::BenchOptions { budget: Duration::from_millis(*budget_ms), cases: cases.clone() };
            let report = rig::bench::run(&opts);
            if cli.json {
                println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
            } else {
                print!("{}", report.render());
            }
            // A missed target is a measurement; a case that could not run or failed its own checks is an error.
            Ok(if report.cases.iter().any(|c| c.error.is_some()) { ExitCode::from(1) } else { ExitCode::SUCCESS })
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli::init_tracing();
    run(&cli).unwrap_or_else(|e| cli::fail(cli.json, &e))
}
