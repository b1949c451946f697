//! The end of a session, before control returns to the host (SECURITY §7): everything the
//! session left in the repo, in external git dirs and in the agent home is judged, and what
//! the host would run, mount or follow is taken out of the way ([`super::quarantine`]) or
//! neutralized in place.
//!
//! What changed is told by `ctime` (inode change time), which the agent cannot set back:
//! every write, chmod, rename or link moves it to "now" (inode(7)). The kernel stamps inodes
//! from the coarse realtime clock (or a finer one that never falls below it), at the
//! filesystem's own granularity. The supervisor takes T0 from a probe file on each writable
//! tree's filesystem ([`threshold`]), and the sandbox's init does not start the command before
//! the clock has moved past T0 by more than that granularity ([`wait_past`], overlapping init's
//! own setup), so everything the agent changes has `ctime > T0` while what the host wrote before
//! has `ctime <= T0`. The walk is complete — never truncated — and goes
//! through directory fds only ([`crate::fsat::walk`]); a tree deeper than [`MAX_DEPTH`] is
//! moved aside whole, since what lies below cannot be vouched for.
//!
//! Rules, at any depth:
//! - a listed path (see [`super::protect`]) that appeared, or whose symlink target changed →
//!   quarantined; paths present at the start were read-only binds and are left alone;
//!   placeholders are removed last;
//! - a `.git` *file* that changed → quarantined (a new git pointer);
//! - inside any git dir — named `.git`, or shaped like one under any name (so content planted
//!   under an innocent name and renamed in later was judged where it was written), submodule
//!   git dirs below `modules/` at any depth, the top level itself if shaped like one: changed
//!   `hooks/*` (not `*.sample`), `commondir`, `config.worktree`,
//!   `objects/info/{alternates,http-alternates}`, `worktrees/*/{commondir,gitdir,
//!   config.worktree}` → quarantined; a changed `index`/`sharedindex.*` naming a path into a git
//!   dir → quarantined ([`super::gitindex`]); a changed `config` keeps only inert keys
//!   ([`super::codekeys`], regenerated) and the rest is held;
//! - a new symlink anywhere the rules would judge a file → quarantined (host tools follow it);
//! - a changed `.envrc`, `.vscode/`, `.idea/`, `.devcontainer/`, `.claude/settings*.json`,
//!   `.claude/{commands,agents,hooks,skills}/` → quarantined whole;
//! - a changed toolchain file (`rust-toolchain.toml`, `.cargo/config.toml`, `mise.toml`, …):
//!   its code-running keys are held, the rest kept; in `.cargo/`-like directories a changed
//!   directory counts for its files (a renamed-in directory keeps their old ctimes);
//! - S_ISUID/S_ISGID on anything that changed (a directory's S_ISGID only when its parent
//!   lacks it) → stripped; also in the agent home;
//! - reported, never acted on: changed agent instruction files (`CLAUDE.md`, `AGENTS.md`, …)
//!   and every symlink pointing outside the repo.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
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

/// When a session's changes begin to count (`since`, T0: changed means `ctime > since`), and the
/// moment the command may start (`not_before`), so that nothing it writes can carry a ctime of
/// T0 or before on any of the session's filesystems.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Threshold {
    pub since: Stamp,
    pub not_before: Stamp,
}

/// The threshold for a session whose writable trees are `roots` (the repo, external git dirs,
/// the agent home). Each root's filesystem is probed with a file created and removed at once:
/// its ctime is T0 as that filesystem stamps it. A filesystem that stores whole seconds (ext3,
/// small ext4 with 128-byte inodes, HFS+, FAT) would stamp a write in the same second with
/// T0 itself, so there the command waits out two seconds; elsewhere one clock tick.
pub fn threshold(roots: &[&Path]) -> Threshold {
    let mut since = coarse_now();
    let mut wait = Duration::ZERO;
    for root in roots {
        let Some((stamp, coarse_fs)) = probe(root) else { continue };
        since = since.max(stamp);
        if coarse_fs {
            wait = Duration::from_secs(2);
        }
    }
    let add = |(s, ns): Stamp, d: Duration| {
        let total = ns + d.subsec_nanos() as i64;
        (s + d.as_secs() as i64 + total / 1_000_000_000, total % 1_000_000_000)
    };
    Threshold { since, not_before: add(since, wait) }
}

/// The ctime a new file in `root` gets, and whether that filesystem stores whole seconds (two
/// probes with a zero nanosecond part; one would say so once in 250 by chance).
fn probe(root: &Path) -> Option<(Stamp, bool)> {
    let dir = fsat::open_root(root).ok()?;
    let once = || -> Option<Stamp> {
        let name = fsat::random_name(".airlock-probe-").ok()?;
        let how = fsat::how(
            nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_EXCL,
            0o600,
        );
        let fd = nix::fcntl::openat2(dir.as_fd(), name.as_str(), how).ok()?;
        let st = nix::sys::stat::fstat(&fd).ok();
        let _ = nix::unistd::unlinkat(
            dir.as_fd(),
            name.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
        st.map(|st| ctime(&st))
    };
    let first = once()?;
    if first.1 != 0 {
        return Some((first, false));
    }
    std::thread::sleep(Duration::from_millis(2));
    let second = once().unwrap_or(first);
    Some((first.max(second), second.1 == 0))
}

/// Returns once the coarse clock is past `not_before` (one tick, 4 ms at HZ=250, usually over by
/// the time init has built the walls; two seconds on a whole-second filesystem). Called by init
/// right before it starts the command.
pub fn wait_past(not_before: Stamp) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while coarse_now() <= not_before && Instant::now() < deadline {
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
    /// T0 ([`Threshold::since`]): changed means `ctime > since`.
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
    /// Git config changes merged into host files ([`super::gitconfig`]): `<file>: key, …`.
    pub git_config_merged: Vec<String>,
    pub elapsed: Duration,
    /// Changed indexes found by the walk, judged after it (see [`judge_index`]).
    indexes: Vec<PathBuf>,
}

/// Runs the sweep; never fails (what it cannot do is in the report's warnings and items).
pub fn run(s: &Sweep<'_>, store: &mut Store) -> Report {
    let mut report = inspect(s, store);
    let started = Instant::now();
    // Last: removing them touches their parents' ctime, which the rules read.
    protect::remove_placeholders(s.prot, s.repo);
    report.elapsed += started.elapsed();
    report
}

/// [`run`] but for the placeholders' removal, which the caller must do after it (and after
/// anything else that reads the repo's ctimes): the native supervisor overlaps it with the
/// daemon's `session_end` round trip (issue 22).
pub fn inspect(s: &Sweep<'_>, store: &mut Store) -> Report {
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
    // changed there (a hook the developer installed meanwhile) was the host's doing. Those
    // whose parents were not pinned (an embedded repo's) count only while the same inode is
    // there: a renamed-away parent could have made room for new content at the same path.
    let frozen: std::collections::HashMap<PathBuf, Option<protect::Identity>> = s
        .prot
        .listed
        .iter()
        .filter(|l| {
            l.root == root
                && !l.placeholder
                && !l.empty_at_start
                && matches!(l.state, State::Dir | State::File)
        })
        .map(|l| (l.rel.clone(), if l.needs_identity { l.id } else { None }))
        .collect();
    let known: std::collections::HashSet<protect::Identity> =
        s.prot.known_git_dirs.iter().copied().collect();
    // Git dirs found so far (relative paths): `.git` directories and anything shaped like one
    // (HEAD, objects/, refs/), whatever its name. Those not present at the start — new, renamed
    // in, or a HEAD-less directory completed into one — are judged whole: their content may
    // carry old ctimes from an earlier session in which it was not a git dir.
    let mut gits = GitDirs::default();
    // An external git dir is one; so is a repo whose top level is shaped like one (git would
    // use it as a bare repository there).
    let top_is_git = kind == Tree::GitDir
        || (kind == Tree::Repo && super::gitptr::is_git_dir_at(root_fd, Path::new(".")));
    if top_is_git {
        gits.all.insert(PathBuf::new());
        let top_known =
            nix::sys::stat::fstat(root_fd).is_ok_and(|st| known.contains(&protect::identity(&st)));
        if !top_known {
            gits.whole.insert(PathBuf::new());
        }
    }
    let mut visit = |e: &Entry<'_>| -> Step {
        if let Some(required) = frozen.get(e.rel)
            && required.is_none_or(|id| protect::identity(e.st) == id)
        {
            return Step::Skip;
        }
        let step = judge(s, store, report, root, kind, &gits, e);
        if step == Step::Descend && fsat::kind(e.st) == SFlag::S_IFDIR && is_git_dir(e) {
            gits.all.insert(e.rel.to_path_buf());
            if !known.contains(&protect::identity(e.st)) {
                gits.whole.insert(e.rel.to_path_buf());
            }
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
    for rel in std::mem::take(&mut report.indexes) {
        judge_index(s, store, report, root, root_fd, &rel);
    }
    report.entries += stats.entries;
    for rel in &stats.unreadable {
        // Not ours and unreadable; if we may create entries in it, so could the agent.
        if kind != Tree::Home && writable_by_us(root_fd, rel) {
            report.items.push(store.take(
                root,
                root_fd,
                rel,
                "a directory the sandbox could write into but Airlock cannot read",
            ));
            continue;
        }
        report.warnings.push(format!(
            "{} could not be looked into (not yours, and not readable to you), so it was not \
             checked; nothing in the sandbox could have written there",
            root.join(rel).display()
        ));
        report.unreadable.push(root.join(rel));
    }
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

/// The git dirs a walk has found (relative paths), and those of them judged whole.
#[derive(Debug, Default)]
struct GitDirs {
    all: std::collections::HashSet<PathBuf>,
    whole: std::collections::HashSet<PathBuf>,
}

/// The rules for one entry (see the module docs); `Skip` once it was taken or needs no look
/// inside.
fn judge(
    s: &Sweep<'_>,
    store: &mut Store,
    report: &mut Report,
    root: &Path,
    kind: Tree,
    gits: &GitDirs,
    e: &Entry<'_>,
) -> Step {
    let inner = git_inner(e.rel, &gits.all);
    // Inside a git dir judged whole, everything counts as changed.
    let whole = inner.as_ref().is_some_and(|(base, _)| gits.whole.contains(base));
    let changed = whole || ctime(e.st) > s.since;
    if changed {
        strip_setuid(e, root, report);
    }
    let ty = fsat::kind(e.st);
    if kind == Tree::Home {
        return if ty == SFlag::S_IFLNK { Step::Skip } else { Step::Descend };
    }
    // Content moved in under a new name keeps its old ctime; the directory that gives a file
    // its meaning (`.cargo/`, `.claude/`) does not.
    let parent_fresh = || nix::sys::stat::fstat(e.dir).is_ok_and(|p| ctime(&p) > s.since);
    if ty == SFlag::S_IFLNK {
        if kind == Tree::Repo {
            outside_symlink(e, root, report);
        }
        // Host tools follow symlinks: one at a name they read is what they would read.
        let moved_in = (in_anchor_dir(e.rel) || in_claude_dir(e.rel)) && parent_fresh();
        if (changed || moved_in) && sensitive_link(e, inner.as_ref().map(|(_, i)| i.as_path())) {
            report.items.push(take(store, root, e, "a symlink where host tools read"));
        }
        return Step::Skip;
    }
    if let Some((_, inner)) = &inner
        && let Some(step) = git_rule(s, store, report, root, e, inner, Change { changed, whole })
    {
        return step;
    }

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
    if in_claude_dir(e.rel) {
        let whole = CLAUDE_WHOLE.contains(&name.as_ref()) && ty == SFlag::S_IFDIR;
        let settings = protect::is_claude_settings(&name);
        if (whole || settings) && (parent_fresh() || changed_below(e, s.since)) {
            report.items.push(take(store, root, e, "changed"));
            return Step::Skip;
        }
    }
    Step::Descend
}

/// Whether a symlink sits where the rules would judge a file or directory: anywhere inside a git
/// dir (git makes none there), at a `.git`, a toolchain file, a nested host-run name, a
/// directory that gives files their meaning, or a `.claude` part.
fn sensitive_link(e: &Entry<'_>, inner: Option<&Path>) -> bool {
    let name = e.name.to_string_lossy();
    let in_claude = in_claude_dir(e.rel);
    inner.is_some()
        || name == ".git"
        || codekeys::kind_of(e.rel).is_some()
        || NESTED_WHOLE.contains(&name.as_ref())
        || matches!(name.as_ref(), ".cargo" | ".config" | ".mise" | "mise" | "conf.d" | ".claude")
        || (in_claude
            && (CLAUDE_WHOLE.contains(&name.as_ref()) || protect::is_claude_settings(&name)))
}

/// Whether the caller may create entries in directory `rel` (write and search permission by
/// owner, group or other bits as they apply to it).
fn writable_by_us(root_fd: BorrowedFd<'_>, rel: &Path) -> bool {
    let Ok(Some(st)) = fsat::lstat_beneath(root_fd, rel) else { return false };
    let me = nix::unistd::geteuid().as_raw();
    if me == 0 {
        return true;
    }
    let groups: Vec<u32> = nix::unistd::getgroups()
        .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
        .unwrap_or_default();
    let bits = if st.st_uid == me {
        (st.st_mode >> 6) & 0o7
    } else if st.st_gid == nix::unistd::getegid().as_raw() || groups.contains(&st.st_gid) {
        (st.st_mode >> 3) & 0o7
    } else {
        st.st_mode & 0o7
    };
    bits & 0o3 == 0o3
}

/// Directly inside a `.claude/` directory.
fn in_claude_dir(rel: &Path) -> bool {
    rel.parent().and_then(Path::file_name) == Some(OsStr::new(".claude"))
}

/// Directories whose name gives the config files in them their meaning.
fn in_anchor_dir(rel: &Path) -> bool {
    let parent = rel.parent().and_then(Path::file_name).and_then(OsStr::to_str);
    matches!(parent, Some(".cargo" | ".config" | ".mise" | "mise" | "conf.d"))
}

/// Named `.git`, or shaped like a git dir ([`super::gitptr::is_git_dir_at`]).
fn is_git_dir(e: &Entry<'_>) -> bool {
    e.name == ".git" || super::gitptr::is_git_dir_at(e.dir, Path::new(e.name))
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

/// The path of `rel` inside its innermost git dir (the nearest strict ancestor found as one:
/// submodule git dirs under `modules/` are found by their shape, whatever their name), or
/// `None` outside any.
fn git_inner(
    rel: &Path,
    git_dirs: &std::collections::HashSet<PathBuf>,
) -> Option<(PathBuf, PathBuf)> {
    let base = rel.ancestors().skip(1).find(|a| git_dirs.contains(*a))?;
    Some((base.to_path_buf(), rel.strip_prefix(base).ok()?.to_path_buf()))
}

/// Whether an entry changed (its ctime), and whether it lies in a git dir judged whole.
#[derive(Debug, Clone, Copy)]
struct Change {
    changed: bool,
    whole: bool,
}

/// What a path inside a git dir is, for the rules that apply to it ([`git_part`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GitPart {
    /// `rebase-merge/`, `rebase-apply/`, `sequencer/`: resumed by a host `git rebase
    /// --continue`, which runs the todo list's `exec` lines.
    InProgress,
    /// `HEAD`: shell prompts print the branch it names (`__git_ps1`) without escaping it.
    Head,
    /// `hooks/<name>` (not `*.sample`).
    Hook,
    /// `commondir`, `config.worktree`, alternates, worktree admin pointers.
    Pointer,
    /// `index`, a worktree's `index`, `sharedindex.*`.
    Index,
    Config,
}

fn git_part(parts: &[&str]) -> Option<GitPart> {
    Some(match parts {
        ["rebase-merge" | "rebase-apply" | "sequencer"] => GitPart::InProgress,
        ["HEAD"] => GitPart::Head,
        ["hooks", name] if !name.ends_with(".sample") => GitPart::Hook,
        ["commondir"]
        | ["config.worktree"]
        | ["objects", "info", "alternates" | "http-alternates"]
        | ["worktrees", _, "commondir" | "gitdir" | "config.worktree"] => GitPart::Pointer,
        ["index"] | ["worktrees", _, "index"] => GitPart::Index,
        [name] if name.starts_with("sharedindex.") => GitPart::Index,
        ["config"] => GitPart::Config,
        _ => return None,
    })
}

/// The rule for an entry inside a git dir, if one applies (`None`: the ordinary rules do).
fn git_rule(
    s: &Sweep<'_>,
    store: &mut Store,
    report: &mut Report,
    root: &Path,
    e: &Entry<'_>,
    inner: &Path,
    Change { changed, whole }: Change,
) -> Option<Step> {
    let parts: Vec<String> = inner.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    // Below `modules/`, a directory git does not (yet) take for a git dir — no HEAD — is still
    // judged as one: a `commondir` planted there now and a `HEAD` added by a later session would
    // otherwise keep its old ctime. The rules apply to the part after any `modules/a/b/…`.
    let part = if parts.first() == Some(&"modules") {
        (2..parts.len()).find_map(|i| git_part(&parts[i..]))
    } else {
        git_part(&parts)
    };
    let mut take_if = |yes: bool, why: &str| {
        if yes {
            report.items.push(take(store, root, e, why));
        }
    };
    match part? {
        GitPart::InProgress => {
            take_if(whole || changed_below(e, s.since), "git operation in progress, with commands")
        }
        GitPart::Head => take_if(changed && !head_is_plain(e), "git HEAD with control characters"),
        GitPart::Hook => take_if(whole || changed_below(e, s.since), "new or changed git hook"),
        GitPart::Pointer => take_if(changed, "new git pointer"),
        // Judged once the walk is over: the sweep may still rewrite worktree files (held keys)
        // that the index has to be compared with.
        GitPart::Index if changed => report.indexes.push(e.rel.to_path_buf()),
        GitPart::Index => {}
        GitPart::Config if changed && fsat::kind(e.st) == SFlag::S_IFREG => {
            review_config(s, store, report, root, e, ConfigKind::GitConfig)
        }
        GitPart::Config => take_if(changed, "not a regular git config"),
    }
    Some(Step::Skip)
}

/// A HEAD with nothing a terminal would act on: no control characters (C0, DEL, C1) besides
/// its final newline. git itself refuses such ref names; a hand-written HEAD is not checked.
fn head_is_plain(e: &Entry<'_>) -> bool {
    let Ok(Some((bytes, _))) = fsat::read_capped(e.dir, Path::new(e.name), 4096) else {
        return false;
    };
    let text = String::from_utf8_lossy(&bytes);
    let text = text.strip_suffix('\n').unwrap_or(&text);
    !text.chars().any(|c| c.is_control())
}

/// Largest worktree file compared with its staged version.
const STAGED_CAP: u64 = 16 << 20;

/// An index stages nothing the sweep did not see: for host-read paths ([`host_read_path`]) the
/// staged blob is the worktree file (a `git checkout .` would otherwise write the staged
/// version, judged by nobody), and no entry hides a changed worktree file behind assume-valid
/// or skip-worktree (`git status` would not show it). Checked where the worktree is known: a
/// `.git` dir's parent, or the repo for its worktree admin dir.
fn staged_matches_worktree(
    s: &Sweep<'_>,
    root: &Path,
    index: &Path,
    entries: &[super::gitindex::IndexEntry],
) -> Result<(), String> {
    // Where the worktree of this index is: a `.git` dir's parent (the repo's own, an embedded
    // one, or an external main repo's), or, for this session's own worktree admin dir, the repo.
    let git_dir = root.join(index.parent().unwrap_or(Path::new("")));
    let own_admin = s.prot.external.first().is_some_and(|t| *t == git_dir)
        && git_dir.parent().and_then(Path::file_name) == Some(OsStr::new("worktrees"));
    let worktree = if git_dir.file_name() == Some(OsStr::new(".git")) {
        git_dir.parent().map(Path::to_path_buf)
    } else if own_admin {
        Some(s.repo.to_path_buf())
    } else {
        None
    };
    let Some(worktree) = worktree else { return Ok(()) };
    let wt = match worktree.strip_prefix(root) {
        // Inside the tree being swept: beneath its root, never through a symlink.
        Ok(rel) => {
            fsat::open_root(root).and_then(|r| fsat::open_dir(r.as_fd(), rel).map_err(Into::into))
        }
        Err(_) => fsat::open_root(&worktree),
    };
    let Ok(wt) = wt else { return Ok(()) };
    for entry in entries {
        let path = Path::new(OsStr::from_bytes(&entry.path));
        let sensitive = host_read_path(path);
        if !sensitive && !entry.hidden {
            continue;
        }
        let now = fsat::read_capped(wt.as_fd(), path, STAGED_CAP);
        let same = match (&now, entry.mode) {
            (Ok(Some((bytes, _))), 0o100644 | 0o100755) => {
                super::gitindex::blob_id(bytes, entry.oid.len()) == entry.oid
            }
            // Nothing there: a hidden (sparse) entry is fine; a staged host-read file is not.
            (Ok(None), _) => !sensitive,
            _ => false,
        };
        if !same {
            let why = if entry.hidden {
                "hides a change to it from `git status`"
            } else {
                "stages a version the worktree does not have, which `git checkout .` would write"
            };
            return Err(format!("it {why}: {}", path.display()));
        }
    }
    Ok(())
}

/// A path (relative to a worktree) that host tools read as configuration or run: what the
/// sweep judges in the worktree itself.
fn host_read_path(rel: &Path) -> bool {
    let comps: Vec<&OsStr> = rel.iter().collect();
    let name = rel.file_name().and_then(OsStr::to_str).unwrap_or("");
    let top = comps.first().and_then(|c| c.to_str()).unwrap_or("");
    let top_listed = protect::PLACEHOLDERS.iter().any(|(n, _)| {
        let first = Path::new(n).iter().next().and_then(OsStr::to_str).unwrap_or("");
        first == top && first != ".claude"
    }) || protect::LISTED_ONLY.contains(&top);
    let in_claude = comps.windows(2).any(|w| {
        w[0] == ".claude"
            && w[1]
                .to_str()
                .is_some_and(|n| CLAUDE_WHOLE.contains(&n) || protect::is_claude_settings(n))
    });
    top_listed
        || in_claude
        || codekeys::kind_of(rel).is_some()
        || comps.iter().any(|c| c.to_str().is_some_and(|c| NESTED_WHOLE.contains(&c)))
        || name == ".git"
}

/// Largest index file judged (git's own indexes stay far below; a bigger changed one is taken).
const INDEX_CAP: u64 = 1 << 30;

/// A changed index whose entries reach into a git dir (or out of the worktree) is taken: a host
/// `git checkout .` would write them (see [`super::gitindex`]). Rebuilding it is `git reset`.
fn judge_index(
    s: &Sweep<'_>,
    store: &mut Store,
    report: &mut Report,
    root: &Path,
    root_fd: BorrowedFd<'_>,
    rel: &Path,
) {
    let (parent, name) = fsat::split(rel);
    let Ok(dir) = fsat::open_dir(root_fd, parent.unwrap_or(Path::new(""))) else { return };
    // The git dir's object format, for an index whose trailer does not say (index.skipHash).
    let sha256_repo = fsat::read_capped(dir.as_fd(), Path::new("config"), CONFIG_CAP)
        .ok()
        .flatten()
        .is_some_and(|(config, _)| {
            codekeys::git_config_values(&config, "extensions", "objectformat")
                .last()
                .is_some_and(|f| f.eq_ignore_ascii_case("sha256"))
        });
    let verdict = match fsat::read_capped(dir.as_fd(), name, INDEX_CAP) {
        Ok(Some((bytes, _))) => super::gitindex::check(&bytes, sha256_repo)
            .map_err(|p| p.to_string())
            .and_then(|entries| staged_matches_worktree(s, root, rel, &entries)),
        Ok(None) => return,
        Err(err) => Err(format!("it cannot be read safely ({err})")),
    };
    if let Err(why) = verdict {
        let item = store.take(root, root_fd, rel, "git index staging what the host must not get");
        let note = format!("{why}; rebuild it from HEAD with `git reset`");
        report.items.push(store.annotate(item, note));
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
        let dirs: std::collections::HashSet<PathBuf> = [
            "",
            ".git",
            "sub/.git",
            "payload",
            "x/.git",
            ".git/modules/m",
            ".git/modules/a",
            ".git/modules/a/modules/b",
            ".git/modules/libs/foo",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let repo: std::collections::HashSet<PathBuf> =
            dirs.iter().filter(|d| !d.as_os_str().is_empty()).cloned().collect();
        let g = |p: &str, set: &std::collections::HashSet<PathBuf>| {
            git_inner(Path::new(p), set).map(|(_, p)| p.display().to_string())
        };
        assert_eq!(g("src/main.rs", &repo), None);
        assert_eq!(g(".git", &repo), None);
        assert_eq!(g(".git/hooks/pre-commit", &repo).as_deref(), Some("hooks/pre-commit"));
        assert_eq!(g("sub/.git/config", &repo).as_deref(), Some("config"));
        assert_eq!(g("payload/hooks/x", &repo).as_deref(), Some("hooks/x"));
        assert_eq!(g(".git/modules/m/hooks/x", &repo).as_deref(), Some("hooks/x"));
        assert_eq!(g(".git/modules/m", &repo).as_deref(), Some("modules/m"));
        assert_eq!(g(".git/modules/a/modules/b/config", &repo).as_deref(), Some("config"));
        assert_eq!(g(".git/modules/libs/foo/config", &repo).as_deref(), Some("config"));
        assert_eq!(g(".git/modules", &repo).as_deref(), Some("modules"));
        // An external git dir: the walk's root is one.
        assert_eq!(g("worktrees/w/commondir", &dirs).as_deref(), Some("worktrees/w/commondir"));
        assert_eq!(g("objects/info/alternates", &dirs).as_deref(), Some("objects/info/alternates"));
    }
}
