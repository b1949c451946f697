//! What a session with `[gate] commands` gets in its synthesized, read-only `/etc`
//! (docs/gates.md, "Gated tool calls"): Claude Code's managed settings with a `PreToolUse`
//! hook on `Bash`, and the hook script (`contrib/agents/claude/airlock-gate-hook`), which asks
//! the proxy's `gate.airlock` endpoint before each command. Managed settings take precedence
//! over the user's and the project's, and the files are part of the sandbox's root, so the
//! agent can neither edit nor remove them.

use std::path::PathBuf;
use std::time::Duration;

use crate::sandbox::mounts::EtcFile;

/// The hook, as shipped in `contrib/`.
pub const HOOK: &str = include_str!("../../../contrib/agents/claude/airlock-gate-hook");
pub const HOOK_PATH: &str = "/etc/claude-code/airlock-gate-hook";
pub const SETTINGS_PATH: &str = "/etc/claude-code/managed-settings.json";

/// How much longer than `[gate] timeout` the hook waits for the proxy's answer (the proxy
/// answers `gate_expired` at the timeout), and how much longer again Claude Code waits for the
/// hook: a hook Claude Code times out counts as a non-blocking error and would let the tool
/// run, so the hook's own deadline must come first.
const HOOK_SLACK: Duration = Duration::from_secs(15);
const SETTINGS_SLACK: Duration = Duration::from_secs(30);

/// The managed settings for a `[gate] timeout` of `timeout`.
pub fn settings(timeout: Duration) -> String {
    let deadline = (timeout + HOOK_SLACK).as_secs();
    let hook_timeout = (timeout + SETTINGS_SLACK).as_secs();
    let v = serde_json::json!({
        "hooks": {
            "PreToolUse": [{
                "matcher": "Bash",
                "hooks": [{
                    "type": "command",
                    "command": format!("{HOOK_PATH} {deadline} {}", crate::sandbox::env::PROXY_URL),
                    "timeout": hook_timeout,
                }],
            }],
        },
    });
    let mut text = serde_json::to_string_pretty(&v).unwrap_or_default();
    text.push('\n');
    text
}

/// The files for a session whose `[gate] timeout` is `timeout`.
pub fn etc_files(timeout: Duration) -> Vec<EtcFile> {
    vec![
        EtcFile { path: PathBuf::from(HOOK_PATH), contents: HOOK.to_owned(), mode: 0o755 },
        EtcFile { path: PathBuf::from(SETTINGS_PATH), contents: settings(timeout), mode: 0o644 },
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_outlasts_the_gate_and_claude_code_outlasts_the_hook() {
        let v: serde_json::Value =
            serde_json::from_str(&settings(Duration::from_secs(110))).unwrap();
        let hook = &v["hooks"]["PreToolUse"][0];
        assert_eq!(hook["matcher"], "Bash");
        assert_eq!(
            hook["hooks"][0]["command"],
            "/etc/claude-code/airlock-gate-hook 125 http://127.0.0.1:8888"
        );
        assert_eq!(hook["hooks"][0]["timeout"], 140);
        let files = etc_files(Duration::from_secs(5));
        assert_eq!(files[0].mode, 0o755);
        assert!(files[0].contents.starts_with("#!/bin/sh\n"));
    }
}
