//! The browser console (issue 17, docs/console.md) on the review listener: every path outside
//! `/api/`, `/healthz` and `/metrics` is routed here by [`crate::review::server`]. This module
//! owns sign-in and sessions — `GET`/`POST /login`, `POST /logout`, the one-time invite pages
//! `GET`/`POST /invite/{token}` — and [`signed_in`], the cookie check every console page uses.
//! [`auth`] holds the pure primitives (ids, cookies, CSRF, passwords, expiry).
//!
//! A session cookie authenticates console pages only: the API keeps bearer tokens, so no
//! cookie can drive a state-changing `/api/*` call (CSRF). Every state-changing form carries a
//! `csrf` field: before sign-in a double-submit value (the `__Host-airlock_csrf` cookie), after
//! it one derived from the session id ([`auth::session_csrf`]); a POST without the right one is
//! 403. Sign-ins, failed sign-ins of known emails and logouts are `airlock.auth.*` events in
//! the user's own history; failed sign-ins of unknown emails go to the store's capped auth log.

// Handlers return the error *response* itself as `Err` (as the API's do); boxing it would
// buy nothing.
#![allow(clippy::result_large_err)]

pub mod auth;
mod gates;
mod pages;
pub use pages::export;
mod queue;
pub mod view;

use crate::review::limits::{self, Rate, RateLimiter};
use crate::review::render;
use crate::review::server::AppState;
use crate::review::store::{Store, StoreError};
use crate::review::{Micros, User, now_micros};
use auth::SessionLimits;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use maud::{DOCTYPE, Markup, html};
use serde_json::json;
use std::net::IpAddr;
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

type Resp = Response<Full<Bytes>>;

/// Event types the server writes for sign-in (reserved: `airlock.*` cannot be ingested).
pub const EVENT_LOGIN: &str = "airlock.auth.login";
pub const EVENT_LOGIN_FAILED: &str = "airlock.auth.login_failed";
pub const EVENT_LOGOUT: &str = "airlock.auth.logout";
/// A wrong (or absent) password re-entered to decide a `high` action gate (step-up).
pub const EVENT_STEP_UP_FAILED: &str = "airlock.auth.step_up_failed";

/// Default sign-in attempts per account before the refill applies
/// (`--login-attempts-per-account`): failed attempts count.
pub const LOGIN_PER_ACCOUNT: Rate = Rate { per_sec: 1.0 / 60.0, burst: 10 };
/// Default sign-in attempts per address (IPv6: one /64) before the refill applies
/// (`--login-attempts-per-address`): every attempt counts (each costs an argon2 check).
pub const LOGIN_PER_ADDRESS: Rate = Rate { per_sec: 0.5, burst: 30 };

/// Largest form body accepted.
const MAX_FORM: usize = 16 * 1024;

/// The headers every response outside `/api/` carries.
pub const SECURITY_HEADERS: [(&str, &str); 3] = [
    ("content-security-policy", "default-src 'self'; frame-ancestors 'none'"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
];

/// Adds [`SECURITY_HEADERS`] to a response.
pub fn add_security_headers<B>(r: &mut Response<B>) {
    for (k, v) in SECURITY_HEADERS {
        r.headers_mut().insert(k, HeaderValue::from_static(v));
    }
}

/// The console's settings, from `airlockd review`'s flags.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConsoleConfig {
    pub sessions: SessionLimits,
    pub login_per_account: Rate,
    pub login_per_address: Rate,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            sessions: SessionLimits::default(),
            login_per_account: LOGIN_PER_ACCOUNT,
            login_per_address: LOGIN_PER_ADDRESS,
        }
    }
}

/// The console's state in the server: its settings and the sign-in rate limiters.
#[derive(Debug)]
pub struct Console {
    pub config: ConsoleConfig,
    by_account: RateLimiter<String>,
    by_address: RateLimiter<IpAddr>,
}

impl Console {
    pub fn new(config: ConsoleConfig) -> Self {
        Self {
            config,
            by_account: RateLimiter::new(config.login_per_account),
            by_address: RateLimiter::new(config.login_per_address),
        }
    }
}

impl Console {
    /// Whether `account` (a lowercased email) may try a password now (step-up shares the
    /// sign-in budget, so neither is a way around the other's limit).
    pub fn check_account(&self, account: &str, now: Instant) -> Result<(), std::time::Duration> {
        self.by_account.check(&account.to_owned(), now)
    }

    /// Charges one failed password attempt to `account`.
    pub fn take_account(&self, account: &str, now: Instant) {
        let _ = self.by_account.take(&account.to_owned(), now);
    }
}

impl Default for Console {
    fn default() -> Self {
        Self::new(ConsoleConfig::default())
    }
}

/// A request's signed-in user, from a live session cookie.
pub struct SignedIn {
    pub user: User,
    /// The session id (the cookie's value).
    pub session: Zeroizing<String>,
    /// The `csrf` value this session's forms carry.
    pub csrf: String,
}

impl std::fmt::Debug for SignedIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignedIn").field("user", &self.user).finish_non_exhaustive()
    }
}

fn cookie_headers(req: &Request<Incoming>) -> Vec<String> {
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_string)
        .collect()
}

fn cookie(cookies: &[String], name: &str) -> Option<String> {
    auth::cookie_value(cookies.iter().map(String::as_str), name)
        .filter(|v| auth::is_secret(v))
        .map(str::to_string)
}

/// The signed-in user of a request, if its session cookie names a live session; appends a
/// "seen" mark when the latest is stale ([`auth::touch_due`]). A store failure is the error
/// page to answer.
pub async fn signed_in<S: Store>(
    st: &AppState<S>,
    cookies: &[String],
) -> Result<Option<SignedIn>, Resp> {
    let Some(id) = cookie(cookies, auth::SESSION_COOKIE) else { return Ok(None) };
    let id = Zeroizing::new(id);
    let hash = auth::secret_hash(&id);
    let Some(row) = st.store.console_session(hash).await.map_err(store_page)? else {
        return Ok(None);
    };
    let now = now_micros();
    let limits = st.console.config.sessions;
    if let Err(why) = auth::judge(&row, now, limits) {
        tracing::debug!("console session of {} ended: {why:?}", row.user.email);
        return Ok(None);
    }
    if auth::touch_due(&row, now, limits) {
        st.store.touch_console_session(hash, now).await.map_err(store_page)?;
    }
    let csrf = auth::session_csrf(&id);
    Ok(Some(SignedIn { user: row.user, session: id, csrf }))
}

/// Answers one console request (every path outside `/api/`, `/healthz` and `/metrics`).
pub async fn route<S: Store>(st: &AppState<S>, peer: IpAddr, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let mut resp = match (&method, path.as_str()) {
        (&Method::GET, "/") => redirect("/people"),
        (&Method::GET, "/login") => get_login(&req),
        (&Method::POST, "/login") => post_login(st, peer, req).await,
        (&Method::POST, "/logout") => post_logout(st, peer, req).await,
        (&Method::GET, "/people") => pages::people(st, &req).await.unwrap_or_else(|r| r),
        (&Method::GET, p) if person_path(p).is_some() => {
            pages::timeline(st, &req, person_path(p).unwrap_or_default())
                .await
                .unwrap_or_else(|r| r)
        }
        (&Method::GET, p) if session_path(p).is_some() => {
            pages::session(st, &req, session_path(p).unwrap_or_default())
                .await
                .unwrap_or_else(|r| r)
        }
        (&Method::GET, "/access-log") => pages::access_log(st, &req).await.unwrap_or_else(|r| r),
        (&Method::GET, "/flags") => queue::get_flags(st, &req).await.unwrap_or_else(|r| r),
        (&Method::POST, render::flags::BULK_PATH) => {
            queue::post_bulk(st, req).await.unwrap_or_else(|r| r)
        }
        (&Method::POST, p) if flag_path(p).is_some() => {
            let id = flag_path(p).unwrap_or_default().to_string();
            queue::post_flag(st, req, &id).await.unwrap_or_else(|r| r)
        }
        (&Method::GET, "/gates") => gates::get_gates(st, &req).await.unwrap_or_else(|r| r),
        (&Method::POST, p) if gate_path(p).is_some() => {
            let id = gate_path(p).unwrap_or_default().to_string();
            gates::post_gate(st, req, &id).await.unwrap_or_else(|r| r)
        }
        (&Method::GET, render::CSS_ROUTE) => asset(&req, render::CSS, "text/css; charset=utf-8"),
        (&Method::GET, render::JS_ROUTE) => {
            asset(&req, render::JS, "text/javascript; charset=utf-8")
        }
        (&Method::GET, "/favicon.ico") => no_favicon(),
        (&Method::GET, p) if invite_token(p).is_some() => {
            get_invite(st, &req, invite_token(p).unwrap_or_default()).await
        }
        (&Method::POST, p) if invite_token(p).is_some() => {
            let token = invite_token(p).unwrap_or_default().to_string();
            post_invite(st, peer, req, &token).await
        }
        (_, "/" | "/login" | "/people" | "/access-log" | "/export" | "/flags" | "/gates")
        | (_, render::CSS_ROUTE | render::JS_ROUTE | "/favicon.ico") => with_allow(
            message_page(
                StatusCode::METHOD_NOT_ALLOWED,
                "Method not allowed",
                "This page is only read (GET).",
            ),
            "GET",
        ),
        (_, "/logout") => with_allow(
            message_page(
                StatusCode::METHOD_NOT_ALLOWED,
                "Method not allowed",
                "Signing out is a POST from the console's own form.",
            ),
            "POST",
        ),
        (_, p) if person_path(p).is_some() || session_path(p).is_some() => with_allow(
            message_page(
                StatusCode::METHOD_NOT_ALLOWED,
                "Method not allowed",
                "This page is only read (GET).",
            ),
            "GET",
        ),
        (_, p) if p == render::flags::BULK_PATH || flag_path(p).is_some() => with_allow(
            message_page(
                StatusCode::METHOD_NOT_ALLOWED,
                "Method not allowed",
                "Flags are acted on with the queue's forms (POST).",
            ),
            "POST",
        ),
        (_, p) if gate_path(p).is_some() => with_allow(
            message_page(
                StatusCode::METHOD_NOT_ALLOWED,
                "Method not allowed",
                "Gates are decided with the forms on /gates (POST).",
            ),
            "POST",
        ),
        (_, p) if invite_token(p).is_some() => with_allow(
            message_page(
                StatusCode::METHOD_NOT_ALLOWED,
                "Method not allowed",
                "An invite page is read with GET and answered with its form (POST).",
            ),
            "GET, POST",
        ),
        _ => message_page(StatusCode::NOT_FOUND, "Not found", "There is no console page here."),
    };
    add_security_headers(&mut resp);
    resp
}

/// One asset embedded in the binary. Its URL carries no version, so the browser revalidates
/// every use (`Cache-Control: no-cache`, RFC 9111 §5.2.2.4) and gets `304 Not Modified`
/// while the binary — and so the asset's strong `ETag` — is unchanged.
fn asset(req: &Request<Incoming>, body: &'static str, content_type: &'static str) -> Resp {
    let etag = asset_etag(body);
    let fresh = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| if_none_match_hits(v, &etag));
    let mut r = if fresh {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        r
    };
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    r
}

/// A strong entity tag of an asset: the first 128 bits of its SHA-256, quoted (RFC 9110 §8.8.3).
fn asset_etag(body: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(body.as_bytes());
    format!("\"{}\"", hex::encode(&digest[..16]))
}

/// Whether an `If-None-Match` value names `etag`: `*`, or a listed tag equal under the weak
/// comparison RFC 9110 §13.1.2 prescribes for this header (a `W/` prefix is ignored).
fn if_none_match_hits(value: &str, etag: &str) -> bool {
    value.split(',').map(str::trim).any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag)
}

/// Browsers ask for `/favicon.ico` on their own: answered with nothing rather than a 404
/// page, and cached for a day so it is not asked again on every page.
fn no_favicon() -> Resp {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::NO_CONTENT;
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=86400"));
    r
}

/// The still percent-encoded `{user_id}` of `/people/{user_id}`.
fn person_path(path: &str) -> Option<&str> {
    path.strip_prefix("/people/").filter(|t| !t.is_empty() && !t.contains('/'))
}

/// The still percent-encoded `{session}` of `/sessions/{session}`.
fn session_path(path: &str) -> Option<&str> {
    path.strip_prefix("/sessions/").filter(|t| !t.is_empty() && !t.contains('/'))
}

/// The flag id of `POST /flags/{id}` (flag ids are URL-safe; anything else names no flag).
fn flag_path(path: &str) -> Option<&str> {
    path.strip_prefix("/flags/").filter(|t| {
        !t.is_empty()
            && *t != "bulk"
            && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// The gate id of `POST /gates/{id}` (gate ids are URL-safe; anything else names no gate).
fn gate_path(path: &str) -> Option<&str> {
    path.strip_prefix("/gates/").filter(|t| crate::review::gates::is_id(t))
}

fn invite_token(path: &str) -> Option<&str> {
    path.strip_prefix("/invite/").filter(|t| !t.is_empty() && !t.contains('/'))
}

fn with_allow(mut r: Resp, allow: &'static str) -> Resp {
    r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

fn html_resp(status: StatusCode, body: Markup) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body.into_string())));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    // Pages carry CSRF values and personal data: never cached.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// A 303 to `to`: a path of this console (callers build it from constants and encoded
/// segments, so it is always a valid header value; `/people` stands in if it is not).
fn redirect(to: &str) -> Resp {
    let mut r = html_resp(StatusCode::SEE_OTHER, page("Redirect", html! { a href=(to) { (to) } }));
    let to = HeaderValue::from_str(to).unwrap_or(HeaderValue::from_static("/people"));
    r.headers_mut().insert(header::LOCATION, to);
    r
}

fn set_cookie(r: &mut Resp, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
}

fn page(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Airlock review" }
                link rel="stylesheet" href=(render::CSS_ROUTE);
            }
            body { main { h1 { (title) } (body) } }
        }
    }
}

fn message_page(status: StatusCode, title: &str, text: &str) -> Resp {
    html_resp(status, page(title, html! { p { (text) } }))
}

fn store_page(e: StoreError) -> Resp {
    tracing::warn!("console: {e}");
    let mut r = message_page(
        StatusCode::SERVICE_UNAVAILABLE,
        "Review store unavailable",
        "The review store did not answer; try again in a moment.",
    );
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    r
}

fn forbidden_csrf() -> Resp {
    message_page(
        StatusCode::FORBIDDEN,
        "Form refused",
        "This form is missing its csrf field or it does not match your session (an old tab, or \
         a form not sent by this console). Reload the page and try again.",
    )
}

/// The pre-session CSRF value: the request's cookie, or a fresh one to set.
fn presession_csrf(req: &Request<Incoming>) -> Result<(String, bool), Resp> {
    match cookie(&cookie_headers(req), auth::CSRF_COOKIE) {
        Some(v) => Ok((v, false)),
        None => match auth::new_secret() {
            Ok(v) => Ok((v.to_string(), true)),
            Err(e) => Err(message_page(StatusCode::INTERNAL_SERVER_ERROR, "Error", &e.to_string())),
        },
    }
}

fn login_form(csrf: &str, email: &str, error: Option<&str>) -> Markup {
    page(
        "Sign in",
        html! {
            @if let Some(e) = error { p role="alert" { (e) } }
            form method="post" action="/login" {
                input type="hidden" name="csrf" value=(csrf);
                p { label { "Email " input type="email" name="email" value=(email)
                    autocomplete="username" required; } }
                p { label { "Password " input type="password" name="password"
                    autocomplete="current-password" required; } }
                p { button type="submit" { "Sign in" } }
            }
        },
    )
}

fn get_login(req: &Request<Incoming>) -> Resp {
    let (csrf, fresh) = match presession_csrf(req) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let mut r = html_resp(StatusCode::OK, login_form(&csrf, "", None));
    if fresh {
        set_cookie(&mut r, &auth::csrf_cookie(&csrf));
    }
    r
}

/// A POSTed form's fields with the request's cookies; the answer to give if it cannot be read.
async fn read_form<S: Store>(
    st: &AppState<S>,
    req: Request<Incoming>,
) -> Result<(Vec<String>, Vec<(String, String)>), Resp> {
    let cookies = cookie_headers(&req);
    let too_large =
        || message_page(StatusCode::PAYLOAD_TOO_LARGE, "Form too large", "The form is too large.");
    if req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|n| n > MAX_FORM)
    {
        return Err(too_large());
    }
    let read = async {
        let mut body = req.into_body();
        let mut buf = Vec::new();
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return Err(None) };
            if let Ok(data) = frame.into_data() {
                if buf.len() + data.len() > MAX_FORM {
                    return Err(Some(()));
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(buf)
    };
    let bad = |m: &str| message_page(StatusCode::BAD_REQUEST, "Bad form", m);
    let buf = match tokio::time::timeout(st.limits.body_timeout, read).await {
        Err(_) => {
            return Err(message_page(
                StatusCode::REQUEST_TIMEOUT,
                "Too slow",
                "The form did not arrive in time.",
            ));
        }
        Ok(Err(Some(()))) => return Err(too_large()),
        Ok(Err(None)) => return Err(bad("The form could not be read.")),
        Ok(Ok(b)) => b,
    };
    let fields: Vec<(String, String)> = serde_urlencoded::from_bytes(&buf)
        .map_err(|_| bad("The form is not application/x-www-form-urlencoded."))?;
    Ok((cookies, fields))
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// Whether the form's `csrf` equals the pre-session cookie (double submit).
fn presession_csrf_ok(cookies: &[String], fields: &[(String, String)]) -> bool {
    match (cookie(cookies, auth::CSRF_COOKIE), field(fields, "csrf")) {
        (Some(c), Some(f)) => auth::ct_eq(&c, f),
        _ => false,
    }
}

/// Stores a sign-in event of reserved type `kind` in the user's own history.
pub(crate) async fn record_auth_event<S: Store>(
    st: &AppState<S>,
    user: &User,
    kind: &str,
    payload: serde_json::Value,
    now: Micros,
) -> Result<(), StoreError> {
    let ev = super::server::reserved_event("auth", kind, &payload, now);
    st.store.insert_events(&user.id, now, &[ev]).await.map(|_| ())
}

fn too_many(wait: Duration, csrf: &str, email: &str, what: &str) -> Resp {
    let msg = format!(
        "Too many sign-in attempts {what}; wait {} seconds and try again.",
        limits::retry_after_secs(wait)
    );
    let mut r = html_resp(StatusCode::TOO_MANY_REQUESTS, login_form(csrf, email, Some(&msg)));
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(limits::retry_after_secs(wait)));
    r
}

/// Starts a session for `user` and answers 303 to `/people` with its cookie.
async fn start_session<S: Store>(st: &AppState<S>, user: &User, peer: IpAddr, via: &str) -> Resp {
    let id = match auth::new_secret() {
        Ok(id) => id,
        Err(e) => return message_page(StatusCode::INTERNAL_SERVER_ERROR, "Error", &e.to_string()),
    };
    let now = now_micros();
    if let Err(e) = st.store.create_console_session(auth::secret_hash(&id), &user.id, now).await {
        return store_page(e);
    }
    let payload = json!({"email": user.email, "address": peer.to_string(), "via": via});
    if let Err(e) = record_auth_event(st, user, EVENT_LOGIN, payload, now).await {
        // Not recorded, not signed in: the session is ended again so no unrecorded sign-in works.
        let _ = st.store.end_console_session(auth::secret_hash(&id), "unrecorded", now).await;
        return store_page(e);
    }
    let mut r = redirect("/people");
    set_cookie(&mut r, &auth::session_cookie(&id));
    r
}

async fn post_login<S: Store>(st: &AppState<S>, peer: IpAddr, req: Request<Incoming>) -> Resp {
    let (cookies, fields) = match read_form(st, req).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    if !presession_csrf_ok(&cookies, &fields) {
        return forbidden_csrf();
    }
    let csrf = field(&fields, "csrf").unwrap_or_default().to_string();
    let email = field(&fields, "email").unwrap_or_default().trim().to_string();
    let password = Zeroizing::new(field(&fields, "password").unwrap_or_default().to_string());
    let now = Instant::now();
    let console = &st.console;
    if let Err(wait) = console.by_address.take(&limits::peer_key(peer), now) {
        crate::review::metrics::global().rate_limited("login_per_address");
        return too_many(wait, &csrf, &email, "from this address");
    }
    let account = email.to_lowercase();
    if let Err(wait) = console.by_account.check(&account, now) {
        crate::review::metrics::global().rate_limited("login_per_account");
        return too_many(wait, &csrf, &email, "for this account");
    }
    let user = match st.store.user_by_email(&email).await {
        Ok(u) => u,
        Err(e) => return store_page(e),
    };
    let (ok, had_password) = match password_matches(st, user.as_ref(), &password).await {
        Ok(r) => r,
        Err(e) => return store_page(e),
    };
    if let (true, Some(u)) = (ok, &user) {
        return start_session(st, u, peer, "password").await;
    }
    let _ = console.by_account.take(&account, now);
    let at = now_micros();
    let recorded = match &user {
        Some(u) => {
            let reason = if had_password { "wrong password" } else { "no password set" };
            let payload = json!({"email": u.email, "address": peer.to_string(), "reason": reason});
            record_auth_event(st, u, EVENT_LOGIN_FAILED, payload, at).await
        }
        None => st.store.auth_log(&email, &peer.to_string(), at).await,
    };
    if let Err(e) = recorded {
        return store_page(e);
    }
    html_resp(
        StatusCode::UNAUTHORIZED,
        login_form(&csrf, &email, Some("The email or the password is wrong.")),
    )
}

/// Whether `password` is `user`'s console password, and whether they have one at all. With no
/// user (an unknown email) it is checked against a dummy, so the answer takes as long either
/// way. argon2 takes tens of milliseconds of CPU: it runs off the runtime's threads. Sign-in
/// and the gates' step-up share it.
pub(crate) async fn password_matches<S: Store>(
    st: &AppState<S>,
    user: Option<&User>,
    password: &Zeroizing<String>,
) -> Result<(bool, bool), crate::review::store::StoreError> {
    let phc = match user {
        Some(u) => st.store.password_of(&u.id).await?,
        None => None,
    };
    let had_password = phc.is_some();
    let pw = password.clone();
    let ok = tokio::task::spawn_blocking(move || auth::verify_password(&pw, phc.as_deref()))
        .await
        .unwrap_or(false);
    Ok((ok, had_password))
}

async fn post_logout<S: Store>(st: &AppState<S>, peer: IpAddr, req: Request<Incoming>) -> Resp {
    let (cookies, fields) = match read_form(st, req).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let Some(csrf) = field(&fields, "csrf") else { return forbidden_csrf() };
    let who = match signed_in(st, &cookies).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let Some(who) = who else {
        let mut r = redirect("/login");
        set_cookie(&mut r, &auth::clear_session_cookie());
        return r;
    };
    if !auth::ct_eq(csrf, &who.csrf) {
        return forbidden_csrf();
    }
    let now = now_micros();
    if let Err(e) =
        st.store.end_console_session(auth::secret_hash(&who.session), "logout", now).await
    {
        return store_page(e);
    }
    let payload = json!({"email": who.user.email, "address": peer.to_string()});
    if let Err(e) = record_auth_event(st, &who.user, EVENT_LOGOUT, payload, now).await {
        tracing::warn!("console: logout of {} not recorded: {e}", who.user.email);
    }
    let mut r = redirect("/login");
    set_cookie(&mut r, &auth::clear_session_cookie());
    r
}

fn invalid_invite() -> Resp {
    message_page(
        StatusCode::NOT_FOUND,
        "Invite not valid",
        "This invite link is not valid: it was used already, has expired, or never existed. \
         Ask an admin for a new one (airlockd admin user invite).",
    )
}

fn invite_form(token: &str, csrf: &str, email: &str, error: Option<&str>) -> Markup {
    page(
        "Set your password",
        html! {
            p { "Choose the console password of " (email) " (at least "
                (auth::MIN_PASSWORD_CHARS) " characters)." }
            @if let Some(e) = error { p role="alert" { (e) } }
            form method="post" action={ "/invite/" (token) } {
                input type="hidden" name="csrf" value=(csrf);
                p { label { "Password " input type="password" name="password"
                    autocomplete="new-password" required; } }
                p { label { "Password again " input type="password" name="password2"
                    autocomplete="new-password" required; } }
                p { button type="submit" { "Set password and sign in" } }
            }
        },
    )
}

async fn get_invite<S: Store>(st: &AppState<S>, req: &Request<Incoming>, token: &str) -> Resp {
    if !auth::is_secret(token) {
        return invalid_invite();
    }
    let user = match st.store.invite_user(auth::secret_hash(token), now_micros()).await {
        Ok(Some(u)) => u,
        Ok(None) => return invalid_invite(),
        Err(e) => return store_page(e),
    };
    let (csrf, fresh) = match presession_csrf(req) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let mut r = html_resp(StatusCode::OK, invite_form(token, &csrf, &user.email, None));
    if fresh {
        set_cookie(&mut r, &auth::csrf_cookie(&csrf));
    }
    r
}

async fn post_invite<S: Store>(
    st: &AppState<S>,
    peer: IpAddr,
    req: Request<Incoming>,
    token: &str,
) -> Resp {
    let (cookies, fields) = match read_form(st, req).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    if !presession_csrf_ok(&cookies, &fields) {
        return forbidden_csrf();
    }
    if !auth::is_secret(token) {
        return invalid_invite();
    }
    let hash = auth::secret_hash(token);
    let csrf = field(&fields, "csrf").unwrap_or_default();
    let pw = Zeroizing::new(field(&fields, "password").unwrap_or_default().to_string());
    let problem = match auth::check_new_password(&pw) {
        Err(m) => Some(m),
        Ok(()) if field(&fields, "password2") != Some(pw.as_str()) => {
            Some("the two passwords differ; type the same one twice".to_string())
        }
        Ok(()) => None,
    };
    if let Some(problem) = problem {
        let user = match st.store.invite_user(hash, now_micros()).await {
            Ok(Some(u)) => u,
            Ok(None) => return invalid_invite(),
            Err(e) => return store_page(e),
        };
        let msg = format!("Not set: {problem}.");
        return html_resp(
            StatusCode::BAD_REQUEST,
            invite_form(token, csrf, &user.email, Some(&msg)),
        );
    }
    let phc = match tokio::task::spawn_blocking(move || auth::hash_password(&pw)).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            return message_page(StatusCode::INTERNAL_SERVER_ERROR, "Error", &e.to_string());
        }
        Err(e) => {
            return message_page(StatusCode::INTERNAL_SERVER_ERROR, "Error", &e.to_string());
        }
    };
    match st.store.accept_invite(hash, &phc, now_micros()).await {
        Ok(Some(user)) => start_session(st, &user, peer, "invite").await,
        Ok(None) => invalid_invite(),
        Err(e) => store_page(e),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn asset_etags_are_strong_quoted_and_follow_the_bytes() {
        let a = asset_etag("body{}");
        assert_eq!(a.len(), 34);
        assert!(a.starts_with('"') && a.ends_with('"'));
        assert_eq!(a, asset_etag("body{}"));
        assert_ne!(a, asset_etag("body{ }"));
    }

    #[test]
    fn if_none_match_uses_the_weak_comparison_over_a_list() {
        let tag = "\"abc\"";
        for hit in ["\"abc\"", "W/\"abc\"", "\"x\", \"abc\"", " \"abc\" ,\"y\"", "*"] {
            assert!(if_none_match_hits(hit, tag), "{hit}");
        }
        for miss in ["", "\"abcd\"", "abc", "\"ab\", \"c\"", "W/abc"] {
            assert!(!if_none_match_hits(miss, tag), "{miss}");
        }
    }
}
