//! The review plane's HTTP API (docs/api.md), over plain HTTP (loopback only) or TLS
//! (rustls). Authentication is by bearer token only, never by peer uid; the server makes no
//! outbound connections (the store is the only peer, and it is configured by the operator).

// Handlers return the error *response* itself as `Err`; boxing it would buy nothing.
#![allow(clippy::result_large_err)]

use super::dedup;
use super::detect::{self, Created, Engine};
use super::ingest::{self, BodyError, ItemError, ParsedItem};
use super::store::{EventQuery, FlagQuery, IngestScan, Store, StoreError, random_id};
use super::{
    FlagState, Inserted, Micros, NewEvent, NewFlag, Source, StoredEvent, User, format_micros,
    now_micros, parse_rfc3339, token,
};
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

/// Ingest requests processed at once; more get 429 with `Retry-After`.
pub const INGEST_CONCURRENCY: usize = 8;
/// Time allowed for an ingest body to arrive.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// Shared server state.
#[derive(Debug)]
pub struct AppState<S> {
    pub store: S,
    pub engine: Arc<Engine>,
    ingest: Semaphore,
    /// Sessions that received events, with when they last did: the settle sweep re-checks a
    /// session's span and `seq` gaps once it has been quiet for the settle delay. Kept per
    /// instance (lost on restart; the end-record check does not depend on it).
    touched: std::sync::Mutex<HashMap<(String, String), Micros>>,
}

impl<S: Store> AppState<S> {
    pub fn new(store: S, engine: Engine) -> Self {
        Self::with_concurrency(store, engine, INGEST_CONCURRENCY)
    }

    /// As [`AppState::new`] with `n` concurrent ingest requests (more get 429).
    pub fn with_concurrency(store: S, engine: Engine, n: usize) -> Self {
        Self {
            store,
            engine: Arc::new(engine),
            ingest: Semaphore::new(n.max(1)),
            touched: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn touch(&self, user: &str, session: &str, at: Micros) {
        if let Ok(mut t) = self.touched.lock() {
            t.insert((user.to_string(), session.to_string()), at);
        }
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
            match self.store.session_events(user, session).await {
                Ok(evs) => {
                    let mut flags = detect::session_checks(user, session, &evs);
                    ingest::storable_flags(&mut flags);
                    if let Err(e) = self.store.insert_flags(&flags).await {
                        tracing::error!("settle checks for {session}: storing flags failed: {e}");
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
        let mut flags = self.engine.detect_batch(&self.user_id, &self.created(inserted));
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

    fn session_flags(&self, session: &str, events: &[StoredEvent]) -> Vec<NewFlag> {
        let mut flags = detect::session_checks(&self.user_id, session, events);
        ingest::storable_flags(&mut flags);
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

type Resp = Response<Full<Bytes>>;

fn json_resp(status: StatusCode, body: &Value) -> Resp {
    bytes_resp(status, body.to_string().into_bytes())
}

/// A response whose body is already serialized JSON.
fn bytes_resp(status: StatusCode, body: Vec<u8>) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error(status: StatusCode, message: impl Into<String>) -> Resp {
    json_resp(status, &json!({ "error": message.into(), "code": status.as_u16() }))
}

fn with_header(mut r: Resp, name: header::HeaderName, value: &'static str) -> Resp {
    r.headers_mut().insert(name, HeaderValue::from_static(value));
    r
}

fn store_error(e: StoreError) -> Resp {
    match e {
        StoreError::Unavailable(m) => {
            tracing::warn!("review store unavailable: {m}");
            with_header(
                error(StatusCode::SERVICE_UNAVAILABLE, "review store unavailable; retry later"),
                header::RETRY_AFTER,
                "5",
            )
        }
        StoreError::NotFound(m) => error(StatusCode::NOT_FOUND, m),
        StoreError::Conflict(m) => error(StatusCode::CONFLICT, m),
        StoreError::Other(m) => {
            tracing::error!("review store error: {m}");
            with_header(
                error(StatusCode::SERVICE_UNAVAILABLE, "review store error; retry later"),
                header::RETRY_AFTER,
                "5",
            )
        }
    }
}

async fn authenticate<S: Store>(st: &AppState<S>, req: &Request<Incoming>) -> Result<User, Resp> {
    let unauthorized = |m: &str| {
        with_header(error(StatusCode::UNAUTHORIZED, m), header::WWW_AUTHENTICATE, "Bearer")
    };
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return Err(unauthorized("missing `Authorization: Bearer <token>`"));
    };
    let Some(secret) = value.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")) else {
        return Err(unauthorized("malformed Authorization header; expected `Bearer <token>`"));
    };
    match st.store.authenticate(token::hash(secret.trim())).await {
        Ok(Some(u)) => Ok(u),
        Ok(None) => Err(unauthorized("invalid or revoked token")),
        Err(e) => Err(store_error(e)),
    }
}

enum ReadError {
    TooLarge,
    Io(String),
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

/// Routes one request.
pub async fn handle<S: Store>(st: Arc<AppState<S>>, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let user = match path.as_str() {
        p if p.starts_with("/api/v1/") => match authenticate(&st, &req).await {
            Ok(u) => u,
            Err(r) => return r,
        },
        "/healthz" => return json_resp(StatusCode::OK, &json!({"ok": true})),
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
        (Method::POST, p) if p.starts_with("/api/v1/flags/") => {
            let id = p["/api/v1/flags/".len()..].to_string();
            post_flag(&st, &user, &id, req).await
        }
        (_, "/api/v1/events" | "/api/v1/me" | "/api/v1/flags") => {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this endpoint")
        }
        _ => error(StatusCode::NOT_FOUND, format!("no such endpoint {path}")),
    }
}

fn body_error(e: &BodyError) -> Resp {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    error(status, e.to_string())
}

async fn post_events<S: Store>(st: &AppState<S>, user: &User, req: Request<Incoming>) -> Resp {
    let Ok(_permit) = st.ingest.try_acquire() else {
        return with_header(
            error(
                StatusCode::TOO_MANY_REQUESTS,
                "too many concurrent ingest requests; retry after the delay",
            ),
            header::RETRY_AFTER,
            "1",
        );
    };
    let headers = req.headers();
    let format =
        match ingest::format_for(headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok())) {
            Ok(f) => f,
            Err(e) => return body_error(&e),
        };
    let gzip = match headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
    {
        None => false,
        Some(e) if e.is_empty() || e == "identity" => false,
        Some(e) if e == "gzip" || e == "x-gzip" => true,
        Some(e) => return body_error(&BodyError::Encoding(e)),
    };
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > ingest::MAX_BODY as u64
    {
        return body_error(&BodyError::TooLarge);
    }
    // The ingest slot is held while the body arrives; a stalled client loses it.
    let read = tokio::time::timeout(BODY_TIMEOUT, read_capped(req.into_body(), ingest::MAX_BODY));
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
    for (p, ins) in scan.items.iter().zip(&inserted) {
        if let Some(session) = p.event.session.as_deref()
            && ins.created
        {
            st.touch(&user.id, session, received_at);
        }
    }
    let mut results = Vec::with_capacity(outcomes.len());
    let mut all_ok = true;
    let mut it = inserted.iter();
    let (mut n_created, mut n_dup, mut n_conflict, mut n_rej) = (0, 0, 0, 0);
    for (index, p) in outcomes.iter().enumerate() {
        match p {
            Ok(id) => {
                let Some(ins) = it.next() else {
                    return error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "store returned fewer results than items",
                    );
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
    let status = if all_ok { StatusCode::OK } else { StatusCode::MULTI_STATUS };
    json_resp(
        status,
        &json!({"results": results, "created": n_created, "duplicate": n_dup,
            "conflict": n_conflict, "rejected": n_rej}),
    )
}

/// The query string's `name=value` pairs, decoded as `application/x-www-form-urlencoded`
/// (WHATWG URL §5.1: `+` is a space, `%XX` a byte, a malformed escape stays as written, and
/// bytes that are not UTF-8 become U+FFFD, so they can only fail the checks of a value).
/// A NUL (`%00`) anywhere is refused: no stored value holds one, and PostgreSQL cannot even
/// compare against one, so it must not reach the store.
fn query_params(query: Option<&str>) -> Result<Vec<(String, String)>, Resp> {
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

fn parse_limit(v: &str) -> Result<u32, Resp> {
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

async fn get_events<S: Store>(st: &AppState<S>, user: &User, req: &Request<Incoming>) -> Resp {
    let mut q = EventQuery { limit: 100, ..EventQuery::default() };
    let mut with_view = false;
    let params = match query_params(req.uri().query()) {
        Ok(params) => params,
        Err(resp) => return resp,
    };
    for (k, v) in params {
        let r: Result<(), Resp> = async {
            match k.as_str() {
                "user" => q.user_id = Some(resolve_user(st, &v).await?),
                "view" => with_view = v == "true" || v == "1",
                "source" => {
                    q.source =
                        Some(v.parse().map_err(|e: String| error(StatusCode::BAD_REQUEST, e))?)
                }
                "session" => q.session = Some(v),
                "since" => q.since = Some(parse_time("since", &v)?),
                "until" => q.until = Some(parse_time("until", &v)?),
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
    if let Err(resp) = scope_member_reads(user, &mut q.user_id, "history") {
        return resp;
    }
    let foreign = q.user_id.as_deref() != Some(user.id.as_str());
    if foreign {
        // Reads of other people's history are themselves recorded (DESIGN §8), before the data
        // is returned: if recording fails, nothing is shown.
        let payload = json!({
            "reader": user.id, "reader_email": user.email, "target_user": q.user_id,
            "source": q.source, "session": q.session, "flagged": q.flagged,
            "since": q.since.map(format_micros), "until": q.until.map(format_micros),
        });
        let now = now_micros();
        let ev = NewEvent {
            source: Source::External,
            id: format!("review-read:{}", random_id()),
            kind: "airlock.review.read".into(),
            ts: now,
            session: None,
            seq: None,
            boot: None,
            payload: payload.to_string(),
        };
        if let Err(e) = st.store.insert_events(&user.id, now, &[ev]).await {
            return store_error(e);
        }
    }
    match st.store.query_events(&q).await {
        Ok(evs) => {
            let next = (evs.len() == q.limit as usize)
                .then(|| evs.last().map(|e| e.pk.to_string()))
                .flatten();
            // Serialized directly, so each payload goes out as its stored text rather than
            // through a parsed tree (which would reorder keys and cannot hold a lone surrogate).
            #[derive(serde::Serialize)]
            struct Page<'a> {
                events: Vec<super::ApiEvent<'a>>,
                next_cursor: Option<String>,
            }
            let page = Page {
                events: evs.iter().map(|e| e.api_json(with_view)).collect(),
                next_cursor: next,
            };
            match serde_json::to_vec(&page) {
                Ok(body) => bytes_resp(StatusCode::OK, body),
                Err(e) => {
                    tracing::error!("cannot serialize an events page: {e}");
                    error(StatusCode::INTERNAL_SERVER_ERROR, "cannot serialize the events page")
                }
            }
        }
        Err(e) => store_error(e),
    }
}

async fn get_flags<S: Store>(st: &AppState<S>, user: &User, req: &Request<Incoming>) -> Resp {
    let mut q = FlagQuery { limit: 100, ..FlagQuery::default() };
    let params = match query_params(req.uri().query()) {
        Ok(params) => params,
        Err(resp) => return resp,
    };
    for (k, v) in params {
        let r: Result<(), Resp> = async {
            match k.as_str() {
                "user" => q.user_id = Some(resolve_user(st, &v).await?),
                "state" => {
                    q.state =
                        Some(v.parse().map_err(|e: String| error(StatusCode::BAD_REQUEST, e))?)
                }
                "rule" => q.rule_id = Some(v),
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
    if let Err(resp) = scope_member_reads(user, &mut q.user_id, "flags") {
        return resp;
    }
    match st.store.list_flags(&q).await {
        Ok(flags) => {
            let next = (flags.len() == q.limit as usize)
                .then(|| flags.last().map(|f| f.0.to_string()))
                .flatten();
            let list: Vec<Value> = flags.iter().map(|(_, f)| f.to_json()).collect();
            json_resp(StatusCode::OK, &json!({"flags": list, "next_cursor": next}))
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
        return error(StatusCode::FORBIDDEN, "only reviewers and admins act on flags");
    }
    let body = match read_capped(req.into_body(), 64 * 1024).await {
        Ok(b) => b,
        Err(ReadError::TooLarge) => {
            return error(StatusCode::PAYLOAD_TOO_LARGE, "body exceeds 64 KiB");
        }
        Err(ReadError::Io(m)) => {
            return error(StatusCode::BAD_REQUEST, format!("could not read the body: {m}"));
        }
    };
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("body is not JSON: {e}")),
    };
    let state = match v.get("action").and_then(Value::as_str) {
        Some("acknowledge") => FlagState::Acknowledged,
        Some("resolve") => FlagState::Resolved,
        Some("dismiss") => FlagState::Dismissed,
        Some("reopen") => FlagState::Open,
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "`action` must be acknowledge, resolve, dismiss or reopen",
            );
        }
    };
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
    match st.store.append_flag_state(id, state, note, &user.id, now_micros()).await {
        Ok(false) => error(StatusCode::NOT_FOUND, format!("no flag {id}")),
        Ok(true) => match st.store.get_flag(id).await {
            Ok(Some(f)) => json_resp(StatusCode::OK, &f.to_json()),
            Ok(None) => error(StatusCode::NOT_FOUND, format!("no flag {id}")),
            Err(e) => store_error(e),
        },
        Err(e) => store_error(e),
    }
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

/// Accepts connections until `shutdown` resolves.
pub async fn serve<S: Store>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    state: Arc<AppState<S>>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
        };
        let (stream, _peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let st = Arc::clone(&state);
        let tls = tls.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let st = Arc::clone(&st);
                async move { Ok::<_, Infallible>(handle(st, req).await) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            // A client that dribbles its headers loses the connection.
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30));
            let result = match tls {
                Some(acceptor) => {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
                        .await
                    {
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

/// The one read-scoping rule: a member sees only their own records (asking for another user's
/// is 403); reviewers and admins may name any user or none.
fn scope_member_reads(user: &User, wanted: &mut Option<String>, what: &str) -> Result<(), Resp> {
    if user.role.can_review() {
        return Ok(());
    }
    match wanted {
        Some(u) if *u != user.id => {
            Err(error(StatusCode::FORBIDDEN, format!("members can read only their own {what}")))
        }
        _ => {
            *wanted = Some(user.id.clone());
            Ok(())
        }
    }
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
