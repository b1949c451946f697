//! The client side of the control socket, used by every CLI command and by the host-side
//! supervisor: socket path resolution (DESIGN §3, [`socket`]), the one decision between one-shot
//! activation and "service down" (DESIGN §6, [`activation`]), the endpoint that connects and
//! applies the version handshake with its skew rules ([`Endpoint::resolve`] +
//! [`Endpoint::connect`]), a connection's requests ([`Client`]), and the session API
//! ([`SessionHandle`]) that registers a sandbox's proxy listener and re-registers it when the
//! daemon restarts.

mod activation;
mod connection;
mod endpoint;
mod session;
mod socket;

use std::io;
use std::path::PathBuf;
use std::time::Duration;

pub use activation::{
    Activation, decide_activation, find_daemon, service_fix, service_unit_candidates,
};
pub use connection::Client;
pub use endpoint::Endpoint;
pub use session::{InboundReporter, SessionHandle, SessionOutcome, SessionStop};
pub use socket::{SocketPath, SocketSource, check_dir};

use crate::protocol::{ErrorCode, FrameError, VersionRange};

/// The launchd label of the per-user and fleet LaunchAgents.
pub const LAUNCHD_LABEL: &str = "dev.airlock.airlockd";
/// How long a command keeps retrying before it gives up on the daemon.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "the socket directory {dir} is unsafe: {problem}; it must be a real directory (not a \
         symlink) owned by you with mode 0700 — fix it with `chmod 0700 {dir}` or remove it"
    )]
    UnsafeDir { dir: PathBuf, problem: String },
    #[error("cannot create the socket directory {dir}: {source}")]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "airlockd is not running: nothing listens on {path}, and {unit} says a service manager \
         owns it. Start it with {fix}"
    )]
    ServiceDown { path: PathBuf, unit: PathBuf, fix: String },
    #[error("cannot start airlockd: {0}")]
    Activate(String),
    #[error("airlockd did not answer on {path} within {secs} s ({last}); see {log} for its errors")]
    Timeout { path: PathBuf, secs: u64, last: String, log: PathBuf },
    #[error("airlockd v{version} is busy with {sessions} sessions; retry after they end")]
    Busy { version: String, sessions: usize },
    #[error(
        "airlockd v{version} speaks control protocol {theirs}, newer than this airlock ({ours}); \
         upgrade airlock (a newer daemon is never asked to quit)"
    )]
    DaemonNewer { version: String, theirs: VersionRange, ours: VersionRange },
    #[error(
        "airlockd v{version} speaks control protocol {theirs} and this airlock speaks {ours}, \
         even after restarting it; install matching airlock and airlockd binaries"
    )]
    NoSharedVersion { version: String, theirs: VersionRange, ours: VersionRange },
    #[error("airlockd refused the request: {message}")]
    Refused { code: ErrorCode, message: String },
    #[error("unexpected reply from airlockd: {0}")]
    Unexpected(String),
    #[error("control connection to airlockd: {0}")]
    Frame(#[from] FrameError),
}

impl ClientError {
    /// Every client failure is Airlock's own: exit 125 (DESIGN §3).
    pub fn exit_code(&self) -> i32 {
        125
    }
}
