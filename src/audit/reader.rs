//! Reading a repo's logs back: every `audit-<date>.jsonl` in date order, line by line, with
//! bad lines reported (never fatal, never hiding the rest), plus journal records no audit line
//! has settled yet (in flight, or left by a writer that died and not settled so far). The same
//! [`Follower`] serves `airlock logs` and `airlock logs --follow` (new lines, new date files).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::files::audit_files;
use super::journal::{journal_boot, pending_records};
use super::{AuditError, AuditLine};

/// One item read from a log directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// An audit line; `raw` is the line as written (without its newline).
    Line { file: PathBuf, lineno: usize, raw: String, line: AuditLine },
    /// An open journal record with no audit line yet: in flight, or interrupted and not yet
    /// settled (a reader cannot tell which without taking the writer's lock, and never does).
    InFlight { journal: PathBuf, line: AuditLine },
    /// A line that is not an audit line (a fragment, hand edits, another format).
    Bad { file: PathBuf, lineno: usize, raw: String, error: String },
}

/// Everything in `dir` at once: audit lines (oldest file first), bad lines, then unsettled
/// journal records.
pub fn read_dir(dir: &Path) -> Result<Vec<Entry>, AuditError> {
    let mut out = Vec::new();
    let mut follower = Follower::new(dir);
    follower.poll(true, &mut |e| {
        out.push(e);
        true
    })?;
    Ok(out)
}

#[derive(Debug, Default)]
struct Cursor {
    offset: u64,
    lineno: usize,
    /// Bytes after the last newline, held back until the line completes.
    partial: Vec<u8>,
}

/// Incremental reader of one log directory.
#[derive(Debug)]
pub struct Follower {
    dir: PathBuf,
    cursors: HashMap<PathBuf, Cursor>,
    first: bool,
    since_date: Option<String>,
}

impl Follower {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), cursors: HashMap::new(), first: true, since_date: None }
    }

    /// Skips audit files dated before `date` (`YYYY-MM-DD`): a line is written on or after its
    /// attempt's start, so such files hold only older attempts. Journal records are still read.
    pub fn skip_files_before(mut self, date: &str) -> Self {
        self.since_date = Some(date.to_owned());
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Hands every entry not seen before to `sink`, oldest file first; stops early when `sink`
    /// returns false. The first call also reports unsettled journal records (after the audit
    /// lines). With `last`, a trailing line without its newline is reported as bad instead of
    /// being held back for the next poll.
    pub fn poll(
        &mut self,
        last: bool,
        sink: &mut dyn FnMut(Entry) -> bool,
    ) -> Result<(), AuditError> {
        let pending = if self.first { self.journal_records()? } else { Vec::new() };
        self.first = false;
        // Ids of in-flight records not yet seen as audit lines (there can be thousands of open
        // tunnels and millions of lines: a set, not a scan).
        let mut unseen: HashSet<String> = pending.iter().map(|(_, l)| l.id.clone()).collect();
        for (date, path) in audit_files(&self.dir)? {
            if self.since_date.as_deref().is_some_and(|s| date.as_str() < s) {
                continue;
            }
            let cursor = self.cursors.entry(path.clone()).or_default();
            if !read_new(&path, cursor, last, &mut |e| {
                if let Entry::Line { line, .. } = &e
                    && !unseen.is_empty()
                {
                    unseen.remove(&line.id);
                }
                sink(e)
            })? {
                return Ok(());
            }
        }
        for (journal, line) in pending {
            if unseen.contains(&line.id) && !sink(Entry::InFlight { journal, line }) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Open records without a close marker in every journal of the directory, read without
    /// locking (a reader must never make a settler skip a journal).
    fn journal_records(&self) -> Result<Vec<(PathBuf, AuditLine)>, AuditError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(AuditError::Read { path: self.dir.clone(), source }),
        };
        let mut journals: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_str().and_then(journal_boot).is_some())
            .map(|e| e.path())
            .collect();
        journals.sort();
        let mut out = Vec::new();
        for path in journals {
            // A journal may be settled and deleted while we list: that is fine.
            let Ok(file) = File::open(&path) else { continue };
            let (open, _bad) = pending_records(&file, &path)?;
            out.extend(open.into_iter().map(|l| (path.clone(), l)));
        }
        Ok(out)
    }
}

/// Reads `path` from the cursor to EOF, handing each complete line to `sink`. Returns false if
/// the sink asked to stop.
fn read_new(
    path: &Path,
    cursor: &mut Cursor,
    last: bool,
    sink: &mut dyn FnMut(Entry) -> bool,
) -> Result<bool, AuditError> {
    let err = |source| AuditError::Read { path: path.to_owned(), source };
    // Unchanged files (every older date, when following) cost one stat, not an open.
    match std::fs::metadata(path) {
        Ok(m) if m.len() == cursor.offset && (!last || cursor.partial.is_empty()) => {
            return Ok(true);
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(err(e)),
    }
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(err(e)),
    };
    let len = file.metadata().map_err(err)?.len();
    if len < cursor.offset {
        // Truncated or replaced: start over.
        *cursor = Cursor::default();
    }
    file.seek(SeekFrom::Start(cursor.offset)).map_err(err)?;
    let mut buf = std::mem::take(&mut cursor.partial);
    let start = buf.len();
    file.take(len - cursor.offset).read_to_end(&mut buf).map_err(err)?;
    cursor.offset += (buf.len() - start) as u64;

    let mut rest: &[u8] = &buf;
    while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
        let (line, tail) = rest.split_at(nl);
        rest = &tail[1..];
        cursor.lineno += 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if !sink(parse(path, cursor.lineno, line)) {
            return Ok(false);
        }
    }
    if last && !rest.is_empty() {
        cursor.lineno += 1;
        let e = parse(path, cursor.lineno, rest);
        let e = match e {
            Entry::Line { .. } => e,
            Entry::Bad { file, lineno, raw, error } => {
                Entry::Bad { file, lineno, raw, error: format!("{error} (no final newline)") }
            }
            other => other,
        };
        return Ok(sink(e));
    }
    cursor.partial = rest.to_vec();
    Ok(true)
}

fn parse(path: &Path, lineno: usize, bytes: &[u8]) -> Entry {
    let raw = String::from_utf8_lossy(bytes).into_owned();
    match serde_json::from_slice::<AuditLine>(bytes) {
        Ok(line) => Entry::Line { file: path.to_owned(), lineno, raw, line },
        Err(e) => Entry::Bad { file: path.to_owned(), lineno, raw, error: e.to_string() },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::audit::files::audit_date;
    use crate::audit::writer::tests::info;
    use crate::audit::{AuditSink, RepoLog};
    use std::io::Write;

    fn append(path: &Path, bytes: &[u8]) {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        f.write_all(bytes).unwrap();
    }

    #[test]
    fn reads_lines_in_date_order_reports_bad_ones_and_keeps_going() {
        let tmp = tempfile::tempdir().unwrap();
        let log = RepoLog::open(tmp.path(), "b").unwrap();
        let sink = log.session_sink(info());
        let a = sink.line("a.test", Some(443), "CONNECT");
        let b = sink.line("b.test", Some(443), "CONNECT");
        let enc = |l: &AuditLine| crate::audit::encode_line(l).unwrap();
        append(&tmp.path().join("audit-2026-01-02.jsonl"), &enc(&b));
        append(&tmp.path().join("audit-2026-01-01.jsonl"), &enc(&a));
        append(&tmp.path().join("audit-2026-01-01.jsonl"), b"{\"trunc\n\n");
        append(&tmp.path().join("audit-2026-01-01.jsonl"), &enc(&a));
        append(&tmp.path().join("audit-junk.jsonl"), b"ignored\n");
        let entries = read_dir(tmp.path()).unwrap();
        let kinds: Vec<String> = entries
            .iter()
            .map(|e| match e {
                Entry::Line { line, lineno, .. } => format!("{}:{lineno}", line.host),
                Entry::Bad { lineno, .. } => format!("bad:{lineno}"),
                Entry::InFlight { .. } => "inflight".into(),
            })
            .collect();
        assert_eq!(kinds, ["a.test:1", "bad:2", "a.test:4", "b.test:1"]);
        if let Entry::Line { raw, .. } = &entries[0] {
            assert_eq!(format!("{raw}\n").as_bytes(), enc(&a).as_slice());
        }
    }

    #[test]
    fn unsettled_journal_records_show_as_in_flight_until_their_line_exists() {
        let tmp = tempfile::tempdir().unwrap();
        let log = RepoLog::open(tmp.path(), "b").unwrap();
        let sink = log.session_sink(info());
        let mut open = sink.line("open.test", Some(443), "CONNECT");
        open.allowed = true;
        sink.journal_open(&open).unwrap();
        let mut closing = sink.line("closing.test", Some(443), "CONNECT");
        closing.allowed = true;
        sink.journal_open(&closing).unwrap();
        // Audit line written but close marker not yet: shown once, as a line.
        sink.append(&closing).unwrap();
        let entries = read_dir(tmp.path()).unwrap();
        assert_eq!(entries.len(), 2, "{entries:?}");
        assert!(matches!(&entries[0], Entry::Line { line, .. } if line.id == closing.id));
        assert!(matches!(&entries[1], Entry::InFlight { line, .. } if *line == open));
    }

    #[test]
    fn follower_sees_appended_lines_new_date_files_and_holds_partial_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let log = RepoLog::open(tmp.path(), "b").unwrap();
        let sink = log.session_sink(info());
        let enc = |h: &str| crate::audit::encode_line(&sink.line(h, Some(443), "CONNECT")).unwrap();
        let day1 = tmp.path().join("audit-2026-01-01.jsonl");
        append(&day1, &enc("one.test"));
        let mut f = Follower::new(tmp.path());
        let mut hosts = Vec::new();
        let poll = |f: &mut Follower, last| {
            let mut got = Vec::new();
            f.poll(last, &mut |e| {
                got.push(match e {
                    Entry::Line { line, .. } => line.host,
                    other => format!("{other:?}"),
                });
                true
            })
            .unwrap();
            got
        };
        hosts.extend(poll(&mut f, false));
        assert_eq!(hosts, ["one.test"]);
        assert!(poll(&mut f, false).is_empty());
        let two = enc("two.test");
        append(&day1, &two[..10]);
        assert!(poll(&mut f, false).is_empty(), "a partial line is held back");
        append(&day1, &two[10..]);
        append(&tmp.path().join("audit-2026-01-02.jsonl"), &enc("three.test"));
        assert_eq!(poll(&mut f, false), ["two.test", "three.test"]);
        append(&tmp.path().join("audit-2026-01-02.jsonl"), b"{\"frag");
        let last = poll(&mut f, true);
        assert_eq!(last.len(), 1);
        assert!(last[0].contains("no final newline"), "{last:?}");
    }

    #[test]
    fn files_before_the_since_date_are_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        append(&tmp.path().join("audit-2026-01-01.jsonl"), b"old\n");
        append(&tmp.path().join("audit-2026-01-02.jsonl"), b"new\n");
        let mut f = Follower::new(tmp.path()).skip_files_before("2026-01-02");
        let mut raws = Vec::new();
        f.poll(true, &mut |e| {
            if let Entry::Bad { raw, .. } = e {
                raws.push(raw);
            }
            true
        })
        .unwrap();
        assert_eq!(raws, ["new"]);
    }

    #[test]
    fn audit_file_names_are_strict() {
        assert_eq!(audit_date("audit-2026-07-24.jsonl"), Some("2026-07-24"));
        assert_eq!(audit_date("audit-2026-7-24.jsonl"), None);
        assert_eq!(audit_date("sessions-2026-07-24.jsonl"), None);
        assert_eq!(audit_date("journal-x.jsonl"), None);
    }
}
