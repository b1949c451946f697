//! `airlock service install | uninstall | status [--dry-run]`: writes (or removes) the user
//! service for airlockd — systemd user units enabled with `systemctl --user`, or a per-user
//! LaunchAgent bootstrapped with `launchctl bootstrap gui/$UID` — plus the man pages and the
//! bash, zsh and fish completions of both binaries, printing every file it writes and every
//! command it runs. `--dry-run` prints the same and touches nothing. With `--review` it also
//! installs (or removes) a personal review plane: user units `airlock-review.socket` (listening
//! on 127.0.0.44:8443) and `airlock-review.service` (`airlockd review`, embedded store).
//!
//! Install is all or nothing: it first checks that the service manager answers, then writes
//! every file, then runs the manager's commands; if anything fails after the first write, every
//! file it wrote is removed again (or given back its previous contents) before it exits.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::client::{self, LAUNCHD_LABEL, SocketPath};
use crate::paths::Paths;

use super::Context;

/// The shipped units; `ExecStart=` is rewritten to the installed airlockd.
pub const SYSTEMD_SOCKET: &str = include_str!("../../service/systemd/airlock.socket");
pub const SYSTEMD_SERVICE: &str = include_str!("../../service/systemd/airlock.service");
/// The fleet LaunchAgent and the per-user template.
/// The personal review plane's user units (`--review`).
pub const SYSTEMD_REVIEW_SOCKET: &str =
    include_str!("../../service/systemd/user/airlock-review.socket");
pub const SYSTEMD_REVIEW_SERVICE: &str =
    include_str!("../../service/systemd/user/airlock-review.service");
/// Where the personal review plane listens: its own loopback address, because the sandbox is
/// refused every port of the identity's server host, and that must not be 127.0.0.1.
pub const PERSONAL_REVIEW_URL: &str = "http://127.0.0.44:8443";
pub const LAUNCHD_FLEET: &str = include_str!("../../service/launchd/dev.airlock.airlockd.plist");
pub const LAUNCHD_USER_TEMPLATE: &str =
    include_str!("../../service/launchd/dev.airlock.airlockd.user.plist.in");

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Manager {
    Systemd,
    Launchd,
}

impl Manager {
    pub fn native() -> Self {
        if cfg!(target_os = "macos") { Self::Launchd } else { Self::Systemd }
    }
}

#[derive(Debug, clap::Args)]
pub struct ServiceArgs {
    /// Print what would be written and run; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The service manager (default: launchd on macOS, systemd elsewhere).
    #[arg(long, value_enum)]
    pub manager: Option<Manager>,
    /// Also a personal review plane: `airlock-review.socket` on 127.0.0.44:8443 and
    /// `airlock-review.service` (`airlockd review` with the embedded store; systemd only).
    #[arg(long)]
    pub review: bool,
}

#[derive(Debug, clap::Subcommand)]
pub enum ServiceCommand {
    /// Write the user service files and enable the socket.
    Install(ServiceArgs),
    /// Disable the socket and remove the user service files.
    Uninstall(ServiceArgs),
    /// Show which service files are installed and what the service manager says.
    Status(ServiceArgs),
}

/// A file the installer writes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Planned {
    pub path: PathBuf,
    pub contents: String,
    /// Only the path is printed (man pages and completion scripts); units and plists are
    /// printed whole, since they are what an admin reviews.
    pub path_only: bool,
}

/// Renders the systemd units with `ExecStart=` pointing at `airlockd`.
pub fn render_systemd(airlockd: &Path) -> (String, String) {
    let service = SYSTEMD_SERVICE
        .lines()
        .map(|l| {
            if l.starts_with("ExecStart=") {
                format!("ExecStart={}", airlockd.display())
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    (SYSTEMD_SOCKET.to_owned(), service)
}

/// Renders the personal review plane's user units: `ExecStart=` runs `airlockd` with the store
/// in `data_dir` (the shipped unit names `%h/.cargo/bin/airlockd` and `%h/.local/share`).
pub fn render_systemd_review(airlockd: &Path, data_dir: &Path) -> (String, String) {
    let service = SYSTEMD_REVIEW_SERVICE
        .lines()
        .map(|l| {
            if l.starts_with("ExecStart=") {
                format!(
                    "ExecStart={} review --data-dir {}",
                    systemd_quote(&airlockd.display().to_string()),
                    systemd_quote(&data_dir.display().to_string())
                )
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    (SYSTEMD_REVIEW_SOCKET.to_owned(), service)
}

/// A word of a unit's command line (systemd.service(5), "Command lines"): quoted when it holds
/// a space, quote or backslash, and `%` doubled so no specifier is expanded; `$` doubled so no
/// variable is.
fn systemd_quote(word: &str) -> String {
    let escaped = word.replace('%', "%%").replace('$', "$$");
    if escaped.chars().any(|c| c.is_whitespace() || "\"'\\".contains(c)) {
        format!("\"{}\"", escaped.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        escaped
    }
}

/// The personal review plane's store: `$XDG_DATA_HOME/airlock/review`, where `airlockd review
/// init` puts it by default.
pub fn personal_review_dir(ctx: &Context<'_>, paths: &Paths) -> PathBuf {
    data_home(ctx, paths).join("airlock/review")
}

/// Fills the per-user LaunchAgent template: the `@AIRLOCKD@`, `@SOCKET@` and `@LOG@` strings
/// are replaced in the parsed property list and the plist crate writes it out again, so a path
/// with `&`, `<` or non-ASCII is encoded as XML requires (the template's comment is dropped).
pub fn render_launchd_user(airlockd: &Path, socket: &Path, log: &Path) -> Result<String, String> {
    let bad_template =
        |e: plist::Error| format!("the built-in LaunchAgent template is broken: {e}");
    let mut agent =
        plist::Value::from_reader_xml(LAUNCHD_USER_TEMPLATE.as_bytes()).map_err(bad_template)?;
    let fill = |placeholder: &str| match placeholder {
        "@AIRLOCKD@" => Some(airlockd.display().to_string()),
        "@SOCKET@" => Some(socket.display().to_string()),
        "@LOG@" => Some(log.display().to_string()),
        _ => None,
    };
    fill_strings(&mut agent, &fill);
    let mut out = Vec::new();
    agent.to_writer_xml(&mut out).map_err(bad_template)?;
    out.push(b'\n');
    String::from_utf8(out).map_err(|e| format!("the LaunchAgent is not UTF-8: {e}"))
}

/// Replaces every string value for which `fill` has a replacement.
fn fill_strings(value: &mut plist::Value, fill: &dyn Fn(&str) -> Option<String>) {
    match value {
        plist::Value::String(s) => {
            if let Some(new) = fill(s) {
                *s = new;
            }
        }
        plist::Value::Array(items) => items.iter_mut().for_each(|v| fill_strings(v, fill)),
        plist::Value::Dictionary(dict) => dict.values_mut().for_each(|v| fill_strings(v, fill)),
        _ => {}
    }
}

struct Plan {
    files: Vec<Planned>,
    commands: Vec<Vec<String>>,
}

/// `$XDG_DATA_HOME` when set and absolute (XDG Base Directory spec), else `~/.local/share`.
fn data_home(ctx: &Context<'_>, paths: &Paths) -> PathBuf {
    xdg_dir(ctx, "XDG_DATA_HOME").unwrap_or_else(|| paths.home().join(".local/share"))
}

/// `$XDG_CONFIG_HOME` when set and absolute, else `~/.config`.
fn config_home(ctx: &Context<'_>, paths: &Paths) -> PathBuf {
    xdg_dir(ctx, "XDG_CONFIG_HOME").unwrap_or_else(|| paths.home().join(".config"))
}

fn xdg_dir(ctx: &Context<'_>, var: &str) -> Option<PathBuf> {
    ctx.env.var(var).map(PathBuf::from).filter(|p| p.is_absolute())
}

/// Where the user's man pages go: `$XDG_DATA_HOME/man/man1` (man-db searches
/// `~/.local/share/man` for a user whose `PATH` has `~/.local/bin`; otherwise add it to
/// `MANPATH`).
pub fn man_dir(ctx: &Context<'_>, paths: &Paths) -> PathBuf {
    data_home(ctx, paths).join("man/man1")
}

/// The completion script locations each shell loads for one user: bash-completion's
/// `$XDG_DATA_HOME/bash-completion/completions/NAME`, fish's `$XDG_CONFIG_HOME/fish/completions/
/// NAME.fish`, and for zsh (which has no per-user default) `$XDG_DATA_HOME/zsh/site-functions/
/// _NAME`, a directory to add to `fpath`.
fn completion_files(ctx: &Context<'_>, paths: &Paths) -> Vec<Planned> {
    use super::completions::{Binary, script};
    use clap_complete::Shell;
    let data = data_home(ctx, paths);
    let config = config_home(ctx, paths);
    let mut out = Vec::new();
    for binary in Binary::ALL {
        let name = binary.name();
        for (shell, path) in [
            (Shell::Bash, data.join("bash-completion/completions").join(name)),
            (Shell::Zsh, data.join("zsh/site-functions").join(format!("_{name}"))),
            (Shell::Fish, config.join("fish/completions").join(format!("{name}.fish"))),
        ] {
            let contents = String::from_utf8_lossy(&script(binary, shell)).into_owned();
            out.push(Planned { path, contents, path_only: true });
        }
    }
    out
}

/// The man pages and completion scripts `service install` writes beside the service.
fn doc_files(ctx: &Context<'_>, paths: &Paths) -> Result<Vec<Planned>, String> {
    let dir = man_dir(ctx, paths);
    let pages = super::man::all_pages().map_err(|e| format!("cannot render the man pages: {e}"))?;
    let mut out: Vec<Planned> = pages
        .into_iter()
        .map(|p| Planned { path: dir.join(p.file_name), contents: p.roff, path_only: true })
        .collect();
    out.extend(completion_files(ctx, paths));
    Ok(out)
}

/// The read-only command that shows the service manager answers, run before anything is
/// written.
fn preflight_command(manager: Manager) -> Vec<String> {
    match manager {
        Manager::Systemd => svec(&["systemctl", "--user", "show-environment"]),
        Manager::Launchd => vec!["launchctl".into(), "print".into(), format!("gui/{}", uid())],
    }
}

fn no_manager_hint(manager: Manager) -> &'static str {
    match manager {
        Manager::Systemd => {
            "no systemd user manager is reachable (containers and CI have none); the CLI's \
             one-shot activator starts airlockd on demand instead"
        }
        Manager::Launchd => "run it from a logged-in GUI session",
    }
}

fn uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

fn systemd_user_dir(ctx: &Context<'_>, paths: &Paths) -> PathBuf {
    config_home(ctx, paths).join("systemd/user")
}

fn launch_agent_path(paths: &Paths) -> PathBuf {
    paths.home().join("Library/LaunchAgents").join(format!("{LAUNCHD_LABEL}.plist"))
}

fn plan_install(
    manager: Manager,
    review: bool,
    ctx: &Context<'_>,
    paths: &Paths,
) -> Result<Plan, String> {
    let airlockd = client::find_daemon()
        .ok_or("airlockd was found neither next to airlock nor on PATH; install it first")?;
    let airlockd = std::fs::canonicalize(&airlockd).unwrap_or(airlockd);
    let mut plan = plan_service(manager, ctx, paths, &airlockd)?;
    if review {
        let (files, commands) = plan_review_install(manager, ctx, paths, &airlockd)?;
        plan.files.extend(files);
        plan.commands.extend(commands);
    }
    plan.files.extend(doc_files(ctx, paths)?);
    Ok(plan)
}

/// `--review`: the personal review plane's units and the command that enables its socket.
fn plan_review_install(
    manager: Manager,
    ctx: &Context<'_>,
    paths: &Paths,
    airlockd: &Path,
) -> Result<(Vec<Planned>, Vec<Vec<String>>), String> {
    if manager != Manager::Systemd {
        return Err(review_needs_systemd());
    }
    let dir = systemd_user_dir(ctx, paths);
    let (socket, service) = render_systemd_review(airlockd, &personal_review_dir(ctx, paths));
    Ok((
        vec![
            Planned {
                path: dir.join("airlock-review.socket"),
                contents: socket,
                ..Planned::default()
            },
            Planned {
                path: dir.join("airlock-review.service"),
                contents: service,
                ..Planned::default()
            },
        ],
        vec![svec(&["systemctl", "--user", "enable", "--now", "airlock-review.socket"])],
    ))
}

fn review_needs_systemd() -> String {
    "--review installs systemd user units; with launchd, run `airlockd review --listen \
     127.0.0.1:8443` yourself (macOS has no 127.0.0.44 on lo0 unless you add it with \
     `sudo ifconfig lo0 alias 127.0.0.44`)"
        .to_owned()
}

fn plan_service(
    manager: Manager,
    ctx: &Context<'_>,
    paths: &Paths,
    airlockd: &Path,
) -> Result<Plan, String> {
    Ok(match manager {
        Manager::Systemd => {
            let dir = systemd_user_dir(ctx, paths);
            let (socket, service) = render_systemd(airlockd);
            Plan {
                files: vec![
                    Planned {
                        path: dir.join("airlock.socket"),
                        contents: socket,
                        ..Planned::default()
                    },
                    Planned {
                        path: dir.join("airlock.service"),
                        contents: service,
                        ..Planned::default()
                    },
                ],
                commands: vec![
                    svec(&["systemctl", "--user", "daemon-reload"]),
                    svec(&["systemctl", "--user", "enable", "--now", "airlock.socket"]),
                ],
            }
        }
        Manager::Launchd => {
            let plist = launch_agent_path(paths);
            let socket = SocketPath::resolve(ctx.env).path;
            let contents = render_launchd_user(airlockd, &socket, &paths.daemon_log())?;
            Plan {
                commands: vec![vec![
                    "launchctl".into(),
                    "bootstrap".into(),
                    format!("gui/{}", uid()),
                    plist.display().to_string(),
                ]],
                files: vec![Planned { path: plist, contents, ..Planned::default() }],
            }
        }
    })
}

/// The service files `uninstall` removes and `status` reports (the man pages and completions
/// are added by `uninstall` itself).
fn plan_uninstall(manager: Manager, review: bool, ctx: &Context<'_>, paths: &Paths) -> Plan {
    let mut plan = plan_uninstall_daemon(manager, ctx, paths);
    if review && manager == Manager::Systemd {
        let dir = systemd_user_dir(ctx, paths);
        plan.files.extend([
            Planned { path: dir.join("airlock-review.socket"), ..Planned::default() },
            Planned { path: dir.join("airlock-review.service"), ..Planned::default() },
        ]);
        // Disable first: the daemon-reload that follows then forgets the review units too.
        plan.commands.insert(
            0,
            svec(&[
                "systemctl",
                "--user",
                "disable",
                "--now",
                "airlock-review.socket",
                "airlock-review.service",
            ]),
        );
    }
    plan
}

fn plan_uninstall_daemon(manager: Manager, ctx: &Context<'_>, paths: &Paths) -> Plan {
    match manager {
        Manager::Systemd => {
            let dir = systemd_user_dir(ctx, paths);
            Plan {
                files: vec![
                    Planned { path: dir.join("airlock.socket"), ..Planned::default() },
                    Planned { path: dir.join("airlock.service"), ..Planned::default() },
                ],
                commands: vec![
                    svec(&[
                        "systemctl",
                        "--user",
                        "disable",
                        "--now",
                        "airlock.socket",
                        "airlock.service",
                    ]),
                    svec(&["systemctl", "--user", "daemon-reload"]),
                ],
            }
        }
        Manager::Launchd => Plan {
            files: vec![Planned { path: launch_agent_path(paths), ..Planned::default() }],
            commands: vec![vec![
                "launchctl".into(),
                "bootout".into(),
                format!("gui/{}/{LAUNCHD_LABEL}", uid()),
            ]],
        },
    }
}

fn svec(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| (*s).to_owned()).collect()
}

fn run_command(cmd: &[String]) -> Result<(), String> {
    let Some((prog, args)) = cmd.split_first() else { return Ok(()) };
    match Command::new(prog).args(args).status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("`{}` failed ({s})", cmd.join(" "))),
        Err(e) => Err(format!("cannot run `{}`: {e}", cmd.join(" "))),
    }
}

/// Runs `cmd` with its output captured (a check, not a step the user needs to watch); the
/// error carries its stderr.
fn run_quiet(cmd: &[String]) -> Result<(), String> {
    let Some((prog, args)) = cmd.split_first() else { return Ok(()) };
    match Command::new(prog).args(args).stdin(std::process::Stdio::null()).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let err = err.trim();
            let detail = if err.is_empty() { o.status.to_string() } else { err.to_owned() };
            Err(format!("`{}` failed: {detail}", cmd.join(" ")))
        }
        Err(e) => Err(format!("cannot run `{}`: {e}", cmd.join(" "))),
    }
}

/// What a path held before install replaced it, so a failed install can give it back.
#[derive(Debug)]
enum Previous {
    Absent,
    File { bytes: Vec<u8>, mode: u32 },
    Symlink(PathBuf),
}

/// The files and directories one install has written so far, undone in reverse on failure.
#[derive(Debug, Default)]
struct Written {
    files: Vec<(PathBuf, Previous)>,
    dirs: Vec<PathBuf>,
}

impl Written {
    /// Creates `dir` and its missing ancestors (0755), remembering each one it made.
    fn create_dirs(&mut self, dir: &Path) -> std::io::Result<()> {
        let mut missing = Vec::new();
        let mut at = Some(dir);
        while let Some(d) = at {
            if std::fs::symlink_metadata(d).is_ok() {
                break;
            }
            missing.push(d.to_path_buf());
            at = d.parent();
        }
        for d in missing.into_iter().rev() {
            std::fs::DirBuilder::new().mode(0o755).create(&d)?;
            self.dirs.push(d);
        }
        Ok(())
    }

    /// Writes `f` as a temp file renamed over its path (a symlink there is replaced, not
    /// written through), after recording what the path held.
    fn write(&mut self, f: &Planned) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        if let Some(parent) = f.path.parent() {
            self.create_dirs(parent)?;
        }
        let previous = match std::fs::symlink_metadata(&f.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Previous::Absent,
            Err(e) => return Err(e),
            Ok(m) if m.file_type().is_symlink() => Previous::Symlink(std::fs::read_link(&f.path)?),
            Ok(m) if m.is_file() => Previous::File {
                bytes: std::fs::read(&f.path)?,
                mode: m.permissions().mode() & 0o7777,
            },
            Ok(_) => {
                return Err(std::io::Error::other(
                    "something other than a file is there; move it away and run again",
                ));
            }
        };
        let tmp = temp_beside(&f.path);
        let res = std::fs::write(&tmp, &f.contents)
            .and_then(|()| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)))
            .and_then(|()| std::fs::rename(&tmp, &f.path));
        if res.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        res?;
        self.files.push((f.path.clone(), previous));
        Ok(())
    }

    /// Undoes every write, newest first: files get back what they held (or are removed),
    /// directories this install created are removed when empty. Returns what could not be
    /// undone.
    fn undo(self) -> Vec<String> {
        use std::os::unix::fs::PermissionsExt;
        let mut failed = Vec::new();
        for (path, previous) in self.files.into_iter().rev() {
            let res = match previous {
                Previous::Absent => std::fs::remove_file(&path),
                Previous::File { bytes, mode } => std::fs::write(&path, bytes).and_then(|()| {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                }),
                Previous::Symlink(target) => std::fs::remove_file(&path)
                    .and_then(|()| std::os::unix::fs::symlink(target, &path)),
            };
            if let Err(e) = res {
                failed.push(format!("{}: {e}", path.display()));
            }
        }
        for dir in self.dirs.into_iter().rev() {
            // Not empty means something else was put there meanwhile: leave it.
            let _ = std::fs::remove_dir(&dir);
        }
        failed
    }
}

fn temp_beside(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.airlock-tmp-{}", std::process::id()))
}

pub fn run(cmd: &ServiceCommand, ctx: &Context<'_>) -> i32 {
    let paths = match Paths::from_env(ctx.env) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("airlock: {e}");
            return 125;
        }
    };
    match cmd {
        ServiceCommand::Install(a) => install(a, ctx, &paths),
        ServiceCommand::Uninstall(a) => uninstall(a, ctx, &paths),
        ServiceCommand::Status(a) => status(a, ctx, &paths),
    }
}

fn install(a: &ServiceArgs, ctx: &Context<'_>, paths: &Paths) -> i32 {
    let manager = a.manager.unwrap_or_else(Manager::native);
    let plan = match plan_install(manager, a.review, ctx, paths) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("airlock: {e}");
            return 125;
        }
    };
    // Prerequisites before the first write: without a service manager that answers, nothing
    // is installed at all (SECURITY: no half-written service a later login would pick up).
    let check = preflight_command(manager);
    if a.dry_run {
        println!("# would check: {}", check.join(" "));
    } else if let Err(e) = run_quiet(&check) {
        eprintln!("airlock: {e}; {}; nothing was written", no_manager_hint(manager));
        return 125;
    }
    let verb = if a.dry_run { "would write" } else { "writing" };
    let mut written = Written::default();
    for f in &plan.files {
        println!("# {verb} {}", f.path.display());
        if !f.path_only {
            print!("{}", f.contents);
        }
        if !a.dry_run
            && let Err(e) = written.write(f)
        {
            eprintln!("airlock: cannot write {}: {e}", f.path.display());
            return undo_install(written, manager);
        }
    }
    let verb = if a.dry_run { "would run" } else { "running" };
    for c in &plan.commands {
        println!("# {verb}: {}", c.join(" "));
        if !a.dry_run
            && let Err(e) = run_command(c)
        {
            eprintln!("airlock: {e}; {}", no_manager_hint(manager));
            return undo_install(written, manager);
        }
    }
    if a.review {
        println!(
            "# next: create the review store and log in with the token it prints:\n#   airlockd \
             review init --data-dir {} --admin YOU@EXAMPLE.COM | airlock login --server \
             {PERSONAL_REVIEW_URL} --token-stdin",
            personal_review_dir(ctx, paths).display()
        );
    }
    0
}

/// Takes back a failed install's files; exit 125 either way.
fn undo_install(written: Written, manager: Manager) -> i32 {
    let count = written.files.len();
    let failed = written.undo();
    if failed.is_empty() {
        eprintln!(
            "airlock: took back the {count} files this install had written; nothing is installed"
        );
    } else {
        eprintln!("airlock: could not take back every file this install wrote; remove these:");
        for f in &failed {
            eprintln!("airlock:   {f}");
        }
    }
    // The manager may have read the units already; let it forget them (best effort: it may be
    // exactly what failed).
    if manager == Manager::Systemd {
        let _ = run_quiet(&svec(&["systemctl", "--user", "daemon-reload"]));
    }
    125
}

fn uninstall(a: &ServiceArgs, ctx: &Context<'_>, paths: &Paths) -> i32 {
    let manager = a.manager.unwrap_or_else(Manager::native);
    if a.review && manager != Manager::Systemd {
        eprintln!("airlock: {}", review_needs_systemd());
        return 125;
    }
    let mut plan = plan_uninstall(manager, a.review, ctx, paths);
    match doc_files(ctx, paths) {
        Ok(docs) => plan.files.extend(docs),
        Err(e) => eprintln!("airlock: warning: {e}; the man pages are left in place"),
    }
    let verb = if a.dry_run { "would run" } else { "running" };
    let mut code = 0;
    for c in &plan.commands {
        println!("# {verb}: {}", c.join(" "));
        if !a.dry_run
            && let Err(e) = run_command(c)
        {
            // Keep going: the files should still be removed.
            eprintln!("airlock: warning: {e}");
            code = 125;
        }
    }
    let verb = if a.dry_run { "would remove" } else { "removing" };
    for f in &plan.files {
        if std::fs::symlink_metadata(&f.path).is_ok() {
            println!("# {verb} {}", f.path.display());
            if !a.dry_run
                && let Err(e) = std::fs::remove_file(&f.path)
            {
                eprintln!("airlock: cannot remove {}: {e}", f.path.display());
                code = 125;
            }
        }
    }
    code
}

fn status(a: &ServiceArgs, ctx: &Context<'_>, paths: &Paths) -> i32 {
    let manager = a.manager.unwrap_or_else(Manager::native);
    let installed: Vec<PathBuf> =
        client::service_unit_candidates(ctx.env).into_iter().filter(|p| p.exists()).collect();
    let user_files = plan_uninstall(manager, a.review, ctx, paths).files;
    for f in &user_files {
        let state = if f.path.exists() { "installed" } else { "absent" };
        println!("{}: {state}", f.path.display());
    }
    for p in &installed {
        if !user_files.iter().any(|f| &f.path == p) {
            println!("{}: installed (fleet)", p.display());
        }
    }
    let cmd = match manager {
        Manager::Systemd => {
            let mut cmd = svec(&[
                "systemctl",
                "--user",
                "status",
                "--no-pager",
                "airlock.socket",
                "airlock.service",
            ]);
            if a.review {
                cmd.extend(svec(&["airlock-review.socket", "airlock-review.service"]));
            }
            cmd
        }
        Manager::Launchd => {
            vec!["launchctl".into(), "print".into(), format!("gui/{}/{LAUNCHD_LABEL}", uid())]
        }
    };
    if a.dry_run {
        println!("# would run: {}", cmd.join(" "));
        return 0;
    }
    println!("# running: {}", cmd.join(" "));
    match run_command(&cmd) {
        Ok(()) => 0,
        Err(e) => {
            println!("{e}");
            if installed.is_empty() {
                println!(
                    "no service is installed; `airlock service install` writes one, or the CLI's \
                     one-shot activator starts airlockd on demand"
                );
            }
            // systemctl status exits 3 for an inactive unit; that is a state, not an error.
            0
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn review_units_run_the_installed_airlockd_on_its_own_loopback_address() {
        let (socket, service) =
            render_systemd_review(Path::new("/opt/bin/airlockd"), Path::new("/h/my data/review"));
        assert!(socket.lines().any(|l| l == "ListenStream=127.0.0.44:8443"), "{socket}");
        assert!(socket.lines().any(|l| l == "FileDescriptorName=review"), "{socket}");
        assert!(
            service.lines().any(
                |l| l == r#"ExecStart=/opt/bin/airlockd review --data-dir "/h/my data/review""#
            ),
            "{service}"
        );
        assert!(PERSONAL_REVIEW_URL.ends_with("127.0.0.44:8443"));
    }

    #[test]
    fn unit_command_words_are_quoted_and_specifiers_escaped() {
        assert_eq!(systemd_quote("/plain/path"), "/plain/path");
        assert_eq!(systemd_quote("/a b"), "\"/a b\"");
        assert_eq!(systemd_quote("/100%/x"), "/100%%/x");
        assert_eq!(systemd_quote("/$HOME"), "/$$HOME");
        assert_eq!(systemd_quote(r#"/a"b\c"#), r#""/a\"b\\c""#);
    }

    #[test]
    fn units_carry_the_design_keys() {
        let (socket, service) = render_systemd(Path::new("/opt/bin/airlockd"));
        for key in [
            "ListenStream=%t/airlock/airlock.sock",
            "SocketMode=0600",
            "DirectoryMode=0700",
            "Accept=no",
            "FileDescriptorName=airlock",
        ] {
            assert!(socket.lines().any(|l| l == key), "socket unit lacks {key}");
        }
        for key in [
            "Type=notify",
            "Restart=on-failure",
            "RestartPreventExitStatus=64",
            "LimitNOFILE=65536",
            "ExecStart=/opt/bin/airlockd",
        ] {
            assert!(service.lines().any(|l| l == key), "service unit lacks {key}");
        }
        assert!(!socket.contains("RuntimeDirectory") && !service.contains("RuntimeDirectory"));
        assert_eq!(crate::sys::activation::SOCKET_NAME, "airlock");
    }

    #[test]
    fn launchd_template_is_filled_and_escaped() {
        let xml = render_launchd_user(
            Path::new("/a&b/<x>/airlockd"),
            Path::new("/tmp/s é"),
            Path::new("/l"),
        )
        .unwrap();
        assert!(xml.contains("<string>/a&amp;b/&lt;x&gt;/airlockd</string>"), "{xml}");
        assert!(!xml.contains('@'), "{xml}");
        // What was written reads back as the values given, in the template's places.
        let agent = plist::Value::from_reader_xml(xml.as_bytes()).unwrap();
        let agent = agent.as_dictionary().unwrap();
        let program = &agent["ProgramArguments"].as_array().unwrap()[0];
        assert_eq!(program.as_string(), Some("/a&b/<x>/airlockd"));
        let sock = agent["Sockets"].as_dictionary().unwrap()["airlock"].as_dictionary().unwrap();
        assert_eq!(sock["SockPathName"].as_string(), Some("/tmp/s é"));
        assert_eq!(sock["SockPathMode"].as_signed_integer(), Some(384));
        assert_eq!(agent["StandardErrorPath"].as_string(), Some("/l"));
    }
}
