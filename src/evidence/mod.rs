//! Tamper evidence, the client's side (docs/evidence.md "Clients witness" and "Exports"): the
//! checks `airlock publish` and `airlock verify` make of a review server's signed log.
//!
//! - this module: what both share: the log endpoints as a small trait ([`LogApi`], so the
//!   checks run against a fake log in tests), the held checkpoint
//!   (`~/.airlock/publish/log-checkpoint`), how a new head relates to a held one
//!   ([`relate`]), event leaves rebuilt from RFC 3339 times, and the evidence directory;
//! - [`export`]: the offline check of a JSONL export (`airlock verify EXPORT`), streaming;
//! - [`compare`]: a checkpoint from elsewhere against the held one (`airlock verify
//!   --checkpoint`).
//!
//! The witness steps of `airlock publish` are [`crate::publish::witness`].

pub mod compare;
pub mod export;
#[cfg(test)]
pub(crate) mod fake;

use std::future::Future;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::fsutil::{self, PrivateReadError};
use crate::tlog::merkle::Hash;
use crate::tlog::note::{Checkpoint, Note, NoteError, NoteVerifier, open_checkpoint};
use crate::tlog::{EventLeaf, b64};

/// The held checkpoint's file name under `~/.airlock/publish/`.
pub const HELD_FILE: &str = "log-checkpoint";

/// One answer of the review server, kept raw: the checks parse it, and evidence saves it as
/// it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// `X-Airlock-Reason`, when the answer has one.
    pub reason: Option<String>,
    pub body: Vec<u8>,
}

/// Why a request got no usable answer. Only [`ApiError::Transient`] and
/// [`ApiError::Unauthorized`] exist: every answer with a status is an [`Answer`] for the
/// caller to judge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// Unreachable, TLS, timeout, 429/503/5xx: not evidence of anything; try again later.
    #[error("{0}")]
    Transient(String),
    /// 401: the token is bad or revoked.
    #[error("{0}")]
    Unauthorized(String),
}

/// The review server's log endpoints (docs/evidence.md "API"), as raw requests.
pub trait LogApi {
    /// `GET path` (path and query).
    fn get(&self, path: &str) -> impl Future<Output = Result<Answer, ApiError>>;
    /// `POST path` with a JSON body.
    fn post_json(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> impl Future<Output = Result<Answer, ApiError>>;
}

/// A signed checkpoint, opened with the log key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The signed note as received (what is saved and compared with others).
    pub note: String,
    pub cp: Checkpoint,
}

impl Head {
    /// Opens `note` with `key` (signature, origin, checkpoint shape).
    pub fn open(note: &str, key: &NoteVerifier) -> Result<Self, NoteError> {
        let (cp, _) = open_checkpoint(note, key)?;
        Ok(Self { note: note.to_string(), cp })
    }

    /// The note's body (the text signed and cosigned).
    pub fn body(&self) -> String {
        self.cp.body()
    }

    /// `size N, root <b64>, time T` for messages.
    pub fn describe(&self) -> String {
        let time = self.cp.time().map_or_else(|| "none".to_string(), |t| t.to_string());
        format!("tree size {}, root {}, time {time}", self.cp.size, b64(&self.cp.root))
    }
}

/// How a new head stands to the held one (docs/evidence.md, step 2 of "Clients witness").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// The same tree (size and root), signed at the same time or later.
    Same,
    /// A larger tree signed no earlier: a consistency proof decides.
    Grown,
    /// A smaller tree: truncation, or a replayed old head.
    Smaller,
    /// The same size with another root: a split view (or a rewritten history).
    SplitView,
    /// Signed before the held head: a replay.
    Older,
    /// The new head carries no `time` line (Airlock's server always writes one).
    NoTime,
}

/// Relates `new` to `held`.
pub fn relate(held: &Checkpoint, new: &Checkpoint) -> Relation {
    if new.size < held.size {
        return Relation::Smaller;
    }
    if new.size == held.size && new.root != held.root {
        return Relation::SplitView;
    }
    let Some(new_time) = new.time() else { return Relation::NoTime };
    if held.time().is_some_and(|t| new_time < t) {
        return Relation::Older;
    }
    if new.size == held.size { Relation::Same } else { Relation::Grown }
}

/// Microseconds since the Unix epoch of an RFC 3339 time (any precision; a finer one than
/// microseconds is truncated).
pub fn parse_micros(s: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos().div_euclid(1000)).ok()
}

/// The leaf hash of a stored event (docs/evidence.md "Leaves").
pub fn event_leaf(
    user_id: &str,
    source: &str,
    id: &str,
    received_at: i64,
    payload_sha256: Hash,
) -> Hash {
    EventLeaf { user_id, source, id, received_at, payload_sha256 }.hash()
}

/// Hashes from base64 strings; `None` when one is not 32 bytes of base64.
pub fn hashes_from_b64<S: AsRef<str>>(items: &[S]) -> Option<Vec<Hash>> {
    items.iter().map(|s| crate::tlog::hash_from_b64(s.as_ref())).collect()
}

/// `~/.airlock/publish/log-checkpoint`.
pub fn held_path(airlock_dir: &Path) -> PathBuf {
    crate::publish::state::dir(airlock_dir).join(HELD_FILE)
}

/// Why the held checkpoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum HeldError {
    #[error("cannot read {path}: {source}; fix its permissions (0600, yours)")]
    Read {
        path: PathBuf,
        #[source]
        source: PrivateReadError,
    },
    #[error(
        "{path} does not open with the pinned log key ({err}); it was written by an earlier \
         `airlock publish` for this key, so it was changed on this machine: if you know why, \
         move it away (the next `airlock publish` then starts witnessing afresh)"
    )]
    Invalid { path: PathBuf, err: NoteError },
    #[error("cannot write {path}: {source}; check free space and permissions")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The held checkpoint, opened with `key`; `Ok(None)` when there is none yet.
pub fn load_held(airlock_dir: &Path, key: &NoteVerifier) -> Result<Option<Head>, HeldError> {
    let path = held_path(airlock_dir);
    let bytes = match fsutil::read_private(&path) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(None),
        Err(source) => return Err(HeldError::Read { path, source }),
    };
    let text = String::from_utf8_lossy(&bytes);
    Head::open(&text, key).map(Some).map_err(|err| HeldError::Invalid { path, err })
}

/// Replaces the held checkpoint (atomically, 0600).
pub fn save_held(airlock_dir: &Path, head: &Head) -> Result<(), HeldError> {
    let path = held_path(airlock_dir);
    fsutil::write_private(&path, head.note.as_bytes())
        .map_err(|source| HeldError::Write { path, source })
}

/// `{"checkpoint": "<signed note>", …}`, the answer of `GET /api/v1/log/checkpoint` (and the
/// shape `airlock verify --checkpoint` also accepts for a file).
#[derive(Debug, Deserialize)]
pub struct CheckpointAnswer {
    pub checkpoint: String,
}

/// `{"hashes": [...]}`, the answer of both proof endpoints.
#[derive(Debug, Deserialize)]
pub struct ProofAnswer {
    pub hashes: Vec<String>,
}

/// The files of one piece of evidence, saved together under
/// `~/.airlock/publish/evidence/<UTC time>/`.
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    pub files: Vec<(String, Vec<u8>)>,
}

impl Evidence {
    pub fn add(&mut self, name: &str, bytes: impl Into<Vec<u8>>) {
        self.files.push((name.to_string(), bytes.into()));
    }

    /// Writes every file into a new directory under `~/.airlock/publish/evidence/` named for
    /// the UTC time (`20260724T180311.482Z`, a suffix when taken); returns its path.
    pub fn save(&self, airlock_dir: &Path) -> std::io::Result<PathBuf> {
        let root = crate::publish::state::dir(airlock_dir).join("evidence");
        fsutil::private_dir(&root)?;
        let now = time::OffsetDateTime::now_utc();
        let stamp = format!(
            "{:04}{:02}{:02}T{:02}{:02}{:02}.{:03}Z",
            now.year(),
            u8::from(now.month()),
            now.day(),
            now.hour(),
            now.minute(),
            now.second(),
            now.millisecond()
        );
        let mut dir = root.join(&stamp);
        let mut n = 1;
        loop {
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100 => {
                    n += 1;
                    dir = root.join(format!("{stamp}-{n}"));
                }
                Err(e) => return Err(e),
            }
        }
        for (name, bytes) in &self.files {
            fsutil::write_private(&dir.join(name), bytes)?;
        }
        Ok(dir)
    }
}

/// Percent-encodes a query value (RFC 3986 unreserved characters kept).
pub fn query_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether a note parses as a signed note at all (for messages about a file that is not one).
pub fn is_note(text: &str) -> bool {
    Note::parse(text).is_ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::tlog::note::NoteSigner;
    use crate::tlog::sha256;

    fn cp(size: u64, root: &[u8], time: u64) -> Checkpoint {
        Checkpoint {
            origin: "o".into(),
            size,
            root: sha256(root),
            extensions: vec![format!("time {time}")],
        }
    }

    #[test]
    fn relations() {
        let held = cp(10, b"a", 100);
        assert_eq!(relate(&held, &cp(10, b"a", 100)), Relation::Same);
        assert_eq!(relate(&held, &cp(10, b"a", 160)), Relation::Same);
        assert_eq!(relate(&held, &cp(11, b"b", 160)), Relation::Grown);
        assert_eq!(relate(&held, &cp(9, b"b", 160)), Relation::Smaller);
        assert_eq!(relate(&held, &cp(10, b"b", 160)), Relation::SplitView);
        assert_eq!(relate(&held, &cp(10, b"a", 99)), Relation::Older);
        assert_eq!(relate(&held, &cp(12, b"c", 99)), Relation::Older);
        let mut untimed = cp(11, b"b", 0);
        untimed.extensions.clear();
        assert_eq!(relate(&held, &untimed), Relation::NoTime);
    }

    #[test]
    fn micros_parse_any_precision() {
        assert_eq!(parse_micros("1970-01-01T00:00:01.000002Z"), Some(1_000_002));
        assert_eq!(parse_micros("1970-01-01T00:00:01.5Z"), Some(1_500_000));
        assert_eq!(parse_micros("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_micros("yesterday"), None);
        assert_eq!(query_value("a b/c:d+é"), "a%20b%2Fc%3Ad%2B%C3%A9");
    }

    #[test]
    fn held_checkpoint_round_trips_and_refuses_another_key() {
        let tmp = tempfile::tempdir().unwrap();
        let log = NoteSigner::generate("log.test").unwrap();
        let key = log.verifier();
        assert!(load_held(tmp.path(), &key).unwrap().is_none());
        let note = log.sign_note(&cp(3, b"r", 5).body().replace("o\n", "log.test\n")).unwrap();
        let head = Head::open(&note, &key).unwrap();
        save_held(tmp.path(), &head).unwrap();
        assert_eq!(load_held(tmp.path(), &key).unwrap(), Some(head));
        let other = NoteSigner::generate("log.test").unwrap();
        let e = load_held(tmp.path(), &other.verifier()).unwrap_err();
        assert!(e.to_string().contains("move it away"), "{e}");
        let mut ev = Evidence::default();
        ev.add("a.txt", "x");
        let d1 = ev.save(tmp.path()).unwrap();
        let d2 = ev.save(tmp.path()).unwrap();
        assert_ne!(d1, d2);
        assert_eq!(std::fs::read_to_string(d2.join("a.txt")).unwrap(), "x");
    }
}
