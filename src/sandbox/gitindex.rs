//! Judging a git index an agent wrote (SECURITY §7): git trusts the paths in its index when it
//! writes the worktree, so an index naming `.git/config` or `.git/hooks/post-checkout` makes a
//! host `git checkout .` / `git restore .` write the agent's config and hooks into the host's
//! git dir. This module reads the entry paths of an index file (git's
//! `Documentation/gitformat-index.txt`, versions 2–4, SHA-1 or SHA-256) and applies the path
//! rules git applies when *adding* a path (`verify_path` in git's `read-cache.c`), which it does
//! not repeat when reading an index. Pure: bytes in, verdict out.

/// What is wrong with an index, if anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexProblem {
    #[error("it is not a git index git could read (version 2, 3 or 4)")]
    Unreadable,
    #[error("it holds the path {0:?}, which reaches into a git dir or out of the worktree")]
    BadPath(String),
}

/// The index's verdict: `Ok(())` when every entry path is one git would have accepted.
/// `sha256_repo` says what the git dir's `extensions.objectformat` is, for an index whose
/// trailing checksum does not tell (`index.skipHash` writes zeros there).
pub fn check(bytes: &[u8], sha256_repo: bool) -> Result<Vec<IndexEntry>, IndexProblem> {
    let entries = parse(bytes, hash_size(bytes, sha256_repo));
    let Some(entries) = entries else { return Err(IndexProblem::Unreadable) };
    match entries.iter().find(|e| !path_is_safe(&e.path)) {
        Some(bad) => Err(IndexProblem::BadPath(String::from_utf8_lossy(&bad.path).into_owned())),
        None => Ok(entries),
    }
}

/// One index entry, as far as judging it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub path: Vec<u8>,
    /// `0o100644`, `0o100755`, `0o120000` (symlink), `0o160000` (gitlink).
    pub mode: u32,
    /// The staged object's name (20 or 32 bytes).
    pub oid: Vec<u8>,
    /// `assume-valid` or `skip-worktree` is set: git will not look at the worktree file, so a
    /// change to it stays out of `git status` and `git diff`.
    pub hidden: bool,
}

/// git's object name of a blob with `content`, in the index's hash (`blob <len>\0<content>`).
pub fn blob_id(content: &[u8], oid_len: usize) -> Vec<u8> {
    use sha2::Digest as _;
    let header = format!("blob {}\0", content.len());
    if oid_len == 32 {
        let mut h = sha2::Sha256::new();
        h.update(header.as_bytes());
        h.update(content);
        h.finalize().to_vec()
    } else {
        let mut h = sha1::Sha1::new();
        h.update(header.as_bytes());
        h.update(content);
        h.finalize().to_vec()
    }
}

/// The object-name size the index was written with: the one whose trailing checksum verifies,
/// else the repo's object format. Guessing by parsing would read a one-entry SHA-256 index as
/// SHA-1 with a harmless-looking stray path.
fn hash_size(b: &[u8], sha256_repo: bool) -> usize {
    use sha2::Digest as _;
    let trailer_ok =
        |size: usize, digest: &[u8]| b.len() > size + 12 && b[b.len() - size..] == *digest;
    if b.len() > 44 && trailer_ok(32, &sha2::Sha256::digest(&b[..b.len() - 32])) {
        return 32;
    }
    if b.len() > 32 && trailer_ok(20, &sha1::Sha1::digest(&b[..b.len() - 20])) {
        return 20;
    }
    if sha256_repo { 32 } else { 20 }
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

/// Every entry's path (tests).
#[cfg(test)]
fn entry_paths(b: &[u8], hash: usize) -> Option<Vec<Vec<u8>>> {
    parse(b, hash).map(|v| v.into_iter().map(|e| e.path).collect())
}

/// Every entry, or `None` when the bytes do not parse as an index with this hash size.
fn parse(b: &[u8], hash: usize) -> Option<Vec<IndexEntry>> {
    if b.get(..4)? != b"DIRC" {
        return None;
    }
    let version = be32(b, 4)?;
    if !(2..=4).contains(&version) {
        return None;
    }
    let count = be32(b, 8)? as usize;
    // Ten 32-bit stat fields, the object name, 16-bit flags.
    let fixed = 40 + hash + 2;
    let mut at = 12;
    let mut entries: Vec<IndexEntry> = Vec::with_capacity(count.min(1 << 20));
    let mut prev: Vec<u8> = Vec::new();
    for _ in 0..count {
        let start = at;
        let mode = be32(b, at + 24)?;
        let oid = b.get(at + 40..at + 40 + hash)?.to_vec();
        let flags = be16(b, at + 40 + hash)?;
        at += fixed;
        // Bit 15: assume-valid. Version 3+: an extended-flags word when bit 14 is set, whose
        // bit 14 is skip-worktree.
        let mut hidden = flags & 0x8000 != 0;
        if version >= 3 && flags & 0x4000 != 0 {
            hidden |= be16(b, at)? & 0x4000 != 0;
            at += 2;
        }
        let path = if version == 4 {
            // Prefix compression: drop N bytes of the previous path, append a NUL-ended suffix.
            let (strip, used) = varint(b.get(at..)?)?;
            at += used;
            let end = at + b.get(at..)?.iter().position(|&c| c == 0)?;
            let keep = prev.len().checked_sub(strip)?;
            let mut p = prev[..keep].to_vec();
            p.extend_from_slice(&b[at..end]);
            at = end + 1;
            p
        } else {
            let end = at + b.get(at..)?.iter().position(|&c| c == 0)?;
            let p = b[at..end].to_vec();
            // NUL padding to a multiple of 8 from the entry's start (1 to 8 NULs).
            let len = end - start;
            at = start + (len + 8) / 8 * 8;
            p
        };
        if at > b.len() {
            return None;
        }
        prev.clone_from(&path);
        entries.push(IndexEntry { path, mode, oid, hidden });
    }
    // Extensions and the trailing hash follow; a well-formed index has at least the hash.
    (b.len() >= at + hash).then_some(entries)
}

/// git's offset varint (`decode_varint`): 7 bits a byte, high bit = more, +1 per continuation.
fn varint(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    let mut c = *b.first()?;
    let mut val = (c & 0x7f) as usize;
    while c & 0x80 != 0 {
        i += 1;
        c = *b.get(i)?;
        val = val.checked_add(1)?.checked_mul(128)?.checked_add((c & 0x7f) as usize)?;
    }
    Some((val, i + 1))
}

/// git's `verify_path` rules, strictest flavour (as with `core.protectNTFS` and
/// `core.protectHFS` on): no leading `/`, no empty, `.` or `..` component, and no component
/// that any filesystem git runs on would read as `.git` (case-insensitive, trailing dots or
/// spaces, the NTFS short name `git~1`, HFS+'s ignorable code points).
pub fn path_is_safe(path: &[u8]) -> bool {
    if path.is_empty() || path.starts_with(b"/") || path.ends_with(b"/") {
        return false;
    }
    path.split(|&c| c == b'/')
        .all(|comp| !comp.is_empty() && comp != b"." && comp != b".." && !is_dotgit(comp))
}

fn is_dotgit(comp: &[u8]) -> bool {
    let text = String::from_utf8_lossy(comp);
    // HFS+ ignores these code points when comparing names (git's is_hfs_dotgit).
    let hfs_ignorable =
        |c: char| matches!(c as u32, 0x200c..=0x200f | 0x202a..=0x202e | 0x206a..=0x206f | 0xfeff);
    let folded: String = text.chars().filter(|c| !hfs_ignorable(*c)).collect();
    let trimmed = folded.trim_end_matches(['.', ' ']).to_ascii_lowercase();
    trimmed == ".git" || trimmed == "git~1"
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Builds an index the way git lays one out (version 2 or 3 with padding, 4 compressed).
    fn index(version: u32, paths: &[&str]) -> Vec<u8> {
        let mut b = b"DIRC".to_vec();
        b.extend_from_slice(&version.to_be_bytes());
        b.extend_from_slice(&(paths.len() as u32).to_be_bytes());
        let mut prev = String::new();
        for p in paths {
            let start = b.len();
            b.extend_from_slice(&[0u8; 40]);
            b.extend_from_slice(&[0xab; 20]);
            b.extend_from_slice(&((p.len().min(0xfff)) as u16).to_be_bytes());
            if version == 4 {
                let common = prev.bytes().zip(p.bytes()).take_while(|(a, c)| a == c).count();
                let strip = prev.len() - common;
                assert!(strip < 128, "test helper encodes one-byte varints");
                b.push(strip as u8);
                b.extend_from_slice(&p.as_bytes()[common..]);
                b.push(0);
            } else {
                b.extend_from_slice(p.as_bytes());
                let len = b.len() - start;
                let padded = (len + 8) / 8 * 8;
                b.resize(start + padded, 0);
            }
            prev = p.to_string();
        }
        b.extend_from_slice(&[0u8; 20]);
        b
    }

    /// A one-entry SHA-256 index with a valid trailer, as `git init --object-format=sha256`
    /// writes them.
    fn sha256_index(path: &str) -> Vec<u8> {
        use sha2::Digest as _;
        let mut b = b"DIRC".to_vec();
        b.extend_from_slice(&2u32.to_be_bytes());
        b.extend_from_slice(&1u32.to_be_bytes());
        let start = b.len();
        b.extend_from_slice(&[0u8; 40]);
        b.extend_from_slice(&[0xcd; 32]);
        b.extend_from_slice(&(path.len() as u16).to_be_bytes());
        b.extend_from_slice(path.as_bytes());
        let len = b.len() - start;
        b.resize(start + (len + 8) / 8 * 8, 0);
        let digest = sha2::Sha256::digest(&b);
        b.extend_from_slice(&digest);
        b
    }

    #[test]
    fn ordinary_indexes_of_every_version_pass() {
        for v in [2, 3, 4] {
            let idx = index(v, &["README", "src/lib.rs", "src/main.rs", "x/.gitignore"]);
            assert_eq!(entry_paths(&idx, 20).unwrap().len(), 4, "v{v}");
            assert!(check(&idx, false).is_ok(), "v{v}");
        }
    }

    #[test]
    fn paths_into_a_git_dir_are_caught_in_every_spelling() {
        for bad in [
            ".git/config",
            ".git/hooks/post-checkout",
            "sub/.git/config",
            ".GIT/config",
            ".git./config",
            ".git /config",
            "git~1/config",
            ".g\u{200c}it/config",
            "../outside",
            "a/./b",
            "/etc/passwd",
            "a//b",
        ] {
            for v in [2, 4] {
                let idx = index(v, &["README", bad]);
                assert!(
                    matches!(check(&idx, false), Err(IndexProblem::BadPath(_))),
                    "{bad:?} v{v}: {:?}",
                    check(&idx, false)
                );
            }
        }
        assert!(path_is_safe(b".gitignore") && path_is_safe(b".github/workflows/ci.yml"));
        assert!(path_is_safe(b"git") && path_is_safe(b".gitx"));
    }

    #[test]
    fn a_sha256_index_is_read_as_one() {
        let bad = sha256_index(".git/hooks/post-checkout");
        assert!(
            matches!(check(&bad, false), Err(IndexProblem::BadPath(_))),
            "{:?}",
            check(&bad, false)
        );
        assert!(check(&sha256_index("src/lib.rs"), false).is_ok());
        // With the trailer zeroed (index.skipHash) the repo's object format decides.
        let mut skip = bad.clone();
        let n = skip.len();
        skip[n - 32..].fill(0);
        assert!(matches!(check(&skip, true), Err(IndexProblem::BadPath(_))));
    }

    #[test]
    fn garbage_is_unreadable_not_accepted() {
        assert_eq!(check(b"DIRC", false).unwrap_err(), IndexProblem::Unreadable);
        assert_eq!(check(b"not an index at all", false).unwrap_err(), IndexProblem::Unreadable);
        let mut idx = index(2, &["a", "b"]);
        idx.truncate(idx.len() - 30);
        assert_eq!(check(&idx, false).unwrap_err(), IndexProblem::Unreadable);
    }

    #[test]
    fn a_real_index_written_by_git_parses() {
        let tmp = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| {
            std::process::Command::new("git")
                .current_dir(tmp.path())
                .args(args)
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        };
        if !run(&["init", "-q"]) {
            return; // no git: the synthetic indexes above still run
        }
        std::fs::create_dir_all(tmp.path().join("src/deep")).unwrap();
        for f in ["README", "src/a.rs", "src/deep/b.rs", ".gitignore"] {
            std::fs::write(tmp.path().join(f), "target/\n").unwrap();
        }
        assert!(run(&["add", "-A"]));
        let idx = std::fs::read(tmp.path().join(".git/index")).unwrap();
        assert_eq!(entry_paths(&idx, 20).unwrap().len(), 4);
        let entries = check(&idx, false).unwrap();
        // The staged object names are git's own blob ids.
        let readme = entries.iter().find(|e| e.path == b"README").unwrap();
        assert_eq!(readme.oid, blob_id(b"target/\n", 20));
        assert!(!readme.hidden && readme.mode == 0o100644);
        assert!(run(&["update-index", "--index-version", "4"]));
        assert!(run(&["update-index", "--assume-unchanged", "README"]));
        let idx = std::fs::read(tmp.path().join(".git/index")).unwrap();
        let entries = check(&idx, false).unwrap();
        assert!(entries.iter().find(|e| e.path == b"README").unwrap().hidden);
    }
}
