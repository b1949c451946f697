//! A typed view of event payloads for detection and display: Claude Code and Codex
//! transcript lines (reference/transcripts.md) become messages, tool calls and results,
//! files read and commands run; egress lines expose their host. Unknown line types are
//! never rejected: their raw JSON is scanned as text (and stored verbatim by the store).

use super::Source;
use serde_json::Value;

/// What one line says, in the terms detection rules use (`fields` in a rule).
#[derive(Debug, Default, Clone, PartialEq)]
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
    if let Some(s) = v.and_then(Value::as_str) {
        if !s.is_empty() {
            out.push(s.to_string());
        }
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
                    Some("image") | Some("document") => {} // base64 bloat (quirk 7): not text
                    _ => {}
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
                            _ => {}
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
            if let Ok(args) = serde_json::from_str::<Value>(args_text) {
                if let Some(cmd) = shell_command(&args) {
                    v.command.push(cmd);
                }
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
            if let Some(action) = p.get("action") {
                if let Some(cmd) = shell_command(action) {
                    v.command.push(cmd);
                }
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
