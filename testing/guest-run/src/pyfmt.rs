//! How the result's texts render JSON values: the way the verdict always has (Python's `str`, `repr` and
//! truthiness), so problem texts that scripts and people search for keep their form.

use serde_json::Value;

/// Python's truthiness of a JSON value: null, false, 0, "", [] and {} are false.
pub fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// `str(v)`: a string as itself, None/True/False by name, containers as `repr`.
pub fn str_of(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        other => repr(other),
    }
}

/// `repr(v)`, for the values a result block carries.
pub fn repr(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "None".into(),
        Some(Value::Bool(true)) => "True".into(),
        Some(Value::Bool(false)) => "False".into(),
        Some(Value::Number(n)) => number(n),
        Some(Value::String(s)) => {
            let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
            let mut out = String::from(quote);
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c if c == quote => {
                        out.push('\\');
                        out.push(c);
                    }
                    c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
                    c => out.push(c),
                }
            }
            out.push(quote);
            out
        }
        Some(Value::Array(a)) => format!("[{}]", a.iter().map(|x| repr(Some(x))).collect::<Vec<_>>().join(", ")),
        Some(Value::Object(o)) => format!(
            "{{{}}}",
            o.iter()
                .map(|(k, x)| format!("{}: {}", repr(Some(&Value::String(k.clone()))), repr(Some(x))))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A float as Python prints it: the shortest text that reads back, with `.0` on whole numbers.
pub fn float(f: f64) -> String {
    if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 {
        format!("{f:.1}")
    } else {
        format!("{f}")
    }
}

fn number(n: &serde_json::Number) -> String {
    if n.is_i64() || n.is_u64() {
        n.to_string()
    } else {
        float(n.as_f64().unwrap_or(f64::NAN))
    }
}

/// `float(v)` of a JSON number or numeric string.
pub fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

/// `round(x, 3)`: correctly rounded from the float's exact value, as Python's is.
pub fn round3(x: f64) -> f64 {
    format!("{x:.3}").parse().unwrap_or(x)
}

/// `isinstance(v, int)`: a JSON integer (Python's bools are ints too).
pub fn as_int(v: Option<&Value>) -> Option<i128> {
    match v {
        Some(Value::Number(n)) => n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from)),
        Some(Value::Bool(b)) => Some(i128::from(*b)),
        _ => None,
    }
}

/// `a == b` as Python compares JSON values: numbers by value, whatever their JSON form.
pub fn eq(a: Option<&Value>, b: Option<&Value>) -> bool {
    let a = a.unwrap_or(&Value::Null);
    let b = b.unwrap_or(&Value::Null);
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// Python's `str.splitlines()`: every line boundary it knows, the boundary dropped.
pub fn splitlines(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let boundary = matches!(
            c,
            '\n' | '\r' | '\u{0b}' | '\u{0c}' | '\u{1c}' | '\u{1d}' | '\u{1e}' | '\u{85}' | '\u{2028}' | '\u{2029}'
        );
        if boundary {
            out.push(&text[start..i]);
            let mut next = i + c.len_utf8();
            if c == '\r' {
                if let Some(&(j, '\n')) = chars.peek() {
                    chars.next();
                    next = j + 1;
                }
            }
            start = next;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_render_as_python_prints_them() {
        let cases: &[(Value, &str, &str)] = &[
            (Value::Null, "None", "None"),
            (json!(true), "True", "True"),
            (json!(7), "7", "7"),
            (json!(2.0), "2.0", "2.0"),
            (json!(0.125), "0.125", "0.125"),
            (json!("a b"), "a b", "'a b'"),
            (json!("it's"), "it's", "\"it's\""),
            (json!({"x": [1, null]}), "{'x': [1, None]}", "{'x': [1, None]}"),
        ];
        for (v, s, r) in cases {
            assert_eq!(str_of(Some(v)), *s, "str({v})");
            assert_eq!(repr(Some(v)), *r, "repr({v})");
        }
    }

    #[test]
    fn lines_split_on_every_boundary_python_knows() {
        assert_eq!(splitlines("a\r\nb\rc\nd\x0ce"), ["a", "b", "c", "d", "e"]);
        assert_eq!(splitlines("a\n\nb\n"), ["a", "", "b"]);
        assert!(splitlines("").is_empty());
    }

    #[test]
    fn rounding_to_milliseconds_follows_the_exact_value() {
        // 1.0005 is 1.000499999... in binary, 2.0005 is 2.000500000...1: Python rounds them to 1.0 and 2.001.
        assert_eq!(round3(1.0005), 1.0);
        assert_eq!(round3(2.0005), 2.001);
        assert_eq!(round3(1.23456), 1.235);
    }
}
