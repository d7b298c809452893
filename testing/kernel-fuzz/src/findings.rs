//! What a campaign found: one directory per distinct defect, with the detector's report, the batches that led
//! to it as control-socket lines (the reproducer), and the boot's logs. Nothing found is lost: a finding is
//! written before the guest is restarted, and a second hit of the same signature only counts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::oracle::{Kind, Report};

#[derive(Debug, thiserror::Error)]
pub enum FindingsError {
    #[error("write {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// How the reproducer was confirmed on a fresh boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Confirmed {
    /// Not replayed yet.
    Pending,
    /// The last batch alone, as sent, gave the same signature on a fresh boot: `repro.jsonl` is that one line.
    LastBatch,
    /// The last input, decoded against the fresh boot's fabric, did: `repro.jsonl` is the line it made.
    LastInput,
    /// The boot's last inputs together, so decoded, did: `repro.jsonl` holds the lines they made.
    History,
    /// Neither did; the lines are kept for a look by hand.
    No,
    /// Not a crash the guest survives to replay (a stall the guest never left is replayed the same way).
    NotReplayed,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub id: String,
    pub kind: Kind,
    pub signature: String,
    pub title: String,
    pub boot: u64,
    /// The campaign's exec count at the hit.
    pub exec: u64,
    pub hits: u64,
    /// Relative to the campaign's output directory.
    pub dir: String,
    pub reproducer: String,
    pub confirmed: Confirmed,
}

#[derive(Debug, Default)]
pub struct Findings {
    root: PathBuf,
    by_signature: BTreeMap<String, Finding>,
}

impl Findings {
    pub fn new(out: &Path) -> Findings {
        Findings { root: out.to_path_buf(), by_signature: BTreeMap::new() }
    }

    /// Records a report; a new signature gets its directory with `lines` as the reproducer and the boot's logs
    /// copied. Returns the finding's id and whether it is new.
    pub fn record(
        &mut self,
        report: &Report,
        boot: u64,
        exec: u64,
        lines: &[String],
        inputs: &[Vec<u8>],
        boot_logs: &Path,
    ) -> Result<(String, bool), FindingsError> {
        let sig = report.signature();
        if let Some(f) = self.by_signature.get_mut(&sig) {
            f.hits += 1;
            return Ok((f.id.clone(), false));
        }
        let id = format!("{:03}-{}", self.by_signature.len() + 1, kind_name(report.kind));
        let rel = format!("findings/{id}");
        let dir = self.root.join(&rel);
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| FindingsError::Io { path, source }
        };
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let write = |name: &str, text: String| {
            let p = dir.join(name);
            std::fs::write(&p, text).map_err(io(&p))
        };
        write("report.txt", report.text.join("\n") + "\n")?;
        write("repro.jsonl", lines.join("\n") + "\n")?;
        write("history.jsonl", lines.join("\n") + "\n")?;
        let hex: Vec<String> = inputs.iter().map(|i| i.iter().map(|b| format!("{b:02x}")).collect()).collect();
        write("history.inputs", hex.join("\n") + "\n")?;
        for log in ["serial.log", "device-model.log", "guest-run.log", "qemu-command.txt"] {
            let _ = std::fs::copy(boot_logs.join(log), dir.join(log));
        }
        let f = Finding {
            id: id.clone(),
            kind: report.kind,
            signature: sig.clone(),
            title: report.title.clone(),
            boot,
            exec,
            hits: 1,
            dir: rel.clone(),
            reproducer: format!("{rel}/repro.jsonl"),
            confirmed: if report.is_fatal() { Confirmed::Pending } else { Confirmed::NotReplayed },
        };
        self.by_signature.insert(sig, f.clone());
        self.save(&f)?;
        Ok((id, true))
    }

    /// The findings still waiting for a replay on a fresh boot.
    pub fn pending(&self) -> Vec<Finding> {
        self.by_signature.values().filter(|f| f.confirmed == Confirmed::Pending).cloned().collect()
    }

    /// Sets how a finding was confirmed; when it was, its reproducer becomes the lines the replay sent.
    pub fn confirm(&mut self, id: &str, how: Confirmed, sent: Option<&[String]>) -> Result<(), FindingsError> {
        let Some(f) = self.by_signature.values_mut().find(|f| f.id == id) else { return Ok(()) };
        f.confirmed = how;
        let f = f.clone();
        if let Some(lines) = sent {
            let p = self.root.join(&f.dir).join("repro.jsonl");
            std::fs::write(&p, lines.join("\n") + "\n")
                .map_err(|source| FindingsError::Io { path: p.display().to_string(), source })?;
        }
        self.save(&f)
    }

    /// The inputs of a finding's history (`history.inputs`, one hex line each).
    pub fn inputs(&self, f: &Finding) -> Vec<Vec<u8>> {
        self.lines(f, "history.inputs")
            .iter()
            .map(|l| {
                (0..l.len() / 2)
                    .filter_map(|i| l.get(2 * i..2 * i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
                    .collect()
            })
            .collect()
    }

    fn save(&self, f: &Finding) -> Result<(), FindingsError> {
        let p = self.root.join(&f.dir).join("finding.json");
        guest_run::write_json(&p, f).map_err(|e| FindingsError::Io {
            path: p.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        })
    }

    pub fn all(&self) -> Vec<Finding> {
        let mut v: Vec<Finding> = self.by_signature.values().cloned().collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// The reproducer lines of a finding.
    pub fn lines(&self, f: &Finding, file: &str) -> Vec<String> {
        std::fs::read_to_string(self.root.join(&f.dir).join(file))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    }
}

fn kind_name(k: Kind) -> String {
    serde_json::to_value(k).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_else(|| "report".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warn(title: &str) -> Report {
        Report { kind: Kind::Warn, title: title.into(), text: vec![title.into(), "Call Trace:".into()] }
    }

    #[test]
    fn a_new_signature_gets_a_directory_and_a_second_hit_only_counts() {
        let out = tempfile::tempdir().unwrap();
        let logs = tempfile::tempdir().unwrap();
        std::fs::write(logs.path().join("serial.log"), "console\n").unwrap();
        let mut f = Findings::new(out.path());
        let lines = vec![r#"{"device":"hfi1-wfr","cmd":"wire-batch","packets":[]}"#.to_string()];
        let inputs = vec![vec![0xF1, 0x00, 0x7F]];
        let (id, new) =
            f.record(&warn("WARNING: CPU: 0 PID: 1 at a.c:1 f+0x1/0x2"), 1, 10, &lines, &inputs, logs.path()).unwrap();
        assert!(new);
        let (id2, new2) =
            f.record(&warn("WARNING: CPU: 1 PID: 9 at a.c:1 f+0x1/0x2"), 2, 20, &lines, &inputs, logs.path()).unwrap();
        assert_eq!((id2.as_str(), new2), (id.as_str(), false));
        let all = f.all();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].hits, 2);
        let dir = out.path().join(&all[0].dir);
        for file in ["report.txt", "repro.jsonl", "finding.json", "serial.log"] {
            assert!(dir.join(file).is_file(), "{file}");
        }
        assert_eq!(f.pending().len(), 1);
        assert_eq!(f.inputs(&f.all()[0]), inputs);
        f.confirm(&id, Confirmed::LastInput, Some(&["SENT".to_string()])).unwrap();
        assert_eq!(f.lines(&f.all()[0], "repro.jsonl"), vec!["SENT".to_string()]);
        assert_eq!(f.lines(&f.all()[0], "history.jsonl"), lines);
        assert!(f.pending().is_empty());
    }
}
