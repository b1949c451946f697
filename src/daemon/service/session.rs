//! Starting and ending sessions: checks of the request, the session's policy (the daemon's
//! managed layer over the client's layers), its audit sink, the start and end records, and the
//! proxy task serving the session's listener. The file I/O of both runs on `spawn_blocking`.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;

use super::connection::{ConnState, error};
use super::layers;
use super::state::{Daemon, Session, blocking, lock, now};
use crate::audit::root::AuditRoot;
use crate::audit::{self, FileAuditSink, SessionInfo};
use crate::config::LayerDoc;
use crate::config::machine_key;
use crate::daemon::records::{self, EndRecord, StartRecord};
use crate::policy::{LocalAddrs, Policy};
use crate::protocol::{ErrorCode, Response, SessionEnd, SessionSpec};
use crate::proxy::{self, Limits, Resolver, SessionProxy};
use crate::sys::fdpass;

fn valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// What a session takes from its layers: the built policy, `name@sha256:<digest>` of each layer,
/// the `[audit]` volume bounds, `[logs] keep`, and the layers themselves (for phase switches).
type SessionPolicy = (
    Arc<Policy>,
    Vec<String>,
    crate::audit::volume::Volume,
    Option<Duration>,
    super::phase::PhaseSource,
);

/// The one place a request's configuration becomes policy: the daemon's managed layer (read by
/// the daemon, so the client cannot drop it) over the client's user and repo layers — sent as
/// documents, or by content under `layer_digests` (`digests`), then parsed and built through
/// the daemon's digest-keyed cache ([`super::layers`]). Returns the built policy and
/// `name@sha256:<digest>` of each layer in force, for the start record, the `[audit]` volume
/// bounds and `[logs] keep` ([`SessionPolicy`]).
fn session_policy(
    cache: &std::sync::Mutex<layers::LayerCache>,
    managed: Option<&LayerDoc>,
    spec: &SessionSpec,
    digests: bool,
) -> Result<SessionPolicy, Response> {
    let config = |e: String| error(ErrorCode::Config, e);
    let layers = &spec.config;
    let (policy, user, repo, review) = if layers.sources.is_empty() {
        let client =
            crate::config::ClientLayers::from_wire(layers).map_err(|e| config(e.to_string()))?;
        let built = client.build_policy(managed).map_err(|e| config(e.to_string()))?;
        let review = client.review_servers.clone();
        (Arc::new(built.policy), client.user.map(Arc::new), client.repo.map(Arc::new), review)
    } else {
        if !digests {
            return Err(error(
                ErrorCode::Protocol,
                "session_start names its layers by digest but the layer_digests capability is not in force on this connection; offer it in hello",
            ));
        }
        if layers.user.is_some() || layers.repo.is_some() {
            return Err(error(
                ErrorCode::Protocol,
                "session_start sends layer documents and layer sources; send one or the other",
            ));
        }
        let resolved = layers::resolve(cache, &layers.sources).map_err(|e| match e {
            layers::SourceError::Unknown(_) => error(ErrorCode::UnknownLayer, e.to_string()),
            layers::SourceError::Invalid(m) => error(ErrorCode::Protocol, m),
            layers::SourceError::Config(e) => config(e.to_string()),
        })?;
        let review = crate::config::review_servers_from_wire(&layers.review_servers);
        let shared = layers::policy(cache, managed, &resolved, &review)
            .map_err(|e| config(e.to_string()))?;
        (Arc::clone(&shared.policy), resolved.user, resolved.repo, review)
    };
    let names = managed
        .into_iter()
        .chain(user.as_deref())
        .chain(repo.as_deref())
        .map(|l| format!("{}@sha256:{}", l.name, l.digest))
        .collect();
    // `[audit]`: the managed layer as the daemon read it, the user layer as the client sent
    // it (a repo document claiming `[audit]` is ignored by `audit_volume`).
    let docs: Vec<&LayerDoc> = managed.into_iter().chain(user.as_deref()).collect();
    let (volume, keep) = (crate::config::audit_volume(&docs), crate::config::logs_keep(&docs));
    let source =
        super::phase::PhaseSource { managed: managed.cloned().map(Arc::new), user, repo, review };
    Ok((policy, names, volume, keep, source))
}

/// `[logs] keep`, applied to the checkout's directory as its session starts; a failure is
/// logged and never stops the session (nothing is deleted that should not be).
fn apply_retention(dir: &std::path::Path, keep: Duration) {
    let published = audit::retention::published_through(dir);
    match audit::retention::apply(dir, keep, std::time::SystemTime::now(), &published) {
        Ok(r) => {
            for path in &r.deleted {
                tracing::info!("[logs] keep: deleted {}", path.display());
            }
        }
        Err(e) => tracing::warn!("[logs] keep: cannot apply retention in {}: {e}", dir.display()),
    }
}

/// The validated sockets of one session, ready to serve (docs/security.md). `proxy` is always
/// there; the others only from a client that agreed to `session_sockets`.
#[derive(Debug)]
pub(super) struct SessionSockets {
    pub(super) proxy: std::net::TcpListener,
    pub(super) dns_udp: Option<std::net::UdpSocket>,
    pub(super) dns_tcp: Option<std::net::TcpListener>,
    /// Hook for transparent capture: the listener redirected connections reach
    /// (127.0.0.1:8889 inside). `start_session` holds it open for the session's life (in the
    /// proxy task) until the capture helper serves it there.
    pub(super) capture_tcp: Option<std::net::TcpListener>,
    /// The IPv6 capture listener ([::1]:8889 inside), served like `capture_tcp`; absent when
    /// the sandbox's namespace has no IPv6.
    pub(super) capture_tcp6: Option<std::net::TcpListener>,
    /// The netfilter log socket on which the sandbox's kernel reports each refused UDP
    /// datagram (`proxy::udp` writes their lines).
    pub(super) capture_udp_log: Option<OwnedFd>,
}

/// Validates every passed fd against the kind the request names for it and makes it
/// non-blocking. `named` is `spec.sockets`; empty means the proxy listener alone (every client
/// before `session_sockets`), which must then be the only fd.
fn session_sockets(
    named: &[String],
    capable: bool,
    fds: Vec<OwnedFd>,
) -> Result<(SessionSockets, String), Response> {
    use fdpass::{Handover, ListenerError, SocketKind};
    let refuse = |e: ListenerError| error(ErrorCode::Listener, format!("listener refused: {e}"));
    if fds.is_empty() {
        return Err(error(
            ErrorCode::Listener,
            "no listener fd was passed with the request (SCM_RIGHTS)",
        ));
    }
    if !named.is_empty() && !capable {
        return Err(error(
            ErrorCode::Protocol,
            "session_start names its sockets but the session_sockets capability is not in force on this connection; offer it in hello",
        ));
    }
    let kinds = if named.is_empty() {
        vec![SocketKind::Proxy]
    } else {
        named
            .iter()
            .map(|n| SocketKind::from_name(n).ok_or_else(|| ListenerError::UnknownKind(n.clone())))
            .collect::<Result<Vec<_>, _>>()
            .map_err(refuse)?
    };
    let set = Handover::from_named(&kinds, fds).map_err(refuse)?;
    let mut listen = String::new();
    for (kind, fd) in set.borrowed() {
        let addr = fdpass::validate_socket(kind, fd)
            .map_err(|e| error(ErrorCode::Listener, format!("{kind} socket refused: {e}")))?;
        if kind == SocketKind::Proxy {
            listen = addr.to_string();
        }
    }
    let serve = |e: std::io::Error| {
        error(ErrorCode::Listener, format!("cannot serve the handed-over sockets: {e}"))
    };
    let tcp = |fd: OwnedFd| {
        let l = std::net::TcpListener::from(fd);
        l.set_nonblocking(true).map(|()| l)
    };
    let sockets = SessionSockets {
        proxy: tcp(set.proxy).map_err(serve)?,
        dns_udp: set
            .dns_udp
            .map(|fd| {
                let u = std::net::UdpSocket::from(fd);
                u.set_nonblocking(true).map(|()| u)
            })
            .transpose()
            .map_err(serve)?,
        dns_tcp: set.dns_tcp.map(tcp).transpose().map_err(serve)?,
        capture_tcp: set.capture_tcp.map(tcp).transpose().map_err(serve)?,
        capture_tcp6: set.capture_tcp6.map(tcp).transpose().map_err(serve)?,
        capture_udp_log: set.capture_udp_log,
    };
    Ok((sockets, listen))
}

/// What the blocking half of a session start produced.
struct Prepared {
    spec: SessionSpec,
    id: String,
    built: Arc<Policy>,
    policy_layers: Vec<String>,
    /// `None` for a container session: its proxy runs in its own container.
    sockets: Option<SessionSockets>,
    listen: String,
    resolver: Arc<dyn Resolver>,
    sink: FileAuditSink,
    local: Arc<proxy::hostaddrs::HostAddrs>,
    log_dir: std::path::PathBuf,
    repo_key: String,
    phase_source: super::phase::PhaseSource,
}

/// Every check and every file touched before a session can be served, in the order the errors
/// are reported. Blocking: stat and parse of the managed layer, the test resolver file, the
/// audit log's settlement and journal, `getifaddrs` (first session, or without the watcher).
#[allow(clippy::too_many_arguments)] // the connection's capabilities, each a separate check
fn prepare(
    daemon: &Daemon,
    mut spec: SessionSpec,
    fds: Vec<OwnedFd>,
    capable: bool,
    digests: bool,
    containers: bool,
    reregister: bool,
) -> Result<Prepared, Response> {
    // The managed layer is read here, by the daemon, for every session: the client cannot drop
    // it, and a fix to a broken file applies without a restart.
    let managed = daemon.config_check().map_err(|e| error(ErrorCode::Config, e))?;
    let paths = daemon.paths().map_err(|e| error(ErrorCode::Config, e))?;
    if !crate::repo::is_valid_name(&spec.repo) {
        return Err(error(ErrorCode::Session, format!("invalid repo name {:?}", spec.repo)));
    }
    let id = match (&spec.session, reregister) {
        (Some(id), _) if valid_session_id(id) => id.clone(),
        (Some(id), _) => {
            return Err(error(ErrorCode::Session, format!("invalid session id {id:?}")));
        }
        (None, true) => {
            return Err(error(ErrorCode::Session, "session_reregister needs the session id"));
        }
        (None, false) => audit::new_id(),
    };
    let (mut built, policy_layers, volume, keep, phase_source) =
        session_policy(&daemon.layer_cache, managed.as_ref(), &spec, digests)?;
    // `--phase`: the phase's policy, from the same layers (an unknown phase, or one with an
    // empty allowlist, refuses the session: nothing has started).
    if let Some(phase) = spec.phase.as_deref() {
        built = phase_source.build(Some(phase)).map_err(|m| error(ErrorCode::Phase, m))?;
    }
    // The texts were parsed (or were not needed): the session keeps only their digests.
    for source in &mut spec.config.sources {
        source.text = None;
    }
    let (sockets, listen) = match &spec.container {
        None => session_sockets(&spec.sockets, capable, fds).map(|(s, l)| (Some(s), l))?,
        Some(c) => {
            if !containers {
                return Err(error(
                    ErrorCode::Protocol,
                    "session_start names a container proxy but the container_sessions \
                     capability is not in force on this connection; offer it in hello",
                ));
            }
            if !fds.is_empty() || !spec.sockets.is_empty() {
                return Err(error(
                    ErrorCode::Listener,
                    "a container session hands over no socket (its proxy is the container)",
                ));
            }
            if !matches!(c.engine.as_str(), "docker" | "podman") || c.proxy.is_empty() {
                return Err(error(
                    ErrorCode::Session,
                    format!("invalid container proxy {:?} on {:?}", c.proxy, c.engine),
                ));
            }
            // What `airlock status` and the start record show as where the proxy listens.
            (None, format!("{}:{}", c.engine, c.proxy))
        }
    };
    let resolver = daemon.resolver().map_err(|e| error(ErrorCode::Config, e))?;
    // The checkout's own directory under ~/.airlock/logs (docs/audit-format.md, Files): the one
    // choice every reader and writer makes through `logdir`.
    let repo_path = std::path::Path::new(&spec.repo_path);
    let log_dir = audit::logdir::claim(&paths.logs_root(), &spec.repo, repo_path)
        .map_err(|e| error(ErrorCode::Internal, e.to_string()))?;
    let dir_name =
        log_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if let Some(keep) = keep {
        apply_retention(&log_dir, keep);
    }
    let repo_key = audit::logdir::repo_key(&spec.repo, repo_path);
    let info = SessionInfo {
        session: id.clone(),
        repo: spec.repo.clone(),
        repo_path: Some(spec.repo_path.clone()),
        repo_key: Some(repo_key.clone()),
        user_id: spec.identity.user_id.clone(),
    };
    // A new boot: this session's `seq` restarts at 1 under this instance's `boot`.
    // Below `[audit] min_free` the session does not start (no space, no traffic).
    let sink =
        daemon.logs(&paths).session_sink_in(&dir_name, info, volume).map_err(|e| match e {
            audit::AuditError::LowSpace { .. } => error(ErrorCode::Config, e.to_string()),
            e => error(ErrorCode::Internal, e.to_string()),
        })?;
    Ok(Prepared {
        spec,
        id,
        built,
        policy_layers,
        sockets,
        listen,
        resolver,
        sink,
        // Daemon-wide, kept current by the rtnetlink watcher (re-read here only without it).
        local: {
            let cell = proxy::hostaddrs::watched();
            cell.refresh_unless_watched();
            cell
        },
        log_dir,
        repo_key,
        phase_source,
    })
}

/// Writes the start record of a new (not re-registered) session. Blocking.
fn write_start_record(
    daemon: &Daemon,
    session: &Session,
    policy_digest: String,
    policy_layers: Vec<String>,
) -> Result<(), String> {
    let s = &session.spec;
    let rec = StartRecord {
        id: format!("{}:start", session.id),
        kind: "start",
        ts: session.started_at.clone(),
        session: &session.id,
        boot: &daemon.boot,
        user_id: s.identity.user_id.as_deref(),
        email: s.identity.email.as_deref(),
        repo: &s.repo,
        repo_path: &s.repo_path,
        repo_key: &session.repo_key,
        command: &s.command,
        agent: s.agent.as_deref(),
        agent_version: s.agent_version.as_deref(),
        airlock_version: &s.airlock_version,
        daemon_version: &daemon.version,
        policy_digest,
        policy_layers,
        layers: &s.layers,
        listen: &session.listen,
        phase: s.phase.as_deref(),
    };
    records::append(&session.log_dir, &rec).map_err(|e| e.to_string())
}

pub(super) async fn start_session(
    daemon: &Arc<Daemon>,
    conn: &mut ConnState,
    spec: SessionSpec,
    reregister: bool,
) -> Response {
    if conn.session.is_some() {
        return error(
            ErrorCode::Session,
            "this connection already owns a session; open one connection per session",
        );
    }
    let fds = std::mem::take(&mut conn.fds);
    let capable = conn.capabilities.contains(crate::protocol::SESSION_SOCKETS);
    let digests = conn.capabilities.contains(crate::protocol::LAYER_DIGESTS);
    let containers = conn.capabilities.contains(crate::protocol::CONTAINER_SESSIONS);
    let d = Arc::clone(daemon);
    let prepared =
        match blocking(move || prepare(&d, spec, fds, capable, digests, containers, reregister))
            .await
        {
            Ok(Ok(p)) => p,
            Ok(Err(resp)) => return resp,
            Err(e) => return error(ErrorCode::Internal, e),
        };
    let Prepared {
        spec,
        id,
        built,
        policy_layers,
        sockets,
        listen,
        resolver,
        sink,
        local,
        log_dir,
        repo_key,
        phase_source,
    } = prepared;
    let listening = match sockets.map(Listening::new).transpose() {
        Ok(l) => l,
        Err(resp) => return resp,
    };
    // The effective policy's digest (mode, entries, review hosts — not display names).
    let policy_digest = built.digest();
    let limits = Limits { drain_grace: daemon.options.shutdown_grace, ..Limits::default() };
    let stopped = sink.on_stop();
    let proxy = Arc::new(
        SessionProxy::new(
            built,
            Arc::new(sink),
            resolver,
            limits,
            LocalAddrs::none(),
            proxy::Identity {
                repo: spec.repo.clone(),
                repo_path: Some(spec.repo_path.clone()),
                repo_key: Some(repo_key.clone()),
                user_id: spec.identity.user_id.clone(),
            },
        )
        .with_host_addrs(local)
        .with_gates(Arc::clone(&daemon.gates))
        .with_gate_relay(spec.gate_relay.clone()),
    );
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (drained_tx, drained) = watch::channel(false);
    let session = Arc::new(Session {
        id: id.clone(),
        started_at: now(),
        listen,
        proxy: Arc::clone(&proxy),
        shutdown,
        stopped,
        spec,
        udp_log: std::sync::Mutex::new(None),
        log_dir,
        repo_key,
        drained,
        phases: super::phase::SessionPhases::new(phase_source),
    });
    if let Err(e) = lock(&daemon.sessions).insert(Arc::clone(&session)) {
        return error(ErrorCode::Session, e);
    }
    if !reregister {
        let (d, s) = (Arc::clone(daemon), Arc::clone(&session));
        let digest = format!("sha256:{policy_digest}");
        let written = blocking(move || write_start_record(&d, &s, digest, policy_layers)).await;
        if let Err(e) = written.and_then(|r| r) {
            lock(&daemon.sessions).remove(&id);
            return error(ErrorCode::Internal, e);
        }
        // The phase fixed at start is a `phase` line of its own (`by: "start"`), before any
        // attempt of the session can be served.
        if session.spec.phase.is_some() {
            let s = Arc::clone(&session);
            let written = blocking(move || {
                let policy = s.proxy.policy();
                super::phase::switch(&s.proxy, &s.phases, policy, true).map_err(|e| e.to_string())
            })
            .await;
            if let Err(e) = written.and_then(|r| r) {
                lock(&daemon.sessions).remove(&id);
                return error(ErrorCode::Internal, e);
            }
        }
    }
    match listening {
        Some(listening) => {
            if let Err(e) = serve(daemon, &session, proxy, listening, shutdown_rx, drained_tx) {
                lock(&daemon.sessions).remove(&id);
                return e;
            }
        }
        // Its proxy is a container, which writes the lines: nothing here serves or drains.
        None => {
            drained_tx.send_replace(true);
        }
    }
    // From here on, each switch of this session's phase is told to its supervisor.
    conn.phase_rx = Some(session.phases.changed.subscribe());
    conn.session = Some(Arc::clone(&session));
    daemon.notify_status();
    daemon.activity.notify_one();
    Response::SessionStarted {
        session: id,
        boot: daemon.boot.clone(),
        listen: session.listen.clone(),
    }
}

/// A native session's sockets, its proxy listener already registered with the runtime.
struct Listening {
    tcp: tokio::net::TcpListener,
    dns_udp: Option<std::net::UdpSocket>,
    dns_tcp: Option<std::net::TcpListener>,
    capture_tcp: Option<std::net::TcpListener>,
    capture_tcp6: Option<std::net::TcpListener>,
    capture_udp_log: Option<OwnedFd>,
}

impl Listening {
    /// Fails (before the session is recorded anywhere) when the listener cannot be served.
    fn new(sockets: SessionSockets) -> Result<Self, Response> {
        let SessionSockets { proxy, dns_udp, dns_tcp, capture_tcp, capture_tcp6, capture_udp_log } =
            sockets;
        let tcp = tokio::net::TcpListener::from_std(proxy)
            .map_err(|e| error(ErrorCode::Listener, format!("cannot serve the listener: {e}")))?;
        Ok(Self { tcp, dns_udp, dns_tcp, capture_tcp, capture_tcp6, capture_udp_log })
    }
}

/// Serves a native session's proxy, resolver and capture sockets until the session ends or
/// the daemon stops; `drained_tx` becomes true once every one of them has finished.
fn serve(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    proxy: Arc<SessionProxy>,
    listening: Listening,
    shutdown_rx: watch::Receiver<bool>,
    drained_tx: watch::Sender<bool>,
) -> Result<(), Response> {
    let Listening { tcp, dns_udp, dns_tcp, capture_tcp, capture_tcp6, capture_udp_log } = listening;
    // Serve the proxy on the validated listener until the session ends or the daemon stops.
    daemon.running_proxies.fetch_add(1, Ordering::SeqCst);
    let d = Arc::clone(daemon);
    let sid = session.id.clone();
    // The resolver on the sandbox's 127.0.0.53 (UDP and TCP), until the session ends.
    let udp = dns_udp.map(tokio::net::UdpSocket::from_std).transpose();
    let dns_tcp = dns_tcp.map(tokio::net::TcpListener::from_std).transpose();
    let (udp, dns_tcp) = match (udp, dns_tcp) {
        (Ok(u), Ok(t)) => (u, t),
        (Err(e), _) | (_, Err(e)) => {
            d.running_proxies.fetch_sub(1, Ordering::SeqCst);
            return Err(error(
                ErrorCode::Listener,
                format!("cannot serve the resolver sockets: {e}"),
            ));
        }
    };
    let dns =
        tokio::spawn(proxy::dns::serve(udp, dns_tcp, Arc::clone(&proxy), shutdown_rx.clone()));
    // Transparent capture: the redirected connections of the sandbox, until the session ends.
    let held = proxy::transparent::serve_in_background(capture_tcp, &proxy, &shutdown_rx);
    let held6 = proxy::transparent::serve_in_background(capture_tcp6, &proxy, &shutdown_rx);
    // Refused UDP: one line per datagram the sandbox's kernel reports, until the session ends.
    *lock(&session.udp_log) =
        proxy::udp::serve_in_background(capture_udp_log, &proxy, &shutdown_rx);
    let handle = tokio::spawn(async move {
        if let Err(e) = proxy::serve_session(tcp, proxy, shutdown_rx).await {
            tracing::error!("session {sid}: proxy failed: {e}");
        }
        // The capture listeners and the resolver stop on the same signal, with the same
        // grace: once they are done too, every line of the session is written (its end
        // record's `audit_root` waits for this).
        for task in [held, held6].into_iter().flatten() {
            let _ = task.await;
        }
        let _ = dns.await;
        drained_tx.send_replace(true);
        d.running_proxies.fetch_sub(1, Ordering::SeqCst);
        d.activity.notify_one();
    });
    let mut proxies = lock(&daemon.proxies);
    proxies.retain(|h| !h.is_finished());
    proxies.push(handle);
    Ok(())
}

/// How long a session's end waits at most for its UDP refusal reader to drain. The wait ends
/// as soon as the reader is done (normally at once); this bounds only a stuck reader. 2 s was
/// too short on a loaded machine: the end record was written, and `airlock exec` returned,
/// before the lines of a refusal flood were.
const UDP_DRAIN: std::time::Duration = std::time::Duration::from_secs(15);

/// How long after the grace period a session's end waits for its proxy to have closed (and
/// logged) its remaining connections before rooting its lines.
const DRAIN_MARGIN: Duration = Duration::from_secs(2);

/// The longest a session's end waits for that drain, whatever `--shutdown-grace` says: with
/// [`UDP_DRAIN`] it stays below the 40 s the client waits for `session_end`'s answer. Past it
/// the end record says why it has no `audit_root`.
const DRAIN_WAIT_CAP: Duration = Duration::from_secs(15);

/// The end record's `audit_root` (docs/evidence.md): the session's lines in `log_dir`, rooted
/// and signed with this machine's key (made now if there is none) — or why there is none. Never
/// fails the session's end. Blocking (reads the session's audit files).
fn seal_audit_root(
    paths: Result<crate::paths::Paths, String>,
    log_dir: &std::path::Path,
    session: &str,
    complete: bool,
) -> (Option<AuditRoot>, Option<String>) {
    if !complete {
        return (
            None,
            Some(
                "the session's connections were still closing when it ended, so its lines \
                 are not all written"
                    .into(),
            ),
        );
    }
    let signer =
        match paths.and_then(|p| machine_key::load_or_create(&p).map_err(|e| e.to_string())) {
            Ok(k) => k,
            Err(e) => return (None, Some(format!("no machine key: {e}"))),
        };
    match audit::root::seal(log_dir, session, &signer) {
        Ok(root) => (Some(root), None),
        Err(e) => (None, Some(e.to_string())),
    }
}

pub(super) async fn end_session(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    end: &SessionEnd,
    reason: Option<&'static str>,
) {
    // Held attempts first: their waits end now (each then writes its `abandoned` step and
    // final line as its task finishes, like any attempt the proxy's drain ends).
    daemon.gates.abandon_session(&session.id);
    session.stop_proxy();
    // The sandbox is gone, but the kernel may still hold reports of datagrams it refused:
    // the reader writes them (and the session's pending summaries) before the end record,
    // so the log is complete when `airlock exec` returns.
    let udp_log = lock(&session.udp_log).take();
    if let Some(reader) = udp_log
        && tokio::time::timeout(UDP_DRAIN, reader).await.is_err()
    {
        tracing::warn!("session {}: the UDP refusal log did not drain in time", session.id);
    }
    // Every pending `suppressed` summary, now rather than when the proxy's drain gets to it.
    let audit = Arc::clone(&session.proxy.audit);
    match blocking(move || audit.flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!("session {}: cannot write summaries: {e}", session.id),
        Err(e) => tracing::error!("session {}: summary flush failed: {e}", session.id),
    }
    // Every line of the session is written before its lines are rooted: its tunnels get the
    // grace period, then are closed and logged. Bounded, like the daemon's own shutdown.
    let bound = (daemon.options.shutdown_grace + DRAIN_MARGIN).min(DRAIN_WAIT_CAP);
    let mut drained = session.drained.clone();
    let complete = matches!(tokio::time::timeout(bound, drained.wait_for(|d| *d)).await, Ok(Ok(_)));
    if !complete {
        tracing::warn!(
            "session {}: its connections were still closing {}s after it ended",
            session.id,
            bound.as_secs()
        );
    }
    // A session the `[audit]` bounds stopped says so in its end record.
    let reason = reason.or_else(|| session.stopped.borrow().as_ref().map(|n| n.reason.as_str()));
    let stats = session.proxy.stats();
    lock(&daemon.sessions).remove(&session.id);
    let (d, s, end) = (Arc::clone(daemon), Arc::clone(session), end.clone());
    let written = blocking(move || {
        // No phase switch from here on: one that got the session before it was removed above
        // would otherwise write its line after the root is sealed (outside it) and report
        // success for a session that is gone. Switches hold `log` while they write.
        let phases = lock(&s.phases.log);
        s.phases.ended.store(true, std::sync::atomic::Ordering::SeqCst);
        let (audit_root, audit_root_error) =
            seal_audit_root(d.paths(), &s.log_dir, &s.id, complete);
        if let Some(e) = &audit_root_error {
            tracing::warn!("session {}: no audit root in its end record: {e}", s.id);
        }
        let rec = EndRecord {
            id: format!("{}:end", s.id),
            kind: "end",
            ts: now(),
            session: &s.id,
            boot: &d.boot,
            repo: &s.spec.repo,
            repo_key: &s.repo_key,
            user_id: s.spec.identity.user_id.as_deref(),
            exit_status: end.exit_status,
            transcripts: &end.transcripts,
            quarantined: &end.quarantined,
            leftovers: &end.leftovers,
            end_reason: reason,
            tunnels: stats.tunnels_total,
            bytes_sent: stats.bytes_sent,
            bytes_recv: stats.bytes_recv,
            audit_root,
            audit_root_error,
            phases: &phases,
        };
        if let Err(e) = records::append(&s.log_dir, &rec) {
            tracing::error!("cannot write the end record of {}: {e}", s.id);
        }
    })
    .await;
    if let Err(e) = written {
        tracing::error!("cannot write the end record of {}: {e}", session.id);
    }
    daemon.notify_status();
    daemon.activity.notify_one();
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn policy_for(spec: &SessionSpec) -> Result<(Arc<Policy>, Vec<String>), String> {
        session_policy(&Default::default(), None, spec, false)
            .map(|(b, l, _, _, _)| (b, l))
            .map_err(|r| format!("{r:?}"))
    }

    /// The end record's root: signed with the machine key (made on first use); without a key
    /// (here `~/.airlock/keys` is a file), or with lines still to come, a reason instead.
    #[test]
    fn the_audit_root_is_sealed_with_the_machine_key_or_says_why_not() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = crate::paths::Paths::with_home(tmp.path().join("home"));
        let dir = paths.logs_root().join("r");
        let log = audit::RepoLog::open(&dir, "b").unwrap();
        let sink = log.session_sink(SessionInfo { session: "s1".into(), ..Default::default() });
        use crate::audit::AuditSink;
        sink.append(&sink.line("a.test", Some(443), "CONNECT")).unwrap();
        drop(sink);
        drop(log);
        let (root, err) = seal_audit_root(Ok(paths.clone()), &dir, "s1", true);
        let root = root.unwrap();
        assert_eq!((root.lines, err), (1, None));
        let key = machine_key::load(&paths).unwrap().unwrap();
        assert_eq!(root.key, key.verifier().to_string());

        let (root, err) = seal_audit_root(Ok(paths.clone()), &dir, "s1", false);
        assert!(root.is_none());
        assert!(err.unwrap().contains("still closing"));

        let other = crate::paths::Paths::with_home(tmp.path().join("other"));
        std::fs::create_dir_all(other.airlock_dir()).unwrap();
        std::fs::write(other.keys_dir(), "not a directory").unwrap();
        let (root, err) = seal_audit_root(Ok(other), &dir, "s1", true);
        assert!(root.is_none());
        assert!(err.unwrap().starts_with("no machine key: "));
        let (root, err) = seal_audit_root(Err("HOME is not set".into()), &dir, "s1", true);
        assert!(root.is_none());
        assert!(err.unwrap().contains("HOME is not set"));
    }

    #[test]
    fn session_ids_are_short_safe_names() {
        assert!(valid_session_id("0123abcd-ef_9"));
        assert!(!valid_session_id(""));
        assert!(!valid_session_id("a/b"));
        assert!(!valid_session_id("a b"));
        assert!(!valid_session_id(&"a".repeat(129)));
        assert!(valid_session_id(&"a".repeat(128)));
    }

    #[test]
    fn the_managed_layer_is_always_in_the_sessions_policy() {
        let layer = |kind, name: &str, toml: &str| {
            crate::config::parse_layer(kind, name, toml.as_bytes()).unwrap().doc
        };
        use crate::policy::LayerKind;
        let managed =
            layer(LayerKind::Managed, "managed.toml", "[network]\nblock = [\"b.test\"]\n");
        let user =
            layer(LayerKind::User, "~/.airlock/config.toml", "[network]\nallow = [\"b.test\"]\n");
        let spec = SessionSpec {
            config: (&crate::config::ClientLayers {
                user: Some(user.clone()),
                ..Default::default()
            })
                .into(),
            ..Default::default()
        };
        let cache = Default::default();
        let (built, layers, _, _, _) =
            session_policy(&cache, Some(&managed), &spec, false).unwrap();
        assert_eq!(
            layers,
            [
                format!("managed.toml@sha256:{}", managed.digest),
                format!("~/.airlock/config.toml@sha256:{}", user.digest)
            ]
        );
        let (without, _, _, _, _) = session_policy(&cache, None, &spec, false).unwrap();
        assert_ne!(built.digest(), without.digest());
    }

    #[test]
    fn layers_by_digest_need_the_capability_and_give_the_same_policy_as_documents() {
        let text = "[network]\nallow = [\"b.test\"]\n";
        let user = crate::config::parse_layer(
            crate::policy::LayerKind::User,
            "~/.airlock/config.toml",
            text.as_bytes(),
        )
        .unwrap()
        .doc;
        let by_docs = SessionSpec {
            config: (&crate::config::ClientLayers {
                user: Some(user.clone()),
                ..Default::default()
            })
                .into(),
            ..Default::default()
        };
        let mut by_content = SessionSpec::default();
        by_content.config.sources = vec![crate::protocol::LayerSource {
            kind: crate::protocol::LayerKind::User,
            name: "~/.airlock/config.toml".into(),
            digest: user.digest.clone(),
            text: Some(text.into()),
        }];
        let cache = Default::default();
        let code = |r: Result<_, Response>| match r {
            Err(Response::Error { code, .. }) => code,
            other => panic!("expected an error, got {other:?}"),
        };
        // Not agreed at hello: refused, not silently treated as "no layers".
        assert_eq!(code(session_policy(&cache, None, &by_content, false)), ErrorCode::Protocol);
        // Documents and sources at once: ambiguous, refused.
        let mut both = by_content.clone();
        both.config.user = by_docs.config.user.clone();
        assert_eq!(code(session_policy(&cache, None, &both, true)), ErrorCode::Protocol);
        let (a, la, _, _, _) = session_policy(&cache, None, &by_docs, false).unwrap();
        let (b, lb, _, _, _) = session_policy(&cache, None, &by_content, true).unwrap();
        assert_eq!((a.digest(), la), (b.digest(), lb));
        // The digest alone now finds the parsed layer; an unknown one asks for the text.
        let mut bare = by_content.clone();
        bare.config.sources[0].text = None;
        assert!(session_policy(&cache, None, &bare, true).is_ok());
        bare.config.sources[0].digest = crate::config::digest(b"other");
        assert_eq!(code(session_policy(&cache, None, &bare, true)), ErrorCode::UnknownLayer);
    }
}
