//! The witness step of `airlock publish` (docs/evidence.md "Clients witness"): after the
//! uploads of every run, when a log key is pinned:
//!
//! 1. fetch the server's checkpoint and verify it with the pinned key;
//! 2. check it against the last checkpoint this client verified
//!    (`~/.airlock/publish/log-checkpoint`): a smaller tree, the same size with another root
//!    or an older `time` is refused; a larger tree needs a consistency proof;
//! 3. verify the inclusion of up to [`INCLUSION_SAMPLE`] of this client's receipts
//!    ([`super::receipts`]), each leaf rebuilt from what was sent (pending ones resolved with
//!    `GET /api/v1/log/leaf`);
//! 4. re-fetch up to [`REFETCH_SAMPLE`] of its own events through the events API and compare
//!    the SHA-256 of their payload text (and their leaf) with the receipt: an owner's
//!    in-place edit leaves the tree valid, so only this finds one;
//! 5. save the checkpoint as the held one, cosign it with the machine key and post the
//!    cosignature.
//!
//! Any inconsistency stops the step before the held checkpoint moves: an [`Inconsistency`]
//! names what and which event, and its evidence (both checkpoints, the proof, every raw
//! answer) is saved under `~/.airlock/publish/evidence/<UTC time>/`. A server that cannot be
//! reached is not evidence of anything ([`WitnessError::Transient`]).

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use super::receipts::{self, Receipt};
use crate::evidence::{
    self, Answer, ApiError, CheckpointAnswer, Evidence, Head, HeldError, LogApi, ProofAnswer,
    Relation, hashes_from_b64, query_value,
};
use crate::tlog::merkle::{verify_consistency, verify_inclusion};
use crate::tlog::note::{NoteSigner, NoteVerifier};
use crate::tlog::{b64, hash_from_b64, sha256};

/// Receipts whose inclusion each run verifies (at most).
pub const INCLUSION_SAMPLE: usize = 16;
/// Own events each run re-fetches (at most).
pub const REFETCH_SAMPLE: usize = 8;
/// Pages of the events API read to find one event.
const MAX_PAGES: usize = 10;

/// What an inconsistency is about, for the message and `--json`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Inconsistency {
    /// One sentence: what is wrong.
    pub what: String,
    /// `source/id at leaf N`, when one event is concerned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// The held and the server's heads, described.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Where the evidence was saved (or why it could not be).
    pub evidence: String,
}

impl Inconsistency {
    /// The loud multi-line message (no trailing newline).
    pub fn message(&self) -> String {
        let mut m = String::from(
            "airlock publish: THE REVIEW SERVER'S LOG IS INCONSISTENT; refusing to continue\n",
        );
        m.push_str(&format!("  what:     {}\n", self.what));
        if let Some(e) = &self.event {
            m.push_str(&format!("  event:    {e}\n"));
        }
        if let Some(h) = &self.held {
            m.push_str(&format!("  held:     {h}\n"));
        }
        if let Some(s) = &self.server {
            m.push_str(&format!("  server:   {s}\n"));
        }
        m.push_str(&format!("  evidence: {}\n", self.evidence));
        m.push_str(
            "  The checkpoint this client holds was not advanced. The server's record may have \
             been rewritten, truncated or shown differently to others: keep the evidence \
             directory, tell your security team and the server's operator, and do not trust \
             this server's history until it is explained (docs/evidence.md).",
        );
        m
    }
}

/// Why the witness step did not complete.
#[derive(Debug, thiserror::Error)]
pub enum WitnessError {
    /// The log contradicts what this client verified or sent (exit 125).
    #[error("{}", .0.message())]
    Inconsistent(Box<Inconsistency>),
    /// The server could not be reached or answered 429/5xx: try again later (exit 1).
    #[error("cannot check the review log: {0}; the next `airlock publish` checks it again")]
    Transient(String),
    #[error("token rejected by the review server ({0}); run `airlock login --server URL` again")]
    Unauthorized(String),
    #[error("{0}")]
    Held(#[from] HeldError),
}

/// What a completed witness step did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct WitnessReport {
    pub tree_size: u64,
    pub root: String,
    /// The size of the checkpoint held before (`None`: the first one).
    pub from_size: Option<u64>,
    /// Receipts whose inclusion verified.
    pub inclusion_checked: u64,
    /// Events re-fetched and compared.
    pub events_checked: u64,
    /// Receipts not yet covered by the checkpoint (sequenced later, or pending).
    pub not_yet_covered: u64,
    /// Clients that have cosigned this checkpoint, as the server counts them after ours.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub witnesses: Option<u64>,
    pub warnings: Vec<String>,
}

/// A [`LogApi`] that keeps every answer, for the evidence.
struct Recorder<'a, A: LogApi> {
    api: &'a A,
    log: RefCell<Vec<serde_json::Value>>,
}

impl<A: LogApi> Recorder<'_, A> {
    async fn get(&self, path: &str) -> Result<Answer, WitnessError> {
        let a = self.api.get(path).await.map_err(api_error)?;
        self.keep("GET", path, &a);
        Ok(a)
    }

    async fn post(&self, path: &str, body: &serde_json::Value) -> Result<Answer, WitnessError> {
        let a = self.api.post_json(path, body).await.map_err(api_error)?;
        self.keep("POST", path, &a);
        Ok(a)
    }

    fn keep(&self, method: &str, path: &str, a: &Answer) {
        self.log.borrow_mut().push(serde_json::json!({
            "request": format!("{method} {path}"),
            "status": a.status,
            "reason": a.reason,
            "body": String::from_utf8_lossy(&a.body),
        }));
    }

    fn answers(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for v in self.log.borrow().iter() {
            out.extend_from_slice(v.to_string().as_bytes());
            out.push(b'\n');
        }
        out
    }
}

fn api_error(e: ApiError) -> WitnessError {
    match e {
        ApiError::Transient(m) => WitnessError::Transient(m),
        ApiError::Unauthorized(m) => WitnessError::Unauthorized(m),
    }
}

/// An answer with an unexpected status that is not evidence (a proxy, a bug): transient.
fn unexpected(path: &str, a: &Answer) -> WitnessError {
    let text: String = String::from_utf8_lossy(&a.body).chars().take(300).collect();
    WitnessError::Transient(format!("{path} answered HTTP {}: {text}", a.status))
}

/// The inputs of one witness step.
#[derive(Debug)]
pub struct Witness<'a> {
    /// `~/.airlock`.
    pub airlock_dir: &'a Path,
    /// The pinned log key.
    pub key: &'a NoteVerifier,
    /// The machine key that cosigns (`None`: it could not be loaded; a warning says why).
    pub signer: Option<&'a NoteSigner>,
    /// A sample of this run's receipts ([`super::PublishReport::fresh_receipts`]).
    pub fresh: &'a [Receipt],
    /// The checkpoints this run's ingest answers carried.
    pub answer_checkpoints: &'a [String],
    /// Now, in Unix seconds (the cosignature's time).
    pub now: u64,
}

/// Builds the inconsistency of a failed check: saves the evidence, returns the error.
struct Fail<'a, 'b, A: LogApi> {
    rec: &'b Recorder<'a, A>,
    air: &'b Path,
    held: Option<&'b Head>,
    new: Option<&'b Head>,
}

impl<A: LogApi> Fail<'_, '_, A> {
    fn fail(&self, what: String, event: Option<String>, extra: &[(&str, Vec<u8>)]) -> WitnessError {
        let mut ev = Evidence::default();
        let mut report = format!("{what}\n");
        if let Some(e) = &event {
            report.push_str(&format!("event: {e}\n"));
        }
        if let Some(h) = self.held {
            ev.add("held-checkpoint", h.note.clone());
        }
        if let Some(n) = self.new {
            ev.add("server-checkpoint", n.note.clone());
        }
        for (name, bytes) in extra {
            ev.add(name, bytes.clone());
        }
        ev.add("answers.jsonl", self.rec.answers());
        ev.add("report.txt", report);
        let evidence = match ev.save(self.air) {
            Ok(dir) => dir.display().to_string(),
            Err(e) => format!("could not be saved ({e})"),
        };
        WitnessError::Inconsistent(Box::new(Inconsistency {
            what,
            event,
            held: self.held.map(Head::describe),
            server: self.new.map(Head::describe),
            evidence,
        }))
    }
}

/// Runs the five steps.
pub async fn witness<A: LogApi>(api: &A, w: &Witness<'_>) -> Result<WitnessReport, WitnessError> {
    let rec = Recorder { api, log: RefCell::new(Vec::new()) };
    let air = w.airlock_dir;
    let mut report = WitnessReport::default();

    // 2 (first: a held checkpoint this client cannot open stops everything).
    let held = match evidence::load_held(air, w.key) {
        Ok(h) => h,
        Err(HeldError::Invalid { path, err }) => {
            let f = Fail { rec: &rec, air, held: None, new: None };
            let bytes = std::fs::read(&path).unwrap_or_default();
            return Err(f.fail(
                format!(
                    "the checkpoint this client holds ({}) does not open with the pinned log \
                     key ({err}); it was changed on this machine, or the pin was; if you know \
                     why, move it away and run `airlock publish` again",
                    path.display()
                ),
                None,
                &[("held-checkpoint", bytes)],
            ));
        }
        Err(e) => return Err(e.into()),
    };

    // 1. The server's head, signed by the pinned key.
    let path = "/api/v1/log/checkpoint";
    let a = rec.get(path).await?;
    let f0 = Fail { rec: &rec, air, held: held.as_ref(), new: None };
    if a.status == 404 && a.reason.as_deref() == Some("no_log_key") {
        return Err(f0.fail(
            "the server no longer serves a signed log, though its key is pinned: it was \
             restarted without its log key, or the log was removed"
                .into(),
            None,
            &[],
        ));
    }
    if a.status != 200 {
        return Err(unexpected(path, &a));
    }
    let Ok(cpa) = serde_json::from_slice::<CheckpointAnswer>(&a.body) else {
        return Err(unexpected(path, &a));
    };
    let new = match Head::open(&cpa.checkpoint, w.key) {
        Ok(h) => h,
        Err(e) => {
            return Err(f0.fail(
                format!("the server's checkpoint does not verify with the pinned log key: {e}"),
                None,
                &[("server-checkpoint", cpa.checkpoint.into_bytes())],
            ));
        }
    };
    report.tree_size = new.cp.size;
    report.root = b64(&new.cp.root);
    let f = Fail { rec: &rec, air, held: held.as_ref(), new: Some(&new) };

    // 2. Against the held head.
    if let Some(h) = &held {
        report.from_size = Some(h.cp.size);
        match evidence::relate(&h.cp, &new.cp) {
            Relation::Same => {}
            Relation::Smaller => {
                return Err(f.fail(
                    "the server's tree is smaller than the one this client verified before: the \
                     log was truncated, or an old checkpoint is replayed"
                        .into(),
                    None,
                    &[],
                ));
            }
            Relation::SplitView => {
                return Err(f.fail(
                    "the server's tree has the size of the one this client verified before but \
                     another root: a split view, or a rewritten history"
                        .into(),
                    None,
                    &[],
                ));
            }
            Relation::Older => {
                return Err(f.fail(
                    "the server's checkpoint was signed before the one this client verified \
                     before: an old checkpoint is replayed"
                        .into(),
                    None,
                    &[],
                ));
            }
            Relation::NoTime => {
                return Err(f.fail(
                    "the server's checkpoint has no `time` line, so a replay cannot be told \
                     apart"
                        .into(),
                    None,
                    &[],
                ));
            }
            Relation::Grown => {
                consistency(&rec, &f, h, &new).await?;
            }
        }
    }
    // The heads the ingest answers carried are the same log's.
    for note in w.answer_checkpoints {
        let other = match Head::open(note, w.key) {
            Ok(o) => o,
            Err(e) => {
                return Err(f.fail(
                    format!("an ingest answer carried a checkpoint that does not verify: {e}"),
                    None,
                    &[("answer-checkpoint", note.clone().into_bytes())],
                ));
            }
        };
        let bad = if other.cp.size == new.cp.size && other.cp.root != new.cp.root {
            Some("has the size of the server's checkpoint but another root (a split view)")
        } else if other.cp.size > new.cp.size {
            Some("is larger than the checkpoint the server serves now (a rollback)")
        } else {
            None
        };
        if let Some(why) = bad {
            return Err(f.fail(
                format!("a checkpoint an ingest answer carried ({}) {why}", other.describe()),
                None,
                &[("answer-checkpoint", note.clone().into_bytes())],
            ));
        }
    }

    // 3. Inclusion of a sample of receipts.
    let mut sample: Vec<Receipt> = w.fresh.iter().take(INCLUSION_SAMPLE / 2).cloned().collect();
    let stored = receipts::sample(air, INCLUSION_SAMPLE)
        .map_err(|e| WitnessError::Transient(format!("cannot read the receipts: {e}")))?;
    for r in stored {
        if sample.len() >= INCLUSION_SAMPLE {
            break;
        }
        if !sample.iter().any(|s| s.source == r.source && s.id == r.id) {
            sample.push(r);
        }
    }
    for r in &sample {
        inclusion(&rec, &f, &new, r, w.now, &mut report).await?;
    }

    // 4. Re-fetch own events and compare their payloads with what was sent.
    for r in receipts::pick(sample, REFETCH_SAMPLE) {
        refetch(&rec, &f, &r, &mut report).await?;
    }

    // 5. Hold the verified head, then cosign it.
    evidence::save_held(air, &new)?;
    match w.signer {
        None => {}
        Some(signer) => match cosign(&rec, signer, &new, w.now).await {
            Ok(n) => report.witnesses = n,
            Err(why) => report.warnings.push(format!(
                "the checkpoint verified but its cosignature was not recorded: {why}"
            )),
        },
    }
    Ok(report)
}

async fn consistency<A: LogApi>(
    rec: &Recorder<'_, A>,
    f: &Fail<'_, '_, A>,
    held: &Head,
    new: &Head,
) -> Result<(), WitnessError> {
    if held.cp.size == 0 {
        return Ok(());
    }
    let path = format!("/api/v1/log/proof/consistency?from={}&to={}", held.cp.size, new.cp.size);
    let a = rec.get(&path).await?;
    if a.status == 400 {
        return Err(f.fail(
            format!(
                "the server refuses a consistency proof from tree size {} to {} (HTTP 400), \
                 though it signed both",
                held.cp.size, new.cp.size
            ),
            None,
            &[("proof.json", a.body)],
        ));
    }
    if a.status != 200 {
        return Err(unexpected(&path, &a));
    }
    let proof = serde_json::from_slice::<ProofAnswer>(&a.body)
        .ok()
        .and_then(|p| hashes_from_b64(&p.hashes));
    let result = match &proof {
        Some(p) => verify_consistency(held.cp.size, new.cp.size, &held.cp.root, &new.cp.root, p)
            .map_err(|e| e.to_string()),
        None => Err("the proof is not a list of base64 hashes".to_string()),
    };
    if let Err(why) = result {
        return Err(f.fail(
            format!(
                "the server's tree is not an extension of the one this client verified before: \
                 the consistency proof from size {} to {} fails ({why}); the history was \
                 rewritten, or others are shown another tree",
                held.cp.size, new.cp.size
            ),
            None,
            &[("proof.json", a.body)],
        ));
    }
    Ok(())
}

#[derive(serde::Deserialize)]
struct LeafAnswer {
    #[serde(default)]
    leaf_pending: bool,
    #[serde(default)]
    deadline: Option<String>,
    #[serde(default)]
    leaf_index: Option<u64>,
    #[serde(default)]
    leaf_hash: Option<String>,
}

async fn inclusion<A: LogApi>(
    rec: &Recorder<'_, A>,
    f: &Fail<'_, '_, A>,
    new: &Head,
    r: &Receipt,
    now: u64,
    report: &mut WitnessReport,
) -> Result<(), WitnessError> {
    let Some(leaf) = r.leaf() else {
        report.warnings.push(format!(
            "the receipt of {} is unreadable (its time or payload hash); it was not checked",
            r.name()
        ));
        return Ok(());
    };
    let index = match r.leaf_index {
        Some(i) => i,
        None => {
            let path = format!(
                "/api/v1/log/leaf?source={}&id={}",
                query_value(&r.source),
                query_value(&r.id)
            );
            let a = rec.get(&path).await?;
            if a.status == 404 {
                return Err(f.fail(
                    format!(
                        "event {} (received {}) that the server acknowledged to this client is \
                         gone: the log has no leaf for it any more",
                        r.name(),
                        r.received_at
                    ),
                    Some(format!("{} (leaf pending at upload)", r.name())),
                    &[("receipt.json", receipt_json(r))],
                ));
            }
            if a.status != 200 {
                return Err(unexpected(&path, &a));
            }
            let Ok(la) = serde_json::from_slice::<LeafAnswer>(&a.body) else {
                return Err(unexpected(&path, &a));
            };
            if la.leaf_pending {
                let overdue = la
                    .deadline
                    .as_deref()
                    .or(r.deadline.as_deref())
                    .and_then(evidence::parse_micros)
                    .is_some_and(|d| (now as i64).saturating_mul(1_000_000) > d + 60_000_000);
                if overdue {
                    report.warnings.push(format!(
                        "event {} is still not in the log, past the server's deadline: its \
                         sequencer is behind or stopped",
                        r.name()
                    ));
                }
                report.not_yet_covered += 1;
                return Ok(());
            }
            let (Some(i), Some(h)) = (la.leaf_index, la.leaf_hash.as_deref()) else {
                return Err(unexpected(&path, &a));
            };
            if hash_from_b64(h) != Some(leaf) {
                return Err(f.fail(
                    format!(
                        "the log's leaf for event {} is not the one this client's upload makes \
                         (leaf hash {h}, expected {}): the event was changed before it was \
                         sequenced",
                        r.name(),
                        b64(&leaf)
                    ),
                    Some(format!("{} at leaf {i}", r.name())),
                    &[("receipt.json", receipt_json(r))],
                ));
            }
            i
        }
    };
    if index >= new.cp.size {
        report.not_yet_covered += 1;
        return Ok(());
    }
    let path = format!("/api/v1/log/proof/inclusion?index={index}&tree_size={}", new.cp.size);
    let a = rec.get(&path).await?;
    if a.status != 200 && a.status != 400 {
        return Err(unexpected(&path, &a));
    }
    let proof = (a.status == 200)
        .then(|| serde_json::from_slice::<ProofAnswer>(&a.body).ok())
        .flatten()
        .and_then(|p| hashes_from_b64(&p.hashes));
    let result = match &proof {
        Some(p) => {
            verify_inclusion(&leaf, index, new.cp.size, p, &new.cp.root).map_err(|e| e.to_string())
        }
        None => Err(format!("the server gave no usable proof (HTTP {})", a.status)),
    };
    if let Err(why) = result {
        return Err(f.fail(
            format!(
                "event {} is not in the signed log as this client uploaded it: the inclusion \
                 proof of leaf {index} in tree size {} fails ({why})",
                r.name(),
                new.cp.size
            ),
            Some(format!("{} at leaf {index}", r.name())),
            &[("receipt.json", receipt_json(r)), ("proof.json", a.body)],
        ));
    }
    report.inclusion_checked += 1;
    Ok(())
}

fn receipt_json(r: &Receipt) -> Vec<u8> {
    serde_json::to_vec_pretty(r).unwrap_or_default()
}

#[derive(serde::Deserialize)]
struct EventsPage<'a> {
    #[serde(borrow)]
    events: Vec<ApiEvent<'a>>,
    #[serde(default)]
    next_cursor: Option<String>,
}

#[derive(serde::Deserialize)]
struct ApiEvent<'a> {
    user_id: String,
    source: String,
    id: String,
    received_at: String,
    #[serde(borrow, default)]
    payload: Option<&'a serde_json::value::RawValue>,
}

/// The `[since, until)` window that holds exactly an event's `received_at` as written: one
/// microsecond wide, or one millisecond when the time is written with milliseconds only.
fn window(received_at: &str) -> Option<(String, String)> {
    use crate::timefmt::{Fraction, from_micros, rfc3339};
    let at = evidence::parse_micros(received_at)?;
    let digits = received_at
        .split_once('.')
        .map_or(0, |(_, f)| f.bytes().take_while(u8::is_ascii_digit).count());
    let width = if digits >= 6 { 1 } else { 1000 };
    Some((
        rfc3339(from_micros(at), Fraction::Micros),
        rfc3339(from_micros(at + width), Fraction::Micros),
    ))
}

async fn refetch<A: LogApi>(
    rec: &Recorder<'_, A>,
    f: &Fail<'_, '_, A>,
    r: &Receipt,
    report: &mut WitnessReport,
) -> Result<(), WitnessError> {
    let Some((since, until)) = window(&r.received_at) else { return Ok(()) };
    let Some(want_leaf) = r.leaf() else { return Ok(()) };
    let named = match r.leaf_index {
        Some(i) => format!("{} at leaf {i}", r.name()),
        None => r.name(),
    };
    let base = format!(
        "/api/v1/events?user={}&source={}&since={}&until={}&limit=1000",
        query_value(&r.user_id),
        query_value(&r.source),
        query_value(&since),
        query_value(&until)
    );
    let mut cursor: Option<String> = None;
    let mut found: Vec<(String, Option<String>, Option<[u8; 32]>)> = Vec::new();
    for _ in 0..MAX_PAGES {
        let path = match &cursor {
            Some(c) => format!("{base}&cursor={}", query_value(c)),
            None => base.clone(),
        };
        let a = rec.get(&path).await?;
        if a.status != 200 {
            return Err(unexpected(&path, &a));
        }
        let Ok(page) = serde_json::from_slice::<EventsPage<'_>>(&a.body) else {
            return Err(unexpected(&path, &a));
        };
        for e in page.events.iter().filter(|e| e.id == r.id && e.source == r.source) {
            let sha = e.payload.map(|p| sha256(p.get().as_bytes()));
            let leaf = match (sha, evidence::parse_micros(&e.received_at)) {
                (Some(s), Some(at)) => {
                    Some(evidence::event_leaf(&e.user_id, &e.source, &e.id, at, s))
                }
                _ => None,
            };
            found.push((
                sha.map(|s| format!("sha256:{}", hex::encode(s))).unwrap_or_else(|| "null".into()),
                Some(e.received_at.clone()),
                leaf,
            ));
        }
        cursor = page.next_cursor;
        if cursor.is_none() || !found.is_empty() {
            break;
        }
    }
    if found.is_empty() {
        return Err(f.fail(
            format!(
                "event {} (received {}) that the server acknowledged to this client is gone: the \
                 events API does not list it",
                r.name(),
                r.received_at
            ),
            Some(named),
            &[("receipt.json", receipt_json(r))],
        ));
    }
    if found.iter().any(|(sha, _, leaf)| *sha == r.payload_sha256 && *leaf == Some(want_leaf)) {
        report.events_checked += 1;
        return Ok(());
    }
    let (sha, at, _) = &found[0];
    let what = if *sha != r.payload_sha256 {
        format!(
            "event {}'s payload on the server is not what this client sent: its SHA-256 is {sha}, \
             the upload's was {}; the stored event was edited in place",
            r.name(),
            r.payload_sha256
        )
    } else {
        format!(
            "event {} on the server does not make the leaf this client's upload makes (received \
             {}, uploaded as received {}): the stored event was edited in place",
            r.name(),
            at.as_deref().unwrap_or("?"),
            r.received_at
        )
    };
    Err(f.fail(what, Some(named), &[("receipt.json", receipt_json(r))]))
}

#[derive(serde::Deserialize)]
struct CosignAnswer {
    #[serde(default)]
    witnesses: Option<u64>,
}

async fn cosign<A: LogApi>(
    rec: &Recorder<'_, A>,
    signer: &NoteSigner,
    head: &Head,
    now: u64,
) -> Result<Option<u64>, String> {
    let line = signer.cosign(&head.body(), now).map_err(|e| e.to_string())?;
    let body = serde_json::json!({
        "checkpoint": head.note,
        "cosignature": line,
        "key": signer.cosigner_verifier().to_string(),
    });
    let a = match rec.post("/api/v1/log/cosignature", &body).await {
        Ok(a) => a,
        Err(e) => return Err(e.to_string()),
    };
    match (a.status, a.reason.as_deref()) {
        (200, _) => {
            Ok(serde_json::from_slice::<CosignAnswer>(&a.body).ok().and_then(|c| c.witnesses))
        }
        (409, Some("key_taken")) => Err(format!(
            "the server ties this machine's key ({}) to another user; a machine key belongs to \
             the first user who posts it",
            signer.cosigner_verifier()
        )),
        (status, reason) => Err(format!(
            "HTTP {status}{}: {}",
            reason.map(|r| format!(" ({r})")).unwrap_or_default(),
            String::from_utf8_lossy(&a.body).chars().take(300).collect::<String>()
        )),
    }
}

/// The evidence directory of `airlock_dir` (for messages).
pub fn evidence_dir(airlock_dir: &Path) -> PathBuf {
    super::state::dir(airlock_dir).join("evidence")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::evidence::fake::FakeServer;

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    }

    /// Receipts for every event of the fake log, as publish would have written them.
    fn receipts_of(srv: &FakeServer) -> Vec<Receipt> {
        let log = srv.log.borrow();
        log.events
            .iter()
            .enumerate()
            .map(|(i, (u, s, id, r, p))| Receipt {
                user_id: u.clone(),
                source: s.clone(),
                id: id.clone(),
                received_at: r.clone(),
                payload_sha256: super::super::state::sha(p.as_bytes()),
                leaf_index: Some(i as u64),
                deadline: None,
            })
            .collect()
    }

    struct T {
        tmp: tempfile::TempDir,
        srv: FakeServer,
        signer: NoteSigner,
    }

    impl T {
        fn new(n: usize) -> Self {
            let tmp = tempfile::tempdir().unwrap();
            let srv = FakeServer::new(n);
            receipts::append(tmp.path(), &receipts_of(&srv)).unwrap();
            Self { tmp, srv, signer: NoteSigner::generate("airlock-machine/test").unwrap() }
        }

        fn go(&self, fresh: &[Receipt]) -> Result<WitnessReport, WitnessError> {
            let key = self.srv.key();
            let w = Witness {
                airlock_dir: self.tmp.path(),
                key: &key,
                signer: Some(&self.signer),
                fresh,
                answer_checkpoints: &[],
                now: 1_800_000_000,
            };
            run(witness(&self.srv, &w))
        }

        fn held(&self) -> Option<Head> {
            evidence::load_held(self.tmp.path(), &self.srv.key()).unwrap()
        }
    }

    fn inconsistent(r: Result<WitnessReport, WitnessError>) -> Inconsistency {
        match r {
            Err(WitnessError::Inconsistent(i)) => *i,
            other => panic!("expected an inconsistency, got {other:?}"),
        }
    }

    #[test]
    fn an_honest_log_is_witnessed_held_and_cosigned() {
        let t = T::new(6);
        let r = t.go(&[]).unwrap();
        assert_eq!(
            (r.tree_size, r.from_size, r.inclusion_checked, r.events_checked),
            (6, None, 6, 6)
        );
        assert_eq!(r.witnesses, Some(1));
        assert_eq!(t.held().unwrap().cp.size, 6);
        let cos = t.srv.cosignatures.borrow()[0].clone();
        assert_eq!(cos["key"], t.signer.cosigner_verifier().to_string());
        // The cosignature verifies over the checkpoint's body.
        let sig = crate::tlog::note::parse_sig_line(cos["cosignature"].as_str().unwrap()).unwrap();
        let body = t.held().unwrap().body();
        crate::tlog::note::verify_cosignature_line(&body, &sig, &t.signer.cosigner_verifier())
            .unwrap();
        // The log grows: the consistency proof is checked, the head advances.
        t.srv.add("later", "{\"x\":1}");
        t.srv.time.set(1100);
        let r = t.go(&[]).unwrap();
        assert_eq!((r.tree_size, r.from_size), (7, Some(6)));
        assert!(t.srv.requests.borrow().iter().any(|q| q.contains("consistency?from=6&to=7")));
        assert!(!t.tmp.path().join("publish/evidence").exists());
    }

    #[test]
    fn a_forged_signature_is_refused_with_evidence() {
        let t = T::new(3);
        t.go(&[]).unwrap();
        let mut forged = crate::evidence::export::tests::FakeLog::new(3);
        forged.signer = NoteSigner::generate("review.test/log").unwrap();
        *t.srv.checkpoint.borrow_mut() = Some(forged.note(2000));
        let i = inconsistent(t.go(&[]));
        assert!(i.what.contains("does not verify"), "{i:?}");
        let dir = std::path::PathBuf::from(&i.evidence);
        assert!(dir.join("server-checkpoint").exists() && dir.join("held-checkpoint").exists());
        assert!(dir.join("answers.jsonl").exists());
        assert!(i.message().contains("THE REVIEW SERVER'S LOG IS INCONSISTENT"));
        assert_eq!(t.held().unwrap().cp.time(), Some(1000), "held not advanced");
    }

    #[test]
    fn truncation_replay_and_split_view_are_refused() {
        let t = T::new(10);
        t.go(&[]).unwrap();
        let log_note = |size: u64, time: u64| {
            let log = t.srv.log.borrow();
            log.note_at(size, log.root_at(size), time)
        };
        // A smaller tree.
        *t.srv.checkpoint.borrow_mut() = Some(log_note(8, 2000));
        assert!(inconsistent(t.go(&[])).what.contains("smaller"));
        // The same tree signed earlier: a replay.
        *t.srv.checkpoint.borrow_mut() = Some(log_note(10, 900));
        assert!(inconsistent(t.go(&[])).what.contains("replayed"));
        // Same size, another root.
        let mut fork = crate::evidence::export::tests::FakeLog::new(9);
        fork.signer = NoteSigner::parse(&t.srv.log.borrow().signer.to_private_string()).unwrap();
        fork.add("other", "{}");
        *t.srv.checkpoint.borrow_mut() = Some(fork.note(2000));
        assert!(inconsistent(t.go(&[])).what.contains("split view"));
        // A larger fork: the consistency proof fails.
        let mut fork = crate::evidence::export::tests::FakeLog::new(9);
        fork.signer = NoteSigner::parse(&t.srv.log.borrow().signer.to_private_string()).unwrap();
        for i in 0..5 {
            fork.add(&format!("f{i}"), "{}");
        }
        for i in 0..4 {
            t.srv.add(&format!("g{i}"), "{}");
        }
        *t.srv.checkpoint.borrow_mut() = Some(fork.note(2000));
        let i = inconsistent(t.go(&[]));
        assert!(i.what.contains("consistency proof from size 10 to 14 fails"), "{i:?}");
        assert!(std::path::Path::new(&i.evidence).join("proof.json").exists());
        assert_eq!(t.held().unwrap().cp.size, 10);
    }

    #[test]
    fn an_edited_or_deleted_event_is_named() {
        let t = T::new(5);
        t.go(&[]).unwrap();
        // The owner edits event e2's payload in place: the tree stays valid.
        t.srv.stored.borrow_mut()[2] = Some("{\"n\": 2, \"s\":\"y\"}".into());
        let i = inconsistent(t.go(&[]));
        assert_eq!(i.event.as_deref(), Some("egress/e2 at leaf 2"), "{i:?}");
        assert!(i.what.contains("payload on the server is not what this client sent"), "{i:?}");
        // Restored, then deleted.
        t.srv.stored.borrow_mut()[2] = Some(t.srv.log.borrow().events[2].4.clone());
        t.go(&[]).unwrap();
        t.srv.stored.borrow_mut()[3] = None;
        let i = inconsistent(t.go(&[]));
        assert_eq!(i.event.as_deref(), Some("egress/e3 at leaf 3"), "{i:?}");
        assert!(i.what.contains("is gone"), "{i:?}");
    }

    #[test]
    fn a_receipt_the_log_does_not_prove_is_named() {
        let t = T::new(5);
        let mut rs = receipts_of(&t.srv);
        // The client sent other bytes than the log recorded for e1.
        rs[1].payload_sha256 = super::super::state::sha(b"{\"other\":1}");
        std::fs::remove_dir_all(receipts::dir(t.tmp.path())).unwrap();
        receipts::append(t.tmp.path(), &rs[1..2]).unwrap();
        let i = inconsistent(t.go(&[]));
        assert_eq!(i.event.as_deref(), Some("egress/e1 at leaf 1"), "{i:?}");
        assert!(i.what.contains("inclusion"), "{i:?}");
    }

    #[test]
    fn pending_receipts_are_resolved_and_unreachable_is_transient() {
        let t = T::new(4);
        let mut rs = receipts_of(&t.srv);
        rs[3].leaf_index = None;
        rs[3].deadline = Some("2026-07-24T18:04:00.000000Z".into());
        std::fs::remove_dir_all(receipts::dir(t.tmp.path())).unwrap();
        receipts::append(t.tmp.path(), &rs[3..4]).unwrap();
        let r = t.go(&[]).unwrap();
        assert_eq!(r.inclusion_checked, 1);
        assert!(
            t.srv
                .requests
                .borrow()
                .iter()
                .any(|q| q.contains("/api/v1/log/leaf?source=egress&id=e3"))
        );
        // Still pending long after the deadline: a warning, not a failure.
        t.srv.pending.borrow_mut().push("e3".into());
        let r = t.go(&[]).unwrap();
        assert_eq!(r.not_yet_covered, 1);
        assert!(r.warnings.iter().any(|w| w.contains("past the server's deadline")), "{r:?}");
        // Unreachable: not evidence; the held head stays.
        t.srv.down.set(true);
        assert!(matches!(t.go(&[]), Err(WitnessError::Transient(_))));
    }

    #[test]
    fn windows_match_the_written_precision() {
        assert_eq!(
            window("2026-07-24T18:03:11.482113Z").unwrap(),
            ("2026-07-24T18:03:11.482113Z".into(), "2026-07-24T18:03:11.482114Z".into())
        );
        assert_eq!(
            window("2026-07-24T18:03:11.482Z").unwrap().1,
            "2026-07-24T18:03:11.483000Z".to_string()
        );
    }
}
