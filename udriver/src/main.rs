//! `udriver`: drives the emulated hfi1 and irdma functions over Linux VFIO or as a vfio-user client.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use udriver::access::DeviceAccess;
use udriver::backend::vfio::VfioBackend;
use udriver::backend::vfio_user::VfioUserBackend;
use udriver::bench::guest::GuestDevices;
use udriver::bench::utc_string;
use udriver::cli::{self, Command};

#[derive(Parser)]
#[command(
    name = "udriver",
    version,
    about = "Userspace driver for the emulated hfi1 TID receive side and irdma control QP",
    long_about = "Userspace driver for the emulated hfi1 TID receive side and irdma control QP. It reaches a \
device through Linux VFIO (give the PCI address or sysfs path of a device bound to vfio-pci), or directly as a \
vfio-user client of the device model (--vfio-user SOCKET). The `testbed` binary runs the same commands with the \
device model in its own process.",
    after_help = "Examples:\n  udriver info 0000:00:03.0\n  udriver --json hfi1-demo 0000:00:03.0\n  \
udriver --vfio-user /tmp/irdma.sock irdma-demo\n  udriver --vfio-user /tmp/hfi1.sock stress --seconds 5 --threads 4\n  \
udriver --json bench --hfi1 00:03.0 --irdma 00:04.0 --peer 00:05.0 --polled 00:06.0 --edu 00:07.0"
)]
struct Cli {
    /// Reach the device as a vfio-user client of the device model at SOCKET.
    #[arg(long, global = true, value_name = "SOCKET")]
    vfio_user: Option<PathBuf>,
    /// With --vfio-user: trap every register access instead of mmapping the sparse areas.
    #[arg(long, global = true)]
    no_mmap: bool,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: UCommand,
}

#[derive(Subcommand)]
enum UCommand {
    #[command(flatten)]
    Driver(Command),
    /// The in-guest benchmark (docs/bench.md, "In the guest"), every function a VFIO device: trapped register
    /// round trips to our hfi1 function and to the baselines, mapped RcvArray stores, qhash ops/s by WQEs per
    /// doorbell, loopback placement vs memcpy. Prints one report (ratios measured in this run).
    Bench {
        /// Our hfi1 function (PCI address).
        #[arg(long)]
        hfi1: String,
        /// Our irdma function.
        #[arg(long)]
        irdma: Option<String>,
        /// An hfi1 function served by rust-vmm's vfio-user server (`testbed serve-peers`).
        #[arg(long)]
        peer: Option<String>,
        /// An hfi1 function served by our server with busy-poll on (`testbed serve-peers`).
        #[arg(long)]
        polled: Option<String>,
        /// QEMU's edu device.
        #[arg(long)]
        edu: Option<String>,
        /// Wall time per measured variant.
        #[arg(long, default_value_t = 1000)]
        budget_ms: u64,
    },
}

fn open(cli: &Cli, command: &Command) -> Result<Arc<dyn DeviceAccess>, String> {
    if let Some(sock) = &cli.vfio_user {
        let b = VfioUserBackend::connect(sock, !cli.no_mmap).map_err(|e| format!("{}: {e}", sock.display()))?;
        return Ok(Arc::new(b));
    }
    let dev = command.device().ok_or("no device: give a PCI address or --vfio-user SOCKET")?;
    open_vfio(dev)
}

fn open_vfio(dev: &str) -> Result<Arc<dyn DeviceAccess>, String> {
    let b = VfioBackend::open(dev).map_err(|e| format!("{dev}: {e}"))?;
    Ok(Arc::new(b))
}

fn bench(cli: &Cli) -> Result<ExitCode, String> {
    let UCommand::Bench { hfi1, irdma, peer, polled, edu, budget_ms } = &cli.command else {
        return Err("not the bench command".into());
    };
    if cli.vfio_user.is_some() {
        return Err("bench runs over VFIO only: give PCI addresses, not --vfio-user".into());
    }
    let optional = |a: &Option<String>| a.as_deref().map(open_vfio).transpose();
    let devs = GuestDevices {
        hfi1: open_vfio(hfi1)?,
        irdma: optional(irdma)?,
        peer: optional(peer)?,
        polled: optional(polled)?,
        edu: optional(edu)?,
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let report = udriver::bench::guest::run(&devs, Duration::from_millis(*budget_ms), utc_string(now));
    if cli.json {
        println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
    } else {
        print!("{}", report.render());
    }
    // A missed target is a measurement; a case that could not run is an error.
    Ok(if report.cases.iter().any(|c| c.error.is_some()) { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli::init_tracing();
    let result = match &cli.command {
        UCommand::Driver(command) => open(&cli, command).and_then(|dev| cli::run(command, dev, cli.json)),
        UCommand::Bench { .. } => bench(&cli),
    };
    result.unwrap_or_else(|e| cli::fail("udriver", cli.json, &e))
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[test]
    fn the_command_line_is_consistent_and_takes_the_documented_forms() {
        Cli::command().debug_assert();
        let cases: [&[&str]; 6] = [
            &["udriver", "info", "0000:00:03.0"],
            &["udriver", "--json", "hfi1-demo", "0000:00:03.0"],
            &["udriver", "--vfio-user", "/tmp/irdma.sock", "irdma-demo", "--wait", "irq"],
            &["udriver", "--vfio-user", "/tmp/hfi1.sock", "stress", "--seconds", "5", "--threads", "4"],
            &["udriver", "--json", "bench", "--hfi1", "00:03.0", "--edu", "00:07.0", "--budget-ms", "200"],
            &[
                "udriver", "bench", "--hfi1", "00:03.0", "--irdma", "00:04.0", "--peer", "00:05.0", "--polled",
                "00:06.0",
            ],
        ];
        for args in cases {
            assert!(Cli::try_parse_from(args).is_ok(), "{args:?}");
        }
        // The in-process testbed is not the guest driver's; the guest benchmark needs at least our hfi1 function.
        assert!(Cli::try_parse_from(["udriver", "--in-process", "hfi1", "info"]).is_err());
        assert!(Cli::try_parse_from(["udriver", "bench"]).is_err());
    }
}
