//! Call sites to function and file:line, with binutils' addr2line on the module built with debug info
//! (ci/build-hfi1-module.sh's KO=): it applies the relocations a .ko's DWARF needs, section by section (-j).

use crate::elf::Module;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
pub enum SymbolizeError {
    #[error("running {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("{program} -j {section} failed: {stderr}")]
    Failed { program: String, section: String, stderr: String },
    #[error("{program} -j {section}: {count} addresses in, {answers} answers out")]
    Answers { program: String, section: String, count: usize, answers: usize },
}

/// Where a call site is: the innermost (possibly inlined) frame's function and line, and the function whose
/// body holds the code.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Site {
    pub offset: u32,
    pub function: String,
    /// The source file's name as the compiler recorded it, the build directory stripped.
    pub file: String,
    pub line: u32,
    /// The function the site's code was inlined into, when it was.
    pub inlined_into: Option<String>,
}

pub struct Symbolizer {
    ko: PathBuf,
    program: String,
}

impl Symbolizer {
    pub fn new(ko: &Path, program: Option<&str>) -> Symbolizer {
        Symbolizer { ko: ko.into(), program: program.unwrap_or("addr2line").to_string() }
    }

    /// Symbolises text offsets as the hook records them (return addresses: the call is the byte before).
    /// Offsets outside MOD_TEXT's sections are left out.
    pub fn symbolize(&self, module: &Module, offsets: &[u32]) -> Result<Vec<Site>, SymbolizeError> {
        let layout = module.text_layout();
        let mut by_section: BTreeMap<&str, Vec<(u32, u64)>> = BTreeMap::new();
        for &off in offsets {
            if let Some((p, inner)) = Module::locate(&layout, u64::from(off).wrapping_sub(1)) {
                by_section.entry(p.name.as_str()).or_default().push((off, inner));
            }
        }
        let mut sites = Vec::with_capacity(offsets.len());
        for (section, addrs) in by_section {
            sites.extend(self.run(section, &addrs)?);
        }
        sites.sort_by_key(|s| s.offset);
        Ok(sites)
    }

    fn run(&self, section: &str, addrs: &[(u32, u64)]) -> Result<Vec<Site>, SymbolizeError> {
        let spawn_err = |source| SymbolizeError::Spawn { program: self.program.clone(), source };
        let mut child = Command::new(&self.program)
            .arg("-e")
            .arg(&self.ko)
            .args(["-j", section, "-a", "-f", "-i"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_err)?;
        let input: String = addrs.iter().map(|(_, a)| format!("{a:#x}\n")).collect();
        let mut stdin = child.stdin.take().expect("piped stdin");
        // A writer thread: addr2line answers as it reads, so a large batch would fill both pipes.
        let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let out = child.wait_with_output().map_err(spawn_err)?;
        writer.join().expect("the writer thread does not panic").map_err(spawn_err)?;
        if !out.status.success() {
            return Err(SymbolizeError::Failed {
                program: self.program.clone(),
                section: section.into(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        let answers = parse_answers(&String::from_utf8_lossy(&out.stdout));
        if answers.len() != addrs.len() {
            return Err(SymbolizeError::Answers {
                program: self.program.clone(),
                section: section.into(),
                count: addrs.len(),
                answers: answers.len(),
            });
        }
        Ok(addrs
            .iter()
            .zip(answers)
            .map(|(&(offset, _), frames)| {
                let (function, file, line) = frames.first().cloned().unwrap_or_default();
                let outer = frames.last().map(|f| f.0.clone()).filter(|_| frames.len() > 1);
                Site { offset, function, file, line, inlined_into: outer }
            })
            .collect())
    }
}

/// addr2line -a -f -i output: per address a "0x…" line, then (function, file:line) pairs from the innermost
/// inlined frame outwards. Unknowns ("??", "??:0") stay as they are, line 0.
fn parse_answers(out: &str) -> Vec<Vec<(String, String, u32)>> {
    let mut answers: Vec<Vec<(String, String, u32)>> = Vec::new();
    let mut lines = out.lines();
    while let Some(l) = lines.next() {
        if l.starts_with("0x") {
            answers.push(Vec::new());
            continue;
        }
        let Some(frames) = answers.last_mut() else { continue };
        let loc = lines.next().unwrap_or("??:0");
        // "path/file.c:123" or "path/file.c:123 (discriminator 4)".
        let loc = loc.split(" (").next().unwrap_or(loc);
        let (path, line) = loc.rsplit_once(':').unwrap_or((loc, "0"));
        let file = path.rsplit('/').next().unwrap_or(path).to_string();
        frames.push((l.to_string(), file, line.parse().unwrap_or(0)));
    }
    answers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addr2line_inline_chains_give_the_innermost_line_and_the_outer_function() {
        let out = "0x0000000000000010\nhfi1_rcv_hdrtail\n/b/src/drivers/infiniband/hw/hfi1/hfi.h:1530\n\
                   handle_receive_interrupt\n/b/src/drivers/infiniband/hw/hfi1/driver.c:1010 (discriminator 2)\n\
                   0x0000000000000020\n??\n??:0\n";
        let got = parse_answers(out);
        assert_eq!(
            got,
            vec![
                vec![
                    ("hfi1_rcv_hdrtail".to_string(), "hfi.h".to_string(), 1530),
                    ("handle_receive_interrupt".to_string(), "driver.c".to_string(), 1010),
                ],
                vec![("??".to_string(), "??".to_string(), 0)],
            ]
        );
    }
}
