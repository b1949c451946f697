//! `airlock verify EXPORT`: the offline check of a `GET /api/v1/export` file
//! (docs/evidence.md "Exports"), streamed line by line in constant memory.
//!
//! What is checked, with the log key the caller trusts (the pinned one, or `--key`):
//!
//! - the header's `log.key` is that key, and `log.checkpoint` is signed by it;
//! - every `log.consistency` entry: an earlier checkpoint signed by the key, and a
//!   consistency proof from it to the export's checkpoint;
//! - every event line: its leaf rebuilt from `user_id`, `source`, `id`, `received_at` and the
//!   SHA-256 of the payload's JSON text exactly as the line embeds it, and its inclusion proof
//!   in the export's checkpoint (`leaf: null`: not covered by that checkpoint, a warning);
//! - every `missing` line: a leaf in the log whose event the store no longer has (a failure,
//!   whatever its proof says);
//! - the `end` line and its counts (a file without it was cut short);
//! - the checkpoint this client holds, when it has one: the same size must have the same root,
//!   a smaller one must be the start of one of the export's consistency proofs.

use std::borrow::Cow;
use std::io::BufRead;

use serde::Deserialize;
use serde::de::Deserializer;
use serde_json::value::RawValue;

use super::{Head, event_leaf, hashes_from_b64, parse_micros};
use crate::tlog::merkle::{Hash, PathCache, verify_consistency, verify_inclusion_cached};
use crate::tlog::note::NoteVerifier;
use crate::tlog::{b64, sha256};

/// At most this many failures are listed one by one (all are counted).
pub const MAX_LISTED: usize = 1000;

/// Why an export cannot be checked at all (exit 125).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("cannot read the export: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "this is not an Airlock export ({0}); give a file saved from `GET /api/v1/export` \
         (the console's Export button)"
    )]
    NotAnExport(String),
    #[error(
        "the export carries no log (`\"log\": null`): its server keeps no signed log, so there \
         is nothing to verify; start the server with `--log-key FILE` (docs/evidence.md)"
    )]
    NoLog,
}

/// One failed check.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Failure {
    /// `checkpoint`, `key`, `consistency`, `inclusion`, `payload`, `missing`, `truncated`,
    /// `held`, `line`.
    pub kind: &'static str,
    /// 1-based line of the export, when the failure is one line's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leaf_index: Option<u64>,
    pub message: String,
}

/// What the check found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExportReport {
    /// The export's checkpoint: `tree_size`, `root` (base64), `time`.
    pub tree_size: Option<u64>,
    pub root: Option<String>,
    pub time: Option<u64>,
    /// Event lines read.
    pub events: u64,
    /// Events whose inclusion in the checkpoint verified.
    pub verified: u64,
    /// Events with `leaf: null`: sequenced after the export's checkpoint, or not yet.
    pub not_covered: u64,
    /// `missing` lines: leaves whose event rows are gone.
    pub missing: u64,
    /// Consistency proofs verified.
    pub consistency: u64,
    /// Whether the server looked for missing events (an export narrowed by a filter cannot).
    pub orphans_checked: bool,
    /// Every failure counted; the first [`MAX_LISTED`] are in `failures`.
    pub failure_count: u64,
    pub failures: Vec<Failure>,
    pub warnings: Vec<String>,
}

impl ExportReport {
    pub fn ok(&self) -> bool {
        self.failure_count == 0
    }

    fn fail(&mut self, f: Failure) {
        self.failure_count += 1;
        if self.failures.len() < MAX_LISTED {
            self.failures.push(f);
        }
    }

    fn fail_whole(&mut self, kind: &'static str, message: String) {
        self.fail(Failure { kind, line: None, source: None, id: None, leaf_index: None, message });
    }
}

#[derive(Deserialize)]
struct Header {
    export: HeaderBody,
}

#[derive(Deserialize)]
struct HeaderBody {
    #[serde(default, deserialize_with = "present")]
    log: Option<Option<LogHeader>>,
}

#[derive(Deserialize)]
struct LogHeader {
    key: String,
    checkpoint: String,
    tree_size: u64,
    #[serde(default)]
    consistency: Vec<ConsistencyEntry>,
    #[serde(default)]
    orphans_checked: bool,
}

#[derive(Deserialize)]
struct ConsistencyEntry {
    checkpoint: String,
    hashes: Vec<String>,
}

/// `Some(x)` when the member is present (`x` being `None` for `null`), `None` when absent
/// (with `#[serde(default)]`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct EventLine<'a> {
    #[serde(borrow)]
    user_id: Cow<'a, str>,
    #[serde(borrow)]
    source: Cow<'a, str>,
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow)]
    received_at: Cow<'a, str>,
    #[serde(borrow, default)]
    payload: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    leaf: Option<Option<LeafRef<'a>>>,
}

#[derive(Deserialize)]
struct LeafRef<'a> {
    index: u64,
    #[serde(borrow)]
    hashes: Vec<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct MissingLine<'a> {
    #[serde(borrow)]
    missing: MissingBody<'a>,
}

#[derive(Deserialize)]
struct MissingBody<'a> {
    leaf_index: u64,
    #[serde(borrow, default)]
    user_id: Cow<'a, str>,
    #[serde(borrow, default)]
    source: Cow<'a, str>,
    #[serde(borrow, default)]
    id: Cow<'a, str>,
    #[serde(borrow, default)]
    received_at: Cow<'a, str>,
    #[serde(borrow)]
    leaf_hash: Cow<'a, str>,
    #[serde(borrow, default)]
    hashes: Vec<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct EndLine {
    end: EndBody,
}

#[derive(Deserialize)]
struct EndBody {
    events: u64,
    missing: u64,
}

/// The tree the events are checked against.
struct Tree {
    size: u64,
    root: Hash,
    cache: PathCache,
}

/// Checks an export read from `input` with `key`, against `held` (this client's verified
/// checkpoint, opened with the same key) when given. `Err` only when the file cannot be
/// checked at all; every finding is in the report.
pub fn verify_export<R: BufRead>(
    mut input: R,
    key: &NoteVerifier,
    held: Option<&Head>,
) -> Result<ExportReport, ExportError> {
    let mut report = ExportReport::default();
    let mut line = Vec::with_capacity(64 << 10);
    let n = input.read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(ExportError::NotAnExport("the file is empty".into()));
    }
    let header: Header = serde_json::from_slice(trim_newline(&line)).map_err(|e| {
        ExportError::NotAnExport(format!("its first line is not an `export` header: {e}"))
    })?;
    let log = match header.export.log {
        Some(Some(log)) => log,
        Some(None) => return Err(ExportError::NoLog),
        None => {
            return Err(ExportError::NotAnExport(
                "the header has no `log` member: the server predates the review log".into(),
            ));
        }
    };
    report.orphans_checked = log.orphans_checked;
    let tree = match check_header(&log, key, held, &mut report) {
        Some(t) => t,
        // The checkpoint itself does not verify: no event can be checked against it.
        None => return Ok(report),
    };
    let mut tree = tree;
    let mut lineno = 1u64;
    let mut ended: Option<EndBody> = None;
    loop {
        line.clear();
        let n = input.read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        lineno += 1;
        let text = trim_newline(&line);
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if ended.is_some() {
            report.fail(Failure {
                kind: "line",
                line: Some(lineno),
                source: None,
                id: None,
                leaf_index: None,
                message: "data after the `end` line".into(),
            });
            break;
        }
        if let Ok(ev) = serde_json::from_slice::<EventLine<'_>>(text) {
            report.events += 1;
            check_event(&ev, lineno, &mut tree, &mut report);
            continue;
        }
        if let Ok(m) = serde_json::from_slice::<MissingLine<'_>>(text) {
            report.missing += 1;
            check_missing(&m.missing, lineno, &mut tree, &mut report);
            continue;
        }
        if let Ok(e) = serde_json::from_slice::<EndLine>(text) {
            ended = Some(e.end);
            continue;
        }
        let why = match serde_json::from_slice::<serde_json::Value>(text) {
            Ok(_) => "neither an event, a `missing` line nor the `end` line".to_string(),
            Err(e) => format!("not JSON ({e})"),
        };
        report.fail(Failure {
            kind: "line",
            line: Some(lineno),
            source: None,
            id: None,
            leaf_index: None,
            message: format!("line {lineno} is {why}"),
        });
    }
    match ended {
        None => report.fail_whole(
            "truncated",
            format!(
                "export truncated: no `end` line after line {lineno}; the file was cut short \
                 (export it again)"
            ),
        ),
        Some(e) if e.events != report.events || e.missing != report.missing => {
            report.fail_whole(
                "truncated",
                format!(
                    "export truncated or altered: the `end` line counts {} events and {} \
                     missing, the file holds {} and {}",
                    e.events, e.missing, report.events, report.missing
                ),
            );
        }
        Some(_) => {}
    }
    if report.not_covered > 0 {
        report.warnings.push(format!(
            "{} events are not covered by the export's checkpoint (sequenced after it, or not \
             yet): export again later to check them",
            report.not_covered
        ));
    }
    if !report.orphans_checked {
        report.warnings.push(
            "the export is narrowed by a filter, so the server did not look for leaves whose \
             events are gone (export without filters to check that too)"
                .into(),
        );
    }
    Ok(report)
}

fn trim_newline(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The key, checkpoint, consistency entries and the held checkpoint. `None` when the
/// checkpoint does not verify (nothing else can be checked then).
fn check_header(
    log: &LogHeader,
    key: &NoteVerifier,
    held: Option<&Head>,
    report: &mut ExportReport,
) -> Option<Tree> {
    let ours = key.to_string();
    if log.key.trim() != ours {
        report.fail_whole(
            "key",
            format!(
                "the export names the log key {} but the key checked with is {ours}: it comes \
                 from another log (give that log's key with --key FILE if you trust it) or was \
                 altered",
                log.key.trim()
            ),
        );
        return None;
    }
    let head = match Head::open(&log.checkpoint, key) {
        Ok(h) => h,
        Err(e) => {
            report.fail_whole(
                "checkpoint",
                format!("the export's checkpoint does not verify with the log key: {e}"),
            );
            return None;
        }
    };
    report.tree_size = Some(head.cp.size);
    report.root = Some(b64(&head.cp.root));
    report.time = head.cp.time();
    if log.tree_size != head.cp.size {
        report.fail_whole(
            "checkpoint",
            format!(
                "the header's tree_size {} is not its signed checkpoint's size {}",
                log.tree_size, head.cp.size
            ),
        );
    }
    let mut earlier: Vec<Head> = Vec::new();
    for (i, entry) in log.consistency.iter().enumerate() {
        let old = match Head::open(&entry.checkpoint, key) {
            Ok(h) => h,
            Err(e) => {
                report.fail_whole(
                    "consistency",
                    format!("consistency entry {}: its checkpoint does not verify: {e}", i + 1),
                );
                continue;
            }
        };
        let Some(hashes) = hashes_from_b64(&entry.hashes) else {
            report.fail_whole(
                "consistency",
                format!("consistency entry {}: a proof hash is not 32 bytes of base64", i + 1),
            );
            continue;
        };
        match verify_consistency(old.cp.size, head.cp.size, &old.cp.root, &head.cp.root, &hashes) {
            Ok(()) => {
                report.consistency += 1;
                earlier.push(old);
            }
            Err(e) => report.fail_whole(
                "consistency",
                format!(
                    "the log is not append-only between its signed heads: the proof from {} \
                     to {} fails ({e})",
                    old.describe(),
                    head.describe()
                ),
            ),
        }
    }
    if let Some(h) = held {
        compare_held(h, &head, &earlier, report);
    }
    Some(Tree { size: head.cp.size, root: head.cp.root, cache: PathCache::default() })
}

fn compare_held(held: &Head, head: &Head, earlier: &[Head], report: &mut ExportReport) {
    let (hs, es) = (held.cp.size, head.cp.size);
    if hs == es {
        if held.cp.root != head.cp.root {
            report.fail_whole(
                "held",
                format!(
                    "split view: the checkpoint this client holds and the export's have the same \
                     size and different roots\n  held:   {}\n  export: {}",
                    held.describe(),
                    head.describe()
                ),
            );
        }
        return;
    }
    if hs < es {
        match earlier.iter().find(|e| e.cp.size == hs) {
            Some(e) if e.cp.root == held.cp.root => {}
            Some(e) => report.fail_whole(
                "held",
                format!(
                    "split view: the export's consistency proof starts from another tree of the \
                     held size\n  held:   {}\n  export: {}",
                    held.describe(),
                    e.describe()
                ),
            ),
            None => report.warnings.push(format!(
                "the export has no consistency proof from the checkpoint this client holds \
                 (size {hs}); `airlock verify --checkpoint` with the export's checkpoint asks \
                 the server for one"
            )),
        }
        return;
    }
    report.warnings.push(format!(
        "the export's checkpoint (size {es}) is older than the one this client holds (size \
         {hs}); it cannot be compared offline"
    ));
}

fn check_event(ev: &EventLine<'_>, lineno: u64, tree: &mut Tree, report: &mut ExportReport) {
    let fail = |report: &mut ExportReport, kind, leaf_index, message: String| {
        report.fail(Failure {
            kind,
            line: Some(lineno),
            source: Some(ev.source.to_string()),
            id: Some(ev.id.to_string()),
            leaf_index,
            message,
        });
    };
    let leaf = match &ev.leaf {
        None => {
            fail(report, "inclusion", None, "the event line has no `leaf` member".into());
            return;
        }
        Some(None) => {
            report.not_covered += 1;
            return;
        }
        Some(Some(l)) => l,
    };
    let index = leaf.index;
    let Some(payload) = ev.payload else {
        fail(
            report,
            "payload",
            Some(index),
            "the payload is null: its leaf cannot be rebuilt".into(),
        );
        return;
    };
    let Some(received_at) = parse_micros(&ev.received_at) else {
        fail(
            report,
            "inclusion",
            Some(index),
            format!("received_at {:?} is not an RFC 3339 time", ev.received_at),
        );
        return;
    };
    let Some(hashes) = hashes_from_b64(&leaf.hashes) else {
        fail(report, "inclusion", Some(index), "a proof hash is not 32 bytes of base64".into());
        return;
    };
    let hash =
        event_leaf(&ev.user_id, &ev.source, &ev.id, received_at, sha256(payload.get().as_bytes()));
    match verify_inclusion_cached(&hash, index, tree.size, &hashes, &tree.root, &mut tree.cache) {
        Ok(()) => report.verified += 1,
        Err(e) => fail(
            report,
            "inclusion",
            Some(index),
            format!(
                "event {}/{} at leaf {index} does not match the signed log ({e}): its payload, \
                 user, id or received_at differs from what the log recorded, or the proof is \
                 wrong",
                ev.source, ev.id
            ),
        ),
    }
}

fn check_missing(m: &MissingBody<'_>, lineno: u64, tree: &mut Tree, report: &mut ExportReport) {
    let proof = crate::tlog::hash_from_b64(&m.leaf_hash).zip(hashes_from_b64(&m.hashes)).map(
        |(leaf, hashes)| {
            verify_inclusion_cached(
                &leaf,
                m.leaf_index,
                tree.size,
                &hashes,
                &tree.root,
                &mut tree.cache,
            )
        },
    );
    let proven = match proof {
        Some(Ok(())) => "its inclusion proof verifies".to_string(),
        Some(Err(e)) => format!("its inclusion proof does not verify either ({e})"),
        None => "its leaf hash or proof is not base64".to_string(),
    };
    report.fail(Failure {
        kind: "missing",
        line: Some(lineno),
        source: Some(m.source.to_string()),
        id: Some(m.id.to_string()),
        leaf_index: Some(m.leaf_index),
        message: format!(
            "event {}/{} (user {}, received {}) at leaf {} is in the log but not in the store: \
             its row was deleted; {proven}",
            m.source, m.id, m.user_id, m.received_at, m.leaf_index
        ),
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;
    use crate::tlog::merkle::{MemTree, Prover};
    use crate::tlog::note::{Checkpoint, NoteSigner};

    /// A log of events with an export writer, as the server writes one.
    pub(crate) struct FakeLog {
        pub signer: NoteSigner,
        pub tree: MemTree,
        /// (user, source, id, received_at text, payload text).
        pub events: Vec<(String, String, String, String, String)>,
    }

    impl FakeLog {
        pub fn new(n: usize) -> Self {
            let signer = NoteSigner::generate("review.test/log").unwrap();
            let mut log = Self { signer, tree: MemTree::new(), events: Vec::new() };
            for i in 0..n {
                log.add(&format!("e{i}"), &format!("{{\"n\": {i}, \"s\":\"x\"}}"));
            }
            log
        }

        pub fn add(&mut self, id: &str, payload: &str) {
            let i = self.events.len();
            let received = format!("2026-07-24T18:03:{:02}.{:06}Z", i % 60, 1000 + i);
            let leaf = event_leaf(
                "u_1",
                "egress",
                id,
                parse_micros(&received).unwrap(),
                sha256(payload.as_bytes()),
            );
            self.tree.push(leaf);
            self.events.push(("u_1".into(), "egress".into(), id.into(), received, payload.into()));
        }

        pub fn note_at(&self, size: u64, root: Hash, time: u64) -> String {
            let cp = Checkpoint {
                origin: self.signer.name().into(),
                size,
                root,
                extensions: vec![format!("time {time}")],
            };
            self.signer.sign_note(&cp.body()).unwrap()
        }

        pub fn note(&self, time: u64) -> String {
            self.note_at(self.tree.size(), self.tree.root(), time)
        }

        pub fn root_at(&self, size: u64) -> Hash {
            Prover::new(&self.tree).root(size).unwrap()
        }

        pub fn inclusion(&self, index: u64, size: u64) -> Vec<String> {
            Prover::new(&self.tree)
                .inclusion(index, size)
                .unwrap()
                .unwrap()
                .iter()
                .map(|h| b64(h))
                .collect()
        }

        pub fn consistency(&self, from: u64, to: u64) -> Vec<String> {
            Prover::new(&self.tree)
                .consistency(from, to)
                .unwrap()
                .unwrap()
                .iter()
                .map(|h| b64(h))
                .collect()
        }

        /// The export: every event, the first `covered` of them in the checkpoint of that
        /// size, a consistency entry from `from` when given, `missing` leaves listed.
        pub fn export(&self, covered: u64, from: Option<u64>, missing: &[usize]) -> String {
            let note = self.note_at(covered, self.root_at(covered), 2000);
            let consistency: Vec<serde_json::Value> = from
                .map(|f| {
                    vec![serde_json::json!({
                        "checkpoint": self.note_at(f, self.root_at(f), 1000),
                        "hashes": self.consistency(f, covered),
                    })]
                })
                .unwrap_or_default();
            let header = serde_json::json!({"export": {"query": {}, "format": 1, "log": {
                "key": self.signer.verifier().to_string(), "checkpoint": note,
                "tree_size": covered, "consistency": consistency, "orphans_checked": true}}});
            let mut out = format!("{header}\n");
            let mut events = 0;
            for (i, (u, s, id, r, p)) in self.events.iter().enumerate() {
                if missing.contains(&i) {
                    continue;
                }
                events += 1;
                let leaf = if (i as u64) < covered {
                    format!(
                        "{{\"index\":{i},\"hashes\":{}}}",
                        serde_json::to_string(&self.inclusion(i as u64, covered)).unwrap()
                    )
                } else {
                    "null".into()
                };
                out.push_str(&format!(
                    "{{\"pk\":{},\"user_id\":\"{u}\",\"source\":\"{s}\",\"id\":\"{id}\",\"type\":\"connect\",\"ts\":\"{r}\",\"received_at\":\"{r}\",\"payload\":{p},\"conflict_of\":null,\"leaf\":{leaf}}}\n",
                    i + 1
                ));
            }
            for &i in missing {
                let (u, s, id, r, _) = &self.events[i];
                let m = serde_json::json!({"missing": {"leaf_index": i, "user_id": u, "source": s,
                    "id": id, "received_at": r, "leaf_hash": b64(&self.tree.tiers[0][i]),
                    "hashes": self.inclusion(i as u64, covered)}});
                out.push_str(&format!("{m}\n"));
            }
            out.push_str(&format!(
                "{{\"end\":{{\"events\":{events},\"missing\":{}}}}}\n",
                missing.len()
            ));
            out
        }
    }

    fn check(text: &str, log: &FakeLog, held: Option<&Head>) -> ExportReport {
        verify_export(text.as_bytes(), &log.signer.verifier(), held).unwrap()
    }

    #[test]
    fn a_good_export_verifies_with_uncovered_events_as_warnings() {
        let log = FakeLog::new(300);
        let r = check(&log.export(290, Some(100), &[]), &log, None);
        assert!(r.ok(), "{r:?}");
        assert_eq!((r.events, r.verified, r.not_covered, r.consistency), (300, 290, 10, 1));
        assert!(r.warnings.iter().any(|w| w.contains("10 events are not covered")), "{r:?}");
    }

    #[test]
    fn one_byte_changed_in_a_payload_names_the_event() {
        let log = FakeLog::new(50);
        let text = log.export(50, None, &[]).replace("{\"n\": 17,", "{\"n\": 18,");
        let r = check(&text, &log, None);
        assert_eq!(r.failure_count, 1, "{r:?}");
        let f = &r.failures[0];
        assert_eq!((f.kind, f.id.as_deref(), f.leaf_index), ("inclusion", Some("e17"), Some(17)));
        assert!(f.message.contains("egress/e17 at leaf 17"), "{}", f.message);
        // Whitespace counts: the payload is hashed as embedded.
        let text = log.export(50, None, &[]).replace("{\"n\": 3,", "{\"n\":3,");
        assert_eq!(check(&text, &log, None).failures[0].id.as_deref(), Some("e3"));
    }

    #[test]
    fn truncation_and_count_mismatch_fail() {
        let log = FakeLog::new(20);
        let text = log.export(20, None, &[]);
        let cut: String = text.lines().take(10).map(|l| format!("{l}\n")).collect();
        let r = check(&cut, &log, None);
        assert_eq!(r.failure_count, 1);
        assert!(r.failures[0].message.contains("export truncated"), "{r:?}");
        // A line dropped from the middle: the end line's count says so.
        let mut lines: Vec<&str> = text.lines().collect();
        lines.remove(5);
        let r = check(&(lines.join("\n") + "\n"), &log, None);
        assert!(r.failures.iter().any(|f| f.kind == "truncated"), "{r:?}");
        // Cut inside the last line.
        let r = check(&text[..text.len() - 5], &log, None);
        assert!(!r.ok());
    }

    #[test]
    fn a_forged_signature_or_another_key_checks_nothing_else() {
        let log = FakeLog::new(5);
        let other = FakeLog::new(5);
        // The same export checked with another log's key.
        let r = verify_export(log.export(5, None, &[]).as_bytes(), &other.signer.verifier(), None)
            .unwrap();
        assert_eq!((r.failures[0].kind, r.events), ("key", 0));
        // A checkpoint signed by another key under the right key's name.
        let mut forged = FakeLog::new(5);
        forged.signer = NoteSigner::generate("review.test/log").unwrap();
        let text = log.export(5, None, &[]).replace(
            &serde_json::to_string(&log.note_at(5, log.root_at(5), 2000)).unwrap(),
            &serde_json::to_string(&forged.note_at(5, log.root_at(5), 2000)).unwrap(),
        );
        let r = check(&text, &log, None);
        assert_eq!(r.failures[0].kind, "checkpoint", "{r:?}");
        assert!(r.failures[0].message.contains("does not verify"), "{r:?}");
    }

    #[test]
    fn missing_events_are_failures_named_by_leaf() {
        let log = FakeLog::new(40);
        let r = check(&log.export(40, None, &[7]), &log, None);
        assert_eq!((r.failure_count, r.missing, r.verified), (1, 1, 39), "{r:?}");
        let f = &r.failures[0];
        assert_eq!((f.kind, f.leaf_index, f.id.as_deref()), ("missing", Some(7), Some("e7")));
        assert!(f.message.contains("is in the log but not in the store"), "{}", f.message);
        assert!(f.message.contains("its inclusion proof verifies"), "{}", f.message);
    }

    #[test]
    fn the_held_checkpoint_is_compared() {
        let log = FakeLog::new(30);
        let key = log.signer.verifier();
        let held = Head::open(&log.note_at(10, log.root_at(10), 900), &key).unwrap();
        // A consistency entry from the held size: fine.
        let r = check(&log.export(30, Some(10), &[]), &log, Some(&held));
        assert!(r.ok() && r.warnings.is_empty(), "{r:?}");
        // None from there: a warning.
        let r = check(&log.export(30, Some(20), &[]), &log, Some(&held));
        assert!(r.ok() && r.warnings.iter().any(|w| w.contains("size 10")), "{r:?}");
        // Split view: the held head of the export's size has another root.
        let mut fork = FakeLog::new(29);
        fork.signer = NoteSigner::parse(&log.signer.to_private_string()).unwrap();
        fork.add("other", "{}");
        let split = Head::open(&fork.note(950), &key).unwrap();
        let r = check(&log.export(30, None, &[]), &log, Some(&split));
        assert_eq!(r.failures[0].kind, "held", "{r:?}");
        assert!(r.failures[0].message.contains("split view"), "{r:?}");
    }

    #[test]
    fn a_tampered_consistency_proof_fails() {
        let log = FakeLog::new(30);
        let text = log.export(30, Some(10), &[]);
        let good = serde_json::to_string(&log.consistency(10, 30)).unwrap();
        let mut bad = log.consistency(10, 30);
        bad[0] = b64(&sha256(b"x"));
        let text = text.replace(&good, &serde_json::to_string(&bad).unwrap());
        let r = check(&text, &log, None);
        assert!(r.failures.iter().any(|f| f.kind == "consistency"), "{r:?}");
    }

    #[test]
    fn not_an_export_cannot_be_checked() {
        let log = FakeLog::new(1);
        let key = log.signer.verifier();
        assert!(matches!(verify_export(&b""[..], &key, None), Err(ExportError::NotAnExport(_))));
        assert!(matches!(
            verify_export(&b"{\"pk\":1}\n"[..], &key, None),
            Err(ExportError::NotAnExport(_))
        ));
        assert!(matches!(
            verify_export(&b"{\"export\":{\"log\":null}}\n"[..], &key, None),
            Err(ExportError::NoLog)
        ));
    }
}
