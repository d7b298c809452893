//! What `ci/e2e.sh` requires of a result beyond its verdict.

use serde_json::Value;

use crate::scenario::{Outcome, Scenario};

/// Longest problem text shown in a report.
const SHOWN: usize = 600;

pub struct Check {
    pub met: bool,
    /// What the run showed, for the console.
    pub report: String,
}

fn problems(result: &Value) -> Vec<String> {
    result
        .get("problems")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| crate::pyfmt::str_of(Some(p)))
        .collect()
}

/// Whether `result` is what the row's outcome requires, the run having taken `took_s` seconds.
pub fn check(row: &Scenario, result: &Value, took_s: u64) -> Check {
    let problems = problems(result);
    let mut report = format!("{}: {} problems, run took {took_s} s:\n", row.name, problems.len());
    for p in &problems {
        let shown: String = p.chars().take(SHOWN).collect();
        report += &format!("  {shown}{}\n", if shown.len() < p.len() { " ..." } else { "" });
    }
    let passed = result.get("ok") == Some(&Value::Bool(true));
    let met = match row.outcome {
        Outcome::Passes => passed,
        Outcome::Interactive | Outcome::HostDriven => false,
        Outcome::FailsReporting { one_problem_names, problems_name, within_s } => {
            let text = problems.join("\n");
            !passed
                && problems.iter().any(|p| one_problem_names.iter().all(|n| p.contains(n)))
                && problems_name.iter().all(|n| text.contains(n))
                && took_s < within_s
        }
    };
    Check { met, report }
}

/// Each guest step's stderr lines that say ERROR, as `STEP: LINE`: a demo that passes but logs errors (e.g. a
/// teardown the kernel refused) is a failure too.
pub fn driver_errors(result: &Value) -> Vec<String> {
    let steps = result.get("guest").and_then(|g| g.get("steps")).and_then(Value::as_array);
    steps
        .into_iter()
        .flatten()
        .flat_map(|s| {
            let name = crate::pyfmt::str_of(s.get("name"));
            let stderr = s.get("stderr").and_then(Value::as_str).unwrap_or("");
            crate::pyfmt::splitlines(stderr)
                .into_iter()
                .filter(|l| l.contains("ERROR"))
                .map(move |l| format!("{name}: {l}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::find;
    use serde_json::json;

    /// The stall run's report as ci/run-qemu.sh words it when the guest's own step timeout fires.
    fn stall_result(problem: &str) -> Value {
        json!({"ok": false, "problems": [problem]})
    }

    #[test]
    fn the_stall_run_must_fail_in_time_naming_the_step_and_the_stuck_register() {
        let named = "kernel-driver step failed; last CSR accesses: #7 read SEND_DMA_STATUS[engine 0] = 0x0; \
                     step kdriver-rmmod: timed out";
        let unnamed = "kernel-driver step failed; last CSR accesses: #7 read RCV_CTRL = 0x0";
        let cases: &[(&str, Value, u64, bool)] = &[
            ("named within the deadline", stall_result(&named.replace("failed;", "kdriver-rmmod failed;")), 100, true),
            ("the register not named", stall_result(&unnamed.replace("failed;", "kdriver-rmmod failed;")), 100, false),
            ("too late", stall_result(&named.replace("failed;", "kdriver-rmmod failed;")), 240, false),
            ("the run passed", json!({"ok": true, "problems": []}), 100, false),
        ];
        let row = find("stall").unwrap();
        for (what, result, took, met) in cases {
            assert_eq!(check(row, result, *took).met, *met, "{what}");
        }
    }

    #[test]
    fn the_bounce_run_must_name_both_hfis_accesses_and_the_cable_in_one_problem() {
        let full = "guest step fabric-link-bounce overran its deadline (the host stopped QEMU); last CSR accesses: \
                    #1 read X = 0x0; hfi1-wfr1's last CSR accesses: #2 read Y = 0x0; last cable packets: to b: LNI";
        let row = find("fabric-bounce").unwrap();
        assert!(check(row, &json!({"ok": false, "problems": [full]}), 300).met);
        let no_cable = full.replace("last cable packets: to b: LNI", "last cable packets: ");
        assert!(!check(row, &json!({"ok": false, "problems": [no_cable]}), 300).met);
    }

    #[test]
    fn error_lines_of_a_passing_steps_stderr_are_reported_with_the_step() {
        let r = json!({"guest": {"steps": [
            {"name": "demo-irdma", "stderr": "INFO up\nERROR destroy_qp refused\n"},
            {"name": "demo-hfi1", "stderr": "fine"},
        ]}});
        assert_eq!(driver_errors(&r), ["demo-irdma: ERROR destroy_qp refused"]);
    }
}
