//! Finding an agent's executable on the host and planning how it appears inside (DESIGN §7).
//!
//! The PATH entry is followed to the real file (npm installs `claude` as a symlink into its
//! package). A native ELF is bound read-only with its package directory (for npm, the outermost
//! `node_modules`, so optional native dependencies beside it resolve too); a `#!` script also
//! brings its interpreter (`#!/usr/bin/env node` is looked up on the host `PATH`). Bound trees
//! keep their host path, unless that path lies under `/tmp`, `/home`, the caller's home, the
//! repo, or a directory the sandbox synthesizes: those are mounted under
//! `/opt/airlock/agents/<agent>/` instead, since the sandbox shows none of those host trees.
//!
//! Nothing here runs the agent on the host: the version comes from its `package.json` (or the
//! native installer's `versions/<version>` file name).

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::Agent;

/// Where relocated agent trees are mounted inside.
pub const AGENTS_DIR: &str = "/opt/airlock/agents";
/// A directory of symlinks, first on `PATH` inside, so the agent runs by its usual name.
pub const BIN_DIR: &str = "/opt/airlock/bin";
/// How many `#!` interpreters deep resolution goes (script → interpreter → …).
const MAX_INTERPRETERS: usize = 3;
/// Cap on a `package.json` read for the version.
const PACKAGE_JSON_CAP: u64 = 1 << 20;

/// Host trees the sandbox already shows read-only at the same path.
const VISIBLE: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];
/// Host trees the sandbox does not show (or replaces): anything under them is relocated.
const RELOCATED: &[&str] =
    &["/tmp", "/home", "/root", "/etc", "/proc", "/dev", "/run", "/sys", "/opt/airlock"];

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{agent} is not installed: no `{name}` on your PATH; {hint}")]
    NotInstalled { agent: String, name: String, hint: String },
    #[error("{path}: no such file; {hint}")]
    NoSuchFile { path: PathBuf, hint: String },
    #[error("{path} is not an executable file; pass an executable program (chmod +x?)")]
    NotExecutable { path: PathBuf },
    #[error(
        "{path} is neither a native (ELF) program nor a `#!` script, so Airlock cannot tell what \
         it needs inside the sandbox"
    )]
    UnknownFormat { path: PathBuf },
    #[error("{path}: its interpreter `{interpreter}` {why}")]
    Interpreter { path: PathBuf, interpreter: String, why: String },
    #[error("{path}: its interpreter `{interpreter}` is not on your PATH; install it")]
    InterpreterMissing { path: PathBuf, interpreter: String },
    #[error(
        "{path} is in the repo but resolves to {real}, outside it; Airlock runs a repo's own \
         agent only from inside the repo (a link out would expose that tree to the session)"
    )]
    LeavesRepo { path: PathBuf, real: PathBuf },
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ResolveError {
    /// `airlock run`'s exit status for this error (DESIGN §3: 127 not found, 126 not
    /// executable, 125 Airlock's own failure).
    pub fn exit_code(&self) -> i32 {
        match self {
            ResolveError::NotInstalled { .. }
            | ResolveError::NoSuchFile { .. }
            | ResolveError::InterpreterMissing { .. } => 127,
            ResolveError::NotExecutable { .. } | ResolveError::UnknownFormat { .. } => 126,
            ResolveError::Io { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                126
            }
            ResolveError::Interpreter { .. }
            | ResolveError::LeavesRepo { .. }
            | ResolveError::Io { .. } => 125,
        }
    }
}

/// What resolution needs from the host.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    /// `claude`, `codex`, or a path.
    pub arg: &'a str,
    /// The host `PATH`.
    pub path_var: Option<OsString>,
    pub cwd: &'a Path,
    /// The caller's home directory (never bound, only relocated out of).
    pub home: &'a Path,
    /// The repo (mounted elsewhere; trees inside it are relocated).
    pub repo: &'a Path,
    /// Where the repo appears inside (`/<name>`): nothing else may be mounted over it.
    pub repo_sandbox: &'a Path,
    /// Host directories no bound tree may contain: `~/.airlock`, the daemon's socket
    /// directory, `$XDG_RUNTIME_DIR` (the home and the repo are always added).
    pub guarded: Vec<PathBuf>,
}

/// One read-only bind of a host tree (or file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub src: PathBuf,
    pub dst: PathBuf,
}

/// The agent as it appears inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub agent: Agent,
    /// The real file on the host (after following symlinks).
    pub real: PathBuf,
    /// `package.json`'s `version`, or the native installer's version directory name.
    pub version: Option<String>,
    /// Read-only binds, in mount order.
    pub binds: Vec<Bind>,
    /// `(link, target)` symlinks inside: `/opt/airlock/bin/<name>` → the agent.
    pub links: Vec<(PathBuf, PathBuf)>,
    /// Directories put before the system ones on `PATH` inside.
    pub path_dirs: Vec<PathBuf>,
    /// What to exec inside before the user's arguments (the agent's in-sandbox path, or its
    /// interpreter and the script when the `#!` line names a relocated interpreter).
    pub argv: Vec<PathBuf>,
}

/// What kind of program a file is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Format {
    Elf,
    /// `#!` line: interpreter and its optional single argument (as the kernel splits it).
    Script {
        interpreter: String,
        arg: Option<String>,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ResolveError + '_ {
    move |source| ResolveError::Io { path: path.to_path_buf(), source }
}

fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The first executable `name` on `path_var` (absolute entries only: a relative entry would
/// depend on where `airlock` happens to run).
pub fn which(name: &str, path_var: Option<&OsStr>) -> Option<PathBuf> {
    let path_var = path_var?;
    std::env::split_paths(path_var)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable_file(candidate))
}

fn format_of(path: &Path) -> Result<Format, ResolveError> {
    let mut head = [0u8; 256];
    let mut file = std::fs::File::open(path).map_err(io(path))?;
    let mut n = 0;
    while n < head.len() {
        match file.read(&mut head[n..]).map_err(io(path))? {
            0 => break,
            k => n += k,
        }
    }
    let head = &head[..n];
    if head.starts_with(b"\x7fELF") {
        return Ok(Format::Elf);
    }
    let Some(line) = head.strip_prefix(b"#!") else {
        return Err(ResolveError::UnknownFormat { path: path.to_path_buf() });
    };
    let line = line.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    // execve(2): the interpreter is the first word; the rest, trimmed, is one argument.
    let line = line.trim();
    let (interpreter, rest) = match line.find([' ', '\t']) {
        Some(i) => (&line[..i], line[i..].trim()),
        None => (line, ""),
    };
    if interpreter.is_empty() {
        return Err(ResolveError::UnknownFormat { path: path.to_path_buf() });
    }
    Ok(Format::Script {
        interpreter: interpreter.to_string(),
        arg: (!rest.is_empty()).then(|| rest.to_string()),
    })
}

/// The program `env` would run for `#!/usr/bin/env [-S] [-flags] PROGRAM …`.
fn env_program(arg: Option<&str>) -> Option<&str> {
    arg?.split_whitespace().find(|w| !w.starts_with('-') && !w.contains('='))
}

fn under(path: &Path, dirs: &[&str]) -> bool {
    dirs.iter().any(|d| path.starts_with(d))
}

/// What resolution checks every candidate tree against (canonical paths).
struct Context<'a> {
    input: &'a Input<'a>,
    home: PathBuf,
    repo: PathBuf,
    /// The home, the repo and the caller's guarded directories.
    guarded: Vec<PathBuf>,
}

impl<'a> Context<'a> {
    fn new(input: &'a Input<'a>) -> Self {
        // Compare canonical paths only: a home reached through a symlink would otherwise
        // never match the canonical agent path it contains.
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let home = canon(input.home);
        let repo = canon(input.repo);
        let mut guarded: Vec<PathBuf> = input.guarded.iter().map(|p| canon(p)).collect();
        guarded.push(home.clone());
        guarded.push(repo.clone());
        Self { input, home, repo, guarded }
    }

    /// A directory may be bound whole only if it is below a top-level directory, contains no
    /// guarded directory (the home, `~/.airlock`, the repo, the socket and runtime dirs), and
    /// is not writable by others (a shared dir like `/tmp` holds other programs' sockets).
    fn bindable(&self, dir: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let deep =
            dir.components().filter(|c| matches!(c, std::path::Component::Normal(_))).count() >= 2;
        let shared = std::fs::metadata(dir).map(|m| m.mode() & 0o002 != 0).unwrap_or(true);
        deep && !shared && !self.guarded.iter().any(|g| g.starts_with(dir))
    }
}

/// `dir/package.json`, if it is a regular file within the cap that parses.
fn read_package_json(dir: &Path) -> Option<serde_json::Value> {
    let file = dir.join("package.json");
    let meta = std::fs::metadata(&file).ok()?;
    if !meta.is_file() || meta.len() > PACKAGE_JSON_CAP {
        return None;
    }
    serde_json::from_slice(&std::fs::read(&file).ok()?).ok()
}

/// Whether `dir/package.json` declares `real` among its `bin` entries.
fn package_declares(dir: &Path, real: &Path) -> bool {
    let Some(json) = read_package_json(dir) else { return false };
    let names = |rel: &serde_json::Value| {
        rel.as_str()
            .is_some_and(|rel| std::fs::canonicalize(dir.join(rel)).is_ok_and(|p| p == real))
    };
    match json.get("bin") {
        Some(serde_json::Value::Object(map)) => map.values().any(names),
        Some(v) => names(v),
        None => false,
    }
}

/// The tree bound for a program at `real`: the outermost `node_modules` above it (so npm's
/// optional native packages beside it resolve), else the package directory whose
/// `package.json` declares it in `bin`, else the file alone; never a tree that fails
/// [`Context::bindable`].
fn package_root(real: &Path, cx: &Context<'_>) -> PathBuf {
    let node_modules = real
        .ancestors()
        .filter(|a| a.file_name() == Some(OsStr::new("node_modules")))
        .collect::<Vec<_>>();
    if let Some(outer) = node_modules.into_iter().rev().find(|d| cx.bindable(d)) {
        return outer.to_path_buf();
    }
    for dir in real.ancestors().skip(1) {
        if dir == Path::new("/") || cx.home.starts_with(dir) {
            break;
        }
        if package_declares(dir, real) {
            return if cx.bindable(dir) { dir.to_path_buf() } else { real.to_path_buf() };
        }
    }
    real.to_path_buf()
}

/// The tree bound for an interpreter at `real`: its install prefix when it sits in
/// `PREFIX/bin/` next to `PREFIX/lib/` (nvm, asdf, a Node tarball), else the file alone.
fn interpreter_root(real: &Path, cx: &Context<'_>) -> PathBuf {
    let prefix = real
        .parent()
        .filter(|bin| bin.file_name() == Some(OsStr::new("bin")))
        .and_then(Path::parent)
        .filter(|p| p.join("lib").is_dir());
    match prefix {
        // Never `~/.local` (which holds far more than one program).
        Some(p) if cx.bindable(p) && p != cx.home.join(".local") => p.to_path_buf(),
        _ => real.to_path_buf(),
    }
}

/// Plans where `root` appears inside; `slot` names its place under the agent's directory.
fn place(root: &Path, cx: &Context<'_>, agent: &str, slot: &str) -> Option<Bind> {
    if under(root, VISIBLE) {
        return None;
    }
    // The host path is kept only where the sandbox has nothing of its own: not the trees it
    // never shows, not the repo's mount point (a mount point created there would land in the
    // repo itself), not `/workspace`.
    let repo_top: PathBuf = cx.input.repo_sandbox.components().take(2).collect();
    let relocate = under(root, RELOCATED)
        || root.starts_with(&cx.home)
        || root.starts_with(&cx.repo)
        || root.starts_with("/workspace")
        || root.starts_with(&repo_top);
    let dst = if relocate {
        let base = root.file_name().map(OsStr::to_os_string).unwrap_or_else(|| "root".into());
        Path::new(AGENTS_DIR).join(agent).join(slot).join(base)
    } else {
        root.to_path_buf()
    };
    Some(Bind { src: root.to_path_buf(), dst })
}

/// `host` as seen inside, given the binds (visible trees keep their path; the repo is at its
/// sandbox path).
fn inside(host: &Path, binds: &[Bind], cx: &Context<'_>) -> Option<PathBuf> {
    if under(host, VISIBLE) {
        return Some(host.to_path_buf());
    }
    let join = |base: &Path, rel: &Path| {
        if rel.as_os_str().is_empty() { base.to_path_buf() } else { base.join(rel) }
    };
    binds
        .iter()
        .find_map(|b| host.strip_prefix(&b.src).ok().map(|rel| join(&b.dst, rel)))
        .or_else(|| host.strip_prefix(&cx.repo).ok().map(|rel| join(cx.input.repo_sandbox, rel)))
}

/// The `name` and `version` of the package a program belongs to.
#[derive(Debug, Default)]
struct Package {
    name: Option<String>,
    version: Option<String>,
}

/// The nearest `package.json` above `real` (up to `root`); for Claude Code's native installer
/// (`~/.local/share/claude/versions/<version>`), the version from the file name.
fn package_of(real: &Path, root: &Path) -> Package {
    for dir in real.ancestors().skip(1) {
        if let Some(json) = read_package_json(dir) {
            let field = |k: &str| json.get(k).and_then(|v| v.as_str()).map(str::to_string);
            return Package { name: field("name"), version: field("version") };
        }
        if !dir.starts_with(root) || dir == root {
            break;
        }
    }
    let installer = real.parent().and_then(Path::file_name) == Some(OsStr::new("versions"));
    Package {
        name: None,
        version: installer
            .then(|| real.file_name().map(|n| n.to_string_lossy().into_owned()))
            .flatten(),
    }
}

/// A path agent that is really Claude Code or Codex (run by path) gets that agent's layout.
fn recognize(agent: Agent, package: &Package) -> Agent {
    match (&agent, package.name.as_deref()) {
        (Agent::Custom { .. }, Some("@anthropic-ai/claude-code")) => Agent::Claude,
        (Agent::Custom { .. }, Some("@openai/codex")) => Agent::Codex,
        _ => agent,
    }
}

/// The real file of `script`'s `#!` interpreter: the literal path, or for `#!/usr/bin/env
/// PROGRAM` the `PROGRAM` on the host `PATH` (as `env` would find it).
fn locate_interpreter(
    script: &Path,
    interpreter: &str,
    arg: Option<&str>,
    via_env: bool,
    input: &Input<'_>,
) -> Result<PathBuf, ResolveError> {
    let program = if via_env {
        let program = env_program(arg).ok_or_else(|| ResolveError::Interpreter {
            path: script.to_path_buf(),
            interpreter: interpreter.to_string(),
            why: "names no program after `env`".into(),
        })?;
        which(program, input.path_var.as_deref()).ok_or_else(|| {
            ResolveError::InterpreterMissing {
                path: script.to_path_buf(),
                interpreter: program.to_string(),
            }
        })?
    } else {
        PathBuf::from(interpreter)
    };
    std::fs::canonicalize(&program).map_err(|e| ResolveError::Interpreter {
        path: script.to_path_buf(),
        interpreter: program.display().to_string(),
        why: format!("cannot be found: {e}"),
    })
}

/// Resolves the agent named by `input.arg`.
pub fn resolve(input: &Input<'_>) -> Result<Resolved, ResolveError> {
    let cx = Context::new(input);
    let agent = Agent::from_arg(input.arg);
    let found = if input.arg.contains('/') {
        let path = input.cwd.join(input.arg);
        if std::fs::symlink_metadata(&path).is_err() {
            return Err(ResolveError::NoSuchFile { path, hint: agent.install_hint() });
        }
        path
    } else {
        which(input.arg, input.path_var.as_deref()).ok_or_else(|| ResolveError::NotInstalled {
            agent: match agent {
                Agent::Claude => "Claude Code".into(),
                Agent::Codex => "Codex".into(),
                Agent::Custom { .. } => input.arg.to_string(),
            },
            name: input.arg.to_string(),
            hint: agent.install_hint(),
        })?
    };
    let real = std::fs::canonicalize(&found).map_err(io(&found))?;
    if !is_executable_file(&real) {
        return Err(ResolveError::NotExecutable { path: real });
    }
    // A path into the repo (the repo's own agent script) runs from the repo's mount; it may
    // not lead out of the repo, or it would carry a host tree of the repo's choosing inside.
    let found_dir = found.parent().and_then(|d| std::fs::canonicalize(d).ok());
    let repo_agent =
        input.arg.contains('/') && found_dir.as_ref().is_some_and(|d| d.starts_with(&cx.repo));
    if repo_agent && !real.starts_with(&cx.repo) {
        return Err(ResolveError::LeavesRepo { path: found, real });
    }
    let root = if repo_agent { real.clone() } else { package_root(&real, &cx) };
    let package = package_of(&real, &root);
    let agent = recognize(agent, &package);
    let dir_name = agent.dir_name();
    let mut binds: Vec<Bind> = if repo_agent {
        Vec::new()
    } else {
        place(&root, &cx, &dir_name, "").into_iter().collect()
    };
    let mut path_dirs = vec![PathBuf::from(BIN_DIR)];

    // Follow the `#!` chain; each interpreter is bound too and its directory put on PATH
    // (so `#!/usr/bin/env node` finds it inside).
    let mut argv_prefix: Vec<PathBuf> = Vec::new();
    let mut current = real.clone();
    for depth in 0.. {
        let Format::Script { interpreter, arg } = format_of(&current)? else { break };
        if depth == MAX_INTERPRETERS {
            return Err(ResolveError::Interpreter {
                path: real,
                interpreter,
                why: format!("is a script more than {MAX_INTERPRETERS} levels deep"),
            });
        }
        let via_env = Path::new(&interpreter).file_name() == Some(OsStr::new("env"));
        let interp_real =
            locate_interpreter(&current, &interpreter, arg.as_deref(), via_env, input)?;
        // A repo's script names its interpreter itself: only the system's or the repo's own
        // (an interpreter from your PATH through `env` is your choice, not the repo's).
        if repo_agent
            && !via_env
            && !under(&interp_real, VISIBLE)
            && !interp_real.starts_with(&cx.repo)
        {
            return Err(ResolveError::LeavesRepo { path: current, real: interp_real });
        }
        let slot =
            format!("interpreter{}", if depth == 0 { String::new() } else { depth.to_string() });
        if inside(&interp_real, &binds, &cx).is_none()
            && let Some(b) = place(&interpreter_root(&interp_real, &cx), &cx, &dir_name, &slot)
        {
            binds.push(b);
        }
        let interp_inside =
            inside(&interp_real, &binds, &cx).unwrap_or_else(|| interp_real.clone());
        if let Some(dir) = interp_inside.parent() {
            path_dirs.push(dir.to_path_buf());
        }
        // The kernel follows the literal `#!` path inside; where nothing is there (the
        // interpreter moved under /opt/airlock), run the interpreter explicitly instead.
        let literal = Path::new(&interpreter);
        let literal_works =
            under(literal, VISIBLE) || inside(literal, &binds, &cx).as_deref() == Some(literal);
        if !via_env && !literal_works && argv_prefix.is_empty() {
            argv_prefix.push(interp_inside.clone());
            if let Some(a) = &arg {
                argv_prefix.push(PathBuf::from(a));
            }
        }
        current = interp_real;
    }

    let exec_path = inside(&real, &binds, &cx).unwrap_or_else(|| real.clone());
    if let Some(dir) = exec_path.parent() {
        path_dirs.insert(1, dir.to_path_buf());
    }
    // The directory the agent was found in (npm's `node_modules/.bin`), where it is inside.
    if let Some(dir) = found_dir.as_deref().and_then(|d| inside(d, &binds, &cx))
        && !path_dirs.contains(&dir)
    {
        path_dirs.insert(1, dir);
    }
    path_dirs.dedup();
    let link_name =
        found.file_name().map(OsStr::to_os_string).unwrap_or_else(|| dir_name.clone().into());
    let links = vec![(Path::new(BIN_DIR).join(link_name), exec_path.clone())];
    let mut argv = argv_prefix;
    argv.push(exec_path);
    Ok(Resolved { version: package.version, agent, real, binds, links, path_dirs, argv })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn exe(path: &Path, contents: &[u8]) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    struct Host {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        home: PathBuf,
        repo: PathBuf,
    }

    impl Host {
        fn new() -> Self {
            let tmp = tempfile::tempdir().unwrap();
            let root = std::fs::canonicalize(tmp.path()).unwrap();
            let home = root.join("home/u");
            let repo = root.join("home/u/src/pay");
            std::fs::create_dir_all(&repo).unwrap();
            Self { _tmp: tmp, root, home, repo }
        }
        fn input<'a>(&'a self, arg: &'a str, path: &Path) -> Input<'a> {
            Input {
                arg,
                path_var: Some(path.as_os_str().to_owned()),
                cwd: &self.repo,
                home: &self.home,
                repo: &self.repo,
                repo_sandbox: Path::new("/pay"),
                guarded: vec![self.home.join(".airlock")],
            }
        }
        /// An npm prefix with Claude Code as npm lays it out.
        fn npm_claude(&self, prefix: &Path) -> PathBuf {
            let pkg = prefix.join("lib/node_modules/@anthropic-ai/claude-code");
            exe(&pkg.join("bin/claude.exe"), b"\x7fELF\x02\x01\x01rest");
            std::fs::write(
                pkg.join("package.json"),
                r#"{"name":"@anthropic-ai/claude-code","version":"2.1.197"}"#,
            )
            .unwrap();
            std::fs::create_dir_all(prefix.join("bin")).unwrap();
            symlink(
                "../lib/node_modules/@anthropic-ai/claude-code/bin/claude.exe",
                prefix.join("bin/claude"),
            )
            .unwrap();
            prefix.join("bin")
        }
    }

    #[test]
    fn npm_native_binary_is_followed_bound_with_node_modules_and_relocated() {
        let host = Host::new();
        let bin = host.npm_claude(&host.home.join(".npm-global"));
        let r = resolve(&host.input("claude", &bin)).unwrap();
        assert_eq!(r.agent, Agent::Claude);
        assert_eq!(r.version.as_deref(), Some("2.1.197"));
        let nm = host.home.join(".npm-global/lib/node_modules");
        assert_eq!(r.real, nm.join("@anthropic-ai/claude-code/bin/claude.exe"));
        assert_eq!(
            r.binds,
            vec![Bind { src: nm, dst: "/opt/airlock/agents/claude/node_modules".into() }]
        );
        let inside = PathBuf::from(
            "/opt/airlock/agents/claude/node_modules/@anthropic-ai/claude-code/bin/claude.exe",
        );
        assert_eq!(r.argv, vec![inside.clone()]);
        assert_eq!(r.links, vec![(PathBuf::from("/opt/airlock/bin/claude"), inside)]);
        assert_eq!(r.path_dirs[0], Path::new(BIN_DIR));
        assert!(r.path_dirs.contains(
            &"/opt/airlock/agents/claude/node_modules/@anthropic-ai/claude-code/bin".into()
        ));
    }

    #[test]
    fn trees_outside_relocated_dirs_keep_their_host_path() {
        let host = Host::new();
        // A prefix that is not under /tmp, /home, the home or the repo keeps its path; the test
        // tree lives under a temp dir, so check the placement rule directly.
        let input = host.input("claude", Path::new("/nonexistent"));
        let cx = Context::new(&input);
        let b = place(Path::new("/opt/node/lib/node_modules"), &cx, "claude", "").unwrap();
        assert_eq!(b.dst, Path::new("/opt/node/lib/node_modules"));
        assert!(place(Path::new("/usr/lib/node_modules"), &cx, "claude", "").is_none());
        for relocated in [
            "/tmp/x/node_modules",
            "/home/v/node_modules",
            "/root/.nvm/node",
            "/etc/x",
            // The repo's own mount point (`/pay`) and `/workspace` are never mounted over.
            "/pay/main/target",
            "/workspace/x",
        ] {
            let b = place(Path::new(relocated), &cx, "claude", "").unwrap();
            assert!(b.dst.starts_with("/opt/airlock/agents/claude"), "{relocated}: {b:?}");
        }
        let in_repo = host.repo.join("node_modules");
        let b = place(&in_repo, &cx, "claude", "").unwrap();
        assert_eq!(b.dst, Path::new("/opt/airlock/agents/claude/node_modules"));
    }

    #[test]
    fn env_script_brings_its_interpreter_prefix_and_puts_it_on_path() {
        let host = Host::new();
        let node_prefix = host.home.join(".nvm/versions/node/v20.1.0");
        exe(&node_prefix.join("bin/node"), b"\x7fELF\x02");
        std::fs::create_dir_all(node_prefix.join("lib/node_modules")).unwrap();
        let pkg = node_prefix.join("lib/node_modules/@openai/codex");
        exe(&pkg.join("bin/codex.js"), b"#!/usr/bin/env node\nimport x from 'y'\n");
        std::fs::write(pkg.join("package.json"), r#"{"version":"0.50.0"}"#).unwrap();
        symlink("../lib/node_modules/@openai/codex/bin/codex.js", node_prefix.join("bin/codex"))
            .unwrap();
        let path = std::env::join_paths([node_prefix.join("bin")]).unwrap();
        let r = resolve(&host.input("codex", Path::new(&path))).unwrap();
        assert_eq!(r.version.as_deref(), Some("0.50.0"));
        assert_eq!(r.binds.len(), 2, "{:?}", r.binds);
        assert_eq!(r.binds[0].dst, Path::new("/opt/airlock/agents/codex/node_modules"));
        assert_eq!(r.binds[1].src, node_prefix);
        assert_eq!(r.binds[1].dst, Path::new("/opt/airlock/agents/codex/interpreter/v20.1.0"));
        assert!(r.path_dirs.contains(&"/opt/airlock/agents/codex/interpreter/v20.1.0/bin".into()));
        // `env` finds node on PATH inside; the script runs by its own path.
        assert_eq!(
            r.argv,
            vec![PathBuf::from(
                "/opt/airlock/agents/codex/node_modules/@openai/codex/bin/codex.js"
            )]
        );
    }

    #[test]
    fn absolute_shebang_to_a_relocated_interpreter_runs_it_explicitly() {
        let host = Host::new();
        let py = host.root.join("opt-py/bin/python3");
        exe(&py, b"\x7fELF");
        std::fs::create_dir_all(host.root.join("opt-py/lib")).unwrap();
        let script = host.repo.join("tools/agent.py");
        exe(&script, format!("#!{} -u\nprint(1)\n", py.display()).as_bytes());
        // Not from the repo: a repo's script may only name the system's or its own interpreter.
        let e = resolve(&host.input("./tools/agent.py", Path::new("/nonexistent"))).unwrap_err();
        assert!(matches!(e, ResolveError::LeavesRepo { .. }), "{e}");
        // The same script installed outside the repo runs, its interpreter named explicitly.
        let tool = host.root.join("opt-tools/agent.py");
        exe(&tool, format!("#!{} -u\nprint(1)\n", py.display()).as_bytes());
        let r = resolve(&host.input(tool.to_str().unwrap(), Path::new("/nonexistent"))).unwrap();
        assert!(matches!(&r.agent, Agent::Custom { name } if name == "agent.py"));
        assert_eq!(r.argv.len(), 3, "{:?}", r.argv);
        assert!(r.argv[0].ends_with("opt-py/bin/python3"));
        assert_eq!(r.argv[1], Path::new("-u"));
        assert!(r.argv[2].starts_with("/opt/airlock/agents/custom-agent.py/"), "{:?}", r.argv);
    }

    #[test]
    fn missing_agents_say_how_to_install_and_exit_127() {
        let host = Host::new();
        let e = resolve(&host.input("claude", &host.root.join("empty"))).unwrap_err();
        assert_eq!(e.exit_code(), 127);
        assert!(e.to_string().contains("npm install -g @anthropic-ai/claude-code"), "{e}");
        let e = resolve(&host.input("codex", &host.root.join("empty"))).unwrap_err();
        assert!(e.to_string().contains("@openai/codex"), "{e}");
        let e = resolve(&host.input("./nope", Path::new("/x"))).unwrap_err();
        assert_eq!(e.exit_code(), 127);
    }

    #[test]
    fn non_executables_and_unknown_formats_exit_126() {
        let host = Host::new();
        let plain = host.repo.join("notes.txt");
        std::fs::write(&plain, "hi").unwrap();
        assert_eq!(
            resolve(&host.input("./notes.txt", Path::new("/x"))).unwrap_err().exit_code(),
            126
        );
        exe(&host.repo.join("blob"), b"\x00\x01binary");
        let e = resolve(&host.input("./blob", Path::new("/x"))).unwrap_err();
        assert_eq!(e.exit_code(), 126, "{e}");
    }

    #[test]
    fn interpreter_loops_and_missing_env_programs_are_errors() {
        let host = Host::new();
        let a = host.repo.join("a");
        let b = host.repo.join("b");
        exe(&a, format!("#!{}\n", b.display()).as_bytes());
        exe(&b, format!("#!{}\n", a.display()).as_bytes());
        let e = resolve(&host.input("./a", Path::new("/x"))).unwrap_err();
        assert!(e.to_string().contains("levels deep"), "{e}");
        exe(&host.repo.join("c"), b"#!/usr/bin/env definitely-not-a-program-xyz\n");
        let e = resolve(&host.input("./c", Path::new("/x"))).unwrap_err();
        assert!(e.to_string().contains("not on your PATH"), "{e}");
        assert_eq!(e.exit_code(), 127);
    }

    #[test]
    fn shebang_parsing_follows_execve() {
        let host = Host::new();
        let f = host.repo.join("s");
        exe(&f, b"#!  /bin/sh   -e -x  \necho\n");
        assert_eq!(
            format_of(&f).unwrap(),
            Format::Script { interpreter: "/bin/sh".into(), arg: Some("-e -x".into()) }
        );
        assert_eq!(env_program(Some("-S node --max-old-space-size=4096")), Some("node"));
        assert_eq!(env_program(Some("FOO=1 python3")), Some("python3"));
        assert_eq!(env_program(None), None);
    }

    #[test]
    fn package_root_stops_below_the_home() {
        let host = Host::new();
        // A stray ~/package.json must not make the whole home the agent's package.
        std::fs::create_dir_all(&host.home).unwrap();
        std::fs::write(host.home.join("package.json"), "{}").unwrap();
        let tool = host.home.join("bin/tool");
        exe(&tool, b"\x7fELF");
        let input = host.input("x", Path::new("/x"));
        let cx = Context::new(&input);
        assert_eq!(package_root(&tool, &cx), tool);
        let b = place(&tool, &cx, "tool", "").unwrap();
        assert_eq!(b.dst, Path::new("/opt/airlock/agents/tool/tool"));
    }

    /// Regression (review of issue 6): a HOME reached through a symlink, a stray
    /// `~/package.json` and Claude's native-installer layout bound the whole home.
    #[test]
    fn a_symlinked_home_is_never_bound() {
        let host = Host::new();
        let real_home = host.root.join("data/u");
        std::fs::create_dir_all(&real_home).unwrap();
        std::fs::create_dir_all(host.root.join("home")).unwrap();
        let _ = std::fs::remove_dir_all(&host.home);
        symlink(&real_home, &host.home).unwrap();
        std::fs::write(
            real_home.join("package.json"),
            r#"{"bin":{"claude":".local/share/claude/versions/2.0.1"}}"#,
        )
        .unwrap();
        let bin = real_home.join(".local/share/claude/versions/2.0.1");
        exe(&bin, b"\x7fELF");
        std::fs::create_dir_all(real_home.join(".local/bin")).unwrap();
        symlink(&bin, real_home.join(".local/bin/claude")).unwrap();
        let repo = host.repo.clone();
        let input = Input {
            repo: &repo,
            cwd: &repo,
            ..host.input("claude", &host.home.join(".local/bin"))
        };
        let r = resolve(&input).unwrap();
        assert_eq!(r.binds.len(), 1, "{:?}", r.binds);
        assert_eq!(r.binds[0].src, bin, "only the file: {:?}", r.binds);
        assert_eq!(r.version.as_deref(), Some("2.0.1"));
    }

    #[test]
    fn broad_or_shared_trees_are_not_bound_whole() {
        let host = Host::new();
        let input = host.input("x", Path::new("/x"));
        let cx = Context::new(&input);
        assert!(!cx.bindable(Path::new("/")));
        assert!(!cx.bindable(Path::new("/opt")), "a top-level directory");
        assert!(!cx.bindable(&host.home), "the home");
        assert!(!cx.bindable(host.home.parent().unwrap()), "contains the home");
        assert!(!cx.bindable(host.repo.parent().unwrap()), "contains the repo");
        let shared = host.root.join("shared/x");
        std::fs::create_dir_all(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(!cx.bindable(&shared), "writable by others");
        // A package.json above a program binds that package only if it declares the program.
        let pkg = host.root.join("opt-srv/pkg");
        exe(&pkg.join("bin/tool"), b"\x7fELF");
        std::fs::write(host.root.join("opt-srv/package.json"), r#"{"name":"other"}"#).unwrap();
        assert_eq!(package_root(&pkg.join("bin/tool"), &cx), pkg.join("bin/tool"));
        std::fs::write(pkg.join("package.json"), r#"{"bin":"bin/tool"}"#).unwrap();
        assert_eq!(package_root(&pkg.join("bin/tool"), &cx), pkg);
    }

    #[test]
    fn a_repo_agent_may_not_lead_out_of_the_repo() {
        let host = Host::new();
        let outside = host.root.join("other-repo/scripts/x.sh");
        exe(&outside, b"#!/bin/sh\necho hi\n");
        symlink(&outside, host.repo.join("agent")).unwrap();
        let e = resolve(&host.input("./agent", Path::new("/x"))).unwrap_err();
        assert!(matches!(e, ResolveError::LeavesRepo { .. }), "{e}");
        assert_eq!(e.exit_code(), 125);
        // Inside the repo it runs from the repo's mount, with nothing bound.
        exe(&host.repo.join("tools/agent"), b"#!/bin/sh\necho hi\n");
        let r = resolve(&host.input("./tools/agent", Path::new("/x"))).unwrap();
        assert!(r.binds.is_empty(), "{:?}", r.binds);
        assert_eq!(r.argv, vec![PathBuf::from("/pay/tools/agent")], "#!/bin/sh works as is");
        assert_eq!(r.agent.dir_name(), "custom-agent");
    }

    #[test]
    fn claude_code_run_by_path_is_recognized() {
        let host = Host::new();
        let bin = host.npm_claude(&host.root.join("opt-npm"));
        let r =
            resolve(&host.input(bin.join("claude").to_str().unwrap(), Path::new("/x"))).unwrap();
        assert_eq!(r.agent, Agent::Claude);
    }
}
