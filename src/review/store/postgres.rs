//! PostgreSQL store for teams. The server connects as a runtime role holding INSERT and
//! SELECT only (plus USAGE on the id sequences); the owner role runs [`migrate`] and
//! [`maintain`]. Events are partitioned by month of the server's `received_at`; dedup goes
//! through the `event_keys` table, each event's key and row inserted by one statement so an
//! item is never half-written; an ingest's events, keys and flags commit in one transaction on
//! a connection of its own (the shared connections are pipelined).
//!
//! Connections are made by [`super::pg_tls`]: plain TCP or a Unix socket, or TLS verified like
//! `sslmode=verify-full`; the server's connections carry a `statement_timeout`.
//!
//! Least privilege (migration 0004, [`GRANTS`], docs/review.md "Grants"): the runtime role
//! inserts only events, keys and flags; flag states go through the `SECURITY DEFINER`
//! functions `airlock_flag_state` and `airlock_flag_assign` (migration 0009), which take the
//! caller's bearer token and record its user as the actor; users, roles and tokens are written by the owner or the admin role.
//! `received_at` comes from the database clock (a supplied value is refused by trigger).

use super::pg_tls::{PgOptions, PgTarget};
use super::{
    EventPage, EventQuery, FlagAction, FlagAssignment, FlagQuery, GATE_COLS, GATE_FROM, GateCaps,
    GateRowValues, IngestScan, LogHead, LogLeaf, NewCosignature, Opened, Store, StoreError,
    StoredCheckpoint, crash_point, random_id,
};
use super::{HourCount, PersonActivity, PublishedFile, SessionTranscriptItems};
use super::{log_hash, log_i64, log_u64};
use crate::review::correlate::{self, CorrelateScan};
use crate::review::detect::session::SessionScan;
use crate::review::gates::{self, Decided, DecisionRequest, Gate, GateQuery, NewGate};
use crate::review::{
    Flag, FlagState, FlagStateRecord, Inserted, Micros, NewEvent, NewFlag, Role, Source,
    StoredEvent, User, dedup,
};
use crate::tlog::merkle::{Edge, edge_ranges};
use crate::tlog::{EventLeaf, Hash};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, GenericClient, Row};

const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("../migrations/pg_0001.sql")),
    (2, include_str!("../migrations/pg_0002.sql")),
    (3, include_str!("../migrations/pg_0003.sql")),
    (4, include_str!("../migrations/pg_0004.sql")),
    (5, include_str!("../migrations/pg_0005.sql")),
    (6, include_str!("../migrations/pg_0006.sql")),
    (7, include_str!("../migrations/pg_0007.sql")),
    (8, include_str!("../migrations/pg_0008.sql")),
    (9, include_str!("../migrations/pg_0009.sql")),
    (10, include_str!("../migrations/pg_0010.sql")),
    (11, include_str!("../migrations/pg_0011.sql")),
    (12, include_str!("../migrations/pg_0012.sql")),
];

/// Every table of the store (each has a row in [`GRANTS`]).
pub const TABLES: &[&str] = &[
    "schema_migrations",
    "users",
    "user_roles",
    "tokens",
    "token_revocations",
    "events",
    "event_keys",
    "event_conflicts",
    "flags",
    "flag_events",
    "flag_states",
    "user_passwords",
    "invites",
    "invite_uses",
    "console_sessions",
    "console_session_seen",
    "console_session_ends",
    "auth_log",
    "gates",
    "gate_decisions",
    "log_leaves",
    "log_tiers",
    "log_checkpoints",
    "log_cosigners",
    "log_cosignatures",
];

/// The grants contract, as `migrate` applies it and docs/review.md tabulates it:
/// (table, runtime role, admin role). Table-level, so a later migration's new columns need no
/// new grant; a later table adds its row here. UPDATE, DELETE and TRUNCATE are never granted.
pub const GRANTS: &[(&str, &str, &str)] = &[
    ("schema_migrations", "SELECT", ""),
    ("users", "SELECT", "SELECT, INSERT"),
    ("user_roles", "SELECT", "SELECT, INSERT"),
    ("tokens", "SELECT", "SELECT, INSERT"),
    ("token_revocations", "SELECT", "SELECT, INSERT"),
    ("events", "SELECT, INSERT", ""),
    ("event_keys", "SELECT, INSERT", ""),
    ("event_conflicts", "SELECT, INSERT", ""),
    ("flags", "SELECT, INSERT", ""),
    ("flag_events", "SELECT, INSERT", ""),
    // Written only through `airlock_flag_state` and `airlock_flag_assign` (EXECUTE below).
    ("flag_states", "SELECT", ""),
    // Console sign-in (migration 0008): the server verifies passwords and keeps sessions; an
    // invite is consumed only through `airlock_accept_invite`, the unknown-email ring written
    // only through `airlock_auth_log`.
    ("user_passwords", "SELECT", "SELECT, INSERT"),
    ("invites", "SELECT", "SELECT, INSERT"),
    ("invite_uses", "SELECT", ""),
    ("console_sessions", "SELECT, INSERT", ""),
    ("console_session_seen", "SELECT, INSERT", ""),
    ("console_session_ends", "SELECT, INSERT", ""),
    ("auth_log", "", ""),
    // Action gates (migration 0011): opened by the server; decided only through
    // `airlock_gate_decide` and expired only through `airlock_gate_expire`.
    ("gates", "SELECT, INSERT", ""),
    ("gate_decisions", "SELECT", ""),
    // The review log (migration 0012, docs/evidence.md): the sequencer appends leaves and tier
    // hashes, the server records checkpoints and cosignatures.
    ("log_leaves", "SELECT, INSERT", ""),
    ("log_tiers", "SELECT, INSERT", ""),
    ("log_checkpoints", "SELECT, INSERT", ""),
    ("log_cosigners", "SELECT, INSERT", ""),
    ("log_cosignatures", "SELECT, INSERT", ""),
];

/// Sequences each role draws ids from (USAGE): (sequence, runtime, admin).
pub const SEQUENCE_GRANTS: &[(&str, bool, bool)] = &[
    ("events_pk_seq", true, false),
    ("flags_n_seq", true, false),
    ("user_roles_n_seq", false, true),
    ("token_revocations_n_seq", false, true),
    ("flag_states_n_seq", false, false),
    ("user_passwords_n_seq", false, true),
    ("auth_log_seq", false, false),
    ("gates_n_seq", true, false),
    ("log_checkpoints_n_seq", true, false),
    ("log_cosignatures_n_seq", true, false),
];

/// Functions the runtime role may EXECUTE (EXECUTE is revoked from PUBLIC on each).
pub const RUNTIME_FUNCTIONS: &[&str] = &[
    "airlock_flag_state(text, text, text, text, boolean)",
    "airlock_flag_assign(text, text, text, text, boolean)",
    "airlock_accept_invite(bytea, text)",
    "airlock_auth_log(text, text)",
    "airlock_gate_decide(text, text, text, text, text, boolean, boolean)",
    "airlock_gate_expire(integer)",
];

/// A small fixed pool of pipelined connections; a closed one is replaced on next use.
/// Each call takes the connection with the fewest calls in flight: plain round-robin put two
/// 1,000-event batches on one backend (they run one after the other) while another backend
/// sat idle, which was most of the p99 batch latency.
#[derive(Debug, Clone)]
pub struct PgStore {
    target: Arc<PgTarget>,
    slots: Arc<Vec<Slot>>,
    next: Arc<AtomicUsize>,
    /// Connections for ingest transactions, each held by one transaction at a time: on a
    /// shared pipelined connection other calls would run inside the transaction. Connected on
    /// first use, replaced when closed.
    tx_slots: Arc<Vec<tokio::sync::Mutex<Option<Client>>>>,
    /// The review log's sequencer: its own connection, whose session holds the advisory lock
    /// while this instance sequences, and what it has scanned. Connected on first use.
    sequencer: Arc<tokio::sync::Mutex<Sequencer>>,
}

#[derive(Debug)]
struct Slot {
    client: RwLock<Arc<Client>>,
    /// Calls currently holding this connection (a [`Lease`] each).
    in_flight: Arc<AtomicUsize>,
}

/// A connection borrowed from the pool; dropping it marks the call finished.
struct Lease {
    client: Arc<Client>,
    in_flight: Arc<AtomicUsize>,
}

impl std::ops::Deref for Lease {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connect(target: &PgTarget) -> Result<Client, StoreError> {
    target.connect().await.map_err(|e| {
        // tokio-postgres puts the TLS verdict (wrong CA, wrong name) in the source chain.
        let mut msg = format!("cannot connect to PostgreSQL: {e}");
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            let text = c.to_string();
            if !msg.ends_with(&text) {
                msg.push_str(&format!(": {text}"));
            }
            cause = c.source();
        }
        StoreError::Unavailable(msg)
    })
}

/// Reads a connection string (TLS demands, CA) into a target.
fn target(url: &str, opts: &PgOptions) -> Result<PgTarget, StoreError> {
    PgTarget::new(url, opts).map_err(|e| StoreError::Other(e.to_string()))
}

/// RFC 3339 with microseconds, for `::timestamptz` casts.
fn ts_text(us: Micros) -> String {
    crate::timefmt::rfc3339(crate::timefmt::from_micros(us), crate::timefmt::Fraction::Micros)
}

const RECEIVED_US: &str = "(extract(epoch from received_at) * 1000000)::int8";
/// The transaction's `now()` in microseconds: what the column defaults store.
const NOW_US: &str = "(extract(epoch from now()) * 1000000)::int8";
/// [`RECEIVED_US`] of an `event_conflicts x` row.
const RECEIVED_X: &str = "(extract(epoch from x.received_at) * 1000000)::int8";

impl PgStore {
    /// Connects `size` connections to `url` (the runtime role) with the default
    /// `statement_timeout` and no CA beyond the string's.
    pub async fn connect(url: &str, size: usize) -> Result<Self, StoreError> {
        let opts = PgOptions {
            statement_timeout: Some(super::pg_tls::DEFAULT_STATEMENT_TIMEOUT),
            ..Default::default()
        };
        Self::connect_with(url, size, &opts).await
    }

    /// Connects `size` connections to `url` with `opts` (CA file, statement timeout).
    pub async fn connect_with(
        url: &str,
        size: usize,
        opts: &PgOptions,
    ) -> Result<Self, StoreError> {
        let target = Arc::new(target(url, opts)?);
        let mut slots = Vec::new();
        for _ in 0..size.max(1) {
            slots.push(Slot {
                client: RwLock::new(Arc::new(connect(&target).await?)),
                in_flight: Arc::new(AtomicUsize::new(0)),
            });
        }
        let tx_slots = (0..size.max(1)).map(|_| tokio::sync::Mutex::new(None)).collect();
        Ok(Self {
            target,
            slots: Arc::new(slots),
            next: Arc::new(AtomicUsize::new(0)),
            tx_slots: Arc::new(tx_slots),
            sequencer: Arc::new(tokio::sync::Mutex::new(Sequencer::default())),
        })
    }

    /// A connection for one transaction: the first free one, else waits for one.
    async fn tx_client(&self) -> Result<tokio::sync::MutexGuard<'_, Option<Client>>, StoreError> {
        let n = self.tx_slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let free = (0..n).find_map(|k| self.tx_slots[(start + k) % n].try_lock().ok());
        let mut guard = match free {
            Some(g) => g,
            None => self.tx_slots[start % n].lock().await,
        };
        if guard.as_ref().is_none_or(|c| c.is_closed()) {
            *guard = Some(connect(&self.target).await?);
        }
        Ok(guard)
    }

    async fn client(&self) -> Result<Lease, StoreError> {
        // Least calls in flight wins; the scan starts at a rotating offset so ties spread out.
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = (0..n)
            .map(|k| &self.slots[(start + k) % n])
            .min_by_key(|s| s.in_flight.load(Ordering::Relaxed))
            .unwrap_or(&self.slots[start % n]);
        // Counted before any await so concurrent callers see this one.
        slot.in_flight.fetch_add(1, Ordering::Relaxed);
        let current = slot
            .client
            .read()
            .map_err(|_| StoreError::Unavailable("pool lock poisoned".into()))
            .map(|c| c.clone());
        // From here on the lease releases the count when dropped (error paths included).
        let mut current = match current {
            Ok(client) => Lease { client, in_flight: Arc::clone(&slot.in_flight) },
            Err(e) => {
                slot.in_flight.fetch_sub(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        if !current.is_closed() {
            return Ok(current);
        }
        // On an error below, dropping `current` releases the in-flight count.
        let fresh = Arc::new(connect(&self.target).await?);
        *slot.client.write().map_err(|_| StoreError::Unavailable("pool lock poisoned".into()))? =
            fresh.clone();
        current.client = fresh;
        Ok(current)
    }

    async fn user_with_role(
        &self,
        c: &Client,
        row: Option<Row>,
    ) -> Result<Option<User>, StoreError> {
        let Some(row) = row else { return Ok(None) };
        let id: String = row.get(0);
        let email: String = row.get(1);
        let role: String = c
            .query_one(
                "SELECT role FROM user_roles WHERE user_id = $1 ORDER BY n DESC LIMIT 1",
                &[&id],
            )
            .await?
            .get(0);
        Ok(Some(User { id, email, role: role.parse().map_err(StoreError::Other)? }))
    }

    async fn load_flags(&self, c: &Client, rows: Vec<Row>) -> Result<Vec<(i64, Flag)>, StoreError> {
        let ids: Vec<String> = rows.iter().map(|r| r.get::<_, String>(1)).collect();
        let mut histories: HashMap<String, Vec<FlagStateRecord>> = HashMap::new();
        for r in c
            .query(
                "SELECT s.flag_id, s.state, s.actor, (extract(epoch from s.at) * 1000000)::int8,
                        s.note, s.self, s.assignment, s.assignee, u.email
                 FROM flag_states s LEFT JOIN users u ON u.id = s.assignee
                 WHERE s.flag_id = ANY($1) ORDER BY s.flag_id, s.n",
                &[&ids],
            )
            .await?
        {
            let state: String = r.get(1);
            histories.entry(r.get(0)).or_default().push(FlagStateRecord {
                state: state.parse().map_err(StoreError::Other)?,
                actor: r.get(2),
                at: r.get(3),
                note: r.get(4),
                self_action: r.get(5),
                assignment: r.get(6),
                assignee: r.get(7),
                assignee_email: r.get(8),
            });
        }
        let mut links: HashMap<String, Vec<i64>> = HashMap::new();
        for r in c
            .query(
                "SELECT flag_id, event_pk FROM flag_events WHERE flag_id = ANY($1) ORDER BY event_pk",
                &[&ids],
            )
            .await?
        {
            links.entry(r.get(0)).or_default().push(r.get(1));
        }
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let id: String = r.get(1);
            let history = histories.remove(&id).unwrap_or_default();
            let severity: String = r.get(4);
            out.push((
                r.get(0),
                Flag {
                    event_pks: links.remove(&id).unwrap_or_default(),
                    id,
                    rule_id: r.get(2),
                    title: r.get(3),
                    severity: severity.parse().map_err(StoreError::Other)?,
                    user_id: r.get(5),
                    session: r.get(6),
                    detail: r.get(7),
                    created_at: r.get(8),
                    state: FlagState::Open,
                    note: None,
                    history: Vec::new(),
                    assignee: None,
                    assignee_email: None,
                }
                .with_history(history),
            ));
        }
        Ok(out)
    }
}

/// [`GATE_COLS`] with this store's time columns as microseconds.
fn gate_cols() -> String {
    GATE_COLS
        .replace("{requested}", "(extract(epoch from g.requested_at) * 1000000)::int8")
        .replace("{deadline}", "(extract(epoch from g.deadline) * 1000000)::int8")
        .replace("{at}", "(extract(epoch from d.at) * 1000000)::int8")
}

fn gate_values(r: &Row) -> GateRowValues {
    GateRowValues {
        n: r.get(0),
        id: r.get(1),
        user_id: r.get(2),
        email: r.get(3),
        kind: r.get(4),
        session: r.get(5),
        repo: r.get(6),
        method: r.get(7),
        host: r.get(8),
        port: r.get::<_, Option<i32>>(9).map(i64::from),
        request: r.get(10),
        action: r.get(11),
        digest: r.get(12),
        severity: r.get(13),
        rule: r.get(14),
        layer: r.get(15),
        policy: r.get(16),
        local_id: r.get(17),
        context: r.get(18),
        self_approve: r.get(19),
        timeout_ms: r.get(20),
        requested_at: r.get(21),
        deadline: r.get(22),
        state: r.get(23),
        actor: r.get(24),
        actor_email: r.get(25),
        note: r.get(26),
        self_decided: r.get(27),
        step_up: r.get(28),
        at: r.get(29),
    }
}

async fn load_gate(c: &impl GenericClient, id: &str) -> Result<Option<Gate>, StoreError> {
    let sql = format!("SELECT {}{GATE_FROM} WHERE g.id = $1", gate_cols());
    let row = c.query_opt(&sql, &[&id]).await?;
    row.map(|r| gate_values(&r).into_gate()).transpose()
}

/// Loads gate `id` on `c` (inside the transaction that just decided it) and inserts its
/// `gate.<state>` event there.
async fn record_decision(c: &impl GenericClient, id: &str) -> Result<Gate, StoreError> {
    let g = load_gate(c, id)
        .await?
        .ok_or_else(|| StoreError::Other(format!("gate {id} vanished while it was decided")))?;
    let event = gates::step_event(&g, g.decision.as_ref());
    insert_event_rows(c, &g.gate.user_id, 0, &[event]).await?;
    Ok(g)
}

/// Pending gates of `user_id` by the database clock (of `session` when given).
async fn pending_gates(
    c: &impl GenericClient,
    user_id: &str,
    session: Option<&str>,
) -> Result<usize, StoreError> {
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM gates g WHERE g.user_id = $1 AND g.deadline > now()
               AND ($2::text IS NULL OR g.session = $2)
               AND NOT EXISTS (SELECT 1 FROM gate_decisions d WHERE d.gate_id = g.id)",
            &[&user_id, &session],
        )
        .await?
        .get(0);
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

const FLAG_COLS: &str = "n, id, rule_id, title, severity, user_id, session, detail, \
     (extract(epoch from created_at) * 1000000)::int8";

fn event_from_row(r: &Row) -> StoredEvent {
    let source: String = r.get(2);
    StoredEvent {
        pk: r.get(0),
        user_id: r.get(1),
        // Only valid sources are ever inserted; External is an inert fallback.
        source: source.parse().unwrap_or(Source::External),
        id: r.get(3),
        kind: r.get(4),
        ts: r.get(5),
        session: r.get(6),
        seq: r.get(7),
        boot: r.get(8),
        received_at: r.get(9),
        payload: r.get(10),
        conflict_of: r.get(11),
        airlock_session: r.get(12),
        file: r.get(13),
        offset: r.get(14),
    }
}

fn pg_arg(a: super::FlagArg) -> Box<dyn ToSql + Sync + Send> {
    match a {
        super::FlagArg::Text(t) => Box::new(t),
        super::FlagArg::Int(i) => Box::new(i),
        super::FlagArg::Time(t) => Box::new(ts_text(t)),
    }
}

const EVENT_COLS: &str = "pk, user_id, source, id, type, ts, session, seq, boot, \
     (extract(epoch from received_at) * 1000000)::int8, payload, conflict_of, airlock_session, \
     file, file_offset";

/// The transcript columns of a batch's rows, as arrays for `unnest`.
struct Links<'a> {
    sessions: Vec<Option<&'a str>>,
    files: Vec<Option<&'a str>>,
    offsets: Vec<Option<i64>>,
}

impl<'a> Links<'a> {
    fn of(events: &[&'a NewEvent]) -> Self {
        Self {
            sessions: events.iter().map(|e| e.airlock_session.as_deref()).collect(),
            files: events.iter().map(|e| e.file.as_deref()).collect(),
            offsets: events.iter().map(|e| e.offset).collect(),
        }
    }
}

/// Inserts a batch's events and keys on `c`, a transaction the caller commits. The first
/// item of each new key becomes its original (one statement: each key and its row together);
/// every other item (a key already stored, or a later item of the batch under the same key)
/// is decided by [`dedup::decide`] against the key's stored contents, under a per-user
/// transaction lock so two batches never decide the same key at once: a duplicate reports
/// the matching content, a conflict is inserted as its own event with `conflict_of` and an
/// `event_conflicts` row.
async fn insert_event_rows(
    c: &impl GenericClient,
    user_id: &str,
    _received_at: Micros,
    events: &[NewEvent],
) -> Result<Vec<Inserted>, StoreError> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let shas: Vec<dedup::Hash> = events.iter().map(|e| dedup::payload_sha256(&e.payload)).collect();
    // The first item of each key in the batch; the rest are decided below.
    let mut first: HashMap<(Source, &str), usize> = HashMap::new();
    let mut unique: Vec<usize> = Vec::new();
    for (n, e) in events.iter().enumerate() {
        first.entry((e.source, e.id.as_str())).or_insert_with(|| {
            unique.push(n);
            n
        });
    }
    let pick = |rows: &[usize]| -> Vec<&NewEvent> { rows.iter().map(|n| &events[*n]).collect() };
    let u = pick(&unique);
    let sources: Vec<&str> = u.iter().map(|e| e.source.as_str()).collect();
    let ids: Vec<&str> = u.iter().map(|e| e.id.as_str()).collect();
    let kinds: Vec<&str> = u.iter().map(|e| e.kind.as_str()).collect();
    let tss: Vec<i64> = u.iter().map(|e| e.ts).collect();
    let sessions: Vec<Option<&str>> = u.iter().map(|e| e.session.as_deref()).collect();
    let seqs: Vec<Option<i64>> = u.iter().map(|e| e.seq).collect();
    let boots: Vec<Option<&str>> = u.iter().map(|e| e.boot.as_deref()).collect();
    let payloads: Vec<&str> = u.iter().map(|e| e.payload.as_str()).collect();
    let hashes: Vec<&[u8]> = unique.iter().map(|n| shas[*n].as_slice()).collect();
    let ords: Vec<i32> = unique.iter().map(|n| *n as i32).collect();
    let links = Links::of(&u);
    // `received_at` is the database's now() (column DEFAULT; a supplied value is refused by
    // trigger, migration 0004), the same for key and row; RETURNING reports it.
    // One statement: each key and its row are inserted together or not at all. Each input
    // row draws its pk once, in input order (a CTE with a volatile function is evaluated
    // once, PostgreSQL docs "WITH Queries"), so keys and rows join on that integer instead of
    // on (source, id) text compared under the database's collation; a conflicting row's pk is
    // left unused, as it was when the keys insert drew it.
    let rows = c
        .query(
            &format!(
                "WITH input AS (
               SELECT t.*, nextval('events_pk_seq') AS pk
               FROM unnest($2::text[], $3::text[], $4::text[], $5::int8[], $6::text[],
                           $7::int8[], $8::text[], $9::text[], $10::int4[], $11::bytea[],
                           $12::text[], $13::text[], $14::int8[])
                 AS t(source, id, type, ts, session, seq, boot, payload, ord, sha256,
                      airlock_session, file, file_offset)
             ), keys AS (
               INSERT INTO event_keys (user_id, source, id, pk, sha256)
               SELECT $1, source, id, pk, sha256
               FROM input ORDER BY ord
               ON CONFLICT DO NOTHING
               RETURNING pk, {RECEIVED_US} AS received_us
             ), ev AS (
               INSERT INTO events (pk, user_id, source, id, type, ts, session, seq, boot, payload,
                                   airlock_session, file, file_offset)
               SELECT i.pk, $1, i.source, i.id, i.type, i.ts, i.session, i.seq, i.boot, i.payload,
                      i.airlock_session, i.file, i.file_offset
               FROM keys k JOIN input i ON i.pk = k.pk
               RETURNING pk
             )
             SELECT i.ord, k.pk, k.received_us FROM keys k JOIN input i ON i.pk = k.pk"
            ),
            &[
                &user_id,
                &sources,
                &ids,
                &kinds,
                &tss,
                &sessions,
                &seqs,
                &boots,
                &payloads,
                &ords,
                &hashes,
                &links.sessions,
                &links.files,
                &links.offsets,
            ],
        )
        .await?;
    let mut results: Vec<Option<Inserted>> = vec![None; events.len()];
    for r in rows {
        let ord: i32 = r.get(0);
        results[ord as usize] = Some(Inserted {
            created: true,
            pk: r.get(1),
            received_at: r.get(2),
            conflict: None,
            leaf_index: None,
        });
    }
    let rest: Vec<usize> = (0..events.len()).filter(|n| results[*n].is_none()).collect();
    if !rest.is_empty() {
        decide_rest(c, user_id, events, &shas, &rest, &mut results).await?;
    }
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| StoreError::Other("event key vanished during insert".into())))
        .collect()
}

/// Decides the items `rest` of a batch (input order) whose key is stored, inserting the
/// conflicts; fills their `results`.
async fn decide_rest(
    c: &impl GenericClient,
    user_id: &str,
    events: &[NewEvent],
    shas: &[dedup::Hash],
    rest: &[usize],
    results: &mut [Option<Inserted>],
) -> Result<(), StoreError> {
    // Held to the end of the transaction: the reads below see every content of this user's
    // keys committed before, and no other batch of the user inserts a conflict meanwhile.
    // (The keys themselves are settled: the insert above waited for any concurrent insert
    // of the same key to commit.)
    c.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 7247002))", &[&user_id]).await?;
    // A conflict's `received_at` is the database clock too (the transaction's now(), as for
    // every row of this batch).
    let received_at: Micros = c.query_one(&format!("SELECT {NOW_US}"), &[]).await?.get(0);
    let ms: Vec<&str> = rest.iter().map(|n| events[*n].source.as_str()).collect();
    let mi: Vec<&str> = rest.iter().map(|n| events[*n].id.as_str()).collect();
    let rows = c
        .query(
            &format!(
                "WITH m AS (SELECT DISTINCT source, id FROM unnest($2::text[], $3::text[]) AS m(source, id))
                 SELECT m.source, m.id, k.pk, {RECEIVED_US}, k.sha256, 0 AS kind,
                        CASE WHEN k.sha256 IS NULL THEN (SELECT e.payload FROM events e
                             WHERE e.pk = k.pk AND e.received_at = k.received_at) END
                 FROM m JOIN event_keys k ON k.user_id = $1 AND k.source = m.source AND k.id = m.id
                 UNION ALL
                 SELECT m.source, m.id, x.pk, {RECEIVED_X}, x.sha256, 1, NULL
                 FROM m JOIN event_conflicts x ON x.user_id = $1 AND x.source = m.source AND x.id = m.id
                 ORDER BY 6, 3"
            ),
            &[&user_id, &ms, &mi],
        )
        .await?;
    // Per key: the original first, then its conflicts in pk order.
    let mut stored: HashMap<(String, String), Vec<dedup::StoredRow>> = HashMap::new();
    for r in rows {
        stored.entry((r.get(0), r.get(1))).or_default().push(dedup::StoredRow {
            pk: r.get(2),
            received_at: r.get(3),
            sha256: dedup::hash_from(r.get(4)),
            payload: r.get(6),
        });
    }
    // Claude lines no stored hash matches are compared by message: read those payloads.
    let mut want: Vec<i64> = Vec::new();
    for n in rest {
        let e = &events[*n];
        if let Some(rows) = stored.get(&(e.source.as_str().to_string(), e.id.clone()))
            && dedup::needs_payloads(e.source, &shas[*n], &dedup::view(rows))
        {
            want.extend(rows.iter().filter(|s| s.payload.is_none()).map(|s| s.pk));
        }
    }
    if !want.is_empty() {
        let mut found: HashMap<i64, String> = HashMap::new();
        for r in c.query("SELECT pk, payload FROM events WHERE pk = ANY($1)", &[&want]).await? {
            found.insert(r.get(0), r.get(1));
        }
        for s in stored.values_mut().flatten() {
            if s.payload.is_none() {
                s.payload = found.remove(&s.pk);
            }
        }
    }
    // Decided in input order; a conflict decided here joins its key's contents (under a
    // placeholder pk, -1 - its index) so a later identical item of the batch is its duplicate.
    let mut conflicts: Vec<(usize, dedup::Conflict)> = Vec::new();
    for n in rest {
        let e = &events[*n];
        let Some(rows) = stored.get_mut(&(e.source.as_str().to_string(), e.id.clone())) else {
            return Err(StoreError::Other("event key vanished during insert".into()));
        };
        let value = if e.source == Source::Claude && rows.iter().any(|s| s.payload.is_some()) {
            crate::review::ingest::payload_value(&e.payload).unwrap_or(serde_json::Value::Null)
        } else {
            serde_json::Value::Null
        };
        match dedup::decide(e.source, &shas[*n], &value, &dedup::view(rows)) {
            dedup::Decision::Duplicate { pk, received_at } => {
                results[*n] = Some(Inserted {
                    created: false,
                    pk,
                    received_at,
                    conflict: None,
                    leaf_index: None,
                });
            }
            // Unreachable: every key in `rest` has its original stored.
            dedup::Decision::Create => {
                return Err(StoreError::Other("event key vanished during insert".into()));
            }
            dedup::Decision::Conflict(cf) => {
                rows.push(dedup::StoredRow {
                    pk: -1 - *n as i64,
                    received_at,
                    sha256: Some(shas[*n]),
                    payload: (e.source == Source::Claude).then(|| e.payload.clone()),
                });
                conflicts.push((*n, cf));
            }
        }
    }
    if conflicts.is_empty() {
        return Ok(());
    }
    let cs: Vec<&NewEvent> = conflicts.iter().map(|(n, _)| &events[*n]).collect();
    let sources: Vec<&str> = cs.iter().map(|e| e.source.as_str()).collect();
    let ids: Vec<&str> = cs.iter().map(|e| e.id.as_str()).collect();
    let kinds: Vec<&str> = cs.iter().map(|e| e.kind.as_str()).collect();
    let tss: Vec<i64> = cs.iter().map(|e| e.ts).collect();
    let sessions: Vec<Option<&str>> = cs.iter().map(|e| e.session.as_deref()).collect();
    let seqs: Vec<Option<i64>> = cs.iter().map(|e| e.seq).collect();
    let boots: Vec<Option<&str>> = cs.iter().map(|e| e.boot.as_deref()).collect();
    let payloads: Vec<&str> = cs.iter().map(|e| e.payload.as_str()).collect();
    let hashes: Vec<&[u8]> = conflicts.iter().map(|(n, _)| shas[*n].as_slice()).collect();
    let originals: Vec<i64> = conflicts.iter().map(|(_, cf)| cf.original_pk).collect();
    let ords: Vec<i32> = conflicts.iter().map(|(n, _)| *n as i32).collect();
    let links = Links::of(&cs);
    let rows = c
        .query(
            "WITH input AS (
               SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::int8[], $6::text[],
                                    $7::int8[], $8::text[], $9::text[], $10::int4[], $11::bytea[],
                                    $12::int8[], $13::text[], $14::text[], $15::int8[])
                 AS t(source, id, type, ts, session, seq, boot, payload, ord, sha256, original,
                      airlock_session, file, file_offset)
             ), x AS (
               INSERT INTO event_conflicts (user_id, source, id, sha256, pk, received_at, original_pk)
               SELECT $1, source, id, sha256, nextval('events_pk_seq'), now(), original
               FROM input ORDER BY ord
               RETURNING source, id, sha256, pk
             ), ev AS (
               INSERT INTO events (pk, user_id, source, id, type, ts, session, seq, boot, payload,
                                   conflict_of, airlock_session, file, file_offset)
               SELECT x.pk, $1, i.source, i.id, i.type, i.ts, i.session, i.seq, i.boot, i.payload,
                      i.original, i.airlock_session, i.file, i.file_offset
               FROM x JOIN input i ON i.source = x.source AND i.id = x.id AND i.sha256 = x.sha256
               RETURNING pk
             )
             SELECT i.ord, x.pk FROM x JOIN input i
               ON i.source = x.source AND i.id = x.id AND i.sha256 = x.sha256",
            &[
                &user_id, &sources, &ids, &kinds, &tss, &sessions, &seqs, &boots, &payloads,
                &ords, &hashes, &originals, &links.sessions, &links.files, &links.offsets,
            ],
        )
        .await?;
    let mut pk_of: HashMap<usize, i64> = HashMap::new();
    for r in rows {
        let ord: i32 = r.get(0);
        pk_of.insert(ord as usize, r.get(1));
    }
    for (n, cf) in conflicts {
        let pk = *pk_of
            .get(&n)
            .ok_or_else(|| StoreError::Other("a conflict event was not inserted".into()))?;
        results[n] =
            Some(Inserted { created: true, pk, received_at, conflict: Some(cf), leaf_index: None });
    }
    // Later items of the batch that duplicate a conflict inserted here.
    for r in results.iter_mut().flatten() {
        if r.pk < 0 {
            let n = (-1 - r.pk) as usize;
            r.pk = *pk_of
                .get(&n)
                .ok_or_else(|| StoreError::Other("a conflict event was not inserted".into()))?;
        }
    }
    Ok(())
}

/// Inserts flags and their event links on `c`; an existing flag id is left as it is.
async fn insert_flag_rows(c: &impl GenericClient, flags: &[NewFlag]) -> Result<(), StoreError> {
    if flags.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = flags.iter().map(|f| f.id.as_str()).collect();
    let rules: Vec<&str> = flags.iter().map(|f| f.rule_id.as_str()).collect();
    let titles: Vec<&str> = flags.iter().map(|f| f.title.as_str()).collect();
    let sevs: Vec<&str> = flags.iter().map(|f| f.severity.as_str()).collect();
    let users: Vec<&str> = flags.iter().map(|f| f.user_id.as_str()).collect();
    let sessions: Vec<Option<&str>> = flags.iter().map(|f| f.session.as_deref()).collect();
    let details: Vec<&str> = flags.iter().map(|f| f.detail.as_str()).collect();
    let mut link_flags: Vec<&str> = Vec::new();
    let mut link_pks: Vec<i64> = Vec::new();
    for f in flags {
        for pk in &f.event_pks {
            link_flags.push(&f.id);
            link_pks.push(*pk);
        }
    }
    // One statement: flags and their links together; an existing flag id is left alone.
    c.execute(
        "WITH f AS (
           INSERT INTO flags(id, rule_id, title, severity, user_id, session, detail)
           SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                                $6::text[], $7::text[])
           ON CONFLICT (id) DO NOTHING RETURNING id
         )
         INSERT INTO flag_events(flag_id, event_pk)
         SELECT l.flag_id, l.pk FROM unnest($8::text[], $9::int8[]) AS l(flag_id, pk)
         JOIN f ON f.id = l.flag_id
         ON CONFLICT DO NOTHING",
        &[&ids, &rules, &titles, &sevs, &users, &sessions, &details, &link_flags, &link_pks],
    )
    .await?;
    Ok(())
}

/// A refusal of `airlock_flag_state` or `airlock_flag_assign` (SQLSTATE `AL401`/`AL403`) is
/// the caller's, not the store's: it maps to [`StoreError::Forbidden`]; `AL400` (an assignee
/// who may not be assigned) to [`StoreError::Invalid`].
fn flag_state_error(e: tokio_postgres::Error) -> StoreError {
    match e.as_db_error() {
        Some(db) if matches!(db.code().code(), "AL401" | "AL403") => {
            StoreError::Forbidden(db.message().to_string())
        }
        Some(db) if db.code().code() == "AL400" => StoreError::Invalid(db.message().to_string()),
        _ => e.into(),
    }
}

/// Feeds `scan` its session's span, then its events' envelopes in `pk` order a page of
/// [`super::SESSION_PAGE`] rows at a time (payloads are never read).
async fn feed_session(c: &impl GenericClient, scan: &mut SessionScan) -> Result<(), StoreError> {
    let (user, session) = (scan.user_id().to_string(), scan.session().to_string());
    let span = c
        .query(
            "SELECT id, ts FROM events WHERE user_id = $1 AND session = $2 AND source = 'session' \
             AND id = ANY($3)",
            &[&user, &session, &vec![scan.start_id(), scan.end_id()]],
        )
        .await?;
    let ts_of =
        |id: String| span.iter().find(|r| r.get::<_, &str>(0) == id).map(|r| r.get::<_, i64>(1));
    let (start, end) = (ts_of(scan.start_id()), ts_of(scan.end_id()));
    scan.set_span(start, end);
    let mut after = i64::MIN;
    loop {
        let rows = c
            .query(
                &format!(
                    "SELECT pk, source, ts, seq, boot, {} FROM events \
                     WHERE user_id = $1 AND session = $2 AND pk > $3 ORDER BY pk LIMIT $4",
                    super::SUPPRESSED_PAYLOAD_SQL
                ),
                &[&user, &session, &after, &super::SESSION_PAGE],
            )
            .await?;
        let n = rows.len();
        for r in rows {
            after = r.get(0);
            let source: &str = r.get(1);
            let payload: Option<&str> = r.get(5);
            let row = super::session_row(after, source, r.get(2), r.get(3), r.get(4), payload);
            if !scan.feed(row) {
                return Ok(());
            }
        }
        if (n as i64) < super::SESSION_PAGE {
            return Ok(());
        }
    }
}

/// Feeds the correlate scan its session's rows: the two reads of
/// [`super::CORRELATE_SESSION_ROWS`] and [`super::CORRELATE_TRANSCRIPT_ROWS`], a page of
/// [`super::SESSION_PAGE`] rows at a time.
async fn feed_correlate(
    c: &impl GenericClient,
    scan: &mut CorrelateScan,
) -> Result<(), StoreError> {
    let (user, session) = (scan.user_id().to_string(), scan.session().to_string());
    for (sql, read) in [
        (super::CORRELATE_SESSION_ROWS, correlate::Read::Session),
        (super::CORRELATE_TRANSCRIPT_ROWS, correlate::Read::Transcript),
    ] {
        let sql = sql
            .replace("{rcv}", "(extract(epoch from received_at) * 1000000)::int8")
            .replace("{1}", "$1")
            .replace("{2}", "$2")
            .replace("{3}", "$3")
            .replace("{4}", "$4");
        let mut after = i64::MIN;
        loop {
            let rows = c.query(&sql, &[&user, &session, &after, &super::SESSION_PAGE]).await?;
            let n = rows.len();
            for r in &rows {
                after = r.get(0);
                let Ok(source) = r.get::<_, &str>(1).parse::<Source>() else { continue };
                scan.feed(correlate::Row {
                    pk: after,
                    id: r.get(2),
                    source,
                    kind: r.get(3),
                    ts: r.get(4),
                    received_at: r.get(5),
                    file: r.get(6),
                    payload: r.get(7),
                });
            }
            if (n as i64) < super::SESSION_PAGE || !scan.wants_more(read) {
                break;
            }
        }
    }
    Ok(())
}

/// Every event of one user's session, in `pk` order.
async fn session_rows(
    c: &impl GenericClient,
    user_id: &str,
    session: &str,
) -> Result<Vec<StoredEvent>, StoreError> {
    let rows = c
        .query(
            &format!(
                "SELECT {EVENT_COLS} FROM events WHERE user_id = $1 AND session = $2 ORDER BY pk"
            ),
            &[&user_id, &session],
        )
        .await?;
    Ok(rows.iter().map(event_from_row).collect())
}

// --- The review log (docs/evidence.md) ---

/// The session-level advisory lock the review log's sequencer holds (`pg_try_advisory_lock`):
/// one instance at a time appends leaves, the others answer `None` from `log_sequence`.
pub const LOG_SEQUENCER_LOCK: i64 = 7_247_019;

/// The longest a transaction that stores events stays open after it drew an event's `pk`, as
/// the sequencer assumes it ([`SeqScan`]): an ingest is a few statements, each cut at the
/// server's `statement_timeout` (30 s). An event of a transaction that takes longer still
/// gets its leaf, from the next sweep ([`LOG_SWEEP_EVERY_US`]), only later than the 60 s a
/// receipt's deadline promises.
const LOG_TX_BOUND_US: i64 = 300 * 1_000_000;
/// How often the sequencer sweeps every `pk` below its scan for events without a leaf.
const LOG_SWEEP_EVERY_US: i64 = 3_600 * 1_000_000;
/// Events one pass reads of a sweep (an index range, each probed for its leaf): a sweep of
/// 10⁷ events takes 500 passes.
const LOG_SWEEP_ROWS: i64 = 20_000;
/// Gaps the sequencer keeps; past this the oldest is dropped and left to a sweep.
const LOG_MAX_GAPS: usize = 4_096;

/// The database clock now, in microseconds.
const CLOCK_US: &str = "(extract(epoch from clock_timestamp()) * 1000000)::int8";
/// The columns of a leaf over `log_leaves l`, in [`pg_leaf`] order.
const LEAF_COLS: &str =
    "l.idx, l.event_pk, l.leaf_hash, l.user_id, l.source, l.id, l.received_at, l.payload_sha256";

/// The sequencer's read of the events `from` names (a `FROM … ORDER BY e.pk LIMIT …` over
/// `events e`), each with its payload's SHA-256 when it has no leaf (`NULL` when it has one),
/// as [`Candidate::of`] reads them.
///
/// The events are a bounded, pk-ordered index range, and each one is probed for its leaf by
/// index (the `LATERAL … LIMIT 1` keeps the planner from turning the probe into a join). An
/// anti-join (`NOT EXISTS`), or a plain join on a page of thousands, is planned as a hash join
/// over every leaf: measured at 2·10⁶ leaves, 0.9 s for a 20,000-row page against 25 ms.
fn probe_sql(from: &str) -> String {
    format!(
        "SELECT e.pk, e.user_id, e.source, e.id, e.received_us,
                CASE WHEN l.event_pk IS NULL THEN sha256(convert_to(e.payload, 'UTF8')) END
         FROM (SELECT e.pk, e.user_id, e.source, e.id, e.payload,
                      (extract(epoch from e.received_at) * 1000000)::int8 AS received_us
               {from}) e
         LEFT JOIN LATERAL (SELECT x.event_pk FROM log_leaves x WHERE x.event_pk = e.pk LIMIT 1) l
           ON true
         ORDER BY e.pk"
    )
}

/// The sequencer's connection and bookkeeping ([`PgStore::log_sequence`]).
#[derive(Debug, Default)]
struct Sequencer {
    client: Option<Client>,
    /// `client`'s session holds [`LOG_SEQUENCER_LOCK`].
    locked: bool,
    scan: SeqScan,
}

/// `pk`s the sequencer's scan stepped over, and when (database clock, µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Gap {
    lo: i64,
    hi: i64,
    found: i64,
}

/// Where the PostgreSQL sequencer looks for events without a leaf.
///
/// Commit order is not `pk` order here: a transaction may draw its `pk`s and commit after a
/// later one did. So the sequencer never trusts a `pk` watermark alone; it keeps three things
/// and reads all three every pass:
///
/// * **The scan** (`hi`): every visible event with `pk > hi`, in `pk` order (an index range:
///   new events only).
/// * **Gaps**: the `pk`s the scan stepped over, drawn and not visible: a transaction still
///   open, one rolled back, or a `pk` a duplicate burned. A gap is read again on every pass,
///   and what became visible in it leaves it, until [`LOG_TX_BOUND_US`] after it was found: by
///   then whatever was open in it has committed (and was appended) or is gone. A gap behind
///   events older than twice that bound is not kept: nothing in it can still be open.
/// * **Sweeps**: every `pk` up to `hi`, [`LOG_SWEEP_ROWS`] a pass: when the process takes the
///   lock (its predecessor's gaps are unknown), once more [`LOG_TX_BOUND_US`] later (what was
///   open at that moment), after a gap was dropped for room, and every
///   [`LOG_SWEEP_EVERY_US`] (a transaction longer than the bound).
///
/// So a pass costs the new events, the gaps and one sweep page, however large the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct SeqScan {
    /// `None` until this process's first pass under the lock.
    hi: Option<i64>,
    /// Oldest first (so also in `pk` order).
    gaps: VecDeque<Gap>,
    /// The sweep under way: `pk`s `(lo, top]` remain.
    sweep: Option<(i64, i64)>,
    /// When the next regular sweep starts (database clock, µs).
    next_sweep: i64,
    /// A sweep must start at or after this (a gap was dropped for room).
    resweep: Option<i64>,
    /// Until the first sweep is through: when it started.
    startup: Option<i64>,
}

impl SeqScan {
    /// The first pass under the lock: the scan continues after the last leaf's event, and a
    /// sweep of everything below starts now.
    fn begin(&mut self, last_leaf_pk: i64, now: i64) {
        *self = Self {
            hi: Some(last_leaf_pk),
            sweep: Some((0, last_leaf_pk)),
            startup: Some(now),
            ..Self::default()
        };
    }

    fn start_sweep_if_due(&mut self, now: i64) {
        if self.sweep.is_some() {
            return;
        }
        let resweep = self.resweep.is_some_and(|t| now >= t);
        if now >= self.next_sweep || resweep {
            if resweep {
                self.resweep = None;
            }
            self.sweep = Some((0, self.hi.unwrap_or(0)));
        }
    }

    /// The sweep is through every `pk` up to `upto`.
    fn swept(&mut self, upto: i64, now: i64) {
        let Some((lo, top)) = self.sweep else { return };
        let lo = lo.max(upto);
        if lo < top {
            self.sweep = Some((lo, top));
            return;
        }
        self.sweep = None;
        self.next_sweep = match self.startup.take() {
            Some(started) => started.saturating_add(LOG_TX_BOUND_US),
            None => now.saturating_add(LOG_SWEEP_EVERY_US),
        };
    }

    /// The scan read `rows` (`(pk, received_at µs)`, ascending, all above `hi`) in a pass
    /// that started at `now`, and the clock read `found` after it.
    fn scanned(&mut self, rows: &[(i64, i64)], now: i64, found: i64) {
        let mut prev = self.hi.unwrap_or(0);
        for &(pk, received) in rows {
            // The skipped pks were drawn before `pk`, so within the bound after `received`;
            // their transactions ended within the bound after that.
            if pk > prev.saturating_add(1) && received.saturating_add(2 * LOG_TX_BOUND_US) > now {
                self.gaps.push_back(Gap { lo: prev + 1, hi: pk - 1, found });
            }
            prev = prev.max(pk);
        }
        self.hi = Some(prev);
        while self.gaps.len() > LOG_MAX_GAPS {
            if let Some(g) = self.gaps.pop_front() {
                let due = g.found.saturating_add(LOG_TX_BOUND_US);
                self.resweep = Some(self.resweep.map_or(due, |t| t.max(due)));
            }
        }
    }

    /// `pks` (ascending) are visible and have their leaves: they leave the gaps.
    fn carve(&mut self, pks: &[i64]) {
        if pks.is_empty() {
            return;
        }
        let mut out = VecDeque::with_capacity(self.gaps.len());
        for g in self.gaps.drain(..) {
            let from = pks.partition_point(|p| *p < g.lo);
            let mut lo = g.lo;
            for &p in pks[from..].iter().take_while(|p| **p <= g.hi) {
                if p > lo {
                    out.push_back(Gap { lo, hi: p - 1, found: g.found });
                }
                lo = p + 1;
            }
            if lo <= g.hi {
                out.push_back(Gap { lo, hi: g.hi, found: g.found });
            }
        }
        self.gaps = out;
    }

    /// A pass that started at `now` read every gap through: drop the gaps nothing can appear
    /// in any more.
    fn expire_gaps(&mut self, now: i64) {
        while self.gaps.front().is_some_and(|g| g.found.saturating_add(LOG_TX_BOUND_US) <= now) {
            self.gaps.pop_front();
        }
    }
}

/// An event the sequencer read ([`probe_sql`]): its leaf's fields, `sha` `None` when it has a
/// leaf already.
#[derive(Debug)]
struct Candidate {
    pk: i64,
    user_id: String,
    source: String,
    id: String,
    received_at: Micros,
    sha: Option<Vec<u8>>,
}

impl Candidate {
    fn of(r: &Row) -> Self {
        Self {
            pk: r.get(0),
            user_id: r.get(1),
            source: r.get(2),
            id: r.get(3),
            received_at: r.get(4),
            sha: r.get(5),
        }
    }
}

/// A leaf from [`LEAF_COLS`] read at column `at`.
fn pg_leaf(r: &Row, at: usize) -> Result<LogLeaf, StoreError> {
    Ok(LogLeaf {
        index: log_u64(r.get(at), "a leaf index")?,
        event_pk: r.get(at + 1),
        hash: log_hash(r.get(at + 2), "a leaf hash")?,
        user_id: r.get(at + 3),
        source: r.get(at + 4),
        id: r.get(at + 5),
        received_at: r.get(at + 6),
        payload_sha256: log_hash(r.get(at + 7), "a payload hash")?,
    })
}

/// Stored hashes `[start, end)` of tier `level` (0: the leaf hashes), fewer when the tree
/// holds fewer; a hash missing before the last one read is an error (a damaged tree). The
/// tree only grows and a range names fixed positions, so reads outside a transaction agree.
async fn tier_rows(
    c: &impl GenericClient,
    level: u8,
    start: u64,
    end: u64,
) -> Result<Vec<Hash>, StoreError> {
    if end <= start {
        return Ok(Vec::new());
    }
    let (s, e) = (log_i64(start)?, i64::try_from(end).unwrap_or(i64::MAX));
    let rows = if level == 0 {
        c.query(
            "SELECT idx, leaf_hash FROM log_leaves WHERE idx >= $1 AND idx < $2 ORDER BY idx",
            &[&s, &e],
        )
        .await?
    } else {
        c.query(
            "SELECT idx, hash FROM log_tiers WHERE level = $3 AND idx >= $1 AND idx < $2 \
             ORDER BY idx",
            &[&s, &e, &i16::from(level)],
        )
        .await?
    };
    let mut out = Vec::with_capacity(rows.len());
    for (k, r) in rows.iter().enumerate() {
        let want = start + k as u64;
        if u64::try_from(r.get::<_, i64>(0)).ok() != Some(want) {
            return Err(StoreError::Other(format!(
                "review log: tier {level} has no hash at index {want} (the stored tree is damaged)"
            )));
        }
        out.push(log_hash(r.get(1), "a tier hash")?);
    }
    Ok(out)
}

/// The stored tree's right edge (size: one past the last leaf index; indices are gapless, so
/// a hole an edit left fails the load instead of shrinking the tree).
async fn load_edge(c: &impl GenericClient) -> Result<Edge, StoreError> {
    let n: i64 = c.query_one("SELECT coalesce(max(idx) + 1, 0) FROM log_leaves", &[]).await?.get(0);
    let size = log_u64(n, "the tree size")?;
    let mut tiers = Vec::new();
    for (level, start, end) in edge_ranges(size) {
        tiers.push(tier_rows(c, level, start, end).await?);
    }
    Edge::load(size, tiers).map_err(|e| StoreError::Other(format!("review log: {e}")))
}

/// One sequencer pass on `client` (whose session holds the lock), in one transaction: reads
/// the events `scan` names ([`SeqScan`]), appends up to `max` of those without a leaf, oldest
/// `pk` first (gaps and sweep below the scan, then the scan), with the tier hashes they
/// complete, and commits; `scan` moves on only once the transaction committed.
async fn sequence_pass(
    client: &mut Client,
    scan: &mut SeqScan,
    max: usize,
) -> Result<LogHead, StoreError> {
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    let tx = client.transaction().await?;
    // Compiling these small index reads costs more than running them (35 ms of 60 measured).
    tx.batch_execute("SET LOCAL jit = off").await?;
    let now: i64 = tx.query_one(&format!("SELECT {CLOCK_US}"), &[]).await?.get(0);
    let mut next = scan.clone();
    if next.hi.is_none() {
        let last: i64 =
            tx.query_one("SELECT coalesce(max(event_pk), 0) FROM log_leaves", &[]).await?.get(0);
        next.begin(last, now);
    }
    next.start_sweep_if_due(now);
    let mut edge = load_edge(&tx).await?;

    // Below the scan: what became visible in the gaps, and a page of the sweep.
    let mut older: BTreeMap<i64, Candidate> = BTreeMap::new();
    let mut gap_rows: Vec<Candidate> = Vec::new();
    let mut gaps_read = true;
    if !next.gaps.is_empty() && max > 0 {
        let los: Vec<i64> = next.gaps.iter().map(|g| g.lo).collect();
        let his: Vec<i64> = next.gaps.iter().map(|g| g.hi).collect();
        // One index range per gap (a plain join walks every event: 2.7 s at 2·10⁶).
        let from = "FROM unnest($1::int8[], $2::int8[]) AS g(lo, hi)
                    CROSS JOIN LATERAL (SELECT * FROM events x WHERE x.pk BETWEEN g.lo AND g.hi
                                        ORDER BY x.pk LIMIT $3) e
                    ORDER BY e.pk LIMIT $3";
        let rows = tx.query(&probe_sql(from), &[&los, &his, &limit]).await?;
        gaps_read = rows.len() < max;
        gap_rows = rows.iter().map(Candidate::of).collect();
    }
    let mut swept_to = None;
    if let Some((lo, top)) = next.sweep {
        let rows = if lo < top {
            let from = "FROM events e WHERE e.pk > $1 AND e.pk <= $2 ORDER BY e.pk LIMIT $3";
            tx.query(&probe_sql(from), &[&lo, &top, &LOG_SWEEP_ROWS]).await?
        } else {
            Vec::new()
        };
        swept_to = Some(if (rows.len() as i64) < LOG_SWEEP_ROWS {
            top
        } else {
            rows.last().map_or(lo, |r| r.get(0))
        });
        for c in rows.iter().map(Candidate::of).filter(|c| c.sha.is_some()) {
            older.insert(c.pk, c);
        }
    }
    // Visible in a gap: appended below (or it had its leaf already), so it leaves the gap.
    let mut visible: Vec<i64> = Vec::new();
    for c in gap_rows {
        match c.sha {
            None => visible.push(c.pk),
            Some(_) => {
                older.insert(c.pk, c);
            }
        }
    }
    if older.len() > max {
        // The lowest `max` are taken: the sweep resumes after the last one (everything
        // without a leaf below it is taken), and the gaps are read again.
        let keep: BTreeMap<i64, Candidate> = older.into_iter().take(max).collect();
        let last = keep.keys().next_back().copied().unwrap_or(i64::MIN);
        swept_to = swept_to.map(|to| to.min(last));
        gaps_read = false;
        older = keep;
    }
    let remaining = max - older.len();

    // The scan: every visible event above `hi`, with a leaf or not, so the pks it steps over
    // are known.
    let mut fresh: Vec<Candidate> = Vec::new();
    let mut seen: Vec<(i64, i64)> = Vec::new();
    let mut found = now;
    if remaining > 0 {
        let hi = next.hi.unwrap_or(0);
        let from = "FROM events e WHERE e.pk > $1 ORDER BY e.pk LIMIT $2";
        let page = i64::try_from(remaining).unwrap_or(i64::MAX);
        let rows = tx.query(&probe_sql(from), &[&hi, &page]).await?;
        found = tx.query_one(&format!("SELECT {CLOCK_US}"), &[]).await?.get(0);
        for c in rows.iter().map(Candidate::of) {
            seen.push((c.pk, c.received_at));
            if c.sha.is_some() {
                fresh.push(c);
            }
        }
    }

    // Append, oldest pk first, then write the leaves and tier hashes in two statements.
    let mut idx: Vec<i64> = Vec::new();
    let mut pks: Vec<i64> = Vec::new();
    let mut users: Vec<String> = Vec::new();
    let mut sources: Vec<String> = Vec::new();
    let mut ids: Vec<String> = Vec::new();
    let mut received: Vec<i64> = Vec::new();
    let mut shas: Vec<Vec<u8>> = Vec::new();
    let mut hashes: Vec<Vec<u8>> = Vec::new();
    let (mut levels, mut tier_idx, mut tier_hashes): (Vec<i16>, Vec<i64>, Vec<Vec<u8>>) =
        Default::default();
    for c in older.into_values().chain(fresh) {
        let Some(sha) = c.sha else { continue };
        let payload_sha256 = log_hash(sha, "a payload hash")?;
        let leaf = EventLeaf {
            user_id: &c.user_id,
            source: &c.source,
            id: &c.id,
            received_at: c.received_at,
            payload_sha256,
        }
        .hash();
        idx.push(log_i64(edge.size())?);
        for t in edge.append(leaf) {
            levels.push(i16::from(t.level));
            tier_idx.push(log_i64(t.index)?);
            tier_hashes.push(t.hash.to_vec());
        }
        pks.push(c.pk);
        users.push(c.user_id);
        sources.push(c.source);
        ids.push(c.id);
        received.push(c.received_at);
        shas.push(payload_sha256.to_vec());
        hashes.push(leaf.to_vec());
    }
    if !idx.is_empty() {
        tx.execute(
            "INSERT INTO log_leaves (idx, event_pk, user_id, source, id, received_at,
                                     payload_sha256, leaf_hash)
             SELECT * FROM unnest($1::int8[], $2::int8[], $3::text[], $4::text[], $5::text[],
                                  $6::int8[], $7::bytea[], $8::bytea[])",
            &[&idx, &pks, &users, &sources, &ids, &received, &shas, &hashes],
        )
        .await?;
    }
    if !levels.is_empty() {
        tx.execute(
            "INSERT INTO log_tiers (level, idx, hash)
             SELECT * FROM unnest($1::int2[], $2::int8[], $3::bytea[])",
            &[&levels, &tier_idx, &tier_hashes],
        )
        .await?;
    }
    tx.commit().await?;
    visible.extend(&pks);
    visible.sort_unstable();
    next.carve(&visible);
    if gaps_read {
        next.expire_gaps(now);
    }
    if let Some(to) = swept_to {
        next.swept(to, now);
    }
    next.scanned(&seen, now, found);
    *scan = next;
    Ok(LogHead { size: edge.size(), root: edge.root(), appended: idx.len() as u64 })
}

impl Store for PgStore {
    async fn add_user(&self, email: &str, role: Role) -> Result<User, StoreError> {
        let c = self.client().await?;
        let id = random_id();
        // One statement: the user and their first role row together.
        let n = c
            .execute(
                "WITH u AS (INSERT INTO users(id, email) VALUES ($1, $2) ON CONFLICT (email) DO NOTHING RETURNING id)
                 INSERT INTO user_roles(user_id, role) SELECT id, $3 FROM u",
                &[&id, &email, &role.as_str()],
            )
            .await?;
        if n == 0 {
            return Err(StoreError::Conflict(format!("user {email} already exists")));
        }
        Ok(User { id, email: email.to_string(), role })
    }

    async fn set_role(&self, user_id: &str, role: Role) -> Result<(), StoreError> {
        let c = self.client().await?;
        let n = c
            .execute(
                "INSERT INTO user_roles(user_id, role) SELECT id, $2 FROM users WHERE id = $1",
                &[&user_id, &role.as_str()],
            )
            .await?;
        if n == 0 {
            return Err(StoreError::NotFound(format!("no user with id {user_id}")));
        }
        Ok(())
    }

    async fn list_users(&self) -> Result<Vec<User>, StoreError> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT u.id, u.email, (SELECT role FROM user_roles r WHERE r.user_id = u.id ORDER BY n DESC LIMIT 1)
                 FROM users u ORDER BY u.email",
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let role: String = r.get(2);
                Ok(User {
                    id: r.get(0),
                    email: r.get(1),
                    role: role.parse().map_err(StoreError::Other)?,
                })
            })
            .collect()
    }

    async fn user_by_email(&self, email: &str) -> Result<Option<User>, StoreError> {
        let c = self.client().await?;
        let row = c.query_opt("SELECT id, email FROM users WHERE email = $1", &[&email]).await?;
        self.user_with_role(&c, row).await
    }

    async fn user_by_id(&self, id: &str) -> Result<Option<User>, StoreError> {
        let c = self.client().await?;
        let row = c.query_opt("SELECT id, email FROM users WHERE id = $1", &[&id]).await?;
        self.user_with_role(&c, row).await
    }

    async fn create_token(
        &self,
        token_id: &str,
        user_id: &str,
        hash: [u8; 32],
    ) -> Result<(), StoreError> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO tokens(id, user_id, hash) VALUES ($1, $2, $3)",
            &[&token_id, &user_id, &hash.as_slice()],
        )
        .await?;
        Ok(())
    }

    async fn revoke_token(&self, token_id: &str) -> Result<bool, StoreError> {
        let c = self.client().await?;
        let n = c
            .execute(
                "INSERT INTO token_revocations(token_id) SELECT id FROM tokens WHERE id = $1",
                &[&token_id],
            )
            .await?;
        Ok(n > 0)
    }

    async fn list_tokens(&self, user_id: &str) -> Result<Vec<(String, bool)>, StoreError> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT t.id, EXISTS(SELECT 1 FROM token_revocations r WHERE r.token_id = t.id)
                 FROM tokens t WHERE t.user_id = $1 ORDER BY t.created_at, t.id",
                &[&user_id],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn authenticate(&self, hash: [u8; 32]) -> Result<Option<User>, StoreError> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                "SELECT u.id, u.email, (SELECT role FROM user_roles r WHERE r.user_id = u.id ORDER BY n DESC LIMIT 1)
                 FROM tokens t JOIN users u ON u.id = t.user_id
                 WHERE t.hash = $1
                   AND NOT EXISTS (SELECT 1 FROM token_revocations r WHERE r.token_id = t.id)",
                &[&hash.as_slice()],
            )
            .await?;
        row.map(|r| {
            let role: String = r.get(2);
            Ok(User {
                id: r.get(0),
                email: r.get(1),
                role: role.parse().map_err(StoreError::Other)?,
            })
        })
        .transpose()
    }

    async fn insert_events(
        &self,
        user_id: &str,
        received_at: Micros,
        events: &[NewEvent],
    ) -> Result<Vec<Inserted>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        // In a transaction of its own: deciding a stored key takes a transaction lock.
        let mut guard = self.tx_client().await?;
        let Some(client) = guard.as_mut() else {
            return Err(StoreError::Unavailable("no connection for the insert".into()));
        };
        let tx = client.transaction().await?;
        let inserted = insert_event_rows(&tx, user_id, received_at, events).await?;
        tx.commit().await?;
        Ok(inserted)
    }

    async fn ingest(
        &self,
        user_id: &str,
        received_at: Micros,
        events: &[NewEvent],
        scan: Arc<dyn IngestScan>,
    ) -> Result<Vec<Inserted>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let mut guard = self.tx_client().await?;
        let Some(client) = guard.as_mut() else {
            return Err(StoreError::Unavailable("no connection for the ingest".into()));
        };
        // Dropped without `commit` (an error below), the transaction rolls back: nothing of
        // the batch is stored and the client's retry creates it again.
        let tx = client.transaction().await?;
        let inserted = insert_event_rows(&tx, user_id, received_at, events).await?;
        crash_point("after-events");
        let mut flags = scan.batch_flags(&inserted);
        for session in scan.ended_sessions(&inserted) {
            let mut sc = SessionScan::new(user_id, &session);
            feed_session(&tx, &mut sc).await?;
            flags.extend(scan.session_flags(sc));
            if let Some(mut cs) = scan.correlate_scan(&session) {
                feed_correlate(&tx, &mut cs).await?;
                flags.extend(scan.correlate_flags(cs));
            }
        }
        insert_flag_rows(&tx, &flags).await?;
        crash_point("after-flags");
        tx.commit().await?;
        Ok(inserted)
    }

    async fn query_event_page(&self, q: &EventQuery) -> Result<EventPage, StoreError> {
        let c = self.client().await?;
        // Phase one reads no payload: `octet_length` of a TOASTed value reads its header only.
        let (tail, args) = q.sql_tail(
            |n| format!("${n}"),
            |op, p| format!("e.received_at {op} {p}::text::timestamptz"),
        );
        let sql = format!("SELECT e.pk, octet_length(e.payload)::int8 FROM events e{tail}");
        let args: Vec<Box<dyn ToSql + Sync + Send>> = args.into_iter().map(pg_arg).collect();
        let refs: Vec<&(dyn ToSql + Sync)> =
            args.iter().map(|a| a.as_ref() as &(dyn ToSql + Sync)).collect();
        let heads: Vec<(i64, i64)> = c
            .query(&sql, &refs)
            .await?
            .iter()
            .map(|r| (r.get(0), r.get::<_, Option<i64>>(1).unwrap_or(0)))
            .collect();
        let (keep, truncated) = q.within_budget(heads.iter().map(|h| h.1));
        let pks: Vec<i64> = heads.iter().take(keep).map(|h| h.0).collect();
        if pks.is_empty() {
            return Ok(EventPage { events: Vec::new(), truncated });
        }
        let rows = c
            .query(&format!("SELECT {EVENT_COLS} FROM events WHERE pk = ANY($1)"), &[&pks])
            .await?;
        let events = rows.iter().map(event_from_row).collect();
        Ok(EventPage { events: super::in_phase_order(&pks, events), truncated })
    }

    async fn scan_session(&self, scan: SessionScan) -> Result<SessionScan, StoreError> {
        let c = self.client().await?;
        let mut scan = scan;
        feed_session(&*c, &mut scan).await?;
        Ok(scan)
    }

    async fn scan_correlate(&self, scan: CorrelateScan) -> Result<CorrelateScan, StoreError> {
        let c = self.client().await?;
        let mut scan = scan;
        feed_correlate(&*c, &mut scan).await?;
        Ok(scan)
    }

    async fn session_events(
        &self,
        user_id: &str,
        session: &str,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let c = self.client().await?;
        session_rows(&*c, user_id, session).await
    }

    async fn session_transcript_items(
        &self,
        user_id: &str,
        session: &str,
        max_files: usize,
    ) -> Result<SessionTranscriptItems, StoreError> {
        let c = self.client().await?;
        let end_id = format!("{session}:end");
        let end_record: Option<String> = c
            .query_opt(
                "SELECT payload FROM events WHERE user_id = $1 AND session = $2 \
                 AND source = 'session' AND id = $3 AND conflict_of IS NULL ORDER BY pk LIMIT 1",
                &[&user_id, &session, &end_id],
            )
            .await?
            .map(|r| r.get(0));
        let limit = i64::try_from(max_files).unwrap_or(i64::MAX);
        // "C": byte order, as the embedded store compares text, so both truncate alike.
        let rows = super::TRANSCRIPT_FILE_ROWS.replace("{1}", "$1").replace("{2}", "$2");
        let published = c
            .query(
                &format!(
                    "SELECT file, payload, (extract(epoch from received_at) * 1000000)::int8 \
                     FROM events WHERE pk IN (SELECT max(pk) FROM events WHERE {rows} \
                     GROUP BY file ORDER BY file COLLATE \"C\" LIMIT $3) ORDER BY file COLLATE \"C\""
                ),
                &[&user_id, &session, &limit],
            )
            .await?
            .iter()
            .map(|r| PublishedFile { file: r.get(0), payload: r.get(1), received_at: r.get(2) })
            .collect();
        Ok(SessionTranscriptItems { end_record, published })
    }

    async fn transcript_line_counts(
        &self,
        user_id: &str,
        session: &str,
        files: &[String],
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let c = self.client().await?;
        let rows = super::TRANSCRIPT_LINE_ROWS.replace("{1}", "$1").replace("{2}", "$2");
        let counts = c
            .query(
                &format!(
                    "SELECT file, count(*)::int8 FROM events WHERE {rows} AND file = ANY($3) \
                     GROUP BY file"
                ),
                &[&user_id, &session, &files],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        Ok(counts)
    }

    async fn person_activity(
        &self,
        user_ids: &[String],
        week_start: Micros,
    ) -> Result<Vec<PersonActivity>, StoreError> {
        // Three statements for everyone (not three per person): each is a network round trip.
        let c = self.client().await?;
        let week_end = week_start.saturating_add(7 * 86_400_000_000);
        let denied = super::DENIED_SQL.replace("{strpos}", "strpos");
        let days = c
            .query(
                &format!(
                    "SELECT e.user_id, (e.ts - $2) / 86400000000 AS d, count(*), \
                     sum(CASE WHEN {denied} THEN 1 ELSE 0 END) FROM events e \
                     WHERE e.user_id = ANY($1) AND e.ts >= $2 AND e.ts < $3 GROUP BY e.user_id, d"
                ),
                &[&user_ids, &week_start, &week_end],
            )
            .await?;
        let last = c
            .query(
                "SELECT u.id, (SELECT (extract(epoch from e.received_at) * 1000000)::int8 \
                 FROM events e WHERE e.user_id = u.id ORDER BY e.pk DESC LIMIT 1) \
                 FROM unnest($1::text[]) AS u(id)",
                &[&user_ids],
            )
            .await?;
        let flags = c
            .query(
                "SELECT f.user_id, f.severity, count(*) FROM flags f WHERE f.user_id = ANY($1) \
                 AND coalesce((SELECT s.state FROM flag_states s WHERE s.flag_id = f.id \
                 ORDER BY s.n DESC LIMIT 1), 'open') = 'open' GROUP BY f.user_id, f.severity",
                &[&user_ids],
            )
            .await?;
        let mut by_user: std::collections::HashMap<&str, PersonActivity> = user_ids
            .iter()
            .map(|u| (u.as_str(), PersonActivity { user_id: u.clone(), ..Default::default() }))
            .collect();
        let mut day_rows: std::collections::HashMap<String, Vec<(i64, i64, i64)>> =
            std::collections::HashMap::new();
        for r in &days {
            day_rows.entry(r.get(0)).or_default().push((r.get(1), r.get(2), r.get(3)));
        }
        for (user, rows) in day_rows {
            if let Some(a) = by_user.get_mut(user.as_str()) {
                a.daily = super::week_of(rows);
            }
        }
        for r in &last {
            if let Some(a) = by_user.get_mut(r.get::<_, &str>(0)) {
                a.last_received = r.get(1);
            }
        }
        for r in &flags {
            if let Some(a) = by_user.get_mut(r.get::<_, &str>(0)) {
                a.open_flags.push((r.get(1), r.get::<_, i64>(2).max(0) as u64));
            }
        }
        Ok(user_ids.iter().filter_map(|u| by_user.remove(u.as_str())).collect())
    }

    async fn hour_counts(
        &self,
        user_id: &str,
        start: Micros,
        hours: u32,
    ) -> Result<Vec<HourCount>, StoreError> {
        let c = self.client().await?;
        let end = start.saturating_add(i64::from(hours) * 3_600_000_000);
        let sql = super::hour_counts_sql("strpos", |n| format!("${n}"));
        let rows = c.query(&sql, &[&user_id, &start, &end]).await?;
        let n = |r: &tokio_postgres::Row, i: usize| {
            r.get::<_, Option<i64>>(i).unwrap_or(0).max(0) as u64
        };
        Ok(rows
            .iter()
            .map(|r| HourCount {
                hour: r.get(0),
                allowed: n(r, 1),
                denied: n(r, 2),
                transcript: n(r, 3),
                flags: n(r, 4),
            })
            .collect())
    }

    async fn event_flag_counts(&self, pks: &[i64]) -> Result<Vec<(i64, u64)>, StoreError> {
        if pks.is_empty() {
            return Ok(Vec::new());
        }
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT event_pk, count(*) FROM flag_events WHERE event_pk = ANY($1) \
                 GROUP BY event_pk",
                &[&pks],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1).max(0) as u64)).collect())
    }

    async fn insert_flags(&self, flags: &[NewFlag]) -> Result<(), StoreError> {
        let c = self.client().await?;
        insert_flag_rows(&*c, flags).await
    }

    async fn list_flags(&self, q: &FlagQuery) -> Result<Vec<(i64, Flag)>, StoreError> {
        let c = self.client().await?;
        let (tail, flag_args) = q.sql_tail(|n| format!("${n}"));
        let sql = format!("SELECT {FLAG_COLS} FROM flags f{tail}");
        let args: Vec<Box<dyn ToSql + Sync + Send>> = flag_args.into_iter().map(pg_arg).collect();
        let refs: Vec<&(dyn ToSql + Sync)> =
            args.iter().map(|a| a.as_ref() as &(dyn ToSql + Sync)).collect();
        let rows = c.query(&sql, &refs).await?;
        self.load_flags(&c, rows).await
    }

    async fn get_flag(&self, id: &str) -> Result<Option<Flag>, StoreError> {
        let c = self.client().await?;
        let rows = c.query(&format!("SELECT {FLAG_COLS} FROM flags WHERE id = $1"), &[&id]).await?;
        Ok(self.load_flags(&c, rows).await?.into_iter().next().map(|(_, f)| f))
    }

    async fn append_flag_state(&self, a: &FlagAction<'_>) -> Result<bool, StoreError> {
        // The function derives the actor from `a.secret` and stamps the database clock; the
        // caller's `actor` and `at` are not trusted here (the runtime role cannot write
        // flag_states itself).
        let c = self.client().await?;
        // `self_action` (the server allowed a self-action: sole reviewer, or an admin's
        // override) is the function's `override`; it re-derives `self` on its own.
        let rows = c
            .query(
                "SELECT n FROM airlock_flag_state($1, $2, $3, $4, $5)",
                &[&a.secret, &a.flag_id, &a.state.as_str(), &a.note, &a.self_action],
            )
            .await
            .map_err(flag_state_error)?;
        Ok(!rows.is_empty())
    }

    async fn assign_flag(&self, a: &FlagAssignment<'_>) -> Result<bool, StoreError> {
        // As `append_flag_state`: the function re-checks the token, role and self rule, checks
        // the assignee, and keeps the flag's state under the flag's row lock.
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT n FROM airlock_flag_assign($1, $2, $3, $4, $5)",
                &[&a.secret, &a.flag_id, &a.assignee, &a.note, &a.self_action],
            )
            .await
            .map_err(flag_state_error)?;
        Ok(!rows.is_empty())
    }

    async fn open_gate(&self, gate: &NewGate, caps: GateCaps) -> Result<Opened, StoreError> {
        let mut guard = self.tx_client().await?;
        let Some(client) = guard.as_mut() else {
            return Err(StoreError::Unavailable("no connection for the gate".into()));
        };
        let tx = client.transaction().await?;
        // One opening per requester at a time, so the caps below hold under concurrency
        // (released at commit or rollback).
        tx.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 18))", &[&gate.user_id])
            .await?;
        let user = pending_gates(&tx, &gate.user_id, None).await?;
        if user >= caps.per_user {
            return Ok(Opened::UserLimit(user));
        }
        if let Some(session) = gate.session.as_deref() {
            let n = pending_gates(&tx, &gate.user_id, Some(session)).await?;
            if n >= caps.per_session {
                return Ok(Opened::SessionLimit(n));
            }
        }
        let port = gate.port.map(i32::from);
        // `requested_at` and `deadline` are the database's (trigger, migration 0011).
        tx.execute(
            "INSERT INTO gates (id, user_id, kind, session, repo, method, host, port, request,
               action, digest, severity, rule, layer, policy, local_id, context, self_approve,
               timeout_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
               $18, $19)",
            &[
                &gate.id,
                &gate.user_id,
                &gate.kind.as_str(),
                &gate.session,
                &gate.repo,
                &gate.method,
                &gate.host,
                &port,
                &gate.request,
                &gate.action,
                &gate.digest,
                &gate.severity.as_str(),
                &gate.rule,
                &gate.layer,
                &gate.policy,
                &gate.local_id,
                &gate.context,
                &gate.self_approve,
                &gate.timeout_ms,
            ],
        )
        .await?;
        let g = load_gate(&tx, &gate.id)
            .await?
            .ok_or_else(|| StoreError::Other(format!("gate {} vanished", gate.id)))?;
        insert_event_rows(&tx, &gate.user_id, 0, &[gates::step_event(&g, None)]).await?;
        tx.commit().await?;
        Ok(Opened::Gate(Box::new(g)))
    }

    async fn get_gate(&self, id: &str) -> Result<Option<Gate>, StoreError> {
        let c = self.client().await?;
        load_gate(&*c, id).await
    }

    async fn list_gates(&self, q: &GateQuery) -> Result<Vec<Gate>, StoreError> {
        let c = self.client().await?;
        let (tail, args) = q.sql_tail(|n| format!("${n}"), Some("now()"), 0);
        let sql = format!("SELECT {}{GATE_FROM}{tail}", gate_cols());
        let args: Vec<Box<dyn ToSql + Sync + Send>> = args.into_iter().map(pg_arg).collect();
        let refs: Vec<&(dyn ToSql + Sync)> =
            args.iter().map(|a| a.as_ref() as &(dyn ToSql + Sync)).collect();
        let rows = c.query(&sql, &refs).await?;
        rows.iter().map(|r| gate_values(r).into_gate()).collect()
    }

    async fn decide_gate(&self, d: &DecisionRequest<'_>) -> Result<Decided, StoreError> {
        // The function re-checks the credential, the role, the self rule and the step-up flag
        // and stamps the database clock; the caller's `actor`, `self_decided` and `at` are
        // not trusted here (the runtime role cannot write gate_decisions itself).
        let mut guard = self.tx_client().await?;
        let Some(client) = guard.as_mut() else {
            return Err(StoreError::Unavailable("no connection for the decision".into()));
        };
        let tx = client.transaction().await?;
        let state = d.verdict.state().as_str();
        let row = tx
            .query_opt(
                "SELECT outcome FROM airlock_gate_decide($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &d.secret,
                    &d.gate_id,
                    &state,
                    &d.note,
                    &d.digest,
                    &d.override_requested,
                    &d.step_up,
                ],
            )
            .await
            .map_err(flag_state_error)?;
        let Some(row) = row else {
            return Ok(Decided::NoGate);
        };
        let outcome: String = row.get(0);
        let result = match outcome.as_str() {
            "done" => Decided::Done(Box::new(record_decision(&tx, d.gate_id).await?)),
            other => {
                let g = load_gate(&tx, d.gate_id)
                    .await?
                    .ok_or_else(|| StoreError::Other(format!("gate {} vanished", d.gate_id)))?;
                if other == "digest" {
                    Decided::Digest(Box::new(g))
                } else {
                    Decided::NotPending(Box::new(g))
                }
            }
        };
        tx.commit().await?;
        Ok(result)
    }

    async fn expire_gates(&self, max: usize) -> Result<Vec<Gate>, StoreError> {
        let mut guard = self.tx_client().await?;
        let Some(client) = guard.as_mut() else {
            return Err(StoreError::Unavailable("no connection for the expiry".into()));
        };
        let tx = client.transaction().await?;
        let max = i32::try_from(max).unwrap_or(i32::MAX);
        let ids: Vec<String> = tx
            .query("SELECT gate_id FROM airlock_gate_expire($1)", &[&max])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut out = Vec::with_capacity(ids.len());
        for id in &ids {
            out.push(record_decision(&tx, id).await?);
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn log_sequence(&self, max: usize) -> Result<Option<LogHead>, StoreError> {
        let mut guard = self.sequencer.lock().await;
        let seq = &mut *guard;
        if seq.client.as_ref().is_none_or(|c| c.is_closed()) {
            // A lost connection took its session's lock with it.
            seq.client = None;
            seq.locked = false;
            seq.client = Some(connect(&self.target).await?);
        }
        let Some(client) = seq.client.as_mut() else {
            return Err(StoreError::Unavailable("no connection for the sequencer".into()));
        };
        if !seq.locked {
            let got: bool = client
                .query_one("SELECT pg_try_advisory_lock($1)", &[&LOG_SEQUENCER_LOCK])
                .await?
                .get(0);
            if !got {
                return Ok(None);
            }
            seq.locked = true;
            // Another instance sequenced meanwhile, and its gaps are unknown here: start
            // over (a first pass sweeps).
            seq.scan = SeqScan::default();
        }
        let result = sequence_pass(client, &mut seq.scan, max).await;
        if client.is_closed() {
            seq.client = None;
            seq.locked = false;
        }
        result.map(Some)
    }

    async fn log_head(&self) -> Result<LogHead, StoreError> {
        let c = self.client().await?;
        let edge = load_edge(&*c).await?;
        Ok(LogHead { size: edge.size(), root: edge.root(), appended: 0 })
    }

    async fn log_tier(&self, level: u8, start: u64, end: u64) -> Result<Vec<Hash>, StoreError> {
        let c = self.client().await?;
        tier_rows(&*c, level, start, end).await
    }

    async fn log_leaves(&self, pks: &[i64]) -> Result<Vec<LogLeaf>, StoreError> {
        if pks.is_empty() {
            return Ok(Vec::new());
        }
        let c = self.client().await?;
        let rows = c
            .query(
                &format!("SELECT {LEAF_COLS} FROM log_leaves l WHERE l.event_pk = ANY($1)"),
                &[&pks],
            )
            .await?;
        let mut by_pk = HashMap::new();
        for r in &rows {
            let leaf = pg_leaf(r, 0)?;
            by_pk.insert(leaf.event_pk, leaf);
        }
        Ok(pks.iter().filter_map(|pk| by_pk.get(pk).cloned()).collect())
    }

    async fn log_event_leaf(
        &self,
        user_id: &str,
        source: &str,
        id: &str,
    ) -> Result<Option<(i64, Micros, Option<LogLeaf>)>, StoreError> {
        let c = self.client().await?;
        // The key names the original (a conflict has its own row, never the key).
        let row = c
            .query_opt(
                &format!(
                    "SELECT k.pk, (extract(epoch from k.received_at) * 1000000)::int8,
                            l.idx IS NOT NULL, {LEAF_COLS}
                     FROM event_keys k LEFT JOIN log_leaves l ON l.event_pk = k.pk
                     WHERE k.user_id = $1 AND k.source = $2 AND k.id = $3"
                ),
                &[&user_id, &source, &id],
            )
            .await?;
        let Some(r) = row else { return Ok(None) };
        let leaf = if r.get::<_, bool>(2) { Some(pg_leaf(&r, 3)?) } else { None };
        Ok(Some((r.get(0), r.get(1), leaf)))
    }

    async fn log_orphans(&self, user_id: &str, limit: u32) -> Result<Vec<LogLeaf>, StoreError> {
        let c = self.client().await?;
        // By pk alone: an event is found in whichever partition holds it.
        let rows = c
            .query(
                &format!(
                    "SELECT {LEAF_COLS} FROM log_leaves l WHERE l.user_id = $1
                       AND NOT EXISTS (SELECT 1 FROM events e WHERE e.pk = l.event_pk)
                     ORDER BY l.idx LIMIT $2"
                ),
                &[&user_id, &i64::from(limit)],
            )
            .await?;
        rows.iter().map(|r| pg_leaf(r, 0)).collect()
    }

    async fn log_add_checkpoint(&self, cp: &StoredCheckpoint) -> Result<(), StoreError> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO log_checkpoints (size, root, note, signed_at) VALUES ($1, $2, $3, $4)",
            &[&log_i64(cp.size)?, &cp.root.as_slice(), &cp.note, &cp.signed_at],
        )
        .await?;
        Ok(())
    }

    async fn log_checkpoint(
        &self,
        size: Option<u64>,
    ) -> Result<Option<StoredCheckpoint>, StoreError> {
        let c = self.client().await?;
        let size = size.map(log_i64).transpose()?;
        let row = c
            .query_opt(
                "SELECT size, root, note, signed_at FROM log_checkpoints
                 WHERE $1::int8 IS NULL OR size = $1 ORDER BY n DESC LIMIT 1",
                &[&size],
            )
            .await?;
        row.map(|r| {
            Ok(StoredCheckpoint {
                size: log_u64(r.get(0), "a checkpoint's size")?,
                root: log_hash(r.get(1), "a checkpoint's root")?,
                note: r.get(2),
                signed_at: r.get(3),
            })
        })
        .transpose()
    }

    async fn log_add_cosignature(&self, cs: &NewCosignature<'_>) -> Result<u64, StoreError> {
        let time = i64::try_from(cs.time).map_err(|_| {
            StoreError::Invalid(format!("cosignature time {} is out of range", cs.time))
        })?;
        let size = log_i64(cs.size)?;
        let mut guard = self.tx_client().await?;
        let Some(client) = guard.as_mut() else {
            return Err(StoreError::Unavailable("no connection for the cosignature".into()));
        };
        let tx = client.transaction().await?;
        // A key belongs to the first user who posts it (a concurrent first post of the same
        // key waits here for the other to commit, then reads its owner).
        tx.execute(
            "INSERT INTO log_cosigners (key, user_id) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
            &[&cs.key, &cs.user_id],
        )
        .await?;
        let owner: String = tx
            .query_one("SELECT user_id FROM log_cosigners WHERE key = $1", &[&cs.key])
            .await?
            .get(0);
        if owner != cs.user_id {
            return Err(StoreError::Conflict(
                "this cosigner key is tied to another user (a key belongs to the first user who \
                 posts it)"
                    .into(),
            ));
        }
        // The same key cosigning the same head again adds nothing (one row per head).
        tx.execute(
            "INSERT INTO log_cosignatures (key, user_id, size, root, time, line, at)
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (key, size, root) DO NOTHING",
            &[&cs.key, &cs.user_id, &size, &cs.root.as_slice(), &time, &cs.line, &cs.at],
        )
        .await?;
        let n: i64 = tx
            .query_one("SELECT count(DISTINCT key) FROM log_cosignatures WHERE size = $1", &[&size])
            .await?
            .get(0);
        tx.commit().await?;
        log_u64(n, "a witness count")
    }

    async fn log_witnesses(&self, size: u64) -> Result<u64, StoreError> {
        let c = self.client().await?;
        let n: i64 = c
            .query_one(
                "SELECT count(DISTINCT key) FROM log_cosignatures WHERE size = $1",
                &[&log_i64(size)?],
            )
            .await?
            .get(0);
        log_u64(n, "a witness count")
    }

    async fn log_witnessed(&self) -> Result<Option<(u64, u64)>, StoreError> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                "SELECT size, count(DISTINCT key) FROM log_cosignatures
                 WHERE size = (SELECT max(size) FROM log_cosignatures) GROUP BY size",
                &[],
            )
            .await?;
        row.map(|r| Ok((log_u64(r.get(0), "a tree size")?, log_u64(r.get(1), "a witness count")?)))
            .transpose()
    }

    async fn set_password(&self, user_id: &str, phc: &str) -> Result<(), StoreError> {
        let c = self.client().await?;
        let n = c
            .execute(
                "INSERT INTO user_passwords(user_id, phc, at) SELECT id, $2, $3 FROM users WHERE id = $1",
                &[&user_id, &phc, &crate::review::now_micros()],
            )
            .await?;
        if n == 0 {
            return Err(StoreError::NotFound(format!("no user with id {user_id}")));
        }
        Ok(())
    }

    async fn password_of(&self, user_id: &str) -> Result<Option<String>, StoreError> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                "SELECT phc FROM user_passwords WHERE user_id = $1 ORDER BY n DESC LIMIT 1",
                &[&user_id],
            )
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn create_invite(
        &self,
        hash: [u8; 32],
        user_id: &str,
        expires_at: Micros,
    ) -> Result<(), StoreError> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO invites(hash, user_id, created_at, expires_at) VALUES ($1, $2, $3, $4)",
            &[&hash.as_slice(), &user_id, &crate::review::now_micros(), &expires_at],
        )
        .await?;
        Ok(())
    }

    async fn invite_user(&self, hash: [u8; 32], now: Micros) -> Result<Option<User>, StoreError> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                "SELECT u.id, u.email FROM invites i JOIN users u ON u.id = i.user_id
                 WHERE i.hash = $1 AND i.expires_at > $2
                   AND NOT EXISTS (SELECT 1 FROM invite_uses x WHERE x.hash = i.hash)",
                &[&hash.as_slice(), &now],
            )
            .await?;
        self.user_with_role(&c, row).await
    }

    async fn accept_invite(
        &self,
        hash: [u8; 32],
        phc: &str,
        _now: Micros,
    ) -> Result<Option<User>, StoreError> {
        // The runtime role cannot write passwords or invite uses: the SECURITY DEFINER
        // function checks and consumes the invite (migration 0008), by the database clock.
        let c = self.client().await?;
        let row =
            c.query_one("SELECT airlock_accept_invite($1, $2)", &[&hash.as_slice(), &phc]).await?;
        let user_id: Option<String> = row.get(0);
        match user_id {
            Some(id) => self.user_by_id(&id).await,
            None => Ok(None),
        }
    }

    async fn create_console_session(
        &self,
        hash: [u8; 32],
        user_id: &str,
        now: Micros,
    ) -> Result<(), StoreError> {
        let c = self.client().await?;
        let sql = format!(
            "INSERT INTO console_sessions(hash, user_id, role, epoch, created_at)
             SELECT $1, u.id,
               (SELECT role FROM user_roles r WHERE r.user_id = u.id ORDER BY n DESC LIMIT 1),
               {}, $3 FROM users u WHERE u.id = $2",
            super::AUTH_EPOCH_SQL.replace("{u}", "u.id")
        );
        let n = c.execute(&sql, &[&hash.as_slice(), &user_id, &now]).await?;
        if n == 0 {
            return Err(StoreError::NotFound(format!("no user with id {user_id}")));
        }
        Ok(())
    }

    async fn console_session(
        &self,
        hash: [u8; 32],
    ) -> Result<Option<super::ConsoleSessionRow>, StoreError> {
        let c = self.client().await?;
        let sql = format!(
            "SELECT s.user_id, u.email, s.role, s.epoch, s.created_at,
               coalesce((SELECT max(at) FROM console_session_seen v WHERE v.hash = s.hash), s.created_at),
               EXISTS(SELECT 1 FROM console_session_ends e WHERE e.hash = s.hash),
               (SELECT role FROM user_roles r WHERE r.user_id = s.user_id ORDER BY n DESC LIMIT 1),
               {}
             FROM console_sessions s JOIN users u ON u.id = s.user_id WHERE s.hash = $1",
            super::AUTH_EPOCH_SQL.replace("{u}", "s.user_id")
        );
        let Some(r) = c.query_opt(&sql, &[&hash.as_slice()]).await? else { return Ok(None) };
        let (at_login, role): (String, String) = (r.get(2), r.get(7));
        Ok(Some(super::ConsoleSessionRow {
            user: User {
                id: r.get(0),
                email: r.get(1),
                role: role.parse().map_err(StoreError::Other)?,
            },
            role_at_login: at_login.parse().map_err(StoreError::Other)?,
            epoch_at_login: r.get(3),
            epoch_now: r.get(8),
            created_at: r.get(4),
            last_seen: r.get(5),
            ended: r.get(6),
        }))
    }

    async fn touch_console_session(&self, hash: [u8; 32], now: Micros) -> Result<(), StoreError> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO console_session_seen(hash, at) VALUES ($1, $2)",
            &[&hash.as_slice(), &now],
        )
        .await?;
        Ok(())
    }

    async fn end_console_session(
        &self,
        hash: [u8; 32],
        reason: &str,
        now: Micros,
    ) -> Result<(), StoreError> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO console_session_ends(hash, reason, at) VALUES ($1, $2, $3)",
            &[&hash.as_slice(), &reason, &now],
        )
        .await?;
        Ok(())
    }

    async fn auth_log(&self, email: &str, address: &str, _now: Micros) -> Result<(), StoreError> {
        // Written only through the SECURITY DEFINER ring writer (migration 0008); it clips
        // both strings. A NUL cannot reach PostgreSQL text.
        let c = self.client().await?;
        let (email, address) = (email.replace('\0', ""), address.replace('\0', ""));
        c.execute("SELECT airlock_auth_log($1, $2)", &[&email, &address]).await?;
        Ok(())
    }
}

/// What `migrate` is asked to do beyond applying migrations.
#[derive(Debug, Clone, Default)]
pub struct MigrateOptions {
    /// The role `airlockd review` connects as: granted exactly its column of [`GRANTS`].
    pub runtime_role: Option<String>,
    /// The role `airlockd admin` may connect as (users, roles, tokens, revocations).
    pub admin_role: Option<String>,
    /// CA for a TLS connection (when the URL names none).
    pub ca: Option<std::path::PathBuf>,
}

/// Applies pending migrations as the owner role, (re)writes the grants of the runtime and
/// admin roles (if named) to exactly [`GRANTS`] — revoking whatever older versions granted —
/// and creates partitions ahead ([`maintain`]).
pub async fn migrate(url: &str, opts: &MigrateOptions) -> Result<MaintainReport, StoreError> {
    let c =
        connect(&target(url, &PgOptions { ca: opts.ca.clone(), ..Default::default() })?).await?;
    c.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await?;
    // Serialize concurrent migrators.
    c.batch_execute("SELECT pg_advisory_lock(7247001)").await?;
    // Every migration not yet recorded is applied, not only those above the highest: numbers
    // are handed out to parallel branches, so a store may hold 5 before 2 arrives.
    let applied: std::collections::HashSet<i32> = c
        .query("SELECT version FROM schema_migrations", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for (version, sql) in MIGRATIONS {
        if !applied.contains(version) {
            c.batch_execute(&format!(
                "BEGIN; {sql}; INSERT INTO schema_migrations(version) VALUES ({version}); COMMIT;"
            ))
            .await?;
        }
    }
    c.batch_execute(
        "DROP TRIGGER IF EXISTS schema_migrations_insert_only ON schema_migrations;
         CREATE TRIGGER schema_migrations_insert_only BEFORE UPDATE OR DELETE ON schema_migrations
           FOR EACH ROW EXECUTE FUNCTION airlock_insert_only();",
    )
    .await?;
    let mut warnings = Vec::new();
    if opts.runtime_role.is_some() && opts.runtime_role == opts.admin_role {
        return Err(StoreError::Other(
            "--runtime-role and --admin-role must be different roles".into(),
        ));
    }
    for (role, kind) in
        [(&opts.runtime_role, RoleKind::Runtime), (&opts.admin_role, RoleKind::Admin)]
    {
        if let Some(role) = role {
            warnings.extend(grant_role(&c, role, kind).await?);
        }
    }
    let mut report = maintain_with(&c, 3).await;
    if let Ok(r) = &mut report {
        r.warnings.extend(warnings);
    }
    c.batch_execute("SELECT pg_advisory_unlock(7247001)").await?;
    report
}

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoleKind {
    Runtime,
    Admin,
}

/// Rewrites `role`'s privileges to its column of the contract, in one transaction: everything
/// on the store's tables, sequences and functions is revoked first (so grants of an older
/// version, e.g. v1's INSERT on every table, are gone), then exactly the contract is granted.
/// Refuses a superuser or a member of the owner role (privileges would not bind it); returns
/// warnings for what the owner cannot fix here.
async fn grant_role(c: &Client, role: &str, kind: RoleKind) -> Result<Vec<String>, StoreError> {
    let row = c
        .query_opt(
            "SELECT rolsuper, pg_has_role(rolname, current_user, 'USAGE'),
                    has_schema_privilege(rolname, current_schema(), 'CREATE'), current_schema()
             FROM pg_roles WHERE rolname = $1",
            &[&role],
        )
        .await?;
    let Some(row) = row else {
        return Err(StoreError::NotFound(format!(
            "no PostgreSQL role {role:?}; create it first (CREATE ROLE {role} LOGIN)"
        )));
    };
    let (superuser, member_of_owner, can_create): (bool, bool, bool) =
        (row.get(0), row.get(1), row.get(2));
    let schema: String = row.get(3);
    if superuser || member_of_owner {
        return Err(StoreError::Other(format!(
            "role {role:?} is a superuser or a member of the owner role: grants cannot limit it; \
             use a plain LOGIN role"
        )));
    }
    let r = quote_ident(role);
    let s = quote_ident(&schema);
    let mut sql = format!(
        "BEGIN;
         REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM {r};
         REVOKE ALL ON ALL SEQUENCES IN SCHEMA {s} FROM {r};
         REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {s} FROM {r};
         GRANT USAGE ON SCHEMA {s} TO {r};\n"
    );
    for (table, runtime, admin) in GRANTS {
        let privs = if kind == RoleKind::Runtime { runtime } else { admin };
        if !privs.is_empty() {
            sql.push_str(&format!("GRANT {privs} ON {table} TO {r};\n"));
        }
    }
    for (seq, runtime, admin) in SEQUENCE_GRANTS {
        if (kind == RoleKind::Runtime && *runtime) || (kind == RoleKind::Admin && *admin) {
            sql.push_str(&format!("GRANT USAGE ON SEQUENCE {seq} TO {r};\n"));
        }
    }
    if kind == RoleKind::Runtime {
        for f in RUNTIME_FUNCTIONS {
            sql.push_str(&format!("GRANT EXECUTE ON FUNCTION {f} TO {r};\n"));
        }
    }
    sql.push_str("COMMIT;");
    c.batch_execute(&sql).await?;
    let mut warnings = Vec::new();
    if can_create {
        warnings.push(format!(
            "role {role:?} may CREATE in schema {schema} (PostgreSQL before 15 grants it to PUBLIC): \
             run REVOKE CREATE ON SCHEMA {schema} FROM PUBLIC as the schema's owner"
        ));
    }
    Ok(warnings)
}

/// What `maintain` did.
#[derive(Debug, Clone, Default)]
pub struct MaintainReport {
    pub created: Vec<String>,
    /// Rows found in `events_default`; non-zero is a warning (those months lacked a partition).
    pub default_rows: i64,
    pub warnings: Vec<String>,
}

/// Creates monthly partitions from the current month through `ahead` months later (owner role).
pub async fn maintain(
    url: &str,
    ahead: u32,
    ca: Option<&std::path::Path>,
) -> Result<MaintainReport, StoreError> {
    let opts = PgOptions { ca: ca.map(std::path::Path::to_path_buf), ..Default::default() };
    let c = connect(&target(url, &opts)?).await?;
    maintain_with(&c, ahead).await
}

/// First day of the month `offset` months after the month of `now`.
fn month_start(now: time::OffsetDateTime, offset: i32) -> (i32, u8) {
    let m0 = now.year() * 12 + i32::from(u8::from(now.month())) - 1 + offset;
    (m0.div_euclid(12), (m0.rem_euclid(12) + 1) as u8)
}

async fn maintain_with(c: &Client, ahead: u32) -> Result<MaintainReport, StoreError> {
    maintain_at(c, time::OffsetDateTime::now_utc(), ahead).await
}

/// Partition maintenance relative to `now` (tests pass a future date to create a new month).
pub async fn maintain_at(
    c: &Client,
    now: time::OffsetDateTime,
    ahead: u32,
) -> Result<MaintainReport, StoreError> {
    let mut report = MaintainReport::default();
    for k in 0..=(ahead as i32) {
        let (y, m) = month_start(now, k);
        let (ny, nm) = month_start(now, k + 1);
        let name = format!("events_{y:04}_{m:02}");
        let exists: bool =
            c.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name]).await?.get(0);
        if exists {
            continue;
        }
        let from = format!("{y:04}-{m:02}-01T00:00:00Z");
        let to = format!("{ny:04}-{nm:02}-01T00:00:00Z");
        // One implicit transaction (one simple query): the partition exists only with its
        // TRUNCATE trigger.
        match c
            .batch_execute(&format!(
                "CREATE TABLE {name} PARTITION OF events FOR VALUES FROM ('{from}') TO ('{to}');
                 {}",
                no_truncate_sql(&name)
            ))
            .await
        {
            Ok(()) => report.created.push(name),
            Err(e) => report.warnings.push(format!(
                "could not create partition {name}: {e} (rows for that month are in events_default)"
            )),
        }
    }
    // Partitions made some other way (or before migration 0004) get the trigger too.
    for r in c
        .query(
            "SELECT i.inhrelid::regclass::text FROM pg_inherits i
             WHERE i.inhparent = 'events'::regclass
               AND NOT EXISTS (SELECT 1 FROM pg_trigger t
                               WHERE t.tgrelid = i.inhrelid AND t.tgname = 'no_truncate')",
            &[],
        )
        .await?
    {
        let name: String = r.get(0);
        if let Err(e) = c.batch_execute(&no_truncate_sql(&name)).await {
            report.warnings.push(format!("could not add the TRUNCATE trigger to {name}: {e}"));
        }
    }
    report.default_rows = c.query_one("SELECT count(*) FROM events_default", &[]).await?.get(0);
    if report.default_rows > 0 {
        report.warnings.push(format!(
            "events_default holds {} rows: a month had no partition when they arrived (they are still served); run maintain with a larger --months-ahead",
            report.default_rows
        ));
    }
    Ok(report)
}

/// The statement giving partition `name` (a regclass text, quoted if it needs to be) its
/// BEFORE TRUNCATE trigger: TRUNCATE of a partition does not fire the parent's.
fn no_truncate_sql(name: &str) -> String {
    format!(
        "CREATE TRIGGER no_truncate BEFORE TRUNCATE ON {name} \
         FOR EACH STATEMENT EXECUTE FUNCTION airlock_insert_only()"
    )
}

/// Connects as the owner for maintenance helpers and tests.
pub async fn owner_client(url: &str) -> Result<Client, StoreError> {
    connect(&target(url, &PgOptions::default())?).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const D: i64 = LOG_TX_BOUND_US;

    #[test]
    fn the_sequencer_keeps_the_gaps_it_steps_over_until_nothing_can_land_in_them() {
        let mut s = SeqScan::default();
        s.begin(10, 1_000);
        assert_eq!(s.hi, Some(10));
        // The scan reads 11, 12, 15 and 20: 13-14 and 16-19 may be open transactions.
        s.scanned(&[(11, 900), (12, 900), (15, 900), (20, 900)], 1_000, 1_001);
        assert_eq!(s.hi, Some(20));
        assert_eq!(
            s.gaps,
            [Gap { lo: 13, hi: 14, found: 1_001 }, Gap { lo: 16, hi: 19, found: 1_001 }]
        );
        // Behind an event older than twice the bound nothing can still be open: no gap.
        s.scanned(&[(30, 1_000 - 2 * D)], 1_000, 1_002);
        assert_eq!((s.hi, s.gaps.len()), (Some(30), 2));
        // No rows: nothing moves.
        s.scanned(&[], 5_000, 5_001);
        assert_eq!((s.hi, s.gaps.len()), (Some(30), 2));
        // What becomes visible (and gets its leaf) leaves its gap; the rest stays.
        s.carve(&[13, 17, 18, 25]);
        assert_eq!(
            s.gaps,
            [
                Gap { lo: 14, hi: 14, found: 1_001 },
                Gap { lo: 16, hi: 16, found: 1_001 },
                Gap { lo: 19, hi: 19, found: 1_001 }
            ]
        );
        s.carve(&[14, 16, 19]);
        assert!(s.gaps.is_empty());
        // Gaps are dropped only once the bound has passed since they were found.
        s.scanned(&[(40, 5_000)], 5_000, 5_002);
        s.expire_gaps(5_002 + D - 1);
        assert_eq!(s.gaps, [Gap { lo: 31, hi: 39, found: 5_002 }]);
        s.expire_gaps(5_002 + D);
        assert!(s.gaps.is_empty());
    }

    #[test]
    fn gaps_past_the_cap_are_left_to_a_sweep_that_starts_after_they_could_land() {
        let mut s = SeqScan { hi: Some(0), next_sweep: i64::MAX, ..Default::default() };
        // Every odd pk skipped: two gaps more than the cap.
        let n = LOG_MAX_GAPS as i64 + 2;
        let rows: Vec<(i64, i64)> = (1..=n).map(|k| (2 * k, 0)).collect();
        s.scanned(&rows, 0, 7);
        assert_eq!(s.gaps.len(), LOG_MAX_GAPS);
        assert_eq!(s.gaps[0], Gap { lo: 5, hi: 5, found: 7 }, "the two oldest dropped");
        assert_eq!(s.resweep, Some(7 + D));
        s.start_sweep_if_due(7 + D - 1);
        assert_eq!(s.sweep, None, "not before what was open in them could have committed");
        s.start_sweep_if_due(7 + D);
        assert_eq!((s.sweep, s.resweep), (Some((0, 2 * n)), None));
    }

    #[test]
    fn sweeps_run_at_start_again_after_the_bound_and_then_every_hour() {
        let mut s = SeqScan::default();
        s.begin(250_000, 0);
        assert_eq!(s.sweep, Some((0, 250_000)));
        // A page at a time: the next pass resumes after the last row read.
        s.swept(20_000, 10);
        assert_eq!(s.sweep, Some((20_000, 250_000)));
        s.swept(10, 11);
        assert_eq!(s.sweep, Some((20_000, 250_000)), "never backwards");
        s.swept(250_000, 12);
        assert_eq!(s.sweep, None);
        // Again once what was open at the start has had time to commit.
        s.start_sweep_if_due(D - 1);
        assert_eq!(s.sweep, None);
        s.scanned(&[(300_000, D)], D, D);
        s.start_sweep_if_due(D);
        assert_eq!(s.sweep, Some((0, 300_000)));
        s.swept(300_000, D + 5);
        assert_eq!(s.sweep, None);
        assert_eq!(s.next_sweep, D + 5 + LOG_SWEEP_EVERY_US);
        s.start_sweep_if_due(D + 5 + LOG_SWEEP_EVERY_US);
        assert!(s.sweep.is_some(), "every hour");
        // An empty store's sweep is through at once.
        let mut e = SeqScan::default();
        e.begin(0, 3);
        assert_eq!(e.sweep, Some((0, 0)));
        e.swept(0, 3);
        assert_eq!((e.sweep, e.next_sweep), (None, 3 + D));
    }
}
