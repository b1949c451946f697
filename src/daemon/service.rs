//! The control service: accepts connections on the adopted socket, checks each peer's uid and
//! that it shares the daemon's user and network namespace, speaks [`crate::protocol`], keeps the
//! session registry and session records, and exits when idle or on SIGTERM (DESIGN §6).
//!
//! Idle exit is race-free because the daemon never owns the socket: it stops calling `accept`,
//! sends `STOPPING=1`, drops its copy of the listener (never `shutdown(2)`, never unlink), finishes
//! what it accepted and exits 0. Connections that arrive meanwhile wait in the socket's backlog,
//! and the service manager, still holding the socket, starts the next instance for them.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use std::time::SystemTime;

use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Notify, watch};
use tokio::task::{JoinHandle, JoinSet};

use super::notify;
use super::records::{self, EndRecord, StartRecord};
use crate::audit::{self, LogRegistry, SessionInfo, rfc3339_ms};
use crate::config::LayerDoc;
use crate::env::{Env, ProcessEnv};
use crate::paths::Paths;
use crate::protocol::{
    self, ErrorCode, FrameBuf, FrameError, Request, Response, SessionEnd, SessionSpec,
    SessionStatus, StatusReply, VersionRange,
};
use crate::proxy::{self, Limits, Resolver, SessionProxy, SystemResolver};
use crate::sys::activation::Source;
use crate::sys::fdpass;

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

/// Why the accept loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    Idle,
    Signal,
    Quit,
}

/// One registered session and the proxy serving its listener.
#[derive(Debug)]
pub struct Session {
    pub spec: SessionSpec,
    pub id: String,
    pub started_at: String,
    pub listen: String,
    pub proxy: Arc<SessionProxy>,
    /// Turning it true drains the session's proxy (tunnels get the grace period).
    shutdown: watch::Sender<bool>,
}

impl Session {
    fn stop_proxy(&self) {
        self.shutdown.send_replace(true);
    }
}

/// Shared daemon state.
#[derive(Debug)]
pub struct Daemon {
    pub boot: String,
    pub version: String,
    pub protocol: VersionRange,
    started: Instant,
    started_at: String,
    options: Options,
    env: ProcessEnv,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    conns: AtomicUsize,
    /// Wakes the accept loop to re-evaluate idleness.
    activity: Notify,
    /// Set once when the daemon stops; connection tasks finish their request and close.
    stop_tx: watch::Sender<bool>,
    quit: Notify,
    /// Serving (or draining) session proxies; they count as activity until they return.
    proxies: Mutex<Vec<JoinHandle<()>>>,
    running_proxies: AtomicUsize,
    /// The audit writer state of this instance (one journal per repo), opened on first use.
    logs: Mutex<Option<Arc<LogRegistry>>>,
    /// The managed layer as last read, keyed by the file's identity and change time, so every
    /// request sees a fixed file at once without re-parsing an unchanged one.
    managed: Mutex<ManagedCache>,
    binary: String,
    last_status: Mutex<String>,
}

/// The managed layer (or its error) and the file state it was read at.
type ManagedCache = Option<(FileKey, Result<Option<LayerDoc>, String>)>;

/// What `stat(2)` says about a file; any change (or appearance/removal) means re-read it.
type FileKey = Option<(u64, u64, u64, i64, i64, i64, i64)>;

fn file_key(path: &std::path::Path) -> FileKey {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()))
}

fn now() -> String {
    rfc3339_ms(SystemTime::now())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking holder leaves the map consistent (every update is a single insert/remove).
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Daemon {
    fn new(options: Options) -> Arc<Self> {
        let env = ProcessEnv;
        let version = test_override(&env, protocol::TEST_DAEMON_VERSION_VAR)
            .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned());
        let protocol =
            VersionRange::from_test_override(env.var(protocol::TEST_DAEMON_PROTOCOL_VAR));
        Arc::new(Self {
            boot: audit::new_boot_id(),
            version,
            protocol,
            started: Instant::now(),
            started_at: now(),
            options,
            env,
            sessions: Mutex::new(HashMap::new()),
            conns: AtomicUsize::new(0),
            activity: Notify::new(),
            stop_tx: watch::channel(false).0,
            quit: Notify::new(),
            proxies: Mutex::new(Vec::new()),
            running_proxies: AtomicUsize::new(0),
            logs: Mutex::new(None),
            managed: Mutex::new(None),
            binary: std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default(),
            last_status: Mutex::new(notify::describe(0, 0)),
        })
    }

    fn session_count(&self) -> usize {
        lock(&self.sessions).len()
    }

    fn tunnels(&self) -> u64 {
        lock(&self.sessions).values().map(|s| s.proxy.stats().active_tunnels as u64).sum()
    }

    /// Connections + sessions + tunnels (and proxies still draining): anything non-zero keeps
    /// the daemon up.
    fn active(&self) -> u64 {
        self.conns.load(Ordering::SeqCst) as u64
            + self.session_count() as u64
            + self.tunnels()
            + self.running_proxies.load(Ordering::SeqCst) as u64
    }

    /// The audit registry of this instance (journals under `~/.airlock/logs/<repo>/`).
    fn logs(&self, paths: &Paths) -> Arc<LogRegistry> {
        let mut guard = lock(&self.logs);
        Arc::clone(
            guard.get_or_insert_with(|| Arc::new(LogRegistry::new(paths.logs_root(), &self.boot))),
        )
    }

    /// The resolver sessions use: the system's, or (test-hooks builds only) a file of test
    /// answers named by `AIRLOCK_TEST_RESOLVER`.
    fn resolver(&self) -> Result<Arc<dyn Resolver>, String> {
        #[cfg(feature = "test-hooks")]
        if let Some(file) = self.env.var("AIRLOCK_TEST_RESOLVER") {
            let path = PathBuf::from(&file);
            let log = self
                .env
                .var("AIRLOCK_TEST_RESOLVER_LOG")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(format!("{file}.queries")));
            eprintln!("airlockd: WARNING: TEST RESOLVER IN FORCE ({file}); test-hooks build");
            let r = proxy::resolver::FileResolver::load(&path, Some(log))
                .map_err(|e| format!("AIRLOCK_TEST_RESOLVER={file}: {e}"))?;
            return Ok(Arc::new(r));
        }
        Ok(Arc::new(SystemResolver))
    }

    /// Sends `STATUS=` when the sessions/tunnels line changed since the last one.
    fn notify_status(&self) {
        let line = notify::describe(self.session_count(), self.tunnels());
        let mut last = lock(&self.last_status);
        if *last != line {
            notify::status(&line);
            *last = line;
        }
    }

    fn paths(&self) -> Result<Paths, String> {
        Paths::from_env(&self.env).map_err(|e| e.to_string())
    }

    /// Re-reads the daemon's own configuration (the managed layer). An error never stops the
    /// daemon; it is reported by `status` and refuses sessions until fixed.
    fn config_check(&self) -> Result<Option<LayerDoc>, String> {
        let paths = self.paths()?;
        let key = file_key(paths.managed_policy());
        let mut cache = lock(&self.managed);
        if let Some((k, result)) = cache.as_ref()
            && *k == key
        {
            return result.clone();
        }
        let result = crate::config::load_managed(&paths).map_err(|e| {
            format!(
                "managed policy: {e}; sessions are refused until it is fixed (ask your fleet \
                 admin, or run `airlock doctor`)"
            )
        });
        *cache = Some((key, result.clone()));
        result
    }

    fn status(&self) -> StatusReply {
        let sessions = lock(&self.sessions);
        let mut list: Vec<SessionStatus> = sessions
            .values()
            .map(|s| {
                let stats = s.proxy.stats();
                SessionStatus {
                    session: s.id.clone(),
                    repo: s.spec.repo.clone(),
                    repo_path: s.spec.repo_path.clone(),
                    user_id: s.spec.identity.user_id.clone(),
                    email: s.spec.identity.email.clone(),
                    agent: s.spec.agent.clone(),
                    started_at: s.started_at.clone(),
                    listen: s.listen.clone(),
                    tunnels: stats.active_tunnels as u64,
                    bytes_sent: stats.bytes_sent,
                    bytes_recv: stats.bytes_recv,
                    serving: !*s.shutdown.borrow(),
                }
            })
            .collect();
        drop(sessions);
        list.sort_by(|a, b| a.started_at.cmp(&b.started_at));
        StatusReply {
            daemon_version: self.version.clone(),
            protocol: self.protocol.max,
            binary: self.binary.clone(),
            pid: std::process::id(),
            boot: self.boot.clone(),
            started_at: self.started_at.clone(),
            uptime_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            idle_timeout_ms: u64::try_from(self.options.idle_timeout.as_millis())
                .unwrap_or(u64::MAX),
            activation: match self.options.activation {
                Source::Systemd => "systemd".into(),
                Source::Launchd => "launchd".into(),
                Source::OneShot => "airlock (one-shot)".into(),
            },
            tunnels: list.iter().map(|s| s.tunnels).sum(),
            sessions: list,
            config_error: self.config_check().err(),
        }
    }
}

fn test_override(env: &dyn Env, var: &str) -> Option<String> {
    #[cfg(feature = "test-hooks")]
    if let Some(v) = env.var(var) {
        return Some(v);
    }
    let _ = (env, var);
    None
}

/// Serves the control socket until idle, `quit_if_idle` or SIGTERM.
pub async fn serve(listener: OwnedFd, options: Options) -> Result<(), ServiceError> {
    let std_listener = std::os::unix::net::UnixListener::from(listener);
    let listener = UnixListener::from_std(std_listener).map_err(ServiceError::Listener)?;
    let daemon = Daemon::new(options);
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(ServiceError::Signal)?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(ServiceError::Signal)?;

    settle_journals(&daemon);
    // Build the (possibly file-backed) resolver once so a broken test resolver shows up early.
    if let Err(e) = daemon.resolver() {
        eprintln!("airlockd: {e}");
    }
    if let Err(e) = daemon.config_check() {
        // Stay up and answer with the error (DESIGN §6).
        eprintln!("airlockd: {e}");
    }
    notify::ready(&notify::describe(0, 0));
    tracing::info!(boot = %daemon.boot, "airlockd ready");

    let mut tasks = JoinSet::new();
    let mut idle_since = Instant::now();
    // Tunnels open and close inside the proxy; refresh STATUS= periodically while busy.
    let mut status_tick = tokio::time::interval(Duration::from_secs(2));
    status_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let reason = loop {
        let idle = daemon.active() == 0;
        let deadline = tokio::time::Instant::from_std(idle_since + daemon.options.idle_timeout);
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    daemon.conns.fetch_add(1, Ordering::SeqCst);
                    let d = Arc::clone(&daemon);
                    tasks.spawn(async move {
                        handle_connection(&d, stream).await;
                        d.conns.fetch_sub(1, Ordering::SeqCst);
                        d.activity.notify_one();
                    });
                }
                Err(err) => {
                    // EMFILE and friends: back off instead of spinning.
                    eprintln!("airlockd: accept failed: {err}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = tokio::time::sleep_until(deadline), if idle => {
                if daemon.active() == 0 {
                    break StopReason::Idle;
                }
            }
            () = daemon.activity.notified() => {
                if daemon.active() == 0 {
                    idle_since = Instant::now();
                }
            }
            () = daemon.quit.notified() => break StopReason::Quit,
            _ = status_tick.tick(), if daemon.session_count() > 0 => daemon.notify_status(),
            _ = sigterm.recv() => break StopReason::Signal,
            _ = sigint.recv() => break StopReason::Signal,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
        if daemon.active() != 0 {
            idle_since = Instant::now();
        }
    };

    let why = match reason {
        StopReason::Idle => "idle",
        StopReason::Signal => "terminating",
        StopReason::Quit => "quitting on request (version skew)",
    };
    #[cfg(feature = "test-hooks")]
    if let Some(ms) = daemon.env.var(TEST_DRAIN_DELAY_VAR).and_then(|v| v.parse::<u64>().ok()) {
        // Widens the window between STOPPING and dropping the listener so a test can connect
        // inside it deterministically.
        notify::stopping("draining (test delay)");
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    notify::stopping(&format!(
        "{why}; {}",
        notify::describe(daemon.session_count(), daemon.tunnels())
    ));
    // Drop our copy of the socket: the service manager keeps it, pending clients wait for the
    // next instance. Never shutdown(2), never unlink.
    drop(listener);
    daemon.stop_tx.send_replace(true);
    // Session proxies stop accepting; open tunnels get the grace period, then are closed and
    // logged `interrupted`. Supervisors re-register with the next instance.
    for s in lock(&daemon.sessions).values() {
        s.stop_proxy();
    }
    let proxies = std::mem::take(&mut *lock(&daemon.proxies));
    let drain = async {
        while tasks.join_next().await.is_some() {}
        for p in proxies {
            let _ = p.await;
        }
    };
    if reason == StopReason::Signal {
        // In-flight requests finish; open tunnels get the grace period.
        if tokio::time::timeout(daemon.options.shutdown_grace, drain).await.is_err() {
            eprintln!("airlockd: grace period over; closing remaining connections");
        }
    } else {
        drain.await;
    }
    tracing::info!(boot = %daemon.boot, "airlockd exiting ({why})");
    Ok(())
}

/// Settles in-flight journals that no live writer holds (DESIGN §5), for every repo: tunnels
/// that were open when an earlier writer died become `"interrupted": true` lines.
fn settle_journals(daemon: &Daemon) {
    let paths = match daemon.paths() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("airlockd: cannot settle journals: {e}");
            return;
        }
    };
    match audit::settle_all(&paths.logs_root()) {
        Ok(r) if r.lines_written > 0 => {
            eprintln!(
                "airlockd: settled {} interrupted attempt(s) of earlier writers",
                r.lines_written
            );
        }
        Ok(_) => {}
        Err(e) => eprintln!("airlockd: settling journals: {e}"),
    }
}

/// Per-connection state.
struct Conn {
    stream: UnixStream,
    frames: FrameBuf,
    fds: Vec<OwnedFd>,
    /// The negotiated protocol; `None` before hello, `Some(None)` when none is shared.
    version: Option<Option<u32>>,
    session: Option<Arc<Session>>,
}

impl Conn {
    async fn send(&mut self, resp: &Response) -> Result<(), FrameError> {
        let bytes = protocol::encode(resp)?;
        self.stream.write_all(&bytes).await?;
        Ok(())
    }

    /// Closes after a final error: half-close, then discard what the peer still sends (briefly),
    /// so unread input does not turn our close into a reset that hides the error (unix(7)).
    async fn close_gracefully(&mut self) {
        let _ = self.stream.shutdown().await;
        let drain = async {
            let mut buf = [0u8; 4096];
            let mut total = 0usize;
            while let Ok(n) = tokio::io::AsyncReadExt::read(&mut self.stream, &mut buf).await {
                total += n;
                if n == 0 || total > 1 << 20 {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_millis(500), drain).await;
    }

    /// Reads one chunk (and any fds sent with it). `Ok(false)` = EOF.
    async fn read_chunk(&mut self) -> Result<bool, FrameError> {
        let mut buf = [0u8; 16 * 1024];
        let fds = &mut self.fds;
        let stream = &self.stream;
        let n = stream
            .async_io(Interest::READABLE, || fdpass::recv_with_fds(stream.as_fd(), &mut buf, fds))
            .await?;
        self.frames.extend(&buf[..n]);
        Ok(n > 0)
    }
}

fn error(code: ErrorCode, message: impl Into<String>) -> Response {
    Response::Error { code, message: message.into() }
}

async fn handle_connection(daemon: &Arc<Daemon>, stream: UnixStream) {
    let mut conn =
        Conn { stream, frames: FrameBuf::new(), fds: Vec::new(), version: None, session: None };
    // Peer uid on every accept (SO_PEERCRED, unix(7)).
    let me = nix::unistd::geteuid().as_raw();
    match conn.stream.peer_cred() {
        Ok(cred) if cred.uid() == me => {}
        Ok(cred) => {
            let msg = format!(
                "refused: this airlockd serves uid {me}; the connecting process runs as uid {}",
                cred.uid()
            );
            eprintln!("airlockd: {msg}");
            let _ = conn.send(&error(ErrorCode::PeerUid, msg)).await;
            conn.close_gracefully().await;
            return;
        }
        Err(err) => {
            eprintln!("airlockd: cannot read peer credentials: {err}");
            return;
        }
    }
    // Same user and network namespace as ours, or nothing is served (SECURITY §7): a sandboxed
    // process that reaches the socket (say, through a bad mount) must not speak the protocol.
    if let Err(err) = crate::sys::peer::check_same_namespaces(conn.stream.as_fd()) {
        eprintln!("airlockd: WARNING: refused a control connection: {err}");
        let msg = format!(
            "refused: airlockd serves only processes in its own user and network namespaces; \
             {err}. Run airlock in the same namespaces as airlockd."
        );
        let _ = conn.send(&error(ErrorCode::PeerNamespace, msg)).await;
        conn.close_gracefully().await;
        return;
    }
    let mut stop = daemon.stop_tx.subscribe();
    loop {
        let req = match conn.frames.next_message::<Request>() {
            Ok(Some(req)) => req,
            Ok(None) => {
                // Re-evaluated per chunk: once stopping, a connection closes only between
                // requests, so a request that is partly read still gets its answer.
                let got = tokio::select! {
                    biased;
                    r = conn.read_chunk() => Some(r),
                    _ = stop.wait_for(|s| *s), if !conn.frames.is_partial() => None,
                };
                let Some(got) = got else {
                    let _ =
                        conn.send(&error(ErrorCode::Stopping, "airlockd is stopping; retry")).await;
                    conn.close_gracefully().await;
                    return;
                };
                match got {
                    Ok(true) => continue,
                    Ok(false) | Err(FrameError::Io(_)) => break,
                    Err(e) => {
                        let _ = conn.send(&error(ErrorCode::Protocol, e.to_string())).await;
                        conn.close_gracefully().await;
                        break;
                    }
                }
            }
            Err(e) => {
                let _ = conn.send(&error(ErrorCode::Protocol, e.to_string())).await;
                break;
            }
        };
        let resp = handle_request(daemon, &mut conn, req);
        // Fds belong to the request they arrived with; any left over are closed.
        conn.fds.clear();
        if conn.send(&resp).await.is_err() {
            break;
        }
    }
    // The connection is gone. A session it still owns lost its supervisor — unless we are the
    // ones stopping, in which case the supervisor re-registers with the next instance.
    let stopping = *daemon.stop_tx.borrow();
    if let Some(session) = conn.session.take()
        && !stopping
    {
        end_session(
            daemon,
            &session,
            &SessionEnd { session: session.id.clone(), ..Default::default() },
            Some("supervisor_lost"),
        );
    }
}

fn handle_request(daemon: &Arc<Daemon>, conn: &mut Conn, req: Request) -> Response {
    match (&conn.version, req) {
        (None, Request::Hello { protocol, capabilities, .. }) => {
            let shared = daemon.protocol.shared(protocol);
            conn.version = Some(shared);
            Response::Hello {
                version: shared,
                protocol: daemon.protocol,
                daemon_version: daemon.version.clone(),
                pid: std::process::id(),
                boot: daemon.boot.clone(),
                sessions: daemon.session_count(),
                capabilities: protocol::Capabilities::agreed(
                    shared,
                    &protocol::Capabilities::current(),
                    &capabilities,
                ),
            }
        }
        (None, _) => error(ErrorCode::Protocol, "the first request must be hello"),
        (Some(_), Request::Hello { .. }) => error(ErrorCode::Protocol, "hello was already sent"),
        (Some(_), Request::QuitIfIdle) => {
            let sessions = daemon.session_count();
            // This connection is the only one, and nothing else runs.
            let quitting =
                sessions == 0 && daemon.tunnels() == 0 && daemon.conns.load(Ordering::SeqCst) <= 1;
            if quitting {
                daemon.quit.notify_one();
            }
            Response::QuitIfIdle { quitting, sessions }
        }
        (Some(None), _) => error(
            ErrorCode::Protocol,
            format!("no shared protocol version (airlockd speaks {})", daemon.protocol),
        ),
        (Some(Some(_)), Request::Status) => Response::Status(Box::new(daemon.status())),
        (Some(Some(_)), Request::SessionStart(spec)) => start_session(daemon, conn, *spec, false),
        (Some(Some(_)), Request::SessionReregister(spec)) => {
            start_session(daemon, conn, *spec, true)
        }
        (Some(Some(_)), Request::SessionEnd(end)) => match conn.session.take() {
            Some(s) if s.id == end.session => {
                end_session(daemon, &s, &end, None);
                Response::SessionEnded { session: end.session }
            }
            other => {
                conn.session = other;
                error(
                    ErrorCode::Session,
                    format!("session {:?} is not owned by this connection", end.session),
                )
            }
        },
    }
}

fn valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn start_session(
    daemon: &Arc<Daemon>,
    conn: &mut Conn,
    spec: SessionSpec,
    reregister: bool,
) -> Response {
    if conn.session.is_some() {
        return error(
            ErrorCode::Session,
            "this connection already owns a session; open one connection per session",
        );
    }
    // The managed layer is read here, by the daemon, for every session: the client cannot drop
    // it, and a fix to a broken file applies without a restart.
    let managed = match daemon.config_check() {
        Ok(m) => m,
        Err(e) => return error(ErrorCode::Config, e),
    };
    let paths = match daemon.paths() {
        Ok(p) => p,
        Err(e) => return error(ErrorCode::Config, e),
    };
    if !crate::repo::is_valid_name(&spec.repo) {
        return error(ErrorCode::Session, format!("invalid repo name {:?}", spec.repo));
    }
    let id = match (&spec.session, reregister) {
        (Some(id), _) if valid_session_id(id) => id.clone(),
        (Some(id), _) => return error(ErrorCode::Session, format!("invalid session id {id:?}")),
        (None, true) => {
            return error(ErrorCode::Session, "session_reregister needs the session id");
        }
        (None, false) => audit::new_id(),
    };
    let layers = match crate::config::ClientLayers::from_wire(&spec.config) {
        Ok(l) => l,
        Err(e) => return error(ErrorCode::Config, e.to_string()),
    };
    let built = match layers.build_policy(managed.as_ref()) {
        Ok(b) => b,
        Err(e) => return error(ErrorCode::Config, e.to_string()),
    };
    let Some(listener) = conn.fds.pop() else {
        return error(
            ErrorCode::Listener,
            "no listener fd was passed with the request (SCM_RIGHTS)",
        );
    };
    let listen = match fdpass::validate_listener(listener.as_fd()) {
        Ok(addr) => addr.to_string(),
        Err(e) => return error(ErrorCode::Listener, format!("listener refused: {e}")),
    };
    let resolver = match daemon.resolver() {
        Ok(r) => r,
        Err(e) => return error(ErrorCode::Config, e),
    };
    let info = SessionInfo {
        session: id.clone(),
        repo: spec.repo.clone(),
        repo_path: Some(spec.repo_path.clone()),
        user_id: spec.identity.user_id.clone(),
    };
    // A new boot: this session's `seq` restarts at 1 under this instance's `boot`.
    let sink = match daemon.logs(&paths).session_sink(info) {
        Ok(s) => s,
        Err(e) => return error(ErrorCode::Internal, e.to_string()),
    };
    let std_listener = std::net::TcpListener::from(listener);
    let tcp = match std_listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(std_listener))
    {
        Ok(l) => l,
        Err(e) => return error(ErrorCode::Listener, format!("cannot serve the listener: {e}")),
    };
    // The effective policy's digest (mode, entries, review hosts — not display names).
    let policy_digest = built.policy.digest();
    let limits = Limits { drain_grace: daemon.options.shutdown_grace, ..Limits::default() };
    let proxy = Arc::new(SessionProxy::new(
        Arc::new(built.policy),
        Arc::new(sink),
        resolver,
        limits,
        proxy::local_addrs(),
        proxy::Identity {
            repo: spec.repo.clone(),
            repo_path: Some(spec.repo_path.clone()),
            user_id: spec.identity.user_id.clone(),
        },
    ));
    let (shutdown, shutdown_rx) = watch::channel(false);
    let session = Arc::new(Session {
        id: id.clone(),
        started_at: now(),
        listen,
        proxy: Arc::clone(&proxy),
        shutdown,
        spec,
    });
    {
        let mut sessions = lock(&daemon.sessions);
        if sessions.contains_key(&id) {
            return error(ErrorCode::Session, format!("session {id} is already registered"));
        }
        sessions.insert(id.clone(), Arc::clone(&session));
    }
    if !reregister {
        let policy_digest = format!("sha256:{policy_digest}");
        let policy_layers = policy_layers(managed.as_ref(), &layers);
        let s = &session.spec;
        let rec = StartRecord {
            id: format!("{id}:start"),
            kind: "start",
            ts: session.started_at.clone(),
            session: &id,
            boot: &daemon.boot,
            user_id: s.identity.user_id.as_deref(),
            email: s.identity.email.as_deref(),
            repo: &s.repo,
            repo_path: &s.repo_path,
            command: &s.command,
            agent: s.agent.as_deref(),
            agent_version: s.agent_version.as_deref(),
            airlock_version: &s.airlock_version,
            daemon_version: &daemon.version,
            policy_digest,
            policy_layers,
            layers: &s.layers,
            listen: &session.listen,
        };
        if let Err(e) = records::append(&paths.logs_dir(&s.repo), &rec) {
            lock(&daemon.sessions).remove(&id);
            return error(ErrorCode::Internal, e.to_string());
        }
    }
    // Serve the proxy on the validated listener until the session ends or the daemon stops.
    daemon.running_proxies.fetch_add(1, Ordering::SeqCst);
    let d = Arc::clone(daemon);
    let sid = id.clone();
    let handle = tokio::spawn(async move {
        if let Err(e) = proxy::serve_session(tcp, proxy, shutdown_rx).await {
            eprintln!("airlockd: session {sid}: proxy failed: {e}");
        }
        d.running_proxies.fetch_sub(1, Ordering::SeqCst);
        d.activity.notify_one();
    });
    {
        let mut proxies = lock(&daemon.proxies);
        proxies.retain(|h| !h.is_finished());
        proxies.push(handle);
    }
    conn.session = Some(Arc::clone(&session));
    daemon.notify_status();
    daemon.activity.notify_one();
    Response::SessionStarted {
        session: id,
        boot: daemon.boot.clone(),
        listen: session.listen.clone(),
    }
}

/// `name@sha256:<digest>` of each policy layer in force.
fn policy_layers(managed: Option<&LayerDoc>, layers: &crate::config::ClientLayers) -> Vec<String> {
    managed
        .into_iter()
        .chain(layers.user.as_ref())
        .chain(layers.repo.as_ref())
        .map(|l| format!("{}@sha256:{}", l.name, l.digest))
        .collect()
}

fn end_session(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    end: &SessionEnd,
    reason: Option<&'static str>,
) {
    session.stop_proxy();
    let stats = session.proxy.stats();
    lock(&daemon.sessions).remove(&session.id);
    let rec = EndRecord {
        id: format!("{}:end", session.id),
        kind: "end",
        ts: now(),
        session: &session.id,
        boot: &daemon.boot,
        repo: &session.spec.repo,
        user_id: session.spec.identity.user_id.as_deref(),
        exit_status: end.exit_status,
        transcripts: &end.transcripts,
        quarantined: &end.quarantined,
        leftovers: &end.leftovers,
        end_reason: reason,
        tunnels: stats.tunnels_total,
        bytes_sent: stats.bytes_sent,
        bytes_recv: stats.bytes_recv,
    };
    match daemon.paths() {
        Ok(paths) => {
            if let Err(e) = records::append(&paths.logs_dir(&session.spec.repo), &rec) {
                eprintln!("airlockd: {e}");
            }
        }
        Err(e) => eprintln!("airlockd: cannot write the end record of {}: {e}", session.id),
    }
    daemon.notify_status();
    daemon.activity.notify_one();
}

/// Where `status` says the binary is (for `doctor`).
pub fn binary_path() -> Option<PathBuf> {
    std::env::current_exe().ok()
}
