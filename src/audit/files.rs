//! The dated JSONL files every audit record lives in: `<prefix>-<YYYY-MM-DD>.jsonl`, appended
//! with one `write(2)` per line on an `O_APPEND` descriptor ([`JsonlAppender`]), found again by
//! date ([`audit_files`]) and read back line by line ([`for_each_line`]). It knows nothing of
//! journals, settlement or sessions; those build on it.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;

use super::format::encode_json;
use super::{AuditError, utc_date};

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

/// `(date, path)` of every `audit-<YYYY-MM-DD>.jsonl` in `dir`, oldest first. A missing
/// directory has none.
pub fn audit_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, AuditError> {
    dated_files(dir, "audit")
}

/// `(date, path)` of every `<prefix>-<YYYY-MM-DD>.jsonl` in `dir`, oldest first. A missing
/// directory has none.
pub(crate) fn dated_files(dir: &Path, prefix: &str) -> Result<Vec<(String, PathBuf)>, AuditError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(AuditError::Read { path: dir.to_owned(), source }),
    };
    let mut files: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let date = file_date(&name, prefix)?.to_owned();
            Some((date, e.path()))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// The date of an audit file name (`audit-2026-07-24.jsonl` → `2026-07-24`).
#[cfg(test)]
pub(super) fn audit_date(name: &str) -> Option<&str> {
    file_date(name, "audit")
}

/// The date of a `<prefix>-<YYYY-MM-DD>.jsonl` file name.
fn file_date<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    let date = name.strip_prefix(prefix)?.strip_prefix('-')?.strip_suffix(".jsonl")?;
    let b = date.as_bytes();
    let shape = b.len() == 10
        && b.iter()
            .enumerate()
            .all(|(i, c)| if i == 4 || i == 7 { *c == b'-' } else { c.is_ascii_digit() });
    shape.then_some(date)
}

/// Calls `f` with each `\n`-terminated line of `file` (raw bytes: hostile lines need not be
/// UTF-8), the last one even without its newline.
pub(crate) fn for_each_line(
    file: impl std::io::Read,
    path: &Path,
    mut f: impl FnMut(&[u8]),
) -> Result<(), AuditError> {
    let mut reader = BufReader::new(file);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|source| AuditError::Read { path: path.to_owned(), source })?;
        if n == 0 {
            return Ok(());
        }
        f(&buf);
    }
}

/// Calls `f` on each line of `file` (without its newline; a final line without one too), from
/// the last line to the first, until `f` returns true; says whether it did. For records written
/// recently (a session's start record when it ends): the file is read from its end in
/// fixed-size blocks, so the cost follows the distance from the end, not the file's size.
pub(crate) fn rfind_line(
    file: &File,
    path: &Path,
    mut f: impl FnMut(&[u8]) -> bool,
) -> Result<bool, AuditError> {
    use std::os::unix::fs::FileExt;
    const BLOCK: u64 = 64 * 1024;
    let read_err = |source| AuditError::Read { path: path.to_owned(), source };
    let mut pos = file.metadata().map_err(read_err)?.len();
    // The start of a line whose beginning lies in a block not read yet.
    let mut carry: Vec<u8> = Vec::new();
    while pos > 0 {
        let start = pos.saturating_sub(BLOCK);
        let mut block = vec![0u8; (pos - start) as usize];
        file.read_exact_at(&mut block, start).map_err(read_err)?;
        block.extend_from_slice(&carry);
        pos = start;
        // Complete lines are those after a newline in this block (or all, at the file's start).
        let mut end = block.len();
        while let Some(nl) = block[..end].iter().rposition(|b| *b == b'\n') {
            let line = &block[nl + 1..end];
            if !line.is_empty() && f(line) {
                return Ok(true);
            }
            end = nl;
        }
        carry = block[..end].to_vec();
    }
    Ok(!carry.is_empty() && f(&carry))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Backwards, every line is seen once, in reverse order, whatever the block boundaries
    /// (lines longer than a block, a final line without a newline, blank lines skipped).
    #[test]
    fn rfind_line_sees_every_line_last_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.jsonl");
        let long = "x".repeat(150 * 1024);
        let mut lines: Vec<String> =
            (0..3000).map(|i| format!("line {i} {}", "y".repeat(i % 97))).collect();
        lines.insert(10, long.clone());
        lines.insert(2000, long);
        let text = format!("{}\n\ntorn tail", lines.join("\n"));
        std::fs::write(&path, &text).unwrap();
        let file = File::open(&path).unwrap();
        let mut seen: Vec<String> = Vec::new();
        let found = rfind_line(&file, &path, |l| {
            seen.push(String::from_utf8(l.to_vec()).unwrap());
            false
        })
        .unwrap();
        assert!(!found);
        let mut expected: Vec<String> = lines.clone();
        expected.push("torn tail".into());
        expected.reverse();
        assert_eq!(seen, expected);
        // It stops at the first match from the end.
        let mut n = 0;
        assert!(
            rfind_line(&file, &path, |l| {
                n += 1;
                l.starts_with(b"line 2999 ")
            })
            .unwrap()
        );
        assert_eq!(n, 2);
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "").unwrap();
        assert!(!rfind_line(&File::open(&empty).unwrap(), &empty, |_| true).unwrap());
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
