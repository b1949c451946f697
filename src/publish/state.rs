//! The publisher's progress record `~/.airlock/publish/state.json` (directory 0700, file
//! 0600) and its lock `~/.airlock/publish/.lock`.
//!
//! Per file (key: absolute host path) it holds what the file looked like when it was last read
//! (`dev`, `inode`, `size`, `mtime`) and how far the server has acknowledged it (`offset`, with
//! `head_sha256`/`tail_sha256`: SHA-256 of the first 4 KiB, and of the 4 KiB before `offset`,
//! so a rewritten file is noticed). It is replaced atomically (temp file, fsync, rename, fsync
//! of the directory) and only ever moved to a prefix the server acknowledged, so a `kill -9`
//! at any point loses nothing: the next run resends from the last acknowledged line, and the
//! resent lines come back `duplicate`.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::stat::FileStat;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::fsutil::{PrivateReadError, private_dir, read_private, write_private};

/// Bytes hashed at the head of a file and before its offset.
pub const HASH_SPAN: u64 = 4096;

/// `~/.airlock/publish/`.
pub fn dir(airlock_dir: &Path) -> PathBuf {
    airlock_dir.join("publish")
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read {path}: {source}; fix its permissions (0600, yours)")]
    Read {
        path: PathBuf,
        #[source]
        source: PrivateReadError,
    },
    #[error(
        "{path} is not a publish state file ({message}); move it away to publish everything \
         again (the server answers `duplicate` for what it already has)"
    )]
    Corrupt { path: PathBuf, message: String },
    #[error("cannot write {path}: {source}; check free space and permissions")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "another `airlock publish` is running (it holds {path}); wait for it to finish and run \
         again"
    )]
    Busy { path: PathBuf },
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What one file looked like and how far it is published.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileState {
    pub dev: u64,
    pub inode: u64,
    pub size: u64,
    /// Nanoseconds since the epoch.
    pub mtime: i64,
    /// Bytes acknowledged by the server (always the end of a complete line).
    pub offset: u64,
    /// `sha256:<hex>` of the first `min(4096, offset)` bytes.
    pub head_sha256: String,
    /// `sha256:<hex>` of the `min(4096, offset)` bytes before `offset`.
    pub tail_sha256: String,
    /// Everything after `offset` up to `size` was read and held no complete line (a partial
    /// last line): the file needs no look until it changes.
    #[serde(default)]
    pub done: bool,
    /// The ts of the line before `offset` (Claude/Codex inference of a missing ts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_ts: Option<String>,
    /// Codex: the file's `session_meta` id once seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codex_session: Option<String>,
}

impl FileState {
    /// Whether `st` is the file as last read.
    pub fn same_stat(&self, st: &FileStat) -> bool {
        let (dev, inode, size, mtime) = stat_key(st);
        self.dev == dev && self.inode == inode && self.size == size && self.mtime == mtime
    }
}

/// `(dev, inode, size, mtime ns)` of a stat.
pub fn stat_key(st: &FileStat) -> (u64, u64, u64, i64) {
    let mtime = st.st_mtime.saturating_mul(1_000_000_000).saturating_add(st.st_mtime_nsec);
    (st.st_dev, st.st_ino, u64::try_from(st.st_size).unwrap_or(0), mtime)
}

/// `sha256:<hex>` of `bytes`.
pub fn sha(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The whole record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    #[serde(default)]
    pub version: u32,
    #[serde(default)]
    pub files: BTreeMap<String, FileState>,
}

impl State {
    /// Reads `state.json` under `airlock_dir`; an absent file is an empty state.
    pub fn load(airlock_dir: &Path) -> Result<Self, StateError> {
        let path = dir(airlock_dir).join("state.json");
        let bytes = match read_private(&path) {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(Self { version: 1, files: BTreeMap::new() }),
            Err(source) => return Err(StateError::Read { path, source }),
        };
        serde_json::from_slice(&bytes)
            .map_err(|e| StateError::Corrupt { path, message: e.to_string() })
    }

    /// Replaces `state.json` atomically and durably.
    pub fn save(&self, airlock_dir: &Path) -> Result<(), StateError> {
        let path = dir(airlock_dir).join("state.json");
        let mut out = self.clone();
        out.version = 1;
        let bytes = serde_json::to_vec(&out)
            .map_err(|e| StateError::Write { path: path.clone(), source: io::Error::other(e) })?;
        write_private(&path, &bytes).map_err(|source| StateError::Write { path, source })
    }
}

/// The held lock; released on drop.
#[derive(Debug)]
pub struct Lock(#[allow(dead_code)] nix::fcntl::Flock<File>);

/// Takes `~/.airlock/publish/.lock`, waiting up to `wait` for another publish to finish.
pub fn lock(airlock_dir: &Path, wait: Duration) -> Result<Lock, StateError> {
    let d = dir(airlock_dir);
    let path = d.join(".lock");
    private_dir(&d).map_err(|source| StateError::Lock { path: path.clone(), source })?;
    let start = Instant::now();
    loop {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|source| StateError::Lock { path: path.clone(), source })?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(Lock(l)),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) if start.elapsed() < wait => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Err(StateError::Busy { path }),
            Err((_, e)) => return Err(StateError::Lock { path, source: e.into() }),
        }
    }
}

/// What `airlock login --server` left under `airlock_dir`: (a token file, a server in the
/// identity). Reads neither the token's bytes nor the network.
fn login_files(airlock_dir: &Path) -> (bool, bool) {
    let token = std::fs::symlink_metadata(airlock_dir.join("token")).is_ok();
    let server = std::fs::read_to_string(airlock_dir.join("identity.toml"))
        .ok()
        .and_then(|t| toml::from_str::<toml::Table>(&t).ok())
        .is_some_and(|t| t.get("server").is_some_and(|s| s.is_str()));
    (token, server)
}

/// Whether a review-plane login exists at all (a token file, or a server in the identity):
/// retention's test, which errs towards keeping files.
pub fn logged_in(airlock_dir: &Path) -> bool {
    let (token, server) = login_files(airlock_dir);
    token || server
}

/// Whether the review-plane client can be built: both a server in the identity and a token.
pub fn server_login(airlock_dir: &Path) -> bool {
    let (token, server) = login_files(airlock_dir);
    token && server
}

/// How far the dated files of the log directory `log_dir` are published, from `state.json`:
/// the latest UTC date D such that every `audit-<date>` and `sessions-<date>` file with date
/// ≤ D is published to its end. `None`: nothing is; the caller then keeps every file.
pub fn published_through_date(airlock_dir: &Path, log_dir: &Path) -> Option<String> {
    // An unreadable state publishes nothing as far as retention is concerned.
    let state = State::load(airlock_dir).unwrap_or_default();
    let mut dated: Vec<(String, PathBuf)> = std::fs::read_dir(log_dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            super::sources::log_kind(&name)?;
            // `<kind>-YYYY-MM-DD.jsonl`, as `log_kind` checked.
            let date = name.get(name.len() - 16..name.len() - 6)?.to_owned();
            Some((date, e.path()))
        })
        .collect();
    dated.sort();
    let mut through: Option<String> = None;
    let mut i = 0;
    while i < dated.len() {
        let date = dated[i].0.clone();
        let mut all = true;
        while i < dated.len() && dated[i].0 == date {
            let path = &dated[i].1;
            let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(u64::MAX);
            let published = state
                .files
                .get(&path.to_string_lossy().into_owned())
                .is_some_and(|f| f.offset >= size);
            all &= published;
            i += 1;
        }
        if !all {
            break;
        }
        through = Some(date);
    }
    through
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_privately() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = State::load(tmp.path()).unwrap();
        s.files.insert("/a".into(), FileState { offset: 3, ..Default::default() });
        s.save(tmp.path()).unwrap();
        assert_eq!(State::load(tmp.path()).unwrap().files["/a"].offset, 3);
        use std::os::unix::fs::PermissionsExt;
        let m = std::fs::metadata(tmp.path().join("publish/state.json")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        let m = std::fs::metadata(tmp.path().join("publish")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn a_second_lock_is_busy() {
        let tmp = tempfile::tempdir().unwrap();
        let _l = lock(tmp.path(), Duration::ZERO).unwrap();
        let e = lock(tmp.path(), Duration::from_millis(120)).unwrap_err();
        assert!(e.to_string().contains("another `airlock publish` is running"), "{e}");
    }

    #[test]
    fn published_through_is_the_last_fully_published_day() {
        let tmp = tempfile::tempdir().unwrap();
        let air = tmp.path();
        let logs = air.join("logs/r");
        std::fs::create_dir_all(&logs).unwrap();
        let f = |n: &str| {
            let p = logs.join(n);
            std::fs::write(&p, "{}\n").unwrap();
            p
        };
        let a1 = f("audit-2026-01-01.jsonl");
        let s1 = f("sessions-2026-01-01.jsonl");
        let a2 = f("audit-2026-01-02.jsonl");
        let _a3 = f("audit-2026-01-03.jsonl");
        f("journal-x.jsonl");
        assert_eq!(published_through_date(air, &logs), None);
        let mut s = State::default();
        for p in [&a1, &s1, &a2] {
            s.files
                .insert(p.to_string_lossy().into(), FileState { offset: 3, ..Default::default() });
        }
        s.save(air).unwrap();
        assert_eq!(published_through_date(air, &logs).as_deref(), Some("2026-01-02"));
        s.files.remove(&s1.to_string_lossy().into_owned());
        s.save(air).unwrap();
        assert_eq!(published_through_date(air, &logs), None);
    }
}
