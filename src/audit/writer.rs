//! The writing side: the per-directory [`RepoLog`] that owns a writer's audit files and
//! journal, the daemon's [`LogRegistry`] of them, and [`FileAuditSink`], the [`AuditSink`] the
//! proxy calls per session. The dated files are [`super::files`]; the journal's records and
//! rules are [`super::journal`]'s.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::SystemTime;

use super::files::{Clock, JsonlAppender, SystemClock};
use super::format::encode_line;
use super::journal::Journal;
use super::settle::{SettleReport, settle_journals, settle_locked};
use super::volume::{Limiter, Verdict, Volume};
use super::{AuditError, AuditLine, AuditSink, Stamp, new_id, rfc3339_ms};

/// One writer instance's logs in one repo directory: the dated audit files and the writer's
/// journal `journal-<boot>.jsonl`, locked for the life of this value. The daemon keeps one per
/// repo directory and hands each session a [`FileAuditSink`] on it; the standalone proxy has
/// exactly one.
#[derive(Debug)]
pub struct RepoLog {
    boot: String,
    audit: JsonlAppender,
    journal: Journal,
    clock: Arc<dyn Clock>,
    settled: SettleReport,
    /// False only in tests that simulate a crash (the journal is left for settlement).
    retire_on_drop: AtomicBool,
    /// Fired when this value is fully gone — after `journal` (declared before it, so dropped
    /// before it) has deleted its file: a [`LogRegistry`] reopening the directory under the
    /// same boot waits for it instead of polling.
    closed: CloseNotice,
}

impl Drop for RepoLog {
    fn drop(&mut self) {
        if !self.retire_on_drop.load(Ordering::Relaxed) {
            return;
        }
        // Retiring reads the journal, appends lines and unlinks it: blocking file I/O, and the
        // last reference often goes away on a tokio worker (a tunnel task ending). On the
        // multi-thread runtime, block_in_place first hands the worker's other tasks to another
        // thread; it panics on a current-thread runtime, where (as outside any runtime) the
        // retirement simply runs here.
        let flavor = tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor());
        if matches!(flavor, Ok(tokio::runtime::RuntimeFlavor::MultiThread)) {
            tokio::task::block_in_place(|| self.retire());
        } else {
            self.retire();
        }
    }
}

impl RepoLog {
    /// Settles what is still open in this writer's journal and deletes it (the drop path).
    fn retire(&self) {
        let dir = self.audit.dir();
        let retired = self.journal.retire_with(|path, reader| {
            let mut report = SettleReport::default();
            settle_locked(dir, path, reader, &self.audit, &mut report)?;
            if report.lines_written > 0 {
                tracing::warn!(
                    journal = %path.display(),
                    lines = report.lines_written,
                    "writer stopped with attempts still open; logged them as interrupted"
                );
            }
            Ok(())
        });
        if let Err(e) = retired {
            // The journal stays (locked until our descriptor closes just after this), so the
            // next writer settles it.
            tracing::error!(error = %e, "cannot retire the audit journal");
        }
    }

    /// Creates the directory (0700), settles every journal no live writer holds (crashed
    /// writers' tunnels become `"interrupted": true` lines), then creates and locks this
    /// writer's journal.
    pub fn open(dir: impl Into<PathBuf>, boot: &str) -> Result<Arc<Self>, AuditError> {
        Self::open_with_clock(dir, boot, Arc::new(SystemClock))
    }

    /// Like [`RepoLog::open`] with an injected clock.
    pub fn open_with_clock(
        dir: impl Into<PathBuf>,
        boot: &str,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Self>, AuditError> {
        let audit = JsonlAppender::with_clock(dir, "audit", Arc::clone(&clock))?;
        let settled = settle_journals(audit.dir())?;
        // A journal of our own boot already here means a live writer of ours holds this
        // directory: an error, never a wait (the registry waits for a closing log itself).
        let journal = Journal::create(audit.dir(), boot)?;
        if settled.lines_written > 0 {
            tracing::warn!(
                dir = %audit.dir().display(),
                lines = settled.lines_written,
                "settled tunnels of a writer that died as interrupted"
            );
        }
        Ok(Arc::new(Self {
            boot: boot.to_owned(),
            audit,
            journal,
            clock,
            settled,
            retire_on_drop: AtomicBool::new(true),
            closed: CloseNotice(Arc::new(Closed::default())),
        }))
    }

    /// Test-only: make dropping this log behave like a crash (journal left, lock released).
    #[cfg(test)]
    pub(crate) fn simulate_crash(&self) {
        self.retire_on_drop.store(false, Ordering::Relaxed);
    }

    pub fn dir(&self) -> &Path {
        self.audit.dir()
    }

    pub fn boot(&self) -> &str {
        &self.boot
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// What settlement did when this log was opened.
    pub fn settled(&self) -> &SettleReport {
        &self.settled
    }

    /// The audit-file appender of this directory (writes pre-encoded lines; no journal).
    pub fn audit(&self) -> &JsonlAppender {
        &self.audit
    }

    pub fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// A sink for one session on this log.
    pub fn session_sink(self: &Arc<Self>, info: SessionInfo) -> FileAuditSink {
        FileAuditSink::new(Arc::clone(self), info)
    }

    /// Appends one line; returns its length in bytes.
    fn append(&self, line: &AuditLine) -> Result<u64, AuditError> {
        let bytes = encode_line(line)?;
        self.audit.append_encoded(&bytes)?;
        Ok(bytes.len() as u64)
    }
}

/// Set once a [`RepoLog`] is gone (journal deleted or left for settlement, lock released).
#[derive(Debug, Default)]
struct Closed {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Closed {
    fn wait(&self) {
        let mut done = lock(&self.done);
        while !*done {
            done = self.cv.wait(done).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

/// A poisoned lock only means a panic elsewhere between statements that keep the guarded
/// value consistent (each update is one insert, remove or assignment).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Notifies waiters of a [`Closed`] when the log that carries it is dropped.
#[derive(Debug)]
struct CloseNotice(Arc<Closed>);

impl Drop for CloseNotice {
    fn drop(&mut self) {
        *lock(&self.0.done) = true;
        self.0.cv.notify_all();
    }
}

/// What the registry knows of one repo's log.
#[derive(Debug)]
enum Slot {
    /// One caller is opening it (outside the registry's lock); others wait for `changed`.
    Opening,
    /// Open, or closing: `closed` fires once a dead `log` has let go of its journal.
    Open { log: Weak<RepoLog>, closed: Arc<Closed> },
}

/// The daemon's map from repo name to its [`RepoLog`] under `~/.airlock/logs/`, for one boot:
/// sessions of the same repo share one log (and so one `journal-<boot>.jsonl`); a repo's log is
/// closed when its last session's sink goes away and reopened on the next session.
///
/// Opening a log does file I/O (settlement) and may wait for the previous log of the same repo
/// to let go of its journal; neither happens under the registry's lock, which is only held to
/// decide who opens (a per-repo `Opening` slot) — so one slow repo never stalls the others.
#[derive(Debug)]
pub struct LogRegistry {
    root: PathBuf,
    boot: String,
    clock: Arc<dyn Clock>,
    logs: Mutex<HashMap<String, Slot>>,
    /// Signalled whenever an `Opening` slot is resolved.
    changed: Condvar,
}

/// Resolves an `Opening` slot however the opener leaves (success, error or panic).
struct OpeningGuard<'a> {
    registry: &'a LogRegistry,
    repo: &'a str,
    opened: Option<(Weak<RepoLog>, Arc<Closed>)>,
}

impl Drop for OpeningGuard<'_> {
    fn drop(&mut self) {
        let mut logs = lock(&self.registry.logs);
        match self.opened.take() {
            Some((log, closed)) => {
                logs.insert(self.repo.to_owned(), Slot::Open { log, closed });
            }
            None => {
                logs.remove(self.repo);
            }
        }
        drop(logs);
        self.registry.changed.notify_all();
    }
}

impl LogRegistry {
    /// `root` is `~/.airlock/logs` ([`crate::paths::Paths::logs_root`]).
    pub fn new(root: impl Into<PathBuf>, boot: &str) -> Self {
        Self::with_clock(root, boot, Arc::new(SystemClock))
    }

    pub fn with_clock(root: impl Into<PathBuf>, boot: &str, clock: Arc<dyn Clock>) -> Self {
        Self {
            root: root.into(),
            boot: boot.to_owned(),
            clock,
            logs: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
        }
    }

    pub fn boot(&self) -> &str {
        &self.boot
    }

    /// The live log of the directory `repo` under the root (a validated repo name, or the
    /// name [`super::logdir::claim`] chose), opening it if needed. Blocking (file
    /// I/O): async callers run it on `spawn_blocking`.
    pub fn repo_log(&self, repo: &str) -> Result<Arc<RepoLog>, AuditError> {
        let previous = {
            let mut logs = lock(&self.logs);
            loop {
                match logs.get(repo) {
                    Some(Slot::Opening) => {
                        logs = self.changed.wait(logs).unwrap_or_else(|p| p.into_inner());
                    }
                    Some(Slot::Open { log, closed }) => match log.upgrade() {
                        Some(live) => return Ok(live),
                        None => {
                            let closed = Arc::clone(closed);
                            logs.insert(repo.to_owned(), Slot::Opening);
                            break Some(closed);
                        }
                    },
                    None => {
                        logs.retain(|_, slot| match slot {
                            Slot::Opening => true,
                            Slot::Open { log, .. } => log.strong_count() > 0,
                        });
                        logs.insert(repo.to_owned(), Slot::Opening);
                        break None;
                    }
                }
            }
        };
        let mut guard = OpeningGuard { registry: self, repo, opened: None };
        // Our boot's previous log of this directory is being dropped on another thread: its
        // journal (same name as ours) goes away just before `closed` fires.
        if let Some(closed) = previous {
            closed.wait();
        }
        let log =
            RepoLog::open_with_clock(self.root.join(repo), &self.boot, Arc::clone(&self.clock))?;
        guard.opened = Some((Arc::downgrade(&log), Arc::clone(&log.closed.0)));
        Ok(log)
    }

    /// A sink for a new session of `info.repo`. Blocking, like [`LogRegistry::repo_log`].
    pub fn session_sink(&self, info: SessionInfo) -> Result<FileAuditSink, AuditError> {
        self.session_sink_with(info, Volume::default())
    }

    /// Like [`LogRegistry::session_sink`] with the session's `[audit]` volume settings.
    /// Refuses to start below `[audit] min_free` ([`AuditError::LowSpace`]).
    pub fn session_sink_with(
        &self,
        info: SessionInfo,
        volume: Volume,
    ) -> Result<FileAuditSink, AuditError> {
        let dir = info.repo.clone();
        self.session_sink_in(&dir, info, volume)
    }

    /// Like [`LogRegistry::session_sink_with`], writing to `root/<dir_name>` — the checkout's
    /// directory as [`super::logdir::claim`] chose it.
    pub fn session_sink_in(
        &self,
        dir_name: &str,
        info: SessionInfo,
        volume: Volume,
    ) -> Result<FileAuditSink, AuditError> {
        FileAuditSink::starting(self.repo_log(dir_name)?, info, volume)
    }
}

/// The per-session fields every line of a session carries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionInfo {
    /// Globally unique session id (e.g. [`super::new_id`]).
    pub session: String,
    /// The repo name (audit `repo`).
    pub repo: String,
    /// The repo's host path (audit `repo_path`).
    pub repo_path: Option<String>,
    /// The checkout's repo key (audit `repo_key`).
    pub repo_key: Option<String>,
    /// Omitted for unattributed runs.
    pub user_id: Option<String>,
}

/// The [`AuditSink`] of one session: stamps attempts with `id`, `seq` (from 1, per session and
/// boot), `session` and `boot`, and writes through its [`RepoLog`].
#[derive(Debug)]
pub struct FileAuditSink {
    log: Arc<RepoLog>,
    info: SessionInfo,
    /// Random per sink: `id` = `<prefix>-<seq>`, unique without a syscall per line.
    id_prefix: String,
    seq: AtomicU64,
    /// Rate limiting of identical refusals and the stop state ([`super::volume`]).
    limiter: Mutex<Limiter>,
    /// Audit bytes this session has written (against `[audit] session_budget`).
    written: AtomicU64,
    /// `now_ms / INTERVAL_MS + 1` of the last interval in which a refusal was suppressed
    /// (0: never), read lock-free by [`AuditSink::flooding`] before every accept.
    suppressed_in: AtomicU64,
    /// Set once, when the session is stopped (after its final line): the daemon tells the
    /// session's supervisor, which ends the sandbox ([`FileAuditSink::on_stop`]).
    stop_tx: tokio::sync::watch::Sender<Option<StopNotice>>,
}

/// Why a session was stopped, for its supervisor: the reason code and a message for the
/// user that says what happened and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopNotice {
    /// `audit_budget` or `low_space`.
    pub reason: crate::policy::Reason,
    /// For the user's terminal, after `airlock: session stopped: `.
    pub message: String,
}

impl Drop for FileAuditSink {
    fn drop(&mut self) {
        // Session end: no pending count is lost (the proxy also flushes on drain).
        if let Err(e) = self.flush() {
            tracing::error!(error = %e, "cannot write the session's suppressed-refusal summaries");
        }
    }
}

impl FileAuditSink {
    pub fn new(log: Arc<RepoLog>, info: SessionInfo) -> Self {
        Self::with_volume(log, info, Volume::default())
    }

    /// A new session's sink: refused below `[audit] min_free` ([`AuditError::LowSpace`]), so
    /// a session never starts without room for its audit lines (the daemon's sessions and the
    /// standalone proxy alike).
    pub fn starting(
        log: Arc<RepoLog>,
        info: SessionInfo,
        volume: Volume,
    ) -> Result<Self, AuditError> {
        let free = super::volume::free_bytes(log.dir())
            .map_err(|source| AuditError::Read { path: log.dir().to_owned(), source })?;
        if free < volume.min_free {
            return Err(AuditError::LowSpace {
                path: log.dir().to_owned(),
                free,
                min: volume.min_free,
            });
        }
        Ok(Self::with_volume(log, info, volume))
    }

    /// A sink with the session's `[audit]` volume settings.
    pub fn with_volume(log: Arc<RepoLog>, info: SessionInfo, volume: Volume) -> Self {
        Self {
            log,
            info,
            id_prefix: new_id(),
            seq: AtomicU64::new(0),
            limiter: Mutex::new(Limiter::new(volume)),
            written: AtomicU64::new(0),
            suppressed_in: AtomicU64::new(0),
            stop_tx: tokio::sync::watch::channel(None).0,
        }
    }

    /// Fires (the value turns `Some`) once the session is stopped for `audit_budget` or
    /// `low_space`, after its final line was written (or failed to be).
    pub fn on_stop(&self) -> tokio::sync::watch::Receiver<Option<StopNotice>> {
        self.stop_tx.subscribe()
    }

    /// The message for the user when the session is stopped for `reason`.
    fn stop_message(&self, reason: crate::policy::Reason) -> String {
        let volume = *lock(&self.limiter).volume();
        match reason {
            crate::policy::Reason::AuditBudget => format!(
                "it wrote its audit budget of {} bytes ([audit] session_budget); see what \
                 flooded the log with `airlock logs`, or raise session_budget in \
                 ~/.airlock/config.toml",
                volume.session_budget
            ),
            _ => format!(
                "the file system of the audit log ({}) has less than [audit] min_free ({} \
                 bytes) free, and without space for the audit log nothing is forwarded; free \
                 some space and start a new session (see `airlock logs`)",
                self.log.dir().display(),
                volume.min_free
            ),
        }
    }

    /// Why the session was stopped (`audit_budget`, `low_space`), if it was.
    pub fn stopped(&self) -> Option<crate::policy::Reason> {
        lock(&self.limiter).stopped()
    }

    /// Audit bytes written by this session so far.
    pub fn bytes_written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    fn stop_error(&self, reason: crate::policy::Reason) -> AuditError {
        let volume = *lock(&self.limiter).volume();
        let detail = match reason {
            crate::policy::Reason::AuditBudget => format!(
                "airlock stopped this session: it wrote its audit budget of {} bytes \
                 ([audit] session_budget); nothing more is forwarded. Find out what floods the \
                 log (`airlock logs`), then start a new session, or raise session_budget in \
                 ~/.airlock/config.toml",
                volume.session_budget
            ),
            _ => format!(
                "airlock stopped this session: the file system of {} has less than [audit] \
                 min_free ({} bytes) free, and without space for the audit log nothing is \
                 forwarded. Free some space and start a new session",
                self.log.dir().display(),
                volume.min_free
            ),
        };
        AuditError::Stopped { reason, detail }
    }

    /// Stops the session once: logs why and writes its final line (a fresh `seq`, `method`
    /// `"STOP"`, the reason).
    fn stop_session(&self, reason: crate::policy::Reason) {
        if !lock(&self.limiter).stop(reason) {
            return;
        }
        let e = self.stop_error(reason);
        tracing::error!(session = %self.info.session, "{e}");
        let mut last = self.line("", None, "STOP");
        last.reason = Some(reason);
        last.layer = Some(crate::policy::LayerKind::None);
        last.duration_ms = Some(0);
        match self.log.append(&last) {
            Ok(n) => {
                self.written.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => tracing::error!(error = %e, "cannot write the session's final line"),
        }
        // Only now: the final line is in the log before the supervisor ends the sandbox.
        self.stop_tx.send_replace(Some(StopNotice { reason, message: self.stop_message(reason) }));
    }

    /// Writes `line` and counts it against the budget; past the budget the session stops.
    fn write_counted(&self, line: &AuditLine) -> Result<(), AuditError> {
        let n = self.log.append(line)?;
        let total = self.written.fetch_add(n, Ordering::Relaxed) + n;
        if total >= lock(&self.limiter).volume().session_budget {
            self.stop_session(crate::policy::Reason::AuditBudget);
        }
        Ok(())
    }

    /// After a stop: the attempt is counted in the stop summary and refused.
    fn refuse_stopped(&self, line: &AuditLine, reason: crate::policy::Reason) -> AuditError {
        let full = lock(&self.limiter).absorb(line);
        if let Err(e) = self.write_summaries(full) {
            tracing::error!(error = %e, "cannot write the stopped session's summary");
        }
        self.stop_error(reason)
    }

    fn now_ms(&self) -> u64 {
        let since = self.log.now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    }

    /// Writes summaries in order; what cannot be written goes back to the limiter (a later
    /// tick or the final flush retries it) and the first error is returned.
    fn write_summaries(&self, lines: Vec<AuditLine>) -> Result<(), AuditError> {
        let mut lines = lines.into_iter();
        while let Some(line) = lines.next() {
            if let Err(e) = self.write_counted(&line) {
                let mut back = vec![line];
                back.extend(lines);
                lock(&self.limiter).restore(back, self.now_ms());
                return Err(e);
            }
        }
        Ok(())
    }

    /// The standalone proxy's one-liner: [`RepoLog::open`] then a sink on it.
    pub fn open(
        dir: impl Into<PathBuf>,
        boot: &str,
        info: SessionInfo,
    ) -> Result<Self, AuditError> {
        Ok(Self::new(RepoLog::open(dir, boot)?, info))
    }

    pub fn log(&self) -> &Arc<RepoLog> {
        &self.log
    }

    pub fn info(&self) -> &SessionInfo {
        &self.info
    }

    /// A new attempt's line: `ts` now, a fresh stamp, the session's fields, `host`, `port`,
    /// `method`, and `allowed: false` until the caller decides otherwise.
    pub fn line(&self, host: &str, port: Option<u16>, method: &str) -> AuditLine {
        AuditLine {
            user_id: self.info.user_id.clone(),
            repo: self.info.repo.clone(),
            repo_path: self.info.repo_path.clone(),
            repo_key: self.info.repo_key.clone(),
            ..AuditLine::attempt(rfc3339_ms(self.log.now()), self.stamp(), host, port, method)
        }
    }
}

impl AuditSink for FileAuditSink {
    fn stamp(&self) -> Stamp {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        Stamp {
            id: format!("{}-{seq}", self.id_prefix),
            session: self.info.session.clone(),
            boot: self.log.boot.clone(),
            seq,
        }
    }

    fn append(&self, line: &AuditLine) -> Result<(), AuditError> {
        if let Some(reason) = self.stopped() {
            return Err(self.refuse_stopped(line, reason));
        }
        if !Limiter::applies(line) {
            return self.write_counted(line);
        }
        let verdict = lock(&self.limiter).admit(line, self.now_ms());
        match verdict {
            Verdict::Write(before) => {
                self.write_summaries(before)?;
                self.write_counted(line)
            }
            Verdict::Suppressed(full) => {
                let interval = self.now_ms() / super::volume::INTERVAL_MS + 1;
                self.suppressed_in.fetch_max(interval, Ordering::Relaxed);
                self.write_summaries(full)
            }
        }
    }

    fn flooding(&self) -> bool {
        let last = self.suppressed_in.load(Ordering::Relaxed);
        // This interval or the one before: a flood that keeps being suppressed stays marked;
        // one that stopped is unmarked within two intervals.
        last != 0 && self.now_ms() / super::volume::INTERVAL_MS <= last
    }

    /// Also the in-session free-space check (once a second): below `[audit] min_free` the
    /// session stops with `low_space`.
    fn tick(&self) -> Result<(), AuditError> {
        let min_free = lock(&self.limiter).volume().min_free;
        if self.stopped().is_none() {
            match super::volume::free_bytes(self.log.dir()) {
                Ok(free) if free < min_free => {
                    self.stop_session(crate::policy::Reason::LowSpace);
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot check the audit log's free space"),
            }
        }
        let due = lock(&self.limiter).due(self.now_ms());
        self.write_summaries(due)
    }

    fn flush(&self) -> Result<(), AuditError> {
        let all = lock(&self.limiter).drain();
        self.write_summaries(all)
    }

    fn journal_open(&self, line: &AuditLine) -> Result<(), AuditError> {
        if let Some(reason) = self.stopped() {
            return Err(self.refuse_stopped(line, reason));
        }
        self.log.journal.open(line)
    }

    fn journal_close(&self, line: &AuditLine) -> Result<(), AuditError> {
        // Audit line first: if it fails the open record stays and a later writer settles it.
        // A tunnel opened before a stop still gets its line.
        self.write_counted(line)?;
        self.log.journal.close(&line.id)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;
    use crate::audit::format::tests::sample;
    use crate::audit::utc_date;
    use std::collections::HashSet;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::AtomicU64;
    use std::time::Duration;

    /// A settable clock (milliseconds since the epoch).
    #[derive(Debug)]
    pub(crate) struct TestClock(pub AtomicU64);

    impl TestClock {
        pub(crate) fn at(ms: u64) -> Arc<Self> {
            Arc::new(Self(AtomicU64::new(ms)))
        }
        pub(crate) fn set(&self, ms: u64) {
            self.0.store(ms, Ordering::SeqCst);
        }
    }

    impl Clock for TestClock {
        fn now(&self) -> SystemTime {
            SystemTime::UNIX_EPOCH + Duration::from_millis(self.0.load(Ordering::SeqCst))
        }
    }

    /// 2026-07-24T23:59:59.900Z
    pub(crate) const BEFORE_MIDNIGHT: u64 = 1_784_937_599_900;

    pub(crate) fn info() -> SessionInfo {
        SessionInfo {
            session: "sess".into(),
            repo: "some-repo".into(),
            repo_path: Some("/src/some-repo".into()),
            repo_key: Some("some-repo-0a1b2c3d".into()),
            user_id: Some("u1".into()),
        }
    }

    pub(crate) fn lines(path: &Path) -> Vec<AuditLine> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn files_are_private_and_lines_land_in_the_dated_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("logs/some-repo");
        let clock = TestClock::at(BEFORE_MIDNIGHT);
        let log = RepoLog::open_with_clock(&dir, "boot1", clock.clone()).unwrap();
        let sink = log.session_sink(info());
        let mut line = sink.line("pastebin.com", Some(443), "CONNECT");
        assert_eq!(line.ts, "2026-07-24T23:59:59.900Z");
        assert_eq!((line.seq, line.session.as_str(), line.boot.as_str()), (1, "sess", "boot1"));
        line.reason = Some(crate::policy::Reason::NotAllowed);
        sink.append(&line).unwrap();

        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        let today = dir.join("audit-2026-07-24.jsonl");
        assert_eq!(mode(&today), 0o600);
        assert_eq!(mode(&dir.join("journal-boot1.jsonl")), 0o600);
        assert_eq!(lines(&today), vec![line]);
    }

    /// A refusal flood from 8 threads: bounded lines, and written lines + suppressed counts
    /// = attempts with every seq held exactly once; the last summaries are written on drop.
    #[test]
    fn a_refusal_flood_is_bounded_and_loses_no_count() {
        let tmp = tempfile::tempdir().unwrap();
        let clock = TestClock::at(BEFORE_MIDNIGHT - 5_000);
        let log = RepoLog::open_with_clock(tmp.path(), "b", clock.clone()).unwrap();
        let sink = Arc::new(FileAuditSink::with_volume(
            Arc::clone(&log),
            info(),
            Volume { burst: 5, ..Volume::default() },
        ));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let sink = Arc::clone(&sink);
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        let mut line = sink.line("flood.test", Some(443), "CONNECT");
                        line.reason = Some(crate::policy::Reason::NotAllowed);
                        sink.append(&line).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Still the same second: nothing is due yet; dropping the sink (session end) writes
        // what is pending.
        sink.tick().unwrap();
        drop(sink);
        let got = lines(&tmp.path().join("audit-2026-07-24.jsonl"));
        assert!(got.len() < 200, "{} lines for 4000 attempts", got.len());
        let mut seen = vec![0u8; 4001];
        for l in &got {
            match &l.seqs {
                None => seen[l.seq as usize] += 1,
                Some(r) => {
                    let n: u64 = r.iter().map(|[a, b]| b - a + 1).sum();
                    assert_eq!(l.count, Some(n));
                    for [a, b] in r {
                        (*a..=*b).for_each(|q| seen[q as usize] += 1);
                    }
                }
            }
        }
        assert!(seen[1..].iter().all(|&n| n == 1), "every seq exactly once");
    }

    /// A session whose refusals are being suppressed is marked flooding (the proxy then paces
    /// its accepts) in that interval and the next, and unmarked once it stopped flooding.
    #[test]
    fn a_session_is_flooding_while_its_refusals_are_suppressed_and_not_after() {
        let tmp = tempfile::tempdir().unwrap();
        let clock = TestClock::at(BEFORE_MIDNIGHT - 5_000);
        let log = RepoLog::open_with_clock(tmp.path(), "f", clock.clone()).unwrap();
        let volume = Volume { burst: 3, ..Volume::default() };
        let sink = FileAuditSink::with_volume(Arc::clone(&log), info(), volume);
        let refuse = |host: &str| {
            let mut line = sink.line(host, Some(443), "CONNECT");
            line.reason = Some(crate::policy::Reason::NotAllowed);
            sink.append(&line).unwrap();
        };
        // Within the burst, and different hosts: written, not flooding.
        for host in ["a.test", "a.test", "a.test", "b.test", "c.test"] {
            refuse(host);
        }
        assert!(!sink.flooding());
        refuse("a.test"); // the fourth identical refusal in the interval is suppressed
        assert!(sink.flooding());
        clock.set(BEFORE_MIDNIGHT - 4_000); // the next interval: still marked
        assert!(sink.flooding());
        clock.set(BEFORE_MIDNIGHT - 2_500); // two intervals on, nothing suppressed since
        assert!(!sink.flooding());
    }

    /// Past `session_budget` the session stops: one final `audit_budget` line, every later
    /// attempt refused (allowed ones never journaled) and counted in a stop summary.
    #[test]
    fn past_the_budget_the_session_stops_with_a_final_line_and_counts_the_rest() {
        let tmp = tempfile::tempdir().unwrap();
        let log = RepoLog::open(tmp.path(), "b").unwrap();
        let volume = Volume { burst: 0, session_budget: 2000, ..Volume::default() };
        let sink = FileAuditSink::with_volume(Arc::clone(&log), info(), volume);
        let stop = sink.on_stop();
        assert_eq!(*stop.borrow(), None);
        let mut refused = 0;
        for i in 0..40 {
            let mut line = sink.line(&format!("h{i}.test"), Some(443), "CONNECT");
            if i % 2 == 0 {
                line.reason = Some(crate::policy::Reason::NotAllowed);
                if let Err(e) = sink.append(&line) {
                    assert!(matches!(e, AuditError::Stopped { .. }));
                    assert!(e.to_string().contains("session_budget"), "{e}");
                    refused += 1;
                }
            } else {
                line.allowed = true;
                if sink.journal_open(&line).is_err() {
                    refused += 1;
                } else {
                    sink.journal_close(&line).unwrap();
                }
            }
        }
        assert_eq!(sink.stopped(), Some(crate::policy::Reason::AuditBudget));
        // The supervisor's notice: the reason and what to do, naming the budget.
        let notice = stop.borrow().clone().unwrap();
        assert_eq!(notice.reason, crate::policy::Reason::AuditBudget);
        assert!(
            notice.message.contains("audit budget of 2000 bytes ([audit] session_budget)"),
            "{notice:?}"
        );
        drop(sink);
        let got = lines(&tmp.path().join(format!("audit-{}.jsonl", utc_date(SystemTime::now()))));
        let finals: Vec<_> = got.iter().filter(|l| l.method == "STOP").collect();
        assert_eq!(finals.len(), 1);
        assert_eq!(finals[0].reason, Some(crate::policy::Reason::AuditBudget));
        let summary: Vec<_> = got.iter().filter(|l| l.seqs.is_some()).collect();
        assert_eq!(summary.len(), 1);
        assert_eq!(summary[0].count, Some(refused));
        assert_eq!(summary[0].reason, Some(crate::policy::Reason::AuditBudget));
        // 40 attempts + the final line, each seq once.
        let mut seen: Vec<u64> = got.iter().filter(|l| l.seqs.is_none()).map(|l| l.seq).collect();
        for [a, b] in summary[0].seqs.clone().unwrap() {
            seen.extend(a..=b);
        }
        seen.sort_unstable();
        assert_eq!(seen, (1..=41).collect::<Vec<_>>());
        assert!(log.journal().path().exists());
    }

    /// Below `min_free` a session does not start, and a running one stops at its next tick.
    #[test]
    fn low_space_refuses_the_start_and_stops_a_running_session() {
        let tmp = tempfile::tempdir().unwrap();
        let reg = LogRegistry::new(tmp.path(), "boot");
        let huge = Volume { min_free: u64::MAX, ..Volume::default() };
        let err = reg.session_sink_with(info(), huge).unwrap_err();
        assert!(matches!(err, AuditError::LowSpace { .. }), "{err}");
        assert!(err.to_string().contains("min_free"), "{err}");
        let sink = reg.session_sink_with(info(), Volume::default()).unwrap();
        sink.tick().unwrap();
        assert_eq!(sink.stopped(), None, "this file system has room");
        // The same check with a threshold above what is free stops it.
        lock(&sink.limiter).volume.min_free = u64::MAX;
        let stop = sink.on_stop();
        sink.tick().unwrap();
        assert_eq!(sink.stopped(), Some(crate::policy::Reason::LowSpace));
        let notice = stop.borrow().clone().unwrap();
        assert_eq!(notice.reason, crate::policy::Reason::LowSpace);
        assert!(notice.message.contains("[audit] min_free"), "{notice:?}");
        let mut line = sink.line("a.test", Some(443), "CONNECT");
        line.allowed = true;
        let err = sink.journal_open(&line).unwrap_err();
        assert!(err.to_string().contains("min_free"), "{err}");
    }

    #[test]
    fn writes_rotate_by_utc_date() {
        let tmp = tempfile::tempdir().unwrap();
        let clock = TestClock::at(BEFORE_MIDNIGHT);
        let log = RepoLog::open_with_clock(tmp.path(), "b", clock.clone()).unwrap();
        let sink = log.session_sink(info());
        let a = sink.line("a.test", Some(443), "CONNECT");
        sink.append(&a).unwrap();
        clock.set(BEFORE_MIDNIGHT + 200); // 2026-07-25T00:00:00.100Z
        let b = sink.line("b.test", Some(443), "CONNECT");
        sink.append(&b).unwrap();
        assert_eq!(lines(&tmp.path().join("audit-2026-07-24.jsonl")), vec![a]);
        assert_eq!(lines(&tmp.path().join("audit-2026-07-25.jsonl")), vec![b]);
    }

    #[test]
    fn seq_is_dense_and_ids_unique_under_concurrency() {
        let tmp = tempfile::tempdir().unwrap();
        let sink = Arc::new(FileAuditSink::open(tmp.path(), "b", info()).unwrap());
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let sink = Arc::clone(&sink);
                std::thread::spawn(move || {
                    let mut last = 0;
                    for i in 0..250 {
                        let line = sink.line(&format!("h{t}-{i}.test"), Some(443), "CONNECT");
                        assert!(line.seq > last, "seq went backwards within a thread");
                        last = line.seq;
                        sink.append(&line).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let date = utc_date(SystemTime::now());
        let mut got = lines(&tmp.path().join(format!("audit-{date}.jsonl")));
        assert_eq!(got.len(), 2000);
        got.sort_by_key(|l| l.seq);
        assert!(got.iter().enumerate().all(|(i, l)| l.seq == i as u64 + 1));
        let ids: HashSet<_> = got.iter().map(|l| l.id.clone()).collect();
        assert_eq!(ids.len(), 2000);
    }

    /// One `write(2)` per line: a large hostile line is never split, even with many writers
    /// racing on the same file (a split would show up as an unparseable line).
    #[test]
    fn large_hostile_lines_never_interleave() {
        let tmp = tempfile::tempdir().unwrap();
        let log = RepoLog::open(tmp.path(), "b").unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let sink = log.session_sink(SessionInfo { session: format!("s{t}"), ..info() });
                std::thread::spawn(move || {
                    for i in 0..200 {
                        let mut line = sample();
                        let (id, seq) = (sink.stamp().id, i);
                        line.id = id;
                        line.seq = seq;
                        line.host = format!("{}\"\n\u{0}{t}", "\u{1b}x".repeat(300));
                        line.url = Some("\\".repeat(4000));
                        sink.append(&line).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let date = utc_date(SystemTime::now());
        let text = std::fs::read_to_string(tmp.path().join(format!("audit-{date}.jsonl"))).unwrap();
        let mut n = 0;
        for l in text.lines() {
            let line: AuditLine = serde_json::from_str(l).unwrap();
            assert_eq!(line.truncated, Some(true));
            assert!(l.len() < crate::audit::MAX_LINE);
            n += 1;
        }
        assert_eq!(n, 800);
    }

    #[test]
    fn unwritable_directory_is_an_error_not_a_panic() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("not-a-dir");
        std::fs::write(&file, "").unwrap();
        let err = RepoLog::open(file.join("sub"), "b").unwrap_err();
        assert!(err.to_string().contains("not-a-dir"), "{err}");
    }

    #[test]
    fn stopping_with_open_attempts_logs_them_as_interrupted_now() {
        let tmp = tempfile::tempdir().unwrap();
        let log = RepoLog::open(tmp.path(), "b").unwrap();
        let sink = log.session_sink(info());
        let mut leaked = sink.line("leaked.test", Some(443), "CONNECT");
        leaked.allowed = true;
        sink.journal_open(&leaked).unwrap();
        let journal = log.journal().path().to_owned();
        drop(sink);
        drop(log);
        assert!(!journal.exists());
        let got = lines(&tmp.path().join(format!("audit-{}.jsonl", utc_date(SystemTime::now()))));
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].id.as_str(), got[0].interrupted), (leaked.id.as_str(), Some(true)));
        // The same boot can open the directory again.
        RepoLog::open(tmp.path(), "b").unwrap();
    }

    /// The last reference dropped on a multi-thread runtime's worker (a tunnel task ending in
    /// the daemon), on a current-thread runtime (where `block_in_place` would panic) and on a
    /// blocking thread: each retires the journal and logs the open attempt as interrupted.
    #[test]
    fn the_last_reference_retires_the_journal_on_any_runtime_thread() {
        fn open_with_a_leaked_attempt(dir: &Path) -> (Arc<RepoLog>, PathBuf) {
            let log = RepoLog::open(dir, "b").unwrap();
            let sink = log.session_sink(info());
            let mut leaked = sink.line("leaked.test", Some(443), "CONNECT");
            leaked.allowed = true;
            sink.journal_open(&leaked).unwrap();
            let journal = log.journal().path().to_owned();
            (log, journal)
        }
        let multi = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
        let current = tokio::runtime::Builder::new_current_thread().build().unwrap();
        for (n, how) in ["worker", "current-thread", "blocking"].into_iter().enumerate() {
            let tmp = tempfile::tempdir().unwrap();
            let (log, journal) = open_with_a_leaked_attempt(tmp.path());
            match how {
                "worker" => multi
                    .block_on(async move { tokio::spawn(async move { drop(log) }).await })
                    .unwrap(),
                "current-thread" => current.block_on(async move { drop(log) }),
                _ => multi
                    .block_on(async move { tokio::task::spawn_blocking(move || drop(log)).await })
                    .unwrap(),
            }
            assert!(!journal.exists(), "{how}: journal left");
            let day = utc_date(SystemTime::now());
            let got = lines(&tmp.path().join(format!("audit-{day}.jsonl")));
            assert_eq!(got.len(), 1, "{how} ({n}): {got:?}");
            assert_eq!(got[0].interrupted, Some(true), "{how}");
        }
    }

    #[test]
    fn registry_shares_one_log_per_repo_and_reopens_after_the_last_session() {
        let tmp = tempfile::tempdir().unwrap();
        let reg = LogRegistry::new(tmp.path(), "boot");
        let a = reg.session_sink(SessionInfo { session: "a".into(), ..info() }).unwrap();
        let b = reg.session_sink(SessionInfo { session: "b".into(), ..info() }).unwrap();
        assert!(Arc::ptr_eq(a.log(), b.log()));
        assert_eq!(a.log().dir(), tmp.path().join("some-repo"));
        let other = reg.session_sink(SessionInfo { repo: "other".into(), ..info() }).unwrap();
        assert!(!Arc::ptr_eq(a.log(), other.log()));
        // seq is per session.
        assert_eq!((a.stamp().seq, b.stamp().seq, a.stamp().seq), (1, 1, 2));
        drop((a, b));
        let c = reg.session_sink(SessionInfo { session: "c".into(), ..info() }).unwrap();
        assert!(c.log().journal().path().exists());
    }

    /// Regression: reopening a repo whose previous log (same boot) is still being dropped on
    /// another thread used to poll for up to a second holding the registry's lock. Now the
    /// opener waits, without that lock, for the closing log's notice; others are not held up.
    #[test]
    fn reopening_waits_for_the_closing_log_and_never_blocks_other_repos() {
        let tmp = tempfile::tempdir().unwrap();
        let reg = Arc::new(LogRegistry::new(tmp.path(), "boot"));
        // A log of `some-repo` that is mid-drop: no strong reference left, journal still there.
        std::fs::create_dir(tmp.path().join("some-repo")).unwrap();
        let closing = Journal::create(&tmp.path().join("some-repo"), "boot").unwrap();
        let notice = CloseNotice(Arc::new(Closed::default()));
        lock(&reg.logs).insert(
            "some-repo".into(),
            Slot::Open { log: Weak::new(), closed: Arc::clone(&notice.0) },
        );
        let opener = {
            let reg = Arc::clone(&reg);
            std::thread::spawn(move || reg.session_sink(info()).map(|s| Arc::clone(s.log())))
        };
        while !matches!(lock(&reg.logs).get("some-repo"), Some(Slot::Opening))
            && !opener.is_finished()
        {
            std::thread::yield_now();
        }
        // The registry's lock is free meanwhile: another repo opens at once.
        let other = reg.session_sink(SessionInfo { repo: "other".into(), ..info() }).unwrap();
        assert_eq!(other.log().dir(), tmp.path().join("other"));
        drop(closing);
        drop(notice);
        let log = opener.join().unwrap().unwrap();
        assert!(log.journal().path().exists());
        let again = reg.repo_log("some-repo").unwrap();
        assert!(Arc::ptr_eq(&log, &again));
    }

    #[test]
    fn concurrent_first_sessions_of_a_repo_share_one_log() {
        let tmp = tempfile::tempdir().unwrap();
        let reg = Arc::new(LogRegistry::new(tmp.path(), "boot"));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let reg = Arc::clone(&reg);
                std::thread::spawn(move || reg.repo_log("shared").unwrap())
            })
            .collect();
        let logs: Vec<Arc<RepoLog>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(logs.iter().all(|l| Arc::ptr_eq(l, &logs[0])));
    }
}
