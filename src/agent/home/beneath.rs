//! File operations below an agent home, all relative to directory fds: `openat2` beneath, no
//! symlinks, one component at a time; capped reads into zeroized buffers; writes as an `O_EXCL`
//! temp file renamed over the name.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::UnlinkatFlags;
use zeroize::Zeroizing;

use super::credentials::Secret;
use super::{DIR_MODE, FILE_MODE, HomeError, TEMP_PREFIX, dir_err, io_err};
use crate::fsat::{how, kind, read_flags};

/// Opens directory `name` in `dir`, never through a symlink (ELOOP for one).
pub(super) fn open_dir(dir: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    crate::fsat::open_dir(dir, Path::new(name))
}

/// Creates `name` (0700) in `dir` if absent, and opens it as a directory without following
/// symlinks. An existing directory is fine; an existing symlink is an error.
pub(super) fn mkdir_open(
    dir: BorrowedFd<'_>,
    path: &Path,
    name: &OsStr,
) -> Result<OwnedFd, HomeError> {
    let created = match nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(DIR_MODE)) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(e) => return Err(dir_err("create directory", path, e)),
    };
    let fd = open_dir(dir, name).map_err(|e| dir_err("open directory", path, e))?;
    if created {
        // The umask may have narrowed it oddly; we want exactly owner-only.
        nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(DIR_MODE))
            .map_err(|e| io_err("chmod", path, e))?;
    }
    Ok(fd)
}

/// Opens `rel` below `root` (at `root_path`) one component at a time, creating missing
/// directories if `create`. `None` if a directory is missing and `create` is false.
pub(super) fn open_dir_path(
    root: BorrowedFd<'_>,
    root_path: &Path,
    rel: &Path,
    create: bool,
) -> Result<Option<OwnedFd>, HomeError> {
    let mut fd = nix::unistd::dup(root).map_err(|e| io_err("dup", root_path, e))?;
    let mut path = root_path.to_path_buf();
    for part in rel.components() {
        let Component::Normal(name) = part else {
            return Err(HomeError::BadName { name: rel.to_string_lossy().into_owned() });
        };
        path.push(name);
        fd = if create {
            mkdir_open(fd.as_fd(), &path, name)?
        } else {
            match open_dir(fd.as_fd(), name) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => return Ok(None),
                Err(e) => return Err(dir_err("open directory", &path, e)),
            }
        };
    }
    Ok(Some(fd))
}

/// Reads `name` in `dir` (at `dir_path`): a regular file of at most `cap` bytes, never through a
/// symlink. `None` if absent.
pub(super) fn read_capped(
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    name: &OsStr,
    cap: u64,
) -> Result<Option<(Secret, FileStat)>, HomeError> {
    let path = dir_path.join(name);
    let fd = match nix::fcntl::openat2(dir, name, how(read_flags(), 0)) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(Errno::ELOOP) => return Err(HomeError::Symlink { path }),
        // A socket cannot be opened.
        Err(Errno::ENXIO) => return Err(HomeError::NotRegular { path }),
        Err(e) => return Err(io_err("open", &path, e)),
    };
    let st = nix::sys::stat::fstat(&fd).map_err(|e| io_err("stat", &path, e))?;
    if kind(&st) != SFlag::S_IFREG {
        return Err(HomeError::NotRegular { path });
    }
    if u64::try_from(st.st_size).unwrap_or(u64::MAX) > cap {
        return Err(HomeError::TooLarge { path, cap });
    }
    let size = usize::try_from(st.st_size).unwrap_or(0);
    let cap_bytes = usize::try_from(cap).unwrap_or(usize::MAX);
    let bytes =
        read_zeroizing(File::from(fd), size, cap_bytes).map_err(|e| io_err("read", &path, e))?;
    // It grew after the fstat.
    if bytes.len() > cap_bytes {
        return Err(HomeError::TooLarge { path, cap });
    }
    Ok(Some((bytes, st)))
}

/// Reads `file` (expected to hold `size` bytes) up to `cap + 1` bytes into a buffer that is
/// zeroized on drop; when the file outgrows it, the bytes move to a bigger one and the old one is
/// zeroized, so no copy is left in freed memory (as `read_to_end`'s reallocation would).
pub(super) fn read_zeroizing(
    mut file: File,
    size: usize,
    cap: usize,
) -> io::Result<Zeroizing<Vec<u8>>> {
    let limit = cap.saturating_add(1);
    let mut buf = Zeroizing::new(vec![0u8; size.saturating_add(1).min(limit)]);
    let mut filled = 0;
    loop {
        if filled == buf.len() {
            if buf.len() >= limit {
                break;
            }
            let mut bigger = Zeroizing::new(vec![0u8; buf.len().saturating_mul(2).min(limit)]);
            bigger[..filled].copy_from_slice(&buf[..filled]);
            buf = bigger;
        }
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// Replaces `name` in `dir` with `bytes`: a new temp file in the same directory (O_EXCL, 0600),
/// synced, then `renameat` over the name. A symlink at the name is replaced, not followed.
pub(super) fn write_replace(
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    name: &OsStr,
    bytes: &[u8],
) -> Result<(), HomeError> {
    let mut rnd = [0u8; 8];
    getrandom::fill(&mut rnd)
        .map_err(|e| io_err("random name for", dir_path, io::Error::other(e.to_string())))?;
    let tmp = format!("{TEMP_PREFIX}{}", hex::encode(rnd));
    let tmp_path = dir_path.join(&tmp);
    let fd = nix::fcntl::openat2(
        dir,
        tmp.as_str(),
        how(OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL, FILE_MODE),
    )
    .map_err(|e| io_err("create", &tmp_path, e))?;
    let mut file = File::from(fd);
    let result = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| io_err("write", &tmp_path, e))
        .and_then(|()| {
            nix::fcntl::renameat(dir, tmp.as_str(), dir, name).map_err(|e| match e {
                Errno::EISDIR | Errno::ENOTEMPTY | Errno::EEXIST => {
                    HomeError::DirInTheWay { path: dir_path.join(name) }
                }
                e => io_err("rename into place", &dir_path.join(name), e),
            })
        });
    if result.is_err() {
        let _ = nix::unistd::unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
    }
    result
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn reads_grow_into_fresh_buffers_up_to_the_cap() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        fs::write(&path, vec![7u8; 5000]).unwrap();
        // Told it is small (it grew after the fstat): still read whole, up to cap + 1.
        let got = read_zeroizing(File::open(&path).unwrap(), 10, 1 << 20).unwrap();
        assert_eq!(got.as_slice(), vec![7u8; 5000].as_slice());
        let capped = read_zeroizing(File::open(&path).unwrap(), 10, 100).unwrap();
        assert_eq!(capped.len(), 101);
    }
}
