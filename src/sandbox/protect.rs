//! Repo paths the host runs or reads later (SECURITY §4, §7), as the session starts: which
//! listed paths exist (and their identity), which parents are pinned so they cannot be renamed
//! away, the placeholders that make absent top-level paths unusable for the session, and the
//! content of the editable toolchain files (so their code-running keys can be judged at the
//! end, in [`super::sweep`]).
//!
//! Everything here reads the repo through directory fds ([`crate::fsat`]); a listed path below
//! a symlinked parent records that parent instead, and nothing is ever looked up through it.
//! Git dirs come from [`super::gitptr`], already judged: this module follows no pointer.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::sys::stat::{FileStat, SFlag};

use super::gitptr::{self, GitDir};
use crate::fsat;

/// Top-level entries the host (or the developer's tools) run or read as configuration, that are
/// unusable for a session when absent at its start: an empty placeholder the supervisor creates
/// is bound read-only over the name, and removed afterwards.
pub const PLACEHOLDERS: &[(&str, Kind)] = &[
    (".envrc", Kind::File),
    (".vscode", Kind::Dir),
    (".idea", Kind::Dir),
    (".husky", Kind::Dir),
    (".mcp.json", Kind::File),
    (".pre-commit-config.yaml", Kind::File),
    (".devcontainer", Kind::Dir),
    (".claude/settings.json", Kind::File),
    (".claude/settings.local.json", Kind::File),
];
/// Listed top-level entries without a placeholder: read-only when present, quarantined at the
/// end when created (a new `.airlock.toml` is untrusted anyway; a `.git` the agent makes is
/// judged by [`super::sweep`]).
pub const LISTED_ONLY: &[&str] = &[
    ".airlock.toml",
    // Hook managers whose installed hooks read these at every host `git commit` (lefthook,
    // overcommit, husky 4, lint-staged run from a hook).
    "lefthook.yml",
    "lefthook.yaml",
    "lefthook.toml",
    "lefthook.json",
    "lefthook.jsonc",
    ".lefthook.yml",
    ".lefthook.yaml",
    ".lefthook.toml",
    ".lefthook.json",
    ".lefthook.jsonc",
    "lefthook-local.yml",
    "lefthook-local.yaml",
    "lefthook-local.toml",
    "lefthook-local.json",
    ".lefthook-local.yml",
    ".lefthook-local.yaml",
    ".config/lefthook.yml",
    ".config/lefthook.yaml",
    ".config/lefthook.toml",
    ".config/lefthook.json",
    ".overcommit.yml",
    ".huskyrc",
    ".huskyrc.json",
    ".huskyrc.js",
    ".huskyrc.cjs",
    ".lintstagedrc",
    ".lintstagedrc.json",
    ".lintstagedrc.yaml",
    ".lintstagedrc.yml",
    ".lintstagedrc.js",
    ".lintstagedrc.cjs",
    ".lintstagedrc.mjs",
    "lint-staged.config.js",
    "lint-staged.config.cjs",
    "lint-staged.config.mjs",
    // A dev container's `initializeCommand` runs on the host.
    ".devcontainer.json",
    // Codex's project config (MCP servers, notify commands) in trusted projects.
    ".codex",
];
/// Editable toolchain files at the top level whose start content is kept for the end review.
pub const TOOLCHAIN_FILES: &[&str] = &[
    "rust-toolchain.toml",
    "rust-toolchain",
    ".cargo/config.toml",
    ".cargo/config",
    "mise.toml",
    ".mise.toml",
    "mise.local.toml",
    ".mise.local.toml",
    ".config/mise.toml",
    ".config/mise/config.toml",
    ".mise/config.toml",
    ".tool-versions",
];
/// Largest toolchain file kept for the end review (bigger ones are held whole if changed).
pub const SNAPSHOT_CAP: u64 = 1 << 20;

/// Whether a placeholder is a file or a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

#[derive(Debug, thiserror::Error)]
pub enum ProtectError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ProtectError + '_ {
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

/// `(st_dev, st_ino)`: which inode a name held.
pub type Identity = (u64, u64);

pub fn identity(st: &FileStat) -> Identity {
    (st.st_dev, st.st_ino)
}

/// One protected path: `root` is the host directory it lives in (the repo, or an external
/// git dir), `rel` the path below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub root: PathBuf,
    pub rel: PathBuf,
    pub state: State,
    /// The inode at start (present paths): how the supervisor recognises its own placeholder.
    pub id: Option<Identity>,
    /// Created by the supervisor for this session; removed at its end.
    pub placeholder: bool,
    /// A placeholder-named path that was empty at the start — most likely another session's
    /// placeholder, which that session removes (detaching this session's bind over it). It is
    /// judged as absent: non-empty at the end means created.
    pub empty_at_start: bool,
    /// Its parents are not pinned (an embedded repo's files): it counts as unchanged at the end
    /// only if the same inode is still there.
    pub needs_identity: bool,
}

impl Listed {
    pub fn host_path(&self) -> PathBuf {
        self.root.join(&self.rel)
    }
}

/// A toolchain file's content at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub rel: PathBuf,
    /// `None` when it was larger than [`SNAPSHOT_CAP`] or unreadable.
    pub bytes: Option<Vec<u8>>,
}

/// The protected-path plan for one session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protection {
    /// Every listed path with its state at start.
    pub listed: Vec<Listed>,
    /// Directories (host paths) bound onto themselves so they cannot be renamed away.
    pub pinned: Vec<PathBuf>,
    /// Git directories outside the repo that honoured pointers lead to (bound read-write at
    /// their host path, "with the repo's access").
    pub external: Vec<PathBuf>,
    /// Every git dir the session protects (for the end sweep).
    pub git_dirs: Vec<GitDir>,
    /// Toolchain files present at start.
    pub snapshots: Vec<Snapshot>,
    /// Placeholder parents the supervisor created (removed at the end when empty).
    pub created_dirs: Vec<PathBuf>,
    /// The inodes of every git dir present at the start (the repo's, its submodules', embedded
    /// ones, external ones). A git dir found at the end that is not one of these — new, renamed
    /// in, or completed from a HEAD-less directory — is judged whole by the sweep.
    pub known_git_dirs: Vec<Identity>,
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

fn state_of(dir: BorrowedFd<'_>, name: &Path) -> std::io::Result<(State, Option<Identity>)> {
    let Some(st) = fsat::lstat_at(dir, name)? else { return Ok((State::Absent, None)) };
    let state = match fsat::kind(&st) {
        SFlag::S_IFLNK => State::Symlink(nix::fcntl::readlinkat(dir, name)?.into()),
        SFlag::S_IFDIR => State::Dir,
        _ => State::File,
    };
    Ok((state, Some(identity(&st))))
}

/// The state of `rel` below `root` (open as `root_fd`), never through a symlinked or
/// non-directory parent: such a path is reported as that parent (its relative path and state).
pub fn state_beneath(
    root_fd: BorrowedFd<'_>,
    rel: &Path,
) -> std::io::Result<(PathBuf, State, Option<Identity>)> {
    let comps: Vec<&OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    // The walk starts at `root_fd` itself (callers hold it open as a directory): re-opening
    // it first cost an openat2 + close per lookup, ~100 per `exec` (issue 22).
    let mut opened: Option<OwnedFd> = None;
    let mut at = PathBuf::new();
    for (i, name) in comps.iter().enumerate() {
        at.push(name);
        let dir = opened.as_ref().map_or(root_fd, |d| d.as_fd());
        let (state, id) = state_of(dir, Path::new(name))?;
        let last = i + 1 == comps.len();
        if last {
            return Ok((at, state, id));
        }
        match state {
            State::Dir => opened = Some(fsat::open_dir(dir, Path::new(name))?),
            State::Absent => return Ok((rel.to_path_buf(), State::Absent, None)),
            other => return Ok((at, other, id)),
        }
    }
    Ok((at, State::Dir, None))
}

struct Scan {
    prot: Protection,
    /// `(root, rel)` of every listed path: a linear search of `listed` (paths compare
    /// component by component) was ~0.15 ms of every `exec` in a sampling profile (issue 22).
    seen: std::collections::HashSet<(PathBuf, PathBuf)>,
}

impl Scan {
    fn list(
        &mut self,
        root: &Path,
        root_fd: BorrowedFd<'_>,
        rel: &Path,
    ) -> Result<State, ProtectError> {
        let (rel, state, id) = state_beneath(root_fd, rel).map_err(io_err(&root.join(rel)))?;
        if self.seen.insert((root.to_path_buf(), rel.clone())) {
            let empty_at_start =
                PLACEHOLDERS.iter().any(|(n, _)| Path::new(n) == rel) && is_empty(root_fd, &rel);
            self.prot.listed.push(Listed {
                root: root.to_path_buf(),
                rel,
                state: state.clone(),
                id,
                placeholder: false,
                empty_at_start,
                needs_identity: false,
            });
        }
        Ok(state)
    }

    /// [`Scan::list`] for a path whose parents are not pinned (see [`Listed::needs_identity`]).
    fn list_unpinned(
        &mut self,
        root: &Path,
        root_fd: BorrowedFd<'_>,
        rel: &Path,
    ) -> Result<(), ProtectError> {
        self.list(root, root_fd, rel)?;
        if let Some(l) = self.prot.listed.iter_mut().find(|l| l.root == root && l.rel == rel) {
            l.needs_identity = true;
        }
        Ok(())
    }

    fn pin(&mut self, dir: PathBuf) {
        if !self.prot.pinned.contains(&dir) {
            self.prot.pinned.push(dir);
        }
    }

    /// hooks, config and pointer files of one git dir, its worktree admin entries, and the
    /// parents that must stay put.
    fn git_dir(&mut self, gd: &GitDir) -> Result<(), ProtectError> {
        let root_fd = fsat::open_root(&gd.root).map_err(io_err(&gd.root))?;
        let dir = gd.root.join(&gd.rel);
        // The git dir and every directory between it and its tree's root stay put: a submodule
        // at `.git/modules/libs/foo` must not be swappable by renaming `.git/modules/libs`.
        for a in gd.rel.ancestors().filter(|a| !a.as_os_str().is_empty()) {
            self.pin(gd.root.join(a));
        }
        for name in
            ["hooks", "config"].into_iter().chain(gitptr::GIT_DIR_POINTERS.iter().map(|(n, _)| *n))
        {
            let rel = gd.rel.join(name);
            self.list(&gd.root, root_fd.as_fd(), &rel)?;
            // Every parent between the git dir and the listed path stays put.
            let mut parent = rel.parent();
            while let Some(p) = parent {
                if p == gd.rel || p.as_os_str().is_empty() {
                    break;
                }
                if matches!(state_beneath(root_fd.as_fd(), p), Ok((_, State::Dir, _))) {
                    self.pin(gd.root.join(p));
                }
                parent = p.parent();
            }
        }
        if let Ok(worktrees) = fsat::open_dir(root_fd.as_fd(), &gd.rel.join("worktrees")) {
            self.pin(dir.join("worktrees"));
            for name in fsat::list(worktrees.as_fd()).unwrap_or_default() {
                let admin = gd.rel.join("worktrees").join(&name);
                if matches!(state_beneath(root_fd.as_fd(), &admin), Ok((_, State::Dir, _))) {
                    self.pin(gd.root.join(&admin));
                    for file in ["commondir", "gitdir", "config.worktree"] {
                        self.list(&gd.root, root_fd.as_fd(), &admin.join(file))?;
                    }
                }
            }
        }
        if matches!(state_beneath(root_fd.as_fd(), &gd.rel.join("modules")), Ok((_, State::Dir, _)))
        {
            self.pin(dir.join("modules"));
        }
        Ok(())
    }
}

/// Scans `repo` (a canonical host path) for the protected paths, given the git dirs its
/// pointers were judged to lead to.
pub fn scan(
    repo: &Path,
    found: &gitptr::Found,
    host_git_configs: &[PathBuf],
) -> Result<Protection, ProtectError> {
    let mut s = Scan { prot: Protection::default(), seen: Default::default() };
    s.prot.external = found.external.clone();
    s.prot.git_dirs = found.git_dirs.clone();
    for gd in &found.git_dirs {
        s.git_dir(gd)?;
    }
    let repo_fd = fsat::open_root(repo).map_err(io_err(repo))?;
    // The top-level `.git` itself: a file is a pointer (read-only for the session), a directory
    // is pinned above (never bound read-only: git writes in it), and an absent one is judged at
    // the end.
    if !matches!(state_beneath(repo_fd.as_fd(), Path::new(".git")), Ok((_, State::Dir, _))) {
        s.list(repo, repo_fd.as_fd(), Path::new(".git"))?;
    }
    for name in LISTED_ONLY.iter().copied().chain(PLACEHOLDERS.iter().map(|(n, _)| *n)) {
        s.list(repo, repo_fd.as_fd(), Path::new(name))?;
    }
    let claude = Path::new(".claude");
    if let Ok((_, State::Dir, _)) = state_beneath(repo_fd.as_fd(), claude) {
        s.pin(repo.join(claude));
        let dir = fsat::open_dir(repo_fd.as_fd(), claude).map_err(|e| io_err(repo)(e.into()))?;
        for name in fsat::list(dir.as_fd()).map_err(io_err(&repo.join(claude)))? {
            if is_claude_settings(&name.to_string_lossy()) {
                s.list(repo, repo_fd.as_fd(), &claude.join(name))?;
            }
        }
    }
    hooks_in_the_worktree(&mut s, repo, repo_fd.as_fd(), found, host_git_configs);
    for gd in &found.git_dirs {
        let Ok(root) = fsat::open_root(&gd.root) else { continue };
        let st = if gd.rel.as_os_str().is_empty() {
            nix::sys::stat::fstat(&root).ok()
        } else {
            fsat::lstat_beneath(root.as_fd(), &gd.rel).ok().flatten()
        };
        s.prot.known_git_dirs.extend(st.as_ref().map(identity));
    }
    if super::gitptr::is_git_dir_at(repo_fd.as_fd(), Path::new("."))
        && let Ok(st) = nix::sys::stat::fstat(&repo_fd)
    {
        s.prot.known_git_dirs.push(identity(&st));
    }
    let (git_dirs, pointer_files) = embedded(repo_fd.as_fd());
    for rel in git_dirs {
        if let Ok(Some(st)) = fsat::lstat_beneath(repo_fd.as_fd(), &rel) {
            s.prot.known_git_dirs.push(identity(&st));
        }
        let names =
            ["hooks", "config"].into_iter().chain(gitptr::GIT_DIR_POINTERS.iter().map(|(n, _)| *n));
        for name in names {
            s.list_unpinned(repo, repo_fd.as_fd(), &rel.join(name))?;
        }
    }
    for rel in pointer_files {
        s.list_unpinned(repo, repo_fd.as_fd(), &rel)?;
    }
    for rel in TOOLCHAIN_FILES {
        if let Ok(Some((bytes, _))) =
            fsat::read_capped(repo_fd.as_fd(), Path::new(rel), SNAPSHOT_CAP)
        {
            s.prot.snapshots.push(Snapshot { rel: PathBuf::from(rel), bytes: Some(bytes) });
        } else if matches!(fsat::lstat_beneath(repo_fd.as_fd(), Path::new(rel)), Ok(Some(_))) {
            s.prot.snapshots.push(Snapshot { rel: PathBuf::from(rel), bytes: None });
        }
    }
    Ok(s.prot)
}

/// What the developer's git configuration makes a host `git` read or run from the worktree:
/// the directory `core.hooksPath` names (from the repo's git dirs or the global and system
/// files in `host_git_configs`; relative to the worktree's top, as git resolves it), the
/// targets of symlinked hooks, and files pulled in with `include.path` / `includeIf.*.path`
/// (relative to the including file). Those inside the repo are listed — read-only for the
/// session when present, judged at the end when absent — with every directory above pinned.
fn hooks_in_the_worktree(
    s: &mut Scan,
    repo: &Path,
    repo_fd: BorrowedFd<'_>,
    found: &gitptr::Found,
    host_git_configs: &[PathBuf],
) {
    use super::codekeys::{git_config_values, git_config_values_any_sub};
    let mut wanted: Vec<PathBuf> = Vec::new();
    let mut hooks_path: Option<String> = None;
    let mut read_config = |bytes: &[u8], dir: &Path, wanted: &mut Vec<PathBuf>| {
        if let Some(p) = git_config_values(bytes, "core", "hookspath").pop() {
            hooks_path = Some(p);
        }
        for inc in git_config_values_any_sub(bytes, "include", "path")
            .into_iter()
            .chain(git_config_values_any_sub(bytes, "includeif", "path"))
        {
            if !inc.starts_with('~') {
                wanted.push(dir.join(inc));
            }
        }
    };
    // System, then global, then the repo's own: later files win for hooksPath, as in git.
    for file in host_git_configs {
        if let Ok(bytes) = std::fs::read(file) {
            read_config(&bytes, file.parent().unwrap_or(Path::new("/")), &mut wanted);
        }
    }
    for gd in &found.git_dirs {
        let Ok(root) = fsat::open_root(&gd.root) else { continue };
        let dir = gd.root.join(&gd.rel);
        for name in ["config", "config.worktree"] {
            if let Ok(Some((config, _))) =
                fsat::read_capped(root.as_fd(), &gd.rel.join(name), SNAPSHOT_CAP)
            {
                read_config(&config, &dir, &mut wanted);
            }
        }
        let Ok(hooks) = fsat::open_dir(root.as_fd(), &gd.rel.join("hooks")) else { continue };
        for name in fsat::list(hooks.as_fd()).unwrap_or_default() {
            if let Ok(target) = nix::fcntl::readlinkat(hooks.as_fd(), name.as_os_str()) {
                wanted.push(dir.join("hooks").join(target));
            }
        }
    }
    if let Some(p) = hooks_path
        && !p.starts_with('~')
    {
        wanted.push(repo.join(p));
    }
    for path in wanted {
        // An absent target is judged by its lexical place (nothing there to resolve yet).
        let place = std::fs::canonicalize(&path).unwrap_or_else(|_| normalize(&path));
        let Ok(rel) = place.strip_prefix(repo) else { continue };
        if rel.as_os_str().is_empty() || rel == Path::new(".git") {
            continue;
        }
        let rel = rel.to_path_buf();
        for a in rel.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()) {
            if matches!(state_beneath(repo_fd, a), Ok((_, State::Dir, _))) {
                s.pin(repo.join(a));
            }
        }
        let _ = s.list(repo, repo_fd, &rel);
    }
}

/// Git dirs inside the repo besides its own top-level `.git` — embedded repositories and
/// directories shaped like one under any name — and `.git` files below the top (submodule
/// checkouts), found at the start with one `getdents` per directory (no stat per file).
fn embedded(repo_fd: BorrowedFd<'_>) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (mut git_dirs, mut files) = (Vec::new(), Vec::new());
    let Ok(top) = fsat::open_dir(repo_fd, Path::new("")) else { return (git_dirs, files) };
    let mut stack: Vec<(OwnedFd, PathBuf, usize)> = vec![(top, PathBuf::new(), 1)];
    while let Some((dir, rel, depth)) = stack.pop() {
        for (name, ty) in fsat::list_typed(dir.as_fd()).unwrap_or_default() {
            let at = rel.join(&name);
            if depth == 1 && name == ".git" {
                continue; // the repo's own, from gitptr
            }
            let ty = ty.or_else(|| {
                fsat::lstat_at(dir.as_fd(), Path::new(&name))
                    .ok()
                    .flatten()
                    .map(|st| fsat::kind(&st))
            });
            match ty {
                Some(SFlag::S_IFDIR) => {
                    if name == ".git" || gitptr::is_git_dir_at(dir.as_fd(), Path::new(&name)) {
                        git_dirs.push(at);
                    } else if depth < super::sweep::MAX_DEPTH
                        && let Ok(sub) = fsat::open_dir(dir.as_fd(), Path::new(&name))
                    {
                        stack.push((sub, at, depth + 1));
                    }
                }
                Some(SFlag::S_IFREG) if name == ".git" => files.push(at),
                _ => {}
            }
        }
    }
    (git_dirs, files)
}

/// An empty regular file or an empty directory at `rel` (no symlink followed).
pub fn is_empty(root_fd: BorrowedFd<'_>, rel: &Path) -> bool {
    match fsat::lstat_beneath(root_fd, rel) {
        Ok(Some(st)) if fsat::kind(&st) == SFlag::S_IFREG => st.st_size == 0,
        Ok(Some(st)) if fsat::kind(&st) == SFlag::S_IFDIR => fsat::open_dir(root_fd, rel)
            .ok()
            .and_then(|fd| fsat::list(fd.as_fd()).ok())
            .is_some_and(|names| names.is_empty()),
        _ => false,
    }
}

/// `settings*.json` in `.claude/`.
pub fn is_claude_settings(name: &str) -> bool {
    name.starts_with("settings") && name.ends_with(".json")
}

/// Creates the placeholders for every absent [`PLACEHOLDERS`] entry (empty file or directory
/// on the host, bound read-only for the session) and marks them listed. An entry that cannot be
/// made (a read-only repo, a symlinked parent) stays `Absent` and is judged at the end instead;
/// the returned warnings say so.
pub fn make_placeholders(prot: &mut Protection, repo: &Path) -> Vec<String> {
    let mut warnings = Vec::new();
    let Ok(repo_fd) = fsat::open_root(repo) else {
        return vec![format!("{}: cannot open the repo to make placeholders", repo.display())];
    };
    for (name, kind) in PLACEHOLDERS {
        let rel = Path::new(name);
        let Some(item) = absent_at(&mut prot.listed, repo, rel) else { continue };
        match make_one(repo_fd.as_fd(), rel, *kind, &mut prot.created_dirs, repo) {
            Ok((state, id)) => {
                item.state = state;
                item.id = Some(id);
                item.placeholder = true;
            }
            Err(e) => warnings.push(format!(
                "{} could not be made unusable for the session ({e}); it is checked at the end",
                repo.join(rel).display()
            )),
        }
    }
    if prot.created_dirs.iter().any(|d| d == &repo.join(".claude")) {
        prot.pinned.push(repo.join(".claude"));
    }
    warnings
}

/// The listed entry `rel` of `repo` when it was absent at the start (a placeholder's place).
fn absent_at<'a>(listed: &'a mut [Listed], repo: &Path, rel: &Path) -> Option<&'a mut Listed> {
    listed.iter_mut().find(|l| l.root == repo && l.rel == rel && l.state == State::Absent)
}

/// `prot` as [`make_placeholders`] will leave it when every placeholder can be made, without
/// touching the filesystem: each absent [`PLACEHOLDERS`] entry becomes a file or directory, and
/// `.claude` is pinned when a placeholder under it will create it. The supervisor plans the
/// sandbox's mounts from this so it can fork before the placeholders exist (issue 22); it then
/// compares that plan with one made from the real outcome, so a wrong guess costs a second
/// fork, never a different sandbox.
pub fn with_predicted_placeholders(prot: &Protection, repo: &Path) -> Protection {
    let mut predicted = prot.clone();
    let claude = repo.join(".claude");
    let mut creates_claude = false;
    for (name, kind) in PLACEHOLDERS {
        let rel = Path::new(name);
        let Some(item) = absent_at(&mut predicted.listed, repo, rel) else { continue };
        item.state = if *kind == Kind::Dir { State::Dir } else { State::File };
        item.placeholder = true;
        // A placeholder below `.claude` makes the directory when the scan did not pin it (it
        // pins an existing `.claude` directory).
        if rel.starts_with(".claude") && !prot.pinned.contains(&claude) {
            creates_claude = true;
        }
    }
    if creates_claude {
        predicted.created_dirs.push(claude.clone());
        predicted.pinned.push(claude);
    }
    predicted
}

fn make_one(
    repo_fd: BorrowedFd<'_>,
    rel: &Path,
    kind: Kind,
    created_dirs: &mut Vec<PathBuf>,
    repo: &Path,
) -> std::io::Result<(State, Identity)> {
    let (parent, name) = fsat::split(rel);
    let parent_fd = match parent {
        None => fsat::open_dir(repo_fd, Path::new(""))?,
        Some(p) => match fsat::open_dir(repo_fd, p) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) => {
                let fd = fsat::mkdir_open(repo_fd, p.as_os_str(), 0o755)?;
                created_dirs.push(repo.join(p));
                fd
            }
            Err(e) => return Err(e.into()),
        },
    };
    match kind {
        Kind::Dir => nix::sys::stat::mkdirat(
            parent_fd.as_fd(),
            name,
            nix::sys::stat::Mode::from_bits_truncate(0o755),
        )?,
        Kind::File => {
            let fd = nix::fcntl::openat2(
                parent_fd.as_fd(),
                name,
                fsat::how(
                    nix::fcntl::OFlag::O_WRONLY
                        | nix::fcntl::OFlag::O_CREAT
                        | nix::fcntl::OFlag::O_EXCL,
                    0o644,
                ),
            )?;
            drop(fd);
        }
    }
    let st = fsat::lstat_at(parent_fd.as_fd(), name)?
        .ok_or_else(|| std::io::Error::other("placeholder vanished"))?;
    let state = if kind == Kind::Dir { State::Dir } else { State::File };
    Ok((state, identity(&st)))
}

/// Removes this session's placeholders that are still exactly what was made (same inode,
/// empty), and created parents left empty. Anything else is left alone for the sweep.
pub fn remove_placeholders(prot: &Protection, repo: &Path) {
    let Ok(repo_fd) = fsat::open_root(repo) else { return };
    for item in prot.listed.iter().filter(|l| l.placeholder && l.root == repo) {
        let (parent, name) = fsat::split(&item.rel);
        let Ok(parent_fd) = fsat::open_dir(repo_fd.as_fd(), parent.unwrap_or(Path::new(""))) else {
            continue;
        };
        let Ok(Some(st)) = fsat::lstat_at(parent_fd.as_fd(), name) else { continue };
        if Some(identity(&st)) != item.id {
            continue;
        }
        let flag = match item.state {
            State::Dir => nix::unistd::UnlinkatFlags::RemoveDir,
            _ if st.st_size == 0 => nix::unistd::UnlinkatFlags::NoRemoveDir,
            _ => continue,
        };
        // rmdir fails on a non-empty directory: then it is not ours any more.
        let _ = nix::unistd::unlinkat(parent_fd.as_fd(), name, flag);
    }
    for dir in prot.created_dirs.iter().rev() {
        if let Ok(rel) = dir.strip_prefix(repo) {
            let _ =
                nix::unistd::unlinkat(repo_fd.as_fd(), rel, nix::unistd::UnlinkatFlags::RemoveDir);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::hostpath::HostPathRules;
    use std::fs;

    fn rules(root: &Path) -> HostPathRules {
        HostPathRules::new(
            &root.join("home"),
            &root.join("home/.airlock"),
            &root.join("s"),
            None,
            &[],
        )
    }

    fn scan_repo(repo: &Path) -> Protection {
        let root = repo.parent().unwrap();
        let found = gitptr::discover(repo, &rules(root)).unwrap();
        scan(repo, &found, &[]).unwrap()
    }

    fn states(p: &Protection) -> Vec<(String, State)> {
        p.listed.iter().map(|l| (l.rel.display().to_string(), l.state.clone())).collect()
    }

    #[test]
    fn scans_git_dir_worktree_entries_and_top_level() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = fs::canonicalize(tmp.path()).unwrap().join("r");
        fs::create_dir_all(repo.join(".git/hooks")).unwrap();
        fs::create_dir_all(repo.join(".git/objects/info")).unwrap();
        fs::create_dir_all(repo.join(".git/worktrees/w")).unwrap();
        fs::write(repo.join(".git/worktrees/w/commondir"), "../..").unwrap();
        fs::write(repo.join(".git/config"), "").unwrap();
        fs::create_dir_all(repo.join(".git/modules/sub/hooks")).unwrap();
        // A submodule's git dir, shaped as git makes it.
        fs::create_dir_all(repo.join(".git/modules/sub/objects")).unwrap();
        fs::create_dir_all(repo.join(".git/modules/sub/refs")).unwrap();
        fs::write(repo.join(".git/modules/sub/HEAD"), "ref: refs/heads/main\n").unwrap();
        fs::write(repo.join(".airlock.toml"), "").unwrap();
        fs::create_dir_all(repo.join(".claude")).unwrap();
        fs::write(repo.join(".claude/settings.x.json"), "{}").unwrap();
        fs::write(repo.join("rust-toolchain.toml"), "[toolchain]\nchannel = \"stable\"\n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", repo.join(".envrc")).unwrap();
        let p = scan_repo(&repo);
        let s = states(&p);
        for (rel, st) in [
            (".git/hooks", State::Dir),
            (".git/config", State::File),
            (".git/commondir", State::Absent),
            (".git/objects/info/alternates", State::Absent),
            (".git/config.worktree", State::Absent),
            (".git/worktrees/w/commondir", State::File),
            (".git/worktrees/w/gitdir", State::Absent),
            (".git/modules/sub/hooks", State::Dir),
            (".git/modules/sub/config", State::Absent),
            (".airlock.toml", State::File),
            (".envrc", State::Symlink("/etc/passwd".into())),
            (".mcp.json", State::Absent),
            (".devcontainer", State::Absent),
            (".claude/settings.json", State::Absent),
            (".claude/settings.x.json", State::File),
        ] {
            assert!(s.contains(&(rel.into(), st.clone())), "{rel} {st:?} in {s:?}");
        }
        for pin in [
            ".git",
            ".git/objects",
            ".git/objects/info",
            ".git/worktrees",
            ".git/worktrees/w",
            ".git/modules",
            ".git/modules/sub",
            ".claude",
        ] {
            assert!(p.pinned.contains(&repo.join(pin)), "{pin} in {:?}", p.pinned);
        }
        assert_eq!(p.snapshots.len(), 1);
        assert!(p.external.is_empty());
    }

    #[test]
    fn a_symlinked_parent_is_recorded_instead_of_looked_through() {
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap();
        let repo = root.join("r");
        let outside = root.join("host-config");
        fs::create_dir_all(&repo).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("settings.json"), "host").unwrap();
        std::os::unix::fs::symlink(&outside, repo.join(".claude")).unwrap();
        let p = scan_repo(&repo);
        assert!(
            p.listed
                .iter()
                .any(|l| l.rel == Path::new(".claude") && matches!(l.state, State::Symlink(_)))
        );
        assert!(
            !p.listed.iter().any(|l| l.rel.starts_with(".claude") && l.rel != Path::new(".claude"))
        );
    }

    #[test]
    fn placeholders_are_made_for_absent_entries_and_removed_only_if_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = fs::canonicalize(tmp.path()).unwrap().join("r");
        fs::create_dir_all(repo.join(".git")).unwrap();
        fs::write(repo.join(".mcp.json"), "{}").unwrap();
        let mut p = scan_repo(&repo);
        assert!(make_placeholders(&mut p, &repo).is_empty());
        assert_eq!(fs::read(repo.join(".envrc")).unwrap(), b"");
        assert!(repo.join(".vscode").is_dir() && repo.join(".claude/settings.json").is_file());
        assert_eq!(fs::read_to_string(repo.join(".mcp.json")).unwrap(), "{}");
        assert!(p.pinned.contains(&repo.join(".claude")));
        // The developer replaced one on the host meanwhile: it stays.
        fs::remove_dir(repo.join(".idea")).unwrap();
        fs::create_dir(repo.join(".idea")).unwrap();
        fs::write(repo.join(".idea/workspace.xml"), "<x/>").unwrap();
        fs::remove_file(repo.join(".envrc")).unwrap();
        fs::write(repo.join(".envrc"), "use flake").unwrap();
        remove_placeholders(&p, &repo);
        for gone in [".vscode", ".claude", ".devcontainer"] {
            assert!(fs::symlink_metadata(repo.join(gone)).is_err(), "{gone} left behind");
        }
        assert!(repo.join(".idea/workspace.xml").is_file());
        assert_eq!(fs::read_to_string(repo.join(".envrc")).unwrap(), "use flake");
        assert_eq!(fs::read_to_string(repo.join(".mcp.json")).unwrap(), "{}");
    }
    /// What a plan reads of a protection: each listed path's state and whether it is a
    /// placeholder, and the pins (ids and created parents only matter at the end).
    fn planned(p: &Protection) -> (Vec<(PathBuf, State, bool)>, Vec<PathBuf>) {
        let listed = p.listed.iter().map(|l| (l.host_path(), l.state.clone(), l.placeholder));
        (listed.collect(), p.pinned.clone())
    }

    #[test]
    fn the_predicted_placeholders_are_the_ones_made_with_or_without_a_claude_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap();
        let bare = root.join("bare");
        fs::create_dir_all(bare.join(".git")).unwrap();
        let claude = root.join("claude");
        fs::create_dir_all(claude.join(".git")).unwrap();
        fs::create_dir_all(claude.join(".claude")).unwrap();
        fs::write(claude.join(".claude/settings.json"), "{}").unwrap();
        fs::write(claude.join(".envrc"), "use flake").unwrap();
        for repo in [bare, claude] {
            let mut p = scan_repo(&repo);
            let predicted = with_predicted_placeholders(&p, &repo);
            assert!(make_placeholders(&mut p, &repo).is_empty());
            assert_eq!(planned(&predicted), planned(&p), "{}", repo.display());
            remove_placeholders(&p, &repo);
        }
    }

    #[test]
    fn a_placeholder_that_cannot_be_made_leaves_the_prediction_wrong() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = fs::canonicalize(tmp.path()).unwrap().join("r");
        fs::create_dir_all(repo.join(".git")).unwrap();
        let mut p = scan_repo(&repo);
        let predicted = with_predicted_placeholders(&p, &repo);
        // Made on the host between the scan and the placeholders: theirs, not ours.
        fs::create_dir(repo.join(".vscode")).unwrap();
        let warnings = make_placeholders(&mut p, &repo);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_ne!(planned(&predicted), planned(&p));
        let vscode = p.listed.iter().find(|l| l.rel == Path::new(".vscode")).unwrap();
        assert_eq!((&vscode.state, vscode.placeholder), (&State::Absent, false));
        remove_placeholders(&p, &repo);
        assert!(repo.join(".vscode").is_dir());
    }
}
