//! Owning a UNIX socket path: bind it unless a live server answers there, replace it only when it is stale,
//! and at exit remove it only while it is still the socket this process bound.
//!
//! "Live" means a connection to it succeeds (a full backlog counts as live); "stale" means the path is a
//! socket that nobody listens on (ECONNREFUSED). Anything else (another kind of file, a probe that fails
//! otherwise) is refused, never removed. Device models starting at the same time take turns: the probe, the
//! removal and the bind happen under an exclusive flock of the socket's directory, so two of them cannot
//! both find a path stale and unlink each other's new socket.
//!
//! A socket appears at its path with its final mode (0600 unless asked otherwise), never wider. It is bound
//! by a thread whose umask, unshared from the process's, leaves exactly that mode
//! ([`vfio_user_proto::sock::bind_with_umask`]); setting the process's umask around `bind` would do it too,
//! but every other thread's files would take it meanwhile. Where the unshare is refused (a seccomp filter),
//! the socket is bound inside a fresh 0700 directory beside the path, where nobody else can reach it, given
//! its mode there and renamed into place without replacing anything; it then keeps the staging name as its
//! address (what `ss -x` and /proc/net/unix show).

#![forbid(unsafe_code)]

use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::fs::{flock, open, renameat_with, FlockOperation, Mode, OFlags, RenameFlags, CWD};
use rustix::io::Errno;
use rustix::net::{connect, socket_with, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use thiserror::Error;

/// Longest wait for another process's turn at the directory lock.
const LOCK_WAIT: Duration = Duration::from_secs(5);
const LOCK_RETRY: Duration = Duration::from_millis(10);
/// The mode of every socket this process creates unless told otherwise: its owner only.
pub const DEFAULT_MODE: u32 = 0o600;
/// Longest socket path the kernel takes (`sun_path`, unix(7), without its terminating NUL).
const SUN_PATH_MAX: usize = 107;

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
    #[error("{0}: something was created there while the socket was being bound; left alone")]
    Appeared(PathBuf),
    #[error("socket mode {0:#o}: give 0600 to 0777 (the owner must keep read and write)")]
    Mode(u32),
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
    mode: u32,
    /// The socket file's group (whom a group-writable mode lets in).
    gid: u32,
}

impl From<OwnError> for std::io::Error {
    fn from(e: OwnError) -> Self {
        let kind = match &e {
            OwnError::InUse(_) | OwnError::NotASocket(_) | OwnError::Appeared(_) => std::io::ErrorKind::AlreadyExists,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

impl SocketFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The permission bits the socket was created with.
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// The socket file's group when it was created.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// Another `O_PATH` handle on the socket file (to look at its group later, [`PeerPolicy::with_group_of`]).
    ///
    /// [`PeerPolicy::with_group_of`]: vfio_user_proto::server::PeerPolicy::with_group_of
    pub fn handle(&self) -> std::io::Result<OwnedFd> {
        self.inode.try_clone()
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

/// Binds a listening socket at `path`, mode 0600: refuses if a server answers there or the path is not a
/// socket, replaces a stale socket.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile)> {
    bind_with_mode(path, DEFAULT_MODE)
}

/// [`bind`] with the socket file's permission bits `mode` (0600..=0777, the owner keeping read and write),
/// which it has from the moment it appears at `path`, whatever the umask.
pub fn bind_with_mode(path: &Path, mode: u32) -> Result<(UnixListener, SocketFile)> {
    check_mode(mode)?;
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
    let (listener, inode) = match vfio_user_proto::sock::bind_with_umask(path, mode).map_err(bind_err)? {
        Some(listener) => {
            let inode = match open(path, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()) {
                Ok(fd) => fd,
                Err(e) => {
                    let _ = std::fs::remove_file(path);
                    return Err(bind_err(e.into()));
                }
            };
            (listener, inode)
        }
        None => bind_staged(dir, path, mode)?,
    };
    let st = rustix::fs::fstat(&inode).map_err(|e| bind_err(e.into()))?;
    let got = st.st_mode & 0o7777;
    if got != mode {
        // A default ACL on the directory decided instead of the umask (acl(5)): the directory's owner chose
        // who gets new files there; the mode asked for is set now.
        tracing::info!("{}: created {got:04o} (the directory's default ACL), set to {mode:04o}", path.display());
        rustix::fs::chmod(path, Mode::from_raw_mode(mode)).map_err(|e| bind_err(e.into()))?;
    }
    Ok((listener, SocketFile { path: path.into(), inode, mode, gid: st.st_gid }))
}

/// Binds in a staging directory in `dir` and renames the socket to `path` (which is in `dir`).
fn bind_staged(dir: &Path, path: &Path, mode: u32) -> Result<(UnixListener, OwnedFd)> {
    let bind_err = |e: std::io::Error| OwnError::Bind { path: path.into(), source: e };
    let staging = Staging::create(dir).map_err(bind_err)?;
    let (listener, inode) = staging.bind(mode).map_err(bind_err)?;
    match renameat_with(CWD, &staging.socket, CWD, path, RenameFlags::NOREPLACE) {
        Ok(()) => Ok((listener, inode)),
        Err(rustix::io::Errno::EXIST) => Err(OwnError::Appeared(path.into())),
        Err(e) => Err(bind_err(e.into())),
    }
}

/// A mode a socket may be given: the owner keeps read and write, and there is nothing beyond 0777.
pub fn check_mode(mode: u32) -> Result<()> {
    if mode & !0o777 != 0 || mode & DEFAULT_MODE != DEFAULT_MODE {
        return Err(OwnError::Mode(mode));
    }
    Ok(())
}

/// A private directory next to the socket's path (same file system, so the socket can be renamed out of it),
/// removed with whatever is still in it when dropped.
struct Staging {
    dir: PathBuf,
    socket: PathBuf,
}

impl Staging {
    fn create(parent: &Path) -> std::io::Result<Staging> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        for _ in 0..100 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = parent.join(format!(".dm{}-{n}", std::process::id()));
            // 0700 & !umask: at most 0700, so nobody but us (and root) can reach the socket inside.
            match rustix::fs::mkdir(&dir, Mode::RWXU) {
                Ok(()) => {
                    let socket = dir.join("s");
                    return Ok(Staging { dir, socket });
                }
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "no free name for a staging directory"))
    }

    /// Binds the socket in the staging directory and gives it `mode`. The kernel limits a bound path's length:
    /// a staging path too long for it is bound through the directory's descriptor instead.
    fn bind(&self, mode: u32) -> std::io::Result<(UnixListener, OwnedFd)> {
        let listener = if self.socket.as_os_str().len() <= SUN_PATH_MAX {
            UnixListener::bind(&self.socket)?
        } else {
            let dir = open(&self.dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
            use std::os::fd::AsRawFd;
            UnixListener::bind(format!("/proc/self/fd/{}/s", dir.as_raw_fd()))?
        };
        std::fs::set_permissions(&self.socket, std::fs::Permissions::from_mode(mode))?;
        let inode = open(&self.socket, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
        Ok((listener, inode))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // Renamed out on success; left behind (and removed here) on a failure.
        let _ = std::fs::remove_file(&self.socket);
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            tracing::warn!("removing {}: {e}", self.dir.display());
        }
    }
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

    fn entries(d: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(d)
            .expect("readdir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_socket_has_its_mode_from_the_moment_it_appears_at_its_path_and_nothing_else_is_left() {
        let d = dir("mode");
        // (mode asked for, None: `bind`'s default), the mode the socket file has
        for (asked, want) in [(None, 0o600), (Some(0o600), 0o600), (Some(0o660), 0o660), (Some(0o666), 0o666)] {
            let p = d.join("s.sock");
            let (l, file) = match asked {
                None => bind(&p),
                Some(m) => bind_with_mode(&p, m),
            }
            .expect("bind");
            let mode = std::fs::symlink_metadata(&p).expect("stat").mode();
            assert!(std::fs::symlink_metadata(&p).expect("stat").file_type().is_socket());
            assert_eq!(mode & 0o7777, want, "asked {asked:?}: {mode:o}");
            assert_eq!(file.mode(), want);
            let bound = l.local_addr().expect("address");
            assert_eq!(bound.as_pathname(), Some(p.as_path()), "bound under its own name (ss -x shows it)");
            assert_eq!(entries(&d), ["s.sock"]);
            assert!(std::os::unix::net::UnixStream::connect(&p).is_ok(), "served at its path");
            file.remove();
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn where_the_umask_cannot_be_unshared_a_staged_socket_has_its_mode_and_its_staging_directory_goes() {
        let d = dir("staged");
        for mode in [0o600, 0o660, 0o666] {
            let p = d.join("s.sock");
            let (_l, inode) = bind_staged(&d, &p, mode).expect("bind");
            assert_eq!(std::fs::symlink_metadata(&p).expect("stat").mode() & 0o7777, mode);
            assert_eq!(entries(&d), ["s.sock"], "the staging directory is gone");
            assert!(std::os::unix::net::UnixStream::connect(&p).is_ok(), "served at its path");
            drop(inode);
            std::fs::remove_file(&p).expect("unlink");
        }
        // Something at the path already: left alone, nothing else left behind.
        let p = d.join("taken");
        std::fs::write(&p, b"keep").expect("write");
        assert!(matches!(bind_staged(&d, &p, 0o600), Err(OwnError::Appeared(_))));
        assert_eq!(std::fs::read(&p).expect("kept"), b"keep");
        assert_eq!(entries(&d), ["taken"]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_mode_that_takes_the_owners_access_away_or_has_special_bits_is_refused() {
        let d = dir("badmode");
        let p = d.join("s.sock");
        for mode in [0o400, 0o200, 0o060, 0o1600, 0o4600, 0o2660] {
            assert!(matches!(bind_with_mode(&p, mode), Err(OwnError::Mode(m)) if m == mode), "{mode:o}");
        }
        assert!(entries(&d).is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_path_at_the_kernels_length_limit_still_binds_through_its_staging_directory() {
        let d = dir("long");
        // 107 bytes in all: the staging path beside it is longer than a bound path may be.
        let name = "x".repeat(SUN_PATH_MAX - d.as_os_str().len() - 1);
        let p = d.join(name);
        assert_eq!(p.as_os_str().len(), SUN_PATH_MAX);
        let (_l, _inode) = bind_staged(&d, &p, 0o600).expect("bind");
        assert!(std::os::unix::net::UnixStream::connect(&p).is_ok());
        assert_eq!(std::fs::symlink_metadata(&p).expect("stat").mode() & 0o777, 0o600);
        std::fs::remove_file(&p).expect("unlink");
        assert!(entries(&d).is_empty());
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
