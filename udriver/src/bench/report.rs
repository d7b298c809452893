//! What a bench run reports: metrics, targets and their verdicts, per case, and the machine they belong to.
//! The same format for `testbed bench` on the host and `udriver bench` inside the guest.

#![forbid(unsafe_code)]

use serde::Serialize;

/// One measured value.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Metric {
    pub name: String,
    pub value: f64,
    pub unit: &'static str,
}

/// Whether a measured value is better high (throughput, speed-up) or low (latency, overhead).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Higher,
    Lower,
}

/// A target of issue 7 and how this run compares with it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Target {
    pub what: String,
    pub measured: f64,
    pub bound: f64,
    pub unit: &'static str,
    pub better: Better,
    pub met: bool,
    /// How far from the bound, as a factor >= 1 in the bad direction when missed (1 when met exactly).
    pub factor: f64,
}

impl Target {
    pub fn new(what: &str, measured: f64, bound: f64, unit: &'static str, better: Better) -> Self {
        let (met, factor) = match better {
            Better::Higher => (measured >= bound, if measured > 0.0 { bound / measured } else { f64::INFINITY }),
            Better::Lower => (measured <= bound, if bound > 0.0 { measured / bound } else { f64::INFINITY }),
        };
        Self { what: what.to_string(), measured, bound, unit, better, met, factor }
    }
}

/// How one cost grows with the work: (x, y) points, x ascending (issue 17's scale curves).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Curve {
    pub name: String,
    /// What x counts ("entries in the table", "concurrent clients", ...).
    pub x: String,
    pub unit: &'static str,
    pub points: Vec<[f64; 2]>,
}

impl Curve {
    /// (x at the last point / x at the first, y at the last / y at the first): how much the work grew and
    /// how much the cost grew with it.
    pub fn growth(&self) -> Option<(f64, f64)> {
        let (first, last) = (self.points.first()?, self.points.last()?);
        if first[0] <= 0.0 || first[1] <= 0.0 {
            return None;
        }
        Some((last[0] / first[0], last[1] / first[1]))
    }
}

/// One case of the benchmark: its metrics, its targets, and notes on how it was measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Case {
    pub id: String,
    pub title: String,
    pub metrics: Vec<Metric>,
    pub targets: Vec<Target>,
    pub notes: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub curves: Vec<Curve>,
    /// Set when the case could not run; its metrics are then incomplete.
    pub error: Option<String>,
}

impl Case {
    pub fn new(id: &str, title: &str) -> Self {
        Self {
            id: id.to_string(),
            title: title.to_string(),
            metrics: Vec::new(),
            targets: Vec::new(),
            notes: Vec::new(),
            curves: Vec::new(),
            error: None,
        }
    }

    pub fn metric(&mut self, name: &str, value: f64, unit: &'static str) {
        self.metrics.push(Metric { name: name.to_string(), value, unit });
    }

    pub fn target(&mut self, t: Target) {
        self.targets.push(t);
    }

    pub fn curve(&mut self, name: &str, x: &str, unit: &'static str, points: Vec<[f64; 2]>) {
        self.curves.push(Curve { name: name.to_string(), x: x.to_string(), unit, points });
    }

    pub fn note(&mut self, n: impl Into<String>) {
        self.notes.push(n.into());
    }

    /// Runs `f` on this case: what it measured stays, and an error it returns is recorded.
    pub fn run(mut self, f: impl FnOnce(&mut Case) -> Result<(), String>) -> Self {
        if let Err(e) = f(&mut self) {
            self.error = Some(e);
        }
        self
    }
}

/// The machine the numbers belong to.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub kernel: String,
}

impl Machine {
    pub fn this() -> Self {
        let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        Self { nproc, cpu_model: cpu_model(&cpuinfo), kernel: kernel.trim().to_string() }
    }
}

/// The first `model name` of /proc/cpuinfo, or "unknown".
pub fn cpu_model(cpuinfo: &str) -> String {
    cpuinfo
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == "model name").then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BenchReport {
    /// What ran it: "testbed" (host) or "udriver guest" (inside the guest).
    pub tool: &'static str,
    /// UTC, `YYYY-MM-DDTHH:MM:SSZ`.
    pub date: String,
    pub machine: Machine,
    /// "release" or "debug": only release numbers mean anything.
    pub build: &'static str,
    pub budget_ms: u64,
    pub cases: Vec<Case>,
}

impl BenchReport {
    /// Targets met / all targets.
    pub fn score(&self) -> (usize, usize) {
        let all: Vec<&Target> = self.cases.iter().flat_map(|c| &c.targets).collect();
        (all.iter().filter(|t| t.met).count(), all.len())
    }

    /// A human-readable rendering: per case its metrics, targets and notes.
    pub fn render(&self) -> String {
        let (met, all) = self.score();
        let mut out = format!(
            "{} bench, {} ({} build), {} x {}, kernel {}: {met}/{all} targets met\n",
            self.tool, self.date, self.build, self.machine.nproc, self.machine.cpu_model, self.machine.kernel
        );
        for c in &self.cases {
            out.push_str(&format!("({}) {}\n", c.id, c.title));
            if let Some(e) = &c.error {
                out.push_str(&format!("    ERROR: {e}\n"));
            }
            for m in &c.metrics {
                out.push_str(&format!("    {:<46} {:>14} {}\n", m.name, fmt_value(m.value), m.unit));
            }
            for t in &c.targets {
                let op = if t.better == Better::Higher { ">=" } else { "<=" };
                let verdict = if t.met { "met".to_string() } else { format!("MISSED by {:.2}x", t.factor) };
                out.push_str(&format!(
                    "    target {:<39} {:>14} {} {op} {} : {verdict}\n",
                    t.what,
                    fmt_value(t.measured),
                    t.unit,
                    fmt_value(t.bound)
                ));
            }
            for cv in &c.curves {
                let pts: Vec<String> =
                    cv.points.iter().map(|[x, y]| format!("{}: {}", fmt_value(*x), fmt_value(*y))).collect();
                out.push_str(&format!("    curve {} ({} by {}): {}\n", cv.name, cv.unit, cv.x, pts.join(", ")));
            }
            for n in &c.notes {
                out.push_str(&format!("    note: {n}\n"));
            }
        }
        out
    }
}

fn fmt_value(v: f64) -> String {
    if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a Unix time (proleptic Gregorian, days-from-civil inverted).
pub fn utc_string(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}
