//! Errno names, so every reported syscall failure says which error the kernel gave (`EINVAL`, not 22).

/// The symbolic name of `errno` (Linux x86-64 numbering), or `errno N` for one not listed here.
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ENOTTY => "ENOTTY",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ESPIPE => "ESPIPE",
        libc::EROFS => "EROFS",
        libc::EPIPE => "EPIPE",
        libc::ERANGE => "ERANGE",
        libc::ENOSYS => "ENOSYS",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ECONNRESET => "ECONNRESET",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::ENOTCONN => "ENOTCONN",
        libc::ENOTSOCK => "ENOTSOCK",
        _ => return format!("errno {errno}"),
    };
    name.to_string()
}

/// The name of the errno an I/O error carries, or its text when it has none.
pub fn io_error_name(e: &std::io::Error) -> String {
    e.raw_os_error().map_or_else(|| e.to_string(), errno_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_the_hfi1_ioctls_return_have_their_names() {
        // asm-generic/errno-base.h numbers.
        let table = [(1, "EPERM"), (14, "EFAULT"), (16, "EBUSY"), (19, "ENODEV"), (22, "EINVAL"), (28, "ENOSPC")];
        for (n, name) in table {
            assert_eq!(errno_name(n), name);
        }
        assert_eq!(errno_name(4095), "errno 4095");
        assert_eq!(io_error_name(&std::io::Error::from_raw_os_error(9)), "EBADF");
    }
}
