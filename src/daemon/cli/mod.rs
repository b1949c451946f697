//! The `airlockd` front: argument parsing for the service (no subcommand), `airlockd proxy`
//! ([`proxy`]), `airlockd bridge-guard` ([`bridge_guard`]) and the review plane (`airlockd review`, `airlockd admin`: [`review`]), and the
//! synchronous start-up of each. The engines they drive ([`super::service`],
//! [`crate::proxy::standalone`], [`crate::review`]) hold no argument parsing.

pub mod bridge_guard;
pub mod proxy;
pub mod review;

use std::time::Duration;

use clap::{Parser, Subcommand};

use super::service;
use crate::sys::activation;

/// `airlockd` without a socket from a service manager (sysexits(3) `EX_USAGE`; the unit's
/// `RestartPreventExitStatus=64` keeps systemd from looping on it).
pub const EXIT_NO_SOCKET: i32 = 64;

#[derive(Debug, Parser)]
#[command(
    name = "airlockd",
    version,
    about = "Airlock's service: control socket, proxy and review plane",
    long_about = "Airlock's service. Without a subcommand it is the socket-activated user \
                  service: a service manager (systemd airlock.socket, launchd, or the airlock \
                  CLI's one-shot activator) owns the control socket and starts airlockd on \
                  first connect; it never binds the socket itself and exits when idle."
)]
pub struct DaemonCli {
    /// Exit after this long with no connection, session or tunnel (e.g. `60s`, `2s`, `5m`).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s", env = "AIRLOCK_IDLE_TIMEOUT")]
    pub idle_timeout: Duration,

    /// How long open tunnels may finish after SIGTERM before they are closed.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub shutdown_grace: Duration,

    #[command(subcommand)]
    pub command: Option<DaemonCommand>,
}

#[derive(Debug, Subcommand)]
pub enum DaemonCommand {
    /// Run the egress proxy in the foreground (no daemon): one listener, policy from an
    /// operator `--config` file, ALLOW/DENY lines on stdout. See docs/proxy.md.
    // Boxed, like `Review`: its flags make it the largest variant.
    Proxy(Box<proxy::ProxyArgs>),
    /// Serve the review plane (or manage it: init-tls, migrate, maintain).
    // Boxed: the review server's flags make it several times the size of the other variants.
    Review(Box<review::ReviewArgs>),
    /// Drop what the engine host receives from a container network's bridge (the Docker
    /// backend's helper container runs this; needs CAP_NET_ADMIN on the host's network).
    BridgeGuard(bridge_guard::BridgeGuardArgs),
    /// Manage review-plane users and tokens.
    #[command(subcommand)]
    Admin(review::AdminCommand),
    /// Print a shell completion script for airlockd.
    Completions(crate::cli::completions::CompletionsArgs),
}

/// Runs what `cli` asks for; returns the process exit code.
pub fn run(cli: DaemonCli) -> i32 {
    match cli.command {
        Some(DaemonCommand::Proxy(args)) => proxy::main(*args, &crate::env::ProcessEnv),
        Some(DaemonCommand::Review(args)) => review::run_review(*args),
        Some(DaemonCommand::BridgeGuard(args)) => bridge_guard::main(&args),
        Some(DaemonCommand::Admin(cmd)) => review::run_admin(review::AdminArgs { command: cmd }),
        Some(DaemonCommand::Completions(args)) => crate::cli::completions::print_script(
            crate::cli::completions::Binary::Airlockd,
            args.shell,
        ),
        None => run_service(&cli),
    }
}

/// The user service: adopt, prepare, notify, serve, idle out.
fn run_service(cli: &DaemonCli) -> i32 {
    // Before any thread: adoption unsets LISTEN_* (std::env::remove_var's precondition).
    let adopted = match activation::adopt() {
        Ok(a) => a,
        Err(err) => {
            eprintln!("airlockd: {err}");
            return EXIT_NO_SOCKET;
        }
    };
    let nofile = match activation::raise_nofile() {
        Ok(n) => Some(n),
        Err(err) => {
            eprintln!("airlockd: warning: cannot raise RLIMIT_NOFILE: {err}");
            None
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("airlockd: cannot start the runtime: {err}");
            return 70;
        }
    };
    let options = service::Options {
        idle_timeout: cli.idle_timeout,
        shutdown_grace: cli.shutdown_grace,
        activation: adopted.source,
        nofile,
    };
    match runtime.block_on(service::serve(adopted.fd, options)) {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("airlockd: {err}");
            70
        }
    }
}
