//! The `airlock` command line: argument parsing (clap derive) and dispatch to one module per
//! command. Each command returns its exit code; only `main` touches the process.

pub mod agent;
pub mod completions;
pub mod exec;
pub mod identity;
pub mod launch;
pub mod phase;
pub mod policy;
pub mod policy_edit;
pub mod policy_init;
pub mod policy_learn;
pub mod policy_resolve;
pub mod policy_test;
pub mod publish;
pub mod quarantine;
pub mod run;
pub mod verify;
pub mod verify_local;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::env::{Env, ProcessEnv};

pub mod doctor;
pub mod gate;
pub mod logs;
mod logs_sessions;
pub mod man;
pub mod service;
pub mod status;

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

/// What `airlock --help` says Airlock is.
const ABOUT: &str = "Run coding agents in a sandbox whose only way out is an audited egress proxy";

#[derive(Debug, Parser)]
#[command(
    name = "airlock",
    version,
    about = ABOUT,
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show whether airlockd is up, its version, pid, uptime and sessions.
    Status(status::StatusArgs),
    /// Install, remove or inspect the airlockd user service (systemd or launchd).
    #[command(subcommand)]
    Service(service::ServiceCommand),
    /// Check the service manager, socket, identity, configuration and trust; print each fix.
    Doctor(doctor::DoctorArgs),
    /// Show the repo's audit log: every connection attempt, allowed or denied
    Logs(logs::LogsArgs),
    /// Test-only: act as an audit writer that dies mid-tunnel (hidden)
    #[cfg(feature = "test-hooks")]
    #[command(name = "__audit-hold", hide = true)]
    AuditHold(logs::AuditHoldArgs),
    /// Internal: `airlock doctor`'s transparent-capture probe, in throwaway namespaces (hidden)
    #[command(name = "__probe-capture", hide = true)]
    ProbeCapture,
    /// Check targets against the network policy, show it, trust a repo's .airlock.toml
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Log in to a review server (`--server URL`), or save a local identity (`--email`)
    Login(identity::LoginArgs),
    /// Show the identity in use and whether the review-server token still works
    Whoami(identity::WhoamiArgs),
    /// Remove the identity file and the review-server token
    Logout,
    /// Print a shell completion script
    Completions(completions::CompletionsArgs),
    /// Print a man page, or write every page of airlock and airlockd (`--out DIR`)
    Man(man::ManArgs),
    /// Run a command in the sandbox: no way out but Airlock's proxy.
    Exec(exec::ExecArgs),
    /// Run a coding agent (claude, codex, or a path) in the sandbox, with its per-repo home.
    Run(run::RunArgs),
    /// Manage what agents share across repos (import the host's existing login)
    #[command(subcommand)]
    Agent(agent::AgentCommand),
    /// List, show and restore what the end of a session took out of the repo
    #[command(subcommand)]
    Quarantine(quarantine::QuarantineCommand),
    /// Upload the repo's audit lines, session records and agent transcripts to the review server
    Publish(publish::PublishArgs),
    /// Decide the attempts held for a person's approval (`[gate]`): list, show, approve, deny
    Gate(gate::GateArgs),
    /// Switch a running session between the phases its layers define ([phase.NAME.network])
    #[command(subcommand)]
    Phase(phase::PhaseCommand),
    /// Check the review server's record without trusting it: an export, a checkpoint from
    /// someone else, or the local audit files (docs/evidence.md)
    Verify(verify::VerifyArgs),
}

/// `airlock exec`'s own parser: the same `exec` subcommand under the same root, without the
/// other ~25 subcommands clap would otherwise build on every `exec` (~0.2-0.4 ms of CPU,
/// issue 22). Help, version and usage errors render the same (a unit test compares them).
#[derive(Debug, Parser)]
#[command(
    name = "airlock",
    version,
    about = ABOUT,
    propagate_version = true
)]
struct ExecCli {
    #[command(subcommand)]
    command: ExecOnly,
}

#[derive(Debug, Subcommand)]
enum ExecOnly {
    /// Run a command in the sandbox: no way out but Airlock's proxy.
    Exec(exec::ExecArgs),
}

/// Parses the command line, through [`ExecCli`] when it starts with `exec`.
fn parse() -> Result<Cli, clap::Error> {
    if std::env::args_os().nth(1).is_some_and(|a| a == "exec") {
        return ExecCli::try_parse().map(|c| match c.command {
            ExecOnly::Exec(args) => Cli { command: Command::Exec(args) },
        });
    }
    Cli::try_parse()
}

/// Entry point of the `airlock` binary; returns the process exit code.
pub fn main() -> i32 {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(err) => {
            // clap prints help/version to stdout (exit 0) and usage errors to stderr (exit 2).
            let _ = err.print();
            // `exec`/`run` exit with the child's status, so their own failures (a usage error
            // included) are 125, never a status the child could have produced (DESIGN §3).
            let sub = std::env::args().nth(1);
            if err.use_stderr() && matches!(sub.as_deref(), Some("exec" | "run")) {
                return 125;
            }
            return err.exit_code();
        }
    };
    if let Err(err) = crate::logging::init(&ProcessEnv, crate::logging::Program::Cli) {
        eprintln!("airlock: {err}");
        return if matches!(cli.command, Command::Exec(_) | Command::Run(_)) { 125 } else { 2 };
    }
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
        Command::Status(args) => status::run(&args, ctx),
        Command::Service(cmd) => service::run(&cmd, ctx),
        Command::Doctor(args) => doctor::run(&args, ctx),
        Command::Logs(args) => logs::run(&args, ctx),
        #[cfg(feature = "test-hooks")]
        Command::AuditHold(args) => logs::audit_hold(&args),
        Command::ProbeCapture => crate::sandbox::probe::capture_probe_child(),
        Command::Policy(cmd) => policy::run(&cmd, ctx),
        Command::Login(args) => identity::login(&args, ctx),
        Command::Whoami(args) => identity::whoami(&args, ctx),
        Command::Logout => identity::logout(ctx),
        Command::Completions(args) => completions::run(&args),
        Command::Man(args) => man::run(&args),
        Command::Exec(args) => exec::run(args, ctx),
        Command::Run(args) => run::run(args, ctx),
        Command::Agent(cmd) => agent::run(&cmd, ctx),
        Command::Quarantine(cmd) => quarantine::run(&cmd, ctx),
        Command::Publish(args) => publish::run(&args, ctx),
        Command::Verify(args) => verify::run(&args, ctx),
        Command::Gate(cmd) => gate::run(&cmd, ctx),
        Command::Phase(cmd) => phase::run(&cmd, ctx),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn exec_of(mut root: clap::Command) -> clap::Command {
        root.build();
        root.find_subcommand("exec").expect("an exec subcommand").clone()
    }

    #[test]
    fn exec_parses_and_renders_the_same_through_its_own_parser() {
        let (mut full, mut own) = (exec_of(Cli::command()), exec_of(ExecCli::command()));
        assert_eq!(full.render_long_help().to_string(), own.render_long_help().to_string());
        assert_eq!(full.render_help().to_string(), own.render_help().to_string());
        assert_eq!(full.render_usage().to_string(), own.render_usage().to_string());
        for argv in [
            &["airlock", "exec"][..],
            &["airlock", "exec", "--repo"],
            &["airlock", "exec", "--backend", "nope", "--", "true"],
            &["airlock", "exec", "--port", "--", "true"],
            &["airlock", "exec", "--version"],
            &["airlock", "exec", "--help"],
            &["airlock", "exec", "-h"],
        ] {
            let a = Cli::try_parse_from(argv).expect_err("an error or a help/version");
            let b = ExecCli::try_parse_from(argv).expect_err("an error or a help/version");
            assert_eq!(a.kind(), b.kind(), "{argv:?}");
            assert_eq!(a.render().to_string(), b.render().to_string(), "{argv:?}");
        }
        let argv = ["airlock", "exec", "--repo", "/r", "--port", "8080:80", "--", "echo", "-n"];
        let a = Cli::try_parse_from(argv).unwrap();
        let b = ExecCli::try_parse_from(argv).unwrap();
        let ExecOnly::Exec(b) = b.command;
        assert_eq!(format!("{:?}", a.command), format!("{:?}", Command::Exec(b)));
    }
}
