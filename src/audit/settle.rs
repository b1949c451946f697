//! Settlement: turning a dead writer's in-flight journal records into audit lines.
//!
//! A journal whose `flock` can be taken without blocking has no live writer. For each open
//! record without a close marker, its line is appended to today's audit file with
//! `"interrupted": true` and `reason: "interrupted"` — unless a line with that `id` is already
//! in the audit files (the writer died after its audit write but before its close marker, or
//! an earlier settlement died before deleting the journal). Then the audit file is synced and
//! the journal deleted, still under the lock. Running it twice, or concurrently from two
//! processes, writes each id at most once.

use std::collections::HashSet;
use std::fs::{File, TryLockError};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::Deserialize;

use super::files::{JsonlAppender, audit_files, for_each_line};
use super::format::encode_line;
use super::journal::{interrupted, journal_boot, pending_records};
use super::{AuditError, AuditLine};

/// What one settlement run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettleReport {
    /// Journals of dead writers that were settled and deleted.
    pub journals_settled: usize,
    /// Interrupted lines appended.
    pub lines_written: usize,
    /// Open records whose id was already in the audit files (not written again).
    pub already_present: usize,
    /// Journals left alone because a live writer holds them.
    pub busy: usize,
    /// Journal lines that could not be parsed (skipped; the rest of the journal still counts).
    pub bad_records: usize,
    /// Journals that could not be read (left for a later settlement).
    pub unreadable: usize,
}

impl SettleReport {
    pub(crate) fn add(&mut self, other: &SettleReport) {
        self.journals_settled += other.journals_settled;
        self.lines_written += other.lines_written;
        self.already_present += other.already_present;
        self.busy += other.busy;
        self.bad_records += other.bad_records;
        self.unreadable += other.unreadable;
    }
}

/// Settles every `journal-*.jsonl` in `dir` that no live writer holds. Journals held by a live
/// writer (including the caller's own) are counted as `busy` and left alone.
pub fn settle_journals(dir: &Path) -> Result<SettleReport, AuditError> {
    let mut report = SettleReport::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(report),
        Err(source) => return Err(AuditError::Read { path: dir.to_owned(), source }),
    };
    let mut journals = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if journal_boot(name).is_some() {
            journals.push(entry.path());
        } else if name.starts_with(".journal-") && name.ends_with(".tmp") {
            remove_stale_tmp(&entry.path());
        }
    }
    if journals.is_empty() {
        return Ok(report);
    }
    journals.sort();
    // Opens no file until a line is written.
    let audit = JsonlAppender::new(dir, "audit")?;
    for path in journals {
        match settle_one(dir, &path, &audit, &mut report) {
            Ok(()) => {}
            // One unreadable journal (or audit file) must not stop the others, nor a new writer
            // from starting; it stays for a later settlement.
            Err(e @ AuditError::Read { .. }) => {
                tracing::warn!(error = %e, "cannot settle journal {}", path.display());
                report.unreadable += 1;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(report)
}

/// Waits until no process holds `journal`'s lock. A test on another thread that forks while a
/// writer's journal is open gives the child a copy of the descriptor, and with it the flock(2)
/// lock (locks belong to the open file description), until the child execs and its
/// close-on-exec descriptors go; a settlement in that window rightly reports the journal busy.
#[cfg(test)]
pub(crate) fn wait_until_unlocked(journal: &Path) {
    let file = File::open(journal).expect("open the journal");
    for _ in 0..500 {
        if file.try_lock().is_ok() {
            return; // dropping `file` releases the probe's own lock
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("{} stayed locked with its writer gone", journal.display());
}

/// Settles every repo directory under `logs_root` (`~/.airlock/logs/`), e.g. at daemon start.
pub fn settle_all(logs_root: &Path) -> Result<SettleReport, AuditError> {
    let mut report = SettleReport::default();
    let entries = match std::fs::read_dir(logs_root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(report),
        Err(source) => return Err(AuditError::Read { path: logs_root.to_owned(), source }),
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            report.add(&settle_journals(&entry.path())?);
        }
    }
    Ok(report)
}

/// A `.journal-*.tmp` left by a writer that died while creating its journal: removed if no
/// one holds it (a live one is linked to a locked journal, and flock follows the inode).
fn remove_stale_tmp(path: &Path) {
    if let Ok(f) = File::open(path)
        && f.try_lock().is_ok()
    {
        let _ = std::fs::remove_file(path);
    }
}

fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

fn settle_one(
    dir: &Path,
    path: &Path,
    audit: &JsonlAppender,
    report: &mut SettleReport,
) -> Result<(), AuditError> {
    let read_err = |source| AuditError::Read { path: path.to_owned(), source };
    let file = match File::open(path) {
        Ok(f) => f,
        // Settled and deleted by someone else since we listed the directory.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(read_err(e)),
    };
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            report.busy += 1;
            return Ok(());
        }
        Err(TryLockError::Error(e)) => return Err(read_err(e)),
    }
    // Another settler may have finished and unlinked this file between our open and our
    // lock: only settle the file that is still at `path`.
    let ours = file.metadata().map_err(read_err)?;
    match std::fs::symlink_metadata(path) {
        Ok(now) if same_file(&ours, &now) => {}
        _ => return Ok(()),
    }

    settle_locked(dir, path, &file, audit, report)
}

/// Settles the journal at `path`, whose lock the caller holds, reading it through `file`:
/// writes the interrupted lines not yet in the audit files, syncs, deletes the journal.
pub(crate) fn settle_locked(
    dir: &Path,
    path: &Path,
    file: &File,
    audit: &JsonlAppender,
    report: &mut SettleReport,
) -> Result<(), AuditError> {
    let (pending, bad) = pending_records(file, path)?;
    report.bad_records += bad;
    if !pending.is_empty() {
        let present = ids_in_audit_files(dir, &pending)?;
        for line in pending {
            if present.contains(&line.id) {
                report.already_present += 1;
                continue;
            }
            audit.append_encoded(&encode_line(&interrupted(line))?)?;
            report.lines_written += 1;
        }
        // The lines must be durable before the journal that vouches for them disappears.
        audit.sync()?;
    }
    std::fs::remove_file(path)
        .map_err(|source| AuditError::Journal { path: path.to_owned(), source })?;
    report.journals_settled += 1;
    Ok(())
}

/// Which of `pending`'s ids already appear in the audit files that could hold them: those
/// dated from the day before the earliest attempt start onwards (an attempt's line is written
/// at or after its start; one day of slack covers a clock stepped back).
fn ids_in_audit_files(dir: &Path, pending: &[AuditLine]) -> Result<HashSet<String>, AuditError> {
    #[derive(Deserialize)]
    struct IdOnly {
        id: Option<String>,
    }
    let wanted: HashSet<&str> = pending.iter().map(|l| l.id.as_str()).collect();
    let earliest = pending.iter().filter_map(|l| l.ts.get(..10)).min().map(day_before);
    let mut found = HashSet::new();
    for (date, path) in audit_files(dir)? {
        if earliest.as_deref().is_some_and(|e| date.as_str() < e) {
            continue;
        }
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(AuditError::Read { path, source }),
        };
        for_each_line(file, &path, |buf| {
            if let Ok(IdOnly { id: Some(id) }) = serde_json::from_slice(buf)
                && wanted.contains(id.as_str())
            {
                found.insert(id);
            }
        })?;
    }
    Ok(found)
}

/// `YYYY-MM-DD` of the day before `date` (or `date` itself if it does not parse, which only
/// widens the search).
pub(super) fn day_before(date: &str) -> String {
    let fmt = time::macros::format_description!("[year]-[month]-[day]");
    time::Date::parse(date, fmt)
        .ok()
        .and_then(|d| d.previous_day())
        .and_then(|d| d.format(fmt).ok())
        .unwrap_or_else(|| "0000-00-00".to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::audit::writer::tests::{BEFORE_MIDNIGHT, TestClock, info, lines};
    use crate::audit::{AuditSink, RepoLog, utc_date};
    use crate::policy::Reason;
    use std::io::Write;
    use std::time::SystemTime;

    fn today(dir: &Path) -> std::path::PathBuf {
        dir.join(format!("audit-{}.jsonl", utc_date(SystemTime::now())))
    }

    /// Leaves a journal as a crashed writer would: `open` records, some closed, lock released.
    /// Settles `dir` as a settle after a crash would: a dead writer's lock is released with
    /// its descriptor, but another test thread's process spawn can hold a copy of any open
    /// descriptor (the journal's, or a settler's own) until that child execs, and settle then
    /// rightly sees a live writer and skips it. Retries (bounded) until nothing is busy; the
    /// reports of every try add up.
    fn settle_dead(dir: &Path) -> SettleReport {
        retry_busy(|| settle_journals(dir).unwrap())
    }

    /// [`settle_dead`] for [`settle_all`].
    fn settle_all_dead(root: &Path) -> SettleReport {
        retry_busy(|| settle_all(root).unwrap())
    }

    fn retry_busy(mut settle: impl FnMut() -> SettleReport) -> SettleReport {
        let mut total = SettleReport::default();
        for _ in 0..500 {
            let report = settle();
            let busy = report.busy;
            total.add(&report);
            if busy == 0 {
                total.busy = 0;
                return total;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("a dead writer's journal stayed locked: {total:?}");
    }

    fn crashed_writer(dir: &Path, boot: &str) -> (AuditLine, AuditLine) {
        let log = RepoLog::open(dir, boot).unwrap();
        let sink = log.session_sink(info());
        let mut done = sink.line("done.test", Some(443), "CONNECT");
        done.allowed = true;
        sink.journal_open(&done).unwrap();
        done.bytes_sent = Some(10);
        sink.journal_close(&done).unwrap();
        let mut open = sink.line("open.test", Some(443), "CONNECT");
        open.allowed = true;
        open.reason = Some(Reason::Allowed);
        sink.journal_open(&open).unwrap();
        log.simulate_crash();
        drop(sink);
        drop(log); // lock released, record still open: the file stays
        let journal = dir.join(format!("journal-{boot}.jsonl"));
        assert!(journal.exists());
        wait_until_unlocked(&journal);
        (done, open)
    }

    #[test]
    fn dead_writers_open_records_become_interrupted_lines_once() {
        let tmp = tempfile::tempdir().unwrap();
        let (done, open) = crashed_writer(tmp.path(), "dead");
        let report = settle_dead(tmp.path());
        assert_eq!((report.journals_settled, report.lines_written), (1, 1));
        assert!(!tmp.path().join("journal-dead.jsonl").exists());
        let got = lines(&today(tmp.path()));
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], done);
        let mut want = open;
        want.reason = Some(Reason::Interrupted);
        want.interrupted = Some(true);
        assert_eq!(got[1], want);
        // Again: nothing left to do.
        assert_eq!(settle_dead(tmp.path()), SettleReport::default());
        assert_eq!(lines(&today(tmp.path())).len(), 2);
    }

    #[test]
    fn crash_between_audit_write_and_journal_delete_does_not_double_write() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, open) = crashed_writer(tmp.path(), "dead");
        let journal = tmp.path().join("journal-dead.jsonl");
        let saved = std::fs::read(&journal).unwrap();
        settle_dead(tmp.path());
        // The settler "crashed" before deleting: the journal is back.
        std::fs::write(&journal, &saved).unwrap();
        let report = settle_dead(tmp.path());
        assert_eq!((report.lines_written, report.already_present), (0, 1));
        let n = lines(&today(tmp.path())).iter().filter(|l| l.id == open.id).count();
        assert_eq!(n, 1);
        assert!(!journal.exists());
    }

    #[test]
    fn writer_that_died_after_its_audit_line_but_before_the_close_marker() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, open) = crashed_writer(tmp.path(), "dead");
        // The audit line made it, the close marker did not.
        let mut closed = open.clone();
        closed.bytes_sent = Some(5);
        let audit = JsonlAppender::new(tmp.path(), "audit").unwrap();
        audit.append_encoded(&encode_line(&closed).unwrap()).unwrap();
        let report = settle_dead(tmp.path());
        assert_eq!((report.lines_written, report.already_present), (0, 1));
        let got = lines(&today(tmp.path()));
        assert_eq!(got.iter().filter(|l| l.id == open.id).count(), 1);
        assert!(got.iter().all(|l| l.interrupted.is_none()));
    }

    #[test]
    fn live_journals_are_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let log = RepoLog::open(tmp.path(), "live").unwrap();
        let sink = log.session_sink(info());
        let mut line = sink.line("a.test", Some(443), "CONNECT");
        line.allowed = true;
        sink.journal_open(&line).unwrap();
        let report = settle_journals(tmp.path()).unwrap();
        assert_eq!((report.busy, report.lines_written), (1, 0));
        assert!(log.journal().path().exists());
        // A second writer in the same directory settles nothing of the live one either.
        let other = RepoLog::open(tmp.path(), "other").unwrap();
        assert_eq!(other.settled().busy, 1);
        assert!(!today(tmp.path()).exists());
    }

    #[test]
    fn bad_journal_lines_are_skipped_not_fatal() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, open) = crashed_writer(tmp.path(), "dead");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(tmp.path().join("journal-dead.jsonl"))
            .unwrap();
        f.write_all(b"{not json\n\n{\"journal\":\"close\"}\n").unwrap();
        let report = settle_dead(tmp.path());
        assert_eq!((report.lines_written, report.bad_records), (1, 2));
        assert_eq!(lines(&today(tmp.path())).last().unwrap().id, open.id);
    }

    #[test]
    fn search_window_starts_the_day_before_the_earliest_attempt() {
        assert_eq!(day_before("2026-03-01"), "2026-02-28");
        assert_eq!(day_before("garbage"), "0000-00-00");
        // A line closed on the attempt's date (not today) is still found.
        let tmp = tempfile::tempdir().unwrap();
        let clock = TestClock::at(BEFORE_MIDNIGHT);
        let log = RepoLog::open_with_clock(tmp.path(), "dead", clock.clone()).unwrap();
        let sink = log.session_sink(info());
        let mut l = sink.line("x.test", Some(443), "CONNECT");
        l.allowed = true;
        sink.journal_open(&l).unwrap();
        sink.append(&l).unwrap(); // audit line written, then "crash" before the close marker
        log.simulate_crash();
        drop(sink);
        drop(log);
        let report = settle_dead(tmp.path());
        assert_eq!((report.lines_written, report.already_present), (0, 1));
    }

    #[test]
    fn settle_all_walks_every_repo_and_tolerates_missing_root() {
        let tmp = tempfile::tempdir().unwrap();
        crashed_writer(&tmp.path().join("r1"), "d1");
        crashed_writer(&tmp.path().join("r2"), "d2");
        let report = settle_all_dead(tmp.path());
        assert_eq!((report.journals_settled, report.lines_written), (2, 2));
        assert_eq!(settle_all_dead(&tmp.path().join("missing")), SettleReport::default());
    }
}
