//! Opening a file the device model writes to on someone's say (a trace file, a wire capture): never through a
//! symbolic link, never blocking (a FIFO with no reader would hold the opening thread), and only a regular
//! file or the null device (a trace whose cost is measured without keeping it). A file it creates is 0600:
//! traces and captures show guest traffic.

#![forbid(unsafe_code)]

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum OutputError {
    #[error("{0}")]
    Open(std::io::Error),
    #[error("is a symbolic link; give the file it points to")]
    Symlink,
    #[error("is a {0}, not a regular file")]
    NotRegular(&'static str),
}

impl From<OutputError> for std::io::Error {
    fn from(e: OutputError) -> Self {
        match e {
            OutputError::Open(e) => e,
            other => std::io::Error::new(std::io::ErrorKind::InvalidInput, other.to_string()),
        }
    }
}

/// The null device's major and minor numbers (Documentation/admin-guide/devices.txt: 1 char, 3 = /dev/null).
const NULL_DEVICE: (u32, u32) = (1, 3);

/// How an existing file's content is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Writes go after it.
    Append,
    /// Left as it is: the caller truncates once it knows it will write ([`File::set_len`]).
    Keep,
}

/// Opens `path` for writing, creating it (0600) if missing: O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, then refuses
/// anything but a regular file or the null device. Nothing is truncated.
pub fn open(path: &Path, existing: Existing) -> Result<File, OutputError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .append(existing == Existing::Append)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => OutputError::Symlink,
            // open(2): a FIFO without a reader (opened for writing without blocking), a socket, or a device
            // special file without its device.
            Some(libc::ENXIO) => OutputError::NotRegular("FIFO without a reader, socket or absent device"),
            _ => OutputError::Open(e),
        })?;
    let meta = file.metadata().map_err(OutputError::Open)?;
    let kind = meta.file_type();
    let null = kind.is_char_device() && (libc::major(meta.rdev()), libc::minor(meta.rdev())) == NULL_DEVICE;
    let what = if kind.is_file() || null {
        return Ok(file);
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_char_device() {
        "character device"
    } else if kind.is_block_device() {
        "block device"
    } else if kind.is_socket() {
        "socket"
    } else {
        "directory or other special file"
    };
    Err(OutputError::NotRegular(what))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_a_regular_file_is_opened_and_nothing_blocks_or_is_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("file"), b"kept").unwrap();
        std::os::unix::fs::symlink(d.join("file"), d.join("link")).unwrap();
        rustix::fs::mkfifoat(rustix::fs::CWD, d.join("fifo"), rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(d.join("sock")).unwrap();
        // (name, opened, what the error says)
        let cases: &[(&str, bool, &str)] = &[
            ("file", true, ""),
            ("new", true, ""),
            ("link", false, "symbolic link"),
            ("fifo", false, "FIFO"),
            ("sock", false, "socket"),
            ("", false, "Is a directory"),
        ];
        assert!(open(Path::new("/dev/null"), Existing::Append).is_ok(), "the null device takes a trace");
        assert!(matches!(
            open(Path::new("/dev/zero"), Existing::Keep),
            Err(OutputError::NotRegular("character device"))
        ));
        for &(name, opened, says) in cases {
            for existing in [Existing::Append, Existing::Keep] {
                let r = open(&d.join(name), existing);
                assert_eq!(r.is_ok(), opened, "{name:?} {existing:?}: {r:?}");
                if let Err(e) = r {
                    assert!(e.to_string().contains(says), "{name:?}: {e}");
                }
            }
        }
        assert_eq!(std::fs::read(d.join("file")).unwrap(), b"kept", "not truncated");
        assert_eq!(std::fs::metadata(d.join("new")).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_fifo_with_a_reader_is_refused_at_once_too() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR).unwrap();
        // A reader opened without blocking: a writer's open would then succeed.
        let _reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
        assert!(matches!(open(&fifo, Existing::Keep), Err(OutputError::NotRegular("FIFO"))));
    }
}
