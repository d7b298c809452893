//! Writing recordings: a [`Recorder`] per served device opens one [`Session`] file per client connection.

#![forbid(unsafe_code)]

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::format::{content_hash, tag, Record, MAGIC, MAX_HEADER, MAX_RECORD};
use crate::wire::Header;

/// Where a device's sessions go: `DIR/NAME-N.vfurec`, N counting connections from 1 (numbers a file already
/// has are skipped). Without a directory nothing is recorded until one is set.
pub struct Recorder {
    dir: Mutex<Option<PathBuf>>,
    name: String,
    /// What every session's header carries besides its number (device kind, configuration, faults).
    header: Mutex<serde_json::Value>,
    sessions: AtomicU32,
    current: Mutex<Option<Arc<Session>>>,
    /// `current` holds a session: what a device's hooks look at on every access before they take a lock.
    recording: AtomicBool,
    /// Most record bytes a session file takes (the header not counted); see [`Recorder::set_max_session_bytes`].
    max_session_bytes: AtomicU64,
    /// What all session files since the directory was set take together at most (headers counted).
    max_total_bytes: AtomicU64,
    /// What they take so far, and what was left out of them; shared with the sessions.
    totals: Arc<Totals>,
}

/// A recorder's account of its session files.
#[derive(Debug, Default)]
struct Totals {
    /// Bytes of every session file since the directory was set.
    bytes: AtomicU64,
    /// Records left out because their session had reached its limit or the recorder its total.
    records_over_cap: AtomicU64,
    /// Sessions that recorded nothing (no file) because the total was reached.
    sessions_over_cap: AtomicU64,
    /// The total was reached (and warned about) since the directory was set.
    full: AtomicBool,
}

impl Totals {
    /// Marks the total reached; true the first time (the one warning).
    fn fill(&self) -> bool {
        !self.full.swap(true, Ordering::Relaxed)
    }
}

/// A session's records stop at 4 GiB unless the recorder is told otherwise: a client left running for days
/// must not fill the disk the recordings go to.
pub const DEFAULT_MAX_SESSION_BYTES: u64 = 4 << 30;
/// What all of a device's session files take together unless the recorder is told otherwise: a client that
/// reconnects for ever must not fill the disk either.
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 16 << 30;

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").field("dir", &*lock(&self.dir)).field("name", &self.name).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Recorder {
    /// A recorder writing into `dir` (created if missing) under `name`.
    pub fn new(dir: &Path, name: &str, header: serde_json::Value) -> io::Result<Arc<Recorder>> {
        let r = Self::idle(name, header);
        r.set_dir(Some(dir))?;
        Ok(r)
    }

    /// A recorder that records nothing until [`Recorder::set_dir`].
    pub fn idle(name: &str, header: serde_json::Value) -> Arc<Recorder> {
        Arc::new(Recorder {
            dir: Mutex::new(None),
            name: name.to_string(),
            header: Mutex::new(header),
            sessions: AtomicU32::new(0),
            current: Mutex::new(None),
            recording: AtomicBool::new(false),
            max_session_bytes: AtomicU64::new(DEFAULT_MAX_SESSION_BYTES),
            max_total_bytes: AtomicU64::new(DEFAULT_MAX_TOTAL_BYTES),
            totals: Arc::new(Totals::default()),
        })
    }

    /// Records the sessions that begin from now on into `dir` (created if missing); `None` stops recording
    /// (the current session, if any, is finished). The total of the session files counts from here.
    pub fn set_dir(&self, dir: Option<&Path>) -> io::Result<()> {
        if let Some(d) = dir {
            std::fs::create_dir_all(d)?;
            self.totals.bytes.store(0, Ordering::Relaxed);
            self.totals.full.store(false, Ordering::Relaxed);
        } else {
            self.end();
        }
        *lock(&self.dir) = dir.map(Path::to_path_buf);
        Ok(())
    }

    pub fn dir(&self) -> Option<PathBuf> {
        lock(&self.dir).clone()
    }

    /// Sessions that begin from now on stop recording, with a warning, at the first record that would take
    /// them past `bytes` of records; what came before stays readable.
    pub fn set_max_session_bytes(&self, bytes: u64) {
        self.max_session_bytes.store(bytes, Ordering::Relaxed);
    }

    pub fn max_session_bytes(&self) -> u64 {
        self.max_session_bytes.load(Ordering::Relaxed)
    }

    /// Bounds what all session files since the directory was set take together (headers counted): the
    /// session that reaches it stops there, and later sessions record nothing, each counted.
    pub fn set_max_total_bytes(&self, bytes: u64) {
        self.max_total_bytes.store(bytes, Ordering::Relaxed);
    }

    pub fn max_total_bytes(&self) -> u64 {
        self.max_total_bytes.load(Ordering::Relaxed)
    }

    /// Bytes of every session file since the directory was set.
    pub fn total_bytes(&self) -> u64 {
        self.totals.bytes.load(Ordering::Relaxed)
    }

    /// Records left out because a session reached its limit or the recorder its total.
    pub fn records_over_cap(&self) -> u64 {
        self.totals.records_over_cap.load(Ordering::Relaxed)
    }

    /// Sessions that recorded nothing because the total was reached.
    pub fn sessions_over_cap(&self) -> u64 {
        self.totals.sessions_over_cap.load(Ordering::Relaxed)
    }

    /// Replaces one field of the header of sessions begun from now on.
    pub fn set_header_field(&self, key: &str, value: serde_json::Value) {
        if let Some(obj) = lock(&self.header).as_object_mut() {
            obj.insert(key.to_string(), value);
        }
    }

    /// A new session file for a client that just connected (`None` while no directory is set); the previous
    /// session, if any, is finished.
    pub fn begin(&self) -> io::Result<Option<Arc<Session>>> {
        self.end();
        let Some(dir) = self.dir() else { return Ok(None) };
        let limits = Limits {
            session: self.max_session_bytes(),
            total: self.max_total_bytes(),
            totals: Arc::clone(&self.totals),
        };
        // Numbers a file already has (an earlier run into the same directory) are skipped, never overwritten.
        for _ in 0..MAX_SKIPPED_FILES {
            let n = self.sessions.fetch_add(1, Ordering::AcqRel) + 1;
            let path = dir.join(format!("{}-{n}.vfurec", self.name));
            let mut header = lock(&self.header).clone();
            if let Some(obj) = header.as_object_mut() {
                obj.insert("format".into(), 1.into());
                obj.insert("session".into(), n.into());
            }
            match Session::create(path, &header, limits.clone()) {
                Ok(None) => return Ok(None),
                Ok(Some(s)) => {
                    let session = Arc::new(s);
                    let mut current = lock(&self.current);
                    *current = Some(session.clone());
                    self.recording.store(true, Ordering::Release);
                    return Ok(Some(session));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{}: {MAX_SKIPPED_FILES} session numbers in a row already have files", dir.display()),
        ))
    }

    /// The session being recorded, for events the device model logs itself (control commands, shared memory).
    pub fn current(&self) -> Option<Arc<Session>> {
        if !self.is_recording() {
            return None;
        }
        lock(&self.current).clone()
    }

    /// Whether a session is being recorded; no lock, so a device asks it on every access.
    pub fn is_recording(&self) -> bool {
        self.recording.load(Ordering::Acquire)
    }

    /// Finishes the current session (flushes and closes its file).
    pub fn end(&self) {
        let mut current = lock(&self.current);
        self.recording.store(false, Ordering::Release);
        if let Some(s) = current.take() {
            drop(current);
            s.finish();
        }
    }
}

/// How many taken session numbers `begin` skips before it gives up.
const MAX_SKIPPED_FILES: u32 = 100_000;

/// What a session may write: its own limit and its recorder's total.
#[derive(Debug, Clone)]
struct Limits {
    session: u64,
    total: u64,
    totals: Arc<Totals>,
}

/// One session file. Every method is safe from any thread; the first write error is logged and ends the
/// recording of this session (the device keeps running).
pub struct Session {
    path: PathBuf,
    out: Mutex<Option<BufWriter<File>>>,
    records: AtomicU64,
    bytes: AtomicU64,
    limits: Limits,
    failed: AtomicBool,
    /// Stopped by a limit: later records are counted as left out.
    capped: AtomicBool,
    next_control: AtomicU64,
}

impl Session {
    /// The session file at `path` with `header`; `None` (no file) when the recorder's total has no room for it.
    fn create(path: PathBuf, header: &serde_json::Value, limits: Limits) -> io::Result<Option<Session>> {
        let text = header.to_string();
        // A reader refuses a longer header, and with it the whole file: refuse it here, before the file exists.
        if text.len() > MAX_HEADER {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a session header of {} bytes is over {}; nothing is recorded", text.len(), MAX_HEADER),
            ));
        }
        let head = (MAGIC.len() + 4 + text.len()) as u64;
        let totals = &limits.totals;
        if totals.bytes.load(Ordering::Relaxed).saturating_add(head) > limits.total {
            totals.sessions_over_cap.fetch_add(1, Ordering::Relaxed);
            if totals.fill() {
                tracing::warn!(
                    "recording {}: the recordings reached their total limit of {} bytes; later sessions are not \
                     recorded (counted in {{\"cmd\":\"record\"}})",
                    path.display(),
                    limits.total
                );
            }
            return Ok(None);
        }
        // A new file only (never through a link or into a FIFO), readable by this user only: it holds guest
        // memory.
        let file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
        let mut w = BufWriter::with_capacity(1 << 16, file);
        w.write_all(MAGIC)?;
        w.write_all(&(text.len() as u32).to_le_bytes())?;
        w.write_all(text.as_bytes())?;
        totals.bytes.fetch_add(head, Ordering::Relaxed);
        Ok(Some(Session {
            path,
            out: Mutex::new(Some(w)),
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            limits,
            failed: AtomicBool::new(false),
            capped: AtomicBool::new(false),
            next_control: AtomicU64::new(1),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn records(&self) -> u64 {
        self.records.load(Ordering::Relaxed)
    }
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    fn put(&self, tag: u8, parts: &[&[u8]]) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut out = lock(&self.out);
        let Some(w) = out.as_mut() else {
            if self.capped.load(Ordering::Relaxed) {
                self.limits.totals.records_over_cap.fetch_add(1, Ordering::Relaxed);
            }
            return;
        };
        // A reader refuses a longer record and everything after it: end the recording here instead, so what
        // was recorded stays readable and the gap is said.
        let Some(len32) = u32::try_from(len).ok().filter(|_| len <= MAX_RECORD) else {
            tracing::warn!(
                "recording {}: a record of {len} bytes is over {}; recording of this session stops",
                self.path.display(),
                MAX_RECORD
            );
            self.failed.store(true, Ordering::Relaxed);
            *out = None;
            return;
        };
        let size = 5 + len as u64;
        // `bytes` changes only under `out`'s lock, which is held here; `totals.bytes` only in the recorder's
        // one current session (and its creation).
        let totals = &self.limits.totals;
        let over_session = self.bytes() + size > self.limits.session;
        let over_total = totals.bytes.load(Ordering::Relaxed) + size > self.limits.total;
        if over_session || over_total {
            if over_session {
                tracing::warn!(
                    "recording {}: the session reached its limit of {} bytes of records; recording of this session \
                     stops",
                    self.path.display(),
                    self.limits.session
                );
            } else if totals.fill() {
                tracing::warn!(
                    "recording {}: the recordings reached their total limit of {} bytes; recording stops here and \
                     later sessions are not recorded (counted in {{\"cmd\":\"record\"}})",
                    self.path.display(),
                    self.limits.total
                );
            }
            self.failed.store(true, Ordering::Relaxed);
            self.capped.store(true, Ordering::Relaxed);
            totals.records_over_cap.fetch_add(1, Ordering::Relaxed);
            *out = None;
            return;
        }
        let result = (|| {
            w.write_all(&[tag])?;
            w.write_all(&len32.to_le_bytes())?;
            parts.iter().try_for_each(|p| w.write_all(p))
        })();
        match result {
            Ok(()) => {
                self.records.fetch_add(1, Ordering::Relaxed);
                self.bytes.fetch_add(size, Ordering::Relaxed);
                totals.bytes.fetch_add(size, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!("recording {}: {e}; recording of this session stops", self.path.display());
                self.failed.store(true, Ordering::Relaxed);
                *out = None;
            }
        }
    }

    fn put_record(&self, r: &Record) {
        let (tag, body) = r.encode();
        self.put(tag, &[&body]);
    }

    pub fn message(&self, header: &Header, payload: &[u8], fds: usize) {
        let fds = [u8::try_from(fds).unwrap_or(u8::MAX)];
        self.put(tag::MESSAGE, &[&fds, &header.encode(), payload]);
    }
    pub fn reply(&self, header: &Header, payload: &[u8], fds: usize) {
        let fds = [u8::try_from(fds).unwrap_or(u8::MAX)];
        self.put(tag::REPLY, &[&fds, &header.encode(), payload]);
    }
    pub fn dma_read(&self, iova: u64, data: &[u8]) {
        self.put(tag::DMA_READ, &[&iova.to_le_bytes(), data]);
    }
    pub fn dma_write(&self, iova: u64, data: &[u8]) {
        self.put_record(&Record::DmaWrite { iova, len: data.len() as u64, hash: content_hash(data) });
    }
    pub fn dma_failed(&self, iova: u64, len: u64, write: bool) {
        self.put_record(&Record::DmaFailed { iova, len, write });
    }
    pub fn shared_read(&self, region: u32, offset: u64, data: &[u8]) {
        self.put(tag::SHARED_READ, &[&region.to_le_bytes(), &offset.to_le_bytes(), data]);
    }
    /// Logs a control request and returns the id its reply is logged under.
    pub fn control_request(&self, text: &str) -> u64 {
        let id = self.next_control.fetch_add(1, Ordering::Relaxed);
        self.put(tag::CONTROL_REQUEST, &[&id.to_le_bytes(), text.as_bytes()]);
        id
    }
    pub fn control_reply(&self, id: u64, text: &str) {
        self.put(tag::CONTROL_REPLY, &[&id.to_le_bytes(), text.as_bytes()]);
    }
    pub fn device_step(&self) {
        self.put(tag::DEVICE_STEP, &[]);
    }
    pub fn device_access(&self) {
        self.put(tag::DEVICE_ACCESS, &[]);
    }

    /// Flushes and closes the file; later events are dropped.
    pub fn finish(&self) {
        if let Some(mut w) = lock(&self.out).take() {
            if let Err(e) = w.flush() {
                tracing::warn!("recording {}: {e}", self.path.display());
                self.failed.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Writes what is buffered, keeping the file open (so a reader sees the session so far).
    pub fn flush(&self) {
        if let Some(w) = lock(&self.out).as_mut() {
            let _ = w.flush();
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.finish();
    }
}
