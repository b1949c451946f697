//! The reserved name `gate.airlock` (docs/gates.md, "Gated tool calls"): an agent asks for a
//! person's approval of one of its own actions with a plain-HTTP `POST
//! http://gate.airlock/v1/gates` through the proxy. The name is never resolved or dialed; the
//! proxy answers on the host side, once the gate is decided: `200` approved, `403` denied or
//! expired.
//!
//! Two kinds of body:
//! - `{"action": "...", "tool": "...", "context": {...}}`: an explicit request; always gated.
//! - `{"context": <a Claude Code PreToolUse hook payload>}` (what `airlock-gate-hook` sends):
//!   a `Bash` call is gated when its command matches `[gate] commands`; anything else is
//!   answered `200` `not_gated` at once, with no gate and no audit line.
//!
//! Such gates are advisory: the agent may reach the same effect another way. Only gates the
//! proxy holds on egress are enforced.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde::Deserialize;

use crate::audit::GateStep;
use crate::gate::ToolAction;
use crate::policy::{GateMatch, Host, LayerKind, Reason};

use super::SessionProxy;
use super::connect::ms_since;
use super::gatehold::{gate_info, wait_for_decision};
use super::guard::Unreachable;
use super::http::ProxyBody;
use super::respond;

/// The reserved name.
pub const NAME: &str = crate::policy::eval::RESERVED_GATE_NAME;
/// Largest request body accepted (a hook payload carries the whole tool input).
pub const MAX_BODY: usize = 256 * 1024;
/// Longest action text kept (bytes); a longer one is refused, never cut: what is approved must
/// be exactly what was asked.
pub const MAX_ACTION: usize = 16 * 1024;

/// Whether `host` is the reserved name.
pub fn is_reserved(host: &Host) -> bool {
    matches!(host, Host::Name(n) if n == NAME)
}

/// A tool name the decider's terminal and desktop can show as it is.
fn is_tool_name(t: &str) -> bool {
    (1..=64).contains(&t.len())
        && t.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'))
}

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    context: Option<serde_json::Value>,
}

/// What a request asks to have approved, or why nothing needs to be.
enum Asked {
    Gate { tool: String, action: String, gate: GateMatch },
    NotGated,
}

fn asked(session: &SessionProxy, body: &Body) -> Result<Asked, String> {
    let ctx = body.context.as_ref();
    let ctx_str = |k: &str| ctx.and_then(|c| c.get(k)).and_then(|v| v.as_str());
    if let Some(action) = &body.action {
        let tool = body.tool.clone().or_else(|| ctx_str("tool_name").map(str::to_owned));
        let gate = GateMatch {
            rule: "explicit request".into(),
            layer: LayerKind::None,
            policy: format!("POST http://{NAME}/v1/gates"),
            severity: crate::gate::Severity::Medium,
        };
        return Ok(Asked::Gate {
            tool: tool.unwrap_or_else(|| "agent".into()),
            action: action.clone(),
            gate,
        });
    }
    let Some(ctx) = ctx else {
        return Err("the body needs `action` (the exact action to approve) or `context` (a \
                    Claude Code PreToolUse hook payload)"
            .into());
    };
    if ctx_str("hook_event_name") != Some("PreToolUse") {
        return Err("`context` without `action` must be a Claude Code PreToolUse hook payload \
                    (hook_event_name \"PreToolUse\")"
            .into());
    }
    if ctx_str("tool_name") != Some("Bash") {
        return Ok(Asked::NotGated);
    }
    let Some(command) = ctx.pointer("/tool_input/command").and_then(|v| v.as_str()) else {
        return Err("a Bash PreToolUse payload without tool_input.command".into());
    };
    Ok(match session.policy().gated_command(command) {
        Some(gate) => Asked::Gate { tool: "Bash".into(), action: command.to_owned(), gate },
        None => Asked::NotGated,
    })
}

/// Answers one request to the reserved name.
pub async fn serve(
    s: &Arc<SessionProxy>,
    req: Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    let method = req.method().as_str().to_owned();
    let url = req.uri().to_string();
    // The line (and its `seq`) only for requests that get one: a `not_gated` answer writes
    // nothing, and a stamped but unwritten `seq` would read as a lost line.
    let new_line = || {
        let mut line = respond::new_line(s, NAME, Some(80), &method);
        line.url = Some(url.clone());
        line
    };
    if req.method() != http::Method::POST || req.uri().path() != "/v1/gates" {
        return bad(
            s,
            &mut new_line(),
            started,
            StatusCode::NOT_FOUND,
            "only POST /v1/gates is answered here",
        );
    }
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let msg = format!("cannot read the body (at most {MAX_BODY} bytes): {e}");
            return bad(s, &mut new_line(), started, StatusCode::BAD_REQUEST, &msg);
        }
    };
    let body: Body = match serde_json::from_slice(&bytes) {
        Ok(b) => b,
        Err(e) => {
            let msg = format!("the body is not a JSON object of the gate request: {e}");
            return bad(s, &mut new_line(), started, StatusCode::BAD_REQUEST, &msg);
        }
    };
    let (tool, action, gate) = match asked(s, &body) {
        Ok(Asked::Gate { tool, action, gate }) => (tool, action, gate),
        Ok(Asked::NotGated) => {
            return json(StatusCode::OK, None, &serde_json::json!({"state": "not_gated"}));
        }
        Err(msg) => return bad(s, &mut new_line(), started, StatusCode::BAD_REQUEST, &msg),
    };
    if action.len() > MAX_ACTION {
        let msg = format!("the action is longer than {MAX_ACTION} bytes; it is never cut");
        return bad(s, &mut new_line(), started, StatusCode::PAYLOAD_TOO_LARGE, &msg);
    }
    if !is_tool_name(&tool) {
        let msg = "`tool` must be 1 to 64 of A-Z a-z 0-9 _ . : - (it is shown on terminals and \
                   desktop notifications)";
        return bad(s, &mut new_line(), started, StatusCode::BAD_REQUEST, msg);
    }
    let mut line = new_line();
    let Some(book) = s.gates.as_ref() else {
        line.reason = Some(Reason::GateUnavailable);
        return finish(
            s,
            &mut line,
            started,
            &gate,
            "this proxy keeps no gates: no one can decide here",
            None,
        );
    };
    let canonical =
        ToolAction { session: &line.session, attempt: &line.id, tool: &tool, action: &action }
            .canonical();
    let info = gate_info(&line, &gate, "tool", &tool, Some(&action), canonical, s);
    // In a task of its own: hyper drops this request's future when the agent hangs up, and
    // the gate's lines must still be written to the end (the decision then reaches no one).
    let (session, book) = (Arc::clone(s), Arc::clone(book));
    let decided = tokio::spawn(async move {
        let mut step = None;
        let outcome =
            wait_for_decision(&session, &book, &mut line, &gate, info, None, false, &mut step)
                .await;
        let (reason, detail) = match outcome {
            Ok(()) => {
                line.allowed = true;
                (Reason::Allowed, String::new())
            }
            Err(Unreachable::Gated { reason, detail, .. }) => (reason, detail),
            Err(other) => (other.reason(), String::new()),
        };
        line.reason = Some(reason);
        finish(&session, &mut line, started, &gate, &detail, step.as_ref())
    });
    match decided.await {
        Ok(resp) => resp,
        Err(e) => {
            tracing::error!("gate request task failed: {e}");
            let body = serde_json::json!({"state": "error", "reason": "gate_unavailable"});
            json(StatusCode::SERVICE_UNAVAILABLE, Some(Reason::GateUnavailable), &body)
        }
    }
}

/// Writes the request's line and answers with the gate's outcome (`step`: the gate's last step
/// line's record, which names who decided and why).
fn finish(
    s: &SessionProxy,
    line: &mut crate::audit::AuditLine,
    started: Instant,
    gate: &GateMatch,
    detail: &str,
    step: Option<&crate::audit::GateRecord>,
) -> Response<ProxyBody> {
    line.duration_ms = Some(ms_since(started));
    line.layer = Some(gate.layer);
    line.policy = Some(gate.policy.clone());
    line.rule = Some(gate.rule.clone());
    let reason = line.reason.unwrap_or(Reason::GateUnavailable);
    if let Err(e) = s.audit.append(line) {
        tracing::error!("cannot write the audit line of gate request {}: {e}", line.id);
        let body = serde_json::json!({"state": "error", "reason": "audit_unavailable", "detail": e.to_string()});
        return json(StatusCode::SERVICE_UNAVAILABLE, Some(Reason::AuditUnavailable), &body);
    }
    let g = step.or(line.gate.as_ref());
    let state = match g.map(|g| g.step) {
        Some(GateStep::Approved) => "approved",
        Some(GateStep::Denied) => "denied",
        Some(GateStep::Expired) => "expired",
        Some(GateStep::Abandoned) => "abandoned",
        _ => "refused",
    };
    let body = serde_json::json!({
        "state": state,
        "id": g.map(|g| g.id.clone()),
        "digest": g.map(|g| g.digest.clone()),
        "by": g.and_then(|g| g.by.clone()),
        "note": g.and_then(|g| g.note.clone()),
        "self": g.and_then(|g| g.self_decided),
        "server": g.and_then(|g| g.server.clone()),
        "reason": reason.as_str(),
        "detail": (!detail.is_empty()).then_some(detail),
    });
    let status = match reason {
        Reason::Allowed => StatusCode::OK,
        r => StatusCode::from_u16(respond::status_for(r).code()).unwrap_or(StatusCode::FORBIDDEN),
    };
    json(status, (reason != Reason::Allowed).then_some(reason), &body)
}

/// A request that asks nothing a gate can decide: its line (`malformed`), then the answer.
fn bad(
    s: &SessionProxy,
    line: &mut crate::audit::AuditLine,
    started: Instant,
    status: StatusCode,
    msg: &str,
) -> Response<ProxyBody> {
    line.reason = Some(Reason::Malformed);
    line.layer = Some(LayerKind::None);
    line.duration_ms = Some(ms_since(started));
    if let Err(e) = s.audit.append(line) {
        tracing::error!("cannot write the audit line of gate request {}: {e}", line.id);
    }
    let body = serde_json::json!({"state": "error", "reason": "malformed", "detail": msg});
    json(status, Some(Reason::Malformed), &body)
}

fn json(
    status: StatusCode,
    reason: Option<Reason>,
    body: &serde_json::Value,
) -> Response<ProxyBody> {
    let mut text = body.to_string();
    text.push('\n');
    let mut resp = Response::new(Full::new(Bytes::from(text)).map_err(|n| match n {}).boxed());
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(r) = reason {
        h.insert("x-airlock-reason", HeaderValue::from_static(r.as_str()));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_are_plain() {
        for ok in ["Bash", "mcp__github__create_pr", "deploy-bot:prod", "a.b"] {
            assert!(is_tool_name(ok), "{ok}");
        }
        for bad in ["", "x y", "<b>", "a\u{1b}[2J", &"x".repeat(65)] {
            assert!(!is_tool_name(bad), "{bad:?}");
        }
    }
}
