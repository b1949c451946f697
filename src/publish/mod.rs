//! `airlock publish`: uploads a repo's (or every repo's) audit lines, session records and agent
//! transcripts to the review plane, incrementally and crash-safely (docs/publish.md).
//!
//! Owns the orchestration ([`publish`]): which files changed since the state file
//! ([`state`]), reading them through directory fds ([`sources`] finds them), one envelope per
//! line ([`envelope`], [`elide`]), batches with at most the server's concurrency in flight
//! ([`upload`]), the state advanced to the acknowledged prefix only, and refused items kept in
//! `rejected.jsonl` ([`rejected`]). Transcripts (and their `transcript.file` items) are sent and
//! acknowledged before the audit lines of the same run, and those before its session records,
//! so a session's transcripts and egress lines always precede its end record.

pub mod elide;
pub mod envelope;
pub mod receipts;
pub mod rejected;
pub mod sources;
pub mod state;
pub mod upload;
pub mod witness;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::future::Future;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::stat::SFlag;
use serde::Serialize;
use time::OffsetDateTime;

use crate::fsat;
use crate::paths::Paths;
use envelope::{LineCtx, LineError};
pub use sources::Scope;
use sources::{Kind, SourceFile};
use state::{FileState, HASH_SPAN, State};
use upload::{BATCH_BYTES, BATCH_ITEMS, UploadError};
pub use upload::{ItemResult, LeafReceipt, NullSink, Reply, Sink, SinkError};

/// How long a second publish waits for the first before saying it is running.
const LOCK_WAIT: Duration = Duration::from_secs(5);
/// Largest sessions file read whole (for the transcript ↔ session map).
const SESSIONS_CAP: u64 = 256 << 20;

/// What to publish and how.
#[derive(Debug, Clone)]
pub struct PublishOptions {
    pub scope: Scope,
    /// Only lines whose `ts` is at or after this (the state file is then not advanced).
    pub since: Option<OffsetDateTime>,
    /// Read and count, send nothing, advance nothing.
    pub dry_run: bool,
    /// Stop cleanly when this passes (auto-publish at session end).
    pub deadline: Option<Instant>,
    /// A progress bar on stderr.
    pub progress: bool,
}

/// One file of a dry run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DryRunFile {
    pub file: String,
    pub lines: u64,
    pub bytes: u64,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PublishReport {
    pub created: u64,
    pub duplicate: u64,
    pub conflict: u64,
    pub rejected: u64,
    /// Files read (changed since the last run).
    pub files: u64,
    /// Bytes of lines read.
    pub bytes: u64,
    /// Items sent (or, dry run: that would be).
    pub items: u64,
    /// Files skipped unread because nothing changed.
    pub unchanged: u64,
    /// Transcripts whose published lines changed (their conflicts are in rejected.jsonl).
    pub rewritten: Vec<String>,
    /// Files refused or skipped (symlinks, too large, unreadable): `path: why`.
    pub skipped: Vec<String>,
    pub warnings: Vec<String>,
    /// `--dry-run`: per file, what would be sent.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub would_send: Vec<DryRunFile>,
    /// Answers that asked to retry (429/503), each waited out and retried.
    pub retried: u64,
    /// The deadline passed before everything was sent (the rest goes next time).
    pub incomplete: bool,
    /// With a pinned log key: receipts written this run ([`receipts`]).
    #[serde(skip)]
    pub receipts: u64,
    /// A uniform sample of this run's receipts, for the witness step ([`witness`]).
    #[serde(skip)]
    pub fresh_receipts: Vec<receipts::Receipt>,
    /// The signed checkpoints the ingest answers carried (distinct, the last few).
    #[serde(skip)]
    pub answer_checkpoints: Vec<String>,
}

/// How many of a run's own receipts the witness step gets to sample from.
pub const FRESH_SAMPLE: usize = 8;
/// How many distinct answer checkpoints a run keeps.
const ANSWER_CHECKPOINTS: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("{0}")]
    Sources(#[from] sources::SourcesError),
    #[error("{0}")]
    State(#[from] state::StateError),
    #[error("token rejected by the review server ({0}); run `airlock login --server URL` again")]
    Unauthorized(String),
    #[error(
        "publishing stopped: {message}; nothing after the last acknowledged line was recorded \
         as published, run `airlock publish` again"
    )]
    Upload { message: String },
    #[error("cannot write {path}: {source}")]
    Rejected {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the upload runtime: {0}")]
    Runtime(io::Error),
    #[error(
        "cannot write the upload receipts under {path}: {source}; check free space and permissions"
    )]
    Receipts {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Publishes per `opts` (blocking: runs its own single-threaded runtime; from async code use
/// [`publish_async`]).
pub fn publish<S: Sink>(
    paths: &Paths,
    sink: &S,
    opts: &PublishOptions,
) -> Result<PublishReport, PublishError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(PublishError::Runtime)?;
    rt.block_on(publish_async(paths, sink, opts))
}

/// [`publish`] for callers already in a runtime.
pub async fn publish_async<S: Sink>(
    paths: &Paths,
    sink: &S,
    opts: &PublishOptions,
) -> Result<PublishReport, PublishError> {
    let air = paths.airlock_dir();
    let _lock = if opts.dry_run {
        None
    } else {
        let wait = match opts.deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).min(LOCK_WAIT),
            None => LOCK_WAIT,
        };
        Some(state::lock(&air, wait)?)
    };
    let state = State::load(&air)?;
    // Receipts are kept only when there is a pinned log key to check them against.
    let witness_user = if opts.dry_run {
        None
    } else {
        crate::config::identity::read(&paths.identity_file())
            .ok()
            .flatten()
            .filter(|id| id.server.is_some() && id.log_key.is_some())
            .map(|id| id.user_id)
    };
    let disc = sources::discover(paths, &opts.scope)?;
    let mut report = PublishReport { skipped: disc.problems.clone(), ..Default::default() };

    // Stat only: a file as last read is skipped unread.
    let mut todo: Vec<SourceFile> = Vec::new();
    for f in &disc.files {
        let size = u64::try_from(f.st.st_size).unwrap_or(0);
        if size > sources::FILE_CAP {
            report.skipped.push(format!(
                "{}: larger than {} bytes, not published",
                f.abs.display(),
                sources::FILE_CAP
            ));
            continue;
        }
        match state.files.get(&key(&f.abs)) {
            Some(fs) if fs.same_stat(&f.st) && (fs.offset == fs.size || fs.done) => {
                report.unchanged += 1;
            }
            _ => todo.push(f.clone()),
        }
    }
    let retries = std::cell::Cell::new(0);
    let mut engine = Engine {
        sink,
        retries: &retries,
        air: air.clone(),
        opts,
        state,
        report,
        concurrency: sink.concurrency().unwrap_or(1).clamp(1, upload::MAX_CONCURRENCY),
        batch: Batch::default(),
        next_seq: 0,
        next_apply: 0,
        done: BTreeMap::new(),
        in_flight: Vec::new(),
        pending: BTreeMap::new(),
        files: Vec::new(),
        progress: None,
        witness_user,
        reservoir: receipts::Reservoir::default(),
    };
    if todo.is_empty() {
        engine.warn_cleanup(&disc.claude_homes, &disc.files);
        return Ok(engine.report);
    }
    if opts.progress && !opts.dry_run {
        let total: u64 = todo
            .iter()
            .map(|f| {
                let size = u64::try_from(f.st.st_size).unwrap_or(0);
                let from = engine.state.files.get(&key(&f.abs)).map_or(0, |s| s.offset);
                size.saturating_sub(from)
            })
            .sum();
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(total),
            indicatif::ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "publishing {bar:30} {bytes}/{total_bytes} {msg}",
        ) {
            bar.set_style(style);
        }
        engine.progress = Some(bar);
    }

    // Which Airlock session covered which transcript bytes, and the end records not yet sent.
    let covers = read_session_records(&disc.files, &engine.state, &mut engine.report.skipped);
    let of = |kind: Kind| todo.iter().filter(move |f| f.kind == kind);
    let transcripts: Vec<&SourceFile> = of(Kind::Claude).chain(of(Kind::Codex)).collect();
    let audit: Vec<&SourceFile> = of(Kind::Audit).collect();
    let records: Vec<&SourceFile> = of(Kind::Sessions).collect();

    let result = async {
        for f in &transcripts {
            engine.file(f, &covers.cover).await?;
        }
        engine.drain().await?;
        let agent_root = air.join("agent");
        for rec in &covers.unsent_ends {
            engine.transcript_files(rec, &agent_root).await?;
        }
        engine.drain().await?;
        for f in &audit {
            engine.file(f, &covers.cover).await?;
        }
        // A session's end record is what makes the review plane check the session (gaps,
        // correlate pack) inside the record's own transaction, and every audit line of a session
        // is written before its end record: so the audit lines are acknowledged before any
        // record is sent. Without this wait a records batch in flight beside the last audit
        // batch could commit first, and the checks would see a session without its egress.
        engine.drain().await?;
        for f in &records {
            // A file the records pass could not read is sent whole, as before: its records are
            // not lost, though they may then precede late audit lines.
            let upto = covers.read_upto.get(&key(&f.abs)).copied();
            engine.file_upto(f, &covers.cover, upto).await?;
        }
        engine.drain().await
    }
    .await;
    if let Some(bar) = &engine.progress {
        bar.finish_and_clear();
    }
    match result {
        Ok(()) => {}
        Err(Stop::Deadline) => engine.report.incomplete = true,
        Err(Stop::Error(e)) => return Err(e),
    }
    engine.report.retried = retries.get();
    engine.report.fresh_receipts = std::mem::take(&mut engine.reservoir.items);
    engine.warn_cleanup(&disc.claude_homes, &disc.files);
    Ok(engine.report)
}

/// Whether `--since` leaves a line with this ts out.
fn skip_by_since(since: Option<OffsetDateTime>, ts: &str) -> bool {
    since.is_some_and(|since| envelope::parse_ts(ts).is_some_and(|t| t < since))
}

/// State keys are absolute paths.
fn key(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Why the run stops early.
enum Stop {
    Deadline,
    Error(PublishError),
}

impl From<PublishError> for Stop {
    fn from(e: PublishError) -> Self {
        Stop::Error(e)
    }
}

/// A transcript entry of an end record.
#[derive(Debug, Clone)]
struct Covered {
    path: String,
    file: Option<String>,
    bytes: Option<u64>,
    sha256: String,
}

/// An end record not yet acknowledged by the server.
#[derive(Debug, Clone)]
struct EndRecord {
    session: String,
    ts: String,
    transcripts: Vec<Covered>,
}

#[derive(Debug, Default)]
struct Covers {
    /// Transcript host path → (Airlock session, bytes its end record covered), in record order.
    cover: HashMap<String, Vec<(String, u64)>>,
    unsent_ends: Vec<EndRecord>,
    /// Sessions file (state key) → the bytes of whole lines read here, before any audit file
    /// was opened: this run sends no record past them. A session that ends while the run reads
    /// the audit files has its end record written after its last audit lines, which this run
    /// may not have read; that record waits for the next run, so an end record never reaches
    /// the server before its session's egress (the server checks the session on it).
    read_upto: HashMap<String, u64>,
}

/// Reads every sessions file in scope (they are small: two lines per session).
fn read_session_records(files: &[SourceFile], st: &State, skipped: &mut Vec<String>) -> Covers {
    let mut out = Covers::default();
    for f in files.iter().filter(|f| f.kind == Kind::Sessions) {
        let Ok(root) = fsat::open_root(&f.root) else { continue };
        let bytes = match fsat::read_capped(root.as_fd(), &f.rel, SESSIONS_CAP) {
            Ok(Some((b, _))) => b,
            Ok(None) => continue,
            Err(e) => {
                skipped.push(format!("{}: {e}", f.abs.display()));
                continue;
            }
        };
        let acked = st.files.get(&key(&f.abs)).map_or(0, |s| s.offset);
        let mut pos = 0u64;
        out.read_upto.insert(key(&f.abs), 0);
        for line in bytes.split_inclusive(|b| *b == b'\n') {
            let start = pos;
            if !line.ends_with(b"\n") {
                break;
            }
            pos += line.len() as u64;
            out.read_upto.insert(key(&f.abs), pos);
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else { continue };
            if v.get("kind").and_then(|k| k.as_str()) != Some("end") {
                continue;
            }
            let Some(session) = v.get("session").and_then(|s| s.as_str()) else { continue };
            let entries: Vec<Covered> = v
                .get("transcripts")
                .and_then(|t| t.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|e| {
                            Some(Covered {
                                path: e.get("path")?.as_str()?.to_owned(),
                                file: e.get("file").and_then(|x| x.as_str()).map(str::to_owned),
                                bytes: e.get("bytes").and_then(|x| x.as_u64()),
                                sha256: e.get("sha256")?.as_str()?.to_owned(),
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            for e in &entries {
                if let Some(b) = e.bytes {
                    out.cover.entry(e.path.clone()).or_default().push((session.to_owned(), b));
                }
            }
            // A record at or after the acknowledged offset goes in this run (or did not yet).
            if start >= acked {
                out.unsent_ends.push(EndRecord {
                    session: session.to_owned(),
                    ts: v.get("ts").and_then(|t| t.as_str()).unwrap_or("").to_owned(),
                    transcripts: entries,
                });
            }
        }
    }
    out
}

/// Where an item came from, to count its answer and report it.
#[derive(Debug, Clone)]
struct Meta {
    /// Index into `Engine::files`.
    file: usize,
    offset: u64,
    id: String,
    /// The item's line in its batch's body (`start..end`, set when queued).
    start: usize,
    end: usize,
}

/// A state update that takes effect once its batch and every earlier one are acknowledged.
#[derive(Debug, Clone)]
struct Checkpoint {
    key: String,
    state: FileState,
}

#[derive(Debug, Default)]
struct Batch {
    body: Vec<u8>,
    items: Vec<Meta>,
    checkpoints: Vec<Checkpoint>,
}

/// What the engine knows of a file it has read, for reports.
#[derive(Debug, Clone)]
struct FileInfo {
    /// As the report and rejected.jsonl name it.
    name: String,
    source: &'static str,
    transcript: bool,
}

/// An upload in flight: its batch seq, items, body (kept for receipts when witnessing) and
/// answer.
type Posted<'a> =
    Pin<Box<dyn Future<Output = (u64, Vec<Meta>, Vec<u8>, Result<Reply, UploadError>)> + 'a>>;

struct Engine<'a, S: Sink> {
    sink: &'a S,
    /// 429/503 answers so far (the uploads in flight count into it).
    retries: &'a std::cell::Cell<u64>,
    air: PathBuf,
    opts: &'a PublishOptions,
    state: State,
    report: PublishReport,
    concurrency: usize,
    batch: Batch,
    next_seq: u64,
    next_apply: u64,
    /// Acknowledged batches not yet applied (an earlier one is still in flight).
    done: BTreeMap<u64, Vec<Checkpoint>>,
    in_flight: Vec<Posted<'a>>,
    /// Checkpoints of each batch in flight, by seq.
    pending: BTreeMap<u64, Vec<Checkpoint>>,
    /// Every file (or synthetic source) items came from, indexed by `Meta::file`.
    files: Vec<FileInfo>,
    progress: Option<indicatif::ProgressBar>,
    /// With a pinned log key: the user id receipts are written for.
    witness_user: Option<String>,
    reservoir: receipts::Reservoir,
}

/// The file being read: what a checkpoint is made of.
struct Reading {
    key: String,
    base: FileState,
    head: Vec<u8>,
    /// The last bytes before `pos` (at least `HASH_SPAN` when there are that many).
    window: Vec<u8>,
    pos: u64,
    last_ts: Option<String>,
    codex_session: Option<String>,
}

impl Reading {
    fn checkpoint(&self, done: bool) -> Checkpoint {
        let span = HASH_SPAN as usize;
        let head = &self.head[..self.head.len().min(usize::try_from(self.pos).unwrap_or(span))];
        let tail = &self.window[self.window.len().saturating_sub(span)..];
        Checkpoint {
            key: self.key.clone(),
            state: FileState {
                offset: self.pos,
                head_sha256: state::sha(head),
                tail_sha256: state::sha(tail),
                done,
                last_ts: self.last_ts.clone(),
                codex_session: self.codex_session.clone(),
                ..self.base.clone()
            },
        }
    }

    fn consumed(&mut self, line: &[u8]) {
        self.pos += line.len() as u64;
        self.window.extend_from_slice(line);
        let span = HASH_SPAN as usize;
        if self.window.len() > 4 * span {
            self.window.drain(..self.window.len() - span);
        }
    }
}

impl<'a, S: Sink> Engine<'a, S> {
    /// Reads one file from where it stands and queues its lines.
    async fn file(
        &mut self,
        f: &SourceFile,
        cover: &HashMap<String, Vec<(String, u64)>>,
    ) -> Result<(), Stop> {
        self.file_upto(f, cover, None).await
    }

    /// [`Engine::file`], reading no further than `upto` bytes of it (when given).
    async fn file_upto(
        &mut self,
        f: &SourceFile,
        cover: &HashMap<String, Vec<(String, u64)>>,
        upto: Option<u64>,
    ) -> Result<(), Stop> {
        self.check_deadline()?;
        let k = key(&f.abs);
        let opened = match open_file(f) {
            Ok(o) => o,
            Err(why) => {
                self.report.skipped.push(format!("{}: {why}", f.abs.display()));
                return Ok(());
            }
        };
        let (file, st) = opened;
        let (dev, inode, size, mtime) = state::stat_key(&st);
        let size = upto.map_or(size, |u| size.min(u));
        let base = FileState { dev, inode, size, mtime, ..Default::default() };
        let span = HASH_SPAN as usize;
        let mut head = vec![0u8; usize::try_from(size.min(HASH_SPAN)).unwrap_or(span)];
        if read_at_full(&file, &mut head, 0).is_err() {
            self.report.skipped.push(format!("{}: cannot be read", f.abs.display()));
            return Ok(());
        }
        // Resume where the server acknowledged, if the file is still the one read then.
        let prior = self.state.files.get(&k).cloned();
        let mut reading = Reading {
            key: k.clone(),
            base,
            head,
            window: Vec::new(),
            pos: 0,
            last_ts: None,
            codex_session: None,
        };
        if let Some(p) = prior.filter(|p| p.offset > 0) {
            // Truncated or replaced (no match): from the start; unchanged lines come back
            // `duplicate`, changed ones `conflict` (reported as rewritten).
            if let Some(window) = resume_check(&file, &p, dev, inode, size) {
                reading.pos = p.offset;
                reading.window = window;
                reading.last_ts = p.last_ts.clone();
                reading.codex_session = p.codex_session.clone();
            }
        }
        let info = FileInfo {
            name: if f.kind.is_transcript() {
                f.rel.to_string_lossy().into_owned()
            } else {
                f.abs.to_string_lossy().into_owned()
            },
            source: f.kind.source(),
            transcript: f.kind.is_transcript(),
        };
        let fidx = self.files.len();
        self.files.push(info);
        self.report.files += 1;
        let mtime_ts = crate::timefmt::rfc3339_ms(
            SystemTime::UNIX_EPOCH + Duration::from_nanos(u64::try_from(mtime).unwrap_or(0)),
        );
        let file_rel = f.rel.to_string_lossy().into_owned();
        let covered = cover.get(&k);
        let mut dry = DryRunFile { file: k.clone(), ..Default::default() };

        let mut rd = BufReader::with_capacity(256 << 10, &file);
        if rd.seek(SeekFrom::Start(reading.pos)).is_err() {
            self.report.skipped.push(format!("{}: cannot be read", f.abs.display()));
            return Ok(());
        }
        let mut rd = rd.take(size - reading.pos);
        let mut line = Vec::with_capacity(4096);
        let mut finished = true;
        loop {
            line.clear();
            let n = match rd.read_until(b'\n', &mut line) {
                Ok(n) => n,
                Err(e) => {
                    self.report.skipped.push(format!("{}: read failed: {e}", f.abs.display()));
                    finished = false;
                    break;
                }
            };
            // End of the file as it was at open; a partial last line waits for the next run.
            if n == 0 || !line.ends_with(b"\n") {
                break;
            }
            let offset = reading.pos;
            let end = offset + n as u64;
            let text = &line[..n - 1];
            self.report.bytes += n as u64;
            if let Some(bar) = &self.progress {
                bar.inc(n as u64);
            }
            if text.iter().all(u8::is_ascii_whitespace) {
                reading.consumed(&line);
                continue;
            }
            let airlock_session =
                covered.and_then(|c| c.iter().find(|(_, b)| *b >= end)).map(|(s, _)| s.as_str());
            let prev_ts = reading.last_ts.clone().unwrap_or_else(|| mtime_ts.clone());
            let ctx = LineCtx {
                kind: f.kind,
                id_rel: &f.id_rel,
                file: &file_rel,
                offset,
                prev_ts: &prev_ts,
                codex_session: reading.codex_session.as_deref(),
                airlock_session,
            };
            let built = match envelope::build(&ctx, text) {
                Ok(b) => b,
                Err(e) => {
                    reading.consumed(&line);
                    if !self.opts.dry_run {
                        self.refuse(fidx, offset, &e)?;
                    }
                    continue;
                }
            };
            let skip = self.opts.dry_run || skip_by_since(self.opts.since, &built.ts);
            if self.opts.dry_run && !skip_by_since(self.opts.since, &built.ts) {
                dry.lines += 1;
                dry.bytes += n as u64;
                self.report.items += 1;
            }
            if !skip {
                // `reading` still stands before this line: a batch sealed here checkpoints
                // up to, not including, it.
                self.push(
                    Meta { file: fidx, offset, id: built.id.clone(), start: 0, end: 0 },
                    &built.text,
                    Some(&reading),
                )
                .await?;
            }
            if built.codex_session.is_some() {
                reading.codex_session.clone_from(&built.codex_session);
            }
            if envelope::parse_ts(&built.ts).is_some() {
                reading.last_ts = Some(built.ts);
            }
            reading.consumed(&line);
        }
        if self.opts.dry_run {
            if dry.lines > 0 {
                self.report.would_send.push(dry);
            }
            return Ok(());
        }
        if finished {
            let cp = reading.checkpoint(true);
            self.batch.checkpoints.push(cp);
        }
        Ok(())
    }

    /// The `transcript.file` items of one end record not yet sent.
    async fn transcript_files(&mut self, rec: &EndRecord, agent_root: &Path) -> Result<(), Stop> {
        for t in &rec.transcripts {
            let Some(bytes) = t.bytes else { continue };
            if !t.sha256.starts_with("sha256:") {
                continue;
            }
            let Some((home, file)) = split_home(agent_root, &t.path, t.file.as_deref()) else {
                self.report.skipped.push(format!(
                    "{}: not in an agent home under {}; no transcript.file item sent",
                    t.path,
                    agent_root.display()
                ));
                continue;
            };
            if let Some(since) = self.opts.since
                && envelope::parse_ts(&rec.ts).is_some_and(|ts| ts < since)
            {
                continue;
            }
            let (got, sha) = match hash_prefix(&home, Path::new(&file), bytes) {
                Ok(x) => x,
                Err(why) => {
                    self.report.skipped.push(format!(
                        "{}: {why}; no transcript.file item sent for session {}",
                        t.path, rec.session
                    ));
                    continue;
                }
            };
            let text = envelope::transcript_file(&rec.session, &file, &rec.ts, got, &sha);
            if self.opts.dry_run {
                self.report.items += 1;
                continue;
            }
            let fidx = self.files.len();
            self.files.push(FileInfo { name: file.clone(), source: "session", transcript: false });
            let id = format!("{}:transcript:{file}", rec.session);
            self.push(Meta { file: fidx, offset: 0, id, start: 0, end: 0 }, &text, None).await?;
        }
        Ok(())
    }

    /// Records a line that cannot become an item.
    fn refuse(&mut self, fidx: usize, offset: u64, e: &LineError) -> Result<(), Stop> {
        self.report.rejected += 1;
        let info = &self.files[fidx];
        let r = rejected::Rejection {
            ts: crate::timefmt::rfc3339_ms(SystemTime::now()),
            file: &info.name,
            offset,
            id: "",
            source: info.source,
            code: 0,
            status: "refused",
            error: &e.to_string(),
        };
        rejected::append(&self.air, &r).map_err(|source| {
            Stop::Error(PublishError::Rejected { path: rejected::path(&self.air), source })
        })
    }

    /// Adds one envelope, sealing the batch first when it would pass a cap.
    async fn push(
        &mut self,
        meta: Meta,
        text: &str,
        reading: Option<&Reading>,
    ) -> Result<(), Stop> {
        if !self.batch.items.is_empty()
            && (self.batch.items.len() >= BATCH_ITEMS
                || self.batch.body.len() + text.len() + 1 > BATCH_BYTES)
        {
            // The checkpoint of the file being read stops before this line.
            if let Some(r) = reading {
                self.batch.checkpoints.push(r.checkpoint(false));
            }
            self.seal().await?;
        }
        let mut meta = meta;
        meta.start = self.batch.body.len();
        self.batch.body.extend_from_slice(text.as_bytes());
        meta.end = self.batch.body.len();
        self.batch.body.push(b'\n');
        self.batch.items.push(meta);
        self.report.items += 1;
        Ok(())
    }

    /// Sends the current batch (waiting for a slot first).
    async fn seal(&mut self) -> Result<(), Stop> {
        let batch = std::mem::take(&mut self.batch);
        let seq = self.next_seq;
        self.next_seq += 1;
        if batch.items.is_empty() {
            self.done.insert(seq, batch.checkpoints);
            return self.apply();
        }
        self.check_deadline()?;
        while self.in_flight.len() >= self.concurrency {
            self.one_done().await?;
        }
        let gz = upload::gzip(&batch.body)
            .map_err(|e| Stop::Error(PublishError::Upload { message: format!("gzip: {e}") }))?;
        let n = batch.items.len();
        let sink = self.sink;
        let retries = self.retries;
        let deadline = self.opts.deadline;
        let items = batch.items;
        // The body is kept only to make receipts of what the server stores.
        let body = if self.witness_user.is_some() { batch.body } else { Vec::new() };
        self.pending.insert(seq, batch.checkpoints);
        self.in_flight.push(Box::pin(async move {
            let r = upload::post_with_retry(sink, gz, n, deadline, retries).await;
            (seq, items, body, r)
        }));
        Ok(())
    }

    /// Waits for one upload and takes in its answer.
    async fn one_done(&mut self) -> Result<(), Stop> {
        let (seq, items, body, result) = std::future::poll_fn(|cx| {
            for i in 0..self.in_flight.len() {
                if let Poll::Ready(x) = self.in_flight[i].as_mut().poll(cx) {
                    drop(self.in_flight.swap_remove(i));
                    return Poll::Ready(x);
                }
            }
            Poll::Pending
        })
        .await;
        let reply = match result {
            Ok(r) => r,
            Err(UploadError::Deadline) => return Err(Stop::Deadline),
            Err(UploadError::Sink(SinkError::Unauthorized { message })) => {
                return Err(Stop::Error(PublishError::Unauthorized(message)));
            }
            Err(e) => return Err(Stop::Error(PublishError::Upload { message: e.to_string() })),
        };
        if let Some(c) = reply.concurrency {
            self.concurrency = c.clamp(1, upload::MAX_CONCURRENCY);
        }
        if reply.results.len() != items.len() {
            return Err(Stop::Error(PublishError::Upload {
                message: format!(
                    "the server answered {} results for {} items",
                    reply.results.len(),
                    items.len()
                ),
            }));
        }
        self.receipts(&reply, &items, &body)?;
        for (r, meta) in reply.results.iter().zip(&items) {
            match r.status.as_str() {
                "created" => self.report.created += 1,
                "duplicate" => self.report.duplicate += 1,
                status => {
                    let info = &self.files[meta.file];
                    if status == "conflict" {
                        self.report.conflict += 1;
                        if info.transcript && !self.report.rewritten.contains(&info.name) {
                            self.report.rewritten.push(info.name.clone());
                        }
                    } else {
                        self.report.rejected += 1;
                    }
                    let rj = rejected::Rejection {
                        ts: crate::timefmt::rfc3339_ms(SystemTime::now()),
                        file: &info.name,
                        offset: meta.offset,
                        id: &meta.id,
                        source: info.source,
                        code: r.code,
                        status,
                        error: r.error.as_deref().unwrap_or(""),
                    };
                    rejected::append(&self.air, &rj).map_err(|source| {
                        Stop::Error(PublishError::Rejected {
                            path: rejected::path(&self.air),
                            source,
                        })
                    })?;
                }
            }
        }
        let cps = self.pending.remove(&seq).unwrap_or_default();
        self.done.insert(seq, cps);
        self.apply()
    }

    /// Writes the receipts of one answer's `created` items (with a pinned log key only).
    fn receipts(&mut self, reply: &Reply, items: &[Meta], body: &[u8]) -> Result<(), Stop> {
        let Some(user) = &self.witness_user else { return Ok(()) };
        if let Some(cp) = &reply.checkpoint
            && !self.report.answer_checkpoints.contains(cp)
        {
            if self.report.answer_checkpoints.len() >= ANSWER_CHECKPOINTS {
                self.report.answer_checkpoints.remove(0);
            }
            self.report.answer_checkpoints.push(cp.clone());
        }
        let mut out = Vec::new();
        for (r, meta) in reply.results.iter().zip(items) {
            let Some(leaf) = r.leaf.as_ref().filter(|_| r.status == "created") else { continue };
            let Some(line) = body.get(meta.start..meta.end) else { continue };
            let Some((source, id, sha)) = receipts::sent_item(line) else { continue };
            out.push(receipts::Receipt {
                user_id: user.clone(),
                source,
                id,
                received_at: leaf.received_at.clone(),
                payload_sha256: sha,
                leaf_index: leaf.leaf_index,
                deadline: leaf.deadline.clone(),
            });
        }
        receipts::append(&self.air, &out).map_err(|source| {
            Stop::Error(PublishError::Receipts { path: receipts::dir(&self.air), source })
        })?;
        self.report.receipts += out.len() as u64;
        for r in out {
            self.reservoir.offer(r, FRESH_SAMPLE);
        }
        Ok(())
    }

    /// Moves the state to the acknowledged prefix of batches and saves it.
    fn apply(&mut self) -> Result<(), Stop> {
        let mut changed = false;
        while let Some(cps) = self.done.remove(&self.next_apply) {
            for cp in cps {
                self.state.files.insert(cp.key, cp.state);
            }
            self.next_apply += 1;
            changed = true;
        }
        // `--since` is a one-off view: the next plain publish still sends everything unsent.
        if changed && self.opts.since.is_none() && !self.opts.dry_run {
            self.state.save(&self.air).map_err(|e| Stop::Error(e.into()))?;
        }
        Ok(())
    }

    /// Sends what is queued and waits for every answer.
    async fn drain(&mut self) -> Result<(), Stop> {
        if !self.batch.items.is_empty() || !self.batch.checkpoints.is_empty() {
            self.seal().await?;
        }
        while !self.in_flight.is_empty() {
            self.one_done().await?;
        }
        Ok(())
    }

    fn check_deadline(&self) -> Result<(), Stop> {
        match self.opts.deadline {
            Some(d) if Instant::now() >= d => Err(Stop::Deadline),
            _ => Ok(()),
        }
    }

    /// Warns when Claude Code's `cleanupPeriodDays` would delete transcripts before they are
    /// published.
    fn warn_cleanup(&mut self, homes: &[PathBuf], files: &[SourceFile]) {
        let now = SystemTime::now();
        for home in homes {
            let days = cleanup_days(home);
            let settings = home.join(".claude/settings.json");
            if days <= 1.0 {
                self.report.warnings.push(format!(
                    "{}: cleanupPeriodDays is {days}; Claude Code deletes transcripts older than \
                     that at startup, before `airlock publish` may get them: raise it (default \
                     30)",
                    settings.display()
                ));
                continue;
            }
            let limit = Duration::from_secs_f64((days - 1.0) * 86_400.0);
            let at_risk =
                files.iter().filter(|f| f.kind == Kind::Claude && f.root == *home).any(|f| {
                    // As the state now stands: read to its end at the size discovery saw.
                    let published = self
                        .state
                        .files
                        .get(&key(&f.abs))
                        .is_some_and(|s| s.same_stat(&f.st) && (s.offset == s.size || s.done));
                    let mtime = SystemTime::UNIX_EPOCH
                        + Duration::from_secs(u64::try_from(f.st.st_mtime).unwrap_or(0));
                    !published && now.duration_since(mtime).is_ok_and(|age| age >= limit)
                });
            if at_risk {
                self.report.warnings.push(format!(
                    "{}: transcripts not yet published are older than cleanupPeriodDays - 1 \
                     ({days} days); Claude Code deletes them at its next start: run `airlock \
                     publish` now, or raise cleanupPeriodDays",
                    settings.display()
                ));
            }
        }
    }
}

/// `cleanupPeriodDays` of a Claude agent home (default 30).
fn cleanup_days(home: &Path) -> f64 {
    let Ok(fd) = fsat::open_root(home) else { return 30.0 };
    match fsat::read_capped(fd.as_fd(), Path::new(".claude/settings.json"), 1 << 20) {
        Ok(Some((bytes, _))) => serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("cleanupPeriodDays").and_then(serde_json::Value::as_f64))
            .unwrap_or(30.0),
        _ => 30.0,
    }
}

/// Opens a source file through its root's fd: a regular file, never through a symlink.
fn open_file(f: &SourceFile) -> Result<(File, nix::sys::stat::FileStat), String> {
    let root =
        fsat::open_root(&f.root).map_err(|e| format!("cannot open {}: {e}", f.root.display()))?;
    let fd = match nix::fcntl::openat2(root.as_fd(), &f.rel, fsat::how(fsat::read_flags(), 0)) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ELOOP | nix::errno::Errno::EXDEV) => {
            return Err("a symlink is in the way (never followed); not published".into());
        }
        Err(nix::errno::Errno::ENOENT) => return Err("gone since it was listed".into()),
        Err(e) => return Err(format!("cannot open: {e}")),
    };
    let st = nix::sys::stat::fstat(&fd).map_err(|e| format!("cannot stat: {e}"))?;
    if fsat::kind(&st) != SFlag::S_IFREG {
        return Err("not a regular file; not published".into());
    }
    if u64::try_from(st.st_size).unwrap_or(u64::MAX) > sources::FILE_CAP {
        return Err(format!("larger than {} bytes, not published", sources::FILE_CAP));
    }
    Ok((File::from(fd), st))
}

fn read_at_full(file: &File, buf: &mut [u8], at: u64) -> io::Result<()> {
    file.read_exact_at(buf, at)
}

/// Whether the file still starts with what was published: its inode, size and the hashes of
/// the head and of the bytes before the offset. `Some(window)`: resume at the offset, with
/// those last bytes; `None`: re-read from the start.
fn resume_check(file: &File, p: &FileState, dev: u64, inode: u64, size: u64) -> Option<Vec<u8>> {
    if p.dev != dev || p.inode != inode || size < p.offset {
        return None;
    }
    let head_len = p.offset.min(HASH_SPAN);
    let mut head = vec![0u8; usize::try_from(head_len).ok()?];
    file.read_exact_at(&mut head, 0).ok()?;
    if state::sha(&head) != p.head_sha256 {
        return None;
    }
    let tail_len = p.offset.min(HASH_SPAN);
    let mut tail = vec![0u8; usize::try_from(tail_len).ok()?];
    file.read_exact_at(&mut tail, p.offset - tail_len).ok()?;
    if state::sha(&tail) != p.tail_sha256 {
        return None;
    }
    Some(tail)
}

/// `(agent home, path relative to it)` of a transcript host path from an end record, when it
/// lies in an agent home `<agent_root>/<agent>/<repo key>/`.
fn split_home(agent_root: &Path, path: &str, file: Option<&str>) -> Option<(PathBuf, String)> {
    let rest = Path::new(path).strip_prefix(agent_root).ok()?;
    let mut comps = rest.components();
    let agent = comps.next()?;
    let key = comps.next()?;
    let rel = comps.as_path();
    if rel.as_os_str().is_empty()
        || rel.components().any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return None;
    }
    let rel_s = rel.to_string_lossy().into_owned();
    if file.is_some_and(|f| f != rel_s) {
        return None;
    }
    Some((agent_root.join(agent).join(key), rel_s))
}

/// `(bytes hashed, sha256:<hex>)` of the first `bytes` bytes of `rel` below `home` (fewer if
/// the file is shorter now).
fn hash_prefix(home: &Path, rel: &Path, bytes: u64) -> Result<(u64, String), String> {
    use sha2::{Digest, Sha256};
    let root = fsat::open_root(home).map_err(|e| format!("cannot open the agent home: {e}"))?;
    let fd = match nix::fcntl::openat2(root.as_fd(), rel, fsat::how(fsat::read_flags(), 0)) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Err("gone".into()),
        Err(nix::errno::Errno::ELOOP | nix::errno::Errno::EXDEV) => {
            return Err("a symlink is in the way (never followed)".into());
        }
        Err(e) => return Err(format!("cannot open: {e}")),
    };
    let st = nix::sys::stat::fstat(&fd).map_err(|e| e.to_string())?;
    if fsat::kind(&st) != SFlag::S_IFREG {
        return Err("not a regular file".into());
    }
    let mut h = Sha256::new();
    let mut rd = File::from(fd).take(bytes.min(sources::FILE_CAP));
    let mut buf = vec![0u8; 64 << 10];
    let mut got = 0u64;
    loop {
        let n = rd.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        got += n as u64;
    }
    Ok((got, format!("sha256:{}", hex::encode(h.finalize()))))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::fs;
    use std::io::Write;
    use std::sync::Mutex;

    /// Answers like the review plane's dedup: same (source, id) and payload → duplicate,
    /// different payload → conflict. Can fail the n-th post.
    #[derive(Default)]
    struct Mem {
        stored: Mutex<HashMap<(String, String), Vec<String>>>,
        events: Mutex<Vec<serde_json::Value>>,
        posts: Mutex<u32>,
        fail_at: Option<u32>,
        concurrency: Option<usize>,
    }

    impl Sink for Mem {
        fn concurrency(&self) -> Option<usize> {
            self.concurrency
        }
        async fn post(&self, gz: bytes::Bytes, _items: usize) -> Result<Reply, SinkError> {
            let n = {
                let mut p = self.posts.lock().unwrap();
                *p += 1;
                *p
            };
            if self.fail_at == Some(n) {
                return Err(SinkError::Fatal { message: "boom".into() });
            }
            let mut text = String::new();
            flate2::read::GzDecoder::new(&gz[..]).read_to_string(&mut text).unwrap();
            let mut results = Vec::new();
            let mut stored = self.stored.lock().unwrap();
            for (index, line) in text.lines().enumerate() {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                let k = (
                    v["source"].as_str().unwrap().to_owned(),
                    v["id"].as_str().unwrap().to_owned(),
                );
                let payload = v["payload"].to_string();
                let e = stored.entry(k).or_default();
                let status = if e.is_empty() {
                    "created"
                } else if e.contains(&payload) {
                    "duplicate"
                } else {
                    "conflict"
                };
                if status != "duplicate" {
                    e.push(payload);
                    self.events.lock().unwrap().push(v);
                }
                let code = match status {
                    "created" => 201,
                    "duplicate" => 200,
                    _ => 409,
                };
                results.push(ItemResult {
                    index,
                    status: status.into(),
                    code,
                    ..Default::default()
                });
            }
            Ok(Reply { concurrency: Some(2), results, checkpoint: None })
        }
    }

    struct T {
        _tmp: tempfile::TempDir,
        paths: Paths,
        logs: PathBuf,
        proj: PathBuf,
    }

    fn world() -> T {
        let tmp = tempfile::tempdir().unwrap();
        let paths = Paths::with_home(tmp.path().to_owned());
        let logs = paths.logs_root().join("r");
        fs::create_dir_all(&logs).unwrap();
        let proj = paths.airlock_dir().join("agent/claude/r-12345678/.claude/projects/-work-r");
        fs::create_dir_all(&proj).unwrap();
        T { _tmp: tmp, paths, logs, proj }
    }

    fn opts() -> PublishOptions {
        PublishOptions {
            scope: Scope::All,
            since: None,
            dry_run: false,
            deadline: None,
            progress: false,
        }
    }

    fn audit(id: u32) -> String {
        format!(
            "{{\"ts\":\"2026-07-24T18:03:{:02}.000Z\",\"repo\":\"r\",\"host\":\"h{id}\",\"method\":\"CONNECT\",\"allowed\":false,\"id\":\"e{id}\",\"session\":\"s\",\"boot\":\"b\",\"seq\":{id},\"reason\":\"not_allowed\"}}\n",
            id % 60
        )
    }

    fn append(p: &Path, s: &str) {
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .unwrap()
            .write_all(s.as_bytes())
            .unwrap();
    }

    #[test]
    fn publishes_appends_and_skips_unchanged() {
        let t = world();
        let a = t.logs.join("audit-2026-07-24.jsonl");
        append(&a, &(1..=3).map(audit).collect::<String>());
        let c = t.proj.join("s1.jsonl");
        append(
            &c,
            "{\"type\":\"user\",\"uuid\":\"u1\",\"timestamp\":\"2026-07-24T18:00:00.000Z\"}\n{\"type\":\"summary\",\"leafUuid\":\"u1\"}\n{\"type\":\"user\",\"uu",
        );
        let sink = Mem::default();
        let r = publish(&t.paths, &sink, &opts()).unwrap();
        assert_eq!((r.created, r.duplicate, r.files), (5, 0, 2), "{r:?}");
        // Transcripts first.
        let ev = sink.events.lock().unwrap().clone();
        assert_eq!(ev[0]["source"], "claude");
        assert_eq!(ev[1]["id"], "-work-r/s1.jsonl:67");
        assert_eq!(ev[1]["ts_inferred"], true);
        assert_eq!(ev[1]["ts"], "2026-07-24T18:00:00.000Z");
        assert_eq!(ev[2]["source"], "egress");
        // Nothing changed: nothing read, nothing posted.
        let posts = *sink.posts.lock().unwrap();
        let r = publish(&t.paths, &sink, &opts()).unwrap();
        assert_eq!((r.files, r.unchanged, r.items), (0, 2, 0));
        assert_eq!(*sink.posts.lock().unwrap(), posts);
        // The partial line completes; an audit line is appended.
        append(&c, "id\":\"u2\",\"timestamp\":\"2026-07-24T18:01:00.000Z\"}\n");
        append(&a, &audit(4));
        let r = publish(&t.paths, &sink, &opts()).unwrap();
        assert_eq!((r.created, r.duplicate, r.files), (2, 0, 2), "{r:?}");
        assert_eq!(sink.events.lock().unwrap().len(), 7);
    }

    #[test]
    fn a_rewritten_transcript_is_reread_and_reported() {
        let t = world();
        let c = t.proj.join("s1.jsonl");
        append(
            &c,
            "{\"type\":\"summary\",\"summary\":\"a\"}\n{\"type\":\"summary\",\"summary\":\"b\"}\n",
        );
        let sink = Mem::default();
        publish(&t.paths, &sink, &opts()).unwrap();
        // Replaced: the first line kept, the second changed (same offset-based id).
        fs::write(
            &c,
            "{\"type\":\"summary\",\"summary\":\"a\"}\n{\"type\":\"summary\",\"summary\":\"c\"}\n",
        )
        .unwrap();
        let r = publish(&t.paths, &sink, &opts()).unwrap();
        assert_eq!((r.created, r.duplicate, r.conflict), (0, 1, 1), "{r:?}");
        assert_eq!(r.rewritten, [".claude/projects/-work-r/s1.jsonl"]);
        let rj = fs::read_to_string(rejected::path(&t.paths.airlock_dir())).unwrap();
        let rj: serde_json::Value = serde_json::from_str(rj.lines().next().unwrap()).unwrap();
        assert_eq!(rj["id"], "-work-r/s1.jsonl:33");
        assert_eq!(rj["code"], 409);
        assert_eq!(rj["status"], "conflict");
        // Truncated below the offset: re-read from 0, all duplicates.
        fs::write(&c, "{\"type\":\"summary\",\"summary\":\"a\"}\n").unwrap();
        let r = publish(&t.paths, &sink, &opts()).unwrap();
        assert_eq!((r.created, r.duplicate, r.conflict), (0, 1, 0), "{r:?}");
    }

    #[test]
    fn a_failure_keeps_the_acknowledged_prefix_and_the_rerun_fills_the_gap() {
        let t = world();
        let a = t.logs.join("audit-2026-07-24.jsonl");
        append(&a, &(1..=2500).map(audit).collect::<String>());
        // Three batches, two in flight; the second post fails.
        let sink = Mem { fail_at: Some(2), concurrency: Some(2), ..Default::default() };
        let e = publish(&t.paths, &sink, &opts()).unwrap_err();
        assert!(e.to_string().contains("boom"), "{e}");
        let st = State::load(&t.paths.airlock_dir()).unwrap();
        let off = st.files.get(&key(&a)).map_or(0, |f| f.offset);
        let first_batch: u64 = (1..=1000).map(|i| audit(i).len() as u64).sum();
        assert_eq!(off, first_batch);
        let sink2 =
            Mem { stored: Mutex::new(sink.stored.lock().unwrap().clone()), ..Default::default() };
        let r = publish(&t.paths, &sink2, &opts()).unwrap();
        assert_eq!(r.created + r.duplicate, 1500, "{r:?}");
        assert_eq!(sink2.stored.lock().unwrap().len(), 2500);
    }

    #[test]
    fn since_and_dry_run_advance_nothing() {
        let t = world();
        let a = t.logs.join("audit-2026-07-24.jsonl");
        append(&a, &(1..=3).map(audit).collect::<String>());
        let sink = Mem::default();
        let mut o = opts();
        o.dry_run = true;
        let r = publish(&t.paths, &sink, &o).unwrap();
        assert_eq!((r.items, *sink.posts.lock().unwrap()), (3, 0));
        assert_eq!(r.would_send[0].lines, 3);
        let mut o = opts();
        o.since = Some(envelope::parse_ts("2026-07-24T18:03:02Z").unwrap());
        let r = publish(&t.paths, &sink, &o).unwrap();
        assert_eq!(r.created, 2);
        assert!(State::load(&t.paths.airlock_dir()).unwrap().files.is_empty());
        let r = publish(&t.paths, &sink, &opts()).unwrap();
        assert_eq!((r.created, r.duplicate), (1, 2));
    }

    #[test]
    fn a_passed_deadline_stops_cleanly() {
        let t = world();
        append(&t.logs.join("audit-2026-07-24.jsonl"), &audit(1));
        let mut o = opts();
        o.deadline = Some(Instant::now());
        let r = publish(&t.paths, &Mem::default(), &o).unwrap();
        assert!(r.incomplete);
        assert_eq!(r.created, 0);
    }

    /// A sink whose egress batches take longer than the others: a server still committing the
    /// audit lines while a records batch arrives. `Mem` records a batch when it completes.
    struct SlowEgress(Mem);

    impl Sink for SlowEgress {
        fn concurrency(&self) -> Option<usize> {
            Some(4)
        }
        async fn post(&self, gz: bytes::Bytes, items: usize) -> Result<Reply, SinkError> {
            let mut text = String::new();
            flate2::read::GzDecoder::new(&gz[..]).read_to_string(&mut text).unwrap();
            if text.contains("\"source\":\"egress\"") {
                for _ in 0..50 {
                    tokio::task::yield_now().await;
                }
            }
            self.0.post(gz, items).await
        }
    }

    /// Regression: the end record went out beside the session's audit lines, so a server could
    /// commit it first and run the session's checks (gaps, correlate) without its egress.
    #[test]
    fn a_sessions_end_record_is_sent_only_after_its_audit_lines_are_acknowledged() {
        let t = world();
        // Lines in several batches: the batch cap is items, so many lines make many posts.
        let lines: String = (1..=BATCH_ITEMS as u32 * 3).map(audit).collect();
        append(&t.logs.join("audit-2026-07-24.jsonl"), &lines);
        let start = serde_json::json!({"id":"s:start","kind":"start","ts":"2026-07-24T18:00:00.000Z","session":"s"});
        let end = serde_json::json!({"id":"s:end","kind":"end","ts":"2026-07-24T18:05:00.000Z","session":"s"});
        append(&t.logs.join("sessions-2026-07-24.jsonl"), &format!("{start}\n{end}\n"));
        let sink = SlowEgress(Mem::default());
        let r = publish(&t.paths, &sink, &opts()).unwrap();
        assert_eq!(r.created, BATCH_ITEMS as u64 * 3 + 2, "{r:?}");
        let ev = sink.0.events.lock().unwrap().clone();
        let end_at = ev.iter().position(|e| e["id"] == "s:end").unwrap();
        let last_egress = ev.iter().rposition(|e| e["source"] == "egress").unwrap();
        assert!(last_egress < end_at, "the end record was stored before an egress line");
    }

    /// A sink that, while the audit lines are being posted, plays a session that ends: its last
    /// audit line and then its end record are appended to the files.
    struct EndsMidRun {
        mem: Mem,
        audit: PathBuf,
        sessions: PathBuf,
        done: Mutex<bool>,
    }

    impl Sink for EndsMidRun {
        fn concurrency(&self) -> Option<usize> {
            Some(2)
        }
        async fn post(&self, gz: bytes::Bytes, items: usize) -> Result<Reply, SinkError> {
            let mut text = String::new();
            flate2::read::GzDecoder::new(&gz[..]).read_to_string(&mut text).unwrap();
            let first_egress = text.contains("\"source\":\"egress\"")
                && !std::mem::replace(&mut *self.done.lock().unwrap(), true);
            if first_egress {
                append(&self.audit, &audit(999));
                let end = serde_json::json!({"id":"late:end","kind":"end","ts":"2026-07-24T18:06:00.000Z","session":"late"});
                append(&self.sessions, &format!("{end}\n"));
            }
            self.mem.post(gz, items).await
        }
    }

    /// Regression: a session that ended while a run was posting the audit lines had its end
    /// record sent in that run, but its last audit lines (written before the record, after the
    /// run opened the audit file) only in the next one.
    #[test]
    fn an_end_record_written_during_a_run_waits_for_the_next_one() {
        let t = world();
        let a = t.logs.join("audit-2026-07-24.jsonl");
        let sessions = t.logs.join("sessions-2026-07-24.jsonl");
        append(&a, &(1..=3).map(audit).collect::<String>());
        let end = serde_json::json!({"id":"s:end","kind":"end","ts":"2026-07-24T18:05:00.000Z","session":"s"});
        append(&sessions, &format!("{end}\n"));
        let sink = EndsMidRun {
            mem: Mem::default(),
            audit: a.clone(),
            sessions: sessions.clone(),
            done: Mutex::new(false),
        };
        publish(&t.paths, &sink, &opts()).unwrap();
        let ids = |sink: &EndsMidRun| -> Vec<String> {
            let ev = sink.mem.events.lock().unwrap();
            ev.iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect()
        };
        let first = ids(&sink);
        assert!(first.contains(&"s:end".to_owned()), "{first:?}");
        assert!(!first.contains(&"late:end".to_owned()), "sent before its audit lines: {first:?}");
        publish(&t.paths, &sink, &opts()).unwrap();
        let second = ids(&sink);
        let late = second.iter().position(|i| i == "late:end").unwrap();
        let last_line = second.iter().position(|i| i == "e999").unwrap();
        assert!(last_line < late, "{second:?}");
    }

    #[test]
    fn session_end_records_link_transcripts_and_send_transcript_file_items() {
        let t = world();
        let c = t.proj.join("s1.jsonl");
        let l1 = "{\"type\":\"user\",\"uuid\":\"u1\",\"timestamp\":\"2026-07-24T18:00:00.000Z\"}\n";
        append(&c, l1);
        let later =
            "{\"type\":\"user\",\"uuid\":\"u2\",\"timestamp\":\"2026-07-24T18:00:01.000Z\"}\n";
        append(&c, later);
        let rel = ".claude/projects/-work-r/s1.jsonl";
        let end = serde_json::json!({"id":"S1:end","kind":"end","ts":"2026-07-24T18:05:00.000Z","session":"S1",
            "transcripts":[{"path": c.to_string_lossy(), "file": rel, "bytes": l1.len(), "sha256": state::sha(l1.as_bytes())}]});
        append(&t.logs.join("sessions-2026-07-24.jsonl"), &format!("{end}\n"));
        let sink = Mem::default();
        let r = publish(&t.paths, &sink, &opts()).unwrap();
        assert_eq!(r.created, 4, "{r:?}");
        let ev = sink.events.lock().unwrap().clone();
        assert_eq!(ev[0]["airlock_session"], "S1");
        assert_eq!(ev[1]["airlock_session"], serde_json::Value::Null);
        assert_eq!(ev[2]["type"], "transcript.file");
        assert_eq!(ev[2]["payload"]["sha256"], state::sha(l1.as_bytes()));
        assert_eq!(ev[2]["payload"]["bytes"], l1.len());
        assert_eq!(ev[3]["id"], "S1:end");
        // Not sent again once the end record is acknowledged.
        append(
            &c,
            "{\"type\":\"user\",\"uuid\":\"u3\",\"timestamp\":\"2026-07-24T18:00:02.000Z\"}\n",
        );
        let r = publish(&t.paths, &sink, &opts()).unwrap();
        assert_eq!(r.items, 1);
    }

    #[test]
    fn cleanup_period_warnings() {
        let t = world();
        let home = t.proj.parent().unwrap().parent().unwrap().parent().unwrap().to_owned();
        fs::write(home.join(".claude/settings.json"), "{\"cleanupPeriodDays\": 1}").unwrap();
        append(&t.proj.join("s.jsonl"), "{\"type\":\"summary\"}\n");
        let r = publish(&t.paths, &Mem::default(), &opts()).unwrap();
        assert!(r.warnings.iter().any(|w| w.contains("cleanupPeriodDays is 1")), "{r:?}");
        // Default 30: an unpublished transcript 40 days old is at risk.
        fs::remove_file(home.join(".claude/settings.json")).unwrap();
        let old = t.proj.join("old.jsonl");
        append(&old, "{\"type\":\"summary\"}\n");
        let f = fs::File::options().write(true).open(&old).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(40 * 86_400)).unwrap();
        let mut o = opts();
        o.dry_run = true;
        let r = publish(&t.paths, &Mem::default(), &o).unwrap();
        assert!(r.warnings.iter().any(|w| w.contains("older than cleanupPeriodDays")), "{r:?}");
        let r = publish(&t.paths, &Mem::default(), &opts()).unwrap();
        assert!(r.warnings.is_empty(), "published now: {r:?}");
    }

    #[test]
    fn a_file_over_the_cap_is_reported_and_skipped_unread() {
        let t = world();
        let big = t.proj.join("big.jsonl");
        fs::File::create(&big).unwrap().set_len(sources::FILE_CAP + 1).unwrap();
        let sink = Mem::default();
        let r = publish(&t.paths, &sink, &opts()).unwrap();
        assert!(r.skipped.iter().any(|s| s.contains("big.jsonl: larger than")), "{r:?}");
        assert_eq!((r.files, r.bytes, *sink.posts.lock().unwrap()), (0, 0, 0));
    }
}
