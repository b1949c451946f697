//! A typed view of event payloads for detection and display: Claude Code and Codex
//! transcript lines (JSONL; the format quirks handled are the tests' `quirkN`) become
//! messages, tool calls and results, files read and commands run; egress lines expose their
//! host. Unknown line types are never rejected: their raw JSON is scanned as text (and stored
//! verbatim by the store).

use super::Source;
use serde_json::Value;

/// What one line says, in the terms detection rules use (`fields` in a rule).
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize)]
pub struct View {
    /// Line kind as understood (`user`, `assistant`, `function_call`, …, or `unknown`).
    pub kind: String,
    /// Message text, thinking, tool results and other free text.
    pub text: Vec<String>,
    /// Commands the agent ran (Bash tool, Codex shell calls).
    pub command: Vec<String>,
    /// Files the agent read (Read tool, `toolUseResult.file.filePath`).
    pub file_read: Vec<String>,
    /// Tool calls by name.
    pub tool: Vec<String>,
    /// Egress destination host.
    pub host: Vec<String>,
    /// Whether this Claude line is a subagent's (`isSidechain`).
    pub sidechain: bool,
}

/// Field names a rule may scan.
pub const FIELDS: &[&str] = &["text", "command", "file_read", "tool", "host"];

impl View {
    /// The strings of one field.
    pub fn field(&self, name: &str) -> &[String] {
        match name {
            "text" => &self.text,
            "command" => &self.command,
            "file_read" => &self.file_read,
            "tool" => &self.tool,
            "host" => &self.host,
            _ => &[],
        }
    }
}

/// Builds the view of one payload.
pub fn view(source: Source, payload: &Value) -> View {
    match source {
        Source::Claude => claude(payload),
        Source::Codex => codex(payload),
        Source::Egress => {
            let mut v = View { kind: "egress".into(), ..View::default() };
            if let Some(h) = payload.get("host").and_then(Value::as_str) {
                v.host.push(h.to_ascii_lowercase());
            }
            v
        }
        Source::Session | Source::External | Source::Gate => {
            View { kind: source.as_str().into(), text: vec![raw(payload)], ..View::default() }
        }
    }
}

fn raw(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn push_str(out: &mut Vec<String>, v: Option<&Value>) {
    if let Some(s) = v.and_then(Value::as_str)
        && !s.is_empty()
    {
        out.push(s.to_string());
    }
}

/// `tool_result.content` / `message.content`: a string or an array of blocks (quirk 5).
fn content_text(v: &View, content: Option<&Value>, out: &mut Vec<String>) {
    let _ = v;
    match content {
        Some(Value::String(s)) => out.push(s.clone()),
        Some(Value::Array(blocks)) => {
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => push_str(out, b.get("text")),
                    Some("image") => {} // base64 pixels (quirk 7): not text
                    // `document`, `search_result`, and any block type added later: scanned
                    // raw, so a new block type is never a blind spot for detection.
                    _ => out.push(b.to_string()),
                }
            }
        }
        _ => {}
    }
}

fn claude_tool_use(v: &mut View, name: &str, input: &Value) {
    v.tool.push(name.to_string());
    match name {
        "Bash" => push_str(&mut v.command, input.get("command")),
        "Read" | "NotebookRead" => {
            push_str(&mut v.file_read, input.get("file_path"));
            push_str(&mut v.file_read, input.get("notebook_path"));
        }
        _ => {}
    }
    // Tool inputs can carry secrets too (Write content, WebFetch URLs, …).
    v.text.push(input.to_string());
}

fn claude(p: &Value) -> View {
    let kind = p.get("type").and_then(Value::as_str).unwrap_or("unknown");
    let mut v = View {
        kind: kind.to_string(),
        sidechain: p.get("isSidechain").and_then(Value::as_bool).unwrap_or(false),
        ..View::default()
    };
    match kind {
        "user" | "assistant" => {
            let content = p.get("message").and_then(|m| m.get("content"));
            match content {
                Some(Value::String(s)) => v.text.push(s.clone()),
                Some(Value::Array(blocks)) => {
                    for b in blocks {
                        match b.get("type").and_then(Value::as_str) {
                            Some("text") => push_str(&mut v.text, b.get("text")),
                            Some("thinking") => push_str(&mut v.text, b.get("thinking")),
                            Some("tool_use") => {
                                let name = b.get("name").and_then(Value::as_str).unwrap_or("");
                                let input = b.get("input").unwrap_or(&Value::Null);
                                claude_tool_use(&mut v, name, input);
                            }
                            Some("tool_result") => {
                                let mut out = Vec::new();
                                content_text(&v, b.get("content"), &mut out);
                                v.text.extend(out);
                            }
                            // Signed, encrypted reasoning: nothing readable to scan.
                            Some("redacted_thinking") | Some("image") => {}
                            // `server_tool_use`, `web_search_tool_result`, `document` and
                            // block types added later are scanned raw, never skipped.
                            _ => v.text.push(b.to_string()),
                        }
                    }
                }
                _ => {}
            }
            // toolUseResult: object or plain string (quirk 5); file contents duplicate the
            // tool_result text (quirk 7), so only the path is taken from it.
            match p.get("toolUseResult") {
                Some(Value::String(s)) => v.text.push(s.clone()),
                Some(obj @ Value::Object(_)) => {
                    if let Some(f) = obj.get("file") {
                        push_str(&mut v.file_read, f.get("filePath"));
                    }
                    push_str(&mut v.text, obj.get("stdout"));
                    push_str(&mut v.text, obj.get("stderr"));
                }
                _ => {}
            }
        }
        "system" => push_str(&mut v.text, p.get("content")),
        "summary" => push_str(&mut v.text, p.get("summary")),
        "file-history-snapshot" | "queue-operation" => {}
        _ => {
            v.kind = "unknown".into();
            v.text.push(p.to_string());
        }
    }
    v
}

fn shell_command(args: &Value) -> Option<String> {
    match args.get("command") {
        Some(Value::Array(parts)) => {
            let parts: Vec<&str> = parts.iter().filter_map(Value::as_str).collect();
            // `bash -lc "cmd"`: the script is what ran.
            if parts.len() == 3 && parts[1].starts_with('-') && parts[1].contains('c') {
                Some(parts[2].to_string())
            } else {
                Some(parts.join(" "))
            }
        }
        Some(Value::String(s)) => Some(s.clone()),
        _ => None,
    }
}

fn codex(line: &Value) -> View {
    let kind = line.get("type").and_then(Value::as_str).unwrap_or("unknown");
    let p = line.get("payload").unwrap_or(&Value::Null);
    let ptype = p.get("type").and_then(Value::as_str).unwrap_or("");
    let mut v = View { kind: kind.to_string(), ..View::default() };
    match (kind, ptype) {
        ("session_meta", _) | ("turn_context", _) => {}
        ("response_item", "message") => {
            if let Some(Value::Array(parts)) = p.get("content") {
                for c in parts {
                    push_str(&mut v.text, c.get("text"));
                }
            }
        }
        ("response_item", "reasoning") => {
            if let Some(Value::Array(parts)) = p.get("summary") {
                for c in parts {
                    push_str(&mut v.text, c.get("text"));
                }
            }
        }
        ("response_item", "function_call") => {
            v.kind = "function_call".into();
            let name = p.get("name").and_then(Value::as_str).unwrap_or("");
            v.tool.push(name.to_string());
            // `arguments` is JSON inside a string.
            let args_text = p.get("arguments").and_then(Value::as_str).unwrap_or("");
            if let Ok(args) = serde_json::from_str::<Value>(args_text)
                && let Some(cmd) = shell_command(&args)
            {
                v.command.push(cmd);
            }
            v.text.push(args_text.to_string());
        }
        ("response_item", "function_call_output")
        | ("response_item", "custom_tool_call_output") => {
            v.kind = "function_call_output".into();
            let out = p.get("output").and_then(Value::as_str).unwrap_or("");
            match serde_json::from_str::<Value>(out) {
                Ok(inner) if inner.get("output").is_some() => {
                    push_str(&mut v.text, inner.get("output"))
                }
                _ => v.text.push(out.to_string()),
            }
        }
        ("response_item", "custom_tool_call") => {
            v.kind = "custom_tool_call".into();
            push_str(&mut v.tool, p.get("name"));
            push_str(&mut v.text, p.get("input"));
        }
        ("response_item", "local_shell_call") => {
            v.kind = "local_shell_call".into();
            if let Some(action) = p.get("action")
                && let Some(cmd) = shell_command(action)
            {
                v.command.push(cmd);
            }
        }
        ("event_msg", "user_message") | ("event_msg", "agent_message") => {
            push_str(&mut v.text, p.get("message"))
        }
        ("event_msg", "agent_reasoning") => push_str(&mut v.text, p.get("text")),
        ("event_msg", "exec_command_begin") => {
            if let Some(cmd) = shell_command(p) {
                v.command.push(cmd);
            }
        }
        ("event_msg", _) => {}
        ("compacted", _) => push_str(&mut v.text, p.get("message")),
        _ => {
            v.kind = "unknown".into();
            v.text.push(line.to_string());
        }
    }
    v
}

/// Strips the Read tool's `"     1→"` line-number prefixes (quirk 10) so anchored patterns
/// see the file's own text.
pub fn strip_line_numbers(s: &str) -> Option<String> {
    if !s.contains('\u{2192}') {
        return None;
    }
    let mut out = String::with_capacity(s.len());
    for line in s.split_inclusive('\n') {
        match line.split_once('\u{2192}') {
            Some((num, rest))
                if num.trim().chars().all(|c| c.is_ascii_digit()) && !num.trim().is_empty() =>
            {
                out.push_str(rest)
            }
            _ => out.push_str(line),
        }
    }
    Some(out)
}

/// The complete lines of a file being appended to live: everything up to the last `\n`,
/// and the byte offset to resume from (quirk 6: tolerate a truncated last line).
pub fn complete_lines(buf: &[u8]) -> (Vec<&[u8]>, usize) {
    let Some(end) = buf.iter().rposition(|b| *b == b'\n') else {
        return (Vec::new(), 0);
    };
    let lines = buf[..end].split(|b| *b == b'\n').filter(|l| !l.is_empty()).collect();
    (lines, end + 1)
}

/// Claude `summary` lines to trust: only those whose `leafUuid` is a `uuid` in the same
/// file (quirk 3: summaries of other sessions leak into files).
pub fn trusted_summaries(lines: &[Value]) -> Vec<&Value> {
    let uuids: std::collections::HashSet<&str> =
        lines.iter().filter_map(|l| l.get("uuid").and_then(Value::as_str)).collect();
    lines
        .iter()
        .filter(|l| l.get("type").and_then(Value::as_str) == Some("summary"))
        .filter(|l| l.get("leafUuid").and_then(Value::as_str).is_some_and(|u| uuids.contains(u)))
        .collect()
}

/// The active branch's leaf of a Claude file: among lines no other line names as parent,
/// the one with the latest timestamp (quirk 4: `/rewind` branches, compaction roots).
pub fn active_leaf(lines: &[Value]) -> Option<&str> {
    let parents: std::collections::HashSet<&str> =
        lines.iter().filter_map(|l| l.get("parentUuid").and_then(Value::as_str)).collect();
    lines
        .iter()
        .filter_map(|l| Some((l.get("uuid")?.as_str()?, l.get("timestamp")?.as_str()?)))
        .filter(|(u, _)| !parents.contains(u))
        .max_by(|a, b| a.1.cmp(b.1))
        .map(|(u, _)| u)
}

/// Token usage for cost, deduped on `(message.id, requestId)` keeping the largest
/// `output_tokens` (quirk 1), skipping `<synthetic>` messages.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_creation: u64,
    pub cache_read: u64,
}

pub fn claude_usage(lines: &[Value]) -> Usage {
    let mut best: std::collections::HashMap<(String, String), (u64, u64, u64, u64)> =
        std::collections::HashMap::new();
    for l in lines {
        let Some(m) = l.get("message") else { continue };
        if l.get("type").and_then(Value::as_str) != Some("assistant")
            || m.get("model").and_then(Value::as_str) == Some("<synthetic>")
        {
            continue;
        }
        let Some(u) = m.get("usage") else { continue };
        let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
        let key = (
            m.get("id").and_then(Value::as_str).unwrap_or("").to_string(),
            l.get("requestId").and_then(Value::as_str).unwrap_or("").to_string(),
        );
        let cur = (
            n("input_tokens"),
            n("output_tokens"),
            n("cache_creation_input_tokens"),
            n("cache_read_input_tokens"),
        );
        let e = best.entry(key).or_insert(cur);
        if cur.1 > e.1 {
            *e = cur;
        }
    }
    best.values().fold(Usage::default(), |acc, v| Usage {
        input: acc.input + v.0,
        output: acc.output + v.1,
        cache_creation: acc.cache_creation + v.2,
        cache_read: acc.cache_read + v.3,
    })
}

/// Envelope id of a Codex line: the session id and the line's byte offset (docs/api.md);
/// Codex lines carry no id of their own.
pub fn codex_id(session_id: &str, offset: u64) -> String {
    format!("{session_id}:{offset}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/transcripts")
    }

    fn lines(name: &str) -> Vec<Value> {
        let raw = std::fs::read(dir().join(name)).unwrap();
        let (ls, _) = complete_lines(&raw);
        ls.iter().map(|l| serde_json::from_slice(l).unwrap()).collect()
    }

    fn views(name: &str, source: Source) -> Vec<View> {
        lines(name).iter().map(|l| view(source, l)).collect()
    }

    #[test]
    fn happy_paths() {
        let v = views("claude-happy-path.jsonl", Source::Claude);
        assert_eq!(v.len(), 6);
        assert_eq!(v[2].tool, vec!["Read"]);
        assert_eq!(v[2].file_read, vec!["/home/ana/src/payments/tests/retry_test.rs"]);
        assert!(v[3].text[0].contains("STRIPE_KEY"));
        assert_eq!(v[3].file_read, vec!["/home/ana/src/payments/tests/retry_test.rs"]);
        assert_eq!(v[5].kind, "summary");
        let c = views("codex-happy-path.jsonl", Source::Codex);
        assert_eq!(c[4].command, vec!["cargo test retry"]);
        assert_eq!(c[5].text, vec!["test result: ok. 3 passed; 0 failed\n"]);
        assert_eq!(c[7].text, vec!["All 3 retry tests pass."]);
    }

    #[test]
    fn quirk1_split_assistant_usage_deduped() {
        let ls = lines("claude-split-assistant.jsonl");
        assert_eq!(ls.len(), 4, "every line kept as an event");
        let u = claude_usage(&ls);
        assert_eq!(u.output, 61, "max output_tokens of one (message.id, requestId)");
        assert_eq!(u.input, 4);
    }

    #[test]
    fn quirk2_and_9_duplicates_share_uuid() {
        let a = lines("claude-resumed-1.jsonl");
        let b = lines("claude-resumed-2.jsonl");
        let ua: std::collections::HashSet<_> = a.iter().map(|l| l["uuid"].clone()).collect();
        let copied = b.iter().filter(|l| ua.contains(&l["uuid"])).count();
        assert_eq!(copied, 2, "the resumed file repeats earlier uuids (dedup on uuid, not file)");
        let d = lines("claude-stream-json-dup.jsonl");
        assert_eq!(d[0]["uuid"], d[1]["uuid"]);
    }

    #[test]
    fn quirk3_foreign_summary_untrusted() {
        let ls = lines("claude-foreign-summary.jsonl");
        let t = trusted_summaries(&ls);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0]["summary"], "This session");
    }

    #[test]
    fn quirk4_rewind_branch_and_compaction() {
        let ls = lines("claude-rewind-branch.jsonl");
        assert_eq!(active_leaf(&ls), Some("b5"));
        let first: Vec<_> = ls.iter().filter(|l| l["parentUuid"] == "b1").collect();
        assert_eq!(first.len(), 2, "two children of one parent");
        assert_eq!(view(Source::Claude, &ls[3]).text, vec!["Conversation compacted"]);
    }

    #[test]
    fn quirk5_content_shapes() {
        let v = views("claude-content-shapes.jsonl", Source::Claude);
        assert_eq!(v[0].text, vec!["plain string content"]);
        assert_eq!(v[1].text, vec!["screenshot attached"], "image bytes are not text");
        assert!(v[2].text.iter().any(|t| t == "Error: command failed"));
        assert_eq!(v[3].text, vec!["<hook feedback>"]);
    }

    #[test]
    fn quirk6_truncated_last_line() {
        let raw = std::fs::read(dir().join("claude-truncated.jsonl")).unwrap();
        let (ls, offset) = complete_lines(&raw);
        assert_eq!(ls.len(), 1);
        assert!(offset < raw.len());
        assert_eq!(raw[offset - 1], b'\n');
    }

    #[test]
    fn quirk7_file_content_scanned_once() {
        let v = views("claude-bloat.jsonl", Source::Claude);
        assert_eq!(v[0].text.len(), 1, "toolUseResult.file.content is not scanned twice");
        assert_eq!(v[0].file_read, vec!["/home/ana/src/payments/src/main.rs"]);
    }

    #[test]
    fn quirk8_parallel_tool_calls() {
        let v = views("claude-parallel-tools.jsonl", Source::Claude);
        assert_eq!(v[0].tool, vec!["Bash", "Read"]);
        assert_eq!(v[0].command, vec!["git status"]);
        assert_eq!(v[0].file_read, vec!["/home/ana/src/payments/README.md"]);
        let ls = lines("claude-parallel-tools.jsonl");
        assert_eq!(ls[1]["sourceToolAssistantUUID"], "p1");
        assert_eq!(ls[2]["parentUuid"], ls[1]["parentUuid"]);
    }

    #[test]
    fn quirk10_read_arrow_prefix() {
        let v = views("claude-read-arrow.jsonl", Source::Claude);
        let stripped = strip_line_numbers(&v[0].text[0]).unwrap();
        assert!(stripped.starts_with("[default]\naws_access_key_id = AKIA"));
    }

    #[test]
    fn subagent_unknown_and_synthetic() {
        let v = views("claude-subagent.jsonl", Source::Claude);
        assert!(v.iter().all(|x| x.sidechain));
        let u = views("claude-unknown-type.jsonl", Source::Claude);
        assert_eq!(u[0].kind, "unknown");
        assert!(u[0].text[0].contains("brand-new-line-type"), "unknown lines are scanned raw");
        assert!(u[1].text.is_empty() && u[2].text.is_empty());
        assert_eq!(claude_usage(&lines("claude-synthetic-model.jsonl")), Usage::default());
    }

    #[test]
    fn codex_quirks() {
        assert!(views("codex-empty-git.jsonl", Source::Codex)[0].text.is_empty());
        let p = views("codex-apply-patch.jsonl", Source::Codex);
        assert_eq!(p[0].tool, vec!["apply_patch"]);
        assert!(p[0].text[0].contains("*** Begin Patch"));
        assert_eq!(p[1].text, vec!["Success"]);
        assert!(views("codex-token-count-null.jsonl", Source::Codex)[0].text.is_empty());
        let r = lines("codex-resumed.jsonl");
        assert_eq!(r.iter().filter(|l| l["type"] == "turn_context").count(), 2);
        let f = lines("codex-forked.jsonl");
        assert!(f[0]["payload"]["forked_from_id"].is_string());
        let u = views("codex-unknown.jsonl", Source::Codex);
        assert_eq!(u[0].kind, "unknown");
        assert!(u[0].text[0].contains("brand_new_item"));
        assert_eq!(u[1].kind, "unknown");
        assert_eq!(u[2].command, vec!["cat ~/.aws/credentials"]);
        assert_eq!(codex_id("019c", 512), "019c:512");
    }
}
