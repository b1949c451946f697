//! `session_inbound` (capability `session_inbound`): the `inbound` audit line of one
//! connection through a `--port`, written through the session's own sink like every other line
//! (docs/audit-format.md, *Inbound lines*). The supervisor relays the bytes; the daemon owns
//! the line.

use std::net::SocketAddr;

use crate::audit::AuditLine;
use crate::policy::Reason;
use crate::protocol::InboundRecord;
use crate::proxy::SessionProxy;

/// The line for `rec`, or why the record is unusable (it names addresses that do not parse, or
/// a refusal code that is not one of the two an inbound connection can have).
pub(super) fn line_for(session: &SessionProxy, rec: &InboundRecord) -> Result<AuditLine, String> {
    let peer: SocketAddr =
        rec.peer.parse().map_err(|_| format!("inbound peer {:?} is not ip:port", rec.peer))?;
    let listen: SocketAddr = rec
        .listen
        .parse()
        .map_err(|_| format!("inbound listen {:?} is not ip:port", rec.listen))?;
    let reason = match rec.refused.as_deref() {
        None => Reason::Allowed,
        Some("connect_failed") => Reason::ConnectFailed,
        Some("connection_limit") => Reason::ConnectionLimit,
        Some(other) => return Err(format!("inbound refusal {other:?} is not an inbound reason")),
    };
    let mut line = crate::proxy::respond::new_line(session, "127.0.0.1", Some(rec.port), "INBOUND");
    // The connection's own start, as the supervisor saw it (the line is written at close).
    let rfc3339 = &time::format_description::well_known::Rfc3339;
    if rec.ts.len() <= 40 && time::OffsetDateTime::parse(&rec.ts, rfc3339).is_ok() {
        line.ts = rec.ts.clone();
    }
    line.allowed = rec.refused.is_none();
    line.reason = Some(reason);
    line.peer = Some(peer.to_string());
    line.listen = Some(listen.to_string());
    line.duration_ms = Some(rec.duration_ms);
    if line.allowed {
        // From the agent's side, as on every line: sent = from the sandbox to the peer.
        line.bytes_sent = Some(rec.bytes_from_sandbox);
        line.bytes_recv = Some(rec.bytes_to_sandbox);
    }
    Ok(line)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn session_proxy() -> std::sync::Arc<SessionProxy> {
        super::super::state::tests::session("s", "2026-07-24T18:00:00.000Z").proxy.clone()
    }

    fn record() -> InboundRecord {
        InboundRecord {
            session: "s".into(),
            ts: "2026-07-24T18:03:11.482Z".into(),
            peer: "127.0.0.1:51000".into(),
            listen: "127.0.0.7:3000".into(),
            port: 3000,
            bytes_to_sandbox: 80,
            bytes_from_sandbox: 1200,
            duration_ms: 15,
            refused: None,
            error: None,
        }
    }

    #[test]
    fn a_served_connection_is_an_allowed_inbound_line() {
        let s = session_proxy();
        let line = line_for(&s, &record()).unwrap();
        assert_eq!(line.method, "INBOUND");
        assert_eq!(line.host, "127.0.0.1");
        assert_eq!(line.port, Some(3000));
        assert!(line.allowed);
        assert_eq!(line.reason, Some(Reason::Allowed));
        assert_eq!(line.peer.as_deref(), Some("127.0.0.1:51000"));
        assert_eq!(line.listen.as_deref(), Some("127.0.0.7:3000"));
        assert_eq!((line.bytes_sent, line.bytes_recv), (Some(1200), Some(80)));
        assert_eq!(line.duration_ms, Some(15));
        assert_eq!(line.ts, "2026-07-24T18:03:11.482Z");
        assert!(line.layer.is_none() && line.policy.is_none());
    }

    #[test]
    fn refusals_and_bad_records() {
        let s = session_proxy();
        let refused = InboundRecord { refused: Some("connect_failed".into()), ..record() };
        let line = line_for(&s, &refused).unwrap();
        assert!(!line.allowed);
        assert_eq!(line.reason, Some(Reason::ConnectFailed));
        assert!(line.bytes_sent.is_none());
        let bad = InboundRecord { peer: "nope".into(), ..record() };
        assert!(line_for(&s, &bad).unwrap_err().contains("not ip:port"));
        let odd = InboundRecord { refused: Some("blocked".into()), ..record() };
        assert!(line_for(&s, &odd).is_err());
        // A timestamp that is not RFC 3339 is replaced by the daemon's own.
        let late = InboundRecord { ts: "yesterday".into(), ..record() };
        assert_ne!(line_for(&s, &late).unwrap().ts, "yesterday");
    }
}
