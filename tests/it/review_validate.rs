//! Item-level validation before the store, on both stores through the real `airlockd review`:
//! poison envelope fields (NUL, over-long `id`/`type`/`session`) and reserved types are that
//! item's 400/403 in a 207 while the good items beside them are stored; NUL and lone
//! surrogates inside a payload are stored and read back byte for byte; a nested array element
//! is an item error, not a body error; a NUL in a query parameter is a 400, never a 5xx.

use crate::review_support::*;
use crate::support::World;
use serde_json::json;

/// An `external` envelope as raw JSON text, so a test can put any escape into it (a
/// `serde_json::Value` cannot hold a lone surrogate).
fn item(id: &str, kind: &str, session: Option<&str>, payload: &str) -> String {
    let session = session.map_or("null".to_string(), |s| format!("\"{s}\""));
    format!(
        r#"{{"id":"{id}","source":"external","type":"{kind}","ts":"2026-03-04T09:12:05Z","session":{session},"payload":{payload}}}"#
    )
}

fn good(id: &str) -> String {
    item(id, "deploy.approved", Some("s-1"), r#"{"by":"ci"}"#)
}

fn ndjson(lines: &[String]) -> Vec<u8> {
    let mut out = lines.join("\n").into_bytes();
    out.push(b'\n');
    out
}

/// `(status, code)` of every result, plus the whole answer for messages.
fn outcome(r: &Http) -> (u16, Vec<(String, u64)>) {
    let v = r.json();
    let results = v["results"].as_array().unwrap_or_else(|| panic!("no results: {}", r.body));
    (
        r.status,
        results
            .iter()
            .map(|x| (x["status"].as_str().unwrap().to_string(), x["code"].as_u64().unwrap()))
            .collect(),
    )
}

fn created() -> (String, u64) {
    ("created".into(), 201)
}

fn rejected(code: u64) -> (String, u64) {
    ("rejected".into(), code)
}

/// Every poison envelope item with the code it must get and a word its message must hold.
fn poison_items() -> Vec<(&'static str, String, u64, &'static str)> {
    let long = |n: usize| "x".repeat(n);
    vec![
        ("NUL in id", item(r"p-\u0000-id", "deploy.approved", None, "{}"), 400, "NUL"),
        ("NUL in type", item("p-type-nul", r"deploy\u0000", None, "{}"), 400, "NUL"),
        ("NUL in session", item("p-sess-nul", "t", Some(r"s\u0000"), "{}"), 400, "NUL"),
        ("id over 1536 bytes", item(&long(1537), "t", None, "{}"), 400, "1536"),
        ("2.7 KB id", item(&long(2700), "t", None, "{}"), 400, "1536"),
        // 129 bytes of UTF-8 in 65 characters: the limit is on bytes.
        ("type over 128 bytes", item("p-type-long", &"é".repeat(65), None, "{}"), 400, "128"),
        ("session over 256 bytes", item("p-sess-long", "t", Some(&long(257)), "{}"), 400, "256"),
        // The size that broke PostgreSQL's btree index on (user_id, session, pk).
        ("2.7 KB session", item("p-sess-2k7", "t", Some(&long(2700)), "{}"), 400, "256"),
        ("lone surrogate in id", item(r"p-\ud800", "t", None, "{}"), 400, "surrogate"),
        ("reserved airlock.*", item("p-read", "airlock.review.read", None, "{}"), 403, "reserved"),
        ("reserved gate.*", item("p-gate", "gate.approved", None, "{}"), 403, "reserved"),
        (
            "reserved, other case",
            item("p-case", "Airlock.Review.Read", None, "{}"),
            403,
            "reserved",
        ),
        ("nested array element", "[1]".to_string(), 400, "object"),
    ]
}

fn poison_suite(world: &World, store: &StoreSel) {
    let tok = user_with_token(world, store, "ana@example.test", "member");
    let server = Server::start(world, store, &[]);
    let dir = world.tmp.path();
    let mut stored = 0;
    for (n, (what, poison, code, word)) in poison_items().into_iter().enumerate() {
        // Alone, as NDJSON: a 207 with the item's own code, nothing stored.
        let f = write_file(dir, "alone.ndjson", &ndjson(std::slice::from_ref(&poison)));
        let r = post_events(&server.base, &tok, &f, "application/x-ndjson", &[]);
        assert_eq!(outcome(&r), (207, vec![rejected(code)]), "{what} alone: {}", r.body);
        let msg = r.json()["results"][0]["error"].as_str().unwrap().to_string();
        assert!(msg.contains(word), "{what}: the message should say why: {msg}");
        // Between two good items, as a JSON array: the good ones are stored.
        let (a, b) = (format!("good-{n}-a"), format!("good-{n}-b"));
        let body = format!("[{},{poison},{}]", good(&a), good(&b));
        let f = write_file(dir, "batch.json", body.as_bytes());
        let r = post_events(&server.base, &tok, &f, "application/json", &[]);
        assert_eq!(
            outcome(&r),
            (207, vec![created(), rejected(code), created()]),
            "{what} in a batch: {}",
            r.body
        );
        stored += 2;
        let ids: Vec<String> = all_events(&server.base, &tok, "")
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ids.len(), stored, "{what}: only the good items are stored: {ids:?}");
        assert!(ids.contains(&a) && ids.contains(&b), "{what}: {ids:?}");
    }
    // At the limits exactly, every field is accepted.
    let edge = item(&"i".repeat(1536), &"t".repeat(128), Some(&"s".repeat(256)), "{}");
    let f = write_file(dir, "edge.ndjson", &ndjson(&[edge]));
    let r = post_events(&server.base, &tok, &f, "application/x-ndjson", &[]);
    assert_eq!(outcome(&r), (200, vec![created()]), "{}", r.body);

    // A batch element that is itself an array is that element's 400, not a body error.
    let f = write_file(dir, "nested.json", format!("[[1],{}]", good("after-nested")).as_bytes());
    let r = post_events(&server.base, &tok, &f, "application/json", &[]);
    assert_eq!(outcome(&r), (207, vec![rejected(400), created()]), "{}", r.body);
    let f = write_file(dir, "nested2.json", format!("[{},[[]],[]]", good("before")).as_bytes());
    let r = post_events(&server.base, &tok, &f, "application/json", &[]);
    assert_eq!(outcome(&r), (207, vec![created(), rejected(400), rejected(400)]), "{}", r.body);

    // The server writes `airlock.review.read` itself; nobody can forge one.
    let read_events = all_events(&server.base, &tok, "&source=external")
        .into_iter()
        .filter(|e| e["type"].as_str().unwrap().to_ascii_lowercase().starts_with("airlock."))
        .count();
    assert_eq!(read_events, 0, "no client-posted airlock.* event was stored");

    // A NUL in a query parameter is the client's mistake: 400 naming it, on both stores.
    for q in ["session=%00", "user=a%00%40example.test", "since=2026%00"] {
        let r = get(&server.base, &tok, &format!("/api/v1/events?{q}"), &[]);
        assert_eq!(r.status, 400, "{q}: {}", r.body);
    }
    let r = get(&server.base, &tok, "/api/v1/flags?rule=x%00", &[]);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(!server.log().contains("unavailable"), "no store error: {}", server.log());
}

#[test]
fn poison_items_are_item_errors_embedded() {
    let world = World::new();
    poison_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn poison_items_are_item_errors_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    poison_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// The `payload` texts a client may send, each to come back byte for byte (spacing and key
/// order included).
fn odd_payloads() -> Vec<(&'static str, &'static str)> {
    vec![
        ("nul", r#"{ "z": "a\u0000b", "a": ["\u0000"], "\u0000": 1 }"#),
        ("lone high surrogate", r#"{"text":"\ud800"}"#),
        ("lone low surrogate", r#"{"text":"x\uDC00y","n":1.50}"#),
        ("reversed pair", r#"["\udc00\ud800"]"#),
        ("pair and escaped backslash", r#"{"ok":"\ud83d\ude00","not":"\\ud800"}"#),
        ("nul in boot", r#"{"boot":"b\u0000","host":"example.test"}"#),
    ]
}

/// The raw text of event `id` in a GET answer (the answer cannot be parsed as a whole when a
/// payload holds a lone surrogate, so this finds the event's object by its id).
fn raw_event<'a>(body: &'a str, id: &str) -> &'a str {
    let at = body.find(&format!("\"id\":\"{id}\"")).unwrap_or_else(|| panic!("no {id}: {body}"));
    let start = body[..at].rfind("{\"").unwrap();
    &body[start..]
}

fn payload_suite(world: &World, store: &StoreSel) {
    let tok = user_with_token(world, store, "ana@example.test", "member");
    let rev = user_with_token(world, store, "rev@example.test", "reviewer");
    let server = Server::start(world, store, &[]);
    let dir = world.tmp.path();
    let payloads = odd_payloads();
    // Each alone (NDJSON), then all in one JSON array with a good item.
    for (n, (what, p)) in payloads.iter().enumerate() {
        let f = write_file(dir, "one.ndjson", &ndjson(&[item(&format!("odd-{n}"), "t", None, p)]));
        let r = post_events(&server.base, &tok, &f, "application/x-ndjson", &[]);
        assert_eq!(outcome(&r), (200, vec![created()]), "{what}: {}", r.body);
    }
    let mut batch: Vec<String> = payloads
        .iter()
        .enumerate()
        .map(|(n, (_, p))| item(&format!("odd-arr-{n}"), "t", None, p))
        .collect();
    batch.push(good("odd-arr-good"));
    let f = write_file(dir, "odd.json", format!("[{}]", batch.join(",")).as_bytes());
    let r = post_events(&server.base, &tok, &f, "application/json", &[]);
    assert_eq!(outcome(&r).1, vec![created(); payloads.len() + 1], "{}", r.body);

    let r = get(&server.base, &tok, "/api/v1/events?limit=1000", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    for (n, (what, p)) in payloads.iter().enumerate() {
        for id in [format!("odd-{n}"), format!("odd-arr-{n}")] {
            let ev = raw_event(&r.body, &id);
            assert!(
                ev.contains(&format!("\"payload\":{p}")),
                "{what}: the payload must come back exactly as sent ({p}): {ev}"
            );
        }
    }
    // A boot that cannot be kept in its own column is not lifted; the payload still holds it.
    let ev = raw_event(&r.body, &format!("odd-{}", payloads.len() - 1));
    assert!(ev.contains("\"boot\":null"), "{ev}");

    // Detection still runs over such payloads: a secret beside a NUL or a lone surrogate.
    let secret = "sk_live_abcdefghijklmnop0000";
    let lines = [
        item("sec-nul", "t", Some("s-odd"), &format!(r#"{{"note":"\u0000 {secret}"}}"#)),
        item("sec-sur", "t", Some("s-odd"), &format!(r#"{{"note":"\ud800 {secret}"}}"#)),
    ];
    let f = write_file(dir, "sec.ndjson", &ndjson(&lines));
    let r = post_events(&server.base, &tok, &f, "application/x-ndjson", &[]);
    assert_eq!(outcome(&r), (200, vec![created(), created()]), "{}", r.body);
    let flags = get(&server.base, &rev, "/api/v1/flags?rule=secret.stripe-key", &[]).json();
    let flags = flags["flags"].as_array().unwrap();
    assert_eq!(flags.len(), 2, "one flag per secret-bearing event: {flags:?}");
    assert!(flags.iter().all(|f| f["session"] == json!("s-odd")), "{flags:?}");

    // A match whose first characters are NULs (detail quotes them) still makes its flag.
    let bash = r#"{"type":"assistant","uuid":"c-nul","sessionId":"s-odd","timestamp":"2026-03-04T09:12:05Z","message":{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"dd \u0000\u0000\u0000of=/dev/sda"}}]}}"#;
    let line = format!(
        r#"{{"id":"c-nul","source":"claude","type":"assistant","ts":"2026-03-04T09:12:05Z","session":"s-odd","payload":{bash}}}"#
    );
    let f = write_file(dir, "bash.ndjson", &ndjson(&[line]));
    let r = post_events(&server.base, &tok, &f, "application/x-ndjson", &[]);
    assert_eq!(outcome(&r), (200, vec![created()]), "{}", r.body);
    let flags = get(&server.base, &rev, "/api/v1/flags?rule=command.destructive", &[]).json();
    assert_eq!(flags["flags"].as_array().unwrap().len(), 1, "{flags}");
    let detail = flags["flags"][0]["detail"].as_str().unwrap();
    assert!(detail.contains('\u{2400}') && !detail.contains('\0'), "{detail:?}");

    // A reviewer's note with a NUL is a 400 (the state row could not be stored), not a 5xx.
    let url = format!("{}/api/v1/flags/{}", server.base, flags["flags"][0]["id"].as_str().unwrap());
    let auth = format!("Authorization: Bearer {rev}");
    let r = curl(&["-H", &auth, "-d", r#"{"action":"acknowledge","note":"a\u0000b"}"#, &url]);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("NUL"), "{}", r.body);

    // `view=true` over a lone surrogate gives a view (U+FFFD in place of the surrogate).
    let r = get(&server.base, &tok, "/api/v1/events?limit=1000&view=true", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let ev = raw_event(&r.body, "sec-sur");
    assert!(ev.contains(r#""view":{"#) && ev.contains('\u{fffd}'), "{ev}");
    assert!(!server.log().contains("store error"), "{}", server.log());
}

#[test]
fn payload_nul_and_surrogates_round_trip_embedded() {
    let world = World::new();
    payload_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn payload_nul_and_surrogates_round_trip_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    payload_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}
