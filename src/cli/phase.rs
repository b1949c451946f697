//! `airlock phase`: switch a running session between the phases its layers define
//! (`[phase.NAME.network]`, docs/configuration.md "Phases") — `set`, `clear` — and show them —
//! `show` (the live sessions' phase in force), `list` (what the layers define). Host side only:
//! it talks to `airlockd` over the control socket, which no sandbox can reach.
//!
//! Exit codes: 0 done; 1 the switch could not be made as asked (no live session, several, an
//! unknown phase, one with an empty allowlist); 125 airlockd could not be asked.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::Context;
use crate::client::{ClientError, Endpoint};
use crate::protocol::{ErrorCode, SessionStatus};
use crate::repo::Repo;

/// A switch that could not be made as asked.
pub const EXIT_REFUSED: i32 = 1;

#[derive(Debug, Subcommand)]
pub enum PhaseCommand {
    /// Switch a running session to phase NAME (or back to the plain [network] lists with
    /// --none), using the layers as they were trusted when the session started.
    Set(SetArgs),
    /// Switch a running session back to the plain [network] lists (`set --none`).
    Clear(Target),
    /// Show the phase in force in the repo's live sessions and the phases they may enter.
    Show(ShowArgs),
    /// List the phases the repo's layers define, with each phase's lists.
    List(ListArgs),
}

#[derive(Debug, Args)]
pub struct Target {
    /// The session to switch (`airlock status` lists them); default: the repo's only live one.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// The repo directory (default: the git top level of the working directory).
    #[arg(long, value_name = "DIR")]
    pub repo: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SetArgs {
    /// The phase to enter.
    #[arg(value_name = "NAME", required_unless_present = "none", conflicts_with = "none")]
    pub name: Option<String>,
    /// Leave any phase: back to the plain [network] lists.
    #[arg(long)]
    pub none: bool,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub target: Target,
    /// Print JSON: `{"sessions": [{"session", "repo_path", "phase", "phases"}]}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// The repo directory (default: the git top level of the working directory).
    #[arg(long, value_name = "DIR")]
    pub repo: Option<PathBuf>,
    /// Print JSON: `{"phases": [{"phase", "layers": [{"layer", "policy", "allow", "block"}]}]}`.
    #[arg(long)]
    pub json: bool,
}

enum Failure {
    Client(ClientError),
    Refused(String),
    Io(std::io::Error),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Self::Client(e)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

pub fn run(cmd: &PhaseCommand, ctx: &Context<'_>) -> i32 {
    let result = match cmd {
        PhaseCommand::Set(a) => set(ctx, &a.target, if a.none { None } else { a.name.as_deref() }),
        PhaseCommand::Clear(t) => set(ctx, t, None),
        PhaseCommand::Show(a) => show(ctx, &a.target, a.json),
        PhaseCommand::List(a) => list(ctx, a.repo.as_deref(), a.json),
    };
    match result {
        Ok(code) => code,
        Err(Failure::Client(e)) => {
            eprintln!("airlock: {e}");
            match e {
                ClientError::Refused { code: ErrorCode::Phase | ErrorCode::Session, .. } => {
                    EXIT_REFUSED
                }
                e => e.exit_code(),
            }
        }
        Err(Failure::Refused(msg)) => {
            eprintln!("airlock: {msg}");
            EXIT_REFUSED
        }
        Err(Failure::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(Failure::Io(e)) => {
            eprintln!("airlock: cannot write the output: {e}");
            125
        }
    }
}

fn repo_of(ctx: &Context<'_>, dir: Option<&std::path::Path>) -> Result<Repo, Failure> {
    Repo::resolve(dir, &ctx.cwd).map_err(|e| Failure::Refused(e.to_string()))
}

/// The live sessions `target` names: `--session ID` (any repo), else the repo's.
fn sessions_of(
    ctx: &Context<'_>,
    target: &Target,
) -> Result<(Vec<SessionStatus>, String), Failure> {
    let status = Endpoint::resolve(ctx.env).connect()?.status()?;
    if let Some(id) = &target.session {
        let found: Vec<SessionStatus> =
            status.sessions.into_iter().filter(|s| &s.session == id).collect();
        if found.is_empty() {
            return Err(Failure::Refused(format!(
                "no live session {id:?}; `airlock status` lists the live sessions"
            )));
        }
        return Ok((found, format!("session {id}")));
    }
    let repo = repo_of(ctx, target.repo.as_deref())?;
    let path = repo.path.display().to_string();
    let found = status.sessions.into_iter().filter(|s| s.repo_path == path).collect();
    Ok((found, path))
}

/// The one session a switch applies to: `--session ID`, else the repo's only live session.
fn the_session(ctx: &Context<'_>, target: &Target) -> Result<SessionStatus, Failure> {
    let (mut found, what) = sessions_of(ctx, target)?;
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(Failure::Refused(format!(
            "no live session in {what}; start one with `airlock run --phase NAME` (or `airlock \
             exec`), or pass `--session ID` for a session of another checkout"
        ))),
        _ => {
            let ids: Vec<String> = found
                .iter()
                .map(|s| format!("{} (started {}, {})", s.session, s.started_at, phase_text(s)))
                .collect();
            Err(Failure::Refused(format!(
                "{} live sessions in {what}: {}; pass `--session ID` to pick one",
                found.len(),
                ids.join(", ")
            )))
        }
    }
}

fn phase_text(s: &SessionStatus) -> String {
    match &s.phase {
        Some(p) => format!("phase {p}"),
        None => "no phase".to_owned(),
    }
}

fn set(ctx: &Context<'_>, target: &Target, phase: Option<&str>) -> Result<i32, Failure> {
    let session = the_session(ctx, target)?;
    let mut client = Endpoint::resolve(ctx.env).connect()?;
    let (now, previous, seq) = client.phase_set(&session.session, phase)?;
    let name = |p: &Option<String>| p.clone().unwrap_or_else(|| "(none)".to_owned());
    println!(
        "session {}: phase {} (was {}); audit line seq {seq}",
        session.session,
        name(&now),
        name(&previous)
    );
    Ok(0)
}

fn show(ctx: &Context<'_>, target: &Target, json: bool) -> Result<i32, Failure> {
    let (found, what) = sessions_of(ctx, target)?;
    let mut out = std::io::stdout().lock();
    if json {
        let rows: Vec<serde_json::Value> = found
            .iter()
            .map(|s| {
                serde_json::json!({
                    "session": s.session, "repo_path": s.repo_path,
                    "phase": s.phase, "phases": s.phases,
                })
            })
            .collect();
        serde_json::to_writer_pretty(&mut out, &serde_json::json!({ "sessions": rows }))
            .map_err(std::io::Error::other)?;
        writeln!(out)?;
        return Ok(0);
    }
    if found.is_empty() {
        writeln!(out, "no live session in {what}")?;
        return Ok(0);
    }
    for s in &found {
        let defined = if s.phases.is_empty() { "none".to_owned() } else { s.phases.join(", ") };
        writeln!(out, "session {}: {} (defined: {defined})", s.session, phase_text(s))?;
    }
    Ok(0)
}

fn list(ctx: &Context<'_>, dir: Option<&std::path::Path>, json: bool) -> Result<i32, Failure> {
    let repo = repo_of(ctx, dir)?;
    let paths =
        crate::paths::Paths::from_env(ctx.env).map_err(|e| Failure::Refused(e.to_string()))?;
    let identity =
        crate::config::load_identity(&paths).map_err(|e| Failure::Refused(e.to_string()))?;
    let loaded = crate::config::load(&paths, Some(&repo), identity.as_ref())
        .map_err(|e| Failure::Refused(e.to_string()))?;
    let applied = loaded.applied();
    let phases = crate::config::phase::defined_phases(&applied);
    let mut out = std::io::stdout().lock();
    if json {
        let rows: Vec<serde_json::Value> = phases
            .iter()
            .map(|(name, _)| {
                let layers: Vec<serde_json::Value> = applied
                    .iter()
                    .filter_map(|d| d.phases.get(name).map(|p| (d, p)))
                    .map(|(d, p)| {
                        serde_json::json!({"layer": d.kind, "policy": d.name,
                            "allow": p.allow, "block": p.block})
                    })
                    .collect();
                serde_json::json!({"phase": name, "layers": layers})
            })
            .collect();
        serde_json::to_writer_pretty(&mut out, &serde_json::json!({ "phases": rows }))
            .map_err(std::io::Error::other)?;
        writeln!(out)?;
        return Ok(0);
    }
    if phases.is_empty() {
        writeln!(out, "no layer in force defines a phase")?;
    }
    for (name, _) in &phases {
        writeln!(out, "{name}")?;
        for d in &applied {
            if let Some(p) = d.phases.get(name) {
                writeln!(
                    out,
                    "  {} ({}): allow [{}] block [{}]",
                    d.kind,
                    d.name,
                    p.allow.join(", "),
                    p.block.join(", ")
                )?;
            }
        }
    }
    if let Some(file) = loaded.repo.as_ref().filter(|f| f.parsed.is_none()) {
        writeln!(
            out,
            "note: {} is not trusted, so its phases do not apply (`airlock policy trust`)",
            file.name
        )?;
    }
    Ok(0)
}
