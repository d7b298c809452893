//! `hfi1-user`: the guest program. Assigns a user context on /dev/hfi1_N through the stock hfi1 driver,
//! programs a TID flow through the mapped UREGS page, registers buffers with TID_UPDATE, lets the host
//! check and fill them over a serial line, verifies the data, frees the TIDs, and prints one JSON result.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use hfi1_kernel_check::channel::LineChannel;
use hfi1_kernel_check::errno::io_error_name;
use hfi1_kernel_check::guest::real::RealContext;
use hfi1_kernel_check::guest::session::{run, GuestOptions};
use hfi1_kernel_check::proto::GuestMsg;
use rustix::termios::{tcflush, tcgetattr, tcsetattr, OptionalActions, QueueSelector};

#[derive(Parser)]
#[command(
    name = "hfi1-user",
    version,
    about = "User expected receive through the stock hfi1 driver, checked by hfi1-user-host over a serial line",
    after_help = "Example (inside the guest, hfi1.ko loaded):\n  hfi1-user --device /dev/hfi1_0 --channel /dev/ttyS1\n\
Prints one JSON object on stdout; exit status 0 only if every check on both sides held."
)]
struct Cli {
    /// The hfi1 character device.
    #[arg(long, default_value = "/dev/hfi1_0")]
    device: PathBuf,
    /// The line to the host: a tty (put in raw mode) or a UNIX socket.
    #[arg(long, default_value = "/dev/ttyS1")]
    channel: PathBuf,
    /// TID flow index to program (0..=31).
    #[arg(long, default_value_t = 5)]
    flow: u32,
    /// Flow generation (20 bits, not the kernel's reserved 0xfffff).
    #[arg(long, default_value = "0x2a5b1", value_parser = parse_u32)]
    generation: u32,
    /// Seed of the data pattern both sides compute.
    #[arg(long, default_value = "0x5eed0011", value_parser = parse_u64)]
    seed: u64,
    /// Payload bytes per injected packet (a multiple of 64, at most 10240; OPA MTUs are 2048..10240).
    #[arg(long, default_value_t = 8192)]
    mtu: u32,
    /// Seconds to wait for the host's welcome.
    #[arg(long, default_value_t = 30)]
    hello_timeout_s: u64,
    /// Seconds to wait for each later host message.
    #[arg(long, default_value_t = 300)]
    timeout_s: u64,
    /// No progress lines on stderr.
    #[arg(long)]
    quiet: bool,
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?}: {e}"))
}

fn parse_u32(s: &str) -> Result<u32, String> {
    u32::try_from(parse_u64(s)?).map_err(|_| format!("{s:?} does not fit 32 bits"))
}

/// The line to the host.
enum Port {
    Tty(File),
    Socket(UnixStream),
}

impl Read for Port {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Port::Tty(f) => f.read(buf),
            Port::Socket(s) => s.read(buf),
        }
    }
}

impl Write for Port {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Port::Tty(f) => f.write(buf),
            Port::Socket(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Port::Tty(f) => f.flush(),
            Port::Socket(s) => s.flush(),
        }
    }
}

impl AsFd for Port {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Port::Tty(f) => f.as_fd(),
            Port::Socket(s) => s.as_fd(),
        }
    }
}

fn open_port(path: &Path) -> Result<Port, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("{shown}: {}", io_error_name(&e)))?;
    if meta.file_type().is_socket() {
        return UnixStream::connect(path)
            .map(Port::Socket)
            .map_err(|e| format!("connect {shown}: {}", io_error_name(&e)));
    }
    let tty = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("open {shown}: {}", io_error_name(&e)))?;
    // Raw: no echo, no line editing, no CR/LF translation, bytes as they come.
    let mut t = tcgetattr(&tty).map_err(|e| format!("tcgetattr {shown}: {}", io_error_name(&e.into())))?;
    t.make_raw();
    // The fastest rate a standard 8250 divisor gives, in case the serial model paces output by it.
    t.set_speed(115_200).map_err(|e| format!("cfsetspeed {shown}: {}", io_error_name(&e.into())))?;
    tcsetattr(&tty, OptionalActions::Now, &t)
        .map_err(|e| format!("tcsetattr {shown}: {}", io_error_name(&e.into())))?;
    let _ = tcflush(&tty, QueueSelector::IFlush);
    Ok(Port::Tty(tty))
}

fn fail(msg: String) -> ExitCode {
    let v = serde_json::json!({"program": "hfi1-user", "ok": false, "errors": [msg]});
    println!("{v}");
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let opts = GuestOptions {
        flow: cli.flow,
        generation: cli.generation,
        seed: cli.seed,
        mtu: cli.mtu,
        hello_timeout: Duration::from_secs(cli.hello_timeout_s),
        timeout: Duration::from_secs(cli.timeout_s),
        progress: !cli.quiet,
    };
    let port = match open_port(&cli.channel) {
        Ok(p) => p,
        Err(e) => return fail(format!("channel to the host: {e}")),
    };
    let mut chan = match LineChannel::new(port) {
        Ok(c) => c,
        Err(e) => return fail(format!("channel to the host: {e}")),
    };
    let mut uuid = [0u8; 16];
    uuid[..8].copy_from_slice(&cli.seed.to_le_bytes());
    let mut ctx = match RealContext::open(&cli.device, uuid) {
        Ok(c) => c,
        Err(e) => {
            // The host is waiting for our hello: tell it why none comes.
            let _ = chan.send(&GuestMsg::Abort { error: e.to_string() }, Duration::from_secs(2));
            return fail(e.to_string());
        }
    };
    let res = run(&mut ctx, &mut chan, &opts);
    let mut v =
        serde_json::to_value(&res).unwrap_or_else(|e| serde_json::json!({"ok": false, "errors": [e.to_string()]}));
    v["device"] = serde_json::json!(cli.device.display().to_string());
    v["driver_version"] = serde_json::json!(ctx.driver_version);
    v["huge_page_advised"] = serde_json::json!(ctx.huge_advised);
    println!("{v}");
    if res.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
