//! The end of a session, before control returns to the host (SECURITY §7): everything the
//! session left in the repo, in external git dirs and in the agent home is judged, and what
//! the host would run, mount or follow is taken out of the way ([`super::quarantine`]) or
//! neutralized in place.
//!
//! What changed is told by `ctime` (inode change time), which the agent cannot set back:
//! every write, chmod, rename or link moves it to "now" (inode(7)). The kernel stamps inodes
//! from the coarse realtime clock (or a finer one that never falls below it). The supervisor
//! reads that clock when setup begins ([`Stamp`] `T0`), and the sandbox's init does not start
//! the command before the clock has moved past `T0` ([`wait_past`], overlapping init's own
//! setup), so everything the agent changes has `ctime > T0` while what the host wrote before
//! has `ctime <= T0`. The walk is complete — never truncated — and goes
//! through directory fds only ([`crate::fsat::walk`]); a tree deeper than [`MAX_DEPTH`] is
//! moved aside whole, since what lies below cannot be vouched for.
//!
//! Rules, at any depth:
//! - a listed path (see [`super::protect`]) that appeared, or whose symlink target changed →
//!   quarantined; paths present at the start were read-only binds and are left alone;
//!   placeholders are removed last;
//! - a `.git` *file* that changed → quarantined (a new git pointer);
//! - inside any git dir: changed `hooks/*` (not `*.sample`), `commondir`, `config.worktree`,
//!   `objects/info/{alternates,http-alternates}`, `worktrees/*/{commondir,gitdir,
//!   config.worktree}` → quarantined; a changed `config` keeps only inert keys
//!   ([`super::codekeys`], regenerated) and the rest is held;
//! - a changed `.envrc`, `.vscode/`, `.idea/`, `.devcontainer/`, `.claude/settings*.json`,
//!   `.claude/{commands,agents,hooks,skills}/` → quarantined whole;
//! - a changed toolchain file (`rust-toolchain.toml`, `.cargo/config.toml`, `mise.toml`, …):
//!   its code-running keys are held, the rest kept;
//! - S_ISUID/S_ISGID on anything that changed (a directory's S_ISGID only when its parent
//!   lacks it) → stripped; also in the agent home;
//! - reported, never acted on: changed agent instruction files (`CLAUDE.md`, `AGENTS.md`, …)
//!   and every symlink pointing outside the repo.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::stat::{FileStat, SFlag};

use super::codekeys::{self, ConfigKind};
use super::protect::{self, Protection, State};
use super::quarantine::{Item, Store};
use crate::fsat::{self, Entry, Step};

/// Directory levels walked; deeper trees are moved aside whole.
pub const MAX_DEPTH: usize = 200;
/// Largest config file reviewed key by key (bigger changed ones are quarantined whole).
const CONFIG_CAP: u64 = 1 << 20;
/// Outside-pointing symlinks listed by name in the end record (all are counted).
const LISTED_SYMLINKS: usize = 1000;

/// Nested names quarantined whole when anything in them changed.
const NESTED_WHOLE: &[&str] = &[".envrc", ".vscode", ".idea", ".devcontainer"];
/// Code-running parts of a `.claude/` directory (besides `settings*.json`).
const CLAUDE_WHOLE: &[&str] = &["commands", "agents", "hooks", "skills"];
/// Agent instruction files: changed ones are listed in the end record.
pub const INSTRUCTION_FILES: &[&str] = &[
    "CLAUDE.md",
    "CLAUDE.local.md",
    "AGENTS.md",
    "AGENT.md",
    "GEMINI.md",
    ".cursorrules",
    ".windsurfrules",
    "copilot-instructions.md",
];

/// A moment as `(seconds, nanoseconds)` since the epoch, comparable with `st_ctime`.
pub type Stamp = (i64, i64);

fn coarse_now() -> Stamp {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME_COARSE) {
        Ok(ts) => (ts.tv_sec(), ts.tv_nsec()),
        // Without a clock every entry counts as changed: safe, if noisy.
        Err(_) => (0, 0),
    }
}

/// `T0`: the coarse realtime clock when a session's setup begins.
pub fn session_start() -> Stamp {
    coarse_now()
}

/// Returns once the coarse clock is past `t0` (at most one tick, 4 ms at HZ=250; usually over
/// by the time init has built the walls). Called by init right before it starts the command.
pub fn wait_past(t0: Stamp) {
    let deadline = Instant::now() + Duration::from_millis(100);
    while coarse_now() <= t0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(250));
    }
}

fn ctime(st: &FileStat) -> Stamp {
    (st.st_ctime, st.st_ctime_nsec)
}

/// What one session's end looks at.
#[derive(Debug, Clone)]
pub struct Sweep<'a> {
    pub repo: &'a Path,
    pub prot: &'a Protection,
    /// The agent home (`run`), swept for setuid bits only.
    pub home: Option<PathBuf>,
    /// `T0` ([`session_start`]): changed means `ctime > since`.
    pub since: Stamp,
}

/// What the sweep did and saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub items: Vec<Item>,
    pub setuid_stripped: Vec<PathBuf>,
    pub outside_symlinks: Vec<(PathBuf, PathBuf)>,
    pub outside_symlinks_total: u64,
    pub instructions_changed: Vec<PathBuf>,
    pub entries: u64,
    pub unreadable: Vec<PathBuf>,
    pub warnings: Vec<String>,
    pub elapsed: Duration,
}

/// Runs the sweep; never fails (what it cannot do is in the report's warnings and items).
pub fn run(s: &Sweep<'_>, store: &mut Store) -> Report {
    let started = Instant::now();
    let mut report = Report::default();
    listed(s, store, &mut report);
    match fsat::open_root(s.repo) {
        Ok(fd) => tree(s, store, &mut report, s.repo, fd.as_fd(), Tree::Repo),
        Err(e) => report.warnings.push(format!("{}: cannot open the repo: {e}", s.repo.display())),
    }
    for ext in &s.prot.external {
        match fsat::open_root(ext) {
            Ok(fd) => tree(s, store, &mut report, ext, fd.as_fd(), Tree::GitDir),
            Err(e) => report.warnings.push(format!("{}: cannot open: {e}", ext.display())),
        }
    }
    if let Some(home) = &s.home {
        match fsat::open_root(home) {
            Ok(fd) => tree(s, store, &mut report, home, fd.as_fd(), Tree::Home),
            Err(e) => report.warnings.push(format!("{}: cannot open: {e}", home.display())),
        }
    }
    // Last: removing them touches their parents' ctime, which the rules above read.
    protect::remove_placeholders(s.prot, s.repo);
    report.elapsed = started.elapsed();
    report
}

/// The listed paths against their state at start.
fn listed(s: &Sweep<'_>, store: &mut Store, report: &mut Report) {
    let mut roots: Vec<(PathBuf, std::os::fd::OwnedFd)> = Vec::new();
    for item in &s.prot.listed {
        if item.placeholder {
            continue;
        }
        if !roots.iter().any(|(r, _)| *r == item.root) {
            match fsat::open_root(&item.root) {
                Ok(fd) => roots.push((item.root.clone(), fd)),
                Err(e) => {
                    report.warnings.push(format!("{}: cannot open: {e}", item.root.display()));
                    continue;
                }
            }
        }
        let Some((_, root_fd)) = roots.iter().find(|(r, _)| *r == item.root) else { continue };
        let Ok((rel, now, _)) = protect::state_beneath(root_fd.as_fd(), &item.rel) else {
            continue;
        };
        let why = if rel != item.rel {
            // A parent swapped for a symlink or a file: that parent is what goes.
            Some("replaced")
        } else {
            match (&item.state, &now) {
                (State::Absent, State::Absent) => None,
                // A new top-level `.git` directory is a `git init`: judged by the tree rules.
                (State::Absent, State::Dir) if item.rel == Path::new(".git") => None,
                (State::Absent, _) => Some("created"),
                _ if item.empty_at_start && !protect::is_empty(root_fd.as_fd(), &rel) => {
                    Some("created")
                }
                (State::Symlink(a), State::Symlink(b)) if a == b => None,
                (State::Symlink(_), _) => Some("replaced"),
                // A path present at the start was a read-only bind under pinned parents: only
                // the host could have replaced it (a `git config` rewriting `.git/config`), and
                // moving the developer's own file away would be the wrong answer.
                _ => None,
            }
        };
        if let Some(why) = why
            && !report.items.iter().any(|i| i.root == item.root && rel.starts_with(&i.path))
        {
            report.items.push(store.take(&item.root, root_fd.as_fd(), &rel, why));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tree {
    /// The repo: every rule.
    Repo,
    /// A git dir outside the repo (a worktree's admin or common dir): git-dir rules, setuid.
    GitDir,
    /// The agent home: setuid only.
    Home,
}

fn tree(
    s: &Sweep<'_>,
    store: &mut Store,
    report: &mut Report,
    root: &Path,
    root_fd: BorrowedFd<'_>,
    kind: Tree,
) {
    // Listed paths present at the start were read-only binds for the whole session: whatever
    // changed there (a hook the developer installed meanwhile) was the host's doing.
    let frozen: std::collections::HashSet<PathBuf> = s
        .prot
        .listed
        .iter()
        .filter(|l| {
            l.root == root
                && !l.placeholder
                && !l.empty_at_start
                && matches!(l.state, State::Dir | State::File)
        })
        .map(|l| l.rel.clone())
        .collect();
    // Git dirs found so far (relative paths): `.git` directories and anything shaped like one
    // (HEAD, objects/, refs/), whatever its name — a bare-looking `payload/` planted in one
    // session could be renamed to `sub/.git` in the next, moving old-ctime content into place,
    // so a git dir is judged where it is written, under any name.
    let mut git_dirs: std::collections::HashSet<PathBuf> = std::collections::HashSet::new();
    if kind == Tree::GitDir {
        git_dirs.insert(PathBuf::new());
    }
    let mut visit = |e: &Entry<'_>| -> Step {
        if frozen.contains(e.rel) {
            return Step::Skip;
        }
        let step = judge(s, store, report, root, kind, &git_dirs, e);
        if step == Step::Descend && fsat::kind(e.st) == SFlag::S_IFDIR && is_git_dir(e) {
            git_dirs.insert(e.rel.to_path_buf());
        }
        step
    };
    let stats = match fsat::walk(root_fd, MAX_DEPTH, &mut visit) {
        Ok(stats) => stats,
        Err(e) => {
            report
                .warnings
                .push(format!("{}: the end-of-session scan failed: {e}", root.display()));
            return;
        }
    };
    report.entries += stats.entries;
    report.unreadable.extend(stats.unreadable.iter().map(|r| root.join(r)));
    for rel in stats.too_deep {
        if kind == Tree::Home {
            report.warnings.push(format!(
                "{}: deeper than {MAX_DEPTH} levels, not scanned below",
                root.join(&rel).display()
            ));
            continue;
        }
        report.items.push(store.take(root, root_fd, &rel, "deeper than the scan goes"));
    }
}

/// The rules for one entry (see the module docs); `Skip` once it was taken or needs no look
/// inside.
fn judge(
    s: &Sweep<'_>,
    store: &mut Store,
    report: &mut Report,
    root: &Path,
    kind: Tree,
    git_dirs: &std::collections::HashSet<PathBuf>,
    e: &Entry<'_>,
) -> Step {
    let changed = ctime(e.st) > s.since;
    if changed {
        strip_setuid(e, root, report);
    }
    let ty = fsat::kind(e.st);
    if ty == SFlag::S_IFLNK {
        if kind == Tree::Repo {
            outside_symlink(e, root, report);
        }
        return Step::Skip;
    }
    if kind == Tree::Home {
        return Step::Descend;
    }
    if let Some(inner) = git_inner(e.rel, git_dirs) {
        return git_rule(s, store, report, root, e, &inner, changed);
    }
    // Content moved in under a new name keeps its old ctime; the directory that gives a file
    // its meaning (`.cargo/`, `.claude/`) does not.
    let parent_fresh = || nix::sys::stat::fstat(e.dir).is_ok_and(|p| ctime(&p) > s.since);

    let name = e.name.to_string_lossy();
    if name == ".git" {
        if ty == SFlag::S_IFDIR {
            return Step::Descend;
        }
        if changed {
            report.items.push(take(store, root, e, "new git pointer"));
        }
        return Step::Skip;
    }
    if changed && INSTRUCTION_FILES.contains(&name.as_ref()) && ty == SFlag::S_IFREG {
        report.instructions_changed.push(root.join(e.rel));
    }
    if ty == SFlag::S_IFREG
        && let Some(config) = codekeys::kind_of(e.rel)
        && (changed || (in_anchor_dir(e.rel) && parent_fresh()))
    {
        review_config(s, store, report, root, e, config);
        return Step::Skip;
    }
    if NESTED_WHOLE.contains(&name.as_ref()) {
        if changed_below(e, s.since) {
            report.items.push(take(store, root, e, "changed"));
        }
        return Step::Skip;
    }
    let in_claude = e.rel.parent().and_then(Path::file_name) == Some(OsStr::new(".claude"));
    if in_claude {
        let whole = CLAUDE_WHOLE.contains(&name.as_ref()) && ty == SFlag::S_IFDIR;
        let settings = protect::is_claude_settings(&name);
        if (whole || settings) && (parent_fresh() || changed_below(e, s.since)) {
            report.items.push(take(store, root, e, "changed"));
            return Step::Skip;
        }
    }
    Step::Descend
}

/// Directories whose name gives the config files in them their meaning.
fn in_anchor_dir(rel: &Path) -> bool {
    let parent = rel.parent().and_then(Path::file_name).and_then(OsStr::to_str);
    matches!(parent, Some(".cargo" | ".config" | ".mise" | "mise" | "conf.d"))
}

/// Shaped like a git dir (what git itself checks before using one: `HEAD`, `objects/`,
/// `refs/`), or named `.git`.
fn is_git_dir(e: &Entry<'_>) -> bool {
    if e.name == ".git" {
        return true;
    }
    // One stat for the common case (no HEAD); the directory is opened only when it has one.
    let head = Path::new(e.name).join("HEAD");
    if !matches!(fsat::lstat_at(e.dir, &head), Ok(Some(st)) if fsat::kind(&st) == SFlag::S_IFREG) {
        return false;
    }
    let Ok(dir) = fsat::open_dir(e.dir, Path::new(e.name)) else { return false };
    ["objects", "refs"].iter().all(|d| {
        matches!(fsat::lstat_at(dir.as_fd(), Path::new(d)), Ok(Some(st)) if fsat::kind(&st) == SFlag::S_IFDIR)
    })
}

fn take(store: &mut Store, root: &Path, e: &Entry<'_>, why: &str) -> Item {
    store.take_at(root, e.dir, e.name, e.rel, why)
}

/// Whether `e` or anything below it changed (a directory deeper than the walk counts as
/// changed).
fn changed_below(e: &Entry<'_>, since: Stamp) -> bool {
    if ctime(e.st) > since {
        return true;
    }
    if fsat::kind(e.st) != SFlag::S_IFDIR {
        return false;
    }
    let Ok(dir) = fsat::open_dir(e.dir, Path::new(e.name)) else { return true };
    let mut found = false;
    let stats = fsat::walk(dir.as_fd(), MAX_DEPTH, &mut |inner| {
        found |= ctime(inner.st) > since;
        if found { Step::Skip } else { Step::Descend }
    });
    match stats {
        Ok(stats) => found || !stats.too_deep.is_empty() || !stats.unreadable.is_empty(),
        Err(_) => true,
    }
}

/// The path of `rel` inside its innermost git dir (the nearest strict ancestor found as one,
/// then `modules/<x>/` chains below it), or `None` outside any.
fn git_inner(rel: &Path, git_dirs: &std::collections::HashSet<PathBuf>) -> Option<PathBuf> {
    let base = rel.ancestors().skip(1).find(|a| git_dirs.contains(*a))?;
    let comps: Vec<&OsStr> = rel
        .strip_prefix(base)
        .ok()?
        .components()
        .filter_map(|c| if let Component::Normal(n) = c { Some(n) } else { None })
        .collect();
    let mut j = 0;
    while j + 1 < comps.len() && comps[j] == "modules" {
        j += 2;
    }
    Some(comps[j.min(comps.len())..].iter().collect())
}

fn git_rule(
    s: &Sweep<'_>,
    store: &mut Store,
    report: &mut Report,
    root: &Path,
    e: &Entry<'_>,
    inner: &Path,
    changed: bool,
) -> Step {
    let parts: Vec<String> = inner.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let pointer_file = matches!(
        parts.as_slice(),
        ["commondir"]
            | ["config.worktree"]
            | ["objects", "info", "alternates" | "http-alternates"]
            | ["worktrees", _, "commondir" | "gitdir" | "config.worktree"]
    );
    match parts.as_slice() {
        ["hooks", name] => {
            if !name.ends_with(".sample") && changed_below(e, s.since) {
                report.items.push(take(store, root, e, "new or changed git hook"));
            }
            Step::Skip
        }
        _ if pointer_file => {
            if changed {
                report.items.push(take(store, root, e, "new git pointer"));
            }
            Step::Skip
        }
        ["config"] => {
            if changed && fsat::kind(e.st) == SFlag::S_IFREG {
                review_config(s, store, report, root, e, ConfigKind::GitConfig);
            } else if changed {
                report.items.push(take(store, root, e, "not a regular git config"));
            }
            Step::Skip
        }
        _ => Step::Descend,
    }
}

/// Holds the code-running keys of a changed config file and keeps the rest.
fn review_config(
    s: &Sweep<'_>,
    store: &mut Store,
    report: &mut Report,
    root: &Path,
    e: &Entry<'_>,
    kind: ConfigKind,
) {
    let after = match fsat::read_capped(e.dir, Path::new(e.name), CONFIG_CAP) {
        Ok(Some((bytes, _))) => bytes,
        Ok(None) => return,
        Err(_) => {
            report.items.push(take(store, root, e, "code-running config that cannot be reviewed"));
            return;
        }
    };
    // The start content is known for top-level toolchain files; nested ones are judged as new.
    let before = (root == s.repo)
        .then(|| s.prot.snapshots.iter().find(|snap| snap.rel == e.rel))
        .flatten()
        .and_then(|snap| snap.bytes.as_deref());
    let reviewed = codekeys::review(kind, before, &after);
    if reviewed.held.is_empty() && !reviewed.whole_file_held {
        return;
    }
    let git_config = kind == ConfigKind::GitConfig;
    let why = if git_config { "code-running git config keys" } else { "code-running keys" };
    let Some(kept) = reviewed.kept else {
        report.items.push(take(store, root, e, why));
        return;
    };
    if let Err(err) = fsat::write_replace(e.dir, e.name, &kept, 0o644) {
        report.warnings.push(format!(
            "{}: could not rewrite without its code-running keys ({err}); moving it aside",
            root.join(e.rel).display()
        ));
        report.items.push(take(store, root, e, why));
        return;
    }
    report.items.push(store.hold(root, e.rel, why, reviewed.held, &after, git_config));
}

fn strip_setuid(e: &Entry<'_>, root: &Path, report: &mut Report) {
    let mode = e.st.st_mode;
    let ty = fsat::kind(e.st);
    let mut strip = match ty {
        SFlag::S_IFREG => mode & 0o6000,
        SFlag::S_IFDIR => mode & 0o4000,
        _ => 0,
    };
    if ty == SFlag::S_IFDIR && mode & 0o2000 != 0 {
        // A directory inherits S_ISGID from its parent (mkdir(2)); only a new one is planted.
        let parent_sgid = nix::sys::stat::fstat(e.dir).is_ok_and(|p| p.st_mode & 0o2000 != 0);
        if !parent_sgid {
            strip |= 0o2000;
        }
    }
    if strip == 0 {
        return;
    }
    let new = nix::sys::stat::Mode::from_bits_truncate((mode & 0o7777) & !strip);
    match nix::sys::stat::fchmodat(
        e.dir,
        e.name,
        new,
        nix::sys::stat::FchmodatFlags::NoFollowSymlink,
    ) {
        Ok(()) => report.setuid_stripped.push(root.join(e.rel)),
        Err(err) => report.warnings.push(format!(
            "{}: could not strip its setuid/setgid bits: {err}",
            root.join(e.rel).display()
        )),
    }
}

/// Lists a symlink whose target, resolved lexically from where it sits, leaves the tree.
fn outside_symlink(e: &Entry<'_>, root: &Path, report: &mut Report) {
    let Ok(target) = nix::fcntl::readlinkat(e.dir, e.name) else { return };
    let target = PathBuf::from(target);
    let outside = if target.is_absolute() {
        !target.starts_with(root)
    } else {
        let mut depth: i64 = 0;
        let mut escaped = false;
        for c in e.rel.parent().unwrap_or(Path::new("")).components().chain(target.components()) {
            match c {
                Component::Normal(_) => depth += 1,
                Component::ParentDir => {
                    depth -= 1;
                    escaped |= depth < 0;
                }
                _ => {}
            }
        }
        escaped
    };
    if outside {
        report.outside_symlinks_total += 1;
        if report.outside_symlinks.len() < LISTED_SYMLINKS {
            report.outside_symlinks.push((root.join(e.rel), target));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn git_inner_finds_the_innermost_git_dir() {
        let dirs: std::collections::HashSet<PathBuf> =
            ["", ".git", "sub/.git", "payload", "x/.git"].iter().map(PathBuf::from).collect();
        let repo: std::collections::HashSet<PathBuf> =
            dirs.iter().filter(|d| !d.as_os_str().is_empty()).cloned().collect();
        let g = |p: &str, set: &std::collections::HashSet<PathBuf>| {
            git_inner(Path::new(p), set).map(|p| p.display().to_string())
        };
        assert_eq!(g("src/main.rs", &repo), None);
        assert_eq!(g(".git", &repo), None);
        assert_eq!(g(".git/hooks/pre-commit", &repo).as_deref(), Some("hooks/pre-commit"));
        assert_eq!(g("sub/.git/config", &repo).as_deref(), Some("config"));
        assert_eq!(g("payload/hooks/x", &repo).as_deref(), Some("hooks/x"));
        assert_eq!(g(".git/modules/m/hooks/x", &repo).as_deref(), Some("hooks/x"));
        assert_eq!(g(".git/modules/m", &repo).as_deref(), Some(""));
        assert_eq!(g(".git/modules/a/modules/b/config", &repo).as_deref(), Some("config"));
        assert_eq!(g(".git/modules", &repo).as_deref(), Some("modules"));
        // An external git dir: the walk's root is one.
        assert_eq!(g("worktrees/w/commondir", &dirs).as_deref(), Some("worktrees/w/commondir"));
        assert_eq!(g("objects/info/alternates", &dirs).as_deref(), Some("objects/info/alternates"));
    }
}
