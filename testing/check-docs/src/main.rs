//! `check-docs`: the docs' command lines against the --help of what they run, their links, the docs index
//! (ci/check-docs.sh runs it from the repository root).

use std::path::PathBuf;
use std::process::ExitCode;

use check_docs::{Checker, RealHelps};
use clap::Parser;

#[derive(Parser)]
#[command(
    version,
    about = "Checks the README's and docs' command lines against the --help of what they run, their links and the docs index"
)]
struct Cli {
    /// Where our programs' binaries are (target/debug).
    #[arg(long)]
    bindir: PathBuf,
    /// The Markdown files to check.
    #[arg(required = true)]
    files: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut checker = Checker::new(RealHelps { bindir: cli.bindir });
    for f in &cli.files {
        match std::fs::read(f) {
            Ok(bytes) => checker.check_file(f, &String::from_utf8_lossy(&bytes)),
            Err(e) => {
                eprintln!("{f}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let index = std::fs::read_to_string("docs/README.md").unwrap_or_default();
    let pages: Vec<String> = std::fs::read_dir("docs")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    checker.check_index(&index, &pages);
    let problems = checker.problems();
    if !problems.is_empty() {
        eprintln!("{}", problems.join("\n"));
        eprintln!("{} problem(s) in the docs' command lines and links", problems.len());
        return ExitCode::FAILURE;
    }
    eprintln!(
        "docs: every command line's flags are in its --help, every link leads somewhere ({} files, {} --help texts)",
        cli.files.len(),
        checker.helps_asked()
    );
    ExitCode::SUCCESS
}
