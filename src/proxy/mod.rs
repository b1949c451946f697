//! The egress proxy (DESIGN §4–§5, SECURITY §3): the only way out of a sandbox. Every attempt
//! — a `CONNECT` tunnel or a plain-HTTP request — is parsed strictly, decided by the policy,
//! written to the audit trail *before* anything is forwarded, resolved exactly once, checked
//! answer by answer against the address guard, dialed, and (for TLS) checked for an SNI that
//! matches the target. Allowed tunnels are spliced in the kernel.
//!
//! The daemon calls [`serve_session`] with a listener and an [`Arc<SessionProxy>`]; the
//! standalone `airlockd proxy` ([`standalone`]) does the same in the foreground.
//!
//! Rooms: [`head`] (request heads), [`connect`] (tunnels), [`http`] (plain HTTP via hyper),
//! [`guard`] (policy, resolver and address-guard glue), [`splice`] (the pump), [`tls_peek`]
//! (ClientHello/SNI), [`gatehold`] (attempts held for a gate decision), [`resolver`],
//! [`respond`] (refusal responses and audit lines), [`dns`] (the
//! sandbox's resolver on 127.0.0.53) and [`synthetic`] (its per-session synthetic addresses,
//! mapped back to names where a target is parsed).

pub mod connect;
pub mod dns;
pub mod gatehold;
pub mod guard;
pub mod head;
pub mod hostaddrs;
pub mod http;
pub mod resolver;
pub mod respond;
pub mod splice;
pub mod standalone;
pub mod synthetic;
pub mod tls_peek;
pub mod toolgate;
pub mod transparent;
pub mod udp;

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::audit::AuditSink;
use crate::policy::{LocalAddrs, Policy};

pub use resolver::{Resolver, SystemResolver};

/// Timeouts and caps; every one is on by default (issue 3 item 6) and configurable.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Time for a whole request head to arrive (slow-drip defense).
    pub header_timeout: Duration,
    /// Largest accepted request head, in bytes (beyond: 431).
    pub max_header_bytes: usize,
    /// Name resolution.
    pub dns_timeout: Duration,
    /// Dialing all of a target's checked addresses.
    pub connect_timeout: Duration,
    /// A tunnel with no byte in either direction for this long is closed.
    pub idle_timeout: Duration,
    /// Open tunnels per session (beyond: 503, audited `tunnel_limit`).
    pub max_tunnels: usize,
    /// Time for the agent's ClientHello to arrive after `200`.
    pub client_hello_timeout: Duration,
    /// Largest ClientHello accepted for the SNI check.
    pub max_client_hello: usize,
    /// On shutdown: how long open connections may finish before they are closed and logged
    /// `interrupted`.
    pub drain_grace: Duration,
    /// Distinct names the resolver gives synthetic addresses per session (beyond: SERVFAIL,
    /// audited `dns_limit`).
    pub max_synthetic: usize,
    /// Open client connections per session — heads being read, kept-alive HTTP and tunnels
    /// (each of which holds at most one upstream connection). Beyond: 503, audited
    /// `connection_limit` (rate-limited like every refusal).
    pub max_connections: usize,
    /// Open client connections over every session of this process (the daemon's fd budget);
    /// beyond: the same refusal.
    pub max_daemon_connections: usize,
    /// The process-wide count `max_daemon_connections` is checked against.
    pub daemon_connections: DaemonConnections,
    /// Host-side name resolutions in flight at once per session (at least 1). An attempt past
    /// it waits for a slot within its DNS timeout, then is refused `503`, audited `dns_limit`
    /// ([`guard::resolve_checked`]).
    pub max_resolutions: usize,
    /// The process-wide resolution slots every session also takes one of (the same wait and
    /// refusal); [`Default`] is the one shared by every session of the process.
    pub daemon_resolutions: DaemonResolutions,
}

/// Default [`Limits::max_resolutions`]: resolutions in flight per session.
pub const DEFAULT_MAX_RESOLUTIONS: usize = 32;

/// Default capacity of [`DaemonResolutions`]: resolutions in flight per process. The system
/// resolver runs `getaddrinfo(3)` on tokio's blocking pool (512 threads by default), which the
/// audit appends and summary flushes share; a slow or black-holed DNS server must not be able
/// to occupy all of it, so resolutions get at most a quarter.
pub const DEFAULT_DAEMON_RESOLUTIONS: usize = 128;

/// The process-wide host-side resolution slots: a FIFO semaphore (tokio's is fair, so a waiting
/// attempt is not overtaken indefinitely).
#[derive(Debug, Clone)]
pub struct DaemonResolutions {
    slots: Arc<tokio::sync::Semaphore>,
    capacity: usize,
}

impl DaemonResolutions {
    /// Slots of its own, `capacity` of them (tests, benches).
    pub fn isolated(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        Self { slots: Arc::new(tokio::sync::Semaphore::new(capacity)), capacity }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Resolutions holding a slot right now.
    pub fn in_flight(&self) -> usize {
        self.capacity - self.slots.available_permits()
    }
}

impl Default for DaemonResolutions {
    fn default() -> Self {
        static SHARED: std::sync::OnceLock<DaemonResolutions> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| Self::isolated(DEFAULT_DAEMON_RESOLUTIONS)).clone()
    }
}

/// The process-wide count of open client connections; [`Default`] is the one shared by every
/// session of the process (tests pass their own).
#[derive(Debug, Clone)]
pub struct DaemonConnections(Arc<AtomicUsize>);

impl DaemonConnections {
    /// A counter of its own (tests).
    pub fn isolated() -> Self {
        Self(Arc::new(AtomicUsize::new(0)))
    }

    pub fn open(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

impl Default for DaemonConnections {
    fn default() -> Self {
        static SHARED: std::sync::OnceLock<Arc<AtomicUsize>> = std::sync::OnceLock::new();
        Self(Arc::clone(SHARED.get_or_init(|| Arc::new(AtomicUsize::new(0)))))
    }
}

/// Claims one slot of `counter` below `cap`, or `false` at the cap.
fn claim(counter: &AtomicUsize, cap: usize) -> bool {
    let mut cur = counter.load(Ordering::Relaxed);
    loop {
        if cur >= cap {
            return false;
        }
        match counter.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            dns_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(15 * 60),
            max_tunnels: 512,
            client_hello_timeout: Duration::from_secs(10),
            max_client_hello: 64 * 1024,
            drain_grace: Duration::from_secs(5),
            max_synthetic: synthetic::DEFAULT_CAPACITY,
            // The report: 20k idle connections exhausted the daemon's descriptors.
            // Each connection may hold two fds (client and upstream); the daemon raises its
            // soft RLIMIT_NOFILE, and these keep well inside common hard limits.
            max_connections: 1024,
            max_daemon_connections: 8192,
            daemon_connections: DaemonConnections::default(),
            max_resolutions: DEFAULT_MAX_RESOLUTIONS,
            daemon_resolutions: DaemonResolutions::default(),
        }
    }
}

/// Who the session's lines are attributed to (audit `repo`, `repo_path`, `user_id`).
#[derive(Debug, Clone, Default)]
pub struct Identity {
    pub repo: String,
    pub repo_path: Option<String>,
    /// The checkout's repo key (audit `repo_key`).
    pub repo_key: Option<String>,
    pub user_id: Option<String>,
}

/// One session's proxy: its policy, audit sink, resolver, limits and live counters. Shared by
/// every connection task of the session.
pub struct SessionProxy {
    /// The policy in force: replaced whole by a phase switch ([`SessionProxy::switch_policy`]),
    /// never changed in place; each attempt takes one snapshot ([`respond::begin`]).
    policy: std::sync::RwLock<Arc<Policy>>,
    pub(crate) audit: Arc<dyn AuditSink>,
    pub(crate) resolver: Arc<dyn Resolver>,
    pub(crate) limits: Limits,
    /// The host's own addresses, read per connection attempt ([`SessionProxy::local`]).
    pub(crate) local: Arc<hostaddrs::HostAddrs>,
    pub(crate) identity: Identity,
    pub(crate) counters: Counters,
    /// Turns true when the drain grace is over: open tunnels close and log `interrupted`.
    pub(crate) kill: watch::Sender<bool>,
    /// The names the sandbox's resolver answered with synthetic addresses ([`dns`]).
    pub(crate) synthetic: synthetic::SyntheticTable,
    /// This session's host-side resolution slots ([`Limits::max_resolutions`]).
    pub(crate) resolutions: Arc<tokio::sync::Semaphore>,
    /// Where gated attempts wait for a decision ([`gatehold`]); `None` (the standalone proxy):
    /// a gated attempt is refused `gate_unavailable`.
    pub(crate) gates: Option<Arc<crate::gate::GateBook>>,
    /// This session's gates are decided on a review server, relayed by its supervisor
    /// (protocol capability `gate_relay`): local decisions are refused.
    pub(crate) gate_relay: Option<crate::protocol::GateRelaySpec>,
}

impl std::fmt::Debug for SessionProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionProxy")
            .field("identity", &self.identity)
            .field("limits", &self.limits)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub(crate) struct Counters {
    pub(crate) connections: AtomicUsize,
    pub(crate) tunnels: AtomicUsize,
    pub(crate) tunnels_total: AtomicU64,
    pub(crate) requests_total: AtomicU64,
    pub(crate) bytes: splice::Meter,
    started: Instant,
    /// Milliseconds since `started` of the last connection start or end.
    last_ms: AtomicU64,
}

impl Counters {
    fn touch(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }
}

/// A snapshot of a session's counters (`airlock status`, idle exit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyStats {
    /// Open client connections (tunnels, kept-alive HTTP, heads being read).
    pub active_connections: usize,
    /// Open CONNECT tunnels.
    pub active_tunnels: usize,
    pub tunnels_total: u64,
    pub http_requests_total: u64,
    /// Agent → upstream bytes, all tunnels and requests so far.
    pub bytes_sent: u64,
    /// Upstream → agent bytes.
    pub bytes_recv: u64,
    /// Time since a connection last started or ended; zero while any is open.
    pub idle_for: Duration,
}

impl SessionProxy {
    /// `local` is the host's own interface addresses, fixed for this session
    /// ([`local_addrs`]); [`SessionProxy::with_host_addrs`] makes them follow the host's.
    pub fn new(
        policy: Arc<Policy>,
        audit: Arc<dyn AuditSink>,
        resolver: Arc<dyn Resolver>,
        limits: Limits,
        local: LocalAddrs,
        identity: Identity,
    ) -> Self {
        let (kill, _) = watch::channel(false);
        let synthetic = synthetic::SyntheticTable::new(limits.max_synthetic);
        let resolutions = Arc::new(tokio::sync::Semaphore::new(
            limits.max_resolutions.clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
        ));
        Self {
            policy: std::sync::RwLock::new(policy),
            audit,
            resolver,
            limits,
            local: hostaddrs::HostAddrs::fixed(local),
            identity,
            counters: Counters {
                connections: AtomicUsize::new(0),
                tunnels: AtomicUsize::new(0),
                tunnels_total: AtomicU64::new(0),
                requests_total: AtomicU64::new(0),
                bytes: splice::Meter::default(),
                started: Instant::now(),
                last_ms: AtomicU64::new(0),
            },
            kill,
            synthetic,
            resolutions,
            gates: None,
            gate_relay: None,
        }
    }

    /// Gated attempts of this session wait in `book` for a decision.
    pub fn with_gates(mut self, book: Arc<crate::gate::GateBook>) -> Self {
        self.gates = Some(book);
        self
    }

    /// This session's gates are decided on the review server `relay` names, and only through
    /// its supervisor's relay key.
    pub fn with_gate_relay(mut self, relay: Option<crate::protocol::GateRelaySpec>) -> Self {
        self.gate_relay = relay;
        self
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The host addresses follow `cell` (the process-wide [`hostaddrs::watched`] one) instead
    /// of the fixed set given to [`SessionProxy::new`].
    pub fn with_host_addrs(mut self, cell: Arc<hostaddrs::HostAddrs>) -> Self {
        self.local = cell;
        self
    }

    /// The policy in force now. An attempt takes it once, with its `seq`
    /// ([`respond::begin`]), and decides everything with that one snapshot.
    pub fn policy(&self) -> Arc<Policy> {
        Arc::clone(&self.policy.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// A fresh stamp and the policy in force, taken together: no phase switch falls between
    /// them, so an attempt's `seq` orders it correctly against the switch's line.
    pub(crate) fn stamp_with_policy(&self) -> (crate::audit::Stamp, Arc<Policy>) {
        let guard = self.policy.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        (self.audit.stamp(), Arc::clone(&guard))
    }

    /// Puts `policy` in force (a phase switch, docs/audit-format.md "Phase lines"): under
    /// the write lock, so no attempt starts meanwhile, it stamps and appends the `phase` line
    /// made by `line` from the stamp and the previous phase, and only once that line is
    /// written swaps the policy (fail closed: an unwritten switch does not happen). Blocking
    /// (one append). Returns the line written.
    pub fn switch_policy(
        &self,
        policy: Arc<Policy>,
        line: impl FnOnce(crate::audit::Stamp, Option<&str>) -> crate::audit::AuditLine,
    ) -> Result<crate::audit::AuditLine, crate::audit::AuditError> {
        let mut guard = self.policy.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let written = line(self.audit.stamp(), guard.phase());
        self.audit.append(&written)?;
        *guard = policy;
        Ok(written)
    }

    /// The host's own addresses as of now, for one decision of the address guard.
    pub(crate) fn local(&self) -> Arc<LocalAddrs> {
        self.local.current()
    }

    pub fn stats(&self) -> ProxyStats {
        let c = &self.counters;
        let active_connections = c.connections.load(Ordering::Relaxed);
        let idle_for = if active_connections > 0 {
            Duration::ZERO
        } else {
            let last = Duration::from_millis(c.last_ms.load(Ordering::Relaxed));
            c.started.elapsed().saturating_sub(last)
        };
        ProxyStats {
            active_connections,
            active_tunnels: c.tunnels.load(Ordering::Relaxed),
            tunnels_total: c.tunnels_total.load(Ordering::Relaxed),
            http_requests_total: c.requests_total.load(Ordering::Relaxed),
            bytes_sent: c.bytes.sent.load(Ordering::Relaxed),
            bytes_recv: c.bytes.recv.load(Ordering::Relaxed),
            idle_for,
        }
    }

    /// Claims a tunnel slot, or `None` at the cap.
    pub(crate) fn claim_tunnel(self: &Arc<Self>) -> Option<TunnelSlot> {
        let c = &self.counters;
        let mut cur = c.tunnels.load(Ordering::Relaxed);
        loop {
            if cur >= self.limits.max_tunnels {
                return None;
            }
            match c.tunnels.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        c.tunnels_total.fetch_add(1, Ordering::Relaxed);
        Some(TunnelSlot(Arc::clone(self)))
    }
}

/// A held tunnel slot; released on drop.
pub(crate) struct TunnelSlot(Arc<SessionProxy>);

impl Drop for TunnelSlot {
    fn drop(&mut self) {
        self.0.counters.tunnels.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts an open client connection (session and process); released on drop.
struct ConnGuard(Arc<SessionProxy>);

impl ConnGuard {
    /// A slot under both caps, or `None` (the connection is refused `connection_limit`).
    fn claim(s: &Arc<SessionProxy>) -> Option<Self> {
        let daemon = &s.limits.daemon_connections.0;
        if !claim(daemon, s.limits.max_daemon_connections) {
            return None;
        }
        if !claim(&s.counters.connections, s.limits.max_connections) {
            daemon.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        s.counters.touch();
        Some(Self(Arc::clone(s)))
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.counters.connections.fetch_sub(1, Ordering::AcqRel);
        self.0.limits.daemon_connections.0.fetch_sub(1, Ordering::AcqRel);
        self.0.counters.touch();
    }
}

/// A connection over a cap: one audited line (rate-limited by the sink like any identical
/// refusal), a `503`, and the socket closed without reading its head.
async fn refuse_connection(session: Arc<SessionProxy>, mut sock: TcpStream, over_cap: OverCap) {
    let mut line = respond::new_line(&session, "", None, "");
    line.reason = Some(crate::policy::Reason::ConnectionLimit);
    line.layer = Some(crate::policy::LayerKind::None);
    line.duration_ms = Some(0);
    if over_cap == OverCap::Reset {
        line.capture = Some(crate::audit::Capture::Transparent);
        let audit = Arc::clone(&session.audit);
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || audit.append(&line)).await {
            tracing::error!("cannot write the audit line of an over-cap captured connection: {e}");
        }
        transparent::reset(sock);
        return;
    }
    let reason = crate::policy::Reason::ConnectionLimit;
    let detail = format!(
        "at most {} open connections per session and {} per daemon",
        session.limits.max_connections, session.limits.max_daemon_connections
    );
    let audit = Arc::clone(&session.audit);
    let written = tokio::task::spawn_blocking(move || audit.append(&line)).await;
    let bytes = match written {
        Ok(Ok(())) => respond::response_bytes(
            respond::Status::Unavailable,
            reason,
            crate::policy::LayerKind::None,
            &respond::body_for("this connection", reason, Some(&detail)),
        ),
        Ok(Err(e)) => respond::audit_failed(&e, "this connection"),
        Err(_) => return,
    };
    respond::send_and_close(&mut sock, &bytes).await;
}

/// The host's own interface addresses (`getifaddrs(3)`), refused by the address guard unless
/// `allow_private` opens them. Re-read on every address change ([`hostaddrs`]); an error
/// yields an empty set plus a warning (the special-purpose table still covers loopback and
/// private ranges).
pub fn local_addrs() -> LocalAddrs {
    let mut out = Vec::new();
    match nix::ifaddrs::getifaddrs() {
        Ok(addrs) => {
            for a in addrs {
                let Some(sa) = a.address else { continue };
                if let Some(v4) = sa.as_sockaddr_in() {
                    out.push(std::net::IpAddr::V4(v4.ip()));
                } else if let Some(v6) = sa.as_sockaddr_in6() {
                    out.push(std::net::IpAddr::V6(v6.ip()));
                }
            }
        }
        Err(e) => tracing::warn!("cannot list interface addresses: {e}"),
    }
    out.sort();
    out.dedup();
    LocalAddrs::new(out)
}

/// While a session floods (its identical refusals are being suppressed, `[audit] burst`), each
/// of its listeners accepts at most one connection per this interval: ~500 per second. The
/// flooding process then waits in `connect(2)` instead of costing the daemon CPU that other
/// sessions' connections need (measured by `benches/flood.rs`); nothing is refused or
/// uncounted because of it.
pub const FLOOD_ACCEPT_PACE: Duration = Duration::from_millis(2);

/// Serves one session's listener until `shutdown` turns true (or its sender is dropped), then
/// drains: stops accepting, lets open connections finish for [`Limits::drain_grace`], then
/// closes the rest (their tunnels are logged `"interrupted": true`). Returns when every
/// connection task has ended.
pub async fn serve_session(
    listener: TcpListener,
    session: Arc<SessionProxy>,
    shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    serve_with(listener, session, shutdown, handle_connection, OverCap::Http).await
}

/// How a connection past the connection caps is answered, after its `connection_limit` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OverCap {
    /// The explicit proxy's clients speak HTTP: a `503` saying why.
    Http,
    /// A captured connection may speak anything (ssh, TLS, a database protocol): an HTTP
    /// answer would be read as that protocol's garbage, so it is reset, as other refusals of
    /// captured connections are.
    Reset,
}

/// The accept loop and drain of [`serve_session`], with `handler` run for each connection
/// (the explicit proxy's head reader, or [`transparent`]'s capture handler).
pub(crate) async fn serve_with<F, Fut>(
    listener: TcpListener,
    session: Arc<SessionProxy>,
    mut shutdown: watch::Receiver<bool>,
    handler: F,
    over_cap: OverCap,
) -> io::Result<()>
where
    F: Fn(Arc<SessionProxy>, TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut tasks: JoinSet<()> = JoinSet::new();
    // Once a second: write the suppressed-refusal summaries whose interval is over
    // (`audit::volume`), so a flood that stops is summarised within about a second.
    let mut tick = tokio::time::interval(Duration::from_millis(crate::audit::volume::INTERVAL_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = stopped(&mut shutdown) => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            _ = tick.tick() => flush_audit(&session, false).await,
            accepted = listener.accept() => match accepted {
                Ok((sock, _peer)) => {
                    let s = Arc::clone(&session);
                    match ConnGuard::claim(&s) {
                        Some(conn) => {
                            let served = handler(s, sock);
                            tasks.spawn(async move {
                                let _conn = conn;
                                served.await
                            })
                        }
                        None => tasks.spawn(refuse_connection(s, sock, over_cap)),
                    };
                    if session.audit.flooding() {
                        // Accepts only: every attempt still gets its line (or its place in a
                        // summary); the rest wait in the listen backlog.
                        tokio::time::sleep(FLOOD_ACCEPT_PACE).await;
                    }
                }
                Err(e) => {
                    // EMFILE/ENFILE/ENOBUFS: back off instead of spinning; the listener
                    // stays usable once descriptors free up.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    let grace = tokio::time::sleep(session.limits.drain_grace);
    tokio::pin!(grace);
    loop {
        tokio::select! {
            () = &mut grace => break,
            _ = tick.tick() => flush_audit(&session, false).await,
            joined = tasks.join_next() => if joined.is_none() {
                flush_audit(&session, true).await;
                return Ok(());
            },
        }
    }
    let _ = session.kill.send(true);
    while tasks.join_next().await.is_some() {}
    // Graceful drain: every pending summary is written, so no count is lost.
    flush_audit(&session, true).await;
    Ok(())
}

/// Writes the due (or, with `all`, every) suppressed-refusal summary off the async workers
/// (it is file I/O); a failure is logged and the summaries stay pending for the next try.
async fn flush_audit(session: &Arc<SessionProxy>, all: bool) {
    let audit = Arc::clone(&session.audit);
    let done = tokio::task::spawn_blocking(move || if all { audit.flush() } else { audit.tick() });
    match done.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "cannot write suppressed-refusal summaries"),
        Err(e) => tracing::error!(error = %e, "suppressed-refusal flush task failed"),
    }
}

/// Resolves when the flag turns true or its sender is gone (the watch `Ref` is dropped at
/// once: it holds a lock and must not live across an await).
pub(crate) async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// One client connection: read and check the first head, then hand off to the tunnel code or
/// to the plain-HTTP server.
async fn handle_connection(session: Arc<SessionProxy>, mut sock: TcpStream) {
    let _ = sock.set_nodelay(true);
    let mut buf = Vec::with_capacity(1024);
    let limits = &session.limits;
    let head = head::read_head(&mut sock, &mut buf, limits.max_header_bytes, limits.header_timeout);
    let head_len = match head.await {
        Ok(n) => n,
        Err(head::HeadError::Empty) | Err(head::HeadError::Io) => return,
        Err(head::HeadError::TooLarge) => {
            let msg = format!("request head larger than {} bytes", limits.max_header_bytes);
            respond::malformed(&session, &mut sock, "", "", &msg, respond::Status::HeadTooLarge)
                .await;
            return;
        }
        Err(head::HeadError::Timeout) => {
            let msg = format!(
                "request head not complete within {}s",
                limits.header_timeout.as_secs_f32()
            );
            respond::malformed(&session, &mut sock, "", "", &msg, respond::Status::HeadTimeout)
                .await;
            return;
        }
    };
    match head::parse_head(&buf[..head_len]) {
        Err(msg) => {
            let (method, target) = respond::first_words(&buf[..head_len]);
            respond::malformed(&session, &mut sock, &method, &target, &msg, respond::Status::Bad)
                .await;
        }
        Ok(head::RequestKind::Connect { authority, http10 }) => {
            let authority = authority.to_owned();
            let early = buf.split_off(head_len);
            drop(buf);
            connect::handle(&session, sock, &authority, http10, early).await;
        }
        // hyper answers a target it cannot parse with its own bare 400 and never calls us, so
        // that attempt would go unaudited: refuse it here, audited, like any malformed head.
        // (Later requests on a kept-alive connection are rarer; see `http::serve`.)
        Ok(head::RequestKind::Other { method, target })
            if target.parse::<::http::Uri>().is_err() =>
        {
            let msg = format!("request target {:?} is not a valid URI", respond::printable(target));
            let (method, target) = (method.to_owned(), target.to_owned());
            respond::malformed(&session, &mut sock, &method, &target, &msg, respond::Status::Bad)
                .await;
        }
        Ok(head::RequestKind::Other { .. }) => {
            http::serve(&session, sock, buf).await;
        }
    }
}

#[cfg(test)]
mod tests;
