//! Decoding of `POST /api/v1/events` bodies (DESIGN §8, docs/api.md).
//!
//! Two error levels, kept strictly apart:
//! - **body errors** (bad gzip, unknown media type, not a JSON array / NDJSON framing,
//!   more than [`MAX_ITEMS`] items, more than [`MAX_BODY`] bytes after decompression): the
//!   request fails with a 4xx and nothing is stored;
//! - **item errors** (an element or NDJSON line that is not valid JSON, misses a field,
//!   exceeds [`MAX_ITEM`], or names another user): that item gets its code in a 207, the
//!   rest are stored.
//!
//! A JSON array is split into elements by a small bracket/string scanner, so one malformed
//! element does not make the whole body unreadable.

use super::{Micros, NewEvent, Source, parse_rfc3339};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::io::Read;

pub const MAX_ITEMS: usize = 1000;
pub const MAX_BODY: usize = 5 * 1024 * 1024;
pub const MAX_ITEM: usize = 1024 * 1024;
const MAX_ID: usize = 1024;
const MAX_TYPE: usize = 256;

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
            b'}' if stack.pop() != Some(b'{') => {
                return Err(err("unbalanced '}'"));
            }
            b']' if !stack.is_empty() && stack.pop() != Some(b'[') => {
                return Err(err("unbalanced ']'"));
            }
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
}

fn opt_string(
    raw: Option<&RawValue>,
    field: &str,
    id: &Option<String>,
) -> Result<Option<String>, ItemError> {
    match raw {
        None => Ok(None),
        Some(r) if r.get() == "null" => Ok(None),
        Some(r) => serde_json::from_str::<String>(r.get())
            .map(Some)
            .map_err(|_| ItemError::bad(id.clone(), format!("`{field}` must be a string"))),
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
                "item must be a JSON object (the event envelope)".to_string()
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
    if id.len() > MAX_ID {
        return Err(ItemError::bad(None, format!("`id` is longer than {MAX_ID} bytes")));
    }
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
    if kind.len() > MAX_TYPE {
        return Err(ItemError::bad(sid, format!("`type` is longer than {MAX_TYPE} bytes")));
    }
    let ts_text = opt_string(env.ts, "ts", &sid)?.ok_or_else(|| {
        ItemError::bad(sid.clone(), "`ts` is required (RFC 3339, e.g. 2026-03-04T09:12:05.118Z)")
    })?;
    let ts: Micros = parse_rfc3339(&ts_text).ok_or_else(|| {
        ItemError::bad(sid.clone(), format!("`ts` {ts_text:?} is not an RFC 3339 timestamp"))
    })?;
    let session = opt_string(env.session, "session", &sid)?;
    let seq = match env.seq {
        None => None,
        Some(r) if r.get() == "null" => None,
        Some(r) => Some(
            serde_json::from_str::<u32>(r.get())
                .ok()
                .map(i64::from)
                .or_else(|| serde_json::from_str::<i64>(r.get()).ok().filter(|v| *v >= 0))
                .ok_or_else(|| {
                    ItemError::bad(sid.clone(), "`seq` must be a non-negative integer")
                })?,
        ),
    };
    let payload_raw =
        env.payload.ok_or_else(|| ItemError::bad(sid.clone(), "`payload` is required"))?;
    let payload: serde_json::Value = serde_json::from_str(payload_raw.get())
        .map_err(|e| ItemError::bad(sid.clone(), format!("`payload` is not valid JSON: {e}")))?;
    let boot = payload.get("boot").and_then(|b| b.as_str()).map(str::to_string);
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
        },
        payload,
    })
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

        #[test]
        fn framing_matches_serde_on_valid_arrays(vals in proptest::collection::vec(
            prop_oneof![
                any::<i64>().prop_map(|v| serde_json::json!(v)),
                ".*".prop_map(|s| serde_json::json!(s)),
                (".*", any::<bool>()).prop_map(|(k, b)| serde_json::json!({k: [b, {"x": "]}"}]})),
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
