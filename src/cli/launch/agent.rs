//! The agent side of a launch (`airlock run`, DESIGN §7): finding the agent on the host, its
//! binaries bound read-only, its per-repo home at `/home/agent` with the shared credentials
//! copied in and back, and the transcripts it wrote hashed into the session record
//! (SECURITY §1, §4, §5).

use std::ffi::OsString;
use std::path::PathBuf;

use super::Prepared;
use crate::agent::home::{AgentHome, CopyIn, Snapshot};
use crate::agent::resolve::{self, ResolveError, Resolved};
use crate::cli::Context;
use crate::paths::Paths;
use crate::repo::Repo;
use crate::sandbox::bridge::{BridgeError, ProxyBridge, SessionEnd, SessionInfo};
use crate::sandbox::env::SANDBOX_PATH;
use crate::sandbox::mounts::HomeMount;
use crate::sandbox::supervisor::Request;

/// Finds the agent on the host (before anything is asked or started: a missing agent is 127).
pub fn resolve_agent(
    arg: &str,
    ctx: &Context<'_>,
    paths: &Paths,
    repo: &Repo,
) -> Result<Resolved, ResolveError> {
    let repo_sandbox = repo.sandbox_path();
    let mut guarded =
        vec![paths.airlock_dir(), crate::client::SocketPath::resolve(ctx.env).dir().to_path_buf()];
    guarded.extend(ctx.env.var_os("XDG_RUNTIME_DIR").map(PathBuf::from));
    resolve::resolve(&resolve::Input {
        arg,
        path_var: ctx.env.var_os("PATH"),
        cwd: &ctx.cwd,
        home: paths.home(),
        repo: &repo.path,
        repo_sandbox: &repo_sandbox,
        guarded,
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
    let session = prepare_home(&resolved.agent, paths, prepared, env, req)?;
    let mut path: Vec<PathBuf> = resolved.path_dirs.clone();
    path.extend(std::env::split_paths(SANDBOX_PATH));
    let path = std::env::join_paths(path).map_err(|e| format!("agent PATH: {e}"))?;
    set_var(env, "PATH", path);
    req.argv = resolved.argv.iter().map(|p| p.clone().into_os_string()).chain(args).collect();
    req.ro_binds = resolved.binds.iter().map(|b| (b.src.clone(), b.dst.clone())).collect();
    req.symlinks = resolved.links.clone();
    req.agent_version = resolved.version.clone();
    Ok(session)
}

/// The agent side of a container session (`--backend docker|podman`): the agent is the
/// image's command `name` (a host binary is not assumed to run in the image), so nothing of
/// the host's install is bound; its per-repo home is the same as a native session's.
pub fn prepare_in_image(
    name: &str,
    args: Vec<OsString>,
    paths: &Paths,
    prepared: &Prepared,
    env: &mut Vec<(OsString, OsString)>,
    req: &mut Request,
) -> Result<AgentSession, String> {
    if name.contains('/') {
        return Err(format!(
            "with a container backend the agent is a command of the image, not a host path \
             ({name}); give its name (claude, codex, …)"
        ));
    }
    let session = prepare_home(&crate::agent::Agent::from_arg(name), paths, prepared, env, req)?;
    req.argv = std::iter::once(OsString::from(name)).chain(args).collect();
    Ok(session)
}

/// The per-repo agent home (SECURITY §4), its credentials and `.gitconfig`, the agent's own
/// variables, and what the session record names; both backends.
fn prepare_home(
    agent: &crate::agent::Agent,
    paths: &Paths,
    prepared: &Prepared,
    env: &mut Vec<(OsString, OsString)>,
    req: &mut Request,
) -> Result<AgentSession, String> {
    let key = req.repo.key();
    let home = AgentHome::open(&paths.airlock_dir().join("agent"), agent, &key)
        .map_err(|e| e.to_string())?;
    claim_home(&home, &req.repo)?;
    let copied_in = home.copy_in().map_err(|e| e.to_string())?;
    if let Some(email) = &prepared.identity.email {
        let name = email.split('@').next().unwrap_or(email);
        home.write_gitconfig(name, email).map_err(|e| e.to_string())?;
    }
    let before = home.snapshot();
    for (k, v) in agent_env(agent) {
        if !env.iter().any(|(name, _)| name == k) {
            set_var(env, k, v.into());
        }
    }
    let parent = home.path().parent().map(|p| p.to_path_buf()).ok_or_else(|| {
        format!("{}: an agent home needs a parent directory", home.path().display())
    })?;
    req.home = HomeMount::Bind { parent, name: key };
    req.agent = Some(agent.name().to_string());
    Ok(AgentSession { home, copied_in, before })
}

/// Records which repo a home belongs to, beside it (`<repo key>.repo`, never mounted), and
/// refuses a different repo whose key collides (8 hex digits of a path hash, DESIGN §3, can be
/// matched on purpose by a directory an agent creates).
fn claim_home(home: &AgentHome, repo: &Repo) -> Result<(), String> {
    let Some(name) = home.path().file_name() else { return Ok(()) };
    let mut marker = home.path().to_path_buf().into_os_string();
    marker.push(".repo");
    let marker = PathBuf::from(marker);
    let ours = repo.path.to_string_lossy().into_owned();
    match crate::config::fsutil::read_config(&marker, false) {
        Ok(Some(bytes)) => {
            let owner = String::from_utf8_lossy(&bytes).trim_end().to_string();
            if owner == ours {
                Ok(())
            } else {
                Err(format!(
                    "the agent home {} belongs to the repo {owner}, and {ours} maps to the same \
                     key {}; move one of the repos (or remove {} if {owner} is gone)",
                    home.path().display(),
                    name.to_string_lossy(),
                    home.path().display()
                ))
            }
        }
        Ok(None) => crate::config::fsutil::write_private(&marker, format!("{ours}\n").as_bytes())
            .map_err(|e| format!("recording {}: {e}", marker.display())),
        Err(e) => Err(format!("reading {}: {e}", marker.display())),
    }
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
    fn start(
        &mut self,
        sockets: crate::sys::fdpass::Handover,
        info: &SessionInfo,
    ) -> Result<(), BridgeError> {
        self.inner.start(sockets, info)
    }

    fn start_container(
        &mut self,
        info: &SessionInfo,
        container: crate::protocol::ContainerSpec,
    ) -> Result<(), BridgeError> {
        self.inner.start_container(info, container)
    }

    fn stop_fd(&self) -> Option<std::os::fd::OwnedFd> {
        self.inner.stop_fd()
    }

    fn stopped(&self) -> Option<crate::sandbox::bridge::Stopped> {
        self.inner.stopped()
    }

    fn inbound(&self) -> Option<std::sync::Arc<dyn crate::sandbox::ports::InboundReport>> {
        self.inner.inbound()
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
        let scan = s.home.scan_transcripts(&s.before);
        let mut leftovers = end.leftovers.clone();
        if scan.truncated {
            leftovers.transcripts_truncated = true;
            leftovers.transcript_entries_walked = scan.entries;
            leftovers.transcripts_unlisted = scan.unlisted;
        }
        self.inner.end(&SessionEnd { transcripts: scan.hashes, leftovers, ..end.clone() });
    }
}
