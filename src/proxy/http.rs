//! Plain-HTTP proxying (RFC 9112 §3.2.2 absolute-form): hyper parses each request on a
//! kept-alive agent connection; every request is decided and audited on its own, then sent to
//! the upstream over a fresh connection to a checked address. `Host` is regenerated from the
//! target (a different `Host` header never decides anything), hop-by-hop and `Proxy-*` headers
//! are removed both ways (RFC 9110 §7.6.1), and bodies stream through without buffering.
//!
//! Every later head on a kept-alive connection passes the same strict parser as the first
//! ([`super::head::parse_request`]) before hyper sees a byte of it: a [`Gate`] inside hyper's
//! IO follows the request framing (head, `Content-Length` body or chunked body), holds each new
//! head back until it is complete and accepted, and on a refusal stops feeding hyper, lets it
//! finish the response in flight, then audits the head and answers it itself. hyper never
//! meets a head it would refuse with a bare `400`, so no request goes unaudited.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::audit::AuditLine;
use crate::policy::{Host, LayerKind, Reason, parse_authority};

use super::SessionProxy;
use super::connect::ms_since;
use super::head::{self, BodyFraming, HeadRefusal};
use super::respond::{self, Status};

/// The body type of every response the proxy gives.
pub type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// Serves plain-HTTP requests on `sock`; `buffered` holds bytes already read (the first head,
/// already accepted by [`head::parse_request`], and whatever followed it).
pub async fn serve(session: &Arc<SessionProxy>, sock: TcpStream, buffered: Vec<u8>) {
    let mut gate = Gate::new(session.limits.max_header_bytes);
    let stop = Arc::clone(&gate.stop);
    gate.feed(&buffered);
    let io = TokioIo::new(Prefixed { gate, sock });
    let s = Arc::clone(session);
    let svc = service_fn(move |req| {
        let s = Arc::clone(&s);
        // Boxed: `poll_without_shutdown` needs an `Unpin` service future.
        let fut: Pin<Box<dyn Future<Output = Result<_, Infallible>> + Send>> =
            Box::pin(async move { Ok::<_, Infallible>(handle_request(&s, req).await) });
        fut
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(session.limits.header_timeout)
        // hyper refuses buffers under 8 KiB; heads beyond the cap get 431.
        .max_buf_size(session.limits.max_header_bytes.max(8192))
        .title_case_headers(true)
        .keep_alive(true);
    let mut conn = builder.serve_connection(io, svc);
    let mut kill = session.kill.subscribe();
    let mut closing = false;
    // Polled without hyper's own shutdown, so the socket comes back to answer a refused head.
    let run = std::future::poll_fn(|cx| {
        if !closing && stop.load(Ordering::Acquire) {
            // Let the response in flight finish (hyper has not seen a byte of the refused
            // head, so it is idle after it), then stop.
            Pin::new(&mut conn).graceful_shutdown();
            closing = true;
        }
        conn.poll_without_shutdown(cx)
    });
    let ended = tokio::select! {
        r = run => r,
        () = super::stopped(&mut kill) => return,
    };
    let timed_out = match &ended {
        Err(e) => {
            tracing::debug!("plain-HTTP connection ended: {e}");
            e.is_timeout()
        }
        Ok(()) => false,
    };
    let Prefixed { mut gate, mut sock } = conn.into_parts().io.into_inner();
    match gate.take_refusal(timed_out, session.limits.header_timeout) {
        Some(r) => {
            respond::malformed(session, &mut sock, &r.method, &r.target, &r.why, r.status).await;
        }
        None => {
            use tokio::io::AsyncWriteExt;
            let _ = sock.shutdown().await;
        }
    }
}

async fn handle_request(s: &Arc<SessionProxy>, req: Request<Incoming>) -> Response<ProxyBody> {
    s.counters.requests_total.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let method = req.method().as_str().to_owned();
    let url = req.uri().to_string();
    let (host, port) = match target_of(&req) {
        Ok(t) => t,
        Err(msg) => return malformed(s, &method, &url, &msg),
    };
    // Tool-call gates: answered here, on the host side; the name is never resolved.
    if super::toolgate::is_reserved(&host) {
        return super::toolgate::serve(s, req, started).await;
    }
    // A synthetic address of this session (absolute-form URL host) stands for its name.
    let host = match s.synthetic.target(host) {
        Ok(h) => h,
        Err(addr) => {
            let target = format!("{addr}:{port}");
            let mut line = respond::new_line(s, &addr.to_string(), Some(port), &method);
            line.url = Some(url);
            line.reason = Some(Reason::IpNotAllowed);
            line.layer = Some(LayerKind::None);
            line.duration_ms = Some(ms_since(started));
            let detail = Some(super::synthetic::FOREIGN_DETAIL);
            return match s.audit.append(&line) {
                Ok(()) => refusal(
                    Status::Forbidden,
                    Reason::IpNotAllowed,
                    LayerKind::None,
                    &target,
                    detail,
                ),
                Err(e) => audit_failed(&e, &target),
            };
        }
    };
    let target = host.authority(port);
    let (mut line, policy) = respond::begin(s, &host.to_string(), Some(port), &method);
    // What a gate on this target approves: exactly this request line.
    let request_line = format!("{method} {url} {:?}", req.version());
    line.url = Some(url);

    let decision = policy.decide(&host, port, &s.local());
    if !decision.is_allowed() {
        respond::set_refusal(&mut line, &decision);
        line.duration_ms = Some(ms_since(started));
        return match s.audit.append(&line) {
            Ok(()) => refusal(Status::Forbidden, decision.reason, decision.layer, &target, None),
            Err(e) => audit_failed(&e, &target),
        };
    }
    respond::set_allowed(&mut line, &decision);
    if let Err(e) = s.audit.journal_open(&line) {
        return audit_failed(&e, &target);
    }
    let reached =
        super::gatehold::reach(s, &policy, &mut line, &host, port, Some(&request_line), None).await;
    let (upstream, addr) = match reached {
        Ok(r) => r,
        Err(why) => {
            let (status, detail) = respond::set_unreachable(&mut line, &why);
            return close_refused(s, &mut line, started, status, &target, detail);
        }
    };
    line.addr = Some(addr.to_string());

    let sent = Arc::new(AtomicU64::new(0));
    let upstream_req = match rebuild_request(req, &host, port, Arc::clone(&sent)) {
        Ok(r) => r,
        Err(msg) => {
            respond::set_failure(&mut line, Reason::Malformed);
            return close_refused(s, &mut line, started, Status::Bad, &target, Some(&msg));
        }
    };
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
            Ok(x) => x,
            Err(e) => {
                respond::set_failure(&mut line, Reason::ConnectFailed);
                let d = e.to_string();
                return close_refused(s, &mut line, started, Status::BadGateway, &target, Some(&d));
            }
        };
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("upstream HTTP connection ended: {e}");
        }
    });
    let resp = match sender.send_request(upstream_req).await {
        Ok(r) => r,
        Err(e) => {
            respond::set_failure(&mut line, Reason::ConnectFailed);
            let d = format!("upstream failed: {e}");
            return close_refused(s, &mut line, started, Status::BadGateway, &target, Some(&d));
        }
    };
    line.status = Some(resp.status().as_u16());
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let tracked = Tracked {
        inner: body,
        recv: 0,
        finisher: Some(Finisher { session: Arc::clone(s), line, started, sent }),
    };
    Response::from_parts(parts, tracked.boxed())
}

/// The target of an absolute-form request as (host, port); an error is a 400 message.
fn target_of(req: &Request<Incoming>) -> Result<(Host, u16), String> {
    let uri = req.uri();
    if req.method() == http::Method::CONNECT {
        return Err("send CONNECT as the first request on a new proxy connection".into());
    }
    let Some(scheme) = uri.scheme_str() else {
        return Err(format!(
            "origin-form request target {:?}: this is a proxy; send the absolute form \
             (http://host/path), or CONNECT host:443 for HTTPS",
            respond::printable(&uri.to_string())
        ));
    };
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(format!(
            "only http:// URLs are proxied as plain HTTP, not {scheme}://; use CONNECT for TLS"
        ));
    }
    let Some(auth) = uri.authority() else {
        return Err("absolute-form URL without a host".into());
    };
    let auth = auth.as_str();
    let with_port = if auth.ends_with(']') || !auth.contains(':') {
        format!("{auth}:80")
    } else {
        auth.to_owned()
    };
    parse_authority(&with_port).map_err(|m| format!("bad URL host: {m}"))
}

/// The request as sent upstream: origin-form target, fresh `Host`, no hop-by-hop headers.
fn rebuild_request(
    req: Request<Incoming>,
    host: &Host,
    port: u16,
    sent: Arc<AtomicU64>,
) -> Result<Request<ProxyBody>, String> {
    let (parts, body) = req.into_parts();
    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
    let authority = host.authority(port);
    let host_value = if port == 80 { authority.trim_end_matches(":80") } else { &authority };
    let host_value = HeaderValue::from_str(host_value).map_err(|e| e.to_string())?;
    headers.insert(header::HOST, host_value);
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let body = counting(body, sent);
    let mut out = Request::builder()
        .method(parts.method)
        .uri(path)
        .version(Version::HTTP_11)
        .body(body)
        .map_err(|e| e.to_string())?;
    *out.headers_mut() = headers;
    Ok(out)
}

/// Removes hop-by-hop headers (RFC 9110 §7.6.1), the ones `Connection` names, and every
/// `Proxy-*` header (credentials for this proxy must never reach an upstream).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for h in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
    ] {
        headers.remove(h);
    }
    headers.remove("keep-alive");
    let proxy: Vec<HeaderName> =
        headers.keys().filter(|k| k.as_str().starts_with("proxy-")).cloned().collect();
    for k in proxy {
        headers.remove(k);
    }
}

fn malformed(s: &SessionProxy, method: &str, url: &str, msg: &str) -> Response<ProxyBody> {
    let mut line = respond::new_line(s, url, None, method);
    line.reason = Some(Reason::Malformed);
    line.layer = Some(LayerKind::None);
    line.url = Some(url.to_owned());
    // Refused on the spot: nothing was opened, so the attempt took no measurable time.
    line.duration_ms = Some(0);
    match s.audit.append(&line) {
        Ok(()) => refusal(Status::Bad, Reason::Malformed, LayerKind::None, url, Some(msg)),
        Err(e) => audit_failed(&e, url),
    }
}

fn close_refused(
    s: &SessionProxy,
    line: &mut AuditLine,
    started: Instant,
    status: Status,
    target: &str,
    detail: Option<&str>,
) -> Response<ProxyBody> {
    line.duration_ms = Some(ms_since(started));
    let reason = line.reason.unwrap_or(Reason::NotAllowed);
    let layer = line.layer.unwrap_or(LayerKind::None);
    match s.audit.journal_close(line) {
        Ok(()) => refusal(status, reason, layer, target, detail),
        Err(e) => audit_failed(&e, target),
    }
}

fn audit_failed(e: &crate::audit::AuditError, target: &str) -> Response<ProxyBody> {
    tracing::error!("audit write failed, refusing {target}: {e}");
    refusal(Status::Unavailable, Reason::AuditUnavailable, LayerKind::None, target, None)
}

/// A refusal response: same headers and body as the tunnel path's.
fn refusal(
    status: Status,
    reason: Reason,
    layer: LayerKind,
    target: &str,
    detail: Option<&str>,
) -> Response<ProxyBody> {
    let body = respond::body_for(&respond::printable(target), reason, detail);
    let mut resp = Response::new(Full::new(Bytes::from(body)).map_err(|n| match n {}).boxed());
    *resp.status_mut() = StatusCode::from_u16(status.code()).unwrap_or(StatusCode::FORBIDDEN);
    // SECURITY §3 fixes the refusal's reason phrase; hyper writes it from this extension.
    resp.extensions_mut().insert(hyper::ext::ReasonPhrase::from_static(status.phrase().as_bytes()));
    let h = resp.headers_mut();
    h.insert("x-airlock-reason", HeaderValue::from_static(reason.as_str()));
    h.insert("x-airlock-layer", HeaderValue::from_static(layer.as_str()));
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// Writes a request's final line when its response body ends (or is dropped).
struct Finisher {
    session: Arc<SessionProxy>,
    line: AuditLine,
    started: Instant,
    sent: Arc<AtomicU64>,
}

impl Finisher {
    /// `complete`: the response body reached its end. A body cut off by the session's drain is
    /// recorded as `interrupted`.
    fn finish(mut self, recv: u64, complete: bool) {
        if !complete && *self.session.kill.borrow() {
            self.line.interrupted = Some(true);
        }
        let sent = self.sent.load(Ordering::Relaxed);
        self.line.bytes_sent = Some(sent);
        self.line.bytes_recv = Some(recv);
        self.line.duration_ms = Some(ms_since(self.started));
        let c = &self.session.counters.bytes;
        c.sent.fetch_add(sent, Ordering::Relaxed);
        c.recv.fetch_add(recv, Ordering::Relaxed);
        if let Err(e) = self.session.audit.journal_close(&self.line) {
            tracing::error!("cannot write the final audit line of {}: {e}", self.line.id);
        }
    }
}

/// A streamed body that counts its data bytes and, for responses, writes the final audit line
/// at its end.
struct Tracked {
    inner: Incoming,
    recv: u64,
    finisher: Option<Finisher>,
}

/// Request bodies: count into `sent`, no final line of their own.
fn counting(body: Incoming, sent: Arc<AtomicU64>) -> ProxyBody {
    body.map_frame(move |f| {
        if let Some(d) = f.data_ref() {
            sent.fetch_add(d.len() as u64, Ordering::Relaxed);
        }
        f
    })
    .boxed()
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    self.recv += d.len() as u64;
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                let recv = self.recv;
                let complete = matches!(polled, Poll::Ready(None));
                if let Some(f) = self.finisher.take() {
                    f.finish(recv, complete);
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(f) = self.finisher.take() {
            f.finish(self.recv, false);
        }
    }
}

/// A later head the gate refused, to be audited and answered once hyper is done.
#[derive(Debug)]
struct Refused {
    method: String,
    target: String,
    why: HeadRefusal,
    status: Status,
}

/// Where the gate is in the agent's byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Collecting a head (held back from hyper until it is complete and accepted).
    Head,
    /// Passing on a body's remaining bytes.
    Body(u64),
    /// Inside a chunked body (RFC 9112 §7.1).
    Chunk(Chunk),
    /// A refusal is pending: nothing more reaches hyper.
    Stopped,
    /// The chunked body did not follow RFC 9112 §7.1: hyper fails that request's body and ends
    /// the connection; the gate passes bytes on unchecked until then (that request is already
    /// audited, and a later head cannot be framed reliably).
    Lost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Hex digits of a chunk size (value so far, digits seen).
    Size(u64, u8),
    /// After the size: whitespace or `;` extensions, up to CR.
    Ext(u64),
    /// CR seen after the size line; LF expected.
    SizeLf(u64),
    /// Chunk data still to pass.
    Data(u64),
    /// CR, then LF, expected after chunk data.
    DataCr,
    DataLf,
    /// After the last chunk: at the start of a trailer line (or of the final CRLF).
    TrailerStart,
    /// Inside a trailer line.
    Trailer,
    /// CR seen ending a trailer line (`last`: the final CRLF).
    TrailerLf {
        last: bool,
    },
}

/// Follows the request framing of the agent's stream so every head is checked before hyper
/// reads it; `ready` holds the bytes hyper may have.
#[derive(Debug)]
struct Gate {
    scan: Scan,
    held: Vec<u8>,
    ready: bytes::BytesMut,
    max_head: usize,
    refused: Option<Refused>,
    /// Tells `serve` to shut hyper down (hyper owns the gate while it runs): set once hyper has
    /// everything before the refused head.
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// The task was woken to act on `refused`.
    woken: bool,
}

fn incomplete(len: usize) -> HeadRefusal {
    HeadRefusal {
        reason: Reason::IncompleteHead,
        msg: format!(
            "the connection ended after {len} bytes, before the request head's closing \
             CRLF CRLF (RFC 9112 §2.1)"
        ),
    }
}

impl Gate {
    fn new(max_head: usize) -> Self {
        Self {
            scan: Scan::Head,
            held: Vec::new(),
            ready: bytes::BytesMut::new(),
            max_head,
            refused: None,
            stop: Arc::default(),
            woken: false,
        }
    }

    /// Takes bytes from the socket: accepted heads and body bytes go to `ready`.
    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            match self.scan {
                Scan::Stopped => return,
                Scan::Lost => {
                    self.ready.extend_from_slice(data);
                    return;
                }
                Scan::Body(n) | Scan::Chunk(Chunk::Data(n)) => {
                    let take = usize::try_from(n).unwrap_or(usize::MAX).min(data.len());
                    self.ready.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    let left = n - take as u64;
                    self.scan = match (self.scan, left) {
                        (Scan::Body(_), 0) => Scan::Head,
                        (Scan::Body(_), _) => Scan::Body(left),
                        (_, 0) => Scan::Chunk(Chunk::DataCr),
                        (_, _) => Scan::Chunk(Chunk::Data(left)),
                    };
                }
                Scan::Chunk(c) => {
                    let b = data[0];
                    data = &data[1..];
                    self.ready.extend_from_slice(&[b]);
                    self.scan = match chunk_step(c, b) {
                        Some(Some(next)) => Scan::Chunk(next),
                        Some(None) => Scan::Head,
                        None => Scan::Lost,
                    };
                }
                Scan::Head => {
                    // RFC 9112 §2.2: empty lines before a request line are ignored (clients
                    // may send a CRLF after a body); hyper would skip them too.
                    if self.held.is_empty() {
                        let skip = data.iter().take_while(|b| matches!(b, b'\r' | b'\n')).count();
                        data = &data[skip..];
                        if data.is_empty() {
                            return;
                        }
                    }
                    let from = self.held.len().saturating_sub(3);
                    let room = (self.max_head + 1).saturating_sub(self.held.len());
                    let take = data.len().min(room);
                    self.held.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    let end = self.held[from..].windows(4).position(|w| w == b"\r\n\r\n");
                    if let Some(i) = end {
                        let rest = self.held.split_off(from + i + 4);
                        self.accept_head();
                        // Bytes read past the head are framed by it: feed them again.
                        if !rest.is_empty() {
                            let mut again = rest;
                            again.extend_from_slice(data);
                            self.feed(&again);
                            return;
                        }
                    } else if self.held.len() > self.max_head {
                        let msg = format!("request head larger than {} bytes", self.max_head);
                        let why = HeadRefusal { reason: Reason::Malformed, msg };
                        self.refuse(why, Status::HeadTooLarge);
                        return;
                    }
                }
            }
        }
    }

    /// `held` is one complete head: pass it on, or refuse it.
    fn accept_head(&mut self) {
        let checked = head::parse_request(&self.held).and_then(|(kind, body)| match kind {
            head::RequestKind::Other { target, .. } if target.parse::<http::Uri>().is_err() => {
                let shown = respond::printable(target);
                let msg = format!("request target {shown:?} is not a valid URI");
                Err(HeadRefusal { reason: Reason::Malformed, msg })
            }
            _ => Ok(body),
        });
        match checked {
            Ok(body) => {
                let head = std::mem::take(&mut self.held);
                self.ready.extend_from_slice(&head);
                self.scan = match body {
                    BodyFraming::Length(0) => Scan::Head,
                    BodyFraming::Length(n) => Scan::Body(n),
                    BodyFraming::Chunked => Scan::Chunk(Chunk::Size(0, 0)),
                };
            }
            Err(why) => self.refuse(why, Status::Bad),
        }
    }

    fn refuse(&mut self, why: HeadRefusal, status: Status) {
        let (method, target) = respond::first_words(&self.held);
        self.refused = Some(Refused { method, target, why, status });
        self.scan = Scan::Stopped;
    }

    /// The peer closed (or the socket failed): a head in progress is an incomplete one.
    fn eof(&mut self) {
        if self.scan == Scan::Head && !self.held.is_empty() {
            self.refuse(incomplete(self.held.len()), Status::Bad);
        }
    }

    /// What to audit once hyper is done: a refusal, or a head that was still arriving when
    /// hyper ended the connection (its header timeout, or the peer went away).
    fn take_refusal(&mut self, timed_out: bool, timeout: std::time::Duration) -> Option<Refused> {
        if let Some(r) = self.refused.take() {
            return Some(r);
        }
        if self.scan != Scan::Head || self.held.is_empty() {
            return None;
        }
        let (method, target) = respond::first_words(&self.held);
        let (why, status) = if timed_out {
            let msg = format!("request head not complete within {}s", timeout.as_secs_f32());
            (HeadRefusal { reason: Reason::Malformed, msg }, Status::HeadTimeout)
        } else {
            (incomplete(self.held.len()), Status::Bad)
        };
        Some(Refused { method, target, why, status })
    }
}

/// One byte of chunked framing (RFC 9112 §7.1): the next state, `Some(None)` at the body's end,
/// `None` when the framing is broken.
fn chunk_step(c: Chunk, b: u8) -> Option<Option<Chunk>> {
    let next = match (c, b) {
        (Chunk::Size(n, digits), _) if b.is_ascii_hexdigit() => {
            if digits >= 16 {
                return None;
            }
            let d = u64::from((b as char).to_digit(16)?);
            Chunk::Size(n.checked_mul(16)?.checked_add(d)?, digits + 1)
        }
        (Chunk::Size(_, 0), _) => return None,
        (Chunk::Size(n, _) | Chunk::Ext(n), b'\r') => Chunk::SizeLf(n),
        (Chunk::Size(n, _), b';' | b' ' | b'\t') => Chunk::Ext(n),
        (Chunk::Size(..), _) | (Chunk::Ext(_), b'\n') => return None,
        (Chunk::Ext(n), _) => Chunk::Ext(n),
        (Chunk::SizeLf(0), b'\n') => Chunk::TrailerStart,
        (Chunk::SizeLf(n), b'\n') => Chunk::Data(n),
        (Chunk::SizeLf(_) | Chunk::Data(_), _) => return None,
        (Chunk::DataCr, b'\r') => Chunk::DataLf,
        (Chunk::DataLf, b'\n') => Chunk::Size(0, 0),
        (Chunk::DataCr | Chunk::DataLf, _) => return None,
        (Chunk::TrailerStart, b'\r') => Chunk::TrailerLf { last: true },
        (Chunk::Trailer, b'\r') => Chunk::TrailerLf { last: false },
        (Chunk::TrailerStart | Chunk::Trailer, b'\n') => return None,
        (Chunk::TrailerStart | Chunk::Trailer, _) => Chunk::Trailer,
        (Chunk::TrailerLf { last: true }, b'\n') => return Some(None),
        (Chunk::TrailerLf { last: false }, b'\n') => Chunk::TrailerStart,
        (Chunk::TrailerLf { .. }, _) => return None,
    };
    Some(Some(next))
}

/// The agent's socket behind the [`Gate`]: hyper reads only what the gate let through.
struct Prefixed {
    gate: Gate,
    sock: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            if !self.gate.ready.is_empty() {
                let n = self.gate.ready.len().min(buf.remaining());
                let chunk = self.gate.ready.split_to(n);
                buf.put_slice(&chunk);
                return Poll::Ready(Ok(()));
            }
            if self.gate.refused.is_some() {
                // `serve` shuts hyper down gracefully and answers the refused head itself:
                // wake it once so it sees the refusal (not on every poll: hyper may still be
                // streaming a response, and polls reads meanwhile).
                // Only now, not at the refusal: hyper asks for bytes with its own buffer empty,
                // so every accepted request before the refused head has reached the service,
                // and a graceful shutdown loses none of them.
                if !std::mem::replace(&mut self.gate.woken, true) {
                    self.gate.stop.store(true, Ordering::Release);
                    cx.waker().wake_by_ref();
                }
                return Poll::Pending;
            }
            let mut scratch = [0u8; 8192];
            let mut rb = ReadBuf::new(&mut scratch);
            match Pin::new(&mut self.sock).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    self.gate.eof();
                    if self.gate.refused.is_none() {
                        return Poll::Ready(Err(e));
                    }
                }
                Poll::Ready(Ok(())) if rb.filled().is_empty() => {
                    self.gate.eof();
                    if self.gate.refused.is_none() {
                        return Poll::Ready(Ok(()));
                    }
                }
                Poll::Ready(Ok(())) => {
                    let filled = rb.filled().to_vec();
                    self.gate.feed(&filled);
                }
            }
        }
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.sock).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.sock).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.sock).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.sock).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.sock.is_write_vectored()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    fn run(gate: &mut Gate, stream: &[u8], split: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = 0usize;
        for &n in split.iter().chain(std::iter::once(&usize::MAX)) {
            let end = at.saturating_add(n).min(stream.len());
            gate.feed(&stream[at..end]);
            out.extend_from_slice(&gate.ready.split());
            at = end;
            if at == stream.len() {
                break;
            }
        }
        out
    }

    const GOOD: &[u8] = b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n";
    const CHUNKED: &[u8] = b"POST http://a.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
        5;ext=1\r\nhello\r\nA \r\n0123456789\r\n0\r\nTrailer: x\r\n\r\n";
    const SIZED: &[u8] = b"POST http://a.test/ HTTP/1.1\r\nContent-Length: 4\r\n\r\n\r\n\r\n";
    const BAD: &[u8] = b"POST http://a.test/ HTTP/1.1\r\nContent-Length: abc\r\n\r\n";

    #[test]
    fn frames_bodies_and_stops_at_the_refused_head() {
        // A body that looks like a head end (`\r\n\r\n`) is body, not a head.
        let stream = [GOOD, CHUNKED, SIZED, b"\r\n", GOOD, BAD, GOOD].concat();
        let mut g = Gate::new(16 * 1024);
        let passed = run(&mut g, &stream, &[]);
        let before_bad = [GOOD, CHUNKED, SIZED, GOOD].concat();
        assert_eq!(passed, before_bad, "{}", String::from_utf8_lossy(&passed));
        let r = g.refused.as_ref().unwrap();
        assert_eq!(r.why.reason, Reason::Malformed);
        assert_eq!((r.method.as_str(), r.target.as_str()), ("POST", "http://a.test/"));
    }

    #[test]
    fn a_head_left_open_is_incomplete_and_an_idle_close_is_nothing() {
        let mut g = Gate::new(1024);
        g.feed(GOOD);
        g.eof();
        assert!(g.refused.is_none() && g.take_refusal(false, Duration::ZERO).is_none());
        let mut g = Gate::new(1024);
        g.feed(&GOOD[..10]);
        let r = g.take_refusal(false, Duration::ZERO).unwrap();
        assert_eq!(r.why.reason, Reason::IncompleteHead);
        let mut g = Gate::new(1024);
        g.feed(&GOOD[..10]);
        let r = g.take_refusal(true, Duration::from_secs(1)).unwrap();
        assert_eq!((r.why.reason, r.status), (Reason::Malformed, Status::HeadTimeout));
        let mut g = Gate::new(64);
        g.feed(&[b'G'; 100]);
        assert_eq!(g.refused.as_ref().unwrap().status, Status::HeadTooLarge);
    }

    #[test]
    fn broken_chunking_stops_checking() {
        let mut g = Gate::new(1024);
        let bad = b"POST http://a.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        g.feed(bad);
        assert_eq!(g.scan, Scan::Lost);
        assert!(g.refused.is_none());
    }

    proptest! {
        /// However the stream is split into reads, the gate passes the same bytes and reaches
        /// the same verdict; it never panics on arbitrary input.
        #[test]
        fn splits_do_not_matter(
            pieces in prop::collection::vec(0..6usize, 1..6),
            split in prop::collection::vec(1..40usize, 0..20),
            junk in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let all = [GOOD, CHUNKED, SIZED, BAD, &junk];
            let stream: Vec<u8> =
                pieces.iter().flat_map(|&i| all[i.min(4)].iter().copied()).collect();
            let mut whole = Gate::new(4096);
            let a = run(&mut whole, &stream, &[]);
            let mut parts = Gate::new(4096);
            let b = run(&mut parts, &stream, &split);
            prop_assert_eq!(a, b);
            prop_assert_eq!(whole.scan, parts.scan);
            prop_assert_eq!(whole.refused.is_some(), parts.refused.is_some());
        }
    }
}
