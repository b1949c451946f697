//! The review server's gate endpoints as the host-side CLI uses them (docs/api.md "Gates"):
//! the supervisor of a session relays its held attempts (`POST /api/v1/gates`, then
//! `GET /api/v1/gates/{id}?wait=N` until decided), and `airlock gate` lists and decides them
//! for a reviewer. [`ServerGate`] is the API's gate object.

use http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Client, RemoteError};

/// A gate as the server answers it (the fields `airlock` uses; `--json` prints the server's
/// whole object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerGate {
    pub id: String,
    pub kind: String,
    /// `pending`, `approved`, `denied`, `expired` or `abandoned`.
    pub state: String,
    #[serde(default)]
    pub user_id: String,
    #[serde(default)]
    pub user_email: String,
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub repo: Option<String>,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub request: Option<String>,
    pub action: String,
    pub digest: String,
    pub severity: String,
    #[serde(default)]
    pub rule: Option<String>,
    #[serde(default)]
    pub layer: Option<String>,
    #[serde(default)]
    pub policy: Option<String>,
    #[serde(default)]
    pub local_id: Option<String>,
    #[serde(default)]
    pub requested_at: String,
    #[serde(default)]
    pub deadline: String,
    #[serde(default)]
    pub decision: Option<ServerDecision>,
}

/// A gate's decision as the server answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerDecision {
    pub state: String,
    #[serde(default)]
    pub by: Option<String>,
    #[serde(default)]
    pub by_email: Option<String>,
    #[serde(default)]
    pub note: Option<String>,
    #[serde(rename = "self", default)]
    pub self_decided: bool,
    #[serde(default)]
    pub step_up: bool,
    #[serde(default)]
    pub at: String,
}

impl ServerGate {
    pub fn is_pending(&self) -> bool {
        self.state == "pending"
    }

    /// One line naming what is gated (`CONNECT host:443`, `Bash: git push`, an action).
    pub fn target(&self) -> String {
        crate::gate::target_text(
            &self.kind,
            self.method.as_deref(),
            self.host.as_deref(),
            self.port,
            self.request.as_deref(),
        )
    }
}

#[derive(Deserialize)]
struct GateList {
    gates: Vec<Value>,
}

impl Client {
    /// `POST /api/v1/gates`: opens a gate; `body` as docs/api.md gives it.
    pub async fn open_gate(&self, body: &Value) -> Result<ServerGate, RemoteError> {
        let (status, headers, bytes) =
            self.exchange_json(Method::POST, "/api/v1/gates", Some(body)).await?;
        if status != StatusCode::CREATED {
            return Err(self.status_error(status, &headers, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| self.protocol(e))
    }

    /// `GET /api/v1/gates/{id}?wait=N` (`wait` in whole seconds, at most 60): the gate, once
    /// it is no longer pending or the wait is over.
    pub async fn gate(&self, id: &str, wait_secs: u64) -> Result<(ServerGate, Value), RemoteError> {
        let path = format!("/api/v1/gates/{}?wait={}", path_segment(id), wait_secs.min(60));
        let (status, headers, bytes) = self.exchange_json(Method::GET, &path, None).await?;
        if status != StatusCode::OK {
            return Err(self.status_error(status, &headers, &bytes));
        }
        let raw: Value = serde_json::from_slice(&bytes).map_err(|e| self.protocol(e))?;
        let gate = serde_json::from_value(raw.clone()).map_err(|e| self.protocol(e))?;
        Ok((gate, raw))
    }

    /// `GET /api/v1/gates?state=pending`: the pending gates the caller may see, oldest first
    /// (each also as the server's raw object, for `--json`).
    pub async fn pending_gates(&self) -> Result<Vec<(ServerGate, Value)>, RemoteError> {
        let (status, headers, bytes) =
            self.exchange_json(Method::GET, "/api/v1/gates?state=pending&limit=1000", None).await?;
        if status != StatusCode::OK {
            return Err(self.status_error(status, &headers, &bytes));
        }
        let list: GateList = serde_json::from_slice(&bytes).map_err(|e| self.protocol(e))?;
        list.gates
            .into_iter()
            .map(|raw| {
                let g = serde_json::from_value(raw.clone()).map_err(|e| self.protocol(e))?;
                Ok((g, raw))
            })
            .collect()
    }

    /// `POST /api/v1/gates/{id}` with `body` (`action`, `note`, `digest`, `password`,
    /// `override`): the decided gate.
    pub async fn decide_gate(&self, id: &str, body: &Value) -> Result<ServerGate, RemoteError> {
        let path = format!("/api/v1/gates/{}", path_segment(id));
        let (status, headers, bytes) = self.exchange_json(Method::POST, &path, Some(body)).await?;
        if status != StatusCode::OK {
            return Err(self.status_error(status, &headers, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| self.protocol(e))
    }
}

/// A gate id as a path segment: ids are `[A-Za-z0-9_-]`; anything else is dropped so a
/// mistyped id cannot change the path (the server then answers 404).
fn path_segment(id: &str) -> String {
    id.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-').collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_gate_object_reads_and_names_its_target() {
        let raw = serde_json::json!({
            "id": "gt_1", "kind": "egress", "state": "approved", "user_id": "u", "user_email": "dev@x",
            "session": "s", "repo": "r", "method": "CONNECT", "host": "2001:db8::1", "port": 443,
            "request": null, "action": "{}", "digest": "sha256:0", "severity": "high",
            "requested_at": "t", "deadline": "t", "context": {"a": 1},
            "decision": {"state": "approved", "by": "r1", "by_email": "rev@x", "note": "ok",
                         "self": false, "step_up": true, "at": "t"}
        });
        let g: ServerGate = serde_json::from_value(raw).unwrap();
        assert_eq!(g.target(), "CONNECT [2001:db8::1]:443");
        assert!(!g.is_pending());
        let d = g.decision.unwrap();
        assert!(d.step_up && !d.self_decided);
        assert_eq!(path_segment("gt_ab/../x?y"), "gt_abxy");
    }
}
