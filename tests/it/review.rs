//! Review plane over real HTTP (curl, python3) on loopback: issue 7's "done when", body- vs
//! item-level errors, attribution, idempotency, limits, gzip, TLS, fuzzed bodies, and the
//! no-outbound-connections check inside a network namespace.

use crate::review_support::*;
use crate::support::{self, World, bin, in_ci};
use serde_json::{Value, json};
use std::io::Write;
use std::path::Path;
use std::process::Command;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/transcripts").join(name),
    )
    .unwrap()
}

/// The mixed batch of the done-when check: egress lines, Claude Code lines (one tool result
/// carrying a secret), and one item claiming a foreign `user_id`.
fn mixed_batch() -> Vec<Value> {
    let mut items = vec![
        egress("egress-0001", "api.anthropic.com", true),
        egress("egress-0002", "registry.npmjs.org", true),
    ];
    for line in fixture("claude-happy-path.jsonl").lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        if v.get("uuid").is_some() && v.get("timestamp").is_some() {
            items.push(claude(v));
        }
    }
    let mut foreign = egress("egress-0003", "example.test", true);
    foreign["user_id"] = json!("someone-else");
    items.push(foreign);
    items
}

fn done_when(world: &World, store: StoreSel) {
    let member = user_with_token(world, &store, "ana@example.test", "member");
    let reviewer = user_with_token(world, &store, "rev@example.test", "reviewer");
    let server = Server::start(world, &store, &[]);
    assert!(server.log().contains("plain HTTP"), "plain HTTP warns: {}", server.log());
    let items = mixed_batch();
    let n = items.len();
    let body = write_file(world.tmp.path(), "batch.ndjson", &ndjson(&items));

    let r = post_events(&server.base, &member, &body, "application/x-ndjson", &[]);
    assert_eq!(r.status, 207, "{}", r.body);
    let results = r.json()["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), n);
    for (i, res) in results.iter().enumerate() {
        assert_eq!(res["index"], json!(i));
        for k in ["index", "id", "status", "code", "error", "received_at"] {
            assert!(res.get(k).is_some(), "result lacks {k}: {res}");
        }
        if i == n - 1 {
            assert_eq!(res["status"], "rejected");
            assert_eq!(res["code"], 403);
            assert!(res["received_at"].is_null());
        } else {
            assert_eq!(res["status"], "created", "{res}");
            assert_eq!(res["code"], 201);
        }
    }

    let flags = get(&server.base, &reviewer, "/api/v1/flags", &[]);
    assert_eq!(flags.status, 200, "{}", flags.body);
    let flags = flags.json();
    let stripe = flags["flags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["rule_id"] == "secret.stripe-key")
        .unwrap_or_else(|| panic!("no flag for the secret in the tool result: {flags}"));
    assert_eq!(stripe["state"], "open");
    assert_eq!(stripe["events"].as_array().unwrap().len(), 1);
    // The flag links the tool-result event.
    let linked = stripe["events"][0].as_i64().unwrap();
    let evs = all_events(&server.base, &reviewer, "&flagged=true&user=ana@example.test");
    let ev = evs.iter().find(|e| e["pk"] == json!(linked)).unwrap();
    assert_eq!(ev["source"], "claude");
    assert!(ev["payload"]["message"]["content"][0]["type"] == "tool_result", "{ev}");
    // The typed view of the transcript lines: files read and the tool call.
    let viewed =
        all_events(&server.base, &reviewer, "&user=ana@example.test&source=claude&view=true");
    assert!(
        viewed.iter().any(|e| e["view"]["tool"] == json!(["Read"])
            && e["view"]["file_read"] == json!(["/home/ana/src/payments/tests/retry_test.rs"])),
        "{viewed:?}"
    );

    // Resent: 200 with every stored item `duplicate` and the original received_at.
    let ok_only: Vec<Value> = items[..n - 1].to_vec();
    let body2 = write_file(world.tmp.path(), "batch2.ndjson", &ndjson(&ok_only));
    let r2 = post_events(&server.base, &member, &body2, "application/x-ndjson", &[]);
    assert_eq!(r2.status, 200, "{}", r2.body);
    for (a, b) in r2.json()["results"].as_array().unwrap().iter().zip(&results) {
        assert_eq!(a["status"], "duplicate");
        assert_eq!(a["received_at"], b["received_at"]);
    }
    // The full batch again (with the foreign item): 207, nothing new stored.
    let r3 = post_events(&server.base, &member, &body, "application/x-ndjson", &[]);
    assert_eq!(r3.status, 207);
    assert_eq!(r3.json()["created"], 0);
    assert_eq!(all_events(&server.base, &member, "").len(), n - 1);
}

#[test]
fn done_when_embedded() {
    let world = World::new();
    let dir = world.tmp.path().join("review-data");
    done_when(&world, StoreSel::Embedded(dir));
}

#[test]
fn done_when_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    done_when(&world, StoreSel::Pg(db.runtime_url.clone()));
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

fn errors_suite(world: &World, store: StoreSel) {
    let tok = user_with_token(world, &store, "ana@example.test", "member");
    let server = Server::start(world, &store, &[]);
    let dir = world.tmp.path();
    let count = || all_events(&server.base, &tok, "").len();

    // Body-level errors: 4xx, nothing stored.
    let good = ndjson(&[egress("g1", "example.test", true), egress("g2", "example.test", true)]);
    let bad_gz = write_file(dir, "bad.gz", b"\x1f\x8b\x08\x00garbage-not-deflate");
    let r = post_events(
        &server.base,
        &tok,
        &bad_gz,
        "application/x-ndjson",
        &["-H", "Content-Encoding: gzip"],
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let mut six = good.clone();
    six.resize(6 * 1024 * 1024, b' ');
    let six_mb = write_file(dir, "six.ndjson", &six);
    let r = post_events(&server.base, &tok, &six_mb, "application/x-ndjson", &[]);
    assert_eq!(r.status, 413, "{}", r.body);
    let six_gz = write_file(dir, "six.gz", &gzip(&six));
    let r = post_events(
        &server.base,
        &tok,
        &six_gz,
        "application/x-ndjson",
        &["-H", "Content-Encoding: gzip"],
    );
    assert_eq!(r.status, 413, "6 MB after decompression: {}", r.body);
    let many: Vec<Value> =
        (0..1001).map(|i| egress(&format!("m{i}"), "example.test", true)).collect();
    let many_f = write_file(dir, "many.json", serde_json::to_string(&many).unwrap().as_bytes());
    let r = post_events(&server.base, &tok, &many_f, "application/json", &[]);
    assert_eq!(r.status, 413, "{}", r.body);
    let not_array =
        write_file(dir, "obj.json", egress("o1", "example.test", true).to_string().as_bytes());
    assert_eq!(post_events(&server.base, &tok, &not_array, "application/json", &[]).status, 400);
    let truncated = write_file(dir, "trunc.json", b"[{\"id\":\"t1\"");
    assert_eq!(post_events(&server.base, &tok, &truncated, "application/json", &[]).status, 400);
    let goodf = write_file(dir, "good.ndjson", &good);
    assert_eq!(post_events(&server.base, &tok, &goodf, "text/plain", &[]).status, 415);
    let r = post_events(
        &server.base,
        &tok,
        &goodf,
        "application/x-ndjson",
        &["-H", "Content-Encoding: br"],
    );
    assert_eq!(r.status, 415);
    let r = post_events(&server.base, "alk_wrong", &goodf, "application/x-ndjson", &[]);
    assert_eq!(r.status, 401);
    assert!(r.headers.to_ascii_lowercase().contains("www-authenticate: bearer"));
    assert_eq!(count(), 0, "body-level errors store nothing");

    // Item-level: a bad NDJSON line and an oversized item are that item's code; rest stored.
    let mut body = good.clone();
    body.extend_from_slice(b"{\"id\": \"broken\", \n");
    let big = json!({"id":"big","source":"external","type":"blob","ts":"2026-03-04T09:12:05Z",
                     "payload": {"data": "x".repeat(1_000_000 + 10)}});
    body.extend_from_slice(big.to_string().as_bytes());
    body.push(b'\n');
    body.extend_from_slice(egress("g3", "example.test", true).to_string().as_bytes());
    let f = write_file(dir, "mixed.ndjson", &body);
    let r = post_events(&server.base, &tok, &f, "application/x-ndjson", &[]);
    assert_eq!(r.status, 207, "{}", r.body);
    let codes: Vec<i64> = r.json()["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["code"].as_i64().unwrap())
        .collect();
    assert_eq!(codes, vec![201, 201, 400, 413, 201]);
    assert_eq!(count(), 3);

    // One bad item in 1,000 (JSON array) → 207 with 999 stored.
    let mut thousand: Vec<Value> =
        (0..1000).map(|i| egress(&format!("k{i}"), "example.test", true)).collect();
    thousand[500] = json!({"id": "k500", "source": "nonsense"});
    let f = write_file(dir, "thousand.json", serde_json::to_string(&thousand).unwrap().as_bytes());
    let r = post_events(&server.base, &tok, &f, "application/json", &[]);
    assert_eq!(r.status, 207);
    assert_eq!(r.json()["created"], 999);
    assert_eq!(r.json()["results"][500]["code"], 400);
    assert_eq!(count(), 3 + 999);

    // gzip accepted; a resend adds nothing.
    let gz = write_file(dir, "ok.gz", &gzip(&ndjson(&[egress("z1", "example.test", true)])));
    let r = post_events(
        &server.base,
        &tok,
        &gz,
        "application/x-ndjson",
        &["-H", "Content-Encoding: gzip"],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post_events(
        &server.base,
        &tok,
        &gz,
        "application/x-ndjson",
        &["-H", "Content-Encoding: gzip"],
    );
    assert_eq!(r.json()["results"][0]["status"], "duplicate");
    assert_eq!(count(), 3 + 999 + 1);
}

#[test]
fn body_and_item_errors_embedded() {
    let world = World::new();
    errors_suite(&world, StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn body_and_item_errors_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    errors_suite(&world, StoreSel::Pg(db.runtime_url.clone()));
}

#[test]
fn attribution_and_read_recording() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let a = user_with_token(&world, &store, "a@example.test", "member");
    let b = user_with_token(&world, &store, "b@example.test", "member");
    let rev = user_with_token(&world, &store, "rev@example.test", "reviewer");
    let server = Server::start(&world, &store, &[]);
    let me_b = get(&server.base, &b, "/api/v1/me", &[]).json();
    assert_eq!(me_b["role"], "member");
    // A cannot write B's history: B's user_id in the envelope is refused for that item.
    let mut item = egress("e1", "example.test", true);
    item["user_id"] = me_b["id"].clone();
    let f = write_file(
        world.tmp.path(),
        "a.ndjson",
        &ndjson(&[item, egress("e2", "example.test", true)]),
    );
    let r = post_events(&server.base, &a, &f, "application/x-ndjson", &[]);
    assert_eq!(r.status, 207);
    assert_eq!(r.json()["results"][0]["code"], 403);
    assert!(all_events(&server.base, &b, "").is_empty(), "nothing landed in B's history");
    // Same id under B's own token is a different key: created, not a duplicate of A's.
    let f =
        write_file(world.tmp.path(), "b.ndjson", &ndjson(&[egress("e2", "example.test", true)]));
    assert_eq!(
        post_events(&server.base, &b, &f, "application/x-ndjson", &[]).json()["results"][0]["status"],
        "created"
    );
    // A member cannot read B's history or flags.
    let r = get(&server.base, &a, "/api/v1/events?user=b@example.test", &[]);
    assert_eq!(r.status, 403);
    assert_eq!(get(&server.base, &a, "/api/v1/flags?user=b@example.test", &[]).status, 403);
    let own = all_events(&server.base, &a, "");
    assert!(own.iter().all(|e| e["user_id"] != me_b["id"]));
    // A reviewer reading A's events is recorded as an event in the reviewer's history.
    let evs = all_events(&server.base, &rev, "&user=a@example.test");
    assert_eq!(evs.len(), 1);
    let me_rev = get(&server.base, &rev, "/api/v1/me", &[]).json();
    let audit = all_events(
        &server.base,
        &rev,
        &format!("&user={}&source=external", me_rev["id"].as_str().unwrap()),
    );
    assert!(
        audit.iter().any(|e| e["type"] == "airlock.review.read"
            && e["payload"]["target_user"] == own[0]["user_id"]),
        "{audit:?}"
    );
    // Flag actions: reviewer only, appended, visible in the state.
    let f =
        write_file(world.tmp.path(), "p.ndjson", &ndjson(&[egress("p1", "pastebin.com", false)]));
    post_events(&server.base, &a, &f, "application/x-ndjson", &[]);
    let flags = get(&server.base, &rev, "/api/v1/flags?state=open", &[]).json();
    let id = flags["flags"][0]["id"].as_str().unwrap().to_string();
    let url = format!("{}/api/v1/flags/{id}", server.base);
    let body = r#"{"action":"acknowledge","note":"looking"}"#;
    let ha = format!("Authorization: Bearer {a}");
    assert_eq!(
        curl(&["-H", &ha, "-H", "Content-Type: application/json", "-d", body, &url]).status,
        403
    );
    let hr = format!("Authorization: Bearer {rev}");
    let r = curl(&["-H", &hr, "-H", "Content-Type: application/json", "-d", body, &url]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["state"], "acknowledged");
    assert_eq!(r.json()["note"], "looking");
    let r = curl(&["-H", &hr, "-d", r#"{"action":"resolve","note":"fine"}"#, &url]);
    assert_eq!(r.json()["state"], "resolved");
    assert_eq!(
        get(&server.base, &rev, "/api/v1/flags?state=open", &[]).json()["flags"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    let r = curl(&[
        "-H",
        &hr,
        "-d",
        r#"{"action":"resolve"}"#,
        &format!("{}/api/v1/flags/nope", server.base),
    ]);
    assert_eq!(r.status, 404);
    // Revoked tokens stop working.
    let run = world
        .airlockd(world.tmp.path())
        .args(["admin", "token", "revoke", "--user", "a@example.test"])
        .args(store.admin_args())
        .run()
        .expect_code(0);
    assert!(run.stderr().contains("revoked"));
    assert_eq!(get(&server.base, &a, "/api/v1/me", &[]).status, 401);
}

#[test]
fn tls_with_a_self_signed_certificate() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let tok = user_with_token(&world, &store, "ana@example.test", "member");
    let (cert, key) = crate::review_support::init_tls(&world);
    let server = Server::start_scheme(
        &world,
        &store,
        &["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()],
        "https",
    );
    assert!(!server.log().contains("plain HTTP"));
    let cacert = cert.to_str().unwrap();
    let r = get(&server.base, &tok, "/api/v1/me", &["--cacert", cacert]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["email"], "ana@example.test");
    let f = write_file(
        world.tmp.path(),
        "b.json",
        serde_json::to_string(&[egress("t1", "example.test", true)]).unwrap().as_bytes(),
    );
    let r = post_events(&server.base, &tok, &f, "application/json", &["--cacert", cacert]);
    assert_eq!(r.status, 200, "{}", r.body);
    // Plain HTTP to the TLS port fails; so does TLS without trusting the certificate.
    let plain = curl(&[&format!("http://127.0.0.1:{}/api/v1/me", server.port)]);
    assert_ne!(plain.status, 200);
    let untrusted = get(&server.base, &tok, "/api/v1/me", &[]);
    assert_eq!(untrusted.status, 0);
    // python3 urllib over TLS too.
    let script = format!(
        "import ssl,urllib.request,json\nctx=ssl.create_default_context(cafile={cacert:?})\n\
         req=urllib.request.Request('{}/api/v1/me',headers={{'Authorization':'Bearer {tok}'}})\n\
         print(json.load(urllib.request.urlopen(req,context=ctx))['email'])\n",
        server.base
    );
    let out = Command::new("python3").args(["-c", &script]).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ana@example.test",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn plain_http_is_refused_off_loopback() {
    let world = World::new();
    let run = world
        .airlockd(world.tmp.path())
        .args(["review", "--listen", "0.0.0.0:0", "--data-dir"])
        .args([world.tmp.path().join("d")])
        .run();
    assert_eq!(run.code(), 1);
    assert!(run.stderr().contains("refusing plain HTTP"), "{}", run.stderr());
    let run = world.airlockd(world.tmp.path()).args(["review"]).run();
    assert_eq!(run.code(), 64, "no --listen and no activation socket: {}", run.stderr());
}

/// Random and mutated bodies through python3 urllib: never a 5xx, never a partial item.
#[test]
fn fuzzed_bodies_never_500() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let tok = user_with_token(&world, &store, "ana@example.test", "member");
    // The fuzz loop sends up to 350 requests with one token, past the default burst of 100: on
    // a fast run the bucket was empty when the stored events were read back (a 429 there).
    // This test is about bodies, not rates.
    let server = Server::start(
        &world,
        &store,
        &["--rate-limit-per-token", "100000", "--rate-limit-burst", "100000"],
    );
    let seed = serde_json::to_string(&[
        egress("f1", "example.test", true),
        egress("f2", "pastebin.com", false),
    ])
    .unwrap();
    let script = format!(
        r#"
import random, urllib.request, urllib.error, gzip, json
random.seed(7)
seed = {seed:?}.encode()
codes = {{}}
def send(body, ct, enc=None):
    h = {{'Authorization': 'Bearer {tok}', 'Content-Type': ct}}
    if enc: h['Content-Encoding'] = enc
    req = urllib.request.Request('{base}/api/v1/events', data=body, headers=h, method='POST')
    try:
        r = urllib.request.urlopen(req); code = r.status; r.read()
    except urllib.error.HTTPError as e:
        code = e.code; e.read()
    codes[code] = codes.get(code, 0) + 1
for i in range({mutated}):
    b = bytearray(seed)
    for _ in range(random.randint(1, 8)):
        op = random.random(); p = random.randrange(len(b)) if b else 0
        if op < 0.4 and b: b[p] = random.randrange(256)
        elif op < 0.7: b.insert(p, random.choice(b'[]{{}}",:\\\n\x00'))
        elif b: del b[p]
    ct = random.choice(['application/json', 'application/x-ndjson'])
    if random.random() < 0.2:
        send(gzip.compress(bytes(b)), ct, 'gzip')
    elif random.random() < 0.1:
        send(bytes(b)[: len(b) // 2], ct, 'gzip')
    else:
        send(bytes(b), ct)
for _ in range({random}):
    send(bytes(random.randrange(256) for _ in range(random.randint(0, 300))), 'application/json')
print(json.dumps(codes))
"#,
        base = server.base,
        mutated = support::iterations(300),
        random = support::iterations(50),
    );
    let out = Command::new("python3").args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let codes: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (code, _) in codes.as_object().unwrap() {
        let c: u16 = code.parse().unwrap();
        assert!(c < 500, "got {c}: {codes}\n{}", server.log());
    }
    // Every stored event is complete (an item is never half-written).
    for e in all_events(&server.base, &tok, "") {
        assert!(e["payload"].is_object() || !e["payload"].is_null(), "{e}");
        assert!(e["id"].is_string() && e["source"].is_string());
    }
}

/// Runs the whole flow inside a fresh network namespace with only `lo`, and asserts from the
/// kernel's counters that nothing tried to leave: `Ip: OutNoRoutes` counts every packet and
/// connect() that had no route (anything not loopback, DNS included).
#[test]
fn no_outbound_connections() {
    let probe = Command::new("unshare").args(["-r", "-n", "true"]).status();
    if !probe.map(|s| s.success()).unwrap_or(false) {
        assert!(!in_ci(), "unshare -r -n is unavailable in CI");
        eprintln!("SKIP: cannot create a network namespace here");
        return;
    }
    let world = World::new();
    let dir = world.tmp.path().join("d");
    let d = bin("airlockd");
    let script = format!(
        r#"
set -e
ip link set lo up
# IPv4 OutNoRoutes + IPv6 Ip6OutNoRoutes: every dial or datagram with no route.
cnt() {{
  a=$(awk '/^Ip: [0-9]/ {{print $13}}' /proc/net/snmp)
  b=$(awk '/^Ip6OutNoRoutes/ {{print $2}}' /proc/net/snmp6 2>/dev/null)
  echo $((a + ${{b:-0}}))
}}
D={d}
T=$($D review init --admin ana@example.test --data-dir {dir} 2>/dev/null)
before=$(cnt)
$D review --listen 127.0.0.1:18999 --data-dir {dir} 2>/dev/null &
pid=$!
for i in $(seq 100); do curl -s --noproxy '*' http://127.0.0.1:18999/healthz >/dev/null && break; sleep 0.05; done
printf '%s\n' '{batch}' > {dir}/b.ndjson
curl -s --noproxy '*' -o /dev/null -w '%{{http_code}}\n' -H "Authorization: Bearer $T" -H 'Content-Type: application/x-ndjson' --data-binary @{dir}/b.ndjson http://127.0.0.1:18999/api/v1/events
curl -s --noproxy '*' -o /dev/null -w '%{{http_code}}\n' -H "Authorization: Bearer $T" http://127.0.0.1:18999/api/v1/flags
curl -s --noproxy '*' -o /dev/null -w '%{{http_code}}\n' -H "Authorization: Bearer $T" "http://127.0.0.1:18999/api/v1/events?user=ana@example.test"
after=$(cnt)
kill $pid; wait $pid || true
# Positive control: a dial to a non-loopback address (TEST-NET-1; no route exists in this
# namespace, so no packet leaves) must move the counter, proving the check can fail.
curl -s --noproxy '*' --connect-timeout 1 http://192.0.2.1/ >/dev/null 2>&1 || true
control=$(cnt)
echo "outnoroutes $before $after $control"
ss -tanH | awk '{{print $4, $5}}' | grep -v -E '^(127\.|\[::1\]|\[::ffff:127)' | grep -v -E '^(0\.0\.0\.0|\*|\[::\])' || true
"#,
        d = d.display(),
        dir = dir.display(),
        batch = egress("n1", "pastebin.com", false)
    );
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new("unshare").args(["-r", "-n", "sh", "-c", &script]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(&lines[..3], &["200", "200", "200"], "{stdout}");
    let counters: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(counters[0], "outnoroutes");
    assert_eq!(
        counters[1], counters[2],
        "the server tried to reach a non-loopback address: {stdout}"
    );
    assert_eq!(lines.len(), 4, "non-loopback sockets seen: {stdout}");
}

/// Socket activation: the listener named `review` is adopted (systemd-socket-activate plays
/// the service manager, as airlock-review.socket does).
#[test]
fn socket_activation_adopts_the_review_fd() {
    if Command::new("systemd-socket-activate").arg("--help").output().is_err() {
        assert!(!in_ci(), "systemd-socket-activate is missing in CI");
        eprintln!("SKIP: systemd-socket-activate not installed");
        return;
    }
    let world = World::new();
    let dir = world.tmp.path().join("d");
    let store = StoreSel::Embedded(dir.clone());
    let tok = user_with_token(&world, &store, "ana@example.test", "member");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new("systemd-socket-activate")
        .args(["-l", &format!("127.0.0.1:{port}"), "--fdname=review"])
        .arg(bin("airlockd"))
        .args(["review", "--data-dir"])
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // systemd-socket-activate binds first and starts airlockd on the first connection.
    let base = format!("http://127.0.0.1:{port}");
    let mut r = get(
        &base,
        &tok,
        "/api/v1/me",
        &["--retry", "20", "--retry-connrefused", "--retry-delay", "0"],
    );
    for _ in 0..50 {
        if r.status == 200 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        r = get(&base, &tok, "/api/v1/me", &[]);
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["email"], "ana@example.test");
}

fn session_record(session: &str, kind: &str, ts: &str) -> Value {
    json!({"id": format!("{session}:{kind}"), "source": "session", "type": kind, "ts": ts,
           "session": session, "payload": {"id": format!("{session}:{kind}"), "ts": ts}})
}

fn egress_at(id: &str, session: &str, seq: i64, ts: &str) -> Value {
    let mut e = egress(id, "example.test", true);
    e["session"] = json!(session);
    e["seq"] = json!(seq);
    e["ts"] = json!(ts);
    e
}

fn rules_of(base: &str, tok: &str) -> Vec<String> {
    let r = get(base, tok, "/api/v1/flags?limit=1000", &[]);
    r.json()["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule_id"].as_str().unwrap().to_string())
        .collect()
}

/// Backdating outside the session span and `seq` gaps are judged when the end record
/// arrives; a clean session raises nothing.
#[test]
fn session_span_and_gaps_on_end_record() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let tok = user_with_token(&world, &store, "ana@example.test", "reviewer");
    let server = Server::start(&world, &store, &[]);
    let clean = vec![
        session_record("s-ok", "start", "2026-03-04T09:00:00Z"),
        egress_at("ok1", "s-ok", 1, "2026-03-04T09:00:01Z"),
        egress_at("ok2", "s-ok", 2, "2026-03-04T09:00:02Z"),
        session_record("s-ok", "end", "2026-03-04T09:10:00Z"),
    ];
    let f = write_file(world.tmp.path(), "ok.ndjson", &ndjson(&clean));
    assert_eq!(post_events(&server.base, &tok, &f, "application/x-ndjson", &[]).status, 200);
    assert!(rules_of(&server.base, &tok).is_empty());
    // Published in two batches; the end record arrives last.
    let first = vec![
        session_record("s-bad", "start", "2026-03-04T09:00:00Z"),
        egress_at("b1", "s-bad", 1, "2026-03-04T08:00:00Z"),
        egress_at("b2", "s-bad", 2, "2026-03-04T09:00:02Z"),
    ];
    let f = write_file(world.tmp.path(), "b1.ndjson", &ndjson(&first));
    assert_eq!(post_events(&server.base, &tok, &f, "application/x-ndjson", &[]).status, 200);
    assert!(rules_of(&server.base, &tok).is_empty(), "not judged before the end record");
    let second = vec![
        egress_at("b5", "s-bad", 5, "2026-03-04T09:00:05Z"),
        session_record("s-bad", "end", "2026-03-04T09:10:00Z"),
    ];
    let f = write_file(world.tmp.path(), "b2.ndjson", &ndjson(&second));
    assert_eq!(post_events(&server.base, &tok, &f, "application/x-ndjson", &[]).status, 200);
    let mut rules = rules_of(&server.base, &tok);
    rules.sort();
    assert_eq!(rules, vec!["session.seq-gap", "timing.outside-session"]);
}

/// Without an end record, the checks run once the session has been quiet for the settle delay.
#[test]
fn session_gaps_after_settle_delay() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let tok = user_with_token(&world, &store, "ana@example.test", "reviewer");
    let server = Server::start(&world, &store, &["--settle-secs", "1"]);
    let evs = vec![
        egress_at("g1", "s-open", 1, "2026-03-04T09:00:01Z"),
        egress_at("g3", "s-open", 3, "2026-03-04T09:00:03Z"),
    ];
    let f = write_file(world.tmp.path(), "g.ndjson", &ndjson(&evs));
    assert_eq!(post_events(&server.base, &tok, &f, "application/x-ndjson", &[]).status, 200);
    let mut rules = Vec::new();
    for _ in 0..200 {
        rules = rules_of(&server.base, &tok);
        if !rules.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(rules, vec!["session.seq-gap"]);
}

/// A store that goes away answers 503 with Retry-After, not 500.
#[test]
fn store_unavailable_is_503() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    let store = StoreSel::Pg(db.runtime_url.clone());
    let tok = user_with_token(&world, &store, "ana@example.test", "member");
    let server = Server::start(&world, &store, &[]);
    assert_eq!(get(&server.base, &tok, "/api/v1/me", &[]).status, 200);
    db.owner_sql("SELECT 1").unwrap();
    let admin = crate::review_support::PG_ADMIN;
    let out = Command::new("psql")
        .args([admin, "-qAt", "-c", &format!("DROP DATABASE {} WITH (FORCE)", db.name)])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let f =
        write_file(world.tmp.path(), "x.ndjson", &ndjson(&[egress("x1", "example.test", true)]));
    let r = post_events(&server.base, &tok, &f, "application/x-ndjson", &[]);
    assert_eq!(r.status, 503, "{r:?}");
    assert!(r.headers.to_ascii_lowercase().contains("retry-after:"), "{}", r.headers);
}

/// Over the concurrency limit, ingest answers 429 with Retry-After (a slow upload holds the
/// only slot).
#[test]
fn too_many_concurrent_ingests_is_429() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("d"));
    let tok = user_with_token(&world, &store, "ana@example.test", "member");
    let server = Server::start(&world, &store, &["--ingest-concurrency", "1"]);
    let items: Vec<Value> =
        (0..200).map(|i| egress(&format!("slow{i}"), "example.test", true)).collect();
    let slow = write_file(world.tmp.path(), "slow.ndjson", &ndjson(&items));
    let spawn_slow = || {
        Command::new("curl")
            .args(["-s", "--noproxy", "*", "--limit-rate", "2K", "-o", "/dev/null", "-H"])
            .arg(format!("Authorization: Bearer {tok}"))
            .args(["-H", "Content-Type: application/x-ndjson", "--data-binary"])
            .arg(format!("@{}", slow.display()))
            .arg(format!("{}/api/v1/events", server.base))
            .spawn()
            .unwrap()
    };
    let f = write_file(
        world.tmp.path(),
        "one.ndjson",
        &ndjson(&[egress("fast", "example.test", true)]),
    );
    let mut slow_upload = spawn_slow();
    let mut seen = None;
    for _ in 0..300 {
        // If our probe took the slot first, the slow upload was refused: start another.
        if slow_upload.try_wait().unwrap().is_some() {
            slow_upload = spawn_slow();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        let r = post_events(&server.base, &tok, &f, "application/x-ndjson", &[]);
        if r.status == 429 {
            seen = Some(r);
            break;
        }
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let _ = slow_upload.kill();
    let _ = slow_upload.wait();
    let r = seen.expect("never saw 429 while a slow upload held the only slot");
    assert!(r.headers.to_ascii_lowercase().contains("retry-after: 1"), "{}", r.headers);
}
