//! `airlock run [--repo DIR] [claude | codex | PATH] [-- ARGS...]`: the `exec` sandbox plus an
//! agent (DESIGN §7): its binaries bound read-only, its per-repo home at `/home/agent` with the
//! shared credentials copied in and back, and the transcripts it wrote hashed into the session
//! record (SECURITY §1, §4, §5). The session itself is `exec`'s ([`super::exec::run_with`]).

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use clap::Args;

use super::Context;
use super::exec::{self, ConfigGate, Launch, Prepared};
use crate::agent::home::{AgentHome, CopyIn, Snapshot};
use crate::agent::resolve::{self, ResolveError, Resolved};
use crate::paths::Paths;
use crate::repo::Repo;
use crate::sandbox::bridge::{BridgeError, ProxyBridge, SessionEnd, SessionInfo};
use crate::sandbox::env::SANDBOX_PATH;
use crate::sandbox::mounts::HomeMount;
use crate::sandbox::supervisor::Request;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The repo directory (default: the git top level of the working directory).
    #[arg(long, value_name = "DIR")]
    pub repo: Option<PathBuf>,
    /// `claude` (default), `codex`, or the path of an agent program.
    #[arg(value_name = "AGENT", default_value = "claude")]
    pub agent: String,
    /// Arguments for the agent (after `--`).
    #[arg(last = true, allow_hyphen_values = true, value_name = "ARGS")]
    pub args: Vec<OsString>,
}

/// Runs `airlock run`.
pub fn run(args: RunArgs, ctx: &Context<'_>) -> i32 {
    let launch = Launch::Agent { agent: args.agent, args: args.args };
    exec::run_with(args.repo.as_deref(), launch, ctx, &ConfigGate, &mut |prepared| {
        exec::bridge(ctx, prepared)
    })
}

/// Finds the agent on the host (before anything is asked or started: a missing agent is 127).
pub fn resolve_agent(
    arg: &str,
    ctx: &Context<'_>,
    paths: &Paths,
    repo: &Repo,
) -> Result<Resolved, ResolveError> {
    resolve::resolve(&resolve::Input {
        arg,
        path_var: ctx.env.var_os("PATH"),
        cwd: &ctx.cwd,
        home: paths.home(),
        repo: &repo.path,
    })
}

/// Agent-specific variables inside (the package is read-only there, so self-update can only
/// fail; say so up front instead).
fn agent_env(agent: &crate::agent::Agent) -> &'static [(&'static str, &'static str)] {
    match agent {
        crate::agent::Agent::Claude => &[("DISABLE_AUTOUPDATER", "1")],
        _ => &[],
    }
}

/// Sets up the agent's side of the session: its home (credentials copied in, `.gitconfig`
/// written, transcripts snapshotted), mounts, `PATH` and argv.
pub fn prepare(
    resolved: &Resolved,
    args: Vec<OsString>,
    paths: &Paths,
    prepared: &Prepared,
    env: &mut Vec<(OsString, OsString)>,
    req: &mut Request,
) -> Result<AgentSession, String> {
    let key = req.repo.key();
    let home = AgentHome::open(&paths.airlock_dir().join("agent"), &resolved.agent, &key)
        .map_err(|e| e.to_string())?;
    let copied_in = home.copy_in().map_err(|e| e.to_string())?;
    if let Some(email) = &prepared.identity.email {
        let name = email.split('@').next().unwrap_or(email);
        home.write_gitconfig(name, email).map_err(|e| e.to_string())?;
    }
    let before = home.snapshot();

    let mut path: Vec<PathBuf> = resolved.path_dirs.clone();
    path.extend(std::env::split_paths(SANDBOX_PATH));
    let path = std::env::join_paths(path).map_err(|e| format!("agent PATH: {e}"))?;
    set_var(env, "PATH", path);
    for (k, v) in agent_env(&resolved.agent) {
        if !env.iter().any(|(name, _)| name == k) {
            set_var(env, k, v.into());
        }
    }

    req.argv = resolved.argv.iter().map(|p| p.clone().into_os_string()).chain(args).collect();
    let parent = home.path().parent().map(|p| p.to_path_buf()).ok_or_else(|| {
        format!("{}: an agent home needs a parent directory", home.path().display())
    })?;
    req.home = HomeMount::Bind { parent, name: key };
    req.ro_binds = resolved.binds.iter().map(|b| (b.src.clone(), b.dst.clone())).collect();
    req.symlinks = resolved.links.clone();
    req.agent = Some(resolved.agent.name().to_string());
    req.agent_version = resolved.version.clone();
    Ok(AgentSession { home, copied_in, before })
}

fn set_var(env: &mut Vec<(OsString, OsString)>, name: &str, value: OsString) {
    env.retain(|(k, _)| k != name);
    env.push((name.into(), value));
    env.sort();
}

/// The agent home across one session; [`AgentSession::wrap`] runs its end-of-session work
/// where the supervisor ends the session (after every process inside is gone).
#[derive(Debug)]
pub struct AgentSession {
    home: AgentHome,
    copied_in: CopyIn,
    before: Snapshot,
}

impl AgentSession {
    pub fn wrap(self, inner: Box<dyn ProxyBridge>) -> AgentBridge {
        AgentBridge { session: self, inner }
    }
}

/// Forwards to the real bridge; at the end copies refreshed credentials back to the shared
/// store and hashes the transcripts the session created or changed into `session_end`.
pub struct AgentBridge {
    session: AgentSession,
    inner: Box<dyn ProxyBridge>,
}

impl std::fmt::Debug for AgentBridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentBridge").field("session", &self.session).finish_non_exhaustive()
    }
}

impl ProxyBridge for AgentBridge {
    fn start(&mut self, listener: OwnedFd, info: &SessionInfo) -> Result<(), BridgeError> {
        self.inner.start(listener, info)
    }

    fn end(&mut self, end: &SessionEnd) {
        let s = &self.session;
        let back = s.home.copy_back(&s.copied_in);
        for rel in &back.copied {
            eprintln!(
                "airlock: {rel} was refreshed inside; shared it with this agent's other repos"
            );
        }
        for (rel, why) in &back.skipped {
            eprintln!(
                "airlock: warning: not sharing {rel} from {}: {why}",
                s.home.path().display()
            );
        }
        let transcripts = s.home.changed_transcripts(&s.before);
        self.inner.end(&SessionEnd { transcripts, ..end.clone() });
    }
}
