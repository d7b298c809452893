//! `kernel-irdma`: the Linux kernel's irdma control path (ctrl.c, unmodified) runs a whole CQP session on
//! an irdma device model: one in this process, or a running `device-model --irdma SOCKET` over vfio-user.
//! Build it against a modified kernel tree with RDMA_EMU_KERNEL_SRC to try a ctrl.c change on the emulator.

#![forbid(unsafe_code)]

#[cfg(kernel_source)]
use std::path::PathBuf;
use std::process::ExitCode;
#[cfg(kernel_source)]
use std::sync::Arc;

#[cfg(kernel_source)]
use clap::Parser;
#[cfg(kernel_source)]
use device_model::irdma::IrdmaConfig;
#[cfg(kernel_source)]
use kernel_conformance::backend::{IrdmaModel, Transport};
#[cfg(kernel_source)]
use kernel_conformance::session::{run_session, SessionOptions};
#[cfg(kernel_source)]
use udriver::access::DeviceAccess;
#[cfg(kernel_source)]
use udriver::backend::vfio_user::VfioUserBackend;
#[cfg(kernel_source)]
use udriver::dma::DmaPool;

#[cfg(kernel_source)]
#[derive(Parser)]
#[command(
    name = "kernel-irdma",
    version,
    about = "Run the Linux kernel's irdma control path (ctrl.c) on the irdma device model"
)]
struct Cli {
    /// A running device model's irdma vfio-user socket; without it the device model runs in this process.
    #[arg(long, value_name = "SOCKET")]
    vfio_user: Option<PathBuf>,
    /// CQP SQ entries (4..=2048, a power of two; the kernel checks).
    #[arg(long, default_value_t = 2048)]
    sq_size: u32,
    /// Print the steps as JSON.
    #[arg(long)]
    json: bool,
}

#[cfg(kernel_source)]
fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut _model = None;
    let pool = match &cli.vfio_user {
        Some(sock) => {
            let dev = match VfioUserBackend::connect(sock, true) {
                Ok(d) => Arc::new(d),
                Err(e) => {
                    eprintln!("kernel-irdma: cannot connect to {}: {e}", sock.display());
                    return ExitCode::FAILURE;
                }
            };
            if let Err(e) = dev.pci_enable_device() {
                eprintln!("kernel-irdma: pci_enable_device: {e}");
                return ExitCode::FAILURE;
            }
            Arc::new(DmaPool::new(dev, false))
        }
        None => match IrdmaModel::new(IrdmaConfig::default(), Transport::InProcess) {
            Ok(m) => {
                let p = m.pool.clone();
                _model = Some(m);
                p
            }
            Err(e) => {
                eprintln!("kernel-irdma: device model: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let opts = SessionOptions { sq_size: cli.sq_size, ..Default::default() };
    let steps = match run_session(pool, &opts) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kernel-irdma: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ok = steps.iter().all(|s| s.ok);
    if cli.json {
        let v: Vec<_> =
            steps.iter().map(|s| serde_json::json!({"step": s.name, "ok": s.ok, "detail": s.detail})).collect();
        println!("{}", serde_json::json!({"kernel": kernel_conformance::KERNEL_SOURCE_VERSION, "ok": ok, "steps": v}));
    } else {
        println!("kernel ctrl.c from {}", kernel_conformance::KERNEL_SOURCE_VERSION);
        for s in &steps {
            println!("{} {:<42} {}", if s.ok { "ok  " } else { "FAIL" }, s.name, s.detail);
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(not(kernel_source))]
fn main() -> ExitCode {
    eprintln!("kernel-irdma: built without the kernel's irdma source; run ci/kernel-source.sh, then build again");
    ExitCode::FAILURE
}
