//! `kernel-cov`: reads, resets and reports the trace-pc hfi1.ko's coverage region (docs/kernel-coverage.md).

use clap::{Parser, Subcommand};
use kernel_cov::elf::Module;
use kernel_cov::region::Region;
use kernel_cov::report::Report;
use kernel_cov::symbolize::Symbolizer;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "Reads the coverage the fuzz build of hfi1.ko writes into its ivshmem-plain region")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The region's header and counters, as JSON.
    Status {
        /// The ivshmem-plain backend file (QEMU's memory-backend-file mem-path).
        #[arg(long)]
        shm: PathBuf,
    },
    /// Clears the region (all of it, or the edge map only) and bumps its generation.
    Reset {
        #[arg(long)]
        shm: PathBuf,
        #[arg(long)]
        edges_only: bool,
    },
    /// Every call site of the module, counted by file, and the text layout: the denominators of a report.
    Sites {
        #[arg(long)]
        ko: PathBuf,
        #[arg(long)]
        addr2line: Option<String>,
    },
    /// Call sites and functions reached, by file and function, as JSON.
    Report {
        #[arg(long)]
        shm: PathBuf,
        /// The module with debug info (ci/build-hfi1-module.sh's KO=).
        #[arg(long)]
        ko: PathBuf,
        /// addr2line program (default: addr2line on PATH).
        #[arg(long)]
        addr2line: Option<String>,
        /// Also list each reached function's count (default: the totals and files only).
        #[arg(long)]
        functions: bool,
    },
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.cmd {
        Cmd::Status { shm } => {
            let region = Region::open(&shm)?;
            let header = region.header()?;
            let out = serde_json::json!({
                "header": header,
                "sites_reached": region.seen_count(),
                "log_dropped": region.pc_log().dropped,
                "edges": region.edge_map().iter().filter(|&&b| b != 0).count(),
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Cmd::Reset { shm, edges_only } => {
            let region = Region::open(&shm)?;
            if edges_only {
                region.reset_edges();
            } else {
                region.reset_all();
            }
        }
        Cmd::Sites { ko, addr2line } => {
            let data = std::fs::read(&ko).map_err(|e| format!("reading {}: {e}", ko.display()))?;
            let module = Module::parse(&data)?;
            let all = module.call_sites()?;
            let sites = Symbolizer::new(&ko, addr2line.as_deref()).symbolize(&module, &all)?;
            let mut files = std::collections::BTreeMap::<String, u64>::new();
            let mut functions = std::collections::BTreeSet::new();
            for s in &sites {
                *files.entry(s.file.clone()).or_default() += 1;
                functions.insert(s.inlined_into.as_ref().unwrap_or(&s.function).clone());
            }
            let layout: Vec<_> = module
                .text_layout()
                .into_iter()
                .map(|p| serde_json::json!({"section": p.name, "start": p.start, "size": p.size}))
                .collect();
            let out = serde_json::json!({
                "sites_total": all.len(),
                "functions_total": functions.len(),
                "files": files,
                "text_layout": layout,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Cmd::Report { shm, ko, addr2line, functions } => {
            let region = Region::open(&shm)?;
            let data = std::fs::read(&ko).map_err(|e| format!("reading {}: {e}", ko.display()))?;
            let module = Module::parse(&data)?;
            let mut report = Report::build(&region, &module, &Symbolizer::new(&ko, addr2line.as_deref()))?;
            if functions {
                report.functions.retain(|_, c| c.reached > 0);
            } else {
                report.functions.clear();
            }
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kernel-cov: {e}");
            ExitCode::FAILURE
        }
    }
}
