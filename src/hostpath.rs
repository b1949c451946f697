//! The one predicate for "may the host side bind or follow this path" (SECURITY §7).
//!
//! Every path that reaches a mount or a host-side lookup from configuration, the command line or
//! an agent-written pointer (a worktree's `gitdir:`, a `commondir`) goes through
//! [`HostPathRules::check`]. A path is refused when, with symlinks resolved first:
//!
//! - it is `/`, `$HOME`, or an ancestor of either (binding it would expose the whole home);
//! - it equals, lies under, or contains `~/.airlock` (audit logs, identity, trust records), the
//!   control socket's directory, `$XDG_RUNTIME_DIR` (ssh-agent and keyring sockets), `/etc`,
//!   `/proc`, `/sys`, `/dev`, `/run`, or another user's home.
//!
//! "Contains" matters as much as "lies under": a repo at `/home` would carry every other home
//! into the sandbox, and one at `~/src/..` the airlock state. Airlock's own fixed binds (the agent
//! home, the listed `/etc` files) are not paths anyone chose, so they never come here; they are
//! listed in `docs/security.md`.
//!
//! Another user's home is the `passwd(5)` home of any other uid *that the uid owns* (system
//! accounts whose "home" is `/bin` or `/usr/sbin` own nothing there), and every directory
//! directly under `/home` but the caller's own.

use std::path::{Path, PathBuf};

use crate::env::Env;
use crate::paths::Paths;

/// Why a path may not be bound or followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathRefused {
    #[error("{path} cannot be resolved ({reason}); it must be an existing directory or file")]
    Unresolvable { path: PathBuf, reason: String },
    #[error("{path} is {what}, which the sandbox must never see whole")]
    HomeOrRoot { path: PathBuf, what: &'static str },
    #[error("{path} {relation} {what} ({tree}), which the sandbox must never reach")]
    Guarded { path: PathBuf, relation: &'static str, what: &'static str, tree: PathBuf },
}

/// A tree the host side never binds, follows into, or binds an ancestor of.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Guarded {
    tree: PathBuf,
    what: &'static str,
}

/// The refused trees of one user, resolved once per command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPathRules {
    home: PathBuf,
    guarded: Vec<Guarded>,
}

/// System trees never bound whole (each also in its canonical form, e.g. `/var/run` → `/run`).
const SYSTEM_TREES: &[&str] = &["/etc", "/proc", "/sys", "/dev", "/run"];

fn canonical_or_self(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

impl HostPathRules {
    /// Rules from explicit inputs (tests inject these; [`HostPathRules::for_user`] reads them).
    pub fn new(
        home: &Path,
        airlock_dir: &Path,
        socket_dir: &Path,
        runtime_dir: Option<&Path>,
        other_homes: &[PathBuf],
    ) -> Self {
        let mut rules = Self { home: canonical_or_self(home), guarded: Vec::new() };
        rules.guard(airlock_dir, "Airlock's state directory");
        rules.guard(socket_dir, "airlockd's socket directory");
        if let Some(dir) = runtime_dir {
            rules.guard(dir, "$XDG_RUNTIME_DIR (agent and keyring sockets)");
        }
        for tree in SYSTEM_TREES {
            rules.guard(Path::new(tree), "a host system tree");
        }
        for other in other_homes {
            rules.guard(other, "another user's home");
        }
        rules
    }

    fn guard(&mut self, tree: &Path, what: &'static str) {
        // Both spellings: a symlinked `~/.airlock` is refused under either name.
        for tree in [tree.to_path_buf(), canonical_or_self(tree)] {
            if !self.guarded.iter().any(|g| g.tree == tree) {
                self.guarded.push(Guarded { tree, what });
            }
        }
    }

    /// The rules for the calling user: their home and `~/.airlock`, the socket directory the
    /// CLI would use, `$XDG_RUNTIME_DIR`, and the other users' homes of this machine.
    pub fn for_user(paths: &Paths, env: &dyn Env) -> Self {
        let socket = crate::client::SocketPath::resolve(env);
        let runtime = env.var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
        let me = nix::unistd::getuid().as_raw();
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let home_entries: Vec<PathBuf> =
            std::fs::read_dir("/home").into_iter().flatten().flatten().map(|e| e.path()).collect();
        let others = other_homes(&passwd, me, &home_entries, paths.home());
        Self::new(paths.home(), &paths.airlock_dir(), socket.dir(), runtime.as_deref(), &others)
    }

    /// The canonical form of `path` if the host side may bind or follow it.
    pub fn check(&self, path: &Path) -> Result<PathBuf, PathRefused> {
        let canon = std::fs::canonicalize(path).map_err(|e| PathRefused::Unresolvable {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        self.check_canonical(&canon)
    }

    /// [`HostPathRules::check`] for a path whose symlinks are already resolved.
    pub fn check_canonical(&self, canon: &Path) -> Result<PathBuf, PathRefused> {
        if canon == Path::new("/") {
            return Err(PathRefused::HomeOrRoot { path: canon.into(), what: "the root directory" });
        }
        if self.home.starts_with(canon) {
            let what = if canon == self.home {
                "your home directory"
            } else {
                "an ancestor of your home directory"
            };
            return Err(PathRefused::HomeOrRoot { path: canon.into(), what });
        }
        for g in &self.guarded {
            let relation = if canon == g.tree {
                "is"
            } else if canon.starts_with(&g.tree) {
                "lies under"
            } else if g.tree.starts_with(canon) {
                "contains"
            } else {
                continue;
            };
            return Err(PathRefused::Guarded {
                path: canon.into(),
                relation,
                what: g.what,
                tree: g.tree.clone(),
            });
        }
        Ok(canon.to_path_buf())
    }
}

/// Other users' homes: `passwd` homes of other uids that the uid owns, plus the entries of
/// `/home` (given as `home_entries`) except the caller's own home and its ancestors.
fn other_homes(passwd: &str, me: u32, home_entries: &[PathBuf], my_home: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mine = canonical_or_self(my_home);
    let mut out: Vec<PathBuf> = Vec::new();
    for line in passwd.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        let (Some(uid), Some(dir)) = (fields.get(2), fields.get(5)) else { continue };
        let Ok(uid) = uid.parse::<u32>() else { continue };
        let dir = Path::new(dir);
        if uid == me || !dir.is_absolute() || dir == Path::new("/") {
            continue;
        }
        let owned_by_them = std::fs::metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == uid);
        if owned_by_them {
            out.push(dir.to_path_buf());
        }
    }
    for entry in home_entries {
        let canon = canonical_or_self(entry);
        if mine.starts_with(&canon) || canon.starts_with(&mine) {
            continue;
        }
        if !out.contains(entry) {
            out.push(entry.clone());
        }
    }
    out.retain(|h| !mine.starts_with(canonical_or_self(h)));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    struct Fixture {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        rules: HostPathRules,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        for d in ["home/me/.airlock", "home/me/src/app", "home/bob/.ssh", "run/user/1", "sock"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let rules = HostPathRules::new(
            &root.join("home/me"),
            &root.join("home/me/.airlock"),
            &root.join("sock"),
            Some(&root.join("run/user/1")),
            &[root.join("home/bob")],
        );
        Fixture { _tmp: tmp, root, rules }
    }

    #[test]
    fn a_project_under_home_is_fine() {
        let f = fixture();
        let app = f.root.join("home/me/src/app");
        assert_eq!(f.rules.check(&app).unwrap(), app);
    }

    #[test]
    fn root_home_and_their_ancestors_are_refused() {
        let f = fixture();
        for p in [PathBuf::from("/"), f.root.join("home/me"), f.root.join("home"), f.root.clone()] {
            assert!(
                matches!(f.rules.check(&p), Err(PathRefused::HomeOrRoot { .. })),
                "{}",
                p.display()
            );
        }
    }

    #[test]
    fn guarded_trees_are_refused_at_below_and_above() {
        let f = fixture();
        let cases = [
            (f.root.join("home/me/.airlock"), "is"),
            (f.root.join("home/me/.airlock").join("."), "is"),
            (f.root.join("sock"), "is"),
            (f.root.join("run/user/1"), "is"),
            (f.root.join("run"), "contains"),
            (f.root.join("home/bob/.ssh"), "lies under"),
            (PathBuf::from("/etc"), "is"),
            (PathBuf::from("/proc/self"), "lies under"),
            (PathBuf::from("/sys"), "is"),
            (PathBuf::from("/dev"), "is"),
        ];
        for (path, want) in cases {
            match f.rules.check(&path) {
                Err(PathRefused::Guarded { relation, .. }) => {
                    assert_eq!(relation, want, "{}", path.display())
                }
                other => panic!("{}: {other:?}", path.display()),
            }
        }
    }

    #[test]
    fn symlinks_are_resolved_before_judging() {
        let f = fixture();
        let link = f.root.join("home/me/src/innocent");
        std::os::unix::fs::symlink(f.root.join("home/bob/.ssh"), &link).unwrap();
        assert!(matches!(f.rules.check(&link), Err(PathRefused::Guarded { .. })));
        let to_home = f.root.join("home/me/src/up");
        std::os::unix::fs::symlink("../..", &to_home).unwrap();
        assert!(matches!(f.rules.check(&to_home), Err(PathRefused::HomeOrRoot { .. })));
        // A pointer into `..` spellings resolves the same way.
        let dotted = f.root.join("home/me/src/app/../../.airlock");
        assert!(matches!(f.rules.check(&dotted), Err(PathRefused::Guarded { .. })));
    }

    #[test]
    fn a_missing_path_is_refused_with_the_reason() {
        let f = fixture();
        let err = f.rules.check(&f.root.join("nope")).unwrap_err();
        assert!(err.to_string().contains("cannot be resolved"), "{err}");
    }

    #[test]
    fn other_homes_come_from_passwd_owners_and_slash_home() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let me = nix::unistd::getuid().as_raw();
        std::fs::create_dir_all(root.join("h/alice")).unwrap();
        std::fs::create_dir_all(root.join("h/me")).unwrap();
        // A system account whose "home" is a shared directory it does not own is not a home;
        // a directory the account owns is.
        let owned = root.join("svc");
        std::fs::create_dir_all(&owned).unwrap();
        let passwd = format!(
            "root:x:0:0::/:/bin/sh\nbin:x:{other}:2::/usr/bin:/bin/false\n\
             svc:x:{me_as_other}:1::{svc}:/bin/false\nme:x:{me}:1::{myhome}:/bin/sh\n",
            other = me + 1,
            me_as_other = me,
            svc = owned.display(),
            myhome = root.join("h/me").display(),
        );
        let homes = other_homes(
            &passwd,
            me + 7,
            &[root.join("h/alice"), root.join("h/me")],
            &root.join("h/me"),
        );
        assert!(homes.contains(&owned), "{homes:?}");
        assert!(homes.contains(&root.join("h/alice")), "{homes:?}");
        assert!(!homes.iter().any(|h| h == Path::new("/usr/bin") || h == Path::new("/")));
        assert!(!homes.contains(&root.join("h/me")), "{homes:?}");
    }
}
