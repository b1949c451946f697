//! Flag assignment (issue 17) on both stores through the real `airlockd review`:
//! `POST /api/v1/flags/{id}` with `{"action": "assign", "assignee": EMAIL | null}` appends a
//! history row that keeps the flag's state and names the assignee; the same role and
//! self-action rules as the state actions; `GET /api/v1/flags?assignee=` filters on the latest
//! assignment. On PostgreSQL the row is written by `airlock_flag_assign`; a store migrated by
//! the previous release (through migration 7) upgrades and keeps its history.

use crate::review_flags::{act, listed, raise_flag, user_id};
use crate::review_support::*;
use crate::support::World;
use serde_json::{Value, json};

/// The ids of the flags `GET /api/v1/flags?{query}` lists for `token` (status asserted 200).
fn listed_ids(base: &str, token: &str, query: &str) -> Vec<String> {
    let r = get(base, token, &format!("/api/v1/flags?limit=1000&{query}"), &[]);
    assert_eq!(r.status, 200, "{query}: {}", r.body);
    r.json()["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect()
}

/// (action, actor, assignee) of each history row, oldest first; `assignee` is absent (`None`)
/// on a state action.
fn rows(v: &Value) -> Vec<(String, String, Option<Value>)> {
    v["history"]
        .as_array()
        .unwrap_or_else(|| panic!("no history: {v}"))
        .iter()
        .map(|h| {
            (
                h["action"].as_str().unwrap().to_string(),
                h["actor"].as_str().unwrap().to_string(),
                h.get("assignee").cloned(),
            )
        })
        .collect()
}

fn assign_suite(world: &World, store: &StoreSel) {
    let adm = user_with_token(world, store, "adm@example.test", "admin");
    let rev1 = user_with_token(world, store, "rev1@example.test", "reviewer");
    let rev2 = user_with_token(world, store, "rev2@example.test", "reviewer");
    let member = user_with_token(world, store, "m@example.test", "member");
    let member2 = user_with_token(world, store, "m2@example.test", "member");
    let server = Server::start(world, store, &[]);
    let base = server.base.as_str();
    let (adm_id, r1, r2) = (user_id(base, &adm), user_id(base, &rev1), user_id(base, &rev2));
    let flag = raise_flag(world, base, &member, &rev1, "as-1");
    let other = raise_flag(world, base, &member2, &rev1, "as-2");

    // Assign: the state is kept (open), the assignee is set, the row records who and to whom.
    let r = act(
        base,
        &rev1,
        &flag,
        &json!({"action": "assign", "assignee": "rev2@example.test", "note": "yours"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["state"], "open", "assignment keeps the state: {v}");
    assert_eq!(
        (&v["assignee"], &v["assignee_email"]),
        (&json!(r2), &json!("rev2@example.test")),
        "{v}"
    );
    let h = &v["history"][0];
    assert_eq!(
        (&h["action"], &h["state"], &h["note"]),
        (&json!("assign"), &json!("open"), &json!("yours")),
        "{v}"
    );
    assert_eq!(h["assignee_email"], "rev2@example.test", "{v}");

    // A state action keeps the assignee; a reassignment keeps the state.
    let r = act(base, &rev1, &flag, &json!({"action": "acknowledge", "note": "looking"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (&r.json()["state"], &r.json()["assignee"]),
        (&json!("acknowledged"), &json!(r2)),
        "{}",
        r.body
    );
    assert!(
        r.json()["history"][1].get("assignee").is_none(),
        "a state row carries no assignee: {}",
        r.body
    );
    let r = act(base, &rev2, &flag, &json!({"action": "assign", "assignee": "rev1@example.test"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["state"], "acknowledged", "reassignment keeps the state: {}", r.body);
    assert_eq!(r.json()["assignee"], json!(r1), "{}", r.body);

    // The filter follows the latest assignment (id or email), `none` the unassigned.
    assert_eq!(listed_ids(base, &rev1, "assignee=rev1@example.test"), vec![flag.clone()]);
    assert_eq!(listed_ids(base, &rev1, &format!("assignee={r1}")), vec![flag.clone()]);
    assert!(
        listed_ids(base, &rev1, &format!("assignee={r2}")).is_empty(),
        "reassigned away from rev2"
    );
    let none = listed_ids(base, &rev1, "assignee=none");
    assert!(none.contains(&other) && !none.contains(&flag), "{none:?}");
    // Combined with the other filters.
    assert_eq!(
        listed_ids(base, &rev1, "assignee=rev1@example.test&state=acknowledged"),
        vec![flag.clone()]
    );
    assert!(listed_ids(base, &rev1, "assignee=rev1@example.test&state=open").is_empty());

    // Unassign: `"assignee": null`; the state is still acknowledged.
    let r = act(base, &adm, &flag, &json!({"action": "assign", "assignee": null}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(
        (&v["state"], &v["assignee"], &v["assignee_email"]),
        (&json!("acknowledged"), &Value::Null, &Value::Null),
        "{v}"
    );
    assert!(listed_ids(base, &rev1, "assignee=none").contains(&flag));
    assert!(listed_ids(base, &rev1, "assignee=rev1@example.test").is_empty());

    // The whole history, in order, with actors and assignees; the listing shows the same.
    let want = vec![
        ("assign".to_string(), r1.clone(), Some(json!(r2))),
        ("acknowledge".to_string(), r1.clone(), None),
        ("assign".to_string(), r2.clone(), Some(json!(r1))),
        ("assign".to_string(), adm_id.clone(), Some(Value::Null)),
    ];
    assert_eq!(rows(&v), want, "{v}");
    let l = listed(base, &rev2, &flag);
    assert_eq!(rows(&l), want, "{l}");
    assert_eq!((&l["state"], &l["assignee"]), (&json!("acknowledged"), &Value::Null), "{l}");
    let h = l["history"].as_array().unwrap();
    let ats: Vec<&str> = h.iter().map(|x| x["at"].as_str().unwrap()).collect();
    assert!(ats.windows(2).all(|w| w[0] <= w[1]), "oldest first: {ats:?}");

    // Refusals append nothing.
    let before = listed(base, &rev1, &flag)["history"].as_array().unwrap().len();
    let r = act(base, &rev1, &flag, &json!({"action": "assign", "assignee": "ghost@example.test"}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.json()["error"].as_str().unwrap().contains("ghost@example.test"),
        "names the email: {}",
        r.body
    );
    let r = act(base, &rev1, &flag, &json!({"action": "assign", "assignee": "m@example.test"}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.json()["error"].as_str().unwrap().contains("only reviewers and admins can be assigned"),
        "{}",
        r.body
    );
    let r =
        act(base, &member, &flag, &json!({"action": "assign", "assignee": "rev1@example.test"}));
    assert_eq!(r.status, 403, "a member assigned: {}", r.body);
    let r = act(base, &rev1, &flag, &json!({"action": "assign"}));
    assert_eq!(r.status, 400, "no assignee: {}", r.body);
    let r =
        act(base, &rev1, &flag, &json!({"action": "assign", "assignee": "a\u{0}@example.test"}));
    assert_eq!(r.status, 400, "a NUL in the assignee: {}", r.body);
    let r = act(base, &rev1, &flag, &json!({"action": "resolve", "assignee": "rev1@example.test"}));
    assert_eq!(r.status, 400, "an assignee on a state action: {}", r.body);
    let r = act(
        base,
        &rev1,
        "no-such-flag",
        &json!({"action": "assign", "assignee": "rev1@example.test"}),
    );
    assert_eq!(r.status, 404, "{}", r.body);
    let after = listed(base, &rev1, &flag);
    assert_eq!(after["history"].as_array().unwrap().len(), before, "{after}");

    // The self-action rule: nobody assigns a flag raised on their own history…
    let own = raise_flag(world, base, &rev1, &rev2, "as-own");
    let r = act(base, &rev1, &own, &json!({"action": "assign", "assignee": "rev2@example.test"}));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.json()["error"].as_str().unwrap().contains("your own history"), "{}", r.body);
    assert_eq!(listed(base, &rev2, &own)["history"], json!([]));
    // …except an admin by override, marked self.
    let admin_own = raise_flag(world, base, &adm, &rev2, "as-adm");
    let r =
        act(base, &adm, &admin_own, &json!({"action": "assign", "assignee": "rev1@example.test"}));
    assert_eq!(r.status, 403, "{}", r.body);
    let r = act(
        base,
        &adm,
        &admin_own,
        &json!({"action": "assign", "assignee": "rev1@example.test", "override": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (&r.json()["self"], &r.json()["history"][0]["self"]),
        (&json!(true), &json!(true)),
        "{}",
        r.body
    );
    assert_eq!(r.json()["state"], "open", "{}", r.body);

    // Filter errors: an unknown email is a 404 for reviewers; a member's filter on anyone
    // matches only their own flags, and an unknown email tells them nothing.
    let r = get(base, &rev1, "/api/v1/flags?assignee=ghost@example.test", &[]);
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(listed_ids(base, &member, "assignee=ghost@example.test").is_empty());
    let mine = listed_ids(base, &member, "assignee=none");
    assert!(mine.contains(&flag) && !mine.contains(&own), "{mine:?}");
}

#[test]
fn flags_are_assigned_reassigned_and_unassigned_embedded() {
    let world = World::new();
    assign_suite(&world, &StoreSel::Embedded(world.tmp.path().join("d")));
}

#[test]
fn flags_are_assigned_reassigned_and_unassigned_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    db.migrate(&world);
    assign_suite(&world, &StoreSel::Pg(db.runtime_url.clone()));
}

/// A PostgreSQL store as the previous release left it (migrations 1–7, a flag with a state
/// row) upgrades: migration 9 applies, the old row reads as a state action with no assignee,
/// and the flag is then assigned keeping its state.
#[test]
fn a_store_at_migration_7_upgrades_and_assigns_postgres() {
    let Some(db) = PgDb::create() else { return };
    let world = World::new();
    let migrations = [
        include_str!("../../src/review/migrations/pg_0001.sql"),
        include_str!("../../src/review/migrations/pg_0002.sql"),
        include_str!("../../src/review/migrations/pg_0003.sql"),
        include_str!("../../src/review/migrations/pg_0004.sql"),
        include_str!("../../src/review/migrations/pg_0005.sql"),
        include_str!("../../src/review/migrations/pg_0006.sql"),
        include_str!("../../src/review/migrations/pg_0007.sql"),
    ];
    db.owner_sql(
        "CREATE TABLE schema_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .unwrap();
    for (i, sql) in migrations.iter().enumerate() {
        let v = i + 1;
        db.owner_sql(&format!(
            "BEGIN; {sql}; INSERT INTO schema_migrations(version) VALUES ({v}); COMMIT;"
        ))
        .unwrap_or_else(|e| panic!("migration {v}: {e}"));
    }
    db.owner_sql(
        "INSERT INTO flags(id, rule_id, title, severity, user_id, detail)
           VALUES ('old-flag', 'r', 'an old flag', 'low', 'someone', 'd');
         INSERT INTO flag_states(flag_id, state, note, actor, at)
           VALUES ('old-flag', 'resolved', 'before 9', 'old-actor', now());",
    )
    .unwrap();
    db.migrate(&world);
    assert_eq!(
        db.owner_sql("SELECT count(*) FROM schema_migrations WHERE version = 9").unwrap(),
        "1"
    );
    let store = StoreSel::Pg(db.runtime_url.clone());
    let rev = user_with_token(&world, &store, "rev@example.test", "reviewer");
    let server = Server::start(&world, &store, &[]);
    let f = listed(&server.base, &rev, "old-flag");
    assert_eq!((&f["state"], &f["assignee"]), (&json!("resolved"), &Value::Null), "{f}");
    assert_eq!(rows(&f), vec![("resolve".to_string(), "old-actor".to_string(), None)], "{f}");
    let r = act(
        &server.base,
        &rev,
        "old-flag",
        &json!({"action": "assign", "assignee": "rev@example.test"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (&r.json()["state"], &r.json()["assignee_email"]),
        (&json!("resolved"), &json!("rev@example.test")),
        "{}",
        r.body
    );
}
