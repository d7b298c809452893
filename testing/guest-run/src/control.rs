//! The launcher's requests of the device model's control socket (JSON lines: request `{"cmd":...}` or
//! `{"device":NAME,"cmd":...}`, reply `{"ok":true,"result":...}` or `{"ok":false,"error":"..."}`,
//! device-model/src/control.rs), and the answers to the guest's requests of the device model on the console (`console`,
//! ci/guest/init host_call).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hfi1_kernel_check::channel::{ChannelError, LineChannel};
use serde_json::{json, Value};

/// Longest reply taken: a dump of a full RcvArray is some megabytes.
const MAX_REPLY: usize = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("connect to the device model's control socket {path}: {source}")]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("control socket, {request}: {source}")]
    Channel { request: String, source: ChannelError },
    #[error("control socket: {error}")]
    Refused { error: String },
    #[error("the device model's reply has no result: {reply}")]
    BadReply { reply: String },
    #[error("no counter {0}")]
    NoCounter(String),
    #[error("the device model's {what} reply has no {field}: {reply}")]
    MissingField { what: &'static str, field: &'static str, reply: String },
}

pub type Result<T> = std::result::Result<T, ControlError>;

pub struct Control {
    chan: LineChannel<UnixStream>,
    timeout: Duration,
}

impl Control {
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self> {
        let stream =
            UnixStream::connect(path).map_err(|source| ControlError::Connect { path: path.to_path_buf(), source })?;
        let chan = LineChannel::new(stream)
            .map_err(|source| ControlError::Channel { request: "connect".into(), source })?
            .with_max_line(MAX_REPLY);
        Ok(Self { chan, timeout })
    }

    /// The whole reply to `request`, whether it is ok or not.
    pub fn exchange(&mut self, request: &Value) -> Result<Value> {
        let channel = |source| ControlError::Channel { request: request.to_string(), source };
        self.chan.send(request, self.timeout).map_err(channel)?;
        self.chan.recv("the control socket's reply", self.timeout).map_err(channel)
    }

    /// The reply's `result`, or its error.
    pub fn request(&mut self, request: &Value) -> Result<Value> {
        let reply = self.exchange(request)?;
        match reply.get("ok").and_then(Value::as_bool) {
            Some(true) => {
                reply.get("result").cloned().ok_or_else(|| ControlError::BadReply { reply: reply.to_string() })
            }
            Some(false) => Err(ControlError::Refused {
                error: reply.get("error").map_or("None".into(), |e| crate::pyfmt::str_of(Some(e))),
            }),
            None => Err(ControlError::BadReply { reply: reply.to_string() }),
        }
    }

    pub fn query(&mut self, device: &str, cmd: &str) -> Result<Value> {
        self.request(&json!({"device": device, "cmd": cmd}))
    }
}

fn u64_at(v: &Value, path: &[&str], what: &'static str, field: &'static str) -> Result<u64> {
    path.iter().try_fold(v, |v, k| v.get(k)).and_then(Value::as_u64).ok_or_else(|| ControlError::MissingField {
        what,
        field,
        reply: v.to_string(),
    })
}

/// Trapped CSR reads, writes and accesses to unnamed offsets of the chip-personality HFIs together so far.
pub fn access_totals(ctl: &mut Control, chips: &[String]) -> Result<[u64; 3]> {
    let mut totals = [0u64; 3];
    for chip in chips {
        let a = ctl.query(chip, "accesses")?;
        for (t, field) in totals.iter_mut().zip(["reads", "writes", "unnamed"]) {
            *t += u64_at(&a, &[field], "accesses", field)?;
        }
    }
    Ok(totals)
}

fn is_chip_name(name: &str) -> bool {
    name == "hfi1-wfr" || name == "hfi1-wfr1"
}

/// The answer line to one request of the guest's fabric run (`fault HFI SPEC`, `fault-clear`, `accesses`,
/// `counters NAME...`): `ok ...` or `error ...`, never more than one line.
pub fn host_answer(socket: &Path, chips: &[String], words: &[String]) -> String {
    let answer = match words.split_first() {
        None => Err("unknown request ".to_string()),
        Some((verb, args)) => answer(socket, chips, verb, args),
    };
    match answer {
        Ok(a) => format!("ok {a}"),
        Err(e) => format!("error {}", e.replace('\n', " ")),
    }
}

fn answer(socket: &Path, chips: &[String], verb: &str, args: &[String]) -> std::result::Result<String, String> {
    let connect = || Control::connect(socket, Duration::from_secs(5)).map_err(|e| e.to_string());
    match verb {
        "fault" => {
            let [chip, spec] = args else {
                return Err("fault takes an HFI (hfi1-wfr, hfi1-wfr1) and a spec".into());
            };
            if !is_chip_name(chip) {
                return Err("fault takes an HFI (hfi1-wfr, hfi1-wfr1) and a spec".into());
            }
            let added =
                connect()?.request(&json!({"device": chip, "cmd": "fault", "add": spec})).map_err(|e| e.to_string())?;
            Ok(added.get("id").map_or(String::new(), |id| {
                if id.is_null() {
                    String::new()
                } else {
                    crate::pyfmt::str_of(Some(id))
                }
            }))
        }
        "fault-clear" => {
            let mut ctl = connect()?;
            let mut fired = 0u64;
            for chip in chips {
                let listed = ctl.query(chip, "fault").map_err(|_| format!("cannot list {chip}'s faults"))?;
                let faults =
                    listed.get("faults").and_then(Value::as_array).ok_or(format!("cannot list {chip}'s faults"))?;
                fired += faults.iter().map(|f| f.get("fired").and_then(Value::as_u64).unwrap_or(0)).sum::<u64>();
                ctl.request(&json!({"device": chip, "cmd": "fault", "clear": true}))
                    .map_err(|_| format!("cannot clear {chip}'s faults"))?;
            }
            Ok(fired.to_string())
        }
        "accesses" => {
            let no_answer = |_| "the device model did not answer".to_string();
            let mut ctl = connect().map_err(no_answer)?;
            let [r, w, _] = access_totals(&mut ctl, chips).map_err(|e| no_answer(e.to_string()))?;
            let link = ctl.query("hfi1-wfr", "link").map_err(|e| no_answer(e.to_string()))?;
            let packets = u64_at(&link, &["cable", "to_a", "packets"], "link", "cable.to_a.packets")
                .and_then(|a| Ok(a + u64_at(&link, &["cable", "to_b", "packets"], "link", "cable.to_b.packets")?))
                .map_err(|e| no_answer(e.to_string()))?;
            Ok(format!("{r} {w} {packets}"))
        }
        "counters" => {
            // The named counters of the device model, each summed over the chip HFIs, in the order asked.
            let named = !args.is_empty()
                && args.iter().all(|a| {
                    !a.is_empty() && a.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                });
            if !named {
                return Err("counters takes counter names".into());
            }
            let mut ctl = connect()?;
            let mut sums = vec![0i64; args.len()];
            for chip in chips {
                let got = ctl.query(chip, "counters").map_err(|e| e.to_string())?;
                for (sum, name) in sums.iter_mut().zip(args) {
                    let v = got.get(name).ok_or_else(|| ControlError::NoCounter(name.clone()).to_string())?;
                    *sum += v.as_i64().ok_or_else(|| format!("counter {name} is {v}, not a count"))?;
                }
            }
            Ok(sums.iter().map(i64::to_string).collect::<Vec<_>>().join(" "))
        }
        other => Err(format!("unknown request {other}")),
    }
}

/// The device model's state at the end of a run, for the logs: its device list and, per device, `pci` and
/// `dump` (and the chip personality's `accesses` and `link`). Each reply is kept whole, errors included.
pub fn device_state(ctl: &mut Control) -> Result<Value> {
    let list = ctl.exchange(&json!({"cmd": "list"}))?;
    let mut state = serde_json::Map::new();
    let names: Vec<String> = list
        .get("result")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|d| d.get("name").and_then(Value::as_str).map(String::from))
        .collect();
    state.insert("list".into(), list);
    for name in names {
        let mut dev = serde_json::Map::new();
        let mut cmds = vec!["pci", "dump"];
        if name.starts_with("hfi1-wfr") {
            cmds.extend(["accesses", "link"]);
        }
        for cmd in cmds {
            dev.insert(cmd.into(), ctl.exchange(&json!({"device": name, "cmd": cmd}))?);
        }
        state.insert(name, Value::Object(dev));
    }
    Ok(Value::Object(state))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;

    /// A device model's control socket that answers each request line from `reply`, until the client leaves.
    fn fake_device_model(reply: fn(&Value) -> Value) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let mut out = conn.try_clone().unwrap();
                for line in BufReader::new(conn).lines() {
                    let Ok(line) = line else { break };
                    let req: Value = serde_json::from_str(&line).unwrap();
                    writeln!(out, "{}", reply(&req)).unwrap();
                }
            }
        });
        (dir, path)
    }

    /// Two chip HFIs: hfi1-wfr with one fault that fired 3 times, hfi1-wfr1 with one that fired twice; counters
    /// and access totals per HFI; the cable's packet counts; fault specs with "bad" refused.
    fn two_hfis(req: &Value) -> Value {
        let dev = req["device"].as_str().unwrap_or("");
        let first = dev == "hfi1-wfr";
        match (req["cmd"].as_str().unwrap_or(""), req.get("add"), req.get("clear")) {
            ("fault", Some(spec), _) if spec.as_str().unwrap_or("").contains("bad") => {
                json!({"ok": false, "error": "fault spec: unknown kind bad"})
            }
            ("fault", Some(_), _) => json!({"ok": true, "result": {"id": 7}}),
            ("fault", None, Some(_)) => json!({"ok": true, "result": {"cleared": 1}}),
            ("fault", None, None) => json!({"ok": true, "result": {"faults": [{"fired": if first { 3 } else { 2 }}]}}),
            ("accesses", ..) => {
                json!({"ok": true, "result": {"reads": 10, "writes": if first { 4 } else { 1 }, "unnamed": 0}})
            }
            ("link", ..) => json!({"ok": true, "result": {"cable": {"to_a": {"packets": 5}, "to_b": {"packets": 6}}}}),
            ("counters", ..) => {
                json!({"ok": true, "result": {"rx_packets": if first { 100 } else { 1 }, "tx_packets": 9}})
            }
            _ => json!({"ok": false, "error": "unknown command"}),
        }
    }

    #[test]
    fn the_guests_fabric_requests_get_these_answer_lines() {
        let (_dir, sock) = fake_device_model(two_hfis);
        let chips = vec!["hfi1-wfr".to_string(), "hfi1-wfr1".to_string()];
        let cases: &[(&[&str], &str)] = &[
            (&["fault", "hfi1-wfr1", "cable-drop,nth=20"], "ok 7"),
            (&["fault", "hfi1-wfr1", "bad"], "error control socket: fault spec: unknown kind bad"),
            (&["fault", "irdma", "cable-drop"], "error fault takes an HFI (hfi1-wfr, hfi1-wfr1) and a spec"),
            (&["fault", "hfi1-wfr"], "error fault takes an HFI (hfi1-wfr, hfi1-wfr1) and a spec"),
            (&["fault-clear"], "ok 5"),
            (&["accesses"], "ok 20 5 11"),
            (&["counters", "tx_packets", "rx_packets"], "ok 18 101"),
            (&["counters", "nope"], "error no counter nope"),
            (&["counters", "Bad-Name"], "error counters takes counter names"),
            (&["reboot"], "error unknown request reboot"),
        ];
        for (words, want) in cases {
            let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
            assert_eq!(host_answer(&sock, &chips, &words), *want, "{words:?}");
        }
    }

    #[test]
    fn a_device_model_that_is_not_there_gets_an_error_line_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let answer = host_answer(&dir.path().join("none.sock"), &[], &["accesses".to_string()]);
        assert!(answer.starts_with("error the device model did not answer"), "{answer}");
    }
}
