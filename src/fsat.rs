//! Host-side access to agent-writable trees (the repo, the agent home, quarantine) through
//! directory fds (SECURITY §5): every lookup is `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)` below a directory fd, `fstatat(AT_SYMLINK_NOFOLLOW)` for metadata,
//! files must `fstat` as regular files and are read with a cap, writes are a temp file made
//! `O_EXCL` in the destination directory and `renameat` over the name (a session's scratch
//! copies, in a directory made for it: made once, `O_EXCL`, unsynced; [`create_scratch`]).
//! No symlink is followed, and no absolute path below the tree's root is ever used, so paths
//! longer than `PATH_MAX` and components swapped for symlinks cannot redirect anything.
//!
//! Owns the primitives and the bounded walk ([`walk`]); callers own the policy.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::UnlinkatFlags;

/// `open_how` with the fixed resolution rules: beneath the dir fd, no symlinks anywhere, no
/// magic links; never follow a trailing symlink; close on exec (openat2(2)).
pub fn how(flags: OFlag, mode: u32) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .mode(Mode::from_bits_truncate(mode))
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        )
}

/// The file type bits of a stat.
pub fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// Flags for reading a file that may be anything: a FIFO opens without blocking, a tty does not
/// become ours.
pub fn read_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY
}

/// Opens a trusted absolute directory path (the canonical repo path, `~/.airlock/...`) without
/// following a symlink at its last component.
pub fn open_root(path: &Path) -> io::Result<OwnedFd> {
    nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// Opens the directory `rel` below `dir` (any number of components, none a symlink). An empty
/// `rel` duplicates `dir`. A symlink in the way is `ELOOP` (for a trailing one, O_NOFOLLOW |
/// O_DIRECTORY says ENOTDIR; we look again so callers can tell it from a plain file).
pub fn open_dir(dir: BorrowedFd<'_>, rel: &Path) -> Result<OwnedFd, Errno> {
    let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    match nix::fcntl::openat2(dir, rel, how(OFlag::O_RDONLY | OFlag::O_DIRECTORY, 0)) {
        Err(Errno::ENOTDIR)
            if nix::sys::stat::fstatat(dir, rel, AtFlags::AT_SYMLINK_NOFOLLOW)
                .is_ok_and(|st| kind(&st) == SFlag::S_IFLNK) =>
        {
            Err(Errno::ELOOP)
        }
        other => other,
    }
}

/// `lstat` of `name` in `dir`; `None` when absent (or a parent is not a directory).
pub fn lstat_at(dir: BorrowedFd<'_>, name: &Path) -> Result<Option<FileStat>, Errno> {
    match nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT | Errno::ENOTDIR) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `lstat` of `rel` below `dir` without following a symlinked parent: the parent of `rel` is
/// opened with [`open_dir`] first. `Ok(None)` when absent; `Err(ELOOP)` when a parent is a
/// symlink.
pub fn lstat_beneath(dir: BorrowedFd<'_>, rel: &Path) -> Result<Option<FileStat>, Errno> {
    let (parent, name) = split(rel);
    match parent {
        None => lstat_at(dir, name),
        Some(p) => match open_dir(dir, p) {
            Ok(pfd) => lstat_at(pfd.as_fd(), name),
            Err(Errno::ENOENT | Errno::ENOTDIR) => Ok(None),
            Err(e) => Err(e),
        },
    }
}

/// `(parent, last component)` of a relative path.
pub fn split(rel: &Path) -> (Option<&Path>, &Path) {
    let name = rel.file_name().map(Path::new).unwrap_or(rel);
    let parent = rel.parent().filter(|p| !p.as_os_str().is_empty());
    (parent, name)
}

/// Why a capped read failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("a symlink is in the way (never followed)")]
    Symlink,
    #[error("not a regular file")]
    NotRegular,
    #[error("larger than {cap} bytes")]
    TooLarge { cap: u64 },
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Reads `rel` below `dir`: a regular file of at most `cap` bytes, never through a symlink.
/// `None` when absent.
pub fn read_capped(
    dir: BorrowedFd<'_>,
    rel: &Path,
    cap: u64,
) -> Result<Option<(Vec<u8>, FileStat)>, ReadError> {
    let fd = match nix::fcntl::openat2(dir, rel, how(read_flags(), 0)) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(None),
        Err(Errno::ELOOP | Errno::EXDEV) => return Err(ReadError::Symlink),
        // A socket cannot be opened.
        Err(Errno::ENXIO) => return Err(ReadError::NotRegular),
        Err(e) => return Err(ReadError::Io(e.into())),
    };
    let st = nix::sys::stat::fstat(&fd).map_err(io::Error::from)?;
    if kind(&st) != SFlag::S_IFREG {
        return Err(ReadError::NotRegular);
    }
    if u64::try_from(st.st_size).unwrap_or(u64::MAX) > cap {
        return Err(ReadError::TooLarge { cap });
    }
    let mut bytes = Vec::new();
    File::from(fd).take(cap + 1).read_to_end(&mut bytes)?;
    // It grew after the fstat.
    if bytes.len() as u64 > cap {
        return Err(ReadError::TooLarge { cap });
    }
    Ok(Some((bytes, st)))
}

const TEMP_PREFIX: &str = ".airlock-tmp-";

/// A fresh random name for a temp file or an item (`<prefix><16 hex>`).
pub fn random_name(prefix: &str) -> io::Result<String> {
    let mut rnd = [0u8; 8];
    getrandom::fill(&mut rnd).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(format!("{prefix}{}", hex::encode(rnd)))
}

/// Replaces `name` in `dir` with `bytes` (mode `mode`): a temp file created `O_EXCL` in the same
/// directory, synced, then `renameat` over the name. A symlink at the name is replaced, not
/// followed.
pub fn write_replace(dir: BorrowedFd<'_>, name: &OsStr, bytes: &[u8], mode: u32) -> io::Result<()> {
    let tmp = random_name(TEMP_PREFIX)?;
    let fd = nix::fcntl::openat2(
        dir,
        tmp.as_str(),
        how(OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL, mode),
    )?;
    let mut file = File::from(fd);
    let result = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| nix::fcntl::renameat(dir, tmp.as_str(), dir, name).map_err(io::Error::from));
    if result.is_err() {
        let _ = nix::unistd::unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
    }
    result
}

/// Creates `name` in `dir` (mode `mode`) with `bytes`, `O_EXCL`, never through a symlink, and
/// does not sync it: for a session's scratch copies in a directory made for that session,
/// which a crash makes worthless anyway. (An fsync is an ext4 journal commit, ~0.5 ms here and
/// far more on a busy laptop disk, on the path before the sandbox starts; issue 22.)
pub fn create_scratch(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    bytes: &[u8],
    mode: u32,
) -> io::Result<()> {
    let fd = nix::fcntl::openat2(
        dir,
        name,
        how(OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL, mode),
    )?;
    let mut file = File::from(fd);
    let written = file.write_all(bytes);
    if written.is_err() {
        // A short copy must not be mistaken for the whole file.
        let _ = nix::unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir);
    }
    written
}

/// Creates directory `name` in `dir` (mode `mode`) if absent and opens it, never through a
/// symlink.
pub fn mkdir_open(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> Result<OwnedFd, Errno> {
    match nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(mode)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(e),
    }
    open_dir(dir, Path::new(name))
}

/// Creates every component of `rel` below `dir` (mode `mode`) and opens the last one.
pub fn mkdir_all(dir: BorrowedFd<'_>, rel: &Path, mode: u32) -> Result<OwnedFd, Errno> {
    let mut fd = open_dir(dir, Path::new(""))?;
    for part in rel.components() {
        let std::path::Component::Normal(name) = part else { return Err(Errno::EINVAL) };
        fd = mkdir_open(fd.as_fd(), name, mode)?;
    }
    Ok(fd)
}

/// Gives the owner `rwx` on directory `name` in `dir` if it lacks it (an agent may leave a
/// directory `chmod 000`; the host side must still be able to look inside and move it).
/// Only for directories the caller owns; anything else is left alone.
pub fn grant_owner_dir_access(dir: BorrowedFd<'_>, name: &OsStr, st: &FileStat) -> bool {
    let me = nix::unistd::geteuid().as_raw();
    if kind(st) != SFlag::S_IFDIR || st.st_uid != me || st.st_mode & 0o700 == 0o700 {
        return false;
    }
    let mode = Mode::from_bits_truncate((st.st_mode & 0o7777) | 0o700);
    nix::sys::stat::fchmodat(dir, name, mode, nix::sys::stat::FchmodatFlags::NoFollowSymlink)
        .is_ok()
}

/// Removes `name` in `dir` and, for a directory, everything below it, never following a
/// symlink. Directories left unreadable are opened up first (owner only).
pub fn remove_tree(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let Some(st) = lstat_at(dir, Path::new(name))? else { return Ok(()) };
    if kind(&st) != SFlag::S_IFDIR {
        return nix::unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir).map_err(Into::into);
    }
    // An explicit stack, so depth costs heap, not stack; each frame holds one fd.
    let mut stack: Vec<(OwnedFd, Vec<OsString>)> = Vec::new();
    grant_owner_dir_access(dir, name, &st);
    let top = open_dir(dir, Path::new(name))?;
    let names = list(top.as_fd())?;
    stack.push((top, names));
    while let Some((fd, names)) = stack.last_mut() {
        let Some(child) = names.pop() else {
            stack.pop();
            continue;
        };
        let fd = fd.as_fd();
        let Some(cst) = lstat_at(fd, Path::new(&child))? else { continue };
        if kind(&cst) == SFlag::S_IFDIR {
            grant_owner_dir_access(fd, &child, &cst);
            match nix::unistd::unlinkat(fd, child.as_os_str(), UnlinkatFlags::RemoveDir) {
                Ok(()) => continue,
                Err(Errno::ENOTEMPTY | Errno::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
            let sub = open_dir(fd, Path::new(&child))?;
            let sub_names = list(sub.as_fd())?;
            // Revisit `child` after its contents are gone.
            if let Some((_, names)) = stack.last_mut() {
                names.push(child);
            }
            stack.push((sub, sub_names));
        } else {
            nix::unistd::unlinkat(fd, child.as_os_str(), UnlinkatFlags::NoRemoveDir)?;
        }
    }
    nix::unistd::unlinkat(dir, name, UnlinkatFlags::RemoveDir).map_err(Into::into)
}

/// The names in directory `dir` (without `.` and `..`), sorted.
pub fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    Ok(list_typed(dir)?.into_iter().map(|(name, _)| name).collect())
}

/// The entries of directory `dir` with their type as `getdents` reports it (`None` where the
/// filesystem does not say: ask `fstatat`), sorted by name. Cheaper than a stat per entry.
pub fn list_typed(dir: BorrowedFd<'_>) -> io::Result<Vec<(OsString, Option<SFlag>)>> {
    use nix::dir::Type;
    let fd = open_dir(dir, Path::new(""))?;
    let mut d = nix::dir::Dir::from_fd(fd)?;
    let mut out: Vec<(OsString, Option<SFlag>)> = Vec::new();
    for entry in d.iter() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let ty = entry.file_type().map(|t| match t {
            Type::Directory => SFlag::S_IFDIR,
            Type::Symlink => SFlag::S_IFLNK,
            Type::File => SFlag::S_IFREG,
            Type::Fifo => SFlag::S_IFIFO,
            Type::Socket => SFlag::S_IFSOCK,
            Type::CharacterDevice => SFlag::S_IFCHR,
            Type::BlockDevice => SFlag::S_IFBLK,
        });
        out.push((OsStr::from_bytes(name).to_owned(), ty));
    }
    out.sort();
    Ok(out)
}

/// Caps of [`copy_tree`].
#[derive(Debug, Clone, Copy)]
pub struct CopyCaps {
    /// Largest single file copied; bigger ones are replaced by a note.
    pub file: u64,
    /// Directory levels descended.
    pub depth: usize,
}

/// Copies `name` in `src` to `dst_name` in `dst` (which must not exist) without following
/// symlinks: regular files (capped; bigger ones become `<name>.skipped` notes), directories,
/// and symlinks as symlinks; other kinds are noted and skipped. Returns what was not copied.
pub fn copy_tree(
    src: BorrowedFd<'_>,
    name: &OsStr,
    dst: BorrowedFd<'_>,
    dst_name: &OsStr,
    caps: CopyCaps,
) -> io::Result<Vec<String>> {
    let mut skipped = Vec::new();
    copy_one(src, name, dst, dst_name, caps, 0, Path::new(name), &mut skipped)?;
    Ok(skipped)
}

#[allow(clippy::too_many_arguments)]
fn copy_one(
    src: BorrowedFd<'_>,
    name: &OsStr,
    dst: BorrowedFd<'_>,
    dst_name: &OsStr,
    caps: CopyCaps,
    depth: usize,
    rel: &Path,
    skipped: &mut Vec<String>,
) -> io::Result<()> {
    let Some(st) = lstat_at(src, Path::new(name))? else { return Ok(()) };
    let note = |skipped: &mut Vec<String>, why: &str| {
        skipped.push(format!("{}: {why}", rel.display()));
    };
    match kind(&st) {
        SFlag::S_IFLNK => {
            let target = nix::fcntl::readlinkat(src, name)?;
            nix::unistd::symlinkat(target.as_os_str(), dst, dst_name)?;
        }
        SFlag::S_IFDIR => {
            if depth >= caps.depth {
                note(skipped, "too deep, not copied");
                return Ok(());
            }
            grant_owner_dir_access(src, name, &st);
            let sfd = open_dir(src, Path::new(name))?;
            nix::sys::stat::mkdirat(dst, dst_name, Mode::from_bits_truncate(0o700))?;
            let dfd = open_dir(dst, Path::new(dst_name))?;
            for child in list(sfd.as_fd())? {
                copy_one(
                    sfd.as_fd(),
                    &child,
                    dfd.as_fd(),
                    &child,
                    caps,
                    depth + 1,
                    &rel.join(&child),
                    skipped,
                )?;
            }
        }
        SFlag::S_IFREG => match read_capped(src, Path::new(name), caps.file) {
            Ok(Some((bytes, _))) => {
                let fd = nix::fcntl::openat2(
                    dst,
                    dst_name,
                    how(OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL, 0o600),
                )?;
                File::from(fd).write_all(&bytes)?;
            }
            Ok(None) => {}
            Err(e) => note(skipped, &e.to_string()),
        },
        _ => note(skipped, "not a regular file, directory or symlink"),
    }
    Ok(())
}

/// One entry seen by [`walk`].
#[derive(Debug)]
pub struct Entry<'a> {
    /// The directory holding it.
    pub dir: BorrowedFd<'a>,
    pub name: &'a OsStr,
    /// Its path relative to the walk's root.
    pub rel: &'a Path,
    pub st: &'a FileStat,
    /// 1 for the root's own entries.
    pub depth: usize,
}

/// What [`walk`] does after visiting a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Descend,
    Skip,
}

/// What a walk saw, for the caller's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalkStats {
    pub entries: u64,
    /// Directories at the depth limit, not entered (the visitor saw them with `depth == max`).
    pub too_deep: Vec<PathBuf>,
    /// Directories that could not be opened even after granting owner access.
    pub unreadable: Vec<PathBuf>,
}

/// Visits every entry below `root` depth-first in name order, never following a symlink.
/// Directories deeper than `max_depth` are not entered; they are listed in
/// [`WalkStats::too_deep`] for the caller to act on as a whole (a real tree is never that deep;
/// an agent's may be, and open fds grow with depth).
pub fn walk(
    root: BorrowedFd<'_>,
    max_depth: usize,
    visit: &mut dyn FnMut(&Entry<'_>) -> Step,
) -> io::Result<WalkStats> {
    struct Frame {
        fd: OwnedFd,
        rel: PathBuf,
        names: std::vec::IntoIter<OsString>,
    }
    let mut stats = WalkStats::default();
    let top = open_dir(root, Path::new(""))?;
    let names = list(top.as_fd())?.into_iter();
    let mut stack = vec![Frame { fd: top, rel: PathBuf::new(), names }];
    while let Some(frame) = stack.last_mut() {
        let Some(name) = frame.names.next() else {
            stack.pop();
            continue;
        };
        let depth = stack.len();
        let frame = match stack.last() {
            Some(f) => f,
            None => break,
        };
        let dir = frame.fd.as_fd();
        let rel = frame.rel.join(&name);
        let st = match lstat_at(dir, Path::new(&name)) {
            Ok(Some(st)) => st,
            Ok(None) => continue,
            // One entry that cannot be looked at never ends the walk.
            Err(_) => {
                stats.unreadable.push(rel);
                continue;
            }
        };
        stats.entries += 1;
        let step = visit(&Entry { dir, name: &name, rel: &rel, st: &st, depth });
        if kind(&st) != SFlag::S_IFDIR || step == Step::Skip {
            continue;
        }
        if depth >= max_depth {
            stats.too_deep.push(rel);
            continue;
        }
        // A directory the caller owns but may not search (`chmod 600`) opens, yet nothing in it
        // can be looked at: give the owner rwx back before going in.
        grant_owner_dir_access(dir, &name, &st);
        let sub = open_dir(dir, Path::new(&name));
        let sub = match sub {
            Ok(fd) => fd,
            // Gone since the stat.
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => continue,
            Err(_) => {
                stats.unreadable.push(rel);
                continue;
            }
        };
        let names = match list(sub.as_fd()) {
            Ok(n) => n.into_iter(),
            Err(_) => {
                stats.unreadable.push(rel);
                continue;
            }
        };
        stack.push(Frame { fd: sub, rel, names });
    }
    Ok(stats)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn root_fd(p: &Path) -> OwnedFd {
        open_root(p).unwrap()
    }

    #[test]
    fn a_scratch_copy_is_made_once_with_its_mode_and_never_through_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        fs::create_dir(t.join("w")).unwrap();
        fs::write(t.join("outside"), "host").unwrap();
        symlink(t.join("outside"), t.join("w/link")).unwrap();
        let fd = root_fd(&t.join("w"));
        create_scratch(fd.as_fd(), OsStr::new("config"), b"[core]\n", 0o640).unwrap();
        assert_eq!(fs::read(t.join("w/config")).unwrap(), b"[core]\n");
        let mode = fs::metadata(t.join("w/config")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & !0o022, 0o640 & !0o022, "the mode asked for, less the umask");
        // Made once: an existing name is an error, and its content stays.
        let again = create_scratch(fd.as_fd(), OsStr::new("config"), b"other", 0o600);
        assert_eq!(again.unwrap_err().raw_os_error(), Some(libc::EEXIST));
        assert_eq!(fs::read(t.join("w/config")).unwrap(), b"[core]\n");
        // A symlink at the name is not written through.
        assert!(create_scratch(fd.as_fd(), OsStr::new("link"), b"x", 0o600).is_err());
        assert_eq!(fs::read(t.join("outside")).unwrap(), b"host");
    }

    #[test]
    fn reads_never_follow_symlinks_anywhere() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        fs::create_dir_all(t.join("r/d")).unwrap();
        fs::write(t.join("secret"), "s").unwrap();
        fs::write(t.join("r/d/f"), "ok").unwrap();
        symlink(t.join("secret"), t.join("r/link")).unwrap();
        symlink(t, t.join("r/up")).unwrap();
        let fd = root_fd(&t.join("r"));
        assert_eq!(read_capped(fd.as_fd(), Path::new("d/f"), 10).unwrap().unwrap().0, b"ok");
        assert!(matches!(read_capped(fd.as_fd(), Path::new("link"), 10), Err(ReadError::Symlink)));
        assert!(matches!(
            read_capped(fd.as_fd(), Path::new("up/secret"), 10),
            Err(ReadError::Symlink)
        ));
        assert!(matches!(
            read_capped(fd.as_fd(), Path::new("../secret"), 10),
            Err(ReadError::Symlink | ReadError::Io(_))
        ));
        assert!(matches!(
            read_capped(fd.as_fd(), Path::new("d/f"), 1),
            Err(ReadError::TooLarge { .. })
        ));
        assert!(read_capped(fd.as_fd(), Path::new("absent"), 1).unwrap().is_none());
        assert_eq!(lstat_beneath(fd.as_fd(), Path::new("up/secret")), Err(Errno::ELOOP));
    }

    #[test]
    fn walk_visits_everything_without_following_and_stops_at_depth() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        fs::create_dir_all(t.join("r/a/b/c/d")).unwrap();
        fs::write(t.join("r/a/x"), "").unwrap();
        symlink("/", t.join("r/a/root")).unwrap();
        let mut seen = Vec::new();
        let stats = walk(root_fd(&t.join("r")).as_fd(), 3, &mut |e| {
            seen.push(e.rel.display().to_string());
            Step::Descend
        })
        .unwrap();
        assert_eq!(seen, ["a", "a/b", "a/b/c", "a/root", "a/x"]);
        assert_eq!(stats.too_deep, [PathBuf::from("a/b/c")]);
    }

    #[test]
    fn walk_and_remove_get_through_unreadable_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        fs::create_dir_all(t.join("r/locked/inner")).unwrap();
        fs::write(t.join("r/locked/inner/f"), "x").unwrap();
        fs::set_permissions(t.join("r/locked/inner"), fs::Permissions::from_mode(0o000)).unwrap();
        fs::set_permissions(t.join("r/locked"), fs::Permissions::from_mode(0o000)).unwrap();
        let fd = root_fd(&t.join("r"));
        let mut seen = Vec::new();
        walk(fd.as_fd(), 10, &mut |e| {
            seen.push(e.rel.display().to_string());
            Step::Descend
        })
        .unwrap();
        assert!(seen.contains(&"locked/inner/f".to_string()), "{seen:?}");
        fs::set_permissions(t.join("r/locked"), fs::Permissions::from_mode(0o000)).unwrap();
        remove_tree(fd.as_fd(), OsStr::new("locked")).unwrap();
        assert!(fs::symlink_metadata(t.join("r/locked")).is_err());
    }

    #[test]
    fn copy_tree_keeps_links_as_links_and_caps_files() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        fs::create_dir_all(t.join("src/d")).unwrap();
        fs::create_dir_all(t.join("dst")).unwrap();
        fs::write(t.join("src/d/small"), "s").unwrap();
        fs::write(t.join("src/d/big"), vec![b'x'; 100]).unwrap();
        symlink("/etc/passwd", t.join("src/d/l")).unwrap();
        let skipped = copy_tree(
            root_fd(&t.join("src")).as_fd(),
            OsStr::new("d"),
            root_fd(&t.join("dst")).as_fd(),
            OsStr::new("copy"),
            CopyCaps { file: 10, depth: 8 },
        )
        .unwrap();
        assert_eq!(fs::read_to_string(t.join("dst/copy/small")).unwrap(), "s");
        assert_eq!(fs::read_link(t.join("dst/copy/l")).unwrap(), PathBuf::from("/etc/passwd"));
        assert!(!t.join("dst/copy/big").exists());
        assert_eq!(skipped.len(), 1, "{skipped:?}");
    }

    #[test]
    fn write_replace_swaps_a_symlink_instead_of_writing_through_it() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        fs::create_dir_all(t.join("r")).unwrap();
        fs::write(t.join("victim"), "v").unwrap();
        symlink(t.join("victim"), t.join("r/f")).unwrap();
        write_replace(root_fd(&t.join("r")).as_fd(), OsStr::new("f"), b"new", 0o600).unwrap();
        assert_eq!(fs::read_to_string(t.join("victim")).unwrap(), "v");
        assert_eq!(fs::read_to_string(t.join("r/f")).unwrap(), "new");
    }
}
