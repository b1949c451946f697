//! The "matches the session record" comparison of `GET /api/v1/sessions/{session}/transcripts`
//! (docs/api.md): for one user's Airlock session, each `transcript.file` item (what `airlock
//! publish` read of a transcript's prefix) against the entry for the same file in the
//! session's end record (what the session hashed at its end). Pure: the stores read the rows
//! ([`super::store::Store::session_transcript_items`]), this decides, so both stores answer
//! alike. Never a reassembly of deduplicated lines: only the two `{bytes, sha256}` compare.

use super::format_micros;
use super::store::SessionTranscriptItems;
use serde::Serialize;
use std::collections::BTreeMap;

/// Files in one answer at most; more set `truncated`.
pub const MAX_FILES: usize = 10_000;

/// How a published file compares with the session record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Same `sha256` and `bytes` (`bytes` is not compared when the record predates it).
    Matches,
    Differs,
    /// No end record yet, or it does not list the file.
    NoRecord,
    /// The record lists the file, no `transcript.file` item was received for it.
    NotPublished,
}

/// What the end record says of a file. `bytes` is `null` for records written before it existed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recorded {
    pub bytes: Option<u64>,
    pub sha256: String,
}

/// What the latest `transcript.file` item for a file says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Published {
    pub bytes: u64,
    pub sha256: String,
    pub received_at: String,
}

/// One file of the answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileReport {
    pub file: String,
    pub recorded: Option<Recorded>,
    pub published: Option<Published>,
    pub state: State,
    /// Transcript lines stored with this session and file (filled by the caller).
    pub lines: i64,
}

/// The answer (before `lines` are counted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub session: String,
    pub user_id: String,
    pub transcripts: Vec<FileReport>,
    /// More than [`MAX_FILES`] files: the first ones in byte order of `file` are listed.
    pub truncated: bool,
}

/// One `transcripts[]` entry of an end record.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    path: String,
    file: Option<String>,
    bytes: Option<u64>,
    sha256: String,
}

/// The `transcripts[]` entries of an end record's payload text (entries that are not
/// `{path, sha256, …}` objects are skipped: the record is the client's, stored verbatim).
fn entries(end_record: &str) -> Vec<Entry> {
    let Ok(v) = super::ingest::payload_value(end_record) else { return Vec::new() };
    let Some(list) = v.get("transcripts").and_then(|t| t.as_array()) else { return Vec::new() };
    list.iter()
        .filter_map(|t| {
            Some(Entry {
                path: t.get("path")?.as_str()?.to_string(),
                file: t
                    .get("file")
                    .and_then(|f| f.as_str())
                    .filter(|f| !f.is_empty())
                    .map(Into::into),
                bytes: t.get("bytes").and_then(|b| b.as_u64()),
                sha256: t.get("sha256")?.as_str()?.to_string(),
            })
        })
        .collect()
}

/// `(bytes, sha256)` of a `transcript.file` payload (checked at ingest; `None` if not).
fn published_digest(payload: &str) -> Option<(u64, String)> {
    let v = super::ingest::payload_value(payload).ok()?;
    Some((v.get("bytes")?.as_u64()?, v.get("sha256")?.as_str()?.to_string()))
}

/// Compares `items` for `user_id`'s `session`. An end-record entry names its file by `file`;
/// one without (older records) is the entry whose host `path` ends in `/<file>`, and when no
/// item matches it, it is listed under its `path`.
pub fn compare(user_id: &str, session: &str, items: &SessionTranscriptItems) -> Report {
    let entries = items.end_record.as_deref().map(entries).unwrap_or_default();
    let mut files: BTreeMap<String, FileReport> = BTreeMap::new();
    let mut used = vec![false; entries.len()];
    for p in &items.published {
        let Some((bytes, sha256)) = published_digest(&p.payload) else { continue };
        let found =
            entries.iter().position(|e| e.file.as_deref() == Some(p.file.as_str())).or_else(|| {
                let suffix = format!("/{}", p.file);
                entries.iter().position(|e| e.file.is_none() && e.path.ends_with(&suffix))
            });
        let recorded = found.map(|i| {
            used[i] = true;
            Recorded { bytes: entries[i].bytes, sha256: entries[i].sha256.clone() }
        });
        let state = match &recorded {
            None => State::NoRecord,
            Some(r) if r.sha256 == sha256 && r.bytes.is_none_or(|b| b == bytes) => State::Matches,
            Some(_) => State::Differs,
        };
        let published = Published { bytes, sha256, received_at: format_micros(p.received_at) };
        files.insert(
            p.file.clone(),
            FileReport {
                file: p.file.clone(),
                recorded,
                published: Some(published),
                state,
                lines: 0,
            },
        );
    }
    for (e, _) in entries.iter().zip(&used).filter(|(_, used)| !**used) {
        let file = e.file.clone().unwrap_or_else(|| e.path.clone());
        files.entry(file.clone()).or_insert(FileReport {
            file,
            recorded: Some(Recorded { bytes: e.bytes, sha256: e.sha256.clone() }),
            published: None,
            state: State::NotPublished,
            lines: 0,
        });
    }
    // BTreeMap<String> iterates in byte order, the order the stores read items in.
    let truncated = files.len() > MAX_FILES;
    let transcripts: Vec<FileReport> = files.into_values().take(MAX_FILES).collect();
    Report { session: session.into(), user_id: user_id.into(), transcripts, truncated }
}

/// Sets each file's `lines` from the stores' counts.
pub fn with_lines(mut report: Report, counts: &[(String, i64)]) -> Report {
    let counts: BTreeMap<&str, i64> = counts.iter().map(|(f, n)| (f.as_str(), *n)).collect();
    for f in &mut report.transcripts {
        f.lines = counts.get(f.file.as_str()).copied().unwrap_or(0);
    }
    report
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::review::store::PublishedFile;

    const A: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn item(file: &str, bytes: u64, sha: &str) -> PublishedFile {
        PublishedFile {
            file: file.into(),
            payload:
                serde_json::json!({"airlock_session":"s","file":file,"bytes":bytes,"sha256":sha})
                    .to_string(),
            received_at: 1_772_615_600_000_000,
        }
    }

    #[test]
    fn the_four_states() {
        let end = serde_json::json!({"transcripts": [
            {"path": "/h/.claude/projects/p/same.jsonl", "file": ".claude/projects/p/same.jsonl", "bytes": 10, "sha256": A},
            {"path": "/h/.claude/projects/p/changed.jsonl", "file": ".claude/projects/p/changed.jsonl", "bytes": 10, "sha256": A},
            {"path": "/h/.claude/projects/p/longer.jsonl", "file": ".claude/projects/p/longer.jsonl", "bytes": 10, "sha256": A},
            {"path": "/h/.claude/projects/p/missing.jsonl", "file": ".claude/projects/p/missing.jsonl", "bytes": 3, "sha256": B},
            {"path": "/h/.codex/sessions/old.jsonl", "sha256": B},
            {"path": "/h/.codex/sessions/gone.jsonl", "sha256": B},
        ]});
        let items = SessionTranscriptItems {
            end_record: Some(end.to_string()),
            published: vec![
                item(".claude/projects/p/changed.jsonl", 10, B),
                item(".claude/projects/p/extra.jsonl", 4, A),
                item(".claude/projects/p/longer.jsonl", 11, A),
                item(".claude/projects/p/same.jsonl", 10, A),
                item(".codex/sessions/old.jsonl", 99, B),
            ],
        };
        let r = compare("u", "s", &items);
        let got: Vec<(&str, State)> =
            r.transcripts.iter().map(|f| (f.file.as_str(), f.state)).collect();
        assert_eq!(
            got,
            vec![
                (".claude/projects/p/changed.jsonl", State::Differs),
                (".claude/projects/p/extra.jsonl", State::NoRecord),
                (".claude/projects/p/longer.jsonl", State::Differs),
                (".claude/projects/p/missing.jsonl", State::NotPublished),
                (".claude/projects/p/same.jsonl", State::Matches),
                // An old record's entry (no `file`, no `bytes`) matched by path suffix.
                (".codex/sessions/old.jsonl", State::Matches),
                ("/h/.codex/sessions/gone.jsonl", State::NotPublished),
            ]
        );
        assert!(!r.truncated);
        let no_end = compare("u", "s", &SessionTranscriptItems { end_record: None, ..items });
        assert!(no_end.transcripts.iter().all(|f| f.state == State::NoRecord));
        assert_eq!(no_end.transcripts.len(), 5);
    }

    #[test]
    fn bounded_with_truncated() {
        let published: Vec<PublishedFile> =
            (0..=MAX_FILES).map(|i| item(&format!("f{i:06}"), 1, A)).collect();
        let r = compare("u", "s", &SessionTranscriptItems { end_record: None, published });
        assert_eq!(r.transcripts.len(), MAX_FILES);
        assert!(r.truncated);
        let r = with_lines(r, &[("f000001".into(), 7)]);
        assert_eq!((r.transcripts[0].lines, r.transcripts[1].lines), (0, 7));
    }
}
