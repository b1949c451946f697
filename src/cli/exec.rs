//! `airlock exec [--repo DIR] -- CMD [ARGS...]`: run any command in the sandbox (DESIGN §7).
//! The session itself is [`super::launch`]'s.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use super::Context;
use super::launch::{self, Launch};

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The repo directory (default: the git top level of the working directory).
    #[arg(long, value_name = "DIR")]
    pub repo: Option<PathBuf>,
    /// Make a server listening inside on 127.0.0.1:PORT reachable from the host on
    /// HOST_IP:HOSTPORT (default HOST_IP: this session's own 127.0.0.N, printed); repeatable.
    /// Command line only, never from configuration.
    #[arg(long = "port", value_name = "[HOST_IP:]HOSTPORT:PORT")]
    pub ports: Vec<String>,
    /// The command and its arguments, resolved inside the sandbox with its PATH.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

/// Runs `airlock exec`.
pub fn run(args: ExecArgs, ctx: &Context<'_>) -> i32 {
    launch::launch(args.repo.as_deref(), &args.ports, Launch::Command(args.command), ctx)
}
