//! The plots of a benchmark run: results.svg (every target as measured/target on a log scale, right of the 1x
//! line meets it) and scale.svg (the scale case's curves, one log-log panel per unit).

use serde_json::Value;

use super::doc::{list, num, text};
use super::pyformat::{escape, fmt_g, g};
use crate::pyfmt;

/// The shown range of the results plot: log10 of the score from -2 to 4.
const LO: f64 = -2.0;
const HI: f64 = 4.0;
const W: i64 = 980;
const LEFT: i64 = 330;
const BAR: i64 = 22;
const GAP: i64 = 10;
const TOP: i64 = 60;
const PLOT: i64 = W - LEFT - 250;

/// How far a measurement is on the good side of its target: measured/bound for "higher is better",
/// bound/measured for "lower", so that >= 1 meets it. Without two positive figures the bar goes to an end of
/// the scale: 10^4 when met, 0.01 when not.
pub fn score(measured: f64, bound: f64, higher_is_better: bool, met: bool) -> f64 {
    if measured > 0.0 && bound > 0.0 {
        if higher_is_better {
            measured / bound
        } else {
            bound / measured
        }
    } else if met {
        1e4
    } else {
        0.01
    }
}

/// The x of a score on the results plot: log10 of it, clamped to [LO, HI], across PLOT pixels from LEFT.
pub fn x_of(score: f64) -> f64 {
    let l = score.max(1e-9).log10().clamp(LO, HI);
    LEFT as f64 + (l - LO) / (HI - LO) * PLOT as f64
}

struct Row {
    label: String,
    score: f64,
    met: bool,
    text: String,
}

/// results.svg of a report.
pub fn results(report: &Value) -> String {
    let mut rows = Vec::new();
    for c in list(report, "cases") {
        for t in list(c, "targets") {
            let (m, b) = (num(t.get("measured")).unwrap_or(f64::NAN), num(t.get("bound")).unwrap_or(f64::NAN));
            let higher = text(t, "better") == "higher";
            let met = pyfmt::truthy(t.get("met"));
            let op = if higher { ">=" } else { "<=" };
            rows.push(Row {
                label: format!("({}) {}", text(c, "id"), pyfmt::str_of(t.get("what"))),
                score: score(m, b, higher, met),
                met,
                text: format!("{} {} (target {op} {})", fmt_g(m, 4, false), pyfmt::str_of(t.get("unit")), g(b)),
            });
        }
    }
    let skipped: Vec<&Value> = list(report, "cases").iter().filter(|c| pyfmt::truthy(c.get("error"))).collect();
    let axis = TOP + rows.len() as i64 * (BAR + GAP) + 4;
    let h = axis + 30 + 16 * skipped.len() as i64;
    let machine = report.get("machine").cloned().unwrap_or(Value::Null);
    let mut svg = vec![
        format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" font-family="sans-serif" font-size="12">"#
        ),
        format!(r#"<rect width="{W}" height="{h}" fill="white"/>"#),
        format!(
            r#"<text x="10" y="22" font-size="15" font-weight="bold">testbed bench {}: {} x {}</text>"#,
            escape(&pyfmt::str_of(report.get("date"))),
            escape(&pyfmt::str_of(machine.get("nproc"))),
            escape(&pyfmt::str_of(machine.get("cpu_model")))
        ),
        r#"<text x="10" y="42">bar = measured / target, oriented so that right of the line (1x) meets the target; log scale</text>"#
            .to_string(),
    ];
    for p in LO as i32..=HI as i32 {
        let px = x_of(10f64.powi(p));
        let label = g(10f64.powi(p));
        svg.push(format!(r##"<line x1="{px:.1}" y1="{}" x2="{px:.1}" y2="{axis}" stroke="#ddd"/>"##, TOP - 6));
        svg.push(format!(r#"<text x="{px:.1}" y="{}" text-anchor="middle">{label}x</text>"#, axis + 16));
    }
    let base = x_of(1.0);
    svg.push(format!(
        r#"<line x1="{base:.1}" y1="{}" x2="{base:.1}" y2="{axis}" stroke="black" stroke-width="2"/>"#,
        TOP - 10
    ));
    for (i, r) in rows.iter().enumerate() {
        let y = TOP + i as i64 * (BAR + GAP);
        let end = x_of(r.score);
        let (left, width) = (base.min(end), (end - base).abs().max(1.0));
        let colour = if r.met { "#3a9d23" } else { "#d03030" };
        svg.push(format!(r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#, LEFT - 8, y + 15, escape(&r.label)));
        svg.push(format!(r#"<rect x="{left:.1}" y="{y}" width="{width:.1}" height="{BAR}" fill="{colour}"/>"#));
        svg.push(format!(r#"<text x="{}" y="{}">{}</text>"#, LEFT + PLOT + 8, y + 15, escape(&r.text)));
    }
    for (j, c) in skipped.iter().enumerate() {
        let error: String = pyfmt::str_of(c.get("error")).chars().take(140).collect();
        svg.push(format!(
            r##"<text x="10" y="{}" fill="#777">({}) {}</text>"##,
            axis + 36 + 16 * j as i64,
            escape(text(c, "id")),
            escape(&error)
        ));
    }
    svg.push("</svg>".into());
    svg.join("\n") + "\n"
}

const COLOURS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

fn point(p: &Value) -> Option<(f64, f64)> {
    Some((p.get(0)?.as_f64()?, p.get(1)?.as_f64()?))
}

/// scale.svg of a report, or None when it has no scale curves.
pub fn scale(report: &Value) -> Option<String> {
    let scale = super::doc::case(report, "scale")?;
    let curves = list(scale, "curves");
    if curves.is_empty() {
        return None;
    }
    let key = |cv: &Value| (pyfmt::str_of(cv.get("unit")), pyfmt::str_of(cv.get("x")));
    let mut units: Vec<(String, String)> = Vec::new();
    for cv in curves {
        if !units.contains(&key(cv)) {
            units.push(key(cv));
        }
    }
    const PW: i64 = 440;
    const PH: i64 = 260;
    const M: i64 = 60;
    const COLS: i64 = 2;
    let rows_n = (units.len() as i64 + COLS - 1) / COLS;
    let (w2, h2) = (COLS * (PW + M) + M, rows_n * (PH + 2 * M) + 40);
    let date = scale.get("date").or_else(|| report.get("date"));
    let mut g_ = vec![
        format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w2}" height="{h2}" font-family="sans-serif" font-size="11">"#
        ),
        format!(r#"<rect width="{w2}" height="{h2}" fill="white"/>"#),
        format!(
            r#"<text x="10" y="20" font-size="14" font-weight="bold">testbed bench scale, {}: how the cost grows with the work (log-log)</text>"#,
            escape(&pyfmt::str_of(date))
        ),
    ];
    for (i, (unit, xname)) in units.iter().enumerate() {
        let i = i as i64;
        let (ox, oy) = (M + (i % COLS) * (PW + M), 40 + M / 2 + (i / COLS) * (PH + 2 * M));
        let mine: Vec<&Value> = curves.iter().filter(|cv| key(cv) == (unit.clone(), xname.clone())).collect();
        let positive = |cv: &&Value| -> Vec<(f64, f64)> {
            list(cv, "points").iter().filter_map(point).filter(|&(x, y)| x > 0.0 && y > 0.0).collect()
        };
        let pts: Vec<(f64, f64)> = mine.iter().flat_map(positive).collect();
        if pts.is_empty() {
            continue;
        }
        let lx: Vec<f64> = pts.iter().map(|p| p.0.log10()).collect();
        let ly: Vec<f64> = pts.iter().map(|p| p.1.log10()).collect();
        let x0 = lx.iter().copied().fold(f64::INFINITY, f64::min);
        let x1 = lx.iter().copied().fold(f64::NEG_INFINITY, f64::max) + 1e-9;
        let y0 = ly.iter().copied().fold(f64::INFINITY, f64::min).floor();
        let mut y1 = (ly.iter().copied().fold(f64::NEG_INFINITY, f64::max) + 1e-9).ceil();
        if y1 - y0 < 1.0 {
            y1 = y0 + 1.0;
        }
        let (pw, ph) = (PW as f64, PH as f64);
        let px = |v: f64| ox as f64 + (v.log10() - x0) / (x1 - x0) * pw;
        let py = |v: f64| oy as f64 + ph - (v.log10() - y0) / (y1 - y0) * ph;
        g_.push(format!(r##"<rect x="{ox}" y="{oy}" width="{PW}" height="{PH}" fill="none" stroke="#999"/>"##));
        for d in y0 as i64..=y1 as i64 {
            let yy = oy as f64 + ph - (d as f64 - y0) / (y1 - y0) * ph;
            let label = g(10f64.powi(d as i32));
            g_.push(format!(r##"<line x1="{ox}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="#eee"/>"##, ox + PW));
            g_.push(format!(r#"<text x="{}" y="{:.1}" text-anchor="end">{label}</text>"#, ox - 4, yy + 4.0));
        }
        let mut xs: Vec<f64> = pts.iter().map(|p| p.0).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        for v in xs {
            g_.push(format!(r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#, px(v), oy + PH + 14, g(v)));
        }
        g_.push(format!(
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            pyfmt::float(ox as f64 + pw / 2.0),
            oy + PH + 30,
            escape(xname)
        ));
        g_.push(format!(r#"<text x="{ox}" y="{}">{}</text>"#, oy - 6, escape(unit)));
        for (k, cv) in mine.iter().enumerate() {
            let c = COLOURS[k % COLOURS.len()];
            let ps = positive(cv);
            let line: Vec<String> = ps.iter().map(|p| format!("{:.1},{:.1}", px(p.0), py(p.1))).collect();
            g_.push(format!(r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#, line.join(" ")));
            for p in &ps {
                g_.push(format!(r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{c}"/>"#, px(p.0), py(p.1)));
            }
            g_.push(format!(
                r#"<text x="{}" y="{}" fill="{c}">{}</text>"#,
                ox + 6,
                oy + 14 + 13 * k as i64,
                escape(&pyfmt::str_of(cv.get("name")))
            ));
        }
    }
    g_.push("</svg>".into());
    Some(g_.join("\n") + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_score_is_measured_over_target_oriented_so_that_one_or_more_meets_it() {
        // docs/bench.md: "bar = measured / target, oriented so that right of the line (1x) meets the target".
        let cases: &[(f64, f64, bool, bool, f64)] = &[
            (1909.0, 100.0, true, true, 19.09),         // (b): higher is better, 19x over
            (461.0, 500.0, false, true, 500.0 / 461.0), // lower is better, met
            (2.5, 2.0, false, false, 0.8),              // (f): 2.5 s against <= 2 s, missed
            (0.0, 1.0, true, true, 1e4),                // no positive figure, met: the right end
            (0.0, 1.0, true, false, 0.01),              // no positive figure, missed: the left end
        ];
        for &(m, b, higher, met, want) in cases {
            let s = score(m, b, higher, met);
            assert!((s - want).abs() < 1e-12 * want, "score({m}, {b}, {higher}) = {s}, want {want}");
        }
    }

    #[test]
    fn log_scale_positions_span_the_plot_from_a_hundredth_to_ten_thousand() {
        // x = 330 + (log10(s) + 2) / 6 * 400: 0.01 at the left edge, 1x a third across, 10^4 at the right edge.
        let cases: &[(f64, f64)] = &[
            (0.01, 330.0),
            (1.0, 330.0 + 400.0 / 3.0),
            (10.0, 330.0 + 200.0),
            (1e4, 730.0),
            (1e9, 730.0), // clamped
            (0.0, 330.0), // clamped
        ];
        for &(s, want) in cases {
            assert!((x_of(s) - want).abs() < 1e-9, "x_of({s}) = {}, want {want}", x_of(s));
        }
    }
}
