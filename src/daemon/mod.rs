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
    /// Run the egress proxy in the foreground (no daemon): one listener, policy from an
    /// operator `--config` file, ALLOW/DENY lines on stdout. See docs/proxy.md.
    Proxy(crate::proxy::standalone::ProxyArgs),
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
        },
        None => {
            eprintln!("airlockd: not started by a service manager (no activation socket)");
            64
        }
    }
}
