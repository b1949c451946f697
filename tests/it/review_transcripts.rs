//! Published transcripts against their session records, on both stores through the real
//! `airlockd review`: transcript envelope members (`airlock_session`, `file`, `offset`) are
//! checked, stored and returned (events and export); `transcript.file` items are checked; the
//! comparison at `GET /api/v1/sessions/{session}/transcripts` gives `matches`, `differs`
//! (after a changed prefix), `no_record` and `not_published`, scoped like the events listing
//! (members 403 for anyone else, existing or not; reviewers' reads recorded); and the ingest
//! caps are exactly 1,000,000 bytes per item and 5,000,000 per body.

use crate::review_support::*;
use crate::support::World;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const TS: &str = "2026-03-04T09:12:05.118Z";

fn sha(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// A Claude transcript line's envelope with the members `airlock publish` adds.
fn claude_line(
    uuid: &str,
    session: Option<&str>,
    file: Option<&str>,
    offset: Option<u64>,
) -> Value {
    json!({"id": uuid, "source": "claude", "type": "user", "ts": TS, "session": "agent-sess",
           "airlock_session": session, "file": file, "offset": offset,
           "payload": {"uuid": uuid, "type": "user", "sessionId": "agent-sess", "timestamp": TS,
                       "message": {"role": "user", "content": "hello"}}})
}

fn transcript_file(session: &str, file: &str, bytes: usize, sha256: &str) -> Value {
    json!({"id": format!("{session}:transcript:{file}"), "source": "session",
           "type": "transcript.file", "ts": TS, "session": session,
           "payload": {"airlock_session": session, "file": file, "bytes": bytes, "sha256": sha256}})
}

/// An end record as the daemon writes it, listing `transcripts`.
fn end_record(session: &str, transcripts: Value) -> Value {
    json!({"id": format!("{session}:end"), "source": "session", "type": "end", "ts": TS,
           "session": session,
           "payload": {"id": format!("{session}:end"), "kind": "end", "ts": TS, "session": session,
                       "boot": "boot-1", "repo": "payments", "exit_status": 0,
                       "transcripts": transcripts}})
}

fn post(world: &World, base: &str, tok: &str, items: &[Value]) -> Http {
    let f = write_file(world.tmp.path(), "batch.ndjson", &ndjson(items));
    post_events(base, tok, &f, "application/x-ndjson", &[])
}

fn codes(r: &Http) -> Vec<i64> {
    r.json()["results"].as_array().unwrap().iter().map(|x| x["code"].as_i64().unwrap()).collect()
}

fn members_are_stored_and_returned(world: &World, store: &StoreSel) {
    let tok = user_with_token(world, store, "dev@example.test", "member");
    let server = Server::start(world, store, &[]);
    let base = server.base.as_str();
    let file = ".claude/projects/-work-repo/abc.jsonl";
    let codex = json!({"id": "cx-1:0", "source": "codex", "type": "session_meta", "ts": TS,
        "session": "cx-1", "airlock_session": "s-1", "file": ".codex/sessions/rollout-1.jsonl",
        "offset": 0, "payload": {"type": "session_meta", "payload": {"id": "cx-1"}}});
    let items = vec![
        claude_line("u-1", Some("s-1"), Some(file), Some(4096)),
        claude_line("u-2", None, None, None),
        codex,
        // Bad members: that item's 400, the rest stored.
        {
            let mut v = claude_line("u-bad-1", Some("s-1"), Some(file), None);
            v["offset"] = json!(-5);
            v
        },
        {
            let mut v = claude_line("u-bad-2", Some("s-1"), None, None);
            v["file"] = json!("x".repeat(1025));
            v
        },
        {
            let mut v = claude_line("u-bad-3", None, None, None);
            v["airlock_session"] = json!(12);
            v
        },
    ];
    let r = post(world, base, &tok, &items);
    assert_eq!(r.status, 207, "{}", r.body);
    assert_eq!(codes(&r), vec![201, 201, 201, 400, 400, 400], "{}", r.body);
    let errors: Vec<String> = r.json()["results"].as_array().unwrap()[3..]
        .iter()
        .map(|x| x["error"].as_str().unwrap().to_string())
        .collect();
    assert!(errors[0].contains("`offset` must be a non-negative integer"), "{errors:?}");
    assert!(errors[1].contains("`file` is 1025 bytes; the limit is 1024"), "{errors:?}");
    assert!(errors[2].contains("`airlock_session` must be a string"), "{errors:?}");

    let events = all_events(base, &tok, "");
    let by_id = |id: &str| events.iter().find(|e| e["id"] == id).unwrap().clone();
    let u1 = by_id("u-1");
    assert_eq!(
        (&u1["airlock_session"], &u1["file"], &u1["offset"]),
        (&json!("s-1"), &json!(file), &json!(4096))
    );
    let u2 = by_id("u-2");
    for k in ["airlock_session", "file", "offset"] {
        assert!(u2.get(k).is_some_and(Value::is_null), "{k} is null when absent: {u2}");
    }
    let cx = by_id("cx-1:0");
    assert_eq!(
        (&cx["file"], &cx["offset"]),
        (&json!(".codex/sessions/rollout-1.jsonl"), &json!(0))
    );
    // The export carries them too.
    let r = get(base, &tok, "/api/v1/export?source=claude", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let lines: Vec<Value> =
        r.body.lines().skip(1).map(|l| serde_json::from_str(l).unwrap()).collect();
    let e1 = lines.iter().find(|e| e["id"] == "u-1").unwrap();
    assert_eq!(
        (&e1["airlock_session"], &e1["file"], &e1["offset"]),
        (&json!("s-1"), &json!(file), &json!(4096))
    );
    let e2 = lines.iter().find(|e| e["id"] == "u-2").unwrap();
    assert!(e2.get("offset").is_some_and(Value::is_null), "{e2}");
}

#[test]
fn transcript_members_are_stored_and_returned_embedded() {
    let world = World::new();
    members_are_stored_and_returned(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn transcript_members_are_stored_and_returned_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    members_are_stored_and_returned(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

fn transcripts_of(base: &str, tok: &str, session: &str, query: &str) -> Http {
    get(base, tok, &format!("/api/v1/sessions/{session}/transcripts{query}"), &[])
}

/// The `(file, state, lines)` of an answer, in its order.
fn states(v: &Value) -> Vec<(String, String, i64)> {
    v["transcripts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["file"].as_str().unwrap().to_string(),
                t["state"].as_str().unwrap().to_string(),
                t["lines"].as_i64().unwrap(),
            )
        })
        .collect()
}

fn the_four_states(world: &World, store: &StoreSel) {
    let tok = user_with_token(world, store, "dev@example.test", "member");
    let server = Server::start(world, store, &[]);
    let base = server.base.as_str();
    let me = get(base, &tok, "/api/v1/me", &[]).json()["id"].as_str().unwrap().to_string();
    let (same, changed, unlisted, missing) = (
        ".claude/projects/-w/same.jsonl",
        ".claude/projects/-w/changed.jsonl",
        ".claude/projects/-w/unlisted.jsonl",
        ".claude/projects/-w/missing.jsonl",
    );
    let content = b"{\"a\":1}\n{\"b\":2}\n";
    let rewritten = b"{\"a\":9}\n{\"b\":2}\n{\"c\":3}\n";
    // The session's transcript lines, then its transcript.file items, then its end record.
    let mut items = vec![
        claude_line("l-1", Some("S1"), Some(same), Some(0)),
        claude_line("l-2", Some("S1"), Some(same), Some(8)),
        claude_line("l-3", Some("S1"), Some(changed), Some(0)),
        // Another session's line for the same file is not counted.
        claude_line("l-4", Some("S2"), Some(same), Some(16)),
        transcript_file("S1", same, content.len(), &sha(content)),
        transcript_file("S1", changed, content.len(), &sha(content)),
        transcript_file("S1", unlisted, 3, &sha(b"abc")),
    ];
    items.push(end_record(
        "S1",
        json!([
            {"path": format!("/home/dev/{same}"), "file": same, "bytes": content.len(), "sha256": sha(content)},
            {"path": format!("/home/dev/{changed}"), "file": changed, "bytes": content.len(), "sha256": sha(content)},
            {"path": format!("/home/dev/{missing}"), "file": missing, "bytes": 5, "sha256": sha(b"12345")},
        ]),
    ));
    let r = post(world, base, &tok, &items);
    assert_eq!(r.status, 200, "{}", r.body);

    let r = transcripts_of(base, &tok, "S1", "");
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(
        (&v["session"], &v["user_id"], &v["truncated"]),
        (&json!("S1"), &json!(me), &json!(false))
    );
    let st = |f: &str, s: &str, n: i64| (f.to_string(), s.to_string(), n);
    assert_eq!(
        states(&v),
        vec![
            st(changed, "matches", 1),
            st(missing, "not_published", 0),
            st(same, "matches", 2),
            st(unlisted, "no_record", 0),
        ],
        "{v}"
    );
    let entry = |v: &Value, f: &str| {
        v["transcripts"].as_array().unwrap().iter().find(|t| t["file"] == f).unwrap().clone()
    };
    let e = entry(&v, same);
    assert_eq!(e["recorded"], json!({"bytes": content.len(), "sha256": sha(content)}));
    assert_eq!(e["published"]["bytes"], json!(content.len()));
    assert_eq!(e["published"]["sha256"], json!(sha(content)));
    assert!(e["published"]["received_at"].as_str().unwrap().ends_with('Z'), "{e}");
    assert!(entry(&v, missing)["published"].is_null());
    assert!(entry(&v, unlisted)["recorded"].is_null());

    // The file was rewritten after the session: the next publish reads another prefix. Its
    // transcript.file item is a dedup conflict (stored), and the latest item is compared.
    let r = post(
        world,
        base,
        &tok,
        &[transcript_file("S1", changed, rewritten.len(), &sha(rewritten))],
    );
    assert_eq!(codes(&r), vec![409], "{}", r.body);
    let v = transcripts_of(base, &tok, "S1", "").json();
    let e = entry(&v, changed);
    assert_eq!(e["state"], "differs", "{v}");
    assert_eq!(e["published"]["bytes"], json!(rewritten.len()));
    assert_eq!(e["recorded"]["bytes"], json!(content.len()));
    // The same prefix published again is a duplicate and changes nothing.
    let r = post(world, base, &tok, &[transcript_file("S1", same, content.len(), &sha(content))]);
    assert_eq!(codes(&r), vec![200], "{}", r.body);

    // No end record yet: every published file is `no_record`.
    let r = post(world, base, &tok, &[transcript_file("S2", same, content.len(), &sha(content))]);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = transcripts_of(base, &tok, "S2", "").json();
    assert_eq!(states(&v), vec![st(same, "no_record", 1)], "{v}");
    // A session nobody published anything for: an empty list, not an error.
    let v = transcripts_of(base, &tok, "nothing-here", "").json();
    assert_eq!(v["transcripts"], json!([]));
    // A session id is percent-decoded from the path.
    let r = post(world, base, &tok, &[transcript_file("a b+c", same, 1, &sha(b"x"))]);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = transcripts_of(base, &tok, "a%20b+c", "").json();
    assert_eq!(states(&v), vec![st(same, "no_record", 0)], "{v}");
    for bad in ["%zz", "%00", "%ff"] {
        assert_eq!(transcripts_of(base, &tok, bad, "").status, 400, "{bad}");
    }
    assert_eq!(transcripts_of(base, &tok, "S1", "?limit=3").status, 400);

    // transcript.file items that are not the contract's shape: each its own 400.
    let mut wrong_session = transcript_file("S3", same, 1, &sha(b"x"));
    wrong_session["session"] = json!("S4");
    let mut wrong_id = transcript_file("S3", same, 1, &sha(b"x"));
    wrong_id["id"] = json!("S3:whatever");
    let mut no_bytes = transcript_file("S3", same, 1, &sha(b"x"));
    no_bytes["payload"]["bytes"] = json!("1");
    let bad_sha = transcript_file("S3", same, 1, "md5:abc");
    let r = post(world, base, &tok, &[wrong_session, wrong_id, no_bytes, bad_sha]);
    assert_eq!(codes(&r), vec![400, 400, 400, 400], "{}", r.body);

    // Any other method: 405 with Allow.
    let auth = format!("Authorization: Bearer {tok}");
    let r = curl(&["-X", "POST", "-H", &auth, &format!("{base}/api/v1/sessions/S1/transcripts")]);
    assert_eq!(r.status, 405, "{}", r.body);
    assert!(r.headers.to_ascii_lowercase().contains("allow: get"), "{}", r.headers);
}

#[test]
fn published_transcripts_compare_with_the_session_record_embedded() {
    let world = World::new();
    the_four_states(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn published_transcripts_compare_with_the_session_record_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    the_four_states(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

fn scoped_like_events(world: &World, store: &StoreSel) {
    let member = user_with_token(world, store, "m@example.test", "member");
    let other = user_with_token(world, store, "other@example.test", "member");
    let rev = user_with_token(world, store, "rev@example.test", "reviewer");
    let server = Server::start(world, store, &[]);
    let base = server.base.as_str();
    let other_id = get(base, &other, "/api/v1/me", &[]).json()["id"].as_str().unwrap().to_string();
    let member_id =
        get(base, &member, "/api/v1/me", &[]).json()["id"].as_str().unwrap().to_string();
    let file = ".claude/projects/-w/a.jsonl";
    let r = post(world, base, &other, &[transcript_file("OS", file, 1, &sha(b"x"))]);
    assert_eq!(r.status, 200, "{}", r.body);

    // A member naming anyone else: the same 403 whether that user exists or not.
    let mut answers = Vec::new();
    for user in [other_id.as_str(), "other@example.test", "nobody@example.test", "0000", "x"] {
        let r = transcripts_of(base, &member, "OS", &format!("?user={user}"));
        assert_eq!(r.status, 403, "{user}: {}", r.body);
        assert!(!r.body.contains(file), "{}", r.body);
        answers.push(r.body);
    }
    assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
    // Without `user`, a member sees their own session of that id (nothing here).
    let v = transcripts_of(base, &member, "OS", "").json();
    assert_eq!((&v["user_id"], &v["transcripts"]), (&json!(member_id), &json!([])));
    for user in ["m@example.test", member_id.as_str()] {
        assert_eq!(transcripts_of(base, &member, "OS", &format!("?user={user}")).status, 200);
    }

    // A reviewer: unknown users are 404; another user's session is answered and recorded.
    for user in ["nobody@example.test", "0123456789abcdef0123456789abcdef"] {
        let r = transcripts_of(base, &rev, "OS", &format!("?user={user}"));
        assert_eq!(r.status, 404, "{user}: {}", r.body);
    }
    let r = transcripts_of(base, &rev, "OS", &format!("?user={other_id}"));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["user_id"], json!(other_id));
    assert_eq!(states(&v), vec![(file.to_string(), "no_record".to_string(), 0)]);
    let r = transcripts_of(base, &rev, "OS", "?user=other@example.test");
    assert_eq!(r.status, 200, "{}", r.body);
    let reads: Vec<Value> = all_events(base, &rev, "&source=external")
        .into_iter()
        .filter(|e| e["type"] == "airlock.review.read" && e["payload"]["what"] == "transcripts")
        .collect();
    assert_eq!(reads.len(), 2, "one record per read of another user: {reads:?}");
    for e in &reads {
        assert_eq!(e["payload"]["target_user"], json!(other_id), "{e}");
        assert_eq!(e["payload"]["session"], "OS", "{e}");
    }
    // The member's own reads and the refused ones recorded nothing.
    let own: Vec<Value> = all_events(base, &member, "&source=external");
    assert!(own.iter().all(|e| e["type"] != "airlock.review.read"), "{own:?}");
}

#[test]
fn session_transcripts_are_scoped_like_events_embedded() {
    let world = World::new();
    scoped_like_events(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn session_transcripts_are_scoped_like_events_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    scoped_like_events(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// An `external` envelope of exactly `size` bytes (its payload padded).
fn item_of(id: &str, size: usize) -> Vec<u8> {
    let base =
        json!({"id": id, "source": "external", "type": "blob", "ts": TS, "payload": {"d": ""}});
    let empty = base.to_string().len();
    let mut v = base;
    v["payload"]["d"] = json!("x".repeat(size - empty));
    let s = v.to_string().into_bytes();
    assert_eq!(s.len(), size);
    s
}

fn limits_in_bytes(world: &World, store: &StoreSel) {
    let tok = user_with_token(world, store, "dev@example.test", "member");
    let server = Server::start(world, store, &[]);
    let base = server.base.as_str();
    let send = |name: &str, body: &[u8]| {
        let f = write_file(world.tmp.path(), name, body);
        post_events(base, &tok, &f, "application/x-ndjson", &[])
    };
    // An item of exactly 1,000,000 bytes is stored; one byte more is that item's 413.
    let mut body = item_of("i-1000000", 1_000_000);
    body.push(b'\n');
    body.extend(item_of("i-1000001", 1_000_001));
    let r = send("items.ndjson", &body);
    assert_eq!(r.status, 207, "{}", r.body);
    assert_eq!(codes(&r), vec![201, 413], "{}", r.body);
    // A body of exactly 5,000,000 bytes is read; one byte more is refused whole.
    let mut body = Vec::new();
    for i in 0..4 {
        body.extend(item_of(&format!("b-{i}"), 999_999));
        body.push(b'\n');
    }
    body.extend(item_of("b-4", 5_000_000 - body.len()));
    assert_eq!(body.len(), 5_000_000);
    let r = send("body.ndjson", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(codes(&r), vec![201; 5]);
    body.push(b'\n');
    let r = send("over.ndjson", &body);
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(r.body.contains("5000000 bytes"), "{}", r.body);
}

#[test]
fn ingest_caps_are_exactly_1_000_000_and_5_000_000_bytes_embedded() {
    let world = World::new();
    limits_in_bytes(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn ingest_caps_are_exactly_1_000_000_and_5_000_000_bytes_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    limits_in_bytes(&world, &StoreSel::Pg(db.runtime_url.clone()));
}
