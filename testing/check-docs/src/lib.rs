//! The checks of `ci/check-docs.sh`: the docs' command lines against the --help of what they run, their links
//! and anchors, and the docs index. The --help texts come through [`Helps`], so the checks can be tested
//! without running anything.

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The programs whose command lines are checked (by the file name of the word).
pub const PROGRAMS: [&str; 6] = ["device-model", "udriver", "testbed", "kernel-irdma", "hfi1-user", "hfi1-user-host"];

/// Scripts that hand the options they do not know to another: their flags may be either's.
pub const PASSES_TO: [(&str, &str); 1] = [("ci/e2e.sh", "ci/run-qemu.sh")];

/// How long a --help may take.
const HELP_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the --help texts come from: `Err` carries why there is none (reported once per command).
pub trait Helps {
    fn help(&mut self, argv: &[String]) -> Result<String, String>;
    /// Whether the script `path` (a `ci/*.sh`, relative to the repository root) exists.
    fn script_exists(&self, path: &str) -> bool;
    /// Whether `path` exists (a link's destination).
    fn exists(&self, path: &str) -> bool;
    /// The text of a Markdown page (for its headings).
    fn read(&self, path: &str) -> Option<String>;
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The --help texts of the real programs and scripts, run from the repository root.
pub struct RealHelps {
    pub bindir: PathBuf,
}

/// Runs `cmd` with no stdin; its stdout then stderr, and its exit code; `Err` after `HELP_TIMEOUT`.
fn run_with_timeout(cmd: &[String]) -> Result<(String, i32), String> {
    let shown = cmd.join(" ");
    let mut child = Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("`{shown}` printed no help (exit -1): {e}"))?;
    let reader = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = child.stdout.take().map(|s| reader(Box::new(s)));
    let err = child.stderr.take().map(|s| reader(Box::new(s)));
    let deadline = Instant::now() + HELP_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("`{shown}` did not finish in 60 s"));
            }
        }
    };
    let text = out.map(|t| t.join().unwrap_or_default()).unwrap_or_default()
        + &err.map(|t| t.join().unwrap_or_default()).unwrap_or_default();
    Ok((text, status.code().unwrap_or(-1)))
}

/// Whether a script has a --help arm: `--help)` after the start of a line, a `|`, a space or a `(`.
pub fn script_has_help(text: &str) -> bool {
    text.match_indices("--help)").any(|(i, _)| {
        let before = text[..i].chars().next_back();
        before.is_none_or(|c| c == '\n' || c == '|' || c == '(' || c.is_whitespace())
    })
}

impl Helps for RealHelps {
    fn help(&mut self, argv: &[String]) -> Result<String, String> {
        let prog = &argv[0];
        let cmd: Vec<String> = if prog.starts_with("ci/") {
            let text = std::fs::read_to_string(prog).unwrap_or_default();
            if !script_has_help(&text) {
                return Err(format!("{prog} has no --help: add one (a `-h|--help) usage 0 ;;` arm)"));
            }
            vec!["bash".into(), prog.clone(), "--help".into()]
        } else {
            let path = self.bindir.join(prog);
            let executable = std::fs::metadata(&path)
                .is_ok_and(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0 && m.is_file());
            if !executable {
                return Err(format!("no {}: build it (cargo build --bins) or run without --no-build", path.display()));
            }
            let mut c = vec![path.display().to_string()];
            c.extend(argv[1..].iter().cloned());
            c.push("--help".into());
            c
        };
        let (out, code) = run_with_timeout(&cmd)?;
        if code != 0 || out.trim().is_empty() {
            let head: String = out.trim().chars().take(200).collect();
            return Err(format!("`{}` printed no help (exit {code}): {head}", cmd.join(" ")));
        }
        Ok(out)
    }

    fn script_exists(&self, path: &str) -> bool {
        Path::new(path).exists()
    }

    fn exists(&self, path: &str) -> bool {
        Path::new(path).exists()
    }

    fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }
}

/// The names in a clap help's `Commands:` list (the lines after it that start with two spaces and a word).
pub fn subcommands(help: &str) -> BTreeSet<String> {
    let mut lines = help.split_inclusive('\n');
    let mut found = BTreeSet::new();
    while let Some(line) = lines.next() {
        if line != "Commands:\n" {
            continue;
        }
        for l in lines.by_ref() {
            let listed =
                l.ends_with('\n') && l.starts_with("  ") && l[2..].chars().next().is_some_and(|c| !c.is_whitespace());
            if !listed {
                break;
            }
            if let Some(w) = l.split_whitespace().next() {
                found.insert(w.to_string());
            }
        }
        if !found.is_empty() {
            break;
        }
    }
    found
}

/// A shell-like word, or a separator (a pipe between spaces, `;`, `&`, `>`, `<`).
#[derive(Debug, PartialEq)]
pub enum Token {
    Word { text: String, quoted: bool },
    Separator,
}

/// Shell-like words. A comment ends the line. Brackets of usage lines (`[--a | --b]`) stay, so a bar inside
/// them is no pipe.
pub fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut cur, mut quoted, mut q, mut depth) = (String::new(), false, None::<char>, 0usize);
    let flush = |out: &mut Vec<Token>, cur: &mut String, quoted: &mut bool| {
        if !cur.is_empty() || *quoted {
            out.push(Token::Word { text: std::mem::take(cur), quoted: *quoted });
        }
        *quoted = false;
    };
    for (i, &c) in chars.iter().enumerate() {
        if let Some(open) = q {
            if c == open {
                q = None;
            } else {
                cur.push(c);
            }
        } else if c == '\'' || c == '"' {
            q = Some(c);
            quoted = true;
        } else if c.is_whitespace() {
            flush(&mut out, &mut cur, &mut quoted);
        } else if c == '#' && cur.is_empty() {
            break;
        } else if ";&<>".contains(c)
            || (c == '|' && depth == 0 && cur.is_empty() && chars.get(i + 1).is_none_or(|n| n.is_whitespace()))
        {
            flush(&mut out, &mut cur, &mut quoted);
            out.push(Token::Separator);
        } else {
            if c == '[' {
                depth += 1;
            } else if c == ']' {
                depth = depth.saturating_sub(1);
            }
            cur.push(c);
        }
    }
    flush(&mut out, &mut cur, &mut quoted);
    out
}

/// The flag name of a word (`--name` or `-n`, with an optional `=value`), if it is one.
pub fn flag_name(word: &str) -> Option<&str> {
    let rest = word.strip_prefix("--").filter(|r| r.starts_with(|c: char| c.is_ascii_alphabetic()));
    let (prefix_len, rest) = match rest {
        Some(r) => (2, r),
        None => (1, word.strip_prefix('-').filter(|r| r.starts_with(|c: char| c.is_ascii_alphabetic()))?),
    };
    let end = rest.find(|c: char| !(is_word(c) || c == '-')).unwrap_or(rest.len());
    if end < rest.len() && !rest[end..].starts_with('=') {
        return None;
    }
    Some(&word[..prefix_len + end])
}

/// Whether `name` occurs in `text` as a whole flag (neither a word character nor `-` on either side).
pub fn mentions(text: &str, name: &str) -> bool {
    // Every start, overlapping ones too (a name can follow a longer flag that ends in it).
    text.char_indices().filter(|&(i, _)| text[i..].starts_with(name)).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].chars().next();
        !before.is_some_and(|c| is_word(c) || c == '-') && !after.is_some_and(|c| is_word(c) || c == '-')
    })
}

/// A `ci/NAME.sh` path at the end of a word (after its start or a `/`).
fn script_of(base: &str) -> Option<&str> {
    let stem = base.strip_suffix(".sh")?;
    let start = stem.rfind("ci/")?;
    if start > 0 && !stem[..start].ends_with('/') {
        return None;
    }
    let name = &stem[start + 3..];
    (!name.is_empty() && name.chars().all(|c| is_word(c) || c == '.' || c == '-')).then(|| &base[start..])
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

#[derive(Clone, Copy, PartialEq)]
enum Prev {
    No,
    Flag,
    Bin,
}

/// `os.path.normpath` of a relative path: `.` dropped, `..` folded, `.` for nothing.
pub fn normpath(p: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    let absolute = p.is_absolute();
    for c in p.components() {
        match c {
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                if parts.last().is_some_and(|l| l != "..") {
                    parts.pop();
                } else if !absolute {
                    parts.push("..".into());
                }
            }
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
        }
    }
    let joined = parts.join("/");
    match (absolute, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".into(),
        (false, false) => joined,
    }
}

/// The anchor GitHub gives a heading.
pub fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|&c| !matches!(c, '`' | '*' | '_'))
        .filter(|&c| is_word(c) || c == '-' || c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown page's headings (outside code blocks), repeated ones numbered as GitHub does.
pub fn anchors(text: &str) -> BTreeSet<String> {
    let (mut found, mut seen, mut in_code) = (BTreeSet::new(), HashMap::<String, usize>::new(), false);
    for line in text.split_inclusive('\n') {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            let s = slug(line.trim_start_matches('#'));
            let n = seen.entry(s.clone()).or_insert(0);
            found.insert(if *n == 0 { s.clone() } else { format!("{s}-{n}") });
            *n += 1;
        }
    }
    found
}

/// The inline code spans of a line.
pub fn code_spans(line: &str) -> Vec<&str> {
    let mut spans = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find('`') {
        let after = &rest[i + 1..];
        match after.find('`') {
            Some(0) => rest = after,
            Some(j) => {
                spans.push(&after[..j]);
                rest = &after[j + 1..];
            }
            None => break,
        }
    }
    spans
}

/// The targets of a line's Markdown links `[text](target)`.
pub fn link_targets(line: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(off) = line[i..].find('[') {
        let open = i + off;
        let matched = line[open + 1..].find(']').and_then(|c| {
            let close = open + 1 + c;
            let after = line[close + 1..].strip_prefix('(')?;
            let len = after.find(|ch: char| ch == ')' || ch.is_whitespace()).unwrap_or(after.len());
            (len > 0 && after[len..].starts_with(')')).then(|| (&after[..len], close + 2 + len + 1))
        });
        match matched {
            Some((target, end)) => {
                found.push(target);
                i = end;
            }
            None => i = open + 1,
        }
    }
    found
}

/// The checks, their --help cache and the problems found so far.
pub struct Checker<H> {
    helps: H,
    cache: HashMap<Vec<String>, Result<String, String>>,
    anchors: HashMap<String, BTreeSet<String>>,
    problems: Vec<String>,
}

impl<H: Helps> Checker<H> {
    pub fn new(helps: H) -> Self {
        Self { helps, cache: HashMap::new(), anchors: HashMap::new(), problems: Vec::new() }
    }

    fn help(&mut self, argv: &[String]) -> Result<String, String> {
        if let Some(h) = self.cache.get(argv) {
            return h.clone();
        }
        let h = self.helps.help(argv);
        self.cache.insert(argv.to_vec(), h.clone());
        h
    }

    /// How many --help texts were asked for.
    pub fn helps_asked(&self) -> usize {
        self.cache.len()
    }

    /// The problems found, each once, in the order found.
    pub fn problems(&self) -> Vec<String> {
        let mut seen = BTreeSet::new();
        self.problems.iter().filter(|p| seen.insert(p.as_str())).cloned().collect()
    }

    fn program_of(&self, word: &str) -> Option<String> {
        let base = word.trim_matches(|c| "[]()".contains(c));
        if PROGRAMS.contains(&basename(base)) {
            return Some(basename(base).to_string());
        }
        script_of(base).filter(|s| self.helps.script_exists(s)).map(str::to_string)
    }

    /// Checks one command line (`at`: file:line).
    pub fn check_command(&mut self, at: &str, text: &str) {
        let (mut prog, mut ctx, mut top) = (None::<String>, Vec::<String>::new(), Vec::<String>::new());
        let (mut prev, mut pending_bin, mut subs) = (Prev::No, None::<String>, BTreeSet::<String>::new());
        let mut toks = tokens(text);
        toks.push(Token::Separator);
        for tok in toks {
            let Token::Word { text: word, quoted } = tok else {
                (prog, pending_bin, prev) = (None, None, Prev::No);
                continue;
            };
            let bare = word.trim_matches(|c| "[]().,;".contains(c)).trim_end_matches(':');
            if bare.is_empty() || quoted {
                prev = Prev::No;
                continue;
            }
            if bare == "--" {
                if let Some(p) = pending_bin.take() {
                    // cargo run --bin NAME -- ARGS: the rest is NAME's.
                    (ctx, top, subs) = (vec![p.clone()], vec![p.clone()], BTreeSet::new());
                    prog = Some(p);
                } else {
                    prog = None; // what follows is another program's (QEMU's, libFuzzer's)
                }
                prev = Prev::No;
                continue;
            }
            if let Some(name) = flag_name(bare) {
                if let Some(p) = &prog {
                    self.check_flag(at, text, p.clone(), &ctx, name);
                }
                prev = if bare == "--bin" { Prev::Bin } else { Prev::Flag };
                continue;
            }
            let p = self.program_of(bare);
            match p {
                Some(p) if prev == Prev::Bin => pending_bin = Some(p),
                Some(p) if prev == Prev::No => {
                    (ctx, top) = (vec![p.clone()], vec![p.clone()]);
                    subs = self.help(std::slice::from_ref(&p)).map(|h| subcommands(&h)).unwrap_or_default();
                    prog = Some(p);
                }
                _ if prog.is_some() && subs.contains(bare) && ctx == top => {
                    ctx = top.iter().cloned().chain([bare.to_string()]).collect();
                }
                _ => {}
            }
            prev = Prev::No;
        }
    }

    fn check_flag(&mut self, at: &str, text: &str, prog: String, ctx: &[String], name: &str) {
        let mut tries = vec![ctx.to_vec()];
        if let Some((_, to)) = PASSES_TO.iter().find(|(from, _)| *from == prog) {
            tries.push(vec![to.to_string()]);
        }
        for argv in tries {
            let h = match self.help(&argv) {
                Ok(h) => h,
                Err(why) => {
                    self.problems.push(format!("{at}: {why}"));
                    return; // reported once per command
                }
            };
            let h = if argv[0].starts_with("ci/") {
                h
            } else {
                // A clap help: only its option lines (its examples may show other commands' flags).
                h.lines().filter(|l| l.trim_start().starts_with('-')).collect::<Vec<_>>().join("\n")
            };
            if mentions(&h, name) {
                return;
            }
        }
        self.problems.push(format!("{at}: `{}`: {name} is not in `{} --help`", text.trim(), ctx.join(" ")));
    }

    fn page_anchors(&mut self, path: &str) -> &BTreeSet<String> {
        if !self.anchors.contains_key(path) {
            let a = anchors(&self.helps.read(path).unwrap_or_default());
            self.anchors.insert(path.to_string(), a);
        }
        &self.anchors[path]
    }

    /// Checks a Markdown file: its code blocks' and inline code's command lines, its links.
    pub fn check_file(&mut self, name: &str, text: &str) {
        let (mut in_code, mut pending, mut start) = (false, String::new(), 0);
        for (i, line) in text.split_inclusive('\n').enumerate() {
            let n = i + 1;
            if line.starts_with("```") {
                in_code = !in_code;
                continue;
            }
            if in_code {
                let line = line.trim_end_matches('\n');
                if pending.is_empty() {
                    start = n;
                }
                if let Some(cont) = line.strip_suffix('\\') {
                    pending += cont;
                    pending.push(' ');
                    continue;
                }
                let whole = std::mem::take(&mut pending) + line;
                let trimmed = whole.trim_start();
                let command = trimmed.strip_prefix("$ ").unwrap_or(&whole);
                self.check_command(&format!("{name}:{start}"), command);
                continue;
            }
            for span in code_spans(line) {
                self.check_command(&format!("{name}:{n}"), &span.replace("\\|", "|"));
            }
            for target in link_targets(line) {
                self.check_link(name, n, target);
            }
        }
    }

    fn check_link(&mut self, name: &str, n: usize, target: &str) {
        let scheme = target.find(':').is_some_and(|i| i > 0 && target[..i].chars().all(|c| c.is_ascii_lowercase()));
        if scheme {
            return;
        }
        let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
        let dest = if path.is_empty() {
            name.to_string()
        } else {
            normpath(&Path::new(name).parent().unwrap_or(Path::new("")).join(path))
        };
        if !self.helps.exists(&dest) {
            self.problems.push(format!("{name}:{n}: the link {target} leads nowhere ({dest} does not exist)"));
        } else if !anchor.is_empty() && dest.ends_with(".md") && !self.page_anchors(&dest).contains(anchor) {
            self.problems.push(format!("{name}:{n}: the link {target}: {dest} has no heading #{anchor}"));
        }
    }

    /// Every page of docs/ (`pages`: its file names) is linked from docs/README.md (`index`).
    pub fn check_index(&mut self, index: &str, pages: &[String]) {
        let mut pages = pages.to_vec();
        pages.sort();
        for page in pages {
            if page.ends_with(".md") && page != "README.md" && !index.contains(&format!("]({page}")) {
                self.problems.push(format!("docs/README.md: docs/{page} is not in the index"));
            }
        }
    }
}

#[cfg(test)]
mod tests;
