//! The gate endpoints of the review API (docs/api.md "Gates"): `POST /api/v1/gates` opens a
//! gate, `GET /api/v1/gates` lists them, `GET /api/v1/gates/{id}?wait=N` reads one (waiting
//! up to N seconds for it to be decided) and `POST /api/v1/gates/{id}` decides it. The
//! decision path ([`decide`]) is shared with the console's `/gates` page: the self-approval
//! rule ([`gates::may_decide`]), the password step-up for `high` gates, then the store's
//! atomic "still pending, same digest" append. [`expiry_loop`] writes the `expired` step of
//! gates nobody decided.
//!
//! Gate listings are a queue addressed to reviewers, not a person's history: reading them is
//! not recorded as `airlock.review.read` (the console's `/gates` page, which also shows the
//! requester's recent timeline, is).

// Handlers return the error *response* itself as `Err` (as `server.rs`).
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderValue, Request, StatusCode, header};
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::sync::watch;
use zeroize::Zeroizing;

use super::gates::{
    self, Decided, DecisionRequest, Gate, GateQuery, GateState, SelfApprove, Verdict,
};
use super::limits::{SlotRefusal, Slots};
use super::server::{AppState, Resp};
use super::store::random_id;
use super::store::{GateCaps, Opened, Store, StoreError};
use super::{User, metrics, now_micros};

/// The server's gate state: the self-approval setting, a change signal for long-polls, and
/// the long-poll slots.
#[derive(Debug)]
pub struct GateHub {
    pub self_approve: SelfApprove,
    /// Bumped whenever this instance decides or expires a gate; a waiting reader re-reads
    /// then (and every second anyway, for decisions another instance made).
    changed: watch::Sender<u64>,
    waits: Slots,
}

impl GateHub {
    pub fn new(self_approve: SelfApprove) -> Self {
        Self {
            self_approve,
            changed: watch::channel(0).0,
            waits: Slots::new(gates::MAX_WAITS, gates::MAX_WAITS_PER_USER),
        }
    }

    /// Wakes the readers waiting for a decision.
    pub fn notify(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }
}

impl Default for GateHub {
    fn default() -> Self {
        Self::new(SelfApprove::default())
    }
}

/// An error answer with a machine-readable `reason` (also in `X-Airlock-Reason`).
pub(crate) fn refusal(
    status: StatusCode,
    reason: &'static str,
    message: impl Into<String>,
) -> Resp {
    let mut r = super::server::json_resp(
        status,
        &json!({"error": message.into(), "code": status.as_u16(), "reason": reason}),
    );
    r.headers_mut().insert("x-airlock-reason", HeaderValue::from_static(reason));
    r
}

fn bad_request(message: impl Into<String>) -> Resp {
    super::server::error(StatusCode::BAD_REQUEST, message)
}

fn no_gate(id: &str) -> Resp {
    refusal(StatusCode::NOT_FOUND, "no_gate", format!("no gate {id}"))
}

/// Reads a body of at most `cap` bytes within the server's body timeout.
async fn body(
    st: &AppState<impl Store>,
    req: Request<Incoming>,
    cap: usize,
) -> Result<Vec<u8>, Resp> {
    let read = tokio::time::timeout(st.limits.body_timeout, super::server::read_body(req, cap));
    match read.await {
        Err(_) => Err(super::server::error(
            StatusCode::REQUEST_TIMEOUT,
            "the body did not arrive in time",
        )),
        Ok(r) => r,
    }
}

/// `POST /api/v1/gates`: opens a gate for the caller (201 with the gate).
pub async fn post_gates<S: Store>(st: &AppState<S>, user: &User, req: Request<Incoming>) -> Resp {
    let raw = match body(st, req, gates::MAX_OPEN_BODY).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let id = format!("{}{}", gates::ID_PREFIX, random_id());
    let gate = match gates::parse_open(&raw, user, st.gates.self_approve, id) {
        Ok(g) => g,
        Err(e) => return bad_request(e.0),
    };
    let caps = GateCaps {
        per_session: gates::MAX_PENDING_PER_SESSION,
        per_user: gates::MAX_PENDING_PER_USER,
    };
    match st.store.open_gate(&gate, caps).await {
        Ok(Opened::Gate(g)) => {
            metrics::global().gate_step("requested");
            super::server::json_resp(StatusCode::CREATED, &g.to_json(now_micros()))
        }
        Ok(Opened::SessionLimit(n)) => gate_limit(format!(
            "session {} already has {n} gates waiting for a decision (at most {}); wait for \
             them to be decided or to expire",
            gate.session.as_deref().unwrap_or(""),
            gates::MAX_PENDING_PER_SESSION
        )),
        Ok(Opened::UserLimit(n)) => gate_limit(format!(
            "you already have {n} gates waiting for a decision (at most {}); wait for them to \
             be decided or to expire",
            gates::MAX_PENDING_PER_USER
        )),
        Err(e) => super::server::store_error(e),
    }
}

fn gate_limit(message: String) -> Resp {
    metrics::global().rate_limited("gate_pending");
    let mut r = refusal(StatusCode::TOO_MANY_REQUESTS, "gate_limit", message);
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    r
}

/// `GET /api/v1/gates[?state=&user=&session=&limit=&cursor=]`: pending gates oldest first,
/// every other listing newest first; members see their own.
pub async fn get_gates<S: Store>(st: &AppState<S>, user: &User, req: &Request<Incoming>) -> Resp {
    let params = match super::server::query_params(req.uri().query()) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let mut q = GateQuery { limit: 100, ..GateQuery::default() };
    let mut wanted = None;
    let mut cursor = None;
    for (k, v) in params {
        match k.as_str() {
            "state" if v == "all" => q.state = None,
            "state" => match GateState::parse(&v) {
                Some(s) => q.state = Some(s),
                None => {
                    return bad_request(format!(
                        "`state` must be all or one of {}",
                        GateState::NAMES.join(", ")
                    ));
                }
            },
            "user" => wanted = Some(v),
            "session" if v.len() <= gates::MAX_FIELD => q.session = Some(v),
            "session" => return bad_request("`session` is too long"),
            "limit" => match super::server::parse_limit(&v) {
                Ok(n) => q.limit = n,
                Err(r) => return r,
            },
            "cursor" => match v.parse::<i64>() {
                Ok(n) => cursor = Some(n),
                Err(_) => return bad_request("`cursor` is not a cursor returned by this API"),
            },
            other => return bad_request(format!("unknown query parameter {other:?}")),
        }
    }
    q.ascending = q.state == Some(GateState::Pending);
    q.after = cursor;
    q.user_id = match super::server::scoped_user(st, user, wanted, "gates").await {
        Ok(u) => u,
        Err(r) => return r,
    };
    let list = match st.store.list_gates(&q).await {
        Ok(l) => l,
        Err(e) => return super::server::store_error(e),
    };
    let now = now_micros();
    let next = (list.len() == q.limit as usize).then(|| list.last().map(|g| g.n.to_string()));
    let gates: Vec<Value> = list.iter().map(|g| g.to_json(now)).collect();
    super::server::json_resp(
        StatusCode::OK,
        &json!({"gates": gates, "next_cursor": next.flatten()}),
    )
}

/// `GET /api/v1/gates/{id}[?wait=N]`: one gate; with `wait` (whole seconds, at most
/// [`gates::MAX_WAIT_SECS`]) a pending gate is answered once it is decided or the wait is
/// over. Waits take a long-poll slot of their own (429 past [`gates::MAX_WAITS`] or
/// [`gates::MAX_WAITS_PER_USER`]).
pub async fn get_gate<S: Store>(
    st: &AppState<S>,
    user: &User,
    id: &str,
    req: &Request<Incoming>,
) -> Resp {
    let params = match super::server::query_params(req.uri().query()) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let mut wait = 0u64;
    for (k, v) in params {
        match k.as_str() {
            "wait" => match v.parse::<u64>() {
                Ok(n) if n <= gates::MAX_WAIT_SECS => wait = n,
                _ => {
                    return bad_request(format!(
                        "`wait` must be whole seconds from 0 to {}",
                        gates::MAX_WAIT_SECS
                    ));
                }
            },
            other => return bad_request(format!("unknown query parameter {other:?}")),
        }
    }
    let mut g = match st.store.get_gate(id).await {
        Ok(Some(g)) if gates::visible(user, &g) => g,
        Ok(_) => return no_gate(id),
        Err(e) => return super::server::store_error(e),
    };
    if wait > 0 && g.state(now_micros()) == GateState::Pending {
        let _slot = match st.gates.waits.try_acquire(&user.id) {
            Ok(s) => s,
            Err(which) => {
                let (limit, msg) = match which {
                    SlotRefusal::PerUser => (
                        "gate_wait_per_user",
                        "you already have the most gate waits in progress; retry after the delay",
                    ),
                    SlotRefusal::Global => (
                        "gate_wait_global",
                        "too many gate waits in progress; retry after the delay",
                    ),
                };
                return super::server::too_many(limit, Duration::from_secs(1), msg);
            }
        };
        let until = Instant::now() + Duration::from_secs(wait);
        let mut changed = st.gates.changed.subscribe();
        loop {
            // The deadline is a point in time of its own: wake for it too.
            let to_deadline = Duration::from_micros((g.deadline - now_micros()).max(0) as u64);
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let nap = left.min(Duration::from_secs(1)).min(to_deadline + Duration::from_millis(5));
            let _ = tokio::time::timeout(nap, changed.changed()).await;
            g = match st.store.get_gate(id).await {
                Ok(Some(g)) => g,
                Ok(None) => return no_gate(id),
                Err(e) => return super::server::store_error(e),
            };
            if g.state(now_micros()) != GateState::Pending {
                break;
            }
        }
    }
    super::server::json_resp(StatusCode::OK, &g.to_json(now_micros()))
}

/// What a decider sends (API body or console form).
#[derive(Debug)]
pub struct DecideInput<'a> {
    pub verdict: Verdict,
    pub note: Option<String>,
    /// Decide only if the gate's digest is this.
    pub digest: Option<String>,
    /// Re-entered for a `high` gate (step-up).
    pub password: Option<Zeroizing<String>>,
    pub override_requested: bool,
    /// The credential of the request (token secret or console session id).
    pub secret: &'a str,
}

/// Why a decision was not recorded.
#[derive(Debug)]
pub enum DecideError {
    NoGate,
    /// It is no longer pending: its current state.
    NotPending(Box<Gate>),
    /// The digest sent is not the gate's.
    Digest(Box<Gate>),
    Refused(gates::Refusal),
    /// A `high` gate and no password was sent.
    StepUpRequired,
    /// The password was wrong (or the user has none).
    StepUpFailed {
        has_password: bool,
    },
    /// Too many wrong passwords for this account (shared with console sign-in).
    StepUpLimited(Duration),
    Store(StoreError),
}

impl DecideError {
    /// The API's answer.
    pub fn api(self, id: &str) -> Resp {
        match self {
            DecideError::NoGate => no_gate(id),
            DecideError::NotPending(g) => {
                let now = now_micros();
                let mut r = super::server::json_resp(
                    StatusCode::CONFLICT,
                    &json!({"error": format!("gate {id} is {} already: nothing was decided",
                                g.state(now).as_str()),
                            "code": 409, "reason": "not_pending", "gate": g.to_json(now)}),
                );
                r.headers_mut().insert("x-airlock-reason", HeaderValue::from_static("not_pending"));
                r
            }
            DecideError::Digest(g) => refusal(
                StatusCode::CONFLICT,
                "digest_mismatch",
                format!(
                    "gate {id} holds action {}, not the one you named: nothing was decided; read \
                     it again (GET /api/v1/gates/{id}) and decide what it holds",
                    g.gate.digest
                ),
            ),
            DecideError::Refused(r) => refusal(StatusCode::FORBIDDEN, "refused", r.to_string()),
            DecideError::StepUpRequired => refusal(
                StatusCode::FORBIDDEN,
                "step_up_required",
                "this gate is high severity: a decision needs your password again; send it as \
                 `password` (airlock gate approve ID --password-stdin), or decide in the console",
            ),
            DecideError::StepUpFailed { has_password } => refusal(
                StatusCode::FORBIDDEN,
                "step_up_failed",
                if has_password {
                    "the password is wrong: nothing was decided".to_owned()
                } else {
                    "you have no console password, so you cannot decide high-severity gates; \
                     ask an admin for an invite (`airlockd admin user invite`)"
                        .to_owned()
                },
            ),
            DecideError::StepUpLimited(wait) => super::server::too_many(
                "login_per_account",
                wait,
                "too many wrong passwords for this account; retry after the delay",
            ),
            DecideError::Store(e) => super::server::store_error(e),
        }
    }
}

/// Decides gate `id` for `user`: the self-approval rule, step-up for `high` gates, then the
/// store's atomic append (still pending, same digest). Wakes the waiting readers.
pub async fn decide<S: Store>(
    st: &AppState<S>,
    user: &User,
    id: &str,
    input: DecideInput<'_>,
) -> Result<Gate, DecideError> {
    let g = match st.store.get_gate(id).await {
        Ok(Some(g)) if gates::visible(user, &g) => g,
        Ok(_) => return Err(DecideError::NoGate),
        Err(e) => return Err(DecideError::Store(e)),
    };
    let now = now_micros();
    if g.state(now) != GateState::Pending {
        return Err(DecideError::NotPending(Box::new(g)));
    }
    if input.digest.as_ref().is_some_and(|d| *d != g.gate.digest) {
        return Err(DecideError::Digest(Box::new(g)));
    }
    // Counted only when it matters: the requester approving their own gate.
    let own_approval = g.gate.user_id == user.id && input.verdict == Verdict::Approve;
    let reviewers = if own_approval && !input.override_requested && !g.gate.self_approve {
        match st.store.list_users().await {
            Ok(users) => users.iter().filter(|u| u.role.can_review()).count(),
            Err(e) => return Err(DecideError::Store(e)),
        }
    } else {
        0
    };
    let self_decided = gates::may_decide(gates::DecideRequest {
        actor: user,
        owner: &g.gate.user_id,
        verdict: input.verdict,
        override_requested: input.override_requested,
        reviewers,
        self_approve: g.gate.self_approve,
    })
    .map_err(DecideError::Refused)?;
    let step_up = gates::needs_step_up(g.gate.severity, input.verdict);
    if step_up {
        let Some(pw) = input.password.as_ref() else {
            return Err(DecideError::StepUpRequired);
        };
        verify_step_up(st, user, pw).await?;
    }
    let note = input.note.as_deref().map(crate::gate::clean_note).filter(|n| !n.is_empty());
    let request = DecisionRequest {
        gate_id: id,
        verdict: input.verdict,
        note: note.as_deref(),
        actor: user,
        self_decided,
        override_requested: input.override_requested,
        step_up,
        digest: Some(&g.gate.digest),
        secret: input.secret,
    };
    match st.store.decide_gate(&request).await {
        Ok(Decided::Done(g)) => {
            metrics::global().gate_step(input.verdict.state().as_str());
            st.gates.notify();
            Ok(*g)
        }
        Ok(Decided::NoGate) => Err(DecideError::NoGate),
        Ok(Decided::NotPending(g)) => Err(DecideError::NotPending(g)),
        Ok(Decided::Digest(g)) => Err(DecideError::Digest(g)),
        Err(StoreError::Forbidden(m)) if m.starts_with("step_up_required") => {
            Err(DecideError::StepUpRequired)
        }
        Err(e) => Err(DecideError::Store(e)),
    }
}

/// Checks `password` against `user`'s console password under the console's per-account
/// sign-in limit (a wrong step-up costs what a wrong sign-in costs, and is recorded like one).
async fn verify_step_up<S: Store>(
    st: &AppState<S>,
    user: &User,
    password: &Zeroizing<String>,
) -> Result<(), DecideError> {
    let account = user.email.to_lowercase();
    let now = Instant::now();
    if let Err(wait) = st.console.check_account(&account, now) {
        return Err(DecideError::StepUpLimited(wait));
    }
    let (ok, has_password) = super::console::password_matches(st, Some(user), password)
        .await
        .map_err(DecideError::Store)?;
    if ok {
        return Ok(());
    }
    st.console.take_account(&account, now);
    let payload = json!({"email": user.email, "reason": if has_password { "wrong password" }
        else { "no password set" }, "for": "gate step-up"});
    super::console::record_auth_event(
        st,
        user,
        super::console::EVENT_STEP_UP_FAILED,
        payload,
        now_micros(),
    )
    .await
    .map_err(DecideError::Store)?;
    Err(DecideError::StepUpFailed { has_password })
}

/// `POST /api/v1/gates/{id}` with `{"action": "approve"|"deny"|"abandon", "note", "digest",
/// "password", "override"}`: 200 with the decided gate.
pub async fn post_gate<S: Store>(
    st: &AppState<S>,
    user: &User,
    id: &str,
    req: Request<Incoming>,
) -> Resp {
    // PostgreSQL re-checks the token inside `airlock_gate_decide`; held only for this
    // request, wiped on drop.
    let secret = Zeroizing::new(super::server::bearer_secret(&req).unwrap_or_default().to_string());
    let raw = match body(st, req, 64 * 1024).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let input = match parse_decision(&raw, &secret) {
        Ok(i) => i,
        Err(m) => return bad_request(m),
    };
    match decide(st, user, id, input).await {
        Ok(g) => super::server::json_resp(StatusCode::OK, &g.to_json(now_micros())),
        Err(e) => e.api(id),
    }
}

/// The body of `POST /api/v1/gates/{id}`.
fn parse_decision<'a>(raw: &[u8], secret: &'a str) -> Result<DecideInput<'a>, String> {
    let v: Value = serde_json::from_slice(raw).map_err(|e| format!("the body is not JSON: {e}"))?;
    let Value::Object(o) = &v else {
        return Err("the body must be one JSON object".into());
    };
    if let Some(k) = o
        .keys()
        .find(|k| !["action", "note", "digest", "password", "override"].contains(&k.as_str()))
    {
        return Err(format!(
            "unknown field {k:?}; a decision takes `action`, `note`, `digest`, `password` and \
             `override`"
        ));
    }
    let verdict = o
        .get("action")
        .and_then(Value::as_str)
        .and_then(Verdict::parse)
        .ok_or("`action` must be approve, deny or abandon")?;
    let text = |name: &str, max: usize| -> Result<Option<String>, String> {
        match o.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.len() <= max && !s.contains('\0') => Ok(Some(s.clone())),
            Some(_) => Err(format!("`{name}` must be a string of at most {max} bytes without NUL")),
        }
    };
    let note = text("note", 16 * 1024)?;
    let digest = text("digest", 128)?;
    let password = text("password", 1024)?.map(Zeroizing::new);
    let override_requested = match o.get("override") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("`override` must be true or false".into()),
    };
    Ok(DecideInput { verdict, note, digest, password, override_requested, secret })
}

/// Writes the `expired` step of gates nobody decided, every second (several instances may
/// run it at once: a gate's step is written once).
pub async fn expiry_loop<S: Store>(st: Arc<AppState<S>>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        expire_once(&st).await;
    }
}

/// One sweep of [`expiry_loop`]; returns how many gates it expired.
pub async fn expire_once<S: Store>(st: &AppState<S>) -> usize {
    let mut total = 0;
    loop {
        match st.store.expire_gates(100).await {
            Ok(done) => {
                total += done.len();
                done.iter().for_each(|_| metrics::global().gate_step("expired"));
                if done.len() < 100 {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!("writing the expiry of undecided gates failed: {e}");
                break;
            }
        }
    }
    if total > 0 {
        st.gates.notify();
    }
    total
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn decisions_parse_strictly() {
        let d = parse_decision(br#"{"action":"approve","note":"ok","digest":"sha256:1"}"#, "s")
            .unwrap();
        assert_eq!(d.verdict, Verdict::Approve);
        assert_eq!((d.note.as_deref(), d.digest.as_deref()), (Some("ok"), Some("sha256:1")));
        assert!(d.password.is_none() && !d.override_requested);
        for (body, want) in [
            (&br#"{"action":"maybe"}"#[..], "approve, deny or abandon"),
            (br#"{"action":"deny","colour":1}"#, "unknown field"),
            (br#"{"action":"deny","override":"yes"}"#, "true or false"),
            (br#"{"action":"deny","note":7}"#, "must be a string"),
            (br#"[]"#, "one JSON object"),
            (b"{", "not JSON"),
        ] {
            let e = parse_decision(body, "s").unwrap_err();
            assert!(e.contains(want), "{}: {e}", String::from_utf8_lossy(body));
        }
    }
}
