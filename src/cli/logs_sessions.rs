//! `airlock logs sessions`: the sessions of a checkout (or of every checkout) from the daemon's
//! session records (`sessions-<YYYY-MM-DD>.jsonl`, docs/audit-format.md): each start record
//! joined with its end record by `session`, as a table or one JSON object per session.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::Context;
use super::logs::{SessionsArgs, Source, Sources};
use crate::audit::escape_for_terminal;

/// One session, as its records tell it.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
struct SessionRow {
    session: String,
    /// The log directory's name under ~/.airlock/logs.
    log_dir: String,
    repo: Option<String>,
    repo_key: Option<String>,
    repo_path: Option<String>,
    user_id: Option<String>,
    agent: Option<String>,
    command: Vec<String>,
    start: Option<String>,
    end: Option<String>,
    duration_ms: Option<u64>,
    exit_status: Option<i64>,
    end_reason: Option<String>,
    tunnels: Option<u64>,
    bytes_sent: Option<u64>,
    bytes_recv: Option<u64>,
}

/// `(date, path)` of every `sessions-<YYYY-MM-DD>.jsonl` in `dir`, oldest first.
fn session_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let date = name.strip_prefix("sessions-").and_then(|r| r.strip_suffix(".jsonl"));
            date.is_some_and(|d| {
                d.len() == 10 && d.bytes().all(|b| b.is_ascii_digit() || b == b'-')
            })
        })
        .map(|e| e.path())
        .collect();
    files.sort();
    Ok(files)
}

fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn ms_between(start: &str, end: &str) -> Option<u64> {
    let a = OffsetDateTime::parse(start, &Rfc3339).ok()?;
    let b = OffsetDateTime::parse(end, &Rfc3339).ok()?;
    u64::try_from((b - a).whole_milliseconds()).ok()
}

/// Every session recorded in `source`, in start order. Lines that are not records are reported
/// on stderr with file and line and skipped.
fn read_sessions(source: &Source) -> anyhow::Result<Vec<SessionRow>> {
    let mut rows: BTreeMap<String, SessionRow> = BTreeMap::new();
    for path in session_files(&source.dir)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", source.dir.display()))?
    {
        let body = std::fs::read(&path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        for (i, raw) in body.split(|b| *b == b'\n').enumerate() {
            if raw.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let rec: Value = match serde_json::from_slice(raw) {
                Ok(v @ Value::Object(_)) => v,
                Ok(_) | Err(_) => {
                    eprintln!(
                        "airlock: {}:{}: skipping a line that is not a session record",
                        path.display(),
                        i + 1
                    );
                    continue;
                }
            };
            let (Some(session), Some(kind)) = (text(&rec, "session"), text(&rec, "kind")) else {
                eprintln!(
                    "airlock: {}:{}: skipping a session record without session or kind",
                    path.display(),
                    i + 1
                );
                continue;
            };
            let row = rows.entry(session.clone()).or_insert_with(|| SessionRow {
                session,
                log_dir: source.label.clone(),
                ..SessionRow::default()
            });
            row.repo = row.repo.take().or_else(|| text(&rec, "repo"));
            row.repo_key = row.repo_key.take().or_else(|| text(&rec, "repo_key"));
            row.user_id = row.user_id.take().or_else(|| text(&rec, "user_id"));
            match kind.as_str() {
                "start" => {
                    row.start = text(&rec, "ts");
                    row.repo_path = text(&rec, "repo_path");
                    row.agent = text(&rec, "agent");
                    row.command = rec
                        .get("command")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                        .unwrap_or_default();
                }
                "end" => {
                    row.end = text(&rec, "ts");
                    row.exit_status = rec.get("exit_status").and_then(Value::as_i64);
                    row.end_reason = text(&rec, "end_reason");
                    row.tunnels = rec.get("tunnels").and_then(Value::as_u64);
                    row.bytes_sent = rec.get("bytes_sent").and_then(Value::as_u64);
                    row.bytes_recv = rec.get("bytes_recv").and_then(Value::as_u64);
                }
                _ => {}
            }
        }
    }
    let mut out: Vec<SessionRow> = rows
        .into_values()
        .map(|mut r| {
            if let (Some(s), Some(e)) = (&r.start, &r.end) {
                r.duration_ms = ms_between(s, e);
            }
            r
        })
        .collect();
    out.sort_by(|a, b| sort_key(a).cmp(sort_key(b)));
    Ok(out)
}

fn sort_key(r: &SessionRow) -> &str {
    r.start.as_deref().or(r.end.as_deref()).unwrap_or("")
}

/// Runs `airlock logs sessions`.
pub(super) fn sessions(args: &SessionsArgs, ctx: &Context<'_>) -> anyhow::Result<()> {
    let mut sources = Sources::resolve(&args.which, ctx)?;
    let all = matches!(sources, Sources::All { .. });
    let found = sources.current()?;
    if !found.iter().any(|s| s.dir.is_dir()) {
        eprintln!("airlock: no session records for {} yet", sources.describe());
        return Ok(());
    }
    let window = args.window;
    let now = SystemTime::now();
    let (since, until) = (window.since.map(|s| s.cutoff(now)), window.until.map(|s| s.cutoff(now)));
    let mut rows = Vec::new();
    for source in &found {
        rows.extend(read_sessions(source)?);
    }
    rows.sort_by(|a, b| sort_key(a).cmp(sort_key(b)));
    rows.retain(|r| {
        if args.session.as_ref().is_some_and(|s| *s != r.session) {
            return false;
        }
        if since.is_none() && until.is_none() {
            return true;
        }
        let Ok(t) = OffsetDateTime::parse(sort_key(r), &Rfc3339) else { return false };
        since.is_none_or(|s| t >= s) && until.is_none_or(|u| t < u)
    });
    let mut out = io::stdout().lock();
    let written =
        if args.json { print_json(&mut out, &rows) } else { print_table(&mut out, &rows, all) };
    match written {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
        other => other?,
    }
    if rows.is_empty() && !args.json {
        eprintln!("airlock: no matching sessions for {}", sources.describe());
    }
    Ok(())
}

fn print_json(out: &mut impl Write, rows: &[SessionRow]) -> io::Result<()> {
    for r in rows {
        serde_json::to_writer(&mut *out, r).map_err(io::Error::other)?;
        writeln!(out)?;
    }
    out.flush()
}

fn human_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{:.1}s", ms as f64 / 1000.0),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn print_table(out: &mut impl Write, rows: &[SessionRow], show_repo: bool) -> io::Result<()> {
    if show_repo {
        write!(out, "{:<24} ", "REPO")?;
    }
    writeln!(
        out,
        "{:<32} {:<24} {:<24} {:>8} {:>6} {:<12} COMMAND",
        "SESSION", "START", "END", "DURATION", "EXIT", "AGENT"
    )?;
    for r in rows {
        if show_repo {
            write!(out, "{:<24} ", escape_for_terminal(&r.log_dir))?;
        }
        let exit = match (r.exit_status, &r.end, &r.end_reason) {
            (Some(code), _, _) => code.to_string(),
            (None, Some(_), Some(reason)) => reason.clone(),
            (None, Some(_), None) => "-".into(),
            // No end record: still running, or its daemon died before writing one.
            (None, None, _) => "open".into(),
        };
        let command = r.command.iter().map(|a| escape_for_terminal(a)).collect::<Vec<_>>();
        writeln!(
            out,
            "{:<32} {:<24} {:<24} {:>8} {:>6} {:<12} {}",
            escape_for_terminal(&r.session),
            escape_for_terminal(r.start.as_deref().unwrap_or("-")),
            escape_for_terminal(r.end.as_deref().unwrap_or("-")),
            r.duration_ms.map(human_ms).unwrap_or_else(|| "-".into()),
            escape_for_terminal(&exit),
            escape_for_terminal(r.agent.as_deref().unwrap_or("-")),
            command.join(" ")
        )?;
    }
    out.flush()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn start_and_end_records_join_by_session() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        std::fs::write(
            d.join("sessions-2026-07-24.jsonl"),
            concat!(
                r#"{"id":"a:start","kind":"start","ts":"2026-07-24T18:00:00.000Z","session":"a","repo":"r","repo_key":"r-01234567","repo_path":"/src/r","command":["claude","-p"],"agent":"claude"}"#,
                "\n",
                "not json\n",
                r#"{"id":"b:start","kind":"start","ts":"2026-07-24T19:00:00.000Z","session":"b","repo":"r","command":["sh"]}"#,
                "\n",
            ),
        )
        .unwrap();
        std::fs::write(
            d.join("sessions-2026-07-25.jsonl"),
            r#"{"id":"a:end","kind":"end","ts":"2026-07-25T00:01:01.500Z","session":"a","repo":"r","exit_status":3,"tunnels":2,"bytes_sent":5,"bytes_recv":6}"#,
        )
        .unwrap();
        std::fs::write(d.join("sessions-notes.txt"), "x").unwrap();
        let rows = read_sessions(&Source { label: "r".into(), dir: d.to_owned() }).unwrap();
        assert_eq!(rows.len(), 2);
        let a = &rows[0];
        assert_eq!(a.session, "a");
        assert_eq!(a.command, ["claude", "-p"]);
        assert_eq!(a.exit_status, Some(3));
        assert_eq!(a.duration_ms, Some((6 * 3600 + 61) * 1000 + 500));
        assert_eq!(a.repo_key.as_deref(), Some("r-01234567"));
        assert_eq!(rows[1].end, None);
        let mut buf = Vec::new();
        print_table(&mut buf, &rows, false).unwrap();
        let t = String::from_utf8(buf).unwrap();
        assert!(t.lines().nth(1).unwrap().contains("6h01m"), "{t}");
        assert!(t.lines().nth(2).unwrap().contains("open"), "{t}");
        assert_eq!(human_ms(61_000), "1m01s");
    }
}
