//! The per-repo agent home `~/.airlock/agent/<agent>/<repo key>/` (bound at `/home/agent`) and
//! the agent's shared credential store `~/.airlock/agent/<agent>/shared/` (SECURITY §4–5).
//!
//! Owns: creating the home and its layout directories, credential copy-in before a session and
//! copy-back after it, the synthesized `.gitconfig`, and the transcript snapshot and hashes
//! recorded at session end.
//!
//! The home is written by the agent, and the agent is the adversary: it may plant symlinks,
//! FIFOs, huge files or hard links, and a concurrent session of the same repo may still be
//! changing the tree while we look. So every access below `~/.airlock/agent/` goes through a
//! directory fd and `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`, one
//! path component at a time; files are opened `O_NOFOLLOW | O_NONBLOCK` and must `fstat` as
//! regular files; every read has a size cap; every write is a temp file created `O_EXCL` in the
//! destination directory and `renameat` over the name. No symlink is ever followed.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::UnlinkatFlags;
use sha2::{Digest, Sha256};

use crate::agent::{Agent, Credential, CredentialFormat, Layout};
use crate::fsat::{how, kind, read_flags};
use crate::protocol::TranscriptHash;

/// `~/.airlock/agent/<agent>/shared/`: the credentials shared by all of the agent's homes.
pub const SHARED_DIR: &str = "shared";
/// Largest credential file read (bytes).
pub const CREDENTIAL_CAP: u64 = 1 << 20;
/// Largest transcript hashed (bytes); bigger ones are listed as `skipped:too-large`.
pub const TRANSCRIPT_CAP: u64 = 1 << 32;
/// Directory entries visited per transcript walk (all roots together).
pub const WALK_MAX_ENTRIES: usize = 100_000;
/// Directory levels descended below a transcript root.
pub const WALK_MAX_DEPTH: usize = 32;
/// How much of the session's end record the transcript list may take (JSON bytes): the record
/// is one line of at most `audit::MAX_RECORD` bytes (and travels in one control frame), and a
/// line too long loses the whole record. Past it, changed transcripts are only counted.
pub const RECORD_MAX_TRANSCRIPT_BYTES: usize = crate::audit::MAX_RECORD / 2;

const TEMP_PREFIX: &str = ".airlock-tmp-";
const DIR_MODE: u32 = 0o700;
const FILE_MODE: u32 = 0o600;
const HASH_BUF: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    #[error(
        "`{name}` cannot name an agent home directory (it must be one path component, not `.`, \
         `..` or `{SHARED_DIR}`); this is a bug in Airlock, please report it"
    )]
    BadName { name: String },
    #[error(
        "{path} is a symlink; Airlock never follows links in an agent home: remove it and run \
         again"
    )]
    Symlink { path: PathBuf },
    #[error("{path} is not a directory; Airlock needs a directory there: remove it and run again")]
    NotDir { path: PathBuf },
    #[error(
        "{path} is a directory where Airlock writes a file; remove it (or move it away) and run \
         again"
    )]
    DirInTheWay { path: PathBuf },
    #[error("{path} is not a regular file; Airlock reads only regular files: remove it")]
    NotRegular { path: PathBuf },
    #[error(
        "{path} has {links} hard links; Airlock takes a credential only from a file with one \
         link: remove it and sign in again"
    )]
    HardLinked { path: PathBuf, links: libc::nlink_t },
    #[error(
        "{path} is larger than {cap} bytes, too big for a credential: remove it and sign in again"
    )]
    TooLarge { path: PathBuf, cap: u64 },
    #[error("{path} does not parse as {what}; remove it and sign in again inside `airlock run`")]
    BadCredential { path: PathBuf, what: &'static str },
    #[error(
        "the git {field} {value:?} contains a newline or other control character, which cannot \
         go in .gitconfig; fix it in ~/.airlock/identity.toml"
    )]
    BadGitValue { field: &'static str, value: String },
    #[error("{op} {path}: {source}; fix that (owner, permissions, free space) and run again")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(op: &'static str, path: &Path, source: impl Into<io::Error>) -> HomeError {
    HomeError::Io { op, path: path.to_path_buf(), source: source.into() }
}

/// Maps an `openat2` failure on a directory to the error that says what is wrong with it.
fn dir_err(op: &'static str, path: &Path, e: Errno) -> HomeError {
    match e {
        // RESOLVE_NO_SYMLINKS refuses with ELOOP; we resolve one component at a time, so it is
        // exactly this one.
        Errno::ELOOP => HomeError::Symlink { path: path.to_path_buf() },
        Errno::ENOTDIR => HomeError::NotDir { path: path.to_path_buf() },
        e => io_err(op, path, e),
    }
}

/// A per-repo agent home, held open by directory fds.
#[derive(Debug)]
pub struct AgentHome {
    /// `~/.airlock/agent/<agent>/` (parent of the home and of `shared/`).
    agent_dir: OwnedFd,
    agent_path: PathBuf,
    /// `~/.airlock/agent/<agent>/<repo key>/`.
    home: OwnedFd,
    path: PathBuf,
    layout: &'static Layout,
}

/// What copy-in left in the home: per credential rel path, the sha256 of the bytes written, or
/// of what the home already held when the shared store had nothing (`None`: no credential).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyIn {
    pub copied: Vec<(String, Option<[u8; 32]>)>,
}

/// What copy-back took into the shared store, and what it refused (rel path, why).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyBack {
    pub copied: Vec<String>,
    pub skipped: Vec<(String, String)>,
}

/// What a transcript file was before the session. `ctime` is set by the kernel on every write
/// or metadata change and cannot be set from inside, so comparing it catches any change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileMeta {
    dev: u64,
    ino: u64,
    size: i64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileMeta {
    fn of(st: &FileStat) -> Self {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        FileMeta {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            mtime_ns: ns(st.st_mtime, st.st_mtime_nsec),
            ctime_ns: ns(st.st_ctime, st.st_ctime_nsec),
        }
    }
}

/// Metadata of the transcript files before the session, by path relative to the home.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    files: BTreeMap<PathBuf, FileMeta>,
}

impl Snapshot {
    /// Number of transcript files recorded.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

impl AgentHome {
    /// Opens, creating as needed with mode 0700, `<agent_root>/<agent.dir_name()>/<repo_key>/` where
    /// `agent_root` is `~/.airlock/agent`, then the layout's directories inside it.
    pub fn open(agent_root: &Path, agent: &Agent, repo_key: &str) -> Result<Self, HomeError> {
        let dir_name = agent.dir_name();
        check_component(&dir_name)?;
        check_component(repo_key)?;
        if repo_key == SHARED_DIR {
            return Err(HomeError::BadName { name: repo_key.into() });
        }

        // `~/.airlock` is never visible to the agent, so plain path calls are fine up to here;
        // the root itself must still be a real directory.
        if std::fs::symlink_metadata(agent_root).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(HomeError::Symlink { path: agent_root.to_path_buf() });
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(agent_root)
            .map_err(|e| io_err("create directory", agent_root, e))?;
        let root = nix::fcntl::open(
            agent_root,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| dir_err("open directory", agent_root, e))?;

        let agent_path = agent_root.join(&dir_name);
        let agent_dir = mkdir_open(root.as_fd(), &agent_path, OsStr::new(&dir_name))?;
        let path = agent_path.join(repo_key);
        let home = mkdir_open(agent_dir.as_fd(), &path, OsStr::new(repo_key))?;
        let layout = agent.layout();
        for dir in layout.dirs {
            open_dir_path(home.as_fd(), &path, Path::new(dir), true)?;
        }
        Ok(AgentHome { agent_dir, agent_path, home, path, layout })
    }

    /// Host path of the home (for the bind mount and messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn shared_path(&self) -> PathBuf {
        self.agent_path.join(SHARED_DIR)
    }

    /// Copies each credential the shared store has into the home (replacing whatever is at its
    /// path, including a planted symlink, which the rename replaces rather than follows).
    pub fn copy_in(&self) -> Result<CopyIn, HomeError> {
        let shared_path = self.shared_path();
        let shared = match open_dir(self.agent_dir.as_fd(), OsStr::new(SHARED_DIR)) {
            Ok(fd) => Some(fd),
            Err(Errno::ENOENT) => None,
            Err(e) => return Err(dir_err("open directory", &shared_path, e)),
        };
        let mut out = CopyIn::default();
        for cred in self.layout.credentials {
            let name = shared_name(cred)?;
            let bytes = match &shared {
                None => None,
                Some(dir) => {
                    read_capped(dir.as_fd(), &shared_path, name, CREDENTIAL_CAP)?.map(|(b, _)| b)
                }
            };
            let Some(bytes) = bytes else {
                // Nothing shared (never signed in, or signed out by deleting it): remember what
                // the home already holds, so copy-back promotes only a credential this session
                // wrote, never a stale copy a sign-out meant to retire.
                let held = self.read_home_credential(cred).ok().flatten().map(|b| sha256(&b));
                out.copied.push((cred.rel.into(), held));
                continue;
            };
            if !parses_as(cred.format, &bytes) {
                return Err(HomeError::BadCredential {
                    path: shared_path.join(name),
                    what: format_name(cred.format),
                });
            }
            // The shared fields replace the home's; the rest of the home's file (Claude's
            // per-repo MCP OAuth tokens, say) stays, as it would if nothing were shared.
            let held = self.read_home_credential(cred).ok().flatten();
            let bytes = merge_shared(cred.format, held.as_deref(), &bytes);
            let (parent, parent_path, file) = self
                .credential_parent(cred, true)?
                .ok_or_else(|| HomeError::BadName { name: cred.rel.into() })?;
            write_replace(parent.as_fd(), &parent_path, file, &bytes)?;
            out.copied.push((cred.rel.into(), Some(sha256(&bytes))));
        }
        Ok(out)
    }

    /// The directory holding a credential in the home, its path, and the file name. `None` if
    /// a directory on the way is missing (and `create` is false).
    fn credential_parent<'c>(
        &self,
        cred: &'c Credential,
        create: bool,
    ) -> Result<Option<(OwnedFd, PathBuf, &'c OsStr)>, HomeError> {
        let rel = Path::new(cred.rel);
        let file = shared_name(cred)?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        Ok(open_dir_path(self.home.as_fd(), &self.path, parent, create)?
            .map(|fd| (fd, self.path.join(parent), file)))
    }

    /// Reads one credential from the home for copy-back: `None` if absent.
    fn read_home_credential(&self, cred: &Credential) -> Result<Option<Vec<u8>>, HomeError> {
        let Some((dir, dir_path, file)) = self.credential_parent(cred, false)? else {
            return Ok(None);
        };
        let Some((bytes, st)) = read_capped(dir.as_fd(), &dir_path, file, CREDENTIAL_CAP)? else {
            return Ok(None);
        };
        // A file hard-linked from elsewhere is not one the agent wrote by the usual rename.
        if st.st_nlink != 1 {
            return Err(HomeError::HardLinked { path: dir_path.join(file), links: st.st_nlink });
        }
        Ok(Some(bytes))
    }

    /// After the session: takes each credential the agent refreshed (changed since copy-in and
    /// parsing as its format) into the shared store. Never writes any other file there.
    pub fn copy_back(&self, copied_in: &CopyIn) -> CopyBack {
        let mut out = CopyBack::default();
        for cred in self.layout.credentials {
            let before =
                copied_in.copied.iter().find(|(rel, _)| rel == cred.rel).and_then(|(_, h)| *h);
            let bytes = match self.read_home_credential(cred) {
                Ok(Some(bytes)) => bytes,
                Ok(None) => continue,
                Err(e) => {
                    out.skipped.push((cred.rel.into(), e.to_string()));
                    continue;
                }
            };
            if before == Some(sha256(&bytes)) {
                continue;
            }
            // Only the credential's own fields cross to other repos, re-serialized: anything
            // else the agent put in the file stays in this repo's home.
            let Some(bytes) = credential_only(cred.format, &bytes) else {
                let e = HomeError::BadCredential {
                    path: self.path.join(cred.rel),
                    what: format_name(cred.format),
                };
                out.skipped.push((cred.rel.into(), e.to_string()));
                continue;
            };
            match self.write_shared(cred, &bytes) {
                Ok(()) => out.copied.push(cred.rel.into()),
                Err(e) => out.skipped.push((cred.rel.into(), e.to_string())),
            }
        }
        out
    }

    fn write_shared(&self, cred: &Credential, bytes: &[u8]) -> Result<(), HomeError> {
        let shared_path = self.shared_path();
        let dir = mkdir_open(self.agent_dir.as_fd(), &shared_path, OsStr::new(SHARED_DIR))?;
        write_replace(dir.as_fd(), &shared_path, shared_name(cred)?, bytes)
    }

    /// Writes `<home>/.gitconfig` with the identity's name and email.
    pub fn write_gitconfig(&self, name: &str, email: &str) -> Result<(), HomeError> {
        let text = gitconfig(name, email)?;
        write_replace(self.home.as_fd(), &self.path, OsStr::new(".gitconfig"), text.as_bytes())
    }

    /// Records the transcript files present before the session.
    pub fn snapshot(&self) -> Snapshot {
        let mut snap = Snapshot::default();
        self.walk(&mut |_, _, rel, meta| {
            snap.files.insert(rel.to_path_buf(), meta);
        });
        snap
    }

    /// Hashes every transcript file that is new or changed since `before`, sorted by path.
    pub fn changed_transcripts(&self, before: &Snapshot) -> Vec<TranscriptHash> {
        self.scan_transcripts(before).hashes
    }

    /// [`Self::changed_transcripts`], and whether the walk was cut short (an agent can create
    /// far more files than [`WALK_MAX_ENTRIES`]): the session record must say so.
    pub fn scan_transcripts(&self, before: &Snapshot) -> TranscriptScan {
        self.scan_transcripts_capped(before, WALK_MAX_ENTRIES, RECORD_MAX_TRANSCRIPT_BYTES)
    }

    fn scan_transcripts_capped(
        &self,
        before: &Snapshot,
        max_entries: usize,
        max_bytes: usize,
    ) -> TranscriptScan {
        let mut out = Vec::new();
        let (mut bytes, mut unlisted) = (0usize, 0u64);
        let walked = self.walk_capped(max_entries, &mut |dir, name, rel, meta| {
            if before.files.get(rel) == Some(&meta) {
                return;
            }
            if bytes >= max_bytes {
                unlisted += 1;
                return;
            }
            if let Some(sha256) = hash_transcript(dir, name) {
                let path = self.path.join(rel).to_string_lossy().into_owned();
                let hash = TranscriptHash { path, sha256 };
                // As the control protocol will encode it (escapes included).
                bytes += serde_json::to_string(&hash).map_or(max_bytes, |j| j.len() + 1);
                out.push(hash);
            }
        });
        out.sort_by(|a, b| a.path.cmp(&b.path));
        TranscriptScan {
            hashes: out,
            truncated: walked.truncated || unlisted > 0,
            entries: walked.entries,
            unlisted,
        }
    }

    /// Calls `visit(dir fd, file name, path relative to the home, metadata)` for every regular
    /// file under the transcript roots whose name has the root's suffix.
    fn walk(&self, visit: &mut dyn FnMut(BorrowedFd<'_>, &OsStr, &Path, FileMeta)) {
        self.walk_capped(WALK_MAX_ENTRIES, visit);
    }

    fn walk_capped(
        &self,
        max_entries: usize,
        visit: &mut dyn FnMut(BorrowedFd<'_>, &OsStr, &Path, FileMeta),
    ) -> Walked {
        let mut budget = Budget { left: max_entries, truncated: false };
        for root in self.layout.transcripts {
            let rel = Path::new(root.root);
            match open_dir_path(self.home.as_fd(), &self.path, rel, false) {
                Ok(Some(fd)) => {
                    let suffix = OsStr::new(root.suffix);
                    walk_dir(fd, rel, suffix, 0, &mut budget, visit);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("transcripts not hashed: {e}"),
            }
        }
        if budget.truncated {
            tracing::warn!(
                "{}: more than {max_entries} entries (or {WALK_MAX_DEPTH} levels) under the \
                 transcript directories; the rest were not hashed (the session record says \
                 \"transcripts_truncated\": true)",
                self.path.display()
            );
        }
        Walked { truncated: budget.truncated, entries: (max_entries - budget.left) as u64 }
    }
}

/// What [`AgentHome::scan_transcripts`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TranscriptScan {
    /// The new or changed transcripts, hashed, sorted by path.
    pub hashes: Vec<TranscriptHash>,
    /// The walk stopped at [`WALK_MAX_ENTRIES`] entries or skipped directories deeper than
    /// [`WALK_MAX_DEPTH`]: `hashes` may be incomplete.
    pub truncated: bool,
    /// Directory entries the walk looked at.
    pub entries: u64,
    /// Changed transcripts found but neither hashed nor listed: the list had reached
    /// [`RECORD_MAX_TRANSCRIPT_BYTES`].
    pub unlisted: u64,
}

/// Entries a walk may still look at, and whether it had to leave some out.
#[derive(Debug)]
struct Budget {
    left: usize,
    truncated: bool,
}

#[derive(Debug)]
struct Walked {
    truncated: bool,
    entries: u64,
}

fn walk_dir(
    fd: OwnedFd,
    rel: &Path,
    suffix: &OsStr,
    depth: usize,
    budget: &mut Budget,
    visit: &mut dyn FnMut(BorrowedFd<'_>, &OsStr, &Path, FileMeta),
) {
    let Ok(mut dir) = Dir::from_fd(fd) else { return };
    // Names first, then stat: the fd count stays bounded by the depth.
    let mut names = Vec::new();
    for entry in dir.iter() {
        let Ok(entry) = entry else { break };
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if budget.left == 0 {
            budget.truncated = true;
            break;
        }
        budget.left -= 1;
        names.push(OsString::from_vec(name.to_vec()));
    }
    names.sort();
    for name in names {
        let Ok(st) =
            nix::sys::stat::fstatat(dir.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
        else {
            continue;
        };
        match kind(&st) {
            SFlag::S_IFDIR if depth + 1 < WALK_MAX_DEPTH => {
                // Swapped for a symlink since the stat: openat2 refuses, the entry is skipped.
                if let Ok(child) = open_dir(dir.as_fd(), &name) {
                    walk_dir(child, &rel.join(&name), suffix, depth + 1, budget, visit);
                }
            }
            SFlag::S_IFDIR => budget.truncated = true,
            SFlag::S_IFREG if name.as_bytes().ends_with(suffix.as_bytes()) => {
                visit(dir.as_fd(), &name, &rel.join(&name), FileMeta::of(&st));
            }
            _ => {}
        }
    }
}

/// `sha256:<hex>` of a transcript read through an fd opened beneath `dir`; `None` if it
/// vanished or is no longer a regular file.
fn hash_transcript(dir: BorrowedFd<'_>, name: &OsStr) -> Option<String> {
    let fd = match nix::fcntl::openat2(dir, name, how(read_flags(), 0)) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENXIO) => return None,
        // Made unreadable (chmod 000): say so rather than hide that it changed.
        Err(_) => return Some("skipped:unreadable".into()),
    };
    let st = nix::sys::stat::fstat(&fd).ok()?;
    if kind(&st) != SFlag::S_IFREG {
        return None;
    }
    if u64::try_from(st.st_size).unwrap_or(u64::MAX) > TRANSCRIPT_CAP {
        return Some("skipped:too-large".into());
    }
    let mut file = File::from(fd).take(TRANSCRIPT_CAP + 1);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; HASH_BUF];
    let mut total: u64 = 0;
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buf[..n]);
                total += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Some("skipped:unreadable".into()),
        }
    }
    // It grew past the cap while we read.
    if total > TRANSCRIPT_CAP {
        return Some("skipped:too-large".into());
    }
    Some(format!("sha256:{}", hex::encode(hasher.finalize())))
}

/// True if `bytes` parse as `format` (see [`CredentialFormat`]).
pub fn parses_as(format: CredentialFormat, bytes: &[u8]) -> bool {
    let Ok(serde_json::Value::Object(top)) = serde_json::from_slice::<serde_json::Value>(bytes)
    else {
        return false;
    };
    match format {
        CredentialFormat::ClaudeOauth => top
            .get("claudeAiOauth")
            .and_then(|o| o.as_object())
            .and_then(|o| o.get("accessToken"))
            .is_some_and(|t| t.is_string()),
        CredentialFormat::CodexAuth => {
            top.get("OPENAI_API_KEY").is_some_and(|k| k.is_string())
                || top.get("tokens").is_some_and(|t| t.is_object())
        }
    }
}

/// Largest credential taken back to the shared store after re-serialization: far above a real
/// token set, small enough that the file is no bulk channel between repos.
pub const SHARED_CREDENTIAL_CAP: usize = 16 << 10;

/// The credential's known fields of `bytes`, re-serialized: Claude's `claudeAiOauth` object
/// (scalar and scalar-array members only), Codex's `OPENAI_API_KEY`, `tokens` (scalar members)
/// and `last_refresh`. `None` if it does not parse as `format` or the result exceeds
/// [`SHARED_CREDENTIAL_CAP`].
pub fn credential_only(format: CredentialFormat, bytes: &[u8]) -> Option<Vec<u8>> {
    use serde_json::{Map, Value};
    if !parses_as(format, bytes) {
        return None;
    }
    let Ok(Value::Object(top)) = serde_json::from_slice::<Value>(bytes) else { return None };
    let scalar = |v: &Value| !matches!(v, Value::Object(_) | Value::Array(_));
    // Only the fields the format defines cross to other repos' homes: anything else an agent
    // adds would be a channel from one repo's session to another's.
    let flat = |v: &Value, arrays: bool, known: &[&str]| -> Option<Value> {
        let obj = v.as_object()?;
        let kept: Map<String, Value> = obj
            .iter()
            .filter(|(k, _)| known.contains(&k.as_str()))
            .filter(|(_, v)| {
                scalar(v) || (arrays && v.as_array().is_some_and(|a| a.iter().all(scalar)))
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Some(Value::Object(kept))
    };
    let mut out = Map::new();
    match format {
        CredentialFormat::ClaudeOauth => {
            const CLAUDE: &[&str] = &[
                "accessToken",
                "refreshToken",
                "expiresAt",
                "scopes",
                "subscriptionType",
                "rateLimitTier",
            ];
            out.insert("claudeAiOauth".into(), flat(top.get("claudeAiOauth")?, true, CLAUDE)?);
        }
        CredentialFormat::CodexAuth => {
            for key in ["OPENAI_API_KEY", "last_refresh"] {
                if let Some(v) = top.get(key).filter(|v| scalar(v)) {
                    out.insert(key.into(), v.clone());
                }
            }
            const CODEX: &[&str] = &["id_token", "access_token", "refresh_token", "account_id"];
            if let Some(tokens) = top.get("tokens").and_then(|t| flat(t, false, CODEX)) {
                out.insert("tokens".into(), tokens);
            }
        }
    }
    let text = serde_json::to_vec(&Value::Object(out)).ok()?;
    (text.len() <= SHARED_CREDENTIAL_CAP && parses_as(format, &text)).then_some(text)
}

/// The top-level fields of a credential file that are shared across repos.
fn shared_fields(format: CredentialFormat) -> &'static [&'static str] {
    match format {
        CredentialFormat::ClaudeOauth => &["claudeAiOauth"],
        CredentialFormat::CodexAuth => &["OPENAI_API_KEY", "tokens", "last_refresh"],
    }
}

/// The home's credential file (`held`, when it is a JSON object) with its shared fields
/// replaced by `shared`'s; just `shared` otherwise.
fn merge_shared(format: CredentialFormat, held: Option<&[u8]>, shared: &[u8]) -> Vec<u8> {
    use serde_json::Value;
    let parse = |b: &[u8]| match serde_json::from_slice::<Value>(b) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    };
    let (Some(mut merged), Some(shared_map)) = (held.and_then(parse), parse(shared)) else {
        return shared.to_vec();
    };
    for field in shared_fields(format) {
        match shared_map.get(*field) {
            Some(v) => merged.insert((*field).to_string(), v.clone()),
            None => merged.remove(*field),
        };
    }
    serde_json::to_vec(&serde_json::Value::Object(merged)).unwrap_or_else(|_| shared.to_vec())
}

fn format_name(format: CredentialFormat) -> &'static str {
    match format {
        CredentialFormat::ClaudeOauth => {
            "a Claude Code credential (JSON with `claudeAiOauth.accessToken`)"
        }
        CredentialFormat::CodexAuth => {
            "a Codex credential (JSON with `OPENAI_API_KEY` or `tokens`)"
        }
    }
}

/// The `.gitconfig` text; values are always double-quoted, with `\` and `"` escaped
/// (git-config(1)). Control characters other than tab cannot be written safely: refused.
fn gitconfig(name: &str, email: &str) -> Result<String, HomeError> {
    Ok(format!(
        "[user]\n\tname = {}\n\temail = {}\n",
        git_quote("name", name)?,
        git_quote("email", email)?
    ))
}

fn git_quote(field: &'static str, value: &str) -> Result<String, HomeError> {
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(HomeError::BadGitValue { field, value: value.into() });
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if c == '\\' || c == '"' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Ok(out)
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The file name a credential has in the shared store: its own file name (the store is flat).
fn shared_name(cred: &Credential) -> Result<&OsStr, HomeError> {
    match Path::new(cred.rel).components().next_back() {
        Some(Component::Normal(name)) => Ok(name),
        _ => Err(HomeError::BadName { name: cred.rel.into() }),
    }
}

fn check_component(name: &str) -> Result<(), HomeError> {
    let mut parts = Path::new(name).components();
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(n)), None) if n == OsStr::new(name) => Ok(()),
        _ => Err(HomeError::BadName { name: name.into() }),
    }
}

/// Opens directory `name` in `dir`, never through a symlink (ELOOP for one).
fn open_dir(dir: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    crate::fsat::open_dir(dir, Path::new(name))
}

/// Creates `name` (0700) in `dir` if absent, and opens it as a directory without following
/// symlinks. An existing directory is fine; an existing symlink is an error.
fn mkdir_open(dir: BorrowedFd<'_>, path: &Path, name: &OsStr) -> Result<OwnedFd, HomeError> {
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
fn open_dir_path(
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
fn read_capped(
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    name: &OsStr,
    cap: u64,
) -> Result<Option<(Vec<u8>, FileStat)>, HomeError> {
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
    let mut bytes = Vec::new();
    File::from(fd).take(cap + 1).read_to_end(&mut bytes).map_err(|e| io_err("read", &path, e))?;
    // It grew after the fstat.
    if bytes.len() as u64 > cap {
        return Err(HomeError::TooLarge { path, cap });
    }
    Ok(Some((bytes, st)))
}

/// Replaces `name` in `dir` with `bytes`: a new temp file in the same directory (O_EXCL, 0600),
/// synced, then `renameat` over the name. A symlink at the name is replaced, not followed.
fn write_replace(
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
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
    use std::sync::mpsc;
    use std::time::Duration;

    const CLAUDE_CRED: &str =
        r#"{"claudeAiOauth":{"accessToken":"x","refreshToken":"y","expiresAt":1}}"#;
    const CLAUDE_CRED2: &str =
        r#"{"claudeAiOauth":{"accessToken":"x2","refreshToken":"y2","expiresAt":2}}"#;
    const CRED_REL: &str = ".claude/.credentials.json";

    struct Fixture {
        tmp: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Self {
            Fixture { tmp: tempfile::tempdir().unwrap() }
        }
        fn root(&self) -> PathBuf {
            self.tmp.path().join("agent")
        }
        fn outside(&self) -> PathBuf {
            let p = self.tmp.path().join("outside");
            fs::create_dir_all(&p).unwrap();
            p
        }
        fn shared(&self) -> PathBuf {
            self.root().join("claude").join(SHARED_DIR)
        }
        fn open(&self) -> AgentHome {
            AgentHome::open(&self.root(), &Agent::Claude, "repo-1").unwrap()
        }
        fn put_shared(&self, bytes: &str) {
            fs::create_dir_all(self.shared()).unwrap();
            fs::write(self.shared().join(".credentials.json"), bytes).unwrap();
        }
        fn shared_cred(&self) -> Option<String> {
            fs::read_to_string(self.shared().join(".credentials.json")).ok()
        }
    }

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    fn hex_sha(bytes: &[u8]) -> String {
        format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
    }

    /// Runs `f` on another thread and fails (instead of hanging) if it takes too long.
    fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(20)).expect("hung")
    }

    #[test]
    fn open_creates_dirs_0700() {
        let fx = Fixture::new();
        let home = fx.open();
        let expected = fx.root().join("claude").join("repo-1");
        assert_eq!(home.path(), expected);
        assert_eq!(mode(&fx.root().join("claude")), 0o700);
        assert_eq!(mode(&expected), 0o700);
        assert_eq!(mode(&expected.join(".claude")), 0o700);
        // Opening again is fine.
        AgentHome::open(&fx.root(), &Agent::Claude, "repo-1").unwrap();
        let codex = AgentHome::open(&fx.root(), &Agent::Codex, "repo-1").unwrap();
        assert!(codex.path().join(".codex").is_dir());
    }

    #[test]
    fn open_refuses_bad_repo_keys() {
        let fx = Fixture::new();
        for key in ["a/b", "..", ".", "", "/abs", "shared", "../x", "a/"] {
            let err = AgentHome::open(&fx.root(), &Agent::Claude, key).unwrap_err();
            assert!(matches!(err, HomeError::BadName { .. }), "{key}: {err}");
        }
    }

    #[test]
    fn open_refuses_symlinked_home_and_agent_root() {
        let fx = Fixture::new();
        let outside = fx.outside();
        fs::create_dir_all(fx.root().join("claude")).unwrap();
        let link = fx.root().join("claude").join("repo-1");
        symlink(&outside, &link).unwrap();
        let err = AgentHome::open(&fx.root(), &Agent::Claude, "repo-1").unwrap_err();
        assert!(matches!(&err, HomeError::Symlink { path } if *path == link), "{err}");
        assert!(err.to_string().contains("remove it and run again"), "{err}");
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);

        let root_link = fx.tmp.path().join("root-link");
        symlink(&outside, &root_link).unwrap();
        let err = AgentHome::open(&root_link, &Agent::Claude, "repo-1").unwrap_err();
        assert!(matches!(err, HomeError::Symlink { .. }), "{err}");
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn open_refuses_symlinked_layout_dir() {
        let fx = Fixture::new();
        let outside = fx.outside();
        let home = fx.open();
        fs::remove_dir(home.path().join(".claude")).unwrap();
        symlink(&outside, home.path().join(".claude")).unwrap();
        let err = AgentHome::open(&fx.root(), &Agent::Claude, "repo-1").unwrap_err();
        assert!(matches!(err, HomeError::Symlink { .. }), "{err}");
        assert!(err.to_string().contains(".claude is a symlink"), "{err}");
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn open_refuses_file_where_dir_belongs() {
        let fx = Fixture::new();
        let home = fx.open();
        fs::remove_dir(home.path().join(".claude")).unwrap();
        fs::write(home.path().join(".claude"), "x").unwrap();
        let err = AgentHome::open(&fx.root(), &Agent::Claude, "repo-1").unwrap_err();
        assert!(matches!(err, HomeError::NotDir { .. }), "{err}");
    }

    #[test]
    fn copy_in_copies_shared_credential() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED);
        let home = fx.open();
        let got = home.copy_in().unwrap();
        assert_eq!(got.copied, vec![(CRED_REL.to_string(), Some(sha256(CLAUDE_CRED.as_bytes())))]);
        let dst = home.path().join(CRED_REL);
        assert_eq!(fs::read_to_string(&dst).unwrap(), CLAUDE_CRED);
        assert_eq!(mode(&dst), 0o600);
        // No temp file left behind.
        let names: Vec<_> = fs::read_dir(home.path().join(".claude")).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn copy_in_replaces_planted_symlink_without_writing_through_it() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED);
        let target = fx.outside().join("id_rsa");
        fs::write(&target, "PRIVATE KEY").unwrap();
        let home = fx.open();
        let dst = home.path().join(CRED_REL);
        symlink(&target, &dst).unwrap();
        home.copy_in().unwrap();
        assert_eq!(fs::read_to_string(&target).unwrap(), "PRIVATE KEY");
        assert!(fs::symlink_metadata(&dst).unwrap().file_type().is_file());
        assert_eq!(fs::read_to_string(&dst).unwrap(), CLAUDE_CRED);
    }

    #[test]
    fn copy_in_without_shared_records_none() {
        let fx = Fixture::new();
        let home = fx.open();
        let got = home.copy_in().unwrap();
        assert_eq!(got.copied, vec![(CRED_REL.to_string(), None)]);
        assert!(!home.path().join(CRED_REL).exists());
        // Custom agents have no credentials.
        let custom = Agent::Custom { name: "tool".into() };
        let h = AgentHome::open(&fx.root(), &custom, "repo-1").unwrap();
        assert_eq!(h.copy_in().unwrap(), CopyIn::default());
    }

    #[test]
    fn copy_in_refuses_bad_shared_and_dir_in_the_way() {
        let fx = Fixture::new();
        fx.put_shared("not json");
        let home = fx.open();
        let err = home.copy_in().unwrap_err();
        assert!(matches!(err, HomeError::BadCredential { .. }), "{err}");
        assert!(err.to_string().contains("shared/.credentials.json"), "{err}");
        assert!(err.to_string().contains("remove it"), "{err}");

        fx.put_shared(CLAUDE_CRED);
        fs::create_dir(home.path().join(CRED_REL)).unwrap();
        let err = home.copy_in().unwrap_err();
        assert!(matches!(err, HomeError::DirInTheWay { .. }), "{err}");
        let names: Vec<_> = fs::read_dir(home.path().join(".claude")).unwrap().collect();
        assert_eq!(names.len(), 1, "temp file removed");

        // A symlinked shared file is refused too.
        let target = fx.outside().join("t.json");
        fs::write(&target, CLAUDE_CRED).unwrap();
        fs::remove_file(fx.shared().join(".credentials.json")).unwrap();
        symlink(&target, fx.shared().join(".credentials.json")).unwrap();
        assert!(matches!(home.copy_in().unwrap_err(), HomeError::Symlink { .. }));
    }

    #[test]
    fn copy_back_updates_shared_when_refreshed() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED);
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        fs::write(home.path().join(CRED_REL), CLAUDE_CRED2).unwrap();
        let back = home.copy_back(&copied);
        assert_eq!(back, CopyBack { copied: vec![CRED_REL.into()], skipped: vec![] });
        assert_eq!(json(&fx.shared_cred().unwrap()), json(CLAUDE_CRED2));
        assert_eq!(mode(&fx.shared().join(".credentials.json")), 0o600);
    }

    #[test]
    fn copy_back_creates_shared_after_first_login() {
        let fx = Fixture::new();
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        fs::write(home.path().join(CRED_REL), CLAUDE_CRED).unwrap();
        let back = home.copy_back(&copied);
        assert_eq!(back.copied, vec![CRED_REL.to_string()]);
        assert_eq!(mode(&fx.shared()), 0o700);
        assert_eq!(json(&fx.shared_cred().unwrap()), json(CLAUDE_CRED));
    }

    /// Copy-back re-serializes, so compare values, not bytes.
    fn json(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn only_the_credentials_own_fields_cross_to_other_repos() {
        use CredentialFormat::*;
        let planted = br#"{"claudeAiOauth":{"accessToken":"a","scopes":["x"],"nested":{"k":"v"},"leak":"A-TRANSCRIPT"},"mcpServers":{"evil":{}},"note":"A-TRANSCRIPT"}"#;
        let kept = credential_only(ClaudeOauth, planted).unwrap();
        assert_eq!(kept, br#"{"claudeAiOauth":{"accessToken":"a","scopes":["x"]}}"#.to_vec());
        let codex = br#"{"OPENAI_API_KEY":null,"tokens":{"access_token":"t","deep":{"x":1},"leak":"z"},"last_refresh":"2026","x":"y"}"#;
        let kept = credential_only(CodexAuth, codex).unwrap();
        assert_eq!(
            kept,
            br#"{"OPENAI_API_KEY":null,"last_refresh":"2026","tokens":{"access_token":"t"}}"#
                .to_vec()
        );
        let huge = format!(r#"{{"claudeAiOauth":{{"accessToken":"{}"}}}}"#, "x".repeat(20_000));
        assert!(credential_only(ClaudeOauth, huge.as_bytes()).is_none());
        assert!(credential_only(ClaudeOauth, b"{}").is_none());
    }

    #[test]
    fn copy_in_keeps_the_homes_own_fields() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED2);
        let home = fx.open();
        let dst = home.path().join(CRED_REL);
        fs::write(&dst, r#"{"claudeAiOauth":{"accessToken":"old"},"mcpOAuth":{"srv":"t"}}"#)
            .unwrap();
        home.copy_in().unwrap();
        let v = json(&fs::read_to_string(&dst).unwrap());
        assert_eq!(v["claudeAiOauth"], json(CLAUDE_CRED2)["claudeAiOauth"]);
        assert_eq!(v["mcpOAuth"]["srv"], "t", "per-repo fields survive: {v}");
        // And they never reach the shared store.
        let copied = home.copy_in().unwrap();
        fs::write(&dst, r#"{"claudeAiOauth":{"accessToken":"new"},"mcpOAuth":{"srv":"t2"}}"#)
            .unwrap();
        home.copy_back(&copied);
        assert!(!fx.shared_cred().unwrap().contains("mcpOAuth"));
    }

    #[test]
    fn a_stale_home_credential_is_not_promoted_after_a_sign_out() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED);
        let home = fx.open();
        home.copy_in().unwrap();
        // The user signs out everywhere by deleting the shared copy; the home still holds one.
        fs::remove_file(fx.shared().join(".credentials.json")).unwrap();
        let copied = home.copy_in().unwrap();
        assert_eq!(home.copy_back(&copied), CopyBack::default());
        assert!(fx.shared_cred().is_none(), "the retired credential came back");
    }

    #[test]
    fn copy_back_unchanged_is_not_listed() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED);
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        assert_eq!(home.copy_back(&copied), CopyBack::default());
        // Missing: nothing either.
        fs::remove_file(home.path().join(CRED_REL)).unwrap();
        assert_eq!(home.copy_back(&copied), CopyBack::default());
        assert_eq!(fx.shared_cred().unwrap(), CLAUDE_CRED);
    }

    fn assert_skipped(back: &CopyBack, needle: &str) {
        assert!(back.copied.is_empty(), "{back:?}");
        assert_eq!(back.skipped.len(), 1, "{back:?}");
        assert_eq!(back.skipped[0].0, CRED_REL);
        assert!(back.skipped[0].1.contains(needle), "{back:?}");
    }

    #[test]
    fn copy_back_skips_symlink_to_outside_file() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED);
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        let target = fx.outside().join("creds.json");
        fs::write(&target, CLAUDE_CRED2).unwrap();
        fs::remove_file(home.path().join(CRED_REL)).unwrap();
        symlink(&target, home.path().join(CRED_REL)).unwrap();
        assert_skipped(&home.copy_back(&copied), "is a symlink");
        assert_eq!(fx.shared_cred().unwrap(), CLAUDE_CRED);
    }

    #[test]
    fn copy_back_skips_symlinked_credential_dir() {
        let fx = Fixture::new();
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        let outside = fx.outside();
        fs::write(outside.join(".credentials.json"), CLAUDE_CRED2).unwrap();
        fs::remove_dir(home.path().join(".claude")).unwrap();
        symlink(&outside, home.path().join(".claude")).unwrap();
        assert_skipped(&home.copy_back(&copied), ".claude is a symlink");
        assert!(fx.shared_cred().is_none());
    }

    #[test]
    fn copy_back_skips_fifo_without_hanging() {
        let fx = Fixture::new();
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        nix::unistd::mkfifo(&home.path().join(CRED_REL), Mode::from_bits_truncate(0o600)).unwrap();
        let back = within(move || home.copy_back(&copied));
        assert_skipped(&back, "not a regular file");
        assert!(fx.shared_cred().is_none());
    }

    #[test]
    fn copy_back_skips_oversize_unparsable_and_hard_linked() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED);
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        let dst = home.path().join(CRED_REL);

        let mut big = CLAUDE_CRED2.as_bytes().to_vec();
        big.resize(CREDENTIAL_CAP as usize + 1, b' ');
        assert!(parses_as(CredentialFormat::ClaudeOauth, &big));
        fs::write(&dst, &big).unwrap();
        assert_skipped(&home.copy_back(&copied), "larger than");

        fs::write(&dst, r#"{"claudeAiOauth":{}}"#).unwrap();
        assert_skipped(&home.copy_back(&copied), "does not parse");

        fs::write(&dst, CLAUDE_CRED2).unwrap();
        let other = fx.outside().join("other");
        fs::hard_link(&dst, &other).unwrap();
        assert_skipped(&home.copy_back(&copied), "hard links");

        assert_eq!(fx.shared_cred().unwrap(), CLAUDE_CRED);
    }

    #[test]
    fn copy_back_never_creates_other_files_in_shared() {
        let fx = Fixture::new();
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        for name in ["settings.json", "auth.json", ".credentials.json.bak", "evil"] {
            fs::write(home.path().join(".claude").join(name), CLAUDE_CRED2).unwrap();
        }
        fs::write(home.path().join(CRED_REL), CLAUDE_CRED2).unwrap();
        home.copy_back(&copied);
        let names: Vec<_> =
            fs::read_dir(fx.shared()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![OsString::from(".credentials.json")]);
    }

    #[test]
    fn codex_round_trip() {
        let fx = Fixture::new();
        let home = AgentHome::open(&fx.root(), &Agent::Codex, "r").unwrap();
        let copied = home.copy_in().unwrap();
        assert_eq!(copied.copied, vec![(".codex/auth.json".to_string(), None)]);
        fs::write(home.path().join(".codex/auth.json"), r#"{"OPENAI_API_KEY":"k"}"#).unwrap();
        assert_eq!(home.copy_back(&copied).copied, vec![".codex/auth.json".to_string()]);
        let shared = fx.root().join("codex/shared/auth.json");
        assert_eq!(fs::read_to_string(shared).unwrap(), r#"{"OPENAI_API_KEY":"k"}"#);
    }

    #[test]
    fn parses_as_claude_and_codex_shapes() {
        use CredentialFormat::{ClaudeOauth, CodexAuth};
        assert!(parses_as(ClaudeOauth, CLAUDE_CRED.as_bytes()));
        assert!(parses_as(ClaudeOauth, br#"{"claudeAiOauth":{"accessToken":"x"},"other":1}"#));
        for bad in [
            &b""[..],
            b"null",
            b"[]",
            b"{}",
            br#"{"claudeAiOauth":"x"}"#,
            br#"{"claudeAiOauth":{"accessToken":1}}"#,
            br#"{"claudeAiOauth":{"refreshToken":"y"}}"#,
            br#"{"OPENAI_API_KEY":"k"}"#,
            b"-----BEGIN OPENSSH PRIVATE KEY-----",
        ] {
            assert!(!parses_as(ClaudeOauth, bad), "{}", String::from_utf8_lossy(bad));
        }
        assert!(parses_as(CodexAuth, br#"{"OPENAI_API_KEY":"k"}"#));
        assert!(parses_as(
            CodexAuth,
            br#"{"OPENAI_API_KEY":null,"tokens":{"id_token":"a","access_token":"b"},"x":1}"#
        ));
        for bad in [
            &b"{}"[..],
            br#"{"OPENAI_API_KEY":null}"#,
            br#"{"OPENAI_API_KEY":5}"#,
            br#"{"tokens":"x"}"#,
            br#"["OPENAI_API_KEY"]"#,
            CLAUDE_CRED.as_bytes(),
        ] {
            assert!(!parses_as(CodexAuth, bad), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn gitconfig_output_and_escaping() {
        let fx = Fixture::new();
        let home = fx.open();
        home.write_gitconfig("Jane Doe", "jane@example.com").unwrap();
        let p = home.path().join(".gitconfig");
        assert_eq!(
            fs::read_to_string(&p).unwrap(),
            "[user]\n\tname = \"Jane Doe\"\n\temail = \"jane@example.com\"\n"
        );
        assert_eq!(mode(&p), 0o600);
        assert_eq!(
            gitconfig(r#"a "q" \b ; #c"#, "e").unwrap(),
            "[user]\n\tname = \"a \\\"q\\\" \\\\b ; #c\"\n\temail = \"e\"\n"
        );
        // Replaces a planted symlink without writing through it.
        let target = fx.outside().join("bashrc");
        fs::write(&target, "keep").unwrap();
        fs::remove_file(&p).unwrap();
        symlink(&target, &p).unwrap();
        home.write_gitconfig("n", "e").unwrap();
        assert_eq!(fs::read_to_string(&target).unwrap(), "keep");
        assert!(fs::symlink_metadata(&p).unwrap().is_file());
    }

    #[test]
    fn gitconfig_rejects_newline_and_nul() {
        let fx = Fixture::new();
        let home = fx.open();
        for (name, email) in
            [("a\nb", "e"), ("n", "e\n[core]\n\tsshCommand = evil"), ("a\0", "e"), ("n", "e\r")]
        {
            let err = home.write_gitconfig(name, email).unwrap_err();
            assert!(matches!(err, HomeError::BadGitValue { .. }), "{err}");
        }
        assert!(!home.path().join(".gitconfig").exists());
    }

    /// Reads back a value as git-config(1) does for our always-quoted form.
    fn unquote(line: &str) -> String {
        let inner = line.strip_prefix('"').unwrap().strip_suffix('"').unwrap();
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => out.push(chars.next().unwrap()),
                '"' => panic!("unescaped quote in {line}"),
                c => out.push(c),
            }
        }
        out
    }

    fn git_available() -> bool {
        std::process::Command::new("git")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        #[test]
        fn gitconfig_round_trips(name in "[^\\p{Cc}]{0,24}|[ \\t\"\\\\;#=a-z\\[\\]]{0,12}",
                                 email in "[^\\p{Cc}]{0,24}|[ \\t\"\\\\;#=a-z@.]{0,12}") {
            let text = gitconfig(&name, &email).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            proptest::prop_assert_eq!(lines.len(), 3);
            let value = |line: &str, key: &str| unquote(line.strip_prefix(key).unwrap());
            proptest::prop_assert_eq!(value(lines[1], "\tname = "), name.clone());
            proptest::prop_assert_eq!(value(lines[2], "\temail = "), email.clone());
            if git_available() {
                let dir = tempfile::tempdir().unwrap();
                let file = dir.path().join("gitconfig");
                fs::write(&file, &text).unwrap();
                for (key, want) in [("user.name", &name), ("user.email", &email)] {
                    let out = std::process::Command::new("git")
                        .args(["config", "-f"]).arg(&file).args(["--get", key])
                        .env("GIT_CONFIG_NOSYSTEM", "1")
                        .output().unwrap();
                    proptest::prop_assert!(out.status.success(), "{text}");
                    let got = String::from_utf8(out.stdout).unwrap();
                    proptest::prop_assert_eq!(got.strip_suffix('\n').unwrap(), want.as_str());
                }
            }
        }
    }

    fn projects(home: &AgentHome) -> PathBuf {
        let p = home.path().join(".claude/projects");
        fs::create_dir_all(&p).unwrap();
        p
    }

    #[test]
    fn transcripts_new_and_appended_are_hashed_untouched_not() {
        let fx = Fixture::new();
        let home = fx.open();
        let proj = projects(&home).join("-repo");
        fs::create_dir_all(proj.join("sub")).unwrap();
        fs::write(proj.join("old.jsonl"), "{\"a\":1}\n").unwrap();
        fs::write(proj.join("grow.jsonl"), "{\"a\":1}\n").unwrap();
        let before = home.snapshot();
        assert_eq!(before.len(), 2);

        let mut f = fs::OpenOptions::new().append(true).open(proj.join("grow.jsonl")).unwrap();
        f.write_all(b"{\"b\":2}\n").unwrap();
        drop(f);
        fs::write(proj.join("sub/new.jsonl"), "{\"c\":3}\n").unwrap();
        fs::write(proj.join("notes.txt"), "ignored").unwrap();
        fs::write(proj.join("x.jsonl.bak"), "ignored").unwrap();

        let got = home.changed_transcripts(&before);
        let path = |n: &str| proj.join(n).to_string_lossy().into_owned();
        assert_eq!(
            got,
            vec![
                TranscriptHash {
                    path: path("grow.jsonl"),
                    sha256: hex_sha(b"{\"a\":1}\n{\"b\":2}\n")
                },
                TranscriptHash { path: path("sub/new.jsonl"), sha256: hex_sha(b"{\"c\":3}\n") },
            ]
        );
        // Nothing changed since the second look.
        assert!(home.changed_transcripts(&home.snapshot()).is_empty());
    }

    #[test]
    fn transcripts_rewritten_in_place_with_same_size_and_mtime_are_hashed() {
        let fx = Fixture::new();
        let home = fx.open();
        let file = projects(&home).join("t.jsonl");
        fs::write(&file, "aaaa").unwrap();
        let mtime = fs::metadata(&file).unwrap().modified().unwrap();
        let before = home.snapshot();
        std::thread::sleep(Duration::from_millis(20));
        fs::write(&file, "bbbb").unwrap();
        // The agent can put mtime back, but not ctime.
        fs::File::options().write(true).open(&file).unwrap().set_modified(mtime).unwrap();
        let got = home.changed_transcripts(&before);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].sha256, hex_sha(b"bbbb"));
    }

    #[test]
    fn transcripts_symlinks_are_not_followed() {
        let fx = Fixture::new();
        let home = fx.open();
        let proj = projects(&home);
        let outside = fx.outside();
        fs::write(outside.join("secret.jsonl"), "secret").unwrap();
        let before = home.snapshot();
        symlink(outside.join("secret.jsonl"), proj.join("link.jsonl")).unwrap();
        symlink(&outside, proj.join("linked-project")).unwrap();
        let atime_before = fs::metadata(outside.join("secret.jsonl")).unwrap().atime();
        assert!(home.changed_transcripts(&before).is_empty());
        assert!(home.snapshot().is_empty());
        assert_eq!(fs::metadata(outside.join("secret.jsonl")).unwrap().atime(), atime_before);

        // A symlinked root is skipped as a whole.
        fs::remove_dir_all(&proj).unwrap();
        symlink(&outside, &proj).unwrap();
        assert!(home.changed_transcripts(&Snapshot::default()).is_empty());
    }

    #[test]
    fn transcripts_fifo_and_missing_roots() {
        let fx = Fixture::new();
        let home = fx.open();
        assert!(home.snapshot().is_empty());
        let proj = projects(&home);
        nix::unistd::mkfifo(&proj.join("pipe.jsonl"), Mode::from_bits_truncate(0o600)).unwrap();
        let got = within(move || home.changed_transcripts(&Snapshot::default()));
        assert!(got.is_empty());
    }

    #[test]
    fn transcripts_too_large_are_listed_unhashed() {
        let fx = Fixture::new();
        let home = fx.open();
        let file = projects(&home).join("big.jsonl");
        // Sparse: no disk used, and never read.
        fs::File::create(&file).unwrap().set_len(TRANSCRIPT_CAP + 1).unwrap();
        let got = home.changed_transcripts(&Snapshot::default());
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].sha256, "skipped:too-large");
    }

    #[test]
    fn transcripts_hard_link_is_hashed_as_content() {
        // A hard link is indistinguishable from the file; the agent can only link files it can
        // see, so hashing one discloses nothing it could not read anyway.
        let fx = Fixture::new();
        let home = fx.open();
        let src = fx.outside().join("f");
        fs::write(&src, "linked").unwrap();
        let before = home.snapshot();
        fs::hard_link(&src, projects(&home).join("h.jsonl")).unwrap();
        let got = home.changed_transcripts(&before);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].sha256, hex_sha(b"linked"));
    }

    #[test]
    fn codex_walks_both_roots() {
        let fx = Fixture::new();
        let home = AgentHome::open(&fx.root(), &Agent::Codex, "r").unwrap();
        for root in [".codex/sessions/2025/01", ".codex/archived_sessions"] {
            fs::create_dir_all(home.path().join(root)).unwrap();
            fs::write(home.path().join(root).join("rollout.jsonl"), root).unwrap();
        }
        let got = home.changed_transcripts(&Snapshot::default());
        assert_eq!(got.len(), 2);
        assert!(got[0].path.ends_with(".codex/archived_sessions/rollout.jsonl"));
        assert!(got[1].path.ends_with(".codex/sessions/2025/01/rollout.jsonl"));
    }

    #[test]
    fn a_transcript_walk_cut_short_says_so() {
        let fx = Fixture::new();
        let home = fx.open();
        let proj = projects(&home).join("-repo");
        fs::create_dir_all(&proj).unwrap();
        for i in 0..4 {
            fs::write(proj.join(format!("{i}.jsonl")), "{}\n").unwrap();
        }
        let none = Snapshot::default();
        // Five entries (`-repo` and its four files) within a cap of five: complete.
        let all = home.scan_transcripts_capped(&none, 5, usize::MAX);
        assert_eq!((all.truncated, all.entries, all.hashes.len(), all.unlisted), (false, 5, 4, 0));
        let cut = home.scan_transcripts_capped(&none, 3, usize::MAX);
        assert_eq!((cut.truncated, cut.entries, cut.hashes.len(), cut.unlisted), (true, 3, 2, 0));
        // The list's byte budget: once it is spent, the rest are counted, not listed.
        let one = serde_json::to_string(&all.hashes[0]).unwrap().len() + 1;
        let listed = home.scan_transcripts_capped(&none, 5, one + 1);
        assert_eq!((listed.truncated, listed.hashes.len(), listed.unlisted), (true, 2, 2));
        // Which two depends on readdir order; they are two of the four.
        assert!(cut.hashes.iter().all(|h| all.hashes.contains(h)), "{:?}", cut.hashes);
        assert!(!home.scan_transcripts(&none).truncated);
        // A directory deeper than the walk descends is left out, and that is said too.
        let mut deep = proj.clone();
        for level in 0..WALK_MAX_DEPTH {
            deep.push(format!("d{level}"));
        }
        fs::create_dir_all(&deep).unwrap();
        fs::write(deep.join("deep.jsonl"), "{}\n").unwrap();
        let scan = home.scan_transcripts(&none);
        assert!(scan.truncated);
        assert_eq!(scan.hashes.len(), 4, "{:?}", scan.hashes);
    }
}
