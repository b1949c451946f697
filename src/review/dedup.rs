//! Dedup with conflicts as evidence (docs/api.md, "Duplicates and conflicts"): what the stores
//! decide when an item's `(user, source, id)` is already stored. Pure functions only; the
//! stores (`store/sqlite.rs`, `store/postgres.rs`) fetch what a decision needs and write
//! what it says, inside the ingest transaction.
//!
//! - Every stored content of a key keeps the SHA-256 of its payload bytes as received (the
//!   payload text stored verbatim): the original in `event_keys.sha256`, each later different
//!   content in `event_conflicts`.
//! - A resend whose payload hash equals any stored content of its key (original or conflict)
//!   is a `duplicate` of that content, so retries never multiply conflicts.
//! - For `source: "claude"` a line that is [Claude-identical](claude_identical) to a stored
//!   content is a `duplicate` too (resumed sessions copy lines under a new `sessionId`).
//! - Anything else is a `conflict`: stored as its own event with `conflict_of` naming the
//!   original, scanned by detection like any event, and flagged `dedup.conflict`.
//!
//! A hash of `None` is "unknown" (a row that predates migration 2 and was not backfilled;
//! migration 2 backfills all of them): it is then computed from the stored payload, so an
//! unknown hash never makes a resend a conflict or a conflict a duplicate.

use super::detect::flag_id;
use super::{Micros, NewFlag, Severity, Source};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A SHA-256 digest.
pub type Hash = [u8; 32];

/// Rule id of the flag a conflict raises.
pub const CONFLICT_RULE: &str = "dedup.conflict";

/// The SHA-256 of a payload's bytes as received (its stored text).
pub fn payload_sha256(payload: &str) -> Hash {
    Sha256::digest(payload.as_bytes()).into()
}

/// One stored content of a key, as the store read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredContent<'a> {
    pub pk: i64,
    pub received_at: Micros,
    /// `None`: unknown (see the module doc); then `payload` must be given.
    pub sha256: Option<Hash>,
    /// The stored payload text: needed when `sha256` is unknown, and for `claude` keys when
    /// no hash matches ([`needs_payloads`]); `None` otherwise.
    pub payload: Option<&'a str>,
}

impl StoredContent<'_> {
    fn hash(&self) -> Option<Hash> {
        self.sha256.or_else(|| self.payload.map(payload_sha256))
    }
}

/// A stored content as a store reads it (owned); [`view`] lends it to [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRow {
    pub pk: i64,
    pub received_at: Micros,
    pub sha256: Option<Hash>,
    pub payload: Option<String>,
}

/// Borrowed views of `rows`, in order.
pub fn view(rows: &[StoredRow]) -> Vec<StoredContent<'_>> {
    rows.iter()
        .map(|s| StoredContent {
            pk: s.pk,
            received_at: s.received_at,
            sha256: s.sha256,
            payload: s.payload.as_deref(),
        })
        .collect()
}

/// A nullable hash column's bytes; a value that is not 32 bytes reads as unknown.
pub fn hash_from(bytes: Option<Vec<u8>>) -> Option<Hash> {
    bytes.and_then(|b| Hash::try_from(b.as_slice()).ok())
}

/// What a conflict stores beside its event: the original and both hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conflict {
    /// `pk` of the key's original event.
    pub original_pk: i64,
    /// The original's payload hash (`None` only if it was unknown and its payload unread).
    pub original_sha256: Option<Hash>,
    /// This content's payload hash.
    pub sha256: Hash,
}

/// The decision for one item whose key may already be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The key is new: store the event as the key's original.
    Create,
    /// The same content is stored: answer `duplicate` with that content's event.
    Duplicate { pk: i64, received_at: Micros },
    /// A different content: store it as its own event, a conflict of the original.
    Conflict(Conflict),
}

/// Whether a decision over `stored` needs the stored payloads: a `claude` item none of whose
/// stored hashes match. (Unknown hashes always come with their payload.)
pub fn needs_payloads(source: Source, sha256: &Hash, stored: &[StoredContent<'_>]) -> bool {
    source == Source::Claude
        && !stored.is_empty()
        && !stored.iter().any(|s| s.hash().as_ref() == Some(sha256))
}

/// Decides an item with payload hash `sha256` (and parsed `payload`, read only for `claude`)
/// against the stored contents of its key, the original first (`stored[0]`), then its
/// conflicts in any order. For `claude`, the caller passes each stored `payload` when
/// [`needs_payloads`] says so; a stored content without one is compared by hash only.
pub fn decide(
    source: Source,
    sha256: &Hash,
    payload: &Value,
    stored: &[StoredContent<'_>],
) -> Decision {
    let Some(original) = stored.first() else { return Decision::Create };
    if let Some(s) = stored.iter().find(|s| s.hash().as_ref() == Some(sha256)) {
        return Decision::Duplicate { pk: s.pk, received_at: s.received_at };
    }
    if source == Source::Claude
        && let Some(s) = stored.iter().find(|s| {
            s.payload
                .and_then(|p| super::ingest::payload_value(p).ok())
                .is_some_and(|p| claude_identical(payload, &p))
        })
    {
        return Decision::Duplicate { pk: s.pk, received_at: s.received_at };
    }
    Decision::Conflict(Conflict {
        original_pk: original.pk,
        original_sha256: original.hash(),
        sha256: *sha256,
    })
}

/// The members of a Claude Code line that detection reads (`review::transcript`): its kind,
/// the message, and the tool result the client recorded beside it.
const CLAUDE_IDENTITY: [&str; 3] = ["type", "message", "toolUseResult"];

/// Whether two Claude Code lines are the same line for dedup: both have a `message`, and
/// their `type`, `message` and `toolUseResult` members are equal JSON values (a member absent
/// from both is equal; object key order and spacing do not matter; strings compare after
/// unescaping, lone surrogates read as U+FFFD; numbers compare as parsed, so `1` and `1.0`
/// differ). Everything else in the line (`sessionId`, `timestamp`, `cwd`, …) may differ: a
/// resumed session copies earlier lines under its own `sessionId`. `toolUseResult` and
/// `type` are compared too because detection reads them: a "same message" resend must not
/// carry unscanned content.
pub fn claude_identical(a: &Value, b: &Value) -> bool {
    a.get("message").is_some()
        && b.get("message").is_some()
        && CLAUDE_IDENTITY.iter().all(|k| a.get(k) == b.get(k))
}

/// The `dedup.conflict` flag for conflict event `pk` of `(source, id)`: links the original
/// and the conflict, and names both events and both hashes.
pub fn conflict_flag(
    user_id: &str,
    source: Source,
    id: &str,
    session: Option<&str>,
    pk: i64,
    c: &Conflict,
) -> NewFlag {
    let hex_or_unknown = |h: Option<Hash>| h.map_or_else(|| "unknown".to_string(), hex::encode);
    NewFlag {
        id: flag_id(&[CONFLICT_RULE, user_id, source.as_str(), id, &pk.to_string()]),
        rule_id: CONFLICT_RULE.into(),
        title: "Resend with different content under a stored id".into(),
        severity: Severity::Medium,
        user_id: user_id.to_string(),
        session: session.map(str::to_string),
        detail: format!(
            "{source} id {id:?}: event {pk} (payload sha256 {}) differs from the original \
             event {} (payload sha256 {})",
            hex::encode(c.sha256),
            c.original_pk,
            hex_or_unknown(c.original_sha256),
        ),
        event_pks: vec![c.original_pk, pk],
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn content(pk: i64, payload: &str) -> StoredContent<'_> {
        StoredContent {
            pk,
            received_at: pk * 10,
            sha256: Some(payload_sha256(payload)),
            payload: None,
        }
    }

    #[test]
    fn new_key_is_created() {
        let h = payload_sha256("{}");
        assert_eq!(decide(Source::External, &h, &json!({}), &[]), Decision::Create);
    }

    #[test]
    fn same_bytes_are_a_duplicate_of_whichever_content_matches() {
        let stored = [content(1, r#"{"a":1}"#), content(5, r#"{"a":2}"#)];
        let h = payload_sha256(r#"{"a":2}"#);
        assert_eq!(
            decide(Source::External, &h, &json!({"a":2}), &stored),
            Decision::Duplicate { pk: 5, received_at: 50 }
        );
        // Same JSON value, other bytes: a conflict (the hash is of the bytes as received).
        let h = payload_sha256(r#"{ "a": 1 }"#);
        let d = decide(Source::External, &h, &json!({"a":1}), &stored);
        assert_eq!(
            d,
            Decision::Conflict(Conflict {
                original_pk: 1,
                original_sha256: Some(payload_sha256(r#"{"a":1}"#)),
                sha256: h
            })
        );
    }

    #[test]
    fn an_unknown_hash_is_computed_from_the_stored_payload() {
        let unknown = StoredContent { pk: 3, received_at: 7, sha256: None, payload: Some("[1]") };
        let h = payload_sha256("[1]");
        assert_eq!(
            decide(Source::Egress, &h, &json!([1]), &[unknown]),
            Decision::Duplicate { pk: 3, received_at: 7 }
        );
        let Decision::Conflict(c) =
            decide(Source::Egress, &payload_sha256("[2]"), &json!([2]), &[unknown])
        else {
            panic!("a different payload is a conflict");
        };
        assert_eq!(c.original_sha256, Some(h));
    }

    fn line(session: &str, text: &str) -> String {
        json!({"type":"user","uuid":"u1","sessionId":session,"timestamp":"2026-03-04T09:00:00Z",
               "message":{"role":"user","content":text}})
        .to_string()
    }

    #[test]
    fn claude_lines_with_the_same_message_are_duplicates() {
        let first = line("s-1", "hello");
        let stored = [StoredContent { payload: Some(&first), ..content(1, &first) }];
        let resumed = line("s-2", "hello");
        let h = payload_sha256(&resumed);
        let v: Value = serde_json::from_str(&resumed).unwrap();
        assert!(needs_payloads(Source::Claude, &h, &stored));
        assert_eq!(
            decide(Source::Claude, &h, &v, &stored),
            Decision::Duplicate { pk: 1, received_at: 10 }
        );
        // The same lines from another source are a conflict: the rule is Claude's.
        assert!(matches!(decide(Source::Codex, &h, &v, &stored), Decision::Conflict(_)));
        // A changed message is a conflict.
        let changed = line("s-2", "hello AKIA...");
        let v: Value = serde_json::from_str(&changed).unwrap();
        assert!(matches!(
            decide(Source::Claude, &payload_sha256(&changed), &v, &stored),
            Decision::Conflict(_)
        ));
    }

    #[test]
    fn claude_identity_covers_what_detection_reads() {
        let base = json!({"type":"user","message":{"content":"x"},"sessionId":"a"});
        let mut other = base.clone();
        other["sessionId"] = json!("b");
        other["timestamp"] = json!("t");
        assert!(claude_identical(&base, &other));
        let mut extra = base.clone();
        extra["toolUseResult"] = json!({"stdout":"secret"});
        assert!(!claude_identical(&base, &extra), "an added tool result is new content");
        let mut kind = base.clone();
        kind["type"] = json!("novel");
        assert!(!claude_identical(&base, &kind));
        // Key order does not matter; number form does.
        let a: Value = serde_json::from_str(r#"{"message":{"a":1,"b":2}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"message":{"b":2,"a":1}}"#).unwrap();
        let c: Value = serde_json::from_str(r#"{"message":{"b":2,"a":1.0}}"#).unwrap();
        assert!(claude_identical(&a, &b));
        assert!(!claude_identical(&a, &c));
        // Lines without a message (summaries, system lines) are compared by hash only.
        assert!(!claude_identical(&json!({"type":"summary"}), &json!({"type":"summary"})));
    }

    #[test]
    fn the_conflict_flag_names_both_events_and_hashes() {
        let c = Conflict {
            original_pk: 4,
            original_sha256: Some(payload_sha256("a")),
            sha256: payload_sha256("b"),
        };
        let f = conflict_flag("u", Source::Claude, "x", Some("s"), 9, &c);
        assert_eq!((f.rule_id.as_str(), f.event_pks.as_slice()), (CONFLICT_RULE, &[4, 9][..]));
        for want in [hex::encode(c.sha256), hex::encode(payload_sha256("a"))] {
            assert!(f.detail.contains(&want), "{}", f.detail);
        }
        assert!(f.detail.contains("event 9") && f.detail.contains("event 4"), "{}", f.detail);
        assert_eq!(f.session.as_deref(), Some("s"));
    }

    proptest! {
        /// Over any sequence of payloads posted under one key, deciding each against what the
        /// earlier decisions stored: one original, one stored content per distinct payload
        /// (so retries never multiply conflicts), every conflict names the original, and a
        /// resend is a duplicate of the content with its bytes.
        #[test]
        fn decisions_store_each_distinct_content_once(
            posts in proptest::collection::vec(0u8..5, 1..30),
            source in prop_oneof![Just(Source::External), Just(Source::Claude)],
        ) {
            let texts: Vec<String> =
                (0..5).map(|n| json!({"message": {"n": n % 3}, "k": n}).to_string()).collect();
            let mut stored: Vec<(i64, String)> = Vec::new();
            for (step, p) in posts.iter().enumerate() {
                let text = &texts[*p as usize];
                let value: Value = serde_json::from_str(text).unwrap();
                let h = payload_sha256(text);
                let view: Vec<StoredContent<'_>> = stored.iter().map(|(pk, t)| StoredContent {
                    pk: *pk, received_at: *pk, sha256: Some(payload_sha256(t)), payload: Some(t),
                }).collect();
                let pk = step as i64 + 1;
                match decide(source, &h, &value, &view) {
                    Decision::Create => {
                        prop_assert!(stored.is_empty());
                        stored.push((pk, text.clone()));
                    }
                    Decision::Duplicate { pk: dup, .. } => {
                        let (_, t) = stored.iter().find(|(spk, _)| *spk == dup).unwrap();
                        let same_message = serde_json::from_str::<Value>(t).unwrap()["message"]
                            == value["message"];
                        prop_assert!(t == text || (source == Source::Claude && same_message));
                    }
                    Decision::Conflict(c) => {
                        prop_assert_eq!(c.original_pk, stored[0].0);
                        prop_assert_eq!(c.sha256, h);
                        prop_assert!(stored.iter().all(|(_, t)| t != text));
                        stored.push((pk, text.clone()));
                    }
                }
            }
            let mut distinct: Vec<&String> = stored.iter().map(|(_, t)| t).collect();
            distinct.sort();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), stored.len(), "each content stored once");
            if source == Source::External {
                let mut posted: Vec<u8> = posts.clone();
                posted.sort();
                posted.dedup();
                prop_assert_eq!(stored.len(), posted.len());
            }
        }
    }
}
