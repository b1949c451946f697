//! `airlock logs`: a checkout's audit trail from its directory under `~/.airlock/logs/` (found
//! by [`logdir`], no daemon needed), or every checkout's (`--all-repos`), as a table or as the
//! JSON lines themselves, with filters and `--follow`; `airlock logs sessions` lists sessions
//! (`super::logs_sessions`).

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use clap::Args;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::audit::{AuditLine, Entry, Follower, escape_for_terminal, logdir};
use crate::paths::Paths;
use crate::policy::Reason;
use crate::repo::{Repo, validate_repo_name};

use super::Context;

/// How often `--follow` looks for new lines and new date files.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct LogsArgs {
    #[command(subcommand)]
    pub command: Option<LogsCommand>,
    #[command(flatten)]
    pub which: WhichRepo,
    /// Only refused attempts
    #[arg(long, conflicts_with = "allowed")]
    pub denied: bool,
    /// Only allowed attempts (including in-flight and interrupted ones)
    #[arg(long)]
    pub allowed: bool,
    /// Only this host and its subdomains (e.g. `example.com` matches `api.example.com`)
    #[arg(long, value_name = "SUFFIX", value_parser = parse_host_suffix)]
    pub host: Option<String>,
    #[command(flatten)]
    pub window: TimeWindow,
    /// Only attempts of this session (the `session` field; `airlock logs sessions` lists them)
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Only attempts with this reason code (`not_allowed`, `private_address`, `allowed`, …;
    /// the codes are tabled in docs/audit-format.md)
    #[arg(long, value_name = "CODE", value_parser = parse_reason)]
    pub reason: Option<Reason>,
    /// Only attempts with this method (`CONNECT`, `GET`, `DNS`, …; any case)
    #[arg(long, value_name = "METHOD", value_parser = parse_method)]
    pub method: Option<String>,
    /// Keep printing new lines as they are written (across date rotation) until interrupted
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Print the JSON lines as written instead of a table (in-flight records get
    /// `"in_flight": true`)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum LogsCommand {
    /// List sessions from the session records: start, end, duration, exit, agent, command
    /// (a repo named `sessions` is given with `--repo-name sessions` or `--repo DIR`)
    Sessions(Box<SessionsArgs>),
}

/// Which checkout's log (shared by `airlock logs` and `airlock logs sessions`).
#[derive(Debug, Clone, Args)]
pub struct WhichRepo {
    /// The repo directory (default: the git top level of the working directory, else the
    /// working directory); its log directory is the one whose .repo-path names it
    #[arg(long, value_name = "DIR", conflicts_with_all = ["repo_name", "all_repos"])]
    pub repo: Option<PathBuf>,
    /// The log directory by name (`<name>` or `<name>-<key8>` under ~/.airlock/logs/)
    #[arg(long, value_name = "NAME", conflicts_with = "all_repos")]
    pub repo_name: Option<String>,
    /// Every checkout's log under ~/.airlock/logs/ (the table gains a REPO column)
    #[arg(long)]
    pub all_repos: bool,
}

/// `--since` / `--until`.
#[derive(Debug, Clone, Copy, Args)]
pub struct TimeWindow {
    /// Only entries since a duration ago (`2h`, `30m`, `1day`) or a time (RFC 3339, e.g.
    /// `2026-07-24T18:00:00Z`, or a UTC date `2026-07-24`), inclusive
    #[arg(long, value_name = "DURATION|TIME", value_parser = parse_since)]
    pub since: Option<Since>,
    /// Only entries before a duration ago or a time (same syntax as --since), exclusive: a date
    /// means its midnight, so `--since 2026-07-24 --until 2026-07-25` is that whole day
    #[arg(long, value_name = "DURATION|TIME", value_parser = parse_since)]
    pub until: Option<Since>,
}

impl TimeWindow {
    fn resolve(self, now: SystemTime) -> Window {
        Window {
            since: self.since.map(|s| s.cutoff(now)),
            until: self.until.map(|s| s.cutoff(now)),
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct SessionsArgs {
    #[command(flatten)]
    pub which: WhichRepo,
    #[command(flatten)]
    pub window: TimeWindow,
    /// Only this session
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// One JSON object per session instead of a table
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
    pub(super) fn cutoff(self, now: SystemTime) -> OffsetDateTime {
        match self {
            Self::Ago(d) => {
                OffsetDateTime::from(now.checked_sub(d).unwrap_or(SystemTime::UNIX_EPOCH))
            }
            Self::At(t) => t,
        }
    }
}

pub(super) fn parse_since(s: &str) -> Result<Since, String> {
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

fn parse_reason(s: &str) -> Result<Reason, String> {
    serde_json::from_value(serde_json::Value::String(s.trim().to_ascii_lowercase())).map_err(|_| {
        format!(
            "{s:?} is not a reason code (like not_allowed, private_address, allowed); \
                 docs/audit-format.md lists them all"
        )
    })
}

fn parse_method(s: &str) -> Result<String, String> {
    let m = s.trim();
    if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(format!("{s:?} is not a method (like CONNECT, GET or DNS)"));
    }
    Ok(m.to_ascii_uppercase())
}

/// `[since, until)`, resolved once.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    since: Option<OffsetDateTime>,
    until: Option<OffsetDateTime>,
}

impl Window {
    /// Whether the RFC 3339 time `ts` lies in the window; a time that cannot be read cannot be
    /// shown to lie in a window, and is shown only when there is none.
    fn contains(&self, ts: &str) -> bool {
        if self.since.is_none() && self.until.is_none() {
            return true;
        }
        let Ok(t) = OffsetDateTime::parse(ts, &Rfc3339) else { return false };
        self.since.is_none_or(|s| t >= s) && self.until.is_none_or(|u| t < u)
    }

    /// The first date file that can hold a line of the window.
    fn first_date(&self) -> Option<String> {
        self.since.map(|since| {
            let d = since.to_offset(time::UtcOffset::UTC).date();
            format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day())
        })
    }
}

/// What to show, decided once.
#[derive(Debug, Default)]
struct Filter {
    denied: bool,
    allowed: bool,
    host: Option<String>,
    window: Window,
    session: Option<String>,
    reason: Option<Reason>,
    method: Option<String>,
}

impl Filter {
    fn matches(&self, line: &AuditLine) -> bool {
        // `--denied`/`--allowed` select attempts; a gate's step lines are neither.
        let step = line.method == crate::proxy::gatehold::STEP_METHOD && line.gate.is_some();
        if (self.denied || self.allowed) && step {
            return false;
        }
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
        if self.session.as_ref().is_some_and(|s| *s != line.session) {
            return false;
        }
        if self.reason.is_some() && self.reason != line.reason {
            return false;
        }
        if self.method.as_ref().is_some_and(|m| !m.eq_ignore_ascii_case(&line.method)) {
            return false;
        }
        self.window.contains(&line.ts)
    }
}

/// Runs `airlock logs`; returns the exit code.
pub fn run(args: &LogsArgs, ctx: &Context<'_>) -> i32 {
    let result = match &args.command {
        Some(LogsCommand::Sessions(s)) => super::logs_sessions::sessions(s, ctx),
        None => logs(args, ctx),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("airlock: {e:#}");
            1
        }
    }
}

/// One log directory to read: its name under ~/.airlock/logs (the REPO column) and path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Source {
    pub label: String,
    pub dir: PathBuf,
}

/// Which directories a command reads, found through [`logdir`] like the daemon's writes.
#[derive(Debug)]
pub(super) enum Sources {
    /// Every log directory now (and, when following, any that appear).
    All { root: PathBuf },
    /// One directory, named or found by its `.repo-path`.
    One(Source),
    /// A checkout with no log directory yet: `what` names it for messages.
    NotYet { root: PathBuf, name: String, path: PathBuf },
}

impl Sources {
    pub(super) fn resolve(which: &WhichRepo, ctx: &Context<'_>) -> anyhow::Result<Self> {
        let paths = Paths::from_env(ctx.env)?;
        let root = paths.logs_root();
        if which.all_repos {
            return Ok(Self::All { root });
        }
        if let Some(name) = &which.repo_name {
            let name = validate_repo_name(name)?;
            return Ok(Self::One(Source { label: name.to_owned(), dir: root.join(name) }));
        }
        let repo = Repo::resolve(which.repo.as_deref(), &ctx.cwd)?;
        Ok(match logdir::locate(&root, &repo.name, &repo.path)? {
            Some(dir) => Self::One(Source { label: label_of(&dir), dir }),
            None => Self::NotYet { root, name: repo.name, path: repo.path },
        })
    }

    /// The directories to read now.
    pub(super) fn current(&mut self) -> anyhow::Result<Vec<Source>> {
        match self {
            Self::All { root } => Ok(logdir::all(root)?
                .into_iter()
                .map(|(dir, _)| Source { label: label_of(&dir), dir })
                .collect()),
            Self::One(s) => Ok(vec![s.clone()]),
            Self::NotYet { root, name, path } => match logdir::locate(root, name, path)? {
                Some(dir) => {
                    let s = Source { label: label_of(&dir), dir };
                    *self = Self::One(s.clone());
                    Ok(vec![s])
                }
                None => Ok(Vec::new()),
            },
        }
    }

    /// For messages: which log this is.
    pub(super) fn describe(&self) -> String {
        match self {
            Self::All { root } => format!("any repo ({})", root.display()),
            Self::One(s) => format!("repo {} ({})", s.label, s.dir.display()),
            Self::NotYet { name, path, .. } => format!("repo {name} ({})", path.display()),
        }
    }
}

fn label_of(dir: &Path) -> String {
    dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn logs(args: &LogsArgs, ctx: &Context<'_>) -> anyhow::Result<()> {
    let mut sources = Sources::resolve(&args.which, ctx)?;
    let filter = Filter {
        denied: args.denied,
        allowed: args.allowed,
        host: args.host.clone(),
        window: args.window.resolve(SystemTime::now()),
        session: args.session.clone(),
        reason: args.reason,
        method: args.method.clone(),
    };
    let all = matches!(sources, Sources::All { .. });
    let first = sources.current()?;
    let exists = first.iter().any(|s| s.dir.is_dir());
    if !exists && !args.follow {
        eprintln!("airlock: no audit log for {} yet", sources.describe());
        return Ok(());
    }
    let mut out = Printer {
        out: io::stdout().lock(),
        json: args.json,
        show_repo: all,
        shown: 0,
        broken: false,
    };
    out.header()?;
    let mut followers: Vec<(String, Follower)> = Vec::new();
    let add = |followers: &mut Vec<(String, Follower)>, found: Vec<Source>| {
        for s in found {
            if followers.iter().all(|(_, f)| f.dir() != s.dir) {
                let mut follower = Follower::new(&s.dir);
                if let Some(date) = filter.window.first_date() {
                    follower = follower.skip_files_before(&date);
                }
                followers.push((s.label, follower));
            }
        }
    };
    add(&mut followers, first);
    if !args.follow && followers.len() > 1 {
        // Several checkouts at once: one time-ordered listing.
        let mut entries = Vec::new();
        for (label, follower) in &mut followers {
            follower.poll(true, &mut |entry| {
                entries.push((label.clone(), entry));
                true
            })?;
        }
        entries.sort_by(|(_, a), (_, b)| entry_ts(a).cmp(entry_ts(b)));
        for (label, entry) in entries {
            if !out.entry(&label, entry, &filter) {
                return Ok(());
            }
        }
    } else {
        let mut waiting_said = false;
        loop {
            for (label, follower) in &mut followers {
                let result =
                    follower.poll(!args.follow, &mut |entry| out.entry(label, entry, &filter));
                if let Err(e) = result {
                    // --follow keeps going through a transient read error; a one-shot run
                    // reports it.
                    if !args.follow {
                        return Err(e.into());
                    }
                    eprintln!("airlock: {e}");
                }
                if out.broken {
                    return Ok(()); // the reader went away (e.g. `| head`)
                }
            }
            if out.out.flush().is_err() {
                return Ok(());
            }
            if !args.follow {
                break;
            }
            if !waiting_said && out.shown == 0 && !followers.iter().any(|(_, f)| f.dir().is_dir()) {
                eprintln!("airlock: waiting for the first audit line of {}", sources.describe());
                waiting_said = true;
            }
            std::thread::sleep(FOLLOW_INTERVAL);
            // New checkouts (--all-repos) or this checkout's first directory.
            match sources.current() {
                Ok(found) => add(&mut followers, found),
                Err(e) => eprintln!("airlock: {e:#}"),
            }
        }
    }
    if out.shown == 0 && !args.json {
        eprintln!("airlock: no matching entries for {}", sources.describe());
    }
    Ok(())
}

/// The time an entry sorts by (bad lines first: they are reported, not shown).
fn entry_ts(e: &Entry) -> &str {
    match e {
        Entry::Line { line, .. } | Entry::InFlight { line, .. } => &line.ts,
        Entry::Bad { .. } => "",
    }
}

struct Printer<W: Write> {
    out: W,
    json: bool,
    /// `--all-repos`: the table's first column names the log directory.
    show_repo: bool,
    shown: usize,
    broken: bool,
}

impl<W: Write> Printer<W> {
    fn header(&mut self) -> anyhow::Result<()> {
        if !self.json {
            if self.show_repo {
                write!(self.out, "{:<24} ", "REPO")?;
            }
            writeln!(
                self.out,
                "{:<24} {:<10} {:<32} {:<7} {:<7} {:>17} {:>8}  REASON",
                "TIME", "USER", "HOST", "METHOD", "VERDICT", "BYTES SENT/RECV", "DURATION"
            )?;
        }
        Ok(())
    }

    /// Prints one entry if it matches; returns false to stop reading (stdout closed).
    fn entry(&mut self, repo: &str, entry: Entry, filter: &Filter) -> bool {
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
                if self.json { writeln!(self.out, "{raw}") } else { self.row(repo, &line, false) }
            }
            Entry::InFlight { line, .. } => {
                if !filter.matches(&line) {
                    return true;
                }
                if self.json { self.in_flight_json(&line) } else { self.row(repo, &line, true) }
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

    fn row(&mut self, repo: &str, line: &AuditLine, in_flight: bool) -> io::Result<()> {
        if self.show_repo {
            write!(self.out, "{:<24} ", escape_for_terminal(repo))?;
        }
        let interrupted = line.interrupted == Some(true);
        let step =
            line.gate.as_ref().filter(|_| line.method == crate::proxy::gatehold::STEP_METHOD);
        // A phase switch is not an attempt either: it says which lists decide what follows.
        let switch = line.method == crate::daemon::service::phase::PHASE_METHOD;
        let verdict = if in_flight {
            "OPEN"
        } else if switch {
            "PHASE"
        } else if step.is_some() {
            // A gate's step is not an attempt: neither allowed nor denied.
            "GATE"
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
        let phase_name = |p: &Option<String>| {
            p.as_deref().map_or_else(|| "(none)".to_owned(), |p| escape_for_terminal(p).into())
        };
        if switch {
            reason.push_str(&format!(
                "phase {} (was {}) by {}",
                phase_name(&line.phase),
                phase_name(&line.previous),
                line.by.as_deref().map(escape_for_terminal).unwrap_or_default()
            ));
        } else if let Some(g) = step {
            reason.push_str(&format!("{} {}", g.step.as_str(), escape_for_terminal(&g.id)));
            if let Some(by) = &g.by {
                reason.push_str(&format!(" by {}", escape_for_terminal(by)));
            }
            if let Some(note) = &g.note {
                reason.push_str(&format!(": {}", escape_for_terminal(note)));
            }
        } else if in_flight {
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
        if let Some(p) = line.phase.as_deref().filter(|_| !switch) {
            reason.push_str(&format!(" [phase {}]", escape_for_terminal(p)));
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
    let info =
        SessionInfo { session: new_id(), repo, repo_path: None, repo_key: None, user_id: None };
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
        let f = |h: &str| Filter { host: Some(parse_host_suffix(h).unwrap()), ..Filter::default() };
        let with_host = |h: &str| AuditLine { host: h.into(), ..sample() };
        assert!(f("anthropic.com").matches(&with_host("api.anthropic.com")));
        assert!(f("ANTHROPIC.com.").matches(&with_host("anthropic.com")));
        assert!(f("*.anthropic.com").matches(&with_host("API.anthropic.com.")));
        assert!(!f("anthropic.com").matches(&with_host("evilanthropic.com")));
        assert!(!f("api.anthropic.com").matches(&with_host("anthropic.com")));
        assert!(parse_host_suffix(" ").is_err());
    }

    #[test]
    fn verdict_and_window_filters() {
        let deny = AuditLine { allowed: false, ..sample() };
        let allow = sample();
        let denied = Filter { denied: true, ..Filter::default() };
        assert!(denied.matches(&deny) && !denied.matches(&allow));
        let allowed = Filter { allowed: true, ..Filter::default() };
        assert!(allowed.matches(&allow) && !allowed.matches(&deny));
        let cutoff = time::macros::datetime!(2026-07-24 18:03:11.482 UTC);
        let window = |since, until| Filter { window: Window { since, until }, ..Filter::default() };
        assert!(window(Some(cutoff), None).matches(&allow)); // exactly at the cutoff
        let later = window(Some(cutoff + time::Duration::milliseconds(1)), None);
        assert!(!later.matches(&allow));
        let bad_ts = AuditLine { ts: "garbage".into(), ..sample() };
        assert!(!later.matches(&bad_ts));
        // --until is exclusive.
        assert!(!window(None, Some(cutoff)).matches(&allow));
        assert!(window(None, Some(cutoff + time::Duration::milliseconds(1))).matches(&allow));
        assert!(!window(None, Some(cutoff)).matches(&bad_ts));
        assert!(Filter::default().matches(&bad_ts));
    }

    #[test]
    fn session_reason_and_method_filters() {
        let line = sample(); // session s1, reason allowed, CONNECT
        let session = |s: &str| Filter { session: Some(s.into()), ..Filter::default() };
        assert!(session("s1").matches(&line) && !session("s2").matches(&line));
        let reason =
            |r: &str| Filter { reason: Some(parse_reason(r).unwrap()), ..Filter::default() };
        assert!(reason("allowed").matches(&line) && !reason("not_allowed").matches(&line));
        assert!(
            reason("NOT_ALLOWED")
                .matches(&AuditLine { reason: Some(Reason::NotAllowed), ..sample() })
        );
        let no_reason = AuditLine { reason: None, ..sample() };
        assert!(!reason("allowed").matches(&no_reason));
        let err = parse_reason("nope").unwrap_err();
        assert!(err.contains("docs/audit-format.md"), "{err}");
        let method =
            |m: &str| Filter { method: Some(parse_method(m).unwrap()), ..Filter::default() };
        assert!(method("connect").matches(&line) && !method("GET").matches(&line));
        assert!(parse_method("GE T").is_err() && parse_method("").is_err());
    }

    #[test]
    fn rows_escape_hostile_text() {
        let mut p =
            Printer { out: Vec::new(), json: false, show_repo: true, shown: 0, broken: false };
        let line = AuditLine {
            allowed: false,
            host: "evil\u{1b}]0;pwned\u{7}.test".into(),
            reason: Some(crate::policy::Reason::NotAllowed),
            ..sample()
        };
        p.row("evil\u{1b}[2J", &line, false).unwrap();
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
