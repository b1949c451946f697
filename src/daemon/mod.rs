//! `airlockd`: the socket-activated user service (default), the standalone proxy
//! (`airlockd proxy`) and the review plane (`airlockd review`, `airlockd admin`).
//!
//! The service (no subcommand) adopts its control socket in the synchronous `main` before the
//! tokio runtime exists ([`crate::sys::activation`]), then serves the control protocol
//! ([`service`]) until it has been idle for `--idle-timeout` (DESIGN §6).

pub mod notify;
pub mod records;
pub mod service;

use std::time::Duration;

use clap::{Parser, Subcommand};

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
    Proxy(crate::proxy::standalone::ProxyArgs),
    /// Serve the review plane (or manage it: init-tls, migrate, maintain).
    Review(crate::review::cli::ReviewArgs),
    /// Manage review-plane users and tokens.
    #[command(subcommand)]
    Admin(crate::review::cli::AdminCommand),
}

/// Entry point of the `airlockd` binary; synchronous so socket adoption happens before any
/// thread exists. Returns the process exit code.
pub fn main() -> i32 {
    let cli = match DaemonCli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return err.exit_code();
        }
    };
    match cli.command {
        Some(command) => match command {
            DaemonCommand::Proxy(args) => {
                crate::proxy::standalone::main(args, &crate::env::ProcessEnv)
            }
            DaemonCommand::Review(args) => crate::review::cli::run_review(args),
            DaemonCommand::Admin(cmd) => {
                crate::review::cli::run_admin(crate::review::cli::AdminArgs { command: cmd })
            }
        },
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
