//! Translation of operating-system errors into the protocol's [`ErrorKind`],
//! shared by the file and process handlers so both report errno the same way.

use std::io;

use sandbox_proto::ErrorKind;

/// The protocol kind for an OS error; anything without a specific kind is `Other`
/// and keeps its text in the message.
pub fn io_kind(err: &io::Error) -> ErrorKind {
    match err.raw_os_error() {
        Some(libc::ENOENT) => ErrorKind::NotFound,
        Some(libc::EEXIST) => ErrorKind::AlreadyExists,
        Some(libc::EACCES | libc::EPERM) => ErrorKind::PermissionDenied,
        Some(libc::ENOTDIR) => ErrorKind::NotADirectory,
        Some(libc::EISDIR) => ErrorKind::IsADirectory,
        Some(libc::ENOTEMPTY) => ErrorKind::DirectoryNotEmpty,
        Some(libc::ENOSPC | libc::EDQUOT) => ErrorKind::NoSpace,
        Some(libc::EINVAL | libc::ENAMETOOLONG) => ErrorKind::InvalidInput,
        Some(_) => ErrorKind::Other,
        // std reports some argument problems (a NUL in a path) without an errno.
        None if err.kind() == io::ErrorKind::InvalidInput => ErrorKind::InvalidInput,
        None => ErrorKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping_matches_the_protocol() {
        let cases = [
            (libc::ENOENT, ErrorKind::NotFound),
            (libc::EEXIST, ErrorKind::AlreadyExists),
            (libc::EACCES, ErrorKind::PermissionDenied),
            (libc::EPERM, ErrorKind::PermissionDenied),
            (libc::ENOTDIR, ErrorKind::NotADirectory),
            (libc::EISDIR, ErrorKind::IsADirectory),
            (libc::ENOTEMPTY, ErrorKind::DirectoryNotEmpty),
            (libc::ENOSPC, ErrorKind::NoSpace),
            (libc::EDQUOT, ErrorKind::NoSpace),
            (libc::EINVAL, ErrorKind::InvalidInput),
            (libc::EIO, ErrorKind::Other),
        ];
        for (errno, kind) in cases {
            assert_eq!(
                io_kind(&io::Error::from_raw_os_error(errno)),
                kind,
                "errno {errno}"
            );
        }
    }
}
