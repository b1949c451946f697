//! Holding a gated attempt (docs/gates.md): after the policy allowed it and every resolved
//! answer passed the address guard, and before a single byte or connection goes upstream, an
//! attempt whose target a `[gate]` entry names waits here for a person's decision. Approved:
//! the checked addresses are dialed and the attempt goes on exactly as an allowed one.
//! Denied, expired, over the per-session cap, or with no one to decide: it is refused, and no
//! connection to the target was ever made.
//!
//! Every step is an audit line of its own (`method: "GATE"`, docs/audit-format.md), written
//! with `append` while the attempt itself stays open in the journal, so a daemon killed
//! mid-hold leaves the attempt to be settled `interrupted`.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use tokio::net::TcpStream;

use crate::audit::{AuditLine, GateRecord, GateStep, rfc3339_ms};
use crate::gate::book::{Decided, Opening};
use crate::gate::{EgressAction, digest};
use crate::policy::{GateMatch, Host, Reason};
use crate::protocol::GateInfo;

use super::SessionProxy;
use super::guard::{self, Unreachable};

/// The method of a gate's step lines.
pub const STEP_METHOD: &str = "GATE";

/// [`guard::reach`] with the gate in between: resolve and check every answer, hold the
/// attempt if its target (by name, or by an answer in a gated address range) is gated, then
/// dial. `request` is a plain-HTTP request line (part of
/// what is approved); `client` is the agent's socket when the proxy owns it, watched so a hold
/// whose client went away ends at once. On a gated attempt `line.gate` is set to the last
/// step, for the attempt's final line.
pub async fn reach(
    session: &SessionProxy,
    policy: &crate::policy::Policy,
    line: &mut AuditLine,
    host: &Host,
    port: u16,
    request: Option<&str>,
    client: Option<&TcpStream>,
) -> Result<(TcpStream, SocketAddr), Unreachable> {
    let by_name = policy.gate(host, port);
    if by_name.is_none() && !policy.has_address_gates() {
        return guard::reach(session, policy, host, port).await;
    }
    let addrs = guard::resolve_checked(session, policy, host, port).await?;
    // An address-range gate holds every name that resolves into it.
    if let Some(gate) = by_name.or_else(|| policy.gate_answers(&addrs, port)) {
        hold(session, line, &gate, port, request, client).await?;
    }
    guard::dial(session, &addrs, port).await
}

/// Waits for the decision on one attempt; `Ok` once approved.
async fn hold(
    session: &SessionProxy,
    line: &mut AuditLine,
    gate: &GateMatch,
    port: u16,
    request: Option<&str>,
    client: Option<&TcpStream>,
) -> Result<(), Unreachable> {
    let refused = |reason, detail: String| refusal(gate, reason, detail);
    let Some(book) = session.gates.as_ref() else {
        return Err(refused(
            Reason::GateUnavailable,
            format!(
                "{} is gated by {:?} in {} and this proxy keeps no gates (the standalone \
                 `airlockd proxy` has no one to ask); run the agent with `airlock exec` or \
                 `airlock run`",
                line.host, gate.rule, gate.policy
            ),
        ));
    };
    let method = line.method.clone();
    let action = EgressAction {
        session: &line.session,
        attempt: &line.id,
        method: &method,
        host: &line.host,
        port,
        request,
    }
    .canonical();
    let info = gate_info(line, gate, "egress", &method, request, action, session);
    wait_for_decision(session, book, line, gate, info, client, true, &mut None).await
}

/// The [`GateInfo`] of one held attempt (its target is `line`'s): `action` is its canonical
/// text.
pub(super) fn gate_info(
    line: &AuditLine,
    gate: &GateMatch,
    kind: &str,
    method: &str,
    request: Option<&str>,
    action: String,
    session: &SessionProxy,
) -> GateInfo {
    let now = SystemTime::now();
    GateInfo {
        id: String::new(),
        kind: kind.into(),
        session: line.session.clone(),
        repo: line.repo.clone(),
        repo_key: line.repo_key.clone(),
        user_id: line.user_id.clone(),
        method: method.to_owned(),
        host: line.host.clone(),
        port: line.port.unwrap_or_default(),
        request: request.map(str::to_owned),
        digest: digest(&action),
        action,
        severity: gate.severity.as_str().to_owned(),
        rule: gate.rule.clone(),
        layer: gate.layer.as_str().to_owned(),
        policy: gate.policy.clone(),
        requested_at: rfc3339_ms(now),
        deadline: rfc3339_ms(now + session.policy().gate_timeout()),
        // Set by the book from the session's relay.
        relay: None,
    }
}

/// Opens the gate for `info` in `book`, writes its `requested` line, waits for the decision,
/// the `[gate] timeout`, the client hanging up or the session stopping, and writes the step
/// that ended it. `Ok` once approved; `line.gate` holds the last step either way (as a final
/// line carries it), and `last_step` the whole step (who decided, the note, the server's id).
/// `journaled`: the attempt's journal record is open (egress), so a hold whose future is
/// dropped (hyper drops a plain-HTTP request's when the agent hangs up) closes it `abandoned`.
#[allow(clippy::too_many_arguments)] // One hold's whole context; a struct would be built once.
pub(super) async fn wait_for_decision(
    session: &SessionProxy,
    book: &std::sync::Arc<crate::gate::GateBook>,
    line: &mut AuditLine,
    gate: &GateMatch,
    info: GateInfo,
    client: Option<&TcpStream>,
    journaled: bool,
    last_step: &mut Option<GateRecord>,
) -> Result<(), Unreachable> {
    let refused = |reason, detail: String| refusal(gate, reason, detail);
    let timeout = session.policy().gate_timeout();
    let mut record = GateRecord {
        id: String::new(),
        step: GateStep::Requested,
        digest: info.digest.clone(),
        severity: gate.severity,
        method: Some(info.method.clone()),
        deadline: Some(info.deadline.clone()),
        by: None,
        decided_at: None,
        note: None,
        self_decided: None,
        server: None,
    };
    let port = info.port;
    // The `requested` line is written before the gate is visible: a gate that cannot be
    // recorded is never listed, notified or decided (DESIGN §5, audit first).
    let opened = book.open_recorded(info, session.gate_relay.as_ref(), |id| {
        record.id = id.to_owned();
        session.audit.append(&step_line(line, gate, &record))
    });
    let mut ticket = match opened {
        Ok(t) => t,
        Err(Opening::Limit(e)) => {
            return Err(refused(
                Reason::GateLimit,
                format!("{e}; wait for a decision on them before asking again"),
            ));
        }
        Err(Opening::Record(e)) => {
            tracing::error!("cannot write the gate request line of {}: {e}", line.id);
            return Err(refused(Reason::AuditUnavailable, e.to_string()));
        }
    };
    tracing::info!(
        "gate {} holds {} {}:{port} of session {} (rule {:?}, {}s)",
        record.id,
        line.method,
        line.host,
        line.session,
        gate.rule,
        timeout.as_secs()
    );
    let mut dropped = DroppedHold::arm(session, line, gate, &record, journaled);

    let mut kill = session.kill.subscribe();
    let waited = tokio::select! {
        d = ticket.decided() => match d {
            Some(d) => Outcome::Decided(d),
            None => Outcome::Abandoned("the session ended before anyone decided"),
        },
        () = tokio::time::sleep(timeout) => Outcome::Expired,
        () = client_gone(client) => Outcome::Abandoned("the agent closed the connection"),
        () = super::stopped(&mut kill) => Outcome::Abandoned("the session is stopping"),
    };
    // A decision that raced the expiry or the hang-up wins: the decider was told it took.
    let outcome = match waited {
        Outcome::Decided(d) => Outcome::Decided(d),
        other => ticket.withdraw().await.map_or(other, Outcome::Decided),
    };
    drop(ticket);
    dropped.disarm();

    record.deadline = None;
    record.method = None;
    let result = match &outcome {
        Outcome::Decided(d) if d.unavailable => {
            // Nobody could decide (the review server was unreachable or refused the gate):
            // withdrawn, never approved.
            record.step = GateStep::Abandoned;
            record.note = (!d.note.is_empty()).then(|| d.note.clone());
            record.server = d.server_gate.clone().filter(|g| !g.is_empty());
            Err(refused(Reason::GateUnavailable, d.note.clone()))
        }
        Outcome::Decided(d) => {
            record.step = if d.approve { GateStep::Approved } else { GateStep::Denied };
            record.by = Some(d.by.clone());
            record.decided_at = Some(d.at.clone());
            record.note = (!d.note.is_empty()).then(|| d.note.clone());
            record.self_decided = Some(d.self_decided);
            record.server = d.server_gate.clone();
            if d.approve {
                Ok(())
            } else {
                let note = if d.note.is_empty() { String::new() } else { format!(": {}", d.note) };
                Err(refused(Reason::GateDenied, format!("denied by {}{note}", d.by)))
            }
        }
        Outcome::Expired => {
            record.step = GateStep::Expired;
            Err(refused(
                Reason::GateExpired,
                format!(
                    "no decision within {}s ([gate] timeout); the user can approve it with \
                     `airlock gate approve` when it is asked again",
                    timeout.as_secs()
                ),
            ))
        }
        Outcome::Abandoned(why) => {
            record.step = GateStep::Abandoned;
            Err(refused(Reason::GateAbandoned, (*why).to_owned()))
        }
    };
    // The step line, then the attempt's own outcome: the journal record is still open, so a
    // failure here leaves the attempt to be settled, never forwarded unrecorded.
    let step = step_line(line, gate, &record);
    line.gate = Some(record.on_final_line());
    *last_step = Some(record);
    if let Err(e) = session.audit.append(&step) {
        tracing::error!("cannot write the gate decision line of {}: {e}", line.id);
        return Err(refused(Reason::AuditUnavailable, e.to_string()));
    }
    result
}

/// Written if a hold's future is dropped before it ends (its task was cancelled): the
/// `abandoned` step and, for a journaled attempt, its final line.
struct DroppedHold {
    audit: std::sync::Arc<dyn crate::audit::AuditSink>,
    lines: Option<(AuditLine, Option<AuditLine>)>,
}

impl DroppedHold {
    fn arm(
        session: &SessionProxy,
        line: &AuditLine,
        gate: &GateMatch,
        record: &GateRecord,
        journaled: bool,
    ) -> Self {
        let mut abandoned = record.clone();
        abandoned.step = GateStep::Abandoned;
        abandoned.deadline = None;
        abandoned.method = None;
        let step = step_line(line, gate, &abandoned);
        let last = journaled.then(|| {
            let mut last = line.clone();
            last.allowed = false;
            last.reason = Some(Reason::GateAbandoned);
            last.layer = Some(gate.layer);
            last.policy = Some(gate.policy.clone());
            last.rule = Some(gate.rule.clone());
            last.gate = Some(abandoned.on_final_line());
            last
        });
        Self { audit: std::sync::Arc::clone(&session.audit), lines: Some((step, last)) }
    }

    fn disarm(&mut self) {
        self.lines = None;
    }
}

impl Drop for DroppedHold {
    fn drop(&mut self) {
        let Some((step, last)) = self.lines.take() else { return };
        if let Err(e) = self.audit.append(&step) {
            tracing::error!("cannot write the abandoned gate line of {}: {e}", step.id);
        }
        if let Some(last) = last
            && let Err(e) = self.audit.journal_close(&last)
        {
            // The journal record stays; a later writer settles it as interrupted.
            tracing::error!("cannot write the final line of {}: {e}", last.id);
        }
    }
}

/// A gated attempt's refusal, naming the gate entry that held it.
fn refusal(gate: &GateMatch, reason: Reason, detail: String) -> Unreachable {
    Unreachable::Gated {
        reason,
        detail,
        rule: gate.rule.clone(),
        layer: gate.layer,
        policy: gate.policy.clone(),
    }
}

enum Outcome {
    Decided(Decided),
    Expired,
    Abandoned(&'static str),
}

/// One step's line: the attempt's attribution and target under its own id
/// (`<attempt id>-gate-<step>`), the gate entry that matched, and the gate record.
fn step_line(attempt: &AuditLine, gate: &GateMatch, record: &GateRecord) -> AuditLine {
    let mut l = AuditLine {
        ts: rfc3339_ms(SystemTime::now()),
        id: format!("{}-gate-{}", attempt.id, record.step.as_str()),
        method: STEP_METHOD.to_owned(),
        allowed: record.step == GateStep::Approved,
        reason: None,
        layer: Some(gate.layer),
        policy: Some(gate.policy.clone()),
        rule: Some(gate.rule.clone()),
        bytes_sent: None,
        bytes_recv: None,
        duration_ms: None,
        addr: None,
        status: None,
        interrupted: None,
        gate: Some(record.clone()),
        ..attempt.clone()
    };
    l.truncated = None;
    l
}

/// Resolves when the agent closed its end (EOF, an error, or a hang-up the kernel reported);
/// pends forever when there is no socket to watch. Early tunnel data stays queued for the
/// tunnel: it is peeked at, never read.
async fn client_gone(client: Option<&TcpStream>) {
    let Some(sock) = client else {
        return std::future::pending().await;
    };
    let mut byte = [0u8; 1];
    loop {
        match sock.ready(tokio::io::Interest::READABLE).await {
            Ok(r) if r.is_read_closed() => return,
            Ok(_) => {}
            Err(_) => return,
        }
        match sock.peek(&mut byte).await {
            Ok(0) | Err(_) => return,
            // Data is queued, so readiness is reported at once from now on: look again now
            // and then for the hang-up flag instead of spinning.
            Ok(_) => tokio::time::sleep(EARLY_DATA_RECHECK).await,
        }
    }
}

/// How often a hold with queued early data looks for the agent's hang-up.
const EARLY_DATA_RECHECK: Duration = Duration::from_millis(500);
