//! Flags are atomic with their events (issue 13, point 2): a server killed at any point of an
//! ingest never leaves a stored secret-bearing event without its flag, and the client's retry
//! (answered `duplicate` for what was stored) cannot lose one either. On both stores.
//!
//! Each round kills `airlockd review` while it ingests a batch of secret-bearing lines: either
//! by the `test-hooks` crash point (the server aborts at a named step) or by a `SIGKILL` after
//! a random delay, then restarts it, resends the batch like a client would, and checks that
//! every stored line of the batch is linked to a flag.

use crate::review_support::*;
use crate::support::{World, in_ci};
use serde_json::{Value, json};
use std::time::Duration;

/// The ingest steps the server can abort at (`AIRLOCK_TEST_REVIEW_CRASH_AT`).
const CRASH_STEPS: &[&str] = &["after-events", "after-flags", "after-commit"];
const LINES_PER_BATCH: usize = 40;

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).unwrap();
    u64::from_le_bytes(b)
}

/// Starts `airlockd review`, with the crash hook set to `crash_at` if given.
fn start(world: &World, store: &StoreSel, crash_at: Option<&str>) -> Server {
    let hook: Vec<(&str, &str)> =
        crash_at.map(|step| ("AIRLOCK_TEST_REVIEW_CRASH_AT", step)).into_iter().collect();
    Server::start_with_env(world, store, &[], "http", &hook)
}

/// A Claude Code user line carrying a (fake, well-formed) GitHub token.
fn secret_line(id: &str) -> Value {
    let token = format!("ghp_{}", &format!("{:0>36}", id.replace('-', "")).to_ascii_uppercase());
    json!({
        "id": id, "source": "claude", "type": "user", "ts": "2026-03-04T09:12:05.118Z",
        "session": "crash-session",
        "payload": {"type": "user", "uuid": id, "sessionId": "crash-session",
                    "timestamp": "2026-03-04T09:12:05.118Z",
                    "message": {"role": "user", "content": format!("use the token {token} to push")}}
    })
}

/// Stored events of this member that no flag links, among those with `prefix` ids.
fn unflagged(base: &str, token: &str, prefix: &str) -> Vec<String> {
    all_events(base, token, "&flagged=false")
        .iter()
        .filter_map(|e| e["id"].as_str())
        .filter(|id| id.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

fn flags_survive_kills(world: &World, store: StoreSel) {
    let member = user_with_token(world, &store, "crash@example.test", "member");
    let rounds = if in_ci() { 12 } else { 20 };
    let mut crashed = 0;
    for round in 0..rounds {
        let prefix = format!("r{round:02}-");
        let items: Vec<Value> =
            (0..LINES_PER_BATCH).map(|k| secret_line(&format!("{prefix}{k:04}"))).collect();
        let body = write_file(world.tmp.path(), &format!("b{round}.ndjson"), &ndjson(&items));
        // Even rounds abort at a named step; odd ones take a SIGKILL at a random moment.
        let step = (round % 2 == 0).then(|| CRASH_STEPS[(rand_u64() as usize) % CRASH_STEPS.len()]);
        let mut server = start(world, &store, step);
        let base = server.base.clone();
        let poster = {
            let (base, member, body) = (base.clone(), member.clone(), body.clone());
            std::thread::spawn(move || {
                post_events(&base, &member, &body, "application/x-ndjson", &[])
            })
        };
        if step.is_none() {
            std::thread::sleep(Duration::from_micros(rand_u64() % 30_000));
        }
        let answered = if step.is_some() {
            let r = poster.join().unwrap();
            r.status
        } else {
            server.child.kill().unwrap();
            poster.join().unwrap().status
        };
        let status = server.child.wait().unwrap();
        if !status.success() {
            crashed += 1;
        }
        assert!(
            step.is_none() || answered == 0,
            "round {round}: the server answered {answered} although it aborts at {step:?}: {}",
            server.log()
        );
        drop(server);
        // The restarted server: whatever is stored must be flagged, before and after the retry.
        let server = start(world, &store, None);
        let lost = unflagged(&server.base, &member, &prefix);
        assert!(
            lost.is_empty(),
            "round {round} ({}): {} stored secret-bearing events have no flag after the crash: {lost:?}",
            step.unwrap_or("SIGKILL"),
            lost.len()
        );
        let r = post_events(&server.base, &member, &body, "application/x-ndjson", &[]);
        assert_eq!(r.status, 200, "round {round}: the retry: {}", r.body);
        let lost = unflagged(&server.base, &member, &prefix);
        assert!(lost.is_empty(), "round {round}: unflagged after the retry: {lost:?}");
        let stored = all_events(&server.base, &member, "&flagged=true")
            .iter()
            .filter(|e| e["id"].as_str().is_some_and(|id| id.starts_with(&prefix)))
            .count();
        assert_eq!(stored, LINES_PER_BATCH, "round {round}: every line is stored and flagged");
    }
    assert!(crashed >= rounds / 2, "the crash hook never fired ({crashed} of {rounds} crashed)");
}

#[test]
fn flags_survive_kill_9_embedded() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("review-data"));
    flags_survive_kills(&world, store);
}

#[test]
fn flags_survive_kill_9_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    flags_survive_kills(&world, StoreSel::Pg(db.runtime_url.clone()));
}

/// Makes every flag insert fail (as a full disk or a lost connection mid-batch would), or
/// lifts that again.
fn refuse_flags(store: &StoreSel, db: Option<&PgDb>, on: bool) {
    match (store, db) {
        (StoreSel::Embedded(dir), _) => {
            let s = airlock::review::store::sqlite::SqliteStore::open(dir).unwrap();
            s.execute_raw(if on {
                "CREATE TRIGGER test_flags_refused BEFORE INSERT ON flags \
                 BEGIN SELECT RAISE(ABORT, 'test: flag insert refused'); END"
            } else {
                "DROP TRIGGER test_flags_refused"
            })
            .unwrap();
        }
        (StoreSel::Pg(_), Some(db)) => {
            db.owner_sql(if on {
                "CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS \
                 $$BEGIN RAISE EXCEPTION 'test: flag insert refused'; END$$; \
                 CREATE TRIGGER test_flags_refused BEFORE INSERT ON flags \
                 FOR EACH ROW EXECUTE FUNCTION test_refuse()"
            } else {
                "DROP TRIGGER test_flags_refused ON flags"
            })
            .unwrap();
        }
        (StoreSel::Pg(_), None) => unreachable!("a PostgreSQL store comes with its database"),
    }
}

/// A flag that cannot be written fails the batch (503, nothing stored), never a 200 with the
/// events stored unflagged; the retry then creates and flags every line.
fn flag_write_failure_fails_the_batch(world: &World, store: StoreSel, db: Option<&PgDb>) {
    let member = user_with_token(world, &store, "flagfail@example.test", "member");
    let server = start(world, &store, None);
    let items: Vec<Value> = (0..5).map(|k| secret_line(&format!("ff-{k:04}"))).collect();
    let body = write_file(world.tmp.path(), "ff.ndjson", &ndjson(&items));
    refuse_flags(&store, db, true);
    let r = post_events(&server.base, &member, &body, "application/x-ndjson", &[]);
    assert_eq!(r.status, 503, "a failed flag write must fail the batch: {}", r.body);
    assert!(r.headers.to_ascii_lowercase().contains("retry-after:"), "{}", r.headers);
    let stored: Vec<Value> = all_events(&server.base, &member, "")
        .into_iter()
        .filter(|e| e["id"].as_str().is_some_and(|id| id.starts_with("ff-")))
        .collect();
    assert!(stored.is_empty(), "nothing of a failed batch is stored: {stored:?}");
    refuse_flags(&store, db, false);
    let r = post_events(&server.base, &member, &body, "application/x-ndjson", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["created"], 5, "the retry creates every line: {}", r.body);
    assert!(unflagged(&server.base, &member, "ff-").is_empty());
}

#[test]
fn flag_write_failure_fails_the_batch_embedded() {
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("review-data"));
    flag_write_failure_fails_the_batch(&world, store, None);
}

#[test]
fn flag_write_failure_fails_the_batch_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    flag_write_failure_fails_the_batch(&world, StoreSel::Pg(db.runtime_url.clone()), Some(&db));
}
