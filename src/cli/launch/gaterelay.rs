//! Relaying a session's gates to the review server (docs/gates.md "With a review server").
//! When the user is logged in to a review server, the host-side supervisor of a gated session
//! — the only process of the session that holds the token — registers the session with
//! airlockd under a relay key ([`RelayKey`]); airlockd then takes decisions on the session's
//! held attempts only from this relay. For each held attempt the relay opens a gate on the
//! server (`POST /api/v1/gates` with the daemon's canonical action), waits for a reviewer's
//! decision (`GET /api/v1/gates/{id}?wait=N`), and hands the decision to airlockd with the
//! key. airlockd never sees the token; the agent never sees either.
//!
//! Fail closed: a gate the server cannot open (unreachable, refused, over its cap) or cannot
//! be asked about for [`UNREACHABLE_FOR`] is refused `gate_unavailable` with the reason. A
//! held attempt that ends on the host's side first (the agent hung up, the session or the
//! daemon stopped) is withdrawn on the server (`abandon`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use zeroize::Zeroizing;

use crate::client::Endpoint;
use crate::protocol::{GateDecision, GateInfo, GateRelaySpec, RelayedDecision};
use crate::remote::gates::ServerGate;
use crate::remote::{self, RemoteError};

/// How long the server may stay unreachable while a gate waits before the attempt is refused
/// `gate_unavailable` (rather than left to expire without saying why).
pub const UNREACHABLE_FOR: Duration = Duration::from_secs(15);
/// Each long-poll of the server asks for this much (the server's bound is 60 s).
const WAIT_SECS: u64 = 50;
/// Pause between tries while the server does not answer.
const RETRY: Duration = Duration::from_secs(2);
/// How long the end of a session waits for its withdrawals to reach the server.
const DRAIN: Duration = Duration::from_secs(3);

/// A session's relay key: random, kept by the supervisor only; airlockd holds its SHA-256.
pub struct RelayKey(Zeroizing<String>);

impl std::fmt::Debug for RelayKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RelayKey(..)")
    }
}

impl RelayKey {
    pub fn new() -> Result<Self, String> {
        let mut b = Zeroizing::new([0u8; 32]);
        getrandom::fill(b.as_mut_slice())
            .map_err(|e| format!("no randomness for the gate relay key: {e}"))?;
        Ok(Self(Zeroizing::new(hex::encode(b.as_slice()))))
    }

    /// What the session is registered with.
    pub fn spec(&self, server: &str) -> GateRelaySpec {
        GateRelaySpec {
            server: server.to_owned(),
            key_sha256: hex::encode(Sha256::digest(self.0.as_bytes())),
        }
    }
}

/// Everything one session's relay needs.
#[derive(Debug)]
pub struct RelayConfig {
    pub endpoint: Endpoint,
    pub session: String,
    pub client: remote::Client,
    pub key: RelayKey,
    /// The managed layer's `[gate] self_approve` (reported to the server; it decides).
    pub self_approve: bool,
    pub notifier: Option<PathBuf>,
}

/// A running relay: [`RelayHandle::finish`] stops it once the session is over.
#[derive(Debug)]
pub struct RelayHandle {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RelayHandle {
    /// Stops the relay and waits (at most [`DRAIN`] and a tick) while it withdraws the gates
    /// still pending on the server, so they do not wait out their deadline there.
    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the relay on a thread of its own.
pub fn spawn(config: RelayConfig) -> RelayHandle {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let spawned = std::thread::Builder::new().name("gate-relay".into()).spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!("cannot start the gate relay: {e}; this session's gates expire");
                return;
            }
        };
        rt.block_on(run(Arc::new(config), flag));
    });
    let thread = match spawned {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::error!("cannot start the gate relay: {e}; this session's gates expire");
            None
        }
    };
    RelayHandle { stop, thread }
}

/// What the relay of one held attempt is told from the host's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Local {
    Held,
    /// The attempt's gate left airlockd's book (decided, expired, abandoned, or the daemon
    /// went away).
    Gone,
}

async fn run(config: Arc<RelayConfig>, stop: Arc<AtomicBool>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<GateInfo>>();
    // airlockd's client is synchronous: its long-poll runs on a thread of its own, feeding
    // snapshots of this session's pending gates.
    {
        let (endpoint, session, stop) =
            (config.endpoint.clone(), config.session.clone(), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("gate-relay-watch".into())
            .spawn(move || watch_book(&endpoint, &session, &stop, &tx))
            .map_err(|e| tracing::error!("cannot watch this session's gates: {e}"))
            .ok();
    }
    let mut held: HashMap<String, watch::Sender<Local>> = HashMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            snapshot = rx.recv() => {
                let Some(snapshot) = snapshot else { break };
                for (id, tx) in &held {
                    if !snapshot.iter().any(|g| &g.id == id) {
                        let _ = tx.send(Local::Gone);
                    }
                }
                held.retain(|id, _| snapshot.iter().any(|g| &g.id == id));
                for g in snapshot {
                    if held.contains_key(&g.id) {
                        continue;
                    }
                    let (tx, rx) = watch::channel(Local::Held);
                    held.insert(g.id.clone(), tx);
                    tasks.spawn(relay_one(Arc::clone(&config), g, rx));
                }
            }
            _ = tick.tick() => {
                if stop.load(Ordering::Acquire) {
                    break;
                }
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    // The session is over: every gate still pending on the server is withdrawn.
    for tx in held.values() {
        let _ = tx.send(Local::Gone);
    }
    let _ = tokio::time::timeout(DRAIN, async { while tasks.join_next().await.is_some() {} }).await;
}

/// Sends each change of this session's pending gates (short polls, so a stop is seen soon).
fn watch_book(
    endpoint: &Endpoint,
    session: &str,
    stop: &AtomicBool,
    tx: &mpsc::UnboundedSender<Vec<GateInfo>>,
) {
    super::gatenotice::watch_session(endpoint, session, stop, 2_000, |mine| tx.send(mine).is_ok());
}

/// Relays one held attempt: open the server's gate, wait for its decision, hand it to
/// airlockd; withdraw it on the server when the attempt ends on the host's side first.
async fn relay_one(config: Arc<RelayConfig>, g: GateInfo, mut local: watch::Receiver<Local>) {
    let server = config.client.server().to_owned();
    let left = crate::publish::envelope::parse_ts(&g.deadline)
        .map(|at| (at - time::OffsetDateTime::now_utc()).whole_milliseconds())
        .unwrap_or(0);
    if left <= 0 {
        return;
    }
    // Whole seconds, rounded up, so the server's deadline is never before airlockd's.
    let timeout = (left as u64).div_ceil(1000).clamp(1, crate::gate::MAX_TIMEOUT.as_secs());
    let body = json!({
        "kind": g.kind, "action": g.action, "digest": g.digest, "severity": g.severity,
        "timeout": timeout, "repo": g.repo, "rule": g.rule, "layer": g.layer,
        "policy": g.policy, "local_id": g.id, "self_approve": config.self_approve,
    });
    let opened = tokio::select! {
        r = config.client.open_gate(&body) => r,
        _ = gone(&mut local) => return,
    };
    let sg = match opened {
        Ok(sg) => sg,
        Err(e) => {
            let why = format!(
                "the review server {server} could not take the gate ({}); nobody could decide, \
                 so the attempt is refused",
                remote_reason(&e)
            );
            tracing::warn!("gate {}: {why}", g.id);
            decide_locally(&config, &g, None, None, Some(why)).await;
            return;
        }
    };
    announce(&config, &g, &sg, &server);
    let mut failing_since: Option<Instant> = None;
    let decided = loop {
        let asked = tokio::select! {
            r = config.client.gate(&sg.id, WAIT_SECS) => r,
            _ = gone(&mut local) => {
                withdraw(&config, &sg.id).await;
                return;
            }
        };
        match asked {
            Ok((now, _)) if now.is_pending() => failing_since = None,
            Ok((now, _)) => break now,
            Err(e) => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= UNREACHABLE_FOR {
                    let why = format!(
                        "the review server {server} has not answered about gate {} for {} s \
                         ({}); the attempt is refused",
                        sg.id,
                        since.elapsed().as_secs(),
                        remote_reason(&e)
                    );
                    tracing::warn!("gate {}: {why}", g.id);
                    decide_locally(&config, &g, Some(&sg.id), None, Some(why)).await;
                    // Withdrawn too, in case the server comes back before its deadline.
                    withdraw(&config, &sg.id).await;
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(RETRY) => {}
                    _ = gone(&mut local) => {
                        withdraw(&config, &sg.id).await;
                        return;
                    }
                }
            }
        }
    };
    match decided.state.as_str() {
        "approved" | "denied" => {
            decide_locally(&config, &g, Some(&sg.id), Some(&decided), None).await;
        }
        // airlockd's own deadline is the same instant (rounded up here): it expires there too.
        "expired" => {}
        other => {
            let by = decided
                .decision
                .as_ref()
                .and_then(|d| d.by_email.clone())
                .unwrap_or_else(|| "someone".into());
            let why = format!("gate {} was {other} on the review server by {by}", sg.id);
            decide_locally(&config, &g, Some(&sg.id), None, Some(why)).await;
        }
    }
}

/// Resolves once the attempt's gate is gone from airlockd's book (or the relay is stopping).
async fn gone(local: &mut watch::Receiver<Local>) {
    let _ = local.wait_for(|l| *l == Local::Gone).await;
}

/// Withdraws server gate `id` (`abandon`); a gate decided or expired meanwhile stays as it is.
async fn withdraw(config: &RelayConfig, id: &str) {
    let body = json!({"action": "abandon", "note": "the held attempt ended on the host"});
    match config.client.decide_gate(id, &body).await {
        Ok(_) => {}
        Err(RemoteError::Status { status: 409, .. }) => {}
        Err(e) => tracing::debug!("withdrawing gate {id} on the review server: {e}"),
    }
}

/// Hands a decision to airlockd with the relay key: the server's (`decided`), or, with
/// `unavailable`, the refusal of an attempt nobody could decide.
async fn decide_locally(
    config: &RelayConfig,
    g: &GateInfo,
    server_gate: Option<&str>,
    decided: Option<&ServerGate>,
    unavailable: Option<String>,
) {
    let d = decided.and_then(|s| s.decision.clone());
    let decision = GateDecision {
        id: g.id.clone(),
        digest: g.digest.clone(),
        approve: decided.is_some_and(|s| s.state == "approved"),
        note: unavailable
            .clone()
            .or_else(|| d.as_ref().and_then(|d| d.note.clone()))
            .unwrap_or_default(),
        by: d
            .as_ref()
            .and_then(|d| d.by_email.clone())
            .unwrap_or_else(|| config.client.server().to_owned()),
        relay: Some(RelayedDecision {
            key: config.key.0.to_string(),
            server_gate: server_gate.unwrap_or_default().to_owned(),
            self_decided: d.as_ref().is_some_and(|d| d.self_decided),
            unavailable: unavailable.is_some(),
        }),
    };
    let endpoint = config.endpoint.clone();
    let id = g.id.clone();
    let sent = tokio::task::spawn_blocking(move || {
        endpoint.connect().and_then(|mut c| c.gate_decide(decision))
    })
    .await;
    match sent {
        Ok(Ok(_)) => {}
        // The attempt ended meanwhile: its gate is gone, and the decision reaches no one.
        Ok(Err(e)) => tracing::debug!("gate {id}: handing the decision to airlockd: {e}"),
        Err(e) => tracing::warn!("gate {id}: the decision task failed: {e}"),
    }
}

/// Tells the person at the host that their agent waits for a reviewer.
fn announce(config: &RelayConfig, g: &GateInfo, sg: &ServerGate, server: &str) {
    let text = format!(
        "gate {}: the agent's {} waits for a reviewer's decision on {server} ({}, rule {:?}, \
         until {}); a reviewer decides it on {server}/gates or with `airlock gate approve {}`",
        sg.id,
        sg.target(),
        g.severity,
        g.rule,
        g.deadline,
        sg.id
    );
    let body = format!("{} waits for a reviewer.\n{server}/gates", sg.target());
    super::gatenotice::announce(&text, &body, config.notifier.as_deref());
}

/// A short reason for a failed server call: the server's machine reason when it gave one.
fn remote_reason(e: &RemoteError) -> String {
    match e {
        RemoteError::Status { status, reason: Some(r), message, .. } => {
            format!("HTTP {status} {r}: {message}")
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_relay_key_is_random_and_only_its_hash_is_registered() {
        let a = RelayKey::new().unwrap();
        let b = RelayKey::new().unwrap();
        assert_ne!(*a.0, *b.0);
        let spec = a.spec("https://review.example.test");
        assert_eq!(spec.key_sha256, hex::encode(Sha256::digest(a.0.as_bytes())));
        assert!(!format!("{spec:?}{a:?}").contains(a.0.as_str()), "never in Debug");
    }
}
