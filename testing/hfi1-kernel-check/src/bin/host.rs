//! `hfi1-user-host`: the host side of `hfi1-user`. Listens on the UNIX socket QEMU connects the guest's
//! second serial port to, checks the device model's RcvArray and DMA maps against the guest kernel's
//! tidlists, injects the data and the packets that must be dropped, and writes a JSON result.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use hfi1_kernel_check::host::session::{serve, HostReport};
use hfi1_kernel_check::host::HostConfig;

#[derive(Parser)]
#[command(
    name = "hfi1-user-host",
    version,
    about = "Host side of hfi1-user: checks the emulated RcvArray against the guest kernel and injects KDETH packets",
    after_help = "Start it before QEMU, which connects as a client:\n  \
hfi1-user-host --listen /tmp/hfi1-user.sock --control /tmp/dm.sock --result /tmp/hfi1-user.json &\n  \
qemu-system-x86_64 ... -chardev socket,id=hfi1user,path=/tmp/hfi1-user.sock,server=off -serial chardev:hfi1user\n\
Exit status 0 only if every check held."
)]
struct Cli {
    /// UNIX socket to listen on (QEMU's -chardev socket,path=…,server=off).
    #[arg(long)]
    listen: PathBuf,
    /// The device model's control socket.
    #[arg(long)]
    control: PathBuf,
    /// Name of the hfi1 function on the control socket.
    #[arg(long, default_value = "hfi1-wfr")]
    device: String,
    /// Where to write the JSON result (stdout when absent).
    #[arg(long)]
    result: Option<PathBuf>,
    /// Seconds for QEMU to connect.
    #[arg(long, default_value_t = 60)]
    accept_timeout_s: u64,
    /// Seconds, after QEMU connected, for the guest program's hello (boot and module load come first).
    #[arg(long, default_value_t = 900)]
    hello_timeout_s: u64,
    /// Seconds for each later guest message.
    #[arg(long, default_value_t = 300)]
    step_timeout_s: u64,
    /// Seconds for each control-socket request.
    #[arg(long, default_value_t = 10)]
    control_timeout_s: u64,
    /// Do not match entries to the guest's page frame numbers (e.g. guest RAM above 4 GiB, where the
    /// memfd offset is not the guest-physical address).
    #[arg(long)]
    no_gpa_check: bool,
    /// No progress lines on stderr (the summary is still printed).
    #[arg(long)]
    quiet: bool,
}

fn summary(rep: &HostReport) -> String {
    let mut s = String::new();
    let verdict = if rep.ok { "OK" } else { "FAILED" };
    match &rep.hello {
        Some(h) => s.push_str(&format!(
            "hfi1-user-host: {verdict}: {} context {} ({} expected entries), flow {} generation {:#x}, {} round(s)\n",
            rep.device, h.info.ctxt, h.expected_count, h.flow, h.generation, h.rounds
        )),
        None => s.push_str(&format!("hfi1-user-host: {verdict}: no guest session on {}\n", rep.listen)),
    }
    for r in &rep.rounds {
        let dropped = r.negatives.iter().filter(|n| n.ok).count();
        let verified = r.verified.as_ref().map_or("not verified".to_string(), |v| {
            if v.ok {
                format!("{} bytes verified", v.bytes_checked)
            } else {
                format!("{} of {} bytes wrong", v.mismatch_count, v.bytes_checked)
            }
        });
        s.push_str(&format!(
            "  round {}: {} buffers, {} TIDs ({} entries ok, {} pages matched to guest PFNs), {}/{} packets placed \
             ({} KiB), {}/{} bad packets dropped, {verified}, {} entries left after TID_FREE: {}\n",
            r.round,
            r.buffers,
            r.tids,
            r.entries_ok,
            r.pages_gpa_checked,
            r.placed,
            r.packets,
            r.payload_bytes / 1024,
            dropped,
            r.negatives.len(),
            r.after_free.len(),
            if r.ok { "ok" } else { "FAILED" }
        ));
    }
    for e in &rep.errors {
        s.push_str(&format!("  error: {e}\n"));
    }
    s
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cfg = HostConfig {
        listen: cli.listen,
        control: cli.control,
        device: cli.device,
        accept_timeout: Duration::from_secs(cli.accept_timeout_s),
        hello_timeout: Duration::from_secs(cli.hello_timeout_s),
        step_timeout: Duration::from_secs(cli.step_timeout_s),
        control_timeout: Duration::from_secs(cli.control_timeout_s),
        gpa_check: !cli.no_gpa_check,
        progress: !cli.quiet,
    };
    let rep = serve(&cfg);
    eprint!("{}", summary(&rep));
    let json = match serde_json::to_string_pretty(&rep) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("hfi1-user-host: cannot encode the result: {e}");
            return ExitCode::FAILURE;
        }
    };
    match &cli.result {
        Some(path) => {
            if let Err(e) = std::fs::write(path, json + "\n") {
                eprintln!("hfi1-user-host: write {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
        None => println!("{json}"),
    }
    if rep.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
