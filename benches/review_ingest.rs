//! Sustained ingest of egress events over HTTP into the review plane, batches of 1,000
//! (~650-byte NDJSON lines), dedup on, by 4 clients with one user and token each: embedded
//! SQLite and PostgreSQL (127.0.0.1:5432, a throwaway database). The load generator runs in
//! the same process on the same machine (loopback only). Baselines in the same run:
//! - the store's `insert_events` called directly, without HTTP, parsing or detection;
//! - the schema's ceiling without airlock: for SQLite a raw `rusqlite` insert of the same rows
//!   (events + dedup keys, one transaction per 1,000, WAL, `synchronous=FULL`); for PostgreSQL
//!   `pgbench`, 4 clients, one batch per transaction, with two scripts: one doing the database
//!   work of a production batch (the same statements: keys and rows joined back to the input,
//!   each row's pk returned, the mix's flags and their links; rows made server-side, all
//!   distinct), the ratio's ceiling; and the lighter keys-and-rows-only script earlier runs used.
//!
//!
//! Then the review log's cost (issue 19), per store, same run: HTTP ingest into a store with
//! the log **on** (as `airlockd review --log-key` runs it: a signing key, the sequencer loop;
//! the embedded store also sequences inside each ingest's transaction and answers once the
//! checkpoint covering the batch is signed) against one with the log **off** (no key, no
//! sequencer; the embedded store's in-transaction sequencing switched off with
//! `SqliteStore::set_log_sequencing(false)`, a benchmark-only switch). Two stores of each kind,
//! fed alternately (on/off, then off/on, …) the same number of batches per run, so both grow
//! alike and machine noise hits both; after each "on" run the sequencer's backlog is read
//! (PostgreSQL sequences after commit: it must keep up).
//!
//! `cargo bench --bench review_ingest` (env: BENCH_BATCHES, default 200; BENCH_CONNS, 4;
//! BENCH_FLAGGED_PER_1000, 100; BENCH_PGBENCH_SECS, 15; BENCH_LOG_ROUNDS, 4 (on/off pairs per
//! store); BENCH_ONLY=log runs only the log comparison, BENCH_ONLY=base only the rest).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock::review::detect::Engine;
use airlock::review::limits::{LimitsConfig, Rate};
use airlock::review::server::{AppState, serve};
use airlock::review::store::postgres::{self, PgStore};
use airlock::review::store::sqlite::SqliteStore;
use airlock::review::store::{AnyStore, Store};
use airlock::review::{NewEvent, Role, Source, token};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BATCH: usize = 1000;

/// Items per 1,000 that go to a paste site (refused, and each raises a flag with its link):
/// `BENCH_FLAGGED_PER_1000`, default 100 (a flag-heavy mix; a working day's egress raises a
/// handful per session).
fn flagged_per_1000() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("BENCH_FLAGGED_PER_1000").ok().and_then(|v| v.parse().ok()).unwrap_or(100)
    })
}

fn egress_line(run: &str, b: usize, i: usize) -> String {
    // Spread evenly: item i is flagged when it crosses a multiple of 1000 / flagged.
    let f = flagged_per_1000();
    let flagged = f > 0 && (i % BATCH) * f / BATCH != ((i % BATCH) + 1) * f / BATCH;
    let host = match (flagged, i % 10) {
        (true, _) => "pastebin.com",
        (false, 1 | 2) => "registry.npmjs.org",
        _ => "api.anthropic.com",
    };
    let allowed = !flagged;
    format!(
        r#"{{"id":"{run}-{b}-{i}","source":"egress","type":"connect","ts":"2026-03-04T09:12:05.118Z","session":"sess-{b}","seq":{seq},"payload":{{"id":"{run}-{b}-{i}","ts":"2026-03-04T09:12:05.118Z","user_id":"41f0c2","repo":"payments","host":"{host}","method":"CONNECT","allowed":{allowed},"port":443,"boot":"boot-1","session":"sess-{b}","seq":{seq},"bytes_sent":18204,"bytes_recv":91544,"duration_ms":2311,"sni":"{host}","tls":"1.3","alpn":"http/1.1","pid":48213,"exe":"/usr/local/bin/claude","ua":"claude-cli/2.1.40 (external, cli)","policy":"team-default@4","rule":"allow api hosts","cwd":"/home/ana/src/payments","proc":"node"}}}}"#,
        seq = i + 1
    )
}

fn batch_body(run: &str, b: usize) -> Bytes {
    let mut s = String::with_capacity(BATCH * 700);
    for i in 0..BATCH {
        s.push_str(&egress_line(run, b, i));
        s.push('\n');
    }
    Bytes::from(s)
}

struct Result_ {
    events_per_s: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
}

async fn drive(port: u16, secrets: &[String], bodies: Vec<Bytes>, conns: usize) -> Result_ {
    let bodies = Arc::new(bodies);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..conns {
        let bodies = Arc::clone(&bodies);
        let next = Arc::clone(&next);
        // One user and token per client connection.
        let auth = format!("Bearer {}", secrets[k % secrets.len()]);
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let (mut send, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(body) = bodies.get(i) else { break };
                let req = http::Request::post("/api/v1/events")
                    .header("host", "127.0.0.1")
                    .header("authorization", &auth)
                    .header("content-type", "application/x-ndjson")
                    .body(Full::new(body.clone()))
                    .unwrap();
                let t = Instant::now();
                let resp = send.send_request(req).await.unwrap();
                let status = resp.status();
                let _ = resp.into_body().collect().await.unwrap();
                assert_eq!(status, 200);
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed();
    lat.sort();
    let pct =
        |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).saturating_sub(1).min(lat.len() - 1)];
    Result_ {
        events_per_s: (lat.len() * BATCH) as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        max: *lat.last().unwrap(),
    }
}

/// What the same rows cost without airlock, in events/s (see the module doc).
enum Ceiling {
    RawSqlite(std::path::PathBuf),
    Pgbench { owner_url: String, secs: u64, clients: usize },
}

/// `admin` writes the users and tokens (PostgreSQL's runtime role cannot); `store` is measured.
async fn bench_store(
    name: &str,
    admin: AnyStore,
    store: AnyStore,
    batches: usize,
    conns: usize,
    ceiling: Ceiling,
) {
    let run = format!("{}", airlock::review::now_micros());
    // Baseline: direct store inserts (no HTTP, no parsing, no detection).
    let user = admin.add_user(&format!("bench-{run}@example.test"), Role::Member).await.unwrap();
    let direct_batches = batches.min(50);
    let evs: Vec<Vec<NewEvent>> = (0..direct_batches)
        .map(|b| {
            (0..BATCH)
                .map(|i| NewEvent {
                    source: Source::Egress,
                    id: format!("direct-{run}-{b}-{i}"),
                    kind: "connect".into(),
                    ts: 1_772_615_525_118_000,
                    session: Some(format!("sess-{b}")),
                    seq: Some(i as i64 + 1),
                    boot: Some("boot-1".into()),
                    payload: egress_line(&run, b, i),
                    airlock_session: None,
                    file: None,
                    offset: None,
                })
                .collect()
        })
        .collect();
    let t = Instant::now();
    for b in &evs {
        store.insert_events(&user.id, airlock::review::now_micros(), b).await.unwrap();
    }
    let direct = (direct_batches * BATCH) as f64 / t.elapsed().as_secs_f64();

    let mut secrets = Vec::new();
    for k in 0..conns {
        let u =
            admin.add_user(&format!("bench-{run}-{k}@example.test"), Role::Member).await.unwrap();
        let tok = token::Token::generate().unwrap();
        admin.create_token(&format!("bench-{run}-{k}"), &u.id, tok.hash()).await.unwrap();
        secrets.push(tok.expose().to_string());
    }
    // Each connection is its own user and token, as in production; the global slots and the
    // token rate are raised so the bench measures the store, never a 429.
    let limits = LimitsConfig {
        ingest_concurrency: conns + 1,
        token_rate: Rate { per_sec: 1e9, burst: u32::MAX },
        ..LimitsConfig::default()
    };
    let state = Arc::new(AppState::with_limits(store, Engine::builtin().unwrap(), limits));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, None, state, async move {
        let _ = stop_rx.await;
    }));
    let mut bodies: Vec<Bytes> = (0..batches).map(|b| batch_body(&run, b)).collect();
    let line_bytes = bodies[0].len() as f64 / BATCH as f64;
    // One batch in ten is a resend: exercises the duplicate path. (Batch `b` goes to the
    // connection that takes it, so a resend may come from another user: then it is new.)
    for b in (0..batches).step_by(10) {
        bodies.push(bodies[b].clone());
    }
    let r = drive(port, &secrets, bodies, conns).await;
    let _ = stop_tx.send(());
    let _ = server.await;
    let ceiling = match ceiling {
        Ceiling::RawSqlite(dir) => {
            ("raw rusqlite insert", raw_sqlite(&dir, &run, batches.min(100)))
        }
        Ceiling::Pgbench { owner_url, secs, clients } => {
            let line = egress_line(&run, 0, 0);
            // Both scripts, same run: the lighter one (keys and rows only, one payload constant)
            // stays as the figure earlier runs were compared against.
            let light = pgbench(&owner_url, &light_script(&line), secs, clients);
            println!(
                "{name:<10} pgbench, keys and rows only (lighter script): {light:>8.0} events/s (HTTP at {:.2}x)",
                r.events_per_s / light
            );
            (
                "pgbench, the production statements",
                pgbench(&owner_url, &full_script(&line), secs, clients),
            )
        }
    };
    println!(
        "{name:<10} HTTP ingest: {:>8.0} events/s  p50 {:>6.1} ms  p99 {:>6.1} ms  max {:>6.1} ms  ({line_bytes:.0} B lines, {conns} users)\n\
         {:<10} direct store {:>8.0} events/s (HTTP at {:.2}x)  | {} {:>8.0} events/s (HTTP at {:.2}x)",
        r.events_per_s,
        r.p50.as_secs_f64() * 1e3,
        r.p99.as_secs_f64() * 1e3,
        r.max.as_secs_f64() * 1e3,
        "",
        direct,
        r.events_per_s / direct,
        ceiling.0,
        ceiling.1,
        r.events_per_s / ceiling.1,
    );
}

/// The same rows inserted with plain `rusqlite` into a fresh store's tables (schema made by
/// `SqliteStore::open`, then a connection of its own with the store's pragmas): events and
/// their dedup keys, 1,000 per transaction. Returns events/s.
fn raw_sqlite(dir: &std::path::Path, run: &str, batches: usize) -> f64 {
    drop(SqliteStore::open(dir).unwrap());
    let mut c = rusqlite::Connection::open(dir.join("review.db")).unwrap();
    c.pragma_update(None, "journal_mode", "WAL").unwrap();
    c.pragma_update(None, "synchronous", "FULL").unwrap();
    let lines: Vec<Vec<String>> =
        (0..batches).map(|b| (0..BATCH).map(|i| egress_line(run, b, i)).collect()).collect();
    let t = Instant::now();
    for (b, batch) in lines.iter().enumerate() {
        let tx = c.transaction().unwrap();
        {
            let mut ev = tx
                .prepare_cached(
                    "INSERT INTO events(user_id, source, id, type, ts, session, seq, boot, received_at, payload)
                     VALUES ('raw', 'egress', ?1, 'connect', 1772615525118000, ?2, ?3, 'boot-1', ?4, ?5)",
                )
                .unwrap();
            let mut key = tx
                .prepare_cached(
                    "INSERT INTO event_keys(user_id, source, id, pk, received_at, sha256)
                     VALUES ('raw', 'egress', ?1, ?2, ?3, ?4)",
                )
                .unwrap();
            let now = airlock::review::now_micros();
            for (i, line) in batch.iter().enumerate() {
                let id = format!("raw-{b}-{i}");
                ev.execute(rusqlite::params![id, format!("sess-{b}"), i as i64 + 1, now, line])
                    .unwrap();
                let pk = tx.last_insert_rowid();
                key.execute(rusqlite::params![id, pk, now, [0u8; 32].as_slice()]).unwrap();
            }
        }
        tx.commit().unwrap();
    }
    (batches * BATCH) as f64 / t.elapsed().as_secs_f64()
}

/// The lighter `pgbench` script: 1,000 rows of one constant `payload` per transaction into
/// `event_keys` and `events` (keys `ON CONFLICT DO NOTHING RETURNING`, the rows from the
/// keys). No flags, no join back to the input, nothing returned per row.
fn light_script(payload: &str) -> String {
    format!(
        "\\set r random(1, 1000000000000)
WITH input AS (SELECT 'egress'::text AS source, 'pgb-' || :client_id || '-' || :r || '-' || g AS id, g AS ord
               FROM generate_series(1, {BATCH}) g),
keys AS (INSERT INTO event_keys (user_id, source, id, pk, received_at, sha256)
         SELECT 'pgbench-user', source, id, nextval('events_pk_seq'), now(), '\\x{hash}'::bytea
         FROM input ORDER BY ord ON CONFLICT DO NOTHING RETURNING source, id, pk),
ev AS (INSERT INTO events (pk, user_id, source, id, type, ts, session, seq, boot, received_at, payload)
       SELECT k.pk, 'pgbench-user', k.source, k.id, 'connect', 1772615525118000, 'sess-1', 1, 'boot-1', now(), '{payload}'
       FROM keys k RETURNING pk)
SELECT count(*) FROM ev;
",
        hash = "ab".repeat(32),
    )
}

/// The `pgbench` script that does, per transaction, the database work of one production
/// ingest batch (`insert_event_rows` then `insert_flag_rows` in src/review/store/postgres.rs)
/// with the rows made server-side instead of shipped: 1,000 distinct ids, payloads (the bench
/// line with the row number appended, so no two are equal) and a session per batch; keys and
/// rows in one statement joined back to the input, each row's `ord`, `pk` and `received_at`
/// returned; then [`flagged_per_1000`] flags with one event link each. What it leaves out is
/// airlock's own share: HTTP, parsing, detection and the parameter transfer.
fn full_script(payload: &str) -> String {
    let flags = flagged_per_1000();
    let flag_sql = if flags == 0 {
        String::new()
    } else {
        format!(
            "WITH f AS (INSERT INTO flags(id, rule_id, title, severity, user_id, session, detail)
           SELECT 'pgbf-' || :client_id || '-' || :r || '-' || g, 'paste-site', 'Upload to a paste site',
                  'high', 'pgbench-user', 'sess-' || :r,
                  'CONNECT pastebin.com:443 refused by policy team-default@4 (rule: no paste sites), seq ' || g
           FROM generate_series(1, {flags}) g ON CONFLICT (id) DO NOTHING RETURNING id)
INSERT INTO flag_events(flag_id, event_pk) SELECT f.id, currval('events_pk_seq') FROM f ON CONFLICT DO NOTHING;
"
        )
    };
    format!(
        "\\set r random(1, 1000000000000)
BEGIN;
WITH input AS (SELECT 'egress'::text AS source, 'pgb-' || :client_id || '-' || :r || '-' || g AS id,
                      'connect'::text AS type, 1772615525118000::int8 AS ts, 'sess-' || :r AS session,
                      g::int8 AS seq, 'boot-1'::text AS boot, '{payload}' || g AS payload, g AS ord,
                      '\\x{hash}'::bytea AS sha256, nextval('events_pk_seq') AS pk
               FROM generate_series(1, {BATCH}) g),
keys AS (INSERT INTO event_keys (user_id, source, id, pk, received_at, sha256)
         SELECT 'pgbench-user', source, id, pk, now(), sha256
         FROM input ORDER BY ord ON CONFLICT DO NOTHING
         RETURNING pk, (extract(epoch from received_at) * 1000000)::int8 AS received_us),
ev AS (INSERT INTO events (pk, user_id, source, id, type, ts, session, seq, boot, received_at, payload)
       SELECT i.pk, 'pgbench-user', i.source, i.id, i.type, i.ts, i.session, i.seq, i.boot, now(), i.payload
       FROM keys k JOIN input i ON i.pk = k.pk RETURNING pk)
SELECT i.ord, k.pk, k.received_us FROM keys k JOIN input i ON i.pk = k.pk;
{flag_sql}END;
",
        hash = "ab".repeat(32),
    )
}

/// Runs `pgbench` (as the owner, `clients` connections, `secs` seconds) with `script`, one
/// batch of 1,000 events per transaction. Returns events/s (tps × 1,000).
fn pgbench(owner_url: &str, script: &str, secs: u64, clients: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("ingest.sql");
    std::fs::write(&f, script).unwrap();
    let out = std::process::Command::new("pgbench")
        .args(["-n", "-f"])
        .arg(&f)
        .args(["-c", &clients.to_string(), "-j", "2", "-T", &secs.to_string(), owner_url])
        .output();
    let Ok(out) = out else {
        println!("pgbench not found: no ceiling measured");
        return f64::NAN;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let tps = text
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok());
    match tps {
        Some(tps) => tps * BATCH as f64,
        None => {
            println!("pgbench failed: {text}{}", String::from_utf8_lossy(&out.stderr));
            f64::NAN
        }
    }
}

/// The first value `sql` returns on `url`, as text.
fn psql_value(url: &str, sql: &str) -> Option<String> {
    let out = std::process::Command::new("psql").args([url, "-qAt", "-c", sql]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// An `AppState` serving `store` on a loopback port, with the log on (a signing key and the
/// sequencer loop, as `airlockd review --log-key` runs) or off; each client connection is its
/// own user and token. Returns the port, the tokens and what stops it.
async fn log_server(
    admin: &AnyStore,
    store: AnyStore,
    conns: usize,
    log_on: bool,
    tag: &str,
) -> (u16, Vec<String>, Vec<tokio::task::JoinHandle<()>>, tokio::sync::oneshot::Sender<()>) {
    let mut secrets = Vec::new();
    for k in 0..conns {
        let u = admin.add_user(&format!("{tag}-{k}@example.test"), Role::Member).await.unwrap();
        let tok = token::Token::generate().unwrap();
        admin.create_token(&format!("{tag}-{k}"), &u.id, tok.hash()).await.unwrap();
        secrets.push(tok.expose().to_string());
    }
    let limits = LimitsConfig {
        ingest_concurrency: conns + 1,
        token_rate: Rate { per_sec: 1e9, burst: u32::MAX },
        ..LimitsConfig::default()
    };
    let mut state = AppState::with_limits(store, Engine::builtin().unwrap(), limits);
    // Diagnosis only: BENCH_LOG_ON=tree keeps the tree (embedded: sequenced in the ingest's
    // transaction) but signs nothing and runs no sequencer loop.
    let sign = std::env::var("BENCH_LOG_ON").map_or(true, |v| v != "tree");
    let log_on = log_on && sign;
    if log_on {
        let key = airlock::tlog::note::NoteSigner::generate("review.bench/log").unwrap();
        state = state.with_log_key(Some(key));
    }
    let state = Arc::new(state);
    let mut tasks = Vec::new();
    if log_on {
        tasks.push(tokio::spawn(airlock::review::log::sequencer_loop(Arc::clone(&state))));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tasks.push(tokio::spawn(serve(listener, None, state, async move {
        let _ = stop_rx.await;
    })));
    (port, secrets, tasks, stop_tx)
}

/// The review log's ingest cost on one kind of store (module doc): `stores` is `[on, off]`,
/// each `(admin, runtime)`; `rounds` pairs of runs of `batches` batches each, alternating which
/// goes first. `on_backlog` counts the "on" store's events without a leaf.
async fn log_on_off(
    name: &str,
    stores: [(AnyStore, AnyStore); 2],
    batches: usize,
    conns: usize,
    rounds: usize,
    on_backlog: &(dyn Fn() -> i64 + Sync),
) {
    let run = format!("{}", airlock::review::now_micros());
    let [(on_admin, on_store), (off_admin, off_store)] = stores;
    let on = log_server(&on_admin, on_store, conns, true, &format!("logon-{run}")).await;
    let off = log_server(&off_admin, off_store, conns, false, &format!("logoff-{run}")).await;
    println!(
        "{name:<10} review log on vs off: {rounds} pairs of runs of {batches} batches (+10% resent), {conns} users, alternating order"
    );
    let (mut on_rates, mut off_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut drain_ratios = Vec::new();
    let (mut on_p99, mut off_p99, mut drained) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let mut got = [None, None];
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let (port, secrets) = if which == 0 { (on.0, &on.1) } else { (off.0, &off.1) };
            let tag = format!("{run}-r{r}");
            let mut bodies: Vec<Bytes> = (0..batches).map(|b| batch_body(&tag, b)).collect();
            for b in (0..batches).step_by(10) {
                bodies.push(bodies[b].clone());
            }
            let t = Instant::now();
            got[which] = Some(drive(port, secrets, bodies, conns).await);
            if which == 0 {
                // The sequencer must keep up: what is left when the clients are done, and
                // how long it takes to drain.
                let run_t = t.elapsed();
                let left = on_backlog();
                let mut now_left = left;
                while now_left > 0 && t.elapsed() < run_t + Duration::from_secs(60) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    now_left = on_backlog();
                }
                // The "on" rate counted until the log holds every event stored: what the
                // store sustains with the log keeping up.
                let with_drain = got[0].as_ref().unwrap().events_per_s * run_t.as_secs_f64()
                    / t.elapsed().as_secs_f64();
                println!(
                    "{:<10}   round {r}: log-on backlog at the end {left} events, drained in {:.0} ms; on rate counted until drained {with_drain:.0} events/s",
                    "",
                    (t.elapsed() - run_t).as_secs_f64() * 1e3
                );
                drained.push(with_drain);
            }
        }
        let [Some(a), Some(b)] = got else { unreachable!() };
        println!(
            "{:<10}   round {r}: on {:>8.0} events/s (p50 {:>6.1} ms, p99 {:>6.1} ms)  off {:>8.0} events/s (p50 {:>6.1} ms, p99 {:>6.1} ms)  on/off {:.3}",
            "",
            a.events_per_s,
            a.p50.as_secs_f64() * 1e3,
            a.p99.as_secs_f64() * 1e3,
            b.events_per_s,
            b.p50.as_secs_f64() * 1e3,
            b.p99.as_secs_f64() * 1e3,
            a.events_per_s / b.events_per_s
        );
        println!(
            "{:<10}   round {r}: on (counted until drained) / off {:.3}",
            "",
            drained.last().copied().unwrap_or(f64::NAN) / b.events_per_s
        );
        drain_ratios.push(drained.last().copied().unwrap_or(f64::NAN) / b.events_per_s);
        ratios.push(a.events_per_s / b.events_per_s);
        on_rates.push(a.events_per_s);
        off_rates.push(b.events_per_s);
        on_p99.push(a.p99);
        off_p99.push(b.p99);
    }
    for (stop, tasks) in [(on.3, on.2), (off.3, off.2)] {
        let _ = stop.send(());
        for t in tasks {
            t.abort();
            let _ = t.await;
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "{name:<10} log on/off: median pair ratio {:.3}, mean-rate ratio {:.3} (on {:.0} /s, off {:.0} /s); target >= 0.90: {}",
        median(&mut ratios.clone()),
        mean(&on_rates) / mean(&off_rates),
        mean(&on_rates),
        mean(&off_rates),
        if median(&mut ratios) >= 0.9 { "met" } else { "NOT met" }
    );
    println!(
        "{name:<10} log on (counted until the log caught up) / off: median pair ratio {:.3}, mean {:.0} /s; target >= 0.90: {}",
        median(&mut drain_ratios.clone()),
        mean(&drained),
        if median(&mut drain_ratios) >= 0.9 { "met" } else { "NOT met" }
    );
}

fn psql(sql: &str) -> bool {
    std::process::Command::new("psql")
        .args(["postgres://postgres@127.0.0.1:5432/postgres", "-qAt", "-c", sql])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing useful: run small.
    let quick = !std::env::args().any(|a| a == "--bench");
    let batches: usize = std::env::var("BENCH_BATCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 3 } else { 200 });
    let conns: usize = std::env::var("BENCH_CONNS").ok().and_then(|v| v.parse().ok()).unwrap_or(4);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    println!(
        "review ingest: {batches} batches of {BATCH} egress events (+10% resent), {conns} client connections (one user each), same machine"
    );
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let (base, log) = (only.is_empty() || only == "base", only.is_empty() || only == "log");
    let rounds: usize = std::env::var("BENCH_LOG_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1 } else { 4 });
    let dir = tempfile::tempdir().unwrap();
    let raw_dir = tempfile::tempdir().unwrap();
    let (on_dir, off_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    if log {
        rt.block_on(async {
            let on = SqliteStore::open(on_dir.path()).unwrap();
            let off = SqliteStore::open(off_dir.path()).unwrap();
            off.set_log_sequencing(false);
            let backlog = |dir: std::path::PathBuf| {
                move || {
                    let c = rusqlite::Connection::open(dir.join("review.db")).unwrap();
                    c.query_row(
                        "SELECT (SELECT count(*) FROM events) - (SELECT count(*) FROM log_leaves)",
                        [],
                        |r| r.get::<_, i64>(0),
                    )
                    .unwrap()
                }
            };
            let on_backlog = backlog(on_dir.path().to_path_buf());
            log_on_off(
                "embedded",
                [
                    (AnyStore::Sqlite(on.clone()), AnyStore::Sqlite(on)),
                    (AnyStore::Sqlite(off.clone()), AnyStore::Sqlite(off)),
                ],
                batches,
                conns,
                rounds,
                &on_backlog,
            )
            .await;
        });
    }
    if base {
        rt.block_on(async {
            let s = SqliteStore::open(dir.path()).unwrap();
            let ceiling = Ceiling::RawSqlite(raw_dir.path().to_path_buf());
            let s = AnyStore::Sqlite(s);
            bench_store("embedded", s.clone(), s, batches, conns, ceiling).await;
        });
    }
    let pgbench_secs: u64 = std::env::var("BENCH_PGBENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 2 } else { 15 });
    let name = format!("airlock_bench_{}", std::process::id());
    let role = format!("airlock_bench_rt_{}", std::process::id());
    if !psql(&format!("CREATE DATABASE {name}")) {
        println!("postgres   skipped: PostgreSQL at 127.0.0.1:5432 unreachable");
        return;
    }
    psql(&format!("CREATE ROLE {role} LOGIN"));
    let owner = format!("postgres://postgres@127.0.0.1:5432/{name}");
    let runtime = format!("postgres://{role}@127.0.0.1:5432/{name}");
    let opts = postgres::MigrateOptions { runtime_role: Some(role.clone()), ..Default::default() };
    if base {
        rt.block_on(async {
            postgres::migrate(&owner, &opts).await.unwrap();
            let admin = AnyStore::Pg(PgStore::connect(&owner, 1).await.unwrap());
            let s = PgStore::connect(&runtime, conns).await.unwrap();
            let ceiling =
                Ceiling::Pgbench { owner_url: owner.clone(), secs: pgbench_secs, clients: conns };
            bench_store("postgres", admin, AnyStore::Pg(s), batches, conns, ceiling).await;
        });
    }
    let (on_db, off_db) = (format!("{name}_log_on"), format!("{name}_log_off"));
    if log
        && psql(&format!("CREATE DATABASE {on_db}"))
        && psql(&format!("CREATE DATABASE {off_db}"))
    {
        rt.block_on(async {
            let mut pair = Vec::new();
            for db in [&on_db, &off_db] {
                let owner = format!("postgres://postgres@127.0.0.1:5432/{db}");
                postgres::migrate(&owner, &opts).await.unwrap();
                let admin = AnyStore::Pg(PgStore::connect(&owner, 1).await.unwrap());
                let runtime = format!("postgres://{role}@127.0.0.1:5432/{db}");
                pair.push((admin, AnyStore::Pg(PgStore::connect(&runtime, conns).await.unwrap())));
            }
            let off = pair.pop().unwrap();
            let on = pair.pop().unwrap();
            let on_url = format!("postgres://postgres@127.0.0.1:5432/{on_db}");
            let on_backlog = move || {
                psql_value(
                    &on_url,
                    "SELECT (SELECT count(*) FROM events) - (SELECT count(*) FROM log_leaves)",
                )
                .and_then(|v| v.parse().ok())
                .unwrap_or(-1)
            };
            log_on_off("postgres", [on, off], batches, conns, rounds, &on_backlog).await;
        });
    }
    drop(rt);
    for db in [&name, &on_db, &off_db] {
        psql(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"));
    }
    psql(&format!("DROP ROLE {role}"));
}
