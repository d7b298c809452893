//! A QMP client over QEMU's monitor socket (`-qmp unix:PATH,server=on`): the greeting, `qmp_capabilities`,
//! commands, and waiting for an event with a deadline (QEMU's docs/interop/qmp-spec.rst: the server speaks
//! first with `{"QMP": ...}`, answers each command with `{"return": ...}` or `{"error": ...}`, and may send
//! `{"event": ...}` at any time, between a command and its answer too).

use std::collections::VecDeque;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hfi1_kernel_check::channel::{ChannelError, LineChannel};
use serde_json::{json, Value};

/// Events kept while a command waits for its answer, for a later `wait_event`; older ones are dropped.
const MAX_PENDING_EVENTS: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("connect to QEMU's monitor {path}: {source}")]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("QMP, {what}: {source}")]
    Channel { what: String, source: ChannelError },
    #[error("QMP: the server's first message is not a greeting: {0}")]
    NoGreeting(String),
    #[error("QMP {command}: {error}")]
    Command { command: String, error: String },
    #[error("no QMP event {event} within {after:?}")]
    NoEvent { event: String, after: Duration },
}

pub type Result<T> = std::result::Result<T, QmpError>;

pub struct Qmp<S> {
    chan: LineChannel<S>,
    timeout: Duration,
    events: VecDeque<Value>,
}

impl Qmp<UnixStream> {
    /// Connects, reads the greeting and leaves capabilities negotiation mode.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self> {
        let stream =
            UnixStream::connect(path).map_err(|source| QmpError::Connect { path: path.to_path_buf(), source })?;
        Self::over(stream, timeout)
    }
}

impl<S: std::io::Read + std::io::Write + std::os::fd::AsFd> Qmp<S> {
    /// The client on an open stream: reads the greeting and sends `qmp_capabilities`. Every read and write
    /// waits at most `timeout`.
    pub fn over(stream: S, timeout: Duration) -> Result<Self> {
        let chan = LineChannel::new(stream).map_err(|source| QmpError::Channel { what: "connect".into(), source })?;
        let mut qmp = Self { chan, timeout, events: VecDeque::new() };
        let greeting = qmp.read("the greeting", timeout)?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::NoGreeting(greeting.to_string()));
        }
        qmp.execute(&json!({"execute": "qmp_capabilities"}))?;
        Ok(qmp)
    }

    fn read(&mut self, what: &str, timeout: Duration) -> Result<Value> {
        self.chan.recv(what, timeout).map_err(|source| QmpError::Channel { what: what.to_string(), source })
    }

    /// Sends `command` (`{"execute": NAME, ...}`) and returns its `return` value; events that arrive meanwhile
    /// are kept for `wait_event`.
    pub fn execute(&mut self, command: &Value) -> Result<Value> {
        let name = command.get("execute").and_then(Value::as_str).unwrap_or("?").to_string();
        let what = format!("the answer to {name}");
        self.chan.send(command, self.timeout).map_err(|source| QmpError::Channel { what: what.clone(), source })?;
        loop {
            let mut m = self.read(&what, self.timeout)?;
            if let Some(r) = m.get_mut("return") {
                return Ok(r.take());
            }
            if let Some(e) = m.get("error") {
                let error = match (e.get("class").and_then(Value::as_str), e.get("desc").and_then(Value::as_str)) {
                    (Some(class), Some(desc)) => format!("{class}: {desc}"),
                    _ => e.to_string(),
                };
                return Err(QmpError::Command { command: name, error });
            }
            if m.get("event").is_some() {
                if self.events.len() == MAX_PENDING_EVENTS {
                    self.events.pop_front();
                }
                self.events.push_back(m);
            }
        }
    }

    /// Waits at most `within` for the event `name` (one that already came while a command waited counts);
    /// returns it.
    pub fn wait_event(&mut self, name: &str, within: Duration) -> Result<Value> {
        let is_it = |m: &Value| m.get("event").and_then(Value::as_str) == Some(name);
        if let Some(i) = self.events.iter().position(is_it) {
            return Ok(self.events.remove(i).unwrap_or_default());
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(QmpError::NoEvent { event: name.to_string(), after: within });
            }
            let m = match self.chan.recv::<Value>(&format!("the event {name}"), left) {
                Ok(m) => m,
                Err(ChannelError::Timeout { .. }) => {
                    return Err(QmpError::NoEvent { event: name.to_string(), after: within })
                }
                Err(source) => return Err(QmpError::Channel { what: format!("the event {name}"), source }),
            };
            if is_it(&m) {
                return Ok(m);
            }
        }
    }
}

/// One step of `guest-run qmp`: a command as JSON, or `wait:EVENT`.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Execute(Value),
    Wait(String),
}

impl std::str::FromStr for Step {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if let Some(event) = s.strip_prefix("wait:") {
            return Ok(Step::Wait(event.to_string()));
        }
        let v: Value = serde_json::from_str(s).map_err(|e| format!("{s:?} is neither JSON nor wait:EVENT: {e}"))?;
        if v.get("execute").and_then(Value::as_str).is_none() {
            return Err(format!("{s} has no \"execute\""));
        }
        Ok(Step::Execute(v))
    }
}

/// Runs the steps in order on one connection; the first failure ends it.
pub fn run_steps<S: std::io::Read + std::io::Write + std::os::fd::AsFd>(
    qmp: &mut Qmp<S>,
    steps: &[Step],
    event_within: Duration,
) -> Result<()> {
    for step in steps {
        match step {
            Step::Execute(cmd) => qmp.execute(cmd).map(drop)?,
            Step::Wait(event) => qmp.wait_event(event, event_within).map(drop)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};

    const GREETING: &str =
        r#"{"QMP": {"version": {"qemu": {"micro": 0, "minor": 1, "major": 10}}, "capabilities": []}}"#;

    /// A fake QEMU monitor: sends `greeting`, then for each line the client sends, the scripted lines of the
    /// next answer. Returns the commands it received.
    fn fake_qemu(
        greeting: &'static str,
        answers: Vec<Vec<&'static str>>,
    ) -> (UnixStream, std::thread::JoinHandle<Vec<Value>>) {
        let (client, server) = UnixStream::pair().expect("socketpair");
        let peer = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut w = server.try_clone().expect("clone");
            writeln!(w, "{greeting}").expect("greeting");
            let mut r = BufReader::new(server);
            for answer in answers {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                got.push(serde_json::from_str(&line).expect("the client sends JSON"));
                for a in answer {
                    writeln!(w, "{a}").expect("answer");
                }
            }
            got
        });
        (client, peer)
    }

    const T: Duration = Duration::from_secs(10);

    #[test]
    fn the_client_negotiates_capabilities_before_its_first_command() {
        let (s, peer) =
            fake_qemu(GREETING, vec![vec![r#"{"return": {}}"#], vec![r#"{"return": {"status": "running"}}"#]]);
        let mut q = Qmp::over(s, T).expect("handshake");
        let r = q.execute(&json!({"execute": "query-status"})).expect("query-status");
        assert_eq!(r, json!({"status": "running"}));
        drop(q);
        let got = peer.join().expect("peer");
        assert_eq!(got, [json!({"execute": "qmp_capabilities"}), json!({"execute": "query-status"})]);
    }

    #[test]
    fn a_first_message_that_is_not_a_greeting_is_refused() {
        let (s, _peer) = fake_qemu(r#"{"return": {}}"#, vec![]);
        assert!(matches!(Qmp::over(s, T), Err(QmpError::NoGreeting(_))));
    }

    #[test]
    fn an_error_answer_fails_the_command_with_its_class_and_description() {
        let (s, _peer) = fake_qemu(
            GREETING,
            vec![
                vec![r#"{"return": {}}"#],
                vec![r#"{"error": {"class": "DeviceNotFound", "desc": "Device 'hfi1' not found"}}"#],
            ],
        );
        let mut q = Qmp::over(s, T).expect("handshake");
        match q.execute(&json!({"execute": "device_del", "arguments": {"id": "hfi1"}})) {
            Err(QmpError::Command { command, error }) => {
                assert_eq!(command, "device_del");
                assert_eq!(error, "DeviceNotFound: Device 'hfi1' not found");
            }
            other => panic!("expected a command error, got {other:?}"),
        }
    }

    #[test]
    fn an_event_that_arrives_before_the_answer_still_ends_a_later_wait() {
        let (s, _peer) = fake_qemu(
            GREETING,
            vec![
                vec![r#"{"return": {}}"#],
                vec![
                    r#"{"event": "DEVICE_DELETED", "data": {"device": "hfi1"}, "timestamp": {"seconds": 1, "microseconds": 2}}"#,
                    r#"{"return": {}}"#,
                ],
            ],
        );
        let mut q = Qmp::over(s, T).expect("handshake");
        q.execute(&json!({"execute": "device_del", "arguments": {"id": "hfi1"}})).expect("device_del");
        let e = q.wait_event("DEVICE_DELETED", T).expect("the event");
        assert_eq!(e["data"]["device"], "hfi1");
    }

    #[test]
    fn a_wait_skips_other_events_and_ends_at_the_named_one() {
        let (s, _peer) = fake_qemu(
            GREETING,
            vec![
                vec![r#"{"return": {}}"#],
                vec![
                    r#"{"return": {}}"#,
                    r#"{"event": "RESET", "data": {}}"#,
                    r#"{"event": "SHUTDOWN", "data": {"guest": true}}"#,
                ],
            ],
        );
        let mut q = Qmp::over(s, T).expect("handshake");
        q.execute(&json!({"execute": "system_reset"})).expect("system_reset");
        let e = q.wait_event("SHUTDOWN", T).expect("SHUTDOWN");
        assert_eq!(e["data"]["guest"], true);
    }

    #[test]
    fn a_wait_for_an_event_that_never_comes_ends_at_its_deadline() {
        // The peer stays connected and silent; the deadline, not the peer, ends the wait.
        let (s, peer) = fake_qemu(GREETING, vec![vec![r#"{"return": {}}"#], vec![]]);
        let mut q = Qmp::over(s, T).expect("handshake");
        let within = Duration::from_millis(50);
        match q.wait_event("DEVICE_DELETED", within) {
            Err(QmpError::NoEvent { event, after }) => {
                assert_eq!(event, "DEVICE_DELETED");
                assert_eq!(after, within);
            }
            other => panic!("expected no event, got {other:?}"),
        }
        drop(q);
        peer.join().expect("peer");
    }

    #[test]
    fn the_steps_of_the_command_line_parse_as_commands_or_waits() {
        let cases: &[(&str, Option<Step>)] = &[
            (r#"{"execute":"quit"}"#, Some(Step::Execute(json!({"execute": "quit"})))),
            ("wait:DEVICE_DELETED", Some(Step::Wait("DEVICE_DELETED".into()))),
            (r#"{"arguments":{}}"#, None),
            ("quit", None),
        ];
        for (arg, want) in cases {
            assert_eq!(arg.parse::<Step>().ok(), *want, "{arg}");
        }
    }
}
