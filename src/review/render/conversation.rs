//! Transcript lines as a conversation: each stored Claude Code or Codex line becomes blocks
//! (a user prompt, assistant text, a tool call with its input, a tool result, thinking, a
//! note, or — for any shape not understood — the line's JSON, collapsed). Nothing is ever
//! dropped: an unknown line type, content block or payload type is shown raw. Long fields
//! are cut at [`FIELD_MAX`] bytes with a note (quirk 7: base64 images and file bodies).

use super::clip;
use crate::review::Source;
use maud::{Markup, html};
use serde_json::Value;

/// Bytes of one text field shown at most; the rest is counted, never silently lost.
pub const FIELD_MAX: usize = 16 * 1024;

/// One piece of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// What the user typed.
    Prompt(String),
    /// Text the agent injected on the user's side (`isMeta` hook feedback): collapsed.
    Meta(String),
    /// The assistant's text.
    Assistant(String),
    /// Reasoning text: collapsed.
    Thinking(String),
    /// Signed reasoning with nothing readable.
    RedactedThinking,
    /// A tool call and its input (pretty JSON or the raw text).
    ToolCall { name: String, input: String },
    /// A tool's result: collapsed; `label` says the exit status when known.
    ToolResult { text: String, error: bool, label: String },
    /// An image block (its bytes are not shown).
    Image,
    /// A line of the agent's own bookkeeping (system, summary, compaction, Codex context).
    Note { label: String, text: String },
    /// A shape this parser does not know, or one with nothing else to show: its JSON,
    /// collapsed.
    Raw { label: String, json: String },
}

/// Per-file facts some lines need to be shown right.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileContext {
    /// A Codex file with `response_item` messages: its `event_msg` user/agent messages repeat
    /// them (the reference's "agent text appears twice"), so those are shown collapsed.
    pub codex_has_items: bool,
}

impl FileContext {
    /// The context of one file's lines.
    pub fn of(source: Source, lines: &[&Value]) -> Self {
        let codex_has_items = source == Source::Codex
            && lines.iter().any(|l| {
                l.get("type").and_then(Value::as_str) == Some("response_item")
                    && l.pointer("/payload/type").and_then(Value::as_str) == Some("message")
            });
        Self { codex_has_items }
    }
}

/// The blocks of one transcript line.
pub fn blocks(source: Source, line: &Value, ctx: FileContext) -> Vec<Block> {
    let out = match source {
        Source::Claude => claude(line),
        Source::Codex => codex(line, ctx),
        _ => Vec::new(),
    };
    if out.is_empty() { vec![raw(&label_of(line), line)] } else { out }
}

/// Whether a Claude line is a subagent's (`isSidechain`).
pub fn is_sidechain(line: &Value) -> bool {
    line.get("isSidechain").and_then(Value::as_bool).unwrap_or(false)
}

fn label_of(line: &Value) -> String {
    let t = line.get("type").and_then(Value::as_str).unwrap_or("line");
    match line.pointer("/payload/type").and_then(Value::as_str) {
        Some(pt) => format!("{t} {pt}"),
        None => t.to_string(),
    }
}

fn raw(label: &str, v: &Value) -> Block {
    let json = serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
    Block::Raw { label: label.to_string(), json }
}

fn s(v: &Value) -> Option<String> {
    v.as_str().map(str::to_string)
}

fn pretty(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => serde_json::to_string_pretty(other).unwrap_or_else(|_| other.to_string()),
    }
}

/// A tool result's `content`: a string or an array of blocks (quirk 5).
fn result_text(content: Option<&Value>, images: &mut usize) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut t = Vec::new();
            for p in parts {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        t.push(p.get("text").and_then(Value::as_str).unwrap_or("").to_string())
                    }
                    Some("image") => *images += 1,
                    _ => t.push(pretty(p)),
                }
            }
            t.join("\n")
        }
        Some(other) => pretty(other),
        None => String::new(),
    }
}

fn claude(l: &Value) -> Vec<Block> {
    let kind = l.get("type").and_then(Value::as_str).unwrap_or("");
    let mut out = Vec::new();
    match kind {
        "user" | "assistant" => {
            let meta = l.get("isMeta").and_then(Value::as_bool).unwrap_or(false);
            let text_block = |t: String| match (kind, meta) {
                ("assistant", _) => Block::Assistant(t),
                (_, true) => Block::Meta(t),
                _ => Block::Prompt(t),
            };
            match l.pointer("/message/content") {
                Some(Value::String(t)) => out.push(text_block(t.clone())),
                Some(Value::Array(parts)) => {
                    for b in parts {
                        match b.get("type").and_then(Value::as_str) {
                            Some("text") => {
                                out.push(text_block(b.get("text").and_then(s).unwrap_or_default()))
                            }
                            Some("thinking") => out.push(Block::Thinking(
                                b.get("thinking").and_then(s).unwrap_or_default(),
                            )),
                            Some("redacted_thinking") => out.push(Block::RedactedThinking),
                            Some("image") => out.push(Block::Image),
                            Some("tool_use") => out.push(Block::ToolCall {
                                name: b.get("name").and_then(s).unwrap_or_default(),
                                input: pretty(b.get("input").unwrap_or(&Value::Null)),
                            }),
                            Some("tool_result") => {
                                let mut images = 0;
                                let mut text = result_text(b.get("content"), &mut images);
                                if images > 0 {
                                    text.push_str(&format!("\n[{images} image(s) not shown]"));
                                }
                                let error =
                                    b.get("is_error").and_then(Value::as_bool).unwrap_or(false);
                                out.push(Block::ToolResult {
                                    text,
                                    error,
                                    label: if error { "error".into() } else { String::new() },
                                });
                            }
                            _ => out.push(raw(&format!("{kind} content block"), b)),
                        }
                    }
                }
                _ => out.push(raw(kind, l)),
            }
        }
        "system" => out.push(Block::Note {
            label: format!("system {}", l.get("subtype").and_then(Value::as_str).unwrap_or(""))
                .trim_end()
                .to_string(),
            text: l.get("content").map(pretty).unwrap_or_default(),
        }),
        "summary" => out.push(Block::Note {
            label: "summary".into(),
            text: l.get("summary").map(pretty).unwrap_or_default(),
        }),
        // Known bookkeeping and unknown types alike: the line itself, collapsed.
        _ => out.push(raw(kind, l)),
    }
    out
}

fn codex(l: &Value, ctx: FileContext) -> Vec<Block> {
    let kind = l.get("type").and_then(Value::as_str).unwrap_or("");
    let p = l.get("payload").unwrap_or(&Value::Null);
    let ptype = p.get("type").and_then(Value::as_str).unwrap_or("");
    let get = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let mut out = Vec::new();
    match (kind, ptype) {
        ("session_meta", _) => {
            let mut t = format!("codex {} in {}", get("cli_version"), get("cwd"));
            if let Some(f) = p.get("forked_from_id").and_then(Value::as_str) {
                t.push_str(&format!(", forked from {f}"));
            }
            out.push(Block::Note { label: "session".into(), text: t });
        }
        ("turn_context", _) => out.push(Block::Note {
            label: "turn context".into(),
            text: format!(
                "model {}, approval {}, sandbox {}",
                get("model"),
                get("approval_policy"),
                p.get("sandbox_policy").map(|v| v.to_string()).unwrap_or_default()
            ),
        }),
        ("response_item", "message") => {
            let role = get("role");
            for c in p.get("content").and_then(Value::as_array).into_iter().flatten() {
                match c.get("type").and_then(Value::as_str) {
                    Some("input_text") | Some("output_text") | Some("text") => {
                        let t = c.get("text").and_then(s).unwrap_or_default();
                        out.push(if role == "assistant" {
                            Block::Assistant(t)
                        } else {
                            Block::Prompt(t)
                        });
                    }
                    Some("input_image") => out.push(Block::Image),
                    _ => out.push(raw("message content", c)),
                }
            }
        }
        ("response_item", "reasoning") => {
            let t: Vec<String> = p
                .get("summary")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|c| c.get("text").and_then(s))
                .collect();
            if t.is_empty() {
                out.push(Block::RedactedThinking)
            } else {
                out.push(Block::Thinking(t.join("\n")))
            }
        }
        ("response_item", "function_call") => {
            let args = get("arguments");
            let input = match serde_json::from_str::<Value>(&args) {
                Ok(v) => match v.get("command") {
                    Some(cmd) if get("name") == "shell" => super::timeline::command_line(cmd),
                    _ => pretty(&v),
                },
                Err(_) => args,
            };
            out.push(Block::ToolCall { name: get("name"), input });
        }
        ("response_item", "custom_tool_call") => {
            out.push(Block::ToolCall { name: get("name"), input: get("input") })
        }
        ("response_item", "local_shell_call") => out.push(Block::ToolCall {
            name: "local_shell".into(),
            input: p
                .pointer("/action/command")
                .map(super::timeline::command_line)
                .unwrap_or_default(),
        }),
        ("response_item", "function_call_output")
        | ("response_item", "custom_tool_call_output") => {
            let o = get("output");
            let (text, label) = match serde_json::from_str::<Value>(&o) {
                Ok(inner) if inner.get("output").is_some() => {
                    let code = inner.pointer("/metadata/exit_code").and_then(Value::as_i64);
                    (
                        inner.get("output").map(pretty).unwrap_or_default(),
                        code.map(|c| format!("exit {c}")).unwrap_or_default(),
                    )
                }
                _ => (o, String::new()),
            };
            let error = label.starts_with("exit ") && label != "exit 0";
            out.push(Block::ToolResult { text, error, label });
        }
        ("event_msg", "user_message") | ("event_msg", "agent_message") if !ctx.codex_has_items => {
            let t = get("message");
            out.push(if ptype == "agent_message" { Block::Assistant(t) } else { Block::Prompt(t) });
        }
        ("event_msg", "agent_reasoning") => out.push(Block::Thinking(get("text"))),
        ("compacted", _) => {
            out.push(Block::Note { label: "compacted".into(), text: get("message") })
        }
        // Duplicated messages, token counts, lifecycle events and anything unknown: raw.
        _ => out.push(raw(&label_of(l), l)),
    }
    out
}

/// A text field, cut at [`FIELD_MAX`] with the rest counted.
pub fn text(t: &str) -> Markup {
    let (head, cut) = clip(t, FIELD_MAX);
    html! {
        pre { (head) }
        @if cut > 0 { p.mut { "… " (cut) " more bytes not shown (the export has the whole line)." } }
    }
}

/// One block as HTML.
pub fn render(b: &Block) -> Markup {
    html! {
        @match b {
            Block::Prompt(t) => div.msg.user { strong { "User" } (text(t)) },
            Block::Meta(t) => details.msg { summary { "Injected on the user's side" } (text(t)) },
            Block::Assistant(t) => div.msg.assistant { strong { "Assistant" } (text(t)) },
            Block::Thinking(t) => details.msg { summary { "Thinking" } (text(t)) },
            Block::RedactedThinking => div.msg.mut { "Thinking (encrypted, not readable)" },
            Block::ToolCall { name, input } => div.msg.tool { strong { "Tool call: " code { (name) } } (text(input)) },
            Block::ToolResult { text: t, error, label } => details.msg.tool {
                summary { "Tool result" @if !label.is_empty() { " (" (label) ")" } @if *error { " " span.no { "error" } } }
                (text(t))
            },
            Block::Image => div.msg.mut { "[image not shown]" },
            Block::Note { label, text: t } => details.msg { summary { (label) } (text(t)) },
            Block::Raw { label, json } => details.msg { summary { (label) " (shown as stored)" } (text(json)) },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::review::transcript::complete_lines;

    pub(crate) fn fixture(name: &str) -> Vec<Value> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/transcripts")
            .join(name);
        let raw = std::fs::read(p).unwrap();
        let (ls, _) = complete_lines(&raw);
        ls.iter().map(|l| serde_json::from_slice(l).unwrap()).collect()
    }

    fn all(name: &str, source: Source) -> Vec<Block> {
        let ls = fixture(name);
        let refs: Vec<&Value> = ls.iter().collect();
        let ctx = FileContext::of(source, &refs);
        ls.iter().flat_map(|l| blocks(source, l, ctx)).collect()
    }

    #[test]
    fn claude_happy_path_is_a_conversation() {
        let b = all("claude-happy-path.jsonl", Source::Claude);
        assert!(
            matches!(&b[0], Block::Prompt(t) if t.starts_with("Why does the retry test flake?"))
        );
        assert_eq!(b[1], Block::Assistant("Reading the test first.".into()));
        assert!(
            matches!(&b[2], Block::ToolCall { name, input } if name == "Read" && input.contains("retry_test.rs"))
        );
        assert!(
            matches!(&b[3], Block::ToolResult { text, error: false, .. } if text.contains("STRIPE_KEY"))
        );
        assert!(matches!(&b[4], Block::Note { label, .. } if label == "system compact_boundary"));
        assert!(
            matches!(&b[5], Block::Note { label, text } if label == "summary" && text.contains("wall-clock"))
        );
    }

    #[test]
    fn claude_content_shapes_and_unknown_lines_are_kept() {
        let b = all("claude-content-shapes.jsonl", Source::Claude);
        assert_eq!(b[0], Block::Prompt("plain string content".into()));
        assert!(
            matches!(&b[1], Block::ToolResult { text, .. } if text.contains("screenshot attached") && text.contains("1 image(s) not shown"))
        );
        assert!(matches!(&b[2], Block::ToolResult { error: true, .. }));
        assert_eq!(b[3], Block::Meta("<hook feedback>".into()));
        let u = all("claude-unknown-type.jsonl", Source::Claude);
        assert_eq!(u.len(), 3, "every line is shown");
        assert!(
            matches!(&u[0], Block::Raw { label, json } if label == "brand-new-line-type" && json.contains("\"x\": 1"))
        );
        let p = all("claude-parallel-tools.jsonl", Source::Claude);
        assert_eq!(p.iter().filter(|b| matches!(b, Block::ToolCall { .. })).count(), 2);
        assert_eq!(p.iter().filter(|b| matches!(b, Block::ToolResult { .. })).count(), 2);
    }

    #[test]
    fn codex_rollouts() {
        let b = all("codex-happy-path.jsonl", Source::Codex);
        assert!(matches!(&b[0], Block::Note { text, .. } if text.contains("0.61.0")));
        assert_eq!(b[2], Block::Prompt("run the retry tests".into()));
        assert!(
            matches!(&b[3], Block::Raw { label, .. } if label == "event_msg user_message"),
            "the duplicate is collapsed, not dropped"
        );
        assert_eq!(
            b[4],
            Block::ToolCall { name: "shell".into(), input: "bash -lc cargo test retry".into() }
        );
        assert!(
            matches!(&b[5], Block::ToolResult { text, label, error: false } if text.contains("3 passed") && label == "exit 0")
        );
        assert!(matches!(&b[6], Block::Raw { label, .. } if label == "event_msg token_count"));
        assert_eq!(b[7], Block::Assistant("All 3 retry tests pass.".into()));
        let p = all("codex-apply-patch.jsonl", Source::Codex);
        assert!(
            matches!(&p[0], Block::ToolCall { name, input } if name == "apply_patch" && input.contains("*** Begin Patch"))
        );
        let u = all("codex-unknown.jsonl", Source::Codex);
        assert!(
            matches!(&u[0], Block::Raw { label, json } if label == "response_item brand_new_item" && json.contains("rm -rf /"))
        );
        assert!(matches!(&u[1], Block::Raw { label, .. } if label == "world_state"));
        assert!(
            matches!(&u[2], Block::ToolCall { input, .. } if input.contains("cat ~/.aws/credentials"))
        );
        let f = all("codex-forked.jsonl", Source::Codex);
        assert!(matches!(&f[0], Block::Note { text, .. } if text.contains("forked from")));
    }

    #[test]
    fn codex_messages_without_items_come_from_event_msg() {
        let l = serde_json::json!({"type": "event_msg", "payload": {"type": "agent_message", "message": "hi"}});
        let ctx = FileContext::of(Source::Codex, &[&l]);
        assert_eq!(blocks(Source::Codex, &l, ctx), vec![Block::Assistant("hi".into())]);
    }

    #[test]
    fn long_fields_are_cut_and_counted() {
        let t = "a".repeat(FIELD_MAX + 10);
        let h = text(&t).into_string();
        assert!(h.contains("… 10 more bytes not shown"));
        assert!(h.len() < FIELD_MAX + 200);
    }

    #[test]
    fn non_object_lines_render_raw() {
        for v in [Value::Null, serde_json::json!([1, 2]), serde_json::json!("s")] {
            assert!(matches!(
                &blocks(Source::Claude, &v, FileContext::default())[0],
                Block::Raw { .. }
            ));
            assert!(matches!(
                &blocks(Source::Codex, &v, FileContext::default())[0],
                Block::Raw { .. }
            ));
        }
    }
}
