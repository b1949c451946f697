//! The client side of the control socket, used by every CLI command and by the host-side
//! supervisor: socket path resolution (DESIGN §3), the one decision between one-shot activation
//! and "service down" (DESIGN §6, [`Endpoint::resolve`] + [`Endpoint::connect`]), the version
//! handshake with its skew rules, and the session API ([`SessionHandle`]) that registers a
//! sandbox's proxy listener and re-registers it when the daemon restarts.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::env::Env;
use crate::paths::Paths;
use crate::protocol::{
    self, Capabilities, ErrorCode, FrameBuf, FrameError, Request, Response, SessionEnd,
    SessionSpec, StatusReply, VersionRange,
};
use crate::sys::{activation::SOCKET_NAME, fdpass, spawn};

/// The launchd label of the per-user and fleet LaunchAgents.
pub const LAUNCHD_LABEL: &str = "dev.airlock.airlockd";
/// How long a command keeps retrying before it gives up on the daemon.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the socket path came from (DESIGN §3, in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketSource {
    /// `$AIRLOCK_SOCKET`
    Env,
    /// `$XDG_RUNTIME_DIR/airlock/airlock.sock`
    XdgRuntime,
    /// `/tmp/airlock-$UID/airlock.sock`
    TmpFallback,
}

impl SocketSource {
    pub fn describe(self) -> &'static str {
        match self {
            Self::Env => "$AIRLOCK_SOCKET",
            Self::XdgRuntime => "$XDG_RUNTIME_DIR/airlock/airlock.sock",
            Self::TmpFallback => "/tmp/airlock-$UID/airlock.sock (no XDG_RUNTIME_DIR)",
        }
    }
}

/// The control socket path and its origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketPath {
    pub path: PathBuf,
    pub source: SocketSource,
}

impl SocketPath {
    /// Resolves the path per DESIGN §3 (no filesystem access).
    pub fn resolve(env: &dyn Env) -> Self {
        if let Some(p) = env.var_os("AIRLOCK_SOCKET").filter(|p| !p.is_empty()) {
            return Self { path: PathBuf::from(p), source: SocketSource::Env };
        }
        if let Some(dir) = env.var("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|p| p.is_absolute())
        {
            return Self {
                path: dir.join("airlock").join("airlock.sock"),
                source: SocketSource::XdgRuntime,
            };
        }
        let uid = nix::unistd::getuid().as_raw();
        Self {
            path: PathBuf::from(format!("/tmp/airlock-{uid}/airlock.sock")),
            source: SocketSource::TmpFallback,
        }
    }

    /// The directory holding the socket (and the activator's lock).
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("/"))
    }
}

/// How a dead socket is handled, decided once per endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Activation {
    /// No service manager owns this path: the CLI starts `airlockd` itself.
    OneShot,
    /// A unit or LaunchAgent owns it (found at the path given): a dead socket is "service down".
    ServiceManager { unit: PathBuf },
}

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

/// Checks the socket directory with `lstat`: a real directory, owned by us, mode 0700.
pub fn check_dir(dir: &Path) -> Result<(), ClientError> {
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| ClientError::UnsafeDir { dir: dir.into(), problem: e.to_string() })?;
    let problem = if meta.file_type().is_symlink() {
        Some("it is a symlink".to_owned())
    } else if !meta.is_dir() {
        Some("it is not a directory".to_owned())
    } else if meta.uid() != nix::unistd::geteuid().as_raw() {
        Some(format!("it is owned by uid {}, not you", meta.uid()))
    } else if meta.mode() & 0o077 != 0 {
        Some(format!("its mode is {:04o}", meta.mode() & 0o7777))
    } else {
        None
    };
    match problem {
        Some(problem) => Err(ClientError::UnsafeDir { dir: dir.into(), problem }),
        None => Ok(()),
    }
}

/// Creates the socket directory 0700 if missing, then checks it.
fn ensure_dir(dir: &Path) -> Result<(), ClientError> {
    match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => check_dir(dir),
        Err(source) => Err(ClientError::CreateDir { dir: dir.into(), source }),
    }
}

/// Where a unit or LaunchAgent for the control socket would be installed, most specific first.
pub fn service_unit_candidates(env: &dyn Env) -> Vec<PathBuf> {
    let home = env.var("HOME").map(PathBuf::from);
    if cfg!(target_os = "macos") {
        let mut v: Vec<PathBuf> = home
            .iter()
            .map(|h| h.join("Library/LaunchAgents").join(format!("{LAUNCHD_LABEL}.plist")))
            .collect();
        v.push(PathBuf::from(format!("/Library/LaunchAgents/{LAUNCHD_LABEL}.plist")));
        v
    } else {
        let config = env
            .var("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| home.map(|h| h.join(".config")));
        let mut v: Vec<PathBuf> =
            config.iter().map(|c| c.join("systemd/user/airlock.socket")).collect();
        for d in ["/etc/systemd/user", "/usr/local/lib/systemd/user", "/usr/lib/systemd/user"] {
            v.push(Path::new(d).join("airlock.socket"));
        }
        v
    }
}

/// The fix printed when a managed socket is dead: each command in its own backticks, so the
/// message reads `Start it with `cmd` (check `cmd`)`, never nested quotes.
pub fn service_fix() -> String {
    if cfg!(target_os = "macos") {
        format!(
            "`launchctl bootstrap gui/$(id -u) ~/Library/LaunchAgents/{LAUNCHD_LABEL}.plist` \
             (or `airlock service install`)"
        )
    } else {
        "`systemctl --user enable --now airlock.socket` (check `systemctl --user status \
         airlock.socket airlock.service`)"
            .to_owned()
    }
}

/// The DESIGN §6 decision: one-shot activation applies for the `/tmp` fallback, and for
/// `$AIRLOCK_SOCKET`/`$XDG_RUNTIME_DIR` paths no installed unit or LaunchAgent serves.
pub fn decide_activation(env: &dyn Env, socket: &SocketPath) -> Activation {
    if socket.source == SocketSource::TmpFallback {
        return Activation::OneShot;
    }
    let Some(unit) = service_unit_candidates(env).into_iter().find(|p| p.exists()) else {
        return Activation::OneShot;
    };
    let serves_path = match socket.source {
        SocketSource::XdgRuntime => true,
        // launchd's fleet plist exports its socket as $AIRLOCK_SOCKET (SecureSocketWithKey).
        SocketSource::Env if cfg!(target_os = "macos") => true,
        // systemd's unit listens on %t/airlock/airlock.sock only.
        SocketSource::Env => env
            .var("XDG_RUNTIME_DIR")
            .map(|d| Path::new(&d).join("airlock/airlock.sock") == socket.path)
            .unwrap_or(false),
        SocketSource::TmpFallback => false,
    };
    if serves_path { Activation::ServiceManager { unit } } else { Activation::OneShot }
}

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
    daemon_env: Vec<(OsString, OsString)>,
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
        let mut last;
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
                        (false, sessions) => return Err(ClientError::Busy { version, sessions }),
                    }
                    continue;
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
        match client.call(&hello, None) {
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

    /// The one-shot activator (DESIGN §6): under `flock` on `<dir>/airlock.lock`, only the lock
    /// holder unlinks a stale socket and binds; it starts `airlockd` with the socket as fd 3.
    fn activate(&self) -> Result<(), ClientError> {
        let dir = self.socket.dir();
        ensure_dir(dir)?;
        let act =
            |what: &str, e: &dyn std::fmt::Display| ClientError::Activate(format!("{what}: {e}"));
        let lock_path = dir.join("airlock.lock");
        let lock_file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&lock_path)
            .map_err(|e| act(&format!("cannot open {}", lock_path.display()), &e))?;
        let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| act(&format!("cannot lock {}", lock_path.display()), &e))?;
        // Someone may have activated while we waited for the lock.
        match UnixStream::connect(&self.socket.path) {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                // A stale socket file from a daemon that idled out; we hold the lock.
                let meta = std::fs::symlink_metadata(&self.socket.path)
                    .map_err(|e| act("cannot inspect the stale socket", &e))?;
                if !std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) {
                    return Err(ClientError::Activate(format!(
                        "{} exists and is not a socket; remove it",
                        self.socket.path.display()
                    )));
                }
                std::fs::remove_file(&self.socket.path)
                    .map_err(|e| act("cannot remove the stale socket", &e))?;
            }
            Err(e) => {
                return Err(act(&format!("cannot connect to {}", self.socket.path.display()), &e));
            }
        }
        let listener = UnixListener::bind(&self.socket.path)
            .map_err(|e| act(&format!("cannot bind {}", self.socket.path.display()), &e))?;
        std::fs::set_permissions(&self.socket.path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| act("cannot chmod the socket", &e))?;
        let program = find_daemon().ok_or_else(|| {
            ClientError::Activate(
                "airlockd was found neither next to airlock nor on PATH; install both binaries \
                 side by side"
                    .into(),
            )
        })?;
        let log = self.daemon_log.as_ref().and_then(|p| {
            if let Some(parent) = p.parent() {
                let _ = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(parent);
            }
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(p)
                .ok()
        });
        spawn::spawn_activated(&spawn::ActivatedSpawn {
            program: &program,
            args: &[],
            env: &self.daemon_env,
            listener: listener.as_fd(),
            fd_name: SOCKET_NAME,
            stderr: log.as_ref().map(AsFd::as_fd),
            mode: spawn::Mode::Detached,
        })
        .map_err(|e| act(&format!("cannot start {}", program.display()), &e))?;
        // Our copy closes here; the daemon holds the socket now.
        Ok(())
    }

    /// `status` on a fresh connection.
    pub fn status(&self) -> Result<StatusReply, ClientError> {
        self.connect()?.status()
    }
}

fn is_retryable(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ECONNRESET | libc::EPIPE | libc::ECONNREFUSED))
        || e.kind() == io::ErrorKind::UnexpectedEof
}

/// `airlockd` next to the running `airlock` binary first, then on `PATH`.
pub fn find_daemon() -> Option<PathBuf> {
    let beside =
        std::env::current_exe().ok().and_then(|exe| exe.parent().map(|d| d.join("airlockd")));
    if let Some(p) = beside.filter(|p| p.is_file()) {
        return Some(p);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path).map(|d| d.join("airlockd")).find(|p| p.is_file())
    })
}

/// A connection that completed hello.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    frames: FrameBuf,
    /// The shared protocol version; `None` if the daemon shares none.
    pub version: Option<u32>,
    pub daemon_protocol: VersionRange,
    pub daemon_version: String,
    pub daemon_sessions: usize,
    pub daemon_pid: u32,
    pub boot: String,
    /// The optional features in force on this connection (none under version 1).
    pub capabilities: Capabilities,
}

impl Client {
    /// Sends one request (with an fd attached, if any) and reads its reply.
    pub fn call(
        &mut self,
        req: &Request,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Response, FrameError> {
        let bytes = protocol::encode(req)?;
        let mut sent = 0;
        if let Some(fd) = fd {
            sent = fdpass::send_with_fds(self.stream.as_fd(), &bytes, &[fd])?;
        }
        self.stream.write_all(&bytes[sent..])?;
        self.read_reply()
    }

    fn read_reply(&mut self) -> Result<Response, FrameError> {
        loop {
            if let Some(resp) = self.frames.next_message::<Response>()? {
                return Ok(resp);
            }
            let mut buf = [0u8; 16 * 1024];
            let n = self.stream.read(&mut buf)?;
            if n == 0 {
                return Err(FrameError::Closed);
            }
            self.frames.extend(&buf[..n]);
        }
    }

    /// `status`.
    pub fn status(&mut self) -> Result<StatusReply, ClientError> {
        match self.call(&Request::Status, None)? {
            Response::Status(s) => Ok(*s),
            Response::Error { code, message } => Err(ClientError::Refused { code, message }),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// `quit_if_idle`: `(quitting, sessions)`. When quitting, waits until the daemon closes.
    fn quit_if_idle(mut self) -> Result<(bool, usize), ClientError> {
        match self.call(&Request::QuitIfIdle, None)? {
            Response::QuitIfIdle { quitting, sessions } => {
                if quitting {
                    // The daemon drains and closes us; wait for that so the retry meets the
                    // next instance.
                    let mut sink = [0u8; 256];
                    while matches!(self.stream.read(&mut sink), Ok(n) if n > 0) {}
                }
                Ok((quitting, sessions))
            }
            Response::Error { code, message } => Err(ClientError::Refused { code, message }),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// The raw stream (for tests and benchmarks).
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }
}

/// How a session ended, for `session_end`.
#[derive(Debug, Clone, Default)]
pub struct SessionOutcome {
    pub exit_status: Option<i32>,
    pub transcripts: Vec<protocol::TranscriptHash>,
    pub quarantined: Vec<protocol::Quarantined>,
    pub leftovers: protocol::Leftovers,
}

struct Shared {
    client: Client,
    /// The encoded `session_end`, once the supervisor asked to end.
    pending_end: Option<Vec<u8>>,
    /// The handle was dropped without `end`: let the daemon see the supervisor go.
    abandoned: bool,
}

/// A session registered with the daemon (the supervisor's handle, SECURITY §4).
///
/// A watcher thread holds the control connection; if the daemon dies, it re-registers the
/// session (same id, a dup of the listener) with the next instance. Dropping the handle without
/// [`SessionHandle::end`] closes the connection, which the daemon records as
/// `end_reason: "supervisor_lost"`.
pub struct SessionHandle {
    id: String,
    shared: Arc<Mutex<Shared>>,
    replies: mpsc::Receiver<Result<Response, FrameError>>,
    boots: Arc<Mutex<Vec<String>>>,
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle").field("id", &self.id).finish_non_exhaustive()
    }
}

fn register(
    endpoint: &Endpoint,
    spec: &SessionSpec,
    listener: &OwnedFd,
    reregister: bool,
) -> Result<(Client, String, String), ClientError> {
    let mut client = endpoint.connect()?;
    let req = if reregister {
        Request::SessionReregister(Box::new(spec.clone()))
    } else {
        Request::SessionStart(Box::new(spec.clone()))
    };
    match client.call(&req, Some(listener.as_fd()))? {
        Response::SessionStarted { session, boot, .. } => Ok((client, session, boot)),
        Response::Error { code, message } => Err(ClientError::Refused { code, message }),
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

impl SessionHandle {
    /// Registers a session: sends `spec` and the sandbox's proxy listener (created inside the
    /// sandbox's network namespace) to the daemon, which validates it, applies its own managed
    /// layer, writes the start record and serves the proxy on it.
    pub fn start(
        endpoint: Endpoint,
        mut spec: SessionSpec,
        listener: OwnedFd,
    ) -> Result<Self, ClientError> {
        if spec.airlock_version.is_empty() {
            spec.airlock_version = env!("CARGO_PKG_VERSION").into();
        }
        let (client, id, boot) = register(&endpoint, &spec, &listener, false)?;
        spec.session = Some(id.clone());
        let reader = client.stream.try_clone().map_err(|e| ClientError::Frame(e.into()))?;
        let _ = reader.set_read_timeout(None);
        let shared = Arc::new(Mutex::new(Shared { client, pending_end: None, abandoned: false }));
        let boots = Arc::new(Mutex::new(vec![boot]));
        let (tx, rx) = mpsc::channel();
        let (sh, bt) = (Arc::clone(&shared), Arc::clone(&boots));
        std::thread::Builder::new()
            .name(format!("airlock-session-{id}"))
            .spawn(move || watch(endpoint, spec, listener, reader, sh, bt, tx))
            .map_err(|e| ClientError::Frame(e.into()))?;
        Ok(Self { id, shared, replies: rx, boots })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The daemon instances this session has been registered with, oldest first.
    pub fn boots(&self) -> Vec<String> {
        self.boots.lock().map(|b| b.clone()).unwrap_or_default()
    }

    /// Sends `session_end` and waits for the daemon to write the end record.
    pub fn end(self, outcome: SessionOutcome) -> Result<(), ClientError> {
        let req = Request::SessionEnd(SessionEnd {
            session: self.id.clone(),
            exit_status: outcome.exit_status,
            transcripts: outcome.transcripts,
            quarantined: outcome.quarantined,
            leftovers: outcome.leftovers,
        });
        let bytes = protocol::encode(&req)?;
        {
            let mut s = self
                .shared
                .lock()
                .map_err(|_| ClientError::Unexpected("session state poisoned".into()))?;
            // If this write is lost with the daemon, the watcher resends it after re-registering.
            let _ = s.client.stream.write_all(&bytes);
            s.pending_end = Some(bytes);
        }
        match self.replies.recv_timeout(CONNECT_TIMEOUT + REQUEST_TIMEOUT) {
            Ok(Ok(Response::SessionEnded { .. })) => Ok(()),
            Ok(Ok(Response::Error { code, message })) => {
                Err(ClientError::Refused { code, message })
            }
            Ok(Ok(other)) => Err(ClientError::Unexpected(format!("{other:?}"))),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(ClientError::Unexpected("airlockd did not confirm session_end".into())),
        }
    }
}

impl Drop for SessionHandle {
    fn drop(&mut self) {
        if let Ok(mut s) = self.shared.lock()
            && s.pending_end.is_none()
        {
            s.abandoned = true;
            // Closing our side is how the daemon learns the supervisor is gone.
            let _ = s.client.stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// The watcher: forwards replies; on a lost daemon, re-registers with the next instance.
fn watch(
    endpoint: Endpoint,
    spec: SessionSpec,
    listener: OwnedFd,
    mut reader: UnixStream,
    shared: Arc<Mutex<Shared>>,
    boots: Arc<Mutex<Vec<String>>>,
    tx: mpsc::Sender<Result<Response, FrameError>>,
) {
    let mut frames = FrameBuf::new();
    loop {
        let mut buf = [0u8; 4096];
        let lost = match reader.read(&mut buf) {
            Ok(0) => true,
            Ok(n) => {
                frames.extend(&buf[..n]);
                while let Ok(Some(resp)) = frames.next_message::<Response>() {
                    // A stopping daemon says so before closing; the EOF that follows triggers
                    // re-registration. Anything else answers our `session_end`.
                    if matches!(resp, Response::Error { code: ErrorCode::Stopping, .. }) {
                        continue;
                    }
                    let ending = shared.lock().map(|s| s.pending_end.is_some()).unwrap_or(true);
                    if !ending {
                        continue;
                    }
                    let done = matches!(resp, Response::SessionEnded { .. });
                    if tx.send(Ok(resp)).is_err() || done {
                        return;
                    }
                }
                false
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => false,
            Err(_) => true,
        };
        if !lost {
            continue;
        }
        if shared.lock().map(|s| s.abandoned).unwrap_or(true) {
            return;
        }
        // The daemon went away (crash, kill -9, SIGTERM): re-register with the next instance.
        let mut backoff = Duration::from_millis(10);
        loop {
            match register(&endpoint, &spec, &listener, true) {
                Ok((client, _, boot)) => {
                    let Ok(r) = client.stream.try_clone() else { return };
                    let _ = r.set_read_timeout(None);
                    reader = r;
                    frames = FrameBuf::new();
                    if let Ok(mut b) = boots.lock() {
                        b.push(boot);
                    }
                    let Ok(mut s) = shared.lock() else { return };
                    s.client = client;
                    if let Some(bytes) = s.pending_end.clone() {
                        let _ = s.client.stream.write_all(&bytes);
                    }
                    break;
                }
                Err(e) => {
                    eprintln!(
                        "airlock: re-registering session {} with airlockd: {e}",
                        spec.session.as_deref().unwrap_or("?")
                    );
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::env::MapEnv;

    #[test]
    fn socket_path_order_follows_design() {
        let env = MapEnv::new()
            .with("AIRLOCK_SOCKET", "/s/a.sock")
            .with("XDG_RUNTIME_DIR", "/run/user/1");
        assert_eq!(
            SocketPath::resolve(&env),
            SocketPath { path: "/s/a.sock".into(), source: SocketSource::Env }
        );
        let env = MapEnv::new().with("XDG_RUNTIME_DIR", "/run/user/1");
        assert_eq!(
            SocketPath::resolve(&env),
            SocketPath {
                path: "/run/user/1/airlock/airlock.sock".into(),
                source: SocketSource::XdgRuntime
            }
        );
        let env = MapEnv::new().with("XDG_RUNTIME_DIR", "relative");
        let p = SocketPath::resolve(&env);
        assert_eq!(p.source, SocketSource::TmpFallback);
        let uid = nix::unistd::getuid().as_raw();
        assert_eq!(p.path, PathBuf::from(format!("/tmp/airlock-{uid}/airlock.sock")));
    }

    #[test]
    fn unsafe_directories_are_refused_with_the_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let good = tmp.path().join("good");
        std::fs::DirBuilder::new().mode(0o700).create(&good).unwrap();
        check_dir(&good).unwrap();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let msg = check_dir(&open).unwrap_err().to_string();
        assert!(msg.contains("0755") && msg.contains("chmod 0700"), "{msg}");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert!(check_dir(&link).unwrap_err().to_string().contains("symlink"));
    }

    #[test]
    fn activation_decision_follows_design() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        let run = tmp.path().join("run");
        let base = MapEnv::new().with("HOME", &home).with("XDG_RUNTIME_DIR", &run);
        let xdg = SocketPath::resolve(&base);
        let other = SocketPath { path: tmp.path().join("x.sock"), source: SocketSource::Env };
        let tmpfb = SocketPath {
            path: "/tmp/airlock-1/airlock.sock".into(),
            source: SocketSource::TmpFallback,
        };
        assert_eq!(decide_activation(&base, &xdg), Activation::OneShot);
        if cfg!(target_os = "linux") && !Path::new("/etc/systemd/user/airlock.socket").exists() {
            let unit = home.join(".config/systemd/user/airlock.socket");
            std::fs::create_dir_all(unit.parent().unwrap()).unwrap();
            std::fs::write(&unit, "").unwrap();
            assert_eq!(decide_activation(&base, &xdg), Activation::ServiceManager { unit });
            assert_eq!(decide_activation(&base, &other), Activation::OneShot);
            assert_eq!(decide_activation(&base, &tmpfb), Activation::OneShot);
            let same = SocketPath { path: xdg.path.clone(), source: SocketSource::Env };
            assert!(matches!(decide_activation(&base, &same), Activation::ServiceManager { .. }));
        }
    }
}
