//! `udriver`: drives the emulated hfi1 and irdma functions over Linux VFIO or as a vfio-user client.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use udriver::access::DeviceAccess;
use udriver::backend::vfio::VfioBackend;
use udriver::backend::vfio_user::VfioUserBackend;
use udriver::cli::{self, Command};

#[derive(Parser)]
#[command(
    name = "udriver",
    version,
    about = "Userspace driver for the emulated hfi1 TID receive side and irdma control QP",
    long_about = "Userspace driver for the emulated hfi1 TID receive side and irdma control QP. It reaches a \
device through Linux VFIO (give the PCI address or sysfs path of a device bound to vfio-pci), or directly as a \
vfio-user client of the device model (--vfio-user SOCKET). The `rig` binary runs the same commands with the \
device model in its own process.",
    after_help = "Examples:\n  udriver info 0000:00:03.0\n  udriver --json hfi1-demo 0000:00:03.0\n  \
udriver --vfio-user /tmp/irdma.sock irdma-demo\n  udriver --vfio-user /tmp/hfi1.sock stress --seconds 5 --threads 4"
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
    command: Command,
}

fn open(cli: &Cli) -> Result<Arc<dyn DeviceAccess>, String> {
    if let Some(sock) = &cli.vfio_user {
        let b = VfioUserBackend::connect(sock, !cli.no_mmap).map_err(|e| format!("{}: {e}", sock.display()))?;
        return Ok(Arc::new(b));
    }
    let dev = cli.command.device().ok_or("no device: give a PCI address or --vfio-user SOCKET")?;
    let b = VfioBackend::open(dev).map_err(|e| format!("{dev}: {e}"))?;
    Ok(Arc::new(b))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli::init_tracing();
    match open(&cli).and_then(|dev| cli::run(&cli.command, dev, cli.json)) {
        Ok(code) => code,
        Err(e) => cli::fail("udriver", cli.json, &e),
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[test]
    fn the_command_line_is_consistent_and_takes_the_documented_forms() {
        Cli::command().debug_assert();
        let cases: [&[&str]; 4] = [
            &["udriver", "info", "0000:00:03.0"],
            &["udriver", "--json", "hfi1-demo", "0000:00:03.0"],
            &["udriver", "--vfio-user", "/tmp/irdma.sock", "irdma-demo", "--wait", "irq"],
            &["udriver", "--vfio-user", "/tmp/hfi1.sock", "stress", "--seconds", "5", "--threads", "4"],
        ];
        for args in cases {
            assert!(Cli::try_parse_from(args).is_ok(), "{args:?}");
        }
        // The in-process rig and the benchmarks are not the guest driver's.
        assert!(Cli::try_parse_from(["udriver", "--in-process", "hfi1", "info"]).is_err());
        assert!(Cli::try_parse_from(["udriver", "bench"]).is_err());
    }
}
