//! Sustained ingest of egress events over HTTP into the review plane, batches of 1,000,
//! dedup on: embedded SQLite and PostgreSQL (127.0.0.1:5432, a throwaway database).
//! The load generator runs in the same process on the same machine (loopback only).
//! Baseline in the same run: the store's `insert_events` called directly, without HTTP,
//! parsing or detection.
//!
//! `cargo bench --bench review_ingest` (env: BENCH_BATCHES, default 200; BENCH_CONNS, 4).
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

fn egress_line(run: &str, b: usize, i: usize) -> String {
    let host = match i % 10 {
        0 => "pastebin.com",
        1 | 2 => "registry.npmjs.org",
        _ => "api.anthropic.com",
    };
    let allowed = !i.is_multiple_of(10);
    format!(
        r#"{{"id":"{run}-{b}-{i}","source":"egress","type":"connect","ts":"2026-03-04T09:12:05.118Z","session":"sess-{b}","seq":{seq},"payload":{{"id":"{run}-{b}-{i}","ts":"2026-03-04T09:12:05.118Z","user_id":"41f0c2","repo":"payments","host":"{host}","method":"CONNECT","allowed":{allowed},"port":443,"boot":"boot-1","session":"sess-{b}","seq":{seq},"bytes_sent":18204,"bytes_recv":91544,"duration_ms":2311}}}}"#,
        seq = i + 1
    )
}

fn batch_body(run: &str, b: usize) -> Bytes {
    let mut s = String::with_capacity(BATCH * 420);
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

async fn drive(port: u16, secret: &str, bodies: Vec<Bytes>, conns: usize) -> Result_ {
    let bodies = Arc::new(bodies);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let bodies = Arc::clone(&bodies);
        let next = Arc::clone(&next);
        let auth = format!("Bearer {secret}");
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

/// `admin` writes the user and token (PostgreSQL's runtime role cannot); `store` is measured.
async fn bench_store(name: &str, admin: AnyStore, store: AnyStore, batches: usize, conns: usize) {
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
                })
                .collect()
        })
        .collect();
    let t = Instant::now();
    for b in &evs {
        store.insert_events(&user.id, airlock::review::now_micros(), b).await.unwrap();
    }
    let direct = (direct_batches * BATCH) as f64 / t.elapsed().as_secs_f64();

    let tok = token::Token::generate().unwrap();
    admin.create_token(&format!("bench-{run}"), &user.id, tok.hash()).await.unwrap();
    // One token drives every connection here: give it the slots and rate the bench needs (the
    // per-user share and per-token rate would otherwise answer 429, which the bench refuses).
    let limits = LimitsConfig {
        ingest_concurrency: conns + 1,
        ingest_concurrency_per_user: conns,
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
    // One batch in ten is a resend: exercises the duplicate path.
    for b in (0..batches).step_by(10) {
        bodies.push(bodies[b].clone());
    }
    let r = drive(port, tok.expose(), bodies, conns).await;
    let _ = stop_tx.send(());
    let _ = server.await;
    println!(
        "{name:<10} HTTP ingest: {:>8.0} events/s  p50 {:>6.1} ms  p99 {:>6.1} ms  max {:>6.1} ms  | direct store baseline {:>8.0} events/s (HTTP+parse+detect at {:.0}% of it)",
        r.events_per_s,
        r.p50.as_secs_f64() * 1e3,
        r.p99.as_secs_f64() * 1e3,
        r.max.as_secs_f64() * 1e3,
        direct,
        100.0 * r.events_per_s / direct
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
        "review ingest: {batches} batches of {BATCH} egress events (+10% resent), {conns} client connections, same machine"
    );
    let dir = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let s = SqliteStore::open(dir.path()).unwrap();
        let s = AnyStore::Sqlite(s);
        bench_store("embedded", s.clone(), s, batches, conns).await;
    });
    let name = format!("airlock_bench_{}", std::process::id());
    let role = format!("airlock_bench_rt_{}", std::process::id());
    if !psql(&format!("CREATE DATABASE {name}")) {
        println!("postgres   skipped: PostgreSQL at 127.0.0.1:5432 unreachable");
        return;
    }
    psql(&format!("CREATE ROLE {role} LOGIN"));
    let owner = format!("postgres://postgres@127.0.0.1:5432/{name}");
    let runtime = format!("postgres://{role}@127.0.0.1:5432/{name}");
    rt.block_on(async {
        let opts =
            postgres::MigrateOptions { runtime_role: Some(role.clone()), ..Default::default() };
        postgres::migrate(&owner, &opts).await.unwrap();
        let admin = AnyStore::Pg(PgStore::connect(&owner, 1).await.unwrap());
        let s = PgStore::connect(&runtime, conns).await.unwrap();
        bench_store("postgres", admin, AnyStore::Pg(s), batches, conns).await;
    });
    drop(rt);
    psql(&format!("DROP DATABASE {name} WITH (FORCE)"));
    psql(&format!("DROP ROLE {role}"));
}
