//! Fairness and limits of the review plane (issue 13, point 5), through the real
//! `airlockd review` on loopback: one member's slow uploads leave ingest slots for everyone
//! else, a slow body is answered 408 and frees its slot, the per-user share is advertised in
//! `X-Airlock-Ingest-Concurrency`, idle connections past `--max-connections` wait in the accept
//! queue (the server's descriptors stay bounded) and are closed by the header timeout, an
//! `EMFILE` burst is backed off, logged once and survived, and tokens and failed
//! authentications are rate limited with 429 + an integer `Retry-After`.

use crate::review_support::*;
use crate::support::World;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A batch of about 80 KB: at 2 KB/s it takes some 40 s to upload.
fn slow_body(world: &World, name: &str) -> PathBuf {
    let items: Vec<Value> =
        (0..200).map(|i| egress(&format!("{name}-{i}"), "example.test", true)).collect();
    write_file(world.tmp.path(), &format!("{name}.ndjson"), &ndjson(&items))
}

/// One small batch (a fresh id each time, so it is always `created`).
fn probe(world: &World, id: &str) -> PathBuf {
    write_file(
        world.tmp.path(),
        &format!("{id}.ndjson"),
        &ndjson(&[egress(id, "example.test", true)]),
    )
}

/// Starts an upload of `body` at 2 KB/s; its stdout is the HTTP status curl saw.
fn spawn_slow(base: &str, token: &str, body: &Path) -> Child {
    Command::new("curl")
        .args(["-s", "--noproxy", "*", "--limit-rate", "2K", "-o", "/dev/null"])
        .args(["-w", "%{http_code}", "-H"])
        .arg(format!("Authorization: Bearer {token}"))
        .args(["-H", "Content-Type: application/x-ndjson", "--data-binary"])
        .arg(format!("@{}", body.display()))
        .arg(format!("{base}/api/v1/events"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

fn header<'a>(r: &'a Http, name: &str) -> Option<&'a str> {
    r.headers.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// `Retry-After` as RFC 9110 §10.2.3 has it here: delay-seconds, a non-negative integer.
fn retry_after(r: &Http) -> u64 {
    let v = header(r, "retry-after").unwrap_or_else(|| panic!("no Retry-After: {}", r.headers));
    v.parse().unwrap_or_else(|_| panic!("Retry-After {v:?} is not an integer"))
}

fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Posts `ana`'s probes until one is refused with 429 while `uploads` (restarted whenever one
/// ends, e.g. because it lost its slot to a probe) are in flight; returns that 429.
fn until_refused(
    world: &World,
    server: &Server,
    token: &str,
    uploads: &mut [Child],
    restart: &dyn Fn() -> Child,
) -> Http {
    for i in 0..300 {
        for c in uploads.iter_mut() {
            if c.try_wait().unwrap().is_some() {
                *c = restart();
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        let f = probe(world, &format!("probe-{i}"));
        let r = post_events(&server.base, token, &f, "application/x-ndjson", &[]);
        if r.status == 429 {
            return r;
        }
        assert_eq!(r.status, 200, "{}", r.body);
    }
    panic!("the member's own probe was never refused while their uploads were in flight");
}

fn slow_uploads_do_not_starve_others(world: &World, store: StoreSel) {
    let ana = user_with_token(world, &store, "ana@example.test", "member");
    let bo = user_with_token(world, &store, "bo@example.test", "member");
    // Defaults: 8 ingest slots, 2 per user.
    let server = Server::start(world, &store, &[]);
    let body = slow_body(world, "ana-slow");
    let restart = || spawn_slow(&server.base, &ana, &body);
    let mut uploads: Vec<Child> = (0..8).map(|_| restart()).collect();
    let refused = until_refused(world, &server, &ana, &mut uploads, &restart);
    assert!(retry_after(&refused) >= 1);
    // Ana's eight slow uploads hold all she may hold; another member is still served.
    let r = post_events(&server.base, &bo, &probe(world, "bo-1"), "application/x-ndjson", &[]);
    let held = metric(&server, "airlock_review_slots_in_use{kind=\"ingest\"}");
    eprintln!(
        "measured: 8 slow uploads by one member hold {held:?} ingest slots; another member's ingest: {}",
        r.status
    );
    kill_all(&mut uploads);
    assert_eq!(r.status, 200, "another member's ingest while one member uploads slowly: {r:?}");
    assert_eq!(header(&r, "x-airlock-ingest-concurrency"), Some("2"), "{}", r.headers);
}

/// Issue 13 point 5: eight slow-body uploads by one member held every global ingest slot, and
/// everyone else got 429.
#[test]
fn eight_slow_uploads_by_one_member_do_not_make_anothers_ingest_429_embedded() {
    let world = World::new();
    slow_uploads_do_not_starve_others(&world, StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn eight_slow_uploads_by_one_member_do_not_make_anothers_ingest_429_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    slow_uploads_do_not_starve_others(&world, StoreSel::Pg(db.runtime_url.clone()));
}

/// A body slower than `--body-timeout` is answered 408 and its slot is free again at once
/// (the upload itself would have needed some 40 s more).
#[test]
fn a_slow_body_is_answered_408_and_frees_its_slot() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let ana = user_with_token(&world, &store, "ana@example.test", "member");
    // One slot in all, so the slow upload holding it is visible as a 429 for the probe.
    let server =
        Server::start(&world, &store, &["--body-timeout", "2", "--ingest-concurrency", "1"]);
    let body = slow_body(&world, "slow");
    let restart = || spawn_slow(&server.base, &ana, &body);
    let mut uploads = vec![restart()];
    until_refused(&world, &server, &ana, &mut uploads, &restart);
    let upload = uploads.pop().unwrap();
    let out = upload.wait_with_output().unwrap();
    let status = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(status, "408", "the slow upload's answer");
    let r = post_events(&server.base, &ana, &probe(&world, "after"), "application/x-ndjson", &[]);
    assert_eq!(r.status, 200, "the slot is free after the timeout: {r:?}");
}

/// Every ingest answer and `GET /api/v1/me` advertise the per-user share, clamped below the
/// global limit (with a warning) so one member never holds every slot.
#[test]
fn the_per_user_ingest_concurrency_is_advertised_and_clamped() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let ana = user_with_token(&world, &store, "ana@example.test", "member");
    let server = Server::start(&world, &store, &[]);
    let ok = post_events(&server.base, &ana, &probe(&world, "h1"), "application/x-ndjson", &[]);
    assert_eq!(ok.status, 200, "{}", ok.body);
    let bad = write_file(world.tmp.path(), "bad.json", b"[");
    let err = post_events(&server.base, &ana, &bad, "application/json", &[]);
    assert_eq!(err.status, 400, "{}", err.body);
    let me = get(&server.base, &ana, "/api/v1/me", &[]);
    assert_eq!(me.status, 200);
    for r in [&ok, &err, &me] {
        assert_eq!(header(r, "x-airlock-ingest-concurrency"), Some("2"), "{}", r.headers);
    }
    drop(server);

    let server = Server::start(
        &world,
        &store,
        &["--ingest-concurrency", "4", "--ingest-concurrency-per-user", "9"],
    );
    let me = get(&server.base, &ana, "/api/v1/me", &[]);
    assert_eq!(header(&me, "x-airlock-ingest-concurrency"), Some("3"), "{}", me.headers);
    assert!(server.log().contains("--ingest-concurrency-per-user 9 used as 3"), "{}", server.log());
}

/// One series' value from `/metrics` (read from loopback without a token), if served.
fn metric(server: &Server, series: &str) -> Option<f64> {
    let r = curl(&["--max-time", "10", &format!("{}/metrics", server.base)]);
    r.body.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// Idle connections (twice `--max-connections`) do not stop an authenticated client from
/// being served once a slot frees (the header timeout closes idle ones), and the server never
/// holds more descriptors than the cap allows: the rest wait in the kernel's accept queue.
#[test]
fn idle_connections_past_the_cap_wait_in_the_queue_and_fds_stay_bounded() {
    const CAP: usize = 32;
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let ana = user_with_token(&world, &store, "ana@example.test", "member");
    let server = Server::start(
        &world,
        &store,
        &["--max-connections", &CAP.to_string(), "--header-timeout", "2"],
    );
    let pid = server.child.id();
    assert_eq!(get(&server.base, &ana, "/api/v1/me", &[]).status, 200);
    // Let the warm-up connection close so it is not counted in the baseline.
    std::thread::sleep(Duration::from_millis(300));
    let baseline = open_fds(pid);
    let idle: Vec<TcpStream> =
        (0..2 * CAP).map(|_| TcpStream::connect(("127.0.0.1", server.port)).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(700));
    let during = open_fds(pid);
    assert!(
        during <= baseline + CAP + 2,
        "{during} descriptors with {} idle connections (baseline {baseline}, cap {CAP})",
        idle.len()
    );
    let started = std::time::Instant::now();
    let r = get(&server.base, &ana, "/api/v1/me", &["--max-time", "60"]);
    eprintln!(
        "measured: {} idle connections, cap {CAP}: server descriptors {baseline} -> {during}; \
         an authenticated client was served ({}) after {:.1} s",
        idle.len(),
        r.status,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(r.status, 200, "{r:?}");
    drop(idle);
}

/// A connection that sends nothing, and a keep-alive connection idle after its answer, are
/// both closed by the server at the header timeout.
#[test]
fn idle_and_keep_alive_connections_are_closed_at_the_header_timeout() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    user_with_token(&world, &store, "ana@example.test", "member");
    let server = Server::start(&world, &store, &["--header-timeout", "1"]);
    let wait_for_eof = |mut s: TcpStream, what: &str| {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => continue,
                Err(e) => panic!("{what}: the server did not close it ({e})"),
            }
        }
    };
    let silent = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    wait_for_eof(silent, "a connection that never sends its headers");

    let mut ka = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    ka.write_all(b"GET /healthz HTTP/1.1\r\nHost: review\r\n\r\n").unwrap();
    ka.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\"ok\":true") {
        let n = ka.read(&mut buf).unwrap();
        assert!(n > 0, "closed before the answer: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    wait_for_eof(ka, "an idle keep-alive connection");
}

/// Under a low open-files limit, connections past it make `accept` fail with EMFILE: the
/// server backs off, logs the burst once (not once per retry), and serves again after it.
#[test]
fn an_emfile_burst_is_backed_off_logged_once_and_survived() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let ana = user_with_token(&world, &store, "ana@example.test", "member");
    let server = Server::start(&world, &store, &[]);
    let pid = server.child.id();
    assert_eq!(get(&server.base, &ana, "/api/v1/me", &[]).status, 200);
    std::thread::sleep(Duration::from_millis(300));
    let limit = open_fds(pid) + 8;
    let out = Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={limit}:{limit}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "prlimit: {}", String::from_utf8_lossy(&out.stderr));
    let idle: Vec<TcpStream> =
        (0..40).map(|_| TcpStream::connect(("127.0.0.1", server.port)).unwrap()).collect();
    // Long enough for many retries: the old loop logged one line every 50 ms.
    std::thread::sleep(Duration::from_secs(3));
    drop(idle);
    let r = get(&server.base, &ana, "/api/v1/me", &["--max-time", "60"]);
    assert_eq!(r.status, 200, "served after the burst: {r:?}\n{}", server.log());
    let log = server.log();
    let logged = log.matches("accept failed").count();
    let retries = metric(&server, "airlock_review_accept_errors_total");
    eprintln!(
        "measured: EMFILE burst of 3 s: {logged} log line(s), {retries:?} failed accept calls"
    );
    assert_eq!(logged, 1, "one line for the burst:\n{log}");
    assert!(log.contains("Too many open files") || log.contains("os error 24"), "{log}");
}

/// A token past its burst is answered 429 with an integer `Retry-After`; another token (even
/// of the same user) has its own bucket.
#[test]
fn a_token_past_its_rate_gets_429_with_an_integer_retry_after() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let ana = user_with_token(&world, &store, "ana@example.test", "member");
    let ana2 = token_for(&world, &store, "ana@example.test");
    let server = Server::start(
        &world,
        &store,
        &["--rate-limit-per-token", "0.05", "--rate-limit-burst", "3"],
    );
    for _ in 0..3 {
        assert_eq!(get(&server.base, &ana, "/api/v1/me", &[]).status, 200);
    }
    let r = get(&server.base, &ana, "/api/v1/me", &[]);
    assert_eq!(r.status, 429, "{r:?}");
    let wait = retry_after(&r);
    assert!((1..=20).contains(&wait), "Retry-After {wait} for 0.05 requests/s");
    let f = probe(&world, "limited");
    let r = post_events(&server.base, &ana, &f, "application/x-ndjson", &[]);
    assert_eq!(r.status, 429, "ingest is limited too: {r:?}");
    assert_eq!(r.json()["code"], json!(429));
    assert_eq!(get(&server.base, &ana2, "/api/v1/me", &[]).status, 200, "per token");
}

/// Failed authentications are limited per peer: past the burst, the peer's requests are 429
/// before any token is looked at (a valid one included), so guessing gets one try per refill.
#[test]
fn failed_authentications_are_limited_per_peer() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let ana = user_with_token(&world, &store, "ana@example.test", "member");
    let server = Server::start(
        &world,
        &store,
        &["--auth-failure-rate", "0.05", "--auth-failure-burst", "3"],
    );
    let guess = "alk_0000000000000000000000000000000000000000000";
    // A missing token is not a guess and costs nothing.
    for _ in 0..5 {
        assert_eq!(curl(&[&format!("{}/api/v1/me", server.base)]).status, 401);
    }
    for _ in 0..3 {
        assert_eq!(get(&server.base, guess, "/api/v1/me", &[]).status, 401);
    }
    let r = get(&server.base, guess, "/api/v1/me", &[]);
    assert_eq!(r.status, 429, "{r:?}");
    assert!((1..=20).contains(&retry_after(&r)));
    let r = get(&server.base, &ana, "/api/v1/me", &[]);
    assert_eq!(r.status, 429, "the peer is refused before its token is checked: {r:?}");
}

/// One raw POST of `body_len` bytes to `/api/v1/events`, the whole body written before the
/// answer is read, as curl and `airlock publish` do. The status line's code, or the error
/// that lost it.
fn post_whole_body_then_read(port: u16, token: &str, body_len: usize) -> Result<u16, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer \
         {token}\r\nContent-Type: application/x-ndjson\r\nContent-Length: {body_len}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).map_err(|e| format!("writing the head: {e}"))?;
    let chunk = vec![b'\n'; 64 * 1024];
    let mut left = body_len;
    while left > 0 {
        let n = left.min(chunk.len());
        s.write_all(&chunk[..n]).map_err(|e| format!("writing the body: {e}"))?;
        left -= n;
    }
    let mut resp = [0u8; 64];
    let mut got = 0;
    while got < 12 {
        match s.read(&mut resp[got..]) {
            Ok(0) => return Err(format!("closed after {got} bytes of answer")),
            Ok(n) => got += n,
            Err(e) => return Err(format!("reading the answer: {e}")),
        }
    }
    let text = String::from_utf8_lossy(&resp[..got]).into_owned();
    text.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or(text)
}

/// Regression: a request refused before its body was read (401, 429) was answered and the
/// connection closed with the body unread, so the kernel reset it and a client still writing
/// its body lost the answer ("connection error"; `airlock publish` gave up on a busy server
/// instead of waiting out its 429). The refused body is now read and discarded.
#[test]
fn a_refusal_before_the_body_is_read_still_reaches_a_client_writing_a_large_body() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let ana = user_with_token(&world, &store, "ana@example.test", "member");
    let server = Server::start(
        &world,
        &store,
        &["--rate-limit-per-token", "0.05", "--rate-limit-burst", "1"],
    );
    let port = server.port;
    // 4.9 MB, just under the ingest cap: more than a loopback connection holds unread, so the
    // client is still writing when the refusal is sent (at 1 and 3 MB the socket buffers took
    // it all and the test passed without the fix).
    const BODY: usize = 4_900_000;
    for round in 0..5 {
        // 401, and 429 once this peer's failed authentications pass their burst.
        let answer = post_whole_body_then_read(port, "al_bad_token", BODY);
        assert!(matches!(answer, Ok(401 | 429)), "round {round}: {answer:?}");
    }
    assert_eq!(get(&server.base, &ana, "/api/v1/me", &[]).status, 200);
    for round in 0..5 {
        assert_eq!(post_whole_body_then_read(port, &ana, BODY), Ok(429), "{round}");
    }
}
