//! Reading a results document (docs/bench/results.json) and the run results it is made from.

use serde_json::Value;

/// A JSON number as f64 (`None` for anything else).
pub fn num(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64)
}

/// `d.get(key)` as a string, "" when missing or not a string.
pub fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// `d.get(key, [])` as a slice.
pub fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// The case of a report with this id.
pub fn case<'a>(report: &'a Value, id: &str) -> Option<&'a Value> {
    list(report, "cases").iter().find(|c| text(c, "id") == id)
}
