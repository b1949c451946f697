//! `GET /api/v1/export`: the events a listing with the same filters would return, as JSONL
//! (`application/x-ndjson`), streamed in constant memory. A producer task reads the store a
//! page at a time ([`CHUNK_BYTES`] of payload per page) and hands each page's lines to the
//! response body through a channel of [`CHANNEL_CHUNKS`]: when the client reads slowly the
//! channel is full and the producer waits (backpressure); when it goes away the producer
//! stops. The read slot is held by the producer until the last line is sent. A store error
//! mid-stream aborts the body, so the client sees a truncated transfer, never a short file
//! that looks complete.

use super::{Cursor, ReadPermit};
use crate::review::format_micros;
use crate::review::log::LogHub;
use crate::review::store::{EventQuery, Store};
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use serde_json::json;
use std::collections::HashMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// Payload bytes per store page of an export (also about the size of one body chunk).
pub const CHUNK_BYTES: u64 = 1024 * 1024;
/// Rows per store page of an export.
pub const CHUNK_ROWS: u32 = 1000;
/// Chunks buffered between the producer and the connection.
pub const CHANNEL_CHUNKS: usize = 2;

/// Why an export stream ended early.
#[derive(Debug, thiserror::Error)]
#[error("export aborted: {0}")]
pub struct ExportError(String);

/// The streaming body of an export response.
#[derive(Debug)]
pub struct ExportBody {
    rx: mpsc::Receiver<Result<Bytes, ExportError>>,
}

impl Body for ExportBody {
    type Data = Bytes;
    type Error = ExportError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ExportError>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data)))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// How an export writes its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line in the events API's item shape.
    Jsonl,
    /// RFC 4180 CSV for spreadsheets: one row per event in [`CSV_COLUMNS`], the payload as its
    /// JSON text. A cell a spreadsheet would run as a formula is defused ([`csv_cell`]).
    Csv,
}

/// The columns of a CSV export, its first row.
pub const CSV_COLUMNS: [&str; 15] = [
    "pk",
    "user_id",
    "source",
    "id",
    "type",
    "ts",
    "session",
    "seq",
    "boot",
    "received_at",
    "airlock_session",
    "file",
    "offset",
    "conflict_of",
    "payload",
];

/// One CSV cell (RFC 4180 §2): quoted when it holds a comma, quote, CR or LF, quotes doubled.
/// A cell starting with `=`, `+`, `-`, `@`, TAB or CR is what spreadsheets evaluate as a
/// formula (OWASP "CSV Injection"): it gets a leading `'`, which they show as text.
pub fn csv_cell(out: &mut Vec<u8>, v: &str) {
    let formula = v.starts_with(['=', '+', '-', '@', '\t', '\r']);
    let quote = formula || v.contains([',', '"', '\r', '\n']);
    if quote {
        out.push(b'"');
    }
    if formula {
        out.push(b'\'');
    }
    for b in v.bytes() {
        if b == b'"' {
            out.push(b'"');
        }
        out.push(b);
    }
    if quote {
        out.push(b'"');
    }
}

/// One event as a CSV row (CRLF-terminated, RFC 4180).
pub fn csv_row(out: &mut Vec<u8>, e: &crate::review::StoredEvent) {
    let opt = |v: Option<i64>| v.map(|n| n.to_string()).unwrap_or_default();
    let cells: [String; 15] = [
        e.pk.to_string(),
        e.user_id.clone(),
        e.source.as_str().to_string(),
        e.id.clone(),
        e.kind.clone(),
        format_micros(e.ts),
        e.session.clone().unwrap_or_default(),
        opt(e.seq),
        e.boot.clone().unwrap_or_default(),
        format_micros(e.received_at),
        e.airlock_session.clone().unwrap_or_default(),
        e.file.clone().unwrap_or_default(),
        opt(e.offset),
        opt(e.conflict_of),
        e.payload.clone(),
    ];
    for (i, c) in cells.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        csv_cell(out, c);
    }
    out.extend_from_slice(b"\r\n");
}

/// The first row of a CSV export.
pub fn csv_header() -> Vec<u8> {
    let mut out = CSV_COLUMNS.join(",").into_bytes();
    out.extend_from_slice(b"\r\n");
    out
}

/// The review log's part of a JSONL export (docs/evidence.md "Exports"): each event line
/// gets its leaf and inclusion proof in the checkpoint of `size` the header names, and leaves
/// whose event row is gone are listed after the events.
#[derive(Debug, Clone)]
pub struct ExportLog {
    pub size: u64,
    /// Users whose orphan leaves are listed (`None`: the export is narrowed by a field a leaf
    /// does not hold, so orphans are not looked for).
    pub orphan_users: Option<Vec<String>>,
}

/// How an export's producer reaches the server's [`LogHub`] from its state.
pub type HubOf<St> = fn(&St) -> &LogHub;

/// Orphan leaves listed per user at most (each is a failure a verifier reports; past this
/// many the export says so in its `end` line).
pub const MAX_ORPHANS: u32 = 10_000;

/// Starts an export of `q` in `format` (its `limit` and `max_bytes` are set here): the
/// `header` first, then one line or row per event; a JSONL export ends with an
/// `{"end": {...}}` line, so a reader can tell a complete file from a cut one. The returned
/// body ends after that.
#[allow(clippy::too_many_arguments)]
pub fn start_as<S: Store, St>(
    state: std::sync::Arc<St>,
    store: fn(&St) -> &S,
    mut q: EventQuery,
    format: Format,
    with_view: bool,
    header: Vec<u8>,
    permit: ReadPermit,
    log: Option<(ExportLog, HubOf<St>)>,
) -> ExportBody
where
    St: Send + Sync + 'static,
{
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    q.limit = CHUNK_ROWS;
    q.max_bytes = Some(CHUNK_BYTES);
    tokio::spawn(async move {
        // Held until the stream ends or the client leaves.
        let _permit = permit;
        if tx.send(Ok(Bytes::from(header))).await.is_err() {
            return;
        }
        let log = log.filter(|_| format == Format::Jsonl);
        let mut events = 0u64;
        loop {
            let page = match store(&state).query_event_page(&q).await {
                Ok(p) => p,
                Err(e) => return abort(&tx, e.to_string()).await,
            };
            let more = page.truncated || page.events.len() == q.limit as usize;
            let leaves = match &log {
                Some(_) => {
                    let pks: Vec<i64> = page.events.iter().map(|e| e.pk).collect();
                    match store(&state).log_leaves(&pks).await {
                        Ok(l) => l.into_iter().map(|l| (l.event_pk, l)).collect(),
                        Err(e) => return abort(&tx, e.to_string()).await,
                    }
                }
                None => HashMap::new(),
            };
            let mut chunk = Vec::with_capacity(64 * 1024);
            for e in &page.events {
                events += 1;
                if format == Format::Csv {
                    csv_row(&mut chunk, e);
                    continue;
                }
                let at = chunk.len();
                if let Err(e) = serde_json::to_writer(&mut chunk, &e.api_json(with_view)) {
                    return abort(&tx, e.to_string()).await;
                }
                if let Some((l, hub)) = &log {
                    let leaf = match leaves.get(&e.pk).filter(|leaf| leaf.index < l.size) {
                        Some(leaf) => {
                            match hub(&state).inclusion(store(&state), leaf.index, l.size).await {
                                Ok(Ok(h)) => json!({"index": leaf.index, "hashes": hashes(&h)}),
                                Ok(Err(err)) => return abort(&tx, err.to_string()).await,
                                Err(err) => return abort(&tx, err.to_string()).await,
                            }
                        }
                        None => serde_json::Value::Null,
                    };
                    // The item is an object: its closing brace makes room for the leaf.
                    if chunk.last() == Some(&b'}') && chunk.len() > at + 2 {
                        chunk.pop();
                        chunk.extend_from_slice(b",\"leaf\":");
                        chunk.extend_from_slice(leaf.to_string().as_bytes());
                        chunk.push(b'}');
                    }
                }
                chunk.push(b'\n');
            }
            let last = page.events.last().map(|e| Cursor::after(e, q.order));
            drop(page);
            if !chunk.is_empty() && tx.send(Ok(Bytes::from(chunk))).await.is_err() {
                return;
            }
            match last.filter(|_| more) {
                Some(c) => {
                    q.after = Some(c.pk);
                    q.after_ts = c.ts;
                }
                None => break,
            }
        }
        if format != Format::Jsonl {
            return;
        }
        let mut missing = 0u64;
        let mut tail = Vec::new();
        if let Some((l, hub)) = &log {
            for user in l.orphan_users.iter().flatten() {
                let orphans = match store(&state).log_orphans(user, MAX_ORPHANS).await {
                    Ok(o) => o,
                    Err(e) => return abort(&tx, e.to_string()).await,
                };
                for o in orphans.into_iter().filter(|o| o.index < l.size) {
                    let proof = match hub(&state).inclusion(store(&state), o.index, l.size).await {
                        Ok(Ok(h)) => h,
                        Ok(Err(err)) => return abort(&tx, err.to_string()).await,
                        Err(err) => return abort(&tx, err.to_string()).await,
                    };
                    missing += 1;
                    let line = json!({"missing": {
                        "leaf_index": o.index, "user_id": o.user_id, "source": o.source,
                        "id": o.id, "received_at": format_micros(o.received_at),
                        "leaf_hash": crate::tlog::b64(&o.hash), "hashes": hashes(&proof),
                    }});
                    tail.extend_from_slice(line.to_string().as_bytes());
                    tail.push(b'\n');
                }
            }
        }
        let end = json!({"end": {"events": events, "missing": missing}});
        tail.extend_from_slice(end.to_string().as_bytes());
        tail.push(b'\n');
        let _ = tx.send(Ok(Bytes::from(tail))).await;
    });
    ExportBody { rx }
}

/// A store error mid-stream: the body ends in an error, so the client sees a truncated
/// transfer, never a short file that looks complete.
async fn abort(tx: &mpsc::Sender<Result<Bytes, ExportError>>, why: String) {
    tracing::warn!("export aborted: {why}");
    let _ = tx.send(Err(ExportError(why))).await;
}

fn hashes(h: &[crate::tlog::Hash]) -> Vec<String> {
    h.iter().map(|h| crate::tlog::b64(h)).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn cell(v: &str) -> String {
        let mut out = Vec::new();
        csv_cell(&mut out, v);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn csv_cells_quote_and_defuse_formulas() {
        assert_eq!(cell("plain"), "plain");
        assert_eq!(cell("a,b"), "\"a,b\"");
        assert_eq!(cell("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(cell("two\nlines"), "\"two\nlines\"");
        for f in ["=HYPERLINK(\"x\")", "+1", "-1+2", "@SUM(A1)", "\tx", "\rx"] {
            let c = cell(f);
            assert!(c.starts_with("\"'"), "{f} became {c}");
        }
        assert_eq!(cell(""), "");
    }
}
