//! `GET /api/v1/export`: the events a listing with the same filters would return, as JSONL
//! (`application/x-ndjson`), streamed in constant memory. A producer task reads the store a
//! page at a time ([`CHUNK_BYTES`] of payload per page) and hands each page's lines to the
//! response body through a channel of [`CHANNEL_CHUNKS`]: when the client reads slowly the
//! channel is full and the producer waits (backpressure); when it goes away the producer
//! stops. The read slot is held by the producer until the last line is sent. A store error
//! mid-stream aborts the body, so the client sees a truncated transfer, never a short file
//! that looks complete.

use super::{Cursor, ReadPermit};
use crate::review::store::{EventQuery, Store};
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
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

/// Starts an export of `q` (its `limit` and `max_bytes` are set here): the `header` line
/// first, then one line per event in the events API's item shape. The returned body ends
/// after the last matching event.
pub fn start<S: Store, St>(
    state: std::sync::Arc<St>,
    store: fn(&St) -> &S,
    mut q: EventQuery,
    with_view: bool,
    header: Vec<u8>,
    permit: ReadPermit,
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
        loop {
            let page = match store(&state).query_event_page(&q).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("export aborted by a store error: {e}");
                    let _ = tx.send(Err(ExportError(e.to_string()))).await;
                    return;
                }
            };
            let more = page.truncated || page.events.len() == q.limit as usize;
            let mut chunk = Vec::with_capacity(64 * 1024);
            for e in &page.events {
                if let Err(e) = serde_json::to_writer(&mut chunk, &e.api_json(with_view)) {
                    let _ = tx.send(Err(ExportError(e.to_string()))).await;
                    return;
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
                None => return,
            }
        }
    });
    ExportBody { rx }
}
