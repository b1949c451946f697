//! One session's launch, shared by `airlock exec` (any command) and `airlock run` (an agent):
//! the repo and its host-path check, agent resolution (before anything is asked), the trust
//! gate and its prompt, the honoured git pointers, the configuration's contribution
//! ([`gate`]), the sandbox environment and kernel probe, the agent's side ([`agent`]: its home,
//! binds and argv), the daemon bridge ([`bridge`]), the supervisor request and run, and the
//! end-of-session report. The two commands are front ends that only turn their arguments into
//! a [`Launch`].
//!
//! It lives under `cli/` because it is the CLI's composition of the library (it prompts on the
//! terminal and prints the user-facing messages); the pieces it composes stay free of that.

mod agent;
mod bridge;
mod container;
mod gate;
mod gatenotice;
mod gaterelay;
mod options;
mod refusals;
mod toolchains;
mod toolgates;

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

pub use agent::{AgentBridge, AgentSession, prepare, resolve_agent};
pub use bridge::{DaemonBridge, bridge};
pub use gate::{ConfigGate, Prepared, Trust, TrustGate};
pub use options::SessionOptions;
pub use toolchains::rules as mount_rules;

use super::Context;
use crate::agent::resolve::Resolved;
use crate::env::Env;
use crate::hostpath::HostPathRules;
use crate::paths::Paths;
use crate::repo::Repo;
use crate::sandbox::bridge::ProxyBridge;
use crate::sandbox::env as senv;
use crate::sandbox::probe::{self, HostFs};
use crate::sandbox::supervisor::{self, Request};

fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("airlock: {msg}");
    125
}

/// What a session starts: any command (`exec`) or an agent (`run`).
#[derive(Debug, Clone)]
pub enum Launch {
    Command(Vec<OsString>),
    /// `claude`, `codex` or a path, and the arguments after `--`.
    Agent {
        agent: String,
        args: Vec<OsString>,
    },
}

/// A [`Launch`] once the agent, if any, has been found on the host.
enum Target {
    Command(Vec<OsString>),
    Agent(Box<Resolved>, Vec<OsString>),
    /// A container session's agent: the image's command of that name (never looked up on the
    /// host).
    ImageAgent(String, Vec<OsString>),
}

/// Runs a session with the production collaborators: the configuration gate and the daemon
/// bridge.
pub fn launch(
    repo_arg: Option<&Path>,
    ports: &[String],
    launch: Launch,
    opts: &SessionOptions,
    ctx: &Context<'_>,
) -> i32 {
    let ports = match crate::sandbox::ports::PortSpec::parse_all(ports) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    run_with(repo_arg, launch, opts, ctx, &ConfigGate, &mut |prepared| bridge(ctx, prepared), ports)
}

/// A session (`exec` or `run`) with its collaborators injected.
pub fn run_with(
    repo_arg: Option<&Path>,
    launch: Launch,
    opts: &SessionOptions,
    ctx: &Context<'_>,
    gate: &dyn TrustGate,
    make_bridge: &mut dyn FnMut(&Prepared) -> Box<dyn ProxyBridge>,
    ports: Vec<crate::sandbox::ports::PortSpec>,
) -> i32 {
    let paths = match Paths::from_env(ctx.env) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let repo = match Repo::resolve(repo_arg, &ctx.cwd) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let rules = HostPathRules::for_user(&paths, ctx.env);
    if let Err(why) = rules.check_canonical(&repo.path) {
        return fail(format!(
            "refusing to run with --repo {}: {why}; run from (or pass --repo) the project \
             directory itself",
            repo.path.display()
        ));
    }
    let workdir = match toolchains::workdir(&repo, &ctx.cwd, opts.workdir.as_deref()) {
        Ok(w) => w,
        Err(e) => return fail(e),
    };
    // An agent that is not installed is reported before anything is asked or started. With
    // `--backend docker|podman` the agent is the image's: the host is not searched.
    let image_agent = opts.backend.is_some_and(|b| b.engine().is_some());
    let target = match launch {
        Launch::Command(argv) => Target::Command(argv),
        Launch::Agent { agent, args } if image_agent => Target::ImageAgent(agent, args),
        Launch::Agent { agent, args } => match agent::resolve_agent(&agent, ctx, &paths, &repo) {
            Ok(resolved) => Target::Agent(Box::new(resolved), args),
            Err(e) => {
                eprintln!("airlock: {e}");
                return e.exit_code();
            }
        },
    };
    match gate.check(&paths, &repo) {
        Ok(Trust::Trusted) => {}
        Ok(Trust::Untrusted { diff }) => {
            let file = repo.config_file();
            let interactive = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
            if !interactive {
                return fail(format!(
                    "{} is not trusted (new or changed since you trusted it); review it and run \
                     `airlock policy trust --repo {}`",
                    file.display(),
                    repo.path.display()
                ));
            }
            eprintln!(
                "airlock: {} is new or changed since you trusted it:\n{diff}",
                file.display()
            );
            eprint!("Trust this file and continue? [y/N] ");
            let _ = std::io::stderr().flush();
            let mut answer = String::new();
            let _ = std::io::stdin().read_line(&mut answer);
            if !matches!(answer.trim(), "y" | "Y" | "yes") {
                return fail("not trusted; nothing was run");
            }
            if let Err(e) = gate.trust(&paths, &repo) {
                return fail(format!("recording trust: {e}"));
            }
        }
        Err(e) => return fail(e),
    }
    let git = match judged_git_pointers(&paths, &repo, &rules) {
        Ok(found) => found,
        Err(e) => return fail(e),
    };
    let mut prepared = match gate.load(&paths, &repo, ctx.env) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    // `--phase`: one the applied layers define (an untrusted repo file defines none), checked
    // before anything starts; the daemon builds its policy from the same layers.
    if let Some(phase) = &opts.phase {
        if !prepared.phases.iter().any(|(n, _)| n == phase) {
            let why = crate::config::phase::unknown_phase_among(phase, &prepared.phases);
            return fail(format!("{why}; nothing was started"));
        }
        prepared.phase = Some(phase.clone());
    }
    let backend = container::choose(opts.backend, &prepared);
    // A container backend from configuration: the agent found on the host is run by name
    // from the image (its host files are not bound there).
    let target = match target {
        Target::Agent(resolved, args) if backend.engine().is_some() => {
            Target::ImageAgent(resolved.agent.name().to_owned(), args)
        }
        // (An image agent comes only from `--backend docker|podman`, which `choose` keeps.)
        other => other,
    };
    if backend.engine().is_some() {
        // Not yet: ports need a published port on the sandbox container.
        if !ports.is_empty() {
            return fail(format!("--port is not available with --backend {backend} yet"));
        }
        // The proxy container holds no gate (it has no control socket to ask); refusing is the
        // closed failure, rather than a gated host refused as `gate_unavailable` mid-session.
        if prepared.gated {
            return fail(format!(
                "this policy has [gate] entries, which --backend {backend} does not hold yet; \
                 run with --backend native"
            ));
        }
    }
    let chosen = match toolchains::judge(&paths, &repo, rules.clone(), &prepared, opts) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let (mut env, ignored) =
        senv::build(ctx.env, &repo.sandbox_path(), &prepared.identity, &prepared.extra);
    for name in ignored {
        eprintln!(
            "airlock: warning: [env] pass {name:?} ignored: Airlock sets it inside the sandbox"
        );
    }
    let kernel = probe::probe(&HostFs::from_env(ctx.env));
    if backend.engine().is_none() {
        warn_once(&paths, &kernel.optional_warnings());
    }
    if prepared.identity.user_id.is_none() {
        warn_unattributed_once(&paths, &repo);
    }
    let session = match supervisor::new_session_id() {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let mut req = Request {
        quarantine_dir: crate::sandbox::quarantine::session_dir(&paths.airlock_dir(), &session),
        git,
        host_git_configs: host_git_configs(&paths, ctx.env),
        session,
        repo,
        argv: Vec::new(),
        env: Vec::new(),
        user_id: prepared.identity.user_id.clone(),
        limits: crate::sandbox::cgroup::Limits::from_env(ctx.env),
        home: crate::sandbox::mounts::HomeMount::Tmpfs,
        ro_binds: Vec::new(),
        symlinks: Vec::new(),
        agent: None,
        agent_version: None,
        terminal: prepared.terminal,
        mounts: chosen.mounts,
        workdir: Some(workdir),
        ports,
        etc_files: prepared.tool_gates.map(toolgates::etc_files).unwrap_or_default(),
    };
    let mut bridge = make_bridge(&prepared);
    match target {
        Target::Command(argv) => req.argv = argv,
        Target::Agent(resolved, args) => {
            match agent::prepare(&resolved, args, &paths, &prepared, &mut env, &mut req) {
                Ok(session) => bridge = Box::new(session.wrap(bridge)),
                Err(e) => return fail(e),
            }
        }
        Target::ImageAgent(name, args) => {
            match agent::prepare_in_image(&name, args, &paths, &prepared, &mut env, &mut req) {
                Ok(session) => bridge = Box::new(session.wrap(bridge)),
                Err(e) => return fail(e),
            }
        }
    }
    // After the agent's PATH: mounted toolchains come first.
    chosen.env.apply(&mut env);
    req.env = env;
    // Agent trees come from PATH, i.e. from configuration: the same predicate as every bind.
    for (src, _) in &req.ro_binds {
        if let Err(why) = rules.check_canonical(src) {
            return fail(format!("refusing to bind the agent's files: {why}"));
        }
    }
    // The date before the session starts: its lines are in files of that date or later.
    let started = crate::timefmt::rfc3339_ms(std::time::SystemTime::now());
    if let Some(engine) = backend.engine() {
        return match container::run(engine, &paths, &req, &prepared, ctx.env, &mut *bridge) {
            Ok(outcome) => {
                report_sweep(&outcome.sweep, &req.session);
                finish(&paths, &req, &prepared, opts, ctx, &started, None, outcome.exit_code)
            }
            Err(e) => fail(e),
        };
    }
    match supervisor::run(&req, &kernel, &mut *bridge) {
        Ok(outcome) => {
            // The relay has restored the terminal by now (supervisor::run returns after it).
            report_sweep(&outcome.sweep, &req.session);
            let stopped = outcome.stopped.as_ref();
            finish(&paths, &req, &prepared, opts, ctx, &started, stopped, outcome.exit_code)
        }
        Err(e) => fail(e),
    }
}

/// After the session (either backend): this session's refusals, why it was stopped, and the
/// publish the configuration asks for. Returns the session's exit code.
#[allow(clippy::too_many_arguments)] // one call per backend; a struct would only rename them
fn finish(
    paths: &Paths,
    req: &Request,
    prepared: &Prepared,
    opts: &SessionOptions,
    ctx: &Context<'_>,
    started: &str,
    stopped: Option<&crate::sandbox::bridge::Stopped>,
    exit_code: i32,
) -> i32 {
    if !opts.quiet {
        let hints = refusals::Hints::for_repo(&req.repo.path, &ctx.cwd);
        // The same lookup the daemon's writer used (one checkout per directory).
        let root = paths.logs_root();
        match crate::audit::logdir::locate(&root, &req.repo.name, &req.repo.path) {
            Ok(Some(dir)) => {
                for line in refusals::report(&dir, &started[..10], &req.session, &hints) {
                    eprintln!("{line}");
                }
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("airlock: warning: cannot list this session's refusals: {e}")
            }
        }
    }
    if let Some(stopped) = stopped {
        // The daemon's words, escaped: they name a directory, which may carry any bytes.
        eprintln!(
            "airlock: session stopped: {}",
            crate::audit::escape_for_terminal(&stopped.message)
        );
    }
    // On the host, after the sandbox has exited: the token never meets the session.
    if let Some(timeout) = prepared.publish_at_end {
        super::publish::publish_at_session_end(paths, &req.repo.path, timeout);
    }
    exit_code
}

/// The repo's git pointers, honoured only as `airlock policy trust` recorded them, passing the
/// host-path predicate and belonging to this repo (SECURITY §7).
fn judged_git_pointers(
    paths: &Paths,
    repo: &Repo,
    rules: &HostPathRules,
) -> Result<crate::sandbox::gitptr::Found, String> {
    use crate::sandbox::gitptr;
    let found = gitptr::discover(&repo.path, rules).map_err(|e| e.to_string())?;
    if found.pointers.is_empty() && found.problems.is_empty() {
        return Ok(found);
    }
    let record = gitptr::read_record(paths, repo)?;
    let problems = gitptr::verify(&found, &record, &repo.path);
    if problems.is_empty() {
        return Ok(found);
    }
    let lines: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
    Err(format!(
        "refusing to start: git pointers that Airlock does not honour:\n{}",
        lines.join("\n")
    ))
}

/// The system and global git config files, in git's order (git-config(1) FILES).
fn host_git_configs(paths: &Paths, env: &dyn Env) -> Vec<PathBuf> {
    let xdg = env
        .var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| paths.home().join(".config"));
    vec![PathBuf::from("/etc/gitconfig"), xdg.join("git/config"), paths.home().join(".gitconfig")]
}

/// What the end-of-session sweep did, on stderr (the session record has all of it). Every path,
/// key and note here may carry bytes an agent chose, so each goes through the terminal escaper:
/// these lines reach the caller's terminal after the relay's filter is gone.
fn report_sweep(sweep: &crate::sandbox::sweep::Report, session: &str) {
    use crate::audit::escape_for_terminal as esc;
    use crate::sandbox::quarantine::How;
    let shown = |p: &std::path::Path| esc(&p.display().to_string()).into_owned();
    for item in &sweep.items {
        let at = shown(&item.host_path());
        let note = item.note.as_deref().map(|n| esc(n).into_owned());
        match item.how {
            How::Failed => eprintln!(
                "airlock: WARNING: could not take {at} out of the way ({}): {}; remove it before \
                 any host tool reads it",
                item.why,
                note.unwrap_or_default()
            ),
            How::HeldKeys => {
                let keys: Vec<String> =
                    item.keys.iter().map(|k| esc(&k.key).into_owned()).collect();
                let what =
                    if keys.is_empty() { "the whole change".to_string() } else { keys.join(", ") };
                // A note says what became of the rest (a git config merge may have kept none).
                let rest = note.unwrap_or_else(|| "the rest of the change is kept".into());
                eprintln!("airlock: held back {what} in {at} ({}); {rest}", item.why);
            }
            how => eprintln!(
                "airlock: quarantined {at} ({}, {}) → {}{}",
                item.why,
                how.as_str(),
                item.stored.as_deref().map(shown).unwrap_or_default(),
                note.map(|n| format!("; {n}")).unwrap_or_default()
            ),
        }
    }
    if !sweep.items.is_empty() {
        eprintln!(
            "airlock: review with `airlock quarantine show {session}`; take back what was yours \
             with `airlock quarantine restore {session} [PATH]`"
        );
    }
    for m in &sweep.git_config_merged {
        eprintln!("airlock: merged the session's git config changes into {}", esc(m));
    }
    for p in &sweep.setuid_stripped {
        eprintln!("airlock: stripped setuid/setgid bits from {}", shown(p));
    }
    for w in &sweep.warnings {
        eprintln!("airlock: warning: {}", esc(w));
    }
}

/// An unattributed run's warning, once per repo (marker under ~/.airlock): its audit lines
/// carry no `user_id`, so a review plane cannot say whose session it was.
fn warn_unattributed_once(paths: &Paths, repo: &Repo) {
    let marker = paths.airlock_dir().join(format!("warned-unattributed-{}", repo.key()));
    if marker.exists() {
        return;
    }
    eprintln!(
        "airlock: warning: no `airlock login` on this machine: this session's audit lines carry \
         no user_id, so nobody can tell whose session it was; run `airlock login --email YOU` \
         (shown once for {})",
        crate::audit::escape_for_terminal(&repo.path.display().to_string())
    );
    let _ = std::fs::create_dir_all(paths.airlock_dir());
    let _ = std::fs::write(marker, repo.path.as_os_str().as_encoded_bytes());
}

/// Prints each optional-layer warning once per machine state (marker under ~/.airlock).
fn warn_once(paths: &Paths, warnings: &[String]) {
    if warnings.is_empty() {
        return;
    }
    let joined = warnings.join("\n");
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(joined.as_bytes()));
    let marker = paths.airlock_dir().join(format!("warned-{}", &digest[..16]));
    if marker.exists() {
        return;
    }
    for w in warnings {
        eprintln!("airlock: warning: {w} (shown once; see `airlock doctor`)");
    }
    let _ = std::fs::create_dir_all(paths.airlock_dir());
    let _ = std::fs::write(marker, joined);
}
