//! Repo trust by content hash (DESIGN §4, like `direnv allow`): `airlock policy trust` records
//! the SHA-256 of the repo's `.airlock.toml` in `~/.airlock/trust/<repo key>`; the file applies
//! only while its bytes hash to the recorded digest. A cloned repo is untrusted (SECURITY §1).
//! A copy of the trusted bytes is kept beside the record (`<repo key>.content`, 0600), so a
//! later prompt can show a real diff against what was trusted.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::fsutil::{self, PrivateReadError};
use crate::paths::Paths;
use crate::repo::Repo;

/// What `~/.airlock/trust/<repo key>` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustRecord {
    /// The trusted file's canonical host path.
    pub path: PathBuf,
    /// Lowercase hex SHA-256 of the trusted bytes.
    pub digest: String,
    /// When it was trusted (RFC 3339, UTC).
    pub trusted_at: String,
}

/// Whether the repo file's current bytes are trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum TrustState {
    /// The digest matches the record: the file applies.
    Trusted { trusted_at: String },
    /// Never trusted.
    Untrusted,
    /// Trusted once, edited since: does not apply until trusted again.
    Changed { trusted_digest: String, trusted_at: String },
    /// The record exists but cannot be used (unreadable, too open, corrupt).
    BadRecord { reason: String },
    /// The repo file itself cannot be read safely (a symlink, not a regular file, too large).
    Unreadable { reason: String },
}

impl TrustState {
    pub fn is_trusted(&self) -> bool {
        matches!(self, Self::Trusted { .. })
    }

    /// One line for `policy check`/`show`, ending with the fix.
    pub fn describe(&self, file: &str, repo_dir: &Path) -> String {
        let fix = format!("run `airlock policy trust --repo {}` to apply it", repo_dir.display());
        match self {
            Self::Trusted { trusted_at } => format!("{file} is trusted (since {trusted_at})"),
            Self::Untrusted => format!("{file} is not trusted, so it does not apply; {fix}"),
            Self::Changed { trusted_at, .. } => format!(
                "{file} changed since it was trusted ({trusted_at}), so it does not apply; review \
                 it, then {fix}"
            ),
            Self::BadRecord { reason } => {
                format!("{file} does not apply: its trust record is unusable ({reason}); {fix}")
            }
            Self::Unreadable { reason } => {
                format!("{file} does not apply: {reason}; replace it with a regular file")
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("cannot write the trust record {path}: {source}; check that ~/.airlock is writable")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode the trust record: {0}")]
    Encode(#[from] toml::ser::Error),
}

/// `~/.airlock/trust/<repo key>`.
pub fn record_path(paths: &Paths, repo: &Repo) -> PathBuf {
    paths.trust_dir().join(repo.key())
}

/// The trust state of `repo`'s file whose current bytes hash to `digest`.
pub fn state(paths: &Paths, repo: &Repo, digest: &str) -> TrustState {
    let path = record_path(paths, repo);
    let bytes = match fsutil::read_private(&path) {
        Ok(Some(b)) => b,
        Ok(None) => return TrustState::Untrusted,
        Err(e @ PrivateReadError::TooOpen { .. }) => {
            return TrustState::BadRecord {
                reason: format!("{}: {e}; run `chmod 600 {}`", path.display(), path.display()),
            };
        }
        Err(e) => return TrustState::BadRecord { reason: format!("{}: {e}", path.display()) },
    };
    let record: TrustRecord = match std::str::from_utf8(&bytes)
        .map_err(|e| e.to_string())
        .and_then(|t| toml::from_str(t).map_err(|e| e.message().to_owned()))
    {
        Ok(r) => r,
        Err(e) => return TrustState::BadRecord { reason: format!("{}: {e}", path.display()) },
    };
    if record.path != repo.config_file() {
        // Keys include a hash of the path, so this means a hand-edited or copied record.
        return TrustState::BadRecord {
            reason: format!("{} is for {}", path.display(), record.path.display()),
        };
    }
    if record.digest == digest {
        TrustState::Trusted { trusted_at: record.trusted_at }
    } else {
        TrustState::Changed { trusted_digest: record.digest, trusted_at: record.trusted_at }
    }
}

/// `~/.airlock/trust/<repo key>.content`: the trusted bytes.
pub fn content_path(paths: &Paths, repo: &Repo) -> PathBuf {
    paths.trust_dir().join(format!("{}.content", repo.key()))
}

/// Records `bytes` as the trusted content of `repo`'s file: the record (by digest) and a copy
/// of the bytes for later diffs.
pub fn trust_content(paths: &Paths, repo: &Repo, bytes: &[u8]) -> Result<TrustRecord, TrustError> {
    let path = content_path(paths, repo);
    fsutil::private_dir(&paths.airlock_dir())
        .and_then(|()| fsutil::write_private(&path, bytes))
        .map_err(|source| TrustError::Write { path, source })?;
    trust(paths, repo, &super::layer::digest(bytes))
}

/// The bytes that were last trusted for `repo`'s file, if a copy was kept and it still hashes
/// to the recorded digest (trusts recorded before copies were kept have none).
pub fn trusted_content(paths: &Paths, repo: &Repo) -> Option<Vec<u8>> {
    let bytes = fsutil::read_private(&content_path(paths, repo)).ok()??;
    let record = fsutil::read_private(&record_path(paths, repo)).ok()??;
    let record: TrustRecord = toml::from_str(std::str::from_utf8(&record).ok()?).ok()?;
    (record.digest == super::layer::digest(&bytes) && record.path == repo.config_file())
        .then_some(bytes)
}

/// Records `digest` as the trusted content of `repo`'s file.
pub fn trust(paths: &Paths, repo: &Repo, digest: &str) -> Result<TrustRecord, TrustError> {
    let trusted_at = crate::timefmt::rfc3339_ms(std::time::SystemTime::now());
    let record = TrustRecord { path: repo.config_file(), digest: digest.to_owned(), trusted_at };
    let text = toml::to_string(&record)?;
    let path = record_path(paths, repo);
    fsutil::private_dir(&paths.airlock_dir())
        .and_then(|()| fsutil::write_private(&path, text.as_bytes()))
        .map_err(|source| TrustError::Write { path, source })?;
    Ok(record)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn trust_follows_the_digest() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = Paths::with_home(tmp.path().join("home"));
        std::fs::create_dir_all(tmp.path().join("r")).unwrap();
        let repo = Repo::resolve(Some(&tmp.path().join("r")), tmp.path()).unwrap();
        assert_eq!(state(&paths, &repo, "aa"), TrustState::Untrusted);
        trust(&paths, &repo, "aa").unwrap();
        assert!(state(&paths, &repo, "aa").is_trusted());
        assert!(matches!(state(&paths, &repo, "bb"), TrustState::Changed { .. }));
        let rec = record_path(&paths, &repo);
        assert_eq!(std::fs::metadata(&rec).unwrap().permissions().mode() & 0o777, 0o600);
        let dir = std::fs::metadata(paths.trust_dir()).unwrap().permissions().mode();
        assert_eq!(dir & 0o777, 0o700);
        std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(matches!(state(&paths, &repo, "aa"), TrustState::BadRecord { .. }));
        std::fs::write(&rec, "garbage").unwrap();
        assert_eq!(trusted_content(&paths, &repo), None);
        std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(state(&paths, &repo, "aa"), TrustState::BadRecord { .. }));
    }

    #[test]
    fn trusted_content_is_kept_and_only_while_it_matches_the_record() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = Paths::with_home(tmp.path().join("home"));
        std::fs::create_dir_all(tmp.path().join("r")).unwrap();
        let repo = Repo::resolve(Some(&tmp.path().join("r")), tmp.path()).unwrap();
        assert_eq!(trusted_content(&paths, &repo), None);
        let rec = trust_content(&paths, &repo, b"[network]\n").unwrap();
        assert!(state(&paths, &repo, &rec.digest).is_trusted());
        assert_eq!(trusted_content(&paths, &repo).as_deref(), Some(&b"[network]\n"[..]));
        // A record written without a copy (an older trust) leaves the copy stale: not used.
        trust(&paths, &repo, "bb").unwrap();
        assert_eq!(trusted_content(&paths, &repo), None);
    }
}
