//! Plain-HTTP proxying (RFC 9112 §3.2.2 absolute-form): hyper parses each request on a
//! kept-alive agent connection; every request is decided and audited on its own, then sent to
//! the upstream over a fresh connection to a checked address. `Host` is regenerated from the
//! target (a different `Host` header never decides anything), hop-by-hop and `Proxy-*` headers
//! are removed both ways (RFC 9110 §7.6.1), and bodies stream through without buffering.

use std::convert::Infallible;
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
use super::guard;
use super::respond::{self, Status};

/// The body type of every response the proxy gives.
pub type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// Serves plain-HTTP requests on `sock`; `buffered` holds bytes already read (the first head
/// and whatever followed it).
pub async fn serve(session: &Arc<SessionProxy>, sock: TcpStream, buffered: Vec<u8>) {
    let io = TokioIo::new(Prefixed { pre: Bytes::from(buffered), sock });
    let s = Arc::clone(session);
    let svc = service_fn(move |req| {
        let s = Arc::clone(&s);
        async move { Ok::<_, Infallible>(handle_request(&s, req).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(session.limits.header_timeout)
        // hyper refuses buffers under 8 KiB; heads beyond the cap get 431.
        .max_buf_size(session.limits.max_header_bytes.max(8192))
        .title_case_headers(true)
        .keep_alive(true);
    let conn = builder.serve_connection(io, svc);
    let mut kill = session.kill.subscribe();
    tokio::select! {
        r = conn => if let Err(e) = r { tracing::debug!("plain-HTTP connection ended: {e}") },
        () = super::stopped(&mut kill) => {}
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
    let mut line = respond::new_line(s, &host.to_string(), Some(port), &method);
    line.url = Some(url);

    let decision = s.policy.decide(&host, port, &s.local);
    if !decision.is_allowed() {
        respond::set_refusal(&mut line, &decision);
        line.duration_ms = Some(ms_since(started));
        return match s.audit.append(&line) {
            Ok(()) => refusal(Status::Forbidden, decision.reason, decision.layer, &target, None),
            Err(e) => audit_failed(&e, &target),
        };
    }
    line.allowed = true;
    if let Err(e) = s.audit.journal_open(&line) {
        return audit_failed(&e, &target);
    }
    let reached = match guard::resolve_checked(s, &host, port).await {
        Ok(addrs) => guard::dial(s, &addrs, port).await,
        Err(e) => Err(e),
    };
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
            line.allowed = false;
            line.reason = Some(Reason::Malformed);
            line.layer = Some(LayerKind::None);
            return close_refused(s, &mut line, started, Status::Bad, &target, Some(&msg));
        }
    };
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
            Ok(x) => x,
            Err(e) => {
                line.allowed = false;
                line.reason = Some(Reason::ConnectFailed);
                line.layer = Some(LayerKind::None);
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
            line.allowed = false;
            line.reason = Some(Reason::ConnectFailed);
            line.layer = Some(LayerKind::None);
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

/// The agent's socket with the bytes already read in front of it.
struct Prefixed {
    pre: Bytes,
    sock: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            let chunk = self.pre.split_to(n);
            buf.put_slice(&chunk);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.sock).poll_read(cx, buf)
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
