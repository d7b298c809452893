//! The subcommands of the scripts around a guest run (ci/bench.sh, ci/bench-table.sh, ci/lifecycle.sh,
//! ci/soak.sh, ci/demo.sh): the bench reports, QMP, the serial log's first result, the soak's control queries
//! and the demo summaries.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Subcommand;
use serde_json::{json, Value};

use crate::bench::{report, summary, svg, table};
use crate::control::Control;
use crate::qmp::{self, Qmp, Step};
use crate::verdict::console::{RESULT_BEGIN, RESULT_END};
use crate::{demo_summary, pyfmt, write_json};

#[derive(Subcommand)]
pub enum ToolCmd {
    /// Writes results.json, results.svg and scale.svg of a ci/bench.sh run from its work directory, and prints
    /// the run's summary.
    BenchReport {
        /// What the run's boots and testbed bench left (ci/bench.sh's work directory).
        #[arg(long)]
        work: PathBuf,
        /// Where the results and plots go.
        #[arg(long)]
        out: PathBuf,
        /// A run of some cases only (--case): the cases not run keep their entries from OUT/results.json.
        #[arg(long)]
        partial: bool,
    },
    /// Writes docs/bench.md's results table from docs/bench/results.json, or checks it.
    BenchTable {
        /// Change nothing; fail if the table in the doc is not the one the results give.
        #[arg(long)]
        check: bool,
        #[arg(long, default_value = "docs/bench/results.json")]
        results: PathBuf,
        #[arg(long, default_value = "docs/bench.md")]
        doc: PathBuf,
    },
    /// QMP on QEMU's monitor socket: each STEP is one JSON command, or wait:EVENT (waits for the event).
    Qmp {
        #[arg(long)]
        socket: PathBuf,
        /// How long each answer and each event may take.
        #[arg(long, default_value_t = 60)]
        timeout_s: u64,
        #[arg(required = true)]
        steps: Vec<Step>,
    },
    /// Exit status 0 if the first result block in a serial log says ok.
    FirstResultOk { serial: PathBuf },
    /// Exit status 0 if the list FIELD of the JSON document on stdin holds the string TEXT.
    JsonHas { field: String, text: String },
    /// Queries the control socket (list, hfi1 pci, irdma dump) once a second until STOP exists; appends
    /// "control query 0" (or 1 on a failure) to LOG per round.
    ControlSoak {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long)]
        stop: PathBuf,
        #[arg(long)]
        log: PathBuf,
    },
    /// What ci/demo.sh prints of a run's result JSON.
    DemoSummary {
        /// The fabric run's result.
        #[arg(long)]
        fabric: bool,
        result: PathBuf,
    },
}

fn read_json(path: &Path) -> Result<Value, String> {
    report::read_json(path).map_err(|e| e.to_string())
}

fn write_text(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("write {}: {e}", path.display()))
}

fn bench_report(work: &Path, out: &Path, partial: bool) -> Result<bool, String> {
    let previous_path = out.join("results.json");
    let previous = if partial && previous_path.exists() { Some(read_json(&previous_path)?) } else { None };
    let r = report::build(work, previous, &report::Here::now()).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(out).map_err(|e| format!("mkdir {}: {e}", out.display()))?;
    write_json(&previous_path, &r).map_err(|e| e.to_string())?;
    write_text(&out.join("results.svg"), &svg::results(&r))?;
    if let Some(scale) = svg::scale(&r) {
        write_text(&out.join("scale.svg"), &scale)?;
    }
    eprint!("{}", summary::render(&r, &out.display().to_string()));
    Ok(true)
}

fn bench_table(check: bool, results: &Path, doc: &Path) -> Result<bool, String> {
    let r = read_json(results)?;
    let text = std::fs::read_to_string(doc).map_err(|e| format!("{}: {e}", doc.display()))?;
    let new = table::replace(&doc.display().to_string(), &text, &table::render(&r)).map_err(|e| e.to_string())?;
    let (d, res) = (doc.display(), results.display());
    if check {
        if new != text {
            eprintln!("{d}: the results table is not the one {res} gives; run ci/bench-table.sh");
            return Ok(false);
        }
        eprintln!("{d}: the results table matches {res}");
    } else if new != text {
        write_text(doc, &new)?;
        eprintln!("{d}: results table written from {res}");
    }
    Ok(true)
}

/// Whether the first result block of a serial log says ok (a guest that holds prints one per round).
pub fn first_result_ok(serial: &str) -> Result<bool, String> {
    let lines = pyfmt::splitlines(serial);
    let begin = lines.iter().position(|l| *l == RESULT_BEGIN).ok_or("no result block in the serial log")?;
    let len =
        lines[begin + 1..].iter().position(|l| *l == RESULT_END).ok_or("the first result block is not terminated")?;
    let doc: Value = serde_json::from_str(&lines[begin + 1..begin + 1 + len].concat())
        .map_err(|e| format!("the first result block is not JSON: {e}"))?;
    Ok(pyfmt::truthy(doc.get("ok")))
}

/// One round of the soak's control queries: every reply ok.
fn control_round(socket: &Path) -> bool {
    let Ok(mut c) = Control::connect(socket, Duration::from_secs(10)) else {
        return false;
    };
    let requests =
        [json!({"cmd": "list"}), json!({"device": "hfi1", "cmd": "pci"}), json!({"device": "irdma", "cmd": "dump"})];
    requests.iter().all(|r| c.exchange(r).is_ok_and(|reply| reply.get("ok").and_then(Value::as_bool) == Some(true)))
}

fn control_soak(socket: &Path, stop: &Path, log: &Path) -> Result<bool, String> {
    while !stop.exists() {
        let ok = control_round(socket);
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        writeln!(f, "control query {}", if ok { 0 } else { 1 }).map_err(|e| format!("{}: {e}", log.display()))?;
        // The soak's pace: a query round a second, for as long as the soak lasts.
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(true)
}

pub fn run(cmd: ToolCmd) -> Result<bool, String> {
    match cmd {
        ToolCmd::BenchReport { work, out, partial } => bench_report(&work, &out, partial),
        ToolCmd::BenchTable { check, results, doc } => bench_table(check, &results, &doc),
        ToolCmd::Qmp { socket, timeout_s, steps } => {
            let t = Duration::from_secs(timeout_s);
            let mut q = Qmp::connect(&socket, t).map_err(|e| e.to_string())?;
            qmp::run_steps(&mut q, &steps, t).map_err(|e| e.to_string()).map(|()| true)
        }
        ToolCmd::FirstResultOk { serial } => {
            let bytes = std::fs::read(&serial).map_err(|e| format!("{}: {e}", serial.display()))?;
            first_result_ok(&String::from_utf8_lossy(&bytes))
        }
        ToolCmd::JsonHas { field, text } => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| format!("stdin: {e}"))?;
            let doc: Value = serde_json::from_str(&s).map_err(|e| format!("stdin is not JSON: {e}"))?;
            Ok(doc.get(&field).and_then(Value::as_array).is_some_and(|a| a.iter().any(|v| v.as_str() == Some(&text))))
        }
        ToolCmd::ControlSoak { socket, stop, log } => control_soak(&socket, &stop, &log),
        ToolCmd::DemoSummary { fabric, result } => {
            let r = read_json(&result)?;
            print!("{}", if fabric { demo_summary::fabric(&r) } else { demo_summary::demo(&r) });
            Ok(true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_result_block_decides_not_a_later_one() {
        let log = |a: &str, b: &str| {
            format!("boot\r\n{RESULT_BEGIN}\r\n{{\"ok\": \r\n{a}}}\r\n{RESULT_END}\r\nRDMA-EMU-HOLD\n{RESULT_BEGIN}\n{{\"ok\": {b}}}\n{RESULT_END}\n")
        };
        assert_eq!(first_result_ok(&log("true", "false")), Ok(true));
        assert_eq!(first_result_ok(&log("false", "true")), Ok(false));
        assert!(first_result_ok("no block\n").is_err());
        assert!(first_result_ok(&format!("{RESULT_BEGIN}\n{{\"ok\": true}}\n")).is_err());
    }
}
