//! The btrfs ioctls the disk pool needs, with the kernel's structs
//! (include/uapi/linux/btrfs.h) restated here, sizes checked at compile time.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

const BTRFS_IOCTL_MAGIC: u8 = 0x94;
const BTRFS_PATH_NAME_MAX: usize = 4087;

/// Both limits: a sandbox should hit the same wall whether it counts shared or
/// exclusive extents (its layer shares nothing, so they agree).
const BTRFS_QGROUP_LIMIT_MAX_RFER: u64 = 1 << 0;
const BTRFS_QGROUP_LIMIT_MAX_EXCL: u64 = 1 << 1;

/// `struct btrfs_ioctl_vol_args`
#[repr(C)]
pub(crate) struct VolArgs {
    fd: i64,
    name: [u8; BTRFS_PATH_NAME_MAX + 1],
}

/// `struct btrfs_qgroup_limit`
#[repr(C)]
#[derive(Default)]
pub(crate) struct QgroupLimit {
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

/// `struct btrfs_ioctl_qgroup_limit_args`
#[repr(C)]
#[derive(Default)]
pub(crate) struct QgroupLimitArgs {
    qgroupid: u64,
    lim: QgroupLimit,
}

/// `BTRFS_SUBVOL_NAME_MAX`
const BTRFS_SUBVOL_NAME_MAX: usize = 4039;
/// `BTRFS_SUBVOL_RDONLY`: the snapshot is read-only from birth.
const BTRFS_SUBVOL_RDONLY: u64 = 1 << 1;

/// `struct btrfs_ioctl_vol_args_v2` (the qgroup-inherit union left unused).
#[repr(C)]
pub(crate) struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; BTRFS_SUBVOL_NAME_MAX + 1],
}

const _: () = assert!(std::mem::size_of::<VolArgs>() == 4096);
const _: () = assert!(std::mem::size_of::<VolArgsV2>() == 4096);
const _: () = assert!(std::mem::size_of::<QgroupLimitArgs>() == 48);

nix::ioctl_write_ptr!(btrfs_ioc_subvol_create, BTRFS_IOCTL_MAGIC, 14, VolArgs);
nix::ioctl_write_ptr!(btrfs_ioc_snap_destroy, BTRFS_IOCTL_MAGIC, 15, VolArgs);
nix::ioctl_write_ptr!(btrfs_ioc_snap_create_v2, BTRFS_IOCTL_MAGIC, 23, VolArgsV2);
// The kernel declares this one _IOR although it only reads the argument.
nix::ioctl_read!(
    btrfs_ioc_qgroup_limit,
    BTRFS_IOCTL_MAGIC,
    43,
    QgroupLimitArgs
);

fn vol_args(name: &CStr) -> Result<VolArgs, Errno> {
    let bytes = name.to_bytes();
    if bytes.len() > BTRFS_PATH_NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    let mut args = VolArgs {
        fd: 0,
        name: [0; BTRFS_PATH_NAME_MAX + 1],
    };
    args.name[..bytes.len()].copy_from_slice(bytes);
    Ok(args)
}

/// Creates subvolume `name` in the directory `parent`.
pub(crate) fn subvol_create(parent: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    let args = vol_args(name)?;
    // SAFETY: `args` is a fully initialised VolArgs with a NUL-terminated name and
    // lives across the call; the kernel only reads it.
    unsafe { btrfs_ioc_subvol_create(parent.as_raw_fd(), &args) }.map(drop)
}

/// Deletes subvolume `name` in the directory `parent`, contents and all.
pub(crate) fn snap_destroy(parent: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    let args = vol_args(name)?;
    // SAFETY: as in subvol_create; the kernel only reads `args`.
    unsafe { btrfs_ioc_snap_destroy(parent.as_raw_fd(), &args) }.map(drop)
}

/// Makes `name` in the directory `parent` a read-only snapshot of the
/// subvolume whose root directory `source` is. Extents are shared, so it
/// costs no copy.
pub(crate) fn snapshot_read_only(
    parent: BorrowedFd<'_>,
    name: &CStr,
    source: BorrowedFd<'_>,
) -> Result<(), Errno> {
    let bytes = name.to_bytes();
    if bytes.len() > BTRFS_SUBVOL_NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    let mut args = VolArgsV2 {
        fd: i64::from(source.as_raw_fd()),
        transid: 0,
        flags: BTRFS_SUBVOL_RDONLY,
        unused: [0; 4],
        name: [0; BTRFS_SUBVOL_NAME_MAX + 1],
    };
    args.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: `args` is a fully initialised VolArgsV2 with a NUL-terminated
    // name, living across the call; the kernel only reads it.
    unsafe { btrfs_ioc_snap_create_v2(parent.as_raw_fd(), &args) }.map(drop)
}

/// Limits the qgroup of the subvolume that `subvol` (its root directory) belongs to.
pub(crate) fn qgroup_limit(subvol: BorrowedFd<'_>, bytes: u64) -> Result<(), Errno> {
    let mut args = QgroupLimitArgs {
        // 0 means "the subvolume this fd is in".
        qgroupid: 0,
        lim: QgroupLimit {
            flags: BTRFS_QGROUP_LIMIT_MAX_RFER | BTRFS_QGROUP_LIMIT_MAX_EXCL,
            max_rfer: bytes,
            max_excl: bytes,
            ..QgroupLimit::default()
        },
    };
    // SAFETY: `args` is a fully initialised, properly aligned QgroupLimitArgs that
    // outlives the call; the kernel reads (and per the _IOR declaration may write)
    // exactly size_of::<QgroupLimitArgs>() bytes.
    unsafe { btrfs_ioc_qgroup_limit(subvol.as_raw_fd(), &mut args) }.map(drop)
}

#[cfg(test)]
mod tests {
    #[test]
    fn request_numbers_match_the_kernel() {
        // Values from the kernel headers (_IOW/_IOR with the sizes above).
        assert_eq!(nix::request_code_write!(0x94, 14, 4096), 0x5000_940E);
        assert_eq!(nix::request_code_write!(0x94, 15, 4096), 0x5000_940F);
        assert_eq!(nix::request_code_read!(0x94, 43, 48), 0x8030_942B);
        assert_eq!(nix::request_code_write!(0x94, 23, 4096), 0x5000_9417);
    }
}
