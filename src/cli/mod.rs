//! The `airlock` command line: argument parsing (clap derive) and dispatch to one module per
//! command. Each command returns its exit code; only `main` touches the process.

use std::path::PathBuf;

pub mod exec;

use clap::{Parser, Subcommand};

use crate::env::{Env, ProcessEnv};

/// Everything a command needs from its surroundings, injectable for tests.
pub struct Context<'a> {
    pub env: &'a dyn Env,
    pub cwd: PathBuf,
}

impl std::fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("cwd", &self.cwd).finish_non_exhaustive()
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "airlock",
    version,
    about = "Run coding agents in a sandbox whose only way out is an audited egress proxy",
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in the sandbox: no way out but Airlock's proxy.
    Exec(exec::ExecArgs),
}

/// Entry point of the `airlock` binary; returns the process exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // clap prints help/version to stdout (exit 0) and usage errors to stderr (exit 2).
            let _ = err.print();
            return err.exit_code();
        }
    };
    let cwd = match std::env::current_dir() {
        Ok(cwd) => cwd,
        Err(err) => {
            eprintln!("airlock: cannot read the working directory: {err}");
            return 125;
        }
    };
    let ctx = Context { env: &ProcessEnv, cwd };
    run(cli.command, &ctx)
}

/// Dispatches one parsed command.
pub fn run(command: Command, ctx: &Context<'_>) -> i32 {
    match command {
        Command::Exec(args) => exec::run(args, ctx),
    }
}
