//! `airlock logs`: the repo's audit trail from the files under `~/.airlock/logs/<repo>/` (no
//! daemon needed), as a table or as the JSON lines themselves, with filters and `--follow`.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use clap::Args;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::audit::{AuditLine, Entry, Follower, escape_for_terminal};
use crate::paths::Paths;
use crate::repo::{Repo, validate_repo_name};

use super::Context;

/// How often `--follow` looks for new lines and new date files.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Args)]
pub struct LogsArgs {
    /// The repo directory (default: the git top level of the working directory, else the
    /// working directory)
    #[arg(long, value_name = "DIR", conflicts_with = "repo_name")]
    pub repo: Option<PathBuf>,
    /// The repo by name (the directory under ~/.airlock/logs/)
    #[arg(long, value_name = "NAME")]
    pub repo_name: Option<String>,
    /// Only refused attempts
    #[arg(long, conflicts_with = "allowed")]
    pub denied: bool,
    /// Only allowed attempts (including in-flight and interrupted ones)
    #[arg(long)]
    pub allowed: bool,
    /// Only this host and its subdomains (e.g. `example.com` matches `api.example.com`)
    #[arg(long, value_name = "SUFFIX", value_parser = parse_host_suffix)]
    pub host: Option<String>,
    /// Only attempts since a duration ago (`2h`, `30m`, `1day`) or a time (RFC 3339, e.g.
    /// `2026-07-24T18:00:00Z`, or a UTC date `2026-07-24`)
    #[arg(long, value_name = "DURATION|TIME", value_parser = parse_since)]
    pub since: Option<Since>,
    /// Keep printing new lines as they are written (across date rotation) until interrupted
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Print the JSON lines as written instead of a table (in-flight records get
    /// `"in_flight": true`)
    #[arg(long)]
    pub json: bool,
}

/// `--since`, resolved against the clock when the command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since {
    Ago(Duration),
    At(OffsetDateTime),
}

impl Since {
    fn cutoff(self, now: SystemTime) -> OffsetDateTime {
        match self {
            Self::Ago(d) => {
                OffsetDateTime::from(now.checked_sub(d).unwrap_or(SystemTime::UNIX_EPOCH))
            }
            Self::At(t) => t,
        }
    }
}

fn parse_since(s: &str) -> Result<Since, String> {
    if let Ok(t) = OffsetDateTime::parse(s, &Rfc3339) {
        return Ok(Since::At(t));
    }
    let date_fmt = time::macros::format_description!("[year]-[month]-[day]");
    if let Ok(d) = time::Date::parse(s, date_fmt) {
        return Ok(Since::At(d.midnight().assume_utc()));
    }
    humantime::parse_duration(s).map(Since::Ago).map_err(|_| {
        format!(
            "{s:?} is neither a duration (like 2h, 30m, 1day) nor a time (RFC 3339 like \
             2026-07-24T18:00:00Z, or a date like 2026-07-24)"
        )
    })
}

fn parse_host_suffix(s: &str) -> Result<String, String> {
    let norm = s.trim().trim_end_matches('.').trim_start_matches("*.").trim_start_matches('.');
    if norm.is_empty() || norm.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(format!("{s:?} is not a host name or suffix (like example.com)"));
    }
    Ok(norm.to_ascii_lowercase())
}

/// What to show, decided once.
#[derive(Debug)]
struct Filter {
    denied: bool,
    allowed: bool,
    host: Option<String>,
    since: Option<OffsetDateTime>,
}

impl Filter {
    fn matches(&self, line: &AuditLine) -> bool {
        if (self.denied && line.allowed) || (self.allowed && !line.allowed) {
            return false;
        }
        if let Some(suffix) = &self.host {
            let host = line.host.trim_end_matches('.').to_ascii_lowercase();
            let sub = host.len() > suffix.len()
                && host.ends_with(suffix.as_str())
                && host.as_bytes()[host.len() - suffix.len() - 1] == b'.';
            if host != *suffix && !sub {
                return false;
            }
        }
        if let Some(since) = self.since {
            // A line whose time cannot be read cannot be shown to be recent.
            match OffsetDateTime::parse(&line.ts, &Rfc3339) {
                Ok(ts) if ts >= since => {}
                _ => return false,
            }
        }
        true
    }
}

/// Runs `airlock logs`; returns the exit code.
pub fn run(args: &LogsArgs, ctx: &Context<'_>) -> i32 {
    match logs(args, ctx) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("airlock: {e:#}");
            1
        }
    }
}

fn repo_name(args: &LogsArgs, cwd: &Path) -> anyhow::Result<String> {
    if let Some(name) = &args.repo_name {
        return Ok(validate_repo_name(name)?.to_owned());
    }
    Ok(Repo::resolve(args.repo.as_deref(), cwd)?.name)
}

fn logs(args: &LogsArgs, ctx: &Context<'_>) -> anyhow::Result<()> {
    let paths = Paths::from_env(ctx.env)?;
    let name = repo_name(args, &ctx.cwd)?;
    let dir = paths.logs_dir(&name);
    let filter = Filter {
        denied: args.denied,
        allowed: args.allowed,
        host: args.host.clone(),
        since: args.since.map(|s| s.cutoff(SystemTime::now())),
    };
    if !dir.is_dir() && !args.follow {
        eprintln!("airlock: no audit log for repo {name} yet ({})", dir.display());
        return Ok(());
    }
    let mut out = Printer { out: io::stdout().lock(), json: args.json, shown: 0, broken: false };
    out.header()?;
    let mut follower = Follower::new(&dir);
    if let Some(since) = filter.since {
        let d = since.to_offset(time::UtcOffset::UTC).date();
        let date = format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day());
        follower = follower.skip_files_before(&date);
    }
    let mut first = true;
    loop {
        let result = follower.poll(!args.follow, &mut |entry| out.entry(entry, &filter));
        if let Err(e) = result {
            // --follow keeps going through a transient read error; a one-shot run reports it.
            if !args.follow {
                return Err(e.into());
            }
            eprintln!("airlock: {e}");
        }
        if out.broken {
            return Ok(()); // the reader went away (e.g. `| head`)
        }
        if out.out.flush().is_err() {
            return Ok(());
        }
        if !args.follow {
            break;
        }
        if first && out.shown == 0 && !dir.is_dir() {
            eprintln!("airlock: waiting for repo {name}'s first audit line ({})", dir.display());
        }
        first = false;
        std::thread::sleep(FOLLOW_INTERVAL);
    }
    if out.shown == 0 && !args.json {
        eprintln!("airlock: no matching entries in {}", dir.display());
    }
    Ok(())
}

struct Printer<W: Write> {
    out: W,
    json: bool,
    shown: usize,
    broken: bool,
}

impl<W: Write> Printer<W> {
    fn header(&mut self) -> anyhow::Result<()> {
        if !self.json {
            writeln!(
                self.out,
                "{:<24} {:<10} {:<32} {:<7} {:<7} {:>17} {:>8}  REASON",
                "TIME", "USER", "HOST", "METHOD", "VERDICT", "BYTES SENT/RECV", "DURATION"
            )?;
        }
        Ok(())
    }

    /// Prints one entry if it matches; returns false to stop reading (stdout closed).
    fn entry(&mut self, entry: Entry, filter: &Filter) -> bool {
        let result = match entry {
            Entry::Bad { file, lineno, error, .. } => {
                eprintln!(
                    "airlock: {}:{lineno}: skipping a line that is not an audit line: {error}",
                    file.display()
                );
                return true;
            }
            Entry::Line { raw, line, .. } => {
                if !filter.matches(&line) {
                    return true;
                }
                if self.json { writeln!(self.out, "{raw}") } else { self.row(&line, false) }
            }
            Entry::InFlight { line, .. } => {
                if !filter.matches(&line) {
                    return true;
                }
                if self.json { self.in_flight_json(&line) } else { self.row(&line, true) }
            }
        };
        if result.is_err() {
            self.broken = true;
            return false;
        }
        self.shown += 1;
        true
    }

    fn in_flight_json(&mut self, line: &AuditLine) -> io::Result<()> {
        #[derive(serde::Serialize)]
        struct InFlight<'a> {
            #[serde(flatten)]
            line: &'a AuditLine,
            in_flight: bool,
        }
        let json =
            serde_json::to_string(&InFlight { line, in_flight: true }).map_err(io::Error::other)?;
        writeln!(self.out, "{json}")
    }

    fn row(&mut self, line: &AuditLine, in_flight: bool) -> io::Result<()> {
        let interrupted = line.interrupted == Some(true);
        let verdict = if in_flight {
            "OPEN"
        } else if interrupted {
            "INTR"
        } else if line.allowed {
            "ALLOW"
        } else {
            "DENY"
        };
        let user: String = line
            .user_id
            .as_deref()
            .map(|u| escape_for_terminal(u).chars().take(10).collect())
            .unwrap_or_else(|| "-".into());
        let bytes = match (line.bytes_sent, line.bytes_recv) {
            (None, None) => "-".to_owned(),
            (s, r) => format!("{}/{}", num(s), num(r)),
        };
        let duration = line.duration_ms.map(human_ms).unwrap_or_else(|| "-".into());
        let mut reason = String::new();
        if in_flight {
            reason.push_str("in flight (or its writer died and it is not settled yet)");
        } else if interrupted {
            reason.push_str("interrupted: its writer died while it was open");
        } else if !line.allowed {
            if let Some(r) = line.reason {
                reason.push_str(r.as_str());
            }
            match (line.layer, &line.policy) {
                (Some(layer), Some(policy)) => {
                    reason.push_str(&format!(" ({layer}: {})", escape_for_terminal(policy)))
                }
                (Some(layer), None) => reason.push_str(&format!(" ({layer})")),
                _ => {}
            }
        } else if let Some(status) = line.status {
            reason.push_str(&format!("HTTP {status}"));
        }
        if line.truncated == Some(true) {
            reason.push_str(" [truncated]");
        }
        let host = crate::audit::format_host_port(line);
        writeln!(
            self.out,
            "{:<24} {:<10} {:<32} {:<7} {:<7} {:>17} {:>8}  {}",
            escape_for_terminal(&line.ts),
            user,
            host,
            escape_for_terminal(&line.method),
            verdict,
            bytes,
            duration,
            reason.trim_start()
        )
    }
}

fn num(n: Option<u64>) -> String {
    n.map_or_else(|| "?".to_owned(), |n| n.to_string())
}

fn human_ms(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        _ => format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000),
    }
}

/// Test-only: `airlock __audit-hold` plays a writer that dies mid-tunnel. It opens the repo's
/// log as writer `--boot`, leaves `--open N` allowed attempts in flight in its journal (and
/// closes one complete attempt), prints each in-flight id and then `ready`, and sleeps until
/// killed. Compiled only with `test-hooks` and hidden from `--help`.
#[cfg(feature = "test-hooks")]
#[derive(Debug, Clone, Args)]
pub struct AuditHoldArgs {
    #[arg(long)]
    pub log_dir: PathBuf,
    #[arg(long)]
    pub boot: String,
    #[arg(long, default_value = "1")]
    pub open: usize,
}

#[cfg(feature = "test-hooks")]
pub fn audit_hold(args: &AuditHoldArgs) -> i32 {
    use crate::audit::{AuditSink, FileAuditSink, SessionInfo, new_id};
    let repo =
        args.log_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let info = SessionInfo { session: new_id(), repo, repo_path: None, user_id: None };
    let sink = match FileAuditSink::open(&args.log_dir, &args.boot, info) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("airlock: {e}");
            return 1;
        }
    };
    let run = || -> Result<(), crate::audit::AuditError> {
        let mut done = sink.line("done.test", Some(443), "CONNECT");
        done.allowed = true;
        sink.journal_open(&done)?;
        done.bytes_sent = Some(1);
        done.bytes_recv = Some(2);
        done.duration_ms = Some(3);
        sink.journal_close(&done)?;
        let mut out = io::stdout().lock();
        for i in 0..args.open {
            let mut line = sink.line(&format!("held-{i}.test"), Some(443), "CONNECT");
            line.allowed = true;
            line.reason = Some(crate::policy::Reason::Allowed);
            sink.journal_open(&line)?;
            let _ = writeln!(out, "{}", line.id);
        }
        let _ = writeln!(out, "ready");
        let _ = out.flush();
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("airlock: {e}");
        return 1;
    }
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::audit::test_sample_line as sample;

    #[test]
    fn since_accepts_durations_times_and_dates() {
        assert_eq!(parse_since("2h").unwrap(), Since::Ago(Duration::from_secs(7200)));
        let at = parse_since("2026-07-24T18:00:00Z").unwrap();
        assert_eq!(at, Since::At(time::macros::datetime!(2026-07-24 18:00 UTC)));
        let day = parse_since("2026-07-24").unwrap();
        assert_eq!(day, Since::At(time::macros::datetime!(2026-07-24 0:00 UTC)));
        let err = parse_since("yesterday-ish").unwrap_err();
        assert!(err.contains("2h") && err.contains("RFC 3339"), "{err}");
    }

    #[test]
    fn host_filter_matches_the_name_and_subdomains_only() {
        let f = |h: &str| Filter {
            denied: false,
            allowed: false,
            host: Some(parse_host_suffix(h).unwrap()),
            since: None,
        };
        let with_host = |h: &str| AuditLine { host: h.into(), ..sample() };
        assert!(f("anthropic.com").matches(&with_host("api.anthropic.com")));
        assert!(f("ANTHROPIC.com.").matches(&with_host("anthropic.com")));
        assert!(f("*.anthropic.com").matches(&with_host("API.anthropic.com.")));
        assert!(!f("anthropic.com").matches(&with_host("evilanthropic.com")));
        assert!(!f("api.anthropic.com").matches(&with_host("anthropic.com")));
        assert!(parse_host_suffix(" ").is_err());
    }

    #[test]
    fn verdict_and_since_filters() {
        let deny = AuditLine { allowed: false, ..sample() };
        let allow = sample();
        let none = Filter { denied: false, allowed: false, host: None, since: None };
        let denied = Filter { denied: true, ..none };
        assert!(denied.matches(&deny) && !denied.matches(&allow));
        let allowed = Filter { denied: false, allowed: true, host: None, since: None };
        assert!(allowed.matches(&allow) && !allowed.matches(&deny));
        let cutoff = time::macros::datetime!(2026-07-24 18:03:11.482 UTC);
        let since = Filter { denied: false, allowed: false, host: None, since: Some(cutoff) };
        assert!(since.matches(&allow)); // exactly at the cutoff
        let later = Filter { since: Some(cutoff + time::Duration::milliseconds(1)), ..since };
        assert!(!later.matches(&allow));
        let bad_ts = AuditLine { ts: "garbage".into(), ..sample() };
        assert!(!later.matches(&bad_ts));
    }

    #[test]
    fn rows_escape_hostile_text() {
        let mut p = Printer { out: Vec::new(), json: false, shown: 0, broken: false };
        let line = AuditLine {
            allowed: false,
            host: "evil\u{1b}]0;pwned\u{7}.test".into(),
            reason: Some(crate::policy::Reason::NotAllowed),
            ..sample()
        };
        p.row(&line, false).unwrap();
        let text = String::from_utf8(p.out).unwrap();
        assert!(!text.contains('\u{1b}') && !text.contains('\u{7}'), "{text:?}");
        assert!(text.contains("DENY") && text.contains("not_allowed (repo: .airlock.toml)"));
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human_ms(0), "0ms");
        assert_eq!(human_ms(2311), "2.3s");
        assert_eq!(human_ms(61_000), "1m01s");
    }
}
