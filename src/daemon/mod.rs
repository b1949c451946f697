//! `airlockd`: the socket-activated user service (default), the standalone proxy
//! (`airlockd proxy`) and the review plane (`airlockd review`, `airlockd admin`).

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "airlockd",
    version,
    about = "Airlock's service: control socket, proxy and review plane"
)]
pub struct DaemonCli {
    #[command(subcommand)]
    pub command: Option<DaemonCommand>,
}

#[derive(Debug, Subcommand)]
pub enum DaemonCommand {
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
            DaemonCommand::Review(args) => crate::review::cli::run_review(args),
            DaemonCommand::Admin(cmd) => {
                crate::review::cli::run_admin(crate::review::cli::AdminArgs { command: cmd })
            }
        },
        None => {
            eprintln!("airlockd: not started by a service manager (no activation socket)");
            64
        }
    }
}
