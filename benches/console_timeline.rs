//! The console's timeline over a large store (issue 17): a store holding 1,000,000 events
//! (100 people; the person viewed has 100,000 over 30 days, ~3,300 in the last 24 hours:
//! egress allowed and denied, Claude transcript lines, session records), then a reviewer's
//! `GET /people/{user_id}?from=…&until=…` for that person's last 24 hours, timed over
//! loopback against the in-process server, beside the bare API query for the same rows
//! (`GET /api/v1/events?user=…&ts_since=…&ts_until=…&order=ts&limit=200`) and `/healthz`
//! (the HTTP floor), interleaved in one run. Also the same page with `decision=denied` (a
//! filter read from payloads) and `/people`. Embedded SQLite and PostgreSQL (127.0.0.1:5432,
//! a throwaway database). Prints p50/p95 and the page sizes.
//!
//! `cargo bench --bench console_timeline` (env: BENCH_EVENTS, default 1,000,000; BENCH_REQS,
//! requests per kind, default 60).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock::review::console::auth;
use airlock::review::detect::Engine;
use airlock::review::server::{AppState, serve};
use airlock::review::store::postgres::{self, PgStore};
use airlock::review::store::sqlite::SqliteStore;
use airlock::review::store::{AnyStore, Store};
use airlock::review::{Micros, NewEvent, Role, Source, now_micros, token};
use http_body_util::{BodyExt, Empty};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HOUR: Micros = 3_600_000_000;
const DAY: Micros = 24 * HOUR;
const PEOPLE: usize = 100;

fn event(person: usize, i: usize, ts: Micros) -> NewEvent {
    let session = format!("s-{person}-{}", i / 500);
    let (source, kind, payload, airlock_session) = match i % 10 {
        0..=4 => {
            let allowed = i % 50 != 3;
            let host = if allowed { "registry.npmjs.org" } else { "pastebin.com" };
            let payload = format!(
                r#"{{"ts":"x","repo":"payments","host":"{host}","method":"CONNECT","allowed":{allowed},"id":"e-{person}-{i}","session":"{session}","boot":"b1","seq":{i},"port":443,"bytes_sent":18204,"bytes_recv":91544,"duration_ms":2311,"reason":"{}"}}"#,
                if allowed { "allowed" } else { "not_allowed" }
            );
            (Source::Egress, if allowed { "connect" } else { "denied" }, payload, None)
        }
        5..=8 => {
            let payload = format!(
                r#"{{"type":"assistant","uuid":"u-{person}-{i}","sessionId":"c-{person}","message":{{"role":"assistant","content":[{{"type":"text","text":"Running the tests again to check the flaky case number {i}."}},{{"type":"tool_use","id":"t{i}","name":"Bash","input":{{"command":"cargo test --lib review:: -- --nocapture"}}}}]}}}}"#
            );
            (Source::Claude, "assistant", payload, Some(session.clone()))
        }
        _ => {
            let kind = if (i / 10).is_multiple_of(2) { "start" } else { "end" };
            let payload = format!(
                r#"{{"command":["claude","--resume"],"repo":"payments","agent":"claude","exit_status":0,"session":"{session}"}}"#
            );
            (Source::Session, kind, payload, None)
        }
    };
    NewEvent {
        source,
        id: format!("e-{person}-{i}"),
        kind: kind.into(),
        ts,
        session: Some(session),
        seq: Some(i as i64),
        boot: Some("b1".into()),
        payload,
        airlock_session,
        file: None,
        offset: None,
    }
}

/// Loads `total` events: the viewed person has a tenth, the rest spread over 99 others,
/// every person's events evenly over the 30 days before `now`.
async fn load(store: &AnyStore, viewed: &str, others: &[String], total: usize, now: Micros) {
    let started = Instant::now();
    let mine = total / 10;
    let per_other = (total - mine) / others.len().max(1);
    let mut plan: Vec<(&str, usize, usize)> = vec![(viewed, 0, mine)];
    plan.extend(others.iter().enumerate().map(|(k, u)| (u.as_str(), k + 1, per_other)));
    for (user, person, n) in plan {
        let step = (30 * DAY) / n.max(1) as i64;
        let mut i = 0;
        while i < n {
            let batch: Vec<NewEvent> = (i..(i + 5_000).min(n))
                .map(|j| event(person, j, now - 30 * DAY + j as i64 * step))
                .collect();
            store.insert_events(user, now - 60_000_000, &batch).await.unwrap();
            i += batch.len();
        }
    }
    println!("  loaded {total} events in {:.1} s", started.elapsed().as_secs_f64());
}

struct Client {
    port: u16,
    send: hyper::client::conn::http1::SendRequest<Empty<bytes::Bytes>>,
}

impl Client {
    async fn connect(port: u16) -> Self {
        Self { port, send: Self::open(port).await }
    }

    async fn open(port: u16) -> hyper::client::conn::http1::SendRequest<Empty<bytes::Bytes>> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        send
    }

    /// One GET; its time and body size.
    async fn get(&mut self, path: &str, header: (&str, &str)) -> (Duration, usize) {
        let req = http::Request::get(path)
            .header("host", "127.0.0.1")
            .header(header.0, header.1)
            .body(Empty::new())
            .unwrap();
        // A connection the server closed is replaced (not timed).
        if self.send.ready().await.is_err() {
            self.send = Self::open(self.port).await;
            self.send.ready().await.unwrap();
        }
        let t = Instant::now();
        let resp = self.send.send_request(req).await.unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let took = t.elapsed();
        assert_eq!(
            status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&body[..body.len().min(500)])
        );
        (took, body.len())
    }
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 * p).ceil() as usize).saturating_sub(1).min(v.len() - 1);
    v[i].as_secs_f64() * 1000.0
}

async fn bench_store(
    name: &str,
    admin: AnyStore,
    runtime: AnyStore,
    total: usize,
    reqs: usize,
    analyze: Option<&str>,
) {
    println!("{name}:");
    let now = now_micros();
    let viewed = admin.add_user("ana@example.test", Role::Member).await.unwrap();
    let reviewer = admin.add_user("rev@example.test", Role::Reviewer).await.unwrap();
    let mut others = Vec::new();
    for k in 1..PEOPLE {
        others.push(admin.add_user(&format!("p{k}@example.test"), Role::Member).await.unwrap().id);
    }
    load(&admin, &viewed.id, &others, total, now).await;
    if let Some(url) = analyze {
        // A freshly loaded table has no planner statistics yet (autovacuum would add them).
        psql_at(url, "ANALYZE");
    }
    let tok = token::Token::generate().unwrap();
    admin.create_token("bench-rev", &reviewer.id, tok.hash()).await.unwrap();
    let secret = auth::new_secret().unwrap();
    runtime.create_console_session(auth::secret_hash(&secret), &reviewer.id, now).await.unwrap();
    let cookie = format!("{}={}", auth::SESSION_COOKIE, &*secret);
    let bearer = format!("Bearer {}", tok.expose());

    let state = Arc::new(AppState::new(runtime, Engine::builtin().unwrap()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, None, state, async move {
        let _ = stop_rx.await;
    }));
    let mut c = Client::connect(port).await;
    let from = airlock::review::format_micros(now - DAY);
    let until = airlock::review::format_micros(now);
    let enc = |s: &str| s.replace(':', "%3A");
    let page = format!("/people/{}?from={}&until={}", viewed.id, enc(&from), enc(&until));
    let denied = format!("{page}&decision=denied");
    let api = format!(
        "/api/v1/events?user={}&ts_since={}&ts_until={}&order=ts&limit=200",
        viewed.id,
        enc(&from),
        enc(&until)
    );
    let kinds: [(&str, &str, (&str, &str)); 5] = [
        ("healthz (HTTP floor)", "/healthz", ("accept", "*/*")),
        ("API events, 24 h, 200 rows", &api, ("authorization", &bearer)),
        ("timeline page, 24 h", &page, ("cookie", &cookie)),
        ("timeline page, 24 h, decision=denied", &denied, ("cookie", &cookie)),
        ("/people (100 people)", "/people", ("cookie", &cookie)),
    ];
    // Warm-up: one of each.
    for (_, path, h) in &kinds {
        c.get(path, *h).await;
    }
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); kinds.len()];
    let mut sizes = vec![0usize; kinds.len()];
    for _ in 0..reqs {
        for (k, (_, path, h)) in kinds.iter().enumerate() {
            let (t, n) = c.get(path, *h).await;
            times[k].push(t);
            sizes[k] = n;
        }
    }
    for (k, (label, _, _)) in kinds.iter().enumerate() {
        let (p50, p95) = (pct(&mut times[k], 0.5), pct(&mut times[k], 0.95));
        println!("  {label:<40} p50 {p50:8.2} ms  p95 {p95:8.2} ms  {:>7} bytes", sizes[k]);
    }
    let _ = stop_tx.send(());
    let _ = server.await;
}

fn psql(sql: &str) -> bool {
    psql_at("postgres://postgres@127.0.0.1:5432/postgres", sql)
}

fn psql_at(url: &str, sql: &str) -> bool {
    std::process::Command::new("psql")
        .args([url, "-qAt", "-c", sql])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing useful: run small.
    let quick = !std::env::args().any(|a| a == "--bench");
    let env = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let total = env("BENCH_EVENTS", if quick { 20_000 } else { 1_000_000 });
    let reqs = env("BENCH_REQS", if quick { 3 } else { 60 });
    println!(
        "console timeline: {total} events, {reqs} requests per kind, interleaved, one connection"
    );
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let s = AnyStore::Sqlite(SqliteStore::open(dir.path()).unwrap());
        bench_store("embedded", s.clone(), s, total, reqs, None).await;
    });
    let name = format!("airlock_bench_console_{}", std::process::id());
    let role = format!("airlock_bench_console_rt_{}", std::process::id());
    if !psql(&format!("CREATE DATABASE {name}")) {
        println!("postgres: skipped, PostgreSQL at 127.0.0.1:5432 unreachable");
        return;
    }
    psql(&format!("CREATE ROLE {role} LOGIN"));
    let owner = format!("postgres://postgres@127.0.0.1:5432/{name}");
    let runtime = format!("postgres://{role}@127.0.0.1:5432/{name}");
    rt.block_on(async {
        let opts =
            postgres::MigrateOptions { runtime_role: Some(role.clone()), ..Default::default() };
        postgres::migrate(&owner, &opts).await.unwrap();
        let admin = AnyStore::Pg(PgStore::connect(&owner, 2).await.unwrap());
        let rt_store = AnyStore::Pg(PgStore::connect(&runtime, 4).await.unwrap());
        bench_store("postgres", admin, rt_store, total, reqs, Some(&owner)).await;
    });
    drop(rt);
    psql(&format!("DROP DATABASE {name} WITH (FORCE)"));
    psql(&format!("DROP ROLE {role}"));
}
