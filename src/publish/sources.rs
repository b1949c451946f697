//! Which files one `airlock publish` reads: the `audit-*.jsonl` and `sessions-*.jsonl` of the
//! scope's log directories (never `journal-*`) and the transcripts under the scope's agent homes
//! (Claude Code `.claude/projects/**/*.jsonl`, Codex `.codex/sessions/**/rollout-*.jsonl` and
//! `.codex/archived_sessions/**/*.jsonl`).
//!
//! Discovery only stats: agent homes are walked through directory fds ([`crate::fsat::walk`],
//! bounded, never following a symlink), and a symlink or other non-regular file where a
//! transcript would be is reported, never read.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::sys::stat::{FileStat, SFlag};

use crate::audit::logdir;
use crate::fsat;
use crate::paths::Paths;
use crate::repo::Repo;

/// Largest file read (bytes); a bigger one is reported and skipped, never half-read.
pub const FILE_CAP: u64 = 1 << 32;
/// Directory entries looked at per transcript root.
pub const WALK_MAX_ENTRIES: u64 = 100_000;
/// Directory levels descended below a transcript root.
pub const WALK_MAX_DEPTH: usize = 32;

/// What a file holds, which decides its envelopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Claude,
    Codex,
    Sessions,
    Audit,
}

impl Kind {
    /// The envelope `source`.
    pub fn source(self) -> &'static str {
        match self {
            Kind::Claude => "claude",
            Kind::Codex => "codex",
            Kind::Sessions => "session",
            Kind::Audit => "egress",
        }
    }

    pub fn is_transcript(self) -> bool {
        matches!(self, Kind::Claude | Kind::Codex)
    }
}

/// One file to publish.
#[derive(Debug, Clone)]
pub struct SourceFile {
    pub kind: Kind,
    /// Absolute host path: the state key and what messages name.
    pub abs: PathBuf,
    /// The trusted directory it is opened below (a log directory or an agent home).
    pub root: PathBuf,
    /// Its path below `root` (for a transcript: relative to the agent home, the envelope `file`).
    pub rel: PathBuf,
    /// Claude: relative to the projects directory; Codex: relative to the codex home
    /// (`.codex`). Part of offset-based ids.
    pub id_rel: String,
    /// As seen during discovery.
    pub st: FileStat,
}

/// A log directory in scope, with the sessions files it holds.
#[derive(Debug, Clone)]
pub struct LogDir {
    pub dir: PathBuf,
}

/// Everything one run looks at.
#[derive(Debug, Default)]
pub struct Discovery {
    pub files: Vec<SourceFile>,
    pub log_dirs: Vec<LogDir>,
    /// Claude agent homes (for the `cleanupPeriodDays` check).
    pub claude_homes: Vec<PathBuf>,
    /// Things refused or skipped, for the report (`path: why`).
    pub problems: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SourcesError {
    #[error("{0}")]
    Repo(#[from] crate::repo::RepoError),
    #[error("{0}")]
    LogDir(#[from] logdir::LogDirError),
    #[error("cannot list {path}: {source}; check its permissions")]
    List {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Which repos.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// The checkout containing this directory (`--repo DIR`, or the current directory).
    Repo(PathBuf),
    /// Every log directory and every agent home (`--all`).
    All,
}

/// The agents whose homes hold transcripts, with their directory under `~/.airlock/agent/`.
const TRANSCRIPT_AGENTS: [&str; 2] = ["claude", "codex"];

/// Finds the files of `scope`.
pub fn discover(paths: &Paths, scope: &Scope) -> Result<Discovery, SourcesError> {
    let mut out = Discovery::default();
    let logs_root = paths.logs_root();
    let agent_root = paths.airlock_dir().join("agent");
    let mut homes: Vec<(&'static str, PathBuf)> = Vec::new();
    match scope {
        Scope::Repo(dir) => {
            let repo = Repo::resolve(Some(dir), dir)?;
            if let Some(d) = logdir::locate(&logs_root, &repo.name, &repo.path)? {
                out.log_dirs.push(LogDir { dir: d });
            }
            let key = repo.key();
            for agent in TRANSCRIPT_AGENTS {
                let home = agent_root.join(agent).join(&key);
                if home.is_dir() {
                    homes.push((agent, home));
                }
            }
        }
        Scope::All => {
            for (d, _) in logdir::all(&logs_root)? {
                out.log_dirs.push(LogDir { dir: d });
            }
            for agent in TRANSCRIPT_AGENTS {
                let dir = agent_root.join(agent);
                let entries = match std::fs::read_dir(&dir) {
                    Ok(e) => e,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(source) => return Err(SourcesError::List { path: dir, source }),
                };
                let mut found: Vec<PathBuf> = entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .filter(|e| e.file_name() != OsStr::new(crate::agent::home::SHARED_DIR))
                    .map(|e| e.path())
                    .collect();
                found.sort();
                homes.extend(found.into_iter().map(|h| (agent, h)));
            }
        }
    }
    for ld in &out.log_dirs {
        log_files(&ld.dir, &mut out.files, &mut out.problems)?;
    }
    for (agent, home) in homes {
        if agent == "claude" {
            out.claude_homes.push(home.clone());
            walk_root(&home, ".claude/projects", Kind::Claude, &mut out);
        } else {
            walk_root(&home, ".codex/sessions", Kind::Codex, &mut out);
            walk_root(&home, ".codex/archived_sessions", Kind::Codex, &mut out);
        }
    }
    Ok(out)
}

/// `audit-<date>.jsonl` / `sessions-<date>.jsonl` in a log directory (sorted by name, so by
/// date). `~/.airlock/logs` is never visible inside a sandbox, but it is still read through
/// fds like the rest.
fn log_files(
    dir: &Path,
    files: &mut Vec<SourceFile>,
    problems: &mut Vec<String>,
) -> Result<(), SourcesError> {
    let fd = match fsat::open_root(dir) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(SourcesError::List { path: dir.to_owned(), source }),
    };
    let names = fsat::list_typed(fd.as_fd())
        .map_err(|source| SourcesError::List { path: dir.to_owned(), source })?;
    for (name, _) in names {
        let Some(s) = name.to_str() else { continue };
        let kind = match log_kind(s) {
            Some(k) => k,
            None => continue,
        };
        match fsat::lstat_at(fd.as_fd(), Path::new(&name)) {
            Ok(Some(st)) if fsat::kind(&st) == SFlag::S_IFREG => files.push(SourceFile {
                kind,
                abs: dir.join(&name),
                root: dir.to_owned(),
                rel: PathBuf::from(&name),
                id_rel: s.to_owned(),
                st,
            }),
            Ok(Some(_)) => problems
                .push(format!("{}: not a regular file, not published", dir.join(&name).display())),
            Ok(None) => {}
            Err(e) => problems.push(format!("{}: {e}", dir.join(&name).display())),
        }
    }
    Ok(())
}

/// The kind of a log directory file name, if it is published.
pub fn log_kind(name: &str) -> Option<Kind> {
    let (kind, rest) = if let Some(r) = name.strip_prefix("audit-") {
        (Kind::Audit, r)
    } else if let Some(r) = name.strip_prefix("sessions-") {
        (Kind::Sessions, r)
    } else {
        return None;
    };
    let date = rest.strip_suffix(".jsonl")?;
    let b = date.as_bytes();
    let dated = b.len() == 10
        && b.iter()
            .enumerate()
            .all(|(i, c)| if i == 4 || i == 7 { *c == b'-' } else { c.is_ascii_digit() });
    dated.then_some(kind)
}

/// Whether a transcript root's file (path relative to the root) is published.
fn wanted(kind: Kind, root: &str, rel: &Path) -> bool {
    let name = rel.file_name().map(OsStr::as_bytes).unwrap_or_default();
    if !name.ends_with(b".jsonl") {
        return false;
    }
    match kind {
        Kind::Codex if root.ends_with("/sessions") => name.starts_with(b"rollout-"),
        _ => true,
    }
}

/// Walks `<home>/<root>` for transcripts: regular files only, symlinks reported.
fn walk_root(home: &Path, root: &str, kind: Kind, out: &mut Discovery) {
    let home_fd = match fsat::open_root(home) {
        Ok(fd) => fd,
        Err(e) => {
            out.problems.push(format!("{}: cannot open the agent home: {e}", home.display()));
            return;
        }
    };
    let root_fd = match fsat::open_dir(home_fd.as_fd(), Path::new(root)) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return,
        Err(nix::errno::Errno::ELOOP) => {
            out.problems.push(format!(
                "{}: a symlink is in the way; Airlock never follows links in an agent home, \
                 nothing below it is published: remove it",
                home.join(root).display()
            ));
            return;
        }
        Err(e) => {
            out.problems.push(format!("{}: cannot open: {e}", home.join(root).display()));
            return;
        }
    };
    // The prefix of offset-based ids: Claude ids are relative to the projects directory,
    // Codex fallbacks to the codex home.
    let id_base = if kind == Kind::Claude { "" } else { root.trim_start_matches(".codex/") };
    let mut entries = 0u64;
    let mut cut = false;
    let stats = fsat::walk(root_fd.as_fd(), WALK_MAX_DEPTH, &mut |e| {
        entries += 1;
        if entries > WALK_MAX_ENTRIES {
            cut = true;
            return fsat::Step::Skip;
        }
        let t = fsat::kind(e.st);
        if t == SFlag::S_IFDIR {
            return fsat::Step::Descend;
        }
        let abs = home.join(root).join(e.rel);
        // Every symlink is reported, whatever its name: one standing for a directory would
        // hide the transcripts it points at, and only an agent makes links here.
        if t == SFlag::S_IFLNK {
            out.problems.push(format!(
                "{}: a symlink, never followed; not published (remove it)",
                abs.display()
            ));
            return fsat::Step::Skip;
        }
        if !wanted(kind, root, e.rel) {
            return fsat::Step::Skip;
        }
        if t != SFlag::S_IFREG {
            out.problems.push(format!("{}: not a regular file, not published", abs.display()));
            return fsat::Step::Skip;
        }
        let rel_s = e.rel.to_string_lossy();
        let id_rel =
            if id_base.is_empty() { rel_s.into_owned() } else { format!("{id_base}/{rel_s}") };
        out.files.push(SourceFile {
            kind,
            abs,
            root: home.to_owned(),
            rel: Path::new(root).join(e.rel),
            id_rel,
            st: *e.st,
        });
        fsat::Step::Skip
    });
    match stats {
        Ok(stats) => {
            for d in stats.too_deep {
                out.problems.push(format!(
                    "{}: more than {WALK_MAX_DEPTH} levels deep, not looked into",
                    home.join(root).join(d).display()
                ));
            }
            for d in stats.unreadable {
                out.problems.push(format!(
                    "{}: cannot be read, not published",
                    home.join(root).join(d).display()
                ));
            }
        }
        Err(e) => out.problems.push(format!("{}: {e}", home.join(root).display())),
    }
    if cut {
        out.problems.push(format!(
            "{}: more than {WALK_MAX_ENTRIES} entries; the rest is not published this time",
            home.join(root).display()
        ));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    #[test]
    fn log_kinds_are_dated_audit_and_sessions_only() {
        assert_eq!(log_kind("audit-2026-07-24.jsonl"), Some(Kind::Audit));
        assert_eq!(log_kind("sessions-2026-07-24.jsonl"), Some(Kind::Sessions));
        assert_eq!(log_kind("journal-abc.jsonl"), None);
        assert_eq!(log_kind("audit-x.jsonl"), None);
        assert_eq!(log_kind(".repo-path"), None);
    }

    #[test]
    fn transcripts_are_found_and_symlinks_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join(".airlock/agent/claude/r-12345678");
        let proj = home.join(".claude/projects/-work-r");
        fs::create_dir_all(proj.join("s1/subagents")).unwrap();
        fs::write(proj.join("s1.jsonl"), "{}\n").unwrap();
        fs::write(proj.join("s1/subagents/agent-1.jsonl"), "{}\n").unwrap();
        fs::write(proj.join("notes.txt"), "x").unwrap();
        fs::write(tmp.path().join("secret"), "s").unwrap();
        symlink(tmp.path().join("secret"), proj.join("evil.jsonl")).unwrap();
        symlink(tmp.path(), proj.join("up")).unwrap();
        let mut out = Discovery::default();
        walk_root(&home, ".claude/projects", Kind::Claude, &mut out);
        let ids: Vec<&str> = out.files.iter().map(|f| f.id_rel.as_str()).collect();
        assert_eq!(ids, ["-work-r/s1/subagents/agent-1.jsonl", "-work-r/s1.jsonl"]);
        assert_eq!(out.files[1].rel, Path::new(".claude/projects/-work-r/s1.jsonl"));
        // Both links are reported, the one standing for a directory too.
        assert_eq!(out.problems.len(), 2, "{:?}", out.problems);
        assert!(out.problems[0].contains("evil.jsonl"), "{:?}", out.problems);
        assert!(out.problems[1].contains("/up: a symlink"), "{:?}", out.problems);
    }

    #[test]
    fn codex_sessions_need_the_rollout_prefix() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("h");
        fs::create_dir_all(home.join(".codex/sessions/2026/03/04")).unwrap();
        fs::create_dir_all(home.join(".codex/archived_sessions")).unwrap();
        fs::write(home.join(".codex/sessions/2026/03/04/rollout-a.jsonl"), "").unwrap();
        fs::write(home.join(".codex/sessions/2026/03/04/other.jsonl"), "").unwrap();
        fs::write(home.join(".codex/archived_sessions/x.jsonl"), "").unwrap();
        let mut out = Discovery::default();
        walk_root(&home, ".codex/sessions", Kind::Codex, &mut out);
        walk_root(&home, ".codex/archived_sessions", Kind::Codex, &mut out);
        let ids: Vec<&str> = out.files.iter().map(|f| f.id_rel.as_str()).collect();
        assert_eq!(ids, ["sessions/2026/03/04/rollout-a.jsonl", "archived_sessions/x.jsonl"]);
    }
}
