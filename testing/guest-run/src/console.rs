//! The guest's console protocol (ci/guest/init, host_call) and the host's watch over announced deadlines.
//!
//! The guest asks with one line, `RDMA-EMU {"seq":N,"req":...}`, and waits (bounded) for the host's answer on the
//! console's input, `RDMA-EMU-ACK N {"ok":BOOL,"reply":"..."}`. The console echoes that input, so the host reads
//! its own answers back and skips them. Requests:
//!
//! - `deadline` `{step, secs}`: a step with its own timeout starts. The host reads the device model's access
//!   totals before it answers, so the totals are taken before the step's first access; if the step is still
//!   running 30 s after the guest's own timeout, the host stops the guest (a kernel spinning where the guest's
//!   timeouts cannot reach).
//! - `deadline-end` `{step}`: that step ended; the totals again, before the answer.
//! - `fault` `{hfi, spec}`, `fault-clear`, `accesses`, `counters` `{names}`: the fabric run's requests of the
//!   device model (`control::host_answer`).
//! - `fuzz-target` `{target}`: the fuzz-wire guest's QPs, as qp-keeper reported them (a JSON object in a
//!   string). The host writes it to `fuzz-target.json` and prints it as a `FUZZ-TARGET` line on its stdout.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A guest request's line starts so.
pub const REQUEST: &str = "RDMA-EMU ";
/// The host's answer starts so (and the console echoes it back).
pub const ACK: &str = "RDMA-EMU-ACK ";
/// The guest's init started.
pub const INIT: &str = "RDMA-EMU-INIT";
/// The guest's result block ended.
pub const RESULT_END: &str = "RDMA-EMU-RESULT-END";
/// The prefix of the line `guest-run run` prints on its stdout for each `fuzz-target` request.
pub const FUZZ_TARGET_LINE: &str = "FUZZ-TARGET ";
/// What the host adds to a step's own timeout before it stops the guest.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(30);

/// One request of the guest.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "req", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    Deadline {
        seq: u64,
        step: String,
        secs: u64,
    },
    DeadlineEnd {
        seq: u64,
        step: String,
    },
    Fault {
        seq: u64,
        hfi: String,
        spec: String,
    },
    FaultClear {
        seq: u64,
    },
    Accesses {
        seq: u64,
    },
    /// Counter names, separated by spaces.
    Counters {
        seq: u64,
        names: String,
    },
    /// qp-keeper's report: a JSON object, as a string.
    FuzzTarget {
        seq: u64,
        target: String,
    },
}

impl Request {
    pub fn seq(&self) -> u64 {
        match self {
            Self::Deadline { seq, .. }
            | Self::DeadlineEnd { seq, .. }
            | Self::Fault { seq, .. }
            | Self::FaultClear { seq }
            | Self::Accesses { seq }
            | Self::Counters { seq, .. }
            | Self::FuzzTarget { seq, .. } => *seq,
        }
    }

    /// The words `control::host_answer` takes, for the requests of the device model.
    pub fn host_words(&self) -> Option<Vec<String>> {
        match self {
            Self::Deadline { .. } | Self::DeadlineEnd { .. } | Self::FuzzTarget { .. } => None,
            Self::Fault { hfi, spec, .. } => Some(vec!["fault".into(), hfi.clone(), spec.clone()]),
            Self::FaultClear { .. } => Some(vec!["fault-clear".into()]),
            Self::Accesses { .. } => Some(vec!["accesses".into()]),
            Self::Counters { names, .. } => Some(
                std::iter::once("counters".to_string()).chain(names.split_whitespace().map(String::from)).collect(),
            ),
        }
    }
}

/// What one console line is to the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Init,
    ResultEnd,
    Request(Request),
    /// A request line that does not parse: answered with an error if its sequence number can be read.
    BadRequest {
        seq: Option<u64>,
        error: String,
    },
    /// The host's own answer, echoed by the console.
    EchoedAck,
    Other,
}

/// Classifies one console line (its trailing CR already removed).
pub fn parse(line: &str) -> Line {
    if line.starts_with(INIT) {
        Line::Init
    } else if line.starts_with(RESULT_END) {
        Line::ResultEnd
    } else if line.starts_with(ACK) {
        Line::EchoedAck
    } else if let Some(json) = line.strip_prefix(REQUEST) {
        match serde_json::from_str::<Request>(json) {
            Ok(r) => Line::Request(r),
            Err(e) => Line::BadRequest {
                seq: serde_json::from_str::<serde_json::Value>(json)
                    .ok()
                    .and_then(|v| v.get("seq").and_then(serde_json::Value::as_u64)),
                error: format!("bad request: {e}"),
            },
        }
    } else {
        Line::Other
    }
}

/// The members of qp-keeper's report that the fuzzer reads (testing/qp-keeper/README.md).
const FUZZ_TARGET_KEYS: &[&str] = &[
    "generation",
    "device",
    "port",
    "lid",
    "sm_lid",
    "peer_lid",
    "mtu",
    "pkeys",
    "qkey",
    "sl",
    "qps",
    "mr",
    "recreated",
];

/// A `fuzz-target` request's report, checked: one JSON object with every member the fuzzer reads, and `qps` a
/// list. The line to publish (the guest's text as it came, which is one line), or why not.
pub fn fuzz_target(target: &str) -> Result<String, String> {
    let v: serde_json::Value = serde_json::from_str(target).map_err(|e| format!("fuzz-target is not JSON: {e}"))?;
    let obj = v.as_object().ok_or("fuzz-target is not a JSON object")?;
    if let Some(k) = FUZZ_TARGET_KEYS.iter().find(|k| !obj.contains_key(**k)) {
        return Err(format!("fuzz-target has no \"{k}\""));
    }
    if !obj["qps"].is_array() {
        return Err("fuzz-target's \"qps\" is not a list".into());
    }
    Ok(target.trim().replace(['\n', '\r'], " "))
}

#[derive(Serialize)]
struct AckBody<'a> {
    ok: bool,
    reply: &'a str,
}

/// The answer line to request `seq` (with its newline). The reply is kept to one line.
pub fn ack(seq: u64, ok: bool, reply: &str) -> String {
    let reply = reply.replace(['\n', '\r'], " ");
    let body =
        serde_json::to_string(&AckBody { ok, reply: &reply }).unwrap_or_else(|_| r#"{"ok":false,"reply":""}"#.into());
    format!("{ACK}{seq} {body}\n")
}

/// The host's view of the guest's announced deadlines, on a clock of its own (`T`: an `Instant`, or a fake).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch<T> {
    running: Option<(String, T)>,
}

impl<T> Default for Watch<T> {
    fn default() -> Self {
        Self { running: None }
    }
}

impl<T: Copy + PartialOrd + std::ops::Add<Duration, Output = T>> Watch<T> {
    /// Step `step` started at `now` with the guest's own timeout `secs`: it is overdue once that plus the grace
    /// has passed. A new announcement replaces the previous one (steps do not nest).
    pub fn start(&mut self, step: &str, secs: u64, now: T) {
        self.running = Some((step.to_string(), now + Duration::from_secs(secs) + DEADLINE_GRACE));
    }

    /// The step ended (any step: the guest announces one at a time).
    pub fn end(&mut self) {
        self.running = None;
    }

    /// The step that overran its deadline at `now`, if one did.
    pub fn overdue(&self, now: T) -> Option<&str> {
        self.running.as_ref().filter(|(_, until)| now > *until).map(|(s, _)| s.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str) -> Line {
        parse(&format!("RDMA-EMU {json}"))
    }

    #[test]
    fn each_guest_request_parses_to_its_kind_with_its_sequence_number() {
        let cases: &[(&str, Request)] = &[
            (
                r#"{"seq":1,"req":"deadline","step":"kdriver-modprobe","secs":120}"#,
                Request::Deadline { seq: 1, step: "kdriver-modprobe".into(), secs: 120 },
            ),
            (
                r#"{"seq":2,"req":"deadline-end","step":"kdriver-modprobe"}"#,
                Request::DeadlineEnd { seq: 2, step: "kdriver-modprobe".into() },
            ),
            (
                r#"{"seq":3,"req":"fault","hfi":"hfi1-wfr1","spec":"cable-drop,nth=3"}"#,
                Request::Fault { seq: 3, hfi: "hfi1-wfr1".into(), spec: "cable-drop,nth=3".into() },
            ),
            (r#"{"seq":4,"req":"fault-clear"}"#, Request::FaultClear { seq: 4 }),
            (r#"{"seq":5,"req":"accesses"}"#, Request::Accesses { seq: 5 }),
            (
                r#"{"seq":6,"req":"counters","names":"tid_read_bytes tid_write_bytes"}"#,
                Request::Counters { seq: 6, names: "tid_read_bytes tid_write_bytes".into() },
            ),
            (
                r#"{"seq":7,"req":"fuzz-target","target":"{\"generation\":1,\"qps\":[]}"}"#,
                Request::FuzzTarget { seq: 7, target: r#"{"generation":1,"qps":[]}"#.into() },
            ),
        ];
        for (json, want) in cases {
            assert_eq!(req(json), Line::Request(want.clone()), "{json}");
            assert_eq!(want.seq(), serde_json::from_str::<serde_json::Value>(json).unwrap()["seq"]);
        }
    }

    #[test]
    fn the_device_model_requests_become_the_words_of_the_host_answer() {
        let cases: &[(Request, Option<&[&str]>)] = &[
            (Request::Deadline { seq: 1, step: "s".into(), secs: 1 }, None),
            (Request::DeadlineEnd { seq: 1, step: "s".into() }, None),
            (
                Request::Fault { seq: 1, hfi: "hfi1-wfr".into(), spec: "cable-delay,ms=5".into() },
                Some(&["fault", "hfi1-wfr", "cable-delay,ms=5"]),
            ),
            (Request::FaultClear { seq: 1 }, Some(&["fault-clear"])),
            (Request::Accesses { seq: 1 }, Some(&["accesses"])),
            (Request::Counters { seq: 1, names: "a  b".into() }, Some(&["counters", "a", "b"])),
            (Request::FuzzTarget { seq: 1, target: "{}".into() }, None),
        ];
        for (r, words) in cases {
            assert_eq!(r.host_words(), words.map(|w| w.iter().map(|s| s.to_string()).collect::<Vec<_>>()), "{r:?}");
        }
    }

    #[test]
    fn a_request_that_does_not_parse_is_answered_by_its_sequence_number_when_it_has_one() {
        let cases: &[(&str, Option<u64>)] = &[
            (r#"{"seq":7,"req":"reboot"}"#, Some(7)),
            (r#"{"seq":8,"req":"deadline","step":"x"}"#, Some(8)),
            (r#"{"seq":9,"req":"deadline","step":"x","secs":"ten"}"#, Some(9)),
            (r#"{"req":"accesses"}"#, None),
            ("not json", None),
        ];
        for (json, seq) in cases {
            let Line::BadRequest { seq: got, .. } = req(json) else { panic!("{json} parsed") };
            assert_eq!(got, *seq, "{json}");
        }
    }

    #[test]
    fn console_markers_and_echoed_answers_are_told_apart_from_other_lines() {
        let cases: &[(&str, Line)] = &[
            ("RDMA-EMU-INIT uptime=1.23", Line::Init),
            ("RDMA-EMU-RESULT-END", Line::ResultEnd),
            (r#"RDMA-EMU-ACK 3 {"ok":true,"reply":""}"#, Line::EchoedAck),
            ("RDMA-EMU-RESULT-BEGIN", Line::Other),
            ("rdma-emu: [3.00] mount: ok", Line::Other),
            // The retired protocol's lines are just console output now.
            ("RDMA-EMU-DEADLINE kdriver-modprobe 120", Line::Other),
        ];
        for (line, want) in cases {
            assert_eq!(&parse(line), want, "{line}");
        }
    }

    #[test]
    fn an_answer_is_one_line_with_the_sequence_number_and_a_json_body_the_guest_can_cut() {
        let cases: &[(u64, bool, &str, &str)] = &[
            (1, true, "", "RDMA-EMU-ACK 1 {\"ok\":true,\"reply\":\"\"}\n"),
            (12, true, "100 40 7", "RDMA-EMU-ACK 12 {\"ok\":true,\"reply\":\"100 40 7\"}\n"),
            (3, false, "no \"x\"\nhere", "RDMA-EMU-ACK 3 {\"ok\":false,\"reply\":\"no \\\"x\\\" here\"}\n"),
        ];
        for (seq, ok, reply, want) in cases {
            assert_eq!(ack(*seq, *ok, reply), *want);
        }
    }

    /// qp-keeper's report as its README gives it, with the keys fuzz.sh adds.
    const KEEPER_REPORT: &str = r#"{"generation":3,"device":"hfi1_0","port":1,"lid":1,"sm_lid":1,"peer_lid":2,"mtu":4096,"pkeys":[65535],"qkey":286331153,"sl":0,"qps":[{"type":"rc","qpn":17,"psn":4096,"peer_qpn":2048,"peer_psn":4096,"sq_psn":8192}],"mr":{"addr":94000000000000,"len":65536,"rkey":5,"lkey":5},"recreated":1,"kdeth_qp":128,"peer_device":"hfi1_1","peer_device_lid":2}"#;

    #[test]
    fn a_fuzz_target_request_from_the_guests_console_line_yields_the_keepers_report_as_it_came() {
        // The line as init's host_call writes it: the report a JSON string (json_str escapes its quotes).
        let line = format!(
            r#"RDMA-EMU {{"seq":9,"req":"fuzz-target","target":{}}}"#,
            serde_json::to_string(KEEPER_REPORT).unwrap()
        );
        let Line::Request(Request::FuzzTarget { seq: 9, target }) = parse(&line) else { panic!("{line}") };
        assert_eq!(fuzz_target(&target), Ok(KEEPER_REPORT.to_string()));
    }

    #[test]
    fn a_fuzz_target_that_is_not_a_report_the_fuzzer_can_read_is_refused_with_the_reason() {
        let no_qps = KEEPER_REPORT.replace(r#""qps":"#, r#""qpz":"#);
        let qps_not_list = KEEPER_REPORT.replace(r#""recreated":1"#, r#""recreated":1,"qps":7"#).replacen(
            r#""qps":[{"type":"rc","qpn":17,"psn":4096,"peer_qpn":2048,"peer_psn":4096,"sq_psn":8192}],"#,
            "",
            1,
        );
        let cases: &[(&str, &str)] = &[
            ("{\"generation\":1,", "fuzz-target is not JSON"),
            ("[1,2]", "fuzz-target is not a JSON object"),
            (&no_qps, "fuzz-target has no \"qps\""),
            (&qps_not_list, "fuzz-target's \"qps\" is not a list"),
            (r#"{"generation":1}"#, "fuzz-target has no \"device\""),
        ];
        for (target, why) in cases {
            let err = fuzz_target(target).expect_err(target);
            assert!(err.starts_with(why), "{target}: {err}");
        }
    }

    /// A fake clock: seconds since the run started.
    #[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
    struct Secs(u64);
    impl std::ops::Add<Duration> for Secs {
        type Output = Secs;
        fn add(self, d: Duration) -> Secs {
            Secs(self.0 + d.as_secs())
        }
    }

    #[test]
    fn a_step_is_overdue_only_after_its_own_timeout_and_the_grace_and_only_until_it_ends() {
        let mut w = Watch::default();
        assert_eq!(w.overdue(Secs(1000)), None, "nothing announced");
        w.start("kdriver-modprobe", 20, Secs(100));
        assert_eq!(w.overdue(Secs(150)), None, "at its deadline (100 + 20 + 30) it is not overdue yet");
        assert_eq!(w.overdue(Secs(151)), Some("kdriver-modprobe"));
        w.end();
        assert_eq!(w.overdue(Secs(1000)), None, "ended");
        w.start("a", 10, Secs(0));
        w.start("b", 100, Secs(5));
        assert_eq!(w.overdue(Secs(100)), None, "the later announcement replaces the earlier");
        assert_eq!(w.overdue(Secs(136)), Some("b"));
    }
}
