//! Message framing over a UNIX stream socket, with SCM_RIGHTS fd passing (through rustix; the three `unsafe`
//! blocks set SO_PEEK_OFF, which rustix does not wrap, read SO_PEERCRED, whose pid may be 0, which rustix's
//! non-zero `Pid` cannot hold, and unshare a binding thread's umask, which rustix has only as unsafe).
//!
//! Reading is [`crate::frame_reader`]'s (with `recv_message` for one-off reads), for every reader of the crate: the header's size is checked against
//! the limit before the body is allocated, at most `max_fds` descriptors are accepted per message (the kernel
//! closes any beyond the control buffer and reports MSG_CTRUNC), and a peer that stalls inside a message hits
//! a deadline.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use thiserror::Error;

use crate::wire::{Header, HEADER_SIZE};

/// Linux's `SCM_MAX_FD`: no message can carry more descriptors than this.
pub const SCM_MAX_FD: u32 = 253;

#[derive(Debug, Error)]
pub enum FrameError {
    #[error("peer closed the connection")]
    Closed,
    #[error("peer closed the connection in the middle of a message")]
    Truncated,
    /// The peer stalled in the middle of a message, or (`recv_message`) sent nothing within the socket's
    /// receive timeout.
    #[error("peer stalled in the middle of a message, or sent nothing in time")]
    Timeout,
    /// The header's size cannot be trusted, so the stream cannot be resynchronised.
    #[error("message size {size} outside [16, {max}]")]
    BadSize { header: Header, size: u32, max: u32 },
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
}

/// One complete message as received.
#[derive(Debug)]
pub struct Message {
    pub header: Header,
    pub payload: Vec<u8>,
    pub fds: Vec<OwnedFd>,
    /// More descriptors arrived than the limit; the extra ones were closed by the kernel.
    pub fds_truncated: bool,
}

fn to_timespec(d: Duration) -> Timespec {
    Timespec { tv_sec: d.as_secs().try_into().unwrap_or(i64::MAX), tv_nsec: d.subsec_nanos().into() }
}

/// Sets the socket's peek offset (SO_PEEK_OFF): MSG_PEEK then reads from there on and moves it forward,
/// and consuming reads move it back by what they consume. Used by [`crate::frame_reader`].
pub fn set_peek_offset(stream: &UnixStream, offset: i32) -> std::io::Result<()> {
    let value: libc::c_int = offset;
    // SAFETY: setsockopt reads exactly `size_of::<c_int>()` bytes from `value`, which outlives the call, and
    // the descriptor is borrowed from a live socket.
    let r = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEEK_OFF,
            std::ptr::from_ref(&value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The peer's credentials when it connected (SO_PEERCRED, unix(7)): `(pid, uid, gid)`. The pid is 0 when the
/// peer's process is not visible in our pid namespace.
pub fn peer_credentials(fd: impl AsFd) -> std::io::Result<(i32, u32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes, the size of `cred`, which outlives the call, and reports
    // the length written in `len`, which also outlives it; the descriptor is borrowed from a live file.
    let r = unsafe {
        libc::getsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::from_mut(&mut cred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(std::io::Error::other(format!("SO_PEERCRED gave {len} bytes")));
    }
    Ok((cred.pid, cred.uid, cred.gid))
}

/// Binds a listening socket at `path` whose file has exactly the permission bits `mode` from the moment it
/// exists: bound from a thread of its own whose umask, unshared from the process's (`unshare(CLONE_FS)`),
/// leaves `mode` of a socket's 0777 (unix(7)). No other thread's files see that umask. `Ok(None)`, with
/// nothing created, when the unshare is not allowed (a seccomp filter may refuse it). A default ACL on the
/// directory replaces the umask (acl(5)): the caller checks the mode it got.
pub fn bind_with_umask(path: &std::path::Path, mode: u32) -> std::io::Result<Option<std::os::unix::net::UnixListener>> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("socket-bind".into())
            .spawn_scoped(scope, || {
                // SAFETY: CLONE_FS gives this thread its own copy of the root, working directory and umask;
                // no descriptor table is unshared, so every descriptor stays valid in every thread.
                if unsafe { libc::unshare(libc::CLONE_FS) } != 0 {
                    tracing::debug!("unshare(CLONE_FS): {}", std::io::Error::last_os_error());
                    return Ok(None);
                }
                rustix::process::umask(rustix::fs::Mode::from_raw_mode(!mode & 0o777));
                std::os::unix::net::UnixListener::bind(path).map(Some)
            })?
            .join()
            .map_err(|_| std::io::Error::other("the binding thread panicked"))?
    })
}

/// Waits until `fd` is readable (or a listener has a connection). `Ok(false)` on timeout.
pub fn wait_readable(fd: impl AsFd, timeout: Duration) -> std::io::Result<bool> {
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    match poll(&mut fds, Some(&to_timespec(timeout))) {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Sends `header` + `parts` as one message, with `fds` attached to its first bytes.
pub fn send_message(stream: &UnixStream, header: &Header, parts: &[&[u8]], fds: &[BorrowedFd]) -> std::io::Result<()> {
    let hb = header.encode();
    let total = HEADER_SIZE + parts.iter().map(|p| p.len()).sum::<usize>();
    if fds.is_empty() && total <= SMALL_MESSAGE {
        return send_small(stream, &hb, parts, total);
    }
    // Room for the iovec on the stack: a register round trip sends two or three parts, and this runs per message.
    const INLINE: usize = 8;
    let mut inline = [IoSlice::new(&[]); INLINE];
    let mut spilled = Vec::new();
    let mut sent = 0usize;
    let mut first = true;
    while sent < total {
        // The iovec from the first unsent byte on.
        let mut skip = sent;
        let mut n_iov = 0;
        for p in std::iter::once(&hb[..]).chain(parts.iter().copied()) {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            let rest = IoSlice::new(p.get(skip..).unwrap_or_default());
            skip = 0;
            match inline.get_mut(n_iov) {
                Some(slot) if spilled.is_empty() => *slot = rest,
                _ => {
                    if spilled.is_empty() {
                        spilled.extend_from_slice(&inline[..n_iov]);
                    }
                    spilled.push(rest);
                }
            }
            n_iov += 1;
        }
        let iov: &[IoSlice] = if spilled.is_empty() { inline.get(..n_iov).unwrap_or_default() } else { &spilled };
        let n = if first && !fds.is_empty() {
            let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !control.push(SendAncillaryMessage::ScmRights(fds)) {
                return Err(std::io::Error::other("control buffer too small"));
            }
            sendmsg(stream, iov, &mut control, SendFlags::NOSIGNAL)
        } else {
            sendmsg(stream, iov, &mut SendAncillaryBuffer::default(), SendFlags::NOSIGNAL)
        };
        spilled.clear();
        match n {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                sent += n;
                first = false;
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Messages up to this size without descriptors are gathered on the stack and sent with plain `send`: the
/// register round trips, whose cost is mostly system calls, skip the iovec and msghdr handling of `sendmsg`.
const SMALL_MESSAGE: usize = 256;

fn send_small(stream: &UnixStream, hb: &[u8; HEADER_SIZE], parts: &[&[u8]], total: usize) -> std::io::Result<()> {
    let mut buf = [0u8; SMALL_MESSAGE];
    let mut at = 0;
    for p in std::iter::once(&hb[..]).chain(parts.iter().copied()) {
        let dst = buf.get_mut(at..at + p.len()).ok_or(std::io::ErrorKind::InvalidInput)?;
        dst.copy_from_slice(p);
        at += p.len();
    }
    let mut rest = buf.get(..total).unwrap_or_default();
    while !rest.is_empty() {
        match rustix::net::send(stream, rest, SendFlags::NOSIGNAL) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = rest.get(n..).unwrap_or_default(),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Convenience for borrowing a slice of owned descriptors.
pub fn borrow_all(fds: &[OwnedFd]) -> Vec<BorrowedFd<'_>> {
    fds.iter().map(|f| f.as_fd()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn process_umask() -> String {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        status.lines().find(|l| l.starts_with("Umask:")).unwrap_or_default().to_string()
    }

    #[test]
    fn a_socket_bound_with_a_umask_of_its_own_has_exactly_its_mode_and_the_process_umask_is_untouched() {
        let dir = std::env::temp_dir().join(format!("sock-umask-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let before = process_umask();
        for (i, mode) in [0o600, 0o640, 0o660, 0o666, 0o777].into_iter().enumerate() {
            let path = dir.join(format!("s{i}"));
            let Some(_listener) = bind_with_umask(&path, mode).unwrap() else {
                eprintln!("skipped: unshare(CLONE_FS) is not allowed here");
                return;
            };
            assert_eq!(std::fs::symlink_metadata(&path).unwrap().permissions().mode() & 0o7777, mode);
        }
        assert_eq!(process_umask(), before);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
