//! The review plane's HTTP API (docs/api.md), over plain HTTP (loopback only) or TLS
//! (rustls). Authentication is by bearer token only, never by peer uid; the server makes no
//! outbound connections (the store is the only peer, and it is configured by the operator).
//! It applies the limits of [`super::limits`] (ingest slots, rate limits, the connection cap
//! and timeouts) and records into [`super::metrics`], which it serves at `GET /metrics`.

// Handlers return the error *response* itself as `Err`; boxing it would buy nothing.
#![allow(clippy::result_large_err)]

use super::console;
use super::correlate::CorrelateScan;
use super::dedup;
use super::detect::session::SessionScan;
use super::detect::{self, Created, Engine};
use super::flag_rules;
use super::gate_api::{self, GateHub};
use super::ingest::{self, BodyError, ItemError, ParsedItem};
use super::limits::{self, AcceptBackoff, LimitsConfig, RateLimiter, SlotRefusal, Slots};
use super::metrics::{self, SlotUse};
use super::reads::{Busy, Cursor, PAGE_CAP, PageWriter, ReadPermit, ReadSlots, export};
use super::store::{
    AssigneeFilter, EventOrder, EventQuery, FlagAction, FlagAssignment, FlagQuery, IngestScan,
    Store, StoreError, random_id,
};
use super::transcript_files;
use super::{
    FlagState, Inserted, Micros, NewEvent, NewFlag, Role, Source, User, format_micros, now_micros,
    parse_rfc3339, token,
};
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

pub use super::limits::{BODY_TIMEOUT, INGEST_CONCURRENCY};

/// The response header advertising the per-user ingest concurrency (the publish client's
/// in-flight cap).
pub const INGEST_CONCURRENCY_HEADER: &str = "x-airlock-ingest-concurrency";

/// Test hook (feature `test-hooks`): when set, every peer is treated as non-loopback (so the
/// `/metrics` access rule for remote peers can be tested on loopback).
pub const TEST_PEERS_REMOTE_VAR: &str = "AIRLOCK_TEST_REVIEW_PEERS_REMOTE";

/// Shared server state.
#[derive(Debug)]
pub struct AppState<S> {
    pub store: S,
    pub engine: Arc<Engine>,
    /// The limits this server applies (flags of `airlockd review`).
    pub limits: LimitsConfig,
    ingest: Slots,
    /// Requests per token (keyed by the token's hash).
    token_rate: RateLimiter<[u8; 32]>,
    /// Failed authentications per peer ([`limits::peer_key`]).
    auth_failures: RateLimiter<IpAddr>,
    /// Read slots for events, flags and export (reads.rs).
    pub(crate) reads: ReadSlots,
    /// Sessions that received events, with when they last did: the settle sweep re-checks a
    /// session's span and `seq` gaps once it has been quiet for the settle delay. Kept per
    /// instance (lost on restart; the end-record check does not depend on it).
    touched: Arc<Touched>,
    /// The browser console's settings and sign-in rate limiters ([`console`]).
    pub console: console::Console,
    /// Action gates: the self-approval setting, long-poll slots and change signal.
    pub gates: GateHub,
    /// The review log: signing key, sequencer signal, proof tiles (docs/evidence.md).
    pub log: super::log::LogHub,
}

/// Sessions tracked for the settle sweep at most; a session arriving when the map is full is
/// not tracked and gets a `detect.incomplete` flag in its batch's transaction instead (its
/// end record still triggers the checks).
pub const MAX_SETTLE_SESSIONS: usize = 100_000;

/// Test hook (feature `test-hooks`): overrides [`MAX_SETTLE_SESSIONS`], so a test can fill
/// the settle map with a few sessions.
pub const TEST_SETTLE_CAP_VAR: &str = "AIRLOCK_TEST_REVIEW_SETTLE_CAP";

fn settle_cap() -> usize {
    #[cfg(feature = "test-hooks")]
    if let Some(n) = std::env::var(TEST_SETTLE_CAP_VAR).ok().and_then(|v| v.parse().ok()) {
        return n;
    }
    MAX_SETTLE_SESSIONS
}

/// The settle map: (user, session) → when it last received events.
type Touched = std::sync::Mutex<HashMap<(String, String), Micros>>;

/// Records that `session` received events at `at`; false if the map is full and the
/// session is not in it.
fn touch_map(t: &Touched, user: &str, session: &str, at: Micros) -> bool {
    let Ok(mut t) = t.lock() else { return false };
    let key = (user.to_string(), session.to_string());
    if t.len() >= settle_cap() && !t.contains_key(&key) {
        return false;
    }
    t.insert(key, at);
    true
}

impl<S: Store> AppState<S> {
    pub fn new(store: S, engine: Engine) -> Self {
        Self::with_concurrency(store, engine, INGEST_CONCURRENCY)
    }

    /// As [`AppState::new`] with `n` concurrent ingest requests (more get 429).
    pub fn with_concurrency(store: S, engine: Engine, n: usize) -> Self {
        Self::with_limits(
            store,
            engine,
            LimitsConfig { ingest_concurrency: n, ..Default::default() },
        )
    }

    /// As [`AppState::new`] with the given limits.
    pub fn with_limits(store: S, engine: Engine, limits: LimitsConfig) -> Self {
        Self {
            store,
            engine: Arc::new(engine),
            ingest: Slots::new(limits.ingest_concurrency, limits.ingest_concurrency_per_user),
            token_rate: RateLimiter::new(limits.token_rate),
            auth_failures: RateLimiter::new(limits.auth_failure_rate),
            limits,
            reads: ReadSlots::default(),
            touched: Arc::new(std::sync::Mutex::new(HashMap::new())),
            console: console::Console::default(),
            gates: GateHub::default(),
            log: super::log::LogHub::default(),
        }
    }

    /// Sets the review log's signing key (`--log-key`); without one the tree is kept but
    /// nothing is signed.
    pub fn with_log_key(mut self, signer: Option<crate::tlog::note::NoteSigner>) -> Self {
        self.log = super::log::LogHub::new(signer);
        self
    }

    /// Sets how requesters' own approvals of their gates are treated
    /// (`--gate-self-approve`).
    pub fn with_gate_self_approve(mut self, policy: super::gates::SelfApprove) -> Self {
        self.gates = GateHub::new(policy);
        self
    }

    /// Sets the console's settings (session lifetimes, sign-in rate limits).
    pub fn with_console(mut self, config: console::ConsoleConfig) -> Self {
        self.console = console::Console::new(config);
        self
    }

    /// Sets the read slots: `per_user` concurrent reads per user, `total` overall.
    pub fn with_read_slots(mut self, per_user: usize, total: usize) -> Self {
        self.reads = ReadSlots::new(per_user, total);
        self
    }

    /// Ingest slots one user may hold at once (after the clamp of [`limits::per_user_share`]);
    /// advertised as `X-Airlock-Ingest-Concurrency`.
    pub fn ingest_per_user(&self) -> usize {
        self.ingest.per_user_limit()
    }

    fn touch(&self, user: &str, session: &str, at: Micros) {
        touch_map(&self.touched, user, session, at);
    }

    /// The correlate pack's flags for a session the settle sweep checks (none when the pack
    /// is off). The sweep's scan treats an end-record file still unpublished as a gap.
    async fn settle_correlate(
        &self,
        user: &str,
        session: &str,
    ) -> Result<Vec<NewFlag>, StoreError> {
        if !self.engine.correlate().any_enabled() {
            return Ok(Vec::new());
        }
        let scan = CorrelateScan::new(self.engine.clone(), user, session).settled();
        Ok(self.store.scan_correlate(scan).await?.finish())
    }

    /// Runs the session checks for every session quiet for `settle`; returns how many ran.
    pub async fn settle_once(&self, settle: Duration, now: Micros) -> usize {
        let cutoff = now - settle.as_micros() as Micros;
        let due: Vec<(String, String)> = match self.touched.lock() {
            Ok(mut t) => {
                let due: Vec<_> =
                    t.iter().filter(|(_, at)| **at <= cutoff).map(|(k, _)| k.clone()).collect();
                for k in &due {
                    t.remove(k);
                }
                due
            }
            Err(_) => Vec::new(),
        };
        for (user, session) in &due {
            let scanned = match self.store.scan_session(SessionScan::new(user, session)).await {
                Ok(scan) => self.settle_correlate(user, session).await.map(|mut flags| {
                    flags.extend(scan.finish());
                    flags
                }),
                Err(e) => Err(e),
            };
            match scanned {
                Ok(flags) => {
                    let mut flags = flags;
                    ingest::storable_flags(&mut flags);
                    match self.store.insert_flags(&flags).await {
                        Ok(_) => {
                            flags.iter().for_each(|f| metrics::global().flag_raised(&f.rule_id))
                        }
                        Err(e) => {
                            tracing::error!(
                                "settle checks for {session}: storing flags failed: {e}"
                            )
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!("settle checks for {session} postponed: {e}");
                    self.touch(user, session, now);
                }
            }
        }
        due.len()
    }
}

/// Detection over one ingest request, run by the store inside the batch's transaction
/// ([`IngestScan`]), so a flag is never committed apart from its events.
struct BatchScan {
    engine: Arc<Engine>,
    user_id: String,
    /// The request's valid items, in the order their events go to the store.
    items: Vec<ParsedItem>,
    /// Rule ids of the flags the last scan raised (counted in the metrics once committed).
    raised: Mutex<Vec<String>>,
    /// The settle map, touched inside the transaction so a session it has no room for gets
    /// its `detect.incomplete` flag atomically with the events.
    touched: Arc<Touched>,
}

impl BatchScan {
    /// The items this request created (not duplicates), paired with the store's result.
    fn created<'a>(&'a self, inserted: &[Inserted]) -> Vec<Created<'a>> {
        self.items
            .iter()
            .zip(inserted)
            .filter(|(_, ins)| ins.created)
            .map(|(p, ins)| Created {
                pk: ins.pk,
                event: &p.event,
                payload: &p.payload,
                received_at: ins.received_at,
            })
            .collect()
    }
}

impl IngestScan for BatchScan {
    fn batch_flags(&self, inserted: &[Inserted]) -> Vec<NewFlag> {
        let created = self.created(inserted);
        let mut flags = self.engine.detect_batch(&self.user_id, &created);
        let sessions: BTreeSet<(&str, Micros)> = created
            .iter()
            .filter_map(|c| c.event.session.as_deref().map(|s| (s, c.received_at)))
            .collect();
        for (session, at) in sessions {
            if !touch_map(&self.touched, &self.user_id, session, at) {
                flags.push(detect::session::incomplete(
                    &self.user_id,
                    session,
                    &format!(
                        "more than {} sessions awaited their settle check; \
                         this one is checked only when its end record arrives",
                        settle_cap()
                    ),
                ));
            }
        }
        // A conflict is evidence in itself, beside whatever detection finds in its content.
        for (p, ins) in self.items.iter().zip(inserted) {
            if let Some(c) = &ins.conflict {
                let e = &p.event;
                flags.push(dedup::conflict_flag(
                    &self.user_id,
                    e.source,
                    &e.id,
                    e.session.as_deref(),
                    ins.pk,
                    c,
                ));
            }
        }
        // A NUL quoted from a payload would fail the flag insert on PostgreSQL, and with it the
        // whole batch.
        ingest::storable_flags(&mut flags);
        if let Ok(mut r) = self.raised.lock() {
            *r = flags.iter().map(|f| f.rule_id.clone()).collect();
        }
        flags
    }

    fn ended_sessions(&self, inserted: &[Inserted]) -> Vec<String> {
        let ended: BTreeSet<&str> = self
            .created(inserted)
            .into_iter()
            .filter(|c| c.event.source == Source::Session && c.event.id.ends_with(":end"))
            .filter_map(|c| c.event.session.as_deref())
            .collect();
        ended.into_iter().map(str::to_string).collect()
    }

    fn session_flags(&self, scan: SessionScan) -> Vec<NewFlag> {
        let mut flags = scan.finish();
        ingest::storable_flags(&mut flags);
        if let Ok(mut r) = self.raised.lock() {
            r.extend(flags.iter().map(|f| f.rule_id.clone()));
        }
        flags
    }

    fn correlate_scan(&self, session: &str) -> Option<CorrelateScan> {
        self.engine
            .correlate()
            .any_enabled()
            .then(|| CorrelateScan::new(self.engine.clone(), &self.user_id, session))
    }

    fn correlate_flags(&self, scan: CorrelateScan) -> Vec<NewFlag> {
        // The same bookkeeping as the session checks' flags.
        let mut flags = scan.finish();
        ingest::storable_flags(&mut flags);
        if let Ok(mut r) = self.raised.lock() {
            r.extend(flags.iter().map(|f| f.rule_id.clone()));
        }
        flags
    }
}

/// Periodically runs [`AppState::settle_once`].
pub async fn settle_loop<S: Store>(state: Arc<AppState<S>>, settle: Duration) {
    let tick = (settle / 4).clamp(Duration::from_millis(200), Duration::from_secs(30));
    loop {
        tokio::time::sleep(tick).await;
        state.settle_once(settle, now_micros()).await;
    }
}

pub(crate) type Resp = Response<Full<Bytes>>;

pub(crate) fn json_resp(status: StatusCode, body: &Value) -> Resp {
    bytes_resp(status, body.to_string().into_bytes())
}

/// A response whose body is already serialized JSON.
fn bytes_resp(status: StatusCode, body: Vec<u8>) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Resp {
    json_resp(status, &json!({ "error": message.into(), "code": status.as_u16() }))
}

fn with_header(mut r: Resp, name: header::HeaderName, value: &'static str) -> Resp {
    r.headers_mut().insert(name, HeaderValue::from_static(value));
    r
}

pub(crate) fn store_error(e: StoreError) -> Resp {
    match e {
        StoreError::Unavailable(m) => {
            metrics::global().store_error(true);
            tracing::warn!("review store unavailable: {m}");
            with_header(
                error(StatusCode::SERVICE_UNAVAILABLE, "review store unavailable; retry later"),
                header::RETRY_AFTER,
                "5",
            )
        }
        StoreError::NotFound(m) => error(StatusCode::NOT_FOUND, m),
        StoreError::Forbidden(m) => error(StatusCode::FORBIDDEN, m),
        StoreError::Invalid(m) => error(StatusCode::BAD_REQUEST, m),
        StoreError::Conflict(m) => error(StatusCode::CONFLICT, m),
        StoreError::Other(m) => {
            metrics::global().store_error(false);
            tracing::error!("review store error: {m}");
            with_header(
                error(StatusCode::SERVICE_UNAVAILABLE, "review store error; retry later"),
                header::RETRY_AFTER,
                "5",
            )
        }
    }
}

/// A 429 for `limit` ([`metrics::LIMITS`]) with `Retry-After` in whole seconds.
pub(crate) fn too_many(limit: &'static str, wait: Duration, message: impl Into<String>) -> Resp {
    metrics::global().rate_limited(limit);
    let mut r = error(StatusCode::TOO_MANY_REQUESTS, message);
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(limits::retry_after_secs(wait)));
    r
}

/// The bearer token of a request, if its Authorization header has one.
pub(crate) fn bearer_secret(req: &Request<Incoming>) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?;
    value.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).map(str::trim)
}

/// The bearer token's user. A peer whose presented tokens failed too often is refused (429)
/// before its token is even looked up, so guessing is slow; a valid token is then held to its
/// own rate (429 past it).
async fn authenticate<S: Store>(
    st: &AppState<S>,
    peer: IpAddr,
    req: &Request<Incoming>,
) -> Result<User, Resp> {
    let unauthorized = |m: &str| {
        with_header(error(StatusCode::UNAUTHORIZED, m), header::WWW_AUTHENTICATE, "Bearer")
    };
    if !req.headers().contains_key(header::AUTHORIZATION) {
        return Err(unauthorized("missing `Authorization: Bearer <token>`"));
    }
    let peer = limits::peer_key(peer);
    if let Err(wait) = st.auth_failures.check(&peer, Instant::now()) {
        return Err(too_many(
            "auth_failures",
            wait,
            "too many failed authentications from this address; retry after the delay",
        ));
    }
    let failed = |m: &str| {
        // The failure costs this peer a token; the answer stays 401 (the next one is a 429).
        let _ = st.auth_failures.take(&peer, Instant::now());
        unauthorized(m)
    };
    let Some(secret) = bearer_secret(req) else {
        return Err(failed("malformed Authorization header; expected `Bearer <token>`"));
    };
    let hash = token::hash(secret);
    match st.store.authenticate(hash).await {
        Ok(Some(u)) => match st.token_rate.take(&hash, Instant::now()) {
            Ok(()) => Ok(u),
            Err(wait) => Err(too_many(
                "token",
                wait,
                "too many requests with this token; retry after the delay",
            )),
        },
        Ok(None) => Err(failed("invalid or revoked token")),
        Err(e) => Err(store_error(e)),
    }
}

/// The most of a refused request's body [`discard_body`] reads, and for how long: any body the
/// ingest cap allows (a loopback connection alone holds ~4 MB unread, so a smaller cap still
/// reset clients sending large batches); the connection limit bounds how many drains run.
const DISCARD_MAX_BYTES: usize = ingest::MAX_BODY;
const DISCARD_MAX_TIME: Duration = Duration::from_secs(5);

/// `resp`, for a request answered without reading its body: the body is discarded
/// ([`discard_body`]) unless the client is still waiting for a `100 Continue` (RFC 9110
/// §10.1.1): reading it would make hyper invite the upload of a body already refused.
fn answered_unread(req: Request<Incoming>, resp: Resp) -> Resp {
    // HTTP/1.0 has no 100 Continue (hyper ignores Expect there): such a client sends anyway.
    let expects_continue = req.version() >= http::Version::HTTP_11
        && req
            .headers()
            .get(header::EXPECT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    let body = req.into_body();
    if !expects_continue && !hyper::body::Body::is_end_stream(&body) {
        discard_body(body);
    }
    resp
}

/// Reads and throws away, in a task of its own, the body of a request answered before its
/// body was read (a 401, a 429, a 413 by `Content-Length`). Dropped unread, the body makes
/// hyper close the connection with data still in the receive queue, which the kernel answers
/// with a reset: a client still writing its body (curl, `airlock publish`) then loses the
/// answer — "connection reset" instead of a 429 it would have waited out. RFC 9112 §9.6 asks a
/// server closing early to keep reading for this reason. The read is bounded in bytes and time
/// (the connection limit bounds how many run); past either, the connection is dropped.
fn discard_body(body: Incoming) {
    tokio::spawn(async move {
        let mut body = body;
        let mut read = 0usize;
        let drain = async {
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    read = read.saturating_add(data.len());
                    if read > DISCARD_MAX_BYTES {
                        break;
                    }
                }
            }
        };
        let _ = tokio::time::timeout(DISCARD_MAX_TIME, drain).await;
    });
}

enum ReadError {
    TooLarge,
    Io(String),
}

/// Reads a request's body of at most `cap` bytes; the error answer (413, or 400 when it
/// could not be read) otherwise.
pub(crate) async fn read_body(req: Request<Incoming>, cap: usize) -> Result<Vec<u8>, Resp> {
    match read_capped(req.into_body(), cap).await {
        Ok(b) => Ok(b),
        Err(ReadError::TooLarge) => {
            Err(error(StatusCode::PAYLOAD_TOO_LARGE, format!("body exceeds {} KiB", cap / 1024)))
        }
        Err(ReadError::Io(m)) => {
            Err(error(StatusCode::BAD_REQUEST, format!("could not read the body: {m}")))
        }
    }
}

/// Reads a body, stopping as soon as it exceeds `cap`.
async fn read_capped(body: Incoming, cap: usize) -> Result<Vec<u8>, ReadError> {
    let mut body = body;
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ReadError::Io(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > cap {
                return Err(ReadError::TooLarge);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf)
}

/// Answers one request from `peer`: routes it, records its metrics, and advertises the
/// per-user ingest concurrency on ingest and `/api/v1/me` answers.
///
/// hyper drops this future when the client hangs up. An ingest therefore runs in a task of
/// its own, to its end: its commit runs on in a blocking task anyway, and what it stored must
/// be what `/metrics` counts (a `kill -9`ed `airlock publish` otherwise left stored items
/// uncounted).
pub async fn handle<S: Store>(st: Arc<AppState<S>>, peer: IpAddr, req: Request<Incoming>) -> Resp {
    if req.method() == Method::POST && req.uri().path() == "/api/v1/events" {
        return match tokio::spawn(answer(st, peer, req)).await {
            Ok(resp) => resp,
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("ingest task failed: {e}")),
        };
    }
    answer(st, peer, req).await
}

async fn answer<S: Store>(st: Arc<AppState<S>>, peer: IpAddr, req: Request<Incoming>) -> Resp {
    let started = Instant::now();
    let ingest = req.method() == Method::POST && req.uri().path() == "/api/v1/events";
    let advertise = ingest || req.uri().path() == "/api/v1/me";
    let outside_api = !req.uri().path().starts_with("/api/");
    let mut resp = route(Arc::clone(&st), peer, req).await;
    if outside_api {
        console::add_security_headers(&mut resp);
    }
    let m = metrics::global();
    m.response(resp.status().as_u16());
    if ingest {
        m.ingest_request(resp.status().as_u16(), started.elapsed());
    }
    if advertise {
        resp.headers_mut()
            .insert(INGEST_CONCURRENCY_HEADER, HeaderValue::from(st.ingest_per_user() as u64));
    }
    resp
}

/// Whether `peer` counts as loopback for the `/metrics` access rule.
fn peer_is_loopback(peer: IpAddr) -> bool {
    #[cfg(feature = "test-hooks")]
    if std::env::var_os(TEST_PEERS_REMOTE_VAR).is_some() {
        return false;
    }
    // Canonical: an IPv4-mapped `::ffff:127.0.0.1` is loopback too.
    peer.to_canonical().is_loopback()
}

/// `GET /metrics`: an admin's token, or no token from a loopback peer.
async fn get_metrics<S: Store>(st: &AppState<S>, peer: IpAddr, req: &Request<Incoming>) -> Resp {
    if req.method() != Method::GET {
        return error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this endpoint");
    }
    if req.headers().contains_key(header::AUTHORIZATION) {
        match authenticate(st, peer, req).await {
            Ok(u) if u.role == Role::Admin => {}
            Ok(_) => return error(StatusCode::FORBIDDEN, "only an admin's token reads /metrics"),
            Err(r) => return r,
        }
    } else if !peer_is_loopback(peer) {
        return with_header(
            error(StatusCode::UNAUTHORIZED, "/metrics needs an admin's token from this address"),
            header::WWW_AUTHENTICATE,
            "Bearer",
        );
    }
    let m = metrics::global();
    m.slots(
        "ingest",
        SlotUse {
            in_use: st.ingest.in_use(),
            limit: st.ingest.global_limit(),
            per_user_limit: st.ingest.per_user_limit(),
        },
    );
    let (in_use, limit, per_user_limit) = st.reads.usage();
    m.slots("read", SlotUse { in_use, limit, per_user_limit });
    let mut r = Response::new(Full::new(Bytes::from(m.render())));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(metrics::CONTENT_TYPE));
    r
}

/// Routes one request.
async fn route<S: Store>(st: Arc<AppState<S>>, peer: IpAddr, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let user = match path.as_str() {
        p if p.starts_with("/api/v1/") => match authenticate(&st, peer, &req).await {
            Ok(u) => u,
            Err(r) => return answered_unread(req, r),
        },
        "/healthz" if method == Method::GET => {
            return json_resp(StatusCode::OK, &json!({"ok": true}));
        }
        "/healthz" => {
            return error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this endpoint");
        }
        "/metrics" => return get_metrics(&st, peer, &req).await,
        // The browser console owns every other path outside /api/ (its session cookie
        // authenticates its pages only; /api/ stays bearer-only).
        p if !p.starts_with("/api/") => return console::route(&st, peer, req).await,
        _ => return error(StatusCode::NOT_FOUND, format!("no such endpoint {path}")),
    };
    match (method, path.as_str()) {
        (Method::POST, "/api/v1/events") => post_events(&st, &user, req).await,
        (Method::GET, "/api/v1/events") => get_events(&st, &user, &req).await,
        (Method::GET, "/api/v1/me") => json_resp(
            StatusCode::OK,
            &json!({"id": user.id, "email": user.email, "role": user.role}),
        ),
        (Method::GET, "/api/v1/flags") => get_flags(&st, &user, &req).await,
        (_, p) if p.starts_with("/api/v1/log/") => super::log::route(&st, &user, req).await,
        (Method::POST, "/api/v1/gates") => gate_api::post_gates(&st, &user, req).await,
        (Method::GET, "/api/v1/gates") => gate_api::get_gates(&st, &user, &req).await,
        (Method::GET, p) if gate_path(p).is_some() => {
            let id = gate_path(p).unwrap_or_default().to_string();
            gate_api::get_gate(&st, &user, &id, &req).await
        }
        (Method::POST, p) if gate_path(p).is_some() => {
            let id = gate_path(p).unwrap_or_default().to_string();
            gate_api::post_gate(&st, &user, &id, req).await
        }
        (_, "/api/v1/gates") => {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this endpoint")
        }
        (_, p) if gate_path(p).is_some() => {
            error(StatusCode::METHOD_NOT_ALLOWED, "a gate is read with GET and decided with POST")
        }
        (Method::POST, p) if p.starts_with("/api/v1/flags/") => {
            let id = p["/api/v1/flags/".len()..].to_string();
            post_flag(&st, &user, &id, req).await
        }
        (Method::GET, p) if session_of_transcripts_path(p).is_some() => {
            let raw = session_of_transcripts_path(p).unwrap_or_default().to_string();
            get_session_transcripts(&st, &user, &req, &raw).await
        }
        (_, p) if session_of_transcripts_path(p).is_some() => {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this endpoint")
        }
        (_, "/api/v1/events" | "/api/v1/me" | "/api/v1/flags") => {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this endpoint")
        }
        (_, p) if p.starts_with("/api/v1/flags/") => {
            error(StatusCode::METHOD_NOT_ALLOWED, "flags are acted on with POST only")
        }
        _ => error(StatusCode::NOT_FOUND, format!("no such endpoint {path}")),
    }
}

fn body_error(e: &BodyError) -> Resp {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    error(status, e.to_string())
}

async fn post_events<S: Store>(st: &AppState<S>, user: &User, req: Request<Incoming>) -> Resp {
    // The slot is held until this function returns (a timeout or an early answer included).
    let _slot = match st.ingest.try_acquire(&user.id) {
        Ok(slot) => slot,
        Err(SlotRefusal::PerUser) => {
            return answered_unread(
                req,
                too_many(
                    "ingest_per_user",
                    Duration::from_secs(1),
                    format!(
                        "you already have {} ingest requests in progress (the per-user limit, also \
                     sent as X-Airlock-Ingest-Concurrency); retry after the delay",
                        st.ingest.per_user_limit()
                    ),
                ),
            );
        }
        Err(SlotRefusal::Global) => {
            return answered_unread(
                req,
                too_many(
                    "ingest_global",
                    Duration::from_secs(1),
                    "too many concurrent ingest requests; retry after the delay",
                ),
            );
        }
    };
    let headers = req.headers();
    let format =
        match ingest::format_for(headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok())) {
            Ok(f) => f,
            Err(e) => return answered_unread(req, body_error(&e)),
        };
    let gzip = match headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
    {
        None => false,
        Some(e) if e.is_empty() || e == "identity" => false,
        Some(e) if e == "gzip" || e == "x-gzip" => true,
        Some(e) => return answered_unread(req, body_error(&BodyError::Encoding(e))),
    };
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > ingest::MAX_BODY as u64
    {
        return answered_unread(req, body_error(&BodyError::TooLarge));
    }
    // The ingest slot is held while the body arrives; a stalled client loses it.
    let read = tokio::time::timeout(
        st.limits.body_timeout,
        read_capped(req.into_body(), ingest::MAX_BODY),
    );
    let Ok(read) = read.await else {
        return error(StatusCode::REQUEST_TIMEOUT, "the body did not arrive in time");
    };
    let raw = match read {
        Ok(b) => b,
        Err(ReadError::TooLarge) => return body_error(&BodyError::TooLarge),
        Err(ReadError::Io(m)) => {
            return error(StatusCode::BAD_REQUEST, format!("could not read the body: {m}"));
        }
    };
    let body = if gzip {
        match ingest::gunzip(&raw) {
            Ok(b) => b,
            Err(e) => return body_error(&e),
        }
    } else {
        raw
    };
    let items = match ingest::split(format, &body) {
        Ok(i) => i,
        Err(e) => return body_error(&e),
    };
    let parsed: Vec<Result<ParsedItem, ItemError>> =
        items.iter().map(|raw| ingest::parse_item(raw, &user.id)).collect();
    // The valid items move into the scan the store runs inside the batch's transaction; the
    // response keeps each item's id or error in input order.
    let mut valid = Vec::new();
    let outcomes: Vec<Result<String, ItemError>> = parsed
        .into_iter()
        .map(|p| {
            p.map(|p| {
                let id = p.event.id.clone();
                valid.push(p);
                id
            })
        })
        .collect();
    let events: Vec<NewEvent> = valid.iter().map(|p| p.event.clone()).collect();
    let received_at = now_micros();
    let scan = Arc::new(BatchScan {
        engine: Arc::clone(&st.engine),
        user_id: user.id.clone(),
        items: valid,
        raised: Mutex::new(Vec::new()),
        touched: Arc::clone(&st.touched),
    });
    let inserted = if events.is_empty() {
        Vec::new()
    } else {
        // Events, keys and flags commit in one transaction: a failure (a flag insert
        // included) stores nothing and is the client's 503, retried as new items.
        match st.store.ingest(&user.id, received_at, &events, scan.clone()).await {
            Ok(r) => r,
            Err(e) => return store_error(e),
        }
    };
    super::store::crash_point("after-commit");
    if inserted.iter().any(|i| i.created) {
        st.log.wake();
    }
    if let Ok(raised) = scan.raised.lock() {
        raised.iter().for_each(|rule| metrics::global().flag_raised(rule));
    }
    let mut results = Vec::with_capacity(outcomes.len());
    let mut all_ok = true;
    let mut it = inserted.iter();
    let (mut n_created, mut n_dup, mut n_conflict, mut n_rej) = (0, 0, 0, 0);
    // Whether every stored item has its leaf, and the tree size that covers them all.
    let (mut covered, mut needed) = (true, 0u64);
    for (index, p) in outcomes.iter().enumerate() {
        match p {
            Ok(id) => {
                // A store defect, answered like any store error (503 + Retry-After, logged,
                // counted in /metrics) rather than a bare 503 the contract does not describe.
                let Some(ins) = it.next() else {
                    return store_error(StoreError::Other(
                        "store returned fewer results than items".into(),
                    ));
                };
                let (status, code) = match (ins.created, ins.conflict) {
                    (true, None) => {
                        n_created += 1;
                        ("created", 201)
                    }
                    (true, Some(_)) => {
                        all_ok = false;
                        n_conflict += 1;
                        ("conflict", 409)
                    }
                    (false, _) => {
                        n_dup += 1;
                        ("duplicate", 200)
                    }
                };
                let mut item = json!({"index": index, "id": id, "status": status, "code": code,
                    "error": null, "received_at": format_micros(ins.received_at)});
                super::log::receipt(&mut item, ins.leaf_index, ins.received_at);
                covered &= ins.leaf_index.is_some();
                needed = needed.max(ins.leaf_index.map_or(0, |i| i + 1));
                if let Some(c) = ins.conflict {
                    // The conflict is stored (as event `pk`); the 409 says it is not the original.
                    item["pk"] = json!(ins.pk);
                    item["conflict_of"] = json!(c.original_pk);
                    item["error"] = json!(format!(
                        "a different payload is stored under this id (event {}); this one is \
                         stored as event {} and flagged {}",
                        c.original_pk,
                        ins.pk,
                        dedup::CONFLICT_RULE
                    ));
                }
                results.push(item);
            }
            Err(e) => {
                all_ok = false;
                n_rej += 1;
                results
                    .push(json!({"index": index, "id": e.id, "status": "rejected", "code": e.code,
                    "error": e.message, "received_at": null}));
            }
        }
    }
    for r in &results {
        let code = r["code"].as_u64().and_then(|c| u16::try_from(c).ok()).unwrap_or(0);
        metrics::global().ingest_item(r["status"].as_str().unwrap_or(""), code);
    }
    let status = if all_ok { StatusCode::OK } else { StatusCode::MULTI_STATUS };
    let mut answer = json!({"results": results, "created": n_created, "duplicate": n_dup,
            "conflict": n_conflict, "rejected": n_rej});
    // The embedded store sequenced the batch in its transaction; the sequencer signs a head
    // covering it right after this commit. The answer does not wait for that signature (a
    // client sending batch after batch would pay it on each): it carries a head only when one
    // already covers the whole batch, and `GET /api/v1/log/leaf` or the next checkpoint
    // covers the rest.
    if covered
        && needed > 0
        && let Some(cp) = st.log.current(needed)
    {
        answer["checkpoint"] = json!(cp.note);
    }
    json_resp(status, &answer)
}

/// The query string's `name=value` pairs, decoded as `application/x-www-form-urlencoded`
/// (WHATWG URL §5.1: `+` is a space, `%XX` a byte, a malformed escape stays as written, and
/// bytes that are not UTF-8 become U+FFFD, so they can only fail the checks of a value).
/// A NUL (`%00`) anywhere is refused: no stored value holds one, and PostgreSQL cannot even
/// compare against one, so it must not reach the store.
pub(crate) fn query_params(query: Option<&str>) -> Result<Vec<(String, String)>, Resp> {
    let params: Vec<(String, String)> =
        serde_urlencoded::from_str(query.unwrap_or("")).map_err(|e| {
            error(StatusCode::BAD_REQUEST, format!("the query string cannot be decoded: {e}"))
        })?;
    if let Some((name, _)) = params.iter().find(|(k, v)| k.contains('\0') || v.contains('\0')) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("query parameter {name:?} contains a NUL character (%00); remove it"),
        ));
    }
    Ok(params)
}

pub(crate) fn parse_limit(v: &str) -> Result<u32, Resp> {
    v.parse::<u32>()
        .ok()
        .filter(|n| (1..=1000).contains(n))
        .ok_or_else(|| error(StatusCode::BAD_REQUEST, "`limit` must be an integer from 1 to 1000"))
}

fn parse_time(name: &str, v: &str) -> Result<i64, Resp> {
    parse_rfc3339(v).ok_or_else(|| {
        // In a query string an unencoded `+` is a space: the likeliest cause of a space here.
        let hint = if v.contains(' ') { "; send a `+` in the offset as %2B" } else { "" };
        error(StatusCode::BAD_REQUEST, format!("`{name}` must be an RFC 3339 timestamp{hint}"))
    })
}

fn parse_cursor(v: &str) -> Result<i64, Resp> {
    v.parse().map_err(|_| {
        error(StatusCode::BAD_REQUEST, "`cursor` is not a cursor returned by this API")
    })
}

/// Resolves a `user` filter given as an id or an email.
async fn resolve_user<S: Store>(st: &AppState<S>, v: &str) -> Result<String, Resp> {
    if v.contains('@') {
        match st.store.user_by_email(v).await {
            Ok(Some(u)) => Ok(u.id),
            Ok(None) => Err(error(StatusCode::NOT_FOUND, format!("no user {v}"))),
            Err(e) => Err(store_error(e)),
        }
    } else {
        Ok(v.to_string())
    }
}

/// The filters of `GET /api/v1/events` (and of the export, which takes no `limit`), scoped
/// to the caller (members: their own history only).
async fn event_query<S: Store>(
    st: &AppState<S>,
    user: &User,
    req: &Request<Incoming>,
    export: bool,
) -> Result<(EventQuery, bool), Resp> {
    let mut q = EventQuery { limit: 100, ..EventQuery::default() };
    // Resolved only after the scope check, so a member's answer never depends on who exists.
    let mut wanted_user = None;
    let mut with_view = false;
    let mut cursor = None;
    for (k, v) in query_params(req.uri().query())? {
        match k.as_str() {
            "user" => wanted_user = Some(v),
            "view" => with_view = v == "true" || v == "1",
            "source" => {
                q.source = Some(v.parse().map_err(|e: String| error(StatusCode::BAD_REQUEST, e))?)
            }
            "session" => q.session = Some(v),
            "since" => q.since = Some(parse_time("since", &v)?),
            "until" => q.until = Some(parse_time("until", &v)?),
            "ts_since" => q.ts_since = Some(parse_time("ts_since", &v)?),
            "ts_until" => q.ts_until = Some(parse_time("ts_until", &v)?),
            "order" => {
                q.order = match v.as_str() {
                    "received_at" => EventOrder::Received,
                    "ts" => EventOrder::Ts,
                    _ => {
                        return Err(error(
                            StatusCode::BAD_REQUEST,
                            "`order` must be ts or received_at",
                        ));
                    }
                }
            }
            "flagged" => {
                q.flagged = Some(match v.as_str() {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    _ => {
                        return Err(error(
                            StatusCode::BAD_REQUEST,
                            "`flagged` must be true or false",
                        ));
                    }
                })
            }
            "cursor" => cursor = Some(v),
            "limit" if !export => q.limit = parse_limit(&v)?,
            other => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    format!("unknown query parameter {other:?}"),
                ));
            }
        }
    }
    // Parsed last: what a cursor holds depends on `order`, which may come after it.
    if let Some(v) = cursor {
        let c = Cursor::parse(&v, q.order).ok_or_else(|| {
            error(
                StatusCode::BAD_REQUEST,
                "`cursor` is not a cursor returned by this API for this `order`",
            )
        })?;
        q.after = Some(c.pk);
        q.after_ts = c.ts;
    }
    q.user_id = scoped_user(st, user, wanted_user, "history").await?;
    Ok((q, with_view))
}

/// Takes a read slot for `user`, or the 429 to answer.
fn read_slot<S: Store>(st: &AppState<S>, user: &User) -> Result<ReadPermit, Resp> {
    st.reads.try_acquire(&user.id).map_err(|busy| {
        let msg = match busy {
            Busy::User => "too many concurrent reads for this user; retry after the delay",
            Busy::Server => "too many concurrent reads; retry after the delay",
        };
        metrics::global().rate_limited(match busy {
            Busy::User => "read_per_user",
            Busy::Server => "read_global",
        });
        with_header(error(StatusCode::TOO_MANY_REQUESTS, msg), header::RETRY_AFTER, "1")
    })
}

/// Records a read in the reader's own history (an event of a reserved type the server
/// writes), before any data is returned: if recording fails, nothing is shown.
async fn record_query_read<S: Store>(
    st: &AppState<S>,
    user: &User,
    kind: &str,
    q: &EventQuery,
    now: Micros,
) -> Result<(), Resp> {
    let what = if kind == "airlock.review.export" { "export" } else { "events" };
    let payload = json!({
        "reader": user.id, "reader_email": user.email, "what": what, "target_user": q.user_id,
        "source": q.source, "session": q.session, "flagged": q.flagged,
        "since": q.since.map(format_micros), "until": q.until.map(format_micros),
        "ts_since": q.ts_since.map(format_micros), "ts_until": q.ts_until.map(format_micros),
    });
    record_event(st, user, kind, payload, now).await
}

async fn get_events<S: Store>(st: &AppState<S>, user: &User, req: &Request<Incoming>) -> Resp {
    let (mut q, with_view) = match event_query(st, user, req, false).await {
        Ok(q) => q,
        Err(resp) => return resp,
    };
    let _slot = match read_slot(st, user) {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    if q.user_id.as_deref() != Some(user.id.as_str())
        && let Err(resp) =
            record_query_read(st, user, "airlock.review.read", &q, now_micros()).await
    {
        return resp;
    }
    // The store stops reading rows at the budget; the writer enforces the exact cap.
    q.max_bytes = Some(PAGE_CAP as u64);
    let page = match st.store.query_event_page(&q).await {
        Ok(p) => p,
        Err(e) => return store_error(e),
    };
    let more = page.truncated || page.events.len() == q.limit as usize;
    // Each payload goes out as its stored text rather than through a parsed tree (which
    // would reorder keys and cannot hold a lone surrogate), one event serialized at a time.
    let mut w = PageWriter::new(PAGE_CAP);
    for e in &page.events {
        match w.push(e, with_view, q.order) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                tracing::error!("cannot serialize an events page: {e}");
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "cannot serialize the events page",
                );
            }
        }
    }
    bytes_resp(StatusCode::OK, w.finish(more))
}

/// The `{id}` of `/api/v1/gates/{id}`: gate ids are URL-safe (anything else names no gate,
/// and is answered 404 like an unknown one).
fn gate_path(path: &str) -> Option<&str> {
    path.strip_prefix("/api/v1/gates/").filter(|t| super::gates::is_id(t))
}

/// The raw (still percent-encoded) `{session}` of `/api/v1/sessions/{session}/transcripts`.
fn session_of_transcripts_path(path: &str) -> Option<&str> {
    path.strip_prefix("/api/v1/sessions/")?
        .strip_suffix("/transcripts")
        .filter(|s| !s.is_empty() && !s.contains('/'))
}

/// Percent-decodes a path segment (RFC 3986 §2.1; `+` is itself); the 400 to answer when it
/// is not UTF-8, holds NUL or is not a session id the store could hold.
fn session_segment(raw: &str) -> Result<String, Resp> {
    let bad = |why: &str| {
        error(
            StatusCode::BAD_REQUEST,
            format!(
                "the session in /api/v1/sessions/{{session}}/transcripts {why}; send the Airlock \
                 session id, percent-encoded"
            ),
        )
    };
    let b = raw.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let byte = hex.and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(byte) =
                byte.filter(|_| hex.is_some_and(|h| h.bytes().all(|c| c.is_ascii_hexdigit())))
            else {
                return Err(bad("has a malformed %-escape"));
            };
            out.push(byte);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    let s = String::from_utf8(out).map_err(|_| bad("is not UTF-8"))?;
    if s.contains('\0') {
        return Err(bad("contains NUL (%00)"));
    }
    if s.len() > ingest::MAX_SESSION {
        return Err(bad(&format!("is longer than {} bytes", ingest::MAX_SESSION)));
    }
    Ok(s)
}

/// `GET /api/v1/sessions/{session}/transcripts[?user=]` (docs/api.md): the published
/// transcripts of one user's Airlock session against its end record
/// ([`transcript_files::compare`]). Scoped like `GET /api/v1/events` ([`scoped_user`]; no
/// `user`: the caller's own); a read of another user's session takes a read slot and is
/// recorded as `airlock.review.read` with `what: "transcripts"` before anything is answered.
async fn get_session_transcripts<S: Store>(
    st: &AppState<S>,
    user: &User,
    req: &Request<Incoming>,
    raw_session: &str,
) -> Resp {
    let session = match session_segment(raw_session) {
        Ok(s) => s,
        Err(resp) => return resp,
    };
    let params = match query_params(req.uri().query()) {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    let mut wanted = None;
    for (k, v) in params {
        match k.as_str() {
            "user" => wanted = Some(v),
            other => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("unknown query parameter {other:?}; this endpoint takes only `user`"),
                );
            }
        }
    }
    let named_other = wanted.as_ref().is_some_and(|w| *w != user.id && *w != user.email);
    let target = match scoped_user(st, user, wanted.clone(), "session transcripts").await {
        Ok(t) => t.unwrap_or_else(|| user.id.clone()),
        Err(resp) => return resp,
    };
    // An id is not looked up by the scope rule (an events filter on nobody is just empty);
    // this answer is about one user, so naming no one who exists is a 404.
    if named_other && target != user.id {
        match st.store.user_by_id(&target).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                let name = wanted.unwrap_or_default();
                return error(StatusCode::NOT_FOUND, format!("no user {name}"));
            }
            Err(e) => return store_error(e),
        }
    }
    let _slot = match read_slot(st, user) {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    if target != user.id {
        let payload = json!({
            "reader": user.id, "reader_email": user.email, "what": "transcripts",
            "target_user": target, "session": session,
        });
        if let Err(resp) = record_read(st, user, payload).await {
            return resp;
        }
    }
    let items = match st
        .store
        .session_transcript_items(&target, &session, transcript_files::MAX_FILES + 1)
        .await
    {
        Ok(i) => i,
        Err(e) => return store_error(e),
    };
    let report = transcript_files::compare(&target, &session, &items);
    let files: Vec<String> = report.transcripts.iter().map(|f| f.file.clone()).collect();
    let counts = match st.store.transcript_line_counts(&target, &session, &files).await {
        Ok(c) => c,
        Err(e) => return store_error(e),
    };
    match serde_json::to_value(transcript_files::with_lines(report, &counts)) {
        Ok(v) => json_resp(StatusCode::OK, &v),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot serialize: {e}")),
    }
}

/// `GET /api/v1/export`: authenticated and routed apart from [`handle`] because its body
/// streams ([`export`]).
async fn get_export<S: Store>(
    st: Arc<AppState<S>>,
    peer: IpAddr,
    req: Request<Incoming>,
) -> Result<Response<export::ExportBody>, Resp> {
    let user = authenticate(&st, peer, &req).await?;
    if req.method() != Method::GET {
        return Err(error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this endpoint"));
    }
    let (q, with_view) = event_query(&st, &user, &req, true).await?;
    let slot = read_slot(&st, &user)?;
    // Every export is recorded, one's own included: it is a bulk copy of the evidence.
    let now = now_micros();
    record_query_read(&st, &user, "airlock.review.export", &q, now).await?;
    let (log_header, log) = super::log::export_part(&st, &q).await.map_err(store_error)?;
    let mut header = serde_json::to_vec(&json!({"export": {
        "query": {
            "user": q.user_id, "source": q.source, "session": q.session, "flagged": q.flagged,
            "since": q.since.map(format_micros), "until": q.until.map(format_micros),
            "ts_since": q.ts_since.map(format_micros), "ts_until": q.ts_until.map(format_micros),
            "order": match q.order { EventOrder::Received => "received_at", EventOrder::Ts => "ts" },
            "cursor": q.after.map(|pk| Cursor { ts: q.after_ts, pk }.encode()),
            "view": with_view,
        },
        "exported_at": format_micros(now),
        "by": user.id,
        "format": 1,
        "log": log_header,
    }}))
    .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    header.push(b'\n');
    let body = export::start_as(
        Arc::clone(&st),
        |s: &AppState<S>| &s.store,
        q,
        export::Format::Jsonl,
        with_view,
        header,
        slot,
        log.map(|l| (l, (|s: &AppState<S>| &s.log) as fn(&AppState<S>) -> &super::log::LogHub)),
    );
    let mut r = Response::new(body);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    Ok(r)
}

/// The body of any response: a buffered one, or an export's stream.
pub type ReviewBody = Either<Full<Bytes>, export::ExportBody>;

/// The methods `path` serves, for the `Allow` header every 405 must carry (RFC 9110
/// §15.5.6); `None` for a path that is not an endpoint.
fn allowed_methods(path: &str) -> Option<&'static str> {
    match path {
        "/api/v1/events" => Some("GET, POST"),
        "/api/v1/me" | "/api/v1/flags" | "/api/v1/export" | "/metrics" | "/healthz" => Some("GET"),
        p if p.starts_with("/api/v1/flags/") => Some("POST"),
        "/api/v1/gates" => Some("GET, POST"),
        p if gate_path(p).is_some() => Some("GET, POST"),
        p if session_of_transcripts_path(p).is_some() => Some("GET"),
        p if p.starts_with("/api/v1/log/") => super::log::allowed_methods(p),
        _ => None,
    }
}

/// Routes one request, the streaming export included.
pub async fn respond<S: Store>(
    st: Arc<AppState<S>>,
    peer: IpAddr,
    req: Request<Incoming>,
) -> Response<ReviewBody> {
    let allow = allowed_methods(req.uri().path());
    let mut resp = if req.uri().path() == "/api/v1/export" {
        match get_export(st, peer, req).await {
            Ok(r) => r.map(Either::Right),
            Err(r) => r.map(Either::Left),
        }
    } else if req.uri().path() == "/export" && req.method() == Method::GET {
        match console::export(st, req).await {
            Ok(r) => r.map(Either::Right),
            Err(mut r) => {
                console::add_security_headers(&mut r);
                r.map(Either::Left)
            }
        }
    } else {
        handle(st, peer, req).await.map(Either::Left)
    };
    if resp.status() == StatusCode::METHOD_NOT_ALLOWED
        && let Some(allow) = allow
    {
        resp.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    resp
}

async fn get_flags<S: Store>(st: &AppState<S>, user: &User, req: &Request<Incoming>) -> Resp {
    let mut q = FlagQuery { limit: 100, ..FlagQuery::default() };
    let mut wanted_user = None;
    let mut wanted_assignee = None;
    let params = match query_params(req.uri().query()) {
        Ok(params) => params,
        Err(resp) => return resp,
    };
    for (k, v) in params {
        let r: Result<(), Resp> = async {
            match k.as_str() {
                "user" => wanted_user = Some(v),
                "state" => {
                    q.state =
                        Some(v.parse().map_err(|e: String| error(StatusCode::BAD_REQUEST, e))?)
                }
                "rule" => q.rule_id = Some(v),
                "assignee" => wanted_assignee = Some(v),
                "cursor" => q.after = Some(parse_cursor(&v)?),
                "limit" => q.limit = parse_limit(&v)?,
                other => {
                    return Err(error(
                        StatusCode::BAD_REQUEST,
                        format!("unknown query parameter {other:?}"),
                    ));
                }
            }
            Ok(())
        }
        .await;
        if let Err(resp) = r {
            return resp;
        }
    }
    q.user_id = match scoped_user(st, user, wanted_user, "flags").await {
        Ok(u) => u,
        Err(resp) => return resp,
    };
    if let Some(a) = wanted_assignee {
        q.assignee = match assignee_filter(st, user, a).await {
            Ok(f) => Some(f),
            Err(resp) => return resp,
        };
    }
    if q.user_id.as_deref() != Some(user.id.as_str()) {
        // Reads of other people's flags are recorded like reads of their events, first.
        let assignee = match &q.assignee {
            Some(AssigneeFilter::User(u)) => json!(u),
            Some(AssigneeFilter::Unassigned) => json!("none"),
            None => Value::Null,
        };
        let payload = json!({
            "reader": user.id, "reader_email": user.email, "what": "flags",
            "target_user": q.user_id, "state": q.state, "rule": q.rule_id,
            "assignee": assignee,
        });
        if let Err(resp) = record_read(st, user, payload).await {
            return resp;
        }
    }
    let _slot = match read_slot(st, user) {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    match st.store.list_flags(&q).await {
        Ok(flags) => {
            // Written one flag at a time and cut at the page cap (a flag carries its event
            // list and note); the first flag always goes out.
            let mut body = b"{\"flags\":[".to_vec();
            let mut last = None;
            let mut cut = false;
            for (n, f) in &flags {
                let item = f.to_json().to_string();
                if last.is_some() && body.len() + item.len() + 64 > PAGE_CAP {
                    cut = true;
                    break;
                }
                if last.is_some() {
                    body.push(b',');
                }
                body.extend_from_slice(item.as_bytes());
                last = Some(*n);
            }
            let next = last.filter(|_| cut || flags.len() == q.limit as usize);
            body.extend_from_slice(b"],\"next_cursor\":");
            body.extend_from_slice(json!(next.map(|n| n.to_string())).to_string().as_bytes());
            body.push(b'}');
            bytes_resp(StatusCode::OK, body)
        }
        Err(e) => store_error(e),
    }
}

async fn post_flag<S: Store>(
    st: &AppState<S>,
    user: &User,
    id: &str,
    req: Request<Incoming>,
) -> Resp {
    if !user.role.can_review() {
        return error(StatusCode::FORBIDDEN, flag_rules::Refusal::NotReviewer.to_string());
    }
    // PostgreSQL re-checks the token inside `airlock_flag_state`; held only for this request,
    // wiped on drop.
    let secret = zeroize::Zeroizing::new(bearer_secret(&req).unwrap_or_default().to_string());
    let body = match read_body(req, 64 * 1024).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("body is not JSON: {e}")),
    };
    // A state to set, or an assignment (`Assign(None)`: unassign).
    enum Act<'a> {
        State(FlagState),
        Assign(Option<&'a str>),
    }
    let act = match v.get("action").and_then(Value::as_str) {
        Some("acknowledge") => Act::State(FlagState::Acknowledged),
        Some("resolve") => Act::State(FlagState::Resolved),
        Some("dismiss") => Act::State(FlagState::Dismissed),
        Some("reopen") => Act::State(FlagState::Open),
        Some("assign") => match v.get("assignee") {
            // Bounded and NUL-free before it reaches a store (PostgreSQL text holds no NUL).
            Some(Value::String(e)) if e.len() <= 1024 && !e.contains('\0') => {
                Act::Assign(Some(e.as_str()))
            }
            Some(Value::Null) => Act::Assign(None),
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "`assign` needs `assignee`: the email of a reviewer or admin (at most 1 KiB, \
                     no NUL), or null to unassign",
                );
            }
        },
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "`action` must be acknowledge, resolve, dismiss, reopen or assign",
            );
        }
    };
    if matches!(act, Act::State(_)) && v.get("assignee").is_some() {
        return error(
            StatusCode::BAD_REQUEST,
            "`assignee` goes only with `\"action\": \"assign\"`; send the state action without it",
        );
    }
    let note = match v.get("note") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.len() <= 16 * 1024 && !s.contains('\0') => Some(s.as_str()),
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "`note` must be a string of at most 16 KiB without NUL characters",
            );
        }
    };
    let override_requested = match v.get("override") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return error(StatusCode::BAD_REQUEST, "`override` must be true or false"),
    };
    let self_action = match allowed_flag_action(st, user, id, override_requested).await {
        Ok(s) => s,
        Err(e) => return e.api(id),
    };
    let appended = match act {
        Act::Assign(email) => {
            let assignee = match email {
                Some(e) => match assignable(st, e).await {
                    Ok(u) => Some(u.id),
                    Err(err) => return err.api(id),
                },
                None => None,
            };
            let a = FlagAssignment {
                flag_id: id,
                assignee: assignee.as_deref(),
                note,
                actor: &user.id,
                self_action,
                secret: &secret,
                at: now_micros(),
            };
            st.store.assign_flag(&a).await
        }
        Act::State(state) => {
            let action = FlagAction {
                flag_id: id,
                state,
                note,
                actor: &user.id,
                self_action,
                secret: &secret,
                at: now_micros(),
            };
            st.store.append_flag_state(&action).await
        }
    };
    match appended {
        Ok(false) => error(StatusCode::NOT_FOUND, format!("no flag {id}")),
        Ok(true) => match st.store.get_flag(id).await {
            Ok(Some(f)) => json_resp(StatusCode::OK, &f.to_json()),
            Ok(None) => error(StatusCode::NOT_FOUND, format!("no flag {id}")),
            Err(e) => store_error(e),
        },
        Err(e) => store_error(e),
    }
}

/// Why a flag action cannot be taken (the API answers JSON, the console a page).
#[derive(Debug)]
pub(crate) enum FlagActError {
    NoFlag,
    Refused(flag_rules::Refusal),
    /// The assignee named is not a current reviewer or admin; the message says who it is.
    NotAssignable(String),
    Store(StoreError),
}

impl FlagActError {
    fn api(self, id: &str) -> Resp {
        match self {
            FlagActError::NoFlag => error(StatusCode::NOT_FOUND, format!("no flag {id}")),
            FlagActError::Refused(r) => error(StatusCode::FORBIDDEN, r.to_string()),
            FlagActError::NotAssignable(m) => error(StatusCode::BAD_REQUEST, m),
            FlagActError::Store(e) => store_error(e),
        }
    }
}

/// The user an assignment names by `email`, if they may be assigned (a current reviewer or
/// admin), else what was wrong.
pub(crate) async fn assignable<S: Store>(
    st: &AppState<S>,
    email: &str,
) -> Result<User, FlagActError> {
    match st.store.user_by_email(email).await {
        Ok(Some(u)) if u.role.can_review() => Ok(u),
        Ok(Some(u)) => Err(FlagActError::NotAssignable(format!(
            "{email} is a {}: only reviewers and admins can be assigned a flag",
            u.role.as_str()
        ))),
        Ok(None) => Err(FlagActError::NotAssignable(format!(
            "no user with email {email:?}; assign a reviewer or admin by their email"
        ))),
        Err(e) => Err(FlagActError::Store(e)),
    }
}

/// The `assignee` filter of `GET /api/v1/flags`: `none`, a user id, or an email. An unknown
/// email is a 404 for reviewers and admins; for a member (who sees only their own flags and
/// must not learn who exists) it matches nothing.
async fn assignee_filter<S: Store>(
    st: &AppState<S>,
    user: &User,
    v: String,
) -> Result<AssigneeFilter, Resp> {
    if v == "none" {
        return Ok(AssigneeFilter::Unassigned);
    }
    if !v.contains('@') {
        return Ok(AssigneeFilter::User(v));
    }
    match st.store.user_by_email(&v).await {
        Ok(Some(u)) => Ok(AssigneeFilter::User(u.id)),
        // No user id contains '@', so filtering on the email itself matches no flag.
        Ok(None) if !user.role.can_review() => Ok(AssigneeFilter::User(v)),
        Ok(None) => Err(error(StatusCode::NOT_FOUND, format!("no user {v}"))),
        Err(e) => Err(store_error(e)),
    }
}

/// Applies [`flag_rules::decide`] to `user` acting on flag `id`: `Ok(self_action)`, or why
/// not (no such flag, or the refusal saying what to do).
pub(crate) async fn allowed_flag_action<S: Store>(
    st: &AppState<S>,
    user: &User,
    id: &str,
    override_requested: bool,
) -> Result<bool, FlagActError> {
    let flag = match st.store.get_flag(id).await {
        Ok(Some(f)) => f,
        Ok(None) => return Err(FlagActError::NoFlag),
        Err(e) => return Err(FlagActError::Store(e)),
    };
    // Counted only when it matters: the user's own flag without an override.
    let reviewers = if flag.user_id == user.id && !override_requested {
        match st.store.list_users().await {
            Ok(users) => users.iter().filter(|u| u.role.can_review()).count(),
            Err(e) => return Err(FlagActError::Store(e)),
        }
    } else {
        0
    };
    flag_rules::decide(flag_rules::Request {
        actor: user,
        flag_owner: &flag.user_id,
        override_requested,
        reviewers,
    })
    .map_err(FlagActError::Refused)
}

/// Builds a TLS acceptor from PEM files.
pub fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> Result<TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("cannot read certificate {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("bad certificate PEM in {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate found in {}", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("cannot read private key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup failed: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("certificate and key do not fit together: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts connections until `shutdown` resolves. At most `max_connections` are served at
/// once: past it the loop stops accepting, so new ones wait in the kernel's accept queue
/// instead of being accepted and dropped. A failing `accept` (`EMFILE`, `ENFILE`) backs off
/// with a growing delay and is logged once per burst ([`AcceptBackoff`]).
pub async fn serve<S: Store>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    state: Arc<AppState<S>>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let max = state.limits.max_connections.max(1);
    let conns = Arc::new(Semaphore::new(max));
    let m = metrics::global();
    m.set_connection_limit(max);
    let mut backoff = AcceptBackoff::new();
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&conns).acquire_owned() => p,
            () = &mut shutdown => break,
        };
        // The semaphore is never closed; an error cannot happen, but ends the loop if it did.
        let Ok(permit) = permit else { break };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(s) => s,
            // The peer gave up before we accepted; nothing is wrong with the listener.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => continue,
            Err(e) => {
                m.accept_error();
                let step = backoff.on_error(Instant::now());
                if step.log {
                    tracing::warn!(
                        "accept failed: {e}; not accepting for a growing delay (up to {} ms) \
                         until it succeeds; further failures of this burst are not logged",
                        limits::ACCEPT_BACKOFF_MAX.as_millis()
                    );
                }
                drop(permit);
                tokio::select! {
                    () = tokio::time::sleep(step.sleep) => continue,
                    () = &mut shutdown => break,
                }
            }
        };
        if let Some(ended) = backoff.on_success(Instant::now()) {
            tracing::warn!(
                "accepting again: {} failed accept calls over {} ms",
                ended.failures,
                ended.lasted.as_millis()
            );
        }
        let _ = stream.set_nodelay(true);
        let st = Arc::clone(&state);
        let tls = tls.clone();
        let header_timeout = state.limits.header_timeout;
        let open = m.connection_opened();
        tokio::spawn(async move {
            // Both are released when the connection ends, however it ends.
            let _permit = permit;
            let _open = open;
            let peer = peer.ip();
            let svc = hyper::service::service_fn(move |req| {
                let st = Arc::clone(&st);
                async move { Ok::<_, Infallible>(respond(st, peer, req).await) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            // A client that dribbles its headers loses the connection, and so does a
            // keep-alive connection idle for as long: hyper arms this timer whenever the
            // connection waits for a request's head, the first one or the next.
            builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(header_timeout);
            let result = match tls {
                Some(acceptor) => {
                    // The handshake gets 10 s, or the header timeout if that is shorter.
                    let handshake = header_timeout.min(Duration::from_secs(10));
                    match tokio::time::timeout(handshake, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => {
                            builder.serve_connection(hyper_util::rt::TokioIo::new(s), svc).await
                        }
                        _ => return,
                    }
                }
                None => builder.serve_connection(hyper_util::rt::TokioIo::new(stream), svc).await,
            };
            if let Err(e) = result {
                tracing::debug!("connection ended: {e}");
            }
        });
    }
}

/// The one read-scoping rule, applied to the raw `user` parameter (an id or an email): a
/// member sees only their own records, and naming anyone else is 403 *before* any lookup, so
/// the answer is the same whether that user exists or not; reviewers and admins may name any
/// user (resolved, 404 if unknown) or none (`None`: everyone).
pub(crate) async fn scoped_user<S: Store>(
    st: &AppState<S>,
    user: &User,
    wanted: Option<String>,
    what: &str,
) -> Result<Option<String>, Resp> {
    if !user.role.can_review() {
        return match wanted {
            Some(w) if w != user.id && w != user.email => {
                Err(error(StatusCode::FORBIDDEN, format!("members can read only their own {what}")))
            }
            _ => Ok(Some(user.id.clone())),
        };
    }
    match wanted {
        Some(w) => resolve_user(st, &w).await.map(Some),
        None => Ok(None),
    }
}

/// Stores an `airlock.review.read` record of `payload` in the reader's history (DESIGN §8);
/// the caller shows nothing if this fails.
async fn record_read<S: Store>(
    st: &AppState<S>,
    reader: &User,
    payload: Value,
) -> Result<(), Resp> {
    record_event(st, reader, "airlock.review.read", payload, now_micros()).await
}

/// A server-written event of the reserved type `kind` (source `external`, id
/// `<id_prefix>:<random>`), for the history it is stored in.
pub(crate) fn reserved_event(
    id_prefix: &str,
    kind: &str,
    payload: &Value,
    now: Micros,
) -> NewEvent {
    NewEvent {
        source: Source::External,
        id: format!("{id_prefix}:{}", random_id()),
        kind: kind.into(),
        ts: now,
        session: None,
        seq: None,
        boot: None,
        payload: payload.to_string(),
        airlock_session: None,
        file: None,
        offset: None,
    }
}

/// Stores a server-written event of the reserved type `kind` in `reader`'s history.
async fn record_event<S: Store>(
    st: &AppState<S>,
    reader: &User,
    kind: &str,
    payload: Value,
    now: Micros,
) -> Result<(), Resp> {
    let ev = reserved_event("review-read", kind, &payload, now);
    st.store.insert_events(&reader.id, now, &[ev]).await.map(|_| ()).map_err(store_error)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn pairs(query: &str) -> Vec<(String, String)> {
        query_params(Some(query)).unwrap()
    }

    fn owned(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn query_strings_are_percent_and_plus_decoded() {
        assert_eq!(
            pairs("user=dev%40example.test&rule=a+b%2Bc&since=2026-03-04T09%3A12%3A05%2B01%3A00"),
            owned(&[
                ("user", "dev@example.test"),
                ("rule", "a b+c"),
                ("since", "2026-03-04T09:12:05+01:00")
            ])
        );
        // Empty pairs are skipped; a name without `=` has an empty value; an encoded name.
        assert_eq!(pairs("&&view&li%6Dit=5&"), owned(&[("view", ""), ("limit", "5")]));
        assert_eq!(query_params(None).unwrap(), Vec::new());
        // UTF-8 escapes decode to the character.
        assert_eq!(pairs("rule=caf%C3%A9"), owned(&[("rule", "café")]));
    }

    #[test]
    fn malformed_escapes_and_bad_bytes_reach_the_value_checks_visibly() {
        // A malformed escape stays as written; a byte that is not UTF-8 becomes U+FFFD.
        assert_eq!(
            pairs("rule=50%&state=%zz&x=%4"),
            owned(&[("rule", "50%"), ("state", "%zz"), ("x", "%4")])
        );
        assert_eq!(pairs("session=%FF"), owned(&[("session", "\u{fffd}")]));
        // ... and the value checks then refuse them with messages naming the parameter.
        let (k, v) = &pairs("limit=%31%30%30%30%30")[0];
        assert_eq!((k.as_str(), v.as_str()), ("limit", "10000"));
        let resp = parse_limit(v).unwrap_err();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let body = futures_body(resp);
        assert_eq!(body["error"], "`limit` must be an integer from 1 to 1000");
        let (_, v) = &pairs("since=2026-03-04T09:12:05+01:00")[0];
        // An unencoded `+` is a space, so this timestamp is refused, and the message says how.
        assert_eq!(v, "2026-03-04T09:12:05 01:00");
        let body = futures_body(parse_time("since", v).unwrap_err());
        assert_eq!(
            body["error"],
            "`since` must be an RFC 3339 timestamp; send a `+` in the offset as %2B"
        );
        let body = futures_body(parse_time("until", "yesterday").unwrap_err());
        assert_eq!(body["error"], "`until` must be an RFC 3339 timestamp");
    }

    #[test]
    fn loopback_peers_include_ipv4_mapped_loopback() {
        assert!(peer_is_loopback("127.0.0.1".parse().unwrap()));
        assert!(peer_is_loopback("::1".parse().unwrap()));
        assert!(peer_is_loopback("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!peer_is_loopback("192.0.2.1".parse().unwrap()));
        assert!(!peer_is_loopback("::ffff:192.0.2.1".parse().unwrap()));
    }

    /// The JSON body of an error response.
    fn futures_body(resp: Resp) -> Value {
        let bytes = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(resp.into_body().collect())
            .unwrap()
            .to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }
}
