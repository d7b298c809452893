//! `udriver`: drives the emulated hfi1 and irdma functions over Linux VFIO, vfio-user, or in-process.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use udriver::access::DeviceAccess;
use udriver::backend::inproc::InProcess;
use udriver::backend::vfio::VfioBackend;
use udriver::backend::vfio_user::VfioUserBackend;
use udriver::demo::{self, DemoReport};

#[derive(Parser)]
#[command(
    name = "udriver",
    version,
    about = "Userspace driver for the emulated hfi1 TID receive side and irdma control QP",
    long_about = "Userspace driver for the emulated hfi1 TID receive side and irdma control QP. It reaches a \
device through Linux VFIO (give the PCI address or sysfs path of a device bound to vfio-pci), directly as a \
vfio-user client of the device model (--vfio-user SOCKET), or with the device model in this process \
(--in-process hfi1|irdma).",
    after_help = "Examples:\n  udriver info 0000:00:03.0\n  udriver --json hfi1-demo 0000:00:03.0\n  \
udriver --vfio-user /tmp/irdma.sock irdma-demo\n  udriver --in-process hfi1 stress --seconds 5 --threads 4"
)]
struct Cli {
    /// Reach the device as a vfio-user client of the device model at SOCKET.
    #[arg(long, global = true, value_name = "SOCKET", conflicts_with = "in_process")]
    vfio_user: Option<PathBuf>,
    /// Run the device model in this process (no VM, no socket).
    #[arg(long, global = true, value_enum, value_name = "DEVICE")]
    in_process: Option<Kind>,
    /// With --vfio-user: trap every register access instead of mmapping the sparse areas.
    #[arg(long, global = true)]
    no_mmap: bool,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    Hfi1,
    Irdma,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Wait {
    Poll,
    Irq,
}

#[derive(Subcommand)]
enum Command {
    /// Identify the device: IDs, BARs, MSI-X vectors, which BARs are mapped.
    Info {
        /// VFIO device: PCI address (0000:00:03.0) or sysfs path.
        device: Option<String>,
    },
    /// hfi1: reserve flows, set up TID RDMA receive over contiguous and fragmented buffers, send data through
    /// the loopback path, verify it byte for byte, clear and free.
    Hfi1Demo { device: Option<String> },
    /// irdma: create the CQP and CCQ, add/modify/delete quad-hash entries, classify segments, destroy.
    IrdmaDemo {
        device: Option<String>,
        /// Wait for CQP completions by polling the CCQ, or by MSI-X interrupt (CCQ armed, CEQ 0 routed to
        /// vector 0).
        #[arg(long, value_enum, default_value_t = Wait::Poll)]
        wait: Wait,
    },
    /// Several threads hammer the device (hfi1: QPs on one context; irdma: qhash add/delete through one CQP),
    /// then check that nothing leaked.
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
    Stress {
        device: Option<String>,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        #[arg(long, default_value_t = 4)]
        threads: usize,
    },
}

fn open(cli: &Cli, device: Option<&str>) -> Result<(Arc<dyn DeviceAccess>, Option<Kind>), String> {
    if let Some(kind) = cli.in_process {
        let engine: Arc<dyn device_model::engine::Engine> = match kind {
            Kind::Hfi1 => Arc::new(
                device_model::hfi1::Hfi1::new(device_model::hfi1::Hfi1Config::default()).map_err(|e| e.to_string())?,
            ),
            Kind::Irdma => Arc::new(device_model::irdma::Irdma::new(device_model::irdma::IrdmaConfig::default())),
        };
        let ids = device_model::pci::PciIds::default_for(engine.name()).ok_or("unknown engine")?;
        let function = device_model::pci::Function::try_new(engine, ids).map_err(|e| e.to_string())?;
        return Ok((Arc::new(InProcess::new(function)), Some(kind)));
    }
    if let Some(sock) = &cli.vfio_user {
        let b = VfioUserBackend::connect(sock, !cli.no_mmap).map_err(|e| format!("{}: {e}", sock.display()))?;
        return Ok((Arc::new(b), None));
    }
    let dev = device.ok_or("no device: give a PCI address, --vfio-user SOCKET or --in-process DEVICE")?;
    let b = VfioBackend::open(dev).map_err(|e| format!("{dev}: {e}"))?;
    Ok((Arc::new(b), None))
}

/// Which engine a device is, from its PCI IDs (the defaults of the device model) or from --in-process.
fn kind_of(dev: &dyn DeviceAccess, known: Option<Kind>) -> Option<Kind> {
    known.or_else(|| {
        let id = dev.identity();
        let hfi1 = device_model::pci::PciIds::hfi1_default();
        let irdma = device_model::pci::PciIds::irdma_default();
        match (id.vendor_id, id.device_id) {
            (v, d) if v == hfi1.vendor_id && d == hfi1.device_id => Some(Kind::Hfi1),
            (v, d) if v == irdma.vendor_id && d == irdma.device_id => Some(Kind::Irdma),
            _ => None,
        }
    })
}

fn print_report(cli: &Cli, report: &DemoReport) -> ExitCode {
    if cli.json {
        println!("{}", serde_json::to_string(report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")));
    } else {
        print!("{}", report.render());
    }
    if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn run(cli: &Cli) -> Result<ExitCode, String> {
    match &cli.command {
        Command::Info { device } => {
            let (dev, _) = open(cli, device.as_deref())?;
            let id = dev.identity();
            if cli.json {
                println!("{}", serde_json::to_string(&id).map_err(|e| e.to_string())?);
            } else {
                println!("device {:04x}:{:04x} via {}", id.vendor_id, id.device_id, id.backend);
                for (bar, size) in &id.bars {
                    let mapped = if id.mapped_bars.contains(bar) { " (mapped)" } else { "" };
                    println!("  BAR{bar}: {size:#x} bytes{mapped}");
                }
                println!("  MSI-X vectors: {}", id.msix_vectors);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Hfi1Demo { device } => {
            let (dev, _) = open(cli, device.as_deref())?;
            Ok(print_report(cli, &demo::hfi1::hfi1_demo(dev, &demo::hfi1::Hfi1DemoOptions::default())))
        }
        Command::IrdmaDemo { device, wait } => {
            let (dev, _) = open(cli, device.as_deref())?;
            let mut opts = demo::irdma::IrdmaDemoOptions::default();
            if *wait == Wait::Irq {
                opts.config.wait_mode = udriver::irdma::process::IrdmaCqpWaitMode::Event { vector: 0 };
            }
            Ok(print_report(cli, &demo::irdma::irdma_demo(dev, &opts)))
        }
        Command::Bench { budget_ms, cases } => {
            let opts = udriver::bench::BenchOptions { budget: Duration::from_millis(*budget_ms), cases: cases.clone() };
            let report = udriver::bench::run(&opts);
            if cli.json {
                println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
            } else {
                print!("{}", report.render());
            }
            // A missed target is a measurement; a case that could not run or failed its own checks is an error.
            Ok(if report.cases.iter().any(|c| c.error.is_some()) { ExitCode::from(1) } else { ExitCode::SUCCESS })
        }
        Command::Stress { device, seconds, threads } => {
            let (dev, known) = open(cli, device.as_deref())?;
            let duration = Duration::from_secs(*seconds);
            let report = match kind_of(dev.as_ref(), known) {
                Some(Kind::Hfi1) => demo::hfi1::hfi1_stress(dev, duration, *threads),
                Some(Kind::Irdma) => demo::irdma::irdma_stress(dev, duration, *threads),
                None => {
                    return Err("stress: the device is neither the emulated hfi1 nor irdma (unknown PCI IDs)".into())
                }
            };
            Ok(print_report(cli, &report))
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            if cli.json {
                println!("{}", serde_json::json!({ "ok": false, "error": e }));
            } else {
                eprintln!("udriver: {e}");
            }
            ExitCode::from(2)
        }
    }
}
