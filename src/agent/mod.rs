//! Coding agents in the sandbox (`airlock run`, DESIGN §7, SECURITY §4–5; walkthrough in
//! `docs/agents.md`).
//!
//! - [`resolve`]: find the agent's executable on the host, follow it to the real file, and plan
//!   its read-only binds and `PATH` inside (its package directory, its interpreter).
//! - [`home`]: the per-repo agent home under `~/.airlock/agent/<agent>/<repo key>/`, reached
//!   only through directory fds and `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`:
//!   credential copy-in/copy-back, the synthesized `.gitconfig`, transcript hashing.
//!
//! This module knows each agent's file layout ([`Layout`]); the sandbox knows nothing of agents.

pub mod home;
pub mod resolve;

/// Which agent a session runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Agent {
    /// Claude Code (`claude`; npm `@anthropic-ai/claude-code`).
    Claude,
    /// OpenAI Codex CLI (`codex`; npm `@openai/codex`).
    Codex,
    /// Any other program, named by path; `name` is its sanitized file name.
    Custom { name: String },
}

/// A credential file the agent keeps in its home, shared across repos (SECURITY §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credential {
    /// Path relative to the home, e.g. `.claude/.credentials.json`.
    pub rel: &'static str,
    pub format: CredentialFormat,
}

/// What a credential file must parse as before copy-back takes it (SECURITY §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialFormat {
    /// Claude Code on Linux: a JSON object whose `claudeAiOauth` is an object with a string
    /// `accessToken`.
    ClaudeOauth,
    /// Codex: a JSON object with a string `OPENAI_API_KEY` or an object `tokens`.
    CodexAuth,
}

/// Transcript files: regular files under `root` (relative to the home) whose name ends with
/// `suffix`, at any depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TranscriptRoot {
    pub root: &'static str,
    pub suffix: &'static str,
}

/// Where an agent keeps its files in its home (`/home/agent` inside).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Directories created in a new home (relative), so the agent finds them.
    pub dirs: &'static [&'static str],
    pub credentials: &'static [Credential],
    pub transcripts: &'static [TranscriptRoot],
}

const CLAUDE: Layout = Layout {
    dirs: &[".claude"],
    credentials: &[Credential {
        rel: ".claude/.credentials.json",
        format: CredentialFormat::ClaudeOauth,
    }],
    transcripts: &[TranscriptRoot { root: ".claude/projects", suffix: ".jsonl" }],
};

const CODEX: Layout = Layout {
    dirs: &[".codex"],
    credentials: &[Credential { rel: ".codex/auth.json", format: CredentialFormat::CodexAuth }],
    transcripts: &[
        TranscriptRoot { root: ".codex/sessions", suffix: ".jsonl" },
        TranscriptRoot { root: ".codex/archived_sessions", suffix: ".jsonl" },
    ],
};

const CUSTOM: Layout = Layout { dirs: &[], credentials: &[], transcripts: &[] };

impl Agent {
    /// `claude`, `codex`, or a path (anything with a `/`).
    pub fn from_arg(arg: &str) -> Self {
        match arg {
            "claude" => Agent::Claude,
            "codex" => Agent::Codex,
            other => {
                let base = std::path::Path::new(other)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let name = crate::repo::sanitize_name(&base);
                let name = if crate::repo::is_valid_name(&name) { name } else { "agent".into() };
                Agent::Custom { name }
            }
        }
    }

    /// The name used for `~/.airlock/agent/<name>/`, `/opt/airlock/agents/<name>/` and the
    /// session record's `agent` field.
    pub fn name(&self) -> &str {
        match self {
            Agent::Claude => "claude",
            Agent::Codex => "codex",
            Agent::Custom { name } => name,
        }
    }

    /// The directory name under `~/.airlock/agent/` and `/opt/airlock/agents/`: a custom agent's
    /// is prefixed `custom-`, so `airlock run ./claude` can never share Claude Code's homes or
    /// credentials.
    pub fn dir_name(&self) -> String {
        match self {
            Agent::Custom { name } => format!("custom-{name}"),
            other => other.name().to_string(),
        }
    }

    pub fn layout(&self) -> &'static Layout {
        match self {
            Agent::Claude => &CLAUDE,
            Agent::Codex => &CODEX,
            Agent::Custom { .. } => &CUSTOM,
        }
    }

    /// How to install a missing agent.
    pub fn install_hint(&self) -> String {
        match self {
            Agent::Claude => "install Claude Code with `npm install -g @anthropic-ai/claude-code` \
                              (or put `claude` on your PATH)"
                .into(),
            Agent::Codex => {
                "install Codex with `npm install -g @openai/codex` (or put `codex` on your PATH)"
                    .into()
            }
            Agent::Custom { .. } => "pass the path of an executable file".into(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths() {
        assert_eq!(Agent::from_arg("claude"), Agent::Claude);
        assert_eq!(Agent::from_arg("codex"), Agent::Codex);
        assert_eq!(Agent::from_arg("./bin/My Agent").name(), "my-agent");
        assert_eq!(Agent::from_arg("/").name(), "agent");
        assert_eq!(Agent::from_arg("/x/..").name(), "agent");
        assert_eq!(Agent::from_arg("./claude").dir_name(), "custom-claude");
        assert_eq!(Agent::from_arg("./shared").dir_name(), "custom-shared");
        assert_eq!(Agent::Claude.dir_name(), "claude");
    }
}
