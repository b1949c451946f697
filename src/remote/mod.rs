//! The host-side review-plane client: everything `airlock login --server`, `whoami` and
//! `publish` need to talk to `airlockd review` (docs/api.md). It owns the server URL rules
//! ([`url`]), the token and CA files ([`token`]), TLS trust ([`tls`]) and the HTTP exchange
//! (hyper 1 client connections, kept alive in a small pool).
//!
//! Only host-side CLI processes build a [`Client`]: the token is read from `~/.airlock/token`
//! here and nowhere else, never passed to `airlockd` or into a sandbox, and never printed
//! (no `Debug`, no error message holds it).

pub mod gates;
pub mod log;
pub mod tls;
pub mod token;
pub mod url;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use zeroize::Zeroizing;

use crate::config::fsutil::{self, PrivateReadError};
use crate::config::identity::{self, IdentityError};
use crate::paths::Paths;
pub use tls::Trust;
pub use url::{ServerUrl, UrlError};

/// Connecting (DNS, TCP and the TLS handshake) gives up after this long.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// One request (connect included, until the whole answer is read) gives up after this long.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// The largest answer read: an ingest reply to 1,000 items is well under 1 MB.
const MAX_RESPONSE_BYTES: usize = 16 << 20;
/// How much of a server's error text goes into an error message.
const MAX_ERROR_TEXT: usize = 400;
/// Fresh connections tried for a repeatable request whose connection failed before any
/// answer (see `exchange_inner`).
const FRESH_CONNECTION_ATTEMPTS: u32 = 3;
/// Idle keep-alive connections kept for reuse (publish keeps a few posts in flight).
const MAX_IDLE: usize = 16;

/// The response header advertising how many ingest requests a user may have in progress.
pub const INGEST_CONCURRENCY_HEADER: &str = "x-airlock-ingest-concurrency";

/// Everything that can go wrong talking to the review plane. No variant holds the token.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("not logged in to a review server; run `airlock login --server URL`")]
    NotLoggedIn,
    #[error(
        "{server} refused the token ({message}): it is wrong, expired or revoked; get a new \
         token from the server's admin and run `airlock login --server {server}` again"
    )]
    Unauthorized { server: String, message: String },
    #[error("{server} is busy (HTTP {status}: {message}); retry {}", retry_hint(*.after))]
    Retry { server: String, status: u16, after: Option<Duration>, message: String },
    #[error("{server} answered HTTP {status}: {message}")]
    Status {
        server: String,
        status: u16,
        message: String,
        /// The answer's machine-readable `reason` (`X-Airlock-Reason`), when it has one.
        reason: Option<String>,
    },
    #[error("cannot reach {server}: {message}")]
    Transport { server: String, message: String },
    #[error("TLS with {server} failed: {message}")]
    Tls { server: String, message: String },
    #[error("{server} sent an answer Airlock cannot read: {message}")]
    Protocol { server: String, message: String },
    #[error("server URL {url:?} refused: {reason}")]
    Url { url: String, reason: String },
    #[error(transparent)]
    Token(#[from] token::TokenFileError),
    #[error("CA certificate {origin}: {reason}")]
    CaCert { origin: String, reason: String },
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

fn retry_hint(after: Option<Duration>) -> String {
    match after {
        Some(d) => format!("after {} s", d.as_secs().max(1)),
        None => "later".to_owned(),
    }
}

impl RemoteError {
    /// The `Retry-After` delay of a 429/503, `None` for every other error.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            RemoteError::Retry { after, .. } => *after,
            _ => None,
        }
    }
}

/// `GET /api/v1/me`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Me {
    pub id: String,
    pub email: String,
    pub role: String,
    /// `X-Airlock-Ingest-Concurrency`: how many uploads this user may keep in flight.
    pub ingest_concurrency: Option<usize>,
}

/// The answer to `POST /api/v1/events` (200 or 207).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestReply {
    pub status: u16,
    pub ingest_concurrency: Option<usize>,
    /// One per posted item, in input order.
    pub results: Vec<ItemResult>,
    /// A signed checkpoint that includes every item (docs/evidence.md "Receipts"), when the
    /// server keeps a signed log and had sequenced them all.
    pub checkpoint: Option<String>,
}

/// One item's result in an [`IngestReply`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ItemResult {
    pub index: usize,
    #[serde(default)]
    pub id: Option<String>,
    /// `created`, `duplicate`, `conflict` or `rejected`.
    pub status: String,
    pub code: u16,
    #[serde(default)]
    pub error: Option<String>,
    /// The server's clock when it stored the item (a duplicate: its original's).
    #[serde(default)]
    pub received_at: Option<String>,
    /// The event's leaf in the review log (docs/evidence.md "Receipts").
    #[serde(default)]
    pub leaf_index: Option<u64>,
    /// Not yet sequenced: `deadline` says by when it will be.
    #[serde(default)]
    pub leaf_pending: bool,
    #[serde(default)]
    pub deadline: Option<String>,
}

#[derive(Deserialize)]
struct MeBody {
    id: String,
    email: String,
    role: String,
}

#[derive(Deserialize)]
struct IngestBody {
    results: Vec<ItemResult>,
    #[serde(default)]
    checkpoint: Option<String>,
}

/// A review-plane client. Cheap to clone (an `Arc` inside); several requests may be in flight
/// at once, each on its own connection. Must be used inside a tokio runtime (connections are
/// driven by spawned tasks).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    url: ServerUrl,
    server: String,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    trust: Trust,
    /// `Bearer <token>`, built once.
    authorization: Zeroizing<String>,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("Client")
            .field("server", &self.inner.server)
            .field("trust", &self.inner.trust)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Reads `~/.airlock/identity.toml` (server), `~/.airlock/token` and, when present,
    /// `~/.airlock/server-ca.pem`. [`RemoteError::NotLoggedIn`] when there is no server login.
    pub fn from_login(paths: &Paths) -> Result<Client, RemoteError> {
        let Some(id) = identity::read(&paths.identity_file())? else {
            return Err(RemoteError::NotLoggedIn);
        };
        let Some(server) = id.server else {
            return Err(RemoteError::NotLoggedIn);
        };
        let Some(tok) = token::read_token(&token::token_path(paths))? else {
            return Err(RemoteError::NotLoggedIn);
        };
        let ca_path = token::server_ca_path(paths);
        let origin = ca_path.display().to_string();
        let ca = match fsutil::read_private(&ca_path) {
            Ok(ca) => ca,
            Err(PrivateReadError::TooOpen { mode }) => {
                return Err(RemoteError::CaCert {
                    origin: origin.clone(),
                    reason: format!(
                        "mode {mode:04o} lets other users change it; run `chmod 600 {origin}`"
                    ),
                });
            }
            Err(e) => return Err(RemoteError::CaCert { origin, reason: e.to_string() }),
        };
        Self::build(&server, tok, ca.as_deref().map(|pem| (pem, origin)))
    }

    /// For login: a client for a URL and a token not yet stored, trusting `cacert_pem` (a PEM
    /// CA bundle) instead of the platform roots when given.
    pub fn new(
        server: &str,
        token: Zeroizing<String>,
        cacert_pem: Option<&[u8]>,
    ) -> Result<Client, RemoteError> {
        Self::build(server, token, cacert_pem.map(|pem| (pem, "given with --cacert".to_owned())))
    }

    fn build(
        server: &str,
        token: Zeroizing<String>,
        ca: Option<(&[u8], String)>,
    ) -> Result<Client, RemoteError> {
        let url = ServerUrl::parse(server)
            .map_err(|e| RemoteError::Url { url: server.to_owned(), reason: e.reason })?;
        let normalized = url.to_string();
        let (roots, trust) = match ca {
            Some((pem, origin)) => {
                let certs = tls::parse_ca_pem(pem)
                    .map_err(|reason| RemoteError::CaCert { origin: origin.clone(), reason })?;
                (Some(certs), Trust::Ca(origin))
            }
            None => (None, Trust::Platform),
        };
        let tls = if url.is_tls() {
            let config = tls::client_config(roots.as_deref())
                .map_err(|message| RemoteError::Tls { server: normalized.clone(), message })?;
            let name = match &url.host {
                url::Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
                url::Host::Name(n) => ServerName::try_from(n.clone()).map_err(|e| {
                    RemoteError::Url { url: server.to_owned(), reason: e.to_string() }
                })?,
            };
            Some((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
        } else {
            None
        };
        let mut authorization = Zeroizing::new(String::with_capacity(token.len() + 7));
        authorization.push_str("Bearer ");
        authorization.push_str(&token);
        Ok(Client {
            inner: Arc::new(Inner {
                url,
                server: normalized,
                tls,
                trust,
                authorization,
                idle: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The normalized server URL (`scheme://host:port`), as stored in identity.toml.
    pub fn server(&self) -> &str {
        &self.inner.server
    }

    /// The parsed server URL (host and port, e.g. for blocking it inside sandboxes).
    pub fn server_url(&self) -> &ServerUrl {
        &self.inner.url
    }

    /// `GET /api/v1/me`: who the token belongs to.
    pub async fn me(&self) -> Result<Me, RemoteError> {
        let (status, headers, body) = self.exchange(Method::GET, "/api/v1/me", None).await?;
        if status != StatusCode::OK {
            return Err(self.status_error(status, &headers, &body));
        }
        let me: MeBody = serde_json::from_slice(&body).map_err(|e| self.protocol(e))?;
        Ok(Me {
            id: me.id,
            email: me.email,
            role: me.role,
            ingest_concurrency: ingest_concurrency(&headers),
        })
    }

    /// `POST /api/v1/events` with `Content-Type: application/x-ndjson` and
    /// `Content-Encoding: gzip`. The per-item results for 200 and 207; any other status is an
    /// error ([`RemoteError::Retry`] for 429 and 503, with `Retry-After`).
    pub async fn post_events(&self, gzipped_ndjson: Bytes) -> Result<IngestReply, RemoteError> {
        let (status, headers, body) =
            self.exchange(Method::POST, "/api/v1/events", Some(gzipped_ndjson)).await?;
        if status != StatusCode::OK && status != StatusCode::MULTI_STATUS {
            return Err(self.status_error(status, &headers, &body));
        }
        let parsed: IngestBody = serde_json::from_slice(&body).map_err(|e| self.protocol(e))?;
        Ok(IngestReply {
            status: status.as_u16(),
            ingest_concurrency: ingest_concurrency(&headers),
            results: parsed.results,
            checkpoint: parsed.checkpoint,
        })
    }

    pub(crate) fn protocol(&self, e: impl std::fmt::Display) -> RemoteError {
        RemoteError::Protocol { server: self.inner.server.clone(), message: e.to_string() }
    }

    fn transport(&self, message: impl Into<String>) -> RemoteError {
        RemoteError::Transport { server: self.inner.server.clone(), message: message.into() }
    }

    pub(crate) fn status_error(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
    ) -> RemoteError {
        let server = self.inner.server.clone();
        let message = error_text(status, body);
        match status.as_u16() {
            401 => RemoteError::Unauthorized { server, message },
            code @ (429 | 503) => {
                let after = headers
                    .get(http::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| parse_retry_after(v, SystemTime::now()));
                RemoteError::Retry { server, status: code, after, message }
            }
            code => {
                let reason = headers
                    .get("x-airlock-reason")
                    .and_then(|v| v.to_str().ok())
                    .filter(|r| {
                        r.len() <= 64 && r.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                    })
                    .map(str::to_owned);
                RemoteError::Status { server, status: code, message, reason }
            }
        }
    }

    /// One request and its whole answer, within [`REQUEST_TIMEOUT`]; a body is gzipped NDJSON
    /// (ingest).
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<(StatusCode, HeaderMap, Bytes), RemoteError> {
        self.exchange_as(method, path, body.map(|b| (b, BodyKind::GzipNdjson))).await
    }

    /// [`Self::exchange`] with a JSON body (the gate endpoints).
    pub(crate) async fn exchange_json(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(StatusCode, HeaderMap, Bytes), RemoteError> {
        let body = body.map(|v| (Bytes::from(v.to_string()), BodyKind::Json));
        self.exchange_as(method, path, body).await
    }

    async fn exchange_as(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, BodyKind)>,
    ) -> Result<(StatusCode, HeaderMap, Bytes), RemoteError> {
        let work = self.exchange_inner(method, path, body);
        match tokio::time::timeout(REQUEST_TIMEOUT, work).await {
            Ok(r) => r,
            Err(_) => Err(self.transport(format!(
                "no complete answer within {} s; check the server, then retry",
                REQUEST_TIMEOUT.as_secs()
            ))),
        }
    }

    async fn exchange_inner(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, BodyKind)>,
    ) -> Result<(StatusCode, HeaderMap, Bytes), RemoteError> {
        // A kept-alive connection may have been closed by the server meanwhile; such a
        // failure (before any answer) is retried on a fresh connection. A request safe to
        // repeat (a GET, an ingest the server deduplicates) is retried whenever no answer
        // came; any other (a gate request) only when hyper never sent it (`is_canceled`): a
        // server that crashed after acting on it must not see it twice.
        let repeatable = method == Method::GET || path == "/api/v1/events";
        while let Some(mut sender) = self.take_idle() {
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.send_request(self.request(&method, path, body.clone())?).await {
                Ok(resp) => return self.finish(sender, resp).await,
                Err(e) if e.is_canceled() => continue,
                Err(e) if repeatable && (e.is_incomplete_message() || e.is_closed()) => continue,
                Err(e) => return Err(self.transport(e.to_string())),
            }
        }
        // On a fresh connection, a failure before any answer is a reset or close mid-request
        // (a server refusing a request before reading its body, an overloaded peer). A request
        // that is safe to repeat — a GET, or an ingest the server deduplicates — gets a few
        // more fresh connections before the failure is the caller's; a refused connect is
        // not retried (the server is not there).
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let mut sender = self.connect().await?;
            sender.ready().await.map_err(|e| self.transport(e.to_string()))?;
            match sender.send_request(self.request(&method, path, body.clone())?).await {
                Ok(resp) => return self.finish(sender, resp).await,
                Err(_) if repeatable && attempt < FRESH_CONNECTION_ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                Err(e) => return Err(self.transport(e.to_string())),
            }
        }
    }

    fn request(
        &self,
        method: &Method,
        path: &str,
        body: Option<(Bytes, BodyKind)>,
    ) -> Result<Request<Full<Bytes>>, RemoteError> {
        let mut auth = HeaderValue::from_str(&self.inner.authorization).map_err(|_| {
            // The token passed the shape check, so this cannot happen; say so without it.
            RemoteError::Token(token::TokenFileError::Shape {
                path: "the token".into(),
                why: token::TokenShapeError::BadChar,
            })
        })?;
        auth.set_sensitive(true);
        let mut b = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(http::header::HOST, self.inner.url.authority())
            .header(http::header::AUTHORIZATION, auth)
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, concat!("airlock/", env!("CARGO_PKG_VERSION")));
        let body = match body {
            Some((bytes, BodyKind::GzipNdjson)) => {
                b = b
                    .header(http::header::CONTENT_TYPE, "application/x-ndjson")
                    .header(http::header::CONTENT_ENCODING, "gzip");
                bytes
            }
            Some((bytes, BodyKind::Json)) => {
                b = b.header(http::header::CONTENT_TYPE, "application/json");
                bytes
            }
            None => Bytes::new(),
        };
        b.body(Full::new(body)).map_err(|e| self.protocol(e))
    }

    async fn finish(
        &self,
        sender: SendRequest<Full<Bytes>>,
        resp: http::Response<hyper::body::Incoming>,
    ) -> Result<(StatusCode, HeaderMap, Bytes), RemoteError> {
        let (parts, incoming) = resp.into_parts();
        let body = Limited::new(incoming, MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| self.transport(format!("reading the answer: {e}")))?
            .to_bytes();
        self.put_idle(sender);
        Ok((parts.status, parts.headers, body))
    }

    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.inner.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(s) = idle.pop() {
            if !s.is_closed() {
                return Some(s);
            }
        }
        None
    }

    fn put_idle(&self, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.inner.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(sender);
        }
    }

    /// A new connection (DNS, TCP, TLS, HTTP/1 handshake) within [`CONNECT_TIMEOUT`].
    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, RemoteError> {
        match tokio::time::timeout(CONNECT_TIMEOUT, self.connect_inner()).await {
            Ok(r) => r,
            Err(_) => Err(self.transport(format!(
                "no connection within {} s; check the URL and that the server is running",
                CONNECT_TIMEOUT.as_secs()
            ))),
        }
    }

    async fn connect_inner(&self) -> Result<SendRequest<Full<Bytes>>, RemoteError> {
        let url = &self.inner.url;
        let addrs: Vec<SocketAddr> = match &url.host {
            url::Host::Ip(ip) => vec![SocketAddr::new(*ip, url.port)],
            // `localhost` is the loopback addresses, whatever a resolver says (an http://
            // login was allowed because it is loopback).
            url::Host::Name(n) if n == "localhost" => vec![
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), url.port),
                SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), url.port),
            ],
            url::Host::Name(n) => tokio::net::lookup_host((n.as_str(), url.port))
                .await
                .map_err(|e| self.transport(format!("cannot resolve {n}: {e}")))?
                .collect(),
        };
        let mut last = None;
        let mut tcp = None;
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = Some(format!("{addr}: {e}")),
            }
        }
        let Some(tcp) = tcp else {
            return Err(self.transport(last.unwrap_or_else(|| "no address found".to_owned())));
        };
        let _ = tcp.set_nodelay(true);
        match &self.inner.tls {
            None => self.handshake(tcp).await,
            Some((connector, name)) => {
                let stream =
                    connector.connect(name.clone(), tcp).await.map_err(|e| self.tls_error(e))?;
                self.handshake(stream).await
            }
        }
    }

    async fn handshake<S>(&self, io: S) -> Result<SendRequest<Full<Bytes>>, RemoteError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| self.transport(e.to_string()))?;
        tokio::spawn(async move {
            // Ends when the connection closes; its error surfaces on the request.
            let _ = conn.await;
        });
        Ok(sender)
    }

    fn tls_error(&self, e: std::io::Error) -> RemoteError {
        let server = self.inner.server.clone();
        let rustls_err = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>());
        let message = match rustls_err {
            Some(rustls::Error::InvalidCertificate(why)) => match &self.inner.trust {
                Trust::Platform => format!(
                    "the server's certificate is not trusted ({why:?}); if the server uses a \
                     private or self-signed CA, run `airlock login --server {server} --cacert \
                     FILE` with that CA's certificate"
                ),
                Trust::Ca(origin) => format!(
                    "the server's certificate is not trusted by the CA {origin} ({why:?}); \
                     check that it is the CA that signed the server's certificate"
                ),
            },
            Some(other) => other.to_string(),
            None => e.to_string(),
        };
        RemoteError::Tls { server, message }
    }
}

/// How a request body is sent.
#[derive(Debug, Clone, Copy)]
enum BodyKind {
    /// `POST /api/v1/events`: gzipped NDJSON.
    GzipNdjson,
    Json,
}

fn ingest_concurrency(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(INGEST_CONCURRENCY_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
}

/// The server's error text: the `error` member of its JSON body, else the body itself;
/// control characters replaced and capped at [`MAX_ERROR_TEXT`] characters.
pub fn error_text(status: StatusCode, body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct ErrorBody {
        error: String,
    }
    let raw = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) => b.error,
        Err(_) => String::from_utf8_lossy(body).trim().to_owned(),
    };
    if raw.is_empty() {
        return status.canonical_reason().unwrap_or("no message").to_owned();
    }
    let mut out: String =
        raw.chars().map(|c| if c.is_control() { ' ' } else { c }).take(MAX_ERROR_TEXT).collect();
    if raw.chars().count() > MAX_ERROR_TEXT {
        out.push('…');
    }
    out
}

/// `Retry-After` (RFC 9110 §10.2.3): delay-seconds, or an HTTP-date (a date in the past is
/// zero). `None` when it is neither.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        // A huge number saturates instead of being refused: it still means "wait".
        return Some(Duration::from_secs(v.parse::<u64>().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(parse_retry_after("1", now), Some(Duration::from_secs(1)));
        assert_eq!(parse_retry_after(" 120 ", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after("0", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
        // Obsolete RFC 850 and asctime forms are HTTP-dates too (RFC 9110 §5.6.7).
        assert_eq!(
            parse_retry_after("Sunday, 06-Nov-94 08:49:47 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Sun Nov  6 08:49:38 1994", now),
            Some(Duration::from_secs(1))
        );
        assert_eq!(parse_retry_after("Sat, 05 Nov 1994 08:49:37 GMT", now), Some(Duration::ZERO));
        for bad in ["", "-1", "1.5", "soon", "+3"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn error_text_is_the_servers_message_capped() {
        let s = StatusCode::BAD_REQUEST;
        assert_eq!(error_text(s, br#"{"error":"bad gzip stream","code":400}"#), "bad gzip stream");
        assert_eq!(error_text(s, b"plain\ntext"), "plain text");
        assert_eq!(error_text(s, b""), "Bad Request");
        let long = format!(r#"{{"error":"{}"}}"#, "x".repeat(1000));
        let t = error_text(s, long.as_bytes());
        assert_eq!(t.chars().count(), MAX_ERROR_TEXT + 1);
        assert!(t.ends_with('…'));
    }

    #[test]
    fn debug_and_errors_never_show_the_token() {
        let secret = "alk_do_not_print_me_0123456789";
        let c = Client::new("http://127.0.0.1:9", Zeroizing::new(secret.to_owned()), None).unwrap();
        assert_eq!(c.server(), "http://127.0.0.1:9");
        let dbg = format!("{c:?}");
        assert!(!dbg.contains(secret) && dbg.contains("127.0.0.1:9"), "{dbg}");
        let e =
            Client::new("http://10.1.2.3", Zeroizing::new(secret.to_owned()), None).unwrap_err();
        assert!(matches!(e, RemoteError::Url { .. }), "{e}");
        assert!(!e.to_string().contains(secret));
        let e = Client::new("https://h.example", Zeroizing::new(secret.into()), Some(b"junk"))
            .unwrap_err();
        assert!(e.to_string().contains("no certificate"), "{e}");
    }

    #[test]
    fn not_logged_in_without_a_server_identity_or_token() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = Paths::with_home(tmp.path().to_path_buf());
        assert!(matches!(Client::from_login(&paths), Err(RemoteError::NotLoggedIn)));
        identity::login_email(&paths, "dev@example.com").unwrap();
        assert!(matches!(Client::from_login(&paths), Err(RemoteError::NotLoggedIn)));
        let mut id = identity::read(&paths.identity_file()).unwrap().unwrap();
        id.server = Some("http://127.0.0.1:9".to_owned());
        identity::write(&paths.identity_file(), &id).unwrap();
        assert!(matches!(Client::from_login(&paths), Err(RemoteError::NotLoggedIn)));
        token::write_token(&token::token_path(&paths), "alk_x").unwrap();
        let c = Client::from_login(&paths).unwrap();
        assert_eq!(c.server(), "http://127.0.0.1:9");
    }

    #[tokio::test]
    async fn a_closed_port_is_a_transport_error() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let c = Client::new(&format!("http://127.0.0.1:{port}"), Zeroizing::new("t".into()), None)
            .unwrap();
        let e = c.me().await.unwrap_err();
        assert!(matches!(e, RemoteError::Transport { .. }), "{e}");
    }
}
