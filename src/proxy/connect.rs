//! `CONNECT` tunnels (RFC 9110 §9.3.6): parse → canonicalize → decide → audit/journal →
//! resolve once → check every answer → dial → `200` → ClientHello/SNI check → splice →
//! final audit line with byte counts, duration and the dialed address.

use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::audit::AuditLine;
use crate::policy::{LayerKind, Reason, parse_authority};

use super::SessionProxy;
use super::guard;
use super::respond::{self, Status};
use super::splice::{self, Meter, TunnelEnd};
use super::tls_peek::{self, Peek};

/// Handles one CONNECT whose head has been read; `early` holds bytes the agent sent after the
/// head without waiting for `200` (they are tunnel data).
pub async fn handle(
    session: &Arc<SessionProxy>,
    mut sock: TcpStream,
    authority: &str,
    http10: bool,
    early: Vec<u8>,
) {
    let started = Instant::now();
    let (host, port) = match parse_authority(authority) {
        Ok(t) => t,
        Err(m) => {
            let msg = format!("bad CONNECT target: {m}");
            respond::malformed(session, &mut sock, "CONNECT", authority, &msg, Status::Bad).await;
            return;
        }
    };
    // A synthetic address of this session stands for its name (`super::synthetic`).
    let host = match session.synthetic.target(host) {
        Ok(h) => h,
        Err(addr) => {
            let mut line = respond::new_line(session, &addr.to_string(), Some(port), "CONNECT");
            line.reason = Some(Reason::IpNotAllowed);
            line.layer = Some(LayerKind::None);
            line.duration_ms = Some(ms_since(started));
            let target = format!("{addr}:{port}");
            let detail = Some(super::synthetic::FOREIGN_DETAIL);
            refuse_with_append(session, &mut sock, &line, &target, detail).await;
            return;
        }
    };
    let target = host.authority(port);
    let (mut line, policy) = respond::begin(session, &host.to_string(), Some(port), "CONNECT");

    let decision = policy.decide(&host, port, &session.local());
    if !decision.is_allowed() {
        respond::set_refusal(&mut line, &decision);
        line.duration_ms = Some(ms_since(started));
        refuse_with_append(session, &mut sock, &line, &target, None).await;
        return;
    }
    let Some(_slot) = session.claim_tunnel() else {
        line.reason = Some(Reason::TunnelLimit);
        line.layer = Some(LayerKind::None);
        line.duration_ms = Some(ms_since(started));
        let detail = format!("at most {} open tunnels per session", session.limits.max_tunnels);
        refuse_with_append(session, &mut sock, &line, &target, Some(&detail)).await;
        return;
    };

    // Allowed: from here on the attempt lives in the journal until its final line.
    respond::set_allowed(&mut line, &decision);
    if let Err(e) = session.audit.journal_open(&line) {
        respond::send_and_close(&mut sock, &respond::audit_failed(&e, &target)).await;
        return;
    }
    let reached =
        super::gatehold::reach(session, &policy, &mut line, &host, port, None, Some(&sock)).await;
    let (upstream, addr) = match reached {
        Ok(r) => r,
        Err(why) => {
            let (status, detail) = respond::set_unreachable(&mut line, &why);
            line.duration_ms = Some(ms_since(started));
            refuse_with_close(session, &mut sock, &line, &target, status, detail).await;
            return;
        }
    };
    line.addr = Some(addr.to_string());

    let ok: &[u8] = if http10 {
        b"HTTP/1.0 200 Connection established\r\n\r\n"
    } else {
        b"HTTP/1.1 200 Connection established\r\n\r\n"
    };
    if sock.write_all(ok).await.is_err() {
        finish(session, line, started, 0, 0, None);
        return;
    }

    let mut first = early;
    if !policy.skip_sni_peek(&host, port) {
        let seen = read_client_hello(session, &mut sock, &mut first).await;
        if let Err(reason) = guard::judge_sni(&host, seen.as_ref()) {
            // Nothing has been forwarded: close both sides and record why.
            respond::set_failure(&mut line, reason);
            line.sni = guard::seen_sni(seen.as_ref());
            finish(session, line, started, 0, 0, None);
            return;
        }
    }

    relay(session, line, started, &sock, &upstream, first).await;
}

/// The tunnel of an allowed, dialed attempt (a CONNECT or a captured connection): forwards
/// the agent's already-read first flight, pumps both ways until either side ends, and writes
/// the final line with the byte counts.
pub(super) async fn relay(
    session: &SessionProxy,
    line: AuditLine,
    started: Instant,
    sock: &TcpStream,
    upstream: &TcpStream,
    first: Vec<u8>,
) {
    let tunnel = Meter::default();
    let mut sent_early = 0u64;
    if !first.is_empty() {
        if splice::write_all(upstream, &first).await.is_err() {
            finish(session, line, started, 0, 0, None);
            return;
        }
        sent_early = first.len() as u64;
        session.counters.bytes.sent.fetch_add(sent_early, std::sync::atomic::Ordering::Relaxed);
    }
    drop(first);
    let end = splice::pump(
        sock,
        upstream,
        session.limits.idle_timeout,
        session.kill.subscribe(),
        &tunnel,
        &session.counters.bytes,
    )
    .await;
    let sent = sent_early + tunnel.sent.load(std::sync::atomic::Ordering::Relaxed);
    let recv = tunnel.recv.load(std::sync::atomic::Ordering::Relaxed);
    finish(session, line, started, sent, recv, Some(end));
}

/// Reads the agent's first TLS flight into `buf` until the ClientHello is complete (or it is
/// clearly not TLS, malformed, over the cap, or late). `None`: nothing usable arrived in time.
pub(super) async fn read_client_hello(
    session: &SessionProxy,
    sock: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Option<Peek> {
    let cap = session.limits.max_client_hello;
    let read = async {
        let mut chunk = vec![0u8; 4096];
        loop {
            match tls_peek::peek(buf, cap) {
                Peek::NeedMore => {}
                done => return Some(done),
            }
            // Header + cap + per-record overhead bounds what we ever buffer.
            if buf.len() > cap + 5 * (cap / 16384 + 2) {
                return Some(Peek::Malformed("ClientHello larger than the cap"));
            }
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(session.limits.client_hello_timeout, read).await.ok().flatten()
}

/// A refusal decided before anything was opened: append the line, then answer.
async fn refuse_with_append(
    session: &SessionProxy,
    sock: &mut TcpStream,
    line: &AuditLine,
    target: &str,
    detail: Option<&str>,
) {
    let reason = line.reason.unwrap_or(Reason::NotAllowed);
    let bytes = match session.audit.append(line) {
        Ok(()) => respond::response_bytes(
            respond::status_for(reason),
            reason,
            line.layer.unwrap_or(LayerKind::None),
            &respond::body_for(target, reason, detail),
        ),
        Err(e) => respond::audit_failed(&e, target),
    };
    respond::send_and_close(sock, &bytes).await;
}

/// A refusal after the journal record was opened: close it with the final line, then answer.
async fn refuse_with_close(
    session: &SessionProxy,
    sock: &mut TcpStream,
    line: &AuditLine,
    target: &str,
    status: Status,
    detail: Option<&str>,
) {
    let reason = line.reason.unwrap_or(Reason::NotAllowed);
    let bytes = match session.audit.journal_close(line) {
        Ok(()) => respond::response_bytes(
            status,
            reason,
            line.layer.unwrap_or(LayerKind::None),
            &respond::body_for(target, reason, detail),
        ),
        Err(e) => respond::audit_failed(&e, target),
    };
    respond::send_and_close(sock, &bytes).await;
}

/// Writes the tunnel's final line (retiring its journal record).
pub(super) fn finish(
    session: &SessionProxy,
    mut line: AuditLine,
    started: Instant,
    sent: u64,
    recv: u64,
    end: Option<TunnelEnd>,
) {
    line.bytes_sent = Some(sent);
    line.bytes_recv = Some(recv);
    line.duration_ms = Some(ms_since(started));
    match end {
        Some(TunnelEnd::Drained) => line.interrupted = Some(true),
        Some(TunnelEnd::Failed(e)) => tracing::debug!("tunnel {} ended with {e}", line.id),
        _ => {}
    }
    if let Err(e) = session.audit.journal_close(&line) {
        // The journal record stays; a later writer settles it as interrupted.
        tracing::error!("cannot write the final audit line of {}: {e}", line.id);
    }
}

pub(crate) fn ms_since(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
}
