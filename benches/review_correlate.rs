//! The correlate pack's cost at ingest (issue 20: at most +20%): the same sessions ingested
//! over HTTP into two embedded review servers, one with the built-in correlate pack and one
//! with every `[[correlate]]` check `enabled = false` (no correlation at all), in the same run,
//! fed alternately (on/off, then off/on, …) so both stores grow alike and machine noise hits
//! both; on the embedded store and on PostgreSQL (127.0.0.1:5432, two throwaway databases;
//! skipped when unreachable). Loopback only; the load generator runs in the same process.
//!
//! A session is what `airlock publish` sends for one agent run, in its order: batches of
//! transcript lines (a prompt, then tool calls — curl, python, cargo, file reads — with their
//! results, assistant text between them; linked to the Airlock session), then a batch of its
//! egress lines (allowed and denied, ~650 bytes each) with the start and end records. The end
//! record is what runs the session checks and, when on, the correlate pack in the batch's
//! transaction, so each session's second batch carries the whole cost.
//!
//! `cargo bench --bench review_correlate` (env: BENCH_SESSIONS, default 40 per round;
//! BENCH_EGRESS, egress lines per session, 1000; BENCH_CALLS, tool calls per session, 100;
//! BENCH_ROUNDS, on/off pairs, 4; BENCH_CONNS, 4).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock::review::correlate::Config;
use airlock::review::detect::Engine;
use airlock::review::limits::{LimitsConfig, Rate};
use airlock::review::server::{AppState, serve};
use airlock::review::store::postgres::{self, PgStore};
use airlock::review::store::sqlite::SqliteStore;
use airlock::review::store::{AnyStore, Store};
use airlock::review::{Role, token};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `2026-03-04T09:00:00.000Z` plus `ms`.
fn ts(ms: u64) -> String {
    let s = ms / 1000;
    format!("2026-03-04T{:02}:{:02}:{:02}.{:03}Z", 9 + s / 3600, (s / 60) % 60, s % 60, ms % 1000)
}

/// One session's batches (transcripts; then egress and records, the end record last), at
/// most 1,000 items each (the server's cap).
fn session(run: &str, n: usize, calls: usize, egress: usize) -> Vec<Bytes> {
    let sid = format!("{run}-s{n}");
    let agent = format!("{run}-agent{n}");
    let mut lines = Vec::new();
    let mut t = 0u64;
    let mut line = |uuid: String, at: u64, kind: &str, content: serde_json::Value| {
        let payload = json!({"type": kind, "uuid": uuid, "parentUuid": null, "sessionId": agent,
            "timestamp": ts(at), "cwd": "/work/repo", "version": "2.1.40", "isSidechain": false,
            "message": {"role": kind, "content": content}});
        lines.push(json!({"id": uuid, "source": "claude", "type": kind, "ts": ts(at),
            "session": agent, "airlock_session": sid, "file": ".claude/projects/-work-repo/a.jsonl",
            "offset": lines.len() * 600, "payload": payload}));
    };
    line(format!("{sid}-p"), t, "user", json!("fix the failing test and refresh the dataset"));
    let commands = [
        "curl -sS https://data.example.test/set.json -o set.json",
        "python3 scripts/fetch.py --mirror https://mirror.example.test/set.json",
        "cargo test --package payments retry",
        "git diff --stat",
    ];
    for c in 0..calls {
        t += 2000;
        let id = format!("toolu_{sid}_{c}");
        let input = if c % 5 == 4 {
            json!({"file_path": "/work/repo/src/retry.rs"})
        } else {
            json!({"command": commands[c % commands.len()], "description": "step"})
        };
        let name = if c % 5 == 4 { "Read" } else { "Bash" };
        line(
            format!("{sid}-c{c}"),
            t,
            "assistant",
            json!([{"type": "text", "text": "Next I will run the step and look at its output."},
                   {"type": "tool_use", "id": id, "name": name, "input": input}]),
        );
        line(
            format!("{sid}-r{c}"),
            t + 1500,
            "user",
            json!([{"type": "tool_result", "tool_use_id": id,
                    "content": "test result: ok. 3 passed; 0 failed; finished in 0.42s\n".repeat(4)}]),
        );
    }
    t += 2000;
    line(
        format!("{sid}-fin"),
        t,
        "assistant",
        json!([{"type": "text", "text": "Done: the test passes and the dataset is refreshed."}]),
    );
    let end_ms = t + 1000;
    let mut second = vec![
        json!({"id": format!("{sid}:start"), "source": "session", "type": "start",
        "ts": ts(0), "session": sid, "payload": {"id": format!("{sid}:start"), "kind": "start", "ts": ts(0), "session": sid}}),
    ];
    let span = end_ms.max(1);
    for i in 0..egress {
        let at = (i as u64 * span) / egress as u64;
        let (host, allowed) = match i % 10 {
            0 => ("data.example.test", false),
            1 => ("mirror.example.test", true),
            2 | 3 => ("index.crates.io", true),
            _ => ("api.anthropic.com", true),
        };
        let id = format!("{sid}-e{i}");
        second.push(json!({"id": id, "source": "egress", "type": if allowed { "connect" } else { "denied" },
            "ts": ts(at), "session": sid, "seq": i + 1,
            "payload": {"id": id, "ts": ts(at), "user_id": "41f0c2", "repo": "payments", "host": host,
                "method": "CONNECT", "allowed": allowed, "reason": if allowed { "allowed" } else { "not_allowed" },
                "port": 443, "boot": "boot-1", "session": sid, "seq": i + 1, "bytes_sent": 18204,
                "bytes_recv": 91544, "duration_ms": 2311, "addr": "127.0.0.1:443",
                "repo_path": "/home/ana/src/payments", "repo_key": "payments-1a2b3c4d",
                "layer": "repo", "policy": "/home/ana/src/payments/.airlock.toml", "rule": "example.test"}}));
    }
    second.push(json!({"id": format!("{sid}:end"), "source": "session", "type": "end", "ts": ts(end_ms),
        "session": sid, "payload": {"id": format!("{sid}:end"), "kind": "end", "ts": ts(end_ms),
            "session": sid, "boot": "boot-1", "repo": "payments", "exit_status": 0, "transcripts": []}}));
    let nd = |v: &[serde_json::Value]| -> Bytes {
        Bytes::from(v.iter().map(|x| format!("{x}\n")).collect::<String>())
    };
    lines.chunks(1000).chain(second.chunks(1000)).map(nd).collect()
}

/// A server over `store` with the pack on or off; returns its port and stop handle.
async fn server(
    admin: &AnyStore,
    store: AnyStore,
    secret_user: &str,
    on: bool,
    conns: usize,
) -> (u16, String, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let u = admin.add_user(&format!("{secret_user}@example.test"), Role::Member).await.unwrap();
    let tok = token::Token::generate().unwrap();
    admin.create_token(secret_user, &u.id, tok.hash()).await.unwrap();
    let engine = Engine::builtin().unwrap();
    let engine = if on { engine } else { engine.with_correlate(Config::off()) };
    let limits = LimitsConfig {
        ingest_concurrency: conns + 1,
        ingest_concurrency_per_user: conns + 1,
        token_rate: Rate { per_sec: 1e9, burst: u32::MAX },
        ..LimitsConfig::default()
    };
    let state = Arc::new(AppState::with_limits(store, engine, limits));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let _ = serve(listener, None, state, async move {
            let _ = stop_rx.await;
        })
        .await;
    });
    (port, tok.expose().to_string(), stop_tx, task)
}

/// Posts each session's two batches in order, `conns` sessions at a time; returns the time.
async fn drive(port: u16, secret: &str, sessions: Vec<Vec<Bytes>>, conns: usize) -> Duration {
    let sessions = Arc::new(sessions);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (sessions, next) = (Arc::clone(&sessions), Arc::clone(&next));
        let auth = format!("Bearer {secret}");
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let (mut send, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(s) = sessions.get(i) else { break };
                for body in s {
                    let req = http::Request::post("/api/v1/events")
                        .header("host", "127.0.0.1")
                        .header("authorization", &auth)
                        .header("content-type", "application/x-ndjson")
                        .body(Full::new(body.clone()))
                        .unwrap();
                    let resp = send.send_request(req).await.unwrap();
                    let status = resp.status();
                    let body = resp.into_body().collect().await.unwrap().to_bytes();
                    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    start.elapsed()
}

struct Shape {
    per_round: usize,
    egress: usize,
    calls: usize,
    rounds: usize,
    conns: usize,
}

/// The on/off comparison on one kind of store: `stores` is `[on, off]`, each `(admin,
/// runtime)`.
async fn on_off(name: &str, stores: [(AnyStore, AnyStore); 2], sh: &Shape) {
    let [(on_admin, on_store), (off_admin, off_store)] = stores;
    let (on_port, on_secret, on_stop, on_task) =
        server(&on_admin, on_store, "bench-on", true, sh.conns).await;
    let (off_port, off_secret, off_stop, off_task) =
        server(&off_admin, off_store, "bench-off", false, sh.conns).await;
    let (mut on_total, mut off_total) = (Duration::ZERO, Duration::ZERO);
    let mut pairs = Vec::new();
    for r in 0..sh.rounds {
        let make = |tag: &str| -> Vec<Vec<Bytes>> {
            (0..sh.per_round)
                .map(|n| session(&format!("{tag}{r}"), n, sh.calls, sh.egress))
                .collect()
        };
        let (on_s, off_s) = (make("on"), make("off"));
        let order = if r % 2 == 0 { [true, false] } else { [false, true] };
        let (mut on_t, mut off_t) = (Duration::ZERO, Duration::ZERO);
        for on in order {
            if on {
                on_t = drive(on_port, &on_secret, on_s.clone(), sh.conns).await;
            } else {
                off_t = drive(off_port, &off_secret, off_s.clone(), sh.conns).await;
            }
        }
        pairs.push(on_t.as_secs_f64() / off_t.as_secs_f64());
        on_total += on_t;
        off_total += off_t;
    }
    let events = (sh.rounds * sh.per_round * (2 * sh.calls + 2 + sh.egress + 2)) as f64;
    let per_pair: Vec<String> = pairs.iter().map(|p| format!("{p:.3}")).collect();
    pairs.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{name:<10} correlate on : {:>8.0} events/s ({:.2} s)\n{name:<10} correlate off: {:>8.0} events/s ({:.2} s)\n{name:<10} on/off ingest time: {:.3} overall; per pair {} (median {:.3}; target <= 1.20)",
        events / on_total.as_secs_f64(),
        on_total.as_secs_f64(),
        events / off_total.as_secs_f64(),
        off_total.as_secs_f64(),
        on_total.as_secs_f64() / off_total.as_secs_f64(),
        per_pair.join(" / "),
        pairs[pairs.len() / 2],
    );
    let _ = on_stop.send(());
    let _ = off_stop.send(());
    let _ = on_task.await;
    let _ = off_task.await;
}

fn psql(sql: &str) -> bool {
    std::process::Command::new("psql")
        .args(["postgres://postgres@127.0.0.1:5432/postgres", "-qAt", "-c", sql])
        .stdout(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing useful: run small.
    let quick = !std::env::args().any(|a| a == "--bench");
    let sh = Shape {
        per_round: env("BENCH_SESSIONS", if quick { 2 } else { 40 }),
        egress: env("BENCH_EGRESS", if quick { 50 } else { 1000 }),
        calls: env("BENCH_CALLS", if quick { 5 } else { 100 }),
        rounds: env("BENCH_ROUNDS", if quick { 1 } else { 4 }),
        conns: env("BENCH_CONNS", 4),
    };
    println!(
        "review correlate: {} on/off round pairs of {} sessions each ({} tool calls = {} transcript lines, {} egress lines, start and end records per session), {} client connections, same machine",
        sh.rounds,
        sh.per_round,
        sh.calls,
        2 * sh.calls + 2,
        sh.egress,
        sh.conns
    );
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let (on_dir, off_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    rt.block_on(async {
        let on = AnyStore::Sqlite(SqliteStore::open(on_dir.path()).unwrap());
        let off = AnyStore::Sqlite(SqliteStore::open(off_dir.path()).unwrap());
        on_off("embedded", [(on.clone(), on), (off.clone(), off)], &sh).await;
    });
    let tag = format!("airlock_bench_corr_{}", std::process::id());
    let (on_db, off_db, role) = (format!("{tag}_on"), format!("{tag}_off"), format!("{tag}_rt"));
    if !psql(&format!("CREATE DATABASE {on_db}")) || !psql(&format!("CREATE DATABASE {off_db}")) {
        println!("postgres   skipped: PostgreSQL at 127.0.0.1:5432 unreachable");
        return;
    }
    psql(&format!("CREATE ROLE {role} LOGIN"));
    let opts = postgres::MigrateOptions { runtime_role: Some(role.clone()), ..Default::default() };
    rt.block_on(async {
        let mut pair = Vec::new();
        for db in [&on_db, &off_db] {
            let owner = format!("postgres://postgres@127.0.0.1:5432/{db}");
            postgres::migrate(&owner, &opts).await.unwrap();
            let admin = AnyStore::Pg(PgStore::connect(&owner, 1).await.unwrap());
            let runtime = format!("postgres://{role}@127.0.0.1:5432/{db}");
            pair.push((admin, AnyStore::Pg(PgStore::connect(&runtime, sh.conns).await.unwrap())));
        }
        let off = pair.pop().unwrap();
        let on = pair.pop().unwrap();
        on_off("postgres", [on, off], &sh).await;
    });
    drop(rt);
    for db in [&on_db, &off_db] {
        psql(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"));
    }
    psql(&format!("DROP ROLE {role}"));
}
