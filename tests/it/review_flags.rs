//! Acting on flags, on both stores through the real `airlockd review`: nobody acts on a flag
//! raised on their own history except the store's sole reviewer/admin or an admin override, and
//! such actions are marked `"self": true`; a flag carries its whole state history (who, when,
//! note) with the latest actor; a reviewer's read of other people's flags is recorded like a
//! read of their events.

use crate::review_support::*;
use crate::support::World;
use serde_json::{Value, json};

/// Posts a denied connection to pastebin.com as `token`'s user (it raises a flag on them) and
/// returns the first flag raised on that user (its id, as a reviewer sees it): one flag per
/// user, so a test wanting two flags raises them on two users.
pub(crate) fn raise_flag(
    world: &World,
    base: &str,
    token: &str,
    reviewer: &str,
    id: &str,
) -> String {
    let f = write_file(
        world.tmp.path(),
        &format!("{id}.ndjson"),
        &ndjson(&[egress(id, "pastebin.com", false)]),
    );
    let r = post_events(base, token, &f, "application/x-ndjson", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let me = get(base, token, "/api/v1/me", &[]).json();
    let flags =
        get(base, reviewer, &format!("/api/v1/flags?user={}", me["id"].as_str().unwrap()), &[]);
    assert_eq!(flags.status, 200, "{}", flags.body);
    let flags = flags.json();
    flags["flags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["events"].as_array().is_some_and(|e| !e.is_empty()))
        .unwrap_or_else(|| panic!("no flag raised on {id}: {flags}"))["id"]
        .as_str()
        .unwrap()
        .to_string()
}

pub(crate) fn act(base: &str, token: &str, flag: &str, body: &Value) -> Http {
    let auth = format!("Authorization: Bearer {token}");
    let body = body.to_string();
    curl(&[
        "-H",
        &auth,
        "-H",
        "Content-Type: application/json",
        "-d",
        &body,
        &format!("{base}/api/v1/flags/{flag}"),
    ])
}

pub(crate) fn user_id(base: &str, token: &str) -> String {
    get(base, token, "/api/v1/me", &[]).json()["id"].as_str().unwrap().to_string()
}

/// The flag as `GET /api/v1/flags` lists it.
pub(crate) fn listed(base: &str, token: &str, flag: &str) -> Value {
    let all = get(base, token, "/api/v1/flags?limit=1000", &[]).json();
    all["flags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == flag)
        .unwrap_or_else(|| panic!("flag {flag} not listed: {all}"))
        .clone()
}

/// A store with an admin and two reviewers: a reviewer cannot act on their own flag (403 that
/// says why and what to do), another reviewer can (`self: false`), a reviewer's `override` is
/// refused, an admin's override on their own flag is accepted and marked `self: true`.
fn self_actions_suite(world: &World, store: &StoreSel) {
    let admin = user_with_token(world, store, "admin@example.test", "admin");
    let rev1 = user_with_token(world, store, "rev1@example.test", "reviewer");
    let rev2 = user_with_token(world, store, "rev2@example.test", "reviewer");
    let server = Server::start(world, store, &[]);
    let base = server.base.as_str();
    let own = raise_flag(world, base, &rev1, &rev2, "own-1");

    let r = act(base, &rev1, &own, &json!({"action": "dismiss", "note": "mine, fine"}));
    assert_eq!(r.status, 403, "a reviewer dismissed a flag on their own history: {}", r.body);
    let msg = r.json()["error"].as_str().unwrap().to_string();
    assert!(msg.contains("your own history"), "the 403 says why: {msg}");
    assert!(msg.contains("another reviewer"), "the 403 says what to do: {msg}");
    // Nothing was appended: the flag is still open with no history.
    let f = listed(base, &rev2, &own);
    assert_eq!(f["state"], "open", "{f}");
    assert_eq!(f["history"], json!([]), "{f}");
    // Override is for admins only.
    let r = act(base, &rev1, &own, &json!({"action": "dismiss", "override": true}));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.json()["error"].as_str().unwrap().contains("admin"), "{}", r.body);
    // Another reviewer acts normally.
    let r = act(base, &rev2, &own, &json!({"action": "acknowledge"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["self"], false, "{}", r.body);
    assert_eq!(r.json()["history"][0]["self"], false, "{}", r.body);

    // An admin's own flag: refused without override, accepted and marked with it.
    let admin_flag = raise_flag(world, base, &admin, &rev2, "own-2");
    let r = act(base, &admin, &admin_flag, &json!({"action": "resolve"}));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.json()["error"].as_str().unwrap().contains("override"), "{}", r.body);
    let r = act(base, &admin, &admin_flag, &json!({"action": "resolve", "override": true}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["state"], "resolved", "{v}");
    assert_eq!(v["self"], true, "{v}");
    assert_eq!(v["history"][0]["self"], true, "{v}");
    assert_eq!(v["actor"], json!(user_id(base, &admin)), "{v}");
    // A non-boolean override is the client's mistake.
    let r = act(base, &admin, &admin_flag, &json!({"action": "reopen", "override": "yes"}));
    assert_eq!(r.status, 400, "{}", r.body);
}

#[test]
fn reviewers_cannot_dismiss_flags_on_their_own_history_embedded() {
    let world = World::new();
    self_actions_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn reviewers_cannot_dismiss_flags_on_their_own_history_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    self_actions_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// The sole reviewer/admin of a store acts on their own flags (nobody else could), marked
/// `self: true`; once a second reviewer exists, the same action is refused.
fn sole_reviewer_suite(world: &World, store: &StoreSel) {
    let admin = user_with_token(world, store, "solo@example.test", "admin");
    let member = user_with_token(world, store, "m@example.test", "member");
    let server = Server::start(world, store, &[]);
    let base = server.base.as_str();
    let flag = raise_flag(world, base, &admin, &admin, "solo-1");
    let r = act(base, &admin, &flag, &json!({"action": "acknowledge", "note": "only me here"}));
    assert_eq!(r.status, 200, "the sole admin may act on their own flag: {}", r.body);
    assert_eq!(r.json()["self"], true, "{}", r.body);
    assert_eq!(r.json()["history"][0]["self"], true, "{}", r.body);
    // A member's flag is not a self-action.
    let mflag = raise_flag(world, base, &member, &admin, "solo-2");
    let r = act(base, &admin, &mflag, &json!({"action": "resolve"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["self"], false, "{}", r.body);
    // With a second reviewer the admin is no longer alone.
    user_with_token(world, store, "second@example.test", "reviewer");
    let r = act(base, &admin, &flag, &json!({"action": "resolve"}));
    assert_eq!(r.status, 403, "{}", r.body);
}

#[test]
fn sole_admin_acts_on_own_flags_marked_self_embedded() {
    let world = World::new();
    sole_reviewer_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn sole_admin_acts_on_own_flags_marked_self_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    sole_reviewer_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// Flag JSON shows its history oldest first (state, actor, at, note, self) and the latest
/// actor, in the POST answer and in the listing alike.
fn history_suite(world: &World, store: &StoreSel) {
    let member = user_with_token(world, store, "m@example.test", "member");
    let rev1 = user_with_token(world, store, "rev1@example.test", "reviewer");
    let rev2 = user_with_token(world, store, "rev2@example.test", "reviewer");
    let server = Server::start(world, store, &[]);
    let base = server.base.as_str();
    let flag = raise_flag(world, base, &member, &rev1, "h-1");
    let fresh = listed(base, &rev1, &flag);
    assert_eq!(fresh["history"], json!([]), "{fresh}");
    assert_eq!(fresh["actor"], Value::Null, "{fresh}");
    assert_eq!(fresh["self"], false, "{fresh}");
    let r = act(base, &rev1, &flag, &json!({"action": "acknowledge", "note": "looking"}));
    assert_eq!(r.status, 200, "{}", r.body);
    let r = act(base, &rev2, &flag, &json!({"action": "resolve", "note": "benign"}));
    assert_eq!(r.status, 200, "{}", r.body);
    let (id1, id2) = (user_id(base, &rev1), user_id(base, &rev2));
    for v in [r.json(), listed(base, &rev1, &flag)] {
        assert_eq!(v["state"], "resolved", "{v}");
        assert_eq!(v["actor"], json!(id2), "{v}");
        assert_eq!(v["note"], "benign", "{v}");
        let h = v["history"].as_array().unwrap_or_else(|| panic!("no history: {v}"));
        assert_eq!(h.len(), 2, "{v}");
        assert_eq!(
            (&h[0]["state"], &h[0]["actor"], &h[0]["note"], &h[0]["self"]),
            (&json!("acknowledged"), &json!(id1), &json!("looking"), &json!(false)),
            "{v}"
        );
        assert_eq!(
            (&h[1]["state"], &h[1]["actor"], &h[1]["note"]),
            (&json!("resolved"), &json!(id2), &json!("benign")),
            "{v}"
        );
        let (a, b) = (h[0]["at"].as_str().unwrap(), h[1]["at"].as_str().unwrap());
        assert!(a.ends_with('Z') && a <= b, "RFC 3339, oldest first: {a} {b}");
    }
    // A member sees their own flag's history too.
    let mine = get(base, &member, "/api/v1/flags", &[]).json();
    assert_eq!(mine["flags"][0]["history"].as_array().map(Vec::len), Some(2), "{mine}");
}

#[test]
fn flag_json_shows_actor_and_history_embedded() {
    let world = World::new();
    history_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn flag_json_shows_actor_and_history_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    history_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// A reviewer listing another user's flags (or everyone's) leaves an `airlock.review.read`
/// event in the reviewer's history first; a member listing their own flags does not.
fn flag_reads_suite(world: &World, store: &StoreSel) {
    let member = user_with_token(world, store, "m@example.test", "member");
    let rev = user_with_token(world, store, "rev@example.test", "reviewer");
    let server = Server::start(world, store, &[]);
    let base = server.base.as_str();
    raise_flag(world, base, &member, &rev, "r-1");
    let (mid, rid) = (user_id(base, &member), user_id(base, &rev));
    let reads = || {
        all_events(base, &rev, &format!("&user={rid}&source=external"))
            .into_iter()
            .filter(|e| e["type"] == "airlock.review.read" && e["payload"]["what"] == "flags")
            .collect::<Vec<_>>()
    };
    let before = reads().len();
    let r = get(base, &rev, "/api/v1/flags?user=m@example.test&state=open", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let after = reads();
    assert_eq!(after.len(), before + 1, "the flag read was not recorded: {after:?}");
    let rec = &after[after.len() - 1]["payload"];
    assert_eq!(rec["target_user"], json!(mid), "{rec}");
    assert_eq!(rec["reader"], json!(rid), "{rec}");
    assert_eq!(rec["state"], "open", "{rec}");
    // Everyone's flags: recorded with no target user.
    get(base, &rev, "/api/v1/flags", &[]);
    let all = reads();
    assert_eq!(all.len(), before + 2, "{all:?}");
    assert_eq!(all[all.len() - 1]["payload"]["target_user"], Value::Null);
    // A member's own flags are not someone else's.
    get(base, &member, "/api/v1/flags", &[]);
    let own_reads: Vec<_> = all_events(base, &member, "&source=external")
        .into_iter()
        .filter(|e| e["type"] == "airlock.review.read")
        .collect();
    assert!(own_reads.is_empty(), "{own_reads:?}");
}

#[test]
fn reviewer_reads_of_others_flags_are_recorded_embedded() {
    let world = World::new();
    flag_reads_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn reviewer_reads_of_others_flags_are_recorded_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    flag_reads_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// Migration 3 on a PostgreSQL store left at version 1 by an older server: the flag state it
/// holds reads back as a plain (not self) action in the flag's history.
#[test]
fn migration_3_applies_to_a_version_1_store_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.owner_sql(
        "CREATE TABLE schema_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .unwrap();
    db.owner_sql(include_str!("../../src/review/migrations/pg_0001.sql")).unwrap();
    db.owner_sql(
        "INSERT INTO schema_migrations(version) VALUES (1);
         INSERT INTO flags(id, rule_id, title, severity, user_id, detail)
           VALUES ('old-flag', 'r', 'an old flag', 'low', 'someone', 'd');
         INSERT INTO flag_states(flag_id, state, note, actor, at)
           VALUES ('old-flag', 'acknowledged', 'before 3', 'old-actor', now());",
    )
    .unwrap();
    db.migrate(&world);
    assert_eq!(
        db.owner_sql("SELECT count(*) FROM schema_migrations WHERE version = 3").unwrap(),
        "1",
        "migration 3 applied to the version-1 store"
    );
    let store = StoreSel::Pg(db.runtime_url.clone());
    let rev = user_with_token(&world, &store, "rev@example.test", "reviewer");
    let server = Server::start(&world, &store, &[]);
    let f = listed(&server.base, &rev, "old-flag");
    assert_eq!(f["state"], "acknowledged", "{f}");
    assert_eq!(f["actor"], "old-actor", "{f}");
    assert_eq!(f["self"], false, "{f}");
    assert_eq!(f["history"][0]["note"], "before 3", "{f}");
}
