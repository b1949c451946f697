//! Session records (DESIGN §5): `~/.airlock/logs/<repo>/sessions-<YYYY-MM-DD>.jsonl`, a start
//! line (`id` = `<session>:start`) and an end line (`<session>:end`), each one `write(2)` on an
//! `O_APPEND` file, written by the daemon.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;
use time::OffsetDateTime;
use time::macros::format_description;

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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i32>,
    pub transcripts: &'a [TranscriptHash],
    pub quarantined: &'a [Quarantined],
    /// `supervisor_lost` when the control connection dropped without `session_end`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<&'static str>,
    pub tunnels: u64,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
}

/// RFC 3339 with milliseconds, UTC (`2026-07-24T18:03:11.482Z`).
pub fn rfc3339_ms(t: OffsetDateTime) -> String {
    let fmt =
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");
    // Formatting a UTC OffsetDateTime with a fixed description cannot fail for years 0..=9999.
    t.format(&fmt).unwrap_or_else(|_| t.unix_timestamp().to_string())
}

/// `sessions-<YYYY-MM-DD>.jsonl` in `logs_dir` for the UTC date of `t`.
pub fn sessions_file(logs_dir: &Path, t: OffsetDateTime) -> PathBuf {
    let d = t.date();
    logs_dir.join(format!(
        "sessions-{:04}-{:02}-{:02}.jsonl",
        d.year(),
        u8::from(d.month()),
        d.day()
    ))
}

#[derive(Debug, thiserror::Error)]
#[error(
    "cannot write session record {path}: {source}; check the directory's permissions and free space"
)]
pub struct RecordError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Appends one record as one line with one `write(2)` (directories created 0700, files 0600).
pub fn append<T: Serialize>(logs_dir: &Path, record: &T) -> Result<PathBuf, RecordError> {
    let now = OffsetDateTime::now_utc();
    let path = sessions_file(logs_dir, now);
    let err = |source| RecordError { path: path.clone(), source };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(logs_dir).map_err(err)?;
    let mut line = serde_json::to_vec(record).map_err(|e| err(std::io::Error::other(e)))?;
    line.push(b'\n');
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&path)
        .map_err(err)?;
    // One write(2) on O_APPEND: concurrent writers never interleave within a line.
    let n = file.write(&line).map_err(err)?;
    if n != line.len() {
        return Err(err(std::io::Error::new(std::io::ErrorKind::WriteZero, "short write")));
    }
    Ok(path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_have_milliseconds_and_z() {
        let t = OffsetDateTime::from_unix_timestamp_nanos(1_784_916_191_482_000_000).unwrap();
        assert_eq!(rfc3339_ms(t), "2026-07-24T18:03:11.482Z");
        assert!(sessions_file(Path::new("/l"), t).ends_with("sessions-2026-07-24.jsonl"));
    }

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
            user_id: None,
            exit_status: Some(3),
            transcripts: &[],
            quarantined: &[],
            end_reason: Some("supervisor_lost"),
            tunnels: 0,
            bytes_sent: 0,
            bytes_recv: 0,
        };
        let p = append(&logs, &rec).unwrap();
        append(&logs, &rec).unwrap();
        let text = std::fs::read_to_string(p).unwrap();
        let lines: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["end_reason"], "supervisor_lost");
        assert_eq!(lines[0]["id"], "s:end");
        assert!(lines[0].get("user_id").is_none());
    }
}
