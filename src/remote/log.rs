//! The review log's endpoints as the host-side CLI uses them (docs/evidence.md "API"): the key
//! `airlock login --server` pins, and the raw [`LogApi`] that `airlock publish` witnesses and
//! `airlock verify --checkpoint` compares through.

use std::time::Duration;

use http::{HeaderMap, Method, StatusCode};
use serde::Deserialize;

use super::{Client, RemoteError, error_text};
use crate::evidence::{Answer, ApiError, LogApi};
use crate::tlog::note::{ALG_ED25519, NoteVerifier};

/// Retries of a log request answered 429/503.
const LOG_RETRIES: u32 = 5;
/// The longest wait between two.
const LOG_RETRY_CAP: Duration = Duration::from_secs(5);

/// A 429/503: the `Retry-After` delay and the message.
struct RetryLater(Option<Duration>, String);

/// `GET /api/v1/log/key`.
#[derive(Debug, Deserialize)]
struct KeyBody {
    key: String,
}

fn reason(headers: &HeaderMap) -> Option<String> {
    headers
        .get("x-airlock-reason")
        .and_then(|v| v.to_str().ok())
        .filter(|r| r.len() <= 64 && r.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .map(str::to_owned)
}

impl Client {
    /// The server's log key (type 0x01), or `None` when it keeps no signed log (404: reason
    /// `no_log_key`, or a server that predates the log).
    pub async fn log_key(&self) -> Result<Option<NoteVerifier>, RemoteError> {
        // Through the log exchange: a login right after others' requests may meet a 429.
        let a =
            self.log_exchange(Method::GET, "/api/v1/log/key", None).await.map_err(|e| match e {
                ApiError::Unauthorized(message) => {
                    RemoteError::Unauthorized { server: self.server().to_owned(), message }
                }
                ApiError::Transient(message) => {
                    RemoteError::Transport { server: self.server().to_owned(), message }
                }
            })?;
        if a.status == 404 {
            return Ok(None);
        }
        if a.status != 200 {
            let status = StatusCode::from_u16(a.status).unwrap_or(StatusCode::BAD_GATEWAY);
            return Err(RemoteError::Status {
                server: self.server().to_owned(),
                status: a.status,
                message: error_text(status, &a.body),
                reason: a.reason,
            });
        }
        let k: KeyBody = serde_json::from_slice(&a.body).map_err(|e| self.protocol(e))?;
        let v = NoteVerifier::parse(&k.key)
            .map_err(|e| self.protocol(format!("its log key {:?}: {e}", k.key)))?;
        if v.alg != ALG_ED25519 {
            return Err(self.protocol(format!(
                "its log key {:?} is not an Ed25519 note key (type 0x01)",
                k.key
            )));
        }
        Ok(Some(v))
    }

    /// One log request; a 429/503 (a read slot, a log not signed yet) is retried a few
    /// times, honouring a short `Retry-After`.
    async fn log_exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, ApiError> {
        let mut attempt = 0u32;
        loop {
            match self.log_exchange_once(method.clone(), path, body).await {
                Err(RetryLater(after, _)) if attempt < LOG_RETRIES => {
                    attempt += 1;
                    let wait = after.unwrap_or(Duration::from_millis(500)).min(LOG_RETRY_CAP);
                    tokio::time::sleep(wait).await;
                }
                Err(RetryLater(_, message)) => return Err(ApiError::Transient(message)),
                Ok(r) => return r,
            }
        }
    }

    async fn log_exchange_once(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Result<Answer, ApiError>, RetryLater> {
        Ok(match self.exchange_json(method, path, body).await {
            Ok((status, headers, bytes)) => {
                let code = status.as_u16();
                if code == 401 {
                    return Ok(Err(ApiError::Unauthorized(
                        self.status_error(status, &headers, &bytes).to_string(),
                    )));
                }
                let message = format!(
                    "{} answered HTTP {code}: {}",
                    self.server(),
                    error_text(status, &bytes)
                );
                if code == 429 || code == 503 {
                    let after = headers
                        .get(http::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| super::parse_retry_after(v, std::time::SystemTime::now()));
                    return Err(RetryLater(after, message));
                }
                if code >= 500 {
                    return Ok(Err(ApiError::Transient(message)));
                }
                Ok(Answer { status: code, reason: reason(&headers), body: bytes.to_vec() })
            }
            Err(RemoteError::Retry { after, message, .. }) => {
                return Err(RetryLater(after, message));
            }
            Err(e) => Err(ApiError::Transient(e.to_string())),
        })
    }
}

impl LogApi for Client {
    async fn get(&self, path: &str) -> Result<Answer, ApiError> {
        self.log_exchange(Method::GET, path, None).await
    }

    async fn post_json(&self, path: &str, body: &serde_json::Value) -> Result<Answer, ApiError> {
        self.log_exchange(Method::POST, path, Some(body)).await
    }
}
