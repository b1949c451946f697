//! The review plane's envelopes for each line (docs/api.md "`id` per source"): egress (audit
//! lines, `type` = the line kind of docs/audit-format.md), session records, Claude Code and
//! Codex transcript lines. Payloads go verbatim (the line's own bytes) unless the envelope would
//! pass the item cap; then [`super::elide`] replaces the largest fields. The envelope `user_id`
//! is never set: the server attributes by token.

use std::fmt::Write as _;

use serde::Deserialize;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::elide::{Elided, elide};
use super::sources::Kind;

/// Largest envelope (bytes of its NDJSON line, without the newline).
pub const ITEM_MAX: usize = 1_000_000;

/// What is known about the line's place in its file.
#[derive(Debug, Clone)]
pub struct LineCtx<'a> {
    pub kind: Kind,
    /// Offset-id prefix (Claude: relative to the projects directory; Codex fallback session).
    pub id_rel: &'a str,
    /// Transcripts: the path relative to the agent home (envelope `file`).
    pub file: &'a str,
    pub offset: u64,
    /// The previous line's ts (Claude inference), else the file's mtime.
    pub prev_ts: &'a str,
    /// Codex: the file's session id once known.
    pub codex_session: Option<&'a str>,
    /// Transcripts: the Airlock session whose end record covered this line.
    pub airlock_session: Option<&'a str>,
}

/// One envelope, ready to frame.
#[derive(Debug, Clone)]
pub struct Built {
    pub id: String,
    /// The NDJSON line (no newline).
    pub text: String,
    /// The ts it carries (for `--since` and the next line's inference).
    pub ts: String,
    /// Codex: the session id this line declares (its `session_meta`).
    pub codex_session: Option<String>,
}

/// Why a line cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("not a JSON object: {0}")]
    NotJson(String),
    #[error("the line has no string `{0}`, which its id is made of")]
    NoId(&'static str),
    #[error("larger than {ITEM_MAX} bytes even with its largest fields elided")]
    TooLarge,
}

#[derive(Deserialize)]
struct Fields {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    uuid: Option<Value>,
    #[serde(default, rename = "type")]
    ty: Option<Value>,
    #[serde(default)]
    kind: Option<Value>,
    #[serde(default)]
    ts: Option<Value>,
    #[serde(default)]
    timestamp: Option<Value>,
    #[serde(default)]
    session: Option<Value>,
    #[serde(default, rename = "sessionId")]
    session_id: Option<Value>,
    #[serde(default)]
    seq: Option<Value>,
    #[serde(default)]
    payload: Option<Value>,
    // Egress kind.
    #[serde(default)]
    method: Option<Value>,
    #[serde(default)]
    allowed: Option<Value>,
    #[serde(default)]
    reason: Option<Value>,
    #[serde(default)]
    interrupted: Option<Value>,
    #[serde(default)]
    seqs: Option<Value>,
}

fn s(v: &Option<Value>) -> Option<&str> {
    v.as_ref().and_then(Value::as_str)
}

/// Whether `ts` is an RFC 3339 time (what the server accepts as `ts`).
pub fn parse_ts(ts: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(ts, &Rfc3339).ok()
}

/// The line kind of an audit line (docs/audit-format.md "Line kinds"), the egress `type`.
pub fn egress_kind(
    method: Option<&str>,
    allowed: bool,
    reason: Option<&str>,
    interrupted: bool,
    summary: bool,
) -> &'static str {
    let method = method.unwrap_or("");
    if method == "STOP" {
        return "stop";
    }
    if summary {
        return "suppressed";
    }
    if interrupted || reason == Some("interrupted") {
        return "interrupted";
    }
    match method {
        "DNS" => return "dns",
        "INBOUND" => return "inbound",
        "GATE" => return "gate",
        "PHASE" => return "phase",
        _ => {}
    }
    match reason {
        Some("malformed" | "incomplete_head") => return "malformed",
        Some("tunnel_limit" | "connection_limit" | "dns_limit") => return "capped",
        _ => {}
    }
    let plain_http = !method.is_empty() && method != "CONNECT" && method != "UDP";
    // A plain-HTTP request allowed by policy is an `http` line even when it was never
    // forwarded (resolve/connect failures, audit unavailable).
    let never_forwarded =
        matches!(reason, Some("resolve_failed" | "connect_failed" | "audit_unavailable"));
    if plain_http && (allowed || reason == Some("allowed") || never_forwarded) {
        return "http";
    }
    if allowed { "connect" } else { "denied" }
}

fn push_str(out: &mut String, key: &str, val: &str) {
    let _ = write!(out, "\"{key}\":{},", json_str(val));
}

fn json_str(v: &str) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "\"\"".into())
}

/// Builds the envelope of one line (its bytes without the newline).
pub fn build(ctx: &LineCtx<'_>, line: &[u8]) -> Result<Built, LineError> {
    // A struct also deserializes from an array; only an object is a line.
    if line.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(LineError::NotJson("the line is not a JSON object".into()));
    }
    let f: Fields = serde_json::from_slice(line).map_err(|e| LineError::NotJson(e.to_string()))?;
    let mut head = String::with_capacity(256);
    head.push('{');
    let mut codex_session = None;
    let mut inferred = false;
    let (id, ty, ts, session, seq): (String, String, String, Option<String>, Option<&Value>) =
        match ctx.kind {
            Kind::Audit => {
                let id = s(&f.id).ok_or(LineError::NoId("id"))?.to_owned();
                let ty = egress_kind(
                    s(&f.method),
                    f.allowed.as_ref().and_then(Value::as_bool).unwrap_or(false),
                    s(&f.reason),
                    f.interrupted.as_ref().and_then(Value::as_bool).unwrap_or(false),
                    f.seqs.is_some(),
                );
                let ts = s(&f.ts).unwrap_or("").to_owned();
                (id, ty.into(), ts, s(&f.session).map(str::to_owned), f.seq.as_ref())
            }
            Kind::Sessions => {
                let session = s(&f.session).map(str::to_owned);
                let kind = s(&f.kind).unwrap_or("unknown").to_owned();
                let id = match (s(&f.id), &session) {
                    (Some(id), _) => id.to_owned(),
                    (None, Some(sess)) => format!("{sess}:{kind}"),
                    (None, None) => return Err(LineError::NoId("id")),
                };
                (id, kind, s(&f.ts).unwrap_or("").to_owned(), session, None)
            }
            Kind::Claude => {
                let id = match s(&f.uuid) {
                    Some(u) if !u.is_empty() => u.to_owned(),
                    _ => format!("{}:{}", ctx.id_rel, ctx.offset),
                };
                let ty = s(&f.ty).filter(|t| !t.is_empty()).unwrap_or("unknown").to_owned();
                let ts = match s(&f.timestamp).filter(|t| parse_ts(t).is_some()) {
                    Some(t) => t.to_owned(),
                    None => {
                        inferred = true;
                        ctx.prev_ts.to_owned()
                    }
                };
                (id, ty, ts, s(&f.session_id).map(str::to_owned), None)
            }
            Kind::Codex => {
                let ty = s(&f.ty).filter(|t| !t.is_empty()).unwrap_or("unknown").to_owned();
                let mut sess = ctx.codex_session.map(str::to_owned);
                if sess.is_none() && ty == "session_meta" {
                    let meta_id = f
                        .payload
                        .as_ref()
                        .and_then(|p| p.get("id"))
                        .and_then(Value::as_str)
                        .filter(|i| !i.is_empty());
                    if let Some(i) = meta_id {
                        codex_session = Some(i.to_owned());
                        sess = Some(i.to_owned());
                    }
                }
                let prefix = sess.clone().unwrap_or_else(|| ctx.id_rel.to_owned());
                let id = format!("{prefix}:{}", ctx.offset);
                let ts = match s(&f.timestamp).filter(|t| parse_ts(t).is_some()) {
                    Some(t) => t.to_owned(),
                    None => {
                        inferred = true;
                        ctx.prev_ts.to_owned()
                    }
                };
                (id, ty, ts, sess, None)
            }
        };
    push_str(&mut head, "id", &id);
    push_str(&mut head, "source", ctx.kind.source());
    push_str(&mut head, "type", &ty);
    push_str(&mut head, "ts", &ts);
    match &session {
        Some(sess) => push_str(&mut head, "session", sess),
        None => head.push_str("\"session\":null,"),
    }
    if let Some(seq) = seq.filter(|v| v.is_u64()) {
        let _ = write!(head, "\"seq\":{seq},");
    }
    if inferred {
        head.push_str("\"ts_inferred\":true,");
    }
    if ctx.kind.is_transcript() {
        match ctx.airlock_session {
            Some(a) => push_str(&mut head, "airlock_session", a),
            None => head.push_str("\"airlock_session\":null,"),
        }
        push_str(&mut head, "file", ctx.file);
        let _ = write!(head, "\"offset\":{},", ctx.offset);
    }
    const PAYLOAD: &str = "\"payload\":";
    // The payload is the line's own text: it parsed as JSON, so it is valid UTF-8.
    let raw = std::str::from_utf8(line).map_err(|e| LineError::NotJson(e.to_string()))?;
    let raw = raw.trim_end_matches('\r');
    // `+ 1`: the closing brace.
    let text = if head.len() + PAYLOAD.len() + raw.len() < ITEM_MAX {
        format!("{head}{PAYLOAD}{raw}}}")
    } else {
        let value: Value =
            serde_json::from_str(raw).map_err(|e| LineError::NotJson(e.to_string()))?;
        let elided_len = |el: &[Elided]| serde_json::to_string(el).map(|t| t.len()).unwrap_or(0);
        let fits = |p: &str, el: &[Elided]| {
            head.len() + "\"elided\":,".len() + elided_len(el) + PAYLOAD.len() + p.len() < ITEM_MAX
        };
        let (payload, el) = elide(value, &fits).ok_or(LineError::TooLarge)?;
        let el = serde_json::to_string(&el).map_err(|_| LineError::TooLarge)?;
        format!("{head}\"elided\":{el},{PAYLOAD}{payload}}}")
    };
    if text.len() > ITEM_MAX {
        return Err(LineError::TooLarge);
    }
    Ok(Built { id, text, ts, codex_session })
}

/// The `transcript.file` item of one (Airlock session, transcript file) of an end record.
pub fn transcript_file(
    airlock_session: &str,
    file: &str,
    ts: &str,
    bytes: u64,
    sha256: &str,
) -> String {
    let payload = serde_json::json!({
        "airlock_session": airlock_session,
        "file": file,
        "bytes": bytes,
        "sha256": sha256,
    });
    serde_json::json!({
        "id": format!("{airlock_session}:transcript:{file}"),
        "source": "session",
        "type": "transcript.file",
        "ts": ts,
        "session": airlock_session,
        "payload": payload,
    })
    .to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn ctx(kind: Kind) -> LineCtx<'static> {
        LineCtx {
            kind,
            id_rel: "-work-repo/abc.jsonl",
            file: ".claude/projects/-work-repo/abc.jsonl",
            offset: 4096,
            prev_ts: "2026-03-04T09:12:05.118Z",
            codex_session: None,
            airlock_session: Some("s-1"),
        }
    }

    fn v(b: &Built) -> Value {
        serde_json::from_str(&b.text).unwrap()
    }

    #[test]
    fn egress_envelope_carries_kind_seq_and_verbatim_payload() {
        let line = br#"{"ts":"2026-07-24T18:03:12.905Z","repo":"r","host":"h","method":"CONNECT","allowed":false,"id":"e1","session":"s","boot":"b","seq":12,"reason":"not_allowed"}"#;
        let b = build(&ctx(Kind::Audit), line).unwrap();
        let e = v(&b);
        assert_eq!(e["id"], "e1");
        assert_eq!(e["source"], "egress");
        assert_eq!(e["type"], "denied");
        assert_eq!(e["seq"], 12);
        assert_eq!(e["session"], "s");
        assert!(e.get("user_id").is_none());
        assert!(e.get("file").is_none());
        assert!(b.text.ends_with(&format!("\"payload\":{}}}", std::str::from_utf8(line).unwrap())));
    }

    #[test]
    fn egress_kinds() {
        assert_eq!(egress_kind(Some("CONNECT"), true, Some("allowed"), false, false), "connect");
        assert_eq!(egress_kind(Some("GET"), true, Some("allowed"), false, false), "http");
        assert_eq!(egress_kind(Some("GET"), false, Some("connect_failed"), false, false), "http");
        assert_eq!(egress_kind(Some("GET"), false, Some("not_allowed"), false, false), "denied");
        assert_eq!(egress_kind(Some("UDP"), false, Some("udp_refused"), false, false), "denied");
        assert_eq!(egress_kind(Some("x"), false, Some("malformed"), false, false), "malformed");
        assert_eq!(
            egress_kind(Some("CONNECT"), false, Some("tunnel_limit"), false, false),
            "capped"
        );
        assert_eq!(egress_kind(Some("CONNECT"), true, None, true, false), "interrupted");
        assert_eq!(egress_kind(Some("DNS"), true, Some("allowed"), false, false), "dns");
        assert_eq!(
            egress_kind(Some("CONNECT"), false, Some("not_allowed"), false, true),
            "suppressed"
        );
        assert_eq!(egress_kind(Some("STOP"), false, Some("audit_budget"), false, false), "stop");
        assert_eq!(egress_kind(Some("INBOUND"), true, Some("allowed"), false, false), "inbound");
        assert_eq!(egress_kind(Some("GATE"), false, None, false, false), "gate");
        assert_eq!(egress_kind(Some("PHASE"), false, None, false, false), "phase");
        assert_eq!(egress_kind(Some("GET"), false, Some("gate_denied"), false, false), "denied");
    }

    #[test]
    fn claude_uuid_less_lines_get_path_offset_ids_and_inferred_ts() {
        let b = build(&ctx(Kind::Claude), br#"{"type":"summary","summary":"x","leafUuid":"u"}"#)
            .unwrap();
        let e = v(&b);
        assert_eq!(e["id"], "-work-repo/abc.jsonl:4096");
        assert_eq!(e["ts"], "2026-03-04T09:12:05.118Z");
        assert_eq!(e["ts_inferred"], true);
        assert_eq!(e["airlock_session"], "s-1");
        assert_eq!(e["file"], ".claude/projects/-work-repo/abc.jsonl");
        assert_eq!(e["offset"], 4096);
        assert_eq!(e["session"], Value::Null);
        let b = build(
            &ctx(Kind::Claude),
            br#"{"type":"user","uuid":"u1","sessionId":"s9","timestamp":"2026-03-04T10:00:00.000Z"}"#,
        )
        .unwrap();
        let e = v(&b);
        assert_eq!(e["id"], "u1");
        assert_eq!(e["session"], "s9");
        assert!(e.get("ts_inferred").is_none());
    }

    #[test]
    fn codex_ids_use_the_session_meta_id() {
        let mut c = ctx(Kind::Codex);
        c.offset = 0;
        c.id_rel = "sessions/2026/03/04/rollout-a.jsonl";
        let b = build(&c, br#"{"timestamp":"2026-03-04T11:02:00.201Z","type":"session_meta","payload":{"id":"019c"}}"#).unwrap();
        assert_eq!(b.id, "019c:0");
        assert_eq!(b.codex_session.as_deref(), Some("019c"));
        c.offset = 10;
        let b = build(
            &c,
            br#"{"timestamp":"2026-03-04T11:02:00.201Z","type":"event_msg","payload":{}}"#,
        )
        .unwrap();
        assert_eq!(b.id, "sessions/2026/03/04/rollout-a.jsonl:10");
        c.codex_session = Some("019c");
        let b = build(
            &c,
            br#"{"timestamp":"2026-03-04T11:02:00.201Z","type":"event_msg","payload":{}}"#,
        )
        .unwrap();
        assert_eq!(b.id, "019c:10");
    }

    #[test]
    fn oversized_lines_are_elided_not_lost() {
        let big = "x".repeat(ITEM_MAX + 10);
        let line =
            serde_json::json!({"type":"user","uuid":"u","message":{"content":[{"text": big}]}})
                .to_string();
        let b = build(&ctx(Kind::Claude), line.as_bytes()).unwrap();
        assert!(b.text.len() <= ITEM_MAX);
        let e = v(&b);
        assert_eq!(e["elided"][0]["path"], "/message/content/0/text");
        assert_eq!(e["elided"][0]["bytes"], ITEM_MAX + 10);
        assert_eq!(e["payload"]["uuid"], "u");
    }

    #[test]
    fn bad_lines_are_errors() {
        assert!(matches!(build(&ctx(Kind::Audit), b"{\"id\":"), Err(LineError::NotJson(_))));
        assert!(matches!(build(&ctx(Kind::Audit), b"[1]"), Err(LineError::NotJson(_))));
        assert_eq!(build(&ctx(Kind::Audit), b"{}").unwrap_err(), LineError::NoId("id"));
    }

    #[test]
    fn session_records_and_transcript_file_items() {
        let b = build(
            &ctx(Kind::Sessions),
            br#"{"id":"s1:end","kind":"end","ts":"2026-01-01T00:00:00Z","session":"s1"}"#,
        )
        .unwrap();
        let e = v(&b);
        assert_eq!((e["id"].as_str(), e["type"].as_str()), (Some("s1:end"), Some("end")));
        let t: Value = serde_json::from_str(&transcript_file(
            "s1",
            ".claude/projects/a.jsonl",
            "2026-01-01T00:00:00Z",
            10,
            "sha256:ab",
        ))
        .unwrap();
        assert_eq!(t["id"], "s1:transcript:.claude/projects/a.jsonl");
        assert_eq!(t["type"], "transcript.file");
        assert_eq!(t["payload"]["bytes"], 10);
    }
}
