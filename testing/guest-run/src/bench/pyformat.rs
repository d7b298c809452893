//! Numbers and text as the Python reports printed them: format spec `g` with thousands separators, XML
//! escaping.

/// Python's format spec `g` with `precision` significant digits (`f"{v:.3g}"`; `:g` is precision 6), with
/// `,` thousands separators when `thousands`: fixed notation when the exponent is in [-4, precision),
/// scientific otherwise, trailing zeros dropped.
pub fn fmt_g(v: f64, precision: usize, thousands: bool) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let p = precision.max(1);
    if v == 0.0 {
        return if v.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    // The exponent after rounding to p significant digits.
    let sci = format!("{:.*e}", p - 1, v);
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if exp < -4 || exp >= p as i32 {
        let m = strip_zeros(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{m}e{sign}{:02}", exp.abs());
    }
    let decimals = (p as i32 - 1 - exp).max(0) as usize;
    let fixed = strip_zeros(&format!("{v:.decimals$}"));
    if thousands {
        group_thousands(&fixed)
    } else {
        fixed
    }
}

fn strip_zeros(s: &str) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s.to_string()
    }
}

/// `1234567.5` -> `1,234,567.5`.
pub fn group_thousands(s: &str) -> String {
    let (sign, rest) = s.strip_prefix('-').map_or(("", s), |r| ("-", r));
    let (int, frac) = rest.split_once('.').map_or((rest, None), |(i, f)| (i, Some(f)));
    let mut grouped = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

/// `f"{v:g}"`.
pub fn g(v: f64) -> String {
    fmt_g(v, 6, false)
}

/// XML text escaping as Python's `xml.sax.saxutils.escape` does it (&, <, >).
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn general_format_follows_python_format_spec_g() {
        // Expected values: Python's format spec mini-language (docs.python.org, "General format").
        let cases: &[(f64, usize, bool, &str)] = &[
            (1.0, 6, false, "1"),
            (0.01, 6, false, "0.01"),
            (10000.0, 6, false, "10000"),
            (1e6, 6, false, "1e+06"),
            (0.0001234, 3, false, "0.000123"),
            (0.00001234, 3, false, "1.23e-05"),
            (1909.4, 4, false, "1909"),
            (12345.6, 4, false, "1.235e+04"),
            (12345.6, 4, true, "1.235e+04"),
            (1234.5678, 6, true, "1,234.57"),
            (0.6548, 4, false, "0.6548"),
            (2.0, 3, false, "2"),
            (999.96, 3, false, "1e+03"),
            (0.0, 3, false, "0"),
            (-4.56789, 3, false, "-4.57"),
        ];
        for &(v, p, t, want) in cases {
            assert_eq!(fmt_g(v, p, t), want, "{v} .{p}g thousands={t}");
        }
    }

    #[test]
    fn thousands_are_grouped_in_the_integer_part_only() {
        assert_eq!(group_thousands("1234567"), "1,234,567");
        assert_eq!(group_thousands("-1234.5678"), "-1,234.5678");
        assert_eq!(group_thousands("123"), "123");
    }
}
