//! `git config` inside the sandbox without giving up safety (SECURITY §7): each protected git
//! dir's `config` gets a session-private writable copy, and at the end what the session changed
//! in it is merged back into the host file through an allowlist; the rest is held in the
//! quarantine.
//!
//! # The mechanism
//!
//! The host's `<git dir>/config` stays covered for the whole session, as every protected path
//! is: the agent can never write the file the host's own `git` reads. What covers it is not a
//! read-only bind of the file any more (git writes `config.lock` beside it and `rename(2)`s it
//! over the file, which fails with `EBUSY` on a mount point) but a bind of a **symlink** to
//! `/opt/airlock/git/<n>/config`, a session-private directory on the host (under the session's
//! quarantine directory) bound read-write there. Git resolves a symlinked config before locking
//! it (`lockfile.c`: `lock_file` without `LOCK_NO_DEREF` follows the link), so `config.lock` is
//! made in the private directory and renamed over the private copy: `git config`, `git remote
//! add`, `git branch --set-upstream-to` work unchanged. The mount point itself can be neither
//! renamed nor removed (`EBUSY`), a symlink's target cannot be changed in place, and the host
//! file is never reachable: its path inside the sandbox is the symlink.
//!
//! # The merge
//!
//! At the end the private copy is read beneath its directory (no symlinks, capped) and compared,
//! key by key with the parser of [`super::codekeys`] (in process; no host `git` ever reads the
//! agent's file, so an `include.path` it wrote is followed by nobody), with the host file as it
//! was at session start. A key whose values changed (added, changed or removed) is:
//! - **applied** when it is on the allowlist: `branch.*` (a branch's `remote`/`pushRemote` only
//!   if it names a remote or a fetch-only url), `user.*`, `core.autocrlf|filemode|ignorecase|eol`,
//!   and for a remote the host file did not have, `url`, `pushurl`, `fetch`, `push`, `tagOpt`,
//!   `prune`, `mirror` (a url only if git fetches from it itself, see
//!   [`codekeys::git_url_is_fetch_only`]: `ext::`, `fd::` and other helper urls are held);
//! - **confirmed** when it is the `url`/`pushurl` of a remote the host file had: applied only if
//!   the user says yes on the terminal (asked after the relay left raw mode), otherwise held with
//!   restore *replacing* the remote's url rather than adding a second one;
//! - **held** otherwise — the allowlist is the rule, so every other key (`core.fsmonitor`,
//!   `core.hooksPath`, `core.sshCommand`, `alias.*`, `include*`, `url.*`, `filter.*`, other
//!   `remote.*` keys, …) never reaches the host file. Held values are restorable with
//!   `airlock quarantine restore`; a held removal is noted, not applied.
//!
//! Applied changes are edited into the host file's own text ([`codekeys::git_set`]: comments
//! and layout of the developer's file survive, every edit is re-parsed and checked), written as
//! git writes it: `config.lock` created exclusively beside it (so a host `git` writing at the
//! same moment makes us back off rather than lose its change), with the file's owner and mode,
//! synced, renamed over the file. If the host file changed during the session, or either version
//! does not parse, nothing is merged and the whole change is held with a note.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::FileStat;

use super::codekeys::{self, GitKey, HeldKey};
use super::protect::{Protection, State};
use super::quarantine::{Item, Store};
use crate::fsat;

/// Where the private copies appear inside the sandbox (`<INSIDE_DIR>/<n>/config`).
pub const INSIDE_DIR: &str = "/opt/airlock/git";
/// The private directories' parent below the session's quarantine directory.
pub const WORK_DIR: &str = ".gitconfig-work";
const CONFIG: &str = "config";
const LOCK: &str = "config.lock";
const CAP: u64 = codekeys::MAX_BYTES as u64;

/// One git config the sandbox sees through a symlink into a private writable directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// The git dir's tree (as [`super::protect::Listed::root`]) and the config below it.
    pub root: PathBuf,
    pub rel: PathBuf,
    /// The host directory holding the private copy.
    pub private_dir: PathBuf,
    /// Where `private_dir` is bound inside the sandbox.
    pub inside_dir: PathBuf,
}

impl Redirect {
    pub fn host_file(&self) -> PathBuf {
        self.root.join(&self.rel)
    }

    /// What the symlink over the config points at inside the sandbox.
    pub fn link_target(&self) -> PathBuf {
        self.inside_dir.join(CONFIG)
    }
}

/// The session's private git configs, from [`prepare`] to [`Session::finish`]. Dropping it
/// removes the private directories.
#[derive(Debug, Default)]
pub struct Session {
    pub redirects: Vec<Redirect>,
    /// The host file at session start, per redirect.
    bases: Vec<Vec<u8>>,
    work: Option<PathBuf>,
}

/// What the merge did, for the end-of-session report.
#[derive(Debug, Default)]
pub struct Finished {
    pub items: Vec<Item>,
    /// `<host file>: key, key` for each file changes were merged into.
    pub merged: Vec<String>,
    pub warnings: Vec<String>,
}

/// Makes a private copy of each protected git dir's `config` (a regular file at start) under
/// `work` (`<quarantine dir>/`[`WORK_DIR`]). A config that cannot be copied stays a read-only
/// bind, as before, with a warning.
pub fn prepare(prot: &Protection, work: &Path) -> (Session, Vec<String>) {
    let mut session =
        Session { redirects: Vec::new(), bases: Vec::new(), work: Some(work.to_path_buf()) };
    let mut warnings = Vec::new();
    for gd in &prot.git_dirs {
        let rel = gd.rel.join(CONFIG);
        let listed = prot
            .listed
            .iter()
            .any(|l| l.root == gd.root && l.rel == rel && matches!(l.state, State::File));
        if !listed {
            continue;
        }
        let n = session.redirects.len();
        let private_dir = work.join(n.to_string());
        match copy_in(&gd.root, &rel, &private_dir) {
            Ok(base) => {
                session.redirects.push(Redirect {
                    root: gd.root.clone(),
                    rel,
                    private_dir,
                    inside_dir: Path::new(INSIDE_DIR).join(n.to_string()),
                });
                session.bases.push(base);
            }
            Err(e) => warnings.push(format!(
                "{}: {e}; git cannot change this config inside the session",
                gd.root.join(&rel).display()
            )),
        }
    }
    (session, warnings)
}

fn copy_in(root: &Path, rel: &Path, private_dir: &Path) -> std::io::Result<Vec<u8>> {
    let root_fd = fsat::open_root(root)?;
    let (bytes, st) = fsat::read_capped(root_fd.as_fd(), rel, CAP)
        .map_err(|e| std::io::Error::other(format!("cannot copy it: {e}")))?
        .ok_or_else(|| std::io::Error::other("it is gone"))?;
    crate::config::fsutil::private_dir(private_dir)?;
    let dir = fsat::open_root(private_dir)?;
    // The directory is this session's own and new: the copy is made there once, unsynced.
    fsat::create_scratch(dir.as_fd(), OsStr::new(CONFIG), &bytes, st.st_mode & 0o777)?;
    Ok(bytes)
}

impl Session {
    /// The sandbox paths that must stay writable (Landlock rules).
    pub fn writable(&self) -> Vec<PathBuf> {
        self.redirects.iter().map(|r| r.inside_dir.clone()).collect()
    }

    /// Merges each private copy back (see the module docs). `confirm` asks the user a yes/no
    /// question (see [`ask_on_terminal`]); `session` names the quarantine in notes.
    pub fn finish(
        &mut self,
        store: &mut Store,
        session: &str,
        confirm: &mut dyn FnMut(&str) -> bool,
    ) -> Finished {
        let mut out = Finished::default();
        for (r, base) in self.redirects.iter().zip(&self.bases) {
            finish_one(r, base, store, session, confirm, &mut out);
        }
        self.cleanup();
        out
    }

    fn cleanup(&mut self) {
        let Some(work) = self.work.take() else { return };
        let (Some(parent), Some(name)) = (work.parent(), work.file_name()) else { return };
        if let Ok(fd) = fsat::open_root(parent) {
            let _ = fsat::remove_tree(fd.as_fd(), name);
        }
        // The session's quarantine directory, if this was all that was in it.
        let _ = std::fs::remove_dir(parent);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// Asks `question` on the caller's terminal (stdin and stderr both terminals); no terminal, or
/// anything but `y`/`yes`, is no.
pub fn ask_on_terminal(question: &str) -> bool {
    use std::io::IsTerminal;
    if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        return false;
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    if std::io::stdin().read_line(&mut line).is_err() {
        return false;
    }
    matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// What happens to one changed key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Apply,
    /// An existing remote's url: applied only after the user confirms.
    Confirm,
    Hold,
}

/// One key whose values differ between the host file at start and the session's copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: GitKey,
    pub before: Vec<Option<String>>,
    pub after: Vec<Option<String>>,
    pub verdict: Verdict,
}

type Entries = [(GitKey, Option<String>)];

fn values_of(entries: &Entries, key: &GitKey) -> Vec<Option<String>> {
    entries.iter().filter(|(k, _)| k == key).map(|(_, v)| v.clone()).collect()
}

/// The changed keys of `after` against `before`, in the order they appear (the session's file
/// first), each with its verdict.
pub fn changes(before: &Entries, after: &Entries) -> Vec<Change> {
    let existing_remotes: HashSet<&str> = before
        .iter()
        .filter(|(k, _)| k.section == "remote")
        .filter_map(|(k, _)| k.sub.as_deref())
        .collect();
    let mut seen: HashSet<&GitKey> = HashSet::new();
    let mut out = Vec::new();
    for (key, _) in after.iter().chain(before) {
        if !seen.insert(key) {
            continue;
        }
        let (b, a) = (values_of(before, key), values_of(after, key));
        if b == a {
            continue;
        }
        let verdict = verdict(key, &a, &existing_remotes);
        out.push(Change { key: key.clone(), before: b, after: a, verdict });
    }
    // A new remote whose url is held is held whole: its refspecs alone would be a half remote.
    let held_remotes: HashSet<String> = out
        .iter()
        .filter(|c| c.verdict == Verdict::Hold && c.key.section == "remote")
        .filter(|c| matches!(c.key.name.as_str(), "url" | "pushurl"))
        .filter_map(|c| c.key.sub.clone())
        .filter(|r| !existing_remotes.contains(r.as_str()))
        .collect();
    for c in &mut out {
        if c.key.section == "remote" && c.key.sub.as_ref().is_some_and(|r| held_remotes.contains(r))
        {
            c.verdict = Verdict::Hold;
        }
    }
    out
}

/// The allowlist (module docs).
fn verdict(key: &GitKey, after: &[Option<String>], existing_remotes: &HashSet<&str>) -> Verdict {
    let fetch_only = || after.iter().all(|v| codekeys::git_url_is_fetch_only(v.as_deref()));
    match (key.section.as_str(), key.sub.as_deref(), key.name.as_str()) {
        ("user", None, _) => Verdict::Apply,
        ("core", None, "autocrlf" | "filemode" | "ignorecase" | "eol") => Verdict::Apply,
        // A branch's remote may be a url as well as a remote's name.
        ("branch", Some(_), "remote" | "pushremote") if !fetch_only() => Verdict::Hold,
        ("branch", _, _) => Verdict::Apply,
        ("remote", Some(_), "url" | "pushurl") if !fetch_only() => Verdict::Hold,
        ("remote", Some(remote), name) => {
            let new_remote = !existing_remotes.contains(remote);
            match name {
                "url" | "pushurl" | "fetch" | "push" | "tagopt" | "prune" | "mirror"
                    if new_remote =>
                {
                    Verdict::Apply
                }
                "url" | "pushurl" => Verdict::Confirm,
                _ => Verdict::Hold,
            }
        }
        _ => Verdict::Hold,
    }
}

/// The values in `after` that `before` lacks (one for one), as held keys.
fn held_values(c: &Change) -> Vec<HeldKey> {
    let mut pool = c.before.clone();
    let mut out = Vec::new();
    for v in &c.after {
        if let Some(i) = pool.iter().position(|b| b == v) {
            pool.remove(i);
        } else {
            out.push(HeldKey {
                key: c.key.dotted(),
                value: codekeys::git_held_value(v.as_deref()),
            });
        }
    }
    out
}

fn all_values(c: &Change) -> Vec<HeldKey> {
    c.after
        .iter()
        .map(|v| HeldKey { key: c.key.dotted(), value: codekeys::git_held_value(v.as_deref()) })
        .collect()
}

fn finish_one(
    r: &Redirect,
    base: &[u8],
    store: &mut Store,
    session: &str,
    confirm: &mut dyn FnMut(&str) -> bool,
    out: &mut Finished,
) {
    let host = r.host_file();
    let mut hold_whole = |store: &mut Store, why: &str, keys: Vec<HeldKey>, agent: &[u8]| {
        let item = store.hold(&r.root, &r.rel, why, keys, agent, true);
        let note = format!(
            "nothing of the session's git config was merged into {}; compare with `airlock \
             quarantine show {session} {}`",
            host.display(),
            r.rel.display()
        );
        out.items.push(store.annotate(item, note));
    };
    let agent = match fsat::open_root(&r.private_dir).map_err(|e| e.to_string()).and_then(|d| {
        fsat::read_capped(d.as_fd(), Path::new(CONFIG), CAP).map_err(|e| e.to_string())
    }) {
        Ok(Some((bytes, _))) => bytes,
        Ok(None) => {
            hold_whole(store, "the session removed its git config", Vec::new(), &[]);
            return;
        }
        Err(e) => {
            hold_whole(
                store,
                &format!("the session's git config is unreadable ({e})"),
                vec![],
                &[],
            );
            return;
        }
    };
    if agent == base {
        return;
    }
    let parsed = codekeys::git_config_entries(base)
        .map_err(|e| format!("the host's git config does not parse ({e})"))
        .and_then(|b| {
            codekeys::git_config_entries(&agent)
                .map(|a| (b, a))
                .map_err(|e| format!("the session's git config does not parse ({e})"))
        });
    let (before, after) = match parsed {
        Ok(p) => p,
        Err(why) => {
            hold_whole(store, &why, Vec::new(), &agent);
            return;
        }
    };
    let mut changes = changes(&before, &after);
    if changes.is_empty() {
        return;
    }
    let root_fd = match fsat::open_root(&r.root) {
        Ok(fd) => fd,
        Err(e) => {
            let keys = changes.iter().flat_map(held_values).collect();
            hold_whole(store, &format!("cannot open {}: {e}", r.root.display()), keys, &agent);
            return;
        }
    };
    let unchanged = |root_fd: BorrowedFd<'_>| -> Option<FileStat> {
        match fsat::read_capped(root_fd, &r.rel, CAP) {
            Ok(Some((now, st))) if now == base => Some(st),
            _ => None,
        }
    };
    let Some(_) = unchanged(root_fd.as_fd()) else {
        let keys = changes.iter().flat_map(held_values).collect();
        hold_whole(store, "the host's git config changed during the session", keys, &agent);
        return;
    };
    for c in changes.iter_mut().filter(|c| c.verdict == Verdict::Confirm) {
        let shown = |vs: &[Option<String>]| {
            let list: Vec<String> = vs.iter().map(|v| v.clone().unwrap_or_default()).collect();
            if list.is_empty() { "(removed)".to_owned() } else { list.join(", ") }
        };
        let question = format!(
            "airlock: the session changed `{}` in {} from {} to {}. Apply?",
            c.key.dotted(),
            host.display(),
            shown(&c.before),
            shown(&c.after)
        );
        if confirm(&crate::audit::escape_for_terminal(&question)) {
            c.verdict = Verdict::Apply;
        }
    }
    let Ok(base_text) = std::str::from_utf8(base) else { return };
    let mut text = base_text.to_owned();
    let mut applied = Vec::new();
    for c in changes.iter().filter(|c| c.verdict == Verdict::Apply) {
        match codekeys::git_set(&text, &c.key, &c.after) {
            Ok(t) => {
                text = t;
                applied.push(c.key.dotted());
            }
            Err(e) => {
                let keys = changes.iter().flat_map(held_values).collect();
                hold_whole(store, &format!("the merge could not be made ({e})"), keys, &agent);
                return;
            }
        }
    }
    if text.as_bytes() != base {
        if let Err(e) = write_like_git(root_fd.as_fd(), &r.rel, text.as_bytes(), &unchanged) {
            let keys = changes.iter().flat_map(held_values).collect();
            hold_whole(store, &format!("writing the merge failed ({e})"), keys, &agent);
            return;
        }
        out.merged.push(format!("{}: {}", host.display(), applied.join(", ")));
    }
    let held: Vec<&Change> = changes.iter().filter(|c| c.verdict == Verdict::Hold).collect();
    if !held.is_empty() {
        let keys: Vec<HeldKey> = held.iter().flat_map(|c| held_values(c)).collect();
        let removed: Vec<String> = held
            .iter()
            .filter(|c| c.after.len() < c.before.len())
            .map(|c| c.key.dotted())
            .collect();
        let item = store.hold(
            &r.root,
            &r.rel,
            "git config keys outside the merge allowlist",
            keys,
            &agent,
            true,
        );
        let item = if removed.is_empty() {
            item
        } else {
            store.annotate(item, format!("removals not applied: {}", removed.join(", ")))
        };
        out.items.push(item);
    }
    for c in changes.iter().filter(|c| c.verdict == Verdict::Confirm) {
        let item = store.hold(
            &r.root,
            &r.rel,
            "changed url of an existing remote, not confirmed on a terminal",
            all_values(c),
            &agent,
            true,
        );
        let item = store.mark_replacing(item);
        let note = if c.after.is_empty() {
            format!("the removal of `{}` was not applied", c.key.dotted())
        } else {
            format!(
                "apply it with `airlock quarantine restore {session} git-config:{}`",
                c.key.dotted()
            )
        };
        out.items.push(store.annotate(item, note));
    }
}

/// Replaces `rel` below `root` with `bytes` the way git does: `config.lock` created exclusively
/// in the same directory (no symlinks followed), given the file's owner and mode, synced, and
/// renamed over the file — only if `unchanged` still finds the start version there once the
/// lock is held.
fn write_like_git(
    root: BorrowedFd<'_>,
    rel: &Path,
    bytes: &[u8],
    unchanged: &dyn Fn(BorrowedFd<'_>) -> Option<FileStat>,
) -> std::io::Result<()> {
    let (parent, name) = fsat::split(rel);
    let dir = fsat::open_dir(root, parent.unwrap_or(Path::new("")))?;
    let lock = match nix::fcntl::openat2(
        dir.as_fd(),
        LOCK,
        fsat::how(OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL, 0o600),
    ) {
        Ok(fd) => fd,
        Err(Errno::EEXIST) => {
            return Err(std::io::Error::other(format!(
                "{LOCK} exists: a git on the host is changing the file"
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let remove_lock = || {
        let _ = nix::unistd::unlinkat(dir.as_fd(), LOCK, nix::unistd::UnlinkatFlags::NoRemoveDir);
    };
    let result = (|| {
        let st = unchanged(root)
            .ok_or_else(|| std::io::Error::other("the host file changed during the merge"))?;
        let mut file = std::fs::File::from(lock);
        file.write_all(bytes)?;
        let (uid, gid) = (st.st_uid, st.st_gid);
        if (uid, gid) != (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw()) {
            nix::unistd::fchown(
                &file,
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )?;
        }
        nix::sys::stat::fchmod(
            &file,
            nix::sys::stat::Mode::from_bits_truncate(st.st_mode & 0o7777),
        )?;
        file.sync_all()?;
        nix::fcntl::renameat(dir.as_fd(), LOCK, dir.as_fd(), name.as_os_str())?;
        Ok(())
    })();
    if result.is_err() {
        remove_lock();
    }
    result
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn entries(text: &str) -> Vec<(GitKey, Option<String>)> {
        codekeys::git_config_entries(text.as_bytes()).unwrap()
    }

    fn verdicts(before: &str, after: &str) -> Vec<(String, Verdict)> {
        changes(&entries(before), &entries(after))
            .into_iter()
            .map(|c| (c.key.dotted(), c.verdict))
            .collect()
    }

    const BASE: &str = "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = https://h.test/r\n\
                        \tfetch = +refs/heads/*:refs/remotes/origin/*\n";

    #[test]
    fn the_allowlist_applies_ordinary_changes() {
        let after = format!(
            "{BASE}[user]\n\tname = X\n[branch \"main\"]\n\tremote = origin\n\tmerge = \
             refs/heads/main\n[remote \"up\"]\n\turl = git@h.test:r.git\n\tfetch = \
             +refs/heads/*:refs/remotes/up/*\n\ttagOpt = --no-tags\n[core]\n\tautocrlf = input\n"
        );
        let v = verdicts(BASE, &after);
        assert!(v.iter().all(|(_, v)| *v == Verdict::Apply), "{v:?}");
        assert_eq!(v.len(), 7, "{v:?}");
    }

    #[test]
    fn everything_else_is_held() {
        for (key, value) in [
            ("core.fsmonitor", "touch /tmp/x"),
            ("core.hooksPath", "/tmp"),
            ("core.sshCommand", "sh -c x"),
            ("core.pager", "sh"),
            ("core.editor", "sh"),
            ("alias.x", "!sh"),
            ("include.path", "/tmp/c"),
            ("credential.helper", "!sh"),
            ("remote.origin.uploadpack", "sh"),
            ("remote.up.receivepack", "sh"),
            ("remote.up.vcs", "x"),
            ("remote.up.proxy", "http://p"),
            ("gpg.program", "sh"),
            ("sequence.editor", "sh"),
            ("protocol.ext.allow", "always"),
            ("uploadpack.packObjectsHook", "sh"),
            ("core.bare", "true"),
        ] {
            let (section, rest) = key.split_once('.').unwrap();
            let (header, name) = match rest.rsplit_once('.') {
                Some((sub, name)) => (format!("[{section} \"{sub}\"]"), name),
                None => (format!("[{section}]"), rest),
            };
            let after = format!("{BASE}{header}\n\t{name} = {value}\n");
            let v = verdicts(BASE, &after);
            assert_eq!(v.len(), 1, "{key}: {v:?}");
            assert_eq!(v[0].1, Verdict::Hold, "{key}");
        }
        for after in [
            "[includeIf \"gitdir:/\"]\n\tpath = /tmp/c\n",
            "[url \"ext::sh -c x\"]\n\tinsteadOf = https://\n",
            "[filter \"x\"]\n\tclean = sh\n",
            "[diff \"x\"]\n\ttextconv = sh\n",
            "[merge \"x\"]\n\tdriver = sh\n",
            "[submodule \"x\"]\n\tupdate = !sh\n",
            "[receive]\n\tprocReceiveRefs = refs\n",
        ] {
            let v = verdicts(BASE, &format!("{BASE}{after}"));
            assert!(!v.is_empty() && v.iter().all(|(_, v)| *v == Verdict::Hold), "{after}: {v:?}");
        }
    }

    #[test]
    fn helper_urls_are_held_even_on_new_remotes_and_branches() {
        for url in ["ext::sh -c x", "fd::3", "-oProxyCommand=x", "foo://h/r", "ext://x"] {
            let after =
                format!("{BASE}[remote \"up\"]\n\turl = \"{url}\"\n\tfetch = +refs/*:refs/*\n");
            assert_eq!(
                verdicts(BASE, &after),
                vec![
                    ("remote.up.url".into(), Verdict::Hold),
                    ("remote.up.fetch".into(), Verdict::Hold)
                ]
            );
            let after = format!("{BASE}[branch \"main\"]\n\tremote = \"{url}\"\n");
            assert_eq!(verdicts(BASE, &after), vec![("branch.main.remote".into(), Verdict::Hold)]);
        }
    }

    #[test]
    fn an_existing_remotes_url_needs_confirmation_and_its_other_keys_are_held() {
        let after = BASE.replace("https://h.test/r", "https://evil.test/r")
            + "[remote \"origin\"]\n\tprune = true\n\tpushurl = https://evil.test/p\n";
        let v = verdicts(BASE, &after);
        assert_eq!(
            v,
            vec![
                ("remote.origin.url".into(), Verdict::Confirm),
                ("remote.origin.prune".into(), Verdict::Hold),
                ("remote.origin.pushurl".into(), Verdict::Confirm),
            ]
        );
    }

    #[test]
    fn removals_of_allowlisted_keys_apply() {
        let before =
            format!("{BASE}[branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n");
        let v = verdicts(&before, BASE);
        assert_eq!(
            v,
            vec![
                ("branch.main.remote".into(), Verdict::Apply),
                ("branch.main.merge".into(), Verdict::Apply)
            ]
        );
    }

    #[test]
    fn git_set_keeps_the_developers_formatting() {
        let text =
            "# mine\n[core]\n\tbare = false # keep\n[user]\n    name = Old ; note\n\temail = e@x\n";
        let key = GitKey { section: "user".into(), sub: None, name: "name".into() };
        let out = codekeys::git_set(text, &key, &[Some("New Name".into())]).unwrap();
        assert_eq!(
            out,
            "# mine\n[core]\n\tbare = false # keep\n[user]\n\tname = New Name\n\temail = e@x\n"
        );
        let out = codekeys::git_set(&out, &key, &[]).unwrap();
        assert_eq!(out, "# mine\n[core]\n\tbare = false # keep\n[user]\n\temail = e@x\n");
        let key = GitKey { section: "remote".into(), sub: Some("o".into()), name: "url".into() };
        let out = codekeys::git_set(&out, &key, &[Some("https://h.test/x".into())]).unwrap();
        assert!(out.ends_with("[remote \"o\"]\n\turl = https://h.test/x\n"), "{out}");
        // A name sharing its line with a header.
        let key = GitKey { section: "core".into(), sub: None, name: "bare".into() };
        let out = codekeys::git_set("[core] bare = false\n", &key, &[Some("true".into())]).unwrap();
        assert_eq!(entries(&out), vec![(key, Some("true".into()))]);
    }
}
