//! The in-flight journal `journal-<boot>.jsonl`: one open record per allowed attempt before
//! anything is forwarded, one close marker after its audit line is written. The live writer
//! holds `flock(LOCK_EX)` on it for its whole life (flock(2): the lock belongs to the open file
//! description, so it is released exactly when the writer dies, however it dies), which is how
//! a later writer tells a crashed writer's journal from a live one.
//!
//! Records (one JSON object per line, one `write(2)` each):
//! `{"journal":"open","id":"…","line":{…audit line at attempt start…}}` and
//! `{"journal":"close","id":"…"}`. Neither has a top-level `allowed` or `host`, so the product
//! page's `jq 'select(.allowed == false) | .host' *.jsonl` recipe never picks them up.
//!
//! This module owns the journal protocol: the record format, the file naming, which records
//! are still pending ([`pending_records`]) and the line a pending record becomes once its
//! writer is gone ([`interrupted`]). Settlement ([`super::settle`]), the reader and the writer
//! depend on it; it depends only on the file layer ([`super::files`]) and the line format.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::files::{for_each_line, write_once};
use super::format::{MAX_LINE, encode_json, fit_line};
use super::{AuditError, AuditLine};
use crate::policy::Reason;

/// Compact the journal (truncate to empty) once it is this large and nothing is in flight.
const COMPACT_AT: u64 = 1 << 20;

/// One journal line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "journal", rename_all = "lowercase")]
pub enum JournalRecord {
    /// An allowed attempt is in flight; `line` is what was known at its start.
    Open { id: String, line: Box<AuditLine> },
    /// The attempt's audit line has been written.
    Close { id: String },
}

/// `journal-<boot>.jsonl` in `dir`.
pub fn journal_path(dir: &Path, boot: &str) -> PathBuf {
    dir.join(format!("journal-{boot}.jsonl"))
}

/// The boot id of a journal file name, if it is one.
pub(crate) fn journal_boot(file_name: &str) -> Option<&str> {
    file_name.strip_prefix("journal-")?.strip_suffix(".jsonl").filter(|b| !b.is_empty())
}

#[derive(Debug)]
struct State {
    file: File,
    open: HashSet<String>,
    len: u64,
}

/// A live writer's journal, locked while this value exists. Dropping it with nothing in flight
/// deletes the file; with records still open it stays for settlement.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    compact_at: u64,
    state: Mutex<State>,
}

impl Journal {
    /// Creates and locks `journal-<boot>.jsonl` in `dir`. The file is made and locked under a
    /// temporary name and only then linked into place, so no settler can ever see it unlocked.
    pub fn create(dir: &Path, boot: &str) -> Result<Self, AuditError> {
        Self::create_with(dir, boot, COMPACT_AT)
    }

    pub(crate) fn create_with(dir: &Path, boot: &str, compact_at: u64) -> Result<Self, AuditError> {
        let path = journal_path(dir, boot);
        let err = |source| AuditError::Journal { path: path.clone(), source };
        let tmp = dir.join(format!(".journal-{boot}.{}.tmp", super::new_id()));
        let file = OpenOptions::new()
            .append(true)
            .read(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(err)?;
        let linked = file.lock().and_then(|()| std::fs::hard_link(&tmp, &path)).map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                io::Error::new(
                    e.kind(),
                    "a live writer with this boot id already journals in this directory",
                )
            } else {
                e
            }
        });
        // The temporary name goes whatever happened; a leftover is removed by settlement.
        let _ = std::fs::remove_file(&tmp);
        linked.map_err(err)?;
        Ok(Self {
            path,
            compact_at,
            state: Mutex::new(State { file, open: HashSet::new(), len: 0 }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many attempts are in flight.
    pub fn in_flight(&self) -> usize {
        self.lock().open.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Poisoning means a panic elsewhere between statements that keep State consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self, state: &mut State, record: &JournalRecord, id: &str) -> Result<(), AuditError> {
        let bytes = encode_json(record, MAX_LINE + 256, id)?;
        write_once(&state.file, &bytes)
            .map_err(|source| AuditError::Journal { path: self.path.clone(), source })?;
        state.len += bytes.len() as u64;
        Ok(())
    }

    /// Appends the open record for `line` (capped like an audit line).
    pub fn open(&self, line: &AuditLine) -> Result<(), AuditError> {
        let record = JournalRecord::Open {
            id: line.id.clone(),
            line: Box::new(fit_line(line).into_owned()),
        };
        let mut state = self.lock();
        self.write(&mut state, &record, &line.id)?;
        state.open.insert(line.id.clone());
        Ok(())
    }

    /// Appends the close marker for `id`; compacts the file when nothing is in flight.
    pub fn close(&self, id: &str) -> Result<(), AuditError> {
        let mut state = self.lock();
        self.write(&mut state, &JournalRecord::Close { id: id.to_owned() }, id)?;
        state.open.remove(id);
        if state.open.is_empty() && state.len >= self.compact_at {
            // Nothing is in flight, so nothing is lost if we crash mid-way; O_APPEND writes
            // continue at the new end (0).
            state
                .file
                .set_len(0)
                .map_err(|source| AuditError::Journal { path: self.path.clone(), source })?;
            state.len = 0;
        }
        Ok(())
    }
}

impl Journal {
    /// Retires the journal of a writer that is stopping while attempts are still open (a
    /// tunnel task that never closed): with the journal's state locked and attempts still
    /// open, `settle` gets its path and a fresh read handle (the caller settles them as
    /// interrupted, under our own flock, instead of leaving them for the next writer); then
    /// nothing counts as open any more and dropping the journal deletes nothing twice.
    pub(crate) fn retire_with(
        &self,
        settle: impl FnOnce(&Path, &File) -> Result<(), AuditError>,
    ) -> Result<(), AuditError> {
        let mut state = self.lock();
        if !state.open.is_empty() {
            let reader = File::open(&self.path)
                .map_err(|source| AuditError::Journal { path: self.path.clone(), source })?;
            settle(&self.path, &reader)?;
            state.open.clear();
        }
        Ok(())
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        let state = self.lock();
        if state.open.is_empty() {
            // Still locked here, so no settler is reading it; nothing to settle. (Already
            // gone after `retire`.)
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Open records without a close marker, in journal order, and the number of bad lines.
pub(crate) fn pending_records(
    file: &File,
    path: &Path,
) -> Result<(Vec<AuditLine>, usize), AuditError> {
    let mut open: Vec<AuditLine> = Vec::new();
    let mut closed: HashSet<String> = HashSet::new();
    let mut bad = 0;
    for_each_line(file, path, |buf| {
        if buf.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match serde_json::from_slice::<JournalRecord>(buf) {
            Ok(JournalRecord::Open { id, mut line }) => {
                line.id = id;
                open.push(*line);
            }
            Ok(JournalRecord::Close { id }) => {
                closed.insert(id);
            }
            Err(e) => {
                bad += 1;
                tracing::warn!(journal = %path.display(), error = %e, "skipping a bad journal line");
            }
        }
    })?;
    let mut seen = HashSet::new();
    open.retain(|l| !closed.contains(&l.id) && seen.insert(l.id.clone()));
    Ok((open, bad))
}

/// The line a settled record becomes: what was known at the start, marked interrupted.
pub(crate) fn interrupted(mut line: AuditLine) -> AuditLine {
    line.allowed = true;
    line.reason = Some(Reason::Interrupted);
    line.interrupted = Some(true);
    line
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::audit::format::tests::sample;
    use std::fs::TryLockError;

    fn records(path: &Path) -> Vec<JournalRecord> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn journal_is_locked_while_alive_and_removed_when_idle() {
        let tmp = tempfile::tempdir().unwrap();
        let j = Journal::create(tmp.path(), "b1").unwrap();
        let other = File::open(j.path()).unwrap();
        assert!(matches!(other.try_lock(), Err(TryLockError::WouldBlock)));
        // No stray temporary file.
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["journal-b1.jsonl".to_owned()]);
        // Same boot id twice in one directory is refused.
        assert!(Journal::create(tmp.path(), "b1").is_err());
        let path = j.path().to_owned();
        drop(j);
        assert!(!path.exists());
        // Released with the descriptor. Another test thread's fork (any process spawn) can hold
        // a copy of it until that child execs, so wait (bounded) for the lock instead of
        // expecting it on the first try.
        let released = (0..500).any(|_| {
            other.try_lock().is_ok() || {
                std::thread::sleep(std::time::Duration::from_millis(10));
                false
            }
        });
        assert!(released, "the journal's lock outlived the writer");
    }

    #[test]
    fn open_and_close_records_and_dropping_with_open_records_keeps_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let j = Journal::create(tmp.path(), "b1").unwrap();
        let mut a = sample();
        a.id = "a".into();
        let mut b = sample();
        b.id = "b".into();
        j.open(&a).unwrap();
        j.open(&b).unwrap();
        j.close("a").unwrap();
        assert_eq!(j.in_flight(), 1);
        let path = j.path().to_owned();
        assert_eq!(
            records(&path),
            vec![
                JournalRecord::Open { id: "a".into(), line: Box::new(a) },
                JournalRecord::Open { id: "b".into(), line: Box::new(b) },
                JournalRecord::Close { id: "a".into() },
            ]
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(r#"{"journal":"open","id":"a","line":{"ts":"#), "{text}");
        drop(j);
        assert!(path.exists(), "a journal with an open record must survive its writer");
    }

    #[test]
    fn compaction_happens_only_when_nothing_is_in_flight() {
        let tmp = tempfile::tempdir().unwrap();
        let j = Journal::create_with(tmp.path(), "b1", 1).unwrap();
        let mut a = sample();
        a.id = "a".into();
        let mut b = sample();
        b.id = "b".into();
        j.open(&a).unwrap();
        j.open(&b).unwrap();
        j.close("a").unwrap();
        // b still open: nothing compacted.
        assert_eq!(records(j.path()).len(), 3);
        j.close("b").unwrap();
        assert_eq!(std::fs::metadata(j.path()).unwrap().len(), 0);
        // Appends continue at the start of the compacted file.
        j.open(&a).unwrap();
        assert_eq!(
            records(j.path()),
            vec![JournalRecord::Open { id: "a".into(), line: Box::new(a) }]
        );
    }

    #[test]
    fn journal_names() {
        assert_eq!(journal_boot("journal-abc.jsonl"), Some("abc"));
        assert_eq!(journal_boot("journal-.jsonl"), None);
        assert_eq!(journal_boot("audit-2026-01-01.jsonl"), None);
    }
}
