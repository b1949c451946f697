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
use super::{AgentHome, HASH_BUF, TRANSCRIPT_CAP, WALK_MAX_DEPTH, WALK_MAX_ENTRIES};
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
        let mut out = Vec::new();
        self.walk(&mut |dir, name, rel, meta| {
            if before.files.get(rel) == Some(&meta) {
                return;
            }
            if let Some(sha256) = hash_transcript(dir, name) {
                let path = self.path.join(rel).to_string_lossy().into_owned();
                out.push(TranscriptHash { path, sha256 });
            }
        });
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }

    /// Calls `visit(dir fd, file name, path relative to the home, metadata)` for every regular
    /// file under the transcript roots whose name has the root's suffix.
    fn walk(&self, visit: &mut dyn FnMut(BorrowedFd<'_>, &OsStr, &Path, FileMeta)) {
        let mut budget = WALK_MAX_ENTRIES;
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
        if budget == 0 {
            tracing::warn!(
                "{}: more than {WALK_MAX_ENTRIES} entries under the transcript directories; \
                 the rest were not hashed",
                self.path.display()
            );
        }
    }
}

fn walk_dir(
    fd: OwnedFd,
    rel: &Path,
    suffix: &OsStr,
    depth: usize,
    budget: &mut usize,
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
        if *budget == 0 {
            break;
        }
        *budget -= 1;
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
}
