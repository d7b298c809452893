//! `hfi1-dc8051-image`: writes the emulated chip's 8051 firmware file (`hfi_dc8051.bin`), signed with the
//! emulator's test key, for a guest's /lib/firmware.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use emu_abi::dc8051::FirmwareVersion;
use hfi1_kernel_check::dc8051_image::{build_image, FILE_NAME};

#[derive(Parser)]
#[command(
    name = "hfi1-dc8051-image",
    version,
    about = "Writes the emulated hfi1 chip's signed 8051 firmware file",
    after_help = "The stock driver asks for hfi_dc8051.bin on the emulated chip:\n  \
hfi1-dc8051-image --out initramfs/lib/firmware/hfi_dc8051.bin"
)]
struct Cli {
    /// Where to write the file (conventionally …/lib/firmware/hfi_dc8051.bin).
    #[arg(long)]
    out: PathBuf,
    /// The firmware version the image declares, MAJOR.MINOR.PATCH (the 8051 reports it; the driver's
    /// behaviour depends on it).
    #[arg(long = "firmware-version", value_parser = parse_version, default_value = "1.27.0")]
    firmware_version: FirmwareVersion,
}

fn parse_version(s: &str) -> Result<FirmwareVersion, String> {
    let parts: Vec<&str> = s.split('.').collect();
    let [major, minor, patch] = parts.as_slice() else {
        return Err(format!("{s:?}: want MAJOR.MINOR.PATCH"));
    };
    let field = |p: &str| p.parse::<u8>().map_err(|e| format!("{s:?}: {p:?}: {e} (each part is 0..=255)"));
    Ok(FirmwareVersion { major: field(major)?, minor: field(minor)?, patch: field(patch)? })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let image = build_image(cli.firmware_version);
    match std::fs::write(&cli.out, &image) {
        Ok(()) => {
            eprintln!("hfi1-dc8051-image: wrote {} ({} bytes, {FILE_NAME})", cli.out.display(), image.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hfi1-dc8051-image: {}: {e}", cli.out.display());
            ExitCode::FAILURE
        }
    }
}
