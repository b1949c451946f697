//! `airlock service install | uninstall | status [--dry-run]`: writes (or removes) the user
//! service for airlockd — systemd user units enabled with `systemctl --user`, or a per-user
//! LaunchAgent bootstrapped with `launchctl bootstrap gui/$UID` — printing every file it writes
//! and every command it runs. `--dry-run` prints the same and touches nothing.

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub path: PathBuf,
    pub contents: String,
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
    manager: Manager,
    files: Vec<Planned>,
    commands: Vec<Vec<String>>,
}

fn uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

fn systemd_user_dir(ctx: &Context<'_>, paths: &Paths) -> PathBuf {
    ctx.env
        .var("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| paths.home().join(".config"))
        .join("systemd/user")
}

fn launch_agent_path(paths: &Paths) -> PathBuf {
    paths.home().join("Library/LaunchAgents").join(format!("{LAUNCHD_LABEL}.plist"))
}

fn plan_install(manager: Manager, ctx: &Context<'_>, paths: &Paths) -> Result<Plan, String> {
    let airlockd = client::find_daemon()
        .ok_or("airlockd was found neither next to airlock nor on PATH; install it first")?;
    let airlockd = std::fs::canonicalize(&airlockd).unwrap_or(airlockd);
    Ok(match manager {
        Manager::Systemd => {
            let dir = systemd_user_dir(ctx, paths);
            let (socket, service) = render_systemd(&airlockd);
            Plan {
                manager,
                files: vec![
                    Planned { path: dir.join("airlock.socket"), contents: socket },
                    Planned { path: dir.join("airlock.service"), contents: service },
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
            let contents = render_launchd_user(&airlockd, &socket, &paths.daemon_log())?;
            Plan {
                manager,
                commands: vec![vec![
                    "launchctl".into(),
                    "bootstrap".into(),
                    format!("gui/{}", uid()),
                    plist.display().to_string(),
                ]],
                files: vec![Planned { path: plist, contents }],
            }
        }
    })
}

fn plan_uninstall(manager: Manager, ctx: &Context<'_>, paths: &Paths) -> Plan {
    match manager {
        Manager::Systemd => {
            let dir = systemd_user_dir(ctx, paths);
            Plan {
                manager,
                files: vec![
                    Planned { path: dir.join("airlock.socket"), contents: String::new() },
                    Planned { path: dir.join("airlock.service"), contents: String::new() },
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
            manager,
            files: vec![Planned { path: launch_agent_path(paths), contents: String::new() }],
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
    let plan = match plan_install(manager, ctx, paths) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("airlock: {e}");
            return 125;
        }
    };
    let verb = if a.dry_run { "would write" } else { "writing" };
    for f in &plan.files {
        println!("# {verb} {}", f.path.display());
        print!("{}", f.contents);
        if !a.dry_run {
            let res = f
                .path
                .parent()
                .map_or(Ok(()), |d| {
                    std::fs::DirBuilder::new().recursive(true).mode(0o755).create(d)
                })
                .and_then(|()| std::fs::write(&f.path, &f.contents));
            if let Err(e) = res {
                eprintln!("airlock: cannot write {}: {e}", f.path.display());
                return 125;
            }
        }
    }
    run_plan_commands(&plan, a.dry_run)
}

fn run_plan_commands(plan: &Plan, dry_run: bool) -> i32 {
    let verb = if dry_run { "would run" } else { "running" };
    for c in &plan.commands {
        println!("# {verb}: {}", c.join(" "));
        if !dry_run && let Err(e) = run_command(c) {
            let hint = match plan.manager {
                Manager::Systemd => {
                    "no systemd user manager is reachable (containers and CI have none); the \
                         CLI's one-shot activator starts airlockd on demand instead"
                }
                Manager::Launchd => "run it from a logged-in GUI session",
            };
            eprintln!("airlock: {e}; {hint}");
            return 125;
        }
    }
    0
}

fn uninstall(a: &ServiceArgs, ctx: &Context<'_>, paths: &Paths) -> i32 {
    let manager = a.manager.unwrap_or_else(Manager::native);
    let plan = plan_uninstall(manager, ctx, paths);
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
        if f.path.exists() {
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
    let user_files = plan_uninstall(manager, ctx, paths).files;
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
        Manager::Systemd => svec(&[
            "systemctl",
            "--user",
            "status",
            "--no-pager",
            "airlock.socket",
            "airlock.service",
        ]),
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
