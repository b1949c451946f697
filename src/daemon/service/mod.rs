//! The control service: accepts connections on the adopted socket, checks each peer's uid and
//! that it shares the daemon's user and network namespace, speaks [`crate::protocol`], keeps the
//! session registry and session records, and exits when idle or on SIGTERM (DESIGN §6).
//!
//! Idle exit is race-free because the daemon never owns the socket: it stops calling `accept`,
//! sends `STOPPING=1`, drops its copy of the listener (never `shutdown(2)`, never unlink), finishes
//! what it accepted and exits 0. Connections that arrive meanwhile wait in the socket's backlog,
//! and the service manager, still holding the socket, starts the next instance for them.
//!
//! Files: [`state`] (the shared daemon state, idle accounting, the session table, the managed
//! layer cache), [`accept`] (the accept loop and the drain), [`connection`] (one control
//! connection and request dispatch), [`session`] (starting and ending sessions), [`inbound`] (the
//! `inbound` audit line of a `--port` connection), [`layers`] (parsed layers and built policies
//! by content digest). File I/O,
//! config parsing and `getifaddrs` never run on the async workers: they go to
//! `spawn_blocking` ([`state::blocking`]).

mod accept;
mod connection;
mod inbound;
mod layers;
pub(crate) mod phase;
mod session;
mod state;

use std::path::PathBuf;
use std::time::Duration;

pub use accept::serve;
pub use state::{Daemon, Session};

use crate::sys::activation::Source;

/// How the service was started and how long it may idle.
#[derive(Debug, Clone)]
pub struct Options {
    pub idle_timeout: Duration,
    pub shutdown_grace: Duration,
    pub activation: Source,
    pub nofile: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("cannot use the adopted control socket: {0}")]
    Listener(#[source] std::io::Error),
    #[error("cannot install the SIGTERM handler: {0}")]
    Signal(#[source] std::io::Error),
}

/// Test hook (feature `test-hooks`): milliseconds to wait after `STOPPING=1` before dropping
/// the listener.
pub const TEST_DRAIN_DELAY_VAR: &str = "AIRLOCK_TEST_DRAIN_DELAY_MS";

/// Where `status` says the binary is (for `doctor`).
pub fn binary_path() -> Option<PathBuf> {
    std::env::current_exe().ok()
}
