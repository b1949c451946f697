//! The review plane (DESIGN §8): ingest of published events, the insert-only stores
//! (embedded SQLite and PostgreSQL behind one [`store::Store`] trait), detection at ingest,
//! and the HTTP API; the `airlockd review` / `airlockd admin` commands that drive them are in
//! the `airlockd` front ([`crate::daemon::cli`]).
//!
//! Data flow: [`server`] authenticates a bearer token ([`token`]), [`ingest`] decodes and
//! validates a batch, the store inserts it (dedup on `(user, source, id)`), and [`detect`]
//! runs the rules over the newly created events ([`transcript`] gives them a typed view).
//! [`limits`] holds the fairness rules the server applies (slots, rate limits, accept
//! backoff) and [`metrics`] what `GET /metrics` reports. [`console`] is the browser console
//! on the same listener (sign-in and sessions; docs/console.md).

pub mod console;
pub mod correlate;
pub mod dedup;
pub mod detect;
pub mod flag_rules;
pub mod gate_api;
pub mod gates;
pub mod ingest;
pub mod limits;
pub mod log;
pub mod metrics;
pub mod reads;
pub mod render;
pub mod server;
pub mod store;
pub mod token;
pub mod transcript;
pub mod transcript_files;

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Where an event came from; a closed list (DESIGN §8, docs/api.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Egress,
    Session,
    Claude,
    Codex,
    External,
    Gate,
}

impl Source {
    pub const ALL: [Source; 6] = [
        Source::Egress,
        Source::Session,
        Source::Claude,
        Source::Codex,
        Source::External,
        Source::Gate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Egress => "egress",
            Source::Session => "session",
            Source::Claude => "claude",
            Source::Codex => "codex",
            Source::External => "external",
            Source::Gate => "gate",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Source {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Source::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| {
                format!("unknown source {s:?}; expected one of egress, session, claude, codex, external, gate")
            })
    }
}

/// A user's role. Members read only their own history; reviewers read everyone's and act
/// on flags; admins additionally manage users (through `airlockd admin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Admin,
    Reviewer,
    Member,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Reviewer => "reviewer",
            Role::Member => "member",
        }
    }
    /// Whether this role may read other users' history and act on flags.
    pub fn can_review(self) -> bool {
        matches!(self, Role::Admin | Role::Reviewer)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "admin" => Ok(Role::Admin),
            "reviewer" => Ok(Role::Reviewer),
            "member" => Ok(Role::Member),
            other => Err(format!("unknown role {other:?}; expected admin, reviewer or member")),
        }
    }
}

/// A user of the review plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct User {
    pub id: String,
    pub email: String,
    pub role: Role,
}

/// Microseconds since the Unix epoch (UTC); the stores' time unit.
pub type Micros = i64;

/// Current server time in microseconds.
pub fn now_micros() -> Micros {
    let now = time::OffsetDateTime::now_utc();
    (now.unix_timestamp_nanos() / 1000) as Micros
}

/// RFC 3339 with milliseconds, UTC (`2026-03-04T09:12:05.118Z`), as the audit log writes it.
pub fn format_micros(us: Micros) -> String {
    crate::timefmt::rfc3339(crate::timefmt::from_micros(us), crate::timefmt::Fraction::Millis)
}

/// Parses an RFC 3339 timestamp into microseconds.
pub fn parse_rfc3339(s: &str) -> Option<Micros> {
    let dt = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(dt.unix_timestamp_nanos() / 1000).ok()
}

/// One validated event ready to be stored (attributed to the token's user by the caller).
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub source: Source,
    pub id: String,
    pub kind: String,
    pub ts: Micros,
    pub session: Option<String>,
    pub seq: Option<i64>,
    /// The daemon instance for egress lines (`payload.boot`); gaps are judged per (session, boot).
    pub boot: Option<String>,
    /// The payload's JSON text, stored verbatim.
    pub payload: String,
    /// Transcript lines (`claude`, `codex`): the Airlock session whose end record covered the
    /// line; a `transcript.file` item: its `payload.airlock_session`.
    pub airlock_session: Option<String>,
    /// Transcript lines and `transcript.file` items: the path relative to the agent home.
    pub file: Option<String>,
    /// Transcript lines: the byte offset of the line in `file`.
    pub offset: Option<i64>,
}

/// An event as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredEvent {
    /// Store-wide sequence number; cursors and flags refer to it.
    pub pk: i64,
    pub user_id: String,
    pub source: Source,
    pub id: String,
    pub kind: String,
    pub ts: Micros,
    pub session: Option<String>,
    pub seq: Option<i64>,
    pub boot: Option<String>,
    pub received_at: Micros,
    pub payload: String,
    /// For a conflict (a different content resent under a stored `(source, id)`,
    /// [`dedup`]): the `pk` of the original event.
    pub conflict_of: Option<i64>,
    /// As [`NewEvent::airlock_session`], [`NewEvent::file`], [`NewEvent::offset`].
    pub airlock_session: Option<String>,
    pub file: Option<String>,
    pub offset: Option<i64>,
}

impl StoredEvent {
    /// The API's JSON shape (docs/api.md), `payload` written out as the client sent it (its
    /// own bytes: spacing, key order, NUL and lone-surrogate escapes kept), with the typed
    /// view when asked for.
    pub fn api_json(&self, with_view: bool) -> ApiEvent<'_> {
        // The stored text passed the same check at ingest; `null` stands in for a row that
        // somehow does not (the API never fails a whole page over one row).
        let payload = serde_json::from_str::<&serde_json::value::RawValue>(&self.payload).ok();
        let view = with_view.then(|| {
            let tree = ingest::payload_value(&self.payload).unwrap_or(serde_json::Value::Null);
            transcript::view(self.source, &tree)
        });
        ApiEvent {
            pk: self.pk,
            user_id: &self.user_id,
            source: self.source,
            id: &self.id,
            kind: &self.kind,
            ts: format_micros(self.ts),
            session: self.session.as_deref(),
            seq: self.seq,
            boot: self.boot.as_deref(),
            received_at: format_micros(self.received_at),
            payload,
            conflict_of: self.conflict_of,
            airlock_session: self.airlock_session.as_deref(),
            file: self.file.as_deref(),
            offset: self.offset,
            view,
        }
    }
}

/// One event as `GET /api/v1/events` writes it (see [`StoredEvent::api_json`]).
#[derive(Debug, Serialize)]
pub struct ApiEvent<'a> {
    pub pk: i64,
    pub user_id: &'a str,
    pub source: Source,
    pub id: &'a str,
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub ts: String,
    pub session: Option<&'a str>,
    pub seq: Option<i64>,
    pub boot: Option<&'a str>,
    pub received_at: String,
    pub payload: Option<&'a serde_json::value::RawValue>,
    /// The original's `pk` when this event is a dedup conflict, else `null`.
    pub conflict_of: Option<i64>,
    /// Transcript envelope members (and a `transcript.file` item's), else `null`.
    pub airlock_session: Option<&'a str>,
    pub file: Option<&'a str>,
    pub offset: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub view: Option<transcript::View>,
}

/// Outcome of inserting one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inserted {
    /// `true` when this call created the event (a conflict included); `false` for a duplicate
    /// of stored content ([`dedup`]).
    pub created: bool,
    pub pk: i64,
    /// The original `received_at` (for duplicates, that of the stored copy).
    pub received_at: Micros,
    /// Set when the created event is a conflict: a different content under a stored
    /// `(user, source, id)`.
    pub conflict: Option<dedup::Conflict>,
    /// The event's leaf index in the review log when the store sequenced it in the same
    /// transaction (the embedded store; PostgreSQL sequences after commit: `None`).
    pub leaf_index: Option<u64>,
}

/// Flag severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Low,
    Medium,
    High,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
            Severity::Critical => "critical",
        }
    }
}

impl FromStr for Severity {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "low" => Ok(Severity::Low),
            "medium" => Ok(Severity::Medium),
            "high" => Ok(Severity::High),
            "critical" => Ok(Severity::Critical),
            other => {
                Err(format!("unknown severity {other:?}; expected low, medium, high or critical"))
            }
        }
    }
}

/// A decision flag to be stored: raised by `rule_id` against the linked events.
#[derive(Debug, Clone, PartialEq)]
pub struct NewFlag {
    /// Deterministic id (hash of rule and linked events) so re-detection is idempotent.
    pub id: String,
    pub rule_id: String,
    pub title: String,
    pub severity: Severity,
    pub user_id: String,
    pub session: Option<String>,
    pub detail: String,
    pub event_pks: Vec<i64>,
}

/// Review state of a flag; changes are appended rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlagState {
    Open,
    Acknowledged,
    Resolved,
    Dismissed,
}

impl FlagState {
    pub fn as_str(self) -> &'static str {
        match self {
            FlagState::Open => "open",
            FlagState::Acknowledged => "acknowledged",
            FlagState::Resolved => "resolved",
            FlagState::Dismissed => "dismissed",
        }
    }

    /// The `action` of `POST /api/v1/flags/{id}` that sets this state (`open`: `reopen`, since
    /// a flag starts open with no row).
    pub fn action(self) -> &'static str {
        match self {
            FlagState::Open => "reopen",
            FlagState::Acknowledged => "acknowledge",
            FlagState::Resolved => "resolve",
            FlagState::Dismissed => "dismiss",
        }
    }
}

impl FromStr for FlagState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "open" => Ok(FlagState::Open),
            "acknowledged" => Ok(FlagState::Acknowledged),
            "resolved" => Ok(FlagState::Resolved),
            "dismissed" => Ok(FlagState::Dismissed),
            other => Err(format!(
                "unknown flag state {other:?}; expected open, acknowledged, resolved or dismissed"
            )),
        }
    }
}

/// One appended row of a flag's history: who acted, when, with what note, and whether the
/// actor acted on a flag raised on their own history ([`flag_rules`]). A state action sets
/// `state`; an assignment (`assignment`) keeps the state the flag had and sets `assignee`
/// (`None`: unassigned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagStateRecord {
    pub state: FlagState,
    pub actor: String,
    pub at: Micros,
    pub note: Option<String>,
    pub self_action: bool,
    /// The row is an assignment, not a state action.
    pub assignment: bool,
    /// The assigned user's id (assignments only; `None`: unassigned).
    pub assignee: Option<String>,
    /// That user's email (emails never change: users are insert-only).
    pub assignee_email: Option<String>,
}

impl FlagStateRecord {
    fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "action": if self.assignment { "assign" } else { self.state.action() },
            "state": self.state,
            "actor": self.actor,
            "at": format_micros(self.at),
            "note": self.note,
            "self": self.self_action,
        });
        if self.assignment
            && let Some(o) = v.as_object_mut()
        {
            o.insert("assignee".into(), serde_json::json!(self.assignee));
            o.insert("assignee_email".into(), serde_json::json!(self.assignee_email));
        }
        v
    }
}

/// A stored flag with its current state (the latest of `history`, else open).
#[derive(Debug, Clone, PartialEq)]
pub struct Flag {
    pub id: String,
    pub rule_id: String,
    pub title: String,
    pub severity: Severity,
    pub user_id: String,
    pub session: Option<String>,
    pub detail: String,
    pub created_at: Micros,
    pub state: FlagState,
    pub note: Option<String>,
    pub event_pks: Vec<i64>,
    /// Every appended row (states and assignments), oldest first.
    pub history: Vec<FlagStateRecord>,
    /// The latest assignment's assignee (`None`: never assigned, or unassigned).
    pub assignee: Option<String>,
    pub assignee_email: Option<String>,
}

impl Flag {
    /// Sets `history` and from it the current `state` and `note` (the latest row's: an
    /// assignment carries the state it kept) and the assignee (the latest assignment's).
    pub fn with_history(mut self, history: Vec<FlagStateRecord>) -> Self {
        let latest = history.last();
        self.state = latest.map_or(FlagState::Open, |h| h.state);
        self.note = latest.and_then(|h| h.note.clone());
        let assigned = history.iter().rev().find(|h| h.assignment);
        self.assignee = assigned.and_then(|h| h.assignee.clone());
        self.assignee_email = assigned.and_then(|h| h.assignee_email.clone());
        self.history = history;
        self
    }

    pub fn to_json(&self) -> serde_json::Value {
        let latest = self.history.last();
        serde_json::json!({
            "id": self.id,
            "rule_id": self.rule_id,
            "title": self.title,
            "severity": self.severity,
            "user_id": self.user_id,
            "session": self.session,
            "detail": self.detail,
            "created_at": format_micros(self.created_at),
            "state": self.state,
            "note": self.note,
            "actor": latest.map(|h| h.actor.as_str()),
            "self": latest.is_some_and(|h| h.self_action),
            "assignee": self.assignee,
            "assignee_email": self.assignee_email,
            "history": self.history.iter().map(FlagStateRecord::to_json).collect::<Vec<_>>(),
            "events": self.event_pks,
        })
    }
}
