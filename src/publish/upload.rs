//! Where batches go ([`Sink`]: the review plane's `POST /api/v1/events`, or a test/bench sink)
//! and how one batch is posted: gzip of the NDJSON body, 429/503 retried honouring
//! `Retry-After` with capped exponential backoff and jitter, bounded by attempts and by the
//! run's deadline.

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// At most this many items per batch (docs/api.md).
pub const BATCH_ITEMS: usize = 1_000;
/// At most this many bytes of NDJSON per batch before gzip (docs/api.md).
pub const BATCH_BYTES: usize = 5_000_000;
/// Longest wait between two attempts.
pub const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// Attempts of one batch on 429/503 before giving up.
pub const MAX_ATTEMPTS: u32 = 10;
/// Upper bound on uploads in flight, whatever the server advertises.
pub const MAX_CONCURRENCY: usize = 32;

/// The server's answer for one item.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ItemResult {
    pub index: usize,
    /// `created`, `duplicate`, `conflict` or `rejected`.
    pub status: String,
    pub code: u16,
    pub error: Option<String>,
    /// The review log's receipt for a stored item, when the server keeps a log.
    pub leaf: Option<LeafReceipt>,
}

/// Where the review log put an item (docs/evidence.md "Receipts").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeafReceipt {
    /// The server's `received_at` for the item.
    pub received_at: String,
    /// `None` while pending.
    pub leaf_index: Option<u64>,
    /// While pending: by when the server will have sequenced it.
    pub deadline: Option<String>,
}

/// The answer to one batch (200 or 207).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reply {
    /// `X-Airlock-Ingest-Concurrency`, when the answer carried it.
    pub concurrency: Option<usize>,
    pub results: Vec<ItemResult>,
    /// A signed checkpoint covering the batch, when the answer carried one.
    pub checkpoint: Option<String>,
}

/// Why a post failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// 429 or 503: try again later.
    #[error("the server asked to retry ({status}): {message}")]
    Retry { status: u16, after: Option<Duration>, message: String },
    /// 401: the token is bad or revoked.
    #[error("{message}")]
    Unauthorized { message: String },
    /// Anything else: stop.
    #[error("{message}")]
    Fatal { message: String },
}

/// Where batches go.
pub trait Sink {
    /// Uploads the server allows in flight, when already known (e.g. from `/me`).
    fn concurrency(&self) -> Option<usize> {
        None
    }
    /// Posts one gzipped NDJSON batch of `items` envelopes.
    fn post(&self, gz: Bytes, items: usize) -> impl Future<Output = Result<Reply, SinkError>>;
}

/// A sink that stores nothing and answers every item `created` (the client-side benchmark).
#[derive(Debug, Clone, Copy, Default)]
pub struct NullSink;

impl Sink for NullSink {
    fn concurrency(&self) -> Option<usize> {
        Some(1)
    }
    async fn post(&self, _gz: Bytes, items: usize) -> Result<Reply, SinkError> {
        Ok(Reply {
            concurrency: None,
            results: (0..items)
                .map(|index| ItemResult {
                    index,
                    status: "created".into(),
                    code: 201,
                    ..Default::default()
                })
                .collect(),
            checkpoint: None,
        })
    }
}

/// The review plane (`airlock login --server`): `POST /api/v1/events`.
impl Sink for crate::remote::Client {
    async fn post(&self, gz: Bytes, _items: usize) -> Result<Reply, SinkError> {
        use crate::remote::RemoteError;
        match self.post_events(gz).await {
            Ok(r) => Ok(Reply {
                concurrency: r.ingest_concurrency,
                results: r
                    .results
                    .into_iter()
                    .map(|i| {
                        let leaf = match (&i.received_at, i.leaf_index, i.leaf_pending) {
                            (Some(at), Some(n), _) => Some(LeafReceipt {
                                received_at: at.clone(),
                                leaf_index: Some(n),
                                deadline: None,
                            }),
                            (Some(at), None, true) => Some(LeafReceipt {
                                received_at: at.clone(),
                                leaf_index: None,
                                deadline: i.deadline.clone(),
                            }),
                            _ => None,
                        };
                        ItemResult {
                            index: i.index,
                            status: i.status,
                            code: i.code,
                            error: i.error,
                            leaf,
                        }
                    })
                    .collect(),
                checkpoint: r.checkpoint,
            }),
            Err(RemoteError::Retry { status, after, message, .. }) => {
                Err(SinkError::Retry { status, after, message })
            }
            Err(e @ RemoteError::Unauthorized { .. }) => {
                Err(SinkError::Unauthorized { message: e.to_string() })
            }
            Err(e) => Err(SinkError::Fatal { message: e.to_string() }),
        }
    }
}

/// Why a batch could not be delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UploadError {
    #[error("{0}")]
    Sink(SinkError),
    #[error("the publish deadline passed")]
    Deadline,
    #[error("the server still asks to retry after {attempts} attempts ({last})")]
    GaveUp { attempts: u32, last: String },
}

/// gzip of an NDJSON body (fast level: the client must outrun the server's ingest).
pub fn gzip(body: &[u8]) -> std::io::Result<Bytes> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::fast(),
    );
    enc.write_all(body)?;
    Ok(Bytes::from(enc.finish()?))
}

/// The wait before attempt `attempt` (1-based retry count): the server's `Retry-After` if
/// longer than the backoff, the backoff being 250 ms doubling, capped, with jitter in
/// [50%, 100%].
pub fn backoff(attempt: u32, after: Option<Duration>) -> Duration {
    let base = Duration::from_millis(250).saturating_mul(1u32 << attempt.min(8));
    let base = base.min(BACKOFF_CAP);
    let mut rnd = [0u8; 2];
    let _ = getrandom::fill(&mut rnd);
    let frac = 0.5 + f64::from(u16::from_le_bytes(rnd)) / f64::from(u16::MAX) / 2.0;
    let jittered = base.mul_f64(frac);
    match after {
        Some(a) => a.min(BACKOFF_CAP).max(jittered),
        None => jittered,
    }
}

/// Posts one batch, retrying 429/503; never waits past `deadline`. `retries` counts the
/// answers that asked to retry (the run's report shows them: a busy server is not silent).
pub async fn post_with_retry<S: Sink>(
    sink: &S,
    gz: Bytes,
    items: usize,
    deadline: Option<Instant>,
    retries: &std::cell::Cell<u64>,
) -> Result<Reply, UploadError> {
    let mut attempt = 0u32;
    loop {
        let post = sink.post(gz.clone(), items);
        let answer = match deadline {
            Some(d) => match tokio::time::timeout_at(d.into(), post).await {
                Ok(a) => a,
                Err(_) => return Err(UploadError::Deadline),
            },
            None => post.await,
        };
        match answer {
            Ok(reply) => return Ok(reply),
            Err(SinkError::Retry { status, after, message }) => {
                attempt += 1;
                retries.set(retries.get() + 1);
                if attempt >= MAX_ATTEMPTS {
                    return Err(UploadError::GaveUp {
                        attempts: attempt,
                        last: format!("{status}: {message}"),
                    });
                }
                let wait = backoff(attempt, after);
                if deadline.is_some_and(|d| Instant::now() + wait > d) {
                    return Err(UploadError::Deadline);
                }
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(UploadError::Sink(e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped_jittered_and_honours_retry_after() {
        for a in 1..20 {
            let b = backoff(a, None);
            assert!(b <= BACKOFF_CAP, "{b:?}");
            assert!(b >= Duration::from_millis(125));
        }
        assert!(backoff(1, Some(Duration::from_secs(3))) >= Duration::from_secs(3));
        assert!(backoff(1, Some(Duration::from_secs(3600))) <= BACKOFF_CAP);
    }

    #[test]
    fn gzip_round_trips() {
        use std::io::Read;
        let gz = gzip(b"{\"a\":1}\n").unwrap();
        let mut out = String::new();
        flate2::read::GzDecoder::new(&gz[..]).read_to_string(&mut out).unwrap();
        assert_eq!(out, "{\"a\":1}\n");
    }
}
