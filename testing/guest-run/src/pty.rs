//! `guest-run pty-drive`: runs a command on a pseudo-terminal (its controlling terminal, through util-linux's
//! `setsid --ctty`) and drives it through a dialog, as a user at a terminal would: wait for text, type keys.
//!
//! The dialog file has one step a line (`#` starts a comment; `\t`, `\r`, `\\` and `\xNN` are decoded):
//!
//! - `expect SECS NAME :: A ... B`: the output after this step's start shows A, then B (in that order) within
//!   SECS seconds; reported as a check named NAME.
//! - `wait SECS :: A`: the same, not reported.
//! - `send TEXT`: types TEXT.
//! - `pause SECS`: lets the command act on what was typed before (a key typed too early only edits the line).
//! - `absent NAME :: A`: the whole transcript does not show A; reported.
//!
//! The dialog stops at the first failed step. Then the command must end by itself within `--end-secs` (the
//! terminal reads EOF), or it is sent SIGTERM; both are reported, and its exit status must be 0.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};

#[derive(Args, Debug)]
pub struct DriveArgs {
    /// The dialog file.
    #[arg(long)]
    pub dialog: PathBuf,
    /// Where the terminal's whole output is written.
    #[arg(long)]
    pub transcript: PathBuf,
    /// How long the command has to end by itself after the dialog.
    #[arg(long, default_value_t = 60)]
    pub end_secs: u64,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PtyError {
    #[error("dialog {path}: {source}")]
    Dialog { path: PathBuf, source: std::io::Error },
    #[error("dialog line {line}: {why}")]
    BadStep { line: usize, why: String },
    #[error("pseudo-terminal: {0}")]
    Pty(#[from] rustix::io::Errno),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Expect { secs: u64, name: Option<String>, pieces: Vec<Vec<u8>> },
    Send(Vec<u8>),
    Pause(u64),
    Absent { name: String, text: Vec<u8> },
}

/// Decodes `\t`, `\r`, `\n`, `\\` and `\xNN`.
pub fn unescape(s: &str) -> Result<Vec<u8>, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        match b.get(i + 1) {
            Some(b't') => out.push(b'\t'),
            Some(b'r') => out.push(b'\r'),
            Some(b'n') => out.push(b'\n'),
            Some(b'\\') => out.push(b'\\'),
            Some(b'x') => {
                let hex = s.get(i + 2..i + 4).ok_or(format!("short \\x escape in {s:?}"))?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("bad \\x escape in {s:?}"))?);
                i += 2;
            }
            _ => return Err(format!("unknown escape in {s:?}")),
        }
        i += 2;
    }
    Ok(out)
}

/// The dialog's steps.
pub fn parse_dialog(text: &str) -> Result<Vec<Step>, (usize, String)> {
    let mut steps = vec![];
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| (n + 1, why.to_string());
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let (head, tail) = match rest.split_once(" :: ") {
            Some((h, t)) => (h, Some(t)),
            None => (rest, None),
        };
        let secs = |w: &str| w.parse::<u64>().map_err(|_| bad("SECS must be a number"));
        let step = match word {
            "expect" | "wait" => {
                let tail = tail.ok_or_else(|| bad("no ' :: ' before the text"))?;
                let (s, name) = head.split_once(' ').unwrap_or((head, ""));
                let pieces = tail.split(" ... ").map(unescape).collect::<Result<Vec<_>, _>>().map_err(|e| bad(&e))?;
                let name = (word == "expect").then(|| name.to_string());
                if name.as_deref() == Some("") {
                    return Err(bad("expect needs a name"));
                }
                Step::Expect { secs: secs(s)?, name, pieces }
            }
            "send" => Step::Send(unescape(rest).map_err(|e| bad(&e))?),
            "pause" => Step::Pause(secs(rest)?),
            "absent" => Step::Absent {
                name: head.to_string(),
                text: unescape(tail.ok_or_else(|| bad("no ' :: ' before the text"))?).map_err(|e| bad(&e))?,
            },
            _ => return Err(bad("unknown step")),
        };
        steps.push(step);
    }
    Ok(steps)
}

/// Whether `pieces` occur in `hay` in order.
pub fn shows_in_order(hay: &[u8], pieces: &[Vec<u8>]) -> bool {
    let mut at = 0;
    for p in pieces {
        match hay[at..].windows(p.len().max(1)).position(|w| w == p.as_slice()) {
            Some(i) => at += i + p.len(),
            None => return p.is_empty(),
        }
    }
    true
}

fn report(name: &str, ok: bool) -> bool {
    println!("{} {name}", if ok { "  ok  " } else { "  FAIL" });
    ok
}

struct Term {
    master: std::fs::File,
    out: Vec<u8>,
    eof: bool,
}

impl Term {
    /// Reads for at most `limit`, until `done` holds of the output read since `from`.
    fn read_until(&mut self, from: usize, limit: Duration, done: impl Fn(&[u8]) -> bool) -> bool {
        let until = Instant::now() + limit;
        loop {
            if done(&self.out[from.min(self.out.len())..]) {
                return true;
            }
            let now = Instant::now();
            if self.eof || now >= until {
                return false;
            }
            let left = (until - now).min(Duration::from_secs(1));
            let ts = Timespec { tv_sec: left.as_secs() as i64, tv_nsec: i64::from(left.subsec_nanos()) };
            let mut fds = [PollFd::new(&self.master, PollFlags::IN)];
            if poll(&mut fds, Some(&ts)).unwrap_or(0) == 0 {
                continue;
            }
            let mut buf = [0u8; 4096];
            match self.master.read(&mut buf) {
                // EIO once every slave end is closed: the command is gone.
                Ok(0) | Err(_) => self.eof = true,
                Ok(n) => self.out.extend_from_slice(&buf[..n]),
            }
        }
    }
}

/// Runs the dialog; whether every check held.
pub fn drive(args: &DriveArgs) -> Result<bool, PtyError> {
    let text = std::fs::read_to_string(&args.dialog)
        .map_err(|source| PtyError::Dialog { path: args.dialog.clone(), source })?;
    let steps = parse_dialog(&text).map_err(|(line, why)| PtyError::BadStep { line, why })?;
    let master: OwnedFd = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let slave_path = ptsname(&master, Vec::new())?;
    let io = |what: &str| {
        let what = what.to_string();
        move |source| PtyError::Io { what: what.clone(), source }
    };
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(std::ffi::OsStr::from_bytes(slave_path.as_bytes()))
        .map_err(io("open the terminal's slave end"))?;
    let stdio = |f: &std::fs::File| f.try_clone().map(Stdio::from);
    let mut child = Command::new("setsid")
        .arg("--ctty")
        .args(&args.command)
        .stdin(stdio(&slave).map_err(io("dup"))?)
        .stdout(stdio(&slave).map_err(io("dup"))?)
        .stderr(stdio(&slave).map_err(io("dup"))?)
        .spawn()
        .map_err(io("start setsid --ctty"))?;
    drop(slave);
    let mut term = Term { master: std::fs::File::from(master), out: vec![], eof: false };
    let mut good = true;
    for step in &steps {
        match step {
            Step::Expect { secs, name, pieces } => {
                let from = term.out.len();
                let ok = term.read_until(from, Duration::from_secs(*secs), |o| shows_in_order(o, pieces));
                good = match name {
                    Some(n) => report(n, ok),
                    None => ok,
                };
            }
            Step::Send(bytes) => {
                good = std::io::Write::write_all(&mut term.master, bytes).is_ok();
            }
            Step::Pause(secs) => {
                let from = term.out.len();
                term.read_until(from, Duration::from_secs(*secs), |_| false);
            }
            Step::Absent { name, text } => {
                good = report(name, !shows_in_order(&term.out, std::slice::from_ref(text)));
            }
        }
        if !good {
            break;
        }
    }
    let from = term.out.len();
    term.read_until(from, Duration::from_secs(args.end_secs), |_| false);
    let ended = term.eof;
    if !ended {
        crate::dm::terminate(child.id());
        // One that ignores SIGTERM too (an interactive shell does) is killed.
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until && matches!(child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
    }
    let status = child.wait().map_err(io("wait for the command"))?;
    std::fs::write(&args.transcript, &term.out).map_err(io("write the transcript"))?;
    good = report("the command ends by itself", ended) && good;
    Ok(report("the command exits 0", good && status.success()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dialog_reads_as_expectations_keys_pauses_and_absences() {
        let text = "# a comment\n\
                    expect 600 the shell is ready :: shell ready\n\
                    wait 10 :: sleep 300; echo after-sleep\n\
                    send echo hi\\r\n\
                    send \\x03\n\
                    pause 1\n\
                    expect 120 ibv_devinfo answers :: hca_id:\\thfi1_0 ... rdma-emu:/#\n\
                    absent Ctrl-C stopped the command :: after-sleep\\r\\n\n";
        let got = parse_dialog(text).unwrap();
        assert_eq!(
            got,
            [
                Step::Expect {
                    secs: 600,
                    name: Some("the shell is ready".into()),
                    pieces: vec![b"shell ready".to_vec()]
                },
                Step::Expect { secs: 10, name: None, pieces: vec![b"sleep 300; echo after-sleep".to_vec()] },
                Step::Send(b"echo hi\r".to_vec()),
                Step::Send(vec![3]),
                Step::Pause(1),
                Step::Expect {
                    secs: 120,
                    name: Some("ibv_devinfo answers".into()),
                    pieces: vec![b"hca_id:\thfi1_0".to_vec(), b"rdma-emu:/#".to_vec()],
                },
                Step::Absent { name: "Ctrl-C stopped the command".into(), text: b"after-sleep\r\n".to_vec() },
            ]
        );
    }

    #[test]
    fn a_malformed_dialog_line_is_refused_with_its_number() {
        let cases: &[(&str, usize)] = &[
            ("expect x name :: a", 1),
            ("send ok\nexpect 5 :: a", 2),
            ("expect 5 name", 1),
            ("send \\q", 1),
            ("type a", 1),
        ];
        for (text, line) in cases {
            assert_eq!(parse_dialog(text).map_err(|(l, _)| l), Err(*line), "{text}");
        }
    }

    #[test]
    fn expected_pieces_must_show_in_their_order() {
        let cases: &[(&str, &[&str], bool)] = &[
            ("hca_id:\thfi1_0\nrdma-emu:/# ", &["hca_id:\thfi1_0", "rdma-emu:/#"], true),
            ("rdma-emu:/# hca_id:\thfi1_0", &["hca_id:\thfi1_0", "rdma-emu:/#"], false),
            ("alive-42", &["alive-42", "rdma-emu:/#"], false),
            ("anything", &[], true),
        ];
        for (hay, pieces, want) in cases {
            let pieces: Vec<Vec<u8>> = pieces.iter().map(|p| p.as_bytes().to_vec()).collect();
            assert_eq!(shows_in_order(hay.as_bytes(), &pieces), *want, "{hay:?} {pieces:?}");
        }
    }
}
