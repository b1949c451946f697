//! Which directory under `~/.airlock/logs/` holds one checkout's audit, journal and session
//! files: `<name>/` for the first checkout of that name, `<name>-<key8>/` for any other (and
//! always for a name that sanitizes to dashes only), where `<key8>` is the first 8 hex digits
//! of the checkout's repo key ([`crate::repo::Repo::key`]). A `.repo-path` file in the
//! directory records whose it is (the checkout's canonical host path), so two checkouts with
//! the same name never share a trail.
//!
//! Every reader and writer (the daemon's sessions, `airlock logs`, later the review publish)
//! asks [`claim`] or [`locate`]; both decide under `flock(2)` on `~/.airlock/logs/.lock`, so
//! the CLI, the daemon and two concurrent sessions agree. A directory written before this rule
//! (no `.repo-path`) is adopted by the first checkout of its name that uses it. `~/.airlock` is
//! never bound into a sandbox, so an agent cannot write or redirect `.repo-path`.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::files::create_private_dir;

/// The file in a log directory naming the checkout it belongs to.
pub const REPO_PATH_FILE: &str = ".repo-path";

/// The lock file (in `~/.airlock/logs/`) every choice of a directory is made under.
const LOCK_FILE: &str = ".lock";

#[derive(Debug, thiserror::Error)]
pub enum LogDirError {
    #[error("cannot choose the log directory in {path}: {source}; check its permissions")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "every log directory for repo {name} ({candidates}) already belongs to another checkout \
         (see their {REPO_PATH_FILE} files); move or remove one of them under {root}"
    )]
    Taken { name: String, candidates: String, root: PathBuf },
}

/// The hex SHA-256 of a canonical repo path (the repo key is `<name>-<first 8 of it>`).
pub fn path_digest(repo_path: &Path) -> String {
    hex::encode(Sha256::digest(repo_path.as_os_str().as_bytes()))
}

/// The repo key of a checkout: `<name>-<8 hex of SHA-256(canonical path)>`.
pub fn repo_key(name: &str, repo_path: &Path) -> String {
    format!("{name}-{}", &path_digest(repo_path)[..8])
}

/// Directory names to try, in order: `<name>` (unless the name is dashes only), then
/// `<name>-<key8>`, then `<name>-<key16>` (only if `<name>-<key8>` is a literal name already
/// taken by another checkout).
fn candidates(name: &str, repo_path: &Path) -> Vec<String> {
    let digest = path_digest(repo_path);
    let mut out = Vec::with_capacity(3);
    if !name.bytes().all(|b| b == b'-') {
        out.push(name.to_owned());
    }
    out.push(format!("{name}-{}", &digest[..8]));
    out.push(format!("{name}-{}", &digest[..16]));
    out
}

/// Who a directory belongs to.
enum Owner {
    Missing,
    /// Exists without `.repo-path` (written before this rule).
    Unclaimed,
    Path(Vec<u8>),
}

fn owner(dir: &Path) -> Result<Owner, LogDirError> {
    let io_err = |source| LogDirError::Io { path: dir.to_owned(), source };
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {}
        // A file or symlink under ~/.airlock/logs is not ours to follow or replace.
        Ok(_) => return Ok(Owner::Path(Vec::new())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Owner::Missing),
        Err(e) => return Err(io_err(e)),
    }
    match std::fs::read(dir.join(REPO_PATH_FILE)) {
        Ok(mut bytes) => {
            if bytes.last() == Some(&b'\n') {
                bytes.pop();
            }
            Ok(Owner::Path(bytes))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Owner::Unclaimed),
        Err(e) => Err(io_err(e)),
    }
}

/// Writes `.repo-path` (the path and a newline) through a temporary file and `rename(2)`, so a
/// reader sees the whole path or no file.
fn record_owner(dir: &Path, repo_path: &Path) -> Result<(), LogDirError> {
    let target = dir.join(REPO_PATH_FILE);
    let tmp = dir.join(format!("{REPO_PATH_FILE}.{}.tmp", std::process::id()));
    let io_err = |source| LogDirError::Io { path: target.clone(), source };
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(io_err)?;
    let mut bytes = repo_path.as_os_str().as_bytes().to_vec();
    bytes.push(b'\n');
    file.write_all(&bytes).and_then(|()| file.sync_all()).map_err(io_err)?;
    std::fs::rename(&tmp, &target).map_err(io_err)
}

/// Holds `~/.airlock/logs/.lock` exclusively while alive.
struct RootLock(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

fn lock_root(root: &Path) -> Result<RootLock, LogDirError> {
    let path = root.join(LOCK_FILE);
    let io_err = |source| LogDirError::Io { path: path.clone(), source };
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(io_err)?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map(RootLock)
        .map_err(|(_, e)| io_err(io::Error::from(e)))
}

/// What [`choose`] may do when no directory belongs to the checkout yet.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Create the directory (a writer).
    Create,
    /// Only adopt an existing unclaimed one (a reader: it never makes directories).
    Lookup,
}

/// Under the lock: the first candidate that is ours, or (in order) that can be adopted or made.
fn choose(
    root: &Path,
    name: &str,
    repo_path: &Path,
    mode: Mode,
) -> Result<Option<PathBuf>, LogDirError> {
    let ours = repo_path.as_os_str().as_bytes();
    let names = candidates(name, repo_path);
    // Ours wins wherever it is: a checkout keeps its directory even after the first-named one
    // was removed and recreated by another checkout.
    let mut free: Option<(PathBuf, bool)> = None;
    for candidate in &names {
        let dir = root.join(candidate);
        match owner(&dir)? {
            Owner::Path(p) if p == ours => return Ok(Some(dir)),
            Owner::Path(_) => {}
            Owner::Unclaimed => {
                free.get_or_insert((dir, true));
            }
            Owner::Missing => {
                free.get_or_insert((dir, false));
            }
        }
    }
    match free {
        Some((dir, true)) => {
            record_owner(&dir, repo_path)?;
            Ok(Some(dir))
        }
        Some((dir, false)) if mode == Mode::Create => {
            create_private_dir(&dir)
                .map_err(|source| LogDirError::Io { path: dir.clone(), source })?;
            record_owner(&dir, repo_path)?;
            Ok(Some(dir))
        }
        Some(_) => Ok(None),
        None => Err(LogDirError::Taken {
            name: name.to_owned(),
            candidates: names.join(", "),
            root: root.to_owned(),
        }),
    }
}

/// The log directory of the checkout at `repo_path` (canonical) named `name` under `root`
/// (`~/.airlock/logs`), created with its `.repo-path` if it has none yet. For writers.
pub fn claim(root: &Path, name: &str, repo_path: &Path) -> Result<PathBuf, LogDirError> {
    create_private_dir(root).map_err(|source| LogDirError::Io { path: root.to_owned(), source })?;
    let _lock = lock_root(root)?;
    // Mode::Create never answers None.
    choose(root, name, repo_path, Mode::Create)?.ok_or_else(|| LogDirError::Taken {
        name: name.to_owned(),
        candidates: candidates(name, repo_path).join(", "),
        root: root.to_owned(),
    })
}

/// The checkout's existing log directory, for readers: `None` if it has none yet (nothing is
/// created, but an unclaimed directory of its name is adopted, as [`claim`] would).
pub fn locate(root: &Path, name: &str, repo_path: &Path) -> Result<Option<PathBuf>, LogDirError> {
    if !root.is_dir() {
        return Ok(None);
    }
    let _lock = lock_root(root)?;
    choose(root, name, repo_path, Mode::Lookup)
}

/// Every log directory under `root` with the checkout it belongs to (`None`: unclaimed), sorted
/// by directory name; for `airlock logs --all-repos`.
pub fn all(root: &Path) -> Result<Vec<(PathBuf, Option<PathBuf>)>, LogDirError> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(LogDirError::Io { path: root.to_owned(), source }),
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        // `.lock` is a file; a repo name may itself start with a dot (`.dotfiles`).
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = match owner(&dir)? {
            Owner::Path(p) if !p.is_empty() => Some(PathBuf::from(std::ffi::OsStr::from_bytes(&p))),
            _ => None,
        };
        out.push((dir, path));
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn repo_path_of(dir: &Path) -> String {
        std::fs::read_to_string(dir.join(REPO_PATH_FILE)).unwrap()
    }

    #[test]
    fn first_checkout_gets_the_name_and_others_the_key() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("logs");
        let (a, b) = (Path::new("/src/a/pay"), Path::new("/src/b/pay"));
        let da = claim(&root, "pay", a).unwrap();
        assert_eq!(da, root.join("pay"));
        assert_eq!(repo_path_of(&da), "/src/a/pay\n");
        let db = claim(&root, "pay", b).unwrap();
        assert_eq!(db, root.join(repo_key("pay", b)));
        assert_eq!(repo_path_of(&db), "/src/b/pay\n");
        // Stable on every later call, from either side.
        assert_eq!(claim(&root, "pay", a).unwrap(), da);
        assert_eq!(locate(&root, "pay", b).unwrap(), Some(db));
        assert_eq!(locate(&root, "pay", Path::new("/src/c/pay")).unwrap(), None);
        assert!(!root.join(repo_key("pay", Path::new("/src/c/pay"))).exists());
    }

    #[test]
    fn dash_names_always_get_the_key() {
        let tmp = tempfile::tempdir().unwrap();
        let p = Path::new("/src/日本");
        let d = claim(tmp.path(), "--", p).unwrap();
        assert_eq!(d, tmp.path().join(repo_key("--", p)));
        assert!(!tmp.path().join("--").exists());
    }

    #[test]
    fn legacy_directories_are_adopted_once() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("pay")).unwrap();
        std::fs::write(tmp.path().join("pay/audit-2026-01-01.jsonl"), "").unwrap();
        let a = Path::new("/a/pay");
        assert_eq!(locate(tmp.path(), "pay", a).unwrap(), Some(tmp.path().join("pay")));
        assert_eq!(repo_path_of(&tmp.path().join("pay")), "/a/pay\n");
        let b = claim(tmp.path(), "pay", Path::new("/b/pay")).unwrap();
        assert_ne!(b, tmp.path().join("pay"));
    }

    #[test]
    fn a_literal_key_named_directory_of_another_checkout_is_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b, c) = (Path::new("/a/x"), Path::new("/b/x"), Path::new("/c/x"));
        claim(tmp.path(), "x", a).unwrap();
        // Another checkout holds the `x-<key8>` name `b` would take.
        let squat = tmp.path().join(repo_key("x", b));
        std::fs::create_dir(&squat).unwrap();
        std::fs::write(squat.join(REPO_PATH_FILE), "/c/x\n").unwrap();
        let db = claim(tmp.path(), "x", b).unwrap();
        assert_eq!(db, tmp.path().join(format!("x-{}", &path_digest(b)[..16])));
        let _ = c;
        // A file in the way is never followed.
        let tmp2 = tempfile::tempdir().unwrap();
        std::fs::write(tmp2.path().join("y"), "").unwrap();
        let dy = claim(tmp2.path(), "y", a).unwrap();
        assert_eq!(dy, tmp2.path().join(repo_key("y", a)));
    }

    #[test]
    fn concurrent_claims_agree() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_owned();
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let root = root.clone();
                std::thread::spawn(move || {
                    let p = PathBuf::from(format!("/co/{}/r", i % 2));
                    (i % 2, claim(&root, "r", &p).unwrap())
                })
            })
            .collect();
        let mut seen: [Option<PathBuf>; 2] = [None, None];
        for h in handles {
            let (k, d) = h.join().unwrap();
            assert_eq!(seen[k].get_or_insert(d.clone()), &d);
        }
        assert_ne!(seen[0], seen[1]);
        std::fs::create_dir(root.join(".dotfiles")).unwrap();
        let listed = all(&root).unwrap();
        assert_eq!(listed.len(), 3, "{listed:?}");
        assert_eq!(listed[0], (root.join(".dotfiles"), None));
    }
}
