//! The transcripts a session created or changed (SECURITY §1): a metadata snapshot of the
//! layout's transcript roots before the session, and at its end the `sha256` of every file that
//! is new or changed, through directory fds with a bounded walk.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::{FileStat, SFlag};
use sha2::{Digest, Sha256};

use super::beneath::{open_dir, open_dir_path};
use super::{
    AgentHome, HASH_BUF, RECORD_MAX_TRANSCRIPT_BYTES, TRANSCRIPT_CAP, WALK_MAX_DEPTH,
    WALK_MAX_ENTRIES,
};
use crate::fsat::{how, kind, read_flags};
use crate::protocol::TranscriptHash;

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
            if let Some((sha256, size)) = hash_transcript(dir, name) {
                let path = self.path.join(rel).to_string_lossy().into_owned();
                let file = rel.to_string_lossy().into_owned();
                let hash = TranscriptHash { path, file, bytes: size, sha256 };
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

/// `sha256:<hex>` of a transcript read through an fd opened beneath `dir`, and how many
/// bytes that hash covers; `None` if it vanished or is no longer a regular file. Only the
/// size `fstat` gives at open is read: an agent still appending cannot make the hash cover
/// bytes the count does not (nor keep the read going), so `bytes` is exactly what was hashed.
/// A skipped file hashes nothing (`bytes` 0).
fn hash_transcript(dir: BorrowedFd<'_>, name: &OsStr) -> Option<(String, u64)> {
    let skipped = |why: &str| Some((format!("skipped:{why}"), 0));
    let fd = match nix::fcntl::openat2(dir, name, how(read_flags(), 0)) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENXIO) => return None,
        // Made unreadable (chmod 000): say so rather than hide that it changed.
        Err(_) => return skipped("unreadable"),
    };
    let st = nix::sys::stat::fstat(&fd).ok()?;
    if kind(&st) != SFlag::S_IFREG {
        return None;
    }
    let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
    if size > TRANSCRIPT_CAP {
        return skipped("too-large");
    }
    let mut file = File::from(fd).take(size);
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
            Err(_) => return skipped("unreadable"),
        }
    }
    // Shorter than at open (truncated meanwhile): `total` is what the hash covers.
    Some((format!("sha256:{}", hex::encode(hasher.finalize())), total))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::agent::Agent;
    use nix::sys::stat::Mode;
    use std::fs;
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, symlink};
    use std::time::Duration;

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
                    file: ".claude/projects/-repo/grow.jsonl".into(),
                    bytes: 16,
                    sha256: hex_sha(b"{\"a\":1}\n{\"b\":2}\n")
                },
                TranscriptHash {
                    path: path("sub/new.jsonl"),
                    file: ".claude/projects/-repo/sub/new.jsonl".into(),
                    bytes: 8,
                    sha256: hex_sha(b"{\"c\":3}\n")
                },
            ]
        );
        // Nothing changed since the second look.
        assert!(home.changed_transcripts(&home.snapshot()).is_empty());
    }

    #[test]
    fn the_hash_covers_exactly_the_bytes_counted_and_old_records_parse() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("t.jsonl"), "{\"a\":1}\n{\"b\":2}\n").unwrap();
        let d = fs::File::open(dir.path()).unwrap();
        let (sha, bytes) = hash_transcript(d.as_fd(), OsStr::new("t.jsonl")).unwrap();
        assert_eq!((sha, bytes), (hex_sha(b"{\"a\":1}\n{\"b\":2}\n"), 16));
        // A record written before `file` and `bytes` existed.
        let old: TranscriptHash = serde_json::from_str(
            r#"{"path":"/h/.claude/projects/p/a.jsonl","sha256":"sha256:00"}"#,
        )
        .unwrap();
        assert_eq!((old.file.as_str(), old.bytes), ("", 0));
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
