//! What the guest printed on its console: the result block between `RDMA-EMU-RESULT-BEGIN` and
//! `RDMA-EMU-RESULT-END` (ci/guest/init, emit_result), and udriver's reports inside its steps.

use serde_json::{Map, Value};

use crate::pyfmt;

pub const RESULT_BEGIN: &str = "RDMA-EMU-RESULT-BEGIN";
pub const RESULT_END: &str = "RDMA-EMU-RESULT-END";

/// The last result block of the console log: a guest that holds (`rdma_emu.hold=1`) prints one per round, each
/// with every step so far. Its JSON may span lines (the console wraps nothing, but a long line can be split by
/// the kernel's own messages), so the lines are joined.
pub fn result_block(serial: &str) -> Result<Value, String> {
    let lines = pyfmt::splitlines(serial);
    let Some(begin) = lines.iter().rposition(|l| l.trim() == RESULT_BEGIN) else {
        return Err("the guest printed no result block".into());
    };
    let Some(len) = lines[begin + 1..].iter().position(|l| l.trim() == RESULT_END) else {
        return Err("the guest's result block is not terminated".into());
    };
    let text: String = lines[begin + 1..begin + 1 + len].concat();
    serde_json::from_str(&text).map_err(|e| format!("the guest's result block is not JSON: {e}"))
}

/// udriver --json prints one JSON document, or JSON lines.
pub fn udriver_output(stdout: &str) -> Result<Value, String> {
    let text = stdout.trim();
    if text.is_empty() {
        return Err("udriver printed nothing on stdout".into());
    }
    if let Ok(v) = serde_json::from_str(text) {
        return Ok(v);
    }
    pyfmt::splitlines(text)
        .into_iter()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<Vec<Value>, _>>()
        .map(Value::Array)
        .map_err(|e| format!("udriver's stdout is not JSON: {e}"))
}

fn name_of(step: &Map<String, Value>) -> &str {
    step.get("name").and_then(Value::as_str).unwrap_or("")
}

/// Parses udriver's report into each demo's and the bench's `output`, and fails a step whose report says it
/// failed although udriver exited 0 (its report has its own verdict: `{"demo", "ok", "steps": [{"name",
/// "ok", ...}]}`).
pub fn read_udriver_reports(steps: &mut [Value]) {
    for s in steps.iter_mut().filter_map(Value::as_object_mut) {
        let name = name_of(s);
        if !(name.starts_with("demo-") || name == "bench") || !s.contains_key("stdout") {
            continue;
        }
        let stdout = s.get("stdout").and_then(Value::as_str).unwrap_or("").to_string();
        let (out, mut err) = match udriver_output(&stdout) {
            Ok(v) => (v, None),
            Err(e) => (Value::Null, Some(e)),
        };
        if let (None, Some(report)) = (&err, out.as_object()) {
            if report.get("ok") == Some(&Value::Bool(false)) {
                let failed: Vec<String> = report
                    .get("steps")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_object)
                    .filter(|st| !pyfmt::truthy(st.get("ok")))
                    .map(|st| pyfmt::str_of(st.get("name")))
                    .collect();
                let mut why = String::from("udriver reports failure");
                if !failed.is_empty() {
                    why.push_str(&format!(" in {}", failed.join(", ")));
                }
                err = Some(why);
            }
        }
        s.insert("output".into(), out);
        if let Some(err) = err {
            fail_if_ok(s, err);
        }
    }
}

fn fail_if_ok(step: &mut Map<String, Value>, error: String) {
    if pyfmt::truthy(step.get("ok")) {
        step.insert("ok".into(), Value::Bool(false));
        step.insert("error".into(), Value::String(error));
    }
}

/// The first step of udriver's hfi1 demo report about the flow PSN space (issue 15).
const SYNC_STEP: &str = "a request crossing the flow PSN space";

fn object(v: Option<&Value>) -> &Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    v.and_then(Value::as_object).unwrap_or_else(|| EMPTY.get_or_init(Map::new))
}

/// The hfi1 demo's SYNC step: a READ that crossed its flow's PSN space waited for the segment in flight,
/// parked the flow on the reserved generation, went on with the next one, and had both old-generation packets
/// refused with nothing placed. `None` when the report shows all of that.
pub fn sync_problem(report: &Map<String, Value>) -> Option<String> {
    let found =
        report.get("steps").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_object).find(|st| {
            pyfmt::str_of(Some(st.get("name").unwrap_or(&Value::String(String::new())))).starts_with(SYNC_STEP)
        });
    let Some(st) = found else {
        return Some("its report has no SYNC step".into());
    };
    let detail = object(st.get("detail"));
    let stale = object(detail.get("old_generation_packets"));
    let dev = object(detail.get("device_generation"));
    let old = object(detail.get("old")).get("generation");
    let new = object(detail.get("new")).get("generation");
    let s = |v: &str| Value::String(v.into());
    let n = |v: u64| Value::from(v);
    let checks = [
        st.get("ok") == Some(&Value::Bool(true)),
        detail.get("waited_for_pending_segment") == Some(&Value::Bool(true)),
        !pyfmt::eq(old, new),
        pyfmt::eq(dev.get("before_sync"), old),
        pyfmt::eq(dev.get("cleared"), Some(&s("0xfffff"))),
        pyfmt::eq(dev.get("after_sync"), new),
        pyfmt::eq(stale.get("refused"), Some(&n(2))),
        pyfmt::eq(stale.get("bytes_placed"), Some(&n(0))),
        pyfmt::eq(stale.get("result"), Some(&s("GenMismatch"))),
    ];
    if checks.iter().all(|&c| c) {
        return None;
    }
    let shown: String = Value::Object(detail.clone()).to_string().chars().take(400).collect();
    Some(format!("its SYNC step shows {shown}"))
}

/// Fails an ok `demo-hfi1` whose report does not show the SYNC step's behaviour.
pub fn check_hfi1_sync(steps: &mut [Value]) {
    for s in steps.iter_mut().filter_map(Value::as_object_mut) {
        if name_of(s) != "demo-hfi1" || !pyfmt::truthy(s.get("ok")) {
            continue;
        }
        let why = match s.get("output").and_then(Value::as_object) {
            Some(report) => sync_problem(report),
            None => continue,
        };
        if let Some(why) = why {
            s.insert("ok".into(), Value::Bool(false));
            s.insert("error".into(), Value::String(format!("udriver hfi1-demo: {why}")));
        }
    }
}
