//! Action gates on the review plane (docs/gates.md "With a review server", docs/api.md
//! "Gates"): what a gate is as the server keeps it ([`Gate`]), how a request to open one is
//! checked ([`parse_open`]), who may decide it ([`may_decide`]), and the `gate.*` events the
//! server writes for each step ([`step_event`]). The HTTP side is [`super::gate_api`]; the
//! rows live in both stores (`gates`, `gate_decisions`; insert-only like everything else).
//!
//! A gate binds one exact action by the SHA-256 of its canonical text: for a held egress
//! attempt or a tool call the capture plane's own canonical JSON ([`crate::gate::EgressAction`],
//! [`crate::gate::ToolAction`]), which the server re-derives and compares byte for byte so
//! what a reviewer reads is what the digest covers; for an external agent's request, a
//! canonical object the server builds around the action text it was sent.

use serde_json::{Value, json};

use super::{Micros, NewEvent, Role, Source, User, format_micros};
use crate::gate::{self, Severity};

/// Gate ids: this prefix and 32 hex digits.
pub const ID_PREFIX: &str = "gt_";
/// The longest action text of an external or tool gate (as the proxy's `gate.airlock`).
pub const MAX_ACTION: usize = 16 * 1024;
/// The longest canonical text (a tool gate's is its action plus a few short fields).
pub const MAX_CANONICAL: usize = MAX_ACTION + 4096;
/// The longest `context` object, serialized.
pub const MAX_CONTEXT: usize = 64 * 1024;
/// The longest body of `POST /api/v1/gates`.
pub const MAX_OPEN_BODY: usize = 256 * 1024;
/// Longest short fields (`session`, `repo`, `rule`, `policy`, `local_id`, `layer`, `method`,
/// `host`): as the ingest envelope's ids.
pub const MAX_FIELD: usize = 1024;
/// The longest plain-HTTP request line a held attempt carries.
pub const MAX_REQUEST_LINE: usize = 8 * 1024;
/// Pending gates one session may have on the server at once (the daemon's own cap).
pub const MAX_PENDING_PER_SESSION: usize = gate::MAX_HELD_PER_SESSION;
/// Pending gates one user may have on the server at once, over all their sessions and
/// external agents: a flood cannot bury the reviewers' queue.
pub const MAX_PENDING_PER_USER: usize = 64;
/// The longest `wait` of `GET /api/v1/gates/{id}` (seconds).
pub const MAX_WAIT_SECS: u64 = 60;
/// Long-polls (`?wait=N`) in progress at once, server-wide and per user; past either: 429.
pub const MAX_WAITS: usize = 256;
pub const MAX_WAITS_PER_USER: usize = 16;

/// Whether `s` could be a gate id: gate ids are URL-safe (`gt_` and hex digits), so anything
/// outside `[A-Za-z0-9_-]`, or longer than 64 bytes, names no gate (the API's and the
/// console's routes answer it like an unknown id).
pub fn is_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A gate `user` may see: their own, or any for a reviewer or admin. Another person's is "no
/// such gate" for a member (the answer does not tell who asked for what).
pub fn visible(user: &User, g: &Gate) -> bool {
    user.role.can_review() || g.gate.user_id == user.id
}

/// What a gate holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GateKind {
    /// A held egress attempt (a CONNECT, a plain-HTTP request, a captured connection).
    Egress,
    /// An agent's tool call asked through `gate.airlock`.
    Tool,
    /// Any other client of the API (a CI job, a deploy bot).
    External,
}

impl GateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Egress => "egress",
            Self::Tool => "tool",
            Self::External => "external",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "egress" => Some(Self::Egress),
            "tool" => Some(Self::Tool),
            "external" => Some(Self::External),
            _ => None,
        }
    }
}

/// Where a gate stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GateState {
    Pending,
    Approved,
    Denied,
    /// Nobody decided before its deadline.
    Expired,
    /// The requester withdrew it (their agent hung up, the session or daemon stopped).
    Abandoned,
}

impl GateState {
    pub const NAMES: &'static [&'static str] =
        &["pending", "approved", "denied", "expired", "abandoned"];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Expired => "expired",
            Self::Abandoned => "abandoned",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(Self::Pending),
            "approved" => Some(Self::Approved),
            "denied" => Some(Self::Denied),
            "expired" => Some(Self::Expired),
            "abandoned" => Some(Self::Abandoned),
            _ => None,
        }
    }
}

/// A gate as it is opened (the store adds `n`, `requested_at` and `deadline`; PostgreSQL
/// takes both from its own clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewGate {
    pub id: String,
    /// The requester: the user of the token that opened it.
    pub user_id: String,
    pub kind: GateKind,
    /// The Airlock session (egress and tool gates).
    pub session: Option<String>,
    pub repo: Option<String>,
    /// `CONNECT`, the plain-HTTP method, or the tool's name.
    pub method: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    /// Plain HTTP: the request line; tool and external gates: the exact action text.
    pub request: Option<String>,
    /// The canonical text the digest is taken over.
    pub action: String,
    /// `sha256:<hex>` of `action`.
    pub digest: String,
    pub severity: Severity,
    /// The `[gate]` entry that matched, its layer and file (capture-plane gates).
    pub rule: Option<String>,
    pub layer: Option<String>,
    pub policy: Option<String>,
    /// The daemon's own id of the held attempt's gate.
    pub local_id: Option<String>,
    /// The client's `context` object, serialized.
    pub context: Option<String>,
    /// The requester may approve it themself: the server's `--gate-self-approve always`, or
    /// (under `managed`) the client reported `[gate] self_approve = true` from its managed
    /// layer. Decisions it allows are still marked `"self": true`.
    pub self_approve: bool,
    pub timeout_ms: i64,
}

/// A gate's one decision row (approved, denied, abandoned or expired; never replaced).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub state: GateState,
    /// Who decided (`None` for `expired`).
    pub actor: Option<String>,
    pub actor_email: Option<String>,
    pub note: Option<String>,
    /// The decider was the requester.
    pub self_decided: bool,
    /// The decider re-entered their password (step-up).
    pub step_up: bool,
    pub at: Micros,
}

/// A stored gate with its decision, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    /// Store row number: listings' order and cursor.
    pub n: i64,
    pub gate: NewGate,
    pub user_email: String,
    pub requested_at: Micros,
    pub deadline: Micros,
    pub decision: Option<Decision>,
}

impl Gate {
    /// Its state at `now`: the decision's, else pending until the deadline and expired after
    /// (whether or not the expiry row was written yet).
    pub fn state(&self, now: Micros) -> GateState {
        match &self.decision {
            Some(d) => d.state,
            None if now < self.deadline => GateState::Pending,
            None => GateState::Expired,
        }
    }

    /// The API's JSON for this gate (docs/api.md "Gates").
    pub fn to_json(&self, now: Micros) -> Value {
        let g = &self.gate;
        let context = g.context.as_deref().and_then(|c| serde_json::from_str::<Value>(c).ok());
        let decision = self.decision.as_ref().map(|d| {
            json!({
                "state": d.state.as_str(), "by": d.actor, "by_email": d.actor_email,
                "note": d.note, "self": d.self_decided, "step_up": d.step_up,
                "at": format_micros(d.at),
            })
        });
        json!({
            "id": g.id, "kind": g.kind.as_str(), "state": self.state(now).as_str(),
            "user_id": g.user_id, "user_email": self.user_email,
            "session": g.session, "repo": g.repo, "method": g.method, "host": g.host,
            "port": g.port, "request": g.request, "action": g.action, "digest": g.digest,
            "severity": g.severity.as_str(), "rule": g.rule, "layer": g.layer,
            "policy": g.policy, "local_id": g.local_id, "context": context,
            "self_approve": g.self_approve,
            "requested_at": format_micros(self.requested_at),
            "deadline": format_micros(self.deadline),
            "decision": decision,
        })
    }

    /// One line naming what is gated, for terminals and the console (`CONNECT host:443`, a
    /// tool's command, an external action).
    pub fn target(&self) -> String {
        target_of(&self.gate)
    }
}

/// See [`Gate::target`].
pub fn target_of(g: &NewGate) -> String {
    gate::target_text(
        g.kind.as_str(),
        g.method.as_deref(),
        g.host.as_deref(),
        g.port,
        g.request.as_deref(),
    )
}

/// How the server treats a requester approving their own gate (`airlockd review
/// --gate-self-approve`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SelfApprove {
    /// Never (but for the store's sole reviewer/admin and an admin's override).
    Never,
    /// As `Never`, unless the requesting client reports `[gate] self_approve = true` from its
    /// managed layer (a fleet admin's file; a user or repo file can never set it).
    #[default]
    Managed,
    /// Every requester may approve their own gates (a one-person store).
    Always,
}

impl SelfApprove {
    pub const NAMES: &'static [&'static str] = &["never", "managed", "always"];

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "never" => Some(Self::Never),
            "managed" => Some(Self::Managed),
            "always" => Some(Self::Always),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Never => "never",
            Self::Managed => "managed",
            Self::Always => "always",
        }
    }

    /// Whether a gate opened with the client's claim `claimed` may be self-approved.
    pub fn allows(self, claimed: bool) -> bool {
        match self {
            Self::Never => false,
            Self::Managed => claimed,
            Self::Always => true,
        }
    }
}

/// Why a request to open a gate is refused (400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OpenError(pub String);

fn bad(msg: impl Into<String>) -> OpenError {
    OpenError(msg.into())
}

/// Parses the body of `POST /api/v1/gates` for `user` into the gate to open (with a fresh
/// `id`). Every field is bounded and NUL-free (PostgreSQL text holds no NUL); an egress or
/// tool gate's `action` must be the capture plane's canonical text, byte for byte, and the
/// listed fields are taken from it; `digest`, when sent, must be its digest.
pub fn parse_open(
    body: &[u8],
    user: &User,
    policy: SelfApprove,
    id: String,
) -> Result<NewGate, OpenError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| bad(format!("the body is not JSON: {e}; send one JSON object")))?;
    let Value::Object(o) = v else {
        return Err(bad("the body must be one JSON object (docs/api.md, \"Gates\")"));
    };
    const KNOWN: &[&str] = &[
        "kind",
        "action",
        "digest",
        "severity",
        "timeout",
        "session",
        "repo",
        "method",
        "host",
        "port",
        "request",
        "rule",
        "layer",
        "policy",
        "local_id",
        "context",
        "self_approve",
    ];
    if let Some(k) = o.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(bad(format!(
            "unknown field {k:?}; a gate takes {}",
            KNOWN.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
        )));
    }
    let text = |name: &str, max: usize| -> Result<Option<String>, OpenError> {
        match o.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.len() <= max && !s.contains('\0') => Ok(Some(s.clone())),
            Some(Value::String(s)) if s.contains('\0') => {
                Err(bad(format!("`{name}` contains NUL (\\u0000); remove it")))
            }
            Some(Value::String(_)) => Err(bad(format!("`{name}` is longer than {max} bytes"))),
            Some(_) => Err(bad(format!("`{name}` must be a string"))),
        }
    };
    let kind = match text("kind", 16)? {
        None => GateKind::External,
        Some(k) => GateKind::parse(&k)
            .ok_or_else(|| bad(format!("`kind` {k:?} is not egress, tool or external")))?,
    };
    let action = text("action", MAX_CANONICAL)?
        .filter(|a| !a.trim().is_empty())
        .ok_or_else(|| bad("`action` is required: the exact action to approve, as text"))?;
    let severity = match text("severity", 16)? {
        None => Severity::Medium,
        Some(s) => Severity::parse(&s)
            .ok_or_else(|| bad(format!("`severity` {s:?} is not low, medium or high")))?,
    };
    let timeout_ms = match o.get("timeout") {
        None | Some(Value::Null) => gate::DEFAULT_TIMEOUT.as_millis() as i64,
        Some(Value::Number(n)) => {
            let secs = n.as_u64().filter(|s| {
                (gate::MIN_TIMEOUT.as_secs()..=gate::MAX_TIMEOUT.as_secs()).contains(s)
            });
            let Some(secs) = secs else {
                return Err(bad(format!(
                    "`timeout` must be whole seconds from {} to {}",
                    gate::MIN_TIMEOUT.as_secs(),
                    gate::MAX_TIMEOUT.as_secs()
                )));
            };
            secs as i64 * 1000
        }
        Some(_) => return Err(bad("`timeout` must be a number of seconds")),
    };
    let context = match o.get("context") {
        None | Some(Value::Null) => None,
        Some(c @ Value::Object(_)) => {
            let s = c.to_string();
            if s.len() > MAX_CONTEXT {
                return Err(bad(format!("`context` is larger than {MAX_CONTEXT} bytes")));
            }
            if s.contains("\\u0000") {
                return Err(bad("`context` contains NUL (\\u0000); remove it"));
            }
            Some(s)
        }
        Some(_) => return Err(bad("`context` must be a JSON object")),
    };
    let claimed = match o.get("self_approve") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("`self_approve` must be true or false")),
    };
    let port = match o.get("port") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(
            n.as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p > 0)
                .ok_or_else(|| bad("`port` must be a TCP port, 1 to 65535"))?,
        ),
        Some(_) => return Err(bad("`port` must be a number")),
    };
    let mut g = NewGate {
        id,
        user_id: user.id.clone(),
        kind,
        session: text("session", MAX_FIELD)?,
        repo: text("repo", MAX_FIELD)?,
        method: text("method", MAX_FIELD)?,
        host: text("host", MAX_FIELD)?,
        port,
        request: text("request", MAX_CANONICAL)?,
        action: String::new(),
        digest: String::new(),
        severity,
        rule: text("rule", MAX_FIELD)?,
        layer: text("layer", MAX_FIELD)?,
        policy: text("policy", MAX_FIELD)?,
        local_id: text("local_id", MAX_FIELD)?,
        context,
        self_approve: policy.allows(claimed),
        timeout_ms,
    };
    match kind {
        GateKind::Egress => bind_egress(&mut g, &action)?,
        GateKind::Tool => bind_tool(&mut g, &action)?,
        GateKind::External => {
            if action.len() > MAX_ACTION {
                return Err(bad(format!("`action` is longer than {MAX_ACTION} bytes")));
            }
            for f in ["session", "method", "host", "port", "request"] {
                if o.get(f).is_some_and(|v| !v.is_null()) {
                    return Err(bad(format!(
                        "`{f}` belongs to egress and tool gates (opened by `airlock`); an \
                         external gate names its action in `action` and may add `context`"
                    )));
                }
            }
            g.action = external_canonical(&g.id, &user.id, &action);
            g.request = Some(action);
        }
    }
    let digest = gate::digest(&g.action);
    if let Some(sent) = text("digest", 128)?
        && sent != digest
    {
        return Err(bad(format!(
            "`digest` {sent} is not the SHA-256 of `action` ({digest}); send the canonical \
             text the digest was taken over, unchanged"
        )));
    }
    g.digest = digest;
    Ok(g)
}

/// The canonical text of an external gate: the action, bound to this gate and requester.
pub fn external_canonical(gate_id: &str, user_id: &str, action: &str) -> String {
    #[derive(serde::Serialize)]
    struct Canonical<'a> {
        action: &'a str,
        gate: &'a str,
        kind: &'static str,
        requester: &'a str,
    }
    let c = Canonical { action, gate: gate_id, kind: "external", requester: user_id };
    // A struct of strings always serializes.
    serde_json::to_string(&c).unwrap_or_default()
}

/// A string member of a canonical object.
fn member<'a>(o: &'a serde_json::Map<String, Value>, k: &str) -> Result<&'a str, OpenError> {
    o.get(k)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("the canonical `action` has no string `{k}`")))
}

/// Checks that a listed field, when the client sent it, agrees with the canonical text.
fn agree(sent: &Option<String>, canonical: &str, name: &str) -> Result<(), OpenError> {
    match sent {
        Some(s) if s != canonical => Err(bad(format!(
            "`{name}` {s:?} differs from the canonical action's {canonical:?}; the gate is \
             decided on the canonical text, so send the two alike"
        ))),
        _ => Ok(()),
    }
}

fn bind_egress(g: &mut NewGate, action: &str) -> Result<(), OpenError> {
    let v: Value = serde_json::from_str(action)
        .map_err(|e| bad(format!("an egress gate's `action` must be its canonical JSON: {e}")))?;
    let Value::Object(o) = &v else {
        return Err(bad("an egress gate's `action` must be a JSON object"));
    };
    if o.get("kind").and_then(Value::as_str) != Some("egress") {
        return Err(bad("an egress gate's canonical `action` must have \"kind\": \"egress\""));
    }
    let port = o
        .get("port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .ok_or_else(|| bad("the canonical `action` has no valid `port`"))?;
    let request = match o.get("request") {
        None => None,
        Some(Value::String(s)) if s.len() <= MAX_REQUEST_LINE => Some(s.as_str()),
        Some(_) => return Err(bad("the canonical `action`'s `request` is not a request line")),
    };
    let a = gate::EgressAction {
        session: member(o, "session")?,
        attempt: member(o, "attempt")?,
        method: member(o, "method")?,
        host: member(o, "host")?,
        port,
        request,
    };
    if a.canonical() != action {
        return Err(bad(
            "an egress gate's `action` is not in canonical form (sorted keys, no whitespace, \
             exactly the fields airlock writes); send it as the daemon gave it",
        ));
    }
    agree(&g.session, a.session, "session")?;
    agree(&g.method, a.method, "method")?;
    agree(&g.host, a.host, "host")?;
    if g.port.is_some_and(|p| p != port) {
        return Err(bad("`port` differs from the canonical action's"));
    }
    if g.request.is_some() && g.request.as_deref() != request {
        return Err(bad("`request` differs from the canonical action's"));
    }
    g.session = Some(a.session.to_owned());
    g.method = Some(a.method.to_owned());
    g.host = Some(a.host.to_owned());
    g.port = Some(port);
    g.request = request.map(str::to_owned);
    g.action = action.to_owned();
    Ok(())
}

fn bind_tool(g: &mut NewGate, action: &str) -> Result<(), OpenError> {
    let v: Value = serde_json::from_str(action)
        .map_err(|e| bad(format!("a tool gate's `action` must be its canonical JSON: {e}")))?;
    let Value::Object(o) = &v else {
        return Err(bad("a tool gate's `action` must be a JSON object"));
    };
    if o.get("kind").and_then(Value::as_str) != Some("tool") {
        return Err(bad("a tool gate's canonical `action` must have \"kind\": \"tool\""));
    }
    let a = gate::ToolAction {
        session: member(o, "session")?,
        attempt: member(o, "attempt")?,
        tool: member(o, "tool")?,
        action: member(o, "action")?,
    };
    if a.action.len() > MAX_ACTION {
        return Err(bad(format!("the tool call's action is longer than {MAX_ACTION} bytes")));
    }
    if a.canonical() != action {
        return Err(bad(
            "a tool gate's `action` is not in canonical form (sorted keys, no whitespace, \
             exactly the fields airlock writes); send it as the daemon gave it",
        ));
    }
    agree(&g.session, a.session, "session")?;
    agree(&g.method, a.tool, "method")?;
    agree(&g.request, a.action, "request")?;
    if g.host.is_some() || g.port.is_some() {
        return Err(bad("a tool gate has no `host` or `port`"));
    }
    g.session = Some(a.session.to_owned());
    g.method = Some(a.tool.to_owned());
    g.request = Some(a.action.to_owned());
    g.action = action.to_owned();
    Ok(())
}

/// What a decider asks for (`POST /api/v1/gates/{id}` `action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    Deny,
    /// The requester withdraws the gate (their attempt is gone).
    Abandon,
}

impl Verdict {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "approve" => Some(Self::Approve),
            "deny" => Some(Self::Deny),
            "abandon" => Some(Self::Abandon),
            _ => None,
        }
    }

    pub fn state(self) -> GateState {
        match self {
            Self::Approve => GateState::Approved,
            Self::Deny => GateState::Denied,
            Self::Abandon => GateState::Abandoned,
        }
    }
}

/// Why a decision is refused (403); each message says what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "only reviewers and admins decide other people's gates; ask a reviewer to decide it \
         (the console's /gates page lists it)"
    )]
    NotReviewer,
    #[error(
        "this gate holds your own agent's action, and nobody approves their own: another \
         reviewer or an admin must approve it (an admin may send \"override\": true, recorded \
         as a self-approval); you may deny it or let it expire"
    )]
    OwnGate,
    #[error("`override` is for admins only; leave it out")]
    OverrideNotAdmin,
    #[error("only the requester withdraws a gate (\"abandon\"); a reviewer approves or denies it")]
    NotRequester,
}

/// What [`may_decide`] is given.
#[derive(Debug, Clone, Copy)]
pub struct DecideRequest<'a> {
    pub actor: &'a User,
    /// The gate's requester.
    pub owner: &'a str,
    pub verdict: Verdict,
    /// `"override": true` in the request.
    pub override_requested: bool,
    /// Users whose current role is reviewer or admin (the actor included).
    pub reviewers: usize,
    /// The gate may be self-approved ([`NewGate::self_approve`]).
    pub self_approve: bool,
}

/// The review-hardening rule for gates (docs/gates.md "With a review server"): `Ok(self)`
/// when the decision may be recorded (`true`: the decider is the requester, marked so).
///
/// - Approving: a reviewer or admin, never the requester — except the store's sole
///   reviewer/admin (nobody else could), an admin with `override`, or a gate opened with
///   self-approval allowed.
/// - Denying: a reviewer or admin, or the requester (refusing one's own agent's step is
///   always safe).
/// - Abandoning: the requester (their attempt is gone), or an admin.
pub fn may_decide(r: DecideRequest<'_>) -> Result<bool, Refusal> {
    let own = r.actor.id == r.owner;
    let reviewer = r.actor.role.can_review();
    let admin = r.actor.role == Role::Admin;
    if r.override_requested && !admin {
        return Err(Refusal::OverrideNotAdmin);
    }
    match r.verdict {
        Verdict::Abandon if own || admin => Ok(own),
        Verdict::Abandon => Err(Refusal::NotRequester),
        Verdict::Deny if own => Ok(true),
        Verdict::Deny | Verdict::Approve if !own => {
            if reviewer {
                Ok(false)
            } else {
                Err(Refusal::NotReviewer)
            }
        }
        Verdict::Approve | Verdict::Deny => {
            // The requester approving their own gate.
            if r.self_approve || (reviewer && (r.reviewers <= 1 || r.override_requested)) {
                Ok(true)
            } else {
                Err(Refusal::OwnGate)
            }
        }
    }
}

/// Whether a decision of `verdict` on a gate of `severity` needs the decider's password
/// (step-up): approving or denying a `high` gate.
pub fn needs_step_up(severity: Severity, verdict: Verdict) -> bool {
    severity == Severity::High && verdict != Verdict::Abandon
}

/// The server-written event of one step of `g` (`gate.requested` for `None`, else the
/// decision's state), stored in the requester's history: source `gate`, id
/// `<gate id>:<step>` (so a step is written once however many instances see it), the
/// Airlock session as `airlock_session` (the console's session drill-down finds it there;
/// the envelope's `session` stays empty so the session's span check, which runs on the
/// capture plane's clock, never reads the server's).
pub fn step_event(g: &Gate, decision: Option<&Decision>) -> NewEvent {
    let step = decision.map_or("requested", |d| d.state.as_str());
    let ts = decision.map_or(g.requested_at, |d| d.at);
    let x = &g.gate;
    let mut payload = json!({
        "gate": x.id, "step": step, "kind": x.kind.as_str(),
        "user_id": x.user_id, "user_email": g.user_email,
        "session": x.session, "repo": x.repo, "method": x.method, "host": x.host,
        "port": x.port, "request": x.request, "action": x.action, "digest": x.digest,
        "severity": x.severity.as_str(), "rule": x.rule, "layer": x.layer, "policy": x.policy,
        "local_id": x.local_id, "requested_at": format_micros(g.requested_at),
        "deadline": format_micros(g.deadline),
    });
    if let Some(d) = decision {
        payload["by"] = json!(d.actor);
        payload["by_email"] = json!(d.actor_email);
        payload["decided_at"] = json!(format_micros(d.at));
        payload["note"] = json!(d.note);
        payload["self"] = json!(d.self_decided);
        payload["step_up"] = json!(d.step_up);
    }
    NewEvent {
        source: Source::Gate,
        id: format!("{}:{step}", x.id),
        kind: format!("gate.{step}"),
        ts,
        session: None,
        seq: None,
        boot: None,
        payload: payload.to_string(),
        airlock_session: x.session.clone(),
        file: None,
        offset: None,
    }
}

/// Filters for listing gates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GateQuery {
    /// Only this requester's gates.
    pub user_id: Option<String>,
    /// Only gates in this state (at the store's clock).
    pub state: Option<GateState>,
    /// Only gates of this Airlock session.
    pub session: Option<String>,
    /// Cursor: `n` strictly after (ascending) or before (descending) this.
    pub after: Option<i64>,
    /// Oldest first (the pending queue), else newest first.
    pub ascending: bool,
    pub limit: u32,
}

/// The outcome of a decision attempt, as the store decided it atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// Recorded; the gate with its decision.
    Done(Box<Gate>),
    NoGate,
    /// It was decided, expired or abandoned already: its state.
    NotPending(Box<Gate>),
    /// The digest sent is not the gate's.
    Digest(Box<Gate>),
}

/// One decision as the server asks the store to record it (checked with [`may_decide`] and
/// the step-up rule first; PostgreSQL checks the credential, role, self rule and step-up flag
/// again in `airlock_gate_decide`).
#[derive(Debug, Clone, Copy)]
pub struct DecisionRequest<'a> {
    pub gate_id: &'a str,
    pub verdict: Verdict,
    pub note: Option<&'a str>,
    pub actor: &'a User,
    /// What [`may_decide`] answered.
    pub self_decided: bool,
    pub override_requested: bool,
    /// The decider's password was verified.
    pub step_up: bool,
    /// Decide only if the gate's digest is this.
    pub digest: Option<&'a str>,
    /// The credential presented (token secret or console session id; PostgreSQL re-checks).
    pub secret: &'a str,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn user(id: &str, role: Role) -> User {
        User { id: id.into(), email: format!("{id}@example.test"), role }
    }

    fn egress_action() -> String {
        gate::EgressAction {
            session: "s1",
            attempt: "a1",
            method: "CONNECT",
            host: "api.pay.test",
            port: 443,
            request: None,
        }
        .canonical()
    }

    fn open(body: Value) -> Result<NewGate, OpenError> {
        parse_open(
            body.to_string().as_bytes(),
            &user("u1", Role::Member),
            SelfApprove::Managed,
            "gt_1".into(),
        )
    }

    #[test]
    fn gate_ids_keep_to_the_route_charset() {
        assert!(is_id("gt_0123abcd"));
        assert!(is_id("a-b_C"));
        for bad in ["", "gt/1", "gt 1", "gt%201", "<x>", &"a".repeat(65)] {
            assert!(!is_id(bad), "{bad}");
        }
    }

    #[test]
    fn an_egress_gate_takes_its_fields_from_the_canonical_action() {
        let a = egress_action();
        let g = open(json!({"kind": "egress", "action": a, "severity": "high",
            "digest": gate::digest(&a), "repo": "payments", "rule": "api.pay.test",
            "timeout": 30}))
        .unwrap();
        assert_eq!(g.host.as_deref(), Some("api.pay.test"));
        assert_eq!((g.port, g.method.as_deref()), (Some(443), Some("CONNECT")));
        assert_eq!(g.session.as_deref(), Some("s1"));
        assert_eq!(g.digest, gate::digest(&a));
        assert_eq!((g.severity, g.timeout_ms), (Severity::High, 30_000));
        assert_eq!(g.target_of_self(), "CONNECT api.pay.test:443");
    }

    impl NewGate {
        fn target_of_self(&self) -> String {
            target_of(self)
        }
    }

    #[test]
    fn a_canonical_action_that_was_reformatted_or_disagrees_is_refused() {
        let a = egress_action();
        let spaced = a.replace(",", ", ");
        let e = open(json!({"kind": "egress", "action": spaced})).unwrap_err();
        assert!(e.0.contains("canonical form"), "{e}");
        let e = open(json!({"kind": "egress", "action": a, "host": "other.test"})).unwrap_err();
        assert!(e.0.contains("differs"), "{e}");
        let e = open(json!({"kind": "egress", "action": a, "digest": "sha256:00"})).unwrap_err();
        assert!(e.0.contains("not the SHA-256"), "{e}");
        let e = open(json!({"kind": "tool", "action": a})).unwrap_err();
        assert!(e.0.contains("\"kind\": \"tool\""), "{e}");
    }

    #[test]
    fn a_tool_gate_binds_its_command() {
        let a = gate::ToolAction { session: "s", attempt: "q1", tool: "Bash", action: "git push" }
            .canonical();
        let g = open(json!({"kind": "tool", "action": a})).unwrap();
        assert_eq!(g.request.as_deref(), Some("git push"));
        assert_eq!(g.method.as_deref(), Some("Bash"));
        assert_eq!(g.target_of_self(), "Bash: git push");
    }

    #[test]
    fn an_external_gate_is_bound_to_its_id_and_requester() {
        let g =
            open(json!({"action": "deploy payments v2 to prod", "context": {"ci": 7}})).unwrap();
        assert_eq!(g.kind, GateKind::External);
        assert_eq!(
            g.action,
            r#"{"action":"deploy payments v2 to prod","gate":"gt_1","kind":"external","requester":"u1"}"#
        );
        assert_eq!(g.request.as_deref(), Some("deploy payments v2 to prod"));
        assert_eq!(g.context.as_deref(), Some(r#"{"ci":7}"#));
        assert_eq!(g.timeout_ms, 110_000);
        let e = open(json!({"action": "x", "host": "h"})).unwrap_err();
        assert!(e.0.contains("belongs to egress"), "{e}");
    }

    #[test]
    fn bad_bodies_say_what_is_wrong() {
        for (body, want) in [
            (json!([]), "one JSON object"),
            (json!({}), "`action` is required"),
            (json!({"action": "  "}), "`action` is required"),
            (json!({"action": "x", "severity": "critical"}), "not low, medium or high"),
            (json!({"action": "x", "timeout": 0}), "whole seconds"),
            (json!({"action": "x", "timeout": 3601}), "whole seconds"),
            (json!({"action": "x", "timeout": 1.5}), "whole seconds"),
            (json!({"action": "x", "context": [1]}), "JSON object"),
            (json!({"action": "x", "self_approve": "yes"}), "true or false"),
            (json!({"action": "x", "colour": 1}), "unknown field"),
            (json!({"action": "x", "kind": "egres"}), "not egress, tool or external"),
            (json!({"action": "a\u{0}b"}), "NUL"),
            (json!({"action": "x".repeat(MAX_ACTION + 1)}), "longer than"),
        ] {
            let e = open(body.clone()).unwrap_err();
            assert!(e.0.contains(want), "{body}: {e}");
        }
        let e =
            parse_open(b"{", &user("u", Role::Member), SelfApprove::Never, "g".into()).unwrap_err();
        assert!(e.0.contains("not JSON"), "{e}");
    }

    #[test]
    fn self_approval_claims_follow_the_server_setting() {
        let body = json!({"action": "x", "self_approve": true}).to_string();
        let u = user("u", Role::Member);
        let with = |p| parse_open(body.as_bytes(), &u, p, "g".into()).unwrap().self_approve;
        assert!(!with(SelfApprove::Never));
        assert!(with(SelfApprove::Managed));
        assert!(with(SelfApprove::Always));
        let body = json!({"action": "x"}).to_string();
        let g = parse_open(body.as_bytes(), &u, SelfApprove::Managed, "g".into()).unwrap();
        assert!(!g.self_approve);
        let g = parse_open(body.as_bytes(), &u, SelfApprove::Always, "g".into()).unwrap();
        assert!(g.self_approve);
    }

    fn req<'a>(actor: &'a User, owner: &'a str, verdict: Verdict) -> DecideRequest<'a> {
        DecideRequest {
            actor,
            owner,
            verdict,
            override_requested: false,
            reviewers: 2,
            self_approve: false,
        }
    }

    #[test]
    fn nobody_approves_their_own_gate_with_a_second_reviewer_there() {
        let rev = user("r", Role::Reviewer);
        let admin = user("a", Role::Admin);
        let member = user("m", Role::Member);
        assert_eq!(may_decide(req(&rev, "m", Verdict::Approve)), Ok(false));
        assert_eq!(may_decide(req(&rev, "m", Verdict::Deny)), Ok(false));
        assert_eq!(may_decide(req(&member, "x", Verdict::Approve)), Err(Refusal::NotReviewer));
        assert_eq!(may_decide(req(&member, "x", Verdict::Deny)), Err(Refusal::NotReviewer));
        assert_eq!(may_decide(req(&rev, "r", Verdict::Approve)), Err(Refusal::OwnGate));
        assert_eq!(may_decide(req(&member, "m", Verdict::Approve)), Err(Refusal::OwnGate));
        // Denying one's own is always allowed, and marked.
        assert_eq!(may_decide(req(&member, "m", Verdict::Deny)), Ok(true));
        // The exceptions: sole reviewer, admin override, self-approval allowed.
        assert_eq!(
            may_decide(DecideRequest { reviewers: 1, ..req(&rev, "r", Verdict::Approve) }),
            Ok(true)
        );
        assert_eq!(
            may_decide(DecideRequest {
                override_requested: true,
                ..req(&admin, "a", Verdict::Approve)
            }),
            Ok(true)
        );
        assert_eq!(
            may_decide(DecideRequest {
                override_requested: true,
                ..req(&rev, "r", Verdict::Approve)
            }),
            Err(Refusal::OverrideNotAdmin)
        );
        assert_eq!(
            may_decide(DecideRequest { self_approve: true, ..req(&member, "m", Verdict::Approve) }),
            Ok(true)
        );
        // A member alone in a store is not a reviewer: the sole-reviewer rule is not theirs.
        assert_eq!(
            may_decide(DecideRequest { reviewers: 1, ..req(&member, "m", Verdict::Approve) }),
            Err(Refusal::OwnGate)
        );
    }

    #[test]
    fn only_the_requester_or_an_admin_abandons() {
        let rev = user("r", Role::Reviewer);
        let admin = user("a", Role::Admin);
        let member = user("m", Role::Member);
        assert_eq!(may_decide(req(&member, "m", Verdict::Abandon)), Ok(true));
        assert_eq!(may_decide(req(&admin, "m", Verdict::Abandon)), Ok(false));
        assert_eq!(may_decide(req(&rev, "m", Verdict::Abandon)), Err(Refusal::NotRequester));
    }

    #[test]
    fn step_up_is_for_deciding_high_gates() {
        assert!(needs_step_up(Severity::High, Verdict::Approve));
        assert!(needs_step_up(Severity::High, Verdict::Deny));
        assert!(!needs_step_up(Severity::High, Verdict::Abandon));
        assert!(!needs_step_up(Severity::Medium, Verdict::Approve));
    }

    #[test]
    fn state_and_events_follow_the_decision() {
        let g = open(json!({"kind": "egress", "action": egress_action()})).unwrap();
        let mut gate = Gate {
            n: 1,
            gate: g,
            user_email: "u1@example.test".into(),
            requested_at: 1_000_000,
            deadline: 2_000_000,
            decision: None,
        };
        assert_eq!(gate.state(1_500_000), GateState::Pending);
        assert_eq!(gate.state(2_000_000), GateState::Expired);
        let e = step_event(&gate, None);
        assert_eq!(
            (e.source, e.id.as_str(), e.kind.as_str()),
            (Source::Gate, "gt_1:requested", "gate.requested")
        );
        assert_eq!((e.session.as_deref(), e.airlock_session.as_deref()), (None, Some("s1")));
        let d = Decision {
            state: GateState::Approved,
            actor: Some("r".into()),
            actor_email: Some("r@example.test".into()),
            note: Some("ok".into()),
            self_decided: false,
            step_up: true,
            at: 1_200_000,
        };
        gate.decision = Some(d.clone());
        assert_eq!(gate.state(9_000_000), GateState::Approved);
        let e = step_event(&gate, Some(&d));
        assert_eq!(e.id, "gt_1:approved");
        let p: Value = serde_json::from_str(&e.payload).unwrap();
        assert_eq!(
            (p["by_email"].as_str(), p["step_up"].as_bool()),
            (Some("r@example.test"), Some(true))
        );
        assert_eq!(p["digest"], gate.gate.digest.as_str());
        let j = gate.to_json(0);
        assert_eq!(
            (j["state"].as_str(), j["decision"]["note"].as_str()),
            (Some("approved"), Some("ok"))
        );
    }
}
