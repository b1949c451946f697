//! A review server's log endpoints in memory, for the unit tests of the witness and compare
//! checks: a [`FakeLog`] tree, the stored payloads (which a test may edit or delete, as an
//! owner could), a checkpoint a test may replace, and an "unreachable" switch.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::export::tests::FakeLog;
use super::{Answer, ApiError, LogApi};
use crate::tlog::b64;
use crate::tlog::note::NoteVerifier;

pub(crate) struct FakeServer {
    pub log: RefCell<FakeLog>,
    /// The stored payload of each event (`None`: the row was deleted).
    pub stored: RefCell<Vec<Option<String>>>,
    /// Served instead of the current head, when set.
    pub checkpoint: RefCell<Option<String>>,
    /// The `time` of the served head.
    pub time: Cell<u64>,
    /// Events (by id) the server still reports as pending.
    pub pending: RefCell<Vec<String>>,
    pub down: Cell<bool>,
    pub cosignatures: RefCell<Vec<serde_json::Value>>,
    pub requests: RefCell<Vec<String>>,
}

impl FakeServer {
    pub fn new(n: usize) -> Self {
        let log = FakeLog::new(n);
        let stored = log.events.iter().map(|e| Some(e.4.clone())).collect();
        Self {
            log: RefCell::new(log),
            stored: RefCell::new(stored),
            checkpoint: RefCell::new(None),
            time: Cell::new(1000),
            pending: RefCell::new(Vec::new()),
            down: Cell::new(false),
            cosignatures: RefCell::new(Vec::new()),
            requests: RefCell::new(Vec::new()),
        }
    }

    pub fn key(&self) -> NoteVerifier {
        self.log.borrow().signer.verifier()
    }

    pub fn add(&self, id: &str, payload: &str) {
        self.log.borrow_mut().add(id, payload);
        self.stored.borrow_mut().push(Some(payload.to_string()));
    }

    pub fn head(&self) -> String {
        self.checkpoint.borrow().clone().unwrap_or_else(|| self.log.borrow().note(self.time.get()))
    }

    fn json(v: serde_json::Value) -> Answer {
        Answer { status: 200, reason: None, body: v.to_string().into_bytes() }
    }

    fn status(status: u16, reason: &str) -> Answer {
        Answer {
            status,
            reason: Some(reason.to_string()),
            body: format!("{{\"error\":\"{reason}\"}}").into_bytes(),
        }
    }

    fn answer(&self, path: &str) -> Answer {
        let (route, query) = path.split_once('?').unwrap_or((path, ""));
        let q: HashMap<String, String> = serde_urlencoded::from_str(query).unwrap_or_default();
        let num = |k: &str| q.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let log = self.log.borrow();
        let size = log.tree.size();
        match route {
            "/api/v1/log/checkpoint" => Self::json(serde_json::json!({"checkpoint": self.head()})),
            "/api/v1/log/proof/inclusion" => {
                let (i, m) = (num("index"), num("tree_size"));
                if i >= m || m > size {
                    return Self::status(400, "bad_proof_request");
                }
                Self::json(serde_json::json!({"index": i, "tree_size": m,
                    "hashes": log.inclusion(i, m)}))
            }
            "/api/v1/log/proof/consistency" => {
                let (a, b) = (num("from"), num("to"));
                if a > b || b > size {
                    return Self::status(400, "bad_proof_request");
                }
                Self::json(serde_json::json!({"from": a, "to": b, "hashes": log.consistency(a, b)}))
            }
            "/api/v1/log/leaf" => {
                let id = q.get("id").cloned().unwrap_or_default();
                let stored = self.stored.borrow();
                let Some(i) = log.events.iter().position(|e| e.2 == id) else {
                    return Self::status(404, "not_found");
                };
                if stored[i].is_none() {
                    return Self::status(404, "not_found");
                }
                if self.pending.borrow().contains(&id) {
                    return Self::json(serde_json::json!({"leaf_pending": true,
                        "deadline": "2026-07-24T18:04:00.000000Z"}));
                }
                Self::json(serde_json::json!({"leaf_index": i,
                    "leaf_hash": b64(&log.tree.tiers[0][i]), "received_at": log.events[i].3,
                    "tree_size": size, "checkpoint": self.head()}))
            }
            "/api/v1/events" => {
                let since = q.get("since").and_then(|s| super::parse_micros(s)).unwrap_or(0);
                let until = q.get("until").and_then(|s| super::parse_micros(s)).unwrap_or(i64::MAX);
                let stored = self.stored.borrow();
                let mut lines = Vec::new();
                for (i, (u, s, id, r, _)) in log.events.iter().enumerate() {
                    let at = super::parse_micros(r).unwrap_or(0);
                    let Some(p) = &stored[i] else { continue };
                    if at >= since && at < until {
                        lines.push(format!(
                            "{{\"pk\":{},\"user_id\":\"{u}\",\"source\":\"{s}\",\"id\":\"{id}\",\"received_at\":\"{r}\",\"payload\":{p},\"conflict_of\":null}}",
                            i + 1
                        ));
                    }
                }
                let body = format!("{{\"events\":[{}],\"next_cursor\":null}}", lines.join(","));
                Answer { status: 200, reason: None, body: body.into_bytes() }
            }
            _ => Self::status(404, "not_found"),
        }
    }
}

impl LogApi for FakeServer {
    async fn get(&self, path: &str) -> Result<Answer, ApiError> {
        self.requests.borrow_mut().push(format!("GET {path}"));
        if self.down.get() {
            return Err(ApiError::Transient("connection refused".into()));
        }
        Ok(self.answer(path))
    }

    async fn post_json(&self, path: &str, body: &serde_json::Value) -> Result<Answer, ApiError> {
        self.requests.borrow_mut().push(format!("POST {path}"));
        if self.down.get() {
            return Err(ApiError::Transient("connection refused".into()));
        }
        if path != "/api/v1/log/cosignature" {
            return Ok(Self::status(404, "not_found"));
        }
        self.cosignatures.borrow_mut().push(body.clone());
        let n = self.cosignatures.borrow().len();
        Ok(Self::json(
            serde_json::json!({"tree_size": self.log.borrow().tree.size(), "witnesses": n}),
        ))
    }
}
