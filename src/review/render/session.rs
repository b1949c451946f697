//! `/sessions/{session}`: one Airlock session drilled down. Its records (who, command, agent
//! and version, policy digest and layers, sandbox layers, exit and quarantine report), each
//! published transcript file marked against the end record's hashes, and the transcript as a
//! conversation ([`super::conversation`]) with subagent transcripts nested, beside a rail of
//! the session's egress attempts placed by time (one grid: every entry is a row in `ts`
//! order, conversation on the left, egress on the right).

use super::conversation::{self, FileContext};
use super::layout::{Section, Viewer, page};
use super::timeline::{TimelineFilter, command_line};
use super::{Micros, one_line, person_href, when};
use crate::review::Source;
use crate::review::transcript_files::State;
use maud::{Markup, html};
use serde_json::Value;
use std::collections::BTreeMap;

/// One stored transcript line of the session (`claude` or `codex`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranscriptLine {
    pub pk: i64,
    pub source: Source,
    pub ts: Micros,
    /// The file relative to the agent home (subagent files are told apart by it).
    pub file: Option<String>,
    pub offset: Option<i64>,
    /// The stored payload's JSON text.
    pub payload: String,
}

/// One egress line of the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressLine {
    pub pk: i64,
    pub ts: Micros,
    pub payload: String,
}

/// One published transcript file against the session record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMark {
    pub file: String,
    pub state: State,
    /// Transcript lines stored for it.
    pub lines: i64,
}

/// The page's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPage {
    pub viewer: Viewer,
    pub session: String,
    /// Whose session it is.
    pub user_id: String,
    pub email: String,
    /// The start and end records' payload JSON texts, when stored.
    pub start: Option<String>,
    pub end: Option<String>,
    pub transcript: Vec<TranscriptLine>,
    pub egress: Vec<EgressLine>,
    pub files: Vec<FileMark>,
    /// The pks of the session's records and `transcript.file` items shown on the page: the
    /// records section carries their anchors (`#e<pk>`, a correlate flag's "record" side).
    pub record_pks: Vec<i64>,
    /// The session has more events than were read for this page: how many were (the first
    /// ones by `ts`). The page says so and points to the timeline, which pages through all.
    pub cut_at: Option<usize>,
}

/// What a file mark says.
pub fn state_label(s: State) -> &'static str {
    match s {
        State::Matches => "matches the session record",
        State::Differs => "changed since the session",
        State::NoRecord => "not in the session record",
        State::NotPublished => "recorded, not published",
    }
}

/// Whether a transcript line belongs to a subagent: `isSidechain`, or a subagent file
/// (`…/subagents/agent-*.jsonl`, or the older `agent-*.jsonl` beside the session file).
fn subagent_key(l: &TranscriptLine, v: &Value) -> Option<String> {
    let base = l.file.as_deref().and_then(|f| f.rsplit('/').next()).unwrap_or("");
    let by_file =
        l.file.as_deref().is_some_and(|f| f.contains("/subagents/")) || base.starts_with("agent-");
    if by_file || conversation::is_sidechain(v) {
        let agent = v.get("agentId").and_then(Value::as_str).unwrap_or("");
        Some(l.file.clone().unwrap_or_else(|| format!("agent {agent}")))
    } else {
        None
    }
}

enum Entry<'a> {
    Line(&'a TranscriptLine, &'a Value, FileContext),
    Sub(String, Vec<(&'a TranscriptLine, &'a Value)>),
    Egress(&'a EgressLine, Value),
}

pub fn render(p: &SessionPage) -> Markup {
    let parsed: Vec<(&TranscriptLine, Value)> = p
        .transcript
        .iter()
        .map(|l| (l, serde_json::from_str(&l.payload).unwrap_or(Value::Null)))
        .collect();
    // Per-file context (Codex duplicates) over each file's lines.
    let mut by_file: BTreeMap<(Source, &str), Vec<&Value>> = BTreeMap::new();
    for (l, v) in &parsed {
        by_file.entry((l.source, l.file.as_deref().unwrap_or(""))).or_default().push(v);
    }
    let ctx: BTreeMap<(Source, &str), FileContext> =
        by_file.iter().map(|(k, vs)| (*k, FileContext::of(k.0, vs))).collect();
    let ctx_of = |l: &TranscriptLine| {
        ctx.get(&(l.source, l.file.as_deref().unwrap_or(""))).copied().unwrap_or_default()
    };

    let mut subs: BTreeMap<String, Vec<(&TranscriptLine, &Value)>> = BTreeMap::new();
    let mut entries: Vec<(Micros, u8, i64, Entry)> = Vec::new();
    for (l, v) in &parsed {
        match subagent_key(l, v) {
            Some(k) => subs.entry(k).or_default().push((l, v)),
            None => entries.push((l.ts, 0, l.pk, Entry::Line(l, v, ctx_of(l)))),
        }
    }
    for (k, mut lines) in std::mem::take(&mut subs) {
        lines.sort_by_key(|(l, _)| (l.ts, l.offset, l.pk));
        let first = lines.first().map_or(0, |(l, _)| l.ts);
        let pk = lines.first().map_or(0, |(l, _)| l.pk);
        entries.push((first, 1, pk, Entry::Sub(k, lines)));
    }
    for e in &p.egress {
        entries.push((
            e.ts,
            2,
            e.pk,
            Entry::Egress(e, serde_json::from_str(&e.payload).unwrap_or(Value::Null)),
        ));
    }
    entries.sort_by_key(|(ts, rank, pk, _)| (*ts, *rank, *pk));

    let timeline =
        TimelineFilter { session: p.session.clone(), ..Default::default() }.href(&p.user_id, None);
    let body = html! {
        p {
            "Session of " a href=(person_href(&p.user_id)) { (p.email) }
            " · " a href=(timeline) { "this session in the timeline" }
        }
        @if let Some(n) = p.cut_at {
            p.b role="status" {
                "This session has more events than one page shows: the first " (n)
                " by time are below. " a href=(timeline) { "The timeline filtered to this session" }
                " pages through all of them."
            }
        }
        @for pk in &p.record_pks { span id=(format!("e{pk}")) {} }
        h2 { "Session records" }
        (records(p))
        h2 { "Published transcripts" }
        @if p.files.is_empty() {
            p.mut { "No transcript file of this session was published or recorded." }
        } @else {
            table {
                thead { tr { th scope="col" { "File" } th scope="col" { "Against the session record" } th.n scope="col" { "Lines" } } }
                tbody { @for f in &p.files {
                    tr {
                        td { code { (f.file) } }
                        td class=[match f.state { State::Matches => Some("ok"), State::Differs => Some("no"), _ => None }] { (state_label(f.state)) }
                        td.n { (f.lines) }
                    }
                } }
            }
        }
        h2 { "Conversation and egress" }
        @if entries.is_empty() {
            p.mut { "Nothing stored for this session yet." }
        } @else {
            div.dd {
                div.c { strong { "Transcript" } }
                div.e { strong { "Egress attempts" } }
                @for (_, _, _, e) in &entries { (entry(e)) }
            }
        }
    };
    page(&format!("Session {}", one_line(&p.session, 80)), &p.viewer, Section::People, body)
}

fn line_blocks(l: &TranscriptLine, v: &Value, ctx: FileContext) -> Markup {
    html! {
        div.c {
            // The anchor a flag's linked event points at (`#e<pk>`).
            span id=(format!("e{}", l.pk)) {}
            small.mut { time { (when(l.ts)) } " · " (l.source.as_str()) }
            @for b in conversation::blocks(l.source, v, ctx) { (conversation::render(&b)) }
        }
    }
}

fn entry(e: &Entry) -> Markup {
    match e {
        Entry::Line(l, v, ctx) => line_blocks(l, v, *ctx),
        Entry::Sub(key, lines) => {
            let agent = lines
                .iter()
                .find_map(|(_, v)| v.get("agentId").and_then(Value::as_str))
                .unwrap_or("");
            let refs: Vec<&Value> = lines.iter().map(|(_, v)| *v).collect();
            let src = lines.first().map_or(Source::Claude, |(l, _)| l.source);
            let ctx = FileContext::of(src, &refs);
            html! {
                div.c { details.sub open {
                    summary { "Subagent " @if !agent.is_empty() { code { (agent) } " " } "· " (lines.len()) " lines · " code { (key) } }
                    @for (l, v) in lines {
                        span id=(format!("e{}", l.pk)) {}
                        small.mut { time { (when(l.ts)) } }
                        @for b in conversation::blocks(l.source, v, ctx) { (conversation::render(&b)) }
                    }
                } }
            }
        }
        Entry::Egress(l, v) if v.get("method").and_then(Value::as_str) == Some("GATE") => {
            let g = |k: &str| {
                v.pointer(&format!("/gate/{k}")).and_then(Value::as_str).unwrap_or("").to_string()
            };
            let host = v.get("host").and_then(Value::as_str).unwrap_or("");
            html! {
                div.e {
                    span id=(format!("e{}", l.pk)) {}
                    time { (when(l.ts)) } " "
                    span.mut { "gate " (one_line(&g("step"), 20)) }
                    br;
                    code { (one_line(&format!("{} {host}", g("method")), 200)) }
                    @if !g("by").is_empty() { " " span.mut { "by " (one_line(&g("by"), 120)) } }
                }
            }
        }
        Entry::Egress(l, v) => {
            let allowed = v.get("allowed").and_then(Value::as_bool) == Some(true);
            let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            html! {
                div.e.no[!allowed] {
                    span id=(format!("e{}", l.pk)) {}
                    time { (when(l.ts)) } " "
                    @if allowed { span.ok { "allowed" } } @else { span.no { "denied" } }
                    br;
                    code { (one_line(&format!("{} {}", s("method"), s("host")), 200)) }
                    @if !allowed && !s("reason").is_empty() { " " span.mut { "(" (one_line(&s("reason"), 80)) ")" } }
                }
            }
        }
    }
}

fn records(p: &SessionPage) -> Markup {
    let start: Option<Value> = p.start.as_deref().and_then(|s| serde_json::from_str(s).ok());
    let end: Option<Value> = p.end.as_deref().and_then(|s| serde_json::from_str(s).ok());
    let field = |v: &Option<Value>, k: &str| -> String {
        match v.as_ref().and_then(|v| v.get(k)) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join(", "),
            Some(other) => other.to_string(),
        }
    };
    let quarantined: Vec<(String, String)> = end
        .as_ref()
        .and_then(|e| e.get("quarantined"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|q| {
            let g = |k: &str| q.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            (g("path"), g("moved_to"))
        })
        .collect();
    let row = |label: &str, value: String| html! { @if !value.is_empty() { dt { (label) } dd { (value) } } };
    html! {
        @if start.is_none() { p.mut { "No start record is stored for this session." } }
        @if end.is_none() { p.mut { "No end record is stored: the session is running, or its record was not published yet." } }
        dl.rec {
            (row("Who", format!("{} {}", field(&start, "email"), field(&start, "user_id")).trim().to_string()))
            (row("Command", start.as_ref().and_then(|s| s.get("command")).map(command_line).unwrap_or_default()))
            (row("Agent", format!("{} {}", field(&start, "agent"), field(&start, "agent_version")).trim().to_string()))
            (row("Repo", format!("{} {}", field(&start, "repo"), field(&start, "repo_path")).trim().to_string()))
            (row("Airlock", field(&start, "airlock_version")))
            (row("Policy digest", field(&start, "policy_digest")))
            (row("Policy layers", field(&start, "policy_layers")))
            (row("Sandbox layers", field(&start, "layers")))
            (row("Started", start.as_ref().map(|_| field(&start, "ts")).unwrap_or_default()))
            (row("Ended", end.as_ref().map(|_| field(&end, "ts")).unwrap_or_default()))
            (row("Exit status", field(&end, "exit_status")))
            (row("End reason", field(&end, "end_reason")))
            (row("Tunnels", field(&end, "tunnels")))
            (row("Bytes sent", field(&end, "bytes_sent")))
            (row("Bytes received", field(&end, "bytes_recv")))
            @if end.as_ref().and_then(|e| e.get("transcripts_truncated")).and_then(Value::as_bool) == Some(true) {
                dt { "Transcripts" } dd.no { "the record's transcript list is incomplete (the walk was cut short)" }
            }
            @if end.is_some() {
                dt { "Quarantine" }
                dd {
                    @if quarantined.is_empty() { "nothing quarantined" } @else {
                        ul { @for (path, to) in &quarantined { li { code { (path) } " → " code { (to) } } } }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::review::Role;
    use crate::review::render::testutil::{XSS, assert_inert, assert_no_urls, viewer};

    fn lines_of(name: &str, source: Source, file: &str, pk0: i64) -> Vec<TranscriptLine> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/transcripts")
            .join(name);
        let raw = std::fs::read_to_string(p).unwrap();
        let mut off = 0;
        let mut out = Vec::new();
        for (i, l) in raw.lines().enumerate() {
            let v: Value = serde_json::from_str(l).unwrap();
            let ts = v
                .get("timestamp")
                .and_then(Value::as_str)
                .and_then(crate::review::parse_rfc3339)
                .unwrap_or(0);
            out.push(TranscriptLine {
                pk: pk0 + i as i64,
                source,
                ts,
                file: Some(file.into()),
                offset: Some(off),
                payload: l.to_string(),
            });
            off += l.len() as i64 + 1;
        }
        out
    }

    fn sample() -> SessionPage {
        let mut transcript = lines_of(
            "claude-happy-path.jsonl",
            Source::Claude,
            ".claude/projects/-work-repo/b7d2.jsonl",
            100,
        );
        // The subagent ran between the prompt and the answer.
        let mut sub = lines_of(
            "claude-subagent.jsonl",
            Source::Claude,
            ".claude/projects/-work-repo/b7d2/subagents/agent-a1b2c3.jsonl",
            200,
        );
        let t = crate::review::parse_rfc3339("2026-03-04T09:12:06.000Z").unwrap();
        for (i, l) in sub.iter_mut().enumerate() {
            l.ts = t + i as i64;
        }
        transcript.extend(sub);
        let t_egress = crate::review::parse_rfc3339("2026-03-04T09:12:08.500Z").unwrap();
        SessionPage {
            viewer: viewer(Role::Reviewer),
            session: "s-7f3a".into(),
            user_id: "u-ana".into(),
            email: "ana@example.test".into(),
            start: Some(serde_json::json!({"id": "s-7f3a:start", "kind": "start", "ts": "2026-03-04T09:12:00.000Z", "email": "ana@example.test", "user_id": "u-ana", "command": ["/usr/bin/claude", "--resume"], "agent": "claude", "agent_version": "2.1.40", "policy_digest": "sha256:abc", "policy_layers": ["managed@sha256:1", "repo@sha256:2"], "layers": ["userns", "seccomp", "landlock-fs(abi 6)"]}).to_string()),
            end: Some(serde_json::json!({"id": "s-7f3a:end", "kind": "end", "ts": "2026-03-04T10:41:00.000Z", "exit_status": 0, "quarantined": [{"path": ".git/hooks/pre-commit", "moved_to": "~/.airlock/quarantine/s-7f3a/items/1"}]}).to_string()),
            transcript,
            egress: vec![
                EgressLine { pk: 300, ts: t_egress, payload: serde_json::json!({"method": "CONNECT", "host": "pastebin.com", "allowed": false, "reason": "not_allowed"}).to_string() },
                EgressLine { pk: 301, ts: t_egress + 1, payload: serde_json::json!({"method": "CONNECT", "host": "api.anthropic.com", "allowed": true}).to_string() },
            ],
            files: vec![
                FileMark { file: ".claude/projects/-work-repo/b7d2.jsonl".into(), state: State::Matches, lines: 6 },
                FileMark { file: ".claude/projects/-work-repo/b7d2/subagents/agent-a1b2c3.jsonl".into(), state: State::Differs, lines: 2 },
            ],
            record_pks: vec![400, 401],
            cut_at: None,
        }
    }

    #[test]
    fn drill_down_shows_records_files_conversation_and_rail() {
        let html = render(&sample()).into_string();
        for s in [
            "/usr/bin/claude --resume",
            "claude 2.1.40",
            "sha256:abc",
            "managed@sha256:1, repo@sha256:2",
            "userns, seccomp, landlock-fs(abi 6)",
            ".git/hooks/pre-commit",
            "matches the session record",
            "changed since the session",
            "Why does the retry test flake?",
            "Reading the test first.",
            "Tool call: <code>Read</code>",
            "<details class=\"msg tool\"><summary>Tool result</summary>",
            "Subagent <code>a1b2c3</code> · 2 lines",
            "sub task",
        ] {
            assert!(html.contains(s), "{s} missing");
        }
        // Aligned by time: the subagent (09:12:06) before the answer (09:12:08.402), the denied
        // attempt (09:12:08.500) after it and before the Read call (09:12:08.655).
        let pos = |s: &str| html.find(s).unwrap();
        assert!(pos("Subagent") < pos("Reading the test first."));
        assert!(pos("Reading the test first.") < pos("pastebin.com"));
        assert!(pos("pastebin.com") < pos("retry_test.rs&quot;"));
        assert!(html.contains(r#"<div class="e no">"#));
        assert!(html.contains("/people/u-ana?session=s-7f3a"));
        assert!(!html.contains("more events than one page shows"));
        assert_no_urls(&html);
    }

    /// A correlate flag's links (`#e<pk>`, render/flags.rs) land on the event: every egress
    /// line, transcript line (subagents' too) and record of the page has its anchor, once.
    #[test]
    fn every_event_has_the_anchor_a_flag_links_to() {
        let p = sample();
        let html = render(&p).into_string();
        let pks = p
            .egress
            .iter()
            .map(|e| e.pk)
            .chain(p.transcript.iter().map(|l| l.pk))
            .chain(p.record_pks.iter().copied());
        for pk in pks {
            assert_eq!(html.matches(&format!(r#"<span id="e{pk}"></span>"#)).count(), 1, "{pk}");
        }
    }

    #[test]
    fn a_gate_step_shows_its_step_and_decider_never_as_a_denial() {
        let mut p = sample();
        p.egress = vec![EgressLine {
            pk: 302,
            ts: crate::review::parse_rfc3339("2026-03-04T09:12:08.500Z").unwrap(),
            payload: serde_json::json!({"method": "GATE", "host": "pay.test", "allowed": false,
                "gate": {"id": "g000001-aa", "step": "denied", "by": "rev<i>@example.test",
                         "digest": "sha256:00", "severity": "high"}})
            .to_string(),
        }];
        let html = render(&p).into_string();
        assert!(html.contains("gate denied"), "{html}");
        assert!(html.contains("by rev&lt;i&gt;@example.test"), "{html}");
        assert!(!html.contains(r#"<div class="e no">"#), "a step is not a refused attempt");
        assert_no_urls(&html);
    }

    #[test]
    fn a_cut_session_says_so_and_links_the_timeline() {
        let mut p = sample();
        p.cut_at = Some(5_000);
        let html = render(&p).into_string();
        assert!(html.contains("more events than one page shows: the first 5000 by time"), "{html}");
        assert!(html.contains(r#"<a href="/people/u-ana?session=s-7f3a">The timeline filtered"#));
    }

    #[test]
    fn codex_session_and_missing_records() {
        let mut p = sample();
        p.transcript = lines_of(
            "codex-happy-path.jsonl",
            Source::Codex,
            ".codex/sessions/2026/03/04/rollout-x.jsonl",
            1,
        );
        p.start = None;
        p.end = None;
        p.files.clear();
        let html = render(&p).into_string();
        assert!(html.contains("No start record is stored"));
        assert!(html.contains("No end record is stored"));
        assert!(html.contains("All 3 retry tests pass."));
        assert!(html.contains("bash -lc cargo test retry"));
        assert!(html.contains("Tool result (exit 0)"));
        assert!(!html.contains("Subagent"));
        assert_no_urls(&html);
    }

    #[test]
    fn hostile_transcripts_tool_inputs_records_and_hosts_render_inert() {
        let mut p = sample();
        p.transcript.clear();
        for (i, x) in XSS.iter().enumerate() {
            let i = i as i64;
            let lines = [
                serde_json::json!({"type": "user", "message": {"content": x}}),
                serde_json::json!({"type": "assistant", "message": {"content": [{"type": "text", "text": x}, {"type": "thinking", "thinking": x}, {"type": "tool_use", "name": x, "input": {"command": x, "file_path": x}}, {"type": x, "x": x}]}}),
                serde_json::json!({"type": "user", "message": {"content": [{"type": "tool_result", "content": [{"type": "text", "text": x}, {"type": x}]}]}}),
                serde_json::json!({"type": x, "isSidechain": true, "agentId": x}),
            ];
            for (j, l) in lines.iter().enumerate() {
                p.transcript.push(TranscriptLine {
                    pk: i * 10 + j as i64,
                    source: Source::Claude,
                    ts: i,
                    file: Some((*x).into()),
                    offset: None,
                    payload: l.to_string(),
                });
            }
            p.transcript.push(TranscriptLine { pk: i * 10 + 8, source: Source::Codex, ts: i, file: None, offset: None, payload: serde_json::json!({"type": "response_item", "payload": {"type": "function_call", "name": x, "arguments": serde_json::json!({"command": [x]}).to_string()}}).to_string() });
            p.egress.push(EgressLine {
                pk: 900 + i,
                ts: i,
                payload: serde_json::json!({"method": x, "host": x, "reason": x}).to_string(),
            });
            p.files.push(FileMark { file: (*x).into(), state: State::NoRecord, lines: 0 });
        }
        p.session = XSS[0].into();
        p.user_id = XSS[2].into();
        p.email = XSS[1].into();
        p.start = Some(serde_json::json!({"command": XSS, "agent": XSS[3], "policy_digest": XSS[4], "layers": XSS, "email": XSS[5]}).to_string());
        p.end = Some(serde_json::json!({"quarantined": [{"path": XSS[0], "moved_to": XSS[1]}], "end_reason": XSS[6]}).to_string());
        let html = render(&p).into_string();
        assert_inert(&html);
        assert!(html.contains("/people/javascript%3Aalert%281%29"));
        assert!(html.contains("&lt;/textarea&gt;&lt;script&gt;alert(2)&lt;/script&gt;"));
    }
}
