//! The console's pages as pure functions (issue 17): plain input structs in, `maud::Markup`
//! out, no I/O and no store access (the routes in `review::console` fill the structs).
//!
//! Owns the page layout and the embedded assets ([`layout`]), the `/people` table
//! ([`people`]), one person's timeline ([`timeline`]), the session drill-down ([`session`],
//! with the transcript-as-conversation parser in [`conversation`]), the flags queue
//! ([`flags`]), the action gates decided in the browser ([`gates`]) and the server-drawn SVG
//! charts ([`svg`]).
//!
//! Hostile content: every string handed in is attacker-controlled. maud escapes text and
//! attribute values; nothing here wraps data in `PreEscaped`; stored data placed in a URL goes
//! through [`path_segment`] or [`query`] (percent-encoding every byte outside RFC 3986's
//! unreserved set), so it can never become a scheme, a host or another parameter.

pub mod conversation;
pub mod flags;
pub mod gates;
pub mod layout;
pub mod people;
pub mod session;
pub mod svg;
pub mod timeline;

use super::Micros;
use std::fmt::Write as _;

pub use layout::{CSS, CSS_ROUTE, JS, JS_ROUTE, Section, Viewer, css_route, js_route, page};

/// One minute, in the stores' unit.
const MINUTE: Micros = 60 * 1_000_000;
/// One hour.
pub const HOUR: Micros = 60 * MINUTE;
/// One day.
pub const DAY: Micros = 24 * HOUR;

/// DESIGN §8's backdating slack: an event whose `ts` is more than this after its
/// `received_at` claims a time the server had not reached yet.
pub const BACKDATE_SLACK: Micros = 5 * MINUTE;

/// The span of the Airlock session an event belongs to: its start record's `ts` and, once
/// ended, its end record's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSpan {
    pub start: Micros,
    pub end: Option<Micros>,
}

/// Why an event's `ts` is not to be trusted as the time it happened, if it is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backdated {
    /// `ts` is more than [`BACKDATE_SLACK`] after `received_at`.
    AfterReceipt,
    /// `ts` lies outside its session's span.
    OutsideSession,
}

impl Backdated {
    /// The mark's tooltip.
    pub fn short(self) -> &'static str {
        match self {
            Backdated::AfterReceipt => "ts more than 5 minutes after receipt",
            Backdated::OutsideSession => "ts outside its session",
        }
    }

    /// The explanation in full.
    pub fn reason(self) -> &'static str {
        match self {
            Backdated::AfterReceipt => "ts is more than 5 minutes after the server received it",
            Backdated::OutsideSession => "ts lies outside its session's span",
        }
    }
}

/// DESIGN §8's backdating rule: `ts` more than 5 minutes after `received_at`, or outside the
/// span of its session (when the caller knows the span; an open session has no end bound).
pub fn backdated(ts: Micros, received_at: Micros, span: Option<SessionSpan>) -> Option<Backdated> {
    if ts > received_at.saturating_add(BACKDATE_SLACK) {
        return Some(Backdated::AfterReceipt);
    }
    match span {
        Some(s) if ts < s.start || s.end.is_some_and(|e| ts > e) => Some(Backdated::OutsideSession),
        _ => None,
    }
}

/// Percent-encodes one path segment: every byte outside `A-Z a-z 0-9 - . _ ~` becomes `%XX`,
/// so `/`, `?`, `#`, `%`, `:` and spaces in stored data stay inside the segment.
pub fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A query string (`?a=1&b=x%20y`, or empty when no pair has a value) from name/value pairs,
/// each percent-encoded as [`path_segment`] does (valid `application/x-www-form-urlencoded`).
/// Pairs with an empty value are left out, so links stay short.
pub fn query<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (k, v) in pairs {
        if v.is_empty() {
            continue;
        }
        out.push(if out.is_empty() { '?' } else { '&' });
        out.push_str(&path_segment(k));
        out.push('=');
        out.push_str(&path_segment(v));
    }
    out
}

/// The link to one person's timeline.
pub fn person_href(user_id: &str) -> String {
    format!("/people/{}", path_segment(user_id))
}

/// The link to one Airlock session's drill-down, naming whose session it is (session ids are
/// unique per user only).
pub fn session_href(session: &str, user_id: &str) -> String {
    format!("/sessions/{}{}", path_segment(session), query([("user", user_id)]))
}

/// RFC 3339 with milliseconds, UTC.
pub fn when(us: Micros) -> String {
    super::format_micros(us)
}

/// A short age (`45s`, `12m`, `3h`, `5d`) of `then` at `now`; `now` for a future time.
pub fn age(now: Micros, then: Micros) -> String {
    let s = (now - then).max(0) / 1_000_000;
    match s {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// `s` cut to at most `max` bytes at a char boundary, and how many bytes were cut.
pub fn clip(s: &str, max: usize) -> (&str, usize) {
    if s.len() <= max {
        return (s, 0);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (&s[..end], s.len() - end)
}

/// One line of text for a table cell: whitespace runs (newlines included) folded to one space,
/// cut to `max` bytes with an ellipsis.
pub fn one_line(s: &str, max: usize) -> String {
    let folded = s.split_whitespace().collect::<Vec<_>>().join(" ");
    let (head, cut) = clip(&folded, max);
    if cut > 0 { format!("{head}…") } else { head.to_string() }
}

#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_and_queries_encode_everything_but_unreserved() {
        assert_eq!(path_segment("a/b?c#d e%f"), "a%2Fb%3Fc%23d%20e%25f");
        assert_eq!(path_segment("javascript:alert(1)"), "javascript%3Aalert%281%29");
        assert_eq!(path_segment("é"), "%C3%A9");
        assert_eq!(path_segment("Az09-._~"), "Az09-._~");
        assert_eq!(
            query([("q", "a&b=c"), ("x", ""), ("host", "//evil")]),
            "?q=a%26b%3Dc&host=%2F%2Fevil"
        );
        assert_eq!(query([("x", "")]), "");
        assert_eq!(person_href("u/../admin"), "/people/u%2F..%2Fadmin");
        assert_eq!(session_href("s 1", "u&2"), "/sessions/s%201?user=u%262");
        // What the routes decode (serde_urlencoded) is exactly what went in.
        let back: Vec<(String, String)> =
            serde_urlencoded::from_str(&query([("q", "a+b &%x=y")])[1..]).unwrap();
        assert_eq!(back, vec![("q".to_string(), "a+b &%x=y".to_string())]);
    }

    #[test]
    fn backdating_rule() {
        let r = 1_000 * MINUTE;
        assert_eq!(backdated(r + BACKDATE_SLACK, r, None), None, "exactly 5 minutes is fine");
        assert_eq!(backdated(r + BACKDATE_SLACK + 1, r, None), Some(Backdated::AfterReceipt));
        assert_eq!(backdated(r - DAY, r, None), None, "late publishing is not backdating");
        let span = SessionSpan { start: r - HOUR, end: Some(r - MINUTE) };
        assert_eq!(backdated(r - 2 * HOUR, r, Some(span)), Some(Backdated::OutsideSession));
        assert_eq!(backdated(r, r, Some(span)), Some(Backdated::OutsideSession));
        assert_eq!(backdated(r - HOUR, r, Some(span)), None, "the start itself is inside");
        let open = SessionSpan { start: r - HOUR, end: None };
        assert_eq!(backdated(r, r, Some(open)), None);
    }

    #[test]
    fn clipping_respects_char_boundaries() {
        assert_eq!(clip("héllo", 2), ("h", 5));
        assert_eq!(clip("abc", 5), ("abc", 0));
        assert_eq!(one_line("a\n\n b\tc", 100), "a b c");
        assert_eq!(one_line("abcdef", 3), "abc…");
        assert_eq!(age(10_000_000, 0), "10s");
        assert_eq!(age(3 * DAY, 0), "3d");
        assert_eq!(age(0, DAY), "0s");
    }
}
