//! `airlock doctor`: checks what Airlock needs on this machine and prints the fix for each
//! problem. Checks are grouped in probes ([`PROBES`]); the sandbox adds its kernel probes
//! (namespaces, Landlock, seccomp, AppArmor) by appending to that list.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use std::process::{Command, Stdio};

use crate::client::{self, Activation, Endpoint, SocketSource};
use crate::paths::Paths;

use super::Context;

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print the checks as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also check a container backend's engine (default: the configured `[sandbox] backend`,
    /// when it is docker or podman): its version, the images, and whether each of the
    /// repos' networks is sealed.
    #[arg(long, value_name = "docker|podman")]
    pub backend: Option<crate::container::Backend>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

/// One finding: what was checked, what was found, and how to fix it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    pub area: &'static str,
    pub level: Level,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    pub fn ok(area: &'static str, detail: impl Into<String>) -> Self {
        Self { area, level: Level::Ok, detail: detail.into(), fix: None }
    }
    pub fn warn(area: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { area, level: Level::Warn, detail: detail.into(), fix: Some(fix.into()) }
    }
    pub fn fail(area: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { area, level: Level::Fail, detail: detail.into(), fix: Some(fix.into()) }
    }
}

/// A group of checks.
pub type Probe = fn(&Context<'_>) -> Vec<Check>;

/// Every probe, in output order. The sandbox's kernel probes go at the end.
pub const PROBES: &[Probe] =
    &[service_manager, control_socket, identity, configuration, agents, toolchains, kernel];

/// Which agents `airlock run` would find, where they come from and where they appear inside.
pub fn agents(ctx: &Context<'_>) -> Vec<Check> {
    let Ok(paths) = crate::paths::Paths::from_env(ctx.env) else { return Vec::new() };
    // Where the repo is decides where an agent appears inside; outside a usable repo there is
    // nothing `run` could do, and the config checks already say why.
    let Ok(repo) = crate::repo::Repo::resolve(None, &ctx.cwd) else { return Vec::new() };
    ["claude", "codex"]
        .into_iter()
        .map(|name| match super::launch::resolve_agent(name, ctx, &paths, &repo) {
            Ok(r) => Check::ok(
                "agent",
                format!(
                    "{name} {}: {} (inside: {})",
                    r.version.as_deref().unwrap_or("(version unknown)"),
                    r.real.display(),
                    r.argv.last().map(|p| p.display().to_string()).unwrap_or_default()
                ),
            ),
            Err(crate::agent::resolve::ResolveError::NotInstalled { .. }) => Check::warn(
                "agent",
                format!("{name}: not installed (no `{name}` on your PATH)"),
                crate::agent::Agent::from_arg(name).install_hint(),
            ),
            Err(e) => Check::fail("agent", e.to_string(), "reinstall it, or fix the file named"),
        })
        .collect()
}

/// The sandbox's kernel probes (`sandbox::probe`): the same data `exec` decides with.
pub fn kernel(ctx: &Context<'_>) -> Vec<Check> {
    use crate::sandbox::probe::{self, HostFs, Status};
    let mut lines = probe::report(&HostFs::from_env(ctx.env));
    lines.push(probe::capture_line());
    lines
        .into_iter()
        .map(|line| Check {
            area: "kernel",
            level: match line.status {
                Status::Ok => Level::Ok,
                Status::Warn => Level::Warn,
                Status::Fail => Level::Fail,
            },
            detail: format!("{}: {}", line.name, line.detail),
            fix: line.fix,
        })
        .collect()
}

/// The container backend's engine, when one is asked for (`--backend`) or configured: its
/// CLI and version, the two images, and whether every `airlock-net-*` network on it is sealed
/// (a session refuses one that is not). No engine command runs otherwise.
pub fn backend(ctx: &Context<'_>, asked: Option<crate::container::Backend>) -> Vec<Check> {
    use crate::container::{engine::Cli, engine::EngineCli, plan};
    let configured = Paths::from_env(ctx.env).ok().and_then(|paths| {
        let repo = crate::repo::Repo::resolve(None, &ctx.cwd).ok();
        let loaded = crate::config::load(&paths, repo.as_ref(), None).ok()?;
        crate::config::sandbox_backend(&loaded.applied())
    });
    let chosen = asked.or(configured).unwrap_or_default();
    let Some(engine) = chosen.engine() else {
        return vec![Check::ok(
            "backend",
            "native (`airlock doctor --backend podman|docker` checks a container engine)",
        )];
    };
    let cli = Cli::new(engine, ctx.env);
    let version = match engine {
        crate::container::Engine::Podman => "{{.Client.Version}}",
        // The daemon's: the CLI alone cannot run a session.
        crate::container::Engine::Docker => "{{.Server.Version}}",
    };
    let mut out = Vec::new();
    match cli.check(&["version".into(), "--format".into(), version.into()]) {
        Ok(v) => out.push(Check::ok(
            "backend",
            format!(
                "{engine} {}: sessions get an internal network per repo ({}), a proxy container \
                 with ip_forward=0 on a static address, and a sandbox with no resolver, IPv6 off, \
                 no capabilities and no-new-privileges",
                v.trim(),
                match engine {
                    crate::container::Engine::Podman => "DNS off",
                    crate::container::Engine::Docker => {
                        "no IPv4 on its bridge and a host-side drop rule for it"
                    }
                }
            ),
        )),
        Err(e) => {
            out.push(Check::fail(
                "backend",
                format!("{engine}: {e}"),
                format!("install {engine} (and start its service), or use --backend native"),
            ));
            return out;
        }
    }
    let (base_image, proxy_image) = plan::images(ctx.env);
    for image in [&base_image, &proxy_image] {
        // Never hand an engine a name it would read as a flag (as a session refuses it).
        if let Err(e) = plan::check_image_name(image) {
            out.push(Check::fail("backend", e, "set the variable to an image reference"));
            return out;
        }
    }
    for image in [&base_image, &proxy_image] {
        match cli.output(&plan::images_exist(&[image])) {
            Ok(o) if o.success => {
                out.push(Check::ok("backend", format!("image {image}: present")));
                if image == &proxy_image {
                    out.push(proxy_image_version(&cli, image));
                }
            }
            _ => out.push(Check::fail(
                "backend",
                format!("image {image}: missing"),
                "build it from contrib/docker/ (docs/backends.md, \"Images\")",
            )),
        }
    }
    out.push(engine_seccomp(&cli, engine));
    let listed = cli.check(&["network".into(), "ls".into(), "--format".into(), "{{.Name}}".into()]);
    let mut bridges = Vec::new();
    for name in listed.unwrap_or_default().lines().filter(|n| n.starts_with("airlock-net-")) {
        let judged = cli
            .check(&plan::network_inspect(engine, name))
            .map_err(|e| e.to_string())
            .and_then(|o| plan::judge_seal(engine, name, &o));
        match judged {
            Ok(()) => {
                out.push(Check::ok("backend", format!("network {name}: sealed")));
                bridges.extend(crate::container::names::bridge_of_network(name));
            }
            Err(why) => out.push(Check::fail(
                "backend",
                format!("network {name}: not sealed ({why}); sessions of its repo are refused"),
                format!("{engine} network rm {name} (Airlock makes it again, sealed)"),
            )),
        }
    }
    if engine == crate::container::Engine::Docker && !bridges.is_empty() {
        out.extend(bridge_guards(&cli, &proxy_image, &bridges));
    }
    out
}

/// Whether the engine gives its containers a seccomp profile: the container backend has no
/// seccomp filter of Airlock's own, so the engine's default profile is the only one.
fn engine_seccomp(cli: &crate::container::engine::Cli, engine: crate::container::Engine) -> Check {
    use crate::container::engine::EngineCli;
    let format = match engine {
        // Support built in, and the profile containers get (`unconfined` in containers.conf
        // turns it off while support stays "enabled").
        crate::container::Engine::Podman => {
            "{{.Host.Security.SECCOMPEnabled}} {{.Host.Security.SECCOMPProfilePath}}"
        }
        // e.g. `[name=seccomp,profile=default name=cgroupns]`; `profile=unconfined` is off.
        crate::container::Engine::Docker => "{{.SecurityOptions}}",
    };
    match cli.check(&["info".into(), "--format".into(), format.into()]) {
        Ok(o) if seccomp_applies(engine, &o) => {
            Check::ok("backend", format!("{engine} runs containers with its seccomp profile"))
        }
        Ok(o) => Check::warn(
            "backend",
            format!("{engine} runs containers without seccomp ({})", o.trim()),
            "enable seccomp in the engine: the container backend has no seccomp filter of its own",
        ),
        Err(e) => {
            Check::warn("backend", format!("{engine} info: {e}"), "see the engine's own error")
        }
    }
}

/// Whether `engine info`'s output (see [`engine_seccomp`]) shows a seccomp profile applied.
fn seccomp_applies(engine: crate::container::Engine, info: &str) -> bool {
    let info = info.trim();
    match engine {
        crate::container::Engine::Podman => {
            let mut words = info.split_whitespace();
            words.next() == Some("true")
                && words.next().is_some_and(|profile| !profile.contains("unconfined"))
        }
        crate::container::Engine::Docker => info
            .trim_matches(['[', ']'])
            .split_whitespace()
            .any(|opt| opt.starts_with("name=seccomp") && !opt.contains("profile=unconfined")),
    }
}

/// The proxy image's `airlockd` against this `airlock`: a session hands it a layers file of
/// this build's format, which another version may refuse or read differently. Run with
/// `--init`, as sessions run the sandbox: an engine without its init binary (catatonit,
/// docker-init) fails here rather than at every session.
fn proxy_image_version(cli: &crate::container::engine::Cli, image: &str) -> Check {
    use crate::container::{engine::EngineCli, plan};
    let ours = format!("airlockd {}", env!("CARGO_PKG_VERSION"));
    match cli.check(&plan::image_version_run(image)) {
        Ok(v) if v.trim() == ours => {
            Check::ok("backend", format!("image {image}: {ours}, as this airlock"))
        }
        Ok(v) => Check::warn(
            "backend",
            format!("image {image}: {} (this airlock is {})", v.trim(), env!("CARGO_PKG_VERSION")),
            "rebuild the proxy image from this release (docs/backends.md, \"Images\")",
        ),
        Err(e) => Check::fail(
            "backend",
            format!(
                "image {image}: a container of it does not run (with --init, as sessions do): {e}"
            ),
            "install the engine's init (catatonit for Podman, tini as docker-init for Docker), or \
             rebuild the proxy image (docs/backends.md, \"Images\")",
        ),
    }
}

/// Docker: whether each sealed network's host-side drop rule is in force, by one helper
/// container (`airlockd bridge-guard --check`, the way a session installs it). A missing rule
/// is a warning: the next session of that repo puts it back before its sandbox starts.
fn bridge_guards(
    cli: &crate::container::engine::Cli,
    image: &str,
    bridges: &[String],
) -> Vec<Check> {
    use crate::container::{engine::EngineCli, plan};
    let out = match cli.output(&plan::bridge_guard_run(image, bridges, true)) {
        // 0: all in force; 1: some missing (each said on stdout).
        Ok(o) if o.success || o.stdout.lines().count() == bridges.len() => o,
        Ok(o) => {
            return vec![Check::fail(
                "backend",
                format!("bridge guard: could not be checked: {}", o.stderr.trim()),
                "the engine must let a container use the host network with NET_ADMIN \
                 (docs/backends.md, \"Docker's bridge guard\")",
            )];
        }
        Err(e) => {
            return vec![Check::fail("backend", format!("bridge guard: {e}"), "see above")];
        }
    };
    out.stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(bridge, state)| match state {
            "in-force" => Check::ok(
                "backend",
                format!("bridge {bridge}: the host drops what it receives from it"),
            ),
            _ => Check::warn(
                "backend",
                format!("bridge {bridge}: no host-side drop rule (its IPv4 is still inhibited)"),
                "the next session of its repo installs it; or remove the network",
            ),
        })
        .collect()
}

pub fn run(args: &DoctorArgs, ctx: &Context<'_>) -> i32 {
    let mut checks: Vec<Check> = PROBES.iter().flat_map(|p| p(ctx)).collect();
    checks.extend(backend(ctx, args.backend));
    if args.json {
        match serde_json::to_string_pretty(&checks) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("airlock: {e}");
                return 125;
            }
        }
    } else {
        for c in &checks {
            let tag = match c.level {
                Level::Ok => "ok  ",
                Level::Warn => "warn",
                Level::Fail => "FAIL",
            };
            println!("[{tag}] {:<9} {}", c.area, c.detail);
            if let Some(fix) = &c.fix {
                println!("                 fix: {fix}");
            }
        }
    }
    if checks.iter().any(|c| c.level == Level::Fail) { 1 } else { 0 }
}

fn systemd_user_manager() -> Result<(), String> {
    match Command::new("systemctl")
        .args(["--user", "show-environment"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_owned()),
        Err(e) => Err(format!("systemctl: {e}")),
    }
}

/// Which service manager can own the control socket, and whether a unit is installed.
pub fn service_manager(ctx: &Context<'_>) -> Vec<Check> {
    let mut out = Vec::new();
    let installed: Vec<_> =
        client::service_unit_candidates(ctx.env).into_iter().filter(|p| p.exists()).collect();
    if cfg!(target_os = "macos") {
        match installed.first() {
            Some(p) => out.push(Check::ok("service", format!("LaunchAgent installed: {}", p.display()))),
            None => out.push(Check::warn(
                "service",
                "no LaunchAgent for airlockd is installed; the CLI starts airlockd itself (one-shot)",
                "airlock service install",
            )),
        }
        return out;
    }
    match systemd_user_manager() {
        Ok(()) => match installed.first() {
            Some(p) => out.push(Check::ok(
                "service",
                format!("systemd user manager; unit installed: {}", p.display()),
            )),
            None => out.push(Check::warn(
                "service",
                "a systemd user manager runs but airlock.socket is not installed; the CLI starts \
                 airlockd itself (one-shot)",
                "airlock service install",
            )),
        },
        Err(why) => {
            let why = if why.is_empty() { "unreachable".to_owned() } else { why };
            out.push(Check::warn(
                "service",
                format!(
                    "no systemd user manager ({why}); the CLI's one-shot activator starts airlockd \
                     on demand (normal in containers and CI)"
                ),
                "on a desktop or server, log in through a session that starts `systemd --user` \
                 (or `loginctl enable-linger $USER`), then `airlock service install`",
            ));
            if let Some(p) = installed.first() {
                out.push(Check::fail(
                    "service",
                    format!("{} is installed but no user manager can run it, so the socket is never served", p.display()),
                    "start the user manager, or remove the unit (`airlock service uninstall`) to use the one-shot activator",
                ));
            }
        }
    }
    out
}

/// The socket path, its directory's safety, and whether airlockd answers.
pub fn control_socket(ctx: &Context<'_>) -> Vec<Check> {
    let mut out = Vec::new();
    let ep = Endpoint::resolve(ctx.env);
    let path = &ep.socket.path;
    out.push(Check::ok(
        "socket",
        format!("{} (from {})", path.display(), ep.socket.source.describe()),
    ));
    if ep.socket.source == SocketSource::TmpFallback {
        out.push(Check::warn(
            "socket",
            "XDG_RUNTIME_DIR is not set, so the socket lives under /tmp",
            "log in through a session that sets XDG_RUNTIME_DIR (pam_systemd), or set AIRLOCK_SOCKET",
        ));
    }
    let dir = ep.socket.dir();
    if dir.exists() {
        match client::check_dir(dir) {
            Ok(()) => out.push(Check::ok("socket", format!("{} is 0700 and yours", dir.display()))),
            Err(e) => out.push(Check::fail(
                "socket",
                e.to_string(),
                format!("chmod 0700 {}", dir.display()),
            )),
        }
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        let mode = meta.permissions().mode() & 0o777;
        if meta.uid() != nix::unistd::geteuid().as_raw() || mode & 0o077 != 0 {
            out.push(Check::warn(
                "socket",
                format!("{} has mode {mode:04o} owned by uid {}", path.display(), meta.uid()),
                "the socket should be 0600 and yours (SocketMode=0600); airlockd still refuses other uids",
            ));
        }
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => out.push(Check::ok(
            "daemon",
            "airlockd answers on the socket (`airlock status` for details)",
        )),
        Err(e) => match &ep.activation {
            Activation::OneShot => out.push(Check::ok(
                "daemon",
                format!(
                    "airlockd is not running ({e}); the next command starts it (one-shot activator)"
                ),
            )),
            Activation::ServiceManager { unit } => out.push(Check::fail(
                "daemon",
                format!(
                    "nothing listens on {} ({e}) although {} owns it",
                    path.display(),
                    unit.display()
                ),
                client::service_fix(),
            )),
        },
    }
    if client::find_daemon().is_none() {
        out.push(Check::fail(
            "daemon",
            "airlockd was found neither next to airlock nor on PATH",
            "install airlockd beside airlock",
        ));
    }
    out
}

/// `~/.airlock/identity.toml`: present, private, parseable (the config module's reader).
pub fn identity(ctx: &Context<'_>) -> Vec<Check> {
    let paths = match Paths::from_env(ctx.env) {
        Ok(p) => p,
        Err(e) => {
            return vec![Check::fail("identity", e.to_string(), "set HOME to your home directory")];
        }
    };
    let file = paths.identity_file();
    match crate::config::load_identity(&paths) {
        Ok(Some(id)) => vec![Check::ok("identity", format!("{} ({})", id.email, file.display()))],
        Ok(None) => vec![Check::warn(
            "identity",
            format!("no identity ({} is missing): audit lines are unattributed", file.display()),
            "airlock login --email you@example.com",
        )],
        Err(e) => vec![Check::fail(
            "identity",
            e.to_string(),
            format!(
                "chmod 0600 {} if it is too open, else `airlock logout && airlock login --email ...`",
                file.display()
            ),
        )],
    }
}

/// The managed and user layers load; the repo file's trust state; the effective policy builds.
pub fn configuration(ctx: &Context<'_>) -> Vec<Check> {
    let paths = match Paths::from_env(ctx.env) {
        Ok(p) => p,
        Err(e) => {
            return vec![Check::fail("config", e.to_string(), "set HOME to your home directory")];
        }
    };
    let mut out = Vec::new();
    for o in &paths.overrides {
        out.push(Check::warn(
            "config",
            format!("test hook in force: {o}"),
            "unset it outside tests",
        ));
    }
    match crate::config::load_managed(&paths) {
        Ok(Some(doc)) => out.push(Check::ok("config", format!("managed policy: {}", doc.name))),
        Ok(None) => out.push(Check::ok(
            "config",
            format!("managed policy: none ({})", paths.managed_policy().display()),
        )),
        Err(e) => out.push(Check::fail(
            "config",
            format!("managed policy: {e}"),
            "ask your fleet admin to fix it; airlockd refuses sessions until then",
        )),
    }
    let repo = crate::repo::Repo::resolve(None, &ctx.cwd).ok();
    let identity = crate::config::load_identity(&paths).ok().flatten();
    match crate::config::load(&paths, repo.as_ref(), identity.as_ref()) {
        Ok(loaded) => {
            match &loaded.user {
                Some(u) => out.push(Check::ok("config", format!("user config: {}", u.doc.name))),
                None => out.push(Check::warn(
                    "config",
                    format!("no user config ({})", paths.user_config().display()),
                    "add an allow list to ~/.airlock/config.toml, e.g. [network] allow = [\"github.com\"]",
                )),
            }
            for w in loaded.warnings() {
                out.push(Check::warn("config", w.to_string(), "see `airlock policy show`"));
            }
            if let (Some(repo), Some(file)) = (&repo, &loaded.repo) {
                let state = &file.trust;
                let line = state.describe(&file.name, &repo.path);
                if state.is_trusted() {
                    out.push(Check::ok("trust", line));
                } else {
                    out.push(Check::warn("trust", line, "review it, then `airlock policy trust`"));
                }
            } else if let Some(repo) = &repo {
                out.push(Check::ok("trust", format!("repo {}: no .airlock.toml", repo.name)));
            }
            match loaded.build_policy() {
                Ok(_) => out.push(Check::ok("config", "the effective policy builds")),
                Err(e) => out.push(Check::fail(
                    "config",
                    e.to_string(),
                    "add an allow entry (user or trusted repo layer)",
                )),
            }
        }
        Err(e) => out.push(Check::fail("config", e.to_string(), "fix the file named above")),
    }
    out
}

/// Toolchains on the host `PATH` under the home: each is "command not found" inside unless
/// mounted, so each gets the exact `[sandbox] mounts` line that makes it work (or the reason
/// that line would be refused).
pub fn toolchains(ctx: &Context<'_>) -> Vec<Check> {
    use crate::sandbox::{toolchain, usermount};
    let Ok(paths) = Paths::from_env(ctx.env) else { return Vec::new() };
    let Some(path_var) = ctx.env.var_os("PATH") else { return Vec::new() };
    let home = std::fs::canonicalize(paths.home()).unwrap_or_else(|_| paths.home().to_path_buf());
    let found = toolchain::detect(&path_var, &home);
    let repo = crate::repo::Repo::resolve(None, &ctx.cwd).ok();
    let loaded = crate::config::load(&paths, repo.as_ref(), None).ok();
    let configured: Vec<String> = loaded
        .as_ref()
        .map(|l| crate::config::sandbox_mounts(&l.applied()).0)
        .unwrap_or_default()
        .into_iter()
        .map(|(text, _)| text)
        .collect();
    let rules = repo.as_ref().map(|r| {
        let host = crate::hostpath::HostPathRules::for_user(&paths, ctx.env);
        super::launch::mount_rules(&paths, r, host)
    });
    let mut out = Vec::new();
    let mut missing: Vec<String> = Vec::new();
    for f in found {
        let shown = crate::config::display_path(&paths, &f.dir);
        if f.mounts.iter().all(|m| configured.contains(m)) {
            out.push(Check::ok("toolchain", format!("{} ({shown}) is mounted", f.what)));
            continue;
        }
        let refusal = rules.as_ref().and_then(|rules| {
            f.mounts.iter().find_map(|m| {
                let spec = usermount::parse(m).ok()?;
                rules.judge(&spec, m, &usermount::Origin::CommandLine).err()
            })
        });
        if let Some(why) = refusal {
            out.push(Check::warn(
                "toolchain",
                format!("{} ({shown}) on your PATH cannot be mounted: {why}", f.what),
                "install the tools in a directory of their own and mount that",
            ));
            continue;
        }
        for m in &f.mounts {
            if !missing.contains(m) {
                missing.push(m.clone());
            }
        }
        let cache = f
            .cache
            .map(|c| format!(" and, for faster builds, cache = [\"{c}\"]"))
            .unwrap_or_default();
        out.push(Check::warn(
            "toolchain",
            format!(
                "{} ({shown}) on your PATH is not inside the sandbox (command not found there)",
                f.what
            ),
            format!(
                "add under [sandbox] in ~/.airlock/config.toml: {}{cache}",
                toolchain::mounts_line(&f.mounts)
            ),
        ));
    }
    if missing.len() > 1 {
        let all: Vec<String> = configured.iter().cloned().chain(missing).collect();
        out.push(Check::ok(
            "toolchain",
            format!("all of them at once: [sandbox] {}", toolchain::mounts_line(&all)),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::seccomp_applies;
    use crate::container::Engine;

    #[test]
    fn an_unconfined_profile_is_no_seccomp() {
        assert!(seccomp_applies(Engine::Podman, "true /usr/share/containers/seccomp.json\n"));
        assert!(!seccomp_applies(Engine::Podman, "true unconfined"));
        assert!(!seccomp_applies(Engine::Podman, "false /usr/share/containers/seccomp.json"));
        assert!(!seccomp_applies(Engine::Podman, "true "));
        assert!(seccomp_applies(Engine::Docker, "[name=seccomp,profile=default name=cgroupns]"));
        assert!(seccomp_applies(Engine::Docker, "[name=apparmor name=seccomp,profile=builtin]"));
        assert!(!seccomp_applies(Engine::Docker, "[name=seccomp,profile=unconfined]"));
        assert!(!seccomp_applies(Engine::Docker, "[name=apparmor name=cgroupns]"));
    }
}
