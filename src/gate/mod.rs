//! Action gates (docs/gates.md): a verified person approves one exact action before it happens.
//!
//! This module owns what a gate *is*, apart from who holds it: the [`Severity`] scale, the
//! canonical text of a held egress action and its digest ([`EgressAction`]), and the daemon's
//! [`GateBook`] of pending gates (open, list, wait for a change, decide once, expire,
//! abandon). The proxy holds the attempt ([`crate::proxy::gatehold`]); the policy says which
//! targets are gated ([`crate::policy::Policy::gate`]); the CLI decides
//! ([`crate::cli::gate`]).

pub mod book;

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use book::{GateBook, OpenError, Ticket};

/// `[gate] timeout` when no layer sets it: below common client timeouts (Claude Code's Bash
/// tool gives a command 2 minutes), so the agent sees Airlock's `403 gate_expired` and not its
/// own timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(110);
/// The shortest and longest `[gate] timeout` a file may set.
pub const MIN_TIMEOUT: Duration = Duration::from_secs(1);
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// Attempts one session may have held at once (beyond: `503 gate_limit`, audited): a session
/// that floods gate requests cannot bury a reviewer's queue or the daemon's memory.
pub const MAX_HELD_PER_SESSION: usize = 16;
/// Longest decision note kept (bytes, cut at a character boundary).
pub const MAX_NOTE: usize = 500;

/// How much a gated action matters (`[[gate.rule]] severity`); `high` will require the
/// decider's password with a review server (step-up).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Low,
    #[default]
    Medium,
    High,
}

impl Severity {
    pub const NAMES: &'static [&'static str] = &["low", "medium", "high"];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "low" => Some(Self::Low),
            "medium" => Some(Self::Medium),
            "high" => Some(Self::High),
            _ => None,
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One held egress attempt, as a decider approves it: exactly one connection (or one
/// plain-HTTP request) of one session to one host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressAction<'a> {
    pub session: &'a str,
    /// The attempt's audit id: an approval is for this attempt and no other.
    pub attempt: &'a str,
    pub method: &'a str,
    pub host: &'a str,
    pub port: u16,
    /// Plain HTTP: the request line (`GET http://host/path HTTP/1.1`).
    pub request: Option<&'a str>,
}

/// The canonical form: one JSON object, keys in a fixed (sorted) order, no whitespace.
#[derive(Serialize)]
struct Canonical<'a> {
    attempt: &'a str,
    host: &'a str,
    kind: &'static str,
    method: &'a str,
    port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    request: Option<&'a str>,
    session: &'a str,
}

impl EgressAction<'_> {
    /// The text a decision's digest is taken over.
    pub fn canonical(&self) -> String {
        let c = Canonical {
            attempt: self.attempt,
            host: self.host,
            kind: "egress",
            method: self.method,
            port: self.port,
            request: self.request,
            session: self.session,
        };
        // A struct of strings and an integer always serializes.
        serde_json::to_string(&c).unwrap_or_default()
    }
}

/// `sha256:<lowercase hex>` of `canonical`.
pub fn digest(canonical: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(canonical.as_bytes())))
}

/// `note` cut to [`MAX_NOTE`] bytes at a character boundary, control characters but newline
/// and tab replaced (it is shown on terminals and in the console).
pub fn clean_note(note: &str) -> String {
    let mut out = String::with_capacity(note.len().min(MAX_NOTE));
    for c in note.chars() {
        let c = if c.is_control() && c != '\n' && c != '\t' { '\u{FFFD}' } else { c };
        if out.len() + c.len_utf8() > MAX_NOTE {
            break;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn action<'a>(host: &'a str, request: Option<&'a str>) -> EgressAction<'a> {
        EgressAction { session: "s1", attempt: "a1", method: "CONNECT", host, port: 443, request }
    }

    #[test]
    fn canonical_text_is_sorted_compact_json() {
        assert_eq!(
            action("api.stripe.test", None).canonical(),
            r#"{"attempt":"a1","host":"api.stripe.test","kind":"egress","method":"CONNECT","port":443,"session":"s1"}"#
        );
        let with = action("h.test", Some("GET http://h.test/\"x\" HTTP/1.1")).canonical();
        let v: serde_json::Value = serde_json::from_str(&with).unwrap();
        assert_eq!(v["request"], "GET http://h.test/\"x\" HTTP/1.1");
    }

    #[test]
    fn the_digest_binds_every_part_of_the_action() {
        let base = digest(&action("a.test", None).canonical());
        assert!(base.starts_with("sha256:") && base.len() == 7 + 64, "{base}");
        let mut others = vec![
            digest(&action("b.test", None).canonical()),
            digest(&action("a.test", Some("GET / HTTP/1.1")).canonical()),
        ];
        let mut a = action("a.test", None);
        a.port = 8443;
        others.push(digest(&a.canonical()));
        let mut a = action("a.test", None);
        a.attempt = "a2";
        others.push(digest(&a.canonical()));
        let mut a = action("a.test", None);
        a.session = "s2";
        others.push(digest(&a.canonical()));
        for o in others {
            assert_ne!(o, base);
        }
    }

    #[test]
    fn notes_are_cut_and_cleaned() {
        assert_eq!(clean_note("ok\tfine\nline"), "ok\tfine\nline");
        assert_eq!(clean_note("a\u{1b}[31mb"), "a\u{FFFD}[31mb");
        let long = "é".repeat(400);
        let cut = clean_note(&long);
        assert!(cut.len() <= MAX_NOTE && cut.chars().all(|c| c == 'é'), "{}", cut.len());
    }

    #[test]
    fn severities_parse_and_order() {
        for name in Severity::NAMES {
            assert_eq!(Severity::parse(name).unwrap().as_str(), *name);
        }
        assert!(Severity::parse("critical").is_none());
        assert!(Severity::Low < Severity::Medium && Severity::Medium < Severity::High);
    }
}
