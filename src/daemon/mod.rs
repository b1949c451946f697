//! `airlockd`: the socket-activated user service (default), the standalone proxy
//! (`airlockd proxy`) and the review plane (`airlockd review`, `airlockd admin`).
//!
//! [`main`] is the one entry point; [`cli`] parses the arguments and starts what they name.
//! The service (no subcommand) adopts its control socket in the synchronous front before the
//! tokio runtime exists ([`crate::sys::activation`]), then serves the control protocol
//! ([`service`]) until it has been idle for `--idle-timeout` (DESIGN §6).

pub mod cli;
pub mod notify;
pub mod records;
pub mod service;

use clap::Parser;

pub use cli::{DaemonCli, DaemonCommand, EXIT_NO_SOCKET};

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
    cli::run(cli)
}
