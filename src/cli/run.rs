//! `airlock run [--repo DIR] [claude | codex | PATH] [-- ARGS...]`: the `exec` sandbox plus an
//! agent (DESIGN §7). The session, the agent's home and binds are [`super::launch`]'s.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use super::Context;
use super::launch::{self, Launch};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The repo directory (default: the git top level of the working directory).
    #[arg(long, value_name = "DIR")]
    pub repo: Option<PathBuf>,
    /// Make a server listening inside on 127.0.0.1:PORT reachable from the host on
    /// HOST_IP:HOSTPORT (default HOST_IP: this session's own 127.0.0.N, printed); repeatable.
    /// Command line only, never from configuration.
    #[arg(long = "port", value_name = "[HOST_IP:]HOSTPORT:PORT")]
    pub ports: Vec<String>,
    /// `claude` (default), `codex`, or the path of an agent program.
    #[arg(value_name = "AGENT", default_value = "claude")]
    pub agent: String,
    /// Arguments for the agent (after `--`).
    #[arg(last = true, allow_hyphen_values = true, value_name = "ARGS")]
    pub args: Vec<OsString>,
}

/// Runs `airlock run`.
pub fn run(args: RunArgs, ctx: &Context<'_>) -> i32 {
    launch::launch(
        args.repo.as_deref(),
        &args.ports,
        Launch::Agent { agent: args.agent, args: args.args },
        ctx,
    )
}
