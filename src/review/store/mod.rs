//! The review store: one insert-only contract ([`Store`]) with two implementations —
//! [`sqlite::SqliteStore`] (embedded, one file under the data dir) and
//! [`postgres::PgStore`] (teams; partitioned; least-privileged roles per docs/review.md
//! "Grants", TLS and session settings in [`pg_tls`]).
//! Both pass the same conformance suite (`tests/it/review_store.rs`).
//!
//! Nothing is ever updated or deleted: token revocations, role changes and flag states are
//! appended rows, and the "current" value is the latest row.

pub mod pg_tls;
pub mod postgres;
pub mod sqlite;

use super::correlate::CorrelateScan;
use super::detect::session::{SessionRow, SessionScan, covers_of};
use super::gates::{Decided, DecisionRequest, Gate, GateQuery, GateState, NewGate};
use super::{
    Flag, FlagState, Inserted, Micros, NewEvent, NewFlag, Role, Source, StoredEvent, User,
};
use std::future::Future;
use std::sync::Arc;

/// Errors from a store. `Unavailable` maps to HTTP 503; the rest are the caller's mistake or
/// a bug and are reported with what went wrong.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("review store unavailable: {0}")]
    Unavailable(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotFound(String),
    /// The store itself refused the caller (PostgreSQL's flag-state function: credential or
    /// role); HTTP 403.
    #[error("{0}")]
    Forbidden(String),
    /// The store refused the request's content (PostgreSQL's flag-assignment function: an
    /// assignee who is unknown or not a reviewer/admin); HTTP 400.
    #[error("{0}")]
    Invalid(String),
    #[error("review store error: {0}")]
    Other(String),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        match e {
            rusqlite::Error::SqliteFailure(code, _)
                if matches!(
                    code.code,
                    rusqlite::ErrorCode::DatabaseBusy
                        | rusqlite::ErrorCode::DatabaseLocked
                        | rusqlite::ErrorCode::CannotOpen
                        | rusqlite::ErrorCode::DiskFull
                ) =>
            {
                StoreError::Unavailable(e.to_string())
            }
            other => StoreError::Other(other.to_string()),
        }
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        if e.is_closed() || e.as_db_error().is_none() {
            return StoreError::Unavailable(e.to_string());
        }
        match e.as_db_error() {
            Some(db) => StoreError::Other(format!("{}: {}", db.code().code(), db.message())),
            None => StoreError::Other(e.to_string()),
        }
    }
}

/// Test hook (feature `test-hooks`): the ingest step at which the server aborts, as a
/// `kill -9` there would (`after-events`, `after-flags`, `after-commit`); the crash tests use it
/// to prove no stored event is ever left without its flags.
pub const TEST_CRASH_AT_VAR: &str = "AIRLOCK_TEST_REVIEW_CRASH_AT";

/// Aborts the process when [`TEST_CRASH_AT_VAR`] names `step` (only in `test-hooks` builds;
/// elsewhere a no-op). `abort` skips destructors and SQLite's close, like a `SIGKILL`.
pub(crate) fn crash_point(step: &str) {
    #[cfg(feature = "test-hooks")]
    if std::env::var(TEST_CRASH_AT_VAR).is_ok_and(|v| v == step) {
        eprintln!("airlockd: test hook: aborting at ingest step {step}");
        std::process::abort();
    }
    #[cfg(not(feature = "test-hooks"))]
    let _ = step;
}

/// Filters for reading events; `after` is the cursor (a `pk`, with `after_ts` under
/// [`EventOrder::Ts`]); results are in the order `order` names.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    pub user_id: Option<String>,
    pub source: Option<Source>,
    pub session: Option<String>,
    /// Inclusive lower bound on `received_at`.
    pub since: Option<Micros>,
    /// Exclusive upper bound on `received_at`.
    pub until: Option<Micros>,
    /// Inclusive lower bound on the event's own `ts`.
    pub ts_since: Option<Micros>,
    /// Exclusive upper bound on the event's own `ts`.
    pub ts_until: Option<Micros>,
    /// `Some(true)`: only events linked to a flag; `Some(false)`: only unflagged.
    pub flagged: Option<bool>,
    /// Only these event `type`s (empty: any).
    pub kinds: Vec<String>,
    /// Events of this Airlock session: its egress and session records (envelope `session`)
    /// and the transcript lines its end record covered (`airlock_session`).
    pub any_session: Option<String>,
    pub order: EventOrder,
    /// Under [`EventOrder::Ts`]: newest first, the cursor reading rows strictly *before*
    /// `(after_ts, after)` (the console's timeline).
    pub descending: bool,
    pub after: Option<i64>,
    /// Under [`EventOrder::Ts`], the cursor's `ts`: rows strictly after `(after_ts, after)`.
    pub after_ts: Option<Micros>,
    pub limit: u32,
    /// Byte budget for the page's payloads (see [`Store::query_event_page`]); `None`: none.
    pub max_bytes: Option<u64>,
}

/// The order of an event listing; the keyset cursor follows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EventOrder {
    /// Store order (`pk`, assigned at receipt): the default.
    #[default]
    Received,
    /// The event's own `ts`, ties by `pk`.
    Ts,
}

/// Rows per page when a store reads a session in pages.
pub const SESSION_PAGE: i64 = 10_000;

/// A session row from its columns (`source` as stored text).
pub(crate) fn session_row(
    pk: i64,
    source: &str,
    ts: Micros,
    seq: Option<i64>,
    boot: Option<String>,
    suppressed: Option<&str>,
) -> SessionRow {
    // Only valid sources are ever inserted; External is an inert fallback.
    let source = source.parse().unwrap_or(Source::External);
    let covers = suppressed.map(|p| covers_of(source, p)).unwrap_or_default();
    SessionRow { pk, source, ts, seq, boot, covers }
}

/// The payload column as the session scan reads it: only an egress payload that may be a
/// `suppressed` line (audit lines are at most 8 KiB), `NULL` for every other row, so the scan
/// still reads envelopes only.
/// The correlate pack's two reads of one session ([`Store::scan_correlate`]), each in `pk`
/// order from `pk > {3}`, served by `events_session` and `events_transcript`: the Airlock
/// session's egress lines and session records (end record, `transcript.file` items), then
/// the transcript lines linked to it. Columns: pk, source, id, type, ts, received_at (µs),
/// file, payload; `{rcv}` is the store's µs expression for `received_at`.
pub(crate) const CORRELATE_SESSION_ROWS: &str = "SELECT pk, source, id, type, ts, {rcv}, file, \
     payload FROM events WHERE user_id = {1} AND session = {2} AND source IN ('egress', 'session') \
     AND conflict_of IS NULL AND pk > {3} ORDER BY pk LIMIT {4}";
///
/// The transcript read orders and pages by `pk + 0`, not `pk`: with `pk` itself SQLite walks
/// `events_user` (user_id, pk) in order — every event the user ever sent, per page — instead
/// of the `events_transcript` index and a sort of the session's lines (the embedded ingest
/// slowed as the store grew; docs/BENCHMARKS.md). PostgreSQL chose the index either way.
pub(crate) const CORRELATE_TRANSCRIPT_ROWS: &str = "SELECT pk, source, id, type, ts, {rcv}, file, \
     payload FROM events WHERE user_id = {1} AND airlock_session = {2} \
     AND source IN ('claude', 'codex') AND conflict_of IS NULL AND pk + 0 > {3} \
     ORDER BY pk + 0 LIMIT {4}";

pub(crate) const SUPPRESSED_PAYLOAD_SQL: &str =
    "CASE WHEN source = 'egress' AND strpos(payload, '\"seqs\"') > 0 THEN payload END";

/// Bytes counted per row on top of its payload against [`EventQuery::max_bytes`]: the
/// envelope's fields (ids and session are at most 256 bytes each, docs/api.md).
pub const ROW_OVERHEAD: u64 = 1024;

/// One page of events and whether the byte budget ended it before `limit` rows.
#[derive(Debug, Clone, Default)]
pub struct EventPage {
    pub events: Vec<StoredEvent>,
    /// The budget stopped the page with more matching rows within `limit`.
    pub truncated: bool,
}

impl EventQuery {
    /// The `WHERE`…`LIMIT` tail of phase one of a page read (`pk`, `ts` and payload length
    /// only, over `events e`) and its arguments; `received(op, ph)` writes a comparison of
    /// `received_at` (the stores keep it in different types).
    pub(crate) fn sql_tail(
        &self,
        placeholder: fn(usize) -> String,
        received: fn(&str, &str) -> String,
    ) -> (String, Vec<FlagArg>) {
        let mut sql = String::from(" WHERE 1=1");
        let mut args = Vec::new();
        let mut bind = |sql: &mut String, clause: &dyn Fn(&str) -> String, arg: FlagArg| {
            args.push(arg);
            sql.push_str(&clause(&placeholder(args.len())));
        };
        if let Some(u) = &self.user_id {
            bind(&mut sql, &|p| format!(" AND e.user_id = {p}"), FlagArg::Text(u.clone()));
        }
        if let Some(s) = self.source {
            bind(&mut sql, &|p| format!(" AND e.source = {p}"), FlagArg::Text(s.as_str().into()));
        }
        if let Some(s) = &self.session {
            bind(&mut sql, &|p| format!(" AND e.session = {p}"), FlagArg::Text(s.clone()));
        }
        if let Some(t) = self.since {
            bind(&mut sql, &|p| format!(" AND {}", received(">=", p)), FlagArg::Time(t));
        }
        if let Some(t) = self.until {
            bind(&mut sql, &|p| format!(" AND {}", received("<", p)), FlagArg::Time(t));
        }
        if let Some(t) = self.ts_since {
            bind(&mut sql, &|p| format!(" AND e.ts >= {p}"), FlagArg::Int(t));
        }
        if let Some(t) = self.ts_until {
            bind(&mut sql, &|p| format!(" AND e.ts < {p}"), FlagArg::Int(t));
        }
        if !self.kinds.is_empty() {
            sql.push_str(" AND e.type IN (");
            for (i, k) in self.kinds.iter().enumerate() {
                if i > 0 {
                    sql.push_str(", ");
                }
                bind(&mut sql, &|p| p.to_string(), FlagArg::Text(k.clone()));
            }
            sql.push(')');
        }
        if let Some(s) = &self.any_session {
            bind(&mut sql, &|p| format!(" AND (e.session = {p}"), FlagArg::Text(s.clone()));
            bind(&mut sql, &|p| format!(" OR e.airlock_session = {p})"), FlagArg::Text(s.clone()));
        }
        let desc = self.descending && self.order == EventOrder::Ts;
        match (self.order, self.after, self.after_ts) {
            (EventOrder::Ts, Some(pk), Some(ts)) if desc => {
                bind(&mut sql, &|p| format!(" AND (e.ts < {p}"), FlagArg::Int(ts));
                bind(&mut sql, &|p| format!(" OR (e.ts = {p}"), FlagArg::Int(ts));
                bind(&mut sql, &|p| format!(" AND e.pk < {p}))"), FlagArg::Int(pk));
            }
            (EventOrder::Ts, Some(pk), Some(ts)) => {
                bind(&mut sql, &|p| format!(" AND (e.ts > {p}"), FlagArg::Int(ts));
                bind(&mut sql, &|p| format!(" OR (e.ts = {p}"), FlagArg::Int(ts));
                bind(&mut sql, &|p| format!(" AND e.pk > {p}))"), FlagArg::Int(pk));
            }
            (_, Some(pk), _) => bind(&mut sql, &|p| format!(" AND e.pk > {p}"), FlagArg::Int(pk)),
            _ => {}
        }
        match self.flagged {
            Some(true) => {
                sql.push_str(" AND EXISTS (SELECT 1 FROM flag_events fe WHERE fe.event_pk = e.pk)")
            }
            Some(false) => sql.push_str(
                " AND NOT EXISTS (SELECT 1 FROM flag_events fe WHERE fe.event_pk = e.pk)",
            ),
            None => {}
        }
        let order = match self.order {
            EventOrder::Received => " ORDER BY e.pk",
            EventOrder::Ts if desc => " ORDER BY e.ts DESC, e.pk DESC",
            EventOrder::Ts => " ORDER BY e.ts, e.pk",
        };
        sql.push_str(order);
        bind(&mut sql, &|p| format!(" LIMIT {p}"), FlagArg::Int(i64::from(self.limit)));
        (sql, args)
    }

    /// How many of phase one's rows (payload lengths in order) fit the budget: at least one,
    /// so a page always makes progress, and with it whether the budget cut the page short.
    pub(crate) fn within_budget(&self, lengths: impl IntoIterator<Item = i64>) -> (usize, bool) {
        let Some(budget) = self.max_bytes else {
            return (usize::MAX, false);
        };
        let mut used = 0u64;
        for (k, len) in lengths.into_iter().enumerate() {
            used = used.saturating_add(len.max(0) as u64 + ROW_OVERHEAD);
            if k > 0 && used > budget {
                return (k, true);
            }
        }
        (usize::MAX, false)
    }
}

/// Phase two of a page read: the rows fetched by `pk` (in any order) put back in phase one's
/// order; a row that is missing (it cannot be: events are never deleted) is skipped.
pub(crate) fn in_phase_order(pks: &[i64], rows: Vec<StoredEvent>) -> Vec<StoredEvent> {
    let mut by_pk: std::collections::HashMap<i64, StoredEvent> =
        rows.into_iter().map(|e| (e.pk, e)).collect();
    pks.iter().filter_map(|pk| by_pk.remove(pk)).collect()
}

/// What `/people` shows of one person, counted by the store ([`Store::person_activity`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PersonActivity {
    pub user_id: String,
    /// Per day of the week asked for (by the events' own `ts`, oldest day first): events, and
    /// denied egress attempts among them.
    pub daily: [(u64, u64); 7],
    /// When the server last received an event of this person.
    pub last_received: Option<Micros>,
    /// Open flags by severity (`critical`, `high`, …).
    pub open_flags: Vec<(String, u64)>,
}

/// One hour of a person's timeline chart ([`Store::hour_counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HourCount {
    /// Hours since the chart's start.
    pub hour: i64,
    pub allowed: u64,
    pub denied: u64,
    pub transcript: u64,
    /// Flag links of the hour's events.
    pub flags: u64,
}

/// An egress attempt the policy refused, as SQL over `events e` (`{strpos}` is the backend's
/// substring function): its payload lacks `"allowed":true`. Payloads are kept as received and
/// the capture plane writes audit lines compactly, so this is the audit line's own field; the
/// chart and `/people` count with it (cheap over a week of everyone), while the timeline's
/// rows and its decision filter read the parsed payload. An action gate's step lines (type
/// `gate`) are not attempts: they count as neither.
pub(crate) const DENIED_SQL: &str = "(e.source = 'egress' AND e.type <> 'gate' AND \
     {strpos}(e.payload, '\"allowed\":true') = 0)";
/// The converse of [`DENIED_SQL`].
pub(crate) const ALLOWED_SQL: &str = "(e.source = 'egress' AND e.type <> 'gate' AND \
     {strpos}(e.payload, '\"allowed\":true') > 0)";

/// `/people`'s per-day counts of one user (`{1}` user, `{2}` week start, `{3}` its end).
pub(crate) fn activity_sql(strpos: &str, ph: fn(usize) -> String) -> String {
    format!(
        "SELECT (e.ts - {p2}) / 86400000000 AS d, count(*), \
         sum(CASE WHEN {denied} THEN 1 ELSE 0 END) FROM events e \
         WHERE e.user_id = {p1} AND e.ts >= {p2} AND e.ts < {p3} GROUP BY d",
        denied = DENIED_SQL.replace("{strpos}", strpos),
        p1 = ph(1),
        p2 = ph(2),
        p3 = ph(3)
    )
}

/// The timeline chart's counts (`{1}` user, `{2}` start, `{3}` end), per hour.
pub(crate) fn hour_counts_sql(strpos: &str, ph: fn(usize) -> String) -> String {
    format!(
        "SELECT (e.ts - {p2}) / 3600000000 AS h, \
         sum(CASE WHEN {allowed} THEN 1 ELSE 0 END), sum(CASE WHEN {denied} THEN 1 ELSE 0 END), \
         sum(CASE WHEN e.source IN ('claude', 'codex') THEN 1 ELSE 0 END), \
         CAST(sum((SELECT count(*) FROM flag_events fe WHERE fe.event_pk = e.pk)) AS BIGINT) \
         FROM events e \
         WHERE e.user_id = {p1} AND e.ts >= {p2} AND e.ts < {p3} GROUP BY h",
        allowed = ALLOWED_SQL.replace("{strpos}", strpos),
        denied = DENIED_SQL.replace("{strpos}", strpos),
        p1 = ph(1),
        p2 = ph(2),
        p3 = ph(3)
    )
}

/// A user's open flags by severity (`{1}` user).
pub(crate) fn open_flags_sql(ph: fn(usize) -> String) -> String {
    format!(
        "SELECT f.severity, count(*) FROM flags f WHERE f.user_id = {} AND coalesce((SELECT \
         s.state FROM flag_states s WHERE s.flag_id = f.id ORDER BY s.n DESC LIMIT 1), 'open') \
         = 'open' GROUP BY f.severity",
        ph(1)
    )
}

/// Folds per-day rows of [`activity_sql`] into a week.
pub(crate) fn week_of(rows: impl IntoIterator<Item = (i64, i64, i64)>) -> [(u64, u64); 7] {
    let mut week = [(0u64, 0u64); 7];
    for (d, n, denied) in rows {
        if let Some(slot) = usize::try_from(d).ok().and_then(|d| week.get_mut(d)) {
            *slot = (n.max(0) as u64, denied.max(0) as u64);
        }
    }
    week
}

/// One `transcript.file` item as the comparison reads it: the latest received for its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedFile {
    pub file: String,
    /// The item's payload text (`{airlock_session, file, bytes, sha256}`, checked at ingest).
    pub payload: String,
    pub received_at: Micros,
}

/// What [`Store::session_transcript_items`] reads for one user's Airlock session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionTranscriptItems {
    /// The payload of the session's end record (`<session>:end`, the original: a conflicting
    /// resend does not replace it), if stored.
    pub end_record: Option<String>,
    /// Per file, the `transcript.file` item with the highest `pk`, in byte order of `file`;
    /// at most the `max_files` asked for.
    pub published: Vec<PublishedFile>,
}

/// The `WHERE` of a session's `transcript.file` items (both stores; `?1`/`$1` user, `?2`/`$2`
/// session), served by the `events_transcript` index.
pub(crate) const TRANSCRIPT_FILE_ROWS: &str = "user_id = {1} AND airlock_session = {2} \
     AND source = 'session' AND type = 'transcript.file'";

/// The `WHERE` of a session's transcript lines (not conflicts: each line's id once).
pub(crate) const TRANSCRIPT_LINE_ROWS: &str = "user_id = {1} AND airlock_session = {2} \
     AND source IN ('claude', 'codex') AND conflict_of IS NULL";

/// What [`Store::open_gate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// Stored with its `gate.requested` event.
    Gate(Box<Gate>),
    /// The requester's session already has this many pending gates (nothing stored).
    SessionLimit(usize),
    /// The requester already has this many pending gates (nothing stored).
    UserLimit(usize),
}

/// The pending caps [`Store::open_gate`] applies inside its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateCaps {
    pub per_session: usize,
    pub per_user: usize,
}

/// The columns a gate is read with, over `gates g JOIN users u ON u.id = g.user_id LEFT JOIN
/// gate_decisions d ON d.gate_id = g.id LEFT JOIN users a ON a.id = d.actor`; `{requested}`,
/// `{deadline}` and `{at}` are the backend's expressions for those times in microseconds.
pub(crate) const GATE_COLS: &str = "g.n, g.id, g.user_id, u.email, g.kind, g.session, g.repo, \
     g.method, g.host, g.port, g.request, g.action, g.digest, g.severity, g.rule, g.layer, \
     g.policy, g.local_id, g.context, g.self_approve, g.timeout_ms, {requested}, {deadline}, \
     d.state, d.actor, a.email, d.note, d.self, d.step_up, {at}";

/// The `FROM` of a gate read.
pub(crate) const GATE_FROM: &str = " FROM gates g JOIN users u ON u.id = g.user_id \
     LEFT JOIN gate_decisions d ON d.gate_id = g.id LEFT JOIN users a ON a.id = d.actor";

/// One gate row's values, in [`GATE_COLS`] order, as both backends read them.
#[derive(Debug, Clone)]
pub(crate) struct GateRowValues {
    pub n: i64,
    pub id: String,
    pub user_id: String,
    pub email: String,
    pub kind: String,
    pub session: Option<String>,
    pub repo: Option<String>,
    pub method: Option<String>,
    pub host: Option<String>,
    pub port: Option<i64>,
    pub request: Option<String>,
    pub action: String,
    pub digest: String,
    pub severity: String,
    pub rule: Option<String>,
    pub layer: Option<String>,
    pub policy: Option<String>,
    pub local_id: Option<String>,
    pub context: Option<String>,
    pub self_approve: bool,
    pub timeout_ms: i64,
    pub requested_at: Micros,
    pub deadline: Micros,
    pub state: Option<String>,
    pub actor: Option<String>,
    pub actor_email: Option<String>,
    pub note: Option<String>,
    pub self_decided: Option<bool>,
    pub step_up: Option<bool>,
    pub at: Option<Micros>,
}

impl GateRowValues {
    /// The gate these values describe; a value the schema's checks would never let in is a
    /// store error.
    pub(crate) fn into_gate(self) -> Result<Gate, StoreError> {
        use super::gates::{Decision, GateKind};
        let bad = |what: &str| StoreError::Other(format!("gate {} has a bad {what}", self.id));
        let kind = GateKind::parse(&self.kind).ok_or_else(|| bad("kind"))?;
        let severity =
            crate::gate::Severity::parse(&self.severity).ok_or_else(|| bad("severity"))?;
        let decision = match (&self.state, self.at) {
            (Some(s), Some(at)) => Some(Decision {
                state: GateState::parse(s).ok_or_else(|| bad("decision state"))?,
                actor: self.actor.clone(),
                actor_email: self.actor_email.clone(),
                note: self.note.clone(),
                self_decided: self.self_decided.unwrap_or(false),
                step_up: self.step_up.unwrap_or(false),
                at,
            }),
            _ => None,
        };
        let port = match self.port {
            Some(p) => Some(u16::try_from(p).map_err(|_| bad("port"))?),
            None => None,
        };
        Ok(Gate {
            n: self.n,
            user_email: self.email,
            requested_at: self.requested_at,
            deadline: self.deadline,
            decision,
            gate: NewGate {
                id: self.id,
                user_id: self.user_id,
                kind,
                session: self.session,
                repo: self.repo,
                method: self.method,
                host: self.host,
                port,
                request: self.request,
                action: self.action,
                digest: self.digest,
                severity,
                rule: self.rule,
                layer: self.layer,
                policy: self.policy,
                local_id: self.local_id,
                context: self.context,
                self_approve: self.self_approve,
                timeout_ms: self.timeout_ms,
            },
        })
    }
}

impl GateQuery {
    /// The `WHERE`…`LIMIT` tail of a gate listing and its arguments, with placeholders from
    /// `placeholder(n)`; `now` is the backend's current time as a value comparable with
    /// `g.deadline` (an expression, or `None` to bind [`FlagArg::Time`] of `now_us`).
    pub(crate) fn sql_tail(
        &self,
        placeholder: fn(usize) -> String,
        now: Option<&str>,
        now_us: Micros,
    ) -> (String, Vec<FlagArg>) {
        let mut sql = String::from(" WHERE 1=1");
        let mut args = Vec::new();
        let mut bind = |sql: &mut String, clause: &str, arg: FlagArg| {
            args.push(arg);
            sql.push_str(&clause.replace("{}", &placeholder(args.len())));
        };
        if let Some(u) = &self.user_id {
            bind(&mut sql, " AND g.user_id = {}", FlagArg::Text(u.clone()));
        }
        if let Some(s) = &self.session {
            bind(&mut sql, " AND g.session = {}", FlagArg::Text(s.clone()));
        }
        if let Some(state) = self.state {
            match state {
                GateState::Pending | GateState::Expired => {
                    let clause = if state == GateState::Pending {
                        " AND d.gate_id IS NULL AND g.deadline > {}"
                    } else {
                        " AND (d.state = 'expired' OR (d.gate_id IS NULL AND g.deadline <= {}))"
                    };
                    match now {
                        Some(expr) => sql.push_str(&clause.replace("{}", expr)),
                        None => bind(&mut sql, clause, FlagArg::Int(now_us)),
                    }
                }
                other => {
                    bind(&mut sql, " AND d.state = {}", FlagArg::Text(other.as_str().to_owned()))
                }
            }
        }
        let desc = !self.ascending;
        if let Some(a) = self.after {
            let op = if desc { "<" } else { ">" };
            bind(&mut sql, &format!(" AND g.n {op} {{}}"), FlagArg::Int(a));
        }
        sql.push_str(if desc { " ORDER BY g.n DESC" } else { " ORDER BY g.n" });
        bind(&mut sql, " LIMIT {}", FlagArg::Int(i64::from(self.limit)));
        (sql, args)
    }
}

/// Filters for reading flags.
#[derive(Debug, Clone, Default)]
pub struct FlagQuery {
    pub user_id: Option<String>,
    pub state: Option<FlagState>,
    pub rule_id: Option<String>,
    /// The latest assignment's assignee.
    pub assignee: Option<AssigneeFilter>,
    /// Cursor: flags created strictly after this store row number.
    pub after: Option<i64>,
    pub limit: u32,
}

/// `GET /api/v1/flags?assignee=`: flags whose latest assignment names this user, or flags
/// nobody is assigned to (never assigned, or unassigned since).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssigneeFilter {
    User(String),
    Unassigned,
}

/// A value bound into a flag listing, before conversion to a backend's parameter type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FlagArg {
    Text(String),
    Int(i64),
    /// A `received_at` bound (SQLite: integer micros; PostgreSQL: RFC 3339 text).
    Time(Micros),
}

impl FlagQuery {
    /// The `WHERE`…`LIMIT` tail of a flag listing over `flags f` and its arguments in order, with
    /// placeholders written by `placeholder(n)` (`$n` for PostgreSQL, `?n` for SQLite), so both
    /// backends filter identically. A flag's state is its latest `flag_states` row, else open.
    pub(crate) fn sql_tail(&self, placeholder: fn(usize) -> String) -> (String, Vec<FlagArg>) {
        let mut sql = String::from(" WHERE 1=1");
        let mut args = Vec::new();
        let mut bind = |sql: &mut String, clause: &str, arg: FlagArg| {
            args.push(arg);
            sql.push_str(&clause.replace("{}", &placeholder(args.len())));
        };
        if let Some(u) = &self.user_id {
            bind(&mut sql, " AND f.user_id = {}", FlagArg::Text(u.clone()));
        }
        if let Some(r) = &self.rule_id {
            bind(&mut sql, " AND f.rule_id = {}", FlagArg::Text(r.clone()));
        }
        // The latest assignment row's assignee (NULL when none, or unassigned).
        const ASSIGNEE: &str = "(SELECT assignee FROM flag_states s WHERE s.flag_id = f.id \
             AND s.assignment ORDER BY n DESC LIMIT 1)";
        match &self.assignee {
            Some(AssigneeFilter::User(u)) => {
                bind(&mut sql, &format!(" AND {ASSIGNEE} = {{}}"), FlagArg::Text(u.clone()))
            }
            Some(AssigneeFilter::Unassigned) => sql.push_str(&format!(" AND {ASSIGNEE} IS NULL")),
            None => {}
        }
        if let Some(a) = self.after {
            bind(&mut sql, " AND f.n > {}", FlagArg::Int(a));
        }
        if let Some(s) = self.state {
            bind(
                &mut sql,
                " AND coalesce((SELECT state FROM flag_states s WHERE s.flag_id = f.id \
                 ORDER BY n DESC LIMIT 1), 'open') = {}",
                FlagArg::Text(s.as_str().to_owned()),
            );
        }
        bind(&mut sql, " ORDER BY f.n LIMIT {}", FlagArg::Int(i64::from(self.limit)));
        (sql, args)
    }
}

/// Detection that [`Store::ingest`] runs inside its transaction, so an event, its dedup key
/// and its flags are committed together or not at all (a crash between "events stored" and
/// "flags stored" would leave events that a retry answers `duplicate` and nothing rescans).
/// Methods are synchronous: the store calls them between its own statements.
pub trait IngestScan: Send + Sync + 'static {
    /// Flags over the batch, given the store's result for each event (input order).
    fn batch_flags(&self, inserted: &[Inserted]) -> Vec<NewFlag>;
    /// Sessions this batch ended, whose span and gap checks run in the same transaction.
    fn ended_sessions(&self, inserted: &[Inserted]) -> Vec<String>;
    /// Flags over one ended session, from the scan the store fed with the session's events
    /// ([`Store::scan_session`]'s reading, inside the transaction, so the batch's own rows
    /// are included).
    fn session_flags(&self, scan: SessionScan) -> Vec<NewFlag>;
    /// The correlate pack's scan for an ended session, or `None` when the pack is off (then
    /// the store reads nothing more).
    fn correlate_scan(&self, session: &str) -> Option<CorrelateScan> {
        let _ = session;
        None
    }
    /// Flags from the correlate scan the store fed ([`Store::scan_correlate`]'s reading,
    /// inside the transaction).
    fn correlate_flags(&self, scan: CorrelateScan) -> Vec<NewFlag> {
        scan.finish()
    }
}

/// One flag-state append, as the server decided it.
#[derive(Debug, Clone, Copy)]
pub struct FlagAction<'a> {
    pub flag_id: &'a str,
    pub state: FlagState,
    pub note: Option<&'a str>,
    /// The authenticated user acting.
    pub actor: &'a str,
    /// The actor acts on a flag raised on their own history and the caller allowed it
    /// ([`crate::review::flag_rules::decide`]: sole reviewer/admin, or an admin's override).
    pub self_action: bool,
    /// The bearer token the actor presented: PostgreSQL re-checks it in the database, records
    /// its user as the actor and applies the self-action rule again (`airlock_flag_state`,
    /// with `self_action` as its `override`); the embedded store records `actor`.
    pub secret: &'a str,
    pub at: Micros,
}

/// One assignment append, as the server decided it: a history row that keeps the flag's
/// current state and names `assignee` (`None`: unassign). Checks as [`FlagAction`].
#[derive(Debug, Clone, Copy)]
pub struct FlagAssignment<'a> {
    pub flag_id: &'a str,
    /// The assigned user's id (the server checked they are a reviewer or admin;
    /// PostgreSQL checks again in `airlock_flag_assign`).
    pub assignee: Option<&'a str>,
    pub note: Option<&'a str>,
    pub actor: &'a str,
    pub self_action: bool,
    pub secret: &'a str,
    pub at: Micros,
}

/// A console session as stored, with what its validity is judged against
/// ([`crate::review::console::auth::judge`]): the role and auth epoch recorded at sign-in and
/// the user's current ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSessionRow {
    /// The user with their current role.
    pub user: User,
    pub role_at_login: Role,
    pub epoch_at_login: i64,
    /// The user's auth epoch now: their token revocations plus password changes. Any change
    /// since sign-in ends the session.
    pub epoch_now: i64,
    pub created_at: Micros,
    /// The latest "seen" mark, else `created_at`.
    pub last_seen: Micros,
    /// Whether the session was ended (logout).
    pub ended: bool,
}

/// One leaf of the review log (docs/evidence.md): its index and hash, the event row it
/// commits to and the leaf's preimage fields ([`crate::tlog::EventLeaf`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLeaf {
    pub index: u64,
    pub event_pk: i64,
    pub hash: crate::tlog::Hash,
    pub user_id: String,
    pub source: String,
    pub id: String,
    pub received_at: Micros,
    pub payload_sha256: crate::tlog::Hash,
}

/// The stored tree: its size and root, and how many leaves the call appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogHead {
    pub size: u64,
    pub root: crate::tlog::Hash,
    pub appended: u64,
}

/// A checkpoint the server signed, as stored (`note`: the whole signed note).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCheckpoint {
    pub size: u64,
    pub root: crate::tlog::Hash,
    pub note: String,
    pub signed_at: Micros,
}

/// A cosignature the server verified, to record. `key` is the cosigner's verifier key text
/// (`name+id+base64(0x04 || key)`); a key belongs to the first user who posts it.
#[derive(Debug, Clone, Copy)]
pub struct NewCosignature<'a> {
    pub user_id: &'a str,
    pub key: &'a str,
    pub size: u64,
    pub root: crate::tlog::Hash,
    /// The cosigner's own timestamp (Unix seconds, from the signature).
    pub time: u64,
    /// The signature line as posted.
    pub line: &'a str,
    pub at: Micros,
}

/// A stored hash column as a [`crate::tlog::Hash`] (both stores keep them as 32-byte blobs).
pub(crate) fn log_hash(bytes: Vec<u8>, what: &str) -> Result<crate::tlog::Hash, StoreError> {
    bytes.try_into().map_err(|b: Vec<u8>| {
        StoreError::Other(format!("review log: {what} has {} bytes, not 32", b.len()))
    })
}

/// A stored (signed) count or index as `u64`.
pub(crate) fn log_u64(v: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Other(format!("review log: {what} is negative: {v}")))
}

/// A count or index as the stores' signed column type.
pub(crate) fn log_i64(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Other(format!("review log: {v} is out of range")))
}

/// The refusal of log methods by a store that does not keep the log (a test wrapper).
fn no_log<T>() -> Result<T, StoreError> {
    Err(StoreError::Other("this store does not keep the review log".into()))
}

/// The refusal of gate methods by a store that does not implement them (a test wrapper).
fn no_gates<T>() -> Result<T, StoreError> {
    Err(StoreError::Other("this store does not keep action gates".into()))
}

/// The refusal of console methods by a store that does not implement them (a test wrapper).
fn no_console<T>() -> Result<T, StoreError> {
    Err(StoreError::Other("this store does not support console sign-in".into()))
}

/// The user's auth epoch in SQL (both stores; `{u}` is the user id expression): token
/// revocations plus password rows.
pub(crate) const AUTH_EPOCH_SQL: &str = "((SELECT count(*) FROM token_revocations r JOIN tokens t \
     ON t.id = r.token_id WHERE t.user_id = {u}) + (SELECT count(*) FROM user_passwords p \
     WHERE p.user_id = {u}))";

/// The store contract. Methods return `Send` futures so the server can run them on any
/// runtime thread; implementations never update or delete a row.
pub trait Store: Send + Sync + 'static {
    /// Adds a user with a role; `Conflict` if the email exists.
    fn add_user(
        &self,
        email: &str,
        role: Role,
    ) -> impl Future<Output = Result<User, StoreError>> + Send;
    /// Appends a role change.
    fn set_role(
        &self,
        user_id: &str,
        role: Role,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn list_users(&self) -> impl Future<Output = Result<Vec<User>, StoreError>> + Send;
    fn user_by_email(
        &self,
        email: &str,
    ) -> impl Future<Output = Result<Option<User>, StoreError>> + Send;
    fn user_by_id(&self, id: &str)
    -> impl Future<Output = Result<Option<User>, StoreError>> + Send;
    /// Records a token by its SHA-256; the secret itself never reaches the store.
    fn create_token(
        &self,
        token_id: &str,
        user_id: &str,
        hash: [u8; 32],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Appends a revocation; returns false if the token id is unknown.
    fn revoke_token(&self, token_id: &str)
    -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Token ids of a user with whether each is revoked.
    fn list_tokens(
        &self,
        user_id: &str,
    ) -> impl Future<Output = Result<Vec<(String, bool)>, StoreError>> + Send;
    /// The user of a live (unrevoked) token with their current role.
    fn authenticate(
        &self,
        hash: [u8; 32],
    ) -> impl Future<Output = Result<Option<User>, StoreError>> + Send;
    /// Inserts a batch for one user; each event atomically (key and row together), deduped
    /// on `(user, source, id)`. Results are in input order. Within one call, a repeated key
    /// reports the first copy.
    fn insert_events(
        &self,
        user_id: &str,
        received_at: Micros,
        events: &[NewEvent],
    ) -> impl Future<Output = Result<Vec<Inserted>, StoreError>> + Send;
    /// As [`Store::insert_events`], and in the same transaction the flags `scan` derives
    /// from the result: events, keys and flags commit together, and a failure anywhere
    /// (a flag insert included) stores nothing and is returned.
    fn ingest(
        &self,
        user_id: &str,
        received_at: Micros,
        events: &[NewEvent],
        scan: Arc<dyn IngestScan>,
    ) -> impl Future<Output = Result<Vec<Inserted>, StoreError>> + Send;
    /// One page of events: up to `limit` rows in `order`, and with `max_bytes` set, read in
    /// two steps so memory stays bounded: first `pk` and payload length only, then only the
    /// rows whose payloads (plus [`ROW_OVERHEAD`] each) fit the budget — at least one.
    fn query_event_page(
        &self,
        q: &EventQuery,
    ) -> impl Future<Output = Result<EventPage, StoreError>> + Send;
    /// [`Store::query_event_page`]'s rows.
    fn query_events(
        &self,
        q: &EventQuery,
    ) -> impl Future<Output = Result<Vec<StoredEvent>, StoreError>> + Send {
        async move { self.query_event_page(q).await.map(|p| p.events) }
    }
    /// Feeds `scan` its session's span (the `ts` of its start and end records) and then the
    /// session's events in `pk` order, envelope only, until it stops; memory stays bounded
    /// however large the session.
    fn scan_session(
        &self,
        scan: SessionScan,
    ) -> impl Future<Output = Result<SessionScan, StoreError>> + Send;
    /// Feeds the correlate pack's `scan` its session's rows ([`CORRELATE_SESSION_ROWS`], then
    /// [`CORRELATE_TRANSCRIPT_ROWS`]), a page of [`SESSION_PAGE`] rows at a time; the scan
    /// keeps compact facts only and stops keeping past its caps.
    fn scan_correlate(
        &self,
        scan: CorrelateScan,
    ) -> impl Future<Output = Result<CorrelateScan, StoreError>> + Send;
    /// Every event of one user's session, in `pk` order, payloads included: unbounded, for
    /// tests and tools only (the checks use [`Store::scan_session`]).
    fn session_events(
        &self,
        user_id: &str,
        session: &str,
    ) -> impl Future<Output = Result<Vec<StoredEvent>, StoreError>> + Send;
    /// The end record and the `transcript.file` items (latest per file, at most
    /// `max_files`) of `user_id`'s Airlock session `session` ([`SessionTranscriptItems`]).
    fn session_transcript_items(
        &self,
        user_id: &str,
        session: &str,
        max_files: usize,
    ) -> impl Future<Output = Result<SessionTranscriptItems, StoreError>> + Send;
    /// For each of `files` that has any, how many transcript lines (`claude`/`codex` events,
    /// conflicts not counted) are stored with `airlock_session` = `session` and that file.
    fn transcript_line_counts(
        &self,
        user_id: &str,
        session: &str,
        files: &[String],
    ) -> impl Future<Output = Result<Vec<(String, i64)>, StoreError>> + Send;
    /// Inserts flags; an existing flag id is left as it is.
    /// `/people`'s counts for each of `user_ids`, in that order: events and denied attempts
    /// per day of `[week_start, week_start + 7 days)` by `ts`, the latest receipt, open flags.
    fn person_activity(
        &self,
        user_ids: &[String],
        week_start: Micros,
    ) -> impl Future<Output = Result<Vec<PersonActivity>, StoreError>> + Send;
    /// The timeline chart of `user_id`: per hour of `[start, start + hours h)` by `ts`, egress
    /// allowed / denied, transcript lines and flag links; hours without events are left out.
    fn hour_counts(
        &self,
        user_id: &str,
        start: Micros,
        hours: u32,
    ) -> impl Future<Output = Result<Vec<HourCount>, StoreError>> + Send;
    /// How many flags link each of `pks` (events without a flag are left out).
    fn event_flag_counts(
        &self,
        pks: &[i64],
    ) -> impl Future<Output = Result<Vec<(i64, u64)>, StoreError>> + Send;
    fn insert_flags(
        &self,
        flags: &[NewFlag],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn list_flags(
        &self,
        q: &FlagQuery,
    ) -> impl Future<Output = Result<Vec<(i64, Flag)>, StoreError>> + Send;
    fn get_flag(&self, id: &str) -> impl Future<Output = Result<Option<Flag>, StoreError>> + Send;
    /// Appends a state row ([`FlagAction`]); returns false if the flag is unknown.
    fn append_flag_state(
        &self,
        action: &FlagAction<'_>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Appends an assignment row ([`FlagAssignment`]) carrying the flag's state at that moment
    /// (read and written atomically, so a concurrent state action is never undone); returns
    /// false if the flag is unknown.
    fn assign_flag(
        &self,
        assignment: &FlagAssignment<'_>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    // --- Action gates (docs/gates.md "With a review server"). Defaults refuse, so a
    // wrapper store that does not serve gates need not implement them. ---

    /// Opens `gate` (its requester is `gate.user_id`) with its `gate.requested` event, in one
    /// transaction, unless the requester already has `caps` pending gates (in the gate's
    /// session, or in all): then nothing is stored.
    fn open_gate(
        &self,
        _gate: &NewGate,
        _caps: GateCaps,
    ) -> impl Future<Output = Result<Opened, StoreError>> + Send {
        async { no_gates() }
    }
    /// One gate with its decision.
    fn get_gate(&self, _id: &str) -> impl Future<Output = Result<Option<Gate>, StoreError>> + Send {
        async { no_gates() }
    }
    /// Gates matching `q`, in its order.
    fn list_gates(
        &self,
        _q: &GateQuery,
    ) -> impl Future<Output = Result<Vec<Gate>, StoreError>> + Send {
        async { no_gates() }
    }
    /// Records one decision with its `gate.<state>` event, in one transaction, if the gate is
    /// still pending (by the store's clock) and its digest is the one given.
    fn decide_gate(
        &self,
        _d: &DecisionRequest<'_>,
    ) -> impl Future<Output = Result<Decided, StoreError>> + Send {
        async { no_gates() }
    }
    /// Writes the `expired` decision (and its event) of up to `max` gates whose deadline
    /// passed undecided; returns them.
    fn expire_gates(
        &self,
        _max: usize,
    ) -> impl Future<Output = Result<Vec<Gate>, StoreError>> + Send {
        async { no_gates() }
    }

    // --- The review log (docs/evidence.md). Defaults refuse, so a wrapper store that does
    // not keep the log need not implement them. ---

    /// Appends a leaf for up to `max` stored events that have none yet (oldest `pk` first;
    /// commit order is not `pk` order, so it selects by "no leaf row", never by a `pk`
    /// watermark), with the tier hashes they complete, in one transaction; indices are
    /// gapless. PostgreSQL first takes the sequencer's advisory lock (held by one instance
    /// at a time, on a connection kept for it) and answers `Ok(None)` when another instance
    /// holds it. The embedded store also sequences inside [`Store::ingest`]'s transaction.
    fn log_sequence(
        &self,
        _max: usize,
    ) -> impl Future<Output = Result<Option<LogHead>, StoreError>> + Send {
        async { no_log() }
    }
    /// The stored tree's size and root (`appended` 0), without sequencing.
    fn log_head(&self) -> impl Future<Output = Result<LogHead, StoreError>> + Send {
        async { no_log() }
    }
    /// Stored tier hashes `[start, end)` of tier `level` (0: leaf hashes), fewer when the
    /// tree holds fewer; in index order.
    fn log_tier(
        &self,
        _level: u8,
        _start: u64,
        _end: u64,
    ) -> impl Future<Output = Result<Vec<crate::tlog::Hash>, StoreError>> + Send {
        async { no_log() }
    }
    /// The leaves of the events `pks` that have one, in `pks` order.
    fn log_leaves(
        &self,
        _pks: &[i64],
    ) -> impl Future<Output = Result<Vec<LogLeaf>, StoreError>> + Send {
        async { no_log() }
    }
    /// The stored event `(user_id, source, id)` names (the original, for a key with a
    /// conflict): its `pk`, `received_at` and its leaf once sequenced.
    fn log_event_leaf(
        &self,
        _user_id: &str,
        _source: &str,
        _id: &str,
    ) -> impl Future<Output = Result<Option<(i64, Micros, Option<LogLeaf>)>, StoreError>> + Send
    {
        async { no_log() }
    }
    /// Leaves of `user_id` whose event row is gone (an edit by the database's owner), leaf
    /// order, at most `limit`.
    fn log_orphans(
        &self,
        _user_id: &str,
        _limit: u32,
    ) -> impl Future<Output = Result<Vec<LogLeaf>, StoreError>> + Send {
        async { no_log() }
    }
    /// Records a signed checkpoint.
    fn log_add_checkpoint(
        &self,
        _cp: &StoredCheckpoint,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { no_log() }
    }
    /// The latest signed checkpoint (`size` `None`), or the latest one of that size.
    fn log_checkpoint(
        &self,
        _size: Option<u64>,
    ) -> impl Future<Output = Result<Option<StoredCheckpoint>, StoreError>> + Send {
        async { no_log() }
    }
    /// Records a verified cosignature; answers how many distinct keys have cosigned that
    /// tree size. `Conflict` when the key was first posted by another user.
    fn log_add_cosignature(
        &self,
        _c: &NewCosignature<'_>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        async { no_log() }
    }
    /// How many distinct keys cosigned tree size `size`.
    fn log_witnesses(&self, _size: u64) -> impl Future<Output = Result<u64, StoreError>> + Send {
        async { no_log() }
    }
    /// The largest cosigned tree size with its number of distinct cosigning keys.
    fn log_witnessed(&self) -> impl Future<Output = Result<Option<(u64, u64)>, StoreError>> + Send {
        async { no_log() }
    }

    // --- Console sign-in (docs/console.md). Defaults refuse, so a wrapper store that does
    // not serve the console need not implement them. ---

    /// Appends a password (an argon2id PHC string) for a user; the latest is current.
    fn set_password(
        &self,
        _user_id: &str,
        _phc: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { no_console() }
    }
    /// The user's current password PHC string, if one was ever set.
    fn password_of(
        &self,
        _user_id: &str,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send {
        async { no_console() }
    }
    /// Records a one-time invite by the SHA-256 of its token.
    fn create_invite(
        &self,
        _hash: [u8; 32],
        _user_id: &str,
        _expires_at: Micros,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { no_console() }
    }
    /// The user of a usable invite (unused, not expired at `now`).
    fn invite_user(
        &self,
        _hash: [u8; 32],
        _now: Micros,
    ) -> impl Future<Output = Result<Option<User>, StoreError>> + Send {
        async { no_console() }
    }
    /// Consumes a usable invite and sets its user's password in one step; `None` (nothing
    /// written) if the invite is unknown, used or expired.
    fn accept_invite(
        &self,
        _hash: [u8; 32],
        _phc: &str,
        _now: Micros,
    ) -> impl Future<Output = Result<Option<User>, StoreError>> + Send {
        async { no_console() }
    }
    /// Starts a console session (by the SHA-256 of its id) for a user, recording their
    /// current role and auth epoch.
    fn create_console_session(
        &self,
        _hash: [u8; 32],
        _user_id: &str,
        _now: Micros,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { no_console() }
    }
    fn console_session(
        &self,
        _hash: [u8; 32],
    ) -> impl Future<Output = Result<Option<ConsoleSessionRow>, StoreError>> + Send {
        async { no_console() }
    }
    /// Appends a "seen" mark (the idle expiry counts from the latest).
    fn touch_console_session(
        &self,
        _hash: [u8; 32],
        _now: Micros,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { no_console() }
    }
    /// Ends a session (`reason`: `logout`).
    fn end_console_session(
        &self,
        _hash: [u8; 32],
        _reason: &str,
        _now: Micros,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { no_console() }
    }
    /// Records a failed sign-in for an email no user has, in the capped auth log.
    fn auth_log(
        &self,
        _email: &str,
        _address: &str,
        _now: Micros,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { no_console() }
    }
}

/// Either store, chosen at startup (`--database` given or not).
#[derive(Debug, Clone)]
pub enum AnyStore {
    Sqlite(sqlite::SqliteStore),
    Pg(postgres::PgStore),
}

macro_rules! dispatch {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            AnyStore::Sqlite($s) => $e.await,
            AnyStore::Pg($s) => $e.await,
        }
    };
}

impl Store for AnyStore {
    async fn add_user(&self, email: &str, role: Role) -> Result<User, StoreError> {
        dispatch!(self, s => s.add_user(email, role))
    }
    async fn set_role(&self, user_id: &str, role: Role) -> Result<(), StoreError> {
        dispatch!(self, s => s.set_role(user_id, role))
    }
    async fn list_users(&self) -> Result<Vec<User>, StoreError> {
        dispatch!(self, s => s.list_users())
    }
    async fn user_by_email(&self, email: &str) -> Result<Option<User>, StoreError> {
        dispatch!(self, s => s.user_by_email(email))
    }
    async fn user_by_id(&self, id: &str) -> Result<Option<User>, StoreError> {
        dispatch!(self, s => s.user_by_id(id))
    }
    async fn create_token(&self, t: &str, u: &str, h: [u8; 32]) -> Result<(), StoreError> {
        dispatch!(self, s => s.create_token(t, u, h))
    }
    async fn revoke_token(&self, t: &str) -> Result<bool, StoreError> {
        dispatch!(self, s => s.revoke_token(t))
    }
    async fn list_tokens(&self, u: &str) -> Result<Vec<(String, bool)>, StoreError> {
        dispatch!(self, s => s.list_tokens(u))
    }
    async fn authenticate(&self, h: [u8; 32]) -> Result<Option<User>, StoreError> {
        dispatch!(self, s => s.authenticate(h))
    }
    async fn insert_events(
        &self,
        u: &str,
        r: Micros,
        e: &[NewEvent],
    ) -> Result<Vec<Inserted>, StoreError> {
        dispatch!(self, s => s.insert_events(u, r, e))
    }
    async fn ingest(
        &self,
        u: &str,
        r: Micros,
        e: &[NewEvent],
        scan: Arc<dyn IngestScan>,
    ) -> Result<Vec<Inserted>, StoreError> {
        dispatch!(self, s => s.ingest(u, r, e, scan))
    }
    async fn query_event_page(&self, q: &EventQuery) -> Result<EventPage, StoreError> {
        dispatch!(self, s => s.query_event_page(q))
    }
    async fn scan_session(&self, scan: SessionScan) -> Result<SessionScan, StoreError> {
        dispatch!(self, s => s.scan_session(scan))
    }
    async fn scan_correlate(&self, scan: CorrelateScan) -> Result<CorrelateScan, StoreError> {
        dispatch!(self, s => s.scan_correlate(scan))
    }
    async fn session_events(&self, u: &str, sn: &str) -> Result<Vec<StoredEvent>, StoreError> {
        dispatch!(self, s => s.session_events(u, sn))
    }
    async fn session_transcript_items(
        &self,
        u: &str,
        sn: &str,
        max: usize,
    ) -> Result<SessionTranscriptItems, StoreError> {
        dispatch!(self, s => s.session_transcript_items(u, sn, max))
    }
    async fn transcript_line_counts(
        &self,
        u: &str,
        sn: &str,
        files: &[String],
    ) -> Result<Vec<(String, i64)>, StoreError> {
        dispatch!(self, s => s.transcript_line_counts(u, sn, files))
    }
    async fn person_activity(
        &self,
        u: &[String],
        week: Micros,
    ) -> Result<Vec<PersonActivity>, StoreError> {
        dispatch!(self, s => s.person_activity(u, week))
    }
    async fn hour_counts(
        &self,
        u: &str,
        start: Micros,
        h: u32,
    ) -> Result<Vec<HourCount>, StoreError> {
        dispatch!(self, s => s.hour_counts(u, start, h))
    }
    async fn event_flag_counts(&self, pks: &[i64]) -> Result<Vec<(i64, u64)>, StoreError> {
        dispatch!(self, s => s.event_flag_counts(pks))
    }
    async fn insert_flags(&self, f: &[NewFlag]) -> Result<(), StoreError> {
        dispatch!(self, s => s.insert_flags(f))
    }
    async fn list_flags(&self, q: &FlagQuery) -> Result<Vec<(i64, Flag)>, StoreError> {
        dispatch!(self, s => s.list_flags(q))
    }
    async fn get_flag(&self, id: &str) -> Result<Option<Flag>, StoreError> {
        dispatch!(self, s => s.get_flag(id))
    }
    async fn append_flag_state(&self, action: &FlagAction<'_>) -> Result<bool, StoreError> {
        dispatch!(self, s => s.append_flag_state(action))
    }
    async fn assign_flag(&self, a: &FlagAssignment<'_>) -> Result<bool, StoreError> {
        dispatch!(self, s => s.assign_flag(a))
    }
    async fn open_gate(&self, g: &NewGate, caps: GateCaps) -> Result<Opened, StoreError> {
        dispatch!(self, s => s.open_gate(g, caps))
    }
    async fn get_gate(&self, id: &str) -> Result<Option<Gate>, StoreError> {
        dispatch!(self, s => s.get_gate(id))
    }
    async fn list_gates(&self, q: &GateQuery) -> Result<Vec<Gate>, StoreError> {
        dispatch!(self, s => s.list_gates(q))
    }
    async fn decide_gate(&self, d: &DecisionRequest<'_>) -> Result<Decided, StoreError> {
        dispatch!(self, s => s.decide_gate(d))
    }
    async fn expire_gates(&self, max: usize) -> Result<Vec<Gate>, StoreError> {
        dispatch!(self, s => s.expire_gates(max))
    }
    async fn log_sequence(&self, max: usize) -> Result<Option<LogHead>, StoreError> {
        dispatch!(self, s => s.log_sequence(max))
    }
    async fn log_head(&self) -> Result<LogHead, StoreError> {
        dispatch!(self, s => s.log_head())
    }
    async fn log_tier(
        &self,
        level: u8,
        start: u64,
        end: u64,
    ) -> Result<Vec<crate::tlog::Hash>, StoreError> {
        dispatch!(self, s => s.log_tier(level, start, end))
    }
    async fn log_leaves(&self, pks: &[i64]) -> Result<Vec<LogLeaf>, StoreError> {
        dispatch!(self, s => s.log_leaves(pks))
    }
    async fn log_event_leaf(
        &self,
        u: &str,
        source: &str,
        id: &str,
    ) -> Result<Option<(i64, Micros, Option<LogLeaf>)>, StoreError> {
        dispatch!(self, s => s.log_event_leaf(u, source, id))
    }
    async fn log_orphans(&self, u: &str, limit: u32) -> Result<Vec<LogLeaf>, StoreError> {
        dispatch!(self, s => s.log_orphans(u, limit))
    }
    async fn log_add_checkpoint(&self, cp: &StoredCheckpoint) -> Result<(), StoreError> {
        dispatch!(self, s => s.log_add_checkpoint(cp))
    }
    async fn log_checkpoint(
        &self,
        size: Option<u64>,
    ) -> Result<Option<StoredCheckpoint>, StoreError> {
        dispatch!(self, s => s.log_checkpoint(size))
    }
    async fn log_add_cosignature(&self, c: &NewCosignature<'_>) -> Result<u64, StoreError> {
        dispatch!(self, s => s.log_add_cosignature(c))
    }
    async fn log_witnesses(&self, size: u64) -> Result<u64, StoreError> {
        dispatch!(self, s => s.log_witnesses(size))
    }
    async fn log_witnessed(&self) -> Result<Option<(u64, u64)>, StoreError> {
        dispatch!(self, s => s.log_witnessed())
    }
    async fn set_password(&self, u: &str, phc: &str) -> Result<(), StoreError> {
        dispatch!(self, s => s.set_password(u, phc))
    }
    async fn password_of(&self, u: &str) -> Result<Option<String>, StoreError> {
        dispatch!(self, s => s.password_of(u))
    }
    async fn create_invite(&self, h: [u8; 32], u: &str, exp: Micros) -> Result<(), StoreError> {
        dispatch!(self, s => s.create_invite(h, u, exp))
    }
    async fn invite_user(&self, h: [u8; 32], now: Micros) -> Result<Option<User>, StoreError> {
        dispatch!(self, s => s.invite_user(h, now))
    }
    async fn accept_invite(
        &self,
        h: [u8; 32],
        phc: &str,
        now: Micros,
    ) -> Result<Option<User>, StoreError> {
        dispatch!(self, s => s.accept_invite(h, phc, now))
    }
    async fn create_console_session(
        &self,
        h: [u8; 32],
        u: &str,
        now: Micros,
    ) -> Result<(), StoreError> {
        dispatch!(self, s => s.create_console_session(h, u, now))
    }
    async fn console_session(&self, h: [u8; 32]) -> Result<Option<ConsoleSessionRow>, StoreError> {
        dispatch!(self, s => s.console_session(h))
    }
    async fn touch_console_session(&self, h: [u8; 32], now: Micros) -> Result<(), StoreError> {
        dispatch!(self, s => s.touch_console_session(h, now))
    }
    async fn end_console_session(
        &self,
        h: [u8; 32],
        reason: &str,
        now: Micros,
    ) -> Result<(), StoreError> {
        dispatch!(self, s => s.end_console_session(h, reason, now))
    }
    async fn auth_log(&self, email: &str, address: &str, now: Micros) -> Result<(), StoreError> {
        dispatch!(self, s => s.auth_log(email, address, now))
    }
}

/// A fresh random id: 16 bytes as 32 hex digits.
pub fn random_id() -> String {
    let mut b = [0u8; 16];
    // getrandom only fails if the OS has no entropy source; fall back to time-based bytes
    // rather than panic (ids need uniqueness, not secrecy).
    if getrandom::fill(&mut b).is_err() {
        let n = super::now_micros().to_le_bytes();
        b[..8].copy_from_slice(&n);
    }
    hex::encode(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_query_tail_numbers_placeholders_in_argument_order() {
        let q = FlagQuery {
            user_id: Some("u1".into()),
            state: Some(crate::review::FlagState::Open),
            rule_id: None,
            assignee: None,
            after: Some(7),
            limit: 50,
        };
        let (sql, args) = q.sql_tail(|n| format!("${n}"));
        assert!(sql.contains("f.user_id = $1") && sql.contains("f.n > $2"), "{sql}");
        assert!(sql.contains("'open') = $3") && sql.ends_with("ORDER BY f.n LIMIT $4"), "{sql}");
        assert!(!sql.contains("rule_id"), "{sql}");
        assert_eq!(
            args,
            vec![
                FlagArg::Text("u1".into()),
                FlagArg::Int(7),
                FlagArg::Text("open".into()),
                FlagArg::Int(50)
            ]
        );
        let (sql, _) = FlagQuery { limit: 1, ..Default::default() }.sql_tail(|n| format!("?{n}"));
        assert_eq!(sql, " WHERE 1=1 ORDER BY f.n LIMIT ?1");
    }

    #[test]
    fn flag_query_filters_on_the_latest_assignment() {
        let q = FlagQuery {
            assignee: Some(AssigneeFilter::User("u9".into())),
            limit: 5,
            ..Default::default()
        };
        let (sql, args) = q.sql_tail(|n| format!("${n}"));
        assert!(sql.contains("AND s.assignment ORDER BY n DESC LIMIT 1) = $1"), "{sql}");
        assert_eq!(args, vec![FlagArg::Text("u9".into()), FlagArg::Int(5)]);
        let q = FlagQuery { assignee: Some(AssigneeFilter::Unassigned), limit: 5, ..q };
        let (sql, args) = q.sql_tail(|n| format!("?{n}"));
        assert!(sql.contains("LIMIT 1) IS NULL ORDER BY f.n LIMIT ?1"), "{sql}");
        assert_eq!(args, vec![FlagArg::Int(5)]);
    }
}
