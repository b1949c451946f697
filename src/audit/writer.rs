//! The writing side: dated append-only JSONL files (`<prefix>-<YYYY-MM-DD>.jsonl`, one
//! `write(2)` per line on an `O_APPEND` descriptor), the per-directory [`RepoLog`] that owns a
//! writer's journal, and [`FileAuditSink`], the [`AuditSink`] the proxy calls per session.

use std::collections::HashMap;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use serde::Serialize;

use super::format::{encode_json, encode_line};
use super::journal::Journal;
use super::settle::{SettleReport, settle_journals};
use super::{AuditError, AuditLine, AuditSink, Stamp, new_id, rfc3339_ms, utc_date};

/// Largest record [`JsonlAppender::append`] accepts (session records carry command lines).
pub const MAX_RECORD: usize = 64 * 1024;

/// The wall clock, injectable so tests can cross midnight.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> SystemTime;
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Creates `dir` (and parents) with mode 0700; an existing directory is left as it is.
pub(crate) fn create_private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Writes `buf` with exactly one successful `write(2)`: retried only on `EINTR`; a short write
/// is an error (the caller fails closed), never completed by a second write that another
/// writer's line could interleave with.
pub(crate) fn write_once(file: &File, buf: &[u8]) -> io::Result<()> {
    loop {
        match (&*file).write(buf) {
            Ok(n) if n == buf.len() => return Ok(()),
            Ok(n) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("short write: {n} of {} bytes", buf.len()),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Opens `path` for appending (`O_APPEND|O_CLOEXEC|O_CREAT`, mode 0600 when created).
/// std opens every file with `O_CLOEXEC` on Linux, so the sandbox never inherits it.
pub(crate) fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().append(true).create(true).mode(0o600).open(path)
}

/// One open dated file.
#[derive(Debug)]
struct DatedFile {
    /// UTC days since the epoch.
    day: u64,
    path: PathBuf,
    file: File,
    /// A short write left a fragment without its newline: the next line starts with `\n` so
    /// it stays parseable (the fragment becomes one bad line a reader reports).
    fragment: AtomicBool,
}

impl DatedFile {
    fn write_line(&self, line: &[u8]) -> io::Result<()> {
        let result = if self.fragment.load(Ordering::Acquire) {
            let mut buf = Vec::with_capacity(line.len() + 1);
            buf.push(b'\n');
            buf.extend_from_slice(line);
            write_once(&self.file, &buf)
        } else {
            write_once(&self.file, line)
        };
        match &result {
            Ok(()) => self.fragment.store(false, Ordering::Release),
            Err(e) if e.kind() == io::ErrorKind::WriteZero => {
                self.fragment.store(true, Ordering::Release)
            }
            Err(_) => {}
        }
        result
    }
}

/// Appends JSON lines to `<dir>/<prefix>-<YYYY-MM-DD>.jsonl`, by the UTC date of each write,
/// switching files when the date changes. Safe to share between threads; concurrent lines
/// never interleave (one `write(2)` each on an `O_APPEND` descriptor).
#[derive(Debug)]
pub struct JsonlAppender {
    dir: PathBuf,
    prefix: String,
    clock: Arc<dyn Clock>,
    current: Mutex<Option<Arc<DatedFile>>>,
}

impl JsonlAppender {
    /// An appender for `<dir>/<prefix>-<date>.jsonl`; creates `dir` (0700) if missing.
    pub fn new(dir: impl Into<PathBuf>, prefix: &str) -> Result<Self, AuditError> {
        Self::with_clock(dir, prefix, Arc::new(SystemClock))
    }

    /// Like [`JsonlAppender::new`] with an injected clock.
    pub fn with_clock(
        dir: impl Into<PathBuf>,
        prefix: &str,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, AuditError> {
        let dir = dir.into();
        create_private_dir(&dir)
            .map_err(|source| AuditError::Write { path: dir.clone(), source })?;
        Ok(Self { dir, prefix: prefix.to_owned(), clock, current: Mutex::new(None) })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file a write on `date` (`YYYY-MM-DD`) goes to.
    pub fn path_for(&self, date: &str) -> PathBuf {
        self.dir.join(format!("{}-{date}.jsonl", self.prefix))
    }

    /// The file for the clock's current date, opening (and rotating to) it if needed.
    fn file(&self) -> Result<Arc<DatedFile>, AuditError> {
        let now = self.clock.now();
        // UTC days since the epoch: compared on every write, formatted only on a new day.
        let day = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400);
        // A poisoned lock only means another writer panicked between two statements that
        // cannot leave the Option inconsistent; keep going.
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = current.as_ref().filter(|f| f.day == day) {
            return Ok(Arc::clone(f));
        }
        let path = self.path_for(&utc_date(now));
        let file = open_append(&path)
            .map_err(|source| AuditError::Write { path: path.clone(), source })?;
        let f = Arc::new(DatedFile { day, path, file, fragment: AtomicBool::new(false) });
        *current = Some(Arc::clone(&f));
        Ok(f)
    }

    /// Writes one already-encoded line (must be a single line ending in `\n`).
    pub fn append_encoded(&self, line: &[u8]) -> Result<(), AuditError> {
        let f = self.file()?;
        f.write_line(line).map_err(|source| AuditError::Write { path: f.path.clone(), source })
    }

    /// Serializes `record` as one line (at most [`MAX_RECORD`] bytes) and appends it.
    pub fn append<T: Serialize + ?Sized>(&self, record: &T) -> Result<(), AuditError> {
        let line = encode_json(record, MAX_RECORD, &self.prefix)?;
        self.append_encoded(&line)
    }

    /// `fdatasync` of the current file, so settlement can delete a journal knowing its lines
    /// are on disk.
    pub fn sync(&self) -> Result<(), AuditError> {
        let f = self.file()?;
        f.file.sync_data().map_err(|source| AuditError::Write { path: f.path.clone(), source })
    }
}

/// One-off append of `record` to `<dir>/<prefix>-<today>.jsonl` (e.g. session records:
/// `append_record(&logs_dir, "sessions", &record)`). Long-lived writers keep a
/// [`JsonlAppender`] instead, which keeps the file open.
pub fn append_record<T: Serialize + ?Sized>(
    dir: &Path,
    prefix: &str,
    record: &T,
) -> Result<(), AuditError> {
    JsonlAppender::new(dir, prefix)?.append(record)
}

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
}

impl Drop for RepoLog {
    fn drop(&mut self) {
        if self.retire_on_drop.load(Ordering::Relaxed)
            && let Err(e) = self.journal.retire(self.audit.dir(), &self.audit)
        {
            // The journal stays (locked until our descriptor closes just after this), so the
            // next writer settles it.
            tracing::error!(error = %e, "cannot retire the audit journal");
        }
    }
}

impl RepoLog {
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
        let mut settled = SettleReport::default();
        let mut tries = 0;
        let journal = loop {
            settled.add(&settle_journals(audit.dir())?);
            match Journal::create(audit.dir(), boot) {
                Ok(j) => break j,
                // Our own boot's previous log of this directory is being dropped on another
                // thread right now (see LogRegistry); it deletes its journal in a moment.
                Err(AuditError::Journal { source, .. })
                    if source.kind() == io::ErrorKind::AlreadyExists && tries < 100 =>
                {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => return Err(e),
            }
        };
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

    fn append(&self, line: &AuditLine) -> Result<(), AuditError> {
        self.audit.append_encoded(&encode_line(line)?)
    }
}

/// The daemon's map from repo name to its [`RepoLog`] under `~/.airlock/logs/`, for one boot:
/// sessions of the same repo share one log (and so one `journal-<boot>.jsonl`); a repo's log is
/// closed when its last session's sink goes away and reopened on the next session.
#[derive(Debug)]
pub struct LogRegistry {
    root: PathBuf,
    boot: String,
    clock: Arc<dyn Clock>,
    logs: Mutex<HashMap<String, Weak<RepoLog>>>,
}

impl LogRegistry {
    /// `root` is `~/.airlock/logs` ([`crate::paths::Paths::logs_root`]).
    pub fn new(root: impl Into<PathBuf>, boot: &str) -> Self {
        Self::with_clock(root, boot, Arc::new(SystemClock))
    }

    pub fn with_clock(root: impl Into<PathBuf>, boot: &str, clock: Arc<dyn Clock>) -> Self {
        Self { root: root.into(), boot: boot.to_owned(), clock, logs: Mutex::new(HashMap::new()) }
    }

    pub fn boot(&self) -> &str {
        &self.boot
    }

    /// The live log of `repo` (a validated repo name), opening it if needed.
    pub fn repo_log(&self, repo: &str) -> Result<Arc<RepoLog>, AuditError> {
        let mut logs = self.logs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(log) = logs.get(repo).and_then(Weak::upgrade) {
            return Ok(log);
        }
        logs.retain(|_, w| w.strong_count() > 0);
        let log =
            RepoLog::open_with_clock(self.root.join(repo), &self.boot, Arc::clone(&self.clock))?;
        logs.insert(repo.to_owned(), Arc::downgrade(&log));
        Ok(log)
    }

    /// A sink for a new session of `info.repo`.
    pub fn session_sink(&self, info: SessionInfo) -> Result<FileAuditSink, AuditError> {
        Ok(FileAuditSink::new(self.repo_log(&info.repo)?, info))
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
}

impl FileAuditSink {
    pub fn new(log: Arc<RepoLog>, info: SessionInfo) -> Self {
        Self { log, info, id_prefix: new_id(), seq: AtomicU64::new(0) }
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
        self.log.append(line)
    }

    fn journal_open(&self, line: &AuditLine) -> Result<(), AuditError> {
        self.log.journal.open(line)
    }

    fn journal_close(&self, line: &AuditLine) -> Result<(), AuditError> {
        // Audit line first: if it fails the open record stays and a later writer settles it.
        self.log.append(line)?;
        self.log.journal.close(&line.id)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;
    use crate::audit::format::tests::sample;
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

    /// A short write is an error, never finished by a second write; the next line starts with
    /// a newline so only the fragment is lost. A full non-blocking pipe forces the short write.
    #[test]
    fn short_write_is_an_error_and_the_next_line_starts_clean() {
        use std::io::Read;
        let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).unwrap();
        let mut rx = File::from(rx);
        let f = DatedFile {
            day: 0,
            path: PathBuf::from("pipe"),
            file: File::from(tx),
            fragment: AtomicBool::new(false),
        };
        let big = vec![b'x'; 1 << 20]; // larger than any pipe buffer
        let err = f.write_line(&big).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WriteZero, "{err}");
        let mut drained = Vec::new();
        let mut buf = vec![0; 1 << 16];
        while let Ok(n) = rx.read(&mut buf) {
            if n == 0 {
                break;
            }
            drained.extend_from_slice(&buf[..n]);
        }
        assert!(!drained.is_empty() && drained.len() < big.len(), "one partial write only");
        f.write_line(b"{\"ok\":1}\n").unwrap();
        let n = rx.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"\n{\"ok\":1}\n");
        f.write_line(b"{}\n").unwrap();
        let n = rx.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"{}\n");
    }

    #[test]
    fn generic_appender_writes_session_records() {
        let tmp = tempfile::tempdir().unwrap();
        #[derive(Serialize)]
        struct Rec<'a> {
            id: &'a str,
            command: &'a str,
        }
        append_record(tmp.path(), "sessions", &Rec { id: "s:start", command: "a\nb" }).unwrap();
        append_record(tmp.path(), "sessions", &Rec { id: "s:end", command: "" }).unwrap();
        let date = utc_date(SystemTime::now());
        let text = std::fs::read_to_string(tmp.path().join(format!("sessions-{date}.jsonl")));
        let text = text.unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text.starts_with(r#"{"id":"s:start","command":"a\nb"}"#));
        let huge = "x".repeat(MAX_RECORD);
        let err = append_record(tmp.path(), "sessions", &Rec { id: "s:x", command: &huge });
        assert!(matches!(err, Err(AuditError::TooLarge { .. })));
    }
}
