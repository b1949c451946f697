//! Embedded store: one SQLite file (`review.db`) under the data dir, WAL mode with
//! `synchronous=FULL`, one writer connection behind a mutex; blocking calls run on tokio's
//! blocking pool. An ingest's events, keys and flags commit in one transaction, and each
//! migration with its `schema_migrations` row in one (docs/review.md, "Durability"). It also
//! owns how a store comes to exist: [`SqliteStore::create`] (only `airlockd review init`)
//! makes the data dir 0700 and the database 0600, and [`SqliteStore::open_existing`] (every
//! other command) refuses a dir that holds no store instead of silently creating an empty one.

use super::{
    EventPage, EventQuery, FlagAction, FlagAssignment, FlagQuery, GATE_COLS, GATE_FROM, GateCaps,
    GateRowValues, HourCount, IngestScan, LogHead, LogLeaf, NewCosignature, Opened, PersonActivity,
    PublishedFile, SessionTranscriptItems, Store, StoreError, StoredCheckpoint, crash_point,
    random_id,
};
use super::{log_hash, log_i64, log_u64};
use crate::review::correlate::{self, CorrelateScan};
use crate::review::detect::session::SessionScan;
use crate::review::gates::{self, Decided, DecisionRequest, Gate, GateQuery, GateState, NewGate};
use crate::review::{
    Flag, FlagState, FlagStateRecord, Inserted, Micros, NewEvent, NewFlag, Role, Source,
    StoredEvent, User, dedup, now_micros,
};
use crate::tlog::merkle::{Edge, edge_ranges};
use crate::tlog::{EventLeaf, Hash};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params, params_from_iter, types::Value};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Mutex;

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../migrations/sqlite_0001.sql")),
    (2, include_str!("../migrations/sqlite_0002.sql")),
    (3, include_str!("../migrations/sqlite_0003.sql")),
    (5, include_str!("../migrations/sqlite_0005.sql")),
    (6, include_str!("../migrations/sqlite_0006.sql")),
    (7, include_str!("../migrations/sqlite_0007.sql")),
    (8, include_str!("../migrations/sqlite_0008.sql")),
    (9, include_str!("../migrations/sqlite_0009.sql")),
    (10, include_str!("../migrations/sqlite_0010.sql")),
];

/// The embedded store. Cloning shares the connection.
///
/// One connection serves every request, one at a time. Its lock is tokio's, which hands the
/// connection over in the order it was asked for: a request never waits behind a stream of
/// later ones (with a plain mutex a thread that has just released it wins it back before the
/// woken waiter runs, and under sustained ingest one request could wait for minutes).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
    /// Whether ingests sequence their events in their own transaction (always, except in a
    /// benchmark's "log off" baseline: [`SqliteStore::set_log_sequencing`]).
    log_in_ingest: Arc<AtomicBool>,
}

impl SqliteStore {
    /// Opens `DIR/review.db`, creating the dir (0700) and the database (0600) if needed, and
    /// applies pending migrations. For tests and embedding; the commands use
    /// [`Self::create`] and [`Self::open_existing`], which never guess.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        if !data_dir.is_dir() {
            create_private_dir(data_dir)?;
        }
        let path = data_dir.join(DB_FILE);
        if !path.exists() {
            create_private_file(&path)?;
        }
        Self::open_file(path, OpenFlags::default())
    }

    /// Opens the store in `data_dir`, which must exist and hold a `review.db` with this
    /// store's schema; a missing or empty dir is an error naming it (never created here: a
    /// misspelled `--data-dir` must not become a new, empty store). A store left group- or
    /// world-accessible (made by an older version) is tightened to 0700/0600, with a warning.
    pub fn open_existing(data_dir: &Path) -> Result<Self, StoreError> {
        let path = data_dir.join(DB_FILE);
        let init_hint = format!(
            "create a store with `airlockd review init --data-dir {} --admin EMAIL` or pass the \
             --data-dir of an existing one",
            data_dir.display()
        );
        if !data_dir.is_dir() {
            return Err(StoreError::NotFound(format!(
                "{} does not exist or is not a directory; {init_hint}",
                data_dir.display()
            )));
        }
        if !path.is_file() {
            return Err(StoreError::NotFound(format!(
                "{} holds no review store (no {DB_FILE}); {init_hint}",
                data_dir.display()
            )));
        }
        // Without SQLITE_OPEN_CREATE a vanished file is an error, not a new empty database.
        let flags = OpenFlags::default().difference(OpenFlags::SQLITE_OPEN_CREATE);
        let probe = Connection::open_with_flags(&path, flags)
            .map_err(|e| StoreError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
        probe.busy_timeout(std::time::Duration::from_secs(5))?;
        let is_store = match has_schema(&probe) {
            Ok(found) => found,
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::NotADatabase =>
            {
                false
            }
            Err(e) => return Err(e.into()),
        };
        if !is_store {
            return Err(StoreError::NotFound(format!(
                "{} is not a review store (no schema); move it away and run `airlockd review \
                 init --data-dir {} --admin EMAIL`, or pass the --data-dir of an existing store",
                path.display(),
                data_dir.display()
            )));
        }
        drop(probe);
        // Only once it is known to be a store: a directory that is not one is left as it was.
        tighten_modes(data_dir)?;
        Self::open_file(path, flags)
    }

    /// Creates a new store in `data_dir` (made 0700; it may exist if empty, like a service
    /// manager's state directory) with its first rows written by `setup`, so no store ever
    /// exists without them. The database is built under a staging name and linked into place
    /// only when complete (link(2) fails rather than replace a `review.db` that appeared
    /// meanwhile); a crash leaves only a staging file, which the next `create` removes.
    pub async fn create<T, F, Fut>(data_dir: &Path, setup: F) -> Result<(Self, T), StoreError>
    where
        F: FnOnce(Self) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let dir = data_dir.to_path_buf();
        let staging = blocking(move || prepare_new_store_dir(&dir)).await?;
        let store = {
            let staging = staging.clone();
            blocking(move || Self::open_file(staging, OpenFlags::default())).await?
        };
        let result = setup(store.clone()).await;
        let conn = Arc::try_unwrap(store.conn)
            .map_err(|_| StoreError::Other("the new store is still in use after setup".into()))?
            .into_inner();
        let value = match result {
            Ok(v) => v,
            Err(e) => {
                drop(conn);
                remove_staging(&staging);
                return Err(e);
            }
        };
        let dir = data_dir.to_path_buf();
        let store = blocking(move || {
            // Closing the only connection checkpoints the WAL into the file and deletes it
            // (https://www.sqlite.org/wal.html#the_wal_file), so the staging file is complete.
            conn.close().map_err(|(_, e)| StoreError::from(e))?;
            let final_path = dir.join(DB_FILE);
            if sidecar(&staging, "-wal").exists() {
                remove_staging(&staging);
                return Err(StoreError::Other(format!(
                    "could not checkpoint the new store in {}; nothing was created, run init again",
                    dir.display()
                )));
            }
            let linked = std::fs::hard_link(&staging, &final_path);
            remove_staging(&staging);
            linked.map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => already_a_store(&dir),
                _ => io_error("cannot create", &final_path, e),
            })?;
            Self::open_existing(&dir)
        })
        .await?;
        Ok((store, value))
    }

    fn open_file(path: PathBuf, flags: OpenFlags) -> Result<Self, StoreError> {
        let mut conn = Connection::open_with_flags(&path, flags)
            .map_err(|e| StoreError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // FULL: in WAL mode, NORMAL may lose the last commits on power loss (the WAL is not
        // synced at commit); an answered ingest must survive one (sqlite.org/pragma.html#pragma_synchronous).
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        register_functions(&conn)?;
        migrate(&mut conn)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            path,
            log_in_ingest: Arc::new(AtomicBool::new(true)),
        })
    }

    /// **For benchmarks only** (`benches/review_ingest.rs`, the "log off" baseline of the
    /// review log's ingest cost): `false` makes `ingest` and `insert_events` store events
    /// without sequencing them in their transaction (their receipts say `leaf_pending`), so
    /// they wait for [`Store::log_sequence`] as PostgreSQL's do. Production never calls this;
    /// every store starts with it on. Shared by clones.
    #[doc(hidden)]
    pub fn set_log_sequencing(&self, on: bool) {
        self.log_in_ingest.store(on, Ordering::Relaxed);
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn with<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let guard = Arc::clone(&self.conn).lock_owned().await;
        tokio::task::spawn_blocking(move || {
            let mut guard = guard;
            f(&mut guard)
        })
        .await
        .map_err(|e| StoreError::Other(format!("store task failed: {e}")))?
    }

    /// Runs raw SQL on the connection (tests use it to prove UPDATE/DELETE are rejected).
    pub fn execute_raw(&self, sql: &str) -> Result<usize, StoreError> {
        // Called from synchronous code only (tests); inside a runtime this would panic.
        let conn = self.conn.blocking_lock();
        Ok(conn.execute(sql, [])?)
    }
}

/// The database file under the data dir.
const DB_FILE: &str = "review.db";
/// Prefix of the file `create` builds the database in before linking it to [`DB_FILE`].
const STAGING_PREFIX: &str = ".review.db.init-";

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Other(format!("store task failed: {e}")))?
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Unavailable(format!("{what} {}: {e}", path.display()))
}

fn already_a_store(dir: &Path) -> StoreError {
    StoreError::Conflict(format!(
        "{} already holds a review store; init never touches an existing one \
         (add users and tokens with `airlockd admin … --data-dir {}`)",
        dir.display(),
        dir.display()
    ))
}

/// `path` with SQLite's `-wal`/`-shm`/`-journal` suffix.
fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn remove_staging(staging: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(sidecar(staging, suffix));
    }
}

fn has_schema(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='schema_migrations'",
        [],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}

/// Creates `dir` (and missing parents) with mode 0700.
fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io_error("cannot create data dir", dir, e))
}

/// Creates `path` empty with mode 0600, set explicitly since the umask may have removed
/// bits. SQLite gives the `-wal`, `-shm` and `-journal` files it makes later the mode of the
/// database file (os_unix.c, `findCreateFileMode`), so they are 0600 too.
fn create_private_file(path: &Path) -> Result<(), StoreError> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io_error("cannot create", path, e))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| io_error("cannot set the mode of", path, e))
}

/// Sets the data dir to 0700 and the database and its `-wal`/`-shm`/`-journal` files to
/// 0600 where they allow more (stores made before `review init` existed were 0755/0644).
fn tighten_modes(dir: &Path) -> Result<(), StoreError> {
    let db = dir.join(DB_FILE);
    let mut paths = vec![(dir.to_path_buf(), 0o700)];
    for suffix in ["", "-wal", "-shm", "-journal"] {
        paths.push((sidecar(&db, suffix), 0o600));
    }
    for (p, want) in paths {
        let Ok(meta) = std::fs::metadata(&p) else { continue };
        let have = meta.permissions().mode() & 0o7777;
        if have & 0o077 != 0 {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(want))
                .map_err(|e| io_error("cannot restrict the mode of", &p, e))?;
            tracing::warn!(
                "{} was mode {have:o}, readable by others; set it to {want:o}",
                p.display()
            );
        }
    }
    Ok(())
}

/// Makes `dir` ready for a new store: created 0700 if missing; if present, it must be a
/// directory holding nothing but staging files of an interrupted `create` (removed), and is
/// made 0700. Returns the path of a fresh 0600 staging file.
fn prepare_new_store_dir(dir: &Path) -> Result<PathBuf, StoreError> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_private_dir(dir)?,
        Err(e) => return Err(io_error("cannot inspect", dir, e)),
        Ok(_) => {
            if !dir.is_dir() {
                return Err(StoreError::Conflict(format!(
                    "{} exists and is not a directory; pass a new or empty --data-dir",
                    dir.display()
                )));
            }
            if dir.join(DB_FILE).exists() {
                return Err(already_a_store(dir));
            }
            let entries = std::fs::read_dir(dir).map_err(|e| io_error("cannot read", dir, e))?;
            let mut leftovers = Vec::new();
            for entry in entries {
                let entry = entry.map_err(|e| io_error("cannot read", dir, e))?;
                let name = entry.file_name();
                if name.to_string_lossy().starts_with(STAGING_PREFIX) {
                    leftovers.push(entry.path());
                } else {
                    return Err(StoreError::Conflict(format!(
                        "{} is not empty (it holds {}); init creates a store only in a new or \
                         empty directory",
                        dir.display(),
                        name.to_string_lossy()
                    )));
                }
            }
            for p in leftovers {
                std::fs::remove_file(&p).map_err(|e| io_error("cannot remove", &p, e))?;
            }
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| io_error("cannot set the mode of", dir, e))?;
        }
    }
    let staging = dir.join(format!("{STAGING_PREFIX}{}", random_id()));
    create_private_file(&staging)?;
    Ok(staging)
}

/// SQL functions the migrations use: `airlock_sha256(text)` (migration 2's backfill of the
/// dedup keys' payload hashes, [`dedup::payload_sha256`]).
fn register_functions(conn: &Connection) -> Result<(), StoreError> {
    use rusqlite::functions::FunctionFlags;
    conn.create_scalar_function(
        "airlock_sha256",
        1,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| {
            let text: String = ctx.get(0)?;
            Ok(dedup::payload_sha256(&text).to_vec())
        },
    )?;
    Ok(())
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    migrate_with(conn, MIGRATIONS)
}

/// Applies each migration newer than the store's and its `schema_migrations` row in one
/// transaction, so a crash or error never leaves a migration applied but unrecorded (it would
/// fail on the next start) or half applied.
fn migrate_with(conn: &mut Connection, migrations: &[(i64, &str)]) -> Result<(), StoreError> {
    // Idempotent (a re-registration replaces the function); here so every migration path
    // has the functions migration 2 calls.
    register_functions(conn)?;
    let have: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='schema_migrations'",
            [],
            |r| r.get(0),
        )
        .map_err(StoreError::from)?;
    // Every migration not yet recorded is applied, not only those above the highest: numbers
    // are handed out to parallel branches, so a store may hold 5 before 2 arrives.
    let applied: std::collections::HashSet<i64> = if have == 0 {
        Default::default()
    } else {
        let mut stmt = conn.prepare("SELECT version FROM schema_migrations")?;
        stmt.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?
    };
    for (version, sql) in migrations {
        if !applied.contains(version) {
            let tx = conn.transaction()?;
            tx.execute_batch(sql).map_err(|e| {
                StoreError::Other(format!(
                    "review store migration {version} failed (nothing of it was applied): {e}"
                ))
            })?;
            tx.execute(
                "INSERT INTO schema_migrations(version, applied_at) VALUES (?1, ?2)",
                params![version, now_micros()],
            )?;
            tx.commit()?;
        }
    }
    Ok(())
}

/// Inserts a batch's events and dedup keys on `tx` (the caller commits). An item whose key
/// is stored is decided by [`dedup::decide`] against every stored content of the key (the
/// batch's own earlier items included): a duplicate reports the matching content, a conflict
/// is inserted as its own event with `conflict_of` and an `event_conflicts` row.
fn insert_event_rows(
    tx: &Connection,
    user_id: &str,
    received_at: Micros,
    events: &[NewEvent],
) -> Result<Vec<Inserted>, StoreError> {
    let mut out = Vec::with_capacity(events.len());
    let mut find = tx.prepare_cached(
        "SELECT k.pk, k.received_at, k.sha256,
                CASE WHEN k.sha256 IS NULL THEN (SELECT payload FROM events e WHERE e.pk = k.pk) END
         FROM event_keys k WHERE k.user_id = ?1 AND k.source = ?2 AND k.id = ?3",
    )?;
    let mut ins = tx.prepare_cached(
        "INSERT INTO events(user_id, source, id, type, ts, session, seq, boot, received_at, payload, conflict_of,
                            airlock_session, file, file_offset)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    )?;
    let mut key = tx.prepare_cached(
        "INSERT INTO event_keys(user_id, source, id, pk, received_at, sha256) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for e in events {
        let sha = dedup::payload_sha256(&e.payload);
        let found: Option<dedup::StoredRow> = find
            .query_row(params![user_id, e.source.as_str(), e.id], |r| {
                Ok(dedup::StoredRow {
                    pk: r.get(0)?,
                    received_at: r.get(1)?,
                    sha256: dedup::hash_from(r.get(2)?),
                    payload: r.get(3)?,
                })
            })
            .optional()?;
        let decision = match found {
            None => dedup::Decision::Create,
            Some(original) => {
                let mut stored = vec![original];
                stored.extend(conflict_rows(tx, user_id, e)?);
                decide_stored(tx, e, &sha, &mut stored)?
            }
        };
        let conflict = match decision {
            dedup::Decision::Duplicate { pk, received_at } => {
                out.push(Inserted {
                    created: false,
                    pk,
                    received_at,
                    conflict: None,
                    leaf_index: None,
                });
                continue;
            }
            dedup::Decision::Create => None,
            dedup::Decision::Conflict(c) => Some(c),
        };
        ins.execute(params![
            user_id,
            e.source.as_str(),
            e.id,
            e.kind,
            e.ts,
            e.session,
            e.seq,
            e.boot,
            received_at,
            e.payload,
            conflict.map(|c| c.original_pk),
            e.airlock_session,
            e.file,
            e.offset,
        ])?;
        let pk = tx.last_insert_rowid();
        match conflict {
            None => {
                key.execute(params![
                    user_id,
                    e.source.as_str(),
                    e.id,
                    pk,
                    received_at,
                    sha.as_slice()
                ])?;
            }
            Some(c) => {
                tx.prepare_cached(
                    "INSERT INTO event_conflicts(user_id, source, id, sha256, pk, received_at, original_pk)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?
                .execute(params![
                    user_id,
                    e.source.as_str(),
                    e.id,
                    sha.as_slice(),
                    pk,
                    received_at,
                    c.original_pk
                ])?;
            }
        }
        out.push(Inserted { created: true, pk, received_at, conflict, leaf_index: None });
    }
    Ok(out)
}

/// The conflicts stored for `e`'s key, in `pk` order.
fn conflict_rows(
    tx: &Connection,
    user_id: &str,
    e: &NewEvent,
) -> Result<Vec<dedup::StoredRow>, StoreError> {
    let mut stmt = tx.prepare_cached(
        "SELECT pk, received_at, sha256 FROM event_conflicts
         WHERE user_id = ?1 AND source = ?2 AND id = ?3 ORDER BY pk",
    )?;
    let rows = stmt
        .query_map(params![user_id, e.source.as_str(), e.id], |r| {
            Ok(dedup::StoredRow {
                pk: r.get(0)?,
                received_at: r.get(1)?,
                sha256: dedup::hash_from(r.get(2)?),
                payload: None,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// Decides `e` against its key's stored contents, reading their payloads first when the
/// decision needs them (a `claude` line no stored hash matches).
fn decide_stored(
    tx: &Connection,
    e: &NewEvent,
    sha: &dedup::Hash,
    stored: &mut [dedup::StoredRow],
) -> Result<dedup::Decision, StoreError> {
    if dedup::needs_payloads(e.source, sha, &dedup::view(stored)) {
        let mut p = tx.prepare_cached("SELECT payload FROM events WHERE pk = ?1")?;
        for s in stored.iter_mut().filter(|s| s.payload.is_none()) {
            s.payload = p.query_row([s.pk], |r| r.get(0)).optional()?;
        }
    }
    // Parsed only when the Claude rule may apply; a payload is valid JSON (checked at ingest).
    let value = if e.source == Source::Claude && stored.iter().any(|s| s.payload.is_some()) {
        crate::review::ingest::payload_value(&e.payload).unwrap_or(serde_json::Value::Null)
    } else {
        serde_json::Value::Null
    };
    Ok(dedup::decide(e.source, sha, &value, &dedup::view(stored)))
}

/// Inserts flags and their event links on `tx` (the caller commits); an existing flag id is
/// left as it is.
fn insert_flag_rows(tx: &Connection, flags: &[NewFlag]) -> Result<(), StoreError> {
    let now = now_micros();
    let mut flag = tx.prepare_cached(
        "INSERT INTO flags(id, rule_id, title, severity, user_id, session, detail, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT(id) DO NOTHING",
    )?;
    let mut link = tx.prepare_cached(
        "INSERT INTO flag_events(flag_id, event_pk) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
    )?;
    for f in flags {
        let n = flag.execute(params![
            f.id,
            f.rule_id,
            f.title,
            f.severity.as_str(),
            f.user_id,
            f.session,
            f.detail,
            now
        ])?;
        if n == 0 {
            continue;
        }
        for pk in &f.event_pks {
            link.execute(params![f.id, pk])?;
        }
    }
    Ok(())
}

/// Feeds `scan` its session's span, then its events' envelopes row by row in `pk` order
/// (one row in memory at a time; payloads are never read).
fn feed_session(conn: &Connection, scan: &mut SessionScan) -> Result<(), StoreError> {
    let (user, session) = (scan.user_id().to_string(), scan.session().to_string());
    let span_ts = |id: String| -> Result<Option<i64>, StoreError> {
        Ok(conn
            .prepare_cached(
                "SELECT ts FROM events WHERE user_id = ?1 AND session = ?2 AND source = 'session' \
                 AND id = ?3",
            )?
            .query_row(params![user, session, id], |r| r.get(0))
            .optional()?)
    };
    let (start, end) = (span_ts(scan.start_id())?, span_ts(scan.end_id())?);
    scan.set_span(start, end);
    // SQLite spells strpos instr.
    let suppressed = super::SUPPRESSED_PAYLOAD_SQL.replace("strpos", "instr");
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT pk, source, ts, seq, boot, {suppressed} FROM events \
         WHERE user_id = ?1 AND session = ?2 ORDER BY pk",
    ))?;
    let mut rows = stmt.query(params![user, session])?;
    while let Some(r) = rows.next()? {
        let source: String = r.get(1)?;
        let payload: Option<String> = r.get(5)?;
        let row = super::session_row(
            r.get(0)?,
            &source,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            payload.as_deref(),
        );
        if !scan.feed(row) {
            break;
        }
    }
    Ok(())
}

/// Feeds the correlate scan its session's rows: the two reads of
/// [`super::CORRELATE_SESSION_ROWS`] and [`super::CORRELATE_TRANSCRIPT_ROWS`], paged.
fn feed_correlate(conn: &Connection, scan: &mut CorrelateScan) -> Result<(), StoreError> {
    let (user, session) = (scan.user_id().to_string(), scan.session().to_string());
    for (sql, read) in [
        (super::CORRELATE_SESSION_ROWS, correlate::Read::Session),
        (super::CORRELATE_TRANSCRIPT_ROWS, correlate::Read::Transcript),
    ] {
        let sql = sql
            .replace("{rcv}", "received_at")
            .replace("{1}", "?1")
            .replace("{2}", "?2")
            .replace("{3}", "?3")
            .replace("{4}", "?4");
        let mut stmt = conn.prepare_cached(&sql)?;
        let mut after = i64::MIN;
        loop {
            let mut rows = stmt.query(params![user, session, after, super::SESSION_PAGE])?;
            let mut n = 0i64;
            while let Some(r) = rows.next()? {
                n += 1;
                after = r.get(0)?;
                let source: String = r.get(1)?;
                let Ok(source) = source.parse::<Source>() else { continue };
                let id: String = r.get(2)?;
                let kind: String = r.get(3)?;
                let file: Option<String> = r.get(6)?;
                let payload: String = r.get(7)?;
                scan.feed(correlate::Row {
                    pk: after,
                    id: &id,
                    source,
                    kind: &kind,
                    ts: r.get(4)?,
                    received_at: r.get(5)?,
                    file: file.as_deref(),
                    payload: &payload,
                });
            }
            if n < super::SESSION_PAGE || !scan.wants_more(read) {
                break;
            }
        }
    }
    Ok(())
}

/// Every event of one user's session, in `pk` order.
fn session_rows(
    conn: &Connection,
    user_id: &str,
    session: &str,
) -> Result<Vec<StoredEvent>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {EVENT_COLS} FROM events e WHERE e.user_id = ?1 AND e.session = ?2 ORDER BY e.pk"
    ))?;
    let rows = stmt.query_map([user_id, session], event_from_row)?.collect::<Result<_, _>>()?;
    Ok(rows)
}

fn current_role(conn: &Connection, user_id: &str) -> Result<Role, StoreError> {
    let role: String = conn.query_row(
        "SELECT role FROM user_roles WHERE user_id = ?1 ORDER BY n DESC LIMIT 1",
        [user_id],
        |r| r.get(0),
    )?;
    role.parse().map_err(StoreError::Other)
}

fn user_row(conn: &Connection, id: String, email: String) -> Result<User, StoreError> {
    let role = current_role(conn, &id)?;
    Ok(User { id, email, role })
}

fn sql_value(a: super::FlagArg) -> Value {
    match a {
        super::FlagArg::Text(t) => Value::Text(t),
        super::FlagArg::Int(i) | super::FlagArg::Time(i) => Value::Integer(i),
    }
}

const EVENT_COLS: &str = "e.pk, e.user_id, e.source, e.id, e.type, e.ts, e.session, e.seq, e.boot, e.received_at, e.payload, e.conflict_of, e.airlock_session, e.file, e.file_offset";

fn event_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredEvent> {
    let source: String = r.get(2)?;
    Ok(StoredEvent {
        pk: r.get(0)?,
        user_id: r.get(1)?,
        // Only valid sources are ever inserted; External is an inert fallback.
        source: source.parse().unwrap_or(Source::External),
        id: r.get(3)?,
        kind: r.get(4)?,
        ts: r.get(5)?,
        session: r.get(6)?,
        seq: r.get(7)?,
        boot: r.get(8)?,
        received_at: r.get(9)?,
        payload: r.get(10)?,
        conflict_of: r.get(11)?,
        airlock_session: r.get(12)?,
        file: r.get(13)?,
        offset: r.get(14)?,
    })
}

/// [`GATE_COLS`] with this store's time columns (integer microseconds already).
fn gate_cols() -> String {
    GATE_COLS
        .replace("{requested}", "g.requested_at")
        .replace("{deadline}", "g.deadline")
        .replace("{at}", "d.at")
}

fn gate_values(r: &rusqlite::Row<'_>) -> rusqlite::Result<GateRowValues> {
    Ok(GateRowValues {
        n: r.get(0)?,
        id: r.get(1)?,
        user_id: r.get(2)?,
        email: r.get(3)?,
        kind: r.get(4)?,
        session: r.get(5)?,
        repo: r.get(6)?,
        method: r.get(7)?,
        host: r.get(8)?,
        port: r.get(9)?,
        request: r.get(10)?,
        action: r.get(11)?,
        digest: r.get(12)?,
        severity: r.get(13)?,
        rule: r.get(14)?,
        layer: r.get(15)?,
        policy: r.get(16)?,
        local_id: r.get(17)?,
        context: r.get(18)?,
        self_approve: r.get(19)?,
        timeout_ms: r.get(20)?,
        requested_at: r.get(21)?,
        deadline: r.get(22)?,
        state: r.get(23)?,
        actor: r.get(24)?,
        actor_email: r.get(25)?,
        note: r.get(26)?,
        self_decided: r.get(27)?,
        step_up: r.get(28)?,
        at: r.get(29)?,
    })
}

fn load_gate(conn: &Connection, id: &str) -> Result<Option<Gate>, StoreError> {
    let sql = format!("SELECT {}{GATE_FROM} WHERE g.id = ?1", gate_cols());
    let row = conn.prepare_cached(&sql)?.query_row([id], gate_values).optional()?;
    row.map(GateRowValues::into_gate).transpose()
}

/// Pending gates of `user_id` at `now` (of `session` when given).
fn pending_gates(
    conn: &Connection,
    user_id: &str,
    session: Option<&str>,
    now: Micros,
) -> Result<usize, StoreError> {
    let n: i64 = conn.query_row(
        "SELECT count(*) FROM gates g WHERE g.user_id = ?1 AND g.deadline > ?2
           AND (?3 IS NULL OR g.session = ?3)
           AND NOT EXISTS (SELECT 1 FROM gate_decisions d WHERE d.gate_id = g.id)",
        params![user_id, now, session],
        |r| r.get(0),
    )?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// Undecided gates whose deadline passed at `now` within the last week, oldest deadline
/// first, at most `max`: (id, deadline).
fn due_gates(
    conn: &Connection,
    now: Micros,
    max: i64,
) -> Result<Vec<(String, Micros)>, StoreError> {
    let week = 7 * 24 * 3600 * 1_000_000i64;
    let due = conn
        .prepare_cached(
            "SELECT g.id, g.deadline FROM gates g WHERE g.deadline <= ?1 AND g.deadline > ?2
               AND NOT EXISTS (SELECT 1 FROM gate_decisions d WHERE d.gate_id = g.id)
             ORDER BY g.deadline LIMIT ?3",
        )?
        .query_map(params![now, now - week, max], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    Ok(due)
}

/// Appends `g`'s decision row and its `gate.<state>` event on `tx` (the caller commits);
/// returns the gate as decided.
fn append_decision(
    tx: &Connection,
    id: &str,
    decision: &gates::Decision,
    now: Micros,
) -> Result<Gate, StoreError> {
    tx.prepare_cached(
        "INSERT INTO gate_decisions(gate_id, state, actor, note, self, step_up, at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        id,
        decision.state.as_str(),
        decision.actor,
        decision.note,
        decision.self_decided,
        decision.step_up,
        decision.at
    ])?;
    let g = load_gate(tx, id)?
        .ok_or_else(|| StoreError::Other(format!("gate {id} vanished while it was decided")))?;
    let event = gates::step_event(&g, g.decision.as_ref());
    insert_event_rows(tx, &g.gate.user_id, now, &[event])?;
    sequence_stored(tx, 1)?;
    Ok(g)
}

// --- The review log (docs/evidence.md) ---

/// Events an ingest (or any other transaction that stores events) sequences beyond its own:
/// the oldest events without a leaf go first, so a store made before the log existed, with
/// a backlog of them, sequences it in steps this large and `log_sequence` does the rest; until
/// then a new event answers "pending" instead of an index. It bounds the work one ingest
/// does inside the write lock.
const LOG_INGEST_BACKLOG: usize = 4096;

/// The columns of a leaf over `log_leaves l`, in [`RawLeaf`] order.
const LEAF_COLS: &str =
    "l.idx, l.event_pk, l.leaf_hash, l.user_id, l.source, l.id, l.received_at, l.payload_sha256";

/// A leaf row as read ([`LEAF_COLS`]), before its checks.
type RawLeaf = (i64, i64, Vec<u8>, String, String, String, i64, Vec<u8>);

fn raw_leaf(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<RawLeaf> {
    Ok((
        r.get(at)?,
        r.get(at + 1)?,
        r.get(at + 2)?,
        r.get(at + 3)?,
        r.get(at + 4)?,
        r.get(at + 5)?,
        r.get(at + 6)?,
        r.get(at + 7)?,
    ))
}

fn leaf_of(raw: RawLeaf) -> Result<LogLeaf, StoreError> {
    let (index, event_pk, hash, user_id, source, id, received_at, payload_sha256) = raw;
    Ok(LogLeaf {
        index: log_u64(index, "a leaf index")?,
        event_pk,
        hash: log_hash(hash, "a leaf hash")?,
        user_id,
        source,
        id,
        received_at,
        payload_sha256: log_hash(payload_sha256, "a payload hash")?,
    })
}

/// The tree's size: one past the last leaf index (indices are gapless; a hole an edit left
/// makes the edge or a tier read fail, never a smaller tree).
fn log_size(c: &Connection) -> Result<u64, StoreError> {
    let n: i64 =
        c.query_row("SELECT coalesce(max(idx) + 1, 0) FROM log_leaves", [], |r| r.get(0))?;
    log_u64(n, "the tree size")
}

/// Stored hashes `[start, end)` of tier `level` (0: the leaf hashes), fewer when the tree
/// holds fewer; a hash missing before the last one read is an error (a damaged tree).
fn tier_rows(c: &Connection, level: u8, start: u64, end: u64) -> Result<Vec<Hash>, StoreError> {
    if end <= start {
        return Ok(Vec::new());
    }
    let (s, e) = (log_i64(start)?, i64::try_from(end).unwrap_or(i64::MAX));
    let read = |r: &rusqlite::Row<'_>| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?));
    let rows: Vec<(i64, Vec<u8>)> = if level == 0 {
        c.prepare_cached(
            "SELECT idx, leaf_hash FROM log_leaves WHERE idx >= ?1 AND idx < ?2 ORDER BY idx",
        )?
        .query_map(params![s, e], read)?
        .collect::<Result<_, _>>()?
    } else {
        c.prepare_cached(
            "SELECT idx, hash FROM log_tiers WHERE level = ?3 AND idx >= ?1 AND idx < ?2 \
             ORDER BY idx",
        )?
        .query_map(params![s, e, level], read)?
        .collect::<Result<_, _>>()?
    };
    let mut out = Vec::with_capacity(rows.len());
    for (k, (idx, hash)) in rows.into_iter().enumerate() {
        let want = start + k as u64;
        if u64::try_from(idx).ok() != Some(want) {
            return Err(StoreError::Other(format!(
                "review log: tier {level} has no hash at index {want} (the stored tree is damaged)"
            )));
        }
        out.push(log_hash(hash, "a tier hash")?);
    }
    Ok(out)
}

/// The stored tree's right edge.
fn load_edge(c: &Connection) -> Result<Edge, StoreError> {
    let size = log_size(c)?;
    let mut tiers = Vec::new();
    for (level, start, end) in edge_ranges(size) {
        tiers.push(tier_rows(c, level, start, end)?);
    }
    Edge::load(size, tiers).map_err(|e| StoreError::Other(format!("review log: {e}")))
}

/// Appends a leaf for up to `max` stored events that have none, oldest `pk` first, with the
/// tier hashes they complete, on `tx` (the caller commits). Returns the new head and the
/// `(pk, index)` of each leaf appended.
///
/// The events picked are those without a leaf row (an anti-join) above the highest `pk` that
/// has one. In this store that bound loses nothing, and it keeps the anti-join an index range
/// instead of a walk over every event on each ingest: one connection writes at a time and
/// `pk`s only grow (AUTOINCREMENT), so events commit in `pk` order, and every pass takes the
/// oldest first, so leaves are in `pk` order too. An event below the last leaf's `pk` without
/// a leaf can only have been planted by hand (and is not given one). PostgreSQL, where commit
/// order is not `pk` order, cannot use the bound (postgres.rs, `SeqScan`).
fn sequence(tx: &Connection, max: usize) -> Result<(LogHead, Vec<(i64, u64)>), StoreError> {
    let mut edge = load_edge(tx)?;
    let floor: Option<i64> =
        tx.query_row("SELECT max(event_pk) FROM log_leaves", [], |r| r.get(0))?;
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    // The payload's hash is taken in SQL (`airlock_sha256`, the dedup key's hash of the
    // stored text), so a batch of large payloads is never held in memory at once.
    let rows: Vec<(i64, String, String, String, i64, Vec<u8>)> = tx
        .prepare_cached(
            "SELECT e.pk, e.user_id, e.source, e.id, e.received_at, airlock_sha256(e.payload)
             FROM events e
             WHERE e.pk > ?1 AND NOT EXISTS (SELECT 1 FROM log_leaves l WHERE l.event_pk = e.pk)
             ORDER BY e.pk LIMIT ?2",
        )?
        .query_map(params![floor.unwrap_or(i64::MIN), limit], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
        })?
        .collect::<Result<_, _>>()?;
    let mut leaf_row = tx.prepare_cached(
        "INSERT INTO log_leaves(idx, event_pk, user_id, source, id, received_at, payload_sha256,
                                leaf_hash)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    let mut tier_row =
        tx.prepare_cached("INSERT INTO log_tiers(level, idx, hash) VALUES (?1, ?2, ?3)")?;
    let mut appended = Vec::with_capacity(rows.len());
    for (pk, user_id, source, id, received_at, sha) in rows {
        let payload_sha256 = log_hash(sha, "a payload hash")?;
        let leaf =
            EventLeaf { user_id: &user_id, source: &source, id: &id, received_at, payload_sha256 }
                .hash();
        let index = edge.size();
        leaf_row.execute(params![
            log_i64(index)?,
            pk,
            user_id,
            source,
            id,
            received_at,
            payload_sha256.as_slice(),
            leaf.as_slice()
        ])?;
        for t in edge.append(leaf) {
            tier_row.execute(params![t.level, log_i64(t.index)?, t.hash.as_slice()])?;
        }
        appended.push((pk, index));
    }
    let head = LogHead { size: edge.size(), root: edge.root(), appended: appended.len() as u64 };
    Ok((head, appended))
}

/// Sequences on `tx` after events were stored there (`count` of them, plus up to
/// [`LOG_INGEST_BACKLOG`] older ones), so they commit with their leaves.
fn sequence_stored(tx: &Connection, count: usize) -> Result<(), StoreError> {
    sequence(tx, count.saturating_add(LOG_INGEST_BACKLOG)).map(|_| ())
}

/// Sets each result's leaf index (a duplicate's: its original's), read on `tx`.
fn with_leaf_indices(tx: &Connection, inserted: &mut [Inserted]) -> Result<(), StoreError> {
    let mut q = tx.prepare_cached("SELECT idx FROM log_leaves WHERE event_pk = ?1")?;
    for i in inserted.iter_mut() {
        let idx: Option<i64> = q.query_row([i.pk], |r| r.get(0)).optional()?;
        i.leaf_index = idx.map(|v| log_u64(v, "a leaf index")).transpose()?;
    }
    Ok(())
}

fn load_flag(conn: &Connection, id: &str) -> Result<Option<(i64, Flag)>, StoreError> {
    let row = conn
        .query_row(
            "SELECT n, id, rule_id, title, severity, user_id, session, detail, created_at FROM flags WHERE id = ?1",
            [id],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, Option<String>>(6)?,
                    r.get::<_, String>(7)?,
                    r.get::<_, i64>(8)?,
                ))
            },
        )
        .optional()?;
    let Some((n, id, rule_id, title, severity, user_id, session, detail, created_at)) = row else {
        return Ok(None);
    };
    let mut stmt = conn.prepare_cached(
        "SELECT s.state, s.actor, s.at, s.note, s.self, s.assignment, s.assignee, u.email
         FROM flag_states s LEFT JOIN users u ON u.id = s.assignee
         WHERE s.flag_id = ?1 ORDER BY s.n",
    )?;
    let rows = stmt.query_map([&id], |r| {
        Ok((
            (
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, Option<String>>(3)?,
                r.get::<_, bool>(4)?,
            ),
            (r.get::<_, bool>(5)?, r.get::<_, Option<String>>(6)?, r.get::<_, Option<String>>(7)?),
        ))
    })?;
    let mut history = Vec::new();
    for row in rows {
        let ((state, actor, at, note, self_action), (assignment, assignee, assignee_email)) = row?;
        let state = state.parse().map_err(StoreError::Other)?;
        history.push(FlagStateRecord {
            state,
            actor,
            at,
            note,
            self_action,
            assignment,
            assignee,
            assignee_email,
        });
    }
    let mut stmt = conn
        .prepare_cached("SELECT event_pk FROM flag_events WHERE flag_id = ?1 ORDER BY event_pk")?;
    let event_pks = stmt.query_map([&id], |r| r.get(0))?.collect::<Result<Vec<i64>, _>>()?;
    Ok(Some((
        n,
        Flag {
            id,
            rule_id,
            title,
            severity: severity.parse().map_err(StoreError::Other)?,
            user_id,
            session,
            detail,
            created_at,
            state: FlagState::Open,
            note: None,
            event_pks,
            history: Vec::new(),
            assignee: None,
            assignee_email: None,
        }
        .with_history(history),
    )))
}

impl Store for SqliteStore {
    async fn add_user(&self, email: &str, role: Role) -> Result<User, StoreError> {
        let email = email.to_string();
        self.with(move |c| {
            let tx = c.transaction()?;
            let exists: Option<String> = tx
                .query_row("SELECT id FROM users WHERE email = ?1", [&email], |r| r.get(0))
                .optional()?;
            if exists.is_some() {
                return Err(StoreError::Conflict(format!("user {email} already exists")));
            }
            let id = random_id();
            let now = now_micros();
            tx.execute(
                "INSERT INTO users(id, email, created_at) VALUES (?1, ?2, ?3)",
                params![id, email, now],
            )?;
            tx.execute(
                "INSERT INTO user_roles(user_id, role, at) VALUES (?1, ?2, ?3)",
                params![id, role.as_str(), now],
            )?;
            tx.commit()?;
            Ok(User { id, email, role })
        })
        .await
    }

    async fn set_role(&self, user_id: &str, role: Role) -> Result<(), StoreError> {
        let user_id = user_id.to_string();
        self.with(move |c| {
            let n = c.execute(
                "INSERT INTO user_roles(user_id, role, at) SELECT id, ?2, ?3 FROM users WHERE id = ?1",
                params![user_id, role.as_str(), now_micros()],
            )?;
            if n == 0 {
                return Err(StoreError::NotFound(format!("no user with id {user_id}")));
            }
            Ok(())
        })
        .await
    }

    async fn list_users(&self) -> Result<Vec<User>, StoreError> {
        self.with(|c| {
            let rows: Vec<(String, String)> = {
                let mut stmt = c.prepare("SELECT id, email FROM users ORDER BY email")?;
                stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?
            };
            rows.into_iter().map(|(id, email)| user_row(c, id, email)).collect()
        })
        .await
    }

    async fn user_by_email(&self, email: &str) -> Result<Option<User>, StoreError> {
        let email = email.to_string();
        self.with(move |c| {
            let id: Option<String> = c
                .query_row("SELECT id FROM users WHERE email = ?1", [&email], |r| r.get(0))
                .optional()?;
            id.map(|id| user_row(c, id, email)).transpose()
        })
        .await
    }

    async fn user_by_id(&self, id: &str) -> Result<Option<User>, StoreError> {
        let id = id.to_string();
        self.with(move |c| {
            let email: Option<String> = c
                .query_row("SELECT email FROM users WHERE id = ?1", [&id], |r| r.get(0))
                .optional()?;
            email.map(|email| user_row(c, id, email)).transpose()
        })
        .await
    }

    async fn create_token(
        &self,
        token_id: &str,
        user_id: &str,
        hash: [u8; 32],
    ) -> Result<(), StoreError> {
        let (token_id, user_id) = (token_id.to_string(), user_id.to_string());
        self.with(move |c| {
            c.execute(
                "INSERT INTO tokens(id, user_id, hash, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![token_id, user_id, hash.as_slice(), now_micros()],
            )?;
            Ok(())
        })
        .await
    }

    async fn revoke_token(&self, token_id: &str) -> Result<bool, StoreError> {
        let token_id = token_id.to_string();
        self.with(move |c| {
            let n = c.execute(
                "INSERT INTO token_revocations(token_id, at) SELECT id, ?2 FROM tokens WHERE id = ?1",
                params![token_id, now_micros()],
            )?;
            Ok(n > 0)
        })
        .await
    }

    async fn list_tokens(&self, user_id: &str) -> Result<Vec<(String, bool)>, StoreError> {
        let user_id = user_id.to_string();
        self.with(move |c| {
            let mut stmt = c.prepare(
                "SELECT t.id, EXISTS(SELECT 1 FROM token_revocations r WHERE r.token_id = t.id)
                 FROM tokens t WHERE t.user_id = ?1 ORDER BY t.created_at, t.id",
            )?;
            let rows = stmt
                .query_map([&user_id], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            Ok(rows)
        })
        .await
    }

    async fn authenticate(&self, hash: [u8; 32]) -> Result<Option<User>, StoreError> {
        self.with(move |c| {
            let row: Option<(String, String)> = c
                .prepare_cached(
                    "SELECT u.id, u.email FROM tokens t JOIN users u ON u.id = t.user_id
                     WHERE t.hash = ?1
                       AND NOT EXISTS (SELECT 1 FROM token_revocations r WHERE r.token_id = t.id)",
                )?
                .query_row([hash.as_slice()], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            row.map(|(id, email)| user_row(c, id, email)).transpose()
        })
        .await
    }

    async fn insert_events(
        &self,
        user_id: &str,
        received_at: Micros,
        events: &[NewEvent],
    ) -> Result<Vec<Inserted>, StoreError> {
        let user_id = user_id.to_string();
        let events = events.to_vec();
        let log = self.log_in_ingest.load(Ordering::Relaxed);
        self.with(move |c| {
            // Immediate: see `ingest`.
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let mut out = insert_event_rows(&tx, &user_id, received_at, &events)?;
            // The events commit with their leaves (docs/evidence.md: the embedded store
            // sequences in the ingest's transaction).
            if log {
                sequence_stored(&tx, out.len())?;
                with_leaf_indices(&tx, &mut out)?;
            }
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    async fn ingest(
        &self,
        user_id: &str,
        received_at: Micros,
        events: &[NewEvent],
        scan: Arc<dyn IngestScan>,
    ) -> Result<Vec<Inserted>, StoreError> {
        let user_id = user_id.to_string();
        let events = events.to_vec();
        let log = self.log_in_ingest.load(Ordering::Relaxed);
        self.with(move |c| {
            // Immediate: the write lock is taken at BEGIN, where SQLite runs the busy handler
            // (5 s) if another process holds it. A deferred transaction reads first and then
            // upgrades, and SQLite answers that upgrade SQLITE_BUSY at once, without waiting:
            // a short write by `airlockd admin` made ingest a 503.
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let mut inserted = insert_event_rows(&tx, &user_id, received_at, &events)?;
            if log {
                sequence_stored(&tx, inserted.len())?;
                with_leaf_indices(&tx, &mut inserted)?;
            }
            crash_point("after-events");
            let mut flags = scan.batch_flags(&inserted);
            for session in scan.ended_sessions(&inserted) {
                let mut sc = SessionScan::new(&user_id, &session);
                feed_session(&tx, &mut sc)?;
                flags.extend(scan.session_flags(sc));
                if let Some(mut cs) = scan.correlate_scan(&session) {
                    feed_correlate(&tx, &mut cs)?;
                    flags.extend(scan.correlate_flags(cs));
                }
            }
            insert_flag_rows(&tx, &flags)?;
            crash_point("after-flags");
            // With `synchronous=FULL` the commit returns only once the WAL is on disk.
            tx.commit()?;
            Ok(inserted)
        })
        .await
    }

    async fn query_event_page(&self, q: &EventQuery) -> Result<EventPage, StoreError> {
        let q = q.clone();
        self.with(move |c| {
            // Phase one reads no payload: `octet_length` comes from the record header.
            let (tail, args) =
                q.sql_tail(|n| format!("?{n}"), |op, p| format!("e.received_at {op} {p}"));
            let sql = format!("SELECT e.pk, octet_length(e.payload) FROM events e{tail}");
            let heads: Vec<(i64, i64)> = {
                let mut stmt = c.prepare_cached(&sql)?;
                stmt.query_map(params_from_iter(args.into_iter().map(sql_value)), |r| {
                    Ok((r.get(0)?, r.get::<_, Option<i64>>(1)?.unwrap_or(0)))
                })?
                .collect::<Result<_, _>>()?
            };
            let (keep, truncated) = q.within_budget(heads.iter().map(|h| h.1));
            let pks: Vec<i64> = heads.iter().take(keep).map(|h| h.0).collect();
            let mut events = Vec::with_capacity(pks.len());
            // Phase two in chunks (SQLite bounds the number of parameters of a statement).
            for chunk in pks.chunks(500) {
                let marks = vec!["?"; chunk.len()].join(",");
                let mut stmt = c.prepare_cached(&format!(
                    "SELECT {EVENT_COLS} FROM events e WHERE e.pk IN ({marks})"
                ))?;
                let rows: Vec<StoredEvent> = stmt
                    .query_map(params_from_iter(chunk.iter()), event_from_row)?
                    .collect::<Result<_, _>>()?;
                events.extend(rows);
            }
            Ok(EventPage { events: super::in_phase_order(&pks, events), truncated })
        })
        .await
    }

    async fn scan_session(&self, scan: SessionScan) -> Result<SessionScan, StoreError> {
        self.with(move |c| {
            let mut scan = scan;
            feed_session(c, &mut scan)?;
            Ok(scan)
        })
        .await
    }

    async fn scan_correlate(&self, scan: CorrelateScan) -> Result<CorrelateScan, StoreError> {
        self.with(move |c| {
            let mut scan = scan;
            feed_correlate(c, &mut scan)?;
            Ok(scan)
        })
        .await
    }

    async fn session_events(
        &self,
        user_id: &str,
        session: &str,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let (user_id, session) = (user_id.to_string(), session.to_string());
        self.with(move |c| session_rows(c, &user_id, &session)).await
    }

    async fn session_transcript_items(
        &self,
        user_id: &str,
        session: &str,
        max_files: usize,
    ) -> Result<SessionTranscriptItems, StoreError> {
        let (user_id, session) = (user_id.to_string(), session.to_string());
        let limit = i64::try_from(max_files).unwrap_or(i64::MAX);
        self.with(move |c| {
            let end_record: Option<String> = c
                .prepare_cached(
                    "SELECT payload FROM events WHERE user_id = ?1 AND session = ?2 \
                     AND source = 'session' AND id = ?3 AND conflict_of IS NULL ORDER BY pk LIMIT 1",
                )?
                .query_row(params![user_id, session, format!("{session}:end")], |r| r.get(0))
                .optional()?;
            // SQLite compares text as bytes (BINARY), the order PostgreSQL gets with "C".
            let rows = super::TRANSCRIPT_FILE_ROWS.replace("{1}", "?1").replace("{2}", "?2");
            let mut stmt = c.prepare_cached(&format!(
                "SELECT file, payload, received_at FROM events WHERE pk IN \
                 (SELECT max(pk) FROM events WHERE {rows} GROUP BY file ORDER BY file LIMIT ?3) \
                 ORDER BY file"
            ))?;
            let published = stmt
                .query_map(params![user_id, session, limit], |r| {
                    Ok(PublishedFile {
                        file: r.get(0)?,
                        payload: r.get(1)?,
                        received_at: r.get(2)?,
                    })
                })?
                .collect::<Result<_, _>>()?;
            Ok(SessionTranscriptItems { end_record, published })
        })
        .await
    }

    async fn transcript_line_counts(
        &self,
        user_id: &str,
        session: &str,
        files: &[String],
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let (user_id, session, files) = (user_id.to_string(), session.to_string(), files.to_vec());
        self.with(move |c| {
            let rows = super::TRANSCRIPT_LINE_ROWS.replace("{1}", "?1").replace("{2}", "?2");
            let mut out = Vec::new();
            // In chunks: SQLite bounds the number of parameters of a statement.
            for chunk in files.chunks(500) {
                let marks: Vec<String> = (0..chunk.len()).map(|i| format!("?{}", i + 3)).collect();
                let mut stmt = c.prepare_cached(&format!(
                    "SELECT file, count(*) FROM events WHERE {rows} AND file IN ({}) GROUP BY file",
                    marks.join(",")
                ))?;
                let mut args: Vec<Value> =
                    vec![Value::Text(user_id.clone()), Value::Text(session.clone())];
                args.extend(chunk.iter().map(|f| Value::Text(f.clone())));
                let counts: Vec<(String, i64)> = stmt
                    .query_map(params_from_iter(args), |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                out.extend(counts);
            }
            Ok(out)
        })
        .await
    }

    async fn person_activity(
        &self,
        user_ids: &[String],
        week_start: Micros,
    ) -> Result<Vec<PersonActivity>, StoreError> {
        let user_ids = user_ids.to_vec();
        self.with(move |c| {
            let week_end = week_start.saturating_add(7 * 86_400_000_000);
            let ph = |n: usize| format!("?{n}");
            let days_sql = super::activity_sql("instr", ph);
            let flags_sql = super::open_flags_sql(ph);
            let mut out = Vec::with_capacity(user_ids.len());
            for user_id in user_ids {
                let rows: Vec<(i64, i64, i64)> = c
                    .prepare_cached(&days_sql)?
                    .query_map(params![user_id, week_start, week_end], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })?
                    .collect::<Result<_, _>>()?;
                let last_received = c
                    .prepare_cached(
                        "SELECT received_at FROM events WHERE user_id = ?1 ORDER BY pk DESC LIMIT 1",
                    )?
                    .query_row(params![user_id], |r| r.get(0))
                    .optional()?;
                let open_flags: Vec<(String, i64)> = c
                    .prepare_cached(&flags_sql)?
                    .query_map(params![user_id], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                out.push(PersonActivity {
                    user_id,
                    daily: super::week_of(rows),
                    last_received,
                    open_flags: open_flags.into_iter().map(|(s, n)| (s, n.max(0) as u64)).collect(),
                });
            }
            Ok(out)
        })
        .await
    }

    async fn hour_counts(
        &self,
        user_id: &str,
        start: Micros,
        hours: u32,
    ) -> Result<Vec<HourCount>, StoreError> {
        let user_id = user_id.to_string();
        self.with(move |c| {
            let end = start.saturating_add(i64::from(hours) * 3_600_000_000);
            let sql = super::hour_counts_sql("instr", |n| format!("?{n}"));
            let rows = c
                .prepare_cached(&sql)?
                .query_map(params![user_id, start, end], |r| {
                    let n = |i: usize| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
                    Ok(HourCount {
                        hour: r.get(0)?,
                        allowed: n(1)?,
                        denied: n(2)?,
                        transcript: n(3)?,
                        flags: n(4)?,
                    })
                })?
                .collect::<Result<_, _>>()?;
            Ok(rows)
        })
        .await
    }

    async fn event_flag_counts(&self, pks: &[i64]) -> Result<Vec<(i64, u64)>, StoreError> {
        let pks = pks.to_vec();
        self.with(move |c| {
            let mut out = Vec::new();
            for chunk in pks.chunks(500) {
                let marks = vec!["?"; chunk.len()].join(",");
                let mut stmt = c.prepare_cached(&format!(
                    "SELECT event_pk, count(*) FROM flag_events WHERE event_pk IN ({marks}) \
                     GROUP BY event_pk"
                ))?;
                let rows = stmt.query_map(params_from_iter(chunk.iter()), |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?.max(0) as u64))
                })?;
                for row in rows {
                    out.push(row?);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn insert_flags(&self, flags: &[NewFlag]) -> Result<(), StoreError> {
        let flags = flags.to_vec();
        self.with(move |c| {
            let tx = c.transaction()?;
            insert_flag_rows(&tx, &flags)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn list_flags(&self, q: &FlagQuery) -> Result<Vec<(i64, Flag)>, StoreError> {
        let q = q.clone();
        self.with(move |c| {
            let (tail, flag_args) = q.sql_tail(|n| format!("?{n}"));
            let sql = format!("SELECT id FROM flags f{tail}");
            let args: Vec<Value> = flag_args.into_iter().map(sql_value).collect();
            let ids: Vec<String> = {
                let mut stmt = c.prepare(&sql)?;
                stmt.query_map(params_from_iter(args), |r| r.get(0))?.collect::<Result<_, _>>()?
            };
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                if let Some(f) = load_flag(c, &id)? {
                    out.push(f);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn get_flag(&self, id: &str) -> Result<Option<Flag>, StoreError> {
        let id = id.to_string();
        self.with(move |c| Ok(load_flag(c, &id)?.map(|(_, f)| f))).await
    }

    async fn append_flag_state(&self, a: &FlagAction<'_>) -> Result<bool, StoreError> {
        // One process owns the file: the server's authentication is the only check needed,
        // so `a.secret` is not used here.
        let (flag_id, note, actor) =
            (a.flag_id.to_string(), a.note.map(str::to_string), a.actor.to_string());
        let (state, at, self_action) = (a.state, a.at, a.self_action);
        self.with(move |c| {
            let n = c.execute(
                "INSERT INTO flag_states(flag_id, state, note, actor, at, self) SELECT id, ?2, ?3, ?4, ?5, ?6 FROM flags WHERE id = ?1",
                params![flag_id, state.as_str(), note, actor, at, self_action],
            )?;
            Ok(n > 0)
        })
        .await
    }

    async fn assign_flag(&self, a: &FlagAssignment<'_>) -> Result<bool, StoreError> {
        // As `append_flag_state`; the state kept is read in the same statement on the one
        // writer connection, so no state action lands between the read and the append.
        let (flag_id, note, actor, assignee) = (
            a.flag_id.to_string(),
            a.note.map(str::to_string),
            a.actor.to_string(),
            a.assignee.map(str::to_string),
        );
        let (at, self_action) = (a.at, a.self_action);
        self.with(move |c| {
            let n = c.execute(
                "INSERT INTO flag_states(flag_id, state, note, actor, at, self, assignment, assignee)
                 SELECT f.id, coalesce((SELECT s.state FROM flag_states s WHERE s.flag_id = f.id
                                        ORDER BY s.n DESC LIMIT 1), 'open'), ?2, ?3, ?4, ?5, 1, ?6
                 FROM flags f WHERE f.id = ?1",
                params![flag_id, note, actor, at, self_action, assignee],
            )?;
            Ok(n > 0)
        })
        .await
    }
    async fn open_gate(&self, gate: &NewGate, caps: GateCaps) -> Result<Opened, StoreError> {
        let gate = gate.clone();
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let now = now_micros();
            let user = pending_gates(&tx, &gate.user_id, None, now)?;
            if user >= caps.per_user {
                return Ok(Opened::UserLimit(user));
            }
            if let Some(session) = gate.session.as_deref() {
                let n = pending_gates(&tx, &gate.user_id, Some(session), now)?;
                if n >= caps.per_session {
                    return Ok(Opened::SessionLimit(n));
                }
            }
            tx.prepare_cached(
                "INSERT INTO gates(id, user_id, kind, session, repo, method, host, port, request,
                   action, digest, severity, rule, layer, policy, local_id, context, self_approve,
                   timeout_ms, requested_at, deadline)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                   ?17, ?18, ?19, ?20, ?21)",
            )?
            .execute(params![
                gate.id,
                gate.user_id,
                gate.kind.as_str(),
                gate.session,
                gate.repo,
                gate.method,
                gate.host,
                gate.port,
                gate.request,
                gate.action,
                gate.digest,
                gate.severity.as_str(),
                gate.rule,
                gate.layer,
                gate.policy,
                gate.local_id,
                gate.context,
                gate.self_approve,
                gate.timeout_ms,
                now,
                now.saturating_add(gate.timeout_ms.saturating_mul(1000)),
            ])?;
            let g = load_gate(&tx, &gate.id)?
                .ok_or_else(|| StoreError::Other(format!("gate {} vanished", gate.id)))?;
            insert_event_rows(&tx, &gate.user_id, now, &[gates::step_event(&g, None)])?;
            sequence_stored(&tx, 1)?;
            tx.commit()?;
            Ok(Opened::Gate(Box::new(g)))
        })
        .await
    }

    async fn get_gate(&self, id: &str) -> Result<Option<Gate>, StoreError> {
        let id = id.to_string();
        self.with(move |c| load_gate(c, &id)).await
    }

    async fn list_gates(&self, q: &GateQuery) -> Result<Vec<Gate>, StoreError> {
        let q = q.clone();
        self.with(move |c| {
            let (tail, args) = q.sql_tail(|n| format!("?{n}"), None, now_micros());
            let sql = format!("SELECT {}{GATE_FROM}{tail}", gate_cols());
            let mut stmt = c.prepare(&sql)?;
            let rows = stmt
                .query_map(params_from_iter(args.into_iter().map(sql_value)), gate_values)?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(GateRowValues::into_gate).collect()
        })
        .await
    }

    async fn decide_gate(&self, d: &DecisionRequest<'_>) -> Result<Decided, StoreError> {
        // One process owns the file: the server's checks are the only ones needed, so
        // `d.secret` is not used here.
        let (id, digest) = (d.gate_id.to_string(), d.digest.map(str::to_string));
        let (state, actor, actor_email) =
            (d.verdict.state(), d.actor.id.clone(), d.actor.email.clone());
        let (note, self_decided) = (d.note.map(str::to_string), d.self_decided);
        let step_up = d.step_up && d.verdict != gates::Verdict::Abandon;
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let Some(g) = load_gate(&tx, &id)? else {
                return Ok(Decided::NoGate);
            };
            let now = now_micros();
            if g.state(now) != GateState::Pending {
                return Ok(Decided::NotPending(Box::new(g)));
            }
            if digest.as_ref().is_some_and(|d| *d != g.gate.digest) {
                return Ok(Decided::Digest(Box::new(g)));
            }
            let decision = gates::Decision {
                state,
                actor: Some(actor),
                actor_email: Some(actor_email),
                note,
                self_decided,
                step_up,
                at: now,
            };
            let g = append_decision(&tx, &id, &decision, now)?;
            tx.commit()?;
            Ok(Decided::Done(Box::new(g)))
        })
        .await
    }

    async fn expire_gates(&self, max: usize) -> Result<Vec<Gate>, StoreError> {
        self.with(move |c| {
            let now = now_micros();
            let max = i64::try_from(max).unwrap_or(i64::MAX);
            // The sweep runs every second: the write lock is taken only when a gate is due.
            if due_gates(c, now, max)?.is_empty() {
                return Ok(Vec::new());
            }
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let due = due_gates(&tx, now, max)?;
            let mut out = Vec::with_capacity(due.len());
            for (id, deadline) in due {
                let expired = gates::Decision {
                    state: GateState::Expired,
                    actor: None,
                    actor_email: None,
                    note: None,
                    self_decided: false,
                    step_up: false,
                    at: deadline,
                };
                out.push(append_decision(&tx, &id, &expired, now)?);
            }
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    async fn log_sequence(&self, max: usize) -> Result<Option<LogHead>, StoreError> {
        // One process owns the file and one connection writes: no lock to take.
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let (head, _) = sequence(&tx, max)?;
            tx.commit()?;
            Ok(Some(head))
        })
        .await
    }

    async fn log_head(&self) -> Result<LogHead, StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            let edge = load_edge(&tx)?;
            Ok(LogHead { size: edge.size(), root: edge.root(), appended: 0 })
        })
        .await
    }

    async fn log_tier(&self, level: u8, start: u64, end: u64) -> Result<Vec<Hash>, StoreError> {
        self.with(move |c| tier_rows(c, level, start, end)).await
    }

    async fn log_leaves(&self, pks: &[i64]) -> Result<Vec<LogLeaf>, StoreError> {
        let pks = pks.to_vec();
        self.with(move |c| {
            let mut by_pk = std::collections::HashMap::new();
            // In chunks: SQLite bounds the number of parameters of a statement.
            for chunk in pks.chunks(500) {
                let marks = vec!["?"; chunk.len()].join(",");
                let mut stmt = c.prepare_cached(&format!(
                    "SELECT {LEAF_COLS} FROM log_leaves l WHERE l.event_pk IN ({marks})"
                ))?;
                let rows: Vec<RawLeaf> = stmt
                    .query_map(params_from_iter(chunk.iter()), |r| raw_leaf(r, 0))?
                    .collect::<Result<_, _>>()?;
                for raw in rows {
                    let leaf = leaf_of(raw)?;
                    by_pk.insert(leaf.event_pk, leaf);
                }
            }
            Ok(pks.iter().filter_map(|pk| by_pk.get(pk).cloned()).collect())
        })
        .await
    }

    async fn log_event_leaf(
        &self,
        user_id: &str,
        source: &str,
        id: &str,
    ) -> Result<Option<(i64, Micros, Option<LogLeaf>)>, StoreError> {
        let (user_id, source, id) = (user_id.to_string(), source.to_string(), id.to_string());
        self.with(move |c| {
            // The key names the original (a conflict has its own row, never the key).
            let row = c
                .prepare_cached(&format!(
                    "SELECT k.pk, k.received_at, l.idx IS NOT NULL, {LEAF_COLS}
                     FROM event_keys k LEFT JOIN log_leaves l ON l.event_pk = k.pk
                     WHERE k.user_id = ?1 AND k.source = ?2 AND k.id = ?3"
                ))?
                .query_row(params![user_id, source, id], |r| {
                    let raw = if r.get::<_, bool>(2)? { Some(raw_leaf(r, 3)?) } else { None };
                    Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, raw))
                })
                .optional()?;
            let Some((pk, received_at, raw)) = row else { return Ok(None) };
            let leaf = raw.map(leaf_of).transpose()?;
            Ok(Some((pk, received_at, leaf)))
        })
        .await
    }

    async fn log_orphans(&self, user_id: &str, limit: u32) -> Result<Vec<LogLeaf>, StoreError> {
        let user_id = user_id.to_string();
        self.with(move |c| {
            let rows: Vec<RawLeaf> = c
                .prepare_cached(&format!(
                    "SELECT {LEAF_COLS} FROM log_leaves l WHERE l.user_id = ?1
                       AND NOT EXISTS (SELECT 1 FROM events e WHERE e.pk = l.event_pk)
                     ORDER BY l.idx LIMIT ?2"
                ))?
                .query_map(params![user_id, limit], |r| raw_leaf(r, 0))?
                .collect::<Result<_, _>>()?;
            rows.into_iter().map(leaf_of).collect()
        })
        .await
    }

    async fn log_add_checkpoint(&self, cp: &StoredCheckpoint) -> Result<(), StoreError> {
        let cp = cp.clone();
        self.with(move |c| {
            c.execute(
                "INSERT INTO log_checkpoints(size, root, note, signed_at) VALUES (?1, ?2, ?3, ?4)",
                params![log_i64(cp.size)?, cp.root.as_slice(), cp.note, cp.signed_at],
            )?;
            Ok(())
        })
        .await
    }

    async fn log_checkpoint(
        &self,
        size: Option<u64>,
    ) -> Result<Option<StoredCheckpoint>, StoreError> {
        self.with(move |c| {
            let size = size.map(log_i64).transpose()?;
            let row: Option<(i64, Vec<u8>, String, i64)> = c
                .prepare_cached(
                    "SELECT size, root, note, signed_at FROM log_checkpoints
                     WHERE ?1 IS NULL OR size = ?1 ORDER BY n DESC LIMIT 1",
                )?
                .query_row(params![size], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                .optional()?;
            row.map(|(size, root, note, signed_at)| {
                Ok(StoredCheckpoint {
                    size: log_u64(size, "a checkpoint's size")?,
                    root: log_hash(root, "a checkpoint's root")?,
                    note,
                    signed_at,
                })
            })
            .transpose()
        })
        .await
    }

    async fn log_add_cosignature(&self, cs: &NewCosignature<'_>) -> Result<u64, StoreError> {
        let (user_id, key, line) =
            (cs.user_id.to_string(), cs.key.to_string(), cs.line.to_string());
        let (size, root, at) = (cs.size, cs.root, cs.at);
        let time = i64::try_from(cs.time).map_err(|_| {
            StoreError::Invalid(format!("cosignature time {} is out of range", cs.time))
        })?;
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            // A key belongs to the first user who posts it.
            tx.execute(
                "INSERT INTO log_cosigners(key, user_id) VALUES (?1, ?2) ON CONFLICT(key) DO NOTHING",
                params![key, user_id],
            )?;
            let owner: String =
                tx.query_row("SELECT user_id FROM log_cosigners WHERE key = ?1", [&key], |r| {
                    r.get(0)
                })?;
            if owner != user_id {
                return Err(StoreError::Conflict(
                    "this cosigner key is tied to another user (a key belongs to the first user \
                     who posts it)"
                        .into(),
                ));
            }
            // The same key cosigning the same head again adds nothing (one row per head).
            tx.execute(
                "INSERT INTO log_cosignatures(key, user_id, size, root, time, line, at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT(key, size, root) DO NOTHING",
                params![key, user_id, log_i64(size)?, root.as_slice(), time, line, at],
            )?;
            let n: i64 = tx.query_row(
                "SELECT count(DISTINCT key) FROM log_cosignatures WHERE size = ?1",
                [log_i64(size)?],
                |r| r.get(0),
            )?;
            tx.commit()?;
            log_u64(n, "a witness count")
        })
        .await
    }

    async fn log_witnesses(&self, size: u64) -> Result<u64, StoreError> {
        self.with(move |c| {
            let n: i64 = c.query_row(
                "SELECT count(DISTINCT key) FROM log_cosignatures WHERE size = ?1",
                [log_i64(size)?],
                |r| r.get(0),
            )?;
            log_u64(n, "a witness count")
        })
        .await
    }

    async fn log_witnessed(&self) -> Result<Option<(u64, u64)>, StoreError> {
        self.with(|c| {
            let row: Option<(i64, i64)> = c
                .query_row(
                    "SELECT size, count(DISTINCT key) FROM log_cosignatures
                     WHERE size = (SELECT max(size) FROM log_cosignatures) GROUP BY size",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            row.map(|(size, n)| Ok((log_u64(size, "a tree size")?, log_u64(n, "a witness count")?)))
                .transpose()
        })
        .await
    }

    async fn set_password(&self, user_id: &str, phc: &str) -> Result<(), StoreError> {
        let (user_id, phc) = (user_id.to_string(), phc.to_string());
        self.with(move |c| {
            let n = c.execute(
                "INSERT INTO user_passwords(user_id, phc, at) SELECT id, ?2, ?3 FROM users WHERE id = ?1",
                params![user_id, phc, now_micros()],
            )?;
            if n == 0 {
                return Err(StoreError::NotFound(format!("no user with id {user_id}")));
            }
            Ok(())
        })
        .await
    }

    async fn password_of(&self, user_id: &str) -> Result<Option<String>, StoreError> {
        let user_id = user_id.to_string();
        self.with(move |c| {
            Ok(c.query_row(
                "SELECT phc FROM user_passwords WHERE user_id = ?1 ORDER BY n DESC LIMIT 1",
                [&user_id],
                |r| r.get(0),
            )
            .optional()?)
        })
        .await
    }

    async fn create_invite(
        &self,
        hash: [u8; 32],
        user_id: &str,
        expires_at: Micros,
    ) -> Result<(), StoreError> {
        let user_id = user_id.to_string();
        self.with(move |c| {
            c.execute(
                "INSERT INTO invites(hash, user_id, created_at, expires_at) VALUES (?1, ?2, ?3, ?4)",
                params![hash.as_slice(), user_id, now_micros(), expires_at],
            )?;
            Ok(())
        })
        .await
    }

    async fn invite_user(&self, hash: [u8; 32], now: Micros) -> Result<Option<User>, StoreError> {
        self.with(move |c| invite_user_row(c, &hash, now)).await
    }

    async fn accept_invite(
        &self,
        hash: [u8; 32],
        phc: &str,
        now: Micros,
    ) -> Result<Option<User>, StoreError> {
        let phc = phc.to_string();
        self.with(move |c| {
            let tx = c.transaction()?;
            let Some(user) = invite_user_row(&tx, &hash, now)? else { return Ok(None) };
            tx.execute(
                "INSERT INTO invite_uses(hash, at) VALUES (?1, ?2)",
                params![hash.as_slice(), now],
            )?;
            tx.execute(
                "INSERT INTO user_passwords(user_id, phc, at) VALUES (?1, ?2, ?3)",
                params![user.id, phc, now],
            )?;
            tx.commit()?;
            Ok(Some(user))
        })
        .await
    }

    async fn create_console_session(
        &self,
        hash: [u8; 32],
        user_id: &str,
        now: Micros,
    ) -> Result<(), StoreError> {
        let user_id = user_id.to_string();
        self.with(move |c| {
            let sql = format!(
                "INSERT INTO console_sessions(hash, user_id, role, epoch, created_at)
                 SELECT ?1, u.id,
                   (SELECT role FROM user_roles r WHERE r.user_id = u.id ORDER BY n DESC LIMIT 1),
                   {}, ?3 FROM users u WHERE u.id = ?2",
                super::AUTH_EPOCH_SQL.replace("{u}", "u.id")
            );
            let n = c.execute(&sql, params![hash.as_slice(), user_id, now])?;
            if n == 0 {
                return Err(StoreError::NotFound(format!("no user with id {user_id}")));
            }
            Ok(())
        })
        .await
    }

    async fn console_session(
        &self,
        hash: [u8; 32],
    ) -> Result<Option<super::ConsoleSessionRow>, StoreError> {
        self.with(move |c| {
            let sql = format!(
                "SELECT s.user_id, u.email, s.role, s.epoch, s.created_at,
                   coalesce((SELECT max(at) FROM console_session_seen v WHERE v.hash = s.hash), s.created_at),
                   EXISTS(SELECT 1 FROM console_session_ends e WHERE e.hash = s.hash),
                   (SELECT role FROM user_roles r WHERE r.user_id = s.user_id ORDER BY n DESC LIMIT 1),
                   {}
                 FROM console_sessions s JOIN users u ON u.id = s.user_id WHERE s.hash = ?1",
                super::AUTH_EPOCH_SQL.replace("{u}", "s.user_id")
            );
            type Raw = (String, String, String, i64, i64, i64, bool, String, i64);
            let row: Option<Raw> = c
                .query_row(&sql, [hash.as_slice()], |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                        r.get(8)?,
                    ))
                })
                .optional()?;
            row.map(|(id, email, at_login, epoch, created_at, last_seen, ended, role, now)| {
                Ok(super::ConsoleSessionRow {
                    user: User { id, email, role: role.parse().map_err(StoreError::Other)? },
                    role_at_login: at_login.parse().map_err(StoreError::Other)?,
                    epoch_at_login: epoch,
                    epoch_now: now,
                    created_at,
                    last_seen,
                    ended,
                })
            })
            .transpose()
        })
        .await
    }

    async fn touch_console_session(&self, hash: [u8; 32], now: Micros) -> Result<(), StoreError> {
        self.with(move |c| {
            c.execute(
                "INSERT INTO console_session_seen(hash, at) VALUES (?1, ?2)",
                params![hash.as_slice(), now],
            )?;
            Ok(())
        })
        .await
    }

    async fn end_console_session(
        &self,
        hash: [u8; 32],
        reason: &str,
        now: Micros,
    ) -> Result<(), StoreError> {
        let reason = reason.to_string();
        self.with(move |c| {
            c.execute(
                "INSERT INTO console_session_ends(hash, reason, at) VALUES (?1, ?2, ?3)",
                params![hash.as_slice(), reason, now],
            )?;
            Ok(())
        })
        .await
    }

    async fn auth_log(&self, email: &str, address: &str, now: Micros) -> Result<(), StoreError> {
        let (email, address) = (clip(email, 320), clip(address, 64));
        self.with(move |c| {
            // One statement: the next sequence number picks the ring slot it overwrites.
            c.execute(
                "INSERT INTO auth_log(slot, seq, at, address, email)
                 SELECT (s % ?1), s, ?2, ?3, ?4 FROM (SELECT coalesce(max(seq), 0) + 1 AS s FROM auth_log)
                 WHERE 1
                 ON CONFLICT(slot) DO UPDATE SET seq = excluded.seq, at = excluded.at,
                   address = excluded.address, email = excluded.email",
                params![AUTH_LOG_ROWS, now, address, email],
            )?;
            Ok(())
        })
        .await
    }
}

/// Rows the unknown-email auth log keeps (a ring; both stores).
pub const AUTH_LOG_ROWS: i64 = 10_000;

/// `s` cut to at most `max` bytes on a character boundary.
fn clip(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The user of a usable invite (unused, not expired at `now`).
fn invite_user_row(
    c: &Connection,
    hash: &[u8; 32],
    now: Micros,
) -> Result<Option<User>, StoreError> {
    let row: Option<(String, String)> = c
        .query_row(
            "SELECT u.id, u.email FROM invites i JOIN users u ON u.id = i.user_id
             WHERE i.hash = ?1 AND i.expires_at > ?2
               AND NOT EXISTS (SELECT 1 FROM invite_uses x WHERE x.hash = i.hash)",
            params![hash.as_slice(), now],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    row.map(|(id, email)| user_row(c, id, email)).transpose()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::review::Severity;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    fn event(id: &str) -> NewEvent {
        NewEvent {
            source: Source::External,
            id: id.into(),
            kind: "t".into(),
            ts: 1,
            session: None,
            seq: None,
            boot: None,
            payload: "{}".into(),
            airlock_session: None,
            file: None,
            offset: None,
        }
    }

    /// Flags every created event with one flag of its own.
    struct FlagEach;

    impl IngestScan for FlagEach {
        fn batch_flags(&self, inserted: &[Inserted]) -> Vec<NewFlag> {
            inserted
                .iter()
                .filter(|i| i.created)
                .map(|i| NewFlag {
                    id: format!("flag-{}", i.pk),
                    rule_id: "test.rule".into(),
                    title: "t".into(),
                    severity: Severity::Low,
                    user_id: "u".into(),
                    session: None,
                    detail: String::new(),
                    event_pks: vec![i.pk],
                })
                .collect()
        }
        fn ended_sessions(&self, _: &[Inserted]) -> Vec<String> {
            Vec::new()
        }
        fn session_flags(&self, _: SessionScan) -> Vec<NewFlag> {
            Vec::new()
        }
    }

    #[test]
    fn console_rows_passwords_invites_sessions_and_the_auth_ring() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(dir.path()).unwrap();
        rt().block_on(async {
            let u = s.add_user("c@example.test", Role::Member).await.unwrap();
            assert_eq!(s.password_of(&u.id).await.unwrap(), None);
            s.set_password(&u.id, "$argon2id$one").await.unwrap();
            s.set_password(&u.id, "$argon2id$two").await.unwrap();
            assert_eq!(s.password_of(&u.id).await.unwrap().as_deref(), Some("$argon2id$two"));
            assert!(matches!(s.set_password("nobody", "x").await, Err(StoreError::NotFound(_))));
            // Invites: usable until expiry, once.
            let (h, old) = ([1u8; 32], [2u8; 32]);
            s.create_invite(h, &u.id, 1_000).await.unwrap();
            s.create_invite(old, &u.id, 1_000).await.unwrap();
            assert_eq!(
                s.invite_user(h, 999).await.unwrap().map(|u| u.email),
                Some(u.email.clone())
            );
            assert_eq!(s.invite_user(h, 1_000).await.unwrap(), None, "expired");
            assert_eq!(s.accept_invite(old, "$argon2id$late", 1_000).await.unwrap(), None);
            assert!(s.accept_invite(h, "$argon2id$three", 999).await.unwrap().is_some());
            assert_eq!(s.accept_invite(h, "$argon2id$four", 999).await.unwrap(), None, "once");
            assert_eq!(s.password_of(&u.id).await.unwrap().as_deref(), Some("$argon2id$three"));
            // Sessions: role and epoch at sign-in, seen marks, ends.
            let sh = [3u8; 32];
            s.create_console_session(sh, &u.id, 10).await.unwrap();
            let row = s.console_session(sh).await.unwrap().unwrap();
            assert_eq!(
                (row.role_at_login, row.epoch_at_login, row.epoch_now),
                (Role::Member, 3, 3)
            );
            assert_eq!((row.created_at, row.last_seen, row.ended), (10, 10, false));
            s.touch_console_session(sh, 20).await.unwrap();
            s.set_role(&u.id, Role::Reviewer).await.unwrap();
            let t = crate::review::token::Token::generate().unwrap();
            s.create_token("t1", &u.id, t.hash()).await.unwrap();
            s.revoke_token("t1").await.unwrap();
            let row = s.console_session(sh).await.unwrap().unwrap();
            assert_eq!((row.last_seen, row.user.role, row.epoch_now), (20, Role::Reviewer, 4));
            s.end_console_session(sh, "logout", 30).await.unwrap();
            assert!(s.console_session(sh).await.unwrap().unwrap().ended);
            assert_eq!(s.console_session([9u8; 32]).await.unwrap(), None);
            // The ring: sequence numbers pick slots; emails are clipped.
            s.auth_log("x@example.test", "127.0.0.1", 1).await.unwrap();
            s.auth_log(&"é".repeat(400), "::1", 2).await.unwrap();
            let rows: Vec<(i64, i64, String)> = {
                let c = s.conn.lock().await;
                let mut st =
                    c.prepare("SELECT slot, seq, email FROM auth_log ORDER BY seq").unwrap();
                st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap()
            };
            assert_eq!((rows[0].0, rows[0].1), (1, 1));
            assert_eq!((rows[1].0, rows[1].1, rows[1].2.len()), (2, 2, 320));
        });
        // Insert-only, the ring's DELETE included.
        for sql in [
            "UPDATE user_passwords SET phc = 'x'",
            "DELETE FROM invite_uses",
            "UPDATE console_sessions SET role = 'admin'",
            "DELETE FROM console_session_ends",
        ] {
            assert!(s.execute_raw(sql).unwrap_err().to_string().contains("insert-only"), "{sql}");
        }
        assert!(s.execute_raw("DELETE FROM auth_log").unwrap_err().to_string().contains("ring"));
    }

    #[test]
    fn commits_are_synchronous_full() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(dir.path()).unwrap();
        let mode: i64 =
            s.conn.blocking_lock().query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
        assert_eq!(mode, 2, "synchronous must be FULL (2), so answered commits survive power loss");
    }

    #[test]
    fn migration_3_marks_existing_flag_states_as_not_self_actions() {
        // A version-1 store with a flag state, as older servers left it.
        let mut conn = Connection::open_in_memory().unwrap();
        migrate_with(&mut conn, &MIGRATIONS[..1]).unwrap();
        conn.execute_batch(
            "INSERT INTO flags(id, rule_id, title, severity, user_id, session, detail, created_at)
               VALUES ('f1', 'r', 't', 'low', 'u1', NULL, 'd', 1);
             INSERT INTO flag_states(flag_id, state, note, actor, at)
               VALUES ('f1', 'acknowledged', 'old', 'u2', 2);",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let (_, f) = load_flag(&conn, "f1").unwrap().unwrap();
        assert_eq!(f.state, FlagState::Acknowledged);
        assert_eq!(f.history.len(), 1);
        assert!(!f.history[0].self_action);
        assert_eq!((f.history[0].actor.as_str(), f.history[0].at), ("u2", 2));
        let has_3: i64 = conn
            .query_row("SELECT count(*) FROM schema_migrations WHERE version = 3", [], |r| r.get(0))
            .unwrap();
        assert_eq!(has_3, 1, "migration 3 recorded");
        // The column holds only 0 and 1.
        let bad = conn.execute(
            "INSERT INTO flag_states(flag_id, state, actor, at, self) VALUES ('f1', 'open', 'u2', 3, 7)",
            [],
        );
        assert!(bad.is_err());
    }

    #[test]
    fn migration_8_reads_older_states_as_unassigned_and_assignments_keep_the_state() {
        // A store as the previous release left it (every migration before 8).
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "foreign_keys", "ON").unwrap();
        let before: Vec<_> = MIGRATIONS.iter().copied().filter(|(v, _)| *v < 8).collect();
        migrate_with(&mut conn, &before).unwrap();
        conn.execute_batch(
            "INSERT INTO users(id, email, created_at) VALUES ('u2', 'r@example.test', 1);
             INSERT INTO flags(id, rule_id, title, severity, user_id, session, detail, created_at)
               VALUES ('f1', 'r', 't', 'low', 'u1', NULL, 'd', 1);
             INSERT INTO flag_states(flag_id, state, note, actor, at, self)
               VALUES ('f1', 'resolved', 'old', 'u2', 2, 0);",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let (_, f) = load_flag(&conn, "f1").unwrap().unwrap();
        assert_eq!((f.state, f.assignee.as_deref()), (FlagState::Resolved, None));
        assert!(!f.history[0].assignment);
        let s = SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
            path: PathBuf::new(),
            log_in_ingest: Arc::new(AtomicBool::new(true)),
        };
        let a = FlagAssignment {
            flag_id: "f1",
            assignee: Some("u2"),
            note: Some("yours"),
            actor: "u2",
            self_action: false,
            secret: "",
            at: 3,
        };
        assert!(rt().block_on(s.assign_flag(&a)).unwrap());
        assert!(!rt().block_on(s.assign_flag(&FlagAssignment { flag_id: "nope", ..a })).unwrap());
        let f = rt().block_on(s.get_flag("f1")).unwrap().unwrap();
        assert_eq!(f.state, FlagState::Resolved, "an assignment keeps the state");
        assert_eq!(f.assignee.as_deref(), Some("u2"));
        assert_eq!(f.assignee_email.as_deref(), Some("r@example.test"));
        assert!(f.history[1].assignment && f.history[1].state == FlagState::Resolved);
        // An assignee that is no user is refused by the foreign key; an assignee on a state
        // row by the CHECK.
        let c = s.conn.blocking_lock();
        for bad in [
            "INSERT INTO flag_states(flag_id, state, actor, at, assignment, assignee) VALUES ('f1', 'open', 'u2', 4, 1, 'ghost')",
            "INSERT INTO flag_states(flag_id, state, actor, at, assignment, assignee) VALUES ('f1', 'open', 'u2', 4, 0, 'u2')",
        ] {
            assert!(c.execute(bad, []).is_err(), "{bad}");
        }
    }

    #[test]
    fn migration_10_leaves_the_backlog_to_the_sequencer_oldest_first() {
        // A store as the previous release left it (every migration before 10), with events.
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "foreign_keys", "ON").unwrap();
        let before: Vec<_> = MIGRATIONS.iter().copied().filter(|(v, _)| *v < 10).collect();
        migrate_with(&mut conn, &before).unwrap();
        conn.execute_batch(
            r#"INSERT INTO events(user_id, source, id, type, ts, received_at, payload) VALUES
                 ('u', 'external', 'old-1', 't', 1, 5000001, '{}'),
                 ('u', 'external', 'old-2', 't', 1, 5000002, '{"a":1}'),
                 ('v', 'egress', 'old-3', 't', 1, 5000003, '{"b":2}');"#,
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let count = |c: &Connection| -> i64 {
            c.query_row("SELECT count(*) FROM log_leaves", [], |r| r.get(0)).unwrap()
        };
        assert_eq!(count(&conn), 0, "the migration computes no hashes");
        let s = SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
            path: PathBuf::new(),
            log_in_ingest: Arc::new(AtomicBool::new(true)),
        };
        let rt = rt();
        let head = rt.block_on(s.log_sequence(2)).unwrap().unwrap();
        assert_eq!((head.size, head.appended), (2, 2), "oldest first, `max` at a time");
        // An ingest sequences the rest of the backlog before its own event.
        let ins = rt.block_on(s.insert_events("u", 9_000_000, &[event("new")])).unwrap();
        assert_eq!(ins[0].leaf_index, Some(3));
        let leaves = rt.block_on(s.log_leaves(&[ins[0].pk, 1, 2, 3])).unwrap();
        assert_eq!(leaves.iter().map(|l| l.index).collect::<Vec<_>>(), [3, 0, 1, 2]);
        let old1 = crate::tlog::EventLeaf {
            user_id: "u",
            source: "external",
            id: "old-1",
            received_at: 5_000_001,
            payload_sha256: crate::tlog::sha256(b"{}"),
        };
        assert_eq!(leaves[1].hash, old1.hash());
        assert_eq!(leaves[3].payload_sha256, crate::tlog::sha256(br#"{"b":2}"#));
        let head = rt.block_on(s.log_head()).unwrap();
        let hashes = rt.block_on(s.log_tier(0, 0, 10)).unwrap();
        assert_eq!((head.size, head.root), (4, crate::tlog::merkle::root(&hashes)));
        assert_eq!(rt.block_on(s.log_sequence(10)).unwrap().unwrap().appended, 0);
        // A gate's events get their leaves in the gate's own transaction too.
        let gate = crate::review::gates::NewGate {
            id: "g1".into(),
            user_id: "u".into(),
            kind: crate::review::gates::GateKind::External,
            session: None,
            repo: None,
            method: None,
            host: None,
            port: None,
            request: None,
            action: "a".into(),
            digest: "d".into(),
            severity: crate::gate::Severity::Low,
            rule: None,
            layer: None,
            policy: None,
            local_id: None,
            context: None,
            self_approve: false,
            timeout_ms: 60_000,
        };
        s.execute_raw("INSERT INTO users(id, email, created_at) VALUES ('u', 'u@example.test', 1)")
            .unwrap();
        let caps = GateCaps { per_session: 5, per_user: 5 };
        assert!(matches!(rt.block_on(s.open_gate(&gate, caps)).unwrap(), Opened::Gate(_)));
        assert_eq!(rt.block_on(s.log_head()).unwrap().size, 5);
        assert_eq!(count(&s.conn.blocking_lock()), 5);
    }

    #[test]
    fn a_failing_migration_is_applied_not_at_all() {
        let mut conn = Connection::open_in_memory().unwrap();
        let broken = [
            MIGRATIONS[0],
            (2, "CREATE TABLE extra(a INTEGER); INSERT INTO no_such_table VALUES (1);"),
        ];
        let e = migrate_with(&mut conn, &broken).unwrap_err().to_string();
        assert!(e.contains("migration 2 failed"), "{e}");
        let extra: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master WHERE name = 'extra'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(extra, 0, "the failed migration's first statement was rolled back");
        let version: i64 =
            conn.query_row("SELECT max(version) FROM schema_migrations", [], |r| r.get(0)).unwrap();
        assert_eq!(version, 1);
        // Fixed, it applies on the next open, with its row.
        let fixed = [MIGRATIONS[0], (2, "CREATE TABLE extra(a INTEGER);")];
        migrate_with(&mut conn, &fixed).unwrap();
        let version: i64 =
            conn.query_row("SELECT max(version) FROM schema_migrations", [], |r| r.get(0)).unwrap();
        assert_eq!(version, 2);
    }

    #[test]
    fn migration_5_applies_to_a_version_1_store_and_a_lower_number_still_applies_after_it() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate_with(&mut conn, &MIGRATIONS[..1]).unwrap();
        migrate_with(&mut conn, MIGRATIONS).unwrap();
        let versions = |c: &Connection| -> Vec<i64> {
            let mut st =
                c.prepare("SELECT version FROM schema_migrations ORDER BY version").unwrap();
            st.query_map([], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap()
        };
        let all: Vec<i64> = MIGRATIONS.iter().map(|(v, _)| *v).collect();
        assert_eq!(versions(&conn), all);
        assert!(all.contains(&5));
        let idx: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'events_user_ts'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(idx, 1);
        // A branch's migration 4 merged later is applied although 5 is already recorded.
        assert!(!all.contains(&4), "pick an unused number for this test");
        let mut later = MIGRATIONS.to_vec();
        later.push((4, "CREATE TABLE extra(a INTEGER);"));
        later.sort_by_key(|(v, _)| *v);
        migrate_with(&mut conn, &later).unwrap();
        let mut want = all.clone();
        want.push(4);
        want.sort();
        assert_eq!(versions(&conn), want);
    }

    #[test]
    fn ingest_commits_events_and_flags_together_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(dir.path()).unwrap();
        let scan: Arc<dyn IngestScan> = Arc::new(FlagEach);
        let rt = rt();
        let count =
            |sql: &str| -> i64 { s.conn.blocking_lock().query_row(sql, [], |r| r.get(0)).unwrap() };
        let ins = rt.block_on(s.ingest("u", 5, &[event("a"), event("b")], scan.clone())).unwrap();
        assert!(ins.iter().all(|i| i.created));
        assert_eq!(count("SELECT count(*) FROM flag_events"), 2);
        // A flag that cannot be written: the whole batch is refused and nothing is left.
        s.execute_raw(
            "CREATE TRIGGER refuse BEFORE INSERT ON flags BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
        .unwrap();
        let r = rt.block_on(s.ingest("u", 6, &[event("c")], scan.clone()));
        assert!(r.is_err(), "{r:?}");
        assert_eq!(count("SELECT count(*) FROM events"), 2);
        assert_eq!(count("SELECT count(*) FROM event_keys"), 2);
        // Lifted, the retry creates the event (its key was not left behind) and its flag.
        s.execute_raw("DROP TRIGGER refuse").unwrap();
        let ins = rt.block_on(s.ingest("u", 7, &[event("c")], scan)).unwrap();
        assert!(ins[0].created);
        assert_eq!(count("SELECT count(*) FROM flag_events"), 3);
    }
}
