//! Mounts a person chose (`[sandbox] mounts` in a trusted layer, `--mount HOST[:SANDBOX][:ro|:rw]`
//! on `exec`/`run`): the spec's syntax, where it appears inside, and every reason one is refused
//! (SECURITY §7, `docs/security.md` "Mounts").
//!
//! A mount is judged in this order, with symlinks resolved first:
//!
//! 1. the one host-path predicate ([`HostPathRules`]: `/`, `~`, their ancestors, `~/.airlock`,
//!    the socket directory, `$XDG_RUNTIME_DIR`, `/etc`, `/proc`, `/sys`, `/dev`, `/run`, other
//!    homes) — except this repo's own cache, `~/.airlock/cache/<repo key>/`, which the session
//!    may use; every other repo's cache and every agent home under `~/.airlock` are refused with
//!    that reason;
//! 2. secrets and sockets that are not Airlock's ([`SECRET_TREES`], [`BROWSER_PROFILES`],
//!    [`SYSTEM_SOCKET_TREES`]): refused when the path equals, lies under or contains one;
//! 3. `:rw`: only under this repo's cache, or from the command line (with a warning that the
//!    tree becomes agent-written); never from configuration;
//! 4. any unix socket in the tree (a read-only bind still allows `connect(2)` on it, unix(7)):
//!    the walk is bounded ([`WALK_LIMIT`] entries); a tree too large to check is refused too;
//! 5. the in-sandbox path: absolute, no `..`, and clear of the sandbox's own trees.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

use crate::hostpath::{HostPathRules, PathRefused};

/// Where a host path under a home, `/tmp` or the repo appears by default.
pub const MOUNTS_ROOT: &str = "/opt/airlock/mounts";
/// Where the per-repo caches appear inside.
pub const CACHE_ROOT: &str = "/opt/airlock/cache";
/// Most directory entries the socket walk visits before refusing the tree as too large to check.
pub const WALK_LIMIT: usize = 400_000;

/// Credential and key stores under the home, refused whole, inside or around (relative to `~`).
pub const SECRET_TREES: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".config/gh",
    ".docker",
    ".kube",
    ".netrc",
    ".password-store",
    ".local/share/keyrings",
    // Registry and git tokens: mounting `~/.cargo` or the home's dotfiles would carry them.
    ".cargo/credentials.toml",
    ".cargo/credentials",
    ".npmrc",
    ".pypirc",
    ".git-credentials",
    ".config/git/credentials",
];

/// Browser profiles (cookies, saved passwords, session tokens), relative to `~`. A `*`
/// component matches any one directory name (snap and flatpak keep one tree per app).
pub const BROWSER_PROFILES: &[&str] = &[
    ".mozilla",
    ".librewolf",
    ".waterfox",
    ".thunderbird",
    ".config/google-chrome",
    ".config/google-chrome-beta",
    ".config/google-chrome-unstable",
    ".config/chromium",
    ".config/BraveSoftware",
    ".config/microsoft-edge",
    ".config/vivaldi",
    ".config/opera",
    ".config/epiphany",
    ".local/share/epiphany",
    "snap/*/common/.mozilla",
    "snap/*/common/chromium",
    "snap/*/current/.mozilla",
    "snap/*/current/.config/chromium",
    ".var/app/*/.mozilla",
    ".var/app/*/config/google-chrome",
    ".var/app/*/config/chromium",
    ".var/app/*/config/BraveSoftware",
    ".var/app/*/config/microsoft-edge",
    "Library/Application Support/Firefox",
    "Library/Application Support/Google/Chrome",
    "Library/Application Support/Chromium",
    "Library/Application Support/BraveSoftware",
];

/// System trees of sockets and container state, refused whole, inside or around.
pub const SYSTEM_SOCKET_TREES: &[&str] = &["/var/run", "/tmp/.X11-unix", "/var/lib/docker"];

/// In-sandbox trees a mount may not cover, lie under or contain (the sandbox's own).
const TAKEN_INSIDE: &[&str] =
    &["/proc", "/dev", "/sys", "/etc", "/home/agent", "/opt/airlock/bin", CACHE_ROOT];
/// Top-level system directories a mount may not replace or contain.
const SYSTEM_INSIDE: &[&str] =
    &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/tmp", "/home", "/opt"];

/// Read-only or read-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Ro,
    Rw,
}

/// One `HOST[:SANDBOX][:ro|:rw]` as written (`~` not yet expanded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub host: String,
    pub sandbox: Option<PathBuf>,
    /// `None`: not said, i.e. read-only.
    pub access: Option<Access>,
}

/// Why a spec does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("a mount needs a host path: write HOST[:SANDBOX][:ro|:rw], e.g. \"~/.cargo/bin:ro\"")]
    Empty,
    #[error(
        "mount {spec:?}: the host path {host:?} must be absolute or start with ~/ (e.g. \
         \"~/.rustup\" or \"/opt/tools\")"
    )]
    HostNotAbsolute { spec: String, host: String },
    #[error(
        "mount {spec:?}: {part:?} is neither an absolute in-sandbox path nor ro/rw; write \
         HOST[:SANDBOX][:ro|:rw]"
    )]
    BadPart { spec: String, part: String },
    #[error(
        "mount {spec:?}: too many ':'-separated parts; paths containing ':' cannot be mounted, \
         write HOST[:SANDBOX][:ro|:rw]"
    )]
    TooManyParts { spec: String },
    #[error("mount {spec:?}: {path:?} contains '..'; write the path without it")]
    DotDot { spec: String, path: String },
}

/// Parses `HOST[:SANDBOX][:ro|:rw]`.
pub fn parse(spec: &str) -> Result<MountSpec, SpecError> {
    if spec.trim().is_empty() {
        return Err(SpecError::Empty);
    }
    let mut parts: Vec<&str> = spec.split(':').collect();
    let access = match parts.last() {
        Some(&"ro") if parts.len() > 1 => Some(Access::Ro),
        Some(&"rw") if parts.len() > 1 => Some(Access::Rw),
        _ => None,
    };
    if access.is_some() {
        parts.pop();
    }
    let (host, sandbox) = match parts.as_slice() {
        [host] => (*host, None),
        [host, sandbox] => (*host, Some(*sandbox)),
        _ => return Err(SpecError::TooManyParts { spec: spec.to_owned() }),
    };
    if host.is_empty() {
        return Err(SpecError::Empty);
    }
    if !(host.starts_with('/') || host == "~" || host.starts_with("~/")) {
        return Err(SpecError::HostNotAbsolute { spec: spec.to_owned(), host: host.to_owned() });
    }
    let dotdot = |p: &str| Path::new(p).components().any(|c| c == Component::ParentDir);
    if dotdot(host) {
        return Err(SpecError::DotDot { spec: spec.to_owned(), path: host.to_owned() });
    }
    let sandbox = match sandbox {
        None => None,
        Some(s) if s.starts_with('/') => {
            if dotdot(s) {
                return Err(SpecError::DotDot { spec: spec.to_owned(), path: s.to_owned() });
            }
            Some(normalize(Path::new(s)))
        }
        Some(s) => return Err(SpecError::BadPart { spec: spec.to_owned(), part: s.to_owned() }),
    };
    Ok(MountSpec { host: host.to_owned(), sandbox, access })
}

/// `a/./b//c/` → `a/b/c` (no `..` reaches here).
fn normalize(p: &Path) -> PathBuf {
    p.components().filter(|c| *c != Component::CurDir).collect()
}

/// Where a mount came from: the command line may ask for `:rw` anywhere (with a warning),
/// configuration never outside this repo's cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    CommandLine,
    /// `file:line:col` of the entry.
    Config(String),
}

impl Origin {
    fn prefix(&self) -> String {
        match self {
            Self::CommandLine => "--mount".to_owned(),
            Self::Config(at) => format!("{at}: [sandbox] mounts"),
        }
    }
}

/// A mount that passed every check: canonical host source, in-sandbox path, access.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserMount {
    pub src: PathBuf,
    pub dst: PathBuf,
    pub rw: bool,
}

/// Why a mount is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountRefused {
    #[error("{origin} {spec:?} refused: {why}")]
    Host { origin: String, spec: String, why: PathRefused },
    #[error(
        "{origin} {spec:?} refused: {path} {relation} {what} ({tree}), which the sandbox must \
         never reach; mount a directory that holds only the tools"
    )]
    Secret {
        origin: String,
        spec: String,
        path: PathBuf,
        relation: &'static str,
        what: &'static str,
        tree: PathBuf,
    },
    #[error(
        "{origin} {spec:?} refused: {path} lies in Airlock's state ({what}); only this repo's \
         cache {cache} may be mounted from there"
    )]
    AirlockState { origin: String, spec: String, path: PathBuf, what: &'static str, cache: PathBuf },
    #[error(
        "{origin} {spec:?} refused: the tree holds a unix socket, {socket} (a read-only bind \
         still lets the sandbox connect to it); mount a directory without sockets"
    )]
    Socket { origin: String, spec: String, socket: PathBuf },
    #[error(
        "{origin} {spec:?} refused: {path} has more than {limit} entries, too many to check for \
         unix sockets; mount a narrower directory"
    )]
    TooLarge { origin: String, spec: String, path: PathBuf, limit: usize },
    #[error(
        "{origin} {spec:?} refused: :rw is never taken from configuration outside this repo's \
         cache ({cache}); use `[sandbox] cache`, or pass `--mount {spec}` on the command line"
    )]
    RwFromConfig { origin: String, spec: String, cache: PathBuf },
    #[error(
        "{origin} {spec:?} refused: {path} overlaps the repo {repo}, whose protected paths are \
         read-only inside; a read-write mount there would bypass them, so mount it read-only"
    )]
    RwOverRepo { origin: String, spec: String, path: PathBuf, repo: PathBuf },
    #[error("{origin} {spec:?} refused: the in-sandbox path {dst} {why}")]
    Destination { origin: String, spec: String, dst: PathBuf, why: String },
}

/// What a person needs to know about mounts that were accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Judged {
    pub mounts: Vec<UserMount>,
    pub warnings: Vec<String>,
}

/// A tree refused by rule 2, with what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refused {
    tree: PathBuf,
    what: &'static str,
}

/// The mount rules for one user and repo.
#[derive(Debug, Clone)]
pub struct MountRules {
    host: HostPathRules,
    home: PathBuf,
    airlock_dir: PathBuf,
    /// `~/.airlock/cache/<this repo key>` (canonical when it exists).
    cache: PathBuf,
    repo: PathBuf,
    repo_sandbox: PathBuf,
    refused: std::sync::OnceLock<Vec<Refused>>,
}

fn canonical_or_self(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Expands `pattern` (relative to `base`, `*` = any one directory name) against the filesystem.
fn expand(base: &Path, pattern: &str) -> Vec<PathBuf> {
    let mut found = vec![base.to_path_buf()];
    for part in pattern.split('/') {
        found = found
            .into_iter()
            .flat_map(|dir| {
                if part == "*" {
                    std::fs::read_dir(&dir)
                        .into_iter()
                        .flatten()
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path())
                        .collect()
                } else {
                    vec![dir.join(part)]
                }
            })
            .collect();
    }
    found
}

/// Rule 2's trees under the canonical `home` (each also in its canonical form).
fn refused_trees(home: &Path) -> Vec<Refused> {
    let mut refused = Vec::new();
    let mut add = |tree: PathBuf, what: &'static str| {
        for t in [canonical_or_self(&tree), tree] {
            if !refused.iter().any(|r: &Refused| r.tree == t) {
                refused.push(Refused { tree: t, what });
            }
        }
    };
    for rel in SECRET_TREES {
        add(home.join(rel), "a credential store");
    }
    for pattern in BROWSER_PROFILES {
        if pattern.contains('*') {
            for p in expand(home, pattern) {
                add(p, "a browser profile");
            }
        } else {
            add(home.join(pattern), "a browser profile");
        }
    }
    for tree in SYSTEM_SOCKET_TREES {
        add(PathBuf::from(tree), "a system socket or container tree");
    }
    refused
}

impl MountRules {
    /// Rules from explicit inputs. `repo` is canonical; `cache` is this repo's cache directory.
    pub fn new(
        host: HostPathRules,
        home: &Path,
        airlock_dir: &Path,
        cache: &Path,
        repo: &Path,
        repo_sandbox: &Path,
    ) -> Self {
        let home = canonical_or_self(home);
        Self {
            host,
            home,
            airlock_dir: canonical_or_self(airlock_dir),
            cache: canonical_or_self(cache),
            repo: repo.to_path_buf(),
            repo_sandbox: repo_sandbox.to_path_buf(),
            refused: std::sync::OnceLock::new(),
        }
    }

    /// Rule 2's trees, resolved on first use: a session that asks for no mount (the common
    /// `exec`) never pays for resolving ~50 paths under the home (issue 22).
    fn refused(&self) -> &[Refused] {
        self.refused.get_or_init(|| refused_trees(&self.home))
    }

    /// `~/.airlock/cache/<this repo key>/`.
    pub fn cache_dir(&self) -> &Path {
        &self.cache
    }

    /// The home with `~` expanded.
    pub fn expand_home(&self, host: &str) -> PathBuf {
        match host.strip_prefix('~') {
            Some(rest) => self.home.join(rest.trim_start_matches('/')),
            None => PathBuf::from(host),
        }
    }

    /// Where a host path appears inside when the spec does not say: the host path itself, or
    /// under [`MOUNTS_ROOT`] when it lies under a home, `/root`, `/tmp` or the repo (so the
    /// sandbox's own `/home`, `/tmp` and repo stay Airlock's).
    pub fn default_sandbox_path(&self, canon: &Path) -> PathBuf {
        let relocated = [&self.home, Path::new("/home"), Path::new("/root"), Path::new("/tmp")]
            .into_iter()
            .chain([self.repo.as_path()])
            .any(|base| canon.starts_with(base));
        if relocated {
            Path::new(MOUNTS_ROOT).join(canon.strip_prefix("/").unwrap_or(canon))
        } else {
            canon.to_path_buf()
        }
    }

    /// Judges one mount.
    pub fn judge(
        &self,
        spec: &MountSpec,
        text: &str,
        origin: &Origin,
    ) -> Result<UserMount, Box<MountRefused>> {
        self.judge_unboxed(spec, text, origin).map_err(Box::new)
    }

    // The public `judge` boxes it; here the variants are built where each reason is found.
    #[allow(clippy::result_large_err)]
    fn judge_unboxed(
        &self,
        spec: &MountSpec,
        text: &str,
        origin: &Origin,
    ) -> Result<UserMount, MountRefused> {
        let o = origin.prefix();
        let s = text.to_owned();
        let host = self.expand_home(&spec.host);
        let canon = std::fs::canonicalize(&host).map_err(|e| MountRefused::Host {
            origin: o.clone(),
            spec: s.clone(),
            why: PathRefused::Unresolvable { path: host.clone(), reason: e.to_string() },
        })?;
        let in_cache = canon.starts_with(&self.cache);
        if !in_cache && canon.starts_with(&self.airlock_dir) {
            let under = |d: &str| canon.starts_with(self.airlock_dir.join(d));
            let what = if under("cache") {
                "another repo's cache, or the cache root"
            } else if under("agent") {
                "an agent home or the agents' shared credentials"
            } else {
                "audit logs, identity and trust records"
            };
            return Err(MountRefused::AirlockState {
                origin: o,
                spec: s,
                path: canon,
                what,
                cache: self.cache.clone(),
            });
        }
        if !in_cache {
            self.host.check_canonical(&canon).map_err(|why| MountRefused::Host {
                origin: o.clone(),
                spec: s.clone(),
                why,
            })?;
        }
        for r in self.refused() {
            let relation = if canon == r.tree {
                "is"
            } else if canon.starts_with(&r.tree) {
                "lies under"
            } else if r.tree.starts_with(&canon) && r.tree.symlink_metadata().is_ok() {
                // Containing a store that does not exist carries nothing.
                "contains"
            } else {
                continue;
            };
            return Err(MountRefused::Secret {
                origin: o,
                spec: s,
                path: canon,
                relation,
                what: r.what,
                tree: r.tree.clone(),
            });
        }
        let rw = spec.access == Some(Access::Rw);
        if rw && !in_cache && matches!(origin, Origin::Config(_)) {
            return Err(MountRefused::RwFromConfig {
                origin: o,
                spec: s,
                cache: self.cache.clone(),
            });
        }
        if rw && (canon.starts_with(&self.repo) || self.repo.starts_with(&canon)) {
            return Err(MountRefused::RwOverRepo {
                origin: o,
                spec: s,
                path: canon,
                repo: self.repo.clone(),
            });
        }
        match find_socket(&canon, WALK_LIMIT) {
            Walk::Clean => {}
            Walk::Socket(socket) => {
                return Err(MountRefused::Socket { origin: o, spec: s, socket });
            }
            Walk::TooLarge => {
                return Err(MountRefused::TooLarge {
                    origin: o,
                    spec: s,
                    path: canon,
                    limit: WALK_LIMIT,
                });
            }
        }
        let dst = spec.sandbox.clone().unwrap_or_else(|| self.default_sandbox_path(&canon));
        if let Some(why) = self.bad_destination(&dst) {
            return Err(MountRefused::Destination { origin: o, spec: s, dst, why });
        }
        Ok(UserMount { src: canon, dst, rw })
    }

    fn bad_destination(&self, dst: &Path) -> Option<String> {
        if dst == Path::new("/") {
            return Some("is the sandbox's root".into());
        }
        let overlaps = |t: &Path| dst.starts_with(t) || t.starts_with(dst);
        if overlaps(&self.repo_sandbox) {
            return Some(format!(
                "overlaps the repo's own path {} (bound read-write: a mount point there would \
                 land in the host tree); choose another path",
                self.repo_sandbox.display()
            ));
        }
        if let Some(t) = TAKEN_INSIDE.iter().map(Path::new).find(|t| overlaps(t)) {
            return Some(format!(
                "overlaps {} which the sandbox itself provides; choose another path",
                t.display()
            ));
        }
        if let Some(t) = SYSTEM_INSIDE.iter().map(Path::new).find(|t| t.starts_with(dst)) {
            return Some(format!(
                "would cover {} which the sandbox needs; choose a path below it, e.g. /opt/<name>",
                t.display()
            ));
        }
        None
    }

    /// Judges every mount; the first refusal stops the session. Two mounts at one in-sandbox
    /// path are refused too. `rw` from the command line outside the cache adds a warning.
    pub fn judge_all(&self, specs: &[(String, Origin)]) -> Result<Judged, String> {
        let mut out = Judged::default();
        let mut seen: HashSet<PathBuf> = HashSet::new();
        for (text, origin) in specs {
            let spec = parse(text).map_err(|e| format!("{}: {e}", origin.prefix()))?;
            let m = self.judge(&spec, text, origin).map_err(|e| e.to_string())?;
            if !seen.insert(m.dst.clone()) {
                return Err(format!(
                    "{} {text:?} refused: another mount already uses {} inside; give one of \
                     them another SANDBOX path",
                    origin.prefix(),
                    m.dst.display()
                ));
            }
            if m.rw && !m.src.starts_with(&self.cache) {
                out.warnings.push(format!(
                    "--mount {text}: {} is mounted read-write, so the tree becomes agent-written: \
                     review it before anything on the host runs or reads configuration from it",
                    m.src.display()
                ));
            }
            out.mounts.push(m);
        }
        // Parents first, so a mount inside another one lands on top of it.
        out.mounts.sort_by_key(|m| m.dst.components().count());
        Ok(out)
    }
}

/// What the socket walk found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Walk {
    Clean,
    Socket(PathBuf),
    TooLarge,
}

/// Walks `root` without following symlinks, visiting at most `limit` entries, for a unix
/// socket (file type from the directory entry, so no `stat` per file on most file systems).
/// Unreadable subdirectories are skipped: what the host user cannot read, the sandbox cannot
/// reach either.
pub fn find_socket(root: &Path, limit: usize) -> Walk {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(root) else { return Walk::Clean };
    if meta.file_type().is_socket() {
        return Walk::Socket(root.to_path_buf());
    }
    if !meta.is_dir() {
        return Walk::Clean;
    }
    let mut stack = vec![root.to_path_buf()];
    let mut seen = 0usize;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            seen += 1;
            if seen > limit {
                return Walk::TooLarge;
            }
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_socket() {
                return Walk::Socket(entry.path());
            }
            if ft.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Walk::Clean
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn specs_parse_host_sandbox_and_mode() {
        let p = parse("~/.cargo/bin:ro").unwrap();
        assert_eq!(
            (p.host.as_str(), p.sandbox, p.access),
            ("~/.cargo/bin", None, Some(Access::Ro))
        );
        let p = parse("/opt/tools").unwrap();
        assert_eq!((p.host.as_str(), p.sandbox, p.access), ("/opt/tools", None, None));
        let p = parse("/opt/tools:/tools:rw").unwrap();
        assert_eq!(p.sandbox, Some(PathBuf::from("/tools")));
        assert_eq!(p.access, Some(Access::Rw));
        let p = parse("/opt/tools:/x/./y/").unwrap();
        assert_eq!(p.sandbox, Some(PathBuf::from("/x/y")));
        assert_eq!(p.access, None);
    }

    #[test]
    fn malformed_specs_say_what_to_write() {
        assert_eq!(parse(""), Err(SpecError::Empty));
        assert_eq!(parse(":ro"), Err(SpecError::Empty));
        assert!(matches!(parse("tools"), Err(SpecError::HostNotAbsolute { .. })));
        assert!(matches!(parse("/a:relative"), Err(SpecError::BadPart { .. })));
        assert!(matches!(parse("/a:/b:RO"), Err(SpecError::TooManyParts { .. })));
        assert!(matches!(parse("/a:/b:/c"), Err(SpecError::TooManyParts { .. })));
        assert!(matches!(parse("/a/../etc"), Err(SpecError::DotDot { .. })));
        assert!(matches!(parse("/a:/b/../etc"), Err(SpecError::DotDot { .. })));
        let msg = parse("/a:relative").unwrap_err().to_string();
        assert!(msg.contains("HOST[:SANDBOX][:ro|:rw]"), "{msg}");
    }

    proptest! {
        #[test]
        fn any_text_parses_or_is_refused_and_parsed_paths_are_clean(text in "[a-z~/.:]{0,40}") {
            if let Ok(spec) = parse(&text) {
                prop_assert!(spec.host.starts_with('/') || spec.host.starts_with('~'));
                prop_assert!(!Path::new(&spec.host).components().any(|c| c == Component::ParentDir));
                if let Some(s) = &spec.sandbox {
                    prop_assert!(s.is_absolute());
                    prop_assert!(!s.components().any(|c| c == Component::ParentDir));
                }
            }
        }

        #[test]
        fn written_specs_round_trip(
            host in "/[a-z]{1,8}(/[a-z]{1,8}){0,3}",
            sandbox in proptest::option::of("/[a-z]{1,8}(/[a-z]{1,8}){0,2}"),
            mode in proptest::option::of(prop_oneof![Just("ro"), Just("rw")]),
        ) {
            let mut text = host.clone();
            if let Some(s) = &sandbox { text.push(':'); text.push_str(s); }
            if let Some(m) = mode { text.push(':'); text.push_str(m); }
            let spec = parse(&text).unwrap();
            prop_assert_eq!(spec.host, host);
            prop_assert_eq!(spec.sandbox, sandbox.map(PathBuf::from));
            prop_assert_eq!(spec.access, mode.map(|m| if m == "ro" { Access::Ro } else { Access::Rw }));
        }
    }

    struct Fixture {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        rules: MountRules,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let home = root.join("home/me");
        for d in [
            ".airlock/cache/app-11111111/cargo",
            ".airlock/cache/other-22222222/cargo",
            ".airlock/agent/claude/other-22222222",
            ".cargo/bin",
            ".rustup/toolchains",
            ".ssh",
            ".config/gh",
            ".config/chromium/Default",
            ".config/nvim",
            "snap/firefox/common/.mozilla/firefox",
            ".local/bin",
            ".local/share/keyrings",
            "src/app/tools",
        ] {
            std::fs::create_dir_all(home.join(d)).unwrap();
        }
        std::fs::create_dir_all(root.join("opt/tools/bin")).unwrap();
        std::fs::create_dir_all(root.join("sock")).unwrap();
        let host = HostPathRules::new(&home, &home.join(".airlock"), &root.join("sock"), None, &[]);
        let rules = MountRules::new(
            host,
            &home,
            &home.join(".airlock"),
            &home.join(".airlock/cache/app-11111111"),
            &home.join("src/app"),
            Path::new("/app"),
        );
        Fixture { _tmp: tmp, root, rules }
    }

    #[allow(clippy::result_large_err)]
    fn judge(f: &Fixture, text: &str, origin: Origin) -> Result<UserMount, MountRefused> {
        let spec = parse(&text.replace("$R", &f.root.display().to_string())).unwrap();
        f.rules.judge(&spec, text, &origin).map_err(|e| *e)
    }

    #[test]
    fn toolchains_under_home_appear_under_the_mounts_root_read_only() {
        let f = fixture();
        let m = judge(&f, "~/.cargo/bin:ro", Origin::CommandLine).unwrap();
        assert_eq!(m.src, f.root.join("home/me/.cargo/bin"));
        assert_eq!(m.dst, Path::new(MOUNTS_ROOT).join(m.src.strip_prefix("/").unwrap()));
        assert!(!m.rw);
        // Outside the homes, /tmp and the repo: the host path itself (the fixture lives in a
        // temporary directory, so the rule is checked on plain paths).
        let m = judge(&f, "$R/opt/tools", Origin::Config("c:1:1".into())).unwrap();
        assert!(!m.rw);
        assert_eq!(f.rules.default_sandbox_path(Path::new("/opt/tools")), Path::new("/opt/tools"));
        for p in ["/home/bob/bin", "/root/.cargo/bin", "/tmp/x"] {
            assert_eq!(
                f.rules.default_sandbox_path(Path::new(p)),
                Path::new(MOUNTS_ROOT).join(&p[1..])
            );
        }
        let m = judge(&f, "~/.rustup:/opt/rustup", Origin::CommandLine).unwrap();
        assert_eq!(m.dst, PathBuf::from("/opt/rustup"));
    }

    #[test]
    fn the_leave_behind_predicate_refuses_first() {
        let f = fixture();
        for text in ["~", "/", "$R/home", "$R/sock", "/etc", "/proc/self", "/dev"] {
            match judge(&f, text, Origin::CommandLine) {
                Err(MountRefused::Host { .. }) => {}
                other => panic!("{text}: {other:?}"),
            }
        }
        let e = judge(&f, "$R/nope", Origin::CommandLine).unwrap_err().to_string();
        assert!(e.contains("cannot be resolved"), "{e}");
    }

    #[test]
    fn airlock_state_other_caches_and_agent_homes_are_refused_this_cache_is_not() {
        let f = fixture();
        for (text, what) in [
            ("~/.airlock", "audit logs"),
            ("~/.airlock/cache", "another repo's cache"),
            ("~/.airlock/cache/other-22222222/cargo", "another repo's cache"),
            ("~/.airlock/agent/claude/other-22222222", "agent home"),
        ] {
            let e = judge(&f, text, Origin::CommandLine).unwrap_err().to_string();
            assert!(e.contains(what), "{text}: {e}");
        }
        let m = judge(
            &f,
            "~/.airlock/cache/app-11111111/cargo:/opt/c:rw",
            Origin::Config("c:1:1".into()),
        )
        .unwrap();
        assert!(m.rw);
    }

    #[test]
    fn secrets_and_browser_profiles_are_refused_at_below_and_above() {
        let f = fixture();
        for (text, relation, what) in [
            ("~/.ssh", "is", "credential store"),
            ("~/.config/gh", "is", "credential store"),
            ("~/.config", "contains", "credential store"),
            ("~/.local/share/keyrings", "is", "credential store"),
            ("~/.local/share", "contains", "credential store"),
            ("~/.config/chromium/Default", "lies under", "browser profile"),
            ("~/snap/firefox/common/.mozilla/firefox", "lies under", "browser profile"),
            ("~/snap", "contains", "browser profile"),
        ] {
            match judge(&f, text, Origin::CommandLine) {
                Err(MountRefused::Secret { relation: r, what: w, .. }) => {
                    assert_eq!(r, relation, "{text}");
                    assert!(w.contains(what), "{text}: {w}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        // A neighbour of a store is fine.
        judge(&f, "~/.local/bin", Origin::CommandLine).unwrap();
        judge(&f, "~/.config/nvim", Origin::CommandLine).unwrap();
    }

    #[test]
    fn a_symlink_to_a_secret_is_judged_by_its_target() {
        let f = fixture();
        std::os::unix::fs::symlink(f.root.join("home/me/.ssh"), f.root.join("opt/keys")).unwrap();
        assert!(matches!(
            judge(&f, "$R/opt/keys", Origin::CommandLine),
            Err(MountRefused::Secret { .. })
        ));
    }

    #[test]
    fn system_socket_trees_are_refused() {
        let f = fixture();
        for t in SYSTEM_SOCKET_TREES {
            assert!(f.rules.refused().iter().any(|r| r.tree == Path::new(t)), "{t}");
        }
        if Path::new("/var/lib").exists() {
            assert!(
                judge(&f, "/var/lib", Origin::CommandLine).is_err()
                    || !Path::new("/var/lib/docker").exists()
            );
        }
    }

    #[test]
    fn rw_only_from_the_command_line_or_into_this_cache() {
        let f = fixture();
        let e = judge(&f, "$R/opt/tools:rw", Origin::Config("x.toml:3:12".into())).unwrap_err();
        assert!(matches!(e, MountRefused::RwFromConfig { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.starts_with("x.toml:3:12: [sandbox] mounts"), "{msg}");
        let judged = f
            .rules
            .judge_all(&[(
                format!("{}:rw", f.root.join("opt/tools").display()),
                Origin::CommandLine,
            )])
            .unwrap();
        assert!(judged.mounts[0].rw);
        assert!(judged.warnings[0].contains("agent-written"), "{:?}", judged.warnings);
    }

    #[test]
    fn rw_over_or_around_the_repo_is_refused_ro_is_not() {
        let f = fixture();
        for text in ["~/src/app/tools:/opt/t:rw", "~/src:/opt/src:rw"] {
            let e = judge(&f, text, Origin::CommandLine).unwrap_err();
            assert!(matches!(e, MountRefused::RwOverRepo { .. }), "{text}: {e:?}");
        }
        judge(&f, "~/src:/opt/src", Origin::CommandLine).unwrap();
    }

    #[test]
    fn a_tree_holding_a_unix_socket_is_refused_naming_it() {
        let f = fixture();
        let deep = f.root.join("opt/tools/share/run");
        std::fs::create_dir_all(&deep).unwrap();
        let sock = deep.join("agent.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        match judge(&f, "$R/opt/tools", Origin::CommandLine) {
            Err(MountRefused::Socket { socket, .. }) => assert_eq!(socket, sock),
            other => panic!("{other:?}"),
        }
        // The bound walk gives up and refuses rather than passing an unchecked tree.
        assert_eq!(find_socket(&f.root.join("home/me"), 3), Walk::TooLarge);
        assert_eq!(find_socket(&f.root.join("opt/tools/bin"), 3), Walk::Clean);
    }

    #[test]
    fn destinations_stay_clear_of_the_sandbox_own_trees() {
        let f = fixture();
        for dst in [
            "/",
            "/app",
            "/app/x",
            "/home/agent/bin",
            "/proc/x",
            "/etc",
            "/usr",
            "/opt",
            "/opt/airlock/cache/cargo",
        ] {
            let text = format!("$R/opt/tools:{dst}");
            assert!(
                matches!(
                    judge(&f, &text, Origin::CommandLine),
                    Err(MountRefused::Destination { .. })
                ),
                "{dst}"
            );
        }
        judge(&f, "$R/opt/tools:/usr/local/tools", Origin::CommandLine).unwrap();
        // A repo subdirectory mounted without a path goes under the mounts root, not over the repo.
        let m = judge(&f, "~/src/app/tools", Origin::CommandLine).unwrap();
        assert!(m.dst.starts_with(MOUNTS_ROOT));
    }

    #[test]
    fn two_mounts_at_one_path_and_parent_first_order() {
        let f = fixture();
        let t = f.root.join("opt/tools");
        let err = f
            .rules
            .judge_all(&[
                (format!("{}:/opt/x", t.display()), Origin::CommandLine),
                (format!("{}/bin:/opt/x", t.display()), Origin::CommandLine),
            ])
            .unwrap_err();
        assert!(err.contains("already uses /opt/x"), "{err}");
        let ok = f
            .rules
            .judge_all(&[
                (format!("{}/bin:/opt/x/bin", t.display()), Origin::CommandLine),
                (format!("{}:/opt/x", t.display()), Origin::CommandLine),
            ])
            .unwrap();
        assert_eq!(ok.mounts[0].dst, PathBuf::from("/opt/x"));
    }
}
