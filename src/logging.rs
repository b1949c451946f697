//! The one `tracing` subscriber of every binary (`airlock`, `airlockd`, `airlockd proxy`,
//! `airlockd review`): each calls [`init`] once at start, so no warning or error is lost.
//!
//! - Where: stderr. Under systemd (`JOURNAL_STREAM` names our stderr, systemd.exec(5)) lines
//!   carry an sd-daemon(3) `<N>` priority prefix and no timestamp (journald adds its own);
//!   never ANSI colours.
//! - What: `AIRLOCK_LOG`, in `tracing_subscriber::EnvFilter` syntax (`warn`,
//!   `airlock::proxy=debug,info`); by default `warn` for the CLI and `info` for the daemons. A
//!   filter that does not parse is an error naming the variable, never a silent default.
//! - While the pty relay has the caller's terminal in raw mode ([`divert_while_raw`]), the
//!   CLI's events go to `~/.airlock/airlock.log` (append, 0600) instead, so the agent's TUI is
//!   never corrupted; when raw mode ends one line says how many warnings were written there.

use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::SystemTime;

use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

use crate::env::Env;
use crate::paths::Paths;

/// The filter variable.
pub const FILTER_VAR: &str = "AIRLOCK_LOG";

/// Set by systemd for a unit whose stderr/stdout go to the journal: `<device>:<inode>` of that
/// stream (systemd.exec(5) "Environment variables in spawned processes").
pub const JOURNAL_STREAM_VAR: &str = "JOURNAL_STREAM";

/// Test-only (`test-hooks`): emit one warning as soon as the terminal goes raw, so a test can
/// see where the CLI's events go during a session.
pub const TEST_WARN_WHILE_RAW_VAR: &str = "AIRLOCK_TEST_WARN_WHILE_RAW";

/// Which binary is logging: its name in lines and its default filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// `airlock`: interactive, so only warnings and errors by default.
    Cli,
    /// `airlockd` in any mode: a service's log, so `info` by default.
    Daemon,
}

impl Program {
    fn name(self) -> &'static str {
        match self {
            Self::Cli => "airlock",
            Self::Daemon => "airlockd",
        }
    }

    fn default_filter(self) -> &'static str {
        match self {
            Self::Cli => "warn",
            Self::Daemon => "info",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error(
        "{FILTER_VAR}={value:?} is not a valid log filter: {reason}; use a level \
         (error, warn, info, debug, trace) or target=level pairs such as \
         {FILTER_VAR}=airlock::proxy=debug,warn, or unset it"
    )]
    BadFilter { value: String, reason: String },
    #[error("{FILTER_VAR} is not valid UTF-8; set it to a level such as warn, or unset it")]
    NotUtf8,
    #[error("a log subscriber is already installed (logging::init called twice)")]
    AlreadyInstalled,
}

/// How lines are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    /// `airlock: warning: …` — a person reads it on their terminal (CLI).
    Terminal,
    /// `2026-07-24T18:03:11.482Z  WARN airlock::proxy: …` — a daemon's stderr in a file.
    Timestamped,
    /// `<4>airlock::proxy: …` — journald reads the priority and stamps the time itself.
    Journal,
}

/// What [`init`] decided from the environment (separate so it can be tested).
#[derive(Debug)]
struct Settings {
    filter: EnvFilter,
    style: Style,
}

fn settings(
    env: &dyn Env,
    program: Program,
    stderr_id: Option<(u64, u64)>,
) -> Result<Settings, LoggingError> {
    let directives = match env.var_os(FILTER_VAR) {
        None => program.default_filter().to_owned(),
        Some(raw) => match raw.into_string() {
            Ok(text) if text.trim().is_empty() => program.default_filter().to_owned(),
            Ok(text) => text,
            Err(_) => return Err(LoggingError::NotUtf8),
        },
    };
    let filter = EnvFilter::builder().parse(&directives).map_err(|e| LoggingError::BadFilter {
        value: directives.clone(),
        reason: e.to_string(),
    })?;
    let journal = env
        .var(JOURNAL_STREAM_VAR)
        .and_then(|v| parse_journal_stream(&v))
        .is_some_and(|id| stderr_id == Some(id));
    let style = match (journal, program) {
        (true, _) => Style::Journal,
        (false, Program::Cli) => Style::Terminal,
        (false, Program::Daemon) => Style::Timestamped,
    };
    Ok(Settings { filter, style })
}

/// `JOURNAL_STREAM`'s `<device>:<inode>`, both decimal.
fn parse_journal_stream(value: &str) -> Option<(u64, u64)> {
    let (dev, ino) = value.split_once(':')?;
    Some((dev.parse().ok()?, ino.parse().ok()?))
}

/// Device and inode of our stderr: systemd.exec(5) says to compare them with
/// `JOURNAL_STREAM`, since a child whose stderr was redirected inherits the variable.
fn stderr_id() -> Option<(u64, u64)> {
    let st = nix::sys::stat::fstat(io::stderr()).ok()?;
    Some((st.st_dev, st.st_ino))
}

/// Installs the process-wide subscriber. Call once, first thing in `main`.
pub fn init(env: &dyn Env, program: Program) -> Result<(), LoggingError> {
    let Settings { filter, style } = settings(env, program, stderr_id())?;
    if program == Program::Cli {
        let path = Paths::from_env(env).ok().map(|p| p.airlock_dir().join("airlock.log"));
        let shown = match (&path, env.var("HOME")) {
            (Some(p), Some(home)) => match p.strip_prefix(&home) {
                Ok(rel) => format!("~/{}", rel.display()),
                Err(_) => p.display().to_string(),
            },
            (Some(p), None) => p.display().to_string(),
            (None, _) => "~/.airlock/airlock.log".to_owned(),
        };
        let _ = RAW_LOG.set(RawLog {
            path,
            shown,
            #[cfg(feature = "test-hooks")]
            warn_on_entry: env.var(TEST_WARN_WHILE_RAW_VAR).is_some(),
        });
    }
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(Sink)
        .event_format(LineFormat { style, program: program.name() })
        .finish();
    tracing::subscriber::set_global_default(subscriber).map_err(|_| LoggingError::AlreadyInstalled)
}

/// The sd-daemon(3) priority prefix (syslog levels: 3 err, 4 warning, 6 info, 7 debug).
fn journal_priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

fn level_word(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

#[derive(Debug)]
struct LineFormat {
    style: Style,
    program: &'static str,
}

impl<S, N> FormatEvent<S, N> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let level = *meta.level();
        match self.style {
            Style::Journal => write!(w, "<{}>{}: ", journal_priority(level), meta.target())?,
            Style::Timestamped => write!(
                w,
                "{} {:>5} {}: ",
                crate::timefmt::rfc3339_ms(SystemTime::now()),
                level,
                meta.target()
            )?,
            Style::Terminal => {
                // In the diversion file a line needs its time; on the terminal it does not.
                if diverted() {
                    write!(w, "{} ", crate::timefmt::rfc3339_ms(SystemTime::now()))?;
                }
                write!(w, "{}: {}: ", self.program, level_word(level))?;
            }
        }
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// Where the CLI's events go while the terminal is raw (set by [`init`]).
#[derive(Debug)]
struct RawLog {
    /// `None` without a usable HOME: events are then counted as lost, never shown.
    path: Option<PathBuf>,
    /// How the summary line names it (`~/.airlock/airlock.log`).
    shown: String,
    #[cfg(feature = "test-hooks")]
    warn_on_entry: bool,
}

static RAW_LOG: OnceLock<RawLog> = OnceLock::new();

/// The diversion in force, if any.
#[derive(Debug)]
struct Diversion {
    path: Option<PathBuf>,
    file: Option<File>,
    /// Warnings and errors delivered to the file.
    written: usize,
    /// Warnings and errors that could not be (first error kept).
    lost: usize,
    error: Option<String>,
}

static DIVERSION: Mutex<Option<Diversion>> = Mutex::new(None);

fn diversion() -> std::sync::MutexGuard<'static, Option<Diversion>> {
    // A panic while holding the lock leaves nothing half-done that matters here.
    DIVERSION.lock().unwrap_or_else(PoisonError::into_inner)
}

fn diverted() -> bool {
    diversion().is_some()
}

/// Sends the CLI's events to `~/.airlock/airlock.log` until the returned guard is dropped,
/// which then prints one line on stderr saying how many warnings were written there. Called
/// by the pty relay when it puts the caller's terminal in raw mode; drop the guard after the
/// terminal is restored.
#[must_use = "events are diverted only while the guard lives"]
pub fn divert_while_raw() -> Diverted {
    let (path, shown) = match RAW_LOG.get() {
        Some(raw) => (raw.path.clone(), raw.shown.clone()),
        None => (None, "~/.airlock/airlock.log".to_owned()),
    };
    let guard = divert_to(path, shown);
    #[cfg(feature = "test-hooks")]
    if RAW_LOG.get().is_some_and(|r| r.warn_on_entry) {
        tracing::warn!("test hook: a warning while the terminal is raw");
    }
    guard
}

fn divert_to(path: Option<PathBuf>, shown: String) -> Diverted {
    *diversion() = Some(Diversion { path, file: None, written: 0, lost: 0, error: None });
    Diverted { shown, reported: false }
}

/// A diversion in force; see [`divert_while_raw`].
#[derive(Debug)]
pub struct Diverted {
    shown: String,
    reported: bool,
}

impl Diverted {
    /// Ends the diversion and returns the summary line, if any warning came in meanwhile.
    fn end(&mut self) -> Option<String> {
        self.reported = true;
        let d = diversion().take()?;
        let plural = |n: usize| if n == 1 { ("warning", "was") } else { ("warnings", "were") };
        match (d.written, d.lost) {
            (0, 0) => None,
            (n, 0) => {
                let (noun, verb) = plural(n);
                Some(format!(
                    "airlock: {n} {noun} during the session {verb} written to {}",
                    self.shown
                ))
            }
            (n, lost) => {
                let (noun, verb) = plural(lost);
                Some(format!(
                    "airlock: {lost} {noun} during the session {verb} lost ({n} written): cannot write {}: {}",
                    self.shown,
                    d.error.as_deref().unwrap_or("HOME is not set")
                ))
            }
        }
    }
}

impl Drop for Diverted {
    fn drop(&mut self) {
        if !self.reported
            && let Some(line) = self.end()
        {
            eprintln!("{line}");
        }
    }
}

/// The subscriber's writer: stderr, or the diversion file while one is in force.
#[derive(Debug, Clone, Copy)]
struct Sink;

/// One event's output; `counts` says whether it is a warning or an error.
#[derive(Debug)]
struct SinkWriter {
    counts: bool,
    counted: bool,
}

impl<'a> MakeWriter<'a> for Sink {
    type Writer = SinkWriter;

    fn make_writer(&'a self) -> SinkWriter {
        SinkWriter { counts: false, counted: false }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> SinkWriter {
        // fmt formats an event into one buffer and asks for one writer per event.
        SinkWriter { counts: *meta.level() <= Level::WARN, counted: false }
    }
}

impl Write for SinkWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut guard = diversion();
        let Some(d) = guard.as_mut() else {
            drop(guard);
            return io::stderr().write(buf);
        };
        let count = self.counts && !self.counted;
        self.counted = true;
        if d.file.is_none()
            && d.error.is_none()
            && let Some(path) = &d.path
        {
            match open_log(path) {
                Ok(f) => d.file = Some(f),
                Err(e) => d.error = Some(e.to_string()),
            }
        }
        let written = d.file.as_mut().map(|f| f.write_all(buf));
        match written {
            Some(Ok(())) => d.written += usize::from(count),
            Some(Err(e)) => {
                d.lost += usize::from(count);
                d.error.get_or_insert(e.to_string());
            }
            None => d.lost += usize::from(count),
        }
        // Never an error: a failed diversion is reported once raw mode ends, and stderr must
        // not be tried instead while the terminal is raw.
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `~/.airlock/airlock.log`, appended to, 0600 when created (`~/.airlock` 0700 if missing).
fn open_log(path: &std::path::Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    std::fs::OpenOptions::new().append(true).create(true).mode(0o600).open(path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;

    use super::*;
    use crate::env::MapEnv;

    /// A writer capturing every line, for the format tests.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl Write for Capture {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn lines_of(
        env: &MapEnv,
        program: Program,
        stderr: Option<(u64, u64)>,
        emit: impl FnOnce(),
    ) -> String {
        let Settings { filter, style } = settings(env, program, stderr).unwrap();
        let out = Capture::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .event_format(LineFormat { style, program: program.name() })
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    fn emit_all_levels() {
        tracing::error!(target: "airlock::proxy::http", "audit write failed, refusing x.test:80: disk full");
        tracing::warn!(target: "airlock::proxy", host = "x.test", "slow upstream");
        tracing::info!(target: "airlock::daemon", "session started");
        tracing::debug!(target: "airlock::daemon", "details");
    }

    #[test]
    fn defaults_are_warn_for_the_cli_and_info_for_the_daemon() {
        let cli = lines_of(&MapEnv::new(), Program::Cli, None, emit_all_levels);
        assert_eq!(
            cli,
            "airlock: error: audit write failed, refusing x.test:80: disk full\n\
             airlock: warning: slow upstream host=\"x.test\"\n"
        );
        let daemon = lines_of(&MapEnv::new(), Program::Daemon, None, emit_all_levels);
        let lines: Vec<&str> = daemon.lines().collect();
        assert_eq!(lines.len(), 3, "{daemon}");
        // `2026-07-24T18:03:11.482Z ERROR airlock::proxy::http: …`
        let (ts, rest) = lines[0].split_once(' ').unwrap();
        assert_eq!((ts.len(), ts.as_bytes()[10], ts.as_bytes()[23]), (24, b'T', b'Z'), "{ts}");
        assert_eq!(
            rest,
            "ERROR airlock::proxy::http: audit write failed, refusing x.test:80: disk full"
        );
        assert!(
            lines[1].ends_with("  WARN airlock::proxy: slow upstream host=\"x.test\""),
            "{daemon}"
        );
        assert!(lines[2].ends_with("  INFO airlock::daemon: session started"), "{daemon}");
    }

    #[test]
    fn airlock_log_filters_by_level_and_target() {
        let env = MapEnv::new().with(FILTER_VAR, "error,airlock::daemon=debug");
        let out = lines_of(&env, Program::Cli, None, emit_all_levels);
        assert_eq!(
            out,
            "airlock: error: audit write failed, refusing x.test:80: disk full\n\
             airlock: info: session started\n\
             airlock: debug: details\n"
        );
        // Empty counts as unset.
        let env = MapEnv::new().with(FILTER_VAR, "");
        assert_eq!(lines_of(&env, Program::Cli, None, emit_all_levels).lines().count(), 2);
    }

    #[test]
    fn a_bad_filter_is_an_error_naming_the_variable() {
        for bad in ["airlock=verbose", "airlock::proxy=loud,warn", "[{"] {
            let env = MapEnv::new().with(FILTER_VAR, bad);
            let err = settings(&env, Program::Daemon, None).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("AIRLOCK_LOG={bad:?} is not a valid log filter")),
                "{err}"
            );
            assert!(err.contains("or unset it"), "{err}");
        }
        use std::os::unix::ffi::OsStrExt;
        let env = MapEnv::new().with(FILTER_VAR, std::ffi::OsStr::from_bytes(b"\xff"));
        assert!(matches!(settings(&env, Program::Cli, None), Err(LoggingError::NotUtf8)));
    }

    #[test]
    fn under_journald_lines_carry_a_priority_and_no_timestamp() {
        let env = MapEnv::new().with(JOURNAL_STREAM_VAR, "8:12345");
        let out = lines_of(&env, Program::Daemon, Some((8, 12345)), emit_all_levels);
        assert_eq!(
            out,
            "<3>airlock::proxy::http: audit write failed, refusing x.test:80: disk full\n\
             <4>airlock::proxy: slow upstream host=\"x.test\"\n\
             <6>airlock::daemon: session started\n"
        );
        // Inherited by a process whose stderr is elsewhere: not the journal.
        let out = lines_of(&env, Program::Daemon, Some((8, 999)), emit_all_levels);
        assert!(!out.starts_with('<'), "{out}");
        let junk = MapEnv::new().with(JOURNAL_STREAM_VAR, "eight:twelve");
        assert!(!lines_of(&junk, Program::Daemon, Some((8, 12)), emit_all_levels).starts_with('<'));
    }

    /// The only test that diverts (the diversion is process-wide).
    #[test]
    fn while_diverted_events_go_to_the_file_and_are_counted() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("home/.airlock/airlock.log");
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new("info"))
            .with_ansi(false)
            .with_writer(Sink)
            .event_format(LineFormat { style: Style::Terminal, program: "airlock" })
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let mut guard = divert_to(Some(path.clone()), "~/.airlock/airlock.log".into());
            tracing::warn!("first");
            tracing::info!("not counted, still written");
            tracing::error!("second");
            assert_eq!(
                guard.end().as_deref(),
                Some(
                    "airlock: 2 warnings during the session were written to ~/.airlock/airlock.log"
                )
            );
            let text = std::fs::read_to_string(&path).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), 3, "{text}");
            assert!(lines[0].ends_with("Z airlock: warning: first"), "{text}");
            assert!(lines[2].ends_with("Z airlock: error: second"), "{text}");
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            let dir_mode = std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode();
            assert_eq!(dir_mode & 0o777, 0o700);

            // Nothing came in: no line. One warning: singular.
            assert_eq!(divert_to(Some(path.clone()), "L".into()).end(), None);
            let mut guard = divert_to(Some(path.clone()), "L".into());
            tracing::warn!("third");
            assert_eq!(
                guard.end().as_deref(),
                Some("airlock: 1 warning during the session was written to L")
            );
            assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 4, "appended");

            // An unwritable place: counted as lost and said so, never sent to the terminal.
            let mut guard =
                divert_to(Some(tmp.path().join("home/.airlock/airlock.log/x")), "L".into());
            tracing::warn!("fourth");
            let line = guard.end().unwrap();
            assert!(
                line.starts_with(
                    "airlock: 1 warning during the session was lost (0 written): cannot write L: "
                ),
                "{line}"
            );
            let mut guard = divert_to(None, "L".into());
            tracing::warn!("fifth");
            assert!(guard.end().unwrap().ends_with("cannot write L: HOME is not set"));
        });
        assert!(!diverted());
    }
}
