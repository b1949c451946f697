//! A resolved control endpoint: connecting, saying hello, and the version-skew rules (a shared
//! version is used as is; an idle older daemon is asked to quit; a newer one never is).

use std::ffi::OsString;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::activation::service_fix;
use super::socket::check_dir;
use super::{
    Activation, CONNECT_TIMEOUT, Client, ClientError, REQUEST_TIMEOUT, SocketPath,
    decide_activation,
};
use crate::env::Env;
use crate::paths::Paths;
use crate::protocol::{
    self, Capabilities, ErrorCode, FrameBuf, FrameError, Request, Response, StatusReply,
    VersionRange,
};

/// A resolved control endpoint: where to connect and what to do when nobody answers.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub socket: SocketPath,
    pub activation: Activation,
    /// `~/.airlock/airlockd.log` for a daemon the activator starts.
    pub daemon_log: Option<PathBuf>,
    /// This client's protocol range.
    pub protocol: VersionRange,
    /// The environment a one-shot daemon inherits.
    pub(super) daemon_env: Vec<(OsString, OsString)>,
}

/// What a failed connection attempt means.
enum Attempt {
    /// Nothing to talk to (`ENOENT`, `ECONNREFUSED`): activate or report "service down".
    Dead(String),
    /// Reset, EOF before hello, a stopping daemon: the next instance will answer.
    Retry(String),
}

impl Endpoint {
    /// Resolves the socket path and the activation decision — the one function every command
    /// uses (with [`Endpoint::connect`]).
    pub fn resolve(env: &dyn Env) -> Self {
        let socket = SocketPath::resolve(env);
        let activation = decide_activation(env, &socket);
        let daemon_log = Paths::from_env(env).ok().map(|p| p.daemon_log());
        let protocol =
            VersionRange::from_test_override(env.var(protocol::TEST_CLIENT_PROTOCOL_VAR));
        // A one-shot daemon has no service manager: a NOTIFY_SOCKET inherited from whatever
        // started this CLI would send READY=1 to the wrong manager.
        let mut daemon_env: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(k, _)| k != "NOTIFY_SOCKET" && k != crate::sys::activation::ACTIVATOR_VAR)
            .collect();
        daemon_env.push((crate::sys::activation::ACTIVATOR_VAR.into(), "airlock".into()));
        Self { socket, activation, daemon_log, protocol, daemon_env }
    }

    /// Connects and says hello, activating the daemon where DESIGN §6 allows, retrying across
    /// idle exits and restarts, and applying the version-skew rules.
    pub fn connect(&self) -> Result<Client, ClientError> {
        let start = Instant::now();
        let mut asked_to_quit = false;
        let mut backoff = Duration::from_millis(2);
        let mut last = String::new();
        if self.socket.path.parent().is_some_and(Path::exists) {
            check_dir(self.socket.dir())?;
        }
        loop {
            match self.try_hello() {
                Ok(Ok(client)) => {
                    if client.version.is_some() {
                        return Ok(client);
                    }
                    let theirs = client.daemon_protocol;
                    if theirs.min > self.protocol.max {
                        return Err(ClientError::DaemonNewer {
                            version: client.daemon_version,
                            theirs,
                            ours: self.protocol,
                        });
                    }
                    if asked_to_quit {
                        return Err(ClientError::NoSharedVersion {
                            version: client.daemon_version,
                            theirs,
                            ours: self.protocol,
                        });
                    }
                    let version = client.daemon_version.clone();
                    let sessions = client.daemon_sessions;
                    if sessions > 0 {
                        return Err(ClientError::Busy { version, sessions });
                    }
                    match client.quit_if_idle()? {
                        (true, _) => asked_to_quit = true,
                        // No session, but another connection or a tunnel is still open: most
                        // often a client that just said hello and is hanging up (the daemon has
                        // not seen the close yet). Ask again shortly, up to the timeout below.
                        (false, 0) => {
                            last = format!(
                                "airlockd v{version} has no session but another client is                                  connected, so it would not quit for the upgrade"
                            );
                        }
                        (false, sessions) => return Err(ClientError::Busy { version, sessions }),
                    }
                    if asked_to_quit {
                        continue;
                    }
                }
                Ok(Err(Attempt::Dead(why))) => {
                    last = why;
                    match &self.activation {
                        Activation::OneShot => self.activate()?,
                        Activation::ServiceManager { unit } => {
                            return Err(ClientError::ServiceDown {
                                path: self.socket.path.clone(),
                                unit: unit.clone(),
                                fix: service_fix(),
                            });
                        }
                    }
                }
                Ok(Err(Attempt::Retry(why))) => last = why,
                Err(e) => return Err(e),
            }
            if start.elapsed() > CONNECT_TIMEOUT {
                return Err(ClientError::Timeout {
                    path: self.socket.path.clone(),
                    secs: CONNECT_TIMEOUT.as_secs(),
                    last,
                    log: self.daemon_log.clone().unwrap_or_else(|| "the daemon's stderr".into()),
                });
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(200));
        }
    }

    /// One connection attempt: connect + hello.
    fn try_hello(&self) -> Result<Result<Client, Attempt>, ClientError> {
        let stream = match UnixStream::connect(&self.socket.path) {
            Ok(s) => s,
            Err(e) => {
                return Ok(Err(match e.raw_os_error() {
                    Some(libc::ENOENT | libc::ECONNREFUSED) => Attempt::Dead(e.to_string()),
                    Some(libc::EAGAIN | libc::ECONNRESET | libc::EINTR) => {
                        Attempt::Retry(e.to_string())
                    }
                    _ => return Err(ClientError::Frame(FrameError::Io(e))),
                }));
            }
        };
        let mut client = Client {
            stream,
            frames: FrameBuf::new(),
            version: None,
            daemon_protocol: VersionRange::CURRENT,
            daemon_version: String::new(),
            daemon_sessions: 0,
            daemon_pid: 0,
            boot: String::new(),
            capabilities: Capabilities::default(),
        };
        let _ = client.stream.set_read_timeout(Some(REQUEST_TIMEOUT));
        let offered = Capabilities::current();
        let hello = Request::Hello {
            protocol: self.protocol,
            client_version: env!("CARGO_PKG_VERSION").into(),
            capabilities: offered.clone(),
        };
        match client.call(&hello, &[]) {
            Ok(Response::Hello {
                version,
                protocol,
                daemon_version,
                pid,
                boot,
                sessions,
                capabilities,
            }) => {
                // The daemon replies with the agreed set; intersecting again means a daemon can
                // never switch on something this client did not offer.
                client.capabilities = Capabilities::agreed(version, &offered, &capabilities);
                client.version = version;
                client.daemon_protocol = protocol;
                client.daemon_version = daemon_version;
                client.daemon_sessions = sessions;
                client.daemon_pid = pid;
                client.boot = boot;
                Ok(Ok(client))
            }
            Ok(Response::Error { code: ErrorCode::Stopping, message }) => {
                Ok(Err(Attempt::Retry(message)))
            }
            Ok(Response::Error { code, message }) => Err(ClientError::Refused { code, message }),
            Ok(other) => Err(ClientError::Unexpected(format!("{other:?}"))),
            Err(FrameError::Closed) => {
                Ok(Err(Attempt::Retry("connection closed before hello".into())))
            }
            Err(FrameError::Io(e)) if is_retryable(&e) => Ok(Err(Attempt::Retry(e.to_string()))),
            Err(e) => Err(e.into()),
        }
    }

    /// `status` on a fresh connection.
    pub fn status(&self) -> Result<StatusReply, ClientError> {
        self.connect()?.status()
    }

    /// `status --no-start`: the daemon's status if it is running, `None` if it is not — and
    /// never a daemon started to answer. A socket a service manager holds would start the
    /// service on `connect(2)`, so the manager is asked first; the one-shot activator is never
    /// called; an older daemon is never asked to quit.
    pub fn status_if_running(&self) -> Result<Option<StatusReply>, ClientError> {
        if let Activation::ServiceManager { .. } = &self.activation
            && !super::activation::service_is_active()
        {
            return Ok(None);
        }
        if self.socket.path.parent().is_some_and(Path::exists) {
            check_dir(self.socket.dir())?;
        }
        let start = Instant::now();
        loop {
            let last = match self.try_hello()? {
                Ok(mut client) if client.version.is_some() => return client.status().map(Some),
                Ok(client) if client.daemon_protocol.min > self.protocol.max => {
                    return Err(ClientError::DaemonNewer {
                        version: client.daemon_version,
                        theirs: client.daemon_protocol,
                        ours: self.protocol,
                    });
                }
                Ok(client) => {
                    return Err(ClientError::NoSharedVersion {
                        version: client.daemon_version,
                        theirs: client.daemon_protocol,
                        ours: self.protocol,
                    });
                }
                Err(Attempt::Dead(_)) => return Ok(None),
                // A daemon that is stopping (or handing over): ask again briefly.
                Err(Attempt::Retry(why)) => why,
            };
            if start.elapsed() > Duration::from_secs(2) {
                return Err(ClientError::Timeout {
                    path: self.socket.path.clone(),
                    secs: 2,
                    last,
                    log: self.daemon_log.clone().unwrap_or_else(|| "the daemon's stderr".into()),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn is_retryable(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ECONNRESET | libc::EPIPE | libc::ECONNREFUSED))
        || e.kind() == io::ErrorKind::UnexpectedEof
}
