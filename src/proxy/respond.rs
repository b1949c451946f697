//! Refusal responses and audit-line construction shared by the tunnel and HTTP paths. The
//! order is always the same: the audit line is written first, the response second; if the line
//! cannot be written the client gets `503` and nothing is forwarded (DESIGN §5).

use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::audit::{AuditLine, rfc3339_ms};
use crate::policy::{Decision, LayerKind, Reason};

use super::SessionProxy;
use super::guard::Unreachable;
use super::head::HeadRefusal;

/// The non-2xx answers the proxy itself gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Forbidden,
    Bad,
    HeadTooLarge,
    HeadTimeout,
    Unavailable,
    BadGateway,
    GatewayTimeout,
}

impl Status {
    pub fn code(self) -> u16 {
        match self {
            Self::Forbidden => 403,
            Self::Bad => 400,
            Self::HeadTooLarge => 431,
            Self::HeadTimeout => 408,
            Self::Unavailable => 503,
            Self::BadGateway => 502,
            Self::GatewayTimeout => 504,
        }
    }

    /// The reason phrase; a policy refusal's is fixed by SECURITY §3.
    pub fn phrase(self) -> &'static str {
        match self {
            Self::Forbidden => "Forbidden by airlock policy",
            Self::Bad => "Bad Request",
            Self::HeadTooLarge => "Request Header Fields Too Large",
            Self::HeadTimeout => "Request Timeout",
            Self::Unavailable => "Service Unavailable",
            Self::BadGateway => "Bad Gateway",
            Self::GatewayTimeout => "Gateway Timeout",
        }
    }
}

/// A fresh line for an attempt starting now: stamped, attributed, `allowed: false`. Its
/// `duration_ms` is unset: the path that ends the attempt fills it in (an immediate refusal
/// too — the page's denied line carries `"duration_ms":0`; an interrupted one never has it).
pub fn new_line(session: &SessionProxy, host: &str, port: Option<u16>, method: &str) -> AuditLine {
    begin(session, host, port, method).0
}

/// [`new_line`] and the policy in force when the attempt started, taken together
/// ([`SessionProxy::stamp_with_policy`]): the attempt is decided entirely by that policy, and
/// its line names that policy's phase.
pub fn begin(
    session: &SessionProxy,
    host: &str,
    port: Option<u16>,
    method: &str,
) -> (AuditLine, std::sync::Arc<crate::policy::Policy>) {
    let (stamp, policy) = session.stamp_with_policy();
    let line = AuditLine {
        user_id: session.identity.user_id.clone(),
        repo: session.identity.repo.clone(),
        repo_path: session.identity.repo_path.clone(),
        repo_key: session.identity.repo_key.clone(),
        phase: policy.phase().map(str::to_owned),
        ..AuditLine::attempt(rfc3339_ms(SystemTime::now()), stamp, host, port, method)
    };
    (line, policy)
}

/// Marks `line` as refused by `d`.
pub fn set_refusal(line: &mut AuditLine, d: &Decision) {
    line.allowed = false;
    set_decision(line, d);
}

/// Marks `line` as allowed by `d`: `reason`, `layer`, `policy` and `rule` of the allowing
/// entry, as docs/audit-format.md promises for allowed lines.
pub fn set_allowed(line: &mut AuditLine, d: &Decision) {
    line.allowed = true;
    set_decision(line, d);
}

/// Marks `line` as refused for `reason` by no rule (caps, upstream failures, SNI, malformed
/// input): `layer` `none`, and no `policy` or `rule` even if an entry had allowed the target.
pub fn set_failure(line: &mut AuditLine, reason: Reason) {
    line.allowed = false;
    line.reason = Some(reason);
    line.layer = Some(LayerKind::None);
    line.policy = None;
    line.rule = None;
}

fn set_decision(line: &mut AuditLine, d: &Decision) {
    line.reason = Some(d.reason);
    line.layer = Some(d.layer);
    line.policy = d.policy.clone();
    line.rule = d.rule.clone();
}

/// Records on `line` why an allowed attempt never reached its upstream, and returns the status
/// to answer with and the detail for the body (shared by the tunnel and plain-HTTP paths).
pub fn set_unreachable<'a>(
    line: &mut AuditLine,
    why: &'a Unreachable,
) -> (Status, Option<&'a str>) {
    match why {
        Unreachable::Refused { decision, answers } => {
            set_refusal(line, decision);
            line.refused_addrs = Some(answers.iter().map(|ip| ip.to_string()).collect());
            (Status::Forbidden, None)
        }
        Unreachable::ResolveFailed { detail, timed_out }
        | Unreachable::ConnectFailed { detail, timed_out } => {
            set_failure(line, why.reason());
            let status = if *timed_out { Status::GatewayTimeout } else { Status::BadGateway };
            (status, Some(detail.as_str()))
        }
        Unreachable::DnsLimit { detail } => {
            set_failure(line, Reason::DnsLimit);
            (Status::Unavailable, Some(detail.as_str()))
        }
        Unreachable::Gated { reason, detail, rule, layer, policy } => {
            line.allowed = false;
            line.reason = Some(*reason);
            line.layer = Some(*layer);
            line.policy = Some(policy.clone());
            line.rule = Some(rule.clone());
            (status_for(*reason), Some(detail.as_str()))
        }
    }
}

/// The status a refusal reason is answered with.
pub fn status_for(reason: Reason) -> Status {
    match reason {
        Reason::Malformed | Reason::IncompleteHead => Status::Bad,
        Reason::TunnelLimit
        | Reason::AuditUnavailable
        | Reason::DnsLimit
        | Reason::ConnectionLimit
        | Reason::GateLimit
        | Reason::GateUnavailable => Status::Unavailable,
        Reason::ResolveFailed | Reason::ConnectFailed => Status::BadGateway,
        _ => Status::Forbidden,
    }
}

/// The body of a refusal: names the target and tells the agent not to retry.
pub fn body_for(target: &str, reason: Reason, detail: Option<&str>) -> String {
    let why = match reason {
        Reason::Malformed => "the request was malformed",
        Reason::IncompleteHead => "the connection ended before the request head was complete",
        Reason::TunnelLimit => "this session has too many open tunnels",
        Reason::DnsLimit => "too many name resolutions are in flight",
        Reason::ConnectionLimit => "too many connections are open",
        Reason::AuditUnavailable => "the audit log cannot be written, so nothing is forwarded",
        Reason::ResolveFailed => "the name could not be resolved",
        Reason::ConnectFailed => "no address of the host accepted the connection",
        Reason::PrivateAddress => "it resolves to a private or special-purpose address",
        Reason::BlockedAddress => "it resolves to a blocked address",
        Reason::ReviewPlane => "it is a review-plane server",
        Reason::GateDenied => "the person asked to approve it (an action gate) denied it",
        Reason::GateExpired => "no one approved it (an action gate) in time",
        Reason::GateLimit => "this session has too many attempts waiting for a gate decision",
        Reason::GateUnavailable => {
            "it needs a person's approval (an action gate) and no one can decide here"
        }
        _ => "the policy does not allow it",
    };
    let mut s = format!("airlock: {target} refused: {why} (reason: {reason}).");
    if let Some(d) = detail {
        s.push_str("\nDetail: ");
        s.push_str(d);
    }
    if matches!(
        reason,
        Reason::TunnelLimit
            | Reason::ResolveFailed
            | Reason::ConnectFailed
            | Reason::DnsLimit
            | Reason::ConnectionLimit
            | Reason::GateLimit
    ) {
        s.push_str("\nThis may be temporary.\n");
    } else if matches!(reason, Reason::GateDenied | Reason::GateExpired) {
        s.push_str(
            "\nDo not work around it. Tell the user what you tried to do and why; they decide \
             with `airlock gate` (a retry asks again).\n",
        );
    } else {
        s.push_str(
            "\nDo not retry this request or work around it; ask the user to change the \
             airlock policy if this host is needed.\n",
        );
    }
    s
}

/// A complete HTTP/1.1 response that closes the connection.
pub fn response_bytes(status: Status, reason: Reason, layer: LayerKind, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {} {}\r\nX-Airlock-Reason: {}\r\nX-Airlock-Layer: {}\r\n\
         Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{}",
        status.code(),
        status.phrase(),
        reason,
        layer,
        body.len(),
        body
    )
    .into_bytes()
}

/// Sends a final response and closes gracefully: half-close, then discard what the client
/// still sends for a moment so the kernel does not answer it with a reset that would destroy
/// the response in flight (RFC 9112 §9.6).
pub async fn send_and_close(sock: &mut TcpStream, bytes: &[u8]) {
    if sock.write_all(bytes).await.is_err() {
        return;
    }
    let _ = sock.shutdown().await;
    let drain = async {
        let mut scratch = [0u8; 4096];
        let mut total = 0usize;
        while total < 256 * 1024 {
            match sock.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(500), drain).await;
}

/// Why a head was refused, as [`malformed`] records it: a bare message is `malformed`; a
/// [`HeadRefusal`] carries its own code (`incomplete_head`).
pub trait Refusal {
    fn reason(&self) -> Reason;
    fn text(&self) -> &str;
}

impl Refusal for str {
    fn reason(&self) -> Reason {
        Reason::Malformed
    }
    fn text(&self) -> &str {
        self
    }
}

impl Refusal for String {
    fn reason(&self) -> Reason {
        Reason::Malformed
    }
    fn text(&self) -> &str {
        self
    }
}

impl Refusal for HeadRefusal {
    fn reason(&self) -> Reason {
        self.reason
    }
    fn text(&self) -> &str {
        &self.msg
    }
}

/// Audits and answers a refused head: malformed, cut off early, too large or too slow. Exactly
/// one audit line, written before the response (which may find the peer gone: the line stands).
pub async fn malformed<R: Refusal + ?Sized>(
    session: &SessionProxy,
    sock: &mut TcpStream,
    method: &str,
    target: &str,
    why: &R,
    status: Status,
) {
    let (reason, msg) = (why.reason(), why.text());
    let mut line = new_line(session, target, None, method);
    line.reason = Some(reason);
    line.layer = Some(LayerKind::None);
    // Refused on the spot: nothing was opened, so the attempt took no measurable time.
    line.duration_ms = Some(0);
    let shown = if target.is_empty() { "the request" } else { target };
    let bytes = match session.audit.append(&line) {
        Ok(()) => response_bytes(
            status,
            reason,
            LayerKind::None,
            &body_for(&printable(shown), reason, Some(msg)),
        ),
        Err(e) => audit_failed(&e, shown),
    };
    send_and_close(sock, &bytes).await;
}

/// The 503 sent when the audit trail cannot be written.
pub fn audit_failed(e: &crate::audit::AuditError, target: &str) -> Vec<u8> {
    tracing::error!("audit write failed, refusing {target}: {e}");
    response_bytes(
        Status::Unavailable,
        Reason::AuditUnavailable,
        LayerKind::None,
        &body_for(&printable(target), Reason::AuditUnavailable, None),
    )
}

/// The method and target of an unparseable head, lossily, for the audit line.
pub fn first_words(head: &[u8]) -> (String, String) {
    let first = head.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let text = String::from_utf8_lossy(first);
    let mut words = text.split_ascii_whitespace();
    let method = words.next().unwrap_or("").chars().take(32).collect();
    let target = words.next().unwrap_or("").chars().take(2048).collect();
    (method, target)
}

/// Input echoed in a response body: control characters escaped, length capped.
pub fn printable(s: &str) -> String {
    let mut out: String = s.chars().take(256).flat_map(char::escape_default).collect();
    if s.chars().count() > 256 {
        out.push('…');
    }
    out
}
