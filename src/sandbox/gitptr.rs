//! Git pointers (SECURITY §7): files that send a git — the sandbox's, a host `git status`, or
//! Airlock's own mount plan — to another directory, and that an agent can write: a `.git`
//! *file* (`gitdir: …`, a worktree or a submodule checkout), `commondir` in a git dir,
//! `objects/info/alternates` and `http-alternates`, and `config.worktree`.
//!
//! They are honoured only as recorded by `airlock policy trust` in
//! `~/.airlock/trust/<repo key>.pointers`, only if their targets pass the host-path predicate
//! ([`crate::hostpath`]), and only if they belong to this repo: a worktree's admin directory
//! `…/.git/worktrees/<n>/` whose `gitdir` file points back at this repo's `.git` (and whose
//! `commondir` is that admin directory's grandparent), or a submodule git dir whose
//! `core.worktree` is this repo. A `commondir` anywhere else is never honoured.
//!
//! Discovery reads the repo through directory fds (no symlink followed, files capped) and never
//! opens a target before the predicate allowed it.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::fsutil;
use crate::fsat;
use crate::hostpath::HostPathRules;
use crate::paths::Paths;
use crate::repo::Repo;

/// Largest pointer file read.
const POINTER_CAP: u64 = 64 << 10;
/// How deep `modules/*/modules/*…` is followed.
const MAX_MODULE_DEPTH: usize = 4;
/// Pointer files inside a git dir, relative to it.
pub const GIT_DIR_POINTERS: &[(&str, PointerKind)] = &[
    ("commondir", PointerKind::Commondir),
    ("config.worktree", PointerKind::ConfigWorktree),
    ("objects/info/alternates", PointerKind::Alternates),
    ("objects/info/http-alternates", PointerKind::Alternates),
];

/// What kind of pointer a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PointerKind {
    /// A `.git` file: `gitdir: <path>`.
    Gitdir,
    /// `<git dir>/commondir`.
    Commondir,
    /// `objects/info/alternates` or `http-alternates`: object stores git reads from.
    Alternates,
    /// `config.worktree`: configuration git loads with `extensions.worktreeConfig`.
    ConfigWorktree,
}

/// One pointer file as found (and as recorded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pointer {
    /// The pointer file's host path.
    pub file: PathBuf,
    pub kind: PointerKind,
    /// Where a `gitdir:`/`commondir` leads, resolved as the kernel (and git) resolve it:
    /// symlinks first, then `..` (a lexical `l/../g` would name another place than git uses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<PathBuf>,
    /// `sha256:<hex>` of the file's bytes.
    pub digest: String,
}

/// Why a pointer is not honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PointerError {
    #[error(
        "{path} is a symlink; Airlock cannot protect a repo whose `.git` is a symlink — replace it \
         with the directory or a `gitdir:` file"
    )]
    GitSymlink { path: PathBuf },
    #[error("{path}: {reason}; fix or remove it")]
    Unreadable { path: PathBuf, reason: String },
    #[error("{path}: malformed `gitdir:` pointer; expected a line `gitdir: <path>`")]
    BadGitdir { path: PathBuf },
    #[error("{file} points git at {target}, which Airlock may not bind or follow: {why}")]
    Refused { file: PathBuf, target: PathBuf, why: String },
    #[error(
        "{file} points git at {target}, which does not belong to this repo ({why}); a session may \
         have planted it: remove it"
    )]
    Foreign { file: PathBuf, target: PathBuf, why: String },
    #[error(
        "{file} is a git pointer ({kind}) that `airlock policy trust` has not recorded (new, or \
         changed since); a session could have planted it. If you made it (git worktree, \
         submodule, sparse-checkout, --shared clone), review it and run `airlock policy trust \
         --repo {repo}`; otherwise remove it"
    )]
    Unrecorded { file: PathBuf, kind: &'static str, repo: PathBuf },
}

impl PointerKind {
    pub fn describe(self) -> &'static str {
        match self {
            Self::Gitdir => "a `gitdir:` file",
            Self::Commondir => "`commondir`",
            Self::Alternates => "an object alternates file",
            Self::ConfigWorktree => "`config.worktree`",
        }
    }
}

/// A git dir whose hooks and config the session protects: `rel` below `root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitDir {
    pub root: PathBuf,
    pub rel: PathBuf,
}

/// What the pointers of a repo amount to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    pub pointers: Vec<Pointer>,
    /// Git dirs the session must protect (the repo's own `.git`, a worktree's admin dir and
    /// common dir, a submodule's git dir).
    pub git_dirs: Vec<GitDir>,
    /// Git dirs outside the repo, bound read-write at their host path once honoured.
    pub external: Vec<PathBuf>,
    /// Pointers that can never be honoured, found while looking.
    pub problems: Vec<PointerError>,
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// `base/rel` resolved the way git resolves it (symlinks, then `..`); unresolvable paths stay
/// as written, and the predicate then refuses them.
fn resolve(base: &Path, rel: &str) -> PathBuf {
    let joined = base.join(rel);
    std::fs::canonicalize(&joined).unwrap_or(joined)
}

/// Whether `name` in `parent` is shaped like a git dir — a regular `HEAD` file and either
/// `objects/` and `refs/` directories or a `commondir` file (which lends them), what git checks
/// before it uses a directory as a repository (`is_git_directory` in git's setup.c) — looked
/// at without following symlinks.
pub fn is_git_dir_at(parent: BorrowedFd<'_>, name: &Path) -> bool {
    use nix::fcntl::AtFlags;
    use nix::sys::stat::SFlag;
    // git follows symlinks for HEAD, objects/ and refs/ (a symlinked HEAD is a valid symref),
    // so this looks through them too; it only stats, never reads through them.
    let is = |dir: BorrowedFd<'_>, p: &Path, want: SFlag| {
        nix::sys::stat::fstatat(dir, p, AtFlags::empty()).is_ok_and(|st| fsat::kind(&st) == want)
    };
    // The directory itself must be one (never through a symlink); then one stat for the common
    // case (no HEAD), and the directory is opened only when it has one.
    let is_dir =
        matches!(fsat::lstat_at(parent, name), Ok(Some(st)) if fsat::kind(&st) == SFlag::S_IFDIR);
    // HEAD: a file, or a symlink (a symref; git does not need its target to exist yet).
    let head = matches!(fsat::lstat_at(parent, &name.join("HEAD")), Ok(Some(st))
        if matches!(fsat::kind(&st), SFlag::S_IFREG | SFlag::S_IFLNK));
    if !is_dir || !head {
        return false;
    }
    let Ok(dir) = fsat::open_dir(parent, name) else { return false };
    is(dir.as_fd(), Path::new("commondir"), SFlag::S_IFREG)
        || (is(dir.as_fd(), Path::new("objects"), SFlag::S_IFDIR)
            && is(dir.as_fd(), Path::new("refs"), SFlag::S_IFDIR))
}

struct Discovery<'a> {
    repo: &'a Path,
    rules: &'a HostPathRules,
    found: Found,
}

impl Discovery<'_> {
    fn read(
        &mut self,
        dir: BorrowedFd<'_>,
        host: &Path,
        rel: &Path,
    ) -> Result<Option<Vec<u8>>, PointerError> {
        match fsat::read_capped(dir, rel, POINTER_CAP) {
            Ok(found) => Ok(found.map(|(bytes, _)| bytes)),
            Err(e) => Err(PointerError::Unreadable { path: host.join(rel), reason: e.to_string() }),
        }
    }

    /// The pointer files of the git dir `root/rel` (opened as `dir`), and its modules.
    fn git_dir(
        &mut self,
        dir: BorrowedFd<'_>,
        root: &Path,
        rel: &Path,
        depth: usize,
    ) -> Result<(), PointerError> {
        let host = root.join(rel);
        let gd = GitDir { root: root.to_path_buf(), rel: rel.to_path_buf() };
        if self.found.git_dirs.contains(&gd) {
            return Ok(());
        }
        self.found.git_dirs.push(gd);
        for (name, kind) in GIT_DIR_POINTERS {
            let Some(bytes) = self.read(dir, &host, Path::new(name))? else { continue };
            let target = match kind {
                PointerKind::Commondir => {
                    let text = String::from_utf8_lossy(&bytes);
                    Some(resolve(&host, text.trim()))
                }
                _ => None,
            };
            self.found.pointers.push(Pointer {
                file: host.join(name),
                kind: *kind,
                target,
                digest: sha256(&bytes),
            });
        }
        if depth >= MAX_MODULE_DEPTH {
            return Ok(());
        }
        let modules = match fsat::open_dir(dir, Path::new("modules")) {
            Ok(fd) => fd,
            Err(_) => return Ok(()),
        };
        self.modules(modules.as_fd(), root, &rel.join("modules"), depth)
    }

    /// The git dirs below a `modules/` directory: a submodule named `libs/foo` lives at
    /// `modules/libs/foo`, so directories that are not git dirs themselves are looked into.
    fn modules(
        &mut self,
        dir: BorrowedFd<'_>,
        root: &Path,
        rel: &Path,
        depth: usize,
    ) -> Result<(), PointerError> {
        for name in fsat::list(dir).unwrap_or_default() {
            let Ok(sub) = fsat::open_dir(dir, Path::new(&name)) else { continue };
            let sub_rel = rel.join(&name);
            if is_git_dir_at(dir, Path::new(&name)) {
                self.git_dir(sub.as_fd(), root, &sub_rel, depth + 1)?;
            } else if depth < MAX_MODULE_DEPTH * 2 {
                self.modules(sub.as_fd(), root, &sub_rel, depth + 1)?;
            }
        }
        Ok(())
    }

    /// A git dir outside the repo that a pointer leads to: judged by the predicate before it is
    /// opened at all.
    fn external(&mut self, file: &Path, target: &Path, depth: usize) -> Result<(), PointerError> {
        let canon = match self.rules.check(target) {
            Ok(c) => c,
            Err(why) => {
                self.found.problems.push(PointerError::Refused {
                    file: file.to_path_buf(),
                    target: target.to_path_buf(),
                    why: why.to_string(),
                });
                return Ok(());
            }
        };
        if canon.starts_with(self.repo) {
            let rel = canon.strip_prefix(self.repo).unwrap_or(Path::new("")).to_path_buf();
            let repo_fd = fsat::open_root(self.repo).map_err(|e| PointerError::Unreadable {
                path: self.repo.to_path_buf(),
                reason: e.to_string(),
            })?;
            return match fsat::open_dir(repo_fd.as_fd(), &rel) {
                Ok(fd) => self.git_dir(fd.as_fd(), self.repo, &rel, depth),
                Err(e) => Err(PointerError::Unreadable { path: canon, reason: e.to_string() }),
            };
        }
        let fd = fsat::open_root(&canon)
            .map_err(|e| PointerError::Unreadable { path: canon.clone(), reason: e.to_string() })?;
        if !self.found.external.contains(&canon) {
            self.found.external.push(canon.clone());
        }
        self.git_dir(fd.as_fd(), &canon, Path::new(""), depth)
    }
}

/// Finds every pointer of `repo` (a canonical host path) and the git dirs they lead to.
pub fn discover(repo: &Path, rules: &HostPathRules) -> Result<Found, PointerError> {
    let repo_fd = fsat::open_root(repo).map_err(|e| PointerError::Unreadable {
        path: repo.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut d = Discovery { repo, rules, found: Found::default() };
    let dot_git = repo.join(".git");
    let st = fsat::lstat_at(repo_fd.as_fd(), Path::new(".git"))
        .map_err(|e| PointerError::Unreadable { path: dot_git.clone(), reason: e.to_string() })?;
    let Some(st) = st else { return Ok(d.found) };
    match fsat::kind(&st) {
        nix::sys::stat::SFlag::S_IFLNK => return Err(PointerError::GitSymlink { path: dot_git }),
        nix::sys::stat::SFlag::S_IFDIR => {
            let fd = fsat::open_dir(repo_fd.as_fd(), Path::new(".git")).map_err(|e| {
                PointerError::Unreadable { path: dot_git.clone(), reason: e.to_string() }
            })?;
            d.git_dir(fd.as_fd(), repo, Path::new(".git"), 0)?;
        }
        _ => {
            let bytes = d.read(repo_fd.as_fd(), repo, Path::new(".git"))?.unwrap_or_default();
            let text = String::from_utf8_lossy(&bytes);
            let target = text
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("gitdir:"))
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| PointerError::BadGitdir { path: dot_git.clone() })?;
            let target = resolve(repo, target);
            d.found.pointers.push(Pointer {
                file: dot_git.clone(),
                kind: PointerKind::Gitdir,
                target: Some(target.clone()),
                digest: sha256(&bytes),
            });
            d.external(&dot_git, &target, 0)?;
        }
    }
    // A worktree's commondir leads to the main repo's git dir: bound too, once judged.
    let commons: Vec<(PathBuf, PathBuf)> = d
        .found
        .pointers
        .iter()
        .filter(|p| p.kind == PointerKind::Commondir)
        .filter_map(|p| Some((p.file.clone(), p.target.clone()?)))
        .collect();
    for (file, target) in commons {
        if belongs(&d.found, repo, &file).is_ok() {
            d.external(&file, &target, 1)?;
        }
    }
    Ok(d.found)
}

/// Whether the pointer in `file` belongs to this repo (see the module docs).
fn belongs(found: &Found, repo: &Path, file: &Path) -> Result<(), String> {
    let Some(p) = found.pointers.iter().find(|p| p.file == file) else { return Ok(()) };
    match p.kind {
        PointerKind::Alternates | PointerKind::ConfigWorktree => Ok(()),
        PointerKind::Gitdir => {
            let target = p.target.as_deref().unwrap_or(Path::new(""));
            if target.starts_with(repo) {
                return Ok(());
            }
            if is_worktree_admin(target, repo) || is_submodule_git_dir(target, repo) {
                Ok(())
            } else {
                Err("it is neither a worktree admin directory whose `gitdir` points back here \
                     nor a submodule git dir whose core.worktree is this repo"
                    .into())
            }
        }
        PointerKind::Commondir => {
            let admin = file.parent().unwrap_or(Path::new(""));
            let from_our_worktree = found
                .pointers
                .iter()
                .any(|g| g.kind == PointerKind::Gitdir && g.target.as_deref() == Some(admin));
            let grandparent = admin.parent().and_then(Path::parent);
            if from_our_worktree
                && admin.parent().and_then(Path::file_name) == Some("worktrees".as_ref())
                && grandparent == p.target.as_deref()
            {
                Ok(())
            } else {
                Err("a `commondir` is honoured only in this worktree's own admin directory \
                     (…/.git/worktrees/<name>/), pointing at its grandparent"
                    .into())
            }
        }
    }
}

/// `…/worktrees/<n>` whose `gitdir` file names `<repo>/.git`.
fn is_worktree_admin(target: &Path, repo: &Path) -> bool {
    if target.parent().and_then(Path::file_name) != Some("worktrees".as_ref()) {
        return false;
    }
    let Ok(fd) = fsat::open_root(target) else { return false };
    let Ok(Some((bytes, _))) = fsat::read_capped(fd.as_fd(), Path::new("gitdir"), POINTER_CAP)
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&bytes);
    resolve(target, text.trim()) == repo.join(".git")
}

/// A git dir whose `core.worktree` (git-config(1)) is `repo`.
fn is_submodule_git_dir(target: &Path, repo: &Path) -> bool {
    let Ok(fd) = fsat::open_root(target) else { return false };
    let Ok(Some((bytes, _))) = fsat::read_capped(fd.as_fd(), Path::new("config"), POINTER_CAP)
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&bytes);
    let mut in_core = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_core = line
                .trim_start_matches('[')
                .trim_end_matches(']')
                .trim()
                .eq_ignore_ascii_case("core");
            continue;
        }
        if !in_core {
            continue;
        }
        if let Some((key, value)) = line.split_once('=')
            && key.trim().eq_ignore_ascii_case("worktree")
        {
            let value = value.trim().trim_matches('"');
            return resolve(target, value) == repo;
        }
    }
    false
}

/// The record `airlock policy trust` writes: the pointers as they were when trusted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PointerRecord {
    /// The repo's canonical host path (records are keyed by a hash of it).
    pub repo: PathBuf,
    #[serde(default, rename = "pointer")]
    pub pointers: Vec<Pointer>,
}

/// `~/.airlock/trust/<repo key>.pointers`.
pub fn record_path(paths: &Paths, repo: &Repo) -> PathBuf {
    paths.trust_dir().join(format!("{}.pointers", repo.key()))
}

/// The recorded pointers (none if never trusted).
pub fn read_record(paths: &Paths, repo: &Repo) -> Result<PointerRecord, String> {
    let path = record_path(paths, repo);
    let bytes = match fsutil::read_private(&path) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(PointerRecord { repo: repo.path.clone(), pointers: Vec::new() }),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let text = std::str::from_utf8(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let record: PointerRecord =
        toml::from_str(text).map_err(|e| format!("{}: {}", path.display(), e.message()))?;
    if record.repo != repo.path {
        return Err(format!("{} is for {}", path.display(), record.repo.display()));
    }
    Ok(record)
}

/// Records the pointers found now (removes the record when there are none).
pub fn write_record(paths: &Paths, repo: &Repo, pointers: &[Pointer]) -> Result<PathBuf, String> {
    let path = record_path(paths, repo);
    if pointers.is_empty() {
        return match std::fs::remove_file(&path) {
            Ok(()) => Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(path),
            Err(e) => Err(format!("removing {}: {e}", path.display())),
        };
    }
    let record = PointerRecord { repo: repo.path.clone(), pointers: pointers.to_vec() };
    let text = toml::to_string(&record).map_err(|e| e.to_string())?;
    fsutil::private_dir(&paths.trust_dir())
        .and_then(|()| fsutil::write_private(&path, text.as_bytes()))
        .map_err(|e| {
            format!("writing {}: {e}; check that ~/.airlock is writable", path.display())
        })?;
    Ok(path)
}

/// Every pointer that may not be honoured, whatever any record says (predicate, belonging,
/// unreadable targets).
pub fn judge(found: &Found, repo: &Path) -> Vec<PointerError> {
    let mut problems = found.problems.clone();
    for p in &found.pointers {
        if let Err(why) = belongs(found, repo, &p.file) {
            problems.push(PointerError::Foreign {
                file: p.file.clone(),
                target: p.target.clone().unwrap_or_default(),
                why,
            });
        }
    }
    problems
}

/// [`judge`], plus every pointer that differs from the record.
pub fn verify(found: &Found, record: &PointerRecord, repo: &Path) -> Vec<PointerError> {
    let mut problems = judge(found, repo);
    for p in &found.pointers {
        if !record.pointers.contains(p) {
            problems.push(PointerError::Unrecorded {
                file: p.file.clone(),
                kind: p.kind.describe(),
                repo: repo.to_path_buf(),
            });
        }
    }
    problems
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::fs;

    struct Fx {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        rules: HostPathRules,
    }

    fn fx() -> Fx {
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap();
        fs::create_dir_all(root.join("home/.airlock")).unwrap();
        fs::create_dir_all(root.join("sock")).unwrap();
        let rules = HostPathRules::new(
            &root.join("home"),
            &root.join("home/.airlock"),
            &root.join("sock"),
            None,
            &[],
        );
        Fx { _tmp: tmp, root, rules }
    }

    /// A main repo with a worktree admin dir for `wt`, laid out as `git worktree add` does.
    fn worktree(root: &Path) -> (PathBuf, PathBuf) {
        let main = root.join("home/main");
        let admin = main.join(".git/worktrees/wt");
        fs::create_dir_all(main.join(".git/hooks")).unwrap();
        fs::create_dir_all(&admin).unwrap();
        let wt = root.join("home/wt");
        fs::create_dir_all(&wt).unwrap();
        fs::write(admin.join("commondir"), "../..\n").unwrap();
        fs::write(admin.join("gitdir"), format!("{}\n", wt.join(".git").display())).unwrap();
        fs::write(wt.join(".git"), format!("gitdir: {}\n", admin.display())).unwrap();
        (main, wt)
    }

    #[test]
    fn a_plain_repo_has_no_pointers() {
        let f = fx();
        let repo = f.root.join("home/r");
        fs::create_dir_all(repo.join(".git/hooks")).unwrap();
        let found = discover(&repo, &f.rules).unwrap();
        assert!(found.pointers.is_empty());
        assert_eq!(found.git_dirs, [GitDir { root: repo.clone(), rel: ".git".into() }]);
        assert!(verify(&found, &PointerRecord::default(), &repo).is_empty());
    }

    #[test]
    fn a_real_worktree_belongs_but_needs_its_record() {
        let f = fx();
        let (main, wt) = worktree(&f.root);
        let found = discover(&wt, &f.rules).unwrap();
        assert_eq!(found.external, [main.join(".git/worktrees/wt"), main.join(".git")]);
        assert!(judge(&found, &wt).is_empty(), "{:?}", judge(&found, &wt));
        let problems = verify(&found, &PointerRecord::default(), &wt);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems.iter().all(|p| matches!(p, PointerError::Unrecorded { .. })));
        let record = PointerRecord { repo: wt.clone(), pointers: found.pointers.clone() };
        assert!(verify(&found, &record, &wt).is_empty());
        // Changing where it points is a new pointer.
        fs::write(main.join(".git/worktrees/wt/commondir"), "../../..\n").unwrap();
        let again = discover(&wt, &f.rules).unwrap();
        assert!(!verify(&again, &record, &wt).is_empty());
    }

    #[test]
    fn a_planted_commondir_in_a_main_git_dir_never_belongs() {
        let f = fx();
        let repo = f.root.join("home/r");
        fs::create_dir_all(repo.join(".git")).unwrap();
        fs::create_dir_all(f.root.join("home/evil-git")).unwrap();
        fs::write(repo.join(".git/commondir"), "../../evil-git\n").unwrap();
        let found = discover(&repo, &f.rules).unwrap();
        let problems = judge(&found, &repo);
        assert!(matches!(problems.as_slice(), [PointerError::Foreign { .. }]), "{problems:?}");
        // Not bound, and its target is never scanned.
        assert!(found.external.is_empty());
        fs::create_dir_all(repo.join(".git/modules/m")).unwrap();
        fs::write(repo.join(".git/modules/m/HEAD"), "ref: refs/heads/main\n").unwrap();
        fs::write(repo.join(".git/modules/m/commondir"), "/").unwrap();
        let found = discover(&repo, &f.rules).unwrap();
        assert_eq!(judge(&found, &repo).len(), 2);
    }

    #[test]
    fn a_planted_gitdir_file_to_guarded_or_foreign_places_is_refused() {
        let f = fx();
        let repo = f.root.join("home/r");
        fs::create_dir_all(&repo).unwrap();
        for target in [f.root.join("home/.airlock"), f.root.join("home"), PathBuf::from("/etc")] {
            fs::write(repo.join(".git"), format!("gitdir: {}\n", target.display())).unwrap();
            let found = discover(&repo, &f.rules).unwrap();
            assert!(found.external.is_empty(), "{}", target.display());
            assert!(
                matches!(judge(&found, &repo).as_slice(), [PointerError::Refused { .. }, ..]),
                "{}: {:?}",
                target.display(),
                judge(&found, &repo)
            );
        }
        // An ordinary directory elsewhere passes the predicate but is not ours.
        let elsewhere = f.root.join("home/other/.git");
        fs::create_dir_all(&elsewhere).unwrap();
        fs::write(repo.join(".git"), format!("gitdir: {}\n", elsewhere.display())).unwrap();
        let found = discover(&repo, &f.rules).unwrap();
        assert!(matches!(judge(&found, &repo).as_slice(), [PointerError::Foreign { .. }]));
    }

    #[test]
    fn a_submodule_checkout_belongs_through_core_worktree() {
        let f = fx();
        let sup = f.root.join("home/super");
        let gd = sup.join(".git/modules/sub");
        fs::create_dir_all(&gd).unwrap();
        let sub = f.root.join("home/sub-checkout");
        fs::create_dir_all(&sub).unwrap();
        fs::write(gd.join("config"), "[core]\n\tworktree = ../../../../sub-checkout\n").unwrap();
        fs::write(sub.join(".git"), format!("gitdir: {}\n", gd.display())).unwrap();
        let found = discover(&sub, &f.rules).unwrap();
        assert!(judge(&found, &sub).is_empty(), "{:?}", judge(&found, &sub));
        assert_eq!(found.external, [gd]);
    }

    #[test]
    fn submodules_named_with_a_slash_are_found_where_git_keeps_them() {
        let f = fx();
        let repo = f.root.join("home/r");
        let module = repo.join(".git/modules/libs/foo");
        for d in ["objects", "refs"] {
            fs::create_dir_all(module.join(d)).unwrap();
        }
        fs::write(module.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        let found = discover(&repo, &f.rules).unwrap();
        assert!(
            found
                .git_dirs
                .contains(&GitDir { root: repo.clone(), rel: ".git/modules/libs/foo".into() }),
            "{:?}",
            found.git_dirs
        );
        assert!(!found.git_dirs.iter().any(|g| g.rel == Path::new(".git/modules/libs")));
    }

    #[test]
    fn pointer_targets_are_resolved_like_git_resolves_them() {
        let f = fx();
        let repo = f.root.join("home/r");
        fs::create_dir_all(&repo).unwrap();
        // `l/../g` with `l` a symlink: git goes to the link's parent's `g`, not the repo's.
        let elsewhere = f.root.join("home/elsewhere");
        fs::create_dir_all(elsewhere.join("x")).unwrap();
        fs::create_dir_all(elsewhere.join("g")).unwrap();
        fs::create_dir_all(repo.join("g")).unwrap();
        std::os::unix::fs::symlink(elsewhere.join("x"), repo.join("l")).unwrap();
        fs::write(repo.join(".git"), "gitdir: l/../g\n").unwrap();
        let found = discover(&repo, &f.rules).unwrap();
        assert_eq!(found.pointers[0].target.as_deref(), Some(elsewhere.join("g").as_path()));
        assert!(!judge(&found, &repo).is_empty(), "not this repo's");
    }

    #[test]
    fn alternates_and_config_worktree_are_recorded_by_digest() {
        let f = fx();
        let repo = f.root.join("home/r");
        fs::create_dir_all(repo.join(".git/objects/info")).unwrap();
        fs::write(repo.join(".git/objects/info/alternates"), "/srv/objects\n").unwrap();
        fs::write(repo.join(".git/config.worktree"), "[core]\n").unwrap();
        let found = discover(&repo, &f.rules).unwrap();
        assert_eq!(found.pointers.len(), 2);
        let record = PointerRecord { repo: repo.clone(), pointers: found.pointers.clone() };
        assert!(verify(&found, &record, &repo).is_empty());
        fs::write(repo.join(".git/config.worktree"), "[core]\n\tfsmonitor = x\n").unwrap();
        let found = discover(&repo, &f.rules).unwrap();
        assert!(matches!(
            verify(&found, &record, &repo).as_slice(),
            [PointerError::Unrecorded { .. }]
        ));
    }
}
