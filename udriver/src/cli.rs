//! The driver's commands, shared by the `udriver` binary (VFIO or vfio-user) and the `testbed` binary (the device
//! model in the same process): both parse these subcommands and run them over a `DeviceAccess` they open.

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Subcommand, ValueEnum};

use crate::access::DeviceAccess;
use crate::demo::{self, DemoReport};
use crate::irdma::process::IrdmaCqpWaitMode;
use crate::pci_ids::{pci_match_id, DeviceKind, UDRIVER_PCI_TBL};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Wait {
    Poll,
    Irq,
}

#[derive(Subcommand)]
pub enum Command {
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
    Stress {
        device: Option<String>,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        #[arg(long, default_value_t = 4)]
        threads: usize,
    },
}

impl Command {
    /// The VFIO device argument, if the command was given one.
    pub fn device(&self) -> Option<&str> {
        match self {
            Command::Info { device }
            | Command::Hfi1Demo { device }
            | Command::IrdmaDemo { device, .. }
            | Command::Stress { device, .. } => device.as_deref(),
        }
    }
}

/// Which engine a device is, from its PCI IDs.
pub fn kind_of(dev: &dyn DeviceAccess) -> Option<DeviceKind> {
    let id = dev.identity();
    pci_match_id(&UDRIVER_PCI_TBL, id.vendor_id, id.device_id).map(|m| m.driver_data)
}

/// Prints a demo's report; the exit code says whether every step passed.
pub fn print_report(json: bool, report: &DemoReport) -> ExitCode {
    if json {
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

/// Runs `command` on `dev`.
pub fn run(command: &Command, dev: Arc<dyn DeviceAccess>, json: bool) -> Result<ExitCode, String> {
    match command {
        Command::Info { .. } => {
            let id = dev.identity();
            if json {
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
        Command::Hfi1Demo { .. } => {
            Ok(print_report(json, &demo::hfi1::hfi1_demo(dev, &demo::hfi1::Hfi1DemoOptions::default())))
        }
        Command::IrdmaDemo { wait, .. } => {
            let mut opts = demo::irdma::IrdmaDemoOptions::default();
            if *wait == Wait::Irq {
                opts.config.wait_mode = IrdmaCqpWaitMode::Event { vector: 0 };
            }
            Ok(print_report(json, &demo::irdma::irdma_demo(dev, &opts)))
        }
        Command::Stress { seconds, threads, .. } => {
            let duration = Duration::from_secs(*seconds);
            let report = match kind_of(dev.as_ref()) {
                Some(DeviceKind::Hfi1) => demo::hfi1::hfi1_stress(dev, duration, *threads),
                Some(DeviceKind::Irdma) => demo::irdma::irdma_stress(dev, duration, *threads),
                None => {
                    return Err("stress: the device is neither the emulated hfi1 nor irdma (unknown PCI IDs)".into())
                }
            };
            Ok(print_report(json, &report))
        }
    }
}

/// Logs to stderr at `warn` unless RUST_LOG says otherwise.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Reports `prog`'s failure the way each output mode expects; exit code 2.
pub fn fail(prog: &str, json: bool, e: &str) -> ExitCode {
    if json {
        println!("{}", serde_json::json!({ "ok": false, "error": e }));
    } else {
        eprintln!("{prog}: {e}");
    }
    ExitCode::from(2)
}
