//! `kernel-fuzz`: the wire-side campaign against the guest's hfi1.ko, its reproducers and its baseline
//! (ci/fuzz-kernel.sh runs it; docs/fuzzing-kernel.md).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use kernel_cov::elf::Module;
use kernel_cov::region::Region;
use kernel_cov::symbolize::Symbolizer;
use kernel_fuzz::campaign::{self, Options, Session};
use kernel_fuzz::coverage::{self, Tables, TARGET_FILES};
use kernel_fuzz::guest::BootSpec;
use serde_json::{json, Value};

#[derive(Parser)]
#[command(name = "kernel-fuzz", about = "Fuzzes the guest kernel's hfi1.ko from the cable's far end")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// A wire-side campaign: writes OUT/summary.json, OUT/findings/, OUT/stats.log.
    Wire(WireArgs),
    /// Replays a finding's reproducer on a fresh boot; exit status 0 if the same report follows.
    Repro(ReproArgs),
    /// The call sites a finished guest run left in the coverage region, by file (a baseline).
    Baseline(BaselineArgs),
    /// Checks a campaign's summary against the smoke's requirements.
    Check(CheckArgs),
    /// A packet's bytes changed and its ICRC made right again: for minimising a finding's batch by hand.
    Reseal(ResealArgs),
    /// Writes to stdout a seed input whose packet carries the test-only planted defect's payload (a UD
    /// SEND_ONLY to the keeper's first UD QP, payload "RDMAEMU-PLANT-40"; ci/build-hfi1-module.sh --plant).
    PlantSeed,
}

#[derive(Args, Clone)]
struct BootArgs {
    #[arg(long)]
    guest_run: PathBuf,
    #[arg(long)]
    kernel: PathBuf,
    #[arg(long)]
    initrd: PathBuf,
    #[arg(long)]
    device_model: PathBuf,
    /// The coverage region's backing file (2 MiB, shared with QEMU's ivshmem-plain).
    #[arg(long)]
    coverage_file: PathBuf,
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    append: String,
    /// How long the fabric may take to come up and the keeper to report, per boot.
    #[arg(long, default_value_t = 300)]
    ready_s: u64,
    /// The control socket's name of the HFI the packets enter.
    #[arg(long, default_value = "hfi1-wfr")]
    device: String,
}

impl BootArgs {
    fn spec(&self, timeout_s: u64) -> BootSpec {
        BootSpec {
            guest_run: self.guest_run.clone(),
            // The row's own options, as the scenario table declares them (ci/e2e.sh runs rows the same way).
            row_options: guest_run::scenario::find("fuzz-wire")
                .map(|r| r.options.iter().map(|o| o.to_string()).collect())
                .unwrap_or_else(|| vec!["--fuzz-wire".into()]),
            kernel: self.kernel.clone(),
            initrd: self.initrd.clone(),
            device_model: self.device_model.clone(),
            coverage_file: self.coverage_file.clone(),
            coverage_bytes: kernel_cov::layout::REGION_SIZE,
            append: self.append.clone(),
            timeout_s,
            ready_s: self.ready_s,
        }
    }
}

#[derive(Args)]
struct WireArgs {
    #[command(flatten)]
    boot: BootArgs,
    #[arg(long)]
    minutes: f64,
    #[arg(long)]
    out: PathBuf,
    /// The module built with debug info (ci/build-hfi1-module.sh's KO=), for naming call sites.
    #[arg(long)]
    ko: PathBuf,
    /// drivers/infiniband/hw/hfi1 of the guest kernel's source (the dispatch tables are read from it).
    #[arg(long)]
    hfi1_src: PathBuf,
    /// The baseline's call sites by file (`kernel-fuzz baseline`), put beside the campaign's in the summary.
    #[arg(long)]
    baseline: Option<PathBuf>,
    #[arg(long, default_value_t = 1000)]
    wait_ms: u64,
    #[arg(long, default_value_t = 10000)]
    grace_ms: u64,
    #[arg(long, default_value_t = 40)]
    seed: u64,
    /// An extra seed input (raw bytes); repeatable.
    #[arg(long)]
    seed_file: Vec<PathBuf>,
    /// A dictionary token for the token mutators; repeatable.
    #[arg(long)]
    token: Vec<String>,
    /// Boot with panic_on_warn=0: a WARN or KFENCE report is a finding and the guest goes on (for long
    /// campaigns, where a WARN_ON_ONCE hit every minute would cost a boot each time).
    #[arg(long)]
    warn_continues: bool,
}

#[derive(Args)]
struct ReproArgs {
    #[command(flatten)]
    boot: BootArgs,
    /// The finding's directory (holds finding.json and repro.jsonl).
    #[arg(long)]
    finding: PathBuf,
    /// Where the boot's logs go.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct BaselineArgs {
    #[arg(long)]
    coverage_file: PathBuf,
    #[arg(long)]
    ko: PathBuf,
    /// A name for the run ("fabric", "tid-rdma").
    #[arg(long)]
    run: String,
    /// The baseline file to add the run to (created if missing).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct ResealArgs {
    /// The packet as a wire-batch line carries it (hex, ICRC included).
    #[arg(long)]
    packet_hex: String,
    /// OFFSET=HEX: write these bytes at this byte offset first (repeatable), e.g. a BTH field.
    #[arg(long)]
    set: Vec<String>,
    /// Cut the packet to this many bytes (ICRC included) first, e.g. to drop a payload.
    #[arg(long)]
    len: Option<usize>,
}

#[derive(Args)]
struct CheckArgs {
    #[arg(long)]
    summary: PathBuf,
    #[arg(long, default_value_t = 1)]
    min_execs: u64,
    /// Require the campaign's call sites to exceed this baseline run's ("fabric").
    #[arg(long)]
    above_baseline: Option<String>,
    /// Require the campaign's call sites to exceed those reached when the first boot's keeper reported (the
    /// fabric up, before the first exec).
    #[arg(long)]
    above_ready: bool,
    /// Require a finding whose title contains this.
    #[arg(long)]
    finding: Option<String>,
    /// ... and that its reproducer was confirmed on a fresh boot.
    #[arg(long, requires = "finding")]
    confirmed: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Wire(a) => wire(a),
        Cmd::Repro(a) => repro(a),
        Cmd::Baseline(a) => baseline(a),
        Cmd::Check(a) => check(a),
        Cmd::PlantSeed => plant_seed(),
        Cmd::Reseal(a) => reseal(a),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kernel-fuzz: {e}");
            ExitCode::FAILURE
        }
    }
}

type R = Result<ExitCode, String>;

fn wire(a: WireArgs) -> R {
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let tables = Tables::from_source(&a.hfi1_src).map_err(|e| e.to_string())?;
    let ko = std::fs::read(&a.ko).map_err(|e| format!("{}: {e}", a.ko.display()))?;
    Module::parse(&ko).map_err(|e| format!("{}: {e}", a.ko.display()))?;
    let mut extra = vec![];
    for f in &a.seed_file {
        extra.push(std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()))?);
    }
    // A boot lasts until the campaign ends it; guest-run's own limit is only a backstop.
    let timeout_s = (a.minutes * 60.0) as u64 + 2 * a.boot.ready_s + 600;
    let mut boot = a.boot.spec(timeout_s);
    if a.warn_continues {
        // After the row's panic_on_warn=1 on the command line: the later one wins.
        boot.append = format!("{} panic_on_warn=0", boot.append).trim().to_string();
    }
    let opts = Options {
        boot,
        out: a.out.clone(),
        minutes: a.minutes,
        device: a.boot.device.clone(),
        wait_ms: a.wait_ms,
        grace_ms: a.grace_ms,
        seed: a.seed,
        extra_seeds: extra,
        tokens: a.token.iter().map(|t| t.as_bytes().to_vec()).collect(),
        verbose: false,
        warn_fatal: !a.warn_continues,
    };
    let ended = campaign::run(opts).map_err(|e| e.to_string())?;
    let summary = summarize(&a, &tables, &ko, &ended)?;
    let path = a.out.join("summary.json");
    guest_run::write_json(&path, &summary).map_err(|e| e.to_string())?;
    eprintln!(
        "kernel-fuzz: {} execs ({} /s while fuzzing), {} call sites, {} findings; {}",
        summary["execs"],
        summary["execs_per_s"],
        summary["coverage"]["call_sites"],
        summary["findings"].as_array().map_or(0, Vec::len),
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn summarize(a: &WireArgs, tables: &Tables, ko: &[u8], ended: &campaign::Ended) -> Result<Value, String> {
    let s: &Session = &ended.session;
    let module = Module::parse(ko).map_err(|e| e.to_string())?;
    let symbolizer = Symbolizer::new(&a.ko, None);
    let all = module.call_sites().map_err(|e| e.to_string())?;
    let sites = symbolizer.symbolize(&module, &all).map_err(|e| e.to_string())?;
    let reached: HashSet<u32> = s.sites.clone();
    let functions = coverage::functions_reached(&sites, &reached);
    let files = coverage::by_file(&sites, &reached);
    let baseline: Value = match &a.baseline {
        Some(p) => serde_json::from_str(&std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?)
            .map_err(|e| format!("{}: {e}", p.display()))?,
        None => Value::Null,
    };
    let mut by_file = serde_json::Map::new();
    let (mut sum, mut sum_base) = (0u64, BTreeMap::<String, u64>::new());
    for f in TARGET_FILES {
        let (r, t) = files.get(*f).copied().unwrap_or((0, 0));
        sum += r;
        let mut entry = json!({"reached": r, "total": t});
        if let Some(runs) = baseline.get("runs").and_then(Value::as_object) {
            for (run, v) in runs {
                let b = v["files"][*f].as_u64().unwrap_or(0);
                *sum_base.entry(run.clone()).or_default() += b;
                entry[format!("baseline_{run}")] = json!(b);
            }
        }
        by_file.insert((*f).to_string(), entry);
    }
    let ratios: serde_json::Map<String, Value> = sum_base
        .iter()
        .map(|(run, b)| (run.clone(), json!(if *b == 0 { 0.0 } else { round2(sum as f64 / *b as f64) })))
        .collect();
    let fuzz_s = (ended.wall.saturating_sub(s.setup_time)).as_secs_f64();
    let findings: Vec<Value> = s
        .findings()
        .all()
        .into_iter()
        .map(|f| {
            json!({"id": f.id, "kind": f.kind, "title": f.title, "hits": f.hits, "boot": f.boot, "exec": f.exec,
                   "reproducer": f.reproducer, "confirmed": f.confirmed})
        })
        .collect();
    Ok(json!({
        "side": "wire",
        "minutes": a.minutes,
        "wall_s": round2(ended.wall.as_secs_f64()),
        "execs": ended.execs,
        // Execs over the time the campaign fuzzed: its wall time less booting, replays and guest stops.
        "execs_per_s": if fuzz_s > 0.0 { round2(ended.execs as f64 / fuzz_s) } else { 0.0 },
        "fuzz_s": round2(fuzz_s),
        "setup_s": round2(s.setup_time.as_secs_f64()),
        "execs_per_s_wall": round2(ended.execs as f64 / ended.wall.as_secs_f64().max(1e-9)),
        "max_packets_per_exec": kernel_fuzz::packet::MAX_PACKETS_PER_EXEC,
        "warn_ends_boot": !a.warn_continues,
        "slow_execs": s.execs_slow,
        "packets_placed": s.placed,
        "packets_dropped": s.dropped,
        "boots": s.boots(),
        "boot_failures": s.boot_failures,
        "corpus": ended.corpus,
        "coverage": {
            "call_sites": reached.len(),
            "call_sites_total": all.len(),
            "call_sites_at_ready": s.sites_at_ready,
            "functions": functions.len(),
            "baseline": baseline.get("runs").map(|r| {
                r.as_object().map(|o| o.iter().map(|(k, v)| (k.clone(), v["call_sites"].clone())).collect::<serde_json::Map<_, _>>())
            }),
            "target_files": by_file,
            "target_files_reached": sum,
            "target_files_ratio_to_baseline": ratios,
        },
        "handlers_reached": {
            "opcode_handler_tbl": coverage::reach(&tables.opcode_handler_tbl, &functions),
            "subn_get_opa_sma": coverage::reach(&tables.subn_get_opa_sma, &functions),
            "subn_set_opa_sma": coverage::reach(&tables.subn_set_opa_sma, &functions),
        },
        "findings": findings,
    }))
}

fn repro(a: ReproArgs) -> R {
    let finding: Value = serde_json::from_str(
        &std::fs::read_to_string(a.finding.join("finding.json"))
            .map_err(|e| format!("{}: {e}", a.finding.display()))?,
    )
    .map_err(|e| e.to_string())?;
    let signature = finding["signature"].as_str().ok_or("finding.json has no signature")?.to_string();
    let lines: Vec<String> = std::fs::read_to_string(a.finding.join("repro.jsonl"))
        .map_err(|e| format!("{}: {e}", a.finding.display()))?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let opts = Options {
        boot: a.boot.spec(900),
        out: a.out.clone(),
        minutes: 0.0,
        device: a.boot.device.clone(),
        wait_ms: 1000,
        grace_ms: 10000,
        seed: 0,
        extra_seeds: vec![],
        tokens: vec![],
        verbose: true,
        warn_fatal: true,
    };
    let mut session = Session::new(opts).map_err(|e| e.to_string())?;
    let batches: Vec<campaign::Batch> = lines.into_iter().map(campaign::Batch::Line).collect();
    let seen = session.replay(&batches, &signature).map_err(|e| e.to_string())?.is_some();
    session.shutdown();
    if seen {
        println!("REPRODUCED: {signature}");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("NOT REPRODUCED: {signature} (logs in {})", a.out.display());
        Ok(ExitCode::FAILURE)
    }
}

fn baseline(a: BaselineArgs) -> R {
    let region = Region::open(&a.coverage_file).map_err(|e| e.to_string())?;
    region.header().map_err(|e| e.to_string())?;
    let reached: HashSet<u32> = region.pc_log().offsets.into_iter().collect();
    let ko = std::fs::read(&a.ko).map_err(|e| format!("{}: {e}", a.ko.display()))?;
    let module = Module::parse(&ko).map_err(|e| e.to_string())?;
    let all = module.call_sites().map_err(|e| e.to_string())?;
    let sites = Symbolizer::new(&a.ko, None).symbolize(&module, &all).map_err(|e| e.to_string())?;
    let files: serde_json::Map<String, Value> =
        coverage::by_file(&sites, &reached).into_iter().map(|(f, (r, _))| (f, json!(r))).collect();
    let mut doc: Value = std::fs::read_to_string(&a.out)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| json!({"runs": {}}));
    doc["call_sites_total"] = json!(all.len());
    doc["runs"][&a.run] = json!({"call_sites": reached.len(), "files": files});
    guest_run::write_json(&a.out, &doc).map_err(|e| e.to_string())?;
    println!("{}: {} call sites of {}", a.run, reached.len(), all.len());
    Ok(ExitCode::SUCCESS)
}

fn plant_seed() -> R {
    use std::io::Write;
    std::io::stdout().write_all(&campaign::plant_seed()).map_err(|e| format!("stdout: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

fn hex_bytes(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err(format!("{s}: an odd number of hex digits"));
    }
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| format!("{s}: {e}"))).collect()
}

fn reseal(a: ResealArgs) -> R {
    use device_model::hfi1::cable::wire::{WirePacket, ICRC_BYTES};
    let mut bytes = hex_bytes(&a.packet_hex)?;
    if let Some(len) = a.len {
        bytes.truncate(len);
    }
    for set in &a.set {
        let (off, hex) = set.split_once('=').ok_or_else(|| format!("--set {set}: OFFSET=HEX"))?;
        let off: usize = off.parse().map_err(|e| format!("--set {set}: {e}"))?;
        let new = hex_bytes(hex)?;
        let dst = bytes.get_mut(off..off + new.len()).ok_or_else(|| format!("--set {set}: past the packet"))?;
        dst.copy_from_slice(&new);
    }
    let body = bytes[..bytes.len().saturating_sub(ICRC_BYTES)].to_vec();
    let p = WirePacket::seal(body, false, false).map_err(|e| e.to_string())?;
    println!("{}", p.bytes.iter().map(|b| format!("{b:02x}")).collect::<String>());
    Ok(ExitCode::SUCCESS)
}

fn check(a: CheckArgs) -> R {
    let s: Value = serde_json::from_str(
        &std::fs::read_to_string(&a.summary).map_err(|e| format!("{}: {e}", a.summary.display()))?,
    )
    .map_err(|e| e.to_string())?;
    let mut problems = vec![];
    let execs = s["execs"].as_u64().unwrap_or(0);
    if execs < a.min_execs {
        problems.push(format!("{execs} execs, fewer than {}", a.min_execs));
    }
    if let Some(run) = &a.above_baseline {
        let got = s["coverage"]["call_sites"].as_u64().unwrap_or(0);
        match s["coverage"]["baseline"][run].as_u64() {
            Some(b) if got > b => {}
            Some(b) => problems.push(format!("{got} call sites, not above the {run} baseline's {b}")),
            None => problems.push(format!("the summary has no {run} baseline")),
        }
    }
    if a.above_ready {
        let got = s["coverage"]["call_sites"].as_u64().unwrap_or(0);
        let ready = s["coverage"]["call_sites_at_ready"].as_u64().unwrap_or(u64::MAX);
        if got <= ready {
            problems.push(format!("{got} call sites, no more than the {ready} reached before the first exec"));
        }
    }
    if let Some(want) = &a.finding {
        let empty = vec![];
        let matching: Vec<&Value> = s["findings"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .filter(|x| x["title"].as_str().is_some_and(|t| t.contains(want.as_str())))
            .collect();
        if matching.is_empty() {
            problems.push(format!("no finding whose title names {want}"));
        } else if a.confirmed
            && !matching
                .iter()
                .any(|x| matches!(x["confirmed"].as_str(), Some("last-batch" | "last-input" | "history")))
        {
            problems.push(format!("the finding naming {want} was not reproduced on a fresh boot"));
        }
    }
    if problems.is_empty() {
        println!("kernel-fuzz check: ok ({execs} execs)");
        Ok(ExitCode::SUCCESS)
    } else {
        for p in &problems {
            println!("kernel-fuzz check: problem: {p}");
        }
        Ok(ExitCode::FAILURE)
    }
}
