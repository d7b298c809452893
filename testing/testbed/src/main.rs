//! `testbed`: udriver's commands with the device model in this process (no VM, no socket), and the benchmarks.

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use testbed::{InProcess, Kind};
use udriver::cli;

#[derive(Parser)]
#[command(
    name = "testbed",
    version,
    about = "udriver's demos and stress runs against the device model in this process, and the benchmarks",
    after_help = "Examples:\n  testbed --in-process hfi1 hfi1-demo\n  testbed --in-process irdma stress --seconds 5 --threads 4\n  \
testbed bench --case d"
)]
struct Cli {
    /// Which emulated function to build in this process (for the driver commands).
    #[arg(long, global = true, value_enum, value_name = "DEVICE")]
    in_process: Option<DeviceArg>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: TestbedCommand,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DeviceArg {
    Hfi1,
    Irdma,
}

#[derive(Subcommand)]
enum TestbedCommand {
    #[command(flatten)]
    Driver(cli::Command),
    /// Benchmarks (a)-(e) of docs/bench.md, each against its own device-model server thread over a real
    /// vfio-user socket; prints ratios measured in this one run (ci/bench.sh adds the QEMU case and the plot).
    Bench {
        /// Wall time spent measuring each variant of a case.
        #[arg(long, default_value_t = 1500)]
        budget_ms: u64,
        /// Run only these cases (repeatable): a, b, c, d, e, spin, scale, fabric, tid.
        #[arg(long = "case", value_name = "ID")]
        cases: Vec<String>,
    },
    /// The in-guest benchmark's extra hfi1 functions, until SIGTERM or SIGINT (which remove both sockets): one
    /// served by rust-vmm's vfio-user server (PCI 1b36:1102) and one by ours with its busy-poll at
    /// `--busy-poll-us` (1b36:1103; off by default: the device model's defaults, beside its `--low-latency`), for
    /// QEMU's vfio-user-pci (ci/run-qemu.sh --bench).
    ServePeers {
        /// Socket of the function behind rust-vmm's server.
        #[arg(long, value_name = "SOCKET")]
        peer: std::path::PathBuf,
        /// Socket of the function behind our server with the other busy-poll setting.
        #[arg(long, value_name = "SOCKET")]
        polled: std::path::PathBuf,
        /// The busy-poll budget of the second function, in microseconds (0: off).
        #[arg(long, default_value_t = 0)]
        busy_poll_us: u64,
    },
}

fn run(cli: &Cli) -> Result<ExitCode, String> {
    match &cli.command {
        TestbedCommand::Driver(command) => {
            if command.device().is_some() {
                return Err("testbed builds the device itself: give --in-process hfi1|irdma, not a PCI address".into());
            }
            let kind = match cli.in_process.ok_or("give --in-process hfi1|irdma")? {
                DeviceArg::Hfi1 => Kind::Hfi1,
                DeviceArg::Irdma => Kind::Irdma,
            };
            let function = testbed::function(kind).map_err(|e| e.to_string())?;
            cli::run(command, Arc::new(InProcess::new(function)), cli.json)
        }
        TestbedCommand::Bench { budget_ms, cases } => {
            let opts = testbed::bench::BenchOptions { budget: Duration::from_millis(*budget_ms), cases: cases.clone() };
            let report = testbed::bench::run(&opts);
            if cli.json {
                println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
            } else {
                print!("{}", report.render());
            }
            // A missed target is a measurement; a case that could not run or failed its own checks is an error.
            Ok(if report.cases.iter().any(|c| c.error.is_some()) { ExitCode::from(1) } else { ExitCode::SUCCESS })
        }
        TestbedCommand::ServePeers { peer, polled, busy_poll_us } => {
            testbed::peer::serve_peers(peer, polled, Duration::from_micros(*busy_poll_us))
                .map_err(|e| e.to_string())?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli::init_tracing();
    run(&cli).unwrap_or_else(|e| cli::fail("testbed", cli.json, &e))
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[test]
    fn the_command_line_is_consistent_and_takes_the_documented_forms() {
        Cli::command().debug_assert();
        let cases: [&[&str]; 5] = [
            &["testbed", "--in-process", "hfi1", "hfi1-demo"],
            &["testbed", "--in-process", "irdma", "stress", "--seconds", "5", "--threads", "4"],
            &["testbed", "--json", "irdma-demo", "--in-process", "irdma", "--wait", "irq"],
            &["testbed", "bench", "--case", "d", "--case", "a"],
            &["testbed", "serve-peers", "--peer", "/tmp/p.sock", "--polled", "/tmp/q.sock", "--busy-poll-us", "20"],
        ];
        for args in cases {
            assert!(Cli::try_parse_from(args).is_ok(), "{args:?}");
        }
        assert!(Cli::try_parse_from(["testbed", "--in-process", "nic", "info"]).is_err());
    }
}
