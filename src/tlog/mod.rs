//! Tamper evidence, the pure part (docs/evidence.md): RFC 9162 (Certificate Transparency v2)
//! Merkle trees, proofs and their verification ([`merkle`]); the C2SP signed-note,
//! `tlog-checkpoint` and `tlog-cosignature` formats and Ed25519 keys ([`note`]); C2SP
//! `tlog-tiles` paths ([`tile`]); and the canonical leaf of a stored review event
//! ([`EventLeaf`]). No I/O here: the review stores keep the tree, the server signs and serves
//! it, `airlock publish`/`airlock verify` check it and airlockd roots each session's audit
//! lines with it; all of them share these functions so that the two sides cannot disagree on
//! a byte.

pub mod merkle;
pub mod note;
pub mod tile;

use sha2::{Digest, Sha256};

pub use merkle::{Hash, leaf_hash, node_hash};

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> Hash {
    Sha256::digest(bytes).into()
}

/// Standard base64 with padding, as the C2SP formats write hashes and signatures.
pub fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes standard base64 (padding required).
pub fn unb64(text: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

/// A hash from standard base64 (exactly 32 bytes).
pub fn hash_from_b64(text: &str) -> Option<Hash> {
    unb64(text)?.try_into().ok()
}

/// The version byte that opens an [`EventLeaf`] encoding; a new encoding gets a new byte.
pub const EVENT_LEAF_V1: u8 = 1;

/// One stored review event as a log leaf: what the log commits to. The leaf's data is the
/// [`encode`](EventLeaf::encode)d form; its hash is RFC 9162's `SHA-256(0x00 || data)`.
///
/// The payload enters only as its SHA-256, so leaf data may be shown to a reader without the
/// payload; `received_at` is the server's clock (microseconds since the Unix epoch), so two
/// identical client items received at different times are different leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventLeaf<'a> {
    pub user_id: &'a str,
    pub source: &'a str,
    pub id: &'a str,
    /// Microseconds since the Unix epoch, as the stores keep it; the leaf holds it at the
    /// millisecond the API shows (`received_at` in answers and exports is RFC 3339 with
    /// milliseconds), so a reader rebuilds the leaf from what it was shown.
    pub received_at: i64,
    /// SHA-256 of the payload's bytes as received (the stored text).
    pub payload_sha256: Hash,
}

impl EventLeaf<'_> {
    /// `0x01`, then `user_id`, `source` and `id` each as a 16-bit big-endian length and its
    /// UTF-8 bytes, then `received_at` in milliseconds (rounded down) as a 64-bit big-endian
    /// signed integer, then the 32-byte
    /// payload hash (the TLS presentation language's style, RFC 8446 §3). Every field the
    /// server accepts fits: ids are at most 1,536 bytes (docs/api.md).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            1 + 6 + self.user_id.len() + self.source.len() + self.id.len() + 8 + 32,
        );
        out.push(EVENT_LEAF_V1);
        for field in [self.user_id, self.source, self.id] {
            // The ingest limits keep every field far below 64 KiB; a longer one would be a
            // server bug, and truncating the length would make two leaves collide, so clamp
            // the bytes with the length (still one unambiguous encoding).
            let bytes = &field.as_bytes()[..field.len().min(u16::MAX as usize)];
            out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
            out.extend_from_slice(bytes);
        }
        out.extend_from_slice(&self.received_at.div_euclid(1000).to_be_bytes());
        out.extend_from_slice(&self.payload_sha256);
        out
    }

    /// The leaf hash the tree holds for this event.
    pub fn hash(&self) -> Hash {
        leaf_hash(&self.encode())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn event_leaf_encoding_is_length_prefixed_and_stable() {
        let leaf = EventLeaf {
            user_id: "u",
            source: "egress",
            id: "a:1",
            received_at: 1_700_000_000_000_001,
            payload_sha256: sha256(b"{}"),
        };
        let enc = leaf.encode();
        assert_eq!(enc[0], 1);
        assert_eq!(&enc[1..4], b"\x00\x01u");
        assert_eq!(&enc[4..12], b"\x00\x06egress");
        assert_eq!(&enc[12..17], b"\x00\x03a:1");
        assert_eq!(&enc[17..25], &1_700_000_000_000i64.to_be_bytes());
        // The microseconds the API does not show do not change the leaf.
        let same_ms = EventLeaf { received_at: 1_700_000_000_000_999, ..leaf.clone() };
        assert_eq!(same_ms.hash(), leaf.hash());
        assert_eq!(&enc[25..], &sha256(b"{}"));
        // Moving a byte between fields changes the leaf (no ambiguity).
        let shifted = EventLeaf { user_id: "ue", source: "gress", ..leaf.clone() };
        assert_ne!(shifted.hash(), leaf.hash());
        // Pinned: a change to the encoding breaks every stored log, so it must be deliberate.
        assert_eq!(
            hex::encode(leaf.hash()),
            hex::encode(leaf_hash(&enc)),
            "hash is RFC 9162's leaf hash of the encoding"
        );
    }

    #[test]
    fn base64_roundtrip() {
        let h = sha256(b"x");
        assert_eq!(hash_from_b64(&b64(&h)), Some(h));
        assert_eq!(hash_from_b64("AAAA"), None);
        assert_eq!(unb64("not base64!"), None);
    }
}
