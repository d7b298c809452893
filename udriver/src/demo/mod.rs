//! The demos `udriver hfi1-demo` and `udriver irdma-demo` run: the driver doing its real work against a
//! device, each step checked, with a report both readable and machine-readable (`--json`).

#![forbid(unsafe_code)]

pub mod hfi1;
pub mod irdma;

use serde::Serialize;
use serde_json::Value;

/// One checked step of a demo.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub name: String,
    pub ok: bool,
    /// What the step observed (values, counts), or the error.
    pub detail: Value,
    pub micros: u128,
}

/// The outcome of a demo: ok only if every step was.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub demo: &'static str,
    pub ok: bool,
    pub steps: Vec<Step>,
}

impl DemoReport {
    pub fn new(demo: &'static str) -> Self {
        Self { demo, ok: true, steps: Vec::new() }
    }

    /// Runs one step, records its result and time, and returns whether it succeeded.
    pub fn step(&mut self, name: &str, f: impl FnOnce() -> Result<Value, String>) -> bool {
        let start = std::time::Instant::now();
        let result = f();
        let micros = start.elapsed().as_micros();
        let (ok, detail) = match result {
            Ok(v) => (true, v),
            Err(e) => (false, Value::String(e)),
        };
        self.ok &= ok;
        self.steps.push(Step { name: name.to_string(), ok, detail, micros });
        ok
    }

    /// A human-readable rendering, one line per step.
    pub fn render(&self) -> String {
        let mut out = format!("{} demo: {}\n", self.demo, if self.ok { "OK" } else { "FAILED" });
        for s in &self.steps {
            let detail = match &s.detail {
                Value::String(e) => e.clone(),
                v => v.to_string(),
            };
            out.push_str(&format!(
                "  [{}] {:<44} {:>9} us  {}\n",
                if s.ok { " ok " } else { "FAIL" },
                s.name,
                s.micros,
                detail
            ));
        }
        out
    }
}
