//! Dedup conflicts are evidence (issue 13, point 6), on both stores through the real
//! `airlockd review`: a resend under a stored `(source, id)` with a different payload is a
//! `conflict` (409 in the 207), stored as its own event with `conflict_of`, scanned by
//! detection, and flagged `dedup.conflict` naming both hashes; a resend of any stored content
//! is a `duplicate`; Claude lines with the same message stay duplicates; a version-1 store
//! migrates with its keys' hashes backfilled.

use crate::review_support::*;
use crate::support::World;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// A fake, well-formed GitHub token (`secret.github-token` flags it).
const SECRET: &str = "ghp_R8x2Kq7LmN4pT9vW3yZ6bC1dF5gH0jS8aE2u";

/// An envelope as raw NDJSON text, so the payload's bytes are exactly `payload`.
fn line(source: &str, id: &str, session: &str, payload: &str) -> String {
    format!(
        r#"{{"id":"{id}","source":"{source}","type":"note","ts":"2026-03-04T09:12:05Z","session":"{session}","payload":{payload}}}"#
    )
}

fn sha_hex(payload: &str) -> String {
    hex::encode(Sha256::digest(payload.as_bytes()))
}

fn post(server: &Server, token: &str, lines: &[String]) -> Http {
    post_as(server, token, lines, "")
}

/// [`post`], through a body file of its own (`tag`), so concurrent posts never share one.
fn post_as(server: &Server, token: &str, lines: &[String], tag: &str) -> Http {
    let mut body = lines.join("\n").into_bytes();
    body.push(b'\n');
    let dir = std::env::temp_dir();
    let f = write_file(&dir, &format!("conflict-{}{tag}.ndjson", server.port), &body);
    let r = post_events(&server.base, token, &f, "application/x-ndjson", &[]);
    let _ = std::fs::remove_file(f);
    r
}

/// `(status, code)` of each result.
fn outcome(r: &Http) -> Vec<(String, u64)> {
    r.json()["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results: {}", r.body))
        .iter()
        .map(|x| (x["status"].as_str().unwrap().to_string(), x["code"].as_u64().unwrap()))
        .collect()
}

fn st(status: &str, code: u64) -> (String, u64) {
    (status.to_string(), code)
}

fn events_with_id(server: &Server, token: &str, id: &str) -> Vec<Value> {
    all_events(&server.base, token, "").into_iter().filter(|e| e["id"] == json!(id)).collect()
}

fn flags(server: &Server, reviewer: &str) -> Vec<Value> {
    let r = get(&server.base, reviewer, "/api/v1/flags?limit=1000", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["flags"].as_array().unwrap().clone()
}

fn links(f: &Value) -> Vec<i64> {
    f["events"].as_array().unwrap().iter().map(|p| p.as_i64().unwrap()).collect()
}

fn conflict_flags_of(all: &[Value], pk: i64) -> Vec<Value> {
    all.iter()
        .filter(|f| f["rule_id"] == "dedup.conflict" && links(f).contains(&pk))
        .cloned()
        .collect()
}

fn conflict_suite(world: &World, store: &StoreSel) {
    let tok = user_with_token(world, store, "ana@example.test", "member");
    let rev = user_with_token(world, store, "rev@example.test", "reviewer");
    let server = Server::start(world, store, &[]);

    // A benign line under the real line's id first; then the real line, carrying a secret.
    let benign = r#"{"text":"nothing to see"}"#;
    let real = format!(r#"{{"text":"push with {SECRET}"}}"#);
    let r = post(&server, &tok, &[line("external", "x-1", "s-1", benign)]);
    assert_eq!((r.status, outcome(&r)), (200, vec![st("created", 201)]), "{}", r.body);
    let r = post(&server, &tok, &[line("external", "x-1", "s-1", &real)]);
    assert_eq!((r.status, outcome(&r)), (207, vec![st("conflict", 409)]), "{}", r.body);
    let res = &r.json()["results"][0];
    assert_eq!(r.json()["conflict"], 1, "{}", r.body);
    let evs = events_with_id(&server, &tok, "x-1");
    assert_eq!(evs.len(), 2, "the conflicting content is stored: {evs:?}");
    let (original, conflict) = (evs[0]["pk"].as_i64().unwrap(), evs[1]["pk"].as_i64().unwrap());
    assert_eq!(evs[0]["conflict_of"], Value::Null);
    assert_eq!(evs[1]["conflict_of"], json!(original));
    assert_eq!(evs[1]["payload"]["text"], json!(format!("push with {SECRET}")));
    assert_eq!((res["pk"].as_i64(), res["conflict_of"].as_i64()), (Some(conflict), Some(original)));
    // The conflict is scanned like any event: the secret is flagged on it.
    let all = flags(&server, &rev);
    let secret = all
        .iter()
        .find(|f| f["rule_id"] == "secret.github-token")
        .unwrap_or_else(|| panic!("the secret in the conflict was not flagged: {all:?}"));
    assert_eq!(links(secret), vec![conflict]);
    // ... and the conflict itself is flagged, naming both events and both hashes.
    let dc = conflict_flags_of(&all, conflict);
    assert_eq!(dc.len(), 1, "{all:?}");
    assert_eq!(links(&dc[0]), vec![original, conflict]);
    let detail = dc[0]["detail"].as_str().unwrap();
    for want in [sha_hex(benign), sha_hex(&real), format!("event {original}")] {
        assert!(detail.contains(&want), "{want} not in {detail}");
    }

    // Retries never multiply conflicts: the conflict's and the original's bytes are duplicates.
    let r = post(
        &server,
        &tok,
        &[line("external", "x-1", "s-1", &real), line("external", "x-1", "s-1", benign)],
    );
    assert_eq!((r.status, outcome(&r)), (200, vec![st("duplicate", 200); 2]), "{}", r.body);
    let pks: Vec<i64> = r.json()["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["pk"].as_i64().unwrap_or(0))
        .collect();
    assert!(pks.iter().all(|p| *p == 0), "duplicates carry no pk field: {}", r.body);
    assert_eq!(events_with_id(&server, &tok, "x-1").len(), 2);
    assert_eq!(conflict_flags_of(&flags(&server, &rev), conflict).len(), 1);

    // A third content: a second conflict, also naming the original.
    let third = r#"{"text":"third"}"#;
    let r = post(&server, &tok, &[line("external", "x-1", "s-1", third)]);
    assert_eq!(outcome(&r), vec![st("conflict", 409)], "{}", r.body);
    let evs = events_with_id(&server, &tok, "x-1");
    assert_eq!(evs.len(), 3, "{evs:?}");
    assert_eq!(evs[2]["conflict_of"], json!(original));
    let all = flags(&server, &rev);
    let dcs: Vec<&Value> = all.iter().filter(|f| f["rule_id"] == "dedup.conflict").collect();
    assert_eq!(dcs.len(), 2, "{dcs:?}");
    assert!(dcs.iter().all(|f| links(f)[0] == original), "{dcs:?}");

    // Inside one batch on a new key: the first is the original, a different one a conflict,
    // a repeat of that conflict its duplicate, a repeat of the original the original's.
    let (a, b) = (r#"{"n":1}"#, r#"{"n":2}"#);
    let r = post(
        &server,
        &tok,
        &[
            line("external", "y-1", "s-1", a),
            line("external", "y-1", "s-1", b),
            line("external", "y-1", "s-1", b),
            line("external", "y-1", "s-1", a),
        ],
    );
    assert_eq!(
        outcome(&r),
        vec![st("created", 201), st("conflict", 409), st("duplicate", 200), st("duplicate", 200)],
        "{}",
        r.body
    );
    let evs = events_with_id(&server, &tok, "y-1");
    assert_eq!(evs.len(), 2, "{evs:?}");
    assert_eq!(evs[1]["conflict_of"], evs[0]["pk"]);
    assert!(!server.log().contains("unavailable"), "{}", server.log());
}

#[test]
fn conflicts_are_stored_scanned_and_flagged_embedded() {
    let world = World::new();
    conflict_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn conflicts_are_stored_scanned_and_flagged_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    conflict_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// A Claude Code user line of session `session` as an envelope (id = uuid).
fn claude_line(uuid: &str, session: &str, text: &str) -> String {
    let payload = json!({"type": "user", "uuid": uuid, "sessionId": session,
        "timestamp": "2026-03-04T09:00:00.000Z", "cwd": "/home/ana/src",
        "message": {"role": "user", "content": text}});
    json!({"id": uuid, "source": "claude", "type": "user", "ts": "2026-03-04T09:00:00.000Z",
           "session": session, "payload": payload})
    .to_string()
}

fn claude_suite(world: &World, store: &StoreSel) {
    let tok = user_with_token(world, store, "ana@example.test", "member");
    let rev = user_with_token(world, store, "rev@example.test", "reviewer");
    let server = Server::start(world, store, &[]);
    let r = post(&server, &tok, &[claude_line("c-1", "sess-a", "deploy it")]);
    assert_eq!(outcome(&r), vec![st("created", 201)], "{}", r.body);
    // A resumed session copies the line under its own sessionId (other bytes, same message);
    // a stream-json repeat sends it again byte for byte. Both stay duplicates.
    let r = post(
        &server,
        &tok,
        &[claude_line("c-1", "sess-b", "deploy it"), claude_line("c-1", "sess-a", "deploy it")],
    );
    assert_eq!((r.status, outcome(&r)), (200, vec![st("duplicate", 200); 2]), "{}", r.body);
    assert_eq!(events_with_id(&server, &tok, "c-1").len(), 1);
    // A changed message under the same uuid is a conflict, and its secret is flagged.
    let changed = claude_line("c-1", "sess-b", &format!("deploy it with {SECRET}"));
    let r = post(&server, &tok, std::slice::from_ref(&changed));
    assert_eq!((r.status, outcome(&r)), (207, vec![st("conflict", 409)]), "{}", r.body);
    let evs = events_with_id(&server, &tok, "c-1");
    assert_eq!(evs.len(), 2, "{evs:?}");
    assert_eq!(evs[1]["conflict_of"], evs[0]["pk"]);
    let conflict = evs[1]["pk"].as_i64().unwrap();
    let all = flags(&server, &rev);
    assert!(
        all.iter().any(|f| f["rule_id"] == "secret.github-token" && links(f) == vec![conflict]),
        "{all:?}"
    );
    assert_eq!(conflict_flags_of(&all, conflict).len(), 1, "{all:?}");
    // The changed line resent from yet another session: the same message as the conflict,
    // so a duplicate of it.
    let again = claude_line("c-1", "sess-c", &format!("deploy it with {SECRET}"));
    let r = post(&server, &tok, &[again]);
    assert_eq!(outcome(&r), vec![st("duplicate", 200)], "{}", r.body);
    assert_eq!(events_with_id(&server, &tok, "c-1").len(), 2);
}

#[test]
fn claude_same_message_is_duplicate_changed_is_conflict_embedded() {
    let world = World::new();
    claude_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn claude_same_message_is_duplicate_changed_is_conflict_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    claude_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// The payload of the event a version-1 store holds (spacing kept: its bytes are hashed).
const LEGACY_PAYLOAD: &str = r#"{ "text": "from v1",  "n": 1 }"#;

/// Rows a version-1 store holds: a member and one event with its key.
fn legacy_rows(now: &str) -> String {
    format!(
        "INSERT INTO users(id, email, created_at) VALUES ('legacy-user', 'legacy@example.test', {now});
         INSERT INTO user_roles(user_id, role, at) VALUES ('legacy-user', 'member', {now});
         INSERT INTO events(pk, user_id, source, id, type, ts, session, seq, boot, received_at, payload)
           VALUES (1, 'legacy-user', 'external', 'old-1', 'note', 1, 's', NULL, NULL, {now}, '{LEGACY_PAYLOAD}');
         INSERT INTO event_keys(user_id, source, id, pk, received_at)
           VALUES ('legacy-user', 'external', 'old-1', 1, {now});"
    )
}

/// After migrating a version-1 store: the old key's hash was backfilled, so a resend of the
/// stored bytes is a duplicate and another content a conflict naming the original's hash.
fn after_v1_migration(world: &World, store: &StoreSel, backfilled: &str) {
    assert_eq!(backfilled, sha_hex(LEGACY_PAYLOAD), "migration 2 backfills the key's hash");
    let tok = token_for(world, store, "legacy@example.test");
    let server = Server::start(world, store, &[]);
    let r = post(&server, &tok, &[line("external", "old-1", "s", LEGACY_PAYLOAD)]);
    assert_eq!(outcome(&r), vec![st("duplicate", 200)], "{}", r.body);
    let r = post(&server, &tok, &[line("external", "old-1", "s", r#"{"text":"new"}"#)]);
    assert_eq!(outcome(&r), vec![st("conflict", 409)], "{}", r.body);
    assert_eq!(r.json()["results"][0]["conflict_of"], 1);
    let evs = events_with_id(&server, &tok, "old-1");
    assert_eq!(evs.len(), 2, "{evs:?}");
}

#[test]
fn a_version_1_store_migrates_with_hashes_embedded() {
    let world = World::new();
    let dir = world.tmp.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    let db = dir.join("review.db");
    let v1 = include_str!("../../src/review/migrations/sqlite_0001.sql");
    let script = format!(
        "{v1}\nINSERT INTO schema_migrations(version, applied_at) VALUES (1, 1);\n{}",
        legacy_rows("1")
    );
    let run = |code: &str, arg: &str| {
        let out = std::process::Command::new("python3")
            .args(["-c", code, &db.display().to_string(), arg])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    run(
        "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2]); c.commit()",
        &script,
    );
    let store = StoreSel::Embedded(dir);
    // Any command opening the store migrates it.
    let tok_check = token_for(&world, &store, "legacy@example.test");
    assert!(tok_check.starts_with("alk_"));
    let hash = run(
        "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); \
         print(c.execute(\"SELECT hex(sha256) FROM event_keys WHERE id='old-1'\").fetchone()[0].lower())",
        "",
    );
    after_v1_migration(&world, &store, &hash);
}

#[test]
fn a_version_1_store_migrates_with_hashes_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    let v1 = include_str!("../../src/review/migrations/pg_0001.sql");
    db.owner_sql(&format!(
        "CREATE TABLE schema_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());
         {v1}
         INSERT INTO schema_migrations(version) VALUES (1);
         SELECT setval('events_pk_seq', 1);
         {}",
        legacy_rows("'2020-01-15T00:00:00Z'")
    ))
    .unwrap();
    db.migrate(&world);
    let hash =
        db.owner_sql("SELECT encode(sha256, 'hex') FROM event_keys WHERE id = 'old-1'").unwrap();
    after_v1_migration(&world, &StoreSel::Pg(db.runtime_url.clone()), &hash);
}

/// Batches of one user racing on the same keys (issue 13, small gaps: untested on
/// PostgreSQL, where two transactions decide the same keys): 6 concurrent uploads of the same
/// 40 ids, half with content A and half with content B, end with exactly the original and
/// one conflict per id, every other item a duplicate, and one `dedup.conflict` flag per
/// conflict — retries and races never multiply conflicts.
fn racing_suite(world: &World, store: &StoreSel) {
    let tok = user_with_token(world, store, "ana@example.test", "member");
    let rev = user_with_token(world, store, "rev@example.test", "reviewer");
    // Every upload in flight at once: the per-user share would otherwise answer some 429.
    let slots = ["--ingest-concurrency", "8", "--ingest-concurrency-per-user", "6"];
    let server = Server::start(world, store, &slots);
    let ids: Vec<String> = (0..40).map(|i| format!("race-{i}")).collect();
    let batch = |content: &str| -> Vec<String> {
        ids.iter()
            .map(|id| line("external", id, "s-race", &format!(r#"{{"text":"{content} {id}"}}"#)))
            .collect()
    };
    let (a, b) = (batch("content A"), batch("content B"));
    let results: Vec<Http> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|k| {
                let (server, tok, lines) = (&server, &tok, if k % 2 == 0 { &a } else { &b });
                s.spawn(move || post_as(server, tok, lines, &format!("-race-{k}")))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut per_status: std::collections::BTreeMap<String, usize> = Default::default();
    let mut per_post = Vec::new();
    for r in &results {
        assert!(r.status == 200 || r.status == 207, "{} {}", r.status, r.body);
        let j = r.json();
        per_post.push((j["created"].clone(), j["duplicate"].clone(), j["conflict"].clone()));
        for (status, _) in outcome(r) {
            *per_status.entry(status).or_default() += 1;
        }
    }
    let n = ids.len();
    let want: std::collections::BTreeMap<String, usize> =
        [("conflict".into(), n), ("created".into(), n), ("duplicate".into(), 4 * n)].into();
    assert_eq!(per_status, want, "(created, duplicate, conflict) per upload: {per_post:?}");
    let all = all_events(&server.base, &tok, "");
    for id in &ids {
        let evs: Vec<&Value> = all.iter().filter(|e| e["id"] == json!(id)).collect();
        assert_eq!(evs.len(), 2, "{id}: {evs:?}");
        assert_eq!(evs[0]["conflict_of"], Value::Null, "{id}: {evs:?}");
        assert_eq!(evs[1]["conflict_of"], evs[0]["pk"], "{id}: {evs:?}");
        assert_ne!(evs[0]["payload"], evs[1]["payload"], "{id}: {evs:?}");
    }
    let fl = flags(&server, &rev);
    let conflicts = fl.iter().filter(|f| f["rule_id"] == "dedup.conflict").count();
    assert_eq!(conflicts, n, "{fl:?}");
}

#[test]
fn racing_batches_never_multiply_conflicts_embedded() {
    let world = World::new();
    racing_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn racing_batches_never_multiply_conflicts_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    racing_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}
