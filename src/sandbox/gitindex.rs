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
pub fn check(bytes: &[u8]) -> Result<(), IndexProblem> {
    // The hash size is not in the index itself; try SHA-1, then SHA-256.
    let paths = entry_paths(bytes, 20).or_else(|| entry_paths(bytes, 32));
    let Some(paths) = paths else { return Err(IndexProblem::Unreadable) };
    match paths.iter().find(|p| !path_is_safe(p)) {
        Some(bad) => Err(IndexProblem::BadPath(String::from_utf8_lossy(bad).into_owned())),
        None => Ok(()),
    }
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

/// Every entry's path, or `None` when the bytes do not parse as an index with this hash size.
fn entry_paths(b: &[u8], hash: usize) -> Option<Vec<Vec<u8>>> {
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
    let mut paths: Vec<Vec<u8>> = Vec::with_capacity(count.min(1 << 20));
    let mut prev: Vec<u8> = Vec::new();
    for _ in 0..count {
        let start = at;
        let flags = be16(b, at + 40 + hash)?;
        at += fixed;
        // Version 3+: an extended-flags word when the extended bit is set.
        if version >= 3 && flags & 0x4000 != 0 {
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
        paths.push(path);
    }
    // Extensions and the trailing hash follow; a well-formed index has at least the hash.
    (b.len() >= at + hash).then_some(paths)
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

    #[test]
    fn ordinary_indexes_of_every_version_pass() {
        for v in [2, 3, 4] {
            let idx = index(v, &["README", "src/lib.rs", "src/main.rs", "x/.gitignore"]);
            assert_eq!(entry_paths(&idx, 20).unwrap().len(), 4, "v{v}");
            assert_eq!(check(&idx), Ok(()), "v{v}");
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
                    matches!(check(&idx), Err(IndexProblem::BadPath(_))),
                    "{bad:?} v{v}: {:?}",
                    check(&idx)
                );
            }
        }
        assert!(path_is_safe(b".gitignore") && path_is_safe(b".github/workflows/ci.yml"));
        assert!(path_is_safe(b"git") && path_is_safe(b".gitx"));
    }

    #[test]
    fn garbage_is_unreadable_not_accepted() {
        assert_eq!(check(b"DIRC"), Err(IndexProblem::Unreadable));
        assert_eq!(check(b"not an index at all"), Err(IndexProblem::Unreadable));
        let mut idx = index(2, &["a", "b"]);
        idx.truncate(idx.len() - 30);
        assert_eq!(check(&idx), Err(IndexProblem::Unreadable));
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
        assert_eq!(check(&idx), Ok(()));
        assert!(run(&["update-index", "--index-version", "4"]));
        let idx = std::fs::read(tmp.path().join(".git/index")).unwrap();
        assert_eq!(check(&idx), Ok(()));
    }
}
