//! Session records (DESIGN §5): `sessions-<YYYY-MM-DD>.jsonl` in the checkout's log directory
//! ([`crate::audit::logdir`]), a start line (`id` = `<session>:start`) and an end line
//! (`<session>:end`), each one `write(2)` on an `O_APPEND` file, written by the daemon.

use std::path::Path;

use serde::Serialize;

use crate::audit::AuditError;
use crate::audit::root::AuditRoot;
use crate::protocol::{Quarantined, TranscriptHash};

/// The start record.
#[derive(Debug, Clone, Serialize)]
pub struct StartRecord<'a> {
    pub id: String,
    pub kind: &'static str,
    pub ts: String,
    pub session: &'a str,
    pub boot: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub email: Option<&'a str>,
    pub repo: &'a str,
    pub repo_path: &'a str,
    /// The checkout's repo key (`<repo>-<8 hex>`).
    pub repo_key: &'a str,
    pub command: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<&'a str>,
    pub airlock_version: &'a str,
    pub daemon_version: &'a str,
    /// `sha256:<hex>` over the layers in force (managed, user, repo, review hosts).
    pub policy_digest: String,
    /// `name@digest` of each policy layer in force.
    pub policy_layers: Vec<String>,
    /// Sandbox layers in force, as the supervisor reported them.
    pub layers: &'a [String],
    pub listen: &'a str,
    /// The phase the session started in (`airlock run --phase`); absent: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<&'a str>,
}

/// The end record.
#[derive(Debug, Clone, Serialize)]
pub struct EndRecord<'a> {
    pub id: String,
    pub kind: &'static str,
    pub ts: String,
    pub session: &'a str,
    pub boot: &'a str,
    pub repo: &'a str,
    pub repo_key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i32>,
    pub transcripts: &'a [TranscriptHash],
    pub quarantined: &'a [Quarantined],
    /// What else the end-of-session sweep found (setuid bits stripped, outside symlinks, …).
    #[serde(flatten)]
    pub leftovers: &'a crate::protocol::Leftovers,
    /// `supervisor_lost` when the control connection dropped without `session_end`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<&'static str>,
    pub tunnels: u64,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    /// The signed root over the session's audit lines ([`crate::audit::root`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit_root: Option<AuditRoot>,
    /// Why there is no `audit_root` (the machine key, the files, lines still open).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit_root_error: Option<String>,
    /// Every phase switch of the session, the one fixed at start first; omitted when the
    /// session never entered a phase.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub phases: &'a [crate::daemon::service::phase::PhaseRecord],
}

/// Appends one record to `<logs_dir>/sessions-<UTC date>.jsonl` (one `write(2)`, `O_APPEND`).
pub fn append<T: Serialize>(logs_dir: &Path, record: &T) -> Result<(), AuditError> {
    crate::audit::append_record(logs_dir, "sessions", record)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn records_append_as_lines() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs/r");
        let rec = EndRecord {
            id: "s:end".into(),
            kind: "end",
            ts: "t".into(),
            session: "s",
            boot: "b",
            repo: "r",
            repo_key: "r-0a1b2c3d",
            user_id: None,
            exit_status: Some(3),
            transcripts: &[],
            quarantined: &[],
            leftovers: &crate::protocol::Leftovers::default(),
            end_reason: Some("supervisor_lost"),
            tunnels: 0,
            bytes_sent: 0,
            bytes_recv: 0,
            audit_root: None,
            audit_root_error: Some("why".into()),
            phases: &[],
        };
        append(&logs, &rec).unwrap();
        append(&logs, &rec).unwrap();
        let file = std::fs::read_dir(&logs).unwrap().next().unwrap().unwrap().path();
        assert!(file.file_name().unwrap().to_string_lossy().starts_with("sessions-"));
        let text = std::fs::read_to_string(file).unwrap();
        let lines: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["end_reason"], "supervisor_lost");
        assert_eq!(lines[0]["id"], "s:end");
        assert!(lines[0].get("user_id").is_none());
        assert!(lines[0].get("audit_root").is_none());
        assert_eq!(lines[0]["audit_root_error"], "why");
    }
}
