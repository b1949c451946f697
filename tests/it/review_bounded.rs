//! Bounded reads on both stores through the real `airlockd review`: an events page never
//! passes the 8 MiB body cap (it ends early with `next_cursor`, and following the cursors
//! returns every event), read slots per user and overall answer 429 with `Retry-After`, and
//! events can be filtered and ordered by their own `ts` with a cursor that stays correct.
//! The `#[ignore]`d harness at the end measures the server's peak RSS over adversarial
//! 1 MB items (docs/benchmarks/review.md).

use crate::review_support::*;
use crate::support::World;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// `docs/api.md`: the body cap of every response but the export.
const PAGE_CAP: usize = 8 * 1024 * 1024;

/// An `external` item whose payload is about 1 MB of `[0,0,…]` (the adversarial shape: the
/// most JSON values per byte).
fn zeros_item(id: &str) -> String {
    let zeros = vec!["0"; 499_000].join(",");
    format!(
        r#"{{"id":"{id}","source":"external","type":"blob","ts":"2026-03-04T09:12:05Z","payload":[{zeros}]}}"#
    )
}

/// Posts `n` adversarial items (five to a batch: the body limit is 5,000,000 bytes).
fn post_zeros(world: &World, base: &str, tok: &str, prefix: &str, n: usize) {
    let mut k = 0;
    while k < n {
        let batch: Vec<String> =
            (k..n.min(k + 5)).map(|i| zeros_item(&format!("{prefix}{i}"))).collect();
        k += batch.len();
        let body = format!("[{}]", batch.join(","));
        let f = write_file(world.tmp.path(), "zeros.json", body.as_bytes());
        let r = post_events(base, tok, &f, "application/json", &[]);
        assert_eq!(r.status, 200, "{}", r.body);
    }
}

fn page_cap_suite(world: &World, store: &StoreSel) {
    let tok = user_with_token(world, store, "ana@example.test", "member");
    let server = Server::start(world, store, &[]);
    // Ten items of ~1 MB: one page of all of them would be ~10 MB.
    post_zeros(world, &server.base, &tok, "z", 10);
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut path = "/api/v1/events?limit=1000".to_string();
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let r = get(&server.base, &tok, &path, &[]);
        assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(300)]);
        assert!(r.body.len() <= PAGE_CAP, "page of {} bytes exceeds the cap", r.body.len());
        let v = r.json();
        let evs = v["events"].as_array().unwrap();
        assert!(!evs.is_empty(), "a page with more to come holds at least one event");
        for e in evs {
            assert_eq!(e["payload"].as_array().unwrap().len(), 499_000, "payload intact");
            seen.push(e["id"].as_str().unwrap().to_string());
        }
        pages += 1;
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert!(pages >= 2, "10 MB of events cannot fit one capped page");
    let want: Vec<String> = (0..10).map(|i| format!("z{i}")).collect();
    assert_eq!(seen, want, "every event exactly once, in order, across the capped pages");
    // With the typed view the page is cut as well.
    let r = get(&server.base, &tok, "/api/v1/events?limit=1000&view=true", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body.len() <= PAGE_CAP, "view page of {} bytes", r.body.len());
    assert!(r.json()["next_cursor"].is_string());
}

#[test]
fn events_pages_are_capped_at_8_mib_with_next_cursor_embedded() {
    let world = World::new();
    page_cap_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn events_pages_are_capped_at_8_mib_with_next_cursor_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    page_cap_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// Starts an export on a raw connection and reads only its response head, so the export
/// (far larger than the socket buffers) stalls on backpressure holding its read slot.
fn stalled_export(port: u16, tok: &str, query: &str) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET /api/v1/export{query} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tok}\r\n\r\n"
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "connection closed before the head");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s
}

/// Polls `path` until it answers 200 (a released slot is freed when the server notices the
/// closed connection; bounded, not a timing assertion).
fn eventually_ok(base: &str, tok: &str, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = get(base, tok, path, &[]);
        if r.status == 200 {
            return;
        }
        assert_eq!(r.status, 429, "{}", r.body);
        assert!(Instant::now() < deadline, "the read slot was never released");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn read_slots_suite(world: &World, store: &StoreSel) {
    let ana = user_with_token(world, store, "ana@example.test", "member");
    let bob = user_with_token(world, store, "bob@example.test", "reviewer");
    let carl = user_with_token(world, store, "carl@example.test", "member");
    let server = Server::start(
        world,
        store,
        &["--read-concurrency-per-user", "1", "--read-concurrency", "2"],
    );
    // 30 MB of ana's: more than loopback socket buffers hold.
    post_zeros(world, &server.base, &ana, "a", 30);
    let held = stalled_export(server.port, &ana, "");
    // Ana's one slot is taken: her next read of any kind is 429 with Retry-After.
    for path in ["/api/v1/events?limit=1", "/api/v1/flags", "/api/v1/export"] {
        let r = get(&server.base, &ana, path, &[]);
        assert_eq!(r.status, 429, "{path}: {}", r.body);
        assert!(r.headers.to_ascii_lowercase().contains("retry-after: 1"), "{}", r.headers);
        assert!(r.json()["error"].as_str().unwrap().contains("this user"), "{}", r.body);
    }
    // Others still read.
    assert_eq!(get(&server.base, &carl, "/api/v1/events?limit=1", &[]).status, 200);
    // Bob (a reviewer) exporting ana's history takes the second (last) server slot: now carl
    // is refused too, by the overall cap.
    let held_b = stalled_export(server.port, &bob, "?user=ana%40example.test");
    let r = get(&server.base, &carl, "/api/v1/events?limit=1", &[]);
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.headers.to_ascii_lowercase().contains("retry-after"), "{}", r.headers);
    // Closing the stalled exports releases their slots.
    drop(held);
    drop(held_b);
    eventually_ok(&server.base, &ana, "/api/v1/events?limit=1");
    eventually_ok(&server.base, &carl, "/api/v1/events?limit=1");
}

#[test]
fn read_slots_answer_429_per_user_and_overall_embedded() {
    let world = World::new();
    read_slots_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn read_slots_answer_429_per_user_and_overall_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    read_slots_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

fn event_time_suite(world: &World, store: &StoreSel) {
    let tok = user_with_token(world, store, "ana@example.test", "member");
    let server = Server::start(world, store, &[]);
    // Sent in an order unlike their own time, with ties on `ts`.
    let ts = ["09:00:05", "09:00:01", "09:00:03", "09:00:01", "09:00:09", "09:00:03", "09:00:07"];
    let items: Vec<serde_json::Value> = ts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": format!("t{i}"), "source": "external", "type": "x",
                   "ts": format!("2026-03-04T{t}Z"), "payload": {"i": i}})
        })
        .collect();
    let f = write_file(world.tmp.path(), "b.json", json!(items).to_string().as_bytes());
    assert_eq!(post_events(&server.base, &tok, &f, "application/json", &[]).status, 200);
    // order=ts, two to a page: every event once, by (ts, arrival).
    let by_ts: Vec<String> = all_pages(&server.base, &tok, "&order=ts&limit=2")
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(by_ts, ["t1", "t3", "t2", "t5", "t0", "t6", "t4"]);
    // ts_since inclusive, ts_until exclusive, in both orders.
    let window = "&ts_since=2026-03-04T09:00:03Z&ts_until=2026-03-04T09:00:07Z";
    let ids = |q: &str| -> Vec<String> {
        all_pages(&server.base, &tok, q)
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&format!("{window}&order=ts&limit=1")), ["t2", "t5", "t0"]);
    assert_eq!(ids(&format!("{window}&order=received_at&limit=1")), ["t0", "t2", "t5"]);
    assert_eq!(ids(window), ["t0", "t2", "t5"], "received_at order is the default");
    // Bad values are 400s naming the parameter.
    for (q, name) in [
        ("ts_since=yesterday", "`ts_since`"),
        ("ts_until=2026-13-01T00:00:00Z", "`ts_until`"),
        ("order=time", "`order`"),
        ("order=ts&cursor=5", "`cursor`"),
        ("cursor=t5_3", "`cursor`"),
    ] {
        let r = get(&server.base, &tok, &format!("/api/v1/events?{q}"), &[]);
        assert_eq!(r.status, 400, "{q}: {}", r.body);
        assert!(r.json()["error"].as_str().unwrap().contains(name), "{q}: {}", r.body);
    }
}

/// Every event of a listing with extra query `q`, following cursors.
fn all_pages(base: &str, tok: &str, q: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let mut path = format!("/api/v1/events?{}", q.trim_start_matches('&'));
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let r = get(base, tok, &path, &[]);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        let v = r.json();
        out.extend(v["events"].as_array().unwrap().iter().cloned());
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return out,
        }
    }
    panic!("cursor never ended");
}

#[test]
fn events_can_be_queried_by_event_time_embedded() {
    let world = World::new();
    event_time_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn events_can_be_queried_by_event_time_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    event_time_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// Peak resident memory (VmHWM, KiB) of a process.
fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn rss_harness(world: &World, store: &StoreSel, label: &str) {
    let n: usize =
        std::env::var("AIRLOCK_RSS_ITEMS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let tok = user_with_token(world, store, "ana@example.test", "member");
    let server = Server::start(world, store, &[]);
    post_zeros(world, &server.base, &tok, "z", n);
    // Restart so the peak reflects the reads only, not the ingest.
    drop(server);
    let server = Server::start(world, store, &[]);
    let pid = server.child.id();
    let base_kib = vm_hwm_kib(pid);
    for q in ["limit=1000", "limit=1000&view=true"] {
        let r = get(&server.base, &tok, &format!("/api/v1/events?{q}"), &[]);
        assert_eq!(r.status, 200);
        let kib = vm_hwm_kib(pid);
        eprintln!(
            "RSS {label}: {n} items of ~1 MB, GET ?{q}: body {} bytes, VmHWM {:.1} MiB (idle {:.1} MiB)",
            r.body.len(),
            kib as f64 / 1024.0,
            base_kib as f64 / 1024.0
        );
        assert!(kib < 256 * 1024, "{label} {q}: VmHWM {kib} KiB");
    }
}

/// Benchmark harness (docs/benchmarks/review.md): `cargo test --release --features test-hooks
/// --test it review_bounded::rss -- --ignored --nocapture --test-threads 1`.
#[test]
#[ignore = "benchmark: writes ~200 MB per store; run by hand"]
fn rss_of_an_events_page_over_adversarial_items() {
    let world = World::new();
    rss_harness(&world, &StoreSel::Embedded(world.tmp.path().join("d")), "embedded");
    if let Some(db) = PgDb::create() {
        db.migrate(&world);
        rss_harness(&world, &StoreSel::Pg(db.runtime_url.clone()), "postgres");
    }
}

#[cfg(feature = "test-hooks")]
fn settle_cap_suite(world: &World, store: &StoreSel) {
    let tok = user_with_token(world, store, "ana@example.test", "member");
    // A settle map of two sessions (test hook), and a long settle delay so none is swept.
    let server = Server::start_with_env(
        world,
        store,
        &["--settle-secs", "3600"],
        "http",
        &[("AIRLOCK_TEST_REVIEW_SETTLE_CAP", "2")],
    );
    let ev = |id: &str, session: &str| {
        json!({"id": id, "source": "external", "type": "x", "ts": "2026-03-04T09:00:00Z",
               "session": session, "payload": {}})
    };
    for (i, batch) in [
        vec![ev("e1", "s1"), ev("e2", "s2")],
        vec![ev("e3", "s1")],
        vec![ev("e4", "s3"), ev("e5", "s3")],
    ]
    .into_iter()
    .enumerate()
    {
        let f = write_file(
            world.tmp.path(),
            &format!("b{i}.json"),
            json!(batch).to_string().as_bytes(),
        );
        let r = post_events(&server.base, &tok, &f, "application/json", &[]);
        assert_eq!(r.status, 200, "{}", r.body);
    }
    // s1 and s2 are tracked; s3 found the map full and is flagged, once, in its batch.
    let r = get(&server.base, &tok, "/api/v1/flags?rule=detect.incomplete", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let flags = r.json()["flags"].as_array().unwrap().clone();
    assert_eq!(flags.len(), 1, "{flags:?}");
    assert_eq!(flags[0]["session"], "s3");
    assert!(flags[0]["detail"].as_str().unwrap().contains("more than 2 sessions"), "{flags:?}");
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_full_settle_map_raises_detect_incomplete_embedded() {
    let world = World::new();
    settle_cap_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_full_settle_map_raises_detect_incomplete_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    settle_cap_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}
