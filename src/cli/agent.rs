//! `airlock agent import-login claude|codex [--from FILE] [--force]`: copies the host's existing
//! login into the agent's shared credentials (`~/.airlock/agent/<agent>/shared/`) once, so every
//! repo's `airlock run` starts signed in; the host's `~/.claude` or `~/.codex` is never
//! mounted. The file work is `agent::home::import`'s.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};

use super::Context;
use crate::agent::Agent;
use crate::agent::home::import::{LoginSource, import_login};
use crate::paths::Paths;

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Copy the host's existing Claude Code or Codex login into Airlock's shared credentials
    /// (once; the host's agent directory is never mounted)
    ImportLogin(ImportLoginArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoginAgent {
    /// Claude Code: ~/.claude/.credentials.json (or $CLAUDE_CONFIG_DIR/.credentials.json)
    Claude,
    /// Codex: ~/.codex/auth.json (or $CODEX_HOME/auth.json)
    Codex,
}

#[derive(Debug, Args)]
pub struct ImportLoginArgs {
    /// Whose login to import
    #[arg(value_enum)]
    pub agent: LoginAgent,
    /// Read the login from FILE instead of the agent's usual place
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
    /// Replace a login Airlock already shares for this agent
    #[arg(long)]
    pub force: bool,
}

pub fn run(cmd: &AgentCommand, ctx: &Context<'_>) -> i32 {
    match cmd {
        AgentCommand::ImportLogin(args) => match import(args, ctx) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("airlock: {e}");
                1
            }
        },
    }
}

/// Where the agent keeps its login on the host: (base directory, path below it).
fn default_source(agent: LoginAgent, ctx: &Context<'_>, home: &Path) -> (PathBuf, PathBuf) {
    // The agents' own overrides of their config directory, as they read them.
    let (var, dir, file) = match agent {
        LoginAgent::Claude => ("CLAUDE_CONFIG_DIR", ".claude", ".credentials.json"),
        LoginAgent::Codex => ("CODEX_HOME", ".codex", "auth.json"),
    };
    match ctx.env.var(var).map(PathBuf::from).filter(|p| p.is_absolute()) {
        Some(base) => (base, PathBuf::from(file)),
        None => (home.to_path_buf(), Path::new(dir).join(file)),
    }
}

fn import(args: &ImportLoginArgs, ctx: &Context<'_>) -> Result<(), String> {
    let paths = Paths::from_env(ctx.env).map_err(|e| e.to_string())?;
    let agent = match args.agent {
        LoginAgent::Claude => Agent::Claude,
        LoginAgent::Codex => Agent::Codex,
    };
    let (base, rel) = match &args.from {
        Some(file) => {
            let file = if file.is_absolute() { file.clone() } else { ctx.cwd.join(file) };
            let (Some(dir), Some(name)) = (file.parent(), file.file_name()) else {
                return Err(format!("--from {}: name a file", file.display()));
            };
            (dir.to_path_buf(), PathBuf::from(name))
        }
        None => default_source(args.agent, ctx, paths.home()),
    };
    let source = LoginSource::open(&base, &rel).map_err(|e| e.to_string())?;
    let agent_root = paths.airlock_dir().join("agent");
    let written =
        import_login(&agent_root, &agent, &source, args.force).map_err(|e| e.to_string())?;
    println!(
        "copied the {} login from {} to {} (0600); `airlock run {}` in any repo starts signed in",
        agent.name(),
        source.path().display(),
        written.display(),
        agent.name()
    );
    Ok(())
}
