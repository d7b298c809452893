//! Where trace lines go: stderr, a file, or memory (tests); as text or JSON lines. A file takes at most
//! [`Sink::max_file_bytes`]: lines beyond are left out and counted, with one warning.

#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use super::kinds::{Block, Event};
use crate::output_file::{self, Existing};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// `[   1.234567] hfi1 W RCV_CTXT_CTRL[ctxt 2] = 0x11 ENABLE TID_FLOW_ENABLE`
    Text,
    /// `{"t":1.234567,"seq":12,"device":"hfi1","block":"rxe","event":"mmio",...}`
    Json,
}

impl Format {
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "text" => Some(Format::Text),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
        }
    }
}

/// Most lines a memory sink keeps: the newest, the older ones dropped (and counted).
pub const MEMORY_LINES: usize = 65_536;
/// Most bytes a trace file takes unless told otherwise (`--trace-max-mib`).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 30;

/// A trace file and what it holds.
struct TraceFile {
    file: File,
    path: PathBuf,
    /// Its size: what it held when opened (it is appended to) and what was written since.
    bytes: u64,
    /// Lines left out since it filled up.
    over_cap: u64,
}

enum Output {
    Stderr,
    File(TraceFile),
    /// The newest lines, and how many older ones were dropped.
    Memory(VecDeque<String>, u64),
}

/// A trace destination shared by every device's tracer. Each line is one `write` (so a killed process
/// leaves whole lines behind, and lines of several threads do not interleave).
pub struct Sink {
    format: AtomicU8,
    out: Mutex<Output>,
    start: Instant,
    seq: AtomicU64,
    max_file_bytes: AtomicU64,
}

impl Sink {
    fn new(out: Output) -> Self {
        Sink {
            format: AtomicU8::new(0),
            out: Mutex::new(out),
            start: Instant::now(),
            seq: AtomicU64::new(0),
            max_file_bytes: AtomicU64::new(DEFAULT_MAX_FILE_BYTES),
        }
    }

    /// The process's sink: stderr in text until told otherwise.
    pub fn global() -> Arc<Sink> {
        static GLOBAL: OnceLock<Arc<Sink>> = OnceLock::new();
        GLOBAL.get_or_init(|| Arc::new(Sink::new(Output::Stderr))).clone()
    }

    /// A sink that keeps its newest [`MEMORY_LINES`] lines, for tests and benchmarks.
    pub fn memory() -> Arc<Sink> {
        Arc::new(Sink::new(Output::Memory(VecDeque::new(), 0)))
    }

    pub fn format(&self) -> Format {
        if self.format.load(Ordering::Relaxed) == 1 {
            Format::Json
        } else {
            Format::Text
        }
    }
    pub fn set_format(&self, f: Format) {
        self.format.store(u8::from(f == Format::Json), Ordering::Relaxed);
    }

    /// Appends to `path` from now on: a regular file, created (0600) if missing; a symbolic link, a FIFO or
    /// anything else is refused at once ([`crate::output_file`]).
    pub fn to_file(&self, path: &Path) -> std::io::Result<()> {
        let file = output_file::open(path, Existing::Append)?;
        let bytes = file.metadata()?.len();
        *self.lock() = Output::File(TraceFile { file, path: path.to_path_buf(), bytes, over_cap: 0 });
        Ok(())
    }

    /// Bounds every trace file (the current one too) at `bytes`.
    pub fn set_max_file_bytes(&self, bytes: u64) {
        self.max_file_bytes.store(bytes, Ordering::Relaxed);
    }

    pub fn max_file_bytes(&self) -> u64 {
        self.max_file_bytes.load(Ordering::Relaxed)
    }

    /// The trace file's size and the lines left out since it reached its bound (0 and 0 without a file).
    pub fn file_status(&self) -> (u64, u64) {
        match &*self.lock() {
            Output::File(f) => (f.bytes, f.over_cap),
            _ => (0, 0),
        }
    }
    pub fn to_stderr(&self) {
        *self.lock() = Output::Stderr;
    }

    /// Where lines go, for `{"cmd":"trace"}`.
    pub fn destination(&self) -> String {
        match &*self.lock() {
            Output::Stderr => "stderr".into(),
            Output::File(f) => f.path.display().to_string(),
            Output::Memory(..) => "memory".into(),
        }
    }

    /// The lines kept by a memory sink (emptied).
    pub fn take_lines(&self) -> Vec<String> {
        match &mut *self.lock() {
            Output::Memory(v, _) => std::mem::take(v).into(),
            _ => Vec::new(),
        }
    }

    /// Lines a memory sink dropped to stay within [`MEMORY_LINES`].
    pub fn dropped_lines(&self) -> u64 {
        match &*self.lock() {
            Output::Memory(_, dropped) => *dropped,
            _ => 0,
        }
    }

    /// Lines written so far.
    pub fn lines(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Output> {
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn write(&self, device: &str, block: Block, event: &Event) {
        let t = self.start.elapsed().as_secs_f64();
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut line = match self.format() {
            Format::Text => {
                let mut s = format!("[{t:12.6}] {device} ");
                match &event.head {
                    Some(h) => s.push_str(h),
                    None => {
                        s.push_str(event.kind);
                        for (k, v) in event.fields {
                            s.push_str(&format!(" {k}={v}"));
                        }
                    }
                }
                s
            }
            Format::Json => {
                let mut m = serde_json::Map::new();
                m.insert("t".into(), serde_json::json!((t * 1e6).round() / 1e6));
                m.insert("seq".into(), seq.into());
                m.insert("device".into(), device.into());
                m.insert("block".into(), block.name().into());
                m.insert("event".into(), event.kind.into());
                for (k, v) in event.fields {
                    m.insert((*k).into(), v.json());
                }
                serde_json::Value::Object(m).to_string()
            }
        };
        line.push('\n');
        match &mut *self.lock() {
            // Trace output must never stop the device: write errors are dropped.
            Output::Stderr => {
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
            Output::File(f) => {
                let len = line.len() as u64;
                let max = self.max_file_bytes();
                if f.bytes.saturating_add(len) > max {
                    f.over_cap += 1;
                    if f.over_cap == 1 {
                        tracing::warn!(
                            "trace file {} reached its limit of {max} bytes; later lines are left out (counted in \
                             {{\"cmd\":\"trace\"}})",
                            f.path.display()
                        );
                    }
                } else if f.file.write_all(line.as_bytes()).is_ok() {
                    f.bytes += len;
                }
            }
            Output::Memory(v, dropped) => {
                line.pop();
                if v.len() == MEMORY_LINES {
                    v.pop_front();
                    *dropped += 1;
                }
                v.push_back(line);
            }
        }
    }
}
