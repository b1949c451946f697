//! Decoding of `POST /api/v1/events` bodies (DESIGN §8, docs/api.md).
//!
//! Two error levels, kept strictly apart:
//! - **body errors** (bad gzip, unknown media type, not a JSON array / NDJSON framing,
//!   more than [`MAX_ITEMS`] items, more than [`MAX_BODY`] bytes after decompression): the
//!   request fails with a 4xx and nothing is stored;
//! - **item errors** (an element or NDJSON line that is not valid JSON or not an object,
//!   misses a field, exceeds [`MAX_ITEM`], names another user, has an envelope field the
//!   stores cannot hold, or claims a [reserved type](is_reserved_type)): that item gets its
//!   code in a 207, the rest are stored.
//!
//! Everything the stores keep in their own columns is checked here, before the database, so
//! both stores give the same answer and nothing a client sends reaches the store as an error
//! (PostgreSQL `text` cannot hold U+0000 and its btree entries are capped at about 2.7 KB):
//! `id`, `type` and `session` have byte limits and may not hold NUL. The payload is stored as
//! the client's own text and never refused for what its strings hold: NUL and lone UTF-16
//! surrogate escapes (RFC 8259 §8.2 allows them; Node's `JSON.stringify` writes them) come
//! back byte for byte, and detection reads a parsed copy with U+FFFD in place of each lone
//! surrogate ([`payload_value`]).
//!
//! A JSON array is split into elements by a small bracket/string scanner, so one malformed
//! element does not make the whole body unreadable.

use super::{Micros, NewEvent, NewFlag, Source, parse_rfc3339};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::io::Read;

pub const MAX_ITEMS: usize = 1000;
/// Largest body in bytes after decompression (docs/api.md states the same value).
pub const MAX_BODY: usize = 5_000_000;
/// Largest item (one array element or NDJSON line) in bytes.
pub const MAX_ITEM: usize = 1_000_000;
/// Longest `id` in bytes (UTF-8). Room for the longest id a source derives, a
/// `transcript.file` item's `<airlock_session>:transcript:<file>` (256 + 12 + [`MAX_FILE`]),
/// while the dedup key `(user_id, source, id)` stays well inside PostgreSQL's btree entry
/// limit (a third of an 8 KiB page, about 2.7 KB).
pub const MAX_ID: usize = 1536;
/// Longest `type` in bytes.
pub const MAX_TYPE: usize = 128;
/// Longest `session` in bytes; it is in the `(user_id, session, pk)` index.
pub const MAX_SESSION: usize = 256;
/// Longest transcript envelope `file` (path relative to the agent home) in bytes; it is in the
/// `(user_id, airlock_session, file)` index. `airlock_session` has [`MAX_SESSION`].
pub const MAX_FILE: usize = 1024;
/// The `type` of the item that states what prefix of a transcript file was published
/// (`source: "session"`, docs/api.md "transcript.file").
pub const TRANSCRIPT_FILE_TYPE: &str = "transcript.file";
/// Longest `payload.boot` the server lifts into its own column (longer ones stay in the payload only).
pub const MAX_BOOT: usize = 256;
/// `type` prefixes only the server writes (compared ignoring ASCII case): `airlock.` for its
/// own records (`airlock.review.read`), `gate.` for action-gate decisions. docs/api.md lists them.
pub const RESERVED_TYPE_PREFIXES: [&str; 2] = ["airlock.", "gate."];

/// Body framing, from `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    JsonArray,
    Ndjson,
}

/// A request-level failure: nothing is stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error(
        "unsupported Content-Type {0:?}: send application/json (an array) or application/x-ndjson"
    )]
    MediaType(String),
    #[error("unsupported Content-Encoding {0:?}: send identity or gzip")]
    Encoding(String),
    #[error("body is not valid gzip: {0}")]
    BadGzip(String),
    #[error("body exceeds {MAX_BODY} bytes (after decompression); split the batch")]
    TooLarge,
    #[error("batch has more than {MAX_ITEMS} items; split the batch")]
    TooManyItems,
    #[error("body is not a JSON array: {0}")]
    NotArray(String),
    #[error("body is empty: send at least one event")]
    Empty,
}

impl BodyError {
    /// HTTP status for this error.
    pub fn status(&self) -> u16 {
        match self {
            BodyError::MediaType(_) | BodyError::Encoding(_) => 415,
            BodyError::TooLarge | BodyError::TooManyItems => 413,
            BodyError::BadGzip(_) | BodyError::NotArray(_) | BodyError::Empty => 400,
        }
    }
}

/// Picks the framing from a `Content-Type` header value.
pub fn format_for(content_type: Option<&str>) -> Result<Format, BodyError> {
    let ct = content_type.unwrap_or("");
    let essence = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match essence.as_str() {
        "application/json" => Ok(Format::JsonArray),
        "application/x-ndjson"
        | "application/ndjson"
        | "application/jsonl"
        | "application/x-jsonlines"
        | "application/jsonlines" => Ok(Format::Ndjson),
        _ => Err(BodyError::MediaType(ct.to_string())),
    }
}

/// Decompresses a gzip body, stopping at [`MAX_BODY`] + 1 bytes.
pub fn gunzip(raw: &[u8]) -> Result<Vec<u8>, BodyError> {
    let mut out = Vec::new();
    let mut dec = flate2::read::GzDecoder::new(raw).take(MAX_BODY as u64 + 1);
    dec.read_to_end(&mut out).map_err(|e| BodyError::BadGzip(e.to_string()))?;
    if out.len() > MAX_BODY {
        return Err(BodyError::TooLarge);
    }
    if out.is_empty() && !raw.is_empty() {
        return Err(BodyError::BadGzip("gzip stream decodes to nothing".into()));
    }
    Ok(out)
}

/// Splits a body into item byte slices (trimmed), enforcing the item count.
pub fn split(format: Format, body: &[u8]) -> Result<Vec<&[u8]>, BodyError> {
    if body.len() > MAX_BODY {
        return Err(BodyError::TooLarge);
    }
    let items = match format {
        Format::Ndjson => split_ndjson(body)?,
        Format::JsonArray => split_array(body)?,
    };
    if items.is_empty() {
        return Err(BodyError::Empty);
    }
    Ok(items)
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if is_ws(*first) {
            s = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = s {
        if is_ws(*last) {
            s = rest;
        } else {
            break;
        }
    }
    s
}

fn split_ndjson(body: &[u8]) -> Result<Vec<&[u8]>, BodyError> {
    let mut out = Vec::new();
    for line in body.split(|b| *b == b'\n') {
        let line = trim(line);
        if line.is_empty() {
            continue;
        }
        if out.len() == MAX_ITEMS {
            return Err(BodyError::TooManyItems);
        }
        out.push(line);
    }
    Ok(out)
}

/// Frames the elements of a top-level JSON array by tracking strings and bracket nesting.
/// Whatever is inside an element is judged later, per item.
fn split_array(body: &[u8]) -> Result<Vec<&[u8]>, BodyError> {
    let err = |m: &str| BodyError::NotArray(m.to_string());
    let mut i = 0;
    while i < body.len() && is_ws(body[i]) {
        i += 1;
    }
    if body.get(i) != Some(&b'[') {
        return Err(err(
            "expected '[' at the start (or send NDJSON with Content-Type application/x-ndjson)",
        ));
    }
    i += 1;
    let mut out = Vec::new();
    let mut stack: Vec<u8> = Vec::new();
    let mut start = i;
    let mut in_str = false;
    let mut esc = false;
    let mut closed = false;
    while i < body.len() {
        let b = body[i];
        if in_str {
            if esc {
                esc = false;
            } else if b == b'\\' {
                esc = true;
            } else if b == b'"' {
                in_str = false;
            }
            i += 1;
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => stack.push(b),
            // A closing bracket inside an element pops its opener (and must match it); only
            // one at depth zero ends the top-level array.
            b'}' | b']' if !stack.is_empty() => {
                let opener = if b == b'}' { b'{' } else { b'[' };
                if stack.pop() != Some(opener) {
                    return Err(err(if b == b'}' { "unbalanced '}'" } else { "unbalanced ']'" }));
                }
            }
            b'}' => return Err(err("unbalanced '}'")),
            b',' | b']' if stack.is_empty() => {
                let item = trim(&body[start..i]);
                if item.is_empty() {
                    // `[]` is an empty batch; `[,` or `[1,]` is broken framing.
                    if !(b == b']' && out.is_empty()) {
                        return Err(err("empty element (stray comma)"));
                    }
                } else {
                    if out.len() == MAX_ITEMS {
                        return Err(BodyError::TooManyItems);
                    }
                    out.push(item);
                }
                start = i + 1;
                if b == b']' {
                    closed = true;
                    i += 1;
                    break;
                }
            }
            _ => {}
        }
        i += 1;
    }
    if !closed {
        return Err(err("the array is not closed (truncated body?)"));
    }
    if !trim(&body[i..]).is_empty() {
        return Err(err("data after the closing ']'"));
    }
    Ok(out)
}

/// An item-level failure: `code` is 400, 403 or 413.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemError {
    pub code: u16,
    pub message: String,
    /// The item's `id` when it could be read (echoed in the result).
    pub id: Option<String>,
}

impl ItemError {
    fn bad(id: Option<String>, message: impl Into<String>) -> Self {
        Self { code: 400, message: message.into(), id }
    }
}

#[derive(Deserialize)]
struct RawEnvelope<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    source: Option<&'a RawValue>,
    #[serde(borrow, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow)]
    ts: Option<&'a RawValue>,
    #[serde(borrow)]
    session: Option<&'a RawValue>,
    #[serde(borrow)]
    seq: Option<&'a RawValue>,
    #[serde(borrow)]
    user_id: Option<&'a RawValue>,
    #[serde(borrow)]
    payload: Option<&'a RawValue>,
    #[serde(borrow)]
    airlock_session: Option<&'a RawValue>,
    #[serde(borrow)]
    file: Option<&'a RawValue>,
    #[serde(borrow)]
    offset: Option<&'a RawValue>,
}

/// An optional envelope string. A string that parses as JSON but has no text form (a lone
/// UTF-16 surrogate escape) is refused here with that reason, not as "not a string".
fn opt_string(
    raw: Option<&RawValue>,
    field: &str,
    id: &Option<String>,
) -> Result<Option<String>, ItemError> {
    match raw {
        None => Ok(None),
        Some(r) if r.get() == "null" => Ok(None),
        Some(r) => serde_json::from_str::<String>(r.get()).map(Some).map_err(|e| {
            let message = if r.get().starts_with('"') {
                format!(
                    "`{field}` is not a valid string ({e}): it holds an escape with no text form, \
                     such as a lone UTF-16 surrogate (\\ud800); only `payload` may hold one"
                )
            } else {
                format!("`{field}` must be a string")
            };
            ItemError::bad(id.clone(), message)
        }),
    }
}

/// Checks an envelope field the stores keep in its own column: no NUL (PostgreSQL `text`
/// cannot hold U+0000) and at most `max` bytes.
fn storable(field: &str, value: &str, max: usize) -> Result<(), String> {
    if value.contains('\0') {
        return Err(format!(
            "`{field}` contains a NUL character (\\u0000), which the store cannot hold; \
             remove it (a payload may hold NUL, an envelope field may not)"
        ));
    }
    if value.len() > max {
        return Err(format!(
            "`{field}` is {} bytes; the limit is {max} bytes (UTF-8), see docs/api.md",
            value.len()
        ));
    }
    Ok(())
}

/// Whether `kind` is a type only the server writes ([`RESERVED_TYPE_PREFIXES`]). Leading
/// whitespace and ASCII case do not make a reserved type the client's.
pub fn is_reserved_type(kind: &str) -> bool {
    let kind = kind.trim_start().as_bytes();
    RESERVED_TYPE_PREFIXES
        .iter()
        .any(|p| kind.get(..p.len()).is_some_and(|head| head.eq_ignore_ascii_case(p.as_bytes())))
}

/// Parses a payload's JSON text for detection and the typed view. serde_json refuses lone
/// UTF-16 surrogate escapes, which RFC 8259 §8.2 allows and Node's `JSON.stringify` writes
/// for broken strings; they are read as U+FFFD here, as `String::from_utf16_lossy` does. The
/// stored payload is always the original text.
pub fn payload_value(text: &str) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::from_str(&without_lone_surrogates(text))
}

/// Four hex digits at `at`, as a UTF-16 code unit.
fn hex4(b: &[u8], at: usize) -> Option<u16> {
    let digits = std::str::from_utf8(b.get(at..at + 4)?).ok()?;
    u16::from_str_radix(digits, 16).ok().filter(|_| digits.bytes().all(|c| c.is_ascii_hexdigit()))
}

/// `text` with every `\uXXXX` escape of a lone surrogate (a high one not followed by a low
/// one, or a low one alone) replaced by `\ufffd`; borrowed when there is none.
fn without_lone_surrogates(text: &str) -> Cow<'_, str> {
    let b = text.as_bytes();
    let mut out = String::new();
    let mut copied = 0;
    let mut in_str = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                in_str = !in_str;
                i += 1;
            }
            b'\\' if in_str => {
                let unit = (b.get(i + 1) == Some(&b'u')).then(|| hex4(b, i + 2)).flatten();
                let Some(unit) = unit else {
                    // Any other escape is two bytes, both ASCII in valid JSON.
                    i += 2;
                    continue;
                };
                let low_follows = || {
                    b.get(i + 6) == Some(&b'\\')
                        && b.get(i + 7) == Some(&b'u')
                        && hex4(b, i + 8).is_some_and(|l| (0xDC00..0xE000).contains(&l))
                };
                match unit {
                    0xD800..0xDC00 if low_follows() => i += 12,
                    0xD800..0xE000 => {
                        out.push_str(&text[copied..i]);
                        out.push_str("\\ufffd");
                        i += 6;
                        copied = i;
                    }
                    _ => i += 6,
                }
            }
            _ => i += 1,
        }
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// Makes flags storable: detection copies a few characters of what it matched into a flag's
/// `detail` (and a rule's `title`), and a NUL from a payload would make PostgreSQL refuse the
/// flag; it is shown as U+2400 (␀) instead, on both stores alike.
pub fn storable_flags(flags: &mut [NewFlag]) {
    for f in flags {
        for text in [&mut f.detail, &mut f.title] {
            if text.contains('\0') {
                *text = text.replace('\0', "\u{2400}");
            }
        }
    }
}

/// A validated item: the event to store and its parsed payload (for detection).
#[derive(Debug)]
pub struct ParsedItem {
    pub event: NewEvent,
    pub payload: serde_json::Value,
}

/// Validates one item for the token's user (`token_user`).
pub fn parse_item(raw: &[u8], token_user: &str) -> Result<ParsedItem, ItemError> {
    if raw.len() > MAX_ITEM {
        return Err(ItemError {
            code: 413,
            message: format!("item is {} bytes; the limit is {MAX_ITEM}", raw.len()),
            id: None,
        });
    }
    let env: RawEnvelope<'_> = match serde_json::from_slice(raw) {
        Ok(e) => e,
        Err(e) => {
            let msg = if e.is_data() {
                "item must be a JSON object (the event envelope), not an array or a scalar"
                    .to_string()
            } else {
                format!("item is not valid JSON: {e}")
            };
            return Err(ItemError::bad(None, msg));
        }
    };
    let id = opt_string(env.id, "id", &None)?;
    let Some(id) = id.filter(|s| !s.is_empty()) else {
        return Err(ItemError::bad(
            None,
            "`id` is required (a non-empty string; docs/api.md says how to derive it per source)",
        ));
    };
    // An id the store cannot hold is not echoed back either.
    storable("id", &id, MAX_ID).map_err(|m| ItemError::bad(None, m))?;
    let sid = Some(id.clone());
    // Attribution first: a foreign user_id is refused whatever else is wrong.
    if let Some(claimed) = opt_string(env.user_id, "user_id", &sid)?
        && claimed != token_user
    {
        return Err(ItemError {
                code: 403,
                message: "`user_id` differs from the token's user; a token writes only its own user's history".into(),
                id: sid,
            });
    }
    let source: Source = opt_string(env.source, "source", &sid)?
        .ok_or_else(|| ItemError::bad(sid.clone(), "`source` is required"))?
        .parse()
        .map_err(|e: String| ItemError::bad(sid.clone(), e))?;
    let kind = opt_string(env.kind, "type", &sid)?
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ItemError::bad(sid.clone(), "`type` is required (a non-empty string)"))?;
    storable("type", &kind, MAX_TYPE).map_err(|m| ItemError::bad(sid.clone(), m))?;
    if source == Source::Gate {
        return Err(ItemError {
            code: 403,
            message: "`source` \"gate\" is written only by the server: action-gate requests \
                      and decisions are recorded by the gate endpoints (docs/api.md); send your \
                      own records as `external`"
                .into(),
            id: sid,
        });
    }
    if is_reserved_type(&kind) {
        return Err(ItemError {
            code: 403,
            message: format!(
                "`type` {kind:?} is reserved: `airlock.*` and `gate.*` types are written only \
                 by the server (docs/api.md lists them); choose another type"
            ),
            id: sid,
        });
    }
    let ts_text = opt_string(env.ts, "ts", &sid)?.ok_or_else(|| {
        ItemError::bad(sid.clone(), "`ts` is required (RFC 3339, e.g. 2026-03-04T09:12:05.118Z)")
    })?;
    let ts: Micros = parse_rfc3339(&ts_text).ok_or_else(|| {
        ItemError::bad(sid.clone(), format!("`ts` {ts_text:?} is not an RFC 3339 timestamp"))
    })?;
    let session = opt_string(env.session, "session", &sid)?;
    if let Some(s) = &session {
        storable("session", s, MAX_SESSION).map_err(|m| ItemError::bad(sid.clone(), m))?;
    }
    let seq = opt_count(env.seq, "seq", &sid)?;
    let payload_raw =
        env.payload.ok_or_else(|| ItemError::bad(sid.clone(), "`payload` is required"))?;
    let payload = payload_value(payload_raw.get())
        .map_err(|e| ItemError::bad(sid.clone(), format!("`payload` is not valid JSON: {e}")))?;
    // `boot` is a copy lifted beside the payload for gap checks; one the store cannot hold in
    // its column is not lifted (the payload keeps it verbatim), so it never refuses an item.
    let boot = payload
        .get("boot")
        .and_then(|b| b.as_str())
        .filter(|b| storable("payload.boot", b, MAX_BOOT).is_ok())
        .map(str::to_string);
    let link = match source {
        // Where a transcript line came from, so it can be matched to its session record.
        Source::Claude | Source::Codex => TranscriptLink {
            airlock_session: opt_column(env.airlock_session, "airlock_session", MAX_SESSION, &sid)?,
            file: opt_column(env.file, "file", MAX_FILE, &sid)?,
            offset: opt_count(env.offset, "offset", &sid)?,
        },
        Source::Session if kind == TRANSCRIPT_FILE_TYPE => {
            transcript_file(&id, session.as_deref(), &payload)
                .map_err(|m| ItemError::bad(sid.clone(), m))?
        }
        // Elsewhere these members are unknown envelope fields, ignored like any other.
        _ => TranscriptLink::default(),
    };
    Ok(ParsedItem {
        event: NewEvent {
            source,
            id,
            kind,
            ts,
            session,
            seq,
            boot,
            payload: payload_raw.get().to_string(),
            airlock_session: link.airlock_session,
            file: link.file,
            offset: link.offset,
        },
        payload,
    })
}

/// The transcript columns of an event: set from a `claude`/`codex` envelope's members, or
/// from a `transcript.file` item's payload.
#[derive(Debug, Default)]
struct TranscriptLink {
    airlock_session: Option<String>,
    file: Option<String>,
    offset: Option<i64>,
}

/// An optional non-negative integer envelope field (`seq`, `offset`).
fn opt_count(
    raw: Option<&RawValue>,
    field: &str,
    id: &Option<String>,
) -> Result<Option<i64>, ItemError> {
    match raw {
        None => Ok(None),
        Some(r) if r.get() == "null" => Ok(None),
        Some(r) => serde_json::from_str::<u32>(r.get())
            .ok()
            .map(i64::from)
            .or_else(|| serde_json::from_str::<i64>(r.get()).ok().filter(|v| *v >= 0))
            .map(Some)
            .ok_or_else(|| {
                ItemError::bad(id.clone(), format!("`{field}` must be a non-negative integer"))
            }),
    }
}

/// An optional envelope string kept in its own column: [`opt_string`] and [`storable`].
fn opt_column(
    raw: Option<&RawValue>,
    field: &str,
    max: usize,
    id: &Option<String>,
) -> Result<Option<String>, ItemError> {
    let v = opt_string(raw, field, id)?;
    if let Some(v) = &v {
        storable(field, v, max).map_err(|m| ItemError::bad(id.clone(), m))?;
    }
    Ok(v)
}

/// Checks a `transcript.file` item (docs/api.md): its payload is
/// `{"airlock_session", "file", "bytes", "sha256"}`, its `session` is that `airlock_session`
/// and its `id` is `<airlock_session>:transcript:<file>` (one item per session and file, so a
/// resend with another prefix is a dedup conflict, not a second answer). Returns the columns.
fn transcript_file(
    id: &str,
    session: Option<&str>,
    payload: &serde_json::Value,
) -> Result<TranscriptLink, String> {
    const SHAPE: &str = "a `transcript.file` payload is {\"airlock_session\": string, \"file\": \
                         string, \"bytes\": integer >= 0, \"sha256\": \"sha256:<64 hex>\"}";
    let Some(obj) = payload.as_object() else {
        return Err(format!("{SHAPE}; this one is not an object"));
    };
    let text = |name: &str, max: usize| -> Result<String, String> {
        let v =
            obj.get(name).and_then(|v| v.as_str()).filter(|v| !v.is_empty()).ok_or_else(|| {
                format!("{SHAPE}; `payload.{name}` is missing or not a non-empty string")
            })?;
        storable(&format!("payload.{name}"), v, max)?;
        Ok(v.to_string())
    };
    let airlock_session = text("airlock_session", MAX_SESSION)?;
    let file = text("file", MAX_FILE)?;
    let bytes = obj.get("bytes").and_then(|b| b.as_u64()).filter(|b| i64::try_from(*b).is_ok());
    if bytes.is_none() {
        return Err(format!("{SHAPE}; `payload.bytes` is missing or not a non-negative integer"));
    }
    let sha = obj.get("sha256").and_then(|v| v.as_str()).unwrap_or("");
    let hex = sha.strip_prefix("sha256:").unwrap_or("");
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(format!(
            "{SHAPE}; `payload.sha256` must be \"sha256:\" and 64 lowercase hex digits"
        ));
    }
    if session != Some(airlock_session.as_str()) {
        return Err(format!(
            "a `transcript.file` item's `session` must be its `payload.airlock_session` ({airlock_session:?})"
        ));
    }
    let want = format!("{airlock_session}:transcript:{file}");
    if id != want {
        return Err(format!(
            "a `transcript.file` item's `id` must be `<airlock_session>:transcript:<file>`, here {want:?}"
        ));
    }
    Ok(TranscriptLink { airlock_session: Some(airlock_session), file: Some(file), offset: None })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok_item(id: &str) -> String {
        format!(
            r#"{{"id":"{id}","source":"egress","type":"connect","ts":"2026-03-04T09:12:05.118Z","payload":{{"host":"example.test","n":12345678901234567890123}}}}"#
        )
    }

    #[test]
    fn array_framing_keeps_bad_elements_as_items() {
        let body =
            format!(r#"[ {}, {{"id": "x", bad json}}, 7, "s,]", {} ]"#, ok_item("a"), ok_item("b"));
        let items = split(Format::JsonArray, body.as_bytes()).unwrap();
        assert_eq!(items.len(), 5);
        assert!(parse_item(items[0], "u").is_ok());
        assert_eq!(parse_item(items[1], "u").unwrap_err().code, 400);
        assert_eq!(parse_item(items[2], "u").unwrap_err().code, 400);
        assert_eq!(items[3], br#""s,]""#);
    }

    #[test]
    fn body_level_framing_errors() {
        for body in ["", "{}", "[", "[1,]", "[,1]", "[1] x", "[{]", "[1}]", "nope"] {
            let r = split(Format::JsonArray, body.as_bytes());
            assert!(r.is_err(), "{body:?} should be a body error");
        }
        assert_eq!(split(Format::JsonArray, b"[]"), Err(BodyError::Empty));
    }

    #[test]
    fn item_limits() {
        let many = format!("[{}]", vec!["1"; MAX_ITEMS + 1].join(","));
        assert_eq!(split(Format::JsonArray, many.as_bytes()), Err(BodyError::TooManyItems));
        let nd = "1\n".repeat(MAX_ITEMS + 1);
        assert_eq!(split(Format::Ndjson, nd.as_bytes()), Err(BodyError::TooManyItems));
        let big = vec![b' '; MAX_ITEM + 1];
        assert_eq!(parse_item(&big, "u").unwrap_err().code, 413);
    }

    #[test]
    fn payload_is_stored_verbatim() {
        let raw = ok_item("a");
        let p = parse_item(raw.as_bytes(), "u").unwrap();
        assert_eq!(p.event.payload, r#"{"host":"example.test","n":12345678901234567890123}"#);
    }

    #[test]
    fn foreign_user_id_is_403_and_own_is_fine() {
        let raw = r#"{"id":"a","source":"claude","type":"user","ts":"2026-03-04T09:12:05Z","user_id":"someone-else","payload":{"user_id":"anything"}}"#;
        assert_eq!(parse_item(raw.as_bytes(), "me").unwrap_err().code, 403);
        let own = raw.replace("someone-else", "me");
        assert!(parse_item(own.as_bytes(), "me").is_ok());
        // ids inside payloads are never compared
        let nouser = r#"{"id":"a","source":"claude","type":"user","ts":"2026-03-04T09:12:05Z","payload":{"user_id":"x"}}"#;
        assert!(parse_item(nouser.as_bytes(), "me").is_ok());
    }

    #[test]
    fn envelope_validation() {
        let cases = [
            r#"{"source":"egress","type":"t","ts":"2026-03-04T09:12:05Z","payload":{}}"#,
            r#"{"id":"a","source":"nope","type":"t","ts":"2026-03-04T09:12:05Z","payload":{}}"#,
            r#"{"id":"a","source":"egress","ts":"2026-03-04T09:12:05Z","payload":{}}"#,
            r#"{"id":"a","source":"egress","type":"t","ts":"yesterday","payload":{}}"#,
            r#"{"id":"a","source":"egress","type":"t","ts":"2026-03-04T09:12:05Z"}"#,
            r#"{"id":"a","source":"egress","type":"t","ts":"2026-03-04T09:12:05Z","seq":-1,"payload":{}}"#,
            r#"{"id":7,"source":"egress","type":"t","ts":"2026-03-04T09:12:05Z","payload":{}}"#,
            r#"[1]"#,
        ];
        for c in cases {
            assert_eq!(parse_item(c.as_bytes(), "u").unwrap_err().code, 400, "{c}");
        }
    }

    #[test]
    fn nested_array_elements_are_items_not_framing_errors() {
        let good = ok_item("a");
        let body = format!(r#"[[1],{good},[[]],[],{{"x":[1,{{"y":[]}}]}}]"#);
        let items = split(Format::JsonArray, body.as_bytes()).unwrap();
        assert_eq!(items, [&b"[1]"[..], good.as_bytes(), b"[[]]", b"[]", br#"{"x":[1,{"y":[]}]}"#]);
        for i in [0, 2, 3] {
            let e = parse_item(items[i], "u").unwrap_err();
            assert_eq!(e.code, 400);
            assert!(e.message.contains("not an array"), "{}", e.message);
        }
        assert!(parse_item(items[1], "u").is_ok());
        // Mismatched brackets inside an element are still broken framing.
        for body in ["[[1}]", "[{]}]", "[[1]]]", "[}]"] {
            assert!(split(Format::JsonArray, body.as_bytes()).is_err(), "{body}");
        }
    }

    fn envelope(id: &str, kind: &str, session: &str) -> String {
        format!(
            r#"{{"id":"{id}","source":"external","type":"{kind}","ts":"2026-03-04T09:12:05Z","session":"{session}","payload":{{}}}}"#
        )
    }

    #[test]
    fn envelope_fields_the_store_cannot_hold_are_400() {
        let x = |n: usize| "x".repeat(n);
        let cases = [
            (envelope(r"a\u0000", "t", "s"), "`id` contains a NUL"),
            (envelope("a", r"t\u0000", "s"), "`type` contains a NUL"),
            (envelope("a", "t", r"\u0000"), "`session` contains a NUL"),
            (envelope(&x(MAX_ID + 1), "t", "s"), "`id` is 1537 bytes; the limit is 1536"),
            (envelope("a", &x(MAX_TYPE + 1), "s"), "`type` is 129 bytes; the limit is 128"),
            (envelope("a", "t", &x(2700)), "`session` is 2700 bytes; the limit is 256"),
            (envelope(r"\ud800", "t", "s"), "`id` is not a valid string"),
            (envelope("a", r"t\udfff", "s"), "`type` is not a valid string"),
        ];
        for (raw, want) in cases {
            let e = parse_item(raw.as_bytes(), "u").unwrap_err();
            assert_eq!(e.code, 400, "{raw}");
            assert!(e.message.contains(want), "{raw}: {}", e.message);
        }
        // Multi-byte characters count in bytes; the limits themselves are fine.
        let e = parse_item(envelope("a", &"é".repeat(65), "s").as_bytes(), "u").unwrap_err();
        assert!(e.message.contains("130 bytes"), "{}", e.message);
        let edge = envelope(&x(MAX_ID), &x(MAX_TYPE), &x(MAX_SESSION));
        assert!(parse_item(edge.as_bytes(), "u").is_ok());
    }

    fn transcript_line(members: &str) -> String {
        format!(
            r#"{{"id":"u-1","source":"claude","type":"user","ts":"2026-03-04T09:12:05Z","session":"agent-s"{members},"payload":{{"uuid":"u-1"}}}}"#
        )
    }

    #[test]
    fn transcript_members_are_stored_for_claude_and_codex_and_checked() {
        let p = parse_item(
            transcript_line(
                r#","airlock_session":"s-1","file":".claude/projects/p/a.jsonl","offset":4096"#,
            )
            .as_bytes(),
            "u",
        )
        .unwrap();
        let e = &p.event;
        assert_eq!(e.airlock_session.as_deref(), Some("s-1"));
        assert_eq!(e.file.as_deref(), Some(".claude/projects/p/a.jsonl"));
        assert_eq!(e.offset, Some(4096));
        let p = parse_item(
            transcript_line(r#","airlock_session":null,"file":null,"offset":null"#).as_bytes(),
            "u",
        )
        .unwrap();
        assert_eq!((p.event.airlock_session, p.event.file, p.event.offset), (None, None, None));
        let x = |n: usize| "x".repeat(n);
        let bad = [
            (r#","airlock_session":7"#.to_string(), "`airlock_session` must be a string"),
            (r#","airlock_session":"a\u0000""#.to_string(), "`airlock_session` contains a NUL"),
            (format!(r#","airlock_session":"{}""#, x(MAX_SESSION + 1)), "the limit is 256"),
            (r#","file":["a"]"#.to_string(), "`file` must be a string"),
            (format!(r#","file":"{}""#, x(MAX_FILE + 1)), "the limit is 1024"),
            (r#","file":"\ud800""#.to_string(), "`file` is not a valid string"),
            (r#","offset":-1"#.to_string(), "`offset` must be a non-negative integer"),
            (r#","offset":1.5"#.to_string(), "`offset` must be a non-negative integer"),
            (r#","offset":"4096""#.to_string(), "`offset` must be a non-negative integer"),
        ];
        for (members, want) in bad {
            let e = parse_item(transcript_line(&members).as_bytes(), "u").unwrap_err();
            assert_eq!((e.code, e.id.as_deref()), (400, Some("u-1")), "{members}");
            assert!(e.message.contains(want), "{members}: {}", e.message);
        }
        let edge = format!(r#","airlock_session":"{}","file":"{}""#, x(MAX_SESSION), x(MAX_FILE));
        assert!(parse_item(transcript_line(&edge).as_bytes(), "u").is_ok());
        // On other sources they are unknown envelope fields: ignored, not stored.
        let egress = r#"{"id":"e","source":"egress","type":"connect","ts":"2026-03-04T09:12:05Z","file":7,"payload":{}}"#;
        assert_eq!(parse_item(egress.as_bytes(), "u").unwrap().event.file, None);
    }

    fn transcript_file_item(id: &str, session: &str, payload: &str) -> String {
        format!(
            r#"{{"id":"{id}","source":"session","type":"transcript.file","ts":"2026-03-04T09:12:05Z","session":"{session}","payload":{payload}}}"#
        )
    }

    #[test]
    fn transcript_file_items_are_checked_and_lift_their_file() {
        let sha = format!("sha256:{}", "ab".repeat(32));
        let good =
            format!(r#"{{"airlock_session":"s-1","file":"f.jsonl","bytes":12,"sha256":"{sha}"}}"#);
        let p = parse_item(
            transcript_file_item("s-1:transcript:f.jsonl", "s-1", &good).as_bytes(),
            "u",
        )
        .unwrap();
        assert_eq!(p.event.airlock_session.as_deref(), Some("s-1"));
        assert_eq!(p.event.file.as_deref(), Some("f.jsonl"));
        assert_eq!(p.event.offset, None);
        let id = "s-1:transcript:f.jsonl";
        let bad = [
            (id, "s-1", "[1]".to_string(), "not an object"),
            (
                id,
                "s-1",
                format!(r#"{{"file":"f.jsonl","bytes":12,"sha256":"{sha}"}}"#),
                "`payload.airlock_session` is missing",
            ),
            (
                id,
                "s-1",
                format!(r#"{{"airlock_session":"s-1","file":"","bytes":12,"sha256":"{sha}"}}"#),
                "`payload.file` is missing",
            ),
            (
                id,
                "s-1",
                format!(
                    r#"{{"airlock_session":"s-1","file":"f.jsonl","bytes":-1,"sha256":"{sha}"}}"#
                ),
                "`payload.bytes`",
            ),
            (
                id,
                "s-1",
                format!(
                    r#"{{"airlock_session":"s-1","file":"f.jsonl","bytes":"12","sha256":"{sha}"}}"#
                ),
                "`payload.bytes`",
            ),
            (
                id,
                "s-1",
                r#"{"airlock_session":"s-1","file":"f.jsonl","bytes":12,"sha256":"abc"}"#
                    .to_string(),
                "`payload.sha256`",
            ),
            (
                id,
                "s-1",
                format!(
                    r#"{{"airlock_session":"s-1","file":"f.jsonl","bytes":12,"sha256":"{}"}}"#,
                    sha.to_uppercase()
                ),
                "`payload.sha256`",
            ),
            (
                id,
                "s-1",
                format!(
                    r#"{{"airlock_session":"s-1","file":"f\u0000","bytes":12,"sha256":"{sha}"}}"#
                ),
                "NUL",
            ),
            (id, "s-2", good.clone(), "`session` must be its `payload.airlock_session`"),
            (
                "s-1:transcript:g.jsonl",
                "s-1",
                good.clone(),
                "`id` must be `<airlock_session>:transcript:<file>`",
            ),
        ];
        for (id, session, payload, want) in bad {
            let e = parse_item(transcript_file_item(id, session, &payload).as_bytes(), "u")
                .unwrap_err();
            assert_eq!(e.code, 400, "{payload}");
            assert!(e.message.contains(want), "{payload}: {}", e.message);
        }
    }

    #[test]
    fn gate_events_from_clients_are_403() {
        let line = r#"{"id":"g1","source":"gate","type":"deploy.ok","ts":"2026-03-04T09:12:05Z","payload":{}}"#;
        let e = parse_item(line.as_bytes(), "u").unwrap_err();
        assert_eq!(e.code, 403);
        assert!(e.message.contains("written only by the server"), "{}", e.message);
        assert_eq!(e.id.as_deref(), Some("g1"));
        let external = line.replace("\"gate\"", "\"external\"");
        assert!(parse_item(external.as_bytes(), "u").is_ok());
    }

    #[test]
    fn reserved_types_are_403() {
        for kind in ["airlock.review.read", "gate.approved", "Gate.Denied", " AIRLOCK.x", "gate."] {
            assert!(is_reserved_type(kind), "{kind:?}");
            let e = parse_item(envelope("a", kind, "s").as_bytes(), "u").unwrap_err();
            assert_eq!((e.code, e.id.as_deref()), (403, Some("a")), "{kind}");
            assert!(e.message.contains("reserved"), "{}", e.message);
        }
        for kind in ["deploy.approved", "airlock", "gate", "my.gate.approved", "airlockx.y"] {
            assert!(!is_reserved_type(kind), "{kind:?}");
            assert!(parse_item(envelope("a", kind, "s").as_bytes(), "u").is_ok(), "{kind}");
        }
    }

    #[test]
    fn payload_nul_and_lone_surrogates_are_kept_verbatim() {
        let payload =
            r#"{ "b": "\u0000", "a": "\ud800 x \uDC00", "ok": "\ud83d\ude00", "e": "\\ud800" }"#;
        let raw = format!(
            r#"{{"id":"a","source":"external","type":"t","ts":"2026-03-04T09:12:05Z","payload":{payload}}}"#
        );
        let p = parse_item(raw.as_bytes(), "u").unwrap();
        assert_eq!(p.event.payload, payload);
        assert_eq!(p.payload["b"], "\0");
        assert_eq!(p.payload["a"], "\u{fffd} x \u{fffd}");
        assert_eq!(p.payload["ok"], "\u{1f600}");
        assert_eq!(p.payload["e"], "\\ud800");
    }

    #[test]
    fn a_boot_the_store_cannot_hold_is_not_lifted() {
        let with_boot = |boot: &str| {
            format!(
                r#"{{"id":"a","source":"egress","type":"connect","ts":"2026-03-04T09:12:05Z","payload":{{"boot":"{boot}"}}}}"#
            )
        };
        let p = parse_item(with_boot("b-1").as_bytes(), "u").unwrap();
        assert_eq!(p.event.boot.as_deref(), Some("b-1"));
        for boot in [r"b\u0000".to_string(), "b".repeat(MAX_BOOT + 1)] {
            let p = parse_item(with_boot(&boot).as_bytes(), "u").unwrap();
            assert_eq!(p.event.boot, None, "{boot}");
            assert!(p.event.payload.contains(&boot));
        }
    }

    #[test]
    fn flags_never_carry_nul() {
        let mut flags = vec![NewFlag {
            id: "f".into(),
            rule_id: "r".into(),
            title: "t\0".into(),
            severity: crate::review::Severity::Low,
            user_id: "u".into(),
            session: None,
            detail: "match: dd \0\0".into(),
            event_pks: vec![1],
        }];
        storable_flags(&mut flags);
        assert_eq!(flags[0].detail, "match: dd \u{2400}\u{2400}");
        assert_eq!(flags[0].title, "t\u{2400}");
    }

    #[test]
    fn gzip_roundtrip_and_errors() {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(b"[1]").unwrap();
        let gz = enc.finish().unwrap();
        assert_eq!(gunzip(&gz).unwrap(), b"[1]");
        assert!(matches!(gunzip(b"not gzip"), Err(BodyError::BadGzip(_))));
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&vec![b' '; MAX_BODY + 10]).unwrap();
        assert_eq!(gunzip(&enc.finish().unwrap()), Err(BodyError::TooLarge));
    }

    #[test]
    fn media_types() {
        assert_eq!(format_for(Some("application/json; charset=utf-8")), Ok(Format::JsonArray));
        assert_eq!(format_for(Some("application/x-ndjson")), Ok(Format::Ndjson));
        assert!(format_for(Some("text/plain")).is_err());
        assert!(format_for(None).is_err());
    }

    proptest! {
        #[test]
        fn framing_never_panics(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = split(Format::JsonArray, &body);
            let _ = split(Format::Ndjson, &body);
            if let Ok(items) = split(Format::JsonArray, &body) {
                for it in items { let _ = parse_item(it, "u"); }
            }
        }

        /// Replacing lone surrogate escapes reads a string as `String::from_utf16_lossy`
        /// does, whatever the code units (pairs, lone halves, NUL, backslashes), in either case.
        #[test]
        fn lone_surrogates_read_as_from_utf16_lossy(units in proptest::collection::vec(
            prop_oneof![Just(0u16), Just(0x5c), Just(0x22), 0xd800u16..0xe000, any::<u16>()], 0..24)) {
            let lossy = String::from_utf16_lossy(&units);
            let lower: String = units.iter().map(|u| format!("\\u{u:04x}")).collect();
            let v = payload_value(&format!(r#"["{lower}"]"#)).unwrap();
            prop_assert_eq!(v[0].as_str().unwrap(), lossy.as_str());
            let upper: String = units.iter().map(|u| format!("\\u{u:04X}")).collect();
            let v = payload_value(&format!(r#"{{"k\\":"{upper}"}}"#)).unwrap();
            prop_assert_eq!(v["k\\"].as_str().unwrap(), lossy.as_str());
        }

        #[test]
        fn framing_matches_serde_on_valid_arrays(vals in proptest::collection::vec(
            prop_oneof![
                any::<i64>().prop_map(|v| serde_json::json!(v)),
                ".*".prop_map(|s| serde_json::json!(s)),
                (".*", any::<bool>()).prop_map(|(k, b)| serde_json::json!({k: [b, {"x": "]}"}]})),
                (".*", any::<bool>()).prop_map(|(k, b)| serde_json::json!([[b], {"x": [k]}, []])),
            ], 1..20)) {
            let body = serde_json::to_string(&vals).unwrap();
            let items = split(Format::JsonArray, body.as_bytes()).unwrap();
            prop_assert_eq!(items.len(), vals.len());
            for (raw, v) in items.iter().zip(&vals) {
                let parsed: serde_json::Value = serde_json::from_slice(raw).unwrap();
                prop_assert_eq!(&parsed, v);
            }
        }
    }
}
