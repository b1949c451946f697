//! `airlock publish [--repo DIR | --all] [--since DUR|TIME] [--dry-run] [--json]`: the
//! arguments, the review-plane client from `airlock login --server`, and the output (a progress
//! bar on a terminal, a one-line summary otherwise, or the `--json` object). The work is
//! [`crate::publish`]; docs/publish.md is the user's reference.

use std::cell::OnceCell;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::SystemTime;

use clap::Args;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::paths::Paths;
use crate::publish::{self, PublishError, PublishOptions, PublishReport, Scope};

use super::Context;

/// Exit status when no review-plane login exists (nothing to publish to).
pub const NOT_LOGGED_IN: i32 = 125;

#[derive(Debug, Clone, Args)]
pub struct PublishArgs {
    /// The repo directory (default: the git top level of the working directory, else the
    /// working directory)
    #[arg(long, value_name = "DIR", conflicts_with = "all")]
    pub repo: Option<PathBuf>,
    /// Every repo's logs and every agent home's transcripts
    #[arg(long)]
    pub all: bool,
    /// Only lines whose ts is at or after a duration ago (`2h`, `1day`) or a time (RFC 3339,
    /// or a UTC date); a one-off view that does not advance the publish state
    #[arg(long, value_name = "DURATION|TIME", value_parser = parse_since)]
    pub since: Option<SinceArg>,
    /// Show per file what would be sent; send nothing, record nothing (no login needed)
    #[arg(long)]
    pub dry_run: bool,
    /// Print one JSON object: {"created","duplicate","conflict","rejected","files","bytes",…}
    #[arg(long)]
    pub json: bool,
}

/// `--since`, resolved when the command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinceArg {
    Ago(std::time::Duration),
    At(OffsetDateTime),
}

fn parse_since(s: &str) -> Result<SinceArg, String> {
    if let Ok(t) = OffsetDateTime::parse(s, &Rfc3339) {
        return Ok(SinceArg::At(t));
    }
    let date_fmt = time::macros::format_description!("[year]-[month]-[day]");
    if let Ok(d) = time::Date::parse(s, date_fmt) {
        return Ok(SinceArg::At(d.midnight().assume_utc()));
    }
    humantime::parse_duration(s).map(SinceArg::Ago).map_err(|_| {
        format!(
            "{s:?} is neither a duration (like 2h, 30m, 1day) nor a time (RFC 3339 like \
             2026-07-24T18:00:00Z, or a date like 2026-07-24)"
        )
    })
}

impl SinceArg {
    fn cutoff(self, now: SystemTime) -> OffsetDateTime {
        match self {
            Self::Ago(d) => {
                OffsetDateTime::from(now.checked_sub(d).unwrap_or(SystemTime::UNIX_EPOCH))
            }
            Self::At(t) => t,
        }
    }
}

/// Runs `airlock publish`; returns the exit code.
pub fn run(args: &PublishArgs, ctx: &Context<'_>) -> i32 {
    let paths = match Paths::from_env(ctx.env) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("airlock: {e}");
            return 1;
        }
    };
    let scope = if args.all {
        Scope::All
    } else {
        let dir = args.repo.clone().map(|d| if d.is_absolute() { d } else { ctx.cwd.join(d) });
        match crate::repo::Repo::resolve(dir.as_deref(), &ctx.cwd) {
            Ok(repo) => Scope::Repo(repo.path),
            Err(e) => {
                eprintln!("airlock: {e}");
                return 1;
            }
        }
    };
    let opts = PublishOptions {
        scope,
        since: args.since.map(|s| s.cutoff(SystemTime::now())),
        dry_run: args.dry_run,
        deadline: None,
        progress: !args.json && std::io::stderr().is_terminal(),
    };
    let result = if args.dry_run {
        // A dry run reads and counts only: no login, no network.
        publish::publish(&paths, &publish::NullSink, &opts)
    } else {
        if !publish::state::server_login(&paths.airlock_dir()) {
            eprintln!(
                "airlock: not logged in to a review server; run `airlock login --server URL` \
                 first (see docs/publish.md)"
            );
            return NOT_LOGGED_IN;
        }
        // Built at the first upload: a run where nothing changed makes no connection and
        // loads no TLS roots (unless a pinned log key asks for the witness step).
        let client = LazyClient { paths: &paths, client: OnceCell::new() };
        let result = publish::publish(&paths, &client, &opts);
        match result {
            Ok(report) => {
                let witnessed = witness_step(&paths, &client, &report, None);
                return finish(&report, witnessed, args);
            }
            Err(e) => Err(e),
        }
    };
    match result {
        Ok(report) => {
            print_report(&report, args, None);
            0
        }
        Err(e @ PublishError::Unauthorized(_)) => {
            eprintln!("airlock: {e}");
            1
        }
        Err(e) => {
            eprintln!("airlock: {e}");
            1
        }
    }
}

/// The review-plane client of `airlock login --server`, made when first needed.
struct LazyClient<'a> {
    paths: &'a Paths,
    client: OnceCell<crate::remote::Client>,
}

impl LazyClient<'_> {
    fn get(&self) -> Result<&crate::remote::Client, crate::remote::RemoteError> {
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        let c = crate::remote::Client::from_login(self.paths)?;
        Ok(self.client.get_or_init(|| c))
    }
}

/// Exit status when the witness step finds the review log inconsistent (docs/evidence.md).
pub const INCONSISTENT: i32 = 125;

/// The witness step after the uploads ([`publish::witness`]), when a log key is pinned:
/// `Ok(None)` when none is.
fn witness_step(
    paths: &Paths,
    client: &LazyClient<'_>,
    report: &PublishReport,
    deadline: Option<std::time::Instant>,
) -> Result<Option<publish::witness::WitnessReport>, publish::witness::WitnessError> {
    use publish::witness::{Witness, WitnessError, witness};
    let Ok(Some(id)) = crate::config::identity::read(&paths.identity_file()) else {
        return Ok(None);
    };
    let Some(key_text) = id.log_key.as_deref() else { return Ok(None) };
    let key = crate::tlog::note::NoteVerifier::parse(key_text).map_err(|e| {
        WitnessError::Transient(format!(
            "the pinned log key in ~/.airlock/identity.toml is not a key ({e}); run `airlock \
             login --server URL` again"
        ))
    })?;
    let c = client.get().map_err(|e| WitnessError::Transient(e.to_string()))?;
    let mut warnings = Vec::new();
    let signer = match crate::config::machine_key::load_or_create(paths) {
        Ok(s) => Some(s),
        Err(e) => {
            warnings.push(format!("the checkpoint is not cosigned: {e}"));
            None
        }
    };
    let now =
        SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let air = paths.airlock_dir();
    let w = Witness {
        airlock_dir: &air,
        key: &key,
        signer: signer.as_ref(),
        fresh: &report.fresh_receipts,
        answer_checkpoints: &report.answer_checkpoints,
        now,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| WitnessError::Transient(format!("cannot start its runtime: {e}")))?;
    let result = rt.block_on(async {
        match deadline {
            Some(d) => {
                tokio::time::timeout_at(d.into(), witness(c, &w)).await.unwrap_or_else(|_| {
                    Err(WitnessError::Transient("the [publish] timeout passed".into()))
                })
            }
            None => witness(c, &w).await,
        }
    });
    result.map(|mut r| {
        r.warnings.extend(warnings);
        Some(r)
    })
}

/// Prints the run's report and the witness step's outcome; the exit status.
fn finish(
    report: &PublishReport,
    witnessed: Result<Option<publish::witness::WitnessReport>, publish::witness::WitnessError>,
    args: &PublishArgs,
) -> i32 {
    use publish::witness::WitnessError;
    match witnessed {
        Ok(w) => {
            print_report(report, args, w.as_ref());
            0
        }
        Err(WitnessError::Inconsistent(i)) => {
            print_report(report, args, None);
            eprintln!("{}", i.message());
            if args.json {
                let v = serde_json::json!({"inconsistent": *i});
                println!("{v}");
            }
            INCONSISTENT
        }
        Err(e) => {
            print_report(report, args, None);
            eprintln!("airlock: the uploads are done, but {e}");
            1
        }
    }
}

impl publish::Sink for LazyClient<'_> {
    async fn post(
        &self,
        gz: bytes::Bytes,
        items: usize,
    ) -> Result<publish::Reply, publish::SinkError> {
        let client =
            self.get().map_err(|e| publish::SinkError::Fatal { message: e.to_string() })?;
        client.post(gz, items).await
    }
}

fn print_report(
    r: &PublishReport,
    args: &PublishArgs,
    log: Option<&publish::witness::WitnessReport>,
) {
    let mut err = std::io::stderr().lock();
    for s in &r.skipped {
        let _ = writeln!(err, "airlock publish: skipped {s}");
    }
    for f in &r.rewritten {
        let _ = writeln!(
            err,
            "airlock publish: rewritten transcript {f}: its changed lines are stored as \
             conflicts (see ~/.airlock/publish/rejected.jsonl)"
        );
    }
    for w in &r.warnings {
        let _ = writeln!(err, "airlock publish: warning: {w}");
    }
    if r.incomplete {
        let _ = writeln!(
            err,
            "airlock publish: stopped at the deadline; the rest goes with the next publish"
        );
    }
    if let Some(w) = log {
        for warning in &w.warnings {
            let _ = writeln!(err, "airlock publish: warning: {warning}");
        }
    }
    drop(err);
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut v = serde_json::to_value(r).unwrap_or_default();
        if let (Some(obj), Some(w)) = (v.as_object_mut(), log) {
            obj.insert("log".into(), serde_json::to_value(w).unwrap_or_default());
        }
        let _ = writeln!(out, "{v}");
        return;
    }
    if args.dry_run {
        for f in &r.would_send {
            let _ = writeln!(out, "{}\t{} lines\t{} bytes", f.file, f.lines, f.bytes);
        }
        let _ = writeln!(
            out,
            "dry run: would send {} items from {} files; nothing sent",
            r.items, r.files
        );
        return;
    }
    let mut line = format!(
        "published {} files ({} bytes): {} created, {} duplicate, {} conflict, {} rejected",
        r.files, r.bytes, r.created, r.duplicate, r.conflict, r.rejected
    );
    if r.unchanged > 0 {
        line.push_str(&format!("; {} unchanged", r.unchanged));
    }
    if r.retried > 0 {
        line.push_str(&format!("; the server was busy, {} retries", r.retried));
    }
    if r.conflict + r.rejected > 0 {
        line.push_str("; see ~/.airlock/publish/rejected.jsonl");
    }
    let _ = writeln!(out, "{line}");
    if let Some(w) = log {
        let from = match w.from_size {
            Some(n) if n == w.tree_size => "unchanged since the last check".to_owned(),
            Some(n) => format!("consistent with the {n} verified before"),
            None => "the first checkpoint held".to_owned(),
        };
        let mut l = format!(
            "review log: checkpoint of {} events verified ({from}); {} receipts proven \
             included, {} events re-fetched and matched",
            w.tree_size, w.inclusion_checked, w.events_checked
        );
        if let Some(n) = w.witnesses {
            l.push_str(&format!("; cosigned ({n} witnesses)"));
        }
        let _ = writeln!(out, "{l}");
    }
}

/// `[publish] auto = true`: after `airlock run`/`exec`, publish the repo's new lines on the
/// host, bounded by `timeout`. Never changes the session's exit status: every outcome is one
/// line on stderr, and what is left goes with the next publish (the state only ever records
/// what the server acknowledged, so stopping at any await point loses nothing).
pub fn publish_at_session_end(paths: &Paths, repo: &std::path::Path, timeout: std::time::Duration) {
    if !publish::state::server_login(&paths.airlock_dir()) {
        eprintln!(
            "airlock: [publish] auto is on but you are not logged in to a review server; run \
             `airlock login --server URL`"
        );
        return;
    }
    let opts = PublishOptions {
        scope: Scope::Repo(repo.to_path_buf()),
        since: None,
        dry_run: false,
        deadline: Some(std::time::Instant::now() + timeout),
        progress: false,
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("airlock: publish at session end: cannot start its runtime: {e}");
            return;
        }
    };
    let client = LazyClient { paths, client: OnceCell::new() };
    // The engine stops between batches at the deadline; this bounds a request in flight too.
    let hard = timeout + std::time::Duration::from_secs(1);
    let result = rt.block_on(async {
        tokio::time::timeout(hard, publish::publish_async(paths, &client, &opts)).await
    });
    drop(rt);
    // The witness step, in what is left of the time; an inconsistency is loud here too, but
    // never changes the session's exit status.
    if let Ok(Ok(r)) = &result
        && !r.incomplete
        && let Some(deadline) = opts.deadline
        && std::time::Instant::now() < deadline
    {
        match witness_step(paths, &client, r, Some(deadline)) {
            Err(publish::witness::WitnessError::Inconsistent(i)) => eprintln!("{}", i.message()),
            Err(e) => eprintln!("airlock: publish at session end: {e}"),
            Ok(_) => {}
        }
    }
    match result {
        Ok(Ok(r)) if r.incomplete => eprintln!(
            "airlock: published {} new, {} already there; stopped at the [publish] timeout, the \
             rest goes with the next `airlock publish`",
            r.created, r.duplicate
        ),
        Ok(Ok(r)) => {
            if r.created + r.conflict + r.rejected > 0 {
                eprintln!(
                    "airlock: published {} new items ({} already there, {} conflicts, {} \
                     rejected)",
                    r.created, r.duplicate, r.conflict, r.rejected
                );
            }
        }
        Ok(Err(e)) => eprintln!(
            "airlock: publish at session end failed: {e}; it goes with the next `airlock publish`"
        ),
        Err(_) => eprintln!(
            "airlock: publish at session end stopped at the [publish] timeout ({}); the rest \
             goes with the next `airlock publish`",
            humantime::format_duration(timeout)
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn since_accepts_durations_times_and_dates() {
        assert!(matches!(parse_since("2h"), Ok(SinceArg::Ago(_))));
        assert!(matches!(parse_since("2026-07-24"), Ok(SinceArg::At(_))));
        assert!(matches!(parse_since("2026-07-24T18:00:00Z"), Ok(SinceArg::At(_))));
        assert!(parse_since("yesterday-ish").is_err());
    }
}
