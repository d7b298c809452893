//! Who may talk to a socket: every accepted connection's peer credentials (`SO_PEERCRED`) against what the
//! socket's mode grants.
//!
//! - The socket's owner (this process's effective uid) and root are always admitted. Root passes any file mode
//!   and may ptrace this process, so refusing it would protect nothing.
//! - A mode with group write (connect(2) on a UNIX socket path needs write permission, unix(7)) also admits
//!   members of the socket's group: the peer's gid, or one of its supplementary groups as
//!   `/proc/PID/status` lists them. The group is the socket file's at the time of the connection, so a
//!   `chgrp` after the socket was created counts.
//! - A mode with write for others admits anyone.
//!
//! The file mode already stops a peer the kernel's permission check refuses; this check also covers sockets
//! whose file mode is not ours to set (an inherited `--fd`) or was loosened behind our back.

#![forbid(unsafe_code)]

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use thiserror::Error;

/// Group write: members of the socket's group may connect.
pub const MODE_GROUP_WRITE: u32 = 0o020;
/// Write for others: anyone may connect.
pub const MODE_OTHER_WRITE: u32 = 0o002;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PeerError {
    #[error(
        "refused a peer of another user (pid {pid}, uid {uid}, gid {gid}): only uid {owner}{group} and root may \
         connect; a wider --socket-mode lets others in"
    )]
    Refused { pid: i32, uid: u32, gid: u32, owner: u32, group: String },
    #[error("cannot read the peer's credentials: {0}")]
    Credentials(String),
}

/// Whom a listening socket admits, and how many peers it refused.
#[derive(Debug, Clone)]
pub struct PeerPolicy {
    owner: u32,
    /// Members of this group are admitted too.
    group: Option<u32>,
    /// The socket file whose group replaces `group` at each check.
    group_of: Option<Arc<OwnedFd>>,
    anyone: bool,
    refused: Arc<AtomicU64>,
    /// The socket, as logs name it.
    label: Arc<str>,
}

impl Default for PeerPolicy {
    /// The owner (this process's effective uid) and root only: what a 0600 socket admits.
    fn default() -> Self {
        Self::new(0o600, rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw())
    }
}

/// The peer as `SO_PEERCRED` gives it (its credentials when it connected).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

impl PeerPolicy {
    /// What a socket of `mode` owned by `owner` with group `group` admits.
    pub fn new(mode: u32, owner: u32, group: u32) -> Self {
        PeerPolicy {
            owner,
            group: (mode & MODE_GROUP_WRITE != 0).then_some(group),
            anyone: mode & MODE_OTHER_WRITE != 0,
            refused: Arc::new(AtomicU64::new(0)),
            label: Arc::from("socket"),
            group_of: None,
        }
    }

    /// Names the socket in the log line of a refusal.
    pub fn with_label(mut self, label: &str) -> Self {
        self.label = Arc::from(label);
        self
    }

    /// Takes the admitted group from `file`'s group at each check (an `O_PATH` handle on the socket file),
    /// when the mode admits a group at all.
    pub fn with_group_of(mut self, file: OwnedFd) -> Self {
        self.group_of = Some(Arc::new(file));
        self
    }

    /// The group whose members are admitted now, if any.
    pub fn group(&self) -> Option<u32> {
        let fixed = self.group?;
        Some(self.group_of.as_ref().and_then(|f| rustix::fs::fstat(&**f).ok()).map_or(fixed, |st| st.st_gid))
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// Peers refused so far (by this policy and its clones).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Whether `peer` may connect, without counting.
    pub fn allows(&self, peer: Peer) -> bool {
        self.anyone
            || peer.uid == self.owner
            || peer.uid == 0
            || self.group().is_some_and(|g| peer.gid == g || supplementary_groups(peer.pid).contains(&g))
    }

    /// Checks the peer of a just accepted connection; a refusal is counted and logged (the first one and then
    /// at each power of two, so a peer that keeps trying cannot flood the log). The caller closes the
    /// connection on an error.
    pub fn admit(&self, stream: impl AsFd) -> Result<Peer, PeerError> {
        let result = match crate::sock::peer_credentials(stream) {
            Ok((pid, uid, gid)) if self.allows(Peer { pid, uid, gid }) => return Ok(Peer { pid, uid, gid }),
            Ok((pid, uid, gid)) => PeerError::Refused {
                pid,
                uid,
                gid,
                owner: self.owner,
                group: self.group().map(|g| format!(", group {g}")).unwrap_or_default(),
            },
            Err(e) => PeerError::Credentials(e.to_string()),
        };
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!("{}: {result}; connection closed ({n} refused so far)", self.label);
        }
        Err(result)
    }
}

/// The supplementary groups of process `pid` (its `Groups:` line); empty if it cannot be read (gone, or in
/// a pid namespace we cannot see: SO_PEERCRED gives pid 0 then).
fn supplementary_groups(pid: i32) -> Vec<u32> {
    if pid <= 0 {
        return Vec::new();
    }
    std::fs::read_to_string(format!("/proc/{pid}/status")).map(|s| parse_groups(&s)).unwrap_or_default()
}

fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| g.split_whitespace().filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    const OWNER: u32 = 1000;
    const GROUP: u32 = 4242;
    const OTHER: u32 = 65534;

    /// A socket pair made as `uid`/`gid`: each end's SO_PEERCRED names that user.
    fn pair_as(uid: u32, gid: u32) -> (UnixStream, UnixStream) {
        crate::test_util::as_user(uid, gid, || UnixStream::pair().expect("socketpair"))
    }

    #[test]
    fn a_peer_is_admitted_only_as_the_socket_mode_allows() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: making peers of other users needs root");
            return;
        }
        // (socket mode, peer uid, peer gid, admitted)
        let cases: &[(u32, u32, u32, bool)] = &[
            (0o600, OWNER, OTHER, true),
            (0o600, 0, 0, true),
            (0o600, OTHER, OTHER, false),
            (0o600, OTHER, GROUP, false),
            (0o640, OTHER, GROUP, false),
            (0o660, OTHER, GROUP, true),
            (0o660, OTHER, OTHER, false),
            (0o666, OTHER, OTHER, true),
        ];
        for &(mode, uid, gid, admitted) in cases {
            let policy = PeerPolicy::new(mode, OWNER, GROUP);
            let (ours, _theirs) = pair_as(uid, gid);
            let result = policy.admit(&ours);
            assert_eq!(result.is_ok(), admitted, "mode {mode:o} uid {uid} gid {gid}: {result:?}");
            if let Ok(peer) = result {
                assert_eq!((peer.uid, peer.gid), (uid, gid));
            }
            assert_eq!(policy.refused(), u64::from(!admitted), "mode {mode:o} uid {uid} gid {gid}");
        }
    }

    #[test]
    fn a_refusal_is_counted_by_every_clone_of_the_policy() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: making peers of other users needs root");
            return;
        }
        let policy = PeerPolicy::new(0o600, OWNER, GROUP);
        let clone = policy.clone();
        for _ in 0..3 {
            let (ours, _theirs) = pair_as(OTHER, OTHER);
            assert!(matches!(clone.admit(&ours), Err(PeerError::Refused { uid: OTHER, .. })));
        }
        assert_eq!(policy.refused(), 3);
    }

    #[test]
    fn the_admitted_group_is_the_socket_files_group_at_the_time_of_the_connection() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: making peers of other users needs root");
            return;
        }
        let dir = std::env::temp_dir().join(format!("peer-group-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("s");
        std::fs::write(&file, b"").unwrap();
        let handle = rustix::fs::open(&file, rustix::fs::OFlags::PATH, rustix::fs::Mode::empty()).unwrap();
        let policy = PeerPolicy::new(0o660, OWNER, 1234).with_group_of(handle);
        let chgrp = |g: u32| std::os::unix::fs::chown(&file, None, Some(g)).unwrap();
        // (the file's group, peer gid, admitted). Not group 0: the peer thread's supplementary groups are
        // read from its process, which is root's.
        for (group, gid, admitted) in [(1234, GROUP, false), (GROUP, GROUP, true), (OTHER, GROUP, false)] {
            chgrp(group);
            let (ours, _theirs) = pair_as(OTHER, gid);
            assert_eq!(policy.admit(&ours).is_ok(), admitted, "file group {group}, peer gid {gid}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn supplementary_groups_are_read_from_the_status_groups_line() {
        let status =
            "Name:\tqemu\nUid:\t107\t107\t107\t107\nGid:\t107\t107\t107\t107\nGroups:\t36 107 4242 \nNgid:\t0\n";
        assert_eq!(parse_groups(status), [36, 107, 4242]);
        assert_eq!(parse_groups("Groups:\t\n"), Vec::<u32>::new());
        assert_eq!(parse_groups("Name:\tx\n"), Vec::<u32>::new());
    }
}
