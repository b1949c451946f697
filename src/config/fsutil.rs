//! Private files under `~/.airlock`: directories created 0700, files written atomically (a
//! temp file created 0600 in the same directory, synced, then renamed over the target), and
//! reads that refuse files other users could read.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Creates `dir` (and missing parents) with mode 0700. Existing directories are left as is.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Replaces `path` with `bytes` atomically; the file is 0600 from the moment it exists.
pub fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().ok_or_else(|| io::Error::other("path has no parent directory"))?;
    private_dir(dir)?;
    let tmp = synced_private_temp(dir, path, bytes)?;
    let result = std::fs::rename(&tmp, path)
        // The rename is durable once the directory entry is.
        .and_then(|()| File::open(dir)?.sync_all());
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Creates `path` with `bytes`, 0600, only if nothing is there: the content goes to a
/// temporary file in the same directory (which must exist), synced, then `link(2)`ed into
/// place, which never replaces a file. So the file is whole from the moment it exists, and of
/// two processes racing to make it, one wins and the other gets `AlreadyExists`. For keys,
/// which must never be overwritten.
pub fn create_private_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().ok_or_else(|| io::Error::other("path has no parent directory"))?;
    let tmp = synced_private_temp(dir, path, bytes)?;
    let result = std::fs::hard_link(&tmp, path).and_then(|()| File::open(dir)?.sync_all());
    let _ = std::fs::remove_file(&tmp);
    result
}

/// Writes `bytes` to a new 0600 temporary file beside `path` in `dir` (never through a
/// symlink) and syncs it; returns its path. Removed again if writing fails.
fn synced_private_temp(dir: &Path, path: &Path, bytes: &[u8]) -> io::Result<std::path::PathBuf> {
    let mut rnd = [0u8; 6];
    getrandom::fill(&mut rnd).map_err(|e| io::Error::other(e.to_string()))?;
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp-{}", hex::encode(rnd)));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map(|()| tmp)
}

/// Why a private file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PrivateReadError {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// Group or others may read or write it.
    #[error("mode {mode:04o} lets other users read or change it")]
    TooOpen { mode: u32 },
    #[error("it is owned by uid {owner}, not by you (uid {me})")]
    NotOwned { owner: u32, me: u32 },
}

/// Reads a file that must be private: a regular file (symlinks not followed) owned by the
/// caller, with no group/other permission bits. `Ok(None)` when it does not exist.
pub fn read_private(path: &Path) -> Result<Option<Vec<u8>>, PrivateReadError> {
    let Some(mut f) = open_private(path)? else { return Ok(None) };
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    Ok(Some(buf))
}

/// Opens a file that must be private, checked as [`read_private`] says, for a caller that reads
/// it its own way (the review token: bounded, into a zeroized buffer). Non-blocking, so a FIFO
/// in its place cannot hang the command.
pub fn open_private(path: &Path) -> Result<Option<std::fs::File>, PrivateReadError> {
    let f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    // fstat the opened file, so the checked file is the read one.
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other("not a regular file").into());
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(PrivateReadError::NotOwned { owner: meta.uid(), me });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(PrivateReadError::TooOpen { mode });
    }
    Ok(Some(f))
}

/// Largest configuration file read (far above any real policy; bounds a hostile repo's file).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads a configuration file that may be absent (`Ok(None)`): a regular file of at most
/// [`MAX_CONFIG_BYTES`]. With `follow_symlinks` false (the repo's file, which the agent's tree
/// holds) a symlink is refused. Opened non-blocking so a FIFO planted in its place cannot hang
/// the command; the checks are made on the opened file (`fstat`), not the path.
pub fn read_config(path: &Path, follow_symlinks: bool) -> io::Result<Option<Vec<u8>>> {
    let mut flags = libc::O_NONBLOCK;
    if !follow_symlinks {
        flags |= libc::O_NOFOLLOW;
    }
    let f = match OpenOptions::new().read(true).custom_flags(flags).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(io::Error::other(
                "it is a symlink; Airlock reads only a regular file here",
            ));
        }
        Err(e) => return Err(e),
    };
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other("it is not a regular file"));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(io::Error::other(format!(
            "it is larger than {MAX_CONFIG_BYTES} bytes; a policy file is a few lines of TOML"
        )));
    }
    let mut buf = Vec::new();
    f.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > MAX_CONFIG_BYTES {
        return Err(io::Error::other("it grew past the size limit while being read"));
    }
    Ok(Some(buf))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn create_private_new_never_replaces_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("key");
        create_private_new(&p, b"first").unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        let e = create_private_new(&p, b"second").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&p).unwrap(), b"first");
        // No temporary file is left behind either way.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn written_files_are_private_and_replaced_atomically() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a/b/file");
        write_private(&path, b"one").unwrap();
        write_private(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = std::fs::metadata(tmp.path().join("a/b")).unwrap().permissions().mode();
        assert_eq!(dmode & 0o777, 0o700);
        // No temp files left behind.
        assert_eq!(std::fs::read_dir(tmp.path().join("a/b")).unwrap().count(), 1);
        assert_eq!(read_private(&path).unwrap().unwrap(), b"two");
    }

    #[test]
    fn open_files_and_symlinks_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        std::fs::write(&path, "x").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(read_private(&path), Err(PrivateReadError::TooOpen { mode: 0o640 })));
        let link = tmp.path().join("l");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(matches!(read_private(&link), Err(PrivateReadError::Io(_))));
        assert!(read_private(&tmp.path().join("missing")).unwrap().is_none());
    }

    #[test]
    fn config_reads_refuse_fifos_big_files_and_repo_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Returns at once (O_NONBLOCK) instead of waiting for a writer.
        let err = read_config(&fifo, true).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let big = tmp.path().join("big");
        std::fs::write(&big, vec![b'#'; MAX_CONFIG_BYTES as usize + 1]).unwrap();
        assert!(read_config(&big, true).unwrap_err().to_string().contains("larger than"));
        let small = tmp.path().join("small");
        std::fs::write(&small, "x = 1").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&small, &link).unwrap();
        assert_eq!(read_config(&link, true).unwrap().unwrap(), b"x = 1");
        assert!(read_config(&link, false).unwrap_err().to_string().contains("symlink"));
        assert!(read_config(&tmp.path().join("none"), false).unwrap().is_none());
    }
}
