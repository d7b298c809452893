//! Owning a UNIX socket path: bind it unless a live server answers there, replace it only when it is stale,
//! and at exit remove it only while it is still the socket this process bound.
//!
//! "Live" means a connection to it succeeds (a full backlog counts as live); "stale" means the path is a
//! socket that nobody listens on (ECONNREFUSED). Anything else (another kind of file, a probe that fails
//! otherwise) is refused, never removed. Device models starting at the same time take turns: the probe, the
//! removal and the bind happen under an exclusive flock of the socket's directory, so two of them cannot
//! both find a path stale and unlink each other's new socket.

#![forbid(unsafe_code)]

use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{flock, open, FlockOperation, Mode, OFlags};
use rustix::io::Errno;
use rustix::net::{connect, socket_with, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use thiserror::Error;

/// Longest wait for another process's turn at the directory lock.
const LOCK_WAIT: Duration = Duration::from_secs(5);
const LOCK_RETRY: Duration = Duration::from_millis(10);

#[derive(Debug, Error)]
pub enum OwnError {
    #[error("{0}: a server is already listening there (another device model?); refusing to take it over")]
    InUse(PathBuf),
    #[error("{0} exists and is not a socket")]
    NotASocket(PathBuf),
    #[error("{path}: cannot tell whether a server listens there: {source}")]
    Probe { path: PathBuf, source: std::io::Error },
    #[error("removing stale socket {path}: {source}")]
    RemoveStale { path: PathBuf, source: std::io::Error },
    #[error("binding {path}: {source}")]
    Bind { path: PathBuf, source: std::io::Error },
    #[error("locking directory {dir} for the bind: {source}")]
    Lock { dir: PathBuf, source: std::io::Error },
}

pub type Result<T> = std::result::Result<T, OwnError>;

/// The socket file this process bound: removed when dropped (or by [`SocketFile::remove`]) if the path still
/// names it, so every way out of the process but an immediate exit leaves no socket file behind.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    /// An O_PATH handle on the socket's inode: while it is open the inode number cannot be reused, so a
    /// socket bound at the path by someone else later has another (st_dev, st_ino).
    inode: OwnedFd,
}

impl From<OwnError> for std::io::Error {
    fn from(e: OwnError) -> Self {
        let kind = match &e {
            OwnError::InUse(_) | OwnError::NotASocket(_) => std::io::ErrorKind::AlreadyExists,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

impl SocketFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the path if it still is our socket (not one another process bound there since).
    pub fn remove(self) {
        drop(self);
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = match rustix::fs::fstat(&self.inode) {
            Ok(st) => (st.st_dev, st.st_ino),
            Err(e) => {
                tracing::warn!("{}: {e}; left in place", self.path.display());
                return;
            }
        };
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) == ours => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!("removing {}: {e}", self.path.display());
                }
            }
            Ok(_) => tracing::warn!("{} is no longer our socket; left in place", self.path.display()),
            Err(_) => {}
        }
    }
}

/// What is at a path before binding.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Nothing,
    Stale,
    Live,
}

fn probe(path: &Path) -> Result<Found> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Nothing),
        Err(e) => return Err(OwnError::Probe { path: path.into(), source: e }),
    };
    if !meta.file_type().is_socket() {
        return Err(OwnError::NotASocket(path.into()));
    }
    let probe_err = |e: Errno| OwnError::Probe { path: path.into(), source: e.into() };
    let addr = SocketAddrUnix::new(path).map_err(probe_err)?;
    // Non-blocking, so a live server with a full backlog answers EAGAIN instead of blocking us.
    let s = socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC, None)
        .map_err(probe_err)?;
    match connect(&s, &addr) {
        Ok(()) | Err(Errno::AGAIN) | Err(Errno::INPROGRESS) => Ok(Found::Live),
        Err(Errno::CONNREFUSED) => Ok(Found::Stale),
        Err(Errno::NOENT) => Ok(Found::Nothing),
        Err(e) => Err(probe_err(e)),
    }
}

/// The directory lock, held while probing and binding. `None` for a directory we may not read (flock needs
/// an open directory): binding there goes on without the lock.
fn lock_dir(dir: &Path) -> Result<Option<OwnedFd>> {
    let lock_err = |e: std::io::Error| OwnError::Lock { dir: dir.into(), source: e };
    let fd = match open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ACCESS) => {
            tracing::warn!("cannot open {} to lock it; binding without the lock", dir.display());
            return Ok(None);
        }
        Err(e) => return Err(lock_err(e.into())),
    };
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(Some(fd)),
            Err(Errno::WOULDBLOCK) | Err(Errno::INTR) if Instant::now() < deadline => std::thread::sleep(LOCK_RETRY),
            Err(e) => return Err(lock_err(e.into())),
        }
    }
}

/// Binds a listening socket at `path`: refuses if a server answers there or the path is not a socket,
/// replaces a stale socket.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile)> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let _lock = lock_dir(dir)?;
    match probe(path)? {
        Found::Live => return Err(OwnError::InUse(path.into())),
        Found::Stale => {
            tracing::info!("replacing stale socket {}", path.display());
            std::fs::remove_file(path).map_err(|e| OwnError::RemoveStale { path: path.into(), source: e })?;
        }
        Found::Nothing => {}
    }
    let bind_err = |e: std::io::Error| OwnError::Bind { path: path.into(), source: e };
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    let inode = match open(path, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(e) => {
            let _ = std::fs::remove_file(path);
            return Err(bind_err(e.into()));
        }
    };
    Ok((listener, SocketFile { path: path.into(), inode }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("dm-owner-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    #[test]
    fn a_path_where_a_server_listens_is_refused_and_left_alone() {
        let d = dir("live");
        let p = d.join("s.sock");
        let (_first, _file) = bind(&p).expect("first bind");
        let ino = std::fs::metadata(&p).expect("stat").ino();
        assert!(matches!(bind(&p), Err(OwnError::InUse(q)) if q == p));
        assert_eq!(std::fs::metadata(&p).expect("still there").ino(), ino, "not replaced");
        assert!(std::os::unix::net::UnixStream::connect(&p).is_ok(), "the first server still answers");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_stale_socket_is_replaced() {
        let d = dir("stale");
        let p = d.join("s.sock");
        drop(UnixListener::bind(&p).expect("bind")); // closed: the file stays, nobody listens
        let (_l, file) = bind(&p).expect("stale socket replaced");
        assert!(std::os::unix::net::UnixStream::connect(&p).is_ok());
        file.remove();
        assert!(!p.exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_path_that_is_not_a_socket_is_refused_and_kept() {
        let d = dir("file");
        let p = d.join("data");
        std::fs::write(&p, b"precious").expect("write");
        assert!(matches!(bind(&p), Err(OwnError::NotASocket(_))));
        assert_eq!(std::fs::read(&p).expect("kept"), b"precious");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_server_with_a_full_backlog_still_counts_as_live() {
        let d = dir("backlog");
        let p = d.join("s.sock");
        let (_l, _file) = bind(&p).expect("bind");
        // Never accepted: fill the backlog (std listens with 128; Linux queues backlog + 1).
        let mut held = Vec::new();
        for _ in 0..200 {
            let s = socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::NONBLOCK, None).expect("socket");
            match connect(&s, &SocketAddrUnix::new(&p).expect("addr")) {
                Ok(()) => held.push(s),
                Err(_) => break,
            }
        }
        assert!(matches!(bind(&p), Err(OwnError::InUse(_))));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn removal_at_exit_spares_a_socket_someone_else_bound_since() {
        let d = dir("replaced");
        let p = d.join("s.sock");
        let (l, file) = bind(&p).expect("bind");
        drop(l);
        std::fs::remove_file(&p).expect("unlink");
        let _other = UnixListener::bind(&p).expect("another server");
        file.remove();
        assert!(p.exists(), "the other server's socket is not ours to remove");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn concurrent_binds_of_one_stale_path_leave_exactly_one_owner() {
        let d = dir("race");
        let p = d.join("s.sock");
        drop(UnixListener::bind(&p).expect("bind"));
        let results: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || bind(&p))
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().expect("thread"))
            .collect();
        let owners = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(owners, 1, "{results:?}");
        assert!(results.iter().all(|r| r.is_ok() || matches!(r, Err(OwnError::InUse(_)))));
        let _ = std::fs::remove_dir_all(&d);
    }
}
